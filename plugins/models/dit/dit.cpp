// dit.cpp — the `dit` backbone: a Diffusion Transformer (Peebles & Xie) with adaLN-Zero blocks.
//
// forward({"x": f32 [B, C, H, W], "t": f32 [B], "label": i32 [B] (optional)}) -> f32 [B, out_channels, H, W].
//   x is the noisy input as the objective feeds it (already scaled by c_in); t the schedule's model time
//   (any range: see nn::TimeEmbeddingConfig in dew/nn.hpp); label in [0, num_classes], where
//   num_classes is the learned null class for classifier-free guidance (a missing label = null).
// Body: patchify (p x p, as one matmul with the Conv2d(C, D, p, stride p) weight) + fixed 2-D sin-cos
//   positions -> c = TimeMLP(t) [+ LabelEmbedding(label)] -> depth x block -> final layer -> unpatchify:
//     (shift1, scale1, gate1, shift2, scale2, gate2) = Linear(D, 6D)(SiLU(c))          (zero-initialised)
//     x += gate1 * proj(Attention(LN(x) * (1 + scale1) + shift1))    (fused qkv, bidirectional)
//     x += gate2 * fc2(GELU_tanh(fc1(LN(x) * (1 + scale2) + shift2))) (hidden mlp_ratio * D)
//   final: (shift, scale) = Linear(D, 2D)(SiLU(c)); Linear(D, p*p*out)(LN(x) * (1 + scale) + shift),
//   both zero-initialised (the untrained model outputs exactly 0). LayerNorms: no affine, eps 1e-6.
// Parameter names follow facebookresearch/DiT: x_embedder.proj.{weight [D, C, p, p], bias},
//   t_embedder.mlp.{0,2}.{weight,bias}, y_embedder.embedding_table.weight [num_classes + 1, D],
//   blocks.{i}.attn.qkv.{weight [3D, D], bias}, blocks.{i}.attn.proj.*, blocks.{i}.mlp.fc1.*, .fc2.*,
//   blocks.{i}.adaLN_modulation.1.{weight [6D, D], bias}, final_layer.adaLN_modulation.1.*,
//   final_layer.linear.*. Init as DiT: xavier-uniform weights, zero biases, time MLP N(0, 0.02), label
//   table N(0, 0.02), adaLN and final layer zeros.
// Options ([model]): image_size (32; "H" or "H,W"), in_channels (3), out_channels (= in_channels),
//   num_classes (0 = unconditional), patch (4), dim (256), depth (6), heads (4), mlp_ratio (4), plus the
//   time-embedding keys of nn::TimeEmbeddingConfig. Built from the SDK blocks (dew/nn.hpp): nn::Attention
//   (fused layout), nn::MLP, nn::AdaLNModulation, nn::TimestepEmbedder, dew::modulated_layer_norm and
//   dew::gated_residual (x + gate * f in one kernel pass, its backward in one). With the
//   defaults and the DiT time embedding (time_max_freq = 1) this is exactly ../shared/peers/torch_dit_train.py's model
//   (same parameters).
// FLOPs per sample (forward): 2 * (N * per-token matmul weights + per-image matmul weights)
//   + 4 * N^2 * D per block (q.k and p.v), N = (H/p)(W/p) — the peer's convention.
// With [trainer] recompute = blocks each DiT block of a recorded forward goes through dew::recompute_block
// (dew/autograd.hpp): only its inputs (tokens, silu(c)) are kept, and it runs again in the backward.
#include <dew/autograd.hpp>
#include <dew/diffusion.hpp>
#include <dew/error.hpp>
#include <dew/model.hpp>
#include <dew/registry.hpp>
#include <mutex>

