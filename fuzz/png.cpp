// fuzz/png.cpp — libFuzzer target: PNG decoding as the image data sources and `dew-run` read images
// (core/image/png.cpp, libpng's simplified API): decode_png at every channel count dew asks for (0 = the
// file's own, 1, 3, 4) and the header-only read_png_header. Any input must decode to an image of the
// stated size or raise dew::Error; a decoded image's pixel buffer is height * width * channels bytes.
#include <cstdint>
#include <string>

#include "dew/error.hpp"
#include "dew/image.hpp"
#include "scratch.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  for (int64_t channels : {0, 1, 3, 4}) {
    try {
      const dew::Image im = dew::decode_png(data, size, channels, "fuzz.png");
      if (im.pixels.size() != size_t(im.height * im.width * im.channels)) __builtin_trap();
      if (channels > 0 && im.channels != channels) __builtin_trap();
    } catch (const dew::Error&) {
    }
  }
  static const std::string path = (fuzz::scratch_dir("png") / "input.png").string();
  fuzz::put_file(path, {reinterpret_cast<const char*>(data), size});
  try {
    const dew::Image h = dew::read_png_header(path);
    if (h.width <= 0 || h.height <= 0 || h.channels < 1 || h.channels > 4) __builtin_trap();
  } catch (const dew::Error&) {
  }
  return 0;
}
