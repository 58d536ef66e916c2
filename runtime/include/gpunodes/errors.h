// Typed runtime errors. Messages are written for the user: they say what and where.
#pragma once
#include <cstdint>
#include <stdexcept>
#include <string>

#include "gpunodes/device.h"

namespace gn {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct OutOfMemoryError : Error {
  OutOfMemoryError(Device device, int64_t requested, int64_t free, int64_t cached, int64_t limit);
  Device device;
  int64_t requested, free, cached, limit;
};

// Ops whose inputs sit on different devices. The text is PyTorch's, which the seeds quote.
struct DeviceMismatchError : Error {
  DeviceMismatchError(Device a, Device b);
};

struct ShapeError : Error {
  using Error::Error;
};

struct CancelledError : Error {
  CancelledError() : Error("cancelled") {}
};

// A CUDA, cuBLAS, cuDNN or NCCL call returned an error.
struct BackendError : Error {
  using Error::Error;
};

// A training step could not be captured for replay (a CUDA graph, or recorded ops): the caller runs it the
// ordinary way instead. The message says why.
struct CaptureError : Error {
  using Error::Error;
};

std::string format_bytes(int64_t bytes);

}  // namespace gn
