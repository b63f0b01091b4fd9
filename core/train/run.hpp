// core/train/run.hpp — a run built from its config (backend, data, objective, parameters) and the
// checkpoint's view of it; shared by `dew-run train` (trainer.cpp) and eval / sample / serve / export
// (run.cpp). Internal to libdew.
//
// Invariant: building a run reads the [run], [data] and [objective] sections in the same order every
// time, so a resumed run builds exactly what the interrupted one built (same seeds, same parameters).
#pragma once
#include <cmath>
#include <memory>
#include <string>

#include "dew/autocast.hpp"
#include "dew/checkpoint.hpp"
#include "dew/comm.hpp"
#include "dew/config.hpp"
#include "dew/data.hpp"
#include "dew/lora.hpp"
#include "dew/objective.hpp"
#include "dew/train.hpp"
#include "train/loss_scale.hpp"

namespace dew::training {

// Everything a run is made of, built from the config.
struct Run {
  BackendPtr backend;
  std::string matmul_precision;  // [run] matmul_precision when set, else empty
  Precision precision = Precision::f32;  // [run] precision (dew/autocast.hpp, docs/precision.md)
  LossScaleOptions loss_scale;           // [run] loss_scale_*: used by f16-mixed
  uint64_t seed = 0;
  std::shared_ptr<Objective> objective;
  std::unique_ptr<DataLoader> train_loader;  // train only
  NamedTensors params;                       // the trained parameters (all of the objective's unless frozen)
  // Fine-tuning (dew/lora.hpp): the LoRA-adapted Linear paths, and the parameters [lora] or [optim] freeze
  // keep fixed (no gradient, no optimizer state or EMA; saved and loaded with the others).
  FineTuning fine_tuning;
  const NamedTensors& frozen() const { return fine_tuning.frozen; }
  // Every parameter of the objective, trained and frozen: what checkpoints hold.
  NamedTensors all_params() const { return objective->parameters(); }
  // The EMA's tensors: the objective's EMA parameters that are trained.
  NamedTensors ema_params() const { return fine_tuning.trained_only(objective->ema_parameters()); }
  // Data parallel ([run] dist): the communicator (train only; null when [run] dist = none).
  std::shared_ptr<Communicator> comm;
  int rank = 0, world = 1;
  double bucket_mb = 25;
  std::string shard = "none";  // [run] shard: none | optimizer | gradients | parameters (dist/data_parallel.hpp)
  bool shard_prefetch = true;  // [run] shard_prefetch: shard = parameters gathers the next block ahead
};

// The counters a checkpoint's state/ group holds besides tensors.
struct RunCounters {
  int64_t updates = 0, attempts = 0, skipped = 0, streak = 0;
  DynamicLossScale loss_scale;  // f16-mixed only (its scale, good-attempt count and overflows are saved)
  double best = NAN;
  std::string best_file;
};

// Builds the run: backend (wrapped by the profiler when asked), the train loader when `with_train_data`
// (sharded by rank; with a communicator from [run] dist), the objective and its parameters.
Run build_run(Config& config, const std::string& backend_override, bool with_train_data, bool profile = false);

// The checkpoint of a run at `counters`, with its optimizer state, EMA and data position.
CheckpointData make_checkpoint(Config& config, const Run& run, const Optimizer* opt, const Ema* ema,
                               const RunCounters& counters, const DataPosition& pos);

// The read options of a run's checkpoints (non-finite weights only with DEW_ALLOW_NONFINITE_WEIGHTS=1).
CheckpointReadOptions run_read_options();

// Reads one of a run's checkpoints; a damaged one is refused with the newest intact older checkpoint of
// the same folder as the hint ("step-00000010.h5 is intact: pass --step 10 to use it").
CheckpointData read_run_checkpoint(const std::string& file, const BackendPtr& backend);

// Loads the objective's state tensors (Objective::state()) from a checkpoint's state/objective.* datasets.
void load_objective_state(const CheckpointData& c, const std::string& file, Objective& objective);

// The communicator of the training run in progress, so that an error on one rank ends the job.
void set_active_comm(std::shared_ptr<Communicator> comm);
std::shared_ptr<Communicator> active_comm();

}  // namespace dew::training
