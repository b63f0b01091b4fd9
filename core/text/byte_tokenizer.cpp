// core/text/byte_tokenizer.cpp — the byte tokenizer: id = byte value, vocab 256, eos (the document token) 255: byte
// 0xFF never occurs in UTF-8 text; it still encodes and decodes as the byte.
#include "dew/error.hpp"
#include "text/text_internal.hpp"

namespace dew {

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  int32_t eos_id() const override { return 255; }
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
    return ids;
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out(ids.size(), '\0');
    for (size_t i = 0; i < ids.size(); ++i) {
      DEW_CHECK(ids[i] >= 0 && ids[i] < 256, "byte tokenizer: id ", ids[i], " (at ", i, ") is outside [0, 256)");
      out[i] = char(ids[i]);
    }
    return out;
  }
  std::string token_bytes(int32_t id) const override {
    DEW_CHECK(id >= 0 && id < 256, "byte tokenizer: id ", id, " is outside [0, 256)");
    return std::string(1, char(id));
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

}  // namespace dew
