// tests/chat/test_chat.cpp — SFT data: the chat_jsonl source (plugins/data/chat_jsonl) and the lm
// objective's loss mask.
//
// The masks are checked against the conversations themselves, not against the span code: with dew's
// default template the tokens under mask 1 must decode to each assistant content + "<|im_end|>", in order;
// with the Llama 3 fixture template (no {% generation %} blocks: spans from prefix renderings) to each
// trimmed content + "<|eot_id|>"; all tokens together decode to the whole rendering. The lm loss on a
// batch must equal the cross-entropy, computed in double from the model's logits, over the assistant
// targets only.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/chat_template.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/tokenizer.hpp"
#include "temp_dir.hpp"

using dew::Tensor;
namespace fs = std::filesystem;

namespace {

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref"))
      reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "causal_transformer", "lm", "chat_jsonl"});
    return dew::create_backend("ref");
  }();
  dew::set_default_backend(be);
  return be;
}

using dew_test::TempDir;

struct Turn {
  std::string role, content;
};

std::string quote(const std::string& s) {
  std::string o = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') o += '\\';
    if (c == '\n') {
      o += "\\n";
      continue;
    }
    o += c;
  }
  return o + "\"";
}

std::string line_of(const std::vector<Turn>& turns) {
  std::string s = "{\"messages\": [";
  for (size_t i = 0; i < turns.size(); ++i)
    s += (i ? ", " : "") + std::string("{\"role\": ") + quote(turns[i].role) +
         ", \"content\": " + quote(turns[i].content) + "}";
  return s + "]}";
}

const std::vector<std::vector<Turn>> kConversations = {
    {{"user", "Tell me a fortune."}, {"assistant", "You will meet a tall stranger."}},
    {{"system", "Be terse."},
     {"user", "héllo 日本語"},
     {"assistant", "  Bonjour 🎉 "},
     {"user", "again?"},
     {"assistant", "Yes.\nTwice."}},
    {{"user", ""}, {"assistant", "Nothing asked, nothing said."}, {"user", "ok"}},
    {{"user", "a"}, {"assistant", "b"}, {"user", "c"}, {"assistant", "d e f"}},
};

