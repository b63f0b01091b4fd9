// dew/ops.hpp — differentiable tensor operations (what models are written with).
//
// Each op allocates its output on the inputs' backend, calls kernels of the kernel algebra
// (dew/backend.hpp), and records a backward node when gradients are needed (dew/autograd.hpp).
// Inputs must share one backend. Optional tensor arguments are passed as an undefined Tensor{}.
// Broadcasting follows numpy (right-aligned). Shapes are documented per op.
#pragma once
#include <vector>

#include "dew/backend.hpp"
#include "dew/tensor.hpp"

namespace dew {

// ---- elementwise ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor compare(const Tensor& a, const Tensor& b, BinaryOp op);  // eq/gt/lt, not differentiable
Tensor unary(const Tensor& x, UnaryOp op, float alpha = 1.0f, float beta = 0.0f);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor sqrt(const Tensor& x);
Tensor rsqrt(const Tensor& x);
Tensor square(const Tensor& x);
Tensor abs(const Tensor& x);
Tensor tanh(const Tensor& x);
Tensor sigmoid(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor gelu(const Tensor& x, bool tanh_approximation = false);
Tensor silu(const Tensor& x);
Tensor sin(const Tensor& x);
Tensor cos(const Tensor& x);
Tensor scale(const Tensor& x, float s);       // s * x
Tensor add_scalar(const Tensor& x, float c);  // x + c
Tensor pow(const Tensor& x, float p);         // x ^ p
Tensor clamp(const Tensor& x, float lo, float hi);
Tensor softcap(const Tensor& x, float cap);  // cap * tanh(x / cap)
Tensor activation(const Tensor& x, Activation act);
// act(gate) * up, one fused kernel forward and backward (the gated MLP's SwiGLU / GeGLU): the same values as
// mul(activation(gate, act), up), without the activation's output kept or streamed. gate and up: one shape.
Tensor gated_activation(const Tensor& gate, const Tensor& up, Activation act);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, float s);
Tensor operator*(float s, const Tensor& a);
Tensor operator+(const Tensor& a, float c);
Tensor operator-(const Tensor& a);

// ---- shapes and copies ----
Tensor reshape(const Tensor& x, const Shape& shape);  // a view; -1 infers one axis
Tensor permute(const Tensor& x, const std::vector<int>& dims);
Tensor transpose(const Tensor& x, int a, int b);
Tensor slice(const Tensor& x, int axis, int64_t begin, int64_t end);  // a copy (a view on axis 0)
Tensor concat(const std::vector<Tensor>& xs, int axis);
Tensor broadcast_to(const Tensor& x, const Shape& shape);
Tensor sum_to(const Tensor& x, const Shape& shape);  // the adjoint of broadcast_to
Tensor cast(const Tensor& x, DType dtype);           // differentiable between floating types
// Quantized tensors (dew/tensor.hpp): quantize rounds each group of k / groups consecutive elements of a row
// (k the last axis, which groups must divide) to int8 with one f32 scale per group, absmax / 127 (1 for an
// all-zero group), q = round-to-nearest-even(w / scale) in [-127, 127]; the rows are computed on the host
// (a one-time conversion of weights) and the result lives on x's backend. dequantize gives the f32 values
// q * scale (cast of a quantized tensor dequantizes too). Neither records gradients.
Tensor quantize_int8(const Tensor& x, int64_t groups);
Tensor dequantize(const Tensor& x);
Tensor contiguous_copy(const Tensor& x);

// ---- reductions (axis may be negative) ----
Tensor sum(const Tensor& x, int axis, bool keepdim = false);
Tensor mean(const Tensor& x, int axis, bool keepdim = false);
Tensor sum(const Tensor& x);                                   // all elements -> [1]
Tensor mean(const Tensor& x);                                  // all elements -> [1]
Tensor amax(const Tensor& x, int axis, bool keepdim = false);  // not differentiable
Tensor sum_squares(const Tensor& x);                           // -> [1], not differentiable
// [xs.size()]: element i is sum_squares(xs[i]) (the same bits), in one buffer: one tensor for the host to read, and
// for f32 / f64 inputs one backend call (sum_squares_group: a few launches on a device, not one per tensor). f64 when
// some xs[i] is f64, else f32 (a half input's sum widened exactly); xs on one backend; not differentiable.
Tensor sum_squares_each(const std::vector<Tensor>& xs);
Tensor argmax(const Tensor& x);                                // last axis -> i32, not differentiable

// ---- linear algebra ----
// a [..., M, K] @ b [..., K, N] (transposes by flag); batch dims broadcast when one side has none.
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a = false, bool trans_b = false);
// x [..., in] @ w[out, in]^T + bias[out] (the Hugging Face / PyTorch Linear layout), activation fused.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias = {}, Activation act = Activation::none);
// linear(x, w, bias) + linear(h, v) in one output and one node (a LoRA layer: h = s x A^T, v = B), where add()
// of two linear()s records three; the backward keeps x and h, never a [rows, out] product. x and h have the
// same rows.
Tensor linear_sum(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& h, const Tensor& v);

