// core/text/chat_template.cpp — the Jinja subset of chat templates (dew/chat_template.hpp): lexer,
// parser, and a tree-walking renderer with Python's value semantics.
//
// Lexing follows jinja2 3.1's lexer with trim_blocks and lstrip_blocks on (what transformers uses):
// newlines are normalised to "\n" and one trailing newline of the source is dropped; "{%-"/"-%}" strip
// every whitespace beside the tag, "%}" eats one following "\n", and a block or comment tag that is
// the first non-blank of its line loses the blanks before it (unless "{%+"). Scoping follows jinja2:
// every iteration of a for loop and every macro call is a new scope whose writes do not leak out
// ({% set %} in an {% if %} writes the enclosing scope); namespace() objects are shared by reference.
// Unsupported syntax is refused at parse time naming the template line; errors while rendering name
// the line of the node that failed.
#include "dew/chat_template.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <ctime>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "dew/error.hpp"

namespace dew {
namespace jinja {

// ---------------------------------------------------------------- values

struct Value;
using List = std::vector<Value>;
struct Dict;
struct Callable;

enum class Kind { undefined, none, boolean, integer, floating, string, list, dict, callable };

struct Value {
  Kind kind = Kind::undefined;
  bool b = false;
  bool tuple = false;  // a list printed as (a, b)
  bool ns = false;     // a namespace() object (its dict is mutable through set)
  int64_t i = 0;
  double f = 0;
  std::string s;  // string; for undefined: what was looked up (for messages)
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;
  std::shared_ptr<Callable> fn;

  static Value undefined(std::string what = {}) {
    Value v;
    v.s = std::move(what);
    return v;
  }
  static Value none() {
    Value v;
    v.kind = Kind::none;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.kind = Kind::boolean;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.kind = Kind::integer;
    v.i = x;
    return v;
  }
  static Value floating(double x) {
    Value v;
    v.kind = Kind::floating;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.kind = Kind::string;
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List items, bool tuple = false) {
    Value v;
    v.kind = Kind::list;
    v.list = std::make_shared<List>(std::move(items));
    v.tuple = tuple;
    return v;
  }
  static Value make_dict();
  bool is_undefined() const { return kind == Kind::undefined; }
  bool is_number() const { return kind == Kind::integer || kind == Kind::floating || kind == Kind::boolean; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(const std::string& k) const {
    for (const auto& kv : items)
      if (kv.first == k) return &kv.second;
    return nullptr;
  }
  void set(const std::string& k, Value v) {
    for (auto& kv : items)
      if (kv.first == k) {
        kv.second = std::move(v);
        return;
      }
    items.emplace_back(k, std::move(v));
  }
};

Value Value::make_dict() {
  Value v;
  v.kind = Kind::dict;
  v.dict = std::make_shared<Dict>();
  return v;
}

struct Args {
  std::vector<Value> positional;
  std::vector<std::pair<std::string, Value>> named;
  const Value* get(size_t pos, const char* name) const {
    for (const auto& kv : named)
      if (kv.first == name) return &kv.second;
    return pos < positional.size() ? &positional[pos] : nullptr;
  }
};

struct Renderer;
struct Callable {
  std::string name;
  std::function<Value(const Args&, Renderer&, int line)> call;
};

// A rendering error: message and template line (turned into a UsageError at the top).
struct TemplateError {
  std::string message;
  int line = 0;
};
[[noreturn]] void fail(int line, std::string message) { throw TemplateError{std::move(message), line}; }

// ---------------------------------------------------------------- UTF-8 and Python string helpers

std::vector<uint32_t> decode_utf8(std::string_view s) {
  std::vector<uint32_t> out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 1;
    if (i + size_t(n) > s.size()) n = 1;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1f) : n == 3 ? (c & 0x0f) : (c & 0x07);
    for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3f);
    out.push_back(cp);
    i += size_t(n);
  }
  return out;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

std::string encode_utf8(const std::vector<uint32_t>& cps, size_t from = 0, size_t to = std::string::npos) {
  std::string out;
  to = std::min(to, cps.size());
  for (size_t i = from; i < to; ++i) append_utf8(out, cps[i]);
  return out;
}

// Python's str.isspace() (the Unicode White_Space characters plus the ASCII separators 0x1c-0x1f).
bool py_isspace(uint32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

int64_t py_len(std::string_view s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// str.strip / lstrip / rstrip: without chars, Python whitespace; with chars, those code points.
std::string py_strip(const std::string& s, const std::optional<std::string>& chars, bool left, bool right) {
  const std::vector<uint32_t> cps = decode_utf8(s);
  std::vector<uint32_t> set;
  if (chars) set = decode_utf8(*chars);
  auto strip_it = [&](uint32_t c) { return chars ? std::find(set.begin(), set.end(), c) != set.end() : py_isspace(c); };
  size_t b = 0, e = cps.size();
  if (left)
    while (b < e && strip_it(cps[b])) ++b;
  if (right)
    while (e > b && strip_it(cps[e - 1])) --e;
  return encode_utf8(cps, b, e);
}

// Python's str.splitlines(): breaks at \n, \r, \r\n, \v, \f, \x1c-\x1e, \x85, U+2028, U+2029; no
// empty last piece after a final break.
std::vector<std::string> py_splitlines(const std::string& s) {
  std::vector<std::string> out;
  const std::vector<uint32_t> cps = decode_utf8(s);
  std::string cur;
  bool open = false;
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    if (c == '\n' || c == '\r' || c == 0x0b || c == 0x0c || (c >= 0x1c && c <= 0x1e) || c == 0x85 || c == 0x2028 ||
        c == 0x2029) {
      out.push_back(cur);
      cur.clear();
      open = false;
      if (c == '\r' && k + 1 < cps.size() && cps[k + 1] == '\n') ++k;
    } else {
      append_utf8(cur, c);
      open = true;
    }
  }
  if (open) out.push_back(cur);
  return out;
}

std::string ascii_map(std::string s, int (*f)(int)) {
  for (char& c : s)
    if (static_cast<unsigned char>(c) < 0x80) c = char(f(static_cast<unsigned char>(c)));
  return s;
}

// Python's repr(float): the shortest round-trip digits, exponent form below 1e-4 and from 1e16.
std::string py_float(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x > 0 ? "inf" : "-inf";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // d.ddde[+-]XX
  const size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  const int exp = std::atoi(sci.c_str() + epos + 1);
  const bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char e[16];
    std::snprintf(e, sizeof e, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += e;
  } else if (exp >= 0) {
    if (int(digits.size()) <= exp + 1) {
      out = digits + std::string(size_t(exp + 1) - digits.size(), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
    }
  } else {
    out = "0." + std::string(size_t(-exp - 1), '0') + digits;
  }
  return (neg ? "-" : "") + out;
}

// Python's repr(str).
std::string py_repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (uint32_t c : decode_utf8(s)) {
    if (c == uint32_t(q) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || (c >= 0x7f && c <= 0xa0) || c == 0xad) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", unsigned(c));
      out += b;
    } else if (c == 0x2028 || c == 0x2029) {
      char b[8];
      std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
      out += b;
    } else {
      append_utf8(out, c);
    }
  }
  return out + q;
}

std::string repr(const Value& v);

// Python's str(value) (what {{ }} prints).
std::string to_str(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return "";
    case Kind::none:
      return "None";
    case Kind::boolean:
      return v.b ? "True" : "False";
    case Kind::integer:
      return std::to_string(v.i);
    case Kind::floating:
      return py_float(v.f);
    case Kind::string:
      return v.s;
    default:
      return repr(v);
  }
}

std::string repr(const Value& v) {
  switch (v.kind) {
    case Kind::string:
      return py_repr_string(v.s);
    case Kind::undefined:
      return "";
    case Kind::list: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) out += (k ? ", " : "") + repr((*v.list)[k]);
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Kind::dict: {
      if (v.ns) return "<Namespace>";
      std::string out = "{";
      for (size_t k = 0; k < v.dict->items.size(); ++k)
        out += (k ? ", " : "") + py_repr_string(v.dict->items[k].first) + ": " + repr(v.dict->items[k].second);
      return out + "}";
    }
    case Kind::callable:
      return "<function " + v.fn->name + ">";
    default:
      return to_str(v);
  }
}

const char* type_name(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
      return "undefined";
    case Kind::none:
      return "NoneType";
    case Kind::boolean:
      return "bool";
    case Kind::integer:
      return "int";
    case Kind::floating:
      return "float";
    case Kind::string:
      return "str";
    case Kind::list:
      return v.tuple ? "tuple" : "list";
    case Kind::dict:
      return v.ns ? "Namespace" : "dict";
    case Kind::callable:
      return "function";
  }
  return "?";
}

bool truthy(const Value& v) {
  switch (v.kind) {
    case Kind::undefined:
    case Kind::none:
      return false;
    case Kind::boolean:
      return v.b;
    case Kind::integer:
      return v.i != 0;
    case Kind::floating:
      return v.f != 0;
    case Kind::string:
      return !v.s.empty();
    case Kind::list:
      return !v.list->empty();
    case Kind::dict:
      return v.ns || !v.dict->items.empty();
    case Kind::callable:
      return true;
  }
  return false;
}

double as_double(const Value& v) {
  return v.kind == Kind::floating ? v.f : v.kind == Kind::integer ? double(v.i) : double(v.b);
}
int64_t as_int(const Value& v) { return v.kind == Kind::integer ? v.i : int64_t(v.b); }

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) return as_double(a) == as_double(b);
    return as_int(a) == as_int(b);
  }
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::undefined:
    case Kind::none:
      return true;
    case Kind::string:
      return a.s == b.s;
    case Kind::list:
      if (a.tuple != b.tuple || a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Kind::dict: {
      if (a.ns || b.ns) return a.dict == b.dict;
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (const auto& kv : a.dict->items) {
        const Value* o = b.dict->find(kv.first);
        if (!o || !equal(kv.second, *o)) return false;
      }
      return true;
    }
    case Kind::callable:
      return a.fn == b.fn;
    default:
      return false;
  }
}

// Python's a < b (numbers, strings, lists); -1, 0, 1; a TypeError otherwise.
int compare(const Value& a, const Value& b, int line, const char* op) {
  if (a.is_number() && b.is_number()) {
    if (a.kind == Kind::floating || b.kind == Kind::floating) {
      const double x = as_double(a), y = as_double(b);
      return x < y ? -1 : x > y ? 1 : 0;
    }
    const int64_t x = as_int(a), y = as_int(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.kind == Kind::string && b.kind == Kind::string) return a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  if (a.kind == Kind::list && b.kind == Kind::list) {
    const size_t n = std::min(a.list->size(), b.list->size());
    for (size_t k = 0; k < n; ++k)
      if (!equal((*a.list)[k], (*b.list)[k])) return compare((*a.list)[k], (*b.list)[k], line, op);
    return a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  }
  fail(line, std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
                 type_name(b) + "'");
}

// ---------------------------------------------------------------- JSON in and out

Value from_json(const nlohmann::ordered_json& j) {
  if (j.is_null()) return Value::none();
  if (j.is_boolean()) return Value::boolean(j.get<bool>());
  if (j.is_number_integer()) {
    if (j.is_number_unsigned() && j.get<uint64_t>() > uint64_t(INT64_MAX))
      throw UsageError("chat template: the integer " + j.dump() + " is beyond 64 bits");
    return Value::integer(j.get<int64_t>());
  }
  if (j.is_number_float()) return Value::floating(j.get<double>());
  if (j.is_string()) return Value::string(j.get<std::string>());
  if (j.is_array()) {
    List l;
    for (const auto& e : j) l.push_back(from_json(e));
    return Value::make_list(std::move(l));
  }
  Value d = Value::make_dict();
  for (auto it = j.begin(); it != j.end(); ++it) d.dict->set(it.key(), from_json(it.value()));
  return d;
}

// json.dumps(ensure_ascii=False) string escaping.
void json_string(std::string& out, const std::string& s) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
          out += b;
        } else {
          out += char(c);
        }
    }
  }
  out += '"';
}

