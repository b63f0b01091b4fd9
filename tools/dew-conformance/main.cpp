// tools/dew-conformance/main.cpp — the conformance driver: every device backend must pass it.
//
//   dew-conformance --backend cpu [--against ref] [--kernel NAME[,NAME...]] [--filter REGEX] [--verbose]
//                   [--plugin-dir DIR]... [--plugin FILE]... [--threads N] [--option KEY=VALUE]... [--list]
//                   [--inject-fault KERNEL] [--inject-guard KERNEL]      (debug: prove the driver catches bugs)
//
// For every case of the table (cases.cpp) that the filters select: build the inputs (Philox, on the
// oracle), run the kernel on the oracle (`--against`, default ref) and on the tested backend, each tensor
// placed in the middle of a bigger buffer whose guard bytes must survive the call (and whose inputs must
// come back unchanged), and compare the outputs (conformance.hpp, Check). One line per case:
//   PASSED | FAILED (+ a one-line repro command) | SKIPPED (the backend's supports() reason) |
//   MISTRUSTED (passed, but the oracle's output is degenerate: more than half zeros where not expected).
// When the oracle does not run a bf16/f16 case but runs f32, it computes in f32 on the same (exactly
// widened) inputs and the tested backend's bf16/f16 output is compared at that dtype's tolerance.
//
// Exit status: 0 no failure (skips allowed), 1 at least one failure, 2 usage or setup error,
// 77 the tested backend cannot run on this machine (its probe says why; CTest's SKIP_RETURN_CODE).
// A kernel that crashes the process is named, with its repro line, on stderr before the signal is re-raised.
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "conformance.hpp"
#include "dew/error.hpp"
#include "dew/random.hpp"
#include "dew/registry.hpp"

namespace po = boost::program_options;
using namespace dew;
using namespace dew::conformance;

namespace {

constexpr int64_t kGuardElems = 64;      // sentinel elements before and after every tensor
constexpr uint8_t kPoisonTested = 0xFF;  // initial bytes of an output on the tested backend (NaN / -1)
constexpr uint8_t kPoisonOracle = 0xFE;  // ... on the oracle (a huge finite value), so "never written" differs

// A kernel that crashes takes the driver with it; the handler names the case and its repro line first.
// The message is formatted before each case, so the handler only calls write() (async-signal-safe).
char g_crash_note[4096] = "dew-conformance: crashed outside any case\n";

extern "C" void on_crash(int sig) {
  const char head[] = "\ndew-conformance: CRASHED (fatal signal) ";
  (void)!write(2, head, sizeof head - 1);
  (void)!write(2, g_crash_note, std::strlen(g_crash_note));
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void install_crash_handlers() {
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(sig, on_crash);
}

uint8_t guard_byte(size_t i) { return uint8_t(0xA5u ^ ((i * 131u) & 0xFFu)); }

struct Args {
  std::string backend, against = "ref", kernels, filter, inject_fault, inject_guard, plugins;
  std::vector<std::string> plugin_dirs, plugin_files, options;  // options: KEY=VALUE of the tested backend
  int threads = 0;
  int64_t misalign = 0;
  bool verbose = false, list = false;
};

// ---------------------------------------------------------------- guarded tensors

struct Guarded {
  Tensor flat;                      // [guard + misalign + n + guard] elements
  Tensor view;                      // what the kernel sees
  std::vector<uint8_t> bytes;       // the whole buffer as written before the call
  size_t before = 0, interior = 0;  // byte sizes
};

Guarded make_guarded(const BackendPtr& be, const Shape& shape, DType dt, const std::vector<uint8_t>* interior,
                     uint8_t poison, int64_t misalign) {
  const size_t es = dtype_size(dt);
  const int64_t n = numel_of(shape);
  const int64_t lead = kGuardElems + misalign;
  Guarded g;
  g.before = size_t(lead) * es;
  g.interior = size_t(n) * es;
  const size_t total = g.before + g.interior + size_t(kGuardElems) * es;
  g.bytes.resize(total);
  for (size_t i = 0; i < total; ++i) g.bytes[i] = guard_byte(i);
  if (interior) {
    DEW_INTERNAL_ASSERT(interior->size() == g.interior);
    if (g.interior > 0)  // an empty tensor's bytes may have no buffer (memcpy from null is undefined even for 0 bytes)
      std::memcpy(g.bytes.data() + g.before, interior->data(), g.interior);
  } else {
    std::memset(g.bytes.data() + g.before, poison, g.interior);
  }
  g.flat = Tensor::empty({lead + n + kGuardElems}, dt, be);
  g.flat.copy_from_host(g.bytes.data());
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = g.flat.impl()->storage;
  impl->offset = g.flat.impl()->offset + size_t(lead);
  impl->shape = shape;
  impl->dtype = dt;
  g.view = Tensor(std::move(impl));
  return g;
}

std::vector<uint8_t> raw(const Tensor& t) {
  std::vector<uint8_t> b(t.nbytes());
  t.copy_to_host(b.data());
  return b;
}

bool is_half(DType t) { return t == DType::bf16 || t == DType::f16; }

// bf16/f16 bytes widened to f32 bytes (exact).
std::vector<uint8_t> widen(const std::vector<uint8_t>& b, DType from) {
  const size_t n = b.size() / 2;
  std::vector<uint8_t> out(n * 4);
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, b.data() + 2 * i, 2);
    const float f = from == DType::bf16 ? bf16_to_f32(bf16_t{h}) : f16_to_f32(f16_t{h});
    std::memcpy(out.data() + 4 * i, &f, 4);
  }
  return out;
}

