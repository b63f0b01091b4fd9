// tests/autograd/test_shape_linalg.cpp — gradient checks of views, copies, reductions, matmul and linear.
#include "gradcheck.hpp"

using namespace gc;
using dew::Tensor;
using V = std::vector<Tensor>;

TEST_CASE("gradcheck reshape") {
  gradcheck([](const V& x) { return dew::reshape(x[0], {6, -1}); }, {rnd({2, 3, 4}, 1)}, "reshape");
  gradcheck(
      [](const V& x) {
        return x[0].reshape({4, 6}) * x[0].reshape({4, 6});
      },
      {rnd({2, 3, 4}, 2)}, "Tensor::reshape used twice");
}

TEST_CASE("gradcheck permute and transpose") {
  gradcheck([](const V& x) { return dew::permute(x[0], {2, 0, 1}); }, {rnd({2, 3, 4}, 3)}, "permute {2,0,1}");
  gradcheck([](const V& x) { return dew::permute(x[0], {1, 3, 0, 2}); }, {rnd({2, 3, 2, 3}, 4)}, "permute 4-d");
  gradcheck([](const V& x) { return dew::transpose(x[0], 0, 2); }, {rnd({2, 3, 4}, 5)}, "transpose 0,2");
  gradcheck([](const V& x) { return dew::transpose(x[0], -1, -2); }, {rnd({2, 3, 4}, 6)}, "transpose -1,-2");
}

TEST_CASE("gradcheck slice") {
  gradcheck([](const V& x) { return dew::slice(x[0], 0, 1, 3); }, {rnd({4, 3}, 7)}, "slice axis 0 (a view)");
  gradcheck([](const V& x) { return dew::slice(x[0], 1, 1, 3); }, {rnd({2, 4, 3}, 8)}, "slice axis 1");
  gradcheck([](const V& x) { return dew::slice(x[0], -1, 0, 2); }, {rnd({2, 4, 3}, 9)}, "slice axis -1");
  gradcheck([](const V& x) { return x[0].slice0(1, 2) * dew::slice(x[0], 0, 0, 1); }, {rnd({3, 4}, 10)},
            "two slices of one tensor");
  gradcheck([](const V& x) { return dew::slice(dew::slice(x[0], 1, 1, 4), 0, 1, 2); }, {rnd({3, 5}, 11)},
            "slice of a slice");
  gradcheck([](const V& x) { return dew::exp(x[0].slice0(1, 4).slice0(1, 3).reshape({-1})); }, {rnd({5, 2}, 28)},
            "slice0 of a slice0 view, reshaped");
}

TEST_CASE("gradcheck concat") {
  gradcheck(
      [](const V& x) {
        return dew::concat({x[0], x[1], x[2]}, 1);
      },
      {rnd({2, 1, 3}, 12), rnd({2, 3, 3}, 13), rnd({2, 2, 3}, 14)}, "concat axis 1");
  gradcheck(
      [](const V& x) {
        return dew::concat({x[0], x[1]}, 0);
      },
      {rnd({1, 4}, 15), rnd({2, 4}, 16)}, "concat axis 0");
  gradcheck(
      [](const V& x) {
        return dew::concat({x[0], x[0]}, -1);
      },
      {rnd({2, 3}, 17)}, "concat of a tensor with itself");
  gradcheck(
      [](const V& x) {
        return dew::concat({x[0], dew::slice(x[1], 1, 0, 0), x[1]}, 1);
      },
      {rnd({2, 3}, 29), rnd({2, 2}, 30)}, "concat with an empty piece");
}

TEST_CASE("gradcheck broadcast_to and sum_to") {
  gradcheck(
      [](const V& x) {
        return dew::broadcast_to(x[0], {2, 3, 4});
      },
      {rnd({3, 1}, 18)}, "broadcast_to [3,1]->[2,3,4]");
  gradcheck([](const V& x) { return dew::broadcast_to(x[0], {2, 3}); }, {rnd({3}, 19)}, "broadcast_to [3]->[2,3]");
  gradcheck([](const V& x) { return dew::sum_to(x[0], {3, 1}); }, {rnd({2, 3, 4}, 20)}, "sum_to [2,3,4]->[3,1]");
  gradcheck([](const V& x) { return dew::sum_to(x[0], {1, 4}); }, {rnd({3, 4}, 21)}, "sum_to [3,4]->[1,4]");
}

TEST_CASE("gradcheck sum and mean") {
  for (int axis : {0, 1, 2, -1}) {
    for (bool keep : {false, true}) {
      const std::string tag = " axis " + std::to_string(axis) + (keep ? " keepdim" : "");
      gradcheck([axis, keep](const V& x) { return dew::sum(x[0], axis, keep); }, {rnd({2, 3, 4}, 22)}, "sum" + tag);
      gradcheck([axis, keep](const V& x) { return dew::mean(x[0], axis, keep); }, {rnd({2, 3, 4}, 23)}, "mean" + tag);
    }
  }
  gradcheck([](const V& x) { return dew::sum(x[0]); }, {rnd({2, 3, 4}, 24)}, "sum all");
  gradcheck([](const V& x) { return dew::mean(x[0]); }, {rnd({2, 3, 4}, 25)}, "mean all");
  Tensor x = rnd({2, 3}, 26).set_requires_grad(true);
  dew::mean(x).backward();
  check_values(x.grad(), std::vector<double>(6, 1.0 / 6.0), 1e-15, "d mean / dx = 1/n");
}

