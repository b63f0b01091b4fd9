// core/tensor/kernel_groups.cpp — what every backend shares of the grouped kernels (dew/backend.hpp): the contract
// checks of adamw_update_group, lerp_group, sum_squares_group and attention_slots, and their one-at-a-time forms.
// Invariant: a group is valid only if no byte one slot writes is read or written by another slot, so the slots
// may run in any order or all at once (a device's one launch) with the bits of the one-tensor kernel.
#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/error.hpp"

namespace dew {

void check_adamw_group(const std::vector<AdamWSlot>& slots, const char* who) {
  std::vector<std::pair<uintptr_t, uintptr_t>> written;  // [begin, end) of every param, m and v
  written.reserve(3 * slots.size());
  for (size_t i = 0; i < slots.size(); ++i) {
    const AdamWSlot& s = slots[i];
    DEW_CHECK(s.param.defined() && s.grad.defined() && s.m.defined() && s.v.defined(), who,
              ".adamw_update_group: slot ", i, " lacks a tensor (param, grad, m and v are all needed)");
    DEW_CHECK(is_floating(s.param.dtype()), who, ".adamw_update_group: slot ", i, " has a ",
              dtype_name(s.param.dtype()), " param; parameters are floating");
    DEW_CHECK(s.param.dtype() == slots[0].param.dtype(), who, ".adamw_update_group: slot ", i, " is ",
              dtype_name(s.param.dtype()), " but slot 0 is ", dtype_name(slots[0].param.dtype()),
              "; a group has one dtype");
    for (const Tensor* t : {&s.grad, &s.m, &s.v})
      DEW_CHECK(t->dtype() == s.param.dtype() && t->numel() == s.param.numel(), who, ".adamw_update_group: slot ", i,
                ": grad, m and v must match its param (", dtype_name(s.param.dtype()), ", ", s.param.numel(),
                " elements); got ", dtype_name(t->dtype()), ", ", t->numel());
    if (s.param.numel() == 0) continue;
    for (const Tensor* t : {&s.param, &s.m, &s.v}) {
      const auto begin = reinterpret_cast<uintptr_t>(t->data());
      written.emplace_back(begin, begin + t->nbytes());
    }
  }
  std::sort(written.begin(), written.end());
  for (size_t i = 1; i < written.size(); ++i)
    DEW_CHECK(written[i].first >= written[i - 1].second, who,
              ".adamw_update_group: two of the tensors it writes (params, m, v) share memory; each slot needs its "
              "own param and state");
}

void adamw_update_each(Backend& be, std::vector<AdamWSlot>& slots, const AdamWParams& p) {
  check_adamw_group(slots, be.name().c_str());
  for (AdamWSlot& s : slots) {
    AdamWParams q = p;
    q.lr = s.lr;
    q.weight_decay = s.weight_decay;
    be.adamw_update(s.param, s.grad, s.m, s.v, q);
  }
}

namespace {
// [begin, end) of a tensor's bytes.
std::pair<uintptr_t, uintptr_t> byte_range(const Tensor& t) {
  const auto begin = reinterpret_cast<uintptr_t>(t.data());
  return {begin, begin + t.nbytes()};
}
bool overlap(const std::pair<uintptr_t, uintptr_t>& a, const std::pair<uintptr_t, uintptr_t>& b) {
  return a.first < b.second && b.first < a.second;
}
}  // namespace

void check_lerp_group(const std::vector<LerpSlot>& slots, const char* who) {
  std::vector<std::pair<uintptr_t, uintptr_t>> written, read;  // the averages; the targets
  for (size_t i = 0; i < slots.size(); ++i) {
    const LerpSlot& s = slots[i];
    DEW_CHECK(s.average.defined() && s.target.defined(), who, ".lerp_group: slot ", i,
              " lacks a tensor (average and target are both needed)");
    DEW_CHECK(is_floating(s.average.dtype()), who, ".lerp_group: slot ", i, " has a ", dtype_name(s.average.dtype()),
              " average; it must be floating");
    DEW_CHECK(s.average.dtype() == slots[0].average.dtype(), who, ".lerp_group: slot ", i, " is ",
              dtype_name(s.average.dtype()), " but slot 0 is ", dtype_name(slots[0].average.dtype()),
              "; a group has one dtype");
    DEW_CHECK(s.target.dtype() == s.average.dtype() && s.target.numel() == s.average.numel(), who, ".lerp_group: slot ",
              i, ": the target must match its average (", dtype_name(s.average.dtype()), ", ", s.average.numel(),
              " elements); got ", dtype_name(s.target.dtype()), ", ", s.target.numel());
    if (s.average.numel() == 0) continue;
    written.push_back(byte_range(s.average));
    read.push_back(byte_range(s.target));
  }
  std::sort(written.begin(), written.end());
  std::sort(read.begin(), read.end());
  for (size_t i = 1; i < written.size(); ++i)
    DEW_CHECK(written[i].first >= written[i - 1].second, who,
              ".lerp_group: two averages share memory; each slot needs its own");
  // Both lists sorted: walk them together, each average against the targets that could reach it.
  size_t t = 0;
  for (const auto& w : written) {
    while (t < read.size() && read[t].second <= w.first) ++t;
    for (size_t u = t; u < read.size() && read[u].first < w.second; ++u)
      DEW_CHECK(!overlap(w, read[u]), who, ".lerp_group: an average shares memory with a target; it must not");
  }
}

void lerp_each(Backend& be, std::vector<LerpSlot>& slots, float weight) {
  check_lerp_group(slots, be.name().c_str());
  for (LerpSlot& s : slots) {
    if (s.average.numel() == 0) continue;
    Tensor diff = Tensor::empty(s.average.shape(), s.average.dtype(), s.average.backend_ptr());
    be.binary(s.target, s.average, diff, BinaryOp::sub);
    be.unary(diff, diff, UnaryParams{UnaryOp::affine, weight, 0.0f});
    be.binary(s.average, diff, s.average, BinaryOp::add);
  }
}

void check_sum_squares_group(const std::vector<Tensor>& xs, const Tensor& out, const char* who) {
  DEW_CHECK(out.defined() && out.numel() == int64_t(xs.size()), who, ".sum_squares_group: out must hold one value per input (",
            xs.size(), ")");
  const auto out_begin = reinterpret_cast<uintptr_t>(out.data()), out_end = out_begin + out.nbytes();
  for (size_t i = 0; i < xs.size(); ++i) {
    DEW_CHECK(xs[i].defined() && xs[i].dtype() == out.dtype() && is_floating(out.dtype()), who,
              ".sum_squares_group: input ", i, " must be a defined ", dtype_name(out.dtype()),
              " tensor (out's dtype, floating)");
    if (xs[i].numel() == 0) continue;
    const auto begin = reinterpret_cast<uintptr_t>(xs[i].data());
    DEW_CHECK(begin + xs[i].nbytes() <= out_begin || begin >= out_end, who, ".sum_squares_group: input ", i,
              " overlaps out");
  }
}

void sum_squares_each_reduce(Backend& be, const std::vector<Tensor>& xs, Tensor& out) {
  check_sum_squares_group(xs, out, be.name().c_str());
  for (size_t i = 0; i < xs.size(); ++i) {
    Tensor slot = out.slice0(int64_t(i), int64_t(i) + 1);
    if (xs[i].numel() == 0)
      be.fill(slot, 0.0);
    else
      be.reduce(xs[i], slot, ReduceParams{ReduceOp::sumsq, 1, xs[i].numel(), 1});
  }
}

void check_attention_slots(const Tensor& q, const Tensor& k_new, const Tensor& v_new, const std::vector<int64_t>& slots,
                           const std::vector<int64_t>& positions, const Tensor& k_cache, const Tensor& v_cache,
                           const Tensor& out, const char* who) {
  for (const Tensor* t : {&q, &k_new, &v_new, &k_cache, &v_cache, &out})
    DEW_CHECK(t->defined() && is_floating(t->dtype()), who,
              ".attention_slots: q, k_new, v_new, the caches and out must be defined floating tensors");
  DEW_CHECK(k_cache.ndim() == 4 && v_cache.shape() == k_cache.shape(), who,
            ".attention_slots: the caches must be [slots, C, Hkv, D] of one shape, got ", shape_str(k_cache.shape()),
            " and ", shape_str(v_cache.shape()));
  const int64_t n_slots = k_cache.size(0), capacity = k_cache.size(1), hkv = k_cache.size(2), d = k_cache.size(3);
  const int64_t n = int64_t(slots.size());
  DEW_CHECK(positions.size() == slots.size(), who, ".attention_slots: ", slots.size(), " slots but ", positions.size(),
            " positions");
  DEW_CHECK(q.ndim() == 4 && q.size(0) == n && q.size(1) == 1 && q.size(3) == d && hkv > 0 && q.size(2) > 0 &&
                q.size(2) % hkv == 0,
            who, ".attention_slots: q ", shape_str(q.shape()), " is not [", n, ", 1, Hq, ", d,
            "] with Hq a multiple of the caches' ", hkv, " kv heads");
  const Shape kv_rows{n, 1, hkv, d};
  DEW_CHECK(k_new.shape() == kv_rows && v_new.shape() == kv_rows && out.shape() == q.shape(), who,
            ".attention_slots: k_new ", shape_str(k_new.shape()), " and v_new ", shape_str(v_new.shape()), " must be ",
            shape_str(kv_rows), " and out ", shape_str(out.shape()), " q's shape");
  const DType cache = k_cache.dtype();
  DEW_CHECK(v_cache.dtype() == cache && k_new.dtype() == cache && v_new.dtype() == cache && out.dtype() == q.dtype() &&
                (q.dtype() == cache || (q.dtype() == DType::f32 && cache == DType::bf16)),
            who, ".attention_slots: q ", dtype_name(q.dtype()), ", out ", dtype_name(out.dtype()), ", k_new ",
            dtype_name(k_new.dtype()), ", v_new ", dtype_name(v_new.dtype()), ", caches ", dtype_name(cache), " and ",
            dtype_name(v_cache.dtype()), ": one dtype, or f32 q and out over a bf16 cache and its new rows");
  for (int64_t i = 0; i < n; ++i) {
    DEW_CHECK(slots[size_t(i)] >= 0 && slots[size_t(i)] < n_slots, who, ".attention_slots: row ", i, "'s slot ",
              slots[size_t(i)], " is outside the cache's ", n_slots, " slots");
    DEW_CHECK(positions[size_t(i)] >= 0 && positions[size_t(i)] < capacity, who, ".attention_slots: row ", i,
              "'s position ", positions[size_t(i)], " is outside the cache's ", capacity, " positions");
  }
  std::vector<int64_t> sorted = slots;
  std::sort(sorted.begin(), sorted.end());
  DEW_CHECK(std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end(), who,
            ".attention_slots: a slot appears in two rows (each row writes its slot's cache)");
}

void attention_slots_each(Backend& be, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                          const std::vector<int64_t>& slots, const std::vector<int64_t>& positions, Tensor& k_cache,
                          Tensor& v_cache, Tensor& out, const AttentionParams& p) {
  check_attention_slots(q, k_new, v_new, slots, positions, k_cache, v_cache, out, be.name().c_str());
  const Tensor lse = Tensor::empty({1, q.size(2), 1}, DType::f32, q.backend_ptr());
  for (size_t i = 0; i < slots.size(); ++i) {
    const auto [k, v] = write_slot_row(be, k_new, v_new, int64_t(i), slots[i], positions[i], k_cache, v_cache);
    AttentionParams row_p = p;
    row_p.causal = true;
    row_p.q_offset = positions[i];
    Tensor out_i = out.slice0(int64_t(i), int64_t(i) + 1), lse_i = lse;
    be.attention(q.slice0(int64_t(i), int64_t(i) + 1), k, v, Tensor(), out_i, lse_i, row_p);
  }
}

std::pair<Tensor, Tensor> write_slot_row(Backend& be, const Tensor& k_new, const Tensor& v_new, int64_t i, int64_t slot,
                                         int64_t pos, Tensor& k_cache, Tensor& v_cache) {
  const int64_t capacity = k_cache.size(1), hkv = k_cache.size(2), d = k_cache.size(3), row = hkv * d;
  StridedCopyParams cp;  // row i of k_new / v_new -> [slot, pos] of the cache
  cp.shape = {row};
  cp.src_strides = cp.dst_strides = {1};
  cp.src_offset = i * row;
  cp.dst_offset = (slot * capacity + pos) * row;
  be.strided_copy(k_new, k_cache, cp);
  be.strided_copy(v_new, v_cache, cp);
  const auto prefix = [&](const Tensor& c) {
    return c.slice0(slot, slot + 1).reshape({capacity, hkv, d}).slice0(0, pos + 1).reshape({1, pos + 1, hkv, d});
  };
  return {prefix(k_cache), prefix(v_cache)};
}

}  // namespace dew
