// core/ops/kernel_call.hpp — how the ops call kernels: `kernels(x).layer_norm(...)` instead of
// `x.backend().layer_norm(...)`. A KernelCall has one method per entry of the kernel table
// (dew/kernel_table.hpp) with the kernel's own parameters. When a floating tensor argument is bf16 or
// f16 and the backend's supports() says no for that kernel and dtype, the call converts around the f32
// kernel: each half input is widened to an f32 temporary, each half output gets an f32 temporary
// (filled from the output first for the kernels that read their outputs: scatter_add_rows, matmul with
// beta, rms_norm_backward's accumulate, the optimizers, attention_slots' caches), the f32 kernel runs, and the
// temporaries are rounded back (nearest even) into the outputs (an accumulated sum then rounds once, not as a half add
// would: callers that promise the bits of a separate add accumulate only where the backend supports the dtype). So
// every backend runs mixed precision; a backend makes it fast by supporting the dtype. Every call is shown first to the
// thread's step recorder, when one records (step_record.hpp). Invariants: the dtype-agnostic kernels (fill, cast,
// strided_copy, gather_rows) are called directly; statistics (mean, rstd, lse, losses) are f32 and never converted; a
// supported call is a plain call.
#pragma once
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/tensor.hpp"
#include "step_record.hpp"

namespace dew::detail {

inline bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

template <class A>
void note_half(const A& a, DType& found) {
  if constexpr (std::is_same_v<std::decay_t<A>, Tensor>)
    if (found == DType::f32 && a.defined() && is_half(a.dtype())) found = a.dtype();
}

inline bool reads_outputs(Kernel k) {
  switch (k) {
    case Kernel::scatter_add_rows:
    case Kernel::matmul:
    case Kernel::rms_norm_backward:
    case Kernel::adamw_update:
    case Kernel::sgd_update:
    case Kernel::lamb_update:
    case Kernel::attention_slots:  // the caches: read up to each row's position, one row written
      return true;
    default:
      return false;
  }
}

struct Widened {
  Backend& be;
  bool copy_in;
  std::vector<std::pair<Tensor, Tensor>> outputs;  // (the half output, its f32 temporary)

  // P is the kernel's declared parameter type: `Tensor&` marks an output.
  template <class P, class A>
  auto convert(const A& a) {
    if constexpr (std::is_same_v<std::decay_t<A>, Tensor>) {
      if (!a.defined() || !is_half(a.dtype())) return Tensor(a);
      Tensor wide = Tensor::empty(a.shape(), DType::f32, a.backend_ptr());
      constexpr bool output = std::is_same_v<P, Tensor&>;
      if (!output || copy_in) be.cast(a, wide);
      if (output) outputs.emplace_back(a, wide);
      return wide;
    } else {
      return std::decay_t<A>(a);
    }
  }
};

template <class... P, class... A, size_t... I>
void call_widened(Backend& be, Kernel k, void (Backend::*fn)(P...), std::index_sequence<I...>, A&... args) {
  Widened w{be, reads_outputs(k), {}};
  auto wide = std::make_tuple(w.template convert<std::tuple_element_t<I, std::tuple<P...>>>(args)...);
  std::apply([&](auto&... xs) { (be.*fn)(xs...); }, wide);
  for (auto& [half, f32] : w.outputs) {
    Tensor out = half;
    be.cast(f32, out);
  }
}

template <class... P, class... A>
void call_kernel(Backend& be, Kernel k, void (Backend::*fn)(P...), A&... args) {
  static_assert(sizeof...(P) == sizeof...(A));
  if (StepRecorder* r = active_step_recorder()) r->kernel(be, k, fn, args...);  // a step program records
  if (k == Kernel::fill || k == Kernel::cast || k == Kernel::strided_copy || k == Kernel::gather_rows)
    return (be.*fn)(args...);
  DType half = DType::f32;
  (note_half(args, half), ...);
  if (half == DType::f32 || be.supports(k, half).ok) return (be.*fn)(args...);
  call_widened(be, k, fn, std::index_sequence_for<P...>{}, args...);
}

#define DEW_KERNEL_CALL_EXPAND_(...) __VA_ARGS__
#define DEW_KERNEL_CALL_METHOD_(name, params, args) \
  void name params { call_kernel(be, Kernel::name, &Backend::name, DEW_KERNEL_CALL_EXPAND_ args); }

// The kernels of one backend, called with the half-precision fallback above.
struct KernelCall {
  Backend& be;
  DEW_KERNEL_TABLE(DEW_KERNEL_CALL_METHOD_)
};

inline KernelCall kernels(const Tensor& x) { return KernelCall{x.backend()}; }
inline KernelCall kernels(Backend& be) { return KernelCall{be}; }

}  // namespace dew::detail