std::string write_conversations(const fs::path& dir, const std::vector<std::vector<Turn>>& convs) {
  const fs::path p = dir / "chat.jsonl";
  std::ofstream out(p);
  for (const auto& c : convs) out << line_of(c) << "\n";
  return p.string();
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \n\t"), e = s.find_last_not_of(" \n\t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::shared_ptr<dew::DataSource> source(const std::map<std::string, std::string>& kv) {
  ref();
  return dew::Registry::global().create<dew::DataSource>("chat_jsonl", dew::Options(kv, "data"));
}

// Tokens under mask 1 and all tokens, decoded through token_bytes.
void decode_record(const dew::Record& r, const dew::Tokenizer& tok, int64_t n_real, std::string& trained,
                   std::string& all) {
  const int32_t* ids = r.at("text").as<int32_t>();
  const int32_t* mask = r.at("loss_mask").as<int32_t>();
  trained.clear();
  all.clear();
  for (int64_t j = 0; j < r.at("text").numel(); ++j) {
    if (mask[j]) trained += tok.token_bytes(ids[j]);
    if (j < n_real) all += tok.token_bytes(ids[j]);
  }
}

void check_masks(const std::string& tok_dir, const std::string& template_arg, bool llama3) {
  TempDir d(llama3 ? "llama3" : "default");
  const std::string path = write_conversations(d.path, kConversations);
  std::map<std::string, std::string> kv{{"path", path}, {"tokenizer", tok_dir}, {"seq_len", "400"}};
  if (!template_arg.empty()) kv["template"] = template_arg;
  auto src = source(kv);
  REQUIRE(src->size() == int64_t(kConversations.size()));
  auto tok = dew::load_tokenizer(tok_dir);
  const dew::ChatConfig cfg =
      template_arg.empty() ? dew::chat_config_of_folder(tok_dir) : dew::chat_config_of_folder(template_arg);
  const dew::ChatTemplate tmpl(cfg.chat_template);
  for (size_t i = 0; i < kConversations.size(); ++i) {
    const dew::Record r = src->get(int64_t(i));
    CHECK(r.at("text").shape == dew::Shape{401});
    const std::string rendering = tmpl.render(dew::chat_context_json(cfg, line_of(kConversations[i]), false)).text;
    std::string want;
    for (const Turn& t : kConversations[i])
      if (t.role == "assistant") want += llama3 ? trim(t.content) + "<|eot_id|>" : t.content + "<|im_end|>";
    // The real tokens: everything before the padding (mask 0, eos or 0).
    std::string trained, all;
    decode_record(r, *tok, 401, trained, all);
    CHECK(trained == want);
    CHECK(all.compare(0, rendering.size(), rendering) == 0);
    // Mask 0 on the padding.
    const int32_t* mask = r.at("loss_mask").as<int32_t>();
    int64_t ones = 0;
    for (int64_t j = 0; j < 401; ++j) ones += mask[j];
    if (tok->name() == "byte") CHECK(ones == int64_t(want.size()));
  }
}

std::string byte_folder(const fs::path& dir) {
  auto tok = dew::make_byte_tokenizer();
  dew::write_token_corpus(*tok, {"placeholder text for meta.json"}, (dir / "bytes").string(), 0.0);
  return (dir / "bytes").string();
}

std::string bpe_folder(const fs::path& dir) {
  std::string corpus;
  for (const auto& c : kConversations)
    for (const Turn& t : c) corpus += t.content + " <|im_start|>assistant\n<|im_end|>\n ";
  auto tok = dew::train_bpe({corpus, corpus}, 300);
  dew::write_token_corpus(*tok, {corpus}, (dir / "bpe").string(), 0.0);
  return (dir / "bpe").string();
}

// A Llama 3 style tokenizer.json: the 256 bytes (GPT-2's byte-to-unicode spelling), no merges, the
// header and turn tokens as added tokens (256..259), and a TemplateProcessing post-processor that
// starts every encode() with <|begin_of_text|> (256).
std::string mapped_byte(unsigned char b) {
  uint32_t cp = b;
  auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE; };
  if (!printable(b)) {
    uint32_t n = 256;
    for (int c = 0; c < b; ++c) n += !printable(c);
    cp = n;
  }
  std::string out;
  if (cp < 0x80) {
    out += char(cp);
  } else {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  }
  return out;
}

std::string llama3_folder(const fs::path& dir) {
  std::string vocab;
  for (int b = 0; b < 256; ++b)
    vocab += (b ? ", " : "") + quote(mapped_byte((unsigned char)b)) + ": " + std::to_string(b);
  const char* added[] = {"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"};
  std::string at;
  for (int i = 0; i < 4; ++i)
    at += std::string(i ? ", " : "") + R"({"id": )" + std::to_string(256 + i) + R"(, "content": ")" + added[i] +
          R"(", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false, "special": true})";
  const std::string json =
      R"({"version": "1.0", "truncation": null, "padding": null, "added_tokens": [)" + at +
      R"(], "normalizer": null, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split", "pattern": {"Regex": )" +
      quote(
          R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)") +
      R"(}, "behavior": "Isolated", "invert": false}, {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]}, )"
      R"("post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<|begin_of_text|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<|begin_of_text|>": {"id": "<|begin_of_text|>", "ids": [256], "tokens": ["<|begin_of_text|>"]}}}, )"
      R"("decoder": {"type": "ByteLevel"}, "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null, "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false, "ignore_merges": true, "vocab": {)" +
      vocab + R"(}, "merges": []}})";
  const fs::path raw = dir / "llama3-tokenizer.json";
  { std::ofstream(raw) << json; }
  auto tok = dew::load_hf_tokenizer_json(raw.string());
  dew::write_token_corpus(*tok, {"placeholder"}, (dir / "llama3tok").string(), 0.0);
  return (dir / "llama3tok").string();
}

}  // namespace

TEST_CASE("chat_jsonl: only assistant tokens carry mask 1 (default template, byte and BPE tokenizers)") {
  TempDir d("toks");
  check_masks(byte_folder(d.path), "", false);
  check_masks(bpe_folder(d.path), "", false);
}

TEST_CASE("chat_jsonl: spans from prefix renderings (the Llama 3 template, no generation blocks)") {
  TempDir d("toks3");
  check_masks(byte_folder(d.path), std::string(DEW_CHAT_FIXTURES) + "/llama3", true);
}

