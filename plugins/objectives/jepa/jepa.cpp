// jepa.cpp — the `jepa` objective: I-JEPA (Assran et al. 2023) on images, with probes as metrics.
//
// Modules: the context encoder ([model], e.g. vit_encoder; trained), the predictor ([predictor],
// default jepa_predictor; trained) and the target encoder (same shape as the context encoder; never
// trained: an EMA of the context encoder with momentum rising linearly from momentum[0] to momentum[1]
// over momentum_steps updates (default trainer.steps), applied in after_update()).
// step(): image u8 [B, H, W, C] -> f32 [B, C, H, W], (x/255 - mean)/std; multi-block masks from (run seed,
// record position) (masks.hpp); targets = LayerNorm without affine (eps 1e-6) of the target encoder's
// embeddings of the whole image, gathered at the target blocks, computed without gradients; prediction =
// predictor(context encoder(context tokens)); loss = mean squared error over every target token and
// feature. Health metrics of each batch (pooled = the targets averaged over all tokens of an image):
// repr_std = mean over features of the batch std, repr_cov_offdiag = sqrt(mean of squared off-diagonal
// covariances), collapse = 1 when repr_std < collapse_std; also `momentum`.
// Parameters: encoder.*, predictor.*; state (checkpointed, not trained): target_encoder.*.
// validate(): the JEPA loss on val_batches batches of the split, then (probe_at_validation) k-NN and
// linear probes of the probe encoder (target by default) on val_probe_train_samples training records
// and val_probe_test_samples records of the split. evaluate() (`dew-run eval`): the same probes on
// larger subsets for the trained encoder and, with --baselines (default true), for a freshly initialised
// encoder of the same shape (the run's step-0 weights) and for raw pixels, as one flat map
// ("trained.knn_accuracy", "random.linear_accuracy", "pixels.knn_accuracy", ...). Probe defaults: k-NN on
// standardised features (k 20, exp(sim / 0.07) votes); linear = L-BFGS softmax regression with its L2
// chosen on held-out training records (dew/probes.hpp).
// Export writes the probe encoder alone, under the backbone's own parameter names.
#include <algorithm>
#include <cmath>
#include <dew/autograd.hpp>
#include <dew/error.hpp>
#include <dew/objective.hpp>
#include <dew/probes.hpp>
#include <dew/registry.hpp>
#include <dew/train.hpp>  // lerp_towards
#include <string>

#include "masks.hpp"

namespace {

using dew::Tensor;

std::pair<double, double> pair_option(const dew::Options& o, const std::string& key, std::pair<double, double> dflt) {
  const std::vector<double> v = o.get_doubles(key, {dflt.first, dflt.second});
  DEW_USAGE_CHECK(v.size() == 2, "option 'objective.", key, "' must be two numbers 'low, high', got ", v.size());
  return {v[0], v[1]};
}

const Tensor& field(const dew::Batch& b, const char* name) {
  auto it = b.find(name);
  DEW_CHECK(it != b.end(), "jepa: the batch has no '", name, "' field");
  return it->second;
}

struct ProbeSettings {
  int64_t train_samples = 10000, test_samples = 10000;
  dew::probes::KnnOptions knn;
  dew::probes::LinearProbeOptions linear;
};

class Jepa final : public dew::Objective {
 public:
  explicit Jepa(const dew::Options& o) { read_options(o); }

