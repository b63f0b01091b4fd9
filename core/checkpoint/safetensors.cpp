// core/checkpoint/safetensors.cpp — safetensors write and read (see dew/safetensors.hpp).
// Invariants: the header is padded with spaces to a multiple of 8 bytes; data offsets are relative to
// the end of the header and laid out in write order with no gaps; dtype names are safetensors' own.
// Reading memory-maps the file read-only (MAP_PRIVATE) and validates every entry before any tensor is
// handed out: offsets inside the data region, no overlap, bytes == numel x element size.
#include "dew/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"

namespace dew {

namespace fs = std::filesystem;

namespace {

const char* st_dtype(DType t) {
  switch (t) {
    case DType::f32:
      return "F32";
    case DType::f64:
      return "F64";
    case DType::bf16:
      return "BF16";
    case DType::f16:
      return "F16";
    case DType::i32:
      return "I32";
    case DType::i64:
      return "I64";
    case DType::u8:
      return "U8";
    case DType::i8:
      return "I8";
  }
  return "?";
}

struct StType {
  const char* name;
  size_t size;
  DType load;
  bool floating;
};

const StType kTypes[] = {
    {"F32", 4, DType::f32, true},  {"F64", 8, DType::f64, true},     {"BF16", 2, DType::bf16, true},
    {"F16", 2, DType::f16, true},  {"F8_E4M3", 1, DType::f32, true}, {"F8_E5M2", 1, DType::f32, true},
    {"I64", 8, DType::i64, false}, {"I32", 4, DType::i32, false},    {"I16", 2, DType::i32, false},
    {"I8", 1, DType::i32, false},  {"U64", 8, DType::i64, false},    {"U32", 4, DType::i64, false},
    {"U16", 2, DType::i32, false}, {"U8", 1, DType::u8, false},      {"BOOL", 1, DType::u8, false},
};

const StType* find_type(const std::string& s) {
  for (const StType& t : kTypes)
    if (s == t.name) return &t;
  return nullptr;
}

const StType& type_of(const std::string& s, const std::string& file) {
  const StType* t = find_type(s);
  if (!t) {
    std::string known;
    for (const StType& k : kTypes) known += std::string(known.empty() ? "" : ", ") + k.name;
    DEW_USAGE_CHECK(false, file, ": unsupported safetensors dtype '", s, "' (known: ", known, ")");
  }
  return *t;
}

// FP8 E4M3 "fn" (no infinities; 0x7f / 0xff are NaN) and E5M2 (the top byte of an IEEE half).
double f8_e4m3(uint8_t b) {
  const int s = b >> 7, e = (b >> 3) & 15, m = b & 7;
  double v;
  if (e == 15 && m == 7)
    v = std::numeric_limits<double>::quiet_NaN();
  else if (e == 0)
    v = std::ldexp(double(m) / 8.0, -6);
  else
    v = std::ldexp(1.0 + double(m) / 8.0, e - 7);
  return s ? -v : v;
}
double f8_e5m2(uint8_t b) { return double(f16_to_f32(f16_t{uint16_t(uint16_t(b) << 8)})); }

double float_at(const unsigned char* p, const std::string& t, int64_t i) {
  if (t == "F32") {
    float v;
    std::memcpy(&v, p + 4 * i, 4);
    return v;
  }
  if (t == "F64") {
    double v;
    std::memcpy(&v, p + 8 * i, 8);
    return v;
  }
  uint16_t h;
  if (t == "BF16" || t == "F16") std::memcpy(&h, p + 2 * i, 2);
  if (t == "BF16") return bf16_to_f32(bf16_t{h});
  if (t == "F16") return f16_to_f32(f16_t{h});
  if (t == "F8_E4M3") return f8_e4m3(p[i]);
  return f8_e5m2(p[i]);
}

// Integer element i; `ok` is cleared for a U64 that does not fit in int64.
int64_t int_at(const unsigned char* p, const std::string& t, int64_t i, bool& ok) {
  auto rd = [&](auto v) {
    std::memcpy(&v, p + sizeof(v) * size_t(i), sizeof(v));
    return v;
  };
  if (t == "I64") return rd(int64_t{});
  if (t == "I32") return rd(int32_t{});
  if (t == "I16") return rd(int16_t{});
  if (t == "I8") return rd(int8_t{});
  if (t == "U32") return rd(uint32_t{});
  if (t == "U16") return rd(uint16_t{});
  if (t == "U8" || t == "BOOL") return p[i];
  const uint64_t v = rd(uint64_t{});
  if (v > uint64_t(std::numeric_limits<int64_t>::max())) ok = false;
  return int64_t(v);
}

// Converts n stored elements to `to` into out (bytes).
void convert(const unsigned char* src, const StType& from, int64_t n, DType to, std::vector<unsigned char>& out,
             const std::string& what) {
  out.resize(size_t(n) * dtype_size(to));
  unsigned char* o = out.data();
  if (from.floating) {
    DEW_USAGE_CHECK(is_floating(to), what, ": a ", from.name, " tensor cannot be loaded as ", dtype_name(to));
    for (int64_t i = 0; i < n; ++i) {
      const double v = float_at(src, from.name, i);
      switch (to) {
        case DType::f64:
          std::memcpy(o + 8 * i, &v, 8);
          break;
        case DType::f32: {
          const float f = float(v);
          std::memcpy(o + 4 * i, &f, 4);
          break;
        }
        case DType::bf16: {
          const bf16_t h = f32_to_bf16(float(v));
          std::memcpy(o + 2 * i, &h, 2);
          break;
        }
        default: {
          const f16_t h = f32_to_f16(float(v));
          std::memcpy(o + 2 * i, &h, 2);
        }
      }
    }
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    bool ok = true;
    const int64_t v = int_at(src, from.name, i, ok);
    DEW_USAGE_CHECK(ok, what, ": element ", i, " does not fit in int64");
    switch (to) {
      case DType::i64:
        std::memcpy(o + 8 * i, &v, 8);
        break;
      case DType::i32: {
        DEW_USAGE_CHECK(v >= INT32_MIN && v <= INT32_MAX, what, ": element ", i, " = ", v, " does not fit in i32");
        const int32_t w = int32_t(v);
        std::memcpy(o + 4 * i, &w, 4);
        break;
      }
      case DType::u8:
        DEW_USAGE_CHECK(v >= 0 && v <= 255, what, ": element ", i, " = ", v, " does not fit in u8");
        o[i] = uint8_t(v);
        break;
      case DType::i8:
        DEW_USAGE_CHECK(v >= -128 && v <= 127, what, ": element ", i, " = ", v, " does not fit in i8");
        o[i] = uint8_t(int8_t(v));
        break;
      case DType::f64: {
        const double d = double(v);
        std::memcpy(o + 8 * i, &d, 8);
        break;
      }
      case DType::f32: {
        const float f = float(v);
        std::memcpy(o + 4 * i, &f, 4);
        break;
      }
      case DType::bf16: {
        const bf16_t h = f32_to_bf16(float(v));
        std::memcpy(o + 2 * i, &h, 2);
        break;
      }
      case DType::f16: {
        const f16_t h = f32_to_f16(float(v));
        std::memcpy(o + 2 * i, &h, 2);
        break;
      }
    }
  }
}

std::string tmp_name(const std::string& path) { return path + ".tmp-" + std::to_string(getpid()); }

void publish(const std::string& tmp, const std::string& path) {
  DEW_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path,
            "': ", std::strerror(errno));
}

}  // namespace

