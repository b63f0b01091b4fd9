// plugins/data/tokens — the "tokens" data source: fixed windows of a token file written by dew-tokenize
// (the nanoGPT layout: <path>/train.bin, <path>/val.bin, <path>/meta.json; dew/tokenizer.hpp).
//
// Options: path (the folder; required), seq_len (required), stride (default seq_len), split (train | val;
// set by the loader). The split's file is memory-mapped read-only; record i is the window of ids
// [i*stride, i*stride + seq_len + 1) as "text" i32 [seq_len + 1] (the objective reads text[:-1] as input
// and text[1:] as targets). size() = the number of whole windows, floor((N - seq_len - 1) / stride) + 1
// for a split of N tokens. Refused (usage errors naming the file): a missing folder, meta.json or split
// file; a file whose size is not meta.json's token count times the dtype's width (e.g. truncated); a
// split shorter than one window. An id >= vocab_size met while reading is a runtime error.
//
// pack = true (the loader's [data] pack, forwarded here): the windows stay the same rows of the stream
// (nothing padded, every token trained once per epoch), and each record also holds the documents the row
// cuts: "text_segment_ids" i32 [seq_len + 1] numbers the document pieces of the row 1, 2, ... and
// "text_positions" i32 [seq_len + 1] restarts at 0 with every piece. Every document ends with meta.json's
// eos_id (the document token); that token, as an input, is the next document's start token: it opens the
// next piece at position 0 (as <|endoftext|> does in GPT-2-style streams), so each document is read as
// [doc token, text...] and predicts [text..., doc token] — its first token and its end both scored, with
// no attention outside it. (A doc token at a row's first position opens piece 1; the row's first piece
// may otherwise be the tail of a document that began in an earlier row.) A record is still a pure
// function of its index, so the data position resumes as before. Refused (one usage error): a folder whose
// meta.json records no document boundaries (documents absent or 0: written before dew-tokenize marked them,
// or with --document-token none).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <dew/data.hpp>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <dew/tokenizer.hpp>
#include <filesystem>
#include <string>

namespace fs = std::filesystem;

namespace {

class TokensSource final : public dew::DataSource {
 public:
  explicit TokensSource(const dew::Options& o) {
    const std::string ctx = o.context().empty() ? "" : o.context() + ".";
    auto key = [&](const char* k) { return "'" + ctx + k + "'"; };
    DEW_USAGE_CHECK(o.has("path"), "tokens: missing required option ", key("path"),
                    " (a folder written by dew-tokenize)");
    const std::string path = o.get_string("path", "");
    DEW_USAGE_CHECK(o.has("seq_len"), "tokens: missing required option ", key("seq_len"));
    seq_len_ = o.get_int("seq_len", 0);
    DEW_USAGE_CHECK(seq_len_ > 0, "tokens: option ", key("seq_len"), " must be positive, got ", seq_len_);
    stride_ = o.get_int("stride", seq_len_);
    DEW_USAGE_CHECK(stride_ > 0, "tokens: option ", key("stride"), " must be positive, got ", stride_);
    const std::string split = o.get_string("split", "train");
    DEW_USAGE_CHECK(split == "train" || split == "val", "tokens: option ", key("split"), " must be train or val, got '",
                    split, "'");

    const dew::TokenMeta meta = dew::read_token_meta(path);
    pack_ = o.get_bool("pack", false);
    DEW_USAGE_CHECK(!pack_ || (meta.documents > 0 && meta.eos_id >= 0), "tokens: ", key("pack"), " = true needs document boundaries, and '",
                    path, "/meta.json' records none (write the folder again with dew-tokenize, which ends every document with the document token)");
    eos_ = meta.eos_id;
    vocab_ = meta.vocab_size;
    width_ = dew::token_dtype_size(meta.dtype);
    tokens_ = split == "train" ? meta.train_tokens : meta.val_tokens;
    std::error_code ec;
    fs::path dir = fs::weakly_canonical(fs::path(path), ec);
    if (ec) dir = fs::path(path);
    file_ = (dir / (split + ".bin")).string();
    identity_ = "tokens:" + file_;

    DEW_USAGE_CHECK(fs::exists(file_, ec), "tokens: '", file_, "' does not exist (", dir.string(),
                    "/meta.json does; write the folder again with dew-tokenize)");
    fd_ = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
    DEW_USAGE_CHECK(fd_ >= 0, "tokens: cannot open '", file_, "': ", std::strerror(errno));
    struct stat st {};
    DEW_CHECK(::fstat(fd_, &st) == 0, "tokens: cannot stat '", file_, "': ", std::strerror(errno));
    bytes_ = int64_t(st.st_size);
    DEW_USAGE_CHECK(bytes_ == tokens_ * width_, "tokens: '", file_, "' holds ", bytes_, " bytes, meta.json says ",
                    tokens_, " tokens of ", meta.dtype, " (", tokens_ * width_, " bytes)");
    DEW_USAGE_CHECK(tokens_ >= seq_len_ + 1, "tokens: '", file_, "' holds ", tokens_,
                    " tokens, fewer than one window of seq_len + 1 = ", seq_len_ + 1, ": ", key("seq_len"), " ",
                    seq_len_, " is too large for the ", split, " split");
    void* p = ::mmap(nullptr, size_t(bytes_), PROT_READ, MAP_SHARED, fd_, 0);
    DEW_CHECK(p != MAP_FAILED, "tokens: cannot map '", file_, "': ", std::strerror(errno));
    data_ = static_cast<const unsigned char*>(p);
    windows_ = (tokens_ - seq_len_ - 1) / stride_ + 1;
  }

