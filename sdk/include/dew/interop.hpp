// dew/interop.hpp — Hugging Face checkpoint interop: import a published model folder (config.json +
// safetensors, sharded or not) as a dew run directory, export a run back to that layout, and load
// weights by name for fine-tuning. Format: docs/interop.md.
//
// The core knows no model family: a model plugin registers an HfConverter (plugin kind
// "hf_converter") that translates config.json into its [model] section and back. The causal_transformer
// registers one for model_type llama, mistral, qwen2 and qwen3. Tensor names are not translated: dew's
// parameter names are the Hugging Face ones, so weights move by name (dtype converted on load).
// Invariants: an import either writes a complete run directory or nothing under a final name (config.ini
// and the checkpoint are each written atomically; the checkpoint last). Every config.json field is mapped
// or explicitly ignored by the converter; anything else is refused naming the fields. Every tensor of
// the checkpoint must be a parameter (or be listed as droppable) and every parameter must be present.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "dew/checkpoint.hpp"
#include "dew/model.hpp"
#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew {

// What a converter makes of a config.json.
struct HfImport {
  std::map<std::string, std::string> model;  // the [model] section, "plugin" included
  std::vector<std::string> ignored;          // config fields read and deliberately ignored (reported)
  // Checkpoint tensors that are skipped when present (e.g. "lm_head.weight" of a tied model, rotary
  // inv_freq buffers).
  std::vector<std::string> droppable;
  int64_t bos_id = -1, eos_id = -1;  // from the config (first of a list), -1 when absent
};

class HfConverter {
 public:
  static constexpr const char* kind = "hf_converter";
  virtual ~HfConverter() = default;
  // The Hugging Face model_type values it imports, e.g. {"llama", "mistral", "qwen2", "qwen3"}.
  virtual std::vector<std::string> model_types() const = 0;
  // The dew model plugin it imports into and exports from.
  virtual std::string model_plugin() const = 0;
  // config.json text -> [model] section. A UsageError names every field it can neither map nor ignore,
  // and every value it cannot express (e.g. rope_scaling).
  virtual HfImport import_config(const std::string& config_json) const = 0;
  // A built model of model_plugin() (its describe() holds the resolved hyper-parameters) -> config.json
  // text; a UsageError names the options no supported family can express. `torch_dtype`: the dtype the
  // weights are written in ("float32", "bfloat16", "float16").
  virtual std::string export_config(const Model& model, const std::string& torch_dtype) const = 0;
};

struct ImportOptions {
  std::string backend = "cpu";  // where the weights are checked while importing (and the run's backend)
  // Extra config keys for the run ("data.path" -> "tok", "objective.pad_id" -> "0", ...), applied over
  // the defaults the import writes.
  std::map<std::string, std::string> overrides;
};

// `dew-run import`: hf_dir (config.json + model.safetensors or an index with shards; tokenizer.json
// optional) -> run_dir with config.ini (the [model] section from the converter, [objective] lm,
// [data] source = none or the given data) and checkpoints/step-00000000.h5 (updates 0). Refuses a run
// directory that already holds checkpoints. Returns a one-line summary.
std::string import_hf(const std::string& hf_dir, const std::string& run_dir, const ImportOptions& options);

// `dew-run export --format hf`: config.json (from the model plugin's converter), the weights
// (model.safetensors, or shards of at most max_shard_bytes with model.safetensors.index.json), and the
// run's tokenizer.json / generation_config.json when it has them. `dtype`: convert floating weights
// (f32 | bf16 | f16; empty = as stored).
void export_hf(const std::string& run_dir, const std::string& step, bool use_ema, const std::string& backend_name,
               const std::string& out_dir, uint64_t max_shard_bytes, const std::string& dtype);

// Loads weights by name into `targets` from `path`: a run directory (its latest checkpoint), a dew
// checkpoint (.h5), a .safetensors file, an index.json, or a folder with model.safetensors(.index.json).
// Every target must be present with its shape; the dtype is converted; tensors of the source that are
// not targets are refused by name unless listed in `droppable`. Returns the source's description.
std::string load_weights(const std::string& path, const NamedTensors& targets,
                         const std::vector<std::string>& droppable = {});

}  // namespace dew
