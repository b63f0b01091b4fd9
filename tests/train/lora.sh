#!/usr/bin/env bash
# tests/train/lora.sh BIN_DIR WORK_DIR — LoRA fine-tuning of a byte-level LM end to end ([lora], dew/lora.hpp).
# A base run trains 6 updates; a LoRA run (rank 4, q/v and the MLP's down projection, the norms trained too)
# continues it from trainer.init_from. Checked with h5py and numpy, independent of dew:
#   - the log says what is trained; the LoRA run's checkpoint holds every base parameter bit-identical to
#     the base run's (the frozen ones) except the norms, which moved, and adapters whose B moved off zero;
#     optimizer state exists for the adapters and norms only;
#   - export writes the base names only, each adapted weight = W + (alpha / r) B A from the checkpoint;
#   - an HF export of the LoRA run, imported again, samples the same text as the LoRA run itself (inference
#     runs the merged model);
#   - a resumed LoRA run (3 + 3 updates) equals the straight one bit for bit; under bf16-mixed with recomputed
#     blocks the frozen f32 weights stay as they were;
#   - optim.freeze keeps the embedding bit-identical while the rest trains; muonclip and jepa are refused
#     with [lora].
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
rm -rf "$work" && mkdir -p "$work"
run() { "$bin/dew-run" "$@" > "$work/last.log" 2>&1 < /dev/null || { echo "FAILED: dew-run $*"; cat "$work/last.log"; exit 1; }; }
"$bin/dew-tokenize" --input /usr/share/games/fortunes/magic --out "$work/magic" > "$work/tok.log" 2>&1 || { cat "$work/tok.log"; exit 1; }
common=(train --config "$here/../report/lm-tiny.ini" --data.path "$work/magic" --trainer.checkpoint_every 3
        --trainer.eval_every 0 --objective.sample_tokens 0)
run "${common[@]}" --run-dir "$work/base" --trainer.steps 6
lora=(--trainer.init_from "$work/base" --lora.rank 4 --lora.alpha 8 --lora.targets "*.q_proj,*.v_proj,*.down_proj"
      --lora.train "*norm.weight" --optim.lr 0.01)
run "${common[@]}" --run-dir "$work/lora" --trainer.steps 6 "${lora[@]}"
cp "$work/last.log" "$work/lora.log"
grep -q "fine-tuning: LoRA rank 4 (scale 2) on 6 linear layers" "$work/lora.log" ||
  { echo "no fine-tuning line"; cat "$work/lora.log"; exit 1; }
run export --run-dir "$work/lora" --out "$work/lora.export" --no-ema
"$PYTHON" - "$work/base/checkpoints/step-00000006.h5" "$work/lora/checkpoints/step-00000006.h5" \
  "$work/lora.export/model.safetensors" <<'PY'
import json, struct, sys
import h5py, numpy as np
base_path, lora_path, export_path = sys.argv[1:4]
def group(f, name):
    out = {}
    f[name].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
with h5py.File(base_path) as f: base = group(f, "params")
with h5py.File(lora_path) as f: lora, m = group(f, "params"), group(f, "optim/m")
adapters = sorted(n for n in lora if "lora_" in n)
assert len(adapters) == 12, adapters  # 2 layers x (q, v, down) x (A, B)
assert set(lora) - set(adapters) == set(base), "the base parameters are all in the LoRA checkpoint"
for n in base:
    same = np.array_equal(base[n], lora[n])
    if "norm.weight" in n: assert not same, f"{n}: trained (lora.train) but unchanged"
    else: assert same, f"{n}: frozen but changed"
for n in adapters:
    if "lora_B" in n: assert np.abs(lora[n]).max() > 0, f"{n}: still zero"
assert sorted(m) == sorted(adapters + [n for n in base if "norm.weight" in n]), sorted(m)
with open(export_path, "rb") as f: data = f.read()
(k,) = struct.unpack("<Q", data[:8]); header = json.loads(data[8:8 + k]); body = data[8 + k:]
names = sorted(n for n in header if n != "__metadata__")
assert names == sorted(base), f"exported names: {names}"
worst = 0.0
for n in names:
    lo, hi = header[n]["data_offsets"]
    got = np.frombuffer(body[lo:hi], dtype=np.float32).reshape(header[n]["shape"]).astype(np.float64)
    want = lora[n].astype(np.float64)
    stem = n[: -len("weight")]
    if stem + "lora_A.weight" in lora:
        want = want + 2.0 * lora[stem + "lora_B.weight"].astype(np.float64) @ lora[stem + "lora_A.weight"].astype(np.float64)
    worst = max(worst, float(np.abs(got - want).max() / max(1e-12, np.abs(want).max())))
