// tests/classify/test_classify.cpp — the classifier slice on the ref backend: backbone shapes, parameter
// names and FLOPs; dew::create_model and used-key tracking; the classify objective's build (keys filled
// from the data), training by hand (plain SGD through the backend's sgd_update) and validate(), which must
// read every record of the split exactly once, also with a partial last batch and split over ranks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/data.hpp"
#include "dew/error.hpp"
#include "dew/model.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"

using dew::Tensor;

namespace {

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref"))
      reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "mlp", "convnet", "classify"});
    dew::BackendPtr b = dew::create_backend("ref");
    dew::set_default_backend(b);
    return b;
  }();
  return be;
}

std::shared_ptr<dew::Model> make_model(const std::string& plugin, std::map<std::string, std::string> kv) {
  ref();
  dew::Options o(std::move(kv), "model");
  auto m = dew::Registry::global().create<dew::Model>(plugin, o);
  o.check_all_used();
  return m;
}

// Images whose class is which horizontal band of the image is bright, plus deterministic noise.
class BandSource final : public dew::DataSource {
 public:
  BandSource(int64_t n, int64_t size = 8, int64_t classes = 3) : n_(n), size_(size), classes_(classes) {}
  int64_t size() const override { return n_; }
  dew::Record get(int64_t i) const override {
    const int32_t label = int32_t((i * 7 + 1) % classes_);
    dew::HostArray img = dew::HostArray::make(dew::DType::u8, {size_, size_, 1});
    uint64_t s = uint64_t(i) * 0x9E3779B97F4A7C15ull + 12345;
    for (int64_t y = 0; y < size_; ++y)
      for (int64_t x = 0; x < size_; ++x) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        const int noise = int((s >> 33) % 80);
        const bool bright = y * classes_ / size_ == label;
        img.as<uint8_t>()[y * size_ + x] = uint8_t(bright ? 170 + noise : noise);
      }
    return {{"image", img}, {"label", dew::HostArray::scalar_i32(label)}};
  }
  std::string identity() const override { return "test:bands," + std::to_string(n_); }

 private:
  int64_t n_, size_, classes_;
};

// A host batch of records [begin, begin + count) of a source, moved to ref.
dew::Batch batch_of(const dew::DataSource& src, int64_t begin, int64_t count) {
  const dew::Record r0 = src.get(0);
  const dew::Shape is = r0.at("image").shape;
  dew::Shape bs = {count};
  bs.insert(bs.end(), is.begin(), is.end());
  std::vector<uint8_t> img;
  std::vector<int32_t> lab;
  for (int64_t i = begin; i < begin + count; ++i) {
    const dew::Record r = src.get(i);
    const auto& a = r.at("image");
    img.insert(img.end(), a.bytes.begin(), a.bytes.end());
    lab.push_back(r.at("label").as<int32_t>()[0]);
  }
  return {{"image", Tensor::from_host(img.data(), bs, dew::DType::u8, ref())},
          {"label", Tensor::from_ints(lab, {count}, ref())}};
}

struct Built {
  dew::Config config;
  std::shared_ptr<dew::Objective> objective;
};

std::unique_ptr<Built> build_objective(const std::string& ini, const dew::DataSource* train, uint64_t seed = 1) {
  ref();
  auto b = std::make_unique<Built>();
  b->config = dew::Config::parse_ini(ini);
  dew::Options& os = b->config.section("objective");
  b->objective = dew::Registry::global().create<dew::Objective>(os.require_string("plugin"), os);
  dew::ObjectiveContext ctx;
  ctx.config = &b->config;
  ctx.backend = ref();
  ctx.seed = seed;
  ctx.train_source = train;
  b->objective->build(ctx);
  return b;
}

// Plain SGD by hand: loss.backward(), then p -= lr * grad through the backend's fused update.
double sgd_step(dew::Objective& obj, const dew::Batch& batch, float lr, double* accuracy = nullptr) {
  auto params = obj.parameters();
  for (auto& [n, p] : params) p.zero_grad();
  dew::StepResult r = obj.step(batch, {});
  const double loss = r.loss.item();
  if (accuracy) *accuracy = r.metrics.at("accuracy");
  r.loss.backward();
  dew::NoGradGuard ng;
  for (auto& [n, p] : params) {
    REQUIRE_MESSAGE(p.grad().defined(), n, " got no gradient");
    Tensor none;
    dew::SgdParams sp;
    sp.lr = lr;
    p.backend().sgd_update(p, p.grad(), none, sp);
  }
  return loss;
}

}  // namespace

