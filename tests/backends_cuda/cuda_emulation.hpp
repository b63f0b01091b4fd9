// tests/backends_cuda/cuda_emulation.hpp — runs a CUDA kernel's own source on the CPU, one block at a time, each
// thread of the block a fiber on one OS thread, so that the cuda backend's kernels are tested on every machine,
// with or without a GPU: the attention kernels directly (test_attention_emulated.cpp), and every .cu file of the
// plugin, included after this header into the emulated plugin (tests/backends_cuda/CMakeLists.txt, emulation/).
// What it provides, and how it models the hardware:
//   * the CUDA keywords (__global__, __device__, __shared__ = one static per kernel for all blocks, which run
//     one after another), threadIdx / blockIdx / gridDim / blockDim, dynamic shared memory (DEW_DYNAMIC_SMEM);
//   * __syncthreads, __syncthreads_or: barriers over the block's fibers; a fiber waiting at one yields;
//   * warp collectives (__shfl_xor_sync, __reduce_min/max_sync, and the flash kernels' mma_bf16,
//     ldmatrix_x4 and ldmatrix_x4_trans) exchange through per-lane slots between two warp barriers, so every lane sees
//     the others' values as the hardware shows them; mma.m16n8k16 and ldmatrix .trans gather their operands by the PTX
//     ISA's fragment layouts (written out below, independently of the kernels' loaders);
//   * two schedules (Schedule below): warps in lockstep with cp.async copies landing at the wait that requires
//     them (the latest the hardware allows), and warps skewed as far as the barriers let them with copies landing
//     at issue (the earliest); a kernel missing a barrier or a wait gives different bits under the two;
//   * bf16 as dew's bits (round to nearest even), mma products exact and summed in double, then rounded to f32
//     (tensor cores keep at least f32 precision: results agree with the GPU's to f32 rounding, not bit for bit);
//   * launches (DEW_LAUNCH, device.cuh's launch macro): the configuration checked as the driver does, then the
//     kernel run before the launch returns; the intrinsics the .cu files use (atomics: plain read-modify-writes,
//     since fibers switch only at barriers; __umulhi, the _rn double operations, half / bf16 bit casts).
// Not modelled: memory ordering beyond the barriers (a fiber runs until it waits), timing, shared-memory banks,
// registers. ldmatrix checks its 16-byte alignment; a kernel that reads out of a block's dynamic shared memory
// is not caught (use the address sanitizer build for that).
#pragma once
#include <ucontext.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

// cuda_runtime.h's host-usable types (dim3, uint4, cudaError_t, cudaStream_t); then the keywords its
// host_defines.h gave g++ are redefined for the emulation.
#include <cuda_runtime.h>

#include <map>
#include <memory>

#include "dew/dtype.hpp"

#define DEW_CUDA_EMULATION 1
#undef __global__
#undef __device__
#undef __host__
#undef __forceinline__
#undef __launch_bounds__
#undef __shared__
#undef __align__
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) alignas(n)
#define DEW_DYNAMIC_SMEM(name) unsigned char* name = ::emu::dynamic_smem()
#define threadIdx (::emu::thread_index())
#define blockIdx (::emu::state().block)
#define gridDim (::emu::state().grid)
#define blockDim (::emu::state().dims)

