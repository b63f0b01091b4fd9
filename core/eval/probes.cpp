// core/eval/probes.cpp — k-NN and linear probes on frozen features (dew/probes.hpp).
//
// Invariants: deterministic given the options (mini-batch order from Philox keyed by options.seed, no
// thread-dependent reductions on the host, the held-out rows fixed by their index); features and labels
// are never modified; the linear probe's parameters live only inside linear_probe() (its gradients never
// reach the caller's tensors). The L-BFGS fit keeps its parameters and optimiser state in double on the
// host; only the two products with the feature matrix (logits, gradient) run on the features' backend.
#include "dew/probes.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <vector>

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
  DEW_USAGE_CHECK(o.normalize == "none" || o.normalize == "center" || o.normalize == "standardize",
                  "knn probe: normalize must be none, center or standardize, got '", o.normalize, "'");
  Tensor trx = train.x, tex = test.x;
  if (o.normalize == "center") {
    const Tensor mu = mean(train.x, 0, true);
    trx = sub(train.x, mu), tex = sub(test.x, mu);
  } else if (o.normalize == "standardize") {
    trx = standardize(train.x, train.x), tex = standardize(test.x, train.x);
  }
  const Tensor tr = unit_rows(trx), te = unit_rows(tex);
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

namespace {

LinearProbeResult fit_adamw(const Features& train, const Features& test, const LinearProbeOptions& o, int64_t classes) {
  DEW_USAGE_CHECK(o.epochs >= 1, "linear probe: epochs must be at least 1, got ", o.epochs);
  DEW_USAGE_CHECK(o.batch_size >= 1, "linear probe: batch size must be at least 1, got ", o.batch_size);
  DEW_USAGE_CHECK(o.lr > 0, "linear probe: the learning rate must be positive, got ", o.lr);
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
        opt->update(float(lr), 1.0f, step + 1);
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
  r.weight_decay = o.weight_decay;
  r.iterations = total;
  return r;
}

// ---- L-BFGS solver for the linear probe ----

// Full-batch multinomial logistic regression: f(W, b) = mean_i CE(W x_i + b, y_i) + (l2 / 2) |W|^2.
// theta = [W (C x D, row-major) | b (C)] in double on the host; the two products with X run on X's backend.
class SoftmaxRegression {
 public:
  SoftmaxRegression(const Tensor& x, std::vector<int32_t> labels, int64_t classes)
      : x_(x), labels_(std::move(labels)), n_(x.shape()[0]), d_(x.shape()[1]), c_(classes) {}
  int64_t size() const { return c_ * d_ + c_; }
  int64_t dim() const { return d_; }
  int64_t classes() const { return c_; }

  // The features' second moment X'X / n [D, D] (host, double): the curvature of the loss along W up to
  // the softmax's class coupling, which the preconditioner inverts.
  std::vector<double> second_moment() const {
    const std::vector<float> m = matmul(x_, x_, true, false).to_floats();
    std::vector<double> out(m.size());
    for (size_t i = 0; i < m.size(); ++i) out[i] = double(m[i]) / double(n_);
    return out;
  }

  Tensor logits(const std::vector<double>& theta) const {
    std::vector<float> w(static_cast<size_t>(c_ * d_)), b(static_cast<size_t>(c_));
    for (size_t i = 0; i < w.size(); ++i) w[i] = float(theta[i]);
    for (int64_t k = 0; k < c_; ++k) b[size_t(k)] = float(theta[size_t(c_ * d_ + k)]);
    const BackendPtr& be = x_.backend_ptr();
    return linear(x_, Tensor::from_vector(w, {c_, d_}, be), Tensor::from_vector(b, {c_}, be));
  }

  // Returns f and fills g (same layout as theta).
  double operator()(const std::vector<double>& theta, double l2, std::vector<double>& g) const {
    const std::vector<float> z = logits(theta).to_floats();  // [n, C]
    std::vector<float> r(size_t(n_ * c_));                   // softmax - one-hot, / n
    double loss = 0;
    g.assign(size_t(size()), 0.0);
    double* gb = g.data() + c_ * d_;
    for (int64_t i = 0; i < n_; ++i) {
      const float* zi = z.data() + i * c_;
      double top = zi[0];
      for (int64_t k = 1; k < c_; ++k) top = std::max(top, double(zi[k]));
      double s = 0;
      for (int64_t k = 0; k < c_; ++k) s += std::exp(double(zi[k]) - top);
      const double lse = top + std::log(s);
      const int32_t y = labels_[size_t(i)];
      loss += lse - double(zi[y]);
      for (int64_t k = 0; k < c_; ++k) {
        const double p = std::exp(double(zi[k]) - lse) - (k == y ? 1.0 : 0.0);
        r[size_t(i * c_ + k)] = float(p / double(n_));
        gb[k] += p / double(n_);
      }
    }
    const std::vector<float> gw =
        matmul(Tensor::from_vector(r, {n_, c_}, x_.backend_ptr()), x_, true, false).to_floats();  // [C, D]
    double reg = 0;
    for (int64_t i = 0; i < c_ * d_; ++i) {
      g[size_t(i)] = double(gw[size_t(i)]) + l2 * theta[size_t(i)];
      reg += theta[size_t(i)] * theta[size_t(i)];
    }
    return loss / double(n_) + 0.5 * l2 * reg;
  }

