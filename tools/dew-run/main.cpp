// tools/dew-run/main.cpp — the launcher: `dew-run <command> [options]`.
//
// Commands: train, eval, sample, export, import, serve, report, plugins, demo. Every [section] key of a config can
// be given on the command line as --section.key VALUE (or --section.key=VALUE), which wins over the file.
// Exit status: 0 success, 2 usage/config error, 1 runtime error, 130 interrupted (after a checkpoint).
// Plugins are found in --plugin-dir folders, DEW_PLUGIN_PATH, then next to this executable; [run]
// plugins or --plugins restrict which are loaded.
#include <boost/program_options.hpp>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <new>
#include <sstream>
#include <string>
#include <vector>

#include "demo.hpp"
#include "dew/config.hpp"
#include "dew/error.hpp"
#include "dew/generate.hpp"
#include "dew/interop.hpp"
#include "dew/optim.hpp"
#include "dew/registry.hpp"
#include "dew/report.hpp"
#include "dew/reward.hpp"
#include "dew/safetensors.hpp"
#include "dew/train.hpp"
#include "openmp_setup.hpp"
#include "serve.hpp"

namespace po = boost::program_options;
namespace fs = std::filesystem;

namespace {

const char* kUsage =
    "usage: dew-run <command> [options]\n"
    "commands:\n"
    "  train     train from a config:  --config FILE [--run-dir D] [--resume] [--backend cpu|ref] [--section.key V "
    "...]\n"
    "  eval      evaluate a run's checkpoint on the validation/test split; prints JSON:  --run-dir D [--step "
    "latest|best|N] [objective keys: --samples N, --task T, ...]\n"
    "  sample    generate from a run (objectives with a sampler):  --run-dir D [...]\n"
    "  export    write model.safetensors + config.json:  --run-dir D --format safetensors|hf --out DIR\n"
    "  import    a Hugging Face decoder (config.json + safetensors) as a run directory:  --from DIR --run-dir D\n"
    "  serve     HTTP/JSON inference (OpenAI-style /v1/completions for text, /v1/images for diffusion):  --run-dir D "
    "--port P [--slots N]\n"
    "  report    one self-contained HTML page of curves, samples and config; several --run-dir overlay the runs:  "
    "--run-dir D [--run-dir E ...] [--out FILE]\n"
    "  plugins   list the plugins found, their components, and whether backends can run here\n"
    "  demo      fit a small two-layer network on a synthetic task with --backend (cpu|ref)\n"
    "Run `dew-run <command> --help` for a command's options.\n";

struct Common {
  std::vector<std::string> plugin_dirs;
  std::string plugins;
};

void add_common(po::options_description& d, Common& c) {
  d.add_options()("plugin-dir", po::value(&c.plugin_dirs)->composing(), "extra plugin folder (repeatable)")(
      "plugins", po::value(&c.plugins), "comma-separated plugin names to load (default: all found)");
}

void load_plugins(const Common& c, std::vector<std::string> only = {}) {
  for (const auto& d : c.plugin_dirs) {
    std::error_code ec;
    DEW_USAGE_CHECK(fs::is_directory(d, ec), "--plugin-dir ", d, ": no such folder");
  }
  std::vector<std::string> dirs = c.plugin_dirs;
  for (const auto& d : dew::Registry::default_plugin_dirs()) dirs.push_back(d);
  if (!c.plugins.empty()) only = dew::Options({{"plugins", c.plugins}}).get_strings("plugins", {});
  dew::Registry::global().discover(dirs, only);
}

// Splits --section.key[=value] overrides from the rest of the arguments.
std::vector<std::string> take_overrides(const std::vector<std::string>& args,
                                        std::vector<std::pair<std::string, std::string>>& overrides) {
  std::vector<std::string> rest;
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a.rfind("--", 0) == 0) {
      const std::string body = a.substr(2);
      const auto eq = body.find('=');
      const std::string key = body.substr(0, eq);
      if (key.find('.') != std::string::npos) {
        if (eq != std::string::npos) {
          overrides.emplace_back(key, body.substr(eq + 1));
        } else {
          DEW_USAGE_CHECK(i + 1 < args.size(), "override --", key, " needs a value");
          overrides.emplace_back(key, args[++i]);
        }
        continue;
      }
    }
    rest.push_back(a);
  }
  return rest;
}