TEST_CASE("mlp: shapes, HF-style parameter names, FLOPs, describe") {
  auto m = make_model(
      "mlp",
      {{"num_classes", "10"}, {"in_channels", "1"}, {"image_size", "28"}, {"hidden", "32,16"}, {"activation", "gelu"}});
  const auto named = m->named_parameters();
  REQUIRE(named.size() == 6);
  const std::vector<std::pair<std::string, dew::Shape>> want = {
      {"layers.0.weight", {32, 784}}, {"layers.0.bias", {32}},       {"layers.1.weight", {16, 32}},
      {"layers.1.bias", {16}},        {"layers.2.weight", {10, 16}}, {"layers.2.bias", {10}}};
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(named[i].first == want[i].first);
    CHECK(named[i].second.shape() == want[i].second);
  }
  Tensor x = Tensor::uniform({3, 1, 28, 28}, -1, 1, 7, 0, ref());
  Tensor y = m->forward({{"image", x}});
  CHECK(y.shape() == dew::Shape{3, 10});
  CHECK(m->flops_per_sample() == doctest::Approx(2.0 * (784 * 32 + 32 * 16 + 16 * 10)));
  CHECK(m->describe().at("hidden") == "32,16");
  CHECK(m->describe().at("activation") == "gelu");

  // The forward pass is the composition of ops it documents.
  auto p = [&](size_t i) { return named[i].second; };
  Tensor h = dew::reshape(x, {3, 784});
  h = dew::gelu(dew::linear(h, p(0), p(1)));
  h = dew::gelu(dew::linear(h, p(2), p(3)));
  h = dew::linear(h, p(4), p(5));
  const auto a = y.to_floats(), b = h.to_floats();
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-5));

  // Empty hidden: a linear classifier; in_features alone works.
  auto lin = make_model("mlp", {{"num_classes", "3"}, {"in_features", "5"}, {"hidden", ""}});
  CHECK(lin->named_parameters().size() == 2);
  CHECK(lin->forward({{"image", Tensor::zeros({2, 5}, dew::DType::f32, ref())}}).shape() == dew::Shape{2, 3});
}

TEST_CASE("mlp: option errors") {
  CHECK_THROWS_WITH_AS(make_model("mlp", {{"in_features", "4"}}), doctest::Contains("num_classes"), dew::UsageError);
  CHECK_THROWS_WITH_AS(make_model("mlp", {{"num_classes", "3"}, {"in_features", "4"}, {"activation", "tanh"}}),
                       doctest::Contains("relu, gelu or silu"), dew::UsageError);
  CHECK_THROWS_WITH_AS(make_model("mlp", {{"num_classes", "3"}}), doctest::Contains("input size"), dew::UsageError);
  CHECK_THROWS_WITH_AS(
      make_model("mlp", {{"num_classes", "3"}, {"in_features", "5"}, {"in_channels", "1"}, {"image_size", "2"}}),
      doctest::Contains("disagrees"), dew::UsageError);
  CHECK_THROWS_WITH_AS(make_model("mlp", {{"num_classes", "3"}, {"in_features", "4"}, {"hidden", "8,x"}}),
                       doctest::Contains("positive integers"), dew::UsageError);
  auto m = make_model("mlp", {{"num_classes", "3"}, {"in_features", "4"}});
  CHECK_THROWS_WITH(m->forward({{"image", Tensor::zeros({2, 5}, dew::DType::f32, ref())}}),
                    doctest::Contains("features per sample"));
}

