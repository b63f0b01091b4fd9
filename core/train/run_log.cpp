// core/train/run_log.cpp — the run's logger, metrics.jsonl and its sinks (see run_log.hpp).
#include "train/run_log.hpp"

#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>

#include <cmath>
#include <cstdio>

#include "dew/error.hpp"

namespace dew::training {

namespace fs = std::filesystem;

std::string json_number(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string format_duration(double s) {
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
  else
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}

std::shared_ptr<spdlog::logger> make_run_logger(const std::string& run_dir, bool leader) {
  auto console = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  console->set_pattern("%v");
  if (!leader) {
    auto logger = std::make_shared<spdlog::logger>("dew", console);
    logger->set_level(spdlog::level::err);
    return logger;
  }
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>((fs::path(run_dir) / "log.txt").string());
  file->set_pattern("[%Y-%m-%d %H:%M:%S] %v");
  auto logger = std::make_shared<spdlog::logger>("dew", spdlog::sinks_init_list{console, file});
  logger->flush_on(spdlog::level::info);
  return logger;
}

namespace {
// Keeps the lines of metrics.jsonl whose "step" is <= `step`.
void rewind_metrics(const fs::path& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::vector<std::string> keep;
  std::string line;
  while (std::getline(in, line)) {
    const auto pos = line.find("\"step\":");
    if (pos == std::string::npos) continue;
    if (std::stoll(line.substr(pos + 7)) <= step) keep.push_back(line);
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : keep) out << l << "\n";
}
}  // namespace

MetricsLog::MetricsLog(const std::string& run_dir, bool leader, int64_t rewind_to) : leader_(leader) {
  if (!leader_) return;
  const fs::path path = fs::path(run_dir) / "metrics.jsonl";
  if (rewind_to >= 0) rewind_metrics(path, rewind_to);
  out_.open(path, std::ios::app);
  DEW_CHECK(out_.good(), "cannot open ", path.string(), " for appending");
}

void MetricsLog::write(const MetricsLine& line) {
  if (!leader_) return;
  std::string js = "{\"step\":" + std::to_string(line.step);
  for (const auto& [k, v] : line.values) js += ",\"" + k + "\":" + json_number(v);
  js += "}";
  out_ << js << "\n";
  out_.flush();
  for (const auto& sink : sinks_) sink->write(line);
}

}  // namespace dew::training
