#!/bin/sh
# tools/bench/torch_env.sh THREADS command [args...] — runs a PyTorch peer in the strongest set-up this CPU
# allows, chosen from its features at run time (as dew's kernels are), and says which on stderr.
#   AVX-512 F CPU: ../shared/peers/peer_env.sh `tuned` (OpenBLAS with OpenMP, its AVX-512 SkylakeX SGEMM
#                  kernels, ATen at AVX-512): the set-up every comparison before 2026-12-03 used.
#   otherwise:     OpenBLAS with OpenMP at its own core detection (AVX2 kernels: Haswell / Zen) and ATen at
#                  its default level (AVX2). `tuned` would force AVX-512 code here and die of SIGILL.
#   DEW_CPU_MAX_ISA=avx2 (dew's stand-in for an older CPU, with ONEDNN_MAX_CPU_ISA=AVX2 for oneDNN): the AVX2
#                  set-up on an AVX-512 CPU too, OpenBLAS's Haswell kernels named (its own detection would take
#                  SkylakeX) and ATen at AVX2, so a sitting stands in for an AVX2-only machine on both sides.
# DEW_PEERS: the peers folder (default: the checkout's sibling shared/peers).
set -e
threads=$1; shift
here=$(cd "$(dirname "$0")" && pwd)
peers=${DEW_PEERS:-$here/../../../shared/peers}
if grep -qw avx512f /proc/cpuinfo && [ "${DEW_CPU_MAX_ISA:-}" != avx2 ]; then
  echo "# torch set-up: tuned (AVX-512)" >&2
  exec "$peers/peer_env.sh" tuned "$threads" "$@"
fi
ma=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || gcc -print-multiarch)
unset OPENBLAS_CORETYPE ATEN_CPU_CAPABILITY OPENBLAS_NUM_THREADS GOTO_NUM_THREADS MKL_NUM_THREADS
export LD_LIBRARY_PATH=/usr/lib/$ma/openblas-openmp OMP_NUM_THREADS=$threads PEER_VARIANT=openblas-openmp-avx2
if grep -qw avx512f /proc/cpuinfo; then  # standing in for an AVX2 CPU (DEW_CPU_MAX_ISA=avx2)
  export OPENBLAS_CORETYPE=Haswell ATEN_CPU_CAPABILITY=avx2
  echo "# torch set-up: openblas-openmp Haswell, ATen AVX2 (standing in for an AVX2 CPU)" >&2
  exec "$@"
fi
echo "# torch set-up: openblas-openmp, AVX2 (no AVX-512 on this CPU)" >&2
exec "$@"
