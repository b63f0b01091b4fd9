// tests/backends_cuda/emulation/test_fake_cublaslt.cpp — the CPU stand-in for cuBLASLt (fake_cublaslt.cpp) against
// a naive loop in double written apart from it (its own indexing, TF32 / bf16 rounding by frexp and nearbyint):
// the four transpose pairs with leading dimensions above the rows, a batch of 3 with strided offsets and a
// broadcast operand, row order, the bias / relu / relu+bias epilogues (bias batch stride), beta = 1 in place and
// beta = 0 over NaN, bf16 in and out (nearest-even ties, NaN kept), TF32 and bf16 compute visible against f32,
// matmul.cpp's call sequence on row-major operands, the heuristic's one algorithm and its alignment checks, and
// the refusals. Outputs are written into NaN-filled buffers whose elements outside the matrices must stay NaN.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <cublasLt.h>
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#define OK(expr) REQUIRE((expr) == CUBLAS_STATUS_SUCCESS)

namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
// x rounded to `mantissa` bits after the point (TF32 10, bf16 7), nearest even (nearbyint's default mode).
float round_to(float x, int mantissa) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  int e;
  const double f = std::frexp(double(x), &e);  // [0.5, 1)
  return float(std::ldexp(std::nearbyint(std::ldexp(f, mantissa + 1)), e - mantissa - 1));
}

// A matrix (or batch of them) in a NaN-filled buffer, as cuBLASLt lays it out.
struct Mat {
  cudaDataType type;
  uint64_t rows, cols;
  int64_t ld, stride;
  int32_t batch, order;
  std::vector<float> f;
  std::vector<uint16_t> h;
  std::vector<char> inside;

  Mat(cudaDataType t, uint64_t r, uint64_t c, int64_t ld_, int32_t b = 1, int64_t s = 0, int32_t o = CUBLASLT_ORDER_COL)
      : type(t), rows(r), cols(c), ld(ld_), stride(s), batch(b), order(o) {
    const size_t n = size_t((b - 1) * s + (o == CUBLASLT_ORDER_COL ? ld * int64_t(c) : ld * int64_t(r)));
    if (t == CUDA_R_16BF)
      h.assign(n, 0xFFFF);
    else
      f.assign(n, kNaN);
    inside.assign(n, 0);
    for (int q = 0; q < b; ++q)
      for (uint64_t i = 0; i < r; ++i)
        for (uint64_t j = 0; j < c; ++j) inside[idx(q, i, j)] = 1;
  }
  size_t idx(int64_t q, uint64_t r, uint64_t c) const {
    return size_t(q * stride + int64_t(order == CUBLASLT_ORDER_COL ? r + c * uint64_t(ld) : r * uint64_t(ld) + c));
  }
  double get(int64_t q, uint64_t r, uint64_t c) const {
    return type == CUDA_R_16BF ? from_bits(uint32_t(h[idx(q, r, c)]) << 16) : f[idx(q, r, c)];
  }
  void set(int64_t q, uint64_t r, uint64_t c, float v) {
    if (type == CUDA_R_16BF)
      h[idx(q, r, c)] = uint16_t(bits(round_to(v, 7)) >> 16);
    else
      f[idx(q, r, c)] = v;
  }
  void fill(std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (int q = 0; q < batch; ++q)
      for (uint64_t i = 0; i < rows; ++i)
        for (uint64_t j = 0; j < cols; ++j) set(q, i, j, u(rng));
  }
  void* data() { return type == CUDA_R_16BF ? static_cast<void*>(h.data()) : static_cast<void*>(f.data()); }
  bool outside_untouched() const {
    for (size_t i = 0; i < inside.size(); ++i)
      if (!inside[i] && (type == CUDA_R_16BF ? h[i] != 0xFFFF : !std::isnan(f[i]))) return false;
    return true;
  }
};

struct Gemm {
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cublasOperation_t ta = CUBLAS_OP_N, tb = CUBLAS_OP_N;
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  float alpha = 1.0f, beta = 0.0f;
};

cublasLtMatrixLayout_t layout(const Mat& m) {
  cublasLtMatrixLayout_t l;
  OK(cublasLtMatrixLayoutCreate(&l, m.type, m.rows, m.cols, m.ld));
  if (m.order != CUBLASLT_ORDER_COL)
    OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_ORDER, &m.order, sizeof m.order));
  if (m.batch > 1) {
    OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &m.batch, sizeof m.batch));
    OK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &m.stride, sizeof m.stride));
  }
  return l;
}