  void build(dew::ObjectiveContext& ctx) override {
    DEW_CHECK(ctx.config != nullptr, "jepa: build() needs the run config");
    config_ = ctx.config;
    read_options(ctx.config->section("objective"));
    backend_ = ctx.backend ? ctx.backend : dew::default_backend();
    dew::set_default_backend(backend_);
    seed_ = ctx.seed;
    steps_ = ctx.config->section("trainer").get_int("steps", 0);
    if (momentum_steps_ <= 0) momentum_steps_ = steps_ > 0 ? steps_ : 1;

    dew::Options& model = ctx.config->section("model");
    if (ctx.train_source && ctx.train_source->size() > 0) {
      const dew::Record first = ctx.train_source->get(0);
      auto it = first.find("image");
      DEW_USAGE_CHECK(it != first.end(), "jepa: the training source ", ctx.train_source->identity(),
                      " has no 'image' field");
      const dew::Shape& s = it->second.shape;
      DEW_USAGE_CHECK(s.size() == 2 || s.size() == 3, "jepa: an 'image' record must be [H, W, C] or [H, W], got ",
                      dew::shape_str(s));
      if (!model.has("in_channels")) model.set("in_channels", std::to_string(s.size() == 3 ? s[2] : 1));
      if (!model.has("image_size"))
        model.set("image_size",
                  s[0] == s[1] ? std::to_string(s[0]) : std::to_string(s[0]) + "," + std::to_string(s[1]));
    }
    DEW_USAGE_CHECK(model.has("image_size"), "jepa: the image size is unknown: set 'model.image_size'");
    encoder_ = dew::create_model(model);
    encoder_->initialize(seed_);
    dew::Options target_options(model.values(), model.context());
    target_ = dew::create_model(target_options);
    {
      dew::NoGradGuard no_grad;
      auto src = encoder_->named_parameters(), dst = target_->named_parameters();
      for (size_t i = 0; i < src.size(); ++i) {
        dst[i].second.copy_(src[i].second);
        dst[i].second.set_requires_grad(false);
      }
    }
    // The patch grid and width, from what the encoder reports about itself.
    const auto d = encoder_->describe();
    DEW_CHECK(d.count("dim") && d.count("image_size") && d.count("patch"), "jepa: the [model] backbone '",
              model.values().at("plugin"), "' does not describe dim, image_size and patch (use vit_encoder)");
    embed_dim_ = std::stoll(d.at("dim"));
    const std::string is = d.at("image_size");
    const int64_t h = std::stoll(is.substr(0, is.find(','))), w = std::stoll(is.substr(is.find(',') + 1));
    const int64_t patch = std::stoll(d.at("patch"));
    grid_h_ = h / patch;
    grid_w_ = w / patch;
    image_h_ = h;
    image_w_ = w;
    channels_ = std::stoll(d.at("in_channels"));
    encoder_depth_ = d.count("depth") ? std::stoll(d.at("depth")) : 0;
    encoder_mlp_ = d.count("mlp_ratio") ? std::stod(d.at("mlp_ratio")) : 4.0;
    patch_ = patch;

    dew::Options& pred = ctx.config->section("predictor");
    if (!pred.has("plugin")) pred.set("plugin", "jepa_predictor");
    pred.set("embed_dim", std::to_string(embed_dim_));
    pred.set("grid", std::to_string(grid_h_) + "," + std::to_string(grid_w_));
    predictor_ = dew::create_model(pred);
    predictor_->initialize(seed_);
    const auto pd = predictor_->describe();
    pred_dim_ = pd.count("dim") ? std::stoll(pd.at("dim")) : 0;
    pred_depth_ = pd.count("depth") ? std::stoll(pd.at("depth")) : 0;

    spec_.grid_h = grid_h_;
    spec_.grid_w = grid_w_;
    geometry_ = dew::jepa::resolve_masks(spec_);
  }

  std::vector<std::string> batch_fields() const override { return {"image"}; }

  dew::NamedTensors parameters() override {
    DEW_CHECK(encoder_, "jepa: parameters() before build()");
    dew::NamedTensors out;
    for (auto& [n, t] : encoder_->named_parameters()) out.emplace_back("encoder." + n, t);
    for (auto& [n, t] : predictor_->named_parameters()) out.emplace_back("predictor." + n, t);
    return out;
  }

  dew::NamedTensors state() override {
    DEW_CHECK(target_, "jepa: state() before build()");
    dew::NamedTensors out;
    for (auto& [n, t] : target_->named_parameters()) out.emplace_back("target_encoder." + n, t);
    return out;
  }