namespace {

using dew::Options;
using dew::Tensor;
using dew::nn::Init;
using dew::nn::Linear;
using dew::nn::ModuleDict;

struct DitConfig {
  int64_t height = 32, width = 32, in_channels = 3, out_channels = 3, num_classes = 0;
  int64_t patch = 4, dim = 256, depth = 6, heads = 4, hidden = 1024;
  double mlp_ratio = 4.0;
  dew::nn::TimeEmbeddingConfig time;
};

DitConfig read_config(const Options& o) {
  DitConfig c;
  const std::vector<int64_t> size = o.get_positive_ints("image_size", {32});
  DEW_USAGE_CHECK(size.size() == 1 || size.size() == 2, "option 'model.image_size' must be one size or 'height,width'");
  c.height = size[0];
  c.width = size.size() == 2 ? size[1] : size[0];
  c.in_channels = o.get_int("in_channels", 3);
  DEW_USAGE_CHECK(c.in_channels > 0, "option 'model.in_channels' must be positive, got ", c.in_channels);
  c.out_channels = o.get_int("out_channels", c.in_channels);
  DEW_USAGE_CHECK(c.out_channels > 0, "option 'model.out_channels' must be positive, got ", c.out_channels);
  c.num_classes = o.get_int("num_classes", 0);
  DEW_USAGE_CHECK(c.num_classes >= 0, "option 'model.num_classes' must be >= 0 (0 = unconditional), got ",
                  c.num_classes);
  c.patch = o.get_int("patch", 4);
  DEW_USAGE_CHECK(c.patch > 0, "option 'model.patch' must be positive, got ", c.patch);
  DEW_USAGE_CHECK(c.height % c.patch == 0 && c.width % c.patch == 0, "dit: image size ", c.height, "x", c.width,
                  " is not a multiple of model.patch = ", c.patch);
  c.dim = o.get_int("dim", 256);
  c.depth = o.get_int("depth", 6);
  c.heads = o.get_int("heads", 4);
  DEW_USAGE_CHECK(c.dim > 0 && c.depth > 0 && c.heads > 0,
                  "options 'model.dim', 'model.depth' and 'model.heads' "
                  "must be positive");
  DEW_USAGE_CHECK(c.dim % c.heads == 0, "dit: model.dim ", c.dim, " is not a multiple of model.heads ", c.heads);
  DEW_USAGE_CHECK(c.dim % 4 == 0, "dit: model.dim ", c.dim, " must be a multiple of 4 (2-D sin-cos positions)");
  c.mlp_ratio = o.get_double("mlp_ratio", 4.0);
  c.hidden = int64_t(double(c.dim) * c.mlp_ratio);
  DEW_USAGE_CHECK(c.hidden > 0, "option 'model.mlp_ratio' gives no hidden units: ", c.mlp_ratio);
  c.time = dew::nn::TimeEmbeddingConfig::from_options(o);
  return c;
}

// adaLN-Zero block from the SDK pieces: nn::AdaLNModulation (6 chunks), the fused modulated_layer_norm
// op, nn::Attention in the fused (timm) layout and nn::MLP; xavier-uniform weights, zero biases.
class DitBlock final : public dew::nn::Module {
 public:
  explicit DitBlock(const DitConfig& c) {
    dew::nn::AttentionConfig a;
    a.dim = c.dim;
    a.num_heads = c.heads;
    a.rotary_dim = -1;
    a.causal = false;
    a.bias = a.o_bias = true;
    a.layout = dew::nn::AttentionLayout::fused;
    a.init = {Init::XavierUniform(c.dim, 3 * c.dim), Init::Zeros(), Init::XavierUniform(c.dim, c.dim), Init::Zeros()};
    attn = register_module("attn", std::make_shared<dew::nn::Attention>(a));
    const Init xavier = Init::XavierUniform(c.dim, c.hidden);  // symmetric in the fans: fc1 and fc2
    mlp = register_module(
        "mlp", std::make_shared<dew::nn::MLP>(c.dim, c.hidden, c.dim, dew::Activation::gelu_tanh, true,
                                              dew::nn::ProjectionInit{xavier, Init::Zeros(), xavier, Init::Zeros()}));
    ada = register_module("adaLN_modulation", std::make_shared<dew::nn::AdaLNModulation>(c.dim, c.dim, 6));
  }

  // x [B, N, D]; sc = SiLU(c) [B, D].
  Tensor forward(const Tensor& x0, const Tensor& sc) const {
    const std::vector<Tensor> m = ada->forward_activated(sc);  // 6 x [B, D]
    Tensor h = dew::modulated_layer_norm(x0, m[0], m[1]);
    Tensor x = dew::gated_residual(x0, attn->forward(h, Tensor()), m[2]);  // x0 + gate1 * attn(...), one pass
    h = dew::modulated_layer_norm(x, m[3], m[4]);
    return dew::gated_residual(x, mlp->forward(h), m[5]);
  }