TEST_CASE("convnet: shapes, parameter names, FLOPs, describe") {
  auto m = make_model(
      "convnet",
      {{"num_classes", "10"}, {"in_channels", "1"}, {"image_size", "28"}, {"channels", "8,16"}, {"groups", "4"}});
  const auto named = m->named_parameters();
  const std::vector<std::pair<std::string, dew::Shape>> want = {{"blocks.0.conv.weight", {8, 1, 3, 3}},
                                                                {"blocks.0.norm.weight", {8}},
                                                                {"blocks.0.norm.bias", {8}},
                                                                {"blocks.1.conv.weight", {8, 8, 3, 3}},
                                                                {"blocks.1.norm.weight", {8}},
                                                                {"blocks.1.norm.bias", {8}},
                                                                {"blocks.2.conv.weight", {16, 8, 3, 3}},
                                                                {"blocks.2.norm.weight", {16}},
                                                                {"blocks.2.norm.bias", {16}},
                                                                {"blocks.3.conv.weight", {16, 16, 3, 3}},
                                                                {"blocks.3.norm.weight", {16}},
                                                                {"blocks.3.norm.bias", {16}},
                                                                {"head.weight", {10, 16}},
                                                                {"head.bias", {10}}};
  REQUIRE(named.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    CHECK(named[i].first == want[i].first);
    CHECK(named[i].second.shape() == want[i].second);
  }
  Tensor y = m->forward({{"image", Tensor::uniform({2, 1, 28, 28}, -1, 1, 3, 0, ref())}});
  CHECK(y.shape() == dew::Shape{2, 10});
  // 28x28 -> (s1) 28x28x8 -> (s2) 14x14x8 -> (s1) 14x14x16 -> (s2) 7x7x16 -> pool -> 10.
  const double flops =
      2.0 * (28 * 28 * 8 * 1 * 9 + 14 * 14 * 8 * 8 * 9 + 14 * 14 * 16 * 8 * 9 + 7 * 7 * 16 * 16 * 9 + 16 * 10);
  CHECK(m->flops_per_sample() == doctest::Approx(flops));
  CHECK(m->describe().at("channels") == "8,16");
  CHECK(m->describe().at("image_size") == "28");

  // Non-square images and depth 0 (only the stride-2 blocks); groups are capped at the width.
  auto r = make_model(
      "convnet",
      {{"num_classes", "4"}, {"in_channels", "3"}, {"image_size", "12,8"}, {"channels", "4"}, {"depth", "0"}});
  CHECK(r->named_parameters().size() == 5);
  CHECK(r->forward({{"image", Tensor::zeros({1, 3, 12, 8}, dew::DType::f32, ref())}}).shape() == dew::Shape{1, 4});
  CHECK(r->flops_per_sample() == doctest::Approx(2.0 * (6 * 4 * 4 * 3 * 9 + 4 * 4)));
  CHECK_THROWS_WITH(r->forward({{"image", Tensor::zeros({1, 1, 12, 8}, dew::DType::f32, ref())}}),
                    doctest::Contains("[B, 3, H, W]"));
  CHECK_THROWS_WITH_AS(make_model("convnet", {{"num_classes", "4"}, {"channels", "12"}, {"groups", "8"}}),
                       doctest::Contains("GroupNorm groups"), dew::UsageError);

  // pool = flatten: the head sees every position of the last feature map.
  auto f = make_model("convnet", {{"num_classes", "10"},
                                  {"in_channels", "1"},
                                  {"image_size", "28"},
                                  {"channels", "8,16"},
                                  {"groups", "4"},
                                  {"pool", "flatten"}});
  CHECK(f->named_parameters().back().first == "head.bias");
  CHECK(f->named_parameters()[f->named_parameters().size() - 2].second.shape() == dew::Shape{10, 16 * 7 * 7});
  CHECK(f->flops_per_sample() == doctest::Approx(flops - 2.0 * 16 * 10 + 2.0 * 16 * 49 * 10));
  CHECK(f->forward({{"image", Tensor::zeros({2, 1, 28, 28}, dew::DType::f32, ref())}}).shape() == dew::Shape{2, 10});
  CHECK_THROWS_WITH(f->forward({{"image", Tensor::zeros({2, 1, 32, 32}, dew::DType::f32, ref())}}),
                    doctest::Contains("built for 28x28"));
  CHECK_THROWS_WITH_AS(make_model("convnet", {{"num_classes", "4"}, {"pool", "flatten"}}),
                       doctest::Contains("image_size"), dew::UsageError);
  CHECK_THROWS_WITH_AS(make_model("convnet", {{"num_classes", "4"}, {"pool", "max"}}),
                       doctest::Contains("avg or flatten"), dew::UsageError);
}

