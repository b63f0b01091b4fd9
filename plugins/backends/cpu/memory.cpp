// cpu/memory.cpp — allocation, host copies, fill, cast and strided_copy (every dtype).
//
// Allocation is 64-byte aligned (a cache line / one AVX-512 vector) and rounded up to 64 bytes; freed blocks
// of every size are recycled by size through BlockCache (no page faults on the steady-state step); blocks
// of 2 MiB and more are mapped 2 MiB-aligned and asked for transparent huge pages (see new_block).
// Large copies are split over the OpenMP team (memcpy alone is bound by one core's load/store rate).
// cast follows ref's rules exactly: halves widen to f32 and integers to i64, then one conversion (to a
// half through f32, rounding to nearest even via dew/dtype.hpp); float -> integer truncates toward zero,
// saturates at the integer range and maps NaN to 0; integer -> integer narrows modulo 2^bits. strided_copy coalesces
// contiguous dimensions first, so permutes and slices run as row memcpys where the innermost axis is unit-stride on
// both sides.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <type_traits>

#include "cpu_backend.hpp"
#include "dew/kernel_contracts.hpp"

namespace dew::cpu {

// ---------------------------------------------------------------- memory

// Blocks of kHugeMin (2 MiB) and more are mapped directly (mmap), 2 MiB-aligned, in whole 2 MiB, and
// madvise(MADV_HUGEPAGE)d, so with transparent huge pages in `madvise` mode (Debian's default) they are backed
// by 2 MiB pages: the hardware prefetchers stop at page boundaries, and a training step streams its large
// activations from memory (a cold GELU pass over 4 MiB: 1.16 -> 0.87 ms). Less than 2 MiB is wasted per
// block (none for the usual power-of-two sizes); smaller blocks come from the C library as before.
constexpr size_t kHugePage = size_t(2) << 20, kHugeMin = kHugePage;

static size_t round_block(size_t bytes) {
  const size_t b = (std::max<size_t>(bytes, 1) + 63) & ~size_t(63);
  return b >= kHugeMin ? (b + kHugePage - 1) & ~(kHugePage - 1) : b;
}

// A fresh block of `rounded` bytes (a round_block size), nullptr when the system has no memory.
static void* new_block(size_t rounded) {
  if (rounded < kHugeMin) return std::aligned_alloc(64, rounded);
  // Map one huge page more than needed, then unmap the unaligned head and the tail.
  void* m = mmap(nullptr, rounded + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const uintptr_t base = reinterpret_cast<uintptr_t>(m);
  const uintptr_t aligned = (base + kHugePage - 1) & ~uintptr_t(kHugePage - 1);
  if (aligned > base) munmap(m, aligned - base);
  const uintptr_t end = base + rounded + kHugePage;
  if (end > aligned + rounded) munmap(reinterpret_cast<void*>(aligned + rounded), end - (aligned + rounded));
  void* p = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  (void)madvise(p, rounded, MADV_HUGEPAGE);  // a hint: without THP the block keeps 4 KiB pages
#endif
  return p;
}
static void free_block(void* p, size_t rounded) {
  if (rounded < kHugeMin)
    std::free(p);
  else
    munmap(p, rounded);
}

BlockCache::~BlockCache() {
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) free_block(p, size);
}

void* BlockCache::take(size_t rounded) {
  if (rounded < kMinBytes) return nullptr;
  std::lock_guard lock(mutex_);
  auto it = free_.find(rounded);
  if (it == free_.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  cached_ -= rounded;
  return p;
}

bool BlockCache::give(void* p, size_t rounded) {
  if (rounded < kMinBytes || limit_ == 0) return false;
  std::lock_guard lock(mutex_);
  free_[rounded].push_back(p);
  cached_ += rounded;
  return true;
}

void BlockCache::make_room(size_t rounded, size_t in_use) {
  const size_t cap = high_water_.load(std::memory_order_relaxed) + limit_;
  std::lock_guard lock(mutex_);
  while (cached_ > 0 && in_use + cached_ + rounded > cap) {
    auto largest = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (!it->second.empty() && (largest == free_.end() || it->first > largest->first)) largest = it;
    free_block(largest->second.back(), largest->first);
    largest->second.pop_back();
    cached_ -= largest->first;
    if (largest->second.empty()) free_.erase(largest);
  }
}

void BlockCache::note_in_use(size_t in_use) {
  size_t high = high_water_.load(std::memory_order_relaxed);
  while (in_use > high && !high_water_.compare_exchange_weak(high, in_use, std::memory_order_relaxed)) {
  }
}

void BlockCache::release() {
  std::lock_guard lock(mutex_);
  for (auto& [size, blocks] : free_)
    for (void* p : blocks) free_block(p, size);
  free_.clear();
  cached_ = 0;
}

void* CpuBackend::allocate(size_t bytes) {
  const size_t n = round_block(bytes);
  void* p = blocks_->take(n);
  if (!p) {
    blocks_->make_room(n, size_t(memory_.stats().in_use));
    p = new_block(n);
  }
  if (!p) {  // the system refused: give back what the cache holds, then try once more
    blocks_->release();
    p = new_block(n);
  }
  DEW_CHECK(p != nullptr, "cpu backend: out of host memory allocating ", bytes, " bytes");
  memory_.allocated(n);  // memory_stats(): counted at the block size, cached or fresh
  blocks_->note_in_use(size_t(memory_.stats().in_use));
  return p;
}
void CpuBackend::deallocate(void* ptr, size_t bytes) {
  const size_t n = round_block(bytes);
  memory_.freed(n);
  if (!blocks_->give(ptr, n)) free_block(ptr, n);
}

static void parallel_memcpy(void* dst, const void* src, size_t bytes) {
  if (dst == src || bytes == 0) return;
  constexpr size_t kChunk = size_t(1) << 20;
  if (bytes < 4 * kChunk || omp_get_max_threads() == 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const int64_t chunks = int64_t((bytes + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static)
  for (int64_t c = 0; c < chunks; ++c) {
    const size_t off = size_t(c) * kChunk;
    std::memcpy(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, std::min(kChunk, bytes - off));
  }
}
void CpuBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  bind_calling_thread();
  parallel_memcpy(dst, src, bytes);
}
void CpuBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  bind_calling_thread();
  parallel_memcpy(dst, src, bytes);
}
void CpuBackend::copy_device(void* dst, const void* src, size_t bytes) {
  bind_calling_thread();
  parallel_memcpy(dst, src, bytes);
}

// ---------------------------------------------------------------- element conversions

namespace {

template <class T>
constexpr bool is_half_v = std::is_same_v<T, bf16_t> || std::is_same_v<T, f16_t>;
template <class T>
constexpr bool floatlike_v = std::is_same_v<T, float> || is_half_v<T>;

template <class T>
inline float to_float(T v) {
  if constexpr (std::is_same_v<T, bf16_t>)
    return bf16_to_f32(v);
  else if constexpr (std::is_same_v<T, f16_t>)
    return f16_to_f32(v);
  else
    return float(v);
}
template <class I>
inline I saturate(double v) {
  if (v != v) return I(0);
  constexpr double lo = double(std::numeric_limits<I>::min()), hi = double(std::numeric_limits<I>::max());
  if (v <= lo) return std::numeric_limits<I>::min();
  if (v >= hi) return std::numeric_limits<I>::max();
  return I(v);  // truncates toward zero
}
template <class D>
inline D from_float(float v) {
  if constexpr (std::is_same_v<D, bf16_t>)
    return f32_to_bf16(v);
  else if constexpr (std::is_same_v<D, f16_t>)
    return f32_to_f16(v);
  else
    return v;
}
template <class D>
inline D from_double(double v) {
  if constexpr (std::is_same_v<D, double>)
    return v;
  else if constexpr (floatlike_v<D>)
    return from_float<D>(float(v));
  else
    return saturate<D>(v);
}
// Widens to the type that holds a value exactly (halves -> float, integers -> int64), then converts once;
// the same rules as ref's cast, so the two agree bit for bit.
template <class S>
inline auto widen(S v) {
  if constexpr (is_half_v<S>)
    return to_float(v);
  else if constexpr (std::is_integral_v<S>)
    return int64_t(v);
  else
    return v;
}
template <class S, class D>
inline D convert(S v) {
  if constexpr (std::is_same_v<S, D>) {
    return v;
  } else {
    const auto w = widen(v);
    using W = decltype(w);
    if constexpr (is_half_v<D>)
      return from_float<D>(float(w));
    else if constexpr (std::is_floating_point_v<D>)
      return D(w);
    else if constexpr (std::is_floating_point_v<W>)
      return saturate<D>(double(w));
    else
      return D(w);  // integer -> integer: modular narrowing, as C++ (and ref) define it
  }
}

template <class F>
void dispatch_dtype(DType t, F&& f) {
  switch (t) {
    case DType::f32:
      f(float{});
      return;
    case DType::f64:
      f(double{});
      return;
    case DType::bf16:
      f(bf16_t{});
      return;
    case DType::f16:
      f(f16_t{});
      return;
    case DType::i32:
      f(int32_t{});
      return;
    case DType::i64:
      f(int64_t{});
      return;
    case DType::u8:
      f(uint8_t{});
      return;
    case DType::i8:
      f(int8_t{});
      return;
  }
  DEW_INTERNAL_ASSERT(false);
}

// Loops with every pointer and value a by-value parameter, so they vectorise (see optim.cpp).
template <class T>
void fill_range(T* p, int64_t lo, int64_t hi, T v) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) p[i] = v;
}
template <class S, class D>
void cast_range(const S* s, D* d, int64_t lo, int64_t hi) {
#pragma omp simd
  for (int64_t i = lo; i < hi; ++i) d[i] = convert<S, D>(s[i]);
}

template <class T>
void fill_typed(T* p, int64_t n, T v) {
  for_blocks(n, n >= (int64_t(1) << 18), [&](int64_t lo, int64_t hi) { fill_range(p, lo, hi, v); });
}

}  // namespace