  std::shared_ptr<dew::nn::Attention> attn;
  std::shared_ptr<dew::nn::MLP> mlp;
  std::shared_ptr<dew::nn::AdaLNModulation> ada;
};

class Dit final : public dew::Model {
 public:
  explicit Dit(const Options& o) : c_(read_config(o)) {
    const int64_t d = c_.dim, p = c_.patch, cin = c_.in_channels;
    // The Conv2d(C, D, p, stride p) of the patch embedding (DiT's names and xavier init over the
    // flattened [D, C p p] kernel), applied as one matmul on the patchified input.
    auto xe = register_module("x_embedder", std::make_shared<ModuleDict>());
    patch_ = xe->add("proj", std::make_shared<dew::nn::Conv2d>(cin, d, p, p, 0, 1, true,
                                                               Init::XavierUniform(cin * p * p, d), Init::Zeros()));
    t_embedder_ = register_module("t_embedder", std::make_shared<dew::nn::TimestepEmbedder>(c_.time, d, d));
    if (c_.num_classes > 0) {
      auto ye = register_module("y_embedder", std::make_shared<ModuleDict>());
      y_table_ =
          ye->add("embedding_table", std::make_shared<dew::nn::Embedding>(c_.num_classes + 1, d, Init::Normal(0.02f)));
    }
    for (int64_t i = 0; i < c_.depth; ++i)
      blocks_.push_back(register_module("blocks." + std::to_string(i), std::make_shared<DitBlock>(c_)));
    auto fl = register_module("final_layer", std::make_shared<ModuleDict>());
    final_ada_ = fl->add("adaLN_modulation", std::make_shared<dew::nn::AdaLNModulation>(d, d, 2));
    final_ =
        fl->add("linear", std::make_shared<Linear>(d, p * p * c_.out_channels, true, Init::Zeros(), Init::Zeros()));
  }

  Tensor forward(const dew::Batch& in) override {
    auto it = in.find("x");
    DEW_CHECK(it != in.end(), "dit: forward needs an 'x' input (f32 [B, C, H, W])");
    const Tensor& x = it->second;
    DEW_CHECK(x.ndim() == 4 && x.shape()[1] == c_.in_channels, "dit: 'x' must be [B, ", c_.in_channels, ", H, W], got ",
              dew::shape_str(x.shape()));
    const int64_t b = x.shape()[0], hh = x.shape()[2], ww = x.shape()[3], p = c_.patch, d = c_.dim;
    DEW_CHECK(hh % p == 0 && ww % p == 0, "dit: image ", hh, "x", ww, " is not a multiple of the patch size ", p);
    auto ti = in.find("t");
    DEW_CHECK(ti != in.end(), "dit: forward needs a 't' input (f32 [B], the model time)");
    DEW_CHECK(ti->second.numel() == b, "dit: 't' has ", ti->second.numel(), " entries for a batch of ", b);
    const int64_t gh = hh / p, gw = ww / p, n = gh * gw, cin = c_.in_channels;

    // patchify: [B, C, gh, p, gw, p] -> [B, gh, gw, C, p, p] = [B, N, C p p] (the conv kernel's order)
    Tensor patches =
        dew::reshape(dew::permute(dew::reshape(x, {b, cin, gh, p, gw, p}), {0, 2, 4, 1, 3, 5}), {b, n, cin * p * p});
    Tensor h = dew::linear(patches, dew::reshape(patch_->weight, {d, cin * p * p}), patch_->bias);
    // The fixed table in h's dtype: under autocast the residual stream stays in the compute dtype (an f32
    // table would promote the sum, and with it every block, to f32; docs/precision.md).
    h = dew::add(h, dew::cast(positions(gh, gw, x), h.dtype()));

    Tensor c = t_embedder_->forward(dew::reshape(ti->second, {b}));
    const Tensor label = dew::diffusion::checked_label(in, b, c_.num_classes, "dit");
    if (y_table_) {
      Tensor l = label.defined() ? label : Tensor::full({b}, double(c_.num_classes), dew::DType::i32, x.backend_ptr());
      c = dew::add(c, y_table_->forward(l));
    }
    const Tensor sc = dew::silu(c);
    for (const auto& blk : blocks_) {  // each block may be recomputed in the backward ([trainer] recompute)
      const DitBlock* block = blk.get();
      h = dew::recompute_block([block](const std::vector<Tensor>& in) { return block->forward(in[0], in[1]); }, {h, sc},
                               blk->parameters());
    }

    const std::vector<Tensor> m = final_ada_->forward_activated(sc);
    h = dew::modulated_layer_norm(h, m[0], m[1]);
    h = final_->forward(h);  // [B, N, p p out]
    return dew::nn::unpatchify(h, c_.out_channels, p, gh, gw);
  }

