// cpu/isa.hpp — which instruction set the cpu backend's hand-written kernels run on, chosen from the
// CPU's features at run time (not from the plugin's -m flags), so one build finds each x86-64 CPU's peak.
//
// Three paths, each kernel family compiled once per path (a `target` attribute on the clone):
//   avx512   AVX-512 F + VL + DQ + BW (full-width 16-lane vectors), with AVX2 and FMA;
//   avx2     AVX2 + FMA (16-lane logical vectors as two 8-lane halves);
//   portable the x86-64 baseline (SSE2; no FMA: products and sums rounded separately).
// best_isa() is the widest this CPU runs; a backend may be capped lower (the cpu backend's `isa` option),
// which is how tests run every path on one machine. Kernels written on 16-lane logical vectors with FMA
// give bit-identical results on avx512 and avx2; portable differs by the FMA roundings only.
// Header-only. Its vector helpers (16-lane logical vectors, below) are always-inline, so they compile for
// whichever path's function inlines them.
// How a family is compiled per path: isa_clones.hpp (the family's source, included once per path under a
// `#pragma GCC target` region into namespace avx512 / avx2 / portable); DEW_CPU_ISA_CALL picks one.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

namespace dew::cpu {

enum class Isa { portable = 0, avx2 = 1, avx512 = 2 };

inline const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::avx512:
      return "avx512";
    case Isa::avx2:
      return "avx2";
    default:
      return "portable";
  }
}

// The widest path this CPU supports (decided once), lowered by the environment variable DEW_CPU_MAX_ISA
// (avx2 | portable; as oneDNN's ONEDNN_MAX_CPU_ISA) to stand in for an older CPU: how the tests check that a
// path the CPU lacks is refused. Any other value of it is refused by the backend (check_max_isa_env).
inline Isa detected_isa() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
    return Isa::avx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
  return Isa::portable;
}
inline Isa best_isa() {
  static const Isa isa = [] {
    const Isa found = detected_isa();
    const char* cap = std::getenv("DEW_CPU_MAX_ISA");
    const std::string c = cap ? cap : "";
    const Isa limit = c == "portable" ? Isa::portable : c == "avx2" ? Isa::avx2 : Isa::avx512;
    return int(limit) < int(found) ? limit : found;
  }();
  return isa;
}
// Empty when DEW_CPU_MAX_ISA is unset or valid, else one line saying what is wrong with it.
inline std::string check_max_isa_env() {
  const char* cap = std::getenv("DEW_CPU_MAX_ISA");
  if (!cap) return {};
  const std::string c = cap;
  if (c == "avx512" || c == "avx2" || c == "portable") return {};
  return "DEW_CPU_MAX_ISA = '" + c + "' is not one of avx512, avx2, portable";
}

// "best" (or empty) -> best_isa(); "avx512", "avx2" or "portable" -> that path. False, with `why` set to one
// line, when the name is none of them or names a path this CPU cannot run (a forced path is never silently
// narrowed: a test that asks for avx512 must run avx512 or fail).
inline bool parse_isa(const std::string& name, Isa& out, std::string& why) {
  Isa want;
  if (name == "best" || name.empty()) {
    out = best_isa();
    return true;
  }
  if (name == "avx512")
    want = Isa::avx512;
  else if (name == "avx2")
    want = Isa::avx2;
  else if (name == "portable")
    want = Isa::portable;
  else {
    why = "'" + name + "' is not one of best, avx512, avx2, portable";
    return false;
  }
  if (int(want) > int(best_isa())) {
    why = "'" + name + "' needs CPU features this CPU lacks (" +
          (want == Isa::avx512 ? "AVX-512 F/VL/DQ/BW" : "AVX2 + FMA") + "); the widest it runs is " +
          isa_name(best_isa());
    return false;
  }
  out = want;
  return true;
}

// The attribute of each clone (a function), and the same feature sets for a whole region (isa_clones.hpp).
// F16C rides along with AVX2: every AVX2 CPU has it (Haswell, Zen 1 onwards).
#define DEW_CPU_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,f16c")))
#define DEW_CPU_TARGET_AVX2 __attribute__((target("avx2,fma,f16c")))
#define DEW_CPU_PRAGMA_TARGET_AVX512 _Pragma("GCC target(\"avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,f16c\")")
#define DEW_CPU_PRAGMA_TARGET_AVX2 _Pragma("GCC target(\"avx2,fma,f16c\")")

// fn(args...) from the namespace of the path `isa` (dew::cpu::avx512 / avx2 / portable, which
// isa_clones.hpp fills with one kernel family compiled once per path).
#define DEW_CPU_ISA_CALL(isa, fn, ...)                                                                  \
  ((isa) == ::dew::cpu::Isa::avx512 ? ::dew::cpu::avx512::fn(__VA_ARGS__)                              \
   : (isa) == ::dew::cpu::Isa::avx2 ? ::dew::cpu::avx2::fn(__VA_ARGS__)                                \
                                    : ::dew::cpu::portable::fn(__VA_ARGS__))
// A CpuBackend kernel (an entry of dew/kernel_table.hpp: its parameter list and argument names) whose body is
// `fn(*this, args...)` of the backend's path: DEW_CPU_ISA_KERNEL(rms_norm, (const Tensor& x, ...), (x, ...)).
#define DEW_CPU_ISA_ARGS_(...) __VA_ARGS__
#define DEW_CPU_ISA_KERNEL(name, params, args) \
  void CpuBackend::name##_kernel params { DEW_CPU_ISA_CALL(isa_, name, *this, DEW_CPU_ISA_ARGS_ args); }

// ---- 16-lane logical vectors (GCC vector extensions, no intrinsics): one zmm on avx512, two ymm on avx2,
// four xmm on the portable path. Below avx512 GCC 12 lowers their comparisons, selects and shuffles lane by
// lane: a family that needs those takes vec16.hpp's per-path vectors instead (attention.cpp; its avx512 kit is
// these); matmul_rowwise.cpp's portable path uses these directly (loads, + and *, hsum16 only).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpsabi"  // 64-byte vector returns: always inlined, no call ABI involved
#define DEW_AI inline __attribute__((always_inline))
typedef float vf __attribute__((vector_size(64)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint32_t vu __attribute__((vector_size(64)));

DEW_AI vf vload(const float* p) {
  vf v;
  __builtin_memcpy(&v, p, sizeof v);
  return v;
}
DEW_AI void vstore(float* p, const vf& v) { __builtin_memcpy(p, &v, sizeof v); }
// Lane broadcasts: a shuffle of lane 0 (inside a target("avx512f") function GCC lowers `vf{s, s, ...}` lane by
// lane, and `vf{} + s` is not an identity for -0.0).
DEW_AI vf vset(float s) {
  const vf v = {s};
  return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}
DEW_AI vi viset(int32_t s) {
  const vi v = {s};
  return __builtin_shufflevector(v, v, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0);
}
// The fixed tree over 16 lanes: halves, then quarters, then pairs (the same on every path).
DEW_AI float hsum16(const vf& v) {
  typedef float v8 __attribute__((vector_size(32)));
  typedef float v4 __attribute__((vector_size(16)));
  const v8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
               __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const v4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}
#pragma GCC diagnostic pop

}  // namespace dew::cpu