namespace emu {

// ---- fibers. On x86-64 a stack switch of our own (the callee-saved registers, MXCSR and the x87 control word on
// the old stack, then the new stack pointer): glibc's swapcontext also saves the signal mask, a system call per
// switch that took ~90 % of an emulated warp kernel's time. Elsewhere, and under AddressSanitizer (which must
// see stack switches through its swapcontext interceptor), ucontext.
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
struct Context {
  void* sp = nullptr;
};
// Saves the running fiber's registers on its stack and its stack pointer in *save, then resumes the one whose
// stack pointer is `load` (as this function's own return).
static __attribute__((naked, noinline, used)) void switch_stack(void** /*save*/, void* /*load*/) {
  asm("pushq %rbp\n pushq %rbx\n pushq %r12\n pushq %r13\n pushq %r14\n pushq %r15\n"
      "subq $8, %rsp\n stmxcsr (%rsp)\n fnstcw 4(%rsp)\n"
      "movq %rsp, (%rdi)\n movq %rsi, %rsp\n"
      "ldmxcsr (%rsp)\n fldcw 4(%rsp)\n addq $8, %rsp\n"
      "popq %r15\n popq %r14\n popq %r13\n popq %r12\n popq %rbx\n popq %rbp\n ret\n");
}
// A fresh stack whose first switch "returns" into entry, with the stack aligned as after a call.
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  auto top = reinterpret_cast<uintptr_t>(stack + bytes) & ~uintptr_t(15);
  auto* frame = reinterpret_cast<uint64_t*>(top - 72);  // 8 (MXCSR, FCW) + 6 registers + return address, then 8
  std::memset(frame, 0, 72);
  const uint32_t mxcsr = 0x1F80;
  const uint16_t fcw = 0x037F;
  std::memcpy(frame, &mxcsr, 4);
  std::memcpy(reinterpret_cast<char*>(frame) + 4, &fcw, 2);
  frame[7] = reinterpret_cast<uint64_t>(entry);
  c.sp = frame;
}
inline void switch_context(Context& from, Context& to) { switch_stack(&from.sp, to.sp); }
#else
struct Context {
  ucontext_t uc;
};
inline void make_context(Context& c, char* stack, size_t bytes, void (*entry)()) {
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = bytes;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
#endif

struct Dim3 {
  unsigned x = 1, y = 1, z = 1;
};

// How the fibers are scheduled and when cp.async copies land: the two schedules reach the hardware's extremes.
//   lockstep:  fibers round-robin, one step (to the next barrier or collective) each in turn, so the warps move
//              together; copies land at the wait that requires them (the latest the hardware allows);
//   skewed:    each warp runs alone until all its threads wait at a block barrier (or are done), then the next,
//              so warps are as far apart as the barriers allow; copies land when issued (the earliest).
// A kernel missing a barrier, or reading a tile before its wait, gives different results under the two.
enum class Schedule { lockstep, skewed };
constexpr size_t kStackBytes = 256 * 1024;  // per fiber

struct State {
  Schedule schedule = Schedule::lockstep;
  Dim3 block, grid, dims;
  int nthreads = 0, current = 0;
  std::vector<Dim3> thread;
  std::vector<Context> ctx;
  std::vector<std::unique_ptr<char[]>> stacks;  // kStackBytes each, kept from launch to launch (untouched pages
                                                // cost nothing)
  std::vector<bool> done;
  std::vector<const int*> waiting_gen;  // the generation counter a waiting fiber waits on (null: not waiting)
  std::vector<int> waiting_for;         // ... and its value when the fiber arrived
  Context main;
  std::function<void()> body;
  std::vector<unsigned char> smem;
  int block_count = 0, block_gen = 0;
  std::vector<int> warp_count, warp_gen;
  std::vector<uint64_t> slots;  // 8 words per thread
  // cp.async: per thread, the copies not yet committed, and the committed groups not yet waited for
  struct Copy {
    void* dst;
    const void* src;
    bool valid;
  };
  std::vector<std::vector<Copy>> open_group;
  std::vector<std::vector<std::vector<Copy>>> groups;
};
inline State& state() {
  static State s;
  return s;
}
inline const Dim3& thread_index() { return state().thread[size_t(state().current)]; }
inline unsigned char* dynamic_smem() { return state().smem.data(); }
inline int tid() { return state().current; }
inline uint64_t* slot(int thread) { return &state().slots[size_t(thread) * 8]; }

inline void yield() {
  State& s = state();
  switch_context(s.ctx[size_t(s.current)], s.main);
}
inline void barrier(int& count, int& gen, int n) {
  State& s = state();
  const int mine = gen;
  if (++count == n) {
    count = 0;
    ++gen;
    return;
  }
  s.waiting_gen[size_t(s.current)] = &gen;
  s.waiting_for[size_t(s.current)] = mine;
  while (gen == mine) yield();
  s.waiting_gen[size_t(s.current)] = nullptr;
}
inline bool blocked(int t) {
  const State& s = state();
  return s.waiting_gen[size_t(t)] != nullptr && *s.waiting_gen[size_t(t)] == s.waiting_for[size_t(t)];
}
inline bool at_block_barrier(int t) {
  const State& s = state();
  return blocked(t) && s.waiting_gen[size_t(t)] == &s.block_gen;
}
inline void syncthreads() {
  State& s = state();
  barrier(s.block_count, s.block_gen, s.nthreads);
}
inline void syncwarp() {
  State& s = state();
  const int w = tid() / 32;
  barrier(s.warp_count[size_t(w)], s.warp_gen[size_t(w)], 32);
}
inline int lane() { return tid() % 32; }
inline int warp_base() { return tid() / 32 * 32; }

// A fiber's whole life: the kernel body, then back to the scheduler for good.
inline void trampoline() {
  State& s = state();
  s.body();
  s.done[size_t(s.current)] = true;
  switch_context(s.ctx[size_t(s.current)], s.main);
  std::abort();  // a finished fiber is never resumed
}

// Runs body once per thread of each block of the grid (blocks in order, fibers round-robin).
inline void launch(Dim3 grid, int threads, size_t smem_bytes, const std::function<void()>& body) {
  State& s = state();
  if (threads % 32 != 0) {
    std::fprintf(stderr, "emulated launch: %d threads per block is not a whole number of warps\n", threads);
    std::abort();
  }
  s.grid = grid;
  s.dims = Dim3{unsigned(threads), 1, 1};
  s.nthreads = threads;
  s.body = body;
  s.thread.assign(size_t(threads), Dim3{});
  s.ctx.assign(size_t(threads), Context{});
  while (s.stacks.size() < size_t(threads)) s.stacks.emplace_back(new char[kStackBytes]);
  s.slots.assign(size_t(threads) * 8, 0);
  s.warp_count.assign(size_t(threads / 32), 0);
  s.open_group.assign(size_t(threads), {});
  s.groups.assign(size_t(threads), {});
  s.warp_gen.assign(size_t(threads / 32), 0);
  for (unsigned bz = 0; bz < grid.z; ++bz)
    for (unsigned by = 0; by < grid.y; ++by)
      for (unsigned bx = 0; bx < grid.x; ++bx) {
        s.block = Dim3{bx, by, bz};
        s.smem.assign(smem_bytes, 0xA5);  // garbage a kernel must overwrite before reading (NaN-ish bf16 pairs)
        s.block_count = 0;
        std::fill(s.warp_count.begin(), s.warp_count.end(), 0);
        s.done.assign(size_t(threads), false);
        for (int t = 0; t < threads; ++t) {
          s.thread[size_t(t)] = Dim3{unsigned(t), 0, 0};
          make_context(s.ctx[size_t(t)], s.stacks[size_t(t)].get(), kStackBytes, trampoline);
        }
        for (int t = 0; t < threads; ++t) s.open_group[size_t(t)].clear(), s.groups[size_t(t)].clear();
        s.waiting_gen.assign(size_t(threads), nullptr);
        s.waiting_for.assign(size_t(threads), 0);
        const auto step = [&](int t) {
          s.current = t;
          switch_context(s.main, s.ctx[size_t(t)]);
        };
        for (int live = threads; live > 0;) {
          if (s.schedule == Schedule::lockstep) {
            for (int t = 0; t < threads; ++t)
              if (!s.done[size_t(t)] && !blocked(t)) step(t);
          } else {
            for (int w = 0; w < threads / 32; ++w)
              for (bool ran = true; ran;) {  // warp w alone, until each thread is done or at a block barrier
                ran = false;
                for (int t = w * 32; t < w * 32 + 32; ++t)
                  if (!s.done[size_t(t)] && !blocked(t)) step(t), ran = true;
              }
          }
          live = 0;
          bool any_runnable = false;
          for (int t = 0; t < threads; ++t) {
            live += s.done[size_t(t)] ? 0 : 1;
            any_runnable = any_runnable || (!s.done[size_t(t)] && !blocked(t));
          }
          if (live > 0 && !any_runnable) {
            std::fprintf(stderr,
                         "emulated kernel: deadlock (every live thread waits at a barrier the others never reach)\n");
            std::abort();
          }
        }
      }
}

template <class T>
uint64_t bits_of(T v) {
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof v);
  return b;
}
template <class T>
T from_bits(uint64_t b) {
  T v;
  std::memcpy(&v, &b, sizeof v);
  return v;
}

