// tools/dew-bench/profile.cpp — ProfilingBackend: forwarding, labels and the report (see profile.hpp).
#include "profile.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "dew/tensor.hpp"

namespace dew_bench {

namespace {

const char* unary_name(dew::UnaryOp op) {
  static const char* names[] = {"neg",  "exp",        "log",    "sqrt", "rsqrt",     "square", "abs",
                                "tanh", "sigmoid",    "relu",   "gelu", "gelu_tanh", "silu",   "sin",
                                "cos",  "reciprocal", "affine", "pow",  "clamp",     "softcap"};
  const size_t i = size_t(op);
  return i < sizeof names / sizeof *names ? names[i] : "?";
}
const char* binary_name(dew::BinaryOp op) {
  static const char* names[] = {"add", "sub", "mul", "div", "maximum", "minimum", "eq", "gt", "lt"};
  const size_t i = size_t(op);
  return i < sizeof names / sizeof *names ? names[i] : "?";
}
const char* reduce_name(dew::ReduceOp op) {
  static const char* names[] = {"sum", "mean", "max", "min", "sumsq"};
  const size_t i = size_t(op);
  return i < sizeof names / sizeof *names ? names[i] : "?";
}
std::string matmul_label(const dew::MatmulParams& p, bool bias) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "matmul %lldx%lldx%lld%s%s%s%s", (long long)p.m, (long long)p.k, (long long)p.n,
                p.trans_a ? " At" : "", p.trans_b ? " Bt" : "", bias ? " +bias" : "",
                p.batch > 1 ? (" batch " + std::to_string(p.batch)).c_str() : "");
  return buf;
}

}  // namespace

