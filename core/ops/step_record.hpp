// core/ops/step_record.hpp — the hook through which a step program (core/generate/step_program.hpp) sees
// every kernel call, host upload, host read-back and device copy of the thread while it records.
//
// While a StepRecorder is active on a thread (StepRecording), call_kernel (kernel_call.hpp) hands it each
// call before making it, with the call's arguments copied (tensors share their impls, so every buffer the
// step touches stays alive), and Tensor's host transfers report themselves. Nothing else changes: the calls
// run as they would unrecorded. Invariant: every kernel the core makes goes through call_kernel (the ops'
// kernels(x).name(...), Tensor's own fills, casts and draws, module initialisation), except the fused training
// ops' direct calls (core/ops/fused.cpp), which mark the recording opaque instead: a recording
// misses no call, or it is not replayed.
#pragma once
#include <memory>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "dew/backend.hpp"
#include "dew/tensor.hpp"

namespace dew::detail {

// One recorded step entry: a kernel call (its backend, kernel and arguments) or a host upload into a tensor.
struct RecordedCall {
  virtual ~RecordedCall() = default;
  // Runs the call again on the arguments it holds (through call_kernel: the same conversions).
  virtual void invoke() = 0;
  // The tensor arguments in order (undefined ones included), for the program to compare and rebind.
  virtual std::vector<Tensor*> tensors() = 0;
  // Per tensor argument: whether the kernel writes it (its parameter is a `Tensor&`).
  virtual std::vector<bool> written() const = 0;
  // Whether the non-tensor arguments equal `o`'s (o: the same kernel), ignoring the integer fields a step
  // program may move from token to token (attention's q_offset, a strided copy's offsets).
  virtual bool same_params(const RecordedCall& o) const = 0;
  // Those moving fields, read and written in a fixed order (none for most kernels).
  virtual std::vector<int64_t> moving_fields() const { return {}; }
  virtual void set_moving_fields(const std::vector<int64_t>&) {}
  Kernel kernel = Kernel::fill;
  bool upload = false;  // a host upload (UploadCall) rather than a kernel call
};

// A host upload into a tensor (Tensor::from_host and friends, Tensor::copy_from_host).
struct UploadCall final : RecordedCall {
  Tensor dst;
  std::vector<unsigned char> bytes;
  void invoke() override { dst.backend().copy_from_host(dst.data(), bytes.data(), bytes.size()); }
  std::vector<Tensor*> tensors() override { return {&dst}; }
  std::vector<bool> written() const override { return {true}; }
  bool same_params(const RecordedCall& o) const override {
    return o.upload && static_cast<const UploadCall&>(o).bytes.size() == bytes.size();
  }
};

class StepRecorder {
 public:
  std::vector<std::unique_ptr<RecordedCall>> calls;
  // The step did what a program does not replay: read a tensor back to the host (its control flow may then
  // depend on data), copied between buffers outside the kernels, or uploaded into panels.
  bool opaque = false;

  template <class... P, class... A>
  void kernel(Backend& be, Kernel k, void (Backend::*fn)(P...), A&... args);
  void upload(const Tensor& dst, const void* src, size_t bytes) {
    auto u = std::make_unique<UploadCall>();
    u->upload = true;
    u->dst = dst;
    u->bytes.assign(static_cast<const unsigned char*>(src), static_cast<const unsigned char*>(src) + bytes);
    calls.push_back(std::move(u));
  }
};

// The thread's active recorder (null: not recording).
StepRecorder*& active_step_recorder();

// Marks the thread's recording (if any) opaque: the caller is about to do what a program does not replay.
inline void mark_step_opaque() {
  if (StepRecorder* r = active_step_recorder()) r->opaque = true;
}

// Reports a host upload of `bytes` bytes from `src` into `dst` to the thread's recording (if any).
inline void record_step_upload(const Tensor& dst, const void* src, size_t bytes) {
  if (StepRecorder* r = active_step_recorder()) r->upload(dst, src, bytes);
}

// Records the thread's calls into `r` for its lifetime (nests: restores the previous recorder).
class StepRecording {
 public:
  explicit StepRecording(StepRecorder* r) : prev_(std::exchange(active_step_recorder(), r)) {}
  ~StepRecording() { active_step_recorder() = prev_; }
  StepRecording(const StepRecording&) = delete;
  StepRecording& operator=(const StepRecording&) = delete;

