// classify.cpp — the `classify` objective: one backbone ([model] section), cross-entropy on labels.
//
// Batch fields: "image" u8 [B, H, W, C] (or [B, H, W]; a floating image is taken as already in [0, 1])
// and "label" i32 [B]. step() turns the image into f32 [B, C, H, W] on the device with dew ops
// (permute, cast, then (x/255 - mean)/std), runs the model to logits [B, classes] and returns the mean
// cross-entropy plus the batch accuracy. validate() runs exactly one epoch of the split it is given,
// without gradients, and returns loss and accuracy over every record once.
// build() fills the [model] keys the data decides when the config leaves them out: num_classes (from
// [objective] num_classes, else 1 + the largest label of the training source), in_channels and
// image_size (from the first training record's image shape).
// Options ([objective]): num_classes (0 = from the data), mean and std of the normalisation (0.5, 0.5).
// Parameters: the model's, prefixed "model.".
#include <algorithm>
#include <dew/autograd.hpp>
#include <dew/error.hpp>
#include <dew/objective.hpp>
#include <dew/registry.hpp>
#include <string>

namespace {

using dew::Tensor;

class Classify final : public dew::Objective {
 public:
  explicit Classify(const dew::Options& o) { read_options(o); }

  void build(dew::ObjectiveContext& ctx) override {
    DEW_CHECK(ctx.config != nullptr, "classify: build() needs the run config");
    read_options(ctx.config->section("objective"));  // marks the keys used in the run config itself
    if (ctx.backend) {
      backend_ = ctx.backend;
      dew::set_default_backend(ctx.backend);  // the model's parameters are created on the default backend
    } else {
      backend_ = dew::default_backend();
    }
    dew::Options& model = ctx.config->section("model");

    if (ctx.train_source && ctx.train_source->size() > 0) {
      const dew::Record first = ctx.train_source->get(0);
      auto it = first.find("image");
      DEW_USAGE_CHECK(it != first.end(), "classify: the training source ", ctx.train_source->identity(),
                      " has no 'image' field");
      const dew::Shape& s = it->second.shape;
      DEW_USAGE_CHECK(s.size() == 2 || s.size() == 3, "classify: an 'image' record must be [H, W, C] or [H, W], got ",
                      dew::shape_str(s));
      const int64_t h = s[0], w = s[1], c = s.size() == 3 ? s[2] : 1;
      if (!model.has("in_channels")) model.set("in_channels", std::to_string(c));
      if (!model.has("image_size"))
        model.set("image_size", h == w ? std::to_string(h) : std::to_string(h) + "," + std::to_string(w));
      if (!model.has("num_classes")) {
        int64_t classes = num_classes_;
        if (classes <= 0) classes = 1 + max_label(*ctx.train_source);
        model.set("num_classes", std::to_string(classes));
      }
    } else if (!model.has("num_classes") && num_classes_ > 0) {
      model.set("num_classes", std::to_string(num_classes_));
    }
    DEW_USAGE_CHECK(model.has("num_classes"),
                    "classify: the number of classes is unknown: set 'model.num_classes' or "
                    "'objective.num_classes' (there is no training source to count them)");

    model_ = dew::create_model(model);
    model_->initialize(ctx.seed);
    num_classes_ = std::stoll(model.values().at("num_classes"));
    if (ctx.train_source && ctx.train_source->size() > 0) train_image_ = ctx.train_source->get(0).at("image").shape;
  }

