// frechet.cpp — feature statistics, a cyclic Jacobi symmetric eigensolver and the Fréchet distance.
//
// Why hand-written: the feature widths here are small (tens to a few hundred), the computation runs
// once per evaluation, and no LAPACK is linked into libdew; Jacobi is simple, unconditionally
// convergent for symmetric matrices and accurate to a few ulps of the largest eigenvalue.
#include <algorithm>
#include <cmath>
#include <dew/error.hpp>
#include <dew/metrics.hpp>

namespace dew {

namespace {

template <typename T>
FeatureStats stats_of(const std::vector<T>& rows, int64_t n, int64_t dim) {
  DEW_CHECK(n >= 2 && dim >= 1, "feature_stats: needs at least 2 rows of width >= 1, got ", n, " x ", dim);
  DEW_CHECK(int64_t(rows.size()) == n * dim, "feature_stats: ", rows.size(), " values for ", n, " x ", dim);
  FeatureStats s;
  s.count = n;
  s.dim = dim;
  s.mean.assign(size_t(dim), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = 0; j < dim; ++j) s.mean[size_t(j)] += double(rows[size_t(i * dim + j)]);
  for (double& m : s.mean) m /= double(n);
  s.covariance.assign(size_t(dim * dim), 0.0);
  std::vector<double> centred(static_cast<size_t>(dim));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < dim; ++j) centred[size_t(j)] = double(rows[size_t(i * dim + j)]) - s.mean[size_t(j)];
    for (int64_t a = 0; a < dim; ++a) {
      const double ca = centred[size_t(a)];
      double* row = &s.covariance[size_t(a * dim)];
      for (int64_t b = a; b < dim; ++b) row[b] += ca * centred[size_t(b)];
    }
  }
  for (int64_t a = 0; a < dim; ++a)
    for (int64_t b = a; b < dim; ++b) {
      const double v = s.covariance[size_t(a * dim + b)] / double(n - 1);
      s.covariance[size_t(a * dim + b)] = v;
      s.covariance[size_t(b * dim + a)] = v;
    }
  return s;
}

// Symmetric square root V diag(sqrt(max(l, 0))) V^T.
std::vector<double> sqrt_psd(const std::vector<double>& m, int64_t dim) {
  std::vector<double> values, vectors;
  symmetric_eigen(m, dim, values, vectors);
  std::vector<double> out(static_cast<size_t>(dim * dim), 0.0);
  for (int64_t k = 0; k < dim; ++k) {
    const double r = std::sqrt(std::max(values[size_t(k)], 0.0));
    if (r == 0.0) continue;
    for (int64_t i = 0; i < dim; ++i) {
      const double vik = vectors[size_t(i * dim + k)] * r;
      for (int64_t j = 0; j < dim; ++j) out[size_t(i * dim + j)] += vik * vectors[size_t(j * dim + k)];
    }
  }
  return out;
}

std::vector<double> matmul_sq(const std::vector<double>& a, const std::vector<double>& b, int64_t dim) {
  std::vector<double> c(static_cast<size_t>(dim * dim), 0.0);
  for (int64_t i = 0; i < dim; ++i)
    for (int64_t k = 0; k < dim; ++k) {
      const double aik = a[size_t(i * dim + k)];
      for (int64_t j = 0; j < dim; ++j) c[size_t(i * dim + j)] += aik * b[size_t(k * dim + j)];
    }
  return c;
}

}  // namespace

FeatureStats feature_stats(const std::vector<double>& rows, int64_t n, int64_t dim) { return stats_of(rows, n, dim); }
FeatureStats feature_stats(const std::vector<float>& rows, int64_t n, int64_t dim) { return stats_of(rows, n, dim); }

