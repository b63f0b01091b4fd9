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
// The trainer talks to every run through this class: with a null communicator it is one process, and
// each method is the local equivalent (backward() is a plain backward, sum() the identity, no buffers),
// so the training loop has no data-parallel branches of its own.
#pragma once
#include <memory>
#include <unordered_map>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/comm.hpp"
#include "dew/objective.hpp"

namespace dew::dist {

class DataParallel {
 public:
  // `comm` null: one process (no buckets are allocated).
  DataParallel(std::shared_ptr<Communicator> comm, const NamedTensors& params, double bucket_mb);

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

  std::shared_ptr<Communicator> comm_;
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