// D = epilogue(alpha op(A) op(B) + beta C): descriptors, the heuristic, the call; C may be &D or null.
cublasStatus_t gemm(const Gemm& g, Mat& A, Mat& B, Mat* C, Mat& D, Mat* bias = nullptr) {
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulPreference_t pref;
  OK(cublasLtCreate(&lt));
  OK(cublasLtMatmulDescCreate(&desc, g.compute, CUDA_R_32F));
  OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &g.ta, sizeof g.ta));
  OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &g.tb, sizeof g.tb));
  OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &g.epilogue, sizeof g.epilogue));
  if (bias) {
    const int32_t type = bias->type;
    const void* p = bias->data();
    OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &type, sizeof type));
    OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &p, sizeof p));
    OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_BATCH_STRIDE, &bias->stride, sizeof(int64_t)));
  }
  cublasLtMatrixLayout_t la = layout(A), lb = layout(B), ld = layout(D), lc = C && C != &D ? layout(*C) : ld;
  OK(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t ws = 1 << 20;
  OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
  const cublasLtMatmulPreferenceAttributes_t align_attr[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  Mat* operands[4] = {&A, &B, C ? C : &D, &D};
  for (int i = 0; i < 4; ++i) {  // as matmul.cpp: what the pointer and the batch stride guarantee
    const Mat& x = *operands[i];
    const uint64_t bytes = uint64_t(x.stride) * (x.type == CUDA_R_16BF ? 2 : 4);
    const uint64_t word = reinterpret_cast<uintptr_t>(operands[i]->data()) | bytes | 256u;
    const uint32_t al = uint32_t(word & (~word + 1));
    OK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al, sizeof al));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  OK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, ld, pref, 1, &result, &found));
  REQUIRE(found == 1);
  REQUIRE(result.state == CUBLAS_STATUS_SUCCESS);
  REQUIRE(result.workspaceSize == 0);
  const cublasStatus_t s = cublasLtMatmul(lt, desc, &g.alpha, A.data(), la, B.data(), lb, &g.beta,
                                          C ? C->data() : nullptr, lc, D.data(), ld, &result.algo, nullptr, 0, nullptr);
  if (lc != ld) cublasLtMatrixLayoutDestroy(lc);
  for (cublasLtMatrixLayout_t l : {la, lb, ld}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  return s;
}

// Every element of D against the loop in double; `mantissa` (10 or 7) rounds the operands first. C: C's values
// before the call (a copy when in place).
void expect(const Gemm& g, const Mat& A, const Mat& B, const Mat* C, const Mat* bias, const Mat& D, int mantissa = 0) {
  const bool ta = g.ta == CUBLAS_OP_T, tb = g.tb == CUBLAS_OP_T;
  const uint64_t k = ta ? A.rows : A.cols;
  int bad = 0;
  double first_got = 0, first_want = 0;
  for (int q = 0; q < D.batch; ++q)
    for (uint64_t i = 0; i < D.rows; ++i)
      for (uint64_t j = 0; j < D.cols; ++j) {
        double sum = 0, mag = 0;
        for (uint64_t l = 0; l < k; ++l) {
          double a = ta ? A.get(q, l, i) : A.get(q, i, l), b = tb ? B.get(q, j, l) : B.get(q, l, j);
          if (mantissa) a = round_to(float(a), mantissa), b = round_to(float(b), mantissa);
          sum += a * b;
          mag += std::fabs(a * b);
        }
        double want = g.alpha * sum;
        mag *= std::fabs(g.alpha);
        if (g.beta != 0.0f) want += g.beta * C->get(q, i, j), mag += std::fabs(g.beta * C->get(q, i, j));
        if (bias) want += bias->get(q, i, 0), mag += std::fabs(bias->get(q, i, 0));
        if (g.epilogue & CUBLASLT_EPILOGUE_RELU) want = want > 0 ? want : 0;
        const double got = D.get(q, i, j);
        const double tol = 1e-6 * mag + (D.type == CUDA_R_16BF ? std::ldexp(std::fabs(want), -8) : 0.0);
        if (!(std::fabs(got - want) <= tol) && bad++ == 0) first_got = got, first_want = want;
      }
  CAPTURE(first_got);
  CAPTURE(first_want);
  CHECK(bad == 0);
  CHECK(D.outside_untouched());
}

}  // namespace

