// plugins/data/chat_jsonl — the "chat_jsonl" data source: conversations for SFT, rendered with a chat
// template and tokenized, with a loss mask on the assistant turns (docs/chat.md, docs/training.md).
//
// Options: path (a .jsonl file, one {"messages": [{"role", "content", ...}], "tools"?: ...} per line;
// required), tokenizer (a folder written by dew-tokenize or dew-run import: meta.json, tokenizer.json for
// bpe; required), template (a tokenizer_config.json, chat_template.jinja or folder; default: the
// tokenizer folder's template, else dew's default, dew/chat_template.hpp), seq_len (required),
// val_count (the first val_count conversations are the val split, the rest train; default 0 = no val
// split), truncate (false: a conversation longer than seq_len + 1 tokens is refused naming its line;
// true: cut), pack (false; below), split (train | val; set by the loader).
// Record i: "text" i32 [seq_len + 1] (the conversation's tokens, then padding) and "loss_mask" i32
// [seq_len + 1], 1 on the tokens of assistant turns (the spans of render_chat_with_spans), 0 on the rest
// and on padding; the lm objective trains on target j only where loss_mask[j] = 1. Padding uses the
// tokenizer's eos id (0 without one). One conversation a row, padded.
// pack = true (the loader's [data] pack, forwarded here): rows of whole conversations instead, taken in file
// order while they fit seq_len + 1 tokens (a conversation that does not fit starts the next row; none is split),
// the rest of a row padded. Each record also holds "text_segment_ids" i32 [seq_len + 1] (the row's conversations
// numbered 1, 2, ...; padding 0) and "text_positions" (restarting at 0 with every conversation): the lm objective
// then attends within each conversation and scores targets inside one, so a packed batch's loss is the
// token-weighted mean of its conversations' losses alone. A conversation's first token carries mask 0 (as row
// position 0 does unpacked: it is never a target), so the target that crosses into the next conversation never
// counts. Rows are filled greedily in order (no reordering: a record stays a pure function of the file).
// Tokens: the rendering is cut at the span edges and each piece encoded on its own (so every token is
// wholly inside or outside a turn, as the prompt of a generation is encoded), a BOS that the
// tokenizer's post-processor puts before each piece is kept only before the first, and dropped there
// too when the rendering already starts with that token's text (the template's bos_token). Tokenizers
// that change a piece's first character (SentencePiece's "▁" prefix) are refused. A conversation with
// no assistant token in its window is refused naming its line. Everything is tokenized when the source
// is created.
#include <dew/chat_template.hpp>
#include <dew/data.hpp>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <dew/tokenizer.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace fs = std::filesystem;

