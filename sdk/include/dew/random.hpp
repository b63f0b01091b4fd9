// dew/random.hpp — Philox 4x32-10 counter-based random numbers, shared by every backend.
//
// A (seed, stream, index) triple names one number; nothing depends on threads, devices or call order.
// Layout (the contract every backend follows, so their streams agree bit for bit):
//   key     = {lo32(seed), hi32(seed)}
//   counter = {lo32(block), hi32(block), lo32(stream), hi32(stream)}
//   uniform: element g (g = offset + i) uses block g/4, word g%4:  u = (word >> 8) * 2^-24   in [0, 1)
//   normal:  element g uses block g/2, words (2*(g%2), 2*(g%2)+1): u1 = (w0 + 1) * 2^-32 in (0, 1],
//            u2 = w1 * 2^-32; z = sqrt(-2 ln u1) * cos(2 pi u2), computed in double, rounded to float.
// Philox itself follows Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11), whose
// known-answer vectors the tests check.
#pragma once
#include <array>
#include <cmath>
#include <cstdint>

namespace dew::philox {

using Counter = std::array<uint32_t, 4>;
using Key = std::array<uint32_t, 2>;

inline constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
inline constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline Counter round(const Counter& c, const Key& k) {
  const uint64_t p0 = uint64_t(kMul0) * c[0];
  const uint64_t p1 = uint64_t(kMul1) * c[2];
  return {uint32_t(p1 >> 32) ^ c[1] ^ k[0], uint32_t(p1), uint32_t(p0 >> 32) ^ c[3] ^ k[1], uint32_t(p0)};
}

// Philox4x32 with R rounds (10 is the standard).
inline Counter philox4x32(Counter c, Key k, int rounds = 10) {
  for (int r = 0; r < rounds; ++r) {
    if (r > 0) {
      k[0] += kWeyl0;
      k[1] += kWeyl1;
    }
    c = round(c, k);
  }
  return c;
}

inline Counter block(uint64_t seed, uint64_t stream, uint64_t block_index) {
  return philox4x32({uint32_t(block_index), uint32_t(block_index >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                    {uint32_t(seed), uint32_t(seed >> 32)});
}

inline float uniform(uint64_t seed, uint64_t stream, uint64_t g) {
  const Counter c = block(seed, stream, g >> 2);
  return float(c[g & 3] >> 8) * (1.0f / 16777216.0f);
}

inline float normal(uint64_t seed, uint64_t stream, uint64_t g) {
  const Counter c = block(seed, stream, g >> 1);
  const int w = int(g & 1) * 2;
  const double u1 = (double(c[w]) + 1.0) * (1.0 / 4294967296.0);
  const double u2 = double(c[w + 1]) * (1.0 / 4294967296.0);
  return float(std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2));
}

// A stable 64-bit stream id for a name (FNV-1a), so parameter init does not depend on creation order.
inline uint64_t stream_of(const char* s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (; *s; ++s) {
    h ^= uint8_t(*s);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace dew::philox
