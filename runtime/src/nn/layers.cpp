// The layer ops: argument checks, output allocation and one engine op each. The kernels are in
// cpu_kernels.cpp and cuda/cuda_nn_kernels.cu.
#include "gpunodes/nn/layers.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <string>

#include "gpunodes/errors.h"
#include "gpunodes/runtime.h"
#include "cpu_layout.h"
#include "kernels.h"
#include "op_helpers.h"

namespace gn::nn {
namespace {

thread_local Precision t_precision = Precision::Fp32;

void need_rank(const char* op, const char* what, const Tensor& t, size_t rank) {
  if (!t.defined()) throw Error(std::string(op) + ": " + what + " is undefined");
  if (t.shape().size() != rank)
    throw ShapeError(std::string(op) + ": " + what + " must have " + std::to_string(rank) +
                     " dimensions, got " + shape_str(t.shape()));
}

// The precision a product op enqueued now computes in: the thread's scope, refused at once where the device
// cannot compute in it.
Precision product_precision(const char* op, Device device) {
  const Precision p = t_precision;
  check_precision(p, device, op);
  return p;
}

// layout_block, its errors naming `op` (empty: none).
int64_t block_of(const std::string& op, Layout layout, Device device, int64_t channels) {
  if (layout == Layout::Nchw) return 1;
  const std::string who = op.empty() ? std::string() : op + ": ";
  if (!has_blocked_layout(device)) throw Error(who + device.str() + " has no blocked layout");
  if (device.is_cuda()) return channels;  // NHWC: one block of all the channels
  // The precision the op computes in: its convolutions want their own layout (NHWC for bf16 on AMX).
  const int64_t block = cpu_layout_block(t_precision, channels);
  if (channels % block != 0)
    throw ShapeError(who + "the blocked layout on " + device.str() + " needs a multiple of " +
                     std::to_string(block) + " channels, got " + std::to_string(channels));
  return block;
}

// How a layer stores an activation in `layout` on `device`: bfloat16 in the CPU's blocked layout under
// Precision::Bf16 (half the memory and half the traffic of the batch norms and additions between the
// convolutions, as torch.autocast's bf16 activations), float32 everywhere else.
DType stored_as(Layout layout, Device device) {
  return layout == Layout::Blocked && device.is_cpu() && t_precision == Precision::Bf16 ? DType::BFloat16
                                                                                         : DType::Float32;
}

// Throws unless `t` is stored as `want`: the tensors one kernel reads together share their type.
void need_dtype(const std::string& op, const char* what, const Tensor& t, DType want) {
  if (t.dtype() != want)
    throw Error(op + ": " + what + " holds " + dtype_name(t.dtype()) + ", the layer's other activations " +
                dtype_name(want));
}

// The channel block a tensor of `channels` channels in `layout` has on `device`: 1 for NCHW.
int64_t layout_block(const char* op, Layout layout, Device device, int64_t channels) {
  return block_of(op, layout, device, channels);
}

ConvShape conv_shape(const char* op, const Tensor& x, const Tensor& w, const Conv2dOptions& o, bool bias) {
  need_rank(op, "input", x, 4);
  need_rank(op, "weight", w, 4);
  if (o.stride < 1)
    throw Error(std::string(op) + ": stride must be at least 1, got " + std::to_string(o.stride));
  if (o.padding < 0) throw Error(std::string(op) + ": padding must not be negative");
  if (o.groups < 1)
    throw Error(std::string(op) + ": groups must be at least 1, got " + std::to_string(o.groups));
  ConvShape s{};
  s.n = x.shape()[0], s.c = x.shape()[1], s.h = x.shape()[2], s.w = x.shape()[3];
  s.k = w.shape()[0], s.r = w.shape()[2], s.s = w.shape()[3];
  s.stride = o.stride, s.pad = o.padding, s.groups = o.groups, s.bias = bias;
  if (s.c % s.groups != 0)
    throw ShapeError(std::string(op) + ": input channels " + std::to_string(s.c) +
                     " are not a multiple of groups " + std::to_string(s.groups));
  if (s.k % s.groups != 0)
    throw ShapeError(std::string(op) + ": output channels " + std::to_string(s.k) +
                     " are not a multiple of groups " + std::to_string(s.groups));
  if (w.shape()[1] * s.groups != s.c)
    throw ShapeError(std::string(op) + ": input " + shape_str(x.shape()) + " has " + std::to_string(s.c) +
                     " channels but the weight " + shape_str(w.shape()) + " with groups " +
                     std::to_string(s.groups) + " expects " + std::to_string(w.shape()[1] * s.groups));
  s.oh = (s.h + 2 * s.pad - s.r) / s.stride + 1;
  s.ow = (s.w + 2 * s.pad - s.s) / s.stride + 1;
  if (s.h + 2 * s.pad < s.r || s.w + 2 * s.pad < s.s || s.oh < 1 || s.ow < 1)
    throw ShapeError(std::string(op) + ": kernel " + std::to_string(s.r) + "x" + std::to_string(s.s) +
                     " does not fit the padded input " + shape_str(x.shape()));
  s.in_block = layout_block(op, o.input_layout, x.device(), s.c);
  s.out_block = layout_block(op, o.output_layout, x.device(), s.k);
  return s;
}

double conv_flops(const ConvShape& s) {
  return 2.0 * dbl(s.n) * dbl(s.k) * dbl(s.oh * s.ow) * dbl(s.c / s.groups * s.r * s.s);
}

// [N, C, H, W] normalises over (N, H, W) per channel; [N, C] (BatchNorm1d) over N per feature, which is the
// same computation with planes of one value.
BnShape bn_shape(const char* op, const Tensor& x, const BatchNormOptions& o) {
  if (!x.defined()) throw Error(std::string(op) + ": input is undefined");
  const Shape& sh = x.shape();
  if (sh.size() != 2 && sh.size() != 4)
    throw ShapeError(std::string(op) + ": input must be [N, C] or [N, C, H, W], got " + shape_str(sh));
  if (o.layout == Layout::Blocked && sh.size() != 4)
    throw ShapeError(std::string(op) + ": the blocked layout needs [N, C, H, W], got " + shape_str(sh));
  BnShape s{sh[0], sh[1], sh.size() == 4 ? sh[2] * sh[3] : 1};
  s.block = layout_block(op, o.layout, x.device(), s.c);
  s.relu = o.relu;
  s.eps = o.eps;
  return s;
}

PoolShape pool_shape(const char* op, const Tensor& x, const Pool2dOptions& o) {
  need_rank(op, "input", x, 4);
  if (o.kernel < 1 || o.stride < 1 || o.padding < 0 || o.padding * 2 > o.kernel)
    throw Error(std::string(op) + ": needs kernel >= 1, stride >= 1 and 0 <= padding <= kernel/2");
  PoolShape s{};
  s.n = x.shape()[0], s.c = x.shape()[1], s.h = x.shape()[2], s.w = x.shape()[3];
  s.kernel = o.kernel, s.stride = o.stride, s.pad = o.padding, s.kind = o.kind;
  if (s.h + 2 * s.pad < s.kernel || s.w + 2 * s.pad < s.kernel)
    throw ShapeError(std::string(op) + ": window " + std::to_string(o.kernel) + " does not fit " +
                     shape_str(x.shape()));
  s.oh = (s.h + 2 * s.pad - s.kernel) / s.stride + 1;
  s.ow = (s.w + 2 * s.pad - s.kernel) / s.stride + 1;
  return s;
}

}  // namespace

ScopedPrecision::ScopedPrecision(Precision precision) : previous_(t_precision) {
  t_precision = precision;
}
ScopedPrecision::~ScopedPrecision() {
  t_precision = previous_;
}
Precision current_precision() {
  return t_precision;
}

bool has_blocked_layout(Device device) {
  return device.is_cpu() || device.is_cuda();
}

int64_t layout_block(Layout layout, Device device, int64_t channels) {
  return block_of("", layout, device, channels);
}

NnKernels& nn_kernels(Device device) {
  if (device.is_cpu()) return cpu_nn_kernels();
  if (NnKernels* k = cuda_nn_kernels()) return *k;
  throw Error("no layer kernels for " + device.str() + ": the CUDA backend was not built");
}

// --- linear ------------------------------------------------------------------------------------------------

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_same_device({&x, &w});
  const bool has_bias = b.defined();
  if (has_bias) check_same_device({&x, &b});
  need_rank("linear", "input", x, 2);
  need_rank("linear", "weight", w, 2);
  const int64_t n = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  if (w.shape()[1] != in)
    throw ShapeError("linear: input " + shape_str(x.shape()) + " has " + std::to_string(in) +
                     " features but the weight " + shape_str(w.shape()) + " expects " +
                     std::to_string(w.shape()[1]));
  if (has_bias) need_shape("linear", "bias", b, {out});
  const Precision precision = product_precision("linear", x.device());
  Tensor y(x.runtime(), {n, out}, x.device());
  std::vector<VarPtr> reads{x.var(), w.var()};
  if (has_bias) reads.push_back(b.var());
  push_kernel(x.runtime(), x.device(), reads, {y.var()},
              {"linear", "", x.bytes() + w.bytes() + (has_bias ? b.bytes() : 0) + y.bytes(),
               2.0 * dbl(n) * dbl(in) * dbl(out)},
              [=](NnKernels& k, KernelContext& kc) {
                kc.precision = precision;
                k.linear_forward(n, in, out, x.data(), w.data(), has_bias ? b.data() : nullptr, y.data(), kc);
              });
  return y;
}

