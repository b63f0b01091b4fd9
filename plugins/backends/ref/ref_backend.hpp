// ref_backend.hpp — the `ref` backend: plain loop-based C++ kernels, the oracle of the test-suite.
//
// Invariants (on top of dew/backend.hpp's contract):
//  * correctness over speed: no SIMD, no threads, no external libraries; one readable loop nest per kernel;
//  * floating kernels run on f32 and f64 (templated on the element type T) and accumulate in double;
//    fill, cast, strided_copy, gather_rows and random also take the other dtypes (see supports());
//  * saved statistics (mean, rstd, lse, per-row losses) are read and written in their own dtype,
//    which may be f32 or f64, so f64 inputs keep f64 statistics end to end;
//  * every kernel validates shapes and dtypes first and throws dew::Error naming the kernel.
// The kernels are split by family: memory.cpp, elementwise.cpp, matmul.cpp, softmax_norm.cpp,
// embedding_rope.cpp (gather/scatter/rope), attention.cpp, conv.cpp, loss.cpp, optim.cpp, random.cpp, entry.cpp.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>

#include "dew/backend.hpp"
#include "dew/dtype.hpp"
#include "dew/error.hpp"
#include "dew/tensor.hpp"

namespace dew::ref {

// What ref runs, per kernel and (primary) dtype; RefBackend::supports() answers with it.
Support support_of(Kernel k, DType dtype);

class RefBackend final : public Backend {
 public:
  std::string name() const override { return "ref"; }
  bool host_accessible() const override { return true; }
  // Its products accumulate in double and add beta * out before the one rounding: the separate add's bits only in
  // f64, where the product needs no rounding (the backbone fixtures hold ref's f32 bits with the add).
  bool matmul_beta_adds_rounded(DType dtype) const override { return dtype == DType::f64; }
  Support supports(Kernel k, DType dtype) const override { return support_of(k, dtype); }

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_device(void* dst, const void* src, size_t bytes) override;
  MemoryStats memory_stats() const override { return memory_.stats(); }
  void reset_memory_peak() override { memory_.reset_peak(); }

  // The kernel algebra: one definition per entry of dew/kernel_table.hpp, in the family files.
  DEW_KERNEL_OVERRIDES

 private:
  MemoryCounter memory_;  // every allocation, at its 64-byte-rounded size
};

// ---------------------------------------------------------------- helpers shared by the kernel files

// Calls f(std::type_identity<T>{}) with T = float or double for dt; any other dtype throws with
// supports()'s reason.
template <class F>
void dispatch_float(DType dt, Kernel k, F&& f) {
  switch (dt) {
    case DType::f32:
      f(std::type_identity<float>{});
      return;
    case DType::f64:
      f(std::type_identity<double>{});
      return;
    default:
      break;
  }
  DEW_CHECK(false, "ref.", kernel_name(k), ": dtype ", dtype_name(dt), " is not supported (", support_of(k, dt).reason,
            ")");
}

// Reads / writes element i of a buffer of any dtype as a double (integers truncate toward zero on store,
// half types round to nearest even through f32).
double load_any(DType dt, const void* base, int64_t i);
void store_any(DType dt, void* base, int64_t i, double v);

// Checks that t has exactly `dt` and `numel` elements; `what` names it in the message.
void expect(const Tensor& t, DType dt, int64_t numel, Kernel k, const char* what);
// Checks that a statistics tensor (mean, rstd, lse, loss) is f32 or f64 with `numel` elements.
void expect_stat(const Tensor& t, int64_t numel, Kernel k, const char* what);

// Element access of a statistics tensor (f32 or f64).
inline double load_stat(const Tensor& t, int64_t i) { return load_any(t.dtype(), t.data(), i); }
inline void store_stat(Tensor& t, int64_t i, double v) { store_any(t.dtype(), t.data(), i, v); }

}  // namespace dew::ref
