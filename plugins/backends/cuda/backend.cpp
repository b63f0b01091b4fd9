// cuda/backend.cpp — the cuda backend's construction, memory (caching allocator, pinned staging,
// copies), synchronisation and device-side error reporting, and the host side of every kernel that runs
// on the CUDA kernels of kernels.cuh: validate on the host, then enqueue on the one stream.
// (matmul: matmul.cpp; convolution: conv.cpp.)
#include <algorithm>
#include <bit>
#include <cstring>

#include "cuda_backend.hpp"

namespace dew::cuda {

// ---------------------------------------------------------------- construction

CudaBackend::CudaBackend(const Options& options) : opt_(parse_options(options)) {
  const Support s = probe();
  DEW_USAGE_CHECK(s.ok, "backend 'cuda' cannot run here: ", s.reason);
  int count = 0;
  DEW_CUDA_CHECK(cudaGetDeviceCount(&count));
  device_ = pick_device(opt_.device, count);
  DEW_CUDA_CHECK(cudaSetDevice(device_));
  DEW_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  DEW_CUBLAS_CHECK(cublasLtCreate(&lt_));
  DEW_CUDNN_CHECK(cudnnCreate(&dnn_));
  DEW_CUDNN_CHECK(cudnnSetStream(dnn_, stream_));
  lt_workspace_bytes_ = size_t(opt_.workspace_mb) << 20;
  DEW_CUDA_CHECK(cudaMalloc(&lt_workspace_, lt_workspace_bytes_));
  DEW_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&err_), sizeof(ErrWord)));
  DEW_CUDA_CHECK(cudaMemsetAsync(err_, 0, sizeof(ErrWord), stream_));
  DEW_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

CudaBackend::~CudaBackend() {
  // Never throws: at process exit the runtime may already be going away; errors are ignored.
  cudaSetDevice(device_);
  if (stream_) cudaStreamSynchronize(stream_);
  for (auto& [size, blocks] : free_blocks_)
    for (void* p : blocks) cudaFree(p);
  for (Staging& s : staging_) {
    if (s.done) cudaEventDestroy(s.done);
    if (s.host) cudaFreeHost(s.host);
  }
  for (cudaEvent_t e : marks_) cudaEventDestroy(e);
  {
    std::lock_guard lock(plan_mu_);
    matmul_plans_.clear();
    conv_plans_.clear();
  }
  if (lt_workspace_) cudaFree(lt_workspace_);
  if (err_) cudaFree(err_);
  if (dnn_) cudnnDestroy(dnn_);
  if (lt_) cublasLtDestroy(lt_);
  if (stream_) cudaStreamDestroy(stream_);
}

void CudaBackend::make_current() const { cudaSetDevice(device_); }

// ---------------------------------------------------------------- synchronisation and device errors

void CudaBackend::synchronize() {
  DEW_CUDA_CHECK(cudaStreamSynchronize(stream_));
  raise_device_errors();
}

int64_t CudaBackend::device_mark() {
  make_current();
  if (marks_used_ == marks_.size()) {
    cudaEvent_t e = nullptr;
    DEW_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDefault));
    marks_.push_back(e);
  }
  DEW_CUDA_CHECK(cudaEventRecord(marks_[marks_used_], stream_));
  return int64_t(marks_used_++);
}

double CudaBackend::device_elapsed_ms(int64_t from, int64_t to) {
  DEW_CHECK(from >= 0 && to >= 0 && size_t(from) < marks_used_ && size_t(to) < marks_used_,
            "cuda: device_elapsed_ms of marks ", from, " and ", to, ": not recorded since the last release");
  float ms = 0.0f;
  DEW_CUDA_CHECK(cudaEventElapsedTime(&ms, marks_[size_t(from)], marks_[size_t(to)]));
  return double(ms);
}

void CudaBackend::raise_device_errors() {
  ErrWord h{};
  DEW_CUDA_CHECK(cudaMemcpy(&h, err_, sizeof h, cudaMemcpyDeviceToHost));
  if (h.code == kErrNone) return;
  DEW_CUDA_CHECK(cudaMemset(err_, 0, sizeof(ErrWord)));
  switch (h.code) {
    case kErrGatherIndex:
    case kErrScatterIndex:
      DEW_CHECK(false, "cuda.", h.code == kErrGatherIndex ? "gather_rows" : "scatter_add_rows", ": index ", h.a,
                " at flat position ", h.b, " is outside [0, ", h.c, ") (reported at the next synchronisation)");
      break;
    case kErrTarget:
      DEW_CHECK(false, "cuda.cross_entropy: target ", h.a, " of row ", h.b, " is outside [0, ", h.c,
                ") and is not ignore_index (reported at the next synchronisation)");
      break;
    default:
      DEW_CHECK(false, "cuda: a kernel reported error code ", h.code);
  }
}

// ---------------------------------------------------------------- caching allocator

namespace {
size_t round_bytes(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (bytes <= (size_t(1) << 20)) return (bytes + 511) & ~size_t(511);  // small: 512-byte classes
  return (bytes + (size_t(2) << 20) - 1) & ~((size_t(2) << 20) - 1);    // large: 2 MiB classes
}
}  // namespace

void* CudaBackend::raw_alloc(size_t n) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, n);
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    release_cache();
    e = cudaMalloc(&p, n);
  }
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    DEW_CHECK(false, "cuda: out of device memory allocating ", n >> 20, " MiB on device ", device_, " (", free_b >> 20,
              " MiB free of ", total_b >> 20, " MiB): ", cudaGetErrorString(e));
  }
  return p;
}

