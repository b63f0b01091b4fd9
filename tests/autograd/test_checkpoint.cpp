// tests/autograd/test_checkpoint.cpp — activation recomputation (dew::checkpoint, recompute_block):
// outputs and gradients bit-identical to the plain graph (dropout keyed by captured integers, linear's
// activation epilogue, a block input used twice, a second input), on ref and cpu; fewer bytes held
// between forward and backward; the leaf-ready hook (data-parallel bucketing) reports each parameter once
// with its complete gradient; an undeclared parameter is refused; no recording without gradients.
#include <cstring>
#include <set>

#include "gradcheck.hpp"

using dew::Tensor;
using gc::DType;

namespace {

dew::BackendPtr backend(const std::string& name) {
  gc::ref();  // loads the plugins
  static dew::BackendPtr cpu = dew::create_backend("cpu");
  return name == "cpu" ? cpu : gc::ref();
}

bool same_bits(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) return a.defined() == b.defined();
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) return false;
  std::vector<unsigned char> x(a.nbytes()), y(b.nbytes());
  a.copy_to_host(x.data());
  b.copy_to_host(y.data());
  return x == y;
}

// A residual block with everything recomputation must reproduce: an activation epilogue (a no-grad-only
// fused path in linear), dropout keyed by (seed, step), the input used twice and a second input.
struct Block {
  Tensor w1, b1, w2;
  uint64_t seed = 5, step = 3;
  Tensor operator()(const Tensor& x, const Tensor& c) const {
    Tensor h = dew::linear(dew::add(x, c), w1, b1, dew::Activation::gelu_tanh);
    h = dew::dropout(h, 0.25f, seed, 0x1234 + step, 0);
    return dew::add(x, dew::linear(h, w2));
  }
  std::vector<Tensor> params() const { return {w1, b1, w2}; }
};

Block make_block(const dew::BackendPtr& be, uint64_t s, int64_t d) {
  Block b;
  b.w1 = Tensor::normal({2 * d, d}, 0, 0.3f, 9, s * 3 + 0, be).set_requires_grad();
  b.b1 = Tensor::normal({2 * d}, 0, 0.1f, 9, s * 3 + 1, be).set_requires_grad();
  b.w2 = Tensor::normal({d, 2 * d}, 0, 0.3f, 9, s * 3 + 2, be).set_requires_grad();
  b.step = s;
  return b;
}

struct Run {
  Tensor loss, x0_grad, c_grad;
  std::vector<Tensor> grads;
  int64_t held_after_forward = 0;  // bytes in use between forward and backward, beyond the start
};

// 4 blocks on x0 (a leaf) with a shared conditioning input c = 2 * c0; loss = sum(y * R).
Run run(const dew::BackendPtr& be, bool recompute) {
  const int64_t d = 16;
  std::vector<Block> blocks;
  for (uint64_t s = 0; s < 4; ++s) blocks.push_back(make_block(be, s, d));
  Tensor x0 = Tensor::normal({8, d}, 0, 1, 1, 100, be).set_requires_grad();
  Tensor c0 = Tensor::normal({8, d}, 0, 1, 1, 101, be).set_requires_grad();
  const Tensor r = Tensor::normal({8, d}, 0, 1, 1, 102, be);
  const int64_t base = be->memory_stats().in_use;
  Run out;
  {
    Tensor c = dew::scale(c0, 2.0f);
    Tensor x = dew::mul(x0, x0);  // a non-leaf block input
    for (const Block& b : blocks) {
      const Block* bp = &b;
      auto fn = [bp](const std::vector<Tensor>& in) { return (*bp)(in[0], in[1]); };
      x = recompute ? dew::checkpoint(fn, {x, c}, b.params()) : fn({x, c});
    }
    out.loss = dew::sum(dew::mul(x, r));
    out.held_after_forward = be->memory_stats().in_use - base;
  }
  out.loss.backward();
  out.x0_grad = x0.grad();
  out.c_grad = c0.grad();
  for (const Block& b : blocks)
    for (const Tensor& p : b.params()) out.grads.push_back(p.grad());
  return out;
}

}  // namespace

TEST_CASE("checkpoint: the loss and every gradient are bit-identical to the plain graph (ref, cpu)") {
  for (const char* name : {"ref", "cpu"}) {
    CAPTURE(name);
    const dew::BackendPtr be = backend(name);
    const Run plain = run(be, false), ckpt = run(be, true);
    CHECK(same_bits(plain.loss, ckpt.loss));
    CHECK(same_bits(plain.x0_grad, ckpt.x0_grad));
    CHECK(same_bits(plain.c_grad, ckpt.c_grad));
    REQUIRE(plain.grads.size() == ckpt.grads.size());
    for (size_t i = 0; i < plain.grads.size(); ++i) {
      CAPTURE(i);
      REQUIRE(plain.grads[i].defined());
      CHECK(same_bits(plain.grads[i], ckpt.grads[i]));
    }
    // What the graph holds between forward and backward: every block's intermediates vs their inputs.
    CHECK(ckpt.held_after_forward < plain.held_after_forward / 2);
  }
}