TEST_CASE("the four transpose pairs, leading dimensions above the rows") {
  std::mt19937 rng(1);
  const uint64_t m = 5, n = 7, k = 6;
  for (cublasOperation_t ta : {CUBLAS_OP_N, CUBLAS_OP_T})
    for (cublasOperation_t tb : {CUBLAS_OP_N, CUBLAS_OP_T}) {
      CAPTURE(int(ta));
      CAPTURE(int(tb));
      const uint64_t ar = ta == CUBLAS_OP_T ? k : m, ac = ta == CUBLAS_OP_T ? m : k;
      const uint64_t br = tb == CUBLAS_OP_T ? n : k, bc = tb == CUBLAS_OP_T ? k : n;
      Mat A(CUDA_R_32F, ar, ac, int64_t(ar) + 3), B(CUDA_R_32F, br, bc, int64_t(br) + 2),
          D(CUDA_R_32F, m, n, int64_t(m) + 1);
      A.fill(rng);
      B.fill(rng);
      Gemm g;
      g.ta = ta, g.tb = tb, g.alpha = 0.75f;
      OK(gemm(g, A, B, nullptr, D));
      expect(g, A, B, nullptr, nullptr, D);
    }
}

TEST_CASE("a batch of 3 with strided offsets, a broadcast operand and row order") {
  std::mt19937 rng(2);
  Mat A(CUDA_R_32F, 4, 6, 5, 3, 5 * 6 + 7), B(CUDA_R_32F, 6, 3, 6, 3, 0), D(CUDA_R_32F, 4, 3, 4, 3, 4 * 3 + 2);
  A.fill(rng);
  B.fill(rng);
  Gemm g;
  OK(gemm(g, A, B, nullptr, D));
  expect(g, A, B, nullptr, nullptr, D);
  Mat Ar(CUDA_R_32F, 4, 6, 8, 3, 4 * 8 + 1, CUBLASLT_ORDER_ROW), Dr(CUDA_R_32F, 4, 3, 3, 3, 12, CUBLASLT_ORDER_ROW);
  Ar.fill(rng);
  OK(gemm(g, Ar, B, nullptr, Dr));
  expect(g, Ar, B, nullptr, nullptr, Dr);
}

TEST_CASE("the bias, relu and relu + bias epilogues") {
  std::mt19937 rng(3);
  Mat A(CUDA_R_32F, 9, 8, 9, 2, 9 * 8), B(CUDA_R_32F, 8, 5, 8, 2, 8 * 5);
  Mat bias(CUDA_R_32F, 9, 1, 9, 2, 11);  // one per row of D, its own per batch
  A.fill(rng);
  B.fill(rng);
  bias.fill(rng);
  for (cublasLtEpilogue_t e : {CUBLASLT_EPILOGUE_BIAS, CUBLASLT_EPILOGUE_RELU, CUBLASLT_EPILOGUE_RELU_BIAS}) {
    CAPTURE(int(e));
    Mat D(CUDA_R_32F, 9, 5, 9, 2, 9 * 5);
    Gemm g;
    g.epilogue = e, g.alpha = 1.5f;
    const bool with_bias = e & CUBLASLT_EPILOGUE_BIAS;
    OK(gemm(g, A, B, nullptr, D, with_bias ? &bias : nullptr));
    expect(g, A, B, nullptr, with_bias ? &bias : nullptr, D);
    int zeros = 0;
    for (float v : D.f) zeros += v == 0.0f;
    CHECK((zeros > 5) == bool(e & CUBLASLT_EPILOGUE_RELU));
  }
}

TEST_CASE("beta = 1 accumulates in place, beta = 0 reads no C") {
  std::mt19937 rng(4);
  Mat A(CUDA_R_32F, 6, 4, 6), B(CUDA_R_32F, 4, 5, 4), D(CUDA_R_32F, 6, 5, 7);
  A.fill(rng);
  B.fill(rng);
  D.fill(rng);
  const Mat before = D;
  Gemm g;
  g.beta = 1.0f, g.alpha = -0.5f;
  OK(gemm(g, A, B, &D, D));
  expect(g, A, B, &before, nullptr, D);
  Mat fresh(CUDA_R_32F, 6, 5, 7);  // all NaN: beta = 0 must not read it
  g.beta = 0.0f;
  OK(gemm(g, A, B, &fresh, fresh));
  expect(g, A, B, nullptr, nullptr, fresh);
}

