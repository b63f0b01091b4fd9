// tests/serve/test_serve.cpp — continuous-batching serving: dew::serve::Scheduler without sockets and the
// HTTP front of `dew-run serve` in-process on an ephemeral port.
//
// What a wrong implementation would fail:
//  * slot decoding: every row of forward_slots (batched decode rows, per-slot prefills, slots cleared and
//    reused) is bit-equal to the same sequence decoded alone, on ref and on cpu (the row-wise matmul), for
//    the causal_transformer's batched path and for the generic per-slot default;
//  * a bf16 K/V cache: served = solo and batch-B = batch-1 bit for bit (ref, cpu), logits within a stated
//    number of bf16 epsilons of the f32 cache's and never equal to them;
//  * decode fusion: with q/k/v and gate/up packed back to back (store_matmul_weights_as) a decode step's one
//    product per group gives the separate products' logits bit for bit (cpu, f32 and bf16 weights);
//  * the decode step program (decoder_start's replay): every one-token step's logits bit-equal to eager decoding
//    (ref, cpu; f32, bf16 and int8 weights; f32 and bf16 caches), the model called for the prefill and three
//    steps only, greedy and sampled generations equal, a context crop re-recording, and a decoder whose step
//    reads back to the host left eager (and still equal);
//  * the scheduler: mixed prompt lengths (one token, longer than the context), budgets (0, 1, past the
//    context: refill), sampling settings, EOS and stop strings, more requests than slots — each result
//    equals dew::generate() alone (tokens, text, finish reason); slot reuse happens in the very next
//    iteration; a full queue refuses; streamed text concatenates to the final text;
//  * HTTP: 400 with a JSON error naming the field for malformed JSON, unknown fields, wrong types and
//    out-of-range values; 404 for an unknown model or path; 429 (Retry-After) when slots and queue are
//    full; SSE chunks whose text concatenates to the non-streaming text; concurrent clients and `n`
//    choices equal their solo results; a dropped stream frees its slot.
//  * images (a tiny diffusion run trained in the test): POST /v1/images returns one PNG per asked image,
//    byte-equal to the objective's generate_images() for the same keys, seeded, with the [sampler]
//    section's defaults; 400s for unknown fields, labels outside the classes, too many images or steps.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <httplib.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "dew/autograd.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/model.hpp"
#include "dew/objective.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/serve.hpp"
#include "dew/tokenizer.hpp"
#include "dew/train.hpp"
#include "route_bodies.hpp"
#include "serve.hpp"

using dew::Tensor;
using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

dew::BackendPtr backend(const std::string& name) {
  static std::map<std::string, dew::BackendPtr> made;
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "ref"))
    reg.discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu", "causal_transformer"});
  auto& b = made[name];
  if (!b) b = dew::create_backend(name);
  dew::set_default_backend(b);
  return b;
}

// A random-init byte-vocabulary decoder (the byte tokenizer's 256 ids) with a short context.
std::shared_ptr<dew::Model> tiny_model(const std::string& be, int64_t dim = 32, int64_t context = 24,
                                       uint64_t seed = 3) {
  backend(be);
  dew::Options o({{"vocab_size", "256"},
                  {"dim", std::to_string(dim)},
                  {"n_layers", "2"},
                  {"n_heads", "4"},
                  {"n_kv_heads", "2"},
                  {"max_seq_len", std::to_string(context)}},
                 "model");
  auto m = dew::Registry::global().create<dew::Model>("causal_transformer", o);
  m->initialize(seed);
  m->set_training(false);
  return m;
}

dew::CausalDecoder& decoder_of(const std::shared_ptr<dew::Model>& m) {
  auto* d = dynamic_cast<dew::CausalDecoder*>(m.get());
  REQUIRE(d != nullptr);
  return *d;
}

// A decoder that only implements the batch-1 interface: slot decoding falls back to the defaults.
class PlainDecoder final : public dew::CausalDecoder {
 public:
  explicit PlainDecoder(dew::CausalDecoder& inner) : inner_(inner) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::unique_ptr<dew::DecodeCache> make_cache(int64_t b, int64_t c) const override { return inner_.make_cache(b, c); }
  Tensor forward_cached(const Tensor& t, dew::DecodeCache& c) override { return inner_.forward_cached(t, c); }
  double flops_per_sequence(int64_t n) const override { return inner_.flops_per_sequence(n); }
  int64_t context_length() const override { return inner_.context_length(); }

 private:
  dew::CausalDecoder& inner_;
};

std::vector<int32_t> random_tokens(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::vector<int32_t> out(n);
  for (auto& t : out) t = int32_t(g() % 256);
  return out;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The largest |a[i] - b[i]| (a and b of one size).
double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, double(std::fabs(a[i] - b[i])));
  return diff;
}

// Teacher-forced decoding of several sequences through a slot cache with `slots` rows: sequence i joins
// at step i (its prompt prefilled alone), every step decodes one token of each other active sequence in
// one batched call, sequences leave when their tokens are used up and their slots are reused. Each row's
// logits must be bit-equal to the sequence decoded alone.
void check_slot_rows(dew::CausalDecoder& dec, const dew::BackendPtr& be, int64_t slots) {
  dew::NoGradGuard ng;
  struct Seq {
    std::vector<int32_t> prompt, rest;
    std::vector<std::vector<float>> solo;  // logits of the prompt's last position, then of each rest token
    std::vector<float> solo_last;          // the prompt's last position through forward_cached_last
    int64_t slot = -1;
    size_t fed = 0;  // rest tokens fed
  };
  std::vector<Seq> seqs;
  const std::vector<size_t> prompt_len = {1, 5, 9, 2, 13, 1, 7};
  const std::vector<size_t> rest_len = {6, 3, 9, 1, 4, 8, 5};
  for (size_t i = 0; i < prompt_len.size(); ++i) {
    Seq s;
    s.prompt = random_tokens(prompt_len[i], 11 + uint32_t(i));
    s.rest = random_tokens(rest_len[i], 101 + uint32_t(i));
    auto cache = dec.make_cache(1, 32);
    auto last_row = [](const Tensor& logits) {
      const int64_t t = logits.shape()[1], v = logits.shape()[2];
      return dew::reshape(logits, {t, v}).slice0(t - 1, t).to_floats();
    };
    s.solo.push_back(
        last_row(dec.forward_cached(Tensor::from_ints(s.prompt, {1, int64_t(s.prompt.size())}, be), *cache)));
    for (int32_t t : s.rest) s.solo.push_back(last_row(dec.forward_cached(Tensor::from_ints({t}, {1, 1}, be), *cache)));
    auto fresh = dec.make_cache(1, 32);
    const Tensor last = dec.forward_cached_last(Tensor::from_ints(s.prompt, {1, int64_t(s.prompt.size())}, be), *fresh);
    REQUIRE(last.shape() == dew::Shape{1, 1, 256});
    s.solo_last = last.to_floats();
    seqs.push_back(std::move(s));
  }
  auto cache = dec.make_slot_cache(slots, 32);
  std::vector<bool> busy(size_t(slots), false);
  size_t next = 0, checked = 0, reused = 0;
  std::vector<bool> ever(size_t(slots), false);
  for (int step = 0; step < 100 && checked < seqs.size(); ++step) {
    // Decode one token of every active sequence (before admitting: admitted ones prefill below).
    std::vector<int64_t> rows;
    std::vector<int32_t> toks;
    std::vector<size_t> who;
    for (size_t i = 0; i < next; ++i)
      if (seqs[i].slot >= 0) {
        rows.push_back(seqs[i].slot);
        toks.push_back(seqs[i].rest[seqs[i].fed]);
        who.push_back(i);
      }
    if (!rows.empty()) {
      const Tensor logits = dec.forward_slots(Tensor::from_ints(toks, {int64_t(toks.size()), 1}, be), rows, *cache);
      REQUIRE(logits.shape() == dew::Shape{int64_t(rows.size()), 1, 256});
      const std::vector<float> all = logits.to_floats();
      for (size_t r = 0; r < who.size(); ++r) {
        Seq& s = seqs[who[r]];
        const std::vector<float> row(all.begin() + int64_t(r) * 256, all.begin() + int64_t(r + 1) * 256);
        ++s.fed;
        CHECK_MESSAGE(same_bits(row, s.solo[s.fed]), "sequence ", who[r], " token ", s.fed, " in a batch of ",
                      rows.size());
        CHECK(cache->length(s.slot) == int64_t(s.prompt.size() + s.fed));
        if (s.fed == s.rest.size()) {  // done: the slot frees
          cache->clear(s.slot);
          busy[size_t(s.slot)] = false;
          s.slot = -1;
          ++checked;
        }
      }
    }
    // Admit the next sequence into a free slot and prefill it alone.
    for (int64_t sl = 0; sl < slots && next < seqs.size(); ++sl)
      if (!busy[size_t(sl)]) {
        Seq& s = seqs[next];
        if (ever[size_t(sl)]) ++reused;
        ever[size_t(sl)] = busy[size_t(sl)] = true;
        s.slot = sl;
        CHECK(cache->length(sl) == 0);
        // Every other prefill through the last-position form (serving's), against forward_cached_last alone.
        const Tensor prompt = Tensor::from_ints(s.prompt, {1, int64_t(s.prompt.size())}, be);
        if (next % 2 == 1) {
          const Tensor logits = dec.forward_slots_last(prompt, {sl}, *cache);
          REQUIRE(logits.shape() == dew::Shape{1, 1, 256});
          CHECK_MESSAGE(same_bits(logits.to_floats(), s.solo_last), "last-position prefill of sequence ", next);
        } else {
          const Tensor logits = dec.forward_slots(prompt, {sl}, *cache);
          const int64_t t = logits.shape()[1];
          CHECK_MESSAGE(same_bits(dew::reshape(logits, {t, 256}).slice0(t - 1, t).to_floats(), s.solo[0]),
                        "prefill of sequence ", next);
        }
        ++next;
        break;
      }
  }
  CHECK(checked == seqs.size());
  CHECK(reused > 0);
}

}  // namespace

TEST_CASE("slot decoding: batched rows equal solo decoding bit for bit (ref, cpu, batched and default paths)") {
  for (const char* be : {"ref", "cpu"}) {
    CAPTURE(be);
    auto m = tiny_model(be, 64, 64);
    dew::CausalDecoder& dec = decoder_of(m);
    check_slot_rows(dec, backend(be), 3);
    check_slot_rows(dec, backend(be), 7);
    PlainDecoder plain(dec);
    check_slot_rows(plain, backend(be), 3);
  }
  // Misuse is refused with a message.
  auto m = tiny_model("ref");
  dew::NoGradGuard ng;
  auto cache = decoder_of(m).make_slot_cache(2, 8);
  CHECK_THROWS_AS(decoder_of(m).forward_slots(Tensor::from_ints({1, 2}, {2, 1}, backend("ref")), {0, 0}, *cache),
                  dew::Error);
  CHECK_THROWS_AS(decoder_of(m).forward_slots(Tensor::from_ints({1}, {1, 1}, backend("ref")), {2}, *cache), dew::Error);
  CHECK_THROWS_AS(
      decoder_of(m).forward_slots(Tensor::from_ints(std::vector<int32_t>(9, 1), {1, 9}, backend("ref")), {0}, *cache),
      dew::Error);
}

// Weight-only bf16 and int8 storage (dew::store_matmul_weights_as, `--weights bf16|int8`): the matmul weights
// become bf16 (or int8 with per-block scales) in place, the logits stay f32 and close to the f32 model's (the
// weights' rounding only: bf16 keeps 8 bits of mantissa, int8 blocks +-127 steps of absmax / 127), and a
// sequence batched with others still decodes bit-equal to itself alone.
// forward_cached_last / forward_slots_last (a prefill that needs the next token only): the head runs on the last
// position alone; its logits are the full form's last position (bit for bit on ref, whose products compute each row
// alone; within rounding on cpu, whose one-row product takes another path), and the cache fills as the full form's
// (the next step's logits equal bit for bit).
TEST_CASE("last-position prefill: the full form's last logits, the same cache (ref, cpu), 2 sequences") {
  for (const std::string be_name : {"ref", "cpu"}) {
    CAPTURE(be_name);
    auto m = tiny_model(be_name, 64, 64);
    dew::CausalDecoder& dec = decoder_of(m);
    const dew::BackendPtr be = backend(be_name);
    dew::NoGradGuard ng;
    const Tensor prompt = Tensor::from_ints(random_tokens(2 * 9, 21), {2, 9}, be);
    auto full_cache = dec.make_cache(2, 16), last_cache = dec.make_cache(2, 16);
    const Tensor full = dec.forward_cached(prompt, *full_cache);
    const Tensor last = dec.forward_cached_last(prompt, *last_cache);
    REQUIRE(last.shape() == dew::Shape{2, 1, 256});
    const std::vector<float> want = dew::slice(full, 1, 8, 9).to_floats(), got = last.to_floats();
    const double diff = max_abs_diff(want, got);
    if (be_name == "ref")
      CHECK(same_bits(want, got));
    else
      CHECK(diff < 1e-4);
    CHECK(last_cache->length() == 9);
    const Tensor next = Tensor::from_ints({5, 7}, {2, 1}, be);
    CHECK(same_bits(dec.forward_cached(next, *full_cache).to_floats(),
                    dec.forward_cached(next, *last_cache).to_floats()));
  }
}