LinearGrads linear_backward(const Tensor& x, const Tensor& w, const Tensor& dy, bool need_dx, bool need_db) {
  check_same_device({&x, &w, &dy});
  need_rank("linear backward", "input", x, 2);
  need_rank("linear backward", "weight", w, 2);
  const int64_t n = x.shape()[0], in = x.shape()[1], out = w.shape()[0];
  need_shape("linear backward", "weight", w, {out, in});
  need_shape("linear backward", "output gradient", dy, {n, out});
  const Precision precision = product_precision("linear backward", x.device());
  Runtime& rt = x.runtime();
  LinearGrads g;
  g.dw = Tensor(rt, w.shape(), x.device());
  std::vector<VarPtr> writes{g.dw.var()};
  if (need_db) {
    g.db = Tensor(rt, {out}, x.device());
    writes.push_back(g.db.var());
  }
  if (need_dx) {
    g.dx = Tensor(rt, x.shape(), x.device());
    writes.push_back(g.dx.var());
  }
  const double flops = (need_dx ? 4.0 : 2.0) * dbl(n) * dbl(in) * dbl(out);
  Tensor dx = g.dx, dw = g.dw, db = g.db;
  push_kernel(rt, x.device(), {x.var(), w.var(), dy.var()}, writes,
              {"linear backward", "",
               x.bytes() + w.bytes() + 2 * dy.bytes() + dw.bytes() + (need_dx ? x.bytes() : 0), flops},
              [=](NnKernels& k, KernelContext& kc) {
                kc.precision = precision;
                k.linear_backward(n, in, out, x.data(), w.data(), dy.data(),
                                  dx.defined() ? dx.data() : nullptr, dw.data(),
                                  db.defined() ? db.data() : nullptr, kc);
              });
  return g;
}