double load_elem(const uint8_t* p, DType dt) {
  switch (dt) {
    case DType::f32: {
      float v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::f64: {
      double v;
      std::memcpy(&v, p, 8);
      return v;
    }
    case DType::bf16: {
      bf16_t v;
      std::memcpy(&v, p, 2);
      return bf16_to_f32(v);
    }
    case DType::f16: {
      f16_t v;
      std::memcpy(&v, p, 2);
      return f16_to_f32(v);
    }
    case DType::i32: {
      int32_t v;
      std::memcpy(&v, p, 4);
      return v;
    }
    case DType::i64: {
      int64_t v;
      std::memcpy(&v, p, 8);
      return double(v);
    }
    case DType::u8:
      return *p;
    case DType::i8:
      return double(int8_t(*p));
  }
  return 0;
}
void store_elem(uint8_t* p, DType dt, double v) {
  switch (dt) {
    case DType::f32: {
      float f = float(v);
      std::memcpy(p, &f, 4);
      return;
    }
    case DType::f64:
      std::memcpy(p, &v, 8);
      return;
    case DType::bf16: {
      bf16_t h = f32_to_bf16(float(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::f16: {
      f16_t h = f32_to_f16(float(v));
      std::memcpy(p, &h, 2);
      return;
    }
    case DType::i32: {
      int32_t i = int32_t(v);
      std::memcpy(p, &i, 4);
      return;
    }
    case DType::i64: {
      int64_t i = int64_t(v);
      std::memcpy(p, &i, 8);
      return;
    }
    case DType::u8:
      *p = uint8_t(v);
      return;
    case DType::i8:
      *p = uint8_t(int8_t(v));
      return;
  }
}

// ---------------------------------------------------------------- one run of a case on one backend

struct Fault {
  bool value = false, guard = false;
};

struct RunResult {
  std::string error;                        // the kernel threw
  std::vector<std::string> violations;      // guard bytes / inputs written
  std::vector<std::vector<double>> values;  // per output; empty when undefined
  std::vector<DType> dtypes;                // per output, as run
};

std::string where_bytes(size_t first, size_t count, const char* side) {
  std::ostringstream os;
  os << count << " byte(s) " << side << " overwritten (first at byte " << first << ")";
  return os.str();
}

// Bytes [lo, hi) of `now` that differ from `want`: count and first offset relative to `base`.
void diff_bytes(const std::vector<uint8_t>& now, const std::vector<uint8_t>& want, size_t lo, size_t hi, size_t& count,
                size_t& first) {
  count = 0;
  first = 0;
  for (size_t i = lo; i < hi; ++i)
    if (now[i] != want[i]) {
      if (count++ == 0) first = i - lo;
    }
}

RunResult run_on(const Case& c, const BackendPtr& be, const std::vector<Tensor>& inputs, bool upcast, uint8_t poison,
                 const Fault& fault, int64_t misalign) {
  RunResult r;
  std::vector<Guarded> gin(inputs.size()), gout(c.outs.size());
  std::vector<std::vector<uint8_t>> in_bytes(inputs.size());
  std::vector<DType> in_dt(inputs.size());
  std::vector<Tensor> in(inputs.size()), out(c.outs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].defined()) continue;
    in_bytes[i] = raw(inputs[i]);
    in_dt[i] = inputs[i].dtype();
    if (upcast && is_half(in_dt[i])) {
      in_bytes[i] = widen(in_bytes[i], in_dt[i]);
      in_dt[i] = DType::f32;
    }
    gin[i] = make_guarded(be, inputs[i].shape(), in_dt[i], &in_bytes[i], 0, misalign);
    in[i] = gin[i].view;
  }
  r.values.resize(c.outs.size());
  r.dtypes.resize(c.outs.size());
  for (size_t j = 0; j < c.outs.size(); ++j) {
    const OutSpec& o = c.outs[j];
    if (!o.defined) continue;
    const DType dt = upcast && is_half(o.dtype) ? DType::f32 : o.dtype;
    r.dtypes[j] = dt;
    const std::vector<uint8_t>* init = nullptr;
    if (o.init_from >= 0) {
      DEW_INTERNAL_ASSERT(size_t(o.init_from) < inputs.size() && inputs[size_t(o.init_from)].defined());
      DEW_INTERNAL_ASSERT(in_dt[size_t(o.init_from)] == dt && inputs[size_t(o.init_from)].numel() == numel_of(o.shape));
      init = &in_bytes[size_t(o.init_from)];
    }
    gout[j] = make_guarded(be, o.shape, dt, init, poison, misalign);
    out[j] = gout[j].view;
  }
  try {
    c.call(*be, in, out);
    be->synchronize();
  } catch (const dew::Error& e) {
    r.error = e.what();
  } catch (const std::exception& e) {
    r.error = std::string("std::exception: ") + e.what();
  }
  if (!r.error.empty()) return r;

  // Debug faults, applied to the first defined output after the kernel returned.
  for (size_t j = 0; j < c.outs.size() && (fault.value || fault.guard); ++j) {
    if (!out[j].defined() || out[j].numel() == 0) continue;
    const DType dt = out[j].dtype();
    if (fault.value) {
      std::vector<uint8_t> b = raw(out[j]);
      uint8_t* p = b.data() + size_t(out[j].numel() / 2) * dtype_size(dt);
      const double v = load_elem(p, dt);
      store_elem(p, dt, is_floating(dt) ? v + 0.5 + 0.25 * std::fabs(v) : v + 1);
      out[j].copy_from_host(b.data());
    }
    if (fault.guard) {
      std::vector<uint8_t> b = raw(gout[j].flat);
      b[gout[j].before + gout[j].interior] ^= 0xFF;
      gout[j].flat.copy_from_host(b.data());
    }
    break;
  }

  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!in[i].defined()) continue;
    const std::vector<uint8_t> now = raw(gin[i].flat);
    size_t count, first;
    const Guarded& g = gin[i];
    diff_bytes(now, g.bytes, 0, g.before, count, first);
    if (count)
      r.violations.push_back("input " + std::to_string(i) + ": " + where_bytes(first, count, "before the tensor"));
    diff_bytes(now, g.bytes, g.before, g.before + g.interior, count, first);
    if (count)
      r.violations.push_back("input " + std::to_string(i) + ": " +
                             where_bytes(first, count, "inside (inputs are read-only)"));
    diff_bytes(now, g.bytes, g.before + g.interior, now.size(), count, first);
    if (count)
      r.violations.push_back("input " + std::to_string(i) + ": " + where_bytes(first, count, "after the tensor"));
  }
  for (size_t j = 0; j < c.outs.size(); ++j) {
    if (!out[j].defined()) continue;
    const std::vector<uint8_t> now = raw(gout[j].flat);
    size_t count, first;
    const Guarded& g = gout[j];
    diff_bytes(now, g.bytes, 0, g.before, count, first);
    if (count)
      r.violations.push_back("output '" + c.outs[j].name + "': " + where_bytes(first, count, "before the tensor"));
    diff_bytes(now, g.bytes, g.before + g.interior, now.size(), count, first);
    if (count)
      r.violations.push_back("output '" + c.outs[j].name + "': " + where_bytes(first, count, "after the tensor"));
    r.values[j] = out[j].to_doubles();
  }
  return r;
}

