// tests/data/test_data.cpp — the data pipeline (core/data) and the idx and synthetic sources.
//
// The loader's stream must be exactly the one dew/data.hpp documents: resumable at any position (also
// across epoch boundaries and with another world size), sharded so that the ranks of a global batch see
// disjoint records, the same records for 1 rank x 2B as for 2 ranks x B, and the same bytes for any
// number of worker threads. The idx source reads the real Fashion-MNIST when installed and refuses
// truncated, corrupt and missing files with the file's name.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <dew/config.hpp>
#include <dew/data.hpp>
#include <dew/error.hpp>
#include <dew/random.hpp>
#include <dew/registry.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "temp_dir.hpp"

namespace fs = std::filesystem;
using namespace dew;

namespace {

// Record i: "x" i32 [] = i, "v" f32 [2] = {i / 2, -i}.
class CountingSource final : public DataSource {
 public:
  explicit CountingSource(int64_t n, std::string name = "counting") : n_(n), name_(std::move(name)) {}
  int64_t size() const override { return n_; }
  Record get(int64_t i) const override {
    ++reads;
    Record r;
    r["x"] = HostArray::scalar_i32(int32_t(i));
    HostArray v = HostArray::make(DType::f32, {2});
    v.as<float>()[0] = float(i) / 2;
    v.as<float>()[1] = -float(i);
    r["v"] = std::move(v);
    return r;
  }
  std::string identity() const override { return name_ + ":" + std::to_string(n_); }
  mutable std::atomic<int64_t> reads{0};

 private:
  int64_t n_;
  std::string name_;
};

// Record i has "x" of shape [1 + (i == bad)], or, with `drop`, lacks "x" when i == bad.
class RaggedSource final : public DataSource {
 public:
  RaggedSource(int64_t bad, bool drop) : bad_(bad), drop_(drop) {}
  int64_t size() const override { return 8; }
  Record get(int64_t i) const override {
    Record r;
    if (drop_ && i == bad_) {
      r["y"] = HostArray::scalar_i32(0);
      return r;
    }
    r["x"] = HostArray::make(DType::i32, {1 + (i == bad_ ? 1 : 0)});
    return r;
  }
  std::string identity() const override { return "ragged"; }

 private:
  int64_t bad_;
  bool drop_;
};

LoaderConfig cfg(int64_t batch, uint64_t seed = 7, bool shuffle = true, int workers = 1, int rank = 0, int world = 1,
                 int prefetch = 2) {
  LoaderConfig c;
  c.batch_size = batch;
  c.seed = seed;
  c.shuffle = shuffle;
  c.workers = workers;
  c.rank = rank;
  c.world = world;
  c.prefetch = prefetch;
  return c;
}

bool same_batch(const HostBatch& a, const HostBatch& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [k, x] : a) {
    auto it = b.find(k);
    if (it == b.end()) return false;
    const HostArray& y = it->second;
    if (x.dtype != y.dtype || x.shape != y.shape || x.bytes != y.bytes) return false;
  }
  return true;
}

std::vector<int64_t> xs(const HostBatch& b) {
  const HostArray& x = b.at("x");
  return std::vector<int64_t>(x.as<int32_t>(), x.as<int32_t>() + x.numel());
}

std::vector<int64_t> stream_perm(DataLoader& l, int64_t n, int64_t epoch) {
  // the permutation of an epoch read back through indices_of_batch with batch 1, world 1
  std::vector<int64_t> p;
  for (int64_t k = epoch * n; k < (epoch + 1) * n; ++k) p.push_back(l.indices_of_batch(k).at(0));
  return p;
}

bool is_permutation_of_n(std::vector<int64_t> p, int64_t n) {
  std::sort(p.begin(), p.end());
  for (int64_t i = 0; i < n; ++i)
    if (int64_t(p.size()) != n || p[size_t(i)] != i) return false;
  return true;
}

