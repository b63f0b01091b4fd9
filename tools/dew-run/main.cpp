// tools/dew-run/main.cpp — the launcher: `dew-run <command> [options]`.
//
// Commands: plugins (what is installed and whether it can run here), demo (a tiny end-to-end fit on a
// chosen backend). Exit status: 0 success, 2 usage/config error, 1 runtime error.
// Plugins are found in --plugin-dir folders, DEW_PLUGIN_PATH, then next to this executable.
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "dew/error.hpp"
#include "dew/registry.hpp"
#include "demo.hpp"

namespace po = boost::program_options;

namespace {

const char* kUsage =
    "usage: dew-run <command> [options]\n"
    "commands:\n"
    "  plugins   list the plugins found, their components, and whether backends can run here\n"
    "  demo      fit a small two-layer network on a synthetic task with --backend (cpu|ref)\n"
    "common options:\n"
    "  --plugin-dir DIR   extra plugin folder (repeatable)\n"
    "  --plugins a,b      load only these plugins\n";

struct Common {
  std::vector<std::string> plugin_dirs;
  std::string plugins;
};

void add_common(po::options_description& d, Common& c) {
  d.add_options()("plugin-dir", po::value(&c.plugin_dirs)->composing(), "extra plugin folder (repeatable)")(
      "plugins", po::value(&c.plugins), "comma-separated plugin names to load (default: all found)");
}

void load_plugins(const Common& c) {
  // A folder named on the command line must exist (the default folders may not).
  for (const auto& d : c.plugin_dirs) {
    std::error_code ec;
    DEW_USAGE_CHECK(std::filesystem::is_directory(d, ec), "--plugin-dir ", d, ": no such folder");
  }
  std::vector<std::string> dirs = c.plugin_dirs;
  for (const auto& d : dew::Registry::default_plugin_dirs()) dirs.push_back(d);
  std::vector<std::string> only;
  dew::Options o({{"plugins", c.plugins}});
  if (!c.plugins.empty()) only = o.get_strings("plugins", {});
  dew::Registry::global().discover(dirs, only);
}

int cmd_plugins(const std::vector<std::string>& args) {
  Common c;
  po::options_description d("dew-run plugins");
  add_common(d, c);
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(d).run(), vm);
  po::notify(vm);
  load_plugins(c);
  auto& reg = dew::Registry::global();
  const auto plugins = reg.plugins();
  if (plugins.empty()) {
    std::cout << "no plugins found (searched --plugin-dir, DEW_PLUGIN_PATH and next to dew-run)\n";
    return 0;
  }
  for (const auto& p : plugins) {
    std::cout << p.name << "  version " << p.version << "  abi " << p.abi_version << "  " << p.file << "\n";
    if (!p.build_notes.empty()) std::cout << "    built with: " << p.build_notes << "\n";
    for (const auto& comp : p.components) {
      const auto slash = comp.find('/');
      const std::string kind = comp.substr(0, slash), name = comp.substr(slash + 1);
      const auto& e = reg.find(kind, name);
      std::cout << "    " << kind << " " << name;
      if (e.probe) {
        const dew::Support s = e.probe();
        std::cout << (s.ok ? "  [can run here]" : "  [cannot run here: " + s.reason + "]");
      } else if (kind == dew::Backend::kind) {
        std::cout << "  [can run here]";
      }
      if (!e.description.empty()) std::cout << "  — " << e.description;
      std::cout << "\n";
    }
  }
  return 0;
}

int cmd_demo(const std::vector<std::string>& args) {
  Common c;
  dew_run::DemoOptions opt;
  po::options_description d("dew-run demo");
  add_common(d, c);
  d.add_options()("backend", po::value(&opt.backend)->default_value("cpu"), "backend: cpu or ref")(
      "steps", po::value(&opt.steps)->default_value(300), "optimizer steps")(
      "seed", po::value(&opt.seed)->default_value(0), "seed");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(d).run(), vm);
  po::notify(vm);
  DEW_USAGE_CHECK(opt.steps > 0, "--steps must be positive");
  load_plugins(c);
  return dew_run::run_demo(opt);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2 || std::string(argv[1]) == "--help" || std::string(argv[1]) == "-h") {
    std::cout << kUsage;
    return argc < 2 ? 2 : 0;
  }
  const std::string command = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "plugins") return cmd_plugins(args);
    if (command == "demo") return cmd_demo(args);
    std::cerr << "dew-run: unknown command '" << command << "'\n" << kUsage;
    return 2;
  } catch (const po::error& e) {
    std::cerr << "dew-run " << command << ": " << e.what() << "\n";
    return 2;
  } catch (const dew::Error& e) {
    std::cerr << "dew-run " << command << ": " << (e.kind() == dew::ErrorKind::usage ? "" : "error: ") << e.describe()
              << "\n";
    return e.kind() == dew::ErrorKind::usage ? 2 : 1;
  } catch (const std::exception& e) {
    std::cerr << "dew-run " << command << ": error: " << e.what() << "\n";
    return 1;
  }
}
