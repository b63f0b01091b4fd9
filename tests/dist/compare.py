#!/usr/bin/env python3
"""tests/dist/compare.py — numeric comparisons for the data-parallel tests (numpy only).

  compare.py weights A.safetensors B.safetensors RTOL   every tensor: max|a-b| <= RTOL * max|b|
  compare.py losses A/metrics.jsonl B/metrics.jsonl RTOL [FIRST_STEP]
                                                       per-step "loss": |a-b| <= RTOL * |b| (+1e-12)
  compare.py grad_norms A/metrics.jsonl B/metrics.jsonl RTOL [FIRST_STEP]
                                                       the same for the per-step "grad_norm"
  compare.py val A/metrics.jsonl B/metrics.jsonl RTOL  every "val/..." metric at every validated step;
                                                       the counts (val/tokens, val/pairs) exactly
RTOL 0 means bit-exact. Prints the worst relative difference; exits 1 when a check fails.
"""
import json
import struct
import sys

import numpy as np

DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "I32": np.int32, "I64": np.int64, "U8": np.uint8}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        out[name] = np.frombuffer(body[lo:hi], dtype=DTYPES[info["dtype"]]).reshape(info["shape"])
    return out


def weights(a_path, b_path, rtol):
    a, b = read_safetensors(a_path), read_safetensors(b_path)
    if sorted(a) != sorted(b):
        print(f"different tensor names: {sorted(a)} vs {sorted(b)}")
        return 1
    worst, worst_name, bad = 0.0, "", []
    for name in sorted(a):
        x, y = a[name].astype(np.float64), b[name].astype(np.float64)
        if x.shape != y.shape:
            print(f"{name}: shape {x.shape} vs {y.shape}")
            return 1
        diff = float(np.max(np.abs(x - y))) if x.size else 0.0
        scale = float(np.max(np.abs(y))) if y.size else 0.0
        rel = diff / scale if scale > 0 else diff
        if rel > worst:
            worst, worst_name = rel, name
        if (rtol == 0 and not np.array_equal(a[name], b[name])) or rel > rtol:
            bad.append(f"{name} (max diff {diff:.3g}, relative {rel:.3g})")
    print(f"weights: {len(a)} tensors, worst relative difference {worst:.3g} ({worst_name or '-'}), tolerance {rtol:g}")
    for line in bad:
        print("  exceeds:", line)
    return 1 if bad else 0


def per_step(path, key):
    out = {}
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            if key in rec:
                out[rec["step"]] = rec[key]
    return out


def compare_per_step(key, a_path, b_path, rtol, first):
    a, b = per_step(a_path, key), per_step(b_path, key)
    steps = sorted(s for s in a if s >= first)
    if steps != sorted(s for s in b if s >= first) or not steps:
        print(f"logged steps differ: {sorted(a)} vs {sorted(b)}")
        return 1
    worst, bad = 0.0, []
    for s in steps:
        rel = abs(a[s] - b[s]) / max(abs(b[s]), 1e-12)
        worst = max(worst, rel)
        if (rtol == 0 and a[s] != b[s]) or rel > rtol:
            bad.append(f"step {s}: {a[s]!r} vs {b[s]!r} (relative {rel:.3g})")
    print(f"{key}: steps {steps[0]}..{steps[-1]}, worst relative difference {worst:.3g}, tolerance {rtol:g}")
    for line in bad[:10]:
        print("  exceeds:", line)
    return 1 if bad else 0


def validation(a_path, b_path, rtol):
    def read(path):
        out = {}
        with open(path) as f:
            for line in f:
                rec = json.loads(line)
                vals = {k: v for k, v in rec.items() if k.startswith("val/")}
                if vals:
                    out[rec["step"]] = vals
        return out

    a, b = read(a_path), read(b_path)
    if sorted(a) != sorted(b) or not a:
        print(f"validated steps differ: {sorted(a)} vs {sorted(b)}")
        return 1
    worst, bad = 0.0, []
    for s in sorted(a):
        if sorted(a[s]) != sorted(b[s]):
            print(f"step {s}: different metrics {sorted(a[s])} vs {sorted(b[s])}")
            return 1
        for k in sorted(a[s]):
            x, y = a[s][k], b[s][k]
            rel = abs(x - y) / max(abs(y), 1e-12)
            exact = k in ("val/tokens", "val/pairs")
            if not exact:
                worst = max(worst, rel)
            if (exact or rtol == 0) and x != y or rel > rtol:
                bad.append(f"step {s} {k}: {x!r} vs {y!r} (relative {rel:.3g})")
    keys = sorted(a[sorted(a)[0]])
    print(f"validation: steps {sorted(a)}, {', '.join(keys)}: worst relative difference {worst:.3g}, tolerance {rtol:g}")
    for line in bad[:10]:
        print("  exceeds:", line)
    return 1 if bad else 0


if __name__ == "__main__":
    if len(sys.argv) >= 5 and sys.argv[1] == "val":
        sys.exit(validation(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    if len(sys.argv) >= 5 and sys.argv[1] == "weights":
        sys.exit(weights(sys.argv[2], sys.argv[3], float(sys.argv[4])))
    if len(sys.argv) >= 5 and sys.argv[1] in ("losses", "grad_norms"):
        first = int(sys.argv[5]) if len(sys.argv) > 5 else 0
        key = "loss" if sys.argv[1] == "losses" else "grad_norm"
        sys.exit(compare_per_step(key, sys.argv[2], sys.argv[3], float(sys.argv[4]), first))
    print(__doc__)
    sys.exit(2)
