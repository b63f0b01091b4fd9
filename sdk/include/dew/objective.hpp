// dew/objective.hpp — the training objective interface (plugin kind "objective").
//
// An objective owns the modules it trains (a classifier owns one model; JEPA owns encoder, predictor
// and target encoder), turns a batch into a scalar loss plus named metrics, says which parameters get
// an EMA, and runs validation (metrics plus artifacts such as sampled text or image grids). The trainer
// owns everything else: optimizer, schedules, EMA, clipping, checkpoints, logging.
// Invariants: parameters() names are stable across runs (they are checkpoint dataset names) and in a
// fixed order; step() is deterministic given the batch and StepInfo (randomness from info.seed and
// info.step through Philox), which is what makes resume bit-exact.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dew/config.hpp"
#include "dew/data.hpp"
#include "dew/model.hpp"

namespace dew {

class Tokenizer;  // dew/tokenizer.hpp

using NamedTensors = std::vector<std::pair<std::string, Tensor>>;

struct ObjectiveContext {
  Config* config = nullptr;  // the whole run config ([objective], [model], ...)
  BackendPtr backend;
  uint64_t seed = 0;
  const DataSource* train_source = nullptr;  // for shapes and class counts (may be null in eval/export)
};

struct StepInfo {
  int64_t step = 0;   // optimizer updates done so far
  int64_t micro = 0;  // micro-batch index within gradient accumulation
  uint64_t seed = 0;  // the run seed
  // The global stream index of this rank's first row of the batch (row j is position + j; see
  // dew/data.hpp), for randomness keyed by the record position (JEPA masks); -1 when unknown.
  int64_t position = -1;
  // The dropout key of this micro-batch's forwards (Model::random_key()): the seed and update * 1024 + micro, 31 bits
  // each. The trainer sets it on the main model before every step.
  nn::RandomKey random_key() const { return {seed & 0x7fffffffu, uint64_t(step * 1024 + micro) & 0x7fffffffu}; }
};

struct StepResult {
  Tensor loss;                            // a one-element differentiable tensor
  std::map<std::string, double> metrics;  // per-batch metrics (accuracy, ...)
  int64_t samples = 0;                    // rows in the batch
  int64_t tokens = 0;                     // tokens trained on (language models), else 0
  // What the objective leaves on the device, so the trainer reads it with the loss in the update's one
  // host transfer: one-element f32 metrics (averaged over micro-batches like `metrics`), and, when
  // defined, the count of tokens trained on (used instead of `tokens`).
  std::map<std::string, Tensor> device_metrics;
  Tensor device_tokens;
};

struct Artifact {
  std::string file_name;  // written into <run-dir>/samples/
  std::vector<unsigned char> bytes;
};

// One generated image (Objective::generate_images).
struct GeneratedImage {
  std::vector<unsigned char> png;
  int64_t label = -1;  // the class it was asked for (-1: unconditional)
  uint64_t seed = 0;   // the request's seed (row i of a request is keyed by (seed, i))
};

struct ValidationResult {
  std::map<std::string, double> metrics;
  std::vector<Artifact> artifacts;
  // An objective that shards its validation (Objective::shards_validation) also returns the sums over
  // the records it scored that its metrics are made of (nats, hits, records, ...): the same keys on
  // every rank, whatever its share of the split. A data-parallel trainer adds them over the ranks and
  // takes the metrics from validation_metrics() of the totals.
  std::map<std::string, double> sums;
};

class Objective {
 public:
  static constexpr const char* kind = "objective";
  virtual ~Objective() = default;

