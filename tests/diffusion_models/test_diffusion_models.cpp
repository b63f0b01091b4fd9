// tests/diffusion_models/test_diffusion_models.cpp — the `dit` and `unet` backbones (their fused ops,
// dew::modulated_layer_norm and dew::qkv_attention, are checked in tests/autograd/test_fused_ops.cpp):
//  * the DiT benchmark configuration has exactly the PyTorch peer's parameter count and FLOPs;
//  * untrained models output exactly 0 (zero-initialised outputs);
//  * `cpu` matches `ref` forward and backward (the gradient of every parameter) with random weights;
//  * labels: num_classes is the null class, anything outside [0, num_classes] is refused;
//  * a tiny dit and a tiny unet overfit one fixed batch with AdamW.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/model.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"

using dew::Tensor;

namespace {

void load_plugins() {
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "ref"))
    reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu", "dit", "unet"});
}
const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    load_plugins();
    return dew::create_backend("ref");
  }();
  return be;
}
const dew::BackendPtr& cpu() {
  static dew::BackendPtr be = [] {
    load_plugins();
    return dew::create_backend("cpu");
  }();
  return be;
}

std::shared_ptr<dew::Model> make_model(const std::string& plugin, std::map<std::string, std::string> kv,
                                       const dew::BackendPtr& be, uint64_t seed = 1) {
  dew::set_default_backend(be);
  dew::Options o(std::move(kv), "model");
  auto m = dew::Registry::global().create<dew::Model>(plugin, o);
  o.check_all_used();
  m->initialize(seed);
  return m;
}

// Gives every parameter random values N(0, std) (the same on every backend): zero-initialised layers
// would otherwise hide most of the network from a forward/backward comparison.
void randomize(dew::Model& m, float std, uint64_t seed) {
  uint64_t stream = 1;
  for (auto& [name, p] : m.named_parameters()) {
    const std::vector<float> v = Tensor::normal(p.shape(), 0.0f, std, seed, stream++, ref()).to_floats();
    p.copy_from_host(v.data());
  }
}

dew::Batch inputs(const dew::BackendPtr& be, int64_t b, int64_t c, int64_t h, int64_t w, int num_classes,
                  float t_scale) {
  std::vector<float> x = Tensor::normal({b, c, h, w}, 0.0f, 1.0f, 7, 1, ref()).to_floats();
  std::vector<float> t = Tensor::uniform({b}, 0.0f, t_scale, 7, 2, ref()).to_floats();
  dew::Batch in{{"x", Tensor::from_vector(x, {b, c, h, w}, be)}, {"t", Tensor::from_vector(t, {b}, be)}};
  if (num_classes > 0) {
    std::vector<int32_t> l;
    for (int64_t i = 0; i < b; ++i) l.push_back(int32_t(i % (num_classes + 1)));  // includes the null class
    in["label"] = Tensor::from_ints(l, {b}, be);
  }
  return in;
}

double max_abs(const std::vector<float>& v) {
  double m = 0;
  for (float x : v) m = std::max(m, double(std::fabs(x)));
  return m;
}

// Forward and backward of loss = sum(out * R) on both backends; every output value and every
// parameter gradient must agree to `tol` relative to that tensor's largest magnitude.
void compare_cpu_ref(const std::string& plugin, const std::map<std::string, std::string>& kv, int64_t b, int64_t c,
                     int64_t hw, int num_classes, float t_scale) {
  auto mr = make_model(plugin, kv, ref());
  auto mc = make_model(plugin, kv, cpu());
  randomize(*mr, 0.15f, 11);
  randomize(*mc, 0.15f, 11);
  const Tensor yr = mr->forward(inputs(ref(), b, c, hw, hw, num_classes, t_scale));
  const Tensor yc = mc->forward(inputs(cpu(), b, c, hw, hw, num_classes, t_scale));
  REQUIRE(yr.shape() == yc.shape());
  const std::vector<float> vr = yr.to_floats(), vc = yc.to_floats();
  const double scale = max_abs(vr);
  REQUIRE(scale > 1e-3);  // a non-trivial output
  double worst = 0;
  for (size_t i = 0; i < vr.size(); ++i) worst = std::max(worst, std::fabs(double(vr[i]) - double(vc[i])));
  MESSAGE(plugin << " forward: max |cpu - ref| = " << worst << " (max |out| " << scale << ")");
  CHECK(worst <= 2e-4 * scale);

  const std::vector<float> rv = Tensor::normal(yr.shape(), 0.0f, 1.0f, 5, 5, ref()).to_floats();
  dew::sum(dew::mul(yr, Tensor::from_vector(rv, yr.shape(), ref()))).backward();
  dew::sum(dew::mul(yc, Tensor::from_vector(rv, yc.shape(), cpu()))).backward();
  const auto pr = mr->named_parameters(), pc = mc->named_parameters();
  REQUIRE(pr.size() == pc.size());
  int checked = 0;
  for (size_t i = 0; i < pr.size(); ++i) {
    const Tensor gr = pr[i].second.grad(), gc = pc[i].second.grad();
    REQUIRE_MESSAGE(gr.defined(), pr[i].first, " got no gradient on ref");
    REQUIRE_MESSAGE(gc.defined(), pc[i].first, " got no gradient on cpu");
    const std::vector<float> a = gr.to_floats(), bb = gc.to_floats();
    const double s = max_abs(a);
    double d = 0;
    for (size_t j = 0; j < a.size(); ++j) d = std::max(d, std::fabs(double(a[j]) - double(bb[j])));
    CHECK_MESSAGE(d <= 1e-3 * s + 1e-6, pr[i].first, ": max |cpu - ref| = ", d, ", max |grad| = ", s);
    CHECK_MESSAGE(s > 0.0, pr[i].first, " has an all-zero gradient");
    ++checked;
  }
  MESSAGE(plugin << ": " << checked << " parameter gradients compared");
}

