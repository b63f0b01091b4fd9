// rewards.cpp — the reward functions the grpo plugin registers (registry kind "reward", dew/reward.hpp): verifiable
// checks against a record's reference answer, a format check and DAPO's overlong penalty. Each returns NaN ("not
// scored") where it has nothing to check against (no answer, no number in the answer).
//   accuracy      1 when the completion, trimmed of white space, equals the trimmed answer, else 0.
//   contains      1 when the answer occurs in the completion, else 0.
//   number_match  1 when the completion's final number equals the answer's (GSM8K / MATH style), else 0. A text's
//                 final number: the content of its last \boxed{...}, else what follows its last "####", else its last
//                 number anywhere; digits with an optional sign, decimal point and thousands commas ("1,234.5").
//                 Equal: |a - b| <= 1e-9 max(1, |b|).
//   format        1 when the completion matches [reward] format_pattern (std::regex, ECMAScript, searched: anchor it
//                 with ^ and $ for a whole-text match; '.' does not match a newline, [\s\S] does), else 0.
//   command       any program as a verifier (command_reward.cpp).
//   overlong      DAPO's soft overlong punishment over the completion's token count L (EOS not counted): 0 for
//                 L <= max - buffer, (max - buffer - L) / buffer up to max, -1 beyond ([reward] overlong_max_length,
//                 overlong_buffer).
#include <cmath>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <dew/reward.hpp>
#include <limits>
#include <optional>
#include <regex>
#include <string>
#include <vector>

namespace {

constexpr double kUnscored = std::numeric_limits<double>::quiet_NaN();

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n\f\v";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

// The last number in `s` (digits, optional sign, decimal point, thousands commas), if any.
std::optional<double> last_number(const std::string& s) {
  static const std::regex number(R"([-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+)");
  std::optional<double> out;
  for (auto it = std::sregex_iterator(s.begin(), s.end(), number); it != std::sregex_iterator(); ++it) {
    std::string digits;
    for (char c : it->str())
      if (c != ',') digits += c;
    out = std::strtod(digits.c_str(), nullptr);
  }
  return out;
}

// The text's final answer as a number: its last \boxed{...}, else after its last "####", else its last number.
std::optional<double> final_number(const std::string& s) {
  if (const size_t box = s.rfind("\\boxed{"); box != std::string::npos) {
    const size_t open = box + 7;
    int depth = 1;
    size_t end = open;
    for (; end < s.size() && depth > 0; ++end) depth += s[end] == '{' ? 1 : s[end] == '}' ? -1 : 0;
    if (depth == 0)
      if (auto n = last_number(s.substr(open, end - 1 - open))) return n;
  }
  if (const size_t hashes = s.rfind("####"); hashes != std::string::npos)
    if (auto n = last_number(s.substr(hashes + 4))) return n;
  return last_number(s);
}

class Accuracy final : public dew::Reward {
 public:
  std::vector<double> score(const std::vector<dew::Completion>& cs) override {
    std::vector<double> out;
    for (const auto& c : cs) out.push_back(c.answer.empty() ? kUnscored : trim(c.text) == trim(c.answer) ? 1.0 : 0.0);
    return out;
  }
};

class Contains final : public dew::Reward {
 public:
  std::vector<double> score(const std::vector<dew::Completion>& cs) override {
    std::vector<double> out;
    for (const auto& c : cs)
      out.push_back(c.answer.empty() ? kUnscored : c.text.find(c.answer) != std::string::npos ? 1.0 : 0.0);
    return out;
  }
};

class NumberMatch final : public dew::Reward {
 public:
  std::vector<double> score(const std::vector<dew::Completion>& cs) override {
    std::vector<double> out;
    for (const auto& c : cs) {
      const std::optional<double> want = final_number(c.answer);
      if (!want) {
        out.push_back(kUnscored);
        continue;
      }
      const std::optional<double> got = final_number(c.text);
      out.push_back(got && std::fabs(*got - *want) <= 1e-9 * std::max(1.0, std::fabs(*want)) ? 1.0 : 0.0);
    }
    return out;
  }
};

class Format final : public dew::Reward {
 public:
  explicit Format(const dew::Options& o) {
    const std::string pattern = o.get_string("format_pattern", "");
    DEW_USAGE_CHECK(!pattern.empty(), "reward 'format' needs [reward] format_pattern (a regular expression)");
    try {
      pattern_ = std::regex(pattern, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      throw dew::UsageError("option 'reward.format_pattern' is not a valid regular expression: " +
                            std::string(e.what()));
    }
  }
  std::vector<double> score(const std::vector<dew::Completion>& cs) override {
    std::vector<double> out;
    for (const auto& c : cs) out.push_back(std::regex_search(c.text, pattern_) ? 1.0 : 0.0);
    return out;
  }

 private:
  std::regex pattern_;
};

class Overlong final : public dew::Reward {
 public:
  explicit Overlong(const dew::Options& o) {
    max_ = o.get_int("overlong_max_length", 0);
    DEW_USAGE_CHECK(max_ > 0, "reward 'overlong' needs [reward] overlong_max_length > 0");
    buffer_ = o.get_int("overlong_buffer", std::max<int64_t>(1, max_ / 5));
    DEW_USAGE_CHECK(buffer_ > 0 && buffer_ <= max_, "option 'reward.overlong_buffer' must be in [1, ",
                    "overlong_max_length], got ", buffer_);
  }
  std::vector<double> score(const std::vector<dew::Completion>& cs) override {
    std::vector<double> out;
    for (const auto& c : cs) {
      const int64_t len = int64_t(c.tokens.size()), free = max_ - buffer_;
      out.push_back(len <= free ? 0.0 : len <= max_ ? double(free - len) / double(buffer_) : -1.0);
    }
    return out;
  }

 private:
  int64_t max_ = 0, buffer_ = 0;
};

template <class R>
dew::Component<dew::Reward> plain(const char* name, const char* description) {
  return {.name = name, .description = description, .factory = [](const dew::Options&) -> std::shared_ptr<dew::Reward> {
            return std::make_shared<R>();
          }};
}

}  // namespace

void register_command_reward(dew::Registrar& registrar);  // command_reward.cpp

// Called from grpo.cpp's DEW_PLUGIN body (one plugin entry point per library).
void register_grpo_rewards(dew::Registrar& registrar) {
  register_command_reward(registrar);
  registrar.add<dew::Reward>(plain<Accuracy>("accuracy", "1 when the trimmed completion equals the trimmed answer"));
  registrar.add<dew::Reward>(plain<Contains>("contains", "1 when the answer occurs in the completion"));
  registrar.add<dew::Reward>(plain<NumberMatch>(
      "number_match", "1 when the completion's final number (\\boxed{}, after ####, or last) equals the answer's"));
  registrar.add<dew::Reward>(
      {.name = "format",
       .description = "1 when the completion matches [reward] format_pattern (ECMAScript regex, searched)",
       .factory = [](const dew::Options& o) -> std::shared_ptr<dew::Reward> { return std::make_shared<Format>(o); },
       .options = {{"format_pattern", "", "the regular expression (required by this reward)"}}});
  registrar.add<dew::Reward>(
      {.name = "overlong",
       .description = "DAPO's soft overlong punishment: 0 up to max - buffer tokens, falling to -1 at max",
       .factory = [](const dew::Options& o) -> std::shared_ptr<dew::Reward> { return std::make_shared<Overlong>(o); },
       .options = {{"overlong_max_length", "", "L_max in tokens (required by this reward)"},
                   {"overlong_buffer", "", "the punishment window L_cache in tokens (default L_max / 5)"}}});
}
