// diffusion.cpp — the `diffusion` objective: denoising training of an image backbone ([model] section:
// dit, unet, ...) on a diffusion process (dew/diffusion.hpp), classifier-free guidance, sampling and
// evaluation with a classifier as the judge.
//
// Batch fields: "image" u8 [B, H, W, C] (or [B, H, W]) mapped to f32 [B, C, H, W] in [-1, 1]
// (x / 127.5 - 1), and "label" i32 [B] when the run is class-conditional.
// Training step (original framework section 12): t ~ the train schedule's density, eps ~ N(0, I),
// x_t = alpha x0 + sigma eps; the backbone sees {"x": c_in x_t, "t": model_time(t) f32 [B],
// "label": i32 [B]} with each row's label replaced by the null label (= num_classes) with probability
// unconditional_prob; loss = mean over elements of w(t) * 0.5 * (prediction - target)^2.
// Every random draw is Philox keyed by (run seed, a named stream, the record's global stream position):
// row j of a batch whose first record is at position p draws its time from stream "diffusion.t" + p + j,
// its noise as elements [(p + j) * D, (p + j + 1) * D) of "diffusion.eps" (D = C*H*W) and its label drop
// as element p + j of "diffusion.drop". A resumed run therefore draws what an uninterrupted one does, and
// N data-parallel ranks with batch B draw what one process with batch N*B draws (no two ranks share noise).
// validate(): the weighted loss on up to val_records records of the split (the same per-record keying on
// the "diffusion.val.*" streams with the record's index in the split, so values are comparable across
// steps and batch sizes) and, when val_grid_rows > 0, a PNG grid of samples (one column per class, the
// first 16 classes at most) from the current (EMA) weights with the [sampler] section's solver.
// The [sampler] section (plugin, steps, guidance, guidance_interval, guidance_rescale, seed, batch and the
// solver's own keys) sets the validation grids and the defaults of sample/eval/serve requests; a request's
// solver keys (--eta ...) override the section's, whose solver keys apply only when the request keeps the
// section's solver.
// sample(): `dew-run sample --run-dir D --sampler heun --steps 30 --guidance 3 --labels 0,1,2 --out g.png`.
// Row i of a sampling request starts from the prior keyed by (seed, i) and, with stochastic solvers (ddpm,
// ddim eta > 0, euler_ancestral, heun with churn), draws its per-step noise keyed by (seed, i) too
// (dew::diffusion::step_noise), so an image does not depend on --batch (up to float rounding).
// evaluate(): `dew-run eval --run-dir D --classifier RUN [--samples 500 --steps 30 --guidance 3]`:
// the judge's accuracy on the asked classes of the generated images, and the Fréchet distance between
// generated and test images on the judge's penultimate features (plus the same distance for as many
// real training images, the floor a perfect generator would reach).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <dew/autograd.hpp>
#include <dew/backend.hpp>
#include <dew/diffusion.hpp>
#include <dew/error.hpp>
#include <dew/image.hpp>
#include <dew/metrics.hpp>
#include <dew/objective.hpp>
#include <dew/random.hpp>
#include <dew/registry.hpp>
#include <dew/sampler.hpp>
#include <dew/train.hpp>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <sstream>
#include <string>

namespace {

using dew::Tensor;
namespace dd = dew::diffusion;

// Sampling settings shared by validation grids, `dew-run sample` and `dew-run eval`.
struct SamplingRequest {
  std::string sampler;
  int64_t steps = 30;
  dd::Guidance guidance;
  uint64_t seed = 0;
  int64_t batch = 64;
};

class DiffusionObjective final : public dew::Objective {
 public:
  explicit DiffusionObjective(const dew::Options& o) { read_options(o); }