// AdamW on one fixed batch: the loss (MSE to a fixed random target) must fall by `factor`.
void overfit(const std::string& plugin, const std::map<std::string, std::string>& kv, int64_t c, int64_t hw,
             int num_classes, int steps, double factor) {
  auto m = make_model(plugin, kv, cpu(), 3);
  dew::Config cfg = dew::Config::parse_ini("[optim]\nname = adamw\nweight_decay = 0\nbetas = 0.9, 0.99\n");
  dew::NamedTensors params;
  for (auto& np : m->named_parameters()) params.push_back(np);
  auto opt = dew::make_optimizer(cfg.section("optim"), params);
  const int64_t b = 4;
  const dew::Batch in = inputs(cpu(), b, c, hw, hw, num_classes, 1000.0f);
  const Tensor target =
      Tensor::from_vector(Tensor::normal({b, c, hw, hw}, 0.0f, 1.0f, 9, 9, ref()).to_floats(), {b, c, hw, hw}, cpu());
  double first = -1, loss = -1;
  for (int s = 0; s < steps; ++s) {
    Tensor l = dew::mse(m->forward(in), target);
    loss = l.item();
    if (first < 0) first = loss;
    l.backward();
    opt->update(3e-3f, 1.0f, s + 1);
    for (auto& [k, p] : params) p.zero_grad();
  }
  MESSAGE(plugin << " overfit: loss " << first << " -> " << loss << " in " << steps << " AdamW steps");
  CHECK(first == doctest::Approx(1.0).epsilon(0.3));  // zero output against N(0, 1) targets
  CHECK(loss < first / factor);
}

}  // namespace

TEST_CASE("dit: the benchmark configuration has the PyTorch peer's parameter count and FLOPs") {
  // ../shared/peers/torch_dit_train.py: img 32, channels 3, patch 4, d 256, 6 layers, 4 heads.
  auto m = make_model("dit", {{"time_max_freq", "1"}}, cpu());
  CHECK(m->num_parameters() == 7388976);
  // forward FLOPs per image = (6 (N_tok N + N_img) + 12 L d N^2) / 3 with N_tok = 4,743,168,
  // N_img = 2,621,440, N = 64 (the peer's flop_params()).
  CHECK(m->flops_per_sample() == doctest::Approx(637534208.0));
  const auto d = m->describe();
  CHECK(d.at("model_type") == "dit");
  CHECK(d.at("num_parameters") == "7388976");
  // DiT's checkpoint names
  std::map<std::string, dew::Shape> shapes;
  for (auto& [n, p] : m->named_parameters()) shapes[n] = p.shape();
  CHECK(shapes.at("x_embedder.proj.weight") == dew::Shape{256, 3, 4, 4});
  CHECK(shapes.at("t_embedder.mlp.0.weight") == dew::Shape{256, 256});
  CHECK(shapes.at("blocks.5.attn.qkv.weight") == dew::Shape{768, 256});
  CHECK(shapes.at("blocks.0.adaLN_modulation.1.weight") == dew::Shape{1536, 256});
  CHECK(shapes.at("final_layer.linear.weight") == dew::Shape{48, 256});
  CHECK(shapes.count("y_embedder.embedding_table.weight") == 0);
  auto mc = make_model("dit", {{"num_classes", "10"}}, cpu());
  CHECK(mc->num_parameters() == 7388976 + 11 * 256);
}

TEST_CASE("dit and unet: untrained models output exactly zero, in the input's shape") {
  auto d = make_model("dit",
                      {{"image_size", "8"},
                       {"patch", "2"},
                       {"dim", "32"},
                       {"depth", "2"},
                       {"heads", "2"},
                       {"in_channels", "3"},
                       {"out_channels", "6"}},
                      cpu());
  Tensor y = d->forward(inputs(cpu(), 2, 3, 8, 8, 0, 1.0f));
  CHECK(y.shape() == dew::Shape{2, 6, 8, 8});
  CHECK(max_abs(y.to_floats()) == 0.0);
  auto u = make_model("unet",
                      {{"image_size", "8"},
                       {"channels", "8,16"},
                       {"res_blocks", "1"},
                       {"groups", "4"},
                       {"heads", "2"},
                       {"in_channels", "1"}},
                      cpu());
  y = u->forward(inputs(cpu(), 2, 1, 8, 8, 0, 1.0f));
  CHECK(y.shape() == dew::Shape{2, 1, 8, 8});
  CHECK(max_abs(y.to_floats()) == 0.0);
  CHECK(u->flops_per_sample() > 0);
}