  double accuracy(const std::vector<double>& theta) const { return accuracy_of(logits(theta), labels_); }
  static double accuracy_of(const Tensor& logits, const std::vector<int32_t>& labels) {
    const std::vector<int32_t> pred = argmax(logits).to_ints();
    int64_t hits = 0;
    for (size_t i = 0; i < pred.size(); ++i) hits += pred[i] == labels[i];
    return double(hits) / double(labels.size());
  }

 private:
  Tensor x_;
  std::vector<int32_t> labels_;
  int64_t n_, d_, c_;
};

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// (a + delta I)^-1 of a symmetric positive semi-definite [d, d] matrix, by Cholesky (host, double);
// empty when rounding left it indefinite.
std::vector<double> inverse_spd(const std::vector<double>& a, int64_t d, double delta) {
  std::vector<double> l(size_t(d * d), 0.0);
  for (int64_t j = 0; j < d; ++j) {
    double diag = a[size_t(j * d + j)] + delta;
    for (int64_t k = 0; k < j; ++k) diag -= l[size_t(j * d + k)] * l[size_t(j * d + k)];
    if (!(diag > 0)) return {};
    const double ljj = std::sqrt(diag);
    l[size_t(j * d + j)] = ljj;
    for (int64_t i = j + 1; i < d; ++i) {
      double v = a[size_t(i * d + j)];
      for (int64_t k = 0; k < j; ++k) v -= l[size_t(i * d + k)] * l[size_t(j * d + k)];
      l[size_t(i * d + j)] = v / ljj;
    }
  }
  // inv = L^-T L^-1: column c of L^-1 by forward substitution, then back substitution with L^T.
  std::vector<double> inv(static_cast<size_t>(d * d)), col(static_cast<size_t>(d));
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t i = 0; i < d; ++i) {
      double v = i == c ? 1.0 : 0.0;
      for (int64_t k = 0; k < i; ++k) v -= l[size_t(i * d + k)] * col[size_t(k)];
      col[size_t(i)] = v / l[size_t(i * d + i)];
    }
    for (int64_t i = d - 1; i >= 0; --i) {
      double v = col[size_t(i)];
      for (int64_t k = i + 1; k < d; ++k) v -= l[size_t(k * d + i)] * col[size_t(k)];
      col[size_t(i)] = v / l[size_t(i * d + i)];
    }
    for (int64_t i = 0; i < d; ++i) inv[size_t(i * d + c)] = col[size_t(i)];
  }
  return inv;
}

// H0 of the L-BFGS recursion: each class's weight row times (X'X/n + delta I)^-1, the bias as is. It
// makes the fit insensitive to correlated features (pooled ViT features are nearly one-dimensional).
struct Preconditioner {
  int64_t classes = 0, dim = 0;
  std::vector<double> inverse;  // [dim, dim]; empty: identity
  void apply(std::vector<double>& q) const {
    if (inverse.empty()) return;
    std::vector<double> row(static_cast<size_t>(dim));
    for (int64_t k = 0; k < classes; ++k) {
      double* qk = q.data() + k * dim;
      std::fill(row.begin(), row.end(), 0.0);
      for (int64_t i = 0; i < dim; ++i) {
        const double v = qk[i];
        const double* mi = inverse.data() + i * dim;
        for (int64_t j = 0; j < dim; ++j) row[size_t(j)] += v * mi[j];
      }
      std::copy(row.begin(), row.end(), qk);
    }
  }
};

Preconditioner preconditioner_for(const SoftmaxRegression& problem, const std::vector<double>& moment, double l2) {
  Preconditioner p;
  p.classes = problem.classes();
  p.dim = problem.dim();
  // The damping follows the L2 strength (the Hessian's floor), bounded below so that directions the
  // features barely span are not amplified beyond 1e6; raised tenfold while the float32 second moment
  // of rank-deficient features (more dimensions than samples, constant ones) is numerically indefinite.
  // No factorisation at all leaves the identity: slower, same optimum.
  for (double delta = std::max(l2, 1e-6); !moment.empty() && p.inverse.empty() && delta < 1e3; delta *= 10)
    p.inverse = inverse_spd(moment, p.dim, delta);
  return p;
}

