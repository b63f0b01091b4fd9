// tests/jepa/test_probes.cpp — dew/probes.hpp on the ref backend: k-NN votes (weighted and majority,
// cosine similarity, centred/standardised features), the linear probe (separable data is learnt, random
// labels are not, the fit is deterministic; L-BFGS fits correlated features the AdamW fit underfits and
// reaches the closed-form optimum of a heavily penalised fit), standardisation, and collect_features
// reading each record once with its label.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/data.hpp"
#include "dew/ops.hpp"
#include "dew/probes.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"

using dew::Tensor;
namespace probes = dew::probes;

namespace {

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref")) reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "synthetic"});
    dew::BackendPtr b = dew::create_backend("ref");
    dew::set_default_backend(b);
    return b;
  }();
  return be;
}

probes::Features features(const std::vector<float>& x, int64_t d, std::vector<int32_t> labels) {
  return {Tensor::from_vector(x, {int64_t(labels.size()), d}, ref()), std::move(labels)};
}

// n points per class around class centres on well separated directions, plus noise.
probes::Features blobs(int64_t n, int64_t classes, int64_t d, uint64_t seed, double noise) {
  std::vector<float> x;
  std::vector<int32_t> y;
  uint64_t k = 0;
  for (int64_t i = 0; i < n * classes; ++i) {
    const int32_t c = int32_t(i % classes);
    for (int64_t j = 0; j < d; ++j)
      x.push_back(float((j % classes == c ? 2.0 : 0.0) + noise * dew::philox::normal(seed, 1, k++)));
    y.push_back(c);
  }
  return features(x, d, y);
}

}  // namespace

TEST_CASE("knn probe: cosine similarity, weighted and majority votes") {
  // Test point along (1, 0). One class-0 neighbour almost parallel (cos 0.995), two class-1 neighbours
  // at cos ~0.6 (with larger norms: cosine, not distance, decides).
  probes::Features train = features({1.0f, 0.1f, 3.0f, 4.0f, 6.0f, 8.1f, -1.0f, 0.0f}, 2, {0, 1, 1, 2});
  probes::Features test = features({5.0f, 0.0f}, 2, {0});
  probes::KnnOptions o;
  o.k = 3;
  o.weighted = true;
  o.temperature = 0.07;
  CHECK(probes::knn_probe(train, test, o) == 1.0);  // exp(0.995/0.07) outweighs 2 x exp(0.6/0.07)
  o.weighted = false;
  CHECK(probes::knn_probe(train, test, o) == 0.0);  // the majority says class 1
  o.k = 1;
  CHECK(probes::knn_probe(train, test, o) == 1.0);
  // Separable blobs are classified perfectly; shuffled labels are not.
  probes::Features a = blobs(30, 3, 6, 1, 0.3), b = blobs(20, 3, 6, 2, 0.3);
  CHECK(probes::knn_probe(a, b, {}) == 1.0);
  probes::Features wrong = b;
  for (auto& l : wrong.labels) l = (l + 1) % 3;
  CHECK(probes::knn_probe(a, wrong, {}) == 0.0);
}

TEST_CASE("linear probe: learns separable classes, not random labels, deterministically") {
  probes::Features a = blobs(50, 4, 8, 3, 0.5), b = blobs(50, 4, 8, 4, 0.5);
  probes::LinearProbeOptions o;
  o.epochs = 30;
  o.batch_size = 32;
  const probes::LinearProbeResult r = probes::linear_probe(a, b, o);
  CHECK(r.test_accuracy > 0.97);
  CHECK(r.train_accuracy > 0.97);
  CHECK(r.train_loss < 0.2);
  const probes::LinearProbeResult again = probes::linear_probe(a, b, o);
  CHECK(again.test_accuracy == r.test_accuracy);
  CHECK(again.train_loss == r.train_loss);
  {
    dew::NoGradGuard no_grad;  // as during `dew-run eval`: the fit turns gradients back on for itself
    CHECK(probes::linear_probe(a, b, o).train_loss == r.train_loss);
    CHECK(!dew::grad_enabled());
  }
  // Labels that carry no information: chance level on the test split (1/4, generous margin).
  probes::Features ra = a, rb = b;
  for (size_t i = 0; i < ra.labels.size(); ++i) ra.labels[i] = int32_t(dew::philox::uniform(9, 1, i) * 4);
  for (size_t i = 0; i < rb.labels.size(); ++i) rb.labels[i] = int32_t(dew::philox::uniform(9, 2, i) * 4);
  CHECK(probes::linear_probe(ra, rb, o).test_accuracy < 0.4);
}

