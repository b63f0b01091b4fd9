// tests/autograd/test_nn_ops.cpp — gradient checks of softmax, norms, indexing, rope, attention, dropout,
// convolutions and cross-entropy (dew/ops.hpp), in double on ref.
#include <cmath>

#include "dew/random.hpp"
#include "gradcheck.hpp"

using namespace gc;
using dew::Tensor;
using V = std::vector<Tensor>;

TEST_CASE("gradcheck softmax and log_softmax") {
  gradcheck([](const V& x) { return dew::softmax(x[0]); }, {rnd({3, 5}, 1, -2, 2)}, "softmax [3,5]");
  gradcheck([](const V& x) { return dew::softmax(x[0]); }, {rnd({2, 3, 4}, 2, -2, 2)}, "softmax [2,3,4]");
  gradcheck([](const V& x) { return dew::log_softmax(x[0]); }, {rnd({3, 5}, 3, -2, 2)}, "log_softmax [3,5]");
  gradcheck([](const V& x) { return dew::log_softmax(x[0]); }, {rnd({2, 3, 4}, 4, -2, 2)}, "log_softmax [2,3,4]");
  // large logits must not overflow (max subtraction)
  gradcheck([](const V& x) { return dew::log_softmax(x[0] * 300.0f); }, {rnd({2, 4}, 5, -1, 1)}, "log_softmax large");
}

TEST_CASE("gradcheck layer_norm") {
  gradcheck([](const V& x) { return dew::layer_norm(x[0], x[1], x[2]); },
            {rnd({3, 6}, 6, -2, 2), rnd({6}, 7), rnd({6}, 8)}, "layer_norm weight+bias");
  gradcheck([](const V& x) { return dew::layer_norm(x[0], Tensor(), Tensor()); }, {rnd({2, 3, 6}, 9, -2, 2)},
            "layer_norm no affine");
  gradcheck([](const V& x) { return dew::layer_norm(x[0], x[1], Tensor()); }, {rnd({3, 6}, 10, -2, 2), rnd({6}, 11)},
            "layer_norm weight only");
  gradcheck([](const V& x) { return dew::layer_norm(x[0], x[1], x[2], 0.5f); },
            {rnd({3, 4}, 12, -2, 2), rnd({4}, 13), rnd({4}, 14)}, "layer_norm large eps");
  // values: zero mean and unit variance per row without affine
  Tensor y = dew::layer_norm(rnd({2, 8}, 15, -3, 3), Tensor(), Tensor(), 0.0f);
  const auto v = y.to_doubles();
  for (int r = 0; r < 2; ++r) {
    double m = 0, s = 0;
    for (int i = 0; i < 8; ++i) m += v[size_t(r * 8 + i)] / 8;
    for (int i = 0; i < 8; ++i) s += (v[size_t(r * 8 + i)] - m) * (v[size_t(r * 8 + i)] - m) / 8;
    CHECK(std::fabs(m) < 1e-14);
    CHECK(s == doctest::Approx(1.0).epsilon(1e-12));
  }
}

TEST_CASE("gradcheck rms_norm (offset 0 and 1)") {
  gradcheck([](const V& x) { return dew::rms_norm(x[0], x[1]); }, {rnd({3, 6}, 16, -2, 2), rnd({6}, 17)}, "rms_norm");
  gradcheck([](const V& x) { return dew::rms_norm(x[0], x[1], 1e-6f, 1.0f); },
            {rnd({2, 3, 6}, 18, -2, 2), rnd({6}, 19)}, "rms_norm offset 1");
  gradcheck([](const V& x) { return dew::rms_norm(x[0], x[1], 0.3f, 0.0f); }, {rnd({3, 4}, 20, -2, 2), rnd({4}, 21)},
            "rms_norm large eps");
  // value: x / sqrt(mean(x^2) + eps) * (w + offset)
  Tensor x = rnd({1, 4}, 22), w = rnd({4}, 23);
  const auto vx = x.to_doubles(), vw = w.to_doubles();
  double ms = 0;
  for (double t : vx) ms += t * t / 4;
  std::vector<double> expect;
  for (int i = 0; i < 4; ++i) expect.push_back(vx[size_t(i)] / std::sqrt(ms + double(1e-6f)) * (vw[size_t(i)] + 1.0));
  check_values(dew::rms_norm(x, w, 1e-6f, 1.0f), expect, 1e-13, "rms_norm offset 1 values");
}

