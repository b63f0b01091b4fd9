// core/train/run.cpp — building a run from its config, its checkpoint, and the entry points that load
// a trained run: `dew-run eval`, `sample`, `serve` (load_inference_run), `export`, and load_objective.
//
// A loaded run is rebuilt from RUN_DIR/config.ini (the effective config the trainer wrote) and given a
// checkpoint's weights; eval/sample/serve/export never write into the run's checkpoints.
#include "train/run.hpp"

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/lora.hpp"
#include "dew/ops.hpp"
#include "dew/profile.hpp"
#include "dew/registry.hpp"
#include "dew/safetensors.hpp"

namespace dew::training {

namespace fs = std::filesystem;

namespace {
// The communicator of the training run in progress (an error on one rank ends the job).
std::shared_ptr<Communicator> g_active_comm;

// Prefix of the objective's state tensors (Objective::state()) in a checkpoint's state/ group.
const std::string kObjectiveState = "objective.";

std::string plugins_line() {
  std::string s;
  for (const auto& p : Registry::global().plugins()) s += (s.empty() ? "" : "; ") + p.name + " " + p.version;
  return s;
}

}  // namespace

void set_active_comm(std::shared_ptr<Communicator> comm) { g_active_comm = std::move(comm); }
std::shared_ptr<Communicator> active_comm() { return g_active_comm; }

// The read options of a run's checkpoints: non-finite weights only with DEW_ALLOW_NONFINITE_WEIGHTS=1.
CheckpointReadOptions run_read_options() {
  CheckpointReadOptions o;
  const char* env = std::getenv("DEW_ALLOW_NONFINITE_WEIGHTS");
  o.allow_nonfinite = env && std::string(env) == "1";
  return o;
}

// Reads one of a run's checkpoints; a damaged one is refused with, as the hint, the newest older
// checkpoint of the same folder that is intact (train --resume, eval, sample, serve and export all take
// --step N).
CheckpointData read_run_checkpoint(const std::string& file, const BackendPtr& backend) {
  const CheckpointReadOptions opt = run_read_options();
  try {
    return read_checkpoint(file, backend, opt);
  } catch (const Error& e) {
    const int64_t step = checkpoint_step(file);
    if (e.kind() != ErrorKind::runtime || step < 0) throw;
    const fs::path dir = fs::path(file).parent_path();
    const std::string intact = find_intact_checkpoint(dir.string(), step, opt);
    std::string hint = e.hint().empty() ? "" : e.hint() + "; ";
    hint += intact.empty() ? "no older checkpoint in " + dir.string() + " is intact"
                           : fs::path(intact).filename().string() + " is intact: pass --step " +
                                 std::to_string(checkpoint_step(intact)) + " to use it";
    throw Error(ErrorKind::runtime, e.what(), e.file(), e.line(), hint);
  }
}

Run build_run(Config& config, const std::string& backend_override, bool with_train_data, bool profile) {
  Run run;
  Options& rs = config.section("run");
  rs.get_string("name", "");
  rs.get_strings("plugins", {});  // read by the launcher before loading plugins
  // ---- dist: [run] dist = none | <communicator> (mpi), dist_timeout (s), bucket_mb, shard, shard_prefetch ----
  const std::string dist = rs.get_string("dist", "none");
  run.shard = rs.get_string("shard", "none");  // checked by dist::shard_mode_from_name in the trainer
  run.shard_prefetch = rs.get_bool("shard_prefetch", true);
  run.bucket_mb = rs.get_double("bucket_mb", 25.0);
  DEW_USAGE_CHECK(run.bucket_mb > 0, "option 'run.bucket_mb' must be positive, got ", run.bucket_mb);
  Options comm_options;
  if (rs.has("dist_timeout")) {
    const double timeout = rs.get_double("dist_timeout", 60.0);
    DEW_USAGE_CHECK(timeout >= 0, "option 'run.dist_timeout' must be >= 0 seconds (0 = no limit), got ", timeout);
    comm_options.set("timeout", rs.get_string("dist_timeout", ""));
  }
  if (dist != "none" && with_train_data) {  // eval, sample and export run in one process
    DEW_USAGE_CHECK(Registry::global().contains(Communicator::kind, dist), "run.dist = ", dist,
                    ": no communicator of that name is loaded (none, or mpi when dew was built with MPI)");
    run.comm = Registry::global().create<Communicator>(dist, comm_options);
    g_active_comm = run.comm;
    run.rank = run.comm->rank();
    run.world = run.comm->size();
    run.comm->barrier();  // every rank has read its config (--resume: RUN_DIR/config.ini) before rank 0 rewrites it
  }
  // ---- end dist ----
  run.seed = uint64_t(rs.get_int("seed", 0));
  const std::string backend_name = backend_override.empty() ? rs.get_string("backend", "cpu") : backend_override;
  if (!backend_override.empty()) rs.get_string("backend", "");
  const int64_t threads = rs.get_int("threads", 0);
  const int64_t max_threads = std::max<int64_t>(64, 8 * int64_t(std::thread::hardware_concurrency()));
  DEW_USAGE_CHECK(threads >= 0 && threads <= max_threads, "option 'run.threads' = ", threads,
                  " is out of range: 0 (all cores) up to ", max_threads, " (8 per core of this machine)");
  // [run] matmul_precision (PyTorch's float32 matmul precision): highest = f32, high = TF32, medium = bf16
  // inputs with f32 accumulation. A permission, not a demand: a backend without such a mode runs f32 (ref
  // always; cpu has no TF32, and bf16 only where the CPU's bf16 products out-run f32:
  // plugins/backends/cpu/bf16_dot.cpp).
  // [backend]: the chosen backend's own options, passed as written (`dew-run plugins` lists each backend's:
  // cpu's bf16_dot, isa, cache_mb, ...; cuda's device, attention, ...). A key the backend does not read stays
  // unread in the section, so the launcher refuses it as a misspelt option; threads and matmul_precision
  // have their [run] keys.
  Options& backend_section = config.section("backend");
  for (const char* key : {"threads", "matmul_precision"})
    DEW_USAGE_CHECK(!backend_section.has(key), "option 'backend.", key, "': set it as [run] ", key);
  Options backend_options(backend_section.values(), "[backend]");
  if (rs.has("matmul_precision")) {
    const std::string prec = rs.get_string("matmul_precision", "highest");
    DEW_USAGE_CHECK(prec == "highest" || prec == "high" || prec == "medium", "option 'run.matmul_precision' = '", prec,
                    "' is not one of highest, high, medium");
    backend_options.set("matmul_precision", prec);
    run.matmul_precision = prec;
  }
  // [run] precision: f32, or bf16/f16 activations and matmul operands around f32 master weights
  // (dew/autocast.hpp); f16-mixed scales the loss dynamically ([run] loss_scale_*, train/loss_scale.hpp).
  run.precision = precision_from_name(rs.get_string("precision", "f32"));
  run.loss_scale = LossScaleOptions::read(rs);
  run.backend = create_backend(backend_name, backend_options);
  for (const auto& [key, value] : backend_section.values())
    if (backend_options.was_read(key)) backend_section.get_string(key, value);  // taken by the backend
  if (threads > 0) run.backend->set_threads(int(threads));
  // [trainer] profile: every tensor of the run is allocated through the wrapper, so every kernel reaches it.
  if (profile) run.backend = std::make_shared<ProfilingBackend>(run.backend);
  set_default_backend(run.backend);

  Options& data = config.section("data");
  if (with_train_data) run.train_loader = make_loader(data, "train", run.seed, run.rank, run.world);  // dist: shard
  Options& os = config.section("objective");
  const std::string objective = os.get_string("plugin", "");
  DEW_USAGE_CHECK(!objective.empty(), "missing [objective] plugin = ... (e.g. classify, lm, diffusion, jepa)");
  run.objective = Registry::global().create<Objective>(objective, os);
  ObjectiveContext ctx;
  ctx.config = &config;
  ctx.backend = run.backend;
  ctx.seed = run.seed;
  ctx.train_source = run.train_loader ? &run.train_loader->source() : nullptr;
  run.objective->build(ctx);
  DEW_CHECK(!run.objective->parameters().empty(), "objective '", objective, "' has no parameters to train");
  run.fine_tuning = prepare_fine_tuning(config, *run.objective, run.seed);  // [lora] adapters, frozen parameters
  run.params = run.fine_tuning.trained;
  return run;
}

CheckpointData make_checkpoint(Config& config, const Run& run, const Optimizer* opt, const Ema* ema, const RunCounters& st,
                               const DataPosition& pos) {
  CheckpointData c;
  c.attributes["dew.config"] = config.to_ini();
  c.attributes["dew.plugins"] = plugins_line();
  c.params = run.all_params();
  if (ema) c.ema = ema->tensors();
  if (opt) c.optim = opt->state();
  c.counters = {{"updates", st.updates},
                {"attempts", st.attempts},
                {"skipped", st.skipped},
                {"nonfinite_streak", st.streak},
                {"data.next", pos.next}};
  if (run.precision == Precision::f16_mixed) {
    c.state_values["loss_scale"] = st.loss_scale.scale();
    c.counters["loss_scale.good_steps"] = st.loss_scale.good_steps();
    c.counters["loss_scale.overflows"] = st.loss_scale.overflows();
  }
  c.state_text = {{"data.order", pos.order}, {"best_file", st.best_file}};
  if (!std::isnan(st.best)) c.state_values["best_metric"] = st.best;
  for (auto& [name, t] : run.objective->state()) c.state_tensors.emplace_back(kObjectiveState + name, t);
  return c;
}

// Loads the objective's state tensors (Objective::state()) from a checkpoint's state/objective.* datasets.
void load_objective_state(const CheckpointData& c, const std::string& file, Objective& objective) {
  const NamedTensors targets = objective.state();
  if (targets.empty()) return;
  NamedTensors saved;
  for (const auto& [name, t] : c.state_tensors)
    if (name.rfind(kObjectiveState, 0) == 0) saved.emplace_back(name.substr(kObjectiveState.size()), t);
  DEW_CHECK(!saved.empty(), "checkpoint ", file, " holds no objective state (state/", kObjectiveState,
            "*) but the objective keeps ", targets.size(), " state tensors (e.g. ", targets.front().first, ")");
  load_into(saved, "state/" + kObjectiveState, targets);
}


}  // namespace dew::training