  dew::NamedTensors export_parameters() override {
    DEW_CHECK(encoder_, "jepa: export before build()");
    return probe_encoder().named_parameters();
  }

  dew::Model* main_model() override { return encoder_.get(); }
  std::string lora_unsupported_reason() const override {
    return "jepa moves its target encoder towards the encoder's weights after every update (an EMA), which "
           "adapters cannot express; fine-tune the encoder whole, or freeze parts of it with optim.freeze";
  }

  double momentum_at(int64_t updates) const {
    const double t = std::clamp(double(updates) / double(momentum_steps_), 0.0, 1.0);
    return momentum_.first + (momentum_.second - momentum_.first) * t;
  }

  void after_update(const dew::StepInfo& info) override {
    dew::NoGradGuard no_grad;
    const float m = float(momentum_at(info.step));
    if (m >= 1.0f) return;
    // target += (1 - m) * (encoder - target)
    std::vector<Tensor> averages, targets;
    for (const auto& [name, t] : target_->named_parameters()) averages.push_back(t);
    for (const auto& [name, p] : encoder_->named_parameters()) targets.push_back(p);
    dew::lerp_towards(averages, targets, 1.0f - m);
  }

  dew::StepResult step(const dew::Batch& batch, const dew::StepInfo& info) override {
    DEW_CHECK(encoder_, "jepa: step() before build()");
    encoder_->set_training(true);
    predictor_->set_training(true);
    const Tensor x = preprocess(field(batch, "image"));
    const int64_t b = x.shape()[0];
    // Masks keyed by the record position; without one (tests, tools) by the update and micro-batch.
    const uint64_t position =
        info.position >= 0 ? uint64_t(info.position) : (uint64_t(info.step) * 64 + uint64_t(info.micro)) * uint64_t(b);
    dew::StepResult r;
    r.loss = loss(x, info.seed, position, &r.metrics);
    r.metrics["momentum"] = momentum_at(info.step);
    r.samples = b;
    return r;
  }

  dew::ValidationResult validate(dew::DataLoader& loader, const dew::StepInfo& info) override {
    dew::NoGradGuard no_grad;
    dew::ValidationResult vr;
    const int64_t n = loader.source().size(), rows = loader.config().batch_size;
    const int64_t batches = std::min(val_batches_, (n + rows - 1) / rows);
    double loss_sum = 0;
    std::map<std::string, double> health;
    int64_t seen = 0;
    for (int64_t j = 0; j < batches; ++j) {
      const uint64_t position = uint64_t(loader.position().next);
      dew::Batch bt = dew::to_device(loader.next(), backend_);
      const Tensor x = preprocess(field(bt, "image"));
      std::map<std::string, double> m;
      loss_sum += loss(x, info.seed, position, &m).item();
      for (const auto& [k, v] : m) health[k] += v;
      ++seen;
    }
    if (seen > 0) {
      vr.metrics["loss"] = loss_sum / double(seen);
      for (const auto& [k, v] : health) vr.metrics[k] = v / double(seen);
    }
    if (probe_at_validation_) {
      ProbeSettings ps = probes_;
      ps.train_samples = val_probe_train_;
      ps.test_samples = val_probe_test_;
      loader.seek(dew::DataPosition{0, loader.position().order});
      const auto pm = run_probes(loader, ps, false);
      for (const auto& [k, v] : pm)
        vr.metrics[k.substr(k.find('.') + 1)] = v;  // "trained.knn_accuracy" -> "knn_accuracy"
    }
    return vr;
  }

