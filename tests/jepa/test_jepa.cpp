// tests/jepa/test_jepa.cpp — I-JEPA: multi-block mask geometry and sampling, the vit_encoder and
// jepa_predictor backbones (token-order equivariance, cpu against ref), and the jepa objective (no
// gradient into the target encoder, targets from the EMA copy, the momentum schedule, collapse
// telemetry, the loss falling on a fixed batch). Backbones and objective run on ref (cpu where said).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "../../plugins/objectives/jepa/masks.hpp"
#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/data.hpp"
#include "dew/error.hpp"
#include "dew/model.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"

using dew::Tensor;
using namespace dew::jepa;

namespace {

void load_plugins() {
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "ref"))
    reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu", "vit", "jepa", "synthetic"});
}

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    load_plugins();
    return dew::create_backend("ref");
  }();
  dew::set_default_backend(be);
  return be;
}

const dew::BackendPtr& cpu() {
  static dew::BackendPtr be = [] {
    load_plugins();
    return dew::create_backend("cpu");
  }();
  dew::set_default_backend(be);
  return be;
}

MaskGeometry geometry(int64_t gh, int64_t gw, std::map<std::string, double> o = {}) {
  MaskSpec s;
  s.grid_h = gh;
  s.grid_w = gw;
  if (o.count("num_targets")) s.num_targets = int64_t(o["num_targets"]);
  if (o.count("ts0")) s.target_scale[0] = o["ts0"];
  if (o.count("ts1")) s.target_scale[1] = o["ts1"];
  if (o.count("ta0")) s.target_aspect[0] = o["ta0"];
  if (o.count("ta1")) s.target_aspect[1] = o["ta1"];
  if (o.count("cs0")) s.context_scale[0] = o["cs0"];
  if (o.count("ca1")) s.context_aspect[1] = o["ca1"];
  if (o.count("num_context")) s.num_context = int64_t(o["num_context"]);
  return resolve_masks(s);
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const dew::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// ---------------------------------------------------------------- masks

TEST_CASE("mask geometry resolves the I-JEPA block sizes") {
  // 7x7: target areas 8..9 (0.15*49 = 7.35, 0.2*49 = 9.8); only 9 = 3x3 has an admissible shape.
  MaskGeometry g = geometry(7, 7);
  CHECK(g.target_area == 9);
  REQUIRE(g.target_shapes.size() == 1);
  CHECK(g.target_shapes[0] == std::pair<int64_t, int64_t>{3, 3});
  CHECK(g.context_area == 49);  // scale 0.85..1 with aspect 1 on 7x7: only 7x7
  CHECK(g.num_context == 49 - 4 * 9);
  // 14x14: areas 30..39; 30 has two shapes (5x6, 6x5), more than any other.
  g = geometry(14, 14);
  CHECK(g.target_area == 30);
  CHECK(g.target_shapes.size() == 2);
  g = geometry(8, 8, {{"num_context", 5}});
  CHECK(g.target_area == 12);
  CHECK(g.num_context == 5);
}

TEST_CASE("masks: context and targets are disjoint, blocks within the scale and aspect ranges") {
  for (auto [gh, gw] : {std::pair<int64_t, int64_t>{7, 7}, {14, 14}, {12, 12}}) {
    const MaskGeometry g = geometry(gh, gw, {{"cs0", 0.6}, {"ca1", 1.5}});
    const int64_t s = gh * gw;
    std::set<std::pair<int64_t, int64_t>> shapes_seen;
    for (uint64_t pos = 0; pos < 300; ++pos) {
      const RecordMasks r = sample_masks(g, 7, pos);
      REQUIRE(int64_t(r.context.size()) == g.num_context);
      REQUIRE(int64_t(r.targets.size()) == g.num_targets * g.target_area);
      CHECK(std::is_sorted(r.context.begin(), r.context.end()));
      CHECK(std::adjacent_find(r.context.begin(), r.context.end()) == r.context.end());  // unique
      const std::set<int32_t> tset(r.targets.begin(), r.targets.end());
      for (int32_t c : r.context) {
        CHECK(tset.count(c) == 0);  // disjoint
        const int64_t y = c / gw, x = c % gw;
        const BlockPlacement& cb = r.context_block;  // context lies within its block
        CHECK((y >= cb.top && y < cb.top + cb.h && x >= cb.left && x < cb.left + cb.w));
      }
      for (int64_t m = 0; m < g.num_targets; ++m) {
        const BlockPlacement& b = r.target_blocks[size_t(m)];
        shapes_seen.insert({b.h, b.w});
        const double scale = double(b.h * b.w) / double(s), aspect = double(b.h) / double(b.w);
        CHECK(scale >= 0.15 - 1e-9);
        CHECK(scale <= 0.2 + 1e-9);
        CHECK(aspect >= 0.75 - 1e-9);
        CHECK(aspect <= 1.5 + 1e-9);
        CHECK(b.top + b.h <= gh);
        CHECK(b.left + b.w <= gw);
        // The block's tokens are exactly its rectangle, in raster order.
        for (int64_t i = 0; i < g.target_area; ++i) {
          const int32_t t = r.targets[size_t(m * g.target_area + i)];
          CHECK(t == int32_t((b.top + i / b.w) * gw + b.left + i % b.w));
        }
      }
    }
    CHECK(shapes_seen.size() == g.target_shapes.size());  // every admissible shape is drawn
  }
}

TEST_CASE("masks: the same seed and position give the same masks, others differ") {
  const MaskGeometry g = geometry(14, 14);
  const BatchMasks a = sample_batch_masks(g, 11, 1000, 8), b = sample_batch_masks(g, 11, 1000, 8);
  CHECK(a.context == b.context);
  CHECK(a.targets == b.targets);
  const BatchMasks c = sample_batch_masks(g, 12, 1000, 8), d = sample_batch_masks(g, 11, 1001, 8);
  CHECK(a.targets != c.targets);
  CHECK(a.context != c.context);
  // Row i of a batch starting at p is record p + i: shifting the start by one shifts the rows.
  const size_t ta = size_t(g.num_targets * g.target_area), ca = size_t(g.num_context);
  CHECK(std::vector<int32_t>(a.targets.begin() + ta, a.targets.end()) ==
        std::vector<int32_t>(d.targets.begin(), d.targets.end() - ta));
  CHECK(std::vector<int32_t>(a.context.begin() + ca, a.context.end()) ==
        std::vector<int32_t>(d.context.begin(), d.context.end() - ca));
}

TEST_CASE("masks: impossible geometry is refused with the reason") {
  std::string e = error_of([] { geometry(2, 2); });  // 0.6 .. 0.8 tokens
  CHECK(e.find("no whole number of tokens") != std::string::npos);
  e = error_of([] { geometry(7, 7, {{"ta0", 3.0}, {"ta1", 4.0}}); });
  CHECK(e.find("aspect ratio") != std::string::npos);
  e = error_of([] { geometry(7, 7, {{"num_targets", 6}}); });  // 6 x 9 > 49
  CHECK(e.find("leaving no context") != std::string::npos);
  e = error_of([] { geometry(7, 7, {{"num_context", 14}}); });  // only 13 guaranteed
  CHECK(e.find("num_context") != std::string::npos);
  e = error_of([] { geometry(7, 7, {{"ts0", 0.3}, {"ts1", 0.2}}); });
  CHECK(e.find("low <= high") != std::string::npos);
}

// ---------------------------------------------------------------- backbones

namespace {

std::shared_ptr<dew::Model> make_model(const std::string& plugin, std::map<std::string, std::string> kv) {
  dew::Options o(std::move(kv), "model");
  auto m = dew::Registry::global().create<dew::Model>(plugin, o);
  o.check_all_used();
  m->initialize(3);
  return m;
}

std::map<std::string, std::string> tiny_encoder() {
  return {{"image_size", "8"}, {"patch", "2"}, {"dim", "16"}, {"depth", "2"}, {"heads", "2"}};
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

}  // namespace

TEST_CASE("vit_encoder: parameter names, shapes and a full-image forward") {
  ref();
  auto enc = make_model("vit_encoder", tiny_encoder());
  std::map<std::string, dew::Shape> shapes;
  for (auto& [n, t] : enc->named_parameters()) shapes[n] = t.shape();
  CHECK(shapes.at("patch_embed.proj.weight") == dew::Shape{16, 1, 2, 2});
  CHECK(shapes.at("blocks.1.attn.q_proj.weight") == dew::Shape{16, 16});
  CHECK(shapes.at("blocks.0.mlp.fc1.weight") == dew::Shape{64, 16});
  CHECK(shapes.at("norm.weight") == dew::Shape{16});
  Tensor img = Tensor::normal({2, 1, 8, 8}, 0, 1, 9, 1, ref());
  Tensor y = enc->forward({{"image", img}});
  CHECK(y.shape() == dew::Shape{2, 16, 16});
}

TEST_CASE("vit_encoder: shuffling the token indices shuffles the encoding (positions travel with tokens)") {
  ref();
  auto enc = make_model("vit_encoder", tiny_encoder());
  Tensor img = Tensor::normal({2, 1, 8, 8}, 0, 1, 9, 2, ref());
  const std::vector<int32_t> idx = {0, 3, 5, 6, 9, 15, /* row 2 */ 1, 2, 4, 8, 11, 14};
  const std::vector<int> perm = {4, 0, 5, 2, 1, 3};  // output row j = input row perm[j]
  std::vector<int32_t> shuffled(idx.size());
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 6; ++j) shuffled[size_t(b * 6 + j)] = idx[size_t(b * 6 + perm[size_t(j)])];
  const std::vector<float> y1 =
      enc->forward({{"image", img}, {"token_idx", Tensor::from_ints(idx, {2, 6}, ref())}}).to_floats();
  const std::vector<float> y2 =
      enc->forward({{"image", img}, {"token_idx", Tensor::from_ints(shuffled, {2, 6}, ref())}}).to_floats();
  std::vector<float> expect(y1.size());
  for (int b = 0; b < 2; ++b)
    for (int j = 0; j < 6; ++j)
      for (int d = 0; d < 16; ++d)
        expect[size_t((b * 6 + j) * 16 + d)] = y1[size_t((b * 6 + perm[size_t(j)]) * 16 + d)];
  CHECK(max_abs_diff(y2, expect) < 1e-5);
  // Not trivially so: the encoding of a subset differs from the same rows of the full encoding, and the
  // same pixels at other positions encode differently.
  const std::vector<float> full = enc->forward({{"image", img}}).to_floats();
  CHECK(std::abs(double(full[size_t(3 * 16)]) - double(y1[size_t(1 * 16)])) > 1e-4);
  CHECK(max_abs_diff(y1, std::vector<float>(y1.size(), y1[0])) > 1e-3);
}

TEST_CASE("jepa_predictor: equivariant to the order of target blocks") {
  ref();
  auto pred =
      make_model("jepa_predictor", {{"embed_dim", "16"}, {"grid", "4"}, {"dim", "8"}, {"depth", "2"}, {"heads", "2"}});
  Tensor ctx = Tensor::normal({2, 5, 16}, 0, 1, 4, 1, ref());
  const std::vector<int32_t> cidx = {0, 1, 2, 3, 4, 5, 7, 8, 9, 10};
  // 3 blocks of 2 tokens per row; the second call lists the blocks in the order 2, 0, 1.
  const std::vector<int32_t> t1 = {6, 7, 12, 13, 14, 15, /* row 2 */ 0, 4, 11, 15, 2, 3};
  const std::vector<int> order = {2, 0, 1};
  std::vector<int32_t> t2(t1.size());
  for (int b = 0; b < 2; ++b)
    for (int m = 0; m < 3; ++m)
      for (int a = 0; a < 2; ++a) t2[size_t(b * 6 + m * 2 + a)] = t1[size_t(b * 6 + order[size_t(m)] * 2 + a)];
  auto run = [&](const std::vector<int32_t>& t) {
    Tensor y = pred->forward({{"context", ctx},
                              {"context_idx", Tensor::from_ints(cidx, {2, 5}, ref())},
                              {"target_idx", Tensor::from_ints(t, {2, 3, 2}, ref())}});
    CHECK(y.shape() == dew::Shape{2, 3, 2, 16});
    return y.to_floats();
  };
  const std::vector<float> y1 = run(t1), y2 = run(t2);
  std::vector<float> expect(y1.size());
  const size_t blk = 2 * 16;
  for (int b = 0; b < 2; ++b)
    for (int m = 0; m < 3; ++m)
      std::copy_n(y1.begin() + long((b * 3 + order[size_t(m)]) * blk), blk, expect.begin() + long((b * 3 + m) * blk));
  CHECK(max_abs_diff(y2, expect) < 1e-5);
  // Each block depends on its positions: two different blocks predict different embeddings.
  CHECK(max_abs_diff(std::vector<float>(y1.begin(), y1.begin() + long(blk)),
                     std::vector<float>(y1.begin() + long(blk), y1.begin() + long(2 * blk))) > 1e-4);
}

TEST_CASE("vit_encoder and jepa_predictor: cpu matches ref") {
  std::vector<std::vector<float>> outs;
  for (const dew::BackendPtr* be : {&ref(), &cpu()}) {
    dew::set_default_backend(*be);
    auto enc = make_model("vit_encoder", tiny_encoder());
    auto pred = make_model("jepa_predictor",
                           {{"embed_dim", "16"}, {"grid", "4"}, {"dim", "8"}, {"depth", "1"}, {"heads", "2"}});
    Tensor img = Tensor::normal({2, 1, 8, 8}, 0, 1, 9, 3, *be);
    Tensor cidx = Tensor::from_ints({0, 2, 5, 7, 1, 3, 9, 12}, {2, 4}, *be);
    Tensor z = enc->forward({{"image", img}, {"token_idx", cidx}});
    Tensor y = pred->forward({{"context", z},
                              {"context_idx", cidx},
                              {"target_idx", Tensor::from_ints({10, 11, 14, 15, 4, 5, 8, 9}, {2, 2, 2}, *be)}});
    outs.push_back(y.to_floats());
  }
  CHECK(max_abs_diff(outs[0], outs[1]) < 1e-4);
}

// ---------------------------------------------------------------- the objective

namespace {

const char* kConfig = R"(
[run]
seed = 5
[model]
plugin = vit_encoder
patch = 2
dim = 16
depth = 2
heads = 2
[predictor]
dim = 8
depth = 1
heads = 2
[objective]
plugin = jepa
momentum_steps = 10
[data]
source = synthetic
image_size = 16
size = 64
batch_size = 8
[trainer]
steps = 10
)";

struct Built {
  std::unique_ptr<dew::Config> config;
  std::shared_ptr<dew::DataSource> source;
  std::shared_ptr<dew::Objective> objective;
};

Built build(const dew::BackendPtr& be) {
  dew::set_default_backend(be);
  Built b;
  b.config = std::make_unique<dew::Config>(dew::Config::parse_ini(kConfig));
  dew::Options so({{"image_size", "16"}, {"size", "64"}, {"split", "train"}}, "data");
  b.source = dew::Registry::global().create<dew::DataSource>("synthetic", so);
  b.objective = dew::Registry::global().create<dew::Objective>("jepa", b.config->section("objective"));
  dew::ObjectiveContext ctx;
  ctx.config = b.config.get();
  ctx.backend = be;
  ctx.seed = 5;
  ctx.train_source = b.source.get();
  b.objective->build(ctx);
  return b;
}

dew::Batch batch_of(const dew::DataSource& src, int64_t first, int64_t n, const dew::BackendPtr& be) {
  std::vector<uint8_t> img;
  for (int64_t i = first; i < first + n; ++i) {
    const dew::Record r = src.get(i);
    const auto& a = r.at("image");
    img.insert(img.end(), a.as<uint8_t>(), a.as<uint8_t>() + a.numel());
  }
  return {{"image", Tensor::from_host(img.data(), {n, 16, 16, 1}, dew::DType::u8, be)}};
}

void fill(const dew::NamedTensors& ts, float v) {
  dew::NoGradGuard g;
  for (const auto& [n, t] : ts) {
    Tensor x = t;
    x.backend().fill(x, v);
  }
}

std::vector<float> flat(const dew::NamedTensors& ts) {
  std::vector<float> out;
  for (const auto& [n, t] : ts) {
    const auto v = t.to_floats();
    out.insert(out.end(), v.begin(), v.end());
  }
  return out;
}

}  // namespace