  void build(dew::ObjectiveContext& ctx) override {
    DEW_CHECK(ctx.config != nullptr, "diffusion: build() needs the run config");
    dew::Options& objective = ctx.config->section("objective");
    read_options(objective);
    process_ = dd::make_process(objective);
    process_.check();
    backend_ = ctx.backend ? ctx.backend : dew::default_backend();
    dew::set_default_backend(backend_);
    seed_ = ctx.seed;

    dew::Options& model = ctx.config->section("model");
    if (ctx.train_source && ctx.train_source->size() > 0) {
      const dew::Record first = ctx.train_source->get(0);
      auto it = first.find(image_field_);
      DEW_USAGE_CHECK(it != first.end(), "diffusion: the training source ", ctx.train_source->identity(), " has no '",
                      image_field_, "' field");
      const dew::Shape& s = it->second.shape;
      DEW_USAGE_CHECK(s.size() == 2 || s.size() == 3, "diffusion: an image record must be [H, W, C] or [H, W], got ",
                      dew::shape_str(s));
      height_ = s[0];
      width_ = s[1];
      channels_ = s.size() == 3 ? s[2] : 1;
      if (conditional_ && num_classes_ <= 0) num_classes_ = 1 + max_label(*ctx.train_source);
      // The backbone generates what it is trained on: a model.image_size / in_channels of its own would make
      // sample, eval and serve draw images of another shape than the data's (or fail in a kernel).
      if (model.has("image_size")) {
        const std::vector<int64_t> size = model.get_positive_ints("image_size", {});
        const int64_t h = size.empty() ? 0 : size[0], w = size.size() > 1 ? size[1] : h;
        DEW_USAGE_CHECK(h == height_ && w == width_, "diffusion: model.image_size = ", h, "x", w,
                        " but the data's images are ", height_, "x", width_,
                        "; leave model.image_size out (the objective sets it) or resize the data "
                        "([data] transforms)");
      }
      if (model.has("in_channels"))
        DEW_USAGE_CHECK(model.get_int("in_channels", 0) == channels_,
                        "diffusion: model.in_channels = ", model.get_int("in_channels", 0),
                        " but the data's images have ", channels_,
                        " channels; leave model.in_channels out (the objective sets it)");
    } else {
      // eval/sample/export: the shapes were written into the saved config by the training run.
      const std::vector<int64_t> size = model.get_positive_ints("image_size", {});
      DEW_USAGE_CHECK(!size.empty(), "diffusion: 'model.image_size' is unknown (no training source)");
      height_ = size[0];
      width_ = size.size() > 1 ? size[1] : size[0];
      channels_ = model.get_int("in_channels", 1);
      if (conditional_ && num_classes_ <= 0) num_classes_ = model.get_int("num_classes", 0);
    }
    DEW_USAGE_CHECK(!conditional_ || num_classes_ >= 1,
                    "diffusion: a class-conditional run needs the number of classes: set 'objective.num_classes' or "
                    "'objective.conditional = false'");
    if (!model.has("in_channels")) model.set("in_channels", std::to_string(channels_));
    if (!model.has("image_size"))
      model.set("image_size",
                height_ == width_ ? std::to_string(height_) : std::to_string(height_) + "," + std::to_string(width_));
    // The backbone's label embedding has num_classes + 1 rows (the last is the null label of guidance).
    const int64_t model_classes = conditional_ ? num_classes_ : 0;
    if (model.has("num_classes")) {
      const int64_t set = model.get_int("num_classes", 0);
      DEW_USAGE_CHECK(set == model_classes, "diffusion: 'model.num_classes' = ", set, " but the objective ",
                      conditional_ ? "has " + std::to_string(num_classes_) + " classes"
                                   : std::string("is unconditional (objective.conditional = false)"),
                      "; leave model.num_classes out (the objective sets it) or set objective.num_classes");
    } else {
      model.set("num_classes", std::to_string(model_classes));
    }
    model_ = dew::create_model(model);
    model_->initialize(ctx.seed);

    // The validation sampler: the [sampler] section (plugin = heun, steps = 30, guidance = 3, ...).
    // It also gives the defaults of sample/eval/serve requests (request_solver()).
    dew::Options& sampler = ctx.config->section("sampler");
    SamplingRequest defaults;
    defaults.sampler = default_sampler();
    defaults.guidance.scale = conditional_ ? 3.0 : 1.0;
    val_sampling_ = read_sampling(sampler, "plugin", defaults);
    sampler_values_ = sampler.values();
    train_data_ = ctx.config->section("data");
    val_solver_ = make_solver(val_sampling_.sampler, sampler);
  }

  std::vector<std::string> batch_fields() const override {
    if (conditional_) return {image_field_, label_field_};
    return {image_field_};
  }

  dew::NamedTensors parameters() override {
    DEW_CHECK(model_, "diffusion: parameters() before build()");
    dew::NamedTensors out;
    for (auto& [name, t] : model_->named_parameters()) out.emplace_back("model." + name, t);
    return out;
  }

  dew::StepResult step(const dew::Batch& batch, const dew::StepInfo& info) override {
    DEW_CHECK(model_, "diffusion: step() before build()");
    model_->set_training(true);
    const Tensor x0 = preprocess(field(batch, image_field_));
    const int64_t b = x0.shape()[0];
    // Randomness keyed by the record position; without one (tests, tools) by the update and micro-batch.
    const uint64_t first =
        info.position >= 0 ? uint64_t(info.position) : (uint64_t(info.step) * 64 + uint64_t(info.micro)) * uint64_t(b);
    const std::vector<double> t = row_times(stream("diffusion.t"), first, b);
    const Tensor eps = row_noise(x0.shape(), stream("diffusion.eps"), first);
    Tensor labels;
    if (conditional_) labels = drop_labels(field(batch, label_field_), b, stream("diffusion.drop"), first);
    dew::StepResult r;
    double mse = 0.0;
    r.loss = loss(x0, eps, t, labels, &mse);
    r.samples = b;
    r.metrics["mse"] = mse;
    return r;
  }

