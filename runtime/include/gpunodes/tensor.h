// A float32 tensor: shape, device and refcounted storage. Results of ops live on their inputs' device.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "gpunodes/device.h"
#include "gpunodes/engine.h"
#include "gpunodes/shape.h"

namespace gn {

class Runtime;

// Memory on one device plus its engine variable. Freed when the last tensor and the last queued op
// holding it let go, so a free never races an op still using it.
struct Storage {
  Storage(Runtime& rt, Device device, int64_t bytes, StreamKind stream);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  Runtime& runtime;
  Device device;
  int64_t bytes;
  void* ptr = nullptr;
  VarPtr var = new_var();
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates uninitialised storage (throws OutOfMemoryError / ShapeError).
  Tensor(Runtime& rt, Shape shape, Device device, StreamKind stream = StreamKind::Compute);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * static_cast<int64_t>(sizeof(float)); }
  static constexpr const char* dtype() { return "float32"; }
  Device device() const;
  Runtime& runtime() const;
  float* data() const { return static_cast<float*>(storage_->ptr); }
  const VarPtr& var() const { return storage_->var; }
  // True when both tensors share storage: to() returning its input, for example.
  bool is_same(const Tensor& other) const { return storage_ == other.storage_; }
  std::shared_ptr<Storage> storage() const { return storage_; }
  std::string str() const;  // "Tensor[2, 3] float32 on cuda:0"

 private:
  Shape shape_;
  int64_t numel_ = 0;
  std::shared_ptr<Storage> storage_;
};

}  // namespace gn
