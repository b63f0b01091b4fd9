// tests/registry/test_registry.cpp — the registry and the plugin loader (core/registry/registry.cpp).
//
// Each broken plugin must be refused with one clear line naming the file and what is wrong, must leave
// the registry as it was, and the host must go on working. The good plugin's greeter must be created,
// with its provenance recorded and its library held alive by the product. Plugin paths come from
// CMake ($<TARGET_FILE:...>); the test plugins are built by tests/registry/plugins/.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>

#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <filesystem>
#include <map>
#include <string>

#include "greeter.hpp"

namespace fs = std::filesystem;
using dew_test::Greeter;

namespace {

dew::Registry& reg() { return dew::Registry::global(); }

std::string base(const std::string& path) { return fs::path(path).filename().string(); }

// Everything observable about the registry, to check that a refused plugin changed nothing.
struct Snapshot {
  std::vector<std::string> components, plugins;
  static Snapshot take() {
    Snapshot s;
    for (const auto* c : reg().components()) s.components.push_back(c->kind + "/" + c->name + "@" + c->origin.file);
    for (const auto& p : reg().plugins()) s.plugins.push_back(p.name + "@" + p.file);
    return s;
  }
  bool operator==(const Snapshot&) const = default;
};

// Loads `path`, which must fail with a dew::Error; returns it. Checks the registry did not change and
// the message is one line naming the file.
dew::Error load_failure(const std::string& path) {
  const Snapshot before = Snapshot::take();
  try {
    reg().load(path);
  } catch (const dew::Error& e) {
    const std::string msg = e.what();
    INFO("message: ", msg);
    CHECK(msg.find('\n') == std::string::npos);
    CHECK(msg.find(base(path)) != std::string::npos);
    CHECK(Snapshot::take() == before);
    return e;
  } catch (const std::exception& e) {
    FAIL("not a dew::Error: ", e.what());
  }
  FAIL("loading ", path, " succeeded; it must fail");
  return dew::Error(dew::ErrorKind::internal, "unreachable");
}

// The host survives: a good plugin still loads and its component still works after a failure.
void host_still_works() {
  reg().load(DEW_TEST_GOOD);
  CHECK(reg().create<Greeter>("hello")->hello() == "hello, world");
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_CASE("a good plugin: its component is created, with provenance, and holds its library") {
  reg().load(DEW_TEST_GOOD);
  reg().load(DEW_TEST_GOOD);  // loading the same file again is a no-op
  REQUIRE(reg().contains(Greeter::kind, "hello"));

  const dew::ErasedComponent& c = reg().find(Greeter::kind, "hello");
  CHECK(c.kind == "greeter");
  CHECK(c.origin.plugin == "good");
  CHECK(c.origin.file == fs::weakly_canonical(DEW_TEST_GOOD).string());
  CHECK(base(c.origin.source) == "good.cpp");
  CHECK(c.description == "registered at line " + std::to_string(c.origin.line));
  CHECK(contains(c.origin.describe(), "plugin 'good' ("));
  CHECK(contains(c.origin.describe(), "dew_good.so, good.cpp:" + std::to_string(c.origin.line) + ")"));
  REQUIRE(c.options.size() == 1);
  CHECK(c.options[0].key == "who");

  int records = 0;
  for (const dew::PluginRecord& p : reg().plugins()) {
    if (p.name != "good") continue;
    ++records;
    CHECK(p.version == "1.2.3");
    CHECK(p.abi_version == DEW_PLUGIN_ABI_VERSION);
    CHECK(p.fingerprint == DEW_BUILD_FINGERPRINT);
    CHECK(p.build_notes == "built for the registry tests");
    CHECK(p.file == c.origin.file);
    CHECK(p.components == std::vector<std::string>{"greeter/hello"});
  }
  CHECK(records == 1);

  REQUIRE(c.library != nullptr);
  const long held = c.library.use_count();
  {
    std::shared_ptr<Greeter> g =
        reg().create<Greeter>("hello", dew::Options(std::map<std::string, std::string>{{"who", "dew"}}));
    CHECK(g->hello() == "hello, dew");
    CHECK(c.library.use_count() == held + 1);  // the product keeps the plugin's library loaded
    std::shared_ptr<Greeter> copy = g;
    CHECK(c.library.use_count() == held + 1);
    auto g2 = reg().create<Greeter>("hello");
    CHECK(c.library.use_count() == held + 2);
  }
  CHECK(c.library.use_count() == held);
}

TEST_CASE("wrong ABI version: refused before register_all, naming what it was built for and what is expected") {
  const dew::Error e = load_failure(DEW_TEST_WRONG_ABI);
  const std::string msg = e.what();
  CHECK(e.kind() == dew::ErrorKind::runtime);
  CHECK(contains(msg, "plugin " + fs::weakly_canonical(DEW_TEST_WRONG_ABI).string() + ": "));
  CHECK(contains(msg, "built for plugin ABI 999"));
  CHECK(contains(msg, "this dew expects ABI " + std::to_string(DEW_PLUGIN_ABI_VERSION)));
  CHECK(contains(e.hint(), "rebuild the plugin against dew SDK " DEW_SDK_VERSION));
  CHECK_FALSE(reg().contains(Greeter::kind, "wrong_abi"));
  host_still_works();
}

TEST_CASE("fingerprint mismatch: refused naming both fingerprints") {
  const dew::Error e = load_failure(DEW_TEST_WRONG_FINGERPRINT);
  const std::string msg = e.what();
  CHECK(contains(msg, "build fingerprint 'dew-sdk 0.0.9; othercc 1.0; libstdc++ cxx11-abi 0'"));
  CHECK(contains(msg, std::string("does not match the host's '") + DEW_BUILD_FINGERPRINT + "'"));
  CHECK(contains(e.hint(), "same compiler"));
  host_still_works();
}

TEST_CASE("kernel algebra mismatch: refused with one line naming both versions") {
  const dew::Error e = load_failure(DEW_TEST_WRONG_ALGEBRA);
  const std::string msg = e.what();
  CHECK(contains(msg, "dew_wrong_algebra.so: built for kernel algebra 999, this dew has kernel algebra " +
                          std::to_string(DEW_KERNEL_ALGEBRA_VERSION)));
  CHECK(msg.find('\n') == std::string::npos);
  CHECK(contains(e.hint(), "rebuild"));
  host_still_works();
}

TEST_CASE("a library without dew_plugin_entry: refused as not a dew plugin") {
  const dew::Error e = load_failure(DEW_TEST_NO_ENTRY);
  const std::string msg = e.what();
  CHECK(contains(msg, "no entry symbol 'dew_plugin_entry'"));
  CHECK(contains(msg, "not a dew plugin"));
  CHECK(contains(e.hint(), "dew_add_plugin"));
  host_still_works();
}

TEST_CASE("a library with an unresolved symbol: refused at load time (RTLD_NOW) with the loader's reason") {
  const dew::Error e = load_failure(DEW_TEST_UNDEFINED_SYMBOL);
  const std::string msg = e.what();
  CHECK(contains(msg,
                 "dew_undefined_symbol.so: cannot be loaded: undefined symbol: dew_test_symbol_that_does_not_exist"));
  host_still_works();
}

TEST_CASE("a file that is not a shared library: refused with the loader's reason") {
  const dew::Error e = load_failure(DEW_TEST_PLUGIN_ROOT "/broken/not_elf/dew_not_elf.so");
  CHECK(contains(e.what(), "dew_not_elf.so: cannot be loaded: "));
  host_still_works();
}

TEST_CASE("a missing file: 'no such file'") {
  const dew::Error e = load_failure(DEW_TEST_PLUGIN_ROOT "/nowhere/dew_missing.so");
  CHECK(contains(e.what(), "/nowhere/dew_missing.so: no such file"));
  host_still_works();
}

TEST_CASE("a duplicate name across plugins: refused naming both origins, the second plugin adds nothing") {
  reg().load(DEW_TEST_DUP_A);
  REQUIRE(reg().contains(Greeter::kind, "twin"));
  const dew::Error e = load_failure(DEW_TEST_DUP_B);
  const std::string msg = e.what();
  CHECK(contains(msg, "duplicate greeter 'twin'"));
  CHECK(contains(msg, "plugin 'dup_b' (" + fs::weakly_canonical(DEW_TEST_DUP_B).string() + ", dup_b.cpp:"));
  CHECK(contains(msg, "plugin 'dup_a' (" + fs::weakly_canonical(DEW_TEST_DUP_A).string() + ", dup_a.cpp:"));
  // dup_b's other component was not registered, and 'twin' is still dup_a's.
  CHECK_FALSE(reg().contains(Greeter::kind, "solo_b"));
  CHECK(reg().find(Greeter::kind, "twin").origin.plugin == "dup_a");
  CHECK(reg().create<Greeter>("twin")->hello() == "twin from a");
  for (const auto& p : reg().plugins()) CHECK(p.name != "dup_b");
  host_still_works();
}

TEST_CASE("a duplicate name within one plugin: refused") {
  const dew::Error e = load_failure(DEW_TEST_DUP_SELF);
  CHECK(contains(e.what(), "duplicate greeter 'same': registered twice by plugin 'dup_self' ("));
  CHECK_FALSE(reg().contains(Greeter::kind, "same"));
  host_still_works();
}

TEST_CASE("the same plugin name from two files: refused naming both files") {
  reg().load(DEW_TEST_GOOD);
  const dew::Error e = load_failure(DEW_TEST_GOOD_AGAIN);
  const std::string msg = e.what();
  CHECK(contains(msg, "plugin name 'good' is provided twice"));
  CHECK(contains(msg, fs::weakly_canonical(DEW_TEST_GOOD).string()));
  CHECK(contains(msg, fs::weakly_canonical(DEW_TEST_GOOD_AGAIN).string()));
  host_still_works();
}

TEST_CASE("a throwing register function: 'registration failed: <message>', nothing registered") {
  const dew::Error e = load_failure(DEW_TEST_THROWING);
  CHECK(contains(e.what(), "plugin " + fs::weakly_canonical(DEW_TEST_THROWING).string() +
                               ": registration failed: the greeting table is corrupt"));
  CHECK_FALSE(reg().contains(Greeter::kind, "early"));
  for (const auto& p : reg().plugins()) CHECK(p.name != "throwing");
  // A second attempt fails the same way (nothing half-loaded was kept).
  const dew::Error again = load_failure(DEW_TEST_THROWING);
  CHECK(std::string(again.what()) == e.what());
  host_still_works();
}

TEST_CASE("an unknown name: UsageError listing the known ones of that kind") {
  reg().load(DEW_TEST_GOOD);
  try {
    reg().create<Greeter>("nope");
    FAIL("created an unknown greeter");
  } catch (const dew::UsageError& e) {
    CHECK(e.kind() == dew::ErrorKind::usage);
    CHECK(contains(e.what(), "unknown greeter 'nope'; known: "));
    CHECK(contains(e.what(), "hello (good)"));
  }
  try {
    reg().find("widget", "any");
    FAIL("found a widget");
  } catch (const dew::UsageError& e) {
    CHECK(contains(e.what(), "unknown widget 'any'; no widget is registered"));
    CHECK(contains(e.hint(), "--plugin-dir"));
  }
  CHECK_FALSE(reg().contains("widget", "any"));
  host_still_works();
}

TEST_CASE("discover: loads dew_*.so of folders, honours the name filter, refuses an unknown name") {
  reg().discover({DEW_TEST_PLUGIN_ROOT "/good", DEW_TEST_PLUGIN_ROOT "/not-a-folder"}, {"good"});
  CHECK(reg().contains(Greeter::kind, "hello"));
  // The filter skips dup_b, so the folder loads without a duplicate.
  reg().discover({DEW_TEST_PLUGIN_ROOT "/broken/duplicate"}, {"dup_a"});
  CHECK(reg().contains(Greeter::kind, "twin"));
  try {
    reg().discover({DEW_TEST_PLUGIN_ROOT "/broken/wrong_abi"}, {"good", "wrong_abi"});
    FAIL("discovered an absent plugin");
  } catch (const dew::Error& e) {
    // nothing is loaded when a requested name is absent
    CHECK(e.kind() == dew::ErrorKind::usage);
    CHECK(std::string(e.what()) == "unknown plugin 'good'; found: wrong_abi");
  }
  try {
    reg().discover({DEW_TEST_PLUGIN_ROOT "/broken/wrong_abi"});
    FAIL("discovered a plugin of the wrong ABI");
  } catch (const dew::Error& e) {
    CHECK(contains(e.what(), "dew_wrong_abi.so: built for plugin ABI 999"));
  }
  host_still_works();
}