  ~TokensSource() override {
    if (data_) ::munmap(const_cast<unsigned char*>(data_), size_t(bytes_));
    if (fd_ >= 0) ::close(fd_);
  }
  TokensSource(const TokensSource&) = delete;
  TokensSource& operator=(const TokensSource&) = delete;

  int64_t size() const override { return windows_; }

  dew::Record get(int64_t index) const override {
    DEW_CHECK(index >= 0 && index < windows_, "tokens: record ", index, " is outside [0, ", windows_, ")");
    const int64_t n = seq_len_ + 1;
    const int64_t start = index * stride_;
    dew::HostArray text = dew::HostArray::make(dew::DType::i32, {n});
    int32_t* out = text.as<int32_t>();
    const unsigned char* src = data_ + start * width_;
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v;
      if (width_ == 1) {
        v = src[i];
      } else if (width_ == 2) {
        v = uint32_t(src[2 * i]) | (uint32_t(src[2 * i + 1]) << 8);
      } else {
        v = uint32_t(src[4 * i]) | (uint32_t(src[4 * i + 1]) << 8) | (uint32_t(src[4 * i + 2]) << 16) |
            (uint32_t(src[4 * i + 3]) << 24);
      }
      DEW_CHECK(int64_t(v) < vocab_, "tokens: '", file_, "' holds the id ", v, " at token ", start + i,
                ", not below meta.json's vocab_size ", vocab_);
      out[i] = int32_t(v);
    }
    dew::Record r;
    if (pack_) {
      dew::HostArray seg = dew::HostArray::make(dew::DType::i32, {n});
      dew::HostArray pos = dew::HostArray::make(dew::DType::i32, {n});
      int32_t* sp = seg.as<int32_t>();
      int32_t* pp = pos.as<int32_t>();
      int32_t piece = 1, at = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (out[i] == eos_ && i > 0) ++piece, at = 0;  // the document token starts the next document
        sp[i] = piece;
        pp[i] = at++;
      }
      r.emplace("text_segment_ids", std::move(seg));
      r.emplace("text_positions", std::move(pos));
    }
    r.emplace("text", std::move(text));
    return r;
  }

  std::string identity() const override { return identity_; }

 private:
  int64_t seq_len_ = 0, stride_ = 0, vocab_ = 0, width_ = 1, tokens_ = 0, bytes_ = 0, windows_ = 0;
  bool pack_ = false;
  int32_t eos_ = -1;
  int fd_ = -1;
  const unsigned char* data_ = nullptr;
  std::string file_, identity_;
};

}  // namespace

DEW_PLUGIN("tokens", "0.1.0") {
  registrar.add<dew::DataSource>(
      {.name = "tokens",
       .description = "windows of a memory-mapped token file (dew-tokenize's train.bin/val.bin + meta.json): "
                      "text i32 [seq_len + 1] (pack: + text_segment_ids, text_positions)",
       .factory = [](const dew::Options& o) { return std::make_shared<TokensSource>(o); },
       .probe = {},
       .options = {{"path", "", "folder written by dew-tokenize (train.bin, val.bin, meta.json); required"},
                   {"seq_len", "", "tokens per window (the record holds seq_len + 1); required"},
                   {"stride", "", "distance between window starts (default seq_len)"},
                   {"split", "train", "train or val; set by the loader"},
                   {"pack", "false", "([data] pack) also emit text_segment_ids and text_positions of the "
                                     "documents each row cuts (needs meta.json's document boundaries)"}}});
}
