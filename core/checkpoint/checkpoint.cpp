// core/checkpoint/checkpoint.cpp — HDF5 checkpoints (format in core/checkpoint/format.h).
//
// Uses the HDF5 C API through small RAII handles. HDF5's automatic error printing is switched off
// around every call (QuietH5); a failing call throws H5Failure carrying HDF5's innermost message,
// which the public functions turn into one dew::Error naming the file.
//
// Atomic write: "<path>.tmp-<pid>" -> H5Fflush + H5Fclose -> checksum block -> fsync(file) -> rename ->
// fsync(dir).
//
// Integrity: every dataset carries @crc32 (zlib CRC-32 of its little-endian bytes) and the file starts
// with a checksum block (HDF5 user block, core/checkpoint/integrity.h) holding the CRC-32 of the whole
// file after it plus every dataset's offset, size and CRC. A reader checks the bytes against the block
// before libhdf5 parses anything (verify_bytes), so a damaged file is refused naming the tensor and never
// reaches HDF5's parser, which can crash on damaged metadata. Files written before checksums (no block,
// no @crc32) still load, unverified.
#include "dew/checkpoint.hpp"

#include <fcntl.h>
#include <hdf5.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "checkpoint/format.h"
#include "checkpoint/integrity.h"
#include "dew/error.hpp"
#include "dew/plugin.h"

// The sanitizer runtimes' hook (compiler-rt); null unless the program runs under ASan/UBSan/TSan.
extern "C" void __sanitizer_set_death_callback(void (*callback)()) __attribute__((weak));

namespace dew {
namespace {

namespace fs = std::filesystem;
namespace fmt = checkpoint_format;
namespace integrity = checkpoint_integrity;
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "checkpoint CRCs are over the little-endian stored bytes, which are the host bytes only here");

// ---------------------------------------------------------------------------------------------
// HDF5 plumbing

struct H5Failure {
  std::string what;    // what dew was doing ("open file", "read dataset params/x")
  std::string detail;  // HDF5's message(s)
  std::string text() const { return detail.empty() ? what : what + ": " + detail; }
};

herr_t collect_error(unsigned, const H5E_error2_t* err, void* data) {
  auto* msgs = static_cast<std::vector<std::string>*>(data);
  if (err && err->desc && *err->desc) msgs->emplace_back(err->desc);
  return 0;
}

// The outermost and innermost messages of the current HDF5 error stack (then clears it).
std::string h5_error_detail() {
  std::vector<std::string> msgs;
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, collect_error, &msgs);
  H5Eclear2(H5E_DEFAULT);
  if (msgs.empty()) return {};
  if (msgs.size() == 1 || msgs.front() == msgs.back()) return msgs.front();
  return msgs.front() + ": " + msgs.back();
}

template <class T>
T h5(T result, const std::string& what) {
  if (result < 0) throw H5Failure{what, h5_error_detail()};
  return result;
}

// Silences HDF5's automatic error printing for the current thread while alive.
class QuietH5 {
 public:
  QuietH5() {
    H5Eget_auto2(H5E_DEFAULT, &func_, &data_);
    H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr);
  }
  ~QuietH5() { H5Eset_auto2(H5E_DEFAULT, func_, data_); }
  QuietH5(const QuietH5&) = delete;
  QuietH5& operator=(const QuietH5&) = delete;

 private:
  H5E_auto2_t func_ = nullptr;
  void* data_ = nullptr;
};

// An owned HDF5 identifier.
class Hid {
 public:
  using Closer = herr_t (*)(hid_t);
  Hid() = default;
  Hid(hid_t id, Closer closer, const std::string& what) : id_(h5(id, what)), close_(closer) {}
  Hid(Hid&& o) noexcept : id_(o.id_), close_(o.close_) { o.id_ = H5I_INVALID_HID; }
  Hid& operator=(Hid&& o) noexcept {
    if (this != &o) {
      reset();
      id_ = o.id_;
      close_ = o.close_;
      o.id_ = H5I_INVALID_HID;
    }
    return *this;
  }
  ~Hid() { reset(); }
  operator hid_t() const { return id_; }
  // Closes now and reports a failure (the file close is where HDF5 writes its metadata).
  void close(const std::string& what) {
    hid_t id = id_;
    id_ = H5I_INVALID_HID;
    if (id >= 0 && close_) h5(close_(id), what);
  }

 private:
  void reset() {
    if (id_ >= 0 && close_) close_(id_);
    id_ = H5I_INVALID_HID;
  }
  hid_t id_ = H5I_INVALID_HID;
  Closer close_ = nullptr;
};

Hid string_type(H5T_cset_t cset = H5T_CSET_UTF8) {
  Hid t(H5Tcopy(H5T_C_S1), H5Tclose, "copy string type");
  h5(H5Tset_size(t, H5T_VARIABLE), "set string size");
  h5(H5Tset_cset(t, cset), "set string charset");
  return t;
}

Hid scalar_space() { return Hid(H5Screate(H5S_SCALAR), H5Sclose, "create scalar dataspace"); }

// ---------------------------------------------------------------------------------------------
// dtype mapping

hid_t file_type(DType t) {
  switch (t) {
    case DType::f32:
      return H5T_IEEE_F32LE;
    case DType::f64:
      return H5T_IEEE_F64LE;
    case DType::bf16:
    case DType::f16:
      return H5T_STD_U16LE;
    case DType::i32:
      return H5T_STD_I32LE;
    case DType::i64:
      return H5T_STD_I64LE;
    case DType::u8:
      return H5T_STD_U8LE;
    case DType::i8:
      return H5T_STD_I8LE;
  }
  DEW_INTERNAL_ASSERT(false);
}

hid_t memory_type(DType t) {
  switch (t) {
    case DType::f32:
      return H5T_NATIVE_FLOAT;
    case DType::f64:
      return H5T_NATIVE_DOUBLE;
    case DType::bf16:
    case DType::f16:
      return H5T_NATIVE_UINT16;
    case DType::i32:
      return H5T_NATIVE_INT32;
    case DType::i64:
      return H5T_NATIVE_INT64;
    case DType::u8:
      return H5T_NATIVE_UINT8;
    case DType::i8:
      return H5T_NATIVE_INT8;
  }
  DEW_INTERNAL_ASSERT(false);
}

constexpr DType kAllDTypes[] = {DType::f32, DType::f64, DType::bf16, DType::f16, DType::i32, DType::i64, DType::u8, DType::i8};

bool dtype_by_name(const std::string& name, DType& out) {
  for (DType t : kAllDTypes)
    if (name == dtype_name(t)) {
      out = t;
      return true;
    }
  return false;
}

std::string known_dtypes() {
  std::string s;
  for (DType t : kAllDTypes) s += std::string(s.empty() ? "" : ", ") + dtype_name(t);
  return s;
}

