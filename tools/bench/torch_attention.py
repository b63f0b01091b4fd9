#!/usr/bin/env python3
"""PyTorch peer of dew's attention kernel: causal scaled-dot-product attention, forward + backward, fp32.

q, k, v [B, H, T, D] with requires_grad; one step = out = SDPA(q, k, v, causal); out.backward(dout).
torch 1.13 (Debian) has no F.scaled_dot_product_attention, so the math path is written out as PyTorch's own
math fallback does it: softmax(q k^T * scale + causal mask) v (bmm through the BLAS; see peers/peer_env.sh).
Where F.scaled_dot_product_attention exists it is used instead (--impl auto).
Prints one JSON line: {"bench":"attention","shape":"B8xH6xT256xD64","threads":N,"ms_fwd_bwd":...}.
Run as: /work/shared/peers/peer_env.sh tuned 1 /usr/bin/python3 tools/bench/torch_attention.py --threads 1
"""
import argparse
import json
import math
import os
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    p = argparse.ArgumentParser(description="causal attention forward+backward timing (PyTorch)")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=6)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--impl", default="auto", choices=["auto", "math", "sdpa"])
    a = p.parse_args()

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    B, H, T, D = a.batch, a.heads, a.seq, a.dim
    scale = 1.0 / math.sqrt(D)
    q = torch.rand(B, H, T, D).mul_(2).sub_(1).requires_grad_()
    k = torch.rand(B, H, T, D).mul_(2).sub_(1).requires_grad_()
    v = torch.rand(B, H, T, D).mul_(2).sub_(1).requires_grad_()
    dout = torch.rand(B, H, T, D).mul_(2).sub_(1)
    have_sdpa = hasattr(F, "scaled_dot_product_attention")
    impl = a.impl if a.impl != "auto" else ("sdpa" if have_sdpa else "math")
    # additive causal mask built once (as a model would cache it)
    mask = torch.full((T, T), float("-inf")).triu_(1)

    def step():
        q.grad = k.grad = v.grad = None
        if impl == "sdpa":
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = torch.matmul(q, k.transpose(-2, -1)).mul_(scale).add_(mask)
            out = torch.matmul(torch.softmax(att, dim=-1), v)
        out.backward(dout)

    for _ in range(a.warmup):
        step()
    ts = []
    for _ in range(a.reps):
        t0 = time.perf_counter()
        step()
        ts.append(time.perf_counter() - t0)
    print(json.dumps({"bench": "attention", "impl": "torch-" + impl, "shape": f"B{B}xH{H}xT{T}xD{D}",
                      "threads": a.threads, "ms_fwd_bwd": round(statistics.median(ts) * 1e3, 3),
                      "ms_best": round(min(ts) * 1e3, 3), "torch": torch.__version__,
                      "torch_threads": torch.get_num_threads(), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")}))


if __name__ == "__main__":
    main()
