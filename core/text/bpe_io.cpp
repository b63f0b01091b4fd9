// core/text/bpe_io.cpp — byte-level BPE tokenizers from and to files: Hugging Face tokenizer.json,
// GPT-2's vocab.json + merges.txt.
//
// tokenizer.json: model.type "BPE" (absent counts as BPE), without continuing_subword_prefix,
// end_of_word_suffix or dropout, in one of three styles (dew/tokenizer.hpp, load_hf_tokenizer_json):
//  * byte-level (byte_fallback false): normalizer null or NFC; pre-tokenizer ByteLevel(use_regex true,
//    GPT-2's pattern; add_prefix_space honoured) or Sequence[Split(Llama 3's or Qwen2's pattern,
//    Isolated), ByteLevel(use_regex false, add_prefix_space false)]; decoder null or ByteLevel. Vocab
//    keys are in GPT-2's byte->unicode mapping ("Ġthe").
//  * SentencePiece (byte_fallback true): normalizer Sequence[Prepend("▁")?, Replace(" ", "▁")] with
//    no pre-tokenizer, or no normalizer and a Metaspace("▁") pre-tokenizer; decoder
//    Sequence[Replace("▁", " "), ByteFallback, Fuse, Strip(" ", n, 0)?]; all 256 <0xNN> in the vocab.
//  * post_processor: null, ByteLevel, TemplateProcessing whose single is [SpecialToken X]? [Sequence A]
//    (X: the BOS encode() adds), or a Sequence of those.
// Every other type, option or top-level key is refused, naming its field. Merges are "a b" strings or
// ["a", "b"] pairs; each merge's result must be in the vocab. added_tokens (lstrip, rstrip, single_word
// false) are matched literally in the text. The eos is the first of "<|endoftext|>", "</s>",
// "<|end_of_text|>", "<eos>", "<|eos|>" the file holds (an import takes the model's own).
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dew/error.hpp"
#include "text/text_internal.hpp"

