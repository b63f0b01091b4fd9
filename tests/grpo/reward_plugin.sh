#!/usr/bin/env bash
# tests/grpo/reward_plugin.sh CMAKE BUILD_DIR SOURCE_DIR WORK_DIR CXX — a GRPO reward function from a plugin built
# out of tree (examples/reward_plugin): installs the dew build into a fresh prefix, builds the plugin against it
# alone, then with the installed dew-run
#  1. `plugins` lists the plugin's reward with its kind, beside the grpo plugin's built-in ones;
#  2. a GRPO run rewards with it (weighted with a built-in) and logs reward_similarity; its validation completions
#     (samples/completions-step-N.jsonl) carry the plugin's scores, which a Levenshtein distance computed here in
#     Python over the completions' bytes reproduces exactly;
#  3. a run paused at 2 updates and resumed to 4 logs the straight run's losses bit for bit.
set -euo pipefail
cmake=$1 build=$2 src=$3 work=$4 cxx=$5
rm -rf "$work" && mkdir -p "$work"
prefix=$work/prefix
"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log"
"$cmake" -S "$src/examples/reward_plugin" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_CXX_COMPILER="$cxx" > "$work/configure.log" ||
  { cat "$work/configure.log"; exit 1; }
"$cmake" --build "$work/build" > "$work/build.log" || { cat "$work/build.log"; exit 1; }
test -f "$work/build/dew_similarity_reward.so"
dew() { "$prefix/bin/dew-run" "$@" --plugin-dir "$work/build" > "$work/last.log" 2>&1 || { cat "$work/last.log"; exit 1; }; }

dew plugins
grep -q "^similarity_reward  version 0.1.0  abi 1  $work/build/dew_similarity_reward.so\$" "$work/last.log"
grep -q "^    reward similarity  — 1 - Levenshtein" "$work/last.log"
grep -q "^    reward number_match  — " "$work/last.log"

printf 'placeholder\n' > "$work/corpus.txt"
"$prefix/bin/dew-tokenize" --input "$work/corpus.txt" --out "$work/bytes" > "$work/tok.log"
# Answers: the 95 printable ASCII bytes, rotated by the prompt's number — an untrained model's completion shares a
# byte or two with them about a third of the time, so the plugin's scores are small and varied, not all 0.
/usr/bin/python3 -c '
import json
ascii = "".join(chr(c) for c in range(32, 127))
for i in range(20):
    print(json.dumps({"prompt": "echo %d:" % i, "answer": ascii[i:] + ascii[:i]}))' > "$work/prompts.jsonl"
common=(--config "$src/tests/grpo/tiny.ini" --data.path "$work/prompts.jsonl" --data.tokenizer "$work/bytes"
        --run.seed 2 --objective.rewards "similarity, accuracy" --objective.reward_weights "1, 2"
        --objective.max_completion_length 3 --objective.log_completions 4 --data.prompt_len 12)
dew train "${common[@]}" --run-dir "$work/A"
grep -q '"reward_similarity":' "$work/A/metrics.jsonl" || { cat "$work/A/metrics.jsonl"; exit 1; }
completions="$work/A/samples/completions-step-00000004.jsonl"
[ -f "$completions" ] || { ls -R "$work/A"; echo "no $completions"; exit 1; }
/usr/bin/python3 - "$completions" <<'PY'
import json, math, sys
def lev(x, y):
    prev = list(range(len(y) + 1))
    for i in range(1, len(x) + 1):
        cur = [i] + [0] * len(y)
        for j in range(1, len(y) + 1):
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x[i - 1] != y[j - 1]))
        prev = cur
    return prev[len(y)]
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) == 16, len(lines)  # 4 prompts x 4 completions
for d in lines:
    x = bytes(d["tokens"]).strip(b" \t\r\n")
    y = d["answer"].encode().strip(b" \t\r\n")
    want = 1 - lev(x, y) / max(len(x), len(y), 1)
    got = d["scores"]["similarity"]
    assert abs(got - want) < 1e-12, (d, want)
    acc = 1.0 if x == y else 0.0
    assert abs(d["scores"]["accuracy"] - acc) < 1e-12, d
    assert abs(d["reward"] - (want + 2 * acc)) < 1e-9, d
nonzero = sum(1 for d in lines if d["scores"]["similarity"] > 0)
assert nonzero >= 3, "only %d of the completions scored above 0" % nonzero
print("similarity scores of", len(lines), "completions reproduced,", nonzero, "above 0")
PY
dew train "${common[@]}" --run-dir "$work/B" --trainer.stop_at 2
dew train --run-dir "$work/B" --resume
losses() { grep -o '"step":[0-9]*,"loss":[^,}]*' "$1/metrics.jsonl"; }
[ "$(losses "$work/A" | wc -l)" -eq 4 ] || { echo "expected 4 logged steps"; exit 1; }
diff <(losses "$work/A") <(losses "$work/B") || { echo "losses differ after resume"; exit 1; }
echo "PASS"
