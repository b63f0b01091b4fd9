// core/data/loader.cpp — the deterministic, resumable, sharded batch stream over a DataSource.
//
// The stream (see dew/data.hpp): global stream index g; epoch e = g / N; record = perm_e[g % N].
// perm_e is a Fisher-Yates shuffle of [0, N) drawn from Philox with key = seed and stream = e:
// step t (t = 0 .. N-2) swaps position i = N-1-t with j = floor(r * (i+1) / 2^64), r the 64-bit number
// made of words (2*(t%2), 2*(t%2)+1) of Philox block t/2 (low word first). Without shuffle perm_e is the
// identity. Global batch k covers g in [k*G, (k+1)*G), G = world * batch_size, and rank r reads
// [k*G + r*B, k*G + (r+1)*B). After a seek to a position p the batches are those starting at p, p + G, ...
//
// Prefetch: `workers` threads assemble whole batches ahead of the consumer, at most
// max(prefetch, workers) batches ahead; each batch is a pure function of its first stream index, so the
// result never depends on the number of threads. Batches are handed out in order. seek() (and an error
// while assembling a batch) drops the work in flight: results of an older generation are discarded.
// workers = 0 assembles each batch in the caller's thread.
#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <thread>

#include "dew/data.hpp"
#include "dew/error.hpp"
#include "dew/random.hpp"

namespace dew {

namespace {

std::string describe_array(const HostArray& a) { return std::string(dtype_name(a.dtype)) + " " + shape_str(a.shape); }

__extension__ typedef unsigned __int128 u128;

std::vector<int64_t> shuffled(int64_t n, uint64_t seed, uint64_t epoch) {
  std::vector<int64_t> p(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) p[size_t(i)] = i;
  philox::Counter c{};
  for (int64_t t = 0; t + 1 < n; ++t) {
    if (t % 2 == 0) c = philox::block(seed, epoch, uint64_t(t / 2));
    const int w = int(t % 2) * 2;
    const uint64_t r = uint64_t(c[w]) | (uint64_t(c[w + 1]) << 32);
    const int64_t i = n - 1 - t;
    const int64_t j = int64_t(u128(r) * uint64_t(i + 1) >> 64);
    std::swap(p[size_t(i)], p[size_t(j)]);
  }
  return p;
}

}  // namespace

struct DataLoader::Impl {
  std::shared_ptr<DataSource> source;
  LoaderConfig cfg;
  std::vector<RecordTransform> transforms;
  int64_t n = 0;  // records in the source
  int64_t G = 0;  // global batch = world * batch_size
  std::string order;

  // ---- permutations, cached for a few epochs ----
  mutable std::mutex perm_mu;
  mutable std::map<int64_t, std::shared_ptr<const std::vector<int64_t>>> perms;

  std::shared_ptr<const std::vector<int64_t>> perm(int64_t epoch) const {
    std::lock_guard<std::mutex> lk(perm_mu);
    auto it = perms.find(epoch);
    if (it != perms.end()) return it->second;
    auto p = std::make_shared<const std::vector<int64_t>>(shuffled(n, cfg.seed, uint64_t(epoch)));
    if (perms.size() >= 3) {  // evict the epoch farthest from the one asked for
      auto far = perms.begin();
      for (auto j = perms.begin(); j != perms.end(); ++j)
        if (std::abs(j->first - epoch) > std::abs(far->first - epoch)) far = j;
      perms.erase(far);
    }
    perms.emplace(epoch, p);
    return p;
  }

  // This rank's rows of the global batch that starts at stream index `start`.
  std::vector<int64_t> indices_at(int64_t start) const {
    std::vector<int64_t> out(size_t(cfg.batch_size));
    const int64_t first = start + int64_t(cfg.rank) * cfg.batch_size;
    std::shared_ptr<const std::vector<int64_t>> p;
    int64_t pe = -1;
    for (int64_t j = 0; j < cfg.batch_size; ++j) {
      const int64_t g = first + j, e = g / n, i = g % n;
      if (!cfg.shuffle) {
        out[size_t(j)] = i;
        continue;
      }
      if (e != pe) p = perm(e), pe = e;
      out[size_t(j)] = (*p)[size_t(i)];
    }
    return out;
  }

