// attention.cpp — naive scaled dot-product attention (causal, sliding window, GQA, softcap, q_offset)
// and its backward.
// Invariants: one query row at a time, its scores materialised in double; query t sits at position
// q_offset + t and sees key s when (!causal || s <= pos) && (window == 0 || pos - s < window); query
// head h reads kv head h / (Hq / Hkv); with segment_ids [B, S] key s is also hidden unless
// seg[b, s] == seg[b, q_offset + t] != 0 (documents of a packed row); a row without a visible key outputs
// zeros and lse = -inf.
// Backward (per row, P from the saved lse, Di = rowsum(dO * O)):
//   dV_s += P_s dO;  dP_s = dO . V_s;  dS_s = P_s (dP_s - Di);  with softcap c the raw score r maps to
//   c tanh(r / c), so dR_s = dS_s (1 - tanh^2(r / c));  dQ += scale dR_s K_s;  dK_s += scale dR_s Q.
// attention_max_logit: the same visibility, the largest raw score (in double, before softcap) per query head.
// attention_slots: its definition (core/tensor/kernel_groups.cpp), each row's write then attention.
#include <algorithm>
#include <limits>
#include <vector>

#include "dew/kernel_contracts.hpp"
#include "ref_backend.hpp"

namespace dew::ref {

namespace {

struct AttnShape {
  int64_t B, T, S, Hq, Hkv, Dk, Dv, group;
};

AttnShape attn_shape(const Tensor& q, const Tensor& k, const Tensor& v, Kernel kern) {
  DEW_CHECK(q.ndim() == 4 && k.ndim() == 4 && v.ndim() == 4, "ref.", kernel_name(kern), ": q ", shape_str(q.shape()),
            ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()), " are not all [B, len, heads, D]");
  AttnShape s{q.size(0), q.size(1), k.size(1), q.size(2), k.size(2), q.size(3), v.size(3), 0};
  DEW_CHECK(k.size(0) == s.B && v.size(0) == s.B && v.size(1) == s.S && v.size(2) == s.Hkv && k.size(3) == s.Dk, "ref.",
            kernel_name(kern), ": q ", shape_str(q.shape()), ", k ", shape_str(k.shape()), ", v ", shape_str(v.shape()),
            " do not match");
  DEW_CHECK(s.Hkv > 0 && s.Hq % s.Hkv == 0, "ref.", kernel_name(kern), ": ", s.Hq,
            " query heads are not a multiple of ", s.Hkv, " kv heads");
  DEW_CHECK(k.dtype() == q.dtype() && v.dtype() == q.dtype(), "ref.", kernel_name(kern), ": q, k, v dtypes differ");
  s.group = s.Hq / s.Hkv;
  return s;
}

// seg: the row's segment ids [S] or nullptr (one document).
bool visible(const AttentionParams& p, const int32_t* seg, int64_t t, int64_t s) {
  const int64_t pos = p.q_offset + t;
  if (seg && (seg[pos] == 0 || seg[s] != seg[pos])) return false;
  return (!p.causal || s <= pos) && (p.window == 0 || pos - s < p.window);
}

const int32_t* segments_of(const Tensor& segment_ids, const AttnShape& s, const AttentionParams& p, Kernel kern) {
  const bool given = contracts::check_attention_segments(std::string("ref.") + kernel_name(kern), segment_ids, s.B, s.T,
                                                         s.S, p.q_offset);
  return given ? segment_ids.data_as<int32_t>() : nullptr;
}

// Raw score r = scale * q.k and, when softcap > 0, the capped score c * tanh(r / c).
template <class T>
double raw_score(const T* q, const T* k, int64_t D, double scale) {
  double dot = 0;
  for (int64_t d = 0; d < D; ++d) dot += double(q[d]) * double(k[d]);
  return scale * dot;
}
double capped(double r, double softcap) { return softcap > 0 ? softcap * std::tanh(r / softcap) : r; }

}  // namespace

void RefBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                           Tensor& out, Tensor& lse, const AttentionParams& p) {
  constexpr Kernel K = Kernel::attention;
  dispatch_float(q.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const AttnShape s = attn_shape(q, k, v, K);
    expect(out, q.dtype(), s.B * s.T * s.Hq * s.Dv, K, "out");
    expect_stat(lse, s.B * s.Hq * s.T, K, "lse");
    const int32_t* segs = segments_of(segment_ids, s, p, K);
    const double scale = p.scale, softcap = p.softcap;
    std::vector<double> score(size_t(s.S)), acc(size_t(s.Dv));
    for (int64_t b = 0; b < s.B; ++b) {
      const int32_t* seg = segs ? segs + b * s.S : nullptr;
      for (int64_t h = 0; h < s.Hq; ++h) {
        const int64_t hk = h / s.group;
        for (int64_t t = 0; t < s.T; ++t) {
          const T* qv = q.data_as<T>() + ((b * s.T + t) * s.Hq + h) * s.Dk;
          double mx = -std::numeric_limits<double>::infinity();
          for (int64_t j = 0; j < s.S; ++j) {
            if (!visible(p, seg, t, j)) continue;
            const T* kv = k.data_as<T>() + ((b * s.S + j) * s.Hkv + hk) * s.Dk;
            score[size_t(j)] = capped(raw_score(qv, kv, s.Dk, scale), softcap);
            mx = std::max(mx, score[size_t(j)]);
          }
          std::fill(acc.begin(), acc.end(), 0.0);
          double sum = 0;
          bool any = false;
          for (int64_t j = 0; j < s.S; ++j) {
            if (!visible(p, seg, t, j)) continue;
            any = true;
            const double w = std::exp(score[size_t(j)] - mx);
            sum += w;
            const T* vv = v.data_as<T>() + ((b * s.S + j) * s.Hkv + hk) * s.Dv;
            for (int64_t d = 0; d < s.Dv; ++d) acc[size_t(d)] += w * double(vv[d]);
          }
          T* ov = out.data_as<T>() + ((b * s.T + t) * s.Hq + h) * s.Dv;
          for (int64_t d = 0; d < s.Dv; ++d) ov[d] = any ? T(acc[size_t(d)] / sum) : T(0);
          store_stat(lse, (b * s.Hq + h) * s.T + t,
                     any ? mx + std::log(sum) : -std::numeric_limits<double>::infinity());
        }
      }
    }
  });
}

// The definition itself, row by row (core/tensor/kernel_groups.cpp): each row's cache write, then attention above.
void RefBackend::attention_slots(const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                                 const std::vector<int64_t>& slots, const std::vector<int64_t>& positions,
                                 Tensor& k_cache, Tensor& v_cache, Tensor& out, const AttentionParams& p) {
  attention_slots_each(*this, q, k_new, v_new, slots, positions, k_cache, v_cache, out, p);
}

void RefBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                                    const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                                    Tensor& dv, const AttentionParams& p) {
  constexpr Kernel K = Kernel::attention_backward;
  dispatch_float(q.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const AttnShape s = attn_shape(q, k, v, K);
    expect(out, q.dtype(), s.B * s.T * s.Hq * s.Dv, K, "out");
    expect(dout, q.dtype(), out.numel(), K, "dout");
    expect_stat(lse, s.B * s.Hq * s.T, K, "lse");
    expect(dq, q.dtype(), q.numel(), K, "dq");
    expect(dk, q.dtype(), k.numel(), K, "dk");
    expect(dv, q.dtype(), v.numel(), K, "dv");
    const int32_t* segs = segments_of(segment_ids, s, p, K);
    const double scale = p.scale, softcap = p.softcap;
    // dk/dv sum over the query heads of a group and over queries: accumulate in double.
    std::vector<double> dk_acc(size_t(k.numel()), 0.0), dv_acc(size_t(v.numel()), 0.0), dq_row(size_t(s.Dk));
    for (int64_t b = 0; b < s.B; ++b) {
      const int32_t* seg = segs ? segs + b * s.S : nullptr;
      for (int64_t h = 0; h < s.Hq; ++h) {
        const int64_t hk = h / s.group;
        for (int64_t t = 0; t < s.T; ++t) {
          const int64_t row = (b * s.T + t) * s.Hq + h;
          const T* qv = q.data_as<T>() + row * s.Dk;
          const T* ov = out.data_as<T>() + row * s.Dv;
          const T* gv = dout.data_as<T>() + row * s.Dv;
          const double L = load_stat(lse, (b * s.Hq + h) * s.T + t);
          double Di = 0;  // rowsum(dO * O)
          for (int64_t d = 0; d < s.Dv; ++d) Di += double(gv[d]) * double(ov[d]);
          std::fill(dq_row.begin(), dq_row.end(), 0.0);
          for (int64_t j = 0; j < s.S; ++j) {
            if (!visible(p, seg, t, j)) continue;
            const int64_t kv_row = (b * s.S + j) * s.Hkv + hk;
            const T* kv = k.data_as<T>() + kv_row * s.Dk;
            const T* vv = v.data_as<T>() + kv_row * s.Dv;
            const double r = raw_score(qv, kv, s.Dk, scale);
            const double P = std::exp(capped(r, softcap) - L);
            double dP = 0;
            for (int64_t d = 0; d < s.Dv; ++d) {
              dP += double(gv[d]) * double(vv[d]);
              dv_acc[size_t(kv_row * s.Dv + d)] += P * double(gv[d]);
            }
            double dS = P * (dP - Di);
            if (softcap > 0) {
              const double th = std::tanh(r / softcap);
              dS *= 1.0 - th * th;
            }
            for (int64_t d = 0; d < s.Dk; ++d) {
              dq_row[size_t(d)] += scale * dS * double(kv[d]);
              dk_acc[size_t(kv_row * s.Dk + d)] += scale * dS * double(qv[d]);
            }
          }
          T* dqv = dq.data_as<T>() + row * s.Dk;
          for (int64_t d = 0; d < s.Dk; ++d) dqv[d] = T(dq_row[size_t(d)]);
        }
      }
    }
    for (int64_t i = 0; i < k.numel(); ++i) dk.data_as<T>()[i] = T(dk_acc[size_t(i)]);
    for (int64_t i = 0; i < v.numel(); ++i) dv.data_as<T>()[i] = T(dv_acc[size_t(i)]);
  });
}

void RefBackend::attention_max_logit(const Tensor& q, const Tensor& k, const Tensor& segment_ids, Tensor& out,
                                     const AttentionParams& p) {
  constexpr Kernel K = Kernel::attention_max_logit;
  dispatch_float(q.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const AttnShape s = attn_shape(q, k, k, K);
    expect_stat(out, s.Hq, K, "out");
    const int32_t* segs = segments_of(segment_ids, s, p, K);
    for (int64_t h = 0; h < s.Hq; ++h) {
      const int64_t hk = h / s.group;
      double mx = -std::numeric_limits<double>::infinity();
      for (int64_t b = 0; b < s.B; ++b) {
        const int32_t* seg = segs ? segs + b * s.S : nullptr;
        for (int64_t t = 0; t < s.T; ++t) {
          const T* qv = q.data_as<T>() + ((b * s.T + t) * s.Hq + h) * s.Dk;
          for (int64_t j = 0; j < s.S; ++j)
            if (visible(p, seg, t, j))
              mx = std::max(mx, raw_score(qv, k.data_as<T>() + ((b * s.S + j) * s.Hkv + hk) * s.Dk, s.Dk, p.scale));
        }
      }
      store_stat(out, h, mx);
    }
  });
}

}  // namespace dew::ref
