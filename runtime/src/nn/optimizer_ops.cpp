// The optimizer ops: one update of a model's parameters as one engine op per device, the scalars that op
// reads (optim.h's formulas, computed on the host) and clip_grad_norm's coefficient. The kernels are in
// cpu_kernels.cpp and cuda/cuda_nn_kernels.cu.
#include <cmath>
#include <cstring>
#include <string>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/optim.h"
#include "kernels.h"
#include "op_helpers.h"

namespace gn::nn {
namespace {

// Rounds each scalar once from the double the host computed, as PyTorch hands its Python floats to float
// kernels.
OptimizerScalars step_scalars(const OptimizerOptions& o, double lr, int64_t step) {
  OptimizerScalars s;
  s.kind = o.kind;
  s.lr = static_cast<float>(lr);
  if (o.kind == OptimizerKind::Sgd) {
    s.weight_decay = static_cast<float>(o.weight_decay);
    s.momentum = static_cast<float>(o.momentum);
    s.keep = static_cast<float>(1.0 - o.dampening);
    s.nesterov = o.nesterov;
    return s;
  }
  const double t = static_cast<double>(step);
  s.weight_decay = o.kind == OptimizerKind::Adam ? static_cast<float>(o.weight_decay) : 0.0f;
  s.decay = o.kind == OptimizerKind::AdamW ? static_cast<float>(1.0 - lr * o.weight_decay) : 1.0f;
  s.beta1 = static_cast<float>(o.beta1);
  s.beta2 = static_cast<float>(o.beta2);
  s.one_minus_beta1 = static_cast<float>(1.0 - o.beta1);
  s.one_minus_beta2 = static_cast<float>(1.0 - o.beta2);
  s.eps = static_cast<float>(o.eps);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(o.beta1, t)));
  s.bias2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(o.beta2, t)));
  return s;
}

// The scalars as a tensor on `device`, for the kernels to read there.
Tensor scalars_tensor(Runtime& rt, Device device, const OptimizerScalars& s) {
  Tensor t(rt, {kOptimizerScalarFloats}, device);
  std::vector<float> bytes(kOptimizerScalarFloats, 0.0f);
  std::memcpy(bytes.data(), &s, sizeof s);
  write_values(t, std::move(bytes));
  return t;
}

void check_param_grad(const char* op, const Tensor& param, const Tensor& grad) {
  if (!param.defined() || !grad.defined())
    throw Error(std::string(op) + ": a parameter or gradient is undefined");
  check_same_device({&param, &grad});
  if (param.shape() != grad.shape())
    throw ShapeError(std::string(op) + ": parameter " + shape_str(param.shape()) + " and gradient " +
                     shape_str(grad.shape()) + " differ");
}

}  // namespace

namespace {
void check_step(const OptimizerOptions& o, double lr, int64_t step) {
  const char* name = optimizer_name(o.kind);
  if (const auto problems = optimizer_problems(o); !problems.empty())
    throw Error(std::string(name) + ": " + problems.front());
  if (!(lr >= 0 && std::isfinite(lr)))
    throw Error(std::string(name) + ": the step's learning rate must be 0 or more, got " +
                std::to_string(lr));
  if (step < 1) throw Error(std::string(name) + ": step counts from 1, got " + std::to_string(step));
}
}  // namespace

Tensor optimizer_scalars(Runtime& rt, Device device, const OptimizerOptions& o, double lr, int64_t step) {
  check_step(o, lr, step);
  return scalars_tensor(rt, device, step_scalars(o, lr, step));
}

void write_optimizer_scalars(const Tensor& dst, const OptimizerOptions& o, double lr, int64_t step) {
  check_step(o, lr, step);
  need_shape("optimizer scalars", "tensor", dst, {kOptimizerScalarFloats});
  const OptimizerScalars s = step_scalars(o, lr, step);
  std::vector<float> bytes(kOptimizerScalarFloats, 0.0f);
  std::memcpy(bytes.data(), &s, sizeof s);
  write_values(dst, std::move(bytes));
}

void optimizer_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    std::vector<OptimizerState>& states, const OptimizerOptions& o, double lr, int64_t step,
                    const Tensor& clip) {
  if (params.empty()) return;
  optimizer_step(params, grads, states, o,
                 optimizer_scalars(params.front().runtime(), params.front().device(), o, lr, step), clip);
}

