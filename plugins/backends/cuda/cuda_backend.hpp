// cuda/cuda_backend.hpp — the `cuda` backend's class and its host-side helpers (internal; g++ only).
//
// The GPU backend: cuBLASLt for matmul (f32, TF32 or bf16-input modes with f32 accumulation; bias and
// relu/gelu-tanh epilogues fused), cuDNN's convolution API for conv2d and its two backwards, and the
// CUDA kernels of kernels.cuh for everything else. One device and one stream per backend; every kernel
// is enqueued on that stream, so the host never waits inside a training step except where a value is
// asked for (copy_to_host, synchronize).
// Invariants:
//  * memory comes from a caching allocator: freed blocks are kept by rounded size and reused (a training
//    step allocates the same sizes every step); on cudaMalloc failure the cache is released and the
//    allocation retried once. Reuse is safe because every use of a block is ordered on the one stream;
//  * host -> device copies go through pinned staging buffers whose reuse waits on an event, so a copy
//    never blocks on the stream and the caller's buffer may be freed at once;
//  * shapes and dtypes are validated on the host before anything is enqueued (checks.cpp); argument
//    errors only the device can see (indices, targets) are raised at the next synchronisation point;
//  * compute dtypes are f32 and bf16 (f32 statistics); fill/cast/strided_copy/gather_rows move every dtype.
#pragma once
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "dew/backend.hpp"
#include "dew/kernel_contracts.hpp"
#include "dew/error.hpp"
#include "dew/options.hpp"
#include "dew/tensor.hpp"
#include "kernels.cuh"

// "cuda", or "cuda-emulated" for the same sources run on the CPU (tests/backends_cuda/emulation), which must be
// loadable beside the real plugin.
#ifndef DEW_CUDA_BACKEND_NAME
#define DEW_CUDA_BACKEND_NAME "cuda"
#endif