template <class T>
T shfl_xor(T v, int mask) {
  slot(tid())[0] = bits_of(v);
  syncwarp();
  const T r = from_bits<T>(slot(warp_base() + (lane() ^ mask))[0]);
  syncwarp();
  return r;
}
template <class F>
int reduce_warp(int v, F f) {
  slot(tid())[0] = bits_of(v);
  syncwarp();
  int r = from_bits<int>(slot(warp_base())[0]);
  for (int l = 1; l < 32; ++l) r = f(r, from_bits<int>(slot(warp_base() + l)[0]));
  syncwarp();
  return r;
}
// cp.async under lockstep: as late as the hardware may land it, a copy is recorded at issue and performed by the
// wait that requires it (the groups older than the newest N), so a kernel that reads a tile before waiting (or
// before the barrier after the wait, when another thread copied it) reads the previous contents. Under skewed:
// at issue, so a kernel that refills a buffer before every warp is done with it overwrites what they read.
inline void cp_async16(void* dst, const void* src, bool valid) {
  if (state().schedule == Schedule::skewed) {  // lands at once
    if (valid)
      std::memcpy(dst, src, 16);
    else
      std::memset(dst, 0, 16);
    return;
  }
  state().open_group[size_t(tid())].push_back({dst, src, valid});
}
inline void cp_async_commit() {
  State& s = state();
  s.groups[size_t(tid())].push_back(std::move(s.open_group[size_t(tid())]));
  s.open_group[size_t(tid())].clear();
}
inline void cp_async_wait(int n) {
  auto& gs = state().groups[size_t(tid())];
  while (int(gs.size()) > n) {
    for (const State::Copy& c : gs.front())
      if (c.valid)
        std::memcpy(c.dst, c.src, 16);
      else
        std::memset(c.dst, 0, 16);
    gs.erase(gs.begin());
  }
}

