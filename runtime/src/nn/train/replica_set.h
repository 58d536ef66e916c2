// The replicas of data-parallel training and the gradient buckets they reduce: one copy of the model per
// device, how each batch is divided among them (evenly, or in proportion to each device's measured speed),
// the loss totals each one accumulates, and the copies that keep them equal.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "../cuda_support.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/trainer.h"
#include "gpunodes/profiler.h"

namespace gn::nn::trainer_parts {

class ReplicaSet {
 public:
  // Replica 0 is `model` itself when it lives on devices[0], else a copy; the others are copies made now.
  // The devices are distinct and exist (the trainer checks).
  ReplicaSet(Model& model, std::vector<Device> devices);

  size_t size() const { return replicas_.size(); }
  Model& operator[](size_t r) const { return *replicas_[r]; }
  const std::vector<Device>& devices() const { return devices_; }
  // Whether any replica is on a CUDA device: host batches then go to pinned memory.
  bool any_cuda() const;

  // --- the split -----------------------------------------------------------------------------------------
  // Per-replica sample counts that sum to n, following the shares by largest remainders.
  std::vector<int64_t> split(int64_t n) const;
  const std::vector<double>& shares() const { return shares_; }
  // Normalises and sets the shares; Error unless one non-negative share per device with a positive sum.
  void set_shares(std::vector<double> shares);
  // Starts a speed measurement at the profiler's current span: rebalance() measures from here.
  void mark_balance(const Profiler& profiler);
  // Sets the shares in proportion to each device's samples since the mark over the time its compute stream
  // was busy since then, and marks again. Keeps the shares when a device measured nothing.
  void rebalance(const Profiler& profiler);

  // --- the totals ----------------------------------------------------------------------------------------
  // Replica r's [2] {loss sum, correct} on its device, accumulated by its steps in place (a captured step
  // adds into this very tensor).
  const Tensor& totals(size_t r) const { return totals_[r]; }
  void add_samples(size_t r, int64_t n) { samples_[r] += n; }
  // Target values of this process's batches that were padding (HostBatch::padded_targets), all replicas'.
  void add_padded(int64_t n) { padded_ += n; }
  // Samples trained on this process since the reset.
  int64_t samples() const;
  // This process's totals (a blocking read of every replica's).
  StepTotals local_totals() const;
  // Sets the totals in place: replica 0's to `start` (a resumed epoch's; zero by default), the others' to
  // zero.
  void reset_totals(const StepTotals& start = {});

  // --- keeping them equal --------------------------------------------------------------------------------
  // The model's state into replica 0 (when it is not the model itself).
  void pull_from_model();
  // Replica 0's parameters and buffers into the others.
  void copy_first_to_others();
  // Replica 0's buffers (BatchNorm's running statistics, the ones that count) into the others.
  void share_first_buffers();
  // Replica 0's state into the model, and its buffers into the other replicas: training's end.
  void push_to_model();
  // Drops every replica's kept activations and gradients (zero_grad(set_to_none=True)).
  void release_step_state();

 private:
  Model& model_;
  std::vector<Device> devices_;
  std::vector<Model*> replicas_;
  std::vector<std::unique_ptr<Model>> owned_;
  std::vector<double> shares_;
  std::vector<Tensor> totals_;
  std::vector<int64_t> samples_;
  int64_t padded_ = 0;  // add_padded
  size_t balance_span_ = 0;
  std::vector<int64_t> balance_samples_;
};

// Parameter indices reduced together, in backward order, as PyTorch DDP's reducer makes them: the last
// layers' gradients are ready first and are reduced while earlier layers still run backward.
class GradientBuckets {
 public:
  explicit GradientBuckets(Model& model);
  const std::vector<std::vector<size_t>>& buckets() const { return buckets_; }
  // Hands every bucket of grads[replica][parameter] to the reducer, which leaves each sum in every replica;
  // returns the bytes one replica handed over.
  int64_t allreduce(const std::vector<std::vector<Tensor>>& grads, GradientReducer& reducer) const;

 private:
  std::vector<std::vector<size_t>> buckets_;
};

}  // namespace gn::nn::trainer_parts
