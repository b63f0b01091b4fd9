// core/generate/weights.cpp — weight-only storage for decoding (dew/generate.hpp): the matmul weights
// rounded once to bf16 and kept so, halving the bytes every decode token streams, or quantized once to int8
// in blocks of kInt8Block columns with an f32 scale each (ggml's q8_0 layout of values: absmax / 127 per
// block; the scales live beside the weight, dew/tensor.hpp), a quarter of the f32 bytes; and the weights that
// multiply the same input (an attention's q/k/v projections, a gated MLP's gate/up) placed back to back in
// one storage, so a decode step makes one product (one weight stream, one dispatch) for each group
// (nn::Attention::project and nn::GatedMLP::forward take it when they find their weights adjacent). The weights
// cast to bf16 or int8 all go into one storage, in the parameters' order (the order a decode step multiplies them):
// one stream on 2 MiB pages instead of ~40 blocks on 4 KiB ones (char-small's bf16 token 3-10 % faster on the Zen 5,
// docs/benchmarks.md, session 28); f32 weights, not cast, keep their storages (placing them likewise measured no
// faster, and would copy them all).
// A tied head (the token embedding as the output projection) is stored the same way: a decode token streams it whole;
// the lookup widens a bf16 row to f32 exactly (nn::Embedding) and dequantizes an int8 one (dew::embedding).
// store_decode_weights_as adds the decoder's K/V cache to the same choice (CausalDecoder::set_cache_dtype), so
// `--weights bf16` halves the cache bytes a token reads too (int8 weights keep a bf16 cache).
// store_matmul_weights_in_panels lays them out in the backend's decode panels (dew/tensor.hpp), for inference only.
// Invariant: the tensors keep their identity (the impl is re-pointed at the cast or packed storage), so
// modules, caches and parameter lists that hold them see the new dtype and place without being rebuilt;
// their values are unchanged by packing (it copies bits, scales included).
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

// int8 weights: one scale per kInt8Block consecutive columns of a row (one per row when it does not divide k).
constexpr int64_t kInt8Block = 32;

// The groups of weights that multiply one input, by the Hugging Face names the bundled blocks use: for a
// prefix P, P.q_proj / P.k_proj / P.v_proj and P.gate_proj / P.up_proj (".weight"), in that order.
std::vector<std::vector<TensorImpl*>> input_groups(const std::vector<std::pair<std::string, Tensor>>& params) {
  std::map<std::string, const Tensor*> by_name;
  for (const auto& [name, p] : params) by_name[name] = &p;
  const std::vector<std::vector<std::string>> kinds = {{"q_proj", "k_proj", "v_proj"}, {"gate_proj", "up_proj"}};
  std::vector<std::vector<TensorImpl*>> groups;
  for (const auto& [name, p] : params)
    for (const auto& kind : kinds) {
      const std::string first = kind[0] + ".weight";
      if (name.size() < first.size() || name.compare(name.size() - first.size(), first.size(), first) != 0) continue;
      const std::string prefix = name.substr(0, name.size() - first.size());
      std::vector<TensorImpl*> g;
      for (const auto& member : kind) {
        auto it = by_name.find(prefix + member + ".weight");
        if (it != by_name.end() && it->second->defined()) g.push_back(it->second->impl());
      }
      if (g.size() == kind.size()) groups.push_back(g);
    }
  return groups;
}

