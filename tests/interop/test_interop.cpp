// tests/interop/test_interop.cpp — Hugging Face interop on the ref backend (and cpu when built):
// safetensors reading of every dtype (hand-made files), error cases, sharded write/read; the llama,
// qwen3 (sharded, head_dim != dim / heads, qk-norm, tied), qwen2 (qkv bias) and mistral (sliding window,
// F16) fixtures of make_fixtures.py loaded through the importer with logits within 1e-4 of the
// independent PyTorch float64 reference (full forward and KV-cached decode); export -> import bit-exact;
// config fields refused by name; weights loaded by name for fine-tuning.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "dew/autograd.hpp"
#include "dew/chat_template.hpp"
#include "dew/checkpoint.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/interop.hpp"
#include "dew/model.hpp"
#include "dew/ops.hpp"
#include "dew/registry.hpp"
#include "dew/safetensors.hpp"
#include "dew/tokenizer.hpp"
#include "dew/train.hpp"

using dew::Tensor;
namespace fs = std::filesystem;

namespace {

const dew::BackendPtr& ref() {
  static dew::BackendPtr be = [] {
    auto& reg = dew::Registry::global();
    if (!reg.contains("backend", "ref")) {
      const auto dirs = dew::Registry::default_plugin_dirs();
      reg.discover(dirs, {"ref", "causal_transformer", "lm", "synthetic", "tokens"});
      for (const std::string& d : dirs)
        if (fs::exists(fs::path(d) / "dew_cpu.so")) {
          reg.load((fs::path(d) / "dew_cpu.so").string());
          break;
        }
    }
    dew::BackendPtr b = dew::create_backend("ref");
    dew::set_default_backend(b);
    return b;
  }();
  dew::set_default_backend(be);
  return be;
}

fs::path tmpdir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("dew_test_interop_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string fixture(const std::string& name) { return std::string(DEW_INTEROP_FIXTURES) + "/" + name; }

std::string read_text(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// A safetensors file from raw pieces: {name, dtype, shape, bytes}.
struct Raw {
  std::string name, dtype;
  std::vector<int64_t> shape;
  std::vector<unsigned char> bytes;
};
void write_raw(const fs::path& p, const std::vector<Raw>& ts, const std::string& header_override = "") {
  std::string h = "{";
  size_t off = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    std::string shape;
    for (size_t d = 0; d < ts[i].shape.size(); ++d) shape += (d ? "," : "") + std::to_string(ts[i].shape[d]);
    h += (i ? "," : "") + std::string("\"") + ts[i].name + "\":{\"dtype\":\"" + ts[i].dtype + "\",\"shape\":[" + shape +
         "],\"data_offsets\":[" + std::to_string(off) + "," + std::to_string(off + ts[i].bytes.size()) + "]}";
    off += ts[i].bytes.size();
  }
  h += "}";
  if (!header_override.empty()) h = header_override;
  std::ofstream f(p, std::ios::binary);
  const uint64_t n = h.size();
  f.write(reinterpret_cast<const char*>(&n), 8);
  f << h;
  for (const auto& t : ts) f.write(reinterpret_cast<const char*>(t.bytes.data()), std::streamsize(t.bytes.size()));
}
template <class T>
std::vector<unsigned char> bytes_of(const std::vector<T>& v) {
  std::vector<unsigned char> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// Every decoder folder make_fixtures.py writes: each imports, runs and round-trips in the tests below.
constexpr const char* kDecoderFixtures[] = {"llama",      "qwen3",  "qwen2",  "mistral",  "llama31",
                                            "qwen2-yarn", "gemma2", "gemma3", "qwen3-moe"};

// Builds the [model] of a fixture's config.json (with `model_overrides` on top) and loads its weights on `be`.
std::shared_ptr<dew::Model> load_fixture(const std::string& name, const dew::BackendPtr& be,
                                         const std::map<std::string, std::string>& model_overrides = {}) {
  auto conv = dew::Registry::global().create<dew::HfConverter>("causal_transformer");
  dew::HfImport plan = conv->import_config(read_text(fs::path(fixture(name)) / "config.json"));
  for (const auto& [k, v] : model_overrides) plan.model[k] = v;
  std::erase_if(plan.model, [](const auto& kv) { return kv.second.empty(); });  // "" removes an option
  dew::set_default_backend(be);
  dew::Options o(plan.model, "model");
  o.get_string("plugin", "");
  auto m = dew::Registry::global().create<dew::Model>("causal_transformer", o);
  o.check_all_used();
  dew::load_weights(fixture(name), m->named_parameters(), plan.droppable);
  m->set_training(false);
  return m;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, double(std::fabs(a[i] - b[i])));
  return d;
}

// Full forward and KV-cached decode (one token at a time) of a fixture against its reference logits.
void check_fixture_logits(const std::string& name, const dew::BackendPtr& be) {
  auto m = load_fixture(name, be);
  dew::SafetensorsFile r(fixture(name) + "/reference.safetensors");
  const Tensor tok64 = r.load("tokens", be);
  CHECK(tok64.dtype() == dew::DType::i64);
  const Tensor tokens = Tensor::from_ints(tok64.to_ints(), tok64.shape(), be);
  const std::vector<float> want = r.load("logits", be).to_floats();
  dew::NoGradGuard ng;
  const Tensor logits = m->forward({{"tokens", tokens}});
  CHECK(logits.shape() == r.find("logits")->shape);
  const double full = max_abs_diff(logits.to_floats(), want);
  INFO(name, " full forward max |dew - torch| = ", full);
  CHECK(full < 1e-4);
  // Cached decode: row 0, one token per call (the sliding window of mistral applies across the cache).
  auto* dec = dynamic_cast<dew::CausalDecoder*>(m.get());
  REQUIRE(dec != nullptr);
  const int64_t t = tokens.shape()[1], v = logits.shape()[2];
  const std::vector<int32_t> ids = tok64.to_ints();
  auto cache = dec->make_cache(1, t);
  std::vector<float> got;
  for (int64_t i = 0; i < t; ++i) {
    const auto row = dec->forward_cached(Tensor::from_ints({ids[size_t(i)]}, {1, 1}, be), *cache).to_floats();
    got.insert(got.end(), row.begin(), row.end());
  }
  const std::vector<float> want0(want.begin(), want.begin() + t * v);
  const double cached = max_abs_diff(got, want0);
  INFO(name, " cached decode max |dew - torch| = ", cached);
  CHECK(cached < 1e-4);
}

}  // namespace

TEST_CASE("safetensors: every common dtype is read and converted, mmap-backed entries") {
  ref();
  const fs::path d = tmpdir("dtypes");
  const fs::path f = d / "all.safetensors";
  std::vector<Raw> ts;
  ts.push_back({"f32", "F32", {2}, bytes_of(std::vector<float>{1.5f, -2.25f})});
  ts.push_back({"f64", "F64", {2}, bytes_of(std::vector<double>{0.1, -3.0})});
  ts.push_back({"bf16", "BF16", {2}, bytes_of(std::vector<uint16_t>{0x3fc0, 0xc010})});  // 1.5, -2.25
  ts.push_back({"f16", "F16", {2}, bytes_of(std::vector<uint16_t>{0x3e00, 0xc080})});    // 1.5, -2.25
  ts.push_back({"e4m3", "F8_E4M3", {5}, {0x38, 0x3c, 0xc0, 0x01, 0x7f}});                // 1, 1.5, -2, 2^-9, NaN
  ts.push_back({"e5m2", "F8_E5M2", {3}, {0x3c, 0x3e, 0xc0}});                            // 1, 1.5, -2
  ts.push_back({"i8", "I8", {3}, {0x80, 0xff, 0x7f}});                                   // -128, -1, 127
  ts.push_back({"i16", "I16", {2}, bytes_of(std::vector<int16_t>{-30000, 12345})});
  ts.push_back({"u16", "U16", {2}, bytes_of(std::vector<uint16_t>{65535, 7})});
  ts.push_back({"i32", "I32", {2}, bytes_of(std::vector<int32_t>{-7, 1 << 30})});
  ts.push_back({"u32", "U32", {1}, bytes_of(std::vector<uint32_t>{4000000000u})});
  ts.push_back({"i64", "I64", {1}, bytes_of(std::vector<int64_t>{-(int64_t(1) << 40)})});
  ts.push_back({"u64", "U64", {1}, bytes_of(std::vector<uint64_t>{123456789012ull})});
  ts.push_back({"u8", "U8", {2}, {0, 255}});
  ts.push_back({"bool", "BOOL", {3}, {1, 0, 1}});
  ts.push_back({"empty", "F32", {0, 3}, {}});
  write_raw(f, ts);
  dew::SafetensorsFile st(f.string());
  REQUIRE(st.entries().size() == ts.size());
  CHECK(st.entries()[2].name == "bf16");  // header order
  auto be = ref();
  CHECK(st.load("f32", be).to_floats() == std::vector<float>{1.5f, -2.25f});
  CHECK(st.load("f64", be).dtype() == dew::DType::f64);
  CHECK(st.load("f64", be).to_doubles() == std::vector<double>{0.1, -3.0});
  CHECK(st.load("bf16", be).dtype() == dew::DType::bf16);
  CHECK(st.load("bf16", be, dew::DType::f32).to_floats() == std::vector<float>{1.5f, -2.25f});
  CHECK(st.load("f16", be, dew::DType::f32).to_floats() == std::vector<float>{1.5f, -2.25f});
  const auto e4 = st.load("e4m3", be).to_floats();
  CHECK(e4[0] == 1.0f);
  CHECK(e4[1] == 1.5f);
  CHECK(e4[2] == -2.0f);
  CHECK(e4[3] == std::ldexp(1.0f, -9));
  CHECK(std::isnan(e4[4]));
  CHECK(st.load("e5m2", be).to_floats() == std::vector<float>{1.0f, 1.5f, -2.0f});
  CHECK(st.load("i8", be).dtype() == dew::DType::i32);
  CHECK(st.load("i8", be).to_ints() == std::vector<int32_t>{-128, -1, 127});
  CHECK(st.load("i16", be).to_ints() == std::vector<int32_t>{-30000, 12345});
  CHECK(st.load("u16", be).to_ints() == std::vector<int32_t>{65535, 7});
  CHECK(st.load("u32", be).dtype() == dew::DType::i64);
  CHECK(st.load("u32", be).to_doubles() == std::vector<double>{4000000000.0});
  CHECK(st.load("i64", be).to_doubles() == std::vector<double>{-std::ldexp(1.0, 40)});
  CHECK(st.load("u64", be).to_doubles() == std::vector<double>{123456789012.0});
  CHECK(st.load("u8", be).to_ints() == std::vector<int32_t>{0, 255});
  CHECK(st.load("bool", be).to_ints() == std::vector<int32_t>{1, 0, 1});
  CHECK(st.load("i32", be, dew::DType::f32).to_floats() == std::vector<float>{-7.0f, float(1 << 30)});
  CHECK(st.load("empty", be).numel() == 0);
  // Conversions that lose information are refused.
  CHECK_THROWS_AS(st.load("f32", be, dew::DType::i32), dew::UsageError);
  CHECK_THROWS_AS(st.load("i16", be, dew::DType::u8), dew::UsageError);
  CHECK_THROWS_WITH_AS(st.load("nope", be), doctest::Contains("no tensor 'nope'"), dew::UsageError);
  // read_safetensors keeps its contract: every tensor, in file order.
  const auto all = dew::read_safetensors(f.string(), be);
  CHECK(all.size() == ts.size());
  CHECK(all[0].first == "f32");
  fs::remove_all(d);
}

TEST_CASE("safetensors: malformed files are refused naming the problem") {
  ref();
  const fs::path d = tmpdir("bad");
  const auto four = bytes_of(std::vector<float>{1, 2, 3, 4});
  write_raw(d / "dtype.safetensors", {{"x", "Q7", {4}, four}});
  CHECK_THROWS_WITH(dew::SafetensorsFile((d / "dtype.safetensors").string()), doctest::Contains("dtype 'Q7'"));
  write_raw(d / "shape.safetensors", {{"x", "F32", {5}, four}});
  CHECK_THROWS_WITH(dew::SafetensorsFile((d / "shape.safetensors").string()),
                    doctest::Contains("does not match its 16 bytes"));
  write_raw(
      d / "overlap.safetensors", {{"a", "F32", {4}, four}},
      R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})");
  CHECK_THROWS_WITH(dew::SafetensorsFile((d / "overlap.safetensors").string()), doctest::Contains("overlap"));
  write_raw(d / "trunc.safetensors", {{"a", "F32", {4}, {1, 2, 3}}},
            R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})");
  CHECK_THROWS_WITH(dew::SafetensorsFile((d / "trunc.safetensors").string()), doctest::Contains("truncated"));
  {
    std::ofstream f(d / "short.safetensors");
    f << "abc";
  }
  CHECK_THROWS_AS(dew::SafetensorsFile((d / "short.safetensors").string()), dew::UsageError);
  fs::remove_all(d);
}

