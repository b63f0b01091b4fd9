// core/tensor/kernel_contracts.cpp — the device-independent kernel checks and plans (dew/kernel_contracts.hpp).
#include "dew/kernel_contracts.hpp"

#include <algorithm>
#include <cmath>

#include "dew/error.hpp"

namespace dew::contracts {

// ---------------------------------------------------------------- rope frequencies
// Hugging Face's formulas (transformers' modeling_rope_utils: _compute_linear_scaling_rope_parameters,
// _compute_llama3_parameters, _compute_yarn_parameters with the user's factor, as vLLM reads it), in double.

void check_rope_scaling(const std::string& who, const RopeScaling& s) {
  if (s.kind == RopeScalingKind::none) return;
  const char* name = rope_scaling_name(s.kind);
  DEW_CHECK(s.kind == RopeScalingKind::linear || s.kind == RopeScalingKind::llama3 || s.kind == RopeScalingKind::yarn,
            who, ": unknown rope scaling kind ", int(s.kind));
  DEW_CHECK(std::isfinite(s.factor) && s.factor >= 1.0, who, ": ", name, " rope scaling needs factor >= 1, got ",
            s.factor);
  if (s.kind == RopeScalingKind::linear) return;
  DEW_CHECK(std::isfinite(s.original_max_position) && s.original_max_position > 0, who, ": ", name,
            " rope scaling needs original_max_position > 0, got ", s.original_max_position);
  if (s.kind == RopeScalingKind::llama3)
    DEW_CHECK(s.low_freq_factor > 0 && s.high_freq_factor > s.low_freq_factor, who,
              ": llama3 rope scaling needs 0 < low_freq_factor < high_freq_factor, got ", s.low_freq_factor, " and ",
              s.high_freq_factor);
  if (s.kind == RopeScalingKind::yarn)
    DEW_CHECK(s.beta_fast > 0 && s.beta_slow > 0, who, ": yarn rope scaling needs beta_fast and beta_slow > 0, got ",
              s.beta_fast, " and ", s.beta_slow);
}

double rope_frequency(double theta, int64_t rotary_dim, int64_t i, const RopeScaling& s) {
  const double dim = double(rotary_dim);
  const double base = std::pow(theta, -2.0 * double(i) / dim);
  switch (s.kind) {
    case RopeScalingKind::none:
      return base;
    case RopeScalingKind::linear:
      return base / s.factor;
    case RopeScalingKind::llama3: {
      const double wavelength = 2.0 * M_PI / base;
      const double low_freq_wavelength = s.original_max_position / s.low_freq_factor;    // longer: interpolated
      const double high_freq_wavelength = s.original_max_position / s.high_freq_factor;  // shorter: kept
      if (wavelength < high_freq_wavelength) return base;
      if (wavelength > low_freq_wavelength) return base / s.factor;
      const double smooth =
          (s.original_max_position / wavelength - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
      return (1.0 - smooth) * base / s.factor + smooth * base;
    }
    case RopeScalingKind::yarn: {
      // The pair index at which a frequency turns `rotations` times over the original context.
      auto correction_pair = [&](double rotations) {
        return dim * std::log(s.original_max_position / (rotations * 2.0 * M_PI)) / (2.0 * std::log(theta));
      };
      double low = correction_pair(s.beta_fast), high = correction_pair(s.beta_slow);
      if (s.truncate) low = std::floor(low), high = std::ceil(high);
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1.0);
      if (low == high) high += 0.001;  // as transformers: no zero-width ramp
      const double ramp = std::clamp((double(i) - low) / (high - low), 0.0, 1.0);
      const double extrapolation = 1.0 - ramp;  // 1: the pair keeps its frequency; 0: interpolated (/ factor)
      return base / s.factor * (1.0 - extrapolation) + base * extrapolation;
    }
  }
  DEW_CHECK(false, "rope_frequency: unknown rope scaling kind ", int(s.kind));
  return base;
}

StridedPair coalesce(const Shape& shape, const std::vector<int64_t>& a, const std::vector<int64_t>& b) {
  StridedPair out;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == 1) continue;
    if (!out.shape.empty() && out.a.back() == a[i] * shape[i] && out.b.back() == b[i] * shape[i]) {
      out.shape.back() *= shape[i];
      out.a.back() = a[i];
      out.b.back() = b[i];
    } else {
      out.shape.push_back(shape[i]);
      out.a.push_back(a[i]);
      out.b.push_back(b[i]);
    }
  }
  if (out.shape.empty()) out = {{1}, {1}, {1}};
  return out;
}