// ---------------------------------------------------------------- comparison

struct Verdict {
  bool pass = true;
  bool degenerate = false;
  std::string detail;  // failure description, or stats when verbose
};

std::string index_str(int64_t flat, const Shape& s) {
  std::vector<int64_t> idx(s.size());
  for (int i = int(s.size()) - 1; i >= 0; --i) {
    const int64_t d = std::max<int64_t>(s[size_t(i)], 1);
    idx[size_t(i)] = flat % d;
    flat /= d;
  }
  std::string r = "[";
  for (size_t i = 0; i < idx.size(); ++i) r += (i ? "," : "") + std::to_string(idx[i]);
  return r + "]";
}

std::string num(double v) {
  char b[40];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

Verdict compare(const OutSpec& o, DType dt, const std::vector<double>& ref, const std::vector<double>& got) {
  Verdict v;
  const size_t n = ref.size();
  if (got.size() != n) {
    v.pass = false;
    v.detail = "'" + o.name + "' has " + std::to_string(got.size()) + " elements, the oracle's " + std::to_string(n);
    return v;
  }
  size_t zeros = 0;
  for (double x : ref) zeros += x == 0.0;
  v.degenerate = !o.check.zeros_ok && n > 1 && 2 * zeros > n;

  size_t bad = 0;
  int64_t worst = -1;
  double worst_ratio = 0;
  std::ostringstream os;
  if (o.check.kind == Check::exact) {
    for (size_t i = 0; i < n; ++i) {
      const bool same =
          (std::isnan(ref[i]) && std::isnan(got[i])) || std::memcmp(&ref[i], &got[i], sizeof(double)) == 0;
      if (!same) {
        if (bad++ == 0) worst = int64_t(i);
      }
    }
    if (bad) {
      v.pass = false;
      os << "'" << o.name << "' differs in " << bad << " of " << n << " elements (exact check); first " << o.name
         << index_str(worst, o.shape) << " = " << num(got[size_t(worst)]) << ", oracle " << num(ref[size_t(worst)]);
    } else {
      os << "'" << o.name << "' exact";
    }
    v.detail = os.str();
    return v;
  }

  // Tolerance check.
  const double acc_eps = dt == DType::f64 ? dtype_epsilon(DType::f64) : dtype_epsilon(DType::f32);
  const double rtol = o.check.rtol_override >= 0 ? o.check.rtol_override
                                                 : o.check.k_store * dtype_epsilon(dt) +
                                                       o.check.k * acc_eps * std::sqrt(std::max(1.0, o.check.K));
  double sumsq = 0, errsq = 0;
  size_t finite = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(ref[i])) {
      sumsq += ref[i] * ref[i];
      ++finite;
    }
  const double rms = finite ? std::sqrt(sumsq / double(finite)) : 0.0;
  const double atol = rtol * rms;
  size_t pattern_bad = 0;
  int64_t first_pattern = -1;
  for (size_t i = 0; i < n; ++i) {
    const double a = got[i], b = ref[i];
    if (o.check.zero_pattern && ((a == 0.0) != (b == 0.0))) {
      if (pattern_bad++ == 0) first_pattern = int64_t(i);
    }
    double ratio;
    if (std::isnan(a) || std::isnan(b)) {
      ratio = std::isnan(a) && std::isnan(b) ? 0.0 : INFINITY;
    } else if (std::isinf(a) || std::isinf(b)) {
      ratio = a == b ? 0.0 : INFINITY;
    } else {
      const double err = std::fabs(a - b);
      errsq += err * err;
      const double allowed = atol + rtol * std::fabs(b);
      ratio = err == 0.0 ? 0.0 : (allowed > 0 ? err / allowed : INFINITY);
    }
    if (ratio > 1.0) ++bad;
    if (ratio > worst_ratio || worst < 0) {
      worst_ratio = ratio;
      worst = int64_t(i);
    }
  }
  const double nmse = sumsq > 0 ? errsq / sumsq : (errsq > 0 ? INFINITY : 0.0);
  const bool nmse_bad = nmse > rtol * rtol;
  if (bad || nmse_bad || pattern_bad) {
    v.pass = false;
    os << "'" << o.name << "'";
    if (bad) {
      const size_t w = size_t(worst);
      os << " " << bad << " of " << n << " elements out of tolerance; worst " << o.name << index_str(worst, o.shape)
         << " = " << num(got[w]) << ", oracle " << num(ref[w]) << ", |err| " << num(std::fabs(got[w] - ref[w])) << " > "
         << num(atol + rtol * std::fabs(ref[w])) << " (rtol " << num(rtol) << ", atol " << num(atol) << ")";
    }
    if (nmse_bad) os << (bad ? ";" : "") << " nmse " << num(nmse) << " > " << num(rtol * rtol);
    if (pattern_bad)
      os << (bad || nmse_bad ? ";" : "") << " zero pattern differs in " << pattern_bad << " elements (first " << o.name
         << index_str(first_pattern, o.shape) << ": " << num(got[size_t(first_pattern)]) << " vs oracle "
         << num(ref[size_t(first_pattern)]) << ")";
  } else {
    char b[160];
    std::snprintf(b, sizeof b, "'%s' worst %.3g of tol, nmse %.3g (rtol %.3g)", o.name.c_str(), worst_ratio, nmse,
                  rtol);
    os << b;
  }
  v.detail = os.str();
  return v;
}

