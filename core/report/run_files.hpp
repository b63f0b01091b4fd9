// core/report/run_files.hpp — names of a run directory's validation artifacts (RUN_DIR/samples/), shared by
// the HTML report and the TensorBoard writer: "grid-0000008.png" is tag "grid" at step 8,
// "sample-step-00000800.txt" tag "sample" at step 800.
#pragma once
#include <cstdint>
#include <string>

namespace dew::run_files {

// The file name without its extension, its trailing step number, and a "-step" / "_step" before it
// ("sample" when nothing is left).
std::string artifact_tag(const std::string& file_name);
// The trailing step number of the name (before the extension); -1 when it has none.
int64_t artifact_step(const std::string& file_name);

}  // namespace dew::run_files
