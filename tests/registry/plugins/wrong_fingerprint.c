/* tests/registry/plugins/wrong_fingerprint.c — a plugin written by hand in C with the right ABI but a
 * build fingerprint of another compiler and SDK. The host must refuse it before calling register_all. */
#include <dew/plugin.h>
#include <stdlib.h>

static int register_all(void* registrar, char* err, size_t err_len) {
  (void)registrar, (void)err, (void)err_len;
  abort(); /* never reached: the fingerprint check comes first */
}

__attribute__((visibility("default"))) const dew_plugin_v1* dew_plugin_entry(void) {
  static const dew_plugin_v1 info = {
      DEW_PLUGIN_ABI_VERSION, "wrong_fingerprint", "0.1.0", "dew-sdk 0.0.9; othercc 1.0; libstdc++ cxx11-abi 0", "",
      &register_all};
  return &info;
}
