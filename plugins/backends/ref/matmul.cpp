// matmul.cpp — batched GEMM with transposes, alpha/beta, bias and activation epilogue (MatmulParams).
// Invariants: each dot product accumulates in double; with beta == 0 out is never read (so garbage or
// NaN in out does not leak); act != none requires beta == 0; a batch stride of 0 broadcasts an operand.
#include <numbers>

#include "ref_backend.hpp"

namespace dew::ref {

namespace {

double activate(Activation act, double x) {
  switch (act) {
    case Activation::none:
      return x;
    case Activation::relu:
      return std::isnan(x) ? x : (x > 0 ? x : 0.0);
    case Activation::gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::numbers::sqrt2));
    case Activation::gelu_tanh:
      return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
    case Activation::silu:
      return x / (1.0 + std::exp(-x));
  }
  DEW_CHECK(false, "ref.matmul: unknown activation ", int(act));
  return 0;
}

}  // namespace

void RefBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out, const MatmulParams& p) {
  dispatch_float(a.dtype(), Kernel::matmul, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t B = p.batch, M = p.m, N = p.n, K = p.k;
    DEW_CHECK(B >= 1 && M >= 0 && N >= 0 && K >= 0, "ref.matmul: bad sizes batch=", B, " m=", M, " n=", N, " k=", K);
    DEW_CHECK(p.a_batch_stride >= 0 && p.b_batch_stride >= 0, "ref.matmul: negative batch stride");
    DEW_CHECK(p.act == Activation::none || p.beta == 0.0f, "ref.matmul: an activation epilogue requires beta == 0");
    DEW_CHECK(b.dtype() == a.dtype() && out.dtype() == a.dtype(), "ref.matmul: dtypes a=", dtype_name(a.dtype()),
              " b=", dtype_name(b.dtype()), " out=", dtype_name(out.dtype()), " differ");
    DEW_CHECK((B - 1) * p.a_batch_stride + M * K <= a.numel(), "ref.matmul: a (", a.numel(),
              " elements) is too small for batch=", B, " stride=", p.a_batch_stride, " [", M, "x", K, "]");
    DEW_CHECK((B - 1) * p.b_batch_stride + K * N <= b.numel(), "ref.matmul: b (", b.numel(),
              " elements) is too small for batch=", B, " stride=", p.b_batch_stride, " [", K, "x", N, "]");
    expect(out, a.dtype(), B * M * N, Kernel::matmul, "out");
    if (bias.defined()) expect(bias, a.dtype(), N, Kernel::matmul, "bias");

    const T* bias_p = bias.defined() ? bias.data_as<T>() : nullptr;
    const double alpha = p.alpha, beta = p.beta;
    for (int64_t bi = 0; bi < B; ++bi) {
      const T* A = a.data_as<T>() + bi * p.a_batch_stride;
      const T* Bm = b.data_as<T>() + bi * p.b_batch_stride;
      T* C = out.data_as<T>() + bi * M * N;
      for (int64_t i = 0; i < M; ++i) {
        for (int64_t j = 0; j < N; ++j) {
          double acc = 0;
          for (int64_t l = 0; l < K; ++l) {
            const double av = double(p.trans_a ? A[l * M + i] : A[i * K + l]);    // op(A)[i, l]
            const double bv = double(p.trans_b ? Bm[j * K + l] : Bm[l * N + j]);  // op(B)[l, j]
            acc += av * bv;
          }
          double v = alpha * acc + (bias_p ? double(bias_p[j]) : 0.0);
          v = activate(p.act, v);
          if (beta != 0.0) v += beta * double(C[i * N + j]);
          C[i * N + j] = T(v);
        }
      }
    }
  });
}

}  // namespace dew::ref