// ---------------------------------------------------------------------------------------------
// writing

void check_name(const std::string& name, const std::string& where) {
  DEW_CHECK(!name.empty(), "checkpoint: empty name in ", where);
  DEW_CHECK(name.find('/') == std::string::npos, "checkpoint: name '", name, "' in ", where,
            " contains '/', which HDF5 names cannot hold");
  DEW_CHECK(name != "." && name != "..", "checkpoint: name '", name, "' in ", where, " is not allowed");
}

void check_tensors(const NamedTensors& tensors, const std::string& where) {
  std::set<std::string> seen;
  for (const auto& [name, t] : tensors) {
    check_name(name, where);
    DEW_CHECK(seen.insert(name).second, "checkpoint: duplicate name '", name, "' in ", where);
    DEW_CHECK(t.defined(), "checkpoint: tensor ", where, "/", name, " is undefined");
  }
}

void check_text(const std::string& value, const std::string& where) {
  DEW_CHECK(value.find('\0') == std::string::npos, "checkpoint: text ", where,
            " contains a NUL byte; store binary state as a u8 tensor in state_tensors");
}

void write_string_attr(hid_t obj, const std::string& name, const std::string& value) {
  Hid type = string_type();
  Hid space = scalar_space();
  Hid attr(H5Acreate2(obj, name.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose, "create attribute " + name);
  const char* p = value.c_str();
  h5(H5Awrite(attr, type, &p), "write attribute " + name);
}

void write_int_attr(hid_t obj, const std::string& name, int64_t value) {
  Hid space = scalar_space();
  Hid attr(H5Acreate2(obj, name.c_str(), H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
           "create attribute " + name);
  h5(H5Awrite(attr, H5T_NATIVE_INT64, &value), "write attribute " + name);
}

void write_double_attr(hid_t obj, const std::string& name, double value) {
  Hid space = scalar_space();
  Hid attr(H5Acreate2(obj, name.c_str(), H5T_IEEE_F64LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
           "create attribute " + name);
  h5(H5Awrite(attr, H5T_NATIVE_DOUBLE, &value), "write attribute " + name);
}

// A group that tracks link creation order, so tensors read back in written order.
Hid make_group(hid_t parent, const std::string& name, const std::string& where) {
  Hid gcpl(H5Pcreate(H5P_GROUP_CREATE), H5Pclose, "create group property list");
  h5(H5Pset_link_creation_order(gcpl, H5P_CRT_ORDER_TRACKED | H5P_CRT_ORDER_INDEXED), "set creation order");
  return Hid(H5Gcreate2(parent, name.c_str(), H5P_DEFAULT, gcpl, H5P_DEFAULT), H5Gclose, "create group " + where);
}

// Collects, while writing, where each dataset's bytes went and their CRC (the checksum block's entries).
using Entries = std::vector<integrity::Entry>;

void write_u32_attr(hid_t obj, const std::string& name, uint32_t value) {
  Hid space = scalar_space();
  Hid attr(H5Acreate2(obj, name.c_str(), H5T_STD_U32LE, space, H5P_DEFAULT, H5P_DEFAULT), H5Aclose,
           "create attribute " + name);
  h5(H5Awrite(attr, H5T_NATIVE_UINT32, &value), "write attribute " + name);
}

using Fetch = std::function<Tensor(const std::string&, const Tensor&)>;

void write_tensor(hid_t group, const std::string& name, const Tensor& listed, const std::string& where,
                  Entries& entries, const Fetch& fetch) {
  const Tensor t = fetch ? fetch(where, listed) : listed;
  DEW_CHECK(t.defined() && t.shape() == listed.shape() && t.dtype() == listed.dtype(), "checkpoint: the tensor fetched for ",
            where, " does not match its listed shape ", shape_str(listed.shape()), " and dtype ", dtype_name(listed.dtype()));
  DEW_CHECK(!t.quantized(), "checkpoint: ", where, " is a quantized decode weight (int8 with scales), which is "
            "never written: checkpoints hold the weights as trained");
  const DType dt = t.dtype();
  const Shape& shape = t.shape();
  Hid space;
  if (shape.empty()) {
    space = scalar_space();
  } else {
    std::vector<hsize_t> dims(shape.begin(), shape.end());
    space = Hid(H5Screate_simple(int(dims.size()), dims.data(), nullptr), H5Sclose, "create dataspace for " + where);
  }
  Hid ds(H5Dcreate2(group, name.c_str(), file_type(dt), space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), H5Dclose,
         "create dataset " + where);
  uint32_t crc = 0;
  if (t.numel() > 0) {
    std::vector<unsigned char> host(t.nbytes());
    t.copy_to_host(host.data());
    h5(H5Dwrite(ds, memory_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()), "write dataset " + where);
    crc = integrity::crc32_bytes(host.data(), host.size());
    const haddr_t offset = H5Dget_offset(ds);
    DEW_INTERNAL_ASSERT(offset != HADDR_UNDEF);
    entries.push_back({where, uint64_t(offset), uint64_t(host.size()), crc});
  }
  write_string_attr(ds, fmt::kDtypeAttr, dtype_name(dt));
  write_u32_attr(ds, fmt::kCrcAttr, crc);
}

void write_tensor_group(hid_t parent, const std::string& name, const NamedTensors& tensors, const std::string& where,
                        Entries& entries, const Fetch& fetch) {
  Hid g = make_group(parent, name, where);
  for (const auto& [n, t] : tensors) write_tensor(g, n, t, where + "/" + n, entries, fetch);
}

std::string utc_now() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), O_RDONLY | (directory ? O_DIRECTORY : 0) | O_CLOEXEC);
  DEW_CHECK(fd >= 0, "checkpoint: cannot open ", path, " to fsync it: ", std::strerror(errno));
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  DEW_CHECK(rc == 0, "checkpoint: fsync of ", path, " failed: ", std::strerror(err));
}

// Every dataset's "group/name", in write order (sizes the checksum block before the file exists).
std::vector<std::string> dataset_names(const CheckpointData& data) {
  std::vector<std::string> names;
  auto add = [&](const std::string& group, const NamedTensors& ts) {
    for (const auto& [n, t] : ts) names.push_back(group + "/" + n);
  };
  add(fmt::kParamsGroup, data.params);
  add(fmt::kEmaGroup, data.ema);
  for (const auto& [slot, ts] : data.optim) add(std::string(fmt::kOptimGroup) + "/" + slot, ts);
  add(fmt::kStateGroup, data.state_tensors);
  return names;
}

// Reads [from, to) of an open file descriptor through a CRC-32; false on a read error or short file.
bool crc_of_range(int fd, uint64_t from, uint64_t to, uint32_t& crc) {
  std::vector<unsigned char> buf(size_t(1) << 20);
  crc = 0;
  for (uint64_t at = from; at < to;) {
    const size_t want = size_t(std::min<uint64_t>(buf.size(), to - at));
    const ssize_t got = ::pread(fd, buf.data(), want, off_t(at));
    if (got <= 0) return false;
    crc = integrity::crc32_bytes(buf.data(), size_t(got), crc);
    at += uint64_t(got);
  }
  return true;
}

