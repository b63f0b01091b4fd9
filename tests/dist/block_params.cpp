// tests/dist/block_params.cpp — shard = parameters block by block, between real processes (mpirun -np 2):
// a hand-built model (an input offset E, 4 blocks x = tanh(x W_i + b_i), a head vector h) runs each block
// through dew::run_block with the data-parallel hooks of core/dist installed, for 3 updates of 2
// micro-batches (gradient accumulation) with a plain SGD step on the parameters a rank owns, twice: with
// the next block's gather prefetched ([run] shard_prefetch = true) and without, beside a reference
// DataParallel (shard = none) on copies of the parameters. The second micro-batch of the second update
// skips block 2 (in all three models): the block sequence changes twice, which the prefetch must survive.
// It checks, on every rank:
//  * inside each block's forward every parameter of the block is whole and holds the reference values;
//  * the memory bound: inside a block's forward and inside its backward, besides that block at most one
//    other block has parameters this rank does not own whole (the prefetched one), none without prefetch;
//  * the prefetch happens: in a pass that repeats the previous pass's block sequence, the next block's
//    parameters (in forward order; in the backward, the block before) already have their storage while a
//    block computes, on the rank that does not own them; the last block is kept from its forward to its
//    backward; without prefetch every block's are dropped after its forward;
//  * from the second micro-batch on, the pass's start gathers only E and h (and, with prefetch, launches
//    the first block's gather);
//  * after the backward pass no parameter this rank does not own holds storage, and the gradients of the
//    parameters it owns equal the reference's bit for bit;
//  * the losses equal the reference's bit for bit, and after 3 updates every parameter too;
//  * the gather counters (DataParallel::gather_stats): with prefetch, every acquire of a pass that repeats
//    the previous sequence was prefetched (or kept); without, none was.
// Exit status 0 only when every check on this rank passed.
#include "dew/block_params.hpp"

#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/comm.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dist/data_parallel.hpp"

using dew::Tensor;

namespace {

int g_failures = 0, g_rank = 0;
void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what.c_str());
}

size_t held_bytes(const Tensor& t) { return t.impl()->storage ? t.impl()->storage->bytes : 0; }

struct Model {
  dew::NamedTensors params;  // E, W0, b0, ..., W3, b3, h
  static constexpr int kBlocks = 4;
  static constexpr int64_t kDim = 6;
  static Model make(const dew::BackendPtr& be) {
    Model m;
    auto leaf = [&](const std::string& name, const dew::Shape& s, uint64_t stream) {
      m.params.emplace_back(name, Tensor::uniform(s, -0.5f, 0.5f, 11, stream, be).set_requires_grad(true));
    };
    leaf("E", {kDim}, 1);
    for (int i = 0; i < kBlocks; ++i) {
      leaf("W" + std::to_string(i), {kDim, kDim}, 10 + uint64_t(i));
      leaf("b" + std::to_string(i), {kDim}, 20 + uint64_t(i));
    }
    leaf("h", {kDim}, 2);
    return m;
  }
  Tensor& at(size_t k) { return params[k].second; }
  Tensor& E() { return at(0); }
  Tensor& W(int i) { return at(1 + 2 * size_t(i)); }
  Tensor& b(int i) { return at(2 + 2 * size_t(i)); }
  Tensor& h() { return at(params.size() - 1); }
};


bool holds_unowned(const dew::dist::DataParallel& dp, Model& m, int block) {
  for (size_t k : {1 + 2 * size_t(block), 2 + 2 * size_t(block)})
    if (!dp.owns(k) && held_bytes(m.at(k)) > 0) return true;
  return false;
}
// Blocks other than `block` that have a parameter this rank does not own whole.
int other_blocks_whole(const dew::dist::DataParallel& dp, Model& m, int block) {
  int n = 0;
  for (int i = 0; i < Model::kBlocks; ++i) n += i != block && holds_unowned(dp, m, i);
  return n;
}

// One sharded model and its data parallel, with or without prefetch.
struct Sharded {
  Model m;
  std::unique_ptr<dew::dist::DataParallel> dp;
  bool prefetch;
  std::string tag;
};

// The identity whose backward runs `check` (just after the block's own backward nodes).
Tensor checked(const Tensor& x, std::function<void()> check) {
  Tensor out = x.detach();
  dew::record(out, {x}, [check](const Tensor& g) {
    check();
    return std::vector<Tensor>{g};
  }, "test.check");
  return out;
}

}  // namespace

