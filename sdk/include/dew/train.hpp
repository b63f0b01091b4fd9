// dew/train.hpp — EMA, the global gradient norm and the Trainer (`dew-run train`, eval, sample, export).
//
// Optimizers and learning-rate schedules are registry kinds: dew/optim.hpp. The Trainer runs
// `dew-run train`: see docs/training.md.
#pragma once
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dew/config.hpp"
#include "dew/objective.hpp"
#include "dew/optim.hpp"

namespace dew {

// averages[i] += weight * (targets[i] - averages[i]) for every i, in place and outside autograd: an exponential
// moving average of weights (Ema::update, JEPA's target encoder). One lerp_group call per backend and dtype (one pass
// over each tensor; a few launches on a device), or its definition, three kernels a tensor, where a backend has no
// group for the dtype; the same bits either way (dew/kernel_table.hpp). The lists are equally long, pairwise alike.
void lerp_towards(const std::vector<Tensor>& averages, const std::vector<Tensor>& targets, float weight);

// EMA with a warm-up decay: decay(t) = min(max_decay, (1 + t) / (10 + t)) when warmup is on, else
// max_decay. update(): ema += (1 - decay) * (param - ema) (lerp_towards).
class Ema {
 public:
  Ema(const NamedTensors& params, double max_decay, bool warmup);
  void update(const NamedTensors& params, int64_t step);
  double decay_at(int64_t step) const;
  const NamedTensors& tensors() const { return ema_; }
  // Swaps parameter values with the EMA values (call twice to swap back).
  void swap_into(const NamedTensors& params);

 private:
  NamedTensors ema_;
  double max_decay_;
  bool warmup_;
};

// Global L2 norm of the gradients of `params` (0 for parameters without a gradient).
double global_grad_norm(const NamedTensors& params);

// ---- memory accounting (metrics mem_params_mb, mem_grads_mb, mem_optim_mb; core/train/memory.cpp) ----
// The bytes of training state this process holds, counted from the tensors actually allocated, each
// storage once and at its allocated size (tied weights, views into one flat buffer, a shard that is a
// view of a larger buffer all count what is really held): params = the storages of `params`; grads =
// those of their .grad (where defined: measure after a backward, before zero_grad); optim = those of
// optimizer->state() (every slot the optimizer reports, whatever it keeps) and of `extra_state` (EMA
// weights, sharded with the optimizer state). A storage already counted in an earlier category is not
// counted again. Sharding shows up without change here: a rank that holds a shard holds smaller tensors.
struct TrainingStateMemory {
  int64_t params = 0, grads = 0, optim = 0;
  int64_t total() const { return params + grads + optim; }
};
TrainingStateMemory training_state_memory(const NamedTensors& params, const Optimizer* optimizer,
                                          const NamedTensors& extra_state = {});
// The backend's sustained matmul rate in GFLOP/s on `operands` (f32, or bf16 / f16: the matmul operands of the
// mixed precisions), the denominator of MFU in the trainer's metrics and in dew-bench: square products through
// dew::matmul, the backend synchronised before the clock starts and after every product, for ~0.2 s. 512 x 512
// on a host backend (the size of a small model's products); 8192 on a device, where a 512 product measures the
// launch, not the arithmetic (an H200 finishes one in microseconds). Never a number written in for a chip.
double measure_matmul_peak_gflops(const BackendPtr& backend, DType operands = DType::f32);
// The side of the square products it multiplies on `backend` (512 or 8192), for the reports that name it.
int64_t matmul_peak_size(const Backend& backend);
// Bytes as the metrics report them: MiB (2^20 bytes).
inline double mebibytes(int64_t bytes) { return double(bytes) / (1024.0 * 1024.0); }

struct TrainOptions {
  std::string run_dir;
  bool resume = false;
  std::string step;          // with resume: the checkpoint to resume ("latest", "best" or N; "" = latest)
  std::string backend_name;  // overrides [run] backend when not empty
};

// Runs `dew-run train`: returns the process exit status (0 done, 130 interrupted after a checkpoint).
// Throws dew::Error for config and runtime errors.
int train(Config& config, const TrainOptions& options);

// `dew-run eval`: loads the run's config and checkpoint (EMA weights when present), runs the
// objective's evaluate() on the test/val split with `request` (extra command-line keys; unread keys are
// refused) and returns the metrics. Artifacts go to <run-dir>/eval/.
std::map<std::string, double> evaluate(const std::string& run_dir, const std::string& step, bool use_ema,
                                       const std::string& backend_name, Options& request);
std::map<std::string, double> evaluate(const std::string& run_dir, const std::string& step, bool use_ema,
                                       const std::string& backend_name);

// The thread count evaluate(), sample(), load_inference_run() and the exports build their run with, in
// place of the run's stored [run] threads (`dew-run eval|sample|serve --threads N`); 0 (the default)
// keeps the stored count. Process-wide: set it before loading a run.
void set_inference_threads(int threads);
// The dtype evaluate(), sample() and load_inference_run() keep the matmul weights in after loading them
// (`--weights bf16` or `int8`: store_matmul_weights_as, dew/generate.hpp); f32 (the default) leaves their values (it
// only packs q/k/v and gate/up back to back, for one decode product per group). The
// exports always write the weights as trained.
void set_inference_weights(DType dtype);
// The K/V cache dtype of a decoding inference command (`dew-run eval|sample|serve --kv-cache f32|bf16`): "auto" (the
// default) follows the weights (f32 weights an f32 cache, bf16 and int8 a bf16 one); f32 or bf16 sets it whatever the
// weights, e.g. f32 weights over a bf16 cache: half the bytes a decoded token reads of the cache, and half the
// memory a served slot takes (CausalDecoder::set_cache_dtype; a decoder without a bf16 cache refuses it).
void set_inference_kv_cache(const std::string& dtype);

// `dew-run sample`: loads the run like evaluate() and hands `request` to the objective's sampler.
void sample(const std::string& run_dir, const std::string& step, bool use_ema, const std::string& backend_name,
            Options& request);

// A run loaded for inference and kept alive (`dew-run serve`): the objective built from the run's
// config with a checkpoint's weights (EMA weights when use_ema and the checkpoint has them).
struct InferenceRun {
  Config config;
  std::shared_ptr<Objective> objective;
  BackendPtr backend;
  int64_t updates = 0;     // the checkpoint's update count
  bool ema = false;        // EMA weights were loaded
  std::string checkpoint;  // the file read
};
std::unique_ptr<InferenceRun> load_inference_run(const std::string& run_dir, const std::string& step, bool use_ema,
                                                 const std::string& backend_name);

// `dew-run export --format safetensors`: model.safetensors (parameter names unchanged) + config.json.
void export_safetensors(const std::string& run_dir, const std::string& step, bool use_ema,
                        const std::string& backend_name, const std::string& out_dir);

// Another run's objective rebuilt from <run-dir>/config.ini with a checkpoint's weights (EMA weights
// when asked and present): for judging one run with another, e.g. a classifier scoring generated images.
// The objective uses `backend_name` (empty: the run's own backend).
struct LoadedObjective {
  std::shared_ptr<Objective> objective;
  BackendPtr backend;
  int64_t updates = 0;
  bool ema = false;
  std::map<std::string, std::string> objective_options;  // the run's [objective] section
};
LoadedObjective load_objective(const std::string& run_dir, const std::string& step, bool use_ema,
                               const std::string& backend_name);

// The checkpoint file of `step` (latest | best | an update number) in a run directory.
std::string resolve_checkpoint(const std::string& run_dir, const std::string& step, const BackendPtr& backend);

}  // namespace dew