namespace dew {

namespace {

using json = nlohmann::json;
using text::AddedToken;
using text::BpeTokenizer;

json parse_json_file(const std::string& path, const char* what) {
  const std::string content = text::read_text_file(path, what);
  try {
    return json::parse(content);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 2e2222
    throw UsageError(std::string(what) + " '" + path + "' is not valid JSON: " + e.what());
  }
}

// "<0xNN>" -> the byte NN, else the piece with "▁" -> " " (the decoder's Replace + ByteFallback).
int byte_fallback_of(const std::string& piece) {
  auto hex = [](char c) { return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1; };
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  const int hi = hex(piece[3]), lo = hex(piece[4]);
  return hi < 0 || lo < 0 ? -1 : hi * 16 + lo;
}

std::string sp_piece_bytes(const std::string& piece) {
  const int b = byte_fallback_of(piece);
  if (b >= 0) return std::string(1, char(b));
  std::string out;
  for (size_t i = 0; i < piece.size(); ++i) {
    if (piece.compare(i, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      i += 2;
    } else {
      out += piece[i];
    }
  }
  return out;
}

// The parts of a vocabulary before they become a BpeTokenizer.
struct VocabBuilder {
  std::string origin;
  bool sentencepiece = false;  // keys are SentencePiece pieces: "▁" is " ", "<0xNN>" the byte NN
  std::unordered_map<std::string, int32_t> mapped_to_id;  // the file's spelling -> id
  std::unordered_map<std::string, int32_t> bytes_to_id;   // raw bytes -> id
  std::vector<std::string> tokens;
  std::vector<bool> present;

  void add(const std::string& mapped, int64_t id, const AddedToken* added) {
    // Ids index a dense table, so the bound is on memory as much as on sense: 2^24, the largest vocabulary
    // dew trains (bpe_train.cpp), keeps a 30-byte vocab.json naming id 10^8 from allocating gigabytes.
    DEW_USAGE_CHECK(id >= 0 && id < (int64_t(1) << 24), origin, ": token '", mapped, "' has a bad id ", id,
                    " (ids are 0 .. 2^24 - 1)");
    if (size_t(id) >= tokens.size()) {
      tokens.resize(size_t(id) + 1);
      present.resize(size_t(id) + 1, false);
    }
    std::string bytes;
    if (added) {
      bytes = added->content;
    } else if (sentencepiece) {
      bytes = sp_piece_bytes(mapped);
    } else if (!text::mapped_to_bytes(mapped, &bytes)) {
      bytes = mapped;  // not in the byte mapping (e.g. a special token): its own spelling
    }
    if (present[size_t(id)]) {
      DEW_USAGE_CHECK(tokens[size_t(id)] == bytes, origin, ": id ", id, " is given to two tokens, '", mapped,
                      "' and another");
      return;
    }
    tokens[size_t(id)] = bytes;
    present[size_t(id)] = true;
    mapped_to_id.emplace(mapped, int32_t(id));
    bytes_to_id.emplace(bytes, int32_t(id));
  }

  int32_t id_of(const std::string& mapped, size_t merge_line) const {
    auto it = mapped_to_id.find(mapped);
    DEW_USAGE_CHECK(it != mapped_to_id.end(), origin, ": merge ", merge_line, " uses '", mapped,
                    "', which is not in the vocabulary");
    return it->second;
  }

  void add_merge(std::vector<std::array<int32_t, 3>>& merges, const std::string& a, const std::string& b, size_t line) {
    const int32_t ia = id_of(a, line), ib = id_of(b, line);
    auto it = mapped_to_id.find(a + b);
    DEW_USAGE_CHECK(it != mapped_to_id.end(), origin, ": merge ", line, " '", a, " ", b, "' makes '", a + b,
                    "', which is not in the vocabulary");
    merges.push_back({ia, ib, it->second});
  }
};

std::pair<std::string, std::string> split_merge(const std::string& s, const std::string& origin, size_t line) {
  const size_t sp = s.find(' ');
  DEW_USAGE_CHECK(sp != std::string::npos && sp > 0 && sp + 1 < s.size() && s.find(' ', sp + 1) == std::string::npos,
                  origin, ": merge ", line, " '", s, "' is not two tokens separated by one space");
  return {s.substr(0, sp), s.substr(sp + 1)};
}

std::string type_of(const json& j) {
  if (!j.is_object()) return j.is_null() ? "null" : j.dump();
  std::string t = j.value("type", std::string("?"));
  if (t == "Sequence") {
    const char* key = j.contains("pretokenizers") ? "pretokenizers" : "normalizers";
    std::string inner;
    if (j.contains(key) && j[key].is_array())
      for (const json& x : j[key]) inner += (inner.empty() ? "" : ", ") + type_of(x);
    t += "[" + inner + "]";
  }
  return t;
}

}  // namespace

namespace {

constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kMark = "\xE2\x96\x81";  // "▁"

// Reads the components of a tokenizer.json, refusing what dew does not implement by field name.
struct Reader {
  std::string origin;