// ---- normalisation and softmax (last axis unless said otherwise) ----
Tensor softmax(const Tensor& x);
Tensor log_softmax(const Tensor& x);
Tensor layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps = 1e-5f);
Tensor rms_norm(const Tensor& x, const Tensor& weight, float eps = 1e-6f, float weight_offset = 0.0f);
Tensor group_norm(const Tensor& x, int64_t groups, const Tensor& weight, const Tensor& bias,
                  float eps = 1e-5f);  // NCHW

// ---- indexing ----
// table [V, D], ids i32 [...] -> [..., D] rows in the table's dtype; an int8 quantized table (a tied head stored for
// decoding, dew/generate.hpp) gives its rows dequantized to f32 (no gradient).
Tensor embedding(const Tensor& table, const Tensor& ids);
Tensor gather_rows(const Tensor& x, const Tensor& idx);    // x [B, T, D], idx i32 [B, K] -> [B, K, D]

// ---- transformer pieces ----
Tensor rope(const Tensor& x, const Tensor& positions, float theta, int64_t rotary_dim = 0,
            const RopeScaling& scaling = {});  // x [B, T, H, D]; scaling: Hugging Face's rope_type (dew/backend.hpp)
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionParams& p,
                 const Tensor& segment_ids = Tensor());  // [B,T,H,D] layout; segment_ids i32 [B, S]: documents
// (q, k, v of one dtype; or f32 q over bf16 k and v, a bf16 decode cache, without gradient)
Tensor dropout(const Tensor& x, float p, uint64_t seed, uint64_t stream, uint64_t offset);
// Decoding rows over a slot cache, not differentiable (kernel attention_slots): k_new, v_new [N, 1, Hkv, D] (rounded
// to the cache's dtype) are written at [slots[n], positions[n]] of k_cache, v_cache [n_slots, C, Hkv, D], then row
// n of q [N, 1, Hq, D] attends over its slot's first positions[n] + 1 keys (causal; p's scale, window, softcap) ->
// [N, 1, Hq, D]: each row the bits of `attention` on it alone over that prefix. Slots distinct.
Tensor attention_slots(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const std::vector<int64_t>& slots,
                       const std::vector<int64_t>& positions, Tensor& k_cache, Tensor& v_cache,
                       const AttentionParams& p);
// QK-Clip's statistic, not differentiable: per query head the largest raw score scale * q.k that attention(q,
// k, v, p, segment_ids) would see (before softcap) -> [Hq] (f32; f64 for f64 inputs). Kernel attention_max_logit.
Tensor attention_max_logit(const Tensor& q, const Tensor& k, const AttentionParams& p,
                           const Tensor& segment_ids = Tensor());

// ---- fused blocks: one kernel call where the composition would take extra passes ----
// LN(x) * (1 + scale) + shift, LN without affine: x [B, N, D], shift and scale [B, D] (adaLN, DiT). One
// layer_norm call over all B * N rows with the [B, D] weight 1 + scale and bias shift (one weight row per
// sample), so the modulation costs no extra pass and its gradients come out of layer_norm_backward directly.
Tensor modulated_layer_norm(const Tensor& x, const Tensor& shift, const Tensor& scale, float eps = 1e-6f);
// x + gate * f with gate broadcast over the tokens: x, f [B, N, D], gate [B, D] (adaLN-Zero's gated residual, DiT).
// add(x, mul(f, reshape(gate, {B, 1, D}))) in one kernel pass forward and one backward (the gradient of gate
// without the product's round trip through memory); the same values as that composition (dew/kernel_table.hpp).
Tensor gated_residual(const Tensor& x, const Tensor& f, const Tensor& gate);
// Multi-head attention straight from one packed projection: qkv [B, T, 3 H Dh] (q, k, v each
// [B, T, H, Dh], in that order along the last axis: the DiT / timm layout) -> [B, T, H Dh]. The
// backward writes dq, dk, dv into one [B, T, 3 H Dh] gradient, no zero-fill.
Tensor packed_attention(const Tensor& qkv, int64_t heads, const AttentionParams& p,
                        const Tensor& segment_ids = Tensor());