int main() {
  try {
    dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref", "mpi"});
    const dew::BackendPtr be = dew::create_backend("ref");
    dew::set_default_backend(be);
    auto comm = dew::Registry::global().create<dew::Communicator>("mpi", dew::Options{});
    g_rank = comm->rank();
    Model ref = Model::make(be);
    std::vector<Sharded> variants;
    for (bool prefetch : {true, false}) {
      Sharded v{Model::make(be), nullptr, prefetch, prefetch ? " [prefetch]" : " [no prefetch]"};
      v.dp = std::make_unique<dew::dist::DataParallel>(comm, v.m.params, 25.0, dew::dist::ShardMode::parameters,
                                                       prefetch);
      variants.push_back(std::move(v));
    }
    dew::dist::DataParallel dp_ref(comm, ref.params, 25.0, dew::dist::ShardMode::none);
    const int64_t rows = 3;
    const std::vector<int> all{0, 1, 2, 3}, skip2{0, 1, 3};
    std::vector<int> previous;  // the previous pass's block order
    for (int update = 0; update < 3; ++update) {
      const std::string at = " (update " + std::to_string(update + 1) + ")";
      std::vector<double> loss_sum(variants.size(), 0.0);
      double ref_loss_sum = 0;
      for (int micro = 0; micro < 2; ++micro) {
        const int pass = update * 2 + micro;
        const std::vector<int>& order = update == 1 && micro == 1 ? skip2 : all;
        const bool repeats = order == previous;  // the prefetch follows the previous pass's sequence
        // This rank's rows of the micro-batch.
        const Tensor x =
            Tensor::uniform({rows, Model::kDim}, -1.0f, 1.0f, 5, 100 + uint64_t(update * 7 + micro * 3 + g_rank), be);
        for (size_t vi = 0; vi < variants.size(); ++vi) {
          Sharded& v = variants[vi];
          dew::dist::DataParallel& dp = *v.dp;
          Model& sharded = v.m;
          const std::string where = v.tag + at + " pass " + std::to_string(pass + 1);
          const bool prefetching = v.prefetch && repeats;
          dp.gather_parameters(false);
          // The pass's start: E and h; with prefetch the gather of the previous pass's first block is launched.
          if (pass > 0)
            for (int i = 0; i < Model::kBlocks; ++i)
              expect(dp.owns(1 + 2 * size_t(i)) || holds_unowned(dp, sharded, i) == (v.prefetch && i == previous.front()),
                     "block " + std::to_string(i) + " at the pass's start: only the first block's gather (prefetch)" +
                         where);
          Tensor loss;
          {
            dew::BlockParameterHooksGuard hooks(dp.block_hooks());
            Tensor y = dew::add(x, sharded.E());
            for (size_t j = 0; j < order.size(); ++j) {
              const int i = order[j];
              const std::string blk = "block " + std::to_string(i);
              const int next = j + 1 < order.size() ? order[j + 1] : -1, before = j > 0 ? order[j - 1] : -1;
              const std::vector<Tensor> block{sharded.W(i), sharded.b(i)};
              y = dew::run_block(
                  [&, i, y, next, before, blk] {
                    expect(held_bytes(sharded.W(i)) == sharded.W(i).nbytes() &&
                               sharded.W(i).to_floats() == ref.W(i).to_floats() &&
                               sharded.b(i).to_floats() == ref.b(i).to_floats(),
                           blk + " runs on whole, current parameters" + where);
                    if (pass > 0) {
                      expect(other_blocks_whole(dp, sharded, i) <= (v.prefetch ? 1 : 0),
                             blk + "'s forward: at most one other block gathered" + where);
                      if (prefetching && next >= 0)
                        expect(dp.owns(1 + 2 * size_t(next)) || holds_unowned(dp, sharded, next),
                               blk + "'s forward: block " + std::to_string(next) + "'s gather is in flight" + where);
                    }
                    const Tensor input = checked(y, [&, i, before, blk] {
                      expect(other_blocks_whole(dp, sharded, i) <= (v.prefetch ? 1 : 0),
                             blk + "'s backward: at most one other block gathered" + where);
                      if (prefetching && before >= 0)
                        expect(dp.owns(1 + 2 * size_t(before)) || holds_unowned(dp, sharded, before),
                               blk + "'s backward: block " + std::to_string(before) + "'s gather is in flight" +
                                   where);
                    });
                    return dew::tanh(dew::add(dew::matmul(input, sharded.W(i)), sharded.b(i)));
                  },
                  block);
              const bool kept = prefetching && next < 0;  // the last block: its backward follows at once
              expect(dp.owns(1 + 2 * size_t(i)) || (held_bytes(sharded.W(i)) > 0) == kept,
                     blk + (kept ? "'s weight is kept" : "'s weight is dropped") + " after its forward" + where);
            }
            loss = dew::scale(dew::sum(dew::mul(y, sharded.h())), 0.5f);
            dp.backward(loss, micro == 1);
          }
          if (micro == 0) dp.release_parameters();
          loss_sum[vi] += loss.item();
        }
        Tensor ref_loss;
        {
          Tensor y = dew::add(x, ref.E());
          for (int i : order) y = dew::tanh(dew::add(dew::matmul(y, ref.W(i)), ref.b(i)));
          ref_loss = dew::scale(dew::sum(dew::mul(y, ref.h())), 0.5f);
          dp_ref.backward(ref_loss, micro == 1);
        }
        ref_loss_sum += ref_loss.item();
        previous = order;
      }
      dp_ref.finish_sync();
      for (size_t vi = 0; vi < variants.size(); ++vi) {
        Sharded& v = variants[vi];
        v.dp->finish_sync();
        v.dp->release_parameters();
        expect(loss_sum[vi] == ref_loss_sum, "the loss equals the reference's" + v.tag + at);
        for (size_t k = 0; k < v.m.params.size(); ++k) {
          const std::string name = v.m.params[k].first;
          if (v.dp->owns(k)) {
            expect(v.m.at(k).grad().defined() && v.m.at(k).grad().to_floats() == ref.at(k).grad().to_floats(),
                   "the gradient of " + name + " equals the reference's" + v.tag + at);
          } else {
            expect(held_bytes(v.m.at(k)) == 0 && !v.m.at(k).grad().defined(),
                   "no storage and no gradient for " + name + ", owned elsewhere" + v.tag + at);
          }
        }
      }
      // SGD on what each holds (the reference: everything; sharded: its own parameters).
      dew::NoGradGuard no_grad;
      for (Sharded& v : variants)
        for (size_t k = 0; k < v.m.params.size(); ++k)
          if (v.dp->owns(k)) {
            v.m.at(k).copy_(dew::sub(v.m.at(k), dew::scale(v.m.at(k).grad(), 0.1f)));
            v.m.at(k).zero_grad();
          }
      for (size_t k = 0; k < ref.params.size(); ++k) {
        ref.at(k).copy_(dew::sub(ref.at(k), dew::scale(ref.at(k).grad(), 0.1f)));
        ref.at(k).zero_grad();
      }
    }
    for (Sharded& v : variants) {
      v.dp->gather_parameters(true);
      for (size_t k = 0; k < v.m.params.size(); ++k)
        expect(v.m.at(k).to_floats() == ref.at(k).to_floats(),
               "after 3 updates, " + v.m.params[k].first + " gathered equals the reference" + v.tag);
    }
    // The counters, per pass of 8 block acquires (4 forward, 4 backward; 6 in the pass that skips block 2).
    // Pass 1 learns the sequence: its forward finds everything gathered (the first pass's start gathers all),
    // its backward gathers on the spot (4). A pass repeating the previous sequence (2, 3, 6): 7 prefetched,
    // the last block kept (resident). Pass 4 (skips block 2) follows pass 3 for blocks 0 and 1 (prefetched),
    // misses at block 3 and gathers its 4 others on the spot; pass 5 (all blocks again) follows pass 4 for
    // blocks 0 and 1 and misses at block 2 (6 on the spot). Without prefetch: 4 resident (pass 1), the
    // other 42 acquires on the spot.
    const auto& on = variants[0].dp->gather_stats();
    const auto& off = variants[1].dp->gather_stats();
    auto counts = [](const dew::dist::DataParallel::GatherStats& g) {
      return std::to_string(g.prefetched) + " prefetched, " + std::to_string(g.resident) + " resident, " +
             std::to_string(g.blocking) + " blocking, " + std::to_string(g.schedule_misses) + " misses";
    };
    expect(on.prefetched == 25 && on.resident == 7 && on.blocking == 14 && on.schedule_misses == 2,
           "prefetch counters: 25 prefetched, 7 resident, 14 blocking, 2 misses; got " + counts(on));
    expect(off.prefetched == 0 && off.resident == 4 && off.blocking == 42 && off.schedule_misses == 0,
           "no-prefetch counters: 0 prefetched, 4 resident, 42 blocking, 0 misses; got " + counts(off));
    comm->barrier();
    if (g_failures == 0 && g_rank == 0)
      std::printf("block parameters: all checks passed on %d ranks (prefetch: %s; without: %s)\n", comm->size(),
                  counts(on).c_str(), counts(off).c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
  return g_failures == 0 ? 0 : 1;
}
