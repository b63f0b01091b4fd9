// test_backend_cpu.cpp — the `cpu` backend against the `ref` backend (the oracle) on random inputs.
// One case per kernel family; shapes are chosen to hit both the serial and the OpenMP-parallel paths and
// the special cases (broadcasts, transposes, groups, ignored targets). Random numbers must agree bit for
// bit; everything else within a small multiple of f32 epsilon scaled by the reduction length.
// The exhaustive cross-backend suite is tools/dew-conformance; attention has its own test.
// Run: build/bin/test_backend_cpu
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/ops.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"
#include "dew/tensor.hpp"

using namespace dew;

namespace {

BackendPtr load(const char* name, const char* path) {
  if (!Registry::global().contains(Backend::kind, name)) Registry::global().load(path);
  return create_backend(name);
}
BackendPtr cpu() {
  static BackendPtr b = load("cpu", DEW_CPU_PLUGIN_PATH);
  return b;
}
BackendPtr ref() {
  static BackendPtr b = load("ref", DEW_REF_PLUGIN_PATH);
  return b;
}
// The shared cpu backend's thread count: a kernel call gives its caller the backend's count.
int cpu_threads() {
  Tensor t = Tensor::empty({1}, DType::f32, cpu());
  cpu()->fill(t, 0.0);
  return omp_get_max_threads();
}

// The same values on both backends.
struct Pair {
  Tensor c, r;
};
std::vector<float> host_uniform(int64_t n, uint64_t seed, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = lo + (hi - lo) * philox::uniform(seed, 7, uint64_t(i));
  return v;
}
Pair rnd(const Shape& s, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  const std::vector<float> v = host_uniform(numel_of(s), seed, lo, hi);
  return {Tensor::from_vector(v, s, cpu()), Tensor::from_vector(v, s, ref())};
}
Pair ints(const std::vector<int32_t>& v, const Shape& s) {
  return {Tensor::from_ints(v, s, cpu()), Tensor::from_ints(v, s, ref())};
}
Pair empty(const Shape& s, DType dt = DType::f32) { return {Tensor::empty(s, dt, cpu()), Tensor::empty(s, dt, ref())}; }
Pair zeros(const Shape& s) { return {Tensor::zeros(s, DType::f32, cpu()), Tensor::zeros(s, DType::f32, ref())}; }
Pair clone(const Pair& p) { return {p.c.clone(), p.r.clone()}; }

// The ISA paths of the cpu backend this CPU runs (its `isa` option), "portable" first, then avx2 and avx512 as
// the CPU has them (avx512: the F, VL, DQ and BW subsets isa.hpp asks for).
struct IsaPaths {
  std::vector<std::string> names;
  bool avx2 = false, avx512 = false;
};
IsaPaths cpu_isa_paths() {
  __builtin_cpu_init();
  IsaPaths p;
  p.avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  p.avx512 = p.avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
             __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512bw");
  p.names = {"portable"};
  if (p.avx2) p.names.push_back("avx2");
  if (p.avx512) p.names.push_back("avx512");
  return p;
}

constexpr double kEps = 1.1920928955078125e-07;

// A weight rounded to bf16 (nearest even): its bits, and the same values widened back to f32.
std::pair<std::vector<uint16_t>, std::vector<float>> rounded_to_bf16(const std::vector<float>& w) {
  std::vector<uint16_t> bits(w.size());
  std::vector<float> widened(w.size());
  for (size_t i = 0; i < w.size(); ++i) {
    bits[i] = f32_to_bf16(w[i]).bits;
    widened[i] = bf16_to_f32(f32_to_bf16(w[i]));
  }
  return {bits, widened};
}

// |cpu - ref| <= atol + rtol * |ref| element by element (NaN matches NaN).
void check_close(const Pair& p, double rtol, double atol, const std::string& what) {
  const std::vector<double> got = p.c.to_doubles(), want = p.r.to_doubles();
  REQUIRE(got.size() == want.size());
  int bad = 0;
  if (std::getenv("DEW_TEST_REPORT")) {  // max error in units of atol + rtol|ref|, for tuning tolerances
    double worst = 0, worst_rel = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      if (std::isnan(want[i]) || got[i] == want[i]) continue;
      worst = std::max(worst, std::fabs(got[i] - want[i]) / (atol + rtol * std::fabs(want[i])));
      worst_rel = std::max(worst_rel, std::fabs(got[i] - want[i]) / std::max(std::fabs(want[i]), 1e-30));
    }
    MESSAGE(what << ": worst error / tolerance = " << worst << ", worst relative error / eps = " << worst_rel / kEps);
  }
  for (size_t i = 0; i < got.size() && bad < 5; ++i) {
    const bool ok = (std::isnan(got[i]) && std::isnan(want[i])) || got[i] == want[i] ||
                    std::fabs(got[i] - want[i]) <= atol + rtol * std::fabs(want[i]);
    if (!ok) {
      ++bad;
      FAIL_CHECK(what << " element " << i << ": cpu " << got[i] << " ref " << want[i]);
    }
  }
}
void check_equal(const Pair& p, const std::string& what) { check_close(p, 0.0, 0.0, what); }

MatmulParams matmul_params(int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb, float alpha, float beta,
                           Activation act, bool bcast_a = false, bool bcast_b = false) {
  MatmulParams p;
  p.batch = batch;
  p.m = m;
  p.n = n;
  p.k = k;
  p.trans_a = ta;
  p.trans_b = tb;
  p.alpha = alpha;
  p.beta = beta;
  p.act = act;
  p.a_batch_stride = bcast_a ? 0 : m * k;
  p.b_batch_stride = bcast_b ? 0 : k * n;
  return p;
}
// y's shape for x [N, C, H, W] and w [O, C/g, KH, KW] under p.
Shape conv_output_shape(const Shape& x, const Shape& w, const Conv2dParams& p) {
  const int64_t oh = (x[2] + 2 * p.pad_h - p.dilation_h * (w[2] - 1) - 1) / p.stride_h + 1;
  const int64_t ow = (x[3] + 2 * p.pad_w - p.dilation_w * (w[3] - 1) - 1) / p.stride_w + 1;
  return {x[0], w[0], oh, ow};
}

bool native_bf16();
// matmul_precision = medium: a second cpu backend; it rounds to bf16 on CPUs with AVX512-BF16, whether or not bf16
// pays there (bf16_dot = native: the native paths are tested on every CPU that has them; the auto choice has its
// own test below).
BackendPtr cpu_medium() {
  cpu();  // loads the plugin
  static BackendPtr b =
      create_backend("cpu", native_bf16() ? Options({{"matmul_precision", "medium"}, {"bf16_dot", "native"}}, "test")
                                          : Options({{"matmul_precision", "medium"}}, "test"));
  return b;
}
// a op(B) on the medium backend, into a fresh [m, n] f32 tensor (no bias, p's alpha and beta).
Tensor medium_product(const Tensor& a, const Tensor& b, const MatmulParams& p) {
  Tensor o = Tensor::empty({p.m, p.n}, DType::f32, cpu());
  cpu_medium()->matmul(a, b, Tensor(), o, p);
  return o;
}
// The backend multiplies bf16 natively: the CPU has AVX512-BF16 and oneDNN may use it (ONEDNN_MAX_CPU_ISA, or the
// older DNNL_MAX_CPU_ISA, caps oneDNN's ISA to stand in for an older CPU; the backend follows the cap: entry.cpp).
bool native_bf16() {
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw") ||
      !__builtin_cpu_supports("avx512vl"))
    return false;
  const char* cap = std::getenv("ONEDNN_MAX_CPU_ISA");
  if (cap == nullptr) cap = std::getenv("DNNL_MAX_CPU_ISA");
  if (cap == nullptr) return true;
  const std::string c = cap;  // the caps at or above AVX512_CORE_BF16 in oneDNN's order
  return c == "ALL" || c == "AVX512_CORE_BF16" || c == "AVX512_CORE_FP16" || c == "AVX512_CORE_AMX" ||
         c == "AVX512_CORE_AMX_FP16";
}
// x rounded to the nearest bf16 (ties to even), as vcvtneps2bf16 and oneDNN's reorders do.
float round_to_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }
double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> x = a.to_doubles(), y = b.to_doubles();
  double d = 0;
  for (size_t i = 0; i < x.size(); ++i) d = std::max(d, std::fabs(x[i] - y[i]));
  return d;
}

}  // namespace

TEST_CASE("cpu: identity and supports()") {
  CHECK(cpu()->name() == "cpu");
  CHECK(cpu()->host_accessible());
  CHECK(cpu()->supports(Kernel::matmul, DType::f32).ok);
  CHECK(cpu()->supports(Kernel::cast, DType::bf16).ok);
  CHECK(cpu()->supports(Kernel::matmul, DType::bf16).ok);  // every CPU (widened without AVX512-BF16)
  CHECK(cpu()->supports(Kernel::gather_rows, DType::i32).ok);
  const Support no = cpu()->supports(Kernel::matmul, DType::f64);
  CHECK_FALSE(no.ok);
  CHECK(!no.reason.empty());
}

// OpenMP's team size is a per-thread setting: a kernel called from a thread that never called set_threads
// (a server's model thread, a worker) must still run on the backend's count, not on that thread's own.
TEST_CASE("cpu: a kernel runs on the backend's thread count whichever thread calls it") {
  cpu();  // loads the plugin
  BackendPtr be = create_backend("cpu", Options({{"threads", "1"}}, "test"));
  Tensor t = Tensor::empty({4096}, DType::f32, be);
  std::vector<float> host(4096);
  int after_fill = -1, after_copy = -1;
  std::thread([&] {
    omp_set_num_threads(3);  // this thread's own setting, as a fresh thread's default could be
    be->fill(t, 1.0);
    after_fill = omp_get_max_threads();
    omp_set_num_threads(3);
    be->copy_to_host(host.data(), t.data(), host.size() * sizeof(float));
    after_copy = omp_get_max_threads();
  }).join();
  CHECK(after_fill == 1);
  CHECK(after_copy == 1);
  CHECK(host[4095] == 1.0f);
  be->set_threads(2);  // a later set_threads reaches every thread at its next kernel
  std::thread([&] {
    omp_set_num_threads(1);
    be->fill(t, 2.0);
    after_fill = omp_get_max_threads();
  }).join();
  CHECK(after_fill == 2);
}

TEST_CASE("cpu: matmul (transposes, batch broadcast, bias, alpha/beta, activations)") {
  struct Case {
    int64_t batch, m, n, k;
    bool bcast_a, bcast_b, ta, tb;
    float alpha, beta;
    Activation act;
    bool bias;
  };
  const Case cases[] = {
      {1, 33, 17, 29, false, false, false, false, 1.0f, 0.0f, Activation::none, false},
      {1, 64, 48, 80, false, false, true, false, 1.0f, 0.0f, Activation::none, true},
      {1, 16, 40, 24, false, false, false, true, 0.5f, 0.0f, Activation::relu, true},
      {1, 16, 40, 24, false, false, true, true, 1.0f, 0.75f, Activation::none, false},
      {3, 12, 20, 8, false, false, false, false, 2.0f, 0.0f, Activation::gelu, true},
      {3, 12, 20, 8, true, false, false, true, 1.0f, 0.0f, Activation::gelu_tanh, false},
      {4, 9, 7, 13, false, true, true, false, 1.0f, 1.0f, Activation::none, true},
      {2, 128, 96, 256, false, false, false, true, 1.0f, 0.0f, Activation::silu, true},
  };
  uint64_t seed = 100;
  for (const Case& c : cases) {
    CAPTURE(c.batch);
    CAPTURE(c.m);
    const MatmulParams p =
        matmul_params(c.batch, c.m, c.n, c.k, c.ta, c.tb, c.alpha, c.beta, c.act, c.bcast_a, c.bcast_b);
    Pair a = rnd({c.bcast_a ? 1 : c.batch, c.ta ? c.k : c.m, c.ta ? c.m : c.k}, seed++);
    Pair b = rnd({c.bcast_b ? 1 : c.batch, c.tb ? c.n : c.k, c.tb ? c.k : c.n}, seed++);
    Pair bias = c.bias ? rnd({c.n}, seed++) : Pair{};
    Pair out = rnd({c.batch, c.m, c.n}, seed++);  // beta != 0 reads it
    cpu()->matmul(a.c, b.c, bias.c, out.c, p);
    ref()->matmul(a.r, b.r, bias.r, out.r, p);
    check_close(out, 1e-5, 4 * kEps * double(c.k), "matmul");
  }
}

TEST_CASE("cpu: matmul_precision = medium rounds the operands to bf16 and accumulates in f32") {
  const BackendPtr medium = cpu_medium();
  const bool rounds_to_bf16 = native_bf16();
  struct Case {
    int64_t batch, m, n, k;
    bool ta, tb, bias;
    float alpha, beta;
    Activation act;
  };
  // oneDNN paths (plain, transposed A as in weight gradients, batched, alpha/beta, gelu epilogue, a k that
  // is not a multiple of 32 so the conversion's tail runs), then the row-wise decode path (m <= 32,
  // trans_b, beta 0), which stays f32.
  const Case cases[] = {
      {1, 96, 80, 77, false, true, true, 1.0f, 0.0f, Activation::none},
      {1, 64, 48, 200, true, false, false, 1.0f, 1.0f, Activation::none},
      {3, 40, 24, 33, false, false, true, 0.5f, 0.0f, Activation::gelu},
      {1, 8, 40, 64, false, true, true, 1.0f, 0.0f, Activation::none},
  };
  uint64_t seed = 900;
  for (const Case& c : cases) {
    CAPTURE(c.m);
    const bool rowwise = c.batch == 1 && c.m <= 32 && c.tb && !c.ta && c.beta == 0.0f;
    const MatmulParams p = matmul_params(c.batch, c.m, c.n, c.k, c.ta, c.tb, c.alpha, c.beta, c.act);
    const Shape a_shape{c.batch, c.ta ? c.k : c.m, c.ta ? c.m : c.k},
        b_shape{c.batch, c.tb ? c.n : c.k, c.tb ? c.k : c.n};
    const std::vector<float> a = host_uniform(numel_of(a_shape), seed++, -1.0f, 1.0f);
    const std::vector<float> b = host_uniform(numel_of(b_shape), seed++, -1.0f, 1.0f);
    const std::vector<float> bias = host_uniform(c.n, seed++, -1.0f, 1.0f);
    const std::vector<float> out0 = host_uniform(c.batch * c.m * c.n, seed++, -1.0f, 1.0f);
    const bool rounds = rounds_to_bf16 && !rowwise;
    std::vector<float> a_used = a, b_used = b;
    if (rounds)
      for (auto* v : {&a_used, &b_used})
        for (float& x : *v) x = round_to_bf16(x);
    // medium on cpu, f32 (highest) on cpu, and ref on the operands medium is expected to use
    Tensor bias_c = c.bias ? Tensor::from_vector(bias, {c.n}, cpu()) : Tensor();
    Tensor got = Tensor::from_vector(out0, {c.batch, c.m, c.n}, cpu());
    medium->matmul(Tensor::from_vector(a, a_shape, cpu()), Tensor::from_vector(b, b_shape, cpu()), bias_c, got, p);
    Tensor f32 = Tensor::from_vector(out0, {c.batch, c.m, c.n}, cpu());
    cpu()->matmul(Tensor::from_vector(a, a_shape, cpu()), Tensor::from_vector(b, b_shape, cpu()), bias_c, f32, p);
    Tensor want = Tensor::from_vector(out0, {c.batch, c.m, c.n}, ref());
    ref()->matmul(Tensor::from_vector(a_used, a_shape, ref()), Tensor::from_vector(b_used, b_shape, ref()),
                  c.bias ? Tensor::from_vector(bias, {c.n}, ref()) : Tensor(), want, p);
    check_close({got, want}, 1e-5, 4 * kEps * double(c.k), "medium matmul vs ref on bf16-rounded operands");
    // Rounding the operands moves results by ~2^-9 relative: far outside f32 matmul's tolerance.
    const double max_diff = max_abs_diff(got, f32);
    if (rounds)
      CHECK(max_diff > 1e-3);
    else
      CHECK(max_diff == 0.0);  // f32 (no native bf16, or the row-wise path): the f32 result bit for bit
  }
  CHECK_THROWS_AS(create_backend("cpu", Options({{"matmul_precision", "fast"}}, "test")), Error);
}

