// core/train/qk_clip.cpp — QK-Clip (dew/qk_clip.hpp): the max-logit recorder the attention blocks report
// to, and the per-query-group rescaling of their q/k projection rows.
// Invariants: only rows of clipped groups change, each by one multiplication with sqrt(tau / s) rounded
// once to the weight's dtype; recording and clipping are kernel-algebra calls (attention_max_logit,
// binary max / mul) on the block's backend, deterministic, so a resumed run is bit-exact.
#include "dew/qk_clip.hpp"

#include <cmath>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/nn.hpp"
#include "dew/ops.hpp"

namespace dew {

namespace {
thread_local MaxLogitRecorder* g_active = nullptr;

// w [rows, ...] (a weight or a bias) *= factor[row]; one mul kernel, the factors in w's dtype.
void scale_rows(Tensor w, const std::vector<float>& factor) {
  const int64_t rows = w.shape()[0];
  Shape fs(size_t(w.ndim()), 1);
  fs[0] = rows;
  const Tensor f = Tensor::from_vector(factor, fs, w.backend_ptr(), w.dtype());
  w.copy_(mul(w.detach(), f));
}
}  // namespace

MaxLogitRecorder* MaxLogitRecorder::active() { return g_active; }
MaxLogitRecorder::Scope::Scope(MaxLogitRecorder* r) : previous_(g_active) { g_active = r; }
MaxLogitRecorder::Scope::~Scope() { g_active = previous_; }

void MaxLogitRecorder::record(const nn::Attention& block, const Tensor& q, const Tensor& k, const AttentionParams& p,
                              const Tensor& segment_ids) {
  NoGradGuard no_grad;
  const Tensor m = attention_max_logit(q, k, p, segment_ids);
  for (Site& s : sites_)
    if (s.attention == &block) {
      s.max_logit = s.max_logit.defined() ? maximum(s.max_logit, m) : m;
      return;
    }
  sites_.push_back(Site{&block, m});
}

void MaxLogitRecorder::reset() {
  for (Site& s : sites_) s.max_logit = Tensor();
}

std::vector<double> qk_group_max(const std::vector<double>& head_max, int64_t kv_heads) {
  const int64_t hq = int64_t(head_max.size());
  DEW_CHECK(kv_heads > 0 && hq % kv_heads == 0, "qk_clip: ", hq, " query heads do not group over ", kv_heads,
            " key/value heads");
  const int64_t group = hq / kv_heads;
  std::vector<double> g(size_t(kv_heads), -INFINITY);
  for (int64_t h = 0; h < hq; ++h) {
    const double v = head_max[size_t(h)];
    double& m = g[size_t(h / group)];
    if (std::isnan(v) || std::isnan(m)) m = NAN;
    else m = std::max(m, v);
  }
  return g;
}

int64_t qk_clip(const nn::Attention& block, const std::vector<double>& head_max, double tau,
                const std::function<bool(const Tensor&)>& rescale) {
  const nn::AttentionConfig& c = block.cfg;
  DEW_USAGE_CHECK(tau > 0 && std::isfinite(tau), "qk_clip: tau = ", tau, " must be a positive number");
  DEW_USAGE_CHECK(!block.q_norm && !block.k_norm,
                  "QK-Clip cannot bound an attention block with q/k norm (model.qk_norm): the norm undoes a "
                  "rescaled projection; use optim.name = muon, or a model without qk_norm");
  DEW_CHECK(int64_t(head_max.size()) == c.num_heads, "qk_clip: ", head_max.size(), " max logits for ", c.num_heads,
            " query heads");
  const int64_t hq = c.num_heads, hkv = c.num_kv_heads, hd = c.head_dim, group = hq / hkv;
  const std::vector<double> gmax = qk_group_max(head_max, hkv);
  std::vector<float> fq(size_t(hq * hd), 1.0f), fk(size_t(hkv * hd), 1.0f);
  int64_t clipped = 0;
  for (int64_t g = 0; g < hkv; ++g) {
    const double s = gmax[size_t(g)];
    if (!(std::isfinite(s) && s > tau)) continue;
    const float f = float(std::sqrt(tau / s));
    ++clipped;
    for (int64_t h = g * group; h < (g + 1) * group; ++h)
      for (int64_t d = 0; d < hd; ++d) fq[size_t(h * hd + d)] = f;
    for (int64_t d = 0; d < hd; ++d) fk[size_t(g * hd + d)] = f;
  }
  if (clipped == 0) return 0;
  NoGradGuard no_grad;
  auto scale = [&](const Tensor& w, const std::vector<float>& f) {
    if (w.defined() && (!rescale || rescale(w))) scale_rows(w, f);
  };
  if (block.qkv) {  // fused layout: rows [q (Hq Dh) | k (Hkv Dh) | v (Hkv Dh)]
    std::vector<float> f = fq;
    f.insert(f.end(), fk.begin(), fk.end());
    f.resize(size_t((hq + 2 * hkv) * hd), 1.0f);
    scale(block.qkv->weight, f);
    scale(block.qkv->bias, f);
  } else {
    scale(block.q_proj->weight, fq);
    scale(block.k_proj->weight, fk);
    scale(block.q_proj->bias, fq);
    scale(block.k_proj->bias, fk);
  }
  return clipped;
}

}  // namespace dew
