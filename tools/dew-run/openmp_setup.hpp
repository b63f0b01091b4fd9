// tools/dew-run/openmp_setup.hpp — dew-run's OpenMP defaults, chosen from how busy the machine is at start.
//
// Measured on a 2-core VM (diffusion-fmnist's small DiT, docs/benchmarks.md "OpenMP set-up"): idle, two
// threads that sleep between parallel regions (OMP_WAIT_POLICY=PASSIVE) are slower than one thread (every
// region pays a futex wake of the other vCPU), while two spinning briefly (GOMP_SPINCOUNT=10000, ~0.1 ms)
// run 1.7x one; with one core busy, spinning threads fight the other job (4.5x slower) and one thread is
// best. So, unless the user set them (their OMP_NUM_THREADS, OMP_WAIT_POLICY, GOMP_SPINCOUNT always win),
// the load now (from /proc/stat over `sample_ms`) decides the waiting: an idle machine gets short spinning
// (GOMP_SPINCOUNT=10000), a busy one passive waiting. The thread count does not follow the load (OpenMP's
// default, every usable core): the cpu backend's reductions split over threads, so a run resumed with
// another count would not continue bit for bit; on a busy machine set [run] threads yourself (one thread
// beat two passive ones by ~10 % there). Several ranks on one machine (OMPI_COMM_WORLD_LOCAL_SIZE,
// MPI_LOCALNRANKS or LOCAL_WORLD_SIZE > 1) share the cores evenly and wait passively.
// A config's [run] threads still overrides the count (omp_set_num_threads). Must run before any plugin
// loads libgomp (libgomp reads its environment once, when loaded).
#pragma once
#include <string>

namespace dew_run {

struct OpenMPChoice {
  int usable_cores = 1;     // this process's CPU affinity
  double busy_cores = 0.0;  // other work measured over the sample (-1: not measured, or /proc/stat unreadable)
  int threads = 0;          // the OMP_NUM_THREADS set (0: left alone)
  std::string policy;       // "spin", "passive", or "" (left alone)
};

// Busy cores from two /proc/stat "cpu" lines (user nice system idle iowait irq softirq steal ...):
// (non-idle delta / total delta) x cpu count. Returns -1 when either line cannot be parsed.
double busy_cores_between(const std::string& cpu_line_before, const std::string& cpu_line_after, int cpu_count);

// What to set for a machine with `usable` cores of which `busy` are busy: see the file comment.
OpenMPChoice choose_openmp(int usable, double busy, bool user_threads, bool user_policy, int local_ranks = 1);

// Ranks of this job on this machine, from the launcher's environment (1 when not launched as ranks).
int local_rank_count();

// "" when the OMP_NUM_THREADS value `v` is a list of positive counts of at most 8 per core of this
// machine (at least 64), else the one-line reason it is refused.
std::string check_omp_num_threads(const std::string& v);

// Measures, chooses and setenv()s; returns the choice (for the log line).
OpenMPChoice apply_openmp_defaults(int sample_ms = 100);

// One line for the log: "0.0 of 2 usable cores busy at start: every core, spinning briefly (GOMP_SPINCOUNT=10000)",
// "1.0 of 2 usable cores busy at start: every core, waiting passively", or what the user's variables left.
std::string describe(const OpenMPChoice& c);

}  // namespace dew_run
