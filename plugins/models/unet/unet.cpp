// unet.cpp — the `unet` backbone: an ADM-style (Dhariwal & Nichol) time-conditioned U-Net.
//
// forward({"x": f32 [B, C, H, W], "t": f32 [B], "label": i32 [B] (optional)}) -> f32 [B, out_channels, H, W],
// the same contract as `dit` (t: the schedule's model time, any range; label in [0, num_classes], where
// num_classes is the learned null class; a missing label = null).
// Body, with widths ch_i = channels[i] and E = 4 * channels[0]:
//   emb = TimeMLP(t) (features -> Linear(E) -> SiLU -> Linear(E)) [+ LabelEmbedding(label) [E]]
//   conv_in 3x3 -> ch_0
//   down level i: res_blocks x ResBlock(-> ch_i) [+ attention when i is in attention_levels], each output
//                 kept as a skip; then (not on the last level) Downsample = conv 3x3 stride 2, kept as a skip
//   middle: ResBlock, attention, ResBlock
//   up level i (last to first): (res_blocks + 1) x ResBlock(concat(h, skip) -> ch_i) [+ attention]; then
//                 (not on level 0) Upsample = nearest 2x + conv 3x3
//   out: GroupNorm -> SiLU -> conv 3x3 -> out_channels (zero-initialised: the untrained model outputs 0)
// ResBlock(x): h = conv1(SiLU(GN(x))); h += Linear(SiLU(emb))[:, :, None, None]; h = conv2(SiLU(GN(h)))
//   (conv2 zero-initialised); return skip(x) + h, skip = 1x1 conv when the width changes.
// Attention block(x): x + proj(MHSA(GN(x) as [B, HW, C] tokens)), fused qkv, proj zero-initialised.
// Parameter names: time_embed.mlp.{0,2}.*, label_embed.weight [num_classes + 1, E], conv_in.*,
//   down.{i}.res.{r}.{norm1,conv1,time_proj,norm2,conv2,skip}.*, down.{i}.attn.{r}.{norm,qkv,proj}.*,
//   down.{i}.downsample.*, mid.res.{0,1}.*, mid.attn.*, up.{i}.res.{r}.*, up.{i}.attn.{r}.*,
//   up.{i}.upsample.*, norm_out.*, conv_out.*.
// Options ([model]): image_size (32), in_channels (3), out_channels (= in_channels), num_classes (0),
//   channels ("64,128,256"; one width per level), res_blocks (2), attention_levels ("1": level indices,
//   0-based, empty for none; the middle always has attention), groups (GroupNorm groups, 8, capped at the
//   width), heads (4), plus the time-embedding keys of nn::TimeEmbeddingConfig. Built from the SDK blocks
//   (dew/nn.hpp): nn::Conv2d, nn::GroupNorm, nn::Attention (fused layout), nn::TimestepEmbedder. H and W must be
//   multiples of 2^(levels - 1).
// FLOPs per sample (forward): 2 * MACs of every conv and linear at its resolution + 4 * (HW)^2 * C per
//   attention block (q.k and p.v).
#include <algorithm>
#include <dew/diffusion.hpp>
#include <dew/error.hpp>
#include <dew/model.hpp>
#include <dew/registry.hpp>
#include <set>