  dew::ValidationResult evaluate(dew::DataLoader& loader, dew::Options& request, const dew::StepInfo&) override {
    ProbeSettings ps = probes_;
    ps.train_samples = request.get_int("probe_train_samples", ps.train_samples);
    ps.test_samples = request.get_int("probe_test_samples", ps.test_samples);
    ps.knn.k = request.get_int("knn_k", ps.knn.k);
    ps.knn.temperature = request.get_double("knn_temperature", ps.knn.temperature);
    ps.knn.weighted = request.get_bool("knn_weighted", ps.knn.weighted);
    ps.linear.epochs = request.get_int("probe_epochs", ps.linear.epochs);
    ps.linear.lr = request.get_double("probe_lr", ps.linear.lr);
    ps.knn.normalize = request.get_string("knn_normalize", ps.knn.normalize);
    ps.linear.max_iterations = request.get_int("probe_max_iterations", ps.linear.max_iterations);
    if (request.has("probe_solver") || request.has("probe_weight_decay")) {
      ps.linear.solver = request.get_string("probe_solver", ps.linear.solver);
      read_weight_decay(ps, request.get_string("probe_weight_decay", "auto"), "eval --");
    }
    const bool baselines = request.get_bool("baselines", true);
    check_probe_settings(ps, "eval --");
    dew::ValidationResult vr;
    std::pair<int64_t, int64_t> used;
    vr.metrics = run_probes(loader, ps, baselines, &used);
    vr.metrics["probe_train_samples"] = double(used.first);  // what the probes had, not what was asked
    vr.metrics["probe_test_samples"] = double(used.second);
    vr.metrics["knn_k"] = double(std::min<int64_t>(ps.knn.k, used.first));
    return vr;
  }

  std::string primary_metric() const override { return probe_at_validation_ ? "knn_accuracy" : "loss"; }
  bool higher_is_better() const override { return probe_at_validation_; }

  double train_flops_per_sample() const override {
    if (!encoder_ || encoder_depth_ == 0 || pred_depth_ == 0) return 0.0;
    auto block = [](double t, double d, double hidden) {
      return 2.0 * t * (4 * d * d + 2 * d * hidden) + 4.0 * t * t * d;
    };
    const double d = double(embed_dim_), hid = encoder_mlp_ * d, pd = double(pred_dim_), ph = 4.0 * pd;
    const double n = double(grid_h_ * grid_w_), nc = double(geometry_.num_context), a = double(geometry_.target_area),
                 m = double(geometry_.num_targets);
    const double embed = 2.0 * double(patch_ * patch_ * channels_) * d * n;
    const double target = embed + double(encoder_depth_) * block(n, d, hid);            // forward only
    const double context = 3.0 * (embed + double(encoder_depth_) * block(nc, d, hid));  // forward + backward
    const double predictor = 3.0 * m * (double(pred_depth_) * block(nc + a, pd, ph) + 4.0 * (nc + a) * pd * d);
    return target + context + predictor;
  }

  // For tests: the resolved mask geometry.
  const dew::jepa::MaskGeometry& geometry() const { return geometry_; }

