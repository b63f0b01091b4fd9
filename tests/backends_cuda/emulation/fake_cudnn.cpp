// tests/backends_cuda/emulation/fake_cudnn.cpp — the cuDNN calls of the cuda backend (conv.cpp, backend.cpp,
// probe.cpp) on the CPU, for the emulated plugin (dew_cuda_emulated); tested by test_fake_cudnn.cpp.
// What it models: the legacy convolution API on NCHW tensors and KCRS filters (the 4-d setters with
// CUDNN_TENSOR_NCHW), 2-d cross-correlation with padding, stride, dilation and groups, f32 or bf16 data with f32
// compute, y = alpha * op + beta * y (y not read when beta == 0; alpha and beta are host floats). Products are
// exact and summed in double, rounded once to f32 and then to bf16 (nearest even, NaN kept quiet): more accurate
// than the GPU's f32 accumulation. f32 data under any math type but CUDNN_FMA_MATH has its inputs rounded to TF32
// (10-bit mantissa, nearest even), as cuDNN may do on Ampere and newer. The algorithm queries offer one
// deterministic algorithm of the descriptor's math type that needs no workspace, and the calls accept only it.
// Checked as cuDNN checks: descriptors never set, data types that differ, and shapes that do not fit the
// convolution (CUDNN_STATUS_BAD_PARAM). Not modelled: other layouts and data types, Nd descriptors, the
// CONVOLUTION mode (flipped kernels), streams (a call has run when it returns; the handle's stream is ignored),
// timing. Anything else is refused with CUDNN_STATUS_NOT_SUPPORTED and one line on stderr.
#include <cudnn.h>

#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

struct cudnnContext {
  cudaStream_t stream = nullptr;  // kept for cudnnSetStream; every call runs at once
};
struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
};
struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t type = CUDNN_DATA_FLOAT;
  int k = 0, c = 0, r = 0, s = 0;  // KCRS; c is the channels of one group
};
struct cudnnConvolutionStruct {
  bool set = false;
  int pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1, groups = 1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace {

constexpr cudnnConvolutionFwdAlgo_t kFwdAlgo = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
constexpr cudnnConvolutionBwdDataAlgo_t kBwdDataAlgo = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
constexpr cudnnConvolutionBwdFilterAlgo_t kBwdFilterAlgo = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;

cudnnStatus_t refuse(cudnnStatus_t status, const char* format, ...) {
  char line[400];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof line, format, args);
  va_end(args);
  std::fprintf(stderr, "fake cudnn: %s\n", line);
  return status;
}

uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
uint16_t to_bf16(float f) {
  const uint32_t u = bits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);  // NaN: keep it, quiet
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);                    // nearest even
}
// f32 rounded to TF32's 10 mantissa bits, nearest even; infinities and NaN unchanged.
float to_tf32(float f) {
  const uint32_t u = bits(f);
  if ((u & 0x7F800000u) == 0x7F800000u) return f;
  return from_bits((u + 0xFFFu + ((u >> 13) & 1u)) & ~0x1FFFu);
}

// What the two 4-d setters accept: NCHW (KCRS), f32 or bf16, positive sizes, under 2^31 elements.
cudnnStatus_t check_4d(const char* call, const void* desc, cudnnTensorFormat_t format, cudnnDataType_t type, int a,
                       int b, int c, int d) {
  if (!desc) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: null descriptor", call);
  if (format != CUDNN_TENSOR_NCHW || (type != CUDNN_DATA_FLOAT && type != CUDNN_DATA_BFLOAT16))
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: format %d, data type %d (NCHW f32 or bf16 only)", call, int(format),
                  int(type));
  if (a <= 0 || b <= 0 || c <= 0 || d <= 0 || long(a) * b * c * d > 0x7FFFFFFFL)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: bad dimensions [%d, %d, %d, %d]", call, a, b, c, d);
  return CUDNN_STATUS_SUCCESS;
}

struct Geometry {
  int N, C, H, W, K, Cg, R, S, OH, OW, G;
  const cudnnConvolutionStruct* conv;
  cudnnDataType_t type;
  size_t x_size() const { return size_t(N) * C * H * W; }
  size_t w_size() const { return size_t(K) * Cg * R * S; }
  size_t y_size() const { return size_t(N) * K * OH * OW; }
};

