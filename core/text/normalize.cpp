// core/text/normalize.cpp — Unicode NFC (canonical decomposition, canonical ordering, canonical
// composition; UAX #15), for tokenizers whose tokenizer.json has an NFC normalizer (Qwen2/Qwen3).
// Tables: unicode_nfc.inc (gen_unicode_nfc.py, Unicode 14, the version of the letter/number classes);
// Hangul syllables are computed. Invariants: text without a code point NFC may change (ASCII, most
// text) is returned as is, fast; a byte that is not part of valid UTF-8 stays in place, unchanged,
// and blocks nothing (a starter that composes with nothing).
#include <algorithm>
#include <array>

#include "dew/tokenizer.hpp"
#include "text/text_internal.hpp"

namespace dew {

namespace {

struct Ccc {
  uint32_t first, last;
  uint8_t ccc;
};
struct Triple {
  uint32_t a, b, c;
};
constexpr Ccc kCcc[] = {
#define DEW_NFC_CCC
#include "text/unicode_nfc.inc"
#undef DEW_NFC_CCC
};
constexpr Triple kDecomp[] = {
#define DEW_NFC_DECOMP
#include "text/unicode_nfc.inc"
#undef DEW_NFC_DECOMP
};
constexpr Triple kCompose[] = {
#define DEW_NFC_COMPOSE
#include "text/unicode_nfc.inc"
#undef DEW_NFC_COMPOSE
};
constexpr Ccc kMaybe[] = {
#define DEW_NFC_MAYBE
#include "text/unicode_nfc.inc"
#undef DEW_NFC_MAYBE
};

constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kNCount = kVCount * kTCount, kSCount = kLCount * kNCount;
constexpr uint32_t kInvalid = 0x80000000u;  // | byte: a byte that is not valid UTF-8

template <size_t N>
const Ccc* find_range(const Ccc (&t)[N], uint32_t cp) {
  const Ccc* end = t + N;
  const Ccc* r = std::upper_bound(t, end, cp, [](uint32_t c, const Ccc& x) { return c < x.first; });
  if (r == t) return nullptr;
  --r;
  return cp <= r->last ? r : nullptr;
}

uint8_t ccc_of(uint32_t cp) {
  if (cp < 0x300 || (cp & kInvalid)) return 0;
  const Ccc* r = find_range(kCcc, cp);
  return r ? r->ccc : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>& out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    const uint32_t s = cp - kSBase;
    out.push_back(kLBase + s / kNCount);
    out.push_back(kVBase + (s % kNCount) / kTCount);
    if (s % kTCount) out.push_back(kTBase + s % kTCount);
    return;
  }
  const Triple* end = kDecomp + std::size(kDecomp);
  const Triple* d = std::lower_bound(kDecomp, end, cp, [](const Triple& x, uint32_t c) { return x.a < c; });
  if (cp < 0x80 || d == end || d->a != cp) {
    out.push_back(cp);
    return;
  }
  decompose(d->b, out);
  if (d->c) decompose(d->c, out);
}

uint32_t compose(uint32_t a, uint32_t b) {
  if (a >= kLBase && a < kLBase + kLCount && b >= kVBase && b < kVBase + kVCount)
    return kSBase + ((a - kLBase) * kVCount + (b - kVBase)) * kTCount;
  if (a >= kSBase && a < kSBase + kSCount && (a - kSBase) % kTCount == 0 && b > kTBase && b < kTBase + kTCount)
    return a + (b - kTBase);
  const Triple* end = kCompose + std::size(kCompose);
  const Triple* c = std::lower_bound(
      kCompose, end, std::make_pair(a, b),
      [](const Triple& x, std::pair<uint32_t, uint32_t> k) { return x.a != k.first ? x.a < k.first : x.b < k.second; });
  return c != end && c->a == a && c->b == b ? c->c : 0;
}

}  // namespace

std::string normalize_nfc(std::string_view s) {
  // Quick check: nothing NFC may change -> the text is NFC.
  bool quick = true;
  for (size_t i = 0; i < s.size() && quick;) {
    if (static_cast<unsigned char>(s[i]) < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp;
    bool valid;
    i += size_t(text::utf8_decode(s, i, &cp, &valid));
    if (valid && find_range(kMaybe, cp)) quick = false;
  }
  if (quick) return std::string(s);

  std::vector<uint32_t> d;
  d.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    bool valid;
    const int len = text::utf8_decode(s, i, &cp, &valid);
    if (valid)
      decompose(cp, d);
    else
      d.push_back(kInvalid | static_cast<unsigned char>(s[i]));
    i += size_t(len);
  }
  // Canonical ordering: each run of non-starters stably sorted by combining class.
  for (size_t i = 0; i < d.size();) {
    if (ccc_of(d[i]) == 0) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < d.size() && ccc_of(d[j]) != 0) ++j;
    std::stable_sort(d.begin() + std::ptrdiff_t(i), d.begin() + std::ptrdiff_t(j),
                     [](uint32_t x, uint32_t y) { return ccc_of(x) < ccc_of(y); });
    i = j;
  }
  // Canonical composition: a character composes with the last starter unless blocked.
  std::vector<uint32_t> r;
  r.reserve(d.size());
  size_t starter = 0;
  bool have_starter = false;
  int last_class = -1;  // of the last character appended; -1: none yet
  for (uint32_t c : d) {
    const int cls = ccc_of(c);
    if (have_starter && !(c & kInvalid) && !(r[starter] & kInvalid) &&
        (last_class == 0 ? r.size() - 1 == starter : last_class < cls)) {
      if (const uint32_t k = compose(r[starter], c)) {
        r[starter] = k;
        continue;
      }
    }
    if (cls == 0) {
      starter = r.size();
      have_starter = true;
    }
    last_class = cls;
    r.push_back(c);
  }
  std::string out;
  out.reserve(s.size());
  for (uint32_t c : r) {
    if (c & kInvalid)
      out += char(c & 0xFF);
    else
      text::append_utf8(out, c);
  }
  return out;
}

}  // namespace dew
