// tools/dew-bench/profile.hpp — `--profile`: where a training step's time goes, kernel by kernel.
//
// ProfilingBackend wraps the benchmarked backend: every call of the kernel algebra is forwarded and timed
// (wall clock around the call, after synchronize() on asynchronous backends so the time is the kernel's,
// not its enqueueing), and aggregated under a label — the kernel's name, with the op for unary / binary /
// reduce and the shape for matmul (m x k x n, transposes, batch). Memory calls are forwarded untimed.
// Tensors allocated through the wrapper carry it as their backend, so every op of the model reaches it.
// The report sorts labels by time and says what share of the timed steps they cover; the rest is the
// framework around the kernels (autograd, allocation, dispatch). Invariant: results are the wrapped
// backend's, bit for bit (the wrapper only reads the clock).
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>

#include "dew/backend.hpp"

namespace dew_bench {

class ProfilingBackend final : public dew::Backend {
 public:
  explicit ProfilingBackend(dew::BackendPtr inner) : inner_(std::move(inner)) {}

  // Counting starts (and restarts) here: warm-up steps are left out by calling it after them.
  void reset() { stats_.clear(); }
  // One line per label, biggest first: calls and milliseconds per step over `steps` steps, and the share
  // of `step_ms` (the measured step time); then the remainder. Written to stderr.
  void report(int steps, double step_ms) const;

  std::string name() const override { return inner_->name(); }
  bool host_accessible() const override { return inner_->host_accessible(); }
  dew::Support supports(dew::Kernel k, dew::DType dtype) const override { return inner_->supports(k, dtype); }
  void set_threads(int threads) override { inner_->set_threads(threads); }
  void synchronize() override { inner_->synchronize(); }

  void* allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void deallocate(void* ptr, size_t bytes) override { inner_->deallocate(ptr, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_device(void* dst, const void* src, size_t bytes) override;

  void fill(dew::Tensor& out, double value) override;
  void cast(const dew::Tensor& x, dew::Tensor& out) override;
  void strided_copy(const dew::Tensor& src, dew::Tensor& dst, const dew::StridedCopyParams& p) override;
  void matmul(const dew::Tensor& a, const dew::Tensor& b, const dew::Tensor& bias, dew::Tensor& out,
              const dew::MatmulParams& p) override;
  void unary(const dew::Tensor& x, dew::Tensor& out, const dew::UnaryParams& p) override;
  void unary_backward(const dew::Tensor& x, const dew::Tensor& dy, dew::Tensor& dx, const dew::UnaryParams& p) override;
  void binary(const dew::Tensor& a, const dew::Tensor& b, dew::Tensor& out, dew::BinaryOp op) override;
  void reduce(const dew::Tensor& x, dew::Tensor& out, const dew::ReduceParams& p) override;
  void softmax(const dew::Tensor& x, dew::Tensor& y) override;
  void softmax_backward(const dew::Tensor& y, const dew::Tensor& dy, dew::Tensor& dx) override;
  void log_softmax(const dew::Tensor& x, dew::Tensor& y) override;
  void log_softmax_backward(const dew::Tensor& y, const dew::Tensor& dy, dew::Tensor& dx) override;
  void layer_norm(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& bias, dew::Tensor& y,
                  dew::Tensor& mean, dew::Tensor& rstd, float eps) override;
  void layer_norm_backward(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& mean,
                           const dew::Tensor& rstd, const dew::Tensor& dy, dew::Tensor& dx, dew::Tensor& dweight,
                           dew::Tensor& dbias) override;
  void rms_norm(const dew::Tensor& x, const dew::Tensor& weight, dew::Tensor& y, dew::Tensor& rstd, float eps,
                float weight_offset) override;
  void rms_norm_backward(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& rstd,
                         const dew::Tensor& dy, dew::Tensor& dx, dew::Tensor& dweight, float weight_offset) override;
  void group_norm(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& bias, dew::Tensor& y,
                  dew::Tensor& mean, dew::Tensor& rstd, int64_t groups, float eps) override;
  void group_norm_backward(const dew::Tensor& x, const dew::Tensor& weight, const dew::Tensor& mean,
                           const dew::Tensor& rstd, const dew::Tensor& dy, dew::Tensor& dx, dew::Tensor& dweight,
                           dew::Tensor& dbias, int64_t groups) override;
  void gather_rows(const dew::Tensor& src, const dew::Tensor& idx, dew::Tensor& out) override;
  void scatter_add_rows(const dew::Tensor& dout, const dew::Tensor& idx, dew::Tensor& dsrc) override;
  void rope(const dew::Tensor& x, const dew::Tensor& positions, dew::Tensor& out, const dew::RopeParams& p) override;
  void attention(const dew::Tensor& q, const dew::Tensor& k, const dew::Tensor& v, dew::Tensor& out, dew::Tensor& lse,
                 const dew::AttentionParams& p) override;
  void attention_backward(const dew::Tensor& q, const dew::Tensor& k, const dew::Tensor& v, const dew::Tensor& out,
                          const dew::Tensor& lse, const dew::Tensor& dout, dew::Tensor& dq, dew::Tensor& dk,
                          dew::Tensor& dv, const dew::AttentionParams& p) override;
  void conv2d(const dew::Tensor& x, const dew::Tensor& w, const dew::Tensor& bias, dew::Tensor& y,
              const dew::Conv2dParams& p) override;
  void conv2d_backward_data(const dew::Tensor& dy, const dew::Tensor& w, dew::Tensor& dx,
                            const dew::Conv2dParams& p) override;
  void conv2d_backward_weight(const dew::Tensor& x, const dew::Tensor& dy, dew::Tensor& dw, dew::Tensor& dbias,
                              const dew::Conv2dParams& p) override;
  void cross_entropy(const dew::Tensor& logits, const dew::Tensor& targets, dew::Tensor& loss, dew::Tensor& lse,
                     const dew::CrossEntropyParams& p) override;
  void cross_entropy_backward(const dew::Tensor& logits, const dew::Tensor& targets, const dew::Tensor& lse,
                              const dew::Tensor& dloss, dew::Tensor& dlogits,
                              const dew::CrossEntropyParams& p) override;
  void adamw_update(dew::Tensor& param, const dew::Tensor& grad, dew::Tensor& m, dew::Tensor& v,
                    const dew::AdamWParams& p) override;
  void sgd_update(dew::Tensor& param, const dew::Tensor& grad, dew::Tensor& momentum_buf,
                  const dew::SgdParams& p) override;
  void lamb_update(dew::Tensor& param, const dew::Tensor& grad, dew::Tensor& m, dew::Tensor& v,
                   const dew::LambParams& p) override;
  void random(dew::Tensor& out, const dew::RandomParams& p) override;
  void dropout(const dew::Tensor& x, dew::Tensor& y, dew::Tensor& mask, const dew::DropoutParams& p) override;
  void argmax(const dew::Tensor& x, dew::Tensor& out) override;

 private:
  struct Stat {
    int64_t calls = 0;
    double seconds = 0;
  };
  // Runs f (one forwarded call) and adds its wall time to `label`.
  template <class F>
  void timed(const std::string& label, F&& f) {
    inner_->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    inner_->synchronize();
    Stat& s = stats_[label];
    ++s.calls;
    s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }

  dew::BackendPtr inner_;
  std::map<std::string, Stat> stats_;
};

}  // namespace dew_bench