// The descriptors checked against each other as cuDNN checks them.
cudnnStatus_t geometry(const char* call, const cudnnTensorStruct* x, const cudnnFilterStruct* w,
                       const cudnnConvolutionStruct* cv, const cudnnTensorStruct* y, Geometry& g) {
  if (!x || !w || !cv || !y) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: a null descriptor", call);
  if (!x->set || !w->set || !cv->set || !y->set)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: a descriptor that was never set", call);
  if (w->type != x->type || y->type != x->type)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: data types differ: x %d, w %d, y %d", call, int(x->type), int(w->type),
                  int(y->type));
  if (x->c != w->c * cv->groups || w->k % cv->groups != 0)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: x has %d channels, w is [%d, %d, %d, %d], %d groups", call, x->c, w->k,
                  w->c, w->r, w->s, cv->groups);
  const long span_h = long(x->h) + 2L * cv->pad_h - long(cv->dil_h) * (w->r - 1) - 1;
  const long span_w = long(x->w) + 2L * cv->pad_w - long(cv->dil_w) * (w->s - 1) - 1;
  const long oh = span_h < 0 ? 0 : span_h / cv->stride_h + 1, ow = span_w < 0 ? 0 : span_w / cv->stride_w + 1;
  if (oh == 0 || ow == 0 || y->n != x->n || y->c != w->k || y->h != oh || y->w != ow)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: y is [%d, %d, %d, %d], the convolution gives [%d, %d, %ld, %ld]", call,
                  y->n, y->c, y->h, y->w, x->n, w->k, oh, ow);
  g = Geometry{x->n, x->c, x->h, x->w, w->k, w->c, w->r, w->s, int(oh), int(ow), cv->groups, cv, x->type};
  return CUDNN_STATUS_SUCCESS;
}

// Calls f(yi, xi, wi) for every product of the convolution, y[n, k, oh, ow] += x[n, c, ih, iw] * w[k, c', r, s]
// with c = g * Cg + c' for k's group g and (ih, iw) inside x; the three operations are sums over these terms.
template <class F>
void each_term(const Geometry& g, F f) {
  const cudnnConvolutionStruct& cv = *g.conv;
  const int Kg = g.K / g.G;
  for (int n = 0; n < g.N; ++n)
    for (int k = 0; k < g.K; ++k) {
      const int c0 = k / Kg * g.Cg;
      for (int oh = 0; oh < g.OH; ++oh)
        for (int ow = 0; ow < g.OW; ++ow) {
          const size_t yi = ((size_t(n) * g.K + k) * g.OH + oh) * g.OW + ow;
          for (int c = 0; c < g.Cg; ++c)
            for (int r = 0; r < g.R; ++r) {
              const int ih = oh * cv.stride_h - cv.pad_h + r * cv.dil_h;
              if (ih < 0 || ih >= g.H) continue;
              for (int s = 0; s < g.S; ++s) {
                const int iw = ow * cv.stride_w - cv.pad_w + s * cv.dil_w;
                if (iw < 0 || iw >= g.W) continue;
                f(yi, ((size_t(n) * g.C + c0 + c) * g.H + ih) * g.W + iw, ((size_t(k) * g.Cg + c) * g.R + r) * g.S + s);
              }
            }
        }
    }
}

std::vector<double> load(const void* p, size_t n, const Geometry& g) {
  const bool tf32 = g.type == CUDNN_DATA_FLOAT && g.conv->math != CUDNN_FMA_MATH;
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) {
    if (g.type == CUDNN_DATA_BFLOAT16) {
      v[i] = from_bits(uint32_t(static_cast<const uint16_t*>(p)[i]) << 16);
    } else {
      const float f = static_cast<const float*>(p)[i];
      v[i] = tf32 ? to_tf32(f) : f;
    }
  }
  return v;
}

enum class Op { forward, backward_data, backward_filter };

