/* dew/plugin.h — the C handshake between dew and a plugin library (frozen; only ever appended to).
 *
 * A plugin exports exactly one symbol, `dew_plugin_entry`, returning a pointer to a static
 * dew_plugin_v1. The host checks abi_version and fingerprint before calling register_all with its
 * Registrar. No exception crosses this boundary: register_all returns 0, or non-zero with a
 * NUL-terminated message in err. C++ plugins write DEW_PLUGIN(...) from dew/registry.hpp instead of
 * filling this struct by hand. */
#ifndef DEW_PLUGIN_H
#define DEW_PLUGIN_H
#include <stddef.h>
#include <stdint.h>

#define DEW_PLUGIN_ABI_VERSION 1u
/* The SDK: bumped when a type shared with plugins changes (0.4.0: DType::i8 and TensorImpl::scales, quantized
 * int8 tensors; 0.5.0: Backend's device clock, device_mark and friends; 0.6.0: TensorImpl::panel and
 * Backend::decode_panel_rows, decode weights in panels; 0.7.0: Backend::operand_reuse; 0.8.0: autograd's Edge in
 * Node::inputs, Objective::before_adapters_merged, nn::LoraAdaptersOff; 0.9.0: RopeParams::scaling and
 * AttentionConfig::rope_scaling, rotary scaling; 0.10.0: dew/reward.hpp's Reward and Completion (the registry kind
 * "reward"), dew/policy.hpp; 0.11.0: Objective::loss_is_token_mean; 0.12.0: SlotCache::copy_prefix, copy() no
 * longer virtual; SamplingParams::logprobs and prompt_logprobs, Generation's); a plugin built on another version is
 * refused at load (the fingerprint below). */
#define DEW_SDK_VERSION "0.12.0"
/* The version of the kernel table (dew/kernel_table.hpp): bumped whenever a kernel is added, removed or
 * changes its parameters or its contract, since a backend's vtable and every caller depend on it (7:
 * cross_entropy_backward in place; 8: Backend::matmul_beta_adds_rounded; 9: rms_norm_backward accumulates,
 * unary_backward(_sum)'s dx may alias x; 10: adamw_update_group, sum_squares_group; 11: lerp_group; 12: matmul's
 * widened product; 13: attention_slots). */
#define DEW_KERNEL_ALGEBRA_VERSION 13
#define DEW_PLUGIN_ENTRY_SYMBOL "dew_plugin_entry"

#define DEW_STR_(x) #x
#define DEW_STR(x) DEW_STR_(x)
#if defined(__clang__)
#define DEW_COMPILER_ID "clang " __clang_version__
#elif defined(__GNUC__)
#define DEW_COMPILER_ID "gcc " __VERSION__
#else
#define DEW_COMPILER_ID "unknown-compiler"
#endif
#if defined(_GLIBCXX_USE_CXX11_ABI)
#define DEW_CXX_ABI_ID "libstdc++ cxx11-abi " DEW_STR(_GLIBCXX_USE_CXX11_ABI)
#else
#define DEW_CXX_ABI_ID "c-only"
#endif
/* What host and plugin must agree on, because C++ objects cross the boundary past the handshake. */
#define DEW_BUILD_FINGERPRINT \
  "dew-sdk " DEW_SDK_VERSION "; kernel-algebra " DEW_STR(DEW_KERNEL_ALGEBRA_VERSION) "; " DEW_COMPILER_ID "; " DEW_CXX_ABI_ID

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dew_plugin_v1 {
  uint32_t abi_version;    /* DEW_PLUGIN_ABI_VERSION the plugin was built with: always the first field */
  const char* name;        /* e.g. "cpu" */
  const char* version;     /* the plugin's own version, e.g. "0.1.0" */
  const char* fingerprint; /* DEW_BUILD_FINGERPRINT at the plugin's build */
  const char* build_notes; /* free text: library versions built against (oneDNN 2.6.3, cuDNN 9.19, ...) */
  int (*register_all)(void* registrar, char* err, size_t err_len);
} dew_plugin_v1;

typedef const dew_plugin_v1* (*dew_plugin_entry_fn)(void);

/* The frozen layout of the handshake (LP64): fields are only ever appended, so these never change. */
#ifdef __cplusplus
#define DEW_STATIC_ASSERT_ static_assert
#else
#define DEW_STATIC_ASSERT_ _Static_assert
#endif
DEW_STATIC_ASSERT_(offsetof(dew_plugin_v1, abi_version) == 0, "dew_plugin_v1: abi_version is the first field");
DEW_STATIC_ASSERT_(offsetof(dew_plugin_v1, name) == 8 && offsetof(dew_plugin_v1, version) == 16 &&
                       offsetof(dew_plugin_v1, fingerprint) == 24 && offsetof(dew_plugin_v1, build_notes) == 32 &&
                       offsetof(dew_plugin_v1, register_all) == 40 && sizeof(dew_plugin_v1) == 48,
                   "dew_plugin_v1: the handshake layout is frozen");
#undef DEW_STATIC_ASSERT_

#ifdef __cplusplus
}
#endif
#endif /* DEW_PLUGIN_H */