// Option bf16_dot: which bf16 work runs natively. widened: matmul_precision = medium multiplies in f32, bit for bit the
// highest product, and a bf16 product is the f32 product of its exact widening, rounded once; native: medium rounds
// its operands (on a CPU with AVX512-BF16; refused elsewhere); auto: one of the two, as the plugin's description
// says (bf16_dot.cpp measures vdpbf16ps against the f32 FMA: 0.49x on Emerald Rapids without AMX, ~2x on Zen 5).
TEST_CASE("cpu: bf16_dot decides whether bf16 products run natively or widened to f32") {
  cpu();
  const BackendPtr widened =
      create_backend("cpu", Options({{"matmul_precision", "medium"}, {"bf16_dot", "widened"}}, "test"));
  const BackendPtr automatic = create_backend("cpu", Options({{"matmul_precision", "medium"}}, "test"));
  const int64_t m = 96, n = 80, k = 77;
  const MatmulParams p = matmul_params(1, m, n, k, false, true, 1.0f, 0.0f, Activation::none);
  const std::vector<float> a = host_uniform(m * k, 950, -1.0f, 1.0f), b = host_uniform(n * k, 951, -1.0f, 1.0f);
  const Tensor ta = Tensor::from_vector(a, {1, m, k}, cpu()), tb = Tensor::from_vector(b, {1, n, k}, cpu());
  const auto product = [&](const BackendPtr& be, const Tensor& x, const Tensor& y, DType out_dtype) {
    Tensor o = Tensor::empty({1, m, n}, out_dtype, cpu());
    be->matmul(x, y, Tensor(), o, p);
    return o;
  };
  const Tensor f32 = product(cpu(), ta, tb, DType::f32);
  CHECK(max_abs_diff(product(widened, ta, tb, DType::f32), f32) == 0.0);  // medium stays f32, bit for bit
  // A bf16 product, widened: the f32 product of the widened operands, rounded once.
  const Tensor ha = cast(ta, DType::bf16), hb = cast(tb, DType::bf16);
  const Tensor of_widened = cast(product(cpu(), cast(ha, DType::f32), cast(hb, DType::f32), DType::f32), DType::bf16);
  CHECK(max_abs_diff(product(widened, ha, hb, DType::bf16), of_widened) == 0.0);
  const std::string& about = Registry::global().find("backend", "cpu").description;
  const bool told =
      about.find("vdpbf16ps at") != std::string::npos || about.find("no AVX512-BF16") != std::string::npos;
  CHECK(told);  // the measured rate, or why none was measured
  const bool auto_native = about.find("bf16 products native") != std::string::npos;
  const double auto_vs_f32 = max_abs_diff(product(automatic, ta, tb, DType::f32), f32);
  if (auto_native)
    CHECK(auto_vs_f32 > 1e-3);
  else
    CHECK(auto_vs_f32 == 0.0);
  if (native_bf16()) {
    const Tensor rounded = product(cpu_medium(), ta, tb, DType::f32);
    CHECK(max_abs_diff(rounded, f32) > 1e-3);  // native: the operands were rounded
    if (auto_native) CHECK(max_abs_diff(product(automatic, ta, tb, DType::f32), rounded) == 0.0);
  } else {
    CHECK_FALSE(auto_native);
    CHECK_THROWS_AS(create_backend("cpu", Options({{"bf16_dot", "native"}}, "test")), Error);
  }
  CHECK_THROWS_AS(create_backend("cpu", Options({{"bf16_dot", "sometimes"}}, "test")), Error);
}

TEST_CASE("cpu: the widened product (bf16 operands, f32 out) is the f32 product of the widened operands, unrounded") {
  // A weight gradient's shape (A transposed) and an input gradient's, with beta; on the widened path (bf16_dot =
  // widened: the operands widened around the f32 kernel) bit for bit the f32 product of the widened operands, on the
  // native one (oneDNN's bf16 primitive with an f32 destination, where vdpbf16ps pays) within f32 rounding of it; on
  // both, values no bf16 holds (a product rounded to bf16 first would be all bf16 values). A bias or an activation,
  // which the widened form does not take, is refused.
  cpu();
  const BackendPtr widened = create_backend("cpu", Options({{"bf16_dot", "widened"}}, "test"));
  struct Shape3 {
    int64_t m, n, k;
    bool ta;
    float beta;
  };
  for (const Shape3& c : {Shape3{96, 80, 300, true, 0.0f}, Shape3{128, 72, 96, false, 1.0f}}) {
    CAPTURE(c.m);
    const MatmulParams p = matmul_params(1, c.m, c.n, c.k, c.ta, false, 1.0f, c.beta, Activation::none);
    const Tensor ha =
        cast(Tensor::from_vector(host_uniform(c.m * c.k, 960, -1.0f, 1.0f), {c.m * c.k}, cpu()), DType::bf16);
    const Tensor hb =
        cast(Tensor::from_vector(host_uniform(c.k * c.n, 961, -1.0f, 1.0f), {c.k * c.n}, cpu()), DType::bf16);
    const Tensor prior = Tensor::from_vector(host_uniform(c.m * c.n, 962, -1.0f, 1.0f), {c.m * c.n}, cpu());
    const auto product = [&](const BackendPtr& be, const Tensor& x, const Tensor& y) {
      Tensor o = contiguous_copy(prior);
      be->matmul(x, y, Tensor(), o, p);
      return o;
    };
    const Tensor f32 = product(cpu(), cast(ha, DType::f32), cast(hb, DType::f32));
    const auto not_bf16 = [](const Tensor& t) {  // values whose low 16 bits are not all zero
      int n = 0;
      for (double v : t.to_doubles()) {
        const float f = float(v);
        uint32_t bits;
        std::memcpy(&bits, &f, sizeof bits);
        n += (bits & 0xFFFFu) != 0;
      }
      return n;
    };
    const Tensor w = product(widened, ha, hb);
    CHECK(max_abs_diff(w, f32) == 0.0);
    CHECK(not_bf16(w) > int(c.m * c.n) / 2);
    const Tensor native = product(cpu(), ha, hb);
    CHECK(max_abs_diff(native, f32) <= 1e-5 * double(c.k));
    CHECK(not_bf16(native) > int(c.m * c.n) / 2);
    Tensor out = Tensor::empty({c.m * c.n}, DType::f32, cpu());
    const Tensor bias = cast(Tensor::full({c.n}, 1.0, DType::f32, cpu()), DType::bf16);
    CHECK_THROWS_AS(cpu()->matmul(ha, hb, bias, out, p), Error);
    MatmulParams with_act = matmul_params(1, c.m, c.n, c.k, c.ta, false, 1.0f, 0.0f, Activation::relu);
    CHECK_THROWS_AS(cpu()->matmul(ha, hb, Tensor(), out, with_act), Error);
  }
}

// matmul.cpp's split rule: at 2+ threads an f32 weight gradient's product (A transposed, m <= 512, k >= 1024) and a
// large bf16-operand product, and an f32 product of A's rows with 512+ rows, m >= n and at most 2^28 multiply-adds, run
// as one single-thread oneDNN primitive per thread over a block of C's rows (m >= n) or columns. Cases: rows split
// unevenly (200 = 112 + 88) with a bias; columns (n = 300 > m) with B transposed, alpha (the bias as a post-op) and
// beta; an activation; three threads (400 = 144 + 144 + 112); forward products (A not transposed, rows split: 600 =
// 304 + 296 with B transposed and GELU, 1024 = 512 + 512 over a plain B with beta). f32, the bf16 kernel (half.cpp) and
// matmul_precision = medium, which build their primitives through the same rule; each against ref, and against the same
// backend at one thread (no split) and with matmul_split = off at the same threads (oneDNN's own split), within the
// product's tolerance.
TEST_CASE("cpu: products split over the threads (matmul_split) equal the unsplit products") {
  cpu();
  const BackendPtr off = create_backend("cpu", Options({{"matmul_split", "off"}}, "test"));
  const BackendPtr medium = cpu_medium();
  struct Case {
    int64_t m, n, k;
    bool ta, tb, bias;
    float alpha, beta;
    Activation act;
    int threads;
  };
  const Case cases[] = {
      {200, 72, 1100, true, false, true, 1.0f, 0.0f, Activation::none, 2},
      {64, 300, 1024, true, true, true, 0.5f, 0.75f, Activation::none, 2},
      {130, 130, 1030, true, false, false, 1.0f, 0.0f, Activation::relu, 2},
      {400, 40, 1024, true, false, true, 1.0f, 1.0f, Activation::none, 3},
      {600, 200, 256, false, true, true, 1.0f, 0.0f, Activation::gelu_tanh, 2},
      {1024, 96, 160, false, false, false, 1.0f, 1.0f, Activation::none, 2},
  };
  const int saved = omp_get_max_threads();
  uint64_t seed = 1300;
  for (const Case& c : cases) {
    CAPTURE(c.m);
    CAPTURE(c.n);
    const MatmulParams p = matmul_params(1, c.m, c.n, c.k, c.ta, c.tb, c.alpha, c.beta, c.act);
    Pair a = rnd({1, c.ta ? c.k : c.m, c.ta ? c.m : c.k}, seed++);
    Pair b = rnd({1, c.tb ? c.n : c.k, c.tb ? c.k : c.n}, seed++);
    Pair bias = c.bias ? rnd({c.n}, seed++) : Pair{};
    const Pair out0 = rnd({1, c.m, c.n}, seed++);  // beta != 0 reads it
    // f32: split (c.threads), unsplit (1 thread), oneDNN's split (matmul_split = off), ref
    auto as = [](const Tensor& t, DType dt) {  // t in dtype dt (a cpu cast; the same tensor when it already is)
      if (!t.defined() || t.dtype() == dt) return t;
      Tensor out = Tensor::empty(t.shape(), dt, cpu());
      cpu()->cast(t, out);
      return out;
    };
    auto run = [&](const BackendPtr& be, int threads, const Tensor& x, const Tensor& w, const Tensor& bb) {
      be->set_threads(threads);
      Tensor out = x.dtype() == DType::f32 ? out0.c.clone() : as(out0.c, x.dtype());
      be->matmul(x, w, as(bb, x.dtype()), out, p);
      be->set_threads(saved);
      return out;
    };
    const Tensor split = run(cpu(), c.threads, a.c, b.c, bias.c);
    const Tensor whole = run(cpu(), 1, a.c, b.c, bias.c);
    const Tensor onednn = run(off, c.threads, a.c, b.c, bias.c);
    Tensor want = out0.r.clone();
    ref()->matmul(a.r, b.r, bias.r, want, p);
    const double tol = 4 * kEps * double(c.k);
    check_close({split, want}, 1e-5, tol, "split vs ref");
    check_close({split, whole}, 1e-5, tol, "split vs one thread");
    check_close({split, onednn}, 1e-5, tol, "split vs oneDNN's own split");
    // bf16 operands and output (half.cpp): split against one thread, within a few bf16 roundings of the output
    const Tensor a16 = as(a.c, DType::bf16), b16 = as(b.c, DType::bf16);
    const Tensor s16 = run(cpu(), c.threads, a16, b16, bias.c), w16 = run(cpu(), 1, a16, b16, bias.c);
    check_close({as(s16, DType::f32), as(w16, DType::f32)}, 1.0 / 64, tol, "bf16 split vs one thread");
    // matmul_precision = medium: f32 in and out, bf16 operands
    const Tensor sm = run(medium, c.threads, a.c, b.c, bias.c), wm = run(medium, 1, a.c, b.c, bias.c);
    check_close({sm, wm}, 1e-5, tol, "medium split vs one thread");
  }
  CHECK_THROWS_AS(create_backend("cpu", Options({{"matmul_split", "sometimes"}}, "test")), Error);
}

TEST_CASE("cpu: unary and unary_backward, every op") {
  const UnaryOp ops[] = {UnaryOp::neg,        UnaryOp::exp,       UnaryOp::log,  UnaryOp::sqrt,    UnaryOp::rsqrt,
                         UnaryOp::square,     UnaryOp::abs,       UnaryOp::tanh, UnaryOp::sigmoid, UnaryOp::relu,
                         UnaryOp::gelu,       UnaryOp::gelu_tanh, UnaryOp::silu, UnaryOp::sin,     UnaryOp::cos,
                         UnaryOp::reciprocal, UnaryOp::affine,    UnaryOp::pow,  UnaryOp::clamp,   UnaryOp::softcap};
  for (int64_t n : {37, 40000}) {
    for (UnaryOp op : ops) {
      CAPTURE(int(op));
      CAPTURE(n);
      const bool positive = op == UnaryOp::log || op == UnaryOp::sqrt || op == UnaryOp::rsqrt || op == UnaryOp::pow;
      Pair x = positive ? rnd({n}, 11, 0.05f, 4.0f) : rnd({n}, 11, -6.0f, 6.0f);
      Pair dy = rnd({n}, 12);
      UnaryParams p{op, 1.0f, 0.0f};
      if (op == UnaryOp::affine) p = {op, 1.5f, -0.25f};
      if (op == UnaryOp::pow) p = {op, 1.7f, 0.0f};
      if (op == UnaryOp::clamp) p = {op, -0.5f, 2.0f};
      if (op == UnaryOp::softcap) p = {op, 3.0f, 0.0f};
      Pair y = empty({n}), dx = empty({n});
      cpu()->unary(x.c, y.c, p);
      ref()->unary(x.r, y.r, p);
      check_close(y, 8 * kEps, 8 * kEps, "unary");
      cpu()->unary_backward(x.c, dy.c, dx.c, p);
      ref()->unary_backward(x.r, dy.r, dx.r, p);
      check_close(dx, 16 * kEps, 16 * kEps, "unary_backward");
    }
  }
  // In place: out aliases x.
  Pair x = rnd({1000}, 13);
  Pair want = empty({1000});
  ref()->unary(x.r, want.r, {UnaryOp::silu, 1.0f, 0.0f});
  cpu()->unary(x.c, x.c, {UnaryOp::silu, 1.0f, 0.0f});
  check_close({x.c, want.r}, 8 * kEps, 8 * kEps, "unary in place");
}

TEST_CASE(
    "cpu: unary_backward_sum equals unary_backward then reduce bit for bit in f32 and bf16, and ref within tolerance") {
  // 1024 x 1024 (the DiT's fc1: the threaded row split when the team has several threads), 5 x 33 (odd).
  for (const Shape& sh : {Shape{1024, 1024}, Shape{5, 33}}) {
    for (UnaryOp op : {UnaryOp::gelu_tanh, UnaryOp::silu, UnaryOp::gelu}) {
      CAPTURE(int(op));
      CAPTURE(sh[0]);
      const int64_t rows = sh[0], d = sh[1];
      const UnaryParams p{op, 1.0f, 0.0f};
      Pair x = rnd(sh, 30, -4.0f, 4.0f), dy = rnd(sh, 31);
      Pair dx = empty(sh), ds = empty({d});
      cpu()->unary_backward_sum(x.c, dy.c, dx.c, ds.c, p);
      ref()->unary_backward_sum(x.r, dy.r, dx.r, ds.r, p);
      check_close(dx, 16 * kEps, 16 * kEps, "unary_backward_sum dx against ref");
      check_close(ds, 16 * kEps, 16 * kEps, "unary_backward_sum dsum against ref");
      Tensor want_dx = Tensor::empty(sh, DType::f32, cpu()), want_ds = Tensor::empty({d}, DType::f32, cpu());
      cpu()->unary_backward(x.c, dy.c, want_dx, p);
      ReduceParams rp;
      rp.op = ReduceOp::sum;
      rp.outer = 1;
      rp.reduce = rows;
      rp.inner = d;
      cpu()->reduce(want_dx, want_ds, rp);
      check_equal({dx.c, want_dx}, "dx against unary_backward");
      check_equal({ds.c, want_ds}, "dsum against reduce");
      // bf16 storage (a bf16-mixed MLP): dx as unary_backward stores it, dsum the sums of those stored values, as
      // reduce gives them (unary_backward's bf16 against ref: the bf16 storage test below). A kernel that summed the
      // unrounded f32 values, or rounded the sum differently, misses these bits.
      const Tensor xb = cast(x.c, DType::bf16), dyb = cast(dy.c, DType::bf16);
      Tensor dxb = Tensor::empty(sh, DType::bf16, cpu()), dsb = Tensor::empty({d}, DType::bf16, cpu());
      cpu()->unary_backward_sum(xb, dyb, dxb, dsb, p);
      Tensor want_dxb = Tensor::empty(sh, DType::bf16, cpu()), want_dsb = Tensor::empty({d}, DType::bf16, cpu());
      cpu()->unary_backward(xb, dyb, want_dxb, p);
      cpu()->reduce(want_dxb, want_dsb, rp);
      check_equal({dxb, want_dxb}, "bf16 dx against unary_backward");
      check_equal({dsb, want_dsb}, "bf16 dsum against reduce");
    }
  }
}

TEST_CASE("cpu: gated_residual equals the unfused ops bit for bit in f32, and ref within tolerance") {
  // [rows, D] in G groups: the DiT's 16 x 64 x 256 (split over the team when it has several threads), and an odd
  // shape with groups of 5 rows.
  struct S {
    int64_t groups, per, d;
  };
  for (const S& sh : {S{16, 64, 256}, S{3, 5, 37}}) {
    const int64_t b = sh.groups, n = sh.per, d = sh.d;
    CAPTURE(d);
    Pair x = rnd({b, n, d}, 20, -2.0f, 2.0f), f = rnd({b, n, d}, 21, -2.0f, 2.0f), g = rnd({b, d}, 22),
         dy = rnd({b, n, d}, 23);
    Pair y = empty({b, n, d}), df = empty({b, n, d}), dg = empty({b, d});
    cpu()->gated_residual(x.c, f.c, g.c, y.c);
    ref()->gated_residual(x.r, f.r, g.r, y.r);
    check_equal(y, "gated_residual against ref");
    cpu()->gated_residual_backward(f.c, g.c, dy.c, df.c, dg.c);
    ref()->gated_residual_backward(f.r, g.r, dy.r, df.r, dg.r);
    check_equal(df, "gated_residual_backward df against ref");
    check_close(dg, 4 * kEps, 4 * kEps, "gated_residual_backward dgate against ref");
    // The unfused ops as the DiT made them: t = f * gate (broadcast), y = x + t; df = dy * gate, dgate = the sum
    // over each sample's rows of dy * f (reduce [B, N, D] over N).
    const Tensor gb = g.c.reshape({b, 1, d});
    Tensor t = Tensor::empty({b, n, d}, DType::f32, cpu()), want = Tensor::empty({b, n, d}, DType::f32, cpu());
    cpu()->binary(f.c, gb, t, BinaryOp::mul);
    cpu()->binary(x.c, t, want, BinaryOp::add);
    check_equal({y.c, want}, "fused forward against mul then add");
    Tensor want_df = Tensor::empty({b, n, d}, DType::f32, cpu()), p = Tensor::empty({b, n, d}, DType::f32, cpu());
    Tensor want_dg = Tensor::empty({b, d}, DType::f32, cpu());
    cpu()->binary(dy.c, gb, want_df, BinaryOp::mul);
    cpu()->binary(dy.c, f.c, p, BinaryOp::mul);
    ReduceParams rp;
    rp.op = ReduceOp::sum;
    rp.outer = b;
    rp.reduce = n;
    rp.inner = d;
    cpu()->reduce(p, want_dg, rp);
    check_equal({df.c, want_df}, "fused df against mul");
    check_equal({dg.c, want_dg}, "fused dgate against mul then reduce");
    // In place: y over x, then over f.
    Tensor xi = x.c.clone(), fi = f.c.clone();
    cpu()->gated_residual(xi, f.c, g.c, xi);
    cpu()->gated_residual(x.c, fi, g.c, fi);
    check_equal({xi, want}, "in place over x");
    check_equal({fi, want}, "in place over f");
  }
  Pair f = rnd({4, 8}, 24), g = rnd({3, 8}, 25), y = empty({4, 8});
  CHECK_THROWS_WITH_AS(cpu()->gated_residual(f.c, f.c, g.c, y.c), doctest::Contains("G dividing the 4 rows"),
                       dew::Error);
}

