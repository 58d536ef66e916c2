// Tensor ops. Every op enqueues on the engine and returns at once, except the ones that read values back
// to the host (to_host, item) and blocking copies, which wait: the seed's point that printing costs a sync.
#pragma once
#include <cstdint>
#include <vector>

#include "gpunodes/backend.h"
#include "gpunodes/runtime.h"
#include "gpunodes/tensor.h"

namespace gn {

// Factories. The same seed gives the same values on every device.
Tensor full(Runtime& rt, const Shape& shape, Device device, float value);
Tensor zeros(Runtime& rt, const Shape& shape, Device device);
Tensor ones(Runtime& rt, const Shape& shape, Device device);
Tensor uniform(Runtime& rt, const Shape& shape, Device device, uint64_t seed, float lo = 0, float hi = 1);
Tensor normal(Runtime& rt, const Shape& shape, Device device, uint64_t seed, float mean = 0, float std = 1);
Tensor arange(Runtime& rt, int64_t n, Device device, float start = 0, float step = 1);
// `type` BFloat16 (CPU only) rounds each value to bfloat16: how a caller hands the layers bf16 activations.
Tensor from_values(Runtime& rt, const Shape& shape, Device device, std::vector<float> values,
                   DType type = DType::Float32);

// The seed's copyto: always new storage on `device`. Non-blocking copies run on the copy stream (through
// pinned staging for host<->GPU) and overlap compute. Blocking copies run after the source device's queued
// compute, as PyTorch's synchronous .to() does, and the host waits for them.
Tensor copy(const Tensor& t, Device device, bool non_blocking = false);
// The seed's as_in_ctx / .to(): the very same tensor when it is already on `device`, else copy().
Tensor to(const Tensor& t, Device device, bool non_blocking = false);

struct MatMulOptions {
  bool trans_a = false, trans_b = false;
  Precision precision = Precision::Fp32;
};
Tensor matmul(const Tensor& a, const Tensor& b, const MatMulOptions& options = {});
// The seed's run(x): `repeat` products, each a new tensor, returned as a batch.
std::vector<Tensor> matmul_repeat(const Tensor& a, const Tensor& b, int64_t repeat,
                                  const MatMulOptions& options = {});

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);  // same shape, same device
Tensor add(const Tensor& a, const Tensor& b);
// y += x, in place: y keeps its storage (a running total that a captured step accumulates into).
void add_into(const Tensor& y, const Tensor& x);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor exp(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor scale_shift(const Tensor& x, float scale, float shift);  // scale*x + shift
Tensor sum(const Tensor& x);              // shape [], on x's device
Tensor frobenius_norm(const Tensor& x);   // shape [], on x's device

// Blocking reads: wait for the tensor, copy it to the host, rethrow any error from the ops that made it.
std::vector<float> to_host(const Tensor& t);
float item(const Tensor& t);

// Throws DeviceMismatchError unless all tensors share one device.
void check_same_device(std::initializer_list<const Tensor*> tensors);

}  // namespace gn
