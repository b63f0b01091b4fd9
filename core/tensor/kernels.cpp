// core/tensor/kernels.cpp — names of the kernel algebra (for supports() reports and the conformance tool).
#include "dew/backend.hpp"
#include "dew/error.hpp"

namespace dew {

namespace {
constexpr const char* kKernelNames[] = {"fill",
                                        "cast",
                                        "strided_copy",
                                        "matmul",
                                        "unary",
                                        "unary_backward",
                                        "binary",
                                        "reduce",
                                        "softmax",
                                        "softmax_backward",
                                        "log_softmax",
                                        "log_softmax_backward",
                                        "layer_norm",
                                        "layer_norm_backward",
                                        "rms_norm",
                                        "rms_norm_backward",
                                        "group_norm",
                                        "group_norm_backward",
                                        "gather_rows",
                                        "scatter_add_rows",
                                        "rope",
                                        "attention",
                                        "attention_backward",
                                        "conv2d",
                                        "conv2d_backward_data",
                                        "conv2d_backward_weight",
                                        "cross_entropy",
                                        "cross_entropy_backward",
                                        "adamw_update",
                                        "sgd_update",
                                        "lamb_update",
                                        "random",
                                        "dropout",
                                        "argmax"};
static_assert(sizeof(kKernelNames) / sizeof(kKernelNames[0]) == size_t(Kernel::count_), "every Kernel needs a name");
}  // namespace

const char* kernel_name(Kernel k) { return kKernelNames[size_t(k)]; }

Kernel kernel_from_name(const std::string& name) {
  std::string known;
  for (size_t i = 0; i < size_t(Kernel::count_); ++i) {
    if (name == kKernelNames[i]) return Kernel(i);
    known += (i ? ", " : "") + std::string(kKernelNames[i]);
  }
  DEW_USAGE_CHECK(false, "unknown kernel '", name, "'; known: ", known);
  return Kernel::fill;
}

}  // namespace dew
