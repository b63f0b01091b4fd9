// tests/models/backbone_cases.hpp — the tiny backbone fixtures: which models, which inputs, what is recorded.
//
// Shared by make_backbone_fixtures (which wrote tests/models/fixtures/*.h5 once, from the code before the
// backbones were rebuilt on the SDK blocks) and test_backbone_fixtures (which checks the code of today
// against them bit for bit). Everything runs on `ref` in f32, whose loop kernels give the same bits on
// every x86-64 machine.
//
// For each case, run_case() records (a dew checkpoint, dew/checkpoint.hpp, the real format):
//   params/<name>            the weights the outputs were computed with: N(0, 0.2) by Philox
//                            (seed 11, stream = hash of the name), so no zero-initialised layer hides
//                            part of the network;
//   state/ text init.<name>  FNV-1a 64 of the bytes of each parameter after initialize(kInitSeed)
//                            (the initial values), in named_parameters() order;
//   state/ input.<key>       the inputs fed (read back by the test, not regenerated);
//   state/ output*           outputs: the forward, and for the causal_transformer also the KV-cached
//                            decode and the slot-cache (continuous batching) decode of the same tokens
//                            and a training-mode (dropout) forward;
//   state/ text grad.<name>  FNV-1a 64 of the gradient of sum(output * R) (R fixed) for every parameter;
//   state/ values            num_parameters, flops_per_sample.
// Never regenerate the fixtures to make a test pass: they are the record of the behaviour before.
#pragma once
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/checkpoint.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/model.hpp"
#include "dew/ops.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"

namespace backbone_fixtures {

using dew::Tensor;
using Kv = std::map<std::string, std::string>;

constexpr uint64_t kInitSeed = 1234;

struct Case {
  std::string name;    // file stem: fixtures/<name>.h5
  std::string plugin;  // model name in the registry
  Kv options;
};

inline std::vector<Case> cases() {
  return {
      {"causal_llama",
       "causal_transformer",
       {{"vocab_size", "24"},
        {"dim", "16"},
        {"n_layers", "2"},
        {"n_heads", "4"},
        {"n_kv_heads", "2"},
        {"mlp_hidden", "24"},
        {"qk_norm", "true"},
        {"qkv_bias", "true"},
        {"o_bias", "true"},
        {"mlp_bias", "true"},
        {"sliding_window", "3"},
        {"layer_pattern", "local,global"},
        {"rope_theta", "500"},
        {"max_seq_len", "16"}}},
      {"causal_gemma",
       "causal_transformer",
       {{"vocab_size", "24"},
        {"dim", "16"},
        {"n_layers", "2"},
        {"n_heads", "2"},
        {"head_dim", "8"},
        {"mlp", "gelu"},
        {"mlp_hidden", "32"},
        {"norm_offset", "1"},
        {"norm_eps", "1e-6"},
        {"partial_rotary", "0.5"},
        {"attn_softcap", "20"},
        {"final_softcap", "15"},
        {"tie_embeddings", "false"},
        {"embed_scale", "true"},
        {"dropout", "0.1"},
        {"max_seq_len", "16"}}},
      {"causal_geglu_norope",
       "causal_transformer",
       {{"vocab_size", "24"},
        {"dim", "16"},
        {"n_layers", "1"},
        {"n_heads", "2"},
        {"mlp", "geglu"},
        {"mlp_hidden", "16"},
        {"partial_rotary", "0"},
        {"max_seq_len", "16"}}},
      {"vit_encoder",
       "vit_encoder",
       {{"image_size", "8"},
        {"in_channels", "2"},
        {"patch", "2"},
        {"dim", "16"},
        {"depth", "2"},
        {"heads", "2"},
        {"mlp_ratio", "2"}}},
      {"jepa_predictor",
       "jepa_predictor",
       {{"embed_dim", "16"}, {"grid", "4"}, {"dim", "8"}, {"depth", "2"}, {"heads", "2"}, {"mlp_ratio", "2"}}},
      {"dit",
       "dit",
       {{"image_size", "8"},
        {"in_channels", "2"},
        {"out_channels", "4"},
        {"num_classes", "3"},
        {"patch", "2"},
        {"dim", "16"},
        {"depth", "2"},
        {"heads", "2"},
        {"mlp_ratio", "2"},
        {"time_freq_dim", "16"}}},
      {"dit_fourier",
       "dit",
       {{"image_size", "4"},
        {"in_channels", "1"},
        {"patch", "2"},
        {"dim", "8"},
        {"depth", "1"},
        {"heads", "2"},
        {"time_embedding", "fourier"},
        {"time_freq_dim", "8"}}},
      {"unet",
       "unet",
       {{"image_size", "8"},
        {"in_channels", "2"},
        {"num_classes", "2"},
        {"channels", "4,8"},
        {"res_blocks", "1"},
        {"attention_levels", "1"},
        {"groups", "2"},
        {"heads", "2"},
        {"time_embedding", "fourier"},
        {"time_freq_dim", "8"}}},
  };
}

inline void load_plugins() {
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "ref"))
    reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "causal_transformer", "vit", "dit", "unet"});
}