  HostBatch assemble(int64_t start) const {
    const std::vector<int64_t> idx = indices_at(start);
    const int64_t first = start + int64_t(cfg.rank) * cfg.batch_size;
    const int64_t B = cfg.batch_size;
    HostBatch batch;
    Record ref;  // field layout of the first record
    for (int64_t j = 0; j < B; ++j) {
      Record rec = source->get(idx[size_t(j)]);
      for (const auto& t : transforms) t(rec, cfg.seed, uint64_t(first + j));
      for (const auto& [name, a] : rec)
        DEW_CHECK(a.bytes.size() == size_t(a.numel()) * dtype_size(a.dtype), "data source '", source->identity(),
                  "': record ", idx[size_t(j)], " field '", name, "' holds ", a.bytes.size(), " bytes, but ",
                  describe_array(a), " needs ", size_t(a.numel()) * dtype_size(a.dtype));
      if (j == 0) {
        DEW_USAGE_CHECK(!rec.empty(), "data source '", source->identity(), "': record ", idx[0], " has no fields");
        for (const auto& [name, a] : rec) {
          Shape s{B};
          s.insert(s.end(), a.shape.begin(), a.shape.end());
          batch.emplace(name, HostArray::make(a.dtype, s));
          ref[name].dtype = a.dtype;
          ref[name].shape = a.shape;
        }
      } else {
        auto describe_fields = [](const Record& r) {
          std::string s;
          for (const auto& [name, a] : r) s += (s.empty() ? "" : ", ") + name;
          return "{" + s + "}";
        };
        bool same_fields = rec.size() == ref.size();
        for (const auto& [name, a] : rec) same_fields = same_fields && ref.count(name);
        DEW_USAGE_CHECK(same_fields, "data source '", source->identity(), "': record ", idx[size_t(j)], " has fields ",
                        describe_fields(rec), " but record ", idx[0], " of the same batch has ", describe_fields(ref),
                        "; all records must have the same fields");
        for (const auto& [name, a] : rec) {
          const HostArray& r0 = ref.at(name);
          DEW_USAGE_CHECK(a.dtype == r0.dtype && a.shape == r0.shape, "data source '", source->identity(), "': field '",
                          name, "' of record ", idx[size_t(j)], " is ", describe_array(a), " but record ", idx[0],
                          " of the same batch has ", describe_array(r0),
                          "; records cannot be batched unless every field has one dtype and shape");
        }
      }
      for (const auto& [name, a] : rec) {
        HostArray& dst = batch.at(name);
        const size_t row = a.bytes.size();
        if (row) std::memcpy(dst.bytes.data() + size_t(j) * row, a.bytes.data(), row);
      }
    }
    return batch;
  }

  // ---- the pipeline ----
  struct Result {
    HostBatch batch;
    std::exception_ptr error;
  };
  mutable std::mutex mu;
  std::condition_variable cv_work, cv_ready;
  int64_t base = 0;       // stream index where batch ordinal 0 of this generation starts
  int64_t consumed = 0;   // batch ordinals handed out in this generation
  int64_t next_take = 0;  // the next batch ordinal a worker assembles
  uint64_t generation = 0;
  std::map<int64_t, Result> ready;
  bool stop = false;
  std::vector<std::thread> threads;

  int64_t window() const { return std::max<int64_t>({1, cfg.prefetch, cfg.workers}); }

  void reset_locked(int64_t new_base) {
    base = new_base;
    consumed = 0;
    next_take = 0;
    ++generation;
    ready.clear();
    cv_work.notify_all();
  }

