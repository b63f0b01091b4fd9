// dew/metrics.hpp — distribution metrics on host feature matrices (double precision).
//
// FeatureStats holds the mean and covariance (unbiased, divisor n-1) of n feature rows of width d.
// frechet_distance() is the Fréchet (2-Wasserstein) distance between the two Gaussians fitted to two
// feature sets, as in FID: |mu_a - mu_b|^2 + tr(S_a + S_b - 2 (S_a^1/2 S_b S_a^1/2)^1/2). The matrix
// square roots come from a symmetric eigendecomposition (cyclic Jacobi), so the result is real and
// non-negative up to rounding; tiny negative eigenvalues from rounding are clamped to zero.
#pragma once
#include <cstdint>
#include <vector>

namespace dew {

struct FeatureStats {
  int64_t count = 0;
  int64_t dim = 0;
  std::vector<double> mean;        // [dim]
  std::vector<double> covariance;  // [dim, dim], row-major
};

// rows: [n, dim] row-major; needs n >= 2.
FeatureStats feature_stats(const std::vector<double>& rows, int64_t n, int64_t dim);
FeatureStats feature_stats(const std::vector<float>& rows, int64_t n, int64_t dim);

double frechet_distance(const FeatureStats& a, const FeatureStats& b);

// Eigenvalues (ascending) and eigenvectors (columns of `vectors`, row-major [dim, dim]) of a symmetric
// matrix; exposed for tests and other metrics.
void symmetric_eigen(std::vector<double> matrix, int64_t dim, std::vector<double>& values,
                     std::vector<double>& vectors);

}  // namespace dew
