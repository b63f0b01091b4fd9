#!/usr/bin/env bash
# tools/device-check.sh [BUILD_DIR] — everything the cuda backend must show on a GPU machine, in one run
# that prints all its output and ends within 8 minutes (one overall `timeout`; each step's status is
# printed and a failing step does not stop the next):
#   1. the GPU and driver (nvidia-smi), configure + build in Release (the binaries and every plugin);
#   2. the GPU unit tests (test_backend_cuda_gpu), dew-conformance --backend cuda against ref and cpu, and 12
#      bf16-mixed updates of a small language model on the tensor-core attention against cpu
#      (tests/backends_cuda/lm_matches_cpu.sh), the same model in f32 on the attention by cuBLASLt products, and in
#      f32 with its head fused into the loss (dew::linear_cross_entropy in 16 chunks);
#   3. dew-bench: the kernel shapes (attention in f32 and bf16, the bf16 one on the tensor-core kernels and the
#      f32 one by cuBLASLt products where T * S >= 2^14, then again on the warp-per-row kernel: attention=warp),
#      the char-small and DiT training steps on cuda (f32 and bf16-mixed), and the GPT-2-small-size step
#      (configs/gpt2-small.ini) in f32 and bf16-mixed (and its --profile): the MFU of issues 17 and 18, against
#      the GPU's own measured matmul peak (mfu_device), and PyTorch's same step beside them
#      (tools/bench/torch_gpt_cuda.py, where python3 has torch with CUDA; skipped otherwise);
#   4. a 200-step char-small training run on cpu and on cuda (f32): the loss curves must agree within 1e-3
#      relative at step 200; the same on cuda with TF32 (matmul_precision = high) within 5e-2, and in
#      bf16-mixed (bf16 activations and tensor-core operands, f32 master weights) within 2e-2.
# Environment: DEW_CHECK_SECONDS (480), CUDA_ARCHS (CMake's CUDA architectures; default the project's
# 80;90), JOBS (build parallelism; nproc), DEW_CHECK_STEPS (200).
# DEW_STEP_SECONDS (150): each step's own limit (a hung step is reported TIMED OUT and the next one runs);
# the training runs get twice that.
# DEW_CHECK_REFERENCE=DIR: DIR/corpus* and DIR/cpu (a finished `train char-small cpu` of this script, saved with
# DEW_CHECK_WORK=DIR on another machine) stand in for the corpus and cpu training steps: device time saved.
# DEW_PREBUILT=DIR: use the binaries of a bundle made here by tools/device-bundle.sh instead of configuring
# and building (for GPU machines without dew's Debian packages); DIR/lib, DIR/lib/sys and the machine's own
# CUDA 13 / cuDNN 9 libraries (found under /usr/local, /usr/lib, /opt) go on LD_LIBRARY_PATH, and DIR/lib/fallback
# too when the machine's libstdc++ is older than the bundle's.
# Exit status: 0 when every step passed, 1 otherwise (124 when the overall time ran out).
set -uo pipefail
cd "$(dirname "$0")/.."
build=${1:-build-device}
if [ -z "${DEW_DEVICE_CHECK_INNER:-}" ]; then
  export DEW_DEVICE_CHECK_INNER=1
  exec timeout --foreground -k 10 "${DEW_CHECK_SECONDS:-480}" bash "$0" "$@"
fi
if ! command -v nvcc >/dev/null 2>&1 && [ -x /usr/local/cuda/bin/nvcc ]; then export PATH="/usr/local/cuda/bin:$PATH"; fi
jobs=${JOBS:-$(nproc)}
prebuilt=${DEW_PREBUILT:-}
if [ -n "$prebuilt" ]; then
  build=$(realpath "$prebuilt")
  [ -x "$build/bin/dew-run" ] || { echo "DEW_PREBUILT=$prebuilt: no bin/dew-run there (tools/device-bundle.sh)"; exit 1; }
  cuda_dirs=$(find /usr/local /usr/lib /usr/lib64 /opt -xdev \( -name 'libcudart.so.13' -o -name 'libcublasLt.so.13' \
    -o -name 'libcudnn.so.9' -o -name 'libnccl.so.2' \) -printf '%h\n' 2>/dev/null | sort -u | tr '\n' ':')
  ld="$build/lib:$build/lib/sys:$cuda_dirs"
  # The bundle's libstdc++ only when the machine's lacks this compiler's newest symbol version.
  # (grep -a on the binaries, not strings: binutils may be missing; no grep -q in a pipe under pipefail.)
  want=$(grep -ao 'GLIBCXX_[0-9.]*[0-9]' "$build/lib/fallback/libstdc++.so.6" | sort -uV | tail -n 1)
  have=$(ldconfig -p | awk '/libstdc\+\+\.so\.6 .*x86-64/ {print $NF; exit}')
  if [ -z "$have" ] || [ "$(grep -ao 'GLIBCXX_[0-9.]*[0-9]' "$have" 2>/dev/null | sort -u | grep -cx "$want" || true)" = 0 ]; then ld="$ld:$build/lib/fallback"; fi
  export LD_LIBRARY_PATH="$ld${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
