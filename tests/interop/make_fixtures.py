#!/usr/bin/env python3
"""tests/interop/make_fixtures.py — writes the Hugging Face decoder fixtures the interop tests read.

An independent PyTorch implementation (float64, written from the Hugging Face modeling code's math,
not using `transformers`) of the Llama, Mistral, Qwen2 and Qwen3 decoders runs tiny random weights
and writes, per family (and llama31 / qwen2-yarn: llama3 and yarn rotary scaling; qwen3-moe: a mixture of
experts, whose reference also holds "aux_loss", transformers' load-balancing loss of the forward), a folder under
tests/interop/fixtures/<name>/:
    config.json                      the Hugging Face config (as `save_pretrained` writes it)
    model.safetensors                weights (Llama: BF16; Mistral: F16; the others F32), or
    model-0000K-of-0000N.safetensors + model.safetensors.index.json   (Qwen3: two shards)
    reference.safetensors            "tokens" I64 [B, T] and "logits" F32 [B, T, V] computed in float64
The C++ test loads each folder with dew's importer and compares logits (tolerance 1e-4).

Run once (PyTorch from Debian: /usr/bin/python3) and commit the small outputs:
    /usr/bin/python3 tests/interop/make_fixtures.py [NAME ...]   (only the named fixtures)
Deterministic (torch.manual_seed per fixture).
"""
import json
import math
import os
import struct

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "fixtures")

ST_DTYPES = {torch.float32: "F32", torch.float64: "F64", torch.bfloat16: "BF16", torch.float16: "F16",
             torch.int64: "I64", torch.int32: "I32"}