// --- conv2d ------------------------------------------------------------------------------------------------

Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o) {
  check_same_device({&x, &w});
  const bool has_bias = b.defined();
  if (has_bias) check_same_device({&x, &b});
  ConvShape s = conv_shape("conv2d", x, w, o, has_bias);
  if (has_bias) need_shape("conv2d", "bias", b, {s.k});
  const Precision precision = product_precision("conv2d", x.device());
  s.in_type = x.dtype();
  s.out_type = stored_as(o.output_layout, x.device());
  Tensor y(x.runtime(), {s.n, s.k, s.oh, s.ow}, x.device(), StreamKind::Compute, s.out_type);
  std::vector<VarPtr> reads{x.var(), w.var()};
  if (has_bias) reads.push_back(b.var());
  push_kernel(x.runtime(), x.device(), reads, {y.var()},
              {"conv2d", "", x.bytes() + w.bytes() + y.bytes(), conv_flops(s)},
              [=](NnKernels& k, KernelContext& kc) {
                kc.precision = precision;
                k.conv2d_forward(s, x.raw(), w.data(), has_bias ? b.data() : nullptr, y.raw(), kc);
              });
  return y;
}

Conv2dGrads conv2d_backward(const Tensor& x, const Tensor& w, const Tensor& dy, const Conv2dOptions& o,
                            bool need_dx, bool need_db) {
  check_same_device({&x, &w, &dy});
  ConvShape s = conv_shape("conv2d backward", x, w, o, need_db);
  need_shape("conv2d backward", "output gradient", dy, {s.n, s.k, s.oh, s.ow});
  const Precision precision = product_precision("conv2d backward", x.device());
  s.in_type = x.dtype();
  s.out_type = dy.dtype();
  Runtime& rt = x.runtime();
  Conv2dGrads g;
  g.dw = Tensor(rt, w.shape(), x.device());
  std::vector<VarPtr> writes{g.dw.var()};
  if (need_db) {
    g.db = Tensor(rt, {s.k}, x.device());
    writes.push_back(g.db.var());
  }
  if (need_dx) {
    g.dx = Tensor(rt, x.shape(), x.device(), StreamKind::Compute, x.dtype());
    writes.push_back(g.dx.var());
  }
  Tensor dx = g.dx, dw = g.dw, db = g.db;
  push_kernel(
      rt, x.device(), {x.var(), w.var(), dy.var()}, writes,
      {"conv2d backward", "", x.bytes() + w.bytes() + 2 * dy.bytes() + dw.bytes() + (need_dx ? x.bytes() : 0),
       (need_dx ? 2.0 : 1.0) * conv_flops(s)},
      [=](NnKernels& k, KernelContext& kc) {
        kc.precision = precision;
        k.conv2d_backward(s, x.raw(), w.data(), dy.raw(), dx.defined() ? dx.raw() : nullptr, dw.data(),
                          db.defined() ? db.data() : nullptr, kc);
      });
  return g;
}

