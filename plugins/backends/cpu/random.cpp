// cpu/random.cpp — Philox random fills and dropout (f32), bit-identical to every other backend.
//
// Element i draws number offset + i of (seed, stream) with exactly the arithmetic of dew/random.hpp
// (philox::uniform / philox::normal); each Philox block (4 uniform or 2 normal numbers) is computed once
// and its words reused for consecutive elements; both draws compute 16 blocks at a time in SIMD lanes. The maps a +
// (b - a) u, a + b z and x * 1/(1-p) run in double and round once, exactly as the ref backend writes them, and this
// file is compiled with -ffp-contract=off so no FMA contraction changes a rounding: values equal ref's bit for bit,
// whatever the thread count.
// Normal draws: philox::normal is float(sqrt(-2 log u1) cos(2pi u2)) with libm's double log and cos, ~30 ns an element
// one call at a time (1.6 ms of the DiT's f32 training step, its noise). Here 32 at a time in SIMD lanes: log and cos
// by polynomials in double written below (relative error <= 2^-44 of the product, bounds in normals_of), then the
// f32 rounding. That rounding equals the rounding of libm's value unless the double lies within 2^-36 (relative) of
// an f32 rounding boundary, or |cos| < 2^-6 (where cos's absolute error weighs more), or z = 0: those elements
// (~1 % of them) are recomputed with philox::normal's own expression. So the values stay libm's, bit for bit
// (tests/backends_cpu compares 2^22 draws with philox::normal on every path). Measured on the Zen 5 (avx512, one
// thread, the DiT's 49,152 noise values): 29 -> 7 ns an element, ~3 of them Philox; over 200,000 draws the log's
// largest relative error was 2^-52 and cos's absolute 2^-53 against libm's.
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`; integer Philox and uncontracted
// double maps (-ffp-contract=off holds inside the target regions too): the same bits on every path.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include "dew/random.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>

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

// p = (..((c[0] t + c[1]) t + c[2]) ..) t + c[N-1]: the polynomials below, each in this one evaluation order.
template <size_t N>
[[gnu::always_inline]] inline double horner(double t, const std::array<double, N>& c) {
  double p = c[0];
#pragma GCC unroll 32
  for (size_t i = 1; i < N; ++i) p = p * t + c[i];
  return p;
}
// 1/23, 1/21, .., 1/3: atanh(s) = s + s t (1/3 + t (1/5 + ..)), t = s^2
constexpr std::array<double, 11> kAtanhSeries = {1.0 / 23, 1.0 / 21, 1.0 / 19, 1.0 / 17, 1.0 / 15, 1.0 / 13,
                                                 1.0 / 11, 1.0 / 9,  1.0 / 7,  1.0 / 5,  1.0 / 3};
// cos r = 1 - t/2! + t^2/4! - .. - t^9/18! and sin r = r + r t (-1/3! + t/5! - .. + t^8/17!), t = r^2
constexpr std::array<double, 10> kCosSeries = {-1.0 / 6402373705728000.0,
                                               1.0 / 20922789888000.0,
                                               -1.0 / 87178291200.0,
                                               1.0 / 479001600.0,
                                               -1.0 / 3628800.0,
                                               1.0 / 40320.0,
                                               -1.0 / 720.0,
                                               1.0 / 24.0,
                                               -0.5,
                                               1.0};
constexpr std::array<double, 8> kSinSeries = {
    1.0 / 355687428096000.0, -1.0 / 1307674368000.0, 1.0 / 6227020800.0, -1.0 / 39916800.0,
    1.0 / 362880.0,          -1.0 / 5040.0,          1.0 / 120.0,        -1.0 / 6.0};

// log(u) for u in (0, 1] (u1 of a normal draw: a multiple of 2^-32): u = 2^e m, m in [sqrt(1/2), sqrt(2)), log m =
// 2 atanh(s) with s = (m - 1) / (m + 1), |s| <= 0.1716, by its series to s^23 (truncation < 2^-60 relative), and e
// ln 2 in two parts. m - 1 is exact, m + 1 and s round once each (<= 1.5 ulp of s), the Horner sum a few ulp more,
// and e ln 2 + log m cancels at most ~3x (|log m| <= 0.347 < ln 2 / 2): relative error < 2^-49. log 1 = +0, as libm's.
inline double log_unit(double u) {
  const uint64_t bits = std::bit_cast<uint64_t>(u);
  // the biased exponent as a double without an int -> double conversion (u > 0: no sign bit), for the SIMD lanes
  double e = (std::bit_cast<double>(0x4330000000000000ull | (bits >> 52)) - 4503599627370496.0) - 1023.0;
  double m = std::bit_cast<double>((bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull);  // [1, 2)
  const bool big = m > 1.4142135623730951;
  m = big ? m * 0.5 : m;  // exact
  e = big ? e + 1.0 : e;
  const double f = m - 1.0;  // exact (Sterbenz)
  const double s = f / (2.0 + f), t = s * s;
  const double p = horner(t, kAtanhSeries);
  const double log_m = 2.0 * s + 2.0 * s * (t * p);
  constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;  // hi: 32 bits
  return e * kLn2Hi + (log_m + e * kLn2Lo);
}

// cos(x) for x in [0, 2 pi) (the product 2 pi u2 as philox::normal rounds it): x = k pi/2 + r with k = round(x 2/pi)
// <= 4 and r in [-pi/4, pi/4] by a two-part pi/2 (k * hi exact; |error of r| < 2^-54), then cos r or sin r by their
// Taylor series to r^18 / r^17 (truncation < 2^-60), signed by k mod 4: absolute error < 2^-52.
inline double cos_turn(double x) {
  constexpr double kPio2Hi = 1.57079632673412561417e+00, kPio2Lo = 6.07710050650619224932e-11;  // hi: 33 bits
  const double kd = std::floor(x * 0.63661977236758134308 + 0.5);
  const double r = (x - kd * kPio2Hi) - kd * kPio2Lo, t = r * r;
  const double c = horner(t, kCosSeries);
  const double sn0 = horner(t, kSinSeries);
  const double sn = r + r * (t * sn0);
  const double q = kd - 4.0 * std::floor(kd * 0.25);  // k mod 4, in a double (no int conversion in the SIMD lanes)
  const double v = (q == 1.0 || q == 3.0) ? sn : c;
  return (q == 1.0 || q == 2.0) ? -v : v;
}

// The 2 kLanes normal numbers of kLanes Philox blocks (number j from words 2j, 2j + 1, as philox::normal), in f32.
// z = sqrt(-2 log u1) cos(2 pi u2) from log_unit and cos_turn: the log's relative error (< 2^-49) is halved by the
// sqrt, cos's absolute error (< 2^-52) is < 2^-46 relative where |cos| >= 2^-6, and the sqrt and two products round
// once each, so z is within ~2^-45 of libm's double (whose own log and cos are within an ulp). Its f32 rounding is
// therefore libm's wherever z(1 - 2^-36) and z(1 + 2^-36) round to the same float; elsewhere (and for |cos| < 2^-6 or
// z = 0) the element takes philox::normal's expression itself.
inline void normals_of(const Blocks& bl, float* out) {
  constexpr int kN = 2 * kLanes;
  double zs[kN], exact[kN];  // exact: 1 where float(z) is libm's rounding, 0 where to recompute
#pragma omp simd
  for (int j = 0; j < kN; ++j) {
    const double u1 = (double(bl.w[2 * j]) + 1.0) * (1.0 / 4294967296.0);
    const double u2 = double(bl.w[2 * j + 1]) * (1.0 / 4294967296.0);
    const double c = cos_turn(6.283185307179586 * u2);
    const double z = std::sqrt(-2.0 * log_unit(u1)) * c;
    const double lo = double(float(z * (1.0 - 0x1p-36))), hi = double(float(z * (1.0 + 0x1p-36)));
    exact[j] = (lo == hi) & (std::fabs(c) >= 0x1p-6) & (z != 0.0) ? 1.0 : 0.0;
    zs[j] = z;
  }
  for (int j = 0; j < kN; ++j) out[j] = float(zs[j]);
  for (int j = 0; j < kN; ++j)
    if (exact[j] == 0.0) {
      const double u1 = (double(bl.w[2 * j]) + 1.0) * (1.0 / 4294967296.0);
      const double u2 = double(bl.w[2 * j + 1]) * (1.0 / 4294967296.0);
      out[j] = float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
    }
}

// Same for philox::normal: one block per 2 elements, words (2w, 2w+1); kLanes blocks (2 * kLanes numbers) at a time.
template <class F>
inline void normal_range(uint64_t seed, uint64_t stream, uint64_t offset, int64_t i0, int64_t i1, F&& f) {
  Blocks bl;
  float z[2 * kLanes];
  int64_t i = i0;
  while (i < i1) {
    const uint64_t g = offset + uint64_t(i);
    const uint64_t first = g >> 1;
    philox_blocks(seed, stream, first, bl);
    normals_of(bl, z);  // numbers 2 * first .. 2 * (first + kLanes) - 1
    const int64_t j0 = int64_t(g - 2 * first);
    const int64_t count = std::min<int64_t>(2 * kLanes - j0, i1 - i);
    for (int64_t j = 0; j < count; ++j) f(i + j, z[j0 + j]);
    i += count;
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