// One of the three operations: reads the two of x, w, y that are its inputs, writes the third,
// out = alpha * sum + beta * out.
cudnnStatus_t run(const char* call, cudnnHandle_t handle, Op op, const Geometry& g, const void* alpha, const void* beta,
                  const void* x, const void* w, const void* y, void* out) {
  const void* in_a = op == Op::backward_data ? w : x;
  const void* in_b = op == Op::forward ? w : y;
  if (!handle || !alpha || !beta || !in_a || !in_b || !out)
    return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: a null handle, data or scaling pointer", call);
  std::vector<double> X, Wt, Y, acc;
  if (op != Op::backward_data) X = load(x, g.x_size(), g);
  if (op != Op::backward_filter) Wt = load(w, g.w_size(), g);
  if (op != Op::forward) Y = load(y, g.y_size(), g);
  switch (op) {
    case Op::forward:
      acc.assign(g.y_size(), 0.0);
      each_term(g, [&](size_t yi, size_t xi, size_t wi) { acc[yi] += X[xi] * Wt[wi]; });
      break;
    case Op::backward_data:
      acc.assign(g.x_size(), 0.0);
      each_term(g, [&](size_t yi, size_t xi, size_t wi) { acc[xi] += Y[yi] * Wt[wi]; });
      break;
    case Op::backward_filter:
      acc.assign(g.w_size(), 0.0);
      each_term(g, [&](size_t yi, size_t xi, size_t wi) { acc[wi] += Y[yi] * X[xi]; });
      break;
  }
  const double a = *static_cast<const float*>(alpha), b = *static_cast<const float*>(beta);
  for (size_t i = 0; i < acc.size(); ++i) {
    double v = a * acc[i];
    if (g.type == CUDNN_DATA_BFLOAT16) {
      uint16_t* o = static_cast<uint16_t*>(out);
      if (b != 0) v += b * double(from_bits(uint32_t(o[i]) << 16));
      o[i] = to_bf16(float(v));
    } else {
      float* o = static_cast<float*>(out);
      if (b != 0) v += b * double(o[i]);
      o[i] = float(v);
    }
  }
  return CUDNN_STATUS_SUCCESS;
}

// The one algorithm on offer, as a perf result of the descriptor's math type.
template <class Perf, class Algo>
cudnnStatus_t offer(const char* call, cudnnStatus_t checked, const Geometry& g, Algo algo, int requested, int* returned,
                    Perf* perf) {
  if (checked != CUDNN_STATUS_SUCCESS) return checked;
  if (!returned || !perf || requested < 1)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: no room for a result (%d requested)", call, requested);
  std::memset(static_cast<void*>(perf), 0, sizeof(Perf));  // time 0, memory (workspace) 0
  perf->algo = algo;
  perf->status = CUDNN_STATUS_SUCCESS;
  perf->determinism = CUDNN_DETERMINISTIC;
  perf->mathType = g.conv->math;
  *returned = 1;
  return CUDNN_STATUS_SUCCESS;
}

template <class Algo>
cudnnStatus_t check_algo(const char* call, cudnnStatus_t checked, Algo algo, Algo offered) {
  if (checked != CUDNN_STATUS_SUCCESS) return checked;
  if (algo != offered)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: algorithm %d was not offered (only %d is)", call, int(algo),
                  int(offered));
  return CUDNN_STATUS_SUCCESS;
}

