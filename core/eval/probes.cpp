// core/eval/probes.cpp — k-NN and linear probes on frozen features (dew/probes.hpp).
//
// Invariants: deterministic given the options (mini-batch order from Philox keyed by options.seed, no
// thread-dependent reductions on the host); features and labels are never modified; the linear probe's
// parameters live only inside linear_probe() (its gradients never reach the caller's tensors).
#include "dew/probes.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "dew/autograd.hpp"
#include "dew/error.hpp"
#include "dew/ops.hpp"
#include "dew/random.hpp"
#include "dew/train.hpp"

namespace dew::probes {

namespace {

int64_t classes_of(const Features& a, const Features& b, int64_t num_classes) {
  if (num_classes > 0) return num_classes;
  int32_t top = 0;
  for (int32_t v : a.labels) top = std::max(top, v);
  for (int32_t v : b.labels) top = std::max(top, v);
  return int64_t(top) + 1;
}

void check_pair(const Features& train, const Features& test, const char* who) {
  DEW_CHECK(train.x.defined() && test.x.defined() && train.x.ndim() == 2 && test.x.ndim() == 2, who,
            ": features must be [N, D] tensors");
  DEW_CHECK(train.x.shape()[1] == test.x.shape()[1], who, ": train features are ", shape_str(train.x.shape()),
            " but test features ", shape_str(test.x.shape()));
  DEW_CHECK(train.x.shape()[0] == train.size() && test.x.shape()[0] == test.size(), who,
            ": feature rows and label counts differ");
  DEW_CHECK(train.size() > 0 && test.size() > 0, who, ": needs at least one training and one test sample");
  for (const Features* f : {&train, &test})
    for (int32_t v : f->labels) DEW_CHECK(v >= 0, who, ": negative label ", v);
}

// Rows scaled to unit L2 norm (zero rows stay zero).
Tensor unit_rows(const Tensor& x) {
  Tensor n = sqrt(add_scalar(sum(square(x), 1, true), 1e-12f));
  return div(x, n);
}

}  // namespace

Features collect_features(DataLoader& loader, int64_t max_samples, const std::function<Tensor(const Batch&)>& embed,
                          const BackendPtr& backend, const std::string& label_field) {
  NoGradGuard no_grad;
  DEW_CHECK(loader.config().world == 1, "collect_features: the loader must be single-rank");
  const int64_t n = loader.source().size();
  const int64_t want = max_samples <= 0 ? n : std::min(max_samples, n);
  std::vector<Tensor> parts;
  Features out;
  out.labels.reserve(size_t(want));
  while (out.size() < want) {
    const HostBatch hb = loader.next();
    auto it = hb.find(label_field);
    DEW_USAGE_CHECK(it != hb.end(), "probes: the data has no '", label_field, "' field (probes need labelled data)");
    const HostArray& lab = it->second;
    DEW_CHECK(lab.dtype == DType::i32, "probes: '", label_field, "' must be i32, got ", dtype_name(lab.dtype));
    const int64_t rows = lab.shape.empty() ? 1 : lab.shape[0];
    const int64_t use = std::min(rows, want - out.size());
    Batch b = to_device(hb, backend);
    if (use < rows)
      for (auto& [k, t] : b) t = t.slice0(0, use);
    Tensor f = embed(b).detach();
    DEW_CHECK(f.ndim() == 2 && f.shape()[0] == use, "probes: the embedding function returned ", shape_str(f.shape()),
              " for ", use, " samples; expected [", use, ", D]");
    if (f.dtype() != DType::f32) f = cast(f, DType::f32);
    parts.push_back(f);
    out.labels.insert(out.labels.end(), lab.as<int32_t>(), lab.as<int32_t>() + use);
  }
  DEW_CHECK(!parts.empty(), "probes: no samples to collect");
  out.x = parts.size() == 1 ? parts[0] : concat(parts, 0);
  return out;
}

Tensor standardize(const Tensor& x, const Tensor& fit, double eps) {
  NoGradGuard no_grad;
  Tensor mu = mean(fit, 0, true);
  Tensor sd = sqrt(mean(square(sub(fit, mu)), 0, true));
  return div(sub(x, mu), add_scalar(sd, float(eps)));
}

double knn_probe(const Features& train, const Features& test, const KnnOptions& o, int64_t num_classes) {
  NoGradGuard no_grad;
  check_pair(train, test, "knn_probe");
  DEW_USAGE_CHECK(o.k >= 1, "knn probe: k must be at least 1, got ", o.k);
  DEW_USAGE_CHECK(o.temperature > 0, "knn probe: the temperature must be positive, got ", o.temperature);
  DEW_CHECK(o.chunk > 0, "knn probe: chunk must be positive");
  const int64_t classes = classes_of(train, test, num_classes);
  const int64_t ntr = train.size(), nte = test.size(), k = std::min(o.k, ntr);
  const Tensor tr = unit_rows(train.x), te = unit_rows(test.x);
  auto order = std::vector<int32_t>(size_t(ntr));
  auto votes = std::vector<double>(size_t(classes));
  int64_t hits = 0;
  for (int64_t c0 = 0; c0 < nte; c0 += o.chunk) {
    const int64_t c1 = std::min(nte, c0 + o.chunk);
    const std::vector<float> sim = matmul(te.slice0(c0, c1), tr, false, true).to_floats();  // [c, ntr]
    for (int64_t r = 0; r < c1 - c0; ++r) {
      const float* s = sim.data() + r * ntr;
      std::iota(order.begin(), order.end(), 0);
      // The k most similar (ties: the lower training index), a total order so the result is unique.
      auto more = [s](int32_t a, int32_t b) { return s[a] > s[b] || (s[a] == s[b] && a < b); };
      std::nth_element(order.begin(), order.begin() + (k - 1), order.end(), more);
      std::fill(votes.begin(), votes.end(), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        const int32_t i = order[size_t(j)];
        const int32_t cls = train.labels[size_t(i)];
        DEW_CHECK(cls < classes, "knn probe: label ", cls, " is outside [0, ", classes, ")");
        votes[size_t(cls)] += o.weighted ? std::exp(double(s[i]) / o.temperature) : 1.0;
      }
      const int64_t pred = std::max_element(votes.begin(), votes.end()) - votes.begin();  // first on ties
      hits += pred == test.labels[size_t(c0 + r)];
    }
  }
  return double(hits) / double(nte);
}

LinearProbeResult linear_probe(const Features& train, const Features& test, const LinearProbeOptions& o,
                               int64_t num_classes) {
  check_pair(train, test, "linear_probe");
  DEW_USAGE_CHECK(o.epochs >= 1, "linear probe: epochs must be at least 1, got ", o.epochs);
  DEW_USAGE_CHECK(o.batch_size >= 1, "linear probe: batch size must be at least 1, got ", o.batch_size);
  DEW_USAGE_CHECK(o.lr > 0, "linear probe: the learning rate must be positive, got ", o.lr);
  const int64_t classes = classes_of(train, test, num_classes);
  EnableGradGuard grad_on;  // the fit needs gradients, also when called during evaluation
  const BackendPtr& be = train.x.backend_ptr();
  const int64_t n = train.size(), d = train.x.shape()[1];
  Tensor xtr, xte;
  {
    NoGradGuard no_grad;
    xtr = o.standardize ? standardize(train.x, train.x) : train.x.detach();
    xte = o.standardize ? standardize(test.x, train.x) : test.x.detach();
  }
  Tensor w = Tensor::zeros({classes, d}, DType::f32, be), b = Tensor::zeros({classes}, DType::f32, be);
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const NamedTensors params = {{"probe.weight", w}, {"probe.bias", b}};
  Options oo(
      std::map<std::string, std::string>{
          {"name", "adamw"}, {"lr", std::to_string(o.lr)}, {"weight_decay", std::to_string(o.weight_decay)}},
      "linear probe");
  auto opt = make_optimizer(oo, params);
  const Tensor xtr3 = reshape(xtr, {1, n, d});
  const Tensor ytr = Tensor::from_ints(train.labels, {n}, be);
  const int64_t per_epoch = (n + o.batch_size - 1) / o.batch_size, total = per_epoch * o.epochs;
  auto perm = std::vector<int32_t>(size_t(n));
  int64_t step = 0;
  double last_loss = 0;
  for (int64_t e = 0; e < o.epochs; ++e) {
    // Fisher-Yates with Philox keyed by (seed, epoch): the same order on every backend and thread count.
    std::iota(perm.begin(), perm.end(), 0);
    const uint64_t stream = philox::stream_of("linear_probe") + uint64_t(e);
    for (int64_t i = n - 1; i > 0; --i) {
      const int64_t j = std::min<int64_t>(i, int64_t(philox::uniform(o.seed, stream, uint64_t(i)) * float(i + 1)));
      std::swap(perm[size_t(i)], perm[size_t(j)]);
    }
    double loss_sum = 0;
    for (int64_t s0 = 0; s0 < n; s0 += o.batch_size) {
      const int64_t s1 = std::min(n, s0 + o.batch_size), m = s1 - s0;
      std::vector<int32_t> idx(perm.begin() + s0, perm.begin() + s1);
      auto lab = std::vector<int32_t>(size_t(m));
      for (int64_t i = 0; i < m; ++i) lab[size_t(i)] = train.labels[size_t(idx[size_t(i)])];
      Tensor xb = reshape(gather_rows(xtr3, Tensor::from_ints(idx, {1, m}, be)), {m, d});
      Tensor loss = cross_entropy(linear(xb, w, b), Tensor::from_ints(lab, {m}, be));
      loss.backward();
      loss_sum += loss.item() * double(m);
      const double lr = 0.5 * o.lr * (1.0 + std::cos(M_PI * double(step) / double(total)));
      {
        NoGradGuard no_grad;
        opt->update(params, float(lr), 1.0f, step + 1);
      }
      w.zero_grad();
      b.zero_grad();
      ++step;
    }
    last_loss = loss_sum / double(n);
  }
  NoGradGuard no_grad;
  auto accuracy = [&](const Tensor& x, const std::vector<int32_t>& labels) {
    const std::vector<int32_t> pred = argmax(linear(x, w.detach(), b.detach())).to_ints();
    int64_t hits = 0;
    for (size_t i = 0; i < pred.size(); ++i) hits += pred[i] == labels[i];
    return double(hits) / double(labels.size());
  };
  LinearProbeResult r;
  r.train_accuracy = accuracy(xtr, train.labels);
  r.test_accuracy = accuracy(xte, test.labels);
  r.train_loss = last_loss;
  return r;
}

}  // namespace dew::probes
