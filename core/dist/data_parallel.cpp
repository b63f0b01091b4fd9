// core/dist/data_parallel.cpp — bucketed, overlapped gradient all-reduce (see data_parallel.hpp).
#include "dist/data_parallel.hpp"

#include <algorithm>
#include <chrono>
#include <utility>

#include "dew/backend.hpp"
#include "dew/error.hpp"

namespace dew::dist {

namespace {
using Clock = std::chrono::steady_clock;

// Frees or re-creates a storage's memory in place (as FSDP resizes a storage to 0): every tensor that
// shares it (the parameter, views of it saved by autograd nodes) sees the change, so dropping a
// parameter really returns its bytes, and re-gathering it is what the saved views read in the backward.
// Storage's invariant is kept: `data` is an allocation of max(bytes, 1) bytes.
void resize_storage(Storage& s, size_t bytes) {
  void* fresh = s.backend->allocate(bytes == 0 ? 1 : bytes);
  s.backend->deallocate(s.data, s.bytes == 0 ? 1 : s.bytes);
  s.data = fresh;
  s.bytes = bytes;
}
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }
}  // namespace

ShardMode shard_mode_from_name(const std::string& name) {
  if (name == "none") return ShardMode::none;
  if (name == "optimizer") return ShardMode::optimizer;
  if (name == "gradients") return ShardMode::gradients;
  if (name == "parameters") return ShardMode::parameters;
  throw Error(ErrorKind::usage,
              "option 'run.shard' = '" + name + "' is not one of none, optimizer, gradients, parameters", __FILE__,
              __LINE__);
}

const char* shard_mode_name(ShardMode mode) {
  switch (mode) {
    case ShardMode::none:
      return "none";
    case ShardMode::optimizer:
      return "optimizer";
    case ShardMode::gradients:
      return "gradients";
    case ShardMode::parameters:
      return "parameters";
  }
  return "?";
}

DataParallel::DataParallel(std::shared_ptr<Communicator> comm, const NamedTensors& params, double bucket_mb,
                           ShardMode shard, bool prefetch)
    : comm_(std::move(comm)), shard_(shard), params_(params) {
  prefetch_ = prefetch;
  if (!comm_) return;  // one process
  DEW_USAGE_CHECK(bucket_mb > 0, "option 'run.bucket_mb' must be positive, got ", bucket_mb);
  for (size_t k = 0; k < params_.size(); ++k) index_[params_[k].second.impl()] = k;
  dropped_.assign(params_.size(), 0);
  resident_.assign(params_.size(), 1);
  block_managed_.assign(params_.size(), 0);
  inflight_flag_.assign(params_.size(), 0);
  if (sharded()) {
    // Contiguous runs of whole parameters, balanced by bytes: a parameter goes to the rank whose
    // 1/world of the total holds its midpoint.
    double total = 0, before = 0;
    for (const auto& [n, p] : params_) total += double(p.nbytes());
    const int world = comm_->size();
    owner_.resize(params_.size());
    for (size_t k = 0; k < params_.size(); ++k) {
      const double mid = before + 0.5 * double(params_[k].second.nbytes());
      owner_[k] = total > 0 ? std::min(world - 1, int(mid * world / total)) : 0;
      before += double(params_[k].second.nbytes());
    }
  }
  const double cap = bucket_mb * 1024.0 * 1024.0;
  bucket_of_.resize(params_.size());
  slot_of_.resize(params_.size());
  staged_.assign(params_.size(), false);
  double bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k].second;
    DEW_CHECK(p.dtype() == DType::f32 || p.dtype() == DType::f64, "data-parallel training: parameter '",
              params_[k].first, "' is ", dtype_name(p.dtype()), "; gradients are all-reduced in f32 or f64");
    const bool fresh = buckets_.empty() || params_[buckets_.back().members.front()].second.dtype() != p.dtype() ||
                       buckets_.back().owner != owner(k) || (bytes > 0 && bytes + double(p.nbytes()) > cap);
    if (fresh) {
      buckets_.emplace_back();
      buckets_.back().owner = owner(k);
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    bucket_of_[k] = buckets_.size() - 1;
    slot_of_[k] = b.members.size();
    b.members.push_back(k);
    b.offsets.push_back(b.numel);
    b.numel += p.numel();
    bytes += double(p.nbytes());
  }
  // Sharded runs allocate a bucket's buffer when its first gradient arrives and free it once reduced.
  if (!reduces_onto_owners())
    for (Bucket& b : buckets_) ensure_flat(b);
}

