// tools/dew-tokenize/main.cpp — text files -> token files for the `tokens` data source.
//
//   dew-tokenize --input FILE_OR_DIR [--input ...] --out DIR [--tokenizer byte|bpe] [--vocab-size N]
//                [--tokenizer-json F | --vocab V --merges M] [--val-fraction 0.05]
//                [--separator LINE] [--text-field text] [--document-token end|between|none]
//   dew-tokenize render-chat --tokenizer-config F --input conversations.jsonl --out rendered.jsonl
//                [--add-generation-prompt] [--spans]          (render_chat.cpp)
//
// A folder input contributes every regular file in it (not symlinks, not subfolders), sorted by name;
// files that are not UTF-8 text (invalid UTF-8 or a NUL byte, e.g. fortune's *.dat) are skipped with a
// note. A file named directly must be UTF-8 text. Documents: every file is one, except that a file whose
// name ends in .jsonl holds one per line (the string field --text-field of the JSON object on the line;
// blank lines skipped), and that with --separator LINE a line that is exactly LINE (e.g. "%", the fortune
// files' separator) ends a document (the separator lines are dropped; empty documents are skipped).
// Document boundaries are recorded in the stream: every document ends with the tokenizer's document token
// (its eos; the byte tokenizer's is 255) and meta.json counts them (--document-token between only separates
// them, --eos-between-files is that; none concatenates them plainly and records no boundaries).
// --tokenizer bpe trains a BPE of --vocab-size tokens on all the inputs, unless --tokenizer-json or
// --vocab/--merges name an existing one (then bpe is implied). Writes DIR/train.bin, DIR/val.bin (the
// first --val-fraction of the tokens), DIR/meta.json and, for bpe, DIR/tokenizer.json, each atomically
// (dew/tokenizer.hpp, write_token_corpus). Exit status: 0 done, 2 usage error, 1 runtime error.
#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "dew/error.hpp"
#include "dew/tokenizer.hpp"

namespace po = boost::program_options;

int render_chat_main(const std::string& config_path, const std::string& input, const std::string& out,
                     bool add_generation_prompt, bool spans);  // render_chat.cpp
int show_chat_template(const std::string& config_path);        // render_chat.cpp
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage: dew-tokenize --input FILE_OR_DIR [--input ...] --out DIR [--force] [--tokenizer byte|bpe] [--vocab-size N]\n"
    "                    [--tokenizer-json F | --vocab V --merges M] [--val-fraction 0.05]\n"
    "                    [--separator LINE] [--text-field text] [--document-token end|between|none]\n"
    "       dew-tokenize render-chat --tokenizer-config F --input conversations.jsonl --out rendered.jsonl\n"
    "                    [--add-generation-prompt] [--spans]\n";

std::string read_file(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  DEW_USAGE_CHECK(in.good(), "cannot read '", p.string(), "'");
  std::ostringstream ss;
  ss << in.rdbuf();
  DEW_USAGE_CHECK(!in.bad(), "cannot read '", p.string(), "'");
  return ss.str();
}

bool is_text(const std::string& s) { return s.find('\0') == std::string::npos && dew::is_valid_utf8(s); }

// The documents of one file's text (see the top comment); `name` is for errors.
std::vector<std::string> split_documents(const std::string& text, const std::string& name,
                                         const std::string& separator, const std::string& text_field) {
  std::vector<std::string> docs;
  const bool jsonl = name.size() >= 6 && name.compare(name.size() - 6, 6, ".jsonl") == 0;
  if (!jsonl && separator.empty()) {
    docs.push_back(text);
    return docs;
  }
  std::string cur;
  size_t at = 0;
  int64_t line_no = 0;
  while (at < text.size()) {
    size_t nl = text.find('\n', at);
    const size_t end = nl == std::string::npos ? text.size() : nl + 1;
    const std::string line = text.substr(at, end - at);
    at = end;
    ++line_no;
    std::string bare = line;
    while (!bare.empty() && (bare.back() == '\n' || bare.back() == '\r')) bare.pop_back();
    if (jsonl) {
      if (bare.find_first_not_of(" \t") == std::string::npos) continue;
      nlohmann::json j;
      try {
        j = nlohmann::json::parse(bare);
      } catch (const nlohmann::json::exception& e) {  // parse_error, and out_of_range for a number such as 1e5003
        throw dew::UsageError("'" + name + "' line " + std::to_string(line_no) + " is not JSON: " + e.what());
      }
      DEW_USAGE_CHECK(j.is_object() && j.contains(text_field) && j[text_field].is_string(), "'", name, "' line ",
                      line_no, " has no string field \"", text_field, "\" (--text-field)");
      std::string doc = j[text_field].get<std::string>();
      DEW_USAGE_CHECK(dew::is_valid_utf8(doc) && doc.find('\0') == std::string::npos, "'", name, "' line ", line_no,
                      ": the \"", text_field, "\" field is not UTF-8 text");
      if (!doc.empty()) docs.push_back(std::move(doc));
    } else if (bare == separator) {
      if (!cur.empty()) docs.push_back(std::move(cur));
      cur.clear();
    } else {
      cur += line;
    }
  }
  if (!cur.empty()) docs.push_back(std::move(cur));
  return docs;
}

