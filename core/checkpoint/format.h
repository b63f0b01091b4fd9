// core/checkpoint/format.h — the dew checkpoint file format, version 1 (HDF5). Mirrored, with a
// reading example, in docs/checkpoint-format.md; change both together.
//
//   /                                   root group
//   ├─ @dew.format_version   int64      layout version, = 1 (kCheckpointFormatVersion)
//   ├─ @dew.version          string     dew version that wrote the file ("0.1.0")
//   ├─ @dew.created          string     UTC creation time, ISO 8601 ("2026-12-01T10:20:30Z")
//   ├─ @<name>               string     caller attributes, e.g. @dew.config (effective config text),
//   │                                   @dew.plugins (plugins with versions)
//   ├─ params/                          model parameters
//   │   └─ <param name>      dataset    e.g. "model.layers.0.self_attn.q_proj.weight"
//   ├─ ema/                             EMA copies of (some) parameters, same naming
//   ├─ optim/
//   │   └─ <slot>/                      one group per optimizer slot ("m", "v", "momentum", ...)
//   │       └─ <param name>  dataset
//   └─ state/
//       ├─ @<counter>        int64      step, updates, attempts, ...
//       ├─ @<value>          float64    best metric, loss scale, ...
//       ├─ @<text>           string     data position, RNG description, ...
//       └─ <name>            dataset    binary state (e.g. a u8 blob), optional
//                                       (the trainer writes Objective::state() as objective.<name>)
//
// Every dataset: shape = tensor shape (scalar dataspace for rank 0), contiguous, uncompressed, with a
// string attribute @dtype naming the dew dtype. Storage types:
//
//   dtype  HDF5 file type   note
//   f32    IEEE_F32LE
//   f64    IEEE_F64LE
//   bf16   STD_U16LE        raw bfloat16 bits; @dtype = "bf16"
//   f16    STD_U16LE        raw IEEE half bits; @dtype = "f16"
//   i32    STD_I32LE
//   i64    STD_I64LE
//   u8     STD_U8LE
//
// Dataset and slot names are the tensor names verbatim (dots allowed); '/' is refused. The groups
// track link creation order, so tensors read back in the order they were written (a reader that
// ignores the order sees them sorted by name).
//
// Versioning: a reader accepts format versions <= its own and refuses newer ones with a hint to
// upgrade dew. Adding groups, attributes or datasets that old readers may ignore keeps the version;
// changing the meaning or storage of anything above bumps it.
//
// Atomicity: the writer writes "<path>.tmp-<pid>", H5Fflush + close, fsync, rename(2) onto the path,
// then fsyncs the directory. Leftover "*.tmp-<pid>" files are garbage from a crashed write.
#pragma once

namespace dew::checkpoint_format {

inline constexpr const char* kFormatVersionAttr = "dew.format_version";
inline constexpr const char* kVersionAttr = "dew.version";
inline constexpr const char* kCreatedAttr = "dew.created";
inline constexpr const char* kDtypeAttr = "dtype";
// Since checksums: each dataset's CRC-32 (u32) and the root marker saying the file has them (and a
// checksum block, core/checkpoint/integrity.h). A file with the marker must have both.
inline constexpr const char* kCrcAttr = "crc32";
inline constexpr const char* kChecksumsAttr = "dew.checksums";
inline constexpr const char* kChecksumsValue = "crc32";

inline constexpr const char* kParamsGroup = "params";
inline constexpr const char* kEmaGroup = "ema";
inline constexpr const char* kOptimGroup = "optim";
inline constexpr const char* kStateGroup = "state";

inline constexpr const char* kTempInfix = ".tmp-";  // "<path>.tmp-<pid>"

}  // namespace dew::checkpoint_format
