// cuda/matmul.cpp — matmul on cuBLASLt: batched, transposes, alpha/beta, bias and relu fused in the
// epilogue; gelu (erf), gelu_tanh and silu applied by a small kernel after (cuBLASLt's GELU epilogue is
// its own approximation, not dew's contract).
// Row-major dew operands are read as column-major cuBLASLt matrices: out^T [n, m] = op(B)^T op(A)^T, so
// cuBLASLt's "A" is dew's b and its "B" is dew's a, with the transposes carried over unchanged.
// Precision: bf16 tensors run bf16 x bf16 with f32 accumulation; f32 tensors follow the backend option
// matmul_precision: highest = f32 (CUBLAS_COMPUTE_32F), high = TF32 tensor cores, medium = bf16 inputs. The widened
// product (bf16 a and b, f32 out: a weight's gradient under autocast, dew/kernel_contracts.hpp) is the bf16 GEMM with
// f32 C and D, cuBLASLt's bf16 / bf16 / f32 type combination.
// Plans (descriptors, layouts and the heuristic's algorithm) are cached per shape, dtype, epilogue and
// pointer alignment; a batch whose b is shared (stride 0) and whose a batches are contiguous is folded
// into one bigger GEMM (the linear-layer case).
#include <cstdio>

#include "cuda_backend.hpp"

namespace dew::cuda {

struct CudaBackend::MatmulPlan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulPreference_t pref = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool with_bias = false;
  // With the descriptor and layouts set: the preference (workspace bound, the operands' alignments: cuBLASLt's A,
  // B, and C = D) and cuBLASLt's first heuristic choice into algo; the status and the count found, for the
  // caller's message.
  cublasStatus_t choose_algorithm(cublasLtHandle_t lt, uint64_t workspace, uint32_t al_a, uint32_t al_b, uint32_t al_c,
                                  int& found) {
    DEW_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    DEW_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace,
                                                          sizeof workspace));
    DEW_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a, sizeof al_a));
    DEW_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b, sizeof al_b));
    DEW_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    DEW_CUBLAS_CHECK(
        cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t result{};
    found = 0;
    const cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, 1, &result, &found);
    if (hs == CUBLAS_STATUS_SUCCESS && found > 0) algo = result.algo;
    return hs;
  }
  ~MatmulPlan() {
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

// The largest power of two (at most 256) dividing the address and, for batched operands, the stride.
uint32_t alignment(const void* p, int64_t batch_stride_bytes) {
  uint64_t a = reinterpret_cast<uint64_t>(p) | 256u;
  if (batch_stride_bytes > 0) a |= uint64_t(batch_stride_bytes);
  return uint32_t(a & (~a + 1));
}

// The compute type of an f32 product under matmul_precision (top comment).
cublasComputeType_t f32_compute(Precision precision) {
  if (precision == Precision::high) return CUBLAS_COMPUTE_32F_FAST_TF32;
  if (precision == Precision::medium) return CUBLAS_COMPUTE_32F_FAST_16BF;
  return CUBLAS_COMPUTE_32F;
}

void set_layout_batch(cublasLtMatrixLayout_t l, int64_t batch, int64_t stride) {
  if (batch <= 1) return;
  const int32_t count = int32_t(batch);
  DEW_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof count));
  DEW_CUBLAS_CHECK(
      cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof stride));
}

}  // namespace

void CudaBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out, const MatmulParams& p) {
  // Weight-only storage (dew/generate.hpp: f32 activations against a bf16 decode weight; supports(matmul, bf16)
  // lets it through the core unconverted): the weight widened exactly into an f32 temporary, then the f32
  // product. cuBLASLt multiplies A and B of one type; a bf16-weight GEMV that streams half the bytes is not
  // written yet. An int8 weight (supports(matmul, i8) says no) reaches the core's dequantized product instead.
  DEW_CHECK(!b.quantized(), "cuda.matmul: no int8-weight kernel; the core multiplies the dequantized weight");
  if (contracts::is_weight_only_matmul(a, b)) {
    Tensor wide = Tensor::empty(b.shape(), DType::f32, b.backend_ptr());
    cast(b, wide);
    return matmul(a, wide, bias, out, p);
  }
  check_matmul(a, b, bias, out, p);
  const ST t = out.dtype() == DType::bf16 ? ST::bf16 : ST::f32;
  if (p.batch * p.m * p.n == 0) return;
  if (p.k == 0) {  // an empty sum: out = act(bias) (+ beta * out)
    launch_bias_act(stream_, t, out.data(), bias.defined() ? bias.data() : nullptr, p.batch * p.m, p.n, p.act, p.beta);
    return;
  }
  matmul_lt(a, b, bias, out, p);
}

