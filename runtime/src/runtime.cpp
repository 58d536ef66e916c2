#include "gpunodes/runtime.h"

#include "gpunodes/errors.h"

namespace gn {

Runtime::Runtime(RuntimeOptions options) : options_(std::move(options)) {
  if (options_.cpu_devices < 1) throw Error("cpu_devices must be at least 1");
  cpu_backend_ = make_cpu_backend(options_.cpu_devices);
  if (options_.use_cuda) cuda_backend_ = make_cuda_backend();
  // CUDA devices first, as try_all_gpus lists them; then the CPU devices.
  if (cuda_backend_) devices_ = cuda_backend_->enumerate();
  for (auto& info : cpu_backend_->enumerate()) devices_.push_back(info);
  for (auto& info : devices_) {
    auto alloc = backend(info.device).make_allocator(info.device, &profiler_);
    if (auto it = options_.memory_limits.find(info.device); it != options_.memory_limits.end())
      alloc->set_limit(it->second);
    allocators_[info.device] = std::move(alloc);
  }
  for (auto& [device, limit] : options_.memory_limits)
    if (!allocators_.count(device)) throw Error("memory_limit names " + device.str() + ", which does not exist");
  engine_ = std::make_unique<Engine>(
      profiler_, [this](Device d, StreamKind s) { return backend(d).make_worker(d, s); });
  engine_->set_schedule(options_.schedule);
}

Runtime::~Runtime() {
  // Tensors may still be queued in ops; let them finish before the allocators go.
  try {
    engine_->wait_all();
  } catch (...) {
  }
  engine_.reset();
}

bool Runtime::has(Device d) const { return allocators_.count(d) != 0; }

const DeviceInfo& Runtime::info(Device d) const {
  for (const auto& i : devices_)
    if (i.device == d) return i;
  throw Error("no such device: " + d.str());
}

int Runtime::cuda_device_count() const {
  int n = 0;
  for (const auto& i : devices_) n += i.device.is_cuda();
  return n;
}

Device Runtime::try_gpu(int i) const {
  if (i >= 0 && i < cuda_device_count()) return Device::cuda(i);
  return Device::cpu((i < 0 ? 0 : i) % options_.cpu_devices);
}

std::vector<Device> Runtime::try_all_gpus() const {
  std::vector<Device> out;
  for (const auto& i : devices_)
    if (i.device.is_cuda()) out.push_back(i.device);
  if (out.empty())
    for (int i = 0; i < options_.cpu_devices; ++i) out.push_back(Device::cpu(i));
  return out;
}

Allocator& Runtime::allocator(Device d) {
  auto it = allocators_.find(d);
  if (it == allocators_.end()) throw Error("no such device: " + d.str());
  return *it->second;
}

void Runtime::reset_peak_memory() {
  for (auto& [device, allocator] : allocators_) allocator->reset_peak();
}

Backend& Runtime::backend(Device d) {
  if (d.is_cuda()) {
    if (!cuda_backend_) throw Error("no CUDA backend for " + d.str());
    return *cuda_backend_;
  }
  return *cpu_backend_;
}

}  // namespace gn
