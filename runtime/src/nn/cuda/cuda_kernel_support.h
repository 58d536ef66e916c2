// What the CUDA layer kernels (cuda_nn_kernels.cu, cuda_sequence_kernels.cu, ...) share: the op's stream
// with the thread's cuDNN and cuBLAS handles set to it, workspace from the caching allocator, launch sizes
// and strided copies. Included by .cu files only; everything is inline or in an anonymous namespace of the
// including file.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <string>

#include "../../cuda/cuda_check.h"
#include "../../cuda/cuda_worker.h"
#include "../kernels.h"
#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 65536;

inline int blocks_for(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

inline int to_int(int64_t v, const char* what) {
  if (v > INT_MAX || v < INT_MIN)
    throw ShapeError(std::string(what) + " exceeds 2^31-1, which cuDNN and cuBLAS take");
  return static_cast<int>(v);
}

// --- per-thread handles ------------------------------------------------------------------------------------

// cuDNN and cuBLAS handles must not be shared by threads that use them at once: each thread uses its own per
// device, the backend's (cuda_worker.h's ThreadResources), which a worker releases before it destroys its
// stream. A handle of the nn layer's own, released at thread exit, would outlive the stream it was set to.

// The op's stream and device. Outside a CUDA worker (a program calling the kernels directly) it uses the
// per-thread default stream and waits for it at the end.
class Stream {
 public:
  explicit Stream(const KernelContext& kc) {
    GN_CUDA_CHECK(cudaGetDevice(&previous_));
    device_ = kc.op.device.index;
    if (previous_ != device_) GN_CUDA_CHECK(cudaSetDevice(device_));
    if (kc.op.native_stream && kc.op.device.is_cuda()) {
      stream_ = static_cast<cudaStream_t>(kc.op.native_stream);
    } else {
      stream_ = cudaStreamPerThread;
      owned_ = true;
    }
    try {
      cuda::ThreadResources& r = cuda::thread_resources();
      cudnn_ = r.cudnn(device_);
      cublas_ = r.device(device_).cublas;
      GN_CUDNN_CHECK(cudnnSetStream(cudnn_, stream_));
      GN_CUBLAS_CHECK(cublasSetStream(cublas_, stream_));
    } catch (...) {
      // No destructor runs for a constructor that throws: put the thread's device back here.
      if (previous_ != device_) (void)cudaSetDevice(previous_);
      throw;
    }
  }
  ~Stream() {
    if (owned_) (void)cudaStreamSynchronize(stream_);
    if (previous_ != device_) (void)cudaSetDevice(previous_);
  }
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;
  cudaStream_t get() const { return stream_; }
  cudnnHandle_t cudnn() const { return cudnn_; }
  cublasHandle_t cublas() const { return cublas_; }
  int device() const { return device_; }
  void sync() { GN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

 private:
  int previous_ = 0, device_ = 0;
  cudaStream_t stream_ = nullptr;
  bool owned_ = false;
  cudnnHandle_t cudnn_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
};

// Whether `stream` is being captured into a CUDA graph (backend.h's capture): then nothing may wait for it,
// and what its work would read back only exists when the graph runs.
inline bool capturing(cudaStream_t stream) {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  GN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  return status != cudaStreamCaptureStatusNone;
}

// Workspace from the device's caching allocator, released after the stream has finished with it. While the
// stream is captured it comes from the graph's private pool, to which it returns at once: later work of the
// same graph may reuse it, in stream order, and nothing outside the graph can.
//
// The release outside a capture waits for the stream (a host round trip per workspace). Returning the block
// without waiting would be safe only if every later user of a compute-pool block ran on this stream, but a
// tensor's storage takes its pool from the tensor's stream kind, not from the stream of the op that first
// touches it: a copy-stream op, or the host, may be handed the block while this stream still uses it.
class Workspace {
 public:
  Workspace(Allocator& a, Stream& s, size_t bytes) : a_(a), s_(s), bytes_(bytes) {
    if (bytes_) ptr_ = a_.allocate(bytes_, StreamKind::Compute);
  }
  // Never throws: it also runs while an op's error unwinds. After a kernel fault every call returns the
  // fault (it is sticky), so the block is returned without waiting: the context runs nothing more, and the
  // fault is the op's error where the worker waits for the op's end event (cuda_worker.cpp).
  ~Workspace() {
    if (!ptr_) return;
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(s_.get(), &status) == cudaSuccess && status == cudaStreamCaptureStatusNone)
      (void)cudaStreamSynchronize(s_.get());
    a_.deallocate(ptr_);
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  void* get() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  Allocator& a_;
  Stream& s_;
  size_t bytes_;
  void* ptr_ = nullptr;
};

// Copies n rows of `row` floats between strided places on the device (row pitches dst_row and src_row).
inline void copy_rows(float* dst, int64_t dst_row, const float* src, int64_t src_row, int64_t n, int64_t row,
               cudaStream_t stream) {
  if (n == 0 || row == 0) return;
  const size_t f = sizeof(float);
  GN_CUDA_CHECK(cudaMemcpy2DAsync(dst, static_cast<size_t>(dst_row) * f, src,
                                  static_cast<size_t>(src_row) * f, static_cast<size_t>(row) * f,
                                  static_cast<size_t>(n), cudaMemcpyDeviceToDevice, stream));
}

}  // namespace
}  // namespace gn::nn
