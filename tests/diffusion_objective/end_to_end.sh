#!/usr/bin/env bash
# tests/diffusion_objective/end_to_end.sh BIN_DIR WORK_DIR — the diffusion objective through dew-run on
# the synthetic source (tiny.ini: 8x8x1 images, 4 classes, a one-block DiT).
# 1. Resume is bit-exact, for EDM + heun and for the vp cosine preset + ddim (eta 0.5, so the grid's
#    solver draws noise) with 2 micro-batches: run A trains 8 updates straight, run B pauses at 3 and a new
#    process resumes it; losses, validation losses and the validation grids (EMA weights) are identical.
# 2. The validation grid is a PNG of the right size (one 8x8 cell per class, 2-pixel gaps).
# 3. `dew-run sample` writes a PNG of the asked grid; the same seed gives the same bytes, another seed
#    others; the [sampler] section gives the request's defaults (4 steps, guidance 2).
# 4. `dew-run eval --classifier` (a small convnet trained here) prints class_accuracy, fd and fd_real_train,
#    with fd_real_train (real training images) below fd (8 updates of training cannot match the data).
# 5. An unconditional run trains, samples an n-image row and refuses guidance.
# 6. Refusals exit 2 with one line: unknown sampler, --labels outside the classes, unknown request keys,
#    heun on a vp preset, guidance on an unconditional run, no --classifier, an unknown [sampler] key and
#    another solver's key in [sampler].
set -euo pipefail
bin=$1 work=$2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
cd "$work"
fail() { echo "FAIL: $*"; exit 1; }
run() { "$bin/dew-run" "$@" > last.log 2>&1 || { cat last.log; fail "dew-run $*"; }; }
metrics() { grep '"loss"' "$1/metrics.jsonl" | sed -E 's/"step_time_ms":[^,]*,"samples_per_sec":[^,]*,//; s/"mfu":[^,]*,//; s/"rss_mb":[^,}]*,?//; s/"mem_[a-z]*_mb":[^,}]*,?//g'; }
# The PNG's width x height from its IHDR chunk (bytes 16..23, big-endian), after checking the signature.
png_size() {
  [ "$(od -An -tx1 -N8 "$1" | tr -d ' \n')" = "89504e470d0a1a0a" ] || fail "$1 is not a PNG"
  od -An -tu1 -j16 -N8 "$1" | awk '{ printf "%dx%d\n", $1*16777216+$2*65536+$3*256+$4, $5*16777216+$6*65536+$7*256+$8 }'
}
# A refusal: exit status 2 and exactly one line on stderr that contains $1.
refused() {
  local want=$1; shift
  set +e
  "$bin/dew-run" "$@" > refused.out 2> refused.err
  local rc=$?
  set -e
  [ $rc -eq 2 ] || { cat refused.err; fail "exit $rc (not 2) for: dew-run $*"; }
  [ "$(wc -l < refused.err)" -eq 1 ] || { cat refused.err; fail "not one line for: dew-run $*"; }
  grep -q -F -- "$want" refused.err || { cat refused.err; fail "no '$want' in the refusal of: dew-run $*"; }
}

# ---- 1, 2: resume bit-exact (EDM + heun; vp cosine + ddim with micro-batches) and the grid PNG
sed -e 's/^preset = edm/preset = cosine/; /^regime/d; /^s_churn/d; s/^plugin = heun/plugin = ddim\neta = 0.5/' \
  "$here/tiny.ini" > vp.ini
grep -q '^preset = cosine' vp.ini && grep -q '^eta = 0.5' vp.ini || fail "vp.ini was not derived"
check_resume() {
  local cfg=$1 name=$2; shift 2
  run train --config "$cfg" --run-dir "$name.A" "$@"
  run train --config "$cfg" --run-dir "$name.B" --trainer.stop_at 3 "$@"
  run train --run-dir "$name.B" --resume --trainer.stop_at 8
  grep -q "resumed" last.log || fail "$name: the second run did not resume"
  metrics "$name.A" > "$name.A.m"
  metrics "$name.B" > "$name.B.m"
  [ "$(wc -l < "$name.A.m")" -eq 8 ] || fail "$name: expected 8 logged steps"
  grep -q '"mse"' "$name.A.m" || fail "$name: no mse metric"
  diff "$name.A.m" "$name.B.m" || fail "$name: metrics differ after resume"
  diff <(grep '"val/loss"' "$name.A/metrics.jsonl") <(grep '"val/loss"' "$name.B/metrics.jsonl") ||
    fail "$name: validation losses differ after resume"
  [ "$(grep -c '"val/loss"' "$name.A/metrics.jsonl")" -eq 2 ] || fail "$name: expected 2 validations"
  for s in 0000004 0000008; do
    cmp "$name.A/samples/grid-$s.png" "$name.B/samples/grid-$s.png" || fail "$name: grid $s differs after resume"
  done
  # 4 classes x 1 row of 8x8 cells with 2-pixel gaps: (4*10+2) x (1*10+2).
  [ "$(png_size "$name.A/samples/grid-0000008.png")" = "42x12" ] || fail "$name: grid is $(png_size "$name.A/samples/grid-0000008.png")"
}
check_resume "$here/tiny.ini" edm
check_resume vp.ini vp --trainer.grad_accum 2
# The grid changes as the model trains (step 4 vs 8) and the two processes differ.
if cmp -s edm.A/samples/grid-0000004.png edm.A/samples/grid-0000008.png; then fail "the grid did not change"; fi
if cmp -s edm.A.m vp.A.m; then fail "edm and vp runs logged the same losses"; fi