steps=${DEW_CHECK_STEPS:-200}
work=$build/device-check
failed=()
t_start=$(date +%s)

step_seconds=${DEW_STEP_SECONDS:-150}
step() {  # step NAME COMMAND...: runs it under its own time limit, prints its output and status
  local name=$1 limit=$step_seconds
  shift
  [ "$1" = train_run ] && limit=$((2 * step_seconds))
  echo
  echo "=== [$(($(date +%s) - t_start)) s] $name"
  echo "+ $*"
  timeout -k 5 "$limit" bash -c '"$@"' step "$@"
  local rc=$?
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "=== $name: TIMED OUT after $limit s"
    failed+=("$name (timed out)")
  elif [ $rc -eq 0 ]; then
    echo "=== $name: ok"
  elif [ $rc -eq 77 ]; then
    echo "=== $name: SKIPPED (exit 77)"
    case $name in peer:*) ;; *) failed+=("$name (skipped)") ;; esac  # a missing peer fails nothing of dew's
  else
    echo "=== $name: FAILED (exit $rc)"
    failed+=("$name")
  fi
  return 0
}

gpu_info() {
  if command -v nvidia-smi >/dev/null 2>&1; then nvidia-smi; else echo "(no nvidia-smi)"; fi
  nvcc --version | tail -n 2
}

configure() {
  local archs=()
  [ -n "${CUDA_ARCHS:-}" ] && archs=(-DCMAKE_CUDA_ARCHITECTURES="$CUDA_ARCHS")
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDEW_BUILD_TESTS=ON "${archs[@]}"
}

build_all() {
  # The tools, the GPU test and every plugin (not the whole test suite: minutes saved).
  local plugins
  plugins=$(ninja -C "$build" -t targets all | sed -n 's|^\(lib/dew/plugins/[^:]*\.so\):.*|\1|p' | sort -u)
  ninja -C "$build" -j"$jobs" dew-run dew-conformance dew-bench dew-tokenize test_backend_cuda_gpu $plugins
}

# The PyTorch peer of the gpt2-small steps (tools/bench/torch_gpt_cuda.py), where python3 has torch with CUDA; run
# without the bundle's LD_LIBRARY_PATH (torch brings its own CUDA libraries).
torch_peer() {
  env -u LD_LIBRARY_PATH python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 77)' 2>/dev/null ||
    { echo "skipped: no python3 with torch and CUDA here"; return 77; }
  env -u LD_LIBRARY_PATH python3 tools/bench/torch_gpt_cuda.py --precision "$1" --steps 10
}

# A byte-level token corpus: the fortunes when present, else this repository's text (any text will do to
# compare two backends' loss curves).
make_corpus() {
  mkdir -p "$work"
  local src=/usr/share/games/fortunes
  if [ ! -d "$src" ]; then
    src=$work/text
    mkdir -p "$src"
    cat docs/*.md README.md sdk/include/dew/*.hpp core/*/*.cpp >"$src/corpus.txt" 2>/dev/null
  fi
  "$build/bin/dew-tokenize" --input "$src" --out "$work/corpus" --tokenizer byte
}

train_run() {  # train_run NAME BACKEND [extra overrides...]
  local name=$1 be=$2
  shift 2
  rm -rf "$work/$name"
  "$build/bin/dew-run" train --config configs/char-small.ini --run-dir "$work/$name" --backend "$be" \
    --data.path "$work/corpus" --trainer.steps "$steps" --trainer.log_every 10 --trainer.eval_every 100000 \
    --trainer.checkpoint_every 100000 "$@"
}