struct LbfgsOutcome {
  double loss = 0;
  int64_t iterations = 0;
  bool converged = false;
};

// Minimises problem(theta, l2) from theta (updated in place): L-BFGS two-loop recursion with `history`
// pairs, backtracking (Armijo) line search. Converged: the largest gradient entry is below `tolerance`,
// or no step decreases f any more (the float32 products set the attainable precision).
LbfgsOutcome lbfgs(const SoftmaxRegression& problem, double l2, const Preconditioner& h0, std::vector<double>& theta,
                   int64_t max_iterations, double tolerance, int64_t history) {
  const size_t n = theta.size();
  std::vector<double> g, g_new, dir(n), x_new(n);
  std::vector<std::vector<double>> s_hist, y_hist;
  std::vector<double> rho_hist, alpha;
  double f = problem(theta, l2, g);
  double gamma = 1.0;
  LbfgsOutcome out;
  auto max_abs = [](const std::vector<double>& v) {
    double m = 0;
    for (double e : v) m = std::max(m, std::abs(e));
    return m;
  };
  for (out.iterations = 0; out.iterations < max_iterations; ++out.iterations) {
    if (max_abs(g) <= tolerance) {
      out.converged = true;
      break;
    }
    // dir = -H g (two-loop recursion; H0 = gamma P with gamma = s'y / y'Py of the newest pair).
    for (size_t i = 0; i < n; ++i) dir[i] = -g[i];
    const size_t m = s_hist.size();
    alpha.assign(m, 0.0);
    for (size_t j = m; j-- > 0;) {
      alpha[j] = rho_hist[j] * dot(s_hist[j], dir);
      for (size_t i = 0; i < n; ++i) dir[i] -= alpha[j] * y_hist[j][i];
    }
    h0.apply(dir);
    for (double& e : dir) e *= gamma;
    for (size_t j = 0; j < m; ++j) {
      const double beta = rho_hist[j] * dot(y_hist[j], dir);
      for (size_t i = 0; i < n; ++i) dir[i] += (alpha[j] - beta) * s_hist[j][i];
    }
    double slope = dot(g, dir);
    if (!(slope < 0)) {  // not a descent direction (rounding): restart from preconditioned steepest descent
      s_hist.clear(), y_hist.clear(), rho_hist.clear();
      gamma = 1.0;
      for (size_t i = 0; i < n; ++i) dir[i] = -g[i];
      h0.apply(dir);
      slope = dot(g, dir);
      if (!(slope < 0)) {
        out.converged = true;  // the gradient is numerically zero
        break;
      }
    }
    double step = m > 0 ? 1.0 : 1.0 / std::max(1.0, std::sqrt(-slope));  // a first step of length <= ~1
    double f_new = 0;
    bool moved = false;
    for (int tries = 0; tries < 40; ++tries, step *= 0.5) {
      for (size_t i = 0; i < n; ++i) x_new[i] = theta[i] + step * dir[i];
      f_new = problem(x_new, l2, g_new);
      if (f_new <= f + 1e-4 * step * slope) {
        moved = true;
        break;
      }
    }
    if (!moved || f - f_new <= 1e-12 * std::max(1.0, std::abs(f))) {
      if (moved) theta.swap(x_new), g.swap(g_new), f = f_new;
      out.converged = true;  // as far as the float32 products allow
      break;
    }
    std::vector<double> s(n), y(n);
    for (size_t i = 0; i < n; ++i) s[i] = x_new[i] - theta[i], y[i] = g_new[i] - g[i];
    const double sy = dot(s, y);
    if (sy > 1e-12 * dot(y, y)) {  // keep the pair only with positive curvature
      std::vector<double> py = y;
      h0.apply(py);
      gamma = sy / dot(y, py);
      if (int64_t(s_hist.size()) == history) {
        s_hist.erase(s_hist.begin()), y_hist.erase(y_hist.begin()), rho_hist.erase(rho_hist.begin());
      }
      s_hist.push_back(std::move(s)), y_hist.push_back(std::move(y)), rho_hist.push_back(1.0 / sy);
    }
    theta.swap(x_new), g.swap(g_new), f = f_new;
  }
  out.loss = f;
  return out;
}

// Rows of a host matrix [n, d] whose index is (not) a multiple-of-`folds` minus one: the held-out split.
Features take_rows(const std::vector<float>& x, int64_t d, const std::vector<int32_t>& labels, int64_t folds,
                   bool holdout, const BackendPtr& be) {
  Features f;
  std::vector<float> rows;
  for (int64_t i = 0; i < int64_t(labels.size()); ++i) {
    if ((i % folds == folds - 1) != holdout) continue;
    rows.insert(rows.end(), x.begin() + i * d, x.begin() + (i + 1) * d);
    f.labels.push_back(labels[size_t(i)]);
  }
  f.x = Tensor::from_vector(rows, {f.size(), d}, be);
  return f;
}

