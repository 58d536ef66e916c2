// What the tensor ops of the nn layer (layers.cpp, optimizer_ops.cpp) share: enqueueing a kernel call on a
// device's compute stream and the argument checks every op makes.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "gpunodes/errors.h"
#include "gpunodes/runtime.h"
#include "kernels.h"

namespace gn::nn {

// Runs `body(kernels, kc)` on `device`'s compute stream: it reads `reads` and writes `writes`. `kernels` is
// that device's kernel set (NnKernels, SequenceKernels, ...).
template <class Kernels, class Body>
void push_with(Runtime& rt, Device device, Kernels* kernels, std::vector<VarPtr> reads, std::vector<VarPtr> writes,
               OpInfo info, Body body) {
  Allocator* alloc = &rt.allocator(device);
  rt.engine().push(
      [kernels, alloc, body = std::move(body)](OpContext& ctx) {
        KernelContext kc{ctx, *alloc};
        body(*kernels, kc);
      },
      std::move(reads), std::move(writes), device, StreamKind::Compute, std::move(info));
}

// Runs `body(kernels, kc)` on the compute stream of `like`'s device with that device's kernel set, as
// `kernels_of` hands it out (sequence_kernels, attention_kernels, ...): an op that writes on its input's device.
template <class Kernels, class Body>
void push_like(const Tensor& like, Kernels& (*kernels_of)(Device), std::vector<VarPtr> reads,
               std::vector<VarPtr> writes, OpInfo info, Body body) {
  const Device d = like.device();
  push_with(like.runtime(), d, &kernels_of(d), std::move(reads), std::move(writes), std::move(info), std::move(body));
}

// Runs `body` with the layer kernels (NnKernels) of `device` on its compute stream.
template <class Body>
void push_kernel(Runtime& rt, Device device, std::vector<VarPtr> reads, std::vector<VarPtr> writes,
                 OpInfo info, Body body) {
  push_with(rt, device, &nn_kernels(device), std::move(reads), std::move(writes), std::move(info),
            std::move(body));
}

// Throws, naming the op and the argument, unless `t` is defined and has exactly `shape`.
inline void need_shape(const char* op, const char* what, const Tensor& t, const Shape& shape) {
  if (!t.defined()) throw Error(std::string(op) + ": " + what + " is undefined");
  if (t.shape() != shape)
    throw ShapeError(std::string(op) + ": " + what + " must be " + shape_str(shape) + ", got " +
                     shape_str(t.shape()));
}

// For the ops' flop and byte counts.
inline double dbl(int64_t v) {
  return static_cast<double>(v);
}

}  // namespace gn::nn
