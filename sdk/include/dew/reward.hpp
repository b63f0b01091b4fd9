// dew/reward.hpp — reward functions (registry kind "reward"): what scores a policy's completions in RL objectives
// (grpo; docs/training.md "GRPO").
//
// A reward sees every completion of a batch at once (a reward that calls a verifier or a reward model batches its
// work) and returns one score each, in order. NaN means "not scored by this function" (TRL's None: a math reward on a
// code prompt): the objective's weighted sum over its reward functions skips it. A reward is created once per run
// with the [reward] section's options (the keys its Component lists) and may keep state, but its scores must depend
// only on its inputs for a resumed run to equal a straight one.
// The grpo plugin registers accuracy, contains, number_match, format, overlong and command (a program as verifier);
// a plugin adds more:
//   registrar.add<dew::Reward>({.name = "mine", .description = "...",
//       .factory = [](const dew::Options& o) { return std::make_shared<MyReward>(o); }});
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace dew {

struct Completion {
  std::string prompt;           // the prompt's text (a message prompt rendered with the chat template)
  std::string text;             // the completion's text (without the EOS token; "" without a tokenizer)
  std::vector<int32_t> tokens;  // the completion's token ids (without EOS)
  std::string answer;           // the record's reference answer ("" when the data has none)
  std::string finish_reason;    // "eos" | "length"
};

class Reward {
 public:
  static constexpr const char* kind = "reward";
  virtual ~Reward() = default;
  // One score per completion, in order (NaN: not scored by this function).
  virtual std::vector<double> score(const std::vector<Completion>& completions) = 0;
};

}  // namespace dew
