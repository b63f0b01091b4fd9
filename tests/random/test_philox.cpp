// tests/random/test_philox.cpp — Philox4x32-10 (dew/random.hpp) and the backends' random kernels.
//
//  * known-answer vectors of Philox4x32 with 10 rounds, from the Random123 distribution (kat_vectors);
//  * the draw layout of dew/random.hpp (uniform: block g/4 word g%4; normal: block g/2 words 2(g%2), +1);
//  * statistics of 1e5 uniform / normal draws (mean, std, range, 1-sigma mass) within tight bounds;
//  * "the same numbers on every backend": Tensor::uniform / normal and Backend::random with the same
//    (seed, stream, offset) are bit-identical (memcmp) on ref and cpu, and equal to the host functions
//    of dew/random.hpp for the unit distributions. A backend whose plugin is not built is skipped with a
//    message (ref is always required).
// Run: build/bin/test_philox (plugins are found next to the executable, or via DEW_PLUGIN_PATH).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "dew/backend.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"
#include "dew/tensor.hpp"

using namespace dew;

namespace {

// Loads dew_ref.so / dew_cpu.so from the default plugin folders (once) and returns the backends found.
std::vector<BackendPtr> backends() {
  static std::vector<BackendPtr> found = [] {
    auto& reg = Registry::global();
    for (const char* name : {"ref", "cpu"}) {
      if (reg.contains(Backend::kind, name)) continue;
      for (const std::string& dir : Registry::default_plugin_dirs()) {
        const std::filesystem::path f = std::filesystem::path(dir) / (std::string("dew_") + name + ".so");
        std::error_code ec;
        if (std::filesystem::exists(f, ec)) {
          reg.load(f.string());
          break;
        }
      }
    }
    std::vector<BackendPtr> bs;
    for (const char* name : {"ref", "cpu"}) {
      if (!reg.contains(Backend::kind, name)) {
        MESSAGE("backend '" << name << "' is not built; its random-number checks are skipped");
        continue;
      }
      const auto& c = reg.find(Backend::kind, name);
      if (c.probe && !c.probe().ok) {
        MESSAGE("backend '" << name << "' cannot run here: " << c.probe().reason);
        continue;
      }
      bs.push_back(create_backend(name));
    }
    return bs;
  }();
  return found;
}

std::vector<float> host_floats(const Tensor& t) {
  REQUIRE(t.dtype() == DType::f32);
  std::vector<float> v(size_t(t.numel()));
  t.copy_to_host(v.data());
  return v;
}

Tensor draw(const BackendPtr& be, int64_t n, const RandomParams& p) {
  Tensor t = Tensor::empty({n}, DType::f32, be);
  be->random(t, p);
  return t;
}

}  // namespace

TEST_CASE("philox4x32-10 known-answer vectors (Random123 kat_vectors)") {
  using philox::Counter;
  using philox::Key;
  struct Kat {
    Counter ctr;
    Key key;
    Counter expect;
  };
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}},
      {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu},
       {0xffffffffu, 0xffffffffu},
       {0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}},
      {{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u},
       {0xa4093822u, 0x299f31d0u},
       {0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}},
  };
  for (const Kat& k : kats) {
    const Counter got = philox::philox4x32(k.ctr, k.key);
    CAPTURE(k.ctr[0]);
    for (int i = 0; i < 4; ++i) CHECK(got[size_t(i)] == k.expect[size_t(i)]);
  }
  // 10 rounds is the default; a different round count gives different words.
  CHECK(philox::philox4x32({0, 0, 0, 0}, {0, 0}, 7) != philox::philox4x32({0, 0, 0, 0}, {0, 0}));
}

TEST_CASE("philox draw layout follows dew/random.hpp") {
  const uint64_t seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull;
  // key = {lo32(seed), hi32(seed)}, counter = {lo32(block), hi32(block), lo32(stream), hi32(stream)}
  const uint64_t blk = (1ull << 33) + 5;
  const philox::Counter c = philox::block(seed, stream, blk);
  const philox::Counter direct =
      philox::philox4x32({uint32_t(blk), uint32_t(blk >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                         {uint32_t(seed), uint32_t(seed >> 32)});
  CHECK(c == direct);
  for (uint64_t w = 0; w < 4; ++w) {
    const uint64_t g = blk * 4 + w;
    CHECK(philox::uniform(seed, stream, g) == float(c[w] >> 8) * (1.0f / 16777216.0f));
  }
  const philox::Counter cn = philox::block(seed, stream, 77);
  for (uint64_t h = 0; h < 2; ++h) {
    const double u1 = (double(cn[2 * h]) + 1.0) / 4294967296.0, u2 = double(cn[2 * h + 1]) / 4294967296.0;
    CHECK(philox::normal(seed, stream, 154 + h) ==
          float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2)));
  }
  // Streams and seeds are independent name spaces.
  CHECK(philox::uniform(1, 0, 0) != philox::uniform(2, 0, 0));
  CHECK(philox::uniform(1, 0, 0) != philox::uniform(1, 1, 0));
  CHECK(philox::stream_of("a") != philox::stream_of("b"));
}