// --- batchnorm2d -------------------------------------------------------------------------------------------

BatchNormResult batchnorm2d(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            const Tensor& running_mean, const Tensor& running_var, const BatchNormOptions& o,
                            const Tensor& residual) {
  check_same_device({&x, &gamma, &beta, &running_mean, &running_var});
  BnShape s = bn_shape("batchnorm2d", x, o);
  s.type = x.dtype();
  const int64_t c = s.c;
  const bool has_residual = residual.defined();
  if (has_residual) {
    check_same_device({&x, &residual});
    need_shape("batchnorm2d", "residual", residual, x.shape());
    need_dtype("batchnorm2d", "the residual", residual, s.type);
  }
  for (const Tensor* t : {&gamma, &beta, &running_mean, &running_var})
    need_shape("batchnorm2d", "a parameter", *t, {c});
  if (o.training && s.n * s.hw < 2)
    throw ShapeError("batchnorm2d: training needs more than one value per channel, got input " +
                     shape_str(x.shape()));
  Runtime& rt = x.runtime();
  BatchNormResult r;
  r.y = Tensor(rt, x.shape(), x.device(), StreamKind::Compute, s.type);
  std::vector<VarPtr> reads{x.var(), gamma.var(), beta.var()};
  if (has_residual) reads.push_back(residual.var());
  std::vector<VarPtr> writes{r.y.var()};
  if (o.training) {
    r.save_mean = Tensor(rt, {c}, x.device());
    r.save_invstd = Tensor(rt, {c}, x.device());
    writes.insert(writes.end(),
                  {r.save_mean.var(), r.save_invstd.var(), running_mean.var(), running_var.var()});
  } else {
    reads.insert(reads.end(), {running_mean.var(), running_var.var()});
  }
  Tensor y = r.y, sm = r.save_mean, si = r.save_invstd;
  const bool training = o.training;
  const float momentum = o.momentum, eps = o.eps;
  push_kernel(rt, x.device(), reads, writes,
              {training ? "batchnorm2d" : "batchnorm2d (eval)", "",
               (training ? 3 : 2) * x.bytes() + (has_residual ? x.bytes() : 0), 5.0 * dbl(x.numel())},
              [=](NnKernels& k, KernelContext& kc) {
                k.batchnorm_forward(s, x.raw(), gamma.data(), beta.data(), running_mean.data(),
                                    running_var.data(), has_residual ? residual.raw() : nullptr, y.raw(),
                                    training ? sm.data() : nullptr, training ? si.data() : nullptr, training,
                                    momentum, eps, kc);
              });
  return r;
}

BatchNormGrads batchnorm2d_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                    const Tensor& save_mean, const Tensor& save_invstd,
                                    const BatchNormOptions& o, const Tensor& y, bool need_dresidual) {
  check_same_device({&x, &dy, &gamma, &save_mean, &save_invstd});
  BnShape s = bn_shape("batchnorm2d backward", x, o);
  s.type = x.dtype();
  need_shape("batchnorm2d backward", "output gradient", dy, x.shape());
  need_dtype("batchnorm2d backward", "the output gradient", dy, s.type);
  if (o.relu) {
    need_shape("batchnorm2d backward", "output (which the fused ReLU's gradient needs)", y, x.shape());
    check_same_device({&x, &y});
    need_dtype("batchnorm2d backward", "the output", y, s.type);
  }
  const int64_t c = s.c;
  for (const Tensor* t : {&gamma, &save_mean, &save_invstd})
    need_shape("batchnorm2d backward", "a parameter", *t, {c});
  Runtime& rt = x.runtime();
  BatchNormGrads g{Tensor(rt, x.shape(), x.device(), StreamKind::Compute, s.type), Tensor(rt, {c}, x.device()),
                   Tensor(rt, {c}, x.device())};
  std::vector<VarPtr> reads{x.var(), dy.var(), gamma.var(), save_mean.var(), save_invstd.var()};
  if (o.relu) reads.push_back(y.var());
  std::vector<VarPtr> writes{g.dx.var(), g.dgamma.var(), g.dbeta.var()};
  if (need_dresidual) {
    g.dresidual = Tensor(rt, x.shape(), x.device(), StreamKind::Compute, s.type);
    writes.push_back(g.dresidual.var());
  }
  Tensor dx = g.dx, dg = g.dgamma, dbt = g.dbeta, dres = g.dresidual;
  const Tensor out = o.relu ? y : Tensor();
  push_kernel(rt, x.device(), reads, writes,
              {"batchnorm2d backward", "", (o.relu ? 4 : 3) * x.bytes() + (need_dresidual ? x.bytes() : 0),
               8.0 * dbl(x.numel())},
              [=](NnKernels& k, KernelContext& kc) {
                k.batchnorm_backward(s, x.raw(), out.defined() ? out.raw() : nullptr, dy.raw(), gamma.data(),
                                     save_mean.data(), save_invstd.data(), dx.raw(),
                                     dres.defined() ? dres.raw() : nullptr, dg.data(), dbt.data(), kc);
              });
  return g;
}