TEST_CASE("create_model: the [model] section's plugin, keys marked used in the config") {
  ref();
  dew::Config c = dew::Config::parse_ini("[model]\nplugin = mlp\nnum_classes = 3\nin_features = 4\nhidden = 8\n");
  auto m = dew::create_model(c.section("model"));
  CHECK(m->forward({{"image", Tensor::zeros({2, 4}, dew::DType::f32, ref())}}).shape() == dew::Shape{2, 3});
  CHECK_NOTHROW(c.check_all_used());

  dew::Config typo = dew::Config::parse_ini("[model]\nplugin = mlp\nnum_classes = 3\nin_features = 4\nhiden = 8\n");
  dew::create_model(typo.section("model"));
  CHECK_THROWS_WITH_AS(typo.check_all_used(), doctest::Contains("hiden"), dew::UsageError);

  dew::Config none = dew::Config::parse_ini("[model]\nnum_classes = 3\n");
  CHECK_THROWS_WITH_AS(dew::create_model(none.section("model")), doctest::Contains("model.plugin"), dew::UsageError);
  dew::Config unknown = dew::Config::parse_ini("[model]\nplugin = nope\n");
  CHECK_THROWS_WITH(dew::create_model(unknown.section("model")), doctest::Contains("convnet"));  // lists the known
}

TEST_CASE("classify: build fills the model keys from the data, parameters are prefixed") {
  BandSource src(30);
  auto b =
      build_objective("[objective]\nplugin = classify\n[model]\nplugin = convnet\nchannels = 8\ngroups = 4\n", &src);
  dew::Options& model = b->config.section("model");
  CHECK(model.values().at("num_classes") == "3");  // labels 0..2 in the source
  CHECK(model.values().at("in_channels") == "1");
  CHECK(model.values().at("image_size") == "8");
  CHECK_NOTHROW(b->config.check_all_used());
  const auto params = b->objective->parameters();
  REQUIRE(!params.empty());
  CHECK(params.front().first == "model.blocks.0.conv.weight");
  CHECK(params.back().first == "model.head.bias");
  for (const auto& [n, t] : params) CHECK(n.rfind("model.", 0) == 0);
  CHECK(b->objective->batch_fields() == std::vector<std::string>{"image", "label"});
  CHECK(b->objective->primary_metric() == "accuracy");
  CHECK(b->objective->higher_is_better());
  REQUIRE(b->objective->main_model() != nullptr);
  CHECK(b->objective->train_flops_per_sample() ==
        doctest::Approx(3.0 * b->objective->main_model()->flops_per_sample()));
  CHECK(b->objective->train_flops_per_sample() > 0);

  // Keys the config gives win; objective.num_classes is used when the model section has none.
  auto c =
      build_objective("[objective]\nplugin = classify\nnum_classes = 5\n[model]\nplugin = mlp\nhidden = 4\n", &src);
  CHECK(c->config.section("model").values().at("num_classes") == "5");
  CHECK_NOTHROW(c->config.check_all_used());

  // The seed decides the initial weights.
  auto s1 = build_objective("[objective]\nplugin = classify\n[model]\nplugin = mlp\nhidden = 4\n", &src, 1);
  auto s2 = build_objective("[objective]\nplugin = classify\n[model]\nplugin = mlp\nhidden = 4\n", &src, 2);
  CHECK(s1->objective->parameters()[0].second.to_floats() != s2->objective->parameters()[0].second.to_floats());

  // No source and no class count: one clear error.
  CHECK_THROWS_WITH_AS(
      build_objective("[objective]\nplugin = classify\n[model]\nplugin = mlp\nin_features = 4\n", nullptr),
      doctest::Contains("number of classes"), dew::UsageError);
}

TEST_CASE("classify: step preprocesses u8 NHWC to normalised NCHW f32 and reports accuracy") {
  BandSource src(8);
  auto b = build_objective("[objective]\nplugin = classify\n[model]\nplugin = mlp\nhidden = \n", &src);
  dew::Batch batch = batch_of(src, 0, 4);
  dew::StepResult r = b->objective->step(batch, {});
  CHECK(r.samples == 4);
  CHECK(r.loss.numel() == 1);
  CHECK(r.loss.requires_grad());
  const double acc = r.metrics.at("accuracy");
  CHECK((acc >= 0.0 && acc <= 1.0));
  CHECK(std::fabs(acc * 4 - std::round(acc * 4)) < 1e-12);

  // The same logits by hand: x = (u8 / 255 - 0.5) / 0.5 laid out [B, C, H, W], flattened, one Linear.
  const auto params = b->objective->parameters();
  const std::vector<int32_t> img = batch.at("image").to_ints();
  std::vector<float> x(img.size());
  for (size_t i = 0; i < img.size(); ++i) x[i] = (float(img[i]) / 255.0f - 0.5f) / 0.5f;  // C = 1: NHWC == NCHW
  Tensor logits = dew::linear(Tensor::from_vector(x, {4, 64}, ref()), params[0].second, params[1].second);
  Tensor want = dew::cross_entropy(logits, batch.at("label"));
  CHECK(r.loss.item() == doctest::Approx(want.item()).epsilon(1e-5));

  // A label past the class count is refused before any kernel reads it.
  dew::Batch bad = batch;
  bad["label"] = Tensor::from_ints({0, 1, 2, 3}, {4}, ref());
  CHECK_THROWS_WITH(b->objective->step(bad, {}), doctest::Contains("outside [0, 3)"));
}