  void worker() {
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      cv_work.wait(lk, [&] { return stop || next_take < consumed + window(); });
      if (stop) return;
      const int64_t j = next_take++;
      const uint64_t gen = generation;
      const int64_t start = base + j * G;
      lk.unlock();
      Result res;
      try {
        res.batch = assemble(start);
      } catch (...) {
        res.error = std::current_exception();
      }
      lk.lock();
      if (gen == generation) {
        ready.emplace(j, std::move(res));
        cv_ready.notify_all();
      }
    }
  }

  HostBatch next() {
    if (cfg.workers == 0) {
      int64_t start;
      {
        std::lock_guard<std::mutex> lk(mu);
        start = base + consumed * G;
      }
      HostBatch b = assemble(start);
      std::lock_guard<std::mutex> lk(mu);
      ++consumed;
      return b;
    }
    std::unique_lock<std::mutex> lk(mu);
    if (threads.empty())
      for (int w = 0; w < cfg.workers; ++w) threads.emplace_back([this] { worker(); });
    const int64_t j = consumed;
    cv_ready.wait(lk, [&] { return ready.count(j) != 0; });
    Result res = std::move(ready.at(j));
    ready.erase(j);
    if (res.error) {
      reset_locked(base + j * G);  // the next call tries this batch again
      std::rethrow_exception(res.error);
    }
    ++consumed;
    cv_work.notify_all();
    return std::move(res.batch);
  }

  ~Impl() {
    {
      std::lock_guard<std::mutex> lk(mu);
      stop = true;
    }
    cv_work.notify_all();
    for (auto& t : threads) t.join();
  }
};

DataLoader::DataLoader(std::shared_ptr<DataSource> source, LoaderConfig config, std::vector<RecordTransform> transforms)
    : impl_(std::make_unique<Impl>()) {
  DEW_CHECK(source != nullptr, "DataLoader: no data source given");
  DEW_USAGE_CHECK(config.batch_size > 0, "the batch size must be positive, got ", config.batch_size);
  DEW_USAGE_CHECK(config.world >= 1, "the world size must be at least 1, got ", config.world);
  DEW_USAGE_CHECK(config.rank >= 0 && config.rank < config.world, "rank ", config.rank, " is outside [0, ",
                  config.world, ")");
  DEW_USAGE_CHECK(config.workers >= 0, "the number of data workers must be 0 or more, got ", config.workers);
  DEW_USAGE_CHECK(config.prefetch >= 0, "prefetch must be 0 or more, got ", config.prefetch);
  Impl& m = *impl_;
  m.n = source->size();
  DEW_USAGE_CHECK(m.n > 0, "data source '", source->identity(), "' holds no records");
  m.source = std::move(source);
  m.cfg = config;
  m.transforms = std::move(transforms);
  m.G = int64_t(config.world) * config.batch_size;
  m.order = "source=" + m.source->identity() + ";n=" + std::to_string(m.n) + ";seed=" + std::to_string(config.seed) +
            ";shuffle=" + (config.shuffle ? "1" : "0");
}

DataLoader::~DataLoader() = default;

HostBatch DataLoader::next() { return impl_->next(); }

DataPosition DataLoader::position() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return {impl_->base + impl_->consumed * impl_->G, impl_->order};
}

void DataLoader::seek(const DataPosition& p) {
  DEW_USAGE_CHECK(p.order == impl_->order, "cannot resume the data stream: the saved position was taken on the order '",
                  p.order, "' but this run reads the order '", impl_->order,
                  "' (a different data source, record count, seed or shuffle)");
  DEW_USAGE_CHECK(p.next >= 0, "cannot resume the data stream at the negative stream index ", p.next);
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->reset_locked(p.next);
}

int64_t DataLoader::epoch() const { return position().next / impl_->n; }

const DataSource& DataLoader::source() const { return *impl_->source; }

const LoaderConfig& DataLoader::config() const { return impl_->cfg; }

std::vector<int64_t> DataLoader::indices_of_batch(int64_t k) const {
  DEW_CHECK(k >= 0, "indices_of_batch: negative batch number ", k);
  return impl_->indices_at(k * impl_->G);
}

}  // namespace dew