 private:
  void read_options(const dew::Options& o) {
    spec_.num_targets = o.get_int("num_targets", 4);
    auto ts = pair_option(o, "target_scale", {0.15, 0.2}), ta = pair_option(o, "target_aspect", {0.75, 1.5});
    auto cs = pair_option(o, "context_scale", {0.85, 1.0}), ca = pair_option(o, "context_aspect", {1.0, 1.0});
    spec_.target_scale[0] = ts.first;
    spec_.target_scale[1] = ts.second;
    spec_.target_aspect[0] = ta.first;
    spec_.target_aspect[1] = ta.second;
    spec_.context_scale[0] = cs.first;
    spec_.context_scale[1] = cs.second;
    spec_.context_aspect[0] = ca.first;
    spec_.context_aspect[1] = ca.second;
    spec_.num_context = o.get_int("num_context", 0);
    momentum_ = pair_option(o, "momentum", {0.996, 1.0});
    DEW_USAGE_CHECK(momentum_.first >= 0 && momentum_.first <= momentum_.second && momentum_.second <= 1.0,
                    "option 'objective.momentum' must be 'start, end' with 0 <= start <= end <= 1");
    momentum_steps_ = o.get_int("momentum_steps", 0);
    DEW_USAGE_CHECK(momentum_steps_ >= 0, "option 'objective.momentum_steps' must be >= 0 (0: trainer.steps)");
    mean_ = o.get_double("mean", 0.5);
    std_ = o.get_double("std", 0.5);
    DEW_USAGE_CHECK(std_ > 0.0, "option 'objective.std' must be positive, got ", std_);
    collapse_std_ = o.get_double("collapse_std", 1e-3);
    val_batches_ = o.get_int("val_batches", 10);
    DEW_USAGE_CHECK(val_batches_ >= 0, "option 'objective.val_batches' must be >= 0");
    probe_encoder_ = o.get_string("probe_encoder", "target");
    DEW_USAGE_CHECK(probe_encoder_ == "target" || probe_encoder_ == "context",
                    "option 'objective.probe_encoder' must be target or context, got '", probe_encoder_, "'");
    probe_at_validation_ = o.get_bool("probe_at_validation", true);
    val_probe_train_ = o.get_int("val_probe_train_samples", 5000);
    val_probe_test_ = o.get_int("val_probe_test_samples", 2000);
    probes_.train_samples = o.get_int("probe_train_samples", 10000);
    probes_.test_samples = o.get_int("probe_test_samples", 10000);
    probes_.knn.k = o.get_int("knn_k", 20);
    probes_.knn.temperature = o.get_double("knn_temperature", 0.07);
    probes_.knn.weighted = o.get_bool("knn_weighted", true);
    probes_.linear.epochs = o.get_int("probe_epochs", 20);
    probes_.linear.lr = o.get_double("probe_lr", 0.01);
    probes_.linear.batch_size = o.get_int("probe_batch_size", 256);
    probes_.knn.normalize = o.get_string("knn_normalize", "standardize");
    probes_.linear.solver = o.get_string("probe_solver", "lbfgs");
    probes_.linear.max_iterations = o.get_int("probe_max_iterations", probes_.linear.max_iterations);
    read_weight_decay(probes_, o.get_string("probe_weight_decay", "auto"), "objective.");
    check_probe_settings(probes_, "objective.");
    DEW_USAGE_CHECK(
        val_probe_train_ > 0 && val_probe_test_ > 0,
        "options 'objective.val_probe_train_samples' and 'objective.val_probe_test_samples' must be positive");
  }

  // "auto": lbfgs chooses among its default grid on held-out data, adamw uses 1e-4; otherwise one value
  // (fixed) or a comma list (lbfgs chooses among them).
  static void read_weight_decay(ProbeSettings& p, const std::string& text, const std::string& prefix) {
    const dew::probes::LinearProbeOptions defaults;
    if (text == "auto") {
      p.linear.weight_decays = p.linear.solver == "lbfgs" ? defaults.weight_decays : std::vector<double>{};
      p.linear.weight_decay = p.linear.solver == "lbfgs" ? defaults.weight_decays.back() : 1e-4;
      return;
    }
    dew::Options one({{"v", text}}, "");
    std::vector<double> v;
    try {
      v = one.get_doubles("v", {});
    } catch (const dew::Error&) {
      DEW_USAGE_CHECK(false, "option '", prefix, "probe_weight_decay' must be auto, a number or a comma list, got '",
                      text, "'");
    }
    DEW_USAGE_CHECK(!v.empty(), "option '", prefix, "probe_weight_decay' is empty");
    for (double x : v) DEW_USAGE_CHECK(x >= 0, "option '", prefix, "probe_weight_decay' must be >= 0, got ", x);
    DEW_USAGE_CHECK(v.size() == 1 || p.linear.solver == "lbfgs", "option '", prefix,
                    "probe_weight_decay': a list needs probe_solver = lbfgs (adamw takes one value)");
    p.linear.weight_decay = v[0];
    p.linear.weight_decays = v.size() > 1 ? v : std::vector<double>{};
  }

