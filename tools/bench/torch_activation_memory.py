#!/usr/bin/env python3
"""The resident memory PyTorch's first forward pass adds, for dew-bench train --activation-memory side by side.

The peers' own models (torch_gpt_train.py's GPT with --model gpt, torch_dit_train.py's DiT with --model dit, from
DEW_PEERS or ../shared/peers), built as their benchmarks build them; what is measured is what dew-bench measures:
the process's resident memory (/proc/self/statm) after the first training forward (the loss computed, its graph
and saved tensors held for the backward) minus before it. Run it with MALLOC_MMAP_THRESHOLD_=65536 (as memory.sh
does) so glibc returns freed blocks and maps big ones: resident memory then follows the tensors alive, in both
processes. Prints one JSON line.
"""
import argparse
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
peers = os.environ.get("DEW_PEERS", os.path.join(here, "..", "..", "..", "shared", "peers"))
sys.path.insert(0, peers)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import torch_dit_train as dit  # noqa: E402
import torch_gpt_train as gpt  # noqa: E402


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)


def gpt_forward(a):
    """The GPT peer at --config (its batch and sequence), one training forward; returns the loss."""
    model = gpt.GPT(a)
    model.train()
    g = torch.Generator().manual_seed(a.seed)
    d = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=g)
    x, y = d[:, :-1].contiguous(), d[:, 1:].contiguous()
    return lambda: model(x, y)[1]


def dit_forward(a):
    """The DiT peer at its defaults (32x32x3, patch 4, d 256, 6 layers, 4 heads, batch 16): eps-prediction MSE."""
    model = dit.DiT(32, 3, 4, 256, 6, 4)
    model.train()
    g = torch.Generator().manual_seed(a.seed)
    x0 = torch.rand(16, 3, 32, 32, generator=g) * 2 - 1
    t = torch.randint(0, 1000, (16,), generator=g)
    eps = torch.randn(x0.shape, generator=g)
    ab = dit.cosine_alpha_bar(1000)[t].view(-1, 1, 1, 1)
    xt = ab.sqrt() * x0 + (1 - ab).sqrt() * eps
    return lambda: F.mse_loss(model(xt, t).float(), eps)


def main():
    p = gpt.build_parser(__doc__)
    p.add_argument("--model", choices=["gpt", "dit"], default="gpt")
    p.add_argument("--autocast", choices=["off", "bf16"], default="off")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    if a.model == "gpt":
        a = gpt.resolve(a)
        forward = gpt_forward(a)
        config = a.config
    else:
        forward = dit_forward(a)
        config = "dit"
    before = resident_mib()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
        loss = forward()
    after = resident_mib()
    loss.backward()
    result = {"bench": "torch_activation_memory", "config": config, "autocast": a.autocast, "torch": torch.__version__,
              "activation_rss_mb": after - before}
    if a.model == "gpt":
        result.update(norm=a.norm, mlp=a.mlp)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
