// timeout.cpp — the collective timeout every communicator plugin reads (dew/comm.hpp).
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

}  // namespace dew
