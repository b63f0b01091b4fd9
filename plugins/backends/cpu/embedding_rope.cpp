// cpu/embedding_rope.cpp — gather_rows / scatter_add_rows (embeddings) and rotary position embedding.
//
// oneDNN 2.6 has no gather, scatter or rotary primitive, hence these hand-written kernels.
// * gather_rows copies whole rows as bytes (any dtype). Every index is checked before any copy, so an
//   out-of-range index throws (never inside an OpenMP region) and leaves out untouched.
// * scatter_add_rows (f32) is deterministic without atomics: the (b, k) sources are bucketed by target
//   row (a counting sort, stable), then each target row is owned by one thread and accumulates its
//   sources in (b, k) order — the same order as a serial loop, whatever the thread count.
// * rope uses the "rotate half" pairing (i, i + rotary_dim/2) with cos/sin tables computed in double
//   (contracts::rope_frequency: the scaled frequencies) once per (theta, rotary_dim, scaling) and reused across calls
//   (RopeTables); negative positions are computed directly. inverse rotates by -angle. Features past rotary_dim are
//   copied. bf16 x / out: the same rows over bf16 storage (bf16_bits.hpp), the f32 kernel's values on the widened x
//   rounded once.
// ISA: compiled once per path (isa_clones.hpp), run on the backend's `isa`. gather is a copy and
//   scatter_add adds rows in index order, RoPE one rotation per pair from the same double-built table: the
//   same bits on avx512 and avx2 (FMA on both); portable differs in RoPE by FMA roundings.
#ifndef DEW_CPU_ISA  // ---- first pass: headers, the kernels once per ISA path (isa_clones.hpp), dispatch
#include <algorithm>
#include <bit>
#include <cmath>

#include "cpu_backend.hpp"

namespace dew::cpu {

// The rope angle tables (double libm: the same on every path), built once per (theta, rotary_dim, scaling).
namespace {

void rope_angles_direct(double theta, int64_t rd, const RopeScaling& scaling, int64_t pos, float* cs) {
  const int64_t half = rd / 2;
  for (int64_t i = 0; i < half; ++i) {
    const double a = double(pos) * contracts::rope_frequency(theta, rd, i, scaling);
    cs[i] = float(std::cos(a));
    cs[half + i] = float(std::sin(a));
  }
}

}  // namespace

std::shared_ptr<const RopeTable> RopeTables::get(float theta, int64_t rotary_dim, const RopeScaling& scaling,
                                                 int64_t max_pos) {
  Key key(0);
  key.add(theta).add(rotary_dim).add(int64_t(scaling.kind)).add(int64_t(scaling.truncate));
  for (double v : {scaling.factor, scaling.low_freq_factor, scaling.high_freq_factor, scaling.original_max_position,
                   scaling.beta_fast, scaling.beta_slow})
    key.add(std::bit_cast<int64_t>(v));
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = tables_[key];
  if (slot && slot->positions > max_pos) return slot;
  auto t = std::make_shared<RopeTable>();
  t->positions = std::max<int64_t>({max_pos + 1, 2 * (slot ? slot->positions : 0), 256});
  t->half = rotary_dim / 2;
  t->cs.resize(size_t(t->positions * 2 * t->half));
  const int64_t np = t->positions;
  float* cs = t->cs.data();
  const int64_t stride = 2 * t->half;
#pragma omp parallel for schedule(static) if (np * t->half >= 4096)
  for (int64_t pos = 0; pos < np; ++pos) rope_angles_direct(double(theta), rotary_dim, scaling, pos, cs + pos * stride);
  slot = t;
  return t;
}

}  // namespace dew::cpu

#define DEW_CPU_ISA_SELF "embedding_rope.cpp"
#include "isa_clones.hpp"

namespace dew::cpu {

DEW_CPU_ISA_KERNEL(gather_rows, (const Tensor& src, const Tensor& idx, Tensor& out), (src, idx, out))
DEW_CPU_ISA_KERNEL(scatter_add_rows, (const Tensor& dout, const Tensor& idx, Tensor& dsrc), (dout, idx, dsrc))
DEW_CPU_ISA_KERNEL(rope, (const Tensor& x, const Tensor& positions, Tensor& out, const RopeParams& p), (x, positions, out, p))

}  // namespace dew::cpu