template <class F>
std::string error_of(F&& f, ErrorKind want = ErrorKind::usage) {
  try {
    f();
  } catch (const Error& e) {
    CHECK(e.kind() == want);
    return e.what();
  }
  FAIL("no dew::Error was thrown");
  return {};
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

void load_plugin(const char* kind_name, const char* path) {
  if (!Registry::global().contains(DataSource::kind, kind_name)) Registry::global().load(path);
}

std::shared_ptr<DataSource> synthetic(std::map<std::string, std::string> o) {
  load_plugin("synthetic", DEW_SYNTHETIC_PLUGIN_PATH);
  return Registry::global().create<DataSource>("synthetic", Options(std::move(o), "data"));
}

std::shared_ptr<DataSource> idx(const std::string& path, const std::string& split = "train") {
  load_plugin("idx", DEW_IDX_PLUGIN_PATH);
  return Registry::global().create<DataSource>("idx", Options({{"path", path}, {"split", split}}, "data"));
}

// A temporary folder removed at the end of the scope.
using dew_test::TempDir;

std::vector<unsigned char> gunzip(const fs::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  REQUIRE(f != nullptr);
  std::vector<unsigned char> out;
  unsigned char buf[1 << 16];
  int got;
  while ((got = gzread(f, buf, sizeof buf)) > 0) out.insert(out.end(), buf, buf + got);
  gzclose(f);
  return out;
}

void write_file(const fs::path& p, const std::vector<unsigned char>& bytes, size_t limit = size_t(-1)) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(bytes.data()), std::streamsize(std::min(limit, bytes.size())));
}

void put_be32(std::vector<unsigned char>& v, uint32_t x) {
  for (int s = 24; s >= 0; s -= 8) v.push_back(uint8_t(x >> s));
}

// A small valid IDX pair: n images of h x w (pixel = i + y + x), labels i % 10.
void write_small_idx(const fs::path& dir, const std::string& prefix, uint32_t n, uint32_t h, uint32_t w,
                     uint32_t labels = uint32_t(-1)) {
  std::vector<unsigned char> im, lb;
  put_be32(im, 0x803), put_be32(im, n), put_be32(im, h), put_be32(im, w);
  for (uint32_t i = 0; i < n; ++i)
    for (uint32_t y = 0; y < h; ++y)
      for (uint32_t x = 0; x < w; ++x) im.push_back(uint8_t(i + y + x));
  if (labels == uint32_t(-1)) labels = n;
  put_be32(lb, 0x801), put_be32(lb, labels);
  for (uint32_t i = 0; i < labels; ++i) lb.push_back(uint8_t(i % 10));
  write_file(dir / (prefix + "-images-idx3-ubyte"), im);
  write_file(dir / (prefix + "-labels-idx1-ubyte"), lb);
}

const char* kFashion = "/usr/share/datasets/fashion-mnist";
bool have_fashion() { return fs::exists(fs::path(kFashion) / "train-images-idx3-ubyte.gz"); }

}  // namespace

// ------------------------------------------------------------------------------------------------ loader

TEST_CASE("batches collate each field along a new leading axis") {
  auto src = std::make_shared<CountingSource>(10);
  DataLoader l(src, cfg(4, 7, false));
  const HostBatch b = l.next();
  REQUIRE(b.size() == 2);
  CHECK(b.at("x").dtype == DType::i32);
  CHECK(b.at("x").shape == Shape{4});
  CHECK(b.at("v").shape == Shape{4, 2});
  CHECK(xs(b) == std::vector<int64_t>{0, 1, 2, 3});
  const float* v = b.at("v").as<float>();
  CHECK(v[2] == 0.5f);
  CHECK(v[3] == -1.0f);
  CHECK(l.position().next == 4);
  CHECK(l.position().order == "source=counting:10;n=10;seed=7;shuffle=0");
  // without shuffle the stream wraps around: 8, 9, 0, 1
  l.next();
  CHECK(xs(l.next()) == std::vector<int64_t>{8, 9, 0, 1});
  CHECK(l.epoch() == 1);
}

TEST_CASE("(a) a seek to a saved position continues exactly like the uninterrupted loader, across epochs") {
  auto src = std::make_shared<CountingSource>(10);
  for (int workers : {0, 1, 3}) {
    CAPTURE(workers);
    DataLoader a(src, cfg(3, 11, true, workers));
    a.next(), a.next();
    const DataPosition saved = a.position();
    CHECK(saved.next == 6);
    std::vector<HostBatch> rest;
    for (int i = 0; i < 8; ++i) rest.push_back(a.next());  // stream [6, 30): epochs 0, 1, 2
    CHECK(a.epoch() == 3);

    DataLoader b(src, cfg(3, 11, true, workers == 0 ? 2 : 0));
    b.next();  // prefetched work from before the seek must be dropped
    b.seek(saved);
    CHECK(b.position().next == 6);
    for (int i = 0; i < 8; ++i) CHECK(same_batch(b.next(), rest[size_t(i)]));
    CHECK(b.position().next == a.position().next);

    // seeking the same loader back replays the same bytes
    a.seek(saved);
    for (int i = 0; i < 8; ++i) CHECK(same_batch(a.next(), rest[size_t(i)]));
  }
}