inline const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    load_plugins();
    return dew::create_backend("ref");
  }();
  dew::set_default_backend(be);
  return be;
}

inline std::shared_ptr<dew::Model> make_model(const Case& c) {
  ref();
  dew::Options o(c.options, "model");
  auto m = dew::Registry::global().create<dew::Model>(c.plugin, o);
  o.check_all_used();
  m->initialize(kInitSeed);
  return m;
}

inline std::string fnv1a_hex(const Tensor& t) {
  std::vector<unsigned char> bytes(t.nbytes());
  t.copy_to_host(bytes.data());
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char b : bytes) h = (h ^ b) * 0x100000001b3ull;
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

inline Tensor normal(const dew::Shape& s, float std, uint64_t stream) {
  return Tensor::normal(s, 0.0f, std, 11, stream, ref());
}
inline Tensor ints(const dew::Shape& s, int32_t bound, uint64_t stream) {  // uniform in [0, bound)
  const std::vector<float> u = Tensor::uniform(s, 0.0f, float(bound), 11, stream, ref()).to_floats();
  std::vector<int32_t> v;
  for (float x : u) v.push_back(std::min(int32_t(x), bound - 1));
  return Tensor::from_ints(v, s, ref());
}

// The inputs of a case (written into the fixture; the test reads them back from it).
inline dew::NamedTensors make_inputs(const Case& c) {
  if (c.plugin == "causal_transformer") return {{"tokens", ints({2, 7}, 24, 1)}};
  if (c.plugin == "vit_encoder")
    return {{"image", normal({2, 2, 8, 8}, 1.0f, 2)},
            {"token_idx", Tensor::from_ints({3, 0, 15, 7, 9, 1, 2, 14, 4, 6}, {2, 5}, ref())}};
  if (c.plugin == "jepa_predictor")
    return {{"context", normal({2, 5, 16}, 1.0f, 3)},
            {"context_idx", Tensor::from_ints({0, 5, 10, 15, 3, 1, 2, 8, 9, 11}, {2, 5}, ref())},
            {"target_idx", Tensor::from_ints({1, 2, 4, 6, 7, 8, 0, 3, 4, 12, 13, 14}, {2, 2, 3}, ref())}};
  // dit, unet: x, t (table-schedule model times), label with the null class included
  const int64_t cin = c.options.count("in_channels") ? std::stoll(c.options.at("in_channels")) : 3;
  const int64_t hw = std::stoll(c.options.at("image_size"));
  dew::NamedTensors in{{"x", normal({3, cin, hw, hw}, 1.0f, 4)},
                       {"t", Tensor::from_vector({3.0f, 517.25f, 999.0f}, {3}, ref())}};
  if (c.options.count("num_classes")) {
    const int32_t n = int32_t(std::stoi(c.options.at("num_classes")));
    in.push_back({"label", Tensor::from_ints({0, n, n - 1}, {3}, ref())});
  }
  return in;
}

// Sets every parameter to N(0, 0.2) with stream = hash of its name (any backend gives the same values).
inline void randomize(dew::Model& m) {
  dew::NoGradGuard ng;
  for (auto& [name, p] : m.named_parameters()) p.copy_(normal(p.shape(), 0.2f, dew::philox::stream_of(name.c_str())));
}

