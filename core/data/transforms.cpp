// core/data/transforms.cpp — per-record image transforms of the data pipeline ([data] transforms = ...).
//
// Each transform edits the record's "image" field (u8 [H, W, C] or [H, W]) in place, in list order.
// Randomness: transform i with name n draws from Philox block (key = the loader seed,
// stream = FNV-1a("data.transform.<i>.<n>"), counter = the record's global stream position g), so it
// depends only on (seed, g): never on threads, batch size or rank count; g = epoch * N + i gives every
// epoch a fresh draw for the same record, and a resumed run redraws exactly the same values.
// Pixel values stay u8: normalising to [-1, 1] (or mean/std) is the objective's job, on the device.
// Spellings (SIZE = "S" or "HxW"):
//   flip[:P] / hflip[:P]          mirror left-right with probability P (0.5)
//   vflip[:P]                     mirror top-bottom with probability P (0.5)
//   pad:N[:zero|reflect|edge]     N pixels on every side (zero)
//   random_crop:SIZE              a uniformly placed SIZE window (after pad: the CIFAR augmentation)
//   center_crop:SIZE              the central SIZE window
//   resize:SIZE                   bilinear (half-pixel centres, no antialiasing)
//   random_resized_crop:SIZE[:MIN[:MAX]]
//                                 a window with area fraction a ~ U[MIN, MAX] (0.08, 1) of the image and
//                                 the image's aspect ratio (both sides shrink by sqrt(a)), uniformly
//                                 placed, resized to SIZE (the original framework's crop)
// resize, center_crop and random_resized_crop give every record one size ("fixes the size").
// Validation splits (evaluation = true) skip the flips, centre random_crop and resize the whole image
// instead of random_resized_crop: deterministic, with the training shapes.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "dew/data.hpp"
#include "dew/error.hpp"
#include "dew/image.hpp"
#include "dew/random.hpp"

