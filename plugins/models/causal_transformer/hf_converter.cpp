// hf_converter.cpp — the causal_transformer's Hugging Face converter (dew/interop.hpp, kind
// "hf_converter", name "causal_transformer"): config.json of the Llama, Mistral, Qwen2, Qwen3, Gemma 2 and
// Gemma 3 (text: gemma3_text) families <-> the [model] section. Weights need no table: the parameter names are
// the Hugging Face ones.
//
// Import: every field of config.json is either mapped (table below), ignored as metadata or training-only
// (kIgnored, and fields whose value makes them inert, e.g. Qwen's sliding_window when use_sliding_window
// is false), or refused by name. Values dew cannot express are refused: rope_scaling other than null /
// default, linear, llama3 or yarn (import_rope_scaling), hidden_act other than silu / gelu_pytorch_tanh, a
// non-zero attention_dropout, quantization.
//   vocab_size -> vocab_size           hidden_size -> dim               num_hidden_layers -> n_layers
//   num_attention_heads -> n_heads     num_key_value_heads -> n_kv_heads head_dim -> head_dim
//   intermediate_size -> mlp_hidden    hidden_act silu -> mlp swiglu, gelu_pytorch_tanh -> geglu
//   rms_norm_eps -> norm_eps           rope_theta (or rope_parameters.rope_theta) -> rope_theta
//   rope_scaling / rope_parameters {rope_type linear | llama3 | yarn, factor, ...} -> rope_scaling, rope_factor, ...
//   max_position_embeddings -> max_seq_len                                tie_word_embeddings -> tie_embeddings
//   llama/qwen3 attention_bias -> qkv_bias + o_bias; qwen2 -> qkv_bias always; llama mlp_bias -> mlp_bias
//   qwen3 -> qk_norm;  mistral sliding_window W -> every layer local with window W;
//   qwen2/qwen3 use_sliding_window + max_window_layers (or layer_types) -> layer_pattern + sliding_window
//   qwen3_moe: qwen3's fields and its experts (import_moe) -> moe_experts, moe_top_k, moe_hidden, ...
//   gemma2/gemma3_text -> norm_offset 1, embed_scale, sandwich_norm, query_pre_attn_scalar, softcaps
//   (attn_logit_softcapping / final_logit_softcapping -> attn_softcap / final_softcap), layer kinds (gemma2:
//   even layers local; gemma3: all but every sliding_window_pattern-th; or layer_types); gemma3_text also
//   qk_norm and rope_local_base_freq -> rope_local_theta (its local layers' rotary base, unscaled)
// Export picks the family from the features: sandwich_norm -> gemma3_text with qk_norm, else gemma2; qk_norm
// -> qwen3; qkv_bias without o_bias -> qwen2; every layer local -> mistral; else llama. Options no family
// expresses (outside Gemma: softcaps, (1 + w) norms, embedding scale; anywhere: partial rotary, the plain gelu
// MLP, mixed local/global layers in llama) are refused by name.
#include <cmath>
#include <dew/error.hpp>
#include <dew/interop.hpp>
#include <dew/registry.hpp>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using nlohmann::json;

// Metadata and training-only fields every family may carry (PretrainedConfig and generation defaults).
const std::set<std::string> kIgnored = {"architectures",
                                        "model_type",
                                        "torch_dtype",
                                        "dtype",
                                        "transformers_version",
                                        "_name_or_path",
                                        "use_cache",
                                        "initializer_range",
                                        "bos_token_id",
                                        "eos_token_id",
                                        "pad_token_id",
                                        "return_dict",
                                        "output_hidden_states",
                                        "output_attentions",
                                        "torchscript",
                                        "use_return_dict",
                                        "tokenizer_class",
                                        "id2label",
                                        "label2id",
                                        "pretraining_tp",  // tensor-parallel slicing of the same math
                                        "is_decoder",
                                        "tie_encoder_decoder",
                                        "chunk_size_feed_forward",
                                        "problem_type",
                                        "prefix",
                                        "task_specific_params",
                                        "finetuning_task",
                                        "_attn_implementation",
                                        "_attn_implementation_autoset",
                                        "auto_map",
                                        "max_length",
                                        "min_length",
                                        "do_sample",
                                        "temperature",
                                        "top_p",
                                        "top_k",
                                        "num_beams",
                                        "repetition_penalty",
                                        "bad_words_ids",
                                        "decoder_start_token_id",
                                        "sep_token_id",
                                        "cross_attention_hidden_size",
                                        "add_cross_attention",
                                        "is_encoder_decoder",
                                        "pruned_heads",
                                        "tf_legacy_loss",
                                        "use_bfloat16",
                                        "output_scores",
                                        "return_dict_in_generate",
                                        "forced_bos_token_id",
                                        "forced_eos_token_id",
                                        "remove_invalid_values",
                                        "exponential_decay_length_penalty",
                                        "suppress_tokens",
                                        "begin_suppress_tokens",
                                        "num_return_sequences",
                                        "early_stopping",
                                        "length_penalty",
                                        "no_repeat_ngram_size",
                                        "diversity_penalty",
                                        "num_beam_groups",
                                        "typical_p",
                                        "encoder_no_repeat_ngram_size",
                                        "output_router_logits"};