// `--help` / `-h` anywhere among a command's arguments: print its options (the usage line promises it).
bool print_help(const std::vector<std::string>& args, const po::options_description& d, const char* more = nullptr) {
  for (const auto& a : args)
    if (a == "--help" || a == "-h") {
      std::cout << d << (more ? more : "");
      return true;
    }
  return false;
}

po::variables_map parse(const std::vector<std::string>& args, const po::options_description& d) {
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(d).positional({}).run(), vm);
  po::notify(vm);
  return vm;
}

void print_component_options(const std::string& section, const char* kind, const std::string& name) {
  if (!dew::Registry::global().contains(kind, name)) return;
  const auto& c = dew::Registry::global().find(kind, name);
  std::cout << "\n[" << section << "] options of " << kind << " '" << name << "' (" << c.origin.describe() << "):\n";
  if (c.options.empty()) std::cout << "  (none declared)\n";
  for (const auto& spec : c.options)
    std::cout << "  --" << section << "." << spec.key
              << (spec.default_value.empty() ? "" : " (default " + spec.default_value + ")") << "  " << spec.help
              << "\n";
}

void print_plugin_options(dew::Config& config) {
  // [predictor]: the second backbone of objectives that own two (jepa).
  for (const char* section : {"model", "predictor", "objective", "data"}) {
    if (!config.has_section(section)) continue;
    const dew::Options& o = config.section(section);
    if (!o.has("plugin") && !o.has("source")) continue;
    const std::string name = o.values().count("plugin") ? o.values().at("plugin") : o.values().at("source");
    const std::string sec = section;
    const char* kind = sec == "model" || sec == "predictor" ? "model"
                       : sec == "objective"                 ? "objective"
                                                            : "data_source";
    print_component_options(section, kind, name);
  }
  // The optimizer and the schedule: built-in or a plugin's, named by `name` (the trainer's defaults otherwise).
  auto name_in = [&](const char* section, const char* fallback) {
    if (!config.has_section(section)) return std::string(fallback);
    const auto& v = config.section(section).values();
    return v.count("name") ? v.at("name") : std::string(fallback);
  };
  print_component_options("optim", dew::Optimizer::kind, name_in("optim", "adamw"));
  std::cout << "\n[optim] parameter groups, for every optimizer (roles: matrix, embedding, head, norm, bias):\n"
               "  --optim.no_decay (default norm, bias, embedding)  roles without weight decay (none: every role "
               "decays)\n"
               "  --optim.lr_scale.<role> (default 1)  multiplies the scheduled learning rate of the role\n"
               "  --optim.roles.<role> PATTERNS  names (shell globs) that get the role instead of the inferred one\n";
  print_component_options("schedule", dew::Schedule::kind, name_in("schedule", "constant"));
  // The reward functions an RL objective names ([objective] rewards, a comma list), their options in [reward].
  if (config.has_section("objective") && config.section("objective").values().count("rewards")) {
    std::stringstream names(config.section("objective").values().at("rewards"));
    for (std::string name; std::getline(names, name, ',');) {
      name.erase(0, name.find_first_not_of(" \t"));
      name.erase(name.find_last_not_of(" \t") + 1);
      if (!name.empty()) print_component_options("reward", dew::Reward::kind, name);
    }
  }
}

int cmd_train(const std::vector<std::string>& raw) {
  std::vector<std::pair<std::string, std::string>> overrides;
  std::vector<std::string> args = take_overrides(raw, overrides);
  Common c;
  std::string config_path, run_dir, backend, step;
  bool resume = false, help = false;
  po::options_description d("dew-run train");
  d.add_options()("config", po::value(&config_path),
                  "config file (.ini); defaults to RUN_DIR/config.ini with --resume")(
      "run-dir", po::value(&run_dir), "run directory (default runs/<run.name>)")(
      "resume", po::bool_switch(&resume), "continue the run in --run-dir from its latest checkpoint")(
      "step", po::value(&step), "with --resume: the checkpoint to continue from (an update number, latest or best)")(
      "backend", po::value(&backend), "backend (overrides run.backend): cpu, ref, cuda")(
      "help", po::bool_switch(&help), "show the options, with those of the plugins the config names");
  add_common(d, c);
  parse(args, d);
  if (config_path.empty() && resume && !run_dir.empty()) config_path = (fs::path(run_dir) / "config.ini").string();
  if (help && config_path.empty()) {
    std::cout << d << "\nEvery config key can be overridden as --section.key VALUE.\n";
    return 0;
  }
  DEW_USAGE_CHECK(!config_path.empty(), "train needs --config FILE (or --run-dir D --resume)");
  dew::Config config = dew::Config::load_ini(config_path);
  for (const auto& [k, v] : overrides) config.set(k, v);
  std::vector<std::string> only;
  if (config.section("run").has("plugins")) {
    only = config.section("run").get_strings("plugins", {});
  }
  load_plugins(c, only);
  if (help) {
    std::cout << d << "\nEvery config key can be overridden as --section.key VALUE.\n";
    print_plugin_options(config);
    return 0;
  }
  dew::TrainOptions to;
  to.run_dir = run_dir;
  to.resume = resume;
  to.step = step;
  to.backend_name = backend;
  return dew::train(config, to);
}