TEST_CASE("the position does not depend on the world size: resume with another rank count") {
  auto src = std::make_shared<CountingSource>(13);
  // 2 ranks x 2 consume 3 global batches: position 12; one rank x 4 resumes from there
  DataLoader r0(src, cfg(2, 5, true, 1, 0, 2)), r1(src, cfg(2, 5, true, 1, 1, 2));
  for (int i = 0; i < 3; ++i) r0.next(), r1.next();
  CHECK(r0.position().next == 12);
  CHECK(r0.position().order == r1.position().order);
  DataLoader single(src, cfg(4, 5, true, 2));
  single.seek(r0.position());
  DataLoader reference(src, cfg(1, 5, true, 0));
  reference.seek({12, reference.position().order});
  std::vector<int64_t> want;
  for (int i = 0; i < 8; ++i) want.push_back(xs(reference.next()).at(0));
  std::vector<int64_t> got = xs(single.next()), more = xs(single.next());
  got.insert(got.end(), more.begin(), more.end());
  CHECK(got == want);
}

TEST_CASE("(b) the ranks of a 2-way shard together see every record of an epoch exactly once") {
  const int64_t n = 24, B = 3;
  auto src = std::make_shared<CountingSource>(n);
  DataLoader r0(src, cfg(B, 3, true, 2, 0, 2)), r1(src, cfg(B, 3, true, 2, 1, 2));
  std::vector<int64_t> seen;
  for (int64_t k = 0; k < n / (2 * B); ++k) {
    const auto a = r0.indices_of_batch(k), b = r1.indices_of_batch(k);
    // what next() delivers is what indices_of_batch says
    CHECK(xs(r0.next()) == a);
    CHECK(xs(r1.next()) == b);
    seen.insert(seen.end(), a.begin(), a.end());
    seen.insert(seen.end(), b.begin(), b.end());
  }
  CHECK(is_permutation_of_n(seen, n));
  CHECK(std::set<int64_t>(seen.begin(), seen.end()).size() == size_t(n));
  CHECK(r0.epoch() == 1);

  // a record count that is no multiple of the global batch: 2 epochs of 10 = 5 global batches of 4,
  // every record twice
  auto src10 = std::make_shared<CountingSource>(10);
  DataLoader s0(src10, cfg(2, 3, true, 1, 0, 2)), s1(src10, cfg(2, 3, true, 1, 1, 2));
  std::map<int64_t, int> count;
  for (int k = 0; k < 5; ++k) {
    for (int64_t i : s0.indices_of_batch(k)) ++count[i];
    for (int64_t i : s1.indices_of_batch(k)) ++count[i];
  }
  REQUIRE(count.size() == 10);
  for (const auto& [i, c] : count) CHECK(c == 2);
}

TEST_CASE("(c) 1 rank x batch 2B reads the same records per global batch as 2 ranks x B") {
  auto src = std::make_shared<CountingSource>(17);
  const int64_t B = 3;
  DataLoader one(src, cfg(2 * B, 9, true, 1)), r0(src, cfg(B, 9, true, 3, 0, 2)), r1(src, cfg(B, 9, true, 0, 1, 2));
  for (int64_t k = 0; k < 12; ++k) {  // a bit over 4 epochs
    CAPTURE(k);
    const HostBatch b = one.next(), a0 = r0.next(), a1 = r1.next();
    std::vector<int64_t> split = xs(a0), second = xs(a1);
    split.insert(split.end(), second.begin(), second.end());
    CHECK(xs(b) == split);
    CHECK(one.indices_of_batch(k) == split);
    // the rows of the big batch are the two halves' bytes
    const HostArray& v = b.at("v");
    CHECK(std::equal(a0.at("v").bytes.begin(), a0.at("v").bytes.end(), v.bytes.begin()));
    CHECK(std::equal(a1.at("v").bytes.begin(), a1.at("v").bytes.end(), v.bytes.begin() + v.bytes.size() / 2));
  }
  CHECK(one.position().next == r0.position().next);
}