#else  // ---- the kernels, compiled once per path inside namespace dew::cpu::DEW_CPU_ISA (no #include but
       // bf16_bits.hpp)

#include "bf16_bits.hpp"  // ld / st: rope's rows of float or bf16 (uint16_t) storage, computed on in f32

namespace {

using contracts::RowsShape;  // table [Bs, R, D] (or [R, D]), idx [B, K] (or [K]), rows [B, K, D]
RowsShape rows_shape(const Tensor& table, const Tensor& idx, const Tensor& rows, const char* kernel) {
  return contracts::check_rows(std::string("cpu ") + kernel, table, idx, rows);
}

void check_indices(const int32_t* ix, int64_t n, int64_t rows, const char* kernel) {
  int64_t bad = -1;
  for (int64_t i = 0; i < n; ++i)
    if (ix[i] < 0 || ix[i] >= rows) {
      bad = i;
      break;
    }
  DEW_CHECK(bad < 0, "cpu ", kernel, ": index ", bad >= 0 ? ix[bad] : 0, " at position ", bad, " is outside [0, ", rows,
            ")");
}

}  // namespace

void gather_rows(CpuBackend& self, const Tensor& src, const Tensor& idx, Tensor& out) {
  const RowsShape s = rows_shape(src, idx, out, "gather_rows");
  DEW_CHECK(src.dtype() == out.dtype(), "cpu gather_rows: src is ", dtype_name(src.dtype()), ", out ",
            dtype_name(out.dtype()));
  const int32_t* ix = idx.data_as<int32_t>();
  check_indices(ix, s.B * s.K, s.R, "gather_rows");
  const size_t row_bytes = size_t(s.D) * dtype_size(src.dtype());
  const char* sp = static_cast<const char*>(src.data());
  char* op = static_cast<char*>(out.data());
  const int64_t n = s.B * s.K;
  for_rows(n, parallel_worth(out.numel()), [&](int64_t i0, int64_t i1) {  // no region on one thread
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t b = s.Bs == 1 ? 0 : i / s.K;
      std::memcpy(op + size_t(i) * row_bytes, sp + size_t(b * s.R + ix[i]) * row_bytes, row_bytes);
    }
  });
}

void scatter_add_rows(CpuBackend& self, const Tensor& dout, const Tensor& idx, Tensor& dsrc) {
  require_f32(dout, "scatter_add_rows", "dout");
  require_f32(dsrc, "scatter_add_rows", "dsrc");
  const RowsShape s = rows_shape(dsrc, idx, dout, "scatter_add_rows");
  const int32_t* ix = idx.data_as<int32_t>();
  const int64_t n = s.B * s.K;
  check_indices(ix, n, s.R, "scatter_add_rows");
  const float* g = dout.data_as<float>();
  float* d = dsrc.data_as<float>();
  const int64_t dim = s.D;
  auto target = [&](int64_t i) { return (s.Bs == 1 ? 0 : i / s.K) * s.R + ix[i]; };
  if (!parallel_worth(dout.numel())) {
    for (int64_t i = 0; i < n; ++i) {
      float* dr = d + target(i) * dim;
      const float* gr = g + i * dim;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) dr[j] += gr[j];
    }
    return;
  }
  // Counting sort of the sources by target row (stable: (b, k) order within a row).
  const int64_t targets = s.Bs * s.R;
  std::vector<int64_t> start(size_t(targets) + 1, 0);
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ++start[size_t(target(i)) + 1];
  for (int64_t t = 0; t < targets; ++t) start[size_t(t) + 1] += start[size_t(t)];
  std::vector<int64_t> used;  // target rows that receive something, ascending
  used.reserve(size_t(std::min(n, targets)));
  for (int64_t t = 0; t < targets; ++t)
    if (start[size_t(t) + 1] > start[size_t(t)]) used.push_back(t);
  {
    std::vector<int64_t> fillp(start.begin(), start.end() - 1);
    for (int64_t i = 0; i < n; ++i) order[size_t(fillp[size_t(target(i))]++)] = i;
  }
  const int64_t nu = int64_t(used.size());
#pragma omp parallel for schedule(dynamic, 16)
  for (int64_t u = 0; u < nu; ++u) {
    const int64_t t = used[size_t(u)];
    float* dr = d + t * dim;
    for (int64_t q = start[size_t(t)]; q < start[size_t(t) + 1]; ++q) {
      const float* gr = g + order[size_t(q)] * dim;
#pragma omp simd
      for (int64_t j = 0; j < dim; ++j) dr[j] += gr[j];
    }
  }
}

