// fuzz/safetensors.cpp — libFuzzer target: safetensors headers and shard indexes as `dew-run import`,
// --trainer.init_from and load_weights read them (core/checkpoint/safetensors.cpp). The first byte picks
// the reader: even = the rest is one .safetensors file (SafetensorsFile); odd = the rest is a
// model.safetensors.index.json, then (after the first NUL) the bytes of its shard
// model-00001-of-00001.safetensors (SafetensorsCheckpoint over the folder). Any input must load or raise
// dew::Error; every accepted entry must have begin <= end inside the data section and exactly
// numel(shape) * dtype size bytes computed here without overflow (a wrapped product would let a load
// read past the file), and its bytes are read.
#include <cstdint>
#include <filesystem>
#include <string>

#include "dew/error.hpp"
#include "dew/safetensors.hpp"
#include "scratch.hpp"

namespace fs = std::filesystem;

namespace {
using u128 = unsigned __int128;

// The entry's byte count must equal numel * size, in exact arithmetic.
void check_entry(const dew::SafetensorsEntry& e, uint64_t data_size) {
  if (e.begin > e.end || e.end > data_size) __builtin_trap();
  u128 n = dew::safetensors_dtype_size(e.dtype);
  for (int64_t d : e.shape) {
    if (d < 0) __builtin_trap();
    n *= u128(d);
    if (n > u128(data_size)) break;  // too large already: must not have been accepted
  }
  if (n != u128(e.end - e.begin)) __builtin_trap();
}

void read_all(const dew::SafetensorsFile& f, uint64_t file_size) {
  volatile unsigned sum = 0;
  const uint64_t data_size = file_size;  // an upper bound of the data section
  for (const auto& e : f.entries()) {
    check_entry(e, data_size);
    const unsigned char* p = f.data(e);
    for (uint64_t i = 0; i < e.end - e.begin; i += 97) sum += p[i];
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  static const fs::path dir = fuzz::scratch_dir("safetensors");
  try {
    if (data[0] % 2 == 0) {
      fuzz::put_file(dir / "one.safetensors", body);
      const dew::SafetensorsFile f((dir / "one.safetensors").string());
      read_all(f, body.size());
    } else {
      const fs::path folder = dir / "sharded";
      fs::create_directories(folder);
      const size_t nul = body.find('\0');
      fuzz::put_file(folder / "model.safetensors.index.json", body.substr(0, nul));
      fuzz::put_file(folder / "model-00001-of-00001.safetensors", nul == std::string::npos ? std::string() : body.substr(nul + 1));
      const dew::SafetensorsCheckpoint c(folder.string());
      for (const std::string& name : c.names()) check_entry(c.entry(name), body.size());
    }
  } catch (const dew::Error&) {
  }
  return 0;
}