struct RunArgs {
  Common common;
  std::string run_dir, step = "latest", backend;
  bool no_ema = false;
  int threads = 0;  // 0: the run's stored [run] threads
  std::string weights = "f32";  // eval/sample/serve: the matmul weights' storage (dew/generate.hpp)
  std::string kv_cache = "auto";  // eval/sample/serve: the K/V cache's dtype (auto: as the weights)
};

// eval, sample and serve: --weights f32|bf16|int8 (the exports always write the weights as trained) and --kv-cache.
void add_weights_arg(po::options_description& d, RunArgs& r) {
  d.add_options()("weights", po::value(&r.weights)->default_value("f32"),
                  "keep the matmul weights as f32, bf16 or int8 (an f32 scale per block of 32) and the K/V cache as "
                  "f32, bf16 or bf16 (f32 activations and accumulation; bf16 halves the bytes each decoded token "
                  "reads, int8 quarters the weights')")(
      "kv-cache", po::value(&r.kv_cache)->default_value("auto"),
      "the K/V cache's dtype: auto (as --weights says) | f32 | bf16 (f32 weights over a bf16 cache: half the cache "
      "bytes a decoded token reads and half the memory a slot takes)");
}
void apply_run_args(const RunArgs& r) {
  dew::set_inference_threads(r.threads);
  dew::set_inference_weights(dew::weights_dtype_from_name(r.weights, "--weights"));
  dew::set_inference_kv_cache(r.kv_cache);
}

void add_run_args(po::options_description& d, RunArgs& r) {
  d.add_options()("run-dir", po::value(&r.run_dir)->required(), "run directory")(
      "step", po::value(&r.step)->default_value("latest"), "checkpoint: latest, best or an update number")(
      "no-ema", po::bool_switch(&r.no_ema), "use the raw parameters even when EMA weights exist")(
      "backend", po::value(&r.backend), "backend (overrides the run's)")(
      "threads", po::value(&r.threads)->default_value(0), "threads (overrides the run's [run] threads; 0: keep it)");
  add_common(d, r.common);
}

// Parses the run arguments of eval/sample and collects every other --key value pair as the objective's
// request (--max-new-tokens and --max_new_tokens both name the key max_new_tokens); a key without a value is a
// flag (Options::set_flag): true for a boolean key, refused ("needs a value") by any other.
dew::Options parse_run_request(const std::vector<std::string>& raw, po::options_description& d,
                               const std::string& context) {
  // No prefix guessing: the objective's keys must not be taken for abbreviations of the run arguments
  // (`--n 2` would otherwise become --no-ema and leave a stray "2").
  auto parsed = po::command_line_parser(raw)
                    .options(d)
                    .style(po::command_line_style::default_style & ~po::command_line_style::allow_guessing)
                    .allow_unregistered()
                    .run();
  po::variables_map vm;
  po::store(parsed, vm);
  po::notify(vm);
  dew::Options request({}, context);
  const auto rest = po::collect_unrecognized(parsed.options, po::include_positional);
  auto key_of = [](std::string k) {
    for (char& ch : k)
      if (ch == '-') ch = '_';
    return k;
  };
  for (size_t i = 0; i < rest.size(); ++i) {
    DEW_USAGE_CHECK(rest[i].rfind("--", 0) == 0, "unexpected argument '", rest[i], "'");
    const std::string key = rest[i].substr(2);
    const auto eq = key.find('=');
    if (eq != std::string::npos)
      request.set(key_of(key.substr(0, eq)), key.substr(eq + 1));
    else if (i + 1 < rest.size() && rest[i + 1].rfind("--", 0) != 0)
      request.set(key_of(key), rest[++i]);
    else
      request.set_flag(key_of(key));  // a bare flag: true for a boolean key, "needs a value" for any other
  }
  return request;
}

