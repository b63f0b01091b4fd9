// fuzz/config_ini.cpp — libFuzzer target: the INI config parser and the typed option getters a run
// reads (core/config/config.cpp, core/registry/options.cpp). The input's first line, when it holds '=',
// is also applied as a --section.key=value override. Any input must give a Config or a dew::Error; a
// parsed config must survive to_ini() -> parse_ini() with the same sections and values.
#include <cstdint>
#include <string>

#include "dew/config.hpp"
#include "dew/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  dew::Config c;
  try {
    c = dew::Config::parse_ini(text, "fuzz.ini");
  } catch (const dew::Error&) {
    return 0;
  }
  const auto nl = text.find('\n');
  const std::string first = text.substr(0, nl);
  if (const auto eq = first.find('='); eq != std::string::npos && first.find('.') < eq) {
    try {
      c.set(first.substr(0, eq), first.substr(eq + 1));
    } catch (const dew::Error&) {
    }
  }
  for (auto& [name, o] : c.sections()) {
    for (const auto& [k, v] : o.values()) {
      dew::Options& opt = c.section(name);
      try { opt.get_int(k, 0); } catch (const dew::Error&) {}
      try { opt.get_double(k, 0); } catch (const dew::Error&) {}
      try { opt.get_bool(k, false); } catch (const dew::Error&) {}
      try { opt.get_doubles(k, {}); } catch (const dew::Error&) {}
      try { opt.get_strings(k, {}); } catch (const dew::Error&) {}
      try { opt.get_positive_ints(k, {}); } catch (const dew::Error&) {}
    }
  }
  try {
    const dew::Config back = dew::Config::parse_ini(c.to_ini(), "round-trip");
    for (const auto& [name, o] : c.sections())
      if (!o.values().empty() && back.sections().at(name).values() != o.values()) __builtin_trap();
  } catch (const dew::Error&) {
    // a value the writer cannot round-trip (e.g. one ending in " #") is refused, not silently changed
  }
  return 0;
}