TEST_CASE("gradcheck group_norm") {
  gradcheck([](const V& x) { return dew::group_norm(x[0], 2, x[1], x[2]); },
            {rnd({2, 4, 3, 3}, 24, -2, 2), rnd({4}, 25), rnd({4}, 26)}, "group_norm 2 groups");
  gradcheck([](const V& x) { return dew::group_norm(x[0], 3, Tensor(), Tensor()); }, {rnd({2, 6, 2, 2}, 27, -2, 2)},
            "group_norm no affine");
  gradcheck([](const V& x) { return dew::group_norm(x[0], 1, x[1], x[2]); },
            {rnd({1, 3, 2, 3}, 28, -2, 2), rnd({3}, 29), rnd({3}, 30)}, "group_norm 1 group");
}

TEST_CASE("gradcheck embedding with repeated ids accumulate") {
  Tensor ids = ints({1, 3, 1, 0, 1, 4}, {2, 3});
  gradcheck([ids](const V& x) { return dew::embedding(x[0], ids); }, {rnd({5, 3}, 31)}, "embedding");
  Tensor table = rnd({5, 3}, 32).set_requires_grad(true);
  dew::sum(dew::embedding(table, ids)).backward();
  // row r's gradient = (number of times r occurs) in every column; row 2 never occurs
  check_values(table.grad(), {1, 1, 1, 3, 3, 3, 0, 0, 0, 1, 1, 1, 1, 1, 1}, 0.0, "embedding counts");
  Tensor y = dew::embedding(table, ids);
  CHECK(y.shape() == dew::Shape{2, 3, 3});
}

TEST_CASE("gradcheck gather_rows") {
  Tensor idx = ints({0, 2, 2, 4, 1, 1, 3, 0}, {2, 4});
  gradcheck([idx](const V& x) { return dew::gather_rows(x[0], idx); }, {rnd({2, 5, 3}, 33)}, "gather_rows");
  gradcheck([idx](const V& x) { return dew::gather_rows(x[0], idx); }, {rnd({1, 5, 3}, 34)},
            "gather_rows shared source (Bs = 1)");
}

namespace {
// A host implementation of rotate-half rope for one [B, T, H, D] tensor.
std::vector<double> rope_host(const std::vector<double>& x, const std::vector<int>& pos, bool per_batch, int64_t B,
                              int64_t T, int64_t H, int64_t D, double theta, int64_t rd) {
  std::vector<double> out = x;
  const int64_t half = rd / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const double p = pos[size_t(per_batch ? b * T + t : t)];
      for (int64_t h = 0; h < H; ++h) {
        const size_t base = size_t(((b * T + t) * H + h) * D);
        for (int64_t i = 0; i < half; ++i) {
          const double f = std::pow(theta, -2.0 * double(i) / double(rd));
          const double c = std::cos(p * f), s = std::sin(p * f);
          const double x1 = x[base + size_t(i)], x2 = x[base + size_t(i + half)];
          out[base + size_t(i)] = x1 * c - x2 * s;
          out[base + size_t(i + half)] = x2 * c + x1 * s;
        }
      }
    }
  return out;
}
}  // namespace

