// core/report/report.cpp — the HTML run report of dew/report.hpp (`dew-run report`, and `dew-run train` at
// its end and every trainer.report_every updates).
//
// The C++ side only gathers: each run's config.ini (text and section.key values), metrics.jsonl (a series
// per key: [step, value], null for a non-finite value) and the latest artifacts of samples/ per tag (PNG
// grids as data: URIs; text samples as base64 of their bytes, which the page decodes as UTF-8 with the
// browser's replacement of bad bytes: a byte-level model's sample need not be UTF-8), as one JSON document
// placed in a <script type="application/json">.
// Everything shown is drawn in the browser by page.js (inline SVG), styled by page.css; both are compiled
// in (core/CMakeLists.txt turns them into page_assets.inc), so the file needs no network and no other file.
// Every '<' of the JSON is written as \u003c, so no text of a run can close the script element.
#include "dew/report.hpp"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dew/config.hpp"
#include "dew/error.hpp"
#include "report/page_assets.inc"
#include "report/run_files.hpp"

namespace dew {

namespace fs = std::filesystem;
using nlohmann::json;

namespace run_files {

std::string artifact_tag(const std::string& file_name) {
  std::string s = fs::path(file_name).stem().string();
  while (!s.empty() && std::isdigit(static_cast<unsigned char>(s.back()))) s.pop_back();
  while (!s.empty() && (s.back() == '-' || s.back() == '_')) s.pop_back();
  if (s.size() >= 4 && s.compare(s.size() - 4, 4, "step") == 0) s.resize(s.size() - 4);
  while (!s.empty() && (s.back() == '-' || s.back() == '_')) s.pop_back();
  return s.empty() ? "sample" : s;
}

int64_t artifact_step(const std::string& file_name) {
  const std::string s = fs::path(file_name).stem().string();
  size_t i = s.size();
  while (i > 0 && std::isdigit(static_cast<unsigned char>(s[i - 1]))) --i;
  if (i == s.size() || s.size() - i > 18) return -1;
  return std::stoll(s.substr(i));
}

}  // namespace run_files

namespace {

// NaN, Infinity and -Infinity (bare, as the trainer writes them) become strings outside JSON strings,
// so a standard parser reads the line; number_of() turns them back.
std::string quote_non_finite(const std::string& line) {
  std::string out;
  out.reserve(line.size() + 16);
  bool in_string = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      out += c;
      if (c == '\\' && i + 1 < line.size())
        out += line[++i];
      else if (c == '"')
        in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    for (const char* word : {"NaN", "Infinity", "-Infinity"}) {
      const size_t n = std::strlen(word);
      if (line.compare(i, n, word) == 0) {
        out += '"';
        out += word;
        out += '"';
        i += n - 1;
        goto next;
      }
    }
    out += c;
  next:;
  }
  return out;
}

template <class Json>
bool number_of(const Json& v, double& out) {
  if (v.is_number()) {
    out = v.template get<double>();
    return true;
  }
  if (v.is_string()) {
    const std::string& s = v.template get_ref<const std::string&>();
    if (s == "NaN")
      out = std::numeric_limits<double>::quiet_NaN();
    else if (s == "Infinity")
      out = std::numeric_limits<double>::infinity();
    else if (s == "-Infinity")
      out = -std::numeric_limits<double>::infinity();
    else
      return false;
    return true;
  }
  return false;
}

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  DEW_USAGE_CHECK(in, "cannot read '", p.string(), "'");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

std::string base64(const std::string& bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t b0 = uint8_t(bytes[i]), b1 = i + 1 < bytes.size() ? uint8_t(bytes[i + 1]) : 0,
                   b2 = i + 2 < bytes.size() ? uint8_t(bytes[i + 2]) : 0;
    const uint32_t v = b0 << 16 | b1 << 8 | b2;
    out += kAlphabet[v >> 18 & 63];
    out += kAlphabet[v >> 12 & 63];
    out += i + 1 < bytes.size() ? kAlphabet[v >> 6 & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[v & 63] : '=';
  }
  return out;
}

// Artifacts of samples/ kept per tag: the newest few (by step), newest first.
constexpr size_t kImagesPerTag = 6, kTextsPerTag = 3;

json read_samples(const fs::path& dir) {
  json images = json::array(), texts = json::array();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return json{{"images", images}, {"texts", texts}};
  struct Entry {
    int64_t step;
    std::string file;
  };
  std::map<std::string, std::vector<Entry>> png, txt;  // by tag
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    const std::string name = e.path().filename().string(), ext = e.path().extension().string();
    if (ext != ".png" && ext != ".txt") continue;
    (ext == ".png" ? png : txt)[run_files::artifact_tag(name)].push_back({run_files::artifact_step(name), name});
  }
  auto newest = [](std::vector<Entry>& v, size_t n) {
    std::sort(v.begin(), v.end(),
              [](const Entry& a, const Entry& b) { return a.step != b.step ? a.step > b.step : a.file > b.file; });
    if (v.size() > n) v.resize(n);
  };
  for (auto& [tag, entries] : png) {
    newest(entries, kImagesPerTag);
    for (const auto& en : entries)
      images.push_back({{"tag", tag},
                        {"step", en.step},
                        {"file", en.file},
                        {"src", "data:image/png;base64," + base64(read_file(dir / en.file))}});
  }
  for (auto& [tag, entries] : txt) {
    newest(entries, kTextsPerTag);
    for (const auto& en : entries)
      texts.push_back(
          {{"tag", tag}, {"step", en.step}, {"file", en.file}, {"base64", base64(read_file(dir / en.file))}});
  }
  return json{{"images", images}, {"texts", texts}};
}

