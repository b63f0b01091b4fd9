// vit.cpp — the `vit` plugin: two backbones of I-JEPA, `vit_encoder` and `jepa_predictor`.
//
// Both stack the same pre-norm ViT block: x += attn(LN(x)); x += MLP(LN(x)) (GELU, hidden mlp_ratio*dim),
// bidirectional multi-head attention through the fused attention op (no mask: a subset of tokens is a
// gather, not a mask), built from the SDK blocks nn::Attention, nn::MLP, nn::LayerNorm, nn::PatchEmbed.
// Positions are fixed 2-D sin-cos embeddings (MAE layout) that are added to each token before any
// subset is taken, so a position travels with its token: permuting the token indices
// permutes the output rows and nothing else. Linear weights start as N(0, 0.02) with zero biases; the
// residual output projections (attn.o_proj, mlp.fc2) of layer l are scaled by 1/sqrt(2(l+1)) (I-JEPA).
// With [trainer] recompute = blocks each block of a recorded forward goes through dew::recompute_block
// (dew/autograd.hpp): only its input is kept, and it runs again in the backward.
//
// vit_encoder
//   inputs: "image" f32 [B, C, H, W]; optional "token_idx" i32 [B, K] (indices into the raster grid
//   of H/patch x W/patch patches, any order). Output [B, K, dim] (K = all patches, raster order, when
//   token_idx is absent), after a final LayerNorm.
//   options: image_size ("28" or "H,W"; set by the jepa objective from the data), in_channels (1),
//   patch (4), dim (192), depth (6), heads (6), mlp_ratio (4).
//   parameters: patch_embed.proj.{weight,bias}, blocks.<l>.{norm1,norm2}.{weight,bias},
//   blocks.<l>.attn.{q,k,v,o}_proj.{weight,bias}, blocks.<l>.mlp.{fc1,fc2}.{weight,bias}, norm.{weight,bias}.
//
// jepa_predictor
//   inputs: "context" f32 [B, Nc, embed_dim] (encoder outputs of the context tokens), "context_idx" i32
//   [B, Nc] (their grid indices), "target_idx" i32 [B, M, A] (M target blocks of A tokens). Output
//   [B, M, A, embed_dim]: the predicted encoder embeddings of every target token.
//   The context is projected to `dim`, gets the predictor's positions; each target token is the learnt
//   mask token plus its position. Each block is predicted from the context alone (the M blocks are
//   folded into the batch: [B*M, Nc + A, dim]), so the output is equivariant to the order of blocks.
//   options: embed_dim and grid ("7" or "h,w"; set by the jepa objective from the encoder), dim (96),
//   depth (4), heads (4), mlp_ratio (4).
//   parameters: predictor_embed.{weight,bias}, mask_token [dim], blocks.<l>..., norm.{weight,bias},
//   predictor_proj.{weight,bias}.
#include <cmath>
#include <dew/autograd.hpp>
#include <dew/error.hpp>
#include <dew/model.hpp>
#include <dew/registry.hpp>
#include <string>
#include <vector>