TEST_CASE("dit: cpu matches ref forward and backward (every parameter's gradient)") {
  compare_cpu_ref("dit",
                  {{"image_size", "8"},
                   {"patch", "2"},
                   {"dim", "32"},
                   {"depth", "2"},
                   {"heads", "2"},
                   {"in_channels", "3"},
                   {"num_classes", "3"}},
                  3, 3, 8, 3, 1000.0f);
}

TEST_CASE("unet: cpu matches ref forward and backward (every parameter's gradient)") {
  compare_cpu_ref("unet",
                  {{"image_size", "8"},
                   {"channels", "8,16"},
                   {"res_blocks", "1"},
                   {"attention_levels", "0,1"},
                   {"groups", "4"},
                   {"heads", "2"},
                   {"in_channels", "2"},
                   {"num_classes", "2"}},
                  2, 2, 8, 2, 1.0f);
}

TEST_CASE("labels: num_classes is the null class, anything outside [0, num_classes] is refused") {
  for (const char* plugin : {"dit", "unet"}) {
    CAPTURE(plugin);
    std::map<std::string, std::string> kv =
        std::string(plugin) == "dit"
            ? std::map<std::string, std::string>{{"image_size", "4"}, {"patch", "2"}, {"dim", "16"},
                                                 {"depth", "1"},      {"heads", "2"}, {"in_channels", "1"},
                                                 {"num_classes", "4"}}
            : std::map<std::string, std::string>{{"image_size", "4"}, {"channels", "8"},    {"res_blocks", "1"},
                                                 {"groups", "4"},     {"in_channels", "1"}, {"num_classes", "4"}};
    auto m = make_model(plugin, kv, cpu());
    randomize(*m, 0.3f, 2);
    dew::Batch in = inputs(cpu(), 2, 1, 4, 4, 0, 1.0f);
    dew::NoGradGuard ng;
    const std::vector<float> none = m->forward(in).to_floats();
    in["label"] = Tensor::from_ints({4, 4}, {2}, cpu());  // the null class, explicitly
    CHECK(m->forward(in).to_floats() == none);
    in["label"] = Tensor::from_ints({0, 3}, {2}, cpu());
    CHECK(m->forward(in).to_floats() != none);
    in["label"] = Tensor::from_ints({5, 0}, {2}, cpu());
    CHECK_THROWS_WITH_AS(m->forward(in), doctest::Contains("label 5 is outside [0, 4]"), dew::Error);
    in["label"] = Tensor::from_ints({0, -1}, {2}, cpu());
    CHECK_THROWS_AS(m->forward(in), dew::Error);
    kv["num_classes"] = "0";
    auto u = make_model(plugin, kv, cpu());
    in["label"] = Tensor::from_ints({0, 0}, {2}, cpu());
    CHECK_NOTHROW(u->forward(in));
    in["label"] = Tensor::from_ints({1, 0}, {2}, cpu());
    CHECK_THROWS_WITH_AS(u->forward(in), doctest::Contains("unconditional"), dew::Error);
  }
}

TEST_CASE("options: bad shapes are refused by name") {
  CHECK_THROWS_WITH_AS(make_model("dit", {{"image_size", "30"}, {"patch", "4"}}, cpu()),
                       doctest::Contains("not a multiple of model.patch"), dew::UsageError);
  CHECK_THROWS_WITH_AS(make_model("dit", {{"dim", "30"}, {"heads", "4"}}, cpu()), doctest::Contains("model.heads"),
                       dew::UsageError);
  CHECK_THROWS_WITH_AS(make_model("unet", {{"image_size", "12"}, {"channels", "8,8,8,8"}}, cpu()),
                       doctest::Contains("2^(levels - 1)"), dew::UsageError);
  CHECK_THROWS_WITH_AS(make_model("unet", {{"attention_levels", "3"}}, cpu()), doctest::Contains("attention_levels"),
                       dew::UsageError);
  CHECK_THROWS_WITH_AS(make_model("dit", {{"time_embedding", "learned"}}, cpu()), doctest::Contains("time_embedding"),
                       dew::UsageError);
}

TEST_CASE("dit: a tiny model overfits one fixed batch with AdamW") {
  overfit("dit",
          {{"image_size", "8"},
           {"patch", "2"},
           {"dim", "64"},
           {"depth", "2"},
           {"heads", "2"},
           {"in_channels", "2"},
           {"num_classes", "2"}},
          2, 8, 2, 150, 20.0);
}

TEST_CASE("unet: a tiny model overfits one fixed batch with AdamW") {
  overfit("unet",
          {{"image_size", "8"},
           {"channels", "16,32"},
           {"res_blocks", "1"},
           {"groups", "4"},
           {"heads", "2"},
           {"in_channels", "2"}},
          2, 8, 0, 150, 20.0);
}