void CudaBackend::matmul_lt(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out, const MatmulParams& p0) {
  MatmulParams p = p0;
  // Shared b, contiguous a batches: one [batch * m, k] x [k, n] product.
  if (p.batch > 1 && p.b_batch_stride == 0 && !p.trans_a && p.a_batch_stride == p.m * p.k) {
    p.m *= p.batch;
    p.batch = 1;
    p.a_batch_stride = 0;
  }
  const bool bf = a.dtype() == DType::bf16;
  const size_t es = dtype_size(a.dtype());
  const bool fuse_relu = p.act == Activation::relu;
  const bool post_act = p.act != Activation::none && !fuse_relu;
  const bool with_bias = bias.defined();
  const cublasLtEpilogue_t epi = with_bias ? (fuse_relu ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_BIAS)
                                           : (fuse_relu ? CUBLASLT_EPILOGUE_RELU : CUBLASLT_EPILOGUE_DEFAULT);
  const cublasComputeType_t compute = bf ? CUBLAS_COMPUTE_32F : f32_compute(opt_.matmul);
  const cudaDataType_t dt = bf ? CUDA_R_16BF : CUDA_R_32F;
  const bool out_bf = out.dtype() == DType::bf16;  // false for f32 products and the widened bf16 one
  const cudaDataType_t out_dt = out_bf ? CUDA_R_16BF : CUDA_R_32F;
  const size_t out_es = dtype_size(out.dtype());

  // cuBLASLt "A" = dew b, "B" = dew a, C/D = out^T (column-major n x m).
  const uint32_t al_a = alignment(b.data(), p.batch > 1 ? p.b_batch_stride * int64_t(es) : 0);
  const uint32_t al_b = alignment(a.data(), p.batch > 1 ? p.a_batch_stride * int64_t(es) : 0);
  const uint32_t al_c = alignment(out.data(), p.batch > 1 ? p.m * p.n * int64_t(out_es) : 0);
  // The heuristic reads the bias pointer's alignment off the descriptor (cublasLt.h, BIAS_POINTER), so the
  // plan is chosen with this call's bias set, and keyed by its alignment: a bias view at an odd offset must not
  // reuse an algorithm picked for an aligned one.
  const uint32_t al_bias = with_bias ? alignment(bias.data(), 0) : 0;
  char key[256];
  std::snprintf(key, sizeof key, "%d%d %lld %lld %lld %lld %lld %lld %d %d %d %d %d %u %u %u %u", int(bf), int(out_bf),
                (long long)p.batch, (long long)p.m, (long long)p.n, (long long)p.k, (long long)p.a_batch_stride,
                (long long)p.b_batch_stride, int(p.trans_a), int(p.trans_b), int(epi), int(compute), int(with_bias),
                al_a, al_b, al_c, al_bias);

  std::lock_guard lock(plan_mu_);
  std::shared_ptr<MatmulPlan>& slot = matmul_plans_[key];
  if (!slot) {
    auto plan = std::make_shared<MatmulPlan>();
    DEW_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
    const cublasOperation_t ta = p.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // on dew's b
    const cublasOperation_t tb = p.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // on dew's a
    DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    if (with_bias) {
      const cudaDataType_t bias_type = dt;
      const void* bp = bias.data();
      DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                      sizeof bias_type));
      DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
    }
    // Stored shapes (column-major rows x cols, leading dimension = rows).
    const uint64_t a_rows = p.trans_b ? uint64_t(p.k) : uint64_t(p.n), a_cols = p.trans_b ? p.n : p.k;
    const uint64_t b_rows = p.trans_a ? uint64_t(p.m) : uint64_t(p.k), b_cols = p.trans_a ? p.k : p.m;
    DEW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->la, dt, a_rows, a_cols, int64_t(a_rows)));
    DEW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, dt, b_rows, b_cols, int64_t(b_rows)));
    DEW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lc, out_dt, uint64_t(p.n), uint64_t(p.m), p.n));
    set_layout_batch(plan->la, p.batch, p.b_batch_stride);
    set_layout_batch(plan->lb, p.batch, p.a_batch_stride);
    set_layout_batch(plan->lc, p.batch, p.m * p.n);
    // No algorithm comes back as CUBLAS_STATUS_NOT_SUPPORTED, not as success with none found: either way the
    // message names the shapes and the status.
    int found = 0;
    const cublasStatus_t hs = plan->choose_algorithm(lt_, lt_workspace_bytes_, al_a, al_b, al_c, found);
    DEW_CHECK(hs == CUBLAS_STATUS_SUCCESS && found > 0, "cuda.matmul: cuBLASLt has no algorithm for ",
              bf ? "bf16" : "f32", " batch=", p.batch, " m=", p.m, " n=", p.n, " k=", p.k, " trans_a=", p.trans_a,
              " trans_b=", p.trans_b, " (", cublasLtGetStatusName(hs), ")");
    plan->with_bias = with_bias;
    slot = std::move(plan);
  }
  MatmulPlan& plan = *slot;
  if (with_bias) {
    const void* bp = bias.data();
    DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof bp));
  }
  const float alpha = p.alpha, beta = p.beta;
  DEW_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, b.data(), plan.la, a.data(), plan.lb, &beta, out.data(),
                                  plan.lc, out.data(), plan.lc, &plan.algo, lt_workspace_, lt_workspace_bytes_,
                                  stream_));
  if (post_act)
    launch_bias_act(stream_, out_bf ? ST::bf16 : ST::f32, out.data(), nullptr, p.batch * p.m, p.n, p.act, 1.0f);
}

