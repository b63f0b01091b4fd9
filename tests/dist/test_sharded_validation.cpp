// tests/dist/test_sharded_validation.cpp — Objective::shards_validation in one process: for each
// objective that shards (classify, lm, dpo, diffusion), a run trained for two updates is validated once
// over the whole split and once as 3 ranks would (loaders with rank r of world 3, uneven shares: a rank
// without rows in the last global batch), with each rank's per-rank batch size B against the whole
// loader's 3B (a data-parallel run's global batch). The ranks' sums, added and handed to
// validation_metrics(), must give the whole split's metrics (1e-6 relative: the same records, summed in
// another order) and its record / token / pair count exactly; artifacts come from rank 0 only. A wrong
// objective — a rank scoring the whole split, rows past the split counted, a mean where a sum belongs —
// fails here. The trainer's side (the sums added over MPI ranks) is tests/dist/validation.sh.
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "dew/config.hpp"
#include "dew/data.hpp"
#include "dew/objective.hpp"
#include "dew/registry.hpp"
#include "dew/tokenizer.hpp"
#include "dew/train.hpp"
#include "temp_dir.hpp"

namespace fs = std::filesystem;

namespace {

using dew_test::TempDir;

void discover_plugins() {
  auto& reg = dew::Registry::global();
  if (!reg.contains("backend", "ref")) reg.discover(dew::Registry::default_plugin_dirs());
}

// Trains `ini` (with [data] batch_size = 3 * per_rank) for two updates in `dir`, then validates the
// result whole and as 3 ranks of per_rank rows each; returns the whole split's metrics.
std::map<std::string, double> check_shards(const fs::path& dir, const std::string& ini, int64_t per_rank,
                                           const std::string& count_key) {
  discover_plugins();
  dew::Config cfg = dew::Config::parse_ini(ini + "\n[trainer]\nsteps = 2\nlog_every = 1\n");
  cfg.section("data").set("batch_size", std::to_string(3 * per_rank));
  dew::TrainOptions to;
  to.run_dir = (dir / "run").string();
  REQUIRE(dew::train(cfg, to) == 0);

  auto ir = dew::load_inference_run(to.run_dir, "latest", false, "");
  dew::Objective& objective = *ir->objective;
  REQUIRE(objective.shards_validation());
  const uint64_t seed = uint64_t(ir->config.section("run").get_int("seed", 0));
  const dew::StepInfo info{ir->updates, 0, seed};

  auto whole_loader = dew::make_loader(ir->config.section("data"), "val", seed);
  const dew::ValidationResult whole = objective.validate(*whole_loader, info);
  REQUIRE(!whole.sums.empty());
  CHECK(objective.validation_metrics(whole.sums) == whole.metrics);

  ir->config.section("data").set("batch_size", std::to_string(per_rank));
  std::map<std::string, double> total;
  bool uneven = false;
  for (int rank = 0; rank < 3; ++rank) {
    auto loader = dew::make_loader(ir->config.section("data"), "val", seed, rank, 3);
    const dew::ValidationResult part = objective.validate(*loader, info);
    INFO("rank " << rank);
    REQUIRE(part.sums.size() == whole.sums.size());
    for (const auto& [key, value] : part.sums) {
      REQUIRE(whole.sums.count(key) == 1);
      total[key] += value;
    }
    CHECK(part.sums.at(count_key) > 0);                         // every rank scored some of the split
    CHECK(part.sums.at(count_key) < whole.sums.at(count_key));  // and not all of it
    if (rank == 0)
      CHECK(part.artifacts.size() == whole.artifacts.size());
    else
      CHECK(part.artifacts.empty());
    uneven = uneven || part.sums.at(count_key) != whole.sums.at(count_key) / 3;
  }
  CHECK(uneven);  // the shares differ: the last global batch leaves a rank short (or empty)
  CHECK(total.at(count_key) == whole.sums.at(count_key));
  const std::map<std::string, double> sharded = objective.validation_metrics(total);
  REQUIRE(sharded.size() == whole.metrics.size());
  for (const auto& [key, value] : whole.metrics) {
    INFO(key << ": whole " << value << ", 3 ranks " << sharded.at(key));
    CHECK(std::abs(sharded.at(key) - value) <= 1e-6 * std::max(1.0, std::abs(value)));
  }
  return whole.metrics;
}

std::string byte_corpus(const fs::path& dir) {
  std::vector<std::string> docs;
  for (int i = 0; i < 60; ++i)
    docs.push_back("document " + std::to_string(i) + ": the quick brown fox jumps over the lazy dog " +
                   std::string(size_t(i % 7), '!'));
  dew::write_token_corpus(*dew::make_byte_tokenizer(), docs, (dir / "bytes").string(), 0.3);
  return (dir / "bytes").string();
}

}  // namespace