TEST_CASE("(d) identical batches for any number of workers and any prefetch") {
  auto src = synthetic({{"size", "50"}, {"seed", "3"}});
  std::vector<HostBatch> want;
  {
    DataLoader l(src, cfg(7, 21, true, 1));
    for (int i = 0; i < 20; ++i) want.push_back(l.next());
  }
  for (auto [workers, prefetch] : {std::pair{0, 0}, {3, 2}, {3, 1}, {4, 8}, {2, 0}}) {
    CAPTURE(workers);
    CAPTURE(prefetch);
    DataLoader l(src, cfg(7, 21, true, workers, 0, 1, prefetch));
    for (int i = 0; i < 20; ++i) CHECK(same_batch(l.next(), want[size_t(i)]));
  }
}

TEST_CASE("(e) the shuffle is a permutation that differs between epochs and seeds, off means in order") {
  const int64_t n = 100;
  auto src = std::make_shared<CountingSource>(n);
  DataLoader a(src, cfg(1, 1)), b(src, cfg(1, 2)), off(src, cfg(1, 1, false));
  const auto a0 = stream_perm(a, n, 0), a1 = stream_perm(a, n, 1), b0 = stream_perm(b, n, 0);
  CHECK(is_permutation_of_n(a0, n));
  CHECK(is_permutation_of_n(a1, n));
  CHECK(is_permutation_of_n(b0, n));
  CHECK(a0 != a1);
  CHECK(a0 != b0);
  std::vector<int64_t> identity(n);
  for (int64_t i = 0; i < n; ++i) identity[size_t(i)] = i;
  CHECK(a0 != identity);
  CHECK(stream_perm(off, n, 0) == identity);
  CHECK(stream_perm(off, n, 3) == identity);
  // the same seed gives the same order in another loader (nothing depends on the loader's history)
  DataLoader again(src, cfg(5, 1, true, 3));
  std::vector<int64_t> again1;
  for (int64_t k = n / 5; k < 2 * n / 5; ++k)
    for (int64_t i : again.indices_of_batch(k)) again1.push_back(i);
  CHECK(again1 == a1);
  // a small source still shuffles every position: over many seeds each record reaches position 0
  auto src5 = std::make_shared<CountingSource>(5);
  std::set<int64_t> first;
  for (uint64_t s = 0; s < 64; ++s) first.insert(DataLoader(src5, cfg(1, s, true, 0)).indices_of_batch(0).at(0));
  CHECK(first.size() == 5);
}

TEST_CASE("(f) a seek with another order description is refused, naming both") {
  auto src = std::make_shared<CountingSource>(10);
  DataLoader a(src, cfg(2, 1)), b(src, cfg(2, 2)), c(src, cfg(2, 1, false));
  a.next();
  const DataPosition p = a.position();
  const std::string msg = error_of([&] { b.seek(p); });
  CHECK(contains(msg, p.order));
  CHECK(contains(msg, b.position().order));
  CHECK(contains(error_of([&] { c.seek(p); }), "shuffle=0"));
  auto other = std::make_shared<CountingSource>(11);
  DataLoader d(other, cfg(2, 1));
  CHECK(contains(error_of([&] { d.seek(p); }), "n=11"));
  CHECK(contains(error_of([&] { a.seek({-1, p.order}); }), "negative"));
  // the refused seeks changed nothing
  CHECK(b.position().next == 0);
}

TEST_CASE("records that disagree on fields, dtypes or shapes are refused clearly") {
  {
    DataLoader l(std::make_shared<RaggedSource>(2, false), cfg(4, 0, false, 2));
    const std::string msg = error_of([&] { l.next(); });
    CHECK(contains(msg, "field 'x' of record 2 is i32 [2]"));
    CHECK(contains(msg, "record 0 of the same batch has i32 [1]"));
    // the failed batch is retried, not skipped
    CHECK(l.position().next == 0);
    CHECK_THROWS_AS(l.next(), UsageError);
  }
  {
    DataLoader l(std::make_shared<RaggedSource>(1, true), cfg(4, 0, false, 0));
    const std::string msg = error_of([&] { l.next(); });
    CHECK(contains(msg, "record 1 has fields {y}"));
    CHECK(contains(msg, "{x}"));
  }
}