inline bool syncthreads_or(bool pred) {
  slot(tid())[1] = pred ? 1 : 0;
  syncthreads();
  bool any = false;
  for (int t = 0; t < state().nthreads; ++t) any = any || slot(t)[1] != 0;
  syncthreads();
  return any;
}

}  // namespace emu

#define __syncthreads() ::emu::syncthreads()
#define __syncthreads_or(p) ::emu::syncthreads_or(p)
#define __shfl_xor_sync(mask, v, o) ::emu::shfl_xor((v), (o))
#define __reduce_min_sync(mask, v) ::emu::reduce_warp((v), [](int a, int b) { return a < b ? a : b; })
#define __reduce_max_sync(mask, v) ::emu::reduce_warp((v), [](int a, int b) { return a > b ? a : b; })

// ---- launches as the driver takes them: the configuration is checked first (a bad one launches nothing and
// leaves cudaErrorInvalidConfiguration for cudaGetLastError, as the hardware does), then the kernel runs on the
// CPU before the launch returns (every stream is synchronous here).
namespace emu {

inline cudaError_t& last_error() {
  static cudaError_t e = cudaSuccess;
  return e;
}
// Dynamic shared memory above 48 KiB needs cudaFuncSetAttribute(kernel, MaxDynamicSharedMemorySize) first, up to
// the device's opt-in limit (an H100 / H200: 227 KiB); the fake runtime records the attribute here.
constexpr size_t kDefaultSmem = 48 * 1024, kOptInSmem = 227 * 1024;
inline std::map<const void*, size_t>& smem_opt_in() {
  static std::map<const void*, size_t> m;
  return m;
}
inline Dim3 to_dim3(const dim3& d) { return Dim3{d.x, d.y, d.z}; }
inline Dim3 to_dim3(unsigned x) { return Dim3{x, 1, 1}; }
inline Dim3 to_dim3(int x) { return Dim3{unsigned(x), 1, 1}; }

template <class Kernel>
struct Launcher {
  Dim3 grid;
  long long threads;
  size_t smem;
  Kernel kernel;
  template <class... Args>
  void operator()(Args&&... args) const {
    const auto it = smem_opt_in().find(reinterpret_cast<const void*>(kernel));
    const size_t smem_limit = it == smem_opt_in().end() ? kDefaultSmem : it->second;
    const bool ok = threads >= 1 && threads <= 1024 && grid.x >= 1 && grid.y >= 1 && grid.z >= 1 &&
                    grid.x <= 2147483647u && grid.y <= 65535u && grid.z <= 65535u && smem <= smem_limit;
    if (!ok) {
      last_error() = cudaErrorInvalidConfiguration;
      return;
    }
    launch(grid, int(threads), smem, [&] { kernel(args...); });
  }
};
template <class Kernel>
Launcher<Kernel> launcher(Dim3 grid, long long threads, size_t smem, Kernel kernel) {
  return Launcher<Kernel>{grid, threads, smem, kernel};
}

}  // namespace emu

