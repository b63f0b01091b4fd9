// dew/safetensors.hpp — the safetensors format (Hugging Face): an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}, then
// the raw little-endian tensor bytes. Names are kept verbatim (dew's parameter names).
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "dew/tensor.hpp"

namespace dew {

// Writes tensors (any backend; copied to the host) atomically (temporary file + rename).
void write_safetensors(const std::string& path, const std::vector<std::pair<std::string, Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads every tensor onto `backend`, in file order; errors name the file and what is wrong.
std::vector<std::pair<std::string, Tensor>> read_safetensors(const std::string& path, const BackendPtr& backend,
                                                             std::map<std::string, std::string>* metadata = nullptr);

}  // namespace dew