// Columns [t0, t1) of rows [r0, r1) of i32 tokens [B, T].
inline Tensor token_block(const Tensor& tokens, int64_t r0, int64_t r1, int64_t t0, int64_t t1) {
  const std::vector<int32_t> all = tokens.to_ints();
  const int64_t t = tokens.shape()[1];
  std::vector<int32_t> v;
  for (int64_t r = r0; r < r1; ++r) v.insert(v.end(), all.begin() + r * t + t0, all.begin() + r * t + t1);
  return Tensor::from_ints(v, {r1 - r0, t1 - t0}, tokens.backend_ptr());
}
inline Tensor slice_tokens(const Tensor& tokens, int64_t row, int64_t t0, int64_t t1) {
  return token_block(tokens, row, row + 1, t0, t1);
}

// The outputs of a model with its weights in place, fed `inputs`: output tensors by name, and the
// parameter gradients of sum(output * R) for the first output ("output").
struct Results {
  dew::NamedTensors outputs, grads;
  double num_parameters = 0, flops = 0;
};

inline Results run_model(const Case& c, dew::Model& m, const dew::NamedTensors& inputs) {
  Results r;
  dew::Batch batch;
  for (auto& [k, v] : inputs) batch[k] = v;
  m.zero_grad();
  if (c.plugin == "causal_transformer") {
    // A training-mode forward: with dropout > 0 the masks are keyed by (seed 77, step 5). (The fixtures
    // were written when the key travelled as the inputs "dropout_seed" and "dropout_step"; the same key
    // now goes through Model::set_random_key and gives the same masks.)
    m.set_random_key({77, 5});
    m.set_training(true);
    const Tensor y = m.forward(batch);
    r.outputs.push_back({"output", y});
    const Tensor rr = normal(y.shape(), 1.0f, 9);
    dew::sum(dew::mul(y, rr)).backward();

    dew::NoGradGuard ng;
    m.set_training(false);
    r.outputs.push_back({"output.eval", m.forward(batch)});
    auto* dec = dynamic_cast<dew::CausalDecoder*>(&m);
    DEW_CHECK(dec != nullptr, "causal_transformer is a CausalDecoder");
    const Tensor& tok = batch.at("tokens");
    const int64_t b = tok.shape()[0], t = tok.shape()[1];
    // KV cache: a prefill of 4 tokens, then one token at a time.
    auto cache = dec->make_cache(b, t + 1);
    std::vector<Tensor> steps{dec->forward_cached(token_block(tok, 0, b, 0, 4), *cache)};
    for (int64_t i = 4; i < t; ++i) steps.push_back(dec->forward_cached(token_block(tok, 0, b, i, i + 1), *cache));
    r.outputs.push_back({"output.cached", dew::concat(steps, 1)});
    // Slot cache: row 0 in slot 2 (prefill 3), row 1 in slot 0 (prefill 5), then batched single steps
    // over both (each row at its own position) and a last step of row 0 alone.
    auto slots = dec->make_slot_cache(3, t + 1);
    std::vector<Tensor> outs;
    outs.push_back(dec->forward_slots(slice_tokens(tok, 0, 0, 3), {2}, *slots));
    outs.push_back(dec->forward_slots(slice_tokens(tok, 1, 0, 5), {0}, *slots));
    for (int64_t i = 0; i < 2; ++i) {
      const Tensor two = dew::concat({slice_tokens(tok, 0, 3 + i, 4 + i), slice_tokens(tok, 1, 5 + i, 6 + i)}, 0);
      outs.push_back(dew::reshape(dec->forward_slots(two, {2, 0}, *slots), {1, 2, -1}));
    }
    outs.push_back(dec->forward_slots(slice_tokens(tok, 0, 5, 6), {2}, *slots));
    std::vector<Tensor> flat;
    for (const Tensor& o : outs) flat.push_back(dew::reshape(o, {-1}));
    r.outputs.push_back({"output.slots", dew::concat(flat, 0)});
    m.set_training(true);
  } else {
    m.set_training(true);
    const Tensor y = m.forward(batch);
    r.outputs.push_back({"output", y});
    const Tensor rr = normal(y.shape(), 1.0f, 9);
    dew::sum(dew::mul(y, rr)).backward();
  }
  for (auto& [name, p] : m.named_parameters())
    r.grads.push_back({"grad." + name, p.grad().defined() ? p.grad() : Tensor::zeros(p.shape(), p.dtype(), ref())});
  r.num_parameters = double(m.num_parameters());
  r.flops = m.flops_per_sample();
  return r;
}

}  // namespace backbone_fixtures
