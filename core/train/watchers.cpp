// core/train/watchers.cpp — the trainer's TensorBoard and report hook (core/train/watchers.hpp).
#include "train/watchers.hpp"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "dew/error.hpp"
#include "dew/report.hpp"
#include "report/run_files.hpp"
#include "train/tensorboard.hpp"

namespace dew {

namespace fs = std::filesystem;

namespace {

// TensorBoard renders text as Markdown: indented four spaces, a config or a sample keeps its lines.
std::string as_code_block(const std::string& text) {
  std::istringstream in(text);
  std::string out, line;
  while (std::getline(in, line)) out += "    " + line + "\n";
  return out;
}

}  // namespace

WatchOptions read_watch_options(Options& trainer) {
  WatchOptions o;
  o.tensorboard = trainer.get_bool("tensorboard", false);
  o.report_every = trainer.get_int("report_every", 0);
  DEW_USAGE_CHECK(o.report_every >= 0, "option 'trainer.report_every' must be >= 0 updates (0 = at the end only)");
  return o;
}

RunWatchers::RunWatchers(std::string run_dir, WatchOptions options, bool writer,
                         std::function<void(const std::string&)> warn)
    : run_dir_(std::move(run_dir)), options_(options), writer_(writer), warn_(std::move(warn)) {}

RunWatchers::~RunWatchers() = default;

void RunWatchers::start(int64_t step, const std::string& config_ini) {
  if (!writer_ || !options_.tensorboard) return;
  events_ = std::make_unique<tensorboard::EventWriter>((fs::path(run_dir_) / "tb").string(), step);
  events_->add_text(step, "config", as_code_block(config_ini));
  events_->flush();
}

void RunWatchers::write(const training::MetricsLine& line) {
  if (!events_) return;
  events_->add_scalars(line.step, line.values);
  events_->flush();
}

void RunWatchers::on_artifacts(int64_t step, const std::vector<Artifact>& artifacts) {
  if (!events_) return;
  for (const Artifact& a : artifacts) {
    const std::string ext = fs::path(a.file_name).extension().string();
    const std::string tag = "val/" + run_files::artifact_tag(a.file_name);
    if (ext == ".png")
      events_->add_image(step, tag, a.bytes);
    else if (ext == ".txt")
      events_->add_text(step, tag, as_code_block(std::string(a.bytes.begin(), a.bytes.end())));
  }
  events_->flush();
}

void RunWatchers::after_update(int64_t step) {
  if (writer_ && options_.report_every > 0 && step % options_.report_every == 0) finish();
}

std::string RunWatchers::finish() {
  if (!writer_) return "";
  try {
    return write_report({run_dir_}, (fs::path(run_dir_) / "report.html").string());
  } catch (const Error& e) {
    if (warn_) warn_("report: " + e.describe());
  } catch (const std::exception& e) {
    if (warn_) warn_(std::string("report: ") + e.what());
  }
  return "";
}

double resident_memory_mb() {
  std::ifstream statm("/proc/self/statm");
  long long pages_total = 0, pages_resident = 0;
  if (!(statm >> pages_total >> pages_resident)) return 0.0;
  return double(pages_resident) * double(sysconf(_SC_PAGESIZE)) / (1024.0 * 1024.0);
}

}  // namespace dew
