// tests/packing/test_packing.cpp — packed sequences ([data] pack = true): attention with segment ids on the
// ref and cpu backends against attention over each document alone, forward and backward; the segmented
// gradients against central finite differences in double on ref; the lm objective's loss on a packed batch
// against the token-weighted mean of each document's loss computed alone (its own forward, cross-entropy
// summed here in double); and the loader's refusal of pack = true on a source without document boundaries.
// (Packed resume, bit for bit, is tests/packing/resume_packed.sh.)
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <limits>
#include <string>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/backend.hpp"
#include "dew/config.hpp"
#include "dew/data.hpp"
#include "dew/error.hpp"
#include "dew/model.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"

using namespace dew;
namespace fs = std::filesystem;

namespace {

void load_plugins() {
  static bool done = [] {
    Registry::global().discover(Registry::default_plugin_dirs(),
                                {"ref", "cpu", "causal_transformer", "lm", "synthetic"});
    return true;
  }();
  (void)done;
}

BackendPtr backend(const char* name) {
  load_plugins();
  if (!Registry::global().contains(Backend::kind, name)) return nullptr;
  return create_backend(name);
}

// Runs of document lengths in [1, max_len], numbered from 1 per row; the last `pad` keys are padding (0).
std::vector<int32_t> packed_segments(int64_t B, int64_t S, int64_t max_len, int64_t pad, uint64_t seed) {
  std::vector<int32_t> seg(size_t(B * S));
  uint64_t x = seed * 2654435761u + 1;
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = 0;
    int64_t left = 0;
    for (int64_t s = 0; s < S; ++s) {
      if (left == 0) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        left = 1 + int64_t((x >> 33) % uint64_t(max_len));
        ++id;
      }
      seg[size_t(b * S + s)] = s < S - (b == B - 1 ? pad : 0) ? id : 0;
      --left;
    }
  }
  return seg;
}

struct Docs {
  int64_t b, begin, end;  // row b, positions [begin, end) share one nonzero segment
};
std::vector<Docs> documents(const std::vector<int32_t>& seg, int64_t B, int64_t S) {
  std::vector<Docs> out;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S;) {
      int64_t e = s + 1;
      while (e < S && seg[size_t(b * S + e)] == seg[size_t(b * S + s)]) ++e;
      if (seg[size_t(b * S + s)] != 0) out.push_back({b, s, e});
      s = e;
    }
  return out;
}

// Rows [t0, t1) of row b of x [B, T, H, D] as a tensor [1, t1 - t0, H, D].
Tensor rows_of(const std::vector<double>& x, const Shape& shape, int64_t b, int64_t t0, int64_t t1, DType dt,
               const BackendPtr& be) {
  const int64_t T = shape[1], row = shape[2] * shape[3];
  std::vector<double> part(x.begin() + (b * T + t0) * row, x.begin() + (b * T + t1) * row);
  Tensor d = Tensor::from_host(part.data(), {1, t1 - t0, shape[2], shape[3]}, DType::f64, be);
  if (dt == DType::f64) return d;
  Tensor out = Tensor::empty(d.shape(), dt, be);
  be->cast(d, out);
  return out;
}

Tensor make(const std::vector<double>& x, const Shape& shape, DType dt, const BackendPtr& be) {
  Tensor d = Tensor::from_host(x.data(), shape, DType::f64, be);
  if (dt == DType::f64) return d;
  Tensor out = Tensor::empty(shape, dt, be);
  be->cast(d, out);
  return out;
}

std::vector<double> uniform(int64_t n, uint64_t stream) {
  const Tensor t = Tensor::uniform({n}, -1.0f, 1.0f, 7, stream, backend("ref"));
  const std::vector<float> f = t.to_floats();
  return {f.begin(), f.end()};
}

struct Case {
  int64_t B, T, Hq, Hkv, D, max_len, pad;
  bool causal;
  int64_t window;
  float softcap;
};