namespace {

using dew::Options;
using dew::Tensor;
using dew::nn::Conv2d;
using dew::nn::Init;
using dew::nn::Linear;

// A k x k convolution with "same" padding: PyTorch's default init, or zeros for the residual outputs.
std::shared_ptr<Conv2d> make_conv(int64_t in, int64_t out, int64_t k, int64_t stride, bool zero) {
  const Init init = zero ? Init::Zeros() : Init{};
  return std::make_shared<Conv2d>(in, out, k, stride, k / 2, 1, true, init, init);
}
// MACs x 2 of a convolution at output size oh x ow.
double conv_flops(const Conv2d& c, int64_t oh, int64_t ow) { return 2.0 * double(c.weight.numel()) * double(oh * ow); }

int64_t groups_for(int64_t want, int64_t ch) {
  const int64_t g = std::min(want, ch);
  DEW_USAGE_CHECK(ch % g == 0, "unet: width ", ch, " does not split into ", g,
                  " GroupNorm groups (option 'model.groups')");
  return g;
}

class ResBlock final : public dew::nn::Module {
 public:
  ResBlock(int64_t in, int64_t out, int64_t emb, int64_t groups) {
    norm1 = register_module("norm1", std::make_shared<dew::nn::GroupNorm>(groups_for(groups, in), in));
    conv1 = register_module("conv1", make_conv(in, out, 3, 1, false));
    time_proj = register_module("time_proj", std::make_shared<Linear>(emb, out));
    norm2 = register_module("norm2", std::make_shared<dew::nn::GroupNorm>(groups_for(groups, out), out));
    conv2 = register_module("conv2", make_conv(out, out, 3, 1, true));
    if (in != out) skip = register_module("skip", make_conv(in, out, 1, 1, false));
  }
  Tensor forward(const Tensor& x, const Tensor& semb) const {
    const int64_t b = x.shape()[0], out = conv1->weight.shape()[0];
    Tensor h = conv1->forward(dew::silu(norm1->forward(x)));
    h = dew::add(h, dew::reshape(time_proj->forward(semb), {b, out, 1, 1}));
    h = conv2->forward(dew::silu(norm2->forward(h)));
    return dew::add(skip ? skip->forward(x) : x, h);
  }
  double flops(int64_t hh, int64_t ww) const {
    return conv_flops(*conv1, hh, ww) + conv_flops(*conv2, hh, ww) + (skip ? conv_flops(*skip, hh, ww) : 0.0) +
           2.0 * double(time_proj->weight.numel());
  }
  std::shared_ptr<dew::nn::GroupNorm> norm1, norm2;
  std::shared_ptr<Conv2d> conv1, conv2, skip;
  std::shared_ptr<Linear> time_proj;
};

// GroupNorm then the SDK attention (fused qkv layout, bidirectional, proj zero-initialised), registered
// without a name level so the block's names stay norm.*, qkv.*, proj.*.
class AttnBlock final : public dew::nn::Module {
 public:
  AttnBlock(int64_t ch, int64_t heads, int64_t groups) {
    DEW_USAGE_CHECK(ch % heads == 0, "unet: width ", ch, " is not a multiple of model.heads = ", heads);
    norm = register_module("norm", std::make_shared<dew::nn::GroupNorm>(groups_for(groups, ch), ch));
    dew::nn::AttentionConfig a;
    a.dim = ch;
    a.num_heads = heads;
    a.rotary_dim = -1;
    a.causal = false;
    a.bias = a.o_bias = true;
    a.layout = dew::nn::AttentionLayout::fused;
    a.init = {Init{}, Init{}, Init::Zeros(), Init::Zeros()};
    attn = register_module("", std::make_shared<dew::nn::Attention>(a));
  }
  Tensor forward(const Tensor& x) const {
    const int64_t b = x.shape()[0], c = x.shape()[1], hh = x.shape()[2], ww = x.shape()[3];
    Tensor tok = dew::transpose(dew::reshape(norm->forward(x), {b, c, hh * ww}), 1, 2);  // [B, HW, C]
    tok = attn->forward(tok, Tensor());
    return dew::add(x, dew::reshape(dew::transpose(tok, 1, 2), {b, c, hh, ww}));
  }
  double flops(int64_t hh, int64_t ww) const {
    const double n = double(hh * ww), c = double(attn->o_proj->weight.shape()[0]);
    return 2.0 * n * double(attn->qkv->weight.numel() + attn->o_proj->weight.numel()) + 4.0 * n * n * c;
  }
  std::shared_ptr<dew::nn::GroupNorm> norm;
  std::shared_ptr<dew::nn::Attention> attn;
};

// Nearest-neighbour 2x upsampling (a broadcast; its backward sums the 2x2 cells) then conv 3x3.
class Upsample final : public dew::nn::Module {
 public:
  explicit Upsample(int64_t ch) { conv = register_module("conv", make_conv(ch, ch, 3, 1, false)); }
  Tensor forward(const Tensor& x) const {
    const int64_t b = x.shape()[0], c = x.shape()[1], hh = x.shape()[2], ww = x.shape()[3];
    Tensor u = dew::broadcast_to(dew::reshape(x, {b, c, hh, 1, ww, 1}), {b, c, hh, 2, ww, 2});
    return conv->forward(dew::reshape(u, {b, c, 2 * hh, 2 * ww}));
  }
  std::shared_ptr<Conv2d> conv;
};

struct Level {
  std::vector<std::shared_ptr<ResBlock>> res;
  std::vector<std::shared_ptr<AttnBlock>> attn;  // null where the level has none
  std::shared_ptr<Conv2d> down;
  std::shared_ptr<Upsample> up;
};

class UNet final : public dew::Model {
 public:
  explicit UNet(const Options& o) {
    const std::vector<int64_t> size = o.get_positive_ints("image_size", {32});
    DEW_USAGE_CHECK(size.size() == 1 || size.size() == 2,
                    "option 'model.image_size' must be one size or 'height,width'");
    height_ = size[0];
    width_ = size.size() == 2 ? size[1] : size[0];
    in_channels_ = o.get_int("in_channels", 3);
    DEW_USAGE_CHECK(in_channels_ > 0, "option 'model.in_channels' must be positive, got ", in_channels_);
    out_channels_ = o.get_int("out_channels", in_channels_);
    DEW_USAGE_CHECK(out_channels_ > 0, "option 'model.out_channels' must be positive, got ", out_channels_);
    num_classes_ = o.get_int("num_classes", 0);
    DEW_USAGE_CHECK(num_classes_ >= 0, "option 'model.num_classes' must be >= 0 (0 = unconditional), got ",
                    num_classes_);
    channels_ = o.get_positive_ints("channels", {64, 128, 256});
    DEW_USAGE_CHECK(!channels_.empty(), "option 'model.channels' must name at least one width");
    res_blocks_ = o.get_int("res_blocks", 2);
    DEW_USAGE_CHECK(res_blocks_ >= 1, "option 'model.res_blocks' must be at least 1, got ", res_blocks_);
    const std::string attn_default = channels_.size() > 1 ? "1" : "";
    for (const std::string& s : o.get_strings("attention_levels", {attn_default})) {
      if (s.empty()) continue;
      char* end = nullptr;
      const long v = std::strtol(s.c_str(), &end, 10);
      DEW_USAGE_CHECK(end && *end == '\0' && v >= 0 && v < long(channels_.size()), "option 'model.attention_levels': '",
                      s, "' is not a level index in [0, ", channels_.size(), ")");
      attention_levels_.insert(v);
    }
    groups_ = o.get_int("groups", 8);
    DEW_USAGE_CHECK(groups_ > 0, "option 'model.groups' must be positive, got ", groups_);
    heads_ = o.get_int("heads", 4);
    DEW_USAGE_CHECK(heads_ > 0, "option 'model.heads' must be positive, got ", heads_);
    time_ = dew::nn::TimeEmbeddingConfig::from_options(o);
    const int64_t levels = int64_t(channels_.size()), factor = int64_t(1) << (levels - 1);
    DEW_USAGE_CHECK(height_ % factor == 0 && width_ % factor == 0, "unet: image size ", height_, "x", width_,
                    " must be a multiple of 2^(levels - 1) = ", factor, " for ", levels, " levels");

    const int64_t c0 = channels_[0], emb = 4 * c0;
    time_embed_ = register_module("time_embed", std::make_shared<dew::nn::TimestepEmbedder>(time_, emb, emb));
    flops_ += double(time_embed_->flops());
    if (num_classes_ > 0)
      label_embed_ = register_module("label_embed",
                                     std::make_shared<dew::nn::Embedding>(num_classes_ + 1, emb, Init::Normal(0.02f)));
    conv_in_ = register_module("conv_in", make_conv(in_channels_, c0, 3, 1, false));
    int64_t hh = height_, ww = width_;
    flops_ += conv_flops(*conv_in_, hh, ww);

    std::vector<int64_t> skips = {c0};
    int64_t ch = c0;
    for (int64_t i = 0; i < levels; ++i) {
      Level lv;
      const std::string at = "down." + std::to_string(i);
      for (int64_t r = 0; r < res_blocks_; ++r) {
        lv.res.push_back(register_module(at + ".res." + std::to_string(r),
                                         std::make_shared<ResBlock>(ch, channels_[size_t(i)], emb, groups_)));
        ch = channels_[size_t(i)];
        flops_ += lv.res.back()->flops(hh, ww);
        lv.attn.push_back(attention_levels_.count(i) ? register_module(at + ".attn." + std::to_string(r),
                                                                       std::make_shared<AttnBlock>(ch, heads_, groups_))
                                                     : nullptr);
        if (lv.attn.back()) flops_ += lv.attn.back()->flops(hh, ww);
        skips.push_back(ch);
      }
      if (i + 1 < levels) {
        lv.down = register_module(at + ".downsample", make_conv(ch, ch, 3, 2, false));
        hh /= 2, ww /= 2;
        flops_ += conv_flops(*lv.down, hh, ww);
        skips.push_back(ch);
      }
      down_.push_back(std::move(lv));
    }
    mid_res0_ = register_module("mid.res.0", std::make_shared<ResBlock>(ch, ch, emb, groups_));
    mid_attn_ = register_module("mid.attn", std::make_shared<AttnBlock>(ch, heads_, groups_));
    mid_res1_ = register_module("mid.res.1", std::make_shared<ResBlock>(ch, ch, emb, groups_));
    flops_ += mid_res0_->flops(hh, ww) + mid_attn_->flops(hh, ww) + mid_res1_->flops(hh, ww);
    up_.resize(size_t(levels));
    for (int64_t i = levels - 1; i >= 0; --i) {
      Level& lv = up_[size_t(i)];
      const std::string at = "up." + std::to_string(i);
      for (int64_t r = 0; r <= res_blocks_; ++r) {
        const int64_t skip = skips.back();
        skips.pop_back();
        lv.res.push_back(register_module(at + ".res." + std::to_string(r),
                                         std::make_shared<ResBlock>(ch + skip, channels_[size_t(i)], emb, groups_)));
        ch = channels_[size_t(i)];
        flops_ += lv.res.back()->flops(hh, ww);
        lv.attn.push_back(attention_levels_.count(i) ? register_module(at + ".attn." + std::to_string(r),
                                                                       std::make_shared<AttnBlock>(ch, heads_, groups_))
                                                     : nullptr);
        if (lv.attn.back()) flops_ += lv.attn.back()->flops(hh, ww);
      }
      if (i > 0) {
        lv.up = register_module(at + ".upsample", std::make_shared<Upsample>(ch));
        hh *= 2, ww *= 2;
        flops_ += conv_flops(*lv.up->conv, hh, ww);
      }
    }
    norm_out_ = register_module("norm_out", std::make_shared<dew::nn::GroupNorm>(groups_for(groups_, ch), ch));
    conv_out_ = register_module("conv_out", make_conv(ch, out_channels_, 3, 1, true));
    flops_ += conv_flops(*conv_out_, hh, ww);
  }

