// core/image/png.cpp — dew/image.hpp: PNG through libpng's simplified API (png_image_*: no setjmp in
// dew's code; every libpng error comes back as a message), grids, tensor -> u8 conversion, bilinear resize.
// Invariants: decoded pixels are always 8-bit HWC; errors are UsageError naming the data and the reason.
#include <png.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dew/error.hpp"
#include "dew/image.hpp"

namespace dew {

namespace {

png_uint_32 format_of(int64_t channels) {
  switch (channels) {
    case 1:
      return PNG_FORMAT_GRAY;
    case 2:
      return PNG_FORMAT_GA;
    case 3:
      return PNG_FORMAT_RGB;
    case 4:
      return PNG_FORMAT_RGBA;
  }
  DEW_USAGE_CHECK(false, "PNG: ", channels, " channels; an image has 1 (gray), 2 (gray + alpha), 3 (RGB) or 4 (RGBA)");
  return 0;
}

std::vector<unsigned char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DEW_USAGE_CHECK(f.good(), "cannot open '", path, "': ", std::strerror(errno));
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

}  // namespace

std::vector<unsigned char> encode_png(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels) {
  DEW_USAGE_CHECK(height > 0 && width > 0 && height < (1 << 24) && width < (1 << 24), "encode_png: bad image size ",
                  height, "x", width);
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  img.width = png_uint_32(width);
  img.height = png_uint_32(height);
  img.format = format_of(channels);
  png_alloc_size_t size = 0;
  DEW_USAGE_CHECK(png_image_write_to_memory(&img, nullptr, &size, 0, pixels, 0, nullptr) && size > 0,
                  "encode_png: libpng failed: ", img.message);
  std::vector<unsigned char> out(size);
  DEW_USAGE_CHECK(png_image_write_to_memory(&img, out.data(), &size, 0, pixels, 0, nullptr),
                  "encode_png: libpng failed: ", img.message);
  out.resize(size);
  return out;
}

void write_png(const std::string& path, const uint8_t* pixels, int64_t height, int64_t width, int64_t channels) {
  const std::vector<unsigned char> bytes = encode_png(pixels, height, width, channels);
  const std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    DEW_USAGE_CHECK(f.good(), "cannot write '", tmp, "': ", std::strerror(errno));
    f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(bytes.size()));
    f.flush();
    DEW_USAGE_CHECK(f.good(), "cannot write '", tmp, "': ", std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  DEW_USAGE_CHECK(!ec, "cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

// 8192 x 8192 RGBA: far above any image a data source or a request holds.
constexpr uint64_t kMaxDecodedBytes = uint64_t(1) << 28;

Image decode_png(const unsigned char* data, size_t size, int64_t channels, const std::string& what) {
  static const unsigned char kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  DEW_USAGE_CHECK(size >= 8 && std::memcmp(data, kSig, 8) == 0, what, " is not a PNG file (no PNG signature)");
  png_image img;
  std::memset(&img, 0, sizeof img);
  img.version = PNG_IMAGE_VERSION;
  DEW_USAGE_CHECK(png_image_begin_read_from_memory(&img, data, size), what, " cannot be decoded: ", img.message);
  const bool alpha = img.format & PNG_FORMAT_FLAG_ALPHA, color = img.format & PNG_FORMAT_FLAG_COLOR;
  Image out;
  out.channels = channels > 0 ? channels : (color ? 3 : 1) + (alpha ? 1 : 0);
  // The header's size bounds the allocation below: a few bytes claiming 60000 x 60000 asked for 14 GB.
  if (uint64_t(img.width) * img.height * uint64_t(out.channels) > kMaxDecodedBytes) {
    png_image_free(&img);
    DEW_USAGE_CHECK(false, what, " is ", img.width, " x ", img.height, " pixels: larger than the ",
                    kMaxDecodedBytes >> 20, " MiB of decoded pixels dew reads from one image");
  }
  out.height = img.height;
  out.width = img.width;
  img.format = format_of(out.channels);
  out.pixels.resize(size_t(out.height * out.width * out.channels));
  const png_color black{0, 0, 0};
  if (!png_image_finish_read(&img, &black, out.pixels.data(), 0, nullptr)) {
    const std::string msg = img.message;
    png_image_free(&img);
    DEW_USAGE_CHECK(false, what, " cannot be decoded: ", msg);
  }
  DEW_USAGE_CHECK(!(img.warning_or_error & PNG_IMAGE_ERROR), what, " cannot be decoded: ", img.message);
  return out;
}

Image decode_png(const std::vector<unsigned char>& bytes, int64_t channels, const std::string& what) {
  return decode_png(bytes.data(), bytes.size(), channels, what);
}

Image read_png(const std::string& path, int64_t channels) {
  const std::vector<unsigned char> bytes = read_file(path);
  return decode_png(bytes, channels, "'" + path + "'");
}

Image read_png_header(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  DEW_USAGE_CHECK(f.good(), "cannot open '", path, "': ", std::strerror(errno));
  // signature (8) + IHDR length (4) + "IHDR" (4) + width, height (8) + depth, colour type (2)
  unsigned char h[26] = {};
  f.read(reinterpret_cast<char*>(h), sizeof h);
  static const unsigned char kSig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  DEW_USAGE_CHECK(
      f.gcount() == std::streamsize(sizeof h) && std::memcmp(h, kSig, 8) == 0 && std::memcmp(h + 12, "IHDR", 4) == 0,
      "'", path, "' is not a PNG file (no PNG signature and IHDR header)");
  Image r;
  r.width = be32(h + 16);
  r.height = be32(h + 20);
  DEW_USAGE_CHECK(r.width > 0 && r.height > 0, "'", path, "': bad image size in the PNG header");
  switch (h[25]) {
    case 0:
      r.channels = 1;
      break;
    case 2:
      r.channels = 3;
      break;
    case 4:
      r.channels = 2;
      break;
    case 6:
      r.channels = 4;
      break;
    case 3: {  // palette: RGBA when a tRNS chunk comes before IDAT
      r.channels = 3;
      std::vector<unsigned char> all = read_file(path);
      for (size_t at = 8; at + 8 <= all.size();) {
        const uint32_t len = be32(all.data() + at);
        const std::string type(reinterpret_cast<const char*>(all.data() + at + 4), 4);
        if (type == "tRNS") r.channels = 4;
        if (type == "IDAT" || type == "IEND") break;
        at += 12 + size_t(len);
      }
      break;
    }
    default:
      DEW_USAGE_CHECK(false, "'", path, "': unknown PNG colour type ", int(h[25]));
  }
  // gray images with a tRNS chunk decode with alpha as well; rare, and a mismatch is caught on decode
  return r;
}

Image make_image_grid(const uint8_t* images, int64_t n, int64_t height, int64_t width, int64_t channels,
                      int64_t columns, int64_t padding, uint8_t pad_value) {
  DEW_USAGE_CHECK(n > 0 && height > 0 && width > 0 && channels > 0 && padding >= 0 && columns >= 0,
                  "make_image_grid: bad arguments (n ", n, ", ", height, "x", width, "x", channels, ", columns ",
                  columns, ", padding ", padding, ")");
  if (columns == 0) columns = int64_t(std::ceil(std::sqrt(double(n))));
  columns = std::min(columns, n);
  const int64_t rows = (n + columns - 1) / columns;
  Image g;
  g.channels = channels;
  g.height = rows * height + (rows + 1) * padding;
  g.width = columns * width + (columns + 1) * padding;
  g.pixels.assign(size_t(g.height * g.width * channels), pad_value);
  const size_t row_bytes = size_t(width * channels);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t r = i / columns, c = i % columns;
    const int64_t y0 = padding + r * (height + padding), x0 = padding + c * (width + padding);
    for (int64_t y = 0; y < height; ++y)
      std::memcpy(g.pixels.data() + size_t(((y0 + y) * g.width + x0) * channels),
                  images + size_t((i * height + y) * width * channels), row_bytes);
  }
  return g;
}

std::vector<unsigned char> encode_png_grid(const uint8_t* images, int64_t n, int64_t height, int64_t width,
                                           int64_t channels, int64_t columns, int64_t padding) {
  const Image g = make_image_grid(images, n, height, width, channels, columns, padding);
  return encode_png(g.pixels.data(), g.height, g.width, g.channels);
}

std::vector<uint8_t> tensor_to_images(const Tensor& x) {
  DEW_CHECK(x.ndim() == 4, "tensor_to_images: expected [N, C, H, W], got ", shape_str(x.shape()));
  const int64_t n = x.shape()[0], c = x.shape()[1], h = x.shape()[2], w = x.shape()[3];
  const std::vector<float> v = x.to_floats();
  std::vector<uint8_t> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t y = 0; y < h; ++y)
        for (int64_t xx = 0; xx < w; ++xx) {
          float f = v[size_t(((i * c + ch) * h + y) * w + xx)];
          f = std::isnan(f) ? -1.0f : std::clamp(f, -1.0f, 1.0f);
          out[size_t(((i * h + y) * w + xx) * c + ch)] = uint8_t(std::lround((f + 1.0f) * 127.5f));
        }
  return out;
}

std::vector<uint8_t> resize_bilinear(const uint8_t* src, int64_t height, int64_t width, int64_t channels,
                                     int64_t out_height, int64_t out_width) {
  DEW_USAGE_CHECK(height > 0 && width > 0 && out_height > 0 && out_width > 0, "resize_bilinear: bad size ", height, "x",
                  width, " -> ", out_height, "x", out_width);
  std::vector<uint8_t> out(size_t(out_height * out_width * channels));
  const double sy = double(height) / double(out_height), sx = double(width) / double(out_width);
  for (int64_t y = 0; y < out_height; ++y) {
    const double fy = std::clamp((double(y) + 0.5) * sy - 0.5, 0.0, double(height - 1));
    const int64_t y0 = int64_t(fy), y1 = std::min(y0 + 1, height - 1);
    const double wy = fy - double(y0);
    for (int64_t x = 0; x < out_width; ++x) {
      const double fx = std::clamp((double(x) + 0.5) * sx - 0.5, 0.0, double(width - 1));
      const int64_t x0 = int64_t(fx), x1 = std::min(x0 + 1, width - 1);
      const double wx = fx - double(x0);
      for (int64_t c = 0; c < channels; ++c) {
        auto at = [&](int64_t yy, int64_t xx) { return double(src[size_t((yy * width + xx) * channels + c)]); };
        const double v =
            (1 - wy) * ((1 - wx) * at(y0, x0) + wx * at(y0, x1)) + wy * ((1 - wx) * at(y1, x0) + wx * at(y1, x1));
        out[size_t((y * out_width + x) * channels + c)] = uint8_t(std::lround(std::clamp(v, 0.0, 255.0)));
      }
    }
  }
  return out;
}

}  // namespace dew
