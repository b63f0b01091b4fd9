// cuda/probe.cpp — can the cuda backend run here (the registration probe), which device it takes, and
// its options. Host-only: runs, and is unit-tested, on machines without a GPU or a driver.
// Invariants: the probe never throws and never starts work on a device; it answers no with the first
// reason found, in this order: no driver, a driver older than the runtime, no device, a device older
// than the architectures built (8.0), a cuBLAS or cuDNN library whose major version differs from (or is
// older than) the one built against. Its answer is computed once per process.
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdlib>
#include <mutex>

#include "cuda_backend.hpp"

namespace dew::cuda {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::highest:
      return "highest";
    case Precision::high:
      return "high";
    case Precision::medium:
      return "medium";
  }
  return "?";
}

CudaOptions parse_options(const Options& o) {
  CudaOptions c;
  const int64_t device = o.get_int("device", -1);
  DEW_USAGE_CHECK(device >= -1, "cuda backend: option 'device' = ", device, " must be >= 0 (or -1 = automatic)");
  c.device = int(device);
  const std::string prec = o.get_string("matmul_precision", "highest");
  if (prec == "highest" || prec == "fp32" || prec == "f32")
    c.matmul = Precision::highest;
  else if (prec == "high" || prec == "tf32")
    c.matmul = Precision::high;
  else if (prec == "medium" || prec == "bf16")
    c.matmul = Precision::medium;
  else
    DEW_USAGE_CHECK(false, "cuda backend: option 'matmul_precision' = '", prec,
                    "' is not one of highest (f32), high (TF32 tensor cores), medium (bf16 inputs, f32 accumulation)");
  const std::string alloc = o.get_string("allocator", "caching");
  DEW_USAGE_CHECK(alloc == "caching" || alloc == "direct", "cuda backend: option 'allocator' = '", alloc,
                  "' is not one of caching, direct");
  c.caching_allocator = alloc == "caching";
  c.workspace_mb = o.get_int("workspace_mb", 32);
  DEW_USAGE_CHECK(c.workspace_mb >= 1 && c.workspace_mb <= 4096,
                  "cuda backend: option 'workspace_mb' = ", c.workspace_mb, " must be in [1, 4096]");
  const std::string attention = o.get_string("attention", "auto");
  DEW_USAGE_CHECK(attention == "auto" || attention == "warp" || attention == "products",
                  "cuda backend: option 'attention' = '", attention,
                  "' is not one of auto (tensor cores for bf16 with head width 64 or 128, cuBLASLt products for large "
                  "f32 calls), products (as auto, with every f32 call by products), warp (the warp-per-row kernel "
                  "everywhere)");
  c.flash_attention = attention != "warp";
  c.f32_attention = attention == "warp"       ? CudaOptions::F32Attention::warp
                    : attention == "products" ? CudaOptions::F32Attention::products
                                              : CudaOptions::F32Attention::automatic;
  return c;
}

int pick_device(int requested, int count) {
  DEW_USAGE_CHECK(count > 0, "cuda backend: no CUDA device is visible");
  if (requested >= 0) {
    DEW_USAGE_CHECK(requested < count, "cuda backend: device ", requested, " asked for, but only ", count,
                    " device(s) are visible (CUDA_VISIBLE_DEVICES renumbers them from 0)");
    return requested;
  }
  // One process per GPU under a launcher: the local rank picks the device.
  for (const char* var : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const char* v = std::getenv(var);
    if (v && *v) {
      char* end = nullptr;
      const long r = std::strtol(v, &end, 10);
      if (end && *end == '\0' && r >= 0) return int(r % count);
    }
  }
  return 0;
}

namespace {

std::string version_str(long v, long major_div, long minor_div) {
  return std::to_string(v / major_div) + "." + std::to_string((v % major_div) / minor_div);
}

Support compute_probe() {
  int driver = 0;
  const cudaError_t de = cudaDriverGetVersion(&driver);
  if (de != cudaSuccess || driver == 0)
    return Support::no(
        "no CUDA driver (libcuda.so.1 not found: no NVIDIA driver on this machine, or the container was started "
        "without the GPU)");
  if (driver < CUDART_VERSION)
    return Support::no("the CUDA driver supports CUDA " + version_str(driver, 1000, 10) + ", older than the CUDA " +
                       version_str(CUDART_VERSION, 1000, 10) +
                       " runtime this plugin was built with; update the NVIDIA driver");
  int count = 0;
  const cudaError_t ce = cudaGetDeviceCount(&count);
  if (ce == cudaErrorNoDevice || (ce == cudaSuccess && count == 0))
    return Support::no("no CUDA device (the driver sees none; check CUDA_VISIBLE_DEVICES)");
  if (ce != cudaSuccess)
    return Support::no(std::string("no usable CUDA device: ") + cudaGetErrorName(ce) + " (" + cudaGetErrorString(ce) +
                       ")");
  const int dev = pick_device(-1, count);
  int major = 0, minor = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
  cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
  if (major < 8)
    return Support::no("CUDA device " + std::to_string(dev) + " has compute capability " + std::to_string(major) + "." +
                       std::to_string(minor) + "; this build targets 8.0 and newer (bf16 tensor cores)");
  const size_t dnn = cudnnGetVersion();
  if (long(dnn) / 10000 != CUDNN_MAJOR || long(dnn) < CUDNN_VERSION)
    return Support::no("cuDNN version mismatch: built against " + version_str(CUDNN_VERSION, 10000, 100) +
                       ", this machine loads " + version_str(long(dnn), 10000, 100) +
                       " (needs the same major version, at least as new)");
  const size_t lt = cublasLtGetVersion();
  if (long(lt) / 10000 != CUBLAS_VER_MAJOR)
    return Support::no("cuBLASLt version mismatch: built against " + version_str(CUBLAS_VERSION, 10000, 100) +
                       ", this machine loads " + version_str(long(lt), 10000, 100));
  return Support::yes();
}

}  // namespace

Support probe() {
  static std::once_flag once;
  static Support answer;
  std::call_once(once, [] {
    try {
      answer = compute_probe();
    } catch (const std::exception& e) {
      answer = Support::no(e.what());
    }
  });
  return answer;
}

}  // namespace dew::cuda
