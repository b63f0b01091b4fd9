# tools/bench/pin.sh — sourced by the bench scripts. `pinned T CMD...` runs CMD with OpenMP's threads bound one per
# core (OMP_PROC_BIND=close, OMP_PLACES=cores: two threads never share a core, none migrates mid-step) when T > 1, and
# unbound at one thread, where binding buys nothing and would tie dew to core 0 while the PyTorch and llama.cpp peers
# (never bound) go where the scheduler finds room: on this shared host one vCPU is at times slower than the other
# (session 25: dew's 1-thread runs, bound to core 0, 10-20 % under their usual speed for a whole sitting while the
# peers ran as usual), so both sides now take the same placement.
pinned() {
  local threads=$1
  shift
  if [ "$threads" -gt 1 ]; then OMP_PROC_BIND=close OMP_PLACES=cores "$@"; else "$@"; fi
}
