// dew/qk_clip.hpp — QK-Clip (Kimi K2's MuonClip): the attention blocks report each head's max logit during
// a training step, and after the optimizer's update the query/key projections of the heads above tau are
// rescaled so that their logits come back to tau.
//
// Recording: while a MaxLogitRecorder is active in a thread (MaxLogitRecorder::Scope) and gradients are
// recorded (a training forward, not a frozen reference or a no-grad probe), every nn::Attention::forward
// runs the attention_max_logit kernel on its q and k (after q/k norm and rotary positions, exactly what the
// attention op sees; the fused-projection path runs as project() + attention() so q and k exist) and keeps
// a running max per query head over the forwards until reset(). One site per block, in the order of first
// forward. The statistic is the raw logit scale * q.k, before softcap.
//
// Clipping (qk_clip): per block and query group g (the Hq / Hkv query heads that read kv head g; one head
// without GQA), s_g = the max over the group's heads. When s_g > tau, gamma = tau / s_g and the rows of
// the group's query heads in the q projection and of kv head g in the k projection (weights and biases)
// are multiplied by sqrt(gamma), so every logit of the group is multiplied by gamma (rotary positions are
// linear in q and k). Applied after the update this is Kimi K2's W <- gamma (W + update), the sqrt split
// between q and k, per query group under GQA. Other rows are not touched. Blocks with q/k norm are refused
// (the norm undoes a rescaled projection). The factors are computed in double on the host and rounded to
// the weight's dtype once; the product is one binary mul kernel per tensor, so any backend runs it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "dew/backend.hpp"
#include "dew/tensor.hpp"

namespace dew {

namespace nn {
class Attention;
}

class MaxLogitRecorder {
 public:
  struct Site {
    const nn::Attention* attention = nullptr;
    Tensor max_logit;  // [Hq] f32 (f64 for f64 blocks) on the block's backend; undefined until a forward
  };
  // Called by nn::Attention::forward with its q [B, T, Hq, D], k [B, S, Hkv, D] and segment ids (documents of
  // packed rows, or undefined): the statistic honours them as the attention does.
  void record(const nn::Attention& block, const Tensor& q, const Tensor& k, const AttentionParams& p,
              const Tensor& segment_ids = Tensor());
  const std::vector<Site>& sites() const { return sites_; }
  // Forgets the running maxima (the sites and their order stay).
  void reset();

  // The recorder of this thread (null when none is active).
  static MaxLogitRecorder* active();
  // Makes `r` this thread's active recorder while alive (nested scopes restore the outer one).
  class Scope {
   public:
    explicit Scope(MaxLogitRecorder* r);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    MaxLogitRecorder* previous_;
  };

 private:
  std::vector<Site> sites_;
};

// Rescales `block`'s q and k projection rows from each query head's max logit (head_max, Hq values), as
// the file comment says; returns the number of query groups clipped. tau must be positive; heads with a
// non-finite or <= tau max are left alone. Refuses a block with q/k norm (UsageError). `rescale`, when
// given, says which of the block's tensors this process rescales (a sharded run: the ones it owns).
int64_t qk_clip(const nn::Attention& block, const std::vector<double>& head_max, double tau,
                const std::function<bool(const Tensor&)>& rescale = {});

// The per-group maxima of head_max (Hq values, grouped over kv_heads groups of Hq / kv_heads heads).
std::vector<double> qk_group_max(const std::vector<double>& head_max, int64_t kv_heads);

}  // namespace dew