// --- activations -------------------------------------------------------------------------------------------

const char* activation_name(Activation kind) {
  switch (kind) {
    case Activation::Relu:
      return "ReLU";
    case Activation::Sigmoid:
      return "Sigmoid";
    case Activation::Tanh:
      return "Tanh";
    case Activation::Gelu:
      return "GELU";
  }
  throw Error("unknown activation " + std::to_string(static_cast<int>(kind)));
}

namespace {
// The profiler's names, lower case like every other op's.
std::string activation_op_name(Activation kind) {
  std::string name = activation_name(kind);
  std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
  return name;
}
}  // namespace

Tensor activation(Activation kind, const Tensor& x) {
  if (!x.defined()) throw Error("activation: the input is undefined");
  const std::string name = activation_op_name(kind);
  Tensor y(x.runtime(), x.shape(), x.device(), StreamKind::Compute, x.dtype());
  push_kernel(x.runtime(), x.device(), {x.var()}, {y.var()}, {name, "", 2 * x.bytes(), dbl(x.numel())},
              [=](NnKernels& k, KernelContext& kc) {
                k.activation_forward(kind, x.dtype(), x.raw(), y.raw(), x.numel(), kc);
              });
  return y;
}

Tensor activation_backward(Activation kind, const Tensor& x, const Tensor& y, const Tensor& dy) {
  const std::string name = activation_op_name(kind) + " backward";
  // GELU's derivative is a function of its input; the others' are functions of their output.
  const bool from_input = kind == Activation::Gelu;
  const Tensor& value = from_input ? x : y;
  if (!value.defined())
    throw Error(name + ": needs the layer's " + (from_input ? "input x" : "output y") +
                ", which is undefined");
  if (!dy.defined()) throw Error(name + ": the output gradient is undefined");
  check_same_device({&value, &dy});
  if (value.shape() != dy.shape())
    throw ShapeError(name + ": " + (from_input ? "input " : "output ") + shape_str(value.shape()) +
                     " and the output gradient " + shape_str(dy.shape()) + " differ");
  need_dtype(name, "the output gradient", dy, value.dtype());
  Tensor dx(dy.runtime(), dy.shape(), dy.device(), StreamKind::Compute, dy.dtype());
  push_kernel(dy.runtime(), dy.device(), {value.var(), dy.var()}, {dx.var()},
              {name, "", 3 * dy.bytes(), 2.0 * dbl(dy.numel())}, [=](NnKernels& k, KernelContext& kc) {
                const void* v = value.raw();
                k.activation_backward(kind, dy.dtype(), from_input ? v : nullptr, from_input ? nullptr : v,
                                      dy.raw(), dx.raw(), dy.numel(), kc);
              });
  return dx;
}

// --- dropout -----------------------------------------------------------------------------------------------

DropoutResult dropout(const Tensor& x, float p, uint64_t seed) {
  if (!x.defined()) throw Error("dropout: the input is undefined");
  if (!(p >= 0.0f && p < 1.0f))
    throw Error("dropout: probability p must satisfy 0 <= p < 1, got " + std::to_string(p));
  Runtime& rt = x.runtime();
  DropoutResult r{Tensor(rt, x.shape(), x.device()), Tensor(rt, x.shape(), x.device())};
  Tensor y = r.y, mask = r.mask;
  push_kernel(rt, x.device(), {x.var()}, {y.var(), mask.var()},
              {"dropout", "", 3 * x.bytes(), dbl(x.numel())}, [=](NnKernels& k, KernelContext& kc) {
                k.dropout_forward(x.numel(), x.data(), y.data(), mask.data(), p, seed, kc);
              });
  return r;
}