  dew::ValidationResult validate(dew::DataLoader& loader, const dew::StepInfo& info) override {
    DEW_CHECK(model_, "diffusion: validate() before build()");
    dew::NoGradGuard no_grad;
    const bool was_training = model_->training();
    model_->set_training(false);
    dew::ValidationResult r;
    if (val_records_ > 0) r.sums = validation_loss_sums(loader, val_records_);
    r.metrics = validation_metrics(r.sums);
    if (val_grid_rows_ > 0 && loader.config().rank == 0) {  // sharded validation: rank 0's grid is the one kept
      const std::vector<int32_t> labels = grid_labels(val_grid_rows_);
      const Tensor images = generate(labels, val_sampling_, *val_solver_);
      std::ostringstream name;
      name << "grid-" << std::setw(7) << std::setfill('0') << info.step << ".png";
      r.artifacts.push_back({name.str(), grid_png(images, grid_columns())});
    }
    model_->set_training(was_training);
    return r;
  }

  bool shards_validation() const override { return true; }
  std::map<std::string, double> validation_metrics(const std::map<std::string, double>& sums) const override {
    if (sums.empty()) return {};  // no validation loss asked for (val_records = 0)
    const double seen = sums.at("records");
    return {{"loss", seen > 0 ? sums.at("loss") / seen : 0.0}};
  }

  void sample(dew::Options& request) override {
    DEW_CHECK(model_, "diffusion: sample() before build()");
    dew::NoGradGuard no_grad;
    model_->set_training(false);
    const std::string out = request.get_string("out", "samples.png");
    const Prepared p = prepare(request);
    request.check_all_used();  // before the work: a misspelt key is refused at once
    const Tensor images = generate(p.labels, p.sampling, *p.solver);
    write_file(out, grid_png(images, p.columns));
    std::cout << "wrote " << p.labels.size() << " samples (" << p.sampling.sampler << ", " << p.sampling.steps
              << " steps, guidance " << p.sampling.guidance.scale << ", seed " << p.sampling.seed << ") to " << out
              << "\n";
  }

  bool generates_images() const override { return true; }

  // `dew-run serve`'s POST /v1/images: the images of a sample() request, one PNG each, in request order.
  std::vector<dew::GeneratedImage> generate_images(dew::Options& request, int64_t max_images) override {
    DEW_CHECK(model_, "diffusion: generate_images() before build()");
    dew::NoGradGuard no_grad;
    model_->set_training(false);
    const Prepared p = prepare(request);
    request.check_all_used();
    DEW_USAGE_CHECK(int64_t(p.labels.size()) <= max_images, "the request asks for ", p.labels.size(),
                    " images; this server makes at most ", max_images, " per request");
    const Tensor bytes = to_bytes(generate(p.labels, p.sampling, *p.solver));  // u8 [N, C, H, W]
    std::vector<uint8_t> chw(static_cast<size_t>(bytes.numel()));
    bytes.copy_to_host(chw.data());
    const int64_t plane = height_ * width_, per_image = plane * channels_;
    std::vector<dew::GeneratedImage> out(p.labels.size());
    std::vector<uint8_t> hwc(static_cast<size_t>(per_image));
    for (size_t i = 0; i < out.size(); ++i) {
      for (int64_t c = 0; c < channels_; ++c)
        for (int64_t k = 0; k < plane; ++k)
          hwc[size_t(k * channels_ + c)] = chw[size_t(int64_t(i) * per_image + c * plane + k)];
      out[i].png = dew::encode_png(hwc.data(), int(height_), int(width_), int(channels_));
      out[i].label = conditional_ ? p.labels[i] : -1;
      out[i].seed = p.sampling.seed;
    }
    return out;
  }

