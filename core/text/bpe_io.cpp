// core/text/bpe_io.cpp — byte-level BPE tokenizers from and to files: Hugging Face tokenizer.json,
// GPT-2's vocab.json + merges.txt.
//
// tokenizer.json: model.type must be "BPE" (absent counts as BPE), without continuing_subword_prefix,
// end_of_word_suffix or byte_fallback; the normalizer must be null; the pre-tokenizer a ByteLevel one
// (use_regex true; add_prefix_space honoured). Everything else is refused by name. model.vocab keys
// are in GPT-2's byte->unicode mapping ("Ġthe"); merges are "a b" strings or ["a", "b"] pairs; each
// merge's result must be in the vocab. added_tokens are matched literally in the text. The eos is the
// first of "<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|eos|>" the file holds.
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
  } catch (const json::parse_error& e) {
    throw UsageError(std::string(what) + " '" + path + "' is not valid JSON: " + e.what());
  }
}

// The parts of a vocabulary before they become a BpeTokenizer.
struct VocabBuilder {
  std::string origin;
  std::unordered_map<std::string, int32_t> mapped_to_id;  // the file's spelling -> id
  std::unordered_map<std::string, int32_t> bytes_to_id;   // raw bytes -> id
  std::vector<std::string> tokens;
  std::vector<bool> present;

  void add(const std::string& mapped, int64_t id, const AddedToken* added) {
    DEW_USAGE_CHECK(id >= 0 && id < (int64_t(1) << 31), origin, ": token '", mapped, "' has a bad id ", id);
    if (size_t(id) >= tokens.size()) {
      tokens.resize(size_t(id) + 1);
      present.resize(size_t(id) + 1, false);
    }
    std::string bytes;
    if (added) {
      bytes = added->content;
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

std::unique_ptr<Tokenizer> load_hf_tokenizer_json(const std::string& path) {
  const json j = parse_json_file(path, "tokenizer file");
  const std::string origin = "tokenizer.json '" + path + "'";
  DEW_USAGE_CHECK(j.is_object() && j.contains("model") && j["model"].is_object(), origin, " has no \"model\" object");
  const json& model = j["model"];
  const std::string mtype = model.value("type", std::string("BPE"));
  DEW_USAGE_CHECK(mtype == "BPE", origin, ": model type '", mtype,
                  "' is not supported (only byte-level BPE: model.type \"BPE\" with a ByteLevel pre-tokenizer)");
  auto empty_or_null = [&](const char* key) {
    if (!model.contains(key) || model[key].is_null()) return true;
    return model[key].is_string() && model[key].get<std::string>().empty();
  };
  DEW_USAGE_CHECK(empty_or_null("continuing_subword_prefix") && empty_or_null("end_of_word_suffix"), origin,
                  ": BPE with continuing_subword_prefix / end_of_word_suffix is not supported (only byte-level BPE)");
  DEW_USAGE_CHECK(!model.value("byte_fallback", false), origin,
                  ": BPE with byte_fallback (SentencePiece style) is not supported (only byte-level BPE)");
  const json normalizer = j.value("normalizer", json());
  DEW_USAGE_CHECK(normalizer.is_null(), origin, ": normalizer '", type_of(normalizer),
                  "' is not supported (only byte-level BPE without a normalizer)");
  const json pre = j.value("pre_tokenizer", json());
  const std::string pre_type = type_of(pre);
  DEW_USAGE_CHECK(pre_type == "ByteLevel", origin, ": pre-tokenizer '", pre_type,
                  "' is not supported (only ByteLevel, GPT-2's pattern)");
  DEW_USAGE_CHECK(pre.value("use_regex", true), origin,
                  ": a ByteLevel pre-tokenizer with use_regex false is not supported");
  const bool add_prefix_space = pre.value("add_prefix_space", false);
  const bool ignore_merges = model.value("ignore_merges", false);

  DEW_USAGE_CHECK(model.contains("vocab") && model["vocab"].is_object(), origin, " has no model.vocab object");
  DEW_USAGE_CHECK(model.contains("merges") && model["merges"].is_array(), origin, " has no model.merges array");

  std::vector<AddedToken> added;
  std::unordered_map<int64_t, size_t> added_at;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      DEW_USAGE_CHECK(a.is_object() && a.contains("id") && a["id"].is_number_integer() && a.contains("content") &&
                          a["content"].is_string(),
                      origin, ": an added_tokens entry lacks an integer id or a content string: ", a.dump());
      added_at[a["id"].get<int64_t>()] = added.size();
      added.push_back({a["id"].get<int32_t>(), a["content"].get<std::string>(), a.value("special", true)});
    }
  }

  VocabBuilder vb;
  vb.origin = origin;
  for (const auto& [mapped, idj] : model["vocab"].items()) {
    DEW_USAGE_CHECK(idj.is_number_integer(), origin, ": vocab entry '", mapped, "' is not an integer id");
    const int64_t id = idj.get<int64_t>();
    auto it = added_at.find(id);
    vb.add(mapped, id, it != added_at.end() && added[it->second].content == mapped ? &added[it->second] : nullptr);
  }
  for (const AddedToken& a : added) vb.add(a.content, a.id, &a);

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
  const int32_t eos = text::find_eos(by_name);
  return std::make_unique<BpeTokenizer>(std::move(vb.tokens), std::move(vb.present), std::move(merges),
                                        std::move(added), eos, add_prefix_space, ignore_merges, origin);
}

std::unique_ptr<Tokenizer> load_gpt2_vocab(const std::string& vocab_json, const std::string& merges_txt) {
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

void save_tokenizer_json(const Tokenizer& tokenizer, const std::string& path) {
  const auto* bpe = dynamic_cast<const BpeTokenizer*>(&tokenizer);
  DEW_USAGE_CHECK(bpe != nullptr, "save_tokenizer_json: the '", tokenizer.name(),
                  "' tokenizer has no tokenizer.json form (only BPE tokenizers do)");
  using ojson = nlohmann::ordered_json;
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
  const ojson byte_level = {{"type", "ByteLevel"},
                            {"add_prefix_space", bpe->add_prefix_space()},
                            {"trim_offsets", true},
                            {"use_regex", true}};
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
                {"ignore_merges", bpe->ignore_merges()},
                {"vocab", std::move(vocab)},
                {"merges", std::move(merges)}};
  const std::string out = j.dump(1) + "\n";
  text::write_file_atomic(path, out.data(), out.size());
}

}  // namespace dew
