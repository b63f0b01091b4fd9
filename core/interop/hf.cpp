// core/interop/hf.cpp — Hugging Face import/export of whole models and weight loading by name
// (dew/interop.hpp; the format and the family tables: docs/interop.md).
// Invariants: the core names no model family; converters come from the registry (kind "hf_converter").
// Weights move by name (dew's names are the Hugging Face ones). An import writes config.ini, then the
// checkpoint (atomically, last): a run directory with a checkpoint is always complete.
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "dew/autograd.hpp"
#include "dew/chat_template.hpp"
#include "dew/checkpoint.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/interop.hpp"
#include "dew/lora.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/safetensors.hpp"
#include "dew/tokenizer.hpp"
#include "dew/train.hpp"

namespace dew {

namespace fs = std::filesystem;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  DEW_USAGE_CHECK(f.good(), "cannot read '", p.string(), "'");
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

void write_text_atomic(const fs::path& p, const std::string& text) {
  const fs::path tmp = p.string() + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << text;
    f.flush();
    DEW_CHECK(f.good(), "cannot write '", tmp.string(), "'");
  }
  fs::rename(tmp, p);
}

std::shared_ptr<HfConverter> converter_for_type(const std::string& model_type) {
  std::string known;
  for (const ErasedComponent* c : Registry::global().components(HfConverter::kind)) {
    auto conv = Registry::global().create<HfConverter>(c->name);
    for (const std::string& t : conv->model_types()) {
      if (t == model_type) return conv;
      known += (known.empty() ? "" : ", ") + t;
    }
  }
  DEW_USAGE_CHECK(false, "no loaded plugin imports Hugging Face model_type '", model_type,
                  "' (known: ", known.empty() ? "none: load the causal_transformer plugin" : known, ")");
  return nullptr;
}

std::shared_ptr<HfConverter> converter_for_plugin(const std::string& plugin) {
  for (const ErasedComponent* c : Registry::global().components(HfConverter::kind)) {
    auto conv = Registry::global().create<HfConverter>(c->name);
    if (conv->model_plugin() == plugin) return conv;
  }
  DEW_USAGE_CHECK(false, "export --format hf: no loaded plugin converts the model '", plugin,
                  "' to a Hugging Face config (the causal_transformer does)");
  return nullptr;
}

struct Built {
  BackendPtr backend;
  std::shared_ptr<Objective> objective;
  FineTuning fine_tuning;
};

// Creates the backend and the objective of `config` and builds it (no training data).
Built build(Config& config, const std::string& backend_override) {
  Built b;
  Options& rs = config.section("run");
  const std::string be = backend_override.empty() ? rs.get_string("backend", "cpu") : backend_override;
  b.backend = create_backend(be);
  set_default_backend(b.backend);
  Options& os = config.section("objective");
  const std::string objective = os.get_string("plugin", "");
  DEW_USAGE_CHECK(!objective.empty(), "missing [objective] plugin = ...");
  b.objective = Registry::global().create<Objective>(objective, os);
  ObjectiveContext ctx;
  ctx.config = &config;
  ctx.backend = b.backend;
  ctx.seed = uint64_t(rs.get_int("seed", 0));
  b.objective->build(ctx);
  b.fine_tuning = prepare_fine_tuning(config, *b.objective, ctx.seed);  // [lora] adapters: the checkpoint's names
  return b;
}

bool is_run_dir(const fs::path& p) {
  std::error_code ec;
  return fs::is_directory(p, ec) && fs::exists(p / "config.ini", ec) && fs::is_directory(p / "checkpoints", ec);
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string join_first(const std::vector<std::string>& v, size_t n = 8) {
  std::string out;
  for (size_t i = 0; i < v.size() && i < n; ++i) out += (i ? ", '" : "'") + v[i] + "'";
  if (v.size() > n) out += " and " + std::to_string(v.size() - n) + " more";
  return out;
}

}  // namespace