TEST_CASE("gradcheck contiguous_copy") {
  gradcheck([](const V& x) { return dew::contiguous_copy(x[0]) * x[0]; }, {rnd({3, 4}, 27)}, "contiguous_copy");
}

TEST_CASE("gradcheck matmul 2-d, all transpose combinations") {
  // op(A) [3, 4] @ op(B) [4, 5]; stored transposed when the flag is set.
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor a = ta ? rnd({4, 3}, 30) : rnd({3, 4}, 30);
      Tensor b = tb ? rnd({5, 4}, 31) : rnd({4, 5}, 31);
      gradcheck([ta, tb](const V& x) { return dew::matmul(x[0], x[1], ta, tb); }, {a, b},
                "matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
}

TEST_CASE("gradcheck matmul batched, all transpose combinations") {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor a = ta ? rnd({2, 4, 3}, 32) : rnd({2, 3, 4}, 32);
      Tensor b = tb ? rnd({2, 5, 4}, 33) : rnd({2, 4, 5}, 33);
      gradcheck([ta, tb](const V& x) { return dew::matmul(x[0], x[1], ta, tb); }, {a, b},
                "batched matmul ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
  gradcheck([](const V& x) { return dew::matmul(x[0], x[1]); }, {rnd({2, 2, 3, 4}, 34), rnd({2, 2, 4, 3}, 35)},
            "matmul with two batch dims");
}

TEST_CASE("gradcheck matmul batched @ shared 2-d weight (and 2-d @ batched)") {
  for (int ta = 0; ta < 2; ++ta)
    for (int tb = 0; tb < 2; ++tb) {
      Tensor a = ta ? rnd({2, 4, 3}, 36) : rnd({2, 3, 4}, 36);
      Tensor b = tb ? rnd({5, 4}, 37) : rnd({4, 5}, 37);
      gradcheck([ta, tb](const V& x) { return dew::matmul(x[0], x[1], ta, tb); }, {a, b},
                "batched @ 2-d ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
      Tensor a2 = ta ? rnd({4, 3}, 38) : rnd({3, 4}, 38);
      Tensor b2 = tb ? rnd({2, 5, 4}, 39) : rnd({2, 4, 5}, 39);
      gradcheck([ta, tb](const V& x) { return dew::matmul(x[0], x[1], ta, tb); }, {a2, b2},
                "2-d @ batched ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    }
  gradcheck([](const V& x) { return dew::matmul(x[0], x[1]); }, {rnd({2, 2, 3, 4}, 40), rnd({4, 2}, 41)},
            "4-d @ shared 2-d");
  gradcheck([](const V& x) { return dew::matmul(x[0], x[1]); }, {rnd({1, 3, 4}, 42), rnd({2, 4, 2}, 43)},
            "batch 1 broadcast against batch 2");
}

TEST_CASE("matmul values against a hand loop") {
  Tensor a = rnd({2, 3, 4}, 44), b = rnd({4, 5}, 45);
  const auto va = a.to_doubles(), vb = b.to_doubles();
  std::vector<double> expect;
  for (int n = 0; n < 2; ++n)
    for (int i = 0; i < 3; ++i)
      for (int j = 0; j < 5; ++j) {
        double s = 0;
        for (int k = 0; k < 4; ++k) s += va[size_t(n * 12 + i * 4 + k)] * vb[size_t(k * 5 + j)];
        expect.push_back(s);
      }
  check_values(dew::matmul(a, b), expect, 1e-14, "matmul values");
}

TEST_CASE("gradcheck linear with bias and each activation") {
  using dew::Activation;
  for (auto act : {Activation::none, Activation::relu, Activation::gelu, Activation::gelu_tanh, Activation::silu}) {
    const std::string tag = " act " + std::to_string(int(act));
    gradcheck([act](const V& x) { return dew::linear(x[0], x[1], x[2], act); },
              {rnd({2, 3, 4}, 50), rnd({5, 4}, 51), rnd({5}, 52)}, "linear with bias" + tag);
    gradcheck([act](const V& x) { return dew::linear(x[0], x[1], Tensor(), act); }, {rnd({3, 4}, 53), rnd({5, 4}, 54)},
              "linear without bias" + tag);
    // The fused epilogue (taken when nothing needs a gradient) agrees with activation(linear(.)).
    Tensor x = rnd({2, 3, 4}, 55), w = rnd({5, 4}, 56), b = rnd({5}, 57);
    check_close(dew::linear(x, w, b, act), dew::activation(dew::add(dew::matmul(x, w, false, true), b), act), 1e-13,
                1e-12, "fused linear" + tag);
  }
}

TEST_CASE("gradcheck linear with only the weight requiring a gradient") {
  Tensor x = rnd({3, 4}, 58);
  gradcheck([x](const V& p) { return dew::linear(x, p[0], p[1], dew::Activation::silu); },
            {rnd({2, 4}, 59), rnd({2}, 60)}, "linear params only");
  CHECK_FALSE(x.grad().defined());
  gradcheck([](const V& p) { return dew::linear(p[0], p[1], p[2], dew::Activation::gelu); },
            {rnd({4}, 61), rnd({3, 4}, 62), rnd({3}, 63)}, "linear on a 1-d input");
}
