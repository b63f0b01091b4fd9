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
//   optimizer   ZeRO-1: each bucket is reduce-scattered to its owner (a piece of its whole size there,
//               empty elsewhere; the gradients of its parameters stay whole on every rank until the
//               update's sync), each rank updates the parameters it owns, and every parameter is then
//               broadcast from its owner (distribute_parameters): the traffic of one all-reduce, as none.
//               The sum is the same as the all-reduce's to the bit at 2 ranks (a + b commutes); at more
//               ranks both follow the library's summation order, which may differ between MPI's
//               all-reduce and reduce-scatter (and between bucket layouts, which already differ from
//               none's since buckets never mix owners): deterministic, not promised bit-equal to none.
//   gradients   ZeRO-2: reduced as optimizer; the other ranks drop their copy of a bucket's gradients as
//               soon as they are staged, and keep no .grad for parameters they do not own.
//   parameters  ZeRO-3: as gradients, and between updates a rank keeps only the storage of the
//               parameters it owns (release_parameters: the others keep their shape, not their bytes);
//               a block's are broadcast from their owners just before its forward (run_block,
//               dew/block_params.hpp), dropped after it, broadcast again before its backward and
//               dropped once their gradients are complete; the others (embeddings, final norm, head)
//               are gathered at the start of an update (gather_parameters) and dropped likewise.
//               Prefetch ([run] shard_prefetch, default on; FSDP's forward/backward prefetch): a pass is
//               one micro-batch, from gather_parameters(false) to release_parameters(). Each pass records
//               its sequence of block acquires (forward order, then backward order); the next pass
//               follows the previous one's: when block i is acquired, the gather of the block acquired
//               after it is launched (non-blocking) and waited for only at that block's acquire, so it
//               runs while block i computes; the pass's start launches its first block's. At most the
//               current block plus one prefetched block are gathered at a time (like limit_all_gathers:
//               a prefetch waits until every other block is freed, else its acquire gathers it on the
//               spot); a block acquired again right after (the last block, forward then backward) is
//               kept rather than freed and gathered again. An acquire that differs from the recorded
//               sequence (the contract forbids it) completes the gather in flight, gathers what it needs
//               on the spot and ends prefetching for that pass; the next pass follows the new sequence.
//               Every decision reads only state every rank shares, so every rank issues the same
//               collectives in the same order.
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
#include "dew/block_params.hpp"
#include "dew/comm.hpp"
#include "dew/objective.hpp"

namespace dew::dist {

enum class ShardMode { none, optimizer, gradients, parameters };
ShardMode shard_mode_from_name(const std::string& name);  // UsageError listing the modes
const char* shard_mode_name(ShardMode mode);

class DataParallel final : public BlockParameterHooks {
 public:
  // `comm` null: one process (no buckets are allocated).
  DataParallel(std::shared_ptr<Communicator> comm, const NamedTensors& params, double bucket_mb,
               ShardMode shard = ShardMode::none, bool prefetch = true);

  ShardMode shard() const { return shard_; }
  // True when optimizer state and EMA are per-rank shards (shard != none in a distributed run).
  bool sharded() const { return comm_ != nullptr && shard_ != ShardMode::none; }
  // True when a rank drops the gradients of parameters it does not own as soon as they are staged
  // (gradients, parameters).
  bool shards_gradients() const { return sharded() && shard_ >= ShardMode::gradients; }
  // True when each bucket is reduced onto its owner only (every shard mode): after finish_sync a rank
  // holds .grad only for the parameters it owns.
  bool reduces_onto_owners() const { return sharded(); }
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
  // `whole` false (an update's start): only the parameters outside blocks; a block's come with its
  // forward (block_hooks). The first update learns which those are, so it gathers everything.
  void gather_parameters(bool whole = true);
  void release_parameters();
  // True under shard = parameters in a distributed run: parameters may be released between passes.
  bool shards_parameters() const { return sharded() && shard_ == ShardMode::parameters; }
  // shard = parameters: the hooks to install around an update's passes (dew/block_params.hpp), else null.
  BlockParameterHooks* block_hooks();
  // BlockParameterHooks: a block's parameters broadcast from their owners / dropped after its forward.
  void acquire(const std::vector<Tensor>& params) override;
  void release(const std::vector<Tensor>& params) override;
  // shard = parameters: block acquires since construction, by how their parameters came (the same on every
  // rank; collectives per acquire, not bytes). prefetched: a gather launched before the acquire supplied
  // them; resident: nothing to gather (already whole); blocking: gathered on the spot; schedule_misses:
  // acquires that differed from the recorded sequence (each ends prefetching for its pass).
  struct GatherStats {
    int64_t prefetched = 0, resident = 0, blocking = 0, schedule_misses = 0;
  };
  const GatherStats& gather_stats() const { return stats_; }
  bool prefetches() const { return shards_parameters() && prefetch_; }

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
    int owner = 0;  // sharded runs: the rank the bucket is reduced onto
    Tensor shard;   // sharded runs, on the owner: the reduced bucket (.grad views point into it)
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
  void drop_storage(size_t k);  // shard = parameters: parameter k (not owned here) keeps its shape only
  // shard = parameters, called on every rank alike: parameter k is not needed until gathered again.
  void evict(size_t k);
  void fetch_parameters(const std::vector<size_t>& ks);
  // Prefetch (see the top of the file).
  std::vector<size_t> block_indices(const std::vector<Tensor>& params);  // trained parameters, marked managed
  void begin_pass();
  void end_pass();
  void launch_prefetch(size_t position);  // the block at `position` of schedule_, unless over the limit
  void launch_deferred();                 // a prefetch that waited for the limit, once it allows it
  std::vector<size_t> settle_prefetch();  // waits for the gather in flight; its parameters (now resident)
  bool needed_next(size_t k) const;       // k belongs to the block the schedule acquires next
  std::shared_ptr<Communicator> comm_;
  ShardMode shard_ = ShardMode::none;
  std::vector<int> owner_;  // per parameter (sharded runs only)
  std::vector<char> dropped_;  // per parameter: its storage is released here (local)
  // Per parameter, the same on every rank (changed only at points every rank passes): resident_ = it
  // was gathered since it was last released; block_managed_ = a block's forward acquires it.
  std::vector<char> resident_, block_managed_;
  bool prefetch_ = true;
  bool in_pass_ = false, on_schedule_ = false;
  std::vector<std::vector<size_t>> schedule_;  // the previous pass's block acquires (parameter indices)
  std::vector<std::vector<size_t>> seen_;      // this pass's so far
  std::vector<size_t> current_;                // the block acquired last (until its release)
  std::vector<size_t> kept_;                   // released but kept whole: the next acquire's (needed_next)
  // The one prefetch in flight: schedule_[inflight_at_]'s parameters that were not resident.
  std::vector<size_t> inflight_;
  std::vector<std::shared_ptr<CommRequest>> inflight_requests_;
  std::vector<char> inflight_flag_;  // per parameter
  size_t inflight_at_ = 0;
  bool deferred_ = false;  // schedule_[deferred_at_] is to be prefetched once the limit allows it
  size_t deferred_at_ = 0;
  GatherStats stats_;
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
