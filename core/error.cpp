// core/error.cpp — dew::Error formatting and the throw helper behind the DEW_CHECK macros.
#include "dew/error.hpp"

#include <cstring>

namespace dew {

std::string Error::describe() const {
  std::string s = what();
  if (!file_.empty()) {
    const char* base = std::strrchr(file_.c_str(), '/');
    s += " (" + std::string(base ? base + 1 : file_.c_str()) + ":" + std::to_string(line_) + ")";
  }
  if (!hint_.empty()) s += "; hint: " + hint_;
  return s;
}

namespace detail {
void throw_error(ErrorKind kind, const char* file, int line, std::string msg, std::string hint) {
  if (kind == ErrorKind::usage) throw UsageError(std::move(msg), file, line, std::move(hint));
  throw Error(kind, std::move(msg), file, line, std::move(hint));
}
}  // namespace detail

}  // namespace dew
