// core/precision/autocast.cpp — the per-thread autocast state and the precision names (dew/autocast.hpp).
#include "dew/autocast.hpp"

#include "dew/error.hpp"

namespace dew {

namespace {
thread_local DType g_autocast = DType::f32;
}

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::f32:
      return "f32";
    case Precision::bf16_mixed:
      return "bf16-mixed";
    case Precision::f16_mixed:
      return "f16-mixed";
  }
  return "?";
}

Precision precision_from_name(std::string_view s) {
  for (Precision p : {Precision::f32, Precision::bf16_mixed, Precision::f16_mixed})
    if (s == precision_name(p)) return p;
  DEW_USAGE_CHECK(false, "precision '", s, "' is not one of f32, bf16-mixed, f16-mixed");
  return Precision::f32;
}

DType autocast_dtype() { return g_autocast; }

AutocastGuard::AutocastGuard(DType half) : previous_(g_autocast) {
  DEW_CHECK(half == DType::f32 || half == DType::bf16 || half == DType::f16, "AutocastGuard: ", dtype_name(half),
            " is not f32, bf16 or f16");
  g_autocast = half;
}
AutocastGuard::~AutocastGuard() { g_autocast = previous_; }

}  // namespace dew
