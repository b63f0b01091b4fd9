// dew/image.hpp — 8-bit images on the host: PNG encode/decode (libpng), image grids, and the
// conversion of a model's f32 [N, C, H, W] output in [-1, 1] to u8 images.
//
// Pixels are u8, height x width x channels, row-major, channels interleaved (HWC), the layout of the
// data pipeline's "image" field. Channels: 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA. Decoding expands
// palettes and low bit depths to 8 bits, turns tRNS into alpha and 16-bit samples into 8-bit ones.
// Errors (not a PNG, truncated, CRC mismatch, unsupported request) are dew::UsageError naming the
// file (or "PNG data") and libpng's reason.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

struct Image {
  int64_t height = 0, width = 0, channels = 0;
  std::vector<uint8_t> pixels;  // height * width * channels, HWC
};

// PNG bytes of an HWC u8 image with 1, 2, 3 or 4 channels.
std::vector<unsigned char> encode_png(const uint8_t* pixels, int64_t height, int64_t width, int64_t channels);
// Writes the PNG to `path` through a temporary name and a rename (no half-written file under the name).
void write_png(const std::string& path, const uint8_t* pixels, int64_t height, int64_t width, int64_t channels);

// Decodes PNG bytes. channels = 0 keeps the file's own channel count; 1, 2, 3 or 4 converts (RGB ->
// gray by libpng's sRGB luminance; a dropped alpha is composited onto black). `what` names the data in errors.
Image decode_png(const unsigned char* data, size_t size, int64_t channels = 0, const std::string& what = "PNG data");
Image decode_png(const std::vector<unsigned char>& bytes, int64_t channels = 0, const std::string& what = "PNG data");
Image read_png(const std::string& path, int64_t channels = 0);

// The header of a PNG file without decoding it: height, width, and the channel count decoding gives
// (palette images count 3, or 4 when the file has a tRNS chunk). Refuses files that are not PNG.
Image read_png_header(const std::string& path);

// Lays n HWC images out on a grid of `columns` columns (0: ceil(sqrt(n))) with `padding` pixels of
// `pad_value` between and around them. Returns the grid image.
Image make_image_grid(const uint8_t* images, int64_t n, int64_t height, int64_t width, int64_t channels,
                      int64_t columns = 0, int64_t padding = 2, uint8_t pad_value = 0);
// make_image_grid, encoded as PNG.
std::vector<unsigned char> encode_png_grid(const uint8_t* images, int64_t n, int64_t height, int64_t width,
                                           int64_t channels, int64_t columns = 0, int64_t padding = 2);

// f32 (or any floating) [N, C, H, W] in [-1, 1] on any backend -> u8 [N, H, W, C] on the host:
// round((clip(x, -1, 1) + 1) * 127.5). NaN maps to 0.
std::vector<uint8_t> tensor_to_images(const Tensor& x);
// Bilinear resize (half-pixel centres, edge clamped; no antialiasing) of an HWC u8 image.
std::vector<uint8_t> resize_bilinear(const uint8_t* src, int64_t height, int64_t width, int64_t channels,
                                     int64_t out_height, int64_t out_width);

}  // namespace dew
