// core/registry/registry.cpp — the process-wide registry and the plugin loader (Boost.DLL).
//
// Invariants:
//  * A plugin file is opened RTLD_NOW | RTLD_LOCAL; only `dew_plugin_entry` is resolved from it.
//  * The handshake (ABI version, build fingerprint) is checked before any C++ object crosses.
//  * A plugin's registrations are staged and committed only when all succeed: a failing plugin leaves
//    the registry as it was.
//  * Loaded libraries are never closed: the registry is leaked at exit, and every component (and so
//    every product, see Registry::create) holds a reference to its library.
//  * The core's own components (registry/builtins.cpp) are registered when the registry is first used,
//    before any plugin, with origin "core".
#include "dew/registry.hpp"

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <elf.h>

#include <fstream>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <set>

#include "registry/builtins.hpp"

namespace dew {

namespace fs = std::filesystem;

std::string Origin::describe() const {
  std::string s = "plugin '" + plugin + "' (" + file;
  if (!source.empty()) {
    const auto slash = source.find_last_of('/');
    s += ", " + (slash == std::string::npos ? source : source.substr(slash + 1)) + ":" + std::to_string(line);
  }
  return s + ")";
}

namespace {

// "N" of the "kernel-algebra N" field of a build fingerprint; empty when it has none (a foreign or old build).
std::string kernel_algebra_of(const std::string& fingerprint) {
  const std::string key = "kernel-algebra ";
  const size_t at = fingerprint.find(key);
  if (at == std::string::npos) return "";
  const size_t end = fingerprint.find(';', at);
  return fingerprint.substr(at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size());
}

struct LoadedLibrary {
  boost::dll::shared_library lib;
  PluginRecord record;
};

class StagingRegistrar : public Registrar {
 public:
  void add_erased(ErasedComponent c) override { staged.push_back(std::move(c)); }
  std::vector<ErasedComponent> staged;
};

class RegistryImpl;

class BuiltinRegistrar : public Registrar {
 public:
  explicit BuiltinRegistrar(RegistryImpl& r) : registry_(r) {}
  void add_erased(ErasedComponent c) override;

 private:
  RegistryImpl& registry_;
};

class RegistryImpl final : public Registry {
 public:
  RegistryImpl() : builtin_(*this) {}

  // Why `file` cannot be a loadable 64-bit ELF shared object, or "" when its headers and every loadable
  // segment lie inside the file. dlopen maps segments past the end of a truncated file, and touching
  // them ends the process with SIGBUS: such files are refused before dlopen.
  static std::string elf_problem(const std::string& file) {
    std::ifstream in(file, std::ios::binary);
    if (!in) return "cannot be opened for reading";
    in.seekg(0, std::ios::end);
    const uint64_t size = uint64_t(in.tellg());
    in.seekg(0);
    Elf64_Ehdr eh{};
    if (size < sizeof eh || !in.read(reinterpret_cast<char*>(&eh), sizeof eh))
      return "not a shared library (" + std::to_string(size) + " bytes, shorter than an ELF header)";
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) return "not a shared library (no ELF signature)";
    if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_type != ET_DYN) return "not a 64-bit ELF shared library";
    if (eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phoff > size ||
        uint64_t(eh.e_phnum) * sizeof(Elf64_Phdr) > size - eh.e_phoff)
      return "truncated or damaged (its program headers lie past its " + std::to_string(size) + " bytes)";
    if (eh.e_shoff > size || uint64_t(eh.e_shnum) * eh.e_shentsize > size - eh.e_shoff)
      return "truncated or damaged (its section headers lie past its " + std::to_string(size) + " bytes)";
    in.seekg(std::streamoff(eh.e_phoff));
    for (unsigned i = 0; i < eh.e_phnum; ++i) {
      Elf64_Phdr ph{};
      if (!in.read(reinterpret_cast<char*>(&ph), sizeof ph)) return "truncated (program header unreadable)";
      if (ph.p_type == PT_LOAD && (ph.p_offset > size || ph.p_filesz > size - ph.p_offset))
        return "truncated or damaged: a segment needs bytes up to " + std::to_string(ph.p_offset + ph.p_filesz) +
               " but the file has " + std::to_string(size);
    }
    return {};
  }