// Places the 2-D tensors `g` (same dtype, width and backend) back to back in one new storage, in order,
// unless they already are (a quantized group's scales likewise, so its rows' scales are back to back too); a
// group that does not qualify is left as it is.
void pack_group(const std::vector<TensorImpl*>& g) {
  const TensorImpl& first = *g[0];
  int64_t rows = 0;
  bool adjacent = true;
  for (const TensorImpl* t : g) {
    if (!t || t->shape.size() != 2 || t->dtype != first.dtype || t->shape[1] != first.shape[1] ||
        t->storage->backend != first.storage->backend || (t->scales == nullptr) != (first.scales == nullptr))
      return;
    adjacent = adjacent && t->storage == first.storage && t->offset == first.offset + size_t(rows * first.shape[1]);
    rows += t->shape[0];
  }
  if (first.scales) {
    std::vector<TensorImpl*> scales;
    for (TensorImpl* t : g) scales.push_back(t->scales.get());
    pack_group(scales);
  }
  if (adjacent) return;
  const int64_t cols = first.shape[1];
  Tensor packed = Tensor::empty({rows, cols}, first.dtype, first.storage->backend);
  int64_t at = 0;
  for (TensorImpl* t : g) {
    const Tensor dst = packed.slice0(at, at + t->shape[0]);
    const char* src = static_cast<const char*>(t->storage->data) + t->offset * dtype_size(t->dtype);
    packed.backend().copy_device(dst.data(), src, dst.nbytes());
    t->storage = packed.impl()->storage;
    t->offset = packed.impl()->offset + size_t(at * cols);
    at += t->shape[0];
  }
}

// Places the tensors `ts` (one backend) back to back in one new storage, in the order given, each at a 64-byte
// boundary (a tensor whose bytes are a multiple of 64, as every decode weight's are, ends where the next begins).
// Their scales (int8) stay where they are. For the weights just cast: a decode step then streams them as one buffer
// in the order it multiplies them, and on 2 MiB pages (the cpu backend maps blocks of 2 MiB and more on huge pages;
// each cast weight alone is smaller and gets 4 KiB ones). Transient memory: the cast tensors twice, at most the f32
// weights they came from, which are gone by then. Nothing is done with fewer than two tensors or two backends.
void place_in_one_storage(const std::vector<TensorImpl*>& ts) {
  if (ts.size() < 2) return;
  const BackendPtr backend = ts[0]->storage->backend;
  size_t bytes = 0;
  std::vector<size_t> at;
  for (const TensorImpl* t : ts) {
    if (t->storage->backend != backend) return;
    bytes = (bytes + 63) & ~size_t(63);
    at.push_back(bytes);
    bytes += size_t(numel_of(t->shape)) * dtype_size(t->dtype);
  }
  Tensor arena = Tensor::empty({int64_t(bytes)}, DType::u8, backend);
  char* base = static_cast<char*>(arena.data());
  for (size_t i = 0; i < ts.size(); ++i) {
    TensorImpl* t = ts[i];
    const size_t esize = dtype_size(t->dtype);
    const char* src = static_cast<const char*>(t->storage->data) + t->offset * esize;
    arena.backend().copy_device(base + at[i], src, size_t(numel_of(t->shape)) * esize);
    t->storage = arena.impl()->storage;
    t->offset = at[i] / esize;
  }
}

// The token embedding when it is also the output projection (a tied head: no "lm_head.weight" beside a
// "...embed_tokens.weight", the Hugging Face names the bundled decoder uses), else null. A decode token streams
// all of it: 154 MB of gpt2-small's f32 token, against 170 MB for every other matmul weight in bf16. (A handle: what
// store_as does to its impl, the model's tensor sees.)
Tensor tied_head(const std::vector<std::pair<std::string, Tensor>>& params) {
  const std::string table = "embed_tokens.weight", head = "lm_head.weight";
  const auto ends_with = [](const std::string& name, const std::string& tail) {
    return name.size() >= tail.size() && name.compare(name.size() - tail.size(), tail.size(), tail) == 0;
  };
  Tensor found;
  for (const auto& [name, p] : params) {
    if (ends_with(name, head)) return Tensor();
    if (ends_with(name, table) && p.defined() && p.ndim() == 2) found = p;
  }
  return found;
}

// Re-points the f32 matrix `p` at its values stored in `dtype`, in place (modules holding it see the new dtype): bf16
// rounded once, or int8 quantized with one scale per kInt8Block columns (per row when that does not divide the
// width). Inference only: the tensor stops requiring gradients. Returns its impl.
TensorImpl& store_as(const Tensor& p, DType dtype) {
  const int64_t k = p.shape()[1];
  const Tensor c = dtype == DType::i8 ? quantize_int8(p.detach(), k % kInt8Block == 0 ? k / kInt8Block : 1)
                                      : cast(p.detach(), dtype);
  TensorImpl& impl = *p.impl();
  impl.storage = c.impl()->storage;
  impl.offset = c.impl()->offset;
  impl.dtype = dtype;
  impl.scales = c.impl()->scales;
  impl.requires_grad = false;
  impl.grad.reset();
  return impl;
}

}  // namespace

