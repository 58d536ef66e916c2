// The host side of the optimizers: names, checks, reports, and the learning-rate schedules.
#include "gpunodes/nn/optim.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numbers>

#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

bool is_adam(OptimizerKind k) {
  return k == OptimizerKind::Adam || k == OptimizerKind::AdamW;
}

// OneCycleLR's 'cos' annealing from `from` (pct 0) to `to` (pct 1).
double cos_anneal(double from, double to, double pct) {
  return to + (from - to) / 2.0 * (std::cos(std::numbers::pi * pct) + 1.0);
}

}  // namespace

const char* optimizer_name(OptimizerKind kind) {
  switch (kind) {
    case OptimizerKind::Sgd:
      return "sgd";
    case OptimizerKind::Adam:
      return "adam";
    case OptimizerKind::AdamW:
      return "adamw";
  }
  throw Error("unknown optimizer " + std::to_string(static_cast<int>(kind)));
}

OptimizerKind parse_optimizer(const std::string& name) {
  for (OptimizerKind k : {OptimizerKind::Sgd, OptimizerKind::Adam, OptimizerKind::AdamW})
    if (name == optimizer_name(k)) return k;
  throw Error("optimizer: unknown optimizer \"" + name + "\" (sgd, adam or adamw)");
}

std::vector<std::string> optimizer_problems(const OptimizerOptions& o) {
  std::vector<std::string> out;
  // Written so that NaN fails every check.
  if (!(o.lr > 0 && std::isfinite(o.lr))) out.push_back("lr: must be above 0");
  if (!(o.weight_decay >= 0 && std::isfinite(o.weight_decay)))
    out.push_back("weight_decay: must be 0 or more");
  if (o.kind == OptimizerKind::Sgd) {
    if (!(o.momentum >= 0 && o.momentum < 1)) out.push_back("momentum: must be at least 0 and below 1");
    if (!(o.dampening >= 0 && o.dampening <= 1)) out.push_back("dampening: must be between 0 and 1");
    // PyTorch's rule: Nesterov momentum needs a momentum and no dampening.
    if (o.nesterov && !(o.momentum > 0)) out.push_back("nesterov: needs momentum above 0");
    if (o.nesterov && o.dampening != 0) out.push_back("nesterov: needs dampening 0");
  }
  if (is_adam(o.kind)) {
    if (!(o.beta1 >= 0 && o.beta1 < 1)) out.push_back("beta1: must be at least 0 and below 1");
    if (!(o.beta2 >= 0 && o.beta2 < 1)) out.push_back("beta2: must be at least 0 and below 1");
    if (!(o.eps > 0 && std::isfinite(o.eps))) out.push_back("eps: must be above 0");
  }
  return out;
}

std::string describe(const OptimizerOptions& o) {
  std::string s = std::string(optimizer_name(o.kind)) + " (lr " + num(o.lr);
  if (o.kind == OptimizerKind::Sgd) {
    s += ", momentum " + num(o.momentum);
    if (o.dampening != 0) s += ", dampening " + num(o.dampening);
    if (o.nesterov) s += ", nesterov";
  } else {
    s += ", beta1 " + num(o.beta1) + ", beta2 " + num(o.beta2) + ", eps " + num(o.eps);
  }
  return s + ", weight_decay " + num(o.weight_decay) + ")";
}

const char* schedule_name(ScheduleKind kind) {
  switch (kind) {
    case ScheduleKind::Constant:
      return "constant";
    case ScheduleKind::Step:
      return "step";
    case ScheduleKind::Cosine:
      return "cosine";
    case ScheduleKind::OneCycle:
      return "onecycle";
  }
  throw Error("unknown schedule " + std::to_string(static_cast<int>(kind)));
}

ScheduleKind parse_schedule(const std::string& name) {
  for (ScheduleKind k :
       {ScheduleKind::Constant, ScheduleKind::Step, ScheduleKind::Cosine, ScheduleKind::OneCycle})
    if (name == schedule_name(k)) return k;
  throw Error("schedule: unknown schedule \"" + name + "\" (constant, step, cosine or onecycle)");
}

