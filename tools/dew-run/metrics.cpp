// tools/dew-run/metrics.cpp — the Prometheus text exposition of metrics.hpp.
#include "metrics.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

namespace dew_run {

namespace {

// A value as Prometheus reads it: integers exactly, others with 17 significant digits (round-trip).
std::string number(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  char buf[40];
  if (v == std::floor(v) && std::fabs(v) < 1e15)
    std::snprintf(buf, sizeof buf, "%.0f", v);
  else
    std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

void header(std::string& out, const std::string& name, const char* type, const std::string& help) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double seconds) {
  if (!(seconds >= 0)) seconds = 0;  // a clock step backwards (or NaN) counts in the first bucket
  const size_t at = size_t(std::lower_bound(bounds_.begin(), bounds_.end(), seconds) - bounds_.begin());
  std::lock_guard<std::mutex> lk(mu_);
  ++counts_[at];
  sum_ += seconds;
  ++count_;
}

void Histogram::write(std::string& out, const std::string& name, const std::string& help) const {
  std::lock_guard<std::mutex> lk(mu_);
  header(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + number(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + number(sum_) + "\n";
  out += name + "_count " + std::to_string(count_) + "\n";
}

void write_metric(std::string& out, const std::string& name, const char* type, const std::string& help, double value) {
  header(out, name, type, help);
  out += name + " " + number(value) + "\n";
}

void ServeMetrics::count_response(const std::string& path, int status) {
  static const std::set<std::string> routes = {
      "/v1/completions", "/v1/chat/completions", "/v1/images", "/v1/images/generations", "/v1/models", "/health",
      "/metrics"};
  std::lock_guard<std::mutex> lk(mu_);
  ++responses_[{routes.count(path) ? path : "other", status}];
}

void ServeMetrics::write_responses(std::string& out) const {
  std::lock_guard<std::mutex> lk(mu_);
  header(out, "dew_http_responses_total", "counter", "HTTP responses by route and status.");
  for (const auto& [key, n] : responses_)
    out += "dew_http_responses_total{route=\"" + key.first + "\",code=\"" + std::to_string(key.second) + "\"} " +
           std::to_string(n) + "\n";
}

}  // namespace dew_run