void optimizer_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    std::vector<OptimizerState>& states, const OptimizerOptions& o, const Tensor& scalars,
                    const Tensor& clip) {
  const char* name = optimizer_name(o.kind);
  if (grads.size() != params.size() || states.size() != params.size())
    throw Error(std::string(name) + ": one gradient and one state per parameter expected, got " +
                std::to_string(params.size()) + " parameters, " + std::to_string(grads.size()) +
                " gradients and " + std::to_string(states.size()) + " states");
  if (params.empty()) return;
  if (const auto problems = optimizer_problems(o); !problems.empty())
    throw Error(std::string(name) + ": " + problems.front());
  check_same_device({&params.front(), &scalars});
  need_shape(name, "scalars", scalars, {kOptimizerScalarFloats});
  if (clip.defined()) {
    check_same_device({&params.front(), &clip});
    need_shape(name, "clip coefficient", clip, {2});
  }
  const bool adam = o.kind != OptimizerKind::Sgd;
  const bool need_a = adam || o.momentum != 0, need_b = adam;
  Runtime& rt = params.front().runtime();
  const Device device = params.front().device();
  std::vector<VarPtr> reads, writes;
  if (clip.defined()) reads.push_back(clip.var());
  std::vector<bool> fresh(params.size(), false);
  int64_t bytes = 0, count = 0;
  for (size_t i = 0; i < params.size(); ++i) {
    check_param_grad(name, params[i], grads[i]);
    check_same_device({&params.front(), &params[i]});
    OptimizerState& st = states[i];
    if (st.a.defined() != st.b.defined() && need_b)
      throw Error(std::string(name) + ": parameter " + std::to_string(i) + " has half an optimizer state");
    // Made here, unfilled: the kernel treats a fresh state as PyTorch's first step does, which saves a pass.
    if (need_a && !st.a.defined()) {
      st.a = Tensor(rt, params[i].shape(), device);
      if (need_b) st.b = Tensor(rt, params[i].shape(), device);
      fresh[i] = true;
    }
    for (Tensor* t : {&st.a, &st.b})
      if (t->defined()) {
        check_same_device({&params[i], t});
        need_shape(name, "optimizer state", *t, params[i].shape());
        writes.push_back(t->var());
      }
    reads.push_back(grads[i].var());
    writes.push_back(params[i].var());
    bytes += (3 + 2 * (int64_t{need_a} + int64_t{need_b})) * params[i].bytes();
    count += params[i].numel();
  }
  reads.push_back(scalars.var());
  const OptimizerKind kind = o.kind;
  std::vector<OptimizerState> state(states.begin(), states.end());
  push_kernel(rt, device, reads, writes, {name, "", bytes, (adam ? 12.0 : 5.0) * dbl(count)},
              [=](NnKernels& k, KernelContext& kc) {
                std::vector<OptimizerTensor> ts;
                ts.reserve(params.size());
                for (size_t i = 0; i < params.size(); ++i)
                  ts.push_back({params[i].numel(), params[i].data(), grads[i].data(),
                                state[i].a.defined() ? state[i].a.data() : nullptr,
                                state[i].b.defined() ? state[i].b.data() : nullptr, fresh[i]});
                k.optimizer_step(ts, kind, reinterpret_cast<const OptimizerScalars*>(scalars.data()),
                                 clip.defined() ? clip.data() : nullptr, kc);
              });
}

Tensor grad_clip_coefficient(const std::vector<Tensor>& grads, float max_norm) {
  if (grads.empty()) throw Error("clip_grad_norm: no gradients");
  if (!(max_norm > 0 && std::isfinite(max_norm)))
    throw Error("clip_grad_norm: max_norm must be above 0, got " + std::to_string(max_norm));
  std::vector<VarPtr> reads;
  int64_t bytes = 0, count = 0;
  for (const Tensor& g : grads) {
    if (!g.defined()) throw Error("clip_grad_norm: a gradient is undefined");
    check_same_device({&grads.front(), &g});
    reads.push_back(g.var());
    bytes += g.bytes();
    count += g.numel();
  }
  Tensor out(grads.front().runtime(), {2}, grads.front().device());
  push_kernel(out.runtime(), out.device(), reads, {out.var()},
              {"clip grad norm", "", bytes, 2.0 * dbl(count)}, [=](NnKernels& k, KernelContext& kc) {
                std::vector<GradSpan> spans;
                spans.reserve(grads.size());
                for (const Tensor& g : grads) spans.push_back({g.data(), g.numel()});
                k.grad_clip_coefficient(spans, max_norm, out.data(), kc);
              });
  return out;
}

}  // namespace gn::nn
