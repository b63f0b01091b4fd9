// dew/safetensors.hpp — the safetensors format (Hugging Face): an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then
// the raw little-endian tensor bytes. Names are kept verbatim (dew's parameter names are the Hugging
// Face ones for the decoder, so no renaming table is needed).
//
// Reading memory-maps the file (SafetensorsFile): the header is parsed once, tensors are views into the
// mapping until loaded onto a backend. Every dtype of the format's common set is read: BOOL, U8, I8,
// U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64, F8_E4M3, F8_E5M2. A tensor loads in its own dtype
// when dew has it (F32, F64, BF16, F16, I32, I64, U8) and otherwise in the natural wider one (BOOL ->
// u8; I8, I16, U16 -> i32; U32, U64 -> i64 (a U64 above 2^63 - 1 is refused); F8_* -> f32); load(...,
// as) converts to any dew dtype (floats round to nearest even through f32/f64; floats to integers are
// refused, integers to floats are exact when representable).
// Checkpoints (SafetensorsCheckpoint): a single file, a folder holding model.safetensors, or a sharded
// folder (model.safetensors.index.json {"metadata": {...}, "weight_map": {name: shard file}}); a name
// in two shards, a shard missing, or an index entry a shard does not hold is refused naming it.
// Writing is atomic per file (temporary + rename); a sharded write publishes the index last, so a
// reader never sees an index naming a shard that is not complete.
// Errors name the file and the tensor: truncated files, overlapping or out-of-range offsets, a shape
// that does not match its bytes, an unknown dtype.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

// Writes tensors (any backend; copied to the host) atomically (temporary file + rename).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads every tensor onto `backend`, in file order, each in the dtype load() gives it; errors name the
// file and what is wrong.
std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::string& path, const BackendPtr& backend,
                                                             std::map<std::string, std::string>* metadata = nullptr);

// One tensor of a safetensors header.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // the file's own name: "BF16", "F32", ...
  Shape shape;
  uint64_t begin = 0, end = 0;  // byte offsets relative to the end of the header
};

// The dew dtype a stored safetensors dtype loads as (see above); a UsageError for an unknown name.
DType safetensors_load_dtype(const std::string& st_dtype);
// Bytes per element of a safetensors dtype name.
size_t safetensors_dtype_size(const std::string& st_dtype);

// A memory-mapped, read-only safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsEntry>& entries() const { return entries_; }  // in header order
  const SafetensorsEntry* find(const std::string& name) const;               // nullptr when absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The stored bytes of a tensor (valid while this object lives).
  const unsigned char* data(const SafetensorsEntry& e) const;
  // The tensor on `backend`, in its load dtype or converted to `as`.
  Tensor load(const std::string& name, const BackendPtr& backend, std::optional<DType> as = std::nullopt) const;

 private:
  std::string path_;
  const unsigned char* map_ = nullptr;
  size_t size_ = 0;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// A possibly sharded checkpoint: a .safetensors file, a model.safetensors.index.json, or a folder with
// either (the index wins when both exist).
class SafetensorsCheckpoint {
 public:
  explicit SafetensorsCheckpoint(const std::string& path);
  std::vector<std::string> names() const;  // shard order, then header order
  bool contains(const std::string& name) const { return where_.count(name) != 0; }
  const SafetensorsEntry& entry(const std::string& name) const;  // throws naming the name when absent
  Tensor load(const std::string& name, const BackendPtr& backend, std::optional<DType> as = std::nullopt) const;
  std::vector<std::string> files() const;                                           // the shard paths
  const std::map<std::string, std::string>& metadata() const { return metadata_; }  // the first shard's

 private:
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::map<std::string, size_t> where_;  // name -> shard
  std::vector<std::string> order_;
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` into `dir` as <stem>.safetensors when they fit in one shard of max_shard_bytes (0:
// no limit), else as <stem>-00001-of-0000N.safetensors ... plus <stem>.safetensors.index.json
// (weight_map and metadata.total_size), written last. Tensors keep their order; a shard closes before
// the tensor that would overflow it (a tensor larger than the limit gets a shard of its own). When
// `dtype` is given, floating tensors are converted to it (integers are kept). Returns the files written.
std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                   uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata = {},
                                                   std::optional<DType> dtype = std::nullopt,
                                                   const std::string& stem = "model");

// Parses a size such as "5GB", "500MB", "2GiB", "123" (bytes); a UsageError naming `what` otherwise.
uint64_t parse_byte_size(const std::string& text, const std::string& what);

}  // namespace dew
