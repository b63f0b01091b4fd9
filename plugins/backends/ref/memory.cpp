// memory.cpp — host memory, byte copies, fill, cast and strided_copy of the `ref` backend, plus the
// dtype-generic element access (load_any / store_any) and the shape checks the other files share.
// Invariants: allocations are 64-byte aligned host memory, counted at their rounded size (memory_stats); fill/cast/strided_copy accept every dtype;
// cast float -> integer truncates toward zero, saturates at the integer range and maps NaN to 0.
#include <cstdlib>
#include <limits>

#include "dew/kernel_contracts.hpp"
#include "ref_backend.hpp"

namespace dew::ref {

// ---------------------------------------------------------------- memory

static size_t rounded_size(size_t bytes) {
  constexpr size_t kAlign = 64;
  return bytes == 0 ? kAlign : (bytes + kAlign - 1) / kAlign * kAlign;
}

void* RefBackend::allocate(size_t bytes) {
  const size_t rounded = rounded_size(bytes);
  void* p = std::aligned_alloc(64, rounded);
  DEW_CHECK(p != nullptr, "ref: out of host memory allocating ", bytes, " bytes");
  memory_.allocated(rounded);
  return p;
}

void RefBackend::deallocate(void* ptr, size_t bytes) {
  std::free(ptr);
  memory_.freed(rounded_size(bytes));
}

void RefBackend::copy_from_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void RefBackend::copy_to_host(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}
void RefBackend::copy_device(void* dst, const void* src, size_t bytes) {
  if (bytes) std::memmove(dst, src, bytes);
}

// ---------------------------------------------------------------- element conversions

namespace {

// Calls f(std::type_identity<R>{}) with R the host representation of dt (float, bf16_t, int32_t, ...).
template <class F>
void dispatch_any(DType dt, F&& f) {
  switch (dt) {
    case DType::f32:
      f(std::type_identity<float>{});
      return;
    case DType::f64:
      f(std::type_identity<double>{});
      return;
    case DType::bf16:
      f(std::type_identity<bf16_t>{});
      return;
    case DType::f16:
      f(std::type_identity<f16_t>{});
      return;
    case DType::i32:
      f(std::type_identity<int32_t>{});
      return;
    case DType::i64:
      f(std::type_identity<int64_t>{});
      return;
    case DType::u8:
      f(std::type_identity<uint8_t>{});
      return;
    case DType::i8:
      f(std::type_identity<int8_t>{});
      return;
  }
  DEW_INTERNAL_ASSERT(false);
}

// Widens a value to the type that holds it exactly: float/double stay, halves become float, integers int64.
template <class S>
auto widen(S s) {
  if constexpr (std::is_same_v<S, bf16_t>)
    return bf16_to_f32(s);
  else if constexpr (std::is_same_v<S, f16_t>)
    return f16_to_f32(s);
  else if constexpr (std::is_integral_v<S>)
    return int64_t(s);
  else
    return s;
}

// Floating -> integer: NaN -> 0, saturate to D's range, truncate toward zero.
template <class D>
D float_to_int(double v) {
  if (std::isnan(v)) return D(0);
  const double lo = double(std::numeric_limits<D>::min());
  const double hi_excl = std::ldexp(1.0, std::numeric_limits<D>::digits);  // 2^digits, one past max
  if (v <= lo) return std::numeric_limits<D>::min();
  if (v >= hi_excl) return std::numeric_limits<D>::max();
  return D(v);
}

// Converts one element of representation S to representation D.
template <class D, class S>
D convert(S s) {
  const auto w = widen(s);  // float, double or int64_t
  using W = decltype(w);
  if constexpr (std::is_same_v<D, bf16_t>)
    return f32_to_bf16(float(w));
  else if constexpr (std::is_same_v<D, f16_t>)
    return f32_to_f16(float(w));
  else if constexpr (std::is_floating_point_v<D>)
    return D(w);
  else if constexpr (std::is_floating_point_v<W>)
    return float_to_int<D>(double(w));
  else
    return D(w);  // integer -> integer: C++ modular narrowing
}

}  // namespace

double load_any(DType dt, const void* base, int64_t i) {
  double out = 0;
  dispatch_any(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    out = convert<double>(static_cast<const T*>(base)[i]);
  });
  return out;
}

