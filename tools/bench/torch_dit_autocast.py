#!/usr/bin/env python3
"""The PyTorch DiT peer (../shared/peers/torch_dit_train.py) with bf16 autocast: PyTorch's mixed precision.

Runs the peer's own main() unchanged except that DiT.forward runs under
torch.autocast("cpu", dtype=torch.bfloat16) and returns f32 (the loss stays f32), which is how a PyTorch
user trains in bf16 on a CPU: matmuls (and what autocast lists) in bf16 through oneDNN, master weights and
AdamW in f32. It is the peer for `dew-bench train --config dit --matmul-precision medium`, dew's bf16
matmul operands. The JSON line says "dtype": "bf16-autocast". Same arguments as the peer; run it under
peer_env.sh like the peer:
    peer_env.sh tuned 1 /usr/bin/python3 tools/bench/torch_dit_autocast.py --threads 1
The peers' folder is $DEW_PEERS, else ../shared/peers from the repository root.
"""
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
peers = os.environ.get("DEW_PEERS", os.path.join(here, "..", "..", "..", "shared", "peers"))
sys.path.insert(0, os.path.abspath(peers))

import torch  # noqa: E402

import peer_common  # noqa: E402
import torch_dit_train as peer  # noqa: E402

fp32_forward = peer.DiT.forward


def autocast_forward(self, x, t):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = fp32_forward(self, x, t)
    return out.float()


peer.DiT.forward = autocast_forward
plain_emit = peer_common.emit


def emit(result):
    result["dtype"] = "bf16-autocast"
    plain_emit(result)


peer_common.emit = emit  # the module the peer calls as pc

if __name__ == "__main__":
    peer.main()
