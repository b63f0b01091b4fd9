// fuzz/checkpoint_block.cpp — libFuzzer target: the checksum block at the start of a dew checkpoint
// (core/checkpoint/integrity.cpp), the only part of a checkpoint dew parses before deciding whether
// libhdf5 may see the file. decode() must read only the bytes given and refuse or accept; an accepted
// block must re-encode to the same bytes.
#include <cstdint>
#include <cstring>
#include <string>

#include "checkpoint/integrity.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace ci = dew::checkpoint_integrity;
  ci::Block b;
  std::string why;
  if (!ci::decode(data, size, b, why)) return 0;
  const std::string again = ci::encode(b);
  if (again.size() != b.block_size || std::memcmp(again.data(), data, again.size()) != 0) {
    // encode pads with zeros: bytes after the block's CRC may differ only if the input's padding was not zero
    size_t used = 36;
    for (const auto& e : b.entries) used += 22 + e.name.size();
    if (std::memcmp(again.data(), data, used) != 0) __builtin_trap();
  }
  return 0;
}
