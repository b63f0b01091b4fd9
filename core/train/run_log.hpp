// core/train/run_log.hpp — what a training run writes for people to read: the console/log.txt logger,
// metrics.jsonl (one JSON object per logged step) and the progress line.
//
// Invariants: only rank 0 writes files (the other ranks get a logger that prints errors only and a
// MetricsLog that drops its lines); every metrics.jsonl line is flushed when written, so a crash loses
// nothing logged; numbers are printed with %.17g (integers come out as integers) and non-finite ones as
// NaN / Infinity. A resume rewinds metrics.jsonl to the checkpoint's step before appending.
#pragma once
#include <spdlog/spdlog.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dew::training {

// A double as JSON: %.17g, NaN / Infinity / -Infinity for non-finite values.
std::string json_number(double v);
// "1h02m", "3m07s", "42s".
std::string format_duration(double seconds);

// The run's logger: the terminal (stderr) and RUN_DIR/log.txt; `leader` false gives a logger that
// prints errors only and writes no file (data-parallel ranks other than 0).
std::shared_ptr<spdlog::logger> make_run_logger(const std::string& run_dir, bool leader);

// One logged line of metrics.jsonl: the step and named values, in the order written.
struct MetricsLine {
  int64_t step = 0;
  std::vector<std::pair<std::string, double>> values;
  // A key already on the line keeps its value: the trainer's fields (loss, lr, ...) come first, and an objective's
  // metric of the same name does not write a second, different value under it.
  void add(const std::string& key, double value) {
    for (const auto& [k, v] : values)
      if (k == key) return;
    values.emplace_back(key, value);
  }
};

// Receives every line written to metrics.jsonl (a TensorBoard writer, a live report): rank 0 only.
class MetricsSink {
 public:
  virtual ~MetricsSink() = default;
  virtual void write(const MetricsLine& line) = 0;
};

// RUN_DIR/metrics.jsonl, opened for appending; `rewind_to` >= 0 first drops lines past that step (resume).
class MetricsLog {
 public:
  MetricsLog(const std::string& run_dir, bool leader, int64_t rewind_to);
  void write(const MetricsLine& line);
  void add_sink(std::shared_ptr<MetricsSink> sink) { sinks_.push_back(std::move(sink)); }

 private:
  bool leader_;
  std::ofstream out_;
  std::vector<std::shared_ptr<MetricsSink>> sinks_;
};

}  // namespace dew::training