TEST_CASE("jepa: parameters, state and export names") {
  Built b = build(ref());
  const auto params = b.objective->parameters(), state = b.objective->state();
  CHECK(params.front().first == "encoder.patch_embed.proj.weight");
  CHECK(std::any_of(params.begin(), params.end(), [](auto& p) { return p.first == "predictor.mask_token"; }));
  CHECK(state.front().first == "target_encoder.patch_embed.proj.weight");
  CHECK(b.objective->export_parameters().front().first == "patch_embed.proj.weight");
  // A fresh target encoder is a copy of the context encoder.
  std::vector<float> enc;
  for (const auto& [n, t] : params)
    if (n.rfind("encoder.", 0) == 0) {
      auto v = t.to_floats();
      enc.insert(enc.end(), v.begin(), v.end());
    }
  CHECK(enc == flat(state));
}

TEST_CASE("jepa: no gradient reaches the target encoder") {
  Built b = build(ref());
  dew::StepResult r = b.objective->step(batch_of(*b.source, 0, 4, ref()), dew::StepInfo{0, 0, 5, 0});
  r.loss.backward();
  for (const auto& [n, t] : b.objective->state()) {
    CHECK_MESSAGE(!t.requires_grad(), n);
    CHECK_MESSAGE(!t.grad().defined(), n);
  }
  int64_t with_grad = 0;
  const auto params = b.objective->parameters();
  for (const auto& [n, t] : params)
    if (t.grad().defined() && dew::sum_squares(t.grad()).item() > 0) ++with_grad;
  CHECK(with_grad == int64_t(params.size()));  // the context encoder and the predictor all learn
}