compare_curves() {  # compare_curves A B TOL: loss at every common logged step; judged at the last one
  python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3" <<'PY'
import json, sys
def losses(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "step" in r: out[int(r["step"])] = float(r["loss"])
    return out
a, b, tol = losses(sys.argv[1]), losses(sys.argv[2]), float(sys.argv[3])
steps = sorted(set(a) & set(b))
if not steps: sys.exit("no common logged steps")
print(f"{'step':>6} {'A':>10} {'B':>10} {'rel diff':>9}")
for s in steps:
    print(f"{s:>6} {a[s]:>10.6f} {b[s]:>10.6f} {abs(a[s] - b[s]) / max(abs(a[s]), 1e-9):>9.2e}")
last = steps[-1]
rel = abs(a[last] - b[last]) / max(abs(a[last]), 1e-9)
print(f"step {last}: relative difference {rel:.3e} (tolerance {tol:g})")
sys.exit(0 if rel <= tol else 1)
PY
}

# The steps run in child shells (their own time limits): they need these.
export build work steps jobs
export -f gpu_info configure build_all make_corpus train_run compare_curves torch_peer

step "gpu" gpu_info
if [ -n "$prebuilt" ]; then
  echo "prebuilt: $build; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  work=${DEW_CHECK_WORK:-$(mktemp -d)/device-check}
else
  step "configure" configure
  step "build" build_all
fi
step "plugins" "$build/bin/dew-run" plugins
step "gpu unit tests" "$build/bin/test_backend_cuda_gpu"
step "conformance cuda vs ref" "$build/bin/dew-conformance" --backend cuda --against ref
step "conformance cuda vs cpu" "$build/bin/dew-conformance" --backend cuda --against cpu
step "lm bf16-mixed on the tensor-core attention vs cpu (2e-3)" bash tests/backends_cuda/lm_matches_cpu.sh \
  "$build/bin" "$work/lm-match" cuda
step "lm f32 on the attention by cuBLASLt products vs cpu (2e-3)" bash tests/backends_cuda/lm_matches_cpu.sh \
  "$build/bin" "$work/lm-f32-match" cuda --run.precision f32 --data.seq_len 160
step "lm f32 with the head fused into the loss vs cpu (2e-3)" bash tests/backends_cuda/lm_matches_cpu.sh \
  "$build/bin" "$work/lm-fused-match" cuda --run.precision f32 --objective.fused_head true --objective.fused_head_mb 0.01
step "bench kernels" "$build/bin/dew-bench" kernels --backend cuda
step "bench attention, warp kernel (A/B with the tensor-core and f32 products ones above)" "$build/bin/dew-bench" kernels --backend cuda \
  --only attention --backend-option attention=warp
step "bench train char-small" "$build/bin/dew-bench" train --config char-small --backend cuda --steps 20
step "bench train dit" "$build/bin/dew-bench" train --config dit --backend cuda --steps 20
step "bench train char-small bf16-mixed" "$build/bin/dew-bench" train --config char-small --backend cuda --steps 20 \
  --precision bf16-mixed
step "bench train dit bf16-mixed" "$build/bin/dew-bench" train --config dit --backend cuda --steps 20 --precision bf16-mixed
step "bench train gpt2-small f32" "$build/bin/dew-bench" train --config configs/gpt2-small.ini --backend cuda --steps 10
step "bench train gpt2-small bf16-mixed" "$build/bin/dew-bench" train --config configs/gpt2-small.ini --backend cuda \
  --steps 10 --precision bf16-mixed
step "profile gpt2-small bf16-mixed (by the device clock: where the step goes)" "$build/bin/dew-bench" train \
  --config configs/gpt2-small.ini --backend cuda --steps 3 --precision bf16-mixed --profile
step "peer: PyTorch gpt2-small bf16-mixed" torch_peer bf16-mixed
step "peer: PyTorch gpt2-small f32" torch_peer f32
if [ -n "${DEW_CHECK_REFERENCE:-}" ]; then
  echo; echo "=== corpus and cpu run from $DEW_CHECK_REFERENCE"
  mkdir -p "$work" && cp -r "$DEW_CHECK_REFERENCE"/corpus* "$DEW_CHECK_REFERENCE"/cpu "$work/"
else
  step "corpus" make_corpus
  step "train char-small cpu" train_run cpu cpu --run.threads "$jobs"
fi
step "train char-small cuda f32" train_run cuda cuda
step "loss curve cuda f32 vs cpu (1e-3 at step $steps)" compare_curves cpu cuda 1e-3
step "train char-small cuda tf32" train_run cuda-tf32 cuda --run.matmul_precision high
step "loss curve cuda tf32 vs cpu (5e-2 at step $steps)" compare_curves cpu cuda-tf32 5e-2
step "train char-small cuda bf16-mixed" train_run cuda-bf16 cuda --run.precision bf16-mixed
step "loss curve cuda bf16-mixed vs cpu f32 (2e-2 at step $steps)" compare_curves cpu cuda-bf16 2e-2

echo
echo "=== device check done in $(($(date +%s) - t_start)) s"
if [ ${#failed[@]} -eq 0 ]; then
  echo "=== all steps passed"
  exit 0
fi
printf '=== not passed: %s\n' "${failed[@]}"
exit 1
