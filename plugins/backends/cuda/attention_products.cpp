// cuda/attention_products.cpp — f32 attention (forward and backward) made of cuBLASLt products and three row
// kernels (attention_products.cu), instead of the warp-per-row kernel (attention.cu), whose f32 rate is ~1 TFLOP/s
// against cuBLASLt's ~50 for f32 products (H200, session 18).
// Work is cut in chunks: batch b, query rows [t0, t0 + tc) of every head, and the keys [s0, s0 + nc) that any of
// those rows can see under causal / window (the mask itself is applied per element by the row kernels, so segment
// ids and ragged ranges are exact). A chunk's scores live in scratch [Hq][tc][nc] (f32; the forward one buffer, the
// backward two), at most kChunkFloats floats each (tc shrinks to fit: Hq 12 and T = S = 1024 not causal is one
// chunk of 48 MiB per batch); a causal call of T >= 512 also cuts its rows in 4 chunks, so the keys no row of a
// chunk sees are not multiplied (5/8 of the full rectangle; GPT-2-small's step: chunks of 256 rows, <= 12 MiB).
// Forward, per chunk: S = scale Q K^T (product), P = softmax(cap(S)) with the mask, lse (row kernel), O = P V.
// Backward, per chunk: S again, P = exp(cap(S) - lse) (row kernel), dV += P^T dO, dP = dO V^T,
// dS = P (dP - rowsum(dO * O)) (times 1 - (cap(S)/cap)^2 under a softcap, cap(S) read back as log P + lse; row
// kernel), dQ = scale dS K, dK += scale dS^T Q. dK and dV are zeroed first and every chunk adds into them
// (beta = 1), in a fixed order: deterministic.
// Heads: query head h reads kv head h / g (g = Hq / Hkv). Every product is batched over the Hkv kv heads and issued
// once per j < g for the query heads hk * g + j (stride g heads through Q, dO, O and the scratch), so the g query
// heads of one kv head never write the same dK / dV rows within one batched call (MHA: one call; MQA: g calls of
// one matrix each).
// Precision: the products follow matmul_precision like every f32 matmul (highest: f32; high: TF32; medium: bf16
// inputs); the row kernels are f32. P is normalised before O = P V (the warp kernel divides the accumulator
// instead): the two agree to f32 rounding.
// Selection (CudaBackend::attention / attention_backward): q, k, v all f32, B, T, S, Dk, Dv >= 1, and
//   `attention = products`: always;  `attention = auto` (the default): T * S >= kAutoMinScores (2^15);
//   `attention = warp`: never.
// Why 2^15 (timed on an H200, dew-bench kernels --only attention, session 19): at T = S = 256 (char-small: B 8,
// H 6, D 64, causal) the products take 0.78 ms forward + backward against the warp kernel's 1.74; at T = S = 128
// (gpt-mini: B 16, H 4, D 32) 1.22 ms against 0.63 — there the launches (3 forward, 7 backward per chunk) and the
// small products lose. 2^15 puts 128 x 128 on the warp kernel and 256 x 256 on the products; between them untimed.
#include <algorithm>

#include "cuda_backend.hpp"

