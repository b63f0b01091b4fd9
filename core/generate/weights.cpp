// core/generate/weights.cpp — weight-only storage for decoding (dew/generate.hpp): the matmul weights
// rounded once to bf16 and kept so, halving the bytes every decode token streams.
// Invariant: the tensors keep their identity (the impl is re-pointed at the cast storage), so modules,
// caches and parameter lists that hold them see the new dtype without being rebuilt.
#include <string>
#include <utility>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/ops.hpp"

namespace dew {

int64_t store_matmul_weights_as(const std::vector<std::pair<std::string, Tensor>>& params, DType dtype) {
  DEW_USAGE_CHECK(dtype == DType::f32 || dtype == DType::bf16, "decode weights can be kept in f32 or bf16, not ",
                  dtype_name(dtype));
  NoGradGuard no_grad;
  int64_t changed = 0;
  for (const auto& [name, p] : params) {
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
  return changed;
}

DType weights_dtype_from_name(const std::string& name, const char* what) {
  if (name == "f32") return DType::f32;
  if (name == "bf16") return DType::bf16;
  DEW_USAGE_CHECK(false, what, " '", name, "' is not one of f32, bf16");
  return DType::f32;
}

}  // namespace dew
