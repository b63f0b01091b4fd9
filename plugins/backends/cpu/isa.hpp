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
// Header-only and free of inline vector code: it is included by files compiled at baseline flags too.
#pragma once

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

// The widest path this CPU supports (decided once).
inline Isa best_isa() {
  static const Isa isa = [] {
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
      return Isa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::avx2;
    return Isa::portable;
  }();
  return isa;
}

// "best", "avx512", "avx2" or "portable" -> the path to take (never wider than best_isa()); false when the
// name is not one of them.
inline bool parse_isa_cap(const std::string& name, Isa& out) {
  Isa want;
  if (name == "best" || name.empty())
    want = Isa::avx512;
  else if (name == "avx512")
    want = Isa::avx512;
  else if (name == "avx2")
    want = Isa::avx2;
  else if (name == "portable")
    want = Isa::portable;
  else
    return false;
  out = int(want) < int(best_isa()) ? want : best_isa();
  return true;
}

// The attribute of each clone.
#define DEW_CPU_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx512dq,avx512bw,avx2,fma")))
#define DEW_CPU_TARGET_AVX2 __attribute__((target("avx2,fma")))

}  // namespace dew::cpu
