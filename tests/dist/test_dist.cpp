// tests/dist/test_dist.cpp — the pieces of data-parallel training that need no second process: the
// autograd leaf-ready hook (each leaf once, after its last contribution, while backward still runs)
// and the gradient buckets of core/dist (layout, launch order, overlap, averaging, missing gradients),
// against an in-process fake communicator that plays a world of identical ranks.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/comm.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dist/data_parallel.hpp"

using dew::Tensor;

namespace {

dew::BackendPtr ref() {
  static dew::BackendPtr be = [] {
    dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref"});
    auto b = dew::create_backend("ref");
    dew::set_default_backend(b);
    return b;
  }();
  return be;
}

Tensor leaf(const std::vector<float>& v, const dew::Shape& s) {
  return Tensor::from_vector(v, s, ref()).set_requires_grad(true);
}

// A world of `world` ranks that all hold the same tensors: all_reduce_sum multiplies by world.
class FakeComm final : public dew::Communicator {
 public:
  explicit FakeComm(int world) : world_(world) {}
  struct Request final : dew::CommRequest {
    FakeComm* comm;
    Tensor t;
    bool done = false;
    bool test() override { return done; }
    void wait() override {
      if (!done) comm->reduce(t);
      done = true;
    }
  };
  std::string name() const override { return "fake"; }
  int rank() const override { return 0; }
  int size() const override { return world_; }
  double timeout() const override { return 0; }
  void all_reduce_sum(Tensor& t) override { reduce(t); }
  std::shared_ptr<dew::CommRequest> all_reduce_sum_async(Tensor& t) override {
    launches.push_back(t.numel());
    launch_events.push_back(events);
    auto r = std::make_shared<Request>();
    r->comm = this;
    r->t = t;
    return r;
  }
  void broadcast(Tensor&, int) override { ++broadcasts; }
  std::shared_ptr<dew::CommRequest> broadcast_async(Tensor& t, int) override {
    ++broadcasts;
    auto r = std::make_shared<Request>();
    r->comm = this;
    r->done = true;
    r->t = t;
    return r;
  }
  void all_gather(const Tensor&, Tensor&) override {}
  // The sharded collectives are tested between real processes (tests/dist/collectives.cpp).
  std::shared_ptr<dew::CommRequest> all_gather_async(const Tensor&, Tensor&, const std::vector<int64_t>&) override {
    throw std::logic_error("FakeComm: all_gather_async is not faked");
  }
  std::shared_ptr<dew::CommRequest> reduce_scatter_sum_async(const Tensor&, Tensor&,
                                                            const std::vector<int64_t>&) override {
    throw std::logic_error("FakeComm: reduce_scatter_sum_async is not faked");
  }
  void barrier() override {}
  [[noreturn]] void abort(int code, const std::string&) override { std::exit(code); }

  void reduce(Tensor& t) {
    if (t.dtype() == dew::DType::f64) {
      std::vector<double> v = t.to_doubles();
      for (double& x : v) x *= world_;
      t.copy_from_host(v.data());
    } else {
      std::vector<float> v = t.to_floats();
      for (float& x : v) x *= float(world_);
      t.copy_from_host(v.data());
    }
  }
  std::vector<int64_t> launches;   // numel of each launched buffer, in launch order
  std::vector<int> launch_events;  // leaf-ready events seen before each launch
  int events = 0, broadcasts = 0;

 private:
  int world_;
};

}  // namespace

TEST_CASE("leaf-ready hook: each leaf once, with its final gradient, as soon as its last edge ran") {
  // y = sum(w2 * tanh(w1 * x)) + sum(w1 * w1): w1 has edges from two nodes (one deep, one shallow).
  Tensor x = Tensor::from_vector({0.5f, -1.0f, 2.0f}, {3}, ref());
  Tensor w1 = leaf({1, 2, 3}, {3}), w2 = leaf({-1, 0.5f, 0.25f}, {3}), unused = leaf({7}, {1});
  Tensor loss = dew::sum(w2 * dew::tanh(w1 * x)) + dew::sum(w1 * w1);
  std::vector<std::string> order;
  std::map<std::string, std::vector<float>> at_ready;
  auto name_of = [&](const Tensor& t) { return t.same(w1) ? "w1" : t.same(w2) ? "w2" : "other"; };
  dew::run_backward(loss, Tensor::full(loss.shape(), 1.0, loss.dtype(), ref()), [&](const Tensor& t) {
    order.push_back(name_of(t));
    at_ready[name_of(t)] = t.grad().to_floats();
  });
  REQUIRE(order.size() == 2);  // `unused` is not reachable: never reported
  CHECK(order[0] == "w2");     // w2's only edge is processed before w1's last one
  CHECK(order[1] == "w1");
  CHECK(at_ready["w1"] == w1.grad().to_floats());  // final when reported
  CHECK(at_ready["w2"] == w2.grad().to_floats());
  CHECK_FALSE(unused.grad().defined());
}

