#!/usr/bin/python3
# tools/make-arithmetic.py — a verifiable-reward task for the GRPO example (configs/lm-arith.ini, then
# configs/grpo-arith.ini; docs/training.md "GRPO"): sums of two numbers below 100.
#   /usr/bin/python3 tools/make-arithmetic.py --out data/arith
# Writes, from a seeded shuffle of all 10,000 pairs (a, b), a < 100, b < 100 (deterministic):
#   <out>-sft.jsonl      {"text": "a+b=c"} for the first --sft pairs (the language-model stage's documents: one
#                        sum per document, so the model learns to end at the document token after c)
#   <out>-prompts.jsonl  {"prompt": "a+b=", "answer": "c"} for the next --val pairs (the val split: val_count)
#                        then the --rl pairs after them (the RL stage's training prompts)
# The three sets are disjoint: validation scores sums neither stage trained on.
import argparse
import json
import random

ap = argparse.ArgumentParser()
ap.add_argument("--out", required=True)
ap.add_argument("--sft", type=int, default=7000)
ap.add_argument("--val", type=int, default=256)
ap.add_argument("--rl", type=int, default=2744)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()
pairs = [(x, y) for x in range(100) for y in range(100)]
random.Random(a.seed).shuffle(pairs)
assert a.sft + a.val + a.rl <= len(pairs), "--sft + --val + --rl must be <= 10000"
with open(a.out + "-sft.jsonl", "w") as f:
    for x, y in pairs[: a.sft]:
        f.write(json.dumps({"text": f"{x}+{y}={x + y}"}) + "\n")
with open(a.out + "-prompts.jsonl", "w") as f:
    for x, y in pairs[a.sft : a.sft + a.val + a.rl]:
        f.write(json.dumps({"prompt": f"{x}+{y}=", "answer": str(x + y)}) + "\n")
