// Dynamic loss scaling, PyTorch's GradScaler (trainer.h's LossScaleOptions has the algorithm): the scale the
// loss gradient is multiplied by, the host's check of the summed gradients after the all-reduce, and the
// factor that unscales and clips them together in the optimizer.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "gpunodes/nn/trainer.h"
#include "gpunodes/runtime.h"

namespace gn::nn::trainer_parts {

class LossScaler {
 public:
  // Scaling is on when options.enabled(precision), starting at options.init; the options are usable
  // (problems() is empty).
  LossScaler(Runtime& rt, const LossScaleOptions& options, Precision precision);
  // One message per unusable option, named as the Train node's params; empty when all are usable.
  static std::vector<std::string> problems(const LossScaleOptions& options);

  bool enabled() const { return scale_ > 0; }
  // The scale the next step multiplies its loss gradient by; 0 when scaling is off.
  double scale() const { return scale_; }
  // What the loss gradient is multiplied by: the scale, or 1 when scaling is off.
  double gradient_factor() const { return enabled() ? scale_ : 1.0; }
  // Steps skipped because their gradients overflowed.
  int64_t skipped_steps() const { return skipped_steps_; }

  // After the all-reduce, with `summed` the summed gradients (replica 0's copy; every replica and rank holds
  // the same): reads their norm (one blocking read) and updates the scale. Returns false when they overflowed
  // (the step is to be skipped); otherwise sets clip[r] to a [2] {norm, factor} tensor on devices[r], where
  // factor unscales and applies clip_grad_norm (0: off) together, for optimizer_step's `clip`.
  bool unscale(const std::vector<Tensor>& summed, double clip_grad_norm, const std::vector<Device>& devices,
               std::vector<Tensor>& clip);

  // What a checkpoint keeps of the scaler, and puts back.
  struct State {
    double scale = 0;
    int64_t good_steps = 0, skipped_steps = 0;
  };
  State state() const { return {scale_, good_steps_, skipped_steps_}; }
  void restore(const State& state);

 private:
  Runtime& rt_;
  LossScaleOptions options_;
  double scale_ = 0;  // 0: off
  int64_t good_steps_ = 0, skipped_steps_ = 0;
};

}  // namespace gn::nn::trainer_parts