struct JsonStyle {
  int indent = -1;  // -1: none
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

void to_json(std::string& out, const Value& v, const JsonStyle& st, int depth, int line) {
  auto newline = [&](int d) {
    if (st.indent >= 0) out += "\n" + std::string(size_t(st.indent * d), ' ');
  };
  switch (v.kind) {
    case Kind::none:
      out += "null";
      return;
    case Kind::boolean:
      out += v.b ? "true" : "false";
      return;
    case Kind::integer:
      out += std::to_string(v.i);
      return;
    case Kind::floating:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f > 0 ? "Infinity" : "-Infinity";
      else
        out += py_float(v.f);
      return;
    case Kind::string:
      json_string(out, v.s);
      return;
    case Kind::list: {
      if (v.list->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += st.item_sep;
        newline(depth + 1);
        to_json(out, (*v.list)[k], st, depth + 1, line);
      }
      newline(depth);
      out += ']';
      return;
    }
    case Kind::dict: {
      if (v.ns) fail(line, "tojson: Object of type Namespace is not JSON serializable");
      if (v.dict->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (const auto& kv : v.dict->items) items.push_back(&kv);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k) out += st.item_sep;
        newline(depth + 1);
        json_string(out, items[k]->first);
        out += st.key_sep;
        to_json(out, items[k]->second, st, depth + 1, line);
      }
      newline(depth);
      out += '}';
      return;
    }
    case Kind::undefined:
      fail(line, "tojson: Object of type Undefined is not JSON serializable");
    case Kind::callable:
      fail(line, "tojson: Object of type function is not JSON serializable");
  }
}

// ---------------------------------------------------------------- lexer

enum class Tok { data, var_begin, var_end, block_begin, block_end, name, string, integer, floating, op, eof };

struct Token {
  Tok type;
  std::string text;  // data, name, string value, operator, number spelling
  int line;
};

struct Lexer {
  std::string src;
  std::string name;
  std::vector<Token> tokens;
  size_t pos = 0;
  int line = 1;
  bool line_starting = true;

  [[noreturn]] void error(int at_line, const std::string& msg) {
    throw UsageError(name + ":" + std::to_string(at_line) + ": " + msg);
  }

  void advance_to(size_t p) {
    for (size_t k = pos; k < p; ++k)
      if (src[k] == '\n') ++line;
    pos = p;
  }

  // Python str.rstrip() on a UTF-8 text.
  static std::string rstrip_ws(const std::string& t) { return py_strip(t, std::nullopt, false, true); }

  // The whitespace regex \s* from p (Unicode whitespace), returns the end.
  size_t skip_ws(size_t p) const {
    while (p < src.size()) {
      const unsigned char c = static_cast<unsigned char>(src[p]);
      if (c < 0x80) {
        if (!py_isspace(c)) break;
        ++p;
        continue;
      }
      size_t n = (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      const std::vector<uint32_t> cp = decode_utf8(std::string_view(src).substr(p, n));
      if (cp.empty() || !py_isspace(cp[0])) break;
      p += n;
    }
    return p;
  }

  void run() {
    // Newlines normalised; one trailing newline dropped (keep_trailing_newline = False).
    std::string norm;
    for (size_t k = 0; k < src.size(); ++k) {
      if (src[k] == '\r') {
        norm += '\n';
        if (k + 1 < src.size() && src[k + 1] == '\n') ++k;
      } else {
        norm += src[k];
      }
    }
    if (!norm.empty() && norm.back() == '\n') norm.pop_back();
    src = std::move(norm);

    while (pos < src.size()) {
      // The next tag start.
      size_t at = std::string::npos;
      for (size_t k = pos; k + 1 < src.size(); ++k)
        if (src[k] == '{' && (src[k + 1] == '{' || src[k + 1] == '%' || src[k + 1] == '#')) {
          at = k;
          break;
        }
      if (at == std::string::npos) {
        push_data(src.substr(pos), line);
        advance_to(src.size());
        break;
      }
      std::string text = src.substr(pos, at - pos);
      const char kind = src[at + 1];
      char sign = 0;
      if (at + 2 < src.size() && (src[at + 2] == '-' || src[at + 2] == '+')) sign = src[at + 2];
      const int text_line = line;
      if (sign == '-') {
        text = rstrip_ws(text);
      } else if (sign != '+' && kind != '{') {
        const size_t nl = text.rfind('\n');
        const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
        if (l_pos > 0 || line_starting) {
          bool blank = l_pos < text.size();
          for (size_t k = l_pos; k < text.size(); ++k)
            if (!py_isspace(static_cast<unsigned char>(text[k])) || static_cast<unsigned char>(text[k]) >= 0x80) {
              // Non-ASCII whitespace before a tag: decide by code point.
              const std::vector<uint32_t> rest = decode_utf8(std::string_view(text).substr(l_pos));
              blank = std::all_of(rest.begin(), rest.end(), py_isspace) && !rest.empty();
              break;
            }
          if (blank) text.resize(l_pos);
        }
      }
      push_data(std::move(text), text_line);
      advance_to(at + 2 + (sign ? 1 : 0));
      line_starting = false;
      if (kind == '#') {
        lex_comment(sign);
      } else {
        lex_tag(kind == '{');
      }
    }
    tokens.push_back({Tok::eof, "", line});
  }

  void push_data(std::string text, int at_line) {
    if (text.empty()) return;
    tokens.push_back({Tok::data, std::move(text), at_line});
  }

  void lex_comment(char) {
    const int start = line;
    size_t e = src.find("#}", pos);
    if (e == std::string::npos) error(start, "the comment is not closed (no '#}')");
    size_t end = e + 2;
    if (e > pos && src[e - 1] == '-') {
      end = skip_ws(end);
    } else if (e > pos && src[e - 1] == '+') {
    } else if (end < src.size() && src[end] == '\n') {
      ++end;
    }
    advance_to(end);
    line_starting = end > 0 && src[end - 1] == '\n';
  }

  void lex_tag(bool variable) {
    const int start = line;
    tokens.push_back({variable ? Tok::var_begin : Tok::block_begin, "", start});
    const char* close = variable ? "}}" : "%}";
    int depth = 0;  // open ( [ {: the tag cannot end inside them (jinja2's balancing stack)
    for (;;) {
      if (pos >= src.size()) error(start, std::string("the tag is not closed (no '") + close + "')");
      // The tag end first, as jinja2 tries it before the expression tokens.
      if (depth == 0 && src.compare(pos, 3, std::string("-") + close) == 0) {
        size_t end = skip_ws(pos + 3);
        tokens.push_back({variable ? Tok::var_end : Tok::block_end, "", line});
        advance_to(end);
        line_starting = end > 0 && src[end - 1] == '\n';
        return;
      }
      if (depth == 0 && !variable && src.compare(pos, 3, "+%}") == 0) {
        tokens.push_back({Tok::block_end, "", line});
        advance_to(pos + 3);
        line_starting = false;
        return;
      }
      if (depth == 0 && src.compare(pos, 2, close) == 0) {
        size_t end = pos + 2;
        if (!variable && end < src.size() && src[end] == '\n') ++end;
        tokens.push_back({variable ? Tok::var_end : Tok::block_end, "", line});
        advance_to(end);
        line_starting = src[end - 1] == '\n';
        return;
      }
      const char c = src[pos];
      if (c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v') {
        advance_to(pos + 1);
        continue;
      }
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t e = pos;
        while (e < src.size() && (std::isalnum(static_cast<unsigned char>(src[e])) || src[e] == '_')) ++e;
        tokens.push_back({Tok::name, src.substr(pos, e - pos), line});
        advance_to(e);
        continue;
      }
      if (std::isdigit(static_cast<unsigned char>(c))) {
        lex_number();
        continue;
      }
      if (c == '\'' || c == '"') {
        lex_string();
        continue;
      }
      static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[",
                                  "]",  "(",  ")",  "{",  "}",  "<",  ">", "=", ".", ":", "|", ",", ";"};
      bool matched = false;
      for (const char* op : ops) {
        const size_t n = std::strlen(op);
        if (src.compare(pos, n, op) == 0) {
          if (n == 1 && (*op == '(' || *op == '[' || *op == '{')) ++depth;
          if (n == 1 && (*op == ')' || *op == ']' || *op == '}')) {
            if (depth == 0) error(line, std::string("unexpected '") + op + "'");
            --depth;
          }
          tokens.push_back({Tok::op, op, line});
          advance_to(pos + n);
          matched = true;
          break;
        }
      }
      if (!matched) error(line, std::string("unexpected character '") + c + "' in a tag");
    }
  }

  void lex_number() {
    size_t e = pos;
    auto digits = [&]() {
      const size_t s = e;
      while (e < src.size() &&
             (std::isdigit(static_cast<unsigned char>(src[e])) ||
              (src[e] == '_' && e + 1 < src.size() && std::isdigit(static_cast<unsigned char>(src[e + 1])))))
        ++e;
      return e > s;
    };
    digits();
    bool is_float = false;
    if (e + 1 < src.size() && src[e] == '.' && std::isdigit(static_cast<unsigned char>(src[e + 1]))) {
      ++e;
      digits();
      is_float = true;
    }
    if (e < src.size() && (src[e] == 'e' || src[e] == 'E')) {
      size_t save = e;
      ++e;
      if (e < src.size() && (src[e] == '+' || src[e] == '-')) ++e;
      if (digits()) {
        is_float = true;
      } else {
        e = save;
      }
    }
    std::string spelling;
    for (size_t k = pos; k < e; ++k)
      if (src[k] != '_') spelling += src[k];
    tokens.push_back({is_float ? Tok::floating : Tok::integer, spelling, line});
    advance_to(e);
  }

  // A string literal with Python's unicode-escape decoding (unknown escapes are kept).
  void lex_string() {
    const char q = src[pos];
    const int start = line;
    size_t e = pos + 1;
    std::string out;
    for (;;) {
      if (e >= src.size()) error(start, "the string literal is not closed");
      const char c = src[e];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++e;
        continue;
      }
      if (e + 1 >= src.size()) error(start, "the string literal is not closed");
      const char n = src[e + 1];
      e += 2;
      auto hex = [&](int count) {
        uint32_t v = 0;
        for (int k = 0; k < count; ++k) {
          if (e >= src.size() || !std::isxdigit(static_cast<unsigned char>(src[e])))
            error(start, "a truncated \\x, \\u or \\U escape in a string literal");
          v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(src[e])) ? src[e] - '0'
                                                                                 : (std::tolower(src[e]) - 'a' + 10));
          ++e;
        }
        return v;
      };
      switch (n) {
        case '\n':
          break;
        case '\\':
          out += '\\';
          break;
        case '\'':
          out += '\'';
          break;
        case '"':
          out += '"';
          break;
        case 'a':
          out += '\a';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'v':
          out += '\v';
          break;
        case 'x':
          append_utf8(out, hex(2));
          break;
        case 'u':
          append_utf8(out, hex(4));
          break;
        case 'U':
          append_utf8(out, hex(8));
          break;
        case 'N':
          error(start, "\\N{...} escapes are not supported");
        default:
          if (n >= '0' && n <= '7') {
            uint32_t v = uint32_t(n - '0');
            for (int k = 0; k < 2 && e < src.size() && src[e] >= '0' && src[e] <= '7'; ++k)
              v = v * 8 + uint32_t(src[e++] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';
            out += n;
          }
      }
    }
    tokens.push_back({Tok::string, std::move(out), start});
    advance_to(e + 1);
  }
};

// ---------------------------------------------------------------- syntax tree

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

enum class ExprKind {
  literal,
  name,
  list,
  tuple,
  dict,
  attr,
  item,
  slice,
  call,
  filter,
  test,
  unary,
  binary,
  conditional,
  logic
};

struct Expr {
  ExprKind kind;
  int line = 0;
  Value literal;
  std::string name;                                     // name / attribute / filter / test / operator
  std::vector<ExprPtr> children;                        // operands, list items, dict keys+values alternating, call args
  std::vector<std::pair<std::string, ExprPtr>> kwargs;  // call / filter / test named arguments
  bool negated = false;                                 // "is not"
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using Body = std::vector<NodePtr>;

enum class NodeKind { text, output, if_, for_, set, set_block, macro, break_, continue_, generation };

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  ExprPtr expr;                                    // output, set value, for iterable
  std::vector<std::pair<ExprPtr, Body>> branches;  // if / elif (+ else with a null condition)
  std::vector<std::string> targets;                // for / set names; set ns.attr: {ns, attr}
  bool attr_target = false;
  ExprPtr loop_filter;
  Body body, else_body;
  std::vector<std::pair<std::string, ExprPtr>> params;  // macro parameters (defaults may be null)
};