void CudaBackend::release_cache() {
  // Blocks in the cache may still be named by enqueued work: wait before freeing them.
  cudaStreamSynchronize(stream_);
  for (auto& [size, blocks] : free_blocks_)
    for (void* p : blocks) cudaFree(p);
  free_blocks_.clear();
  cached_bytes_ = 0;
}

void* CudaBackend::allocate(size_t bytes) {
  const size_t n = round_bytes(bytes);
  std::lock_guard lock(alloc_mu_);
  make_current();
  if (opt_.caching_allocator) {
    auto it = free_blocks_.find(n);
    if (it != free_blocks_.end() && !it->second.empty()) {
      void* p = it->second.back();
      it->second.pop_back();
      cached_bytes_ -= n;
      memory_.allocated(n);
      return p;
    }
  }
  void* p = raw_alloc(n);
  memory_.allocated(n);
  return p;
}

MemoryStats CudaBackend::memory_stats() const {
  std::lock_guard lock(alloc_mu_);
  return memory_.stats(int64_t(cached_bytes_));
}

void CudaBackend::deallocate(void* ptr, size_t bytes) {
  if (!ptr) return;
  const size_t n = round_bytes(bytes);
  std::lock_guard lock(alloc_mu_);
  memory_.freed(n);
  if (opt_.caching_allocator) {
    free_blocks_[n].push_back(ptr);
    cached_bytes_ += n;
  } else {
    cudaStreamSynchronize(stream_);
    cudaFree(ptr);
  }
}

// ---------------------------------------------------------------- copies

void CudaBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  make_current();
  constexpr size_t kMaxStaged = size_t(64) << 20, kMinSlot = size_t(1) << 20;
  constexpr size_t kSlots = 8;
  if (bytes > kMaxStaged) {  // checkpoint loads and the like: a plain (pageable, blocking) copy
    DEW_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_));
    DEW_CUDA_CHECK(cudaStreamSynchronize(stream_));
    return;
  }
  std::lock_guard lock(staging_mu_);
  Staging* slot = nullptr;
  for (Staging& s : staging_)  // a finished slot that is big enough
    if (s.bytes >= bytes && (!s.used || cudaEventQuery(s.done) == cudaSuccess)) {
      slot = &s;
      break;
    }
  if (!slot && staging_.size() < kSlots) {
    staging_.push_back({});
    slot = &staging_.back();
    DEW_CUDA_CHECK(cudaEventCreateWithFlags(&slot->done, cudaEventDisableTiming));
  }
  if (!slot) {  // all slots busy or small: wait for the first, grow it if needed
    slot = &staging_.front();
    DEW_CUDA_CHECK(cudaEventSynchronize(slot->done));
  }
  if (slot->bytes < bytes) {
    if (slot->host) DEW_CUDA_CHECK(cudaFreeHost(slot->host));
    slot->host = nullptr;
    slot->bytes = std::max(kMinSlot, std::bit_ceil(bytes));
    DEW_CUDA_CHECK(cudaHostAlloc(&slot->host, slot->bytes, cudaHostAllocDefault));
  }
  std::memcpy(slot->host, src, bytes);
  DEW_CUDA_CHECK(cudaMemcpyAsync(dst, slot->host, bytes, cudaMemcpyHostToDevice, stream_));
  DEW_CUDA_CHECK(cudaEventRecord(slot->done, stream_));
  slot->used = true;
}

void CudaBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  make_current();
  if (bytes) DEW_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

void CudaBackend::copy_device(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return;
  DEW_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
}

// ---------------------------------------------------------------- fill, cast, strided_copy

void CudaBackend::fill(Tensor& out, double value) {
  DEW_CHECK(out.defined(), "cuda.fill: out is undefined");
  launch_fill(stream_, out.data(), out.numel(), int(dtype_size(out.dtype())), fill_pattern(out.dtype(), value));
}

void CudaBackend::cast(const Tensor& x, Tensor& out) {
  DEW_CHECK(x.defined() && out.defined(), "cuda.cast: x or out is undefined");
  DEW_CHECK(x.numel() == out.numel(), "cuda.cast: ", shape_str(x.shape()), " -> ", shape_str(out.shape()),
            " changes the number of elements");
  if (x.dtype() == out.dtype()) {
    copy_device(out.data(), x.data(), x.nbytes());
    return;
  }
  launch_cast(stream_, x.data(), x.dtype(), out.data(), out.dtype(), x.numel());
}

void CudaBackend::strided_copy(const Tensor& src, Tensor& dst, const StridedCopyParams& p) {
  DEW_CHECK(src.defined() && dst.defined(), "cuda.strided_copy: src or dst is undefined");
  DEW_CHECK(src.dtype() == dst.dtype(), "cuda.strided_copy: src is ", dtype_name(src.dtype()), ", dst is ",
            dtype_name(dst.dtype()));
  const int64_t count = numel_of(p.shape);
  const StridedDesc d = coalesce_copy(p, src.numel(), dst.numel());
  if (count == 0) return;
  launch_strided_copy(stream_, src.data(), dst.data(), int(dtype_size(src.dtype())), d, p.src_offset, p.dst_offset,
                      count);
}

// ---------------------------------------------------------------- elementwise, reductions

void CudaBackend::unary(const Tensor& x, Tensor& out, const UnaryParams& p) {
  const ST t = compute_type(x, Kernel::unary, "x");
  expect_same(out, x, x.numel(), Kernel::unary, "out");
  launch_unary(stream_, t, x.data(), out.data(), x.numel(), p.op, p.alpha, p.beta);
}

