// tools/dew-run/openmp_setup.cpp — see openmp_setup.hpp. Invariants: never overrides a variable the user
// set; never picks fewer than 1 or more than the usable cores; samples /proc/stat only when the load decides
// something (a lone process whose waiting the user left open); a failed measurement keeps the cautious
// choice (passive waiting, the OpenMP default thread count).
#include "openmp_setup.hpp"

#include <sched.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace dew_run {

namespace {

bool parse_cpu_line(const std::string& line, double& busy, double& total) {
  std::istringstream in(line);
  std::string tag;
  in >> tag;
  if (tag != "cpu") return false;
  std::vector<double> v;
  double x;
  while (in >> x) v.push_back(x);
  if (v.size() < 4) return false;
  v.resize(std::max<size_t>(v.size(), 8), 0.0);
  // user nice system idle iowait irq softirq steal (guest time is already inside user and nice)
  const double idle = v[3] + v[4];
  busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7];
  total = busy + idle;
  return true;
}

std::string read_cpu_line(int* cpu_count) {
  std::ifstream f("/proc/stat");
  std::string line, first;
  int n = 0;
  while (std::getline(f, line)) {
    if (line.rfind("cpu ", 0) == 0)
      first = line;
    else if (line.rfind("cpu", 0) == 0)
      ++n;
  }
  if (cpu_count) *cpu_count = n;
  return first;
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace

double busy_cores_between(const std::string& before, const std::string& after, int cpu_count) {
  double b0, t0, b1, t1;
  if (cpu_count <= 0 || !parse_cpu_line(before, b0, t0) || !parse_cpu_line(after, b1, t1)) return -1.0;
  const double dt = t1 - t0;
  if (dt <= 0) return -1.0;
  return std::clamp((b1 - b0) / dt, 0.0, 1.0) * double(cpu_count);
}

OpenMPChoice choose_openmp(int usable, double busy, bool user_threads, bool user_policy, int local_ranks) {
  OpenMPChoice c;
  c.usable_cores = std::max(1, usable);
  c.busy_cores = busy;
  const bool known = busy >= 0.0;
  local_ranks = std::max(1, local_ranks);
  // Cores another job keeps busy, rounded: a core counts as taken from 0.5 of it on.
  const int taken = known ? int(std::lround(busy)) : 0;
  // The count never follows the load (a run and its resume must use the same count to stay bit for bit:
  // reductions split over threads); only ranks sharing one machine divide it.
  const int share = std::max(1, c.usable_cores / local_ranks);
  const bool machine_idle = known && taken == 0 && local_ranks == 1;
  if (!user_threads && local_ranks > 1) c.threads = share;
  if (!user_policy) c.policy = machine_idle ? "spin" : "passive";
  return c;
}

int local_rank_count() {
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "LOCAL_WORLD_SIZE"})
    if (const char* v = std::getenv(name)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  return 1;
}

OpenMPChoice apply_openmp_defaults(int sample_ms) {
  const bool user_threads = std::getenv("OMP_NUM_THREADS") != nullptr;
  const bool user_policy = std::getenv("OMP_WAIT_POLICY") != nullptr || std::getenv("GOMP_SPINCOUNT") != nullptr;
  const int ranks = local_rank_count();
  // The load only decides the waiting of a lone process: no 100 ms sample when the user or the ranks decide it.
  double busy = -1.0;
  if (!user_policy && ranks == 1) {
    int n0 = 0, n1 = 0;
    const std::string a = read_cpu_line(&n0);
    std::this_thread::sleep_for(std::chrono::milliseconds(sample_ms));
    const std::string b = read_cpu_line(&n1);
    if (n0 == n1) busy = busy_cores_between(a, b, n0);
  }
  const OpenMPChoice c = choose_openmp(usable_cores(), busy, user_threads, user_policy, ranks);
  if (c.threads > 0) setenv("OMP_NUM_THREADS", std::to_string(c.threads).c_str(), 0);
  if (c.policy == "spin") setenv("GOMP_SPINCOUNT", "10000", 0);
  if (c.policy == "passive") setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  return c;
}

std::string describe(const OpenMPChoice& c) {
  char busy[64];
  if (c.busy_cores >= 0)
    std::snprintf(busy, sizeof busy, "%.1f of %d usable cores busy at start", c.busy_cores, c.usable_cores);
  else
    std::snprintf(busy, sizeof busy, "load not measured, %d usable cores", c.usable_cores);
  std::string s = busy;
  s += c.threads > 0                    ? ": " + std::to_string(c.threads) + (c.threads == 1 ? " thread" : " threads")
       : std::getenv("OMP_NUM_THREADS") ? ": OMP_NUM_THREADS=" + std::string(std::getenv("OMP_NUM_THREADS"))
                                        : ": every core";
  if (c.policy == "spin") s += ", spinning briefly (GOMP_SPINCOUNT=10000)";
  if (c.policy == "passive") s += ", waiting passively";
  if (c.policy.empty()) s += ", the user's OMP_WAIT_POLICY / GOMP_SPINCOUNT";
  return s;
}

std::string check_omp_num_threads(const std::string& v) {
  const long limit = std::max<long>(64, 8 * long(std::thread::hardware_concurrency()));
  size_t at = 0;
  while (at <= v.size()) {
    const size_t comma = v.find(',', at);
    const std::string item = v.substr(at, comma == std::string::npos ? std::string::npos : comma - at);
    char* end = nullptr;
    errno = 0;
    const long n = std::strtol(item.c_str(), &end, 10);
    if (item.empty() || *end != '\0' || errno != 0 || n < 1 || n > limit)
      return "OMP_NUM_THREADS=" + v + " is not a thread count from 1 to " + std::to_string(limit) +
             " (8 per core of this machine)";
    if (comma == std::string::npos) break;
    at = comma + 1;
  }
  return {};
}

}  // namespace dew_run
