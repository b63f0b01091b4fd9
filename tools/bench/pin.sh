# tools/bench/pin.sh — sourced by the bench scripts. `pinned T CMD...` runs CMD with OpenMP's threads bound one per
# core (OMP_PROC_BIND=close, OMP_PLACES=cores: two threads never share a core, none migrates mid-step) when T > 1, and
# unbound at one thread, where binding buys nothing and would tie dew to core 0 while the PyTorch and llama.cpp peers
# (never bound) run where the scheduler finds room: both sides of a 1-thread comparison now take the same placement.
# (Session 25: core 0 takes most of this guest's interrupts and was at times the slower vCPU; docs/benchmarks.md.)
pinned() {
  local threads=$1
  shift
  if [ "$threads" -gt 1 ]; then OMP_PROC_BIND=close OMP_PLACES=cores "$@"; else "$@"; fi
}