void CudaBackend::unary_backward(const Tensor& x, const Tensor& dy, Tensor& dx, const UnaryParams& p) {
  constexpr Kernel K = Kernel::unary_backward;
  const ST t = compute_type(x, K, "x");
  expect_same(dy, x, x.numel(), K, "dy");
  expect_same(dx, x, x.numel(), K, "dx");
  launch_unary_backward(stream_, t, x.data(), dy.data(), dx.data(), x.numel(), p.op, p.alpha, p.beta);
}

// unary_backward, then reduce's column sums over dx's rows: two launches (the GPU reads dx back at its
// bandwidth; the fused pass is the CPU's saving, cpu/elementwise.cpp).
void CudaBackend::unary_backward_sum(const Tensor& x, const Tensor& dy, Tensor& dx, Tensor& dsum,
                                     const UnaryParams& p) {
  compute_type(x, Kernel::unary_backward_sum, "x");
  contracts::check_unary_backward_sum("cuda.unary_backward_sum", x, dy, dx, dsum);
  if (dsum.numel() == 0) return;
  if (x.numel() == 0) {
    fill(dsum, 0.0);
    return;
  }
  unary_backward(x, dy, dx, p);
  ReduceParams rp;
  rp.op = ReduceOp::sum;
  rp.outer = 1;
  rp.reduce = contracts::rows_of(x);
  rp.inner = contracts::last_dim(x);
  reduce(dx, dsum, rp);
}

void CudaBackend::gated_activation(const Tensor& gate, const Tensor& up, Tensor& out, Activation act) {
  const ST t = compute_type(gate, Kernel::gated_activation, "gate");
  contracts::check_gated("cuda.gated_activation", gate, {{&up, "up"}, {&out, "out"}});
  launch_gated_activation(stream_, t, gate.data(), up.data(), out.data(), gate.numel(), act);
}

void CudaBackend::gated_activation_backward(const Tensor& gate, const Tensor& up, const Tensor& dy, Tensor& dgate,
                                            Tensor& dup, Activation act) {
  const ST t = compute_type(gate, Kernel::gated_activation_backward, "gate");
  contracts::check_gated("cuda.gated_activation_backward", gate,
                         {{&up, "up"}, {&dy, "dy"}, {&dgate, "dgate"}, {&dup, "dup"}});
  launch_gated_activation_backward(stream_, t, gate.data(), up.data(), dy.data(), dgate.data(), dup.data(),
                                   gate.numel(), act);
}

void CudaBackend::gated_residual(const Tensor& x, const Tensor& f, const Tensor& gate, Tensor& y) {
  const ST t = compute_type(f, Kernel::gated_residual, "f");
  const int64_t per = contracts::gated_residual_group("cuda.gated_residual", f, gate, {{&x, "x"}, {&y, "y"}}, {});
  launch_gated_residual(stream_, t, x.data(), f.data(), gate.data(), y.data(), contracts::rows_of(f), gate.shape()[1],
                        per);
}

void CudaBackend::gated_residual_backward(const Tensor& f, const Tensor& gate, const Tensor& dy, Tensor& df,
                                          Tensor& dgate) {
  const ST t = compute_type(f, Kernel::gated_residual_backward, "f");
  const int64_t per = contracts::gated_residual_group("cuda.gated_residual_backward", f, gate,
                                                      {{&dy, "dy"}, {&df, "df"}}, {{&dgate, "dgate"}});
  if (gate.numel() == 0) return;
  if (per == 0) {  // no rows: every group's sum is 0
    fill(dgate, 0.0);
    return;
  }
  launch_gated_residual_backward(stream_, t, f.data(), gate.data(), dy.data(), df.data(), dgate.data(),
                                 contracts::rows_of(f), gate.shape()[1], per);
}

void CudaBackend::binary(const Tensor& a, const Tensor& b, Tensor& out, BinaryOp op) {
  const ST t = compute_type(a, Kernel::binary, "a");
  DEW_CHECK(b.defined() && out.defined(), "cuda.binary: b or out is undefined");
  DEW_CHECK(b.dtype() == a.dtype(), "cuda.binary: a is ", dtype_name(a.dtype()), ", b is ", dtype_name(b.dtype()));
  const bool comparison = op == BinaryOp::eq || op == BinaryOp::gt || op == BinaryOp::lt;
  DEW_CHECK(comparison || out.dtype() == a.dtype(), "cuda.binary: out is ", dtype_name(out.dtype()), ", inputs are ",
            dtype_name(a.dtype()));
  const StridedDesc d = broadcast_desc(a.shape(), b.shape(), out.shape());
  const bool same = a.shape() == out.shape() && b.shape() == out.shape();
  launch_binary(stream_, t, a.data(), b.data(), out.data(), out.dtype(), op, d, out.numel(), same);
}

void CudaBackend::reduce(const Tensor& x, Tensor& out, const ReduceParams& p) {
  const ST t = compute_type(x, Kernel::reduce, "x");
  DEW_CHECK(p.outer >= 0 && p.reduce >= 0 && p.inner >= 0 && x.numel() == p.outer * p.reduce * p.inner,
            "cuda.reduce: x ", shape_str(x.shape()), " is not [", p.outer, ", ", p.reduce, ", ", p.inner, "]");
  expect_same(out, x, p.outer * p.inner, Kernel::reduce, "out");
  DEW_CHECK(p.reduce > 0 || (p.op != ReduceOp::max && p.op != ReduceOp::min),
            "cuda.reduce: max/min over an empty axis");
  Scratch s(this, size_t(reduce_scratch_doubles(p.outer, p.reduce, p.inner)) * sizeof(double));
  launch_reduce(stream_, t, x.data(), out.data(), p.outer, p.reduce, p.inner, p.op, static_cast<double*>(s.ptr));
}

