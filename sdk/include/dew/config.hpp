// dew/config.hpp — run configuration: INI sections of key = value, overridable as --section.key.
//
// A Config is a set of sections, each an Options (dew/options.hpp) whose getters mark keys as used.
// After everything is built from it, check_all_used() refuses every key nobody read, naming it
// ("unknown option 'optim.lrr'"), so a misspelt key is an error and never silently ignored.
// Files: `[section]` headers, `key = value`, `#` or `;` comments; values keep inner spaces.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "dew/options.hpp"

namespace dew {

class Config {
 public:
  static Config parse_ini(const std::string& text, const std::string& origin = "<string>");
  static Config load_ini(const std::string& path);  // UsageError for a missing/unreadable file or a syntax error

  // "section.key" = value (command-line overrides); creates the section when needed.
  void set(const std::string& dotted_key, const std::string& value);
  bool has(const std::string& dotted_key) const;
  bool has_section(const std::string& name) const { return sections_.count(name) != 0; }
  // The section's options (empty ones for a section that is absent).
  Options& section(const std::string& name);
  const std::map<std::string, Options>& sections() const { return sections_; }

  // The effective config as INI text (sections and keys sorted): written as config.ini in the run dir.
  std::string to_ini() const;
  // Throws UsageError naming every key no getter read.
  void check_all_used() const;

 private:
  std::map<std::string, Options> sections_;
};

}  // namespace dew
