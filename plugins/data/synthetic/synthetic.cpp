// plugins/data/synthetic — the "synthetic" data source: generated records for tests and smoke runs.
//
// Every record is a pure function of (seed, split, kind options, index); nothing is stored.
// Options: size (records per split, default 1024), seed (default 0), kind = classify | tokens.
//  * classify (default): "image" u8 [H, W, C] (H = W = image_size, default 8; C = channels, default 1) and
//    "label" i32 in [0, num_classes) (default 4). The image is Philox noise in [0, 96) with the label's
//    cell of a ceil(sqrt(K)) x ceil(sqrt(K)) grid bright, in [160, 256): a classifier learns it quickly.
//  * tokens: "text" i32 [seq_len + 1] (seq_len default 16) over vocab ids (default 16): a random start,
//    then each id is the previous one + 1 (mod vocab) with probability 0.9, else a random id.
// The splits (train, val, test) draw from different Philox streams, so they hold different records.
#include <cmath>
#include <dew/data.hpp>
#include <dew/error.hpp>
#include <dew/random.hpp>
#include <dew/registry.hpp>
#include <string>

namespace {

class SyntheticSource final : public dew::DataSource {
 public:
  explicit SyntheticSource(const dew::Options& o) {
    const std::string ctx = o.context().empty() ? "" : o.context() + ".";
    auto key = [&](const char* k) { return "'" + ctx + k + "'"; };
    size_ = o.get_int("size", 1024);
    DEW_USAGE_CHECK(size_ > 0, "synthetic: option ", key("size"), " must be positive, got ", size_);
    const int64_t seed = o.get_int("seed", 0);
    DEW_USAGE_CHECK(seed >= 0, "synthetic: option ", key("seed"), " must not be negative, got ", seed);
    seed_ = uint64_t(seed);
    split_ = o.get_string("split", "train");
    DEW_USAGE_CHECK(split_ == "train" || split_ == "val" || split_ == "test", "synthetic: option ", key("split"),
                    " must be train, val or test, got '", split_, "'");
    stream_ = dew::philox::stream_of(("synthetic/" + split_).c_str());
    kind_ = o.get_string("kind", "classify");
    if (kind_ == "classify") {
      image_size_ = o.get_int("image_size", 8);
      channels_ = o.get_int("channels", 1);
      classes_ = o.get_int("num_classes", 4);
      DEW_USAGE_CHECK(classes_ >= 1 && classes_ <= 65536, "synthetic: option ", key("num_classes"),
                      " must be in [1, 65536], got ", classes_);
      grid_ = 1;
      while (grid_ * grid_ < classes_) ++grid_;
      DEW_USAGE_CHECK(image_size_ >= grid_ && image_size_ <= 4096, "synthetic: option ", key("image_size"),
                      " must be in [", grid_, ", 4096] for ", classes_, " classes, got ", image_size_);
      DEW_USAGE_CHECK(channels_ >= 1 && channels_ <= 64, "synthetic: option ", key("channels"),
                      " must be in [1, 64], got ", channels_);
      per_record_ = uint64_t(image_size_ * image_size_ * channels_ + 1);
      identity_ = "synthetic:classify,size=" + std::to_string(size_) + ",image_size=" + std::to_string(image_size_) +
                  ",channels=" + std::to_string(channels_) + ",num_classes=" + std::to_string(classes_);
    } else if (kind_ == "tokens") {
      seq_len_ = o.get_int("seq_len", 16);
      vocab_ = o.get_int("vocab", 16);
      DEW_USAGE_CHECK(seq_len_ >= 1 && seq_len_ <= (1 << 20), "synthetic: option ", key("seq_len"),
                      " must be in [1, 1048576], got ", seq_len_);
      DEW_USAGE_CHECK(vocab_ >= 2 && vocab_ <= (int64_t(1) << 30), "synthetic: option ", key("vocab"),
                      " must be in [2, 2^30], got ", vocab_);
      per_record_ = uint64_t(2 * (seq_len_ + 1));
      identity_ = "synthetic:tokens,size=" + std::to_string(size_) + ",seq_len=" + std::to_string(seq_len_) +
                  ",vocab=" + std::to_string(vocab_);
    } else {
      DEW_USAGE_CHECK(false, "synthetic: option ", key("kind"), " must be classify or tokens, got '", kind_, "'");
    }
    identity_ += ",seed=" + std::to_string(seed_) + ",split=" + split_;
  }