std::string load_weights(const std::string& path, const NamedTensors& targets,
                         const std::vector<std::string>& droppable) {
  DEW_CHECK(!targets.empty(), "load_weights: no target tensors");
  const BackendPtr backend = targets.front().second.backend_ptr();
  fs::path p(path);
  std::error_code ec;
  DEW_USAGE_CHECK(fs::exists(p, ec), "init weights: '", path, "' does not exist");
  std::map<std::string, Shape> target_shape;
  for (const auto& [n, t] : targets) target_shape[n] = t.shape();
  const std::set<std::string> drop(droppable.begin(), droppable.end());

  std::vector<std::string> source_names;
  std::function<Tensor(const std::string&, DType)> get;
  std::function<Shape(const std::string&)> shape_of;
  std::string what;
  std::shared_ptr<CheckpointData> ckpt;
  std::shared_ptr<SafetensorsCheckpoint> st;
  if (is_run_dir(p) || ends_with(path, ".h5")) {
    std::string file = path;
    if (is_run_dir(p)) {
      file = find_latest_checkpoint((p / "checkpoints").string());
      DEW_USAGE_CHECK(!file.empty(), "init weights: run directory '", path, "' has no checkpoint");
    }
    ckpt = std::make_shared<CheckpointData>(read_checkpoint(file, backend));
    what = "dew checkpoint " + file;
    for (const auto& [n, t] : ckpt->params) source_names.push_back(n);
    auto find = [ckpt](const std::string& n) -> const Tensor& {
      for (const auto& [k, t] : ckpt->params)
        if (k == n) return t;
      DEW_INTERNAL_ASSERT(false);
      return ckpt->params.front().second;
    };
    get = [find](const std::string& n, DType dt) {
      const Tensor& t = find(n);
      NoGradGuard ng;
      return t.dtype() == dt ? t : cast(t, dt);
    };
    shape_of = [find](const std::string& n) { return find(n).shape(); };
  } else {
    st = std::make_shared<SafetensorsCheckpoint>(path);
    what = "safetensors " + path;
    source_names = st->names();
    get = [st, backend](const std::string& n, DType dt) { return st->load(n, backend, dt); };
    shape_of = [st](const std::string& n) { return st->entry(n).shape; };
  }
  std::set<std::string> have(source_names.begin(), source_names.end());
  std::vector<std::string> missing, extra, shapes;
  for (const auto& [n, t] : targets) {
    if (!have.count(n))
      missing.push_back(n);
    else if (shape_of(n) != t.shape())
      shapes.push_back(n + " " + shape_str(shape_of(n)) + " (expected " + shape_str(t.shape()) + ")");
  }
  for (const auto& n : source_names)
    if (!target_shape.count(n) && !drop.count(n)) extra.push_back(n);
  std::string problems;
  if (!missing.empty()) problems += " missing: " + join_first(missing) + ";";
  if (!shapes.empty()) problems += " wrong shape: " + join_first(shapes) + ";";
  if (!extra.empty()) problems += " not parameters of this model: " + join_first(extra) + ";";
  DEW_USAGE_CHECK(problems.empty(), "cannot load ", what, " into the model:", problems);
  NamedTensors loaded;
  for (const auto& [n, t] : targets) loaded.emplace_back(n, get(n, t.dtype()));
  load_into(loaded, "weights", targets);
  return what;
}

// Keeps the model's chat template and special tokens (tokenizer_config.json, chat_template.jinja) in the
// run's tokenizer folder, where serving and chat data find them (dew/chat_template.hpp); a template dew's
// Jinja subset refuses is kept too, and the note says why it cannot be used.
std::string import_chat_config(const fs::path& hf, const fs::path& tdir) {
  std::error_code ec;
  bool any = false;
  for (const char* f : {"tokenizer_config.json", "chat_template.jinja"})
    if (fs::exists(hf / f, ec)) {
      fs::create_directories(tdir);
      fs::copy_file(hf / f, tdir / f, fs::copy_options::overwrite_existing);
      any = true;
    }
  if (!any) return "; no chat template (dew's default is used)";
  try {
    const ChatConfig c = chat_config_of_folder(tdir.string());
    ChatTemplate parsed(c.chat_template, c.template_origin);
    return "; chat template from " + c.template_origin;
  } catch (const Error& e) {
    return std::string("; the chat template is kept but dew cannot render it: ") + e.what();
  }
}