void DataParallel::ensure_flat(Bucket& b) {
  if (b.flat.defined()) return;
  const Tensor& first = params_[b.members.front()].second;
  b.flat = Tensor::zeros({b.numel + int64_t(b.members.size())}, first.dtype(), first.backend_ptr());
}

int DataParallel::owner_of(const Tensor& t) const {
  auto it = index_.find(t.impl());
  return it == index_.end() ? -1 : owner(it->second);
}

NamedTensors DataParallel::owned(const NamedTensors& tensors) const {
  if (!sharded()) return tensors;
  NamedTensors out;
  for (const auto& [name, t] : tensors) {
    const int o = owner_of(t);
    if (o < 0 || o == rank()) out.emplace_back(name, t);  // not a parameter: every rank keeps its own
  }
  return out;
}

void DataParallel::distribute_parameters() {
  if (!sharded() || shard_ == ShardMode::parameters) return;
  const auto t0 = Clock::now();
  params_.front().second.backend().synchronize();
  std::vector<std::shared_ptr<CommRequest>> pending;
  for (size_t k = 0; k < params_.size(); ++k) pending.push_back(comm_->broadcast_async(params_[k].second, owner(k)));
  for (auto& r : pending) r->wait();
  sync_ms_ += ms_since(t0);
}

// Broadcasts parameters `ks` from their owners (re-creating the storage of those dropped here); every
// rank passes the same list, decided from the state every rank shares (resident_), never from dropped_.
void DataParallel::fetch_parameters(const std::vector<size_t>& ks) {
  if (ks.empty()) return;
  const auto t0 = Clock::now();
  for (size_t k : ks) {
    if (!dropped_[k]) continue;
    resize_storage(*params_[k].second.impl()->storage, params_[k].second.nbytes());
    dropped_[k] = 0;
  }
  std::vector<std::shared_ptr<CommRequest>> pending;
  for (size_t k : ks) pending.push_back(comm_->broadcast_async(params_[k].second, owner(k)));
  for (auto& r : pending) r->wait();
  for (size_t k : ks) resident_[k] = 1;
  sync_ms_ += ms_since(t0);
}

void DataParallel::gather_parameters(bool whole) {
  if (!shards_parameters()) return;
  settle_prefetch();
  std::vector<size_t> ks;
  for (size_t k = 0; k < params_.size(); ++k)
    if (!resident_[k] && (whole || !block_managed_[k])) ks.push_back(k);
  fetch_parameters(ks);
  if (!whole) begin_pass();
}

std::vector<size_t> DataParallel::block_indices(const std::vector<Tensor>& params) {
  std::vector<size_t> ks;
  for (const Tensor& t : params) {
    auto it = index_.find(t.impl());
    if (it == index_.end()) continue;  // not a trained parameter: every rank holds it
    block_managed_[it->second] = 1;
    ks.push_back(it->second);
  }
  return ks;
}

void DataParallel::acquire(const std::vector<Tensor>& params) {
  const std::vector<size_t> ks = block_indices(params);
  if (ks.empty()) return;
  const auto in = [&ks](size_t k) { return std::find(ks.begin(), ks.end(), k) != ks.end(); };
  bool prefetched = false;
  if (in_pass_) {
    const size_t at = seen_.size();
    seen_.push_back(ks);
    if (on_schedule_ && (at >= schedule_.size() || schedule_[at] != ks)) {
      on_schedule_ = false;  // the sequence changed: no more prefetching in this pass
      ++stats_.schedule_misses;
    }
    prefetched = on_schedule_ && !inflight_.empty() && inflight_at_ == at;
    deferred_ = false;  // a prefetch still waiting for the limit is this block's: gathered below instead
    // What was gathered ahead for a block other than this one (only after a change of sequence) goes again.
    for (size_t k : settle_prefetch())
      if (!in(k)) evict(k);
    for (size_t k : kept_)
      if (!in(k)) evict(k);
    kept_.clear();
  }
  std::vector<size_t> missing;
  for (size_t k : ks)
    if (!resident_[k]) missing.push_back(k);
  if (!missing.empty()) {
    fetch_parameters(missing);
    ++stats_.blocking;
  } else {
    ++(prefetched ? stats_.prefetched : stats_.resident);
  }
  if (!in_pass_) return;
  current_ = ks;
  if (on_schedule_) launch_prefetch(seen_.size());
}