DType safetensors_load_dtype(const std::string& s) { return type_of(s, "safetensors").load; }
size_t safetensors_dtype_size(const std::string& s) { return type_of(s, "safetensors").size; }

uint64_t parse_byte_size(const std::string& text, const std::string& what) {
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  DEW_USAGE_CHECK(i > 0, what, ": '", text, "' is not a size (e.g. 5GB, 500MB, 2GiB, 1000000)");
  const double v = std::atof(text.substr(0, i).c_str());
  std::string unit = text.substr(i);
  for (char& c : unit) c = char(std::toupper(static_cast<unsigned char>(c)));
  double m = 0;
  if (unit.empty() || unit == "B") m = 1;
  if (unit == "KB") m = 1e3;
  if (unit == "MB") m = 1e6;
  if (unit == "GB") m = 1e9;
  if (unit == "KIB") m = 1024.0;
  if (unit == "MIB") m = 1024.0 * 1024;
  if (unit == "GIB") m = 1024.0 * 1024 * 1024;
  DEW_USAGE_CHECK(m > 0, what, ": unknown unit '", text.substr(i), "' in '", text, "' (B, KB, MB, GB, KiB, MiB, GiB)");
  return uint64_t(v * m);
}

// ---------------------------------------------------------------- writing

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = m;
  }
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    DEW_CHECK(!name.empty() && name != "__metadata__", "safetensors: bad tensor name '", name, "'");
    DEW_CHECK(!h.contains(name), "safetensors: tensor name '", name, "' appears twice");
    DEW_CHECK(!t.quantized(), "safetensors: '", name, "' is a quantized decode weight (int8 with scales); export the "
              "weights as trained");
    h[name] = {{"dtype", st_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  std::string header = h.dump();
  while (header.size() % 8) header += ' ';
  const std::string tmp = tmp_name(path);
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    DEW_CHECK(f.good(), "cannot write '", tmp, "'");
    const uint64_t n = header.size();
    unsigned char len[8];
    for (int b = 0; b < 8; ++b) len[b] = static_cast<unsigned char>(n >> (8 * b));
    f.write(reinterpret_cast<const char*>(len), 8);
    f.write(header.data(), std::streamsize(header.size()));
    std::vector<unsigned char> buf;
    for (const auto& [name, t] : tensors) {
      buf.resize(t.nbytes());
      t.copy_to_host(buf.data());
      f.write(reinterpret_cast<const char*>(buf.data()), std::streamsize(buf.size()));
    }
    f.flush();
    DEW_CHECK(f.good(), "writing '", tmp, "' failed (disk full?)");
  }
  publish(tmp, path);
}

