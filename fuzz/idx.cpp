// fuzz/idx.cpp — libFuzzer target: the "idx" data source (plugins/data/idx/idx.cpp, compiled into this
// target) reading MNIST-style IDX files as `dew-run train` does. The input is an images file, then (after
// the first 0xFF 0xFE pair, optional) a labels file; the first byte's bits say whether each is written with
// a .gz name (then read through zlib as a gzip stream, which a raw file also passes). The source must
// build or raise dew::Error; a built one's records have the header's shape and are read back.
#include "clang14_compat.hpp"  // first: dew/registry.hpp under clang-14
#include "../plugins/data/idx/idx.cpp"

#include "scratch.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t cut = body.find("\xff\xfe");
  const std::string images = body.substr(0, cut), labels = cut == std::string::npos ? "" : body.substr(cut + 2);
  static const fs::path dir = fuzz::scratch_dir("idx");
  for (const char* f : {"train-images-idx3-ubyte", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte",
                        "train-labels-idx1-ubyte.gz"})
    fs::remove(dir / f);
  fuzz::put_file(dir / (std::string("train-images-idx3-ubyte") + (data[0] & 1 ? ".gz" : "")), images);
  fuzz::put_file(dir / (std::string("train-labels-idx1-ubyte") + (data[0] & 2 ? ".gz" : "")), labels);
  try {
    dew::Options o({{"path", dir.string()}, {"split", "train"}}, "data");
    IdxSource src(o);
    for (int64_t i = 0; i < src.size() && i < 4; ++i) {
      const dew::Record r = src.get(i);
      if (r.at("image").bytes.empty()) __builtin_trap();
    }
  } catch (const dew::Error&) {
  }
  return 0;
}