// ---------------------------------------------------------------- rope

namespace {
// Rows [r0, r1) of [B * T] (each H heads of D): x / out of float or bf16 (uint16_t) storage, computed on in f32
// (bf16_bits.hpp). cs(row) gives the row's cos / sin table (half cosines, then half sines).
template <class T, class Table>
void rope_rows(const T* xs, T* o, int64_t r0, int64_t r1, int64_t H, int64_t D, int64_t rd, float sign,
               Table&& cs_of_row) {
  const int64_t half = rd / 2;
  for (int64_t row = r0; row < r1; ++row) {
    const float* cs = cs_of_row(row);
    const float* c = cs;
    const float* sn = cs + half;
    for (int64_t h = 0; h < H; ++h) {
      const T* xr = xs + (row * H + h) * D;
      T* orow = o + (row * H + h) * D;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = ld(xr[i]), x2 = ld(xr[i + half]);
        const float s = sign * sn[i];
        st(orow + i, x1 * c[i] - x2 * s);
        st(orow + i + half, x2 * c[i] + x1 * s);
      }
      for (int64_t i = rd; i < D; ++i) orow[i] = xr[i];
    }
  }
}
}  // namespace

void rope(CpuBackend& self, const Tensor& x, const Tensor& positions, Tensor& out, const RopeParams& p) {
  const bool half_storage = is_bf16_call(x);  // bf16 x and out: the f32 kernel's bits on widened x, rounded once
  half_storage ? require_bf16(out, "rope", "out") : (require_f32(x, "rope", "x"), require_f32(out, "rope", "out"));
  require_i32(positions, "rope", "positions");
  DEW_CHECK(x.ndim() == 4, "cpu rope: x must be [B, T, H, D], got ", shape_str(x.shape()));
  DEW_CHECK(out.shape() == x.shape(), "cpu rope: out ", shape_str(out.shape()), " differs from x ",
            shape_str(x.shape()));
  const int64_t B = x.shape()[0], T = x.shape()[1], H = x.shape()[2], D = x.shape()[3];
  const int64_t rd = p.rotary_dim == 0 ? D : p.rotary_dim;
  DEW_CHECK(rd > 0 && rd <= D && rd % 2 == 0, "cpu rope: rotary_dim ", rd, " must be even and in (0, ", D, "]");
  const bool per_batch = positions.numel() == B * T && B != 1;
  DEW_CHECK(per_batch || positions.numel() == T, "cpu rope: positions ", shape_str(positions.shape()),
            " is neither [T] nor [B, T] for x ", shape_str(x.shape()));
  if (x.numel() == 0) return;
  const int32_t* ps = positions.data_as<int32_t>();
  int64_t max_pos = 0;
  bool negative = false;
  for (int64_t i = 0; i < positions.numel(); ++i) {
    max_pos = std::max<int64_t>(max_pos, ps[i]);
    negative = negative || ps[i] < 0;
  }
  const int64_t half = rd / 2;
  std::shared_ptr<const RopeTable> table;
  contracts::check_rope_scaling("cpu rope", p.scaling);
  if (!negative) table = self.rope_tables().get(p.theta, rd, p.scaling, max_pos);
  const float sign = p.inverse ? -1.0f : 1.0f;
  const int64_t rows = B * T;
  auto run = [&](auto* xs, auto* o) {
    for_rows(rows, parallel_worth(x.numel()), [&](int64_t r0, int64_t r1) {  // no region on one thread
      std::vector<float> local(negative ? size_t(2 * half) : 0);
      rope_rows(xs, o, r0, r1, H, D, rd, sign, [&](int64_t row) -> const float* {
        const int64_t pos = per_batch ? ps[row] : ps[row % T];
        if (table) return table->cs.data() + pos * 2 * half;
        rope_angles_direct(double(p.theta), rd, p.scaling, pos, local.data());
        return local.data();
      });
    });
  };
  half_storage ? run(x.data_as<uint16_t>(), out.data_as<uint16_t>()) : run(x.data_as<float>(), out.data_as<float>());
}

#endif  // DEW_CPU_ISA