TEST_CASE("jepa: targets come from the EMA copy, collapse telemetry flags a constant encoder") {
  const dew::StepInfo info{0, 0, 5, 0};
  Built b = build(ref());
  dew::StepResult fresh = b.objective->step(batch_of(*b.source, 0, 8, ref()), info);
  CHECK(fresh.metrics.at("collapse") == 0.0);
  CHECK(fresh.metrics.at("repr_std") > 0.01);
  CHECK(fresh.metrics.at("repr_cov_offdiag") > 0.0);
  // A constant online encoder leaves the targets (the EMA copy) as they were.
  std::vector<std::pair<std::string, Tensor>> online;
  for (const auto& p : b.objective->parameters())
    if (p.first.rfind("encoder.", 0) == 0) online.push_back(p);
  fill(online, 0.0f);
  dew::StepResult r = b.objective->step(batch_of(*b.source, 0, 8, ref()), info);
  CHECK(r.metrics.at("repr_std") == doctest::Approx(fresh.metrics.at("repr_std")).epsilon(1e-6));
  CHECK(r.metrics.at("collapse") == 0.0);
  // A constant target encoder collapses the targets: flagged.
  Built c = build(ref());
  fill(c.objective->state(), 0.0f);
  dew::StepResult z = c.objective->step(batch_of(*c.source, 0, 8, ref()), info);
  CHECK(z.metrics.at("repr_std") < 1e-6);
  CHECK(z.metrics.at("collapse") == 1.0);
  CHECK(z.loss.item() != doctest::Approx(fresh.loss.item()));  // and the loss reads those targets
}

