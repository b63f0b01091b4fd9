// core/registry/options.cpp — typed access to a component's string options, with used-key tracking.
#include "dew/options.hpp"

#include <fnmatch.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <sstream>

#include "dew/error.hpp"

namespace dew {

namespace {
std::string where(const std::string& ctx, const std::string& key) {
  return ctx.empty() ? "'" + key + "'" : "'" + ctx + "." + key + "'";
}
std::string trim(std::string s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}
// Levenshtein distance (insertions, deletions, substitutions), for "did you mean".
size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::string item;
  std::istringstream is(s);
  while (std::getline(is, item, ',')) {
    item = trim(item);
    if (!item.empty()) out.push_back(item);
  }
  return out;
}
}  // namespace

bool matches_any_glob(const std::string& name, const std::vector<std::string>& globs) {
  for (const std::string& g : globs)
    if (fnmatch(g.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

bool Options::has(const std::string& key) const {
  asked_.insert(key);
  return values_.count(key) != 0;
}

std::string Options::get_string(const std::string& key, const std::string& fallback) const {
  asked_.insert(key);
  auto it = values_.find(key);
  if (it == values_.end()) return fallback;
  used_.insert(key);
  DEW_USAGE_CHECK(!flags_.count(key), "option ", where(context_, key), " needs a value");
  return it->second;
}

std::string Options::require_string(const std::string& key) const {
  asked_.insert(key);
  auto it = values_.find(key);
  DEW_USAGE_CHECK(it != values_.end(), "missing required option ", where(context_, key));
  used_.insert(key);
  DEW_USAGE_CHECK(!flags_.count(key), "option ", where(context_, key), " needs a value");
  return it->second;
}

int64_t Options::get_int(const std::string& key, int64_t fallback) const {
  if (!has(key)) return fallback;
  const std::string s = trim(get_string(key, ""));
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 10);
  DEW_USAGE_CHECK(!s.empty() && end && *end == '\0' && errno == 0, "option ", where(context_, key),
                  " must be an integer, got '", s, "'");
  return v;
}

double Options::get_double(const std::string& key, double fallback) const {
  if (!has(key)) return fallback;
  const std::string s = trim(get_string(key, ""));
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s.c_str(), &end);
  DEW_USAGE_CHECK(!s.empty() && end && *end == '\0' && errno == 0, "option ", where(context_, key),
                  " must be a number, got '", s, "'");
  return v;
}

bool Options::get_bool(const std::string& key, bool fallback) const {
  if (!has(key)) return fallback;
  if (flags_.count(key)) {  // "--echo" alone
    used_.insert(key);
    return true;
  }
  std::string s = trim(get_string(key, ""));
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  if (s == "true" || s == "1" || s == "yes" || s == "on") return true;
  if (s == "false" || s == "0" || s == "no" || s == "off") return false;
  DEW_USAGE_CHECK(false, "option ", where(context_, key), " must be true or false, got '", s, "'");
  return fallback;
}

std::vector<double> Options::get_doubles(const std::string& key, const std::vector<double>& fallback) const {
  if (!has(key)) return fallback;
  std::vector<double> out;
  for (const std::string& item : split_list(get_string(key, ""))) {
    char* end = nullptr;
    const double v = std::strtod(item.c_str(), &end);
    DEW_USAGE_CHECK(end && *end == '\0', "option ", where(context_, key),
                    " must be a comma-separated list of numbers, got '", item, "'");
    out.push_back(v);
  }
  return out;
}

std::vector<std::string> Options::get_strings(const std::string& key, const std::vector<std::string>& fallback) const {
  if (!has(key)) return fallback;
  return split_list(get_string(key, ""));
}

std::vector<int64_t> Options::get_positive_ints(const std::string& key, const std::vector<int64_t>& fallback) const {
  if (!has(key)) return fallback;
  std::vector<int64_t> out;
  for (const std::string& item : split_list(get_string(key, ""))) {
    char* end = nullptr;
    errno = 0;
    const long long v = std::strtoll(item.c_str(), &end, 10);
    DEW_USAGE_CHECK(end && *end == '\0' && errno == 0 && v > 0, "option ", where(context_, key),
                    " must be a list of positive integers, got '", item, "'");
    out.push_back(v);
  }
  return out;
}

void Options::check_all_used() const {
  std::vector<std::string> unknown;
  for (const auto& [k, v] : values_)
    if (!used_.count(k)) unknown.push_back(k);
  if (unknown.empty()) return;
  std::string list;
  for (const auto& k : unknown) list += (list.empty() ? "" : ", ") + where(context_, k);
  // What the unknown keys may have meant: the nearest key the reader looked for (present or not: a misspelt
  // override of a key the config also sets), within a third of its length; else the keys it looked for and
  // did not get (a key of another plugin: what this one takes instead).
  std::string hint;
  for (const auto& k : unknown) {
    const std::string* best = nullptr;
    size_t best_d = std::max<size_t>(1, k.size() / 3) + 1;
    for (const auto& e : asked_)
      if (const size_t d = edit_distance(k, e); d > 0 && d < best_d) best_d = d, best = &e;
    if (best)
      hint += std::string(hint.empty() ? "; did you mean " : ", ") + where(context_, *best) +
              (unknown.size() > 1 ? " for '" + k + "'" : std::string("?"));
  }
  if (hint.empty()) {
    std::string looked;
    for (const auto& k : asked_)
      if (!values_.count(k)) looked += (looked.empty() ? "" : ", ") + k;
    if (!looked.empty())
      hint = "; " + (context_.empty() ? std::string("its reader") : "[" + context_ + "]'s reader") +
             " also looks for: " + looked;
  }
  DEW_USAGE_CHECK(false, "unknown option", unknown.size() > 1 ? "s " : " ", list, hint);
}

}  // namespace dew