# ---- 3: dew-run sample
run sample --run-dir edm.A --labels 0,1 --n 2 --out s1.png
grep -q "heun, 4 steps, guidance 2, seed 0" last.log || { cat last.log; fail "sample did not take the [sampler] defaults"; }
[ "$(png_size s1.png)" = "22x22" ] || fail "sample grid is $(png_size s1.png), want 22x22 (2 labels x 2 rows)"
run sample --run-dir edm.A --labels 0,1 --n 2 --out s2.png --seed 0
cmp s1.png s2.png || fail "the same seed gave different samples"
run sample --run-dir edm.A --labels 0,1 --n 2 --out s3.png --seed 1
if cmp -s s1.png s3.png; then fail "another seed gave the same samples"; fi
run sample --run-dir edm.A --labels 3 --n 1 --out s4.png --sampler dpmpp_2m --steps 3 --guidance 1.5
[ "$(png_size s4.png)" = "12x12" ] || fail "one sample is $(png_size s4.png)"
run sample --run-dir vp.A --out v1.png --n 1 --eta 0
grep -q "ddim, 4 steps" last.log || { cat last.log; fail "vp sample did not take the [sampler] solver"; }
[ "$(png_size v1.png)" = "42x12" ] || fail "vp sample (every class) is $(png_size v1.png)"

# ---- 4: dew-run eval with a judge
run train --config "$here/judge.ini" --run-dir judge
"$bin/dew-run" eval --run-dir edm.A --classifier judge --samples 16 --steps 2 > eval.json 2> eval.err ||
  { cat eval.err; fail "eval failed"; }
for k in class_accuracy fd fd_real_train samples test_images; do
  grep -q "\"$k\"" eval.json || { cat eval.json; fail "eval JSON lacks $k"; }
done
value() { sed -E "s/.*\"$1\": ([^,}]*).*/\1/" eval.json; }
awk -v fd="$(value fd)" -v real="$(value fd_real_train)" -v acc="$(value class_accuracy)" \
  'BEGIN { exit !(fd > 0 && real >= 0 && real < fd && acc >= 0 && acc <= 1) }' ||
  { cat eval.json; fail "eval figures out of range (want 0 <= fd_real_train < fd, accuracy in [0, 1])"; }
[ "$(value samples)" = "16" ] || fail "eval samples"
[ -f edm.A/eval/generated.png ] || fail "eval wrote no generated.png"

# ---- 5: an unconditional run
run train --config "$here/tiny.ini" --run-dir uncond --objective.conditional false --sampler.guidance 1 --trainer.steps 4
[ "$(png_size uncond/samples/grid-0000004.png)" = "82x12" ] || fail "unconditional grid (8 columns)"
run sample --run-dir uncond --n 3 --out u.png
[ "$(png_size u.png)" = "32x12" ] || fail "unconditional sample is $(png_size u.png)"

# ---- 6: refusals
refused "unknown sampler 'nope'" sample --run-dir edm.A --sampler nope --out x.png
refused "--labels: 7 is not a class in [0, 4)" sample --run-dir edm.A --labels 0,7 --out x.png
refused "unknown option" sample --run-dir edm.A --labelz 0 --out x.png
refused "unknown option" sample --run-dir edm.A --sampler ddim --s_churn 0.5 --out x.png
refused "unknown option" eval --run-dir edm.A --classifier judge --samplez 4
refused "integrates in sigma" sample --run-dir vp.A --sampler heun --out x.png
refused "needs a class-conditional run" sample --run-dir uncond --guidance 2 --out x.png
refused "this run is unconditional" sample --run-dir uncond --labels 1 --out x.png
refused "needs a judge: --classifier" eval --run-dir edm.A --samples 4
refused "not a run directory" eval --run-dir edm.A --samples 4 --classifier nowhere
refused "unknown option 'sampler.bogus'" train --config "$here/tiny.ini" --run-dir r1 --sampler.bogus 1
refused "unknown option 'sampler.s_churn'" train --config vp.ini --run-dir r2 --sampler.s_churn 1
refused "integrates in sigma" train --config vp.ini --run-dir r3 --sampler.plugin heun
refused "needs a class-conditional run" train --config "$here/tiny.ini" --run-dir r4 --objective.conditional false
[ ! -e x.png ] || fail "a refused request wrote its output"
echo "diffusion objective end to end: resume bit-exact (edm, vp), grids, sample, eval, refusals"