int cmd_eval(const std::vector<std::string>& raw) {
  // Evaluation options beyond the run arguments are the objective's own (e.g. --samples, --task).
  RunArgs r;
  po::options_description d("dew-run eval");
  add_run_args(d, r);
  add_weights_arg(d, r);
  if (print_help(raw, d, "Other --key value pairs go to the run's objective (e.g. --samples N, --task T).\n")) return 0;
  dew::Options req = parse_run_request(raw, d, "eval");
  load_plugins(r.common);
  apply_run_args(r);
  const auto metrics = dew::evaluate(r.run_dir, r.step, !r.no_ema, r.backend, req);
  std::cout << "{";
  size_t i = 0;
  for (const auto& [k, v] : metrics) std::printf("%s\"%s\": %.6g", i++ ? ", " : "", k.c_str(), v);
  std::cout << "}" << std::endl;
  return 0;
}

int cmd_sample(const std::vector<std::string>& raw) {
  // Sampler options are the objective's own: everything past the run arguments goes to it.
  RunArgs r;
  po::options_description d("dew-run sample");
  add_run_args(d, r);
  add_weights_arg(d, r);
  if (print_help(raw, d, "Other --key value pairs go to the run's objective's sampler (e.g. --prompt, --max_new_tokens).\n"))
    return 0;
  dew::Options req = parse_run_request(raw, d, "sample");
  load_plugins(r.common);
  apply_run_args(r);
  dew::sample(r.run_dir, r.step, !r.no_ema, r.backend, req);
  req.check_all_used();
  return 0;
}

// An export never mixes with an earlier one: the model files of a previous export in --out (safetensors,
// shards, a shard index, config.json, generation_config.json) are deleted first, as Transformers'
// save_pretrained deletes stale shards — a stale index would otherwise send `dew-run import` to old shards.
void prepare_export_folder(const std::string& out) {
  std::error_code ec;
  if (!fs::exists(out, ec)) return;
  DEW_USAGE_CHECK(fs::is_directory(out, ec), "--out '", out, "' exists and is not a folder");
  std::vector<fs::path> old;
  for (const auto& e : fs::directory_iterator(out, ec)) {
    const std::string f = e.path().filename().string();
    if (e.path().extension() == ".safetensors" || f == "config.json" || f == "generation_config.json" ||
        f.find(".safetensors.index.json") != std::string::npos)
      old.push_back(e.path());
  }
  for (const auto& p : old) {
    fs::remove(p, ec);
    DEW_USAGE_CHECK(!ec, "--out '", out, "': cannot delete the earlier export's ", p.filename().string(), ": ",
                    ec.message());
  }
}

int cmd_export(const std::vector<std::string>& args) {
  RunArgs r;
  std::string format, out, max_shard, dtype;
  po::options_description d("dew-run export");
  add_run_args(d, r);
  d.add_options()("format", po::value(&format)->default_value("safetensors"),
                  "output format: safetensors (dew's names and config) or hf (a Hugging Face model folder)")(
      "out", po::value(&out)->required(), "output folder")(
      "max-shard-size", po::value(&max_shard)->default_value("5GB"), "hf: shard the weights above this size")(
      "dtype", po::value(&dtype), "hf: write floating weights as f32, bf16 or f16 (default: as trained)");
  if (print_help(args, d)) return 0;
  parse(args, d);
  prepare_export_folder(out);
  DEW_USAGE_CHECK(format == "safetensors" || format == "hf", "--format ", format,
                  " is not supported; known: safetensors, hf");
  load_plugins(r.common);
  dew::set_inference_threads(r.threads);
  if (format == "hf") {
    dew::export_hf(r.run_dir, r.step, !r.no_ema, r.backend, out, dew::parse_byte_size(max_shard, "--max-shard-size"),
                   dtype);
    std::cout << "wrote a Hugging Face model folder (config.json, safetensors) to " << out << "\n";
    return 0;
  }
  dew::export_safetensors(r.run_dir, r.step, !r.no_ema, r.backend, out);
  std::cout << "wrote " << (fs::path(out) / "model.safetensors").string() << " and config.json\n";
  return 0;
}