std::vector<std::string> write_safetensors_sharded(const std::string& dir,
                                                   const std::vector<std::pair<std::string, Tensor>>& tensors,
                                                   uint64_t max_shard_bytes,
                                                   const std::map<std::string, std::string>& metadata,
                                                   std::optional<DType> dtype, const std::string& stem) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, Tensor>> conv;
  {
    NoGradGuard no_grad;
    for (const auto& [n, t] : tensors)
      conv.emplace_back(n, dtype && is_floating(t.dtype()) && t.dtype() != *dtype ? cast(t.detach(), *dtype) : t);
  }
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < conv.size(); ++i) {
    const uint64_t b = conv[i].second.nbytes();
    if (max_shard_bytes > 0 && !shards.back().empty() && in_shard + b > max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  const fs::path d(dir);
  std::vector<std::string> written;
  // A stale index next to a fresh single file (or the reverse) would be read instead of it: remove it.
  const fs::path index_path = d / (stem + ".safetensors.index.json");
  if (shards.size() == 1) {
    std::error_code ec;
    fs::remove(index_path, ec);
    const std::string p = (d / (stem + ".safetensors")).string();
    write_safetensors(p, conv, metadata);
    written.push_back(p);
    return written;
  }
  nlohmann::ordered_json wm = nlohmann::ordered_json::object();
  const size_t n = shards.size();
  for (size_t s = 0; s < n; ++s) {
    char name[64];
    std::snprintf(name, sizeof name, "-%05zu-of-%05zu.safetensors", s + 1, n);
    const std::string file = stem + name;
    std::vector<std::pair<std::string, Tensor>> part;
    for (size_t i : shards[s]) {
      part.push_back(conv[i]);
      wm[conv[i].first] = file;
    }
    write_safetensors((d / file).string(), part, metadata);
    written.push_back((d / file).string());
  }
  nlohmann::ordered_json idx;
  idx["metadata"] = {{"total_size", total}};
  for (const auto& [k, v] : metadata) idx["metadata"][k] = v;
  idx["weight_map"] = wm;
  const std::string tmp = tmp_name(index_path.string());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << idx.dump(2) << "\n";
    f.flush();
    DEW_CHECK(f.good(), "writing '", tmp, "' failed (disk full?)");
  }
  publish(tmp, index_path.string());
  written.push_back(index_path.string());
  return written;
}