// Every tensor's sum of squares in two launches per 64 tensors (elementwise.cu), the bits of reduce on each: the
// gradient norm took a reduce per parameter, and a copy each to gather them.
void CudaBackend::sum_squares_group(const std::vector<Tensor>& xs, Tensor& out) {
  check_sum_squares_group(xs, out, name().c_str());
  if (xs.empty()) return;
  const ST t = compute_type(out, Kernel::sum_squares_group, "out");
  std::vector<const void*> ptrs;
  std::vector<int64_t> ns;
  for (const Tensor& x : xs) ptrs.push_back(x.numel() ? x.data() : nullptr), ns.push_back(x.numel());
  Scratch s(this, size_t(sum_squares_group_scratch_doubles(ns.data(), int64_t(ns.size()))) * sizeof(double));
  launch_sum_squares_group(stream_, t, ptrs.data(), ns.data(), int64_t(ns.size()), out.data(),
                           static_cast<double*>(s.ptr));
}

void CudaBackend::argmax(const Tensor& x, Tensor& out) {
  const ST t = compute_type(x, Kernel::argmax, "x");
  DEW_CHECK(x.ndim() >= 1 && x.size(-1) > 0, "cuda.argmax: x ", shape_str(x.shape()), " has no last axis to scan");
  const int64_t D = x.size(-1), rows = x.numel() / D;
  expect_i32(out, rows, Kernel::argmax, "out");
  launch_argmax(stream_, t, x.data(), out.data_as<int32_t>(), rows, D);
}

// ---------------------------------------------------------------- softmax

namespace {
int64_t last_axis(const Tensor& x, Kernel k) {
  DEW_CHECK(x.defined() && x.ndim() >= 1, "cuda.", kernel_name(k), ": x has no last axis");
  return x.size(-1);
}
}  // namespace

void CudaBackend::softmax(const Tensor& x, Tensor& y) {
  const ST t = compute_type(x, Kernel::softmax, "x");
  const int64_t D = last_axis(x, Kernel::softmax);
  expect_same(y, x, x.numel(), Kernel::softmax, "y");
  if (D > 0) launch_softmax(stream_, t, x.data(), y.data(), x.numel() / D, D, false);
}
void CudaBackend::log_softmax(const Tensor& x, Tensor& y) {
  const ST t = compute_type(x, Kernel::log_softmax, "x");
  const int64_t D = last_axis(x, Kernel::log_softmax);
  expect_same(y, x, x.numel(), Kernel::log_softmax, "y");
  if (D > 0) launch_softmax(stream_, t, x.data(), y.data(), x.numel() / D, D, true);
}
void CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  constexpr Kernel K = Kernel::softmax_backward;
  const ST t = compute_type(y, K, "y");
  const int64_t D = last_axis(y, K);
  expect_same(dy, y, y.numel(), K, "dy");
  expect_same(dx, y, y.numel(), K, "dx");
  if (D > 0) launch_softmax_backward(stream_, t, y.data(), dy.data(), dx.data(), y.numel() / D, D, false);
}
void CudaBackend::log_softmax_backward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  constexpr Kernel K = Kernel::log_softmax_backward;
  const ST t = compute_type(y, K, "y");
  const int64_t D = last_axis(y, K);
  expect_same(dy, y, y.numel(), K, "dy");
  expect_same(dx, y, y.numel(), K, "dx");
  if (D > 0) launch_softmax_backward(stream_, t, y.data(), dy.data(), dx.data(), y.numel() / D, D, true);
}

// ---------------------------------------------------------------- norms

namespace {
int64_t norm_axis(const Tensor& x, Kernel k) {
  DEW_CHECK(x.defined() && x.ndim() >= 1 && x.size(-1) > 0, "cuda.", kernel_name(k), ": x has no non-empty last axis");
  return x.size(-1);
}
const void* opt_ptr(const Tensor& t, const Tensor& like, int64_t n, Kernel k, const char* what) {
  if (!t.defined()) return nullptr;
  expect_same(t, like, n, k, what);
  return t.data();
}
void* opt_out(Tensor& t, const Tensor& like, int64_t n, Kernel k, const char* what) {
  if (!t.defined()) return nullptr;
  expect_same(t, like, n, k, what);
  return t.data();
}
}  // namespace

// A [G, D] weight / bias (kernel_table.hpp) runs as G launches over the groups' runs of rows, each with its
// parameter row: the DiT's per-sample modulation, 16 small launches where a GPU would want one (not tuned).
void CudaBackend::layer_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                             Tensor& rstd, float eps) {
  constexpr Kernel K = Kernel::layer_norm;
  const ST t = compute_type(x, K, "x");
  const int64_t D = norm_axis(x, K), rows = x.numel() / D;
  expect_same(y, x, x.numel(), K, "y");
  expect_f32(mean, rows, K, "mean");
  expect_f32(rstd, rows, K, "rstd");
  const int64_t G = contracts::norm_groups("cuda.layer_norm", rows, D, {&weight, &bias}), per = rows / G;
  const auto* w = static_cast<const char*>(opt_ptr(weight, x, G * D, K, "weight"));
  const auto* b = static_cast<const char*>(opt_ptr(bias, x, G * D, K, "bias"));
  const size_t es = dtype_size(x.dtype());
  for (int64_t g = 0; g < G; ++g) {
    const size_t xo = size_t(g * per * D) * es, po = size_t(g * D) * es;
    launch_layer_norm(stream_, t, static_cast<const char*>(x.data()) + xo, w ? w + po : nullptr, b ? b + po : nullptr,
                      static_cast<char*>(y.data()) + xo, mean.data_as<float>() + g * per,
                      rstd.data_as<float>() + g * per, per, D, eps);
  }
}