TEST_CASE("classify: SGD by hand lowers the loss (mlp and convnet)") {
  BandSource src(24);
  const dew::Batch batch = batch_of(src, 0, 24);
  for (const char* model : {"plugin = mlp\nhidden = 16\n", "plugin = convnet\nchannels = 8\ngroups = 4\n"}) {
    CAPTURE(model);
    auto b = build_objective(std::string("[objective]\nplugin = classify\n[model]\n") + model, &src);
    double first = 0, last = 0, acc = 0;
    for (int i = 0; i < 30; ++i) {
      const double l = sgd_step(*b->objective, batch, 0.1f, &acc);
      REQUIRE(std::isfinite(l));
      if (i == 0) first = l;
      last = l;
    }
    CHECK(last < 0.5 * first);
    CHECK(acc == doctest::Approx(1.0));
  }
}

namespace {
// The per-record loss and hit of the objective's model, one record at a time (no batching involved).
void one_by_one(dew::Objective& obj, const dew::DataSource& src, double& loss, double& accuracy) {
  dew::NoGradGuard ng;
  loss = 0;
  int64_t hits = 0;
  for (int64_t i = 0; i < src.size(); ++i) {
    dew::StepResult r = obj.step(batch_of(src, i, 1), {});
    loss += r.loss.item();
    hits += r.metrics.at("accuracy") > 0.5;
  }
  loss /= double(src.size());
  accuracy = double(hits) / double(src.size());
}
}  // namespace

TEST_CASE("classify: validate reads every record exactly once (partial last batch, ranks)") {
  auto src = std::make_shared<BandSource>(10);
  auto b = build_objective("[objective]\nplugin = classify\n[model]\nplugin = mlp\nhidden = 6\n", src.get());
  // Train a little so that accuracy is neither 0 nor 1 by construction.
  const dew::Batch batch = batch_of(*src, 0, 10);
  for (int i = 0; i < 2; ++i) sgd_step(*b->objective, batch, 0.05f);
  double want_loss = 0, want_acc = 0;
  one_by_one(*b->objective, *src, want_loss, want_acc);

  for (int64_t bs : {1, 3, 4, 10, 16}) {
    CAPTURE(bs);
    dew::LoaderConfig lc;
    lc.batch_size = bs;
    lc.shuffle = false;
    lc.workers = 1;
    dew::DataLoader loader(src, lc);
    dew::ValidationResult v = b->objective->validate(loader, {});
    CHECK(v.metrics.at("loss") == doctest::Approx(want_loss).epsilon(1e-5));
    CHECK(v.metrics.at("accuracy") == doctest::Approx(want_acc));
    CHECK(loader.position().next == (10 + bs - 1) / bs * bs);  // exactly ceil(n / B) batches consumed
    CHECK(dew::grad_enabled());                                // the guard inside validate() is gone
  }

  // Two ranks with batch 2: global batches of 4 over 10 records; rank 0 reads 6, rank 1 reads 4.
  double loss_sum = 0, hit_sum = 0;
  const int64_t expect_rows[2] = {6, 4};
  for (int rank = 0; rank < 2; ++rank) {
    dew::LoaderConfig lc;
    lc.batch_size = 2;
    lc.shuffle = false;
    lc.rank = rank;
    lc.world = 2;
    dew::DataLoader loader(src, lc);
    dew::ValidationResult v = b->objective->validate(loader, {});
    loss_sum += v.metrics.at("loss") * double(expect_rows[rank]);
    hit_sum += v.metrics.at("accuracy") * double(expect_rows[rank]);
  }
  CHECK(loss_sum / 10 == doctest::Approx(want_loss).epsilon(1e-5));
  CHECK(hit_sum / 10 == doctest::Approx(want_acc));
}