void ProfilingBackend::report(int steps, double step_ms) const {
  std::vector<std::pair<std::string, Stat>> rows(stats_.begin(), stats_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  double total_ms = 0;
  for (const auto& [label, s] : rows) total_ms += s.seconds * 1e3 / steps;
  std::fprintf(stderr, "# profile: %d steps, %.1f ms per step, %.1f ms of it in kernels (%.1f %%)\n", steps, step_ms,
               total_ms, 100.0 * total_ms / step_ms);
  std::fprintf(stderr, "# %9s %8s %6s  %s\n", "ms/step", "calls", "share", "kernel");
  for (const auto& [label, s] : rows)
    std::fprintf(stderr, "# %9.2f %8.1f %5.1f%%  %s\n", s.seconds * 1e3 / steps, double(s.calls) / steps,
                 100.0 * s.seconds * 1e3 / steps / step_ms, label.c_str());
  std::fprintf(stderr, "# %9.2f %8s %5.1f%%  outside the kernels (autograd, allocation, dispatch, host code)\n",
               step_ms - total_ms, "", 100.0 * (step_ms - total_ms) / step_ms);
}

void ProfilingBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  timed("copy_from_host", [&] { inner_->copy_from_host(dst, src, bytes); });
}
void ProfilingBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  timed("copy_to_host", [&] { inner_->copy_to_host(dst, src, bytes); });
}
void ProfilingBackend::copy_device(void* dst, const void* src, size_t bytes) {
  timed("copy_device", [&] { inner_->copy_device(dst, src, bytes); });
}
void ProfilingBackend::fill(dew::Tensor& out, double value) {
  timed("fill", [&] { inner_->fill(out, value); });
}
void ProfilingBackend::cast(const dew::Tensor& x, dew::Tensor& out) {
  timed("cast", [&] { inner_->cast(x, out); });
}
void ProfilingBackend::strided_copy(const dew::Tensor& src, dew::Tensor& dst, const dew::StridedCopyParams& p) {
  timed("strided_copy", [&] { inner_->strided_copy(src, dst, p); });
}
void ProfilingBackend::matmul(const dew::Tensor& a, const dew::Tensor& b, const dew::Tensor& bias, dew::Tensor& out,
                              const dew::MatmulParams& p) {
  timed(matmul_label(p, bias.defined()), [&] { inner_->matmul(a, b, bias, out, p); });
}
void ProfilingBackend::unary(const dew::Tensor& x, dew::Tensor& out, const dew::UnaryParams& p) {
  timed(std::string("unary ") + unary_name(p.op), [&] { inner_->unary(x, out, p); });
}
void ProfilingBackend::unary_backward(const dew::Tensor& x, const dew::Tensor& dy, dew::Tensor& dx,
                                      const dew::UnaryParams& p) {
  timed(std::string("unary_backward ") + unary_name(p.op), [&] { inner_->unary_backward(x, dy, dx, p); });
}
void ProfilingBackend::binary(const dew::Tensor& a, const dew::Tensor& b, dew::Tensor& out, dew::BinaryOp op) {
  const bool broadcast = a.numel() != out.numel() || b.numel() != out.numel();
  timed(std::string("binary ") + binary_name(op) + (broadcast ? " (broadcast)" : ""),
        [&] { inner_->binary(a, b, out, op); });
}
void ProfilingBackend::reduce(const dew::Tensor& x, dew::Tensor& out, const dew::ReduceParams& p) {
  timed(std::string("reduce ") + reduce_name(p.op), [&] { inner_->reduce(x, out, p); });
}
void ProfilingBackend::softmax(const dew::Tensor& x, dew::Tensor& y) {
  timed("softmax", [&] { inner_->softmax(x, y); });
}
void ProfilingBackend::softmax_backward(const dew::Tensor& y, const dew::Tensor& dy, dew::Tensor& dx) {
  timed("softmax_backward", [&] { inner_->softmax_backward(y, dy, dx); });
}
void ProfilingBackend::log_softmax(const dew::Tensor& x, dew::Tensor& y) {
  timed("log_softmax", [&] { inner_->log_softmax(x, y); });
}
void ProfilingBackend::log_softmax_backward(const dew::Tensor& y, const dew::Tensor& dy, dew::Tensor& dx) {
  timed("log_softmax_backward", [&] { inner_->log_softmax_backward(y, dy, dx); });
}
void ProfilingBackend::layer_norm(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& bias,
                                  dew::Tensor& y, dew::Tensor& mean, dew::Tensor& rstd, float eps) {
  timed("layer_norm", [&] { inner_->layer_norm(x, weight, bias, y, mean, rstd, eps); });
}
void ProfilingBackend::layer_norm_backward(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& mean,
                                           const dew::Tensor& rstd, const dew::Tensor& dy, dew::Tensor& dx,
                                           dew::Tensor& dweight, dew::Tensor& dbias) {
  timed("layer_norm_backward", [&] { inner_->layer_norm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias); });
}
void ProfilingBackend::rms_norm(const dew::Tensor& x, const dew::Tensor& weight, dew::Tensor& y, dew::Tensor& rstd,
                                float eps, float weight_offset) {
  timed("rms_norm", [&] { inner_->rms_norm(x, weight, y, rstd, eps, weight_offset); });
}
void ProfilingBackend::rms_norm_backward(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& rstd,
                                         const dew::Tensor& dy, dew::Tensor& dx, dew::Tensor& dweight,
                                         float weight_offset) {
  timed("rms_norm_backward", [&] { inner_->rms_norm_backward(x, weight, rstd, dy, dx, dweight, weight_offset); });
}
void ProfilingBackend::group_norm(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& bias,
                                  dew::Tensor& y, dew::Tensor& mean, dew::Tensor& rstd, int64_t groups, float eps) {
  timed("group_norm", [&] { inner_->group_norm(x, weight, bias, y, mean, rstd, groups, eps); });
}
void ProfilingBackend::group_norm_backward(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& mean,
                                           const dew::Tensor& rstd, const dew::Tensor& dy, dew::Tensor& dx,
                                           dew::Tensor& dweight, dew::Tensor& dbias, int64_t groups) {
  timed("group_norm_backward",
        [&] { inner_->group_norm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias, groups); });
}
void ProfilingBackend::gather_rows(const dew::Tensor& src, const dew::Tensor& idx, dew::Tensor& out) {
  timed("gather_rows", [&] { inner_->gather_rows(src, idx, out); });
}
void ProfilingBackend::scatter_add_rows(const dew::Tensor& dout, const dew::Tensor& idx, dew::Tensor& dsrc) {
  timed("scatter_add_rows", [&] { inner_->scatter_add_rows(dout, idx, dsrc); });
}
void ProfilingBackend::rope(const dew::Tensor& x, const dew::Tensor& positions, dew::Tensor& out,
                            const dew::RopeParams& p) {
  timed("rope", [&] { inner_->rope(x, positions, out, p); });
}
void ProfilingBackend::attention(const dew::Tensor& q, const dew::Tensor& k, const dew::Tensor& v, dew::Tensor& out,
                                 dew::Tensor& lse, const dew::AttentionParams& p) {
  timed("attention", [&] { inner_->attention(q, k, v, out, lse, p); });
}
void ProfilingBackend::attention_backward(const dew::Tensor& q, const dew::Tensor& k, const dew::Tensor& v,
                                          const dew::Tensor& out, const dew::Tensor& lse, const dew::Tensor& dout,
                                          dew::Tensor& dq, dew::Tensor& dk, dew::Tensor& dv,
                                          const dew::AttentionParams& p) {
  timed("attention_backward", [&] { inner_->attention_backward(q, k, v, out, lse, dout, dq, dk, dv, p); });
}
void ProfilingBackend::conv2d(const dew::Tensor& x, const dew::Tensor& w, const dew::Tensor& bias, dew::Tensor& y,
                              const dew::Conv2dParams& p) {
  timed("conv2d", [&] { inner_->conv2d(x, w, bias, y, p); });
}
void ProfilingBackend::conv2d_backward_data(const dew::Tensor& dy, const dew::Tensor& w, dew::Tensor& dx,
                                            const dew::Conv2dParams& p) {
  timed("conv2d_backward_data", [&] { inner_->conv2d_backward_data(dy, w, dx, p); });
}
void ProfilingBackend::conv2d_backward_weight(const dew::Tensor& x, const dew::Tensor& dy, dew::Tensor& dw,
                                              dew::Tensor& dbias, const dew::Conv2dParams& p) {
  timed("conv2d_backward_weight", [&] { inner_->conv2d_backward_weight(x, dy, dw, dbias, p); });
}
void ProfilingBackend::cross_entropy(const dew::Tensor& logits, const dew::Tensor& targets, dew::Tensor& loss,
                                     dew::Tensor& lse, const dew::CrossEntropyParams& p) {
  timed("cross_entropy", [&] { inner_->cross_entropy(logits, targets, loss, lse, p); });
}
void ProfilingBackend::cross_entropy_backward(const dew::Tensor& logits, const dew::Tensor& targets,
                                              const dew::Tensor& lse, const dew::Tensor& dloss, dew::Tensor& dlogits,
                                              const dew::CrossEntropyParams& p) {
  timed("cross_entropy_backward", [&] { inner_->cross_entropy_backward(logits, targets, lse, dloss, dlogits, p); });
}
void ProfilingBackend::adamw_update(dew::Tensor& param, const dew::Tensor& grad, dew::Tensor& m, dew::Tensor& v,
                                    const dew::AdamWParams& p) {
  timed("adamw_update", [&] { inner_->adamw_update(param, grad, m, v, p); });
}
void ProfilingBackend::sgd_update(dew::Tensor& param, const dew::Tensor& grad, dew::Tensor& momentum_buf,
                                  const dew::SgdParams& p) {
  timed("sgd_update", [&] { inner_->sgd_update(param, grad, momentum_buf, p); });
}
void ProfilingBackend::lamb_update(dew::Tensor& param, const dew::Tensor& grad, dew::Tensor& m, dew::Tensor& v,
                                   const dew::LambParams& p) {
  timed("lamb_update", [&] { inner_->lamb_update(param, grad, m, v, p); });
}
void ProfilingBackend::random(dew::Tensor& out, const dew::RandomParams& p) {
  timed("random", [&] { inner_->random(out, p); });
}
void ProfilingBackend::dropout(const dew::Tensor& x, dew::Tensor& y, dew::Tensor& mask, const dew::DropoutParams& p) {
  timed("dropout", [&] { inner_->dropout(x, y, mask, p); });
}
void ProfilingBackend::argmax(const dew::Tensor& x, dew::Tensor& out) {
  timed("argmax", [&] { inner_->argmax(x, out); });
}

}  // namespace dew_bench