// Fills the reserved user block of a closed file with its checksum block.
void write_checksum_block(const std::string& tmp, size_t block_size, Entries entries) {
  int fd = ::open(tmp.c_str(), O_RDWR | O_CLOEXEC);
  DEW_CHECK(fd >= 0, "checkpoint: cannot reopen ", tmp, " to checksum it: ", std::strerror(errno));
  struct stat sb {};
  integrity::Block b;
  b.block_size = uint32_t(block_size);
  bool ok = ::fstat(fd, &sb) == 0;
  b.file_size = uint64_t(sb.st_size);
  ok = ok && crc_of_range(fd, block_size, b.file_size, b.file_crc);
  b.entries = std::move(entries);
  const std::string bytes = integrity::encode(b);
  ok = ok && ::pwrite(fd, bytes.data(), bytes.size(), 0) == ssize_t(bytes.size());
  const int err = errno;
  ::close(fd);
  DEW_CHECK(ok, "checkpoint: cannot write the checksum block of ", tmp, ": ", std::strerror(err));
}

void write_file(const std::string& tmp, const CheckpointData& data) {
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "create file access property list");
  h5(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), "set close degree");
  Hid fcpl(H5Pcreate(H5P_FILE_CREATE), H5Pclose, "create file creation property list");
  const size_t block_size = integrity::block_size_for(dataset_names(data));
  h5(H5Pset_userblock(fcpl, hsize_t(block_size)), "reserve the checksum block");
  Entries entries;
  Hid file(H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, fcpl, fapl), H5Fclose, "create file " + tmp);
  {
    Hid root(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose, "open root group");
    write_int_attr(root, fmt::kFormatVersionAttr, kCheckpointFormatVersion);
    write_string_attr(root, fmt::kVersionAttr, DEW_SDK_VERSION);
    write_string_attr(root, fmt::kCreatedAttr, utc_now());
    write_string_attr(root, fmt::kChecksumsAttr, fmt::kChecksumsValue);
    for (const auto& [k, v] : data.attributes) write_string_attr(root, k, v);

    write_tensor_group(file, fmt::kParamsGroup, data.params, fmt::kParamsGroup, entries, data.fetch);
    write_tensor_group(file, fmt::kEmaGroup, data.ema, fmt::kEmaGroup, entries, data.fetch);
    {
      Hid optim = make_group(file, fmt::kOptimGroup, fmt::kOptimGroup);
      for (const auto& [slot, tensors] : data.optim)
        write_tensor_group(optim, slot, tensors, std::string(fmt::kOptimGroup) + "/" + slot, entries, data.fetch);
    }
    {
      Hid state = make_group(file, fmt::kStateGroup, fmt::kStateGroup);
      for (const auto& [k, v] : data.counters) write_int_attr(state, k, v);
      for (const auto& [k, v] : data.state_values) write_double_attr(state, k, v);
      for (const auto& [k, v] : data.state_text) write_string_attr(state, k, v);
      for (const auto& [n, t] : data.state_tensors)
        write_tensor(state, n, t, std::string(fmt::kStateGroup) + "/" + n, entries, data.fetch);
    }
  }
  h5(H5Fflush(file, H5F_SCOPE_GLOBAL), "flush file");
  file.close("close file");
  write_checksum_block(tmp, block_size, std::move(entries));
}

// ---------------------------------------------------------------------------------------------
// reading

constexpr size_t kMaxLinks = size_t(1) << 24;  // far beyond any model; bounds a damaged group's walk

[[noreturn]] void fail(const std::string& path, const std::string& msg, const std::string& hint = {}) {
  detail::throw_error(ErrorKind::runtime, __FILE__, __LINE__, "cannot read checkpoint " + path + ": " + msg, hint);
}

struct LinkEntry {
  std::string name;
  int64_t order = 0;
  bool ordered = false;
};

herr_t collect_link(hid_t, const char* name, const H5L_info_t* info, void* data) {
  auto* out = static_cast<std::vector<LinkEntry>*>(data);
  if (!name || out->size() >= kMaxLinks) return -1;  // a damaged heap can claim any count
  out->push_back({name, info ? int64_t(info->corder) : 0, info && info->corder_valid});
  return 0;
}

herr_t collect_attr(hid_t, const char* name, const H5A_info_t*, void* data) {
  auto* out = static_cast<std::vector<std::string>*>(data);
  if (!name || out->size() >= kMaxLinks) return -1;
  out->emplace_back(name);
  return 0;
}

// Link names in creation order when every link records it (dew's files), else by name. The walk goes
// over the name index only and sorts by each link's own creation order, so a damaged creation-order
// index is never followed.
std::vector<std::string> link_names(hid_t group, const std::string& where) {
  std::vector<LinkEntry> links;
  h5(H5Literate(group, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_link, &links), "list " + where);
  const bool ordered = std::all_of(links.begin(), links.end(), [](const LinkEntry& l) { return l.ordered; });
  if (ordered)
    std::stable_sort(links.begin(), links.end(), [](const LinkEntry& a, const LinkEntry& b) { return a.order < b.order; });
  std::vector<std::string> names;
  names.reserve(links.size());
  for (auto& l : links) names.push_back(std::move(l.name));
  return names;
}

std::vector<std::string> attr_names(hid_t obj, const std::string& where) {
  std::vector<std::string> names;
  h5(H5Aiterate2(obj, H5_INDEX_NAME, H5_ITER_INC, nullptr, collect_attr, &names), "list attributes of " + where);
  return names;
}

bool has_link(hid_t group, const std::string& name) {
  return h5(H5Lexists(group, name.c_str(), H5P_DEFAULT), "look up " + name) > 0;
}

H5I_type_t object_type(hid_t parent, const std::string& name, const std::string& where) {
  Hid obj(H5Oopen(parent, name.c_str(), H5P_DEFAULT), H5Oclose, "open " + where);
  return H5Iget_type(obj);
}

// A scalar string attribute (variable or fixed length).
std::string read_string_attr(hid_t attr, hid_t ftype, const std::string& where) {
  htri_t vlen = h5(H5Tis_variable_str(ftype), "inspect " + where);
  if (vlen > 0) {
    Hid mtype = string_type(H5Tget_cset(ftype));
    char* p = nullptr;
    h5(H5Aread(attr, mtype, &p), "read " + where);
    std::string s = p ? p : "";
    if (p) H5free_memory(p);
    return s;
  }
  size_t n = H5Tget_size(ftype);
  std::string s(n, '\0');
  Hid mtype(H5Tcopy(ftype), H5Tclose, "copy type of " + where);
  h5(H5Aread(attr, mtype, s.data()), "read " + where);
  s.resize(std::strlen(s.c_str()));
  while (!s.empty() && s.back() == ' ') s.pop_back();  // space-padded fixed strings
  return s;
}