// Attention with segment ids against each document run alone (no segment ids), forward and backward.
void check_against_documents(const BackendPtr& be, DType dt, const Case& c, double tol) {
  const int64_t B = c.B, T = c.T;
  const Shape qs{B, T, c.Hq, c.D}, ks{B, T, c.Hkv, c.D};
  const int64_t nq = B * T * c.Hq * c.D, nk = B * T * c.Hkv * c.D;
  const std::vector<double> q = uniform(nq, 1), k = uniform(nk, 2), v = uniform(nk, 3), dout = uniform(nq, 4);
  const std::vector<int32_t> seg = packed_segments(B, T, c.max_len, c.pad, uint64_t(T));
  AttentionParams p;
  p.scale = float(1.0 / std::sqrt(double(c.D)));
  p.causal = c.causal;
  p.window = c.window;
  p.softcap = c.softcap;

  const Tensor Q = make(q, qs, dt, be), K = make(k, ks, dt, be), V = make(v, ks, dt, be), G = make(dout, qs, dt, be);
  const Tensor SEG = Tensor::from_ints(seg, {B, T}, be);
  Tensor out = Tensor::empty(qs, dt, be), lse = Tensor::empty({B, c.Hq, T}, DType::f32, be);
  if (dt == DType::f64) lse = Tensor::empty({B, c.Hq, T}, DType::f64, be);
  be->attention(Q, K, V, SEG, out, lse, p);
  Tensor dq = Tensor::empty(qs, dt, be), dk = Tensor::empty(ks, dt, be), dv = Tensor::empty(ks, dt, be);
  be->attention_backward(Q, K, V, SEG, out, lse, G, dq, dk, dv, p);
  const std::vector<double> O = out.to_doubles(), L = lse.to_doubles(), dQ = dq.to_doubles(), dK = dk.to_doubles(),
                            dV = dv.to_doubles();

  std::vector<bool> covered(size_t(B * T), false);
  double worst = 0;
  for (const Docs& d : documents(seg, B, T)) {
    const int64_t n = d.end - d.begin;
    const Tensor q1 = rows_of(q, qs, d.b, d.begin, d.end, dt, be), k1 = rows_of(k, ks, d.b, d.begin, d.end, dt, be),
                 v1 = rows_of(v, ks, d.b, d.begin, d.end, dt, be), g1 = rows_of(dout, qs, d.b, d.begin, d.end, dt, be);
    Tensor o1 = Tensor::empty(q1.shape(), dt, be), l1 = Tensor::empty({1, c.Hq, n}, lse.dtype(), be);
    be->attention(q1, k1, v1, Tensor(), o1, l1, p);
    Tensor dq1 = Tensor::empty(q1.shape(), dt, be), dk1 = Tensor::empty(k1.shape(), dt, be),
           dv1 = Tensor::empty(k1.shape(), dt, be);
    be->attention_backward(q1, k1, v1, Tensor(), o1, l1, g1, dq1, dk1, dv1, p);
    const std::vector<double> o = o1.to_doubles(), l = l1.to_doubles(), a = dq1.to_doubles(), bk = dk1.to_doubles(),
                              bv = dv1.to_doubles();
    for (int64_t t = 0; t < n; ++t) {
      covered[size_t(d.b * T + d.begin + t)] = true;
      for (int64_t i = 0; i < c.Hq * c.D; ++i) {
        const size_t at = size_t((d.b * T + d.begin + t) * c.Hq * c.D + i), here = size_t(t * c.Hq * c.D + i);
        worst = std::max({worst, std::fabs(O[at] - o[here]), std::fabs(dQ[at] - a[here])});
      }
      for (int64_t i = 0; i < c.Hkv * c.D; ++i) {
        const size_t at = size_t((d.b * T + d.begin + t) * c.Hkv * c.D + i), here = size_t(t * c.Hkv * c.D + i);
        worst = std::max({worst, std::fabs(dK[at] - bk[here]), std::fabs(dV[at] - bv[here])});
      }
      for (int64_t h = 0; h < c.Hq; ++h)
        worst = std::max(worst, std::fabs(L[size_t((d.b * c.Hq + h) * T + d.begin + t)] - l[size_t(h * n + t)]));
    }
  }
  // Padding (segment 0) sees nothing and is seen by nothing: zeros, lse -inf, zero gradients.
  int64_t padded = 0;
  for (int64_t r = 0; r < B * T; ++r) {
    if (covered[size_t(r)]) continue;
    ++padded;
    for (int64_t i = 0; i < c.Hq * c.D; ++i) {
      CHECK(O[size_t(r * c.Hq * c.D + i)] == 0.0);
      CHECK(dQ[size_t(r * c.Hq * c.D + i)] == 0.0);
    }
    for (int64_t i = 0; i < c.Hkv * c.D; ++i) {
      CHECK(dK[size_t(r * c.Hkv * c.D + i)] == 0.0);
      CHECK(dV[size_t(r * c.Hkv * c.D + i)] == 0.0);
    }
    const int64_t b = r / T, t = r % T;
    for (int64_t h = 0; h < c.Hq; ++h) CHECK(std::isinf(L[size_t((b * c.Hq + h) * T + t)]));
  }
  CHECK(padded == c.pad);
  CHECK(worst <= tol);
  MESSAGE(std::string(be->name()), " ", std::string(dtype_name(dt)), " T ", T, ": ", documents(seg, B, T).size(), " documents, max |diff| ",
          worst);
}

}  // namespace

