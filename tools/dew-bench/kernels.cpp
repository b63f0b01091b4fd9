// tools/dew-bench/kernels.cpp — `dew-bench kernels`: matmul GFLOP/s through dew's public API
// (dew::matmul, which allocates its output and dispatches to the backend) next to oneDNN 2.6 called
// directly on the same shape and thread count (primitive made once, plain row-major memory: the
// ceiling; on a CPU backend only — a device's products stand alone), and the fused attention forward and
// forward+backward times at the char-small, gpt-mini and DiT shapes, and the decode products against one weight,
// row-major and in the backend's decode panels, the decode attention (one query against a cache), and one sampling
// draw (dew::sample_token, host code) at three vocabulary sizes, and the cross-entropy forward, backward and argmax
// over logits of those vocabularies, a model's EMA update (dew::lerp_towards, the fused lerp_group, against its
// definition of three kernels a tensor), and the MLP activation GELU-tanh forward and backward (with and without its
// bias sums fused) in f32 and bf16 and a bf16-mixed step's widened gradient products against a bf16 product then a cast
// (`--only matmul|attention|decode|loss|sampling|ema|activations|widened` runs one part), and serving's decode
// attention over a slot cache, one call against row by row (`--only slots`).
// One JSON line per measurement. With
// --matmul-precision medium the dew side runs bf16 operands (conversions included) while the direct
// oneDNN call stays f32: the ratio is then the speed-up the precision buys.
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <dnnl.hpp>

#include "bench.hpp"
#include "dew/autograd.hpp"
#include "dew/generate.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"  // lerp_towards