// cudnnCreate* and cudnnDestroy*: a new object, or none.
template <class T>
cudnnStatus_t make(T** out, const char* what) {
  if (!out) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "creating %s: null result pointer", what);
  *out = new T;
  return CUDNN_STATUS_SUCCESS;
}
template <class T>
cudnnStatus_t release(T* p) {
  delete p;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t workspace(cudnnStatus_t checked, size_t* size) {
  if (checked != CUDNN_STATUS_SUCCESS) return checked;
  if (!size) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "a workspace size query without a result pointer");
  *size = 0;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

extern "C" {

size_t cudnnGetVersion(void) { return CUDNN_VERSION; }

const char* cudnnGetErrorString(cudnnStatus_t status) {
  if (status == CUDNN_STATUS_SUCCESS) return "CUDNN_STATUS_SUCCESS";
  if (status == CUDNN_STATUS_BAD_PARAM) return "CUDNN_STATUS_BAD_PARAM";
  if (status == CUDNN_STATUS_BAD_PARAM_NULL_POINTER) return "CUDNN_STATUS_BAD_PARAM_NULL_POINTER";
  if (status == CUDNN_STATUS_NOT_SUPPORTED) return "CUDNN_STATUS_NOT_SUPPORTED";
  return "CUDNN_STATUS (a code the fake cuDNN does not return)";
}

cudnnStatus_t cudnnCreate(cudnnHandle_t* handle) { return make(handle, "a handle"); }
cudnnStatus_t cudnnDestroy(cudnnHandle_t handle) { return release(handle); }
cudnnStatus_t cudnnSetStream(cudnnHandle_t handle, cudaStream_t stream) {
  if (!handle) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: null handle", __func__);
  handle->stream = stream;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* desc) { return make(desc, "a tensor"); }
cudnnStatus_t cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t desc) { return release(desc); }
cudnnStatus_t cudnnSetTensor4dDescriptor(cudnnTensorDescriptor_t desc, cudnnTensorFormat_t format, cudnnDataType_t type,
                                         int n, int c, int h, int w) {
  const cudnnStatus_t s = check_4d("cudnnSetTensor4dDescriptor", desc, format, type, n, c, h, w);
  if (s == CUDNN_STATUS_SUCCESS) *desc = cudnnTensorStruct{true, type, n, c, h, w};
  return s;
}

cudnnStatus_t cudnnCreateFilterDescriptor(cudnnFilterDescriptor_t* desc) { return make(desc, "a filter"); }
cudnnStatus_t cudnnDestroyFilterDescriptor(cudnnFilterDescriptor_t desc) { return release(desc); }
cudnnStatus_t cudnnSetFilter4dDescriptor(cudnnFilterDescriptor_t desc, cudnnDataType_t type, cudnnTensorFormat_t format,
                                         int k, int c, int h, int w) {
  const cudnnStatus_t s = check_4d("cudnnSetFilter4dDescriptor", desc, format, type, k, c, h, w);
  if (s == CUDNN_STATUS_SUCCESS) *desc = cudnnFilterStruct{true, type, k, c, h, w};
  return s;
}

cudnnStatus_t cudnnCreateConvolutionDescriptor(cudnnConvolutionDescriptor_t* desc) { return make(desc, "a conv"); }
cudnnStatus_t cudnnDestroyConvolutionDescriptor(cudnnConvolutionDescriptor_t desc) { return release(desc); }
cudnnStatus_t cudnnSetConvolution2dDescriptor(cudnnConvolutionDescriptor_t desc, int pad_h, int pad_w, int u, int v,
                                              int dilation_h, int dilation_w, cudnnConvolutionMode_t mode,
                                              cudnnDataType_t compute) {
  if (!desc) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: null descriptor", __func__);
  if (mode != CUDNN_CROSS_CORRELATION || compute != CUDNN_DATA_FLOAT)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: mode %d, compute type %d (only cross-correlation in f32)", __func__,
                  int(mode), int(compute));
  if (pad_h < 0 || pad_w < 0 || u <= 0 || v <= 0 || dilation_h <= 0 || dilation_w <= 0)
    return refuse(CUDNN_STATUS_BAD_PARAM, "%s: pad %d %d, stride %d %d, dilation %d %d", __func__, pad_h, pad_w, u, v,
                  dilation_h, dilation_w);
  desc->set = true;
  desc->pad_h = pad_h, desc->pad_w = pad_w, desc->stride_h = u, desc->stride_w = v;
  desc->dil_h = dilation_h, desc->dil_w = dilation_w;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionGroupCount(cudnnConvolutionDescriptor_t desc, int groups) {
  if (!desc) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: null descriptor", __func__);
  if (groups <= 0) return refuse(CUDNN_STATUS_BAD_PARAM, "%s: %d groups", __func__, groups);
  desc->groups = groups;
  return CUDNN_STATUS_SUCCESS;
}
cudnnStatus_t cudnnSetConvolutionMathType(cudnnConvolutionDescriptor_t desc, cudnnMathType_t math) {
  if (!desc) return refuse(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, "%s: null descriptor", __func__);
  if (math != CUDNN_DEFAULT_MATH && math != CUDNN_TENSOR_OP_MATH && math != CUDNN_FMA_MATH)
    return refuse(CUDNN_STATUS_NOT_SUPPORTED, "%s: math type %d", __func__, int(math));
  desc->math = math;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                     const cudnnFilterDescriptor_t w,
                                                     const cudnnConvolutionDescriptor_t conv,
                                                     const cudnnTensorDescriptor_t y, const int requested,
                                                     int* returned, cudnnConvolutionFwdAlgoPerf_t* perf) {
  Geometry g;
  return offer(__func__, geometry(__func__, x, w, conv, y, g), g, kFwdAlgo, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                          const cudnnTensorDescriptor_t dy,
                                                          const cudnnConvolutionDescriptor_t conv,
                                                          const cudnnTensorDescriptor_t dx, const int requested,
                                                          int* returned, cudnnConvolutionBwdDataAlgoPerf_t* perf) {
  Geometry g;
  return offer(__func__, geometry(__func__, dx, w, conv, dy, g), g, kBwdDataAlgo, requested, returned, perf);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                            const cudnnTensorDescriptor_t dy,
                                                            const cudnnConvolutionDescriptor_t conv,
                                                            const cudnnFilterDescriptor_t dw, const int requested,
                                                            int* returned, cudnnConvolutionBwdFilterAlgoPerf_t* perf) {
  Geometry g;
  return offer(__func__, geometry(__func__, x, dw, conv, dy, g), g, kBwdFilterAlgo, requested, returned, perf);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                      const cudnnFilterDescriptor_t w,
                                                      const cudnnConvolutionDescriptor_t conv,
                                                      const cudnnTensorDescriptor_t y, cudnnConvolutionFwdAlgo_t algo,
                                                      size_t* size) {
  Geometry g;
  return workspace(check_algo(__func__, geometry(__func__, x, w, conv, y, g), algo, kFwdAlgo), size);
}
cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t, const cudnnFilterDescriptor_t w,
                                                           const cudnnTensorDescriptor_t dy,
                                                           const cudnnConvolutionDescriptor_t conv,
                                                           const cudnnTensorDescriptor_t dx,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* size) {
  Geometry g;
  return workspace(check_algo(__func__, geometry(__func__, dx, w, conv, dy, g), algo, kBwdDataAlgo), size);
}
cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t, const cudnnTensorDescriptor_t x,
                                                             const cudnnTensorDescriptor_t dy,
                                                             const cudnnConvolutionDescriptor_t conv,
                                                             const cudnnFilterDescriptor_t dw,
                                                             cudnnConvolutionBwdFilterAlgo_t algo, size_t* size) {
  Geometry g;
  return workspace(check_algo(__func__, geometry(__func__, x, dw, conv, dy, g), algo, kBwdFilterAlgo), size);
}

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xd,
                                      const void* x, const cudnnFilterDescriptor_t wd, const void* w,
                                      const cudnnConvolutionDescriptor_t conv, cudnnConvolutionFwdAlgo_t algo, void*,
                                      size_t, const void* beta, const cudnnTensorDescriptor_t yd, void* y) {
  Geometry g;
  const cudnnStatus_t s = check_algo(__func__, geometry(__func__, xd, wd, conv, yd, g), algo, kFwdAlgo);
  return s != CUDNN_STATUS_SUCCESS ? s : run(__func__, handle, Op::forward, g, alpha, beta, x, w, nullptr, y);
}
cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wd,
                                           const void* w, const cudnnTensorDescriptor_t dyd, const void* dy,
                                           const cudnnConvolutionDescriptor_t conv, cudnnConvolutionBwdDataAlgo_t algo,
                                           void*, size_t, const void* beta, const cudnnTensorDescriptor_t dxd,
                                           void* dx) {
  Geometry g;
  const cudnnStatus_t s = check_algo(__func__, geometry(__func__, dxd, wd, conv, dyd, g), algo, kBwdDataAlgo);
  return s != CUDNN_STATUS_SUCCESS ? s : run(__func__, handle, Op::backward_data, g, alpha, beta, nullptr, w, dy, dx);
}
cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xd,
                                             const void* x, const cudnnTensorDescriptor_t dyd, const void* dy,
                                             const cudnnConvolutionDescriptor_t conv,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void*, size_t, const void* beta,
                                             const cudnnFilterDescriptor_t dwd, void* dw) {
  Geometry g;
  const cudnnStatus_t s = check_algo(__func__, geometry(__func__, xd, dwd, conv, dyd, g), algo, kBwdFilterAlgo);
  return s != CUDNN_STATUS_SUCCESS ? s : run(__func__, handle, Op::backward_filter, g, alpha, beta, x, nullptr, dy, dw);
}

}  // extern "C"