namespace dew {

namespace {

struct View {
  HostArray* a;
  int64_t h, w, c;
};

View image_of(Record& r, const std::string& name) {
  auto it = r.find("image");
  DEW_USAGE_CHECK(it != r.end(), "data transform '", name, "': the record has no 'image' field");
  HostArray& a = it->second;
  DEW_USAGE_CHECK(a.dtype == DType::u8 && (a.shape.size() == 2 || a.shape.size() == 3), "data transform '", name,
                  "': 'image' must be u8 [H, W, C] or [H, W], got ", dtype_name(a.dtype), " ", shape_str(a.shape));
  return {&a, a.shape[0], a.shape[1], a.shape.size() == 3 ? a.shape[2] : 1};
}

void set_image(View v, int64_t h, int64_t w, std::vector<uint8_t> px) {
  const bool hwc = v.a->shape.size() == 3;
  v.a->shape = hwc ? Shape{h, w, v.c} : Shape{h, w};
  v.a->bytes.assign(px.begin(), px.end());
}

std::vector<uint8_t> crop(View v, int64_t y0, int64_t x0, int64_t h, int64_t w) {
  std::vector<uint8_t> out(size_t(h * w * v.c));
  const uint8_t* src = v.a->bytes.data();
  for (int64_t y = 0; y < h; ++y)
    std::memcpy(out.data() + size_t(y * w * v.c), src + size_t(((y0 + y) * v.w + x0) * v.c), size_t(w * v.c));
  return out;
}

struct Size {
  int64_t h = 0, w = 0;
};

Size parse_size(const std::string& s, const std::string& spec) {
  Size r;
  char* end = nullptr;
  r.h = std::strtoll(s.c_str(), &end, 10);
  if (end && *end == 'x')
    r.w = std::strtoll(end + 1, &end, 10);
  else
    r.w = r.h;
  DEW_USAGE_CHECK(!s.empty() && end && *end == '\0' && r.h > 0 && r.w > 0, "data transform '", spec, "': '", s,
                  "' is not a size (S or HxW)");
  return r;
}

double parse_number(const std::string& s, const std::string& spec) {
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  DEW_USAGE_CHECK(!s.empty() && end && *end == '\0' && std::isfinite(v), "data transform '", spec, "': '", s,
                  "' is not a number");
  return v;
}

// The four uniforms in [0, 1) of one record's draw.
std::array<double, 4> draws(uint64_t seed, uint64_t stream, uint64_t position) {
  const philox::Counter c = philox::block(seed, stream, position);
  std::array<double, 4> u{};
  for (int i = 0; i < 4; ++i) u[size_t(i)] = double(c[size_t(i)]) * (1.0 / 4294967296.0);
  return u;
}

// A uniform integer offset in [0, range].
int64_t offset(double u, int64_t range) { return std::min(range, int64_t(u * double(range + 1))); }

}  // namespace

std::vector<RecordTransform> make_transforms(const std::vector<std::string>& specs, bool* fixes_size, bool evaluation) {
  std::vector<RecordTransform> out;
  if (fixes_size) *fixes_size = false;
  for (size_t i = 0; i < specs.size(); ++i) {
    const std::string spec = specs[i];
    if (spec.empty()) continue;
    std::vector<std::string> parts;
    for (size_t at = 0;;) {
      const size_t colon = spec.find(':', at);
      parts.push_back(spec.substr(at, colon == std::string::npos ? std::string::npos : colon - at));
      if (colon == std::string::npos) break;
      at = colon + 1;
    }
    std::string name = parts[0];
    if (evaluation) {  // deterministic versions with the training shapes
      if (name == "flip" || name == "hflip" || name == "vflip") continue;
      if (name == "random_crop") name = "center_crop";
      if (name == "random_resized_crop") {
        name = "resize";
        parts.resize(std::min<size_t>(parts.size(), 2));
      }
    }
    const size_t nargs = parts.size() - 1;
    auto want = [&](size_t lo, size_t hi) {
      DEW_USAGE_CHECK(nargs >= lo && nargs <= hi, "data transform '", spec, "': ", name, " takes ",
                      lo == hi ? std::to_string(lo) : std::to_string(lo) + " to " + std::to_string(hi),
                      " argument(s) after ':'");
    };
    const uint64_t stream = philox::stream_of(("data.transform." + std::to_string(i) + "." + name).c_str());
    if (name == "flip" || name == "hflip" || name == "vflip") {
      want(0, 1);
      const double p = nargs ? parse_number(parts[1], spec) : 0.5;
      DEW_USAGE_CHECK(p >= 0 && p <= 1, "data transform '", spec, "': the probability must be in [0, 1]");
      const bool vertical = name == "vflip";
      out.push_back([p, vertical, stream, name](Record& r, uint64_t seed, uint64_t g) {
        if (draws(seed, stream, g)[0] >= p) return;
        View v = image_of(r, name);
        uint8_t* px = v.a->bytes.data();
        if (vertical) {
          const size_t row = size_t(v.w * v.c);
          std::vector<uint8_t> tmp(row);
          for (int64_t y = 0; y < v.h / 2; ++y) {
            std::memcpy(tmp.data(), px + size_t(y) * row, row);
            std::memcpy(px + size_t(y) * row, px + size_t(v.h - 1 - y) * row, row);
            std::memcpy(px + size_t(v.h - 1 - y) * row, tmp.data(), row);
          }
        } else {
          for (int64_t y = 0; y < v.h; ++y)
            for (int64_t x = 0; x < v.w / 2; ++x)
              for (int64_t c = 0; c < v.c; ++c)
                std::swap(px[size_t((y * v.w + x) * v.c + c)], px[size_t((y * v.w + v.w - 1 - x) * v.c + c)]);
        }
      });
    } else if (name == "pad") {
      want(1, 2);
      const int64_t n = int64_t(parse_number(parts[1], spec));
      DEW_USAGE_CHECK(n >= 0, "data transform '", spec, "': the padding must be >= 0");
      const std::string mode = nargs > 1 ? parts[2] : "zero";
      DEW_USAGE_CHECK(mode == "zero" || mode == "reflect" || mode == "edge", "data transform '", spec,
                      "': the mode must be zero, reflect or edge");
      out.push_back([n, mode, name](Record& r, uint64_t, uint64_t) {
        View v = image_of(r, name);
        DEW_USAGE_CHECK(mode != "reflect" || (n < v.h && n < v.w), "data transform 'pad:", n, ":reflect': the image (",
                        v.h, "x", v.w, ") must be larger than the padding");
        const int64_t H = v.h + 2 * n, W = v.w + 2 * n;
        std::vector<uint8_t> px(size_t(H * W * v.c), 0);
        const uint8_t* src = v.a->bytes.data();
        auto map = [&](int64_t i, int64_t len) -> int64_t {
          if (i >= 0 && i < len) return i;
          if (mode == "zero") return -1;
          if (mode == "edge") return std::clamp<int64_t>(i, 0, len - 1);
          return i < 0 ? -i : 2 * (len - 1) - i;  // reflect (no edge repeat)
        };
        for (int64_t y = 0; y < H; ++y) {
          const int64_t sy = map(y - n, v.h);
          if (sy < 0) continue;
          for (int64_t x = 0; x < W; ++x) {
            const int64_t sx = map(x - n, v.w);
            if (sx < 0) continue;
            std::memcpy(px.data() + size_t((y * W + x) * v.c), src + size_t((sy * v.w + sx) * v.c), size_t(v.c));
          }
        }
        set_image(v, H, W, std::move(px));
      });
    } else if (name == "random_crop" || name == "center_crop") {
      want(1, 1);
      const Size s = parse_size(parts[1], spec);
      const bool random = name == "random_crop";
      if (!random && fixes_size) *fixes_size = true;
      out.push_back([s, random, stream, name, spec](Record& r, uint64_t seed, uint64_t g) {
        View v = image_of(r, name);
        DEW_USAGE_CHECK(s.h <= v.h && s.w <= v.w, "data transform '", spec, "': the image (", v.h, "x", v.w,
                        ") is smaller than the crop");
        int64_t y0 = (v.h - s.h) / 2, x0 = (v.w - s.w) / 2;
        if (random) {
          const auto u = draws(seed, stream, g);
          y0 = offset(u[0], v.h - s.h);
          x0 = offset(u[1], v.w - s.w);
        }
        set_image(v, s.h, s.w, crop(v, y0, x0, s.h, s.w));
      });
    } else if (name == "resize") {
      want(1, 1);
      const Size s = parse_size(parts[1], spec);
      if (fixes_size) *fixes_size = true;
      out.push_back([s, name](Record& r, uint64_t, uint64_t) {
        View v = image_of(r, name);
        if (v.h == s.h && v.w == s.w) return;
        set_image(v, s.h, s.w, resize_bilinear(v.a->bytes.data(), v.h, v.w, v.c, s.h, s.w));
      });
    } else if (name == "random_resized_crop") {
      want(1, 3);
      const Size s = parse_size(parts[1], spec);
      const double lo = nargs > 1 ? parse_number(parts[2], spec) : 0.08;
      const double hi = nargs > 2 ? parse_number(parts[3], spec) : 1.0;
      DEW_USAGE_CHECK(0 < lo && lo <= hi && hi <= 1, "data transform '", spec,
                      "': the area fractions must satisfy 0 < min <= max <= 1");
      if (fixes_size) *fixes_size = true;
      out.push_back([s, lo, hi, stream, name](Record& r, uint64_t seed, uint64_t g) {
        View v = image_of(r, name);
        const auto u = draws(seed, stream, g);
        const double side = std::sqrt(lo + (hi - lo) * u[0]);
        const int64_t ch = std::clamp<int64_t>(std::llround(side * double(v.h)), 1, v.h);
        const int64_t cw = std::clamp<int64_t>(std::llround(side * double(v.w)), 1, v.w);
        const int64_t y0 = offset(u[1], v.h - ch), x0 = offset(u[2], v.w - cw);
        const std::vector<uint8_t> c = crop(v, y0, x0, ch, cw);
        set_image(v, s.h, s.w, ch == s.h && cw == s.w ? c : resize_bilinear(c.data(), ch, cw, v.c, s.h, s.w));
      });
    } else {
      DEW_USAGE_CHECK(false, "unknown data transform '", name, "' in '", spec,
                      "' (known: flip, hflip, vflip, pad, random_crop, center_crop, resize, random_resized_crop)");
    }
  }
  return out;
}

}  // namespace dew
