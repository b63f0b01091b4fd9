// plugins/data/idx — the "idx" data source: MNIST / Fashion-MNIST IDX files, gzip-compressed or raw.
//
// Options: path (a folder; default /usr/share/datasets/fashion-mnist), split (train -> train-*,
// val or test -> t10k-*; set by the loader). The split is read whole into memory at construction
// (Fashion-MNIST train: 60000 x 28 x 28 bytes = 47 MB). Records: "image" u8 [H, W, 1], "label" i32 [].
// Every file is checked: magic number (0x00000803 images, 0x00000801 labels), dimensions, equal record
// counts, and a (decompressed) size that matches the header exactly; problems are usage errors naming
// the file.
#include <zlib.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <dew/data.hpp>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

constexpr const char* kDefaultPath = "/usr/share/datasets/fashion-mnist";
constexpr const char* kHint =
    "install the dataset-fashion-mnist package, or set data.path to a folder holding the IDX files "
    "(train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], "
    "t10k-labels-idx1-ubyte[.gz])";

[[noreturn]] void refuse(const std::string& msg, const std::string& hint = {}) {
  throw dew::UsageError(msg, __FILE__, __LINE__, hint);
}

// The whole (decompressed) content of a file; gzread reads raw files as they are.
std::vector<unsigned char> read_all(const fs::path& file) {
  gzFile f = gzopen(file.c_str(), "rb");
  if (!f) refuse("idx: cannot open '" + file.string() + "': " + std::strerror(errno));
  gzbuffer(f, 1 << 18);
  std::vector<unsigned char> out;
  constexpr size_t kChunk = 1 << 22;
  std::string error;
  for (;;) {
    const size_t at = out.size();
    out.resize(at + kChunk);
    const int got = gzread(f, out.data() + at, unsigned(kChunk));
    if (got < 0) {
      int code = 0;
      const char* msg = gzerror(f, &code);
      out.resize(at);
      // A gzip stream that ends early reads as a short file; the size check then says "truncated".
      if (code != Z_BUF_ERROR) error = msg ? msg : "read error";
      break;
    }
    out.resize(at + size_t(got));
    if (got == 0) break;
  }
  int code = 0;
  const char* msg = gzerror(f, &code);
  if (error.empty() && code != Z_OK && code != Z_BUF_ERROR) error = msg ? msg : "read error";
  gzclose(f);
  if (!error.empty()) refuse("idx: '" + file.string() + "' cannot be read: " + error);
  return out;
}

uint32_t be32(const unsigned char* p) {
  return (uint32_t(p[0]) << 24) | (uint32_t(p[1]) << 16) | (uint32_t(p[2]) << 8) | uint32_t(p[3]);
}

std::string hex(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08x", v);
  return buf;
}

std::string gz(const fs::path& file) { return file.extension() == ".gz" ? " once decompressed" : ""; }

// "<folder>/<stem>" or "<folder>/<stem>.gz", whichever exists (the raw file first).
fs::path find_file(const fs::path& folder, const std::string& stem) {
  std::error_code ec;
  for (const std::string& name : {stem, stem + ".gz"}) {
    const fs::path p = folder / name;
    if (fs::is_regular_file(p, ec)) return p;
  }
  refuse("idx: neither '" + (folder / stem).string() + "' nor '" + (folder / (stem + ".gz")).string() + "' exists",
         kHint);
}

