// tests/models/test_recompute.cpp — [trainer] recompute = blocks on the bundled transformer backbones
// (causal_transformer with dropout, vit_encoder, dit), on ref and cpu, in f32 and under bf16 autocast (the
// trainer's bf16-mixed: the recomputation must run the forward's bf16 ops, not f32 ones): the loss and every
// parameter's gradient are bit-identical to recompute = none, and the activation memory of the step (the
// backend's high-water mark minus what was in use before the forward, minus the gradients) falls.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dew/autocast.hpp"
#include "dew/autograd.hpp"
#include "dew/model.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"

using dew::Tensor;

namespace {

dew::BackendPtr backend(const std::string& name) {
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "ref"))
    reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu", "causal_transformer", "vit", "dit"});
  dew::BackendPtr be = dew::create_backend(name);
  dew::set_default_backend(be);
  return be;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  std::vector<unsigned char> x(a.nbytes()), y(b.nbytes());
  a.copy_to_host(x.data());
  b.copy_to_host(y.data());
  return x == y;
}

struct Case {
  std::string plugin;
  std::map<std::string, std::string> options;
};

std::vector<Case> cases() {
  return {{"causal_transformer",
           {{"vocab_size", "32"}, {"dim", "32"}, {"n_layers", "4"}, {"n_heads", "4"}, {"n_kv_heads", "2"},
            {"dropout", "0.1"}, {"max_seq_len", "32"}}},
          {"vit_encoder", {{"image_size", "16"}, {"in_channels", "2"}, {"patch", "2"}, {"dim", "32"}, {"depth", "4"},
                           {"heads", "2"}, {"mlp_ratio", "2"}}},
          {"dit", {{"image_size", "16"}, {"in_channels", "2"}, {"num_classes", "3"}, {"patch", "2"}, {"dim", "32"},
                   {"depth", "4"}, {"heads", "2"}, {"mlp_ratio", "2"}}}};
}

dew::Batch inputs(const Case& c, const dew::BackendPtr& be) {
  if (c.plugin == "causal_transformer") {
    std::vector<int32_t> ids;
    for (int i = 0; i < 4 * 32; ++i) ids.push_back(int32_t((i * 7 + 3) % 32));
    return {{"tokens", Tensor::from_ints(ids, {4, 32}, be)}};
  }
  if (c.plugin == "vit_encoder") return {{"image", Tensor::normal({4, 2, 16, 16}, 0, 1, 3, 1, be)}};
  return {{"x", Tensor::normal({4, 2, 16, 16}, 0, 1, 3, 2, be)},
          {"t", Tensor::from_vector({3.0f, 100.0f, 517.25f, 999.0f}, {4}, be)},
          {"label", Tensor::from_ints({0, 1, 2, 3}, {4}, be)}};
}

struct Step {
  Tensor loss;
  std::vector<std::pair<std::string, Tensor>> grads;
  int64_t activations = 0;  // peak - in use before the forward - the gradients' bytes
};

Step step(const Case& c, const dew::BackendPtr& be, dew::Recompute mode, dew::DType compute) {
  dew::Options o(c.options, "model");
  auto m = dew::Registry::global().create<dew::Model>(c.plugin, o);
  m->initialize(7);
  m->set_training(true);
  m->set_random_key({77, 5});
  const dew::Batch batch = inputs(c, be);
  const Tensor r0 = [&] {
    dew::NoGradGuard ng;
    return m->forward(batch);
  }();
  const Tensor r = Tensor::normal(r0.shape(), 0, 1, 5, 9, be);
  const int64_t before = be->memory_stats().in_use;
  be->reset_memory_peak();
  Step s;
  {
    dew::RecomputeGuard recompute(mode);
    {
      dew::AutocastGuard autocast(compute);  // as the trainer: the forward and the loss (f32 under autocast)
      s.loss = dew::sum(dew::mul(m->forward(batch), r));
    }
    s.loss.backward();
  }
  int64_t grad_bytes = 0;
  for (auto& [name, p] : m->named_parameters()) {
    REQUIRE_MESSAGE(p.grad().defined(), name);
    s.grads.push_back({name, p.grad()});
    grad_bytes += int64_t(p.grad().nbytes());
  }
  s.activations = be->memory_stats().peak - before - grad_bytes;
  return s;
}

}  // namespace

TEST_CASE("recompute = blocks: the same loss and gradients bit for bit, less activation memory") {
  for (const char* name : {"ref", "cpu"})
    for (const dew::DType compute : {dew::DType::f32, dew::DType::bf16}) {
      const dew::BackendPtr be = backend(name);
      for (const Case& c : cases()) {
        const std::string where = std::string(name) + " " + dew::dtype_name(compute);
        CAPTURE(where);
        CAPTURE(c.plugin);
        const Step none = step(c, be, dew::Recompute::none, compute);
        const Step blocks = step(c, be, dew::Recompute::blocks, compute);
        CHECK(same_bits(none.loss, blocks.loss));
        REQUIRE(none.grads.size() == blocks.grads.size());
        for (size_t i = 0; i < none.grads.size(); ++i)
          CHECK_MESSAGE(same_bits(none.grads[i].second, blocks.grads[i].second), none.grads[i].first, " differs");
        MESSAGE(where << " " << c.plugin << ": activation bytes none " << none.activations << ", blocks "
                      << blocks.activations);
        CHECK(blocks.activations < none.activations * 0.7);
      }
    }
}
