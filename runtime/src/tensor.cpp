#include "gpunodes/tensor.h"

#include "gpunodes/errors.h"
#include "gpunodes/runtime.h"

namespace gn {

Storage::Storage(Runtime& rt, Device d, int64_t n, StreamKind stream)
    : runtime(rt), device(d), bytes(n), stream_(stream) {
  rt.allocator(d).refuse_impossible(n);
}

Storage::~Storage() {
  if (void* p = ptr_.load(std::memory_order_acquire)) runtime.allocator(device).deallocate(p);
}

void* Storage::allocate() {
  void* fresh = runtime.allocator(device).allocate(static_cast<size_t>(bytes), stream_);
  void* expected = nullptr;
  if (ptr_.compare_exchange_strong(expected, fresh, std::memory_order_acq_rel)) return fresh;
  // Two readers of a tensor nothing wrote raced to allocate it: keep the first.
  runtime.allocator(device).deallocate(fresh);
  return expected;
}

const char* dtype_name(DType t) {
  return t == DType::BFloat16 ? "bfloat16" : "float32";
}

int64_t dtype_size(DType t) {
  return t == DType::BFloat16 ? 2 : 4;
}

Tensor::Tensor(Runtime& rt, Shape shape, Device device, StreamKind stream, DType dtype)
    : shape_(std::move(shape)), numel_(checked_numel(shape_)), dtype_(dtype) {
  if (!rt.has(device)) throw Error("no such device: " + device.str());
  storage_ = std::make_shared<Storage>(rt, device, bytes(), stream);
}

Tensor Tensor::reshaped(Shape shape) const {
  if (!storage_) throw Error("reshaped: the tensor is undefined");
  const int64_t n = checked_numel(shape);
  if (n != numel_) throw ShapeError("cannot view " + shape_str(shape_) + " as " + shape_str(shape));
  Tensor view = *this;
  view.shape_ = std::move(shape);
  return view;
}

float* Tensor::data() const {
  if (dtype_ != DType::Float32)
    throw Error("Tensor" + shape_str(shape_) + " holds " + dtype_name(dtype_) + " where float32 is needed");
  return static_cast<float*>(storage_->data());
}

Device Tensor::device() const {
  return storage_->device;
}
Runtime& Tensor::runtime() const {
  return storage_->runtime;
}

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape_str(shape_) + " " + dtype_name(dtype_) + " on " + device().str();
}

}  // namespace gn
