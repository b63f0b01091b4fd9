// tests/backends_cuda/emulation/test_fake_cudnn.cpp — the CPU stand-in for cuDNN (fake_cudnn.cpp) against naive
// loops in double written apart from it (backward data gathers from the input side, as its own formula): forward,
// backward data and backward filter with stride 2, padding 1, dilation 2, groups 2, depthwise, strides over the
// kernel, and all of them at once with different values per axis; beta = 1 accumulation; bf16 in and out (nearest
// even, NaN kept); f32 inputs rounded to TF32 unless CUDNN_FMA_MATH; the adjoint identities
// <conv(x, w), dy> = <x, bwd_data(dy, w)> = <w, bwd_filter(x, dy)>; the refusals. Every operation runs as conv.cpp
// runs it: descriptors, the _v7 query, its math type set back, the workspace size, then the call.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cudnn.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#define OK(expr) REQUIRE((expr) == CUDNN_STATUS_SUCCESS)

namespace {

struct Case {
  const char* what;
  int N, C, H, W, K, R, S, ph, pw, sh, sw, dh, dw, G;
  int OH() const { return (H + 2 * ph - dh * (R - 1) - 1) / sh + 1; }
  int OW() const { return (W + 2 * pw - dw * (S - 1) - 1) / sw + 1; }
  size_t xs() const { return size_t(N) * C * H * W; }
  size_t ws() const { return size_t(K) * (C / G) * R * S; }
  size_t ys() const { return size_t(N) * K * OH() * OW(); }
};

//                        N  C  H   W  K  R  S ph pw sh sw dh dw G
const Case kCases[] = {{"stride2", 2, 3, 9, 10, 4, 3, 3, 0, 0, 2, 2, 1, 1, 1},
                       {"pad1", 2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, 1},
                       {"dilation2", 2, 3, 9, 9, 4, 3, 3, 0, 0, 1, 1, 2, 2, 1},
                       {"groups2", 2, 4, 6, 7, 6, 3, 3, 1, 1, 1, 1, 1, 1, 2},
                       {"depthwise", 1, 4, 6, 6, 8, 3, 3, 1, 1, 1, 1, 1, 1, 4},
                       {"stride_over_kernel", 2, 3, 8, 7, 5, 1, 1, 0, 0, 2, 3, 1, 1, 1},
                       {"all_asymmetric", 2, 4, 11, 9, 6, 3, 2, 1, 2, 2, 1, 2, 3, 2}};

std::vector<double> ref_forward(const Case& c, const std::vector<double>& x, const std::vector<double>& w) {
  const int Cg = c.C / c.G, Kg = c.K / c.G, OH = c.OH(), OW = c.OW();
  std::vector<double> y(c.ys());
  for (int n = 0; n < c.N; ++n)
    for (int k = 0; k < c.K; ++k)
      for (int oh = 0; oh < OH; ++oh)
        for (int ow = 0; ow < OW; ++ow) {
          double sum = 0;
          for (int cl = 0; cl < Cg; ++cl)
            for (int r = 0; r < c.R; ++r)
              for (int s = 0; s < c.S; ++s) {
                const int ih = oh * c.sh - c.ph + r * c.dh, iw = ow * c.sw - c.pw + s * c.dw;
                if (ih >= 0 && ih < c.H && iw >= 0 && iw < c.W)
                  sum +=
                      x[((n * c.C + k / Kg * Cg + cl) * c.H + ih) * c.W + iw] * w[((k * Cg + cl) * c.R + r) * c.S + s];
              }
          y[((n * c.K + k) * OH + oh) * OW + ow] = sum;
        }
  return y;
}

// dx[n, ci, ih, iw]: the outputs (oh, ow) whose window puts tap (r, s) on (ih, iw).
std::vector<double> ref_backward_data(const Case& c, const std::vector<double>& dy, const std::vector<double>& w) {
  const int Cg = c.C / c.G, Kg = c.K / c.G, OH = c.OH(), OW = c.OW();
  std::vector<double> dx(c.xs());
  for (int n = 0; n < c.N; ++n)
    for (int ci = 0; ci < c.C; ++ci)
      for (int ih = 0; ih < c.H; ++ih)
        for (int iw = 0; iw < c.W; ++iw) {
          double sum = 0;
          for (int k = ci / Cg * Kg; k < (ci / Cg + 1) * Kg; ++k)
            for (int r = 0; r < c.R; ++r)
              for (int s = 0; s < c.S; ++s) {
                const int th = ih + c.ph - r * c.dh, tw = iw + c.pw - s * c.dw;
                if (th < 0 || tw < 0 || th % c.sh != 0 || tw % c.sw != 0) continue;
                const int oh = th / c.sh, ow = tw / c.sw;
                if (oh >= OH || ow >= OW) continue;
                sum += dy[((n * c.K + k) * OH + oh) * OW + ow] * w[((k * Cg + ci % Cg) * c.R + r) * c.S + s];
              }
          dx[((n * c.C + ci) * c.H + ih) * c.W + iw] = sum;
        }
  return dx;
}

std::vector<double> ref_backward_filter(const Case& c, const std::vector<double>& x, const std::vector<double>& dy) {
  const int Cg = c.C / c.G, Kg = c.K / c.G, OH = c.OH(), OW = c.OW();
  std::vector<double> dw(c.ws());
  for (int k = 0; k < c.K; ++k)
    for (int cl = 0; cl < Cg; ++cl)
      for (int r = 0; r < c.R; ++r)
        for (int s = 0; s < c.S; ++s) {
          double sum = 0;
          for (int n = 0; n < c.N; ++n)
            for (int oh = 0; oh < OH; ++oh)
              for (int ow = 0; ow < OW; ++ow) {
                const int ih = oh * c.sh - c.ph + r * c.dh, iw = ow * c.sw - c.pw + s * c.dw;
                if (ih >= 0 && ih < c.H && iw >= 0 && iw < c.W)
                  sum +=
                      dy[((n * c.K + k) * OH + oh) * OW + ow] * x[((n * c.C + k / Kg * Cg + cl) * c.H + ih) * c.W + iw];
              }
          dw[((k * Cg + cl) * c.R + r) * c.S + s] = sum;
        }
  return dw;
}

// The descriptors of one convolution, set as conv.cpp sets them.
struct Conv {
  cudnnHandle_t h = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnMathType_t math;
  Conv(const Case& c, cudnnDataType_t t, cudnnMathType_t math) : math(math) {
    OK(cudnnCreate(&h));
    OK(cudnnSetStream(h, nullptr));
    OK(cudnnCreateTensorDescriptor(&x));
    OK(cudnnCreateTensorDescriptor(&y));
    OK(cudnnCreateFilterDescriptor(&w));
    OK(cudnnCreateConvolutionDescriptor(&conv));
    OK(cudnnSetTensor4dDescriptor(x, CUDNN_TENSOR_NCHW, t, c.N, c.C, c.H, c.W));
    OK(cudnnSetTensor4dDescriptor(y, CUDNN_TENSOR_NCHW, t, c.N, c.K, c.OH(), c.OW()));
    OK(cudnnSetFilter4dDescriptor(w, t, CUDNN_TENSOR_NCHW, c.K, c.C / c.G, c.R, c.S));
    OK(cudnnSetConvolution2dDescriptor(conv, c.ph, c.pw, c.sh, c.sw, c.dh, c.dw, CUDNN_CROSS_CORRELATION,
                                       CUDNN_DATA_FLOAT));
    OK(cudnnSetConvolutionGroupCount(conv, c.G));
    OK(cudnnSetConvolutionMathType(conv, math));
  }
  ~Conv() {
    cudnnDestroyConvolutionDescriptor(conv);
    cudnnDestroyFilterDescriptor(w);
    cudnnDestroyTensorDescriptor(y);
    cudnnDestroyTensorDescriptor(x);
    cudnnDestroy(h);
  }
};

template <class Perf>
void check_offer(int n, const Perf& p, const Conv& d) {
  REQUIRE(n == 1);
  CHECK(p.status == CUDNN_STATUS_SUCCESS);
  CHECK(p.memory == 0);
  CHECK(p.determinism == CUDNN_DETERMINISTIC);
  CHECK(p.mathType == d.math);  // the descriptor's: set back, it changes nothing
}

enum class Op { forward, backward_data, backward_filter };

// forward: a = x, b = w, out = y; backward_data: a = w, b = dy, out = dx; backward_filter: a = x, b = dy, out = dw.
void run(const Conv& d, Op op, float alpha, float beta, const void* a, const void* b, void* out) {
  int n = 0;
  size_t ws = 1;
  if (op == Op::forward) {
    cudnnConvolutionFwdAlgoPerf_t p[4];
    OK(cudnnGetConvolutionForwardAlgorithm_v7(d.h, d.x, d.w, d.conv, d.y, 4, &n, p));
    check_offer(n, p[0], d);
    OK(cudnnSetConvolutionMathType(d.conv, p[0].mathType));
    OK(cudnnGetConvolutionForwardWorkspaceSize(d.h, d.x, d.w, d.conv, d.y, p[0].algo, &ws));
    OK(cudnnConvolutionForward(d.h, &alpha, d.x, a, d.w, b, d.conv, p[0].algo, nullptr, 0, &beta, d.y, out));
  } else if (op == Op::backward_data) {
    cudnnConvolutionBwdDataAlgoPerf_t p[4];
    OK(cudnnGetConvolutionBackwardDataAlgorithm_v7(d.h, d.w, d.y, d.conv, d.x, 4, &n, p));
    check_offer(n, p[0], d);
    OK(cudnnSetConvolutionMathType(d.conv, p[0].mathType));
    OK(cudnnGetConvolutionBackwardDataWorkspaceSize(d.h, d.w, d.y, d.conv, d.x, p[0].algo, &ws));
    OK(cudnnConvolutionBackwardData(d.h, &alpha, d.w, a, d.y, b, d.conv, p[0].algo, nullptr, 0, &beta, d.x, out));
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t p[4];
    OK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(d.h, d.x, d.y, d.conv, d.w, 4, &n, p));
    check_offer(n, p[0], d);
    OK(cudnnSetConvolutionMathType(d.conv, p[0].mathType));
    OK(cudnnGetConvolutionBackwardFilterWorkspaceSize(d.h, d.x, d.y, d.conv, d.w, p[0].algo, &ws));
    OK(cudnnConvolutionBackwardFilter(d.h, &alpha, d.x, a, d.y, b, d.conv, p[0].algo, nullptr, 0, &beta, d.w, out));
  }
  CHECK(ws == 0);
}

