// cpu/random.cpp — Philox random fills and dropout (f32), bit-identical to every other backend.
//
// Element i draws number offset + i of (seed, stream) with exactly the arithmetic of dew/random.hpp
// (philox::uniform / philox::normal); each Philox block (4 uniform or 2 normal numbers) is computed once
// and its words reused for consecutive elements; uniform draws compute 16 blocks at a time in SIMD lanes. The maps a +
// (b - a) u, a + b z and x * 1/(1-p) run in double and round once, exactly as the ref backend writes them, and this
// file is compiled with -ffp-contract=off so no FMA contraction changes a rounding: values equal ref's bit for bit,
// whatever the thread count.
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`; integer Philox and uncontracted
// double maps (-ffp-contract=off holds inside the target regions too): the same bits on every path.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include "dew/random.hpp"
#include <algorithm>
#include "cpu_backend.hpp"

#define DEW_CPU_ISA_SELF "random.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(random, (Tensor& out, const RandomParams& p), (out, p))
DEW_CPU_ISA_KERNEL(dropout, (const Tensor& x, Tensor& y, Tensor& mask, const DropoutParams& p), (x, y, mask, p))

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include here)

namespace {

// Philox4x32-10 of kLanes consecutive blocks at once, in structure-of-arrays form so the rounds
// vectorise (32x32->64 multiplies); the same integer arithmetic as philox::block, so the same bits.
constexpr int kLanes = 16;
struct Blocks {
  uint32_t w[kLanes * 4];  // word w of block first + j at [4 * j + w]: number g sits at [g - 4 * first]
};
inline void philox_blocks(uint64_t seed, uint64_t stream, uint64_t first_block, Blocks& out) {
  uint32_t c0[kLanes], c1[kLanes], c2[kLanes], c3[kLanes];
  for (int j = 0; j < kLanes; ++j) {
    const uint64_t b = first_block + uint64_t(j);
    c0[j] = uint32_t(b);
    c1[j] = uint32_t(b >> 32);
    c2[j] = uint32_t(stream);
    c3[j] = uint32_t(stream >> 32);
  }
  uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += philox::kWeyl0;
      k1 += philox::kWeyl1;
    }
#pragma omp simd
    for (int j = 0; j < kLanes; ++j) {
      const uint64_t p0 = uint64_t(philox::kMul0) * c0[j];
      const uint64_t p1 = uint64_t(philox::kMul1) * c2[j];
      const uint32_t n0 = uint32_t(p1 >> 32) ^ c1[j] ^ k0, n1 = uint32_t(p1);
      const uint32_t n2 = uint32_t(p0 >> 32) ^ c3[j] ^ k1, n3 = uint32_t(p0);
      c0[j] = n0;
      c1[j] = n1;
      c2[j] = n2;
      c3[j] = n3;
    }
  }
  for (int j = 0; j < kLanes; ++j) {
    out.w[4 * j] = c0[j];
    out.w[4 * j + 1] = c1[j];
    out.w[4 * j + 2] = c2[j];
    out.w[4 * j + 3] = c3[j];
  }
}

// Calls f(i, u) for i in [i0, i1) with u = philox::uniform(seed, stream, offset + i): kLanes blocks
// (4 * kLanes numbers) are generated at a time.
template <class F>
inline void uniform_range(uint64_t seed, uint64_t stream, uint64_t offset, int64_t i0, int64_t i1, F&& f) {
  Blocks bl;
  int64_t i = i0;
  while (i < i1) {
    const uint64_t g = offset + uint64_t(i);
    const uint64_t first = g >> 2;
    philox_blocks(seed, stream, first, bl);
    // These blocks hold numbers 4 * first .. 4 * (first + kLanes) - 1.
    const int64_t w0 = int64_t(g - 4 * first);
    const int64_t count = std::min<int64_t>(4 * kLanes - w0, i1 - i);
    const uint32_t* words = bl.w + w0;
#pragma omp simd
    for (int64_t j = 0; j < count; ++j) f(i + j, float(words[j] >> 8) * (1.0f / 16777216.0f));
    i += count;
  }
}

// Same for philox::normal: one block per 2 elements, words (2w, 2w+1).
template <class F>
inline void normal_range(uint64_t seed, uint64_t stream, uint64_t offset, int64_t i0, int64_t i1, F&& f) {
  int64_t i = i0;
  while (i < i1) {
    const uint64_t g = offset + uint64_t(i);
    const philox::Counter c = philox::block(seed, stream, g >> 1);
    for (uint64_t h = g & 1; h < 2 && i < i1; ++h, ++i) {
      const int w = int(h) * 2;
      const double u1 = (double(c[w]) + 1.0) * (1.0 / 4294967296.0);
      const double u2 = double(c[w + 1]) * (1.0 / 4294967296.0);
      f(i, float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2)));
    }
  }
}

// Splits [0, n) over the team in chunks aligned to 4 elements of the global index.
template <class F>
void parallel_chunks(int64_t n, F&& f) {
  if (n < 4096 || omp_get_max_threads() == 1) {  // no OpenMP region on one thread (team_of_many, cpu_backend.hpp)
    if (n > 0) f(int64_t(0), n);
    return;
  }
#pragma omp parallel
  {
    const int nt = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t lo = t == 0 ? 0 : ((n * t / nt) & ~int64_t(3)),
                  hi = t == nt - 1 ? n : ((n * (t + 1) / nt) & ~int64_t(3));
    if (lo < hi) f(lo, hi);
  }
}

}  // namespace

void random(CpuBackend& self, Tensor& out, const RandomParams& p) {
  require_f32(out, "random", "out");
  const int64_t n = out.numel();
  float* o = out.data_as<float>();
  const double a = p.a, b = p.b;  // the maps run in double and round once, as ref's do
  if (p.dist == Distribution::uniform) {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      uniform_range(p.seed, p.stream, p.offset, lo, hi,
                    [&](int64_t i, float u) { o[i] = float(a + (b - a) * double(u)); });
    });
  } else {
    parallel_chunks(n, [&](int64_t lo, int64_t hi) {
      normal_range(p.seed, p.stream, p.offset, lo, hi, [&](int64_t i, float z) { o[i] = float(a + b * double(z)); });
    });
  }
}

void dropout(CpuBackend& self, const Tensor& x, Tensor& y, Tensor& mask, const DropoutParams& p) {
  require_f32(x, "dropout", "x");
  require_f32(y, "dropout", "y");
  require_f32(mask, "dropout", "mask");
  DEW_CHECK(y.numel() == x.numel() && mask.numel() == x.numel(), "cpu dropout: y/mask sizes do not match x ",
            shape_str(x.shape()));
  DEW_CHECK(p.p >= 0.0f && p.p <= 1.0f, "cpu dropout: p = ", p.p, " is outside [0, 1]");
  const int64_t n = x.numel();
  const float* xs = x.data_as<float>();
  float* ys = y.data_as<float>();
  float* ms = mask.data_as<float>();
  const double keep_scale = p.p < 1.0f ? 1.0 / (1.0 - double(p.p)) : 0.0;
  const float keep_scale_f = float(keep_scale), drop = p.p;
  parallel_chunks(n, [&](int64_t lo, int64_t hi) {
    uniform_range(p.seed, p.stream, p.offset, lo, hi, [&](int64_t i, float u) {
      const bool kept = u >= drop;
      ms[i] = kept ? keep_scale_f : 0.0f;
      ys[i] = kept ? float(double(xs[i]) * keep_scale) : float(double(xs[i]) * 0.0);
    });
  });
}

#endif  // DEW_CPU_ISA
