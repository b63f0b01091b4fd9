// fuzz/token_files.cpp — libFuzzer target: the text side of a token folder (core/text/): meta.json,
// a Hugging Face tokenizer.json and GPT-2 vocab.json + merges.txt, read from files as dew-run and
// dew-tokenize read them. The first byte picks the reader; the rest is the file (for vocab + merges, split
// at the first NUL). Any input must load or raise dew::Error; a loaded tokenizer must encode and decode
// a short text without crashing.
#include <cstdint>
#include <filesystem>
#include <string>

#include "dew/error.hpp"
#include "dew/tokenizer.hpp"
#include "scratch.hpp"

namespace fs = std::filesystem;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int kind = data[0] % 3;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  static const fs::path dir = fuzz::scratch_dir("token-files");
  try {
    std::unique_ptr<dew::Tokenizer> tok;
    if (kind == 0) {
      fuzz::put_file(dir / "meta.json", body);
      (void)dew::read_token_meta(dir.string());
      return 0;
    } else if (kind == 1) {
      fuzz::put_file(dir / "tokenizer.json", body);
      tok = dew::load_hf_tokenizer_json((dir / "tokenizer.json").string());
    } else {
      const auto nul = body.find('\0');
      fuzz::put_file(dir / "vocab.json", body.substr(0, nul));
      fuzz::put_file(dir / "merges.txt", nul == std::string::npos ? std::string() : body.substr(nul + 1));
      tok = dew::load_gpt2_vocab((dir / "vocab.json").string(), (dir / "merges.txt").string());
    }
    if (tok) {
      const auto ids = tok->encode("Hello, w\xc3\xb6rld! 123");
      (void)tok->decode(ids);
    }
  } catch (const dew::Error&) {
  }
  return 0;
}
