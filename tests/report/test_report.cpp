// tests/report/test_report.cpp — the pieces of the run report and the TensorBoard writer that have known
// answers: metrics.jsonl lines as the trainer writes them (NaN / Infinity included), artifact names, and
// CRC-32C (the check value of the standard, and TFRecord's masking of it).
#define DOCTEST_CONFIG_IMPLEMENT_WITH_MAIN
#include <doctest/doctest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "dew/error.hpp"
#include "dew/report.hpp"
#include "report/run_files.hpp"
#include "train/tensorboard.hpp"

TEST_CASE("parse_metrics_line keeps the line's order and reads non-finite values") {
  const dew::MetricsRecord r =
      dew::parse_metrics_line(R"({"step":40,"loss":0.5,"lr":NaN,"grad_norm":Infinity,"x":-Infinity,"name":"a"})");
  CHECK(r.step == 40);
  REQUIRE(r.values.size() == 4);  // the string field is not a scalar
  CHECK(r.values[0].first == "loss");
  CHECK(r.values[0].second == 0.5);
  CHECK(r.values[1].first == "lr");
  CHECK(std::isnan(r.values[1].second));
  CHECK(r.values[2].first == "grad_norm");
  CHECK(r.values[2].second == INFINITY);
  CHECK(r.values[3].second == -INFINITY);
  // A key that merely contains a word is not rewritten.
  CHECK(dew::parse_metrics_line(R"({"step":1,"NaN_count":2})").values.at(0).first == "NaN_count");
}

TEST_CASE("parse_metrics_line refuses lines that are not metrics, naming them") {
  CHECK_THROWS_WITH_AS(dew::parse_metrics_line("{\"step\":1,", "m.jsonl:3"), doctest::Contains("m.jsonl:3"),
                       dew::UsageError);
  CHECK_THROWS_AS(dew::parse_metrics_line("[1, 2]"), dew::UsageError);
  CHECK_THROWS_WITH_AS(dew::parse_metrics_line(R"({"loss":1})"), doctest::Contains("no numeric \"step\""),
                       dew::UsageError);
}

TEST_CASE("artifact names: tag and step") {
  using namespace dew::run_files;
  CHECK(artifact_tag("grid-0001500.png") == "grid");
  CHECK(artifact_step("grid-0001500.png") == 1500);
  CHECK(artifact_tag("sample-step-00000800.txt") == "sample");
  CHECK(artifact_step("sample-step-00000800.txt") == 800);
  CHECK(artifact_tag("00000800.txt") == "sample");
  CHECK(artifact_step("notes.txt") == -1);
  CHECK(artifact_tag("notes.txt") == "notes");
}

TEST_CASE("CRC-32C: the standard's check value and TFRecord's mask") {
  const char* s = "123456789";
  CHECK(dew::tensorboard::crc32c(s, std::strlen(s)) == 0xE3069283u);
  CHECK(dew::tensorboard::crc32c("", 0) == 0u);
  const uint32_t c = 0xE3069283u;
  CHECK(dew::tensorboard::masked_crc32c(s, std::strlen(s)) == (((c >> 15) | (c << 17)) + 0xa282ead8u));
}

TEST_CASE("EventWriter: reopening at a step keeps the records up to it and appends") {
  namespace fs = std::filesystem;
  const fs::path dir = fs::temp_directory_path() / ("dew-test-tb-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  std::string path;
  uintmax_t after_two = 0;
  {
    dew::tensorboard::EventWriter w(dir.string(), 0);
    path = w.path();
    w.add_scalars(1, {{"loss", 1.0}});
    w.add_scalars(2, {{"loss", 0.5}});
    w.flush();
    after_two = fs::file_size(path);
    w.add_scalars(3, {{"loss", 0.25}});
    w.flush();
  }
  CHECK(fs::file_size(path) > after_two);
  {
    dew::tensorboard::EventWriter w(dir.string(), 2);  // a resume at update 2
    CHECK(w.path() == path);
    CHECK(fs::file_size(path) == after_two);
  }
  {
    std::ofstream(path, std::ios::binary | std::ios::app) << "torn";  // a crash mid-record
    dew::tensorboard::EventWriter w(dir.string(), 5);
    CHECK(fs::file_size(path) == after_two);
    CHECK_THROWS_AS(w.add_image(3, "val/x", {1, 2, 3}), dew::Error);  // not a PNG
  }
  fs::remove_all(dir);
}