TEST_CASE("gradcheck rope (full/partial, positions [T] and [B,T]) and values") {
  Tensor pos_t = ints({3, 0, 7}, {3});
  Tensor pos_bt = ints({0, 1, 2, 5, 9, 4}, {2, 3});
  gradcheck([pos_t](const V& x) { return dew::rope(x[0], pos_t, 10000.0f); }, {rnd({2, 3, 2, 4}, 35)}, "rope full [T]");
  gradcheck([pos_bt](const V& x) { return dew::rope(x[0], pos_bt, 100.0f); }, {rnd({2, 3, 2, 4}, 36)},
            "rope full [B,T]");
  gradcheck([pos_t](const V& x) { return dew::rope(x[0], pos_t, 10000.0f, 4); }, {rnd({2, 3, 2, 6}, 37)},
            "rope partial [T]");
  gradcheck([pos_bt](const V& x) { return dew::rope(x[0], pos_bt, 500.0f, 2); }, {rnd({2, 3, 1, 6}, 38)},
            "rope partial [B,T]");

  Tensor x = rnd({2, 3, 2, 6}, 39);
  // theta is a float parameter: compare with the float value it becomes.
  check_values(dew::rope(x, pos_bt, 500.0f, 4),
               rope_host(x.to_doubles(), {0, 1, 2, 5, 9, 4}, true, 2, 3, 2, 6, 500.0, 4), 1e-12, "rope partial values");
  check_values(dew::rope(x, pos_t, 10000.0f), rope_host(x.to_doubles(), {3, 0, 7}, false, 2, 3, 2, 6, 10000.0, 6),
               1e-12, "rope full values");
}

namespace {
dew::AttentionParams attn(float scale, bool causal, int64_t window = 0, float softcap = 0.0f, int64_t q_offset = 0) {
  dew::AttentionParams p;
  p.scale = scale;
  p.causal = causal;
  p.window = window;
  p.softcap = softcap;
  p.q_offset = q_offset;
  return p;
}
void check_attention(const dew::AttentionParams& p, int64_t B, int64_t T, int64_t S, int64_t Hq, int64_t Hkv, int64_t D,
                     const std::string& what, uint64_t seed) {
  gradcheck(
      [p](const V& x) { return dew::attention(x[0], x[1], x[2], p); },
      {rnd({B, T, Hq, D}, seed, -1.5, 1.5), rnd({B, S, Hkv, D}, seed + 1, -1.5, 1.5), rnd({B, S, Hkv, D}, seed + 2)},
      what);
}
// Attention through ops: scores, mask, softmax, weighted sum, one head at a time (for forward values).
Tensor attention_by_ops(const Tensor& q, const Tensor& k, const Tensor& v, const dew::AttentionParams& p) {
  const int64_t B = q.size(0), T = q.size(1), Hq = q.size(2), S = k.size(1), Hkv = k.size(2);
  std::vector<double> mask(size_t(T * S));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t s = 0; s < S; ++s) {
      const int64_t pt = p.q_offset + t;
      const bool vis = (!p.causal || s <= pt) && (p.window == 0 || pt - s < p.window);
      mask[size_t(t * S + s)] = vis ? 0.0 : -1e300;
    }
  Tensor m = f64(mask, {T, S});
  std::vector<Tensor> heads;
  for (int64_t h = 0; h < Hq; ++h) {
    const int64_t hk = h / (Hq / Hkv);
    Tensor qh = dew::reshape(dew::slice(q, 2, h, h + 1), {B, T, -1});
    Tensor kh = dew::reshape(dew::slice(k, 2, hk, hk + 1), {B, S, -1});
    Tensor vh = dew::reshape(dew::slice(v, 2, hk, hk + 1), {B, S, -1});
    Tensor sc = dew::matmul(qh, kh, false, true) * p.scale;
    if (p.softcap > 0) sc = dew::softcap(sc, p.softcap);
    heads.push_back(dew::reshape(dew::matmul(dew::softmax(sc + m), vh), {B, T, 1, -1}));
  }
  return dew::concat(heads, 2);
}
}  // namespace