std::vector<float> uniform(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (float& f : v) f = u(rng);
  return v;
}
std::vector<double> wide(const std::vector<float>& v) { return {v.begin(), v.end()}; }
double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

// f32 results: rounded once from the exact sum, so within half an ulp (2^-24 relative) plus the sums' order.
void check_f32(const std::vector<float>& got, const std::vector<double>& want, const char* what) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO(what, " element ", i, ": got ", got[i], ", want ", want[i]);
    REQUIRE(std::fabs(got[i] - want[i]) <= std::ldexp(std::fabs(want[i]), -24) + 1e-12);
  }
}

float bf16_value(uint16_t b) {
  const uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t bf16_exact(float f) {  // f must have 8 significant bits
  uint32_t u;
  std::memcpy(&u, &f, 4);
  REQUIRE((u & 0xFFFFu) == 0);
  return uint16_t(u >> 16);
}
// Nearest to 8 significant bits, ties to even (the default rounding mode), by scaling instead of by bits.
double round_bf16(double v) {
  if (v == 0) return v;
  int e;
  std::frexp(v, &e);
  return std::ldexp(std::nearbyint(std::ldexp(v, 8 - e)), e - 8);
}

}  // namespace

TEST_CASE("f32 forward, backward data and backward filter against naive loops, beta 0 and 1") {
  std::mt19937 rng(7);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const Case& c : kCases) {
    CAPTURE(c.what);
    Conv d(c, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH);
    const std::vector<float> x = uniform(c.xs(), rng), w = uniform(c.ws(), rng), dy = uniform(c.ys(), rng);
    const std::vector<double> want_y = ref_forward(c, wide(x), wide(w)),
                              want_dx = ref_backward_data(c, wide(dy), wide(w)),
                              want_dw = ref_backward_filter(c, wide(x), wide(dy));
    // beta 0: the outputs hold NaN, which must not be read.
    std::vector<float> y(c.ys(), nan), dx(c.xs(), nan), dw(c.ws(), nan);
    run(d, Op::forward, 1.0f, 0.0f, x.data(), w.data(), y.data());
    run(d, Op::backward_data, 1.0f, 0.0f, w.data(), dy.data(), dx.data());
    run(d, Op::backward_filter, 1.0f, 0.0f, x.data(), dy.data(), dw.data());
    check_f32(y, want_y, "y");
    check_f32(dx, want_dx, "dx");
    check_f32(dw, want_dw, "dw");
    // beta 1: out = 0.5 op + out.
    auto accumulated = [](std::vector<double> want, const std::vector<float>& old) {
      for (size_t i = 0; i < want.size(); ++i) want[i] = 0.5 * want[i] + old[i];
      return want;
    };
    const std::vector<float> y0 = uniform(c.ys(), rng), dx0 = uniform(c.xs(), rng), dw0 = uniform(c.ws(), rng);
    y = y0, dx = dx0, dw = dw0;
    run(d, Op::forward, 0.5f, 1.0f, x.data(), w.data(), y.data());
    run(d, Op::backward_data, 0.5f, 1.0f, w.data(), dy.data(), dx.data());
    run(d, Op::backward_filter, 0.5f, 1.0f, x.data(), dy.data(), dw.data());
    check_f32(y, accumulated(want_y, y0), "y (beta 1)");
    check_f32(dx, accumulated(want_dx, dx0), "dx (beta 1)");
    check_f32(dw, accumulated(want_dw, dw0), "dw (beta 1)");
  }
}

