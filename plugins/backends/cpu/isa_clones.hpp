// cpu/isa_clones.hpp — compiles one kernel family's source once per ISA path (isa.hpp), the way Highway's
// foreach_target.h does: a family file X.cpp defines DEW_CPU_ISA_SELF "X.cpp" and includes this header,
// which includes X.cpp three more times with DEW_CPU_ISA defined, each inside its own namespace:
//   dew::cpu::avx512    under #pragma GCC target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,f16c")
//   dew::cpu::avx2      under #pragma GCC target("avx2,fma,f16c")
//   dew::cpu::portable  at the file's own flags (the x86-64 baseline, CMakeLists.txt)
// and `kIsa` names the path inside each; DEW_CPU_ISA_IS_AVX512 / DEW_CPU_ISA_IS_AVX2 /
// DEW_CPU_ISA_IS_PORTABLE is defined in its own pass, for a family that writes a path with intrinsics
// (`#if defined(...)`: matmul_rowwise.cpp; immintrin.h is included by the first pass, its functions carry
// their own targets). The family's kernels (#if defined(DEW_CPU_ISA) part) must include no header
// (everything is included by the first pass, outside the target regions, so no inline function of a header
// is ever emitted with AVX-512 code) but vec16.hpp, bf16_bits.hpp and attention_visibility.hpp, which are written for
// it (only always-inline helpers and types of the path's own namespace: the per-path 16-lane vectors); DEW_CPU_ISA_CALL
// / DEW_CPU_ISA_KERNEL call the copy a backend was given. Every function defined in a region gets its target, lambdas
// and OpenMP-outlined bodies too (checked on GCC 12: the `#pragma omp parallel` child of a region function is AVX-512
// code), so a family keeps its OpenMP loops as written.
#ifndef DEW_CPU_ISA_SELF
#error "define DEW_CPU_ISA_SELF (the family's own file name) before including isa_clones.hpp"
#endif
#ifdef DEW_CPU_ISA
#error "isa_clones.hpp is included from the first pass of a family file only"
#endif

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vector arguments of always-inline helpers

#pragma GCC push_options
DEW_CPU_PRAGMA_TARGET_AVX512
#define DEW_CPU_ISA avx512
#define DEW_CPU_ISA_IS_AVX512 1
namespace dew::cpu::avx512 {
[[maybe_unused]] constexpr Isa kIsa = Isa::avx512;
#include DEW_CPU_ISA_SELF
}  // namespace dew::cpu::avx512
#undef DEW_CPU_ISA_IS_AVX512
#undef DEW_CPU_ISA
#pragma GCC pop_options

#pragma GCC push_options
DEW_CPU_PRAGMA_TARGET_AVX2
#define DEW_CPU_ISA avx2
#define DEW_CPU_ISA_IS_AVX2 1
namespace dew::cpu::avx2 {
[[maybe_unused]] constexpr Isa kIsa = Isa::avx2;
#include DEW_CPU_ISA_SELF
}  // namespace dew::cpu::avx2
#undef DEW_CPU_ISA_IS_AVX2
#undef DEW_CPU_ISA
#pragma GCC pop_options

#define DEW_CPU_ISA portable
#define DEW_CPU_ISA_IS_PORTABLE 1
namespace dew::cpu::portable {
[[maybe_unused]] constexpr Isa kIsa = Isa::portable;
#include DEW_CPU_ISA_SELF
}  // namespace dew::cpu::portable
#undef DEW_CPU_ISA_IS_PORTABLE
#undef DEW_CPU_ISA

#pragma GCC diagnostic pop
