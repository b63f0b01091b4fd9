#!/usr/bin/env bash
# tests/bench/roofline.sh BIN_DIR WORK_DIR — `dew-bench roofline` on a tiny decoder (lm-tiny.ini), its output
# read back by an independent Python check:
# 1. every line is JSON (an inf or a nan is not); one roofline_machine, one roofline_train, and one
#    roofline_decode per weights setting (f32, bf16, int8);
# 2. each decode line has three rounds, and its measured_ms, bandwidth_gbs and fraction are the medians of the
#    rounds' (to the printed digits); memory_ms is bytes_per_token at bandwidth_gbs, roofline_ms the larger of
#    memory_ms and compute_ms; each round's fraction is that round's roofline over its ms/token;
#    the train line likewise: three rounds, its measured_ms, peak_gflops, fraction and matmul_fraction the
#    medians of the rounds', each round's fraction (FLOPs at that round's peak + memory_ms) over its step;
# 3. --threads 0 is refused with one line and exit status 2.
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work" && cd "$work"
OMP_NUM_THREADS=1 "$bin/dew-bench" roofline --config "$here/lm-tiny.ini" --threads 1 --steps 2 > out.jsonl 2> err.log ||
  { cat err.log; echo "FAIL: dew-bench roofline"; exit 1; }
/usr/bin/python3 - out.jsonl <<'PY'
import json, statistics, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]  # json rejects inf / nan
kinds = [l["bench"] for l in lines]
assert kinds.count("roofline_machine") == 1 and kinds.count("roofline_train") == 1, kinds
decode = [l for l in lines if l["bench"] == "roofline_decode"]
assert sorted(d["weights"] for d in decode) == ["bf16", "f32", "int8"], decode
def close(a, b, tol):
    assert abs(a - b) <= tol, (a, b, tol)
for d in decode:
    r = d["rounds"]
    assert len(r) == 3, r
    close(d["measured_ms"], statistics.median(x["measured_ms"] for x in r), 0.0015)
    close(d["bandwidth_gbs"], statistics.median(x["bandwidth_gbs"] for x in r), 0.051)
    close(d["fraction"], statistics.median(x["fraction"] for x in r), 0.0015)
    mem = d["bytes_per_token"] / (d["bandwidth_gbs"] * 1e9) * 1e3
    close(d["memory_ms"], mem, 0.0006 + mem * 0.05 / d["bandwidth_gbs"])
    close(d["roofline_ms"], max(d["memory_ms"], d["compute_ms"]), 0.0011)
    for x in r:
        roof = max(d["bytes_per_token"] / (x["bandwidth_gbs"] * 1e9) * 1e3, d["compute_ms"])
        want = roof / x["measured_ms"]
        close(x["fraction"], want, 0.0006 + want * (0.002 + 0.05 / x["bandwidth_gbs"]) + 0.001 / x["measured_ms"])
        assert 0 < x["fraction"] and x["measured_ms"] > 0 and x["bandwidth_gbs"] > 0, x
t = next(l for l in lines if l["bench"] == "roofline_train")
r = t["rounds"]
assert len(r) == 3, r
close(t["measured_ms"], statistics.median(x["measured_ms"] for x in r), 0.006)
close(t["peak_gflops"], statistics.median(x["peak_gflops"] for x in r), 0.051)
close(t["fraction"], statistics.median(x["fraction"] for x in r), 0.0015)
close(t["matmul_fraction"], statistics.median(x["matmul_fraction"] for x in r), 0.0015)
for x in r:
    want = (t["flops"] / (x["peak_gflops"] * 1e9) * 1e3 + t["memory_ms"]) / x["measured_ms"]
    close(x["fraction"], want, 0.0006 + want * (0.001 + 0.06 / x["peak_gflops"]) + 0.006 / x["measured_ms"])
    assert 0 < x["fraction"] and x["matmul_fraction"] > 0, x
print("roofline output: ok", [round(d["fraction"], 3) for d in decode])
PY
set +e
"$bin/dew-bench" roofline --config "$here/lm-tiny.ini" --threads 0 > refused.log 2>&1
status=$?
set -e
[ "$status" -eq 2 ] || { cat refused.log; echo "FAIL: --threads 0 exited $status, want 2"; exit 1; }
[ "$(wc -l < refused.log)" -eq 1 ] || { cat refused.log; echo "FAIL: --threads 0: want one line"; exit 1; }
echo "roofline: ok"