TEST_CASE("slot decoding with bf16 and int8 weights: served rows equal solo bit for bit, logits near f32's") {
 for (const dew::DType dt : {dew::DType::bf16, dew::DType::i8}) {
  CAPTURE(dew::dtype_name(dt));
  auto f32_model = tiny_model("cpu", 64, 64), m = tiny_model("cpu", 64, 64);
  const dew::NamedTensors params = m->named_parameters();
  const int64_t changed = dew::store_matmul_weights_as(params, dt);
  int64_t matrices = 0;
  for (const auto& [name, p] : params)
    if (p.ndim() == 2 && name.find("embed") == std::string::npos) {
      ++matrices;
      CHECK_MESSAGE(p.dtype() == dt, name);
      CHECK_MESSAGE(p.quantized() == (dt == dew::DType::i8), name);
    } else if (name == "model.embed_tokens.weight") {  // the tied head, stored as the other matrices
      ++matrices;
      CHECK(p.dtype() == dt);
      CHECK(p.quantized() == (dt == dew::DType::i8));
      const Tensor f32_table = f32_model->named_parameters()[0].second;
      if (dt == dew::DType::bf16) CHECK(p.to_floats() == dew::cast(f32_table, dt).to_floats());
      // the lookup gives its rows as stored: bf16 (nn::Embedding widens them), int8 dequantized to f32
      const Tensor ids = Tensor::from_ints({7, 0, 255, 7}, {2, 2}, backend("cpu"));
      const Tensor rows = dew::embedding(p, ids);
      CHECK(rows.shape() == dew::Shape{2, 2, 64});
      CHECK(rows.dtype() == (dt == dew::DType::i8 ? dew::DType::f32 : dew::DType::bf16));
      const std::vector<float> all = dew::cast(p, dew::DType::f32).to_floats(), got = rows.to_floats();
      int off = 0;
      const int32_t picked[] = {7, 0, 255, 7};
      for (int r = 0; r < 4; ++r)
        for (int c = 0; c < 64; ++c) off += got[size_t(r * 64 + c)] != all[size_t(picked[r] * 64 + c)];
      CHECK(off == 0);
    } else {
      CHECK_MESSAGE(p.dtype() == dew::DType::f32, name);  // norms stay f32
    }
  CHECK(changed == matrices);
  CHECK(changed >= 2 * 7);  // q, k, v, o, gate, up, down per layer
  // ... all in one storage, in the parameters' order (a decode step's), each where the one before ends, holding
  // the very values a cast of the f32 weight alone gives
  const dew::NamedTensors f32_params = f32_model->named_parameters();
  const dew::Storage* one = nullptr;
  size_t end = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& [name, p] = params[i];
    if (p.ndim() != 2 || name.find("embed") != std::string::npos) continue;
    CAPTURE(name);
    if (!one) one = p.impl()->storage.get();
    CHECK(p.impl()->storage.get() == one);
    const size_t begin = p.impl()->offset * dew::dtype_size(dt);
    CHECK(begin == end);
    end = begin + p.nbytes();
    if (dt == dew::DType::bf16) CHECK(p.to_floats() == dew::cast(f32_params[i].second, dt).to_floats());
  }
  CHECK(end == one->bytes);
  dew::NoGradGuard ng;
  const Tensor prompt = Tensor::from_ints(random_tokens(9, 5), {1, 9}, backend("cpu"));
  auto c16 = decoder_of(m).make_cache(1, 32), c32 = decoder_of(f32_model).make_cache(1, 32);
  const std::vector<float> l16 = decoder_of(m).forward_cached(prompt, *c16).to_floats();
  const std::vector<float> l32 = decoder_of(f32_model).forward_cached(prompt, *c32).to_floats();
  REQUIRE(l16.size() == l32.size());
  double diff = 0, scale = 0;
  for (size_t i = 0; i < l16.size(); ++i) {
    diff = std::max(diff, double(std::fabs(l16[i] - l32[i])));
    scale = std::max(scale, double(std::fabs(l32[i])));
  }
  CHECK(diff > 0);             // the weights really are rounded
  CHECK(diff < 0.05 * scale);  // ... and only they are
  check_slot_rows(decoder_of(m), backend("cpu"), 3);
  check_slot_rows(decoder_of(m), backend("cpu"), 7);
 }
  CHECK(dew::weights_dtype_from_name("int8", "--weights") == dew::DType::i8);
  CHECK_THROWS_AS(dew::weights_dtype_from_name("int4", "--weights"), dew::Error);
  CHECK_THROWS_AS(dew::weights_dtype_from_name("i8", "--weights"), dew::Error);
}

namespace {
// The logits of a prefill of `prompt` then one token per row of `rest`, for B sequences decoded together in
// one batch-B cache (prompt and rest [B, n], row-major), flattened per sequence: [B][steps * V].
std::vector<std::vector<float>> batch_logits(dew::CausalDecoder& dec, const dew::BackendPtr& be, int64_t B,
                                             const std::vector<int32_t>& prompt, const std::vector<int32_t>& rest) {
  const int64_t p = int64_t(prompt.size()) / B, r = int64_t(rest.size()) / B, V = dec.vocab_size();
  auto cache = dec.make_cache(B, p + r);
  std::vector<std::vector<float>> out(static_cast<size_t>(B));
  auto add = [&](const Tensor& logits) {
    const std::vector<float> all = logits.to_floats();
    const int64_t per = int64_t(all.size()) / B;
    for (int64_t b = 0; b < B; ++b)
      out[size_t(b)].insert(out[size_t(b)].end(), all.begin() + b * per, all.begin() + (b + 1) * per);
  };
  add(dec.forward_cached(Tensor::from_ints(prompt, {B, p}, be), *cache));
  for (int64_t i = 0; i < r; ++i) {
    std::vector<int32_t> col;
    for (int64_t b = 0; b < B; ++b) col.push_back(rest[size_t(b * r + i)]);
    add(dec.forward_cached(Tensor::from_ints(col, {B, 1}, be), *cache));
  }
  for (auto& o : out) REQUIRE(int64_t(o.size()) == (p + r) * V);
  return out;
}
}  // namespace

// A bf16 K/V cache (dew::store_decode_weights_as, what `--weights bf16` asks for): keys and values rounded
// to bf16 as they are appended, attention reading them with f32 arithmetic. On ref (the core widens K/V for
// its f32 kernel) and cpu (the decode row path reads bf16): a served row equals the sequence decoded alone
// (batched slot path and per-slot default), a batch-3 cache equals three batch-1 caches (batch invariance),
// bit for bit; and the logits stay within eps/2 (eps = 2^-7, bf16's epsilon; eps/2 bounds K and V's own relative
// rounding) of the largest logit of the same bf16-weight model decoding over an f32 cache (measured: 0.04 eps),
// and differ from them (the rounding is real: an unrounded or an f32 cache gives equal logits; a cache read as
// the wrong type or at the wrong positions fails the bound).
TEST_CASE("bf16 K/V cache: served rows equal solo, batch invariance, logits near the f32 cache's (ref, cpu)") {
  for (const std::string be : {"ref", "cpu"}) {
    CAPTURE(be);
    auto m = tiny_model(be, 64, 64);
    dew::CausalDecoder& dec = decoder_of(m);
    CHECK(dec.cache_dtype() == dew::DType::f32);  // the default
    const int64_t changed = dew::store_decode_weights_as(&dec, m->named_parameters(), dew::DType::bf16);
    CHECK(changed >= 2 * 7);
    CHECK(dec.cache_dtype() == dew::DType::bf16);
    check_slot_rows(dec, backend(be), 3);
    check_slot_rows(dec, backend(be), 7);
    PlainDecoder plain(dec);  // its per-slot batch-1 caches come from the model: bf16 too
    check_slot_rows(plain, backend(be), 3);

    dew::NoGradGuard ng;
    const int64_t B = 3;
    const std::vector<int32_t> prompt = random_tokens(size_t(B * 6), 21), rest = random_tokens(size_t(B * 9), 22);
    const auto together = batch_logits(dec, backend(be), B, prompt, rest);
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<int32_t> p1(prompt.begin() + b * 6, prompt.begin() + (b + 1) * 6);
      const std::vector<int32_t> r1(rest.begin() + b * 9, rest.begin() + (b + 1) * 9);
      CHECK_MESSAGE(same_bits(batch_logits(dec, backend(be), 1, p1, r1)[0], together[size_t(b)]), "row ", b);
    }
    dec.set_cache_dtype(dew::DType::f32);  // the same bf16 weights over an f32 cache
    const auto f32_cache = batch_logits(dec, backend(be), B, prompt, rest);
    dec.set_cache_dtype(dew::DType::bf16);
    const double eps = 1.0 / 128.0;
    double worst = 0, largest = 0;
    for (int64_t b = 0; b < B; ++b)
      for (size_t i = 0; i < together[size_t(b)].size(); ++i) {
        worst = std::max(worst, std::fabs(double(together[size_t(b)][i]) - double(f32_cache[size_t(b)][i])));
        largest = std::max(largest, std::fabs(double(f32_cache[size_t(b)][i])));
      }
    CAPTURE(worst / (eps * largest));
    CHECK(worst > 0);
    CHECK(worst <= 0.5 * eps * largest);
  }
  auto m = tiny_model("ref");
  CHECK_THROWS_AS(decoder_of(m).set_cache_dtype(dew::DType::f16), dew::Error);
  PlainDecoder plain(decoder_of(m));
  CHECK_THROWS_AS(plain.set_cache_dtype(dew::DType::bf16), dew::Error);  // the default keeps f32 only
  CHECK_NOTHROW(plain.set_cache_dtype(dew::DType::f32));
}

namespace {
// Each tensor of `params` moved to a storage of its own (values unchanged): undoes the packing of
// store_matmul_weights_as, so a model decodes through the separate products.
void unpack(const dew::NamedTensors& params) {
  for (const auto& [name, p] : params) {
    Tensor own = p.clone();  // the same bytes and layout (a weight in panels keeps its panels)
    p.impl()->storage = own.impl()->storage;
    p.impl()->offset = own.impl()->offset;
    if (p.quantized()) p.impl()->scales = p.scales().clone().impl_ptr();  // its own scales too
  }
}
// Logits of a 9-token prefill, then of 6 single tokens, batch 1.
std::vector<std::vector<float>> decode_logits(dew::CausalDecoder& dec) {
  dew::NoGradGuard ng;
  auto cache = dec.make_cache(1, 32);
  std::vector<std::vector<float>> out{
      dec.forward_cached(Tensor::from_ints(random_tokens(9, 5), {1, 9}, backend("cpu")), *cache).to_floats()};
  for (int32_t t : random_tokens(6, 6))
    out.push_back(dec.forward_cached(Tensor::from_ints({t}, {1, 1}, backend("cpu")), *cache).to_floats());
  return out;
}
}  // namespace

// store_matmul_weights_as places q/k/v and gate/up back to back (core/generate/weights.cpp) and a decode step
// then makes one product per group (core/nn/blocks.cpp): the logits are those of the separate products, bit
// for bit, in f32 and with bf16 and int8 weights (the row-wise products sum each column alike whatever the other
// rows; an int8 group's scales are packed beside its rows).
// In panels too (f32 and bf16: store_matmul_weights_in_panels): the panel kernel sums each column alike whatever
// the other panels, and a group's members are whole panels back to back; and their logits are close to the
// row-major weights' (another order of the same sums).
TEST_CASE("decode fusion: packed q/k/v and gate/up weights decode bit-equal to the separate products (cpu)") {
  for (const bool panels : {false, true})
    for (const dew::DType dt : {dew::DType::f32, dew::DType::bf16, dew::DType::i8}) {
      if (panels && dt == dew::DType::i8) continue;  // int8 keeps its rows
      CAPTURE(panels);
      CAPTURE(dew::dtype_name(dt));
      auto m = tiny_model("cpu", 64, 64);
      const dew::NamedTensors params = m->named_parameters();
      dew::store_matmul_weights_as(params, dt);
      std::vector<std::vector<float>> rows_logits;
      if (panels) {
        rows_logits = decode_logits(decoder_of(m));
        CHECK(dew::store_matmul_weights_in_panels(params) == 14);  // 2 layers x q, k, v, o, gate, up, down
      }
      std::map<std::string, Tensor> by;
      for (const auto& [n, p] : params) by[n] = p;
      for (const std::string l : {"model.layers.0.", "model.layers.1."}) {  // packed: one storage, in order
        const Tensor& q = by.at(l + "self_attn.q_proj.weight");
        const Tensor& k = by.at(l + "self_attn.k_proj.weight");
        const Tensor& g = by.at(l + "mlp.gate_proj.weight");
        const Tensor& u = by.at(l + "mlp.up_proj.weight");
        auto at = [&](const Tensor& t) { return static_cast<const char*>(panels ? t.panel_data() : t.data()); };
        CHECK(at(k) == at(q) + q.nbytes());
        CHECK(at(u) == at(g) + g.nbytes());
        if (dt == dew::DType::i8) {  // and their scales
          CHECK(static_cast<const char*>(k.scales().data()) ==
                static_cast<const char*>(q.scales().data()) + q.scales().nbytes());
          CHECK(static_cast<const char*>(u.scales().data()) ==
                static_cast<const char*>(g.scales().data()) + g.scales().nbytes());
        }
      }
      const auto fused = decode_logits(decoder_of(m));
      unpack(params);
      const auto separate = decode_logits(decoder_of(m));
      REQUIRE(fused.size() == separate.size());
      for (size_t i = 0; i < fused.size(); ++i) CHECK_MESSAGE(same_bits(fused[i], separate[i]), "step ", i);
      for (size_t i = 0; i < rows_logits.size(); ++i) {  // panels against rows: the same sums in another order
        REQUIRE(rows_logits[i].size() == fused[i].size());
        double worst = 0.0;
        for (size_t j = 0; j < fused[i].size(); ++j)
          worst = std::max(worst, double(std::fabs(rows_logits[i][j] - fused[i][j])));
        CHECK_MESSAGE(worst < 1e-3, "step ", i, ": ", worst);
      }
    }
}

