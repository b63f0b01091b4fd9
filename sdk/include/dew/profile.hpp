// dew/profile.hpp — where a training step's time goes, kernel by kernel (`[trainer] profile = N`,
// `dew-bench train --profile`).
//
// ProfilingBackend wraps a backend: while enabled, every call of the kernel algebra is forwarded and timed
// (by the backend's device clock where it has one — two marks on its queue around the call, read when the
// profiler stops, so the step runs unsynchronised and each kernel's time is its device time in the pipelined
// step; else by the wall clock around the call, after synchronize()), and aggregated under a label — the kernel's name,
// with the op for unary / binary / reduce and the shape for matmul (m x k x n, transposes, batch). Memory calls are
// forwarded untimed. Tensors allocated through the wrapper carry it as their backend, so every op of the model reaches
// it. The report sorts labels by time and says what share of the timed steps they cover; the rest is the framework
// around the kernels (autograd, allocation, dispatch). While disabled (the default) calls are forwarded untimed.
// Invariant: results are the wrapped backend's, bit for bit (the wrapper only reads the clock). Not thread-safe while
// enabled: profile one training loop at a time.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <type_traits>
#include <vector>

#include "dew/backend.hpp"

namespace dew {

class ProfilingBackend final : public Backend {
 public:
  explicit ProfilingBackend(BackendPtr inner) : inner_(std::move(inner)) {}

  // Starts (or restarts) timing from zero: call it after the warm-up steps.
  void start() {
    stats_.clear();
    products_.clear();
    pending_.clear();
    inner_->synchronize();
    inner_->device_marks_release();
    device_clock_ = inner_->device_mark() >= 0;
    inner_->device_marks_release();
    enabled_ = true;
  }
  // Stops timing; with a device clock, waits for the device and reads every pending mark pair.
  void stop() {
    enabled_ = false;
    settle();
  }
  // Whether the times are device times (marks on the backend's queue) rather than synchronised wall times.
  bool device_clock() const { return device_clock_; }
  // Continues timing without clearing (between stop() and resume() nothing is counted).
  void resume() { enabled_ = true; }
  // The table: a header line, then one line per label, biggest first (milliseconds and calls per step
  // over `steps` steps, share of `step_ms`, the measured step time, and the longest single call in ms: a call
  // far above ms/step / calls is a stall, not the kernel), then the time outside the kernels.
  std::string report(int64_t steps, double step_ms) const;
  // The calls counted under `label` (a kernel's name, e.g. "cross_entropy") since start(); 0 when none.
  int64_t calls(const std::string& label) const {
    auto it = stats_.find(label);
    return it == stats_.end() ? 0 : it->second.calls;
  }
  const BackendPtr& inner() const { return inner_; }
  // The products (matmul calls) timed since start(), one per label: the parameters and dtypes of the label's first
  // call (a label is a shape, with " ->f32" on a widened product, so every call under it has them but for alpha /
  // beta), its calls and seconds. What `dew-bench train --profile` replays alone to show what the step's products
  // cost against the same products with their operands hot in the cache.
  struct Product {
    std::string label;
    MatmulParams params;
    DType a = DType::f32, b = DType::f32, out = DType::f32, bias = DType::f32;
    bool has_bias = false;
    int64_t calls = 0;
    double seconds = 0;
  };
  std::vector<Product> products() const {
    std::vector<Product> v;
    for (const auto& [label, p] : products_) {
      Product q = p;
      const auto it = stats_.find(label);
      if (it != stats_.end()) q.calls = it->second.calls, q.seconds = it->second.seconds;
      v.push_back(q);
    }
    return v;
  }

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
  MemoryStats memory_stats() const override { return inner_->memory_stats(); }
  void reset_memory_peak() override { inner_->reset_memory_peak(); }
  int64_t decode_panel_rows(DType dtype) const override { return inner_->decode_panel_rows(dtype); }
  int64_t device_mark() override { return inner_->device_mark(); }
  double device_elapsed_ms(int64_t from, int64_t to) override { return inner_->device_elapsed_ms(from, to); }
  void device_marks_release() override { inner_->device_marks_release(); }
  void operand_reuse(bool open) override { inner_->operand_reuse(open); }
  bool matmul_beta_adds_rounded(DType dtype) const override { return inner_->matmul_beta_adds_rounded(dtype); }

  // Every kernel of the table (dew/kernel_table.hpp): forwarded, and timed under kernel_label(...).
#define DEW_PROFILE_FORWARD_(name, params, args)                                             \
  void name params override {                                                               \
    timed([&] { return kernel_label(Kernel::name, DEW_PROFILE_UNPAREN_ args); }, [&] { inner_->name args; }); \
  }
#define DEW_PROFILE_UNPAREN_(...) __VA_ARGS__
  DEW_KERNEL_TABLE(DEW_PROFILE_FORWARD_)
#undef DEW_PROFILE_FORWARD_
#undef DEW_PROFILE_UNPAREN_

 private:
  // The label a kernel call is aggregated under: the kernel's name, refined for the kernels whose cost
  // depends on what they compute (matmul by shape, unary / binary / reduce by op).
  template <class... Args>
  static std::string kernel_label(Kernel k, const Args&...) {
    return kernel_name(k);
  }
  // (matmul: also keeps the label's first call's parameters and dtypes in products_)
  std::string kernel_label(Kernel, const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out,
                           const MatmulParams& p);
  static std::string kernel_label(Kernel k, const Tensor& x, const Tensor& out, const UnaryParams& p);
  static std::string kernel_label(Kernel k, const Tensor& x, const Tensor& dy, const Tensor& dx, const UnaryParams& p);
  static std::string kernel_label(Kernel k, const Tensor& a, const Tensor& b, const Tensor& out, BinaryOp op);
  static std::string kernel_label(Kernel k, const Tensor& x, const Tensor& out, const ReduceParams& p);

  struct Stat {
    int64_t calls = 0;
    double seconds = 0;
    double longest = 0;  // the longest single call, seconds: a stall (a preempted thread) shows here
    void add(double t) {
      seconds += t;
      longest = std::max(longest, t);
    }
  };
  // A call timed by the device clock, read at settle().
  struct Pending {
    Stat* stat;
    int64_t from, to;
  };
  // Runs f (one forwarded call) and, while enabled, adds its time to `label`: a string, or a callable that
  // makes one (built only while enabled).
  template <class Label, class F>
  void timed(Label&& label, F&& f) {
    if (!enabled_) {
      f();
      return;
    }
    Stat* s;
    if constexpr (std::is_invocable_v<Label>)
      s = &stats_[label()];
    else
      s = &stats_[std::string(label)];
    ++s->calls;
    if (device_clock_) {
      const int64_t from = inner_->device_mark();
      f();
      pending_.push_back(Pending{s, from, inner_->device_mark()});
      return;
    }
    inner_->synchronize();
    const auto t0 = std::chrono::steady_clock::now();
    f();
    inner_->synchronize();
    s->add(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  // Waits for the device and adds every pending call's device time to its label.
  void settle();

  BackendPtr inner_;
  bool enabled_ = false, device_clock_ = false;
  std::map<std::string, Stat> stats_;  // node-based: Pending keeps pointers into it
  std::map<std::string, Product> products_;  // by label: the first call's parameters (products())
  std::vector<Pending> pending_;
};

}  // namespace dew
