#include "gpunodes/tensor.h"

#include "gpunodes/errors.h"
#include "gpunodes/runtime.h"

namespace gn {

Storage::Storage(Runtime& rt, Device d, int64_t n, StreamKind stream) : runtime(rt), device(d), bytes(n) {
  ptr = rt.allocator(d).allocate(static_cast<size_t>(n), stream);
}

Storage::~Storage() { runtime.allocator(device).deallocate(ptr); }

Tensor::Tensor(Runtime& rt, Shape shape, Device device, StreamKind stream)
    : shape_(std::move(shape)), numel_(checked_numel(shape_)) {
  if (!rt.has(device)) throw Error("no such device: " + device.str());
  storage_ = std::make_shared<Storage>(rt, device, bytes(), stream);
}

Device Tensor::device() const { return storage_->device; }
Runtime& Tensor::runtime() const { return storage_->runtime; }

std::string Tensor::str() const {
  if (!defined()) return "Tensor(undefined)";
  return "Tensor" + shape_str(shape_) + " " + dtype() + " on " + device().str();
}

}  // namespace gn
