// core/train/tensorboard.cpp — the TensorBoard event writer of core/train/tensorboard.hpp.
//
// The protobuf messages are encoded by hand: five small messages (Event, Summary, Summary.Value,
// Summary.Image, the text plugin's SummaryMetadata + TensorProto) with fixed field numbers, which a page of
// wire-format code writes, where Debian's libprotobuf would need TensorFlow's .proto files (packaged by no
// Debian package) and a protoc step in the build. Field numbers are those of tensorboard/compat/proto/
// event.proto, summary.proto and tensor.proto; a text summary is a rank-0 DT_STRING tensor with the "text"
// plugin's metadata, as tf.summary.text writes it.
//
// CRC-32C is written by hand too (a 256-entry table, byte at a time): no Debian library dew links has it,
// and the event files are small. tests/report/read_events.py checks both against an independent decoder.
#include "train/tensorboard.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "dew/error.hpp"

namespace dew::tensorboard {

namespace fs = std::filesystem;

namespace {

std::array<uint32_t, 256> make_crc_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
    t[i] = c;
  }
  return t;
}

// ---- protobuf wire format: the field kinds these messages use ----
class Proto {
 public:
  Proto& varint(int field, uint64_t v) {
    key(field, 0);
    put_varint(v);
    return *this;
  }
  Proto& f64(int field, double v) {
    key(field, 1);
    put_fixed(&v, 8);
    return *this;
  }
  Proto& f32(int field, float v) {
    key(field, 5);
    put_fixed(&v, 4);
    return *this;
  }
  Proto& bytes(int field, const void* data, size_t size) {
    key(field, 2);
    put_varint(size);
    out_.append(static_cast<const char*>(data), size);
    return *this;
  }
  Proto& bytes(int field, const std::string& s) { return bytes(field, s.data(), s.size()); }
  Proto& message(int field, const Proto& m) { return bytes(field, m.out_); }
  const std::string& str() const { return out_; }

 private:
  void key(int field, int wire) { put_varint(uint64_t(field) << 3 | uint64_t(wire)); }
  void put_varint(uint64_t v) {
    while (v >= 0x80) {
      out_.push_back(char(uint8_t(v) | 0x80));
      v >>= 7;
    }
    out_.push_back(char(v));
  }
  void put_fixed(const void* p, size_t n) {  // little-endian (x86-64, the only target)
    out_.append(static_cast<const char*>(p), n);
  }
  std::string out_;
};

// Event fields (event.proto).
constexpr int kEventWallTime = 1, kEventStep = 2, kEventFileVersion = 3, kEventSummary = 5;
// Summary.value = 1; Summary.Value: tag 1, simple_value 2, image 4, tensor 8, metadata 9.
constexpr int kSummaryValue = 1, kValueTag = 1, kValueSimple = 2, kValueImage = 4, kValueTensor = 8, kValueMetadata = 9;
// Summary.Image: height 1, width 2, colorspace 3, encoded_image_string 4.
constexpr int kImageHeight = 1, kImageWidth = 2, kImageColorspace = 3, kImageEncoded = 4;
// SummaryMetadata.plugin_data = 1; PluginData.plugin_name = 1.
constexpr int kMetadataPluginData = 1, kPluginName = 1;
// TensorProto: dtype 1 (DT_STRING = 7), tensor_shape 2 (a TensorShapeProto; empty: rank 0), string_val 8.
constexpr int kTensorDtype = 1, kTensorShape = 2, kTensorStringVal = 8;
constexpr uint64_t kDtString = 7;

Proto event_header(int64_t step) {
  const double now = std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  Proto e;
  e.f64(kEventWallTime, now).varint(kEventStep, uint64_t(step));
  return e;
}

