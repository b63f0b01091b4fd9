// cuda/conv.cpp — conv2d and its two backwards on cuDNN's convolution API (NCHW, groups, dilation),
// bias and its gradient by the small kernels of elementwise.cu.
// Precision: f32 with matmul_precision = highest asks cuDNN for FMA-only kernels (no TF32); high/medium
// allow TF32 tensor cores; bf16 data computes in f32 on tensor cores. Algorithms come from cuDNN's
// heuristics (no timing runs), preferring deterministic ones for the backwards; plans (descriptors,
// algorithm, workspace size) are cached per shape, dtype and kind; the workspace comes from the caching
// allocator per call.
#include <cstdio>

#include "cuda_backend.hpp"

namespace dew::cuda {

struct CudaBackend::ConvPlan {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  int algo = 0;
  size_t workspace = 0;
  ~ConvPlan() {
    if (conv) cudnnDestroyConvolutionDescriptor(conv);
    if (w) cudnnDestroyFilterDescriptor(w);
    if (y) cudnnDestroyTensorDescriptor(y);
    if (x) cudnnDestroyTensorDescriptor(x);
  }
};

namespace {

constexpr size_t kMaxWorkspace = size_t(1) << 30;

// Picks from cuDNN's ranked heuristic results: usable (success, workspace bound, the math type the
// precision allows), deterministic first when asked.
// With fma_only, results reporting another math type are taken only when none reports FMA; the
// descriptor then keeps CUDNN_FMA_MATH, which is what restricts the kernels.
template <class Perf>
const Perf* choose(const Perf* perf, int n, bool fma_only, bool prefer_deterministic) {
  for (int strict = fma_only ? 1 : 0; strict >= 0; --strict)
    for (int pass = prefer_deterministic ? 0 : 1; pass < 2; ++pass)
      for (int i = 0; i < n; ++i) {
        const Perf& r = perf[i];
        if (r.status != CUDNN_STATUS_SUCCESS || r.memory > kMaxWorkspace) continue;
        if (strict && r.mathType != CUDNN_FMA_MATH) continue;
        if (pass == 0 && r.determinism != CUDNN_DETERMINISTIC) continue;
        return &r;
      }
  return nullptr;
}

}  // namespace

std::shared_ptr<CudaBackend::ConvPlan> CudaBackend::conv_plan(ConvKind kind, const ConvDims& d, const Conv2dParams& p,
                                                              DType dtype) {
  char key[320];
  std::snprintf(key, sizeof key, "%d %d %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %lld %d",
                int(kind), int(dtype), (long long)d.N, (long long)d.C, (long long)d.H, (long long)d.W, (long long)d.O,
                (long long)d.KH, (long long)d.KW, (long long)p.stride_h, (long long)p.stride_w, (long long)p.pad_h,
                (long long)p.pad_w, (long long)p.dilation_h, (long long)p.dilation_w, (long long)p.groups,
                (long long)d.Cg, int(opt_.matmul));
  std::lock_guard lock(plan_mu_);
  std::shared_ptr<ConvPlan>& slot = conv_plans_[key];
  if (slot) return slot;

  auto plan = std::make_shared<ConvPlan>();
  const cudnnDataType_t dt = dtype == DType::bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
  DEW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->x));
  DEW_CUDNN_CHECK(cudnnCreateTensorDescriptor(&plan->y));
  DEW_CUDNN_CHECK(cudnnCreateFilterDescriptor(&plan->w));
  DEW_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&plan->conv));
  DEW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->x, CUDNN_TENSOR_NCHW, dt, int(d.N), int(d.C), int(d.H), int(d.W)));
  DEW_CUDNN_CHECK(cudnnSetTensor4dDescriptor(plan->y, CUDNN_TENSOR_NCHW, dt, int(d.N), int(d.O), int(d.OH), int(d.OW)));
  DEW_CUDNN_CHECK(
      cudnnSetFilter4dDescriptor(plan->w, dt, CUDNN_TENSOR_NCHW, int(d.O), int(d.Cg), int(d.KH), int(d.KW)));
  DEW_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(plan->conv, int(p.pad_h), int(p.pad_w), int(p.stride_h),
                                                  int(p.stride_w), int(p.dilation_h), int(p.dilation_w),
                                                  CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
  DEW_CUDNN_CHECK(cudnnSetConvolutionGroupCount(plan->conv, int(p.groups)));
  const bool fma_only = dtype == DType::f32 && opt_.matmul == Precision::highest;
  const cudnnMathType_t math =
      fma_only ? CUDNN_FMA_MATH : (dtype == DType::bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_DEFAULT_MATH);
  DEW_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, math));

  constexpr int kMax = 16;
  int n = 0;
  switch (kind) {
    case ConvKind::forward: {
      cudnnConvolutionFwdAlgoPerf_t perf[kMax];
      DEW_CUDNN_CHECK(
          cudnnGetConvolutionForwardAlgorithm_v7(dnn_, plan->x, plan->w, plan->conv, plan->y, kMax, &n, perf));
      const auto* r = choose(perf, n, fma_only, false);
      DEW_CHECK(r, "cuda.conv2d: cuDNN offers no usable forward algorithm for x [", d.N, ", ", d.C, ", ", d.H, ", ",
                d.W, "] and w [", d.O, ", ", d.Cg, ", ", d.KH, ", ", d.KW, "]");
      plan->algo = int(r->algo);
      if (!fma_only) DEW_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, r->mathType));
      DEW_CUDNN_CHECK(cudnnGetConvolutionForwardWorkspaceSize(dnn_, plan->x, plan->w, plan->conv, plan->y, r->algo,
                                                              &plan->workspace));
      break;
    }
    case ConvKind::backward_data: {
      cudnnConvolutionBwdDataAlgoPerf_t perf[kMax];
      DEW_CUDNN_CHECK(
          cudnnGetConvolutionBackwardDataAlgorithm_v7(dnn_, plan->w, plan->y, plan->conv, plan->x, kMax, &n, perf));
      const auto* r = choose(perf, n, fma_only, true);
      DEW_CHECK(r, "cuda.conv2d_backward_data: cuDNN offers no usable algorithm for dx [", d.N, ", ", d.C, ", ", d.H,
                ", ", d.W, "] and w [", d.O, ", ", d.Cg, ", ", d.KH, ", ", d.KW, "]");
      plan->algo = int(r->algo);
      if (!fma_only) DEW_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, r->mathType));
      DEW_CUDNN_CHECK(cudnnGetConvolutionBackwardDataWorkspaceSize(dnn_, plan->w, plan->y, plan->conv, plan->x, r->algo,
                                                                   &plan->workspace));
      break;
    }
    case ConvKind::backward_weight: {
      cudnnConvolutionBwdFilterAlgoPerf_t perf[kMax];
      DEW_CUDNN_CHECK(
          cudnnGetConvolutionBackwardFilterAlgorithm_v7(dnn_, plan->x, plan->y, plan->conv, plan->w, kMax, &n, perf));
      const auto* r = choose(perf, n, fma_only, true);
      DEW_CHECK(r, "cuda.conv2d_backward_weight: cuDNN offers no usable algorithm for x [", d.N, ", ", d.C, ", ", d.H,
                ", ", d.W, "] and dw [", d.O, ", ", d.Cg, ", ", d.KH, ", ", d.KW, "]");
      plan->algo = int(r->algo);
      if (!fma_only) DEW_CUDNN_CHECK(cudnnSetConvolutionMathType(plan->conv, r->mathType));
      DEW_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterWorkspaceSize(dnn_, plan->x, plan->y, plan->conv, plan->w,
                                                                     r->algo, &plan->workspace));
      break;
    }
  }
  slot = std::move(plan);
  return slot;
}

void CudaBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const Conv2dParams& p) {
  constexpr Kernel K = Kernel::conv2d;
  const ST t = compute_type(x, K, "x");
  const ConvDims d = check_conv(x.shape(), w, y.shape(), p, K);
  expect_same(w, x, w.numel(), K, "w");
  expect_same(y, x, y.numel(), K, "y");
  if (bias.defined()) expect_same(bias, x, d.O, K, "bias");
  if (y.numel() == 0) return;
  if (x.numel() == 0 || w.numel() == 0) {  // an empty sum: y = bias (or 0)
    launch_fill(stream_, y.data(), y.numel(), int(dtype_size(y.dtype())), 0);
  } else {
    auto plan = conv_plan(ConvKind::forward, d, p, x.dtype());
    Scratch ws(this, plan->workspace);
    const float alpha = 1.0f, beta = 0.0f;
    DEW_CUDNN_CHECK(cudnnConvolutionForward(dnn_, &alpha, plan->x, x.data(), plan->w, w.data(), plan->conv,
                                            cudnnConvolutionFwdAlgo_t(plan->algo), ws.ptr, plan->workspace, &beta,
                                            plan->y, y.data()));
  }
  if (bias.defined()) launch_channel_bias_add(stream_, t, y.data(), bias.data(), d.N, d.O, d.OH * d.OW);
}

void CudaBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p) {
  constexpr Kernel K = Kernel::conv2d_backward_data;
  compute_type(dy, K, "dy");
  const ConvDims d = check_conv(dx.shape(), w, dy.shape(), p, K);
  expect_same(w, dy, w.numel(), K, "w");
  expect_same(dx, dy, dx.numel(), K, "dx");
  if (dx.numel() == 0) return;
  if (dy.numel() == 0 || w.numel() == 0) {
    launch_fill(stream_, dx.data(), dx.numel(), int(dtype_size(dx.dtype())), 0);
    return;
  }
  auto plan = conv_plan(ConvKind::backward_data, d, p, dy.dtype());
  Scratch ws(this, plan->workspace);
  const float alpha = 1.0f, beta = 0.0f;
  DEW_CUDNN_CHECK(cudnnConvolutionBackwardData(dnn_, &alpha, plan->w, w.data(), plan->y, dy.data(), plan->conv,
                                               cudnnConvolutionBwdDataAlgo_t(plan->algo), ws.ptr, plan->workspace,
                                               &beta, plan->x, dx.data()));
}

void CudaBackend::conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                                         const Conv2dParams& p) {
  constexpr Kernel K = Kernel::conv2d_backward_weight;
  const ST t = compute_type(x, K, "x");
  const ConvDims d = check_conv(x.shape(), dw, dy.shape(), p, K);
  expect_same(dy, x, dy.numel(), K, "dy");
  expect_same(dw, x, dw.numel(), K, "dw");
  if (dbias.defined()) expect_same(dbias, x, d.O, K, "dbias");
  if (dw.numel() > 0) {
    if (x.numel() == 0 || dy.numel() == 0) {
      launch_fill(stream_, dw.data(), dw.numel(), int(dtype_size(dw.dtype())), 0);
    } else {
      auto plan = conv_plan(ConvKind::backward_weight, d, p, x.dtype());
      Scratch ws(this, plan->workspace);
      const float alpha = 1.0f, beta = 0.0f;
      DEW_CUDNN_CHECK(cudnnConvolutionBackwardFilter(dnn_, &alpha, plan->x, x.data(), plan->y, dy.data(), plan->conv,
                                                     cudnnConvolutionBwdFilterAlgo_t(plan->algo), ws.ptr,
                                                     plan->workspace, &beta, plan->w, dw.data()));
    }
  }
  if (dbias.defined()) launch_channel_bias_grad(stream_, t, dy.data(), dbias.data(), d.N, d.O, d.OH * d.OW);
}

}  // namespace dew::cuda