// Raw-pointer f32 products (attention_products.cpp): the same row-major -> column-major reading as matmul_lt
// (cuBLASLt's "A" = g.b, its "B" = g.a, D = C^T), with the row strides given as leading dimensions; plans in the
// same cache, keyed by every stride and the pointers' alignments.
void CudaBackend::gemm_f32(const RawGemm& g) {
  if (g.batch <= 0 || g.m <= 0 || g.n <= 0) return;
  DEW_CHECK(g.k > 0, "cuda.gemm_f32: k = ", g.k, " (an empty sum is the caller's to handle)");
  const cublasComputeType_t compute = f32_compute(opt_.matmul);
  const bool batched = g.batch > 1;
  const uint32_t al_a = alignment(g.b, batched ? g.stride_b * 4 : 0);
  const uint32_t al_b = alignment(g.a, batched ? g.stride_a * 4 : 0);
  const uint32_t al_c = alignment(g.c, batched ? g.stride_c * 4 : 0);
  char key[320];
  std::snprintf(key, sizeof key, "raw %lld %lld %lld %lld | %lld %lld %d | %lld %lld %d | %lld %lld | %d %u %u %u",
                (long long)g.batch, (long long)g.m, (long long)g.n, (long long)g.k, (long long)g.lda,
                (long long)(batched ? g.stride_a : 0), int(g.trans_a), (long long)g.ldb,
                (long long)(batched ? g.stride_b : 0), int(g.trans_b), (long long)g.ldc,
                (long long)(batched ? g.stride_c : 0), int(compute), al_a, al_b, al_c);

  std::lock_guard lock(plan_mu_);
  std::shared_ptr<MatmulPlan>& slot = matmul_plans_[key];
  if (!slot) {
    auto plan = std::make_shared<MatmulPlan>();
    DEW_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
    const cublasOperation_t ta = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // on g.b
    const cublasOperation_t tb = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // on g.a
    const cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_DEFAULT;
    DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta));
    DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb));
    DEW_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
    // Column-major stored shapes: g.b [k, n] row-major is n x k column-major ([n, k]: k x n), g.a likewise.
    const uint64_t a_rows = g.trans_b ? uint64_t(g.k) : uint64_t(g.n), a_cols = g.trans_b ? g.n : g.k;
    const uint64_t b_rows = g.trans_a ? uint64_t(g.m) : uint64_t(g.k), b_cols = g.trans_a ? g.k : g.m;
    DEW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->la, CUDA_R_32F, a_rows, a_cols, g.ldb));
    DEW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lb, CUDA_R_32F, b_rows, b_cols, g.lda));
    DEW_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->lc, CUDA_R_32F, uint64_t(g.n), uint64_t(g.m), g.ldc));
    set_layout_batch(plan->la, g.batch, g.stride_b);
    set_layout_batch(plan->lb, g.batch, g.stride_a);
    set_layout_batch(plan->lc, g.batch, g.stride_c);
    int found = 0;
    const cublasStatus_t hs = plan->choose_algorithm(lt_, lt_workspace_bytes_, al_a, al_b, al_c, found);
    DEW_CHECK(hs == CUBLAS_STATUS_SUCCESS && found > 0, "cuda.gemm_f32: cuBLASLt has no algorithm for batch=", g.batch,
              " m=", g.m, " n=", g.n, " k=", g.k, " lda=", g.lda, " ldb=", g.ldb, " ldc=", g.ldc,
              " trans_a=", g.trans_a, " trans_b=", g.trans_b, " (", cublasLtGetStatusName(hs), ")");
    slot = std::move(plan);
  }
  MatmulPlan& plan = *slot;
  const float alpha = g.alpha, beta = g.beta;
  DEW_CUBLAS_CHECK(cublasLtMatmul(lt_, plan.desc, &alpha, g.b, plan.la, g.a, plan.lb, &beta, g.c, plan.lc, g.c, plan.lc,
                                  &plan.algo, lt_workspace_, lt_workspace_bytes_, stream_));
}

}  // namespace dew::cuda
