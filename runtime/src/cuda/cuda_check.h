// Error checks for CUDA, cuBLAS, cuDNN and NCCL calls: a failing call throws gn::BackendError naming the
// call, the place and the library's own message, so that the error reaches the op's outputs and the user.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <string>

#include "gpunodes/errors.h"

namespace gn::cuda {

[[noreturn]] inline void throw_backend_error(const char* call, const char* file, int line,
                                             const std::string& what) {
  // "cudaMemcpyAsync failed at cuda_backend.cu:123: out of memory"
  std::string name(call), where(file);
  if (auto slash = where.rfind('/'); slash != std::string::npos) where.erase(0, slash + 1);
  if (auto paren = name.find('('); paren != std::string::npos) name.resize(paren);
  throw BackendError(name + " failed at " + where + ":" + std::to_string(line) + ": " + what);
}

}  // namespace gn::cuda

#define GN_CUDA_CHECK(call)                                                                    \
  do {                                                                                         \
    cudaError_t gn_err_ = (call);                                                              \
    if (gn_err_ != cudaSuccess)                                                                \
      ::gn::cuda::throw_backend_error(#call, __FILE__, __LINE__, cudaGetErrorString(gn_err_)); \
  } while (0)

#define GN_CUBLAS_CHECK(call)                                                                    \
  do {                                                                                           \
    cublasStatus_t gn_st_ = (call);                                                              \
    if (gn_st_ != CUBLAS_STATUS_SUCCESS)                                                         \
      ::gn::cuda::throw_backend_error(#call, __FILE__, __LINE__, cublasGetStatusString(gn_st_)); \
  } while (0)

#define GN_CUDNN_CHECK(call)                                                                   \
  do {                                                                                         \
    cudnnStatus_t gn_st_ = (call);                                                             \
    if (gn_st_ != CUDNN_STATUS_SUCCESS)                                                        \
      ::gn::cuda::throw_backend_error(#call, __FILE__, __LINE__, cudnnGetErrorString(gn_st_)); \
  } while (0)

#define GN_NCCL_CHECK(call)                                                                   \
  do {                                                                                        \
    ncclResult_t gn_st_ = (call);                                                             \
    if (gn_st_ != ncclSuccess)                                                                \
      ::gn::cuda::throw_backend_error(#call, __FILE__, __LINE__, ncclGetErrorString(gn_st_)); \
  } while (0)

// After a kernel launch: launch-configuration errors surface here, not at the <<<>>> line.
#define GN_CUDA_CHECK_LAUNCH() GN_CUDA_CHECK(cudaGetLastError())