TEST_CASE("gradcheck attention") {
  check_attention(attn(0.5f, true), 2, 3, 3, 2, 2, 4, "attention causal", 40);
  check_attention(attn(0.5f, false), 2, 3, 4, 2, 2, 4, "attention non-causal, T<S", 43);
  check_attention(attn(0.5f, true), 1, 3, 3, 4, 2, 4, "attention GQA Hq=4 Hkv=2", 46);
  check_attention(attn(0.5f, true, 2), 1, 5, 5, 2, 1, 4, "attention causal window 2", 49);
  check_attention(attn(0.5f, false, 2), 1, 4, 4, 2, 2, 4, "attention non-causal window 2", 52);
  check_attention(attn(1.5f, true, 0, 1.0f), 2, 3, 3, 2, 2, 4, "attention softcap 1", 55);
  check_attention(attn(0.5f, true, 0, 0.0f, 2), 2, 2, 4, 2, 1, 4, "attention q_offset 2, T=2 S=4", 58);
  check_attention(attn(0.5f, true, 3, 2.0f, 1), 1, 3, 4, 4, 2, 2, "attention all features", 61);
}

TEST_CASE("attention forward values against a composition of ops") {
  const std::vector<std::pair<dew::AttentionParams, std::string>> cases = {
      {attn(0.5f, true), "causal"},
      {attn(0.5f, false), "non-causal"},
      {attn(0.5f, true, 2), "window 2"},
      {attn(1.5f, true, 0, 1.0f), "softcap"},
      {attn(0.5f, true, 0, 0.0f, 2), "q_offset 2"},
  };
  for (const auto& [p, name] : cases) {
    const int64_t T = p.q_offset ? 2 : 4;
    Tensor q = rnd({2, T, 4, 3}, 64, -1.5, 1.5), k = rnd({2, 4, 2, 3}, 65, -1.5, 1.5), v = rnd({2, 4, 2, 3}, 66);
    check_close(dew::attention(q, k, v, p), attention_by_ops(q, k, v, p), 1e-12, 1e-12, "attention values " + name);
  }
}

TEST_CASE("attention with a fully masked row (negative q_offset) outputs zeros and finite gradients") {
  // Query 0 sits at position -1: causally it sees no key. The contract: output zeros, lse -inf.
  const auto p = attn(0.5f, true, 0, 0.0f, -1);
  Tensor q = rnd({1, 3, 2, 4}, 67), k = rnd({1, 3, 2, 4}, 68), v = rnd({1, 3, 2, 4}, 69);
  Tensor o = dew::attention(q, k, v, p);
  const auto vo = o.to_doubles();
  for (size_t i = 0; i < 8; ++i) CHECK(vo[i] == 0.0);
  for (double t : vo) CHECK(std::isfinite(t));
  check_attention(p, 1, 3, 3, 2, 2, 4, "attention fully masked row", 67);
}

TEST_CASE("dropout: the gradient equals the mask") {
  const float p = 0.3f;
  const uint64_t seed = 42, stream = 7, offset = 5;
  Tensor x = rnd_away({4, 5}, 70, 0.2, 1.0).set_requires_grad(true);
  Tensor y = dew::dropout(x, p, seed, stream, offset);
  Tensor r = rnd({4, 5}, 71);
  dew::sum(dew::mul(y, r)).backward();
  // mask from the Philox contract (dew/backend.hpp, DropoutParams)
  std::vector<double> mask, expect_y, expect_g;
  const auto vx = x.to_doubles(), vr = r.to_doubles();
  int kept = 0;
  for (int64_t i = 0; i < 20; ++i) {
    const bool keep = dew::philox::uniform(seed, stream, uint64_t(offset + i)) >= p;
    kept += keep;
    const double m = keep ? double(1.0f / (1.0f - p)) : 0.0;
    mask.push_back(m);
    expect_y.push_back(vx[size_t(i)] * m);
    expect_g.push_back(vr[size_t(i)] * m);
  }
  CHECK(kept > 0);
  CHECK(kept < 20);
  check_values(y, expect_y, 1e-7, "dropout values");  // 1/(1-p) may be computed in float or double
  check_values(x.grad(), expect_g, 1e-7, "dropout gradient");
  gradcheck([=](const V& in) { return dew::dropout(in[0], p, seed, stream, offset); }, {rnd({4, 5}, 72)}, "dropout");
  // p = 0 is the identity
  Tensor z = rnd({3}, 73);
  CHECK(dew::dropout(z, 0.0f, 1, 2, 3).same(z));
}