TEST_CASE("chat_jsonl: refusals name the line and val_count splits the head") {
  TempDir d("bad");
  const std::string bytes = byte_folder(d.path);
  const std::string path = write_conversations(d.path, kConversations);
  auto err = [&](std::map<std::string, std::string> kv) -> std::string {
    try {
      source(kv);
    } catch (const dew::Error& e) {
      CHECK(e.kind() == dew::ErrorKind::usage);
      return e.what();
    }
    FAIL("no error");
    return "";
  };
  CHECK(err({{"path", path}, {"tokenizer", bytes}, {"seq_len", "20"}}).find("chat.jsonl:1: the conversation is") !=
        std::string::npos);
  { std::ofstream(d.path / "noassistant.jsonl") << line_of({{"user", "hi"}}) << "\n"; }
  CHECK(err({{"path", (d.path / "noassistant.jsonl").string()}, {"tokenizer", bytes}, {"seq_len", "100"}})
            .find("noassistant.jsonl:1: the conversation has no assistant token") != std::string::npos);
  CHECK(err({{"path", path}, {"tokenizer", bytes}, {"seq_len", "100"}, {"split", "val"}}).find("val_count") !=
        std::string::npos);
  // Conversation 2 is longer than 121 bytes: refused, or cut on request.
  CHECK(err({{"path", path}, {"tokenizer", bytes}, {"seq_len", "120"}}).find("chat.jsonl:2: the conversation is") !=
        std::string::npos);
  auto cut = source({{"path", path}, {"tokenizer", bytes}, {"seq_len", "120"}, {"truncate", "true"}});
  CHECK(cut->size() == 4);
  auto val = source({{"path", path}, {"tokenizer", bytes}, {"seq_len", "400"}, {"val_count", "1"}, {"split", "val"}});
  auto train = source({{"path", path}, {"tokenizer", bytes}, {"seq_len", "400"}, {"val_count", "1"}});
  CHECK(val->size() == 1);
  CHECK(train->size() == 3);
  CHECK(val->identity() != train->identity());
}

TEST_CASE("lm objective on chat data: the loss is the cross-entropy of the assistant targets only") {
  TempDir d("lm");
  const std::string bytes = byte_folder(d.path);
  const std::string path = write_conversations(d.path, kConversations);
  dew::Config cfg = dew::Config::parse_ini(
      "[objective]\nplugin = lm\nsample_tokens = 0\n"
      "[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 1\nn_heads = 2\n"
      "[data]\nsource = chat_jsonl\nseq_len = 120\nbatch_size = 4\npath = " +
      path + "\ntokenizer = " + bytes + "\ntruncate = true\n");
  auto src = source({{"path", path}, {"tokenizer", bytes}, {"seq_len", "120"}, {"truncate", "true"}});
  auto obj = dew::Registry::global().create<dew::Objective>("lm", cfg.section("objective"));
  dew::ObjectiveContext ctx{&cfg, ref(), 3, src.get()};
  obj->build(ctx);
  CHECK(cfg.section("model").values().at("vocab_size") == "256");
  std::vector<int32_t> text, mask;
  for (int64_t i = 0; i < 4; ++i) {
    const dew::Record r = src->get(i);
    text.insert(text.end(), r.at("text").as<int32_t>(), r.at("text").as<int32_t>() + 121);
    mask.insert(mask.end(), r.at("loss_mask").as<int32_t>(), r.at("loss_mask").as<int32_t>() + 121);
  }
  dew::Batch batch{{"text", Tensor::from_ints(text, {4, 121}, ref())},
                   {"loss_mask", Tensor::from_ints(mask, {4, 121}, ref())}};
  const dew::StepResult r = obj->step(batch, {0, 0, 3});
  // The same logits, then the cross-entropy in double over the targets whose mask is 1.
  std::vector<int32_t> inputs;
  for (int64_t b = 0; b < 4; ++b) inputs.insert(inputs.end(), text.begin() + b * 121, text.begin() + b * 121 + 120);
  dew::NoGradGuard no_grad;
  const std::vector<float> logits =
      obj->main_model()->forward({{"tokens", Tensor::from_ints(inputs, {4, 120}, ref())}}).to_floats();
  double nats = 0;
  int64_t counted = 0, unmasked_loss_differs = 0;
  double all_nats = 0;
  for (int64_t b = 0; b < 4; ++b)
    for (int64_t j = 0; j < 120; ++j) {
      const float* l = logits.data() + (b * 120 + j) * 256;
      double mx = l[0];
      for (int v = 1; v < 256; ++v) mx = std::max<double>(mx, l[v]);
      double z = 0;
      for (int v = 0; v < 256; ++v) z += std::exp(double(l[v]) - mx);
      const double ce = std::log(z) + mx - double(l[text[size_t(b * 121 + j + 1)]]);
      all_nats += ce;
      if (mask[size_t(b * 121 + j + 1)]) {
        nats += ce;
        ++counted;
      }
    }
  REQUIRE(counted > 0);
  CHECK(counted < 4 * 120);
  CHECK(r.loss.item() == doctest::Approx(nats / double(counted)).epsilon(1e-5));
  CHECK(r.device_tokens.item() == double(counted));
  unmasked_loss_differs = std::fabs(all_nats / 480.0 - nats / double(counted)) > 1e-4;
  CHECK(unmasked_loss_differs);  // the mask changes the loss: the check above can fail
}

