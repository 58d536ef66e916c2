// A tensor: shape, element type, device and refcounted storage. Results of ops live on their inputs' device.
// Tensors are float32; the layers store a network's activations in bfloat16 only on a CPU under
// Precision::Bf16, in its blocked layout (nn/layers.h's Layout).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "gpunodes/device.h"
#include "gpunodes/engine.h"
#include "gpunodes/shape.h"

namespace gn {

class Runtime;

// The element type: float32, or bfloat16 (float32's upper 16 bits, rounded to nearest even).
enum class DType { Float32, BFloat16 };
const char* dtype_name(DType t);  // "float32", "bfloat16"
int64_t dtype_size(DType t);      // bytes per element: 4, 2

// Memory on one device plus its engine variable. The memory is taken when it is first used: by the op
// that writes the tensor first, on its worker, not when the op is queued. A host that runs steps ahead of
// the devices therefore holds memory only for the ops that have run, and the peak follows what the work
// needs at each moment. Freed when the last tensor and the last queued op holding it let go, so a free
// never races an op still using it.
struct Storage {
  // Refuses at once a size that could never be allocated on `device` (past its memory or its limit), so
  // that error is the caller's; a shortfall that depends on what else is allocated is the first op's.
  Storage(Runtime& rt, Device device, int64_t bytes, StreamKind stream);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  // The memory, allocated on the first call (throws OutOfMemoryError there).
  void* data() {
    void* p = ptr_.load(std::memory_order_acquire);
    return p ? p : allocate();
  }
  bool allocated() const { return ptr_.load(std::memory_order_acquire) != nullptr; }

  Runtime& runtime;
  Device device;
  int64_t bytes;
  VarPtr var = new_var();

 private:
  void* allocate();
  StreamKind stream_;
  std::atomic<void*> ptr_{nullptr};
};

class Tensor {
 public:
  Tensor() = default;
  // Allocates uninitialised storage (throws OutOfMemoryError / ShapeError).
  Tensor(Runtime& rt, Shape shape, Device device, StreamKind stream = StreamKind::Compute,
         DType dtype = DType::Float32);

  bool defined() const { return storage_ != nullptr; }
  const Shape& shape() const { return shape_; }
  int64_t numel() const { return numel_; }
  int64_t bytes() const { return numel_ * dtype_size(dtype_); }
  DType dtype() const { return dtype_; }
  Device device() const;
  Runtime& runtime() const;
  // Allocates the storage on first use (see Storage): call it inside the op that writes or reads the tensor.
  // The float32 values; throws Error for a bfloat16 tensor, so that no kernel reads one as floats.
  float* data() const;
  // The values as stored, whatever the type: for kernels that take either.
  void* raw() const { return storage_->data(); }
  const VarPtr& var() const { return storage_->var; }
  // The same storage under another shape of the same element count (ShapeError otherwise): a view of the
  // whole tensor, as torch's view on contiguous memory. Ops still write fresh tensors, so a view is only
  // ever read; the layers use it to run a Linear over every step of a sequence without a copy.
  Tensor reshaped(Shape shape) const;
  // True when both tensors share storage: to() returning its input, for example.
  bool is_same(const Tensor& other) const { return storage_ == other.storage_; }
  std::shared_ptr<Storage> storage() const { return storage_; }
  std::string str() const;  // "Tensor[2, 3] float32 on cuda:0"

 private:
  Shape shape_;
  int64_t numel_ = 0;
  DType dtype_ = DType::Float32;
  std::shared_ptr<Storage> storage_;
};

}  // namespace gn