enum class AttrKind { integer, floating, string, other };

struct AttrValue {
  AttrKind kind = AttrKind::other;
  int64_t i = 0;
  double d = 0;
  std::string s;
};

AttrValue read_attr(hid_t obj, const std::string& name, const std::string& where) {
  Hid attr(H5Aopen(obj, name.c_str(), H5P_DEFAULT), H5Aclose, "open attribute " + where);
  Hid space(H5Aget_space(attr), H5Sclose, "get dataspace of " + where);
  Hid ftype(H5Aget_type(attr), H5Tclose, "get type of " + where);
  AttrValue v;
  if (h5(H5Sget_simple_extent_npoints(space), "size of " + where) != 1) return v;
  switch (H5Tget_class(ftype)) {
    case H5T_INTEGER:
      v.kind = AttrKind::integer;
      h5(H5Aread(attr, H5T_NATIVE_INT64, &v.i), "read " + where);
      break;
    case H5T_FLOAT:
      v.kind = AttrKind::floating;
      h5(H5Aread(attr, H5T_NATIVE_DOUBLE, &v.d), "read " + where);
      break;
    case H5T_STRING:
      v.kind = AttrKind::string;
      v.s = read_string_attr(attr, ftype, where);
      break;
    default:
      break;
  }
  return v;
}

std::string to_text(const AttrValue& v) {
  switch (v.kind) {
    case AttrKind::integer:
      return std::to_string(v.i);
    case AttrKind::floating: {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.17g", v.d);
      return buf;
    }
    default:
      return v.s;
  }
}

// What a read knows about the file and what it was asked to check.
struct ReadContext {
  std::string path;
  BackendPtr backend;          // null: verify only, create no tensors
  bool checksummed = false;    // the file says every dataset has @crc32
  bool allow_nonfinite = false;
};

bool is_float(DType t) { return t == DType::f32 || t == DType::f64 || t == DType::bf16 || t == DType::f16; }

// The index of the first non-finite element of a float tensor's host bytes, or -1, and the count.
int64_t first_nonfinite(const unsigned char* p, int64_t n, DType t, int64_t& count) {
  int64_t first = -1;
  count = 0;
  for (int64_t i = 0; i < n; ++i) {
    bool finite = true;
    if (t == DType::f32) {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      finite = std::isfinite(v);
    } else if (t == DType::f64) {
      double v;
      std::memcpy(&v, p + 8 * i, 8);
      finite = std::isfinite(v);
    } else {  // bf16: exponent bits 0x7F80; f16: 0x7C00 — all ones means inf or NaN
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      const uint16_t mask = t == DType::bf16 ? 0x7F80 : 0x7C00;
      finite = (v & mask) != mask;
    }
    if (!finite) {
      if (first < 0) first = i;
      ++count;
    }
  }
  return first;
}

Tensor read_tensor(hid_t group, const std::string& name, const std::string& where, const ReadContext& cx,
                   bool weights) {
  const std::string& path = cx.path;
  if (object_type(group, name, where) != H5I_DATASET) fail(path, where + " is not a dataset");
  Hid ds(H5Dopen2(group, name.c_str(), H5P_DEFAULT), H5Dclose, "open dataset " + where);
  if (h5(H5Aexists(ds, fmt::kDtypeAttr), "look up dtype of " + where) <= 0)
    fail(path, "dataset " + where + " has no '" + fmt::kDtypeAttr + "' attribute (is this a dew checkpoint?)");
  AttrValue dv = read_attr(ds, fmt::kDtypeAttr, where + "@dtype");
  DType dt{};
  if (dv.kind != AttrKind::string || !dtype_by_name(dv.s, dt))
    fail(path, "dataset " + where + " has unknown dtype '" + to_text(dv) + "' (known: " + known_dtypes() + ")");

  Hid ftype(H5Dget_type(ds), H5Tclose, "get type of " + where);
  const bool want_float = dt == DType::f32 || dt == DType::f64;
  const bool want_signed = dt == DType::i32 || dt == DType::i64;
  H5T_class_t cls = H5Tget_class(ftype);
  bool ok = cls == (want_float ? H5T_FLOAT : H5T_INTEGER) && H5Tget_size(ftype) == dtype_size(dt);
  if (ok && cls == H5T_INTEGER) ok = (H5Tget_sign(ftype) == H5T_SGN_2) == want_signed;
  if (!ok)
    fail(path, "dataset " + where + " says dtype " + dtype_name(dt) + " but is stored as a " +
                   std::to_string(H5Tget_size(ftype)) + "-byte " + (cls == H5T_FLOAT ? "float" : "non-float") +
                   " HDF5 type");

  Hid space(H5Dget_space(ds), H5Sclose, "get dataspace of " + where);
  Shape shape;
  H5S_class_t sc = H5Sget_simple_extent_type(space);
  if (sc == H5S_SIMPLE) {
    int rank = h5(H5Sget_simple_extent_ndims(space), "rank of " + where);
    std::vector<hsize_t> dims(static_cast<size_t>(rank));
    h5(H5Sget_simple_extent_dims(space, dims.data(), nullptr), "dims of " + where);
    shape.assign(dims.begin(), dims.end());
  } else if (sc != H5S_SCALAR) {
    fail(path, "dataset " + where + " has no dataspace (null or unknown)");
  }
  // Sizes come from the file: refuse what cannot be a real tensor before allocating for it.
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0 || (d > 0 && numel > (uint64_t(1) << 62) / uint64_t(d)))
      fail(path, "dataset " + where + " claims an impossible shape " + shape_str(shape));
    numel *= uint64_t(d);
  }
  const uint64_t nbytes = numel * dtype_size(dt);
  const hsize_t stored = H5Dget_storage_size(ds);
  if (numel > 0 && stored != nbytes)
    fail(path, "dataset " + where + " of shape " + shape_str(shape) + " holds " + std::to_string(stored) +
                   " bytes, not " + std::to_string(nbytes) + " (corrupt)");
  uint32_t want_crc = 0;
  const bool has_crc = h5(H5Aexists(ds, fmt::kCrcAttr), "look up crc32 of " + where) > 0;
  if (has_crc) {
    AttrValue cv = read_attr(ds, fmt::kCrcAttr, where + "@crc32");
    if (cv.kind != AttrKind::integer || cv.i < 0 || cv.i > int64_t(UINT32_MAX))
      fail(path, "dataset " + where + " has a malformed @crc32 attribute (corrupt)");
    want_crc = uint32_t(cv.i);
  } else if (cx.checksummed) {
    fail(path, "dataset " + where + " has no @crc32 although the file says every dataset has one (corrupt)");
  }
  if (numel == 0) return cx.backend ? Tensor::empty(shape, dt, cx.backend) : Tensor();
  std::vector<unsigned char> host(static_cast<size_t>(nbytes));
  h5(H5Dread(ds, memory_type(dt), H5S_ALL, H5S_ALL, H5P_DEFAULT, host.data()), "read dataset " + where);
  if (has_crc) {
    const uint32_t got = integrity::crc32_bytes(host.data(), host.size());
    if (got != want_crc) {
      char buf[64];
      std::snprintf(buf, sizeof buf, " (stored CRC-32 %08x, data %08x)", want_crc, got);
      fail(path, "tensor " + where + " is corrupt: its bytes do not match its checksum" + buf);
    }
  }
  if (weights && !cx.allow_nonfinite && is_float(dt)) {
    int64_t count = 0;
    const int64_t first = first_nonfinite(host.data(), int64_t(numel), dt, count);
    if (first >= 0)
      fail(path,
           "tensor " + where + " holds " + std::to_string(count) + " non-finite value" + (count == 1 ? "" : "s") +
               " (first at flat index " + std::to_string(first) + ")",
           "load an earlier checkpoint with --step N, or set DEW_ALLOW_NONFINITE_WEIGHTS=1 to load it anyway");
  }
  return cx.backend ? Tensor::from_host(host.data(), shape, dt, cx.backend) : Tensor();
}