TEST_CASE("attention with segment ids equals attention over each document alone: ref in f64") {
  const BackendPtr ref = backend("ref");
  REQUIRE(ref);
  check_against_documents(ref, DType::f64, {2, 37, 4, 2, 8, 9, 5, true, 0, 0.0f}, 1e-12);
  check_against_documents(ref, DType::f64, {1, 30, 2, 2, 8, 12, 0, false, 0, 0.0f}, 1e-12);
  check_against_documents(ref, DType::f64, {1, 41, 2, 1, 8, 15, 3, true, 6, 2.5f}, 1e-12);
}

TEST_CASE("attention with segment ids equals attention over each document alone: cpu (tiles skipped)") {
  const BackendPtr cpu = backend("cpu");
  if (!cpu) {
    MESSAGE("the cpu backend is not built: skipped");
    return;
  }
  // Rows of several 64-wide tiles with short documents (most tile pairs skipped), long documents (tiles
  // inside one document), grouped heads, padding, a non-causal case, the decode-size row path (T <= 4 is
  // a q_offset case; here T >= 5 rows), a window and a softcap.
  check_against_documents(cpu, DType::f32, {2, 300, 4, 2, 32, 20, 17, true, 0, 0.0f}, 2e-5);
  check_against_documents(cpu, DType::f32, {1, 260, 2, 2, 64, 150, 0, true, 0, 0.0f}, 2e-5);
  check_against_documents(cpu, DType::f32, {2, 130, 2, 1, 16, 40, 9, false, 0, 0.0f}, 2e-5);
  check_against_documents(cpu, DType::f32, {1, 200, 2, 2, 16, 50, 0, true, 24, 3.0f}, 2e-5);
  check_against_documents(cpu, DType::f32, {3, 70, 2, 2, 13, 7, 4, true, 0, 0.0f}, 2e-5);  // odd head width
}