#define DEW_LAUNCH(grid, threads, smem, stream, ...) \
  ::emu::launcher(::emu::to_dim3(grid), (long long)(threads), size_t(smem), &__VA_ARGS__)

// cuda_runtime.h's typed form for nvcc (a kernel's own pointer), which g++ does not see.
template <class R, class... A>
cudaError_t cudaFuncSetAttribute(R (*kernel)(A...), cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), attr, value);
}

// ---- the CUDA intrinsics the kernels use. Fibers switch only at barriers and collectives, so a plain
// read-modify-write is atomic here; __threadfence orders nothing that needs ordering.
inline float __fmul_rn(float a, float b) { return a * b; }  // no contraction on the host build
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __uint_as_float(uint32_t u) { return ::emu::from_bits<float>(u); }
inline uint32_t __float_as_uint(float f) { return uint32_t(::emu::bits_of(f)); }
inline uint32_t __umulhi(uint32_t a, uint32_t b) { return uint32_t((uint64_t(a) * b) >> 32); }
inline double __dmul_rn(double a, double b) { return a * b; }  // the plugin is built without FMA contraction
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dsub_rn(double a, double b) { return a - b; }
inline float atomicAdd(float* p, float v) {
  const float old = *p;
  *p = old + v;
  return old;
}
inline int atomicCAS(int* p, int compare, int v) {
  const int old = *p;
  if (old == compare) *p = v;
  return old;
}
inline int atomicExch(int* p, int v) {
  const int old = *p;
  *p = v;
  return old;
}
inline void __threadfence() {}
struct __half {
  uint16_t bits;
};
inline float __half2float(__half h) { return dew::f16_to_f32(dew::f16_t{h.bits}); }
inline __half __float2half_rn(float f) { return __half{dew::f32_to_f16(f).bits}; }
inline __half __ushort_as_half(uint16_t b) { return __half{b}; }
inline uint16_t __half_as_ushort(__half h) { return h.bits; }