namespace {

struct Case {
  std::vector<int32_t> prompt;
  dew::SamplingParams params;
};

// Requests of mixed lengths, budgets and settings against a model with context 24; two are refined
// from their own solo results so that an EOS token and a stop string really end them early.
std::vector<Case> mixed_cases(dew::CausalDecoder& dec, const dew::Tokenizer& tok) {
  std::vector<Case> cs;
  auto add = [&](size_t len, int64_t budget, float temperature, uint64_t seed) {
    Case c;
    c.prompt = random_tokens(len, 1000 + uint32_t(cs.size()));
    c.params.max_new_tokens = budget;
    c.params.temperature = temperature;
    c.params.seed = seed;
    cs.push_back(c);
    return &cs.back();
  };
  add(1, 12, 1.0f, 1);
  add(5, 1, 0.0f, 2);                      // greedy, one token
  add(30, 9, 0.9f, 3);                     // prompt longer than the context: cropped
  add(3, 40, 1.0f, 4)->params.top_k = 20;  // past the context: a refill
  add(8, 0, 1.0f, 5);                      // nothing to generate
  add(2, 15, 1.2f, 6)->params.top_p = 0.9f;
  add(6, 10, 0.7f, 7)->params.repetition_penalty = 1.3f;
  add(4, 25, 1.0f, 8)->params.min_p = 0.05f;
  add(11, 18, 1.0f, 9);  // gets an EOS below
  add(7, 20, 1.0f, 10);  // gets a stop string below
  const auto solo = [&](const Case& c) {
    return dew::generate(dew::decoder_start(dec), {c.prompt}, c.params, &tok, dec.context_length())[0];
  };
  Case& eos = cs[8];
  eos.params.eos_id = solo(eos).tokens.at(6);
  Case& stop = cs[9];
  const std::string text = solo(stop).text;
  stop.params.stop = {"\xff\xfe\xfd-not-there", text.substr(9, 2)};
  Case dup = cs[0];  // the same request twice at once
  cs.push_back(dup);
  cs[1].params.logprobs = 0;  // log-probabilities: the drawn token's only, the 5 likeliest, and cut at a stop string
  cs[3].params.logprobs = 5;
  cs[9].params.logprobs = 2;
  return cs;
}

void expect_equal(const dew::Generation& got, const dew::Generation& want, size_t i) {
  CHECK_MESSAGE(got.tokens == want.tokens, "request ", i);
  CHECK_MESSAGE(got.text == want.text, "request ", i);
  CHECK_MESSAGE(got.finish_reason == want.finish_reason, "request ", i);
  for (const bool prompt : {false, true}) {  // the same doubles: computed from the same logits' bits
    const auto &a = prompt ? got.prompt_logprobs : got.logprobs, &b = prompt ? want.prompt_logprobs : want.logprobs;
    REQUIRE_MESSAGE(a.size() == b.size(), "request ", i, prompt ? " (prompt)" : "");
    for (size_t k = 0; k < a.size(); ++k) {
      CHECK_MESSAGE(a[k].token == b[k].token, "request ", i, " token ", k, prompt ? " (prompt)" : "");
      CHECK_MESSAGE(a[k].logprob == b[k].logprob, "request ", i, " token ", k, prompt ? " (prompt)" : "");
      CHECK_MESSAGE(a[k].top == b[k].top, "request ", i, " token ", k, prompt ? " (prompt)" : "");
    }
  }
}

}  // namespace

// Counts forward_cached calls; with `read_back` each call also reads its logits to the host inside the step (as
// a decoder whose control flow looked at values would), which no step program can replay.
class CountingDecoder final : public dew::CausalDecoder {
 public:
  CountingDecoder(dew::CausalDecoder& inner, bool read_back) : inner_(inner), read_back_(read_back) {}
  int64_t vocab_size() const override { return inner_.vocab_size(); }
  std::unique_ptr<dew::DecodeCache> make_cache(int64_t b, int64_t c) const override { return inner_.make_cache(b, c); }
  Tensor forward_cached(const Tensor& t, dew::DecodeCache& c) override {
    ++calls;
    Tensor out = inner_.forward_cached(t, c);
    if (read_back_) (void)out.to_floats();
    return out;
  }
  double flops_per_sequence(int64_t n) const override { return inner_.flops_per_sequence(n); }
  int64_t context_length() const override { return inner_.context_length(); }
  int64_t calls = 0;

 private:
  dew::CausalDecoder& inner_;
  bool read_back_;
};

TEST_CASE("decode program: replayed one-token steps equal eager decoding bit for bit, the model runs 3 of them") {
  dew::NoGradGuard ng;
  for (const std::string be_name : {"ref", "cpu"})
    for (const dew::DType weights : {dew::DType::f32, dew::DType::bf16, dew::DType::i8}) {
      if (be_name == "ref" && weights == dew::DType::i8) continue;
      CAPTURE(be_name);
      CAPTURE(dew::dtype_name(weights));
      auto m = tiny_model(be_name, 64, 64);
      const dew::BackendPtr be = backend(be_name);
      dew::CausalDecoder& dec = decoder_of(m);
      if (weights != dew::DType::f32) dew::store_decode_weights_as(&dec, m->named_parameters(), weights);  // + bf16 K/V
      dew::store_matmul_weights_in_panels(m->named_parameters());
      // Teacher-forced: a prompt, then one token a step; every step's logits, both ways.
      const std::vector<int32_t> seq = random_tokens(40, 17);
      auto logits = [&](bool replay, CountingDecoder& counted, dew::DecodeReplayReport* report) {
        const dew::DecodeFn step = dew::decoder_start(counted, replay, report)(64);
        std::vector<std::vector<float>> out;
        out.push_back(step(Tensor::from_ints({seq.begin(), seq.begin() + 6}, {1, 6}, be)).to_floats());
        for (size_t i = 6; i < seq.size(); ++i)
          out.push_back(step(Tensor::from_ints({seq[i]}, {1, 1}, be)).to_floats());
        return out;
      };
      CountingDecoder eager_dec(dec, false), replay_dec(dec, false), opaque_dec(dec, true);
      dew::DecodeReplayReport replay_report, opaque_report;
      const auto eager = logits(false, eager_dec, nullptr), replayed = logits(true, replay_dec, &replay_report),
                 opaque = logits(true, opaque_dec, &opaque_report);
      REQUIRE(eager.size() == replayed.size());
      for (size_t i = 0; i < eager.size(); ++i) {
        CAPTURE(i);
        CHECK(same_bits(eager[i], replayed[i]));
        CHECK(same_bits(eager[i], opaque[i]));
      }
      CHECK(eager_dec.calls == int64_t(eager.size()));
      CHECK(replay_dec.calls == 4);  // the prefill, two recorded steps, the step checked against its replay
      CHECK(opaque_dec.calls == int64_t(eager.size()));  // no program: every step eager
      CHECK(replay_report.replayed_steps == int64_t(eager.size()) - 4);
      CHECK(replay_report.eager_steps == 4);
      CHECK(replay_report.eager_reason.empty());
      CHECK(opaque_report.replayed_steps == 0);
      CHECK(opaque_report.eager_reason.find("reads back to the host") != std::string::npos);
      // Generations: greedy and sampled, within the context and past it (a crop starts a new cache and program).
      for (const float temperature : {0.0f, 0.9f})
        for (const int64_t context : {int64_t(0), int64_t(24)}) {
          CAPTURE(temperature);
          CAPTURE(context);
          dew::SamplingParams sp;
          sp.max_new_tokens = 50;
          sp.temperature = temperature;
          sp.top_k = 40;
          sp.seed = 5;
          CountingDecoder a(dec, false), b(dec, false);
          const auto ge = dew::generate(dew::decoder_start(a, false), {random_tokens(5, 3)}, sp, nullptr, context);
          const auto gr = dew::generate(dew::decoder_start(b, true), {random_tokens(5, 3)}, sp, nullptr, context);
          CHECK(ge[0].tokens == gr[0].tokens);
          CHECK(ge[0].tokens.size() == 50);
          CHECK(b.calls < a.calls);
        }
    }
}

// token_logprob against long-double log-softmax; the top list sorted (ties by id), clipped to the vocabulary; and
// generate()'s entries: one per kept token (cut at a stop string), the drawn token's, the greedy draw the top one.
TEST_CASE("logprobs: token_logprob is the log-softmax, generate() gives one entry per token") {
  std::mt19937 g(4);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> logits(50);
  for (float& x : logits) x = normal(g);
  logits[7] = logits[3];  // a tie: the smaller id first
  long double total = 0;
  for (float x : logits) total += std::exp((long double)x);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  for (const int64_t top : {int64_t(0), int64_t(1), int64_t(5), dew::kMaxLogprobs}) {
    CAPTURE(top);
    const dew::TokenLogprob e = dew::token_logprob(logits.data(), 50, 7, top);
    CHECK(e.token == 7);
    CHECK(std::abs(e.logprob - double(std::log(std::exp((long double)logits[7]) / total))) < 1e-12);
    REQUIRE(e.top.size() == size_t(top));
    for (size_t k = 0; k < e.top.size(); ++k) {
      CHECK(e.top[k].first == order[k]);
      CHECK(std::abs(e.top[k].second - double(std::log(std::exp((long double)logits[size_t(order[k])]) / total))) <
            1e-12);
    }
  }
  CHECK(dew::token_logprob(logits.data(), 3, 1, 20).top.size() == 3);  // at most the vocabulary
  CHECK_THROWS_AS(dew::token_logprob(logits.data(), 50, 50, 1), dew::Error);
  dew::SamplingParams bad;
  bad.logprobs = dew::kMaxLogprobs + 1;
  CHECK_THROWS_AS(dew::validate(bad), dew::UsageError);

  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  auto m = tiny_model("ref");
  dew::CausalDecoder& dec = decoder_of(m);
  dew::SamplingParams greedy;
  greedy.max_new_tokens = 12;
  greedy.temperature = 0.0f;
  greedy.logprobs = 3;
  const dew::Generation gg = dew::generate(dew::decoder_start(dec), {random_tokens(5, 9)}, greedy, tok.get(), 24)[0];
  REQUIRE(gg.logprobs.size() == gg.tokens.size());
  for (size_t k = 0; k < gg.tokens.size(); ++k) {
    CHECK(gg.logprobs[k].token == gg.tokens[k]);
    CHECK(gg.logprobs[k].logprob <= 0);
    REQUIRE(gg.logprobs[k].top.size() == 3);
    CHECK(gg.logprobs[k].top[0].first == gg.tokens[k]);  // greedy: the likeliest token
    CHECK(gg.logprobs[k].top[0].second == gg.logprobs[k].logprob);
    CHECK(gg.logprobs[k].top[1].second <= gg.logprobs[k].top[0].second);
  }
  greedy.stop = {gg.text.substr(4, 2)};  // cut: the entries follow the kept tokens
  const dew::Generation cut = dew::generate(dew::decoder_start(dec), {random_tokens(5, 9)}, greedy, tok.get(), 24)[0];
  CHECK(cut.finish_reason == "stop");
  CHECK(cut.tokens.size() < gg.tokens.size());
  CHECK(cut.logprobs.size() == cut.tokens.size());
  greedy.logprobs = -1;
  CHECK(dew::generate(dew::decoder_start(dec), {random_tokens(5, 9)}, greedy, tok.get(), 24)[0].logprobs.empty());

  // The prompt's entries: token k + 1 scored by position k's logits of the prompt's feed, whole or in chunks of 4:
  // the rows of the same forward_cached calls made here on a fresh cache (ref: the same bits).
  const std::vector<int32_t> prompt = random_tokens(11, 21);
  dew::SamplingParams scored;
  scored.max_new_tokens = 3;
  scored.temperature = 0.0f;
  scored.logprobs = 2;
  scored.prompt_logprobs = true;
  for (const int64_t chunk : {int64_t(0), int64_t(4)}) {
    CAPTURE(chunk);
    scored.prefill_chunk = chunk;
    const dew::Generation sg =
        dew::generate(dew::decoder_start_every_position(dec), {prompt}, scored, tok.get(), 24)[0];
    REQUIRE(sg.prompt_logprobs.size() == prompt.size() - 1);
    dew::NoGradGuard ng;
    auto cache = dec.make_cache(1, 24);
    std::vector<float> rows;
    for (size_t at = 0; at < prompt.size();) {
      const size_t n = chunk > 0 ? std::min(prompt.size() - at, size_t(chunk)) : prompt.size() - at;
      const std::vector<float> part =
          dec.forward_cached(Tensor::from_ints({prompt.begin() + long(at), prompt.begin() + long(at + n)},
                                               {1, int64_t(n)}, backend("ref")),
                             *cache)
              .to_floats();
      rows.insert(rows.end(), part.begin(), part.end());
      at += n;
    }
    for (size_t k = 0; k + 1 < prompt.size(); ++k) {
      const dew::TokenLogprob want = dew::token_logprob(rows.data() + k * 256, 256, prompt[k + 1], 2);
      CHECK(sg.prompt_logprobs[k].token == prompt[k + 1]);
      CHECK(sg.prompt_logprobs[k].logprob == want.logprob);
      CHECK(sg.prompt_logprobs[k].top == want.top);
    }
    CHECK(sg.logprobs.size() == sg.tokens.size());
  }
  // The last-position form cannot score the prompt; nor can a prompt past the context be; nor without logprobs.
  CHECK_THROWS_AS(dew::generate(dew::decoder_start(dec), {prompt}, scored, tok.get(), 24), dew::Error);
  CHECK_THROWS_AS(dew::generate(dew::decoder_start_every_position(dec), {random_tokens(30, 1)}, scored, tok.get(), 24),
                  dew::UsageError);
  scored.logprobs = -1;
  CHECK_THROWS_AS(dew::validate(scored), dew::UsageError);
}

