// tests/autograd/test_quantize.cpp — int8 quantized tensors (dew/tensor.hpp; quantize_int8 and dequantize,
// dew/ops.hpp), on ref: the rounding's properties checked element by element on the host (each value within
// half a scale of the original, every nonzero group reaching ±127, scale = absmax / 127, an all-zero group
// scale 1), views carrying exactly their rows' scales, refusals of what would lose the scales, and linear()
// against a quantized weight (ref has no int8 kernel: the core multiplies the dequantized weight) equal to
// linear() on dequantize(weight) bit for bit and close to a double sum on the host.
#include <algorithm>
#include <cmath>
#include <filesystem>

#include "dew/safetensors.hpp"
#include "gradcheck.hpp"

using namespace gc;

namespace {
std::vector<float> host_weights(int64_t rows, int64_t k) {
  std::vector<float> w(size_t(rows * k));
  for (int64_t i = 0; i < rows * k; ++i) w[size_t(i)] = float(std::sin(0.37 * double(i)) * (1.0 + double(i % 7)));
  if (rows > 2 && k >= 64)
    for (int64_t i = 32; i < 64; ++i) w[size_t(2 * k + i)] = 0.0f;  // row 2's second block: all zero
  return w;
}
}  // namespace

TEST_CASE("quantize_int8: values within half a scale, absmax / 127 scales per block, checked on the host") {
  const int64_t rows = 5, k = 96;
  for (const int64_t groups : {int64_t(3), int64_t(1)}) {
    CAPTURE(groups);
    const std::vector<float> w = host_weights(rows, k);
    const Tensor q = dew::quantize_int8(Tensor::from_vector(w, {rows, k}, ref()), groups);
    REQUIRE(q.dtype() == DType::i8);
    REQUIRE(q.quantized());
    CHECK(q.scales().shape() == Shape{rows, groups});
    std::vector<int8_t> raw(size_t(rows * k));
    q.copy_to_host(raw.data());
    const std::vector<float> s = q.scales().to_floats();
    const std::vector<double> v = q.to_doubles();  // dequantized
    const int64_t per = k / groups;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t g = 0; g < groups; ++g) {
        float amax = 0;
        int peak = 0;
        for (int64_t i = g * per; i < (g + 1) * per; ++i) {
          amax = std::max(amax, std::fabs(w[size_t(r * k + i)]));
          peak = std::max(peak, std::abs(int(raw[size_t(r * k + i)])));
        }
        const float sc = s[size_t(r * groups + g)];
        CHECK(sc == (amax > 0 ? amax / 127.0f : 1.0f));
        CHECK(peak == (amax > 0 ? 127 : 0));
        for (int64_t i = g * per; i < (g + 1) * per; ++i) {
          const size_t e = size_t(r * k + i);
          CHECK(std::abs(int(raw[e])) <= 127);
          CHECK(v[e] == double(float(raw[e]) * sc));  // the f32 product
          CHECK(std::fabs(double(raw[e]) * double(sc) - double(w[e])) <= 0.5 * double(sc) * (1 + 1e-6));
        }
      }
  }
  // Refused: a block count that does not divide the row, a non-finite value, an integer or quantized input.
  CHECK_THROWS_AS(dew::quantize_int8(Tensor::from_vector(host_weights(2, 96), {2, 96}, ref()), 5), dew::Error);
  std::vector<float> bad = host_weights(2, 96);
  bad[100] = NAN;
  CHECK_THROWS_AS(dew::quantize_int8(Tensor::from_vector(bad, {2, 96}, ref()), 3), dew::Error);
  CHECK_THROWS_AS(dew::quantize_int8(Tensor::from_ints({1, 2}, {2}, ref()), 1), dew::Error);
  const Tensor q = dew::quantize_int8(Tensor::from_vector(host_weights(2, 96), {2, 96}, ref()), 3);
  CHECK_THROWS_AS(dew::quantize_int8(q, 3), dew::Error);
  CHECK_THROWS_AS(dew::dequantize(Tensor::from_vector(host_weights(2, 96), {2, 96}, ref())), dew::Error);
}