int run_render_chat(int argc, char** argv) {
  std::string config, input, out;
  po::options_description d("render-chat options");
  d.add_options()("help,h", "show this help")("tokenizer-config", po::value(&config),
                                              "tokenizer_config.json (chat_template + special tokens) or a folder")(
      "input", po::value(&input), "conversations, one JSON object with \"messages\" per line")(
      "out", po::value(&out), "rendered.jsonl: one {\"text\": ...} per conversation")(
      "add-generation-prompt", "end each rendering with the assistant's turn opening")(
      "spans", "also write assistant_spans (byte ranges of the assistant turns)")(
      "show-template", "print the template --tokenizer-config resolves to, and exit");
  po::variables_map vm;
  po::store(po::command_line_parser(argc - 1, argv + 1).options(d).positional({}).run(), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << kUsage << d;
    return 0;
  }
  if (vm.count("show-template")) return show_chat_template(config);
  DEW_USAGE_CHECK(!(vm.count("spans") && vm.count("add-generation-prompt")),
                  "render-chat: --spans renders whole conversations; it takes no --add-generation-prompt");
  return render_chat_main(config, input, out, vm.count("add-generation-prompt") > 0, vm.count("spans") > 0);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

int run(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "render-chat") return run_render_chat(argc, argv);
  std::vector<std::string> inputs;
  std::string out, tokenizer_name, tokenizer_json, vocab, merges, separator, text_field = "text",
      document_token = "end";
  int64_t vocab_size = 4096;
  double val_fraction = 0.05;
  po::options_description d("options");
  d.add_options()("help,h", "show this help")("input", po::value(&inputs)->composing(),
                                              "a text file, or a folder of them (repeatable)")(
      "out", po::value(&out), "output folder")("tokenizer", po::value(&tokenizer_name), "byte (default) or bpe")(
      "vocab-size", po::value(&vocab_size), "BPE vocabulary to train, eos included (default 4096)")(
      "tokenizer-json", po::value(&tokenizer_json), "a Hugging Face tokenizer.json (byte-level BPE)")(
      "vocab", po::value(&vocab), "GPT-2 vocab.json (with --merges)")("merges", po::value(&merges),
                                                                      "GPT-2 merges.txt (with --vocab)")(
      "val-fraction", po::value(&val_fraction), "share of the tokens, from the head, for val.bin (default 0.05)")(
      "separator", po::value(&separator), "a line that ends a document (e.g. %, as in the fortune files)")(
      "text-field", po::value(&text_field), "the field of a .jsonl line that holds its document (default text)")(
      "document-token", po::value(&document_token),
      "end (default): every document ends with the tokenizer's document token; between; none")(
      "eos-between-files", "the same as --document-token between")(
      "force", "replace an existing --out folder's token files (refused otherwise)");
  po::variables_map vm;
  po::store(po::command_line_parser(argc, argv).options(d).positional({}).run(), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << kUsage << d;
    return 0;
  }
  DEW_USAGE_CHECK(!inputs.empty(), "--input is required");
  DEW_USAGE_CHECK(!out.empty(), "--out is required");
  {
    std::error_code ec;
    const bool exists = fs::exists(out, ec);
    DEW_USAGE_CHECK(!exists || fs::is_directory(out, ec), "--out '", out, "' exists and is not a folder");
    const bool holds = exists && !fs::is_empty(out, ec);
    DEW_USAGE_CHECK(!holds || vm.count("force"), "--out '", out,
                    "' already exists and is not empty; pass --force to replace its token files, or choose another folder");
  }
  DEW_USAGE_CHECK(val_fraction >= 0 && val_fraction < 1, "--val-fraction must be in [0, 1), got ", val_fraction);
  DEW_USAGE_CHECK(document_token == "end" || document_token == "between" || document_token == "none",
                  "--document-token must be end, between or none, got '", document_token, "'");
  DEW_USAGE_CHECK(!vm.count("eos-between-files") || !vm.count("document-token") || document_token == "between",
                  "--eos-between-files is --document-token between; it contradicts --document-token ", document_token);
  if (vm.count("eos-between-files")) document_token = "between";
  DEW_USAGE_CHECK(!vm.count("separator") || !separator.empty(), "--separator must not be empty");
  const bool from_file = !tokenizer_json.empty() || !vocab.empty() || !merges.empty();
  DEW_USAGE_CHECK(vocab.empty() == merges.empty(), "--vocab and --merges go together");
  DEW_USAGE_CHECK(tokenizer_json.empty() || vocab.empty(), "give --tokenizer-json or --vocab/--merges, not both");
  if (tokenizer_name.empty()) tokenizer_name = from_file ? "bpe" : "byte";
  DEW_USAGE_CHECK(tokenizer_name == "byte" || tokenizer_name == "bpe", "--tokenizer must be byte or bpe, got '",
                  tokenizer_name, "'");
  DEW_USAGE_CHECK(!(tokenizer_name == "byte" && from_file),
                  "--tokenizer byte takes no --tokenizer-json / --vocab / --merges");
  DEW_USAGE_CHECK(!vm.count("vocab-size") || (tokenizer_name == "bpe" && !from_file),
                  "--vocab-size is for training a BPE (--tokenizer bpe without a tokenizer file)");

  // ---- the documents ----
  std::vector<std::string> documents;
  int64_t skipped = 0, total_bytes = 0, files = 0;
  auto add_file = [&](const std::string& text, const std::string& name) {
    ++files;
    for (std::string& doc : split_documents(text, name, separator, text_field)) {
      total_bytes += int64_t(doc.size());
      documents.push_back(std::move(doc));
    }
  };
  for (const std::string& in : inputs) {
    std::error_code ec;
    DEW_USAGE_CHECK(fs::exists(in, ec), "--input '", in, "' does not exist");
    if (fs::is_directory(in, ec)) {
      std::vector<fs::path> files;
      for (const fs::directory_entry& e : fs::directory_iterator(in))
        if (e.symlink_status().type() == fs::file_type::regular) files.push_back(e.path());
      std::sort(files.begin(), files.end());
      for (const fs::path& f : files) {
        std::string s = read_file(f);
        if (!is_text(s)) {
          std::cerr << "dew-tokenize: skipping '" << f.string() << "' (not UTF-8 text)\n";
          ++skipped;
          continue;
        }
        add_file(s, f.string());
      }
    } else {
      std::string s = read_file(in);
      DEW_USAGE_CHECK(is_text(s), "--input '", in, "' is not UTF-8 text (invalid UTF-8 or a NUL byte)");
      add_file(s, in);
    }
  }
  DEW_USAGE_CHECK(!documents.empty(), "no documents in the inputs (no text files, or only empty ones)");

  // ---- the tokenizer ----
  const auto t0 = std::chrono::steady_clock::now();
  std::unique_ptr<dew::Tokenizer> tok;
  if (tokenizer_name == "byte") {
    tok = dew::make_byte_tokenizer();
  } else if (!tokenizer_json.empty()) {
    tok = dew::load_hf_tokenizer_json(tokenizer_json);
  } else if (!vocab.empty()) {
    tok = dew::load_gpt2_vocab(vocab, merges);
  } else {
    tok = dew::train_bpe(documents, vocab_size);
    std::printf("dew-tokenize: trained a BPE of %lld tokens on %.2f MB in %.2f s\n",
                static_cast<long long>(tok->vocab_size()), double(total_bytes) / 1e6, seconds_since(t0));
  }
  if (document_token != "none" && tok->eos_id() < 0)
    std::cerr << "dew-tokenize: the " << tok->name()
              << " tokenizer has no document (eos) token; documents are concatenated and no boundaries recorded\n";

  // ---- encode and write ----
  const auto t1 = std::chrono::steady_clock::now();
  const dew::TokenMeta m =
      dew::write_token_corpus(*tok, documents, out, val_fraction,
                              document_token == "end"       ? dew::DocumentMarks::end
                              : document_token == "between" ? dew::DocumentMarks::between
                                                            : dew::DocumentMarks::none);
  std::printf(
      "dew-tokenize: %lld file(s) (%lld skipped), %zu document(s) (%lld marked), %lld bytes -> train %lld tokens "
      "(%lld bytes), val %lld tokens (%lld bytes); tokenizer %s, vocab %lld, %s, eos %d; encoded in %.2f s; "
      "wrote %s\n",
      static_cast<long long>(files), static_cast<long long>(skipped), documents.size(),
      static_cast<long long>(m.documents), static_cast<long long>(total_bytes),
      static_cast<long long>(m.train_tokens), static_cast<long long>(m.train_bytes),
      static_cast<long long>(m.val_tokens), static_cast<long long>(m.val_bytes), m.tokenizer.c_str(),
      static_cast<long long>(m.vocab_size), m.dtype.c_str(), m.eos_id, seconds_since(t1), out.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const po::error& e) {
    std::cerr << "dew-tokenize: " << e.what() << "\n" << kUsage;
    return 2;
  } catch (const dew::Error& e) {
    std::cerr << "dew-tokenize: " << (e.kind() == dew::ErrorKind::usage ? "" : "error: ") << e.describe() << "\n";
    return e.kind() == dew::ErrorKind::usage ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "dew-tokenize: error: " << e.what() << "\n";
    return 1;
  }
}
