// cuda/optim.cu — the fused optimizer updates (AdamW, one tensor or a group in a few launches; SGD; LAMB), in place
// on param and state; and lerp_group (a model's EMA in a few launches).
// Invariants: arithmetic runs in double per element (as ref does; these kernels are bound by memory, not
// arithmetic), with the bias corrections computed once on the host; grad is multiplied by grad_scale
// first. LAMB's two norms are reduced on the device (per-block partials summed in a fixed order), so no
// value travels to the host.
#include <cmath>

#include "device.cuh"

namespace dew::cuda {

// ---------------------------------------------------------------- optimizers

namespace {

struct AdamArgs {
  double lr, b1, b2, eps, wd, scale, bc1, bc2;
};

// One element's AdamW step, in double (param x, moments m and v in and out).
__device__ __forceinline__ void adamw_step(float g32, float& x32, float& m32, float& v32, const AdamArgs& a) {
  const double g = double(g32) * a.scale;
  double x = double(x32);
  x -= a.lr * a.wd * x;
  const double mi = a.b1 * double(m32) + (1.0 - a.b1) * g;
  const double vi = a.b2 * double(v32) + (1.0 - a.b2) * g * g;
  x -= a.lr * (mi / a.bc1) / (sqrt(vi / a.bc2) + a.eps);
  m32 = float(mi);
  v32 = float(vi);
  x32 = float(x);
}

// kVec: eight elements a thread through 16-byte accesses (n % 8 == 0, every buffer 16-byte aligned; 28 bytes
// an element in f32 move through memory, and one 4-byte access per array per thread kept too few in flight).
// The arithmetic per element is adamw_step's either way: the bits do not depend on the path.
// Elements [8c, 8c + 8) through 16-byte accesses, and element i alone: the two paths' one step.
template <class T>
__device__ __forceinline__ void adamw_eight(T* param, const T* grad, T* m, T* v, int64_t c, const AdamArgs& a) {
  float x[8], g[8], mv[8], vv[8];
  load8(param, 8 * c, x);
  load8(grad, 8 * c, g);
  load8(m, 8 * c, mv);
  load8(v, 8 * c, vv);
#pragma unroll
  for (int k = 0; k < 8; ++k) adamw_step(g[k], x[k], mv[k], vv[k], a);
  store8(m, 8 * c, mv);
  store8(v, 8 * c, vv);
  store8(param, 8 * c, x);
}
template <class T>
__device__ __forceinline__ void adamw_one(T* param, const T* grad, T* m, T* v, int64_t i, const AdamArgs& a) {
  float x = ld(param, i), mi = ld(m, i), vi = ld(v, i);
  adamw_step(ld(grad, i), x, mi, vi, a);
  st(m, i, mi);
  st(v, i, vi);
  st(param, i, x);
}

template <class T, bool kVec>
__global__ void adamw_kernel(T* param, const T* grad, T* m, T* v, int64_t n, AdamArgs a) {
  if (kVec) {
    DEW_GRID_STRIDE(c, n / 8) adamw_eight(param, grad, m, v, c, a);
  } else {
    DEW_GRID_STRIDE(i, n) adamw_one(param, grad, m, v, i, a);
  }
}

// adamw_update_group's launch: up to kAdamGroupSlots tensors, block b updating elements [c * kGroupChunk, (c + 1) *
// kGroupChunk) of the slot s with first_block[s] <= b < first_block[s + 1], c = b - first_block[s]. Each element runs
// adamw_step with its slot's lr and weight decay (widened from float as adam_args widens adamw_update's), on the
// 8-wide path where its tensor takes it (vectorisable), so every bit is adamw_kernel's on that tensor alone.
constexpr int64_t kGroupChunk = 8192;  // elements a block: 256 threads x 8 elements x 4 passes
struct AdamGroupArgs {
  void* param[kAdamGroupSlots];
  const void* grad[kAdamGroupSlots];
  void* m[kAdamGroupSlots];
  void* v[kAdamGroupSlots];
  int64_t n[kAdamGroupSlots];
  int64_t first_block[kAdamGroupSlots + 1];
  float lr[kAdamGroupSlots], wd[kAdamGroupSlots];
  unsigned char vec[kAdamGroupSlots];
  int count;
};
static_assert(sizeof(AdamGroupArgs) + sizeof(AdamArgs) <= 4000, "a kernel's arguments stay under 4 KiB");

// The tensor block b of a group launch serves (first_block[s] <= b < first_block[s + 1]) and its elements [lo, hi).
template <class Args>
__device__ __forceinline__ int group_slot(const Args& g, int64_t b, int64_t& lo, int64_t& hi) {
  int s = 0;
  while (s + 1 < g.count && g.first_block[s + 1] <= b) ++s;
  lo = (b - g.first_block[s]) * kGroupChunk;
  hi = lo + kGroupChunk < g.n[s] ? lo + kGroupChunk : g.n[s];
  return s;
}

// A group's launches, host side: its non-empty tensors packed kSlots at a time into an Args (n, first_block and
// count, group_slot's map; fill(g, i, slot) sets the rest of entry i), launch(g, blocks) once per launch.
template <class Args, int kSlots, class Slot, class Fill, class Launch>
void launch_group(const Slot* slots, int64_t count, const char* what, const Fill& fill, const Launch& launch) {
  int64_t next = 0;
  while (next < count) {
    Args g{};
    int64_t blocks = 0;
    for (; next < count && g.count < kSlots; ++next) {
      const Slot& x = slots[next];
      if (x.n == 0) continue;
      const int i = g.count++;
      fill(g, i, x);
      g.n[i] = x.n;
      g.first_block[i] = blocks;
      blocks += (x.n + kGroupChunk - 1) / kGroupChunk;
    }
    if (g.count == 0) break;
    g.first_block[g.count] = blocks;
    DEW_CHECK(blocks <= 2147483647, "cuda.", what, ": ", blocks, " blocks exceed one launch's grid");
    launch(g, unsigned(blocks));
    check_launch(what);
  }
}

template <class T>
__global__ void adamw_group_kernel(AdamGroupArgs g, AdamArgs base) {
  int64_t lo, hi;
  const int s = group_slot(g, int64_t(blockIdx.x), lo, hi);
  AdamArgs a = base;
  a.lr = double(g.lr[s]);
  a.wd = double(g.wd[s]);
  T* param = static_cast<T*>(g.param[s]);
  const T* grad = static_cast<const T*>(g.grad[s]);
  T* m = static_cast<T*>(g.m[s]);
  T* v = static_cast<T*>(g.v[s]);
  if (g.vec[s]) {  // n % 8 == 0 and kGroupChunk % 8 == 0: whole groups of 8
    for (int64_t c = lo / 8 + threadIdx.x; c < hi / 8; c += blockDim.x) adamw_eight(param, grad, m, v, c, a);
  } else {
    for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) adamw_one(param, grad, m, v, i, a);
  }
}

// lerp_group's launch: block b of slot s (first_block[s] <= b < first_block[s + 1]) moves elements [c * kGroupChunk,
// (c + 1) * kGroupChunk) of its average toward its target, c = b - first_block[s]. Each element is the three kernels
// lerp_group is defined by, each rounded to T as they store it: d = target - average (binary sub), weight * d + 0
// (unary affine's alpha * x + beta, which nvcc makes fma(alpha, x, 0): one rounding, +0 for a zero product),
// average + that (binary add). __fmul_rn / __fadd_rn keep nvcc from contracting the product into the last add.
struct LerpGroupArgs {
  void* average[kLerpGroupSlots];
  const void* target[kLerpGroupSlots];
  int64_t n[kLerpGroupSlots];
  int64_t first_block[kLerpGroupSlots + 1];
  int count;
};
static_assert(sizeof(LerpGroupArgs) + sizeof(float) <= 4000, "a kernel's arguments stay under 4 KiB");

template <class T>
__global__ void lerp_group_kernel(LerpGroupArgs g, float weight) {
  int64_t lo, hi;
  const int s = group_slot(g, int64_t(blockIdx.x), lo, hi);
  T* average = static_cast<T*>(g.average[s]);
  const T* target = static_cast<const T*>(g.target[s]);
  for (int64_t i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    const float a = ld(average, i);
    const float d = rounded_as<T>(ld(target, i) - a);
    const float step = rounded_as<T>(__fadd_rn(__fmul_rn(weight, d), 0.0f));
    st(average, i, __fadd_rn(a, step));
  }
}

template <class T>
__global__ void sgd_kernel(T* param, const T* grad, T* buf, int64_t n, SgdParams p) {
  const double lr = p.lr, mom = p.momentum, damp = p.dampening, wd = p.weight_decay, scale = p.grad_scale;
  DEW_GRID_STRIDE(i, n) {
    const double w = double(ld(param, i));
    double g = double(ld(grad, i)) * scale + wd * w;
    if (buf) {
      const double b = p.step == 1 ? g : mom * double(ld(buf, i)) + (1.0 - damp) * g;
      st(buf, i, float(b));
      g = p.nesterov ? g + mom * b : b;
    }
    st(param, i, float(w - lr * g));
  }
}

constexpr int kLambBlocks = 512;

// Pass 1: moments, the direction r (into scratch[0, n)) and per-block partial sums of p^2 and r^2
// (scratch[n + 2 * block], scratch[n + 2 * block + 1]).
template <class T>
__global__ void lamb_pass1_kernel(const T* param, const T* grad, T* m, T* v, int64_t n, AdamArgs a, float* scratch) {
  __shared__ float shared[32];
  float psq = 0.0f, rsq = 0.0f;
  DEW_GRID_STRIDE(i, n) {
    const double g = double(ld(grad, i)) * a.scale;
    const double w = double(ld(param, i));
    const double mi = a.b1 * double(ld(m, i)) + (1.0 - a.b1) * g;
    const double vi = a.b2 * double(ld(v, i)) + (1.0 - a.b2) * g * g;
    st(m, i, float(mi));
    st(v, i, float(vi));
    const double r = (mi / a.bc1) / (sqrt(vi / a.bc2) + a.eps) + a.wd * w;
    scratch[i] = float(r);
    psq += float(w * w);
    rsq += float(r * r);
  }
  psq = block_sum(psq, shared);
  rsq = block_sum(rsq, shared);
  if (threadIdx.x == 0) {
    scratch[n + 2 * blockIdx.x] = psq;
    scratch[n + 2 * blockIdx.x + 1] = rsq;
  }
}

// Pass 2 (one block): the trust ratio into scratch[n + 2 * kLambBlocks].
__global__ void lamb_ratio_kernel(float* scratch, int64_t n) {
  __shared__ float shared[32];
  float psq = 0.0f, rsq = 0.0f;
  for (int b = threadIdx.x; b < kLambBlocks; b += blockDim.x) {
    psq += scratch[n + 2 * b];
    rsq += scratch[n + 2 * b + 1];
  }
  psq = block_sum(psq, shared);
  rsq = block_sum(rsq, shared);
  if (threadIdx.x == 0) {
    const float pn = sqrtf(psq), rn = sqrtf(rsq);
    scratch[n + 2 * kLambBlocks] = (pn > 0.0f && rn > 0.0f) ? pn / rn : 1.0f;
  }
}

template <class T>
__global__ void lamb_pass3_kernel(T* param, int64_t n, float lr, const float* scratch) {
  const float ratio = scratch[n + 2 * kLambBlocks];
  DEW_GRID_STRIDE(i, n) st(param, i, float(double(ld(param, i)) - double(lr) * double(ratio) * double(scratch[i])));
}

AdamArgs adam_args(double lr, double b1, double b2, double eps, double wd, double scale, int64_t step) {
  return {lr, b1, b2, eps, wd, scale, 1.0 - std::pow(b1, double(step)), 1.0 - std::pow(b2, double(step))};
}

}  // namespace