int64_t store_matmul_weights_as(const std::vector<std::pair<std::string, Tensor>>& params, DType dtype) {
  DEW_USAGE_CHECK(dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::i8,
                  "decode weights can be kept in f32, bf16 or i8 (int8), not ", dtype_name(dtype));
  NoGradGuard no_grad;
  int64_t changed = 0;
  std::vector<TensorImpl*> cast_ones;  // the tensors cast, in the parameters' order
  for (const auto& [name, p] : params) {
    if (dtype == DType::f32) break;  // f32: nothing is cast (a weight of another dtype stays so), only packed
    if (p.ndim() != 2 || name.find("embed") != std::string::npos || p.dtype() == dtype) continue;
    DEW_CHECK(p.dtype() == DType::f32, "store_matmul_weights_as: ", name, " is ", dtype_name(p.dtype()),
              ", not f32");
    cast_ones.push_back(&store_as(p, dtype));
    ++changed;
  }
  place_in_one_storage(cast_ones);  // in the parameters' order: groups (q, k, v; gate, up) come out back to back
  for (const auto& g : input_groups(params)) pack_group(g);
  if (const Tensor table = tied_head(params); table.defined() && dtype != DType::f32 && table.dtype() == DType::f32) {
    store_as(table, dtype);
    ++changed;
  }
  return changed;
}

int64_t store_matmul_weights_in_panels(const std::vector<std::pair<std::string, Tensor>>& params) {
  NoGradGuard no_grad;
  int64_t changed = 0;
  std::map<Backend*, int64_t> streamed;  // per backend: the bytes of every matrix (decode_weights_placed)
  for (const auto& [name, p] : params)
    if (p.defined() && p.ndim() == 2)
      streamed[&p.backend()] += int64_t(p.nbytes()) + (p.quantized() ? int64_t(p.scales().nbytes()) : 0);
  for (const auto& [name, p] : params) {
    if (!p.defined() || p.ndim() != 2 || name.find("embed") != std::string::npos || p.panel_rows() > 0 || p.quantized())
      continue;
    const int64_t rows = p.backend().decode_panel_rows(p.dtype());
    if (rows <= 0 || p.size(0) % rows != 0) continue;
    // In place, in the storage the tensor already has (a group placed back to back stays so: its members'
    // rows are whole panels, so each member's panels are where its rows were).
    std::vector<unsigned char> values(p.nbytes());
    p.copy_to_host(values.data());
    p.impl()->panel = rows;
    p.impl()->requires_grad = false;
    p.impl()->grad.reset();
    Tensor(p).copy_from_host(values.data());
    ++changed;
  }
  for (const auto& [backend, bytes] : streamed) backend->decode_weights_placed(bytes);
  return changed;
}

int64_t store_decode_weights_as(CausalDecoder* decoder, const std::vector<std::pair<std::string, Tensor>>& params,
                                DType dtype) {
  const int64_t changed = store_matmul_weights_as(params, dtype);  // checks the dtype first
  if (decoder) decoder->set_cache_dtype(dtype == DType::i8 ? DType::bf16 : dtype);
  return changed;
}

// The default decoder keeps an f32 cache (a backbone with a bf16 cache overrides both accessors).
void CausalDecoder::set_cache_dtype(DType dtype) {
  DEW_USAGE_CHECK(dtype == DType::f32, "this decoder keeps its K/V cache in f32 only, not ", dtype_name(dtype));
}

DType weights_dtype_from_name(const std::string& name, const char* what) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  if (name == "int8") return DType::i8;
  DEW_USAGE_CHECK(false, what, " '", name, "' is not one of f32, bf16, int8");
  return DType::f32;
}

std::optional<DType> kv_cache_dtype_from_name(const std::string& name, const char* what) {
  if (name == "auto") return std::nullopt;
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  DEW_USAGE_CHECK(false, what, " '", name, "' is not one of auto, f32, bf16");
  return std::nullopt;
}

}  // namespace dew
