// dit.cpp — the `dit` backbone: a Diffusion Transformer (Peebles & Xie) with adaLN-Zero blocks.
//
// forward({"x": f32 [B, C, H, W], "t": f32 [B], "label": i32 [B] (optional)}) -> f32 [B, out_channels, H, W].
//   x is the noisy input as the objective feeds it (already scaled by c_in); t the schedule's model time
//   (any range: see plugins/models/common/diffusion_blocks.hpp); label in [0, num_classes], where
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
//   time-embedding keys of diffusion_blocks.hpp. With the defaults and the DiT time embedding
//   (time_max_freq = 1) this is exactly ../shared/peers/torch_dit_train.py's model (same parameters).
// FLOPs per sample (forward): 2 * (N * per-token matmul weights + per-image matmul weights)
//   + 4 * N^2 * D per block (q.k and p.v), N = (H/p)(W/p) — the peer's convention.
#include <dew/error.hpp>
#include <dew/model.hpp>
#include <dew/registry.hpp>
#include <mutex>

#include "../common/diffusion_blocks.hpp"

namespace {

using dew::Options;
using dew::Tensor;
using dew::nn::Init;
using dew::nn::Linear;
using dew_diffusion::Named;

Init xavier(int64_t fan_in, int64_t fan_out) { return Init::Uniform(std::sqrt(6.0f / float(fan_in + fan_out))); }

std::shared_ptr<Linear> xavier_linear(int64_t in, int64_t out) {
  return std::make_shared<Linear>(in, out, true, xavier(in, out), Init::Zeros());
}

struct DitConfig {
  int64_t height = 32, width = 32, in_channels = 3, out_channels = 3, num_classes = 0;
  int64_t patch = 4, dim = 256, depth = 6, heads = 4, hidden = 1024;
  double mlp_ratio = 4.0;
  dew_diffusion::TimeConfig time;
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
  c.time = dew_diffusion::read_time_config(o);
  return c;
}

// The Conv2d(C, D, p, stride p) parameters of the patch embedding, initialised as DiT does: xavier-uniform
// over the flattened [D, C p p] kernel, zero bias. Applied as a matmul on patchified input.
class PatchProj final : public dew::nn::Module {
 public:
  PatchProj(int64_t cin, int64_t d, int64_t p) {
    weight = register_parameter("weight", {d, cin, p, p}, xavier(cin * p * p, d));
    bias = register_parameter("bias", {d}, Init::Zeros());
  }
  Tensor weight, bias;
};

class DitBlock final : public dew::nn::Module {
 public:
  explicit DitBlock(const DitConfig& c) : c_(c) {
    auto attn = register_module("attn", std::make_shared<Named>());
    qkv = attn->add("qkv", xavier_linear(c.dim, 3 * c.dim));
    proj = attn->add("proj", xavier_linear(c.dim, c.dim));
    auto mlp = register_module("mlp", std::make_shared<Named>());
    fc1 = mlp->add("fc1", xavier_linear(c.dim, c.hidden));
    fc2 = mlp->add("fc2", xavier_linear(c.hidden, c.dim));
    auto ada = register_module("adaLN_modulation", std::make_shared<Named>());
    ada_lin = ada->add("1", std::make_shared<Linear>(c.dim, 6 * c.dim, true, Init::Zeros(), Init::Zeros()));
  }

  // x [B, N, D]; sc = SiLU(c) [B, D].
  Tensor forward(const Tensor& x0, const Tensor& sc) const {
    const int64_t d = c_.dim, b = x0.shape()[0];
    const Tensor m = ada_lin->forward(sc);  // [B, 6D]
    auto chunk = [&](int i) { return dew::slice(m, 1, i * d, (i + 1) * d); };
    auto gate = [&](const Tensor& g) { return dew::reshape(g, {b, 1, d}); };
    Tensor h = dew_diffusion::modulated_layer_norm(x0, chunk(0), chunk(1));
    h = proj->forward(dew_diffusion::qkv_attention(h, qkv->weight, qkv->bias, c_.heads));
    Tensor x = dew::add(x0, dew::mul(h, gate(chunk(2))));
    h = dew_diffusion::modulated_layer_norm(x, chunk(3), chunk(4));
    h = fc2->forward(fc1->forward(h, dew::Activation::gelu_tanh));
    return dew::add(x, dew::mul(h, gate(chunk(5))));
  }