namespace {

using dew::Options;
using dew::Tensor;
using dew::nn::Init;

constexpr float kInitStd = 0.02f;

std::shared_ptr<dew::nn::Linear> linear_layer(int64_t in, int64_t out, float std = kInitStd) {
  return std::make_shared<dew::nn::Linear>(in, out, true, Init::Normal(std), Init::Zeros());
}

// The pre-norm block from the SDK's attention and MLP: bidirectional, no rotary positions, biases
// everywhere; weights N(0, 0.02), the residual outputs N(0, out_std), biases 0.
class Block final : public dew::nn::Module {
 public:
  Block(int64_t dim, int64_t heads, int64_t hidden, int64_t layer) {
    DEW_USAGE_CHECK(heads > 0 && dim % heads == 0, "vit: width ", dim, " is not a multiple of ", heads, " heads");
    const float out_std = kInitStd / std::sqrt(2.0f * float(layer + 1));
    const dew::nn::ProjectionInit init{Init::Normal(kInitStd), Init::Zeros(), Init::Normal(out_std), Init::Zeros()};
    dew::nn::AttentionConfig a;
    a.dim = dim;
    a.num_heads = heads;
    a.rotary_dim = -1;
    a.causal = false;
    a.bias = a.o_bias = true;
    a.init = init;
    norm1 = register_module("norm1", std::make_shared<dew::nn::LayerNorm>(dim, 1e-6f));
    attn = register_module("attn", std::make_shared<dew::nn::Attention>(a));
    norm2 = register_module("norm2", std::make_shared<dew::nn::LayerNorm>(dim, 1e-6f));
    mlp = register_module("mlp",
                          std::make_shared<dew::nn::MLP>(dim, hidden, dim, dew::Activation::gelu_tanh, true, init));
  }
  Tensor forward(const Tensor& x0) const {
    Tensor x = dew::add(x0, attn->forward(norm1->forward(x0), Tensor()));
    return dew::add(x, mlp->forward(norm2->forward(x)));
  }
  std::shared_ptr<dew::nn::LayerNorm> norm1, norm2;
  std::shared_ptr<dew::nn::Attention> attn;
  std::shared_ptr<dew::nn::MLP> mlp;
};

// FLOPs (2 x multiply-adds) of one block over t tokens.
double block_flops(int64_t t, int64_t dim, int64_t hidden) {
  return 2.0 * double(t) * double(4 * dim * dim + 2 * dim * hidden) + 4.0 * double(t) * double(t) * double(dim);
}

std::vector<int64_t> grid_option(const Options& o, const char* key, const std::string& who) {
  DEW_USAGE_CHECK(o.has(key), who, ": missing required option 'model.", key, "' (the jepa objective sets it)");
  std::vector<int64_t> v = o.get_positive_ints(key, {});
  DEW_USAGE_CHECK(v.size() == 1 || v.size() == 2, who, ": option '", key, "' must be one size or 'height,width'");
  if (v.size() == 1) v.push_back(v[0]);
  return v;
}

const Tensor& input(const dew::Batch& in, const char* name, const char* who) {
  auto it = in.find(name);
  DEW_CHECK(it != in.end(), who, ": forward needs a '", name, "' input");
  return it->second;
}

// Checks i32 indices [..] are within [0, n) (the gather kernel would refuse them less clearly).
void check_indices(const Tensor& idx, int64_t n, const char* who, const char* name) {
  DEW_CHECK(idx.dtype() == dew::DType::i32, who, ": '", name, "' must be i32, got ", dew::dtype_name(idx.dtype()));
  for (int32_t v : idx.to_ints())
    DEW_CHECK(v >= 0 && v < n, who, ": '", name, "' holds index ", v, " outside the ", n, "-token grid");
}

class VitEncoder final : public dew::Model {
 public:
  explicit VitEncoder(const Options& o) {
    const std::vector<int64_t> size = grid_option(o, "image_size", "vit_encoder");
    in_channels_ = o.get_int("in_channels", 1);
    patch_ = o.get_int("patch", 4);
    dim_ = o.get_int("dim", 192);
    depth_ = o.get_int("depth", 6);
    heads_ = o.get_int("heads", 6);
    mlp_ratio_ = o.get_double("mlp_ratio", 4.0);
    DEW_USAGE_CHECK(in_channels_ > 0, "vit_encoder: option 'model.in_channels' must be positive");
    DEW_USAGE_CHECK(patch_ > 0, "vit_encoder: option 'model.patch' must be positive, got ", patch_);
    DEW_USAGE_CHECK(size[0] % patch_ == 0 && size[1] % patch_ == 0, "vit_encoder: image ", size[0], "x", size[1],
                    " does not split into ", patch_, "x", patch_, " patches (option 'model.patch')");
    DEW_USAGE_CHECK(dim_ > 0 && dim_ % 4 == 0,
                    "vit_encoder: option 'model.dim' must be a positive multiple of 4 (2-D "
                    "sin-cos positions), got ",
                    dim_);
    DEW_USAGE_CHECK(depth_ >= 1, "vit_encoder: option 'model.depth' must be at least 1");
    DEW_USAGE_CHECK(mlp_ratio_ > 0, "vit_encoder: option 'model.mlp_ratio' must be positive");
    height_ = size[0];
    width_ = size[1];
    gh_ = height_ / patch_;
    gw_ = width_ / patch_;
    hidden_ = int64_t(std::lround(mlp_ratio_ * double(dim_)));
    patch_embed_ = register_module("patch_embed", std::make_shared<dew::nn::PatchEmbed>(in_channels_, dim_, patch_));
    for (int64_t l = 0; l < depth_; ++l)
      blocks_.push_back(
          register_module("blocks." + std::to_string(l), std::make_shared<Block>(dim_, heads_, hidden_, l)));
    norm_ = register_module("norm", std::make_shared<dew::nn::LayerNorm>(dim_, 1e-6f));
  }

