// core/data/host_array.cpp — host arrays (what data sources produce) and moving a host batch to a backend.
#include <cstring>

#include "dew/data.hpp"
#include "dew/error.hpp"

namespace dew {

HostArray HostArray::make(DType dtype, const Shape& shape) {
  for (int64_t d : shape) DEW_CHECK(d >= 0, "HostArray: negative dimension in shape ", shape_str(shape));
  HostArray a;
  a.dtype = dtype;
  a.shape = shape;
  a.bytes.assign(size_t(numel_of(shape)) * dtype_size(dtype), 0);
  return a;
}

HostArray HostArray::scalar_i32(int32_t v) {
  HostArray a = make(DType::i32, {});
  std::memcpy(a.bytes.data(), &v, sizeof v);
  return a;
}

std::map<std::string, Tensor> to_device(const HostBatch& batch, const BackendPtr& backend) {
  DEW_CHECK(backend != nullptr, "to_device: no backend given");
  std::map<std::string, Tensor> out;
  for (const auto& [name, a] : batch) {
    DEW_CHECK(a.bytes.size() == size_t(a.numel()) * dtype_size(a.dtype), "to_device: field '", name, "' holds ",
              a.bytes.size(), " bytes, but ", dtype_name(a.dtype), " ", shape_str(a.shape), " needs ",
              size_t(a.numel()) * dtype_size(a.dtype));
    out.emplace(name, Tensor::from_host(a.bytes.data(), a.shape, a.dtype, backend));
  }
  return out;
}

}  // namespace dew
