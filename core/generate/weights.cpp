// core/generate/weights.cpp — weight-only storage for decoding (dew/generate.hpp): the matmul weights
// rounded once to bf16 and kept so, halving the bytes every decode token streams; and the weights that
// multiply the same input (an attention's q/k/v projections, a gated MLP's gate/up) placed back to back in
// one storage, so a decode step makes one product (one weight stream, one dispatch) for each group
// (nn::Attention::project and nn::GatedMLP::forward take it when they find their weights adjacent).
// store_decode_weights_as adds the decoder's K/V cache to the same choice (CausalDecoder::set_cache_dtype), so
// `--weights bf16` halves the cache bytes a token reads too.
// Invariant: the tensors keep their identity (the impl is re-pointed at the cast or packed storage), so
// modules, caches and parameter lists that hold them see the new dtype and place without being rebuilt;
// their values are unchanged (packing copies bits).
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/ops.hpp"

namespace dew {

namespace {

// The groups of weights that multiply one input, by the Hugging Face names the bundled blocks use: for a
// prefix P, P.q_proj / P.k_proj / P.v_proj and P.gate_proj / P.up_proj (".weight"), in that order.
std::vector<std::vector<const Tensor*>> input_groups(const std::vector<std::pair<std::string, Tensor>>& params) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, p] : params) by_name[name] = &p;
  const std::vector<std::vector<std::string>> kinds = {{"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}};
  std::vector<std::vector<const Tensor*>> groups;
  for (const auto& [name, p] : params)
    for (const auto& kind : kinds) {
      const std::string first = kind[0] + ".weight";
      if (name.size() < first.size() || name.compare(name.size() - first.size(), first.size(), first) != 0) continue;
      const std::string prefix = name.substr(0, name.size() - first.size());
      std::vector<const Tensor*> g;
      for (const auto& member : kind) {
        auto it = by_name.find(prefix + member + ".weight");
        if (it != by_name.end()) g.push_back(it->second);
      }
      if (g.size() == kind.size()) groups.push_back(g);
    }
  return groups;
}

// Places the 2-D weights of `g` (same dtype, width and backend) back to back in one new storage, in order,
// unless they already are; a group that does not qualify is left as it is.
void pack_group(const std::vector<const Tensor*>& g) {
  const Tensor& first = *g[0];
  int64_t rows = 0;
  bool adjacent = true;
  for (const Tensor* t : g) {
    if (!t->defined() || t->ndim() != 2 || t->dtype() != first.dtype() || t->shape()[1] != first.shape()[1] ||
        t->backend_ptr() != first.backend_ptr())
      return;
    adjacent = adjacent && t->impl()->storage == first.impl()->storage &&
               t->impl()->offset == first.impl()->offset + size_t(rows * first.shape()[1]);
    rows += t->shape()[0];
  }
  if (adjacent) return;
  const int64_t cols = first.shape()[1];
  Tensor packed = Tensor::empty({rows, cols}, first.dtype(), first.backend_ptr());
  int64_t at = 0;
  for (const Tensor* t : g) {
    Tensor dst = packed.slice0(at, at + t->shape()[0]);
    first.backend().copy_device(dst.data(), t->data(), t->nbytes());
    TensorImpl& impl = *t->impl();
    impl.storage = packed.impl()->storage;
    impl.offset = packed.impl()->offset + size_t(at * cols);
    at += t->shape()[0];
  }
}

}  // namespace

int64_t store_matmul_weights_as(const std::vector<std::pair<std::string, Tensor>>& params, DType dtype) {
  DEW_USAGE_CHECK(dtype == DType::f32 || dtype == DType::bf16, "decode weights can be kept in f32 or bf16, not ",
                  dtype_name(dtype));
  NoGradGuard no_grad;
  int64_t changed = 0;
  for (const auto& [name, p] : params) {
    if (dtype == DType::f32) break;  // f32: nothing is cast (a weight of another dtype stays so), only packed
    if (p.ndim() != 2 || name.find("embed") != std::string::npos || p.dtype() == dtype) continue;
    DEW_CHECK(p.dtype() == DType::f32, "store_matmul_weights_as: ", name, " is ", dtype_name(p.dtype()),
              ", not f32");
    const Tensor c = cast(p.detach(), dtype);
    TensorImpl& impl = *p.impl();
    impl.storage = c.impl()->storage;
    impl.offset = c.impl()->offset;
    impl.dtype = dtype;
    impl.requires_grad = false;
    impl.grad.reset();
    ++changed;
  }
  for (const auto& g : input_groups(params)) pack_group(g);
  return changed;
}

int64_t store_decode_weights_as(CausalDecoder* decoder, const std::vector<std::pair<std::string, Tensor>>& params,
                                DType dtype) {
  const int64_t changed = store_matmul_weights_as(params, dtype);  // checks the dtype first
  if (decoder) decoder->set_cache_dtype(dtype);
  return changed;
}

// The default decoder keeps an f32 cache (a backbone with a bf16 cache overrides both accessors).
void CausalDecoder::set_cache_dtype(DType dtype) {
  DEW_USAGE_CHECK(dtype == DType::f32, "this decoder keeps its K/V cache in f32 only, not ", dtype_name(dtype));
}

DType weights_dtype_from_name(const std::string& name, const char* what) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  DEW_USAGE_CHECK(false, what, " '", name, "' is not one of f32, bf16");
  return DType::f32;
}

}  // namespace dew
