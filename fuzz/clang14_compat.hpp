// fuzz/clang14_compat.hpp — lets clang-14 compile SDK headers that use std::source_location (dew/registry.hpp):
// libstdc++ 12 defines it only for compilers with __builtin_source_location, which clang gains in version 15.
// Include it first. The fuzz targets never call what uses it (a plugin's registration), so the stand-in's
// empty values are never seen.
#pragma once
#include <cstdint>
#include <version>
#if !defined(__cpp_lib_source_location) && !__has_builtin(__builtin_source_location)
namespace std {
struct source_location {
  static constexpr source_location current() noexcept { return {}; }
  constexpr const char* file_name() const noexcept { return ""; }
  constexpr const char* function_name() const noexcept { return ""; }
  constexpr uint_least32_t line() const noexcept { return 0; }
  constexpr uint_least32_t column() const noexcept { return 0; }
};
}  // namespace std
#endif