// qkv_attention(x [B, T, Din], w [3 H Dh, Din], bias [3 H Dh] or undefined, heads, p) -> [B, T, H Dh]:
// exactly packed_attention(linear(x, w, bias), heads, p), without the packed tensor: q, k and v are three
// matmuls against the row blocks of w written straight into the attention's inputs; the backward writes
// the row blocks of dw and db in place and sums dx over the three blocks.
Tensor qkv_attention(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t heads, const AttentionParams& p,
                     const Tensor& segment_ids = Tensor());

// ---- convolution (NCHW) ----
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
// w [C_in, C_out/groups, KH, KW] (PyTorch ConvTranspose2d layout); output_padding adds to the output size.
Tensor conv_transpose2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p,
                        int64_t output_padding_h = 0, int64_t output_padding_w = 0);

// ---- losses ----
// logits [N, V] (f32), targets i32 [N]: mean over non-ignored rows (0 when all are ignored).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);
Tensor mse(const Tensor& a, const Tensor& b);  // mean of squared differences -> [1]
// log softmax(logits)[i, targets[i]] per row -> [N] (f32; f64 for f64 logits), 0 where targets[i] == ignore_index:
// the cross_entropy kernel's per-row loss negated, differentiable (its backward is cross_entropy_backward with the
// rows' incoming gradients), so no [N, V] log-softmax or one-hot exists (DPO's sequence log-probabilities).
Tensor token_logprobs(const Tensor& logits, const Tensor& targets, int64_t ignore_index = -100);

// A linear head fused into its cross-entropy: cross_entropy(softcap(h @ w^T), targets, ignore_index) for h [N, D]
// and a bias-free head w [V, D] (a language model's output projection), without the [N, V] logits: the rows
// go through in equal chunks of at most chunk_rows (0: as many as fit chunk_mb MiB of f32 logits), each chunk's logits
// and their gradient live only while it is computed. Since the loss is a scalar the graph ends in, the chunk's
// gradients for h and w are computed in the forward (Liger's FusedLinearCrossEntropy) and the backward only scales
// them by the incoming gradient: the step does the unfused products, once each, and each chunk after the first
// reads and writes dW once more (8 V D bytes: ~3 % of a 50,304-token char-small-body step on a CPU at 293-row chunks,
// within noise at 1,024). `predictions` (when not null) gets argmax(logits) i32 [N] (token accuracy without the
// logits). Same values as the composition up to the summation order of dW over the chunks (one chunk: the
// composition's bits); the loss is f32 (f64 for f64 h and w). Under autocast h and w are cast as linear() casts
// them and the logits widened to f32, as the causal transformer does; dW is then summed over the chunks in f32 and
// rounded once. f16 with a gradient is refused: the chunk gradients (about softmax / rows) would underflow before
// f16-mixed's loss scale reaches them in the backward.
struct LinearCrossEntropyOptions {
  int64_t ignore_index = -100;
  float softcap = 0.0f;    // > 0: logits = softcap * tanh(logits / softcap) (Gemma's final softcap)
  int64_t chunk_rows = 0;  // rows per chunk; 0: chunk_mb decides
  double chunk_mb = 256.0;  // the f32 logits of one chunk, MiB (at least one row)
  Tensor* predictions = nullptr;
};
// The rows of each chunk (the last may have fewer): the fewest chunks the limit allows, of equal size.
int64_t linear_cross_entropy_chunk_rows(int64_t rows, int64_t vocab, const LinearCrossEntropyOptions& o);
Tensor linear_cross_entropy(const Tensor& h, const Tensor& w, const Tensor& targets,
                            const LinearCrossEntropyOptions& o = {});
// token_logprobs(softcap(h @ w^T), targets, ignore_index) -> [N] without the [N, V] logits, in the same chunks. A
// per-row output has no scalar to form the gradients against in the forward, so the backward computes each chunk's
// logits again (one more [N, D] x [D, V] product than the composition) and takes the rows' gradients through
// cross_entropy_backward; only lse [N] is kept between the two. Any float dtype (the backward has the loss scale);
// `predictions` as linear_cross_entropy's (argmax per chunk). DPO's sequence log-probabilities and the eval
// harness's scores (dew/lm_eval.hpp, model_scores) at a real vocabulary.
Tensor linear_token_logprobs(const Tensor& h, const Tensor& w, const Tensor& targets,
                             const LinearCrossEntropyOptions& o = {});

}  // namespace dew