namespace dew::cuda {

// ---------------------------------------------------------------- options and probe (probe.cpp)

// Precision of f32 matmuls/convolutions, PyTorch's set_float32_matmul_precision names:
// highest = plain f32, high = TF32 tensor cores, medium = bf16 inputs with f32 accumulation.
enum class Precision : uint8_t { highest, high, medium };
const char* precision_name(Precision p);

struct CudaOptions {
  int device = -1;  // -1: LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_RANK modulo the device count, else 0
  Precision matmul = Precision::highest;
  bool caching_allocator = true;
  int64_t workspace_mb = 32;  // cuBLASLt workspace
  // `attention = auto`: the tensor-core kernels (flash_attention.cu) wherever they apply (bf16, head width 32, 64
  // or 128); f32 calls by cuBLASLt products (attention_products.cpp) where T * S is large enough that they win
  // (its top comment states the rule), the warp-per-row kernel (attention.cu) elsewhere; `products`: as auto, but
  // every f32 call by products; `warp`: the warp-per-row kernel everywhere.
  bool flash_attention = true;
  enum class F32Attention : uint8_t { automatic, products, warp };
  F32Attention f32_attention = F32Attention::automatic;
};
// Reads and validates the backend's options (usage errors name the key).
CudaOptions parse_options(const Options& o);
// The device a backend with `requested` (-1 = auto) uses among `count` devices; env may name the
// process's local rank.
int pick_device(int requested, int count);

// Can this process run CUDA kernels here? no driver / no device / too old a device / cuDNN mismatch.
Support probe();

// ---------------------------------------------------------------- shape checks (checks.cpp)

// The compute storage type of a floating tensor, or a dew::Error naming the kernel and the argument.
ST compute_type(const Tensor& t, Kernel k, const char* what);
void expect_same(const Tensor& t, const Tensor& like, int64_t numel, Kernel k, const char* what);
void expect_f32(const Tensor& t, int64_t numel, Kernel k, const char* what);
void expect_i32(const Tensor& t, int64_t numel, Kernel k, const char* what);
Support support_of(Kernel k, DType dtype);

using RowsDims = contracts::RowsShape;  // dew/kernel_contracts.hpp
RowsDims check_rows(const Tensor& table, const Tensor& idx, const Tensor& rows, Kernel k);
// Shapes, and dtypes: one, or (kern == attention) f32 q over bf16 k and v (a bf16 decode cache).
AttnDims check_attention(const Tensor& q, const Tensor& k, const Tensor& v, Kernel kern);
// segment_ids' device pointer (i32 [B, S], contracts::check_attention_segments), or nullptr when undefined.
const int32_t* attention_segments(const Tensor& segment_ids, const AttnDims& d, const AttentionParams& p, Kernel kern);
struct ConvDims {
  int64_t N, C, H, W, O, Cg, KH, KW, OH, OW;
};
ConvDims check_conv(const Shape& x, const Tensor& w, const Shape& y, const Conv2dParams& p, Kernel k);
void check_matmul(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, const MatmulParams& p);
// Coalesced strided-copy description (unit dims dropped, contiguous runs merged); throws past kMaxRank.
StridedDesc coalesce_copy(const StridedCopyParams& p, int64_t src_numel, int64_t dst_numel);
// Broadcast strides of a and b over out's shape (numpy rules), coalesced.
StridedDesc broadcast_desc(const Shape& a, const Shape& b, const Shape& out);
// The bit pattern of `value` stored in dtype dt (little-endian, in the low bytes), as ref's fill writes it.
uint64_t fill_pattern(DType dt, double value);

// A row-major f32 product for CudaBackend::gemm_f32 (matmul.cpp): per batch q < batch,
//   C_q [m, n] = alpha op(A_q) op(B_q) + beta C_q,
// A_q stored [m, k] (or [k, m] when trans_a) with row stride lda, at a + q * stride_a; B_q likewise [k, n] (or
// [n, k] when trans_b); C_q [m, n] with row stride ldc at c + q * stride_c. A stride of 0 shares the operand.
struct RawGemm {
  int64_t m = 0, n = 0, k = 0, batch = 1;
  const float* a = nullptr;
  int64_t lda = 0, stride_a = 0;
  bool trans_a = false;
  const float* b = nullptr;
  int64_t ldb = 0, stride_b = 0;
  bool trans_b = false;
  float* c = nullptr;
  int64_t ldc = 0, stride_c = 0;
  float alpha = 1.0f, beta = 0.0f;
};

// ---------------------------------------------------------------- the backend

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const Options& options);
  ~CudaBackend() override;

  std::string name() const override { return DEW_CUDA_BACKEND_NAME; }
  // Device memory; host memory in the CPU emulation of this backend (tests/backends_cuda/emulation), which says so.
#ifdef DEW_CUDA_EMULATED
  bool host_accessible() const override { return true; }
#else
  bool host_accessible() const override { return false; }
