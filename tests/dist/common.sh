# tests/dist/common.sh — sourced by the data-parallel tests: BIN WORK are set by the caller.
# run LOG ARGS...      one process (dew-run ARGS); LOG keeps its output, shown on failure.
# run_mpi N LOG ARGS...  N ranks under mpirun, one OpenMP thread each.
# PYTHON (default /usr/bin/python3, with numpy) runs compare.py.
# rank_pid R          the pid of rank R of the job started with -x DEW_TEST_TAG=$tag (the caller's tag).
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-/usr/bin/python3}
MPIRUN=${MPIRUN:-mpirun}
mpi_flags=(--allow-run-as-root --oversubscribe -x OMP_NUM_THREADS=1)
run() {
  local log=$1; shift
  "$bin/dew-run" "$@" > "$log" 2>&1 < /dev/null || { echo "FAILED: dew-run $*"; cat "$log"; exit 1; }
}
run_mpi() {
  local n=$1 log=$2; shift 2
  "$MPIRUN" "${mpi_flags[@]}" -np "$n" "$bin/dew-run" "$@" > "$log" 2>&1 < /dev/null || {
    echo "FAILED: mpirun -np $n dew-run $*"; cat "$log"; exit 1; }
}
compare() { "$PYTHON" "$here/compare.py" "$@"; }
# The global stream position recorded in a checkpoint.
data_next() { h5dump -a /state/data.next "$1" | sed -n 's/^ *(0): *//p'; }
# The pid of rank $1 of this job: a dew-run whose environment holds our tag and OMPI_COMM_WORLD_RANK=$1.
rank_pid() {
  for p in $(pgrep -x dew-run || true); do
    env=$(tr '\0' '\n' < /proc/$p/environ 2> /dev/null || true)
    if grep -qx "DEW_TEST_TAG=$tag" <<< "$env" && grep -qx "OMPI_COMM_WORLD_RANK=$1" <<< "$env"; then echo "$p"; return; fi
  done
}