void CudaBackend::layer_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias) {
  constexpr Kernel K = Kernel::layer_norm_backward;
  const ST t = compute_type(x, K, "x");
  const int64_t D = norm_axis(x, K), rows = x.numel() / D;
  expect_same(dy, x, x.numel(), K, "dy");
  expect_same(dx, x, x.numel(), K, "dx");
  expect_f32(mean, rows, K, "mean");
  expect_f32(rstd, rows, K, "rstd");
  const int64_t G = contracts::norm_groups("cuda.layer_norm_backward", rows, D, {&weight, &dweight, &dbias});
  const int64_t per = rows / G;
  const auto* w = static_cast<const char*>(opt_ptr(weight, x, G * D, K, "weight"));
  auto* dw = static_cast<char*>(opt_out(dweight, x, G * D, K, "dweight"));
  auto* db = static_cast<char*>(opt_out(dbias, x, G * D, K, "dbias"));
  Scratch s(this, (dw || db) ? size_t(norm_scratch_floats(per, D)) * sizeof(float) : 0);
  const size_t es = dtype_size(x.dtype());
  for (int64_t g = 0; g < G; ++g) {  // one group after the other on the stream: they share the scratch
    const size_t xo = size_t(g * per * D) * es, po = size_t(g * D) * es;
    launch_layer_norm_backward(stream_, t, static_cast<const char*>(x.data()) + xo, w ? w + po : nullptr,
                               mean.data_as<float>() + g * per, rstd.data_as<float>() + g * per,
                               static_cast<const char*>(dy.data()) + xo, static_cast<char*>(dx.data()) + xo,
                               dw ? dw + po : nullptr, db ? db + po : nullptr, per, D, s.f32());
  }
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, Tensor& y, Tensor& rstd, float eps,
                           float weight_offset) {
  constexpr Kernel K = Kernel::rms_norm;
  const ST t = compute_type(x, K, "x");
  const int64_t D = norm_axis(x, K), rows = x.numel() / D;
  expect_same(y, x, x.numel(), K, "y");
  expect_f32(rstd, rows, K, "rstd");
  launch_rms_norm(stream_, t, x.data(), opt_ptr(weight, x, D, K, "weight"), y.data(), rstd.data_as<float>(), rows, D,
                  eps, weight_offset);
}

void CudaBackend::rms_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                                    Tensor& dx, Tensor& dweight, float weight_offset, bool accumulate) {
  constexpr Kernel K = Kernel::rms_norm_backward;
  const ST t = compute_type(x, K, "x");
  const int64_t D = norm_axis(x, K), rows = x.numel() / D;
  expect_same(dy, x, x.numel(), K, "dy");
  expect_same(dx, x, x.numel(), K, "dx");
  expect_f32(rstd, rows, K, "rstd");
  const void* w = opt_ptr(weight, x, D, K, "weight");
  void* dw = opt_out(dweight, x, D, K, "dweight");
  Scratch s(this, dw ? size_t(norm_scratch_floats(rows, D)) * sizeof(float) : 0);
  DEW_CHECK(!accumulate || (dx.data() != x.data() && dx.data() != dy.data()),
            "cuda rms_norm_backward: an accumulated dx must alias neither x nor dy");
  launch_rms_norm_backward(stream_, t, x.data(), w, rstd.data_as<float>(), dy.data(), dx.data(), dw, rows, D,
                           weight_offset, accumulate, s.f32());
}

namespace {
struct GroupDims {
  int64_t N, C, HW;
};
GroupDims group_dims(const Tensor& x, int64_t groups, Kernel k) {
  DEW_CHECK(x.defined() && x.ndim() >= 2, "cuda.", kernel_name(k), ": x is not [N, C, ...]");
  GroupDims d{x.size(0), x.size(1), 0};
  DEW_CHECK(groups > 0 && d.C % groups == 0, "cuda.", kernel_name(k), ": ", d.C, " channels do not split into ", groups,
            " groups");
  d.HW = d.N * d.C != 0 ? x.numel() / (d.N * d.C) : 0;
  DEW_CHECK(d.N * d.C == 0 || d.HW > 0, "cuda.", kernel_name(k), ": empty groups in x ", shape_str(x.shape()));
  return d;
}
}  // namespace

void CudaBackend::group_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, Tensor& y, Tensor& mean,
                             Tensor& rstd, int64_t groups, float eps) {
  constexpr Kernel K = Kernel::group_norm;
  const ST t = compute_type(x, K, "x");
  const GroupDims d = group_dims(x, groups, K);
  expect_same(y, x, x.numel(), K, "y");
  expect_f32(mean, d.N * groups, K, "mean");
  expect_f32(rstd, d.N * groups, K, "rstd");
  launch_group_norm(stream_, t, x.data(), opt_ptr(weight, x, d.C, K, "weight"), opt_ptr(bias, x, d.C, K, "bias"),
                    y.data(), mean.data_as<float>(), rstd.data_as<float>(), d.N, d.C, d.HW, groups, eps);
}

