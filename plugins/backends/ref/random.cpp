// random.cpp — counter-based random tensors and dropout, both on dew::philox (dew/random.hpp).
// Invariants: element i draws index offset + i of (seed, stream), so results do not depend on call
// order or layout; uniform values are a + (b - a) u, normal values a + b z, computed in double and
// rounded once to out's dtype; dropout keeps element i when uniform(offset + i) >= p and scales by 1/(1-p).
#include "dew/random.hpp"

#include "ref_backend.hpp"

namespace dew::ref {

void RefBackend::random(Tensor& out, const RandomParams& p) {
  DEW_CHECK(is_floating(out.dtype()), "ref.random: out must be floating, got ", dtype_name(out.dtype()));
  const double a = p.a, b = p.b;
  for (int64_t i = 0; i < out.numel(); ++i) {
    const uint64_t g = p.offset + uint64_t(i);
    const double v = p.dist == Distribution::uniform ? a + (b - a) * double(philox::uniform(p.seed, p.stream, g))
                                                     : a + b * double(philox::normal(p.seed, p.stream, g));
    store_any(out.dtype(), out.data(), i, v);
  }
}

void RefBackend::dropout(const Tensor& x, Tensor& y, Tensor& mask, const DropoutParams& p) {
  dispatch_float(x.dtype(), Kernel::dropout, [&](auto tag) {
    using T = typename decltype(tag)::type;
    expect(y, x.dtype(), x.numel(), Kernel::dropout, "y");
    expect(mask, x.dtype(), x.numel(), Kernel::dropout, "mask");
    DEW_CHECK(p.p >= 0.0f && p.p <= 1.0f, "ref.dropout: p = ", p.p, " is outside [0, 1]");
    const double keep_scale = p.p < 1.0f ? 1.0 / (1.0 - double(p.p)) : 0.0;
    const T* xs = x.data_as<T>();
    T* ys = y.data_as<T>();
    T* ms = mask.data_as<T>();
    for (int64_t i = 0; i < x.numel(); ++i) {
      const bool kept = philox::uniform(p.seed, p.stream, p.offset + uint64_t(i)) >= p.p;
      const double mi = kept ? keep_scale : 0.0;
      ms[i] = T(mi);
      ys[i] = T(double(xs[i]) * mi);
    }
  });
}

}  // namespace dew::ref
