// entry.cpp — the `ref` plugin's registration and its supports() table.
// Invariant: supports() is honest: a kernel it accepts for a dtype runs for that dtype, and a kernel
// it declines throws dew::Error with the same reason (see dispatch_float in ref_backend.hpp).
#include <memory>

#include "dew/registry.hpp"
#include "ref_backend.hpp"

namespace dew::ref {

Support support_of(Kernel k, DType dtype) {
  switch (k) {
    // Byte movers and conversions: every dtype.
    case Kernel::fill:
    case Kernel::cast:
    case Kernel::strided_copy:
    case Kernel::gather_rows:
      return Support::yes();
    // Random numbers: any floating dtype (drawn in double, rounded on store).
    case Kernel::random:
      if (is_floating(dtype)) return Support::yes();
      return Support::no(std::string("random draws floating values; ") + dtype_name(dtype) + " is not floating");
    case Kernel::count_:
      return Support::no("not a kernel");
    default:
      break;
  }
  // Arithmetic kernels: f32 and f64 only.
  if (dtype == DType::f32 || dtype == DType::f64) return Support::yes();
  if (is_floating(dtype))
    return Support::no(std::string("ref computes ") + kernel_name(k) + " in f32 and f64 only; cast " +
                       dtype_name(dtype) + " inputs to f32 first");
  return Support::no(std::string(kernel_name(k)) + " needs a floating dtype (f32 or f64), got " + dtype_name(dtype));
}

}  // namespace dew::ref

DEW_PLUGIN("ref", "0.1.0") {
  registrar.add<dew::Backend>({
      .name = "ref",
      .description = "reference backend: plain loop-based C++ in f32/f64, accumulating in double; the test oracle",
      .factory = [](const dew::Options&) -> std::shared_ptr<dew::Backend> {
        return std::make_shared<dew::ref::RefBackend>();
      },
      .probe = {},    // runs wherever the plugin loads
      .options = {},  // takes no options
  });
}
