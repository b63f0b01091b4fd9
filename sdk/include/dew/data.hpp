// dew/data.hpp — records, data sources (plugins), and the loader the pipeline compiler builds.
//
// A DataSource is random access: size() and get(i) -> Record (host arrays by field name, e.g. "image"
// u8 [H, W, C], "label" i32 []). The loader turns a source into an endless, deterministic stream of
// batches:
//   stream index g = 0, 1, 2, ... ; epoch e = g / N; record = perm_e[g % N] (perm_e a Philox-seeded
//   Fisher-Yates shuffle of [0, N) keyed by (seed, e), or the identity when shuffle is off);
//   global batch k = stream [k*G, (k+1)*G) with G = world * batch_size; rank r takes
//   [k*G + r*B, k*G + (r+1)*B);
//   per-record transforms get (seed, g) as their randomness, never a thread id.
// The position is the next global stream index plus a description of the order (source identity,
// N, seed, shuffle); it is independent of the world size, so a run resumes with another rank count.
// Resuming with a different order description is refused.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew {

// A host-side array (what sources produce and batches collate).
struct HostArray {
  DType dtype = DType::f32;
  Shape shape;
  std::vector<unsigned char> bytes;

  static HostArray make(DType dtype, const Shape& shape);
  static HostArray scalar_i32(int32_t v);
  int64_t numel() const { return numel_of(shape); }
  template <class T>
  T* as() {
    return reinterpret_cast<T*>(bytes.data());
  }
  template <class T>
  const T* as() const {
    return reinterpret_cast<const T*>(bytes.data());
  }
};

using Record = std::map<std::string, HostArray>;

class DataSource {
 public:
  static constexpr const char* kind = "data_source";
  virtual ~DataSource() = default;
  virtual int64_t size() const = 0;
  virtual Record get(int64_t index) const = 0;  // thread-safe; index in [0, size())
  // Identifies the content (e.g. "idx:/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").
  virtual std::string identity() const = 0;
};

// Options a data source is created with: the [data] section plus "split" = train | val (set by the
// loader). Sources that have no validation split refuse "val" with a clear error.

// A per-record transform (flip, crop, normalise...): randomness only from (seed, position).
using RecordTransform = std::function<void(Record& record, uint64_t seed, uint64_t position)>;

// Per-record image transforms from their spellings (the [data] key `transforms`, a comma list such as
// "pad:4, random_crop:32, flip"): flip/hflip[:P], vflip[:P], pad:N[:zero|reflect|edge], random_crop:S,
// center_crop:S, resize:S, random_resized_crop:S[:MIN[:MAX]], S = "N" or "HxW" (core/data/transforms.cpp
// documents each). They edit the "image" field (u8 [H, W, C]) and keep it u8: normalisation is the
// objective's. Randomness is keyed by (seed, the record's global stream position, the transform's place
// in the list). *fixes_size (when given) is set when some transform outputs one size for every record.
// evaluation = true (validation splits) makes them deterministic: flips are skipped, random_crop becomes
// center_crop, random_resized_crop:S becomes resize:S, so evaluation sees the training shapes.
std::vector<RecordTransform> make_transforms(const std::vector<std::string>& specs, bool* fixes_size = nullptr,
                                             bool evaluation = false);

struct LoaderConfig {
  int64_t batch_size = 32;  // per rank
  int rank = 0, world = 1;
  uint64_t seed = 0;
  bool shuffle = true;
  int workers = 1;   // threads assembling batches ahead
  int prefetch = 2;  // batches ready ahead of the consumer
};

struct DataPosition {
  int64_t next = 0;   // the next global stream index
  std::string order;  // description of the order; must match on resume
};

// A host batch: every field collated along a new leading axis [B, ...].
using HostBatch = std::map<std::string, HostArray>;

class DataLoader {
 public:
  DataLoader(std::shared_ptr<DataSource> source, LoaderConfig config, std::vector<RecordTransform> transforms = {});
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  HostBatch next();                  // this rank's rows of the next global batch
  DataPosition position() const;     // after the batches returned so far
  void seek(const DataPosition& p);  // refuses a different order description
  int64_t epoch() const;             // epoch of the next record
  const DataSource& source() const;
  const LoaderConfig& config() const;

  // The record indices (into the source) this rank reads for global batch k: for tests and tools.
  std::vector<int64_t> indices_of_batch(int64_t k) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Builds the loader of a split from the [data] section: creates the source plugin named by `source`,
// reads batch_size, workers, shuffle (default: true for train, false for val), seed defaults to `seed`,
// and transforms (make_transforms; the source is told "mixed_sizes_ok" when they fix the image size).
// source = none (runs without data, e.g. imported models): a loader over one placeholder record that
// refuses to be read (identity "none"); refused for the train split.
std::unique_ptr<DataLoader> make_loader(Options& data_section, const std::string& split, uint64_t seed, int rank = 0,
                                        int world = 1);

// Moves a host batch onto a backend as tensors of the same dtypes and shapes.
std::map<std::string, Tensor> to_device(const HostBatch& batch, const BackendPtr& backend);

// One pass over the next `records` stream indices of a loader that reads its split in order (validation,
// evaluation): every record exactly once across the ranks. For each global batch, fn(batch, first, use)
// gets this rank's rows on `backend`, sliced to the `use` (> 0) rows that belong to the pass (rows past
// `records` are the next epoch's: dropped); `first` is the stream index of the batch's first row relative
// to the start of the pass (for randomness keyed by record). Batches in which this rank has no rows are
// read (every rank advances alike) but not handed over. max_batches > 0 stops after that many global
// batches. Returns the rows handed over.
int64_t for_each_pass_batch(DataLoader& loader, int64_t records, int64_t max_batches, const BackendPtr& backend,
                            const std::function<void(const std::map<std::string, Tensor>& batch, int64_t first,
                                                     int64_t use)>& fn);

}  // namespace dew
