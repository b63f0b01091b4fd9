/* tests/registry/plugins/undefined_symbol.c — a library with an unresolved symbol (built without
 * --no-undefined): loading it RTLD_NOW must fail at load time with the dynamic loader's reason. */
#include <dew/plugin.h>

extern int dew_test_symbol_that_does_not_exist(void);

static int register_all(void* registrar, char* err, size_t err_len) {
  (void)registrar, (void)err, (void)err_len;
  return dew_test_symbol_that_does_not_exist();
}

__attribute__((visibility("default"))) const dew_plugin_v1* dew_plugin_entry(void) {
  static const dew_plugin_v1 info = {DEW_PLUGIN_ABI_VERSION, "undefined_symbol", "0.1.0", DEW_BUILD_FINGERPRINT, "",
                                     &register_all};
  return &info;
}