  static void check_probe_settings(const ProbeSettings& p, const std::string& prefix) {
    DEW_USAGE_CHECK(p.linear.solver == "lbfgs" || p.linear.solver == "adamw", "option '", prefix,
                    "probe_solver' must be lbfgs or adamw, got '", p.linear.solver, "'");
    DEW_USAGE_CHECK(p.knn.normalize == "none" || p.knn.normalize == "center" || p.knn.normalize == "standardize",
                    "option '", prefix, "knn_normalize' must be none, center or standardize, got '", p.knn.normalize,
                    "'");
    DEW_USAGE_CHECK(p.linear.max_iterations >= 1, "option '", prefix, "probe_max_iterations' must be at least 1");
    DEW_USAGE_CHECK(p.train_samples > 0 && p.test_samples > 0, "options '", prefix, "probe_train_samples' and '",
                    prefix, "probe_test_samples' must be positive");
    DEW_USAGE_CHECK(p.knn.k >= 1, "option '", prefix, "knn_k' must be at least 1, got ", p.knn.k);
    DEW_USAGE_CHECK(p.knn.temperature > 0, "option '", prefix, "knn_temperature' must be positive");
    DEW_USAGE_CHECK(p.linear.epochs >= 1, "option '", prefix, "probe_epochs' must be at least 1");
    DEW_USAGE_CHECK(p.linear.lr > 0, "option '", prefix, "probe_lr' must be positive");
    DEW_USAGE_CHECK(p.linear.batch_size >= 1, "option '", prefix, "probe_batch_size' must be at least 1");
  }

  dew::Model& probe_encoder() { return probe_encoder_ == "target" ? *target_ : *encoder_; }

  // u8 [B, H, W, C] (or [B, H, W]) -> f32 [B, C, H, W], (x / 255 - mean) / std.
  Tensor preprocess(const Tensor& image) const {
    Tensor x = image;
    if (x.ndim() == 3) x = dew::reshape(x, {x.shape()[0], x.shape()[1], x.shape()[2], 1});
    DEW_CHECK(x.ndim() == 4 && x.shape()[1] == image_h_ && x.shape()[2] == image_w_ && x.shape()[3] == channels_,
              "jepa: 'image' must be [B, ", image_h_, ", ", image_w_, ", ", channels_, "], got ",
              dew::shape_str(image.shape()));
    x = dew::permute(x, {0, 3, 1, 2});
    const bool bytes = x.dtype() == dew::DType::u8;
    x = dew::cast(x, dew::DType::f32);
    const double s = (bytes ? 1.0 / 255.0 : 1.0) / std_;
    return dew::add_scalar(dew::scale(x, float(s)), float(-mean_ / std_));
  }

  // The JEPA loss of a preprocessed batch whose first row is record `position`; health metrics into `m`.
  Tensor loss(const Tensor& x, uint64_t seed, uint64_t position, std::map<std::string, double>* m) {
    const int64_t b = x.shape()[0], nc = geometry_.num_context, mt = geometry_.num_targets, a = geometry_.target_area;
    const dew::jepa::BatchMasks masks = dew::jepa::sample_batch_masks(geometry_, seed, position, b);
    const Tensor cidx = Tensor::from_ints(masks.context, {b, nc}, backend_);
    const Tensor tidx = Tensor::from_ints(masks.targets, {b, mt, a}, backend_);
    Tensor targets;
    {
      dew::NoGradGuard no_grad;
      Tensor h = target_->forward({{"image", x}});  // [B, N, D]
      h = dew::layer_norm(h, Tensor{}, Tensor{}, 1e-6f);
      if (m) health(dew::mean(h, 1), *m);
      targets = dew::gather_rows(h, dew::reshape(tidx, {b, mt * a})).detach();
    }
    const Tensor z = encoder_->forward({{"image", x}, {"token_idx", cidx}});
    const Tensor pred = predictor_->forward({{"context", z}, {"context_idx", cidx}, {"target_idx", tidx}});
    return dew::mse(dew::reshape(pred, {b, mt * a, embed_dim_}), targets);
  }