namespace dew {
using training::Run;
using training::build_run;
using training::load_objective_state;
namespace fs = std::filesystem;

namespace {

// A built run with a checkpoint's weights loaded (EMA weights when asked and present).
struct LoadedRun {
  Config config;
  Run run;
  int64_t updates = 0;
  bool ema = false;
};

int g_inference_threads = 0;  // set_inference_threads(): 0 = the run's stored [run] threads
DType g_inference_weights = DType::f32;  // set_inference_weights()
std::optional<DType> g_inference_kv_cache;  // set_inference_kv_cache(): none = as the weights

// The weights of an inference command (eval, sample, serve) in the storage --weights asked for, and the decoder's
// K/V cache alike (f32: packs q/k/v, gate/up only, the cache stays f32) or as --kv-cache asked. A model that decodes
// also gets the backend's decode panels (store_matmul_weights_in_panels) when `decoding` (sample, serve), and in eval
// when the weights are bf16 (every row then takes the weight-only product, whose panel kernel is the faster one at any
// row count); eval's f32 weights keep the rows the backend's large products (oneDNN on cpu) take.
void store_inference_weights(const LoadedRun& lr, bool decoding) {
  auto* decoder = dynamic_cast<CausalDecoder*>(lr.run.objective->main_model());
  const NamedTensors params = lr.run.objective->parameters();
  store_decode_weights_as(decoder, params, g_inference_weights);  // the cache follows the weights ...
  if (decoder && g_inference_kv_cache) decoder->set_cache_dtype(*g_inference_kv_cache);  // ... or as --kv-cache says
  if (decoder && (decoding || g_inference_weights == DType::bf16)) store_matmul_weights_in_panels(params);
}

LoadedRun load_run(const std::string& run_dir, const std::string& step, bool use_ema, const std::string& backend_name) {
  LoadedRun lr;
  const fs::path cfg_path = fs::path(run_dir) / "config.ini";
  DEW_USAGE_CHECK(fs::exists(cfg_path), "'", run_dir, "' is not a run directory (no config.ini)");
  lr.config = Config::load_ini(cfg_path.string());
  if (g_inference_threads > 0) lr.config.set("run.threads", std::to_string(g_inference_threads));
  lr.run = build_run(lr.config, backend_name, false);
  const std::string file = resolve_checkpoint(run_dir, step, lr.run.backend);
  CheckpointData c = training::read_run_checkpoint(file, lr.run.backend);
  load_into(c.params, "params", lr.run.all_params());
  lr.ema = use_ema && !c.ema.empty();
  if (lr.ema) load_into(c.ema, "ema", lr.run.ema_params());  // the EMA covers the trained ema_parameters()
  load_objective_state(c, file, *lr.run.objective);
  // Inference runs the plain model: LoRA adapters folded into their weights (after the EMA's were loaded).
  if (!lr.run.fine_tuning.lora_paths.empty()) {
    lr.run.objective->before_adapters_merged();
    merge_lora(*lr.run.objective->main_model());
  }
  lr.updates = c.counters.count("updates") ? c.counters.at("updates") : 0;
  DEW_CHECK(lr.updates >= 0, "checkpoint ", file, " has a negative update counter ", lr.updates);
  return lr;
}

}  // namespace

void set_inference_weights(DType dtype) {
  DEW_USAGE_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::i8, "--weights ", dtype_name(dtype),
                  ": decode weights are f32, bf16 or int8");
  g_inference_weights = dtype;
}

