// core/checkpoint/integrity.h — the checksum block at the start of a dew checkpoint (HDF5 user block).
//
// Since checksums were added (format 1 still; older files have none) a checkpoint starts with an HDF5 *user block* (reserved bytes HDF5 skips; h5py and
// h5dump read such files unchanged) holding:
//
//   offset  size  field
//   0       8     magic "DEWCKSUM"
//   8       4     block version (u32, = 1)
//   12      4     block size B (u32, a power of two >= 512: HDF5's user-block rule)
//   16      8     file size in bytes (u64)
//   24      4     CRC-32 of the file's bytes [B, file size) (u32)
//   28      4     number of entries N (u32)
//   32      ...   N entries: u16 name length L, L bytes "group/name" (e.g. "params/model.w"),
//                 u64 file offset of the dataset's bytes, u64 their size, u32 their CRC-32
//   ...     4     CRC-32 of every byte above (magic through the last entry)
//   rest          zero padding up to B
//
// All integers little-endian; CRC-32 is zlib's crc32 (the IEEE/ISO-HDLC polynomial). The entries
// repeat each dataset's @crc32 attribute together with where its bytes lie, so a reader can verify a
// file — and name the damaged tensor — before HDF5 parses a single byte of it: a file whose bytes
// differ from what was written never reaches libhdf5 (whose parser can crash on damaged metadata).
//
// Invariants: decode_checksum_block never reads past `n` bytes and refuses any inconsistency (sizes,
// counts, offsets beyond the file, bad block CRC) with a reason; it is a fuzz target (fuzz/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace dew::checkpoint_integrity {

inline constexpr char kMagic[8] = {'D', 'E', 'W', 'C', 'K', 'S', 'U', 'M'};
inline constexpr uint32_t kBlockVersion = 1;
inline constexpr size_t kMinBlock = 512;
inline constexpr size_t kMaxBlock = size_t(1) << 28;  // 256 MiB: ~4 M tensors of 60-byte names

struct Entry {
  std::string name;  // "params/model.w", "optim/m/model.w", "state/objective.x"
  uint64_t offset = 0;
  uint64_t size = 0;
  uint32_t crc = 0;
};

struct Block {
  uint32_t block_size = 0;
  uint64_t file_size = 0;
  uint32_t file_crc = 0;
  std::vector<Entry> entries;
};

// CRC-32 (zlib) of n bytes, continuing from `crc` (0 to start).
uint32_t crc32_bytes(const void* data, size_t n, uint32_t crc = 0);

// The smallest valid block size (power of two >= 512) that holds these entries' names.
size_t block_size_for(const std::vector<std::string>& names);

// Encodes `b` into exactly b.block_size bytes. The entries must fit (block_size_for).
std::string encode(const Block& b);

// True if `p` (n bytes available from the file's start) begins with the magic.
bool has_magic(const unsigned char* p, size_t n);

// Decodes a block from the first n bytes of a file; false with `why` set when damaged.
bool decode(const unsigned char* p, size_t n, Block& out, std::string& why);

}  // namespace dew::checkpoint_integrity
