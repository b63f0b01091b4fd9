#!/usr/bin/env python3
"""tools/bench/sitting_bars.py LOG — issue 18's (and 17's) bars, read from one sitting's output.

LOG is what tools/bench/sitting.sh printed (it runs this at its end), or the output of one of its scripts alone
(run-lm.sh runs it on its own output): the JSON lines of dew-bench and the PyTorch peers, and decode.sh's run lines
("system weights threads ms_per_token cpu_ms load"). The log is cut at its "## " section headers, so each section's
runs pair with their own peers: the i-th dew run of a key with the i-th peer run of the same key (the scripts
alternate them within each round; run-dit.sh's bf16-autocast peer runs twice a round, after the medium run and after
the bf16-mixed one, and each is keyed by the dew run it follows), and every ratio is the median of those per-round
ratios. Prints one Markdown table: the bar, the value measured, its per-round values and whether it is met. Bars with
no data in the log are left out. Independent of the build: it only reads the log.
A decode bar against PyTorch that this machine cannot reach is marked so: with the roofline section's f32 decode
floor (roofline_ms: the token's bytes at the measured read bandwidth), no decoder can beat PyTorch's token by more
than PyTorch's ms / the floor; where that ceiling is under the bar, the row says "bounded here" and gives it (the
Xeon of session 31: 2.80 / 1.55 = 1.81 < 2).
"""
import json
import re
import statistics
import sys
from collections import defaultdict

DECODE_LINE = re.compile(r"^(dew|dew-baseline|llama\.cpp|torch) (f32|bf16|int8|q8_0) (\d+) ([0-9.]+) (\S+)")


def sections(text):
    """The log's lines in sections, cut at lines starting with '## ' (the lines before the first header: one more)."""
    out = [[]]
    for line in text.splitlines():
        if line.startswith("## "):
            out.append([])
        else:
            out[-1].append(line)
    return out


def runs_of(lines):
    """(key -> [value, ...] in log order) for every run line of one section."""
    runs = defaultdict(list)
    last_dit = "f32"  # the precision of the last dew DiT run: the autocast peer run after it is its pair
    for line in lines:
        m = DECODE_LINE.match(line)
        if m:
            runs[("decode", m.group(1), m.group(2), int(m.group(3)))].append(float(m.group(4)))
            continue
        if not line.startswith("{"):
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError:
            continue
        bench = d.get("bench")
        dew = d.get("backend") == "cpu"
        who = "dew" if dew else "torch"
        threads = d.get("threads", d.get("threads_requested"))
        if bench == "gpt_train":
            prec = d.get("precision", "f32") if dew else ("bf16" if d.get("dtype") == "bf16-autocast" else "f32")
            runs[("train", who, d["config"], threads, prec)].append(d["tokens_per_sec"])
            if dew and d.get("mem_activations_mb") is not None:
                runs[("act_mb", d["config"], threads, prec)].append(d["mem_activations_mb"])
        elif bench == "dit_train":
            if dew:
                prec = last_dit = "bf16-mixed" if d.get("precision") == "bf16-mixed" else (
                    "bf16" if d.get("matmul_precision") == "medium" else "f32")
            else:  # "bf16": after medium (or alone); "bf16 after bf16-mixed": bf16-mixed's own pair
                prec = "f32" if d.get("dtype") != "bf16-autocast" else (
                    "bf16 after bf16-mixed" if last_dit == "bf16-mixed" else "bf16")
            runs[("dit", who, threads, prec)].append(d["images_per_sec"])
        elif bench == "generate":
            w = d.get("weights", "f32") if dew else ("bf16" if d.get("dtype") == "bf16" else "f32")
            runs[("generate", who, threads, w)].append(d["ms_per_token"])
        elif bench in ("roofline_train", "roofline_decode"):
            runs[(bench, d.get("weights", ""), d.get("threads"))].append(d["fraction"])
            if bench == "roofline_decode" and "roofline_ms" in d:
                runs[("decode_floor_ms", d.get("weights", ""), d.get("threads"))].append(d["roofline_ms"])
    return runs