std::string import_hf(const std::string& hf_dir, const std::string& run_dir, const ImportOptions& options) {
  const fs::path hf(hf_dir), run(run_dir);
  std::error_code ec;
  DEW_USAGE_CHECK(fs::is_directory(hf, ec), "import: '", hf_dir, "' is not a folder");
  DEW_USAGE_CHECK(fs::exists(hf / "config.json", ec), "import: '", hf_dir, "' has no config.json");
  DEW_USAGE_CHECK(find_latest_checkpoint((run / "checkpoints").string()).empty(), "import: run directory '", run_dir,
                  "' already holds checkpoints; choose another --run-dir");
  const std::string text = read_text(hf / "config.json");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    DEW_USAGE_CHECK(false, (hf / "config.json").string(), " is not valid JSON: ", e.what());
  }
  DEW_USAGE_CHECK(j.is_object() && j.contains("model_type") && j["model_type"].is_string(),
                  (hf / "config.json").string(), " has no \"model_type\"");
  const std::string model_type = j["model_type"].get<std::string>();
  auto conv = converter_for_type(model_type);
  HfImport plan;
  try {
    plan = conv->import_config(text);
  } catch (const Error& e) {
    DEW_USAGE_CHECK(false, (hf / "config.json").string(), ": ", e.what());
  }
  // No eos in config.json: generation_config.json's (an integer, or the first of a list), as dew's own export of a
  // byte-token run writes it.
  if (plan.eos_id < 0 && fs::exists(hf / "generation_config.json", ec)) {
    try {
      const auto g = nlohmann::json::parse(read_text(hf / "generation_config.json"));
      const auto eos = g.is_object() && g.contains("eos_token_id") ? g["eos_token_id"] : nlohmann::json();
      if (eos.is_number_integer())
        plan.eos_id = eos.get<int64_t>();
      else if (eos.is_array() && !eos.empty() && eos[0].is_number_integer())
        plan.eos_id = eos[0].get<int64_t>();
    } catch (const nlohmann::json::exception& e) {
      DEW_USAGE_CHECK(false, (hf / "generation_config.json").string(), " is not valid JSON: ", e.what());
    }
  }

  Config config;
  config.set("run.name", fs::absolute(run).filename().string());
  config.set("run.seed", "0");
  config.set("run.backend", options.backend.empty() ? "cpu" : options.backend);
  for (const auto& [k, v] : plan.model) config.set("model." + k, v);
  config.set("objective.plugin", "lm");
  config.set("objective.sample_tokens", "0");
  config.set("data.source", "none");
  // Fine-tuning defaults (dew-run train --config RUN/config.ini --trainer.init_from RUN --data.* ...).
  config.set("optim.name", "adamw");
  config.set("optim.lr", "1e-5");
  config.set("optim.weight_decay", "0");
  config.set("schedule.name", "constant");
  config.set("trainer.steps", "100");
  config.set("trainer.log_every", "10");

  // The tokenizer, when dew reads it (load_hf_tokenizer_json), as a token folder's meta.json.
  std::string tokenizer_note;
  // A failed import removes the folder it made, so nothing half-imported is left to look like a run.
  struct RemoveUnlessDone {
    fs::path dir;
    bool done = false;
    ~RemoveUnlessDone() {
      std::error_code e;
      if (!done && !dir.empty()) fs::remove_all(dir, e);
    }
  } cleanup{fs::exists(run, ec) ? fs::path() : run};
  fs::create_directories(run, ec);
  if (fs::exists(hf / "tokenizer.json", ec)) {
    try {
      auto tok = load_hf_tokenizer_json((hf / "tokenizer.json").string());
      const fs::path tdir = run / "tokenizer";
      fs::create_directories(tdir);
      fs::copy_file(hf / "tokenizer.json", tdir / "tokenizer.json", fs::copy_options::overwrite_existing);
      TokenMeta meta;
      meta.tokenizer = "bpe";
      meta.vocab_size = tok->vocab_size();
      meta.dtype = token_dtype_for(meta.vocab_size);
      meta.eos_id = plan.eos_id >= 0 ? int32_t(plan.eos_id) : tok->eos_id();
      write_token_meta(meta, tdir.string());
      config.set("data.path", fs::absolute(tdir).lexically_normal().string());
      tokenizer_note = "tokenizer.json (" + std::to_string(meta.vocab_size) + " tokens)";

    } catch (const Error& e) {
      tokenizer_note = std::string("tokenizer.json not imported (") + e.what() +
                       "): sample with --prompt_ids, evaluate with token-id requests";
    }
  } else {
    tokenizer_note = "no tokenizer.json: sample with --prompt_ids, evaluate with token-id requests";
  }
  tokenizer_note += import_chat_config(hf, run / "tokenizer");
  if (fs::exists(hf / "generation_config.json", ec))
    fs::copy_file(hf / "generation_config.json", run / "generation_config.json", fs::copy_options::overwrite_existing);
  for (const auto& [k, v] : options.overrides) config.set(k, v);

  Built b = build(config, "");
  const NamedTensors params = b.objective->parameters();
  const std::string source = load_weights(hf_dir, params, plan.droppable);
  int64_t count = 0;
  for (const auto& [n, t] : params) count += t.numel();

  {
    std::ofstream cfg(run / "config.ini.tmp", std::ios::trunc);
    cfg << "# imported from " << fs::absolute(hf).lexically_normal().string() << " (Hugging Face " << model_type
        << ") by dew " << DEW_SDK_VERSION << "\n"
        << config.to_ini();
    cfg.flush();
    DEW_CHECK(cfg.good(), "cannot write ", (run / "config.ini.tmp").string());
  }
  fs::rename(run / "config.ini.tmp", run / "config.ini");
  CheckpointData c;
  c.attributes["dew.config"] = config.to_ini();
  c.attributes["dew.imported_from"] = fs::absolute(hf).lexically_normal().string();
  c.params = params;
  c.counters = {{"updates", 0}, {"attempts", 0}, {"skipped", 0}, {"nonfinite_streak", 0}, {"data.next", 0}};
  c.state_text = {{"data.order", ""}, {"best_file", ""}};
  fs::create_directories(run / "checkpoints");
  write_checkpoint((run / "checkpoints" / checkpoint_name(0)).string(), c);
  cleanup.done = true;

  std::ostringstream s;
  s << "imported " << model_type << " (" << plan.model.at("n_layers") << " layers, " << params.size() << " tensors, "
    << count << " parameters) from " << source << " into " << run_dir << "; " << tokenizer_note;
  if (!plan.ignored.empty()) {
    s << "; ignored config fields:";
    for (const auto& f : plan.ignored) s << " " << f;
  }
  return s.str();
}

