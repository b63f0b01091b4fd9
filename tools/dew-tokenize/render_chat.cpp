// tools/dew-tokenize/render_chat.cpp — `dew-tokenize render-chat`: conversations -> rendered text.
//
//   dew-tokenize render-chat --tokenizer-config F --input conversations.jsonl --out rendered.jsonl
//                            [--add-generation-prompt] [--spans] [--show-template]
//
// F is a Hugging Face tokenizer_config.json (its chat_template, or chat_template.jinja beside it, and
// its special tokens), or a folder: its tokenizer_config.json, else its chat_template.jinja, else dew's
// default template (dew/chat_template.hpp). Each non-blank input line is a JSON object with "messages"
// (and optionally "tools" or any other variable the template reads); each output line is
// {"text": ...}, plus "assistant_spans": [[begin, end], ...] (byte offsets of the assistant turns,
// render_chat_with_spans) with --spans. The first line that fails to render stops the command with its
// line number and the template's message (exit status 2); the output is written atomically.
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>

#include "dew/chat_template.hpp"
#include "dew/error.hpp"

namespace fs = std::filesystem;

namespace {
dew::ChatConfig resolve(const std::string& config_path) {
  DEW_USAGE_CHECK(!config_path.empty(), "render-chat: --tokenizer-config is required");
  DEW_USAGE_CHECK(fs::exists(config_path), "render-chat: --tokenizer-config '", config_path, "' does not exist");
  dew::ChatConfig config =
      fs::is_directory(config_path) ? dew::chat_config_of_folder(config_path) : dew::read_chat_config(config_path);
  DEW_USAGE_CHECK(!config.chat_template.empty(), "render-chat: '", config_path,
                  "' has no chat_template (and no chat_template.jinja beside it)");
  return config;
}
}  // namespace

int show_chat_template(const std::string& config_path) {
  std::cout << resolve(config_path).chat_template;
  return 0;
}

int render_chat_main(const std::string& config_path, const std::string& input, const std::string& out,
                     bool add_generation_prompt, bool spans) {
  const dew::ChatConfig config = resolve(config_path);
  DEW_USAGE_CHECK(!input.empty(), "render-chat: --input is required");
  DEW_USAGE_CHECK(!out.empty(), "render-chat: --out is required");
  const dew::ChatTemplate tmpl(config.chat_template, config.template_origin);
  std::ifstream in(input, std::ios::binary);
  DEW_USAGE_CHECK(in.good(), "render-chat: cannot read --input '", input, "'");
  const std::string tmp = out + ".tmp";
  std::ofstream os(tmp, std::ios::binary | std::ios::trunc);
  DEW_USAGE_CHECK(os.good(), "render-chat: cannot write '", tmp, "'");
  std::string line;
  int64_t number = 0, rendered = 0;
  try {
    while (std::getline(in, line)) {
      ++number;
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      nlohmann::ordered_json o;
      if (spans) {
        const dew::RenderedChat r = dew::render_chat_with_spans(tmpl, config, line);
        o["text"] = r.text;
        o["assistant_spans"] = nlohmann::ordered_json::array();
        for (const auto& [b, e] : r.assistant_spans) o["assistant_spans"].push_back({b, e});
      } else {
        o["text"] = tmpl.render(dew::chat_context_json(config, line, add_generation_prompt)).text;
      }
      os << o.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      ++rendered;
    }
  } catch (const dew::Error& e) {
    os.close();
    fs::remove(tmp);
    throw dew::UsageError("render-chat: " + input + ":" + std::to_string(number) + ": " + e.what());
  }
  os.close();
  DEW_USAGE_CHECK(os.good(), "render-chat: writing '", tmp, "' failed");
  fs::rename(tmp, out);
  std::cout << "dew-tokenize: rendered " << rendered << " conversation(s) with " << config.template_origin << " -> "
            << out << "\n";
  return 0;
}