TEST_CASE("bf16 in and out: nearest-even ties, NaN kept quiet, f32 out, bf16 bias") {
  std::mt19937 rng(5);
  Mat A(CUDA_R_16BF, 7, 9, 8, 2, 8 * 9), B(CUDA_R_16BF, 5, 9, 5, 2, 5 * 9), D(CUDA_R_16BF, 7, 5, 7, 2, 7 * 5);
  Mat bias(CUDA_R_16BF, 7, 1, 7), D32(CUDA_R_32F, 7, 5, 7, 2, 7 * 5);
  A.fill(rng);
  B.fill(rng);
  bias.fill(rng);
  Gemm g;
  g.tb = CUBLAS_OP_T, g.epilogue = CUBLASLT_EPILOGUE_BIAS;
  OK(gemm(g, A, B, nullptr, D, &bias));
  expect(g, A, B, nullptr, &bias, D);
  g.epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  OK(gemm(g, A, B, nullptr, D32));
  expect(g, A, B, nullptr, nullptr, D32);
  // 1 + 2^-8 ties between 1 and 1 + 2^-7: even is 1; 1 + 3 * 2^-8 ties between 1 + 2^-7 and 1 + 2^-6: even is the
  // latter. A NaN operand gives a quiet NaN.
  const float a_values[3] = {std::ldexp(1.0f, -8), std::ldexp(3.0f, -8), kNaN}, want[3] = {1.0f, 1.015625f, kNaN};
  for (int t = 0; t < 3; ++t) {
    Mat a(CUDA_R_16BF, 1, 2, 1), b(CUDA_R_16BF, 2, 1, 2), d(CUDA_R_16BF, 1, 1, 1);
    a.set(0, 0, 0, 1.0f), a.set(0, 0, 1, a_values[t]), b.set(0, 0, 0, 1.0f), b.set(0, 1, 0, 1.0f);
    OK(gemm(Gemm{}, a, b, nullptr, d));
    if (t < 2) CHECK(d.get(0, 0, 0) == want[t]);
    if (t == 2) CHECK((d.h[0] & 0x7FC0) == 0x7FC0);
  }
}

TEST_CASE("TF32 and bf16 compute round f32 operands to nearest even") {
  // Scalars: (TF32) 1 + 2^-11 -> 1, 1 + 3 * 2^-11 -> 1 + 2^-9; (bf16) 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6.
  struct Scalar {
    cublasComputeType_t compute;
    float x, want;
  } scalars[] = {{CUBLAS_COMPUTE_32F_FAST_TF32, 1.0f + std::ldexp(1.0f, -11), 1.0f},
                 {CUBLAS_COMPUTE_32F_FAST_TF32, 1.0f + std::ldexp(3.0f, -11), 1.0f + std::ldexp(1.0f, -9)},
                 {CUBLAS_COMPUTE_32F_FAST_16BF, 1.0f + std::ldexp(1.0f, -8), 1.0f},
                 {CUBLAS_COMPUTE_32F_FAST_16BF, 1.0f + std::ldexp(3.0f, -8), 1.0f + std::ldexp(1.0f, -6)},
                 {CUBLAS_COMPUTE_32F, 1.0f + std::ldexp(1.0f, -11), 1.0f + std::ldexp(1.0f, -11)}};
  for (const Scalar& s : scalars) {
    Mat a(CUDA_R_32F, 1, 1, 1), b(CUDA_R_32F, 1, 1, 1), d(CUDA_R_32F, 1, 1, 1);
    a.f[0] = s.x, b.f[0] = 1.0f;
    Gemm g;
    g.compute = s.compute;
    OK(gemm(g, a, b, nullptr, d));
    CHECK(d.f[0] == s.want);
  }
  std::mt19937 rng(6);
  Mat A(CUDA_R_32F, 8, 16, 8), B(CUDA_R_32F, 16, 8, 16), tf32(CUDA_R_32F, 8, 8, 8), bf(CUDA_R_32F, 8, 8, 8),
      f32(CUDA_R_32F, 8, 8, 8);
  A.fill(rng);
  B.fill(rng);
  Gemm g;
  OK(gemm(g, A, B, nullptr, f32));
  g.compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  OK(gemm(g, A, B, nullptr, tf32));
  expect(g, A, B, nullptr, nullptr, tf32, 10);
  g.compute = CUBLAS_COMPUTE_32F_FAST_16BF;
  OK(gemm(g, A, B, nullptr, bf));
  expect(g, A, B, nullptr, nullptr, bf, 7);
  double tf32_off = 0, bf_off = 0;
  for (size_t i = 0; i < f32.f.size(); ++i)
    tf32_off = std::fmax(tf32_off, std::fabs(tf32.f[i] - f32.f[i])),
    bf_off = std::fmax(bf_off, std::fabs(bf.f[i] - f32.f[i]));
  CHECK(tf32_off > 1e-5);  // visible: f32 would agree to ~1e-7
  CHECK(bf_off > 2 * tf32_off);
}