void CudaBackend::group_norm_backward(const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                                      const Tensor& dy, Tensor& dx, Tensor& dweight, Tensor& dbias, int64_t groups) {
  constexpr Kernel K = Kernel::group_norm_backward;
  const ST t = compute_type(x, K, "x");
  const GroupDims d = group_dims(x, groups, K);
  expect_same(dy, x, x.numel(), K, "dy");
  expect_same(dx, x, x.numel(), K, "dx");
  expect_f32(mean, d.N * groups, K, "mean");
  expect_f32(rstd, d.N * groups, K, "rstd");
  const void* w = opt_ptr(weight, x, d.C, K, "weight");
  void* dw = opt_out(dweight, x, d.C, K, "dweight");
  void* db = opt_out(dbias, x, d.C, K, "dbias");
  if (d.N == 0 && (dw || db)) {  // no samples: zero gradients
    if (dw) launch_fill(stream_, dw, d.C, int(dtype_size(x.dtype())), 0);
    if (db) launch_fill(stream_, db, d.C, int(dtype_size(x.dtype())), 0);
    return;
  }
  Scratch s(this, (dw || db) ? size_t(2 * d.N * d.C) * sizeof(float) : 0);
  launch_group_norm_backward(stream_, t, x.data(), w, mean.data_as<float>(), rstd.data_as<float>(), dy.data(),
                             dx.data(), dw, db, d.N, d.C, d.HW, groups, s.f32());
}

// ---------------------------------------------------------------- embedding, rope

void CudaBackend::gather_rows(const Tensor& src, const Tensor& idx, Tensor& out) {
  const RowsDims s = check_rows(src, idx, out, Kernel::gather_rows);
  launch_gather_rows(stream_, src.data(), idx.data_as<int32_t>(), out.data(), s.Bs, s.R, s.D, s.B, s.K,
                     int(dtype_size(src.dtype())), err_);
}

void CudaBackend::scatter_add_rows(const Tensor& dout, const Tensor& idx, Tensor& dsrc) {
  const ST t = compute_type(dsrc, Kernel::scatter_add_rows, "dsrc");
  const RowsDims s = check_rows(dsrc, idx, dout, Kernel::scatter_add_rows);
  Scratch acc(this, t == ST::bf16 ? size_t(s.Bs * s.R * s.D) * sizeof(float) : 0);
  launch_scatter_add_rows(stream_, t, dout.data(), idx.data_as<int32_t>(), dsrc.data(), s.Bs, s.R, s.D, s.B, s.K,
                          acc.f32(), err_);
}

void CudaBackend::rope(const Tensor& x, const Tensor& positions, Tensor& out, const RopeParams& p) {
  constexpr Kernel K = Kernel::rope;
  const ST t = compute_type(x, K, "x");
  DEW_CHECK(x.ndim() == 4, "cuda.rope: x ", shape_str(x.shape()), " is not [B, T, H, D]");
  const int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), D = x.size(3);
  const int64_t rd = p.rotary_dim == 0 ? D : p.rotary_dim;
  DEW_CHECK(rd > 0 && rd <= D && rd % 2 == 0, "cuda.rope: rotary_dim ", rd, " must be even and in (0, ", D, "]");
  DEW_CHECK(positions.defined() && positions.dtype() == DType::i32, "cuda.rope: positions must be i32");
  DEW_CHECK(positions.numel() == Tn || positions.numel() == B * Tn, "cuda.rope: positions ",
            shape_str(positions.shape()), " are neither [T] nor [B, T] for x ", shape_str(x.shape()));
  expect_same(out, x, x.numel(), K, "out");
  const bool per_batch = positions.numel() == B * Tn && B != 1;
  contracts::check_rope_scaling("cuda.rope", p.scaling);
  DEW_CHECK(rd / 2 <= RopeFrequencies::kMaxPairs, "cuda.rope: rotary_dim ", rd, " is above the ",
            2 * RopeFrequencies::kMaxPairs, " features the kernel's frequency argument holds");
  RopeFrequencies freqs{};
  for (int64_t i = 0; i < rd / 2; ++i) freqs.f[i] = contracts::rope_frequency(double(p.theta), rd, i, p.scaling);
  launch_rope(stream_, t, x.data(), positions.data_as<int32_t>(), out.data(), B, Tn, H, D, rd, freqs, p.inverse,
              per_batch);
}

// ---------------------------------------------------------------- attention

void CudaBackend::attention(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                            Tensor& out, Tensor& lse, const AttentionParams& p) {
  constexpr Kernel K = Kernel::attention;
  const ST t = compute_type(q, K, "q");
  const AttnDims d = check_attention(q, k, v, K);  // k, v: q's dtype, or bf16 under f32 q (a bf16 decode cache)
  const ST kv = compute_type(k, K, "k");
  const int32_t* seg = attention_segments(segment_ids, d, p, K);
  expect_same(out, q, d.B * d.T * d.Hq * d.Dv, K, "out");
  expect_f32(lse, d.B * d.Hq * d.T, K, "lse");
  if (opt_.flash_attention && flash_attention_applies(t, kv, d, {q.data(), k.data(), v.data(), out.data()}))
    launch_flash_attention(stream_, q.data(), k.data(), v.data(), seg, out.data(), lse.data_as<float>(), d, p);
  else if (attention_products_applies(q, k, v, d))  // f32: cuBLASLt products (attention_products.cpp)
    attention_products(q.data_as<float>(), k.data_as<float>(), v.data_as<float>(), seg, out.data_as<float>(),
                       lse.data_as<float>(), d, p);
  else
    launch_attention(stream_, t, kv, q.data(), k.data(), v.data(), seg, out.data(), lse.data_as<float>(), d, p);
}

