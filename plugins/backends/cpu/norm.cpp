// cpu/norm.cpp — layer norm (oneDNN; hand-written with [G, D] parameters), RMS norm and group norm
// (hand-written), forward and backward.
//
// * layer_norm: oneDNN `layer_normalization` over x viewed as [rows, D], with use_scale / use_shift as
//   weight / bias exist. oneDNN saves the variance; the contract saves rstd, so the forward writes the
//   variance into rstd and converts it in place (rstd = 1 / sqrt(var + eps)), and the backward hands
//   oneDNN var' = 1 / rstd^2 with epsilon 0 (the backward has no eps argument; var' + 0 reproduces
//   var + eps to a few ulp). Gradients of a weight/bias the caller does not want go to scratch.
// * layer_norm with [G, D] weight / bias (kernel_table.hpp; adaLN's per-sample modulation, the DiT's 16
//   groups of 64 rows of 256): hand-written in f32 (grouped_ln_f32 and its backward), one pass set per row;
//   at that shape 1.6x (forward) and 2.2x (backward) faster than 16 oneDNN calls, which are per-call bound.
//   bf16: the same rows over bf16 storage (bf16_bits.hpp), parameters widened once, parameter gradients summed
//   in f32 and rounded once: the f32 kernel's bits on the widened values (was one half.cpp call per group).
// * rms_norm (oneDNN 2.6 has none): one fused pass per row: sum of squares in double, then
//   y = x * rstd * (w + offset). Backward per row: dx = rstd * (g*dy - x * rstd^2 * mean(g*dy*x)), with
//   g = w + offset; dweight = sum over rows of dy * x * rstd, from per-thread partials summed in order. With
//   `accumulate` a row's dx is stored to a row buffer first (rounded as the plain call rounds it) and then added
//   to dx's row, as the binary add kernel adds (f32; bf16 widened, added in f32, rounded once): its bits, and no
//   FMA contraction of the last product into the add.
//   bf16 (x, weight, y / dy, dx, dweight; rstd f32): the same rows over bf16 storage (bf16_bits.hpp), so every
//   output is the f32 kernel's on the widened values, rounded once.
// * group_norm (oneDNN 2.6 has none): statistics per (n, group) over the contiguous C/groups * spatial
//   block, in double; backward dx = rstd * (gy - mean(gy) - xhat * mean(gy * xhat)), gy = dy * w[c];
//   dweight/dbias from per-(n, c) sums reduced over n in order (deterministic, no atomics).
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`. layer norm is oneDNN's own
//   choice; the grouped one sums in f32 over the path's vector lanes (results differ between paths by a few ulp). RMS
//   norm and group norm sum in double over vector lanes (16 on avx512, 8 on avx2): the f32 results agree between those
//   paths in practice (one rounding of nearly equal doubles), within a few ulp by guarantee; the per-element scaling
//   passes are FMA on both. Portable differs by FMA roundings.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include <algorithm>
#include <cmath>
#include "cpu_backend.hpp"

#define DEW_CPU_ISA_SELF "norm.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(layer_norm, (const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean, Tensor& rstd, float eps), (x, weight, bias, y, mean, rstd, eps))
DEW_CPU_ISA_KERNEL(layer_norm_backward, (const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias), (x, weight, mean, rstd, dy, dx, dweight, dbias))
DEW_CPU_ISA_KERNEL(rms_norm, (const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps, float weight_offset), (x, weight, y, rstd, eps, weight_offset))
DEW_CPU_ISA_KERNEL(rms_norm_backward,
                   (const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                    Tensor& dweight, float weight_offset, bool accumulate),
                   (x, weight, rstd, dy, dx, dweight, weight_offset, accumulate))
DEW_CPU_ISA_KERNEL(group_norm, (const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean, Tensor& rstd, int64_t groups, float eps), (x, weight, bias, y, mean, rstd, groups, eps))
DEW_CPU_ISA_KERNEL(group_norm_backward, (const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias, int64_t groups), (x, weight, mean, rstd, dy, dx, dweight, dbias, groups))

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include but
       // bf16_bits.hpp)

#include "bf16_bits.hpp"  // ld / st / f32_row: the norms over float or bf16 (uint16_t) storage, computed on in f32

namespace {

using dnnl::memory;

void check_vec(const Tensor& t, int64_t n, const char* kernel, const char* arg) {
  if (!t.defined()) return;
  require_f32(t, kernel, arg);
  DEW_CHECK(t.numel() == n, "cpu ", kernel, ": ", arg, " has ", t.numel(), " elements, expected ", n);
}

// A bf16 call's parameter ([D], or [G, D] of n = G * D) widened once (empty when undefined); an f32 one is used in
// place.
std::vector<float> widened_param(const Tensor& w, int64_t n, const char* kernel) {
  if (!w.defined()) return {};
  require_bf16(w, kernel, "a parameter");
  DEW_CHECK(w.numel() == n, "cpu ", kernel, ": a parameter has ", w.numel(), " elements, expected ", n);
  std::vector<float> out(static_cast<size_t>(n));
  const uint16_t* p = w.data_as<uint16_t>();
  for (int64_t j = 0; j < n; ++j) out[size_t(j)] = ld(p[j]);
  return out;
}

// ---------------------------------------------------------------- layer norm (oneDNN)

struct LnEntry : BoundPrimitive {
  memory::desc data_md, stat_md, vec_md;
};

dnnl::normalization_flags ln_flags(bool scale, bool shift) {
  auto f = dnnl::normalization_flags::none;
  if (scale) f = f | dnnl::normalization_flags::use_scale;
  if (shift) f = f | dnnl::normalization_flags::use_shift;
  return f;
}

dnnl::layer_normalization_forward::primitive_desc ln_fwd_pd(const Dnnl& d, const LnEntry& e, float eps, bool scale,
                                                            bool shift) {
  dnnl::layer_normalization_forward::desc desc(dnnl::prop_kind::forward_training, e.data_md, e.stat_md, eps,
                                               ln_flags(scale, shift));
  return dnnl::layer_normalization_forward::primitive_desc(desc, d.eng);
}

void ln_mds(LnEntry& e, int64_t rows, int64_t dim) {
  e.data_md = memory::desc({rows, dim}, memory::data_type::f32, memory::format_tag::ab);
  e.stat_md = memory::desc({rows}, memory::data_type::f32, memory::format_tag::a);
  e.vec_md = memory::desc({dim}, memory::data_type::f32, memory::format_tag::a);
}

}  // namespace

// Layer norm of rows with [G, D] parameters (w, b may be null: 1 and 0): row r uses parameter row
// r / per. Per row in f32: the mean, then the variance of x - mean (two passes over the row in cache), then
// y = (x - mean) * rstd * w + b. Rows are independent: split over the threads. T: x / y storage, float or bf16
// bits (bf16_bits.hpp; a bf16 row is widened first, so the sums run the f32 loops: the same bits; the parameters
// are f32 here: a bf16 call's are widened once by the caller).
// Rows [r0, r1) (pointers and scalars by value: see for_blocks in cpu_backend.hpp).
template <class T>
void grouped_ln_rows(const T* x, const float* w, const float* b, T* y, float* mean, float* rstd, int64_t dim,
                     int64_t per, float eps, int64_t r0, int64_t r1) {
  std::vector<float> buf(sizeof(T) == sizeof(float) ? 0 : size_t(dim));  // a bf16 row widened (f32_row)
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = f32_row(x + r * dim, dim, buf.data());
    T* yr = y + r * dim;
    const int64_t p0 = (r / per) * dim;
    float s = 0.0f;
#pragma omp simd reduction(+ : s)
    for (int64_t j = 0; j < dim; ++j) s += xr[j];
    const float mu = s / float(dim);
    float v = 0.0f;
#pragma omp simd reduction(+ : v)
    for (int64_t j = 0; j < dim; ++j) v += (xr[j] - mu) * (xr[j] - mu);
    const float rs = 1.0f / std::sqrt(v / float(dim) + eps);
    if (w && b) {
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) st(yr + j, (xr[j] - mu) * rs * w[p0 + j] + b[p0 + j]);
    } else {
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) st(yr + j, (xr[j] - mu) * rs * (w ? w[p0 + j] : 1.0f) + (b ? b[p0 + j] : 0.0f));
    }
    mean[r] = mu;
    rstd[r] = rs;
  }
}
template <class T>
void grouped_ln(const T* x, const float* w, const float* b, T* y, float* mean, float* rstd, int64_t rows, int64_t dim,
                int64_t per, float eps) {
  for_rows(rows, parallel_worth(rows * dim),
           [=](int64_t r0, int64_t r1) { grouped_ln_rows(x, w, b, y, mean, rstd, dim, per, eps, r0, r1); });
}

// Its backward (w, dw, db may be null): per row, with xhat = (x - mean) * rstd and g = dy * w,
// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)); dw[group] += dy * xhat and db[group] += dy row by row
// in order, in f32 (a group is one sample's rows: 64 in the DiT). Groups are independent and split over the
// threads, so the bits do not depend on the thread count. T: x / dy / dx storage (dw, db f32, as grouped_ln_rows;
// bf16 rows widened into f32 first, so every sum runs the f32 instantiation's loop: the same bits).
// Groups [g0, g1).
template <class T>
void grouped_ln_backward_groups(const T* x, const float* w, const float* mean, const float* rstd, const T* dy, T* dx,
                                float* dw, float* db, int64_t dim, int64_t per, int64_t g0, int64_t g1) {
  std::vector<float> buf(sizeof(T) == sizeof(float) ? 0 : size_t(2 * dim));  // bf16 x and dy rows widened
  for (int64_t gi = g0; gi < g1; ++gi) {
    const float* wg = w ? w + gi * dim : nullptr;
    float* dwg = dw ? dw + gi * dim : nullptr;
    float* dbg = db ? db + gi * dim : nullptr;
    if (dwg) std::fill(dwg, dwg + dim, 0.0f);
    if (dbg) std::fill(dbg, dbg + dim, 0.0f);
    for (int64_t r = gi * per; r < (gi + 1) * per; ++r) {
      const float* xr = f32_row(x + r * dim, dim, buf.data());
      const float* gr = f32_row(dy + r * dim, dim, buf.data() + dim);
      T* dxr = dx + r * dim;
      const float mu = mean[r], rs = rstd[r];
      float sg = 0.0f, sgx = 0.0f;
      if (wg && dwg && dbg) {  // the modulated norm's case: the sums and both gradients in one pass
#pragma omp simd reduction(+ : sg, sgx)
        for (int64_t j = 0; j < dim; ++j) {
          const float xh = (xr[j] - mu) * rs, g = gr[j] * wg[j];
          sg += g;
          sgx += g * xh;
          dwg[j] += gr[j] * xh;
          dbg[j] += gr[j];
        }
      } else {
#pragma omp simd reduction(+ : sg, sgx)
        for (int64_t j = 0; j < dim; ++j) {
          const float xh = (xr[j] - mu) * rs, g = wg ? gr[j] * wg[j] : gr[j];
          sg += g;
          sgx += g * xh;
        }
        if (dwg) {
#pragma omp simd
          for (int64_t j = 0; j < dim; ++j) dwg[j] += gr[j] * ((xr[j] - mu) * rs);
        }
        if (dbg) {
#pragma omp simd
          for (int64_t j = 0; j < dim; ++j) dbg[j] += gr[j];
        }
      }
      const float mg = sg / float(dim), mgx = sgx / float(dim);
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) {
        const float xh = (xr[j] - mu) * rs, g = wg ? gr[j] * wg[j] : gr[j];
        st(dxr + j, rs * (g - mg - xh * mgx));
      }
    }
  }
}
template <class T>
void grouped_ln_backward(const T* x, const float* w, const float* mean, const float* rstd, const T* dy, T* dx,
                         float* dw, float* db, int64_t groups, int64_t dim, int64_t per) {
  for_rows(groups, parallel_worth(groups * per * dim) && groups > 1, [=](int64_t g0, int64_t g1) {
    grouped_ln_backward_groups(x, w, mean, rstd, dy, dx, dw, db, dim, per, g0, g1);
  });
}

void layer_norm(CpuBackend& self, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                            Tensor& rstd, float eps) {
  if (const int64_t groups = contracts::norm_groups("cpu.layer_norm", rows_of(x), last_dim(x), {&weight, &bias});
      groups > 1 || (weight.defined() && weight.ndim() == 2) || (bias.defined() && bias.ndim() == 2)) {
    const int64_t dim = last_dim(x), rows = rows_of(x), per = rows / groups;  // [G, D] parameters
    if (!is_bf16_call(x)) {
      for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &weight, &bias, &y, &mean, &rstd})
        if (t->defined()) require_f32(*t, "layer_norm", "an argument");
      DEW_CHECK(y.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
                "cpu layer_norm: y/mean/rstd sizes do not match x ", shape_str(x.shape()));
      if (rows == 0) return;
      return grouped_ln(x.data_as<float>(), weight.defined() ? weight.data_as<float>() : nullptr,
                        bias.defined() ? bias.data_as<float>() : nullptr, y.data_as<float>(), mean.data_as<float>(),
                        rstd.data_as<float>(), rows, dim, per, eps);
    }
    // bf16 x, parameters, y (statistics f32): the same rows over bf16 storage, the parameters widened once
    require_bf16_if_defined({&weight, &bias, &y}, "layer_norm");
    require_f32(mean, "layer_norm", "mean");
    require_f32(rstd, "layer_norm", "rstd");
    DEW_CHECK(y.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
              "cpu layer_norm: y/mean/rstd sizes do not match x ", shape_str(x.shape()));
    if (rows == 0) return;
    const std::vector<float> w = widened_param(weight, groups * dim, "layer_norm"),
                             b = widened_param(bias, groups * dim, "layer_norm");
    return grouped_ln(x.data_as<uint16_t>(), w.empty() ? nullptr : w.data(), b.empty() ? nullptr : b.data(),
                      y.data_as<uint16_t>(), mean.data_as<float>(), rstd.data_as<float>(), rows, dim, per, eps);
  }
  if (is_bf16_call(x)) return layer_norm_bf16(self, x, weight, bias, y, mean, rstd, eps);  // half.cpp
  require_f32(x, "layer_norm", "x");
  require_f32(y, "layer_norm", "y");
  require_f32(mean, "layer_norm", "mean");
  require_f32(rstd, "layer_norm", "rstd");
  const int64_t dim = last_dim(x), rows = rows_of(x);
  check_vec(weight, dim, "layer_norm", "weight");
  check_vec(bias, dim, "layer_norm", "bias");
  DEW_CHECK(y.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
            "cpu layer_norm: y/mean/rstd sizes ", "do not match x ", shape_str(x.shape()));
  if (rows == 0) return;
  DEW_CHECK(dim > 0, "cpu layer_norm: empty feature axis");
  const bool scale = weight.defined(), shift = bias.defined();
  Dnnl& d = self.dnnl();
  Key key(kLnFwd);
  key.add(rows).add(dim).add(eps).add(int64_t(scale) | int64_t(shift) << 1);
  auto e = d.cache.get<LnEntry>(key, [&] {
    auto en = std::make_shared<LnEntry>();
    ln_mds(*en, rows, dim);
    en->prim = dnnl::layer_normalization_forward(ln_fwd_pd(d, *en, eps, scale, shift));
    en->arg(d, DNNL_ARG_SRC, en->data_md);
    en->arg(d, DNNL_ARG_DST, en->data_md);
    en->arg(d, DNNL_ARG_MEAN, en->stat_md);
    en->arg(d, DNNL_ARG_VARIANCE, en->stat_md);
    if (scale) en->arg(d, DNNL_ARG_SCALE, en->vec_md);
    if (shift) en->arg(d, DNNL_ARG_SHIFT, en->vec_md);
    return en;
  });
  float* r = rstd.data_as<float>();
  e->run(d, {{DNNL_ARG_SRC, x.data()},
             {DNNL_ARG_DST, y.data()},
             {DNNL_ARG_MEAN, mean.data()},
             {DNNL_ARG_VARIANCE, r},
             {scale ? DNNL_ARG_SCALE : 0, scale ? weight.data() : nullptr},
             {shift ? DNNL_ARG_SHIFT : 0, shift ? bias.data() : nullptr}});
#pragma omp simd
  for (int64_t i = 0; i < rows; ++i) r[i] = 1.0f / std::sqrt(r[i] + eps);
}

void layer_norm_backward(CpuBackend& self, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  if (const int64_t groups =
          contracts::norm_groups("cpu.layer_norm_backward", rows_of(x), last_dim(x), {&weight, &dweight, &dbias});
      groups > 1 || (weight.defined() && weight.ndim() == 2) || (dweight.defined() && dweight.ndim() == 2) ||
      (dbias.defined() && dbias.ndim() == 2)) {
    const int64_t dim = last_dim(x), rows = rows_of(x), per = rows / groups;  // [G, D] parameters
    if (!is_bf16_call(x)) {
      for (const Tensor* t :
           std::initializer_list<const Tensor*>{&x, &weight, &mean, &rstd, &dy, &dx, &dweight, &dbias})
        if (t->defined()) require_f32(*t, "layer_norm_backward", "an argument");
      DEW_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
                "cpu layer_norm_backward: dy/dx/mean/rstd sizes do not match x ", shape_str(x.shape()));
      return grouped_ln_backward(x.data_as<float>(), weight.defined() ? weight.data_as<float>() : nullptr,
                                 mean.data_as<float>(), rstd.data_as<float>(), dy.data_as<float>(), dx.data_as<float>(),
                                 dweight.defined() ? dweight.data_as<float>() : nullptr,
                                 dbias.defined() ? dbias.data_as<float>() : nullptr, groups, dim, per);
    }
    // bf16 (statistics f32): as the forward; the parameter gradients summed in f32 scratch, rounded once
    require_bf16_if_defined({&weight, &dy, &dx, &dweight, &dbias}, "layer_norm_backward");
    require_f32(mean, "layer_norm_backward", "mean");
    require_f32(rstd, "layer_norm_backward", "rstd");
    DEW_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
              "cpu layer_norm_backward: dy/dx/mean/rstd sizes do not match x ", shape_str(x.shape()));
    const std::vector<float> w = widened_param(weight, groups * dim, "layer_norm_backward");
    std::vector<float> dw(dweight.defined() ? size_t(groups * dim) : 0), db(dbias.defined() ? size_t(groups * dim) : 0);
    grouped_ln_backward(x.data_as<uint16_t>(), w.empty() ? nullptr : w.data(), mean.data_as<float>(),
                        rstd.data_as<float>(), dy.data_as<uint16_t>(), dx.data_as<uint16_t>(),
                        dw.empty() ? nullptr : dw.data(), db.empty() ? nullptr : db.data(), groups, dim, per);
    for (auto [acc, out] : {std::pair{&dw, &dweight}, std::pair{&db, &dbias}})
      if (out->defined()) {
        uint16_t* o = out->data_as<uint16_t>();
        for (size_t j = 0; j < acc->size(); ++j) st(o + j, (*acc)[j]);
      }
    return;
  }
  if (is_bf16_call(x)) return layer_norm_backward_bf16(self, x, weight, mean, rstd, dy, dx, dweight, dbias);  // half.cpp
  require_f32(x, "layer_norm_backward", "x");
  require_f32(dy, "layer_norm_backward", "dy");
  require_f32(dx, "layer_norm_backward", "dx");
  require_f32(mean, "layer_norm_backward", "mean");
  require_f32(rstd, "layer_norm_backward", "rstd");
  const int64_t dim = last_dim(x), rows = rows_of(x);
  check_vec(weight, dim, "layer_norm_backward", "weight");
  check_vec(dweight, dim, "layer_norm_backward", "dweight");
  check_vec(dbias, dim, "layer_norm_backward", "dbias");
  DEW_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && mean.numel() == rows && rstd.numel() == rows,
            "cpu layer_norm_backward: dy/dx/mean/rstd sizes do not match x ", shape_str(x.shape()));
  if (rows == 0 || dim == 0) {
    if (dweight.defined()) self.fill(dweight, 0.0);
    if (dbias.defined()) self.fill(dbias, 0.0);
    return;
  }
  // The weight enters dx, so use_scale follows `weight`; shift only matters for its gradient.
  const bool scale = weight.defined(), shift = dbias.defined();
  const bool full = scale || shift;  // prop_kind::backward computes the scale/shift gradients
  Dnnl& d = self.dnnl();
  Key key(kLnBwd);
  key.add(rows).add(dim).add(int64_t(scale) | int64_t(shift) << 1);
  auto e = d.cache.get<LnEntry>(key, [&] {
    auto en = std::make_shared<LnEntry>();
    ln_mds(*en, rows, dim);
    auto hint = ln_fwd_pd(d, *en, 0.0f, scale, shift);
    dnnl::layer_normalization_backward::desc desc(full ? dnnl::prop_kind::backward : dnnl::prop_kind::backward_data,
                                                  en->data_md, en->data_md, en->stat_md, 0.0f, ln_flags(scale, shift));
    en->prim =
        dnnl::layer_normalization_backward(dnnl::layer_normalization_backward::primitive_desc(desc, d.eng, hint));
    for (int id : {DNNL_ARG_SRC, DNNL_ARG_DIFF_DST, DNNL_ARG_DIFF_SRC}) en->arg(d, id, en->data_md);
    for (int id : {DNNL_ARG_MEAN, DNNL_ARG_VARIANCE}) en->arg(d, id, en->stat_md);
    if (scale)
      for (int id : {DNNL_ARG_SCALE, DNNL_ARG_DIFF_SCALE}) en->arg(d, id, en->vec_md);
    if (shift)
      for (int id : {DNNL_ARG_SHIFT, DNNL_ARG_DIFF_SHIFT}) en->arg(d, id, en->vec_md);
    return en;
  });
  std::vector<float> var(static_cast<size_t>(rows));
  const float* r = rstd.data_as<float>();
#pragma omp simd
  for (int64_t i = 0; i < rows; ++i) var[size_t(i)] = 1.0f / (r[i] * r[i]);
  std::vector<float> scratch_w, zero_shift;
  if (scale && !dweight.defined()) scratch_w.resize(size_t(dim));  // a gradient nobody asked for
  if (shift) zero_shift.assign(size_t(dim), 0.0f);                 // the shift does not enter the backward
  e->run(d, {{DNNL_ARG_SRC, x.data()},
             {DNNL_ARG_DIFF_DST, dy.data()},
             {DNNL_ARG_DIFF_SRC, dx.data()},
             {DNNL_ARG_MEAN, mean.data()},
             {DNNL_ARG_VARIANCE, var.data()},
             {scale ? DNNL_ARG_SCALE : 0, scale ? weight.data() : nullptr},
             {scale ? DNNL_ARG_DIFF_SCALE : 0, dweight.defined() ? dweight.data() : scratch_w.data()},
             {shift ? DNNL_ARG_SHIFT : 0, zero_shift.data()},
             {shift ? DNNL_ARG_DIFF_SHIFT : 0, shift ? dbias.data() : nullptr}});
  if (dweight.defined() && !scale) {
    // No weight in the forward, yet its gradient is asked for: sum over rows of dy * xhat.
    const float* xs = x.data_as<float>();
    const float* g = dy.data_as<float>();
    const float* mu = mean.data_as<float>();
    std::vector<double> acc(size_t(dim), 0.0);
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < dim; ++j)
        acc[size_t(j)] += double(g[i * dim + j]) * double((xs[i * dim + j] - mu[i]) * r[i]);
    float* dwp = dweight.data_as<float>();
    for (int64_t j = 0; j < dim; ++j) dwp[j] = float(acc[size_t(j)]);
  }
}

// ---------------------------------------------------------------- RMS norm

// Rows [i0, i1) of rms_norm. One out-of-line body for the OpenMP team and the caller's thread alike (noinline:
// the double reduction below is vectorised once, so the sum's lanes are the same whichever path runs it).
// T: x / y storage, float or bf16 bits (bf16_bits.hpp: a bf16 row is widened first, so the double sum runs the f32
// loop and every output is the f32 kernel's value rounded once).
template <class T>
[[gnu::noinline]] static void rms_norm_rows(const T* xs, const float* w, T* ys, float* rs, int64_t dim, float eps,
                                            float off, int64_t i0, int64_t i1) {
  std::vector<float> buf(sizeof(T) == sizeof(float) ? 0 : size_t(dim));  // a bf16 row widened (f32_row)
  for (int64_t i = i0; i < i1; ++i) {
    const float* xr = f32_row(xs + i * dim, dim, buf.data());
    T* yr = ys + i * dim;
    double ss = 0.0;
#pragma omp simd reduction(+ : ss)
    for (int64_t j = 0; j < dim; ++j) ss += double(xr[j]) * double(xr[j]);
    const float r = float(1.0 / std::sqrt(ss / double(dim) + double(eps)));
    rs[i] = r;
    if (w) {
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) st(yr + j, xr[j] * r * (w[j] + off));
    } else {
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) st(yr + j, xr[j] * r);
    }
  }
}

void rms_norm(CpuBackend&, const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
              float weight_offset) {
  const bool half = is_bf16_call(x);  // bf16 x, weight, y (rstd f32): the f32 kernel's bits on widened values
  half ? require_bf16(y, "rms_norm", "y") : (require_f32(x, "rms_norm", "x"), require_f32(y, "rms_norm", "y"));
  require_f32(rstd, "rms_norm", "rstd");
  const int64_t dim = last_dim(x), rows = rows_of(x);
  const std::vector<float> wide = half ? widened_param(weight, dim, "rms_norm") : std::vector<float>();
  if (!half) check_vec(weight, dim, "rms_norm", "weight");
  DEW_CHECK(y.numel() == x.numel() && rstd.numel() == rows, "cpu rms_norm: y/rstd sizes do not match x ",
            shape_str(x.shape()));
  if (rows == 0) return;
  const float* w = !weight.defined() ? nullptr : half ? wide.data() : weight.data_as<float>();
  float* rs = rstd.data_as<float>();
  const float off = weight_offset;
  auto run = [&](auto* xs, auto* ys) {
    for_rows(rows, parallel_worth(x.numel()),
             [=](int64_t i0, int64_t i1) { rms_norm_rows(xs, w, ys, rs, dim, eps, off, i0, i1); });
  };
  half ? run(x.data_as<uint16_t>(), y.data_as<uint16_t>()) : run(x.data_as<float>(), y.data_as<float>());
}

// rms_norm_backward's rows [r0, r1), adding dweight's terms into pw (may be null) in double (pointers and
// scalars by value: see for_blocks in cpu_backend.hpp); `acc`: each row's dx added to o's row (the header).
// T: as rms_norm_rows.
template <class T>
void rms_norm_backward_rows(const T* xs, const float* w, const T* g, const float* rs, T* o, double* pw, int64_t dim,
                            float off, bool acc, int64_t r0, int64_t r1) {
  std::vector<float> buf(sizeof(T) == sizeof(float) ? 0 : size_t(2 * dim));  // bf16 x and dy rows widened
  std::vector<T> row_dx(acc ? size_t(dim) : 0);
  for (int64_t i = r0; i < r1; ++i) {
    const float* xr = f32_row(xs + i * dim, dim, buf.data());
    const float* gr = f32_row(g + i * dim, dim, buf.data() + dim);
    T* dr = acc ? row_dx.data() : o + i * dim;
    const float r = rs[i];
    double dot = 0.0;  // sum_j (w_j + off) * dy_j * x_j
    if (w) {
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < dim; ++j) dot += double((w[j] + off) * gr[j]) * double(xr[j]);
    } else {
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < dim; ++j) dot += double(gr[j]) * double(xr[j]);
    }
    const float c = float(dot / double(dim)) * r * r;
    if (pw) {  // before dx: dx may overwrite dy in place
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) pw[j] += double(gr[j] * xr[j] * r);
    }
    if (w) {
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) st(dr + j, r * ((w[j] + off) * gr[j] - xr[j] * c));
    } else {
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) st(dr + j, r * (gr[j] - xr[j] * c));
    }
    if (acc) {
      T* sum = o + i * dim;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) st(sum + j, ld(sum[j]) + ld(dr[j]));
    }
  }
}

namespace {
template <class T>
void rms_norm_backward_typed(const Tensor& x, const float* w, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                             Tensor& dweight, float off, bool acc) {
  const int64_t dim = last_dim(x), rows = rows_of(x);
  const T* xs = x.data_as<T>();
  const T* g = dy.data_as<T>();
  const float* rs = rstd.data_as<float>();
  T* o = dx.data_as<T>();
  const bool want_dw = dweight.defined();
  const int nthreads = parallel_worth(x.numel()) ? omp_get_max_threads() : 1;
  ThreadPartials partial(want_dw ? nthreads : 0, dim);
  if (nthreads == 1) {  // no OpenMP region on one thread (team_of_many in cpu_backend.hpp)
    rms_norm_backward_rows(xs, w, g, rs, o, want_dw ? partial.of(0) : nullptr, dim, off, acc, int64_t(0), rows);
  } else {
#pragma omp parallel num_threads(nthreads)
    {
      const int nt = omp_get_num_threads(), t = omp_get_thread_num();
      rms_norm_backward_rows(xs, w, g, rs, o, want_dw ? partial.of(t) : nullptr, dim, off, acc, rows * t / nt,
                             rows * (t + 1) / nt);
    }
  }
  if (want_dw) {
    T* dw = dweight.data_as<T>();
    for (int64_t j = 0; j < dim; ++j) {
      double s = 0.0;
      for (int t = 0; t < nthreads; ++t) s += partial.of(t)[j];
      st(dw + j, float(s));
    }
  }
}
}  // namespace

void rms_norm_backward(CpuBackend&, const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                       Tensor& dx, Tensor& dweight, float weight_offset, bool accumulate) {
  const bool half = is_bf16_call(x);  // bf16 x, weight, dy, dx, dweight (rstd f32), as rms_norm
  const char* k = "rms_norm_backward";
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &dy, &dx})
    half ? require_bf16(*t, k, "x / dy / dx") : require_f32(*t, k, "x / dy / dx");
  require_f32(rstd, k, "rstd");
  const int64_t dim = last_dim(x), rows = rows_of(x);
  const std::vector<float> wide = half ? widened_param(weight, dim, k) : std::vector<float>();
  if (!half) check_vec(weight, dim, k, "weight");
  if (half && dweight.defined()) require_bf16(dweight, k, "dweight");
  if (!half) check_vec(dweight, dim, k, "dweight");
  DEW_CHECK(!dweight.defined() || dweight.numel() == dim, "cpu rms_norm_backward: dweight has ", dweight.numel(),
            " elements, expected ", dim);
  DEW_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && rstd.numel() == rows,
            "cpu rms_norm_backward: dy/dx/rstd sizes do not match x ", shape_str(x.shape()));
  DEW_CHECK(!accumulate || (dx.data() != x.data() && dx.data() != dy.data()),
            "cpu rms_norm_backward: an accumulated dx must alias neither x nor dy");
  const float* w = !weight.defined() ? nullptr : half ? wide.data() : weight.data_as<float>();
  half ? rms_norm_backward_typed<uint16_t>(x, w, rstd, dy, dx, dweight, weight_offset, accumulate)
       : rms_norm_backward_typed<float>(x, w, rstd, dy, dx, dweight, weight_offset, accumulate);
}

// ---------------------------------------------------------------- group norm

namespace {

struct GnShape {
  int64_t n, c, spatial, groups, cg, block;  // block = cg * spatial elements per (n, group)
};
GnShape gn_shape(const Tensor& x, int64_t groups, const char* kernel) {
  DEW_CHECK(x.ndim() >= 2, "cpu ", kernel, ": x must be [N, C, ...], got ", shape_str(x.shape()));
  GnShape s;
  s.n = x.shape()[0];
  s.c = x.shape()[1];
  s.spatial = s.c == 0 || s.n == 0 ? 0 : x.numel() / (s.n * s.c);
  s.groups = groups;
  DEW_CHECK(groups > 0 && s.c % groups == 0, "cpu ", kernel, ": ", s.c, " channels do not split into ", groups,
            " groups");
  s.cg = s.c / groups;
  s.block = s.cg * s.spatial;
  return s;
}

}  // namespace

void group_norm(CpuBackend& self, const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                            Tensor& rstd, int64_t groups, float eps) {
  require_f32(x, "group_norm", "x");
  require_f32(y, "group_norm", "y");
  require_f32(mean, "group_norm", "mean");
  require_f32(rstd, "group_norm", "rstd");
  const GnShape s = gn_shape(x, groups, "group_norm");
  check_vec(weight, s.c, "group_norm", "weight");
  check_vec(bias, s.c, "group_norm", "bias");
  DEW_CHECK(y.numel() == x.numel() && mean.numel() == s.n * groups && rstd.numel() == s.n * groups,
            "cpu group_norm: y/mean/rstd sizes do not match x ", shape_str(x.shape()), " with ", groups, " groups");
  const float* xs = x.data_as<float>();
  const float* w = weight.defined() ? weight.data_as<float>() : nullptr;
  const float* b = bias.defined() ? bias.data_as<float>() : nullptr;
  float* ys = y.data_as<float>();
  float* mu = mean.data_as<float>();
  float* rs = rstd.data_as<float>();
  const int64_t units = s.n * groups;
#pragma omp parallel for schedule(static) if (parallel_worth(x.numel()))
  for (int64_t u = 0; u < units; ++u) {
    const float* xb = xs + u * s.block;
    float* yb = ys + u * s.block;
    double sum = 0.0;
#pragma omp simd reduction(+ : sum)
    for (int64_t i = 0; i < s.block; ++i) sum += double(xb[i]);
    const double m = s.block ? sum / double(s.block) : 0.0;
    double sq = 0.0;  // two-pass variance: the block is cache-resident after the first pass
#pragma omp simd reduction(+ : sq)
    for (int64_t i = 0; i < s.block; ++i) {
      const double dd = double(xb[i]) - m;
      sq += dd * dd;
    }
    const double var = s.block ? sq / double(s.block) : 0.0;
    const float mf = float(m), r = float(1.0 / std::sqrt(var + double(eps)));
    mu[u] = mf;
    rs[u] = r;
    const int64_t g = u % groups;
    for (int64_t cc = 0; cc < s.cg; ++cc) {
      const int64_t ch = g * s.cg + cc;
      const float a = r * (w ? w[ch] : 1.0f);
      const float c0 = (b ? b[ch] : 0.0f) - mf * a;
      const float* xc = xb + cc * s.spatial;
      float* yc = yb + cc * s.spatial;
#pragma omp simd
      for (int64_t i = 0; i < s.spatial; ++i) yc[i] = xc[i] * a + c0;
    }
  }
}

void group_norm_backward(CpuBackend& self, const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias, int64_t groups) {
  require_f32(x, "group_norm_backward", "x");
  require_f32(dy, "group_norm_backward", "dy");
  require_f32(dx, "group_norm_backward", "dx");
  require_f32(mean, "group_norm_backward", "mean");
  require_f32(rstd, "group_norm_backward", "rstd");
  const GnShape s = gn_shape(x, groups, "group_norm_backward");
  check_vec(weight, s.c, "group_norm_backward", "weight");
  check_vec(dweight, s.c, "group_norm_backward", "dweight");
  check_vec(dbias, s.c, "group_norm_backward", "dbias");
  DEW_CHECK(dy.numel() == x.numel() && dx.numel() == x.numel() && mean.numel() == s.n * groups &&
                rstd.numel() == s.n * groups,
            "cpu group_norm_backward: dy/dx/mean/rstd sizes do not match x ", shape_str(x.shape()));
  const float* xs = x.data_as<float>();
  const float* w = weight.defined() ? weight.data_as<float>() : nullptr;
  const float* g = dy.data_as<float>();
  const float* mu = mean.data_as<float>();
  const float* rs = rstd.data_as<float>();
  float* o = dx.data_as<float>();
  const bool want_w = dweight.defined(), want_b = dbias.defined();
  // Per-(n, c) sums of dy * xhat and dy, reduced over n afterwards.
  std::vector<double> sdx(size_t(s.n * s.c)), sdy(size_t(s.n * s.c));
  const int64_t units = s.n * groups;
#pragma omp parallel for schedule(static) if (parallel_worth(x.numel()))
  for (int64_t u = 0; u < units; ++u) {
    const int64_t n = u / groups, gi = u % groups;
    const float m = mu[u], r = rs[u];
    const float* xb = xs + u * s.block;
    const float* gb = g + u * s.block;
    float* ob = o + u * s.block;
    double a_gy = 0.0, a_gyx = 0.0;  // sums over the block of gy and gy * xhat, gy = dy * w[c]
    for (int64_t cc = 0; cc < s.cg; ++cc) {
      const int64_t ch = gi * s.cg + cc;
      const float* xc = xb + cc * s.spatial;
      const float* gc = gb + cc * s.spatial;
      double c_dy = 0.0, c_dyx = 0.0;
#pragma omp simd reduction(+ : c_dy, c_dyx)
      for (int64_t i = 0; i < s.spatial; ++i) {
        c_dy += double(gc[i]);
        c_dyx += double(gc[i]) * double((xc[i] - m) * r);
      }
      sdy[size_t(n * s.c + ch)] = c_dy;
      sdx[size_t(n * s.c + ch)] = c_dyx;
      const double wc = w ? double(w[ch]) : 1.0;
      a_gy += wc * c_dy;
      a_gyx += wc * c_dyx;
    }
    const float mg = s.block ? float(a_gy / double(s.block)) : 0.0f;
    const float mgx = s.block ? float(a_gyx / double(s.block)) : 0.0f;
    for (int64_t cc = 0; cc < s.cg; ++cc) {
      const int64_t ch = gi * s.cg + cc;
      const float wc = w ? w[ch] : 1.0f;
      const float* xc = xb + cc * s.spatial;
      const float* gc = gb + cc * s.spatial;
      float* oc = ob + cc * s.spatial;
#pragma omp simd
      for (int64_t i = 0; i < s.spatial; ++i) {
        const float xhat = (xc[i] - m) * r;
        oc[i] = r * (gc[i] * wc - mg - xhat * mgx);
      }
    }
  }
  if (want_w || want_b) {
    float* dw = want_w ? dweight.data_as<float>() : nullptr;
    float* db = want_b ? dbias.data_as<float>() : nullptr;
    for (int64_t ch = 0; ch < s.c; ++ch) {
      double aw = 0.0, ab = 0.0;
      for (int64_t n = 0; n < s.n; ++n) {
        aw += sdx[size_t(n * s.c + ch)];
        ab += sdy[size_t(n * s.c + ch)];
      }
      if (dw) dw[ch] = float(aw);
      if (db) db[ch] = float(ab);
    }
  }
}

#endif  // DEW_CPU_ISA