TEST_CASE("jepa: momentum schedule endpoints and the EMA update of the target") {
  Built b = build(ref());
  std::vector<std::pair<std::string, Tensor>> online;
  for (const auto& p : b.objective->parameters())
    if (p.first.rfind("encoder.", 0) == 0) online.push_back(p);
  fill(online, 1.0f);  // online = 1 everywhere; the target keeps its initial values t0
  CHECK(b.objective->step(batch_of(*b.source, 0, 2, ref()), dew::StepInfo{0, 0, 5, 0}).metrics.at("momentum") ==
        doctest::Approx(0.996));
  CHECK(b.objective->step(batch_of(*b.source, 0, 2, ref()), dew::StepInfo{10, 0, 5, 0}).metrics.at("momentum") ==
        doctest::Approx(1.0));
  for (auto [step, m] : {std::pair<int64_t, double>{0, 0.996}, {5, 0.998}, {10, 1.0}, {25, 1.0}}) {
    const std::vector<float> t0 = flat(b.objective->state());
    b.objective->after_update(dew::StepInfo{step, 0, 5});
    const std::vector<float> t1 = flat(b.objective->state());
    double err = 0;
    for (size_t i = 0; i < t0.size(); ++i) err = std::max(err, std::abs(double(t1[i]) - (m * t0[i] + (1 - m) * 1.0)));
    CHECK_MESSAGE(err < 1e-6, "step ", step);
  }
}

TEST_CASE("jepa: the loss of a fresh model falls by more than 10% in 20 AdamW steps on a fixed batch") {
  Built b = build(cpu());
  const dew::Batch batch = batch_of(*b.source, 0, 8, cpu());
  const auto params = b.objective->parameters();
  dew::Options oo({{"name", "adamw"}, {"lr", "0.002"}, {"weight_decay", "0.05"}}, "optim");
  auto opt = dew::make_optimizer(oo, params);
  double first = 0, last = 0;
  for (int64_t s = 0; s < 20; ++s) {
    dew::StepResult r = b.objective->step(batch, dew::StepInfo{s, 0, 5, 0});
    const double l = r.loss.item();
    if (s == 0) first = l;
    last = l;
    r.loss.backward();
    {
      dew::NoGradGuard g;
      opt->update(2e-3f, 1.0f, s + 1);
    }
    for (auto& [n, p] : params) {
      Tensor t = p;
      t.zero_grad();
    }
    b.objective->after_update(dew::StepInfo{s + 1, 0, 5});
  }
  MESSAGE("loss ", first, " -> ", last);
  CHECK(first > 0.1);
  CHECK(last < 0.9 * first);
}
