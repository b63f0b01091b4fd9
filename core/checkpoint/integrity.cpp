// core/checkpoint/integrity.cpp — encode/decode the checksum block (layout in integrity.h).
// Decoding is bounds-checked at every field: it reads only the n bytes given and refuses sizes,
// counts or offsets that cannot be right, so any byte string gives either a block or a reason.
#include "checkpoint/integrity.h"

#include <zlib.h>

#include <cstring>

namespace dew::checkpoint_integrity {
namespace {

constexpr size_t kHeader = 32;      // magic .. entry count
constexpr size_t kEntryFixed = 22;  // u16 length + u64 offset + u64 size + u32 crc

void put(std::string& s, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) s.push_back(char((v >> (8 * i)) & 0xFF));
}

uint64_t get(const unsigned char* p, int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) v |= uint64_t(p[i]) << (8 * i);
  return v;
}

}  // namespace

uint32_t crc32_bytes(const void* data, size_t n, uint32_t crc) {
  const auto* p = static_cast<const Bytef*>(data);
  uLong c = crc;
  while (n > 0) {  // zlib's length is a uInt: feed it in chunks
    const uInt chunk = n > (1u << 30) ? (1u << 30) : uInt(n);
    c = ::crc32(c, p, chunk);
    p += chunk;
    n -= chunk;
  }
  return uint32_t(c);
}

size_t block_size_for(const std::vector<std::string>& names) {
  size_t need = kHeader + 4;
  for (const auto& n : names) need += kEntryFixed + n.size();
  size_t b = kMinBlock;
  while (b < need) b *= 2;
  return b;
}

std::string encode(const Block& b) {
  std::string s(kMagic, sizeof kMagic);
  put(s, kBlockVersion, 4);
  put(s, b.block_size, 4);
  put(s, b.file_size, 8);
  put(s, b.file_crc, 4);
  put(s, b.entries.size(), 4);
  for (const Entry& e : b.entries) {
    put(s, e.name.size(), 2);
    s += e.name;
    put(s, e.offset, 8);
    put(s, e.size, 8);
    put(s, e.crc, 4);
  }
  put(s, crc32_bytes(s.data(), s.size()), 4);
  s.resize(b.block_size, '\0');  // callers size the block with block_size_for
  return s;
}

bool has_magic(const unsigned char* p, size_t n) { return n >= sizeof kMagic && std::memcmp(p, kMagic, sizeof kMagic) == 0; }

bool decode(const unsigned char* p, size_t n, Block& out, std::string& why) {
  if (!has_magic(p, n)) return why = "no checksum block (magic missing)", false;
  if (n < kHeader + 4) return why = "checksum block cut short", false;
  const uint64_t version = get(p + 8, 4);
  if (version != kBlockVersion) return why = "checksum block version " + std::to_string(version) + " unknown", false;
  const uint64_t block = get(p + 12, 4);
  if (block < kMinBlock || block > kMaxBlock || (block & (block - 1)) != 0)
    return why = "checksum block size " + std::to_string(block) + " is not a power of two in [512, 256 MiB]", false;
  if (block > n) return why = "checksum block of " + std::to_string(block) + " bytes but only " + std::to_string(n) + " read", false;
  Block b;
  b.block_size = uint32_t(block);
  b.file_size = get(p + 16, 8);
  b.file_crc = uint32_t(get(p + 24, 4));
  const uint64_t count = get(p + 28, 4);
  if (count > (block - kHeader) / kEntryFixed) return why = "checksum block lists more entries than fit in it", false;
  size_t at = kHeader;
  b.entries.reserve(size_t(count));
  for (uint64_t i = 0; i < count; ++i) {
    if (at + 2 > block) return why = "checksum block entry " + std::to_string(i) + " runs past the block", false;
    const size_t len = size_t(get(p + at, 2));
    if (at + 2 + len + 20 > block) return why = "checksum block entry " + std::to_string(i) + " runs past the block", false;
    Entry e;
    e.name.assign(reinterpret_cast<const char*>(p + at + 2), len);
    at += 2 + len;
    e.offset = get(p + at, 8);
    e.size = get(p + at + 8, 8);
    e.crc = uint32_t(get(p + at + 16, 4));
    at += 20;
    if (e.offset < block || e.offset > b.file_size || e.size > b.file_size - e.offset)
      return why = "checksum block entry '" + e.name + "' points outside the file", false;
    b.entries.push_back(std::move(e));
  }
  if (at + 4 > block) return why = "checksum block cut short", false;
  if (uint32_t(get(p + at, 4)) != crc32_bytes(p, at)) return why = "checksum block is damaged (its own CRC-32 differs)", false;
  if (b.file_size < block) return why = "checksum block says the file is smaller than the block", false;
  out = std::move(b);
  return true;
}

}  // namespace dew::checkpoint_integrity