void export_hf(const std::string& run_dir, const std::string& step, bool use_ema, const std::string& backend_name,
               const std::string& out_dir, uint64_t max_shard_bytes, const std::string& dtype) {
  const fs::path run(run_dir), out(out_dir);
  std::error_code ec;
  DEW_USAGE_CHECK(fs::exists(run / "config.ini", ec), "'", run_dir, "' is not a run directory (no config.ini)");
  std::optional<DType> as;
  std::string torch_dtype = "float32";
  if (!dtype.empty()) {
    DEW_USAGE_CHECK(dtype == "f32" || dtype == "bf16" || dtype == "f16" || dtype == "float32" || dtype == "bfloat16" ||
                        dtype == "float16",
                    "--dtype must be f32, bf16 or f16, got '", dtype, "'");
    as = dtype == "bf16" || dtype == "bfloat16" ? DType::bf16
         : dtype == "f16" || dtype == "float16" ? DType::f16
                                                : DType::f32;
  }
  Config config = Config::load_ini((run / "config.ini").string());
  Built b = build(config, backend_name);
  const std::string file = resolve_checkpoint(run_dir, step, b.backend);
  CheckpointData c = read_checkpoint(file, b.backend);
  load_into(c.params, "params", b.objective->parameters());
  const bool ema = use_ema && !c.ema.empty();
  if (ema) load_into(c.ema, "ema", b.fine_tuning.trained_only(b.objective->ema_parameters()));
  if (!b.fine_tuning.lora_paths.empty()) {  // a plain model is exported
    b.objective->before_adapters_merged();
    merge_lora(*b.objective->main_model());
  }
  Model* model = b.objective->main_model();
  DEW_USAGE_CHECK(model != nullptr, "export --format hf: the objective has no main model");
  const std::string plugin = config.section("model").get_string("plugin", "");
  auto conv = converter_for_plugin(plugin);
  const NamedTensors params = model->named_parameters();
  const DType stored = as.value_or(params.front().second.dtype());
  torch_dtype = stored == DType::bf16 ? "bfloat16" : stored == DType::f16 ? "float16" : "float32";
  const std::string cfg = conv->export_config(*model, torch_dtype);
  fs::create_directories(out);
  std::map<std::string, std::string> meta{
      {"format", "pt"},
      {"dew.version", DEW_SDK_VERSION},
      {"dew.step", std::to_string(c.counters.count("updates") ? c.counters.at("updates") : 0)},
      {"dew.ema", ema ? "1" : "0"}};
  write_safetensors_sharded(out.string(), params, max_shard_bytes, meta, as);
  write_text_atomic(out / "config.json", cfg);
  // The tokenizer of the run ([data] path), and the generation config an import kept.
  const std::string data_path = config.section("data").get_string("path", "");
  if (!data_path.empty() && fs::exists(fs::path(data_path) / "tokenizer.json", ec)) {
    fs::copy_file(fs::path(data_path) / "tokenizer.json", out / "tokenizer.json", fs::copy_options::overwrite_existing);
  } else if (!data_path.empty() && fs::exists(fs::path(data_path) / "meta.json", ec)) {
    // Byte tokens (dew-tokenize --tokenizer byte): their tokenizer.json form (GPT-2's byte level without merges),
    // and their document token as the model's eos where the run has no generation config of its own.
    const TokenMeta meta = read_token_meta(data_path);
    if (meta.tokenizer == "byte") {
      save_tokenizer_json(*make_byte_tokenizer(), (out / "tokenizer.json").string());
      if (meta.eos_id >= 0 && !fs::exists(run / "generation_config.json", ec))
        write_text_atomic(out / "generation_config.json",
                          "{\n  \"eos_token_id\": " + std::to_string(meta.eos_id) + "\n}\n");
    }
  }
  for (const char* chat_file : {"tokenizer_config.json", "chat_template.jinja"})  // the chat template an import kept
    if (!data_path.empty() && fs::exists(fs::path(data_path) / chat_file, ec))
      fs::copy_file(fs::path(data_path) / chat_file, out / chat_file, fs::copy_options::overwrite_existing);
  if (fs::exists(run / "generation_config.json", ec))
    fs::copy_file(run / "generation_config.json", out / "generation_config.json", fs::copy_options::overwrite_existing);
}

}  // namespace dew