void store_any(DType dt, void* base, int64_t i, double v) {
  dispatch_any(dt, [&](auto tag) {
    using T = typename decltype(tag)::type;
    static_cast<T*>(base)[i] = convert<T>(v);
  });
}

void expect(const Tensor& t, DType dt, int64_t numel, Kernel k, const char* what) {
  DEW_CHECK(t.defined(), "ref.", kernel_name(k), ": ", what, " is undefined");
  DEW_CHECK(t.dtype() == dt, "ref.", kernel_name(k), ": ", what, " has dtype ", dtype_name(t.dtype()), ", expected ",
            dtype_name(dt));
  DEW_CHECK(t.numel() == numel, "ref.", kernel_name(k), ": ", what, " has shape ", shape_str(t.shape()), " (",
            t.numel(), " elements), expected ", numel, " elements");
}

void expect_stat(const Tensor& t, int64_t numel, Kernel k, const char* what) {
  DEW_CHECK(t.defined(), "ref.", kernel_name(k), ": ", what, " is undefined");
  DEW_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, "ref.", kernel_name(k), ": ", what,
            " must be f32 or f64, got ", dtype_name(t.dtype()));
  DEW_CHECK(t.numel() == numel, "ref.", kernel_name(k), ": ", what, " has shape ", shape_str(t.shape()), ", expected ",
            numel, " elements");
}

// ---------------------------------------------------------------- fill, cast, strided_copy

void RefBackend::fill(Tensor& out, double value) {
  dispatch_any(out.dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = convert<T>(value);
    T* o = out.data_as<T>();
    for (int64_t i = 0; i < out.numel(); ++i) o[i] = v;
  });
}

void RefBackend::cast(const Tensor& x, Tensor& out) {
  DEW_CHECK(x.numel() == out.numel(), "ref.cast: ", shape_str(x.shape()), " -> ", shape_str(out.shape()),
            " changes the number of elements");
  const int64_t n = x.numel();
  if (x.dtype() == out.dtype()) {  // may alias: memmove is exact
    if (n) std::memmove(out.data(), x.data(), x.nbytes());
    return;
  }
  dispatch_any(x.dtype(), [&](auto stag) {
    using S = typename decltype(stag)::type;
    dispatch_any(out.dtype(), [&](auto dtag) {
      using D = typename decltype(dtag)::type;
      const S* s = x.data_as<S>();
      D* d = out.data_as<D>();
      for (int64_t i = 0; i < n; ++i) d[i] = convert<D>(s[i]);
    });
  });
}

void RefBackend::strided_copy(const Tensor& src, Tensor& dst, const StridedCopyParams& p) {
  // Every address the copy touches must lie inside its tensor (dew/kernel_contracts.hpp).
  if (contracts::check_strided_copy("ref.strided_copy", src, dst, p).shape.empty()) return;
  const size_t rank = p.shape.size();
  const int64_t count = numel_of(p.shape);

  const size_t es = dtype_size(src.dtype());
  const char* s = static_cast<const char*>(src.data());
  char* d = static_cast<char*>(dst.data());
  std::vector<int64_t> idx(rank, 0);  // odometer over p.shape, last axis fastest
  for (int64_t n = 0; n < count; ++n) {
    int64_t so = p.src_offset, doff = p.dst_offset;
    for (size_t a = 0; a < rank; ++a) {
      so += idx[a] * p.src_strides[a];
      doff += idx[a] * p.dst_strides[a];
    }
    std::memcpy(d + doff * int64_t(es), s + so * int64_t(es), es);
    for (size_t a = rank; a-- > 0;) {
      if (++idx[a] < p.shape[a]) break;
      idx[a] = 0;
    }
  }
}

}  // namespace dew::ref