  virtual void build(ObjectiveContext& ctx) = 0;
  virtual std::vector<std::string> batch_fields() const = 0;
  virtual NamedTensors parameters() = 0;                          // trainable, e.g. "model.fc1.weight"
  virtual NamedTensors ema_parameters() { return parameters(); }  // those that get an EMA
  // Tensors the objective owns but the optimizer does not train (e.g. JEPA's target encoder, an EMA
  // with its own momentum schedule). The trainer saves them in checkpoints (state/objective.<name>)
  // and loads them back on --resume, eval, sample and export, so a resumed run is bit-exact.
  virtual NamedTensors state() { return {}; }
  // Called after every optimizer update (not after skipped ones), with info.step = the updates done,
  // this one included; e.g. to move a target network towards the trained one. No gradients are recorded.
  virtual void after_update(const StepInfo& info) { (void)info; }
  // Called by eval, sample, serve and export after loading a LoRA run, just before its adapters are folded into the
  // main model's weights (dew/lora.hpp): an objective that runs the base model itself (DPO's reference as the policy
  // with its adapters off) keeps what it needs of the base here.
  virtual void before_adapters_merged() {}
  // What `dew-run export` writes (default: the trained parameters). JEPA exports its encoder alone.
  virtual NamedTensors export_parameters() { return parameters(); }
  virtual StepResult step(const Batch& batch, const StepInfo& info) = 0;
  // Runs on `loader` (a validation/test split) without gradients; the trainer has already swapped in
  // the EMA weights when it keeps them.
  virtual ValidationResult validate(DataLoader& loader, const StepInfo& info) = 0;
  // Sharded validation. An objective whose validation metrics are all functions of sums over records
  // returns true here, fills ValidationResult::sums, and computes its metrics with validation_metrics()
  // (from its own sums in one process). A data-parallel run then hands validate() a loader over this
  // rank's share of the split (loader.config().rank / world: for_each_pass_batch reads it), adds the
  // ranks' sums and logs validation_metrics() of the totals, so N ranks validate in 1/N of the time and
  // log what one process would. Artifacts are written from rank 0 only: validate() may skip them where
  // loader.config().rank != 0. The default (false): every rank validates on the whole split.
  virtual bool shards_validation() const { return false; }
  virtual std::map<std::string, double> validation_metrics(const std::map<std::string, double>& sums) const;
  // The metric used for "best" checkpoints and whether larger is better.
  virtual std::string primary_metric() const { return "loss"; }
  // Whether step()'s loss is a mean over the tokens it reports (StepResult::tokens or device_tokens): then
  // [trainer] loss_weighting = token may weigh each micro-batch's loss by them, so that every token of an update
  // counts alike over micro-batches and ranks (the lm objective; grpo's bnpo loss). Default false: refused there.
  virtual bool loss_is_token_mean() const { return false; }
  virtual bool higher_is_better() const { return false; }
  // FLOPs of one training step per sample (forward + backward), for MFU; 0 when unknown.
  virtual double train_flops_per_sample() const { return 0.0; }
  // The main model, for export (config.json); [lora] (dew/lora.hpp) adapts its Linear layers.
  virtual Model* main_model() { return nullptr; }
  // Why [lora] cannot fine-tune this objective's main model (empty: it can), e.g. an objective that moves a
  // copy of the model towards its weights (JEPA's target encoder) and would need the adapters' product there.
  virtual std::string lora_unsupported_reason() const { return {}; }
  // The tokenizer of a text objective (null otherwise): `dew-run serve` encodes prompts and decodes
  // tokens with it.
  virtual std::shared_ptr<const Tokenizer> tokenizer() const { return nullptr; }
  // `dew-run sample`: generates from the loaded weights (text to stdout, images to a file), reading
  // its own request keys from `request` (--prompt, --steps, --out, ...). Objectives without a sampler
  // keep this default, which refuses with a clear usage error.
  virtual void sample(Options& request);
  // Image generation for `dew-run serve` (POST /v1/images): whether this objective makes images, and
  // the images of one request (the keys of sample() without --out: labels, n, steps, sampler, guidance,
  // seed, solver keys; every key must be read), one PNG per image in request order. A request for more
  // than max_images images is a usage error. The default refuses (objectives without images).
  virtual bool generates_images() const { return false; }
  virtual std::vector<GeneratedImage> generate_images(Options& request, int64_t max_images);
  // `dew-run eval`: scores the loaded weights on `loader` (the val/test split). `request` holds the
  // extra --key value pairs of the command line (e.g. --samples 500 --steps 30 for diffusion, --task
  // for the LM harness); every key must be read or the command refuses it. The default runs
  // validate() and reads no keys.
  virtual ValidationResult evaluate(DataLoader& loader, Options& request, const StepInfo& info);
  // Called by the trainer before the first update with the validation loader validate() will read:
  // checks what validate() depends on (labels in range, image shapes, token ids, sampling options) so a
  // bad validation split is refused when the run starts, not after every update is done. Reads records
  // through loader.source() (the loader's position is left alone). The default checks nothing.
  virtual void check_validation_data(DataLoader& loader) { (void)loader; }
};

}  // namespace dew