  std::shared_ptr<Linear> qkv, proj, fc1, fc2, ada_lin;

 private:
  DitConfig c_;
};

class Dit final : public dew::Model {
 public:
  explicit Dit(const Options& o) : c_(read_config(o)) {
    const int64_t d = c_.dim, p = c_.patch, cin = c_.in_channels;
    auto xe = register_module("x_embedder", std::make_shared<Named>());
    patch_ = xe->add("proj", std::make_shared<PatchProj>(cin, d, p));
    t_embedder_ = register_module("t_embedder", std::make_shared<dew_diffusion::TimeEmbedder>(c_.time, d, d));
    if (c_.num_classes > 0) {
      auto ye = register_module("y_embedder", std::make_shared<Named>());
      y_table_ =
          ye->add("embedding_table", std::make_shared<dew::nn::Embedding>(c_.num_classes + 1, d, Init::Normal(0.02f)));
    }
    for (int64_t i = 0; i < c_.depth; ++i)
      blocks_.push_back(register_module("blocks." + std::to_string(i), std::make_shared<DitBlock>(c_)));
    auto fl = register_module("final_layer", std::make_shared<Named>());
    auto fada = fl->add("adaLN_modulation", std::make_shared<Named>());
    final_ada_ = fada->add("1", std::make_shared<Linear>(d, 2 * d, true, Init::Zeros(), Init::Zeros()));
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
    h = dew::add(h, positions(gh, gw, x));

    Tensor c = t_embedder_->forward(dew::reshape(ti->second, {b}));
    const Tensor label = dew_diffusion::checked_label(in, b, c_.num_classes, "dit");
    if (y_table_) {
      Tensor l = label.defined() ? label : Tensor::full({b}, double(c_.num_classes), dew::DType::i32, x.backend_ptr());
      c = dew::add(c, y_table_->forward(l));
    }
    const Tensor sc = dew::silu(c);
    for (const auto& blk : blocks_) h = blk->forward(h, sc);

    const Tensor m = final_ada_->forward(sc);
    h = dew_diffusion::modulated_layer_norm(h, dew::slice(m, 1, 0, d), dew::slice(m, 1, d, 2 * d));
    h = final_->forward(h);  // [B, N, p p out]
    return dew::nn::unpatchify(h, c_.out_channels, p, gh, gw);
  }

  double flops_per_sample() const override {
    const double d = double(c_.dim), n = double((c_.height / c_.patch) * (c_.width / c_.patch));
    const double per_token = double(patch_->weight.numel() + final_->weight.numel()) +
                             double(c_.depth) * (4.0 * d * d + 2.0 * d * double(c_.hidden));
    const double per_image =
        double(t_embedder_->fc1->weight.numel() + t_embedder_->fc2->weight.numel() + final_ada_->weight.numel()) +
        double(c_.depth) * 6.0 * d * d;
    return 2.0 * (per_token * n + per_image) + double(c_.depth) * 4.0 * n * n * d;
  }

  std::map<std::string, std::string> describe() const override {
    auto r = dew_diffusion::describe_time(c_.time);
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
  std::shared_ptr<PatchProj> patch_;
  std::shared_ptr<dew_diffusion::TimeEmbedder> t_embedder_;
  std::shared_ptr<dew::nn::Embedding> y_table_;
  std::vector<std::shared_ptr<DitBlock>> blocks_;
  std::shared_ptr<Linear> final_ada_, final_;
  std::mutex mu_;
  std::map<std::pair<int64_t, int64_t>, Tensor> pos_;
};

}  // namespace

DEW_PLUGIN("dit", "0.1.0") {
  std::vector<dew::OptionSpec> opts = dew_diffusion::image_option_specs();
  opts.insert(opts.end(), {{"patch", "4", "patch side"},
                           {"dim", "256", "transformer width"},
                           {"depth", "6", "number of DiT blocks"},
                           {"heads", "4", "attention heads"},
                           {"mlp_ratio", "4", "MLP hidden width / dim"}});
  for (auto& s : dew_diffusion::time_option_specs()) opts.push_back(s);
  registrar.add<dew::Model>({
      .name = "dit",
      .description = "Diffusion Transformer: patch embedding, 2-D sin-cos positions, adaLN-Zero blocks "
                     "conditioned on time and an optional class label",
      .factory = [](const dew::Options& o) { return std::make_shared<Dit>(o); },
      .options = std::move(opts),
  });
}
