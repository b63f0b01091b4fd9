// core/tensor/kernels.cpp — names of the kernel algebra and its ops (supports() reports, the conformance tool,
// the profiler).
#include "dew/backend.hpp"
#include "dew/error.hpp"

namespace dew {

namespace {
constexpr const char* kKernelNames[] = {
#define DEW_KERNEL_NAME_(name, params, args) #name,
    DEW_KERNEL_TABLE(DEW_KERNEL_NAME_)
#undef DEW_KERNEL_NAME_
};
static_assert(sizeof(kKernelNames) / sizeof(kKernelNames[0]) == size_t(Kernel::count_), "every Kernel needs a name");
constexpr const char* kUnaryNames[] = {"neg",  "exp",        "log",    "sqrt", "rsqrt",     "square", "abs",
                                       "tanh", "sigmoid",    "relu",   "gelu", "gelu_tanh", "silu",   "sin",
                                       "cos",  "reciprocal", "affine", "pow",  "clamp",     "softcap"};
static_assert(sizeof(kUnaryNames) / sizeof(kUnaryNames[0]) == size_t(UnaryOp::softcap) + 1,
              "every UnaryOp needs a name");
constexpr const char* kBinaryNames[] = {"add", "sub", "mul", "div", "maximum", "minimum", "eq", "gt", "lt"};
static_assert(sizeof(kBinaryNames) / sizeof(kBinaryNames[0]) == size_t(BinaryOp::lt) + 1,
              "every BinaryOp needs a name");
constexpr const char* kReduceNames[] = {"sum", "mean", "max", "min", "sumsq"};
static_assert(sizeof(kReduceNames) / sizeof(kReduceNames[0]) == size_t(ReduceOp::sumsq) + 1,
              "every ReduceOp needs a name");
constexpr const char* kRopeScalingNames[] = {"none", "linear", "llama3", "yarn"};
static_assert(sizeof(kRopeScalingNames) / sizeof(kRopeScalingNames[0]) == size_t(RopeScalingKind::yarn) + 1,
              "every RopeScalingKind needs a name");
template <size_t N>
const char* name_of(const char* const (&names)[N], size_t i) {
  return i < N ? names[i] : "?";
}
}  // namespace

const char* kernel_name(Kernel k) { return kKernelNames[size_t(k)]; }
const char* unary_op_name(UnaryOp op) { return name_of(kUnaryNames, size_t(op)); }
const char* binary_op_name(BinaryOp op) { return name_of(kBinaryNames, size_t(op)); }
const char* reduce_op_name(ReduceOp op) { return name_of(kReduceNames, size_t(op)); }
const char* rope_scaling_name(RopeScalingKind kind) { return name_of(kRopeScalingNames, size_t(kind)); }

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
