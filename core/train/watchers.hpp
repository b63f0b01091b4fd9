// core/train/watchers.hpp — what lets a person watch a training run from outside: TensorBoard event files
// ([trainer] tensorboard = true, RUN_DIR/tb/) and the HTML report (RUN_DIR/report.html, written at the end
// and every [trainer] report_every updates). The trainer calls it at its start, with each validation's
// artifacts, after each update and at its end; it receives every metrics.jsonl line as a MetricsSink.
//
// Invariants: only the rank that writes the run directory (rank 0) writes here (others get a
// RunWatchers that does nothing); the event file receives exactly the numbers of metrics.jsonl (the same
// MetricsLine the log writes, stored as float32) at their steps, and is flushed with each line.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dew/objective.hpp"
#include "dew/options.hpp"
#include "train/run_log.hpp"

namespace dew {

namespace tensorboard {
class EventWriter;
}

struct WatchOptions {
  bool tensorboard = false;  // [trainer] tensorboard
  int64_t report_every = 0;  // [trainer] report_every (0: only at the end)
};
// Reads (and validates) the keys above from the [trainer] section.
WatchOptions read_watch_options(Options& trainer);

class RunWatchers : public training::MetricsSink {
 public:
  // `warn` receives the failures that must not stop a run (a report that cannot be written).
  RunWatchers(std::string run_dir, WatchOptions options, bool writer, std::function<void(const std::string&)> warn);
  ~RunWatchers() override;
  // The run (re)starts at update `step`: the event file is rewound to it and gets the config as text.
  void start(int64_t step, const std::string& config_ini);
  // A line just appended to metrics.jsonl: its numbers become scalars at its step.
  void write(const training::MetricsLine& line) override;
  // A validation's artifacts (written to RUN_DIR/samples/): PNGs as images, text as text.
  void on_artifacts(int64_t step, const std::vector<Artifact>& artifacts);
  // After update `step`: rewrites the report every report_every updates.
  void after_update(int64_t step);
  // Writes the report; returns its path ("" on a rank that does not write, or when it failed: warned).
  std::string finish();

 private:
  std::string run_dir_;
  WatchOptions options_;
  bool writer_;
  std::function<void(const std::string&)> warn_;
  std::unique_ptr<tensorboard::EventWriter> events_;
};

// The process's resident memory now (MiB, /proc/self/statm), for metrics.jsonl's rss_mb; 0 if unknown.
double resident_memory_mb();

}  // namespace dew