  dew::ValidationResult evaluate(dew::DataLoader& loader, dew::Options& request, const dew::StepInfo&) override {
    DEW_CHECK(model_, "diffusion: evaluate() before build()");
    dew::NoGradGuard no_grad;
    model_->set_training(false);
    const SamplingRequest s = read_sampling(request, "sampler", val_sampling_);
    auto solver = request_solver(s.sampler, request);
    const int64_t n = request.get_int("samples", 500);
    DEW_USAGE_CHECK(n >= 2, "--samples must be at least 2, got ", n);
    const std::string judge_dir = request.get_string("classifier", judge_);
    const bool with_loss = request.get_bool("loss", false);
    request.check_all_used();  // before the work: a misspelt key is refused at once
    DEW_USAGE_CHECK(!judge_dir.empty(),
                    "diffusion eval needs a judge: --classifier RUN_DIR (a classify run on the same data, "
                    "e.g. runs/fmnist-classifier) or 'objective.judge' in the config");

    // The judge (loaded first, so a wrong --classifier fails before the sampling): its backbone's logits
    // and penultimate features on u8-quantised images.
    dew::LoadedObjective judge = dew::load_objective(judge_dir, "latest", true, "");
    dew::set_default_backend(backend_);  // loading the judge may have changed it
    dew::Model* classifier = judge.objective->main_model();
    DEW_USAGE_CHECK(classifier != nullptr, "diffusion eval: the run in '", judge_dir, "' has no model to judge with");
    check_judge(*classifier, judge_dir);
    classifier->set_training(false);

    dew::ValidationResult r;
    if (with_loss) r.metrics = validation_metrics(validation_loss_sums(loader, val_records_));
    // Generated images, labels round-robin over the classes.
    std::vector<int32_t> labels(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) labels[size_t(i)] = conditional_ ? int32_t(i % num_classes_) : 0;
    const Tensor generated = generate(labels, s, *solver);
    r.artifacts.push_back(
        {"generated.png", grid_png(generated.slice0(0, std::min<int64_t>(n, 100)), conditional_ ? num_classes_ : 10)});
    const double mean = opt_double(judge.objective_options, "mean", 0.5);
    const double stdev = opt_double(judge.objective_options, "std", 0.5);

    std::vector<float> gen_features;
    int64_t dim = 0, hits = 0;
    for (int64_t i = 0; i < n; i += s.batch) {
      const int64_t m = std::min(s.batch, n - i);
      const Tensor bytes = to_bytes(generated.slice0(i, i + m));  // u8 [m, C, H, W]
      const Tensor in = judge_input(bytes, mean, stdev, judge.backend);
      const Tensor feats = classifier->features({{"image", in}});
      const Tensor logits = classifier->forward({{"image", in}});
      const std::vector<int32_t> pred = dew::argmax(logits).to_ints();
      for (int64_t j = 0; j < m; ++j) hits += pred[size_t(j)] == labels[size_t(i + j)];
      append(gen_features, feats, dim);
    }
    if (conditional_) r.metrics["class_accuracy"] = double(hits) / double(n);

    // Reference statistics: every test image; the floor: n real training images against them.
    std::vector<float> test_features;
    const int64_t test_n = features_of_split(loader, classifier, mean, stdev, judge.backend, test_features, dim, -1);
    std::vector<float> real_features;
    auto train_loader = dew::make_loader(train_data_, "train", seed_);
    const int64_t real_n =
        features_of_split(*train_loader, classifier, mean, stdev, judge.backend, real_features, dim, n);
    const dew::FeatureStats ref = dew::feature_stats(test_features, test_n, dim);
    r.metrics["fd"] = dew::frechet_distance(dew::feature_stats(gen_features, n, dim), ref);
    r.metrics["fd_real_train"] = dew::frechet_distance(dew::feature_stats(real_features, real_n, dim), ref);
    r.metrics["samples"] = double(n);
    r.metrics["steps"] = double(s.steps);
    r.metrics["guidance"] = s.guidance.scale;
    r.metrics["seed"] = double(s.seed);
    r.metrics["test_images"] = double(test_n);
    return r;
  }

  std::string primary_metric() const override { return "loss"; }
  double train_flops_per_sample() const override { return model_ ? 3.0 * model_->flops_per_sample() : 0.0; }
  dew::Model* main_model() override { return model_.get(); }

 private:
  static uint64_t stream(const char* name) { return dew::philox::stream_of(name); }

  void read_options(const dew::Options& o) {
    conditional_ = o.get_bool("conditional", true);
    num_classes_ = o.get_int("num_classes", 0);
    DEW_USAGE_CHECK(num_classes_ >= 0, "option 'objective.num_classes' must be >= 0, got ", num_classes_);
    unconditional_prob_ = o.get_double("unconditional_prob", 0.12);
    DEW_USAGE_CHECK(unconditional_prob_ >= 0.0 && unconditional_prob_ <= 1.0,
                    "option 'objective.unconditional_prob' must be in [0, 1], got ", unconditional_prob_);
    image_field_ = o.get_string("image_field", "image");
    label_field_ = o.get_string("label_field", "label");
    val_records_ = o.get_int("val_records", 1024);
    DEW_USAGE_CHECK(val_records_ >= 0, "option 'objective.val_records' must be >= 0, got ", val_records_);
    val_grid_rows_ = o.get_int("val_grid_rows", 2);
    DEW_USAGE_CHECK(val_grid_rows_ >= 0, "option 'objective.val_grid_rows' must be >= 0, got ", val_grid_rows_);
    judge_ = o.get_string("judge", "");
  }

  std::string default_sampler() const {
    return process_.sample && process_.sample->family() == dd::Family::vp ? "ddim" : "heun";
  }

  // Reads sampler/steps/guidance/guidance_interval/guidance_rescale/seed/batch from a section or a
  // request ("plugin" in a [sampler] section, "sampler" on the command line); absent keys keep `d`'s.
  SamplingRequest read_sampling(dew::Options& o, const std::string& name_key, const SamplingRequest& d) const {
    SamplingRequest s;
    s.sampler = o.get_string(name_key, d.sampler);
    s.steps = o.get_int("steps", d.steps);
    DEW_USAGE_CHECK(s.steps >= 1, "sampling steps must be at least 1, got ", s.steps);
    s.guidance.scale = o.get_double("guidance", d.guidance.scale);
    const std::vector<double> interval = o.get_doubles("guidance_interval", {d.guidance.start, d.guidance.stop});
    DEW_USAGE_CHECK(interval.size() == 2, "guidance_interval must be two numbers 'start,stop' in [0, 1]");
    s.guidance.start = interval[0];
    s.guidance.stop = interval[1];
    s.guidance.rescale = o.get_double("guidance_rescale", d.guidance.rescale);
    s.guidance.check();
    DEW_USAGE_CHECK(conditional_ || s.guidance.scale == 1.0, "guidance ", s.guidance.scale,
                    " needs a class-conditional run; this one is unconditional (use guidance 1)");
    const int64_t seed = o.get_int("seed", int64_t(d.seed));
    DEW_USAGE_CHECK(seed >= 0, "the sampling seed must not be negative, got ", seed);
    s.seed = uint64_t(seed);
    s.batch = o.get_int("batch", d.batch);
    DEW_USAGE_CHECK(s.batch >= 1, "the sampling batch must be positive, got ", s.batch);
    return s;
  }