  int64_t size() const override { return size_; }

  dew::Record get(int64_t index) const override {
    DEW_CHECK(index >= 0 && index < size_, "synthetic: record ", index, " is outside [0, ", size_, ")");
    const uint64_t g0 = uint64_t(index) * per_record_;
    auto u = [&](uint64_t k) { return dew::philox::uniform(seed_, stream_, g0 + k); };
    dew::Record r;
    if (kind_ == "classify") {
      const int64_t label = std::min<int64_t>(int64_t(u(0) * float(classes_)), classes_ - 1);
      const int64_t H = image_size_, W = image_size_, C = channels_;
      const int64_t cy = label / grid_, cx = label % grid_;
      // cell (cy, cx) covers rows [cy*H/grid, (cy+1)*H/grid) and the same for columns
      const int64_t y0 = cy * H / grid_, y1 = (cy + 1) * H / grid_, x0 = cx * W / grid_, x1 = (cx + 1) * W / grid_;
      dew::HostArray image = dew::HostArray::make(dew::DType::u8, {H, W, C});
      uint8_t* px = image.as<uint8_t>();
      for (int64_t y = 0; y < H; ++y)
        for (int64_t x = 0; x < W; ++x)
          for (int64_t c = 0; c < C; ++c) {
            const int64_t i = (y * W + x) * C + c;
            const bool bright = y >= y0 && y < y1 && x >= x0 && x < x1;
            const int v = int(u(1 + uint64_t(i)) * 96.0f);
            px[i] = uint8_t(bright ? 160 + v : v);
          }
      r.emplace("image", std::move(image));
      r.emplace("label", dew::HostArray::scalar_i32(int32_t(label)));
    } else {
      dew::HostArray text = dew::HostArray::make(dew::DType::i32, {seq_len_ + 1});
      int32_t* t = text.as<int32_t>();
      auto draw = [&](uint64_t k) {
        return int32_t(std::min<int64_t>(int64_t(double(u(k)) * double(vocab_)), vocab_ - 1));
      };
      t[0] = draw(0);
      for (int64_t i = 1; i <= seq_len_; ++i)
        t[i] = u(2 * uint64_t(i)) < 0.9f ? int32_t((t[i - 1] + 1) % vocab_) : draw(2 * uint64_t(i) + 1);
      r.emplace("text", std::move(text));
    }
    return r;
  }

  std::string identity() const override { return identity_; }

 private:
  int64_t size_ = 0, image_size_ = 0, channels_ = 0, classes_ = 0, grid_ = 1, seq_len_ = 0, vocab_ = 0;
  uint64_t seed_ = 0, stream_ = 0, per_record_ = 1;
  std::string split_, kind_, identity_;
};

}  // namespace

DEW_PLUGIN("synthetic", "0.1.0") {
  registrar.add<dew::DataSource>(
      {.name = "synthetic",
       .description =
           "generated records for tests: classify (image u8 [H, W, C], label i32) or tokens (text i32 [T+1])",
       .factory = [](const dew::Options& o) { return std::make_shared<SyntheticSource>(o); },
       .probe = {},
       .options = {{"size", "1024", "records per split"},
                   {"seed", "0", "seed of the generated content"},
                   {"kind", "classify", "classify or tokens"},
                   {"image_size", "8", "classify: image height and width"},
                   {"channels", "1", "classify: image channels"},
                   {"num_classes", "4", "classify: number of classes"},
                   {"seq_len", "16", "tokens: tokens per record (records hold seq_len + 1 ids)"},
                   {"vocab", "16", "tokens: vocabulary size"}}});
}