void DataParallel::release(const std::vector<Tensor>& params) {
  for (size_t k : block_indices(params)) {
    if (needed_next(k)) {
      kept_.push_back(k);  // the next acquire is this block's again (forward then backward of the last)
      continue;
    }
    evict(k);
  }
  current_.clear();
  launch_deferred();
}

bool DataParallel::needed_next(size_t k) const {
  if (!in_pass_ || !on_schedule_ || seen_.size() >= schedule_.size()) return false;
  const std::vector<size_t>& next = schedule_[seen_.size()];
  return std::find(next.begin(), next.end(), k) != next.end();
}

void DataParallel::begin_pass() {
  settle_prefetch();
  in_pass_ = true;
  seen_.clear();
  current_.clear();
  kept_.clear();
  deferred_ = false;
  on_schedule_ = prefetch_ && !schedule_.empty();
  if (on_schedule_) launch_prefetch(0);
}

void DataParallel::end_pass() {
  settle_prefetch();
  deferred_ = false;
  current_.clear();
  kept_.clear();
  if (in_pass_) schedule_ = std::move(seen_);  // what the next pass follows
  seen_.clear();
  in_pass_ = false;
  on_schedule_ = false;
}

void DataParallel::launch_prefetch(size_t position) {
  deferred_ = false;
  if (position >= schedule_.size() || !inflight_.empty()) return;
  const std::vector<size_t>& want = schedule_[position];
  const auto in = [](const std::vector<size_t>& v, size_t k) { return std::find(v.begin(), v.end(), k) != v.end(); };
  std::vector<size_t> need;
  for (size_t k : want)
    if (!resident_[k]) need.push_back(k);
  if (need.empty()) return;
  // The limit: besides the current block (and the wanted one's own), no block's parameters may be whole.
  for (size_t k = 0; k < params_.size(); ++k)
    if (resident_[k] && block_managed_[k] && !in(current_, k) && !in(want, k)) {
      deferred_ = true;
      deferred_at_ = position;
      return;
    }
  const auto t0 = Clock::now();
  for (size_t k : need) {
    if (dropped_[k]) {
      resize_storage(*params_[k].second.impl()->storage, params_[k].second.nbytes());
      dropped_[k] = 0;
    }
    inflight_flag_[k] = 1;
    inflight_requests_.push_back(comm_->broadcast_async(params_[k].second, owner(k)));
  }
  inflight_ = std::move(need);
  inflight_at_ = position;
  sync_ms_ += ms_since(t0);
}

void DataParallel::launch_deferred() {
  for (auto& r : inflight_requests_) r->test();  // lets the gather in flight advance (MPI: inside its calls)
  if (deferred_) launch_prefetch(deferred_at_);
}

std::vector<size_t> DataParallel::settle_prefetch() {
  if (inflight_.empty()) return {};
  const auto t0 = Clock::now();
  for (auto& r : inflight_requests_) r->wait();
  inflight_requests_.clear();
  for (size_t k : inflight_) {
    resident_[k] = 1;
    inflight_flag_[k] = 0;
  }
  sync_ms_ += ms_since(t0);
  return std::exchange(inflight_, {});
}

void DataParallel::evict(size_t k) {
  if (inflight_flag_[k]) return;  // a prefetch is writing into it (a parameter shared between blocks)
  resident_[k] = 0;
  drop_storage(k);
}

BlockParameterHooks* DataParallel::block_hooks() {
  return shards_parameters() ? this : nullptr;
}