  Tensor forward(const dew::Batch& in) override {
    const Tensor& img = input(in, "image", "vit_encoder");
    DEW_CHECK(
        img.ndim() == 4 && img.shape()[1] == in_channels_ && img.shape()[2] == height_ && img.shape()[3] == width_,
        "vit_encoder: 'image' must be [B, ", in_channels_, ", ", height_, ", ", width_, "], got ",
        dew::shape_str(img.shape()));
    const int64_t b = img.shape()[0], n = gh_ * gw_;
    if (!pos_.defined() || pos_.backend_ptr() != img.backend_ptr())
      pos_ = dew::reshape(dew::nn::sincos_2d_positions(gh_, gw_, dim_, img.backend_ptr()), {1, n, dim_});
    Tensor x = dew::add(patch_embed_->forward(img), pos_);  // [B, N, D]: each token carries its position
    auto it = in.find("token_idx");
    if (it != in.end()) {
      const Tensor& idx = it->second;
      DEW_CHECK(idx.ndim() == 2 && idx.shape()[0] == b, "vit_encoder: 'token_idx' must be i32 [", b, ", K], got ",
                dew::shape_str(idx.shape()));
      check_indices(idx, n, "vit_encoder", "token_idx");
      x = dew::gather_rows(x, idx);
    }
    for (const auto& blk : blocks_) {  // each block may be recomputed in the backward ([trainer] recompute)
      const Block* block = blk.get();
      x = dew::recompute_block([block](const std::vector<Tensor>& in) { return block->forward(in[0]); }, {x},
                               blk->parameters());
    }
    return norm_->forward(x);
  }

  double flops_per_sample() const override {
    const int64_t n = gh_ * gw_;
    return 2.0 * double(n) * double(patch_ * patch_ * in_channels_ * dim_) +
           double(depth_) * block_flops(n, dim_, hidden_);
  }
  std::map<std::string, std::string> describe() const override {
    return {{"model_type", "vit_encoder"},
            {"image_size", std::to_string(height_) + "," + std::to_string(width_)},
            {"in_channels", std::to_string(in_channels_)},
            {"patch", std::to_string(patch_)},
            {"dim", std::to_string(dim_)},
            {"depth", std::to_string(depth_)},
            {"heads", std::to_string(heads_)},
            {"mlp_ratio", std::to_string(mlp_ratio_)},
            {"num_patches", std::to_string(gh_ * gw_)},
            {"num_parameters", std::to_string(num_parameters())}};
  }

 private:
  int64_t in_channels_ = 1, patch_ = 4, dim_ = 192, depth_ = 6, heads_ = 6, hidden_ = 0;
  int64_t height_ = 0, width_ = 0, gh_ = 0, gw_ = 0;
  double mlp_ratio_ = 4.0;
  std::shared_ptr<dew::nn::PatchEmbed> patch_embed_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<dew::nn::LayerNorm> norm_;
  Tensor pos_;
};

class JepaPredictor final : public dew::Model {
 public:
  explicit JepaPredictor(const Options& o) {
    const std::vector<int64_t> grid = grid_option(o, "grid", "jepa_predictor");
    DEW_USAGE_CHECK(o.has("embed_dim"),
                    "jepa_predictor: missing required option 'embed_dim' (the jepa objective "
                    "sets it to the encoder's width)");
    embed_dim_ = o.get_int("embed_dim", 0);
    dim_ = o.get_int("dim", 96);
    depth_ = o.get_int("depth", 4);
    heads_ = o.get_int("heads", 4);
    mlp_ratio_ = o.get_double("mlp_ratio", 4.0);
    DEW_USAGE_CHECK(embed_dim_ > 0, "jepa_predictor: option 'embed_dim' must be positive");
    DEW_USAGE_CHECK(dim_ > 0 && dim_ % 4 == 0, "jepa_predictor: option 'dim' must be a positive multiple of 4, got ",
                    dim_);
    DEW_USAGE_CHECK(depth_ >= 1, "jepa_predictor: option 'depth' must be at least 1");
    DEW_USAGE_CHECK(mlp_ratio_ > 0, "jepa_predictor: option 'mlp_ratio' must be positive");
    gh_ = grid[0];
    gw_ = grid[1];
    hidden_ = int64_t(std::lround(mlp_ratio_ * double(dim_)));
    embed_ = register_module("predictor_embed", linear_layer(embed_dim_, dim_));
    mask_token_ = register_parameter("mask_token", {dim_}, Init::Normal(kInitStd));
    for (int64_t l = 0; l < depth_; ++l)
      blocks_.push_back(
          register_module("blocks." + std::to_string(l), std::make_shared<Block>(dim_, heads_, hidden_, l)));
    norm_ = register_module("norm", std::make_shared<dew::nn::LayerNorm>(dim_, 1e-6f));
    proj_ = register_module("predictor_proj", linear_layer(dim_, embed_dim_));
  }

