// core/nn/lora.cpp — LoRA adapters attached to a model's Linear modules by path, merged back for
// inference, the thread's adapters-off switch (LoraAdaptersOff, dew/nn.hpp), and the split of a model's parameters
// into trained and frozen (dew/lora.hpp).
// Invariant: attach, train, merge leaves a plain model whose forward equals the adapted one (the
// adapter's product folded into W); nothing here depends on the backbone beyond nn::Linear.
#include "dew/lora.hpp"

#include <cmath>
#include <set>
#include <tuple>

#include "dew/error.hpp"
#include "dew/model.hpp"

namespace dew {

namespace {

thread_local bool g_adapters_enabled = true;  // LoraAdaptersOff

bool in_head(const std::string& path) { return path.find("head") != std::string::npos; }

std::string some(const std::vector<std::string>& names, size_t shown = 6) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < shown; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > shown) out += ", ... (" + std::to_string(names.size()) + " in all)";
  return out;
}

}  // namespace

bool nn::lora_adapters_enabled() { return g_adapters_enabled; }
nn::LoraAdaptersOff::LoraAdaptersOff() : previous_(g_adapters_enabled) { g_adapters_enabled = false; }
nn::LoraAdaptersOff::~LoraAdaptersOff() { g_adapters_enabled = previous_; }

float LoraOptions::scale() const { return float(rslora ? alpha / std::sqrt(double(rank)) : alpha / double(rank)); }

LoraOptions LoraOptions::read(Options& s) {
  LoraOptions o;
  o.rank = s.get_int("rank", 0);
  o.alpha = s.get_double("alpha", double(o.rank));
  o.rslora = s.get_bool("rslora", false);
  o.dropout = s.get_double("dropout", 0.0);
  o.targets = s.get_strings("targets", {});
  o.train = s.get_strings("train", {});
  DEW_USAGE_CHECK(o.rank >= 0, "option 'lora.rank' must be >= 0 (0: no adapters), got ", o.rank);
  DEW_USAGE_CHECK(std::isfinite(o.alpha) && o.alpha > 0 || o.rank == 0, "option 'lora.alpha' must be positive, got ",
                  o.alpha);
  DEW_USAGE_CHECK(o.dropout >= 0 && o.dropout < 1, "option 'lora.dropout' must be in [0, 1), got ", o.dropout);
  if (o.targets.size() == 1 && o.targets[0] == "all-linear") o.targets.clear();
  return o;
}

std::vector<std::string> attach_lora(nn::Module& model, const LoraOptions& o, uint64_t seed) {
  std::vector<std::pair<std::string, nn::Linear*>> linears;
  model.for_each_module([&](const std::string& path, nn::Module& m) {
    if (auto* l = dynamic_cast<nn::Linear*>(&m)) linears.emplace_back(path, l);
  });
  const auto* owner = dynamic_cast<const Model*>(&model);
  DEW_USAGE_CHECK(o.dropout == 0 || owner != nullptr, "option 'lora.dropout': the adapted module is not a model");
  std::vector<std::string> all, adapted;
  for (const auto& [path, l] : linears) all.push_back(path);
  for (const auto& [path, l] : linears) {
    const bool wanted = o.targets.empty() ? !in_head(path) : matches_any_glob(path, o.targets);
    if (!wanted) continue;
    DEW_USAGE_CHECK(!in_head(path), "option 'lora.targets': '", path,
                    "' is a head; LoRA adapts the layers inside the model (a fused loss head reads its weight "
                    "directly): train it whole with lora.train = ",
                    path, ".weight");
    l->add_lora(o.rank, o.scale(), seed, path);
    if (o.dropout > 0) l->set_lora_dropout(float(o.dropout), &owner->random_key(), path);
    adapted.push_back(path);
  }
  DEW_USAGE_CHECK(!adapted.empty(), "option 'lora.targets' = ",
                  some(o.targets.empty() ? std::vector<std::string>{"all-linear"} : o.targets),
                  " matches none of the model's linear layers: ", all.empty() ? std::string("it has none") : some(all));
  return adapted;
}

int merge_lora(nn::Module& model) {
  int merged = 0;
  model.for_each_module([&](const std::string&, nn::Module& m) {
    if (auto* l = dynamic_cast<nn::Linear*>(&m); l && l->has_lora()) {
      l->merge_lora();
      ++merged;
    }
  });
  return merged;
}

bool is_lora_parameter(const std::string& name) { return matches_any_glob(name, {"*lora_A.weight", "*lora_B.weight"}); }

std::pair<NamedTensors, NamedTensors> split_frozen(const NamedTensors& params, const LoraOptions& lora,
                                                   const std::vector<std::string>& freeze) {
  DEW_USAGE_CHECK(lora.rank == 0 || freeze.empty(),
                  "option 'optim.freeze' with [lora]: LoRA freezes every parameter but its adapters and lora.train");
  std::vector<std::string> names;
  for (const auto& [n, t] : params) names.push_back(n);
  const std::vector<std::string>& globs = lora.rank > 0 ? lora.train : freeze;
  for (const std::string& g : globs) {
    bool hit = false;
    for (const std::string& n : names) hit = hit || matches_any_glob(n, {g});
    DEW_USAGE_CHECK(hit, "option '", lora.rank > 0 ? "lora.train" : "optim.freeze", "': '", g,
                    "' matches no parameter: ", some(names));
  }
  NamedTensors trained, frozen;
  for (const auto& [n, t] : params) {
    const bool train =
        lora.rank > 0 ? is_lora_parameter(n) || matches_any_glob(n, lora.train) : !matches_any_glob(n, freeze);
    (train ? trained : frozen).emplace_back(n, t);
  }
  DEW_USAGE_CHECK(!trained.empty(), "option 'optim.freeze' freezes every parameter: nothing is left to train");
  for (auto& [n, t] : frozen) {
    Tensor p = t;
    p.set_requires_grad(false);
  }
  return {trained, frozen};
}

NamedTensors FineTuning::trained_only(const NamedTensors& ema_parameters) const {
  if (frozen.empty()) return ema_parameters;
  std::set<std::string> fixed;
  for (const auto& [n, t] : frozen) fixed.insert(n);
  NamedTensors out;
  for (const auto& [n, t] : ema_parameters)
    if (!fixed.count(n)) out.emplace_back(n, t);
  return out;
}

FineTuning prepare_fine_tuning(Config& config, Objective& objective, uint64_t seed) {
  FineTuning f;
  const LoraOptions lora = config.has_section("lora") ? LoraOptions::read(config.section("lora")) : LoraOptions{};
  f.lora = lora;
  if (lora.rank > 0) {
    const std::string why = objective.lora_unsupported_reason();
    DEW_USAGE_CHECK(why.empty(), "[lora]: ", why);
    Model* model = objective.main_model();
    DEW_USAGE_CHECK(model != nullptr, "[lora]: the objective has no main model to adapt");
    f.lora_paths = attach_lora(*model, lora, seed);
  }
  const std::vector<std::string> freeze =
      config.has_section("optim") ? config.section("optim").get_strings("freeze", {}) : std::vector<std::string>{};
  std::tie(f.trained, f.frozen) = split_frozen(objective.parameters(), lora, freeze);
  return f;
}

}  // namespace dew
