// core/dist/data_parallel.hpp — gradient synchronisation of a data-parallel run (docs/distributed.md).
//
// The trainer's parameters are grouped, in reverse order (roughly the order backward produces their
// gradients), into buckets of about `bucket_mb` MiB of one dtype. Each bucket owns a flat buffer:
// [gradients of its members..., one "had a gradient" flag per member]. During the backward pass of
// the last micro-batch of an update, the autograd leaf-ready hook copies each finished gradient into
// its bucket; a bucket whose members are all in is all-reduced at once (non-blocking), so
// communication overlaps the rest of the backward pass. Buckets are launched strictly in index order,
// so every rank issues the same sequence of collectives. finish_sync() launches whatever the backward
// pass did not reach, waits for every bucket, divides by the world size and makes each parameter's
// .grad a view of the averaged gradient in its bucket (a parameter no rank had a gradient for keeps
// none, as in a single process). Those views stay valid until the next sync; accumulating into them
// (gradient accumulation) is fine, since the next sync copies them back in place.
//
// Sharding ([run] shard; docs/distributed.md, "Sharded data parallel"): each parameter has one owner rank,
// whole parameters in contiguous runs of the parameter order, balanced by bytes (rank 0 the first ones).
// A rank's optimizer (and EMA) covers only the parameters it owns; every collective of the shard modes
// is by whole parameter, which is what lets every optimizer (Muon's Newton-Schulz on a whole matrix,
// LAMB's per-tensor trust ratio) run unchanged on its share. Buckets never mix owners.
//   none        every rank holds everything; gradients all-reduced (the classic data parallel above).
//   optimizer   ZeRO-1: gradients all-reduced, each rank updates the parameters it owns, and every
//               parameter is then broadcast from its owner (distribute_parameters).
//   gradients   ZeRO-2: each bucket is reduce-scattered to its owner (a piece of its whole size there,
//               empty elsewhere); the other ranks drop their copy of those gradients as soon as they are
//               staged, and keep no .grad for parameters they do not own.
//   parameters  ZeRO-3: as gradients, and between updates a rank keeps only the storage of the
//               parameters it owns (release_parameters: the others keep their shape, not their bytes);
//               gather_parameters re-creates and broadcasts them before the forward pass.
// With one rank every mode reduces to none; with a null communicator the mode is ignored.
//
// The trainer talks to every run through this class: with a null communicator it is one process, and
// each method is the local equivalent (backward() is a plain backward, sum() the identity, no buffers),
// so the training loop has no data-parallel branches of its own.
#pragma once
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/comm.hpp"
#include "dew/objective.hpp"

namespace dew::dist {

enum class ShardMode { none, optimizer, gradients, parameters };
ShardMode shard_mode_from_name(const std::string& name);  // UsageError listing the modes
const char* shard_mode_name(ShardMode mode);

class DataParallel {
 public:
  // `comm` null: one process (no buckets are allocated).
  DataParallel(std::shared_ptr<Communicator> comm, const NamedTensors& params, double bucket_mb,
               ShardMode shard = ShardMode::none);

  ShardMode shard() const { return shard_; }
  // True when optimizer state and EMA are per-rank shards (shard != none in a distributed run).
  bool sharded() const { return comm_ != nullptr && shard_ != ShardMode::none; }
  // True when a rank keeps gradients only for the parameters it owns (gradients, parameters).
  bool shards_gradients() const { return sharded() && shard_ >= ShardMode::gradients; }
  // The owner rank of parameter k (0 when not sharded); owns(k): this rank is it.
  int owner(size_t k) const { return owner_.empty() ? 0 : owner_[k]; }
  bool owns(size_t k) const { return !sharded() || owner(k) == rank(); }
  // The owner of a tensor that is one of the parameters (by identity), or -1 when it is none of them.
  int owner_of(const Tensor& t) const;
  // The parameters this rank owns (all of them when not sharded), in parameter order.
  NamedTensors owned(const NamedTensors& tensors) const;
  // optimizer / gradients: every parameter takes its owner's values (after the owners' update).
  void distribute_parameters();
  // parameters: re-creates the storage of the parameters this rank does not own and fills it from their
  // owners (before a forward pass, validation); release_parameters drops it again. No-ops otherwise.
  void gather_parameters();
  void release_parameters();
  bool parameters_released() const { return released_; }

  bool distributed() const { return comm_ != nullptr; }
  Communicator& comm() { return *comm_; }
  int rank() const { return comm_ ? comm_->rank() : 0; }
  int world() const { return comm_ ? comm_->size() : 1; }
  size_t num_buckets() const { return buckets_.size(); }
  // Parameter indices of each bucket (for tests and the log).
  std::vector<std::vector<size_t>> bucket_members() const;

  // Overwrites `tensors` on every rank with rank 0's values (start of a run: weights, EMA, optimizer state).
  void broadcast(const NamedTensors& tensors);
  // Start of a run: every group of tensors takes rank 0's values, and every rank must be at rank 0's
  // `counters` (update, attempt, data position): one line naming both otherwise. No-op in one process.
  void start_from_rank0(const std::vector<NamedTensors>& groups, const std::vector<int64_t>& counters);

  // The backward pass of one micro-batch's (already scaled) loss; the last micro-batch of an update
  // all-reduces in buckets overlapped with it, and finish_sync() completes it.
  void backward(const Tensor& loss, bool last_micro);

  // Before the backward pass of an update's last micro-batch: the hook to hand to run_backward.
  LeafReadyHook begin_sync();
  // After that backward pass: completes the all-reduce and leaves averaged gradients in .grad.
  void finish_sync();

  // Sums `values` over the ranks (in place): the logged loss, sample counts and metrics.
  void sum(std::vector<double>& values);
  void barrier();

  // Milliseconds this rank spent on synchronisation since the last call: copies into buckets, MPI calls,
  // waiting for buckets and averaging (the communication not hidden behind compute).
  double take_sync_ms();

 private:
  struct Bucket {
    int owner = 0;  // sharded gradients: the rank the bucket is reduced onto
    Tensor shard;   // sharded gradients, on the owner: the reduced bucket (.grad views point into it)
    std::vector<size_t> members;
    std::vector<int64_t> offsets;  // element offset of each member in flat
    int64_t numel = 0;             // gradient elements (the flags follow)
    Tensor flat;
    size_t pending = 0;
    std::shared_ptr<CommRequest> request;
    bool complete = false;
  };
  void on_leaf_ready(const Tensor& leaf);
  void stage(size_t param);
  void launch_ready();
  void progress();

  void ensure_flat(Bucket& b);
  std::shared_ptr<Communicator> comm_;
  ShardMode shard_ = ShardMode::none;
  std::vector<int> owner_;  // per parameter (sharded runs only)
  bool released_ = false;
  NamedTensors params_;
  std::unordered_map<const TensorImpl*, size_t> index_;
  std::vector<size_t> bucket_of_;
  std::vector<size_t> slot_of_;  // position of the parameter in its bucket
  std::vector<bool> staged_;
  std::vector<Bucket> buckets_;
  size_t next_launch_ = 0;
  double sync_ms_ = 0.0;
};

}  // namespace dew::dist