// Reads one varint at p (bounded by end); false when malformed.
bool read_varint(const uint8_t*& p, const uint8_t* end, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && p < end; shift += 7) {
    const uint8_t b = *p++;
    v |= uint64_t(b & 0x7f) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// The step of an encoded Event (0 when it has none, e.g. the file_version record); false when malformed.
bool event_step(const std::string& bytes, int64_t& step) {
  const auto* p = reinterpret_cast<const uint8_t*>(bytes.data());
  const auto* end = p + bytes.size();
  step = 0;
  while (p < end) {
    uint64_t key = 0, v = 0;
    if (!read_varint(p, end, key)) return false;
    switch (key & 7) {
      case 0:
        if (!read_varint(p, end, v)) return false;
        if ((key >> 3) == uint64_t(kEventStep)) step = int64_t(v);
        break;
      case 1:
        if (end - p < 8) return false;
        p += 8;
        break;
      case 5:
        if (end - p < 4) return false;
        p += 4;
        break;
      case 2:
        if (!read_varint(p, end, v) || uint64_t(end - p) < v) return false;
        p += v;
        break;
      default:
        return false;
    }
  }
  return true;
}

uint64_t read_le64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}
uint32_t read_le32(const unsigned char* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The byte length of the records of `path` to keep: valid records (both CRCs right) of steps <= max_step,
// up to the first that is not. `records` counts the kept ones.
uintmax_t kept_prefix(const std::string& path, int64_t max_step, int64_t& records) {
  std::ifstream in(path, std::ios::binary);
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const auto* base = reinterpret_cast<const unsigned char*>(data.data());
  size_t pos = 0;
  records = 0;
  while (data.size() - pos >= 12) {
    const uint64_t len = read_le64(base + pos);
    if (read_le32(base + pos + 8) != masked_crc32c(base + pos, 8)) break;
    if (data.size() - pos - 12 < len + 4) break;  // torn: the length arrived, not the whole record
    if (read_le32(base + pos + 12 + len) != masked_crc32c(base + pos + 12, len)) break;
    int64_t step = 0;
    if (!event_step(data.substr(pos + 12, len), step) || step > max_step) break;
    pos += 12 + len + 4;
    ++records;
  }
  return pos;
}

std::string new_file_name() {
  char host[256] = "localhost";
  if (gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
  host[sizeof host - 1] = '\0';
  const auto secs =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  char name[400];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%d.0", (long long)secs, host, int(getpid()));
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = make_crc_table();
  const auto* p = static_cast<const uint8_t*>(data);
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) c = table[(c ^ p[i]) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir, int64_t start_step) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  DEW_CHECK(!ec, "tensorboard: cannot create '", dir, "': ", ec.message());
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (e.is_regular_file() && name.rfind("events.out.tfevents.", 0) == 0 &&
        (path_.empty() || e.path().string() > path_))
      path_ = e.path().string();
  }
  int64_t records = 0;
  if (!path_.empty()) {
    const uintmax_t keep = kept_prefix(path_, start_step, records);
    if (keep != fs::file_size(path_)) fs::resize_file(path_, keep);
  } else {
    path_ = (fs::path(dir) / new_file_name()).string();
  }
  file_ = std::fopen(path_.c_str(), "ab");
  DEW_CHECK(file_, "tensorboard: cannot open '", path_, "' for writing: ", std::strerror(errno));
  if (records == 0) {
    Proto e = event_header(0);
    e.bytes(kEventFileVersion, std::string("brain.Event:2"));
    write_record(e.str());
    flush();
  }
}

EventWriter::~EventWriter() {
  if (file_) std::fclose(file_);
}

void EventWriter::write_record(const std::string& bytes) {
  unsigned char header[12];
  const uint64_t len = bytes.size();
  std::memcpy(header, &len, 8);
  const uint32_t len_crc = masked_crc32c(header, 8), data_crc = masked_crc32c(bytes.data(), bytes.size());
  std::memcpy(header + 8, &len_crc, 4);
  const bool ok = std::fwrite(header, 1, 12, file_) == 12 &&
                  std::fwrite(bytes.data(), 1, bytes.size(), file_) == bytes.size() &&
                  std::fwrite(&data_crc, 1, 4, file_) == 4;
  DEW_CHECK(ok, "tensorboard: cannot write '", path_, "': ", std::strerror(errno));
}

void EventWriter::flush() {
  DEW_CHECK(std::fflush(file_) == 0, "tensorboard: cannot write '", path_, "': ", std::strerror(errno));
}

void EventWriter::add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  if (values.empty()) return;
  Proto summary;
  for (const auto& [tag, v] : values) {
    Proto value;
    value.bytes(kValueTag, tag).f32(kValueSimple, float(v));
    summary.message(kSummaryValue, value);
  }
  Proto e = event_header(step);
  e.message(kEventSummary, summary);
  write_record(e.str());
}

void EventWriter::add_image(int64_t step, const std::string& tag, const std::vector<unsigned char>& png) {
  static const unsigned char kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  DEW_CHECK(png.size() >= 33 && std::memcmp(png.data(), kSignature, 8) == 0 && std::memcmp(&png[12], "IHDR", 4) == 0,
            "tensorboard: image '", tag, "' is not a PNG");
  auto be32 = [&](size_t at) {
    return uint32_t(png[at]) << 24 | uint32_t(png[at + 1]) << 16 | uint32_t(png[at + 2]) << 8 | png[at + 3];
  };
  // Summary.Image.colorspace: 1 gray, 2 gray + alpha, 3 RGB, 4 RGBA (PNG colour types 0, 4, 2 / 3, 6).
  const int color_type = png[25];
  const int channels = color_type == 0 ? 1 : color_type == 4 ? 2 : color_type == 6 ? 4 : 3;
  Proto image;
  image.varint(kImageHeight, be32(20))
      .varint(kImageWidth, be32(16))
      .varint(kImageColorspace, uint64_t(channels))
      .bytes(kImageEncoded, png.data(), png.size());
  Proto value;
  value.bytes(kValueTag, tag).message(kValueImage, image);
  Proto summary;
  summary.message(kSummaryValue, value);
  Proto e = event_header(step);
  e.message(kEventSummary, summary);
  write_record(e.str());
}

void EventWriter::add_text(int64_t step, const std::string& tag, const std::string& markdown) {
  Proto plugin;
  plugin.bytes(kPluginName, std::string("text"));
  Proto metadata;
  metadata.message(kMetadataPluginData, plugin);
  Proto shape;  // no dimension: a rank-0 tensor, which the text plugin renders as Markdown (not as a table)
  Proto tensor;
  tensor.varint(kTensorDtype, kDtString).message(kTensorShape, shape).bytes(kTensorStringVal, markdown);
  Proto value;
  value.bytes(kValueTag, tag).message(kValueMetadata, metadata).message(kValueTensor, tensor);
  Proto summary;
  summary.message(kSummaryValue, value);
  Proto e = event_header(step);
  e.message(kEventSummary, summary);
  write_record(e.str());
}

}  // namespace dew::tensorboard