TEST_CASE("quantized views carry their rows' scales, and what would drop them is refused") {
  const int64_t rows = 6, k = 64;
  const Tensor q = dew::quantize_int8(Tensor::from_vector(host_weights(rows, k), {rows, k}, ref()), 2);
  const std::vector<double> all = q.to_doubles();
  const auto rows_of = [&](int64_t a, int64_t b) {
    return std::vector<double>(all.begin() + a * k, all.begin() + b * k);
  };
  const Tensor mid = q.slice0(2, 5);
  REQUIRE(mid.quantized());
  CHECK(mid.scales().shape() == Shape{3, 2});
  CHECK(mid.to_doubles() == rows_of(2, 5));
  CHECK(mid.slice0(1, 2).to_doubles() == rows_of(3, 4));
  const Tensor r3 = q.reshape({2, 3, k});  // the last axis kept: rows stay rows
  REQUIRE(r3.quantized());
  CHECK(r3.to_doubles() == all);
  CHECK(r3.slice0(1, 2).to_doubles() == rows_of(3, 6));
  CHECK(q.detach().to_doubles() == all);
  const Tensor c = q.clone();
  CHECK(c.quantized());
  CHECK(c.scales().data() != q.scales().data());
  CHECK(c.to_doubles() == all);
  CHECK(dew::dequantize(q).to_doubles() == all);
  CHECK(dew::cast(q, DType::f32).to_doubles() == all);  // cast dequantizes
  CHECK_THROWS_AS(q.reshape({rows * k}), dew::Error);   // would mix rows' scales
  CHECK_THROWS_AS(q.reshape({rows, 2, k / 2}), dew::Error);
  Tensor dst = Tensor::empty({rows, k}, DType::i8, ref());
  CHECK_THROWS_AS(dst.copy_(q), dew::Error);  // the raw int8 alone would lose the scales
  const std::string path = "test_quantize_refused.safetensors";
  CHECK_THROWS_AS(dew::write_safetensors(path, {{"w", q}}, {}), dew::Error);  // nor is it exported
  CHECK(!std::filesystem::exists(path));
}

TEST_CASE("linear() against a quantized weight on ref: the dequantized product, close to a double sum") {
  dew::NoGradGuard ng;
  const int64_t m = 3, n = 7, k = 96;
  const std::vector<float> w = host_weights(n, k);
  const Tensor q = dew::quantize_int8(Tensor::from_vector(w, {n, k}, ref()), 3);
  std::vector<float> xv(static_cast<size_t>(m * k)), bv(static_cast<size_t>(n));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = float(std::cos(0.11 * double(i)));
  for (size_t i = 0; i < bv.size(); ++i) bv[i] = 0.1f * float(i);
  const Tensor x = Tensor::from_vector(xv, {m, k}, ref()), b = Tensor::from_vector(bv, {n}, ref());
  const std::vector<double> got = dew::linear(x, q, b).to_doubles();
  CHECK(got == dew::linear(x, dew::dequantize(q), b).to_doubles());
  const std::vector<double> deq = q.to_doubles();
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = bv[size_t(j)];
      for (int64_t l = 0; l < k; ++l) want += double(xv[size_t(i * k + l)]) * deq[size_t(j * k + l)];
      CHECK(std::fabs(got[size_t(i * n + j)] - want) <= 1e-5 * (1 + std::fabs(want)));
    }
  // The weight is the second operand of linear's product, and such a linear records no gradient.
  CHECK_THROWS_AS(dew::matmul(q, x, false, true), dew::Error);
  dew::EnableGradGuard g;
  Tensor xg = x.clone();
  xg.set_requires_grad(true);
  CHECK_THROWS_AS(dew::linear(xg, q, b), dew::Error);
}