NamedTensors read_tensor_group(hid_t parent, const std::string& name, const std::string& where, const ReadContext& cx,
                               bool weights) {
  NamedTensors out;
  if (!has_link(parent, name)) return out;  // absent group = empty
  if (object_type(parent, name, where) != H5I_GROUP) fail(cx.path, where + " is not a group");
  Hid g(H5Gopen2(parent, name.c_str(), H5P_DEFAULT), H5Gclose, "open group " + where);
  for (const std::string& n : link_names(g, where)) out.emplace_back(n, read_tensor(g, n, where + "/" + n, cx, weights));
  return out;
}

CheckpointData read_file(ReadContext& cx) {
  const std::string& path = cx.path;
  CheckpointData data;
  Hid fapl(H5Pcreate(H5P_FILE_ACCESS), H5Pclose, "create file access property list");
  h5(H5Pset_fclose_degree(fapl, H5F_CLOSE_STRONG), "set close degree");
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDONLY, fapl), H5Fclose, "open file");
  Hid root(H5Gopen2(file, "/", H5P_DEFAULT), H5Gclose, "open root group");

  // Version first: a newer layout may not even be readable below.
  if (h5(H5Aexists(root, fmt::kFormatVersionAttr), "look up format version") <= 0)
    fail(path, std::string("not a dew checkpoint (no root attribute ") + fmt::kFormatVersionAttr + ")");
  AttrValue fv = read_attr(root, fmt::kFormatVersionAttr, fmt::kFormatVersionAttr);
  if (fv.kind != AttrKind::integer) fail(path, std::string(fmt::kFormatVersionAttr) + " is not an integer");
  if (fv.i > kCheckpointFormatVersion)
    fail(path,
         "format version " + std::to_string(fv.i) + " is newer than this dew (" DEW_SDK_VERSION ") reads (up to " +
             std::to_string(kCheckpointFormatVersion) + ")",
         "upgrade dew to a version that reads checkpoint format " + std::to_string(fv.i));
  if (fv.i < 1) fail(path, "unknown format version " + std::to_string(fv.i));
  data.format_version = fv.i;

  for (const std::string& name : attr_names(root, "/")) {
    if (name == fmt::kFormatVersionAttr) continue;
    if (name == fmt::kChecksumsAttr) {
      AttrValue v = read_attr(root, name, "/@" + name);
      if (v.kind != AttrKind::string || v.s != fmt::kChecksumsValue)
        fail(path, "unknown checksum kind '" + to_text(v) + "' in /@" + name + " (known: " + fmt::kChecksumsValue + ")");
      cx.checksummed = true;
      continue;
    }
    AttrValue v = read_attr(root, name, "/@" + name);
    if (name == fmt::kVersionAttr)
      data.dew_version = to_text(v);
    else if (name == fmt::kCreatedAttr)
      data.created = to_text(v);
    else if (v.kind != AttrKind::other)
      data.attributes[name] = to_text(v);
  }

  data.checksummed = cx.checksummed;
  data.params = read_tensor_group(file, fmt::kParamsGroup, fmt::kParamsGroup, cx, true);
  data.ema = read_tensor_group(file, fmt::kEmaGroup, fmt::kEmaGroup, cx, true);
  if (has_link(file, fmt::kOptimGroup)) {
    if (object_type(file, fmt::kOptimGroup, fmt::kOptimGroup) != H5I_GROUP) fail(path, "optim is not a group");
    Hid optim(H5Gopen2(file, fmt::kOptimGroup, H5P_DEFAULT), H5Gclose, "open group optim");
    for (const std::string& slot : link_names(optim, fmt::kOptimGroup))
      data.optim[slot] = read_tensor_group(optim, slot, std::string(fmt::kOptimGroup) + "/" + slot, cx, true);
  }
  if (has_link(file, fmt::kStateGroup)) {
    if (object_type(file, fmt::kStateGroup, fmt::kStateGroup) != H5I_GROUP) fail(path, "state is not a group");
    Hid state(H5Gopen2(file, fmt::kStateGroup, H5P_DEFAULT), H5Gclose, "open group state");
    for (const std::string& name : attr_names(state, fmt::kStateGroup)) {
      AttrValue v = read_attr(state, name, "state/@" + name);
      switch (v.kind) {
        case AttrKind::integer:
          data.counters[name] = v.i;
          break;
        case AttrKind::floating:
          data.state_values[name] = v.d;
          break;
        case AttrKind::string:
          data.state_text[name] = v.s;
          break;
        case AttrKind::other:
          fail(path, "state/@" + name + " is not a scalar integer, float or string");
      }
    }
    for (const std::string& n : link_names(state, fmt::kStateGroup))
      data.state_tensors.emplace_back(n, read_tensor(state, n, "state/" + n, cx, false));
  }
  file.close("close file");
  return data;
}

// ---------------------------------------------------------------------------------------------
// files

std::string file_name(const std::string& path) { return fs::path(path).filename().string(); }

bool all_digits(const std::string& s) {
  return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// (step, path) of every step-*.h5 regular file in dir, sorted by step.
std::vector<std::pair<int64_t, std::string>> list_checkpoints(const std::string& dir) {
  std::vector<std::pair<int64_t, std::string>> out;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return out;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    if (!e.is_regular_file(ec)) continue;
    int64_t step = checkpoint_step(e.path().filename().string());
    if (step >= 0) out.emplace_back(step, e.path().string());
  }
  std::sort(out.begin(), out.end());
  return out;
}

