/* tests/registry/plugins/no_entry.c — a shared library named like a plugin that exports no
 * dew_plugin_entry (only an unrelated symbol). */
__attribute__((visibility("default"))) int not_a_dew_plugin(void) { return 42; }