TEST_CASE("classify: 3 ranks' validation sums give the whole split's loss and accuracy") {
  TempDir d("classify");
  const auto m = check_shards(d.path,
                              "[run]\nname = c\nseed = 3\nbackend = ref\n[model]\nplugin = mlp\nhidden = 16\n"
                              "[objective]\nplugin = classify\n[data]\nsource = synthetic\nsize = 23\n"
                              "image_size = 8\n[optim]\nname = adamw\nlr = 0.01\n",
                              4, "records");
  CHECK(m.count("accuracy") == 1);
}

TEST_CASE("lm: 3 ranks' validation sums give the whole split's ce, accuracy and token count, one sample") {
  TempDir d("lm");
  const auto m = check_shards(d.path,
                              "[run]\nname = l\nseed = 2\nbackend = cpu\n[model]\nplugin = causal_transformer\n"
                              "dim = 16\nn_layers = 1\nn_heads = 2\n[objective]\nplugin = lm\nsample_tokens = 8\n"
                              "[data]\nsource = tokens\nseq_len = 16\npath = " +
                                  byte_corpus(d.path) + "\n[optim]\nname = adamw\nlr = 0.003\n",
                              3, "tokens");
  CHECK(m.at("perplexity") == doctest::Approx(std::exp(m.at("ce"))));
}

TEST_CASE("dpo: 3 ranks' validation sums give the whole split's reward metrics and pair count") {
  TempDir d("dpo");
  const fs::path pairs = d.path / "pairs.jsonl";
  {
    std::ofstream out(pairs);
    for (int i = 0; i < 40; ++i)
      out << "{\"prompt\": \"say " << i << ":\", \"chosen\": \" " << i << "!\", \"rejected\": \" " << i * 7 << "?\"}\n";
  }
  check_shards(d.path,
               "[run]\nname = p\nseed = 2\nbackend = ref\n[model]\nplugin = causal_transformer\ndim = 16\n"
               "n_layers = 1\nn_heads = 2\n[objective]\nplugin = dpo\nbeta = 0.5\nsft_weight = 0.1\n"
               "[data]\nsource = preference_jsonl\nseq_len = 16\nval_count = 11\npath = " +
                   pairs.string() + "\ntokenizer = " + byte_corpus(d.path) + "\n[optim]\nname = adamw\nlr = 0.01\n",
               2, "pairs");
}

TEST_CASE("diffusion: 3 ranks' validation sums give the whole split's loss, the grid from rank 0") {
  TempDir d("diffusion");
  check_shards(d.path,
               "[run]\nname = f\nseed = 5\nbackend = cpu\n[model]\nplugin = dit\npatch = 4\ndim = 16\ndepth = 1\n"
               "heads = 2\n[objective]\nplugin = diffusion\npreset = edm\nregime = pixel\nval_records = 22\n"
               "val_grid_rows = 1\n[sampler]\nplugin = euler\nsteps = 2\n[data]\nsource = synthetic\nsize = 64\n"
               "image_size = 8\nnum_classes = 4\n[optim]\nname = adamw\nlr = 0.001\n",
               4, "records");
}
