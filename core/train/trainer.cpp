// core/train/trainer.cpp — `dew-run train`: the training loop, in named stages.
//
//   TrainerOptions::read   the [trainer] and [optim] keys the loop reads (checked up front)
//   Trainer::Trainer       the run (run.cpp), optimizer, schedule, EMA, run directory and logger
//   Trainer::resume        a checkpoint's weights, EMA, optimizer state, counters and data position
//   Trainer::start         config.ini, every rank on rank 0's state (dist::DataParallel), the start line
//   validate_before_training   what later stages read (validation split, sampling options) is checked
//                          before the first update, so a late error never throws updates away
//   Trainer::one_update    grad_accum micro-batches (forward, loss / grad_accum, backward) -> the update's
//                          one host transfer (losses, gradient square sums, device metrics) -> non-finite
//                          guard (skip and count; stop after a streak) -> clip factor folded into the fused
//                          update -> LR from the schedule -> optimizer update -> QK-Clip -> EMA
//   QkClipStage            muonclip (Optimizer::qk_clip_tau() > 0): the attention blocks' max logits recorded
//                          during the update's forwards (dew/qk_clip.hpp), read with the update's one transfer
//                          (the max over ranks when data parallel), then the q/k rows of the groups above tau
//                          rescaled; metrics max_logit (the largest over every block and head) and qk_clipped
//   Trainer::log_update    the metrics window: metrics.jsonl (and its sinks: TensorBoard, the report)
//                          and the progress line every log_every updates; memory accounting:
//                          mem_params_mb / mem_grads_mb / mem_optim_mb (training_state_memory, measured
//                          at the first update's gradients) in the first line, mem_peak_mb in every line
//   Trainer::validate, save    at their cadences (and at the end)
//   Trainer::run           the loop, interrupts (Ctrl-C / SIGUSR1: a checkpoint, exit 130) and the end line
//
// trainer.steps is an absolute target: a resumed run stops there too. Resume is bit-exact: the checkpoint
// holds parameters, EMA, optimizer state, the update/attempt counters, the data position and the best
// metric; everything random is keyed by (seed, step) through Philox, so nothing else carries state.
//
// Data parallel ([run] dist = mpi; docs/distributed.md) lives behind dist::DataParallel, which is the
// identity in one process: every rank builds the same run, reads its shard of each global batch, starts
// from rank 0's weights/EMA/optimizer state, and all-reduces its gradients in buckets overlapped with the
// last micro-batch's backward. Rank 0 alone logs and writes metrics, config.ini and checkpoints.
// Validation is sharded where the objective's metrics are sums over records (shards_validation: each rank
// scores its share of the split, the trainer adds their sums); else every rank validates on the whole
// split (identical weights, identical results), so no rank waits on another.
// [run] shard (ZeRO-1/2/3): each rank's optimizer and EMA cover the parameters it owns, DataParallel
// reduces gradients onto owners and broadcasts or releases/gathers parameters around the update, and
// save_sharded writes the usual checkpoint one tensor at a time from its owner (docs/distributed.md).
//
// Host-device transfers on the step path: one per update (plus the data-parallel sum across ranks): the
// micro-batch losses, each gradient's sum of squares and the objective's device metrics are concatenated
// on the device and read together; the global norm is summed in double on the host from those.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include "dew/autograd.hpp"
#include "dew/block_params.hpp"
#include "dew/checkpoint.hpp"
#include "dew/error.hpp"
#include "dew/interop.hpp"
#include "dew/lora.hpp"
#include "dew/ops.hpp"
#include "dew/plugin.h"
#include "dew/profile.hpp"
#include "dew/qk_clip.hpp"
#include "dew/random.hpp"
#include "dew/train.hpp"
#include "dist/data_parallel.hpp"
#include "train/run.hpp"
#include "train/run_log.hpp"
#include "train/watchers.hpp"