TEST_CASE("bad loader settings are refused") {
  auto src = std::make_shared<CountingSource>(10);
  CHECK_THROWS_AS(DataLoader(src, cfg(0)), UsageError);
  CHECK_THROWS_AS(DataLoader(src, cfg(2, 0, true, 1, 2, 2)), UsageError);
  CHECK_THROWS_AS(DataLoader(std::make_shared<CountingSource>(0), cfg(2)), UsageError);
}

TEST_CASE("(i) transforms get (seed, global stream index), independent of workers, ranks and resumes") {
  auto src = std::make_shared<CountingSource>(9);
  // stores the position and a Philox draw keyed by it
  RecordTransform tag = [](Record& r, uint64_t seed, uint64_t position) {
    r["g"] = HostArray::scalar_i32(int32_t(position));
    r["s"] = HostArray::scalar_i32(int32_t(seed));
    HostArray noise = HostArray::make(DType::f32, {});
    noise.as<float>()[0] = philox::uniform(seed, 1234, position);
    r["noise"] = std::move(noise);
  };
  const int64_t B = 2;
  std::vector<HostBatch> ref;
  {
    DataLoader l(src, cfg(B, 42, true, 1, 1, 3), {tag});
    for (int64_t k = 0; k < 7; ++k) {
      const HostBatch b = l.next();
      const HostArray& g = b.at("g");
      for (int64_t j = 0; j < B; ++j) CHECK(g.as<int32_t>()[j] == k * 3 * B + 1 * B + j);
      CHECK(b.at("s").as<int32_t>()[0] == 42);
      ref.push_back(b);
    }
  }
  for (int workers : {0, 3}) {
    DataLoader l(src, cfg(B, 42, true, workers, 1, 3), {tag});
    for (int64_t k = 0; k < 7; ++k) CHECK(same_batch(l.next(), ref[size_t(k)]));
  }
  // after a resume the same records get the same randomness
  DataLoader l(src, cfg(B, 42, true, 2, 1, 3), {tag});
  l.seek({3 * 3 * B, l.position().order});
  for (int64_t k = 3; k < 7; ++k) CHECK(same_batch(l.next(), ref[size_t(k)]));
  // a failing transform surfaces from next()
  DataLoader bad(src, cfg(B, 42, true, 2),
                 {[](Record&, uint64_t, uint64_t p) { DEW_USAGE_CHECK(p < 3, "transform refuses position ", p); }});
  bad.next();
  CHECK(contains(error_of([&] { bad.next(); }), "transform refuses position 3"));
}

TEST_CASE("a loader with work in flight shuts down cleanly") {
  auto src = std::make_shared<CountingSource>(1000);
  for (int i = 0; i < 20; ++i) {
    DataLoader l(src, cfg(16, uint64_t(i), true, 4, 0, 1, 8));
    if (i % 2) l.next();
  }
  // a loader that is never read assembles nothing
  auto quiet = std::make_shared<CountingSource>(10);
  { DataLoader l(quiet, cfg(2, 0, true, 3)); }
  CHECK(quiet->reads == 0);
}

// ------------------------------------------------------------------------------------------------ make_loader

TEST_CASE("make_loader reads the loader's keys and passes the rest to the source") {
  load_plugin("synthetic", DEW_SYNTHETIC_PLUGIN_PATH);
  Config c = Config::parse_ini(
      "[data]\nsource = synthetic\nbatch_size = 4\nworkers = 2\nsize = 40\nkind = tokens\nseq_len = 5\n");
  auto train = make_loader(c.section("data"), "train", 99);
  CHECK(train->config().batch_size == 4);
  CHECK(train->config().workers == 2);
  CHECK(train->config().prefetch == 2);
  CHECK(train->config().shuffle);
  CHECK(train->config().seed == 99);
  CHECK(train->source().size() == 40);
  CHECK(contains(train->source().identity(), "split=train"));
  const HostBatch b = train->next();
  CHECK(b.at("text").shape == Shape{4, 6});
  auto val = make_loader(c.section("data"), "val", 99, 1, 2);
  CHECK_FALSE(val->config().shuffle);
  CHECK(val->config().rank == 1);
  CHECK(val->config().world == 2);
  CHECK(contains(val->source().identity(), "split=val"));
  CHECK_NOTHROW(c.check_all_used());

  Config s = Config::parse_ini("[data]\nsource = synthetic\nbatch_size = 2\nseed = 5\nshuffle = false\nprefetch = 0\n");
  auto l = make_loader(s.section("data"), "train", 99);
  CHECK(l->config().seed == 5);
  CHECK_FALSE(l->config().shuffle);
  CHECK(l->config().prefetch == 0);
}

