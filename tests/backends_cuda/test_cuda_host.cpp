// test_cuda_host.cpp — the cuda backend's host-side code, which runs without a GPU: the probe's answer
// and reason, option parsing, the device choice, supports(), the shape/dtype refusals that happen before
// anything is enqueued, strided-copy/broadcast coalescing and fill's bit patterns. The checks use tensors
// of the `ref` backend (only their shapes and dtypes are looked at).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cuda_runtime.h>
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "cuda_backend.hpp"
#include "dew/registry.hpp"

using namespace dew;
using namespace dew::cuda;

namespace {

BackendPtr ref() {
  static BackendPtr b = [] {
    if (!Registry::global().contains(Backend::kind, "ref")) Registry::global().load(DEW_REF_PLUGIN_PATH);
    return create_backend("ref");
  }();
  return b;
}
Tensor t(const Shape& s, DType dt = DType::f32) { return Tensor::empty(s, dt, ref()); }

// The message of the dew::Error `f` throws ("" when it does not throw).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }
Options opts(const std::string& key, const std::string& value) {
  return Options(std::map<std::string, std::string>{{key, value}});
}

}  // namespace

TEST_CASE("probe: no on a machine where the CUDA runtime sees no device, with the reason") {
  const Support s = probe();
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    CHECK_FALSE(s.ok);
    CHECK_FALSE(s.reason.empty());
    const bool named = contains(s.reason, "driver") || contains(s.reason, "device");
    CHECK_MESSAGE(named, "reason: ", s.reason);
    int driver = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess || driver == 0) CHECK(contains(s.reason, "no CUDA driver"));
  } else if (!s.ok) {  // a device exists: only an old device or a library mismatch may refuse it
    const bool named = contains(s.reason, "compute capability") || contains(s.reason, "cuDNN") ||
                       contains(s.reason, "cuBLASLt") || contains(s.reason, "driver");
    CHECK_MESSAGE(named, "reason: ", s.reason);
  }
  // Computed once: the same answer again.
  CHECK(probe().ok == s.ok);
  CHECK(probe().reason == s.reason);
}

TEST_CASE("options: defaults, the precision names, and refusals naming the key") {
  {
    Options o;
    const CudaOptions c = parse_options(o);
    CHECK(c.device == -1);
    CHECK(c.matmul == Precision::highest);
    CHECK(c.caching_allocator);
    CHECK(c.workspace_mb == 32);
    CHECK(c.flash_attention);
    CHECK(c.f32_attention == CudaOptions::F32Attention::automatic);
  }
  {
    Options o({{"matmul_precision", "high"}, {"device", "1"}, {"allocator", "direct"}, {"workspace_mb", "64"},
               {"attention", "warp"}});
    const CudaOptions c = parse_options(o);
    CHECK(c.matmul == Precision::high);
    CHECK(c.device == 1);
    CHECK_FALSE(c.caching_allocator);
    CHECK(c.workspace_mb == 64);
    CHECK_FALSE(c.flash_attention);
    CHECK(c.f32_attention == CudaOptions::F32Attention::warp);
    CHECK_NOTHROW(o.check_all_used());  // every declared key is read
  }
  CHECK(parse_options(opts("attention", "products")).f32_attention == CudaOptions::F32Attention::products);
  CHECK(parse_options(opts("attention", "products")).flash_attention);
  CHECK(parse_options(opts("matmul_precision", "tf32")).matmul == Precision::high);
  CHECK(parse_options(opts("matmul_precision", "medium")).matmul == Precision::medium);
  CHECK(parse_options(opts("matmul_precision", "bf16")).matmul == Precision::medium);
  CHECK(std::string(precision_name(Precision::medium)) == "medium");
  for (auto [key, value] : {std::pair{"matmul_precision", "fast"}, std::pair{"device", "-2"},
                            std::pair{"allocator", "pool"}, std::pair{"workspace_mb", "0"},
                            std::pair{"attention", "flash"}}) {
    CAPTURE(key);
    try {
      parse_options(opts(key, value));
      FAIL("accepted ", key, " = ", value);
    } catch (const Error& e) {
      CHECK(e.kind() == ErrorKind::usage);
      CHECK(contains(e.what(), key));
    }
  }
}