std::vector<int64_t> broadcast_strides(const std::string& who, const Shape& in, const Shape& out) {
  DEW_CHECK(in.size() <= out.size(), who, ": ", shape_str(in), " does not broadcast to ", shape_str(out));
  std::vector<int64_t> st(out.size(), 0);
  int64_t stride = 1;
  for (size_t i = 0; i < in.size(); ++i) {
    const size_t ia = in.size() - 1 - i, oa = out.size() - 1 - i;
    DEW_CHECK(in[ia] == out[oa] || in[ia] == 1, who, ": ", shape_str(in), " does not broadcast to ", shape_str(out));
    st[oa] = in[ia] == 1 ? 0 : stride;
    stride *= in[ia];
  }
  return st;
}

StridedPair check_strided_copy(const std::string& who, const Tensor& src, const Tensor& dst,
                               const StridedCopyParams& p) {
  DEW_CHECK(src.dtype() == dst.dtype(), who, ": src is ", dtype_name(src.dtype()), ", dst is ",
            dtype_name(dst.dtype()));
  return check_strided_copy(who, p, src.numel(), dst.numel());
}

StridedPair check_strided_copy(const std::string& who, const StridedCopyParams& p, int64_t src_numel,
                               int64_t dst_numel) {
  const size_t rank = p.shape.size();
  DEW_CHECK(p.src_strides.size() == rank && p.dst_strides.size() == rank, who, ": shape ", shape_str(p.shape),
            " needs ", rank, " strides per side, got ", p.src_strides.size(), " and ", p.dst_strides.size());
  if (numel_of(p.shape) == 0) return {};
  auto check_range = [&](const std::vector<int64_t>& strides, int64_t offset, int64_t numel, const char* side) {
    int64_t lo = offset, hi = offset;
    for (size_t d = 0; d < rank; ++d) {
      const int64_t span = strides[d] * (p.shape[d] - 1);
      (span < 0 ? lo : hi) += span;
    }
    DEW_CHECK(lo >= 0 && hi < numel, who, ": ", side, " addresses [", lo, ", ", hi, "] fall outside its ", numel,
              " elements");
  };
  check_range(p.src_strides, p.src_offset, src_numel, "src");
  check_range(p.dst_strides, p.dst_offset, dst_numel, "dst");
  return coalesce(p.shape, p.src_strides, p.dst_strides);
}

RowsShape check_rows(const std::string& who, const Tensor& table, const Tensor& idx, const Tensor& rows) {
  DEW_CHECK(table.defined() && idx.defined() && rows.defined(), who, ": undefined argument");
  DEW_CHECK(table.ndim() == 2 || table.ndim() == 3, who, ": the table ", shape_str(table.shape()),
            " is not [R, D] or [Bs, R, D]");
  DEW_CHECK(idx.dtype() == DType::i32, who, ": indices must be i32, got ", dtype_name(idx.dtype()));
  DEW_CHECK(idx.ndim() == 1 || idx.ndim() == 2, who, ": indices ", shape_str(idx.shape()), " are not [K] or [B, K]");
  RowsShape s{};
  s.Bs = table.ndim() == 3 ? table.size(0) : 1;
  s.R = table.size(-2);
  s.D = table.size(-1);
  s.B = idx.ndim() == 2 ? idx.size(0) : 1;
  s.K = idx.size(-1);
  DEW_CHECK(s.Bs == 1 || s.Bs == s.B, who, ": table batch ", s.Bs, " is neither 1 nor the index batch ", s.B);
  DEW_CHECK(rows.dtype() == table.dtype(), who, ": rows has dtype ", dtype_name(rows.dtype()), ", expected ",
            dtype_name(table.dtype()));
  DEW_CHECK(rows.numel() == s.B * s.K * s.D, who, ": rows has shape ", shape_str(rows.shape()), " (", rows.numel(),
            " elements), expected ", s.B * s.K * s.D, " elements");
  return s;
}

}  // namespace dew::contracts
