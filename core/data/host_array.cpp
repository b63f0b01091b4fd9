// core/data/host_array.cpp — host arrays (what data sources produce) and moving a host batch to a backend.
#include <algorithm>
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

int64_t for_each_pass_batch(DataLoader& loader, int64_t records, int64_t max_batches, const BackendPtr& backend,
                            const std::function<void(const std::map<std::string, Tensor>& batch, int64_t first,
                                                     int64_t use)>& fn) {
  const LoaderConfig& lc = loader.config();
  const int64_t rows = lc.batch_size, global = rows * int64_t(lc.world);
  DEW_CHECK(rows > 0, "a pass over a split: the batch size must be positive, got ", rows);
  int64_t batches = records > 0 ? (records + global - 1) / global : 0;
  if (max_batches > 0) batches = std::min(batches, max_batches);
  int64_t handed = 0;
  for (int64_t j = 0; j < batches; ++j) {
    const HostBatch hb = loader.next();
    const int64_t first = j * global + int64_t(lc.rank) * rows;  // relative to the start of the pass
    int64_t use = std::clamp<int64_t>(records - first, 0, rows);
    if (use == 0) continue;
    std::map<std::string, Tensor> batch = to_device(hb, backend);
    for (auto& [name, t] : batch) {
      if (t.ndim() > 0) use = std::min(use, t.shape()[0]);
    }
    for (auto& [name, t] : batch)
      if (t.ndim() > 0 && use < t.shape()[0]) t = t.slice0(0, use);
    fn(batch, first, use);
    handed += use;
  }
  return handed;
}

}  // namespace dew