  [[noreturn]] void refuse(const std::string& field, const json& value, const std::string& why) const {
    std::string v = value.dump();
    if (v.size() > 300) v = v.substr(0, 300) + "...";
    throw UsageError(origin + ": " + field + " " + v + " is not supported (" + why + ")");
  }
  // Only these keys; the unknown ones are refused by name.
  void keys(const json& obj, const std::string& field, std::initializer_list<const char*> known) const {
    for (const auto& [k, v] : obj.items()) {
      bool ok = false;
      for (const char* x : known) ok = ok || k == x;
      if (!ok) refuse(field + "." + k, v, "an option dew does not implement");
    }
  }
  static std::string type(const json& j) { return j.is_object() ? j.value("type", std::string()) : std::string(); }
  // A Sequence's members (key "normalizers" / "pretokenizers" / "decoders" / "processors"), or the
  // component itself.
  std::vector<json> flatten(const json& j, const std::string& field, const char* key) const {
    if (type(j) != "Sequence") return {j};
    keys(j, field, {"type", key});
    if (!j.contains(key) || !j[key].is_array())
      refuse(field, j, std::string("a Sequence without a '") + key + "' array");
    return j[key].get<std::vector<json>>();
  }
  // {"String": s} patterns (Replace).
  bool string_pattern(const json& j, const char* s) const {
    return j.is_object() && j.size() == 1 && j.contains("String") && j["String"] == s;
  }
};

}  // namespace

namespace {
std::unique_ptr<Tokenizer> load_hf_tokenizer_json_unchecked(const std::string& path) {
  const std::string source = text::read_text_file(path, "tokenizer file");
  json j;
  try {
    j = json::parse(source);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number such as 2e2222
    throw UsageError("tokenizer file '" + path + "' is not valid JSON: " + e.what());
  }
  const std::string origin = "tokenizer.json '" + path + "'";
  Reader rd{origin};
  DEW_USAGE_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), origin, " has no \"model\" object");
  rd.keys(j, "tokenizer.json",
          {"version", "truncation", "padding", "added_tokens", "normalizer", "pre_tokenizer", "post_processor",
           "decoder", "model"});
  const json& model = j["model"];
  const std::string mtype = model.value("type", std::string("BPE"));
  DEW_USAGE_CHECK(mtype == "BPE", origin, ": model type '", mtype,
                  "' is not supported (only BPE: byte-level, or SentencePiece-style with byte_fallback)");
  rd.keys(model, "model",
          {"type", "dropout", "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk",
           "byte_fallback", "ignore_merges", "vocab", "merges"});
  auto empty_or_null = [&](const char* key) {
    if (!model.contains(key) || model[key].is_null()) return true;
    return model[key].is_string() && model[key].get<std::string>().empty();
  };
  DEW_USAGE_CHECK(empty_or_null("continuing_subword_prefix") && empty_or_null("end_of_word_suffix"), origin,
                  ": BPE with continuing_subword_prefix / end_of_word_suffix is not supported (only byte-level or "
                  "SentencePiece-style BPE)");
  if (model.contains("dropout") && !model["dropout"].is_null() &&
      !(model["dropout"].is_number() && model["dropout"].get<double>() == 0.0))
    rd.refuse("model.dropout", model["dropout"], "BPE dropout is for training; dew encodes deterministically");
  const bool byte_fallback = model.value("byte_fallback", false);
  const bool ignore_merges = model.value("ignore_merges", false);
  DEW_USAGE_CHECK(model.contains("vocab") && model["vocab"].is_object(), origin, " has no model.vocab object");
  DEW_USAGE_CHECK(model.contains("merges") && model["merges"].is_array(), origin, " has no model.merges array");

  text::BpeStyle style;
  style.sentencepiece = byte_fallback;
  bool add_prefix_space = false;
  const json normalizer = j.value("normalizer", json());
  const json pre = j.value("pre_tokenizer", json());
  const json decoder = j.value("decoder", json());

  // ---- normalizer ----
  bool sp_normalizer = false;
  if (!normalizer.is_null()) {
    const std::vector<json> parts = rd.flatten(normalizer, "normalizer", "normalizers");
    auto is_prepend = [&](const json& n) {
      return Reader::type(n) == "Prepend" && n.size() == 2 && n.value("prepend", std::string()) == kMark;
    };
    auto is_replace = [&](const json& n) {
      return Reader::type(n) == "Replace" && n.size() == 3 && rd.string_pattern(n["pattern"], " ") &&
             n.value("content", std::string()) == kMark;
    };
    if (parts.size() == 1 && Reader::type(parts[0]) == "NFC" && parts[0].size() == 1) {
      style.nfc = true;
    } else if (byte_fallback && parts.size() == 2 && is_prepend(parts[0]) && is_replace(parts[1])) {
      sp_normalizer = true;
      style.sp_prepend = text::Prepend::always;  // every segment between added tokens, as `tokenizers` does
    } else if (byte_fallback && parts.size() == 1 && is_replace(parts[0])) {
      sp_normalizer = true;
    } else {
      std::string names;
      for (const json& n : parts) names += (names.empty() ? "" : ", ") + Reader::type(n);
      rd.refuse("normalizer", normalizer,
                "known: NFC; with byte_fallback, Sequence[Prepend(\"▁\"), Replace(\" \", \"▁\")]; this has " +
                    (names.empty() ? std::string("?") : names));
    }
  }