TEST_CASE("scheduler: concurrent requests with mixed lengths and budgets each equal their solo result") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  for (const std::string be : {"ref", "cpu", "cpu in panels"}) {
    CAPTURE(be);
    const bool panels = be == "cpu in panels";
    auto m = panels ? tiny_model("cpu", 64) : tiny_model(be);
    if (panels) {  // what dew-run serve does with f32 weights: q/k/v, gate/up back to back, in the backend's panels
      dew::store_matmul_weights_as(m->named_parameters(), dew::DType::f32);
      CHECK(dew::store_matmul_weights_in_panels(m->named_parameters()) == 14);
    }
    dew::CausalDecoder& dec = decoder_of(m);
    std::vector<Case> cs = mixed_cases(dec, *tok);
    // Whole prompts (the default chunk: longer than the context), and prompts and refills in chunks of 4 tokens.
    for (const int64_t chunk : {dew::kPrefillChunk, int64_t(4)}) {
      CAPTURE(chunk);
      std::vector<dew::Generation> solo;
      for (Case& c : cs) {
        c.params.prefill_chunk = chunk;
        solo.push_back(
            dew::generate(dew::decoder_start(dec), {c.prompt}, c.params, tok.get(), dec.context_length())[0]);
      }
      CHECK(solo[4].tokens.empty());
      CHECK(solo[8].finish_reason == "eos");
      CHECK(solo[9].finish_reason == "stop");
      CHECK(solo[3].tokens.size() == 40);
      for (int64_t slots : {1, 3, 16}) {
        CAPTURE(slots);
        dew::serve::Scheduler sched(dec, tok, {slots, 0, 64, chunk});
        std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
        for (const Case& c : cs) {
          auto s = sched.submit({c.prompt, c.params, 0});
          REQUIRE(s.status == dew::serve::Scheduler::Admission::accepted);
          tickets.push_back(s.ticket);
        }
        int steps = 0;
        while (sched.step()) ++steps;
        for (size_t i = 0; i < cs.size(); ++i) {
          REQUIRE(tickets[i]->done());
          expect_equal(tickets[i]->wait(), solo[i], i);
        }
        const auto st = sched.stats();
        CHECK(st.completed == int64_t(cs.size()));
        CHECK(st.active == 0);
        CHECK(st.queued == 0);
        if (slots == 16) CHECK(st.decode_rows > steps);  // rows really were batched
      }
    }
  }
}

TEST_CASE(
    "scheduler: identical prompts are fed once and the others copy its cache, each result equal to its solo one") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  for (const std::string be : {"ref", "cpu"}) {
    CAPTURE(be);
    auto m = tiny_model(be);
    dew::CausalDecoder& dec = decoder_of(m);
    // 8 samples of one 7-token prompt on their own streams (n completions; GRPO's group), 3 of a 4-token one, one
    // other prompt; chunks of 4: the 7-token prompt goes in two feeds, so only its last feed is whole and nothing
    // may be shared for it.
    const std::vector<int32_t> p7 = random_tokens(7, 77), p4 = random_tokens(4, 44), other = random_tokens(5, 55);
    for (const int64_t chunk : {dew::kPrefillChunk, int64_t(4)}) {
      CAPTURE(chunk);
      std::vector<dew::serve::Request> reqs;
      for (uint64_t i = 0; i < 12; ++i) {
        dew::serve::Request r;
        r.prompt = i < 8 ? p7 : i < 11 ? p4 : other;
        r.params.temperature = 1.0f;
        r.params.seed = 3;
        r.params.max_new_tokens = 6 + int64_t(i % 3);
        r.params.prefill_chunk = chunk;
        r.stream = i;
        reqs.push_back(r);
      }
      std::vector<dew::Generation> solo;
      for (const auto& r : reqs)
        solo.push_back(dew::generate(dew::decoder_start(dec), std::vector<std::vector<int32_t>>(r.stream + 1, r.prompt),
                                     r.params, tok.get(), dec.context_length())
                           .back());
      for (const bool prefix_cache : {true, false}) {
        CAPTURE(prefix_cache);
        dew::serve::SchedulerOptions so{16, 0, 64, chunk};
        so.prefix_cache = prefix_cache;
        dew::serve::Scheduler sched(dec, tok, so);
        std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
        for (const auto& r : reqs) tickets.push_back(sched.submit(r).ticket);
        while (sched.step()) {
        }
        std::set<std::vector<int32_t>> distinct;
        for (size_t i = 0; i < reqs.size(); ++i) {
          expect_equal(tickets[i]->wait(), solo[i], i);
          distinct.insert(solo[i].tokens);
        }
        CHECK(distinct.size() >= 6);  // the samples of one prompt differ: their own streams, not a copied draw
        const auto st = sched.stats();
        if (chunk == dew::kPrefillChunk) {
          CHECK(st.prefill_shared == 9);          // 7 + 2 copies
          CHECK(st.prefill_tokens == 7 + 4 + 5);  // each distinct prompt fed once
          CHECK(st.prefix_cached == 0);           // whole prompts: no chunk to share
        } else if (prefix_cache) {
          // The 7-token prompt's first chunk is fed once; the 7 others copy it (the prefix cache) and feed their last
          // 3 tokens; the 5-token prompt's last token goes as a decode row.
          CHECK(st.prefill_shared == 2);
          CHECK(st.prefix_cached == 7 * 4);
          CHECK(st.prefill_tokens == 7 + 7 * 3 + 4 + 4);
        } else {
          CHECK(st.prefill_shared == 2);  // only the 4-token prompt goes whole
          CHECK(st.prefix_cached == 0);
          CHECK(st.prefill_tokens == 8 * 7 + 4 + 4);
        }
      }
    }
  }
}

// Prefix caching: prompts that share a 10-token "system prompt" (two whole chunks of 4, then its last 2 tokens in a
// chunk with the prompt's own), one prompt twice, one that shares no first chunk; lengths never 1 mod 4, so no
// prompt's last token goes as a decode row and every prompt token is either fed or cached. Each result must equal its
// solo one bit for bit (a cache copied at a wrong length or from a wrong slot changes the logits); the counts say what
// was shared: one slot used in turn (its own cache kept after each request), and slots at once (each other's).
TEST_CASE("scheduler: prompts sharing whole chunks reuse a slot's cache, each result equal to its solo one") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  const std::vector<int32_t> system = random_tokens(10, 500);
  std::vector<std::vector<int32_t>> prompts;
  for (const size_t own : {4u, 1u, 5u, 2u, 9u}) {  // lengths 14, 11, 15, 12, 19
    std::vector<int32_t> p = system, tail = random_tokens(own, 600 + uint32_t(prompts.size()));
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  for (size_t i = 0; i < prompts.size(); ++i)  // the third chunks differ: only the system prompt's two are shared
    for (size_t j = 0; j < i; ++j) REQUIRE(prompts[i][10] != prompts[j][10]);
  prompts.push_back(prompts[0]);            // identical to the first: three whole chunks shared, its last 2 fed
  prompts.push_back(random_tokens(14, 7));  // nothing shared
  int64_t prompt_tokens = 0;
  for (const auto& p : prompts) prompt_tokens += int64_t(p.size());
  for (const std::string be : {"ref", "cpu"}) {
    CAPTURE(be);
    auto m = tiny_model(be, 32, 64);
    dew::CausalDecoder& dec = decoder_of(m);
    std::vector<dew::serve::Request> reqs;
    std::vector<dew::Generation> solo;
    for (size_t i = 0; i < prompts.size(); ++i) {
      dew::serve::Request r;
      r.prompt = prompts[i];
      r.params.temperature = i % 2 ? 0.0f : 0.9f;
      r.params.seed = 11 + i;
      r.params.max_new_tokens = 5 + int64_t(i % 4);
      r.params.prefill_chunk = 4;
      reqs.push_back(r);
      solo.push_back(dew::generate(dew::decoder_start(dec), {r.prompt}, r.params, tok.get(), dec.context_length())[0]);
    }
    for (const int64_t slots : {1, 2, 3, 8}) {
      for (const bool one_at_a_time : {true, false}) {
        CAPTURE(slots);
        CAPTURE(one_at_a_time);
        dew::serve::Scheduler sched(dec, tok, {slots, 0, 64, 4});
        std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
        for (const auto& r : reqs) {
          tickets.push_back(sched.submit(r).ticket);
          if (one_at_a_time)
            while (sched.step()) {
            }
        }
        while (sched.step()) {
        }
        for (size_t i = 0; i < reqs.size(); ++i) expect_equal(tickets[i]->wait(), solo[i], i);
        const auto st = sched.stats();
        CHECK(st.prefill_shared == 0);
        CHECK(st.prefill_tokens + st.prefix_cached == prompt_tokens);
        // Each system chunk is fed once whatever the order (a copy comes before every feed, and an iteration feeds
        // one whole chunk). In turn, the repeated prompt also finds the first one's third chunk where its slot was
        // kept: with 4 slots or more there is always an unused or lossless one for the prompts between; with 2 or 3
        // the least recently used cache, the first prompt's, is overwritten (by the fourth and fifth prompts).
        if (one_at_a_time) {
          CHECK(st.prefix_cached == 5 * 8 + (slots >= 4 ? 4 : 0));
        } else {
          CHECK(st.prefix_cached >= 5 * 8);
        }
      }
    }
    // Off: every prompt fed in full; the same results.
    dew::serve::SchedulerOptions off{2, 0, 64, 4};
    off.prefix_cache = false;
    dew::serve::Scheduler sched(dec, tok, off);
    std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
    for (const auto& r : reqs) tickets.push_back(sched.submit(r).ticket);
    while (sched.step()) {
    }
    for (size_t i = 0; i < reqs.size(); ++i) expect_equal(tickets[i]->wait(), solo[i], i);
    CHECK(sched.stats().prefix_cached == 0);
    CHECK(sched.stats().prefill_tokens == prompt_tokens);
    // A decoder on the default slot cache (no copy_prefix) feeds everything, with the same results.
    PlainDecoder plain(dec);
    dew::serve::Scheduler plain_sched(plain, tok, {2, 0, 64, 4});
    tickets.clear();
    for (const auto& r : reqs) tickets.push_back(plain_sched.submit(r).ticket);
    while (plain_sched.step()) {
    }
    for (size_t i = 0; i < reqs.size(); ++i) expect_equal(tickets[i]->wait(), solo[i], i);
    CHECK(plain_sched.stats().prefix_cached == 0);
  }
  // copy_prefix refuses more tokens than the slot holds.
  auto m = tiny_model("ref", 32, 64);
  dew::NoGradGuard ng;
  auto cache = decoder_of(m).make_slot_cache(2, 16);
  decoder_of(m).forward_slots_last(Tensor::from_ints(random_tokens(5, 1), {1, 5}, backend("ref")), {0}, *cache);
  CHECK_THROWS_AS(cache->copy_prefix(0, 1, 6, 0), dew::Error);
  CHECK_THROWS_AS(cache->copy_prefix(0, 1, 3, 1), dew::Error);  // slot 1 holds nothing below position 1
  CHECK(cache->copy_prefix(0, 1, 3, 0));
  CHECK(cache->length(1) == 3);
  CHECK(cache->copy_prefix(0, 1, 5, 3));  // the last two positions only
  CHECK(cache->length(1) == 5);
  CHECK_THROWS_AS(cache->copy_prefix(0, 1, 4, 5), dew::Error);
  CHECK(cache->copy_prefix(0, 0, 2, 0));
  CHECK(cache->length(0) == 2);
}