TEST_CASE("chat_jsonl pack = true: rows of whole conversations, the lm loss equals the unpacked batch's") {
  TempDir d("pack");
  const std::string bytes = byte_folder(d.path);
  const std::string path = write_conversations(d.path, kConversations);
  const int64_t seq = 400, n = seq + 1;
  const std::map<std::string, std::string> kv{{"path", path}, {"tokenizer", bytes}, {"seq_len", std::to_string(seq)}};
  auto plain = source(kv);
  auto with = kv;
  with["pack"] = "true";
  auto packed = source(with);
  const int64_t convs = plain->size();
  REQUIRE(convs == int64_t(kConversations.size()));
  REQUIRE(packed->size() < convs);  // conversations share rows
  CHECK(packed->identity() != plain->identity());
  // The packed rows hold the conversations' tokens in order, whole; segments number them, positions restart.
  std::vector<int32_t> unpacked_tokens, packed_tokens;
  int64_t first_tokens = 0;
  for (int64_t i = 0; i < convs; ++i) {  // each conversation without its padding (the eos byte 0xFF: not UTF-8 text)
    const dew::Record r = plain->get(i);
    const int32_t* t = r.at("text").as<int32_t>();
    int64_t len = n;
    while (len > 0 && t[len - 1] == 255) --len;
    unpacked_tokens.insert(unpacked_tokens.end(), t, t + len);
  }
  std::vector<int32_t> text, mask, seg, pos;
  for (int64_t i = 0; i < packed->size(); ++i) {
    const dew::Record r = packed->get(i);
    const int32_t* s = r.at("text_segment_ids").as<int32_t>();
    const int32_t* p = r.at("text_positions").as<int32_t>();
    const int32_t* t = r.at("text").as<int32_t>();
    const int32_t* m = r.at("loss_mask").as<int32_t>();
    int32_t last = 0;
    for (int64_t j = 0; j < n; ++j) {
      if (s[j] != 0) {
        CHECK((s[j] == last || s[j] == last + 1));  // segments 1, 2, ... in order, padding only at the end
        if (s[j] != last) {
          CHECK(p[j] == 0);
          CHECK(m[j] == 0);  // a conversation's first token is never a target
          ++first_tokens;
        } else {
          CHECK(p[j] == p[j - 1] + 1);
        }
        last = s[j];
        packed_tokens.push_back(t[j]);
      } else {
        CHECK(m[j] == 0);
      }
    }
    text.insert(text.end(), t, t + n);
    mask.insert(mask.end(), m, m + n);
    seg.insert(seg.end(), s, s + n);
    pos.insert(pos.end(), p, p + n);
  }
  CHECK(first_tokens == convs);
  CHECK(packed_tokens == unpacked_tokens);
  // The lm objective: the packed batch's loss and scored tokens equal the unpacked batch's (all conversations).
  dew::Config cfg = dew::Config::parse_ini(
      "[objective]\nplugin = lm\nsample_tokens = 0\n"
      "[model]\nplugin = causal_transformer\ndim = 16\nn_layers = 2\nn_heads = 2\n"
      "[data]\nsource = chat_jsonl\nseq_len = 400\nbatch_size = 4\npath = " +
      path + "\ntokenizer = " + bytes + "\n");
  auto obj = dew::Registry::global().create<dew::Objective>("lm", cfg.section("objective"));
  dew::ObjectiveContext ctx{&cfg, ref(), 3, plain.get()};
  obj->build(ctx);
  std::vector<int32_t> ptext, pmask;
  for (int64_t i = 0; i < convs; ++i) {
    const dew::Record r = plain->get(i);
    ptext.insert(ptext.end(), r.at("text").as<int32_t>(), r.at("text").as<int32_t>() + n);
    pmask.insert(pmask.end(), r.at("loss_mask").as<int32_t>(), r.at("loss_mask").as<int32_t>() + n);
  }
  const dew::StepResult unpacked = obj->step({{"text", Tensor::from_ints(ptext, {convs, n}, ref())},
                                              {"loss_mask", Tensor::from_ints(pmask, {convs, n}, ref())}},
                                             {0, 0, 3});
  const int64_t rows = packed->size();
  const dew::StepResult packed_step = obj->step({{"text", Tensor::from_ints(text, {rows, n}, ref())},
                                                 {"loss_mask", Tensor::from_ints(mask, {rows, n}, ref())},
                                                 {"text_segment_ids", Tensor::from_ints(seg, {rows, n}, ref())},
                                                 {"text_positions", Tensor::from_ints(pos, {rows, n}, ref())}},
                                                {0, 0, 3});
  CHECK(packed_step.device_tokens.item() == unpacked.device_tokens.item());
  CHECK(packed_step.loss.item() == doctest::Approx(unpacked.loss.item()).epsilon(1e-9));  // measured: equal
  // Without the segments (the rows as plain text) the loss differs: the check above can fail.
  const dew::StepResult unsegmented = obj->step(
      {{"text", Tensor::from_ints(text, {rows, n}, ref())}, {"loss_mask", Tensor::from_ints(mask, {rows, n}, ref())}},
      {0, 0, 3});
  const double base = unpacked.loss.item();
  MESSAGE("relative difference to the unpacked loss: packed " << std::fabs(packed_step.loss.item() - base) / base
                                                              << ", unsegmented "
                                                              << std::fabs(unsegmented.loss.item() - base) / base);
  CHECK(std::fabs(unsegmented.loss.item() - base) > 1e-6 * base);  // measured 9.3e-6
}