// ---- device.cuh's helpers and the flash kernels' PTX primitives, for the emulation.
namespace dew::cuda {

using std::max;
using std::min;

struct bf16 {
  uint16_t bits;
};
inline float bf16_value(uint16_t h) {
  const uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
// dew's f32 -> bf16 (device.cuh's to_bf16: round to nearest even, quiet NaN kept).
inline uint16_t bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline uint16_t __bfloat16_as_ushort(bf16 h) { return h.bits; }
inline bf16 __ushort_as_bfloat16(uint16_t b) { return bf16{b}; }
inline float ld(const float* p, int64_t i) { return p[i]; }
inline float ld(const bf16* p, int64_t i) { return bf16_value(p[i].bits); }
inline bf16 to_bf16(float f) { return bf16{bf16_bits(f)}; }
inline void st(float* p, int64_t i, float v) { p[i] = v; }
inline void st(bf16* p, int64_t i, float v) { p[i] = to_bf16(v); }
inline void cp_async16(void* dst, const void* src, bool valid) { ::emu::cp_async16(dst, src, valid); }
inline void cp_async_commit() { ::emu::cp_async_commit(); }
template <int N>
inline void cp_async_wait() {
  ::emu::cp_async_wait(N);
}
inline uint32_t pack_bf16(float lo, float hi) { return uint32_t(bf16_bits(lo)) | (uint32_t(bf16_bits(hi)) << 16); }

// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, by the PTX ISA's layouts (g = lane / 4, c = lane % 4):
// A (16 x 16): a[0] = rows g, cols 2c, 2c+1; a[1] = row g+8; a[2] = row g, cols 2c+8, 2c+9; a[3] = row g+8, cols
// 2c+8, 2c+9 (low half = the lower column). B (16 x 8, k x n): b0 = k 2c, 2c+1 at n g; b1 = k 2c+8, 2c+9.
// C (16 x 8): c[0], c[1] = row g, cols 2c, 2c+1; c[2], c[3] = row g+8.
inline void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  uint64_t* mine = ::emu::slot(::emu::tid());
  for (int i = 0; i < 4; ++i) mine[2 + i] = a[i];
  mine[6] = b0;
  mine[7] = b1;
  ::emu::syncwarp();
  const int base = ::emu::warp_base(), ln = ::emu::lane(), g = ln / 4, cc = ln % 4;
  auto A = [&](int r, int k) {
    const int owner = (r % 8) * 4 + (k % 8) / 2, reg = (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    const uint32_t w = uint32_t(::emu::slot(base + owner)[2 + reg]);
    return double(bf16_value(uint16_t(k % 2 ? w >> 16 : w & 0xffffu)));
  };
  auto B = [&](int k, int n) {
    const int owner = n * 4 + (k % 8) / 2;
    const uint32_t w = uint32_t(::emu::slot(base + owner)[k >= 8 ? 7 : 6]);
    return double(bf16_value(uint16_t(k % 2 ? w >> 16 : w & 0xffffu)));
  };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int r = g + (e >= 2 ? 8 : 0), n = 2 * cc + (e & 1);
    double s = double(c[e]);
    for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, n);
    out[e] = float(s);
  }
  ::emu::syncwarp();
  for (int e = 0; e < 4; ++e) c[e] = out[e];
}

// ldmatrix .x4 (plain and .trans): lane i gives row i % 8 of matrix i / 8 (16 bytes, 16-byte aligned, checked),
// then reads its registers from the rows the warp gave (row_of), between two warp barriers.
template <class Read>
inline void ldmatrix_x4_rows(const bf16* p, Read&& read) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    std::fprintf(stderr, "emulated ldmatrix: row address %p is not 16-byte aligned\n", static_cast<const void*>(p));
    std::abort();
  }
  ::emu::slot(::emu::tid())[0] = reinterpret_cast<uintptr_t>(p);
  ::emu::syncwarp();
  const int base = ::emu::warp_base();
  read([base](int i) { return reinterpret_cast<const bf16*>(::emu::slot(base + i)[0]); });
  ::emu::syncwarp();
}

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: register j of lane (g, c) = matrix j's row g, cols 2c (low) and 2c + 1
// (high).
inline void ldmatrix_x4(uint32_t (&r)[4], const bf16* p) {
  ldmatrix_x4_rows(p, [&r](auto row_of) {
    const int ln = ::emu::lane(), g = ln / 4, cc = ln % 4;
    for (int j = 0; j < 4; ++j) {
      const bf16* row = row_of(j * 8 + g);
      r[j] = uint32_t(row[2 * cc].bits) | (uint32_t(row[2 * cc + 1].bits) << 16);
    }
  });
}

// ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16: register j of lane (g, c) = matrix j's elements (row 2c, col g)
// low and (row 2c + 1, col g) high.
inline void ldmatrix_x4_trans(uint32_t (&r)[4], const bf16* p) {
  ldmatrix_x4_rows(p, [&r](auto row_of) {
    const int ln = ::emu::lane(), g = ln / 4, cc = ln % 4;
    for (int j = 0; j < 4; ++j) {
      const bf16* r0 = row_of(j * 8 + 2 * cc);
      const bf16* r1 = row_of(j * 8 + 2 * cc + 1);
      r[j] = uint32_t(r0[g].bits) | (uint32_t(r1[g].bits) << 16);
    }
  });
}

}  // namespace dew::cuda