TEST_CASE("matmul.cpp's call sequence: row-major out = a b + bias as out^T = b^T a^T") {
  std::mt19937 rng(7);
  const int64_t m = 6, n = 5, k = 4;
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(m * k), b(k * n), bias(n + 1), out(m * n, kNaN);  // bias: room for one off by 4 bytes
  for (std::vector<float>* v : {&a, &b, &bias})
    for (float& x : *v) x = u(rng);
  cublasLtHandle_t lt;
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulPreference_t pref;
  OK(cublasLtCreate(&lt));
  OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
  const cudaDataType_t bias_type = CUDA_R_32F;
  OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
  OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type));
  OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, n, k, n));  // dew b
  OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, k, m, k));  // dew a
  OK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, n, m, n));
  OK(cublasLtMatmulPreferenceCreate(&pref));
  const uint32_t al = 16;
  OK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al, sizeof al));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  OK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &result, &found));
  REQUIRE(found == 1);
  const void* bp = bias.data();
  OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
  const float alpha = 1, beta = 0;
  OK(cublasLtMatmul(lt, desc, &alpha, b.data(), la, a.data(), lb, &beta, out.data(), lc, out.data(), lc, &result.algo,
                    nullptr, 0, nullptr));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double want = bias[size_t(j)];
      for (int64_t l = 0; l < k; ++l) want += double(a[size_t(i * k + l)]) * b[size_t(l * n + j)];
      CHECK(out[size_t(i * n + j)] == doctest::Approx(want).epsilon(1e-6));
    }

  // The alignment the algorithm was chosen for: the bias pointer was NULL (any) when the heuristic ran, so a bias
  // 4 bytes off 16 is refused; so is an A below the preference's 16 bytes.
  bp = bias.data() + 1;
  OK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
  std::vector<float> b_big(b.size() + 8, 0.0f);
  CHECK(cublasLtMatmul(lt, desc, &alpha, b.data(), la, a.data(), lb, &beta, out.data(), lc, out.data(), lc,
                       &result.algo, nullptr, 0, nullptr) == CUBLAS_STATUS_NOT_SUPPORTED);
  OK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &result, &found));  // now sees that bias
  OK(cublasLtMatmul(lt, desc, &alpha, b.data(), la, a.data(), lb, &beta, out.data(), lc, out.data(), lc, &result.algo,
                    nullptr, 0, nullptr));
  const float* b_off = reinterpret_cast<const float*>((reinterpret_cast<uintptr_t>(b_big.data()) | 15) + 1) + 1;
  CHECK(cublasLtMatmul(lt, desc, &alpha, b_off, la, a.data(), lb, &beta, out.data(), lc, out.data(), lc, &result.algo,
                       nullptr, 0, nullptr) == CUBLAS_STATUS_NOT_SUPPORTED);
  for (cublasLtMatrixLayout_t l : {la, lb, lc}) cublasLtMatrixLayoutDestroy(l);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
}

TEST_CASE("refusals, status names, version") {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t l;
  CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_16F, CUDA_R_32F) == CUBLAS_STATUS_NOT_SUPPORTED);
  CHECK(cublasLtMatrixLayoutCreate(&l, CUDA_R_16F, 2, 2, 2) == CUBLAS_STATUS_NOT_SUPPORTED);
  OK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const int64_t wide = CUBLAS_OP_T;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &wide, sizeof wide) ==
        CUBLAS_STATUS_INVALID_VALUE);
  const cublasOperation_t conj = CUBLAS_OP_C;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &conj, sizeof conj) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  const cublasLtEpilogue_t gelu = CUBLASLT_EPILOGUE_GELU_BIAS;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &gelu, sizeof gelu) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  const int8_t fast = 1;
  CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast) ==
        CUBLAS_STATUS_NOT_SUPPORTED);
  // Shapes that do not fit: op(A) 3 x 4 against op(B) 5 x 2.
  cublasLtHandle_t lt;
  cublasLtMatrixLayout_t la, lb, lc;
  cublasLtMatmulPreference_t pref;
  OK(cublasLtCreate(&lt));
  OK(cublasLtMatrixLayoutCreate(&la, CUDA_R_32F, 3, 4, 3));
  OK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_32F, 5, 2, 5));
  OK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, 3, 2, 3));
  OK(cublasLtMatmulPreferenceCreate(&pref));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 7;
  CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &result, &found) ==
        CUBLAS_STATUS_INVALID_VALUE);
  CHECK(found == 0);
  for (cublasLtMatrixLayout_t x : {la, lb, lc}) cublasLtMatrixLayoutDestroy(x);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  CHECK(std::strcmp(cublasLtGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED") == 0);
  CHECK(std::strcmp(cublasLtGetStatusName(CUBLAS_STATUS_SUCCESS), "CUBLAS_STATUS_SUCCESS") == 0);
  CHECK(cublasLtGetVersion() / 10000 == CUBLAS_VER_MAJOR);
}