TEST_CASE("philox uniform and normal statistics over 1e5 draws") {
  constexpr int n = 100000;
  SUBCASE("uniform in [0, 1)") {
    double sum = 0, sumsq = 0, lo = 1, hi = 0;
    for (int i = 0; i < n; ++i) {
      const double u = philox::uniform(2024, 7, uint64_t(i));
      sum += u;
      sumsq += u * u;
      lo = std::min(lo, u);
      hi = std::max(hi, u);
    }
    CHECK(lo >= 0.0);
    CHECK(hi < 1.0);
    const double mean = sum / n, std = std::sqrt(sumsq / n - mean * mean);
    // Standard errors: mean 9.1e-4, std 4.1e-4; bounds are about 5.5 of them.
    CHECK(std::fabs(mean - 0.5) < 5e-3);
    CHECK(std::fabs(std - std::sqrt(1.0 / 12.0)) < 2.5e-3);
    CHECK(lo < 1e-3);
    CHECK(hi > 1 - 1e-3);
  }
  SUBCASE("normal(0, 1)") {
    double sum = 0, sumsq = 0, sum4 = 0;
    int within1 = 0, non_finite = 0;
    for (int i = 0; i < n; ++i) {
      const double z = philox::normal(99, 3, uint64_t(i));
      non_finite += !std::isfinite(z);
      sum += z;
      sumsq += z * z;
      sum4 += z * z * z * z;
      within1 += std::fabs(z) < 1.0;
    }
    REQUIRE(non_finite == 0);
    const double mean = sum / n, var = sumsq / n - mean * mean;
    // Standard errors: mean 3.2e-3, std 2.2e-3, kurtosis 0.015, 1-sigma mass 1.5e-3.
    CHECK(std::fabs(mean) < 0.02);
    CHECK(std::fabs(std::sqrt(var) - 1.0) < 0.012);
    CHECK(std::fabs(sum4 / n / (var * var) - 3.0) < 0.1);
    CHECK(std::fabs(double(within1) / n - 0.682689) < 0.008);
  }
  SUBCASE("through every backend: Tensor::uniform / Tensor::normal") {
    for (const BackendPtr& be : backends()) {
      CAPTURE(be->name());
      const std::vector<float> u = host_floats(Tensor::uniform({n}, -1.0f, 3.0f, 5, 11, be));
      const std::vector<float> z = host_floats(Tensor::normal({n}, 2.0f, 0.5f, 5, 12, be));
      double su = 0, suu = 0, sz = 0, szz = 0;
      int out_of_range = 0;
      for (int i = 0; i < n; ++i) {
        out_of_range += !(u[size_t(i)] >= -1.0f && u[size_t(i)] < 3.0f);
        su += u[size_t(i)];
        suu += double(u[size_t(i)]) * u[size_t(i)];
        sz += z[size_t(i)];
        szz += double(z[size_t(i)]) * z[size_t(i)];
      }
      CHECK(out_of_range == 0);
      const double mu = su / n, mz = sz / n;
      CHECK(std::fabs(mu - 1.0) < 0.02);
      CHECK(std::fabs(std::sqrt(suu / n - mu * mu) - 4.0 * std::sqrt(1.0 / 12.0)) < 0.01);
      CHECK(std::fabs(mz - 2.0) < 0.01);
      CHECK(std::fabs(std::sqrt(szz / n - mz * mz) - 0.5) < 0.006);
    }
  }
}