TEST_CASE("safetensors: sharded write and read, broken indexes are refused") {
  auto be = ref();
  const fs::path d = tmpdir("shards");
  std::vector<std::pair<std::string, Tensor>> ts;
  for (int i = 0; i < 5; ++i)
    ts.emplace_back("w" + std::to_string(i), Tensor::normal({4, 8}, 0, 1, 7, uint64_t(i), be));  // 128 bytes each
  const auto files = dew::write_safetensors_sharded(d.string(), ts, 300, {{"format", "pt"}});
  // 2 tensors per shard (256 <= 300 < 384): 3 shards + the index, HF names.
  REQUIRE(files.size() == 4);
  CHECK(fs::path(files[0]).filename() == "model-00001-of-00003.safetensors");
  CHECK(fs::path(files[3]).filename() == "model.safetensors.index.json");
  CHECK(read_text(d / "model.safetensors.index.json").find("\"total_size\": 640") != std::string::npos);
  dew::SafetensorsCheckpoint ck(d.string());
  CHECK(ck.files().size() == 3);
  CHECK(ck.names() == std::vector<std::string>{"w0", "w1", "w2", "w3", "w4"});
  for (const auto& [n, t] : ts) CHECK(ck.load(n, be).to_floats() == t.to_floats());
  CHECK(ck.metadata().at("format") == "pt");
  // bf16 conversion on write.
  const fs::path d2 = d / "bf16";
  dew::write_safetensors_sharded(d2.string(), ts, 0, {}, dew::DType::bf16);
  dew::SafetensorsCheckpoint b(d2.string());
  CHECK(b.entry("w0").dtype == "BF16");
  CHECK(!fs::exists(d2 / "model.safetensors.index.json"));
  // A shard missing, and a tensor in two shards.
  fs::copy_file(d / "model-00001-of-00003.safetensors", d / "copy.safetensors");
  fs::remove(d / "model-00003-of-00003.safetensors");
  CHECK_THROWS_WITH(dew::SafetensorsCheckpoint(d.string()), doctest::Contains("which does not exist"));
  dew::write_safetensors_sharded(d.string(), ts, 300, {});
  std::string idx = read_text(d / "model.safetensors.index.json");
  idx.replace(idx.find("\"w4\": \"model-00003-of-00003.safetensors\""), 42,
              "\"w4\": \"model-00003-of-00003.safetensors\", \"w9\": \"copy.safetensors\"");
  std::ofstream(d / "model.safetensors.index.json") << idx;
  // (copy.safetensors sorts first: its w0 contradicts the index before w0 is met twice)
  CHECK_THROWS_WITH(dew::SafetensorsCheckpoint(d.string()), doctest::Contains("but it is in copy.safetensors"));
  fs::remove(d / "model.safetensors.index.json");
  fs::copy_file(d / "copy.safetensors", d / "model.safetensors");
  CHECK_NOTHROW(dew::SafetensorsCheckpoint(d.string()));
  const fs::path d3 = d / "dup";
  fs::create_directories(d3);
  dew::write_safetensors((d3 / "a.safetensors").string(), {ts[0]});
  dew::write_safetensors((d3 / "b.safetensors").string(), {ts[0], ts[1]});
  std::ofstream(d3 / "model.safetensors.index.json")
      << R"({"metadata": {}, "weight_map": {"w0": "a.safetensors", "w1": "b.safetensors"}})";
  CHECK_THROWS_WITH(dew::SafetensorsCheckpoint(d3.string()), doctest::Contains("'w0' is in two shards"));
  // Shard names that leave the index's folder are refused before anything is opened.
  fs::copy_file(d3 / "a.safetensors", d / "outside.safetensors");
  for (const std::string shard : {"../outside.safetensors", "/etc/passwd", "sub/a.safetensors", ".."}) {
    std::ofstream(d3 / "model.safetensors.index.json")
        << R"({"metadata": {}, "weight_map": {"w0": ")" + shard + R"("}})";
    const std::string expected = "names shard '" + shard + "', which is not a file name in the index's folder";
    CHECK_THROWS_WITH(dew::SafetensorsCheckpoint(d3.string()), doctest::Contains(expected.c_str()));
  }
  CHECK(dew::parse_byte_size("5GB", "x") == 5000000000ull);
  CHECK(dew::parse_byte_size("2MiB", "x") == 2097152ull);
  CHECK_THROWS_AS(dew::parse_byte_size("5 parsecs", "x"), dew::UsageError);
  fs::remove_all(d);
}