  // ---- pre-tokenizer ----
  if (!byte_fallback) {
    const std::vector<json> parts =
        pre.is_null() ? std::vector<json>{} : rd.flatten(pre, "pre_tokenizer", "pretokenizers");
    if (parts.size() == 1 && Reader::type(parts[0]) == "ByteLevel") {
      rd.keys(parts[0], "pre_tokenizer", {"type", "add_prefix_space", "trim_offsets", "use_regex"});
      DEW_USAGE_CHECK(parts[0].value("use_regex", true), origin,
                      ": a ByteLevel pre-tokenizer with use_regex false alone is not supported (it needs a Split "
                      "before it)");
      add_prefix_space = parts[0].value("add_prefix_space", false);
    } else if (parts.size() == 2 && Reader::type(parts[0]) == "Split" && Reader::type(parts[1]) == "ByteLevel") {
      const json& sp = parts[0];
      rd.keys(sp, "pre_tokenizer.Split", {"type", "pattern", "behavior", "invert"});
      const json pat = sp.value("pattern", json());
      if (!(pat.is_object() && pat.size() == 1 && pat.contains("Regex") && pat["Regex"].is_string()))
        rd.refuse("pre_tokenizer.Split.pattern", pat, "only a Regex pattern");
      const std::string re = pat["Regex"].get<std::string>();
      if (re == kLlama3Pattern)
        style.pretok = text::PreTok::llama3;
      else if (re == kQwen2Pattern)
        style.pretok = text::PreTok::qwen2;
      else
        rd.refuse("pre_tokenizer.Split.pattern", pat,
                  "dew implements two Split patterns by hand: Llama 3's (\\p{N}{1,3}) and Qwen2's (\\p{N})");
      if (sp.value("behavior", std::string()) != "Isolated")
        rd.refuse("pre_tokenizer.Split.behavior", sp.value("behavior", json()), "only Isolated");
      if (sp.value("invert", false)) rd.refuse("pre_tokenizer.Split.invert", sp["invert"], "only false");
      const json& bl = parts[1];
      rd.keys(bl, "pre_tokenizer.ByteLevel", {"type", "add_prefix_space", "trim_offsets", "use_regex"});
      if (bl.value("use_regex", true))
        rd.refuse("pre_tokenizer.ByteLevel.use_regex", bl.value("use_regex", json(true)),
                  "after a Split, GPT-2's pattern would cut again; only false");
      if (bl.value("add_prefix_space", false))
        rd.refuse("pre_tokenizer.ByteLevel.add_prefix_space", bl["add_prefix_space"], "only false after a Split");
    } else {
      std::string names;
      for (const json& n : parts) names += (names.empty() ? "" : ", ") + Reader::type(n);
      rd.refuse("pre_tokenizer", pre,
                "byte-level BPE needs ByteLevel or Sequence[Split, ByteLevel]; this has " +
                    (names.empty() ? std::string("none") : names));
    }
  } else {
    DEW_USAGE_CHECK(!ignore_merges, origin, ": model.ignore_merges with byte_fallback is not supported");
    DEW_USAGE_CHECK(!style.nfc, origin, ": normalizer NFC with byte_fallback (SentencePiece-style) is not supported");
    if (pre.is_null()) {
      DEW_USAGE_CHECK(sp_normalizer, origin,
                      ": model.byte_fallback (SentencePiece-style) needs the normalizer Sequence[Prepend(\"▁\"), "
                      "Replace(\" \", \"▁\")] or a Metaspace pre_tokenizer; this has neither");
      style.pretok = text::PreTok::none;
    } else if (Reader::type(pre) == "Metaspace") {
      if (sp_normalizer) rd.refuse("pre_tokenizer", pre, "a Metaspace after a \"▁\" normalizer");
      rd.keys(pre, "pre_tokenizer.Metaspace",
              {"type", "replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
      if (pre.value("replacement", std::string()) != kMark)
        rd.refuse("pre_tokenizer.Metaspace.replacement", pre.value("replacement", json()), "only \"▁\"");
      if (pre.contains("str_rep") && pre["str_rep"] != kMark)
        rd.refuse("pre_tokenizer.Metaspace.str_rep", pre["str_rep"], "only \"▁\"");
      std::string scheme = pre.contains("prepend_scheme")        ? pre.value("prepend_scheme", std::string("?"))
                           : pre.value("add_prefix_space", true) ? "always"
                                                                 : "never";
      if (scheme == "first")
        style.sp_prepend = text::Prepend::first;
      else if (scheme == "always")
        style.sp_prepend = text::Prepend::always;
      else if (scheme == "never")
        style.sp_prepend = text::Prepend::never;
      else
        rd.refuse("pre_tokenizer.Metaspace.prepend_scheme", pre["prepend_scheme"], "first, always or never");
      style.sp_prepend_unless_marked = true;
      style.pretok = pre.value("split", true) ? text::PreTok::metaspace_split : text::PreTok::none;
    } else {
      rd.refuse("pre_tokenizer", pre, "with byte_fallback (SentencePiece-style): none, or Metaspace");
    }
  }

  // ---- decoder ----
  if (!byte_fallback) {
    if (!decoder.is_null()) {
      if (Reader::type(decoder) != "ByteLevel") rd.refuse("decoder", decoder, "byte-level BPE decodes with ByteLevel");
      rd.keys(decoder, "decoder", {"type", "add_prefix_space", "trim_offsets", "use_regex"});
    }
  } else {
    const std::vector<json> parts =
        decoder.is_null() ? std::vector<json>{} : rd.flatten(decoder, "decoder", "decoders");
    const bool ok = (parts.size() == 3 || parts.size() == 4) && Reader::type(parts[0]) == "Replace" &&
                    parts[0].size() == 3 && rd.string_pattern(parts[0]["pattern"], kMark) &&
                    parts[0].value("content", std::string()) == " " && Reader::type(parts[1]) == "ByteFallback" &&
                    parts[1].size() == 1 && Reader::type(parts[2]) == "Fuse" && parts[2].size() == 1;
    if (!ok)
      rd.refuse("decoder", decoder,
                "with byte_fallback: Sequence[Replace(\"▁\", \" \"), ByteFallback, Fuse, Strip(\" \", n, 0)]");
    if (parts.size() == 4) {
      const json& st = parts[3];
      if (!(Reader::type(st) == "Strip" && st.size() == 4 && st.value("content", std::string()) == " " &&
            st.value("stop", -1) == 0 && st.value("start", -1) >= 0))
        rd.refuse("decoder.Strip", st, "only Strip(content \" \", start n, stop 0)");
      style.sp_strip = st.value("start", 0);
    }
  }

  // ---- added tokens ----
  std::vector<AddedToken> added;
  std::unordered_map<int64_t, size_t> added_at;
  if (j.contains("added_tokens") && !j["added_tokens"].is_null()) {
    DEW_USAGE_CHECK(j["added_tokens"].is_array(), origin, ": added_tokens is not an array");
    const bool has_normalizer = !normalizer.is_null();
    for (const json& a : j["added_tokens"]) {
      DEW_USAGE_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                          a["content"].is_string(),
                      origin, ": an added_tokens entry lacks an integer id or a content string: ", a.dump());
      rd.keys(a, "added_tokens[" + a["content"].get<std::string>() + "]",
              {"id", "content", "single_word", "lstrip", "rstrip", "normalized", "special"});
      for (const char* opt : {"single_word", "lstrip", "rstrip"})
        if (a.value(opt, false))
          rd.refuse(std::string("added_tokens[") + a["content"].get<std::string>() + "]." + opt, a[opt],
                    "added tokens are matched literally");
      if (has_normalizer && a.value("normalized", false))
        rd.refuse("added_tokens[" + a["content"].get<std::string>() + "].normalized", a["normalized"],
                  "added tokens are matched in the text before the normalizer");
      added_at[a["id"].get<int64_t>()] = added.size();
      added.push_back({a["id"].get<int32_t>(), a["content"].get<std::string>(), a.value("special", true)});
    }
  }

  // ---- vocab and merges ----
  VocabBuilder vb;
  vb.origin = origin;
  vb.sentencepiece = byte_fallback;
  for (const auto& [mapped, idj] : model["vocab"].items()) {
    DEW_USAGE_CHECK(idj.is_number_integer(), origin, ": vocab entry '", mapped, "' is not an integer id");
    const int64_t id = idj.get<int64_t>();
    auto it = added_at.find(id);
    const bool is_added = it != added_at.end() && added[it->second].content == mapped;
    vb.add(mapped, id, is_added ? &added[it->second] : nullptr);
    if (byte_fallback && !is_added) {
      const int b = byte_fallback_of(mapped);
      if (b >= 0) {
        style.byte_fallback[size_t(b)] = int32_t(id) + 1;  // +1: 0 marks "absent" until checked below
      } else {
        uint32_t cp;
        bool valid;
        if (!mapped.empty() && size_t(text::utf8_decode(mapped, 0, &cp, &valid)) == mapped.size() && valid)
          style.sp_chars.emplace(mapped, int32_t(id));
      }
    }
  }
  for (const AddedToken& a : added) vb.add(a.content, a.id, &a);
  if (byte_fallback) {
    for (int b = 0; b < 256; ++b) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "<0x%02X>", b);
      DEW_USAGE_CHECK(style.byte_fallback[size_t(b)] > 0, origin,
                      ": model.byte_fallback is true but the vocabulary has no ", hex, " token (dew needs all 256)");
      style.byte_fallback[size_t(b)] -= 1;
    }
  }

