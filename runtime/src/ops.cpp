#include "gpunodes/ops.h"

#include "cpu/bf16.h"
#include "gpunodes/errors.h"

namespace gn {
namespace {

// Enqueues `body` on the compute stream of `out`'s device: it reads `inputs` and writes `out`.
void push_compute(const Tensor& out, std::vector<VarPtr> reads, OpInfo info, OpFn body) {
  out.runtime().engine().push(std::move(body), std::move(reads), {out.var()}, out.device(),
                              StreamKind::Compute, std::move(info));
}

Tensor make_filled(Runtime& rt, const Shape& shape, Device device, const char* name,
                   std::function<void(Backend&, const Tensor&, OpContext&)> fill) {
  Tensor t(rt, shape, device);
  Backend* be = &rt.backend(device);
  push_compute(t, {}, {name, "", t.bytes(), 0}, [be, t, fill](OpContext& c) { fill(*be, t, c); });
  return t;
}

void check_same_shape(const char* op, const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape())
    throw ShapeError(std::string(op) + ": shapes " + shape_str(a.shape()) + " and " + shape_str(b.shape()) +
                     " differ");
}

const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add:
      return "add";
    case BinaryOp::Sub:
      return "sub";
    case BinaryOp::Mul:
      return "mul";
    case BinaryOp::Div:
      return "div";
  }
  return "binary";
}

Tensor unary_op(UnaryOp op, const char* name, const Tensor& x, float alpha, float beta) {
  Tensor y(x.runtime(), x.shape(), x.device());
  Backend* be = &x.runtime().backend(x.device());
  push_compute(y, {x.var()}, {name, "", 2 * x.bytes(), static_cast<double>(x.numel())},
               [be, op, x, y, alpha, beta](OpContext& c) {
                 be->unary(op, x.data(), y.data(), x.numel(), alpha, beta, c);
               });
  return y;
}

Tensor reduce_op(ReduceOp op, const char* name, const Tensor& x) {
  Tensor y(x.runtime(), {}, x.device());
  Backend* be = &x.runtime().backend(x.device());
  push_compute(y, {x.var()}, {name, "", x.bytes(), 2.0 * static_cast<double>(x.numel())},
               [be, op, x, y](OpContext& c) { be->reduce(op, x.data(), x.numel(), y.data(), c); });
  return y;
}

// The device whose backend performs a transfer: the GPU end if there is one, else the source.
Device transfer_owner(Device src, Device dst) {
  return src.is_cuda() || !dst.is_cuda() ? src : dst;
}

}  // namespace

void check_same_device(std::initializer_list<const Tensor*> tensors) {
  const Tensor* first = nullptr;
  for (const Tensor* t : tensors) {
    if (!t->defined()) throw Error("an input tensor is undefined");
    if (!first)
      first = t;
    else if (t->device() != first->device())
      throw DeviceMismatchError(first->device(), t->device());
  }
}

Tensor full(Runtime& rt, const Shape& shape, Device device, float value) {
  return make_filled(rt, shape, device, "fill", [value](Backend& be, const Tensor& t, OpContext& c) {
    be.fill(t.data(), t.numel(), value, c);
  });
}
Tensor zeros(Runtime& rt, const Shape& shape, Device device) {
  return full(rt, shape, device, 0.0f);
}
Tensor ones(Runtime& rt, const Shape& shape, Device device) {
  return full(rt, shape, device, 1.0f);
}

Tensor uniform(Runtime& rt, const Shape& shape, Device device, uint64_t seed, float lo, float hi) {
  return make_filled(rt, shape, device, "uniform", [=](Backend& be, const Tensor& t, OpContext& c) {
    be.random(t.data(), t.numel(), RandomKind::Uniform, seed, lo, hi, c);
  });
}

Tensor normal(Runtime& rt, const Shape& shape, Device device, uint64_t seed, float mean, float std) {
  return make_filled(rt, shape, device, "normal", [=](Backend& be, const Tensor& t, OpContext& c) {
    be.random(t.data(), t.numel(), RandomKind::Normal, seed, mean, std, c);
  });
}

