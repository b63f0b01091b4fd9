// cpu/bf16_dot.cpp — whether bf16 arithmetic pays on this CPU: the one decision every bf16 path of the backend
// follows (oneDNN's bf16 products under bf16-mixed and matmul_precision = medium, attention_bf16.cpp's kernels).
//
// AVX512-BF16's vdpbf16ps does 32 multiply-adds per instruction against vfmadd231ps's 16, but how many a core
// issues per cycle depends on the core: AMD Zen 5 runs it at ~2x the f32 FMA rate in flops (session 22: a 6 x 4
// register block at 210 against 102 GMAC/s), Intel Emerald Rapids without AMX at 0.49x (this file's probe: 86
// against 176 GFLOP/s on one core, session 31). There a bf16 product takes twice as long as the f32 product of its
// widened operands, oneDNN's and dew's own alike (oneDNN's bf16 peak 86 GFLOP/s against 163 in f32), so the
// instruction's presence does not decide: its measured rate does.
// bf16_dot_rate() measures it once per process: 12 independent accumulator chains (more than latency x issue width
// on any core) of each instruction on 512-bit registers, after a warm-up that lets the core reach its AVX-512
// clock, best of 7 alternated rounds of 48,000 instructions each (~10-40 us; ~0.6 ms in all, once, at plugin load);
// the rate is the ratio of the two flop rates.
// bf16 work runs natively where the rate is at least kNativeBf16Rate (bf16_products_pay, bf16_attention_pays);
// oneDNN's products also where oneDNN can use AMX (its tile kernels do not run on vdpbf16ps). Elsewhere medium's
// products stay f32 and bf16 tensors are multiplied as their exact f32 widening (half.cpp). Every CPU measured sits
// 2x either side of the threshold, so the choice (and with it the products' bits: a resumed run multiplies as
// the run it continues did) does not move between runs of one machine; the backend option `bf16_dot` pins it.
//
// Invariants: the probe runs only on CPUs with AVX512-BF16 (its code is target("avx512bf16") in namespace
// avx512bf16, which tests/backends_cpu/check_baseline.py allows); nothing here depends on the build machine.
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <limits>

#include "attention_bf16.hpp"  // attention_bf16_fast_cpu: what its kernels need of the CPU
#include "cpu_backend.hpp"

namespace dew::cpu {

namespace avx512bf16 {
namespace {

constexpr int kChains = 12;

// Seconds for `iters` rounds of one instruction on each of kChains independent accumulators.
template <bool kDot>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"), noinline)) double chains_seconds(int64_t iters) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(float(i));
  const __m512 a = _mm512_set1_ps(1.0f), b = _mm512_set1_ps(0x1p-20f);
  const __m512bh ah = (__m512bh)_mm512_set1_epi16(0x3f80), bh = (__m512bh)_mm512_set1_epi16(0x3580);  // 1, 2^-20
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t n = 0; n < iters; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = kDot ? _mm512_dpbf16_ps(acc[i], ah, bh) : _mm512_fmadd_ps(a, b, acc[i]);
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  __m512 sum = acc[0];
  for (int i = 1; i < kChains; ++i) sum = _mm512_add_ps(sum, acc[i]);
  volatile float sink = _mm512_reduce_add_ps(sum);  // the chains' results are used
  (void)sink;
  return s;
}

}  // namespace

// vdpbf16ps's flop rate over vfmadd231ps's on this core (64 against 32 flops per instruction).
double dot_to_fma_rate() {
  constexpr int64_t kIters = 4000;  // 48,000 instructions a round: ~10 us of FMAs on a 2x512-bit core
  chains_seconds<false>(100000);    // warm-up: AVX-512 clock and power licence
  double fma = std::numeric_limits<double>::infinity(), dot = fma;
  for (int round = 0; round < 7; ++round) {
    fma = std::min(fma, chains_seconds<false>(kIters));
    dot = std::min(dot, chains_seconds<true>(kIters));
  }
  return dot > 0.0 ? 2.0 * fma / dot : 0.0;
}

}  // namespace avx512bf16

bool cpu_has_avx512_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512f") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

bool cpu_has_bf16_dot() {
  // oneDNN multiplies the bf16 products: its own ISA cap (ONEDNN_MAX_CPU_ISA, standing in for an older CPU) counts,
  // or a capped run would ask it for bf16 primitives it then refuses to create.
  constexpr unsigned kOnednnBf16 = unsigned(dnnl_cpu_isa_avx512_core_bf16);
  return cpu_has_avx512_bf16() && (unsigned(dnnl::get_effective_cpu_isa()) & kOnednnBf16) == kOnednnBf16;
}

double bf16_dot_rate() {
  static const double rate = cpu_has_avx512_bf16() ? avx512bf16::dot_to_fma_rate() : 0.0;
  return rate;
}

bool onednn_has_amx() {
  constexpr unsigned kAmx = unsigned(dnnl_cpu_isa_avx512_core_amx);
  return (unsigned(dnnl::get_effective_cpu_isa()) & kAmx) == kAmx;
}

bool bf16_products_pay() { return cpu_has_bf16_dot() && (onednn_has_amx() || bf16_dot_rate() >= kNativeBf16Rate); }
bool bf16_attention_pays() { return attention_bf16_fast_cpu() && bf16_dot_rate() >= kNativeBf16Rate; }

Bf16Choice bf16_choice(const std::string& option) {
  if (option == "auto") return {bf16_products_pay(), bf16_attention_pays()};
  if (option == "widened") return {false, false};
  DEW_USAGE_CHECK(option == "native", "cpu backend: option 'bf16_dot' = '", option,
                  "' is not one of auto, native, widened");
  DEW_USAGE_CHECK(cpu_has_bf16_dot(), "cpu backend: bf16_dot = native needs a CPU with AVX512-BF16 that oneDNN may use",
                  " (this one has ", cpu_has_avx512_bf16() ? "it, but oneDNN's ISA is capped below it" : "none", ")");
  return {true, true};
}

std::string bf16_dot_summary() {
  if (!cpu_has_avx512_bf16()) return "bf16 arithmetic widened to f32 (no AVX512-BF16)";
  char rate[32];
  std::snprintf(rate, sizeof rate, "%.2f", bf16_dot_rate());
  const bool products = bf16_products_pay(), attention = bf16_attention_pays();
  return std::string("bf16 products ") + (products ? "native" : "widened to f32") + ", bf16 attention " +
         (attention ? "native" : "widened to f32") + " (vdpbf16ps at " + rate + "x the f32 FMA flop rate" +
         (onednn_has_amx() ? "; oneDNN has AMX" : "") + "; option bf16_dot = auto)";
}

}  // namespace dew::cpu