void DataParallel::drop_storage(size_t k) {
  if (dropped_[k] || owns(k)) return;
  Tensor& p = params_[k].second;
  p.backend().synchronize();  // no kernel still reads it
  TensorImpl& impl = *p.impl();
  DEW_CHECK(impl.offset == 0 && impl.storage->bytes == p.nbytes(), "run.shard = parameters: parameter '",
            params_[k].first, "' is a view into a larger buffer; its storage cannot be released");
  resize_storage(*impl.storage, 0);
  dropped_[k] = 1;
}

void DataParallel::release_parameters() {
  if (!shards_parameters()) return;
  end_pass();
  for (size_t k = 0; k < params_.size(); ++k) evict(k);
}

std::vector<std::vector<size_t>> DataParallel::bucket_members() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : buckets_) out.push_back(b.members);
  return out;
}

void DataParallel::broadcast(const NamedTensors& tensors) {
  for (const auto& [name, t] : tensors) {
    Tensor handle = t;
    comm_->broadcast(handle, 0);
  }
}

void DataParallel::start_from_rank0(const std::vector<NamedTensors>& groups, const std::vector<int64_t>& counters) {
  if (!comm_) return;
  for (const NamedTensors& g : groups) broadcast(g);
  Tensor at = Tensor::from_host(counters.data(), {int64_t(counters.size())}, DType::i64, params_.front().second.backend_ptr());
  comm_->broadcast(at, 0);
  std::vector<int64_t> root(counters.size());
  at.copy_to_host(root.data());
  DEW_CHECK(root == counters, "rank ", rank(), " starts at update ", counters[0], " (data position ", counters.back(),
            ") but rank 0 at update ", root[0], " (data position ", root.back(),
            "): every rank must see the same run directory (a shared filesystem)");
}

void DataParallel::backward(const Tensor& loss, bool last_micro) {
  const Tensor seed = Tensor::full(loss.shape(), 1.0, loss.dtype(), loss.backend_ptr());
  if (comm_ && !last_micro && block_hooks()) {  // shard = parameters: free each one once its gradient is in
    run_backward(loss, seed, [this](const Tensor& leaf) {
      if (auto it = index_.find(leaf.impl()); it != index_.end()) evict(it->second);
      launch_deferred();
    });
    return;
  }
  if (!comm_ || !last_micro) {
    loss.backward();
    return;
  }
  run_backward(loss, seed, begin_sync());
}

void DataParallel::barrier() {
  if (comm_) comm_->barrier();
}

LeafReadyHook DataParallel::begin_sync() {
  for (Bucket& b : buckets_) {
    b.pending = b.members.size();
    b.request.reset();
    b.complete = false;
  }
  staged_.assign(params_.size(), false);
  next_launch_ = 0;
  return [this](const Tensor& leaf) { on_leaf_ready(leaf); };
}


void DataParallel::on_leaf_ready(const Tensor& leaf) {
  const auto t0 = Clock::now();
  auto it = index_.find(leaf.impl());
  if (it != index_.end() && !staged_[it->second]) {
    stage(it->second);
    launch_ready();
  }
  progress();
  sync_ms_ += ms_since(t0);
  if (shard_ == ShardMode::parameters) launch_deferred();  // counts its own time
}

// Copies a parameter's gradient (or zeros) and its flag into the bucket.
void DataParallel::stage(size_t k) {
  NoGradGuard no_grad;
  staged_[k] = true;
  Bucket& b = buckets_[bucket_of_[k]];
  ensure_flat(b);
  const size_t slot = slot_of_[k];
  const Tensor& p = params_[k].second;
  Tensor view = b.flat.slice0(b.offsets[slot], b.offsets[slot] + p.numel());
  Tensor flag = b.flat.slice0(b.numel + int64_t(slot), b.numel + int64_t(slot) + 1);
  Tensor g = p.grad();
  if (g.defined()) {
    // The previous sync left .grad as a view of this very buffer: then it is already in place.
    if (g.data() != view.data()) view.copy_(g.reshape({p.numel()}));
    b.flat.backend().fill(flag, 1.0);
  } else {
    b.flat.backend().fill(view, 0.0);
    b.flat.backend().fill(flag, 0.0);
  }
  // Sharded gradients: the bucket holds the copy now; the owner gets the reduced one back in finish_sync.
  // Under shard = parameters a parameter whose gradient is complete is not read again in this backward
  // pass (every node that uses it has an edge to it and has run): its storage goes now, not at the end.
  if (shards_gradients()) Tensor(p).zero_grad();
  // shard = optimizer (ZeRO-1) keeps every gradient through the backward pass: as a view of its bucket
  // from here on, so the fresh copy autograd accumulated goes now (the owner's reduced bucket replaces it).
  else if (reduces_onto_owners() && g.defined() && g.data() != view.data()) Tensor(p).set_grad(view.reshape(p.shape()));
  if (shard_ == ShardMode::parameters) evict(k);
  --b.pending;
}

