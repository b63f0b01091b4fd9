// conv.cpp — direct NCHW 2-D convolution with stride, padding, dilation and groups, and its two
// backwards (data, weight).
// Invariants: x [N, C, H, W]; w [O, C/groups, KH, KW]; y [N, O, OH, OW] with
// OH = (H + 2 pad_h - dilation_h (KH - 1) - 1) / stride_h + 1 (likewise OW); output channel o belongs to
// group o / (O / groups) and reads input channels [g C/groups, (g+1) C/groups). Every sum is in double.
#include <vector>

#include "dew/kernel_contracts.hpp"
#include "ref_backend.hpp"

namespace dew::ref {

namespace {

struct ConvShape {
  int64_t N, C, H, W, O, Cg, KH, KW, OH, OW, Og;
};

// x_shape: the input's shape; y_shape: the output's; both must agree with w and p.
ConvShape conv_shape(const Shape& x_shape, const Tensor& w, const Shape& y_shape, const Conv2dParams& p, Kernel k) {
  DEW_CHECK(x_shape.size() == 4 && w.ndim() == 4 && y_shape.size() == 4, "ref.", kernel_name(k), ": x ",
            shape_str(x_shape), ", w ", shape_str(w.shape()), ", y ", shape_str(y_shape), " are not all 4-D (NCHW)");
  DEW_CHECK(p.groups > 0 && p.stride_h > 0 && p.stride_w > 0 && p.dilation_h > 0 && p.dilation_w > 0 && p.pad_h >= 0 &&
                p.pad_w >= 0,
            "ref.", kernel_name(k), ": bad stride/padding/dilation/groups");
  ConvShape s{};
  s.N = x_shape[0];
  s.C = x_shape[1];
  s.H = x_shape[2];
  s.W = x_shape[3];
  s.O = w.size(0);
  s.Cg = w.size(1);
  s.KH = w.size(2);
  s.KW = w.size(3);
  DEW_CHECK(s.C == s.Cg * p.groups && s.O % p.groups == 0, "ref.", kernel_name(k), ": w ", shape_str(w.shape()),
            " does not fit ", s.C, " input channels in ", p.groups, " groups");
  s.Og = s.O / p.groups;
  s.OH = contracts::conv_output_size(s.H, s.KH, p.stride_h, p.pad_h, p.dilation_h);
  s.OW = contracts::conv_output_size(s.W, s.KW, p.stride_w, p.pad_w, p.dilation_w);
  const Shape expected{s.N, s.O, s.OH, s.OW};
  DEW_CHECK(y_shape == expected, "ref.", kernel_name(k), ": y is ", shape_str(y_shape), ", expected ",
            shape_str(expected), " for x ", shape_str(x_shape), " and w ", shape_str(w.shape()));
  return s;
}

// Calls f(n, o, oh, ow, c, cg, kh, kw, ih, iw) for every tap of the convolution that lands inside x,
// where c is the absolute input channel and cg its index inside the group (w's axis 1). The three
// kernels differ only in what they accumulate.
template <class F>
void for_each_tap(const ConvShape& s, const Conv2dParams& p, F&& f) {
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t o = 0; o < s.O; ++o) {
      const int64_t g = o / s.Og;
      for (int64_t oh = 0; oh < s.OH; ++oh)
        for (int64_t ow = 0; ow < s.OW; ++ow)
          for (int64_t cg = 0; cg < s.Cg; ++cg)
            for (int64_t kh = 0; kh < s.KH; ++kh) {
              const int64_t ih = oh * p.stride_h - p.pad_h + kh * p.dilation_h;
              if (ih < 0 || ih >= s.H) continue;
              for (int64_t kw = 0; kw < s.KW; ++kw) {
                const int64_t iw = ow * p.stride_w - p.pad_w + kw * p.dilation_w;
                if (iw < 0 || iw >= s.W) continue;
                f(n, o, oh, ow, g * s.Cg + cg, cg, kh, kw, ih, iw);
              }
            }
    }
}

}  // namespace