class IdxSource final : public dew::DataSource {
 public:
  explicit IdxSource(const dew::Options& o) {
    const std::string ctx = o.context().empty() ? "" : o.context() + ".";
    const std::string folder_opt = o.get_string("path", kDefaultPath);
    const std::string split = o.get_string("split", "train");
    std::string prefix;
    if (split == "train")
      prefix = "train";
    else if (split == "val" || split == "test")
      prefix = "t10k";
    else
      refuse("idx: option '" + ctx + "split' must be train, val or test, got '" + split + "'");

    std::error_code ec;
    const fs::path folder = fs::weakly_canonical(fs::path(folder_opt), ec);
    const fs::path dir = ec ? fs::path(folder_opt) : folder;
    if (!fs::is_directory(dir, ec)) refuse("idx: the data folder '" + folder_opt + "' does not exist", kHint);

    const fs::path images_file = find_file(dir, prefix + "-images-idx3-ubyte");
    const fs::path labels_file = find_file(dir, prefix + "-labels-idx1-ubyte");
    identity_ = "idx:" + dir.string() + "/" + images_file.filename().string() + "," + labels_file.filename().string();

    // images: magic, count, rows, cols, then count*rows*cols bytes
    std::vector<unsigned char> im = read_all(images_file);
    const std::string in = "idx: '" + images_file.string() + "'";
    if (im.size() < 16)
      refuse(in + " is truncated: " + std::to_string(im.size()) + " bytes, shorter than the 16-byte IDX image header");
    if (be32(im.data()) != 0x00000803u)
      refuse(in + " is not an IDX image file: magic number " + hex(be32(im.data())) +
             ", expected 0x00000803 (u8, 3 dimensions)");
    count_ = be32(im.data() + 4);
    rows_ = be32(im.data() + 8);
    cols_ = be32(im.data() + 12);
    if (rows_ <= 0 || cols_ <= 0 || rows_ > 65536 || cols_ > 65536)
      refuse(in + ": bad image size " + std::to_string(rows_) + "x" + std::to_string(cols_) + " in the header");
    const uint64_t want = 16 + uint64_t(count_) * uint64_t(rows_) * uint64_t(cols_);
    const std::string header_says = "header says " + std::to_string(count_) + " images of " + std::to_string(rows_) +
                                    "x" + std::to_string(cols_) + ", file holds " + std::to_string(im.size()) +
                                    " bytes" + gz(images_file) + " (" + std::to_string(want) + " expected)";
    if (im.size() < want) refuse(in + " is truncated: " + header_says);
    if (im.size() > want) refuse(in + " is longer than its header says: " + header_says);
    im.erase(im.begin(), im.begin() + 16);
    pixels_ = std::move(im);

    // labels: magic, count, then count bytes
    std::vector<unsigned char> lb = read_all(labels_file);
    const std::string ln = "idx: '" + labels_file.string() + "'";
    if (lb.size() < 8)
      refuse(ln + " is truncated: " + std::to_string(lb.size()) + " bytes, shorter than the 8-byte IDX label header");
    if (be32(lb.data()) != 0x00000801u)
      refuse(ln + " is not an IDX label file: magic number " + hex(be32(lb.data())) +
             ", expected 0x00000801 (u8, 1 dimension)");
    const int64_t nlabels = be32(lb.data() + 4);
    const std::string lsays = "header says " + std::to_string(nlabels) + " labels, file holds " +
                              std::to_string(lb.size()) + " bytes" + gz(labels_file) + " (" +
                              std::to_string(8 + nlabels) + " expected)";
    if (int64_t(lb.size()) < 8 + nlabels) refuse(ln + " is truncated: " + lsays);
    if (int64_t(lb.size()) > 8 + nlabels) refuse(ln + " is longer than its header says: " + lsays);
    if (nlabels != count_)
      refuse("idx: '" + images_file.string() + "' holds " + std::to_string(count_) + " images but '" +
             labels_file.string() + "' holds " + std::to_string(nlabels) + " labels");
    lb.erase(lb.begin(), lb.begin() + 8);
    labels_ = std::move(lb);
  }

  int64_t size() const override { return count_; }

  dew::Record get(int64_t index) const override {
    DEW_CHECK(index >= 0 && index < count_, "idx: record ", index, " is outside [0, ", count_, ")");
    dew::Record r;
    dew::HostArray image = dew::HostArray::make(dew::DType::u8, {rows_, cols_, 1});
    const size_t n = size_t(rows_ * cols_);
    std::memcpy(image.bytes.data(), pixels_.data() + size_t(index) * n, n);
    r.emplace("image", std::move(image));
    r.emplace("label", dew::HostArray::scalar_i32(int32_t(labels_[size_t(index)])));
    return r;
  }

  std::string identity() const override { return identity_; }

 private:
  int64_t count_ = 0, rows_ = 0, cols_ = 0;
  std::vector<unsigned char> pixels_, labels_;
  std::string identity_;
};

}  // namespace

DEW_PLUGIN("idx", "0.1.0") {
  registrar.add<dew::DataSource>(
      {.name = "idx",
       .description = "MNIST / Fashion-MNIST IDX files (gzip or raw): image u8 [H, W, 1], label i32 []",
       .factory = [](const dew::Options& o) { return std::make_shared<IdxSource>(o); },
       .probe = {},
       .options = {{"path", kDefaultPath, "folder holding the IDX files"},
                   {"split", "train", "train (train-*) or val/test (t10k-*); set by the loader"}}});
}
