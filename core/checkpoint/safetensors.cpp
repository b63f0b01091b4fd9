// core/checkpoint/safetensors.cpp — safetensors write and read (see dew/safetensors.hpp).
// Invariants: the header is padded with spaces to a multiple of 8 bytes; data offsets are relative to
// the end of the header and laid out in write order with no gaps; dtype names are safetensors' own
// (F32, F64, BF16, F16, I32, I64, U8).
#include "dew/safetensors.hpp"

#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include "dew/error.hpp"

namespace dew {

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
  }
  return "?";
}

DType from_st_dtype(const std::string& s, const std::string& file) {
  for (DType t : {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8})
    if (s == st_dtype(t)) return t;
  DEW_CHECK(false, file, ": unsupported safetensors dtype '", s, "'");
  return DType::f32;
}

std::string json_escape(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
      continue;
    }
    out += c;
  }
  return out;
}

// A minimal JSON reader for the safetensors header: objects, arrays, strings, integers.
struct JsonReader {
  const std::string& s;
  size_t i = 0;
  std::string file;
  void ws() {
    while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  }
  void expect(char c) {
    ws();
    DEW_CHECK(i < s.size() && s[i] == c, file, ": malformed safetensors header near byte ", i, " (expected '", c, "')");
    ++i;
  }
  bool peek(char c) {
    ws();
    return i < s.size() && s[i] == c;
  }
  std::string str() {
    expect('"');
    std::string out;
    while (i < s.size() && s[i] != '"') {
      if (s[i] == '\\' && i + 1 < s.size()) {
        ++i;
        if (s[i] == 'u' && i + 4 < s.size()) {
          out += char(std::stoi(s.substr(i + 1, 4), nullptr, 16));
          i += 5;
          continue;
        }
      }
      out += s[i++];
    }
    expect('"');
    return out;
  }
  int64_t integer() {
    ws();
    size_t start = i;
    while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '-')) ++i;
    DEW_CHECK(i > start, file, ": malformed safetensors header near byte ", start, " (expected a number)");
    return std::stoll(s.substr(start, i - start));
  }
  std::vector<int64_t> int_array() {
    std::vector<int64_t> out;
    expect('[');
    if (peek(']')) {
      ++i;
      return out;
    }
    do {
      out.push_back(integer());
    } while (peek(',') && ++i);
    expect(']');
    return out;
  }
};

}  // namespace

void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::ostringstream h;
  h << "{";
  bool first = true;
  if (!metadata.empty()) {
    h << "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it)
      h << (it == metadata.begin() ? "" : ",") << "\"" << json_escape(it->first) << "\":\"" << json_escape(it->second)
        << "\"";
    h << "}";
    first = false;
  }
  size_t offset = 0;
  for (const auto& [name, t] : tensors) {
    DEW_CHECK(!name.empty() && name != "__metadata__", "safetensors: bad tensor name '", name, "'");
    h << (first ? "" : ",") << "\"" << json_escape(name) << "\":{\"dtype\":\"" << st_dtype(t.dtype())
      << "\",\"shape\":[";
    for (size_t d = 0; d < t.shape().size(); ++d) h << (d ? "," : "") << t.shape()[d];
    h << "],\"data_offsets\":[" << offset << "," << offset + t.nbytes() << "]}";
    offset += t.nbytes();
    first = false;
  }
  h << "}";
  std::string header = h.str();
  while (header.size() % 8) header += ' ';
  const std::string tmp = path + ".tmp-" + std::to_string(getpid());
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
  DEW_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename '", tmp, "' to '", path, "'");
}

std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::string& path, const BackendPtr& backend,
                                                             std::map<std::string, std::string>* metadata) {
  std::ifstream f(path, std::ios::binary | std::ios::ate);
  DEW_USAGE_CHECK(f.good(), "safetensors file '", path, "' cannot be read");
  const auto size = static_cast<uint64_t>(f.tellg());
  f.seekg(0);
  DEW_CHECK(size >= 8, path, ": too short for a safetensors file");
  unsigned char len[8];
  f.read(reinterpret_cast<char*>(len), 8);
  uint64_t n = 0;
  for (int b = 0; b < 8; ++b) n |= uint64_t(len[b]) << (8 * b);
  DEW_CHECK(n <= size - 8 && n < (uint64_t(1) << 30), path, ": header length ", n, " exceeds the file (", size,
            " bytes)");
  std::string header(n, '\0');
  f.read(header.data(), std::streamsize(n));
  const uint64_t data_start = 8 + n;
  JsonReader j{header, 0, path};
  std::vector<std::pair<std::string, Tensor>> out;
  j.expect('{');
  while (!j.peek('}')) {
    const std::string name = j.str();
    j.expect(':');
    if (name == "__metadata__") {
      j.expect('{');
      while (!j.peek('}')) {
        std::string k = j.str();
        j.expect(':');
        std::string v = j.str();
        if (metadata) (*metadata)[k] = v;
        if (j.peek(',')) ++j.i;
      }
      j.expect('}');
    } else {
      j.expect('{');
      DType dtype = DType::f32;
      Shape shape;
      std::vector<int64_t> offsets;
      while (!j.peek('}')) {
        const std::string key = j.str();
        j.expect(':');
        if (key == "dtype")
          dtype = from_st_dtype(j.str(), path);
        else if (key == "shape")
          shape = j.int_array();
        else if (key == "data_offsets")
          offsets = j.int_array();
        else
          DEW_CHECK(false, path, ": unknown field '", key, "' for tensor '", name, "'");
        if (j.peek(',')) ++j.i;
      }
      j.expect('}');
      DEW_CHECK(offsets.size() == 2 && offsets[0] >= 0 && offsets[1] >= offsets[0], path, ": bad data_offsets for '",
                name, "'");
      const uint64_t bytes = uint64_t(offsets[1] - offsets[0]);
      DEW_CHECK(bytes == uint64_t(numel_of(shape)) * dtype_size(dtype), path, ": tensor '", name, "' ",
                shape_str(shape), " ", dtype_name(dtype), " does not match its ", bytes, " bytes");
      DEW_CHECK(data_start + uint64_t(offsets[1]) <= size, path, ": truncated (tensor '", name,
                "' ends past the file)");
      std::vector<unsigned char> buf(bytes);
      f.seekg(std::streamoff(data_start + uint64_t(offsets[0])));
      f.read(reinterpret_cast<char*>(buf.data()), std::streamsize(bytes));
      out.emplace_back(name, Tensor::from_host(buf.data(), shape, dtype, backend));
    }
    if (j.peek(',')) ++j.i;
  }
  j.expect('}');
  return out;
}

}  // namespace dew
