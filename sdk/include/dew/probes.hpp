// dew/probes.hpp — frozen-feature probes: how well do embeddings separate the classes of a labelled split?
//
// The standard yardsticks of self-supervised representation learning (I-JEPA, DINO, MAE): features are
// extracted once, frozen, from a training split and a test split; a probe is fitted on the first and
// scored on the second.
//  * knn_probe: k nearest neighbours by cosine similarity (one matmul per chunk of test rows on the
//    backend), vote weighted by exp(similarity / temperature) (DINO) or a plain majority; ties go to
//    the smallest class index.
//  * linear_probe: multinomial logistic regression (a softmax classifier W x + b) on standardised
//    features (train mean and std), zero-initialised. The default solver ("lbfgs") minimises the mean
//    cross-entropy + (l2 / 2) |W|^2 over the whole training split with L-BFGS until the gradient
//    vanishes (as the linear evaluations of SimCLR/BYOL do with scikit-learn), l2 chosen among
//    `weight_decays` by accuracy on a held-out part of the training split, then refitted on all of it.
//    "adamw" is the older fixed-budget fit: AdamW with a cosine learning rate over a fixed number of
//    epochs of Philox-shuffled mini-batches; on correlated features it stops far from the optimum.
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
  // Before the cosine: "none" (raw features, DINO), "center" (minus the training split's mean) or
  // "standardize" (minus the mean, divided by the per-dimension std of the training split).
  std::string normalize = "none";
};

// Accuracy of k-NN classification of `test` by `train` (cosine similarity). num_classes = 0: 1 + the
// largest label seen.
double knn_probe(const Features& train, const Features& test, const KnnOptions& options = {}, int64_t num_classes = 0);

struct LinearProbeOptions {
  std::string solver = "lbfgs";  // "lbfgs" (full batch, to convergence) or "adamw" (fixed epochs)
  bool standardize = true;       // features standardised with the training split's statistics
  // lbfgs: the L2 strengths tried (on the mean loss); with more than one, each is fitted on the training
  // split minus a held-out part (every round(1 / holdout_fraction)-th row), from the largest down, warm
  // started, and the best held-out accuracy wins (ties: the larger). Empty: weight_decay alone.
  std::vector<double> weight_decays = {1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7};
  double holdout_fraction = 0.2;
  int64_t max_iterations = 1000;  // per fit
  double tolerance = 1e-4;        // converged when every gradient entry is below this (scikit-learn's)
  int64_t history = 10;           // L-BFGS correction pairs
  bool precondition = true;       // L-BFGS scaled by (X'X/n + l2 I)^-1 per class (features up to 4096 wide)
  // adamw (and lbfgs with empty weight_decays: the L2 strength)
  int64_t epochs = 20;
  int64_t batch_size = 256;
  double lr = 0.01;            // peak AdamW learning rate, cosine-decayed to 0 over the fit
  double weight_decay = 1e-4;  // adamw: decoupled; lbfgs: the l2 of the mean loss
  uint64_t seed = 0;           // adamw: mini-batch order
};

struct LinearProbeResult {
  double train_accuracy = 0, test_accuracy = 0;
  double train_loss = 0;         // mean cross-entropy on the training split (adamw: of the last epoch)
  double weight_decay = 0;       // the L2 strength of the final fit
  double holdout_accuracy = -1;  // lbfgs with several weight_decays: the winner's held-out accuracy
  int64_t iterations = 0;        // lbfgs: iterations of the final fit; adamw: updates
  bool converged = true;         // lbfgs: the final fit met the tolerance (or could not improve further)
};

LinearProbeResult linear_probe(const Features& train, const Features& test, const LinearProbeOptions& options = {},
                               int64_t num_classes = 0);

}  // namespace dew::probes