// ---------------------------------------------------------------- parser

const std::set<std::string>& known_filters() {
  static const std::set<std::string> f = {
      "abs",        "capitalize", "count",   "d",      "default", "e",      "escape",     "first", "float",  "int",
      "items",      "join",       "last",    "length", "list",    "lower",  "map",        "max",   "min",    "reject",
      "rejectattr", "replace",    "reverse", "round",  "safe",    "select", "selectattr", "sort",  "string", "sum",
      "title",      "tojson",     "trim",    "unique", "upper",   "indent", "dictsort"};
  return f;
}

const std::set<std::string>& known_tests() {
  static const std::set<std::string> t = {"boolean",     "callable", "defined",  "divisibleby", "eq",   "equalto",
                                          "escaped",     "even",     "false",    "float",       "ge",   "gt",
                                          "greaterthan", "in",       "integer",  "iterable",    "le",   "lower",
                                          "lt",          "lessthan", "mapping",  "ne",          "none", "number",
                                          "odd",         "sameas",   "sequence", "string",      "true", "undefined",
                                          "upper",       "==",       "!=",       "<",           "<=",   ">",
                                          ">="};
  return t;
}

struct Parser {
  const std::vector<Token>& toks;
  const std::string& name;
  size_t p = 0;
  bool has_generation = false;
  int loops = 0, blocks = 0;  // open for loops; open statements of any kind (macros only at the top)

  Parser(const std::vector<Token>& t, const std::string& n) : toks(t), name(n) {}

  [[noreturn]] void error(int line, const std::string& msg) {
    throw UsageError(name + ":" + std::to_string(line) + ": " + msg);
  }
  const Token& cur() const { return toks[p]; }
  bool is_op(const char* op) const { return cur().type == Tok::op && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tok::name && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(cur().line, std::string("expected '") + op + "', found " + describe(cur()));
    ++p;
  }
  std::string expect_name() {
    if (cur().type != Tok::name) error(cur().line, "expected a name, found " + describe(cur()));
    return toks[p++].text;
  }
  void expect_block_end() {
    if (cur().type != Tok::block_end) error(cur().line, "expected the end of the tag '%}', found " + describe(cur()));
    ++p;
  }
  static std::string describe(const Token& t) {
    switch (t.type) {
      case Tok::eof:
        return "the end of the template";
      case Tok::block_end:
        return "'%}'";
      case Tok::var_end:
        return "'}}'";
      case Tok::data:
        return "text";
      case Tok::string:
        return "a string";
      default:
        return "'" + t.text + "'";
    }
  }

  // Parses nodes until a block tag whose first name is in `ends` (left unconsumed: p at its name).
  Body parse_body(const std::set<std::string>& ends, const char* opened, int open_line) {
    Body body;
    for (;;) {
      const Token& t = cur();
      if (t.type == Tok::eof) {
        if (ends.empty()) return body;
        error(open_line, std::string("{% ") + opened + " %} is not closed (expected {% " + *ends.begin() + " %})");
      }
      if (t.type == Tok::data) {
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::text;
        n->line = t.line;
        n->text = t.text;
        body.push_back(std::move(n));
        ++p;
        continue;
      }
      if (t.type == Tok::var_begin) {
        ++p;
        auto n = std::make_unique<Node>();
        n->kind = NodeKind::output;
        n->line = t.line;
        n->expr = parse_expression();
        if (cur().type != Tok::var_end) error(cur().line, "expected '}}', found " + describe(cur()));
        ++p;
        body.push_back(std::move(n));
        continue;
      }
      // block
      ++p;
      if (cur().type != Tok::name) error(cur().line, "expected a statement name after '{%', found " + describe(cur()));
      const std::string kw = cur().text;
      if (ends.count(kw)) return body;
      body.push_back(parse_statement());
    }
  }

  NodePtr parse_statement() {
    const Token& t = toks[p];
    const std::string kw = t.text;
    const int line = t.line;
    ++p;
    struct Depth {
      int& n;
      explicit Depth(int& x) : n(x) { ++n; }
      ~Depth() { --n; }
    };
    if (kw == "macro" && blocks > 0) error(line, "a {% macro %} must be defined at the top level of the template");
    if ((kw == "break" || kw == "continue") && loops == 0) error(line, "{% " + kw + " %} outside a for loop");
    Depth in_block(blocks);
    auto n = std::make_unique<Node>();
    n->line = line;
    if (kw == "if") {
      n->kind = NodeKind::if_;
      ExprPtr cond = parse_expression();
      expect_block_end();
      for (;;) {
        Body b = parse_body({"elif", "else", "endif"}, "if", line);
        n->branches.emplace_back(std::move(cond), std::move(b));
        const std::string e = toks[p++].text;
        if (e == "elif") {
          cond = parse_expression();
          expect_block_end();
        } else if (e == "else") {
          expect_block_end();
          Body eb = parse_body({"endif"}, "if", line);
          n->branches.emplace_back(nullptr, std::move(eb));
          ++p;
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (kw == "for") {
      n->kind = NodeKind::for_;
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        ++p;
        n->targets.push_back(expect_name());
      }
      if (!is_name("in")) error(cur().line, "expected 'in' in the for loop, found " + describe(cur()));
      ++p;
      n->expr = parse_or_condexpr_no_if();
      if (is_name("if")) {
        ++p;
        n->loop_filter = parse_expression();
      }
      if (is_name("recursive")) error(cur().line, "recursive for loops are not supported");
      expect_block_end();
      {
        Depth in_loop(loops);
        n->body = parse_body({"else", "endfor"}, "for", line);
      }
      if (toks[p++].text == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"}, "for", line);
        ++p;
      }
      expect_block_end();
    } else if (kw == "set") {
      std::string first = expect_name();
      if (is_op(".")) {
        ++p;
        n->kind = NodeKind::set;
        n->attr_target = true;
        n->targets = {first, expect_name()};
        expect_op("=");
        n->expr = parse_tuple_expression();
        expect_block_end();
      } else {
        n->targets.push_back(first);
        while (is_op(",")) {
          ++p;
          n->targets.push_back(expect_name());
        }
        if (is_op("=")) {
          ++p;
          n->kind = NodeKind::set;
          n->expr = parse_tuple_expression();
          expect_block_end();
        } else {
          if (is_op("|")) error(cur().line, "filtered {% set %} blocks are not supported");
          if (n->targets.size() != 1) error(line, "a {% set %} block assigns one name");
          expect_block_end();
          n->kind = NodeKind::set_block;
          n->body = parse_body({"endset"}, "set", line);
          ++p;
          expect_block_end();
        }
      }
    } else if (kw == "macro") {
      n->kind = NodeKind::macro;
      n->text = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string param = expect_name();
        ExprPtr def;
        if (is_op("=")) {
          ++p;
          def = parse_expression();
        }
        n->params.emplace_back(param, std::move(def));
        if (!is_op(",")) break;
        ++p;
      }
      expect_op(")");
      expect_block_end();
      const int outer_loops = loops;
      loops = 0;  // a loop around the definition does not make {% break %} legal inside the macro
      n->body = parse_body({"endmacro"}, "macro", line);
      loops = outer_loops;
      ++p;
      if (cur().type == Tok::name) ++p;  // {% endmacro name %}
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? NodeKind::break_ : NodeKind::continue_;
      expect_block_end();
    } else if (kw == "generation") {
      n->kind = NodeKind::generation;
      has_generation = true;
      expect_block_end();
      n->body = parse_body({"endgeneration"}, "generation", line);
      ++p;
      expect_block_end();
    } else {
      static const std::set<std::string> closers = {"endif",         "endfor", "endset", "endmacro",
                                                    "endgeneration", "elif",   "else"};
      if (closers.count(kw)) error(line, "{% " + kw + " %} without its opening tag");
      error(line, "the {% " + kw +
                      " %} statement is not supported by dew's chat templates (supported: if, for, "
                      "set, macro, break, continue, generation)");
    }
    return n;
  }

  ExprPtr make(ExprKind k, int line) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = line;
    return e;
  }

  // `a, b` at the top of a set: a tuple.
  ExprPtr parse_tuple_expression() {
    const int line = cur().line;
    ExprPtr first = parse_expression();
    if (!is_op(",")) return first;
    auto t = make(ExprKind::tuple, line);
    t->children.push_back(std::move(first));
    while (is_op(",")) {
      ++p;
      t->children.push_back(parse_expression());
    }
    return t;
  }

