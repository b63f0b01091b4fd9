#!/usr/bin/env python3
"""tests/dist/compare_checkpoints.py A.h5 B.h5 RTOL — two dew checkpoints read with h5py (an independent
reader of the layout in docs/checkpoint-format.md): the same datasets under params/, ema/ and optim/
(names, shapes, dtypes), and every tensor within max|a-b| <= RTOL * max|b| (RTOL 0: bit for bit).
Also checks state/@updates and state/@data.next agree. Prints the worst difference; exits 1 on a failure.
"""
import sys

import h5py
import numpy as np


def tensors(path):
    out = {}
    with h5py.File(path, "r") as f:
        for group in ("params", "ema", "optim"):
            if group in f:
                f[group].visititems(lambda n, o: out.__setitem__(f"{group}/{n}", o[()]) if isinstance(o, h5py.Dataset) else None)
        state = {k: f["state"].attrs[k] for k in ("updates", "data.next")}
    return out, state


def main():
    a_path, b_path, rtol = sys.argv[1], sys.argv[2], float(sys.argv[3])
    (a, sa), (b, sb) = tensors(a_path), tensors(b_path)
    if sorted(a) != sorted(b):
        print(f"different datasets: only in A {sorted(set(a) - set(b))}, only in B {sorted(set(b) - set(a))}")
        return 1
    if any(sa[k] != sb[k] for k in sa):
        print(f"different state: {sa} vs {sb}")
        return 1
    worst, worst_name, bad = 0.0, "-", []
    for name in sorted(a):
        x, y = a[name], b[name]
        if x.shape != y.shape or x.dtype != y.dtype:
            bad.append(f"{name}: {x.shape} {x.dtype} vs {y.shape} {y.dtype}")
            continue
        x64, y64 = x.astype(np.float64), y.astype(np.float64)
        diff = float(np.max(np.abs(x64 - y64))) if x.size else 0.0
        scale = float(np.max(np.abs(y64))) if y.size else 0.0
        rel = diff / scale if scale > 0 else diff
        if rel > worst:
            worst, worst_name = rel, name
        if (rtol == 0 and x.tobytes() != y.tobytes()) or rel > rtol:
            bad.append(f"{name} (max diff {diff:.3g}, relative {rel:.3g})")
    print(f"checkpoints: {len(a)} tensors, worst relative difference {worst:.3g} ({worst_name}), tolerance {rtol:g}")
    for line in bad:
        print("  exceeds:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
