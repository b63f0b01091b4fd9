// dew/tensor.hpp — the tensor: shape, dtype, and reference-counted storage owned by a backend.
//
// Invariants:
//  * A Tensor is a handle (shared_ptr to TensorImpl); copies alias. Data is contiguous row-major;
//    views (reshape, slicing the leading axis) share storage at an element offset and are free.
//  * Storage keeps its backend (and so the backend's plugin library) alive.
//  * Autograd state (requires_grad, grad, grad_fn) lives in the impl; see dew/autograd.hpp.
//  * A quantized tensor (int8 decode weights, dew/generate.hpp) is an i8 tensor with `scales`: seen as
//    [rows, k] (k its last axis), element (r, c) stands for q[r, c] * scales[r, c / (k / G)] (the f32
//    product), where scales is f32 [rows, G] on the same backend (G groups of k / G columns per row; G = 1:
//    one scale per row).
//    Views that keep whole rows (slice0, detach, reshape keeping the last axis) carry their rows' scales;
//    clone and to() copy them; to_doubles() gives the dequantized values.
//  * A tensor in panels (decode weights, dew/generate.hpp store_matmul_weights_in_panels) is a 2-D [n, k] f32 or
//    bf16 weight whose rows are stored in panels of P = panel rows (n % P == 0), column-major inside a panel:
//    element (r, c) at ((r / P) * k + c) * P + r % P, the layout a backend's decode product streams in address
//    order (Backend::decode_panel_rows). It is the one tensor that is not row-major: only linear() multiplies
//    it (the backends' weight-only matmul, which reads panel_data()); data() refuses it, so no other kernel can
//    read it as rows. copy_to_host / to_doubles / to() give its values row-major, copy_from_host takes them
//    row-major (and packs them); detach, clone and slice0 at panel boundaries keep the panels; reshape to
//    another shape and copy_ refuse.
#pragma once
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "dew/dtype.hpp"

namespace dew {

class Backend;
using BackendPtr = std::shared_ptr<Backend>;
struct Node;

using Shape = std::vector<int64_t>;
int64_t numel_of(const Shape& s);
std::string shape_str(const Shape& s);  // "[2, 3, 4]"

struct Storage {
  Storage(BackendPtr backend, size_t bytes);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;
  BackendPtr backend;
  void* data = nullptr;
  size_t bytes = 0;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  size_t offset = 0;  // in elements
  Shape shape;
  DType dtype = DType::f32;
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;  // accumulated gradient of a leaf (same shape, dtype, backend)
  std::shared_ptr<Node> grad_fn;     // the node that produced this tensor (null for leaves)
  std::shared_ptr<TensorImpl> scales;  // a quantized i8 tensor's f32 [rows, G] scales (above); null otherwise
  int64_t panel = 0;                   // rows per panel of a tensor in panels (above); 0: row-major
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- creation (on a backend; see default_backend()) ----
  static Tensor empty(const Shape& shape, DType dtype, const BackendPtr& backend);
  static Tensor zeros(const Shape& shape, DType dtype, const BackendPtr& backend);
  static Tensor full(const Shape& shape, double value, DType dtype, const BackendPtr& backend);
  // Copies host data of `dtype` layout (f32 data for DType::f32, int32_t for i32, ...).
  static Tensor from_host(const void* data, const Shape& shape, DType dtype, const BackendPtr& backend);
  static Tensor from_vector(const std::vector<float>& v, const Shape& shape, const BackendPtr& backend,
                            DType dtype = DType::f32);  // converts from f32
  static Tensor from_ints(const std::vector<int32_t>& v, const Shape& shape, const BackendPtr& backend);
  // Philox-filled tensors: element i is philox(seed, stream, i) (see dew/random.hpp).
  static Tensor uniform(const Shape& shape, float lo, float hi, uint64_t seed, uint64_t stream,
                        const BackendPtr& backend, DType dtype = DType::f32);
  static Tensor normal(const Shape& shape, float mean, float std, uint64_t seed, uint64_t stream,
                       const BackendPtr& backend, DType dtype = DType::f32);

  // ---- metadata ----
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const;
  int64_t size(int axis) const;  // negative axes count from the end
  int ndim() const { return int(shape().size()); }
  int64_t numel() const { return numel_of(shape()); }
  DType dtype() const;
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype()); }
  Backend& backend() const;
  const BackendPtr& backend_ptr() const;
  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }
  // A quantized tensor's scales (f32 [rows, G], top comment); undefined for every other tensor.
  Tensor scales() const { return impl_ && impl_->scales ? Tensor(impl_->scales) : Tensor(); }
  bool quantized() const { return impl_ && impl_->scales != nullptr; }
  // Rows per panel of a tensor in panels (top comment); 0 for every row-major tensor.
  int64_t panel_rows() const { return impl_ ? impl_->panel : 0; }

  // Pointer to the first element in the backend's address space (host memory for ref/cpu). Refuses a tensor
  // in panels (top comment): a kernel that reads one takes panel_data() and the layout with it.
  void* data() const;
  void* panel_data() const;  // the first panel of a tensor in panels (refuses a row-major one)
  template <class T>
  T* data_as() const {
    return static_cast<T*>(data());
  }

  // ---- host access (copies; converts floating types to f32/f64) ----
  std::vector<float> to_floats() const;
  std::vector<double> to_doubles() const;
  std::vector<int32_t> to_ints() const;  // i32/i64/u8 tensors
  void copy_to_host(void* dst) const;    // raw bytes of this tensor (row-major, a tensor in panels too)
  void copy_from_host(const void* src);  // raw bytes into this tensor (row-major, a tensor in panels too)
  double item() const;                   // a one-element tensor's value

  // ---- views and copies ----
  Tensor reshape(const Shape& shape) const;         // a view; -1 infers one axis; differentiable
  Tensor slice0(int64_t begin, int64_t end) const;  // rows [begin, end) of the leading axis; a view
  Tensor detach() const;                            // same storage, no autograd history
  Tensor clone() const;                             // a copy on the same backend, no history
  Tensor to(const BackendPtr& backend) const;       // a copy on another backend, no history
  void copy_(const Tensor& src);                    // in-place copy of equal shape and dtype, no history

  // ---- autograd ----
  bool requires_grad() const;
  Tensor& set_requires_grad(bool on = true);
  Tensor grad() const;  // undefined until a backward pass reached this leaf
  void zero_grad();     // drops the accumulated gradient
  void set_grad(const Tensor& g);
  void backward() const;  // requires a one-element tensor; seeds its gradient with 1

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// The backend new parameters and host-made tensors go to when none is given.
void set_default_backend(BackendPtr backend);
const BackendPtr& default_backend();  // refuses with a hint when none is set
bool has_default_backend();

}  // namespace dew