TEST_CASE("attention with segment ids: gradients pass central finite differences in double on ref") {
  const BackendPtr be = backend("ref");
  REQUIRE(be);
  const int64_t B = 2, T = 11, Hq = 2, Hkv = 1, D = 4;
  const Shape qs{B, T, Hq, D}, ks{B, T, Hkv, D};
  std::vector<double> q = uniform(B * T * Hq * D, 11), k = uniform(B * T * Hkv * D, 12), v = uniform(B * T * Hkv * D, 13);
  const std::vector<double> w = uniform(B * T * Hq * D, 14);  // f = sum(out * w)
  const std::vector<int32_t> seg = {1, 1, 1, 2, 2, 3, 3, 3, 3, 4, 0, 1, 2, 2, 2, 2, 2, 3, 3, 0, 0, 0};
  const Tensor SEG = Tensor::from_ints(seg, {B, T}, be);
  for (bool causal : {true, false}) {
    AttentionParams p;
    p.scale = 0.7f;
    p.causal = causal;
    p.softcap = causal ? 0.0f : 2.0f;
    auto f = [&](const std::vector<double>& qv, const std::vector<double>& kv, const std::vector<double>& vv) {
      Tensor out = Tensor::empty(qs, DType::f64, be), lse = Tensor::empty({B, Hq, T}, DType::f64, be);
      be->attention(make(qv, qs, DType::f64, be), make(kv, ks, DType::f64, be), make(vv, ks, DType::f64, be), SEG, out,
                    lse, p);
      const std::vector<double> o = out.to_doubles();
      double s = 0;
      for (size_t i = 0; i < o.size(); ++i) s += o[i] * w[i];
      return s;
    };
    const Tensor Q = make(q, qs, DType::f64, be), K = make(k, ks, DType::f64, be), V = make(v, ks, DType::f64, be);
    Tensor out = Tensor::empty(qs, DType::f64, be), lse = Tensor::empty({B, Hq, T}, DType::f64, be);
    be->attention(Q, K, V, SEG, out, lse, p);
    Tensor dq = Tensor::empty(qs, DType::f64, be), dk = Tensor::empty(ks, DType::f64, be),
           dv = Tensor::empty(ks, DType::f64, be);
    be->attention_backward(Q, K, V, SEG, out, lse, make(w, qs, DType::f64, be), dq, dk, dv, p);
    const std::vector<double> grads[3] = {dq.to_doubles(), dk.to_doubles(), dv.to_doubles()};
    std::vector<double>* xs[3] = {&q, &k, &v};
    const double h = 1e-6;
    double worst = 0, largest = 0;
    for (int which = 0; which < 3; ++which) {
      std::vector<double>& x = *xs[which];
      for (size_t i = 0; i < x.size(); ++i) {
        const double x0 = x[i];
        x[i] = x0 + h;
        const double up = f(q, k, v);
        x[i] = x0 - h;
        const double down = f(q, k, v);
        x[i] = x0;
        const double numeric = (up - down) / (2 * h);
        worst = std::max(worst, std::fabs(numeric - grads[which][i]));
        largest = std::max(largest, std::fabs(numeric));
      }
    }
    CHECK(largest > 0.1);  // the check is not vacuous
    CHECK(worst < 1e-7);
    MESSAGE("causal ", causal, ": max |numeric - analytic| ", worst, " (largest gradient ", largest, ")");
  }
}