TEST_CASE("make_loader refuses missing, bad and unknown keys") {
  load_plugin("synthetic", DEW_SYNTHETIC_PLUGIN_PATH);
  auto refuse = [](const std::string& ini) {
    Config c = Config::parse_ini(ini);
    return error_of([&] { make_loader(c.section("data"), "train", 0); });
  };
  CHECK(contains(refuse("[data]\nbatch_size = 2\n"), "'data.source'"));
  CHECK(contains(refuse("[data]\nsource = synthetic\n"), "'data.batch_size'"));
  CHECK(contains(refuse("[data]\nsource = synthetic\nbatch_size = 0\n"), "'data.batch_size' must be positive"));
  CHECK(contains(refuse("[data]\nsource = synthetic\nbatch_size = x\n"), "must be an integer"));
  CHECK(contains(refuse("[data]\nsource = synthetic\nbatch_size = 2\nworkers = -1\n"), "'data.workers'"));
  CHECK(contains(refuse("[data]\nsource = synthetic\nbatch_size = 2\nsiz = 3\n"), "unknown option 'data.siz'"));
  CHECK(contains(refuse("[data]\nsource = synthetic\nbatch_size = 2\nsplit = val\n"), "'data.split'"));
  CHECK(contains(refuse("[data]\nsource = synthetic\nbatch_size = 2\nkind = pictures\n"), "'data.kind'"));
  // a key of the other kind is not read, so it is refused
  CHECK(contains(refuse("[data]\nsource = synthetic\nbatch_size = 2\nseq_len = 3\n"), "'data.seq_len'"));
  CHECK(contains(refuse("[data]\nsource = nonesuch\nbatch_size = 2\n"), "nonesuch"));
}

// ------------------------------------------------------------------------------------------------ synthetic

TEST_CASE("(h) synthetic records are deterministic in (seed, index) and learnable") {
  auto a = synthetic({{"size", "64"}}), b = synthetic({{"size", "64"}}), c = synthetic({{"size", "64"}, {"seed", "1"}});
  auto v = synthetic({{"size", "64"}, {"split", "val"}});
  CHECK(a->size() == 64);
  CHECK(a->identity() == b->identity());
  CHECK(a->identity() != c->identity());
  int differ_seed = 0, differ_split = 0;
  std::set<int32_t> labels;
  for (int64_t i = 0; i < 64; ++i) {
    const Record r = a->get(i);
    CHECK(same_batch(r, b->get(i)));
    differ_seed += !same_batch(r, c->get(i));
    differ_split += !same_batch(r, v->get(i));
    const HostArray& im = r.at("image");
    REQUIRE(im.dtype == DType::u8);
    REQUIRE(im.shape == Shape{8, 8, 1});
    const int32_t label = r.at("label").as<int32_t>()[0];
    CHECK(r.at("label").shape.empty());
    REQUIRE((label >= 0 && label < 4));
    labels.insert(label);
    // the label's quadrant is the bright one
    double mean[4] = {0, 0, 0, 0};
    for (int y = 0; y < 8; ++y)
      for (int x = 0; x < 8; ++x) mean[(y / 4) * 2 + x / 4] += im.as<uint8_t>()[y * 8 + x] / 16.0;
    for (int q = 0; q < 4; ++q) CHECK((q == label ? mean[q] >= 160 : mean[q] < 96));
  }
  CHECK(differ_seed == 64);
  CHECK(differ_split == 64);
  CHECK(labels.size() == 4);

  auto t = synthetic({{"kind", "tokens"}, {"seq_len", "32"}, {"vocab", "50"}, {"size", "10"}});
  const Record r = t->get(3);
  REQUIRE(r.at("text").shape == Shape{33});
  int follows = 0;
  const int32_t* ids = r.at("text").as<int32_t>();
  for (int i = 0; i < 33; ++i) CHECK((ids[i] >= 0 && ids[i] < 50));
  for (int i = 1; i < 33; ++i) follows += ids[i] == (ids[i - 1] + 1) % 50;
  CHECK(follows >= 20);
  CHECK(same_batch(r, synthetic({{"kind", "tokens"}, {"seq_len", "32"}, {"vocab", "50"}, {"size", "10"}})->get(3)));
  auto colour = synthetic({{"image_size", "12"}, {"channels", "3"}, {"num_classes", "10"}});
  CHECK(colour->get(0).at("image").shape == Shape{12, 12, 3});
}