TEST_CASE("chat_jsonl: a post-processor BOS is not doubled when the template writes bos_token") {
  TempDir d("bos");
  const std::string tok_dir = llama3_folder(d.path);
  auto tok = dew::load_tokenizer(tok_dir);
  REQUIRE(tok->encode("") == std::vector<int32_t>{256});
  const std::string path = write_conversations(d.path, kConversations);
  // The Llama 3 template writes "<|begin_of_text|>" itself: one 256, from the text, and the turn markers
  // as single added tokens. Masked tokens decode to the trimmed contents and "<|eot_id|>".
  const std::string llama3 = std::string(DEW_CHAT_FIXTURES) + "/llama3";
  check_masks(tok_dir, llama3, true);
  auto src = source({{"path", path}, {"tokenizer", tok_dir}, {"template", llama3}, {"seq_len", "400"}});
  const dew::Record r = src->get(0);
  const int32_t* ids = r.at("text").as<int32_t>();
  CHECK(ids[0] == 256);
  CHECK(ids[1] == 257);  // <|start_header_id|>
  int64_t bos = 0;
  for (int64_t j = 0; j < 401; ++j) bos += ids[j] == 256;
  CHECK(bos == 1);
  // dew's default template writes no BOS: the post-processor's comes first, once.
  auto plain = source({{"path", path}, {"tokenizer", tok_dir}, {"template", d.path.string()}, {"seq_len", "400"}});
  const dew::Record p = plain->get(0);
  CHECK(p.at("text").as<int32_t>()[0] == 256);
  CHECK(p.at("text").as<int32_t>()[1] == int32_t('<'));
  CHECK(p.at("loss_mask").as<int32_t>()[0] == 0);
}
