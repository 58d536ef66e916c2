// CUDA stream workers and the per-thread resources that kernels, cuBLAS and staged copies use.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstddef>
#include <map>
#include <utility>

#include "gpunodes/engine.h"

namespace gn::cuda {

// Makes `device` current for a scope and restores the previous one: the allocator and enumerate() run on
// the caller's thread, whose current device must not change under it.
class DeviceGuard {
 public:
  explicit DeviceGuard(int device);
  ~DeviceGuard();
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

// Partial sums of a reduction: one per block of the first pass.
constexpr int kReduceBlocks = 1024;

// What one host thread keeps for one device. cuBLAS and cuDNN handles are not safe to share between threads
// that use them at once, so each worker thread has its own; events must belong to the device of the stream
// they mark. The backend's kernels and the nn layer's (cuda_nn_kernels.cu) share them, so that a worker
// releases every handle in on_thread_stop(), while the stream the handles were last set to still exists.
struct PerDeviceResources {
  cublasHandle_t cublas = nullptr;
  cudnnHandle_t cudnn = nullptr;             // made on the first cuDNN call (cudnnCreate is slow)
  double* scratch = nullptr;                 // kReduceBlocks doubles
  cudaEvent_t done[2] = {nullptr, nullptr};  // double buffering: staging halves, gemm chunks
};

// Everything a host thread holds for CUDA work. A worker thread releases it in on_thread_stop(); any other
// thread that runs a kernel call (tests, benchmarks) releases it at thread exit.
class ThreadResources {
 public:
  ThreadResources() = default;
  ~ThreadResources();  // never throws: it may run while the process exits
  ThreadResources(const ThreadResources&) = delete;
  ThreadResources& operator=(const ThreadResources&) = delete;

  // Created on first use; `index` must be the current device.
  PerDeviceResources& device(int index);
  // device(index)'s cuDNN handle, created on first use; `index` must be the current device.
  cudnnHandle_t cudnn(int index);
  // Two page-locked buffers of at least `bytes` each, kept and grown as needed. Portable, so any device's
  // stream may read and write them.
  std::pair<void*, void*> staging(size_t bytes);

 private:
  std::map<int, PerDeviceResources> devices_;
  void* staging_[2] = {nullptr, nullptr};
  size_t staging_bytes_ = 0;
};

ThreadResources& thread_resources();
void release_thread_resources();

// One host thread and one non-blocking CUDA stream for one (device, stream kind). Each op is bracketed by
// events, and the worker waits for the end event: that is the engine's completion point, so dependents start
// only after the GPU finished. Event times are placed on the profiler's timeline through a reference event
// whose host time is taken right after waiting for it.
class CudaStreamWorker final : public StreamWorker {
 public:
  CudaStreamWorker(Device device, StreamKind stream) : StreamWorker(device, stream) {}

 protected:
  void on_thread_start() override;
  void on_thread_stop() override;
  void* native_stream() override { return stream_; }
  std::pair<double, double> run_timed(const OpFn& fn, OpContext& ctx) override;

 private:
  void anchor();  // records the reference event on an idle stream and notes its host time

  cudaStream_t stream_ = nullptr;
  cudaEvent_t ref_ = nullptr, start_ = nullptr, end_ = nullptr;
  double ref_host_us_ = 0;  // profiler time at which the reference event was seen complete
};

}  // namespace gn::cuda
