// norm.cpp — layer norm, RMS norm and group norm with their backwards.
// Invariants: statistics are computed in double (two-pass mean / biased variance) and saved in the
// dtype of the mean/rstd tensors (f32 or f64); the backwards read those saved statistics; weight and
// bias may be undefined (scale 1, shift 0); dweight/dbias are overwritten when defined. layer norm's
// weight / bias may be [G, D]: row r uses parameter row r / (rows / G), and the gradients are [G, D] too.
// Backward of a normalisation over a set of M values with xhat = (x - mean) * rstd and g = dy * scale:
//   layer/group norm: dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
//   rms norm:         dx = rstd * (g - xhat * mean(g * xhat))      (xhat = x * rstd)
#include <vector>

#include "dew/kernel_contracts.hpp"
#include "ref_backend.hpp"

namespace dew::ref {

namespace {

int64_t last_axis(const Tensor& x, Kernel k) {
  DEW_CHECK(x.ndim() >= 1 && x.size(-1) > 0, "ref.", kernel_name(k), ": x ", shape_str(x.shape()),
            " has no non-empty last axis");
  return x.size(-1);
}

// An optional [n] parameter (weight/bias): its value or `fallback` when undefined.
template <class T>
struct Optional {
  const T* p = nullptr;
  double fallback = 0;
  Optional(const Tensor& t, DType dt, int64_t n, double fb, Kernel k, const char* what) : fallback(fb) {
    if (!t.defined()) return;
    expect(t, dt, n, k, what);
    p = t.data_as<T>();
  }
  double operator[](int64_t i) const { return p ? double(p[i]) : fallback; }
};

}  // namespace

// ---------------------------------------------------------------- layer norm

void RefBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                            Tensor& rstd, float eps) {
  constexpr Kernel K = Kernel::layer_norm;
  dispatch_float(x.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t D = last_axis(x, K), rows = x.numel() / D;
    expect(y, x.dtype(), x.numel(), K, "y");
    expect_stat(mean, rows, K, "mean");
    expect_stat(rstd, rows, K, "rstd");
    const int64_t G = contracts::norm_groups("ref.layer_norm", rows, D, {&weight, &bias}), per = rows / G;
    const Optional<T> w(weight, x.dtype(), G * D, 1.0, K, "weight"), b(bias, x.dtype(), G * D, 0.0, K, "bias");
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p0 = (r / per) * D;  // this row's weight / bias row
      const T* xr = x.data_as<T>() + r * D;
      T* yr = y.data_as<T>() + r * D;
      double mu = 0;
      for (int64_t j = 0; j < D; ++j) mu += double(xr[j]);
      mu /= double(D);
      double var = 0;
      for (int64_t j = 0; j < D; ++j) var += (double(xr[j]) - mu) * (double(xr[j]) - mu);
      var /= double(D);
      const double rs = 1.0 / std::sqrt(var + double(eps));
      for (int64_t j = 0; j < D; ++j) yr[j] = T((double(xr[j]) - mu) * rs * w[p0 + j] + b[p0 + j]);
      store_stat(mean, r, mu);
      store_stat(rstd, r, rs);
    }
  });
}

void RefBackend::layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  constexpr Kernel K = Kernel::layer_norm_backward;
  dispatch_float(x.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t D = last_axis(x, K), rows = x.numel() / D;
    expect(dy, x.dtype(), x.numel(), K, "dy");
    expect(dx, x.dtype(), x.numel(), K, "dx");
    expect_stat(mean, rows, K, "mean");
    expect_stat(rstd, rows, K, "rstd");
    const int64_t G = contracts::norm_groups("ref.layer_norm_backward", rows, D, {&weight, &dweight, &dbias});
    const int64_t per = rows / G;
    const Optional<T> w(weight, x.dtype(), G * D, 1.0, K, "weight");
    if (dweight.defined()) expect(dweight, x.dtype(), G * D, K, "dweight");
    if (dbias.defined()) expect(dbias, x.dtype(), G * D, K, "dbias");
    std::vector<double> dw(size_t(G * D), 0.0), db(size_t(G * D), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p0 = (r / per) * D;  // this row's weight row and gradient row
      const T* xr = x.data_as<T>() + r * D;
      const T* gr = dy.data_as<T>() + r * D;
      T* dxr = dx.data_as<T>() + r * D;
      const double mu = load_stat(mean, r), rs = load_stat(rstd, r);
      double mean_g = 0, mean_gx = 0;
      for (int64_t j = 0; j < D; ++j) {
        const double xhat = (double(xr[j]) - mu) * rs, g = double(gr[j]) * w[p0 + j];
        mean_g += g;
        mean_gx += g * xhat;
        dw[size_t(p0 + j)] += double(gr[j]) * xhat;
        db[size_t(p0 + j)] += double(gr[j]);
      }
      mean_g /= double(D);
      mean_gx /= double(D);
      for (int64_t j = 0; j < D; ++j) {
        const double xhat = (double(xr[j]) - mu) * rs, g = double(gr[j]) * w[p0 + j];
        dxr[j] = T(rs * (g - mean_g - xhat * mean_gx));
      }
    }
    for (int64_t j = 0; j < G * D; ++j) {
      if (dweight.defined()) dweight.data_as<T>()[j] = T(dw[size_t(j)]);
      if (dbias.defined()) dbias.data_as<T>()[j] = T(db[size_t(j)]);
    }
  });
}

