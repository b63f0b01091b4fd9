// dew/registry.hpp — the runtime registry of named components and the Registrar plugins fill.
//
// Every swappable part (backend, backbone, objective, sampler, data source, communicator, ...) is
// registered under a kind and a name with a factory. Kinds are strings, taken from the interface's
// `static constexpr const char* kind`. The registry records where each name came from (plugin file,
// plugin name, source file and line); a duplicate name is refused naming both origins; an unknown
// name is refused listing the known names of that kind. Products of a plugin's factory hold a
// reference to the plugin's library, so code is never unloaded under a live object (and libraries
// are never dlclose'd at exit).
//
// A plugin:
//   #include <dew/registry.hpp>
//   DEW_PLUGIN("myplugin", "0.1.0") {
//     registrar.add<dew::Backend>({.name = "mine", .description = "...",
//         .factory = [](const dew::Options& o) { return std::make_shared<MyBackend>(o); }});
//   }
#pragma once
#include <cstdio>
#include <functional>
#include <memory>
#include <source_location>
#include <string>
#include <typeinfo>
#include <vector>

#include "dew/backend.hpp"
#include "dew/error.hpp"
#include "dew/options.hpp"
#include "dew/plugin.h"

namespace dew {

struct Origin {
  std::string plugin;  // plugin name ("core" for built-ins)
  std::string file;    // library path ("<libdew>" for built-ins)
  std::string source;  // source file of the registration
  int line = 0;
  std::string describe() const;  // "plugin 'cpu' (build/plugins/dew_cpu.so, cpu/entry.cpp:12)"
};

// A registration of one name, type-erased. Factories return shared_ptr<void> pointing at a T.
template <class T>
struct Component {
  std::string name;
  std::string description;
  std::function<std::shared_ptr<T>(const Options&)> factory;
  // (optional) can it run here? e.g. a GPU backend without a driver says no, with the reason.
  std::function<Support()> probe;
  // (optional) the options it reads, for --help and validation.
  std::vector<OptionSpec> options;
};

struct ErasedComponent {
  std::string kind;
  std::string type;  // typeid(T).name() of the interface
  std::string name;
  std::string description;
  std::function<std::shared_ptr<void>(const Options&)> factory;
  std::function<Support()> probe;
  std::vector<OptionSpec> options;
  Origin origin;
  std::shared_ptr<void> library;  // keeps the plugin library loaded while a product is alive
};

class Registrar {
 public:
  virtual ~Registrar() = default;
  template <class T>
  void add(Component<T> c, std::source_location where = std::source_location::current()) {
    ErasedComponent e;
    e.kind = T::kind;
    e.type = typeid(T).name();
    e.name = std::move(c.name);
    e.description = std::move(c.description);
    auto f = std::move(c.factory);
    DEW_INTERNAL_ASSERT(f);
    e.factory = [f](const Options& o) -> std::shared_ptr<void> { return f(o); };
    e.probe = std::move(c.probe);
    e.options = std::move(c.options);
    e.origin.source = where.file_name();
    e.origin.line = int(where.line());
    add_erased(std::move(e));
  }
  virtual void add_erased(ErasedComponent c) = 0;
};

// What a loaded plugin library is.
struct PluginRecord {
  std::string name, version, fingerprint, build_notes, file;
  uint32_t abi_version = 0;
  std::vector<std::string> components;  // "kind/name"
};

class Registry {
 public:
  // The process-wide registry (defined once, in libdew).
  static Registry& global();

  // Loads one plugin file: checks the handshake and registers its components. Throws dew::Error with
  // one line naming the file and what is wrong (missing entry symbol, ABI or fingerprint mismatch,
  // duplicate name, a register function that failed).
  virtual void load(const std::string& path) = 0;
  // Loads every plugin file (dew_*.so) in the directories, in order; names in `only` (when not empty)
  // restrict which plugins are loaded; the first failure throws.
  virtual void discover(const std::vector<std::string>& dirs, const std::vector<std::string>& only = {}) = 0;
  // The default plugin folders: DEW_PLUGIN_PATH (colon-separated) then the folder next to the running
  // executable (../lib/dew/plugins and ./plugins relative to it).
  static std::vector<std::string> default_plugin_dirs();

  virtual const ErasedComponent& find(const std::string& kind,
                                      const std::string& name) const = 0;  // throws listing known
  virtual bool contains(const std::string& kind, const std::string& name) const = 0;
  virtual std::vector<const ErasedComponent*> components(const std::string& kind = {}) const = 0;
  virtual std::vector<PluginRecord> plugins() const = 0;
  virtual Registrar& builtin_registrar() = 0;  // registers core-provided components (origin "core")

  template <class T>
  std::shared_ptr<T> create(const std::string& name, const Options& options = {}) const {
    const ErasedComponent& c = find(T::kind, name);
    DEW_CHECK(c.type == typeid(T).name(), T::kind, " '", name, "' from ", c.origin.describe(),
              " was registered with a different interface type than the one asked for (two interfaces share the kind '",
              T::kind, "')");
    std::shared_ptr<void> product = c.factory(options);
    DEW_CHECK(product != nullptr, "factory of ", T::kind, " '", name, "' returned nothing");
    auto lib = c.library;
    T* raw = static_cast<T*>(product.get());
    // The product's deleter holds both the object and the library: the library outlives the object.
    return std::shared_ptr<T>(raw, [product = std::move(product), lib = std::move(lib)](T*) mutable {
      product.reset();
      lib.reset();
    });
  }

 protected:
  virtual ~Registry() = default;
};

// Loads the backend by name ("ref", "cpu", "cuda"): refuses, with its probe's reason, one that cannot run here.
BackendPtr create_backend(const std::string& name, const Options& options = {});

}  // namespace dew

// ---- the plugin entry point, for C++ plugins ----
#define DEW_PLUGIN_WITH_NOTES(NAME, VERSION, NOTES)                                               \
  static void dew_plugin_register_impl(::dew::Registrar& registrar);                              \
  static int dew_plugin_register_c(void* r, char* err, size_t n) noexcept {                       \
    try {                                                                                         \
      dew_plugin_register_impl(*static_cast<::dew::Registrar*>(r));                               \
      return 0;                                                                                   \
    } catch (const std::exception& e) {                                                           \
      std::snprintf(err, n, "%s", e.what());                                                      \
    } catch (...) {                                                                               \
      std::snprintf(err, n, "unknown exception");                                                 \
    }                                                                                             \
    return 1;                                                                                     \
  }                                                                                               \
  extern "C" __attribute__((visibility("default"))) const dew_plugin_v1* dew_plugin_entry(void) { \
    static const dew_plugin_v1 info = {DEW_PLUGIN_ABI_VERSION, NAME,  VERSION,                    \
                                       DEW_BUILD_FINGERPRINT,  NOTES, &dew_plugin_register_c};    \
    return &info;                                                                                 \
  }                                                                                               \
  static void dew_plugin_register_impl([[maybe_unused]] ::dew::Registrar& registrar)

#define DEW_PLUGIN(NAME, VERSION) DEW_PLUGIN_WITH_NOTES(NAME, VERSION, "")
