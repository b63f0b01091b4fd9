// core/tensor/kernel_contracts.cpp — the device-independent kernel checks and plans (dew/kernel_contracts.hpp).
#include "dew/kernel_contracts.hpp"

#include "dew/error.hpp"

namespace dew::contracts {

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