TEST_CASE("cpu: gated_activation equals the unfused ops bit for bit in f32, and ref within tolerance") {
  const Activation acts[] = {Activation::none, Activation::relu, Activation::gelu, Activation::gelu_tanh,
                             Activation::silu};
  const auto unary_of = [](Activation a) {
    return a == Activation::relu        ? UnaryOp::relu
           : a == Activation::gelu      ? UnaryOp::gelu
           : a == Activation::gelu_tanh ? UnaryOp::gelu_tanh
                                        : UnaryOp::silu;
  };
  for (int64_t n : {37, 300000}) {  // serial, and split over the team
    for (Activation act : acts) {
      CAPTURE(int(act));
      CAPTURE(n);
      Pair g = rnd({n}, 14, -6.0f, 6.0f), u = rnd({n}, 15, -2.0f, 2.0f), dy = rnd({n}, 16);
      Pair out = empty({n}), dg = empty({n}), du = empty({n});
      cpu()->gated_activation(g.c, u.c, out.c, act);
      ref()->gated_activation(g.r, u.r, out.r, act);
      check_close(out, 8 * kEps, 8 * kEps, "gated_activation");
      cpu()->gated_activation_backward(g.c, u.c, dy.c, dg.c, du.c, act);
      ref()->gated_activation_backward(g.r, u.r, dy.r, dg.r, du.r, act);
      check_close(dg, 16 * kEps, 16 * kEps, "gated_activation_backward dgate");
      check_close(du, 16 * kEps, 16 * kEps, "gated_activation_backward dup");
      // The unfused ops: a = act(g), out = a * u; backward da = dy * u, dg = da * act'(g), du = dy * a.
      Tensor a = g.c.clone(), want = Tensor::empty({n}, DType::f32, cpu());
      if (act != Activation::none) cpu()->unary(g.c, a, UnaryParams{unary_of(act), 1.0f, 0.0f});
      cpu()->binary(a, u.c, want, BinaryOp::mul);
      check_equal({out.c, want}, "fused forward against unary then mul");
      Tensor da = Tensor::empty({n}, DType::f32, cpu()), want_dg = Tensor::empty({n}, DType::f32, cpu());
      Tensor want_du = Tensor::empty({n}, DType::f32, cpu());
      cpu()->binary(dy.c, u.c, da, BinaryOp::mul);
      if (act != Activation::none)
        cpu()->unary_backward(g.c, da, want_dg, UnaryParams{unary_of(act), 1.0f, 0.0f});
      else
        want_dg = da;
      cpu()->binary(dy.c, a, want_du, BinaryOp::mul);
      check_equal({dg.c, want_dg}, "fused dgate against mul's backward then unary_backward");
      check_equal({du.c, want_du}, "fused dup against mul's backward");
    }
  }
  // In place (the bf16 path relies on it): dgate over gate, dup over up.
  Pair g = rnd({1000}, 17, -4.0f, 4.0f), u = rnd({1000}, 18), dy = rnd({1000}, 19);
  Pair dg = empty({1000}), du = empty({1000});
  ref()->gated_activation_backward(g.r, u.r, dy.r, dg.r, du.r, Activation::silu);
  cpu()->gated_activation_backward(g.c, u.c, dy.c, g.c, u.c, Activation::silu);
  check_close({g.c, dg.r}, 16 * kEps, 16 * kEps, "dgate in place");
  check_close({u.c, du.r}, 16 * kEps, 16 * kEps, "dup in place");
  Pair mismatch = empty({999});
  CHECK_THROWS_WITH(cpu()->gated_activation(g.c, mismatch.c, u.c, Activation::silu), doctest::Contains("differ in size"));
}

TEST_CASE("cpu: activations stay finite and match ref far into their tails") {
  // Pre-activations of -10 and below were enough for an overflowing exp to turn the GELU-tanh backward
  // into inf * 0 = NaN (seen as a skipped update in a diffusion run); SiLU from -89.
  for (UnaryOp op : {UnaryOp::gelu_tanh, UnaryOp::silu, UnaryOp::gelu, UnaryOp::sigmoid, UnaryOp::tanh}) {
    CAPTURE(int(op));
    const int64_t n = 4096;
    Pair x = rnd({n}, 21, -200.0f, 200.0f), dy = rnd({n}, 22);
    const UnaryParams p{op, 1.0f, 0.0f};
    Pair y = empty({n}), dx = empty({n});
    cpu()->unary(x.c, y.c, p);
    ref()->unary(x.r, y.r, p);
    cpu()->unary_backward(x.c, dy.c, dx.c, p);
    ref()->unary_backward(x.r, dy.r, dx.r, p);
    for (const Tensor& t : {y.c, dx.c})
      for (float v : t.to_floats()) REQUIRE(std::isfinite(v));
    check_close(y, 8 * kEps, 8 * kEps, "unary (tails)");
    check_close(dx, 16 * kEps, 16 * kEps, "unary_backward (tails)");
  }
}

TEST_CASE("cpu: binary with broadcasting, every op") {
  const BinaryOp ops[] = {BinaryOp::add,     BinaryOp::sub, BinaryOp::mul, BinaryOp::div, BinaryOp::maximum,
                          BinaryOp::minimum, BinaryOp::eq,  BinaryOp::gt,  BinaryOp::lt};
  struct Shapes {
    Shape a, b, out;
  };
  const Shapes shapes[] = {
      {{64, 300}, {64, 300}, {64, 300}},
      {{64, 300}, {300}, {64, 300}},
      {{300}, {64, 300}, {64, 300}},
      {{5, 7}, {1}, {5, 7}},
      {{1}, {5, 7}, {5, 7}},
      {{2, 1, 4}, {3, 1}, {2, 3, 4}},
      {{4, 1, 6, 1}, {1, 5, 1, 3}, {4, 5, 6, 3}},
      {{8, 3, 200}, {8, 1, 200}, {8, 3, 200}},
      {{16, 30, 1, 50}, {30, 40, 1}, {16, 30, 40, 50}},
  };
  uint64_t seed = 200;
  for (const Shapes& s : shapes) {
    Pair a = rnd(s.a, seed++), b = rnd(s.b, seed++);
    for (BinaryOp op : ops) {
      CAPTURE(int(op));
      CAPTURE(shape_str(s.out));
      Pair out = empty(s.out);
      cpu()->binary(a.c, b.c, out.c, op);
      ref()->binary(a.r, b.r, out.r, op);
      check_close(out, kEps, 0.0, "binary");
    }
  }
}

TEST_CASE("cpu: reduce [outer, reduce, inner], every op, serial and split paths") {
  const ReduceOp ops[] = {ReduceOp::sum, ReduceOp::mean, ReduceOp::max, ReduceOp::min, ReduceOp::sumsq};
  // {1, 40, 1000}, {1, 30, 9000}, {1, 1001, 37}: one outer row (a bias gradient), split by rows on several
  // threads (uneven blocks in the last); {1, 5, 5000}: too few rows for that, column blocks; {1, 20, 70000}:
  // too wide for the row split's partials, column blocks wider than one (8192).
  const int64_t dims[][3] = {{7, 33, 1},     {3, 50, 17},   {1, 100000, 1}, {2, 40, 700},  {64, 512, 1},
                             {1, 40, 1000},  {1, 30, 9000}, {1, 1001, 37},  {1, 5, 5000}, {1, 20, 70000}};
  const int saved = cpu_threads();
  for (int threads : {1, 2, 3}) {
    cpu()->set_threads(threads);
    uint64_t seed = 300;
    for (const auto& d : dims) {
      Pair x = rnd({d[0], d[1], d[2]}, seed++);
      for (ReduceOp op : ops) {
        CAPTURE(threads);
        CAPTURE(int(op));
        CAPTURE(d[1]);
        CAPTURE(d[2]);
        Pair out = empty({d[0], d[2]});
        cpu()->reduce(x.c, out.c, {op, d[0], d[1], d[2]});
        ref()->reduce(x.r, out.r, {op, d[0], d[1], d[2]});
        check_close(out, 4 * kEps, 4 * kEps, "reduce");
      }
    }
  }
  cpu()->set_threads(saved);
  Pair x = rnd({6, 50}, 301);
  Pair am = empty({6}, DType::i32);
  cpu()->argmax(x.c, am.c);
  ref()->argmax(x.r, am.r);
  check_equal(am, "argmax");
}

TEST_CASE("cpu: softmax and log_softmax, forward and backward") {
  for (bool log : {false, true}) {
    Pair x = rnd({37, 129}, 400, -5.0f, 5.0f), dy = rnd({37, 129}, 401);
    Pair y = empty({37, 129}), dx = empty({37, 129});
    if (log) {
      cpu()->log_softmax(x.c, y.c);
      ref()->log_softmax(x.r, y.r);
    } else {
      cpu()->softmax(x.c, y.c);
      ref()->softmax(x.r, y.r);
    }
    check_close(y, 16 * kEps, 16 * kEps, log ? "log_softmax" : "softmax");
    if (log) {
      cpu()->log_softmax_backward(y.r.to(cpu()), dy.c, dx.c);
      ref()->log_softmax_backward(y.r, dy.r, dx.r);
    } else {
      cpu()->softmax_backward(y.r.to(cpu()), dy.c, dx.c);
      ref()->softmax_backward(y.r, dy.r, dx.r);
    }
    check_close(dx, 64 * kEps, 64 * kEps, "softmax backward");
  }
}

TEST_CASE("cpu: layer_norm, rms_norm, group_norm, forward and backward") {
  const int64_t rows = 200, d = 96;  // 19200 elements: the OpenMP paths run
  Pair x = rnd({rows, d}, 500, -2.0f, 3.0f), dy = rnd({rows, d}, 501), w = rnd({d}, 502, 0.5f, 1.5f), b = rnd({d}, 503);
  for (int variant = 0; variant < 4; ++variant) {  // weight+bias, weight only, neither, bias only
    CAPTURE(variant);
    const bool has_w = variant < 2, has_b = variant == 0 || variant == 3;
    const Pair wv = has_w ? w : Pair{}, bv = has_b ? b : Pair{};
    Pair y = empty({rows, d}), mean = empty({rows}), rstd = empty({rows});
    cpu()->layer_norm(x.c, wv.c, bv.c, y.c, mean.c, rstd.c, 1e-5f);
    ref()->layer_norm(x.r, wv.r, bv.r, y.r, mean.r, rstd.r, 1e-5f);
    check_close(y, 64 * kEps, 64 * kEps, "layer_norm y");
    check_close(mean, 16 * kEps, 16 * kEps, "layer_norm mean");
    check_close(rstd, 16 * kEps, 0.0, "layer_norm rstd");
    Pair dx = empty({rows, d}), dw = has_w ? empty({d}) : Pair{}, db = has_b ? empty({d}) : Pair{};
    cpu()->layer_norm_backward(x.c, wv.c, mean.r.to(cpu()), rstd.r.to(cpu()), dy.c, dx.c, dw.c, db.c);
    ref()->layer_norm_backward(x.r, wv.r, mean.r, rstd.r, dy.r, dx.r, dw.r, db.r);
    check_close(dx, 1e-4, 1e-5, "layer_norm dx");
    if (has_w) check_close(dw, 1e-4, 1e-5, "layer_norm dweight");
    if (has_b) check_close(db, 1e-5, 1e-5, "layer_norm dbias");
  }
  for (float offset : {0.0f, 1.0f}) {
    Pair y = empty({rows, d}), rstd = empty({rows}), dx = empty({rows, d}), dw = empty({d});
    cpu()->rms_norm(x.c, w.c, y.c, rstd.c, 1e-6f, offset);
    ref()->rms_norm(x.r, w.r, y.r, rstd.r, 1e-6f, offset);
    check_close(y, 16 * kEps, 16 * kEps, "rms_norm y");
    check_close(rstd, 8 * kEps, 0.0, "rms_norm rstd");
    cpu()->rms_norm_backward(x.c, w.c, rstd.r.to(cpu()), dy.c, dx.c, dw.c, offset, false);
    ref()->rms_norm_backward(x.r, w.r, rstd.r, dy.r, dx.r, dw.r, offset, false);
    check_close(dx, 1e-5, 1e-5, "rms_norm dx");
    check_close(dw, 1e-5, 1e-5, "rms_norm dweight");
  }
  {
    const Shape s = {4, 12, 20, 20};
    const int64_t groups = 4;
    Pair gx = rnd(s, 510, -1.0f, 2.0f), gdy = rnd(s, 511), gw = rnd({12}, 512), gb = rnd({12}, 513);
    Pair y = empty(s), mean = empty({4, groups}), rstd = empty({4, groups});
    cpu()->group_norm(gx.c, gw.c, gb.c, y.c, mean.c, rstd.c, groups, 1e-5f);
    ref()->group_norm(gx.r, gw.r, gb.r, y.r, mean.r, rstd.r, groups, 1e-5f);
    check_close(y, 16 * kEps, 16 * kEps, "group_norm y");
    check_close(rstd, 8 * kEps, 0.0, "group_norm rstd");
    Pair dx = empty(s), dw = empty({12}), db = empty({12});
    cpu()->group_norm_backward(gx.c, gw.c, mean.r.to(cpu()), rstd.r.to(cpu()), gdy.c, dx.c, dw.c, db.c, groups);
    ref()->group_norm_backward(gx.r, gw.r, mean.r, rstd.r, gdy.r, dx.r, dw.r, db.r, groups);
    check_close(dx, 1e-5, 1e-5, "group_norm dx");
    check_close(dw, 1e-5, 1e-5, "group_norm dweight");
    check_close(db, 1e-5, 1e-5, "group_norm dbias");
  }
}

// What dew::rms_norm's backward relies on when it hands the kernel x's gradient gathered so far
// (accumulation_target): dx + the call's dx must be exactly the plain call into a fresh dx followed by a binary add.
TEST_CASE("rms_norm_backward with accumulate: the bits of the plain call and a binary add (ref, every cpu path)") {
  const int64_t rows = 200, d = 96;  // 19200 elements: the OpenMP paths run at 2 threads
  const std::vector<float> xv = host_uniform(rows * d, 520, -2.0f, 3.0f),
                           dyv = host_uniform(rows * d, 521, -1.0f, 1.0f), wv = host_uniform(d, 522, 0.5f, 1.5f),
                           sumv = host_uniform(rows * d, 523, -2.0f, 2.0f);
  (void)cpu();  // registers the cpu plugin
  const auto check = [&](const BackendPtr& be, DType dt, const std::string& what) {
    const std::string dtype = dtype_name(dt);
    CAPTURE(what);
    CAPTURE(dtype);
    const auto make = [&](const std::vector<float>& v, const Shape& s) {
      Tensor f = Tensor::from_vector(v, s, be);
      if (dt == DType::f32) return f;
      Tensor t = Tensor::empty(s, dt, be);
      be->cast(f, t);
      return t;
    };
    const Tensor x = make(xv, {rows, d}), dy = make(dyv, {rows, d}), w = make(wv, {d}), sum0 = make(sumv, {rows, d});
    Tensor y = Tensor::empty({rows, d}, dt, be), rstd = Tensor::empty({rows}, DType::f32, be);
    be->rms_norm(x, w, y, rstd, 1e-6f, 0.0f);
    for (const bool with_w : {true, false}) {
      CAPTURE(with_w);
      const Tensor wt = with_w ? w : Tensor();
      Tensor dx = Tensor::empty({rows, d}, dt, be), dw1 = Tensor::empty({d}, dt, be),
             want = Tensor::empty({rows, d}, dt, be);
      be->rms_norm_backward(x, wt, rstd, dy, dx, dw1, 0.0f, false);
      be->binary(sum0, dx, want, BinaryOp::add);
      Tensor acc = sum0.clone(), dw2 = Tensor::empty({d}, dt, be);
      be->rms_norm_backward(x, wt, rstd, dy, acc, dw2, 0.0f, true);
      Tensor a = acc, b = want, c = dw1, e = dw2;
      if (dt != DType::f32 && dt != DType::f64) {  // compare the bits through exact widenings
        a = Tensor::empty({rows, d}, DType::f32, be), b = Tensor::empty({rows, d}, DType::f32, be);
        c = Tensor::empty({d}, DType::f32, be), e = Tensor::empty({d}, DType::f32, be);
        be->cast(acc, a), be->cast(want, b), be->cast(dw1, c), be->cast(dw2, e);
      }
      if (dt == DType::f64) {
        CHECK(a.to_doubles() == b.to_doubles());
        CHECK(c.to_doubles() == e.to_doubles());
      } else {
        const std::vector<float> got = a.to_floats(), exp = b.to_floats();
        int64_t bad = 0;
        for (size_t i = 0; i < got.size(); ++i)
          bad += std::bit_cast<uint32_t>(got[i]) != std::bit_cast<uint32_t>(exp[i]);
        CHECK_MESSAGE(bad == 0, bad, " of ", got.size(), " accumulated dx differ from dx + add");
        CHECK(c.to_floats() == e.to_floats());  // dweight is not accumulated
      }
    }
  };
  for (const DType dt : {DType::f64, DType::f32}) check(ref(), dt, "ref");  // (ref has no bf16 norms)
  const int saved = omp_get_max_threads();
  for (const std::string& isa : cpu_isa_paths().names)
    for (const int threads : {1, 2}) {
      omp_set_num_threads(threads);
      BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
      for (const DType dt : {DType::f32, DType::bf16}) check(be, dt, isa + ", " + std::to_string(threads) + " threads");
    }
  omp_set_num_threads(saved);
  Tensor x = Tensor::from_vector(xv, {rows, d}, cpu()), r = Tensor::empty({rows}, DType::f32, cpu());
  Tensor dy = Tensor::from_vector(dyv, {rows, d}, cpu()), y = dy.clone(), dw;
  cpu()->rms_norm(x, Tensor(), y, r, 1e-6f, 0.0f);
  CHECK_THROWS_WITH_AS(cpu()->rms_norm_backward(x, Tensor(), r, dy, dy, dw, 0.0f, true),
                       doctest::Contains("an accumulated dx must alias neither x nor dy"), dew::Error);
}

