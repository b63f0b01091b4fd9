// core/text/pretokenize.cpp — UTF-8 decoding, Unicode letter/number/space classes, GPT-2's byte <->
// unicode mapping, and GPT-2's pre-tokenizer regex, hand-written:
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// tried in that order at each position (the first alternative that matches wins; each is greedy).
// \s is the Unicode White_Space property; the optional prefix is the ASCII space only. A byte that is
// not part of valid UTF-8 is a character of its own, of class "other".
// Also Llama 3's / Qwen2's Split pattern (pretokenize_llama3, below), the same way.
#include <algorithm>

#include "dew/error.hpp"
#include "text/text_internal.hpp"

namespace dew {
namespace text {

namespace {

struct Range {
  uint32_t first, last;
  uint8_t cls;
};
constexpr Range kRanges[] = {
#include "text/unicode_classes.inc"
};

bool is_white_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

bool cont(unsigned char c) { return (c & 0xC0) == 0x80; }

}  // namespace

int utf8_decode(std::string_view s, size_t i, uint32_t* cp, bool* valid) {
  const size_t n = s.size();
  const auto b0 = static_cast<unsigned char>(s[i]);
  *valid = true;
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  auto at = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    if (i + 1 < n && cont(at(1))) {
      *cp = (uint32_t(b0 & 0x1F) << 6) | (at(1) & 0x3F);
      return 2;
    }
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    if (i + 2 < n && cont(at(1)) && cont(at(2))) {
      const unsigned char b1 = at(1);
      const bool ok = b0 == 0xE0 ? b1 >= 0xA0 : b0 == 0xED ? b1 <= 0x9F : true;
      if (ok) {
        *cp = (uint32_t(b0 & 0x0F) << 12) | (uint32_t(b1 & 0x3F) << 6) | (at(2) & 0x3F);
        return 3;
      }
    }
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    if (i + 3 < n && cont(at(1)) && cont(at(2)) && cont(at(3))) {
      const unsigned char b1 = at(1);
      const bool ok = b0 == 0xF0 ? b1 >= 0x90 : b0 == 0xF4 ? b1 <= 0x8F : true;
      if (ok) {
        *cp =
            (uint32_t(b0 & 0x07) << 18) | (uint32_t(b1 & 0x3F) << 12) | (uint32_t(at(2) & 0x3F) << 6) | (at(3) & 0x3F);
        return 4;
      }
    }
  }
  *valid = false;
  *cp = b0;
  return 1;
}

CharClass class_of(uint32_t cp) {
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return CharClass::letter;
    if (cp >= '0' && cp <= '9') return CharClass::number;
    return is_white_space(cp) ? CharClass::space : CharClass::other;
  }
  if (is_white_space(cp)) return CharClass::space;
  const Range* end = kRanges + std::size(kRanges);
  const Range* r = std::upper_bound(kRanges, end, cp, [](uint32_t c, const Range& x) { return c < x.first; });
  if (r == kRanges) return CharClass::other;
  --r;
  return cp <= r->last ? CharClass(r->cls) : CharClass::other;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

const ByteMap& ByteMap::get() {
  static const ByteMap m = [] {
    ByteMap b;
    std::array<bool, 256> printable{};
    for (int c = '!'; c <= '~'; ++c) printable[size_t(c)] = true;
    for (int c = 0xA1; c <= 0xAC; ++c) printable[size_t(c)] = true;
    for (int c = 0xAE; c <= 0xFF; ++c) printable[size_t(c)] = true;
    uint32_t next = 256;
    for (int c = 0; c < 256; ++c) b.to_cp[size_t(c)] = printable[size_t(c)] ? uint32_t(c) : next++;
    for (int c = 0; c < 256; ++c) b.to_byte[b.to_cp[size_t(c)]] = uint8_t(c);
    return b;
  }();
  return m;
}

std::string bytes_to_mapped(std::string_view bytes) {
  const ByteMap& m = ByteMap::get();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) append_utf8(out, m.to_cp[static_cast<unsigned char>(c)]);
  return out;
}

bool mapped_to_bytes(std::string_view mapped, std::string* bytes) {
  const ByteMap& m = ByteMap::get();
  bytes->clear();
  for (size_t i = 0; i < mapped.size();) {
    uint32_t cp;
    bool valid;
    i += size_t(utf8_decode(mapped, i, &cp, &valid));
    if (!valid) return false;
    auto it = m.to_byte.find(cp);
    if (it == m.to_byte.end()) return false;
    *bytes += char(it->second);
  }
  return true;
}

}  // namespace text

bool is_valid_utf8(std::string_view bytes) {
  for (size_t i = 0; i < bytes.size();) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      ++i;
      continue;
    }
    uint32_t cp;
    bool valid;
    i += size_t(text::utf8_decode(bytes, i, &cp, &valid));
    if (!valid) return false;
  }
  return true;
}

