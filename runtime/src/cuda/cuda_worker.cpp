#include "cuda_worker.h"

#include <memory>

#include "cuda_check.h"
#include "gpunodes/profiler.h"

namespace gn::cuda {

// --- DeviceGuard -------------------------------------------------------------------------------------------

DeviceGuard::DeviceGuard(int device) {
  GN_CUDA_CHECK(cudaGetDevice(&previous_));
  if (previous_ != device) GN_CUDA_CHECK(cudaSetDevice(device));
}

DeviceGuard::~DeviceGuard() {
  int current = -1;
  // A destructor must not throw; a failure here leaves the thread on `device`, which later calls re-set.
  if (cudaGetDevice(&current) == cudaSuccess && current != previous_) (void)cudaSetDevice(previous_);
}

// --- ThreadResources ---------------------------------------------------------------------------------------

ThreadResources::~ThreadResources() {
  // Errors are ignored: at process exit the CUDA runtime may already be unloading.
  for (auto& [index, r] : devices_) {
    if (cudaSetDevice(index) != cudaSuccess) continue;
    if (r.cudnn) (void)cudnnDestroy(r.cudnn);
    if (r.cublas) (void)cublasDestroy(r.cublas);
    if (r.scratch) (void)cudaFree(r.scratch);
    for (cudaEvent_t e : r.done)
      if (e) (void)cudaEventDestroy(e);
  }
  for (void* p : staging_)
    if (p) (void)cudaFreeHost(p);
  (void)cudaGetLastError();
}

PerDeviceResources& ThreadResources::device(int index) {
  auto it = devices_.find(index);
  if (it != devices_.end()) return it->second;
  // Build fully before inserting, so a failure leaves nothing half made behind.
  PerDeviceResources r;
  try {
    GN_CUBLAS_CHECK(cublasCreate(&r.cublas));
    GN_CUDA_CHECK(cudaMalloc(&r.scratch, kReduceBlocks * sizeof(double)));
    for (cudaEvent_t& e : r.done) GN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  } catch (...) {
    if (r.cublas) (void)cublasDestroy(r.cublas);
    if (r.scratch) (void)cudaFree(r.scratch);
    for (cudaEvent_t e : r.done)
      if (e) (void)cudaEventDestroy(e);
    (void)cudaGetLastError();
    throw;
  }
  return devices_.emplace(index, r).first->second;
}

cudnnHandle_t ThreadResources::cudnn(int index) {
  PerDeviceResources& r = device(index);
  if (!r.cudnn) GN_CUDNN_CHECK(cudnnCreate(&r.cudnn));
  return r.cudnn;
}

std::pair<void*, void*> ThreadResources::staging(size_t bytes) {
  if (bytes > staging_bytes_) {
    // Callers have waited for every copy that used the old buffers before asking again.
    for (void*& p : staging_) {
      if (p) GN_CUDA_CHECK(cudaFreeHost(p));
      p = nullptr;
    }
    staging_bytes_ = 0;
    size_t grown = (bytes + (1 << 20) - 1) & ~size_t((1 << 20) - 1);  // whole MiB: fewer regrowths
    for (void*& p : staging_) GN_CUDA_CHECK(cudaHostAlloc(&p, grown, cudaHostAllocPortable));
    staging_bytes_ = grown;
  }
  return {staging_[0], staging_[1]};
}

namespace {
thread_local std::unique_ptr<ThreadResources> tls_resources;
}

ThreadResources& thread_resources() {
  if (!tls_resources) tls_resources = std::make_unique<ThreadResources>();
  return *tls_resources;
}

void release_thread_resources() {
  tls_resources.reset();
}

// --- CudaStreamWorker --------------------------------------------------------------------------------------

void CudaStreamWorker::on_thread_start() {
  GN_CUDA_CHECK(cudaSetDevice(device().index));
  // Non-blocking: the stream must not serialize with the legacy default stream that other code may use.
  GN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  GN_CUDA_CHECK(cudaEventCreate(&ref_));
  GN_CUDA_CHECK(cudaEventCreate(&start_));
  GN_CUDA_CHECK(cudaEventCreate(&end_));
  anchor();
}

void CudaStreamWorker::anchor() {
  GN_CUDA_CHECK(cudaEventRecord(ref_, stream_));
  GN_CUDA_CHECK(cudaEventSynchronize(ref_));
  ref_host_us_ = profiler_ ? profiler_->now_us() : 0.0;
}

void CudaStreamWorker::on_thread_stop() {
  if (stream_) (void)cudaStreamSynchronize(stream_);
  // Every cuBLAS and cuDNN handle of this thread goes before the stream they were set to.
  release_thread_resources();
  for (cudaEvent_t* e : {&ref_, &start_, &end_}) {
    if (*e) (void)cudaEventDestroy(*e);
    *e = nullptr;
  }
  if (stream_) (void)cudaStreamDestroy(stream_);
  stream_ = nullptr;
  (void)cudaGetLastError();
}

std::pair<double, double> CudaStreamWorker::run_timed(const OpFn& fn, OpContext& ctx) {
  // Event times are floats in ms: re-anchor every few seconds (idle time included) so that offsets keep
  // sub-microsecond precision. The stream is idle here (the previous op was waited for): one short round
  // trip.
  if (profiler_ && profiler_->now_us() - ref_host_us_ > 4e6) anchor();
  GN_CUDA_CHECK(cudaEventRecord(start_, stream_));
  try {
    fn(ctx);
  } catch (...) {
    // Work the op already enqueued may still read or write its tensors, which the engine frees next.
    (void)cudaStreamSynchronize(stream_);
    (void)cudaGetLastError();
    throw;
  }
  GN_CUDA_CHECK(cudaEventRecord(end_, stream_));
  // The completion point: kernel faults surface here and become the op's error.
  GN_CUDA_CHECK(cudaEventSynchronize(end_));
  float start_ms = 0, end_ms = 0;
  GN_CUDA_CHECK(cudaEventElapsedTime(&start_ms, ref_, start_));
  GN_CUDA_CHECK(cudaEventElapsedTime(&end_ms, ref_, end_));
  return {ref_host_us_ + start_ms * 1000.0, ref_host_us_ + end_ms * 1000.0};
}

}  // namespace gn::cuda
