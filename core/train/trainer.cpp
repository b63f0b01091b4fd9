// core/train/trainer.cpp — `dew-run train` and `dew-run eval`: the training loop and its bookkeeping.
//
// Loop (per optimizer update): grad_accum micro-batches (forward, loss / grad_accum, backward) ->
// global grad norm -> non-finite guard (skip and count; stop after 5 in a row) -> clip factor folded
// into the fused update -> LR from the schedule -> optimizer update -> EMA -> log / validate /
// checkpoint at their cadences. trainer.steps is an absolute target: a resumed run stops there too.
//
// Resume is bit-exact: the checkpoint holds parameters, EMA, optimizer state, the update/attempt
// counters, the data position and the best metric; everything random is keyed by (seed, step) through
// Philox, so nothing else carries state.
//
// Data parallel ([run] dist = mpi; docs/distributed.md): the parts marked "dist" below. Every rank
// builds the same run, reads its shard of each global batch, starts from rank 0's weights/EMA/optimizer
// state (broadcast), and all-reduces its gradients in buckets overlapped with the last micro-batch's
// backward (core/dist). Rank 0 alone logs and writes metrics, config.ini and checkpoints; every rank
// validates on the whole split (identical weights, identical results), so no rank waits on another.
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "dew/autograd.hpp"
#include "dew/checkpoint.hpp"
#include "dew/comm.hpp"  // dist
#include "dew/error.hpp"
#include "dew/interop.hpp"
#include "dew/ops.hpp"
#include "dew/profile.hpp"
#include "dew/registry.hpp"
#include "dew/safetensors.hpp"
#include "dew/train.hpp"
#include "dist/data_parallel.hpp"  // dist

