// tools/dew-bench/main.cpp — `dew-bench <suite> [options]`: prints one JSON line per measurement.
// Suites: kernels (matmul through dew's API next to oneDNN called directly; fused attention fwd+bwd).
#include <boost/program_options.hpp>
#include <iostream>

#include "bench.hpp"
#include "dew/error.hpp"
#include "dew/registry.hpp"

namespace po = boost::program_options;

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: dew-bench kernels [--threads N] [--backend cpu|ref] [--seconds S] [--repeats R]\n";
    return 2;
  }
  const std::string suite = argv[1];
  dew_bench::BenchOptions opt;
  std::vector<std::string> plugin_dirs;
  po::options_description d("dew-bench");
  d.add_options()("threads", po::value(&opt.threads)->default_value(1), "threads")(
      "backend", po::value(&opt.backend)->default_value("cpu"), "backend")(
      "seconds", po::value(&opt.seconds)->default_value(0.3), "seconds per repeat")(
      "repeats", po::value(&opt.repeats)->default_value(5), "repeats (the median is printed)")(
      "plugin-dir", po::value(&plugin_dirs)->composing(), "extra plugin folder");
  try {
    po::variables_map vm;
    po::store(po::command_line_parser(std::vector<std::string>(argv + 2, argv + argc)).options(d).run(), vm);
    po::notify(vm);
    for (const auto& p : dew::Registry::default_plugin_dirs()) plugin_dirs.push_back(p);
    dew::Registry::global().discover(plugin_dirs);
    if (suite == "kernels") return dew_bench::run_kernels(opt);
    std::cerr << "dew-bench: unknown suite '" << suite << "' (known: kernels)\n";
    return 2;
  } catch (const po::error& e) {
    std::cerr << "dew-bench: " << e.what() << "\n";
    return 2;
  } catch (const dew::Error& e) {
    std::cerr << "dew-bench: " << e.describe() << "\n";
    return e.kind() == dew::ErrorKind::usage ? 2 : 1;
  }
}