namespace dew {

namespace fs = std::filesystem;

namespace training {
namespace {

// The first interrupt pauses the run at the end of its update (a checkpoint, exit 130); a second one of the
// same kind ends the process at once, as the signal's default would.
std::atomic<int> g_interrupts{0};
void on_interrupt(int sig) {
  if (g_interrupts.fetch_add(1) >= 1) {
    std::signal(sig, SIG_DFL);
    std::raise(sig);
  }
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// A step counter of a checkpoint's state/, refused clearly when missing or negative.
int64_t saved_counter(const CheckpointData& c, const std::string& file, const std::string& name) {
  auto it = c.counters.find(name);
  DEW_CHECK(it != c.counters.end(), "checkpoint ", file, " has no counter state/@", name,
            " (not written by dew's trainer, or damaged)");
  DEW_CHECK(it->second >= 0, "checkpoint ", file, " has a negative counter state/@", name, " = ", it->second);
  return it->second;
}

// MemAvailable of /proc/meminfo in bytes (-1 when unknown).
int64_t available_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

// The validation split's loader: over this rank's share of each global batch where the objective shards
// its validation (Objective::shards_validation) in a data-parallel run, else over the whole split.
bool shards_validation(const Run& run) { return run.world > 1 && run.objective->shards_validation(); }
std::unique_ptr<DataLoader> make_validation_loader(Config& config, const Run& run) {
  return shards_validation(run) ? make_loader(config.section("data"), "val", run.seed, run.rank, run.world)
                                : make_loader(config.section("data"), "val", run.seed);
}

// Checks, before the first update, what later stages of the run read: the validation split (built now,
// so a missing or mismatched split fails here, and handed back for validate()), the objective's view of
// it (Objective::check_validation_data: labels, shapes, token ids, sampling options), and the batch
// against the training split and the memory of this machine.
std::unique_ptr<DataLoader> validate_before_training(Config& config, Run& run) {
  const DataLoader& train = *run.train_loader;
  const int64_t batch = train.config().batch_size, world = run.world;
  const int64_t records = train.source().size();
  DEW_USAGE_CHECK(batch * world <= records, "option 'data.batch_size' = ", batch,
                  world > 1 ? " x " + std::to_string(world) + " ranks" : std::string(), " is larger than the ",
                  records, " records of the training split (", train.source().identity(), ")");
  // The host batches in flight (prefetch + the one being assembled + the one in use) and the f32 copy
  // the objective makes of it: a lower bound of what an update needs, so a batch that cannot fit is
  // refused now instead of running the machine out of memory.
  int64_t record_bytes = 0;  // also an upper bound of a record's elements (u8 images are the largest case)
  for (const auto& [name, a] : train.source().get(0)) record_bytes += int64_t(a.bytes.size());
  const double need = double(record_bytes) * double(batch) * double(train.config().prefetch + 2 + 4);
  const int64_t avail = available_memory_bytes();
  DEW_USAGE_CHECK(avail < 0 || need < double(avail), "option 'data.batch_size' = ", batch, " needs at least ",
                  int64_t(need / (1 << 20)), " MiB for its batches alone, more than the ", avail / (1 << 20),
                  " MiB this machine has available");
  auto val = make_validation_loader(config, run);
  run.objective->check_validation_data(*val);
  return val;
}

// ---- stage: reading options ----
struct TrainerOptions {
  int64_t steps = 0, grad_accum = 1, log_every = 10, eval_every = 0, checkpoint_every = 0, keep = 3;
  // Fine-tuning: the initial weights, by name, from a run directory, a checkpoint or safetensors
  // (dew/interop.hpp load_weights); ignored on --resume, where the checkpoint has them.
  std::string init_from;
  double ema_decay = 0.0;
  bool ema_warmup = true;
  int64_t max_streak = 5;
  // Pause point: stop (with a checkpoint) after this many updates without changing the schedule, which
  // still runs to `steps`; a later --resume continues. Time-boxed jobs and the resume tests use it.
  int64_t stop_at = 0;
  // Kernel-by-kernel timing of `profile` updates after 3 warm-up updates of this process (dew/profile.hpp):
  // the table goes to the log and to RUN_DIR/profile.txt. Results are unchanged.
  int64_t profile_steps = 0;
  // Activation recomputation of the backbones' blocks during the updates (dew/autograd.hpp
  // recompute_block): none keeps every activation; blocks keeps each block's input and recomputes it in
  // the backward (same losses and gradients bit for bit, less memory, one more forward).
  Recompute recompute = Recompute::none;
  // How an update weighs its micro-batches' losses (and so their gradients). micro_batch: each micro-batch's loss (an
  // objective's mean over its own rows or tokens) counts 1 / (grad_accum * world), whatever it holds. token: every
  // token the objective counted (StepResult::tokens / device_tokens) counts alike over the update's micro-batches and
  // ranks: loss = sum_m n_m loss_m / sum_m n_m, what one batch of all of them would give (the gradient-accumulation
  // fix of Hugging Face's Trainer and torchtitan's global token normalisation): micro-batches of chat data, packed rows
  // or GRPO completions differ in how many tokens they train.
  bool token_weighted = false;
  WatchOptions watch;  // tensorboard, report_every (core/train/watchers.hpp)

  static TrainerOptions read(Options& ts) {
    TrainerOptions o;
    o.steps = ts.get_int("steps", 0);
    DEW_USAGE_CHECK(o.steps > 0, "option 'trainer.steps' must be a positive number of updates");
    o.grad_accum = ts.get_int("grad_accum", 1);
    o.log_every = ts.get_int("log_every", 10);
    o.eval_every = ts.get_int("eval_every", 0);
    o.checkpoint_every = ts.get_int("checkpoint_every", 0);
    o.keep = ts.get_int("keep", 3);
    o.init_from = ts.get_string("init_from", "");
    o.ema_decay = ts.get_double("ema_decay", 0.0);
    DEW_USAGE_CHECK(o.ema_decay >= 0 && o.ema_decay < 1,
                    "option 'trainer.ema_decay' must be in [0, 1) (0 = no EMA), got ", o.ema_decay);
    o.ema_warmup = ts.get_bool("ema_warmup", true);
    o.max_streak = ts.get_int("max_nonfinite_streak", 5);
    o.stop_at = ts.get_int("stop_at", o.steps);
    DEW_USAGE_CHECK(o.stop_at > 0 && o.stop_at <= o.steps, "option 'trainer.stop_at' must be in [1, trainer.steps]");
    DEW_USAGE_CHECK(o.grad_accum > 0, "option 'trainer.grad_accum' must be positive");
    DEW_USAGE_CHECK(o.log_every > 0, "option 'trainer.log_every' must be positive");
    DEW_USAGE_CHECK(o.eval_every >= 0 && o.checkpoint_every >= 0,
                    "trainer.eval_every and trainer.checkpoint_every must be >= 0");
    DEW_USAGE_CHECK(o.keep >= 1, "option 'trainer.keep' must be at least 1");
    o.profile_steps = ts.get_int("profile", 0);
    DEW_USAGE_CHECK(o.profile_steps >= 0, "option 'trainer.profile' must be >= 0 updates (0 = off)");
    o.recompute = recompute_from_name(ts.get_string("recompute", "none"));
    const std::string weighting = ts.get_string("loss_weighting", "micro_batch");
    DEW_USAGE_CHECK(weighting == "micro_batch" || weighting == "token", "option 'trainer.loss_weighting' = '",
                    weighting, "' is not one of micro_batch, token");
    o.token_weighted = weighting == "token";
    o.watch = read_watch_options(ts);
    return o;
  }
};

// One update's outcome, as the log and the loop see it.
struct UpdateResult {
  bool applied = false;  // false: skipped by the non-finite guard
  double loss = 0, grad_norm = 0, lr = 0, seconds = 0, sync_ms = 0;
  int64_t samples = 0, tokens = 0;
  std::map<std::string, double> metrics;
};

// Sums over the updates of one log interval.
struct MetricsWindow {
  double time = 0, loss = 0, sync_ms = 0;
  int64_t samples = 0, tokens = 0, n = 0;
  std::map<std::string, double> metrics;
  void add(const UpdateResult& u) {
    time += u.seconds;
    loss += u.loss;
    samples += u.samples;
    tokens += u.tokens;
    sync_ms += u.sync_ms;
    ++n;
    for (const auto& [k, v] : u.metrics) metrics[k] += v;
  }
};

// ---- stage: QK-Clip (muonclip) ----
// The recorder every trained attention block reports to during the update's forwards; the blocks it saw
// (sites) are matched to the trained parameters once (a frozen copy, e.g. DPO's reference model, records
// no gradients and is never a site) and checked (no q/k norm) when first seen, before any update.
class QkClipStage {
 public:
  // params: every trained parameter (which blocks are sites); owned: those this rank updates (and rescales).
  QkClipStage(double tau, const NamedTensors& params, const NamedTensors& owned)
      : tau_(tau), params_(params), owned_(owned) {}
  bool on() const { return tau_ > 0; }
  MaxLogitRecorder* recorder() { return on() ? &recorder_ : nullptr; }

  // Appends the recorded [Hq] max logits (f32) to the update's transfer; remembers which were read.
  void append(std::vector<Tensor>& on_device) {
    read_.clear();
    const auto& sites = recorder_.sites();
    for (size_t i = 0; i < sites.size(); ++i) {
      if (i >= trained_.size()) trained_.push_back(check_site(*sites[i].attention));
      const Tensor& m = sites[i].max_logit;
      if (!trained_[i] || !m.defined()) continue;
      on_device.push_back(reshape(m.dtype() == DType::f32 ? m : cast(m, DType::f32), {m.numel()}));
      read_.push_back(i);
    }
  }
  // After the optimizer's update: the rescale, from the values read (host[at...]); the metrics.
  void apply(const std::vector<double>& values, std::map<std::string, double>& metrics) {
    size_t at = 0;
    double largest = -INFINITY;
    int64_t clipped = 0;
    for (size_t i : read_) {
      const nn::Attention& a = *recorder_.sites()[i].attention;
      const std::vector<double> head(values.begin() + long(at), values.begin() + long(at) + a.cfg.num_heads);
      at += size_t(a.cfg.num_heads);
      for (double v : head) largest = std::max(largest, v);
      clipped += qk_clip(a, head, tau_, [this](const Tensor& t) {
        for (const auto& [name, o] : owned_)
          if (o.same(t)) return true;
        return false;
      });
    }
    if (!read_.empty()) {
      metrics["max_logit"] = largest;
      metrics["qk_clipped"] = double(clipped);
    }
    recorder_.reset();
  }
  void discard() { recorder_.reset(); }

 private:
  bool check_site(const nn::Attention& a) const {
    const Tensor& w = a.qkv ? a.qkv->weight : a.q_proj->weight;
    for (const auto& [name, t] : params_)
      if (t.same(w)) {
        DEW_USAGE_CHECK(!a.q_norm, "optim.name = muonclip: attention block '", name,
                        "' has q/k norm, which undoes QK-Clip's rescaled projections; use optim.name = muon");
        return true;
      }
    return false;  // not trained by this run
  }
  double tau_;
  const NamedTensors params_, owned_;
  MaxLogitRecorder recorder_;
  std::vector<bool> trained_;  // per site
  std::vector<size_t> read_;   // the sites read in this update, in order
};

class Trainer {
 public:
  Trainer(Config& config, const TrainOptions& options);
  int run();

 private:
  void resume();
  void start();
  UpdateResult one_update();
  bool scaling_loss() const { return run_.precision == Precision::f16_mixed; }
  double loss_scale() const { return scaling_loss() ? st_.loss_scale.scale() : 1.0; }
  void log_update(const UpdateResult& u);
  bool validate();  // true: a new best primary metric
  std::map<std::string, double> sum_over_ranks(const std::map<std::string, double>& sums);
  void save(bool best);
  void save_sharded(const std::string& path);

  Config& config_;
  const TrainOptions& options_;
  TrainerOptions o_;
  std::string run_dir_;
  fs::path ckpt_dir_;
  std::string latest_;  // the latest checkpoint; resume() picks the one to continue from (--step)
  std::vector<std::string> newer_;  // --resume --step N: the later checkpoints, set aside by start()
  Run run_;
  ProfilingBackend* profiler_ = nullptr;
  std::unique_ptr<dist::DataParallel> dp_;
  bool leader_ = true;
  double clip_ = 0;
  std::shared_ptr<Optimizer> optimizer_;
  std::unique_ptr<QkClipStage> qk_clip_;
  std::function<double(int64_t)> schedule_;
  std::unique_ptr<Ema> ema_;
  NamedTensors ema_params_;
  std::shared_ptr<spdlog::logger> log_;
  std::unique_ptr<MetricsLog> metrics_;
  std::shared_ptr<RunWatchers> watch_;  // TensorBoard event files and the HTML report (a metrics sink)
  std::unique_ptr<DataLoader> val_loader_;
  RunCounters st_;
  MetricsWindow window_;
  bool dist_stop_ = false;  // an interrupt seen by any rank, agreed on at the end of each update
  bool tty_ = false;
  double peak_ = 0, flops_per_sample_ = 0;
  std::chrono::steady_clock::time_point run_start_;
  int64_t start_updates_ = 0, profiled_ = 0;
  double profiled_seconds_ = 0;
  // Memory accounting: the training state this rank holds, measured once (the first update's gradients in
  // place, before the optimizer step) and written into the first logged line of this process.
  std::optional<TrainingStateMemory> state_memory_;
  bool state_memory_logged_ = false;
  bool recompute_reported_ = false;  // the first update has said what recompute = blocks did
  static constexpr int64_t kProfileWarmup = 3;
};

// ---- stage: building the run ----
Trainer::Trainer(Config& config, const TrainOptions& options)
    : config_(config), options_(options), o_(TrainerOptions::read(config.section("trainer"))) {
  run_dir_ = options.run_dir;
  if (run_dir_.empty()) run_dir_ = (fs::path("runs") / config.section("run").get_string("name", "run")).string();
  ckpt_dir_ = fs::path(run_dir_) / "checkpoints";
  latest_ = find_latest_checkpoint(ckpt_dir_.string());
  DEW_USAGE_CHECK(options.resume || latest_.empty(), "run directory '", run_dir_,
                  "' already holds checkpoints; pass --resume to continue it or choose another --run-dir");
  DEW_USAGE_CHECK(!options.resume || !latest_.empty(), "--resume: no checkpoint to resume in '", ckpt_dir_.string(),
                  "'");
  DEW_USAGE_CHECK(options.resume || options.step.empty(), "--step ", options.step, " needs --resume");

  run_ = build_run(config, options.backend_name, true, o_.profile_steps > 0);
  DEW_USAGE_CHECK(!o_.token_weighted || run_.objective->loss_is_token_mean(), "trainer.loss_weighting = token: the ",
                  config.section("objective").get_string("plugin", "?"),
                  " objective's loss is not a mean over tokens (token weighting is for lm, and grpo with loss_type = "
                  "bnpo); use micro_batch");
  if (scaling_loss()) st_.loss_scale = DynamicLossScale(run_.loss_scale);
  profiler_ = dynamic_cast<ProfilingBackend*>(run_.backend.get());
  // Fine-tuning starts from init_from's weights (before the EMA copies): every parameter but the LoRA adapters,
  // which keep their start (B = 0: the adapted model is the loaded one).
  if (!o_.init_from.empty() && !options.resume) {
    NamedTensors targets;
    for (const auto& [n, t] : run_.all_params())
      if (!is_lora_parameter(n)) targets.emplace_back(n, t);
    load_weights(o_.init_from, targets);
  }
  leader_ = run_.rank == 0;
  dp_ = std::make_unique<dist::DataParallel>(run_.comm, run_.params, run_.bucket_mb,
                                             dist::shard_mode_from_name(run_.shard), run_.shard_prefetch);
  // Sharded runs: this rank's optimizer and EMA cover the parameters it owns (dist/data_parallel.hpp).
  const NamedTensors optimized = dp_->owned(run_.params);
  DEW_USAGE_CHECK(!optimized.empty(), "run.shard = ", run_.shard, ": rank ", run_.rank, " of ", run_.world,
                  " owns none of the ", run_.params.size(), " parameters; use fewer ranks or run.shard = none");

  Options& optim_section = config.section("optim");
  const double lr = optim_section.get_double("lr", 1e-3);
  clip_ = optim_section.get_double("clip_grad_norm", 0.0);
  DEW_USAGE_CHECK(lr > 0, "option 'optim.lr' must be positive");
  DEW_USAGE_CHECK(clip_ >= 0, "option 'optim.clip_grad_norm' must be >= 0");
  optimizer_ = make_optimizer(optim_section, optimized);
  if (optimizer_->qk_clip_tau() > 0) {  // QK-Clip rescales q / k weights: they must be trained
    bool qk_frozen = !run_.fine_tuning.lora_paths.empty();
    for (const auto& [n, t] : run_.frozen())
      qk_frozen = qk_frozen || matches_any_glob(n, {"*q_proj.weight", "*k_proj.weight", "*qkv.weight"});
    DEW_USAGE_CHECK(!qk_frozen, "optim.name = ", optim_section.get_string("name", ""),
                    ": QK-Clip rescales the attention's q and k weights, which ",
                    run_.fine_tuning.lora_paths.empty() ? "optim.freeze" : "[lora]",
                    " keeps frozen; use muon (or adamw) for fine-tuning");
  }
  // QK-Clip sees every trained block (the same sites on every rank) and rescales the tensors this rank owns.
  qk_clip_ = std::make_unique<QkClipStage>(optimizer_->qk_clip_tau(), run_.params, optimized);
  schedule_ = make_schedule(config.section("schedule"), lr, o_.steps);
  if (o_.ema_decay > 0) {
    ema_params_ = dp_->owned(run_.ema_params());
    ema_ = std::make_unique<Ema>(ema_params_, o_.ema_decay, o_.ema_warmup);
  }
  config.check_all_used();  // every key was read by someone: the rest are typos

  if (leader_) {  // rank 0 alone writes into the run directory
    fs::create_directories(ckpt_dir_);
    remove_stale_temporaries(ckpt_dir_.string());
  }
  log_ = make_run_logger(run_dir_, leader_);
}

// ---- stage: resume ----
// Picks the checkpoint (--step, else the latest), loads weights, EMA, optimizer and objective state, and
// checks the counters and the data position against this run: every step and position must be one this
// config could have reached. Nothing in the run directory changes here (start() writes).
void Trainer::resume() {
  const std::string file = resolve_checkpoint(run_dir_, options_.step.empty() ? "latest" : options_.step, run_.backend);
  const int64_t file_step = checkpoint_step(file);
  {
    std::vector<std::pair<int64_t, std::string>> later;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(ckpt_dir_, ec)) {
      const int64_t s = checkpoint_step(e.path().filename().string());
      if (s > file_step && e.is_regular_file(ec)) later.emplace_back(s, e.path().string());
    }
    std::sort(later.begin(), later.end());
    for (auto& [s, f] : later) newer_.push_back(f);
  }
  CheckpointData c = read_run_checkpoint(file, run_.backend);
  load_into(c.params, "params", run_.all_params());
  // A checkpoint holds every tensor whole (any rank count and shard mode wrote it); a sharded rank takes
  // the entries of its own share, and load_into still reports any of them missing.
  auto share = [this](const NamedTensors& saved, const NamedTensors& mine) {
    if (!dp_->sharded()) return saved;
    std::set<std::string> names;
    for (const auto& [n, t] : mine) names.insert(n);
    NamedTensors out;
    for (const auto& [n, t] : saved)
      if (names.count(n)) out.emplace_back(n, t);
    return out.empty() ? saved : out;  // nothing in common: let load_into list the mismatch
  };
  if (ema_) {
    DEW_CHECK(!c.ema.empty(), "checkpoint ", file, " holds no EMA weights but trainer.ema_decay > 0");
    load_into(share(c.ema, ema_->tensors()), "ema", ema_->tensors());
  }
  for (const auto& [slot, tensors] : optimizer_->state()) {
    auto it = c.optim.find(slot);
    DEW_CHECK(it != c.optim.end(), "checkpoint ", file, " has no optimizer slot '", slot, "' (optimizer ",
              optimizer_->name(), ")");
    load_into(share(it->second, tensors), "optim/" + slot, tensors);
  }
  load_objective_state(c, file, *run_.objective);
  st_.updates = saved_counter(c, file, "updates");
  st_.attempts = saved_counter(c, file, "attempts");
  st_.skipped = saved_counter(c, file, "skipped");
  st_.streak = saved_counter(c, file, "nonfinite_streak");
  if (scaling_loss()) {
    DEW_CHECK(c.state_values.count("loss_scale"), "checkpoint ", file,
              " has no loss scale (state/@loss_scale) but run.precision = f16-mixed; it was written by a run in ",
              "another precision");
    st_.loss_scale.restore(c.state_values.at("loss_scale"), saved_counter(c, file, "loss_scale.good_steps"),
                           saved_counter(c, file, "loss_scale.overflows"));
  }
  const int64_t next = saved_counter(c, file, "data.next");
  DEW_CHECK(st_.updates + st_.skipped == st_.attempts && st_.streak <= st_.skipped, "checkpoint ", file,
            " has inconsistent counters (updates ", st_.updates, " + skipped ", st_.skipped, " != attempts ",
            st_.attempts, ", or a non-finite streak of ", st_.streak, "): damaged or not written by dew's trainer");
  DEW_CHECK(file_step < 0 || st_.updates == file_step, "checkpoint ", file, " holds update ", st_.updates,
            " but its name says step ", file_step);
  DEW_USAGE_CHECK(st_.updates <= o_.steps, "checkpoint ", file, " is at update ", st_.updates,
                  ", past trainer.steps = ", o_.steps, "; raise --trainer.steps to train further");
  const int64_t per_attempt = int64_t(run_.world) * run_.train_loader->config().batch_size * o_.grad_accum;
  DEW_CHECK(next <= st_.attempts * per_attempt, "checkpoint ", file, " has data position ", next, ", more than the ",
            st_.attempts, " attempts x ", per_attempt,
            " records this config reads per attempt could have consumed (damaged, or the batch was larger before)");
  auto order = c.state_text.find("data.order");
  DEW_CHECK(order != c.state_text.end(), "checkpoint ", file, " has no data order state/@data.order");
  if (c.state_values.count("best_metric")) st_.best = c.state_values.at("best_metric");
  st_.best_file = c.state_text.count("best_file") ? c.state_text.at("best_file") : "";
  run_.train_loader->seek(DataPosition{next, order->second});
  latest_ = file;
}

// ---- stage: start (after the checkpoint checks passed: a failed resume leaves config.ini as it was) ----
void Trainer::start() {
  // The run's config as --resume, eval, sample and serve read it, without trainer.stop_at: a pause point belongs to
  // the invocation that asked for it (a resume given none goes on to trainer.steps; kept, it would stop at once).
  Config kept = config_;
  kept.section("trainer").erase("stop_at");
  const std::string config_ini = kept.to_ini();
  if (leader_) {
    std::ofstream cfg(fs::path(run_dir_) / "config.ini", std::ios::trunc);
    cfg << "# effective config of this run (dew " << DEW_SDK_VERSION << ")\n" << config_ini;
    // --resume --step N: the later checkpoints belong to the future this run replaces; kept, renamed aside.
    for (const std::string& f : newer_) {
      fs::rename(f, f + ".discarded");
      log_->info("set aside {} (after the resumed step) as {}.discarded", f, fs::path(f).filename().string());
    }
  }
  if (options_.resume) log_->info("resumed {} at update {} of {}", latest_, st_.updates, o_.steps);
  metrics_ = std::make_unique<MetricsLog>(run_dir_, leader_, options_.resume ? st_.updates : -1);
  watch_ = std::make_shared<RunWatchers>(run_dir_, o_.watch, leader_,
                                         [this](const std::string& m) { log_->warn("{}", m); });
  watch_->start(st_.updates, config_ini);
  if (leader_) metrics_->add_sink(watch_);
  // Every rank starts from rank 0's weights, EMA and optimizer state, at rank 0's position.
  // Sharded: EMA and optimizer state are this rank's own share (zeros or its part of the checkpoint).
  std::vector<NamedTensors> groups{run_.params};
  if (!run_.frozen().empty()) groups.push_back(run_.frozen());
  if (ema_ && !dp_->sharded()) groups.push_back(ema_->tensors());
  if (NamedTensors os = run_.objective->state(); !os.empty()) groups.push_back(os);
  if (!dp_->sharded())
    for (const auto& [slot, tensors] : optimizer_->state()) groups.push_back(tensors);
  dp_->start_from_rank0(groups, {st_.updates, st_.attempts, run_.train_loader->position().next});
  if (ema_ && dp_->sharded() && !options_.resume)  // a fresh EMA starts from rank 0's weights, as they now are
    ema_ = std::make_unique<Ema>(ema_params_, o_.ema_decay, o_.ema_warmup);
  if (dp_->sharded())
    log_->info("sharded data parallel: run.shard = {} over {} ranks (this rank owns {} of {} parameters){}", run_.shard,
               run_.world, dp_->owned(run_.params).size(), run_.params.size(),
               dp_->shards_parameters() ? (dp_->prefetches() ? "; the next block's gather is prefetched"
                                                             : "; no prefetch (run.shard_prefetch = false)")
                                        : "");
  if (dp_->distributed()) {
    const int64_t batch = run_.train_loader->config().batch_size;
    const std::string micro = o_.grad_accum > 1 ? " x " + std::to_string(o_.grad_accum) + " micro-batches" : "";
    log_->info(
        "data parallel: {} ranks x batch {}{} = {} samples per update; gradients {} ({}) in {} buckets of <= {} MiB",
        run_.world, batch, micro, run_.world * batch * o_.grad_accum,
        dp_->reduces_onto_owners() ? "reduce-scattered to their owners" : "all-reduced", run_.comm->name(),
        dp_->num_buckets(), run_.bucket_mb);
    log_->info(shards_validation(run_) ? "validation: each rank scores its share of the split; their sums are added"
                                       : "validation: every rank scores the whole split (this objective's metrics "
                                         "are not sums over records)");
  }

  peak_ = measure_matmul_peak_gflops(run_.backend, compute_dtype(run_.precision));
  run_.backend->reset_memory_peak();  // mem_peak_mb covers the training, not the matmul-rate probe above
  flops_per_sample_ = run_.objective->train_flops_per_sample();
  tty_ = leader_ && isatty(STDERR_FILENO);
  int64_t num_params = 0;
  for (auto& [k, t] : run_.params) num_params += t.numel();
  log_->info("training {} parameters on the {} backend (measured matmul peak {:.0f} GFLOP/s) to update {} -> {}",
             num_params, run_.backend->name(), peak_, o_.steps, run_dir_);
  if (!run_.frozen().empty()) {
    int64_t frozen = 0;
    for (auto& [k, t] : run_.frozen()) frozen += t.numel();
    const FineTuning& ft = run_.fine_tuning;
    const std::string what = ft.lora_paths.empty()
                                 ? std::string("optim.freeze")
                                 : "LoRA rank " + std::to_string(ft.lora.rank) + " (scale " +
                                       json_number(ft.lora.scale()) +
                                       (ft.lora.dropout > 0 ? fmt::format(", dropout {:g}", ft.lora.dropout) : "") +
                                       ") on " + std::to_string(ft.lora_paths.size()) + " linear layers";
    log_->info("fine-tuning: {}: {} of {} parameters trained ({:.2f} %), {} frozen", what, num_params,
               num_params + frozen, 100.0 * double(num_params) / double(num_params + frozen), frozen);
    if (!run_.fine_tuning.lora_paths.empty() && o_.init_from.empty() && !options_.resume)
      log_->warn("[lora] without trainer.init_from: the adapters train on top of randomly initialised weights");
  }
  if (run_.precision != Precision::f32)
    log_->info("precision = {}: {} activations and matmul operands, f32 master weights, optimizer state and loss{}",
               precision_name(run_.precision), dtype_name(compute_dtype(run_.precision)),
               scaling_loss() ? " (dynamic loss scale from " + json_number(loss_scale()) + ")" : std::string());
  if (!run_.matmul_precision.empty())
    log_->info("matmul_precision = {} (a permission: cuda and cpu take it where the hardware has the mode)",
               run_.matmul_precision);
  // dew-run's OpenMP choice when it made one (tools/dew-run/openmp_setup.hpp sets DEW_OPENMP_CHOICE).
  if (const char* omp = std::getenv("DEW_OPENMP_CHOICE"); omp && *omp && run_.backend->name() == "cpu")
    log_->info("openmp: {} (run.threads, when set, overrides the count)", omp);
  dp_->release_parameters();  // shard = parameters: from here on a rank keeps only its own parameters
}

// ---- stage: one update ----
UpdateResult Trainer::one_update() {
  UpdateResult u;
  RecomputeGuard recompute(o_.recompute);  // the backbones' blocks ask recompute_block() during the steps
  const int64_t recomputed_before = recomputed_blocks();
  const auto t0 = std::chrono::steady_clock::now();
  const int64_t accum = o_.grad_accum;
  std::vector<Tensor> on_device;  // [micro losses..., device metrics..., device tokens..., grad sums of squares...]
  std::vector<std::vector<std::string>> device_keys(size_t(o_.grad_accum));  // per micro-batch
  std::vector<int> has_device_tokens;
  std::vector<int64_t> micro_host_tokens;  // each micro-batch's host-counted tokens (0 where on the device)
  auto one = [](const Tensor& t) { return reshape(t.dtype() == DType::f32 ? t.detach() : cast(t.detach(), DType::f32), {1}); };
  // shard = parameters: each micro-batch gathers the parameters outside blocks at its start, each block's
  // come around its forward and backward (dew/block_params.hpp), and all are released after its backward.
  BlockParameterHooksGuard block_hooks(dp_->block_hooks());
  for (int64_t micro = 0; micro < accum; ++micro) {
    // The stream index of this rank's first row (see dew/data.hpp), read before next() advances it.
    const int64_t position = run_.train_loader->position().next + int64_t(run_.rank) * run_.train_loader->config().batch_size;
    Batch batch = to_device(run_.train_loader->next(), run_.backend);
    dp_->gather_parameters(false);
    StepResult r;
    {
      AutocastGuard autocast(compute_dtype(run_.precision));  // the forward and the loss (dew/autocast.hpp)
      MaxLogitRecorder::Scope record_max_logits(qk_clip_->recorder());  // null (nothing recorded) unless muonclip
      const StepInfo info{st_.updates, micro, run_.seed, position};
      // The main model's dropout key (a backbone's dropout, LoRA's): the run seed and this micro-batch.
      if (Model* m = run_.objective->main_model()) m->set_random_key(info.random_key());
      r = run_.objective->step(batch, info);
    }
    u.samples += r.samples;
    for (const auto& [k, v] : r.metrics) u.metrics[k] += v / double(accum);
    {
      NoGradGuard no_grad;
      on_device.push_back(one(r.loss));
      for (const auto& [k, t] : r.device_metrics) {
        device_keys[size_t(micro)].push_back(k);
        on_device.push_back(one(t));
      }
      if (r.device_tokens.defined()) on_device.push_back(one(r.device_tokens));
      has_device_tokens.push_back(r.device_tokens.defined() ? 1 : 0);
      micro_host_tokens.push_back(r.device_tokens.defined() ? 0 : r.tokens);
    }
    // Every micro-batch runs its backward (a non-finite loss is found at the update's one transfer and
    // skips the whole update; data-parallel collectives must match on every rank anyway).
    // f16-mixed: the loss times the dynamic loss scale (in f32), divided out of the gradients below.
    Tensor loss = r.loss.dtype() == DType::f32 || r.loss.dtype() == DType::f64 ? r.loss : cast(r.loss, DType::f32);
    // loss_weighting = token: this micro-batch's loss times its token count (the sum over its tokens); the gradients
    // are divided by the update's count once it is known (token_factor below).
    if (o_.token_weighted) {
      Tensor n = r.device_tokens.defined() ? one(r.device_tokens)
                                           : Tensor::full({1}, double(r.tokens), DType::f32, loss.backend_ptr());
      if (n.dtype() != loss.dtype()) n = cast(n.detach(), loss.dtype());
      loss = mul(reshape(loss, {1}), n.detach());
    }
    const float factor = float(loss_scale()) / float(o_.token_weighted ? 1 : accum);
    dp_->backward(factor == 1.0f ? loss : scale(loss, factor), micro == accum - 1);
    if (micro < accum - 1) dp_->release_parameters();
  }
  dp_->finish_sync();
  if (o_.recompute == Recompute::blocks && !recompute_reported_) {  // once: what recompute = blocks did
    recompute_reported_ = true;
    const int64_t n = recomputed_blocks() - recomputed_before;
    if (n > 0)
      log_->info("recompute = blocks: each micro-batch recomputes {} block forwards in its backward", n / accum);
    else
      log_->warn("recompute = blocks, but the model ({}) has no block that recomputes: nothing is recomputed",
                 config_.section("model").get_string("plugin", "?"));
  }
  dp_->release_parameters();  // shard = parameters: the optimizer updates only this rank's own
  if (!state_memory_)  // every gradient of the update exists now (sharded or not: what this rank holds)
    state_memory_ = training_state_memory(run_.all_params(), optimizer_.get(), ema_ ? ema_->tensors() : NamedTensors{});
  // The update's one host transfer: [micro losses, metrics, tokens (one value each) | QK-Clip's max logits
  // (Hq values per block) | gradient sums of squares].
  const size_t qk_at = on_device.size();
  qk_clip_->append(on_device);
  size_t head = qk_at;  // in values: where the gradient sums start
  for (size_t i = qk_at; i < on_device.size(); ++i) head += size_t(on_device[i].numel());
  std::vector<size_t> with_grad;
  {
    NoGradGuard no_grad;
    std::vector<Tensor> grads;
    for (size_t i = 0; i < run_.params.size(); ++i)
      if (Tensor g = run_.params[i].second.grad(); g.defined()) {
        grads.push_back(g);
        with_grad.push_back(i);
      }
    if (!grads.empty()) {  // one tensor for all of them (concat copies each of its inputs once)
      const Tensor sq = sum_squares_each(grads);
      on_device.push_back(sq.dtype() == DType::f32 ? sq : cast(sq, DType::f32));
    }
  }
  const std::vector<double> host = concat(on_device, 0).to_doubles();
  // Sharded runs: each rank has the squares of its own parameters' gradients; they travel with the
  // summed figures below, one slot per parameter (zeros elsewhere), and are added in parameter order as
  // in an unsharded run, so the global norm (and the clip factor) is the same to the bit.
  std::vector<double> param_sq;
  if (dp_->reduces_onto_owners()) {
    param_sq.assign(run_.params.size(), 0.0);
    for (size_t j = 0; j < with_grad.size(); ++j) param_sq[with_grad[j]] = host[head + j];
  }
  size_t at = 0;
  double gsq = 0;
  for (int64_t micro = 0; micro < accum; ++micro) {
    const double loss_m = host[at++];
    for (const std::string& k : device_keys[size_t(micro)]) u.metrics[k] += host[at++] / double(accum);
    const int64_t n_m = has_device_tokens[size_t(micro)] ? int64_t(host[at++]) : micro_host_tokens[size_t(micro)];
    u.tokens += n_m;
    u.loss += o_.token_weighted ? loss_m * double(n_m) : loss_m / double(accum);  // token: the sum, divided below
  }
  for (size_t i = head; i < host.size(); ++i) gsq += host[i];
  std::vector<double> qk_values(host.begin() + long(qk_at), host.begin() + long(head));
  bool finite = std::isfinite(u.loss);
  if (dp_->distributed()) {  // the logged figures cover the global batch
    std::vector<double> v = {u.loss, double(u.samples), double(u.tokens), finite ? 0.0 : 1.0,
                             g_interrupts > 0 ? 1.0 : 0.0};
    for (const auto& [k, x] : u.metrics) v.push_back(x);
    const size_t sq_at = v.size();
    v.insert(v.end(), param_sq.begin(), param_sq.end());
    dp_->sum(v);
    if (!param_sq.empty()) {
      gsq = 0;
      for (size_t k = 0; k < param_sq.size(); ++k) gsq += v[sq_at + k];
    }
    u.loss = o_.token_weighted ? v[0] : v[0] / double(run_.world);
    u.samples = int64_t(v[1]);
    u.tokens = int64_t(v[2]);
    finite = v[3] == 0.0 && std::isfinite(u.loss);
    dist_stop_ = v[4] > 0.0;
    size_t i = 5;
    for (auto& [k, x] : u.metrics) x = v[i++] / double(run_.world);
    u.sync_ms = dp_->take_sync_ms();
    if (!qk_values.empty()) {  // every rank applies the same clip: the max over the ranks, by a sum of slots
      const size_t n = qk_values.size();
      std::vector<double> slots(n * size_t(run_.world), 0.0);
      std::copy(qk_values.begin(), qk_values.end(), slots.begin() + long(n * size_t(run_.rank)));
      dp_->sum(slots);
      for (size_t i = 0; i < n; ++i)
        for (int r = 0; r < run_.world; ++r) qk_values[i] = std::max(qk_values[i], slots[size_t(r) * n + i]);
    }
  }
  // loss_weighting = token: the gradients hold sum_m n_m grad(loss_m), averaged over the ranks; the update's is that
  // times world / (the update's tokens, every rank's), and so is its norm. No token counted: nothing to learn from.
  double token_factor = 1.0;
  if (o_.token_weighted) {
    u.loss = u.tokens > 0 ? u.loss / double(u.tokens) : 0.0;
    token_factor = u.tokens > 0 ? double(run_.world) / double(u.tokens) : 0.0;
    gsq *= token_factor * token_factor;
  }
  // The unscaled gradients' norm (f16-mixed: the sums of squares are of loss_scale * g), here after a sharded run
  // summed its ranks' squares above, so every path divides once.
  gsq /= loss_scale() * loss_scale();
  ++st_.attempts;
  u.grad_norm = finite ? std::sqrt(gsq) : NAN;
  if (finite && !std::isfinite(u.grad_norm) && scaling_loss()) {  // an f16 overflow: back off, no streak
    for (auto& [k, p] : run_.params) p.zero_grad();
    qk_clip_->discard();
    ++st_.skipped;
    const double was = loss_scale();
    DEW_CHECK_HINT(st_.loss_scale.update(false), "check the data and optim.lr, or train in bf16-mixed",
                   "stopping: the f16 loss scale fell to ", st_.loss_scale.scale(), " at update ", st_.updates + 1,
                   " and the gradients still overflow");
    log_->info("update {}: f16 gradients overflowed at loss scale {}; skipped, scale now {} ({} overflows)",
               st_.updates + 1, was, loss_scale(), st_.loss_scale.overflows());
    return u;
  }
  if (o_.token_weighted && u.tokens == 0 && finite) {  // every micro-batch counted no token: skipped, not applied
    for (auto& [k, p] : run_.params) p.zero_grad();
    qk_clip_->discard();
    ++st_.skipped;
    ++st_.streak;
    log_->warn("update {}: no token counted (trainer.loss_weighting = token); skipped ({} in a row)", st_.updates + 1,
               st_.streak);
    DEW_CHECK_HINT(st_.streak < o_.max_streak, "check that the data leaves tokens to train on (loss masks, truncation)",
                   "stopping: ", st_.streak, " updates in a row counted no token");
    return u;
  }
  if (!finite || !std::isfinite(u.grad_norm)) {
    for (auto& [k, p] : run_.params) p.zero_grad();
    qk_clip_->discard();
    ++st_.skipped;
    ++st_.streak;
    log_->warn("update {}: non-finite {} ({}); skipped ({} in a row, {} in total)", st_.updates + 1,
               finite ? "gradient norm" : "loss", finite ? json_number(u.grad_norm) : json_number(u.loss), st_.streak,
               st_.skipped);
    DEW_CHECK_HINT(st_.streak < o_.max_streak, "lower optim.lr, set optim.clip_grad_norm, or check the data",
                   "stopping: ", st_.streak, " non-finite updates in a row at update ", st_.updates + 1);
    return u;
  }
  st_.streak = 0;
  const double clip_factor = clip_ > 0 && u.grad_norm > clip_ ? clip_ / (u.grad_norm + 1e-6) : 1.0;
  // 1 / scale unscales f16-mixed gradients; token_factor turns token-weighted sums into the update's token mean
  const float grad_scale = float(clip_factor * token_factor / loss_scale());
  u.lr = schedule_(st_.updates);
  optimizer_->update(float(u.lr), grad_scale, st_.updates + 1);
  if (qk_clip_->on()) qk_clip_->apply(qk_values, u.metrics);
  for (auto& [k, p] : run_.params) p.zero_grad();
  dp_->distribute_parameters();  // shard = optimizer / gradients: every rank takes the owners' new values
  ++st_.updates;
  if (scaling_loss()) st_.loss_scale.update(true);
  if (ema_) ema_->update(ema_params_, st_.updates);
  {
    NoGradGuard no_grad;
    // An objective with state of its own (JEPA's target encoder) reads the whole model after the update.
    const bool whole = dp_->shards_parameters() && !run_.objective->state().empty();
    if (whole) dp_->gather_parameters(true);
    run_.objective->after_update(StepInfo{st_.updates, 0, run_.seed});
    if (whole) dp_->release_parameters();
  }
  run_.backend->synchronize();
  u.applied = true;
  u.seconds = seconds_since(t0);
  return u;
}

// ---- stage: logging ----
void Trainer::log_update(const UpdateResult& u) {
  window_.add(u);
  if (st_.updates % o_.log_every != 0 && st_.updates != o_.stop_at) return;
  const MetricsWindow& w = window_;
  const double n = double(w.n);
  const double sps = double(w.samples) / w.time, tps = double(w.tokens) / w.time;
  const double mfu = flops_per_sample_ > 0 ? flops_per_sample_ * sps * 1e-9 / (peak_ * run_.world) : 0.0;
  MetricsLine line;
  line.step = st_.updates;
  line.add("loss", w.loss / n);
  line.add("lr", u.lr);
  line.add("grad_norm", u.grad_norm);
  line.add("step_time_ms", w.time / n * 1e3);
  line.add("samples_per_sec", sps);
  if (w.tokens > 0) line.add("tokens_per_sec", tps);
  line.add("mfu", mfu);
  line.add("skipped", double(st_.skipped));
  if (scaling_loss()) {
    line.add("loss_scale", loss_scale());
    line.add("overflows", double(st_.loss_scale.overflows()));
  }
  line.add("rss_mb", resident_memory_mb());
  if (state_memory_ && !state_memory_logged_) {  // once per process: the training state this rank holds
    line.add("mem_params_mb", mebibytes(state_memory_->params));
    line.add("mem_grads_mb", mebibytes(state_memory_->grads));
    line.add("mem_optim_mb", mebibytes(state_memory_->optim));
    state_memory_logged_ = true;
  }
  if (const MemoryStats mem = run_.backend->memory_stats(); mem.tracked)
    line.add("mem_peak_mb", mebibytes(mem.peak));  // the backend's high-water mark so far
  if (dp_->distributed()) line.add("allreduce_ms", w.sync_ms / n);
  if (dp_->shards_parameters()) {  // block gathers so far (dist/data_parallel.hpp GatherStats), the same on every rank
    const dist::DataParallel::GatherStats& g = dp_->gather_stats();
    line.add("gathers_prefetched", double(g.prefetched));
    line.add("gathers_blocking", double(g.blocking));
  }
  for (const auto& [k, v] : w.metrics) line.add(k, v / n);
  metrics_->write(line);
  const double eta = seconds_since(run_start_) / double(st_.updates - start_updates_) * double(o_.steps - st_.updates);
  char text[512];
  std::snprintf(text, sizeof text, "step %lld/%lld  loss %.4f  lr %.2e  %.0f samples/s%s  ETA %s",
                (long long)st_.updates, (long long)o_.steps, w.loss / n, u.lr, sps,
                w.metrics.count("accuracy")
                    ? ("  acc " + std::to_string(int(100 * w.metrics.at("accuracy") / n)) + "%").c_str()
                    : "",
                format_duration(eta).c_str());
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", text);
    std::fflush(stderr);
  } else {
    log_->info("{}", text);
  }
  window_ = MetricsWindow{};
}

// ---- stage: validation ----
// Sharded validation: the ranks' sums added and turned into the objective's metrics. The ranks first
// add a hash of their key names and their count, so ranks that disagree on the keys all stop with the
// same error instead of adding unlike values (or waiting on a collective of another length).
std::map<std::string, double> Trainer::sum_over_ranks(const std::map<std::string, double>& sums) {
  std::string names;
  for (const auto& [key, value] : sums) names += key + "\n";
  const uint32_t hash = uint32_t(philox::stream_of(names.c_str()));  // 32 bits: world x hash stays exact in a double
  std::vector<double> shape{double(hash), double(sums.size())};
  dp_->sum(shape);
  DEW_CHECK(shape[0] == double(hash) * run_.world && shape[1] == double(sums.size()) * run_.world,
            "sharded validation: the ranks' objectives returned different sums (", sums.size(), " keys on rank ",
            run_.rank, ")");
  std::vector<double> values;
  for (const auto& [key, value] : sums) values.push_back(value);
  dp_->sum(values);
  std::map<std::string, double> total;
  size_t i = 0;
  for (const auto& [key, value] : sums) total[key] = values[i++];
  return run_.objective->validation_metrics(total);
}

bool Trainer::validate() {
  if (!val_loader_) val_loader_ = make_validation_loader(config_, run_);
  val_loader_->seek(DataPosition{0, val_loader_->position().order});
  // Sharded: the EMA swap covers this rank's own parameters; the others come from their owners
  // (gathered whole under shard = parameters, released again after).
  auto whole_model = [this] {
    if (dp_->shards_parameters()) dp_->gather_parameters(true);
    else if (ema_) dp_->distribute_parameters();
  };
  auto after_validation = [this] {
    if (dp_->shards_parameters()) dp_->release_parameters();
    else if (ema_) dp_->distribute_parameters();
  };
  if (ema_) ema_->swap_into(ema_params_);
  whole_model();
  ValidationResult vr;
  try {
    AutocastGuard autocast(compute_dtype(run_.precision));
    vr = run_.objective->validate(*val_loader_, StepInfo{st_.updates, 0, run_.seed});
  } catch (...) {
    if (ema_) ema_->swap_into(ema_params_);
    throw;
  }
  if (ema_) ema_->swap_into(ema_params_);
  after_validation();
  if (shards_validation(run_)) vr.metrics = sum_over_ranks(vr.sums);
  if (leader_)
    for (const Artifact& a : vr.artifacts) {
      fs::create_directories(fs::path(run_dir_) / "samples");
      std::ofstream f(fs::path(run_dir_) / "samples" / a.file_name, std::ios::binary | std::ios::trunc);
      f.write(reinterpret_cast<const char*>(a.bytes.data()), std::streamsize(a.bytes.size()));
    }
  watch_->on_artifacts(st_.updates, vr.artifacts);
  MetricsLine line;
  line.step = st_.updates;
  std::string text;
  for (const auto& [k, v] : vr.metrics) {
    line.add("val/" + k, v);
    text += "  val " + k + " " + std::to_string(v);
  }
  metrics_->write(line);
  if (tty_) std::fputc('\n', stderr);
  log_->info("step {}:{}", st_.updates, text);
  const std::string key = run_.objective->primary_metric();
  auto it = vr.metrics.find(key);
  if (it == vr.metrics.end()) return false;
  const double v = it->second;
  const bool better = std::isnan(st_.best) || (run_.objective->higher_is_better() ? v > st_.best : v < st_.best);
  if (better) st_.best = v;
  return better;
}

// ---- stage: checkpoints ----
void Trainer::save(bool best) {
  const std::string name = checkpoint_name(st_.updates);
  if (best) st_.best_file = name;
  if (dp_->sharded()) {
    save_sharded((ckpt_dir_ / name).string());
  } else {
    if (!leader_) return;  // rank 0 writes the checkpoints
    write_checkpoint((ckpt_dir_ / name).string(),
                     make_checkpoint(config_, run_, optimizer_.get(), ema_.get(), st_, run_.train_loader->position()));
  }
  if (leader_) prune_checkpoints(ckpt_dir_.string(), int(o_.keep), st_.best_file);
}

// A sharded run's checkpoint: the same file as an unsharded run's (every tensor whole, by name), written
// by rank 0 one tensor at a time. The ranks first agree on the full list (each one's EMA and optimizer
// entries, exchanged with all_gather), then walk it in write order: a tensor rank 0 does not hold is
// broadcast by its owner just before rank 0 writes it and dropped after, so no rank ever holds more
// than its share plus one tensor. The file goes to its name only when complete (write_checkpoint), so a
// rank killed mid-save leaves the previous checkpoint as the latest.
void Trainer::save_sharded(const std::string& path) {
  Communicator& comm = dp_->comm();
  const int me = run_.rank;
  CheckpointData c = make_checkpoint(config_, run_, optimizer_.get(), ema_.get(), st_, run_.train_loader->position());
  // This rank's sharded entries, one line each: group \t name \t dtype \t dims...
  std::ostringstream mine;
  auto describe = [&](const std::string& group, const NamedTensors& ts) {
    for (const auto& [n, t] : ts) {
      mine << group << '\t' << n << '\t' << dtype_name(t.dtype());
      for (int64_t d : t.shape()) mine << '\t' << d;
      mine << '\n';
    }
  };
  describe("ema", c.ema);
  for (const auto& [slot, ts] : c.optim) describe("optim/" + slot, ts);
  const std::string text = mine.str();
  const BackendPtr host = run_.backend;
  Tensor len = Tensor::from_host(std::vector<int64_t>{int64_t(text.size())}.data(), {1}, DType::i64, host);
  Tensor lens = Tensor::zeros({int64_t(run_.world)}, DType::i64, host);
  comm.all_gather(len, lens);
  std::vector<int64_t> counts(size_t(run_.world));
  lens.copy_to_host(counts.data());
  int64_t total = 0;
  for (int64_t n : counts) total += n;
  Tensor bytes = Tensor::from_host(text.data(), {int64_t(text.size())}, DType::u8, host);
  Tensor all = Tensor::zeros({total}, DType::u8, host);
  comm.all_gather_async(bytes, all, counts)->wait();
  std::string every(size_t(total), '\0');
  all.copy_to_host(every.data());

  // The full lists in rank order (contiguous ownership: parameter order), own tensors or placeholders.
  std::map<std::string, int> owner_of;  // "group/name" -> the rank that holds it
  std::map<std::string, Tensor> own;
  for (const auto& [n, t] : c.ema) own["ema/" + n] = t;
  for (const auto& [slot, ts] : c.optim)
    for (const auto& [n, t] : ts) own["optim/" + slot + "/" + n] = t;
  NamedTensors ema;
  std::map<std::string, NamedTensors> optim;
  size_t at = 0;
  for (int r = 0; r < run_.world; ++r) {
    std::istringstream in(every.substr(at, size_t(counts[size_t(r)])));
    at += size_t(counts[size_t(r)]);
    for (std::string line; std::getline(in, line);) {
      std::istringstream f(line);
      std::string group, name, dt, d;
      std::getline(f, group, '\t');
      std::getline(f, name, '\t');
      std::getline(f, dt, '\t');
      Shape shape;
      while (std::getline(f, d, '\t')) shape.push_back(std::stoll(d));
      const DType dtype = dtype_from_name(dt);
      const std::string where = group + "/" + name;
      owner_of[where] = r;
      Tensor t = r == me ? own.at(where) : checkpoint_placeholder(shape, dtype);
      if (group == "ema") ema.emplace_back(name, t);
      else optim[group.substr(6)].emplace_back(name, t);
    }
  }
  c.ema = ema;
  c.optim = optim;
  if (dp_->shard() == dist::ShardMode::parameters)  // parameters live with their owners too
    for (size_t k = 0; k < run_.params.size(); ++k) owner_of["params/" + run_.params[k].first] = dp_->owner(k);
  const bool slow = std::getenv("DEW_TEST_SLOW_SAVE") != nullptr;  // tests/dist/sharded.sh kills a rank mid-save
  c.fetch = [&](const std::string& where, const Tensor& listed) -> Tensor {
    auto it = owner_of.find(where);
    const int o = it == owner_of.end() ? 0 : it->second;  // not sharded: rank 0 holds it
    if (slow) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (o == 0) return listed;
    if (o == me) {
      Tensor t = listed;
      comm.broadcast(t, o);
      return listed;
    }
    Tensor t = Tensor::empty(listed.shape(), listed.dtype(), host);
    comm.broadcast(t, o);
    return t;
  };
  if (leader_) {
    write_checkpoint(path, c);
  } else {
    for_each_checkpoint_tensor(c, [&](const std::string& where, const Tensor& t) { c.fetch(where, t); });
  }
  comm.barrier();  // the file is complete before any rank goes on (the next save, the end of the job)
}

// ---- the loop ----
int Trainer::run() {
  if (options_.resume) resume();
  val_loader_ = validate_before_training(config_, run_);  // what later stages read, before the first update
  start();
  g_interrupts = 0;
  auto previous_handler = std::signal(SIGINT, on_interrupt);
  // One process: SIGTERM (what systemd, docker stop and Slurm's preemption send first) pauses like Ctrl-C. Ranks
  // keep its default: mpirun sends it for Ctrl-C and after a peer died, and ends them at once.
  auto previous_term = dp_->distributed() ? SIG_DFL : std::signal(SIGTERM, on_interrupt);
  // mpirun turns Ctrl-C into SIGTERM for the ranks (no checkpoint) but forwards SIGUSR1, so
  // `kill -USR1 <mpirun pid>` pauses a data-parallel run with a checkpoint, like Ctrl-C in one process.
  auto previous_usr1 = dp_->distributed() ? std::signal(SIGUSR1, on_interrupt) : SIG_DFL;
  run_start_ = std::chrono::steady_clock::now();
  start_updates_ = st_.updates;
  int exit_code = 0;
  while (st_.updates < o_.stop_at) {
    if (dp_->distributed() ? dist_stop_ : g_interrupts > 0) {  // ranks stop at the same update
      if (tty_) std::fputc('\n', stderr);
      save(false);
      dp_->barrier();  // exit status 130 makes mpirun end the job: not before rank 0 has saved
      log_->info("interrupted: saved {} at update {}; resume with --resume", checkpoint_name(st_.updates),
                 st_.updates);
      exit_code = 130;
      break;
    }
    // Profiling covers whole updates only (validation and checkpoints stay out of it).
    const bool profiling =
        profiler_ && profiled_ < o_.profile_steps && st_.updates - start_updates_ >= kProfileWarmup;
    if (profiling) profiled_ == 0 ? profiler_->start() : profiler_->resume();
    const UpdateResult u = one_update();
    if (!u.applied) continue;
    if (profiling) {
      profiler_->stop();
      profiled_seconds_ += u.seconds;
      if (++profiled_ == o_.profile_steps) {
        const std::string table = profiler_->report(profiled_, profiled_seconds_ / double(profiled_) * 1e3);
        if (tty_) std::fputc('\n', stderr);
        std::istringstream lines(table);
        for (std::string l; std::getline(lines, l);) log_->info("{}", l);
        if (leader_) std::ofstream(fs::path(run_dir_) / "profile.txt") << table;
      }
    }
    log_update(u);
    const bool last = st_.updates == o_.stop_at;
    const bool is_best = ((o_.eval_every > 0 && st_.updates % o_.eval_every == 0) || st_.updates == o_.steps) && validate();
    if (is_best || last || (o_.checkpoint_every > 0 && st_.updates % o_.checkpoint_every == 0)) save(is_best);
    watch_->after_update(st_.updates);
  }
  std::signal(SIGINT, previous_handler);
  if (dp_->distributed()) std::signal(SIGUSR1, previous_usr1);
  else
    std::signal(SIGTERM, previous_term);
  if (exit_code == 0) {
    if (tty_) std::fputc('\n', stderr);
    log_->info("done: {} updates in {} ({} skipped); run directory {}", st_.updates,
               format_duration(seconds_since(run_start_)), st_.skipped, run_dir_);
  }
  if (const std::string report = watch_->finish(); !report.empty()) log_->info("report: {}", report);
  spdlog::drop("dew");
  return exit_code;
}

}  // namespace
}  // namespace training

// An error on one rank ends the whole job at once (its peers would wait in a collective).
int train(Config& config, const TrainOptions& options) {
  auto abort_job = [](ErrorKind kind, const std::string& what) {
    const auto comm = training::active_comm();
    if (!comm || comm->size() <= 1) return;
    const bool usage = kind == ErrorKind::usage;
    comm->abort(usage ? 2 : 1,
                "dew-run train: rank " + std::to_string(comm->rank()) + ": " + (usage ? "" : "error: ") + what);
  };
  try {
    training::Trainer trainer(config, options);
    const int code = trainer.run();
    training::set_active_comm(nullptr);
    return code;
  } catch (const Error& e) {
    abort_job(e.kind(), e.describe());
    training::set_active_comm(nullptr);
    throw;
  } catch (const std::exception& e) {
    abort_job(ErrorKind::runtime, e.what());
    training::set_active_comm(nullptr);
    throw;
  }
}

}  // namespace dew