Tensor dropout_backward(const Tensor& dy, const Tensor& mask) {
  check_same_device({&dy, &mask});
  need_shape("dropout backward", "mask", mask, dy.shape());
  // dx = dy * mask is the backend's element-wise product, under this op's name.
  Runtime& rt = dy.runtime();
  Tensor dx(rt, dy.shape(), dy.device());
  Backend* be = &rt.backend(dy.device());
  rt.engine().push(
      [be, dy, mask, dx](OpContext& c) {
        be->binary(BinaryOp::Mul, dy.data(), mask.data(), dx.data(), dx.numel(), c);
      },
      {dy.var(), mask.var()}, {dx.var()}, dy.device(), StreamKind::Compute,
      {"dropout backward", "", 3 * dy.bytes(), dbl(dy.numel())});
  return dx;
}

// --- channel concat ----------------------------------------------------------------------------------------

Tensor concat_channels(const Tensor& a, const Tensor& b) {
  check_same_device({&a, &b});
  const Shape &sa = a.shape(), &sb = b.shape();
  if (sa.size() < 2 || sa.size() != sb.size() || sa[0] != sb[0] ||
      !std::equal(sa.begin() + 2, sa.end(), sb.begin() + 2))
    throw ShapeError(
        "concat_channels: needs [N, Ca, ...] and [N, Cb, ...] with equal N and trailing dims, got " +
        shape_str(sa) + " and " + shape_str(sb));
  const int64_t n = sa[0];
  // Each sample of a (and of b) is one contiguous row of channels x trailing values.
  const int64_t a_row = n ? a.numel() / n : 0, b_row = n ? b.numel() / n : 0;
  Shape sy = sa;
  sy[1] = sa[1] + sb[1];
  Tensor y(a.runtime(), sy, a.device());
  push_kernel(a.runtime(), a.device(), {a.var(), b.var()}, {y.var()},
              {"concat channels", "", 2 * y.bytes(), 0}, [=](NnKernels& k, KernelContext& kc) {
                k.concat_rows(n, a_row, b_row, a.data(), b.data(), y.data(), kc);
              });
  return y;
}

std::pair<Tensor, Tensor> split_channels(const Tensor& dy, int64_t a_channels) {
  if (!dy.defined()) throw Error("split_channels: the input is undefined");
  const Shape& sy = dy.shape();
  if (sy.size() < 2)
    throw ShapeError("split_channels: needs [N, C, ...] with a channel axis, got " + shape_str(sy));
  if (a_channels < 0 || a_channels > sy[1])
    throw ShapeError("split_channels: cannot take " + std::to_string(a_channels) + " channels from " +
                     shape_str(sy));
  Shape sa = sy, sb = sy;
  sa[1] = a_channels;
  sb[1] = sy[1] - a_channels;
  Runtime& rt = dy.runtime();
  std::pair<Tensor, Tensor> out{Tensor(rt, sa, dy.device()), Tensor(rt, sb, dy.device())};
  const int64_t n = sy[0];
  const int64_t a_row = n ? out.first.numel() / n : 0, b_row = n ? out.second.numel() / n : 0;
  Tensor da = out.first, db = out.second;
  push_kernel(rt, dy.device(), {dy.var()}, {da.var(), db.var()}, {"split channels", "", 2 * dy.bytes(), 0},
              [=](NnKernels& k, KernelContext& kc) {
                k.split_rows(n, a_row, b_row, dy.data(), da.data(), db.data(), kc);
              });
  return out;
}

// --- pooling -----------------------------------------------------------------------------------------------

Tensor pool2d(const Tensor& x, const Pool2dOptions& o) {
  if (!x.defined()) throw Error("pool2d: the input is undefined");
  PoolShape s = pool_shape("pool2d", x, o);
  Tensor y(x.runtime(), {s.n, s.c, s.oh, s.ow}, x.device());
  push_kernel(x.runtime(), x.device(), {x.var()}, {y.var()},
              {o.kind == PoolKind::Max ? "max pool" : "avg pool", "", x.bytes() + y.bytes(),
               dbl(y.numel()) * dbl(s.kernel * s.kernel)},
              [=](NnKernels& k, KernelContext& kc) { k.pool_forward(s, x.data(), y.data(), kc); });
  return y;
}

