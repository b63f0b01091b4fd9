// core/generate/slots.cpp — the default slot decoding of dew::CausalDecoder (dew/generate.hpp), and the default
// last-position forms (forward_cached_last, forward_slots_last: the full forms' logits, sliced).
//
// Any incremental decoder serves through it: one batch-1 DecodeCache per slot, made when a slot is first
// fed after a clear(), and forward_slots() feeds the rows one at a time through forward_cached(). Every
// row is therefore computed exactly as the sequence alone would be. Backbones that can batch the rows
// override make_slot_cache() and forward_slots() together (a cache made here is refused elsewhere).
#include <memory>
#include <vector>

#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/ops.hpp"

namespace dew {

namespace {

class PerSlotCache final : public SlotCache {
 public:
  PerSlotCache(int64_t slots, int64_t capacity) : caches_(size_t(slots)), capacity_(capacity) {}
  int64_t slots() const override { return int64_t(caches_.size()); }
  int64_t capacity() const override { return capacity_; }
  int64_t length(int64_t slot) const override {
    check(slot);
    return caches_[size_t(slot)] ? caches_[size_t(slot)]->length() : 0;
  }
  void clear(int64_t slot) override {
    check(slot);
    caches_[size_t(slot)].reset();
  }
  void check(int64_t slot) const {
    DEW_CHECK(slot >= 0 && slot < slots(), "slot cache: slot ", slot, " is outside [0, ", slots(), ")");
  }
  std::vector<std::unique_ptr<DecodeCache>> caches_;
  int64_t capacity_;
};

}  // namespace

std::unique_ptr<SlotCache> CausalDecoder::make_slot_cache(int64_t slots, int64_t capacity) const {
  DEW_CHECK(slots > 0 && capacity > 0, "make_slot_cache: slots and capacity must be positive, got ", slots, " and ",
            capacity);
  return std::make_unique<PerSlotCache>(slots, capacity);
}

Tensor CausalDecoder::forward_slots(const Tensor& tokens, const std::vector<int64_t>& slots, SlotCache& cache) {
  auto* per = dynamic_cast<PerSlotCache*>(&cache);
  DEW_CHECK(per != nullptr, "forward_slots: the cache was not made by this decoder's make_slot_cache()");
  DEW_CHECK(tokens.ndim() == 2 && int64_t(slots.size()) == tokens.shape()[0], "forward_slots: tokens ",
            shape_str(tokens.shape()), " for ", slots.size(), " slots");
  std::vector<Tensor> rows;
  for (size_t i = 0; i < slots.size(); ++i) {
    per->check(slots[i]);
    for (size_t j = 0; j < i; ++j) DEW_CHECK(slots[j] != slots[i], "forward_slots: slot ", slots[i], " fed twice");
    auto& c = per->caches_[size_t(slots[i])];
    if (!c) c = make_cache(1, per->capacity_);
    rows.push_back(forward_cached(tokens.slice0(int64_t(i), int64_t(i) + 1), *c));
  }
  return rows.size() == 1 ? rows[0] : concat(rows, 0);
}

namespace {
// The last position of logits [N, T, V], as [N, 1, V].
Tensor last_position(const Tensor& logits) {
  DEW_CHECK(logits.ndim() == 3, "decoder: logits must be [N, T, V], got ", shape_str(logits.shape()));
  const int64_t t = logits.shape()[1];
  return t == 1 ? logits : slice(logits, 1, t - 1, t);
}
}  // namespace

Tensor CausalDecoder::forward_cached_last(const Tensor& tokens, DecodeCache& cache) {
  return last_position(forward_cached(tokens, cache));
}

Tensor CausalDecoder::forward_slots_last(const Tensor& tokens, const std::vector<int64_t>& slots, SlotCache& cache) {
  return last_position(forward_slots(tokens, slots, cache));
}

}  // namespace dew