namespace dew_bench {

namespace {

double onednn_matmul_seconds(int64_t m, int64_t n, int64_t k, const BenchOptions& opt) {
  using namespace dnnl;
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  memory::desc a_md({m, k}, memory::data_type::f32, memory::format_tag::ab);
  memory::desc b_md({k, n}, memory::data_type::f32, memory::format_tag::ab);
  memory::desc c_md({m, n}, memory::data_type::f32, memory::format_tag::ab);
  matmul::primitive_desc pd(matmul::desc(a_md, b_md, c_md), eng);
  matmul prim(pd);
  std::vector<float> a(size_t(m * k), 0.5f), b(size_t(k * n), 0.25f), c(size_t(m * n));
  memory am(a_md, eng, a.data()), bm(b_md, eng, b.data()), cm(c_md, eng, c.data());
  return median_seconds(
      [&] {
        prim.execute(s, {{DNNL_ARG_SRC, am}, {DNNL_ARG_WEIGHTS, bm}, {DNNL_ARG_DST, cm}});
        s.wait();
      },
      opt);
}

}  // namespace

int run_kernels(const BenchOptions& opt) {
  using namespace dew;
  omp_set_num_threads(opt.threads);
  BackendPtr be = make_backend(opt);
  be->set_threads(opt.threads);
  NoGradGuard no_grad;

  // M x K x N, the peers' notation (torch_matmul.py --shapes): the squares and every GEMM of a d=384
  // transformer step with B*T = 2048 rows (qkv, out proj, SwiGLU 8d/3 = 1024, GELU-MLP 4d = 1536, lm head).
  struct Shape3 {
    int64_t m, k, n;
    const char* what;
  };
  const Shape3 shapes[] = {
      {256, 256, 256, "square"},
      {1024, 1024, 1024, "square"},
      {2048, 2048, 2048, "square"},
      {2048, 384, 1152, "d384 qkv proj"},
      {2048, 384, 384, "d384 out proj"},
      {2048, 384, 1024, "d384 swiglu up"},
      {2048, 1024, 384, "d384 swiglu down"},
      {2048, 384, 1536, "d384 mlp up"},
      {2048, 1536, 384, "d384 mlp down"},
      {2048, 384, 256, "d384 lm head"},
  };
  for (const Shape3& s : shapes) {
    if (!opt.only.empty() && opt.only != "matmul") break;
    Tensor a = Tensor::uniform({s.m, s.k}, -1, 1, 1, 1, be), b = Tensor::uniform({s.k, s.n}, -1, 1, 1, 2, be);
    const double dew_s = median_seconds([&] { Tensor c = matmul(a, b); }, opt, [&] { be->synchronize(); });
    const double flop = 2.0 * double(s.m) * double(s.n) * double(s.k);
    char vs_onednn[96] = "";  // oneDNN runs on the CPU: a ceiling for a CPU backend only
    if (be->host_accessible()) {
      const double dnnl_s = onednn_matmul_seconds(s.m, s.n, s.k, opt);
      std::snprintf(vs_onednn, sizeof vs_onednn, ",\"onednn_gflops\":%.1f,\"ratio\":%.3f", flop / dnnl_s * 1e-9,
                    dnnl_s / dew_s);
    }
    std::printf(
        "{\"bench\":\"matmul\",\"shape\":\"%lldx%lldx%lld\",\"what\":\"%s\",\"backend\":\"%s\","
        "\"matmul_precision\":\"%s\",\"threads\":%d,\"gflops\":%.1f%s}\n",
        (long long)s.m, (long long)s.k, (long long)s.n, s.what, opt.backend.c_str(), opt.matmul_precision.c_str(),
        opt.threads, flop / dew_s * 1e-9, vs_onednn);
    std::fflush(stdout);
  }

  // Weight gradients dW = X^T dY (A transposed, summed over the batch's rows): the backward products oneDNN splits
  // over the threads least well, which the cpu backend splits itself at 2+ threads (matmul.cpp: option matmul_split;
  // `--backend-option matmul_split=off` for oneDNN's own split). M x K x N as above: the weight's rows, the batch
  // rows, its columns. The DiT (1024 rows: d 256, MLP 1024) and char-small (2048 rows: d 384, SwiGLU 1024).
  const Shape3 grad_shapes[] = {
      {256, 1024, 256, "dit qkv/proj weight grad"},      {256, 1024, 1024, "dit mlp down weight grad"},
      {1024, 1024, 256, "dit mlp up weight grad"},       {384, 2048, 384, "d384 q/k/v/out weight grad"},
      {384, 2048, 1024, "d384 swiglu down weight grad"}, {1024, 2048, 384, "d384 swiglu up weight grad"},
  };
  std::string split = "on";
  for (const std::string& kv : opt.backend_options)
    if (kv.rfind("matmul_split=", 0) == 0) split = kv.substr(13);
  for (const Shape3& s : grad_shapes) {
    if (!opt.only.empty() && opt.only != "matmul") break;
    Tensor x = Tensor::uniform({s.k, s.m}, -1, 1, 1, 3, be), dy = Tensor::uniform({s.k, s.n}, -1, 1, 1, 4, be);
    Tensor dw = Tensor::empty({s.m, s.n}, DType::f32, be);
    MatmulParams p;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.trans_a = true;
    const double dew_s = median_seconds([&] { be->matmul(x, dy, Tensor(), dw, p); }, opt, [&] { be->synchronize(); });
    std::printf(
        "{\"bench\":\"matmul\",\"shape\":\"%lldx%lldx%lld At\",\"what\":\"%s\",\"backend\":\"%s\","
        "\"matmul_precision\":\"%s\",\"threads\":%d,\"matmul_split\":\"%s\",\"gflops\":%.1f}\n",
        (long long)s.m, (long long)s.k, (long long)s.n, s.what, opt.backend.c_str(), opt.matmul_precision.c_str(),
        opt.threads, split.c_str(), 2.0 * double(s.m) * double(s.n) * double(s.k) / dew_s * 1e-9);
    std::fflush(stdout);
  }

  // Fused attention forward and forward + backward at the three training workloads' shapes ([B, T, H, D]
  // tensors, the step's own layout), and on a device at GPT-2-small's too (configs/gpt2-small.ini: T 1024, 12
  // heads of 64), in f32 and, where the backend takes bf16 attention, bf16 (bf16-mixed runs attention on bf16
  // tensors: cuda's tensor-core kernels; cpu's vdpbf16ps kernel with AVX512-BF16, else its widened f32 kernel).
  // GFLOP/s count the products a causal mask leaves (T (T + 1) / 2 query-key pairs, 4 D FLOPs each forward:
  // S = Q K^T and O = P V; 2.5 times that more backward: S again, dP, dV, dK, dQ), not the exps.
  struct AttnShape {
    int64_t B, H, T, D;
    bool causal;
    const char* what;
    bool device_only;
  };
  const AttnShape attn_shapes[] = {
      {8, 6, 256, 64, true, "char-small", false},
      {16, 4, 128, 32, true, "gpt-mini", false},
      {16, 4, 64, 64, false, "dit", false},
      {8, 12, 1024, 64, true, "gpt2-small", true},
  };
  const bool device = !be->host_accessible();
  std::vector<DType> attn_dtypes = {DType::f32};
  if (device ||
      (be->supports(Kernel::attention, DType::bf16).ok && be->supports(Kernel::attention_backward, DType::bf16).ok))
    attn_dtypes.push_back(DType::bf16);
  for (const AttnShape& a : attn_shapes)
    for (DType dt : attn_dtypes) {
      if ((!opt.only.empty() && opt.only != "attention") || (a.device_only && !device)) break;
      const int64_t B = a.B, H = a.H, T = a.T, D = a.D;
      const auto normal = [&](uint64_t stream) { return cast(Tensor::normal({B, T, H, D}, 0, 1, 2, stream, be), dt); };
      Tensor q = normal(1), k = normal(2), v = normal(3), dout = normal(4);
      AttentionParams p;
      p.scale = float(1.0 / std::sqrt(double(D)));
      p.causal = a.causal;
      Tensor out = Tensor::empty(q.shape(), dt, be), lse = Tensor::empty({B, H, T}, DType::f32, be);
      Tensor dq = Tensor::empty(q.shape(), dt, be), dk = Tensor::empty(k.shape(), dt, be);
      Tensor dv = Tensor::empty(v.shape(), dt, be);
      const double fwd =
          median_seconds([&] { be->attention(q, k, v, Tensor(), out, lse, p); }, opt, [&] { be->synchronize(); });
      const double fwd_bwd = median_seconds(
          [&] {
            be->attention(q, k, v, Tensor(), out, lse, p);
            be->attention_backward(q, k, v, Tensor(), out, lse, dout, dq, dk, dv, p);
          },
          opt, [&] { be->synchronize(); });
      const double pairs = double(B * H) * (a.causal ? double(T) * double(T + 1) / 2 : double(T) * double(T));
      const double fwd_flop = 4.0 * double(D) * pairs, bwd_flop = 2.5 * fwd_flop;
      std::printf(
          "{\"bench\":\"attention\",\"shape\":\"B%lldxH%lldxT%lldxD%lld\",\"what\":\"%s\",\"causal\":%s,"
          "\"dtype\":\"%s\",\"backend\":\"%s\",\"threads\":%d,\"ms_fwd\":%.3f,\"ms_fwd_bwd\":%.3f,\"gflops_fwd\":%.1f,"
          "\"gflops_bwd\":%.1f}\n",
          (long long)B, (long long)H, (long long)T, (long long)D, a.what, a.causal ? "true" : "false", dtype_name(dt),
          opt.backend.c_str(), opt.threads, fwd * 1e3, fwd_bwd * 1e3, fwd_flop / fwd * 1e-9,
          bwd_flop / std::max(fwd_bwd - fwd, 1e-12) * 1e-9);
      std::fflush(stdout);
    }

  // Decode products (linear() against one weight, as a decode or serve step makes them): char-small's gate/up
  // weight [2048, 384] in f32 and bf16, row-major and, where the backend asks for them (decode_panel_rows), in
  // its panels, at m = 1 (a token), 4 and 16 (a server's batched slots) and 32 rows. The weight is warm (the same
  // one every call: 3.1 / 1.6 MB in the cache), so this is the kernels' compute and cache rate; a decode token's
  // DRAM-bound rate is `generate`'s.
  for (DType dt : {DType::f32, DType::bf16})
    for (const bool panels : {false, true}) {
      if (!opt.only.empty() && opt.only != "decode") break;
      if (panels && be->decode_panel_rows(dt) == 0) break;
      const int64_t n = 2048, k = 384;
      Tensor w = cast(Tensor::uniform({n, k}, -1, 1, 3, 1, be), dt);
      if (panels) store_matmul_weights_in_panels({{"mlp.gate_up.weight", w}});
      for (const int64_t m : {1, 4, 16, 32}) {
        Tensor x = Tensor::uniform({m, k}, -1, 1, 3, 2, be);
        const double sec = median_seconds([&] { Tensor y = linear(x, w); }, opt, [&] { be->synchronize(); });
        std::printf(
            "{\"bench\":\"decode_matmul\",\"shape\":\"%lldx%lldx%lld\",\"weights\":\"%s\",\"layout\":\"%s\","
            "\"backend\":\"%s\",\"threads\":%d,\"us\":%.2f,\"gflops\":%.1f,\"weight_gbs\":%.1f}\n",
            (long long)m, (long long)k, (long long)n, dtype_name(dt), panels ? "panels" : "rows", opt.backend.c_str(),
            opt.threads, sec * 1e6, 2.0 * double(m * n * k) / sec * 1e-9, double(w.nbytes()) / sec * 1e-9);
        std::fflush(stdout);
      }
    }

  // Decode attention: one query (T = 1, at position S - 1) against a cache of S positions, char-small's 6 heads of
  // 64, f32 and bf16 K/V (the decode cache takes the weights' dtype), as `generate` calls it once a layer. Warm (the
  // same cache every call: 0.2-6 MB), so this is the row path's compute and cache rate; kv_gbs counts K and V once.
  for (DType kv : {DType::f32, DType::bf16}) {
    if (!opt.only.empty() && opt.only != "decode") break;
    if (!be->supports(Kernel::attention, kv).ok) continue;
    for (const int64_t S : {256, 512, 1024, 4096}) {
      const int64_t H = 6, D = 64;
      Tensor q = Tensor::normal({1, 1, H, D}, 0, 1, 2, 5, be);
      Tensor k = cast(Tensor::normal({1, S, H, D}, 0, 1, 2, 6, be), kv),
             v = cast(Tensor::normal({1, S, H, D}, 0, 1, 2, 7, be), kv);
      AttentionParams p;
      p.scale = float(1.0 / std::sqrt(double(D)));
      p.causal = true;
      p.q_offset = S - 1;
      Tensor out = Tensor::empty(q.shape(), DType::f32, be), lse = Tensor::empty({1, H, 1}, DType::f32, be);
      const double sec =
          median_seconds([&] { be->attention(q, k, v, Tensor(), out, lse, p); }, opt, [&] { be->synchronize(); });
      std::printf(
          "{\"bench\":\"decode_attention\",\"shape\":\"B1xH%lldxT1xS%lldxD%lld\",\"kv\":\"%s\",\"backend\":\"%s\","
          "\"threads\":%d,\"us\":%.2f,\"kv_gbs\":%.1f}\n",
          (long long)H, (long long)S, (long long)D, dtype_name(kv), opt.backend.c_str(), opt.threads, sec * 1e6,
          double(k.nbytes() + v.nbytes()) / sec * 1e-9);
      std::fflush(stdout);
    }
  }

  // Serving's decode attention (attention_slots): 16 rows on their own slots of a 16-slot cache of S positions, at
  // positions spread over it (row r at (r + 1) * S / 16 - 1, as a server's requests admitted at different times),
  // char-small's 6 heads of 64, f32 and bf16 caches: the backend's kernel (one call for every row) against its
  // definition row by row (attention_slots_each: a write pair and an attention call per row, the path before).
  for (DType kv : {DType::f32, DType::bf16}) {
    if (!opt.only.empty() && opt.only != "slots") break;
    if (!be->supports(Kernel::attention_slots, kv).ok) continue;
    for (const int64_t S : {256, 1024}) {
      const int64_t rows = 16, H = 6, D = 64;
      std::vector<int64_t> slots, positions;
      for (int64_t r = 0; r < rows; ++r) {
        slots.push_back((r * 7) % rows);  // out of order, as a server's free slots come
        positions.push_back((r + 1) * S / rows - 1);
      }
      Tensor q = Tensor::normal({rows, 1, H, D}, 0, 1, 2, 5, be);
      Tensor kn = cast(Tensor::normal({rows, 1, H, D}, 0, 1, 2, 6, be), kv),
             vn = cast(Tensor::normal({rows, 1, H, D}, 0, 1, 2, 7, be), kv);
      Tensor kc = cast(Tensor::normal({rows, S, H, D}, 0, 1, 2, 8, be), kv),
             vc = cast(Tensor::normal({rows, S, H, D}, 0, 1, 2, 9, be), kv);
      AttentionParams p;
      p.scale = float(1.0 / std::sqrt(double(D)));
      Tensor out = Tensor::empty(q.shape(), DType::f32, be);
      const double fused = median_seconds([&] { be->attention_slots(q, kn, vn, slots, positions, kc, vc, out, p); },
                                          opt, [&] { be->synchronize(); });
      const double each =
          median_seconds([&] { attention_slots_each(*be, q, kn, vn, slots, positions, kc, vc, out, p); }, opt,
                         [&] { be->synchronize(); });
      std::printf(
          "{\"bench\":\"slot_attention\",\"shape\":\"N%lldxH%lldxS%lldxD%lld\",\"kv\":\"%s\",\"backend\":\"%s\","
          "\"threads\":%d,\"us\":%.2f,\"row_by_row_us\":%.2f,\"speedup\":%.2f}\n",
          (long long)rows, (long long)H, (long long)S, (long long)D, dtype_name(kv), opt.backend.c_str(), opt.threads,
          fused * 1e6, each * 1e6, each / fused);
      std::fflush(stdout);
    }
  }

  // The loss over a vocabulary: the fused cross-entropy forward and backward and argmax (the LM objective's token
  // accuracy) over logits [rows, V] of a byte, GPT-2 and Qwen-sized vocabulary: memory-bound passes, so GB/s counts
  // the bytes each must move (the forward and argmax read the logits; the backward reads them and writes dlogits).
  if (opt.only.empty() || opt.only == "loss")
    for (const int64_t vocab : {int64_t(256), int64_t(50304), int64_t(151936)}) {
      const int64_t rows = vocab > 100000 ? 512 : 2048;
      const Tensor logits = Tensor::normal({rows, vocab}, 0, 2, 5, 1, be);
      std::vector<int32_t> ids(static_cast<size_t>(rows), 0);
      for (int64_t i = 0; i < rows; ++i) ids[size_t(i)] = int32_t((i * 7919) % vocab);
      const Tensor targets = Tensor::from_ints(ids, {rows}, be);
      Tensor loss = Tensor::empty({rows}, DType::f32, be), lse = Tensor::empty({rows}, DType::f32, be);
      const Tensor dloss = Tensor::full({rows}, 1.0 / double(rows), DType::f32, be);
      Tensor dlogits = Tensor::empty({rows, vocab}, DType::f32, be), am = Tensor::empty({rows}, DType::i32, be);
      const CrossEntropyParams p;
      const auto sync = [&] { be->synchronize(); };
      const double fwd = median_seconds([&] { be->cross_entropy(logits, targets, loss, lse, p); }, opt, sync);
      const double bwd =
          median_seconds([&] { be->cross_entropy_backward(logits, targets, lse, dloss, dlogits, p); }, opt, sync);
      const double amax = median_seconds([&] { be->argmax(logits, am); }, opt, sync);
      const double bytes = double(rows) * double(vocab) * 4.0;
      std::printf(
          "{\"bench\":\"loss\",\"rows\":%lld,\"vocab\":%lld,\"backend\":\"%s\",\"threads\":%d,\"ms_cross_entropy\":%."
          "3f,"
          "\"ms_cross_entropy_backward\":%.3f,\"ms_argmax\":%.3f,\"gbs_cross_entropy\":%.1f,"
          "\"gbs_cross_entropy_backward\":%.1f,\"gbs_argmax\":%.1f,\"cpu\":\"%s\"}\n",
          (long long)rows, (long long)vocab, opt.backend.c_str(), opt.threads, fwd * 1e3, bwd * 1e3, amax * 1e3,
          bytes / fwd * 1e-9, 2 * bytes / bwd * 1e-9, bytes / amax * 1e-9, cpu_model().c_str());
      std::fflush(stdout);
    }

  // Sampling: one draw through dew::sample_token (host code, whatever the backend) from logits of a byte, GPT-2 and
  // Qwen-sized vocabulary, flat (spread 0.05: every token matters to top_p and the draw) and peaked (4), with
  // temperature alone, top_k 50 and top_p 0.9 (the filters of `dew-run sample` and serving's requests); and the
  // log-probabilities a request with `logprobs` adds to each draw (dew::token_logprob).
  if (opt.only.empty() || opt.only == "sampling")
    for (const int64_t vocab : {256, 50304, 151936})
      for (const float spread : {0.05f, 4.0f}) {
        const std::vector<float> logits = Tensor::normal({vocab}, 0, spread, 3, 9, be).to_floats();
        const std::vector<int32_t> history(64, 1);
        for (const char* filter : {"temperature", "top_k", "top_p"}) {
          SamplingParams sp;
          sp.temperature = 0.8f;
          if (std::string(filter) == "top_k") sp.top_k = 50;
          if (std::string(filter) == "top_p") sp.top_p = 0.9f;
          uint64_t draw = 0;
          int64_t sink = 0;
          const double sec =
              median_seconds([&] { sink += sample_token(logits.data(), vocab, sp, history, draw++); }, opt, [] {});
          std::printf(
              "{\"bench\":\"sampling\",\"vocab\":%lld,\"spread\":%.2f,\"filter\":\"%s\",\"temperature\":0.8,"
              "\"us_per_token\":%.1f,\"checksum\":%lld,\"cpu\":\"%s\"}\n",
              (long long)vocab, double(spread), filter, sec * 1e6, (long long)(sink % 1000), cpu_model().c_str());
          std::fflush(stdout);
        }
        // A drawn token's log-probability and the 5 likeliest tokens' (a request's `logprobs: 5`), per token.
        int64_t sink = 0;
        const double sec = median_seconds(
            [&] { sink += token_logprob(logits.data(), vocab, int32_t(sink % vocab), 5).top[0].first; }, opt, [] {});
        std::printf(
            "{\"bench\":\"sampling\",\"vocab\":%lld,\"spread\":%.2f,\"filter\":\"logprobs 5\",\"us_per_token\":%.1f,"
            "\"checksum\":%lld,\"cpu\":\"%s\"}\n",
            (long long)vocab, double(spread), sec * 1e6, (long long)(sink % 1000), cpu_model().c_str());
        std::fflush(stdout);
      }
  // A model's EMA update over transformer-shaped tensors (12 blocks of d 256: qkv, projection, a 4x MLP, a 6d adaLN
  // modulation, their biases and norms; 162 tensors, 14.3 M elements from 256 to 393,216 each), ema += (1 - decay)
  // (param - ema) through dew::lerp_towards (the fused lerp_group: each tensor read twice and written once, 12 bytes
  // an f32 element) against its definition, sub, affine and add a tensor (lerp_each: 8 tensor passes and an
  // allocation each). GB/s counts the fused form's 12 bytes in both.
  if (opt.only.empty() || opt.only == "ema") {
    const std::vector<Shape> block = {{768, 256}, {768}, {256, 256}, {256}, {1024, 256}, {1024}, {256, 1024},
                                      {256},      {1536, 256}, {1536}, {256}, {256},  {256}};
    const std::vector<Shape> outside = {{256, 48}, {256}, {64, 256}, {11, 256}, {256, 256}, {256}};
    std::vector<Shape> shapes;
    for (int b = 0; b < 12; ++b) shapes.insert(shapes.end(), block.begin(), block.end());
    shapes.insert(shapes.end(), outside.begin(), outside.end());
    std::vector<Tensor> averages, targets;
    std::vector<LerpSlot> slots;
    int64_t elements = 0;
    for (size_t i = 0; i < shapes.size(); ++i) {
      averages.push_back(Tensor::normal(shapes[i], 0, 1, 11, uint64_t(i), be));
      targets.push_back(Tensor::normal(shapes[i], 0, 1, 12, uint64_t(i), be));
      slots.push_back({averages.back(), targets.back()});
      elements += averages.back().numel();
    }
    const auto sync = [&] { be->synchronize(); };
    const float weight = 1.0f - 0.999f;
    const double fused = median_seconds([&] { lerp_towards(averages, targets, weight); }, opt, sync);
    const double each = median_seconds([&] { lerp_each(*be, slots, weight); }, opt, sync);
    const double bytes = 12.0 * double(elements);
    std::printf(
        "{\"bench\":\"ema\",\"tensors\":%zu,\"elements\":%lld,\"backend\":\"%s\",\"threads\":%d,\"ms_lerp_group\":%.3f,"
        "\"ms_three_kernels\":%.3f,\"speedup\":%.2f,\"gbs_lerp_group\":%.1f,\"gbs_three_kernels\":%.1f,\"cpu\":\"%s\"}"
        "\n",
        shapes.size(), (long long)elements, opt.backend.c_str(), opt.threads, fused * 1e3, each * 1e3, each / fused,
        bytes / fused * 1e-9, bytes / each * 1e-9, cpu_model().c_str());
    std::fflush(stdout);
  }
  // The MLP activation GELU-tanh at the DiT's and gpt-style hidden shapes (rows x 4d): the forward (unary), the
  // backward (unary_backward), the backward then its bias sums (reduce over the rows) and both fused
  // (unary_backward_sum, where the backend runs the dtype), in f32 and bf16. Memory-bound in principle: GB/s counts
  // each tensor read or written once (forward 2, backward 3 tensors; the sums' [D] output is negligible),
  // ns_per_element shows an arithmetic bound.
  if (opt.only.empty() || opt.only == "activations") {
    const std::vector<std::pair<Shape, const char*>> shapes = {{{1024, 1024}, "dit mlp"}, {{2048, 1536}, "d384 mlp"}};
    for (const auto& [shape, what] : shapes)
      for (DType dt : {DType::f32, DType::bf16}) {
        if (!be->supports(Kernel::unary_backward, dt).ok) continue;
        const Tensor x = cast(Tensor::normal(shape, 0, 1.5f, 21, 0, be), dt);
        const Tensor dy = cast(Tensor::normal(shape, 0, 1, 22, 0, be), dt);
        Tensor out = Tensor::empty(shape, dt, be), dx = Tensor::empty(shape, dt, be);
        Tensor dsum = Tensor::empty({shape[1]}, dt, be);
        const UnaryParams p{UnaryOp::gelu_tanh};
        const auto sync = [&] { be->synchronize(); };
        const double fwd = median_seconds([&] { be->unary(x, out, p); }, opt, sync);
        const double bwd = median_seconds([&] { be->unary_backward(x, dy, dx, p); }, opt, sync);
        ReduceParams rp;
        rp.op = ReduceOp::sum, rp.outer = 1, rp.reduce = shape[0], rp.inner = shape[1];
        const double bwd_reduce = median_seconds(
            [&] {
              be->unary_backward(x, dy, dx, p);
              be->reduce(dx, dsum, rp);
            },
            opt, sync);
        char fused[32] = "null";  // (null: the backend has no fused form in this dtype)
        if (be->supports(Kernel::unary_backward_sum, dt).ok)
          std::snprintf(fused, sizeof fused, "%.3f",
                        median_seconds([&] { be->unary_backward_sum(x, dy, dx, dsum, p); }, opt, sync) * 1e3);
        const double n = double(x.numel()), bytes = n * double(dtype_size(dt));
        std::printf(
            "{\"bench\":\"activation\",\"op\":\"gelu_tanh\",\"shape\":\"%lldx%lld\",\"what\":\"%s\","
            "\"dtype\":\"%s\",\"backend\":\"%s\",\"threads\":%d,"
            "\"ms_fwd\":%.3f,\"ms_bwd\":%.3f,\"ms_bwd_then_reduce\":%.3f,\"ms_bwd_sum\":%s,"
            "\"gbs_fwd\":%.1f,\"gbs_bwd\":%.1f,\"ns_per_element_fwd\":%.3f,\"ns_per_element_bwd\":%.3f,"
            "\"cpu\":\"%s\"}\n",
            (long long)shape[0], (long long)shape[1], what, dtype_name(dt), opt.backend.c_str(), opt.threads, fwd * 1e3,
            bwd * 1e3, bwd_reduce * 1e3, fused, 2 * bytes / fwd * 1e-9, 3 * bytes / bwd * 1e-9, fwd / n * 1e9,
            bwd / n * 1e9, cpu_model().c_str());
        std::fflush(stdout);
      }
  }
  // A bf16-mixed step's gradient products for its f32 operands (weights, and inputs autocast lowered) at the DiT's
  // and gpt-mini's weight and input gradient shapes, on a device GPT-2-small's too (B 8 x T 1024 rows): the widened
  // product (bf16 operands into an f32 output, dew/kernel_contracts.hpp; what the core runs since session 42) against
  // the former path, a bf16 product then a cast of its output to f32. "m x n x k", op(A) transposed as a weight
  // gradient's g^T x.
  if (opt.only.empty() || opt.only == "widened") {
    struct WideShape {
      int64_t m, n, k;
      bool ta;
      const char* what;
      bool device_only;
    };
    const WideShape shapes[] = {
        {256, 1024, 1024, true, "dit dW fc1/fc2", false},  {256, 256, 1024, true, "dit dW qkv/proj", false},
        {1024, 256, 1024, false, "dit dx fc2", false},     {384, 128, 2048, true, "gpt-mini dW mlp", false},
        {2048, 128, 384, false, "gpt-mini dx mlp", false}, {3072, 768, 8192, true, "gpt2-small dW mlp", true},
        {2304, 768, 8192, true, "gpt2-small dW qkv", true}};
    const bool native = be->supports(Kernel::matmul, DType::bf16).ok, on_device = !be->host_accessible();
    for (const WideShape& w : shapes) {
      if (!native) break;
      if (w.device_only && !on_device) continue;
      const Shape sa = w.ta ? Shape{w.k, w.m} : Shape{w.m, w.k};
      const Tensor a = cast(Tensor::normal(sa, 0, 1, 31, 0, be), DType::bf16);
      const Tensor b = cast(Tensor::normal({w.k, w.n}, 0, 1, 32, 0, be), DType::bf16);
      Tensor half = Tensor::empty({w.m, w.n}, DType::bf16, be), wide = Tensor::empty({w.m, w.n}, DType::f32, be);
      MatmulParams p;
      p.m = w.m, p.n = w.n, p.k = w.k, p.trans_a = w.ta;
      const auto sync = [&] { be->synchronize(); };
      const double widened = median_seconds([&] { be->matmul(a, b, Tensor(), wide, p); }, opt, sync);
      const double product_then_cast = median_seconds(
          [&] {
            be->matmul(a, b, Tensor(), half, p);
            be->cast(half, wide);
          },
          opt, sync);
      const double flops = 2.0 * double(w.m) * double(w.n) * double(w.k);
      std::printf(
          "{\"bench\":\"widened_product\",\"shape\":\"%lldx%lldx%lld%s\",\"what\":\"%s\",\"backend\":\"%s\","
          "\"threads\":%d,\"ms_widened\":%.3f,\"ms_bf16_then_cast\":%.3f,\"speedup\":%.2f,\"gflops_widened\":%.1f,"
          "\"cpu\":\"%s\"}\n",
          (long long)w.m, (long long)w.n, (long long)w.k, w.ta ? " At" : "", w.what, opt.backend.c_str(), opt.threads,
          widened * 1e3, product_then_cast * 1e3, product_then_cast / widened, flops / widened * 1e-9,
          cpu_model().c_str());
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace dew_bench