void RefBackend::conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, Tensor& y, const Conv2dParams& p) {
  constexpr Kernel K = Kernel::conv2d;
  dispatch_float(x.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ConvShape s = conv_shape(x.shape(), w, y.shape(), p, K);
    expect(w, x.dtype(), w.numel(), K, "w");
    expect(y, x.dtype(), y.numel(), K, "y");
    if (bias.defined()) expect(bias, x.dtype(), s.O, K, "bias");
    const T* xs = x.data_as<T>();
    const T* ws = w.data_as<T>();
    std::vector<double> acc(size_t(y.numel()), 0.0);
    for_each_tap(s, p,
                 [&](int64_t n, int64_t o, int64_t oh, int64_t ow, int64_t c, int64_t cg, int64_t kh, int64_t kw,
                     int64_t ih, int64_t iw) {
                   acc[size_t(((n * s.O + o) * s.OH + oh) * s.OW + ow)] +=
                       double(xs[((n * s.C + c) * s.H + ih) * s.W + iw]) *
                       double(ws[((o * s.Cg + cg) * s.KH + kh) * s.KW + kw]);
                 });
    T* ys = y.data_as<T>();
    for (int64_t i = 0; i < y.numel(); ++i) {
      const int64_t o = (i / (s.OH * s.OW)) % s.O;
      ys[i] = T(acc[size_t(i)] + (bias.defined() ? double(bias.data_as<T>()[o]) : 0.0));
    }
  });
}

void RefBackend::conv2d_backward_data(const Tensor& dy, const Tensor& w, Tensor& dx, const Conv2dParams& p) {
  constexpr Kernel K = Kernel::conv2d_backward_data;
  dispatch_float(dy.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ConvShape s = conv_shape(dx.shape(), w, dy.shape(), p, K);
    expect(w, dy.dtype(), w.numel(), K, "w");
    expect(dx, dy.dtype(), dx.numel(), K, "dx");
    const T* gs = dy.data_as<T>();
    const T* ws = w.data_as<T>();
    std::vector<double> acc(size_t(dx.numel()), 0.0);
    for_each_tap(s, p,
                 [&](int64_t n, int64_t o, int64_t oh, int64_t ow, int64_t c, int64_t cg, int64_t kh, int64_t kw,
                     int64_t ih, int64_t iw) {
                   acc[size_t(((n * s.C + c) * s.H + ih) * s.W + iw)] +=
                       double(gs[((n * s.O + o) * s.OH + oh) * s.OW + ow]) *
                       double(ws[((o * s.Cg + cg) * s.KH + kh) * s.KW + kw]);
                 });
    for (int64_t i = 0; i < dx.numel(); ++i) dx.data_as<T>()[i] = T(acc[size_t(i)]);
  });
}

void RefBackend::conv2d_backward_weight(const Tensor& x, const Tensor& dy, Tensor& dw, Tensor& dbias,
                                        const Conv2dParams& p) {
  constexpr Kernel K = Kernel::conv2d_backward_weight;
  dispatch_float(x.dtype(), K, [&](auto tag) {
    using T = typename decltype(tag)::type;
    const ConvShape s = conv_shape(x.shape(), dw, dy.shape(), p, K);
    expect(dy, x.dtype(), dy.numel(), K, "dy");
    expect(dw, x.dtype(), dw.numel(), K, "dw");
    if (dbias.defined()) expect(dbias, x.dtype(), s.O, K, "dbias");
    const T* xs = x.data_as<T>();
    const T* gs = dy.data_as<T>();
    std::vector<double> acc(size_t(dw.numel()), 0.0);
    for_each_tap(s, p,
                 [&](int64_t n, int64_t o, int64_t oh, int64_t ow, int64_t c, int64_t cg, int64_t kh, int64_t kw,
                     int64_t ih, int64_t iw) {
                   acc[size_t(((o * s.Cg + cg) * s.KH + kh) * s.KW + kw)] +=
                       double(gs[((n * s.O + o) * s.OH + oh) * s.OW + ow]) *
                       double(xs[((n * s.C + c) * s.H + ih) * s.W + iw]);
                 });
    for (int64_t i = 0; i < dw.numel(); ++i) dw.data_as<T>()[i] = T(acc[size_t(i)]);
    if (dbias.defined()) {
      for (int64_t o = 0; o < s.O; ++o) {
        double sum = 0;
        for (int64_t n = 0; n < s.N; ++n)
          for (int64_t i = 0; i < s.OH * s.OW; ++i) sum += double(gs[(n * s.O + o) * s.OH * s.OW + i]);
        dbias.data_as<T>()[o] = T(sum);
      }
    }
  });
}

}  // namespace dew::ref
