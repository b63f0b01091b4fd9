// core/text/token_files.cpp — the token-file folder (train.bin, val.bin, meta.json, tokenizer.json):
// writing it from documents, reading meta.json, loading the tokenizer it names; atomic file writes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dew/error.hpp"
#include "text/text_internal.hpp"

namespace fs = std::filesystem;

namespace dew {

namespace text {

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  FILE* f = std::fopen(tmp.c_str(), "wb");
  DEW_CHECK(f != nullptr, "cannot create '", tmp, "': ", std::strerror(errno));
  const bool wrote = size == 0 || std::fwrite(data, 1, size, f) == size;
  const int saved = errno;
  const bool flushed = wrote && std::fflush(f) == 0 && ::fsync(::fileno(f)) == 0;
  const int saved2 = errno;
  std::fclose(f);
  if (!wrote || !flushed) {
    std::remove(tmp.c_str());
    DEW_CHECK(false, "cannot write '", tmp, "': ", std::strerror(wrote ? saved2 : saved));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    std::remove(tmp.c_str());
    DEW_CHECK(false, "cannot rename '", tmp, "' to '", path, "': ", std::strerror(e));
  }
}

std::string read_text_file(const std::string& path, const char* what) {
  std::error_code ec;
  DEW_USAGE_CHECK(fs::exists(path, ec), what, " '", path, "' does not exist");
  DEW_USAGE_CHECK(!fs::is_directory(path, ec), what, " '", path, "' is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  DEW_USAGE_CHECK(in.good(), what, " '", path, "' cannot be read: ", std::strerror(errno));
  std::ostringstream ss;
  ss << in.rdbuf();
  DEW_USAGE_CHECK(!in.bad(), what, " '", path, "' cannot be read");
  return ss.str();
}

}  // namespace text

std::string token_dtype_for(int64_t vocab_size) {
  DEW_USAGE_CHECK(vocab_size > 0 && vocab_size <= (int64_t(1) << 32), "vocab size ", vocab_size,
                  " is not in [1, 2^32]");
  if (vocab_size <= 256) return "uint8";
  if (vocab_size <= 65536) return "uint16";
  return "uint32";
}

int64_t token_dtype_size(const std::string& dtype) {
  if (dtype == "uint8") return 1;
  if (dtype == "uint16") return 2;
  if (dtype == "uint32") return 4;
  throw UsageError("token dtype '" + dtype + "' is not one of uint8, uint16, uint32");
}

TokenMeta read_token_meta(const std::string& dir) {
  std::error_code ec;
  DEW_USAGE_CHECK(fs::is_directory(dir, ec), "token folder '", dir,
                  "' does not exist (write one with dew-tokenize --input TEXT --out DIR)");
  const std::string path = (fs::path(dir) / "meta.json").string();
  DEW_USAGE_CHECK(fs::exists(path, ec), "'", path,
                  "' does not exist: the token folder lacks its meta.json (written by dew-tokenize)");
  const std::string content = text::read_text_file(path, "meta file");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(content);
  } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number such as 1e5003
    throw UsageError("'" + path + "' is not valid JSON: " + e.what());
  }
  DEW_USAGE_CHECK(j.is_object(), "'", path, "' is not a JSON object");
  auto integer = [&](const char* key, bool required, int64_t fallback) -> int64_t {
    if (!j.contains(key) || j[key].is_null()) {
      DEW_USAGE_CHECK(!required, "'", path, "' lacks the field \"", key, "\"");
      return fallback;
    }
    DEW_USAGE_CHECK(j[key].is_number_integer(), "'", path, "': field \"", key, "\" must be an integer, got ",
                    j[key].dump());
    return j[key].get<int64_t>();
  };
  TokenMeta m;
  m.vocab_size = integer("vocab_size", true, 0);
  m.train_tokens = integer("train_tokens", true, 0);
  m.val_tokens = integer("val_tokens", true, 0);
  m.train_bytes = integer("train_bytes", false, 0);
  m.val_bytes = integer("val_bytes", false, 0);
  const int64_t eos = integer("eos_id", false, -1);
  m.documents = integer("documents", false, 0);
  DEW_USAGE_CHECK(j.contains("dtype") && j["dtype"].is_string(), "'", path, "' lacks the string field \"dtype\"");
  m.dtype = j["dtype"].get<std::string>();
  if (j.contains("tokenizer")) {
    DEW_USAGE_CHECK(j["tokenizer"].is_string(), "'", path, "': field \"tokenizer\" must be a string");
    m.tokenizer = j["tokenizer"].get<std::string>();
  }
  DEW_USAGE_CHECK(m.dtype == "uint8" || m.dtype == "uint16" || m.dtype == "uint32", "'", path, "': dtype '", m.dtype,
                  "' is not one of uint8, uint16, uint32");
  DEW_USAGE_CHECK(m.vocab_size > 0, "'", path, "': vocab_size must be positive, got ", m.vocab_size);
  DEW_USAGE_CHECK(m.vocab_size <= (int64_t(1) << (8 * token_dtype_size(m.dtype))), "'", path, "': vocab_size ",
                  m.vocab_size, " does not fit dtype ", m.dtype);
  DEW_USAGE_CHECK(m.train_tokens >= 0 && m.val_tokens >= 0 && m.train_bytes >= 0 && m.val_bytes >= 0, "'", path,
                  "': token and byte counts must not be negative");
  DEW_USAGE_CHECK(eos >= -1 && eos < m.vocab_size, "'", path, "': eos_id ", eos, " is outside [-1, vocab_size)");
  m.eos_id = int32_t(eos);
  DEW_USAGE_CHECK(m.documents >= 0 && (m.documents == 0 || m.eos_id >= 0), "'", path, "': documents ", m.documents,
                  " needs a non-negative count and an eos_id that marks their ends");
  return m;
}

