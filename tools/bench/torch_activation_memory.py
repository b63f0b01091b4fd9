#!/usr/bin/env python3
"""The resident memory PyTorch's first forward pass adds, for dew-bench train --activation-memory side by side.

The peer's own model (torch_gpt_train.py's GPT, from DEW_PEERS or ../shared/peers), built as its benchmark builds
it; what is measured is what dew-bench measures: the process's resident memory (/proc/self/statm) after the first
training forward (the loss computed, its graph and saved tensors held for the backward) minus before it. Run it
with MALLOC_MMAP_THRESHOLD_=65536 (as memory.sh does) so glibc returns freed blocks and maps big ones: resident
memory then follows the tensors alive, in both processes. Prints one JSON line.
"""
import argparse
import json
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
peers = os.environ.get("DEW_PEERS", os.path.join(here, "..", "..", "..", "shared", "peers"))
sys.path.insert(0, peers)

import torch  # noqa: E402

import torch_gpt_train as gpt  # noqa: E402


def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / (1024.0 * 1024.0)


def main():
    p = gpt.build_parser(__doc__)
    p.add_argument("--autocast", choices=["off", "bf16"], default="off")
    a = gpt.resolve(p.parse_args())
    torch.set_num_threads(a.threads)
    torch.manual_seed(a.seed)
    model = gpt.GPT(a)
    model.train()
    g = torch.Generator().manual_seed(a.seed)
    d = torch.randint(0, a.vocab, (a.batch, a.seq_len + 1), generator=g)
    x, y = d[:, :-1].contiguous(), d[:, 1:].contiguous()
    before = resident_mib()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=a.autocast == "bf16"):
        _, loss = model(x, y)
    after = resident_mib()
    loss.backward()
    print(json.dumps({"bench": "torch_activation_memory", "config": a.config, "norm": a.norm, "mlp": a.mlp,
                      "autocast": a.autocast, "torch": torch.__version__, "activation_rss_mb": after - before}))


if __name__ == "__main__":
    main()
