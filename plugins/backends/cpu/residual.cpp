// cpu/residual.cpp — adaLN-Zero's gated residual y = x + gate[g] * f in one pass, and its backward in one pass
// (f32 and bf16).
//
// Each element is the expression the unfused ops compute: mul(f, gate) rounded to f32, then add(x, ·); the
// backward's df = dy * gate[g] is mul's, and dgate[g] sums the f32 products dy * f of group g's rows in double,
// row by row from 0, as reduce does. So the fused kernels give the unfused ops' bits (tests/backends_cpu checks
// it) while reading 3 and writing 1 tensor forward (5 and 2 unfused: the product's round trip) and reading 3,
// writing 1 backward (5 and 2, plus reduce's pass over the product). This file is compiled with
// -ffp-contract=off (CMakeLists.txt): a contracted x + f * g would round once, not as the unfused ops do.
// Threads: forward rows split over the team; backward whole groups (a group's column sums stay on one thread),
// so the bits do not depend on the thread count. At one thread no OpenMP region is entered (for_rows).
// bf16 (every tensor bf16): the same loops over bf16 storage (bf16_bits.hpp), arithmetic in f32 and each output
// rounded once, as cuda's bf16 kernel and ref's oracle: the f32 kernel's bits on the widened inputs (tested); not
// the unfused bf16 ops' bits, which round the product to bf16 first.
// ISA: compiled once per path (isa_clones.hpp); uncontracted single operations and double sums in row order:
// the same bits on every path.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include <algorithm>
#include <type_traits>
#include <vector>

#include "cpu_backend.hpp"
#include "dew/kernel_contracts.hpp"

#define DEW_CPU_ISA_SELF "residual.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(gated_residual, (const Tensor& x, const Tensor& f, const Tensor& gate, Tensor& y), (x, f, gate, y))
DEW_CPU_ISA_KERNEL(gated_residual_backward,
                   (const Tensor& f, const Tensor& gate, const Tensor& dy, Tensor& df, Tensor& dgate),
                   (f, gate, dy, df, dgate))

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include but
       // bf16_bits.hpp)

#include "bf16_bits.hpp"  // ld / st: float or bf16 (uint16_t) storage, computed on in f32

namespace {

// Rows [r0, r1) of y = x + g * f, gate row r / per. Pointers and sizes by value: the simd loops see no captured
// float that a store could alias (see for_blocks in cpu_backend.hpp).
template <class T>
void gated_residual_rows(const T* x, const T* f, const T* gate, T* y, int64_t d, int64_t per, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r) {
    const T* xr = x + r * d;
    const T* fr = f + r * d;
    const T* gr = gate + (r / per) * d;
    T* yr = y + r * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) {
      const float t = ld(fr[j]) * ld(gr[j]);
      st(yr + j, ld(xr[j]) + t);
    }
  }
}

// Groups [g0, g1): df = dy * gate[g], dgate[g] = sum over the group's rows of double(dy * f), row by row.
template <class T>
void gated_residual_backward_groups(const T* f, const T* gate, const T* dy, T* df, T* dgate, int64_t d, int64_t per,
                                    int64_t g0, int64_t g1) {
  std::vector<double> acc(static_cast<size_t>(d));
  double* a = acc.data();
  for (int64_t g = g0; g < g1; ++g) {
    const T* gr = gate + g * d;
    std::fill(a, a + d, 0.0);
    for (int64_t r = g * per; r < (g + 1) * per; ++r) {
      const T* fr = f + r * d;
      const T* dr = dy + r * d;
      T* o = df + r * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) {
        const float p = ld(dr[j]) * ld(fr[j]);
        a[j] += double(p);
        st(o + j, ld(dr[j]) * ld(gr[j]));
      }
    }
    T* dg = dgate + g * d;
#pragma omp simd
    for (int64_t j = 0; j < d; ++j) st(dg + j, float(a[j]));
  }
}

}  // namespace

void gated_residual(CpuBackend& self, const Tensor& x, const Tensor& f, const Tensor& gate, Tensor& y) {
  const int64_t per = contracts::gated_residual_group("cpu.gated_residual", f, gate, {{&x, "x"}, {&y, "y"}}, {});
  const bool half = is_bf16_call(f);  // the contract checked that x, gate and y share f's dtype
  if (!half) require_f32(f, "gated_residual", "f");
  const int64_t d = gate.shape()[1], rows = rows_of(f);
  if (f.numel() == 0) return;
  auto run = [&](auto* ys) {
    using T = std::remove_pointer_t<decltype(ys)>;
    const T* xs = x.data_as<T>();
    const T* fs = f.data_as<T>();
    const T* g = gate.data_as<T>();
    for_rows(rows, parallel_worth(f.numel()) && rows > 1,
             [=](int64_t r0, int64_t r1) { gated_residual_rows(xs, fs, g, ys, d, per, r0, r1); });
  };
  half ? run(y.data_as<uint16_t>()) : run(y.data_as<float>());
}

void gated_residual_backward(CpuBackend& self, const Tensor& f, const Tensor& gate, const Tensor& dy, Tensor& df,
                             Tensor& dgate) {
  const int64_t per = contracts::gated_residual_group("cpu.gated_residual_backward", f, gate,
                                                      {{&dy, "dy"}, {&df, "df"}}, {{&dgate, "dgate"}});
  const bool half = is_bf16_call(f);  // as the forward
  if (!half) require_f32(f, "gated_residual_backward", "f");
  const int64_t groups = gate.shape()[0], d = gate.shape()[1];
  if (gate.numel() == 0) return;
  auto run = [&](auto* dfs) {
    using T = std::remove_pointer_t<decltype(dfs)>;
    const T* fs = f.data_as<T>();
    const T* g = gate.data_as<T>();
    const T* dys = dy.data_as<T>();
    T* dg = dgate.data_as<T>();
    for_rows(groups, parallel_worth(f.numel()) && groups > 1,
             [=](int64_t g0, int64_t g1) { gated_residual_backward_groups(fs, g, dys, dfs, dg, d, per, g0, g1); });
  };
  half ? run(df.data_as<uint16_t>()) : run(df.data_as<float>());
}

#endif  // DEW_CPU_ISA