Tensor arange(Runtime& rt, int64_t n, Device device, float start, float step) {
  return make_filled(rt, {n}, device, "arange", [=](Backend& be, const Tensor& t, OpContext& c) {
    be.arange(t.data(), t.numel(), start, step, c);
  });
}

Tensor from_values(Runtime& rt, const Shape& shape, Device device, std::vector<float> values, DType type) {
  if (checked_numel(shape) != static_cast<int64_t>(values.size()))
    throw ShapeError("from_values: shape " + shape_str(shape) + " needs " +
                     std::to_string(checked_numel(shape)) + " values, got " + std::to_string(values.size()));
  if (type == DType::BFloat16 && !device.is_cpu())
    throw Error("from_values: bfloat16 tensors are the CPU's, not " + device.str() + "'s");
  Tensor t(rt, shape, device, StreamKind::Compute, type);
  Backend* be = &rt.backend(device);
  // The values as the tensor stores them, made on the host: float32 as given, or each rounded to bfloat16.
  std::shared_ptr<void> host;
  if (type == DType::BFloat16) {
    auto halves = std::make_shared<std::vector<uint16_t>>(values.size());
    for (size_t i = 0; i < values.size(); ++i) (*halves)[i] = cpu::float_to_bf16(values[i]);
    host = std::shared_ptr<void>(halves, halves->data());
  } else {
    auto floats = std::make_shared<std::vector<float>>(std::move(values));
    host = std::shared_ptr<void>(floats, floats->data());
  }
  push_compute(t, {}, {"from_values", "", t.bytes(), 0}, [be, t, host](OpContext& c) {
    be->copy({t.raw(), t.device()}, {host.get(), Device::cpu()}, t.bytes(), false, c);
  });
  return t;
}

Tensor copy(const Tensor& src, Device device, bool non_blocking) {
  if (!src.defined()) throw Error("copy: the input tensor is undefined");
  Runtime& rt = src.runtime();
  Device owner = transfer_owner(src.device(), device);
  StreamKind stream = non_blocking ? StreamKind::Copy : StreamKind::Compute;
  Tensor out(rt, src.shape(), device, stream);
  Backend* be = &rt.backend(owner);
  OpInfo info{non_blocking ? "copy (non-blocking)" : "copy", "", src.bytes(), 0, !non_blocking};
  rt.engine().push(
      [be, src, out, non_blocking](OpContext& c) {
        be->copy({out.data(), out.device()}, {src.data(), src.device()}, src.bytes(), non_blocking, c);
      },
      {src.var()}, {out.var()}, owner, stream, std::move(info));
  if (!non_blocking) rt.engine().wait(out.var());
  return out;
}

Tensor to(const Tensor& t, Device device, bool non_blocking) {
  if (t.defined() && t.device() == device) return t;
  return copy(t, device, non_blocking);
}

Tensor matmul(const Tensor& a, const Tensor& b, const MatMulOptions& o) {
  check_same_device({&a, &b});
  if (a.shape().size() != 2 || b.shape().size() != 2)
    throw ShapeError("matmul needs 2-d tensors, got " + shape_str(a.shape()) + " and " +
                     shape_str(b.shape()));
  const int64_t m = o.trans_a ? a.shape()[1] : a.shape()[0];
  const int64_t k = o.trans_a ? a.shape()[0] : a.shape()[1];
  const int64_t kb = o.trans_b ? b.shape()[1] : b.shape()[0];
  const int64_t n = o.trans_b ? b.shape()[0] : b.shape()[1];
  if (k != kb)
    throw ShapeError("matmul: shapes " + shape_str(a.shape()) + (o.trans_a ? "^T" : "") + " and " +
                     shape_str(b.shape()) + (o.trans_b ? "^T" : "") + " cannot be multiplied (" +
                     std::to_string(k) + " != " + std::to_string(kb) + ")");
  check_precision(o.precision, a.device(), "matmul");
  // cuBLAS and CBLAS take int dimensions.
  if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX) throw ShapeError("matmul: dimensions exceed 2^31-1");
  Tensor c(a.runtime(), {m, n}, a.device());
  Backend* be = &a.runtime().backend(a.device());
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  GemmArgs args{o.trans_a, o.trans_b, m, n, k, nullptr, nullptr, nullptr, o.precision};
  push_compute(c, {a.var(), b.var()}, {"matmul", "", a.bytes() + b.bytes() + c.bytes(), flops},
               [be, a, b, c, args](OpContext& ctx) mutable {
                 args.a = a.data();
                 args.b = b.data();
                 args.c = c.data();
                 be->gemm(args, ctx);
               });
  return c;
}