  Tensor forward(const dew::Batch& in) override {
    auto it = in.find("x");
    DEW_CHECK(it != in.end(), "unet: forward needs an 'x' input (f32 [B, C, H, W])");
    const Tensor& x = it->second;
    DEW_CHECK(x.ndim() == 4 && x.shape()[1] == in_channels_, "unet: 'x' must be [B, ", in_channels_, ", H, W], got ",
              dew::shape_str(x.shape()));
    const int64_t b = x.shape()[0], factor = int64_t(1) << (channels_.size() - 1);
    DEW_CHECK(x.shape()[2] % factor == 0 && x.shape()[3] % factor == 0, "unet: image ", x.shape()[2], "x", x.shape()[3],
              " is not a multiple of ", factor);
    auto ti = in.find("t");
    DEW_CHECK(ti != in.end(), "unet: forward needs a 't' input (f32 [B], the model time)");
    DEW_CHECK(ti->second.numel() == b, "unet: 't' has ", ti->second.numel(), " entries for a batch of ", b);

    Tensor emb = time_embed_->forward(dew::reshape(ti->second, {b}));
    const Tensor label = dew::diffusion::checked_label(in, b, num_classes_, "unet");
    if (label_embed_) {
      Tensor l = label.defined() ? label : Tensor::full({b}, double(num_classes_), dew::DType::i32, x.backend_ptr());
      emb = dew::add(emb, label_embed_->forward(l));
    }
    const Tensor semb = dew::silu(emb);

    Tensor h = conv_in_->forward(x);
    std::vector<Tensor> skips = {h};
    for (const Level& lv : down_) {
      for (size_t r = 0; r < lv.res.size(); ++r) {
        h = lv.res[r]->forward(h, semb);
        if (lv.attn[r]) h = lv.attn[r]->forward(h);
        skips.push_back(h);
      }
      if (lv.down) {
        h = lv.down->forward(h);
        skips.push_back(h);
      }
    }
    h = mid_res1_->forward(mid_attn_->forward(mid_res0_->forward(h, semb)), semb);
    for (size_t i = up_.size(); i-- > 0;) {
      const Level& lv = up_[i];
      for (size_t r = 0; r < lv.res.size(); ++r) {
        h = lv.res[r]->forward(dew::concat({h, skips.back()}, 1), semb);
        skips.pop_back();
        if (lv.attn[r]) h = lv.attn[r]->forward(h);
      }
      if (lv.up) h = lv.up->forward(h);
    }
    return conv_out_->forward(dew::silu(norm_out_->forward(h)));
  }

