// core/data/make_loader.cpp — the pipeline compiler: a [data] section -> source plugin + DataLoader.
//
// The loader reads its own keys (source, batch_size, workers, prefetch, shuffle, seed, transforms: the
// per-record image transforms of dew/data.hpp make_transforms); every other key
// of the section goes to the source plugin as its Options, with "split" added. The section marks the
// forwarded keys used; the source's Options refuse, after the source is built, every key the source did
// not read, so a misspelt source key is an error naming it ("unknown option 'data.pth'").
// pack (false): packed rows with document segments; forwarded to the source as "pack" when true, and a
// source that does not read it (it has no document boundaries: every one but tokens) is refused.
// source = none: an empty loader for evaluation of runs without data (imports); refused for training.
#include "dew/data.hpp"
#include "dew/error.hpp"
#include "dew/registry.hpp"

namespace dew {

namespace {
std::string key_name(const Options& o, const std::string& key) {
  return o.context().empty() ? "'" + key + "'" : "'" + o.context() + "." + key + "'";
}
}  // namespace

std::unique_ptr<DataLoader> make_loader(Options& data_section, const std::string& split, uint64_t seed, int rank,
                                        int world) {
  static const char* const kLoaderKeys[] = {"source", "batch_size", "workers", "prefetch", "shuffle", "seed",
                                            "transforms", "pack"};
  Options& d = data_section;
  const std::string source_name = d.require_string("source");
  if (source_name == "none") {
    // A run without data (e.g. one imported from Hugging Face): evaluation tasks that read their own
    // inputs get an empty loader; training refuses. The other keys stay the objective's (e.g. path).
    DEW_USAGE_CHECK(split != "train",
                    "[data] source = none: this run has no training data; give one, e.g. "
                    "--data.source tokens --data.path DIR --data.seq_len N --data.batch_size B");
    // One placeholder record that refuses to be read (a loader needs a non-empty source); objectives
    // recognise it by its identity "none".
    struct NoRecords final : DataSource {
      int64_t size() const override { return 1; }
      Record get(int64_t) const override {
        DEW_USAGE_CHECK(false, "[data] source = none: this run has no data to read");
        return {};
      }
      std::string identity() const override { return "none"; }
    };
    LoaderConfig cfg;
    cfg.batch_size = 1;
    cfg.workers = 0;
    cfg.rank = rank;
    cfg.world = world;
    cfg.seed = seed;
    return std::make_unique<DataLoader>(std::make_shared<NoRecords>(), cfg);
  }
  DEW_USAGE_CHECK(d.has("batch_size"), "missing required option ", key_name(d, "batch_size"));
  LoaderConfig cfg;
  cfg.batch_size = d.get_int("batch_size", 0);
  DEW_USAGE_CHECK(cfg.batch_size > 0, "option ", key_name(d, "batch_size"), " must be positive, got ", cfg.batch_size);
  const int64_t workers = d.get_int("workers", 1);
  DEW_USAGE_CHECK(workers >= 0 && workers <= 256, "option ", key_name(d, "workers"), " must be in [0, 256], got ",
                  workers);
  const int64_t prefetch = d.get_int("prefetch", 2);
  DEW_USAGE_CHECK(prefetch >= 0 && prefetch <= 4096, "option ", key_name(d, "prefetch"), " must be in [0, 4096], got ",
                  prefetch);
  cfg.workers = int(workers);
  cfg.prefetch = int(prefetch);
  cfg.shuffle = d.get_bool("shuffle", split == "train");
  if (d.has("seed")) {
    const int64_t s = d.get_int("seed", 0);
    DEW_USAGE_CHECK(s >= 0, "option ", key_name(d, "seed"), " must not be negative, got ", s);
    cfg.seed = uint64_t(s);
  } else {
    cfg.seed = seed;
  }
  cfg.rank = rank;
  cfg.world = world;
  DEW_USAGE_CHECK(!d.has("split"), "option ", key_name(d, "split"),
                  " cannot be set: the trainer chooses the split (train for training, val for validation)");

  std::map<std::string, std::string> forwarded;
  for (const auto& [key, value] : d.values()) {
    bool mine = false;
    for (const char* k : kLoaderKeys) mine = mine || key == k;
    if (!mine) forwarded[key] = d.get_string(key, value);
  }
  forwarded["split"] = split;
  const bool pack = d.get_bool("pack", false);
  if (pack) forwarded["pack"] = "true";
  bool fixes_size = false;
  std::vector<RecordTransform> transforms =
      make_transforms(d.get_strings("transforms", {}), &fixes_size, /*evaluation=*/split != "train");
  if (fixes_size) forwarded["mixed_sizes_ok"] = "true";  // e.g. png_folder: images of several sizes
  Options source_options(std::move(forwarded), d.context());
  std::shared_ptr<DataSource> source = Registry::global().create<DataSource>(source_name, source_options);
  source_options.get_string("split", split);  // a source without splits need not read it
  // Likewise the transforms' flag; read only when set, so an unknown key's hint never offers it to the user.
  if (source_options.values().count("mixed_sizes_ok")) source_options.get_string("mixed_sizes_ok", "");
  DEW_USAGE_CHECK(!pack || source_options.was_read("pack"), "option ", key_name(d, "pack"), " = true: the ",
                  source_name,
                  " source has no document boundaries to pack (packing reads a tokens folder written by "
                  "dew-tokenize, or chat_jsonl conversations)");
  source_options.check_all_used();
  return std::make_unique<DataLoader>(std::move(source), cfg, std::move(transforms));
}

}  // namespace dew