  std::vector<std::array<int32_t, 3>> merges;
  merges.reserve(model["merges"].size());
  size_t line = 0;
  for (const json& m : model["merges"]) {
    ++line;
    if (m.is_string()) {
      auto [a, b] = split_merge(m.get<std::string>(), origin, line);
      vb.add_merge(merges, a, b, line);
    } else {
      DEW_USAGE_CHECK(m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string(), origin, ": merge ", line,
                      " is neither \"a b\" nor [\"a\", \"b\"]: ", m.dump());
      vb.add_merge(merges, m[0].get<std::string>(), m[1].get<std::string>(), line);
    }
  }
  std::unordered_map<std::string, int32_t> by_name = vb.mapped_to_id;
  for (const AddedToken& a : added) by_name[a.content] = a.id;

  // ---- post-processor: the BOS ----
  const json post = j.value("post_processor", json());
  if (!post.is_null()) {
    for (const json& p : rd.flatten(post, "post_processor", "processors")) {
      const std::string t = Reader::type(p);
      if (t == "ByteLevel") {
        if (byte_fallback) rd.refuse("post_processor", p, "ByteLevel with byte_fallback");
        rd.keys(p, "post_processor.ByteLevel", {"type", "add_prefix_space", "trim_offsets", "use_regex"});
        continue;  // offsets only
      }
      if (t != "TemplateProcessing")
        rd.refuse("post_processor", p, "only TemplateProcessing, ByteLevel, or a Sequence of them");
      rd.keys(p, "post_processor.TemplateProcessing", {"type", "single", "pair", "special_tokens"});
      const json single = p.value("single", json());
      const auto is_seq_a = [](const json& x) {
        return x.is_object() && x.contains("Sequence") && x["Sequence"].value("id", std::string()) == "A";
      };
      const bool ok =
          single.is_array() &&
          ((single.size() == 1 && is_seq_a(single[0])) ||
           (single.size() == 2 && single[0].is_object() && single[0].contains("SpecialToken") && is_seq_a(single[1])));
      if (!ok)
        rd.refuse("post_processor.TemplateProcessing.single", single,
                  "only \"$A\" or \"<bos> $A\" (dew encodes single texts; a token after $A is not added)");
      if (single.size() == 2) {
        const std::string name = single[0]["SpecialToken"].value("id", std::string());
        const json st = p.value("special_tokens", json::object()).value(name, json());
        DEW_USAGE_CHECK(st.is_object() && st.contains("ids") && st["ids"].is_array() && st["ids"].size() == 1 &&
                            st["ids"][0].is_number_integer(),
                        origin, ": post_processor.TemplateProcessing.special_tokens has no single id for '", name, "'");
        const int64_t id = st["ids"][0].get<int64_t>();
        DEW_USAGE_CHECK(id >= 0 && size_t(id) < vb.tokens.size() && vb.present[size_t(id)], origin,
                        ": post_processor.TemplateProcessing: '", name, "' has id ", id, ", not in the vocabulary");
        style.bos = int32_t(id);
      }
    }
  }