void launch_adamw(cudaStream_t s, ST t, void* param, const void* grad, void* m, void* v, int64_t n,
                  const AdamWParams& p) {
  if (n == 0) return;
  const AdamArgs a = adam_args(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_scale, p.step);
  const bool vec = vectorisable(n, {param, grad, m, v});
  DEW_CUDA_DISPATCH(t, T, {
    T *x = static_cast<T*>(param), *mp = static_cast<T*>(m), *vp = static_cast<T*>(v);
    const T* g = static_cast<const T*>(grad);
    if (vec)
      DEW_LAUNCH(blocks_for(n / 8), 256, 0, s, adamw_kernel<T, true>)(x, g, mp, vp, n, a);
    else
      DEW_LAUNCH(blocks_for(n), 256, 0, s, adamw_kernel<T, false>)(x, g, mp, vp, n, a);
  });
  check_launch("adamw_update");
}

void launch_adamw_group(cudaStream_t s, ST t, const AdamGroupSlot* slots, int64_t count, const AdamWParams& p) {
  const AdamArgs base = adam_args(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_scale, p.step);
  launch_group<AdamGroupArgs, kAdamGroupSlots>(
      slots, count, "adamw_update_group",
      [](AdamGroupArgs& g, int i, const AdamGroupSlot& x) {
        g.param[i] = x.param;
        g.grad[i] = x.grad;
        g.m[i] = x.m;
        g.v[i] = x.v;
        g.lr[i] = x.lr;
        g.wd[i] = x.weight_decay;
        g.vec[i] = vectorisable(x.n, {x.param, x.grad, x.m, x.v}) ? 1 : 0;
      },
      [&](const AdamGroupArgs& g, unsigned blocks) {
        DEW_CUDA_DISPATCH(t, T, DEW_LAUNCH(blocks, 256, 0, s, adamw_group_kernel<T>)(g, base));
      });
}