// Prompts scored (prompt_logprobs: OpenAI's echo with logprobs) beside prompts that are not, sharing a 10-token prefix
// and one identical prompt: each result, entries included, equals generate() alone (every-position feeds for the
// scored ones); a scored prompt is fed whole (no prefix copied in, no identical prompt's cache), though the others may
// take its chunks.
TEST_CASE("scheduler: scored prompts equal their solo results, beside prefix-cached and identical ones") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  const std::vector<int32_t> system = random_tokens(10, 900);
  for (const std::string be : {"ref", "cpu"}) {
    CAPTURE(be);
    auto m = tiny_model(be, 32, 64);
    dew::CausalDecoder& dec = decoder_of(m);
    std::vector<dew::serve::Request> reqs;
    std::vector<dew::Generation> solo;
    for (size_t i = 0; i < 6; ++i) {
      dew::serve::Request r;
      r.prompt = system;
      const std::vector<int32_t> own = random_tokens(3 + i, 910 + uint32_t(i % 5));  // request 5: request 0's prompt
      r.prompt.insert(r.prompt.end(), own.begin(), own.end());
      if (i == 5) r.prompt = reqs[0].prompt;
      r.params.temperature = 0.8f;
      r.params.seed = 30 + i;
      r.params.max_new_tokens = 4;
      r.params.prefill_chunk = 4;
      r.params.logprobs = i % 2 ? 1 : -1;
      r.params.prompt_logprobs = i % 2 == 1;
      reqs.push_back(r);
      const dew::StartFn start =
          r.params.prompt_logprobs ? dew::decoder_start_every_position(dec) : dew::decoder_start(dec);
      solo.push_back(dew::generate(start, {r.prompt}, r.params, tok.get(), dec.context_length())[0]);
      CHECK(solo.back().prompt_logprobs.size() == (r.params.prompt_logprobs ? r.prompt.size() - 1 : 0));
    }
    for (const int64_t slots : {1, 3, 6}) {
      CAPTURE(slots);
      dew::serve::Scheduler sched(dec, tok, {slots, 0, 64, 4});
      std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
      for (const auto& r : reqs) tickets.push_back(sched.submit(r).ticket);
      while (sched.step()) {
      }
      for (size_t i = 0; i < reqs.size(); ++i) expect_equal(tickets[i]->wait(), solo[i], i);
      CHECK(sched.stats().prefix_cached > 0);  // the unscored ones still share chunks
    }
    dew::serve::Request too_long = reqs[1];
    too_long.prompt = random_tokens(65, 3);
    dew::serve::Scheduler sched(dec, tok, {2, 0, 64, 4});
    CHECK_THROWS_AS(sched.submit(too_long), dew::UsageError);
  }
}

TEST_CASE("prefill in chunks: near the whole prompt's logits (ref, cpu), other slots decode between the chunks") {
  for (const std::string be_name : {"ref", "cpu"}) {
    CAPTURE(be_name);
    auto m = tiny_model(be_name, 64, 64);
    dew::CausalDecoder& dec = decoder_of(m);
    const dew::BackendPtr be = backend(be_name);
    dew::NoGradGuard ng;
    // A 23-token prompt in one call, and in chunks of 5 (5, 5, 5, 5, 3), through a batch-1 cache and a slot.
    const std::vector<int32_t> prompt = random_tokens(23, 31);
    auto whole_cache = dec.make_cache(1, 32), chunk_cache = dec.make_cache(1, 32);
    auto slots = dec.make_slot_cache(2, 32);
    const std::vector<float> whole =
        dec.forward_cached_last(Tensor::from_ints(prompt, {1, 23}, be), *whole_cache).to_floats();
    std::vector<float> chunked, slotted;
    for (size_t at = 0; at < prompt.size(); at += 5) {
      const std::vector<int32_t> part(prompt.begin() + long(at),
                                      prompt.begin() + long(std::min(at + 5, prompt.size())));
      const Tensor t = Tensor::from_ints(part, {1, int64_t(part.size())}, be);
      chunked = dec.forward_cached_last(t, *chunk_cache).to_floats();
      slotted = dec.forward_slots_last(t, {1}, *slots).to_floats();
    }
    CHECK(chunk_cache->length() == 23);
    CHECK(slots->length(1) == 23);
    CHECK(same_bits(chunked, slotted));
    CHECK(max_abs_diff(whole, chunked) < 1e-4);
    // The next token over either cache.
    const Tensor next = Tensor::from_ints({9}, {1, 1}, be);
    CHECK(max_abs_diff(dec.forward_cached_last(next, *whole_cache).to_floats(),
                       dec.forward_cached_last(next, *chunk_cache).to_floats()) < 1e-4);
  }

  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  auto m = tiny_model("cpu", 32, 64);
  dew::CausalDecoder& dec = decoder_of(m);
  auto request = [](size_t len, int64_t budget, uint64_t seed) {
    dew::serve::Request r;
    r.prompt = random_tokens(len, uint32_t(seed));
    r.params.max_new_tokens = budget;
    r.params.seed = seed;
    return r;
  };
  auto solo = [&](dew::serve::Request r) {
    r.params.prefill_chunk = 5;
    return dew::generate(dew::decoder_start(dec), {r.prompt}, r.params, tok.get(), dec.context_length())[0];
  };
  {  // A decodes one token in every iteration while B's 18-token prompt goes in (5, 5, 5, then 3 and its draw)
    dew::serve::Scheduler sched(dec, tok, {2, 0, 4, 5});
    auto a = sched.submit(request(2, 15, 1)).ticket;
    REQUIRE(sched.step());
    auto b = sched.submit(request(18, 3, 2)).ticket;
    for (int i = 1; i <= 3; ++i) {
      REQUIRE(sched.step());
      CHECK(sched.stats().decode_rows == i);
      CHECK(sched.stats().prefill_tokens == 2 + 5 * i);
      CHECK(b->first_token.time_since_epoch().count() == 0);
    }
    REQUIRE(sched.step());
    CHECK(b->first_token.time_since_epoch().count() != 0);
    CHECK(sched.stats().prefill_tokens == 2 + 18);
    while (sched.step()) {
    }
    expect_equal(a->wait(), solo(request(2, 15, 1)), 0);
    expect_equal(b->wait(), solo(request(18, 3, 2)), 1);
  }
  {  // a short prompt admitted while a long one is half in goes first, within the iteration's 5 tokens
    dew::serve::Scheduler sched(dec, tok, {3, 0, 4, 5});
    auto l = sched.submit(request(20, 2, 3)).ticket;
    REQUIRE(sched.step());
    CHECK(sched.stats().prefill_tokens == 5);
    auto s = sched.submit(request(3, 2, 4)).ticket;
    REQUIRE(sched.step());
    CHECK(s->first_token.time_since_epoch().count() != 0);
    CHECK(l->first_token.time_since_epoch().count() == 0);
    CHECK(sched.stats().prefill_tokens == 8);  // the short prompt's 3; the long one's next 5 would pass 5
    while (sched.step()) {
    }
    expect_equal(l->wait(), solo(request(20, 2, 3)), 0);
    expect_equal(s->wait(), solo(request(3, 2, 4)), 1);
  }
}

TEST_CASE("scheduler: a vocabulary padded past the tokenizer's draws tokenizer ids only, as solo does") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  backend("cpu");
  dew::Options o({{"vocab_size", "320"}, {"dim", "32"}, {"n_layers", "2"}, {"n_heads", "4"}, {"max_seq_len", "24"}},
                 "model");
  auto m = dew::Registry::global().create<dew::Model>("causal_transformer", o);
  m->initialize(5);
  m->set_training(false);
  dew::CausalDecoder& dec = decoder_of(m);
  dew::serve::Scheduler sched(dec, tok, {2, 0, 4});
  std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
  std::vector<dew::Generation> solo;
  for (uint64_t seed : {1, 2, 3}) {
    dew::serve::Request r;
    r.prompt = random_tokens(5, uint32_t(seed));
    r.params.max_new_tokens = 30;
    r.params.temperature = 2.0f;  // flat enough that ids past 255 would be drawn if they could be
    r.params.seed = seed;
    solo.push_back(dew::generate(dew::decoder_start(dec), {r.prompt}, r.params, tok.get(), dec.context_length())[0]);
    tickets.push_back(sched.submit(r).ticket);
  }
  while (sched.step()) {
  }
  for (size_t i = 0; i < solo.size(); ++i) {
    expect_equal(tickets[i]->wait(), solo[i], i);
    for (int32_t id : solo[i].tokens) CHECK(id < 256);
  }
}

TEST_CASE("scheduler: a finished request's slot is reused in the next iteration") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  auto m = tiny_model("ref");
  dew::CausalDecoder& dec = decoder_of(m);
  auto req = [](int64_t budget, uint64_t seed) {
    dew::serve::Request r;
    r.prompt = random_tokens(4, uint32_t(seed));
    r.params.max_new_tokens = budget;
    r.params.seed = seed;
    return r;
  };
  {  // one slot: A (3 tokens) then B (2 tokens) take exactly 3 + 2 iterations
    dew::serve::Scheduler sched(dec, tok, {1, 0, 4});
    auto a = sched.submit(req(3, 1)).ticket, b = sched.submit(req(2, 2)).ticket;
    for (int i = 0; i < 3; ++i) REQUIRE(sched.step());
    CHECK(a->done());
    CHECK(sched.stats().queued == 1);
    REQUIRE(sched.step());  // B is admitted into the freed slot and prefilled at once
    CHECK(b->first_token.time_since_epoch().count() != 0);
    CHECK(b->admitted >= a->finished);
    REQUIRE(sched.step());
    CHECK(b->done());
    CHECK(b->wait().tokens.size() == 2);
    CHECK_FALSE(sched.step());
    CHECK(sched.stats().iterations == 5);
  }
  {  // two slots: A (1), B (4), C (2): C takes A's slot in iteration 2 and ends in iteration 3
    dew::serve::Scheduler sched(dec, tok, {2, 0, 4});
    auto a = sched.submit(req(1, 1)).ticket, b = sched.submit(req(4, 2)).ticket, c = sched.submit(req(2, 3)).ticket;
    REQUIRE(sched.step());
    CHECK(a->done());
    CHECK_FALSE(c->done());
    REQUIRE(sched.step());
    CHECK(c->admitted.time_since_epoch().count() != 0);
    CHECK(sched.stats().queued == 0);
    CHECK(sched.stats().active == 2);
    REQUIRE(sched.step());
    CHECK(c->done());
    CHECK_FALSE(b->done());
    REQUIRE(sched.step());
    CHECK(b->done());
    CHECK_FALSE(sched.step());
  }
}

TEST_CASE("scheduler: a full queue refuses, a draining one too, bad requests are usage errors") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  auto m = tiny_model("ref");
  dew::CausalDecoder& dec = decoder_of(m);
  using Admission = dew::serve::Scheduler::Admission;
  dew::serve::Request r;
  r.prompt = {1, 2, 3};
  r.params.max_new_tokens = 3;
  dew::serve::Scheduler sched(dec, tok, {1, 0, 1});  // one slot, one waiting place
  auto a = sched.submit(r), b = sched.submit(r), c = sched.submit(r);
  CHECK(a.status == Admission::accepted);
  CHECK(b.status == Admission::accepted);
  CHECK(c.status == Admission::queue_full);
  CHECK(c.ticket == nullptr);
  REQUIRE(sched.step());  // A takes the slot: still full (A running, B waiting)
  CHECK(sched.submit(r).status == Admission::queue_full);
  b.ticket->cancel();  // a waiting request that is cancelled leaves without running
  REQUIRE(sched.step());
  CHECK(b.ticket->done());
  CHECK(b.ticket->wait().finish_reason == "cancelled");
  CHECK(b.ticket->wait().tokens.empty());
  auto d = sched.submit(r);
  CHECK(d.status == Admission::accepted);
  sched.drain();  // no background thread: drain() runs the iterations itself
  CHECK(a.ticket->wait().tokens.size() == 3);
  CHECK(d.ticket->wait().tokens.size() == 3);
  CHECK(sched.submit(r).status == Admission::draining);

  dew::serve::Scheduler s2(dec, tok, {2, 0, 4});
  dew::serve::Request bad = r;
  bad.prompt = {};
  CHECK_THROWS_AS(s2.submit(bad), dew::UsageError);
  bad.prompt = {256};
  CHECK_THROWS_AS(s2.submit(bad), dew::UsageError);
  bad.prompt = {1};
  bad.params.temperature = -1;
  CHECK_THROWS_AS(s2.submit(bad), dew::UsageError);
  bad.params.temperature = 1;
  bad.params.stop = {""};
  CHECK_THROWS_AS(s2.submit(bad), dew::UsageError);
  dew::serve::Scheduler no_tok(dec, nullptr, {2, 0, 4});
  bad.params.stop = {"x"};
  CHECK_THROWS_AS(no_tok.submit(bad), dew::UsageError);
  CHECK_THROWS_AS(dew::serve::Scheduler(dec, tok, {0, 0, 4}), dew::UsageError);
}

TEST_CASE("scheduler: streamed text (background thread) concatenates to the final text, cancel frees the slot") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  auto m = tiny_model("ref");
  dew::CausalDecoder& dec = decoder_of(m);
  const std::vector<Case> cs = mixed_cases(dec, *tok);
  dew::serve::Scheduler sched(dec, tok, {4, 0, 64});
  sched.start();
  std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
  for (const Case& c : cs) tickets.push_back(sched.submit({c.prompt, c.params, 0}).ticket);
  for (size_t i = 0; i < cs.size(); ++i) {
    std::string streamed;
    size_t pieces = 0;
    for (;;) {
      const auto u = tickets[i]->next(std::chrono::milliseconds(2000));
      streamed += u.text;
      pieces += !u.text.empty();
      if (u.done) break;
    }
    const dew::Generation g = tickets[i]->wait();
    CHECK_MESSAGE(streamed == g.text, "request ", i);
    const dew::Generation solo =
        dew::generate(dew::decoder_start(dec), {cs[i].prompt}, cs[i].params, tok.get(), dec.context_length())[0];
    expect_equal(g, solo, i);
  }
  // A long request cancelled mid-way ends as "cancelled" and its slot serves the next request.
  dew::serve::Request longr{{5, 6, 7}, {}, 0};
  longr.params.max_new_tokens = 100000;
  auto t = sched.submit(longr).ticket;
  while (t->next(std::chrono::milliseconds(2000)).text.empty()) {
  }
  t->cancel();
  CHECK(t->wait().finish_reason == "cancelled");
  dew::serve::Request shortr{{5, 6}, {}, 0};
  shortr.params.max_new_tokens = 3;
  CHECK(sched.submit(shortr).ticket->wait().tokens.size() == 3);
  sched.drain();
  CHECK(sched.stats().active == 0);
}

