// test_metrics.cpp — the Fréchet distance and its pieces against closed forms.
//
// Gaussians with commuting (diagonal) covariances have FD = |mu_a - mu_b|^2 + sum (sqrt(a_i) - sqrt(b_i))^2;
// a rotation applied to both sets leaves the distance unchanged (so a non-diagonal case is checked
// too); sample statistics of a known linear map match the map's covariance.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <dew/error.hpp>
#include <dew/metrics.hpp>
#include <random>

namespace {

dew::FeatureStats gaussian_stats(const std::vector<double>& mean, const std::vector<double>& cov, int64_t d) {
  dew::FeatureStats s;
  s.count = 100;
  s.dim = d;
  s.mean = mean;
  s.covariance = cov;
  return s;
}

std::vector<double> diag(const std::vector<double>& v) {
  const size_t d = v.size();
  std::vector<double> m(d * d, 0.0);
  for (size_t i = 0; i < d; ++i) m[i * d + i] = v[i];
  return m;
}

// R M R^T for a rotation R in the (0, 1) and (1, 2) planes.
std::vector<double> rotate(const std::vector<double>& m, int64_t d, const std::vector<double>& r) {
  std::vector<double> t(size_t(d * d), 0.0), out(size_t(d * d), 0.0);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j)
      for (int64_t k = 0; k < d; ++k) t[size_t(i * d + j)] += r[size_t(i * d + k)] * m[size_t(k * d + j)];
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j)
      for (int64_t k = 0; k < d; ++k) out[size_t(i * d + j)] += t[size_t(i * d + k)] * r[size_t(j * d + k)];
  return out;
}

std::vector<double> rotation(int64_t d) {
  std::vector<double> r(size_t(d * d), 0.0);
  for (int64_t i = 0; i < d; ++i) r[size_t(i * d + i)] = 1.0;
  const double c = std::cos(0.7), s = std::sin(0.7), c2 = std::cos(-1.3), s2 = std::sin(-1.3);
  std::vector<double> a = r, b = r;
  a[0] = c, a[1] = -s, a[size_t(d)] = s, a[size_t(d + 1)] = c;
  b[size_t(d + 1)] = c2, b[size_t(d + 2)] = -s2, b[size_t(2 * d + 1)] = s2, b[size_t(2 * d + 2)] = c2;
  std::vector<double> out(size_t(d * d), 0.0);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j)
      for (int64_t k = 0; k < d; ++k) out[size_t(i * d + j)] += a[size_t(i * d + k)] * b[size_t(k * d + j)];
  return out;
}

}  // namespace

TEST_CASE("eigendecomposition reconstructs a symmetric matrix") {
  const int64_t d = 5;
  std::mt19937 gen(3);
  std::normal_distribution<double> n01;
  std::vector<double> m(size_t(d * d));
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j <= i; ++j) m[size_t(i * d + j)] = m[size_t(j * d + i)] = n01(gen);
  std::vector<double> values, vectors;
  dew::symmetric_eigen(m, d, values, vectors);
  for (int64_t i = 1; i < d; ++i) CHECK(values[size_t(i - 1)] <= values[size_t(i)]);
  for (int64_t i = 0; i < d; ++i)
    for (int64_t j = 0; j < d; ++j) {
      double v = 0.0;
      for (int64_t k = 0; k < d; ++k) v += vectors[size_t(i * d + k)] * values[size_t(k)] * vectors[size_t(j * d + k)];
      CHECK(v == doctest::Approx(m[size_t(i * d + j)]).epsilon(1e-10));
    }
}

TEST_CASE("Frechet distance of diagonal Gaussians has the closed form") {
  const std::vector<double> va{1.0, 4.0, 0.25}, vb{9.0, 1.0, 0.25};
  const std::vector<double> ma{0.0, 1.0, 2.0}, mb{1.0, 1.0, 0.0};
  const double expected = (1.0 + 0.0 + 4.0) + (4.0 + 1.0 + 0.0);  // |dmu|^2 + sum (sqrt a - sqrt b)^2
  const double fd = dew::frechet_distance(gaussian_stats(ma, diag(va), 3), gaussian_stats(mb, diag(vb), 3));
  CHECK(fd == doctest::Approx(expected).epsilon(1e-10));
  // Identical distributions are at distance 0; the distance is symmetric.
  CHECK(dew::frechet_distance(gaussian_stats(ma, diag(va), 3), gaussian_stats(ma, diag(va), 3)) ==
        doctest::Approx(0.0).epsilon(1e-12));
  CHECK(dew::frechet_distance(gaussian_stats(mb, diag(vb), 3), gaussian_stats(ma, diag(va), 3)) ==
        doctest::Approx(expected).epsilon(1e-10));
}

TEST_CASE("Frechet distance is invariant to a common rotation (non-diagonal covariances)") {
  const int64_t d = 3;
  const std::vector<double> va{1.0, 4.0, 0.25}, vb{9.0, 1.0, 0.5};
  const auto r = rotation(d);
  const auto ca = rotate(diag(va), d, r), cb = rotate(diag(vb), d, r);
  const double expected =
      1.0 + std::pow(1.0 - 3.0, 2) + std::pow(2.0 - 1.0, 2) + std::pow(0.5 - std::sqrt(0.5), 2);  // |dmu|^2 = 1
  std::vector<double> ma{0, 0, 0}, mb{0, 0, 0};
  mb[1] = 1.0;
  CHECK(dew::frechet_distance(gaussian_stats(ma, ca, d), gaussian_stats(mb, cb, d)) ==
        doctest::Approx(expected).epsilon(1e-9));
}

TEST_CASE("feature statistics match the generating distribution, bad shapes are refused") {
  const int64_t n = 20000, d = 2;
  std::mt19937 gen(11);
  std::normal_distribution<double> n01;
  std::vector<float> rows(size_t(n * d));
  for (int64_t i = 0; i < n; ++i) {
    const double z0 = n01(gen), z1 = n01(gen);
    rows[size_t(i * d)] = float(1.0 + 2.0 * z0);      // var 4
    rows[size_t(i * d + 1)] = float(-1.0 + z0 + z1);  // var 2, cov with the first 2
  }
  const auto s = dew::feature_stats(rows, n, d);
  CHECK(s.mean[0] == doctest::Approx(1.0).epsilon(0.05));
  CHECK(s.mean[1] == doctest::Approx(-1.0).epsilon(0.05));
  CHECK(s.covariance[0] == doctest::Approx(4.0).epsilon(0.05));
  CHECK(s.covariance[1] == doctest::Approx(2.0).epsilon(0.05));
  CHECK(s.covariance[2] == doctest::Approx(2.0).epsilon(0.05));
  CHECK(s.covariance[3] == doctest::Approx(2.0).epsilon(0.05));
  CHECK_THROWS_AS(dew::feature_stats(rows, n + 1, d), dew::Error);
  CHECK_THROWS_AS(dew::feature_stats(std::vector<float>(2), 1, 2), dew::Error);
}