TEST_CASE(
    "import: llama (BF16, untied), qwen3 (sharded, head_dim 16, qk-norm, tied), qwen2 (qkv bias), mistral "
    "(sliding window, F16), llama31 (llama3 rotary scaling), qwen2-yarn (yarn), gemma2 (sandwich norms, softcaps), "
    "gemma3 (qk-norm, local rotary base, linear scaling), qwen3-moe (4 experts, top 2) match the PyTorch reference "
    "within 1e-4") {
  for (const char* name : kDecoderFixtures) {
    SUBCASE(name) { check_fixture_logits(name, ref()); }
  }
}

TEST_CASE("import on the cpu backend (when built) matches the reference within 1e-4") {
  ref();
  if (!dew::Registry::global().contains("backend", "cpu")) return;
  auto cpu = dew::create_backend("cpu");
  for (const char* name : kDecoderFixtures) check_fixture_logits(name, cpu);
  ref();
}

TEST_CASE("a mixture of experts: transformers' load-balancing loss, and gradients by finite differences") {
  auto be = ref();
  auto m = load_fixture("qwen3-moe", be);
  dew::SafetensorsFile r(fixture("qwen3-moe") + "/reference.safetensors");
  const Tensor tok64 = r.load("tokens", be);
  const Tensor tokens = Tensor::from_ints(tok64.to_ints(), tok64.shape(), be);
  const double coef = std::stod(m->describe().at("moe_aux_loss"));
  CHECK(coef == 0.001);
  // Evaluation forwards make no auxiliary loss; a training forward makes transformers' (times its weight).
  CHECK(!m->auxiliary_loss().defined());
  m->set_training(true);
  const Tensor weights = Tensor::normal({tok64.shape()[0], tok64.shape()[1], 53}, 0, 1, 1, 7, be);
  auto objective = [&] {  // sum(logits * R) + the weighted balancing loss, as the lm objective adds it
    const Tensor logits = m->forward({{"tokens", tokens}});
    return dew::add(dew::sum(dew::mul(logits, weights)), m->auxiliary_loss());
  };
  const Tensor loss = objective();
  REQUIRE(m->auxiliary_loss().defined());
  const double aux = double(m->auxiliary_loss().to_floats()[0]) / coef;
  INFO("balancing loss dew ", aux, " transformers ", r.load("aux_loss", be).to_floats()[0]);
  CHECK(aux == doctest::Approx(r.load("aux_loss", be).to_floats()[0]).epsilon(1e-5));
  CHECK(aux >= 2.0 - 1e-6);  // top_k = 2 at perfect balance; never below
  loss.backward();
  // (f(p[i] + h) - f(p[i] - h)) / 2h in f32 with h = 1e-2, p[i] restored after.
  auto central_difference = [&](Tensor p, size_t i, const auto& f) {
    dew::NoGradGuard ng;
    std::vector<float> v = p.to_floats();
    const float h = 1e-2f, keep = v[i];
    double at[2];
    for (int side = 0; side < 2; ++side) {
      v[i] = side == 0 ? keep + h : keep - h;
      p.copy_(Tensor::from_vector(v, p.shape(), be));
      at[side] = f().to_floats()[0];
    }
    v[i] = keep;
    p.copy_(Tensor::from_vector(v, p.shape(), be));
    return (at[0] - at[1]) / (2.0 * h);
  };
  // Elements of a router, an expert's three projections and an attention weight.
  std::map<std::string, Tensor> params;
  for (const auto& [n, t] : m->named_parameters()) params.emplace(n, t);
  for (const char* name :
       {"model.layers.0.mlp.gate.weight", "model.layers.1.mlp.gate.weight",
        "model.layers.0.mlp.experts.2.down_proj.weight", "model.layers.1.mlp.experts.0.gate_proj.weight",
        "model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.0.self_attn.q_proj.weight"}) {
    Tensor p = params.at(name);
    REQUIRE_MESSAGE(p.grad().defined(), name);
    const std::vector<float> g = p.grad().to_floats();
    for (size_t i : {size_t(0), size_t(5), g.size() - 1}) {
      const double fd = central_difference(p, i, objective);
      INFO(name, "[", i, "]: analytic ", g[i], ", central difference ", fd);
      CHECK(double(g[i]) == doctest::Approx(fd).epsilon(5e-3).scale(0.1));
    }
  }
  // The balancing loss alone reaches the routers (its gradient is ~1e-3 of the logits' above).
  for (auto& [n, t] : params) t.zero_grad();
  auto balance = [&] {
    m->forward({{"tokens", tokens}});
    return dew::scale(m->auxiliary_loss(), float(1.0 / coef));
  };
  balance().backward();
  Tensor router = params.at("model.layers.1.mlp.gate.weight");
  const std::vector<float> g = router.grad().to_floats();
  double largest = 0;
  for (size_t i = 0; i < g.size(); ++i) largest = std::max(largest, std::fabs(double(g[i])));
  CHECK(largest > 1e-2);
  for (size_t i : {size_t(1), size_t(64), g.size() - 2}) {
    const double fd = central_difference(router, i, balance);
    INFO("balancing loss, router[", i, "]: analytic ", g[i], ", central difference ", fd);
    CHECK(double(g[i]) == doctest::Approx(fd).epsilon(5e-3).scale(1e-3));
  }
  // Recomputed blocks would drop the balancing loss's gradient: refused, with the way out.
  dew::RecomputeGuard blocks(dew::Recompute::blocks);
  CHECK_THROWS_WITH_AS(m->forward({{"tokens", tokens}}), doctest::Contains("moe_aux_loss = 0"), dew::UsageError);
  m->set_training(false);
}

