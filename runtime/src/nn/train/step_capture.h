// Captured training steps (trainer.h's StepCapture, backend.h's CapturedWork): after kCaptureWarmup ordinary
// steps one step is captured, and the later steps of its batch size replay it with their batch copied into
// its input tensors and their optimizer scalars into its scalars tensor. On a GPU the capture is a CUDA graph
// with the step's memory from a private pool; on a CPU the recorded op bodies, replayed as one engine op.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gpunodes/nn/data.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/optim.h"
#include "gpunodes/nn/trainer.h"

namespace gn::nn::trainer_parts {

// Why the steps of this run can never be captured, or empty when they can: more than one device, a
// distributed run, loss scaling (it reads the gradients' norm on the host every step), dropout (a new mask
// every step; recurrent layers' dropout too), a regression loss (a replay checks class labels), recurrent
// state carried from batch to batch (a replay would start from the captured state) or a batch that is a
// shard of a larger one.
std::string capture_obstacle(size_t devices, bool distributed, bool loss_scaling, bool regression,
                             bool carries_state, const Model& model, const HostBatch& batch);

class StepCapturer {
 public:
  // Captures on `device` (the only one of the run) when mode is On, or Auto and the device is a CUDA GPU.
  StepCapturer(Runtime& rt, StepCapture mode, Device device);

  // One step's code for replica 0: forward and backward on `inputs` with the loss gradient of a mean over
  // the batch, leaving the gradients in `grads`, and the optimizer update reading `scalars`. Returns the
  // number of classes (the logits' width).
  using StepBody =
      std::function<int64_t(const DeviceBatch& inputs, const Tensor& scalars, std::vector<Tensor>& grads)>;

  // Whether this step may be captured or replayed. `obstacle` is capture_obstacle()'s; when it is not empty
  // (and the mode would capture), capturing turns off for good and the reason goes to `warn` once.
  bool wanted(const std::string& obstacle, const WarningCallback& warn);
  // A captured step of this batch size exists: replay() it.
  bool can_replay(int64_t batch_size) const;
  // Nothing is captured yet and the warm-up steps have run: capture() now.
  bool ready_to_capture() const;
  // Counts a step that ran step by step (the warm-up).
  void count_uncaptured_step() { ++uncaptured_steps_; }

  // Captures the step on `batch` (which it then has trained on) after waiting for every earlier step, with
  // `scalars` this step's optimizer scalars on the device. The captured step writes the model's state,
  // `optimizer_state` (as the body leaves it) and `totals`. Returns false when the backend refused: the
  // model is as before, capturing is off and the reason went to `warn`. Rethrows an op's error.
  bool capture(const HostBatchPtr& batch, Model& model, const Tensor& scalars, const StepBody& body,
               const std::vector<OptimizerState>& optimizer_state, const Tensor& totals,
               const std::function<void()>& wait_for_earlier_steps, const WarningCallback& warn);
  // Enqueues a replay on `batch` at rate lr and update `step`; returns the var that its end writes. Throws
  // Error for a label that is no class, which a replay cannot report itself.
  VarPtr replay(const HostBatchPtr& batch, Model& model, const OptimizerOptions& optimizer, double lr,
                int64_t step);

  // "replaying <what>", "step by step: <why>", "replayed <what>" after release(), or "step by step".
  std::string status() const;
  // Steps that were replays, the captured one included.
  int64_t replayed_steps() const { return replayed_steps_; }
  // Drops the captured step (its activations, gradients and the optimizer state it works on) and starts the
  // warm-up afresh; a later step captures anew.
  void release() noexcept;

 private:
  struct Captured;
  Runtime& rt_;
  StepCapture mode_;
  Device device_;
  std::shared_ptr<Captured> captured_;
  std::string off_;       // why steps are not captured; empty while they may be
  std::string released_;  // what the last captured step was, once released
  int64_t uncaptured_steps_ = 0, replayed_steps_ = 0;
};

}  // namespace gn::nn::trainer_parts