assert worst < 1e-6, f"merged export off by {worst}"
print(f"lora checkpoint: {len(adapters)} adapters, base frozen, norms trained; export merged (worst {worst:.2g})")
PY
# Inference runs the merged model: the LoRA run and its HF export imported again sample the same text.
run export --run-dir "$work/lora" --format hf --out "$work/lora.hf"
run import --from "$work/lora.hf" --run-dir "$work/imported"
sample=(--prompt "The " --max_new_tokens 24 --temperature 0.8 --seed 3)
"$bin/dew-run" sample --run-dir "$work/lora" "${sample[@]}" > "$work/lora.txt" 2> "$work/sample.log" || { cat "$work/sample.log"; exit 1; }
"$bin/dew-run" sample --run-dir "$work/imported" "${sample[@]}" > "$work/imported.txt" 2> "$work/sample.log" || { cat "$work/sample.log"; exit 1; }
[ -s "$work/lora.txt" ] && cmp "$work/lora.txt" "$work/imported.txt" || { echo "samples differ"; cat "$work/lora.txt" "$work/imported.txt"; exit 1; }
# Resume: 3 + 3 updates = 6 straight, every tensor of the checkpoint bit for bit.
run "${common[@]}" --run-dir "$work/paused" --trainer.steps 6 --trainer.stop_at 3 "${lora[@]}"
run train --run-dir "$work/paused" --resume
"$PYTHON" "$here/../dist/compare_checkpoints.py" "$work/paused/checkpoints/step-00000006.h5" \
  "$work/lora/checkpoints/step-00000006.h5" 0
# Under bf16-mixed with recomputed blocks (the adapter's products lowered, its gradients widened to f32).
run "${common[@]}" --run-dir "$work/bf16" --trainer.steps 2 "${lora[@]}" --run.precision bf16-mixed --trainer.recompute blocks
"$PYTHON" - "$work/base/checkpoints/step-00000006.h5" "$work/bf16/checkpoints/step-00000002.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[2]) as b:
    names = []
    a["params"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    moved = [n for n in names if not np.array_equal(a["params"][n][()], b["params"][n][()])]
    assert moved and all("norm" in n for n in moved), moved  # only the trained norms moved
print("bf16-mixed LoRA: the frozen f32 weights unchanged")
PY
# Plain freezing: the embedding stays, the rest trains.
run "${common[@]}" --run-dir "$work/frozen" --trainer.steps 3 --trainer.init_from "$work/base" \
  --optim.freeze "model.embed_tokens.*"
grep -q "fine-tuning: optim.freeze: .* frozen" "$work/last.log" || { echo "no freeze line"; cat "$work/last.log"; exit 1; }
"$PYTHON" - "$work/base/checkpoints/step-00000006.h5" "$work/frozen/checkpoints/step-00000003.h5" <<'PY'
import sys, h5py, numpy as np
with h5py.File(sys.argv[1]) as a, h5py.File(sys.argv[2]) as b:
    names = []
    a["params"].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
    assert any("embed_tokens" in n for n in names), names
    for n in names:
        same = np.array_equal(a["params"][n][()], b["params"][n][()])
        assert same == ("embed_tokens" in n), (n, same)
print("optim.freeze: the embedding unchanged, every other parameter trained")
PY
out=$("$bin/dew-run" "${common[@]}" --run-dir "$work/clip" --trainer.steps 2 "${lora[@]}" --optim.name muonclip 2>&1) &&
  { echo "muonclip with [lora] was accepted"; exit 1; }
grep -q "QK-Clip rescales the attention's q and k weights, which \[lora\] keeps frozen" <<< "$out" || { echo "$out"; exit 1; }
out=$("$bin/dew-run" train --config "$here/../jepa/tiny.ini" --run-dir "$work/jepa" --lora.rank 2 2>&1) &&
  { echo "jepa with [lora] was accepted"; exit 1; }
grep -q "\[lora\]: jepa moves its target encoder" <<< "$out" || { echo "$out"; exit 1; }
echo "LoRA fine-tuning: frozen base, merged export and sampling, bit-exact resume; optim.freeze"