  void load(const std::string& path) override {
    std::lock_guard lock(mutex_);
    std::error_code ec;
    const fs::path canonical = fs::weakly_canonical(fs::path(path), ec);
    const std::string file = ec ? path : canonical.string();
    if (loaded_files_.count(file)) return;
    DEW_CHECK(fs::exists(file, ec), "plugin ", file, ": no such file");

    if (const std::string why = elf_problem(file); !why.empty()) DEW_CHECK(false, "plugin ", file, ": cannot be loaded: ", why);
    auto loaded = std::make_shared<LoadedLibrary>();
    try {
      loaded->lib.load(file, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
    } catch (const std::exception& e) {
      std::string why = clean_dl_error(e.what());
      if (why.rfind(file + ": ", 0) == 0) why.erase(0, file.size() + 2);  // dlerror repeats the path
      DEW_CHECK(false, "plugin ", file, ": cannot be loaded: ", why);
    }
    DEW_CHECK_HINT(loaded->lib.has(DEW_PLUGIN_ENTRY_SYMBOL), "build it with dew_add_plugin() and DEW_PLUGIN(...)",
                   "plugin ", file, ": no entry symbol '", DEW_PLUGIN_ENTRY_SYMBOL, "' (not a dew plugin)");
    auto entry = loaded->lib.get<const dew_plugin_v1*()>(DEW_PLUGIN_ENTRY_SYMBOL);
    const dew_plugin_v1* info = entry();
    DEW_CHECK(info != nullptr, "plugin ", file, ": dew_plugin_entry returned null");
    DEW_CHECK_HINT(info->abi_version == DEW_PLUGIN_ABI_VERSION, "rebuild the plugin against dew SDK " DEW_SDK_VERSION,
                   "plugin ", file, ": built for plugin ABI ", info->abi_version, ", this dew expects ABI ",
                   DEW_PLUGIN_ABI_VERSION);
    const std::string fingerprint = info->fingerprint ? info->fingerprint : "";
    // The kernel table's version first: a backend built on another table has another vtable.
    const std::string algebra = kernel_algebra_of(fingerprint);
    DEW_CHECK_HINT(algebra.empty() || algebra == DEW_STR(DEW_KERNEL_ALGEBRA_VERSION),
                   "rebuild the plugin against dew SDK " DEW_SDK_VERSION, "plugin ", file, ": built for kernel algebra ",
                   algebra, ", this dew has kernel algebra ", DEW_KERNEL_ALGEBRA_VERSION);
    DEW_CHECK_HINT(fingerprint == DEW_BUILD_FINGERPRINT,
                   "rebuild the plugin with the same compiler and dew SDK as the host", "plugin ", file,
                   ": build fingerprint '", fingerprint, "' does not match the host's '", DEW_BUILD_FINGERPRINT, "'");
    const std::string name = info->name ? info->name : "";
    DEW_CHECK(!name.empty(), "plugin ", file, ": has no name");
    DEW_CHECK(info->register_all != nullptr, "plugin ", file, ": has no register function");
    for (const auto& other : libraries_)
      DEW_CHECK(other->record.name != name, "plugin name '", name, "' is provided twice: by ", file, " and by ",
                other->record.file);

    StagingRegistrar staging;
    char err[1024] = {0};
    const int rc = info->register_all(static_cast<Registrar*>(&staging), err, sizeof err);
    err[sizeof err - 1] = 0;  // a C plugin may not terminate it
    DEW_CHECK(rc == 0, "plugin ", file, ": registration failed: ", err[0] ? err : "no message");

    // Check the whole batch before committing any of it.
    std::set<std::pair<std::string, std::string>> seen;
    for (ErasedComponent& c : staging.staged) {
      c.origin.plugin = name;
      c.origin.file = file;
      c.library = loaded;
      const auto key = std::make_pair(c.kind, c.name);
      DEW_CHECK(!c.name.empty(), "plugin ", file, ": registers a ", c.kind, " with an empty name");
      DEW_CHECK(seen.insert(key).second, "duplicate ", c.kind, " '", c.name, "': registered twice by ",
                c.origin.describe());
      auto it = components_.find(key);
      DEW_CHECK(it == components_.end(), "duplicate ", c.kind, " '", c.name, "': ", c.origin.describe(), " and ",
                it == components_.end() ? std::string() : it->second.origin.describe());
    }
    loaded->record = {name,        info->version ? info->version : "",
                      fingerprint, info->build_notes ? info->build_notes : "",
                      file,        info->abi_version,
                      {}};
    for (ErasedComponent& c : staging.staged) {
      loaded->record.components.push_back(c.kind + "/" + c.name);
      const auto key = std::make_pair(c.kind, c.name);
      components_.emplace(key, std::move(c));
    }
    libraries_.push_back(loaded);
    loaded_files_.insert(file);
  }

  void discover(const std::vector<std::string>& dirs, const std::vector<std::string>& only) override {
    std::vector<std::string> files;
    std::set<std::string> stems;
    for (const std::string& dir : dirs) {
      std::error_code ec;
      if (dir.empty() || !fs::is_directory(dir, ec)) continue;
      std::vector<fs::path> here;
      for (const auto& e : fs::directory_iterator(dir, ec)) {
        const std::string fname = e.path().filename().string();
        if (fname.rfind("dew_", 0) == 0 && e.path().extension() == ".so") here.push_back(e.path());
      }
      std::sort(here.begin(), here.end());
      for (const fs::path& p : here) {
        const std::string stem = p.stem().string().substr(4);
        if (!stems.insert(stem).second) continue;  // the first folder wins
        if (!only.empty() && std::find(only.begin(), only.end(), stem) == only.end()) continue;
        files.push_back(p.string());
      }
    }
    for (const std::string& want : only) {
      if (stems.count(want)) continue;
      std::string known;
      for (const auto& s : stems) known += (known.empty() ? "" : ", ") + s;
      DEW_USAGE_CHECK(false, "unknown plugin '", want, "'; found: ", known.empty() ? "none" : known);
    }
    for (const std::string& f : files) load(f);
  }

  const ErasedComponent& find(const std::string& kind, const std::string& name) const override {
    std::lock_guard lock(mutex_);
    auto it = components_.find({kind, name});
    if (it != components_.end()) return it->second;
    std::string known;
    for (const auto& [key, c] : components_)
      if (key.first == kind) known += (known.empty() ? "" : ", ") + key.second + " (" + c.origin.plugin + ")";
    if (known.empty())
      throw UsageError("unknown " + kind + " '" + name + "'; no " + kind + " is registered", {}, 0,
                       "no plugin providing a " + kind + " was loaded; check --plugin-dir or DEW_PLUGIN_PATH");
    throw UsageError("unknown " + kind + " '" + name + "'; known: " + known);
  }

  bool contains(const std::string& kind, const std::string& name) const override {
    std::lock_guard lock(mutex_);
    return components_.count({kind, name}) != 0;
  }

  std::vector<const ErasedComponent*> components(const std::string& kind) const override {
    std::lock_guard lock(mutex_);
    std::vector<const ErasedComponent*> out;
    for (const auto& [key, c] : components_)
      if (kind.empty() || key.first == kind) out.push_back(&c);
    return out;
  }

  std::vector<PluginRecord> plugins() const override {
    std::lock_guard lock(mutex_);
    std::vector<PluginRecord> out;
    for (const auto& l : libraries_) out.push_back(l->record);
    return out;
  }

  Registrar& builtin_registrar() override { return builtin_; }

  void add_builtin(ErasedComponent c) {
    std::lock_guard lock(mutex_);
    c.origin.plugin = "core";
    c.origin.file = "<libdew>";
    const auto key = std::make_pair(c.kind, c.name);
    auto it = components_.find(key);
    DEW_CHECK(it == components_.end(), "duplicate ", c.kind, " '", c.name, "': ", c.origin.describe(), " and ",
              it == components_.end() ? std::string() : it->second.origin.describe());
    components_.emplace(key, std::move(c));
  }

 private:
  static std::string clean_dl_error(std::string s) {
    // Boost appends ": Bad file descriptor"-style errno noise after the dlerror text.
    const auto open = s.find("(dlerror system message: ");
    if (open != std::string::npos) {
      const auto close = s.find(')', open);
      return s.substr(open + 25, close == std::string::npos ? std::string::npos : close - open - 25);
    }
    return s;
  }

  mutable std::recursive_mutex mutex_;
  std::map<std::pair<std::string, std::string>, ErasedComponent> components_;
  std::vector<std::shared_ptr<LoadedLibrary>> libraries_;
  std::set<std::string> loaded_files_;
  BuiltinRegistrar builtin_;
};

void BuiltinRegistrar::add_erased(ErasedComponent c) { registry_.add_builtin(std::move(c)); }

}  // namespace

Registry& Registry::global() {
  static RegistryImpl* instance = [] {
    auto* r = new RegistryImpl();  // leaked on purpose: plugins are never unloaded
    register_builtins(r->builtin_registrar());
    return r;
  }();
  return *instance;
}

std::vector<std::string> Registry::default_plugin_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("DEW_PLUGIN_PATH")) {
    std::string s = env, item;
    size_t start = 0;
    while (start <= s.size()) {
      const size_t colon = s.find(':', start);
      item = s.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
      if (!item.empty()) dirs.push_back(item);
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
  }
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) {
    dirs.push_back((exe.parent_path().parent_path() / "lib" / "dew" / "plugins").string());
    dirs.push_back((exe.parent_path() / "plugins").string());
  }
  return dirs;
}

BackendPtr create_backend(const std::string& name, const Options& options) {
  const ErasedComponent& c = Registry::global().find(Backend::kind, name);
  if (c.probe) {
    const Support s = c.probe();
    // A backend that cannot run on this machine is the user's choice to change (exit status 2).
    DEW_USAGE_CHECK(s.ok, "backend '", name, "' cannot run here: ", s.reason);
  }
  return Registry::global().create<Backend>(name, options);
}

}  // namespace dew
