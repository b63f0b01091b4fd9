// embedding_rope.cpp — row gather (embedding lookup), its scatter-add, and rotary position embedding.
// Invariants: indices are i32 and must lie in [0, R) — checked for every index before anything is
// written, so a bad index throws and leaves the output untouched; gather copies bytes (any dtype);
// scatter_add accumulates (+=) in double on top of dsrc's values; rope angles are computed in double from
// contracts::rope_frequency (the scaled frequencies every backend shares).
#include <vector>

#include "dew/kernel_contracts.hpp"
#include "ref_backend.hpp"

namespace dew::ref {

namespace {

// src/dsrc [Bs, R, D] (or [R, D]) with Bs in {1, B}; idx [B, K] (or [K], B = 1); rows [B, K, D].
using contracts::RowsShape;

// The shared shape contract (dew/kernel_contracts.hpp), then every index value, before anything is written.
RowsShape rows_shape(const Tensor& table, const Tensor& idx, const Tensor& rows, Kernel k) {
  const RowsShape s = contracts::check_rows(std::string("ref.") + kernel_name(k), table, idx, rows);
  const int32_t* ix = idx.data_as<int32_t>();
  for (int64_t i = 0; i < s.B * s.K; ++i)
    DEW_CHECK(ix[i] >= 0 && ix[i] < s.R, "ref.", kernel_name(k), ": index ", ix[i], " at [", i / s.K, ", ", i % s.K,
              "] is outside [0, ", s.R, ")");
  return s;
}

}  // namespace

void RefBackend::gather_rows(const Tensor& src, const Tensor& idx, Tensor& out) {
  const RowsShape s = rows_shape(src, idx, out, Kernel::gather_rows);
  const size_t row_bytes = size_t(s.D) * dtype_size(src.dtype());
  const char* table = static_cast<const char*>(src.data());
  char* o = static_cast<char*>(out.data());
  const int32_t* ix = idx.data_as<int32_t>();
  for (int64_t b = 0; b < s.B; ++b) {
    const int64_t tb = s.Bs == 1 ? 0 : b;
    for (int64_t k = 0; k < s.K; ++k) {
      const int64_t row = (tb * s.R + ix[b * s.K + k]);
      std::memcpy(o + size_t(b * s.K + k) * row_bytes, table + size_t(row) * row_bytes, row_bytes);
    }
  }
}

void RefBackend::scatter_add_rows(const Tensor& dout, const Tensor& idx, Tensor& dsrc) {
  dispatch_float(dsrc.dtype(), Kernel::scatter_add_rows, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const RowsShape s = rows_shape(dsrc, idx, dout, Kernel::scatter_add_rows);
    T* table = dsrc.data_as<T>();
    std::vector<double> acc(table, table + dsrc.numel());
    const T* g = dout.data_as<T>();
    const int32_t* ix = idx.data_as<int32_t>();
    for (int64_t b = 0; b < s.B; ++b) {
      const int64_t tb = s.Bs == 1 ? 0 : b;
      for (int64_t k = 0; k < s.K; ++k) {
        const int64_t row = tb * s.R + ix[b * s.K + k];
        for (int64_t d = 0; d < s.D; ++d) acc[size_t(row * s.D + d)] += double(g[(b * s.K + k) * s.D + d]);
      }
    }
    for (int64_t i = 0; i < dsrc.numel(); ++i) table[i] = T(acc[size_t(i)]);
  });
}

// ---------------------------------------------------------------- rope

void RefBackend::rope(const Tensor& x, const Tensor& positions, Tensor& out, const RopeParams& p) {
  dispatch_float(x.dtype(), Kernel::rope, [&](auto tag) {
    using T = typename decltype(tag)::type;
    DEW_CHECK(x.ndim() == 4, "ref.rope: x ", shape_str(x.shape()), " is not [B, T, H, D]");
    const int64_t B = x.size(0), Tn = x.size(1), H = x.size(2), D = x.size(3);
    const int64_t rd = p.rotary_dim == 0 ? D : p.rotary_dim;
    DEW_CHECK(rd > 0 && rd <= D && rd % 2 == 0, "ref.rope: rotary_dim ", rd, " must be even and in (0, ", D, "]");
    DEW_CHECK(positions.dtype() == DType::i32, "ref.rope: positions must be i32, got ", dtype_name(positions.dtype()));
    DEW_CHECK(positions.numel() == Tn || positions.numel() == B * Tn, "ref.rope: positions ",
              shape_str(positions.shape()), " are neither [T] nor [B, T] for x ", shape_str(x.shape()));
    expect(out, x.dtype(), x.numel(), Kernel::rope, "out");
    const bool per_batch = positions.numel() == B * Tn && B != 1;
    const int32_t* pos = positions.data_as<int32_t>();
    const int64_t half = rd / 2;
    contracts::check_rope_scaling("ref.rope", p.scaling);
    std::vector<double> freq(static_cast<size_t>(half));
    for (int64_t i = 0; i < half; ++i) freq[size_t(i)] = contracts::rope_frequency(double(p.theta), rd, i, p.scaling);
    const double sign = p.inverse ? -1.0 : 1.0;
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t t = 0; t < Tn; ++t) {
        const double position = double(pos[per_batch ? b * Tn + t : t]);
        for (int64_t h = 0; h < H; ++h) {
          const T* xv = x.data_as<T>() + ((b * Tn + t) * H + h) * D;
          T* ov = out.data_as<T>() + ((b * Tn + t) * H + h) * D;
          for (int64_t i = 0; i < half; ++i) {
            const double angle = sign * position * freq[size_t(i)];
            const double c = std::cos(angle), s = std::sin(angle);
            const double x1 = double(xv[i]), x2 = double(xv[i + half]);
            ov[i] = T(x1 * c - x2 * s);
            ov[i + half] = T(x2 * c + x1 * s);
          }
          for (int64_t i = rd; i < D; ++i) ov[i] = xv[i];
        }
      }
    }
  });
}

}  // namespace dew::ref