  double flops_per_sample() const override {
    const double d = double(c_.dim), n = double((c_.height / c_.patch) * (c_.width / c_.patch));
    const double per_token = double(patch_->weight.numel() + final_->weight.numel()) +
                             double(c_.depth) * (4.0 * d * d + 2.0 * d * double(c_.hidden));
    const double per_image = double(t_embedder_->fc1->weight.numel() + t_embedder_->fc2->weight.numel() +
                                    final_ada_->linear->weight.numel()) +
                             double(c_.depth) * 6.0 * d * d;
    return 2.0 * (per_token * n + per_image) + double(c_.depth) * 4.0 * n * n * d;
  }

  std::map<std::string, std::string> describe() const override {
    auto r = c_.time.describe();
    r.insert({{"model_type", "dit"},
              {"image_size", c_.height == c_.width ? std::to_string(c_.height)
                                                   : std::to_string(c_.height) + "," + std::to_string(c_.width)},
              {"in_channels", std::to_string(c_.in_channels)},
              {"out_channels", std::to_string(c_.out_channels)},
              {"num_classes", std::to_string(c_.num_classes)},
              {"patch", std::to_string(c_.patch)},
              {"dim", std::to_string(c_.dim)},
              {"depth", std::to_string(c_.depth)},
              {"heads", std::to_string(c_.heads)},
              {"mlp_ratio", std::to_string(c_.mlp_ratio)},
              {"num_parameters", std::to_string(num_parameters())}});
    return r;
  }

 private:
  // Fixed 2-D sin-cos positions [N, D] for a gh x gw grid, made once per grid size and backend.
  Tensor positions(int64_t gh, int64_t gw, const Tensor& like) {
    std::lock_guard<std::mutex> lk(mu_);
    auto key = std::make_pair(gh, gw);
    auto it = pos_.find(key);
    if (it != pos_.end() && it->second.backend_ptr() == like.backend_ptr()) return it->second;
    Tensor pe = dew::nn::sincos_2d_positions(gh, gw, c_.dim, like.backend_ptr());
    pos_[key] = pe;
    return pe;
  }

  DitConfig c_;
  std::shared_ptr<dew::nn::Conv2d> patch_;
  std::shared_ptr<dew::nn::TimestepEmbedder> t_embedder_;
  std::shared_ptr<dew::nn::Embedding> y_table_;
  std::vector<std::shared_ptr<DitBlock>> blocks_;
  std::shared_ptr<dew::nn::AdaLNModulation> final_ada_;
  std::shared_ptr<Linear> final_;
  std::mutex mu_;
  std::map<std::pair<int64_t, int64_t>, Tensor> pos_;
};

}  // namespace

DEW_PLUGIN("dit", "0.1.0") {
  std::vector<dew::OptionSpec> opts = dew::diffusion::backbone_image_option_specs();
  opts.insert(opts.end(), {{"patch", "4", "patch side"},
                           {"dim", "256", "transformer width"},
                           {"depth", "6", "number of DiT blocks"},
                           {"heads", "4", "attention heads"},
                           {"mlp_ratio", "4", "MLP hidden width / dim"}});
  for (auto& s : dew::nn::TimeEmbeddingConfig::option_specs()) opts.push_back(s);
  registrar.add<dew::Model>({
      .name = "dit",
      .description = "Diffusion Transformer: patch embedding, 2-D sin-cos positions, adaLN-Zero blocks "
                     "conditioned on time and an optional class label",
      .factory = [](const dew::Options& o) { return std::make_shared<Dit>(o); },
      .options = std::move(opts),
  });
}
