# tests/dist/common.sh — sourced by the data-parallel tests: BIN WORK are set by the caller.
# run LOG ARGS...      one process (dew-run ARGS); LOG keeps its output, shown on failure.
# run_mpi N LOG ARGS...  N ranks under mpirun, one OpenMP thread each.
# PYTHON (default /usr/bin/python3, with numpy) runs compare.py.
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
