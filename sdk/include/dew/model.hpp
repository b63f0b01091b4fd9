// dew/model.hpp — the backbone interface (plugin kind "model") and the Batch.
//
// A Batch maps field names to tensors: "text" i32 [B, S+1], "image" u8 [B, H, W, C] as loaded, "label"
// i32 [B]. A Model is an nn::Module whose forward takes named inputs, so families with different
// inputs share one interface; each backbone documents the names it reads:
//   classifiers (mlp, convnet): "image" f32 [B, C, H, W] -> logits [B, num_classes]
// Models are created from the [model] section (Options); the objective may fill keys the data decides
// (num_classes, in_channels, image_size) before creating one.
#pragma once
#include <map>
#include <memory>
#include <string>

#include "dew/nn.hpp"
#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew {

using Batch = std::map<std::string, Tensor>;

class Model : public nn::Module {
 public:
  static constexpr const char* kind = "model";
  virtual Tensor forward(const Batch& inputs) = 0;
  // The representation before the output head ([B, F]: a classifier's pooled features), for probes and
  // feature-space metrics such as the Fréchet distance. Models without one keep this default, which
  // refuses with the model's name.
  virtual Tensor features(const Batch& inputs);
  // Multiply-adds x 2 of one forward pass for one sample (MFU = 3x this per trained sample); 0: unknown.
  virtual double flops_per_sample() const { return 0.0; }
  // The model's hyper-parameters as key/value pairs (written as config.json on export).
  virtual std::map<std::string, std::string> describe() const { return {}; }
  // A loss of the model's own from its last training forward, already weighted (a mixture of experts' load
  // balancing), that the objective adds to its loss (lm and dpo do, logging it as aux_loss); undefined when there is
  // none. A later forward of the same model (an evaluation-mode reference pass) replaces it.
  virtual Tensor auxiliary_loss() const { return Tensor(); }

  // The key of the training randomness of the next forward passes (dropout masks, nn::RandomKey in dew/nn.hpp): the
  // trainer sets it before each training step (and an objective may, from its StepInfo), as host integers.
  using RandomKey = nn::RandomKey;
  void set_random_key(const RandomKey& key) { random_key_ = key; }
  const RandomKey& random_key() const { return random_key_; }

 private:
  RandomKey random_key_;
};

// A model whose output is a bias-free linear head over its last hidden states: forward(inputs) equals
// softcap(hidden @ weight^T) (cap * tanh(z / cap) when softcap > 0) for {hidden, weight, softcap} =
// forward_hidden(inputs), in f32. An objective that finds it (dynamic_cast, as CausalDecoder) may fuse the head
// into its loss (dew::linear_cross_entropy) so the [rows, vocabulary] logits never exist; the lm objective does.
struct HiddenAndHead {
  Tensor hidden;  // [B, T, D], differentiable
  Tensor weight;  // [V, D]: the head (a tied embedding included), differentiable
  float softcap = 0.0f;
};
class LinearHeadModel {
 public:
  virtual ~LinearHeadModel() = default;
  virtual HiddenAndHead forward_hidden(const Batch& inputs) = 0;
  // forward_hidden with the hidden states flattened to the head's rows, hidden [rows, D]: what a fused loss
  // (dew::linear_cross_entropy, linear_token_logprobs) takes. Refuses, naming the shapes, hidden states that
  // are not [B, T, D] with B * T = rows or a head that is not [vocab, D] (vocab < 0: any vocabulary).
  HiddenAndHead forward_rows(const Batch& inputs, int64_t rows, int64_t vocab = -1);
};

// Creates the model named by `section`'s "plugin" key with the rest of the section as its options.
std::shared_ptr<Model> create_model(Options& section);

}  // namespace dew