namespace {
dew::Conv2dParams conv(int64_t stride_h, int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t groups,
                       int64_t dil = 1) {
  dew::Conv2dParams p;
  p.stride_h = stride_h;
  p.stride_w = stride_w;
  p.pad_h = pad_h;
  p.pad_w = pad_w;
  p.groups = groups;
  p.dilation_h = p.dilation_w = dil;
  return p;
}
}  // namespace

TEST_CASE("gradcheck conv2d (stride, padding, groups, bias, dilation)") {
  gradcheck([](const V& x) { return dew::conv2d(x[0], x[1], x[2], conv(1, 1, 0, 0, 1)); },
            {rnd({2, 3, 4, 4}, 80), rnd({4, 3, 3, 3}, 81), rnd({4}, 82)}, "conv2d plain with bias");
  gradcheck([](const V& x) { return dew::conv2d(x[0], x[1], x[2], conv(2, 2, 1, 1, 1)); },
            {rnd({2, 3, 5, 5}, 83), rnd({2, 3, 3, 3}, 84), rnd({2}, 85)}, "conv2d stride 2 pad 1");
  gradcheck([](const V& x) { return dew::conv2d(x[0], x[1], x[2], conv(2, 1, 1, 0, 2)); },
            {rnd({2, 4, 5, 4}, 86), rnd({6, 2, 3, 2}, 87), rnd({6}, 88)}, "conv2d groups 2, anisotropic");
  gradcheck([](const V& x) { return dew::conv2d(x[0], x[1], Tensor(), conv(1, 1, 2, 2, 1, 2)); },
            {rnd({1, 2, 5, 5}, 89), rnd({3, 2, 3, 3}, 90)}, "conv2d dilation 2 no bias");
  gradcheck([](const V& x) { return dew::conv2d(x[0], x[1], x[2], conv(1, 1, 1, 1, 4)); },
            {rnd({1, 4, 3, 3}, 91), rnd({4, 1, 3, 3}, 92), rnd({4}, 93)}, "conv2d depthwise");
  gradcheck([](const V& x) { return dew::conv2d(x[0], x[1], x[2], conv(3, 3, 0, 0, 1)); },
            {rnd({1, 2, 8, 7}, 94), rnd({3, 2, 2, 2}, 95), rnd({3}, 96)}, "conv2d stride 3 with a remainder");
}

// A kernel whose extent is one past the padded input has no output position, whatever the stride: under stride 2
// the output length used to come out 1 (the span -1 divided toward zero), and the backends read past x.
TEST_CASE("conv2d refuses a kernel longer than the padded input, under any stride") {
  for (int stride : {1, 2, 3}) {
    CAPTURE(stride);
    CHECK_THROWS_WITH_AS(dew::conv2d(rnd({1, 1, 2, 4}, 97), rnd({1, 1, 3, 3}, 98), Tensor(), conv(stride, 1, 0, 0, 1)),
                         doctest::Contains("larger than padded input"), dew::Error);
  }
  CHECK(dew::conv2d(rnd({1, 1, 3, 4}, 97), rnd({1, 1, 3, 3}, 98), Tensor(), conv(2, 1, 0, 0, 1)).shape() ==
        dew::Shape{1, 1, 1, 2});
}

TEST_CASE("gradcheck conv_transpose2d") {
  gradcheck([](const V& x) { return dew::conv_transpose2d(x[0], x[1], x[2], conv(2, 2, 1, 1, 1), 1, 1); },
            {rnd({2, 4, 3, 3}, 100), rnd({4, 3, 3, 3}, 101), rnd({3}, 102)},
            "conv_transpose2d stride 2 pad 1 outpad 1");
  gradcheck([](const V& x) { return dew::conv_transpose2d(x[0], x[1], Tensor(), conv(1, 1, 0, 0, 1)); },
            {rnd({1, 2, 3, 3}, 103), rnd({2, 3, 2, 2}, 104)}, "conv_transpose2d plain");
  gradcheck([](const V& x) { return dew::conv_transpose2d(x[0], x[1], x[2], conv(2, 1, 0, 1, 2)); },
            {rnd({1, 4, 2, 3}, 105), rnd({4, 2, 3, 3}, 106), rnd({4}, 107)}, "conv_transpose2d groups 2");
}

