// cuda/entry.cpp — registration of the `cuda` backend: its probe (can it run here, and if not why), its
// options, and the library versions it was built against (the plugin's build notes).
// Invariant: creating the backend where the probe says no is a usage error carrying the probe's reason
// (CudaBackend's constructor checks it too, for callers that bypass dew::create_backend).
#include <cublasLt.h>
#include <cuda_runtime_api.h>
#include <cudnn.h>

#include <dew/registry.hpp>

#include "cuda_backend.hpp"

#ifndef DEW_CUDA_ARCHS
#define DEW_CUDA_ARCHS "?"
#endif
#define DEW_CUDA_NOTES \
  "CUDA runtime " DEW_STR(CUDART_VERSION) ", cuBLASLt " DEW_STR(CUBLAS_VER_MAJOR) "." DEW_STR(                     \
      CUBLAS_VER_MINOR) "." DEW_STR(CUBLAS_VER_PATCH) ", cuDNN " DEW_STR(CUDNN_MAJOR) "." DEW_STR(CUDNN_MINOR) "." \
      DEW_STR(CUDNN_PATCHLEVEL) "; architectures " DEW_CUDA_ARCHS

DEW_PLUGIN_WITH_NOTES(DEW_CUDA_BACKEND_NAME, "0.1.0", DEW_CUDA_NOTES) {
  registrar.add<dew::Backend>({
      .name = DEW_CUDA_BACKEND_NAME,
      .description = "NVIDIA GPU backend: cuBLASLt matmul, cuDNN convolution, CUDA kernels (f32, bf16)",
      .factory = [](const dew::Options& o) -> std::shared_ptr<dew::Backend> {
        return std::make_shared<dew::cuda::CudaBackend>(o);
      },
      .probe = [] { return dew::cuda::probe(); },
      .options = {{"device", "-1",
                   "CUDA device index (-1: the local rank from LOCAL_RANK / OMPI_COMM_WORLD_LOCAL_RANK, else 0)"},
                  {"matmul_precision", "highest",
                   "f32 matmul/conv precision: highest (f32), high (TF32), medium (bf16 inputs, f32 accumulation); "
                   "set from [run] matmul_precision"},
                  {"allocator", "caching", "caching (reuse freed blocks by size) or direct (cudaMalloc/cudaFree)"},
                  {"workspace_mb", "32", "cuBLASLt workspace in MiB"}},
  });
}