int cmd_serve(const std::vector<std::string>& args) {
  RunArgs r;
  dew_run::ServeOptions so;
  bool no_prefix_cache = false;
  po::options_description d("dew-run serve");
  add_run_args(d, r);
  add_weights_arg(d, r);
  d.add_options()("port", po::value(&so.port)->default_value(8000), "TCP port (0: any free port)")(
      "host", po::value(&so.host)->default_value("127.0.0.1"), "address to listen on")(
      "slots", po::value(&so.scheduler.slots)->default_value(8), "sequences decoded together")(
      "prefill-chunk", po::value(&so.scheduler.prefill_chunk)->default_value(dew::kPrefillChunk),
      "prompt tokens per prefill call and per iteration (0: whole prompts; `dew-run sample --prefill_chunk` the "
      "same)")("queue", po::value(&so.scheduler.max_queue)->default_value(64),
               "requests that may wait for a slot (429 past it)")(
      "context", po::value(&so.scheduler.context)->default_value(0), "tokens per slot (0: the model's context)")(
      "max-tokens", po::value(&so.max_tokens)->default_value(4096), "the most max_tokens a request may ask")(
      "max-images", po::value(&so.max_images)->default_value(64), "image runs: the most images a request may ask")(
      "max-steps", po::value(&so.max_steps)->default_value(1000),
      "image runs: the most sampling steps a request may ask")(
      "model-name", po::value(&so.model_name), "model id reported and accepted (default: the run's name)")(
      "access-log", po::bool_switch(&so.access_log), "one line per request on stderr")(
      "no-prefix-cache", po::bool_switch(&no_prefix_cache),
      "feed every prompt in full (default: a prompt's first chunks that another prompt was fed in reuse its cache)")(
      "chat-template", po::value(&so.chat_template),
      "tokenizer_config.json / chat_template.jinja / folder for /v1/chat/completions (default: the run's)");
  if (print_help(args, d)) return 0;
  parse(args, d);
  so.scheduler.prefix_cache = !no_prefix_cache;
  // Each slot and queue place may hold a connection's worker thread while its request waits or runs.
  DEW_USAGE_CHECK(so.scheduler.slots >= 1 && so.scheduler.slots <= 1024, "serve: --slots must be in [1, 1024], got ",
                  so.scheduler.slots);
  DEW_USAGE_CHECK(so.scheduler.max_queue >= 0 && so.scheduler.max_queue <= 4096,
                  "serve: --queue must be in [0, 4096], got ", so.scheduler.max_queue);
  DEW_USAGE_CHECK(so.max_tokens >= 1, "serve: --max-tokens must be >= 1, got ", so.max_tokens);
  DEW_USAGE_CHECK(so.chat_template.empty() || fs::exists(so.chat_template), "serve: --chat-template '",
                  so.chat_template, "' does not exist (a tokenizer_config.json, a .jinja file or a folder)");
  load_plugins(r.common);
  apply_run_args(r);
  return dew_run::serve(r.run_dir, r.step, !r.no_ema, r.backend, so);
}

// `dew-run import --from HF_DIR --run-dir D [--backend B] [--section.key V ...]` (dew/interop.hpp).
int cmd_import(const std::vector<std::string>& raw) {
  std::vector<std::pair<std::string, std::string>> overrides;
  std::vector<std::string> args = take_overrides(raw, overrides);
  Common c;
  std::string from, run_dir, backend = "cpu";
  po::options_description d("dew-run import");
  d.add_options()("from", po::value(&from)->required(),
                  "Hugging Face model folder: config.json + model.safetensors (or an index and shards)")(
      "run-dir", po::value(&run_dir)->required(), "run directory to create")(
      "backend", po::value(&backend)->default_value("cpu"), "backend of the run (cpu, ref, cuda)");
  add_common(d, c);
  if (print_help(args, d, "Every config key can be overridden as --section.key VALUE.\n")) return 0;
  parse(args, d);
  load_plugins(c);
  dew::ImportOptions o;
  o.backend = backend;
  for (const auto& [k, v] : overrides) o.overrides[k] = v;
  std::cout << dew::import_hf(from, run_dir, o) << "\n";
  return 0;
}