TEST_CASE("conv_transpose2d is the adjoint of conv2d") {
  // <conv2d(x, w), y> == <x, conv_transpose2d(y, w)> for the same parameters.
  const auto p = conv(2, 2, 1, 1, 2);
  Tensor x = rnd({2, 4, 5, 5}, 108), w = rnd({6, 2, 3, 3}, 109);
  Tensor cx = dew::conv2d(x, w, Tensor(), p);
  Tensor y = rnd(cx.shape(), 110);
  Tensor ty = dew::conv_transpose2d(y, w, Tensor(), p);
  REQUIRE(ty.shape() == x.shape());
  CHECK(dew::sum(dew::mul(cx, y)).item() == doctest::Approx(dew::sum(dew::mul(x, ty)).item()).epsilon(1e-12));
}

namespace dew {
// `ref` as a device would look to core: not host-accessible (every kernel forwarded, host copies through the
// backend's own calls), so ops take their device paths.
class DeviceLikeRef final : public Backend {
 public:
  explicit DeviceLikeRef(BackendPtr inner) : inner_(std::move(inner)) {}
  std::string name() const override { return "ref-as-device"; }
  bool host_accessible() const override { return false; }
  Support supports(Kernel k, DType dtype) const override { return inner_->supports(k, dtype); }
  void synchronize() override { inner_->synchronize(); }
  void* allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void deallocate(void* ptr, size_t bytes) override { inner_->deallocate(ptr, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override { inner_->copy_from_host(dst, src, bytes); }
  void copy_to_host(void* dst, const void* src, size_t bytes) override {
    ++host_reads;
    inner_->copy_to_host(dst, src, bytes);
  }
  void copy_device(void* dst, const void* src, size_t bytes) override { inner_->copy_device(dst, src, bytes); }
#define DEW_TEST_FORWARD_(name, params, args) \
  void name params override { inner_->name args; }
  DEW_KERNEL_TABLE(DEW_TEST_FORWARD_)
#undef DEW_TEST_FORWARD_
  int host_reads = 0;

 private:
  BackendPtr inner_;
};
}  // namespace dew

TEST_CASE("cross_entropy on a device counts its targets there: no host read, the host path's bits") {
  auto dev = std::make_shared<dew::DeviceLikeRef>(ref());
  for (DType dt : {DType::f64, DType::f32}) {
    for (const std::vector<int32_t>& tg :
         {std::vector<int32_t>{1, -100, 3, 0, -100}, std::vector<int32_t>{-100, -100, -100, -100, -100},
          std::vector<int32_t>{0, 1, 2, 3, 0}}) {
      const std::vector<double> init = rnd({5, 4}, 124, -2, 2).to_doubles();
      auto make = [&](const BackendPtr& be) {
        Tensor lg = dew::cast(Tensor::from_host(init.data(), {5, 4}, DType::f64, be), dt).set_requires_grad(true);
        Tensor tt = Tensor::from_host(tg.data(), {5}, DType::i32, be);
        return std::pair{lg, tt};
      };
      auto [lh, th] = make(ref());
      auto [ld, td] = make(dev);
      Tensor host_loss = dew::cross_entropy(lh, th);
      dev->host_reads = 0;
      Tensor dev_loss = dew::cross_entropy(ld, td);
      host_loss.backward();
      dev_loss.backward();
      CHECK(dev->host_reads == 0);  // neither the forward nor the backward read anything back
      CHECK(dev_loss.to_doubles() == host_loss.to_doubles());
      CHECK(ld.grad().to_doubles() == lh.grad().to_doubles());
    }
  }
}

TEST_CASE("token_logprobs: gradcheck and the log-softmax of each target (0 where ignored)") {
  Tensor targets = ints({1, -1, 3, 0, -1, 2}, {6});
  gradcheck([targets](const V& x) { return dew::token_logprobs(x[0], targets, -1); }, {rnd({6, 4}, 124, -3, 3)},
            "token_logprobs");
  Tensor logits = rnd({6, 4}, 125, -3, 3);
  const auto v = logits.to_doubles();
  const int tg[6] = {1, -1, 3, 0, -1, 2};
  std::vector<double> want;
  for (int r = 0; r < 6; ++r) {
    double m = -1e300, s = 0;
    for (int c = 0; c < 4; ++c) m = std::max(m, v[size_t(r * 4 + c)]);
    for (int c = 0; c < 4; ++c) s += std::exp(v[size_t(r * 4 + c)] - m);
    want.push_back(tg[r] < 0 ? 0.0 : v[size_t(r * 4 + tg[r])] - m - std::log(s));
  }
  const Tensor lp = dew::token_logprobs(logits, targets, -1);
  CHECK(lp.dtype() == dew::DType::f64);
  check_values(lp, want, 1e-13, "token_logprobs values");
  // an ignored row gets no gradient even where its logits would give one
  Tensor lg = rnd({2, 3}, 126).set_requires_grad(true);
  dew::sum(dew::token_logprobs(lg, ints({2, -1}, {2}), -1)).backward();
  const auto g = lg.grad().to_doubles();
  for (int c = 3; c < 6; ++c) CHECK(g[size_t(c)] == 0.0);
  CHECK(g[2] > 0.0);  // d log p_2 / d z_2 = 1 - p_2 (the target), d log p_2 / d z_0 = -p_0
  CHECK(g[0] < 0.0);
  CHECK_THROWS_WITH_AS(dew::token_logprobs(logits, ints({1, 2}, {2})),
                       doctest::Contains("token_logprobs: targets must be i32 [6], got i32 [2]"), dew::Error);
}

TEST_CASE("gradcheck cross_entropy (with ignored rows)") {
  Tensor targets = ints({1, -100, 3, 0, -100}, {5});
  gradcheck([targets](const V& x) { return dew::cross_entropy(x[0], targets); }, {rnd({5, 4}, 120, -2, 2)},
            "cross_entropy ignore -100");
  Tensor t2 = ints({2, 2, 0, 1}, {4});
  gradcheck([t2](const V& x) { return dew::cross_entropy(x[0], t2, 2); }, {rnd({4, 3}, 121, -2, 2)},
            "cross_entropy ignore_index 2");
  // value: mean over the kept rows of lse - logit[target]
  Tensor logits = rnd({5, 4}, 122, -2, 2);
  const auto v = logits.to_doubles();
  const int tg[5] = {1, -100, 3, 0, -100};
  double total = 0;
  for (int r = 0; r < 5; ++r) {
    if (tg[r] < 0) continue;
    double m = -1e300, s = 0;
    for (int c = 0; c < 4; ++c) m = std::max(m, v[size_t(r * 4 + c)]);
    for (int c = 0; c < 4; ++c) s += std::exp(v[size_t(r * 4 + c)] - m);
    total += m + std::log(s) - v[size_t(r * 4 + tg[r])];
  }
  Tensor loss = dew::cross_entropy(logits, targets);
  CHECK(loss.dtype() == dew::DType::f64);
  CHECK(loss.item() == doctest::Approx(total / 3).epsilon(1e-12));
  // all rows ignored: 0, with a zero gradient
  Tensor lg = rnd({2, 3}, 123).set_requires_grad(true);
  Tensor none = dew::cross_entropy(lg, ints({-100, -100}, {2}));
  CHECK(none.item() == 0.0);
  none.backward();
  check_values(lg.grad(), std::vector<double>(6, 0.0), 0.0, "cross_entropy all ignored");
}