constexpr unsigned char kHdf5Signature[8] = {0x89, 'H', 'D', 'F', '\r', '\n', 0x1a, '\n'};

// Checks a file's bytes against its checksum block before HDF5 sees them. Returns true when the file has
// a block and matches it, false for a file without one (written before checksums: HDF5 reads it
// unverified); refuses a damaged file naming the damaged tensors, or the metadata when no tensor is.
bool verify_bytes(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == EACCES || err == EPERM) fail(path, "permission denied (the file exists but this user cannot read it)");
    fail(path, std::strerror(err));
  }
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat sb {};
  if (::fstat(fd, &sb) != 0) fail(path, std::string("cannot stat: ") + std::strerror(errno));
  const uint64_t size = uint64_t(sb.st_size);
  unsigned char head[integrity::kMinBlock];
  const ssize_t got = ::pread(fd, head, sizeof head, 0);
  if (got < 0) fail(path, std::string("cannot read: ") + std::strerror(errno));
  if (size_t(got) >= sizeof kHdf5Signature && std::memcmp(head, kHdf5Signature, sizeof kHdf5Signature) == 0)
    return false;  // no user block: a file from before checksums
  if (!integrity::has_magic(head, size_t(got)))
    fail(path, "not an HDF5 file (neither a dew checksum block nor an HDF5 signature at its start: corrupt, "
               "truncated or not a checkpoint; " + std::to_string(size) + " bytes)");
  // The block's size field is read from its fixed offset (checked by decode).
  uint64_t block = 0;
  if (size_t(got) >= 16)
    for (int i = 0; i < 4; ++i) block |= uint64_t(head[12 + i]) << (8 * i);
  if (block < integrity::kMinBlock || block > integrity::kMaxBlock || block > size)
    fail(path, "the checksum block at its start is damaged (size field " + std::to_string(block) + ", file " +
                   std::to_string(size) + " bytes)");
  std::vector<unsigned char> bytes(static_cast<size_t>(block));
  if (::pread(fd, bytes.data(), bytes.size(), 0) != ssize_t(bytes.size())) fail(path, "cannot read its checksum block");
  integrity::Block b;
  std::string why;
  if (!integrity::decode(bytes.data(), bytes.size(), b, why)) fail(path, why + "; the file is corrupt");
  if (b.file_size != size)
    fail(path, "corrupt or truncated file: " + std::to_string(size) + " bytes, but " + std::to_string(b.file_size) +
                   " were written");
  unsigned char sig[8];
  if (::pread(fd, sig, 8, off_t(block)) != 8 || std::memcmp(sig, kHdf5Signature, 8) != 0)
    fail(path, "corrupt: no HDF5 signature after the checksum block");
  uint32_t crc = 0;
  if (!crc_of_range(fd, block, size, crc)) fail(path, std::string("cannot read: ") + std::strerror(errno));
  if (crc == b.file_crc) return true;
  std::vector<std::string> bad;
  for (const auto& e : b.entries) {
    uint32_t c = 0;
    if (!crc_of_range(fd, e.offset, e.offset + e.size, c) || c != e.crc) bad.push_back(e.name);
  }
  if (bad.empty())
    fail(path, "corrupt: its HDF5 metadata (names, shapes, attributes, counters) differs from what was written; "
               "every tensor's data is intact");
  std::string list;
  for (size_t i = 0; i < bad.size() && i < 5; ++i) list += (i ? ", " : "") + bad[i];
  if (bad.size() > 5) list += " and " + std::to_string(bad.size() - 5) + " more";
  fail(path, std::string("corrupt: tensor") + (bad.size() == 1 ? " " : "s ") + list +
                 (bad.size() == 1 ? " does" : " do") + " not match its checksum");
}

double probe_deadline_seconds(const std::string& path) {
  if (const char* env = std::getenv("DEW_CHECKPOINT_PROBE_SECONDS")) {
    char* end = nullptr;
    const double v = std::strtod(env, &end);
    DEW_USAGE_CHECK(end != env && *end == 0 && v > 0 && std::isfinite(v),
                    "DEW_CHECKPOINT_PROBE_SECONDS must be a positive number of seconds, not '", env, "'");
    return v;
  }
  std::error_code ec;
  const auto bytes = fs::file_size(path, ec);
  return 30.0 + (ec ? 0.0 : double(bytes) / 50e6);
}

// A file without a checksum block (written before checksums) reaches libhdf5 unverified, and HDF5's parser
// can crash on damaged metadata (a few flipped bytes near the end segfaulted H5Aiterate2). Such a file is
// first read once in a forked child, creating no tensors: a child killed by a signal means the file
// crashes HDF5, and it is refused. The child only reads (HDF5 and malloc) and leaves with _exit. Errors the
// child meets are left to the in-process read, which repeats them with their full message.
//
// The outcome is kept for the process by the file's identity and contents (device, inode, size,
// modification time and the CRC-32 of every byte: a file rewritten in place within one timestamp tick still
// differs), so a command that checks a file and then reads it (train --resume: verify_checkpoint, then
// read_checkpoint) probes it once: a file that hangs libhdf5 costs one deadline, not two. A timeout is
// reused only under a deadline no longer than the one it ran out of.
struct ProbeKey {
  dev_t device;
  ino_t inode;
  off_t size;
  int64_t mtime_ns;
  uint32_t crc;
  auto operator<=>(const ProbeKey&) const = default;
};
struct ProbeOutcome {
  std::string refusal;  // empty: libhdf5 read the file to the end
  double timed_out_after = 0;  // > 0: the refusal is a timeout at this deadline
};
std::mutex probe_memo_mutex;
std::map<ProbeKey, ProbeOutcome> probe_memo;

ProbeOutcome probe_in_child(const std::string& path, const CheckpointReadOptions& opt, double seconds);

void probe_unverified_file(const std::string& path, const CheckpointReadOptions& opt) {
  // libhdf5 can also loop for ever on damaged metadata (H5HG_read on a global heap that names itself), so
  // the child gets a deadline: 30 s plus 1 s per 50 MB it reads, or DEW_CHECKPOINT_PROBE_SECONDS.
  const double seconds = probe_deadline_seconds(path);
  struct stat st {};
  uint32_t crc = 0;
  bool known = false;
  if (const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC); fd >= 0) {
    known = ::fstat(fd, &st) == 0 && crc_of_range(fd, 0, uint64_t(st.st_size), crc);
    ::close(fd);
  }
  const ProbeKey key{st.st_dev, st.st_ino, st.st_size, int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec,
                     crc};
  ProbeOutcome outcome;
  bool memoised = false;
  if (known) {
    std::lock_guard<std::mutex> lock(probe_memo_mutex);
    const auto it = probe_memo.find(key);
    if (it != probe_memo.end() && (it->second.timed_out_after == 0 || seconds <= it->second.timed_out_after)) {
      outcome = it->second;
      memoised = true;
    }
  }
  if (!memoised) {
    outcome = probe_in_child(path, opt, seconds);
    if (known) {
      std::lock_guard<std::mutex> lock(probe_memo_mutex);
      probe_memo[key] = outcome;
    }
  }
  if (!outcome.refusal.empty()) fail(path, outcome.refusal);
}