// dew-run serve runs the scheduler's loop on the thread that loaded the model (run()); drain() from another
// thread lets every request finish, then run() returns. A drain() before run() makes run() return at once.
TEST_CASE("scheduler: run() loops on the calling thread until drain() from another thread") {
  auto tok = std::shared_ptr<const dew::Tokenizer>(dew::make_byte_tokenizer());
  auto m = tiny_model("ref");
  dew::CausalDecoder& dec = decoder_of(m);
  const std::vector<Case> cs = mixed_cases(dec, *tok);
  dew::serve::Scheduler sched(dec, tok, {2, 0, 64});
  std::thread model_thread([&] { sched.run(); });
  std::vector<std::shared_ptr<dew::serve::Ticket>> tickets;
  for (const Case& c : cs) tickets.push_back(sched.submit({c.prompt, c.params, 0}).ticket);
  sched.drain();  // returns once run() has returned: every request ended
  model_thread.join();
  for (size_t i = 0; i < cs.size(); ++i) {
    REQUIRE(tickets[i]->done());
    const dew::Generation solo =
        dew::generate(dew::decoder_start(dec), {cs[i].prompt}, cs[i].params, tok.get(), dec.context_length())[0];
    expect_equal(tickets[i]->wait(), solo, i);
  }
  CHECK(sched.submit({cs[0].prompt, cs[0].params, 0}).status == dew::serve::Scheduler::Admission::draining);
  dew::serve::Scheduler early(dec, tok, {2, 0, 4});
  early.drain();
  early.run();  // drained before it started: returns at once
  CHECK(early.stats().iterations == 0);
}

// ---------------------------------------------------------------- HTTP

namespace {

// An in-process `dew-run serve` front on an ephemeral port over a tiny ref model.
struct Server {
  std::shared_ptr<dew::Model> model = tiny_model("ref");
  std::shared_ptr<const dew::Tokenizer> tok{dew::make_byte_tokenizer()};
  std::unique_ptr<dew::serve::Scheduler> sched;
  std::unique_ptr<dew_run::HttpServer> http;
  std::thread model_thread, thread;
  int port = 0;

  explicit Server(int64_t slots = 4, int64_t queue = 16, int64_t max_tokens = 200000) {
    dew_run::ServeOptions o;
    o.port = 0;
    o.scheduler = {slots, 0, queue};
    o.max_tokens = max_tokens;
    sched = std::make_unique<dew::serve::Scheduler>(decoder_of(model), tok, o.scheduler);
    dew_run::ModelInfo info;
    info.id = "tiny";
    info.vocab_size = 256;
    info.context = 24;
    info.tokenizer = "byte";
    http = std::make_unique<dew_run::HttpServer>(*sched, info, o);
    port = http->bind();
    model_thread = std::thread([this] { sched->run(); });  // as dew-run serve runs it (on its main thread)
    thread = std::thread([this] { http->listen(); });
  }
  ~Server() {
    http->shutdown();
    model_thread.join();
    thread.join();
  }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port);
    c.set_read_timeout(std::chrono::seconds(60));
    return c;
  }
  dew::Generation solo(const std::string& prompt, const dew::SamplingParams& p, uint64_t stream = 0) {
    dew::CausalDecoder& d = decoder_of(model);
    const std::vector<int32_t> ids = tok->encode(prompt);
    std::vector<std::vector<int32_t>> prompts(stream + 1, ids);
    return dew::generate(dew::decoder_start(d), prompts, p, tok.get(), d.context_length())[stream];
  }
};

// Text as a client reads it from the JSON: bytes that are not UTF-8 (a random-init byte model makes
// plenty) arrive as U+FFFD.
std::string wire(const std::string& text) {
  return json::parse(json(text).dump(-1, ' ', false, json::error_handler_t::replace)).get<std::string>();
}

httplib::Result post(httplib::Client& c, const json& body) {
  return c.Post("/v1/completions", body.dump(), "application/json");
}
httplib::Result post_raw(httplib::Client& c, const std::string& body) {
  return c.Post("/v1/completions", body, "application/json");
}

// Checks a JSON error response; returns its error object.
json expect_error(const httplib::Result& r, int status, const std::string& param = "") {
  REQUIRE(r);
  CHECK(r->status == status);
  CHECK(r->get_header_value("Content-Type") == "application/json");
  const json j = json::parse(r->body);
  REQUIRE(j.contains("error"));
  CHECK(j["error"]["message"].is_string());
  CHECK(!j["error"]["message"].get<std::string>().empty());
  if (!param.empty()) CHECK(j["error"]["param"] == param);
  return j["error"];
}

// The text of an SSE response, the finish reasons by choice, and whether it ended with [DONE].
struct Stream {
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  int chunks = 0;
  bool done = false;
};

Stream parse_sse(const std::string& body) {
  Stream s;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    const std::string ev = body.substr(at, end - at);
    at = end + 2;
    REQUIRE(ev.rfind("data: ", 0) == 0);
    const std::string data = ev.substr(6);
    if (data == "[DONE]") {
      s.done = true;
      CHECK(at == body.size());
      break;
    }
    const json j = json::parse(data);
    CHECK(j["object"] == "text_completion");
    for (const json& c : j["choices"]) {
      const int i = c["index"].get<int>();
      s.text[i] += c["text"].get<std::string>();
      if (!c["finish_reason"].is_null()) s.finish[i] = c["finish_reason"].get<std::string>();
    }
    ++s.chunks;
  }
  return s;
}

dew::SamplingParams params(int64_t budget, float temperature, uint64_t seed) {
  dew::SamplingParams p;
  p.max_new_tokens = budget;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

}  // namespace

TEST_CASE("http: health, models, completions equal solo results, streaming equals non-streaming") {
  Server s;
  auto c = s.client();
  {
    auto r = c.Get("/health");
    REQUIRE(r);
    CHECK(r->status == 200);
    const json j = json::parse(r->body);
    CHECK(j["status"] == "ok");
    CHECK(j["slots"] == 4);
  }
  {
    auto r = c.Get("/v1/models");
    REQUIRE(r);
    CHECK(r->status == 200);
    const json j = json::parse(r->body);
    CHECK(j["data"][0]["id"] == "tiny");
    CHECK(j["data"][0]["dew"]["context_length"] == 24);
  }
  const json req{{"prompt", "Hello, "}, {"max_tokens", 30}, {"temperature", 0.9}, {"seed", 42}, {"top_k", 50}};
  dew::SamplingParams p = params(30, 0.9f, 42);
  p.top_k = 50;
  const dew::Generation solo = s.solo("Hello, ", p);
  auto r = post(c, req);
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const json j = json::parse(r->body);
  CHECK(j["object"] == "text_completion");
  CHECK(j["model"] == "tiny");
  CHECK(j["choices"][0]["text"].get<std::string>() == wire(solo.text));
  CHECK(j["choices"][0]["finish_reason"] == "length");
  CHECK(j["usage"]["prompt_tokens"] == 7);
  CHECK(j["usage"]["completion_tokens"] == 30);
  CHECK(j["usage"]["total_tokens"] == 37);
  CHECK(j["seed"] == 42);

  // The same request streamed: SSE chunks whose text concatenates to the same text, then [DONE].
  json sreq = req;
  sreq["stream"] = true;
  auto sr = post(c, sreq);
  REQUIRE(sr);
  REQUIRE(sr->status == 200);
  CHECK(sr->get_header_value("Content-Type") == "text/event-stream");
  const Stream st = parse_sse(sr->body);
  CHECK(st.done);
  CHECK(st.chunks >= 1);
  CHECK(st.text.at(0) == j["choices"][0]["text"].get<std::string>());
  CHECK(st.finish.at(0) == "length");

  // Stop strings, echo and greedy decoding; n = 2 choices are generate()'s streams 0 and 1.
  std::string stop = "zz";  // a printable byte of the solo text past its start (JSON carries UTF-8 only)
  for (size_t i = 8; i < solo.text.size(); ++i)
    if (solo.text[i] >= 0x21 && solo.text[i] < 0x7f) {
      stop = solo.text.substr(i, 1);
      break;
    }
  json stop_req = req;
  stop_req["stop"] = json::array({stop, "never-there"});
  stop_req["echo"] = true;
  dew::SamplingParams ps = p;
  ps.stop = {stop, "never-there"};
  const dew::Generation solo_stop = s.solo("Hello, ", ps);
  auto rs = post(c, stop_req);
  REQUIRE(rs);
  REQUIRE(rs->status == 200);
  const json js = json::parse(rs->body);
  REQUIRE(solo_stop.finish_reason == "stop");
  CHECK(js["choices"][0]["text"].get<std::string>() == wire("Hello, " + solo_stop.text));
  CHECK(js["choices"][0]["finish_reason"] == "stop");
  stop_req["stream"] = true;
  auto rss = post(c, stop_req);
  REQUIRE(rss);
  const Stream sts = parse_sse(rss->body);
  CHECK(sts.text.at(0) == js["choices"][0]["text"].get<std::string>());
  CHECK(sts.finish.at(0) == "stop");

  json nreq{{"prompt", "abc"}, {"max_tokens", 12}, {"seed", 7}, {"n", 2}};
  auto rn = post(c, nreq);
  REQUIRE(rn);
  REQUIRE(rn->status == 200);
  const json jn = json::parse(rn->body);
  REQUIRE(jn["choices"].size() == 2);
  for (int i = 0; i < 2; ++i) {
    const dew::Generation g = s.solo("abc", params(12, 1.0f, 7), uint64_t(i));
    CHECK(jn["choices"][i]["index"] == i);
    CHECK(jn["choices"][i]["text"].get<std::string>() == wire(g.text));
  }
  CHECK(jn["choices"][0]["text"] != jn["choices"][1]["text"]);
  nreq["stream"] = true;
  auto rns = post(c, nreq);
  REQUIRE(rns);
  const Stream sn = parse_sse(rns->body);
  CHECK(sn.done);
  CHECK(sn.text.at(0) == jn["choices"][0]["text"].get<std::string>());
  CHECK(sn.text.at(1) == jn["choices"][1]["text"].get<std::string>());

  // Token-id prompts.
  auto rt = post(c, json{{"prompt", {72, 105}}, {"max_tokens", 5}, {"temperature", 0}});
  REQUIRE(rt);
  CHECK(rt->status == 200);
  CHECK(json::parse(rt->body)["choices"][0]["text"].get<std::string>() == wire(s.solo("Hi", params(5, 0.0f, 0)).text));
}

