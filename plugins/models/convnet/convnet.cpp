// convnet.cpp — the `convnet` backbone: a small all-convolutional classifier with GroupNorm.
//
// For each width c in `channels`: `depth` blocks conv3x3(stride 1) -> GroupNorm -> ReLU (the first
// changes the width to c), then one block conv3x3(stride 2, c -> c) -> GroupNorm -> ReLU that halves
// the resolution; then a global average pool over H, W (pool = avg) or a flatten (pool = flatten), and
// a Linear to the classes. With the defaults (channels 32,64, depth 1) a 28x28 image goes
// 28 -> 14 -> 7 -> pool -> 10 logits.
// Input "image" f32 [B, C, H, W] -> logits f32 [B, num_classes].
// Options ([model]): channels (default "32,64"), depth (stride-1 blocks per stage, default 1), groups
// (GroupNorm groups, default 8, capped at the width), pool (avg | flatten, default avg), num_classes
// (required), in_channels (default 1), image_size ("28" or "28,28"; used for FLOPs, and needed by
// pool = flatten; avg pooling makes the net size-agnostic). The classify objective fills num_classes,
// in_channels and image_size from the data.
// Parameters: blocks.<i>.conv.weight [O, C, 3, 3] (no bias: the norm follows), blocks.<i>.norm.weight,
// blocks.<i>.norm.bias, head.weight [classes, c_last] (flatten: [classes, c_last*h*w]), head.bias.
#include <algorithm>
#include <cstdlib>
#include <dew/error.hpp>
#include <dew/model.hpp>
#include <dew/registry.hpp>
#include <string>
#include <vector>

namespace {

using dew::Options;
using dew::Tensor;

class ConvBlock final : public dew::nn::Module {
 public:
  ConvBlock(int64_t in, int64_t out, int64_t stride, int64_t groups) {
    conv = register_module("conv", std::make_shared<dew::nn::Conv2d>(in, out, 3, stride, 1, 1, /*bias=*/false));
    norm = register_module("norm", std::make_shared<dew::nn::GroupNorm>(groups, out));
  }
  Tensor forward(const Tensor& x) const { return dew::relu(norm->forward(conv->forward(x))); }
  std::shared_ptr<dew::nn::Conv2d> conv;
  std::shared_ptr<dew::nn::GroupNorm> norm;
};

class ConvNet final : public dew::Model {
 public:
  explicit ConvNet(const Options& o) {
    DEW_USAGE_CHECK(o.has("num_classes"),
                    "convnet: missing required option 'model.num_classes' (the classify "
                    "objective sets it from the data)");
    num_classes_ = o.get_int("num_classes", 0);
    DEW_USAGE_CHECK(num_classes_ > 1, "option 'model.num_classes' must be at least 2, got ", num_classes_);
    in_channels_ = o.get_int("in_channels", 1);
    DEW_USAGE_CHECK(in_channels_ > 0, "option 'model.in_channels' must be positive, got ", in_channels_);
    channels_ = o.get_positive_ints("channels", {32, 64});
    DEW_USAGE_CHECK(!channels_.empty(), "option 'model.channels' must name at least one width");
    depth_ = o.get_int("depth", 1);
    DEW_USAGE_CHECK(depth_ >= 0, "option 'model.depth' must be >= 0, got ", depth_);
    pool_ = o.get_string("pool", "avg");
    DEW_USAGE_CHECK(pool_ == "avg" || pool_ == "flatten", "option 'model.pool' must be avg or flatten, got '", pool_,
                    "'");
    groups_ = o.get_int("groups", 8);
    DEW_USAGE_CHECK(groups_ > 0, "option 'model.groups' must be positive, got ", groups_);
    const std::vector<int64_t> size = o.get_positive_ints("image_size", {});
    DEW_USAGE_CHECK(size.size() <= 2, "option 'model.image_size' must be one size or 'height,width'");
    if (!size.empty()) {
      height_ = size[0];
      width_ = size.size() == 2 ? size[1] : height_;
    }

    int64_t c = in_channels_, h = height_, w = width_;
    auto add_block = [&](int64_t out, int64_t stride) {
      const int64_t g = std::min(groups_, out);
      DEW_USAGE_CHECK(out % g == 0, "convnet: width ", out, " does not split into ", g,
                      " GroupNorm groups (option 'model.groups')");
      blocks_.push_back(
          register_module("blocks." + std::to_string(blocks_.size()), std::make_shared<ConvBlock>(c, out, stride, g)));
      h = (h + 2 - 3) / stride + 1;
      w = (w + 2 - 3) / stride + 1;
      flops_ += 2.0 * double(h * w) * double(out) * double(c * 9);
      c = out;
    };
    for (int64_t width : channels_) {
      for (int64_t i = 0; i < depth_; ++i) add_block(width, 1);
      add_block(width, 2);
    }
    if (pool_ == "flatten") {
      DEW_USAGE_CHECK(height_ > 0, "convnet: pool = flatten needs 'model.image_size'");
      c *= h * w;
      feat_h_ = h;
      feat_w_ = w;
    }
    head_ = register_module("head", std::make_shared<dew::nn::Linear>(c, num_classes_));
    flops_ += 2.0 * double(c) * double(num_classes_);
    if (height_ == 0) flops_ = 0.0;  // unknown without the image size
  }