// ---------------------------------------------------------------- RMS norm

void RefBackend::rms_norm(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                          float weight_offset) {
  constexpr Kernel K = Kernel::rms_norm;
  dispatch_float(x.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t D = last_axis(x, K), rows = x.numel() / D;
    expect(y, x.dtype(), x.numel(), K, "y");
    expect_stat(rstd, rows, K, "rstd");
    // An undefined weight scales by 1 (weight_offset only shifts a weight that exists).
    const Optional<T> w(weight, x.dtype(), D, 1.0 - double(weight_offset), K, "weight");
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data_as<T>() + r * D;
      T* yr = y.data_as<T>() + r * D;
      double ms = 0;
      for (int64_t j = 0; j < D; ++j) ms += double(xr[j]) * double(xr[j]);
      const double rs = 1.0 / std::sqrt(ms / double(D) + double(eps));
      for (int64_t j = 0; j < D; ++j) yr[j] = T(double(xr[j]) * rs * (w[j] + double(weight_offset)));
      store_stat(rstd, r, rs);
    }
  });
}

void RefBackend::rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                                   Tensor& dx, Tensor& dweight, float weight_offset, bool accumulate) {
  constexpr Kernel K = Kernel::rms_norm_backward;
  dispatch_float(x.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t D = last_axis(x, K), rows = x.numel() / D;
    expect(dy, x.dtype(), x.numel(), K, "dy");
    expect(dx, x.dtype(), x.numel(), K, "dx");
    expect_stat(rstd, rows, K, "rstd");
    const Optional<T> w(weight, x.dtype(), D, 1.0 - double(weight_offset), K, "weight");
    if (dweight.defined()) expect(dweight, x.dtype(), D, K, "dweight");
    std::vector<double> dw(size_t(D), 0.0);
    for (int64_t r = 0; r < rows; ++r) {
      const T* xr = x.data_as<T>() + r * D;
      const T* gr = dy.data_as<T>() + r * D;
      T* dxr = dx.data_as<T>() + r * D;
      const double rs = load_stat(rstd, r);
      double mean_gx = 0;
      for (int64_t j = 0; j < D; ++j) {
        const double xhat = double(xr[j]) * rs;
        mean_gx += double(gr[j]) * (w[j] + double(weight_offset)) * xhat;
        dw[size_t(j)] += double(gr[j]) * xhat;
      }
      mean_gx /= double(D);
      for (int64_t j = 0; j < D; ++j) {
        const double xhat = double(xr[j]) * rs, g = double(gr[j]) * (w[j] + double(weight_offset));
        const T d = T(rs * (g - xhat * mean_gx));
        dxr[j] = accumulate ? T(double(dxr[j]) + double(d)) : d;  // as ref.binary adds: in double, rounded once
      }
    }
    if (dweight.defined())
      for (int64_t j = 0; j < D; ++j) dweight.data_as<T>()[j] = T(dw[size_t(j)]);
  });
}

// ---------------------------------------------------------------- group norm (NCHW)

namespace {

struct GroupShape {
  int64_t N, C, HW, G, Cg;
};

GroupShape group_shape(const Tensor& x, int64_t groups, Kernel k) {
  DEW_CHECK(x.ndim() >= 2, "ref.", kernel_name(k), ": x ", shape_str(x.shape()), " is not [N, C, ...]");
  GroupShape s{x.size(0), x.size(1), 0, groups, 0};
  DEW_CHECK(groups > 0 && s.C % groups == 0, "ref.", kernel_name(k), ": ", s.C, " channels do not split into ", groups,
            " groups");
  s.HW = s.N * s.C != 0 ? x.numel() / (s.N * s.C) : 0;
  s.Cg = s.C / groups;
  return s;
}

}  // namespace