TEST_CASE("http: concurrent clients with mixed lengths and budgets each get their solo result") {
  Server s(3, 32);
  const int n = 8;
  std::vector<json> bodies(n);
  std::vector<std::string> texts(n);
  std::vector<int> status(n, 0);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    bodies[i] = json{{"prompt", std::string(size_t(1 + 3 * i), char('a' + i))},
                     {"max_tokens", 5 + 7 * (i % 4)},
                     {"temperature", 0.5 + 0.1 * i},
                     {"seed", 100 + i},
                     {"stream", i % 2 == 1}};
    threads.emplace_back([&, i] {
      auto c = s.client();
      auto r = post(c, bodies[i]);
      if (!r) return;
      status[i] = r->status;
      texts[i] = bodies[i]["stream"].get<bool>() ? parse_sse(r->body).text[0]
                                                 : json::parse(r->body)["choices"][0]["text"].get<std::string>();
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < n; ++i) {
    CAPTURE(i);
    CHECK(status[i] == 200);
    const dew::Generation g = s.solo(bodies[i]["prompt"].get<std::string>(),
                                     params(bodies[i]["max_tokens"].get<int64_t>(),
                                            bodies[i]["temperature"].get<float>(), bodies[i]["seed"].get<uint64_t>()));
    CHECK(texts[i] == wire(g.text));
  }
  CHECK(s.sched->stats().decode_rows > s.sched->stats().iterations);  // some iterations decoded several rows
}

TEST_CASE("http: 400 for malformed JSON, unknown fields, wrong types and out-of-range values, 404s") {
  Server s;
  auto c = s.client();
  expect_error(post_raw(c, "{\"prompt\": \"x\""), 400);
  expect_error(post_raw(c, "[1, 2]"), 400);
  expect_error(post_raw(c, ""), 400);
  expect_error(post(c, json{{"prompt", "x"}, {"max_token", 5}}), 400, "max_token");
  expect_error(post(c, json{{"prompt", "x"}, {"best_of", 2}}), 400, "best_of");
  expect_error(post(c, json{{"max_tokens", 5}}), 400, "prompt");
  expect_error(post(c, json{{"prompt", 5}}), 400, "prompt");
  expect_error(post(c, json{{"prompt", json::array()}}), 400, "prompt");
  expect_error(post(c, json{{"prompt", {1, 256}}}), 400, "prompt");
  expect_error(post(c, json{{"prompt", "x"}, {"max_tokens", "5"}}), 400, "max_tokens");
  expect_error(post(c, json{{"prompt", "x"}, {"max_tokens", -1}}), 400, "max_tokens");
  expect_error(post(c, json{{"prompt", "x"}, {"max_tokens", 1.5}}), 400, "max_tokens");
  expect_error(post(c, json{{"prompt", "x"}, {"max_tokens", 300000}}), 400, "max_tokens");
  expect_error(post(c, json{{"prompt", "x"}, {"temperature", -0.5}}), 400, "temperature");
  expect_error(post(c, json{{"prompt", "x"}, {"top_p", 0}}), 400, "top_p");
  expect_error(post(c, json{{"prompt", "x"}, {"top_p", 1.5}}), 400, "top_p");
  expect_error(post(c, json{{"prompt", "x"}, {"top_k", -2}}), 400, "top_k");
  expect_error(post(c, json{{"prompt", "x"}, {"min_p", 2}}), 400, "min_p");
  expect_error(post(c, json{{"prompt", "x"}, {"repetition_penalty", 0}}), 400, "repetition_penalty");
  expect_error(post(c, json{{"prompt", "x"}, {"seed", -1}}), 400, "seed");
  expect_error(post(c, json{{"prompt", "x"}, {"stop", ""}}), 400, "stop");
  expect_error(post(c, json{{"prompt", "x"}, {"stop", {1}}}), 400, "stop");
  expect_error(post(c, json{{"prompt", "x"}, {"stream", "yes"}}), 400, "stream");
  expect_error(post(c, json{{"prompt", "x"}, {"n", 0}}), 400, "n");
  expect_error(post(c, json{{"prompt", "x"}, {"model", "other"}}), 404, "model");
  expect_error(c.Get("/v1/nothing"), 404);
  expect_error(c.Post("/v1/chat/completions", "{}", "application/json"), 400,
               "messages");  // openai_client.sh tests the route
  // The server still answers after all of that.
  // An empty prompt starts from the tokenizer's document token (the byte tokenizer's is 255), as OpenAI's
  // servers start from <|endoftext|>.
  auto empty = post(c, json{{"prompt", ""}, {"max_tokens", 2}});
  REQUIRE(empty);
  CHECK(empty->status == 200);
  auto ok = post(c, json{{"prompt", "x"}, {"max_tokens", 2}, {"model", "tiny"}, {"user", "me"}, {"stop", nullptr}});
  REQUIRE(ok);
  CHECK(ok->status == 200);
  CHECK(s.sched->stats().completed == 2);  // the empty prompt's and this one: no refused request counts
}

// Log-probabilities over HTTP: completions' {tokens, token_logprobs, top_logprobs, text_offset} and chat's {content:
// [{token, logprob, bytes, top_logprobs}]} carry generate()'s entries (the same doubles through JSON); streamed, the
// chunks' entries concatenate to the non-streamed ones; bad values are refused naming the field.
TEST_CASE("http: logprobs on completions and chat, streamed and not, equal to the solo entries") {
  Server s;
  auto c = s.client();
  // Every SSE event's choices[0].logprobs (completions: its arrays, concatenated; chat: its content entries).
  auto streamed = [](const std::string& body, bool chat) {
    json out = chat ? json::array()
                    : json{{"tokens", json::array()},
                           {"token_logprobs", json::array()},
                           {"top_logprobs", json::array()},
                           {"text_offset", json::array()}};
    for (size_t at = 0; at < body.size();) {
      const size_t end = body.find("\n\n", at);
      REQUIRE(end != std::string::npos);
      const std::string data = body.substr(at + 6, end - at - 6);
      at = end + 2;
      if (data == "[DONE]") break;
      const json j = json::parse(data);
      if (j["choices"].empty() || j["choices"][0]["logprobs"].is_null()) continue;
      const json& lp = j["choices"][0]["logprobs"];
      if (chat) {
        for (const json& e : lp["content"]) out.push_back(e);
      } else {
        for (auto& [key, list] : out.items())
          for (const json& e : lp[key]) list.push_back(e);
      }
    }
    return out;
  };
  dew::SamplingParams p = params(10, 0.9f, 4);
  p.logprobs = 2;
  const dew::Generation want = s.solo("abc", p);
  REQUIRE(want.tokens.size() == 10);
  json req{{"prompt", "abc"}, {"max_tokens", 10}, {"temperature", 0.9}, {"seed", 4}, {"logprobs", 2}};
  auto r = post(c, req);
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const json lp = json::parse(r->body)["choices"][0]["logprobs"];
  REQUIRE(lp["tokens"].size() == want.tokens.size());
  for (size_t k = 0; k < want.tokens.size(); ++k) {
    CAPTURE(k);
    CHECK(lp["token_logprobs"][k].get<double>() == want.logprobs[k].logprob);
    CHECK(lp["text_offset"][k] == k);  // one byte a token
    const json& top = lp["top_logprobs"][k];
    CHECK(top.size() >= 2);  // the 2 likeliest and the drawn token (one of them, or a third)
    CHECK(top.size() <= 3);
    auto name = [](int32_t id) {  // a byte past ASCII is not UTF-8 alone: OpenAI's "bytes:\xNN"
      char hex[16];
      std::snprintf(hex, sizeof hex, "bytes:\\x%02x", unsigned(id));
      return id < 128 ? std::string(1, char(id)) : std::string(hex);
    };
    CHECK(lp["tokens"][k] == name(want.tokens[k]));
    for (const auto& [id, v] : want.logprobs[k].top) CHECK(top.at(name(id)).get<double>() == v);
    CHECK(top.at(name(want.tokens[k])).get<double>() == want.logprobs[k].logprob);
  }
  req["stream"] = true;
  auto sr = post(c, req);
  REQUIRE(sr);
  CHECK(streamed(sr->body, false) == lp);

  json creq{{"messages", {{{"role", "user"}, {"content", "hi"}}}},
            {"max_tokens", 6},
            {"seed", 2},
            {"logprobs", true},
            {"top_logprobs", 1}};
  auto cr = c.Post("/v1/chat/completions", creq.dump(), "application/json");
  REQUIRE(cr);
  REQUIRE(cr->status == 200);
  const json cj = json::parse(cr->body);
  const json content = cj["choices"][0]["logprobs"]["content"];
  REQUIRE(content.size() == cj["usage"]["completion_tokens"].get<size_t>());
  for (const json& e : content) {
    CHECK(e["bytes"].size() == 1);
    CHECK(e["logprob"].get<double>() <= 0);
    REQUIRE(e["top_logprobs"].size() == 1);
    CHECK(e["top_logprobs"][0]["logprob"].get<double>() >= e["logprob"].get<double>());
  }
  creq["stream"] = true;
  auto cs = c.Post("/v1/chat/completions", creq.dump(), "application/json");
  REQUIRE(cs);
  CHECK(streamed(cs->body, true) == content);
  CHECK(json::parse(post(c, json{{"prompt", "x"}, {"max_tokens", 2}})->body)["choices"][0]["logprobs"].is_null());

  expect_error(post(c, json{{"prompt", "x"}, {"logprobs", 21}}), 400, "logprobs");
  expect_error(post(c, json{{"prompt", "x"}, {"logprobs", -1}}), 400, "logprobs");
  expect_error(post(c, json{{"prompt", "x"}, {"logprobs", 1}, {"echo", true}, {"stream", true}}), 400, "stream");
  expect_error(post(c, json{{"prompt", "x"}, {"logprobs", 1}, {"echo", true}, {"max_tokens", 0}}), 400, "max_tokens");
  expect_error(post(c, json{{"prompt", std::string(30, 'x')}, {"logprobs", 1}, {"echo", true}}), 400, "prompt");

  // echo with logprobs: the prompt's tokens first (the first unscored), then the completion's, as generate() scores
  // them with every position's logits.
  dew::SamplingParams ep = params(5, 0.7f, 9);
  ep.logprobs = 1;
  ep.prompt_logprobs = true;
  dew::CausalDecoder& dec = decoder_of(s.model);
  const dew::Generation scored =
      dew::generate(dew::decoder_start_every_position(dec), {s.tok->encode("hello")}, ep, s.tok.get(), 24)[0];
  auto er = post(
      c,
      json{{"prompt", "hello"}, {"max_tokens", 5}, {"temperature", 0.7}, {"seed", 9}, {"logprobs", 1}, {"echo", true}});
  REQUIRE(er);
  REQUIRE(er->status == 200);
  const json ej = json::parse(er->body)["choices"][0];
  CHECK(ej["text"] == wire("hello" + scored.text));
  const json el = ej["logprobs"];
  REQUIRE(el["tokens"].size() == 5 + scored.tokens.size());
  CHECK(el["tokens"][0] == "h");
  CHECK(el["token_logprobs"][0].is_null());
  CHECK(el["top_logprobs"][0].is_null());
  for (size_t k = 0; k < 4; ++k) CHECK(el["token_logprobs"][k + 1].get<double>() == scored.prompt_logprobs[k].logprob);
  for (size_t k = 0; k < scored.tokens.size(); ++k)
    CHECK(el["token_logprobs"][5 + k].get<double>() == scored.logprobs[k].logprob);
  for (size_t k = 0; k < el["text_offset"].size(); ++k) CHECK(el["text_offset"][k] == k);
  json no_flag = creq;
  no_flag.erase("logprobs");
  expect_error(c.Post("/v1/chat/completions", no_flag.dump(), "application/json"), 400, "top_logprobs");
  json not_bool = creq;
  not_bool["logprobs"] = 1;
  expect_error(c.Post("/v1/chat/completions", not_bool.dump(), "application/json"), 400, "logprobs");
}

TEST_CASE("http: a null field is an absent one, --max-tokens caps the default, curl -d bodies past 8 KiB") {
  Server s(2, 4, 5);
  auto c = s.client();
  // OpenAI's API (and client libraries that send every field) read null as not given.
  auto r = post(c, json{{"prompt", "x"},
                        {"max_tokens", 2},
                        {"temperature", nullptr},
                        {"top_p", nullptr},
                        {"top_k", nullptr},
                        {"seed", nullptr},
                        {"n", nullptr},
                        {"stream", nullptr},
                        {"user", nullptr},
                        {"model", nullptr},
                        {"echo", nullptr}});
  REQUIRE(r);
  CHECK(r->status == 200);
  // Without max_tokens the default (16, OpenAI's) is capped by the server's --max-tokens (5 here).
  auto d = post(c, json{{"prompt", "x"}, {"temperature", 0}, {"ignore_eos", true}});
  REQUIRE(d);
  REQUIRE(d->status == 200);
  CHECK(json::parse(d->body)["usage"]["completion_tokens"] == 5);
  expect_error(post(c, json{{"prompt", "x"}, {"max_tokens", 6}}), 400, "max_tokens");
  // curl -d sends application/x-www-form-urlencoded; Debian's cpp-httplib capped such bodies at 8,192 bytes.
  const std::string long_body = json{{"prompt", "x"}, {"max_tokens", 1}, {"user", std::string(20000, 'u')}}.dump();
  auto f = c.Post("/v1/completions", long_body, "application/x-www-form-urlencoded");
  REQUIRE(f);
  CHECK(f->status == 200);
  // Past the server's own limit (8 MiB): 413, as a JSON error.
  expect_error(c.Post("/v1/completions", std::string(size_t(9) << 20, ' '), "application/json"), 413);
}

TEST_CASE("route bodies: without max_tokens a completion gets 16, a chat reply the context left, both capped") {
  const std::unique_ptr<dew::Tokenizer> tok = dew::make_byte_tokenizer();
  dew_run::RouteLimits lim;
  lim.model_id = "tiny";
  lim.vocab_size = 256;
  lim.max_tokens = 100;
  lim.context = 24;
  const auto length = [&](const json& body, dew_run::DefaultLength d) {
    const dew_run::Completion c = dew_run::parse_completion(body.dump(), lim, tok.get(), d);
    return std::make_pair(c.params.max_new_tokens, int64_t(c.prompt.size()));
  };
  const json body{{"prompt", "abcd"}};
  CHECK(length(body, dew_run::DefaultLength::completion).first == 16);  // OpenAI's /v1/completions default
  const auto [chat, prompt] = length(body, dew_run::DefaultLength::chat);
  CHECK(prompt >= 4);
  CHECK(chat == lim.context - prompt);  // runs to its end of turn, up to the context left
  CHECK(length(json{{"prompt", std::string(40, 'a')}}, dew_run::DefaultLength::chat).first == 1);  // a full context
  CHECK(length(json{{"prompt", "abcd"}, {"max_tokens", 3}}, dew_run::DefaultLength::chat).first == 3);
  lim.max_tokens = 10;  // --max-tokens caps both defaults
  CHECK(length(body, dew_run::DefaultLength::completion).first == 10);
  CHECK(length(body, dew_run::DefaultLength::chat).first == 10);
  lim.context = 0;  // no known context: the cap
  CHECK(length(body, dew_run::DefaultLength::chat).first == 10);
}

TEST_CASE("http: 429 when every slot and queue place is taken, a dropped stream frees its slot") {
  Server s(1, 1);
  // A: a long streamed request holds the only slot until its client goes away.
  std::atomic<bool> first{false}, drop{false};
  std::thread a([&] {
    auto c = s.client();
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    // ignore_eos: at temperature 1 the tiny model soon draws the byte tokenizer's document token (255)
    req.body = json{{"prompt", "long"}, {"max_tokens", 150000}, {"stream", true}, {"ignore_eos", true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) {
      first = true;
      return !drop.load();
    };
    c.send(req);
  });
  while (!first) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  // B waits for the slot.
  int b_status = 0;
  std::string b_text;
  std::thread b([&] {
    auto c = s.client();
    auto r = post(c, json{{"prompt", "next"}, {"max_tokens", 4}, {"seed", 3}});
    if (r) {
      b_status = r->status;
      b_text = r->body;
    }
  });
  for (int i = 0; i < 5000 && s.sched->stats().queued < 1; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(s.sched->stats().queued == 1);
  auto c = s.client();
  auto full = post(c, json{{"prompt", "third"}, {"max_tokens", 4}});
  expect_error(full, 429);
  CHECK(full->get_header_value("Retry-After") == "1");
  auto h = c.Get("/health");
  REQUIRE(h);
  CHECK(json::parse(h->body)["active"] == 1);
  // A's client goes away: A is cancelled, B gets the slot and its solo result.
  drop = true;
  a.join();
  b.join();
  CHECK(b_status == 200);
  CHECK(json::parse(b_text)["choices"][0]["text"].get<std::string>() == wire(s.solo("next", params(4, 1.0f, 3)).text));
  CHECK(s.sched->stats().active == 0);
}

// ---------------------------------------------------------------- dew-run serve, as a child process

TEST_CASE("dew-run serve: a freshly trained run (EMA weights), solo-equal completions, SIGTERM drains") {
  backend("ref");
  auto& reg = dew::Registry::global();
  if (!reg.contains("objective", "lm")) reg.discover(dew::Registry::default_plugin_dirs(), {"lm", "tokens"});
  const fs::path dir = fs::temp_directory_path() / ("dew_test_serve_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto tok = dew::make_byte_tokenizer();
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) docs.push_back("The quick brown fox jumps over the lazy dog. ");
  dew::write_token_corpus(*tok, docs, (dir / "data").string(), 0.1);
  const fs::path run = dir / "run";
  dew::Config cfg = dew::Config::parse_ini(
      "[run]\nname = tiny-serve\nbackend = ref\nseed = 1\n[model]\nplugin = causal_transformer\ndim = 16\n"
      "n_layers = 1\nn_heads = 2\n[objective]\nplugin = lm\nsample_tokens = 0\n[data]\nsource = tokens\npath = " +
      (dir / "data").string() +
      "\nseq_len = 16\nbatch_size = 4\n[optim]\nname = adamw\nlr = 0.01\n[trainer]\nsteps = 4\nlog_every = 2\n"
      "ema_decay = 0.5\n");
  dew::TrainOptions to;
  to.run_dir = run.string();
  REQUIRE(dew::train(cfg, to) == 0);

  int out[2];
  REQUIRE(::pipe(out) == 0);
  const pid_t pid = ::fork();
  REQUIRE(pid >= 0);
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::close(out[0]);
    ::close(out[1]);
    const std::string rd = run.string();
    execl(DEW_RUN_PATH, DEW_RUN_PATH, "serve", "--run-dir", rd.c_str(), "--port", "0", "--slots", "2", "--backend",
          "ref", "--prefill-chunk", "4", (char*)nullptr);
    _exit(127);
  }
  ::close(out[1]);
  std::string line;
  char ch;
  while (::read(out[0], &ch, 1) == 1 && ch != '\n') line += ch;
  INFO("first line: ", line);
  const size_t at = line.find("http://127.0.0.1:");
  REQUIRE(at != std::string::npos);
  const int port = std::atoi(line.c_str() + at + 17);
  REQUIRE(port > 0);
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(std::chrono::seconds(60));

  auto models = c.Get("/v1/models");
  REQUIRE(models);
  const json m = json::parse(models->body)["data"][0];
  CHECK(m["id"] == "tiny-serve");
  CHECK(m["dew"]["step"] == 4);
  CHECK(m["dew"]["ema"] == true);

  // The served text equals generate_text() on the same run loaded here (EMA weights).
  auto loaded = dew::load_inference_run(run.string(), "latest", true, "ref");
  auto* dec = dynamic_cast<dew::CausalDecoder*>(loaded->objective->main_model());
  REQUIRE(dec);
  // Prompts go in chunks of 4 bytes (--prefill-chunk 4); the second prompt's first two chunks are the first's: its
  // slot's cache of them is reused (/health counts the tokens), and its text is still its solo one. (Both stay within
  // the context of 16: a refill would start the slot's cache anew.)
  dew::SamplingParams p = params(4, 0.8f, 5);
  p.prefill_chunk = 4;
  for (const std::string prompt : {"The quick", "The quick b"}) {
    CAPTURE(prompt);
    const std::string want = dew::generate_text(*dec, *loaded->objective->tokenizer(), {prompt}, p)[0].text;
    auto r = post(c, json{{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0.8}, {"seed", 5}});
    REQUIRE(r);
    REQUIRE(r->status == 200);
    CHECK(json::parse(r->body)["choices"][0]["text"].get<std::string>() == wire(want));
  }
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(json::parse(health->body)["prefix_cached_tokens"] == 8);
  CHECK(json::parse(health->body)["prefill_tokens"] == 8 + 3);  // the first prompt's ninth token went as a decode row

  // SIGTERM while a stream is in flight: the stream completes, new requests are refused, exit status 0.
  std::string body;
  std::atomic<bool> started{false};
  std::thread streamer([&] {
    httplib::Client sc("127.0.0.1", port);
    sc.set_read_timeout(std::chrono::seconds(60));
    httplib::Request req;
    req.method = "POST";
    req.path = "/v1/completions";
    req.body = json{{"prompt", "fox"}, {"max_tokens", 600}, {"stream", true}, {"seed", 1}, {"ignore_eos", true}}.dump();
    req.set_header("Content-Type", "application/json");
    req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
      body.append(d, n);
      started = true;
      return true;
    };
    sc.send(req);
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  REQUIRE(::kill(pid, SIGTERM) == 0);
  // Wait until the server says it drains (/health 503) or has closed its listener: a fixed sleep raced the
  // signal thread on a loaded host (the late request below was once served).
  for (int i = 0; i < 2000; ++i) {
    auto h = c.Get("/health");
    if (!h || h->status == 503) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  auto late = post(c, json{{"prompt", "x"}, {"max_tokens", 2}});
  CHECK((!late || late->status == 503));  // refused while draining, or the listener is already closed
  streamer.join();
  dew::SamplingParams fox_params = params(600, 1.0f, 1);  // past the context: refills, in the server's chunks
  fox_params.prefill_chunk = 4;
  const Stream st = parse_sse(body);
  CHECK(st.done);
  CHECK(st.finish.at(0) == "length");
  CHECK(st.text.at(0) == wire(dew::generate_text(*dec, *loaded->objective->tokenizer(), {"fox"}, fox_params)[0].text));
  int status = 0;
  REQUIRE(::waitpid(pid, &status, 0) == pid);
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 0);
  ::close(out[0]);
  fs::remove_all(dir);
}

// ---------------------------------------------------------------- images (POST /v1/images)

namespace {

std::vector<unsigned char> unbase64(const std::string& s) {
  std::vector<unsigned char> out;
  uint32_t acc = 0;
  int bits = 0;
  for (char ch : s) {
    int v = -1;
    if (ch >= 'A' && ch <= 'Z') v = ch - 'A';
    if (ch >= 'a' && ch <= 'z') v = ch - 'a' + 26;
    if (ch >= '0' && ch <= '9') v = ch - '0' + 52;
    if (ch == '+') v = 62;
    if (ch == '/') v = 63;
    if (v < 0) continue;  // '=' padding
    acc = (acc << 6) | uint32_t(v);
    bits += 6;
    if (bits >= 8) {
      bits -= 8;
      out.push_back((unsigned char)((acc >> bits) & 0xFF));
    }
  }
  return out;
}

}  // namespace

TEST_CASE("http images: a tiny diffusion run's PNGs by label equal the objective's, seeded, bad requests 400") {
  backend("ref");
  auto& reg = dew::Registry::global();
  if (!reg.contains("objective", "diffusion"))
    reg.discover(dew::Registry::default_plugin_dirs(), {"dit", "diffusion", "diffusion_samplers", "synthetic"});
  const fs::path dir = fs::temp_directory_path() / ("dew_test_serve_images_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  dew::Config cfg = dew::Config::parse_ini(
      "[run]\nname = tiny-images\nbackend = ref\nseed = 1\n[model]\nplugin = dit\npatch = 4\ndim = 16\ndepth = 1\n"
      "heads = 2\n[objective]\nplugin = diffusion\npreset = edm\nregime = pixel\nval_records = 8\n"
      "val_grid_rows = 0\n[sampler]\nplugin = heun\nsteps = 3\nguidance = 2\n[data]\nsource = synthetic\n"
      "size = 32\nimage_size = 8\nnum_classes = 4\nbatch_size = 8\n[optim]\nname = adamw\nlr = 0.01\n"
      "[trainer]\nsteps = 3\nlog_every = 3\nema_decay = 0.5\n");
  dew::TrainOptions to;
  to.run_dir = (dir / "run").string();
  REQUIRE(dew::train(cfg, to) == 0);
  std::unique_ptr<dew::InferenceRun> run = dew::load_inference_run(to.run_dir, "latest", true, "");
  REQUIRE(run->objective->generates_images());

  dew_run::ImageService images(run->objective);
  dew_run::ModelInfo info;
  info.id = "tiny-images";
  info.kind = "images";
  info.details = run->objective->main_model()->describe();
  dew_run::ServeOptions o;
  o.port = 0;
  o.max_images = 8;
  o.max_steps = 10;
  auto http = std::make_unique<dew_run::HttpServer>(images, info, o);
  const int port = http->bind();
  std::thread model_thread([&] { images.run(); });  // as dew-run serve runs it: the requests' images made there
  std::thread thread([&] { http->listen(); });
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(std::chrono::seconds(60));
  auto post_images = [&](const json& body) { return c.Post("/v1/images", body.dump(), "application/json"); };
  auto pngs = [](const httplib::Result& r) {
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const json j = json::parse(r->body);
    std::vector<std::vector<unsigned char>> out;
    for (const json& d : j["data"]) out.push_back(unbase64(d["b64_json"].get<std::string>()));
    return out;
  };

  const json ask{{"labels", {2, 0}}, {"n", 2}, {"seed", 5}, {"steps", 2}};
  auto r = post_images(ask);
  REQUIRE(r);
  REQUIRE(r->status == 200);
  const json j = json::parse(r->body);
  CHECK(j["seed"] == 5);
  REQUIRE(j["data"].size() == 4);
  std::vector<int> labels;
  for (const json& d : j["data"]) labels.push_back(d["label"].get<int>());
  CHECK(labels == std::vector<int>{2, 0, 2, 0});  // n rows of one column per label
  const auto got = pngs(r);
  for (const auto& png : got) {
    REQUIRE(png.size() > 33);
    CHECK(std::memcmp(png.data(), "\x89PNG\r\n\x1a\n", 8) == 0);
    CHECK(png[19] == 8);  // width 8
    CHECK(png[23] == 8);  // height 8
    CHECK(png[25] == 0);  // greyscale: the run's one channel
  }
  // The server passes the request through unchanged: the objective's own images for the same keys.
  dew::Options direct({{"labels", "2,0"}, {"n", "2"}, {"seed", "5"}, {"steps", "2"}}, "test");
  const std::vector<dew::GeneratedImage> want = run->objective->generate_images(direct, 8);
  REQUIRE(want.size() == 4);
  for (size_t i = 0; i < 4; ++i) CHECK(got[i] == want[i].png);
  CHECK(pngs(post_images(ask)) == got);  // the same seed: the same bytes
  json other = ask;
  other["seed"] = 6;
  CHECK(pngs(post_images(other)) != got);
  // Absent keys take the run's [sampler] section (heun, 3 steps, guidance 2).
  json three = ask;
  three["steps"] = 3;
  json defaults = ask;
  defaults.erase("steps");
  CHECK(pngs(post_images(three)) == pngs(post_images(defaults)));
  json eta{{"labels", {1}}, {"seed", 1}, {"steps", 2}, {"sampler", "ddim"}, {"sampler_options", {{"eta", 0.5}}}};
  CHECK(pngs(post_images(eta)).size() == 1);

  expect_error(post_images({{"labels", {1}}, {"size", "8x8"}}), 400, "size");
  expect_error(post_images({{"labels", {4}}}), 400);                  // not a class
  expect_error(post_images({{"labels", "1"}}), 400, "labels");        // not an array
  expect_error(post_images({{"labels", {0, 1, 2}}, {"n", 3}}), 400);  // 9 images > max_images 8
  expect_error(post_images({{"labels", {1}}, {"steps", 11}}), 400, "steps");
  expect_error(post_images({{"labels", {1}}, {"response_format", "url"}}), 400, "response_format");
  expect_error(post_images({{"labels", {1}}, {"sampler", "ddim"}, {"sampler_options", {{"s_churn", 1}}}}), 400);
  expect_error(post_images({{"labels", {1}}, {"model", "other"}}), 404, "model");
  expect_error(c.Post("/v1/completions", json{{"prompt", "x"}}.dump(), "application/json"), 404);
  auto m = c.Get("/v1/models");
  REQUIRE(m);
  const json mj = json::parse(m->body);
  CHECK(mj["data"][0]["dew"]["kind"] == "images");
  CHECK(mj["data"][0]["dew"]["image_size"] == "8");
  CHECK(images.served() >= 6);  // through run()'s loop (errors thrown there reached their handlers above)

  http->shutdown();  // stops run() too
  model_thread.join();
  thread.join();
  fs::remove_all(dir);
}