void CpuBackend::fill_kernel(Tensor& out, double value) {
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    if constexpr (is_half_v<T>) {
      const T v = from_float<T>(float(value));
      fill_typed(reinterpret_cast<uint16_t*>(out.data()), n, v.bits);
    } else {
      fill_typed(static_cast<T*>(out.data()), n, from_double<T>(value));
    }
  });
}

void CpuBackend::cast_kernel(const Tensor& x, Tensor& out) {
  const int64_t n = x.numel();
  DEW_CHECK(out.numel() == n, "cpu cast: ", shape_str(x.shape()), " into ", shape_str(out.shape()),
            " (element counts differ)");
  if (n == 0) return;
  if (x.dtype() == out.dtype()) {
    if (x.data() != out.data()) parallel_memcpy(out.data(), x.data(), x.nbytes());
    return;
  }
  if (cast_bf16_fast(isa_, x, out)) return;  // convert.cpp
  const bool par = n >= (int64_t(1) << 16);
  dispatch_dtype(x.dtype(), [&](auto stag) {
    using S = decltype(stag);
    dispatch_dtype(out.dtype(), [&](auto dtag) {
      using D = decltype(dtag);
      const S* s = static_cast<const S*>(x.data());
      D* d = static_cast<D*>(out.data());
      for_blocks(n, par, [&](int64_t lo, int64_t hi) { cast_range(s, d, lo, hi); });
    });
  });
}