TEST_CASE("cpu: gather_rows, scatter_add_rows, rope") {
  const int64_t B = 4, K = 300, R = 50, D = 64;
  std::vector<int32_t> idx(size_t(B * K));
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = int32_t((i * 7919) % R);  // many duplicates
  Pair ix = ints(idx, {B, K});
  for (int64_t bs : {int64_t(1), B}) {
    Pair src = rnd({bs, R, D}, 600 + uint64_t(bs)), out = empty({B, K, D});
    cpu()->gather_rows(src.c, ix.c, out.c);
    ref()->gather_rows(src.r, ix.r, out.r);
    check_equal(out, "gather_rows");
    Pair dout = rnd({B, K, D}, 610), dsrc = rnd({bs, R, D}, 611);
    cpu()->scatter_add_rows(dout.c, ix.c, dsrc.c);
    ref()->scatter_add_rows(dout.r, ix.r, dsrc.r);
    check_close(dsrc, 8 * kEps, 8 * kEps * double(K), "scatter_add_rows");
  }
  Pair bad = ints({0, 1, int32_t(R)}, {1, 3});
  Pair src = rnd({1, R, D}, 620), out = empty({1, 3, D});
  CHECK_THROWS_AS(cpu()->gather_rows(src.c, bad.c, out.c), dew::Error);
  CHECK_THROWS_AS(cpu()->scatter_add_rows(out.c, bad.c, src.c), dew::Error);

  const int64_t T = 100, H = 3, HD = 32;
  std::vector<int32_t> pos(size_t(2 * T));
  for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i * 3 + 5);
  Pair ps = ints(pos, {2, T});
  Pair x = rnd({2, T, H, HD}, 630);
  for (int64_t rd : {int64_t(0), int64_t(16)}) {
    for (bool inverse : {false, true}) {
      RopeParams p{10000.0f, rd, inverse};
      Pair y = empty({2, T, H, HD});
      cpu()->rope(x.c, ps.c, y.c, p);
      ref()->rope(x.r, ps.r, y.r, p);
      check_close(y, 8 * kEps, 8 * kEps, "rope");
    }
  }
}

TEST_CASE("cpu: conv2d forward, backward data, backward weight (+bias grad)") {
  struct Case {
    Shape x, w;
    Conv2dParams p;
  };
  Conv2dParams strided;
  strided.stride_h = strided.stride_w = 2;
  strided.pad_h = strided.pad_w = 1;
  Conv2dParams grouped;
  grouped.pad_h = 1;
  grouped.dilation_w = 2;
  grouped.groups = 2;
  // Covers the plain (first-layer, 1x1) and blocked (>= 16 channels, padded to 16) layouts of cpu.
  const Case cases[] = {{{2, 3, 9, 9}, {8, 3, 3, 3}, Conv2dParams{}},
                        {{2, 4, 10, 11}, {6, 4, 3, 3}, strided},
                        {{1, 4, 8, 8}, {6, 2, 3, 3}, grouped},
                        {{2, 20, 9, 9}, {24, 20, 3, 3}, strided},
                        {{2, 32, 6, 6}, {16, 32, 1, 1}, Conv2dParams{}}};
  uint64_t seed = 700;
  for (const Case& c : cases) {
    const Conv2dParams& p = c.p;
    const Shape ys = conv_output_shape(c.x, c.w, p);
    Pair x = rnd(c.x, seed++), w = rnd(c.w, seed++), bias = rnd({c.w[0]}, seed++), dy = rnd(ys, seed++);
    Pair y = empty(ys), dx = empty(c.x), dw = empty(c.w), db = empty({c.w[0]});
    cpu()->conv2d(x.c, w.c, bias.c, y.c, p);
    ref()->conv2d(x.r, w.r, bias.r, y.r, p);
    check_close(y, 1e-5, 1e-5, "conv2d");
    cpu()->conv2d_backward_data(dy.c, w.c, dx.c, p);
    ref()->conv2d_backward_data(dy.r, w.r, dx.r, p);
    check_close(dx, 1e-5, 1e-5, "conv2d_backward_data");
    cpu()->conv2d_backward_weight(x.c, dy.c, dw.c, db.c, p);
    ref()->conv2d_backward_weight(x.r, dy.r, dw.r, db.r, p);
    check_close(dw, 1e-5, 1e-4, "conv2d_backward_weight");
    check_close(db, 1e-5, 1e-4, "conv2d dbias");
  }
  // conv_transpose2d with output padding: the data gradient into a larger dx (stride 2, pad 1, op 1).
  Pair dy = rnd({1, 4, 5, 5}, 720), w = rnd({4, 3, 3, 3}, 721), dx = empty({1, 3, 10, 10});
  cpu()->conv2d_backward_data(dy.c, w.c, dx.c, strided);
  ref()->conv2d_backward_data(dy.r, w.r, dx.r, strided);
  check_close(dx, 1e-5, 1e-5, "conv_transpose2d");
}

TEST_CASE("cpu: conv2d with matmul_precision = medium rounds its inputs to bf16 (f32 outputs)") {
  const BackendPtr medium = cpu_medium();
  const bool rounds_to_bf16 = native_bf16();
  Conv2dParams strided;
  strided.stride_h = strided.stride_w = 2;
  strided.pad_h = strided.pad_w = 1;
  Conv2dParams grouped;
  grouped.pad_h = 1;
  grouped.groups = 2;
  struct Case {
    Shape x, w;
    Conv2dParams p;
  };
  // plain layouts (3 input channels; 1x1), blocked (>= 16 channels), grouped
  const Case cases[] = {{{2, 3, 9, 9}, {8, 3, 3, 3}, Conv2dParams{}},
                        {{2, 20, 9, 9}, {24, 20, 3, 3}, strided},
                        {{1, 32, 8, 8}, {32, 16, 3, 3}, grouped},
                        {{2, 32, 6, 6}, {16, 32, 1, 1}, Conv2dParams{}}};
  uint64_t seed = 760;
  for (const Case& c : cases) {
    CAPTURE(c.x[1]);
    const Conv2dParams& p = c.p;
    const Shape ys = conv_output_shape(c.x, c.w, p);
    // (medium on the values, ref on the values medium is expected to use)
    auto pair = [&](const Shape& shape) {
      std::vector<float> v = host_uniform(numel_of(shape), seed++, -1.0f, 1.0f), used = v;
      if (rounds_to_bf16)
        for (float& x : used) x = round_to_bf16(x);
      return Pair{Tensor::from_vector(v, shape, cpu()), Tensor::from_vector(used, shape, ref())};
    };
    Pair x = pair(c.x), w = pair(c.w), dy = pair(ys);
    const std::vector<float> bias_values = host_uniform(c.w[0], seed++, -1.0f, 1.0f);
    Pair bias{Tensor::from_vector(bias_values, {c.w[0]}, cpu()), Tensor::from_vector(bias_values, {c.w[0]}, ref())};
    Pair y = empty(ys), dx = empty(c.x), dw = empty(c.w), db = empty({c.w[0]});
    medium->conv2d(x.c, w.c, bias.c, y.c, p);
    ref()->conv2d(x.r, w.r, bias.r, y.r, p);
    check_close(y, 1e-5, 1e-5, "medium conv2d");
    medium->conv2d_backward_data(dy.c, w.c, dx.c, p);
    ref()->conv2d_backward_data(dy.r, w.r, dx.r, p);
    check_close(dx, 1e-5, 1e-5, "medium conv2d_backward_data");
    medium->conv2d_backward_weight(x.c, dy.c, dw.c, db.c, p);
    ref()->conv2d_backward_weight(x.r, dy.r, dw.r, db.r, p);
    check_close(dw, 1e-5, 1e-4, "medium conv2d_backward_weight");
    check_close(db, 1e-5, 1e-4, "medium conv2d dbias");
    if (rounds_to_bf16) {  // and not what f32 gives
      Tensor y32 = Tensor::empty(ys, DType::f32, cpu());
      cpu()->conv2d(x.c, w.c, bias.c, y32, p);
      CHECK(max_abs_diff(y.c, y32) > 1e-3);
    }
  }
}

TEST_CASE("cpu: cross_entropy forward and backward, with ignored rows") {
  const int64_t N = 40, V = 1000;
  Pair logits = rnd({N, V}, 800, -8.0f, 8.0f);
  std::vector<int32_t> t(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i) t[size_t(i)] = i % 7 == 3 ? -100 : int32_t((i * 131) % V);
  Pair targets = ints(t, {N}), dloss = rnd({N}, 801);
  Pair loss = empty({N}), lse = empty({N}), dlogits = empty({N, V});
  cpu()->cross_entropy(logits.c, targets.c, loss.c, lse.c, {});
  ref()->cross_entropy(logits.r, targets.r, loss.r, lse.r, {});
  check_close(loss, 16 * kEps, 16 * kEps, "cross_entropy loss");
  check_close(lse, 8 * kEps, 0.0, "cross_entropy lse");
  cpu()->cross_entropy_backward(logits.c, targets.c, lse.r.to(cpu()), dloss.c, dlogits.c, {});
  ref()->cross_entropy_backward(logits.r, targets.r, lse.r, dloss.r, dlogits.r, {});
  check_close(dlogits, 16 * kEps, 1e-9, "cross_entropy dlogits");
  Pair bad = ints(std::vector<int32_t>(size_t(N), int32_t(V)), {N});
  CHECK_THROWS_AS(cpu()->cross_entropy(logits.c, bad.c, loss.c, lse.c, {}), dew::Error);
}

TEST_CASE("cpu: fused optimizer updates over three steps") {
  const int64_t n = 50000;
  Pair p0 = rnd({n}, 900), m0 = zeros({n}), v0 = zeros({n});
  Pair pa = clone(p0), ma = clone(m0), va = clone(v0), ps = clone(p0), buf = zeros({n}), pl = clone(p0), ml = clone(m0),
       vl = clone(v0);
  for (int64_t step = 1; step <= 3; ++step) {
    Pair g = rnd({n}, 910 + uint64_t(step));
    AdamWParams a;
    a.lr = 1e-2f;
    a.weight_decay = 0.1f;
    a.grad_scale = 0.5f;
    a.step = step;
    cpu()->adamw_update(pa.c, g.c, ma.c, va.c, a);
    ref()->adamw_update(pa.r, g.r, ma.r, va.r, a);
    SgdParams s;
    s.lr = 0.1f;
    s.momentum = 0.9f;
    s.dampening = 0.1f;
    s.weight_decay = 0.01f;
    s.nesterov = true;
    s.step = step;
    cpu()->sgd_update(ps.c, g.c, buf.c, s);
    ref()->sgd_update(ps.r, g.r, buf.r, s);
    LambParams l;
    l.lr = 1e-2f;
    l.weight_decay = 0.01f;
    l.step = step;
    cpu()->lamb_update(pl.c, g.c, ml.c, vl.c, l);
    ref()->lamb_update(pl.r, g.r, ml.r, vl.r, l);
  }
  check_close(pa, 1e-5, 1e-6, "adamw param");
  check_close(va, 1e-5, 1e-9, "adamw v");
  check_close(ps, 1e-5, 1e-6, "sgd param");
  check_close(buf, 1e-5, 1e-6, "sgd momentum");
  check_close(pl, 1e-5, 1e-6, "lamb param");
}

// Normal draws run log and cos as SIMD polynomials and recompute with libm only where the f32 rounding could differ
// (cpu/random.cpp): 2^22 draws from an odd offset, on every ISA path and at 1 and 2 threads, must be philox::normal's
// (the scalar libm expression ref uses) bit for bit, and the map a + b z must round as ref's does.
TEST_CASE("cpu: normal draws equal philox::normal bit for bit, every ISA path, 2^22 draws") {
  cpu();  // loads the plugin
  const int64_t n = int64_t(1) << 22;
  const uint64_t seed = 0x9e3779b97f4a7c15ull, stream = 77, offset = 1001;
  std::vector<uint32_t> want(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    want[size_t(i)] = std::bit_cast<uint32_t>(philox::normal(seed, stream, offset + uint64_t(i)));
  const int saved = omp_get_max_threads();
  for (const std::string& isa : cpu_isa_paths().names)
    for (int threads : {1, 2}) {
      CAPTURE(isa);
      CAPTURE(threads);
      omp_set_num_threads(threads);
      BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
      Tensor t = Tensor::empty({n}, DType::f32, be);
      be->random(t, RandomParams{Distribution::normal, seed, stream, offset, 0.0f, 1.0f});
      const std::vector<float> got = t.to_floats();
      int64_t bad = 0, first = -1;
      for (int64_t i = 0; i < n; ++i)
        if (std::bit_cast<uint32_t>(got[size_t(i)]) != want[size_t(i)] && bad++ == 0) first = i;
      CHECK_MESSAGE(bad == 0, bad, " of ", n, " draws differ, the first at ", first);
    }
  omp_set_num_threads(saved);
  // a + b z rounds as ref's map
  Pair small = empty({4099});
  const RandomParams p{Distribution::normal, seed, stream, offset, 0.25f, -3.0f};
  cpu()->random(small.c, p);
  ref()->random(small.r, p);
  check_equal(small, "random normal a + b z");
}

TEST_CASE("cpu: random and dropout equal ref bit for bit, fill, cast, strided_copy") {
  for (int64_t n : {int64_t(13), int64_t(100003)}) {
    for (Distribution dist : {Distribution::uniform, Distribution::normal}) {
      RandomParams p{dist, 42, 9, 3, -0.5f, 2.0f};
      Pair out = empty({n});
      cpu()->random(out.c, p);
      ref()->random(out.r, p);
      check_equal(out, "random");
    }
    Pair x = rnd({n}, 1000), y = empty({n}), mask = empty({n});
    DropoutParams d{0.3f, 5, 6, 7};
    cpu()->dropout(x.c, y.c, mask.c, d);
    ref()->dropout(x.r, y.r, mask.r, d);
    check_equal(y, "dropout y");
    check_equal(mask, "dropout mask");
  }
  const DType types[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8};
  Pair x = rnd({257}, 1100, -300.0f, 300.0f);
  for (DType from : types) {
    Pair a = empty({257}, from);
    cpu()->cast(x.c, a.c);
    ref()->cast(x.r, a.r);
    check_equal(a, std::string("cast f32 -> ") + dtype_name(from));
    for (DType to : types) {
      Pair b = empty({257}, to);
      cpu()->cast(a.c, b.c);
      ref()->cast(a.r, b.r);
      check_equal(b, std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to));
    }
    Pair f = empty({3, 5}, from);
    cpu()->fill(f.c, -2.75);
    ref()->fill(f.r, -2.75);
    check_equal(f, std::string("fill ") + dtype_name(from));
  }
  // A permute [2, 3, 4, 5] -> [4, 2, 5, 3] and a slice with offset.
  Pair src = rnd({2, 3, 4, 5}, 1200), dst = empty({4, 2, 5, 3});
  StridedCopyParams p{{4, 2, 5, 3}, {5, 60, 1, 20}, {30, 15, 3, 1}, 0, 0};
  cpu()->strided_copy(src.c, dst.c, p);
  ref()->strided_copy(src.r, dst.r, p);
  check_equal(dst, "strided_copy permute");
  Pair big = rnd({300, 400}, 1201), part = empty({100, 200});
  StridedCopyParams q{{100, 200}, {400, 1}, {200, 1}, 400 * 50 + 100, 0};
  cpu()->strided_copy(big.c, part.c, q);
  ref()->strided_copy(big.r, part.r, q);
  check_equal(part, "strided_copy slice");
}