 private:
  StepRecorder* prev_;
};

// ---- the typed call: the kernel's arguments held by value ----
inline bool params_equal(const MatmulParams& a, const MatmulParams& b) {
  return a.batch == b.batch && a.m == b.m && a.n == b.n && a.k == b.k && a.a_batch_stride == b.a_batch_stride &&
         a.b_batch_stride == b.b_batch_stride && a.trans_a == b.trans_a && a.trans_b == b.trans_b &&
         a.alpha == b.alpha && a.beta == b.beta && a.act == b.act;
}
inline bool params_equal(const UnaryParams& a, const UnaryParams& b) {
  return a.op == b.op && a.alpha == b.alpha && a.beta == b.beta;
}
inline bool params_equal(const ReduceParams& a, const ReduceParams& b) {
  return a.op == b.op && a.outer == b.outer && a.reduce == b.reduce && a.inner == b.inner;
}
inline bool params_equal(const StridedCopyParams& a, const StridedCopyParams& b) {  // offsets move
  return a.shape == b.shape && a.src_strides == b.src_strides && a.dst_strides == b.dst_strides;
}
inline bool params_equal(const RopeParams& a, const RopeParams& b) {
  return a.theta == b.theta && a.rotary_dim == b.rotary_dim && a.inverse == b.inverse && a.scaling == b.scaling;
}
inline bool params_equal(const AttentionParams& a, const AttentionParams& b) {  // q_offset moves
  return a.scale == b.scale && a.causal == b.causal && a.window == b.window && a.softcap == b.softcap;
}
inline bool params_equal(const CrossEntropyParams& a, const CrossEntropyParams& b) {
  return a.ignore_index == b.ignore_index;
}
// Arithmetic and enum arguments (fill's value, BinaryOp, Activation, eps, ...) compare with ==; a parameter
// struct without an overload above never compares equal, so a step using it is not replayed.
template <class T>
bool params_equal(const T& a, const T& b) {
  if constexpr (std::is_arithmetic_v<T> || std::is_enum_v<T>)
    return a == b;
  else
    return false;
}

template <class... P, class... A>
void call_kernel(Backend& be, Kernel k, void (Backend::*fn)(P...), A&... args);

template <class... P>
struct TypedCall final : RecordedCall {
  Backend* be = nullptr;
  void (Backend::*fn)(P...) = nullptr;
  std::tuple<std::decay_t<P>...> args;

  template <class... A>
  TypedCall(Backend& b, Kernel k, void (Backend::*f)(P...), A&... a) : be(&b), fn(f), args(a...) {
    kernel = k;
  }
  void invoke() override {
    std::apply([&](auto&... xs) { call_kernel(*be, kernel, fn, xs...); }, args);
  }
  std::vector<Tensor*> tensors() override {
    std::vector<Tensor*> out;
    std::apply([&](auto&... xs) { (note_tensor(xs, out), ...); }, args);
    return out;
  }
  std::vector<bool> written() const override {
    std::vector<bool> out;
    (note_written<P>(out), ...);
    return out;
  }
  bool same_params(const RecordedCall& o) const override {
    const auto* t = dynamic_cast<const TypedCall*>(&o);
    if (!t || t->kernel != kernel || t->be != be) return false;
    return equal_rest(t->args, std::index_sequence_for<P...>{});
  }
  std::vector<int64_t> moving_fields() const override {
    std::vector<int64_t> out;
    std::apply([&](const auto&... xs) { (read_moving(xs, out), ...); }, args);
    return out;
  }
  void set_moving_fields(const std::vector<int64_t>& v) override {
    size_t i = 0;
    std::apply([&](auto&... xs) { (write_moving(xs, v, i), ...); }, args);
  }

 private:
  template <class T>
  static void note_tensor(T& x, std::vector<Tensor*>& out) {
    if constexpr (std::is_same_v<T, Tensor>) out.push_back(&x);
  }
  template <class Q>
  static void note_written(std::vector<bool>& out) {
    if constexpr (std::is_same_v<std::decay_t<Q>, Tensor>) out.push_back(std::is_same_v<Q, Tensor&>);
  }
  template <size_t... I>
  bool equal_rest(const std::tuple<std::decay_t<P>...>& o, std::index_sequence<I...>) const {
    return (equal_one(std::get<I>(args), std::get<I>(o)) && ...);
  }
  template <class T>
  static bool equal_one(const T& a, const T& b) {
    if constexpr (std::is_same_v<T, Tensor>)
      return true;  // tensors are compared by the program
    else
      return params_equal(a, b);
  }
  template <class T>
  static void read_moving(const T& x, std::vector<int64_t>& out) {
    if constexpr (std::is_same_v<T, AttentionParams>) out.push_back(x.q_offset);
    if constexpr (std::is_same_v<T, StridedCopyParams>) out.insert(out.end(), {x.src_offset, x.dst_offset});
  }
  template <class T>
  static void write_moving(T& x, const std::vector<int64_t>& v, size_t& i) {
    if constexpr (std::is_same_v<T, AttentionParams>) x.q_offset = v[i++];
    if constexpr (std::is_same_v<T, StridedCopyParams>) {
      x.src_offset = v[i++];
      x.dst_offset = v[i++];
    }
  }
};

template <class... P, class... A>
void StepRecorder::kernel(Backend& be, Kernel k, void (Backend::*fn)(P...), A&... args) {
  calls.push_back(std::make_unique<TypedCall<P...>>(be, k, fn, args...));
}

}  // namespace dew::detail
