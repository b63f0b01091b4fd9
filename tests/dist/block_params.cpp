// tests/dist/block_params.cpp — shard = parameters block by block, between real processes (mpirun -np 2):
// a hand-built model (an input offset E, 4 blocks x = tanh(x W_i + b_i), a head vector h) runs each block
// through dew::run_block with the data-parallel hooks of core/dist installed, for 3 updates of 2
// micro-batches (gradient accumulation) with a plain SGD step on the parameters a rank owns, beside a reference
// DataParallel (shard = none) on copies of the parameters. It checks, on every rank:
//  * inside each block's forward every parameter of the block is whole and holds the reference values;
//  * after the block's forward the parameters this rank does not own have no storage (0 bytes);
//  * from the second update on, the update's start gathers only E and h (blocks come with their forward);
//  * after the backward pass no parameter this rank does not own holds storage, and the gradients of the
//    parameters it owns equal the reference's bit for bit (the backward re-gathered each block);
//  * the reference and the sharded losses agree bit for bit.
// Exit status 0 only when every check on this rank passed.
#include "dew/block_params.hpp"

#include <cstdio>
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

}  // namespace

int main() {
  try {
    dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref", "mpi"});
    const dew::BackendPtr be = dew::create_backend("ref");
    dew::set_default_backend(be);
    auto comm = dew::Registry::global().create<dew::Communicator>("mpi", dew::Options{});
    g_rank = comm->rank();
    Model sharded = Model::make(be), ref = Model::make(be);
    dew::dist::DataParallel dp(comm, sharded.params, 25.0, dew::dist::ShardMode::parameters);
    dew::dist::DataParallel dp_ref(comm, ref.params, 25.0, dew::dist::ShardMode::none);
    const int64_t rows = 3;
    for (int update = 0; update < 3; ++update) {
      const std::string at = " (update " + std::to_string(update + 1) + ")";
      double loss_sum = 0, ref_loss_sum = 0;
      for (int micro = 0; micro < 2; ++micro) {
        // This rank's rows of the micro-batch.
        const Tensor x =
            Tensor::uniform({rows, Model::kDim}, -1.0f, 1.0f, 5, 100 + uint64_t(update * 7 + micro * 3 + g_rank), be);
        dp.gather_parameters(false);
        if (update > 0 || micro > 0)
          for (int i = 0; i < Model::kBlocks; ++i)
            expect(dp.owns(1 + 2 * size_t(i)) || held_bytes(sharded.W(i)) == 0,
                   "a block's weight is not gathered at the update's start" + at);
        Tensor loss;
        {
          dew::BlockParameterHooksGuard hooks(dp.block_hooks());
          Tensor y = dew::add(x, sharded.E());
          for (int i = 0; i < Model::kBlocks; ++i) {
            const std::vector<Tensor> block{sharded.W(i), sharded.b(i)};
            y = dew::run_block(
                [&, i, y] {
                  expect(held_bytes(sharded.W(i)) == sharded.W(i).nbytes() &&
                             sharded.W(i).to_floats() == ref.W(i).to_floats() &&
                             sharded.b(i).to_floats() == ref.b(i).to_floats(),
                         "block " + std::to_string(i) + " runs on whole, current parameters" + at);
                  return dew::tanh(dew::add(dew::matmul(y, sharded.W(i)), sharded.b(i)));
                },
                block);
            const size_t k = 1 + 2 * size_t(i);
            expect(dp.owns(k) || held_bytes(sharded.W(i)) == 0,
                   "block " + std::to_string(i) + "'s weight is dropped after its forward" + at);
          }
          loss = dew::scale(dew::sum(dew::mul(y, sharded.h())), 0.5f);
          dp.backward(loss, micro == 1);
        }
        if (micro == 0) dp.release_parameters();
        Tensor ref_loss;
        {
          Tensor y = dew::add(x, ref.E());
          for (int i = 0; i < Model::kBlocks; ++i) y = dew::tanh(dew::add(dew::matmul(y, ref.W(i)), ref.b(i)));
          ref_loss = dew::scale(dew::sum(dew::mul(y, ref.h())), 0.5f);
          dp_ref.backward(ref_loss, micro == 1);
        }
        loss_sum += loss.item();
        ref_loss_sum += ref_loss.item();
      }
      dp.finish_sync();
      dp.release_parameters();
      dp_ref.finish_sync();
      expect(loss_sum == ref_loss_sum, "the loss equals the reference's" + at);
      for (size_t k = 0; k < sharded.params.size(); ++k) {
        const std::string name = sharded.params[k].first;
        if (dp.owns(k)) {
          expect(sharded.at(k).grad().defined() && sharded.at(k).grad().to_floats() == ref.at(k).grad().to_floats(),
                 "the gradient of " + name + " equals the reference's" + at);
        } else {
          expect(held_bytes(sharded.at(k)) == 0 && !sharded.at(k).grad().defined(),
                 "no storage and no gradient for " + name + ", owned elsewhere" + at);
        }
      }
      // SGD on what each holds (the reference: everything; sharded: its own parameters).
      dew::NoGradGuard no_grad;
      for (size_t k = 0; k < ref.params.size(); ++k) {
        ref.at(k).copy_(dew::sub(ref.at(k), dew::scale(ref.at(k).grad(), 0.1f)));
        ref.at(k).zero_grad();
        if (dp.owns(k)) {
          sharded.at(k).copy_(dew::sub(sharded.at(k), dew::scale(sharded.at(k).grad(), 0.1f)));
          sharded.at(k).zero_grad();
        }
      }
    }
    dp.gather_parameters(true);
    for (size_t k = 0; k < sharded.params.size(); ++k)
      expect(sharded.at(k).to_floats() == ref.at(k).to_floats(),
             "after 3 updates, " + sharded.params[k].first + " gathered equals the reference");
    comm->barrier();
    if (g_failures == 0 && g_rank == 0) std::printf("block parameters: all checks passed on %d ranks\n", comm->size());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
  return g_failures == 0 ? 0 : 1;
}