TEST_CASE("leaf-ready hook: a leaf used twice by one node and a leaf root") {
  Tensor a = leaf({1, 2}, {2}), b = leaf({3, 4}, {2});
  Tensor loss = dew::sum(a * a) + dew::sum(b);
  int twice = 0;
  dew::run_backward(loss, Tensor::full(loss.shape(), 1.0, loss.dtype(), ref()), [&](const Tensor& t) {
    if (t.same(a)) {
      ++twice;
      CHECK(t.grad().to_floats() == std::vector<float>{2, 4});  // both edges in
    }
  });
  CHECK(twice == 1);
  a.zero_grad();
  loss = dew::sum(a * b);
  int calls = 0;
  dew::run_backward(loss, Tensor::full(loss.shape(), 1.0, loss.dtype(), ref()), [&](const Tensor&) { ++calls; });
  CHECK(calls == 2);
  Tensor root = leaf({5}, {1});
  calls = 0;
  dew::run_backward(root, Tensor::full({1}, 1.0, dew::DType::f32, ref()), [&](const Tensor& t) {
    ++calls;
    CHECK(t.same(root));
  });
  CHECK(calls == 1);
  CHECK(root.grad().to_floats() == std::vector<float>{1.0f});
}

TEST_CASE("buckets: reverse parameter order, size-capped, launched in order during backward, averaged") {
  // Four parameters of 1000 floats (~3.9 KiB each); a cap of 0.008 MiB (~8.2 KiB) holds two per bucket.
  std::vector<Tensor> w;
  dew::NamedTensors params;
  for (int i = 0; i < 4; ++i) {
    w.push_back(Tensor::uniform({1000}, -1, 1, 5, uint64_t(i), ref()).set_requires_grad(true));
    params.push_back({"w" + std::to_string(i), w.back()});
  }
  auto comm = std::make_shared<FakeComm>(2);
  dew::dist::DataParallel dp(comm, params, 0.008);
  REQUIRE(dp.num_buckets() == 2);
  CHECK(dp.bucket_members() == std::vector<std::vector<size_t>>{{3, 2}, {1, 0}});

  // h = w0 * (w1 * (w2 * (w3 * x))): the outermost factor's gradient comes first, so w0 is ready first
  // and w3 last: bucket {1, 0} is complete before bucket {3, 2} but must wait, since buckets launch in
  // index order (the same sequence of collectives on every rank).
  Tensor x = Tensor::uniform({1000}, -1, 1, 9, 0, ref());
  Tensor h = w[0] * (w[1] * (w[2] * (w[3] * x)));
  Tensor loss = dew::sum(h);
  auto hook = dp.begin_sync();
  dew::run_backward(loss, Tensor::full(loss.shape(), 1.0, loss.dtype(), ref()), [&](const Tensor& t) {
    ++comm->events;
    hook(t);
  });
  REQUIRE(comm->launches.size() == 2);  // both launched during the backward pass, after the 4th leaf
  CHECK(comm->launch_events == std::vector<int>{4, 4});
  CHECK(comm->launches[0] == 2002);  // 2 x 1000 gradients + 2 flags
  std::vector<std::vector<float>> local;
  for (auto& p : w) local.push_back(p.grad().to_floats());
  dp.finish_sync();
  for (size_t i = 0; i < w.size(); ++i) CHECK(w[i].grad().to_floats() == local[i]);  // (2 x g) / 2 == g
  CHECK(dp.take_sync_ms() >= 0.0);
}

TEST_CASE("buckets: the first launch happens while backward still has work (overlap)") {
  std::vector<Tensor> w;
  dew::NamedTensors params;
  for (int i = 0; i < 4; ++i) {
    w.push_back(Tensor::uniform({1000}, -1, 1, 5, uint64_t(i), ref()).set_requires_grad(true));
    params.push_back({"w" + std::to_string(i), w.back()});
  }
  auto comm = std::make_shared<FakeComm>(1);
  dew::dist::DataParallel dp(comm, params, 0.008);  // buckets {3, 2}, {1, 0}
  // Sequential layers as a model has them: w3 is used last in forward, so it is ready first.
  Tensor x = Tensor::uniform({1000}, -1, 1, 9, 0, ref());
  Tensor h = w[3] * (w[2] * (w[1] * (w[0] * x)));
  auto hook = dp.begin_sync();
  Tensor loss = dew::sum(h);
  dew::run_backward(loss, Tensor::full(loss.shape(), 1.0, loss.dtype(), ref()), [&](const Tensor& t) {
    ++comm->events;
    hook(t);
  });
  REQUIRE(comm->launches.size() == 2);
  CHECK(comm->launch_events[0] == 2);  // bucket {3, 2} leaves after 2 of the 4 leaves, mid-backward
  CHECK(comm->launch_events[1] == 4);
  dp.finish_sync();
}