std::vector<std::string_view> pretokenize_gpt2(std::string_view s) {
  using text::CharClass;
  DEW_CHECK(s.size() < (size_t(1) << 32), "pretokenize_gpt2: a text of ", s.size(),
            " bytes is too long (4 GiB at most)");
  // Decode once: byte offset and class of every character (offsets[n] = s.size()).
  std::vector<uint32_t> off;
  std::vector<CharClass> cls;
  off.reserve(s.size() + 1);
  cls.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    bool valid;
    const int len = text::utf8_decode(s, i, &cp, &valid);
    off.push_back(uint32_t(i));
    cls.push_back(valid ? text::class_of(cp) : CharClass::other);
    i += size_t(len);
  }
  const size_t n = cls.size();
  off.push_back(uint32_t(s.size()));

  std::vector<std::string_view> out;
  out.reserve(n / 4 + 1);
  auto emit = [&](size_t a, size_t b) { out.push_back(s.substr(off[a], off[b] - off[a])); };
  auto byte_at = [&](size_t k) { return s[off[k]]; };
  size_t k = 0;
  while (k < n) {
    // 's|'t|'re|'ve|'m|'ll|'d
    if (byte_at(k) == '\'' && k + 1 < n) {
      const char c1 = byte_at(k + 1);
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        emit(k, k + 2);
        k += 2;
        continue;
      }
      if (k + 2 < n) {
        const char c2 = byte_at(k + 2);
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) {
          emit(k, k + 3);
          k += 3;
          continue;
        }
      }
    }
    // ' ?\p{L}+' | ' ?\p{N}+' | ' ?[^\s\p{L}\p{N}]+'
    size_t j = k;
    if (byte_at(k) == ' ' && k + 1 < n && cls[k + 1] != CharClass::space) j = k + 1;
    if (cls[j] != CharClass::space) {
      const CharClass c = cls[j];
      while (j < n && cls[j] == c) ++j;
      emit(k, j);
      k = j;
      continue;
    }
    // '\s+(?!\S)' | '\s+'
    j = k;
    while (j < n && cls[j] == CharClass::space) ++j;
    if (j < n && j - 1 > k) j -= 1;  // leave the last space to prefix the next word
    emit(k, j);
    k = j;
  }
  return out;
}

// Llama 3 (max_digits 3) and Qwen2 (max_digits 1):
//   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//   \s*[\r\n]+|\s+(?!\S)|\s+
// tried in that order at each position, as the regex engine does (leftmost alternative, greedy with
// backtracking): every character is matched by some alternative, so the pieces cover the text.
std::vector<std::string_view> pretokenize_llama3(std::string_view s, int max_digits) {
  using text::CharClass;
  DEW_CHECK(max_digits >= 1, "pretokenize_llama3: max_digits must be >= 1, got ", max_digits);
  DEW_CHECK(s.size() < (size_t(1) << 32), "pretokenize_llama3: a text of ", s.size(),
            " bytes is too long (4 GiB at most)");
  std::vector<uint32_t> off, cps;
  std::vector<CharClass> cls;
  off.reserve(s.size() + 1);
  cls.reserve(s.size());
  cps.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    uint32_t cp;
    bool valid;
    const int len = text::utf8_decode(s, i, &cp, &valid);
    off.push_back(uint32_t(i));
    cls.push_back(valid ? text::class_of(cp) : CharClass::other);
    cps.push_back(valid ? cp : 0xFFFFFFFFu);
    i += size_t(len);
  }
  const size_t n = cls.size();
  off.push_back(uint32_t(s.size()));
  auto crlf = [&](size_t k) { return cps[k] == '\r' || cps[k] == '\n'; };
  // (?i:...): the letters, case-folded (U+017F LATIN SMALL LETTER LONG S folds to 's').
  auto is = [&](size_t k, char lower) {
    const uint32_t c = cps[k];
    return c == uint32_t(lower) || c == uint32_t(lower - 'a' + 'A') || (lower == 's' && c == 0x17F);
  };

  std::vector<std::string_view> out;
  out.reserve(n / 4 + 1);
  auto emit = [&](size_t a, size_t b) { out.push_back(s.substr(off[a], off[b] - off[a])); };
  size_t k = 0;
  while (k < n) {
    // (?i:'s|'t|'re|'ve|'m|'ll|'d)
    if (cps[k] == '\'' && k + 1 < n) {
      if (is(k + 1, 's') || is(k + 1, 't') || is(k + 1, 'm') || is(k + 1, 'd')) {
        emit(k, k + 2);
        k += 2;
        continue;
      }
      if (k + 2 < n && ((is(k + 1, 'r') && is(k + 2, 'e')) || (is(k + 1, 'v') && is(k + 2, 'e')) ||
                        (is(k + 1, 'l') && is(k + 2, 'l')))) {
        emit(k, k + 3);
        k += 3;
        continue;
      }
    }
    // [^\r\n\p{L}\p{N}]?\p{L}+
    size_t j = k;
    if (cls[k] != CharClass::letter && cls[k] != CharClass::number && !crlf(k) && k + 1 < n &&
        cls[k + 1] == CharClass::letter)
      j = k + 1;
    if (cls[j] == CharClass::letter) {
      while (j < n && cls[j] == CharClass::letter) ++j;
      emit(k, j);
      k = j;
      continue;
    }
    // \p{N}{1,max_digits}
    if (cls[k] == CharClass::number) {
      j = k;
      while (j < n && j - k < size_t(max_digits) && cls[j] == CharClass::number) ++j;
      emit(k, j);
      k = j;
      continue;
    }
    // ' ?[^\s\p{L}\p{N}]+[\r\n]*'
    j = k;
    if (cps[k] == ' ' && k + 1 < n && cls[k + 1] == CharClass::other) j = k + 1;
    if (cls[j] == CharClass::other) {
      while (j < n && cls[j] == CharClass::other) ++j;
      while (j < n && crlf(j)) ++j;
      emit(k, j);
      k = j;
      continue;
    }
    // Here cls[k] is space. '\s*[\r\n]+': up to the last CR/LF of the run of white space.
    size_t run = k;
    while (run < n && cls[run] == CharClass::space) ++run;
    size_t last = run;
    for (size_t q = k; q < run; ++q)
      if (crlf(q)) last = q;
    if (last < run) {
      emit(k, last + 1);
      k = last + 1;
      continue;
    }
    // '\s+(?!\S)' | '\s+'
    j = run;
    if (j < n && j - 1 > k) j -= 1;  // leave the last space to prefix the next word
    emit(k, j);
    k = j;
  }
  return out;
}

}  // namespace dew