void set_inference_kv_cache(const std::string& dtype) {
  g_inference_kv_cache = kv_cache_dtype_from_name(dtype, "--kv-cache");
}

void set_inference_threads(int threads) {
  DEW_USAGE_CHECK(threads >= 0, "--threads ", threads, " must be >= 1 (or 0: the run's stored [run] threads)");
  g_inference_threads = threads;
}

LoadedObjective load_objective(const std::string& run_dir, const std::string& step, bool use_ema,
                               const std::string& backend_name) {
  LoadedRun lr = load_run(run_dir, step, use_ema, backend_name);
  LoadedObjective out;
  out.objective = lr.run.objective;
  out.backend = lr.run.backend;
  out.updates = lr.updates;
  out.ema = lr.ema;
  out.objective_options = lr.config.section("objective").values();
  return out;
}

std::string resolve_checkpoint(const std::string& run_dir, const std::string& step, const BackendPtr& backend) {
  const fs::path ckpt_dir = fs::path(run_dir) / "checkpoints";
  const std::string latest = find_latest_checkpoint(ckpt_dir.string());
  DEW_USAGE_CHECK(!latest.empty(), "no checkpoint in '", ckpt_dir.string(), "'");
  std::string file = latest;
  if (step == "best") {
    // The best file's name is recorded in the latest checkpoint's state.
    CheckpointData last = training::read_run_checkpoint(latest, backend);
    const std::string best = last.state_text.count("best_file") ? last.state_text.at("best_file") : "";
    if (!best.empty()) file = (ckpt_dir / best).string();
  } else if (step != "latest") {
    char* end = nullptr;
    const long long n = std::strtoll(step.c_str(), &end, 10);
    DEW_USAGE_CHECK(end && *end == '\0' && n >= 0, "--step must be latest, best or a number, got '", step, "'");
    file = (ckpt_dir / checkpoint_name(n)).string();
  }
  DEW_USAGE_CHECK(fs::exists(file), "no checkpoint for step '", step, "' in '", ckpt_dir.string(), "'");
  return file;
}