// ---------------------------------------------------------------- reading

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  DEW_USAGE_CHECK(fd >= 0, "safetensors file '", path, "' cannot be read: ", std::strerror(errno));
  struct stat st {};
  const int rc = ::fstat(fd, &st);
  if (rc != 0 || st.st_size < 8) {
    ::close(fd);
    DEW_USAGE_CHECK(false, path, ": too short for a safetensors file (", rc == 0 ? int64_t(st.st_size) : -1, " bytes)");
  }
  size_ = size_t(st.st_size);
  void* m = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  DEW_CHECK(m != MAP_FAILED, path, ": mmap failed: ", std::strerror(errno));
  map_ = static_cast<const unsigned char*>(m);
  try {
    uint64_t n = 0;
    for (int b = 0; b < 8; ++b) n |= uint64_t(map_[b]) << (8 * b);
    DEW_USAGE_CHECK(n <= size_ - 8 && n < (uint64_t(1) << 30), path, ": header length ", n, " exceeds the file (",
                    size_, " bytes): not a safetensors file, or truncated");
    data_start_ = 8 + n;
    nlohmann::ordered_json h;
    try {
      h = nlohmann::ordered_json::parse(map_ + 8, map_ + 8 + n);
    } catch (const nlohmann::json::exception& e) {
      DEW_USAGE_CHECK(false, path, ": malformed safetensors header: ", e.what());
    }
    DEW_USAGE_CHECK(h.is_object(), path, ": the safetensors header is not a JSON object");
    const uint64_t data_size = size_ - data_start_;
    for (const auto& [name, v] : h.items()) {
      if (name == "__metadata__") {
        DEW_USAGE_CHECK(v.is_object(), path, ": __metadata__ is not an object");
        for (const auto& [k, s] : v.items()) metadata_[k] = s.is_string() ? s.get<std::string>() : s.dump();
        continue;
      }
      try {
        DEW_USAGE_CHECK(v.is_object(), path, ": entry '", name, "' is not an object");
        for (const auto& [k, unused] : v.items())
          DEW_USAGE_CHECK(k == "dtype" || k == "shape" || k == "data_offsets", path, ": unknown field '", k,
                          "' for tensor '", name, "'");
        SafetensorsEntry e;
        e.name = name;
        e.dtype = v.at("dtype").get<std::string>();
        e.shape = v.at("shape").get<Shape>();
        const auto off = v.at("data_offsets").get<std::vector<uint64_t>>();
        DEW_USAGE_CHECK(off.size() == 2 && off[1] >= off[0], path, ": bad data_offsets for '", name, "'");
        e.begin = off[0];
        e.end = off[1];
        const StType& t = type_of(e.dtype, path);
        for (int64_t s : e.shape) DEW_USAGE_CHECK(s >= 0, path, ": tensor '", name, "' has a negative dimension");
        DEW_USAGE_CHECK(e.end - e.begin == uint64_t(numel_of(e.shape)) * t.size, path, ": tensor '", name, "' ",
                        shape_str(e.shape), " ", e.dtype, " does not match its ", e.end - e.begin, " bytes");
        DEW_USAGE_CHECK(e.end <= data_size, path, ": truncated (tensor '", name, "' ends at byte ", e.end, " of a ",
                        data_size, "-byte data section)");
        index_[name] = entries_.size();
        entries_.push_back(std::move(e));
      } catch (const nlohmann::json::exception& ex) {
        DEW_USAGE_CHECK(false, path, ": malformed entry '", name, "': ", ex.what());
      }
    }
    std::vector<const SafetensorsEntry*> by_offset;
    for (const auto& e : entries_) by_offset.push_back(&e);
    std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
    for (size_t i = 1; i < by_offset.size(); ++i)
      DEW_USAGE_CHECK(by_offset[i]->begin >= by_offset[i - 1]->end || by_offset[i]->begin == by_offset[i]->end, path,
                      ": tensors '", by_offset[i - 1]->name, "' and '", by_offset[i]->name, "' overlap");
  } catch (...) {
    ::munmap(const_cast<unsigned char*>(map_), size_);
    throw;
  }
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), size_);
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const unsigned char* SafetensorsFile::data(const SafetensorsEntry& e) const { return map_ + data_start_ + e.begin; }

Tensor SafetensorsFile::load(const std::string& name, const BackendPtr& backend, std::optional<DType> as) const {
  const SafetensorsEntry* e = find(name);
  DEW_USAGE_CHECK(e != nullptr, path_, ": no tensor '", name, "'");
  const StType& t = type_of(e->dtype, path_);
  const DType to = as.value_or(t.load);
  if (to == t.load && std::string(st_dtype(to)) == e->dtype) return Tensor::from_host(data(*e), e->shape, to, backend);
  std::vector<unsigned char> buf;
  convert(data(*e), t, numel_of(e->shape), to, buf, path_ + ": tensor '" + name + "'");
  return Tensor::from_host(buf.data(), e->shape, to, backend);
}

std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::string& path, const BackendPtr& backend,
                                                             std::map<std::string, std::string>* metadata) {
  SafetensorsFile f(path);
  if (metadata)
    for (const auto& [k, v] : f.metadata()) (*metadata)[k] = v;
  std::vector<std::pair<std::string, Tensor>> out;
  for (const auto& e : f.entries()) out.emplace_back(e.name, f.load(e.name, backend));
  return out;
}