  // Every validation record has a label in [0, num_classes) and an image of the training shape (checked
  // when the run starts, not at its first validation).
  void check_validation_data(dew::DataLoader& loader) override {
    const dew::DataSource& src = loader.source();
    for (int64_t i = 0, n = src.size(); i < n; ++i) {
      const dew::Record r = src.get(i);
      auto label = r.find("label");
      auto image = r.find("image");
      DEW_USAGE_CHECK(label != r.end() && image != r.end(), "classify: validation record ", i, " of ", src.identity(),
                      " lacks an 'image' or 'label' field");
      const dew::HostArray& a = label->second;
      DEW_USAGE_CHECK(a.numel() == 1 && a.dtype == dew::DType::i32, "classify: validation label ", i, " of ",
                      src.identity(), " is not one i32");
      const int64_t v = a.as<int32_t>()[0];
      DEW_USAGE_CHECK(v >= 0 && v < num_classes_, "classify: validation label ", v, " (record ", i, " of ",
                      src.identity(), ") is outside [0, ", num_classes_, "); set 'model.num_classes' to cover it");
    }
    // One validation batch through the model (as validate() will send it, after the loader's transforms):
    // images of another shape fail here. validate() seeks the loader back to its start.
    dew::NoGradGuard no_grad;
    const bool was_training = model_->training();
    model_->set_training(false);
    try {
      dew::Batch b = dew::to_device(loader.next(), backend_);
      model_->forward({{"image", preprocess(field(b, "image"))}});
    } catch (const dew::Error& e) {
      model_->set_training(was_training);
      DEW_USAGE_CHECK(false, "classify: the validation split ", src.identity(), " does not fit the model (training images ",
                      dew::shape_str(train_image_), "): ", e.what());
    }
    model_->set_training(was_training);
  }

  std::vector<std::string> batch_fields() const override { return {"image", "label"}; }

  dew::NamedTensors parameters() override {
    DEW_CHECK(model_, "classify: parameters() before build()");
    dew::NamedTensors out;
    for (auto& [name, t] : model_->named_parameters()) out.emplace_back("model." + name, t);
    return out;
  }

  dew::StepResult step(const dew::Batch& batch, const dew::StepInfo&) override {
    DEW_CHECK(model_, "classify: step() before build()");
    model_->set_training(true);
    const Tensor& label = field(batch, "label");
    Tensor logits = model_->forward({{"image", preprocess(field(batch, "image"))}});
    std::vector<int32_t> truth;
    const Tensor target = targets(label, logits, truth);
    dew::StepResult r;
    r.loss = dew::cross_entropy(logits, target);
    r.samples = logits.shape()[0];
    r.metrics["accuracy"] = r.samples > 0 ? double(correct(logits, truth)) / double(r.samples) : 0.0;
    return r;
  }

  dew::ValidationResult validate(dew::DataLoader& loader, const dew::StepInfo&) override {
    DEW_CHECK(model_, "classify: validate() before build()");
    dew::NoGradGuard no_grad;
    const bool was_training = model_->training();
    model_->set_training(false);
    // One epoch = the next n stream indices (the split is read in order, so any n consecutive indices
    // are every record once); rows at or past n belong to the next epoch: dropped (dew/data.hpp).
    const int64_t n = loader.source().size();
    double loss_sum = 0.0;
    int64_t hits = 0, seen = 0;
    dew::for_each_pass_batch(loader, n, 0, backend_, [&](const dew::Batch& b, int64_t, int64_t use) {
      Tensor logits = model_->forward({{"image", preprocess(field(b, "image"))}});
      std::vector<int32_t> truth;
      const Tensor target = targets(field(b, "label"), logits, truth);
      loss_sum += dew::cross_entropy(logits, target).item() * double(use);
      hits += correct(logits, truth);
      seen += use;
    });
    model_->set_training(was_training);
    dew::ValidationResult r;
    r.sums = {{"loss", loss_sum}, {"hits", double(hits)}, {"records", double(seen)}};
    r.metrics = validation_metrics(r.sums);
    return r;
  }

  bool shards_validation() const override { return true; }
  std::map<std::string, double> validation_metrics(const std::map<std::string, double>& sums) const override {
    const double seen = sums.at("records");
    return {{"loss", seen > 0 ? sums.at("loss") / seen : 0.0}, {"accuracy", seen > 0 ? sums.at("hits") / seen : 0.0}};
  }

  std::string primary_metric() const override { return "accuracy"; }
  bool higher_is_better() const override { return true; }
  double train_flops_per_sample() const override { return model_ ? 3.0 * model_->flops_per_sample() : 0.0; }
  dew::Model* main_model() override { return model_.get(); }

 private:
  void read_options(const dew::Options& o) {
    num_classes_ = o.get_int("num_classes", 0);
    DEW_USAGE_CHECK(num_classes_ == 0 || num_classes_ > 1,
                    "option 'objective.num_classes' must be 0 (from the data) "
                    "or at least 2, got ",
                    num_classes_);
    mean_ = o.get_double("mean", 0.5);
    std_ = o.get_double("std", 0.5);
    DEW_USAGE_CHECK(std_ > 0.0, "option 'objective.std' must be positive, got ", std_);
  }