void RefBackend::group_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                            Tensor& rstd, int64_t groups, float eps) {
  constexpr Kernel K = Kernel::group_norm;
  dispatch_float(x.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const GroupShape s = group_shape(x, groups, K);
    expect(y, x.dtype(), x.numel(), K, "y");
    expect_stat(mean, s.N * s.G, K, "mean");
    expect_stat(rstd, s.N * s.G, K, "rstd");
    const Optional<T> w(weight, x.dtype(), s.C, 1.0, K, "weight"), b(bias, x.dtype(), s.C, 0.0, K, "bias");
    const int64_t M = s.Cg * s.HW;  // values per (n, group), contiguous in NCHW
    DEW_CHECK(M > 0, "ref.group_norm: empty groups in x ", shape_str(x.shape()));
    for (int64_t n = 0; n < s.N; ++n) {
      for (int64_t g = 0; g < s.G; ++g) {
        const int64_t base = (n * s.C + g * s.Cg) * s.HW;
        const T* xg = x.data_as<T>() + base;
        T* yg = y.data_as<T>() + base;
        double mu = 0;
        for (int64_t i = 0; i < M; ++i) mu += double(xg[i]);
        mu /= double(M);
        double var = 0;
        for (int64_t i = 0; i < M; ++i) var += (double(xg[i]) - mu) * (double(xg[i]) - mu);
        var /= double(M);
        const double rs = 1.0 / std::sqrt(var + double(eps));
        for (int64_t i = 0; i < M; ++i) {
          const int64_t c = g * s.Cg + i / s.HW;
          yg[i] = T((double(xg[i]) - mu) * rs * w[c] + b[c]);
        }
        store_stat(mean, n * s.G + g, mu);
        store_stat(rstd, n * s.G + g, rs);
      }
    }
  });
}

void RefBackend::group_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias, int64_t groups) {
  constexpr Kernel K = Kernel::group_norm_backward;
  dispatch_float(x.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const GroupShape s = group_shape(x, groups, K);
    expect(dy, x.dtype(), x.numel(), K, "dy");
    expect(dx, x.dtype(), x.numel(), K, "dx");
    expect_stat(mean, s.N * s.G, K, "mean");
    expect_stat(rstd, s.N * s.G, K, "rstd");
    const Optional<T> w(weight, x.dtype(), s.C, 1.0, K, "weight");
    if (dweight.defined()) expect(dweight, x.dtype(), s.C, K, "dweight");
    if (dbias.defined()) expect(dbias, x.dtype(), s.C, K, "dbias");
    const int64_t M = s.Cg * s.HW;
    DEW_CHECK(M > 0, "ref.group_norm_backward: empty groups in x ", shape_str(x.shape()));
    std::vector<double> dw(size_t(s.C), 0.0), db(size_t(s.C), 0.0);
    for (int64_t n = 0; n < s.N; ++n) {
      for (int64_t g = 0; g < s.G; ++g) {
        const int64_t base = (n * s.C + g * s.Cg) * s.HW;
        const T* xg = x.data_as<T>() + base;
        const T* gg = dy.data_as<T>() + base;
        T* dxg = dx.data_as<T>() + base;
        const double mu = load_stat(mean, n * s.G + g), rs = load_stat(rstd, n * s.G + g);
        double mean_g = 0, mean_gx = 0;
        for (int64_t i = 0; i < M; ++i) {
          const int64_t c = g * s.Cg + i / s.HW;
          const double xhat = (double(xg[i]) - mu) * rs, gi = double(gg[i]) * w[c];
          mean_g += gi;
          mean_gx += gi * xhat;
          dw[size_t(c)] += double(gg[i]) * xhat;
          db[size_t(c)] += double(gg[i]);
        }
        mean_g /= double(M);
        mean_gx /= double(M);
        for (int64_t i = 0; i < M; ++i) {
          const int64_t c = g * s.Cg + i / s.HW;
          const double xhat = (double(xg[i]) - mu) * rs, gi = double(gg[i]) * w[c];
          dxg[i] = T(rs * (gi - mean_g - xhat * mean_gx));
        }
      }
    }
    for (int64_t c = 0; c < s.C; ++c) {
      if (dweight.defined()) dweight.data_as<T>()[c] = T(dw[size_t(c)]);
      if (dbias.defined()) dbias.data_as<T>()[c] = T(db[size_t(c)]);
    }
  });
}

}  // namespace dew::ref