void symmetric_eigen(std::vector<double> a, int64_t dim, std::vector<double>& values, std::vector<double>& vectors) {
  DEW_CHECK(int64_t(a.size()) == dim * dim, "symmetric_eigen: ", a.size(), " values for a ", dim, " x ", dim,
            " matrix");
  vectors.assign(size_t(dim * dim), 0.0);
  for (int64_t i = 0; i < dim; ++i) vectors[size_t(i * dim + i)] = 1.0;
  auto at = [&](int64_t i, int64_t j) -> double& { return a[size_t(i * dim + j)]; };
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0.0, total = 0.0;
    for (int64_t i = 0; i < dim; ++i)
      for (int64_t j = 0; j < dim; ++j) (i == j ? total : off) += at(i, j) * at(i, j);
    if (off <= 1e-30 * (total + off) || off == 0.0) break;
    for (int64_t p = 0; p < dim - 1; ++p)
      for (int64_t q = p + 1; q < dim; ++q) {
        const double apq = at(p, q);
        if (apq == 0.0) continue;
        const double theta = (at(q, q) - at(p, p)) / (2.0 * apq);
        const double t = (theta >= 0 ? 1.0 : -1.0) / (std::fabs(theta) + std::sqrt(theta * theta + 1.0));
        const double c = 1.0 / std::sqrt(t * t + 1.0), s = t * c;
        for (int64_t k = 0; k < dim; ++k) {  // columns p, q
          const double akp = at(k, p), akq = at(k, q);
          at(k, p) = c * akp - s * akq;
          at(k, q) = s * akp + c * akq;
        }
        for (int64_t k = 0; k < dim; ++k) {  // rows p, q
          const double apk = at(p, k), aqk = at(q, k);
          at(p, k) = c * apk - s * aqk;
          at(q, k) = s * apk + c * aqk;
        }
        for (int64_t k = 0; k < dim; ++k) {
          double& vkp = vectors[size_t(k * dim + p)];
          double& vkq = vectors[size_t(k * dim + q)];
          const double x = vkp, y = vkq;
          vkp = c * x - s * y;
          vkq = s * x + c * y;
        }
      }
  }
  // Sort ascending, permuting eigenvector columns alongside.
  std::vector<int64_t> order(static_cast<size_t>(dim));
  for (int64_t i = 0; i < dim; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return at(x, x) < at(y, y); });
  values.resize(size_t(dim));
  std::vector<double> sorted(static_cast<size_t>(dim * dim));
  for (int64_t c = 0; c < dim; ++c) {
    values[size_t(c)] = at(order[size_t(c)], order[size_t(c)]);
    for (int64_t r = 0; r < dim; ++r) sorted[size_t(r * dim + c)] = vectors[size_t(r * dim + order[size_t(c)])];
  }
  vectors.swap(sorted);
}

double frechet_distance(const FeatureStats& a, const FeatureStats& b) {
  DEW_CHECK(a.dim == b.dim && a.dim > 0, "frechet_distance: feature widths differ (", a.dim, " and ", b.dim, ")");
  const int64_t d = a.dim;
  double mean_term = 0.0;
  for (int64_t i = 0; i < d; ++i) {
    const double diff = a.mean[size_t(i)] - b.mean[size_t(i)];
    mean_term += diff * diff;
  }
  const std::vector<double> root_a = sqrt_psd(a.covariance, d);
  std::vector<double> inner = matmul_sq(matmul_sq(root_a, b.covariance, d), root_a, d);
  for (int64_t i = 0; i < d; ++i)  // symmetrise rounding before the eigensolver
    for (int64_t j = i + 1; j < d; ++j) {
      const double v = 0.5 * (inner[size_t(i * d + j)] + inner[size_t(j * d + i)]);
      inner[size_t(i * d + j)] = inner[size_t(j * d + i)] = v;
    }
  std::vector<double> values, vectors;
  symmetric_eigen(inner, d, values, vectors);
  double trace_root = 0.0, trace_a = 0.0, trace_b = 0.0;
  for (double v : values) trace_root += std::sqrt(std::max(v, 0.0));
  for (int64_t i = 0; i < d; ++i) {
    trace_a += a.covariance[size_t(i * d + i)];
    trace_b += b.covariance[size_t(i * d + i)];
  }
  return std::max(0.0, mean_term + trace_a + trace_b - 2.0 * trace_root);
}

}  // namespace dew