TEST_CASE("the same numbers on every backend") {
  const std::vector<BackendPtr> bs = backends();
  REQUIRE_MESSAGE(!bs.empty(), "the ref backend plugin (dew_ref.so) was not found next to the test");
  REQUIRE(bs[0]->name() == "ref");
  std::string names;
  for (const BackendPtr& be : bs) names += " " + be->name();
  MESSAGE("comparing the random streams of:" << names);

  SUBCASE("unit distributions equal the host functions of dew/random.hpp") {
    constexpr int64_t n = 4099;
    for (const BackendPtr& be : bs) {
      CAPTURE(be->name());
      const std::vector<float> u = host_floats(Tensor::uniform({n}, 0.0f, 1.0f, 17, 4, be));
      const std::vector<float> z = host_floats(Tensor::normal({n}, 0.0f, 1.0f, 17, 5, be));
      int64_t bad_u = 0, bad_z = 0;
      for (int64_t i = 0; i < n; ++i) {
        const float hu = philox::uniform(17, 4, uint64_t(i)), hz = philox::normal(17, 5, uint64_t(i));
        bad_u += std::memcmp(&hu, &u[size_t(i)], 4) != 0;
        bad_z += std::memcmp(&hz, &z[size_t(i)], 4) != 0;
      }
      CHECK(bad_u == 0);
      CHECK(bad_z == 0);
    }
  }

  SUBCASE("Tensor::uniform / normal with any range are bit-identical across backends") {
    struct Draw {
      bool normal;
      float a, b;
      uint64_t seed, stream;
      int64_t n;
    };
    const Draw draws[] = {{false, -2.0f, 3.0f, 1234, 0, 1031},
                          {false, 0.0f, 1.0f, (1ull << 40) + 3, 9, 64},
                          {true, 0.0f, 0.02f, 0xdeadbeefull, 77, 1031},
                          {true, 1.0f, 2.0f, 5, 1ull << 36, 513},
                          {false, -0.1f, 0.1f, 42, philox::stream_of("model.layers.0.mlp.up_proj.weight"), 3333}};
    for (const Draw& d : draws) {
      std::vector<float> first;
      for (const BackendPtr& be : bs) {
        CAPTURE(be->name());
        CAPTURE(d.seed);
        const Tensor t = d.normal ? Tensor::normal({d.n}, d.a, d.b, d.seed, d.stream, be)
                                  : Tensor::uniform({d.n}, d.a, d.b, d.seed, d.stream, be);
        const std::vector<float> v = host_floats(t);
        if (first.empty()) {
          first = v;
          continue;
        }
        CHECK(std::memcmp(first.data(), v.data(), v.size() * 4) == 0);
      }
    }
  }

  SUBCASE("Backend::random with a non-zero offset: bit-identical, and a shifted window of offset 0") {
    struct P {
      Distribution dist;
      uint64_t seed, stream, offset;
      float a, b;
    };
    const P ps[] = {{Distribution::uniform, 7, 3, 5, 0.0f, 1.0f},
                    {Distribution::uniform, 7, 3, (1ull << 32) + 1, -1.0f, 1.0f},
                    {Distribution::normal, 11, 2, 3, 0.0f, 1.0f},
                    {Distribution::normal, 11, 2, 1000001, 0.5f, 3.0f},
                    {Distribution::uniform, 0xfeedull << 32, 1ull << 40, (1ull << 34) + 2, 2.0f, 6.0f}};
    constexpr int64_t n = 1001;
    for (const P& q : ps) {
      CAPTURE(q.offset);
      CAPTURE(int(q.dist));
      RandomParams p{q.dist, q.seed, q.stream, q.offset, q.a, q.b};
      std::vector<float> first;
      for (const BackendPtr& be : bs) {
        CAPTURE(be->name());
        const std::vector<float> v = host_floats(draw(be, n, p));
        // Element i is draw offset + i: the same as element i + 7 of a draw starting 7 earlier.
        if (q.offset >= 7) {
          RandomParams earlier = p;
          earlier.offset = q.offset - 7;
          const std::vector<float> w = host_floats(draw(be, n + 7, earlier));
          CHECK(std::memcmp(w.data() + 7, v.data(), size_t(n) * 4) == 0);
        }
        if (q.a == 0.0f && q.b == 1.0f) {
          int64_t bad = 0;
          for (int64_t i = 0; i < n; ++i) {
            const uint64_t g = q.offset + uint64_t(i);
            const float h = q.dist == Distribution::uniform ? philox::uniform(q.seed, q.stream, g)
                                                            : philox::normal(q.seed, q.stream, g);
            bad += std::memcmp(&h, &v[size_t(i)], 4) != 0;
          }
          CHECK(bad == 0);
        }
        if (first.empty()) {
          first = v;
          continue;
        }
        CHECK(std::memcmp(first.data(), v.data(), size_t(n) * 4) == 0);
      }
    }
  }

  SUBCASE("dropout masks are bit-identical across backends and follow uniform(offset + i) >= p") {
    const DropoutParams p{0.3f, 21, 4, 17};
    constexpr int64_t n = 2053;
    std::vector<float> first;
    for (const BackendPtr& be : bs) {
      CAPTURE(be->name());
      if (!be->supports(Kernel::dropout, DType::f32).ok) continue;
      Tensor x = Tensor::uniform({n}, -1.0f, 1.0f, 1, 1, be);
      Tensor y = Tensor::empty({n}, DType::f32, be), mask = Tensor::empty({n}, DType::f32, be);
      be->dropout(x, y, mask, p);
      const std::vector<float> m = host_floats(mask);
      int64_t bad = 0;
      for (int64_t i = 0; i < n; ++i) {
        const bool kept = philox::uniform(p.seed, p.stream, p.offset + uint64_t(i)) >= p.p;
        bad += kept != (m[size_t(i)] != 0.0f);
      }
      CHECK(bad == 0);
      if (first.empty()) {
        first = m;
        continue;
      }
      CHECK(std::memcmp(first.data(), m.data(), size_t(n) * 4) == 0);
    }
  }
}
