// tests/common/temp_dir.hpp — a fresh folder under the system's temp directory for one test, removed with it.
// Invariant: every TempDir of every test process is its own folder (dew_test_<name>_<pid>_<n>, n counting the
// process's TempDirs), so tests running in parallel (ctest -j) and several TempDirs in one test never share one.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace dew_test {

struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& name = "tmp") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           ("dew_test_" + name + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string str() const { return path.string(); }
  std::string operator/(const std::string& name) const { return (path / name).string(); }
};

}  // namespace dew_test