  // Representation health of pooled embeddings p [B, D].
  void health(const Tensor& p, std::map<std::string, double>& m) const {
    const int64_t b = p.shape()[0], d = p.shape()[1];
    if (b < 2) return;
    Tensor c = dew::sub(p, dew::mean(p, 0, true));
    const std::vector<float> cov = dew::matmul(c, c, true, false).to_floats();  // [D, D] = sum over batch
    double std_sum = 0, off = 0;
    for (int64_t i = 0; i < d; ++i)
      for (int64_t j = 0; j < d; ++j) {
        const double v = double(cov[size_t(i * d + j)]) / double(b - 1);
        if (i == j)
          std_sum += std::sqrt(std::max(0.0, v));
        else
          off += v * v;
      }
    m["repr_std"] = std_sum / double(d);
    m["repr_cov_offdiag"] = d > 1 ? std::sqrt(off / double(d * (d - 1))) : 0.0;
    m["collapse"] = m["repr_std"] < collapse_std_ ? 1.0 : 0.0;
  }

  // Probes of the probe encoder (and, with baselines, of a fresh encoder and of raw pixels) on the first
  // train_samples records of the shuffled training split and test_samples records of `test_loader`.
  // `used` (when given): the train and test features the probes actually had (the splits may hold fewer).
  std::map<std::string, double> run_probes(dew::DataLoader& test_loader, const ProbeSettings& ps, bool baselines,
                                           std::pair<int64_t, int64_t>* used = nullptr) {
    dew::NoGradGuard no_grad;
    dew::Model& trained = probe_encoder();
    std::shared_ptr<dew::Model> fresh;
    if (baselines) {
      dew::Options o(config_->section("model").values(), "[model]");
      fresh = dew::create_model(o);
      fresh->initialize(seed_);  // the run's step-0 encoder
      fresh->set_training(false);
    }
    trained.set_training(false);
    const int64_t pixels = channels_ * image_h_ * image_w_;
    // One pass over the data embeds with every encoder: [trained | fresh | pixels] side by side.
    auto embed = [&](const dew::Batch& bt) {
      const Tensor x = preprocess(field(bt, "image"));
      std::vector<Tensor> parts = {dew::mean(trained.forward({{"image", x}}), 1)};
      if (fresh) {
        parts.push_back(dew::mean(fresh->forward({{"image", x}}), 1));
        parts.push_back(dew::reshape(x, {x.shape()[0], pixels}));
      }
      return parts.size() == 1 ? parts[0] : dew::concat(parts, 1);
    };
    auto train_loader = dew::make_loader(config_->section("data"), "train", seed_);
    const dew::probes::Features tr = dew::probes::collect_features(*train_loader, ps.train_samples, embed, backend_);
    const dew::probes::Features te = dew::probes::collect_features(test_loader, ps.test_samples, embed, backend_);
    if (used) *used = {tr.size(), te.size()};
    std::map<std::string, double> out;
    auto score = [&](const std::string& name, int64_t c0, int64_t c1) {
      dew::probes::Features a{dew::slice(tr.x, 1, c0, c1), tr.labels}, b{dew::slice(te.x, 1, c0, c1), te.labels};
      out[name + ".knn_accuracy"] = dew::probes::knn_probe(a, b, ps.knn);
      const auto lr = dew::probes::linear_probe(a, b, ps.linear);
      out[name + ".linear_accuracy"] = lr.test_accuracy;
      out[name + ".linear_train_accuracy"] = lr.train_accuracy;
      out[name + ".linear_weight_decay"] = lr.weight_decay;
    };
    score("trained", 0, embed_dim_);
    if (fresh) {
      score("random", embed_dim_, 2 * embed_dim_);
      score("pixels", 2 * embed_dim_, 2 * embed_dim_ + pixels);
    }
    return out;
  }