std::map<std::string, double> evaluate(const std::string& run_dir, const std::string& step, bool use_ema,
                                       const std::string& backend_name, Options& request) {
  LoadedRun lr = load_run(run_dir, step, use_ema, backend_name);
  store_inference_weights(lr, false);
  NoGradGuard no_grad;
  auto loader = make_loader(lr.config.section("data"), "val", lr.run.seed);
  ValidationResult vr = lr.run.objective->evaluate(*loader, request, StepInfo{lr.updates, 0, lr.run.seed});
  request.check_all_used();
  if (!vr.artifacts.empty()) {
    const fs::path dir = fs::path(run_dir) / "eval";
    fs::create_directories(dir);
    for (const auto& a : vr.artifacts) {
      std::ofstream f(dir / a.file_name, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(a.bytes.data()), std::streamsize(a.bytes.size()));
      DEW_CHECK(f.good(), "cannot write ", (dir / a.file_name).string());
    }
  }
  vr.metrics["step"] = double(lr.updates);
  vr.metrics["ema"] = lr.ema ? 1.0 : 0.0;
  return vr.metrics;
}

void sample(const std::string& run_dir, const std::string& step, bool use_ema, const std::string& backend_name,
            Options& request) {
  LoadedRun lr = load_run(run_dir, step, use_ema, backend_name);
  store_inference_weights(lr, true);
  NoGradGuard no_grad;
  lr.run.objective->sample(request);
}

