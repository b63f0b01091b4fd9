// dew/probes.hpp — frozen-feature probes: how well do embeddings separate the classes of a labelled split?
//
// The standard yardsticks of self-supervised representation learning (I-JEPA, DINO, MAE): features are
// extracted once, frozen, from a training split and a test split; a probe is fitted on the first and
// scored on the second.
//  * knn_probe: k nearest neighbours by cosine similarity (one matmul per chunk of test rows on the
//    backend), vote weighted by exp(similarity / temperature) (DINO) or a plain majority; ties go to
//    the smallest class index.
//  * linear_probe: multinomial logistic regression (a softmax classifier W x + b) on standardised
//    features (train mean and std), zero-initialised, AdamW with a cosine learning rate over a fixed
//    number of epochs of Philox-shuffled mini-batches: a convex problem solved deterministically.
// Both are deterministic given their options (the shuffles are keyed by options.seed), run on the
// features' backend, and record no gradients outside their own fit.
// collect_features() turns a loader's split into (features, labels) with any embedding function, so one
// objective can probe its trained encoder, a freshly initialised one and raw pixels the same way.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dew/data.hpp"
#include "dew/model.hpp"
#include "dew/tensor.hpp"

namespace dew::probes {

// Frozen features of a labelled split: x f32 [N, D] on a backend, labels[i] the class of row i.
struct Features {
  Tensor x;
  std::vector<int32_t> labels;
  int64_t size() const { return int64_t(labels.size()); }
};

// Reads up to `max_samples` records (0: one whole epoch of the source) from the loader's current
// position, in stream order, embeds every batch with `embed` (device batch -> f32 [B, D]) without
// gradients, and reads the labels from the batch field `label_field` (i32 [B]). max_samples is capped at
// the source size, so no record is read twice. The loader must be single-rank (world = 1).
Features collect_features(DataLoader& loader, int64_t max_samples, const std::function<Tensor(const Batch&)>& embed,
                          const BackendPtr& backend, const std::string& label_field = "label");

// Per-dimension standardisation with the statistics of `fit` (mean, std + eps): returns (x - mean) / std.
Tensor standardize(const Tensor& x, const Tensor& fit, double eps = 1e-6);

struct KnnOptions {
  int64_t k = 20;
  bool weighted = true;       // exp(sim / temperature) votes (DINO); false: one vote per neighbour
  double temperature = 0.07;  // of the weighted vote
  int64_t chunk = 512;        // test rows per similarity matmul
};

// Accuracy of k-NN classification of `test` by `train` (cosine similarity). num_classes = 0: 1 + the
// largest label seen.
double knn_probe(const Features& train, const Features& test, const KnnOptions& options = {}, int64_t num_classes = 0);

struct LinearProbeOptions {
  int64_t epochs = 20;
  int64_t batch_size = 256;
  double lr = 0.01;            // peak AdamW learning rate, cosine-decayed to 0 over the fit
  double weight_decay = 1e-4;  // decoupled
  bool standardize = true;     // features standardised with the training split's statistics
  uint64_t seed = 0;           // mini-batch order
};

struct LinearProbeResult {
  double train_accuracy = 0, test_accuracy = 0;
  double train_loss = 0;  // mean cross-entropy of the last epoch
};

LinearProbeResult linear_probe(const Features& train, const Features& test, const LinearProbeOptions& options = {},
                               int64_t num_classes = 0);

}  // namespace dew::probes