TEST_CASE("buckets: a parameter without a gradient on every rank keeps none and unreached ones are flushed") {
  Tensor a = leaf({1, 2}, {2}), b = leaf({3, 4}, {2}), c = leaf({5, 6}, {2});
  dew::NamedTensors params{{"a", a}, {"b", b}, {"c", c}};
  auto comm = std::make_shared<FakeComm>(2);
  dew::dist::DataParallel dp(comm, params, 25);
  REQUIRE(dp.num_buckets() == 1);
  Tensor loss = dew::sum(a * b);  // c is not used
  auto hook = dp.begin_sync();
  dew::run_backward(loss, Tensor::full(loss.shape(), 1.0, loss.dtype(), ref()), hook);
  CHECK(comm->launches.empty());  // c never reported: the bucket waits for finish_sync
  dp.finish_sync();
  CHECK(comm->launches.size() == 1);
  CHECK(a.grad().to_floats() == std::vector<float>{3, 4});
  CHECK(b.grad().to_floats() == std::vector<float>{1, 2});
  CHECK_FALSE(c.grad().defined());
  // The next update accumulates into the views of the bucket and syncs again.
  a.zero_grad();
  b.zero_grad();
  Tensor loss2 = dew::sum(a * c);
  hook = dp.begin_sync();
  dew::run_backward(loss2, Tensor::full(loss2.shape(), 1.0, loss2.dtype(), ref()), hook);
  dp.finish_sync();
  CHECK(a.grad().to_floats() == std::vector<float>{5, 6});
  CHECK_FALSE(b.grad().defined());
  CHECK(c.grad().to_floats() == std::vector<float>{1, 2});
}

TEST_CASE("broadcast covers every tensor and sum adds over ranks") {
  Tensor a = leaf({1}, {1});
  auto comm = std::make_shared<FakeComm>(3);
  dew::dist::DataParallel dp(comm, {{"a", a}}, 25);
  dp.broadcast({{"a", a}, {"b", a}});
  CHECK(comm->broadcasts == 2);
  std::vector<double> v{1.5, 2};
  dp.sum(v);
  CHECK(v == std::vector<double>{4.5, 6});
}

TEST_CASE("buckets with recomputed blocks: every parameter's gradient reaches its bucket, bit for bit") {
  // Two blocks y = tanh(w_i * x) recomputed in the backward (dew::checkpoint): their parameters are leaves
  // of the recomputed graphs, reported through the checkpoint node's edges.
  auto make = [](dew::NamedTensors& params, std::vector<Tensor>& w) {
    for (int i = 0; i < 3; ++i) {
      w.push_back(Tensor::uniform({500}, -1, 1, 6, uint64_t(i), ref()).set_requires_grad(true));
      params.push_back({"w" + std::to_string(i), w.back()});
    }
  };
  auto forward = [](const std::vector<Tensor>& w, bool recompute) {
    Tensor x = Tensor::uniform({500}, -1, 1, 9, 1, ref());
    for (size_t i = 0; i < 2; ++i) {
      const Tensor wi = w[i];
      auto fn = [wi](const std::vector<Tensor>& in) { return dew::tanh(wi * in[0]); };
      x = recompute ? dew::checkpoint(fn, {x}, {wi}) : fn({x});
    }
    return dew::sum(w[2] * x);
  };
  dew::NamedTensors plain_params, dp_params;
  std::vector<Tensor> plain_w, dp_w;
  make(plain_params, plain_w);
  make(dp_params, dp_w);
  forward(plain_w, false).backward();

  auto comm = std::make_shared<FakeComm>(2);
  dew::dist::DataParallel dp(comm, dp_params, 0.002);  // one parameter per bucket
  REQUIRE(dp.num_buckets() == 3);
  dp.backward(forward(dp_w, true), true);
  CHECK(comm->launches.size() == 3);  // every bucket launched during the backward pass
  dp.finish_sync();
  for (size_t i = 0; i < 3; ++i) {
    CAPTURE(i);
    REQUIRE(dp_w[i].grad().defined());
    CHECK(dp_w[i].grad().to_floats() == plain_w[i].grad().to_floats());
  }
}