TEST_CASE("checkpoint: a changed dropout key is noticed (the comparison can fail)") {
  const dew::BackendPtr be = backend("ref");
  Block b = make_block(be, 1, 8);
  Tensor x = Tensor::normal({4, 8}, 0, 1, 1, 7, be).set_requires_grad();
  const Tensor c = Tensor::zeros({4, 8}, DType::f32, be);
  const Tensor y1 = b(x, c);
  b.step = 2;
  const Tensor y2 = dew::checkpoint([&b](const std::vector<Tensor>& in) { return b(in[0], in[1]); }, {x, c},
                                    b.params());
  CHECK_FALSE(same_bits(y1, y2));
}

TEST_CASE("checkpoint: the leaf-ready hook reports each parameter once, with its whole gradient") {
  const dew::BackendPtr be = backend("ref");
  Block b1 = make_block(be, 0, 8), b2 = make_block(be, 1, 8);
  Tensor x = Tensor::normal({4, 8}, 0, 1, 1, 7, be).set_requires_grad();
  const Tensor c = Tensor::zeros({4, 8}, DType::f32, be);
  auto f1 = [&b1](const std::vector<Tensor>& in) { return b1(in[0], in[1]); };
  auto f2 = [&b2](const std::vector<Tensor>& in) { return b2(in[0], in[1]); };
  Tensor y = dew::checkpoint(f2, {dew::checkpoint(f1, {x, c}, b1.params()), c}, b2.params());
  std::vector<std::pair<dew::TensorImpl*, Tensor>> reported;  // the leaf and a copy of its .grad then
  dew::run_backward(dew::sum(y), Tensor::full({1}, 1.0, DType::f32, be),
                    [&](const Tensor& leaf) { reported.push_back({leaf.impl(), leaf.grad().clone()}); });
  std::set<dew::TensorImpl*> seen;
  for (const auto& [impl, g] : reported) CHECK(seen.insert(impl).second);  // once each
  std::vector<Tensor> leaves = b1.params();
  for (const Tensor& p : b2.params()) leaves.push_back(p);
  leaves.push_back(x);
  CHECK(reported.size() == leaves.size());
  for (const Tensor& p : leaves) {
    bool found = false;
    for (const auto& [impl, g] : reported)
      if (impl == p.impl()) {
        found = true;
        CHECK(same_bits(g, p.grad()));  // complete when reported
      }
    CHECK(found);
  }
}

TEST_CASE("checkpoint: a parameter the block uses but does not declare is refused in the backward") {
  const dew::BackendPtr be = backend("ref");
  Block b = make_block(be, 0, 8);
  Tensor x = Tensor::normal({4, 8}, 0, 1, 1, 7, be).set_requires_grad();
  const Tensor c = Tensor::zeros({4, 8}, DType::f32, be);
  Tensor y = dew::checkpoint([&b](const std::vector<Tensor>& in) { return b(in[0], in[1]); }, {x, c},
                             {b.w1, b.b1});  // w2 left out
  CHECK_THROWS_WITH_AS(dew::sum(y).backward(), doctest::Contains("list every parameter the block uses"),
                       dew::Error);
}

TEST_CASE("checkpoint and recompute_block without gradients, and the thread's mode") {
  const dew::BackendPtr be = backend("ref");
  Block b = make_block(be, 0, 8);
  const Tensor x = Tensor::normal({4, 8}, 0, 1, 1, 7, be).set_requires_grad();
  const Tensor c = Tensor::zeros({4, 8}, DType::f32, be);
  int calls = 0;
  auto fn = [&](const std::vector<Tensor>& in) {
    ++calls;
    return b(in[0], in[1]);
  };
  {
    dew::NoGradGuard no_grad;
    const Tensor y = dew::checkpoint(fn, {x, c}, b.params());
    CHECK(y.impl()->grad_fn == nullptr);
  }
  CHECK(dew::recompute_mode() == dew::Recompute::none);
  calls = 0;
  Tensor plain = dew::recompute_block(fn, {x, c}, b.params());
  CHECK(plain.impl()->grad_fn != nullptr);
  CHECK(std::string(plain.impl()->grad_fn->name) != "recompute_block");
  {
    dew::RecomputeGuard blocks(dew::Recompute::blocks);
    CHECK(dew::recompute_mode() == dew::Recompute::blocks);
    Tensor y = dew::recompute_block(fn, {x, c}, b.params());
    REQUIRE(y.impl()->grad_fn != nullptr);
    CHECK(std::string(y.impl()->grad_fn->name) == "recompute_block");
    calls = 0;
    dew::sum(y).backward();
    CHECK(calls == 1);  // recomputed once in the backward
  }
  CHECK(dew::recompute_mode() == dew::Recompute::none);
  CHECK(dew::recompute_from_name("blocks") == dew::Recompute::blocks);
  CHECK_THROWS_WITH_AS(dew::recompute_from_name("layers"), doctest::Contains("none or blocks"), dew::UsageError);
}
