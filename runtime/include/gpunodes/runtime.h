// The runtime: devices, their allocators and workers, the engine and the profiler, in one object.
// Tensors point back to it, so it must outlive them; its destructor waits for all work.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gpunodes/backend.h"
#include "gpunodes/device.h"
#include "gpunodes/engine.h"
#include "gpunodes/memory.h"
#include "gpunodes/profiler.h"

namespace gn {

struct RuntimeOptions {
  // Splits the CPU into N devices, each with its own workers and 1/N of the cores.
  int cpu_devices = 1;
  Schedule schedule = Schedule::Parallel;
  // Per-device caps in bytes ("cpu:1" -> 64 MiB), to simulate small cards and test out-of-memory.
  std::map<Device, int64_t> memory_limits;
  // Off to run as if no GPU were present, even where one is.
  bool use_cuda = true;
};

class Runtime {
 public:
  explicit Runtime(RuntimeOptions options = {});
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  const RuntimeOptions& options() const { return options_; }
  const std::vector<DeviceInfo>& devices() const { return devices_; }
  bool has(Device d) const;
  const DeviceInfo& info(Device d) const;  // throws Error for a device that does not exist
  int cuda_device_count() const;
  int cpu_device_count() const { return options_.cpu_devices; }

  // d2l's try_gpu(i): cuda:i when it exists; otherwise the CPU fallback cpu:(i mod cpu_devices).
  Device try_gpu(int i = 0) const;
  // Every GPU, or every CPU device when there is none.
  std::vector<Device> try_all_gpus() const;
  // Whether try_gpu(i) had to fall back.
  bool is_fallback(int gpu_index) const { return gpu_index >= cuda_device_count(); }

  Engine& engine() { return *engine_; }
  Profiler& profiler() { return profiler_; }
  Allocator& allocator(Device d);
  Backend& backend(Device d);
  MemoryStats memory_stats(Device d) { return allocator(d).stats(); }
  void reset_peak_memory();  // every device's, see Allocator::reset_peak

 private:
  RuntimeOptions options_;
  Profiler profiler_;
  std::unique_ptr<Backend> cpu_backend_, cuda_backend_;
  std::vector<DeviceInfo> devices_;
  std::map<Device, std::unique_ptr<Allocator>> allocators_;
  std::unique_ptr<Engine> engine_;
};

}  // namespace gn