  dew::Config* config_ = nullptr;
  dew::BackendPtr backend_;
  uint64_t seed_ = 0;
  int64_t steps_ = 0;
  std::shared_ptr<dew::Model> encoder_, target_, predictor_;
  int64_t embed_dim_ = 0, grid_h_ = 0, grid_w_ = 0, image_h_ = 0, image_w_ = 0, channels_ = 1, patch_ = 1;
  int64_t encoder_depth_ = 0, pred_dim_ = 0, pred_depth_ = 0;
  double encoder_mlp_ = 4.0;
  dew::jepa::MaskSpec spec_;
  dew::jepa::MaskGeometry geometry_;
  std::pair<double, double> momentum_{0.996, 1.0};
  int64_t momentum_steps_ = 0;
  double mean_ = 0.5, std_ = 0.5, collapse_std_ = 1e-3;
  int64_t val_batches_ = 10, val_probe_train_ = 5000, val_probe_test_ = 2000;
  std::string probe_encoder_ = "target";
  bool probe_at_validation_ = true;
  ProbeSettings probes_;
};

}  // namespace

DEW_PLUGIN("jepa", "0.1.0") {
  registrar.add<dew::Objective>({
      .name = "jepa",
      .description = "I-JEPA: predict EMA-target embeddings of masked blocks from context tokens; k-NN and linear "
                     "probes as metrics",
      .factory = [](const dew::Options& o) { return std::make_shared<Jepa>(o); },
      .options = {{"num_targets", "4", "target blocks per image"},
                  {"target_scale", "0.15, 0.2", "target block area as a fraction of the patch grid"},
                  {"target_aspect", "0.75, 1.5", "target block height / width range"},
                  {"context_scale", "0.85, 1.0", "context block area as a fraction of the patch grid"},
                  {"context_aspect", "1.0, 1.0", "context block height / width range"},
                  {"num_context", "0", "context tokens per image (0: context area - targets x target area)"},
                  {"momentum", "0.996, 1.0", "target-encoder EMA momentum, start and end (linear)"},
                  {"momentum_steps", "0", "updates over which the momentum rises (0: trainer.steps)"},
                  {"mean", "0.5", "normalisation: (x/255 - mean) / std"},
                  {"std", "0.5", "normalisation: (x/255 - mean) / std"},
                  {"collapse_std", "0.001", "collapse flag: repr_std of pooled targets below this"},
                  {"val_batches", "10", "batches of the split for the validation loss"},
                  {"probe_at_validation", "true", "run the k-NN and linear probes at every validation"},
                  {"val_probe_train_samples", "5000", "training records for the probes at validation"},
                  {"val_probe_test_samples", "2000", "split records for the probes at validation"},
                  {"probe_train_samples", "10000", "training records for the probes of dew-run eval"},
                  {"probe_test_samples", "10000", "split records for the probes of dew-run eval"},
                  {"probe_encoder", "target", "encoder the probes and export use: target (EMA) or context"},
                  {"knn_k", "20", "neighbours of the k-NN probe"},
                  {"knn_temperature", "0.07", "k-NN vote weight exp(similarity / temperature)"},
                  {"knn_weighted", "true", "weighted (true) or majority (false) k-NN vote"},
                  {"knn_normalize", "standardize",
                   "features before the k-NN cosine: none, center or standardize (training-split statistics)"},
                  {"probe_solver", "lbfgs",
                   "linear probe: lbfgs (full-batch softmax regression to convergence) or adamw (fixed epochs)"},
                  {"probe_weight_decay", "auto",
                   "linear probe L2: auto (lbfgs: chosen among 1e-1..1e-7 on a held-out fifth of the training "
                   "records; adamw: 1e-4), a value, or a comma list to choose from (lbfgs)"},
                  {"probe_max_iterations", "1000", "linear probe (lbfgs): iterations per fit"},
                  {"probe_epochs", "20", "linear probe (adamw): epochs"},
                  {"probe_lr", "0.01", "linear probe (adamw): peak learning rate (cosine)"},
                  {"probe_batch_size", "256", "linear probe (adamw): mini-batch"}},
  });
}