def write_safetensors(path, tensors, metadata=None):
    """The safetensors layout: u64 header length, JSON header, raw little-endian data."""
    header = {}
    if metadata:
        header["__metadata__"] = metadata
    blobs, offset = [], 0
    for name, t in tensors.items():
        t = t.contiguous()
        if t.dtype == torch.bfloat16:  # numpy has no bf16: reinterpret the bits
            raw = t.view(torch.int16).numpy().tobytes()
        else:
            raw = t.numpy().tobytes()
        header[name] = {"dtype": ST_DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * ((8 - len(h) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


# ---------------------------------------------------------------- the reference decoder (float64)

def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def rope_inv_freq(cfg, hd):
    """Per-pair rotation frequencies and the cos/sin factor of cfg's rope_scaling, in float64, written from
    transformers' modeling_rope_utils formulas (default, linear, llama3, yarn with the user's factor)."""
    theta = cfg["rope_theta"]
    idx = torch.arange(0, hd, 2, dtype=torch.float64)
    inv_freq = 1.0 / (theta ** (idx / hd))
    rs = cfg.get("rope_scaling") or {}
    kind = rs.get("rope_type", rs.get("type", "default"))
    if kind == "default":
        return inv_freq, 1.0
    factor = rs["factor"]
    if kind == "linear":
        return inv_freq / factor, 1.0
    if kind == "llama3":
        old = rs["original_max_position_embeddings"]
        lo, hi = rs["low_freq_factor"], rs["high_freq_factor"]
        wavelen = 2 * math.pi / inv_freq
        out = torch.where(wavelen > old / lo, inv_freq / factor, inv_freq)
        smooth = (old / wavelen - lo) / (hi - lo)
        smoothed = (1 - smooth) * out / factor + smooth * out
        medium = (wavelen >= old / hi) & (wavelen <= old / lo)
        return torch.where(medium, smoothed, out), 1.0
    if kind == "yarn":
        old = rs.get("original_max_position_embeddings") or cfg["max_position_embeddings"]
        beta_fast, beta_slow = rs.get("beta_fast") or 32, rs.get("beta_slow") or 1
        attn = rs.get("attention_factor")
        if attn is None:
            attn = 0.1 * math.log(factor) + 1.0 if factor > 1 else 1.0

        def corr(rot):
            return hd * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(theta))

        low, high = max(math.floor(corr(beta_fast)), 0), min(math.ceil(corr(beta_slow)), hd - 1)
        if low == high:
            high += 0.001
        ramp = ((torch.arange(hd // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
        extra = 1 - ramp
        return inv_freq / factor * (1 - extra) + inv_freq * extra, attn
    raise ValueError(kind)


def cos_sin(cfg, hd, t, local=False):
    """cos, sin [T, hd] of positions 0..T-1; Gemma 3's local layers: rope_local_base_freq, no scaling."""
    if local and cfg.get("rope_local_base_freq"):
        cfg = dict(cfg, rope_theta=cfg["rope_local_base_freq"], rope_scaling=None)
    inv_freq, attention_factor = rope_inv_freq(cfg, hd)
    freqs = torch.outer(torch.arange(t, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos() * attention_factor, emb.sin() * attention_factor


def layer_is_local(cfg, l):
    """Whether layer l uses the sliding window (transformers' per-family rules, or layer_types)."""
    mt = cfg["model_type"]
    if cfg.get("layer_types"):
        return cfg["layer_types"][l] == "sliding_attention"
    if mt == "mistral":
        return bool(cfg.get("sliding_window"))
    if mt == "gemma2":
        return l % 2 == 0
    if mt == "gemma3_text":
        return (l + 1) % cfg.get("sliding_window_pattern", 6) != 0
    return False


def moe_mlp(cfg, p, pre, h, router_logits):
    """Qwen3-MoE's sparse block (transformers' Qwen3MoeSparseMoeBlock): softmax router, top-k (ties to the lower
    index, as torch.topk on these random values never meets), norm_topk_prob, each token through its k experts."""
    n_exp, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    b, t, d = h.shape
    x = h.reshape(-1, d)
    logits = x @ p[pre + "mlp.gate.weight"].to(torch.float64).T
    router_logits.append(logits)
    probs = torch.softmax(logits, dim=-1)
    w, sel = torch.topk(probs, k, dim=-1)
    if cfg.get("norm_topk_prob", False):
        w = w / w.sum(dim=-1, keepdim=True)
    out = torch.zeros_like(x)
    for e in range(n_exp):
        f = lambda n: p[pre + f"mlp.experts.{e}.{n}.weight"].to(torch.float64)
        y = (torch.nn.functional.silu(x @ f("gate_proj").T) * (x @ f("up_proj").T)) @ f("down_proj").T
        out += y * (w * (sel == e)).sum(dim=-1, keepdim=True)
    return out.reshape(b, t, d)


def load_balancing_loss(cfg, router_logits):
    """transformers' load_balancing_loss_func over every layer's router logits (no attention mask)."""
    n_exp, k = cfg["num_experts"], cfg["num_experts_per_tok"]
    logits = torch.cat(router_logits, dim=0)
    probs = torch.softmax(logits, dim=-1)
    _, sel = torch.topk(probs, k, dim=-1)
    mask = torch.nn.functional.one_hot(sel, n_exp).to(torch.float64)  # [tokens, k, E]
    return (mask.mean(dim=0) * probs.mean(dim=0).unsqueeze(0)).sum() * n_exp


def forward(cfg, p, tokens, router_logits=None):
    """tokens [B, T] -> logits [B, T, V] (float64); a mixture of experts appends each layer's router logits."""
    f = lambda n: p[n].to(torch.float64)
    mt = cfg["model_type"]
    gemma = mt in ("gemma2", "gemma3_text")
    d = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // nh
    eps = cfg["rms_norm_eps"]
    L = cfg["num_hidden_layers"]
    b, t = tokens.shape
    # Gemma: (1 + w) norms, embeddings times sqrt(hidden), scores by query_pre_attn_scalar^-0.5, softcaps.
    norm = (lambda x, w: rms_norm(x, 1.0 + w, eps)) if gemma else (lambda x, w: rms_norm(x, w, eps))
    scale = cfg["query_pre_attn_scalar"] ** -0.5 if gemma else 1.0 / math.sqrt(hd)
    attn_cap, final_cap = cfg.get("attn_logit_softcapping"), cfg.get("final_logit_softcapping")
    x = f("model.embed_tokens.weight")[tokens]
    if gemma:
        x = x * math.sqrt(d)
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    for l in range(L):
        pre = f"model.layers.{l}."
        local = layer_is_local(cfg, l)
        cos, sin = cos_sin(cfg, hd, t, local)
        allowed = j <= i
        if local:
            allowed = allowed & (i - j < cfg["sliding_window"])  # the window counts the query's own key
        mask = torch.where(allowed, 0.0, float("-inf")).to(torch.float64)
        h = norm(x, f(pre + "input_layernorm.weight"))

        def proj(name, h=h):
            y = h @ f(pre + f"self_attn.{name}.weight").T
            if pre + f"self_attn.{name}.bias" in p:
                y = y + f(pre + f"self_attn.{name}.bias")
            return y

        q = proj("q_proj").view(b, t, nh, hd)
        k = proj("k_proj").view(b, t, nkv, hd)
        v = proj("v_proj").view(b, t, nkv, hd)
        if mt in ("qwen3", "gemma3_text", "qwen3_moe"):
            q = norm(q, f(pre + "self_attn.q_norm.weight"))
            k = norm(k, f(pre + "self_attn.k_norm.weight"))
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = q @ k.transpose(-1, -2) * scale
        if attn_cap:
            s = attn_cap * torch.tanh(s / attn_cap)
        o = torch.softmax(s + mask, dim=-1) @ v
        o = o.transpose(1, 2).reshape(b, t, nh * hd) @ f(pre + "self_attn.o_proj.weight").T
        if pre + "self_attn.o_proj.bias" in p:
            o = o + f(pre + "self_attn.o_proj.bias")
        if gemma:  # sandwich norms: the branch outputs are normed before the residual adds
            x = x + norm(o, f(pre + "post_attention_layernorm.weight"))
            h = norm(x, f(pre + "pre_feedforward_layernorm.weight"))
        else:
            x = x + o
            h = norm(x, f(pre + "post_attention_layernorm.weight"))
        if mt == "qwen3_moe":
            m = moe_mlp(cfg, p, pre, h, router_logits if router_logits is not None else [])
        else:
            g = h @ f(pre + "mlp.gate_proj.weight").T
            u = h @ f(pre + "mlp.up_proj.weight").T
            act = torch.nn.functional.gelu(g, approximate="tanh") if gemma else torch.nn.functional.silu(g)
            m = (act * u) @ f(pre + "mlp.down_proj.weight").T
        x = x + (norm(m, f(pre + "post_feedforward_layernorm.weight")) if gemma else m)
    x = norm(x, f("model.norm.weight"))
    head = f("model.embed_tokens.weight") if cfg["tie_word_embeddings"] else f("lm_head.weight")
    logits = x @ head.T
    if final_cap:
        logits = final_cap * torch.tanh(logits / final_cap)
    return logits


def make_params(cfg, dtype):
    d, V = cfg["hidden_size"], cfg["vocab_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // nh
    ff = cfg["intermediate_size"]
    mt = cfg["model_type"]
    qkv_bias = mt == "qwen2" or cfg.get("attention_bias", False)
    o_bias = mt in ("llama", "qwen3") and cfg.get("attention_bias", False)
    p = {}
    r = lambda *s: torch.randn(*s, dtype=torch.float64) * 0.2
    p["model.embed_tokens.weight"] = r(V, d) * 2.5
    for l in range(cfg["num_hidden_layers"]):
        pre = f"model.layers.{l}."
        p[pre + "self_attn.q_proj.weight"] = r(nh * hd, d)
        p[pre + "self_attn.k_proj.weight"] = r(nkv * hd, d)
        p[pre + "self_attn.v_proj.weight"] = r(nkv * hd, d)
        p[pre + "self_attn.o_proj.weight"] = r(d, nh * hd)
        if qkv_bias:
            p[pre + "self_attn.q_proj.bias"] = r(nh * hd)
            p[pre + "self_attn.k_proj.bias"] = r(nkv * hd)
            p[pre + "self_attn.v_proj.bias"] = r(nkv * hd)
        if o_bias:
            p[pre + "self_attn.o_proj.bias"] = r(d)
        gemma = mt in ("gemma2", "gemma3_text")
        if mt in ("qwen3", "gemma3_text", "qwen3_moe"):  # Gemma's norms scale by (1 + w): w near 0
            p[pre + "self_attn.q_norm.weight"] = r(hd) + (0.0 if gemma else 1.0)
            p[pre + "self_attn.k_norm.weight"] = r(hd) + (0.0 if gemma else 1.0)
        if gemma:
            p[pre + "pre_feedforward_layernorm.weight"] = r(d)
            p[pre + "post_feedforward_layernorm.weight"] = r(d)
        if mt == "qwen3_moe":
            fe = cfg["moe_intermediate_size"]
            p[pre + "mlp.gate.weight"] = r(cfg["num_experts"], d) * 2.0
            for e in range(cfg["num_experts"]):
                p[pre + f"mlp.experts.{e}.gate_proj.weight"] = r(fe, d)
                p[pre + f"mlp.experts.{e}.up_proj.weight"] = r(fe, d)
                p[pre + f"mlp.experts.{e}.down_proj.weight"] = r(d, fe)
        else:
            p[pre + "mlp.gate_proj.weight"] = r(ff, d)
            p[pre + "mlp.up_proj.weight"] = r(ff, d)
            p[pre + "mlp.down_proj.weight"] = r(d, ff)
        p[pre + "input_layernorm.weight"] = r(d) + (0.0 if gemma else 1.0)
        p[pre + "post_attention_layernorm.weight"] = r(d) + (0.0 if gemma else 1.0)
    p["model.norm.weight"] = r(d) + (0.0 if mt in ("gemma2", "gemma3_text") else 1.0)
    if not cfg["tie_word_embeddings"]:
        p["lm_head.weight"] = r(V, d)
    # Stored in `dtype`; the reference computes from the stored (rounded) values.
    return {k: v.to(dtype) for k, v in p.items()}


def write_fixture(name, cfg, dtype, shards=1, seed=0, tokens_shape=(2, 9)):
    torch.manual_seed(seed)
    folder = os.path.join(OUT, name)
    os.makedirs(folder, exist_ok=True)
    for f in os.listdir(folder):
        os.remove(os.path.join(folder, f))
    p = make_params(cfg, dtype)
    with open(os.path.join(folder, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")
    names = list(p.keys())
    if shards == 1:
        write_safetensors(os.path.join(folder, "model.safetensors"), p, {"format": "pt"})
    else:
        per = (len(names) + shards - 1) // shards
        weight_map, total = {}, 0
        for s in range(shards):
            fname = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
            part = {n: p[n] for n in names[s * per:(s + 1) * per]}
            write_safetensors(os.path.join(folder, fname), part, {"format": "pt"})
            for n, t in part.items():
                weight_map[n] = fname
                total += t.numel() * t.element_size()
        with open(os.path.join(folder, "model.safetensors.index.json"), "w") as f:
            json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, f, indent=2, sort_keys=True)
    tokens = torch.randint(0, cfg["vocab_size"], tokens_shape, dtype=torch.int64)
    router_logits = []
    logits = forward(cfg, p, tokens, router_logits)
    ref = {"tokens": tokens, "logits": logits.to(torch.float32)}
    if router_logits:  # a mixture of experts: its load-balancing loss (unweighted) over this forward
        ref["aux_loss"] = load_balancing_loss(cfg, router_logits).reshape(1).to(torch.float32)
    write_safetensors(os.path.join(folder, "reference.safetensors"), ref)
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print(f"{name}: {len(p)} tensors, {size} bytes, |logits| max {logits.abs().max():.3f}")


COMMON = {"transformers_version": "4.51.0", "use_cache": True, "initializer_range": 0.02, "attention_dropout": 0.0,
          "bos_token_id": 1, "eos_token_id": 2, "rope_scaling": None}

if __name__ == "__main__":
    import sys
    only = set(sys.argv[1:])  # fixture names to write (default: all)
    if only:
        write_fixture = (lambda write: lambda name, *a, **k: write(name, *a, **k) if name in only else None)(
            write_fixture)
    llama = dict(COMMON, architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=61, hidden_size=32,
                 intermediate_size=40, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 hidden_act="silu", max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                 tie_word_embeddings=False, attention_bias=False, mlp_bias=False, pretraining_tp=1,
                 torch_dtype="bfloat16", pad_token_id=None)
    write_fixture("llama", llama, torch.bfloat16, seed=1)

    qwen3 = dict(COMMON, architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=53, hidden_size=32,
                 intermediate_size=48, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=1,
                 head_dim=16, hidden_act="silu", max_position_embeddings=256, max_window_layers=2,
                 rms_norm_eps=1e-6, rope_theta=1000000.0, sliding_window=None, use_sliding_window=False,
                 tie_word_embeddings=True, attention_bias=False, torch_dtype="float32")
    write_fixture("qwen3", qwen3, torch.float32, shards=2, seed=2)

    qwen2 = dict(COMMON, architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=47, hidden_size=24,
                 intermediate_size=40, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1,
                 hidden_act="silu", max_position_embeddings=64, max_window_layers=2, rms_norm_eps=1e-6,
                 rope_theta=10000.0, sliding_window=32, use_sliding_window=False, tie_word_embeddings=True,
                 torch_dtype="float32")
    write_fixture("qwen2", qwen2, torch.float32, seed=3)

    mistral = dict(COMMON, architectures=["MistralForCausalLM"], model_type="mistral", vocab_size=41,
                   hidden_size=32, intermediate_size=40, num_hidden_layers=2, num_attention_heads=4,
                   num_key_value_heads=2, head_dim=8, hidden_act="silu", max_position_embeddings=64,
                   rms_norm_eps=1e-5, rope_theta=10000.0, sliding_window=4, tie_word_embeddings=False,
                   torch_dtype="float16")
    write_fixture("mistral", mistral, torch.float16, seed=4, tokens_shape=(2, 10))

    # Rotary scaling: Llama 3.1's llama3 (head_dim 8, theta 1e4: wavelengths 6.3 kept, 63 blended, 628 and 6283
    # interpolated against an original 64) and YaRN with its attention factor (head_dim 16, original 256: pair 0
    # kept, 1-3 on the ramp, 4-7 interpolated).
    llama31 = dict(llama, max_position_embeddings=512, rope_theta=10000.0, tie_word_embeddings=True,
                   rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
                   torch_dtype="float32")
    write_fixture("llama31", llama31, torch.float32, seed=5, tokens_shape=(2, 40))
    qwen2_yarn = dict(qwen2, max_position_embeddings=1024, head_dim=16, num_attention_heads=2, num_key_value_heads=1,
                      hidden_size=24, rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                                    "original_max_position_embeddings": 256})
    write_fixture("qwen2-yarn", qwen2_yarn, torch.float32, seed=6, tokens_shape=(2, 40))

    # Gemma 2 (sandwich norms, (1 + w), embeddings * sqrt(hidden), query_pre_attn_scalar, both softcaps,
    # sliding window on even layers) and Gemma 3 (qk-norm, local layers on rope_local_base_freq, global ones
    # on rope_theta with linear scaling, five local layers to one global), 3 and 6 layers over 24 tokens.
    gemma_common = dict(COMMON, vocab_size=43, hidden_size=32, intermediate_size=48, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=16, hidden_activation="gelu_pytorch_tanh",
                        max_position_embeddings=256, rms_norm_eps=1e-6, attention_bias=False,
                        tie_word_embeddings=True, torch_dtype="float32", pad_token_id=0)
    gemma2 = dict(gemma_common, architectures=["Gemma2ForCausalLM"], model_type="gemma2", num_hidden_layers=3,
                  rope_theta=10000.0, query_pre_attn_scalar=24, sliding_window=5, final_logit_softcapping=15.0,
                  attn_logit_softcapping=4.0, cache_implementation="hybrid", hidden_act="gelu_pytorch_tanh")
    write_fixture("gemma2", gemma2, torch.float32, seed=7, tokens_shape=(2, 24))
    gemma3 = dict(gemma_common, architectures=["Gemma3ForCausalLM"], model_type="gemma3_text", num_hidden_layers=6,
                  rope_theta=1000000.0, rope_local_base_freq=10000.0, query_pre_attn_scalar=16, sliding_window=6,
                  sliding_window_pattern=6, final_logit_softcapping=None, attn_logit_softcapping=None,
                  rope_scaling={"rope_type": "linear", "factor": 8.0}, cache_implementation="hybrid")
    write_fixture("gemma3", gemma3, torch.float32, seed=8, tokens_shape=(2, 24))

    # Qwen3-MoE: 4 experts, top 2 renormalised (norm_topk_prob), qk-norm, every layer sparse.
    qwen3_moe = dict(qwen3, architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", num_experts=4,
                     num_experts_per_tok=2, moe_intermediate_size=24, norm_topk_prob=True, decoder_sparse_step=1,
                     mlp_only_layers=[], router_aux_loss_coef=0.001, output_router_logits=False)
    write_fixture("qwen3-moe", qwen3_moe, torch.float32, seed=9, tokens_shape=(2, 12))
