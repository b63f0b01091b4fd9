/* tests/registry/plugins/wrong_abi.c — a plugin written by hand in C whose handshake claims plugin
 * ABI 999. The host must refuse it before calling register_all (which would abort the test). */
#include <dew/plugin.h>
#include <stdlib.h>

static int register_all(void* registrar, char* err, size_t err_len) {
  (void)registrar, (void)err, (void)err_len;
  abort(); /* never reached: the ABI check comes first */
}

__attribute__((visibility("default"))) const dew_plugin_v1* dew_plugin_entry(void) {
  static const dew_plugin_v1 info = {999u, "wrong_abi", "0.1.0", DEW_BUILD_FINGERPRINT, "", &register_all};
  return &info;
}