  // The solver of a request: its own keys (--eta ...) over the [sampler] section's when it is the
  // section's solver. Created once from the request alone too, which marks (and checks) the request's
  // solver keys whichever solver it names.
  std::shared_ptr<dd::Sampler> request_solver(const std::string& name, dew::Options& request) const {
    auto solver = make_solver(name, request);
    if (name != val_sampling_.sampler) return solver;
    std::map<std::string, std::string> merged = sampler_values_;
    for (const auto& [k, v] : request.values()) merged[k] = v;
    dew::Options o(merged, "sampler");
    return make_solver(name, o);
  }

  // A sampling request (sample(), generate_images()): its settings, solver and labels, row-major in a
  // grid of `columns` (conditional: one column per asked label (--labels, default every class), `n`
  // rows; unconditional: n images). Reads every key it uses.
  struct Prepared {
    SamplingRequest sampling;
    std::shared_ptr<dd::Sampler> solver;
    std::vector<int32_t> labels;
    int64_t columns = 1;
  };
  Prepared prepare(dew::Options& request) const {
    Prepared p;
    p.sampling = read_sampling(request, "sampler", val_sampling_);
    p.solver = request_solver(p.sampling.sampler, request);
    const int64_t per_label = request.get_int("n", conditional_ ? 4 : 16);
    DEW_USAGE_CHECK(per_label > 0, "--n must be positive, got ", per_label);
    if (!conditional_) {
      DEW_USAGE_CHECK(!request.has("labels"), "--labels: this run is unconditional");
      p.labels.assign(size_t(per_label), 0);
      p.columns = std::min<int64_t>(per_label, 8);
    } else {
      std::vector<double> asked = request.get_doubles("labels", {});
      if (asked.empty())
        for (int64_t c = 0; c < num_classes_; ++c) asked.push_back(double(c));
      for (double v : asked)
        DEW_USAGE_CHECK(v == std::floor(v) && v >= 0 && v < double(num_classes_), "--labels: ", v,
                        " is not a class in [0, ", num_classes_, ")");
      for (int64_t row = 0; row < per_label; ++row)
        for (double v : asked) p.labels.push_back(int32_t(v));
      p.columns = int64_t(asked.size());
    }
    DEW_USAGE_CHECK(int64_t(p.labels.size()) <= 100000, "a sampling request may ask for at most 100000 images, got ",
                    p.labels.size());
    return p;
  }

  // Refuses a judge trained on other images (size, channels) or, for a conditional run, other classes.
  void check_judge(const dew::Model& classifier, const std::string& dir) const {
    const std::map<std::string, std::string> d = classifier.describe();
    const std::string ours = std::to_string(height_) + "x" + std::to_string(width_) + "x" + std::to_string(channels_);
    auto number = [&](const char* key) { return std::stoll(d.at(key)); };
    if (d.count("in_channels"))
      DEW_USAGE_CHECK(number("in_channels") == channels_, "diffusion eval: the judge in '", dir, "' reads ",
                      d.at("in_channels"), "-channel images; this run makes ", ours);
    if (d.count("image_size")) {
      const std::vector<int64_t> size =
          dew::Options({{"image_size", d.at("image_size")}}).get_positive_ints("image_size", {});
      const int64_t h = size.empty() ? 0 : size[0], w = size.size() > 1 ? size[1] : h;
      DEW_USAGE_CHECK(h == height_ && w == width_, "diffusion eval: the judge in '", dir, "' was trained on ", h, "x",
                      w, " images; this run makes ", ours);
    }
    if (d.count("in_features"))
      DEW_USAGE_CHECK(number("in_features") == height_ * width_ * channels_, "diffusion eval: the judge in '", dir,
                      "' reads ", d.at("in_features"), " features; this run makes ", ours, " images");
    if (conditional_ && d.count("num_classes"))
      DEW_USAGE_CHECK(number("num_classes") == num_classes_, "diffusion eval: the judge in '", dir, "' knows ",
                      d.at("num_classes"), " classes; this run has ", num_classes_);
  }

  // The solver plugin, created with `options` (its own keys: eta, s_churn, ...).
  std::shared_ptr<dd::Sampler> make_solver(const std::string& name, dew::Options& options) const {
    auto& reg = dew::Registry::global();
    DEW_USAGE_CHECK(reg.contains(dd::Sampler::kind, name), "unknown sampler '", name,
                    "' (is the samplers plugin loaded? `dew-run plugins` lists them)");
    auto solver = reg.create<dd::Sampler>(name, options);
    solver->check(process_);
    return solver;
  }

