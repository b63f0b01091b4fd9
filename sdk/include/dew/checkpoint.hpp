// dew/checkpoint.hpp — HDF5 checkpoints: write atomically, read back, load into a model, retention.
//
// The file layout (format version 1) is specified in docs/checkpoint-format.md and mirrored in
// core/checkpoint/format.h. In short: root attributes dew.format_version, dew.version, dew.created
// plus the caller's string attributes; groups params/, ema/, optim/<slot>/, state/; one dataset per
// tensor named by its parameter name and stored in its dtype (bf16/f16 as uint16), each with a string
// attribute `dtype`.
//
// Invariants:
//  * write_checkpoint never leaves a partial file under the real name: it writes `<path>.tmp-<pid>`,
//    flushes and closes it, fsyncs it, renames it over `path`, then fsyncs the directory. A crash can
//    only leave a `*.tmp-<pid>` file behind; the trainer calls remove_stale_temporaries() on start.
//  * Tensor order is kept: read_checkpoint returns params/ema/optim tensors in the order they were
//    written (the groups track link creation order).
//  * Every read error is a dew::Error naming the file (missing, not HDF5, corrupt or truncated, newer
//    format, unknown dtype); load_into lists every name, shape and dtype mismatch in one error.
//  * Integrity: every dataset has @crc32 and the file starts with a checksum block (an
//    HDF5 user block) with the CRC-32 of the rest of the file and of every tensor. read_checkpoint checks
//    the bytes before libhdf5 parses them and refuses a damaged file naming the damaged tensor, so no
//    damaged dew-written file reaches HDF5's parser. Files from before checksums load unverified.
//  * Non-finite values in params/, ema/ or optim/ are refused unless CheckpointReadOptions says otherwise.
#pragma once
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

// The layout version this dew writes and the newest one it reads.
inline constexpr int64_t kCheckpointFormatVersion = 1;

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct CheckpointData {
  // Root string attributes beyond the fixed ones (e.g. "dew.config" -> effective config text,
  // "dew.plugins" -> "cpu 0.1.0; lm 0.1.0"). Names must not be the reserved dew.format_version,
  // dew.version or dew.created.
  std::map<std::string, std::string> attributes;
  NamedTensors params;                            // params/<name>
  NamedTensors ema;                               // ema/<name>
  std::map<std::string, NamedTensors> optim;      // optim/<slot>/<name>, e.g. slot "m", "v"
  std::map<std::string, int64_t> counters;        // state/ int64 attributes: step, updates, attempts...
  std::map<std::string, double> state_values;     // state/ f64 attributes: best metric, loss scale...
  std::map<std::string, std::string> state_text;  // state/ string attributes: data position, RNG...
  NamedTensors state_tensors;                     // state/<name> datasets: binary state (u8 blobs, ...)
  // Optional, for writers that do not hold every tensor (a sharded run): write_checkpoint calls it for
  // each tensor, in the order of for_each_checkpoint_tensor, just before writing it, with its
  // "group/name" and the tensor listed above, and writes what it returns (same shape and dtype) instead;
  // the listed tensor may then be a shape-only placeholder (checkpoint_placeholder). One tensor at a
  // time: the writer never holds more than the one it writes.
  std::function<Tensor(const std::string& where, const Tensor& listed)> fetch;

  // Filled by read_checkpoint (ignored by write_checkpoint, which writes its own).
  int64_t format_version = 0;
  bool checksummed = false;  // the file carried checksums (all verified); false for older files
  std::string dew_version;
  std::string created;  // UTC, ISO 8601
};

// Calls f("group/name", tensor) for every tensor of `data` in the order write_checkpoint writes them:
// params, ema, optim/<slot> (slots in name order), state tensors. A sharded run's other ranks walk the
// same sequence to answer the writer's fetch.
void for_each_checkpoint_tensor(const CheckpointData& data,
                                const std::function<void(const std::string& where, const Tensor& t)>& f);

// A tensor with a shape and a dtype but no storage: a CheckpointData entry that `fetch` provides.
Tensor checkpoint_placeholder(const Shape& shape, DType dtype);

// Writes `data` to `path` atomically (see the invariants above). Tensors may live on any backend; they
// are copied to the host. Refuses empty names, names containing '/', "." and "..", and duplicates.
void write_checkpoint(const std::string& path, const CheckpointData& data);

struct CheckpointReadOptions {
  // Load params/ema/optim tensors holding NaN or infinity (refused by default: a run that diverged).
  bool allow_nonfinite = false;
};

// Reads a whole checkpoint; tensors are created on `backend`. Verifies checksums (see above).
CheckpointData read_checkpoint(const std::string& path, const BackendPtr& backend,
                               const CheckpointReadOptions& options = {});

// Checks a checkpoint as read_checkpoint would, creating no tensors: "" when it is intact, else why not.
std::string verify_checkpoint(const std::string& path, const CheckpointReadOptions& options = {});

// The highest-step "step-*.h5" in `dir` below `below_step` that verify_checkpoint finds intact, or "".
std::string find_intact_checkpoint(const std::string& dir, int64_t below_step,
                                   const CheckpointReadOptions& options = {});

// Copies `checkpoint` tensors into `targets` (existing tensors, e.g. Module::named_parameters(), on any
// backend) by name. Nothing is copied unless everything matches; otherwise one dew::Error lists the
// mismatches ("params/model.w: checkpoint has [3, 4], model expects [4, 4]", missing names, extra
// names, dtype mismatches): the first few and the total count. `group` prefixes the names in messages
// ("params", "ema", "optim/m").
void load_into(const NamedTensors& checkpoint, const std::string& group, const NamedTensors& targets);

// ---- files in a checkpoint directory ----

// "step-00000040.h5" (8 digits, more when the step needs them).
std::string checkpoint_name(int64_t step);
// The step of a "step-XXXXXXXX.h5" file name (a bare name or a path), or -1 if it is not one.
int64_t checkpoint_step(const std::string& name);
// Full path of the highest-step "step-*.h5" file in `dir`, or "" when there is none (or no dir).
std::string find_latest_checkpoint(const std::string& dir);
// Deletes "step-*.h5" files in `dir` except the `keep_latest` highest steps and `best_file` (a file
// name or path; "" for none). Returns the deleted paths, oldest first. Other files are left alone.
std::vector<std::string> prune_checkpoints(const std::string& dir, int keep_latest, const std::string& best_file = "");
// Deletes the "*.tmp-<pid>" files a crashed write_checkpoint left in `dir` (those of this process
// excepted). Call it before writing into a run directory. Returns the deleted paths.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

}  // namespace dew
