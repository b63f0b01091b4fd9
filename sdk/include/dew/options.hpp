// dew/options.hpp — the key/value options a plugin is created with (one config section, flattened).
//
// Values are strings as written in the config or on the command line; typed getters parse them and
// name the key in the error. Every key read is marked used; check_all_used() refuses the rest, so a
// misspelt key is an error, never silently ignored. The error names the keys the reader looked for (every key
// passed to has() or a getter, present or not) and the nearest of them to a misspelt key ("did you mean").
#pragma once
#include <map>
#include <set>
#include <string>
#include <vector>

namespace dew {

// An option a plugin accepts: shown by `dew-run train --help` and validated by the launcher.
struct OptionSpec {
  std::string key;
  std::string default_value;  // empty: required or no default
  std::string help;
};

class Options {
 public:
  Options() = default;
  explicit Options(std::map<std::string, std::string> values, std::string context = {})
      : values_(std::move(values)), context_(std::move(context)) {}

  bool has(const std::string& key) const;
  void set(const std::string& key, std::string value) { values_[key] = std::move(value); }
  void erase(const std::string& key) { values_.erase(key); }
  // A key given on the command line as a bare flag ("--echo"): it reads as true through get_bool, and the
  // text getters refuse it ("needs a value") instead of reading the word "true".
  void set_flag(const std::string& key) {
    values_[key] = "true";
    flags_.insert(key);
  }

  std::string get_string(const std::string& key, const std::string& fallback) const;
  std::string require_string(const std::string& key) const;
  int64_t get_int(const std::string& key, int64_t fallback) const;
  double get_double(const std::string& key, double fallback) const;
  bool get_bool(const std::string& key, bool fallback) const;
  std::vector<double> get_doubles(const std::string& key, const std::vector<double>& fallback) const;
  std::vector<std::string> get_strings(const std::string& key, const std::vector<std::string>& fallback) const;
  // A comma-separated list of positive integers ("32, 64"); the error names the key.
  std::vector<int64_t> get_positive_ints(const std::string& key, const std::vector<int64_t>& fallback) const;

  // Whether a getter read the key (e.g. whether a plugin took an optional key it was handed).
  bool was_read(const std::string& key) const { return used_.count(key) > 0; }
  // Throws a UsageError naming every key that no getter read, with the keys that were looked for.
  void check_all_used() const;
  const std::map<std::string, std::string>& values() const { return values_; }
  const std::string& context() const { return context_; }

 private:
  std::map<std::string, std::string> values_;
  std::string context_;  // e.g. "[model]" for error messages
  mutable std::set<std::string> used_;
  mutable std::set<std::string> asked_;  // every key looked for (has() and the getters), present or not
  std::set<std::string> flags_;          // keys given as bare flags (set_flag)
};

// Whether `name` matches any of the shell-style globs (fnmatch, no flags: '*' matches '.' too), as option values
// such as optim.roles.<role>, optim.freeze and lora.targets give them.
bool matches_any_glob(const std::string& name, const std::vector<std::string>& globs);

}  // namespace dew