  // u8 [B, H, W, C] (or [B, H, W]) -> f32 [B, C, H, W] in [-1, 1].
  Tensor preprocess(const Tensor& image) const {
    Tensor x = image;
    if (x.ndim() == 3) x = dew::reshape(x, {x.shape()[0], x.shape()[1], x.shape()[2], 1});
    DEW_CHECK(x.ndim() == 4, "diffusion: '", image_field_, "' must be [B, H, W, C], got ",
              dew::shape_str(image.shape()));
    DEW_CHECK(x.shape()[1] == height_ && x.shape()[2] == width_ && x.shape()[3] == channels_, "diffusion: images ",
              dew::shape_str(image.shape()), " differ from the run's ", height_, "x", width_, "x", channels_);
    x = dew::permute(x, {0, 3, 1, 2});
    const bool bytes = x.dtype() == dew::DType::u8;
    x = dew::cast(x, dew::DType::f32);
    if (!bytes) return dew::add_scalar(dew::scale(x, 2.0f), -1.0f);  // floating images are in [0, 1]
    return dew::add_scalar(dew::scale(x, float(2.0 / 255.0)), -1.0f);
  }

  // The first b labels of a batch field as host ints, each checked to be a class.
  std::vector<int32_t> checked_labels(const Tensor& label, int64_t b) const {
    DEW_CHECK(label.numel() >= b, "diffusion: '", label_field_, "' has ", label.numel(), " entries for ", b, " images");
    Tensor l = label.dtype() == dew::DType::i32 ? label : dew::cast(label, dew::DType::i32);
    std::vector<int32_t> v = l.to_ints();
    v.resize(size_t(b));
    for (int32_t x : v)
      DEW_USAGE_CHECK(x >= 0 && x < num_classes_, "diffusion: label ", x, " is outside [0, ", num_classes_,
                      "); set 'objective.num_classes' to cover every label");
    return v;
  }

  // The training labels with row j (record first + j) dropped to the null label with probability
  // unconditional_prob.
  Tensor drop_labels(const Tensor& label, int64_t b, uint64_t drop_stream, uint64_t first) const {
    std::vector<int32_t> v = checked_labels(label, b);
    for (int64_t j = 0; j < b; ++j)
      if (dew::philox::uniform(seed_, drop_stream, first + uint64_t(j)) < float(unconditional_prob_))
        v[size_t(j)] = int32_t(num_classes_);
    return Tensor::from_ints(v, {b}, backend_);
  }

  // Training times of b rows whose first record is at position `first`: row j from stream s + first + j.
  std::vector<double> row_times(uint64_t s, uint64_t first, int64_t b) const {
    std::vector<double> t(static_cast<size_t>(b));
    for (int64_t j = 0; j < b; ++j) t[size_t(j)] = process_.train->sample_t(seed_, s + first + uint64_t(j), 1)[0];
    return t;
  }

  // N(0, I) f32 of `shape` [B, ...] whose row j is elements [(first + j) D, (first + j + 1) D) of stream s.
  Tensor row_noise(const dew::Shape& shape, uint64_t s, uint64_t first) const {
    Tensor eps = Tensor::empty(shape, dew::DType::f32, backend_);
    dew::RandomParams p;
    p.dist = dew::Distribution::normal;
    p.seed = seed_;
    p.stream = s;
    p.offset = first * uint64_t(dew::numel_of(shape) / shape[0]);
    p.a = 0.0f;
    p.b = 1.0f;
    backend_->random(eps, p);
    return eps;
  }

  // The weighted denoising loss of one batch; *mse receives the unweighted mean squared error.
  Tensor loss(const Tensor& x0, const Tensor& eps, const std::vector<double>& t, const Tensor& labels,
              double* mse) const {
    const int64_t b = x0.shape()[0];
    const dd::RowRates rates = process_.train_rates(t);
    const dd::Diffused d = process_.transform->forward_diffusion(x0, eps, rates);
    std::vector<float> model_time(static_cast<size_t>(b));
    for (int64_t i = 0; i < b; ++i) model_time[size_t(i)] = float(process_.train->model_time(t[size_t(i)]));
    dew::Batch in{{"x", process_.transform->scale_input(d.x_t, rates)},
                  {"t", Tensor::from_vector(model_time, {b}, backend_)}};
    if (labels.defined()) in["label"] = labels;
    const Tensor out = model_->forward(in);
    const Tensor pred = process_.transform->predict(d.x_t, out, rates);
    const Tensor row_mse = dew::mean(dew::reshape(dew::square(pred - d.target), {b, -1}), 1);  // [B]
    if (mse) *mse = dew::mean(row_mse.detach()).item();
    const std::vector<double> w = process_.weights(t);
    std::vector<float> wf(w.begin(), w.end());
    return dew::scale(dew::mean(row_mse * Tensor::from_vector(wf, {b}, backend_)), 0.5f);
  }