  const bool plain_gpt2 = style.pretok == text::PreTok::gpt2 && !style.nfc && style.bos < 0 && !byte_fallback;
  if (!plain_gpt2) style.source_json = source;
  const int32_t eos = text::find_eos(by_name);
  return std::make_unique<BpeTokenizer>(std::move(vb.tokens), std::move(vb.present), std::move(merges),
                                        std::move(added), eos, add_prefix_space, ignore_merges && !byte_fallback,
                                        origin, std::move(style));
}

std::unique_ptr<Tokenizer> load_gpt2_vocab_unchecked(const std::string& vocab_json, const std::string& merges_txt) {
  const json v = parse_json_file(vocab_json, "vocab file");
  const std::string origin = "vocab '" + vocab_json + "'";
  DEW_USAGE_CHECK(v.is_object(), origin, " is not a JSON object of token -> id");
  VocabBuilder vb;
  vb.origin = origin;
  for (const auto& [mapped, idj] : v.items()) {
    DEW_USAGE_CHECK(idj.is_number_integer(), origin, ": entry '", mapped, "' is not an integer id");
    vb.add(mapped, idj.get<int64_t>(), nullptr);
  }
  const int32_t eos = text::find_eos(vb.mapped_to_id);
  std::vector<AddedToken> added;
  if (eos >= 0) added.push_back({eos, vb.tokens[size_t(eos)], true});

  const std::string mt = text::read_text_file(merges_txt, "merges file");
  const std::string morigin = "merges '" + merges_txt + "'";
  vb.origin = morigin;
  std::vector<std::array<int32_t, 3>> merges;
  std::istringstream in(mt);
  std::string l;
  size_t line = 0;
  while (std::getline(in, l)) {
    ++line;
    if (!l.empty() && l.back() == '\r') l.pop_back();
    if (l.empty() || (line == 1 && l.rfind("#version", 0) == 0)) continue;
    auto [a, b] = split_merge(l, morigin, line);
    vb.add_merge(merges, a, b, line);
  }
  return std::make_unique<BpeTokenizer>(std::move(vb.tokens), std::move(vb.present), std::move(merges),
                                        std::move(added), eos, false, false, origin);
}