TEST_CASE("cpu: attention is wired to attention.cpp (forward and backward, GQA, causal)") {
  const int64_t B = 2, T = 7, S = 7, Hq = 4, Hkv = 2, D = 16;
  Pair q = rnd({B, T, Hq, D}, 1300), k = rnd({B, S, Hkv, D}, 1301), v = rnd({B, S, Hkv, D}, 1302),
       dout = rnd({B, T, Hq, D}, 1303);
  AttentionParams p;
  p.scale = 0.25f;
  Pair out = empty({B, T, Hq, D}), lse = empty({B, Hq, T});
  cpu()->attention(q.c, k.c, v.c, Tensor(), out.c, lse.c, p);
  ref()->attention(q.r, k.r, v.r, Tensor(), out.r, lse.r, p);
  check_close(out, 1e-5, 1e-6, "attention out");
  check_close(lse, 1e-5, 1e-6, "attention lse");
  Pair dq = empty(q.c.shape()), dk = empty(k.c.shape()), dv = empty(v.c.shape());
  cpu()->attention_backward(q.c, k.c, v.c, Tensor(), out.r.to(cpu()), lse.r.to(cpu()), dout.c, dq.c, dk.c, dv.c, p);
  ref()->attention_backward(q.r, k.r, v.r, Tensor(), out.r, lse.r, dout.r, dq.r, dk.r, dv.r, p);
  check_close(dq, 1e-4, 1e-5, "attention dq");
  check_close(dk, 1e-4, 1e-5, "attention dk");
  check_close(dv, 1e-4, 1e-5, "attention dv");
}

// Backend::operand_reuse: inside a bracket the medium backend rounds an operand once for the products that read it
// (matmul.cpp's ReusedOperands). The products must be the bits they are outside a bracket; closing it must drop the
// roundings (new contents at the same address after a bracket are rounded afresh); a view at the same address with
// another element count is its own operand.
TEST_CASE("cpu: operand_reuse brackets give the products' own bits, and forget at close") {
  const BackendPtr medium = cpu_medium();
  const int64_t rows = 96, out = 40, in = 24;
  const std::vector<float> gv = host_uniform(rows * out, 1500, -1.0f, 1.0f),
                           wv = host_uniform(out * in, 1501, -1.0f, 1.0f),
                           xv = host_uniform(rows * in, 1502, -1.0f, 1.0f),
                           g2v = host_uniform(rows * out, 1503, -1.0f, 1.0f);
  Tensor g = Tensor::from_vector(gv, {rows, out}, cpu()), w = Tensor::from_vector(wv, {out, in}, cpu()),
         x = Tensor::from_vector(xv, {rows, in}, cpu());
  const MatmulParams pdx = matmul_params(1, rows, in, out, false, false, 1.0f, 0.0f, Activation::none);  // g W
  const MatmulParams pdw = matmul_params(1, out, in, rows, true, false, 1.0f, 0.0f, Activation::none);   // g^T x
  const MatmulParams phalf = matmul_params(1, rows / 2, in, out, false, false, 1.0f, 0.0f, Activation::none);
  const Tensor dx0 = medium_product(g, w, pdx), dw0 = medium_product(g, x, pdw),
               half0 = medium_product(g.slice0(0, rows / 2), w, phalf);
  medium->operand_reuse(true);
  const Tensor dx1 = medium_product(g, w, pdx), dw1 = medium_product(g, x, pdw),
               half1 = medium_product(g.slice0(0, rows / 2), w, phalf);
  medium->operand_reuse(false);
  check_equal({dx1, dx0}, "dx in a bracket");
  check_equal({dw1, dw0}, "dW in a bracket (g read again, transposed)");
  check_equal({half1, half0}, "a shorter view of g in the same bracket");
  // new contents at g's address: the next bracket must round them, not find the last bracket's copy
  g.copy_from_host(g2v.data());
  const Tensor dx2 = medium_product(g, w, pdx);
  medium->operand_reuse(true);
  const Tensor dx3 = medium_product(g, w, pdx), dw3 = medium_product(g, x, pdw);
  medium->operand_reuse(false);
  check_equal({dx3, dx2}, "dx after new contents");
  check_equal({dw3, medium_product(g, x, pdw)}, "dW after new contents");
  if (native_bf16()) CHECK(max_abs_diff(dx2, dx0) > 1e-3);  // the new contents do change the product
}

// More operands than the table holds (qkv_attention's backward: x, W and dq, dk, dv in one bracket): a product whose
// two operands are both new when the table is full must not lose its first operand's rounding to its second (the
// least recently used entry goes), and an operand read again after it was evicted is rounded afresh.
TEST_CASE("cpu: operand_reuse with more operands than the table, as qkv_attention's backward") {
  const BackendPtr medium = cpu_medium();
  const int64_t rows = 64, dm = 32, din = 48;
  Tensor x = Tensor::from_vector(host_uniform(rows * din, 1510, -1.0f, 1.0f), {rows, din}, cpu());
  std::vector<Tensor> parts, weights;
  for (int j = 0; j < 3; ++j) {
    parts.push_back(Tensor::from_vector(host_uniform(rows * dm, 1511 + j, -1.0f, 1.0f), {rows, dm}, cpu()));
    weights.push_back(Tensor::from_vector(host_uniform(dm * din, 1521 + j, -1.0f, 1.0f), {dm, din}, cpu()));
  }
  const MatmulParams pdw = matmul_params(1, dm, din, rows, true, false, 1.0f, 0.0f, Activation::none);   // d^T x
  const MatmulParams pdx = matmul_params(1, rows, din, dm, false, false, 1.0f, 0.0f, Activation::none);  // d W
  std::vector<Tensor> bare, bracketed;
  const auto sequence = [&](std::vector<Tensor>& into) {
    for (int j = 0; j < 3; ++j) {
      into.push_back(medium_product(parts[size_t(j)], x, pdw));
      into.push_back(medium_product(parts[size_t(j)], weights[size_t(j)], pdx));
    }
    into.push_back(medium_product(parts[1], weights[0], pdx));  // both evicted by now: two new operands, table full
    into.push_back(medium_product(parts[0], weights[2], pdx));  // parts[0] rounded afresh, weights[2] still held
  };
  sequence(bare);
  medium->operand_reuse(true);
  sequence(bracketed);
  medium->operand_reuse(false);
  REQUIRE(bare.size() == bracketed.size());
  for (size_t i = 0; i < bare.size(); ++i) check_equal({bracketed[i], bare[i]}, "product in a full bracket");
}

// matmul_precision = medium: attention's products take bf16 operands where attention_bf16.cpp's vdpbf16ps kernels
// cover the call (half.cpp's attention_medium: the avx512 path of an AVX512-BF16 CPU, D % 16 == 0, T > 4), with f32
// sums and f32 outputs; elsewhere (decode rows, odd D, no AVX512-BF16) the f32 kernel, bit for bit. Against ref on
// the bf16-rounded q, k, v (and out, dout for the backward, which medium rounds too): out within 0.51 bf16 eps (V in
// [-1, 1]: P rounded as an operand, eps / 2 of max |V|; out itself is not rounded), dq, dk, dv within 4 bf16 eps of
// their largest |value| (dS rounded as an operand; tests/backends_cpu_attention bounds the same kernels).
TEST_CASE("cpu: matmul_precision = medium runs attention's products on bf16 operands, f32 in and out") {
  const BackendPtr medium = cpu_medium();
  const bool native = native_bf16() && cpu_isa_paths().avx512;
  constexpr double kBf16Eps = 1.0 / 256.0;
  struct Case {
    int64_t B, T, S, Hq, Hkv, D;
    bool causal, covered;
  };
  const Case cases[] = {
      {2, 64, 64, 4, 4, 64, false, true},  // the DiT's form
      {1, 70, 70, 4, 2, 32, true, true},   // causal, grouped-query heads, T % 64 != 0
      {2, 3, 9, 2, 2, 64, true, false},    // decode rows (T <= 4): the f32 kernel
      {1, 40, 40, 2, 2, 24, false, false}  // D % 16 != 0: the f32 kernel
  };
  uint64_t seed = 1400;
  for (const Case& c : cases) {
    CAPTURE(c.T);
    CAPTURE(c.D);
    const bool rounds = native && c.covered;
    const Shape qs{c.B, c.T, c.Hq, c.D}, ks{c.B, c.S, c.Hkv, c.D}, ls{c.B, c.Hq, c.T};
    const std::vector<float> qv = host_uniform(numel_of(qs), seed++, -1.0f, 1.0f),
                             kv = host_uniform(numel_of(ks), seed++, -1.0f, 1.0f),
                             vv = host_uniform(numel_of(ks), seed++, -1.0f, 1.0f),
                             dv_ = host_uniform(numel_of(qs), seed++, -1.0f, 1.0f);
    const auto on = [](const std::vector<float>& x, const Shape& s, const BackendPtr& be, bool round) {
      std::vector<float> y = x;
      if (round)
        for (float& e : y) e = round_to_bf16(e);
      return Tensor::from_vector(y, s, be);
    };
    AttentionParams p;
    p.scale = float(1.0 / std::sqrt(double(c.D)));
    p.causal = c.causal;
    p.q_offset = c.S - c.T;
    const Tensor q = on(qv, qs, cpu(), false), k = on(kv, ks, cpu(), false), v = on(vv, ks, cpu(), false),
                 dout = on(dv_, qs, cpu(), false);
    Tensor mo = Tensor::full(qs, 7.0, DType::f32, cpu()), ml = Tensor::full(ls, 7.0, DType::f32, cpu());
    medium->attention(q, k, v, Tensor(), mo, ml, p);
    Tensor mq = Tensor::full(qs, 7.0, DType::f32, cpu()), mk = Tensor::full(ks, 7.0, DType::f32, cpu()),
           mv = Tensor::full(ks, 7.0, DType::f32, cpu());
    medium->attention_backward(q, k, v, Tensor(), mo, ml, dout, mq, mk, mv, p);
    // the f32 kernel (matmul_precision = highest) on the same tensors
    Tensor fo = Tensor::empty(qs, DType::f32, cpu()), fl = Tensor::empty(ls, DType::f32, cpu());
    cpu()->attention(q, k, v, Tensor(), fo, fl, p);
    Tensor fq = Tensor::empty(qs, DType::f32, cpu()), fk = Tensor::empty(ks, DType::f32, cpu()),
           fv = Tensor::empty(ks, DType::f32, cpu());
    cpu()->attention_backward(q, k, v, Tensor(), mo, ml, dout, fq, fk, fv, p);
    if (!rounds) {
      check_equal({mo, fo}, "medium attention out (f32 kernel)");
      check_equal({ml, fl}, "medium attention lse (f32 kernel)");
      check_equal({mq, fq}, "medium attention dq (f32 kernel)");
      check_equal({mk, fk}, "medium attention dk (f32 kernel)");
      check_equal({mv, fv}, "medium attention dv (f32 kernel)");
      continue;
    }
    // ref on the rounded inputs medium is expected to use
    const Tensor qr = on(qv, qs, ref(), true), kr = on(kv, ks, ref(), true), vr = on(vv, ks, ref(), true),
                 dr = on(dv_, qs, ref(), true);
    Tensor wo = Tensor::empty(qs, DType::f32, ref()), wl = Tensor::empty(ls, DType::f32, ref());
    ref()->attention(qr, kr, vr, Tensor(), wo, wl, p);
    check_close({mo, wo}, 0.0, 0.51 * kBf16Eps, "medium attention out vs ref on bf16-rounded q, k, v");
    check_close({ml, wl}, 1e-5, 1e-5, "medium attention lse vs ref on bf16-rounded q, k");
    CHECK(max_abs_diff(mo, fo) > 1e-4);  // rounding q, k, v moves out by ~2^-9: far outside the f32 kernel's error
    Tensor wq = Tensor::empty(qs, DType::f32, ref()), wk = Tensor::empty(ks, DType::f32, ref()),
           wv = Tensor::empty(ks, DType::f32, ref());
    const Tensor wo_rounded = on(wo.to_floats(), qs, ref(), true);
    ref()->attention_backward(qr, kr, vr, Tensor(), wo_rounded, wl, dr, wq, wk, wv, p);
    for (const auto& [got, want, what] :
         {std::tuple<const Tensor*, const Tensor*, const char*>{&mq, &wq, "dq"}, {&mk, &wk, "dk"}, {&mv, &wv, "dv"}}) {
      CAPTURE(what);
      const std::vector<double> g = got->to_doubles(), w = want->to_doubles();
      double scale = 0, err = 0;
      for (size_t i = 0; i < w.size(); ++i) scale = std::max(scale, std::fabs(w[i]));
      for (size_t i = 0; i < w.size(); ++i) err = std::max(err, std::fabs(g[i] - w[i]));
      CHECK(err <= 4 * kBf16Eps * scale);
    }
  }
}

// The row-wise decode path (m <= 32, trans_b, batch 1, beta 0) in each ISA path the CPU runs (the `isa`
// option caps the run-time choice): avx512 and avx2 agree bit for bit, every path is close to ref, and a
// row's result does not depend on the rows batched with it or on the thread count (served = solo).
TEST_CASE("cpu: row-wise matmul, every ISA path: bit-equal across avx512/avx2, batch- and thread-invariant") {
  cpu();
  const IsaPaths isa_paths = cpu_isa_paths();
  const std::vector<std::string>& paths = isa_paths.names;
  const bool has_avx512 = isa_paths.avx512;
  struct Case {
    int64_t m, n, k;
    bool bias;
    float alpha;
    Activation act;
  };
  // k = 384, 1024: decode shapes; 77 and 13: tails past the last block of 16; n = 37: columns past every
  // block width and the threads' 8-column granule; m = 1, 2, 3, 17, 32: the m == 1 and paired row blocks.
  const Case cases[] = {{1, 384, 384, false, 1.0f, Activation::none},   {1, 1024, 384, true, 1.0f, Activation::silu},
                        {3, 37, 77, true, 0.5f, Activation::gelu},      {2, 256, 1024, false, 1.0f, Activation::none},
                        {17, 96, 13, true, 1.0f, Activation::gelu_tanh}, {32, 40, 384, false, 1.0f, Activation::relu}};
  uint64_t seed = 4242;
  for (const Case& c : cases) {
    CAPTURE(c.m);
    CAPTURE(c.n);
    CAPTURE(c.k);
    const MatmulParams p = matmul_params(1, c.m, c.n, c.k, false, true, c.alpha, 0.0f, c.act);
    const std::vector<float> x = host_uniform(c.m * c.k, seed++, -1.0f, 1.0f);
    const std::vector<float> w = host_uniform(c.n * c.k, seed++, -1.0f, 1.0f);
    const std::vector<float> bias = host_uniform(c.n, seed++, -1.0f, 1.0f);
    Tensor want = Tensor::empty({1, c.m, c.n}, DType::f32, ref());
    ref()->matmul(Tensor::from_vector(x, {1, c.m, c.k}, ref()), Tensor::from_vector(w, {1, c.n, c.k}, ref()),
                  c.bias ? Tensor::from_vector(bias, {c.n}, ref()) : Tensor(), want, p);
    std::vector<std::vector<float>> results;
    for (const std::string& isa : paths) {
      CAPTURE(isa);
      BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
      const Tensor xc = Tensor::from_vector(x, {1, c.m, c.k}, be), wc = Tensor::from_vector(w, {1, c.n, c.k}, be);
      const Tensor bc = c.bias ? Tensor::from_vector(bias, {c.n}, be) : Tensor();
      std::vector<float> by_threads[2];
      for (int threads : {1, 2}) {
        be->set_threads(threads);
        Tensor got = Tensor::empty({1, c.m, c.n}, DType::f32, be);
        be->matmul(xc, wc, bc, got, p);
        by_threads[threads - 1] = got.to_floats();
        check_close({got, want}, 1e-5, 4 * kEps * double(c.k), "row-wise matmul " + isa);
      }
      be->set_threads(1);
      CHECK(by_threads[0] == by_threads[1]);  // the thread split only moves columns between threads
      // Each row alone (m = 1: the decode path's own block shape) equals that row of the batch.
      const MatmulParams p1 = matmul_params(1, 1, c.n, c.k, false, true, c.alpha, 0.0f, c.act);
      for (int64_t r = 0; r < c.m; ++r) {
        const std::vector<float> xr(x.begin() + r * c.k, x.begin() + (r + 1) * c.k);
        Tensor solo = Tensor::empty({1, 1, c.n}, DType::f32, be);
        be->matmul(Tensor::from_vector(xr, {1, 1, c.k}, be), wc, bc, solo, p1);
        const std::vector<float> s = solo.to_floats();
        CHECK(std::equal(s.begin(), s.end(), by_threads[0].begin() + r * c.n));
      }
      results.push_back(by_threads[0]);
    }
    if (has_avx512) CHECK(results[1] == results[2]);  // avx2 and avx512: the same arithmetic
  }
  CHECK_THROWS_AS(create_backend("cpu", Options({{"isa", "sse9"}}, "test")), Error);
}