std::string num(double v) {  // the shortest text that reads back as v
  std::ostringstream s;
  for (int digits = 6; digits <= 17; ++digits) {
    s.str("");
    s.precision(digits);
    s << v;
    if (std::stod(s.str()) == v) break;
  }
  return s.str();
}

class Reader {
 public:
  Reader(json j, std::string type) : j_(std::move(j)), type_(std::move(type)) {}
  bool has(const std::string& k) const { return j_.contains(k) && !j_[k].is_null(); }
  const json& at(const std::string& k) {
    used_.insert(k);
    return j_[k];
  }
  void ignore(const std::string& k) { used_.insert(k); }
  int64_t integer(const std::string& k) {
    const json& v = at(k);
    DEW_USAGE_CHECK(v.is_number_integer(), type_, " config.json: '", k, "' must be an integer, got ", v.dump());
    return v.get<int64_t>();
  }
  double number(const std::string& k) {
    const json& v = at(k);
    DEW_USAGE_CHECK(v.is_number(), type_, " config.json: '", k, "' must be a number, got ", v.dump());
    return v.get<double>();
  }
  bool boolean(const std::string& k, bool fallback) {
    if (!has(k)) {
      ignore(k);
      return fallback;
    }
    const json& v = at(k);
    DEW_USAGE_CHECK(v.is_boolean(), type_, " config.json: '", k, "' must be true or false, got ", v.dump());
    return v.get<bool>();
  }
  int64_t require_int(const std::string& k) {
    DEW_USAGE_CHECK(has(k), type_, " config.json: missing '", k, "'");
    return integer(k);
  }
  // Fields nobody read, after the import: refused unless metadata.
  std::vector<std::string> ignored_and_check() const {
    std::vector<std::string> ignored, unknown;
    for (const auto& [k, v] : j_.items()) {
      if (used_.count(k)) continue;
      if (kIgnored.count(k))
        ignored.push_back(k);
      else
        unknown.push_back(k);
    }
    std::string list;
    for (const auto& u : unknown) list += (list.empty() ? "'" : ", '") + u + "'";
    DEW_USAGE_CHECK(unknown.empty(), type_, " config.json: field", unknown.size() > 1 ? "s " : " ", list,
                    unknown.size() > 1 ? " are" : " is",
                    " not expressible in dew's causal_transformer (neither mapped nor known to be inert)");
    return ignored;
  }
  const std::string& type() const { return type_; }

 private:
  json j_;
  std::string type_;
  std::set<std::string> used_;
};