// Every row in two launches a 128 rows (the caches' writes, then one warp per row and query head: attention.cuh's
// attend_row, the very code attention's warp kernel runs on the row alone) where that is the kernel the rows' solo
// calls take: f32 q over a bf16 cache (never the products), or over an f32 one while each row's keys stay below the
// products' threshold (attention_products_applies); elsewhere (bf16 q: the tensor-core kernel; long f32 rows: the
// cuBLASLt products) row by row through attention above (core/tensor/kernel_groups.cpp), the bits of each row alone.
void CudaBackend::attention_slots(const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                                  const std::vector<int64_t>& slots, const std::vector<int64_t>& positions,
                                  Tensor& k_cache, Tensor& v_cache, Tensor& out, const AttentionParams& p) {
  constexpr Kernel K = Kernel::attention_slots;
  check_attention_slots(q, k_new, v_new, slots, positions, k_cache, v_cache, out, name().c_str());
  const ST t = compute_type(q, K, "q"), kv = compute_type(k_cache, K, "k_cache");
  const int64_t C = k_cache.size(1), Hq = q.size(2), Hkv = k_cache.size(2), D = q.size(3);
  bool warp = t == ST::f32 && D <= kAttnMaxHeadDim;
  for (size_t i = 0; warp && kv == ST::f32 && i < slots.size(); ++i)
    warp = !attention_products_applies(q, k_cache, v_cache, AttnDims{1, 1, positions[i] + 1, Hq, Hkv, D, D});
  if (!warp) return attention_slots_each(*this, q, k_new, v_new, slots, positions, k_cache, v_cache, out, p);
  if (slots.empty()) return;
  Scratch lse(this, slots.size() * size_t(Hq) * sizeof(float));
  launch_attention_slots(stream_, t, kv, q.data(), k_new.data(), v_new.data(), k_cache.data(), v_cache.data(),
                         out.data(), lse.f32(), slots, positions, C, Hq, Hkv, D, p);
}

void CudaBackend::attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& segment_ids,
                                     const Tensor& out, const Tensor& lse, const Tensor& dout, Tensor& dq, Tensor& dk,
                                     Tensor& dv, const AttentionParams& p) {
  constexpr Kernel K = Kernel::attention_backward;
  const ST t = compute_type(q, K, "q");
  const AttnDims d = check_attention(q, k, v, K);
  const int32_t* seg = attention_segments(segment_ids, d, p, K);
  expect_same(out, q, d.B * d.T * d.Hq * d.Dv, K, "out");
  expect_same(dout, q, out.numel(), K, "dout");
  expect_f32(lse, d.B * d.Hq * d.T, K, "lse");
  expect_same(dq, q, q.numel(), K, "dq");
  expect_same(dk, q, k.numel(), K, "dk");
  expect_same(dv, q, v.numel(), K, "dv");
  Scratch s(this, size_t(std::max<int64_t>(d.B * d.Hq * d.T, 1)) * sizeof(float));
  if (opt_.flash_attention && flash_attention_applies(t, t, d, {q.data(), k.data(), v.data(), out.data(), dout.data(),
                                                                dq.data(), dk.data(), dv.data()}))
    launch_flash_attention_backward(stream_, q.data(), k.data(), v.data(), seg, out.data(), lse.data_as<float>(),
                                    dout.data(), dq.data(), dk.data(), dv.data(), d, p, s.f32());
  else if (attention_products_applies(q, k, v, d))
    attention_products_backward(q.data_as<float>(), k.data_as<float>(), v.data_as<float>(), seg, out.data_as<float>(),
                                lse.data_as<float>(), dout.data_as<float>(), dq.data_as<float>(), dk.data_as<float>(),
                                dv.data_as<float>(), d, p);
  else
    launch_attention_backward(stream_, t, q.data(), k.data(), v.data(), seg, out.data(), lse.data_as<float>(),
                              dout.data(), dq.data(), dk.data(), dv.data(), d, p, s.f32());
}

void CudaBackend::attention_max_logit(const Tensor& q, const Tensor& k, const Tensor& segment_ids, Tensor& out,
                                      const AttentionParams& p) {
  constexpr Kernel K = Kernel::attention_max_logit;
  const ST t = compute_type(q, K, "q");
  const AttnDims d = check_attention(q, k, k, K);  // k stands in for v (unused)
  const int32_t* seg = attention_segments(segment_ids, d, p, K);
  expect_f32(out, d.Hq, K, "out");
  Scratch s(this, size_t(std::max<int64_t>(d.B * d.Hq * d.T, 1)) * sizeof(float));
  launch_attention_max_logit(stream_, t, q.data(), k.data(), seg, out.data_as<float>(), d, p, s.f32());
}

// ---------------------------------------------------------------- cross-entropy

void CudaBackend::cross_entropy(const Tensor& logits, const Tensor& targets, Tensor& loss, Tensor& lse,
                                const CrossEntropyParams& p) {
  constexpr Kernel K = Kernel::cross_entropy;
  const ST t = compute_type(logits, K, "logits");
  DEW_CHECK(logits.ndim() == 2, "cuda.cross_entropy: logits ", shape_str(logits.shape()), " are not [N, V]");
  const int64_t N = logits.size(0), V = logits.size(1);
  expect_i32(targets, N, K, "targets");
  expect_f32(loss, N, K, "loss");
  expect_f32(lse, N, K, "lse");
  launch_cross_entropy(stream_, t, logits.data(), targets.data_as<int32_t>(), loss.data_as<float>(),
                       lse.data_as<float>(), N, V, p.ignore_index, err_);
}