// Launches ready buckets in index order (every rank issues the same sequence of collectives).
void DataParallel::launch_ready() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
    Bucket& b = buckets_[next_launch_++];
    b.flat.backend().synchronize();
    if (reduces_onto_owners()) {
      std::vector<int64_t> counts(size_t(comm_->size()), 0);
      counts[size_t(b.owner)] = b.flat.numel();
      if (b.owner == rank()) {
        if (!b.shard.defined()) b.shard = Tensor::empty(b.flat.shape(), b.flat.dtype(), b.flat.backend_ptr());
      } else {
        b.shard = Tensor::empty({0}, b.flat.dtype(), b.flat.backend_ptr());
      }
      b.request = comm_->reduce_scatter_sum_async(b.flat, b.shard, counts);
    } else {
      b.request = comm_->all_reduce_sum_async(b.flat);
    }
  }
}

// Lets launched collectives advance (MPI progresses non-blocking collectives only inside its calls).
void DataParallel::progress() {
  for (size_t i = 0; i < next_launch_; ++i) {
    Bucket& b = buckets_[i];
    if (!b.complete) b.complete = b.request->test();
  }
}

void DataParallel::finish_sync() {
  if (!comm_) return;
  const auto t0 = Clock::now();
  NoGradGuard no_grad;
  for (size_t k = params_.size(); k-- > 0;)  // parameters this backward pass did not reach
    if (!staged_[k]) stage(k);
  launch_ready();
  DEW_INTERNAL_ASSERT(next_launch_ == buckets_.size());
  const double inv_world = 1.0 / double(comm_->size());
  for (Bucket& b : buckets_) {
    b.request->wait();
    b.complete = true;
    if (reduces_onto_owners()) {
      b.flat = Tensor();  // the staged copy: freed on every rank
      if (b.owner != rank()) {
        b.shard = Tensor();
        for (size_t m : b.members) params_[m].second.zero_grad();
        continue;
      }
    }
    Tensor& reduced = reduces_onto_owners() ? b.shard : b.flat;
    Backend& be = reduced.backend();
    if (comm_->size() > 1) {
      UnaryParams scale;
      scale.op = UnaryOp::affine;
      scale.alpha = float(inv_world);
      scale.beta = 0.0f;
      be.unary(reduced, reduced, scale);
    }
    const std::vector<double> flags = reduced.slice0(b.numel, b.numel + int64_t(b.members.size())).to_doubles();
    for (size_t slot = 0; slot < b.members.size(); ++slot) {
      Tensor& p = params_[b.members[slot]].second;
      if (flags[slot] > 0) {
        p.set_grad(reduced.slice0(b.offsets[slot], b.offsets[slot] + p.numel()).reshape(p.shape()));
      } else {
        p.zero_grad();  // no rank had a gradient for it
      }
    }
  }
  sync_ms_ += ms_since(t0);
}

void DataParallel::sum(std::vector<double>& values) {
  if (!comm_ || values.empty()) return;
  const auto t0 = Clock::now();
  const BackendPtr& be = params_.front().second.backend_ptr();
  Tensor t = Tensor::from_host(values.data(), {int64_t(values.size())}, DType::f64, be);
  comm_->all_reduce_sum(t);
  t.copy_to_host(values.data());
  sync_ms_ += ms_since(t0);
}

double DataParallel::take_sync_ms() {
  const double ms = sync_ms_;
  sync_ms_ = 0.0;
  return ms;
}

}  // namespace dew::dist