#endif
  Support supports(Kernel k, DType dtype) const override { return support_of(k, dtype); }
  void synchronize() override;

  void* allocate(size_t bytes) override;
  void deallocate(void* ptr, size_t bytes) override;
  void copy_from_host(void* dst, const void* src, size_t bytes) override;
  void copy_to_host(void* dst, const void* src, size_t bytes) override;
  void copy_device(void* dst, const void* src, size_t bytes) override;
  // In use: blocks handed out by allocate() (at their rounded size, scratch buffers included); reserved
  // adds the caching allocator's free blocks. cuBLASLt's fixed workspace and the pinned staging are not counted.
  MemoryStats memory_stats() const override;
  void reset_memory_peak() override { memory_.reset_peak(); }
  // The device clock (the profiler's): cudaEvents with timing recorded on the stream, a pool reused after
  // device_marks_release().
  int64_t device_mark() override;
  double device_elapsed_ms(int64_t from, int64_t to) override;
  void device_marks_release() override { marks_used_ = 0; }

  // The kernel algebra: one definition per entry of dew/kernel_table.hpp, in the family files.
  DEW_KERNEL_OVERRIDES

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

 private:
  // A temporary device buffer from the caching allocator, returned to it on scope exit (stream order
  // makes the reuse safe).
  struct Scratch {
    CudaBackend* owner = nullptr;
    void* ptr = nullptr;
    size_t bytes = 0;
    Scratch() = default;
    Scratch(CudaBackend* o, size_t n) : owner(o), ptr(n ? o->allocate(n) : nullptr), bytes(n) {}
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    ~Scratch() {
      if (ptr) owner->deallocate(ptr, bytes);
    }
    float* f32() const { return static_cast<float*>(ptr); }
  };
  void raise_device_errors();  // after a synchronisation: throws the recorded device-side error, if any
  void make_current() const;

  // ---- caching allocator ----
  void* raw_alloc(size_t bytes);
  void release_cache();
  mutable std::mutex alloc_mu_;
  std::unordered_map<size_t, std::vector<void*>> free_blocks_;
  size_t cached_bytes_ = 0;
  MemoryCounter memory_;

  // ---- pinned staging for host -> device copies ----
  struct Staging {
    void* host = nullptr;
    size_t bytes = 0;
    cudaEvent_t done = nullptr;
    bool used = false;
  };
  std::mutex staging_mu_;
  std::vector<Staging> staging_;

  // ---- device clock ----
  std::vector<cudaEvent_t> marks_;
  size_t marks_used_ = 0;

  // ---- matmul (matmul.cpp) and convolution (conv.cpp) plans ----
  struct MatmulPlan;
  struct ConvPlan;
  std::mutex plan_mu_;
  std::unordered_map<std::string, std::shared_ptr<MatmulPlan>> matmul_plans_;
  std::unordered_map<std::string, std::shared_ptr<ConvPlan>> conv_plans_;
  void matmul_lt(const Tensor& a, const Tensor& b, const Tensor& bias, Tensor& out, const MatmulParams& p);
  // Raw-pointer f32 products (strided batches, explicit row strides), on the same plan cache; f32 compute follows
  // matmul_precision as matmul's does.
  void gemm_f32(const RawGemm& g);

  // ---- f32 attention by products (attention_products.cpp) ----
  bool attention_products_applies(const Tensor& q, const Tensor& k, const Tensor& v, const AttnDims& d) const;
  void attention_products(const float* q, const float* k, const float* v, const int32_t* seg, float* out, float* lse,
                          const AttnDims& d, const AttentionParams& p);
  void attention_products_backward(const float* q, const float* k, const float* v, const int32_t* seg, const float* out,
                                   const float* lse, const float* dout, float* dq, float* dk, float* dv,
                                   const AttnDims& d, const AttentionParams& p);
  enum class ConvKind : uint8_t { forward, backward_data, backward_weight };
  std::shared_ptr<ConvPlan> conv_plan(ConvKind kind, const ConvDims& d, const Conv2dParams& p, DType dt);

  CudaOptions opt_;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t lt_ = nullptr;
  cudnnHandle_t dnn_ = nullptr;
  void* lt_workspace_ = nullptr;
  size_t lt_workspace_bytes_ = 0;
  ErrWord* err_ = nullptr;  // device memory
};

// One line for a failed CUDA runtime / cuBLAS / cuDNN call: the expression, file:line and the decoded status.
#define DEW_CUDA_CHECK(expr)                                                                                   \
  do {                                                                                                         \
    const cudaError_t dew_cuda_rc_ = (expr);                                                                   \
    DEW_CHECK(dew_cuda_rc_ == cudaSuccess, "cuda: ", #expr, " failed: ", cudaGetErrorName(dew_cuda_rc_), " (", \
              cudaGetErrorString(dew_cuda_rc_), ")");                                                          \
  } while (0)
#define DEW_CUBLAS_CHECK(expr)                                                                                         \
  do {                                                                                                                 \
    const cublasStatus_t dew_cublas_rc_ = (expr);                                                                      \
    DEW_CHECK(dew_cublas_rc_ == CUBLAS_STATUS_SUCCESS, "cuda: ", #expr,                                                \
              " failed: ", cublasLtGetStatusName(dew_cublas_rc_), " (", cublasLtGetStatusString(dew_cublas_rc_), ")"); \
  } while (0)
#define DEW_CUDNN_CHECK(expr)                                         \
  do {                                                                \
    const cudnnStatus_t dew_cudnn_rc_ = (expr);                       \
    DEW_CHECK(dew_cudnn_rc_ == CUDNN_STATUS_SUCCESS, "cuda: ", #expr, \
              " failed: ", cudnnGetErrorString(dew_cudnn_rc_));       \
  } while (0)

}  // namespace dew::cuda