// A value of the wrong JSON type (a number where a string belongs) reaches nlohmann's accessors as a
// type_error: one clear refusal naming the file instead.
template <class F>
std::unique_ptr<Tokenizer> refusing_wrong_types(const std::string& path, F&& load) {
  try {
    return load();
  } catch (const json::exception& e) {
    throw UsageError("tokenizer file '" + path + "' has a value of the wrong type: " + e.what());
  }
}

}  // namespace

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  return refusing_wrong_types(path, [&] { return load_hf_tokenizer_json_unchecked(path); });
}

std::unique_ptr<Tokenizer> load_gpt2_vocab(const std::string& vocab_json, const std::string& merges_txt) {
  return refusing_wrong_types(vocab_json, [&] { return load_gpt2_vocab_unchecked(vocab_json, merges_txt); });
}

namespace {

// GPT-2's tokenizer.json layout: ByteLevel pre-tokenizer (GPT-2's pattern) and decoder, BPE over the vocab's mapped
// byte strings ("Ġthe") and the merges.
void write_byte_level_json(const std::string& path, nlohmann::ordered_json added, nlohmann::ordered_json vocab,
                           nlohmann::ordered_json merges, bool add_prefix_space, bool ignore_merges) {
  using ojson = nlohmann::ordered_json;
  const ojson byte_level = {
      {"type", "ByteLevel"}, {"add_prefix_space", add_prefix_space}, {"trim_offsets", true}, {"use_regex", true}};
  ojson j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = byte_level;
  j["post_processor"] = nullptr;
  j["decoder"] = byte_level;
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", false},
                {"byte_fallback", false},
                {"ignore_merges", ignore_merges},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  const std::string out = j.dump(1) + "\n";
  text::write_file_atomic(path, out.data(), out.size());
}

}  // namespace

