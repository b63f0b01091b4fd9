#!/usr/bin/env python3
"""tests/interop/make_fixtures.py — writes the Hugging Face decoder fixtures the interop tests read.

An independent PyTorch implementation (float64, written from the Hugging Face modeling code's math,
not using `transformers`) of the Llama, Mistral, Qwen2 and Qwen3 decoders runs tiny random weights
and writes, per family, a folder under tests/interop/fixtures/<name>/:
    config.json                      the Hugging Face config (as `save_pretrained` writes it)
    model.safetensors                weights (Llama: BF16; Mistral: F16; the others F32), or
    model-0000K-of-0000N.safetensors + model.safetensors.index.json   (Qwen3: two shards)
    reference.safetensors            "tokens" I64 [B, T] and "logits" F32 [B, T, V] computed in float64
The C++ test loads each folder with dew's importer and compares logits (tolerance 1e-4).

Run once (PyTorch from Debian: /usr/bin/python3) and commit the small outputs:
    /usr/bin/python3 tests/interop/make_fixtures.py
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


def forward(cfg, p, tokens):
    """tokens [B, T] -> logits [B, T, V] (float64)."""
    f = lambda n: p[n].to(torch.float64)
    mt = cfg["model_type"]
    d = cfg["hidden_size"]
    nh, nkv = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // nh
    eps = cfg["rms_norm_eps"]
    theta = cfg["rope_theta"]
    L = cfg["num_hidden_layers"]
    b, t = tokens.shape
    window = None
    if mt == "mistral" and cfg.get("sliding_window"):
        window = cfg["sliding_window"]
    x = f("model.embed_tokens.weight")[tokens]
    inv_freq = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    pos = torch.arange(t, dtype=torch.float64)
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()
    i = torch.arange(t)[:, None]
    j = torch.arange(t)[None, :]
    allowed = j <= i
    if window:
        allowed = allowed & (i - j < window)  # the window counts the query's own key
    mask = torch.where(allowed, 0.0, float("-inf")).to(torch.float64)
    for l in range(L):
        pre = f"model.layers.{l}."
        h = rms_norm(x, f(pre + "input_layernorm.weight"), eps)

        def proj(name, h=h):
            y = h @ f(pre + f"self_attn.{name}.weight").T
            if pre + f"self_attn.{name}.bias" in p:
                y = y + f(pre + f"self_attn.{name}.bias")
            return y

        q = proj("q_proj").view(b, t, nh, hd)
        k = proj("k_proj").view(b, t, nkv, hd)
        v = proj("v_proj").view(b, t, nkv, hd)
        if mt == "qwen3":
            q = rms_norm(q, f(pre + "self_attn.q_norm.weight"), eps)
            k = rms_norm(k, f(pre + "self_attn.k_norm.weight"), eps)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, H, T, D]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = nh // nkv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        s = q @ k.transpose(-1, -2) / math.sqrt(hd) + mask
        o = torch.softmax(s, dim=-1) @ v
        o = o.transpose(1, 2).reshape(b, t, nh * hd) @ f(pre + "self_attn.o_proj.weight").T
        if pre + "self_attn.o_proj.bias" in p:
            o = o + f(pre + "self_attn.o_proj.bias")
        x = x + o
        h = rms_norm(x, f(pre + "post_attention_layernorm.weight"), eps)
        g = h @ f(pre + "mlp.gate_proj.weight").T
        u = h @ f(pre + "mlp.up_proj.weight").T
        x = x + (torch.nn.functional.silu(g) * u) @ f(pre + "mlp.down_proj.weight").T
    x = rms_norm(x, f("model.norm.weight"), eps)
    head = f("model.embed_tokens.weight") if cfg["tie_word_embeddings"] else f("lm_head.weight")
    return x @ head.T


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
        if mt == "qwen3":
            p[pre + "self_attn.q_norm.weight"] = 1.0 + r(hd)
            p[pre + "self_attn.k_norm.weight"] = 1.0 + r(hd)
        p[pre + "mlp.gate_proj.weight"] = r(ff, d)
        p[pre + "mlp.up_proj.weight"] = r(ff, d)
        p[pre + "mlp.down_proj.weight"] = r(d, ff)
        p[pre + "input_layernorm.weight"] = 1.0 + r(d)
        p[pre + "post_attention_layernorm.weight"] = 1.0 + r(d)
    p["model.norm.weight"] = 1.0 + r(d)
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
    logits = forward(cfg, p, tokens)
    write_safetensors(os.path.join(folder, "reference.safetensors"),
                      {"tokens": tokens, "logits": logits.to(torch.float32)})
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in os.listdir(folder))
    print(f"{name}: {len(p)} tensors, {size} bytes, |logits| max {logits.abs().max():.3f}")


COMMON = {"transformers_version": "4.51.0", "use_cache": True, "initializer_range": 0.02, "attention_dropout": 0.0,
          "bos_token_id": 1, "eos_token_id": 2, "rope_scaling": None}

if __name__ == "__main__":
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