TEST_CASE("the rotary-scaling fixtures depend on their scaling: unscaled, or another kind, misses the reference") {
  auto be = ref();
  auto logits_of = [&](const std::string& name, const std::map<std::string, std::string>& overrides) {
    dew::SafetensorsFile ref_file(fixture(name) + "/reference.safetensors");
    const Tensor tok64 = ref_file.load("tokens", be);
    auto m = load_fixture(name, be, overrides);
    dew::NoGradGuard ng;
    const double d =
        max_abs_diff(m->forward({{"tokens", Tensor::from_ints(tok64.to_ints(), tok64.shape(), be)}}).to_floats(),
                     ref_file.load("logits", be).to_floats());
    INFO(name, " max |dew - torch| = ", d);
    return d;
  };
  const std::map<std::string, std::string> unscaled = {
      {"rope_scaling", "none"},     {"rope_factor", ""},           {"rope_original_max_position", ""},
      {"rope_low_freq_factor", ""}, {"rope_high_freq_factor", ""}, {"rope_beta_fast", ""},
      {"rope_beta_slow", ""},       {"rope_attention_factor", ""}};
  CHECK(logits_of("llama31", {}) < 1e-4);
  CHECK(logits_of("llama31", unscaled) > 1e-2);
  auto linear = unscaled;
  linear["rope_scaling"] = "linear", linear["rope_factor"] = "8";
  CHECK(logits_of("llama31", linear) > 1e-2);  // llama3 keeps the short wavelengths linear scales
  CHECK(logits_of("qwen2-yarn", {}) < 1e-4);
  CHECK(logits_of("qwen2-yarn", unscaled) > 1e-2);
  CHECK(logits_of("qwen2-yarn", {{"rope_attention_factor", "1"}}) > 1e-2);  // the factor on the scores matters
}