namespace dew::cuda {

namespace {

constexpr int64_t kChunkFloats = int64_t(32) << 20;  // 128 MiB of f32 per scratch buffer
constexpr int64_t kAutoMinScores = int64_t(1) << 15;

// Keys [s0, s0 + nc) that some row of [t0, t0 + tc) may see (causal / window); at least one key (S >= 1), so an
// empty range becomes one hidden key the row kernels mask, and no product has an empty sum.
ProductsChunk chunk_keys(int64_t b, int64_t t0, int64_t tc, const AttnDims& d, const AttentionParams& p) {
  int64_t lo = 0, hi = d.S - 1;
  if (p.causal) hi = std::min(hi, p.q_offset + t0 + tc - 1);
  if (p.window > 0) lo = std::max<int64_t>(lo, p.q_offset + t0 - p.window + 1);
  if (lo > hi) {
    lo = std::clamp<int64_t>(lo, 0, d.S - 1);
    hi = lo;
  }
  return {b, t0, tc, lo, hi - lo + 1};
}

// Query rows per chunk.
int64_t chunk_rows(const AttnDims& d, const AttentionParams& p) {
  int64_t tc = std::clamp<int64_t>(kChunkFloats / std::max<int64_t>(d.Hq * d.S, 1), 1, d.T);
  if (p.causal && d.T >= 512) tc = std::min(tc, (d.T + 3) / 4);
  return tc;
}

}  // namespace

bool CudaBackend::attention_products_applies(const Tensor& q, const Tensor& k, const Tensor& v,
                                             const AttnDims& d) const {
  if (opt_.f32_attention == CudaOptions::F32Attention::warp) return false;
  if (q.dtype() != DType::f32 || k.dtype() != DType::f32 || v.dtype() != DType::f32) return false;
  if (d.B < 1 || d.T < 1 || d.S < 1 || d.Hq < 1 || d.Hkv < 1 || d.Dk < 1 || d.Dv < 1) return false;
  if (opt_.f32_attention == CudaOptions::F32Attention::products) return true;
  return d.T * d.S >= kAutoMinScores;
}

void CudaBackend::attention_products(const float* q, const float* k, const float* v, const int32_t* seg, float* out,
                                     float* lse, const AttnDims& d, const AttentionParams& p) {
  const int64_t g = d.Hq / d.Hkv, tc_max = chunk_rows(d, p);
  Scratch sc(this, size_t(d.Hq * tc_max * d.S) * sizeof(float));
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t0 = 0; t0 < d.T; t0 += tc_max) {
      const ProductsChunk c = chunk_keys(b, t0, std::min(tc_max, d.T - t0), d, p);
      const int64_t head = c.tc * c.nc;  // one head's scores
      for (int64_t j = 0; j < g; ++j) {  // S = scale Q K^T
        RawGemm m;
        m.m = c.tc, m.n = c.nc, m.k = d.Dk, m.batch = d.Hkv, m.alpha = p.scale;
        m.a = q + ((b * d.T + c.t0) * d.Hq + j) * d.Dk, m.lda = d.Hq * d.Dk, m.stride_a = g * d.Dk;
        m.b = k + (b * d.S + c.s0) * d.Hkv * d.Dk, m.ldb = d.Hkv * d.Dk, m.stride_b = d.Dk, m.trans_b = true;
        m.c = sc.f32() + j * head, m.ldc = c.nc, m.stride_c = g * head;
        gemm_f32(m);
      }
      launch_products_softmax(stream_, sc.f32(), seg, lse, c, d, p);
      for (int64_t j = 0; j < g; ++j) {  // O = P V
        RawGemm m;
        m.m = c.tc, m.n = d.Dv, m.k = c.nc, m.batch = d.Hkv;
        m.a = sc.f32() + j * head, m.lda = c.nc, m.stride_a = g * head;
        m.b = v + (b * d.S + c.s0) * d.Hkv * d.Dv, m.ldb = d.Hkv * d.Dv, m.stride_b = d.Dv;
        m.c = out + ((b * d.T + c.t0) * d.Hq + j) * d.Dv, m.ldc = d.Hq * d.Dv, m.stride_c = g * d.Dv;
        gemm_f32(m);
      }
    }
}