  static const Tensor& field(const dew::Batch& b, const char* name) {
    auto it = b.find(name);
    DEW_CHECK(it != b.end(), "classify: the batch has no '", name, "' field");
    return it->second;
  }

  static int64_t max_label(const dew::DataSource& src) {
    int64_t best = -1;
    for (int64_t i = 0, n = src.size(); i < n; ++i) {
      const dew::Record r = src.get(i);
      auto it = r.find("label");
      DEW_USAGE_CHECK(it != r.end(), "classify: the training source ", src.identity(), " has no 'label' field");
      const dew::HostArray& a = it->second;
      DEW_USAGE_CHECK(a.numel() == 1 && a.dtype == dew::DType::i32, "classify: a 'label' record must be one i32, got ",
                      dew::dtype_name(a.dtype), " ", dew::shape_str(a.shape));
      best = std::max<int64_t>(best, a.as<int32_t>()[0]);
    }
    DEW_USAGE_CHECK(best >= 1, "classify: the training labels of ", src.identity(), " name fewer than 2 classes");
    return best;
  }

  // u8 [B, H, W, C] (or [B, H, W]) -> f32 [B, C, H, W], (x / 255 - mean) / std.
  Tensor preprocess(const Tensor& image) const {
    Tensor x = image;
    if (x.ndim() == 3) x = dew::reshape(x, {x.shape()[0], x.shape()[1], x.shape()[2], 1});
    DEW_CHECK(x.ndim() == 4, "classify: 'image' must be [B, H, W, C], got ", dew::shape_str(image.shape()));
    x = dew::permute(x, {0, 3, 1, 2});  // permute the bytes first: 4x less to move than in f32
    const bool bytes = x.dtype() == dew::DType::u8;
    x = dew::cast(x, dew::DType::f32);
    const double s = (bytes ? 1.0 / 255.0 : 1.0) / std_;
    return dew::add_scalar(dew::scale(x, float(s)), float(-mean_ / std_));
  }

  // The labels as i32 [B] on the device, and on the host in `truth` (checked against the class count
  // before any kernel reads them).
  Tensor targets(const Tensor& label, const Tensor& logits, std::vector<int32_t>& truth) const {
    const int64_t b = logits.shape()[0];
    DEW_CHECK(label.numel() == b, "classify: 'label' has ", label.numel(), " entries for ", b, " images");
    Tensor t = label.dtype() == dew::DType::i32 ? label : dew::cast(label, dew::DType::i32);
    if (t.ndim() != 1) t = dew::reshape(t, {b});
    truth = t.to_ints();
    for (int32_t v : truth)
      DEW_CHECK(v >= 0 && v < num_classes_, "classify: label ", v, " is outside [0, ", num_classes_,
                "); set 'model.num_classes' to cover every label");
    return t;
  }

  static int64_t correct(const Tensor& logits, const std::vector<int32_t>& truth) {
    const std::vector<int32_t> pred = dew::argmax(logits.detach()).to_ints();
    int64_t hits = 0;
    for (size_t i = 0; i < pred.size(); ++i) hits += pred[i] == truth[i];
    return hits;
  }

  std::shared_ptr<dew::Model> model_;
  dew::BackendPtr backend_;
  int64_t num_classes_ = 0;
  dew::Shape train_image_;  // the first training record's image shape
  double mean_ = 0.5, std_ = 0.5;
};

}  // namespace

DEW_PLUGIN("classify", "0.1.0") {
  registrar.add<dew::Objective>({
      .name = "classify",
      .description = "image classification: cross-entropy of the [model] backbone's logits; accuracy metric",
      .factory = [](const dew::Options& o) { return std::make_shared<Classify>(o); },
      .options = {{"num_classes", "0", "number of classes (0: 1 + the largest training label)"},
                  {"mean", "0.5", "normalisation: (x/255 - mean) / std"},
                  {"std", "0.5", "normalisation: (x/255 - mean) / std"}},
  });
}