  // The weighted loss over the first `records` records of a split (0: none), with times and noise keyed
  // by record position so the value is comparable between validations and between world sizes: its sum
  // over this rank's share of the records and their count.
  std::map<std::string, double> validation_loss_sums(dew::DataLoader& loader, int64_t records) const {
    const int64_t n = std::min(records, loader.source().size());
    double sum = 0.0;
    int64_t seen = 0;
    dew::for_each_pass_batch(loader, n, 0, backend_, [&](const dew::Batch& b, int64_t first, int64_t use) {
      const Tensor x0 = preprocess(field(b, image_field_));
      const std::vector<double> t = row_times(stream("diffusion.val.t"), uint64_t(first), use);
      const Tensor eps = row_noise(x0.shape(), stream("diffusion.val.eps"), uint64_t(first));
      Tensor labels;
      if (conditional_) labels = Tensor::from_ints(checked_labels(field(b, label_field_), use), {use}, backend_);
      sum += loss(x0, eps, t, labels, nullptr).item() * double(use);
      seen += use;
    });
    return {{"loss", sum}, {"records", double(seen)}};
  }

  // Validation grids: one column per class (the first 16 at most), or 8 columns when unconditional.
  int64_t grid_columns() const { return conditional_ ? std::min<int64_t>(num_classes_, 16) : 8; }
  std::vector<int32_t> grid_labels(int64_t rows) const {
    std::vector<int32_t> labels;
    const int64_t columns = grid_columns();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < columns; ++c) labels.push_back(conditional_ ? int32_t(c) : 0);
    return labels;
  }

  // Samples f32 [N, C, H, W] for the given labels (ignored when unconditional), in batches; row i's
  // prior is keyed by (seed * 1000003 + i) whatever the batching; the batch starting at row i integrates
  // with solver seed seed * 1000003 + i, whose step noise gives its row r the seed of row i + r (other
  // Philox streams than the priors').
  Tensor generate(const std::vector<int32_t>& labels, const SamplingRequest& s, const dd::Sampler& solver) const {
    const int64_t n = int64_t(labels.size());
    std::vector<Tensor> parts;
    for (int64_t i = 0; i < n; i += s.batch) {
      const int64_t m = std::min(s.batch, n - i);
      std::vector<Tensor> priors;
      for (int64_t j = i; j < i + m; ++j)
        priors.push_back(
            process_.noise({1, channels_, height_, width_}, dew::DType::f32, backend_, row_seed(s.seed, j)));
      const Tensor x_T = m == 1 ? priors[0] : dew::concat(priors, 0);
      Tensor lab;
      if (conditional_)
        lab = Tensor::from_ints(std::vector<int32_t>(labels.begin() + i, labels.begin() + i + m), {m}, backend_);
      dd::RawModel raw = [this](const Tensor& x_in, const Tensor& model_time, const Tensor& l) {
        dew::Batch in{{"x", x_in}, {"t", model_time}};
        if (l.defined()) in["label"] = l;
        return model_->forward(in);
      };
      const dd::Denoiser denoise = dd::make_denoiser(raw, process_, lab, conditional_ ? s.guidance : dd::Guidance{},
                                                     conditional_ ? int32_t(num_classes_) : -1);
      parts.push_back(solver.sample(denoise, x_T, process_, s.steps, row_seed(s.seed, i)));
    }
    return parts.size() == 1 ? parts[0] : dew::concat(parts, 0);
  }

  static uint64_t row_seed(uint64_t seed, int64_t row) { return seed * 1000003u + uint64_t(row); }

  // f32 [N, C, H, W] in [-1, 1] -> u8 [N, C, H, W] (clipped, rounded) on the same backend.
  static Tensor to_bytes(const Tensor& x) {
    const Tensor scaled = dew::add_scalar(dew::scale(dew::clamp(x, -1.0f, 1.0f), 127.5f), 127.5f + 0.5f);
    std::vector<float> v = scaled.to_floats();
    std::vector<uint8_t> b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = uint8_t(std::clamp(std::floor(v[i]), 0.0f, 255.0f));
    return Tensor::from_host(b.data(), x.shape(), dew::DType::u8, x.backend_ptr());
  }

  // u8 [N, C, H, W] -> the judge's input f32 [N, C, H, W], (x / 255 - mean) / std.
  static Tensor judge_input(const Tensor& bytes, double mean, double stdev, const dew::BackendPtr& backend) {
    Tensor x = dew::cast(bytes, dew::DType::f32);
    if (backend && backend.get() != &x.backend()) x = x.to(backend);  // the judge may run elsewhere
    return dew::add_scalar(dew::scale(x, float(1.0 / (255.0 * stdev))), float(-mean / stdev));
  }