Tensor pool2d_backward(const Tensor& x, const Tensor& y, const Tensor& dy, const Pool2dOptions& o) {
  check_same_device({&x, &y, &dy});
  PoolShape s = pool_shape("pool2d backward", x, o);
  need_shape("pool2d backward", "output", y, {s.n, s.c, s.oh, s.ow});
  need_shape("pool2d backward", "output gradient", dy, y.shape());
  Tensor dx(x.runtime(), x.shape(), x.device());
  push_kernel(x.runtime(), x.device(), {x.var(), y.var(), dy.var()}, {dx.var()},
              {o.kind == PoolKind::Max ? "max pool backward" : "avg pool backward", "",
               2 * x.bytes() + 2 * y.bytes(), dbl(y.numel()) * dbl(s.kernel * s.kernel)},
              [=](NnKernels& k, KernelContext& kc) {
                k.pool_backward(s, x.data(), y.data(), dy.data(), dx.data(), kc);
              });
  return dx;
}

Tensor global_avg_pool(const Tensor& x, Layout layout) {
  need_rank("global_avg_pool", "input", x, 4);
  const int64_t planes = x.shape()[0] * x.shape()[1], hw = x.shape()[2] * x.shape()[3];
  const int64_t block = layout_block("global_avg_pool", layout, x.device(), x.shape()[1]);
  if (hw < 1) throw ShapeError("global_avg_pool: empty planes in " + shape_str(x.shape()));
  Tensor y(x.runtime(), {x.shape()[0], x.shape()[1], 1, 1}, x.device());
  push_kernel(x.runtime(), x.device(), {x.var()}, {y.var()},
              {"global avg pool", "", x.bytes() + y.bytes(), dbl(x.numel())},
              [=](NnKernels& k, KernelContext& kc) {
                k.global_avg_pool_forward(planes, hw, block, x.dtype(), x.raw(), y.data(), kc);
              });
  return y;
}

Tensor global_avg_pool_backward(const Tensor& dy, const Shape& x_shape, Layout layout) {
  if (x_shape.size() != 4) throw ShapeError("global_avg_pool backward: input shape must have 4 dimensions");
  need_shape("global_avg_pool backward", "output gradient", dy, {x_shape[0], x_shape[1], 1, 1});
  const int64_t planes = x_shape[0] * x_shape[1], hw = x_shape[2] * x_shape[3];
  const int64_t block = layout_block("global_avg_pool backward", layout, dy.device(), x_shape[1]);
  // dx is stored as the forward's input was: as the layout stores activations under this precision.
  const DType type = stored_as(layout, dy.device());
  Tensor dx(dy.runtime(), x_shape, dy.device(), StreamKind::Compute, type);
  push_kernel(dy.runtime(), dy.device(), {dy.var()}, {dx.var()},
              {"global avg pool backward", "", dy.bytes() + dx.bytes(), dbl(dx.numel())},
              [=](NnKernels& k, KernelContext& kc) {
                k.global_avg_pool_backward(planes, hw, block, type, dy.data(), dx.raw(), kc);
              });
  return dx;
}

// --- the sum of two activations (or gradients) stored alike ------------------------------------------------

Tensor add_activations(const Tensor& a, const Tensor& b) {
  if (!a.defined() || !b.defined()) throw Error("add: an input is undefined");
  if (a.dtype() == DType::Float32 && b.dtype() == DType::Float32) return add(a, b);
  check_same_device({&a, &b});
  need_shape("add", "the second input", b, a.shape());
  need_dtype("add", "the second input", b, a.dtype());
  Tensor y(a.runtime(), a.shape(), a.device(), StreamKind::Compute, a.dtype());
  push_kernel(a.runtime(), a.device(), {a.var(), b.var()}, {y.var()}, {"add", "", 3 * a.bytes(), dbl(a.numel())},
              [=](NnKernels& k, KernelContext& kc) { k.add_bf16(a.numel(), a.raw(), b.raw(), y.raw(), kc); });
  return y;
}

// --- shape -------------------------------------------------------------------------------------------------

Tensor reshape(const Tensor& x, const Shape& shape) {
  if (!x.defined()) throw Error("reshape: the input is undefined");
  if (checked_numel(shape) != x.numel())
    throw ShapeError("reshape: cannot view " + shape_str(x.shape()) + " as " + shape_str(shape));
  Tensor y(x.runtime(), shape, x.device());
  copy_into(y, x);
  return y;
}