void launch_lerp_group(cudaStream_t s, ST t, const LerpGroupSlot* slots, int64_t count, float weight) {
  launch_group<LerpGroupArgs, kLerpGroupSlots>(
      slots, count, "lerp_group",
      [](LerpGroupArgs& g, int i, const LerpGroupSlot& x) {
        g.average[i] = x.average;
        g.target[i] = x.target;
      },
      [&](const LerpGroupArgs& g, unsigned blocks) {
        DEW_CUDA_DISPATCH(t, T, DEW_LAUNCH(blocks, 256, 0, s, lerp_group_kernel<T>)(g, weight));
      });
}

void launch_sgd(cudaStream_t s, ST t, void* param, const void* grad, void* buf, int64_t n, const SgdParams& p) {
  if (n == 0) return;
  DEW_CUDA_DISPATCH(t, T,
                    DEW_LAUNCH(blocks_for(n), 256, 0, s, sgd_kernel<T>)(
                        static_cast<T*>(param), static_cast<const T*>(grad), static_cast<T*>(buf), n, p));
  check_launch("sgd_update");
}

int64_t lamb_scratch_floats(int64_t n) { return n + 2 * kLambBlocks + 1; }

void launch_lamb(cudaStream_t s, ST t, void* param, const void* grad, void* m, void* v, int64_t n, const LambParams& p,
                 float* scratch) {
  if (n == 0) return;
  const AdamArgs a = adam_args(p.lr, p.beta1, p.beta2, p.eps, p.weight_decay, p.grad_scale, p.step);
  DEW_CUDA_DISPATCH(t, T, {
    DEW_LAUNCH(kLambBlocks, 256, 0, s, lamb_pass1_kernel<T>)
    (static_cast<const T*>(param), static_cast<const T*>(grad), static_cast<T*>(m), static_cast<T*>(v), n, a, scratch);
    DEW_LAUNCH(1, 512, 0, s, lamb_ratio_kernel)(scratch, n);
    DEW_LAUNCH(blocks_for(n), 256, 0, s, lamb_pass3_kernel<T>)(static_cast<T*>(param), n, p.lr, scratch);
  });
  check_launch("lamb_update");
}

}  // namespace dew::cuda
