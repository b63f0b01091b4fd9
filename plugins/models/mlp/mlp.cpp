// mlp.cpp — the `mlp` backbone: flatten the image, then Linear + activation per hidden width, then a
// Linear to the classes.
//
// Input "image" f32 [B, C, H, W] (or already flat [B, F]) -> logits f32 [B, num_classes].
// Options ([model]): hidden (comma list of widths, default "256,128"; empty: a linear classifier),
// activation (relu | gelu | silu, default relu), num_classes (required), and the input size: either
// in_features, or in_channels + image_size ("28" or "28,28"); the classify objective fills
// num_classes, in_channels and image_size from the data.
// Parameters: layers.0.weight, layers.0.bias, ..., layers.N.weight/bias (N = the output layer),
// PyTorch's nn.Linear layout [out, in], initialised U(-1/sqrt(in), 1/sqrt(in)).
#include <cstdlib>
#include <dew/error.hpp>
#include <dew/model.hpp>
#include <dew/registry.hpp>
#include <string>
#include <vector>

namespace {

using dew::Activation;
using dew::Options;
using dew::Tensor;

Activation parse_activation(const std::string& s) {
  if (s == "relu") return Activation::relu;
  if (s == "gelu") return Activation::gelu;
  if (s == "silu") return Activation::silu;
  DEW_USAGE_CHECK(false, "option 'model.activation' must be relu, gelu or silu, got '", s, "'");
  return Activation::relu;
}

class Mlp final : public dew::Model {
 public:
  explicit Mlp(const Options& o) {
    DEW_USAGE_CHECK(o.has("num_classes"),
                    "mlp: missing required option 'model.num_classes' (the classify objective "
                    "sets it from the data)");
    num_classes_ = o.get_int("num_classes", 0);
    DEW_USAGE_CHECK(num_classes_ > 1, "option 'model.num_classes' must be at least 2, got ", num_classes_);
    activation_name_ = o.get_string("activation", "relu");
    act_ = parse_activation(activation_name_);
    hidden_ = o.get_positive_ints("hidden", {256, 128});

    // Input size: in_features, or in_channels x image_size (both read when given, so they count as used).
    const int64_t in_features = o.get_int("in_features", 0);
    int64_t from_image = 0;
    if (o.has("image_size") || o.has("in_channels")) {
      const int64_t channels = o.get_int("in_channels", 1);
      DEW_USAGE_CHECK(channels > 0, "option 'model.in_channels' must be positive, got ", channels);
      const std::vector<int64_t> size = o.get_positive_ints("image_size", {});
      DEW_USAGE_CHECK(size.size() == 1 || size.size() == 2,
                      "option 'model.image_size' must be one size or 'height,width' (mlp needs it, or in_features)");
      const int64_t h = size[0];
      const int64_t w = size.size() == 2 ? size[1] : h;
      from_image = channels * h * w;
    }
    DEW_USAGE_CHECK(in_features > 0 || from_image > 0,
                    "mlp: the input size is unknown: set 'model.in_features' or 'model.in_channels' and "
                    "'model.image_size'");
    DEW_USAGE_CHECK(in_features <= 0 || from_image <= 0 || in_features == from_image,
                    "mlp: model.in_features = ", in_features,
                    " disagrees with in_channels x image_size = ", from_image);
    in_features_ = in_features > 0 ? in_features : from_image;

    int64_t prev = in_features_;
    std::vector<int64_t> widths = hidden_;
    widths.push_back(num_classes_);
    for (size_t i = 0; i < widths.size(); ++i) {
      layers_.push_back(
          register_module("layers." + std::to_string(i), std::make_shared<dew::nn::Linear>(prev, widths[i])));
      flops_ += 2.0 * double(prev) * double(widths[i]);
      prev = widths[i];
    }
  }

  Tensor forward(const dew::Batch& inputs) override {
    auto it = inputs.find("image");
    DEW_CHECK(it != inputs.end(), "mlp: forward needs an 'image' input");
    const Tensor& image = it->second;
    DEW_CHECK(image.ndim() >= 2, "mlp: 'image' must be [B, C, H, W] or [B, F], got ", dew::shape_str(image.shape()));
    const int64_t b = image.shape()[0];
    DEW_CHECK(b == 0 || image.numel() / b == in_features_, "mlp: 'image' ", dew::shape_str(image.shape()), " has ",
              b == 0 ? 0 : image.numel() / b, " features per sample; the model was built for ", in_features_);
    Tensor x = dew::reshape(image, {b, in_features_});
    for (size_t i = 0; i < layers_.size(); ++i)
      x = layers_[i]->forward(x, i + 1 < layers_.size() ? act_ : Activation::none);
    return x;
  }

  double flops_per_sample() const override { return flops_; }

  std::map<std::string, std::string> describe() const override {
    std::string hidden;
    for (int64_t h : hidden_) hidden += (hidden.empty() ? "" : ",") + std::to_string(h);
    return {{"model_type", "mlp"},
            {"in_features", std::to_string(in_features_)},
            {"hidden", hidden},
            {"activation", activation_name_},
            {"num_classes", std::to_string(num_classes_)},
            {"num_parameters", std::to_string(num_parameters())}};
  }

 private:
  int64_t num_classes_ = 0, in_features_ = 0;
  std::vector<int64_t> hidden_;
  std::string activation_name_;
  Activation act_ = Activation::relu;
  std::vector<std::shared_ptr<dew::nn::Linear>> layers_;
  double flops_ = 0.0;
};

}  // namespace

DEW_PLUGIN("mlp", "0.1.0") {
  registrar.add<dew::Model>({
      .name = "mlp",
      .description = "fully connected image classifier: flatten, Linear+activation per hidden width, Linear to classes",
      .factory = [](const dew::Options& o) { return std::make_shared<Mlp>(o); },
      .options = {{"hidden", "256,128", "hidden widths, comma-separated (empty: a linear classifier)"},
                  {"activation", "relu", "relu | gelu | silu"},
                  {"num_classes", "", "number of classes (set by the classify objective from the data)"},
                  {"in_features", "", "flat input size (else in_channels x image_size)"},
                  {"in_channels", "", "image channels (set by the classify objective)"},
                  {"image_size", "", "image side, or 'height,width' (set by the classify objective)"}},
  });
}
