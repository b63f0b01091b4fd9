// cpu/softmax.cpp — softmax and log-softmax along the last axis, forward and backward, via oneDNN 2.6.
//
// x is viewed as [rows, D] (axis 1); the backward primitives take the forward output y (not x), which is
// exactly what the contract hands in. Primitives are cached per (rows, D, log?).
// log_softmax forward is hand-written: oneDNN 2.6's logsoftmax is ~1e-6 off near 0 (12 ulps at 1.0: a
// one-element row gives 1.4e-6, not 0), and cross-entropy-like uses live exactly there. It computes
// y = (x - max) - log(sum exp(x - max)) with the sum and the log in double, one row per iteration.
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`. softmax and the backwards are
//   oneDNN's own choice; log_softmax's sum is in double over vector lanes whose count differs per path
//   (f32 results agree in practice, within an ulp by guarantee).
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include "cpu_backend.hpp"

#define DEW_CPU_ISA_SELF "softmax.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(softmax, (const Tensor& x, Tensor& y), (x, y))
DEW_CPU_ISA_KERNEL(log_softmax, (const Tensor& x, Tensor& y), (x, y))
DEW_CPU_ISA_KERNEL(softmax_backward, (const Tensor& y, const Tensor& dy, Tensor& dx), (y, dy, dx))
DEW_CPU_ISA_KERNEL(log_softmax_backward, (const Tensor& y, const Tensor& dy, Tensor& dx), (y, dy, dx))

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include here)

namespace {

using dnnl::memory;

struct SoftmaxEntry : BoundPrimitive {
  memory::desc md;
};

memory::desc rows_md(int64_t rows, int64_t dim) {
  return memory::desc({rows, dim}, memory::data_type::f32, memory::format_tag::ab);
}

constexpr auto kProp = dnnl::prop_kind::forward_training;
dnnl::softmax_forward::primitive_desc softmax_pd(const Dnnl& d, const memory::desc& md) {
  return dnnl::softmax_forward::primitive_desc(dnnl::softmax_forward::desc(kProp, md, 1), d.eng);
}
dnnl::logsoftmax_forward::primitive_desc logsoftmax_pd(const Dnnl& d, const memory::desc& md) {
  return dnnl::logsoftmax_forward::primitive_desc(dnnl::logsoftmax_forward::desc(kProp, md, 1), d.eng);
}

void check_pair(const Tensor& a, const Tensor& b, const char* kernel) {
  DEW_CHECK(a.numel() == b.numel() && last_dim(a) == last_dim(b), "cpu ", kernel, ": ", shape_str(a.shape()), " vs ",
            shape_str(b.shape()));
}

void dnnl_softmax_forward(Dnnl& d, const Tensor& x, Tensor& y, bool log) {
  const char* kernel = log ? "log_softmax" : "softmax";
  require_f32(x, kernel, "x");
  require_f32(y, kernel, "y");
  check_pair(x, y, kernel);
  const int64_t dim = last_dim(x), rows = rows_of(x);
  if (rows == 0 || dim == 0) return;
  Key key(kSoftmaxFwd);
  key.add(rows).add(dim).add(int64_t(log));
  auto e = d.cache.get<SoftmaxEntry>(key, [&] {
    auto en = std::make_shared<SoftmaxEntry>();
    en->md = rows_md(rows, dim);
    if (log)
      en->prim = dnnl::logsoftmax_forward(logsoftmax_pd(d, en->md));
    else
      en->prim = dnnl::softmax_forward(softmax_pd(d, en->md));
    en->arg(d, DNNL_ARG_SRC, en->md);
    en->arg(d, DNNL_ARG_DST, en->md);
    return en;
  });
  e->run(d, {{DNNL_ARG_SRC, x.data()}, {DNNL_ARG_DST, y.data()}});
}

void dnnl_softmax_backward(Dnnl& d, const Tensor& y, const Tensor& dy, Tensor& dx, bool log) {
  const char* kernel = log ? "log_softmax_backward" : "softmax_backward";
  require_f32(y, kernel, "y");
  require_f32(dy, kernel, "dy");
  require_f32(dx, kernel, "dx");
  check_pair(y, dy, kernel);
  check_pair(y, dx, kernel);
  const int64_t dim = last_dim(y), rows = rows_of(y);
  if (rows == 0 || dim == 0) return;
  Key key(kSoftmaxBwd);
  key.add(rows).add(dim).add(int64_t(log));
  auto e = d.cache.get<SoftmaxEntry>(key, [&] {
    auto en = std::make_shared<SoftmaxEntry>();
    en->md = rows_md(rows, dim);
    if (log) {
      auto hint = logsoftmax_pd(d, en->md);
      dnnl::logsoftmax_backward::desc desc(en->md, en->md, 1);
      en->prim = dnnl::logsoftmax_backward(dnnl::logsoftmax_backward::primitive_desc(desc, d.eng, hint));
    } else {
      auto hint = softmax_pd(d, en->md);
      dnnl::softmax_backward::desc desc(en->md, en->md, 1);
      en->prim = dnnl::softmax_backward(dnnl::softmax_backward::primitive_desc(desc, d.eng, hint));
    }
    en->arg(d, DNNL_ARG_DST, en->md);
    en->arg(d, DNNL_ARG_DIFF_DST, en->md);
    en->arg(d, DNNL_ARG_DIFF_SRC, en->md);
    return en;
  });
  e->run(d, {{DNNL_ARG_DST, y.data()}, {DNNL_ARG_DIFF_DST, dy.data()}, {DNNL_ARG_DIFF_SRC, dx.data()}});
}

}  // namespace

void softmax(CpuBackend& self, const Tensor& x, Tensor& y) {
  if (is_bf16_call(x)) return softmax_like_bf16(self, x, y, false);  // half.cpp
  dnnl_softmax_forward(self.dnnl(), x, y, false);
}
void log_softmax(CpuBackend& self, const Tensor& x, Tensor& y) {
  if (is_bf16_call(x)) return softmax_like_bf16(self, x, y, true);  // half.cpp
  require_f32(x, "log_softmax", "x");
  require_f32(y, "log_softmax", "y");
  check_pair(x, y, "log_softmax");
  const int64_t dim = last_dim(x), rows = rows_of(x);
  if (rows == 0 || dim == 0) return;
  const float* in = x.data_as<float>();
  float* out = y.data_as<float>();
  for_rows(rows, rows * dim > 32768, [=](int64_t lo, int64_t hi) {
    for (int64_t r = lo; r < hi; ++r) {
      const float* xr = in + r * dim;
      float* yr = out + r * dim;
      float mx = xr[0];
      for (int64_t i = 1; i < dim; ++i) mx = std::max(mx, xr[i]);
      double sum = 0.0;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < dim; ++i) sum += double(fast_exp(xr[i] - mx));
      const float lse = float(std::log(sum));
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) yr[i] = (xr[i] - mx) - lse;
    }
  });
}
void softmax_backward(CpuBackend& self, const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (is_bf16_call(y)) return softmax_like_backward_bf16(self, y, dy, dx, false);  // half.cpp
  dnnl_softmax_backward(self.dnnl(), y, dy, dx, false);
}
void log_softmax_backward(CpuBackend& self, const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (is_bf16_call(y)) return softmax_like_backward_bf16(self, y, dy, dx, true);  // half.cpp
  dnnl_softmax_backward(self.dnnl(), y, dy, dx, true);
}

#endif  // DEW_CPU_ISA