TEST_CASE("device choice: explicit index, local rank from the launcher, refusal past the count") {
  unsetenv("LOCAL_RANK");
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
  unsetenv("MPI_LOCALRANKID");
  unsetenv("SLURM_LOCALID");
  CHECK(pick_device(-1, 4) == 0);
  CHECK(pick_device(2, 4) == 2);
  CHECK(contains(error_of([] { pick_device(4, 4); }), "only 4 device"));
  CHECK(contains(error_of([] { pick_device(-1, 0); }), "no CUDA device"));
  setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
  CHECK(pick_device(-1, 2) == 1);  // 3 mod 2
  setenv("LOCAL_RANK", "2", 1);    // LOCAL_RANK wins
  CHECK(pick_device(-1, 4) == 2);
  CHECK(pick_device(0, 4) == 0);  // an explicit device wins over the launcher
  unsetenv("LOCAL_RANK");
  unsetenv("OMPI_COMM_WORLD_LOCAL_RANK");
}

TEST_CASE("supports: f32 and bf16 compute, every dtype for data movement, reasons otherwise") {
  for (Kernel k : {Kernel::matmul, Kernel::attention, Kernel::conv2d, Kernel::adamw_update, Kernel::rms_norm}) {
    CHECK(support_of(k, DType::f32).ok);
    CHECK(support_of(k, DType::bf16).ok);
    const Support f64 = support_of(k, DType::f64);
    CHECK_FALSE(f64.ok);
    CHECK(contains(f64.reason, "ref"));
    CHECK_FALSE(support_of(k, DType::f16).ok);
    CHECK_FALSE(support_of(k, DType::i32).ok);
  }
  for (Kernel k : {Kernel::fill, Kernel::cast, Kernel::strided_copy, Kernel::gather_rows})
    for (DType dt : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
      CHECK(support_of(k, dt).ok);
  CHECK_FALSE(support_of(Kernel::random, DType::i32).ok);
  // compute_type throws supports()'s reason.
  const std::string msg = error_of([] { compute_type(t({4}, DType::f64), Kernel::softmax, "x"); });
  CHECK(contains(msg, "cuda.softmax"));
  CHECK(contains(msg, support_of(Kernel::softmax, DType::f64).reason));
  CHECK(compute_type(t({4}, DType::bf16), Kernel::softmax, "x") == ST::bf16);
}

TEST_CASE("matmul: shape, dtype and epilogue refusals before any device call") {
  MatmulParams p;
  p.m = 4;
  p.n = 5;
  p.k = 3;
  CHECK_NOTHROW(check_matmul(t({4, 3}), t({3, 5}), Tensor(), t({4, 5}), p));
  CHECK(contains(error_of([&] { check_matmul(t({4, 2}), t({3, 5}), Tensor(), t({4, 5}), p); }), "a (8 elements)"));
  CHECK(contains(error_of([&] { check_matmul(t({4, 3}), t({3, 5}), Tensor(), t({4, 6}), p); }), "out"));
  CHECK(contains(error_of([&] { check_matmul(t({4, 3}), t({3, 5}), t({4}), t({4, 5}), p); }), "bias"));
  CHECK(contains(error_of([&] { check_matmul(t({4, 3}), t({3, 5}, DType::bf16), Tensor(), t({4, 5}), p); }), "differ"));
  CHECK(contains(error_of([&] {
                   check_matmul(t({4, 3}, DType::f64), t({3, 5}, DType::f64), Tensor(), t({4, 5}, DType::f64), p);
                 }),
                 "ref"));
  MatmulParams q = p;
  q.act = Activation::gelu;
  q.beta = 1.0f;
  CHECK(contains(error_of([&] { check_matmul(t({4, 3}), t({3, 5}), Tensor(), t({4, 5}), q); }), "beta == 0"));
  MatmulParams r = p;
  r.batch = 3;
  r.a_batch_stride = 12;
  r.b_batch_stride = 0;  // shared b
  CHECK_NOTHROW(check_matmul(t({3, 4, 3}), t({3, 5}), Tensor(), t({3, 4, 5}), r));
  r.b_batch_stride = 15;
  CHECK(contains(error_of([&] { check_matmul(t({3, 4, 3}), t({3, 5}), Tensor(), t({3, 4, 5}), r); }), "b (15"));
}

TEST_CASE("attention, convolution and row-gather shape checks") {
  const AttnDims d = check_attention(t({2, 7, 4, 16}), t({2, 9, 2, 16}), t({2, 9, 2, 8}), Kernel::attention);
  CHECK(d.B == 2);
  CHECK(d.T == 7);
  CHECK(d.S == 9);
  CHECK(d.Hq == 4);
  CHECK(d.Hkv == 2);
  CHECK(d.Dk == 16);
  CHECK(d.Dv == 8);
  CHECK(contains(error_of([] {
                   check_attention(t({2, 7, 3, 16}), t({2, 9, 2, 16}), t({2, 9, 2, 16}), Kernel::attention);
                 }),
                 "not a multiple"));
  CHECK(contains(error_of([] {
                   check_attention(t({1, 2, 1, 320}), t({1, 2, 1, 320}), t({1, 2, 1, 320}), Kernel::attention);
                 }),
                 "256"));
  CHECK(contains(error_of([] {
                   check_attention(t({1, 2, 1, 8}), t({1, 3, 1, 8}), t({1, 2, 1, 8}), Kernel::attention);
                 }),
                 "do not match"));
  // The forward reads a bf16 K/V cache under f32 queries; nothing else mixes dtypes.
  const Shape qs{1, 1, 4, 16}, ks{1, 9, 2, 16};
  CHECK_NOTHROW(check_attention(t(qs), t(ks, DType::bf16), t(ks, DType::bf16), Kernel::attention));
  CHECK(contains(
      error_of([&] { check_attention(t(qs), t(ks, DType::bf16), t(ks, DType::bf16), Kernel::attention_backward); }),
      "one dtype"));
  CHECK(contains(error_of([&] { check_attention(t(qs, DType::bf16), t(ks), t(ks), Kernel::attention); }),
                 "or f32 q over bf16 k and v"));
  CHECK(contains(error_of([&] { check_attention(t(qs), t(ks, DType::bf16), t(ks), Kernel::attention); }), "one dtype"));

  Conv2dParams p;
  p.pad_h = p.pad_w = 1;
  p.stride_h = p.stride_w = 2;
  const ConvDims c = check_conv({2, 4, 9, 9}, t({6, 4, 3, 3}), {2, 6, 5, 5}, p, Kernel::conv2d);
  CHECK(c.OH == 5);
  CHECK(c.OW == 5);
  CHECK(contains(error_of([&] {
                   check_conv({2, 4, 9, 9}, t({6, 4, 3, 3}), {2, 6, 4, 4}, p, Kernel::conv2d);
                 }),
                 "expected [2, 6, 5, 5]"));
  p.groups = 3;
  CHECK(contains(error_of([&] {
                   check_conv({2, 4, 9, 9}, t({6, 4, 3, 3}), {2, 6, 5, 5}, p, Kernel::conv2d);
                 }),
                 "groups"));

  const RowsDims r = check_rows(t({3, 10, 6}), t({3, 4}, DType::i32), t({3, 4, 6}), Kernel::gather_rows);
  CHECK(r.Bs == 3);
  CHECK(r.R == 10);
  CHECK(r.K == 4);
  CHECK(contains(error_of([] {
                   check_rows(t({2, 10, 6}), t({3, 4}, DType::i32), t({3, 4, 6}), Kernel::gather_rows);
                 }),
                 "table batch 2"));
  CHECK(contains(error_of([] { check_rows(t({10, 6}), t({4}), t({4, 6}), Kernel::gather_rows); }), "i32"));
}

TEST_CASE("strided copy: unit axes dropped, contiguous runs merged, bounds and rank checked") {
  StridedCopyParams p;  // a plain contiguous copy of [2, 3, 4]: one run of 24
  p.shape = {2, 3, 4};
  p.src_strides = {12, 4, 1};
  p.dst_strides = {12, 4, 1};
  StridedDesc d = coalesce_copy(p, 24, 24);
  CHECK(d.rank == 1);
  CHECK(d.shape[0] == 24);
  // transpose of the last two axes: [2, 3, 4] -> [2, 4, 3]; the leading axis merges with nothing
  p.dst_strides = {12, 1, 3};
  d = coalesce_copy(p, 24, 24);
  CHECK(d.rank == 3);
  CHECK(d.shape[1] == 3);
  CHECK(d.b[2] == 3);
  // a unit axis disappears
  p.shape = {2, 1, 12};
  p.src_strides = {12, 99, 1};
  p.dst_strides = {12, 77, 1};
  d = coalesce_copy(p, 24, 24);
  CHECK(d.rank == 1);
  CHECK(contains(error_of([&] { coalesce_copy(p, 23, 24); }), "outside"));
  StridedCopyParams wide;  // 9 axes that cannot merge (every stride doubled)
  wide.shape.assign(9, 2);
  int64_t s = 2;
  for (int i = 8; i >= 0; --i, s *= 4) {
    wide.src_strides.insert(wide.src_strides.begin(), s);
    wide.dst_strides.insert(wide.dst_strides.begin(), s);
  }
  CHECK(contains(error_of([&] { coalesce_copy(wide, int64_t(1) << 40, int64_t(1) << 40); }), "non-mergeable"));
}

TEST_CASE("broadcast: numpy strides, merged, refusals") {
  StridedDesc d = broadcast_desc({4, 1, 3}, {3}, {4, 5, 3});
  REQUIRE(d.rank == 3);
  CHECK(d.a[0] == 3);
  CHECK(d.a[1] == 0);
  CHECK(d.a[2] == 1);
  CHECK(d.b[0] == 0);
  CHECK(d.b[1] == 0);
  CHECK(d.b[2] == 1);
  d = broadcast_desc({6, 7}, {6, 7}, {6, 7});  // no broadcast: one run
  CHECK(d.rank == 1);
  CHECK(d.shape[0] == 42);
  d = broadcast_desc({1}, {2, 3}, {2, 3});  // scalar a
  CHECK(d.rank == 1);
  CHECK(d.a[0] == 0);
  CHECK(contains(error_of([] { broadcast_desc({4, 2}, {3}, {4, 3}); }), "does not broadcast"));
}

TEST_CASE("fill patterns: ref's conversions, bit for bit") {
  CHECK(fill_pattern(DType::f32, 1.5) == 0x3FC00000u);
  CHECK(fill_pattern(DType::bf16, 1.0) == 0x3F80u);
  CHECK(fill_pattern(DType::bf16, -2.0) == 0xC000u);
  CHECK(fill_pattern(DType::f16, 1.0) == 0x3C00u);
  CHECK(uint32_t(fill_pattern(DType::i32, -3.7)) == uint32_t(-3));
  CHECK(fill_pattern(DType::u8, 300.0) == 255u);
  CHECK(fill_pattern(DType::u8, -5.0) == 0u);
  CHECK(fill_pattern(DType::i32, std::nan("")) == 0u);
  CHECK(fill_pattern(DType::i32, 1e12) == 0x7FFFFFFFu);
  const double v = 0.1;
  uint64_t bits;
  std::memcpy(&bits, &v, 8);
  CHECK(fill_pattern(DType::f64, 0.1) == bits);
}
