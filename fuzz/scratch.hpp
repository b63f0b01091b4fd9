// fuzz/scratch.hpp — for targets whose parser reads files, not bytes: a folder of this process's own under
// the temp directory (made once, named by target and pid, so parallel targets never share one) and a
// writer that replaces a file's whole content with the input. The folder is removed when the process exits
// normally (libFuzzer's end of -runs / -max_total_time, a regression replay); after a crash it stays, holding
// the input that crashed.
#pragma once
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace fuzz {

inline std::filesystem::path scratch_dir(const std::string& target) {
  std::filesystem::path d =
      std::filesystem::temp_directory_path() / ("dew-fuzz-" + target + "-" + std::to_string(::getpid()));
  std::filesystem::create_directories(d);
  struct RemovedAtExit {
    std::vector<std::filesystem::path> dirs;
    ~RemovedAtExit() {
      for (const auto& dir : dirs) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    }
  };
  static RemovedAtExit made;
  made.dirs.push_back(d);
  return d;
}

inline void put_file(const std::filesystem::path& p, std::string_view bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc).write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace fuzz