TEST_CASE("import -> run directory -> export --format hf -> import is lossless") {
  auto be = ref();
  const fs::path d = tmpdir("roundtrip");
  for (const char* name : kDecoderFixtures) {
    const fs::path run = d / (std::string(name) + "_run"), out = d / (std::string(name) + "_hf"),
                   again = d / (std::string(name) + "_again");
    dew::ImportOptions o;
    o.backend = "ref";
    const std::string summary = dew::import_hf(fixture(name), run.string(), o);
    const std::string family =
        nlohmann::json::parse(read_text(fs::path(fixture(name)) / "config.json"))["model_type"].get<std::string>();
    CHECK(summary.find("imported " + family) == 0);
    REQUIRE(fs::exists(run / "checkpoints" / dew::checkpoint_name(0)));
    // The checkpoint holds the fixture's values (converted to f32 exactly).
    const dew::CheckpointData c = dew::read_checkpoint((run / "checkpoints" / dew::checkpoint_name(0)).string(), be);
    dew::SafetensorsCheckpoint src(fixture(name));
    for (const auto& [n, t] : c.params) CHECK(t.to_floats() == src.load(n, be, dew::DType::f32).to_floats());
    // Export in the fixture's own dtype (bytes identical) with small shards, then import again.
    const std::string dt = src.entry("model.norm.weight").dtype;
    dew::export_hf(run.string(), "latest", true, "ref", out.string(), 4096,
                   dt == "BF16"  ? "bf16"
                   : dt == "F16" ? "f16"
                                 : "f32");
    CHECK(fs::exists(out / "model.safetensors.index.json"));
    dew::SafetensorsCheckpoint exp(out.string());
    CHECK(exp.names().size() == src.names().size());
    for (const std::string& n : src.names()) {
      const auto& a = src.entry(n);
      const auto& b = exp.entry(n);
      CHECK(a.dtype == b.dtype);
      CHECK(a.shape == b.shape);
      CHECK(exp.load(n, be).to_floats() == src.load(n, be).to_floats());
    }
    auto conv = dew::Registry::global().create<dew::HfConverter>("causal_transformer");
    const auto p1 = conv->import_config(read_text(fs::path(fixture(name)) / "config.json"));
    auto p2 = conv->import_config(read_text(out / "config.json"));
    // Export always writes head_dim; the fixture may leave it to its default dim / n_heads.
    if (!p1.model.count("head_dim")) {
      CHECK(std::stoll(p2.model.at("head_dim")) * std::stoll(p2.model.at("n_heads")) == std::stoll(p2.model.at("dim")));
      p2.model.erase("head_dim");
    }
    CHECK(p1.model == p2.model);
    dew::import_hf(out.string(), again.string(), o);
    const dew::CheckpointData c2 = dew::read_checkpoint((again / "checkpoints" / dew::checkpoint_name(0)).string(), be);
    REQUIRE(c2.params.size() == c.params.size());
    for (size_t i = 0; i < c.params.size(); ++i)
      CHECK(c2.params[i].second.to_floats() == c.params[i].second.to_floats());
    // Importing into a run directory with checkpoints is refused.
    CHECK_THROWS_WITH_AS(dew::import_hf(fixture(name), run.string(), o), doctest::Contains("already holds checkpoints"),
                         dew::UsageError);
  }
  fs::remove_all(d);
}