  Tensor forward(const dew::Batch& inputs) override {
    Tensor x = trunk(inputs);
    const int64_t n = x.shape()[0], c = x.shape()[1];
    if (pool_ == "flatten") {
      DEW_CHECK(x.shape()[2] == feat_h_ && x.shape()[3] == feat_w_, "convnet: built for ", height_, "x", width_,
                " images (pool = flatten), got ", dew::shape_str(inputs.at("image").shape()));
      x = dew::reshape(x, {n, -1});  // [B, C*h*w] in (C, h, w) order
    } else {
      x = dew::mean(dew::reshape(x, {n, c, -1}), 2);  // global average pool -> [B, C]
    }
    return head_->forward(x);
  }

  // The last convolution block averaged over positions, [B, c_last], whatever `pool` is: a compact
  // representation (like Inception's pool3 for FID) for probes and the Fréchet distance.
  Tensor features(const dew::Batch& inputs) override {
    Tensor x = trunk(inputs);
    return dew::mean(dew::reshape(x, {x.shape()[0], x.shape()[1], -1}), 2);
  }

  double flops_per_sample() const override { return flops_; }

  std::map<std::string, std::string> describe() const override {
    std::string channels;
    for (int64_t c : channels_) channels += (channels.empty() ? "" : ",") + std::to_string(c);
    return {{"model_type", "convnet"},
            {"channels", channels},
            {"depth", std::to_string(depth_)},
            {"groups", std::to_string(groups_)},
            {"pool", pool_},
            {"in_channels", std::to_string(in_channels_)},
            {"image_size",
             height_ == width_ ? std::to_string(height_) : std::to_string(height_) + "," + std::to_string(width_)},
            {"num_classes", std::to_string(num_classes_)},
            {"num_parameters", std::to_string(num_parameters())}};
  }

 private:
  // The convolution blocks on the checked "image" input: [B, c_last, h, w].
  Tensor trunk(const dew::Batch& inputs) const {
    auto it = inputs.find("image");
    DEW_CHECK(it != inputs.end(), "convnet: forward needs an 'image' input");
    const Tensor& x0 = it->second;
    DEW_CHECK(x0.ndim() == 4 && x0.shape()[1] == in_channels_, "convnet: 'image' must be [B, ", in_channels_,
              ", H, W], got ", dew::shape_str(x0.shape()));
    Tensor x = x0;
    for (const auto& b : blocks_) x = b->forward(x);
    return x;
  }

  int64_t num_classes_ = 0, in_channels_ = 1, depth_ = 1, groups_ = 8, height_ = 0, width_ = 0;
  int64_t feat_h_ = 0, feat_w_ = 0;
  std::string pool_;
  std::vector<int64_t> channels_;
  std::vector<std::shared_ptr<ConvBlock>> blocks_;
  std::shared_ptr<dew::nn::Linear> head_;
  double flops_ = 0.0;
};

}  // namespace

DEW_PLUGIN("convnet", "0.1.0") {
  registrar.add<dew::Model>({
      .name = "convnet",
      .description =
          "small GroupNorm CNN classifier: conv3x3 blocks, stride-2 downsampling, global average pool, Linear",
      .factory = [](const dew::Options& o) { return std::make_shared<ConvNet>(o); },
      .options = {{"channels", "32,64", "stage widths; each stage ends with a stride-2 block"},
                  {"depth", "1", "stride-1 conv blocks per stage before its stride-2 block"},
                  {"groups", "8", "GroupNorm groups (capped at the width)"},
                  {"pool", "avg", "avg: global average pool before the head; flatten: the head sees every position"},
                  {"num_classes", "", "number of classes (set by the classify objective from the data)"},
                  {"in_channels", "1", "image channels (set by the classify objective)"},
                  {"image_size", "", "image side or 'height,width' (set by the classify objective; for FLOPs)"}},
  });
}