void save_tokenizer_json(const Tokenizer& tokenizer, const std::string& path) {
  using ojson = nlohmann::ordered_json;
  if (tokenizer.name() == "byte") {  // a byte-level BPE without merges: id = byte value, as encode() gives
    ojson vocab = ojson::object();
    for (int b = 0; b < 256; ++b) vocab[text::bytes_to_mapped(std::string(1, char(b)))] = b;
    write_byte_level_json(path, ojson::array(), std::move(vocab), ojson::array(), false, false);
    return;
  }
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer);
  DEW_USAGE_CHECK(bpe != nullptr, "save_tokenizer_json: the '", tokenizer.name(),
                  "' tokenizer has no tokenizer.json form (only the byte and BPE tokenizers do)");
  if (!bpe->style().source_json.empty()) {  // not GPT-2's style: the file it was read from
    const std::string& src = bpe->style().source_json;
    text::write_file_atomic(path, src.data(), src.size());
    return;
  }
  std::vector<bool> is_added(bpe->tokens().size(), false);
  ojson added = ojson::array();
  for (const AddedToken& a : bpe->added()) {
    is_added[size_t(a.id)] = true;
    added.push_back({{"id", a.id},
                     {"content", a.content},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", a.special}});
  }
  std::vector<std::string> mapped(bpe->tokens().size());
  ojson vocab = ojson::object();
  for (size_t id = 0; id < bpe->tokens().size(); ++id) {
    if (!bpe->present()[id]) continue;
    mapped[id] = is_added[id] ? bpe->tokens()[id] : text::bytes_to_mapped(bpe->tokens()[id]);
    vocab[mapped[id]] = int64_t(id);
  }
  ojson merges = ojson::array();
  for (const auto& m : bpe->merges()) merges.push_back(mapped[size_t(m[0])] + " " + mapped[size_t(m[1])]);
  write_byte_level_json(path, std::move(added), std::move(vocab), std::move(merges), bpe->add_prefix_space(),
                        bpe->ignore_merges());
}

}  // namespace dew