void write_token_meta(const TokenMeta& m, const std::string& dir) {
  nlohmann::ordered_json j = {{"tokenizer", m.tokenizer},   {"vocab_size", m.vocab_size},
                              {"dtype", m.dtype},           {"train_tokens", m.train_tokens},
                              {"val_tokens", m.val_tokens}, {"train_bytes", m.train_bytes},
                              {"val_bytes", m.val_bytes},   {"eos_id", m.eos_id}};
  if (m.documents > 0) j["documents"] = m.documents;
  const std::string s = j.dump(2) + "\n";
  text::write_file_atomic((fs::path(dir) / "meta.json").string(), s.data(), s.size());
}

std::unique_ptr<Tokenizer> load_tokenizer(const std::string& dir) {
  const TokenMeta m = read_token_meta(dir);
  std::unique_ptr<Tokenizer> t;
  if (m.tokenizer == "byte") {
    t = make_byte_tokenizer();
  } else if (m.tokenizer == "bpe") {
    const std::string path = (fs::path(dir) / "tokenizer.json").string();
    std::error_code ec;
    DEW_USAGE_CHECK(fs::exists(path, ec), "'", path, "' does not exist, and '", dir,
                    "/meta.json' says the tokenizer is bpe");
    t = load_hf_tokenizer_json(path);
  } else {
    throw UsageError("'" + (fs::path(dir) / "meta.json").string() + "' names the tokenizer '" + m.tokenizer +
                     "'; dew knows byte and bpe");
  }
  DEW_USAGE_CHECK(t->vocab_size() == m.vocab_size, "'", dir, "': the ", m.tokenizer, " tokenizer has ", t->vocab_size(),
                  " tokens but meta.json says vocab_size ", m.vocab_size);
  return t;
}

namespace {

// The ids as little-endian uint8/16/32.
std::vector<unsigned char> pack(const int32_t* ids, size_t n, int64_t width) {
  std::vector<unsigned char> out(n * size_t(width));
  for (size_t i = 0; i < n; ++i) {
    const auto v = uint32_t(ids[i]);
    for (int64_t b = 0; b < width; ++b) out[i * size_t(width) + size_t(b)] = static_cast<unsigned char>(v >> (8 * b));
  }
  return out;
}

}  // namespace