// Weight-only bf16 (f32 x against a bf16 weight, linear's product): every row goes through the row-wise
// kernel, so it is bit-equal to the f32 row-wise product on the widened weight, in 32-row passes past 32
// rows (m = 40: a prefill), on every ISA path this CPU has; and close to ref on the widened weight.
// k = 83: an odd count of 16-blocks and a tail of 3; k = 1024: a decode shape.
TEST_CASE("cpu: matmul with a bf16 weight equals the f32 row-wise product on the widened weight") {
  cpu();
  const std::vector<std::string> paths = cpu_isa_paths().names;
  const int64_t n = 45;
  for (int64_t k : {83, 1024}) {
    const std::vector<float> w = host_uniform(n * k, 77, -1.0f, 1.0f), bias = host_uniform(n, 78, -1.0f, 1.0f);
    const auto [w16, widened] = rounded_to_bf16(w);
    for (const std::string& isa : paths)
      for (int64_t m : {1, 3, 40}) {
        CAPTURE(k);
        CAPTURE(isa);
        CAPTURE(m);
        BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
        const std::vector<float> x = host_uniform(m * k, 79 + uint64_t(m), -1.0f, 1.0f);
        const MatmulParams p = matmul_params(1, m, n, k, false, true, 1.0f, 0.0f, Activation::silu);
        Tensor wb = Tensor::empty({n, k}, DType::bf16, be);
        wb.copy_from_host(w16.data());
        Tensor got = Tensor::empty({1, m, n}, DType::f32, be);
        be->matmul(Tensor::from_vector(x, {1, m, k}, be), wb, Tensor::from_vector(bias, {n}, be), got, p);
        const std::vector<float> g = got.to_floats();
        // the f32 row-wise path, 32 rows at a time
        for (int64_t r0 = 0; r0 < m; r0 += 32) {
          const int64_t rows = std::min<int64_t>(32, m - r0);
          const std::vector<float> xr(x.begin() + r0 * k, x.begin() + (r0 + rows) * k);
          Tensor want = Tensor::empty({1, rows, n}, DType::f32, be);
          be->matmul(Tensor::from_vector(xr, {1, rows, k}, be), Tensor::from_vector(widened, {n, k}, be),
                     Tensor::from_vector(bias, {n}, be), want,
                     matmul_params(1, rows, n, k, false, true, 1.0f, 0.0f, Activation::silu));
          const std::vector<float> wv = want.to_floats();
          CHECK(std::equal(wv.begin(), wv.end(), g.begin() + r0 * n));
        }
        Tensor r = Tensor::empty({1, m, n}, DType::f32, ref());
        ref()->matmul(Tensor::from_vector(x, {1, m, k}, ref()), Tensor::from_vector(widened, {n, k}, ref()),
                      Tensor::from_vector(bias, {n}, ref()), r, p);
        check_close({got, r}, 1e-5, 4 * kEps * double(k), "bf16-weight matmul vs ref on the widened weight");
      }
  }
  // Anything but linear's product is refused with a message.
  Tensor wb = Tensor::zeros({8, 8}, DType::bf16, cpu()), out = Tensor::empty({1, 8, 8}, DType::f32, cpu());
  CHECK_THROWS_AS(cpu()->matmul(Tensor::zeros({1, 8, 8}, DType::f32, cpu()), wb, Tensor(), out,
                                matmul_params(1, 8, 8, 8, false, false, 1.0f, 0.0f, Activation::none)),
                  Error);
}

// Decode weights in panels (dew/tensor.hpp, Backend::decode_panel_rows, matmul_rowwise.hpp): the cpu backend asks for
// panels of 32 rows for f32 and bf16 (none with decode_panels = off or on the portable path, none for int8; ref none);
// store_matmul_weights_in_panels lays them out in place (the panel bytes where the layout says, the row-major values
// back from copy_to_host) and leaves a weight whose rows 32 does not divide. The panel kernel's outputs, on every ISA
// path: on avx512 and avx2 exactly the documented sums (two FMA chains over the even and odd columns in order, added;
// computed here with std::fma), bit-equal across the two paths, for every row count (m 1 .. 40: R-row blocks, single
// rows, and past 32) a row alone equal to that row of the batch, equal at 1 and 2 threads, bf16 through the prefetching
// kernel (decode_prefetch = on); the epilogue (bias, silu) close to ref. A tensor in panels is read by linear() only:
// data(), a slice through a panel, a reshape and a non-linear product are refused.
TEST_CASE("cpu: decode weights in panels: layout, the documented sums on every ISA path, batch- and thread-invariant") {
  cpu();
  const IsaPaths isa_paths = cpu_isa_paths();
  CHECK(cpu()->decode_panel_rows(DType::f32) == 32);
  CHECK(cpu()->decode_panel_rows(DType::bf16) == 32);
  CHECK(cpu()->decode_panel_rows(DType::i8) == 0);
  CHECK(ref()->decode_panel_rows(DType::f32) == 0);
  CHECK(create_backend("cpu", Options({{"decode_panels", "off"}}, "test"))->decode_panel_rows(DType::f32) == 0);
  CHECK(create_backend("cpu", Options({{"isa", "portable"}}, "test"))->decode_panel_rows(DType::f32) == 0);
  CHECK_THROWS_AS(create_backend("cpu", Options({{"decode_panels", "maybe"}}, "test")), Error);
  CHECK_THROWS_AS(create_backend("cpu", Options({{"decode_prefetch", "maybe"}}, "test")), Error);
  struct Case {
    int64_t n, k;
  };
  // k = 1 and 77: a lone column and an odd count (the last column in the even chain); 384 / 1024: decode shapes.
  const Case cases[] = {{32, 1}, {64, 77}, {96, 384}, {1024, 384}, {64, 1024}};
  uint64_t seed = 9100;
  for (const DType dt : {DType::f32, DType::bf16})
    for (const Case& c : cases) {
      CAPTURE(dtype_name(dt));
      CAPTURE(c.n);
      CAPTURE(c.k);
      std::vector<float> w = host_uniform(c.n * c.k, seed++, -1.0f, 1.0f);
      const auto [w16, widened] = rounded_to_bf16(w);
      if (dt == DType::bf16) w = widened;
      const std::vector<float> bias = host_uniform(c.n, seed++, -1.0f, 1.0f);
      std::vector<std::vector<float>> by_path;
      for (const std::string& isa : isa_paths.names) {
        CAPTURE(isa);
        // bf16 with decode_prefetch = on: the prefetching kernel (weights streamed from memory) makes the same sums.
        BackendPtr be = create_backend(
            "cpu", Options({{"isa", isa}, {"decode_prefetch", dt == DType::bf16 ? "on" : "off"}}, "test"));
        Tensor wt = dt == DType::f32 ? Tensor::from_vector(w, {c.n, c.k}, be) : Tensor::empty({c.n, c.k}, dt, be);
        if (dt == DType::bf16) wt.copy_from_host(w16.data());
        const std::vector<std::pair<std::string, Tensor>> params = {{"layers.0.w.weight", wt}};
        if (isa == "portable") {  // asks for none (slower there); its kernel still serves a weight laid out by hand
          REQUIRE(store_matmul_weights_in_panels(params) == 0);
          const std::vector<unsigned char> bytes = [&] {
            std::vector<unsigned char> b(wt.nbytes());
            wt.copy_to_host(b.data());
            return b;
          }();
          wt.impl()->panel = 32;
          wt.copy_from_host(bytes.data());
        } else {
          REQUIRE(store_matmul_weights_in_panels(params) == 1);
        }
        REQUIRE(wt.panel_rows() == 32);
        CHECK(wt.to_floats() == w);  // the values, row-major
        {                            // the bytes where the layout puts them: (r, c) at ((r / 32) * k + c) * 32 + r % 32
          const size_t es = dtype_size(dt);
          std::vector<unsigned char> raw(wt.nbytes()), rows(wt.nbytes());
          be->copy_to_host(raw.data(), wt.panel_data(), raw.size());
          wt.copy_to_host(rows.data());
          int misplaced = 0;
          for (int64_t r = 0; r < c.n; ++r)
            for (int64_t i = 0; i < c.k; ++i)
              misplaced += std::memcmp(raw.data() + size_t(((r / 32) * c.k + i) * 32 + r % 32) * es,
                                       rows.data() + size_t(r * c.k + i) * es, es) != 0;
          CHECK(misplaced == 0);
        }
        for (const int64_t m : {1, 3, 4, 5, 16, 40}) {  // passes of 6, 4, 2, 1 rows (avx512), 3, 1 (avx2)
          CAPTURE(m);
          const std::vector<float> x = host_uniform(m * c.k, seed + uint64_t(m), -1.0f, 1.0f);
          const Tensor xt = Tensor::from_vector(x, {1, m, c.k}, be);
          std::vector<float> plain[2];
          for (int threads : {1, 2}) {
            be->set_threads(threads);
            Tensor got = Tensor::empty({1, m, c.n}, DType::f32, be);
            be->matmul(xt, wt, Tensor(), got, matmul_params(1, m, c.n, c.k, false, true, 1.0f, 0.0f, Activation::none));
            plain[threads - 1] = got.to_floats();
          }
          be->set_threads(1);
          CHECK(plain[0] == plain[1]);
          if (isa != "portable") {  // the documented sums, exactly
            int off = 0;
            for (int64_t r = 0; r < m; ++r)
              for (int64_t j = 0; j < c.n; ++j) {
                float e = 0.0f, o = 0.0f;
                for (int64_t i = 0; i < c.k; ++i) {
                  float& chain = i % 2 == 0 ? e : o;
                  chain = std::fma(x[size_t(r * c.k + i)], w[size_t(j * c.k + i)], chain);
                }
                off += plain[0][size_t(r * c.n + j)] != e + o;
              }
            CHECK(off == 0);
          }
          for (int64_t r = 0; r < m; r += 2) {  // a row alone is that row of the batch
            const std::vector<float> xr(x.begin() + r * c.k, x.begin() + (r + 1) * c.k);
            Tensor solo = Tensor::empty({1, 1, c.n}, DType::f32, be);
            be->matmul(Tensor::from_vector(xr, {1, 1, c.k}, be), wt, Tensor(), solo,
                       matmul_params(1, 1, c.n, c.k, false, true, 1.0f, 0.0f, Activation::none));
            const std::vector<float> sv = solo.to_floats();
            CHECK(std::equal(sv.begin(), sv.end(), plain[0].begin() + r * c.n));
          }
          if (m == 40) by_path.push_back(plain[0]);
          // The epilogue: bias and silu, close to ref's product of the row-major values.
          const MatmulParams pe = matmul_params(1, m, c.n, c.k, false, true, 1.0f, 0.0f, Activation::silu);
          Tensor got = Tensor::empty({1, m, c.n}, DType::f32, be), want = Tensor::empty({1, m, c.n}, DType::f32, ref());
          be->matmul(xt, wt, Tensor::from_vector(bias, {c.n}, be), got, pe);
          ref()->matmul(Tensor::from_vector(x, {1, m, c.k}, ref()), Tensor::from_vector(w, {1, c.n, c.k}, ref()),
                        Tensor::from_vector(bias, {c.n}, ref()), want, pe);
          check_close({got, want}, 1e-5, 4 * kEps * double(c.k), "panel matmul " + isa);
        }
      }
      if (isa_paths.avx512) CHECK(by_path[1] == by_path[2]);  // avx2 and avx512: the same arithmetic
    }
  // A weight whose rows 32 does not divide, an embedding and a 1-D tensor keep their rows; ref asks for none.
  const std::vector<std::pair<std::string, Tensor>> keep = {
      {"a.weight", Tensor::zeros({40, 8}, DType::f32, cpu())},
      {"embed_tokens.weight", Tensor::zeros({64, 8}, DType::f32, cpu())},
      {"norm.weight", Tensor::zeros({64}, DType::f32, cpu())},
      {"r.weight", Tensor::zeros({64, 8}, DType::f32, ref())}};
  CHECK(store_matmul_weights_in_panels(keep) == 0);
  // Read by linear() only.
  Tensor w = Tensor::from_vector(host_uniform(64 * 8, 5, -1.0f, 1.0f), {64, 8}, cpu());
  const std::vector<float> values = w.to_floats();
  REQUIRE(store_matmul_weights_in_panels({{"w.weight", w}}) == 1);
  CHECK_THROWS_AS(w.data(), Error);
  CHECK_THROWS_AS(w.slice0(0, 16), Error);
  CHECK(w.slice0(32, 64).panel_rows() == 32);
  CHECK(w.slice0(32, 64).to_floats() == std::vector<float>(values.begin() + 32 * 8, values.end()));
  CHECK_THROWS_AS(reshape(w, {8, 64}), Error);
  CHECK(w.clone().panel_rows() == 32);
  CHECK(w.clone().to_floats() == values);
  CHECK(w.to(ref()).panel_rows() == 0);
  CHECK(w.to(ref()).to_floats() == values);
  Tensor out = Tensor::empty({1, 8, 64}, DType::f32, cpu());
  CHECK_THROWS_AS(cpu()->matmul(Tensor::zeros({1, 8, 8}, DType::f32, cpu()), w, Tensor(), out,
                                matmul_params(1, 8, 64, 8, false, false, 1.0f, 0.0f, Activation::none)),
                  Error);
  CHECK_THROWS_AS(matmul(Tensor::zeros({8, 64}, DType::f32, cpu()), w), Error);  // not linear()'s form
  CHECK(linear(Tensor::from_vector(std::vector<float>(8, 1.0f), {1, 8}, cpu()), w).shape() == Shape{1, 64});
}

// Weight-only int8 (f32 x against a quantized weight: i8 [n, k] with f32 scales [n, G], dew/tensor.hpp): on every
// ISA path each output is sum over groups of scale * (the group's dot product) — checked against the same sum
// taken in double on the host and against ref's product of the dequantized weight, within the kernel's own
// roundings: f32 ones (a few eps * k), and on the integer form (group lengths a multiple of 32) x rounded to
// int16 per block of 32 (at most half a step, absmax / 32767 / 2, per element); a row alone equals that row in a
// batch of m (1, 3, and 40 = a 32-row pass plus 8), at 1 and 3 threads; and avx2 equals avx512 bit for bit.
// Group lengths: 32 (ggml's block, what --weights int8 uses) and 64 (two blocks per scale) take the integer
// form; the whole row with a tail (k 83) and 24 (16 plus a tail of 8 in every group) the f32 widening. A NaN in
// one row of x makes that row's outputs NaN and leaves the others' bits alone.
TEST_CASE("cpu: matmul with an int8 weight: per-group scaled sums on every ISA path, batch- and thread-invariant") {
  cpu();
  const IsaPaths isa_paths = cpu_isa_paths();
  const std::vector<std::string>& paths = isa_paths.names;
  const bool has_avx512 = isa_paths.avx512;
  struct Case {
    int64_t n, k, groups;
  };
  uint64_t seed = 5150;
  // {45, 1024, 32}: at m = 40 large enough (1.8 M multiply-adds) that the columns split over the threads
  for (const Case c : {Case{45, 83, 1}, Case{40, 96, 3}, Case{37, 120, 5}, Case{21, 128, 2}, Case{45, 1024, 32}}) {
    const bool integer_form = (c.k / c.groups) % 32 == 0;
    CAPTURE(c.k);
    CAPTURE(c.groups);
    const Tensor wq = quantize_int8(Tensor::from_vector(host_uniform(c.n * c.k, seed++, -1.0f, 1.0f), {c.n, c.k}, ref()),
                                    c.groups);
    std::vector<int8_t> q(size_t(c.n * c.k));
    wq.copy_to_host(q.data());
    const std::vector<float> sc = wq.scales().to_floats(), bias = host_uniform(c.n, seed++, -1.0f, 1.0f);
    const int64_t per = c.k / c.groups;
    for (int64_t m : {1, 3, 40}) {
      CAPTURE(m);
      const std::vector<float> x = host_uniform(m * c.k, seed++, -1.0f, 1.0f);
      // The host's double sum of the same arithmetic (then the bias), and its error bound.
      std::vector<double> want(size_t(m * c.n)), bound(size_t(m * c.n));
      for (int64_t r = 0; r < m; ++r)
        for (int64_t j = 0; j < c.n; ++j) {
          double total = 0, mag = 0, xround = 0;
          for (int64_t g = 0; g < c.groups; ++g) {
            double d = 0, a = 0, wsum = 0;
            for (int64_t i = g * per; i < (g + 1) * per; ++i) {
              d += double(x[size_t(r * c.k + i)]) * double(q[size_t(j * c.k + i)]);
              a += std::fabs(double(x[size_t(r * c.k + i)]) * double(q[size_t(j * c.k + i)]));
              if (integer_form) {  // half a step of x's int16 block, times |w|
                double amax = 0;
                for (int64_t e = i / 32 * 32; e < i / 32 * 32 + 32; ++e) amax = std::max(amax, double(std::fabs(x[size_t(r * c.k + e)])));
                wsum += std::fabs(double(q[size_t(j * c.k + i)])) * amax / 32767.0 / 2.0;
              }
            }
            total += double(sc[size_t(j * c.groups + g)]) * d;
            mag += double(sc[size_t(j * c.groups + g)]) * a;
            xround += double(sc[size_t(j * c.groups + g)]) * wsum;
          }
          want[size_t(r * c.n + j)] = total + double(bias[size_t(j)]);
          bound[size_t(r * c.n + j)] =
              1.0001 * xround + 4 * kEps * double(per + c.groups + 16) * (mag + xround + std::fabs(double(bias[size_t(j)])));
        }
      Tensor on_ref = linear(Tensor::from_vector(x, {m, c.k}, ref()), wq, Tensor::from_vector(bias, {c.n}, ref()));
      std::vector<std::vector<float>> by_isa;
      for (const std::string& isa : paths) {
        CAPTURE(isa);
        BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
        const Tensor w = wq.to(be), b = Tensor::from_vector(bias, {c.n}, be);
        REQUIRE(w.quantized());
        std::vector<float> by_threads[2];
        for (int threads : {1, 3}) {
          be->set_threads(threads);
          Tensor got = Tensor::empty({1, m, c.n}, DType::f32, be);
          be->matmul(Tensor::from_vector(x, {1, m, c.k}, be), w, b, got,
                     matmul_params(1, m, c.n, c.k, false, true, 1.0f, 0.0f, Activation::none));
          by_threads[threads == 1 ? 0 : 1] = got.to_floats();
        }
        be->set_threads(1);
        const std::vector<float>& g = by_threads[0];
        CHECK(g == by_threads[1]);
        const std::vector<double> r = on_ref.to_doubles();
        int bad = 0, bad_ref = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          bad += std::fabs(double(g[i]) - want[i]) > bound[i];
          bad_ref += std::fabs(double(g[i]) - r[i]) > bound[i] + 4 * kEps * std::fabs(want[i]);
        }
        CHECK_MESSAGE(bad == 0, bad, " outputs off the host's double sum");
        CHECK_MESSAGE(bad_ref == 0, bad_ref, " outputs off ref's product of the dequantized weight");
        for (int64_t r : {int64_t(0), m - 1}) {  // a row alone equals the same row in the batch
          Tensor solo = Tensor::empty({1, 1, c.n}, DType::f32, be);
          be->matmul(Tensor::from_vector(std::vector<float>(x.begin() + r * c.k, x.begin() + (r + 1) * c.k),
                                         {1, 1, c.k}, be),
                     w, b, solo, matmul_params(1, 1, c.n, c.k, false, true, 1.0f, 0.0f, Activation::none));
          const std::vector<float> s = solo.to_floats();
          CHECK(std::equal(s.begin(), s.end(), g.begin() + r * c.n));
        }
        if (m == 3) {  // a NaN in row 1: its outputs NaN, rows 0 and 2 bit-equal to the clean batch's
          std::vector<float> xn = x;
          xn[size_t(c.k + 5)] = NAN;
          Tensor got = Tensor::empty({1, m, c.n}, DType::f32, be);
          be->matmul(Tensor::from_vector(xn, {1, m, c.k}, be), w, b, got,
                     matmul_params(1, m, c.n, c.k, false, true, 1.0f, 0.0f, Activation::none));
          const std::vector<float> gn = got.to_floats();
          for (int64_t j = 0; j < c.n; ++j) {
            CHECK(std::isnan(gn[size_t(c.n + j)]));
            CHECK(gn[size_t(j)] == g[size_t(j)]);
            CHECK(gn[size_t(2 * c.n + j)] == g[size_t(2 * c.n + j)]);
          }
        }
        by_isa.push_back(g);
      }
      if (has_avx512) CHECK(by_isa[1] == by_isa[2]);  // avx2 and avx512: the same arithmetic
    }
  }
  // linear() reaches the int8 kernel without a dequantized copy of the weight (4 MiB in f32 here).
  BackendPtr be = cpu();
  const int64_t n = 1024, k = 1024;
  const Tensor wq = quantize_int8(Tensor::from_vector(host_uniform(n * k, 93, -1.0f, 1.0f), {n, k}, be), k / 32);
  const Tensor xt = Tensor::from_vector(host_uniform(k, 94, -1.0f, 1.0f), {1, 1, k}, be);
  be->reset_memory_peak();
  const int64_t before = be->memory_stats().in_use;
  const Tensor y = linear(xt, wq);
  CHECK(be->memory_stats().peak - before < n * k * int64_t(sizeof(float)) / 4);
  check_close({y, linear(xt.to(ref()), wq.to(ref()))}, 1e-5, 4 * kEps * double(k), "linear() with an int8 weight");
}

