// core/train/profile.cpp — ProfilingBackend: forwarding, labels and the report (see dew/profile.hpp).
#include "dew/profile.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

namespace {

std::string matmul_label(const MatmulParams& p, bool bias) {
  char buf[160];
  std::snprintf(buf, sizeof buf, "matmul %lldx%lldx%lld%s%s%s%s", (long long)p.m, (long long)p.k, (long long)p.n,
                p.trans_a ? " At" : "", p.trans_b ? " Bt" : "", bias ? " +bias" : "",
                p.batch > 1 ? (" batch " + std::to_string(p.batch)).c_str() : "");
  return buf;
}

}  // namespace

std::string ProfilingBackend::report(int64_t steps, double step_ms) const {
  std::vector<std::pair<std::string, Stat>> rows(stats_.begin(), stats_.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  const double n = double(std::max<int64_t>(steps, 1));
  double total_ms = 0;
  for (const auto& [label, s] : rows) total_ms += s.seconds * 1e3 / n;
  std::string out;
  char line[512];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("profile: %lld steps, %.1f ms per step, %.1f ms of it in kernels (%.1f %%)\n", (long long)steps, step_ms,
      total_ms, 100.0 * total_ms / step_ms);
  add("%9s %8s %6s  %s\n", "ms/step", "calls", "share", "kernel");
  for (const auto& [label, s] : rows)
    add("%9.3f %8.1f %5.1f%%  %s\n", s.seconds * 1e3 / n, double(s.calls) / n, 100.0 * s.seconds * 1e3 / n / step_ms,
        label.c_str());
  add("%9.3f %8s %5.1f%%  outside the kernels (autograd, allocation, dispatch, host code)\n", step_ms - total_ms, "",
      100.0 * (step_ms - total_ms) / step_ms);
  return out;
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
void ProfilingBackend::fill(Tensor& out, double value) {
  timed("fill", [&] { inner_->fill(out, value); });
}
void ProfilingBackend::cast(const Tensor& x, Tensor& out) {
  timed("cast", [&] { inner_->cast(x, out); });
}
void ProfilingBackend::strided_copy(const Tensor& src, Tensor& dst, const StridedCopyParams& p) {
  timed("strided_copy", [&] { inner_->strided_copy(src, dst, p); });
}
void ProfilingBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out,
                              const MatmulParams& p) {
  timed([&] { return matmul_label(p, bias.defined()); }, [&] { inner_->matmul(a, b, bias, out, p); });
}
void ProfilingBackend::unary(const Tensor& x, Tensor& out, const UnaryParams& p) {
  timed([&] { return std::string("unary ") + unary_op_name(p.op); }, [&] { inner_->unary(x, out, p); });
}
void ProfilingBackend::unary_backward(const Tensor& x, const Tensor& dy, Tensor& dx, const UnaryParams& p) {
  timed([&] { return std::string("unary_backward ") + unary_op_name(p.op); },
        [&] { inner_->unary_backward(x, dy, dx, p); });
}
void ProfilingBackend::binary(const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) {
  timed(
      [&] {
        const bool broadcast = a.numel() != out.numel() || b.numel() != out.numel();
        return std::string("binary ") + binary_op_name(op) + (broadcast ? " (broadcast)" : "");
      },
      [&] { inner_->binary(a, b, out, op); });
}
void ProfilingBackend::reduce(const Tensor& x, Tensor& out, const ReduceParams& p) {
  timed([&] { return std::string("reduce ") + reduce_op_name(p.op); }, [&] { inner_->reduce(x, out, p); });
}
void ProfilingBackend::softmax(const Tensor& x, Tensor& y) {
  timed("softmax", [&] { inner_->softmax(x, y); });
}
void ProfilingBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  timed("softmax_backward", [&] { inner_->softmax_backward(y, dy, dx); });
}
void ProfilingBackend::log_softmax(const Tensor& x, Tensor& y) {
  timed("log_softmax", [&] { inner_->log_softmax(x, y); });
}
void ProfilingBackend::log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  timed("log_softmax_backward", [&] { inner_->log_softmax_backward(y, dy, dx); });
}
void ProfilingBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                                  Tensor& rstd, float eps) {
  timed("layer_norm", [&] { inner_->layer_norm(x, weight, bias, y, mean, rstd, eps); });
}
void ProfilingBackend::layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                                           const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                                           Tensor& dbias) {
  timed("layer_norm_backward", [&] { inner_->layer_norm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias); });
}
void ProfilingBackend::rms_norm(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                                float weight_offset) {
  timed("rms_norm", [&] { inner_->rms_norm(x, weight, y, rstd, eps, weight_offset); });
}
void ProfilingBackend::rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                                         Tensor& dx, Tensor& dweight, float weight_offset) {
  timed("rms_norm_backward", [&] { inner_->rms_norm_backward(x, weight, rstd, dy, dx, dweight, weight_offset); });
}
void ProfilingBackend::group_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                                  Tensor& rstd, int64_t groups, float eps) {
  timed("group_norm", [&] { inner_->group_norm(x, weight, bias, y, mean, rstd, groups, eps); });
}
void ProfilingBackend::group_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                                           const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                                           Tensor& dbias, int64_t groups) {
  timed("group_norm_backward",
        [&] { inner_->group_norm_backward(x, weight, mean, rstd, dy, dx, dweight, dbias, groups); });
}
void ProfilingBackend::gather_rows(const Tensor& src, const Tensor& idx, Tensor& out) {
  timed("gather_rows", [&] { inner_->gather_rows(src, idx, out); });
}
void ProfilingBackend::scatter_add_rows(const Tensor& dout, const Tensor& idx, Tensor& dsrc) {
  timed("scatter_add_rows", [&] { inner_->scatter_add_rows(dout, idx, dsrc); });
}
void ProfilingBackend::rope(const Tensor& x, const Tensor& positions, Tensor& out, const RopeParams& p) {
  timed("rope", [&] { inner_->rope(x, positions, out, p); });
}
void ProfilingBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                                 const AttentionParams& p) {
  timed("attention", [&] { inner_->attention(q, k, v, out, lse, p); });
}
void ProfilingBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                                          const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                                          const AttentionParams& p) {
  timed("attention_backward", [&] { inner_->attention_backward(q, k, v, out, lse, dout, dq, dk, dv, p); });
}
void ProfilingBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const Conv2dParams& p) {
  timed("conv2d", [&] { inner_->conv2d(x, w, bias, y, p); });
}
void ProfilingBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p) {
  timed("conv2d_backward_data", [&] { inner_->conv2d_backward_data(dy, w, dx, p); });
}
void ProfilingBackend::conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                                              const Conv2dParams& p) {
  timed("conv2d_backward_weight", [&] { inner_->conv2d_backward_weight(x, dy, dw, dbias, p); });
}
void ProfilingBackend::cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                                     const CrossEntropyParams& p) {
  timed("cross_entropy", [&] { inner_->cross_entropy(logits, targets, loss, lse, p); });
}
void ProfilingBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                              const Tensor& dloss, Tensor& dlogits, const CrossEntropyParams& p) {
  timed("cross_entropy_backward", [&] { inner_->cross_entropy_backward(logits, targets, lse, dloss, dlogits, p); });
}
void ProfilingBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p) {
  timed("adamw_update", [&] { inner_->adamw_update(param, grad, m, v, p); });
}
void ProfilingBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) {
  timed("sgd_update", [&] { inner_->sgd_update(param, grad, momentum_buf, p); });
}
void ProfilingBackend::lamb_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const LambParams& p) {
  timed("lamb_update", [&] { inner_->lamb_update(param, grad, m, v, p); });
}
void ProfilingBackend::random(Tensor& out, const RandomParams& p) {
  timed("random", [&] { inner_->random(out, p); });
}
void ProfilingBackend::dropout(const Tensor& x, Tensor& y, Tensor& mask, const DropoutParams& p) {
  timed("dropout", [&] { inner_->dropout(x, y, mask, p); });
}
void ProfilingBackend::argmax(const Tensor& x, Tensor& out) {
  timed("argmax", [&] { inner_->argmax(x, out); });
}

}  // namespace dew