// `dew-run report --run-dir D [--run-dir E ...] [--out FILE]` (dew/report.hpp): prints the page's path.
int cmd_report(const std::vector<std::string>& args) {
  std::vector<std::string> run_dirs;
  std::string out;
  bool help = false;
  po::options_description d("dew-run report");
  d.add_options()("run-dir", po::value(&run_dirs)->composing(), "run directory (repeat it to compare runs)")(
      "out", po::value(&out), "the HTML file (default: RUN_DIR/report.html for one run, report.html for several)")(
      "help", po::bool_switch(&help), "show these options");
  parse(args, d);
  if (help) {
    std::cout << d;
    return 0;
  }
  DEW_USAGE_CHECK(!run_dirs.empty(), "report needs --run-dir D (repeat it to compare runs)");
  if (out.empty()) out = run_dirs.size() == 1 ? (fs::path(run_dirs[0]) / "report.html").string() : "report.html";
  std::cout << dew::write_report(run_dirs, out) << "\n";
  return 0;
}

void print_components(const dew::Registry& reg, const std::vector<std::string>& components) {
  for (const auto& comp : components) {
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

int cmd_plugins(const std::vector<std::string>& args) {
  Common c;
  po::options_description d("dew-run plugins");
  add_common(d, c);
  if (print_help(args, d)) return 0;
  parse(args, d);
  load_plugins(c);
  auto& reg = dew::Registry::global();
  // The built-ins first (libdew's own optimizers, schedules, ...), listed like a plugin's components.
  std::vector<std::string> builtin;
  for (const dew::ErasedComponent* e : reg.components())
    if (e->origin.plugin == "core") builtin.push_back(e->kind + "/" + e->name);
  if (!builtin.empty()) {
    std::cout << "core  version " << DEW_SDK_VERSION << "  (built into libdew)\n";
    print_components(reg, builtin);
  }
  const auto plugins = reg.plugins();
  if (plugins.empty()) {
    std::cout << "no plugins found (searched --plugin-dir, DEW_PLUGIN_PATH and next to dew-run)\n";
    return 0;
  }
  for (const auto& p : plugins) {
    std::cout << p.name << "  version " << p.version << "  abi " << p.abi_version << "  " << p.file << "\n";
    if (!p.build_notes.empty()) std::cout << "    built with: " << p.build_notes << "\n";
    print_components(reg, p.components);
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
  if (print_help(args, d)) return 0;
  parse(args, d);
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
  // OpenMP waiting from how busy the machine is now, threads divided among ranks on one machine
  // (openmp_setup.hpp), before any plugin loads libgomp; the user's OMP_NUM_THREADS / OMP_WAIT_POLICY /
  // GOMP_SPINCOUNT win, [run] threads sets the count.
  const bool computes =
      command == "train" || command == "eval" || command == "sample" || command == "serve" || command == "demo";
  if (const char* omp = std::getenv("OMP_NUM_THREADS"); omp && *omp) {
    // libgomp crashes on absurd counts (OMP_NUM_THREADS=100000 segfaults): refuse them before it loads.
    const std::string e = dew_run::check_omp_num_threads(omp);
    if (!e.empty()) {
      std::cerr << "dew-run " << command << ": " << e << "\n";
      return 2;
    }
  }
  if (computes) {
    // No line of its own on stderr (a bad command's output stays its one error line): the trainer logs
    // DEW_OPENMP_CHOICE next to its start line.
    setenv("DEW_OPENMP_CHOICE", dew_run::describe(dew_run::apply_openmp_defaults()).c_str(), 1);
  } else {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 0);
  }
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    if (command == "train") return cmd_train(args);
    if (command == "eval") return cmd_eval(args);
    if (command == "sample") return cmd_sample(args);
    if (command == "export") return cmd_export(args);
    if (command == "import") return cmd_import(args);
    if (command == "serve") return cmd_serve(args);
    if (command == "report") return cmd_report(args);
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
  } catch (const std::bad_alloc&) {
    std::cerr << "dew-run " << command
              << ": error: out of memory (the model, batch or request needs more memory than this machine has "
                 "free; try a smaller data.batch_size or model)\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "dew-run " << command << ": error: " << e.what() << "\n";
    return 1;
  }
}