  Tensor forward(const dew::Batch& in) override {
    const Tensor& ctx = input(in, "context", "jepa_predictor");
    const Tensor& cidx = input(in, "context_idx", "jepa_predictor");
    const Tensor& tidx = input(in, "target_idx", "jepa_predictor");
    DEW_CHECK(ctx.ndim() == 3 && ctx.shape()[2] == embed_dim_, "jepa_predictor: 'context' must be [B, Nc, ", embed_dim_,
              "], got ", dew::shape_str(ctx.shape()));
    const int64_t b = ctx.shape()[0], nc = ctx.shape()[1], n = gh_ * gw_;
    DEW_CHECK(cidx.ndim() == 2 && cidx.shape()[0] == b && cidx.shape()[1] == nc,
              "jepa_predictor: 'context_idx' must be i32 [", b, ", ", nc, "], got ", dew::shape_str(cidx.shape()));
    DEW_CHECK(tidx.ndim() == 3 && tidx.shape()[0] == b, "jepa_predictor: 'target_idx' must be i32 [", b,
              ", M, A], got ", dew::shape_str(tidx.shape()));
    check_indices(cidx, n, "jepa_predictor", "context_idx");
    check_indices(tidx, n, "jepa_predictor", "target_idx");
    const int64_t m = tidx.shape()[1], a = tidx.shape()[2];
    if (!pos_.defined() || pos_.backend_ptr() != ctx.backend_ptr())
      pos_ = dew::reshape(dew::nn::sincos_2d_positions(gh_, gw_, dim_, ctx.backend_ptr()), {1, n, dim_});
    Tensor x = dew::add(embed_->forward(ctx), dew::gather_rows(pos_, cidx));  // [B, Nc, dim]
    x = dew::reshape(dew::broadcast_to(dew::reshape(x, {b, 1, nc, dim_}), {b, m, nc, dim_}), {b * m, nc, dim_});
    Tensor tp = dew::gather_rows(pos_, dew::reshape(tidx, {b, m * a}));       // [B, M*A, dim]
    Tensor mask = dew::add(dew::reshape(tp, {b * m, a, dim_}), mask_token_);  // + the mask token
    Tensor h = dew::concat({x, mask}, 1);                                     // [B*M, Nc + A, dim]
    for (const auto& blk : blocks_) {  // each block may be recomputed in the backward ([trainer] recompute)
      const Block* block = blk.get();
      h = dew::recompute_block([block](const std::vector<Tensor>& in) { return block->forward(in[0]); }, {h},
                               blk->parameters());
    }
    h = norm_->forward(dew::slice(h, 1, nc, nc + a));
    return dew::reshape(proj_->forward(h), {b, m, a, embed_dim_});
  }

  std::map<std::string, std::string> describe() const override {
    return {{"model_type", "jepa_predictor"},          {"grid", std::to_string(gh_) + "," + std::to_string(gw_)},
            {"embed_dim", std::to_string(embed_dim_)}, {"dim", std::to_string(dim_)},
            {"depth", std::to_string(depth_)},         {"heads", std::to_string(heads_)}};
  }

 private:
  int64_t embed_dim_ = 0, dim_ = 96, depth_ = 4, heads_ = 4, hidden_ = 0, gh_ = 0, gw_ = 0;
  double mlp_ratio_ = 4.0;
  std::shared_ptr<dew::nn::Linear> embed_, proj_;
  Tensor mask_token_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<dew::nn::LayerNorm> norm_;
  Tensor pos_;
};

}  // namespace

DEW_PLUGIN("vit", "0.1.0") {
  registrar.add<dew::Model>({
      .name = "vit_encoder",
      .description = "ViT encoder (I-JEPA): patch embedding, 2-D sin-cos positions carried by each token, pre-norm "
                     "blocks; runs on any subset of token indices",
      .factory = [](const dew::Options& o) { return std::make_shared<VitEncoder>(o); },
      .options = {{"image_size", "", "image side or 'height,width' (set by the jepa objective from the data)"},
                  {"in_channels", "1", "image channels (set by the jepa objective from the data)"},
                  {"patch", "4", "patch side in pixels"},
                  {"dim", "192", "token width (a multiple of 4)"},
                  {"depth", "6", "transformer blocks"},
                  {"heads", "6", "attention heads"},
                  {"mlp_ratio", "4", "MLP hidden width / dim"}},
  });
  registrar.add<dew::Model>({
      .name = "jepa_predictor",
      .description = "I-JEPA predictor: narrow ViT over projected context tokens plus positioned mask tokens, one "
                     "pass per target block",
      .factory = [](const dew::Options& o) { return std::make_shared<JepaPredictor>(o); },
      .options = {{"embed_dim", "", "encoder width (set by the jepa objective)"},
                  {"grid", "", "patch grid side or 'h,w' (set by the jepa objective)"},
                  {"dim", "96", "predictor width (a multiple of 4)"},
                  {"depth", "4", "transformer blocks"},
                  {"heads", "4", "attention heads"},
                  {"mlp_ratio", "4", "MLP hidden width / dim"}},
  });
}
