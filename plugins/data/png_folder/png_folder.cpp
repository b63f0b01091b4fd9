// plugins/data/png_folder — the "png_folder" data source: a folder of PNG images, labelled by
// sub-folder or unlabelled.
//
// Layout of `path` (one split): either class sub-folders, path/<class>/*.png, with the classes sorted
// by name (byte order) taking label ids 0, 1, ... -> records {"image" u8 [H, W, C], "label" i32 []};
// or PNG files directly in path -> unlabelled records {"image"}. A folder mixing both is refused, and
// so is a class folder without PNGs. Splits: when path holds a `train` sub-folder (and no PNG files),
// split train reads path/train and val/test read path/val (or path/test); otherwise path is the
// training split and val is refused. Files are *.png (any case), sorted by name within a class; hidden
// files are skipped. Record i is the i-th file of that order (classes in label order).
// Channels: `channels` = 0 keeps the first image's count (1 gray, 2 gray+alpha, 3 RGB, 4 RGBA) and
// converts every other image to it; 1/3/4 converts all. Sizes: every image must have the first one's
// size (checked from the PNG headers at start, the two files named), unless `resize` = S or HxW
// (bilinear on load) or the loader's transforms give every record one size (it then sets the internal
// key mixed_sizes_ok). Images are decoded on demand in get() (thread-safe, nothing cached).
#include <algorithm>
#include <dew/data.hpp>
#include <dew/error.hpp>
#include <dew/image.hpp>
#include <dew/registry.hpp>
#include <filesystem>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

bool is_png(const fs::directory_entry& e) {
  if (!e.is_regular_file()) return false;
  const std::string name = e.path().filename().string();
  if (name.empty() || name[0] == '.') return false;
  std::string ext = e.path().extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return char(std::tolower(c)); });
  return ext == ".png";
}