// ---------------------------------------------------------------- strided_copy

void CpuBackend::strided_copy_kernel(const Tensor& src, Tensor& dst, const StridedCopyParams& p) {
  // Checks, then unit dims dropped and contiguous neighbours merged (dew/kernel_contracts.hpp).
  const contracts::StridedPair plan = contracts::check_strided_copy("cpu.strided_copy", src, dst, p);
  if (plan.shape.empty()) return;
  const int64_t total = numel_of(p.shape);
  const std::vector<int64_t>&shape = plan.shape, &ss = plan.a, &ds = plan.b;
  const size_t es = dtype_size(src.dtype());
  const char* sbase = static_cast<const char*>(src.data()) + p.src_offset * int64_t(es);
  char* dbase = static_cast<char*>(dst.data()) + p.dst_offset * int64_t(es);
  const int nd2 = int(shape.size());
  const int64_t inner = shape[size_t(nd2 - 1)], sin = ss[size_t(nd2 - 1)], din = ds[size_t(nd2 - 1)];
  const int64_t outer = total / inner;
  const bool rowcopy = sin == 1 && din == 1;

  auto run_inner = [&](const char* s, char* d) {
    if (rowcopy) {
      std::memcpy(d, s, size_t(inner) * es);
      return;
    }
    auto loop = [&](auto tag) {
      using T = decltype(tag);
      const T* st = reinterpret_cast<const T*>(s);
      T* dt = reinterpret_cast<T*>(d);
      for (int64_t i = 0; i < inner; ++i) dt[i * din] = st[i * sin];
    };
    switch (es) {
      case 1:
        loop(uint8_t{});
        break;
      case 2:
        loop(uint16_t{});
        break;
      case 4:
        loop(uint32_t{});
        break;
      default:
        loop(uint64_t{});
        break;
    }
  };
  const bool par = total >= (int64_t(1) << 15) && outer > 1;
  for_rows(outer, par, [&](int64_t begin, int64_t end) {  // no region on one thread (cpu_backend.hpp)
    walk_rows(shape, ss, ds, begin, end, [&](int64_t, int64_t so, int64_t dof) {
      run_inner(sbase + so * int64_t(es), dbase + dof * int64_t(es));
    });
  });
}

}  // namespace dew::cpu