// ---------------------------------------------------------------- the driver

std::string regex_escape(const std::string& s) {
  std::string r;
  for (char ch : s) {
    if (std::strchr(".^$|()[]{}*+?\\", ch)) r += '\\';
    r += ch;
  }
  return r;
}

std::string repro_line(const Args& a, const Case& c) {
  std::string r = "dew-conformance --backend " + a.backend + " --against " + a.against;
  for (const auto& d : a.plugin_dirs) r += " --plugin-dir '" + d + "'";
  for (const auto& f : a.plugin_files) r += " --plugin '" + f + "'";
  if (a.misalign) r += " --misalign " + std::to_string(a.misalign);
  for (const auto& o : a.options) r += " --option '" + o + "'";
  r += std::string(" --kernel ") + kernel_name(c.kernel) + " --filter '^" + regex_escape(c.id) + "$'";
  if (!a.inject_fault.empty()) r += " --inject-fault " + a.inject_fault;
  if (!a.inject_guard.empty()) r += " --inject-guard " + a.inject_guard;
  return r;
}

// Kernels whose bf16/f16 cases the oracle may compute in f32 instead (arithmetic, not bit movers).
bool may_upcast(Kernel k) {
  switch (k) {
    case Kernel::fill:
    case Kernel::cast:
    case Kernel::strided_copy:
    case Kernel::gather_rows:
    case Kernel::random:
    case Kernel::dropout:
    case Kernel::argmax:
      return false;
    default:
      return true;
  }
}