// Through the op, as decoding calls it: linear() of f32 activations against a bf16 weight must reach the backend's
// weight-only kernel on every CPU. On CPUs without AVX512-BF16 cpu's supports(matmul, bf16) used to say no, so
// the core widened the whole weight to an f32 temporary on every call (a decode token streamed 4x the bf16
// weight bytes): the peak allocation during the call shows it (an f32 copy of this weight is 4 MiB).
TEST_CASE("cpu: linear() with a bf16 weight never widens the weight (weight-only kernel on every CPU)") {
  BackendPtr be = cpu();
  const int64_t n = 1024, k = 1024;
  const std::vector<float> w = host_uniform(n * k, 91, -1.0f, 1.0f), x = host_uniform(k, 92, -1.0f, 1.0f);
  const auto [w16, widened] = rounded_to_bf16(w);
  Tensor wb = Tensor::empty({n, k}, DType::bf16, be);
  wb.copy_from_host(w16.data());
  const Tensor xt = Tensor::from_vector(x, {1, 1, k}, be);
  be->reset_memory_peak();
  const int64_t before = be->memory_stats().in_use;
  const Tensor y = linear(xt, wb);
  const int64_t extra = be->memory_stats().peak - before;
  CHECK(extra < n * k * int64_t(sizeof(float)) / 4);  // the output row, not a widened weight
  const Tensor want = linear(xt, Tensor::from_vector(widened, {n, k}, be));  // f32 row-wise on the widened weight
  const std::vector<float> g = y.to_floats(), e = want.to_floats();
  CHECK(std::equal(g.begin(), g.end(), e.begin()));
}

// Every hand-written kernel family on each ISA path this CPU runs (the `isa` option; isa_clones.hpp). The
// elementwise families (unary forward/backward, binary, the AdamW / SGD updates, RoPE, gather / scatter_add,
// the bf16 casts) compute each element by the same expression on every path, so avx512 and avx2 (both with
// FMA) agree bit for bit; the reductions (norms, log-softmax, cross-entropy, reduce, LAMB's norms) sum in
// vector lanes whose count differs per path, and agree within a few ulp. Portable (no FMA) agrees within a
// few ulp too, and differs from avx2 somewhere (which shows the option really switches the code). A path
// the CPU lacks is refused with one line (DEW_CPU_MAX_ISA stands in for an older CPU: tests/conformance).
TEST_CASE("cpu: every hand-written family on each ISA path: avx512 == avx2 bit for bit where elementwise") {
  cpu();
  const IsaPaths isa_paths = cpu_isa_paths();
  const std::vector<std::string>& paths = isa_paths.names;
  const bool has_avx2 = isa_paths.avx2, has_avx512 = isa_paths.avx512;
  struct Result {
    std::string what;
    bool elementwise;
    std::vector<float> v;
  };
  const int64_t n = 4099;  // a tail past every vector width
  const auto run = [&](const std::string& isa) {
    BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
    std::vector<Result> r;
    const auto put = [&](const std::string& what, bool elementwise, const Tensor& t) {
      r.push_back({what, elementwise, t.to_floats()});
    };
    const Tensor x = Tensor::from_vector(host_uniform(n, 900, -4.0f, 4.0f), {n}, be);
    const Tensor xp = Tensor::from_vector(host_uniform(n, 901, 0.05f, 4.0f), {n}, be);  // log, sqrt, pow
    const Tensor dy = Tensor::from_vector(host_uniform(n, 902, -1.0f, 1.0f), {n}, be);
    for (int op = 0; op <= int(UnaryOp::softcap); ++op) {
      const UnaryOp u = UnaryOp(op);
      const bool positive = u == UnaryOp::log || u == UnaryOp::sqrt || u == UnaryOp::rsqrt || u == UnaryOp::pow ||
                            u == UnaryOp::reciprocal;
      const UnaryParams p{u, u == UnaryOp::pow ? 1.7f : u == UnaryOp::clamp ? -0.5f : u == UnaryOp::softcap ? 3.0f : 1.3f,
                          u == UnaryOp::clamp ? 0.75f : 0.25f};
      Tensor out = Tensor::empty({n}, DType::f32, be), dx = Tensor::empty({n}, DType::f32, be);
      be->unary(positive ? xp : x, out, p);
      be->unary_backward(positive ? xp : x, dy, dx, p);
      put("unary " + std::to_string(op), true, out);
      put("unary_backward " + std::to_string(op), true, dx);
    }
    for (int op = 0; op <= int(BinaryOp::lt); ++op) {
      Tensor out = Tensor::empty({n}, DType::f32, be);
      be->binary(x, xp, out, BinaryOp(op));
      put("binary " + std::to_string(op), true, out);
    }
    for (Activation act : {Activation::none, Activation::relu, Activation::gelu, Activation::gelu_tanh,
                           Activation::silu}) {
      Tensor out = Tensor::empty({n}, DType::f32, be), dg = Tensor::empty({n}, DType::f32, be);
      Tensor du = Tensor::empty({n}, DType::f32, be);
      be->gated_activation(x, xp, out, act);
      be->gated_activation_backward(x, xp, dy, dg, du, act);
      put("gated_activation " + std::to_string(int(act)), true, out);
      put("gated_activation_backward dgate " + std::to_string(int(act)), true, dg);
      put("gated_activation_backward dup " + std::to_string(int(act)), true, du);
    }
    const Tensor rows = Tensor::from_vector(host_uniform(37 * 130, 903, -2.0f, 2.0f), {37, 130}, be);
    const Tensor vec = Tensor::from_vector(host_uniform(130, 904, 0.5f, 1.5f), {130}, be);
    Tensor bo = Tensor::empty({37, 130}, DType::f32, be);
    be->binary(rows, vec, bo, BinaryOp::mul);
    put("binary broadcast", true, bo);
    {  // optimizers: a few steps from the same state
      Tensor w = x.clone(), m = Tensor::zeros({n}, DType::f32, be), v = Tensor::zeros({n}, DType::f32, be);
      Tensor ws = x.clone(), buf = Tensor::zeros({n}, DType::f32, be), wl = x.clone();
      Tensor ml = Tensor::zeros({n}, DType::f32, be), vl = Tensor::zeros({n}, DType::f32, be);
      for (int64_t step = 1; step <= 3; ++step) {
        AdamWParams a;
        a.lr = 1e-2f, a.weight_decay = 0.1f, a.grad_scale = 0.5f, a.step = step;
        be->adamw_update(w, dy, m, v, a);
        SgdParams s;
        s.momentum = 0.9f, s.weight_decay = 0.01f, s.nesterov = true, s.step = step;
        be->sgd_update(ws, dy, buf, s);
        LambParams l;
        l.weight_decay = 0.01f, l.step = step;
        be->lamb_update(wl, dy, ml, vl, l);
      }
      put("adamw", true, w);
      put("sgd", true, ws);
      put("lamb", false, wl);
    }
    {  // rope, embedding rows
      const int64_t T = 9, H = 3, HD = 32;
      std::vector<int32_t> pos(size_t(2 * T));
      for (size_t i = 0; i < pos.size(); ++i) pos[i] = int32_t(i * 7 + 3);
      const Tensor xr = Tensor::from_vector(host_uniform(2 * T * H * HD, 905, -1.0f, 1.0f), {2, T, H, HD}, be);
      Tensor y = Tensor::empty({2, T, H, HD}, DType::f32, be);
      be->rope(xr, Tensor::from_ints(pos, {2, T}, be), y, RopeParams{10000.0f, 16, false});
      put("rope", true, y);
      const std::vector<int32_t> ix = {3, 0, 3, 5, 1, 3, 2, 5};
      const Tensor idx = Tensor::from_ints(ix, {1, 8}, be);
      Tensor g = Tensor::empty({1, 8, 130}, DType::f32, be);
      be->gather_rows(rows.reshape({1, 37, 130}), idx, g);
      put("gather_rows", true, g);
      Tensor dsrc = Tensor::zeros({1, 37, 130}, DType::f32, be);
      be->scatter_add_rows(g, idx, dsrc);
      put("scatter_add_rows", true, dsrc);
    }
    {  // casts f32 -> bf16 -> f32
      Tensor h = Tensor::empty({n}, DType::bf16, be), back = Tensor::empty({n}, DType::f32, be);
      be->cast(x, h);
      be->cast(h, back);
      put("cast bf16", true, back);
    }
    {  // reductions: norms, log-softmax, cross-entropy, reduce
      Tensor y = Tensor::empty({37, 130}, DType::f32, be), rstd = Tensor::empty({37}, DType::f32, be);
      be->rms_norm(rows, vec, y, rstd, 1e-5f, 0.0f);
      put("rms_norm", false, y);
      Tensor dx = Tensor::empty({37, 130}, DType::f32, be), dw = Tensor::empty({130}, DType::f32, be);
      be->rms_norm_backward(rows, vec, rstd, rows, dx, dw, 0.0f, false);
      put("rms_norm_backward dx", false, dx);
      put("rms_norm_backward dweight", false, dw);
      Tensor ls = Tensor::empty({37, 130}, DType::f32, be);
      be->log_softmax(rows, ls);
      put("log_softmax", false, ls);
      std::vector<int32_t> t(37);
      for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 31) % 130);
      const Tensor tg = Tensor::from_ints(t, {37}, be);
      Tensor loss = Tensor::empty({37}, DType::f32, be), lse = Tensor::empty({37}, DType::f32, be);
      be->cross_entropy(rows, tg, loss, lse, {});
      put("cross_entropy", false, loss);
      Tensor dl = Tensor::empty({37, 130}, DType::f32, be);
      be->cross_entropy_backward(rows, tg, lse, Tensor::from_vector(std::vector<float>(37, 0.5f), {37}, be), dl, {});
      put("cross_entropy_backward", false, dl);
      Tensor red = Tensor::empty({130}, DType::f32, be);
      be->reduce(rows, red, ReduceParams{ReduceOp::sumsq, 1, 37, 130});
      put("reduce sumsq", false, red);
    }
    return r;
  };
  std::vector<std::vector<Result>> all;
  for (const std::string& isa : paths) all.push_back(run(isa));
  const std::vector<Result>& base = all.back();  // the widest path
  bool portable_differs = false;
  for (size_t p = 0; p + 1 < all.size(); ++p)
    for (size_t i = 0; i < base.size(); ++i) {
      CAPTURE(paths[p]);
      CAPTURE(base[i].what);
      const std::vector<float>&got = all[p][i].v, &want = base[i].v;
      REQUIRE(got.size() == want.size());
      if (paths[p] == "avx2" && base[i].elementwise) {
        CHECK(got == want);  // the same expression per element, FMA on both: the same bits
        continue;
      }
      if (paths[p] == "portable" && has_avx2 && got != all[1][i].v) portable_differs = true;
      int bad = 0;
      for (size_t e = 0; e < got.size(); ++e) {
        const double g = got[e], w = want[e];
        if ((std::isnan(g) && std::isnan(w)) || g == w) continue;
        if (std::fabs(g - w) > 1e-6 + 8 * kEps * std::fabs(w) && bad++ < 3)
          FAIL_CHECK(base[i].what << " element " << e << ": " << paths[p] << " " << g << ", " << paths.back() << " " << w);
      }
    }
  if (has_avx2) CHECK(portable_differs);  // no FMA on the portable path: some product rounds differently
}