std::vector<Tensor> matmul_repeat(const Tensor& a, const Tensor& b, int64_t repeat, const MatMulOptions& o) {
  if (repeat < 1) throw Error("matmul: repeat must be at least 1, got " + std::to_string(repeat));
  std::vector<Tensor> out;
  out.reserve(static_cast<size_t>(std::min<int64_t>(repeat, 1 << 20)));
  for (int64_t i = 0; i < repeat; ++i) out.push_back(matmul(a, b, o));
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  check_same_device({&a, &b});
  check_same_shape(binary_name(op), a, b);
  Tensor y(a.runtime(), a.shape(), a.device());
  Backend* be = &a.runtime().backend(a.device());
  push_compute(
      y, {a.var(), b.var()}, {binary_name(op), "", 3 * a.bytes(), static_cast<double>(a.numel())},
      [be, op, a, b, y](OpContext& c) { be->binary(op, a.data(), b.data(), y.data(), a.numel(), c); });
  return y;
}

Tensor add(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Add, a, b);
}

void add_into(const Tensor& y, const Tensor& x) {
  check_same_device({&y, &x});
  check_same_shape("add_into", y, x);
  Backend* be = &y.runtime().backend(y.device());
  push_compute(y, {x.var()}, {"add_into", "", 3 * y.bytes(), static_cast<double>(y.numel())},
               [be, y, x](OpContext& c) { be->binary(BinaryOp::Add, y.data(), x.data(), y.data(), y.numel(), c); });
}
Tensor sub(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Sub, a, b);
}
Tensor mul(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Mul, a, b);
}
Tensor div(const Tensor& a, const Tensor& b) {
  return binary(BinaryOp::Div, a, b);
}
Tensor exp(const Tensor& x) {
  return unary_op(UnaryOp::Exp, "exp", x, 0, 0);
}
Tensor relu(const Tensor& x) {
  return unary_op(UnaryOp::Relu, "relu", x, 0, 0);
}
Tensor scale_shift(const Tensor& x, float scale, float shift) {
  return unary_op(UnaryOp::ScaleShift, "scale_shift", x, scale, shift);
}
Tensor sum(const Tensor& x) {
  return reduce_op(ReduceOp::Sum, "sum", x);
}
Tensor frobenius_norm(const Tensor& x) {
  return reduce_op(ReduceOp::FrobeniusNorm, "norm", x);
}

std::vector<float> to_host(const Tensor& t) {
  if (!t.defined()) throw Error("to_host: the tensor is undefined");
  std::vector<float> out(static_cast<size_t>(t.numel()));
  // A bfloat16 tensor's values come over as stored and widen here (exactly: a bf16 value is a float's top half).
  const bool bf16 = t.dtype() == DType::BFloat16;
  std::vector<uint16_t> halves(bf16 ? out.size() : 0);
  Runtime& rt = t.runtime();
  Backend* be = &rt.backend(t.device());
  VarPtr done = new_var();
  void* dst = bf16 ? static_cast<void*>(halves.data()) : static_cast<void*>(out.data());
  rt.engine().push(
      [be, t, dst](OpContext& c) {
        be->copy({dst, Device::cpu()}, {t.raw(), t.device()}, t.bytes(), false, c);
      },
      {t.var()}, {done}, t.device(), StreamKind::Compute, {"read to host", "", t.bytes(), 0, true});
  rt.engine().wait(done);
  for (size_t i = 0; i < halves.size(); ++i) out[i] = cpu::bf16_to_float(halves[i]);
  return out;
}

float item(const Tensor& t) {
  if (t.numel() != 1) throw ShapeError("item() needs a tensor of one element, got " + shape_str(t.shape()));
  return to_host(t)[0];
}

}  // namespace gn