std::vector<std::string> schedule_problems(const ScheduleOptions& s, double base_lr) {
  std::vector<std::string> out;
  if (s.warmup_epochs < 0) out.push_back("warmup_epochs: must be 0 or more");
  if (s.kind == ScheduleKind::OneCycle && s.warmup_epochs > 0)
    out.push_back("warmup_epochs: onecycle warms up by itself (its first 30% of steps); leave this at 0");
  if (s.step_size < 1) out.push_back("step_size: must be at least 1");
  if (!(s.gamma > 0 && std::isfinite(s.gamma))) out.push_back("gamma: must be above 0");
  if (!(s.min_lr >= 0 && std::isfinite(s.min_lr)))
    out.push_back("min_lr: must be 0 or more");
  else if ((s.kind == ScheduleKind::Cosine || s.kind == ScheduleKind::OneCycle) && !(s.min_lr < base_lr))
    out.push_back("min_lr: must be below lr");
  return out;
}

double scheduled_lr(const ScheduleOptions& s, double base_lr, int64_t step, int64_t steps_per_epoch,
                    int64_t epochs) {
  if (steps_per_epoch < 1 || epochs < 1 || step < 0 || step >= epochs * steps_per_epoch)
    throw Error("scheduled_lr: step " + std::to_string(step) + " is outside " + std::to_string(epochs) +
                " epochs of " + std::to_string(steps_per_epoch) + " steps");
  const int64_t warmup = std::max<int64_t>(s.warmup_epochs, 0) * steps_per_epoch;
  if (step < warmup && s.kind != ScheduleKind::OneCycle) {
    const double w = static_cast<double>(warmup);
    return base_lr * (1.0 / w + (1.0 - 1.0 / w) * static_cast<double>(step) / w);
  }
  const int64_t epoch = (step - warmup) / steps_per_epoch;  // whole epochs since the warmup
  switch (s.kind) {
    case ScheduleKind::Constant:
      return base_lr;
    case ScheduleKind::Step:
      return base_lr * std::pow(s.gamma, static_cast<double>(epoch / std::max<int64_t>(s.step_size, 1)));
    case ScheduleKind::Cosine: {
      const double t_max = static_cast<double>(epochs - s.warmup_epochs);
      return s.min_lr + (base_lr - s.min_lr) *
                            (1.0 + std::cos(std::numbers::pi * static_cast<double>(epoch) / t_max)) / 2.0;
    }
    case ScheduleKind::OneCycle: {
      const double total = static_cast<double>(epochs * steps_per_epoch), k = static_cast<double>(step);
      const double initial = base_lr / 25.0;
      const double final_lr = s.min_lr > 0 ? s.min_lr : initial / 1e4;
      const double a = 0.3 * total - 1.0, b = total - 1.0;  // the phases' last steps, as OneCycleLR's
      if (k <= a) return cos_anneal(initial, base_lr, k / a);
      return cos_anneal(base_lr, final_lr, (k - a) / (b - a));
    }
  }
  throw Error("unknown schedule " + std::to_string(static_cast<int>(s.kind)));
}

std::string describe(const ScheduleOptions& s) {
  std::string out = schedule_name(s.kind);
  std::vector<std::string> parts;
  if (s.warmup_epochs > 0)
    parts.push_back("warmup " + std::to_string(s.warmup_epochs) +
                    (s.warmup_epochs == 1 ? " epoch" : " epochs"));
  switch (s.kind) {
    case ScheduleKind::Constant:
      break;
    case ScheduleKind::Step:
      parts.push_back("step_size " + std::to_string(s.step_size));
      parts.push_back("gamma " + num(s.gamma));
      break;
    case ScheduleKind::Cosine:
      parts.push_back("min_lr " + num(s.min_lr));
      break;
    case ScheduleKind::OneCycle:
      parts.push_back("pct_start 0.3");
      parts.push_back(s.min_lr > 0 ? "final lr " + num(s.min_lr) : std::string("final_div_factor 1e4"));
      break;
  }
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : " (") + parts[i];
  return parts.empty() ? out : out + ")";
}

}  // namespace gn::nn