// The lm objective on packed rows: loss = sum over documents of their next-token cross-entropy / the number
// of targets that are not padding (a document's first token is predicted from its start token, the
// document token that ended the one before, and its end from its own text). Each document piece is run
// alone through the model (its own forward from position 0, no segment ids) and its cross-entropy is
// summed here in double from the logits.
TEST_CASE("lm: the loss of a packed batch is the token-weighted mean of each document's loss alone") {
  for (const char* be_name : {"ref", "cpu"}) {
    const BackendPtr be = backend(be_name);
    if (!be) continue;
    set_default_backend(be);
    Config cfg = Config::parse_ini(
        "[objective]\nplugin = lm\nsample_tokens = 0\nvocab_size = 13\n"
        "[model]\nplugin = causal_transformer\ndim = 32\nn_layers = 2\nn_heads = 4\nn_kv_heads = 2\nmax_seq_len = 40\n"
        "[data]\nbatch_size = 2\n");
    auto obj = Registry::global().create<Objective>("lm", cfg.section("objective"));
    ObjectiveContext ctx{&cfg, be, 3, nullptr};
    obj->build(ctx);
    // Two rows of 33 tokens: documents end with token 12 (the document token), which as an input starts the
    // next document (its segment, position 0), as the tokens source lays rows out; row 1 starts mid-document
    // and ends with 3 padding tokens (segment 0).
    const int64_t B = 2, N = 33, pad = 3;
    std::vector<int32_t> text(size_t(B * N)), seg(size_t(B * N)), pos(size_t(B * N));
    uint64_t x = 99;
    for (int64_t b = 0; b < B; ++b) {
      int32_t id = 1, at = 0;
      int64_t left = b == 0 ? 5 : 9;
      for (int64_t j = 0; j < N; ++j) {
        x = x * 6364136223846793005ull + 1442695040888963407ull;
        const bool last = --left == 0;
        if (j > 0 && text[size_t(b * N + j - 1)] == 12) ++id, at = 0;
        text[size_t(b * N + j)] = last ? 12 : int32_t((x >> 33) % 12);
        seg[size_t(b * N + j)] = id;
        pos[size_t(b * N + j)] = at++;
        if (last) left = 1 + int64_t((x >> 40) % 11);
      }
    }
    for (int64_t j = N - pad; j < N; ++j) text[size_t(N + j)] = 0, seg[size_t(N + j)] = 0, pos[size_t(N + j)] = 0;
    Batch batch{{"text", Tensor::from_ints(text, {B, N}, be)},
                {"text_segment_ids", Tensor::from_ints(seg, {B, N}, be)},
                {"text_positions", Tensor::from_ints(pos, {B, N}, be)}};
    const StepResult r = obj->step(batch, {0, 0, 1});
    const double packed_loss = r.loss.item();

    // Each document alone: its own inputs (from its start token) predict the next token of the row, the
    // document token that ends it included, unless that next token is padding or past the row.
    Model& model = *obj->main_model();
    double nats = 0;
    int64_t targets = 0, pieces = 0;
    for (int64_t b = 0; b < B; ++b)
      for (int64_t s = 0; s < N;) {
        int64_t e = s + 1;
        while (e < N && seg[size_t(b * N + e)] == seg[size_t(b * N + s)]) ++e;
        int64_t m = s;  // inputs [s, m) have a target that is not padding
        while (m < e && m + 1 < N && seg[size_t(b * N + m + 1)] != 0) ++m;
        if (seg[size_t(b * N + s)] != 0) ++pieces;
        if (seg[size_t(b * N + s)] != 0 && m > s) {
          std::vector<int32_t> in(text.begin() + b * N + s, text.begin() + b * N + m);
          NoGradGuard no_grad;
          const std::vector<double> logits =
              model.forward({{"tokens", Tensor::from_ints(in, {1, m - s}, be)}}).to_doubles();
          for (int64_t t = 0; t < m - s; ++t) {
            const double* z = logits.data() + t * 13;
            const double mx = *std::max_element(z, z + 13);
            double sum = 0;
            for (int v = 0; v < 13; ++v) sum += std::exp(z[v] - mx);
            nats += mx + std::log(sum) - z[text[size_t(b * N + s + t + 1)]];
            ++targets;
          }
        }
        s = e;
      }
    REQUIRE(pieces > 6);
    CHECK(targets == B * (N - 1) - pad);  // every target but padding: documents' first and last tokens too
    CHECK(r.device_tokens.item() == double(targets));
    CHECK(packed_loss == doctest::Approx(nats / double(targets)).epsilon(1e-5));
    MESSAGE(std::string(be_name), ": packed loss ", packed_loss, ", per-document mean ", nats / double(targets), " over ", targets,
            " targets in ", pieces, " pieces");

    // The same rows without segment ids attend across documents (and score the padding): another loss.
    Batch unpacked{{"text", batch.at("text")}};
    const StepResult u = obj->step(unpacked, {0, 0, 1});
    CHECK(u.device_tokens.item() == double(B * (N - 1)));
    CHECK(std::fabs(u.loss.item() - packed_loss) > 1e-4);
  }
}

TEST_CASE("[data] pack = true on a source without document boundaries is refused in one line") {
  load_plugins();
  Options section({{"source", "synthetic"}, {"kind", "tokens"}, {"batch_size", "2"}, {"pack", "true"}}, "data");
  try {
    make_loader(section, "train", 0);
    FAIL("pack = true was accepted by the synthetic source");
  } catch (const UsageError& e) {
    const std::string m = e.what();
    CHECK(m.find("'data.pack' = true: the synthetic source has no document boundaries") != std::string::npos);
    CHECK(m.find('\n') == std::string::npos);
  }
}