// The bf16 kernels written once over their storage type (bf16_bits.hpp: unary and its backward, the gated
// activation and its backward, RMS norm and its backward, the layer norm with [G, D] parameters and its backward,
// RoPE, reduce, the gated residual and its backward) compute in f32 on the widened inputs and round each
// output once: on every ISA path and at 1 and 2 threads, each equals this backend's own f32 kernel on the widened
// inputs, rounded to bf16, bit for bit (NaN, infinities, denormals and ties included; the same ISA path and thread
// count on both sides, so even the norms' lane sums match). A kernel that rounded an intermediate to bf16, read a
// half-written in-place input, or widened inexactly would fail here.
TEST_CASE("cpu: bf16 kernels over storage equal the f32 kernel on the widened inputs, rounded once") {
  cpu();
  const int saved = omp_get_max_threads();
  // Inputs: uniform draws with special values spliced in, rounded to bf16 (the values a bf16 tensor can hold).
  const auto draws = [](int64_t n, uint64_t seed, float lo, float hi, bool specials) {
    std::vector<float> v = host_uniform(n, seed, lo, hi);
    if (specials) {
      const float sp[] = {0.0f,
                          -0.0f,
                          1e-39f,
                          -3e-40f,
                          std::numeric_limits<float>::infinity(),
                          -std::numeric_limits<float>::infinity(),
                          std::numeric_limits<float>::quiet_NaN(),
                          30.0f,
                          -30.0f,
                          100.0f,
                          -100.0f};
      for (size_t i = 0; i < std::size(sp) && 7 * i < v.size(); ++i) v[7 * i] = sp[i];
    }
    return v;
  };
  const auto same_bits = [](const Tensor& got16, const Tensor& want32, const std::string& what) {
    INFO(what);
    const std::vector<float> g = got16.to_floats(), w = want32.to_floats();
    REQUIRE(g.size() == w.size());
    int64_t bad = 0;
    for (size_t i = 0; i < g.size(); ++i) {
      const float r = bf16_to_f32(f32_to_bf16(w[i]));
      if (std::memcmp(&g[i], &r, sizeof r) != 0 && bad++ < 3) INFO(i << ": " << g[i] << " vs " << r);
    }
    CHECK(bad == 0);
  };
  for (const std::string& isa : cpu_isa_paths().names)
    for (const int threads : {1, 2}) {
      omp_set_num_threads(threads);
      CAPTURE(isa);
      CAPTURE(threads);
      BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
      const auto half = [&](const std::vector<float>& v, const Shape& s) {
        return Tensor::from_vector(v, s, be, DType::bf16);
      };
      const auto wide = [&](const Tensor& h) {
        Tensor w = Tensor::empty(h.shape(), DType::f32, be);
        be->cast(h, w);
        return w;
      };
      const auto like16 = [&](const Tensor& t) { return Tensor::empty(t.shape(), DType::bf16, be); };
      const auto like32 = [&](const Tensor& t) { return Tensor::empty(t.shape(), DType::f32, be); };
      const int64_t n = 70001;  // past the parallel grain, with a tail past every vector width
      const Tensor x = half(draws(n, 11, -6.0f, 6.0f, true), {n}), y = half(draws(n, 12, -2.0f, 2.0f, true), {n});
      const Tensor xp = half(draws(n, 13, 0.05f, 4.0f, false), {n});
      const Tensor dy = half(draws(n, 14, -1.0f, 1.0f, true), {n});
      for (const UnaryOp op : {UnaryOp::gelu_tanh, UnaryOp::silu, UnaryOp::gelu, UnaryOp::exp, UnaryOp::tanh,
                               UnaryOp::sigmoid, UnaryOp::relu, UnaryOp::log, UnaryOp::rsqrt, UnaryOp::softcap}) {
        UnaryParams p;
        p.op = op;
        p.alpha = op == UnaryOp::softcap ? 5.0f : p.alpha;
        const Tensor& in = op == UnaryOp::log || op == UnaryOp::rsqrt ? xp : x;
        Tensor o16 = like16(in), o32 = like32(in), d16 = like16(in), d32 = like32(in);
        be->unary(in, o16, p);
        be->unary(wide(in), o32, p);
        same_bits(o16, o32, std::string("unary ") + unary_op_name(op));
        be->unary_backward(in, dy, d16, p);
        be->unary_backward(wide(in), wide(dy), d32, p);
        same_bits(d16, d32, std::string("unary_backward ") + unary_op_name(op));
      }
      for (const Activation act :
           {Activation::silu, Activation::gelu_tanh, Activation::gelu, Activation::relu, Activation::none}) {
        CAPTURE(int(act));
        Tensor o16 = like16(x), o32 = like32(x);
        be->gated_activation(x, y, o16, act);
        be->gated_activation(wide(x), wide(y), o32, act);
        same_bits(o16, o32, "gated_activation");
        // The backward in place, as the autograd op may call it: dgate over gate, dup over up.
        Tensor g16 = x.clone(), u16 = y.clone(), g32 = wide(x), u32 = wide(y);
        be->gated_activation_backward(g16, u16, dy, g16, u16, act);
        be->gated_activation_backward(g32, u32, wide(dy), g32, u32, act);
        same_bits(g16, g32, "gated_activation_backward dgate");
        same_bits(u16, u32, "gated_activation_backward dup");
      }
      {  // RMS norm: rows of 100 (a tail), with and without a weight, an offset (Gemma's 1 + w)
        const int64_t rows = 700, d = 100;
        const Tensor xr = half(draws(rows * d, 21, -3.0f, 3.0f, false), {rows, d});
        const Tensor gr = half(draws(rows * d, 22, -1.0f, 1.0f, false), {rows, d});
        const Tensor w = half(draws(d, 23, 0.5f, 1.5f, false), {d});
        for (const bool with_w : {true, false})
          for (const float off : {0.0f, 1.0f}) {
            CAPTURE(with_w);
            CAPTURE(off);
            const Tensor w16 = with_w ? w : Tensor(), w32 = with_w ? wide(w) : Tensor();
            Tensor y16 = like16(xr), y32 = like32(xr);
            Tensor r16 = Tensor::empty({rows}, DType::f32, be), r32 = Tensor::empty({rows}, DType::f32, be);
            be->rms_norm(xr, w16, y16, r16, 1e-5f, off);
            be->rms_norm(wide(xr), w32, y32, r32, 1e-5f, off);
            same_bits(y16, y32, "rms_norm y");
            CHECK(r16.to_floats() == r32.to_floats());
            Tensor dx16 = like16(xr), dx32 = like32(xr);
            Tensor dw16 = with_w ? like16(w) : Tensor(), dw32 = with_w ? like32(w) : Tensor();
            be->rms_norm_backward(xr, w16, r32, gr, dx16, dw16, off, false);
            be->rms_norm_backward(wide(xr), w32, r32, wide(gr), dx32, dw32, off, false);
            same_bits(dx16, dx32, "rms_norm_backward dx");
            if (with_w) same_bits(dw16, dw32, "rms_norm_backward dweight");
          }
      }
      {  // layer norm with [G, D] parameters (adaLN's modulation): 4 groups of 7 rows of 100; both parameters, one
         // of them, in the backward with and without their gradients
        const int64_t G = 4, per = 7, d = 100;
        const Tensor xr = half(draws(G * per * d, 41, -3.0f, 3.0f, false), {G * per, d});
        const Tensor gr = half(draws(G * per * d, 42, -1.0f, 1.0f, false), {G * per, d});
        const Tensor w = half(draws(G * d, 43, 0.5f, 1.5f, false), {G, d}),
                     b = half(draws(G * d, 44, -1, 1, false), {G, d});
        for (const int which : {0, 1, 2}) {  // both, weight only, bias only
          CAPTURE(which);
          const Tensor w16 = which != 2 ? w : Tensor(), b16 = which != 1 ? b : Tensor();
          const Tensor w32 = w16.defined() ? wide(w16) : Tensor(), b32 = b16.defined() ? wide(b16) : Tensor();
          Tensor y16 = like16(xr), y32 = like32(xr);
          Tensor m16 = Tensor::empty({G * per}, DType::f32, be), r16 = Tensor::empty({G * per}, DType::f32, be);
          Tensor m32 = Tensor::empty({G * per}, DType::f32, be), r32 = Tensor::empty({G * per}, DType::f32, be);
          be->layer_norm(xr, w16, b16, y16, m16, r16, 1e-6f);
          be->layer_norm(wide(xr), w32, b32, y32, m32, r32, 1e-6f);
          same_bits(y16, y32, "grouped layer_norm y");
          CHECK(m16.to_floats() == m32.to_floats());
          CHECK(r16.to_floats() == r32.to_floats());
          Tensor dx16 = like16(xr), dx32 = like32(xr);
          Tensor dw16 = which != 2 ? like16(w) : Tensor(), dw32 = which != 2 ? like32(w) : Tensor();
          Tensor db16 = which != 1 ? like16(b) : Tensor(), db32 = which != 1 ? like32(b) : Tensor();
          be->layer_norm_backward(xr, w16, m32, r32, gr, dx16, dw16, db16);
          be->layer_norm_backward(wide(xr), w32, m32, r32, wide(gr), dx32, dw32, db32);
          same_bits(dx16, dx32, "grouped layer_norm_backward dx");
          if (which != 2) same_bits(dw16, dw32, "grouped layer_norm_backward dweight");
          if (which != 1) same_bits(db16, db32, "grouped layer_norm_backward dbias");
        }
      }
      {  // reduce: column sums of one outer row (a bias gradient: the row split at 2 threads), of 3 outer rows, max,
         // mean, sumsq, and row reductions (inner == 1: through f32 copies)
        const Tensor xr = half(draws(3 * 700 * 130, 51, -3.0f, 3.0f, true), {3 * 700 * 130});
        struct Form {
          int64_t outer, red, inner;
          ReduceOp op;
        };
        for (const Form f :
             {Form{1, 2100, 130, ReduceOp::sum}, Form{3, 700, 130, ReduceOp::sum}, Form{3, 700, 130, ReduceOp::max},
              Form{1, 2100, 130, ReduceOp::mean}, Form{1, 2100, 130, ReduceOp::sumsq},
              Form{2100, 130, 1, ReduceOp::sum}, Form{130, 2100, 1, ReduceOp::min}}) {
          CAPTURE(f.outer);
          CAPTURE(f.inner);
          CAPTURE(int(f.op));
          ReduceParams p;
          p.outer = f.outer;
          p.reduce = f.red;
          p.inner = f.inner;
          p.op = f.op;
          Tensor o16 = Tensor::empty({f.outer * f.inner}, DType::bf16, be), o32 = like32(o16);
          be->reduce(xr, o16, p);
          be->reduce(wide(xr), o32, p);
          same_bits(o16, o32, "reduce");
        }
      }
      {  // the gated residual y = x + gate[g] * f, 5 groups of 6 rows of 130, and its backward
        const int64_t G = 5, per = 6, d = 130;
        const Tensor xr = half(draws(G * per * d, 61, -3.0f, 3.0f, true), {G, per, d});
        const Tensor fr = half(draws(G * per * d, 62, -3.0f, 3.0f, false), {G, per, d});
        const Tensor gr = half(draws(G * per * d, 63, -1.0f, 1.0f, false), {G, per, d});
        const Tensor gate = half(draws(G * d, 64, -2.0f, 2.0f, false), {G, d});
        Tensor y16 = like16(xr), y32 = like32(xr);
        be->gated_residual(xr, fr, gate, y16);
        be->gated_residual(wide(xr), wide(fr), wide(gate), y32);
        same_bits(y16, y32, "gated_residual");
        Tensor df16 = like16(fr), df32 = like32(fr), dg16 = like16(gate), dg32 = like32(gate);
        be->gated_residual_backward(fr, gate, gr, df16, dg16);
        be->gated_residual_backward(wide(fr), wide(gate), wide(gr), df32, dg32);
        same_bits(df16, df32, "gated_residual_backward df");
        same_bits(dg16, dg32, "gated_residual_backward dgate");
      }
      {  // RoPE [B, T, H, D]: a partial rotary_dim (the rest copied), positions [T] and [B, T], forward and inverse
        const Shape s{3, 9, 2, 20};
        const Tensor xr = half(draws(numel_of(s), 31, -3.0f, 3.0f, true), s);
        const Tensor pos_t = Tensor::from_ints({0, 1, 2, 3, 4, 5, 6, 7, 8}, {9}, be);
        std::vector<int32_t> pb(27);
        for (size_t i = 0; i < pb.size(); ++i) pb[i] = int32_t(i * 5 % 17);
        const Tensor pos_bt = Tensor::from_ints(pb, {3, 9}, be);
        for (const bool inverse : {false, true})
          for (const Tensor* pos : {&pos_t, &pos_bt}) {
            RopeParams p;
            p.rotary_dim = 12;
            p.inverse = inverse;
            Tensor o16 = like16(xr), o32 = like32(xr);
            be->rope(xr, *pos, o16, p);
            be->rope(wide(xr), *pos, o32, p);
            same_bits(o16, o32, "rope");
          }
      }
    }
  omp_set_num_threads(saved);
}

TEST_CASE(
    "cpu block cache: a repeated step reuses every block within its peak plus cache_mb, changing sizes stay bounded") {
  constexpr int64_t kMiB = int64_t(1) << 20;
  cpu();  // the plugin, loaded
  BackendPtr be = create_backend("cpu", Options({{"cache_mb", "16"}}, "test"));
  const auto mib = [&](int64_t n) { return Tensor::empty({n * kMiB / 4}, DType::f32, be); };
  // One "step": x and y of 16 MiB, x freed, z of 24 MiB, then everything freed. The peak in use is 40 MiB, but each
  // size's own peak sums to 56: a cache of at most 16 MiB (the old rule) kept one block, one within the peak plus
  // 16 MiB keeps all three.
  const auto step = [&] {
    std::vector<const void*> seen;
    Tensor x = mib(16), y = mib(16);
    seen.push_back(x.data_as<float>());
    seen.push_back(y.data_as<float>());
    x = Tensor();
    Tensor z = mib(24);
    seen.push_back(z.data_as<float>());
    return seen;
  };
  std::vector<const void*> first = step(), second = step();
  std::sort(first.begin(), first.end());
  std::sort(second.begin(), second.end());
  CHECK(first == second);  // the same three blocks (a range unmapped and mapped again may come back at its address,
                           // so what shows that nothing was unmapped is what the cache holds:)
  const int64_t held = be->memory_stats().reserved - be->memory_stats().in_use;
  CHECK(held == 56 * kMiB);
  // Ever new sizes: the footprint stays within the peak in use plus 16 MiB.
  int64_t worst = 0;
  for (int64_t n = 1; n <= 30; ++n) {
    Tensor a = mib(n + 40);
    worst = std::max(worst, be->memory_stats().reserved - be->memory_stats().peak);
  }
  CHECK(worst <= 16 * kMiB);
  // cache_mb = 0: nothing is kept.
  BackendPtr none = create_backend("cpu", Options({{"cache_mb", "0"}}, "test"));
  { Tensor t = Tensor::empty({kMiB}, DType::f32, none); }
  CHECK(none->memory_stats().reserved == none->memory_stats().in_use);
}

TEST_CASE("cpu argmax on every ISA path: the first largest, the first NaN, ties, -inf rows, every row length") {
  cpu();  // the plugin, loaded
  // The reference: a plain scan (the first NaN wins, else the first strictly larger value).
  const auto want = [](const float* row, int64_t d) {
    int32_t at = 0;
    for (int64_t j = 0; j < d; ++j) {
      if (row[j] != row[j]) return int32_t(j);
      if (row[j] > row[at]) at = int32_t(j);
    }
    return at;
  };
  std::mt19937 rng(5);
  std::vector<std::vector<float>> rows;
  for (const int64_t d : {1, 2, 15, 16, 17, 31, 32, 33, 50, 255, 50304}) {
    std::uniform_int_distribution<int> small(-3, 3);  // few distinct values: many ties
    for (int kind = 0; kind < 8; ++kind) {
      std::vector<float> r(static_cast<size_t>(d), 0.0f);
      for (float& v : r) v = float(small(rng));
      const size_t pick = size_t(rng() % uint32_t(d)), other = size_t(rng() % uint32_t(d));
      if (kind == 1) r[pick] = NAN;
      if (kind == 2) r[pick] = NAN, r[other] = NAN;
      if (kind == 3) std::fill(r.begin(), r.end(), -INFINITY);
      if (kind == 4) r[pick] = INFINITY, r[other] = INFINITY;
      if (kind == 5) r[d - 1] = 9.0f;  // the largest in the tail
      if (kind == 6) std::fill(r.begin(), r.end(), NAN);
      if (kind == 7 && d >= 64) r[19] = NAN, r[51] = NAN;  // two NaNs in one lane of 16: the first wins
      rows.push_back(r);
    }
  }
  for (const std::string& isa : cpu_isa_paths().names) {
    CAPTURE(isa);
    BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
    for (const auto& r : rows) {
      const int64_t d = int64_t(r.size());
      CAPTURE(d);
      Tensor x = Tensor::from_vector(r, {1, d}, be), out = Tensor::empty({1}, DType::i32, be);
      be->argmax(x, out);
      CHECK(out.to_ints()[0] == want(r.data(), d));
    }
  }
}

TEST_CASE("cpu cross_entropy on every ISA path: vocabularies across blocks and tails, NaN, +inf and -inf rows") {
  cpu();  // the plugin, loaded
  for (const std::string& isa : cpu_isa_paths().names) {
    CAPTURE(isa);
    BackendPtr be = create_backend("cpu", Options({{"isa", isa}}, "test"));
    for (const int64_t V : {int64_t(5), int64_t(64), int64_t(1000), int64_t(3001)}) {
      CAPTURE(V);
      const int64_t N = 6;
      const Tensor xr = Tensor::uniform({N, V}, -8.0f, 8.0f, 7, uint64_t(V), ref());
      std::vector<int32_t> t(static_cast<size_t>(N), 0);
      for (int64_t i = 0; i < N; ++i) t[size_t(i)] = int32_t((i * 37) % V);
      const Tensor tr = Tensor::from_ints(t, {N}, ref()), dl = Tensor::full({N}, 0.5, DType::f32, ref());
      Tensor lr = Tensor::empty({N}, DType::f32, ref()), sr = Tensor::empty({N}, DType::f32, ref());
      Tensor gr = Tensor::empty({N, V}, DType::f32, ref());
      ref()->cross_entropy(xr, tr, lr, sr, {});
      ref()->cross_entropy_backward(xr, tr, sr, dl, gr, {});
      const Tensor xc = xr.to(be), tc = tr.to(be), dc = dl.to(be);
      Tensor lc = Tensor::empty({N}, DType::f32, be), sc = Tensor::empty({N}, DType::f32, be);
      Tensor gc = Tensor::empty({N, V}, DType::f32, be);
      be->cross_entropy(xc, tc, lc, sc, {});
      be->cross_entropy_backward(xc, tc, sc, dc, gc, {});
      const std::vector<float> want_l = lr.to_floats(), got_l = lc.to_floats(), want_g = gr.to_floats(),
                               got_g = gc.to_floats();
      for (size_t i = 0; i < want_l.size(); ++i) CHECK(got_l[i] == doctest::Approx(want_l[i]).epsilon(1e-5));
      double worst = 0;
      for (size_t i = 0; i < want_g.size(); ++i) worst = std::max(worst, double(std::fabs(got_g[i] - want_g[i])));
      CHECK(worst < 1e-6);
      // A NaN logit propagates to the row's lse; a +inf logit makes it +inf; a row of -inf gives -inf.
      std::vector<float> special(static_cast<size_t>(3 * V), 0.5f);
      special[size_t(V / 2)] = NAN;
      special[size_t(V + V - 1)] = INFINITY;
      std::fill(special.begin() + 2 * V, special.end(), -INFINITY);
      const Tensor xs = Tensor::from_vector(special, {3, V}, be), ts = Tensor::from_ints({0, 0, 0}, {3}, be);
      Tensor ls = Tensor::empty({3}, DType::f32, be), ss = Tensor::empty({3}, DType::f32, be);
      be->cross_entropy(xs, ts, ls, ss, {});
      const std::vector<float> lse = ss.to_floats();
      CHECK(std::isnan(lse[0]));
      CHECK(lse[1] == INFINITY);
      CHECK(lse[2] == -INFINITY);
    }
  }
}
