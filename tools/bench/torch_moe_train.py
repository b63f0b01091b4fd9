#!/usr/bin/env python3
"""The PyTorch peer of a mixture-of-experts training step: ../shared/peers/torch_gpt_train.py's GPT (gpt-mini,
--norm rms --mlp swiglu, AdamW foreach) with every MLP replaced by a Qwen3-MoE sparse block as transformers writes
it (softmax router in f32, top-k, norm_topk_prob, a loop over the experts with index_add_) and the load-balancing
loss (transformers' load_balancing_loss_func over every layer, weight 0.001) added to the cross-entropy.

Compare with `dew-bench train --config tools/bench/gpt-mini-moe.ini` (the same shape: 8 experts of width 384,
top 2). Run under ../shared/peers/peer_env.sh tuned N /usr/bin/python3 (PYTHONPATH is set to the peers folder).
Prints one JSON line with dew-bench's field names (tokens_per_sec, ms_per_step).
"""
import argparse
import json
import os
import sys
import time

PEERS = os.environ.get("DEW_PEERS", os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../../shared/peers"))
sys.path.insert(0, PEERS)

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import peer_common as pc  # noqa: E402
import torch_gpt_train as gpt  # noqa: E402


class Expert(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.w1 = nn.Linear(d, hidden, bias=False)
        self.w3 = nn.Linear(d, hidden, bias=False)
        self.proj = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.proj(F.silu(self.w1(x)) * self.w3(x))


class SparseMoe(nn.Module):
    def __init__(self, d, hidden, experts, top_k):
        super().__init__()
        self.top_k = top_k
        self.gate = nn.Linear(d, experts, bias=False)
        self.experts = nn.ModuleList([Expert(d, hidden) for _ in range(experts)])
        self.router_logits = None

    def forward(self, x):
        b, t, d = x.shape
        h = x.reshape(-1, d)
        logits = self.gate(h)
        self.router_logits = logits
        probs = F.softmax(logits, dim=1, dtype=torch.float)
        w, sel = torch.topk(probs, self.top_k, dim=-1)
        w = (w / w.sum(dim=-1, keepdim=True)).to(h.dtype)
        out = torch.zeros_like(h)
        mask = F.one_hot(sel, num_classes=len(self.experts)).permute(2, 1, 0)  # [E, k, tokens]
        for e, expert in enumerate(self.experts):
            slot, token = torch.where(mask[e])
            if token.numel() == 0:
                continue
            out.index_add_(0, token, expert(h[token]) * w[token, slot, None])
        return out.reshape(b, t, d)


def balancing_loss(logits_per_layer, experts, top_k):
    probs = F.softmax(torch.cat(logits_per_layer, dim=0), dim=-1)
    _, sel = torch.topk(probs, top_k, dim=-1)
    mask = F.one_hot(sel, experts).float()
    return (mask.mean(dim=0) * probs.mean(dim=0).unsqueeze(0)).sum() * experts


def main():
    p = gpt.build_parser(__doc__)
    p.add_argument("--experts", type=int, default=8)
    p.add_argument("--top-k", type=int, default=2)
    p.add_argument("--expert-hidden", type=int, default=384)
    p.add_argument("--aux", type=float, default=0.001)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--steps", type=int, default=10)
    a = gpt.resolve(p.parse_args())
    pc.set_threads(a.threads)
    torch.manual_seed(a.seed)
    gpt.MLP = lambda d, kind, bias: SparseMoe(d, a.expert_hidden, a.experts, a.top_k)
    model = gpt.GPT(a)
    model.train()
    moes = [m for m in model.modules() if isinstance(m, SparseMoe)]
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1, foreach=True)
    g = torch.Generator().manual_seed(a.seed)
    data = torch.randint(0, a.vocab, (4, a.batch, a.seq_len + 1), generator=g)
    batches = [(d[:, :-1].contiguous(), d[:, 1:].contiguous()) for d in data]
    times, losses = [], []
    for i in range(a.warmup + a.steps):
        x, y = batches[i % len(batches)]
        t0 = time.perf_counter()
        _, ce = model(x, y)
        loss = ce + a.aux * balancing_loss([m.router_logits for m in moes], a.experts, a.top_k)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        lv = loss.item()
        dt = time.perf_counter() - t0
        losses.append(lv)
        if i >= a.warmup:
            times.append(dt)
        print(f"# step {i:3d} {dt * 1e3:9.1f} ms loss {lv:.4f}", file=sys.stderr, flush=True)
    tokens = a.batch * a.seq_len
    st = pc.summarize_times(times)
    print(json.dumps({"bench": "moe_train", "config": a.config, "experts": a.experts, "top_k": a.top_k,
                      "expert_hidden": a.expert_hidden, "threads": a.threads, "ms_per_step": sum(times) / len(times) * 1e3,
                      "ms_per_step_median": st["ms_median"], "tokens_per_sec": tokens * len(times) / sum(times),
                      "loss_first": losses[0], "loss_last": losses[-1]}))


if __name__ == "__main__":
    main()
