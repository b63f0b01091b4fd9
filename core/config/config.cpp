// core/config/config.cpp — INI parsing, dotted overrides, effective-config text, unknown-key refusal.
#include "dew/config.hpp"

#include <fstream>
#include <sstream>

#include "dew/error.hpp"

namespace dew {

namespace {
std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t\r");
  const auto e = s.find_last_not_of(" \t\r");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}
}  // namespace

Config Config::parse_ini(const std::string& text, const std::string& origin) {
  Config c;
  std::istringstream in(text);
  std::string line, section;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    const std::string t = trim(line);
    if (t.empty() || t[0] == '#' || t[0] == ';') continue;
    if (t.front() == '[') {
      DEW_USAGE_CHECK(t.back() == ']' && t.size() > 2, origin, ":", number, ": bad section header '", t, "'");
      section = trim(t.substr(1, t.size() - 2));
      c.section(section);
      continue;
    }
    const auto eq = t.find('=');
    DEW_USAGE_CHECK(eq != std::string::npos, origin, ":", number, ": expected 'key = value', got '", t, "'");
    DEW_USAGE_CHECK(!section.empty(), origin, ":", number, ": key '", trim(t.substr(0, eq)), "' outside any [section]");
    const std::string key = trim(t.substr(0, eq));
    std::string value = trim(t.substr(eq + 1));
    // strip a trailing " # comment"
    for (const char* mark : {" #", " ;"}) {
      const auto pos = value.find(mark);
      if (pos != std::string::npos) value = trim(value.substr(0, pos));
    }
    DEW_USAGE_CHECK(!key.empty(), origin, ":", number, ": empty key");
    DEW_USAGE_CHECK(!c.section(section).has(key), origin, ":", number, ": key '", section, ".", key, "' given twice");
    c.section(section).set(key, value);
  }
  return c;
}

Config Config::load_ini(const std::string& path) {
  std::ifstream f(path);
  DEW_USAGE_CHECK(f.good(), "config file '", path, "' cannot be read");
  std::stringstream ss;
  ss << f.rdbuf();
  return parse_ini(ss.str(), path);
}

void Config::set(const std::string& dotted_key, const std::string& value) {
  const auto dot = dotted_key.find('.');
  DEW_USAGE_CHECK(dot != std::string::npos && dot > 0 && dot + 1 < dotted_key.size(), "override '", dotted_key,
                  "' must be --section.key");
  // The override must read back from config.ini as given (a resume re-reads it): names without the INI
  // syntax characters, values without line breaks, comment marks or surrounding blanks. Found by fuzzing
  // (fuzz/config_ini.cpp): `--data.path "/d/my #1"` was written as-is and re-read as "/d/my".
  const std::string sec = dotted_key.substr(0, dot), key = dotted_key.substr(dot + 1);
  for (const std::string* name : {&sec, &key})
    DEW_USAGE_CHECK(name->find_first_of(" \t\r\n=[]#;") == std::string::npos, "override '--", dotted_key,
                    "': a section or key name cannot hold blanks or any of = [ ] # ;");
  DEW_USAGE_CHECK(value.find_first_of("\r\n") == std::string::npos, "override '--", dotted_key,
                  "': the value holds a line break, which config.ini cannot keep");
  DEW_USAGE_CHECK(value.find(" #") == std::string::npos && value.find(" ;") == std::string::npos,
                  "override '--", dotted_key, "' = '", value,
                  "': a blank followed by # or ; would be read back from config.ini as a comment");
  DEW_USAGE_CHECK(value.empty() || (value.front() != ' ' && value.front() != '\t' && value.back() != ' ' &&
                                    value.back() != '\t'),
                  "override '--", dotted_key, "' = '", value,
                  "': leading or trailing blanks would be lost in config.ini (quote the value if the objective unquotes it)");
  section(sec).set(key, value);
}

bool Config::has(const std::string& dotted_key) const {
  const auto dot = dotted_key.find('.');
  if (dot == std::string::npos) return false;
  auto it = sections_.find(dotted_key.substr(0, dot));
  return it != sections_.end() && it->second.has(dotted_key.substr(dot + 1));
}

Options& Config::section(const std::string& name) {
  auto it = sections_.find(name);
  if (it == sections_.end()) it = sections_.emplace(name, Options({}, name)).first;
  return it->second;
}

std::string Config::to_ini() const {
  std::ostringstream os;
  bool first = true;
  for (const auto& [name, opts] : sections_) {
    if (opts.values().empty()) continue;
    os << (first ? "" : "\n") << "[" << name << "]\n";
    first = false;
    for (const auto& [k, v] : opts.values()) os << k << " = " << v << "\n";
  }
  return os.str();
}

void Config::check_all_used() const {
  for (const auto& [name, opts] : sections_) opts.check_all_used();
}

}  // namespace dew