namespace {

class ChatJsonlSource final : public dew::DataSource {
 public:
  explicit ChatJsonlSource(const dew::Options& o) {
    const std::string ctx = o.context().empty() ? "" : o.context() + ".";
    auto key = [&](const char* k) { return "'" + ctx + k + "'"; };
    DEW_USAGE_CHECK(o.has("path"), "chat_jsonl: missing required option ", key("path"), " (a .jsonl of conversations)");
    DEW_USAGE_CHECK(o.has("tokenizer"), "chat_jsonl: missing required option ", key("tokenizer"),
                    " (a folder written by dew-tokenize or dew-run import)");
    DEW_USAGE_CHECK(o.has("seq_len"), "chat_jsonl: missing required option ", key("seq_len"));
    const std::string path = o.get_string("path", "");
    const std::string tok_dir = o.get_string("tokenizer", "");
    const std::string tmpl_path = o.get_string("template", tok_dir);
    seq_len_ = o.get_int("seq_len", 0);
    DEW_USAGE_CHECK(seq_len_ > 0, "chat_jsonl: option ", key("seq_len"), " must be positive, got ", seq_len_);
    const int64_t val_count = o.get_int("val_count", 0);
    DEW_USAGE_CHECK(val_count >= 0, "chat_jsonl: option ", key("val_count"), " must be >= 0, got ", val_count);
    const bool truncate = o.get_bool("truncate", false);
    pack_ = o.get_bool("pack", false);
    const std::string split = o.get_string("split", "train");
    DEW_USAGE_CHECK(split == "train" || split == "val", "chat_jsonl: option ", key("split"),
                    " must be train or val, got '", split, "'");

    tokenizer_ = dew::load_tokenizer(tok_dir);
    DEW_USAGE_CHECK(fs::exists(tmpl_path), "chat_jsonl: ", key("template"), " '", tmpl_path, "' does not exist");
    config_ = fs::is_directory(tmpl_path) ? dew::chat_config_of_folder(tmpl_path) : dew::read_chat_config(tmpl_path);
    if (config_.chat_template.empty()) {
      config_.chat_template = dew::default_chat_template();
      config_.template_origin = "dew's default chat template";
    }
    const dew::ChatTemplate tmpl(config_.chat_template, config_.template_origin);
    check_tokenizer();

    std::ifstream in(path, std::ios::binary);
    DEW_USAGE_CHECK(in.good(), "chat_jsonl: cannot read ", key("path"), " '", path, "'");
    std::vector<std::pair<int64_t, std::string>> lines;
    std::string line;
    int64_t number = 0;
    while (std::getline(in, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") != std::string::npos) lines.emplace_back(number, line);
    }
    DEW_USAGE_CHECK(!lines.empty(), "chat_jsonl: '", path, "' holds no conversations");
    DEW_USAGE_CHECK(val_count < int64_t(lines.size()), "chat_jsonl: ", key("val_count"), " = ", val_count,
                    " leaves no training conversations ('", path, "' holds ", lines.size(), ")");
    if (split == "val") {
      DEW_USAGE_CHECK(val_count > 0, "chat_jsonl: '", path, "' has no validation split: set ", key("val_count"),
                      " (the first val_count conversations become the val split)");
      lines.resize(size_t(val_count));
    } else {
      lines.erase(lines.begin(), lines.begin() + val_count);
    }
    const int64_t n = seq_len_ + 1;
    const int32_t pad = tokenizer_->eos_id() >= 0 ? tokenizer_->eos_id() : 0;
    for (const auto& [at, text] : lines) {
      dew::RenderedChat r;
      try {
        r = dew::render_chat_with_spans(tmpl, config_, text);
      } catch (const dew::Error& e) {
        throw dew::UsageError("chat_jsonl: " + path + ":" + std::to_string(at) + ": " + e.what());
      }
      std::vector<int32_t> ids, mask;
      encode(r, ids, mask);
      DEW_USAGE_CHECK(truncate || int64_t(ids.size()) <= n, "chat_jsonl: ", path, ":", at, ": the conversation is ",
                      ids.size(), " tokens, longer than seq_len + 1 = ", n, " (raise ", key("seq_len"), " or set ",
                      key("truncate"), " = true)");
      if (int64_t(ids.size()) > n) {
        ids.resize(size_t(n));
        mask.resize(size_t(n));
      }
      int64_t trained = 0;
      for (size_t j = 1; j < mask.size(); ++j) trained += mask[j];
      DEW_USAGE_CHECK(trained > 0, "chat_jsonl: ", path, ":", at,
                      ": the conversation has no assistant token to train on within seq_len + 1 = ", n, " tokens");
      if (pack_) {
        add_to_packed_rows(ids, mask, n, pad);
        continue;
      }
      ids.resize(size_t(n), pad);
      mask.resize(size_t(n), 0);
      tokens_.push_back(std::move(ids));
      masks_.push_back(std::move(mask));
    }
    if (pack_ && !tokens_.empty()) pad_last_row(n, pad);
    identity_ = "chat_jsonl:" + fs::weakly_canonical(path).string() + "#" + split +
                "?seq_len=" + std::to_string(seq_len_) + "&val_count=" + std::to_string(val_count) +
                (pack_ ? "&pack=1" : "") + "&template=" + config_.template_origin;
  }

  int64_t size() const override { return int64_t(tokens_.size()); }

  dew::Record get(int64_t index) const override {
    DEW_CHECK(index >= 0 && index < size(), "chat_jsonl: record ", index, " is outside [0, ", size(), ")");
    const int64_t n = seq_len_ + 1;
    dew::HostArray text = dew::HostArray::make(dew::DType::i32, {n});
    dew::HostArray mask = dew::HostArray::make(dew::DType::i32, {n});
    std::copy(tokens_[size_t(index)].begin(), tokens_[size_t(index)].end(), text.as<int32_t>());
    std::copy(masks_[size_t(index)].begin(), masks_[size_t(index)].end(), mask.as<int32_t>());
    dew::Record r;
    r.emplace("text", std::move(text));
    r.emplace("loss_mask", std::move(mask));
    if (pack_) {
      dew::HostArray seg = dew::HostArray::make(dew::DType::i32, {n});
      dew::HostArray pos = dew::HostArray::make(dew::DType::i32, {n});
      std::copy(segments_[size_t(index)].begin(), segments_[size_t(index)].end(), seg.as<int32_t>());
      std::copy(positions_[size_t(index)].begin(), positions_[size_t(index)].end(), pos.as<int32_t>());
      r.emplace("text_segment_ids", std::move(seg));
      r.emplace("text_positions", std::move(pos));
    }
    return r;
  }

  std::string identity() const override { return identity_; }

 private:
  // pack: the conversation (at most n tokens) goes into the last row when it fits, else into a new row (the last
  // one padded first); its tokens get the row's next segment number and positions from 0, its first token mask 0.
  void add_to_packed_rows(const std::vector<int32_t>& ids, const std::vector<int32_t>& mask, int64_t n, int32_t pad) {
    if (tokens_.empty() || int64_t(tokens_.back().size() + ids.size()) > n) {
      if (!tokens_.empty()) pad_last_row(n, pad);
      tokens_.emplace_back();
      masks_.emplace_back();
      segments_.emplace_back();
      positions_.emplace_back();
    }
    const int32_t segment = segments_.back().empty() ? 1 : segments_.back().back() + 1;
    for (size_t j = 0; j < ids.size(); ++j) {
      tokens_.back().push_back(ids[j]);
      masks_.back().push_back(j == 0 ? 0 : mask[j]);
      segments_.back().push_back(segment);
      positions_.back().push_back(int32_t(j));
    }
  }
  void pad_last_row(int64_t n, int32_t pad) {
    tokens_.back().resize(size_t(n), pad);
    masks_.back().resize(size_t(n), 0);
    segments_.back().resize(size_t(n), 0);
    positions_.back().resize(size_t(n), 0);
  }

  // The post-processor's BOS (encode("") gives just it), and a tokenizer that keeps a piece's text.
  void check_tokenizer() {
    const std::vector<int32_t> empty = tokenizer_->encode("");
    DEW_USAGE_CHECK(empty.size() <= 1, "chat_jsonl: the tokenizer encodes \"\" as ", empty.size(), " tokens");
    bos_ = empty.empty() ? -1 : empty[0];
    std::vector<int32_t> ab = strip_bos(tokenizer_->encode("ab"));
    std::string back;
    for (int32_t id : ab) back += tokenizer_->token_bytes(id);
    DEW_USAGE_CHECK(back == "ab", "chat_jsonl: the tokenizer changes the start of a text (\"ab\" comes back as \"",
                    back, "\", e.g. SentencePiece's \"▁\" prefix), so a rendering cannot be encoded piece by piece");
  }

  std::vector<int32_t> strip_bos(std::vector<int32_t> ids) const {
    if (bos_ >= 0 && !ids.empty() && ids[0] == bos_) ids.erase(ids.begin());
    return ids;
  }

  void encode(const dew::RenderedChat& r, std::vector<int32_t>& ids, std::vector<int32_t>& mask) const {
    // A BOS of the post-processor goes first unless the template already wrote that token's text.
    if (bos_ >= 0) {
      const std::string bos_text = tokenizer_->token_bytes(bos_);
      if (bos_text.empty() || r.text.compare(0, bos_text.size(), bos_text) != 0) {
        ids.push_back(bos_);
        mask.push_back(0);
      }
    }
    int64_t at = 0;
    auto piece = [&](int64_t end, int32_t m) {
      if (end <= at) return;
      for (int32_t id : strip_bos(tokenizer_->encode(std::string_view(r.text).substr(size_t(at), size_t(end - at))))) {
        ids.push_back(id);
        mask.push_back(m);
      }
      at = end;
    };
    for (const auto& [b, e] : r.assistant_spans) {
      piece(b, 0);
      piece(e, 1);
    }
    piece(int64_t(r.text.size()), 0);
  }

  int64_t seq_len_ = 0;
  bool pack_ = false;
  int32_t bos_ = -1;
  std::shared_ptr<dew::Tokenizer> tokenizer_;
  dew::ChatConfig config_;
  std::vector<std::vector<int32_t>> tokens_, masks_;
  std::vector<std::vector<int32_t>> segments_, positions_;  // pack only
  std::string identity_;
};

}  // namespace

DEW_PLUGIN("chat_jsonl", "0.1.0") {
  registrar.add<dew::DataSource>(
      {.name = "chat_jsonl",
       .description = "conversations (JSONL of {messages}) rendered with a chat template: text i32 [seq_len + 1], "
                      "loss_mask i32 [seq_len + 1] (1 on assistant tokens), padded, or packed (pack: + "
                      "text_segment_ids, text_positions)",
       .factory = [](const dew::Options& o) { return std::make_shared<ChatJsonlSource>(o); },
       .probe = {},
       .options = {
           {"path", "", "a .jsonl file, one {\"messages\": [...]} per line; required"},
           {"tokenizer", "", "folder with meta.json (+ tokenizer.json) from dew-tokenize or an import; required"},
           {"template", "",
            "tokenizer_config.json, chat_template.jinja or folder (default: the tokenizer "
            "folder's, else dew's default template)"},
           {"seq_len", "", "tokens per row (the record holds seq_len + 1); required"},
           {"val_count", "0", "the first val_count conversations are the val split"},
           {"truncate", "false", "cut conversations longer than seq_len + 1 tokens (else refused)"},
           {"pack", "false", "([data] pack) rows of whole conversations, each attended and scored alone"},
           {"split", "train", "train or val; set by the loader"}}});
}
