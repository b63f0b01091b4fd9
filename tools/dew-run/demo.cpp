// tools/dew-run/demo.cpp — fits a two-layer MLP student to a random teacher network's labels.
//
// Everything runs through the public SDK: Philox-initialised nn::Linear blocks, autograd,
// the fused cross-entropy and the trainer's AdamW (dew::make_optimizer). It prints the loss and the training
// accuracy as it goes; a working core takes the accuracy well above chance (25 %).
#include "demo.hpp"

#include <chrono>
#include <cstdio>

#include "dew/autograd.hpp"
#include "dew/nn.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/train.hpp"

namespace dew_run {

int run_demo(const DemoOptions& opt) {
  using namespace dew;
  BackendPtr be = create_backend(opt.backend);
  set_default_backend(be);
  const int64_t n = 1024, in = 16, hidden = 64, classes = 4;

  // The teacher: a fixed random network; its argmax gives the labels.
  nn::Linear t1(in, 32), t2(32, classes);
  t1.initialize(opt.seed + 1000);
  t2.initialize(opt.seed + 1000);
  Tensor x = Tensor::normal({n, in}, 0.0f, 1.0f, opt.seed, 1, be);
  Tensor labels;
  {
    NoGradGuard no_grad;
    labels = argmax(t2.forward(t1.forward(x, Activation::relu)));
  }

  nn::Linear l1(in, hidden), l2(hidden, classes);
  l1.initialize(opt.seed);
  l2.initialize(opt.seed);
  NamedTensors params;
  for (auto& [name, t] : l1.named_parameters()) params.emplace_back("l1." + name, t);
  for (auto& [name, t] : l2.named_parameters()) params.emplace_back("l2." + name, t);
  Options optim({{"name", "adamw"}, {"weight_decay", "0"}}, "optim");
  std::shared_ptr<Optimizer> optimizer = make_optimizer(optim, params);

  std::printf("dew demo: %s backend, MLP %lld-%lld-%lld on %lld teacher-labelled points, AdamW\n", be->name().c_str(),
              (long long)in, (long long)hidden, (long long)classes, (long long)n);
  const auto start = std::chrono::steady_clock::now();
  double loss_value = 0.0, accuracy = 0.0;
  for (int step = 1; step <= opt.steps; ++step) {
    Tensor logits = l2.forward(l1.forward(x, Activation::relu));
    Tensor loss = cross_entropy(logits, labels);
    loss.backward();
    optimizer->update(1e-2f, 1.0f, step);
    for (auto& [name, p] : params) p.zero_grad();
    if (step == 1 || step % 50 == 0 || step == opt.steps) {
      loss_value = loss.item();
      const auto pred = argmax(logits.detach()).to_ints();
      const auto truth = labels.to_ints();
      int64_t hits = 0;
      for (size_t i = 0; i < pred.size(); ++i) hits += pred[i] == truth[i];
      accuracy = double(hits) / double(n);
      std::printf("step %4d  loss %.4f  train accuracy %.1f%%\n", step, loss_value, 100.0 * accuracy);
    }
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("done: %d steps in %.2f s (%.1f steps/s); final accuracy %.1f%% (chance is 25%%)\n", opt.steps, secs,
              opt.steps / secs, 100.0 * accuracy);
  return accuracy > 0.5 ? 0 : 1;
}

}  // namespace dew_run