def ratio(num, den, invert=False):
    """Per-round ratios num[i] / den[i] (den[i] / num[i] when invert: times), and their median."""
    if not num or not den:
        return None
    r = [(d / n if invert else n / d) for n, d in zip(num, den)]
    return statistics.median(r), r


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: sitting_bars.py LOG")
    rows = []  # (bar, value, rounds, met)

    def add(what, bar, got, higher=True, ceiling=None):
        if got is None:
            return
        value, rounds = got
        met = value >= bar if higher else value <= bar
        verdict = "met" if met else "**not met**"
        if not met and ceiling is not None and ceiling < bar:
            verdict += f" (bounded here: at most {ceiling:.2f}, the peer's time over the bandwidth floor)"
        rows.append((what, ("≥ " if higher else "≤ ") + f"{bar:g}", f"{value:.2f}",
                     ", ".join(f"{x:.2f}" for x in rounds), verdict))

    section_runs = [runs_of(lines) for lines in sections(open(sys.argv[1], errors="replace").read())]
    floors = [v for R in section_runs for v in R.get(("decode_floor_ms", "f32", 1), [])]
    floor_ms = statistics.median(floors) if floors else None

    def ceiling_over(peer_ms):  # the largest peer / dew ratio any decoder could reach against these peer times
        return statistics.median(peer_ms) / floor_ms if floor_ms and peer_ms else None

    for R in section_runs:
        for config, bar in (("char-small", 1.4), ("gpt-mini", 1.6)):
            add(f"{config} train, dew / PyTorch, 1 thread", bar,
                ratio(R[("train", "dew", config, 1, "f32")], R[("train", "torch", config, 1, "f32")]))
        add("char-small train, 2 threads / 1 thread (dew)", 1.8,
            ratio(R[("train", "dew", "char-small", 2, "f32")], R[("train", "dew", "char-small", 1, "f32")]))
        add("char-small decode f32, PyTorch / dew ms, 1 thread (run-lm)", 2.0,
            ratio(R[("generate", "dew", 1, "f32")], R[("generate", "torch", 1, "f32")], invert=True),
            ceiling=ceiling_over(R[("generate", "torch", 1, "f32")]))
        add("DiT train f32, dew / PyTorch, 1 thread", 1.4, ratio(R[("dit", "dew", 1, "f32")], R[("dit", "torch", 1, "f32")]))
        add("DiT bf16 operands (medium) / PyTorch bf16 autocast, 1 thread", 1.8,
            ratio(R[("dit", "dew", 1, "bf16")], R[("dit", "torch", 1, "bf16")]))
        add("DiT bf16-mixed / PyTorch bf16 autocast, 1 thread (medium's counterpart: bf16 activations, as autocast's)",
            1.8, ratio(R[("dit", "dew", 1, "bf16-mixed")], R[("dit", "torch", 1, "bf16 after bf16-mixed")]))
        add("DiT train f32, 2 threads / 1 thread (dew)", 1.8, ratio(R[("dit", "dew", 2, "f32")], R[("dit", "dew", 1, "f32")]))
        add("decode f32, PyTorch / dew ms, 1 thread (decode.sh)", 2.0,
            ratio(R[("decode", "dew", "f32", 1)], R[("decode", "torch", "f32", 1)], invert=True),
            ceiling=ceiling_over(R[("decode", "torch", "f32", 1)]))
        add("decode bf16 weights / dew f32 decode, 1 thread", 1.8,
            ratio(R[("decode", "dew", "bf16", 1)], R[("decode", "dew", "f32", 1)], invert=True))
        for t in (1, 2):
            for w in ("f32", "bf16"):
                add(f"decode {w}, llama.cpp / dew ms, {t} thread{'s' if t > 1 else ''}", 1.0,
                    ratio(R[("decode", "dew", w, t)], R[("decode", "llama.cpp", w, t)], invert=True))
        for (bench, w, t), v in sorted((k, v) for k, v in R.items() if k[0].startswith("roofline")):
            if bench == "roofline_train":
                add(f"roofline fraction, char-small training step, {t} thread", 0.9, (statistics.median(v), v))
            elif w == "f32":
                add(f"roofline fraction, char-small decode f32, {t} thread", 0.8, (statistics.median(v), v))
        add("bf16-mixed / dew f32, char-small (issue 17)", 1.5,
            ratio(R[("train", "dew", "char-small", 1, "bf16-mixed")], R[("train", "dew", "char-small", 1, "f32")]))
        add("bf16-mixed / PyTorch bf16 autocast, char-small (issue 17)", 1.3,
            ratio(R[("train", "dew", "char-small", 1, "bf16-mixed")], R[("train", "torch", "char-small", 1, "bf16")]))
        add("activation memory bf16-mixed / f32, char-small (issue 17)", 0.6,
            ratio(R[("act_mb", "char-small", 1, "bf16-mixed")], R[("act_mb", "char-small", 1, "f32")]), higher=False)
    if not rows:
        print("# sitting_bars.py: no runs of the issue's bars in this log")
        return
    print("| bar | target | measured (median) | per round | |")
    print("| --- | --- | --- | --- | --- |")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