  // The judge's features of (at most `limit`, -1: all) records of a split, in order; returns the count.
  int64_t features_of_split(dew::DataLoader& loader, dew::Model* classifier, double mean, double stdev,
                            const dew::BackendPtr& backend, std::vector<float>& out, int64_t& dim,
                            int64_t limit) const {
    int64_t n = loader.source().size();
    if (limit >= 0) n = std::min(n, limit);
    const int64_t seen =
        dew::for_each_pass_batch(loader, n, 0, backend_, [&](const dew::Batch& b, int64_t, int64_t use) {
          Tensor image = field(b, image_field_);
          if (image.ndim() == 3) image = dew::reshape(image, {use, image.shape()[1], image.shape()[2], 1});
          const Tensor chw = dew::permute(image, {0, 3, 1, 2});
          append(out, classifier->features({{"image", judge_input(chw, mean, stdev, backend)}}), dim);
        });
    return seen;
  }

  static void append(std::vector<float>& out, const Tensor& feats, int64_t& dim) {
    DEW_CHECK(feats.ndim() == 2, "diffusion eval: the judge's features must be [B, F], got ",
              dew::shape_str(feats.shape()));
    DEW_CHECK(dim == 0 || dim == feats.shape()[1], "diffusion eval: feature widths differ");
    dim = feats.shape()[1];
    const std::vector<float> v = feats.to_floats();
    out.insert(out.end(), v.begin(), v.end());
  }

  // A PNG of f32 [N, C, H, W] images in [-1, 1], `columns` per row, 2-pixel gaps (dew/image.hpp).
  std::vector<unsigned char> grid_png(const Tensor& images, int64_t columns) const {
    const dew::Shape& s = images.shape();
    const std::vector<uint8_t> hwc = dew::tensor_to_images(images);
    return dew::encode_png_grid(hwc.data(), s[0], s[2], s[3], s[1], std::max<int64_t>(1, std::min(columns, s[0])), 2);
  }

  static void write_file(const std::string& path, const std::vector<unsigned char>& bytes) {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    DEW_USAGE_CHECK(f.good(), "cannot write '", path, "'");
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    DEW_CHECK(f.good(), "writing '", path, "' failed");
  }

  static double opt_double(const std::map<std::string, std::string>& o, const std::string& key, double fallback) {
    auto it = o.find(key);
    return it == o.end() ? fallback : std::stod(it->second);
  }

  const Tensor& field(const dew::Batch& b, const std::string& name) const {
    auto it = b.find(name);
    DEW_CHECK(it != b.end(), "diffusion: the batch has no '", name, "' field");
    return it->second;
  }

  int64_t max_label(const dew::DataSource& src) const {
    int64_t best = -1;
    for (int64_t i = 0, n = src.size(); i < n; ++i) {
      const dew::Record r = src.get(i);
      auto it = r.find(label_field_);
      DEW_USAGE_CHECK(it != r.end(), "diffusion: the training source ", src.identity(), " has no '", label_field_,
                      "' field; set 'objective.conditional = false' for an unconditional model");
      const dew::HostArray& a = it->second;
      DEW_USAGE_CHECK(a.numel() == 1 && a.dtype == dew::DType::i32, "diffusion: a label record must be one i32, got ",
                      dew::dtype_name(a.dtype), " ", dew::shape_str(a.shape));
      best = std::max<int64_t>(best, a.as<int32_t>()[0]);
    }
    return best;
  }

  dd::Process process_;
  std::shared_ptr<dew::Model> model_;
  dew::BackendPtr backend_;
  uint64_t seed_ = 0;
  bool conditional_ = true;
  int64_t num_classes_ = 0, height_ = 0, width_ = 0, channels_ = 1;
  double unconditional_prob_ = 0.12;
  std::string image_field_ = "image", label_field_ = "label", judge_;
  int64_t val_records_ = 1024, val_grid_rows_ = 2;
  SamplingRequest val_sampling_;  // the [sampler] section: validation grids, and the requests' defaults
  std::map<std::string, std::string> sampler_values_;
  std::shared_ptr<dd::Sampler> val_solver_;
  dew::Options train_data_;
};

}  // namespace

DEW_PLUGIN("diffusion", "0.1.0") {
  std::vector<dew::OptionSpec> options = {
      {"conditional", "true", "class-conditional (labels from the data) or not"},
      {"num_classes", "0", "number of classes (0: 1 + the largest training label)"},
      {"unconditional_prob", "0.12", "probability of dropping a row's label to the null class (guidance)"},
      {"image_field", "image", "batch field holding the images"},
      {"label_field", "label", "batch field holding the labels"},
      {"val_records", "1024", "records of the validation split scored by the validation loss"},
      {"val_grid_rows", "2", "rows of the sample grid written at each validation (0: none)"},
      {"judge", "", "a classify run directory used by `dew-run eval` (or --classifier)"},
  };
  for (const auto& spec : dew::diffusion::process_option_specs()) options.push_back(spec);
  registrar.add<dew::Objective>({
      .name = "diffusion",
      .description = "denoising diffusion / flow matching on images with classifier-free guidance; samples "
                     "PNG grids; eval: judge accuracy and Frechet distance",
      .factory = [](const dew::Options& o) { return std::make_shared<DiffusionObjective>(o); },
      .options = options,
  });
}
