// examples/reward_plugin/similarity.cpp — the whole plugin: reward 'similarity', a dense score for GRPO
// (docs/training.md "GRPO") when an exact match is too rare to learn from: 1 - d / max(|c|, |a|, 1) with d the
// Levenshtein distance between the completion c and the record's answer a, both trimmed of surrounding white space
// (bytes; optionally case-folded ASCII). 1 for an exact match, 0 for nothing in common; NaN (not scored) for a record
// without an answer.
// Options ([reward]): similarity_ignore_case (false).
#include <algorithm>
#include <cctype>
#include <cmath>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <dew/reward.hpp>
#include <limits>
#include <memory>
#include <string>
#include <vector>

namespace {

std::string normalised(const std::string& s, bool ignore_case) {
  const char* ws = " \t\r\n";
  const size_t a = s.find_first_not_of(ws);
  std::string t = a == std::string::npos ? "" : s.substr(a, s.find_last_not_of(ws) - a + 1);
  if (ignore_case)
    for (char& c : t) c = char(std::tolower(static_cast<unsigned char>(c)));
  return t;
}

// Edit distance (insertions, deletions, substitutions of one byte each), two rows.
size_t levenshtein(const std::string& x, const std::string& y) {
  std::vector<size_t> prev(y.size() + 1), cur(y.size() + 1);
  for (size_t j = 0; j <= y.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= x.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= y.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x[i - 1] == y[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[y.size()];
}

class Similarity final : public dew::Reward {
 public:
  explicit Similarity(const dew::Options& o) : ignore_case_(o.get_bool("similarity_ignore_case", false)) {}

  std::vector<double> score(const std::vector<dew::Completion>& completions) override {
    std::vector<double> out;
    for (const dew::Completion& c : completions) {
      if (c.answer.empty()) {
        out.push_back(std::numeric_limits<double>::quiet_NaN());
        continue;
      }
      const std::string x = normalised(c.text, ignore_case_), y = normalised(c.answer, ignore_case_);
      const size_t longest = std::max<size_t>({x.size(), y.size(), 1});
      out.push_back(1.0 - double(levenshtein(x, y)) / double(longest));
    }
    return out;
  }

 private:
  bool ignore_case_;
};

}  // namespace

DEW_PLUGIN("similarity_reward", "0.1.0") {
  registrar.add<dew::Reward>(
      {.name = "similarity",
       .description = "1 - Levenshtein distance / length between the trimmed completion and answer (dense)",
       .factory = [](const dew::Options& o) -> std::shared_ptr<dew::Reward> { return std::make_shared<Similarity>(o); },
       .options = {{"similarity_ignore_case", "false", "compare ASCII letters case-folded"}}});
}