void load_plugins(const Args& a) {
  for (const auto& d : a.plugin_dirs) {
    std::error_code ec;
    DEW_USAGE_CHECK(std::filesystem::is_directory(d, ec), "--plugin-dir ", d, ": no such folder");
  }
  auto& reg = Registry::global();
  for (const auto& f : a.plugin_files) reg.load(f);
  std::vector<std::string> dirs = a.plugin_dirs;
  for (const auto& d : Registry::default_plugin_dirs()) dirs.push_back(d);
  if (!a.plugins.empty()) {
    Options o({{"plugins", a.plugins}});
    reg.discover(dirs, o.get_strings("plugins", {}));
    return;
  }
  // Load just the two backends' plugins when they are named like them (a broken unrelated plugin then
  // cannot stop the run); otherwise everything found.
  if (reg.contains(Backend::kind, a.backend) && reg.contains(Backend::kind, a.against)) return;
  std::vector<std::string> only{a.backend};
  if (a.against != a.backend) only.push_back(a.against);
  try {
    reg.discover(dirs, only);
  } catch (const UsageError&) {
    reg.discover(dirs);
  }
}

int run(const Args& a) {
  load_plugins(a);
  auto& reg = Registry::global();
  for (const std::string& name : {a.backend, a.against}) {
    const ErasedComponent& comp = reg.find(Backend::kind, name);  // throws, listing the known backends
    if (comp.probe) {
      const Support s = comp.probe();
      if (!s.ok) {
        std::printf("dew-conformance: backend '%s' cannot run here: %s\n", name.c_str(), s.reason.c_str());
        return 77;
      }
    }
  }
  std::map<std::string, std::string> tested_options;
  for (const std::string& kv : a.options) {
    const size_t eq = kv.find('=');
    DEW_USAGE_CHECK(eq != std::string::npos && eq > 0, "--option '", kv, "': expected KEY=VALUE (e.g. isa=avx2)");
    tested_options[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  BackendPtr tested = create_backend(a.backend, Options(tested_options, "dew-conformance --option"));
  BackendPtr oracle = create_backend(a.against);
  if (a.threads > 0) tested->set_threads(a.threads);

  std::vector<Case> cases = all_cases();
  // The table must cover the whole kernel algebra, and ids must be unique.
  {
    std::vector<int> per_kernel(size_t(Kernel::count_), 0);
    std::map<std::string, int> ids;
    for (const Case& c : cases) {
      per_kernel[size_t(c.kernel)]++;
      DEW_CHECK(ids[c.id]++ == 0, "internal: duplicate case id ", c.id);
    }
    for (size_t k = 0; k < per_kernel.size(); ++k)
      DEW_CHECK(per_kernel[k] > 0, "internal: no conformance case covers kernel ", kernel_name(Kernel(k)));
  }

  std::vector<Kernel> kernels;
  if (!a.kernels.empty()) {
    Options o({{"k", a.kernels}});
    for (const std::string& name : o.get_strings("k", {})) kernels.push_back(kernel_from_name(name));
  }
  std::regex re;
  if (!a.filter.empty()) {
    try {
      re = std::regex(a.filter, std::regex::ECMAScript);
    } catch (const std::regex_error& e) {
      DEW_USAGE_CHECK(false, "--filter '", a.filter, "': not a valid regular expression (", e.what(), ")");
    }
  }
  std::vector<const Case*> selected;
  for (const Case& c : cases) {
    if (!kernels.empty() && std::find(kernels.begin(), kernels.end(), c.kernel) == kernels.end()) continue;
    if (!a.filter.empty() && !std::regex_search(c.id, re)) continue;
    selected.push_back(&c);
  }
  DEW_USAGE_CHECK(!selected.empty(), "no case matches --kernel '", a.kernels, "' --filter '", a.filter, "' (",
                  cases.size(), " cases; --list shows them)");
  if (a.list) {
    for (const Case* c : selected) std::printf("%s\n", c->id.c_str());
    return 0;
  }
  Kernel fault_k = Kernel::count_, guard_k = Kernel::count_;
  if (!a.inject_fault.empty()) fault_k = kernel_from_name(a.inject_fault);
  if (!a.inject_guard.empty()) guard_k = kernel_from_name(a.inject_guard);

  std::printf("dew-conformance: backend '%s' against '%s', %zu of %zu cases\n", a.backend.c_str(), a.against.c_str(),
              selected.size(), cases.size());
  int passed = 0, failed = 0, skipped = 0, mistrusted = 0;
  std::vector<std::string> failures;
  const auto t_start = std::chrono::steady_clock::now();
  for (const Case* cp : selected) {
    const Case& c = *cp;
    const auto t0 = std::chrono::steady_clock::now();
    std::snprintf(g_crash_note, sizeof g_crash_note, "in case %s\n  repro: %s\n", c.id.c_str(),
                  repro_line(a, c).c_str());
    std::string skip;
    for (DType dt : c.dtypes) {
      const Support s = tested->supports(c.kernel, dt);
      if (!s.ok) {
        skip = s.reason;
        break;
      }
    }
    bool upcast = false;
    if (skip.empty()) {
      for (DType dt : c.dtypes) {
        const Support s = oracle->supports(c.kernel, dt);
        if (s.ok) continue;
        if (is_half(dt) && may_upcast(c.kernel) && oracle->supports(c.kernel, DType::f32).ok) {
          upcast = true;
        } else {
          skip = "the oracle '" + a.against + "' does not run it: " + s.reason;
          break;
        }
      }
    }
    if (!skip.empty()) {
      ++skipped;
      std::printf("SKIPPED    %s: %s\n", c.id.c_str(), skip.c_str());
      continue;
    }

    std::vector<std::string> problems;
    std::vector<std::string> stats;
    bool degenerate = false;
    std::string degenerate_what;
    try {
      Gen gen(oracle, philox::stream_of(c.id.c_str()));
      std::vector<Tensor> inputs = c.inputs(gen);
      const RunResult ro = run_on(c, oracle, inputs, upcast, kPoisonOracle, Fault{}, a.misalign);
      if (!ro.error.empty()) problems.push_back("the oracle '" + a.against + "' threw: " + ro.error);
      for (const auto& s : ro.violations) problems.push_back("the oracle '" + a.against + "' wrote outside: " + s);
      Fault f;
      f.value = c.kernel == fault_k;
      f.guard = c.kernel == guard_k;
      const RunResult rt = run_on(c, tested, inputs, false, kPoisonTested, f, a.misalign);
      if (!rt.error.empty()) problems.push_back("threw: " + rt.error);
      for (const auto& s : rt.violations) problems.push_back("wrote outside its tensors: " + s);
      if (ro.error.empty() && rt.error.empty()) {
        for (size_t j = 0; j < c.outs.size(); ++j) {
          if (!c.outs[j].defined) continue;
          const Verdict v = compare(c.outs[j], rt.dtypes[j], ro.values[j], rt.values[j]);
          if (!v.pass)
            problems.push_back(v.detail);
          else
            stats.push_back(v.detail);
          if (v.degenerate && !degenerate) {
            degenerate = true;
            degenerate_what = c.outs[j].name;
          }
        }
      }
    } catch (const std::exception& e) {
      problems.push_back(std::string("preparing the inputs on the oracle failed: ") + e.what());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!problems.empty()) {
      ++failed;
      std::string msg;
      for (size_t i = 0; i < problems.size(); ++i) msg += (i ? " | " : "") + problems[i];
      std::printf("FAILED     %s: %s%s\n", c.id.c_str(), msg.c_str(), upcast ? " [oracle in f32]" : "");
      std::printf("  repro: %s\n", repro_line(a, c).c_str());
      failures.push_back(c.id);
    } else if (degenerate) {
      ++mistrusted;
      std::printf("MISTRUSTED %s: the oracle's '%s' is more than half zeros; the comparison proves little\n",
                  c.id.c_str(), degenerate_what.c_str());
    } else {
      ++passed;
      if (a.verbose) {
        std::string msg;
        for (size_t i = 0; i < stats.size(); ++i) msg += (i ? "; " : "") + stats[i];
        std::printf("PASSED     %s  (%.1f ms%s) %s\n", c.id.c_str(), ms, upcast ? ", oracle in f32" : "", msg.c_str());
      } else {
        std::printf("PASSED     %s\n", c.id.c_str());
      }
    }
    std::fflush(stdout);
  }
  std::snprintf(g_crash_note, sizeof g_crash_note, "after the last case\n");
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
  std::printf(
      "\ndew-conformance: '%s' against '%s': %zu cases: %d passed, %d failed, %d skipped, %d mistrusted (%.1f s)\n",
      a.backend.c_str(), a.against.c_str(), selected.size(), passed, failed, skipped, mistrusted, secs);
  if (!a.inject_fault.empty() || !a.inject_guard.empty())
    std::printf("dew-conformance: faults were injected on purpose (--inject-fault / --inject-guard)\n");
  if (failed) {
    std::printf("failed:\n");
    for (const auto& id : failures) std::printf("  %s\n", id.c_str());
  }
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  po::options_description d(
      "dew-conformance — checks a backend's kernels against an oracle backend\n"
      "usage: dew-conformance --backend NAME [--against ref] [--kernel K[,K..]] [--filter REGEX] [options]\n"
      "exit status: 0 no failure, 1 failures, 2 usage/setup error, 77 backend cannot run here\noptions");
  d.add_options()("help,h", "this help")("backend,b", po::value(&a.backend), "the backend under test (e.g. cpu)")(
      "against", po::value(&a.against)->default_value("ref"), "the oracle backend")(
      "kernel,k", po::value(&a.kernels), "only cases of these kernels (comma-separated names)")(
      "filter,f", po::value(&a.filter), "only cases whose id matches this regex (searched)")(
      "verbose,v", po::bool_switch(&a.verbose), "print error statistics and timings of passing cases")(
      "list", po::bool_switch(&a.list), "print the selected case ids and exit")(
      "plugin-dir", po::value(&a.plugin_dirs)->composing(), "extra plugin folder (repeatable)")(
      "plugin", po::value(&a.plugin_files)->composing(), "load this plugin file (repeatable)")(
      "plugins", po::value(&a.plugins), "comma-separated plugin names to load (default: the two backends')")(
      "threads", po::value(&a.threads)->default_value(0), "threads of the tested backend (0: its default)")(
      "option", po::value(&a.options)->composing(), "KEY=VALUE option of the tested backend (repeatable; e.g. isa=avx2)")(
      "misalign", po::value(&a.misalign)->default_value(0),
      "place every tensor this many elements past an aligned offset")(
      "inject-fault", po::value(&a.inject_fault), "debug: perturb one output element of KERNEL's cases (must fail)")(
      "inject-guard", po::value(&a.inject_guard), "debug: overwrite a guard byte after KERNEL's output (must fail)");
  try {
    po::variables_map vm;
    po::store(po::parse_command_line(argc, argv, d), vm);
    po::notify(vm);
    if (vm.count("help")) {
      std::cout << d << "\n";
      return 0;
    }
    DEW_USAGE_CHECK(!a.backend.empty(), "--backend is required (e.g. --backend cpu); --help lists the options");
    DEW_USAGE_CHECK(a.misalign >= 0 && a.misalign < 64, "--misalign ", a.misalign, ": must be in [0, 64)");
    install_crash_handlers();
    return run(a);
  } catch (const po::error& e) {
    std::fprintf(stderr, "dew-conformance: %s (--help lists the options)\n", e.what());
    return 2;
  } catch (const dew::Error& e) {
    std::fprintf(stderr, "dew-conformance: %s\n", e.describe().c_str());
    return 2;  // usage and setup errors alike: the run did not happen
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dew-conformance: %s\n", e.what());
    return 2;
  }
}
