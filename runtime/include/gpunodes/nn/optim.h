// Optimizers and learning-rate schedules as PyTorch defines them: the host-side description that the Trainer
// and the Train node share, and the update ops. The update itself is one engine op per device
// (optimizer_step, at the end); the rates, the step counts and Adam's bias corrections are computed on the
// host, per step, so that every replica takes the very same step.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpunodes/runtime.h"
#include "gpunodes/tensor.h"

namespace gn::nn {

// --- optimizers ------------------------------------------------------------------------------------------
enum class OptimizerKind { Sgd, Adam, AdamW };
const char* optimizer_name(OptimizerKind kind);  // "sgd", "adam", "adamw"
// Throws Error for any other name.
OptimizerKind parse_optimizer(const std::string& name);

// The update of a parameter p with gradient g at step t = 1, 2, ..., elementwise, at learning rate lr (the
// schedule's rate for this step):
//
//   sgd (torch.optim.SGD):    d = g + weight_decay * p
//     with momentum m > 0:    buf = d at the buffer's first step, else buf = m * buf + (1 - dampening) * d
//                             d = nesterov ? d + m * buf : buf
//                             p = p - lr * d
//   adam (torch.optim.Adam):  g = g + weight_decay * p                       (L2, part of the gradient)
//                             exp_avg    = beta1 * exp_avg    + (1 - beta1) * g
//                             exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * g * g
//                             p = p - lr / (1 - beta1^t) * exp_avg / (sqrt(exp_avg_sq) / sqrt(1 - beta2^t) +
//                             eps)
//   adamw (torch.optim.AdamW): p = p * (1 - lr * weight_decay) first (decoupled decay), then adam's update
//                             without the L2 term.
//
// exp_avg and exp_avg_sq start at zero. Note PyTorch's AdamW defaults weight_decay to 0.01; here it is 0 for
// every kind unless set.
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::Sgd;
  double lr = 0.1;  // the base rate; a schedule scales it per step
  double weight_decay = 0;
  double momentum = 0;                            // sgd, 0 <= momentum < 1
  double dampening = 0;                           // sgd
  bool nesterov = false;                          // sgd; needs momentum > 0 and dampening 0, as PyTorch
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // adam, adamw; betas in [0, 1), eps > 0
  bool operator==(const OptimizerOptions&) const = default;
};
// Empty when the options are usable; otherwise one message per problem, each starting with the option's name
// ("nesterov: needs momentum above 0"), which is the Train node's param name too.
std::vector<std::string> optimizer_problems(const OptimizerOptions& o);
// For reports: "adam (lr 0.001, beta1 0.9, beta2 0.999, eps 1e-08, weight_decay 0)".
std::string describe(const OptimizerOptions& o);

// --- learning-rate schedules -----------------------------------------------------------------------------
enum class ScheduleKind { Constant, Step, Cosine, OneCycle };
const char* schedule_name(ScheduleKind kind);  // "constant", "step", "cosine", "onecycle"
ScheduleKind parse_schedule(const std::string& name);