Tensor flatten(const Tensor& x) {
  if (!x.defined() || x.shape().empty()) throw ShapeError("flatten: needs a tensor with a batch dimension");
  const int64_t n = x.shape()[0];
  return reshape(x, {n, n ? x.numel() / n : 0});
}

// --- loss --------------------------------------------------------------------------------------------------

CrossEntropy softmax_cross_entropy(const Tensor& logits, const Tensor& labels, bool want_grad,
                                   float grad_scale, float label_smoothing, int64_t ignore_index) {
  check_same_device({&logits, &labels});
  if (!logits.defined() || logits.shape().size() < 2)
    throw ShapeError("softmax_cross_entropy: logits must be [N, classes] or [N, T, classes], got " +
                     (logits.defined() ? shape_str(logits.shape()) : std::string("nothing")));
  // Every position of the leading axes is a row: a language model's [N, T, vocab] against [N, T] labels.
  const int64_t classes = logits.shape().back();
  const Shape rows(logits.shape().begin(), logits.shape().end() - 1);
  need_shape("softmax_cross_entropy", "labels", labels, rows);
  const int64_t n = classes > 0 ? logits.numel() / classes : 0;
  if (n < 1 || classes < 1)
    throw ShapeError("softmax_cross_entropy: empty logits " + shape_str(logits.shape()));
  if (!(label_smoothing >= 0.0f && label_smoothing <= 1.0f))
    throw Error("softmax_cross_entropy: label_smoothing must be between 0 and 1, got " +
                std::to_string(label_smoothing));
  Runtime& rt = logits.runtime();
  CrossEntropy r;
  r.loss = Tensor(rt, {}, logits.device());
  r.stats = Tensor(rt, {2}, logits.device());
  std::vector<VarPtr> writes{r.loss.var(), r.stats.var()};
  if (want_grad) {
    r.dlogits = Tensor(rt, logits.shape(), logits.device());
    writes.push_back(r.dlogits.var());
  }
  if (ignore_index < -1 || ignore_index >= classes)
    throw Error("softmax_cross_entropy: ignore_index " + std::to_string(ignore_index) + " is not -1 (none) or a class in [0, " +
                std::to_string(classes) + ")");
  Tensor loss = r.loss, stats = r.stats, dl = r.dlogits;
  push_kernel(rt, logits.device(), {logits.var(), labels.var()}, writes,
              {"softmax cross-entropy", "", (want_grad ? 2 : 1) * logits.bytes() + labels.bytes(),
               4.0 * dbl(logits.numel())},
              [=](NnKernels& k, KernelContext& kc) {
                k.softmax_cross_entropy(n, classes, logits.data(), labels.data(), loss.data(), stats.data(),
                                        dl.defined() ? dl.data() : nullptr, grad_scale, label_smoothing,
                                        ignore_index, kc);
              });
  return r;
}

// --- helpers -----------------------------------------------------------------------------------------------

void copy_into(const Tensor& dst, const Tensor& src) {
  if (!dst.defined() || !src.defined()) throw Error("copy_into: a tensor is undefined");
  if (dst.numel() != src.numel())
    throw ShapeError("copy_into: " + shape_str(src.shape()) + " does not fit " + shape_str(dst.shape()));
  if (dst.is_same(src)) return;
  Runtime& rt = dst.runtime();
  // The GPU end drives a transfer; between CPU devices the source does (as gn::copy).
  const Device owner = src.device().is_cuda() || !dst.device().is_cuda() ? src.device() : dst.device();
  Backend* be = &rt.backend(owner);
  rt.engine().push(
      [be, dst, src](OpContext& c) {
        be->copy({dst.data(), dst.device()}, {src.data(), src.device()}, src.bytes(), false, c);
      },
      {src.var()}, {dst.var()}, owner, StreamKind::Compute, {"copy", "", src.bytes(), 0});
}

void write_values(const Tensor& dst, std::vector<float> values) {
  if (!dst.defined()) throw Error("write_values: the tensor is undefined");
  if (static_cast<int64_t>(values.size()) != dst.numel())
    throw ShapeError("write_values: " + std::to_string(values.size()) + " values for " +
                     shape_str(dst.shape()));
  Runtime& rt = dst.runtime();
  Backend* be = &rt.backend(dst.device());
  auto host = std::make_shared<std::vector<float>>(std::move(values));
  rt.engine().push(
      [be, dst, host](OpContext& c) {
        be->copy({dst.data(), dst.device()}, {host->data(), Device::cpu()}, dst.bytes(), false, c);
      },
      {}, {dst.var()}, dst.device(), StreamKind::Compute, {"write values", "", dst.bytes(), 0});
}

}  // namespace gn::nn
