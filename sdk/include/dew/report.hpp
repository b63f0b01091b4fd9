// dew/report.hpp — looking at runs: the HTML run report (`dew-run report`) and the reading of a run
// directory's metrics.jsonl lines.
//
// The report is one self-contained HTML file (no network: the plots are inline SVG drawn by an inline
// script, images are data: URIs): training and validation curves (smoothing, log scale), learning rate,
// throughput, memory, the latest image grids and text samples of samples/, the effective config; with
// several run directories the runs are overlaid and their config differences listed. docs/training.md.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dew {

// One line of metrics.jsonl: its "step" and its other numeric fields in file order (NaN, Infinity and
// -Infinity, which the trainer writes for non-finite values, read as such; non-numeric fields are skipped).
struct MetricsRecord {
  int64_t step = 0;
  std::vector<std::pair<std::string, double>> values;
};
// Parses one line; throws dew::UsageError naming `where` when it is not a JSON object with a numeric "step".
MetricsRecord parse_metrics_line(const std::string& line, const std::string& where = "metrics line");

// Writes the report of `run_dirs` (each holding config.ini and metrics.jsonl) to `out_path`, through a
// temporary name and a rename, so a browser refreshing it never reads half a file. Returns out_path.
// A directory that is not a run directory, or a malformed metrics line, is a dew::UsageError; the last
// line of a metrics.jsonl without its newline (being written) is ignored.
std::string write_report(const std::vector<std::string>& run_dirs, const std::string& out_path);

}  // namespace dew
