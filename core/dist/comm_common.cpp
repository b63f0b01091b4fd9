// comm_common.cpp — what every communicator plugin shares (dew/comm.hpp): the collective timeout and
// the checked pieces of a reduce-scatter / all-gather.
#include <cstdlib>

#include "dew/comm.hpp"
#include "dew/error.hpp"

namespace dew {

double communicator_timeout(const Options& options, const std::string& plugin) {
  double fallback = 60.0;
  if (const char* env = std::getenv("DEW_DIST_TIMEOUT"); env && *env) {
    char* end = nullptr;
    fallback = std::strtod(env, &end);
    DEW_USAGE_CHECK(end && *end == '\0' && fallback >= 0, "DEW_DIST_TIMEOUT must be a number of seconds >= 0, got '",
                    env, "'");
  }
  const double timeout = options.get_double("timeout", fallback);
  DEW_USAGE_CHECK(timeout >= 0, plugin, ": option 'timeout' must be >= 0 seconds (0 = no limit), got ", timeout);
  return timeout;
}

std::vector<int64_t> collective_counts(const std::vector<int64_t>& counts, int64_t total, int world, const char* op,
                                       const std::string& plugin) {
  if (counts.empty()) {
    DEW_CHECK(world > 0 && total % world == 0, plugin, ": ", op, " of ", total, " elements into ", world,
              " equal pieces: not divisible (pass counts)");
    return std::vector<int64_t>(size_t(world), total / world);
  }
  DEW_CHECK(counts.size() == size_t(world), plugin, ": ", op, " needs one count per rank (", world, "), got ",
            counts.size());
  int64_t sum = 0;
  for (int64_t c : counts) {
    DEW_CHECK(c >= 0, plugin, ": ", op, ": negative count ", c);
    sum += c;
  }
  DEW_CHECK(sum == total, plugin, ": ", op, ": the counts add up to ", sum, " elements, the full tensor has ", total);
  return counts;
}

}  // namespace dew
