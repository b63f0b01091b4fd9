// fuzz/hf_config.cpp — libFuzzer target: a Hugging Face config.json as `dew-run import` reads it
// (plugins/models/causal_transformer/hf_converter.cpp, compiled into this target: the llama / mistral /
// qwen2 / qwen3 import). Any text must map to a [model] section or raise dew::Error naming the field; an
// accepted section's keys and values are written into a Config as import does (a value that the INI
// writer could not round-trip is refused there, never silently changed). (generation_config.json is
// copied by import and export, not parsed: there is nothing of dew's to fuzz in it.)
#include "clang14_compat.hpp"  // first: dew/registry.hpp under clang-14
#include "../plugins/models/causal_transformer/hf_converter.cpp"

#include <cstdint>

#include "dew/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const DecoderConverter conv;
  try {
    const dew::HfImport plan = conv.import_config(text);
    if (!plan.model.count("plugin")) __builtin_trap();
    dew::Config config;
    for (const auto& [k, v] : plan.model) config.set("model." + k, v);
    const dew::Config again = dew::Config::parse_ini(config.to_ini());
    (void)again;
  } catch (const dew::Error&) {
  }
  return 0;
}