json read_run(const std::string& run_dir) {
  const fs::path dir(run_dir);
  std::error_code ec;
  DEW_USAGE_CHECK(fs::is_directory(dir, ec), "--run-dir ", run_dir, ": no such directory");
  const fs::path cfg_path = dir / "config.ini", metrics_path = dir / "metrics.jsonl";
  DEW_USAGE_CHECK(fs::exists(cfg_path) && fs::exists(metrics_path), "'", run_dir,
                  "' is not a run directory (it needs config.ini and metrics.jsonl)");
  json run;
  const std::string ini = read_file(cfg_path);
  const Config config = Config::parse_ini(ini, cfg_path.string());
  json values = json::object();
  for (const auto& [section, options] : config.sections())
    for (const auto& [key, value] : options.values()) values[section + "." + key] = value;
  std::string name = values.contains("run.name") ? values["run.name"].get<std::string>() : "";
  if (name.empty()) name = fs::absolute(dir).lexically_normal().filename().string();
  run["name"] = name;
  run["dir"] = fs::absolute(dir).lexically_normal().string();
  run["config_ini"] = ini;
  run["config"] = values;

  // metrics.jsonl -> {key: [[step, value or null], ...]} in file order.
  const std::string text = read_file(metrics_path);
  json series = json::object();
  size_t begin = 0, line_no = 0;
  while (begin < text.size()) {
    const size_t end = text.find('\n', begin);
    if (end == std::string::npos) break;  // a line still being written
    ++line_no;
    const std::string line = text.substr(begin, end - begin);
    begin = end + 1;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const MetricsRecord r = parse_metrics_line(line, metrics_path.string() + ":" + std::to_string(line_no));
    for (const auto& [key, v] : r.values) {
      json& s = series[key];
      if (s.is_null()) s = json::array();
      s.push_back(json::array({r.step, std::isfinite(v) ? json(v) : json(nullptr)}));
    }
  }
  run["series"] = series;
  json samples = read_samples(dir / "samples");
  run["images"] = samples["images"];
  run["texts"] = samples["texts"];
  return run;
}

std::string html_escape(const std::string& s) {
  std::string out;
  for (const char c : s) {
    switch (c) {
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '&':
        out += "&amp;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

}  // namespace

MetricsRecord parse_metrics_line(const std::string& line, const std::string& where) {
  nlohmann::ordered_json j;  // keeps the line's key order
  try {
    j = nlohmann::ordered_json::parse(quote_non_finite(line));
  } catch (const json::exception& e) {
    DEW_USAGE_CHECK(false, where, ": not a JSON object (", e.what(), ")");
  }
  DEW_USAGE_CHECK(j.is_object(), where, ": not a JSON object");
  MetricsRecord r;
  double step = 0;
  DEW_USAGE_CHECK(j.contains("step") && number_of(j["step"], step) && std::isfinite(step), where,
                  ": no numeric \"step\"");
  r.step = int64_t(step);
  for (const auto& [key, value] : j.items()) {
    double v = 0;
    if (key != "step" && number_of(value, v)) r.values.emplace_back(key, v);
  }
  return r;
}

std::string write_report(const std::vector<std::string>& run_dirs, const std::string& out_path) {
  DEW_USAGE_CHECK(!run_dirs.empty(), "report: no --run-dir given");
  json data;
  data["runs"] = json::array();
  for (const auto& d : run_dirs) data["runs"].push_back(read_run(d));
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char stamp[64];
  std::strftime(stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S UTC", std::gmtime(&now));
  data["generated"] = stamp;

  std::string payload = data.dump(-1, ' ', false, json::error_handler_t::replace);
  std::string safe;
  safe.reserve(payload.size() + 64);
  for (const char c : payload) {
    if (c == '<')
      safe += "\\u003c";
    else
      safe += c;
  }
  std::string title;
  for (const auto& r : data["runs"]) title += (title.empty() ? "" : " vs ") + r["name"].get<std::string>();

  std::ostringstream html;
  html << "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
       << "<meta name=\"generator\" content=\"dew-run report\">\n"
       << "<title>dew report: " << html_escape(title) << "</title>\n<style>\n"
       << kReportCss
       << "</style>\n</head>\n<body>\n"
       // Script errors are shown on the page (and counted in data-errors) before anything else runs.
       << "<script>window.dewErrors=[];window.addEventListener('error',function(e){window.dewErrors.push(String("
          "e.message));var p=document.getElementById('dew-errors');if(p){p.hidden=false;p.textContent+="
          "'script error: '+e.message+'\\n';}document.body.setAttribute('data-errors',String(window.dewErrors."
          "length));});</script>\n"
       << "<pre id=\"dew-errors\" hidden></pre>\n"
       << "<main id=\"dew-report\"><noscript>This report draws its plots with JavaScript.</noscript></main>\n"
       << "<script type=\"application/json\" id=\"dew-data\">" << safe << "</script>\n"
       << "<script>\n"
       << kReportJs << "</script>\n</body>\n</html>\n";

  const fs::path out(out_path);
  DEW_USAGE_CHECK(!fs::is_directory(out), "report: --out '", out_path, "' is a folder: name the HTML file to write");
  if (out.has_parent_path()) {
    std::error_code ec;
    fs::create_directories(out.parent_path(), ec);
  }
  const fs::path tmp = out.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    DEW_USAGE_CHECK(f, "report: cannot write '", tmp.string(), "'");
    const std::string s = html.str();
    f.write(s.data(), std::streamsize(s.size()));
    f.close();
    DEW_CHECK(f.good(), "report: cannot write '", tmp.string(), "'");
  }
  std::error_code ec;
  fs::rename(tmp, out, ec);
  if (ec) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
  }
  DEW_CHECK(!ec, "report: cannot rename '", tmp.string(), "' to '", out.string(), "': ", ec.message());
  return out.string();
}

}  // namespace dew