  double flops_per_sample() const override { return flops_; }

  std::map<std::string, std::string> describe() const override {
    auto join = [](const auto& v) {
      std::string s;
      for (int64_t c : v) s += (s.empty() ? "" : ",") + std::to_string(c);
      return s;
    };
    auto r = time_.describe();
    r.insert({{"model_type", "unet"},
              {"image_size",
               height_ == width_ ? std::to_string(height_) : std::to_string(height_) + "," + std::to_string(width_)},
              {"in_channels", std::to_string(in_channels_)},
              {"out_channels", std::to_string(out_channels_)},
              {"num_classes", std::to_string(num_classes_)},
              {"channels", join(channels_)},
              {"res_blocks", std::to_string(res_blocks_)},
              {"attention_levels", join(attention_levels_)},
              {"groups", std::to_string(groups_)},
              {"heads", std::to_string(heads_)},
              {"num_parameters", std::to_string(num_parameters())}});
    return r;
  }

 private:
  int64_t height_ = 32, width_ = 32, in_channels_ = 3, out_channels_ = 3, num_classes_ = 0;
  int64_t res_blocks_ = 2, groups_ = 8, heads_ = 4;
  std::vector<int64_t> channels_;
  std::set<int64_t> attention_levels_;
  dew::nn::TimeEmbeddingConfig time_;
  std::shared_ptr<dew::nn::TimestepEmbedder> time_embed_;
  std::shared_ptr<dew::nn::Embedding> label_embed_;
  std::shared_ptr<Conv2d> conv_in_, conv_out_;
  std::vector<Level> down_, up_;
  std::shared_ptr<ResBlock> mid_res0_, mid_res1_;
  std::shared_ptr<AttnBlock> mid_attn_;
  std::shared_ptr<dew::nn::GroupNorm> norm_out_;
  double flops_ = 0.0;
};

}  // namespace

DEW_PLUGIN("unet", "0.1.0") {
  std::vector<dew::OptionSpec> opts = dew::diffusion::backbone_image_option_specs();
  opts.insert(opts.end(),
              {{"channels", "64,128,256", "width of each resolution level"},
               {"res_blocks", "2", "residual blocks per level on the way down (one more on the way up)"},
               {"attention_levels", "1", "levels (0-based) with self-attention after each residual block; empty: none"},
               {"groups", "8", "GroupNorm groups (capped at the width)"},
               {"heads", "4", "attention heads"}});
  for (auto& s : dew::nn::TimeEmbeddingConfig::option_specs()) opts.push_back(s);
  registrar.add<dew::Model>({
      .name = "unet",
      .description = "ADM-style U-Net: time-conditioned GroupNorm residual blocks, self-attention at chosen "
                     "levels, strided-conv down / nearest+conv up sampling with skips",
      .factory = [](const dew::Options& o) { return std::make_shared<UNet>(o); },
      .options = std::move(opts),
  });
}