std::vector<fs::path> sorted_entries(const fs::path& dir, bool dirs) {
  std::vector<fs::path> out;
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name.empty() || name[0] == '.') continue;
    if (dirs ? e.is_directory() : is_png(e)) out.push_back(e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

class PngFolder final : public dew::DataSource {
 public:
  explicit PngFolder(const dew::Options& o) {
    const std::string ctx = o.context().empty() ? "" : o.context() + ".";
    const std::string path = o.get_string("path", "");
    DEW_USAGE_CHECK(!path.empty(), "png_folder: set '", ctx, "path' to a folder of PNG images");
    const std::string split = o.get_string("split", "train");
    channels_ = o.get_int("channels", 0);
    DEW_USAGE_CHECK(channels_ == 0 || channels_ == 1 || channels_ == 3 || channels_ == 4, "png_folder: option '", ctx,
                    "channels' must be 0 (as stored), 1, 3 or 4, got ", channels_);
    const std::vector<int64_t> resize = o.get_positive_ints("resize", {});
    DEW_USAGE_CHECK(resize.size() <= 2, "png_folder: option '", ctx, "resize' must be S or 'H,W'");
    if (!resize.empty()) {
      resize_h_ = resize[0];
      resize_w_ = resize.size() == 2 ? resize[1] : resize[0];
      // A record is resize_h x resize_w x up to 4 channels: at most 8192 per side keeps it within the 256 MiB
      // dew decodes from one image (core/image/png.cpp), instead of growing until the machine runs out.
      DEW_USAGE_CHECK(resize_h_ <= 8192 && resize_w_ <= 8192, "png_folder: option '", ctx, "resize' = ", resize_h_, "x",
                      resize_w_, " is too large (at most 8192 per side)");
    }
    const bool mixed_ok = o.get_bool("mixed_sizes_ok", false);

    std::error_code ec;
    fs::path root = fs::path(path);
    DEW_USAGE_CHECK(fs::is_directory(root, ec), "png_folder: the folder '", path, "' does not exist");
    fs::path dir = root;
    if (fs::is_directory(root / "train", ec) && sorted_entries(root, false).empty()) {
      if (split == "train") {
        dir = root / "train";
      } else {
        dir = fs::is_directory(root / split, ec) ? root / split : root / (split == "val" ? "test" : "val");
        DEW_USAGE_CHECK(fs::is_directory(dir, ec), "png_folder: '", path, "' has no '", split,
                        "' split folder (a 'train' folder is there; add 'val' or 'test')");
      }
    } else {
      DEW_USAGE_CHECK(split == "train", "png_folder: '", path, "' has no validation split (put the images in '", path,
                      "/train' and '", path, "/val' sub-folders to have one)");
    }

    const std::vector<fs::path> classes = sorted_entries(dir, true), loose = sorted_entries(dir, false);
    DEW_USAGE_CHECK(classes.empty() || loose.empty(), "png_folder: '", dir.string(), "' holds both PNG files ('",
                    loose.front().filename().string(), "') and class folders ('", classes.front().filename().string(),
                    "'); use one layout");
    if (classes.empty()) {
      files_ = loose;
    } else {
      labelled_ = true;
      for (size_t c = 0; c < classes.size(); ++c) {
        const std::vector<fs::path> f = sorted_entries(classes[c], false);
        DEW_USAGE_CHECK(!f.empty(), "png_folder: the class folder '", classes[c].string(), "' holds no PNG files");
        for (const auto& p : f) {
          files_.push_back(p);
          labels_.push_back(int32_t(c));
        }
        class_names_.push_back(classes[c].filename().string());
      }
    }
    DEW_USAGE_CHECK(!files_.empty(), "png_folder: '", dir.string(), "' holds no PNG files");

    // Size and channels from the headers (cheap): every image must share the first one's size.
    const dew::Image first = dew::read_png_header(files_[0].string());
    height_ = first.height;
    width_ = first.width;
    if (channels_ == 0) channels_ = first.channels;
    if (resize_h_ == 0 && !mixed_ok)
      for (size_t i = 1; i < files_.size(); ++i) {
        const dew::Image h = dew::read_png_header(files_[i].string());
        DEW_USAGE_CHECK(h.height == height_ && h.width == width_, "png_folder: '", files_[i].string(), "' is ",
                        h.height, "x", h.width, " but '", files_[0].string(), "' is ", height_, "x", width_,
                        "; every image must have one size: set '", ctx,
                        "resize' (e.g. 32 or 32,48) or add a transform that fixes the size (resize, center_crop, "
                        "random_resized_crop)");
      }
    if (resize_h_ > 0) height_ = resize_h_, width_ = resize_w_;
    identity_ = "png_folder:" + fs::weakly_canonical(dir, ec).string() + ";n=" + std::to_string(files_.size()) +
                ";channels=" + std::to_string(channels_) +
                (resize_h_ ? ";resize=" + std::to_string(resize_h_) + "x" + std::to_string(resize_w_) : "");
  }

  int64_t size() const override { return int64_t(files_.size()); }

  dew::Record get(int64_t index) const override {
    DEW_CHECK(index >= 0 && index < size(), "png_folder: record ", index, " is outside [0, ", size(), ")");
    dew::Image im = dew::read_png(files_[size_t(index)].string(), channels_);
    if (resize_h_ > 0 && (im.height != resize_h_ || im.width != resize_w_)) {
      im.pixels = dew::resize_bilinear(im.pixels.data(), im.height, im.width, im.channels, resize_h_, resize_w_);
      im.height = resize_h_;
      im.width = resize_w_;
    }
    dew::HostArray a = dew::HostArray::make(dew::DType::u8, {im.height, im.width, im.channels});
    std::copy(im.pixels.begin(), im.pixels.end(), a.bytes.begin());
    dew::Record r;
    r.emplace("image", std::move(a));
    if (labelled_) r.emplace("label", dew::HostArray::scalar_i32(labels_[size_t(index)]));
    return r;
  }

  std::string identity() const override { return identity_; }

 private:
  std::vector<fs::path> files_;
  std::vector<int32_t> labels_;
  std::vector<std::string> class_names_;
  bool labelled_ = false;
  int64_t channels_ = 0, height_ = 0, width_ = 0, resize_h_ = 0, resize_w_ = 0;
  std::string identity_;
};

}  // namespace

DEW_PLUGIN("png_folder", "0.1.0") {
  registrar.add<dew::DataSource>(
      {.name = "png_folder",
       .description = "a folder of PNG images: <path>/<class>/*.png (labels by sorted class name) or <path>/*.png "
                      "(unlabelled); image u8 [H, W, C], label i32 []",
       .factory = [](const dew::Options& o) { return std::make_shared<PngFolder>(o); },
       .probe = {},
       .options = {{"path", "", "the folder (with train/ and val/ sub-folders for a validation split)"},
                   {"channels", "0", "0: as the first image; 1, 3 or 4: convert every image"},
                   {"resize", "", "S or H,W: resize every image on load (bilinear)"},
                   {"split", "train", "train or val/test; set by the loader"}}});
}