// Reads the file once in a forked child under the deadline; nothing between fork and the child's end may
// throw (the deadline was taken first).
ProbeOutcome probe_in_child(const std::string& path, const CheckpointReadOptions& opt, double seconds) {
  std::fflush(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid < 0) return {};  // cannot probe: read in process, as before checksums
  if (pid == 0) {
    // The child dies with its parent (a killed dew-run leaves no libhdf5 spinning on its own).
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(1);
    // The host's crash handlers (a test framework's, a debugger's) are not the child's business. Under a
    // sanitizer (tools/fuzz.sh, tools/test.sh --sanitize) the child dying of a report inside libhdf5 is the
    // probe's expected outcome, so the host's death callback (libFuzzer's: it would save the input as a
    // finding) is dropped too; the report still prints and the child still dies by a signal.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, SIG_DFL);
    if (__sanitizer_set_death_callback != nullptr) __sanitizer_set_death_callback(nullptr);
    int code = 0;
    try {
      QuietH5 quiet;
      ReadContext cx{path, nullptr, false, opt.allow_nonfinite};
      read_file(cx);
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  int status = 0;
  for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, std::chrono::milliseconds(50))) {
    const pid_t done = ::waitpid(pid, &status, WNOHANG);
    if (done == pid || (done < 0 && errno != EINTR)) break;
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid, SIGKILL);
      while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
      }
      char shown[32];
      std::snprintf(shown, sizeof shown, "%g", seconds);
      return {std::string("corrupt: libhdf5 did not finish reading it in ") + shown +
                  " s (damaged HDF5 metadata in a file written before checksums)",
              seconds};
    }
    std::this_thread::sleep_for(pause);
  }
  if (WIFSIGNALED(status))
    return {"corrupt: reading it crashes libhdf5 (signal " + std::to_string(WTERMSIG(status)) +
            "; damaged HDF5 metadata in a file written before checksums)"};
  return {};
}

CheckpointData read_verified(const std::string& path, const BackendPtr& backend, const CheckpointReadOptions& opt) {
  std::error_code ec;
  DEW_USAGE_CHECK(fs::exists(path, ec), "checkpoint file not found: ", path);
  DEW_USAGE_CHECK(!fs::is_directory(path, ec), "checkpoint ", path, " is a directory, not a file");
  const bool has_block = verify_bytes(path);
  if (!has_block) probe_unverified_file(path, opt);
  QuietH5 quiet;
  htri_t is_hdf5 = H5Fis_hdf5(path.c_str());
  if (is_hdf5 == 0) {
    H5Eclear2(H5E_DEFAULT);
    fail(path, "not an HDF5 file (corrupt or truncated, or not a checkpoint; " +
                   std::to_string(fs::file_size(path, ec)) + " bytes)");
  }
  try {
    if (is_hdf5 < 0) throw H5Failure{"check signature", h5_error_detail()};
    ReadContext cx{path, backend, false, opt.allow_nonfinite};
    CheckpointData data = read_file(cx);
    if (has_block && !data.checksummed) fail(path, std::string("has a checksum block but no /@") + fmt::kChecksumsAttr);
    if (!has_block && data.checksummed)
      fail(path, std::string("says /@") + fmt::kChecksumsAttr + " but its checksum block is missing (corrupt)");
    return data;
  } catch (const H5Failure& e) {
    fail(path, "corrupt or truncated file (" + e.text() + ")");
  }
}

}  // namespace

// =============================================================================================
// public API

void for_each_checkpoint_tensor(const CheckpointData& data,
                                const std::function<void(const std::string& where, const Tensor& t)>& f) {
  auto walk = [&](const std::string& group, const NamedTensors& ts) {
    for (const auto& [n, t] : ts) f(group + "/" + n, t);
  };
  walk(fmt::kParamsGroup, data.params);
  walk(fmt::kEmaGroup, data.ema);
  for (const auto& [slot, ts] : data.optim) walk(std::string(fmt::kOptimGroup) + "/" + slot, ts);
  walk(fmt::kStateGroup, data.state_tensors);
}

Tensor checkpoint_placeholder(const Shape& shape, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->shape = shape;
  impl->dtype = dtype;
  return Tensor(std::move(impl));
}

void write_checkpoint(const std::string& path, const CheckpointData& data) {
  DEW_CHECK(!path.empty(), "write_checkpoint: empty path");
  for (const auto& [k, v] : data.attributes) {
    DEW_CHECK(!k.empty(), "checkpoint: empty root attribute name");
    DEW_CHECK(k != fmt::kFormatVersionAttr && k != fmt::kVersionAttr && k != fmt::kCreatedAttr &&
                  k != fmt::kChecksumsAttr,
              "checkpoint: root attribute '", k, "' is reserved (dew writes it)");
    check_text(v, "/@" + k);
  }
  check_tensors(data.params, fmt::kParamsGroup);
  check_tensors(data.ema, fmt::kEmaGroup);
  for (const auto& [slot, tensors] : data.optim) {
    check_name(slot, fmt::kOptimGroup);
    check_tensors(tensors, std::string(fmt::kOptimGroup) + "/" + slot);
  }
  std::set<std::string> state_names;
  auto check_state_name = [&](const std::string& k) {
    DEW_CHECK(!k.empty(), "checkpoint: empty name in state");
    DEW_CHECK(state_names.insert(k).second, "checkpoint: state name '", k,
              "' is used twice (counters, state_values and state_text share state/'s attributes)");
  };
  for (const auto& [k, v] : data.counters) check_state_name(k);
  for (const auto& [k, v] : data.state_values) check_state_name(k);
  for (const auto& [k, v] : data.state_text) {
    check_state_name(k);
    check_text(v, "state/@" + k);
  }
  check_tensors(data.state_tensors, fmt::kStateGroup);

  // Room for it, checked before HDF5 starts: a write that fills the file system fails inside HDF5's file
  // close, after which the library cannot shut down cleanly at exit (a crash after the error line).
  {
    uint64_t need = uint64_t(1) << 20;  // HDF5's metadata and the checksum block, generously
    auto add = [&](const NamedTensors& ts) {
      for (const auto& [n, t] : ts) need += uint64_t(t.numel()) * dtype_size(t.dtype()) + 1024;
    };
    add(data.params);
    add(data.ema);
    for (const auto& [slot, ts] : data.optim) add(ts);
    add(data.state_tensors);
    const std::string dir = fs::path(path).parent_path().empty() ? "." : fs::path(path).parent_path().string();
    struct statvfs vfs {};
    if (::statvfs(dir.c_str(), &vfs) == 0) {
      const uint64_t free = uint64_t(vfs.f_bavail) * uint64_t(vfs.f_frsize);
      DEW_CHECK(free >= need, "cannot write checkpoint ", path, ": it needs about ", (need >> 20) + 1,
                " MiB and the file system of '", dir, "' has ", free >> 20,
                " MiB free (the earlier checkpoints are kept)");
    }
  }
  const std::string tmp = path + fmt::kTempInfix + std::to_string(::getpid());
  try {
    {
      QuietH5 quiet;
      write_file(tmp, data);
    }
    fsync_path(tmp, false);
    DEW_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "checkpoint: cannot rename ", tmp, " to ", path, ": ",
              std::strerror(errno));
  } catch (const H5Failure& e) {
    ::unlink(tmp.c_str());
    DEW_CHECK(false, "cannot write checkpoint ", path, ": ", e.text());
  } catch (...) {
    ::unlink(tmp.c_str());
    throw;
  }
  std::string dir = fs::path(path).parent_path().string();
  fsync_path(dir.empty() ? "." : dir, true);
}