std::unique_ptr<InferenceRun> load_inference_run(const std::string& run_dir, const std::string& step, bool use_ema,
                                                 const std::string& backend_name) {
  LoadedRun lr = load_run(run_dir, step, use_ema, backend_name);
  store_inference_weights(lr, true);
  auto r = std::make_unique<InferenceRun>();
  r->checkpoint = resolve_checkpoint(run_dir, step, lr.run.backend);
  r->config = std::move(lr.config);
  r->objective = lr.run.objective;
  r->backend = lr.run.backend;
  r->updates = lr.updates;
  r->ema = lr.ema;
  return r;
}

void export_safetensors(const std::string& run_dir, const std::string& step, bool use_ema,
                        const std::string& backend_name, const std::string& out_dir) {
  LoadedRun lr = load_run(run_dir, step, use_ema, backend_name);
  fs::create_directories(out_dir);
  std::map<std::string, std::string> meta{{"format", "pt"},
                                          {"dew.version", DEW_SDK_VERSION},
                                          {"dew.step", std::to_string(lr.updates)},
                                          {"dew.ema", lr.ema ? "1" : "0"}};
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), lr.run.objective->export_parameters(), meta);
  // config.json: the [model] section (numbers unquoted), plus what the model reports about itself.
  std::map<std::string, std::string> fields = lr.config.section("model").values();
  if (Model* m = lr.run.objective->main_model())
    for (const auto& [k, v] : m->describe()) fields[k] = v;
  fields["dew_objective"] = lr.config.section("objective").get_string("plugin", "");
  std::ofstream f(fs::path(out_dir) / "config.json", std::ios::trunc);
  f << "{\n";
  size_t i = 0;
  for (const auto& [k, v] : fields) {
    char* end = nullptr;
    std::strtod(v.c_str(), &end);
    const bool literal = (!v.empty() && end && *end == '\0') || v == "true" || v == "false";
    f << "  \"" << k << "\": " << (literal ? v : "\"" + v + "\"") << (++i < fields.size() ? ",\n" : "\n");
  }
  f << "}\n";
}

}  // namespace dew

std::map<std::string, double> dew::evaluate(const std::string& run_dir, const std::string& step, bool use_ema,
                                            const std::string& backend_name) {
  Options none(std::map<std::string, std::string>{}, "eval");
  return evaluate(run_dir, step, use_ema, backend_name, none);
}

dew::ValidationResult dew::Objective::evaluate(DataLoader& loader, Options&, const StepInfo& info) {
  return validate(loader, info);
}

std::map<std::string, double> dew::Objective::validation_metrics(const std::map<std::string, double>&) const {
  DEW_CHECK(false, "an objective that shards its validation must define validation_metrics()");
  return {};
}

void dew::Objective::sample(Options&) {
  DEW_USAGE_CHECK(false, "this objective has no sampler (sampling comes with the lm and diffusion objectives)");
}

std::vector<dew::GeneratedImage> dew::Objective::generate_images(Options&, int64_t) {
  DEW_USAGE_CHECK(false, "this objective does not generate images (the diffusion objective does)");
  return {};
}