TEST_CASE("the backwards are the adjoints of forward: <conv(x, w), dy> = <x, dx> = <w, dw>") {
  std::mt19937 rng(11);
  for (const Case& c : kCases) {
    CAPTURE(c.what);
    Conv d(c, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH);
    const std::vector<float> x = uniform(c.xs(), rng), w = uniform(c.ws(), rng), dy = uniform(c.ys(), rng);
    std::vector<float> y(c.ys()), dx(c.xs()), dw(c.ws());
    run(d, Op::forward, 1.0f, 0.0f, x.data(), w.data(), y.data());
    run(d, Op::backward_data, 1.0f, 0.0f, w.data(), dy.data(), dx.data());
    run(d, Op::backward_filter, 1.0f, 0.0f, x.data(), dy.data(), dw.data());
    const double a = dot(y, dy), b = dot(x, dx), e = dot(w, dw);
    const double tol = 1e-6 * (std::fabs(a) + 1.0);
    CHECK(std::fabs(a - b) <= tol);
    CHECK(std::fabs(a - e) <= tol);
  }
}

TEST_CASE("bf16 in and out: exact sums rounded to nearest even, beta 1, NaN kept") {
  std::mt19937 rng(3);
  std::uniform_int_distribution<int> q(-64, 64);  // k / 64: exact in bf16, sums exact in f32
  auto values = [&](size_t n) {
    std::vector<double> v(n);
    for (double& e : v) e = q(rng) / 64.0;
    return v;
  };
  auto bits = [](const std::vector<double>& v) {
    std::vector<uint16_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = bf16_exact(float(v[i]));
    return b;
  };
  auto check = [](const std::vector<uint16_t>& got, const std::vector<double>& exact, const std::vector<double>& old,
                  const char* what) {
    for (size_t i = 0; i < got.size(); ++i) {
      INFO(what, " element ", i);
      REQUIRE(double(bf16_value(got[i])) == round_bf16(0.5 * exact[i] + old[i]));
    }
  };
  const Case& c = kCases[6];  // all_asymmetric
  for (cudnnMathType_t math : {CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH}) {
    Conv d(c, CUDNN_DATA_BFLOAT16, math);
    const std::vector<double> x = values(c.xs()), w = values(c.ws()), dy = values(c.ys());
    const std::vector<double> y0 = values(c.ys()), dx0 = values(c.xs()), dw0 = values(c.ws());
    const std::vector<uint16_t> xb = bits(x), wb = bits(w), dyb = bits(dy);
    std::vector<uint16_t> y = bits(y0), dx = bits(dx0), dw = bits(dw0);
    run(d, Op::forward, 0.5f, 1.0f, xb.data(), wb.data(), y.data());
    run(d, Op::backward_data, 0.5f, 1.0f, wb.data(), dyb.data(), dx.data());
    run(d, Op::backward_filter, 0.5f, 1.0f, xb.data(), dyb.data(), dw.data());
    check(y, ref_forward(c, x, w), y0, "y");
    check(dx, ref_backward_data(c, dy, w), dx0, "dx");
    check(dw, ref_backward_filter(c, x, dy), dw0, "dw");
  }
  // The rounding itself, on a 1x1 convolution: 1 + x / 256 with x = 1 (a tie: down to even), 3 (a tie: up to
  // even), 1.5 (above half: up, not truncated), NaN (stays a quiet NaN).
  const Case one{"1x1", 1, 1, 1, 4, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
  Conv d(one, CUDNN_DATA_BFLOAT16, CUDNN_TENSOR_OP_MATH);
  const uint16_t w1 = bf16_exact(1.0f), nan = 0x7FC0;
  const std::vector<uint16_t> x = {bf16_exact(1.0f), bf16_exact(3.0f), bf16_exact(1.5f), nan};
  std::vector<uint16_t> y(4, bf16_exact(1.0f));
  run(d, Op::forward, 1.0f / 256, 1.0f, x.data(), &w1, y.data());
  CHECK(bf16_value(y[0]) == 1.0f);
  CHECK(bf16_value(y[1]) == 1.0f + 1.0f / 64);
  CHECK(bf16_value(y[2]) == 1.0f + 1.0f / 128);
  CHECK((y[3] & 0x7FC0) == 0x7FC0);
}

TEST_CASE("f32 inputs are rounded to TF32 (nearest even) unless the math type is CUDNN_FMA_MATH") {
  const Case one{"1x1", 1, 1, 1, 4, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
  const float u = std::ldexp(1.0f, -12);  // a quarter of TF32's ulp at 1
  const std::vector<float> x = {1 + u, 1 + 2 * u, 1 + 6 * u, 1 + 3 * u}, one_w = {1.0f};
  for (cudnnMathType_t math : {CUDNN_DEFAULT_MATH, CUDNN_TENSOR_OP_MATH, CUDNN_FMA_MATH}) {
    CAPTURE(int(math));
    Conv d(one, CUDNN_DATA_FLOAT, math);
    std::vector<float> y(4);
    run(d, Op::forward, 1.0f, 0.0f, x.data(), one_w.data(), y.data());
    if (math == CUDNN_FMA_MATH) {
      CHECK(y == x);
    } else {  // below half: down; a tie: to even (down, then up); above half: up
      CHECK(y == std::vector<float>{1.0f, 1.0f, 1 + 8 * u, 1 + 4 * u});
    }
    // The weight too: 1 x (1 + u).
    const float x1 = 1.0f, w = 1 + u;
    float y1 = 0;
    Conv d1({"1x1", 1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1}, CUDNN_DATA_FLOAT, math);
    run(d1, Op::forward, 1.0f, 0.0f, &x1, &w, &y1);
    CHECK(y1 == (math == CUDNN_FMA_MATH ? w : 1.0f));
  }
}

TEST_CASE("version, error strings and refusals") {
  CHECK(cudnnGetVersion() == size_t(CUDNN_VERSION));
  CHECK(std::strcmp(cudnnGetErrorString(CUDNN_STATUS_NOT_SUPPORTED), "CUDNN_STATUS_NOT_SUPPORTED") == 0);
  const Case& c = kCases[6];
  Conv d(c, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH);
  // What the fake does not model.
  CHECK(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NHWC, CUDNN_DATA_FLOAT, 1, 1, 1, 1) == CUDNN_STATUS_NOT_SUPPORTED);
  CHECK(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 1, 1, 1) == CUDNN_STATUS_NOT_SUPPORTED);
  CHECK(cudnnSetFilter4dDescriptor(d.w, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NHWC, 1, 1, 1, 1) == CUDNN_STATUS_NOT_SUPPORTED);
  CHECK(cudnnSetConvolution2dDescriptor(d.conv, 0, 0, 1, 1, 1, 1, CUDNN_CONVOLUTION, CUDNN_DATA_FLOAT) ==
        CUDNN_STATUS_NOT_SUPPORTED);
  CHECK(cudnnSetConvolution2dDescriptor(d.conv, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_BFLOAT16) ==
        CUDNN_STATUS_NOT_SUPPORTED);
  CHECK(cudnnSetConvolutionMathType(d.conv, CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) == CUDNN_STATUS_NOT_SUPPORTED);
  // An algorithm that was not offered.
  const std::vector<float> x(c.xs()), w(c.ws());
  std::vector<float> y(c.ys());
  const float one = 1.0f, zero = 0.0f;
  CHECK(cudnnConvolutionForward(d.h, &one, d.x, x.data(), d.w, w.data(), d.conv, CUDNN_CONVOLUTION_FWD_ALGO_FFT,
                                nullptr, 0, &zero, d.y, y.data()) == CUDNN_STATUS_NOT_SUPPORTED);
  // Descriptors that do not fit each other, as cuDNN checks them.
  int n = 0;
  cudnnConvolutionFwdAlgoPerf_t p;
  OK(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, c.N, c.K, c.OH() + 1, c.OW()));
  CHECK(cudnnGetConvolutionForwardAlgorithm_v7(d.h, d.x, d.w, d.conv, d.y, 1, &n, &p) == CUDNN_STATUS_BAD_PARAM);
  CHECK(cudnnConvolutionForward(d.h, &one, d.x, x.data(), d.w, w.data(), d.conv,
                                CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, d.y,
                                y.data()) == CUDNN_STATUS_BAD_PARAM);
  OK(cudnnSetTensor4dDescriptor(d.y, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, c.N, c.K, c.OH(), c.OW()));
  OK(cudnnSetConvolutionGroupCount(d.conv, 3));  // 4 channels in 3 groups
  CHECK(cudnnGetConvolutionForwardAlgorithm_v7(d.h, d.x, d.w, d.conv, d.y, 1, &n, &p) == CUDNN_STATUS_BAD_PARAM);
  OK(cudnnSetConvolutionGroupCount(d.conv, c.G));
  OK(cudnnSetTensor4dDescriptor(d.x, CUDNN_TENSOR_NCHW, CUDNN_DATA_BFLOAT16, c.N, c.C, c.H, c.W));  // x bf16, w f32
  CHECK(cudnnGetConvolutionForwardAlgorithm_v7(d.h, d.x, d.w, d.conv, d.y, 1, &n, &p) == CUDNN_STATUS_BAD_PARAM);
}