namespace dew {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_interrupts{0};
void on_sigint(int) {
  if (g_interrupts.fetch_add(1) >= 1) {
    std::signal(SIGINT, SIG_DFL);
    std::raise(SIGINT);
  }
}

std::string json_number(double v) {
  if (!std::isfinite(v)) return std::isnan(v) ? "NaN" : (v > 0 ? "Infinity" : "-Infinity");
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

std::string format_duration(double s) {
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%dh%02dm", int(s / 3600), int(std::fmod(s, 3600) / 60));
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%dm%02ds", int(s / 60), int(std::fmod(s, 60)));
  else
    std::snprintf(buf, sizeof buf, "%.0fs", s);
  return buf;
}

// The backend's sustained fp32 matmul rate (GFLOP/s), the denominator of MFU.
double measure_peak_gflops(const BackendPtr& be) {
  NoGradGuard no_grad;
  const int64_t n = 512;
  Tensor a = Tensor::uniform({n, n}, -1, 1, 7, 1, be), b = Tensor::uniform({n, n}, -1, 1, 7, 2, be);
  Tensor c = matmul(a, b);  // warm-up
  int iters = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double secs = 0;
  do {
    c = matmul(a, b);
    ++iters;
    secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (secs < 0.2 && iters < 1000);
  return 2.0 * double(n * n * n) * iters / secs * 1e-9;
}

std::shared_ptr<spdlog::logger> make_logger(const std::string& run_dir) {
  auto console = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  console->set_pattern("%v");
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>((fs::path(run_dir) / "log.txt").string());
  file->set_pattern("[%Y-%m-%d %H:%M:%S] %v");
  auto logger = std::make_shared<spdlog::logger>("dew", spdlog::sinks_init_list{console, file});
  logger->flush_on(spdlog::level::info);
  return logger;
}

// ---- dist: the communicator of the training run in progress (an error on one rank ends the job) ----
std::shared_ptr<Communicator> g_active_comm;

// dist: ranks other than 0 print errors only and write no log file.
std::shared_ptr<spdlog::logger> make_quiet_logger() {
  auto console = std::make_shared<spdlog::sinks::stderr_sink_mt>();
  console->set_pattern("%v");
  auto logger = std::make_shared<spdlog::logger>("dew", console);
  logger->set_level(spdlog::level::err);
  return logger;
}
// ---- end dist ----

// Keeps lines of metrics.jsonl whose "step" is <= `step` (a resume rewinds the log to its checkpoint).
void rewind_metrics(const fs::path& path, int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::vector<std::string> keep;
  std::string line;
  while (std::getline(in, line)) {
    const auto pos = line.find("\"step\":");
    if (pos == std::string::npos) continue;
    if (std::stoll(line.substr(pos + 7)) <= step) keep.push_back(line);
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : keep) out << l << "\n";
}

// Prefix of the objective's state tensors (Objective::state()) in a checkpoint's state/ group.
const std::string kObjectiveState = "objective.";

struct RunState {
  int64_t updates = 0, attempts = 0, skipped = 0, streak = 0;
  double best = NAN;
  std::string best_file;
};

// Everything a run is made of, built from the config (shared by train and eval).
struct Run {
  BackendPtr backend;
  std::string matmul_precision;  // [run] matmul_precision when set, else empty
  uint64_t seed = 0;
  std::shared_ptr<Objective> objective;
  std::unique_ptr<DataLoader> train_loader;
  NamedTensors params, ema_params;
  // ---- dist: the communicator (train only; null when [run] dist = none) ----
  std::shared_ptr<Communicator> comm;
  int rank = 0, world = 1;
  double bucket_mb = 25;
  // ---- end dist ----
};

std::string plugins_line() {
  std::string s;
  for (const auto& p : Registry::global().plugins()) s += (s.empty() ? "" : "; ") + p.name + " " + p.version;
  return s;
}

Run build_run(Config& config, const std::string& backend_override, bool with_train_data, bool profile = false) {
  Run run;
  Options& rs = config.section("run");
  rs.get_string("name", "");
  rs.get_strings("plugins", {});  // read by the launcher before loading plugins
  // ---- dist: [run] dist = none | <communicator> (mpi), dist_timeout (s), bucket_mb ----
  const std::string dist = rs.get_string("dist", "none");
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
  // [run] matmul_precision (PyTorch's float32 matmul precision): highest = f32, high = TF32, medium = bf16
  // inputs with f32 accumulation. A permission, not a demand: a backend without such a mode runs f32 (ref
  // always; cpu has no TF32, and bf16 only on CPUs with AVX512-BF16).
  Options backend_options;
  if (rs.has("matmul_precision")) {
    const std::string prec = rs.get_string("matmul_precision", "highest");
    DEW_USAGE_CHECK(prec == "highest" || prec == "high" || prec == "medium", "option 'run.matmul_precision' = '", prec,
                    "' is not one of highest, high, medium");
    backend_options.set("matmul_precision", prec);
    run.matmul_precision = prec;
  }
  run.backend = create_backend(backend_name, backend_options);
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
  run.params = run.objective->parameters();
  DEW_CHECK(!run.params.empty(), "objective '", objective, "' has no parameters to train");
  return run;
}

CheckpointData make_checkpoint(Config& config, const Run& run, const Optimizer* opt, const Ema* ema, const RunState& st,
                               const DataPosition& pos) {
  CheckpointData c;
  c.attributes["dew.config"] = config.to_ini();
  c.attributes["dew.plugins"] = plugins_line();
  c.params = run.params;
  if (ema) c.ema = ema->tensors();
  if (opt) c.optim = opt->state();
  c.counters = {{"updates", st.updates},
                {"attempts", st.attempts},
                {"skipped", st.skipped},
                {"nonfinite_streak", st.streak},
                {"data.next", pos.next}};
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

}  // namespace

// ---- dist: an error on one rank ends the whole job at once (its peers would wait in a collective) ----
namespace {
int train_process(Config& config, const TrainOptions& options);
}  // namespace

int train(Config& config, const TrainOptions& options) {
  auto abort_job = [](ErrorKind kind, const std::string& what) {
    if (!g_active_comm || g_active_comm->size() <= 1) return;
    const bool usage = kind == ErrorKind::usage;
    g_active_comm->abort(usage ? 2 : 1, "dew-run train: rank " + std::to_string(g_active_comm->rank()) + ": " +
                                            (usage ? "" : "error: ") + what);
  };
  try {
    const int code = train_process(config, options);
    g_active_comm.reset();
    return code;
  } catch (const Error& e) {
    abort_job(e.kind(), e.describe());
    g_active_comm.reset();
    throw;
  } catch (const std::exception& e) {
    abort_job(ErrorKind::runtime, e.what());
    g_active_comm.reset();
    throw;
  }
}

namespace {
int train_process(Config& config, const TrainOptions& options) {
  // ---- end dist ----
  Options& ts = config.section("trainer");
  const int64_t steps = ts.get_int("steps", 0);
  DEW_USAGE_CHECK(steps > 0, "option 'trainer.steps' must be a positive number of updates");
  const int64_t grad_accum = ts.get_int("grad_accum", 1);
  const int64_t log_every = ts.get_int("log_every", 10);
  const int64_t eval_every = ts.get_int("eval_every", 0);
  const int64_t checkpoint_every = ts.get_int("checkpoint_every", 0);
  const int64_t keep = ts.get_int("keep", 3);
  // Fine-tuning: the initial weights, by name, from a run directory, a checkpoint or safetensors
  // (dew/interop.hpp load_weights); ignored on --resume, where the checkpoint has them.
  const std::string init_from = ts.get_string("init_from", "");
  const double ema_decay = ts.get_double("ema_decay", 0.0);
  const bool ema_warmup = ts.get_bool("ema_warmup", true);
  const int64_t max_streak = ts.get_int("max_nonfinite_streak", 5);
  // Pause point: stop (with a checkpoint) after this many updates without changing the schedule, which
  // still runs to `steps`; a later --resume continues. Time-boxed jobs and the resume tests use it.
  const int64_t stop_at = ts.get_int("stop_at", steps);
  DEW_USAGE_CHECK(stop_at > 0 && stop_at <= steps, "option 'trainer.stop_at' must be in [1, trainer.steps]");
  DEW_USAGE_CHECK(grad_accum > 0, "option 'trainer.grad_accum' must be positive");
  DEW_USAGE_CHECK(log_every > 0, "option 'trainer.log_every' must be positive");
  DEW_USAGE_CHECK(eval_every >= 0 && checkpoint_every >= 0,
                  "trainer.eval_every and trainer.checkpoint_every must be >= 0");
  DEW_USAGE_CHECK(keep >= 1, "option 'trainer.keep' must be at least 1");
  // Kernel-by-kernel timing of `profile` updates after 3 warm-up updates of this process (dew/profile.hpp):
  // the table goes to the log and to RUN_DIR/profile.txt. Results are unchanged.
  const int64_t profile_steps = ts.get_int("profile", 0);
  DEW_USAGE_CHECK(profile_steps >= 0, "option 'trainer.profile' must be >= 0 updates (0 = off)");

  std::string run_dir = options.run_dir;
  if (run_dir.empty()) {
    const std::string name = config.section("run").get_string("name", "run");
    run_dir = (fs::path("runs") / name).string();
  }
  const fs::path ckpt_dir = fs::path(run_dir) / "checkpoints";
  const std::string latest = find_latest_checkpoint(ckpt_dir.string());
  DEW_USAGE_CHECK(options.resume || latest.empty(), "run directory '", run_dir,
                  "' already holds checkpoints; pass --resume to continue it or choose another --run-dir");
  DEW_USAGE_CHECK(!options.resume || !latest.empty(), "--resume: no checkpoint to resume in '", ckpt_dir.string(), "'");

  Run run = build_run(config, options.backend_name, true, profile_steps > 0);
  auto* profiler = dynamic_cast<ProfilingBackend*>(run.backend.get());
  constexpr int64_t kProfileWarmup = 3;
  int64_t profiled = 0;
  double profiled_seconds = 0;
  if (!init_from.empty() && !options.resume) load_weights(init_from, run.params);  // before the EMA copies them
  // ---- dist ----
  const bool leader = run.rank == 0;
  std::unique_ptr<dist::DataParallel> dp;
  if (run.comm) dp = std::make_unique<dist::DataParallel>(run.comm, run.params, run.bucket_mb);
  // ---- end dist ----
  Options& optim_section = config.section("optim");
  const double lr = optim_section.get_double("lr", 1e-3);
  const double clip = optim_section.get_double("clip_grad_norm", 0.0);
  DEW_USAGE_CHECK(lr > 0, "option 'optim.lr' must be positive");
  DEW_USAGE_CHECK(clip >= 0, "option 'optim.clip_grad_norm' must be >= 0");
  std::shared_ptr<Optimizer> optimizer = make_optimizer(optim_section, run.params);
  auto schedule = make_schedule(config.section("schedule"), lr, steps);
  std::unique_ptr<Ema> ema;
  NamedTensors ema_params;
  if (ema_decay > 0) {
    ema_params = run.objective->ema_parameters();
    ema = std::make_unique<Ema>(ema_params, ema_decay, ema_warmup);
  }
  config.check_all_used();  // every key was read by someone: the rest are typos

  if (leader) {  // dist: rank 0 alone writes into the run directory
    fs::create_directories(ckpt_dir);
    remove_stale_temporaries(ckpt_dir.string());
  }
  auto log = leader ? make_logger(run_dir) : make_quiet_logger();  // dist
  if (leader) {                                                    // dist
    std::ofstream cfg(fs::path(run_dir) / "config.ini", std::ios::trunc);
    cfg << "# effective config of this run (dew " << DEW_SDK_VERSION << ")\n" << config.to_ini();
  }

  RunState st;
  if (options.resume) {
    CheckpointData c = read_checkpoint(latest, run.backend);
    load_into(c.params, "params", run.params);
    if (ema) {
      DEW_CHECK(!c.ema.empty(), "checkpoint ", latest, " holds no EMA weights but trainer.ema_decay > 0");
      load_into(c.ema, "ema", ema->tensors());
    }
    const auto state = optimizer->state();
    for (const auto& [slot, tensors] : state) {
      auto it = c.optim.find(slot);
      DEW_CHECK(it != c.optim.end(), "checkpoint ", latest, " has no optimizer slot '", slot, "' (optimizer ",
                optimizer->name(), ")");
      load_into(it->second, "optim/" + slot, tensors);
    }
    load_objective_state(c, latest, *run.objective);
    st.updates = c.counters.at("updates");
    st.attempts = c.counters.at("attempts");
    st.skipped = c.counters.at("skipped");
    st.streak = c.counters.at("nonfinite_streak");
    if (c.state_values.count("best_metric")) st.best = c.state_values.at("best_metric");
    st.best_file = c.state_text.count("best_file") ? c.state_text.at("best_file") : "";
    run.train_loader->seek(DataPosition{c.counters.at("data.next"), c.state_text.at("data.order")});
    if (leader) rewind_metrics(fs::path(run_dir) / "metrics.jsonl", st.updates);  // dist: rank 0's file
    log->info("resumed {} at update {} of {}", latest, st.updates, steps);
  }
  // ---- dist: every rank starts from rank 0's weights, EMA and optimizer state, at rank 0's position ----
  if (dp) {
    dp->broadcast(run.params);
    if (ema) dp->broadcast(ema->tensors());
    if (const NamedTensors os = run.objective->state(); !os.empty()) dp->broadcast(os);
    for (const auto& [slot, tensors] : optimizer->state()) dp->broadcast(tensors);
    const int64_t mine[3] = {st.updates, st.attempts, run.train_loader->position().next};
    Tensor at = Tensor::from_host(mine, {3}, DType::i64, run.backend);
    dp->comm().broadcast(at, 0);
    int64_t root[3];
    at.copy_to_host(root);
    DEW_CHECK(root[0] == mine[0] && root[1] == mine[1] && root[2] == mine[2], "rank ", run.rank, " starts at update ",
              mine[0], " (data position ", mine[2], ") but rank 0 at update ", root[0], " (data position ", root[2],
              "): every rank must see the same run directory (a shared filesystem)");
    const int64_t batch = run.train_loader->config().batch_size;
    const std::string micro = grad_accum > 1 ? " x " + std::to_string(grad_accum) + " micro-batches" : "";
    log->info(
        "data parallel: {} ranks x batch {}{} = {} samples per update; gradients all-reduced ({}) in {} buckets "
        "of <= {} MiB",
        run.world, batch, micro, run.world * batch * grad_accum, run.comm->name(), dp->num_buckets(), run.bucket_mb);
  }
  bool dist_stop = false;  // an interrupt seen by any rank, agreed on at the end of each update
  double step_sync_ms = 0, window_sync_ms = 0;
  // ---- end dist ----
  std::ofstream metrics;
  if (leader) metrics.open(fs::path(run_dir) / "metrics.jsonl", std::ios::app);  // dist: rank 0 alone

  std::unique_ptr<DataLoader> val_loader;
  auto validate = [&](int64_t at) -> std::map<std::string, double> {
    if (!val_loader) val_loader = make_loader(config.section("data"), "val", run.seed);
    val_loader->seek(DataPosition{0, val_loader->position().order});
    if (ema) ema->swap_into(ema_params);
    ValidationResult vr;
    try {
      vr = run.objective->validate(*val_loader, StepInfo{at, 0, run.seed});
    } catch (...) {
      if (ema) ema->swap_into(ema_params);
      throw;
    }
    if (ema) ema->swap_into(ema_params);
    if (leader)  // dist: rank 0 writes
      for (const Artifact& a : vr.artifacts) {
        fs::create_directories(fs::path(run_dir) / "samples");
        std::ofstream f(fs::path(run_dir) / "samples" / a.file_name, std::ios::binary | std::ios::trunc);
        f.write(reinterpret_cast<const char*>(a.bytes.data()), std::streamsize(a.bytes.size()));
      }
    return vr.metrics;
  };

  auto save = [&](bool best) {
    const std::string name = checkpoint_name(st.updates);
    if (best) st.best_file = name;
    if (!leader) return;  // dist: rank 0 writes the checkpoints
    write_checkpoint((ckpt_dir / name).string(),
                     make_checkpoint(config, run, optimizer.get(), ema.get(), st, run.train_loader->position()));
    prune_checkpoints(ckpt_dir.string(), int(keep), st.best_file);
  };

  const double peak = measure_peak_gflops(run.backend);
  const double flops_per_sample = run.objective->train_flops_per_sample();
  const bool tty = leader && isatty(STDERR_FILENO);  // dist: rank 0 alone prints
  int64_t num_params = 0;
  for (auto& [k, t] : run.params) num_params += t.numel();
  log->info("training {} parameters on the {} backend (measured matmul peak {:.0f} GFLOP/s) to update {} -> {}",
            num_params, run.backend->name(), peak, steps, run_dir);
  if (!run.matmul_precision.empty())
    log->info("matmul_precision = {} (a permission: cuda and cpu take it where the hardware has the mode)",
              run.matmul_precision);
  // dew-run's OpenMP choice when it made one (tools/dew-run/openmp_setup.hpp sets DEW_OPENMP_CHOICE).
  if (const char* omp = std::getenv("DEW_OPENMP_CHOICE"); omp && *omp && run.backend->name() == "cpu")
    log->info("openmp: {} (run.threads, when set, overrides the count)", omp);

  g_interrupts = 0;
  auto previous_handler = std::signal(SIGINT, on_sigint);
  // dist: mpirun turns Ctrl-C into SIGTERM for the ranks (no checkpoint) but forwards SIGUSR1, so
  // `kill -USR1 <mpirun pid>` pauses a data-parallel run with a checkpoint, like Ctrl-C in one process.
  auto previous_usr1 = dp ? std::signal(SIGUSR1, on_sigint) : SIG_DFL;
  const auto run_start = std::chrono::steady_clock::now();
  const int64_t start_updates = st.updates;
  double window_time = 0, window_loss = 0;
  int64_t window_samples = 0, window_tokens = 0, window_n = 0;
  std::map<std::string, double> window_metrics;
  int exit_code = 0;

  while (st.updates < stop_at) {
    if (dp ? dist_stop : g_interrupts > 0) {  // dist: ranks stop at the same update
      if (tty) std::fputc('\n', stderr);
      save(false);
      if (dp) dp->comm().barrier();  // dist: exit status 130 makes mpirun end the job: not before rank 0 has saved
      log->info("interrupted: saved {} at update {}; resume with --resume", checkpoint_name(st.updates), st.updates);
      exit_code = 130;
      break;
    }
    // Profiling covers whole updates only (validation and checkpoints stay out of it).
    const bool profiling = profiler && profiled < profile_steps && st.updates - start_updates >= kProfileWarmup;
    if (profiling) profiled == 0 ? profiler->start() : profiler->resume();
    const auto t0 = std::chrono::steady_clock::now();
    double loss_value = 0;
    bool finite = true;
    int64_t samples = 0, tokens = 0;
    std::map<std::string, double> step_metrics;
    for (int64_t micro = 0; micro < grad_accum; ++micro) {
      // The stream index of this rank's first row (see dew/data.hpp), read before next() advances it.
      const int64_t position =
          run.train_loader->position().next + int64_t(run.rank) * run.train_loader->config().batch_size;
      Batch batch = to_device(run.train_loader->next(), run.backend);
      StepResult r = run.objective->step(batch, StepInfo{st.updates, micro, run.seed, position});
      const double lv = r.loss.item();
      loss_value += lv / double(grad_accum);
      samples += r.samples;
      tokens += r.tokens;
      for (const auto& [k, v] : r.metrics) step_metrics[k] += v / double(grad_accum);
      if (!std::isfinite(lv)) {
        finite = false;
        if (!dp) continue;  // dist: every rank runs every backward (collectives must match); the sum decides
      }
      if (dp && micro == grad_accum - 1) {  // dist: all-reduce in buckets, overlapped with this backward
        Tensor loss = grad_accum == 1 ? r.loss : scale(r.loss, 1.0f / float(grad_accum));
        run_backward(loss, Tensor::full(loss.shape(), 1.0, loss.dtype(), loss.backend_ptr()), dp->begin_sync());
        continue;
      }
      (grad_accum == 1 ? r.loss : scale(r.loss, 1.0f / float(grad_accum))).backward();
    }
    // ---- dist: averaged gradients; the logged figures cover the global batch ----
    if (dp) {
      dp->finish_sync();
      std::vector<double> v = {loss_value, double(samples), double(tokens), finite ? 0.0 : 1.0,
                               g_interrupts > 0 ? 1.0 : 0.0};
      for (const auto& [k, x] : step_metrics) v.push_back(x);
      dp->sum(v);
      loss_value = v[0] / double(run.world);
      samples = int64_t(v[1]);
      tokens = int64_t(v[2]);
      finite = v[3] == 0.0 && std::isfinite(loss_value);
      dist_stop = v[4] > 0.0;
      size_t i = 5;
      for (auto& [k, x] : step_metrics) x = v[i++] / double(run.world);
      step_sync_ms = dp->take_sync_ms();
    }
    // ---- end dist ----
    ++st.attempts;
    const double gnorm = finite ? global_grad_norm(run.params) : NAN;
    if (!finite || !std::isfinite(gnorm)) {
      for (auto& [k, p] : run.params) p.zero_grad();
      ++st.skipped;
      ++st.streak;
      log->warn("update {}: non-finite {} ({}); skipped ({} in a row, {} in total)", st.updates + 1,
                finite ? "gradient norm" : "loss", finite ? json_number(gnorm) : json_number(loss_value), st.streak,
                st.skipped);
      DEW_CHECK_HINT(st.streak < max_streak, "lower optim.lr, set optim.clip_grad_norm, or check the data",
                     "stopping: ", st.streak, " non-finite updates in a row at update ", st.updates + 1);
      continue;
    }
    st.streak = 0;
    const float grad_scale = clip > 0 && gnorm > clip ? float(clip / (gnorm + 1e-6)) : 1.0f;
    const double lr_now = schedule(st.updates);
    optimizer->update(float(lr_now), grad_scale, st.updates + 1);
    for (auto& [k, p] : run.params) p.zero_grad();
    ++st.updates;
    if (ema) ema->update(ema_params, st.updates);
    {
      NoGradGuard no_grad;
      run.objective->after_update(StepInfo{st.updates, 0, run.seed});
    }
    run.backend->synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (profiling) {
      profiler->stop();
      profiled_seconds += dt;
      if (++profiled == profile_steps) {
        const std::string table = profiler->report(profiled, profiled_seconds / double(profiled) * 1e3);
        if (tty) std::fputc('\n', stderr);
        std::istringstream lines(table);
        for (std::string l; std::getline(lines, l);) log->info("{}", l);
        if (leader) std::ofstream(fs::path(run_dir) / "profile.txt") << table;
      }
    }

    window_time += dt;
    window_loss += loss_value;
    window_samples += samples;
    window_tokens += tokens;
    window_sync_ms += step_sync_ms;  // dist
    ++window_n;
    for (const auto& [k, v] : step_metrics) window_metrics[k] += v;

    const bool last = st.updates == stop_at;
    if (st.updates % log_every == 0 || last) {
      const double sps = double(window_samples) / window_time, tps = double(window_tokens) / window_time;
      const double mfu = flops_per_sample > 0 ? flops_per_sample * sps * 1e-9 / (peak * run.world) : 0.0;  // dist
      std::ostringstream js;
      js << "{\"step\":" << st.updates << ",\"loss\":" << json_number(window_loss / double(window_n))
         << ",\"lr\":" << json_number(lr_now) << ",\"grad_norm\":" << json_number(gnorm)
         << ",\"step_time_ms\":" << json_number(window_time / double(window_n) * 1e3)
         << ",\"samples_per_sec\":" << json_number(sps);
      if (window_tokens > 0) js << ",\"tokens_per_sec\":" << json_number(tps);
      js << ",\"mfu\":" << json_number(mfu) << ",\"skipped\":" << st.skipped;
      if (dp) js << ",\"allreduce_ms\":" << json_number(window_sync_ms / double(window_n));  // dist
      for (const auto& [k, v] : window_metrics) js << ",\"" << k << "\":" << json_number(v / double(window_n));
      js << "}";
      metrics << js.str() << "\n";
      metrics.flush();
      const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
      const double eta = elapsed / double(st.updates - start_updates) * double(steps - st.updates);
      char line[512];
      std::snprintf(
          line, sizeof line, "step %lld/%lld  loss %.4f  lr %.2e  %.0f samples/s%s  ETA %s", (long long)st.updates,
          (long long)steps, window_loss / double(window_n), lr_now, sps,
          window_metrics.count("accuracy")
              ? ("  acc " + std::to_string(int(100 * window_metrics["accuracy"] / double(window_n))) + "%").c_str()
              : "",
          format_duration(eta).c_str());
      if (tty) {
        std::fprintf(stderr, "\r\033[K%s", line);
        std::fflush(stderr);
      } else {
        log->info("{}", line);
      }
      window_time = window_loss = window_sync_ms = 0;
      window_samples = window_tokens = window_n = 0;
      window_metrics.clear();
    }

    bool is_best = false;
    if ((eval_every > 0 && st.updates % eval_every == 0) || st.updates == steps) {
      auto vm = validate(st.updates);
      std::ostringstream js;
      js << "{\"step\":" << st.updates;
      std::string text;
      for (const auto& [k, v] : vm) {
        js << ",\"val/" << k << "\":" << json_number(v);
        text += "  val " + k + " " + std::to_string(v);
      }
      js << "}";
      metrics << js.str() << "\n";
      metrics.flush();
      if (tty) std::fputc('\n', stderr);
      log->info("step {}:{}", st.updates, text);
      const std::string key = run.objective->primary_metric();
      if (vm.count(key)) {
        const double v = vm[key];
        const bool better = std::isnan(st.best) || (run.objective->higher_is_better() ? v > st.best : v < st.best);
        if (better) {
          st.best = v;
          is_best = true;
        }
      }
    }
    if (is_best || last || (checkpoint_every > 0 && st.updates % checkpoint_every == 0)) save(is_best);
  }
  std::signal(SIGINT, previous_handler);
  if (dp) std::signal(SIGUSR1, previous_usr1);  // dist
  if (exit_code == 0) {
    if (tty) std::fputc('\n', stderr);
    const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
    log->info("done: {} updates in {} ({} skipped); run directory {}", st.updates, format_duration(total), st.skipped,
              run_dir);
  }
  spdlog::drop("dew");
  return exit_code;
}
}  // namespace

namespace {

// A built run with a checkpoint's weights loaded (EMA weights when asked and present).
struct LoadedRun {
  Config config;
  Run run;
  int64_t updates = 0;
  bool ema = false;
};

LoadedRun load_run(const std::string& run_dir, const std::string& step, bool use_ema, const std::string& backend_name) {
  LoadedRun lr;
  const fs::path cfg_path = fs::path(run_dir) / "config.ini";
  DEW_USAGE_CHECK(fs::exists(cfg_path), "'", run_dir, "' is not a run directory (no config.ini)");
  lr.config = Config::load_ini(cfg_path.string());
  lr.run = build_run(lr.config, backend_name, false);
  const std::string file = resolve_checkpoint(run_dir, step, lr.run.backend);
  CheckpointData c = read_checkpoint(file, lr.run.backend);
  load_into(c.params, "params", lr.run.params);
  lr.ema = use_ema && !c.ema.empty();
  if (lr.ema) load_into(c.ema, "ema", lr.run.objective->ema_parameters());  // EMA covers ema_parameters()
  load_objective_state(c, file, *lr.run.objective);
  lr.updates = c.counters.count("updates") ? c.counters.at("updates") : 0;
  return lr;
}

}  // namespace

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
    CheckpointData last = read_checkpoint(latest, backend);
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
  NoGradGuard no_grad;
  lr.run.objective->sample(request);
}

std::unique_ptr<InferenceRun> load_inference_run(const std::string& run_dir, const std::string& step, bool use_ema,
                                                 const std::string& backend_name) {
  LoadedRun lr = load_run(run_dir, step, use_ema, backend_name);
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

void dew::Objective::sample(Options&) {
  DEW_USAGE_CHECK(false, "this objective has no sampler (sampling comes with the lm and diffusion objectives)");
}

std::vector<dew::GeneratedImage> dew::Objective::generate_images(Options&, int64_t) {
  DEW_USAGE_CHECK(false, "this objective does not generate images (the diffusion objective does)");
  return {};
}
