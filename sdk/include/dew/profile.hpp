// dew/profile.hpp — where a training step's time goes, kernel by kernel (`[trainer] profile = N`,
// `dew-bench train --profile`).
//
// ProfilingBackend wraps a backend: while enabled, every call of the kernel algebra is forwarded and timed
// (wall clock around the call, after synchronize() on asynchronous backends so the time is the kernel's,
// not its enqueueing), and aggregated under a label — the kernel's name, with the op for unary / binary /
// reduce and the shape for matmul (m x k x n, transposes, batch). Memory calls are forwarded untimed.
// Tensors allocated through the wrapper carry it as their backend, so every op of the model reaches it.
// The report sorts labels by time and says what share of the timed steps they cover; the rest is the
// framework around the kernels (autograd, allocation, dispatch). While disabled (the default) calls are
// forwarded untimed. Invariant: results are the wrapped backend's, bit for bit (the wrapper only reads
// the clock). Not thread-safe while enabled: profile one training loop at a time.
#pragma once
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>

#include "dew/backend.hpp"

namespace dew {

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(BackendPtr inner) : inner_(std::move(inner)) {}

  // Starts (or restarts) timing from zero: call it after the warm-up steps.
  void start() {
    stats_.clear();
    enabled_ = true;
  }
  void stop() { enabled_ = false; }
  // Continues timing without clearing (between stop() and resume() nothing is counted).
  void resume() { enabled_ = true; }
  // The table: a header line, then one line per label, biggest first (milliseconds and calls per step
  // over `steps` steps, share of `step_ms`, the measured step time), then the time outside the kernels.
  std::string report(int64_t steps, double step_ms) const;
  const BackendPtr& inner() const { return inner_; }

  std::string name() const override { return inner_->name(); }
  bool host_accessible() const override { return inner_->host_accessible(); }
  Support supports(Kernel k, DType dtype) const override { return inner_->supports(k, dtype); }
  void set_threads(int threads) override { inner_->set_threads(threads); }
  void synchronize() override { inner_->synchronize(); }

  void* allocate(size_t bytes) override { return inner_->allocate(bytes); }
  void deallocate(void* ptr, size_t bytes) override { inner_->deallocate(ptr, bytes); }
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_device(void* dst, const void* src, size_t bytes) override;

  void fill(Tensor& out, double value) override;
  void cast(const Tensor& x, Tensor& out) override;
  void strided_copy(const Tensor& src, Tensor& dst, const StridedCopyParams& p) override;
  void matmul(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out, const MatmulParams& p) override;
  void unary(const Tensor& x, Tensor& out, const UnaryParams& p) override;
  void unary_backward(const Tensor& x, const Tensor& dy, Tensor& dx, const UnaryParams& p) override;
  void binary(const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) override;
  void reduce(const Tensor& x, Tensor& out, const ReduceParams& p) override;
  void softmax(const Tensor& x, Tensor& y) override;
  void softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void log_softmax(const Tensor& x, Tensor& y) override;
  void log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) override;
  void layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean, Tensor& rstd,
                  float eps) override;
  void layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias) override;
  void rms_norm(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                float weight_offset) override;
  void rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy, Tensor& dx,
                         Tensor& dweight, float weight_offset) override;
  void group_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean, Tensor& rstd,
                  int64_t groups, float eps) override;
  void group_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias, int64_t groups) override;
  void gather_rows(const Tensor& src, const Tensor& idx, Tensor& out) override;
  void scatter_add_rows(const Tensor& dout, const Tensor& idx, Tensor& dsrc) override;
  void rope(const Tensor& x, const Tensor& positions, Tensor& out, const RopeParams& p) override;
  void attention(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                 const AttentionParams& p) override;
  void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out, const Tensor& lse,
                          const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, const AttentionParams& p) override;
  void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const Conv2dParams& p) override;
  void conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p) override;
  void conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                              const Conv2dParams& p) override;
  void cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                     const CrossEntropyParams& p) override;
  void cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse, const Tensor& dloss,
                              Tensor& dlogits, const CrossEntropyParams& p) override;
  void adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p) override;
  void sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) override;
  void lamb_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const LambParams& p) override;
  void random(Tensor& out, const RandomParams& p) override;
  void dropout(const Tensor& x, Tensor& y, Tensor& mask, const DropoutParams& p) override;
  void argmax(const Tensor& x, Tensor& out) override;

 private:
  struct Stat {
    int64_t calls = 0;
    double seconds = 0;
  };
  // Runs f (one forwarded call) and, while enabled, adds its wall time to `label`: a string, or a callable
  // that makes one (built only while enabled).
  template <class Label, class F>
  void timed(Label&& label, F&& f) {
    if (!enabled_) {
      f();
      return;
    }
    inner_->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    inner_->synchronize();
    const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    Stat* s;
    if constexpr (std::is_invocable_v<Label>)
      s = &stats_[label()];
    else
      s = &stats_[std::string(label)];
    ++s->calls;
    s->seconds += dt;
  }

  BackendPtr inner_;
  bool enabled_ = false;
  std::map<std::string, Stat> stats_;
};

}  // namespace dew
