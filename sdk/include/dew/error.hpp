// dew/error.hpp — the one error type of dew and the check macros that raise it.
//
// DEW_CHECK(cond, msg...)      a user or configuration error: throws dew::Error with file, line, message.
// DEW_CHECK_HINT(cond, hint, msg...)  the same, with a hint line telling the user what to do.
// DEW_INTERNAL_ASSERT(cond)    an invariant of dew itself: "internal error at file:line; please report".
// Messages are built by streaming the arguments (DEW_CHECK(n > 0, "n = ", n, " must be positive")).
// Error::kind() lets the launcher map errors to exit codes (usage/config = 2, runtime = 1).
#pragma once
#include <sstream>
#include <stdexcept>
#include <string>

namespace dew {

enum class ErrorKind { runtime, usage, internal };

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string message, std::string file = {}, int line = 0, std::string hint = {})
      : std::runtime_error(message), kind_(kind), file_(std::move(file)), line_(line), hint_(std::move(hint)) {}
  ErrorKind kind() const noexcept { return kind_; }
  const std::string& file() const noexcept { return file_; }
  int line() const noexcept { return line_; }
  const std::string& hint() const noexcept { return hint_; }
  // "message (file:line); hint: ..." — the one line a user sees.
  std::string describe() const;

 private:
  ErrorKind kind_;
  std::string file_;
  int line_;
  std::string hint_;
};

// Raised for mistakes a user made (bad config key or value, unknown plugin, missing file): exit code 2.
struct UsageError : Error {
  UsageError(std::string message, std::string file = {}, int line = 0, std::string hint = {})
      : Error(ErrorKind::usage, std::move(message), std::move(file), line, std::move(hint)) {}
};

namespace detail {
template <class... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}
[[noreturn]] void throw_error(ErrorKind kind, const char* file, int line, std::string msg, std::string hint);
}  // namespace detail

}  // namespace dew

#define DEW_CHECK(cond, ...)                                                                                        \
  do {                                                                                                              \
    if (!(cond)) [[unlikely]]                                                                                       \
      ::dew::detail::throw_error(::dew::ErrorKind::runtime, __FILE__, __LINE__, ::dew::detail::concat(__VA_ARGS__), \
                                 {});                                                                               \
  } while (0)

#define DEW_CHECK_HINT(cond, hint, ...)                                                                             \
  do {                                                                                                              \
    if (!(cond)) [[unlikely]]                                                                                       \
      ::dew::detail::throw_error(::dew::ErrorKind::runtime, __FILE__, __LINE__, ::dew::detail::concat(__VA_ARGS__), \
                                 hint);                                                                             \
  } while (0)

// A user mistake (config, command line, input files): the launcher exits with status 2.
#define DEW_USAGE_CHECK(cond, ...)                                                                                     \
  do {                                                                                                                 \
    if (!(cond)) [[unlikely]]                                                                                          \
      ::dew::detail::throw_error(::dew::ErrorKind::usage, __FILE__, __LINE__, ::dew::detail::concat(__VA_ARGS__), {}); \
  } while (0)

#define DEW_INTERNAL_ASSERT(cond)                                                        \
  do {                                                                                   \
    if (!(cond)) [[unlikely]]                                                            \
      ::dew::detail::throw_error(::dew::ErrorKind::internal, __FILE__, __LINE__,         \
                                 "internal error: " #cond " failed; please report", {}); \
  } while (0)