LinearProbeResult fit_lbfgs(const Features& train, const Features& test, const LinearProbeOptions& o, int64_t classes) {
  DEW_USAGE_CHECK(o.max_iterations >= 1, "linear probe: max_iterations must be at least 1, got ", o.max_iterations);
  DEW_USAGE_CHECK(o.tolerance > 0, "linear probe: the tolerance must be positive, got ", o.tolerance);
  DEW_USAGE_CHECK(o.history >= 1, "linear probe: history must be at least 1, got ", o.history);
  std::vector<double> grid = o.weight_decays.empty() ? std::vector<double>{o.weight_decay} : o.weight_decays;
  for (double l2 : grid) DEW_USAGE_CHECK(l2 >= 0, "linear probe: weight decays must be >= 0, got ", l2);
  std::sort(grid.begin(), grid.end(), std::greater<>());
  grid.erase(std::unique(grid.begin(), grid.end()), grid.end());
  NoGradGuard no_grad;
  const BackendPtr& be = train.x.backend_ptr();
  const int64_t d = train.x.shape()[1];
  const Tensor xtr = o.standardize ? standardize(train.x, train.x) : train.x.detach();
  const Tensor xte = o.standardize ? standardize(test.x, train.x) : test.x.detach();
  const SoftmaxRegression full(xtr, train.labels, classes);
  // Preconditioning costs a [D, D] Cholesky per weight decay and a [C, D] x [D, D] product per step.
  const bool precondition = o.precondition && d <= 4096;
  std::vector<double> theta(size_t(full.size()), 0.0);
  LinearProbeResult r;
  double l2 = grid[0];
  if (grid.size() > 1) {
    DEW_USAGE_CHECK(o.holdout_fraction > 0 && o.holdout_fraction < 1,
                    "linear probe: holdout_fraction must be in (0, 1), got ", o.holdout_fraction);
    const int64_t folds = std::max<int64_t>(2, std::llround(1.0 / o.holdout_fraction));
    DEW_USAGE_CHECK(train.size() >= folds, "linear probe: ", train.size(),
                    " training samples are too few to hold out every ", folds, "th for choosing the weight decay");
    const std::vector<float> host = xtr.to_floats();
    const Features fit = take_rows(host, d, train.labels, folds, false, be);
    const Features hold = take_rows(host, d, train.labels, folds, true, be);
    const SoftmaxRegression part(fit.x, fit.labels, classes);
    const std::vector<double> part_moment = precondition ? part.second_moment() : std::vector<double>{};
    std::vector<double> path(theta.size(), 0.0), best;
    for (double wd : grid) {  // from the strongest down, each fit starting where the previous ended
      lbfgs(part, wd, preconditioner_for(part, part_moment, wd), path, o.max_iterations, o.tolerance, o.history);
      const double acc = SoftmaxRegression(hold.x, hold.labels, classes).accuracy(path);
      if (acc > r.holdout_accuracy) r.holdout_accuracy = acc, l2 = wd, best = path;
    }
    theta = best;
  }
  const std::vector<double> moment = precondition ? full.second_moment() : std::vector<double>{};
  const LbfgsOutcome fit =
      lbfgs(full, l2, preconditioner_for(full, moment, l2), theta, o.max_iterations, o.tolerance, o.history);
  double reg = 0;
  for (int64_t i = 0; i < classes * d; ++i) reg += theta[size_t(i)] * theta[size_t(i)];
  r.train_loss = fit.loss - 0.5 * l2 * reg;
  r.weight_decay = l2;
  r.iterations = fit.iterations;
  r.converged = fit.converged;
  r.train_accuracy = full.accuracy(theta);
  r.test_accuracy = SoftmaxRegression(xte, test.labels, classes).accuracy(theta);
  return r;
}

}  // namespace

LinearProbeResult linear_probe(const Features& train, const Features& test, const LinearProbeOptions& o,
                               int64_t num_classes) {
  check_pair(train, test, "linear_probe");
  DEW_USAGE_CHECK(o.solver == "lbfgs" || o.solver == "adamw", "linear probe: solver must be lbfgs or adamw, got '",
                  o.solver, "'");
  const int64_t classes = classes_of(train, test, num_classes);
  for (const Features* f : {&train, &test})
    for (int32_t v : f->labels) DEW_CHECK(v < classes, "linear probe: label ", v, " is outside [0, ", classes, ")");
  return o.solver == "lbfgs" ? fit_lbfgs(train, test, o, classes) : fit_adamw(train, test, o, classes);
}

}  // namespace dew::probes