void CudaBackend::attention_products_backward(const float* q, const float* k, const float* v, const int32_t* seg,
                                              const float* out, const float* lse, const float* dout, float* dq,
                                              float* dk, float* dv, const AttnDims& d, const AttentionParams& p) {
  const int64_t g = d.Hq / d.Hkv, tc_max = chunk_rows(d, p);
  launch_fill(stream_, dk, d.B * d.S * d.Hkv * d.Dk, 4, 0);
  launch_fill(stream_, dv, d.B * d.S * d.Hkv * d.Dv, 4, 0);
  const size_t buf = size_t(d.Hq * tc_max * d.S) * sizeof(float);
  Scratch sp(this, buf), sd(this, buf);  // P, then dP -> dS
  for (int64_t b = 0; b < d.B; ++b)
    for (int64_t t0 = 0; t0 < d.T; t0 += tc_max) {
      const ProductsChunk c = chunk_keys(b, t0, std::min(tc_max, d.T - t0), d, p);
      const int64_t head = c.tc * c.nc;
      const int64_t qrow0 = (b * d.T + c.t0) * d.Hq, krow0 = (b * d.S + c.s0) * d.Hkv;
      for (int64_t j = 0; j < g; ++j) {  // S = scale Q K^T
        RawGemm m;
        m.m = c.tc, m.n = c.nc, m.k = d.Dk, m.batch = d.Hkv, m.alpha = p.scale;
        m.a = q + (qrow0 + j) * d.Dk, m.lda = d.Hq * d.Dk, m.stride_a = g * d.Dk;
        m.b = k + krow0 * d.Dk, m.ldb = d.Hkv * d.Dk, m.stride_b = d.Dk, m.trans_b = true;
        m.c = sp.f32() + j * head, m.ldc = c.nc, m.stride_c = g * head;
        gemm_f32(m);
      }
      launch_products_probs(stream_, sp.f32(), seg, lse, c, d, p);
      for (int64_t j = 0; j < g; ++j) {
        {  // dV += P^T dO
          RawGemm m;
          m.m = c.nc, m.n = d.Dv, m.k = c.tc, m.batch = d.Hkv, m.beta = 1.0f;
          m.a = sp.f32() + j * head, m.lda = c.nc, m.stride_a = g * head, m.trans_a = true;
          m.b = dout + (qrow0 + j) * d.Dv, m.ldb = d.Hq * d.Dv, m.stride_b = g * d.Dv;
          m.c = dv + krow0 * d.Dv, m.ldc = d.Hkv * d.Dv, m.stride_c = d.Dv;
          gemm_f32(m);
        }
        {  // dP = dO V^T
          RawGemm m;
          m.m = c.tc, m.n = c.nc, m.k = d.Dv, m.batch = d.Hkv;
          m.a = dout + (qrow0 + j) * d.Dv, m.lda = d.Hq * d.Dv, m.stride_a = g * d.Dv;
          m.b = v + krow0 * d.Dv, m.ldb = d.Hkv * d.Dv, m.stride_b = d.Dv, m.trans_b = true;
          m.c = sd.f32() + j * head, m.ldc = c.nc, m.stride_c = g * head;
          gemm_f32(m);
        }
      }
      launch_products_dscore(stream_, sp.f32(), sd.f32(), out, dout, lse, c, d, p);
      for (int64_t j = 0; j < g; ++j) {
        {  // dQ = scale dS K
          RawGemm m;
          m.m = c.tc, m.n = d.Dk, m.k = c.nc, m.batch = d.Hkv, m.alpha = p.scale;
          m.a = sd.f32() + j * head, m.lda = c.nc, m.stride_a = g * head;
          m.b = k + krow0 * d.Dk, m.ldb = d.Hkv * d.Dk, m.stride_b = d.Dk;
          m.c = dq + (qrow0 + j) * d.Dk, m.ldc = d.Hq * d.Dk, m.stride_c = g * d.Dk;
          gemm_f32(m);
        }
        {  // dK += scale dS^T Q
          RawGemm m;
          m.m = c.nc, m.n = d.Dk, m.k = c.tc, m.batch = d.Hkv, m.alpha = p.scale, m.beta = 1.0f;
          m.a = sd.f32() + j * head, m.lda = c.nc, m.stride_a = g * head, m.trans_a = true;
          m.b = q + (qrow0 + j) * d.Dk, m.ldb = d.Hq * d.Dk, m.stride_b = g * d.Dk;
          m.c = dk + krow0 * d.Dk, m.ldc = d.Hkv * d.Dk, m.stride_c = d.Dk;
          gemm_f32(m);
        }
      }
    }
}

}  // namespace dew::cuda
