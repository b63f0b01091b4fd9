#!/usr/bin/env bash
# tests/registry/exports_only_entry.sh PLUGIN.so — passes when the only symbol the plugin defines in its
# dynamic symbol table is dew_plugin_entry (dew_add_plugin's version script and hidden visibility).
set -eu
plugin=$1
syms=$(nm -D --defined-only "$plugin" | awk 'NF >= 3 { print $2 " " $3 }')
if [ "$syms" != "T dew_plugin_entry" ]; then
  echo "FAIL: $plugin exports:"
  printf '%s\n' "$syms"
  echo "expected only: T dew_plugin_entry"
  exit 1
fi
echo "$plugin exports only dew_plugin_entry"
