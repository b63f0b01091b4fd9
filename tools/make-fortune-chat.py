#!/usr/bin/python3
# tools/make-fortune-chat.py — a small chat set from the question/answer fortunes of fortune(6)
# (Debian's fortunes package: the "Q: ... A: ..." entries of /usr/share/games/fortunes/*), for the SFT
# example (configs/sft-fortunes.ini, docs/training.md):
#   /usr/bin/python3 tools/make-fortune-chat.py --out data/fortune-chat.jsonl [--preferences data/fortune-pref.jsonl]
# One conversation per fortune: {"messages": [system (every other one), user = the question, assistant =
# the answer]}, whitespace inside each part collapsed; sorted by file, in file order (deterministic).
# --preferences also writes DPO pairs (configs/dpo-fortunes.ini): prompt = the conversation without its
# answer, chosen = the answer, rejected = the answer of the fortune 37 places further on, each followed by
# the default template's end of turn "<|im_end|>".
import argparse
import glob
import json
import os
import re

ap = argparse.ArgumentParser()
ap.add_argument("--fortunes", default="/usr/share/games/fortunes")
ap.add_argument("--out", required=True)
ap.add_argument("--preferences")
a = ap.parse_args()
pairs = []
for path in sorted(glob.glob(os.path.join(a.fortunes, "*"))):
    if "." in os.path.basename(path) or not os.path.isfile(path):
        continue
    with open(path, encoding="utf-8", errors="replace") as f:
        entries = f.read().split("\n%\n")
    for e in entries:
        m = re.match(r"^Q:\s*(.*?)\nA:\s*(.*)$", e.strip(), re.S)
        if m and "\nQ:" not in m.group(2):
            q, ans = (" ".join(x.split()) for x in m.groups())
            if q and ans:
                pairs.append((q, ans))
os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
with open(a.out, "w", encoding="utf-8") as f:
    for i, (q, ans) in enumerate(pairs):
        msgs = [{"role": "system", "content": "Answer with a fortune."}] if i % 2 == 0 else []
        msgs += [{"role": "user", "content": q}, {"role": "assistant", "content": ans}]
        f.write(json.dumps({"messages": msgs}, ensure_ascii=False) + "\n")
print("make-fortune-chat: %d conversations -> %s" % (len(pairs), a.out))
if a.preferences:
    with open(a.preferences, "w", encoding="utf-8") as f:
        for i, (q, ans) in enumerate(pairs):
            msgs = [{"role": "system", "content": "Answer with a fortune."}] if i % 2 == 0 else []
            msgs.append({"role": "user", "content": q})
            other = pairs[(i + 37) % len(pairs)][1]
            f.write(json.dumps({"prompt": msgs, "chosen": ans + "<|im_end|>", "rejected": other + "<|im_end|>"},
                               ensure_ascii=False) + "\n")
    print("make-fortune-chat: %d preference pairs -> %s" % (len(pairs), a.preferences))