TokenMeta write_token_corpus(const Tokenizer& tokenizer, const std::vector<std::string>& documents,
                             const std::string& dir, double val_fraction, bool eos_between_documents) {
  return write_token_corpus(tokenizer, documents, dir, val_fraction,
                            eos_between_documents ? DocumentMarks::between : DocumentMarks::none);
}

TokenMeta write_token_corpus(const Tokenizer& tokenizer, const std::vector<std::string>& documents,
                             const std::string& dir, double val_fraction, DocumentMarks marks) {
  DEW_USAGE_CHECK(val_fraction >= 0 && val_fraction < 1, "val_fraction must be in [0, 1), got ", val_fraction);
  std::error_code ec;
  fs::create_directories(dir, ec);
  DEW_USAGE_CHECK(fs::is_directory(dir, ec), "cannot create the output folder '", dir, "'");

  const int32_t eos = tokenizer.eos_id();
  const bool marked = marks != DocumentMarks::none && eos >= 0;
  const int64_t vocab = tokenizer.vocab_size();
  std::vector<int64_t> len(static_cast<size_t>(vocab));
  for (int64_t i = 0; i < vocab; ++i) len[size_t(i)] = int64_t(tokenizer.token_bytes(int32_t(i)).size());

  // Byte counts are those of the documents' text: a document token dew puts in carries no text, and
  // what the tokenizer adds to a document (a start-of-text token, SentencePiece's leading "▁") is taken
  // off at the document's first token, so each document counts exactly its own bytes.
  std::vector<int32_t> ids;
  std::vector<std::pair<size_t, int64_t>> byte_fixes;  // (token position, bytes to add there)
  for (size_t d = 0; d < documents.size(); ++d) {
    if (marked && marks == DocumentMarks::between && d > 0) {
      byte_fixes.emplace_back(ids.size(), -len[size_t(eos)]);
      ids.push_back(eos);
    }
    const std::vector<int32_t> e = tokenizer.encode(documents[d]);
    int64_t token_bytes = 0;
    for (int32_t id : e) {
      DEW_INTERNAL_ASSERT(id >= 0 && id < vocab);
      token_bytes += len[size_t(id)];
    }
    if (!e.empty() && token_bytes != int64_t(documents[d].size()))
      byte_fixes.emplace_back(ids.size(), int64_t(documents[d].size()) - token_bytes);
    ids.insert(ids.end(), e.begin(), e.end());
    if (marked && marks == DocumentMarks::end) {
      byte_fixes.emplace_back(ids.size(), -len[size_t(eos)]);
      ids.push_back(eos);
    }
  }

  const auto total = int64_t(ids.size());
  const auto nval = int64_t(std::floor(val_fraction * double(total)));
  TokenMeta m;
  m.tokenizer = tokenizer.name();
  m.vocab_size = vocab;
  m.dtype = token_dtype_for(vocab);
  m.eos_id = eos;
  m.documents = marked ? int64_t(documents.size()) : 0;
  m.val_tokens = nval;
  m.train_tokens = total - nval;
  for (int64_t i = 0; i < total; ++i) (i < nval ? m.val_bytes : m.train_bytes) += len[size_t(ids[size_t(i)])];
  for (const auto& [p, add] : byte_fixes) (int64_t(p) < nval ? m.val_bytes : m.train_bytes) += add;
  m.val_bytes = std::max<int64_t>(m.val_bytes, 0);
  m.train_bytes = std::max<int64_t>(m.train_bytes, 0);

  const int64_t width = token_dtype_size(m.dtype);
  const fs::path out(dir);
  {
    const auto val = pack(ids.data(), size_t(nval), width);
    text::write_file_atomic((out / "val.bin").string(), val.data(), val.size());
  }
  {
    const auto train = pack(ids.data() + nval, size_t(total - nval), width);
    text::write_file_atomic((out / "train.bin").string(), train.data(), train.size());
  }
  if (tokenizer.name() == "bpe") {
    save_tokenizer_json(tokenizer, (out / "tokenizer.json").string());
  } else {
    fs::remove(out / "tokenizer.json", ec);  // a stale one from an earlier bpe run
  }
  write_token_meta(m, dir);
  return m;
}

}  // namespace dew
