// tests/backends_cuda/emulation/fake_cudart.cpp — the CUDA runtime calls of the cuda backend, on the CPU, for the
// emulated plugin (dew_cuda_emulated: the plugin's own sources with its kernels run by cuda_emulation.hpp).
// What it models: one device (an H200's attributes: compute capability 9.0, 141 GiB, 227 KiB opt-in shared
// memory); device memory is host memory from aligned_alloc (256-byte aligned as cudaMalloc's), filled with 0xFF
// bytes (NaN in every float type) so that a kernel reading memory nobody wrote shows; every stream and event is
// synchronous (a kernel has run when its launch returns). It checks what the driver checks and a CPU run would
// otherwise hide: cudaFree of a pointer that is not a live allocation, a copy whose direction does not match
// where its pointers live (a host pointer passed as device memory, or the reverse), memset / copies that run
// past the end of an allocation, and dynamic shared memory above 48 KiB without cudaFuncSetAttribute.
// Not modelled: concurrency (streams, events, host-device overlap), multiple devices, device timing (an event
// records the host clock, so the profiler's device clock reads the emulated kernels' host time).
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "cuda_emulation.hpp"

namespace {

struct Memory {
  std::mutex mutex;
  std::map<uintptr_t, size_t> device, host;  // live allocations: start -> bytes
};
Memory& memory() {
  static Memory m;
  return m;
}

// Whether [p, p + n) lies inside one live allocation of `in`.
bool inside(const std::map<uintptr_t, size_t>& in, const void* p, size_t n) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = in.upper_bound(a);
  if (it == in.begin()) return false;
  --it;
  return a >= it->first && a + n <= it->first + it->second;
}
bool is_device(const void* p, size_t n) {
  std::lock_guard<std::mutex> lock(memory().mutex);
  return inside(memory().device, p, n);
}

cudaError_t fail(cudaError_t e, const char* what) {
  std::fprintf(stderr, "fake cudart: %s\n", what);
  emu::last_error() = e;
  return e;
}

void* allocate(std::map<uintptr_t, size_t>& in, size_t n) {
  const size_t bytes = (n + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, bytes == 0 ? 256 : bytes);
  if (!p) return nullptr;
  std::memset(p, 0xFF, bytes == 0 ? 256 : bytes);
  std::lock_guard<std::mutex> lock(memory().mutex);
  in[reinterpret_cast<uintptr_t>(p)] = n;
  return p;
}
cudaError_t release(std::map<uintptr_t, size_t>& in, void* p, const char* what) {
  if (!p) return cudaSuccess;
  {
    std::lock_guard<std::mutex> lock(memory().mutex);
    auto it = in.find(reinterpret_cast<uintptr_t>(p));
    if (it == in.end()) return fail(cudaErrorInvalidValue, what);
    in.erase(it);
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (n == 0) return cudaSuccess;
  const bool dd = is_device(dst, n), sd = is_device(src, n);
  bool ok = true;
  switch (kind) {
    case cudaMemcpyHostToDevice:
      ok = dd && !sd;
      break;
    case cudaMemcpyDeviceToHost:
      ok = sd && !dd;
      break;
    case cudaMemcpyDeviceToDevice:
      ok = sd && dd;
      break;
    case cudaMemcpyHostToHost:
      ok = !sd && !dd;
      break;
    default:
      break;  // cudaMemcpyDefault: either
  }
  if (!ok)
    return fail(cudaErrorInvalidValue,
                "cudaMemcpy: a pointer is not where the copy's kind says (or the copy "
                "runs past the end of its allocation)");
  std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t set(void* p, int value, size_t n) {
  if (n == 0) return cudaSuccess;
  if (!is_device(p, n)) return fail(cudaErrorInvalidValue, "cudaMemset: not inside one device allocation");
  std::memset(p, value, n);
  return cudaSuccess;
}

struct Token {
  int kind;
  double recorded_ms = 0;  // an event's: the host clock at its record (kernels run at their launch)
};

}  // namespace

extern "C" {

cudaError_t cudaDriverGetVersion(int* v) {
  *v = CUDART_VERSION;
  return cudaSuccess;
}
cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}
cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : fail(cudaErrorInvalidDevice, "cudaSetDevice: only device 0 exists");
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice, "cudaDeviceGetAttribute: only device 0 exists");
  switch (attr) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = 9;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = 0;
      return cudaSuccess;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin:
      *value = int(emu::kOptInSmem);
      return cudaSuccess;
    case cudaDevAttrMultiProcessorCount:
      *value = 132;
      return cudaSuccess;
    default:
      return fail(cudaErrorInvalidValue, "cudaDeviceGetAttribute: an attribute the fake runtime does not know");
  }
}
cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total_bytes) {
  *total_bytes = size_t(141) << 30;
  *free_bytes = *total_bytes / 2;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = emu::last_error();
  emu::last_error() = cudaSuccess;
  return e;
}
const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice:
      return "cudaErrorInvalidDevice";
    default:
      return "cudaError (fake runtime)";
  }
}
const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    default:
      return "error (fake runtime)";
  }
}

cudaError_t cudaMalloc(void** p, size_t n) {
  *p = allocate(memory().device, n);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cudaMalloc: out of host memory");
}
cudaError_t cudaFree(void* p) { return release(memory().device, p, "cudaFree: not a live device allocation"); }
cudaError_t cudaHostAlloc(void** p, size_t n, unsigned int) {
  *p = allocate(memory().host, n);
  return *p ? cudaSuccess : fail(cudaErrorMemoryAllocation, "cudaHostAlloc: out of host memory");
}
cudaError_t cudaFreeHost(void* p) { return release(memory().host, p, "cudaFreeHost: not a live host allocation"); }

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) { return copy(dst, src, n, kind); }
cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t) {
  return copy(dst, src, n, kind);
}
cudaError_t cudaMemset(void* p, int value, size_t n) { return set(p, value, n); }
cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t) { return set(p, value, n); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) {
  *s = reinterpret_cast<cudaStream_t>(new Token{1});
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  delete reinterpret_cast<Token*>(s);
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) {
  *e = reinterpret_cast<cudaEvent_t>(new Token{2});
  return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
  delete reinterpret_cast<Token*>(e);
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t) {
  reinterpret_cast<Token*>(e)->recorded_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch()).count();
  return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t from, cudaEvent_t to) {
  *ms = float(reinterpret_cast<Token*>(to)->recorded_ms - reinterpret_cast<Token*>(from)->recorded_ms);
  return cudaSuccess;
}
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: an attribute the fake runtime does not know");
  if (value < 0 || size_t(value) > emu::kOptInSmem)
    return fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: more dynamic shared memory than the device has");
  emu::smem_opt_in()[func] = size_t(value);
  return cudaSuccess;
}

}  // extern "C"