// rope_scaling / rope_parameters -> model.rope_scaling and its rope_* options. Hugging Face's fields per type
// (transformers' modeling_rope_utils): linear {factor}; llama3 {factor, low_freq_factor, high_freq_factor,
// original_max_position_embeddings}; yarn {factor, original_max_position_embeddings (default
// max_position_embeddings), beta_fast, beta_slow, truncate, attention_factor or mscale / mscale_all_dim}. YaRN's
// attention factor is resolved here as transformers resolves it; the config's factor is the factor (as vLLM reads
// it, and transformers since its issue #38224). dynamic, longrope and other types are refused, as is any field a
// type does not read.
void import_rope_scaling(const std::string& mt, const char* key, const json& rs, int64_t max_positions,
                         std::map<std::string, std::string>& m) {
  std::string type = "default";
  for (const char* k : {"rope_type", "type"})
    if (rs.contains(k) && rs[k].is_string()) type = rs[k].get<std::string>();
  DEW_USAGE_CHECK(type == "default" || type == "linear" || type == "llama3" || type == "yarn", mt,
                  " config.json: ", key, " ", rs.dump(),
                  " is not expressible (rope types default, linear, llama3 and yarn are; dynamic, longrope and "
                  "others are not implemented)");
  std::set<std::string> fields = {"rope_type", "type", "rope_theta"};
  if (type != "default") fields.insert("factor");
  if (type == "llama3") fields.insert({"low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
  if (type == "yarn")
    fields.insert({"original_max_position_embeddings", "beta_fast", "beta_slow", "truncate", "attention_factor",
                   "mscale", "mscale_all_dim"});
  auto number = [&](const char* k, double fallback) {
    if (!rs.contains(k) || rs[k].is_null()) return fallback;
    DEW_USAGE_CHECK(rs[k].is_number(), mt, " config.json: ", key, ".", k, " must be a number, got ", rs[k].dump());
    return rs[k].get<double>();
  };
  for (const auto& [k, v] : rs.items())
    DEW_USAGE_CHECK(fields.count(k), mt, " config.json: ", key, ".", k, " is not expressible (", type,
                    " rotary embeddings do not read it)");
  if (type == "default") return;
  DEW_USAGE_CHECK(rs.contains("factor"), mt, " config.json: ", key, " of type ", type, " has no factor");
  const double factor = number("factor", 1.0);
  DEW_USAGE_CHECK(std::isfinite(factor) && factor >= 1.0, mt, " config.json: ", key,
                  ".factor must be a number >= 1, got ", rs["factor"].dump());
  m["rope_scaling"] = type;
  m["rope_factor"] = num(factor);
  if (type == "llama3") {
    DEW_USAGE_CHECK(rs.contains("original_max_position_embeddings"), mt, " config.json: ", key,
                    " of type llama3 has no original_max_position_embeddings");
    m["rope_original_max_position"] = num(number("original_max_position_embeddings", 0));
    m["rope_low_freq_factor"] = num(number("low_freq_factor", 1.0));
    m["rope_high_freq_factor"] = num(number("high_freq_factor", 4.0));
  }
  if (type == "yarn") {
    m["rope_original_max_position"] = num(number("original_max_position_embeddings", double(max_positions)));
    m["rope_beta_fast"] = num(number("beta_fast", 32.0));
    m["rope_beta_slow"] = num(number("beta_slow", 1.0));
    if (rs.contains("truncate") && !rs["truncate"].is_null()) {
      DEW_USAGE_CHECK(rs["truncate"].is_boolean(), mt, " config.json: ", key, ".truncate must be true or false");
      m["rope_truncate"] = rs["truncate"].get<bool>() ? "true" : "false";
    }
    auto get_mscale = [](double scale, double mscale) {
      return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
    };
    const double mscale = number("mscale", 0.0), mscale_all_dim = number("mscale_all_dim", 0.0);
    const double attention_factor =
        number("attention_factor", mscale != 0 && mscale_all_dim != 0
                                       ? get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim)
                                       : get_mscale(factor, 1.0));
    m["rope_attention_factor"] = num(attention_factor);
  }
}

int64_t first_id(const json& v) {
  if (v.is_number_integer()) return v.get<int64_t>();
  if (v.is_array() && !v.empty() && v[0].is_number_integer()) return v[0].get<int64_t>();
  return -1;
}

// Gemma 2 / Gemma 3 (text): (1 + w) norms, embeddings times sqrt(hidden), sandwich norms, scores by
// query_pre_attn_scalar^-1/2 (default 256), the softcaps (null: none); Gemma 3 adds qk-norm and local layers on
// rope_local_base_freq (default 10000).
void import_gemma(const std::string& mt, Reader& r, std::map<std::string, std::string>& m) {
  m["norm_offset"] = "1";
  m["embed_scale"] = "true";
  m["sandwich_norm"] = "true";
  m["query_pre_attn_scalar"] = num(r.has("query_pre_attn_scalar") ? r.number("query_pre_attn_scalar") : 256.0);
  r.ignore("query_pre_attn_scalar");
  for (const auto& [hf, dew_key] : {std::pair<const char*, const char*>{"attn_logit_softcapping", "attn_softcap"},
                                    {"final_logit_softcapping", "final_softcap"}}) {
    if (r.has(hf)) m[dew_key] = num(r.number(hf));
    r.ignore(hf);
  }
  if (mt == "gemma3_text") {
    m["qk_norm"] = "true";
    if (!m.count("rope_local_theta"))
      m["rope_local_theta"] = num(r.has("rope_local_base_freq") ? r.number("rope_local_base_freq") : 10000.0);
    r.ignore("rope_local_base_freq");
  }
  DEW_USAGE_CHECK(!r.boolean("use_bidirectional_attention", false), mt,
                  " config.json: use_bidirectional_attention (an encoder, EmbeddingGemma) is not expressible in a "
                  "causal decoder");
  r.ignore("cache_implementation");  // the KV cache's kind in transformers, not the math
}

// Qwen3-MoE: every layer's MLP a mixture (decoder_sparse_step 1, no mlp_only_layers; others are refused).
//   num_experts -> moe_experts, num_experts_per_tok -> moe_top_k, moe_intermediate_size -> moe_hidden,
//   norm_topk_prob (default false) -> moe_norm_topk, router_aux_loss_coef (0.001) -> moe_aux_loss
void import_moe(const std::string& mt, Reader& r, int64_t layers, std::map<std::string, std::string>& m) {
  m["moe_experts"] = std::to_string(r.require_int("num_experts"));
  m["moe_top_k"] = std::to_string(r.require_int("num_experts_per_tok"));
  m["moe_hidden"] = std::to_string(r.require_int("moe_intermediate_size"));
  m["moe_norm_topk"] = r.boolean("norm_topk_prob", false) ? "true" : "false";
  m["moe_aux_loss"] = num(r.has("router_aux_loss_coef") ? r.number("router_aux_loss_coef") : 0.001);
  r.ignore("router_aux_loss_coef");
  const int64_t step = r.has("decoder_sparse_step") ? r.integer("decoder_sparse_step") : 1;
  r.ignore("decoder_sparse_step");
  DEW_USAGE_CHECK(step == 1 || step > layers, mt, " config.json: decoder_sparse_step ", step,
                  " is not expressible (dew's mixture runs on every layer: 1 is)");
  if (r.has("mlp_only_layers")) {
    const json& dense = r.at("mlp_only_layers");
    DEW_USAGE_CHECK(dense.is_array() && dense.empty(), mt, " config.json: mlp_only_layers ", dense.dump(),
                    " is not expressible (dew's mixture runs on every layer: [] is)");
  }
  r.ignore("mlp_only_layers");
  r.ignore("output_router_logits");  // whether transformers returns the router logits, not the math
}

// model.rope_scaling -> config.json's rope_scaling (null without scaling), the fields import_rope_scaling reads.
template <class Get>
json export_rope_scaling(const Get& get) {
  const std::string type = get("rope_type");
  auto number = [&](const char* k) { return std::stod(get(k)); };
  if (type == "none") return nullptr;
  json rs;
  rs["rope_type"] = type;
  rs["factor"] = number("rope_factor");
  if (type == "llama3") {
    rs["low_freq_factor"] = number("rope_low_freq_factor");
    rs["high_freq_factor"] = number("rope_high_freq_factor");
    rs["original_max_position_embeddings"] = int64_t(number("rope_original_max_position"));
  }
  if (type == "yarn") {
    rs["original_max_position_embeddings"] = int64_t(number("rope_original_max_position"));
    rs["beta_fast"] = number("rope_beta_fast");
    rs["beta_slow"] = number("rope_beta_slow");
    rs["attention_factor"] = number("rope_attention_factor");
    if (get("rope_truncate") == "false") rs["truncate"] = false;
  }
  return rs;
}

class DecoderConverter final : public dew::HfConverter {
 public:
  std::vector<std::string> model_types() const override {
    return {"llama", "mistral", "qwen2", "qwen3", "qwen3_moe", "gemma2", "gemma3_text"};
  }
  std::string model_plugin() const override { return "causal_transformer"; }

  dew::HfImport import_config(const std::string& text) const override {
    json j;
    try {
      j = json::parse(text);
    } catch (const json::exception& e) {
      DEW_USAGE_CHECK(false, "config.json is not valid JSON: ", e.what());
    }
    DEW_USAGE_CHECK(j.is_object() && j.contains("model_type") && j["model_type"].is_string(),
                    "config.json has no \"model_type\" string");
    const std::string mt = j["model_type"].get<std::string>();
    const std::vector<std::string> known = model_types();
    DEW_USAGE_CHECK(std::find(known.begin(), known.end(), mt) != known.end(), "config.json: model_type '", mt,
                    "' is not one the causal_transformer imports (llama, mistral, qwen2, qwen3, qwen3_moe, gemma2, "
                    "gemma3_text)");
    Reader r(j, mt);
    const bool gemma = mt == "gemma2" || mt == "gemma3_text";
    dew::HfImport out;
    auto& m = out.model;
    m["plugin"] = "causal_transformer";
    const int64_t layers = r.require_int("num_hidden_layers");
    // Checked here, not only by the model's options later: the per-layer lists below are sized by it.
    DEW_USAGE_CHECK(layers >= 1 && layers <= 100000, mt, " config.json: num_hidden_layers must be between 1 and ",
                    "100000, got ", layers);
    const int64_t heads = r.require_int("num_attention_heads");
    m["vocab_size"] = std::to_string(r.require_int("vocab_size"));
    m["dim"] = std::to_string(r.require_int("hidden_size"));
    m["n_layers"] = std::to_string(layers);
    m["n_heads"] = std::to_string(heads);
    m["n_kv_heads"] = std::to_string(r.has("num_key_value_heads") ? r.integer("num_key_value_heads") : heads);
    r.ignore("num_key_value_heads");
    if (r.has("head_dim")) m["head_dim"] = std::to_string(r.integer("head_dim"));
    r.ignore("head_dim");
    m["mlp_hidden"] = std::to_string(r.require_int("intermediate_size"));
    // Gemma reads hidden_activation (its configs may also carry a legacy hidden_act).
    const char* act_key = gemma && r.has("hidden_activation") ? "hidden_activation" : "hidden_act";
    const std::string act = r.has(act_key) && r.at(act_key).is_string() ? r.at(act_key).get<std::string>()
                            : gemma                                     ? std::string("gelu_pytorch_tanh")
                                                                        : std::string("silu");
    r.ignore("hidden_act");
    if (gemma) r.ignore("hidden_activation");
    DEW_USAGE_CHECK(act == "silu" || act == "swish" || act == "gelu_pytorch_tanh" || act == "gelu_new", mt,
                    " config.json: hidden_act '", act,
                    "' is not expressible (silu -> swiglu and gelu_pytorch_tanh -> geglu are)");
    m["mlp"] = act == "silu" || act == "swish" ? "swiglu" : "geglu";
    m["norm_eps"] = num(r.has("rms_norm_eps") ? r.number("rms_norm_eps") : 1e-6);
    r.ignore("rms_norm_eps");
    // Rotary: rope_theta, or transformers 5's rope_parameters {rope_type, rope_theta, ...}; rope_scaling (or
    // rope_parameters) of type default, linear, llama3 or yarn with their fields (import_rope_scaling).
    double theta = 10000.0;
    if (r.has("rope_theta")) theta = r.number("rope_theta");
    r.ignore("rope_theta");
    const int64_t max_positions = r.has("max_position_embeddings") ? r.integer("max_position_embeddings") : 2048;
    for (const char* key : {"rope_scaling", "rope_parameters"}) {
      if (!r.has(key)) {
        r.ignore(key);
        continue;
      }
      json rs = r.at(key);
      DEW_USAGE_CHECK(rs.is_object(), mt, " config.json: '", key, "' must be an object or null");
      if (gemma && (rs.contains("full_attention") || rs.contains("sliding_attention"))) {
        // transformers 5's per-layer-kind form: {full_attention: {...}, sliding_attention: {...}}.
        for (const auto& [kind, sub] : rs.items())
          DEW_USAGE_CHECK((kind == "full_attention" || kind == "sliding_attention") && sub.is_object(), mt,
                          " config.json: ", key, ".", kind,
                          " is not expressible (full_attention and "
                          "sliding_attention objects are)");
        if (rs.contains("sliding_attention")) {
          const json& local = rs["sliding_attention"];
          const std::string type = local.value("rope_type", local.value("type", std::string("default")));
          DEW_USAGE_CHECK(
              type == "default" && local.size() <= 2 && local.contains("rope_theta") && local["rope_theta"].is_number(),
              mt, " config.json: ", key, ".sliding_attention ", local.dump(),
              " is not expressible (a default rotary embedding with its rope_theta is)");
          m["rope_local_theta"] = num(local["rope_theta"].get<double>());
        }
        rs = rs.contains("full_attention") ? rs["full_attention"] : json::object();
      }
      if (rs.contains("rope_theta") && !rs["rope_theta"].is_null()) {
        DEW_USAGE_CHECK(rs["rope_theta"].is_number(), mt, " config.json: ", key, ".rope_theta must be a number");
        theta = rs["rope_theta"].get<double>();
      }
      import_rope_scaling(mt, key, rs, max_positions, m);
    }
    m["rope_theta"] = num(theta);
    m["max_seq_len"] = std::to_string(max_positions);
    r.ignore("max_position_embeddings");
    // The defaults: untied for LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config; tied for Gemma's.
    m["tie_embeddings"] = r.boolean("tie_word_embeddings", gemma) ? "true" : "false";
    if (r.has("attention_dropout")) {
      const double p = r.number("attention_dropout");
      DEW_USAGE_CHECK(p == 0.0, mt, " config.json: attention_dropout ", p,
                      " is not expressible (dew has no attention dropout; 0 is accepted)");
    }
    r.ignore("attention_dropout");
    const bool qwen3 = mt == "qwen3" || mt == "qwen3_moe";
    if (mt == "llama" || qwen3 || gemma) {
      const bool b = r.boolean("attention_bias", false);
      m["qkv_bias"] = m["o_bias"] = b ? "true" : "false";
    }
    if (mt == "llama") m["mlp_bias"] = r.boolean("mlp_bias", false) ? "true" : "false";
    if (mt == "qwen2") m["qkv_bias"] = "true";
    if (qwen3) m["qk_norm"] = "true";
    if (mt == "qwen3_moe") import_moe(mt, r, layers, m);
    if (gemma) import_gemma(mt, r, m);

    // Sliding windows.
    std::vector<bool> local(size_t(layers), false);
    int64_t window = 0;
    auto read_layer_types = [&](bool sliding_allowed) {  // an explicit layer_types list overrides the family's rule
      if (r.has("layer_types")) {
        const json& lt = r.at("layer_types");
        DEW_USAGE_CHECK(lt.is_array() && int64_t(lt.size()) == layers, mt, " config.json: layer_types must list ",
                        layers, " layer kinds");
        for (size_t i = 0; i < lt.size(); ++i) {
          const std::string k = lt[i].is_string() ? lt[i].get<std::string>() : lt[i].dump();
          DEW_USAGE_CHECK(k == "full_attention" || k == "sliding_attention", mt, " config.json: layer_types[", i,
                          "] = '", k, "' is not full_attention or sliding_attention");
          local[i] = k == "sliding_attention" && sliding_allowed;
        }
      }
      r.ignore("layer_types");
    };
    if (mt == "mistral") {
      if (r.has("sliding_window")) {
        window = r.integer("sliding_window");
        local.assign(size_t(layers), true);
      }
      r.ignore("sliding_window");
    } else if (gemma) {
      // Gemma 2: even layers slide; Gemma 3: all but every sliding_window_pattern-th; layer_types (newer) says it.
      window = r.has("sliding_window") ? r.integer("sliding_window") : 4096;
      r.ignore("sliding_window");
      const char* pattern_key = r.has("sliding_window_pattern") ? "sliding_window_pattern" : "_sliding_window_pattern";
      const int64_t every = mt == "gemma2" ? 2 : r.has(pattern_key) ? r.integer(pattern_key) : 6;
      r.ignore("sliding_window_pattern");
      r.ignore("_sliding_window_pattern");  // the name transformers >= 4.53 saves it under, beside layer_types
      DEW_USAGE_CHECK(every >= 1, mt, " config.json: sliding_window_pattern must be >= 1, got ", every);
      for (int64_t i = 0; i < layers; ++i) local[size_t(i)] = mt == "gemma2" ? i % 2 == 0 : (i + 1) % every != 0;
      read_layer_types(true);
    } else if (mt == "qwen2" || qwen3) {
      const bool use = r.boolean("use_sliding_window", false);
      if (use) {
        DEW_USAGE_CHECK(r.has("sliding_window"), mt,
                        " config.json: use_sliding_window is true but sliding_window is null");
        window = r.integer("sliding_window");
        const int64_t from = r.has("max_window_layers") ? r.integer("max_window_layers") : layers;
        for (int64_t i = 0; i < layers; ++i) local[size_t(i)] = i >= from;
      }
      r.ignore("sliding_window");  // inert without use_sliding_window
      r.ignore("max_window_layers");
      // Transformers builds layer_types from use_sliding_window when absent; an explicit list wins, but a
      // sliding layer needs a window.
      read_layer_types(use);
    }
    bool any_local = false;
    std::string pattern;
    for (bool l : local) {
      any_local = any_local || l;
      pattern += std::string(pattern.empty() ? "" : ",") + (l ? "local" : "global");
    }
    if (any_local) {
      DEW_USAGE_CHECK(window > 0, mt, " config.json: sliding_window must be positive, got ", window);
      m["sliding_window"] = std::to_string(window);
      m["layer_pattern"] = pattern;
    }
    if (r.has("bos_token_id")) out.bos_id = first_id(r.at("bos_token_id"));
    if (r.has("eos_token_id")) out.eos_id = first_id(r.at("eos_token_id"));
    DEW_USAGE_CHECK(!j.contains("quantization_config"), mt,
                    " config.json: quantized checkpoints (quantization_config) are not supported");
    out.ignored = r.ignored_and_check();
    if (m["tie_embeddings"] == "true") out.droppable.push_back("lm_head.weight");
    for (int64_t i = 0; i < layers; ++i)
      out.droppable.push_back("model.layers." + std::to_string(i) + ".self_attn.rotary_emb.inv_freq");
    return out;
  }

  std::string export_config(const dew::Model& model, const std::string& torch_dtype) const override {
    const std::map<std::string, std::string> d = model.describe();
    auto get = [&](const std::string& k) {
      auto it = d.find(k);
      DEW_CHECK(it != d.end(), "causal_transformer describe() has no '", k, "'");
      return it->second;
    };
    auto integer = [&](const std::string& k) { return std::stoll(get(k)); };
    auto number = [&](const std::string& k) { return std::stod(get(k)); };
    auto flag = [&](const std::string& k) { return d.count(k) && d.at(k) == "true"; };
    std::vector<std::string> refused;
    const bool qk = flag("qk_norm"), qkv = flag("qkv_bias"), ob = flag("o_bias"), mlpb = flag("mlp_bias");
    const bool gemma = flag("sandwich_norm");  // Gemma 2 (without qk-norm) or Gemma 3
    if (get("mlp") == "gelu") refused.push_back("model.mlp = gelu (no gate)");
    if (number("partial_rotary_factor") != 1.0) refused.push_back("model.partial_rotary != 1");
    if (gemma) {
      if (number("norm_offset") != 1.0) refused.push_back("model.sandwich_norm without norm_offset = 1");
      if (!flag("embed_scale")) refused.push_back("model.sandwich_norm without embed_scale");
      if (get("mlp") != "geglu") refused.push_back("model.sandwich_norm with mlp = " + get("mlp"));
      if (mlpb) refused.push_back("model.mlp_bias in the gemma family");
      if (qkv != ob) refused.push_back("model.qkv_bias != model.o_bias (Gemma's attention_bias sets both)");
      if (!qk && number("rope_local_theta") > 0) refused.push_back("model.rope_local_theta without qk_norm (Gemma 2)");
    } else {
      if (number("norm_offset") != 0.0) refused.push_back("model.norm_offset = 1");
      if (flag("embed_scale")) refused.push_back("model.embed_scale");
      if (d.count("attn_logit_softcapping")) refused.push_back("model.attn_softcap");
      if (d.count("final_logit_softcapping")) refused.push_back("model.final_softcap");
      if (number("query_pre_attn_scalar") > 0) refused.push_back("model.query_pre_attn_scalar");
      if (number("rope_local_theta") > 0) refused.push_back("model.rope_local_theta");
    }
    const int64_t layers = integer("num_hidden_layers");
    std::vector<std::string> kinds;
    if (d.count("layer_types")) {
      std::stringstream ss(get("layer_types"));
      for (std::string k; std::getline(ss, k, ',');) kinds.push_back(k);
    }
    size_t n_local = 0;
    for (const auto& k : kinds) n_local += k == "sliding_attention";
    const bool moe = integer("moe_experts") > 0;
    std::string mt;
    if (gemma) {
      mt = qk ? "gemma3_text" : "gemma2";
    } else if (qk) {
      mt = moe ? "qwen3_moe" : "qwen3";
      if (qkv != ob) refused.push_back("qk_norm with qkv_bias != o_bias (Qwen3's attention_bias sets both)");
    } else if (qkv && !ob) {
      mt = "qwen2";
    } else if (n_local > 0 && n_local == kinds.size() && !qkv && !ob) {
      mt = "mistral";
    } else {
      mt = "llama";
      if (qkv != ob) refused.push_back("model.o_bias without model.qkv_bias");
    }
    if (mlpb && mt != "llama") refused.push_back("model.mlp_bias in the " + mt + " family");
    if (moe && mt != "qwen3_moe") refused.push_back("model.moe_experts without qk_norm (only qwen3_moe has experts)");
    if (n_local > 0 && mt == "llama") refused.push_back("sliding-window layers in the llama family");
    std::string list;
    for (const auto& x : refused) list += (list.empty() ? "" : "; ") + x;
    DEW_USAGE_CHECK(refused.empty(),
                    "export --format hf: this causal_transformer uses options no Hugging Face family "
                    "dew exports (llama, mistral, qwen2, qwen3, gemma2, gemma3_text) expresses: ",
                    list);
    static const std::map<std::string, std::string> arch{
        {"llama", "LlamaForCausalLM"},       {"mistral", "MistralForCausalLM"},    {"qwen2", "Qwen2ForCausalLM"},
        {"qwen3", "Qwen3ForCausalLM"},       {"qwen3_moe", "Qwen3MoeForCausalLM"}, {"gemma2", "Gemma2ForCausalLM"},
        {"gemma3_text", "Gemma3ForCausalLM"}};
    json j;
    j["architectures"] = {arch.at(mt)};
    j["model_type"] = mt;
    j["vocab_size"] = integer("vocab_size");
    j["hidden_size"] = integer("hidden_size");
    j["intermediate_size"] = integer("intermediate_size");
    j["num_hidden_layers"] = layers;
    j["num_attention_heads"] = integer("num_attention_heads");
    j["num_key_value_heads"] = integer("num_key_value_heads");
    j["head_dim"] = integer("head_dim");
    j["hidden_act"] = get("mlp") == "swiglu" ? "silu" : "gelu_pytorch_tanh";
    j["max_position_embeddings"] = integer("max_position_embeddings");
    j["rms_norm_eps"] = number("rms_norm_eps");
    j["rope_theta"] = number("rope_theta");
    j["rope_scaling"] = export_rope_scaling(get);
    j["tie_word_embeddings"] = flag("tie_word_embeddings");
    j["attention_dropout"] = 0.0;
    j["initializer_range"] = 0.02;
    j["use_cache"] = true;
    j["torch_dtype"] = torch_dtype;
    if (mt == "llama") {
      j["attention_bias"] = qkv;
      j["mlp_bias"] = mlpb;
      j["pretraining_tp"] = 1;
    }
    if (mt == "qwen3" || mt == "qwen3_moe") j["attention_bias"] = qkv;
    if (mt == "qwen3_moe") {
      j["num_experts"] = integer("moe_experts");
      j["num_experts_per_tok"] = integer("moe_top_k");
      j["moe_intermediate_size"] = integer("moe_hidden");
      j["norm_topk_prob"] = flag("moe_norm_topk");
      j["router_aux_loss_coef"] = number("moe_aux_loss");
      j["decoder_sparse_step"] = 1;
      j["mlp_only_layers"] = json::array();
    }
    if (mt == "mistral") j["sliding_window"] = std::stoll(get("sliding_window"));
    if (gemma) {
      j.erase("hidden_act");
      j["hidden_activation"] = "gelu_pytorch_tanh";
      j["attention_bias"] = qkv;
      const double scalar = number("query_pre_attn_scalar");
      j["query_pre_attn_scalar"] = scalar > 0 ? scalar : double(integer("head_dim"));
      j["attn_logit_softcapping"] = d.count("attn_logit_softcapping") ? json(number("attn_logit_softcapping")) : json();
      j["final_logit_softcapping"] =
          d.count("final_logit_softcapping") ? json(number("final_logit_softcapping")) : json();
      j["sliding_window"] = n_local > 0 ? json(std::stoll(get("sliding_window"))) : json(nullptr);
      j["layer_types"] = kinds.empty() ? std::vector<std::string>(size_t(layers), "full_attention") : kinds;
      if (mt == "gemma3_text") {
        const double local = number("rope_local_theta");
        j["rope_local_base_freq"] = local > 0 ? local : number("rope_theta");
      }
    }
    if (mt == "qwen2" || mt == "qwen3" || mt == "qwen3_moe") {
      j["use_sliding_window"] = n_local > 0;
      j["sliding_window"] = n_local > 0 ? json(std::stoll(get("sliding_window"))) : json(nullptr);
      // Transformers derives the kinds from max_window_layers (layers i >= it slide); an explicit
      // layer_types list (transformers >= 4.53) says the same for any pattern.
      size_t first_local = kinds.size();
      for (size_t i = 0; i < kinds.size(); ++i)
        if (kinds[i] == "sliding_attention") {
          first_local = i;
          break;
        }
      j["max_window_layers"] = n_local > 0 ? int64_t(first_local) : layers;
      if (n_local > 0) j["layer_types"] = kinds;
    }
    return j.dump(2) + "\n";
  }
};

}  // namespace

void register_hf_converter(dew::Registrar& registrar) {
  registrar.add<dew::HfConverter>({
      .name = "causal_transformer",
      .description = "Hugging Face config.json <-> causal_transformer for llama, mistral, qwen2, qwen3",
      .factory = [](const dew::Options&) { return std::make_shared<DecoderConverter>(); },
  });
}