  ExprPtr parse_expression() {
    const int line = cur().line;
    ExprPtr e = parse_or();
    while (is_name("if")) {
      ++p;
      auto c = make(ExprKind::conditional, line);
      ExprPtr cond = parse_or();
      ExprPtr other;
      if (is_name("else")) {
        ++p;
        other = parse_expression();
      }
      c->children.push_back(std::move(cond));
      c->children.push_back(std::move(e));
      c->children.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }
  // The iterable of a for loop: no conditional expression (its `if` is the loop filter).
  ExprPtr parse_or_condexpr_no_if() { return parse_or(); }

  ExprPtr parse_or() {
    ExprPtr l = parse_and();
    while (is_name("or")) {
      const int line = cur().line;
      ++p;
      auto e = make(ExprKind::logic, line);
      e->name = "or";
      e->children.push_back(std::move(l));
      e->children.push_back(parse_and());
      l = std::move(e);
    }
    return l;
  }
  ExprPtr parse_and() {
    ExprPtr l = parse_not();
    while (is_name("and")) {
      const int line = cur().line;
      ++p;
      auto e = make(ExprKind::logic, line);
      e->name = "and";
      e->children.push_back(std::move(l));
      e->children.push_back(parse_not());
      l = std::move(e);
    }
    return l;
  }
  ExprPtr parse_not() {
    if (is_name("not")) {
      const int line = cur().line;
      ++p;
      auto e = make(ExprKind::unary, line);
      e->name = "not";
      e->children.push_back(parse_not());
      return e;
    }
    return parse_compare();
  }
  ExprPtr parse_compare() {
    ExprPtr l = parse_math1();
    for (;;) {
      const int line = cur().line;
      std::string op;
      if (cur().type == Tok::op && (cur().text == "==" || cur().text == "!=" || cur().text == "<" ||
                                    cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++p;
      } else if (is_name("in")) {
        op = "in";
        ++p;
      } else if (is_name("not") && toks[p + 1].type == Tok::name && toks[p + 1].text == "in") {
        op = "not in";
        p += 2;
      } else {
        return l;
      }
      auto e = make(ExprKind::binary, line);
      e->name = op;
      e->children.push_back(std::move(l));
      e->children.push_back(parse_math1());
      l = std::move(e);
    }
  }
  ExprPtr binary_chain(ExprPtr (Parser::*next)(), std::initializer_list<const char*> ops) {
    ExprPtr l = (this->*next)();
    for (;;) {
      const char* hit = nullptr;
      for (const char* op : ops)
        if (is_op(op)) hit = op;
      if (!hit) return l;
      const int line = cur().line;
      ++p;
      auto e = make(ExprKind::binary, line);
      e->name = hit;
      e->children.push_back(std::move(l));
      e->children.push_back((this->*next)());
      l = std::move(e);
    }
  }
  ExprPtr parse_math1() { return binary_chain(&Parser::parse_concat, {"+", "-"}); }
  ExprPtr parse_concat() { return binary_chain(&Parser::parse_math2, {"~"}); }
  ExprPtr parse_math2() { return binary_chain(&Parser::parse_pow, {"*", "/", "//", "%"}); }
  ExprPtr parse_pow() { return binary_chain(&Parser::parse_unary_filtered, {"**"}); }
  ExprPtr parse_unary_filtered() { return parse_unary(true); }

  ExprPtr parse_unary(bool with_filter) {
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const int line = cur().line;
      auto e = make(ExprKind::unary, line);
      e->name = cur().text;
      ++p;
      e->children.push_back(parse_unary(false));
      node = std::move(e);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    const int line = t.line;
    if (t.type == Tok::name) {
      ++p;
      if (t.text == "true" || t.text == "True") return literal(Value::boolean(true), line);
      if (t.text == "false" || t.text == "False") return literal(Value::boolean(false), line);
      if (t.text == "none" || t.text == "None") return literal(Value::none(), line);
      auto e = make(ExprKind::name, line);
      e->name = t.text;
      return e;
    }
    if (t.type == Tok::string) {
      std::string s;
      while (cur().type == Tok::string) s += toks[p++].text;  // adjacent literals concatenate
      return literal(Value::string(std::move(s)), line);
    }
    if (t.type == Tok::integer) {
      ++p;
      int64_t v = 0;
      auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
      if (r.ec != std::errc()) error(line, "the integer literal " + t.text + " is beyond 64 bits");
      return literal(Value::integer(v), line);
    }
    if (t.type == Tok::floating) {
      ++p;
      return literal(Value::floating(std::strtod(t.text.c_str(), nullptr)), line);
    }
    if (is_op("(")) {
      ++p;
      if (is_op(")")) {
        ++p;
        return make(ExprKind::tuple, line);
      }
      ExprPtr first = parse_expression();
      if (is_op(")")) {
        ++p;
        return first;
      }
      auto tup = make(ExprKind::tuple, line);
      tup->children.push_back(std::move(first));
      while (is_op(",")) {
        ++p;
        if (is_op(")")) break;
        tup->children.push_back(parse_expression());
      }
      expect_op(")");
      return tup;
    }
    if (is_op("[")) {
      ++p;
      auto l = make(ExprKind::list, line);
      while (!is_op("]")) {
        l->children.push_back(parse_expression());
        if (!is_op(",")) break;
        ++p;
      }
      expect_op("]");
      return l;
    }
    if (is_op("{")) {
      ++p;
      auto d = make(ExprKind::dict, line);
      while (!is_op("}")) {
        d->children.push_back(parse_expression());
        expect_op(":");
        d->children.push_back(parse_expression());
        if (!is_op(",")) break;
        ++p;
      }
      expect_op("}");
      return d;
    }
    error(line, "unexpected " + describe(t) + " in an expression");
  }

  ExprPtr literal(Value v, int line) {
    auto e = make(ExprKind::literal, line);
    e->literal = std::move(v);
    return e;
  }

  ExprPtr parse_postfix(ExprPtr node) {
    for (;;) {
      const int line = cur().line;
      if (is_op(".")) {
        ++p;
        auto e = make(ExprKind::attr, line);
        if (cur().type == Tok::name) {
          e->name = toks[p++].text;
        } else if (cur().type == Tok::integer) {
          // x.0 is x[0]
          e->kind = ExprKind::item;
          e->children.push_back(std::move(node));
          e->children.push_back(literal(Value::integer(std::atoll(toks[p++].text.c_str())), line));
          node = std::move(e);
          continue;
        } else {
          error(line, "expected an attribute name after '.', found " + describe(cur()));
        }
        e->children.push_back(std::move(node));
        node = std::move(e);
      } else if (is_op("[")) {
        ++p;
        node = parse_subscript(std::move(node), line);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node, int line) {
    // [a], [a:b], [a:b:c], [::-1]
    ExprPtr parts[3];
    bool is_slice = false;
    int idx = 0;
    for (;;) {
      if (is_op("]")) break;
      if (is_op(":")) {
        is_slice = true;
        ++p;
        ++idx;
        if (idx > 2) error(line, "a slice has at most three parts");
        continue;
      }
      if (parts[idx]) error(line, "expected ':' or ']' in a subscript");
      parts[idx] = parse_expression();
    }
    expect_op("]");
    if (!is_slice) {
      if (!parts[0]) error(line, "an empty subscript []");
      auto e = make(ExprKind::item, line);
      e->children.push_back(std::move(node));
      e->children.push_back(std::move(parts[0]));
      return e;
    }
    auto e = make(ExprKind::slice, line);
    e->children.push_back(std::move(node));
    for (auto& part : parts) e->children.push_back(std::move(part));
    return e;
  }

  void parse_args(Expr& e) {
    expect_op("(");
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) error(cur().line, "*args / **kwargs in calls are not supported");
      if (cur().type == Tok::name && toks[p + 1].type == Tok::op && toks[p + 1].text == "=") {
        std::string k = toks[p].text;
        p += 2;
        e.kwargs.emplace_back(k, parse_expression());
      } else {
        if (!e.kwargs.empty()) error(cur().line, "a positional argument after a keyword argument");
        e.children.push_back(parse_expression());
      }
      if (!is_op(",")) break;
      ++p;
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make(ExprKind::call, cur().line);
    e->children.push_back(std::move(node));
    parse_args(*e);
    return e;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    for (;;) {
      const int line = cur().line;
      if (is_op("|")) {
        ++p;
        auto e = make(ExprKind::filter, line);
        e->name = expect_name();
        while (is_op(".")) {
          ++p;
          e->name += "." + expect_name();
        }
        if (!known_filters().count(e->name)) error(line, "the filter '" + e->name + "' is not supported");
        e->children.push_back(std::move(node));
        if (is_op("(")) parse_args(*e);
        node = std::move(e);
      } else if (is_name("is")) {
        ++p;
        auto e = make(ExprKind::test, line);
        if (is_name("not")) {
          ++p;
          e->negated = true;
        }
        if (cur().type == Tok::name) {
          e->name = toks[p++].text;
        } else if (cur().type == Tok::op && known_tests().count(cur().text)) {
          e->name = toks[p++].text;
        } else {
          error(line, "expected a test name after 'is', found " + describe(cur()));
        }
        if (!known_tests().count(e->name)) error(line, "the test '" + e->name + "' is not supported");
        e->children.push_back(std::move(node));
        if (is_op("(")) {
          parse_args(*e);
        } else if (cur().type == Tok::string || cur().type == Tok::integer || cur().type == Tok::floating ||
                   (cur().type == Tok::name && !is_name("and") && !is_name("or") && !is_name("else") &&
                    !is_name("if") && !is_name("is") && !is_name("in") && !is_name("not")) ||
                   is_op("[") || is_op("{") || is_op("(") || is_op("-")) {
          // One argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
          e->children.push_back(parse_primary_postfix());
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }
  ExprPtr parse_primary_postfix() { return parse_postfix(parse_primary()); }
};

// ---------------------------------------------------------------- renderer

struct Scope {
  std::map<std::string, Value> vars;
  Scope* parent = nullptr;
  const Value* lookup(const std::string& n) const {
    for (const Scope* s = this; s; s = s->parent) {
      auto it = s->vars.find(n);
      if (it != s->vars.end()) return &it->second;
    }
    return nullptr;
  }
};

struct BreakSignal {};
struct ContinueSignal {};

struct Renderer {
  std::string out;
  std::vector<std::pair<int64_t, int64_t>> spans;
  int depth = 0;

  Value eval(const Expr& e, Scope& s);
  void exec(const Body& body, Scope& s);
  Value call_value(const Value& f, const Args& a, int line);
  Value apply_filter(const std::string& name, const Value& v, const Args& a, int line, Scope& s);
  bool apply_test(const std::string& name, const Value& v, const Args& a, int line);
  Value get_attr(const Value& obj, const std::string& name, int line);
  Value get_item(const Value& obj, const Value& key, int line);
};

[[noreturn]] void undefined_error(const Value& v, int line) {
  fail(line, v.s.empty() ? "a value is undefined" : v.s + " is undefined");
}

// Values one may iterate: lists, strings (their characters), dicts (their keys); undefined: nothing.
List iterate(const Value& v, int line) {
  switch (v.kind) {
    case Kind::list:
      return *v.list;
    case Kind::string: {
      List out;
      for (uint32_t c : decode_utf8(v.s)) {
        std::string ch;
        append_utf8(ch, c);
        out.push_back(Value::string(std::move(ch)));
      }
      return out;
    }
    case Kind::dict: {
      if (v.ns) fail(line, "a namespace is not iterable");
      List out;
      for (const auto& kv : v.dict->items) out.push_back(Value::string(kv.first));
      return out;
    }
    case Kind::undefined:
      return {};
    default:
      fail(line, std::string("'") + type_name(v) + "' object is not iterable");
  }
}

Value make_builtin(std::string name, std::function<Value(const Args&, Renderer&, int)> fn) {
  Value v;
  v.kind = Kind::callable;
  v.fn = std::make_shared<Callable>(Callable{std::move(name), std::move(fn)});
  return v;
}

std::optional<std::string> opt_string(const Args& a, size_t pos, const char* name, int line) {
  const Value* v = a.get(pos, name);
  if (!v || v->kind == Kind::none) return std::nullopt;
  if (v->kind != Kind::string) fail(line, std::string("argument '") + name + "' must be a string");
  return v->s;
}

std::string need_string(const Value& v, int line, const char* what) {
  if (v.kind != Kind::string) fail(line, std::string(what) + " must be a string, got " + type_name(v));
  return v.s;
}

// Python's str.split(sep=None, maxsplit=-1).
List py_split(const std::string& s, const std::optional<std::string>& sep, int64_t maxsplit, int line) {
  List out;
  if (sep) {
    if (sep->empty()) fail(line, "split: empty separator");
    size_t start = 0;
    int64_t n = 0;
    for (;;) {
      const size_t at = (maxsplit < 0 || n < maxsplit) ? s.find(*sep, start) : std::string::npos;
      if (at == std::string::npos) {
        out.push_back(Value::string(s.substr(start)));
        break;
      }
      out.push_back(Value::string(s.substr(start, at - start)));
      start = at + sep->size();
      ++n;
    }
    return out;
  }
  const std::vector<uint32_t> cps = decode_utf8(s);
  size_t i = 0;
  int64_t n = 0;
  while (i < cps.size()) {
    while (i < cps.size() && py_isspace(cps[i])) ++i;
    if (i >= cps.size()) break;
    if (maxsplit >= 0 && n >= maxsplit) {
      size_t e = cps.size();
      while (e > i && py_isspace(cps[e - 1])) --e;
      out.push_back(Value::string(encode_utf8(cps, i, e)));
      break;
    }
    size_t j = i;
    while (j < cps.size() && !py_isspace(cps[j])) ++j;
    out.push_back(Value::string(encode_utf8(cps, i, j)));
    ++n;
    i = j;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& old, const std::string& with, int64_t count) {
  if (old.empty()) {
    // Python inserts `with` between every character (and at both ends).
    const std::vector<uint32_t> cps = decode_utf8(s);
    std::string out;
    int64_t n = 0;
    for (size_t k = 0; k <= cps.size(); ++k) {
      if (count < 0 || n < count) {
        out += with;
        ++n;
      }
      if (k < cps.size()) append_utf8(out, cps[k]);
    }
    return out;
  }
  std::string out;
  size_t start = 0;
  int64_t n = 0;
  for (;;) {
    const size_t at = (count < 0 || n < count) ? s.find(old, start) : std::string::npos;
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + with;
    start = at + old.size();
    ++n;
  }
  return out + s.substr(start);
}

std::string py_title(const std::string& s) {
  std::string out = s;
  bool prev_cased = false;
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u >= 0x80) {
      prev_cased = false;
      continue;
    }
    if (std::isalpha(u)) {
      c = char(prev_cased ? std::tolower(u) : std::toupper(u));
      prev_cased = true;
    } else {
      prev_cased = false;
    }
  }
  return out;
}

// jinja2's |title filter (not str.title): words begin after runs of '-', whitespace, '(', '{', '[', '<'; each
// word's first character upper-cased, the rest lower-cased (ASCII letters; other bytes kept).
std::string jinja_title(const std::string& s) {
  std::string out = s;
  bool word_start = true;
  for (char& c : out) {
    const unsigned char u = static_cast<unsigned char>(c);
    if (u == '-' || std::isspace(u) || u == '(' || u == '{' || u == '[' || u == '<') {
      word_start = true;
      continue;
    }
    if (u < 0x80) c = char(word_start ? std::toupper(u) : std::tolower(u));
    word_start = false;
  }
  return out;
}

// Python's digit-group underscores ("1_000"): removed where each one stands between two digits of `base`
// (a prefix's end counts as a digit, as in "0x_1f"); false for one anywhere else.
bool strip_digit_underscores(std::string& t, size_t from, int base) {
  auto digit = [base](char ch) {
    const int v = std::isdigit(static_cast<unsigned char>(ch)) ? ch - '0'
                  : std::isalpha(static_cast<unsigned char>(ch))
                      ? std::tolower(static_cast<unsigned char>(ch)) - 'a' + 10
                      : 99;
    return v < base;
  };
  std::string out = t.substr(0, from);
  for (size_t i = from; i < t.size(); ++i) {
    if (t[i] != '_') {
      out += t[i];
      continue;
    }
    const bool before = i == from ? from > 0 : digit(t[i - 1]);
    if (!before || i + 1 >= t.size() || !digit(t[i + 1])) return false;
  }
  t = out;
  return true;
}

// Python's int(text, base) for a 64-bit result: nullopt where Python raises ValueError.
std::optional<int64_t> py_int(const std::string& text, int64_t base, int line) {
  std::string t = py_strip(text, std::nullopt, true, true);
  if (base != 0 && (base < 2 || base > 36)) return std::nullopt;
  size_t i = 0;
  bool negative = false;
  if (i < t.size() && (t[i] == '+' || t[i] == '-')) negative = t[i++] == '-';
  t = t.substr(i);
  size_t from = 0;
  if (t.size() >= 2 && t[0] == '0') {
    const char p = char(std::tolower(static_cast<unsigned char>(t[1])));
    const int prefixed = p == 'x' ? 16 : p == 'o' ? 8 : p == 'b' ? 2 : 0;
    if (prefixed && (base == 0 || base == prefixed)) {
      base = prefixed;
      from = 2;
    }
  }
  if (base == 0) {  // no prefix: decimal, without leading zeros (but "0", "00")
    base = 10;
    if (t.size() > 1 && t[0] == '0' && t.find_first_not_of("0_") != std::string::npos) return std::nullopt;
  }
  if (!strip_digit_underscores(t, from, int(base))) return std::nullopt;
  const std::string digits = t.substr(from);
  if (digits.empty()) return std::nullopt;
  uint64_t magnitude = 0;
  auto r = std::from_chars(digits.data(), digits.data() + digits.size(), magnitude, int(base));
  if (r.ptr != digits.data() + digits.size()) return std::nullopt;
  if (r.ec == std::errc::result_out_of_range || magnitude > uint64_t(INT64_MAX) + (negative ? 1 : 0))
    fail(line, "integer overflow (dew's chat templates use 64-bit integers)");
  return negative ? int64_t(-__int128(magnitude)) : int64_t(magnitude);
}

// Python's float(text): decimal or exponent notation with digit-group underscores, inf / infinity / nan;
// nullopt where Python raises ValueError (hexadecimal, "nan(...)", empty).
std::optional<double> py_float(const std::string& text) {
  std::string t = py_strip(text, std::nullopt, true, true);
  if (t.empty() || t.find_first_of("xXpP(") != std::string::npos) return std::nullopt;
  if (!strip_digit_underscores(t, 0, 10)) return std::nullopt;
  char* end = nullptr;
  const double d = std::strtod(t.c_str(), &end);
  if (end != t.c_str() + t.size()) return std::nullopt;
  return d;
}

// A bound method of a string, dict or list: `'a b'.split`, `d.items`.
Value method(const Value& obj, const std::string& name) {
  if (obj.kind == Kind::string) {
    const std::string s = obj.s;
    static const std::set<std::string> names = {"strip", "lstrip", "rstrip", "split",      "startswith", "endswith",
                                                "upper", "lower",  "title",  "capitalize", "replace",    "find",
                                                "count", "join",   "rfind",  "isdigit",    "isspace",    "splitlines"};
    if (!names.count(name)) return Value::undefined();
    return make_builtin("str." + name, [s, name](const Args& a, Renderer&, int line) -> Value {
      if (name == "strip" || name == "lstrip" || name == "rstrip")
        return Value::string(py_strip(s, opt_string(a, 0, "chars", line), name != "rstrip", name != "lstrip"));
      if (name == "split") {
        const Value* m = a.get(1, "maxsplit");
        return Value::make_list(py_split(s, opt_string(a, 0, "sep", line), m ? as_int(*m) : -1, line));
      }
      if (name == "startswith" || name == "endswith") {
        const Value* x = a.get(0, "prefix");
        if (!x) fail(line, "str." + name + " takes one argument");
        List options = x->kind == Kind::list ? *x->list : List{*x};
        for (const Value& o : options) {
          const std::string t = need_string(o, line, ("str." + name + "'s argument").c_str());
          if (name == "startswith" ? s.compare(0, t.size(), t) == 0
                                   : (s.size() >= t.size() && s.compare(s.size() - t.size(), t.size(), t) == 0))
            return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      if (name == "upper") return Value::string(ascii_map(s, ::toupper));
      if (name == "lower") return Value::string(ascii_map(s, ::tolower));
      if (name == "title") return Value::string(py_title(s));
      if (name == "capitalize") {
        std::string r = ascii_map(s, ::tolower);
        if (!r.empty() && static_cast<unsigned char>(r[0]) < 0x80)
          r[0] = char(std::toupper(static_cast<unsigned char>(r[0])));
        return Value::string(r);
      }
      if (name == "replace") {
        const Value* c = a.get(2, "count");
        return Value::string(py_replace(s, need_string(a.positional.at(0), line, "replace's old"),
                                        need_string(a.positional.at(1), line, "replace's new"), c ? as_int(*c) : -1));
      }
      if (name == "find" || name == "rfind") {
        const std::string t = need_string(a.positional.at(0), line, "find's argument");
        const size_t at = name == "find" ? s.find(t) : s.rfind(t);
        return Value::integer(at == std::string::npos ? -1 : py_len(std::string_view(s).substr(0, at)));
      }
      if (name == "count") {
        const std::string t = need_string(a.positional.at(0), line, "count's argument");
        if (t.empty()) return Value::integer(py_len(s) + 1);
        int64_t n = 0;
        for (size_t at = s.find(t); at != std::string::npos; at = s.find(t, at + t.size())) ++n;
        return Value::integer(n);
      }
      if (name == "join") {
        std::string out;
        const List items = iterate(a.positional.at(0), line);
        for (size_t k = 0; k < items.size(); ++k) out += (k ? s : "") + need_string(items[k], line, "join's items");
        return Value::string(out);
      }
      if (name == "isdigit") {
        return Value::boolean(!s.empty() &&
                              std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; }));
      }
      if (name == "isspace") {
        const auto cps = decode_utf8(s);
        return Value::boolean(!cps.empty() && std::all_of(cps.begin(), cps.end(), py_isspace));
      }
      // splitlines
      List out;
      for (const std::string& l : py_splitlines(s)) out.push_back(Value::string(l));
      return Value::make_list(out);
    });
  }
  if (obj.kind == Kind::dict && !obj.ns) {
    auto d = obj.dict;
    if (name == "items")
      return make_builtin("dict.items", [d](const Args&, Renderer&, int) {
        List out;
        for (const auto& kv : d->items) out.push_back(Value::make_list({Value::string(kv.first), kv.second}, true));
        return Value::make_list(out);
      });
    if (name == "keys")
      return make_builtin("dict.keys", [d](const Args&, Renderer&, int) {
        List out;
        for (const auto& kv : d->items) out.push_back(Value::string(kv.first));
        return Value::make_list(out);
      });
    if (name == "values")
      return make_builtin("dict.values", [d](const Args&, Renderer&, int) {
        List out;
        for (const auto& kv : d->items) out.push_back(kv.second);
        return Value::make_list(out);
      });
    if (name == "get")
      return make_builtin("dict.get", [d](const Args& a, Renderer&, int line) {
        const std::string k = need_string(a.positional.at(0), line, "dict.get's key");
        const Value* v = d->find(k);
        if (v) return *v;
        return a.positional.size() > 1 ? a.positional[1] : Value::none();
      });
  }
  return Value::undefined();
}

Value Renderer::get_attr(const Value& obj, const std::string& name, int line) {
  if (obj.is_undefined())
    fail(line, (obj.s.empty() ? std::string("a value") : obj.s) + " is undefined (reading ." + name + ")");
  if (obj.kind == Kind::dict) {
    if (obj.ns) {
      const Value* v = obj.dict->find(name);
      return v ? *v : Value::undefined("namespace attribute '" + name + "'");
    }
    Value m = method(obj, name);  // Python attributes first (jinja2's getattr), then items
    if (!m.is_undefined()) return m;
    const Value* v = obj.dict->find(name);
    return v ? *v : Value::undefined("'dict object' has no attribute '" + name + "'; it");
  }
  Value m = method(obj, name);
  if (!m.is_undefined()) return m;
  return Value::undefined(std::string("'") + type_name(obj) + " object' has no attribute '" + name + "'; it");
}

Value Renderer::get_item(const Value& obj, const Value& key, int line) {
  if (obj.is_undefined())
    fail(line, (obj.s.empty() ? std::string("a value") : obj.s) + " is undefined (reading [" + repr(key) + "])");
  if (obj.kind == Kind::dict) {
    if (key.kind == Kind::string) {
      const Value* v = obj.dict->find(key.s);
      if (v) return *v;
      if (!obj.ns) {
        Value m = method(obj, key.s);
        if (!m.is_undefined()) return m;
      }
    }
    return Value::undefined("'dict object' has no attribute " + repr(key) + "; it");
  }
  if (obj.kind == Kind::list || obj.kind == Kind::string) {
    if (key.kind == Kind::string) return get_attr(obj, key.s, line);
    if (key.kind != Kind::integer && key.kind != Kind::boolean)
      fail(line, std::string("indices must be integers, not ") + type_name(key));
    int64_t idx = as_int(key);
    if (obj.kind == Kind::list) {
      const int64_t n = int64_t(obj.list->size());
      if (idx < 0) idx += n;
      if (idx < 0 || idx >= n) return Value::undefined(repr(obj) + "[" + std::to_string(as_int(key)) + "]");
      return (*obj.list)[size_t(idx)];
    }
    const std::vector<uint32_t> cps = decode_utf8(obj.s);
    const int64_t n = int64_t(cps.size());
    if (idx < 0) idx += n;
    if (idx < 0 || idx >= n) return Value::undefined("the string index " + std::to_string(as_int(key)));
    return Value::string(encode_utf8(cps, size_t(idx), size_t(idx) + 1));
  }
  return Value::undefined(std::string("'") + type_name(obj) + " object' has no item " + repr(key) + "; it");
}

// Python's slice indices (start, stop, step with None defaults).
std::vector<int64_t> slice_indices(int64_t n, const Value& a, const Value& b, const Value& c, int line) {
  auto opt = [&](const Value& v) -> std::optional<int64_t> {
    if (v.is_undefined() || v.kind == Kind::none) return std::nullopt;
    if (v.kind != Kind::integer && v.kind != Kind::boolean) fail(line, "slice indices must be integers or None");
    return as_int(v);
  };
  const int64_t step = opt(c).value_or(1);
  if (step == 0) fail(line, "slice step cannot be zero");
  auto clamp = [&](std::optional<int64_t> v, int64_t def) {
    if (!v) return def;
    int64_t x = *v;
    if (x < 0) x += n;
    if (step > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t start = clamp(opt(a), step > 0 ? 0 : n - 1), stop = clamp(opt(b), step > 0 ? n : -1);
  std::vector<int64_t> out;
  if (step > 0)
    for (int64_t k = start; k < stop; k += step) out.push_back(k);
  else
    for (int64_t k = start; k > stop; k += step) out.push_back(k);
  return out;
}

int64_t checked(__int128 v, int line) {
  if (v > INT64_MAX || v < INT64_MIN) fail(line, "integer overflow (dew's chat templates use 64-bit integers)");
  return int64_t(v);
}

Value arith(const std::string& op, const Value& a, const Value& b, int line) {
  if (a.is_undefined()) undefined_error(a, line);
  if (b.is_undefined()) undefined_error(b, line);
  if (op == "~") return Value::string(to_str(a) + to_str(b));
  const bool num = a.is_number() && b.is_number();
  const bool flt = num && (a.kind == Kind::floating || b.kind == Kind::floating);
  auto type_err = [&]() -> Value {
    fail(line, "unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" + type_name(b) + "'");
  };
  if (op == "+") {
    if (a.kind == Kind::string && b.kind == Kind::string) return Value::string(a.s + b.s);
    if (a.kind == Kind::list && b.kind == Kind::list && a.tuple == b.tuple) {
      List l = *a.list;
      l.insert(l.end(), b.list->begin(), b.list->end());
      return Value::make_list(std::move(l), a.tuple);
    }
    if (a.kind == Kind::string || b.kind == Kind::string)
      fail(line,
           std::string("can only concatenate str (not \"") + type_name(a.kind == Kind::string ? b : a) + "\") to str");
    if (!num) return type_err();
    return flt ? Value::floating(as_double(a) + as_double(b))
               : Value::integer(checked(__int128(as_int(a)) + as_int(b), line));
  }
  if (op == "*") {
    const Value* seq = a.kind == Kind::string || a.kind == Kind::list   ? &a
                       : b.kind == Kind::string || b.kind == Kind::list ? &b
                                                                        : nullptr;
    const Value* cnt = seq == &a ? &b : &a;
    if (seq && (cnt->kind == Kind::integer || cnt->kind == Kind::boolean)) {
      const int64_t n = std::max<int64_t>(0, as_int(*cnt));
      if (seq->kind == Kind::string) {
        std::string r;
        for (int64_t k = 0; k < n; ++k) r += seq->s;
        return Value::string(r);
      }
      List l;
      for (int64_t k = 0; k < n; ++k) l.insert(l.end(), seq->list->begin(), seq->list->end());
      return Value::make_list(l, seq->tuple);
    }
    if (!num) return type_err();
    return flt ? Value::floating(as_double(a) * as_double(b))
               : Value::integer(checked(__int128(as_int(a)) * as_int(b), line));
  }
  if (!num) {
    if (op == "%" && a.kind == Kind::string) fail(line, "'%' string formatting is not supported");
    return type_err();
  }
  if (op == "-")
    return flt ? Value::floating(as_double(a) - as_double(b))
               : Value::integer(checked(__int128(as_int(a)) - as_int(b), line));
  if (op == "/") {
    if (as_double(b) == 0) fail(line, "division by zero");
    return Value::floating(as_double(a) / as_double(b));
  }
  if (op == "//" || op == "%") {
    if (flt) {
      const double x = as_double(a), y = as_double(b);
      if (y == 0) fail(line, op == "//" ? "float floor division by zero" : "float modulo");
      const double m = std::fmod(x, y);
      const double mod = (m != 0 && ((m < 0) != (y < 0))) ? m + y : m;
      return op == "%" ? Value::floating(mod) : Value::floating(std::floor((x - mod) / y + 0.5));
    }
    const int64_t x = as_int(a), y = as_int(b);
    if (y == 0) fail(line, op == "//" ? "integer division or modulo by zero" : "integer modulo by zero");
    if (y == -1) {  // x / -1 traps for the least int64 (SIGFPE); x % -1 is 0
      if (op == "%") return Value::integer(0);
      return Value::integer(int64_t(checked(-__int128(x), line)));
    }
    int64_t q = x / y, r = x % y;
    if (r != 0 && ((r < 0) != (y < 0))) {
      --q;
      r += y;
    }
    return op == "%" ? Value::integer(r) : Value::integer(q);
  }
  if (op == "**") {
    if (!flt && as_int(b) >= 0) {  // by squaring: an exponent of 2^63 is 63 steps, not 2^63
      const int64_t base = as_int(a);
      if (base == 0 || base == 1) return Value::integer(as_int(b) == 0 ? 1 : base);
      if (base == -1) return Value::integer(as_int(b) % 2 == 0 ? 1 : -1);
      __int128 r = 1, p = base;
      for (int64_t e = as_int(b);;) {  // |base| >= 2: e > 63 overflows (checked) before long
        if (e & 1) r = checked(r * p, line);
        e >>= 1;
        if (e == 0) break;
        p = checked(p * p, line);
      }
      return Value::integer(int64_t(r));
    }
    return Value::floating(std::pow(as_double(a), as_double(b)));
  }
  return type_err();
}

bool contains(const Value& container, const Value& item, int line) {
  if (container.kind == Kind::string) {
    if (item.kind != Kind::string)
      fail(line, std::string("'in <string>' requires string as left operand, not ") + type_name(item));
    return container.s.find(item.s) != std::string::npos;
  }
  if (container.kind == Kind::list) {
    for (const Value& v : *container.list)
      if (equal(v, item)) return true;
    return false;
  }
  if (container.kind == Kind::dict && !container.ns) return item.kind == Kind::string && container.dict->find(item.s);
  if (container.is_undefined()) undefined_error(container, line);
  fail(line, std::string("argument of type '") + type_name(container) + "' is not iterable");
}

Args eval_args(Renderer& r, const Expr& e, Scope& s, size_t skip) {
  Args a;
  for (size_t k = skip; k < e.children.size(); ++k) a.positional.push_back(r.eval(*e.children[k], s));
  for (const auto& kv : e.kwargs) a.named.emplace_back(kv.first, r.eval(*kv.second, s));
  return a;
}

Value Renderer::eval(const Expr& e, Scope& s) {
  switch (e.kind) {
    case ExprKind::literal:
      return e.literal;
    case ExprKind::name: {
      const Value* v = s.lookup(e.name);
      return v ? *v : Value::undefined("'" + e.name + "'");
    }
    case ExprKind::list:
    case ExprKind::tuple: {
      List l;
      for (const auto& c : e.children) l.push_back(eval(*c, s));
      return Value::make_list(std::move(l), e.kind == ExprKind::tuple);
    }
    case ExprKind::dict: {
      Value d = Value::make_dict();
      for (size_t k = 0; k + 1 < e.children.size(); k += 2) {
        Value key = eval(*e.children[k], s);
        if (key.kind != Kind::string) fail(e.line, "dict keys must be strings in dew's chat templates");
        d.dict->set(key.s, eval(*e.children[k + 1], s));
      }
      return d;
    }
    case ExprKind::attr:
      return get_attr(eval(*e.children[0], s), e.name, e.line);
    case ExprKind::item:
      return get_item(eval(*e.children[0], s), eval(*e.children[1], s), e.line);
    case ExprKind::slice: {
      const Value obj = eval(*e.children[0], s);
      Value parts[3];
      for (int k = 0; k < 3; ++k)
        if (e.children[size_t(k) + 1]) parts[k] = eval(*e.children[size_t(k) + 1], s);
      if (obj.kind == Kind::list) {
        List l;
        for (int64_t k : slice_indices(int64_t(obj.list->size()), parts[0], parts[1], parts[2], e.line))
          l.push_back((*obj.list)[size_t(k)]);
        return Value::make_list(std::move(l), obj.tuple);
      }
      if (obj.kind == Kind::string) {
        const std::vector<uint32_t> cps = decode_utf8(obj.s);
        std::string out;
        for (int64_t k : slice_indices(int64_t(cps.size()), parts[0], parts[1], parts[2], e.line))
          append_utf8(out, cps[size_t(k)]);
        return Value::string(out);
      }
      if (obj.is_undefined()) undefined_error(obj, e.line);
      fail(e.line, std::string("'") + type_name(obj) + "' object is not subscriptable");
    }
    case ExprKind::call: {
      const Value f = eval(*e.children[0], s);
      return call_value(f, eval_args(*this, e, s, 1), e.line);
    }
    case ExprKind::filter: {
      const Value v = eval(*e.children[0], s);
      return apply_filter(e.name, v, eval_args(*this, e, s, 1), e.line, s);
    }
    case ExprKind::test: {
      const Value v = eval(*e.children[0], s);
      const bool r = apply_test(e.name, v, eval_args(*this, e, s, 1), e.line);
      return Value::boolean(e.negated ? !r : r);
    }
    case ExprKind::unary: {
      const Value v = eval(*e.children[0], s);
      if (e.name == "not") return Value::boolean(!truthy(v));
      if (v.is_undefined()) undefined_error(v, e.line);
      if (!v.is_number())
        fail(e.line, std::string("bad operand type for unary ") + e.name + ": '" + type_name(v) + "'");
      if (e.name == "+") return v.kind == Kind::boolean ? Value::integer(as_int(v)) : v;
      return v.kind == Kind::floating ? Value::floating(-v.f) : Value::integer(checked(-__int128(as_int(v)), e.line));
    }
    case ExprKind::binary: {
      const Value a = eval(*e.children[0], s), b = eval(*e.children[1], s);
      const std::string& op = e.name;
      if (op == "==") return Value::boolean(equal(a, b));
      if (op == "!=") return Value::boolean(!equal(a, b));
      if (op == "<" || op == ">" || op == "<=" || op == ">=") {
        if (a.is_undefined()) undefined_error(a, e.line);
        if (b.is_undefined()) undefined_error(b, e.line);
        const int c = compare(a, b, e.line, op.c_str());
        return Value::boolean(op == "<" ? c < 0 : op == ">" ? c > 0 : op == "<=" ? c <= 0 : c >= 0);
      }
      if (op == "in") return Value::boolean(contains(b, a, e.line));
      if (op == "not in") return Value::boolean(!contains(b, a, e.line));
      return arith(op, a, b, e.line);
    }
    case ExprKind::conditional: {
      if (truthy(eval(*e.children[0], s))) return eval(*e.children[1], s);
      if (e.children[2]) return eval(*e.children[2], s);
      return Value::undefined("the else branch of a conditional expression");
    }
    case ExprKind::logic: {
      Value a = eval(*e.children[0], s);
      if (e.name == "and") return truthy(a) ? eval(*e.children[1], s) : a;
      return truthy(a) ? a : eval(*e.children[1], s);
    }
  }
  fail(e.line, "internal error: unknown expression");
}

Value Renderer::call_value(const Value& f, const Args& a, int line) {
  if (f.kind != Kind::callable) {
    if (f.is_undefined()) undefined_error(f, line);
    fail(line, std::string("'") + type_name(f) + "' object is not callable");
  }
  return f.fn->call(a, *this, line);
}

Value attribute_of(Renderer& r, const Value& item, const std::string& path, int line) {
  Value v = item;
  size_t start = 0;
  for (;;) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    bool all_digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = all_digits ? r.get_item(v, Value::integer(std::atoll(part.c_str())), line)
                   : r.get_item(v, Value::string(part), line);
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

Value Renderer::apply_filter(const std::string& name, const Value& v, const Args& a, int line, Scope& s) {
  auto arg = [&](size_t pos, const char* n) -> const Value* { return a.get(pos, n); };
  // sort's and unique's key: the item (or its `attribute`), strings lower-cased unless case_sensitive.
  auto sort_key = [this](const Value* case_sensitive, const Value* attribute, int at) {
    const bool keep_case = case_sensitive && truthy(*case_sensitive);
    return [this, keep_case, attribute, at](const Value& x) {
      Value k = attribute ? attribute_of(*this, x, to_str(*attribute), at) : x;
      if (!keep_case && k.kind == Kind::string) k.s = ascii_map(k.s, ::tolower);
      return k;
    };
  };
  auto need_iterable = [&](const Value& x) -> List {
    if (x.is_undefined()) undefined_error(x, line);
    return iterate(x, line);
  };
  if (name == "safe" || name == "e" || name == "escape") {
    if (name != "safe") fail(line, "the escape filter is not supported (chat templates render without autoescape)");
    return v;
  }
  if (name == "trim") {
    if (v.is_undefined()) return Value::string("");
    return Value::string(py_strip(to_str(v), opt_string(a, 0, "chars", line), true, true));
  }
  if (name == "length" || name == "count") {
    if (v.kind == Kind::string) return Value::integer(py_len(v.s));
    if (v.kind == Kind::list) return Value::integer(int64_t(v.list->size()));
    if (v.kind == Kind::dict) return Value::integer(int64_t(v.dict->items.size()));
    if (v.is_undefined()) return Value::integer(0);
    fail(line, std::string("object of type '") + type_name(v) + "' has no len()");
  }
  if (name == "tojson") {
    JsonStyle st;
    if (const Value* ind = arg(0, "indent"); ind && ind->kind != Kind::none) {
      if (ind->kind != Kind::integer) fail(line, "tojson: indent must be an integer");
      st.indent = int(ind->i);
      st.item_sep = ",";
    }
    if (const Value* sep = arg(1, "separators"); sep && sep->kind != Kind::none) {
      if (sep->kind != Kind::list || sep->list->size() != 2) fail(line, "tojson: separators must be a pair of strings");
      st.item_sep = need_string((*sep->list)[0], line, "separators");
      st.key_sep = need_string((*sep->list)[1], line, "separators");
    }
    if (const Value* sk = arg(2, "sort_keys")) st.sort_keys = truthy(*sk);
    if (const Value* ea = arg(3, "ensure_ascii"); ea && truthy(*ea))
      fail(line, "tojson: ensure_ascii=True is not supported");
    std::string out;
    to_json(out, v, st, 0, line);
    return Value::string(out);
  }
  if (name == "string") return Value::string(to_str(v));
  if (name == "title") return Value::string(jinja_title(to_str(v)));  // the filter's own rule, not str.title
  if (name == "lower" || name == "upper" || name == "capitalize") {
    return call_value(method(Value::string(to_str(v)), name), Args{}, line);
  }
  if (name == "replace") {
    if (a.positional.size() < 2) fail(line, "replace needs the old and the new string");
    const Value* c = arg(2, "count");
    return Value::string(py_replace(to_str(v), need_string(a.positional[0], line, "replace's old"),
                                    need_string(a.positional[1], line, "replace's new"), c ? as_int(*c) : -1));
  }
  if (name == "default" || name == "d") {
    const Value* dv = arg(0, "default_value");
    const Value* boolean = arg(1, "boolean");
    const bool use = v.is_undefined() || (boolean && truthy(*boolean) && !truthy(v));
    if (!use) return v;
    return dv ? *dv : Value::string("");
  }
  if (name == "join") {
    const List items = need_iterable(v);
    const Value* sep = arg(0, "d");
    const Value* attr = arg(1, "attribute");
    std::string d = sep ? to_str(*sep) : "";
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) {
      out += (k ? d : "") + to_str(attr ? attribute_of(*this, items[k], to_str(*attr), line) : items[k]);
    }
    return Value::string(out);
  }
  if (name == "first" || name == "last") {
    const List items = need_iterable(v);
    if (items.empty()) return Value::undefined("the " + name + " item of an empty sequence");
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(need_iterable(v));
  if (name == "items" || name == "dictsort") {
    if (v.is_undefined()) return Value::make_list({});
    if (v.kind != Kind::dict || v.ns) fail(line, "the " + name + " filter needs a mapping");
    List out;
    for (const auto& kv : v.dict->items) out.push_back(Value::make_list({Value::string(kv.first), kv.second}, true));
    if (name == "dictsort") {  // dictsort(case_sensitive=false, by='key', reverse=false), as jinja2's
      const Value* cs = arg(0, "case_sensitive");
      const Value* by = arg(1, "by");
      const Value* rev = arg(2, "reverse");
      const std::string by_what = by ? to_str(*by) : "key";
      if (by_what != "key" && by_what != "value") fail(line, "You can only sort by either \"key\" or \"value\"");
      const size_t pos = by_what == "key" ? 0 : 1;
      const bool case_sensitive = cs && truthy(*cs), reverse = rev && truthy(*rev);
      auto key = [&](const Value& item) {
        Value k = (*item.list)[pos];
        if (!case_sensitive && k.kind == Kind::string) k.s = ascii_map(k.s, ::tolower);
        return k;
      };
      // sorted(reverse=True) keeps equal items in their order: a stable sort on the reversed comparison.
      std::stable_sort(out.begin(), out.end(), [&](const Value& x, const Value& y) {
        return reverse ? compare(key(y), key(x), line, "<") < 0 : compare(key(x), key(y), line, "<") < 0;
      });
    }
    return Value::make_list(out);
  }
  if (name == "reverse") {
    if (v.kind == Kind::string) {
      std::vector<uint32_t> cps = decode_utf8(v.s);
      std::reverse(cps.begin(), cps.end());
      return Value::string(encode_utf8(cps));
    }
    List items = need_iterable(v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(items);
  }
  if (name == "sort") {
    List items = need_iterable(v);
    const Value* rev = arg(0, "reverse");
    const Value* attr = arg(2, "attribute");
    const auto key = sort_key(arg(1, "case_sensitive"), attr, line);
    std::stable_sort(items.begin(), items.end(),
                     [&](const Value& x, const Value& y) { return compare(key(x), key(y), line, "<") < 0; });
    if (rev && truthy(*rev)) {
      // Python's sorted(reverse=True) keeps equal items in order.
      std::stable_sort(items.begin(), items.end(),
                       [&](const Value& x, const Value& y) { return compare(key(x), key(y), line, "<") > 0; });
    }
    return Value::make_list(items);
  }
  if (name == "unique") {  // unique(case_sensitive=false, attribute=none): the first of each key, in order
    const auto key = sort_key(arg(0, "case_sensitive"), arg(1, "attribute"), line);
    List out, keys;
    for (const Value& x : need_iterable(v)) {
      const Value k = key(x);
      bool seen = false;
      for (const Value& y : keys) seen = seen || equal(k, y);
      if (!seen) {
        out.push_back(x);
        keys.push_back(k);
      }
    }
    return Value::make_list(out);
  }
  if (name == "int") {  // int(default=0, base=10), as jinja2: int(value, base) for strings, then int(float(value))
    const Value* dflt = arg(0, "default");
    const Value* base = arg(1, "base");
    auto from_double = [&](double d) {
      if (std::isinf(d)) fail(line, "cannot convert float infinity to integer");
      if (std::isnan(d)) return dflt ? *dflt : Value::integer(0);
      if (!(std::fabs(d) < 9.3e18)) fail(line, "integer overflow (dew's chat templates use 64-bit integers)");
      return Value::integer(int64_t(d));
    };
    if (v.kind == Kind::integer) return v;
    if (v.kind == Kind::boolean) return Value::integer(as_int(v));
    if (v.kind == Kind::floating) return from_double(v.f);
    if (v.kind == Kind::string) {
      if (const auto x = py_int(v.s, base ? as_int(*base) : 10, line)) return Value::integer(*x);
      if (const auto d = py_float(v.s)) return from_double(*d);
    }
    return dflt ? *dflt : Value::integer(0);
  }
  if (name == "float") {
    if (v.is_number()) return Value::floating(as_double(v));
    if (v.kind == Kind::string)
      if (const auto d = py_float(v.s)) return Value::floating(*d);
    const Value* dflt = arg(0, "default");
    return dflt ? *dflt : Value::floating(0.0);
  }
  if (name == "abs") {
    if (v.kind == Kind::floating) return Value::floating(std::fabs(v.f));
    if (v.kind == Kind::integer || v.kind == Kind::boolean)
      return Value::integer(int64_t(checked(as_int(v) < 0 ? -__int128(as_int(v)) : __int128(as_int(v)), line)));
    fail(line, std::string("bad operand type for abs(): '") + type_name(v) + "'");
  }
  if (name == "round") {
    fail(line, "the round filter is not supported");
  }
  if (name == "sum") {
    Value total = Value::integer(0);
    if (const Value* st = arg(1, "start")) total = *st;
    const Value* attr = arg(0, "attribute");
    for (const Value& x : need_iterable(v))
      total = arith("+", total, attr ? attribute_of(*this, x, to_str(*attr), line) : x, line);
    return total;
  }
  if (name == "max" || name == "min") {
    const List items = need_iterable(v);
    if (items.empty()) return Value::undefined("the " + name + " of an empty sequence");
    const Value* attr = arg(1, "attribute");
    auto key = [&](const Value& x) { return attr ? attribute_of(*this, x, to_str(*attr), line) : x; };
    Value best = items[0];
    for (size_t k = 1; k < items.size(); ++k) {
      const int c = compare(key(items[k]), key(best), line, "<");
      if (name == "max" ? c > 0 : c < 0) best = items[k];
    }
    return best;
  }
  if (name == "indent") {
    // jinja2's do_indent: the text + "\n" split with splitlines(), rejoined with "\n" + the indent.
    const Value* w = arg(0, "width");
    const Value* first = arg(1, "first");
    const Value* blank = arg(2, "blank");
    const std::string pad =
        w ? (w->kind == Kind::string ? w->s : std::string(size_t(std::max<int64_t>(0, as_int(*w))), ' '))
          : std::string(4, ' ');
    const std::vector<std::string> lines = py_splitlines(to_str(v) + "\n");
    std::string out;
    if (blank && truthy(*blank)) {
      for (size_t k = 0; k < lines.size(); ++k) out += (k ? "\n" + pad : "") + lines[k];
    } else {
      out = lines.empty() ? "" : lines[0];
      for (size_t k = 1; k < lines.size(); ++k) out += "\n" + (lines[k].empty() ? "" : pad) + lines[k];
    }
    if (first && truthy(*first)) out = pad + out;
    return Value::string(out);
  }
  if (name == "map") {
    const List items = need_iterable(v);
    List out;
    if (const Value* attr = a.get(size_t(-1), "attribute")) {
      const Value* dflt = a.get(size_t(-1), "default");
      for (const Value& x : items) {
        Value y = attribute_of(*this, x, to_str(*attr), line);
        out.push_back(y.is_undefined() && dflt ? *dflt : y);
      }
      return Value::make_list(out);
    }
    if (a.positional.empty()) fail(line, "map needs a filter name or attribute=");
    const std::string f = need_string(a.positional[0], line, "map's filter");
    if (!known_filters().count(f)) fail(line, "the filter '" + f + "' is not supported");
    Args rest;
    rest.positional.assign(a.positional.begin() + 1, a.positional.end());
    rest.named = a.named;
    for (const Value& x : items) out.push_back(apply_filter(f, x, rest, line, s));
    return Value::make_list(out);
  }
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    const bool by_attr = name == "selectattr" || name == "rejectattr";
    const bool keep_true = name == "select" || name == "selectattr";
    const List items = need_iterable(v);
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (a.positional.empty()) fail(line, name + " needs an attribute name");
      attr = need_string(a.positional[k++], line, "the attribute");
    }
    std::string test;
    if (k < a.positional.size()) test = need_string(a.positional[k++], line, "the test");
    if (!test.empty() && !known_tests().count(test)) fail(line, "the test '" + test + "' is not supported");
    Args rest;
    rest.positional.assign(a.positional.begin() + long(k), a.positional.end());
    List out;
    for (const Value& x : items) {
      const Value subject = by_attr ? attribute_of(*this, x, attr, line) : x;
      const bool t = test.empty() ? truthy(subject) : apply_test(test, subject, rest, line);
      if (t == keep_true) out.push_back(x);
    }
    return Value::make_list(out);
  }
  fail(line, "the filter '" + name + "' is not supported");
}

bool Renderer::apply_test(const std::string& name, const Value& v, const Args& a, int line) {
  auto other = [&]() -> const Value& {
    if (a.positional.empty()) fail(line, "the test '" + name + "' needs an argument");
    return a.positional[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.kind == Kind::none;
  if (name == "boolean") return v.kind == Kind::boolean;
  if (name == "true") return v.kind == Kind::boolean && v.b;
  if (name == "false") return v.kind == Kind::boolean && !v.b;
  if (name == "integer") return v.kind == Kind::integer;
  if (name == "float") return v.kind == Kind::floating;
  if (name == "number") return v.is_number();
  if (name == "string") return v.kind == Kind::string;
  if (name == "mapping") return v.kind == Kind::dict && !v.ns;
  if (name == "iterable") return v.kind == Kind::string || v.kind == Kind::list || (v.kind == Kind::dict && !v.ns);
  if (name == "sequence") return v.kind == Kind::string || v.kind == Kind::list || (v.kind == Kind::dict && !v.ns);
  if (name == "callable") return v.kind == Kind::callable;
  if (name == "escaped") return false;
  if (name == "lower")
    return v.kind == Kind::string && ascii_map(v.s, ::tolower) == v.s && v.s != ascii_map(v.s, ::toupper);
  if (name == "upper")
    return v.kind == Kind::string && ascii_map(v.s, ::toupper) == v.s && v.s != ascii_map(v.s, ::tolower);
  if (name == "odd" || name == "even") {
    if (v.kind != Kind::integer && v.kind != Kind::boolean) fail(line, "the test '" + name + "' needs an integer");
    const int64_t x = as_int(v);
    return name == "odd" ? (x % 2 != 0) : (x % 2 == 0);
  }
  if (name == "divisibleby") {
    const Value& d = other();
    if (as_int(d) == 0) fail(line, "divisibleby 0");
    return as_int(v) % as_int(d) == 0;
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, other());
  if (name == "ne" || name == "!=") return !equal(v, other());
  if (name == "sameas") {
    const Value& o = other();
    if (v.kind != o.kind) return false;
    if (v.kind == Kind::none || v.kind == Kind::undefined) return true;
    if (v.kind == Kind::boolean) return v.b == o.b;
    if (v.kind == Kind::list) return v.list == o.list;
    if (v.kind == Kind::dict) return v.dict == o.dict;
    return false;
  }
  if (name == "in") return contains(other(), v, line);
  const int c = compare(v, other(), line, name.c_str());
  if (name == "lt" || name == "lessthan" || name == "<") return c < 0;
  if (name == "le" || name == "<=") return c <= 0;
  if (name == "gt" || name == "greaterthan" || name == ">") return c > 0;
  if (name == "ge" || name == ">=") return c >= 0;
  fail(line, "the test '" + name + "' is not supported");
}

void assign(Scope& s, const std::vector<std::string>& names, const Value& v, int line) {
  if (names.size() == 1) {
    s.vars[names[0]] = v;
    return;
  }
  const List items = iterate(v, line);
  if (items.size() != names.size())
    fail(line,
         "cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(names.size()) + " names");
  for (size_t k = 0; k < names.size(); ++k) s.vars[names[k]] = items[k];
}

void Renderer::exec(const Body& body, Scope& s) {
  for (const NodePtr& np : body) {
    const Node& n = *np;
    switch (n.kind) {
      case NodeKind::text:
        out += n.text;
        break;
      case NodeKind::output:
        out += to_str(eval(*n.expr, s));
        break;
      case NodeKind::if_:
        for (const auto& br : n.branches) {
          if (!br.first || truthy(eval(*br.first, s))) {
            exec(br.second, s);
            break;
          }
        }
        break;
      case NodeKind::for_: {
        const Value seq = eval(*n.expr, s);
        if (seq.is_undefined()) undefined_error(seq, n.line);
        List items = iterate(seq, n.line);
        if (n.loop_filter) {
          List kept;
          for (const Value& it : items) {
            Scope fs;
            fs.parent = &s;
            assign(fs, n.targets, it, n.line);
            if (truthy(eval(*n.loop_filter, fs))) kept.push_back(it);
          }
          items = std::move(kept);
        }
        if (items.empty()) {
          exec(n.else_body, s);
          break;
        }
        const int64_t len = int64_t(items.size());
        bool broke = false;
        for (int64_t k = 0; k < len && !broke; ++k) {
          Scope iter;
          iter.parent = &s;
          Value loop = Value::make_dict();
          loop.dict->set("index", Value::integer(k + 1));
          loop.dict->set("index0", Value::integer(k));
          loop.dict->set("revindex", Value::integer(len - k));
          loop.dict->set("revindex0", Value::integer(len - k - 1));
          loop.dict->set("first", Value::boolean(k == 0));
          loop.dict->set("last", Value::boolean(k == len - 1));
          loop.dict->set("length", Value::integer(len));
          loop.dict->set("depth", Value::integer(1));
          loop.dict->set("depth0", Value::integer(0));
          loop.dict->set("previtem", k > 0 ? items[size_t(k - 1)] : Value::undefined("loop.previtem"));
          loop.dict->set("nextitem", k + 1 < len ? items[size_t(k + 1)] : Value::undefined("loop.nextitem"));
          const int64_t idx = k;
          loop.dict->set("cycle", make_builtin("loop.cycle", [idx](const Args& a, Renderer&, int line) {
                           if (a.positional.empty()) fail(line, "loop.cycle needs at least one value");
                           return a.positional[size_t(idx) % a.positional.size()];
                         }));
          iter.vars["loop"] = loop;
          assign(iter, n.targets, items[size_t(k)], n.line);
          try {
            exec(n.body, iter);
          } catch (const BreakSignal&) {
            broke = true;
          } catch (const ContinueSignal&) {
          }
        }
        break;
      }
      case NodeKind::set: {
        const Value v = eval(*n.expr, s);
        if (n.attr_target) {
          const Value* target = s.lookup(n.targets[0]);
          if (!target || target->kind != Kind::dict || !target->ns)
            fail(n.line, "cannot assign attribute on non-namespace object '" + n.targets[0] + "'");
          target->dict->set(n.targets[1], v);
        } else {
          assign(s, n.targets, v, n.line);
        }
        break;
      }
      case NodeKind::set_block: {
        std::string saved;
        saved.swap(out);
        const size_t nspans = spans.size();
        exec(n.body, s);
        spans.resize(nspans);  // generation spans inside a captured block are not spans of the output
        std::string captured;
        captured.swap(out);
        out = std::move(saved);
        s.vars[n.targets[0]] = Value::string(captured);
        break;
      }
      case NodeKind::macro: {
        const Node* node = &n;
        Scope* defining = &s;
        s.vars[n.text] = make_builtin(n.text, [node, defining](const Args& a, Renderer& r, int line) {
          if (a.positional.size() > node->params.size())
            fail(line, "macro '" + node->text + "' takes " + std::to_string(node->params.size()) + " arguments");
          Scope call;
          call.parent = defining;
          for (size_t k = 0; k < node->params.size(); ++k) {
            const Value* given = nullptr;
            if (k < a.positional.size()) given = &a.positional[k];
            for (const auto& kv : a.named)
              if (kv.first == node->params[k].first) given = &kv.second;
            if (given) {
              call.vars[node->params[k].first] = *given;
            } else if (node->params[k].second) {
              call.vars[node->params[k].first] = r.eval(*node->params[k].second, call);
            } else {
              call.vars[node->params[k].first] = Value::undefined("'" + node->params[k].first + "'");
            }
          }
          for (const auto& kv : a.named) {
            bool known = false;
            for (const auto& p : node->params) known = known || p.first == kv.first;
            if (!known) fail(line, "macro '" + node->text + "' takes no keyword argument '" + kv.first + "'");
          }
          if (++r.depth > 64) fail(line, "macros nest deeper than 64 calls");
          std::string saved;
          saved.swap(r.out);
          const size_t nspans = r.spans.size();
          r.exec(node->body, call);
          r.spans.resize(nspans);
          std::string produced;
          produced.swap(r.out);
          r.out = std::move(saved);
          --r.depth;
          return Value::string(produced);
        });
        break;
      }
      case NodeKind::break_:
        throw BreakSignal{};
      case NodeKind::continue_:
        throw ContinueSignal{};
      case NodeKind::generation: {
        const int64_t begin = int64_t(out.size());
        exec(n.body, s);
        spans.emplace_back(begin, int64_t(out.size()));
        break;
      }
    }
  }
}

void add_globals(Scope& g) {
  g.vars["raise_exception"] = make_builtin("raise_exception", [](const Args& a, Renderer&, int line) -> Value {
    fail(line, "raise_exception: " + (a.positional.empty() ? std::string() : to_str(a.positional[0])));
  });
  g.vars["namespace"] = make_builtin("namespace", [](const Args& a, Renderer&, int line) {
    Value ns = Value::make_dict();
    ns.ns = true;
    for (const Value& p : a.positional) {
      if (p.kind != Kind::dict) fail(line, "namespace() takes keyword arguments or a mapping");
      for (const auto& kv : p.dict->items) ns.dict->set(kv.first, kv.second);
    }
    for (const auto& kv : a.named) ns.dict->set(kv.first, kv.second);
    return ns;
  });
  g.vars["dict"] = make_builtin("dict", [](const Args& a, Renderer&, int) {
    Value d = Value::make_dict();
    for (const auto& kv : a.named) d.dict->set(kv.first, kv.second);
    return d;
  });
  g.vars["range"] = make_builtin("range", [](const Args& a, Renderer&, int line) {
    int64_t start = 0, stop = 0, step = 1;
    for (const Value& v : a.positional)
      if (v.kind != Kind::integer) fail(line, "range() takes integers");
    if (a.positional.size() == 1) {
      stop = a.positional[0].i;
    } else if (a.positional.size() >= 2) {
      start = a.positional[0].i;
      stop = a.positional[1].i;
      if (a.positional.size() > 2) step = a.positional[2].i;
    } else {
      fail(line, "range() needs an argument");
    }
    if (step == 0) fail(line, "range() arg 3 must not be zero");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop; k += step) {
      out.push_back(Value::integer(k));
      if (out.size() > 100000) fail(line, "range() of more than 100,000 items");
    }
    return Value::make_list(out);
  });
  g.vars["strftime_now"] = make_builtin("strftime_now", [](const Args& a, Renderer&, int line) {
    if (a.positional.empty()) fail(line, "strftime_now needs a format");
    const std::time_t t = std::time(nullptr);
    std::tm tm{};
    localtime_r(&t, &tm);
    char buf[256];
    const size_t n = std::strftime(buf, sizeof buf, need_string(a.positional[0], line, "the format").c_str(), &tm);
    return Value::string(std::string(buf, n));
  });
}

}  // namespace jinja

// ---------------------------------------------------------------- the public class

struct ChatTemplate::Impl {
  std::string source, name;
  jinja::Body body;
  bool has_generation = false;
};

ChatTemplate::ChatTemplate(const std::string& source, std::string name) : impl_(std::make_unique<Impl>()) {
  impl_->source = source;
  impl_->name = std::move(name);
  jinja::Lexer lex;
  lex.src = source;
  lex.name = impl_->name;
  lex.run();
  jinja::Parser parser(lex.tokens, impl_->name);
  impl_->body = parser.parse_body({}, "", 1);
  impl_->has_generation = parser.has_generation;
}

ChatTemplate::~ChatTemplate() = default;
ChatTemplate::ChatTemplate(ChatTemplate&&) noexcept = default;
ChatTemplate& ChatTemplate::operator=(ChatTemplate&&) noexcept = default;

bool ChatTemplate::has_generation_tags() const { return impl_->has_generation; }
const std::string& ChatTemplate::name() const { return impl_->name; }
const std::string& ChatTemplate::source() const { return impl_->source; }

ChatRendering ChatTemplate::render(const std::string& context_json) const {
  nlohmann::ordered_json ctx;
  try {
    ctx = nlohmann::ordered_json::parse(context_json);
  } catch (const nlohmann::json::exception& e) {
    throw UsageError(impl_->name + ": the rendering context is not valid JSON: " + e.what());
  }
  if (!ctx.is_object()) throw UsageError(impl_->name + ": the rendering context must be a JSON object");
  jinja::Scope globals;
  jinja::add_globals(globals);
  jinja::Scope top;
  top.parent = &globals;
  for (auto it = ctx.begin(); it != ctx.end(); ++it) top.vars[it.key()] = jinja::from_json(it.value());
  jinja::Renderer r;
  try {
    r.exec(impl_->body, top);
  } catch (const jinja::TemplateError& e) {
    throw UsageError(impl_->name + ":" + std::to_string(e.line) + ": " + e.message);
  } catch (const jinja::BreakSignal&) {
    throw UsageError(impl_->name + ": {% break %} outside a for loop");
  } catch (const jinja::ContinueSignal&) {
    throw UsageError(impl_->name + ": {% continue %} outside a for loop");
  }
  return {std::move(r.out), std::move(r.spans)};
}

}  // namespace dew
