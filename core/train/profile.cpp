// core/train/profile.cpp — ProfilingBackend: forwarding, labels and the report (see dew/profile.hpp).
#include "dew/profile.hpp"

#include <algorithm>
#include <cstdio>
#include <vector>

#include "dew/kernel_contracts.hpp"  // is_widened_matmul
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
  if (device_clock_)
    add("profile: %lld steps, %.1f ms per step, %.1f ms of it in kernels by the device clock (%.1f %%; the step "
        "unsynchronised)\n",
        (long long)steps, step_ms, total_ms, 100.0 * total_ms / step_ms);
  else
    add("profile: %lld steps, %.1f ms per step, %.1f ms of it in kernels (%.1f %%; synchronised per kernel)\n",
        (long long)steps, step_ms, total_ms, 100.0 * total_ms / step_ms);
  add("%9s %8s %6s %9s  %s\n", "ms/step", "calls", "share", "longest", "kernel");
  for (const auto& [label, s] : rows)
    add("%9.3f %8.1f %5.1f%% %9.3f  %s\n", s.seconds * 1e3 / n, double(s.calls) / n,
        100.0 * s.seconds * 1e3 / n / step_ms, s.longest * 1e3, label.c_str());
  add("%9.3f %8s %5.1f%% %9s  %s\n", step_ms - total_ms, "", 100.0 * (step_ms - total_ms) / step_ms, "",
      device_clock_ ? "device idle (host work not hidden behind the kernels: autograd, allocation, dispatch)"
                    : "outside the kernels (autograd, allocation, dispatch, host code)");
  return out;
}

void ProfilingBackend::settle() {
  if (pending_.empty()) return;
  inner_->synchronize();
  for (const Pending& p : pending_) p.stat->add(inner_->device_elapsed_ms(p.from, p.to) * 1e-3);
  pending_.clear();
  inner_->device_marks_release();
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
std::string ProfilingBackend::kernel_label(Kernel, const Tensor& a, const Tensor& b, const Tensor& bias,
                                           const Tensor& out, const MatmulParams& p) {
  // a widened product (half a and b, f32 out: a gradient under autocast) apart from the half product of its shape
  std::string label = matmul_label(p, bias.defined()) + (contracts::is_widened_matmul(a, b, out) ? " ->f32" : "");
  if (!products_.count(label)) {
    Product q;
    q.label = label, q.params = p, q.has_bias = bias.defined();
    q.a = a.dtype(), q.b = b.dtype(), q.out = out.dtype(), q.bias = bias.defined() ? bias.dtype() : out.dtype();
    products_.emplace(label, q);
  }
  return label;
}
std::string ProfilingBackend::kernel_label(Kernel k, const Tensor&, const Tensor&, const UnaryParams& p) {
  return std::string(kernel_name(k)) + " " + unary_op_name(p.op);
}
std::string ProfilingBackend::kernel_label(Kernel k, const Tensor&, const Tensor&, const Tensor&, const UnaryParams& p) {
  return std::string(kernel_name(k)) + " " + unary_op_name(p.op);
}
std::string ProfilingBackend::kernel_label(Kernel k, const Tensor& a, const Tensor& b, const Tensor& out, BinaryOp op) {
  const bool broadcast = a.numel() != out.numel() || b.numel() != out.numel();
  return std::string(kernel_name(k)) + " " + binary_op_name(op) + (broadcast ? " (broadcast)" : "");
}
std::string ProfilingBackend::kernel_label(Kernel k, const Tensor&, const Tensor&, const ReduceParams& p) {
  return std::string(kernel_name(k)) + " " + reduce_op_name(p.op);
}

}  // namespace dew
