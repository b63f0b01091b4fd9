// tests/registry/plugins/wrong_algebra.cpp — a handshake identical to this build's except for the kernel
// algebra version in its fingerprint (a backend built against another kernel table: its vtable would not
// match). The host must refuse it with one line naming both versions, before calling register_all.
#include <dew/plugin.h>

#include <cstdlib>

namespace {
int register_all(void*, char*, size_t) { std::abort(); }  // never reached
}  // namespace

extern "C" __attribute__((visibility("default"))) const dew_plugin_v1* dew_plugin_entry(void) {
  static const dew_plugin_v1 info = {DEW_PLUGIN_ABI_VERSION,
                                     "wrong_algebra",
                                     "0.1.0",
                                     "dew-sdk " DEW_SDK_VERSION "; kernel-algebra 999; " DEW_COMPILER_ID
                                     "; " DEW_CXX_ABI_ID,
                                     "",
                                     &register_all};
  return &info;
}