// ------------------------------------------------------------------------------------------------ idx

TEST_CASE("(g) idx reads the real Fashion-MNIST") {
  if (!have_fashion()) {
    MESSAGE("skipped: ", kFashion, " is absent (install dataset-fashion-mnist)");
    return;
  }
  auto train = idx(kFashion, "train");
  CHECK(train->size() == 60000);
  CHECK(train->identity() == std::string("idx:") + kFashion + "/train-images-idx3-ubyte.gz,train-labels-idx1-ubyte.gz");
  const Record r = train->get(0);
  CHECK(r.at("image").dtype == DType::u8);
  CHECK(r.at("image").shape == Shape{28, 28, 1});
  CHECK(r.at("label").dtype == DType::i32);
  CHECK(r.at("label").as<int32_t>()[0] == 9);  // ankle boot
  int64_t sum = 0;
  for (unsigned char p : r.at("image").bytes) sum += p;
  CHECK(sum == 76247);  // the pixel sum of the first training image (checked with Python's gzip)
  CHECK(train->get(1).at("label").as<int32_t>()[0] == 0);
  CHECK(train->get(3).at("label").as<int32_t>()[0] == 3);
  auto test = idx(kFashion, "test");
  CHECK(test->size() == 10000);
  CHECK(test->get(0).at("label").as<int32_t>()[0] == 9);
  CHECK(test->get(1).at("label").as<int32_t>()[0] == 2);
  CHECK(idx(kFashion, "val")->size() == 10000);
  // through the loader: labels cover all ten classes in one shuffled batch of 256
  DataLoader l(train, cfg(256, 0, true, 2));
  const HostBatch b = l.next();
  CHECK(b.at("image").shape == Shape{256, 28, 28, 1});
  std::set<int32_t> classes(b.at("label").as<int32_t>(), b.at("label").as<int32_t>() + 256);
  CHECK(classes.size() == 10);
}