// The rate of batch k (0-based, counted from the start of training) with base = the optimizer's lr,
// S = steps_per_epoch, E = epochs and W = warmup_epochs * S warmup steps:
//
//   warmup, k < W:  base * (1/W + (1 - 1/W) * k / W), a line from base/W towards base: torch's
//                   LinearLR(start_factor=1/W, end_factor=1, total_iters=W) stepped per batch.
//   after it, with e = (k - W) / S whole epochs since the warmup:
//   constant:  base
//   step:      base * gamma^(e / step_size) (integer division): StepLR(step_size, gamma), stepped per epoch.
//   cosine:    min_lr + (base - min_lr) * (1 + cos(pi * e / T)) / 2 with T = E - warmup_epochs: the closed
//              form of CosineAnnealingLR(T_max=T, eta_min=min_lr), stepped per epoch.
//   onecycle:  OneCycleLR(max_lr=base, total_steps=E*S, pct_start=0.3, anneal_strategy='cos',
//              div_factor=25, three_phase=False, cycle_momentum=False) stepped per batch: with
//              initial = base / 25, final = min_lr when min_lr > 0 (final_div_factor = initial / min_lr),
//              else initial / 1e4 (PyTorch's default final_div_factor), a = 0.3 * E*S - 1, b = E*S - 1 and
//              anneal(from, to, x) = to + (from - to) / 2 * (1 + cos(pi * x)):
//                k <= a: anneal(initial, base, k / a);  else anneal(base, final, (k - a) / (b - a)).
//              It warms up by itself, so it takes no warmup_epochs; momentum and Adam's beta1 are not
//              cycled.
//
// With a warmup, step and cosine equal torch's SequentialLR([LinearLR(...), StepLR or CosineAnnealingLR],
// milestones=[W]) stepped once per batch through the warmup and once per epoch after it.
struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::Constant;
  int64_t warmup_epochs = 0;
  int64_t step_size = 1;  // step: epochs between decays
  double gamma = 0.1;     // step: the decay factor
  double min_lr = 0;      // cosine: eta_min; onecycle: the final rate when above 0
  bool operator==(const ScheduleOptions&) const = default;
};
// Empty when usable with this base rate; otherwise one message per problem, named as in optimizer_problems.
std::vector<std::string> schedule_problems(const ScheduleOptions& s, double base_lr);
// The rate of batch `step` (0 <= step < epochs * steps_per_epoch; Error otherwise), as above.
double scheduled_lr(const ScheduleOptions& s, double base_lr, int64_t step, int64_t steps_per_epoch,
                    int64_t epochs);
// For reports: "cosine (warmup 1 epoch, min_lr 0)".
std::string describe(const ScheduleOptions& s);

// --- the update ops (optimizer_ops.cpp) ------------------------------------------------------------------
// What optimizer_step keeps per parameter, made on the parameter's device at its first step: sgd with
// momentum keeps its buffer in `a`; adam and adamw keep exp_avg in `a` and exp_avg_sq in `b`.
struct OptimizerState {
  Tensor a, b;
};
// One update (the formulas above) of every parameter, in place, as one engine op on their device (all
// on one device). lr is this step's rate (the schedule's, not necessarily o.lr); step counts the updates so
// far including this one (1, 2, ...) and gives Adam's bias corrections, computed on the host. `states` holds
// one entry per parameter; empty entries are filled here, and a state made now starts as PyTorch's does (a
// momentum buffer equal to its first d, Adam's averages at zero). `clip` is undefined or
// grad_clip_coefficient's result on the same device: every gradient is multiplied by its coefficient on the
// way in (the gradient tensors are left as they are).
void optimizer_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    std::vector<OptimizerState>& states, const OptimizerOptions& o, double lr, int64_t step,
                    const Tensor& clip = Tensor());
// The scalars of one update (the rate, Adam's bias corrections, ...) at rate lr and step `step`, as a small
// tensor on `device`: what optimizer_step's kernels read. A captured training step reads one such tensor,
// which the trainer rewrites before each replay (write_optimizer_scalars, same options).
Tensor optimizer_scalars(Runtime& rt, Device device, const OptimizerOptions& o, double lr, int64_t step);
void write_optimizer_scalars(const Tensor& dst, const OptimizerOptions& o, double lr, int64_t step);
// optimizer_step with the scalars already on the parameters' device.
void optimizer_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    std::vector<OptimizerState>& states, const OptimizerOptions& o, const Tensor& scalars,
                    const Tensor& clip = Tensor());
// torch.nn.utils.clip_grad_norm_(grads, max_norm)'s numbers, computed on the gradients' device with no host
// read: [2] {the total 2-norm over every gradient, min(1, max_norm / (norm + 1e-6))}. The sum of squares runs
// in double in a fixed order that the CPU and CUDA kernels share, so equal gradients give bit-equal results
// on every device. max_norm > 0.
Tensor grad_clip_coefficient(const std::vector<Tensor>& grads, float max_norm);

}  // namespace gn::nn
