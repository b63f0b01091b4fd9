// tests/models/test_backbone_fixtures.cpp — each backbone against its fixture (backbone_cases.hpp), bit for bit:
//  * the parameter names, their order and shapes, and the initial values for a fixed seed (their FNV-1a
//    hashes) are those of the code that wrote the fixture;
//  * the fixture's checkpoint loads (dew::load_into) and reproduces the recorded outputs (forward;
//    for the causal_transformer also the KV-cached and slot-cache decodes and a dropout forward) and
//    every parameter's gradient exactly, on ref;
//  * num_parameters and flops_per_sample are unchanged;
//  * with [trainer] recompute = blocks (activation recomputation) the outputs and gradients are the same bits.
// The fixtures were written before the backbones were rebuilt on the SDK blocks (dew/nn.hpp).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "backbone_cases.hpp"

namespace bf = backbone_fixtures;
using dew::Tensor;

namespace {

const Tensor& find(const dew::NamedTensors& v, const std::string& name) {
  for (auto& [k, t] : v)
    if (k == name) return t;
  FAIL("fixture has no tensor '" << name << "'");
  static Tensor none;
  return none;
}

// Bit-for-bit equality of two tensors; the message names the largest difference when they differ.
void check_bits(const Tensor& got, const Tensor& want, const std::string& what) {
  REQUIRE_MESSAGE(got.shape() == want.shape(), what, ": shape ", dew::shape_str(got.shape()), " vs ",
                  dew::shape_str(want.shape()));
  REQUIRE_MESSAGE(got.dtype() == want.dtype(), what, ": dtype differs");
  std::vector<unsigned char> a(got.nbytes()), b(want.nbytes());
  got.copy_to_host(a.data());
  want.copy_to_host(b.data());
  const bool same = a == b;
  if (!same && got.dtype() == dew::DType::f32) {
    const std::vector<float> x = got.to_floats(), y = want.to_floats();
    double worst = 0;
    size_t at = 0, n = 0;
    for (size_t i = 0; i < x.size(); ++i)
      if (std::memcmp(&x[i], &y[i], sizeof(float)) != 0) {
        ++n;
        if (std::fabs(double(x[i]) - double(y[i])) >= worst) worst = std::fabs(double(x[i]) - double(y[i])), at = i;
      }
    MESSAGE(what << ": " << n << " of " << x.size() << " values differ; largest |diff| " << worst << " at " << at
                 << " (" << x[at] << " vs " << y[at] << ")");
  }
  CHECK_MESSAGE(same, what, " differs from the fixture");
}

}  // namespace

TEST_CASE("backbone fixtures: names, initial values, outputs and gradients bit for bit") {
  for (const bf::Case& c : bf::cases()) {
    CAPTURE(c.name);
    const std::string path = std::string(DEW_BACKBONE_FIXTURES) + "/" + c.name + ".h5";
    const dew::CheckpointData d = dew::read_checkpoint(path, bf::ref());
    REQUIRE(d.attributes.at("fixture.plugin") == c.plugin);

    auto m = bf::make_model(c);
    const auto params = m->named_parameters();
    // names, order, shapes and initial values
    REQUIRE_MESSAGE(params.size() == d.params.size(), c.name, ": ", params.size(), " parameters, fixture has ",
                    d.params.size());
    for (size_t i = 0; i < params.size(); ++i) {
      CHECK_MESSAGE(params[i].first == d.params[i].first, "parameter ", i, ": ", params[i].first, " vs ",
                    d.params[i].first);
      CHECK_MESSAGE(params[i].second.shape() == d.params[i].second.shape(), params[i].first);
      auto it = d.state_text.find("init." + params[i].first);
      REQUIRE_MESSAGE(it != d.state_text.end(), "no initial-value hash for ", params[i].first);
      CHECK_MESSAGE(bf::fnv1a_hex(params[i].second) == it->second, params[i].first,
                    ": initial values differ from the fixture's");
    }
    CHECK(double(m->num_parameters()) == d.state_values.at("num_parameters"));
    CHECK(m->flops_per_sample() == d.state_values.at("flops_per_sample"));

    // the checkpoint loads and reproduces the outputs and gradients
    dew::load_into(d.params, "params", params);
    dew::NamedTensors inputs;
    for (const auto& [k, v] : d.state_tensors)
      if (k.rfind("input.", 0) == 0) inputs.push_back({k.substr(6), v});
    REQUIRE(!inputs.empty());
    // recompute = blocks (dew/autograd.hpp recompute_block) must give the same outputs and gradients bit
    // for bit: the blocks that recompute in the backward (causal_transformer with dropout, vit, dit) and
    // those that do not (unet) alike.
    for (const dew::Recompute mode : {dew::Recompute::none, dew::Recompute::blocks}) {
      CAPTURE(dew::recompute_name(mode));
      dew::RecomputeGuard recompute(mode);
      const bf::Results r = bf::run_model(c, *m, inputs);
      for (const auto& [k, v] : r.outputs) check_bits(v, find(d.state_tensors, k), c.name + " " + k);
      REQUIRE(r.grads.size() == params.size());
      for (const auto& [k, v] : r.grads) {
        auto it = d.state_text.find(k);
        REQUIRE_MESSAGE(it != d.state_text.end(), "fixture has no ", k);
        CHECK_MESSAGE(bf::fnv1a_hex(v) == it->second, c.name, " ", k, " differs from the fixture's");
      }
    }
  }
}

TEST_CASE("backbone fixtures: a changed weight is noticed (the comparison can fail)") {
  const bf::Case c = bf::cases()[0];
  const dew::CheckpointData d =
      dew::read_checkpoint(std::string(DEW_BACKBONE_FIXTURES) + "/" + c.name + ".h5", bf::ref());
  auto m = bf::make_model(c);
  dew::load_into(d.params, "params", m->named_parameters());
  Tensor w = m->named_parameters()[1].second;  // a q_proj weight
  std::vector<float> v = w.to_floats();
  v[0] += 1e-3f;
  w.copy_from_host(v.data());
  dew::NamedTensors inputs;
  for (const auto& [k, t] : d.state_tensors)
    if (k.rfind("input.", 0) == 0) inputs.push_back({k.substr(6), t});
  const bf::Results r = bf::run_model(c, *m, inputs);
  std::vector<unsigned char> a(r.outputs[0].second.nbytes()), b(a.size());
  r.outputs[0].second.copy_to_host(a.data());
  find(d.state_tensors, "output").copy_to_host(b.data());
  CHECK(a != b);
}