void CudaBackend::cross_entropy_backward(const Tensor& logits, const Tensor& targets, const Tensor& lse,
                                         const Tensor& dloss, Tensor& dlogits, const CrossEntropyParams& p) {
  constexpr Kernel K = Kernel::cross_entropy_backward;
  const ST t = compute_type(logits, K, "logits");
  DEW_CHECK(logits.ndim() == 2, "cuda.cross_entropy_backward: logits ", shape_str(logits.shape()), " are not [N, V]");
  const int64_t N = logits.size(0), V = logits.size(1);
  expect_i32(targets, N, K, "targets");
  expect_f32(lse, N, K, "lse");
  expect_f32(dloss, N, K, "dloss");
  expect_same(dlogits, logits, logits.numel(), K, "dlogits");
  launch_cross_entropy_backward(stream_, t, logits.data(), targets.data_as<int32_t>(), lse.data_as<float>(),
                                dloss.data_as<float>(), dlogits.data(), N, V, p.ignore_index);
}

// ---------------------------------------------------------------- optimizers

void CudaBackend::adamw_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamWParams& p) {
  constexpr Kernel K = Kernel::adamw_update;
  const ST t = compute_type(param, K, "param");
  expect_same(grad, param, param.numel(), K, "grad");
  expect_same(m, param, param.numel(), K, "m");
  expect_same(v, param, param.numel(), K, "v");
  DEW_CHECK(p.step >= 1, "cuda.adamw_update: step ", p.step, " must count from 1");
  launch_adamw(stream_, t, param.data(), grad.data(), m.data(), v.data(), param.numel(), p);
}

// The group in a few launches (optim.cu): a GPT-2-small step's 150-odd tensors, most of them small, took a launch
// each, and the small ones cost their launch more than their bytes.
void CudaBackend::adamw_update_group(std::vector<AdamWSlot>& slots, const AdamWParams& p) {
  constexpr Kernel K = Kernel::adamw_update_group;
  check_adamw_group(slots, name().c_str());
  DEW_CHECK(p.step >= 1, "cuda.adamw_update_group: step ", p.step, " must count from 1");
  if (slots.empty()) return;
  const ST t = compute_type(slots[0].param, K, "param");
  std::vector<AdamGroupSlot> list;
  list.reserve(slots.size());
  for (AdamWSlot& s : slots) {
    for (const Tensor* x : {&s.grad, &s.m, &s.v}) expect_same(*x, s.param, s.param.numel(), K, "grad, m, v");
    list.push_back({s.param.data(), s.grad.data(), s.m.data(), s.v.data(), s.param.numel(), s.lr, s.weight_decay});
  }
  launch_adamw_group(stream_, t, list.data(), int64_t(list.size()), p);
}

void CudaBackend::lerp_group(std::vector<LerpSlot>& slots, float weight) {
  constexpr Kernel K = Kernel::lerp_group;
  check_lerp_group(slots, name().c_str());
  if (slots.empty()) return;
  const ST t = compute_type(slots[0].average, K, "average");
  std::vector<LerpGroupSlot> list;
  list.reserve(slots.size());
  for (LerpSlot& s : slots) {
    expect_same(s.target, s.average, s.average.numel(), K, "target");
    list.push_back({s.average.data(), s.target.data(), s.average.numel()});
  }
  launch_lerp_group(stream_, t, list.data(), int64_t(list.size()), weight);
}

void CudaBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& momentum_buf, const SgdParams& p) {
  constexpr Kernel K = Kernel::sgd_update;
  const ST t = compute_type(param, K, "param");
  expect_same(grad, param, param.numel(), K, "grad");
  const bool use_buf = p.momentum != 0.0f;
  if (use_buf) expect_same(momentum_buf, param, param.numel(), K, "momentum_buf");
  DEW_CHECK(p.step >= 1, "cuda.sgd_update: step ", p.step, " must count from 1");
  launch_sgd(stream_, t, param.data(), grad.data(), use_buf ? momentum_buf.data() : nullptr, param.numel(), p);
}

void CudaBackend::lamb_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const LambParams& p) {
  constexpr Kernel K = Kernel::lamb_update;
  const ST t = compute_type(param, K, "param");
  expect_same(grad, param, param.numel(), K, "grad");
  expect_same(m, param, param.numel(), K, "m");
  expect_same(v, param, param.numel(), K, "v");
  DEW_CHECK(p.step >= 1, "cuda.lamb_update: step ", p.step, " must count from 1");
  Scratch s(this, size_t(lamb_scratch_floats(param.numel())) * sizeof(float));
  launch_lamb(stream_, t, param.data(), grad.data(), m.data(), v.data(), param.numel(), p, s.f32());
}

// ---------------------------------------------------------------- random

void CudaBackend::random(Tensor& out, const RandomParams& p) {
  const ST t = compute_type(out, Kernel::random, "out");
  launch_random(stream_, t, out.data(), out.numel(), p);
}

void CudaBackend::dropout(const Tensor& x, Tensor& y, Tensor& mask, const DropoutParams& p) {
  constexpr Kernel K = Kernel::dropout;
  const ST t = compute_type(x, K, "x");
  expect_same(y, x, x.numel(), K, "y");
  expect_same(mask, x, x.numel(), K, "mask");
  DEW_CHECK(p.p >= 0.0f && p.p <= 1.0f, "cuda.dropout: p = ", p.p, " is outside [0, 1]");
  launch_dropout(stream_, t, x.data(), y.data(), mask.data(), x.numel(), p);
}

}  // namespace dew::cuda