// Strongly correlated features (what pooled ViT features look like): every dimension is a shared
// nuisance z_i ~ N(0, 1) plus a small class signal eps * (2 [j % classes == c] + noise). After
// per-dimension standardisation the class lives in directions of variance ~eps^2: the fixed-budget
// AdamW fit cannot grow weights of ~1/eps and stays near chance on the training data, L-BFGS
// (preconditioned by the features' second moment) separates the classes.
probes::Features correlated(int64_t n, int64_t classes, int64_t d, uint64_t seed, double eps) {
  std::vector<float> x;
  std::vector<int32_t> y;
  uint64_t k = 0;
  for (int64_t i = 0; i < n * classes; ++i) {
    const int32_t c = int32_t(i % classes);
    const double z = dew::philox::normal(seed, 7, uint64_t(i));
    for (int64_t j = 0; j < d; ++j)
      x.push_back(float(z + eps * ((j % classes == c ? 2.0 : 0.0) + 0.5 * dew::philox::normal(seed, 1, k++))));
    y.push_back(c);
  }
  return features(x, d, y);
}

TEST_CASE("linear probe: L-BFGS fits correlated features that the fixed-budget AdamW fit underfits") {
  probes::Features a = correlated(100, 4, 8, 5, 0.01), b = correlated(100, 4, 8, 6, 0.01);
  probes::LinearProbeOptions old;
  old.solver = "adamw";
  const probes::LinearProbeResult r_old = probes::linear_probe(a, b, old);
  CHECK(r_old.train_accuracy < 0.7);
  const probes::LinearProbeResult r = probes::linear_probe(a, b, {});
  CHECK(r.train_accuracy > 0.97);
  CHECK(r.test_accuracy > 0.95);
  CHECK(r.converged);
  // The weight decay was chosen among the grid on held-out rows, and the choice is deterministic.
  const std::vector<double> grid = probes::LinearProbeOptions{}.weight_decays;
  CHECK(std::find(grid.begin(), grid.end(), r.weight_decay) != grid.end());
  CHECK(r.holdout_accuracy > 0.9);
  const probes::LinearProbeResult again = probes::linear_probe(a, b, {});
  CHECK(again.weight_decay == r.weight_decay);
  CHECK(again.train_loss == r.train_loss);
  CHECK(again.test_accuracy == r.test_accuracy);
}

TEST_CASE("linear probe: L-BFGS reaches the optimum of the penalised loss") {
  // With a heavy L2 penalty the weights vanish and the optimum is the class prior: the mean
  // cross-entropy is the entropy of the label frequencies (here 1/2, 1/4, 1/4 -> 1.5 ln 2).
  probes::Features a = blobs(40, 4, 6, 11, 0.5);
  for (size_t i = 0; i < a.labels.size(); ++i) a.labels[i] = i % 4 == 3 ? 0 : int32_t(i % 4);
  probes::LinearProbeOptions o;
  o.weight_decays = {};
  o.weight_decay = 1e6;
  o.tolerance = 1e-7;
  const probes::LinearProbeResult heavy = probes::linear_probe(a, a, o);
  CHECK(heavy.train_loss == doctest::Approx(1.5 * std::log(2.0)).epsilon(1e-5));
  CHECK(heavy.train_accuracy == doctest::Approx(0.5));  // everything is the majority class 0
  // The preconditioner changes the path, not the optimum; nor does warm starting along a grid.
  probes::Features c = blobs(30, 3, 5, 12, 1.5), t = blobs(30, 3, 5, 13, 1.5);
  o.weight_decay = 1e-2;
  const probes::LinearProbeResult p = probes::linear_probe(c, t, o);
  o.precondition = false;
  const probes::LinearProbeResult q = probes::linear_probe(c, t, o);
  CHECK(p.converged);
  CHECK(q.converged);
  CHECK(p.train_loss == doctest::Approx(q.train_loss).epsilon(1e-5));
  CHECK(p.test_accuracy == q.test_accuracy);
  o.precondition = true;
  o.weight_decays = {1e-2, 1.0};  // held-out choice; with the same pick the refit lands on the same optimum
  const probes::LinearProbeResult g = probes::linear_probe(c, t, o);
  if (g.weight_decay == 1e-2) CHECK(g.train_loss == doctest::Approx(p.train_loss).epsilon(1e-5));
  // Bad options are refused.
  o.solver = "sgd";
  CHECK_THROWS_AS(probes::linear_probe(c, t, o), dew::UsageError);
}