TEST_CASE("(g) idx refuses truncated, corrupt, inconsistent and missing files") {
  TempDir dir;
  if (have_fashion()) {
    // the first 1000 bytes of the decompressed training images, with the real labels
    const auto images = gunzip(fs::path(kFashion) / "train-images-idx3-ubyte.gz");
    const auto labels = gunzip(fs::path(kFashion) / "train-labels-idx1-ubyte.gz");
    write_file(dir.path / "train-images-idx3-ubyte", images, 1000);
    write_file(dir.path / "train-labels-idx1-ubyte", labels);
    const std::string msg = error_of([&] { idx(dir.path.string()); });
    CHECK(contains(msg, "train-images-idx3-ubyte"));
    CHECK(contains(msg, "truncated: header says 60000 images of 28x28, file holds 1000 bytes"));
    // a truncated gzip stream reads as a short file
    TempDir gz;
    std::ifstream in(fs::path(kFashion) / "train-images-idx3-ubyte.gz", std::ios::binary);
    std::vector<unsigned char> head(200000);
    in.read(reinterpret_cast<char*>(head.data()), std::streamsize(head.size()));
    write_file(gz.path / "train-images-idx3-ubyte.gz", head);
    write_file(gz.path / "train-labels-idx1-ubyte", labels);
    const std::string gzmsg = error_of([&] { idx(gz.path.string()); });
    CHECK(contains(gzmsg, "train-images-idx3-ubyte.gz"));
    CHECK(contains(gzmsg, "truncated: header says 60000 images of 28x28"));
  } else {
    MESSAGE("the truncated real-file case is skipped: ", kFashion, " is absent");
  }

  // a small valid raw pair reads back
  write_small_idx(dir.path, "t10k", 3, 2, 4);
  auto small = idx(dir.path.string(), "val");
  CHECK(small->size() == 3);
  const Record r = small->get(2);
  CHECK(r.at("image").shape == Shape{2, 4, 1});
  CHECK(r.at("image").bytes == std::vector<unsigned char>{2, 3, 4, 5, 3, 4, 5, 6});
  CHECK(r.at("label").as<int32_t>()[0] == 2);
  CHECK(contains(small->identity(), "t10k-images-idx3-ubyte,t10k-labels-idx1-ubyte"));

  // bad magic
  {
    TempDir bad;
    write_small_idx(bad.path, "train", 3, 2, 2);
    std::fstream f(bad.path / "train-images-idx3-ubyte", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(3), f.put(char(0x01));
    f.close();
    const std::string msg = error_of([&] { idx(bad.path.string()); });
    CHECK(contains(msg, "train-images-idx3-ubyte"));
    CHECK(contains(msg, "magic number 0x00000801"));
    TempDir bad2;
    write_small_idx(bad2.path, "train", 3, 2, 2);
    std::fstream g(bad2.path / "train-labels-idx1-ubyte", std::ios::in | std::ios::out | std::ios::binary);
    g.seekp(2), g.put(char(0x09));
    g.close();
    CHECK(contains(error_of([&] { idx(bad2.path.string()); }), "train-labels-idx1-ubyte' is not an IDX label file"));
  }
  // counts that disagree; a file longer than its header; a truncated label file
  {
    TempDir d1, d2, d3;
    write_small_idx(d1.path, "train", 3, 2, 2, 2);
    CHECK(contains(error_of([&] { idx(d1.path.string()); }), "holds 3 images but"));
    write_small_idx(d2.path, "train", 3, 2, 2);
    { std::ofstream(d2.path / "train-images-idx3-ubyte", std::ios::app | std::ios::binary) << "xx"; }
    CHECK(contains(error_of([&] { idx(d2.path.string()); }), "longer than its header says"));
    write_small_idx(d3.path, "train", 3, 2, 2);
    fs::resize_file(d3.path / "train-labels-idx1-ubyte", 9);
    CHECK(contains(error_of([&] { idx(d3.path.string()); }), "truncated: header says 3 labels, file holds 9 bytes"));
  }
  // missing folder, missing file, bad split
  {
    const std::string nowhere = (dir.path / "nowhere").string();
    load_plugin("idx", DEW_IDX_PLUGIN_PATH);
    try {
      idx(nowhere);
      FAIL("a missing folder was accepted");
    } catch (const UsageError& e) {
      CHECK(contains(e.what(), nowhere));
      CHECK(contains(e.hint(), "dataset-fashion-mnist"));
    }
    TempDir only_test;
    write_small_idx(only_test.path, "t10k", 2, 2, 2);
    const std::string msg = error_of([&] { idx(only_test.path.string(), "train"); });
    CHECK(contains(msg, "train-images-idx3-ubyte.gz"));
    CHECK(contains(error_of([&] { idx(only_test.path.string(), "dev"); }), "'data.split' must be train, val or test"));
  }
}

#ifdef DEW_REF_PLUGIN_PATH
#include <dew/backend.hpp>
TEST_CASE("to_device moves every field with its dtype and shape") {
  if (!Registry::global().contains(Backend::kind, "ref")) Registry::global().load(DEW_REF_PLUGIN_PATH);
  auto backend = create_backend("ref");
  DataLoader l(synthetic({{"size", "8"}}), cfg(4, 0, false, 0));
  const HostBatch b = l.next();
  const auto t = to_device(b, backend);
  REQUIRE(t.size() == 2);
  CHECK(t.at("image").dtype() == DType::u8);
  CHECK(t.at("image").shape() == Shape{4, 8, 8, 1});
  std::vector<unsigned char> back(b.at("image").bytes.size());
  t.at("image").copy_to_host(back.data());
  CHECK(back == b.at("image").bytes);
  CHECK(t.at("label").dtype() == DType::i32);
  CHECK(t.at("label").to_ints() == std::vector<int32_t>(b.at("label").as<int32_t>(), b.at("label").as<int32_t>() + 4));
}
#endif