SafetensorsCheckpoint::SafetensorsCheckpoint(const std::string& path) {
  fs::path p(path);
  std::error_code ec;
  DEW_USAGE_CHECK(fs::exists(p, ec), "safetensors checkpoint '", path, "' does not exist");
  fs::path index;
  std::vector<fs::path> files;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors.index.json", ec))
      index = p / "model.safetensors.index.json";
    else if (fs::exists(p / "model.safetensors", ec))
      files.push_back(p / "model.safetensors");
    else
      DEW_USAGE_CHECK(false, "'", path, "' holds neither model.safetensors nor model.safetensors.index.json");
  } else if (p.string().size() > 5 && p.string().substr(p.string().size() - 5) == ".json") {
    index = p;
  } else {
    files.push_back(p);
  }
  std::map<std::string, std::string> expected;  // index: name -> shard file
  if (!index.empty()) {
    nlohmann::json j;
    try {
      std::ifstream in(index);
      DEW_USAGE_CHECK(in.good(), "cannot read '", index.string(), "'");
      j = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& e) {
      DEW_USAGE_CHECK(false, index.string(), ": malformed JSON: ", e.what());
    }
    DEW_USAGE_CHECK(j.is_object() && j.contains("weight_map") && j["weight_map"].is_object(), index.string(),
                    ": no \"weight_map\" object");
    std::vector<std::string> shard_names;
    for (const auto& [name, file] : j["weight_map"].items()) {
      DEW_USAGE_CHECK(file.is_string(), index.string(), ": weight_map[\"", name, "\"] is not a file name");
      const std::string f = file.get<std::string>();
      // A shard is a file of the index's own folder (as Hugging Face writes them): a path that climbs out
      // ("../x"), an absolute one or a subfolder would read files the model does not own.
      DEW_USAGE_CHECK(!f.empty() && f != "." && f != ".." && f.find('/') == std::string::npos &&
                          f.find('\\') == std::string::npos && f.find('\0') == std::string::npos,
                      index.string(), ": weight_map[\"", name, "\"] names shard '", f,
                      "', which is not a file name in the index's folder");
      expected[name] = f;
      if (std::find(shard_names.begin(), shard_names.end(), f) == shard_names.end()) shard_names.push_back(f);
    }
    std::sort(shard_names.begin(), shard_names.end());
    for (const auto& s : shard_names) {
      DEW_USAGE_CHECK(fs::exists(index.parent_path() / s, ec), index.string(), " names shard '", s,
                      "', which does not exist");
      files.push_back(index.parent_path() / s);
    }
  }
  for (const auto& f : files) {
    shards_.push_back(std::make_unique<SafetensorsFile>(f.string()));
    const size_t s = shards_.size() - 1;
    for (const auto& e : shards_[s]->entries()) {
      auto it = where_.find(e.name);
      DEW_USAGE_CHECK(it == where_.end(), "tensor '", e.name, "' is in two shards: ", shards_[it->second]->path(),
                      " and ", f.string());
      if (!expected.empty()) {
        auto x = expected.find(e.name);
        DEW_USAGE_CHECK(x != expected.end(), f.string(), " holds '", e.name, "', which ", index.string(),
                        " does not list");
        DEW_USAGE_CHECK(x->second == f.filename().string(), index.string(), " puts '", e.name, "' in ", x->second,
                        " but it is in ", f.filename().string());
      }
      where_[e.name] = s;
      order_.push_back(e.name);
    }
  }
  for (const auto& [name, file] : expected)
    DEW_USAGE_CHECK(where_.count(name), index.string(), " lists '", name, "' in ", file, ", which does not hold it");
  if (!shards_.empty()) metadata_ = shards_.front()->metadata();
}

std::vector<std::string> SafetensorsCheckpoint::names() const { return order_; }

const SafetensorsEntry& SafetensorsCheckpoint::entry(const std::string& name) const {
  auto it = where_.find(name);
  DEW_USAGE_CHECK(it != where_.end(), "the safetensors checkpoint (", shards_.empty() ? "" : shards_[0]->path(),
                  "...) has no tensor '", name, "'");
  return *shards_[it->second]->find(name);
}

Tensor SafetensorsCheckpoint::load(const std::string& name, const BackendPtr& backend, std::optional<DType> as) const {
  entry(name);  // the error when absent
  return shards_[where_.at(name)]->load(name, backend, as);
}

std::vector<std::string> SafetensorsCheckpoint::files() const {
  std::vector<std::string> out;
  for (const auto& s : shards_) out.push_back(s->path());
  return out;
}

}  // namespace dew
