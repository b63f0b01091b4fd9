#!/usr/bin/env python3
"""tools/bench/probe-curve.py RUN_DIR [--pause "YYYY-MM-DD HH:MM:SS" SECONDS] [METRIC ...] — a run's validation
metrics over wall-clock time.

Reads RUN_DIR/log.txt (the trainer's timestamped log: the first line is the start, every validation is a
"step N:  val KEY VALUE ..." line) and prints one markdown table row per validation: the update, the minutes
since the run started, and the asked metrics (default: the JEPA probes knn_accuracy and linear_accuracy, as
percentages, then loss and repr_std). Used for the two-hour JEPA curve in docs/benchmarks.md; any objective's
validation keys work (e.g. `probe-curve.py runs/diffusion-fmnist loss`). --pause (repeatable): the run was
stopped (SIGSTOP) for SECONDS from that time on; later rows do not count it.
"""
import datetime
import re
import sys

PERCENT = {"knn_accuracy", "linear_accuracy", "linear_train_accuracy", "accuracy"}


def main() -> int:
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 2 if len(sys.argv) < 2 else 0
    run_dir = sys.argv[1]
    args = sys.argv[2:]
    pauses = []
    while args and args[0] == "--pause":
        if len(args) < 3:
            print("probe-curve: --pause needs a time and a number of seconds", file=sys.stderr)
            return 2
        pauses.append((datetime.datetime.strptime(args[1], "%Y-%m-%d %H:%M:%S"), float(args[2])))
        args = args[3:]
    metrics = args or ["knn_accuracy", "linear_accuracy", "loss", "repr_std"]
    stamp = re.compile(r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d)\] (.*)$")
    start = None
    rows = []
    try:
        lines = open(f"{run_dir}/log.txt", encoding="utf-8").read().splitlines()
    except OSError as e:
        print(f"probe-curve: cannot read {run_dir}/log.txt: {e.strerror}", file=sys.stderr)
        return 1
    for line in lines:
        m = stamp.match(line)
        if not m:
            continue
        t = datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S")
        if start is None:
            start = t
        v = re.match(r"step (\d+):\s+(.*)$", m.group(2))
        if not v:
            continue
        vals = dict(re.findall(r"val (\S+) (\S+)", v.group(2)))
        paused = sum(sec for at, sec in pauses if t > at)
        rows.append((int(v.group(1)), ((t - start).total_seconds() - paused) / 60.0, vals))
    if not rows:
        print(f"probe-curve: no validation lines in {run_dir}/log.txt", file=sys.stderr)
        return 1
    print("| update | minutes | " + " | ".join(metrics) + " |")
    print("| --- | --- | " + " | ".join("---" for _ in metrics) + " |")
    for step, minutes, vals in rows:
        cells = []
        for k in metrics:
            if k not in vals:
                cells.append("—")
            elif k in PERCENT:
                cells.append(f"{100 * float(vals[k]):.2f} %")
            else:
                cells.append(f"{float(vals[k]):.4g}")
        print(f"| {step} | {minutes:.1f} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
