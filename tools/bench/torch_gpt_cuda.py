#!/usr/bin/env python3
"""PyTorch on a GPU, the same training step as `dew-bench train --config configs/gpt2-small.ini --backend cuda`.

The peer of dew's GPU table (docs/benchmarks.md): dew's decoder at configs/gpt2-small.ini's shape — d 768, 12
layers of 12 heads of 64, RMSNorm, rotary positions, biases on q/k/v, the output projection and the GELU (tanh)
MLP of 3072, tied embeddings over 50304 ids, T 1024, B 8 — trained by AdamW (fused) on random ids, the way
torchtitan / nanoGPT run it: scaled_dot_product_attention (flash kernels), `--precision bf16-mixed` as
torch.autocast(bfloat16) over f32 master weights, `f32` with TF32 off (dew's matmul_precision = highest).
`--compile` adds torch.compile (minutes of compilation before the timed steps).
FLOPs per step as dew-bench counts them: 6 * N_mm * B * T + 12 * L * d * T^2 * B (N_mm: the matrices of the
products, the tied head once). Prints one JSON line: ms per step (median of --steps after --warmup), tokens/s,
and the fraction of the GPU's bf16 (or f32) matmul peak measured here on 8192^3 (torch.matmul).
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, h, hidden):
        super().__init__()
        self.h = h
        self.n1 = nn.RMSNorm(d, eps=1e-5)
        self.qkv = nn.Linear(d, 3 * d, bias=True)
        self.o = nn.Linear(d, d, bias=True)
        self.n2 = nn.RMSNorm(d, eps=1e-5)
        self.up = nn.Linear(d, hidden, bias=True)
        self.down = nn.Linear(hidden, d, bias=True)

    def forward(self, x, cos, sin):
        B, T, D = x.shape
        q, k, v = self.qkv(self.n1(x)).view(B, T, 3, self.h, D // self.h).unbind(2)

        def rope(t):  # rotate halves, [B, T, H, hd]
            a, b = t.chunk(2, dim=-1)
            return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1).to(t.dtype)

        q, k = rope(q), rope(k)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(B, T, D))
        return x + self.down(F.gelu(self.up(self.n2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, hidden, T):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, heads, hidden) for _ in range(layers))
        self.norm = nn.RMSNorm(d, eps=1e-5)
        hd = d // heads
        freq = 10000.0 ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * freq[None, :]
        self.register_buffer("cos", ang.cos().float()[None, :, None, :], persistent=False)
        self.register_buffer("sin", ang.sin().float()[None, :, None, :], persistent=False)

    def forward(self, idx, targets):
        x = self.emb(idx)
        for b in self.blocks:
            x = b(x, self.cos, self.sin)
        logits = F.linear(self.norm(x), self.emb.weight)  # tied head
        return F.cross_entropy(logits.float().view(-1, logits.size(-1)), targets.reshape(-1))


def matmul_peak(dtype):
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 2 * n**3 * 10 / (time.perf_counter() - t0) / 1e9


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--precision", choices=["f32", "bf16-mixed"], default="bf16-mixed")
    p.add_argument("--compile", action="store_true")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=1024)
    a = p.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    V, D, L, H, HID, B, T = 50304, 768, 12, 12, 3072, a.batch, a.seq_len
    model = GPT(V, D, L, H, HID, T).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if a.compile else model
    data = torch.randint(0, V, (4, B, T + 1), device="cuda")
    batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        x, y = batches[i % len(batches)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=a.precision == "bf16-mixed"):
            loss = step_model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())  # synchronizes, as dew-bench reads its loss each step
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    n_mm = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear)) + V * D
    flops = 6 * n_mm * B * T + 12 * L * D * T * T * B
    ms = statistics.median(times) * 1e3
    peak = matmul_peak(torch.bfloat16 if a.precision == "bf16-mixed" else torch.float32)
    print(json.dumps({
        "bench": "torch_gpt_train_cuda", "config": "gpt2-small", "precision": a.precision, "compile": a.compile,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(), "batch": B, "seq_len": T,
        "params": sum(q.numel() for q in model.parameters()), "params_matmul": n_mm,
        "ms_per_step_median": round(ms, 2), "tokens_per_sec": round(B * T / (ms / 1e3), 1),
        "gflops": round(flops / (ms / 1e3) / 1e9, 1), "peak_gflops": round(peak, 1),
        "mfu_device": round(flops / (ms / 1e3) / 1e9 / peak, 4),
        "loss_first": round(losses[0], 4), "loss_last": round(losses[-1], 4),
        "mem_peak_mb": round(torch.cuda.max_memory_allocated() / 2**20, 1),
    }))


if __name__ == "__main__":
    main()
