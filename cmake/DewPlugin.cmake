# dew_add_plugin(<target> SOURCES <files...> [LIBRARIES <libs...>] [OUTPUT_DIR <dir>] [NO_INSTALL])
#
# Builds a dew plugin: a MODULE library (dlopen-only), hidden visibility, linked with a version script
# so that `dew_plugin_entry` is the only exported symbol, linked against dew::sdk (the SDK headers and
# libdew) and nothing of the core's private targets. Used in-tree and, through find_package(dew), by
# third-party plugins.
#
# The library is written to OUTPUT_DIR, else to DEW_PLUGIN_OUTPUT_DIR (in-tree: build/lib/dew/plugins,
# where build/bin/dew-run finds it), else to the current binary folder. Unless NO_INSTALL is given it is
# installed into <prefix>/lib/dew/plugins, the folder an installed dew-run searches. Every plugin is also
# listed in the global property DEW_PLUGIN_TARGETS (in-tree, the `dew_plugins` target builds them all).
function(dew_add_plugin target)
  cmake_parse_arguments(ARG "NO_INSTALL" "OUTPUT_DIR" "SOURCES;LIBRARIES" ${ARGN})
  add_library(${target} MODULE ${ARG_SOURCES})
  set_property(GLOBAL APPEND PROPERTY DEW_PLUGIN_TARGETS ${target})
  set_target_properties(${target} PROPERTIES
    PREFIX ""
    C_VISIBILITY_PRESET hidden
    CXX_VISIBILITY_PRESET hidden
    VISIBILITY_INLINES_HIDDEN ON
    POSITION_INDEPENDENT_CODE ON
    # installed next to <prefix>/lib/libdew.so as <prefix>/lib/dew/plugins/<target>.so
    INSTALL_RPATH "$ORIGIN/../..")
  target_compile_features(${target} PRIVATE cxx_std_20)  # the SDK headers are C++20
  if(TARGET dew::sdk)
    target_link_libraries(${target} PRIVATE dew::sdk)
  else()
    target_link_libraries(${target} PRIVATE dew_sdk)
  endif()
  if(ARG_LIBRARIES)
    target_link_libraries(${target} PRIVATE ${ARG_LIBRARIES})
  endif()
  set(_script ${CMAKE_CURRENT_BINARY_DIR}/${target}.exports.map)
  file(WRITE ${_script} "{\n  global: dew_plugin_entry;\n  local: *;\n};\n")
  target_link_options(${target} PRIVATE "LINKER:--version-script=${_script}" "LINKER:--no-undefined")
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${_script})
  if(ARG_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  elseif(DEFINED DEW_PLUGIN_OUTPUT_DIR)
    set_target_properties(${target} PROPERTIES LIBRARY_OUTPUT_DIRECTORY ${DEW_PLUGIN_OUTPUT_DIR})
  endif()
  if(NOT ARG_NO_INSTALL)
    install(TARGETS ${target} LIBRARY DESTINATION lib/dew/plugins COMPONENT plugins)
  endif()
endfunction()