TEST_CASE("a failed import leaves no half-imported folder, and a folder that was there before stays") {
  const fs::path d = tmpdir("failed_import");
  const fs::path hf = d / "broken_hf";
  fs::create_directories(hf);
  fs::copy_file(fs::path(fixture("llama")) / "config.json", hf / "config.json");
  {  // the weights cut short: their header promises more bytes than the file holds
    std::ifstream in(fs::path(fixture("llama")) / "model.safetensors", std::ios::binary);
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(hf / "model.safetensors", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  }
  dew::ImportOptions o;
  o.backend = "ref";
  const fs::path fresh = d / "fresh_run";
  CHECK_THROWS_AS(dew::import_hf(hf.string(), fresh.string(), o), dew::Error);
  CHECK_FALSE(fs::exists(fresh));
  const fs::path existing = d / "existing";
  fs::create_directories(existing);
  std::ofstream(existing / "notes.txt") << "mine";
  CHECK_THROWS_AS(dew::import_hf(hf.string(), existing.string(), o), dew::Error);
  CHECK(fs::exists(existing / "notes.txt"));
  fs::remove_all(d);
}

TEST_CASE("import: config fields are mapped, ignored or refused by name") {
  ref();
  auto conv = dew::Registry::global().create<dew::HfConverter>("causal_transformer");
  const std::string base = read_text(fs::path(fixture("llama")) / "config.json");
  auto with = [&](const std::string& field) {  // inserts a field after the opening brace
    return "{" + field + "," + base.substr(base.find('{') + 1);
  };
  const dew::HfImport ok = conv->import_config(base);
  CHECK(ok.model.at("rope_theta") == "500000");
  CHECK(ok.model.at("tie_embeddings") == "false");
  CHECK(ok.model.at("n_kv_heads") == "2");
  CHECK(ok.model.at("mlp_hidden") == "40");
  CHECK(ok.model.at("norm_eps") == "1e-05");
  CHECK(ok.bos_id == 1);
  CHECK(ok.eos_id == 2);
  CHECK(std::find(ok.ignored.begin(), ok.ignored.end(), "pretraining_tp") != ok.ignored.end());
  CHECK_THROWS_WITH_AS(conv->import_config(with(R"("rope_scaling2": 1, "moe_experts": 4)")),
                       doctest::Contains("fields 'moe_experts', 'rope_scaling2' are not expressible"), dew::UsageError);
  auto with_rope = [&](const std::string& rope_scaling) {
    std::string scaled = base;
    scaled.replace(scaled.find("\"rope_scaling\": null"), 20, "\"rope_scaling\": " + rope_scaling);
    return scaled;
  };
  const dew::HfImport l3 = conv->import_config(with_rope(
      R"({"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192})"));  // Llama 3.2's
  CHECK(l3.model.at("rope_scaling") == "llama3");
  CHECK(l3.model.at("rope_factor") == "32");
  CHECK(l3.model.at("rope_original_max_position") == "8192");
  CHECK(l3.model.at("rope_high_freq_factor") == "4");
  CHECK_THROWS_WITH_AS(conv->import_config(with_rope(R"({"rope_type": "llama3", "factor": 8.0})")),
                       doctest::Contains("no original_max_position_embeddings"), dew::UsageError);
  CHECK_THROWS_WITH_AS(
      conv->import_config(with_rope(
          R"({"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192, "beta_fast": 32})")),
      doctest::Contains("rope_scaling.beta_fast is not expressible (llama3"), dew::UsageError);
  CHECK_THROWS_WITH_AS(conv->import_config(with_rope(R"({"type": "dynamic", "factor": 2.0})")),
                       doctest::Contains("dynamic, longrope and others are not implemented"), dew::UsageError);
  CHECK_THROWS_WITH_AS(conv->import_config(with_rope(R"({"type": "linear"})")), doctest::Contains("has no factor"),
                       dew::UsageError);
  // YaRN's attention factor as transformers resolves it: given, from mscale / mscale_all_dim, or 0.1 ln(factor) + 1;
  // the original context defaults to max_position_embeddings (128 in this fixture).
  const dew::HfImport y1 = conv->import_config(with_rope(R"({"type": "yarn", "factor": 4.0})"));
  CHECK(y1.model.at("rope_original_max_position") == "128");
  CHECK(std::stod(y1.model.at("rope_attention_factor")) == doctest::Approx(0.1 * std::log(4.0) + 1.0).epsilon(1e-12));
  const dew::HfImport y2 = conv->import_config(with_rope(
      R"({"rope_type": "yarn", "factor": 40, "mscale": 0.707, "mscale_all_dim": 0.707, "beta_fast": 32,
          "beta_slow": 1, "original_max_position_embeddings": 4096})"));  // DeepSeek's form
  CHECK(std::stod(y2.model.at("rope_attention_factor")) == 1.0);
  const dew::HfImport y3 = conv->import_config(
      with_rope(R"({"rope_type": "yarn", "factor": 2, "attention_factor": 1.5, "truncate": false})"));
  CHECK(y3.model.at("rope_attention_factor") == "1.5");
  CHECK(y3.model.at("rope_truncate") == "false");
  // Gemma 3 in transformers 5's form: rope_parameters per layer kind, layer_types instead of the pattern.
  std::string g3 = read_text(fs::path(fixture("gemma3")) / "config.json");
  const dew::HfImport g3_old = conv->import_config(g3);
  CHECK(g3_old.model.at("rope_local_theta") == "10000");
  CHECK(g3_old.model.at("layer_pattern") == "local,local,local,local,local,global");
  CHECK(g3_old.model.at("query_pre_attn_scalar") == "16");
  CHECK(g3_old.model.at("sandwich_norm") == "true");
  nlohmann::json g3_new = nlohmann::json::parse(g3);
  g3_new.erase("rope_theta"), g3_new.erase("rope_scaling"), g3_new.erase("rope_local_base_freq");
  g3_new.erase("sliding_window_pattern");
  g3_new["rope_parameters"] = {{"full_attention", {{"rope_type", "linear"}, {"factor", 8.0}, {"rope_theta", 1e6}}},
                               {"sliding_attention", {{"rope_type", "default"}, {"rope_theta", 1e4}}}};
  g3_new["layer_types"] = {"sliding_attention", "sliding_attention", "sliding_attention",
                           "sliding_attention", "sliding_attention", "full_attention"};
  CHECK(conv->import_config(g3_new.dump()).model == g3_old.model);
  g3_new["use_bidirectional_attention"] = true;
  CHECK_THROWS_WITH_AS(conv->import_config(g3_new.dump()), doctest::Contains("use_bidirectional_attention"),
                       dew::UsageError);
  CHECK_THROWS_WITH_AS(conv->import_config(with_rope(R"({"rope_type": "yarn", "factor": 0.5})")),
                       doctest::Contains("factor must be a number >= 1"), dew::UsageError);
  std::string act = base;
  act.replace(act.find("\"silu\""), 6, "\"relu\"");
  CHECK_THROWS_WITH_AS(conv->import_config(act), doctest::Contains("hidden_act 'relu'"), dew::UsageError);
  CHECK_THROWS_WITH_AS(conv->import_config(with(R"("quantization_config": {"bits": 4})")),
                       doctest::Contains("quantization_config"), dew::UsageError);
  std::string other = base;
  other.replace(other.find("\"llama\""), 7, "\"gpt2\"");
  CHECK_THROWS_WITH_AS(conv->import_config(other), doctest::Contains("model_type 'gpt2'"), dew::UsageError);
  // Qwen: a sliding window only with use_sliding_window, on layers >= max_window_layers.
  std::string q = read_text(fs::path(fixture("qwen2")) / "config.json");
  CHECK(conv->import_config(q).model.count("sliding_window") == 0);
  q.replace(q.find("\"use_sliding_window\": false"), 27, "\"use_sliding_window\": true");
  q.replace(q.find("\"max_window_layers\": 2"), 22, "\"max_window_layers\": 1");
  const auto sw = conv->import_config(q);
  CHECK(sw.model.at("sliding_window") == "32");
  CHECK(sw.model.at("layer_pattern") == "global,local");
}

TEST_CASE("load_weights (trainer.init_from): by name from a run, a checkpoint or safetensors, mismatches named") {
  auto be = ref();
  const fs::path d = tmpdir("init");
  dew::ImportOptions o;
  o.backend = "ref";
  dew::import_hf(fixture("qwen2"), (d / "run").string(), o);
  auto m = load_fixture("qwen2", be);
  auto fresh = dew::Registry::global().create<dew::Model>(
      "causal_transformer", dew::Options(dew::Registry::global()
                                             .create<dew::HfConverter>("causal_transformer")
                                             ->import_config(read_text(fs::path(fixture("qwen2")) / "config.json"))
                                             .model));
  fresh->initialize(3);
  const auto before = fresh->named_parameters()[1].second.to_floats();
  CHECK(dew::load_weights((d / "run").string(), fresh->named_parameters()).find("dew checkpoint") == 0);
  for (size_t i = 0; i < m->named_parameters().size(); ++i)
    CHECK(fresh->named_parameters()[i].second.to_floats() == m->named_parameters()[i].second.to_floats());
  CHECK(before != fresh->named_parameters()[1].second.to_floats());
  // A model of another shape: every mismatch is named.
  dew::Options other({{"vocab_size", "47"},
                      {"dim", "24"},
                      {"n_layers", "1"},
                      {"n_heads", "3"},
                      {"n_kv_heads", "1"},
                      {"mlp_hidden", "40"},
                      {"qkv_bias", "true"},
                      {"tie_embeddings", "false"}},
                     "model");
  auto wrong = dew::Registry::global().create<dew::Model>("causal_transformer", other);
  CHECK_THROWS_WITH_AS(dew::load_weights(fixture("qwen2"), wrong->named_parameters()),
                       doctest::Contains("missing: 'lm_head.weight'"), dew::UsageError);
  CHECK_THROWS_WITH_AS(dew::load_weights(fixture("qwen2"), wrong->named_parameters(), {"lm_head.weight"}),
                       doctest::Contains("not parameters of this model: 'model.layers.1."), dew::UsageError);
  fs::remove_all(d);
}

TEST_CASE("dew::train with trainer.init_from starts from the imported weights (fine-tuning)") {
  auto be = ref();
  const fs::path d = tmpdir("finetune");
  dew::ImportOptions o;
  o.backend = "ref";
  dew::import_hf(fixture("qwen2"), (d / "imported").string(), o);
  dew::Config cfg = dew::Config::load_ini((d / "imported" / "config.ini").string());
  // lr 1e-30: one AdamW step moves no f32 weight of this size, so the saved weights are the imported ones.
  for (const auto& [k, v] : std::map<std::string, std::string>{{"trainer.init_from", (d / "imported").string()},
                                                               {"data.source", "synthetic"},
                                                               {"data.kind", "tokens"},
                                                               {"data.vocab", "47"},
                                                               {"data.seq_len", "8"},
                                                               {"data.size", "16"},
                                                               {"data.batch_size", "2"},
                                                               {"optim.lr", "1e-30"},
                                                               {"trainer.steps", "1"},
                                                               {"trainer.log_every", "1"}})
    cfg.set(k, v);
  dew::TrainOptions to;
  to.run_dir = (d / "ft").string();
  CHECK(dew::train(cfg, to) == 0);
  const dew::CheckpointData c =
      dew::read_checkpoint(dew::find_latest_checkpoint((d / "ft" / "checkpoints").string()), be);
  dew::SafetensorsCheckpoint src(fixture("qwen2"));
  REQUIRE(c.params.size() == src.names().size());
  for (const auto& [n, t] : c.params) CHECK(t.to_floats() == src.load(n, be, dew::DType::f32).to_floats());
  fs::remove_all(d);
}

TEST_CASE("export of a byte-token run: tokenizer.json (GPT-2's byte level, no merges) and eos, import encodes bytes") {
  ref();
  const fs::path d = tmpdir("bytes");
  // A byte-token corpus (dew-tokenize --tokenizer byte) and one update of a tiny llama on it.
  std::vector<std::string> docs;
  for (int i = 0; i < 40; ++i) docs.push_back("fortune " + std::to_string(i) + ": caf\xc3\xa9 \xe2\x82\xac\n");
  dew::write_token_corpus(*dew::make_byte_tokenizer(), docs, (d / "tokens").string(), 0.1, true);
  dew::Config cfg = dew::Config::parse_ini(
      "[run]\nbackend = ref\n[model]\nplugin = causal_transformer\nvocab_size = 256\ndim = 16\nn_layers = 1\n"
      "n_heads = 2\nmlp = swiglu\n[objective]\nplugin = lm\nsample_tokens = 0\n[data]\nsource = tokens\nseq_len = 16\n"
      "batch_size = 2\n[optim]\nname = adamw\n[trainer]\nsteps = 1\n");
  cfg.set("data.path", (d / "tokens").string());
  dew::TrainOptions to;
  to.run_dir = (d / "run").string();
  REQUIRE(dew::train(cfg, to) == 0);
  dew::export_hf((d / "run").string(), "latest", true, "ref", (d / "hf").string(), int64_t(1) << 30, "");
  REQUIRE(fs::exists(d / "hf" / "tokenizer.json"));
  // The vocab is GPT-2's byte -> unicode table, id = byte value (entries written out here, not computed by dew).
  const auto tj = nlohmann::json::parse(read_text(d / "hf" / "tokenizer.json"));
  const auto& vocab = tj["model"]["vocab"];
  CHECK(vocab.size() == 256);
  CHECK(tj["model"]["merges"].empty());
  CHECK(tj["pre_tokenizer"]["type"] == "ByteLevel");
  CHECK(vocab["A"] == 65);
  CHECK(vocab["\xc4\xa0"] == 32);   // U+0120 'Ġ': the space
  CHECK(vocab["\xc4\x8a"] == 10);   // U+010A 'Ċ': the newline
  CHECK(vocab["\xc4\x80"] == 0);    // U+0100: byte 0
  CHECK(vocab["\xc4\xa1"] == 127);  // U+0121: byte 0x7F
  CHECK(vocab["\xc5\x83"] == 173);  // U+0143: byte 0xAD (soft hyphen, not printable in GPT-2's table)
  CHECK(vocab["\xc3\xbf"] == 255);  // U+00FF 'ÿ' maps to itself
  CHECK(nlohmann::json::parse(read_text(d / "hf" / "generation_config.json"))["eos_token_id"] == 255);
  // Imported, the run's tokenizer encodes any bytes (invalid UTF-8 too) as the byte tokenizer does; eos 255.
  dew::ImportOptions o;
  o.backend = "ref";
  dew::import_hf((d / "hf").string(), (d / "imported").string(), o);
  auto tok = dew::load_tokenizer((d / "imported" / "tokenizer").string());
  CHECK(tok->vocab_size() == 256);
  CHECK(dew::read_token_meta((d / "imported" / "tokenizer").string()).eos_id == 255);
  auto bytes = dew::make_byte_tokenizer();
  for (const std::string& text :
       {std::string("caf\xc3\xa9 \xe2\x82\xac, 'twas\n\t  x"), std::string("\xff\xfe\x80 a\x00b", 7)}) {
    CHECK(tok->encode(text) == bytes->encode(text));
    CHECK(tok->decode(tok->encode(text)) == text);
  }
  fs::remove_all(d);
}

TEST_CASE("import keeps the chat template and special tokens (tokenizer_config.json, chat_template.jinja)") {
  ref();
  const fs::path d = tmpdir("chat");
  const fs::path hf = d / "hf";
  fs::create_directories(hf);
  for (const auto& e : fs::directory_iterator(fixture("qwen2"))) fs::copy_file(e.path(), hf / e.path().filename());
  const std::string tmpl =
      "{%- for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
      "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}";
  nlohmann::json cfg = {
      {"chat_template", tmpl}, {"eos_token", "<|im_end|>"}, {"pad_token", {{"content", "<|endoftext|>"}}}};
  { std::ofstream(hf / "tokenizer_config.json") << cfg.dump(); }
  dew::ImportOptions o;
  o.backend = "ref";
  const std::string summary = dew::import_hf(hf.string(), (d / "run").string(), o);
  CHECK(summary.find("chat template from") != std::string::npos);
  REQUIRE(fs::exists(d / "run" / "tokenizer" / "tokenizer_config.json"));
  const dew::ChatConfig c = dew::chat_config_of_folder((d / "run" / "tokenizer").string());
  CHECK(c.chat_template == tmpl);
  CHECK(c.special_tokens ==
        std::vector<std::pair<std::string, std::string>>{{"eos_token", "<|im_end|>"}, {"pad_token", "<|endoftext|>"}});
  const dew::ChatTemplate t(c.chat_template);
  CHECK(t.render(dew::chat_context_json(c, R"({"messages": [{"role": "user", "content": "hi"}]})", true)).text ==
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
  // A model folder without a template: the run renders with dew's default.
  CHECK(dew::chat_config_of_folder((d / "nowhere").string()).chat_template == dew::default_chat_template());
  // A template outside dew's subset is kept, and the import says why it cannot render it.
  const fs::path hf2 = d / "hf2";
  fs::create_directories(hf2);
  for (const auto& e : fs::directory_iterator(fixture("qwen2"))) fs::copy_file(e.path(), hf2 / e.path().filename());
  { std::ofstream(hf2 / "chat_template.jinja") << "line one\n{% include 'x' %}"; }
  const std::string s2 = dew::import_hf(hf2.string(), (d / "run2").string(), o);
  CHECK(s2.find("chat_template.jinja:2") != std::string::npos);
  CHECK(fs::exists(d / "run2" / "tokenizer" / "chat_template.jinja"));
  fs::remove_all(d);
}
