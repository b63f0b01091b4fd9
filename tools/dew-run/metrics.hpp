// tools/dew-run/metrics.hpp — `dew-run serve`'s GET /metrics: Prometheus's text exposition format (version 0.0.4),
// what vLLM and llama.cpp's server expose for a scraper. Counters and gauges are read from the scheduler's stats when
// scraped; latencies are histograms observed by the HTTP handlers as each choice ends (time to first token, the
// whole request, its wait for a slot, the time per output token after the first), and every response is counted by
// route and status. Invariants: a histogram's buckets are cumulative and its +Inf bucket equals its count; names
// carry the unit (`_seconds`, `_tokens`) and counters end in `_total`, as Prometheus's naming rules ask.
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace dew_run {

// A latency histogram (thread-safe): counts per upper bound (seconds, ascending), their sum and count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void observe(double seconds);
  // `# HELP`, `# TYPE name histogram`, then name_bucket{le="..."} lines (cumulative), name_sum and name_count.
  void write(std::string& out, const std::string& name, const std::string& help) const;

 private:
  mutable std::mutex mu_;
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bound, not cumulative; the last one past every bound
  double sum_ = 0;
  uint64_t count_ = 0;
};

// One sample of a counter or gauge family: `# HELP`, `# TYPE`, `name value`.
void write_metric(std::string& out, const std::string& name, const char* type, const std::string& help, double value);

// What the HTTP front observes.
struct ServeMetrics {
  Histogram time_to_first_token{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram request_latency{{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}};
  Histogram queue_time{{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram time_per_output_token{{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}};
  // Responses by (route, HTTP status); a path that is no route counts as "other".
  void count_response(const std::string& path, int status);
  void write_responses(std::string& out) const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, uint64_t> responses_;
};

}  // namespace dew_run