CheckpointData read_checkpoint(const std::string& path, const BackendPtr& backend, const CheckpointReadOptions& opt) {
  DEW_CHECK(backend != nullptr, "read_checkpoint: no backend given");
  return read_verified(path, backend, opt);
}

std::string verify_checkpoint(const std::string& path, const CheckpointReadOptions& opt) {
  try {
    read_verified(path, nullptr, opt);
    return {};
  } catch (const Error& e) {
    return e.what();
  }
}

std::string find_intact_checkpoint(const std::string& dir, int64_t below_step, const CheckpointReadOptions& opt) {
  auto all = list_checkpoints(dir);
  for (auto it = all.rbegin(); it != all.rend(); ++it)
    if (it->first < below_step && verify_checkpoint(it->second, opt).empty()) return it->second;
  return {};
}

void load_into(const NamedTensors& checkpoint, const std::string& group, const NamedTensors& targets) {
  const std::string prefix = group.empty() ? "" : group + "/";
  std::map<std::string, const Tensor*> source;
  for (const auto& [name, t] : checkpoint) source.emplace(name, &t);
  std::set<std::string> wanted;
  std::vector<std::string> problems;
  for (const auto& [name, t] : targets) {
    wanted.insert(name);
    auto it = source.find(name);
    if (it == source.end()) {
      problems.push_back(prefix + name + ": missing from the checkpoint (model expects " + shape_str(t.shape()) + " " +
                         dtype_name(t.dtype()) + ")");
      continue;
    }
    const Tensor& s = *it->second;
    if (s.shape() != t.shape())
      problems.push_back(prefix + name + ": checkpoint has " + shape_str(s.shape()) + ", model expects " +
                         shape_str(t.shape()));
    if (s.dtype() != t.dtype())
      problems.push_back(prefix + name + ": checkpoint has dtype " + dtype_name(s.dtype()) + ", model expects " +
                         dtype_name(t.dtype()));
  }
  for (const auto& [name, t] : checkpoint)
    if (!wanted.count(name))
      problems.push_back(prefix + name + ": in the checkpoint (" + shape_str(t.shape()) + " " + dtype_name(t.dtype()) +
                         ") but not in the model");
  if (!problems.empty()) {
    constexpr size_t kShown = 10;
    std::string msg = "checkpoint does not match the model: " + std::to_string(problems.size()) +
                      (problems.size() == 1 ? " mismatch" : " mismatches") + (group.empty() ? "" : " in " + group) +
                      ":";
    for (size_t i = 0; i < problems.size() && i < kShown; ++i) msg += "\n  " + problems[i];
    if (problems.size() > kShown) msg += "\n  ... and " + std::to_string(problems.size() - kShown) + " more";
    DEW_CHECK(false, msg);
  }
  std::vector<unsigned char> host;
  for (const auto& [name, t] : targets) {
    const Tensor& s = *source.at(name);
    host.resize(s.nbytes());
    s.copy_to_host(host.data());
    Tensor dst = t;
    dst.copy_from_host(host.data());
  }
}

std::string checkpoint_name(int64_t step) {
  DEW_CHECK(step >= 0, "checkpoint_name: negative step ", step);
  char buf[40];
  std::snprintf(buf, sizeof buf, "step-%08lld.h5", static_cast<long long>(step));
  return buf;
}

int64_t checkpoint_step(const std::string& name) {
  std::string f = file_name(name);
  if (f.size() <= 8 || f.compare(0, 5, "step-") != 0 || f.compare(f.size() - 3, 3, ".h5") != 0) return -1;
  std::string digits = f.substr(5, f.size() - 8);
  if (!all_digits(digits) || digits.size() > 18) return -1;
  return std::stoll(digits);
}

std::string find_latest_checkpoint(const std::string& dir) {
  auto all = list_checkpoints(dir);
  return all.empty() ? std::string() : all.back().second;
}

std::vector<std::string> prune_checkpoints(const std::string& dir, int keep_latest, const std::string& best_file) {
  DEW_CHECK(keep_latest >= 0, "prune_checkpoints: keep_latest must be >= 0, got ", keep_latest);
  auto all = list_checkpoints(dir);
  const std::string best = best_file.empty() ? std::string() : file_name(best_file);
  std::vector<std::string> removed;
  const size_t n_old = all.size() > size_t(keep_latest) ? all.size() - size_t(keep_latest) : 0;
  for (size_t i = 0; i < n_old; ++i) {
    const std::string& p = all[i].second;
    if (!best.empty() && file_name(p) == best) continue;
    std::error_code ec;
    fs::remove(p, ec);
    DEW_CHECK(!ec, "prune_checkpoints: cannot delete ", p, ": ", ec.message());
    removed.push_back(p);
  }
  return removed;
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return removed;
  const std::string own = std::string(fmt::kTempInfix) + std::to_string(::getpid());
  std::vector<fs::path> stale;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::string f = e.path().filename().string();
    size_t pos = f.rfind(fmt::kTempInfix);
    if (pos == std::string::npos || pos == 0 || !all_digits(f.substr(pos + std::strlen(fmt::kTempInfix)))) continue;
    if (f.compare(pos, std::string::npos, own) == 0) continue;
    if (!e.is_regular_file(ec)) continue;
    stale.push_back(e.path());
  }
  std::sort(stale.begin(), stale.end());
  for (const auto& p : stale) {
    fs::remove(p, ec);
    DEW_CHECK(!ec, "remove_stale_temporaries: cannot delete ", p.string(), ": ", ec.message());
    removed.push_back(p.string());
  }
  return removed;
}

}  // namespace dew