TEST_CASE("knn probe: centring and standardisation before the cosine") {
  // A large shared offset (100, 100); the class moves a point along it (+-1 on both features), a nuisance
  // across it (n, -n). The raw cosine sees only the angle, i.e. the nuisance: near chance. Centred (or
  // standardised) features point along +(1, 1) or -(1, 1) by class.
  std::vector<float> xa, xb;
  std::vector<int32_t> ya, yb;
  for (int i = 0; i < 40; ++i) {
    const int c = i % 2;
    const float s = c ? 1.0f : -1.0f;
    const float na = float(0.3 * dew::philox::normal(3, 1, uint64_t(i)));
    const float nb = float(0.3 * dew::philox::normal(3, 2, uint64_t(i)));
    xa.insert(xa.end(), {100.0f + s + na, 100.0f + s - na});
    xb.insert(xb.end(), {100.0f + s + nb, 100.0f + s - nb});
    ya.push_back(c);
    yb.push_back(c);
  }
  probes::Features a = features(xa, 2, ya), b = features(xb, 2, yb);
  probes::KnnOptions o;
  o.k = 5;
  CHECK(probes::knn_probe(a, b, o) < 0.75);
  o.normalize = "center";
  CHECK(probes::knn_probe(a, b, o) == 1.0);
  o.normalize = "standardize";
  CHECK(probes::knn_probe(a, b, o) == 1.0);
  o.normalize = "whiten";
  CHECK_THROWS_AS(probes::knn_probe(a, b, o), dew::UsageError);
}

TEST_CASE("standardize uses the statistics of the fit set") {
  Tensor fit = Tensor::from_vector({1, 10, 3, 30, 5, 50}, {3, 2}, ref());
  const std::vector<float> z = probes::standardize(fit, fit).to_floats();
  CHECK(z[0] == doctest::Approx(-1.2247).epsilon(1e-3));  // (1 - 3) / sqrt(8/3)
  CHECK(z[2] == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(z[5] == doctest::Approx(1.2247).epsilon(1e-3));
  const std::vector<float> o = probes::standardize(Tensor::from_vector({3, 50}, {1, 2}, ref()), fit).to_floats();
  CHECK(o[0] == doctest::Approx(0.0).epsilon(1e-6));
  CHECK(o[1] == doctest::Approx(1.2247).epsilon(1e-3));
}

TEST_CASE("collect_features reads each record once, in stream order, with its label") {
  ref();
  std::map<std::string, std::string> kv{
      {"source", "synthetic"}, {"size", "50"}, {"batch_size", "16"}, {"image_size", "4"}, {"shuffle", "false"}};
  dew::Options data(kv, "data");
  auto loader = dew::make_loader(data, "val", 0);
  auto embed = [](const dew::Batch& b) {
    Tensor img = dew::cast(b.at("image"), dew::DType::f32);
    return dew::reshape(img, {img.shape()[0], 16});
  };
  probes::Features f = probes::collect_features(*loader, 40, embed, ref());
  REQUIRE(f.size() == 40);
  CHECK(f.x.shape() == dew::Shape{40, 16});
  const std::vector<float> x = f.x.to_floats();
  for (int64_t i : {0, 17, 39}) {
    const dew::Record r = loader->source().get(i);
    CHECK(f.labels[size_t(i)] == r.at("label").as<int32_t>()[0]);
    CHECK(x[size_t(i * 16 + 5)] == float(r.at("image").as<uint8_t>()[5]));
  }
  auto all = dew::make_loader(data, "val", 0);
  CHECK(probes::collect_features(*all, 0, embed, ref()).size() == 50);  // 0 = the whole source, capped
}
