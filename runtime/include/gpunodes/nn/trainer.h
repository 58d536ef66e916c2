// Data-parallel training, as the seed's nn.DataParallel loop: each minibatch is split across the devices,
// every device runs forward and backward on its share at the same time (their ops are independent, so the
// engine overlaps them), the gradients are summed over the devices (NCCL on CUDA GPUs, a host reduction
// otherwise), and every replica takes the same optimizer step (SGD, Adam or AdamW at the schedule's rate,
// after an optional gradient-norm clip), so the replicas stay identical. Each replica keeps its own optimizer
// state on its device; the step count and the rates are the host's.
//
// BatchNorm: each replica normalises with the statistics of its own share of the batch, as DataParallel does
// (no synchronised BatchNorm), and the running statistics that count are device 0's: before evaluating and
// when training ends they are copied to the other replicas and to the model.
#pragma once
#include <atomic>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "gpunodes/dist/world.h"
#include "gpunodes/nn/data.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/optim.h"
#include "gpunodes/precision.h"

namespace gn::nn {

class GradientReducer;
namespace trainer_parts {  // the trainer's parts, in runtime/src/nn/train/
class ReplicaSet;
class GradientBuckets;
class LossScaler;
class StepCapturer;
class CheckpointStore;
class RankAgreement;
}  // namespace trainer_parts

// Checkpoints (checkpoint.h has the file format): what fit() saves, where, and whether it resumes.
struct CheckpointOptions {
  std::string dir;    // empty: no checkpoints. Created when missing; fit() refuses a dir it cannot write.
  int64_t every = 1;  // a checkpoint after every this many epochs and after the last; 0: only on cancel
  int64_t keep = 3;   // the newest this many are kept, older ones removed
  // Continue from the newest checkpoint in dir that reads back whole (unreadable ones are skipped with a
  // warning). It must have been written by a run with this model signature and these settings
  // (training_settings()); otherwise fit() throws an Error naming the first difference. With no checkpoint,
  // training starts afresh.
  bool resume = false;
};

// Dynamic loss scaling, as PyTorch's GradScaler: the loss gradient is multiplied by the scale, so that small
// gradients do not vanish when fp16 rounds them; after the all-reduce the host reads the gradients' 2-norm
// (one blocking read per step): an inf or NaN skips the whole step (no update, the step count unchanged) and
// multiplies the scale by `backoff`; after `interval` good steps in a row the scale is multiplied by
// `growth`. The optimizer sees the gradients divided by the scale again (exactly, for a power-of-two scale),
// and clip_grad_norm clips the unscaled norm.
enum class LossScaleMode { Auto, Dynamic, Off };       // Auto: Dynamic with fp16, Off otherwise
const char* loss_scale_mode_name(LossScaleMode mode);  // "auto", "dynamic", "off"
std::optional<LossScaleMode> parse_loss_scale_mode(std::string_view text);
struct LossScaleOptions {
  LossScaleMode mode = LossScaleMode::Auto;
  double init = 65536;  // PyTorch's init_scale, 2^16
  double growth = 2, backoff = 0.5;
  int64_t interval = 2000;
  bool enabled(Precision precision) const {
    return mode == LossScaleMode::Dynamic || (mode == LossScaleMode::Auto && precision == Precision::Fp16);
  }
};

// Captured steps (backend.h's CapturedWork): after kCaptureWarmup ordinary steps, one step is captured, and
// the later steps of that batch size replay it, with their batch written into the captured step's input
// tensors and their rate into its scalars. On a GPU the capture is a CUDA graph (a 28x28 ResNet-18 step is
// bound by kernel launches, and a graph launches them all at once); on a CPU the replay runs the recorded op
// bodies as one engine op. Only a single-device run without loss scaling (which reads the gradient norm on
// the host) and without dropout (a new mask every step) can be captured; otherwise, or when capturing fails,
// training goes on step by step and the reason goes to the warning callback once. Auto: on a CUDA device.
// On: also on a CPU. Off: never.
enum class StepCapture { Auto, On, Off };
const char* step_capture_name(StepCapture mode);  // "auto", "on", "off"
std::optional<StepCapture> parse_step_capture(std::string_view text);
constexpr int64_t kCaptureWarmup = 2;  // cuDNN's algorithm search, the caches and the optimizer state settle

// The training loss: softmax cross-entropy for classes and language models; MSELoss, L1Loss, HuberLoss for
// regression.
enum class LossKind { CrossEntropy, Mse, L1, Huber };
const char* loss_kind_name(LossKind kind);  // "cross_entropy", "mse", "l1", "huber"
std::optional<LossKind> parse_loss_kind(std::string_view text);
inline bool is_regression(LossKind kind) {
  return kind != LossKind::CrossEntropy;
}

struct TrainOptions {
  int64_t epochs = 10;
  int64_t batch_size = 256;  // the whole minibatch, split across the devices
  // SGD at lr 0.1, no momentum or weight decay: the seed's torch.optim.SGD(lr=0.1). See optim.h.
  OptimizerOptions optimizer;
  ScheduleOptions schedule;  // the rate per batch, from optimizer.lr; constant by default
  // torch.nn.utils.clip_grad_norm_ over every gradient after the all-reduce, before the step: the gradients
  // are scaled by min(1, max / (total 2-norm + 1e-6)). 0: off.
  double clip_grad_norm = 0;
  // What is minimised (PyTorch's losses, mean reduction): the softmax cross-entropy against class labels,
  // per step and averaged when the targets are sequences (a language model's); or a regression loss of the
  // outputs against target values (one output per target value).
  LossKind loss = LossKind::CrossEntropy;
  double huber_delta = 1;      // LossKind::Huber: HuberLoss(delta), above 0
  double label_smoothing = 0;  // of the training loss (CrossEntropyLoss(label_smoothing)), 0 <= e <= 1
  // The math of the linear layers' and convolutions' products (precision.h), in training and evaluation:
  // every device must allow it (check_precision), or the Trainer refuses to start.
  Precision precision = Precision::Fp32;
  LossScaleOptions loss_scale;
  StepCapture capture = StepCapture::Auto;
  uint64_t shuffle_seed = 0;
  int64_t resize = 0;      // images resized to resize x resize (the seed uses 96 for ResNet); 0: as stored
  int64_t log_every = 50;  // loss and train accuracy every N batches; 0: per epoch only
  int64_t eval_batch_size = 0;  // 0: batch_size
  // Split each batch in proportion to each device's measured samples per second (re-measured every epoch)
  // instead of evenly: for a GPU and a CPU together, the seed's exercise 2.
  bool balance = false;
  // Steps enqueued beyond the one running: one hides the host's enqueueing behind the devices' work, 0 waits
  // for every step. Memory is taken when an op runs, not when it is queued (architecture.md), so a step
  // still waiting in the queue holds no device memory yet.
  int64_t steps_in_flight = 1;
  CheckpointOptions checkpoint;
  // A distributed run (a world of more than one rank): the devices are (ranks x local devices), every rank
  // lists the same number of local devices, and batch_size is the global batch. Each rank reads its shard
  // of every batch (LoaderOptions::shards), the gradients are summed over every device of every rank, and
  // rank 0's initial parameters are broadcast. Null, or a world without MPI: this process alone. (A job of
  // one rank under mpirun takes the distributed path with nobody else.)
  dist::World* world = nullptr;
};

// One point of a live series. Series: "loss", "train_acc", "images_per_second" (every log_every batches, over
// the epoch so far), "lr" (the rate of the latest batch; also per epoch) and, with loss scaling, "loss_scale"
// (the scale for the next batch; also per epoch); per epoch also "test_acc",
// "epoch_seconds", and per device "memory_mb/<device>" and "peak_memory_mb/<device>" (allocated bytes), and
// "share/<device>" (its fraction of each batch).
struct MetricSample {
  std::string series;
  double epoch = 0;    // x axis: epochs done, fractional inside an epoch
  int64_t step = 0;    // batches done since fit() began
  double seconds = 0;  // since fit() began
  double value = 0;
};
// Called on the thread that runs fit(), between batches; it should return quickly.
using MetricCallback = std::function<void(const MetricSample&)>;

struct EpochResult {
  int64_t epoch = 0;
  double train_loss = 0, train_acc = 0;
  double test_acc = NAN;  // NaN without a test set, and for regression
  double seconds = 0;     // training time of the epoch, evaluation excluded (the seed's timer)
  double images_per_second = 0;
  // Whether the loader keeps up: its background thread's milliseconds to prepare a batch (read, resize,
  // augment, normalise), the epoch's milliseconds per step, and how long the training loop waited for
  // batches in the epoch. loader < step means the device never waits for data.
  double loader_ms_per_batch = 0, step_ms = 0, loader_wait_ms = 0;
  // The test split's mean loss per target value; for a language model (sequence targets) also exp of it,
  // d2l's perplexity; for regression the mean squared and absolute errors and R^2 (1 - SSE / SST, SST
  // about the test targets' mean). NaN where they do not apply.
  double test_loss = NAN, test_perplexity = NAN, test_mse = NAN, test_mae = NAN, test_r2 = NAN;
  double train_mse = NAN;  // regression: the training split's mean squared error (train_acc is then NaN)
};

// One rank's speed in a distributed run.
struct RankStats {
  int rank = 0;
  double images_per_second = 0;  // this rank's samples over the training time of the last epoch
  double allreduce_ms = 0;       // time its gradient all-reduce ops took over the whole fit()
  // Gradient bytes this rank handed to the all-reduce per step, against its parameters' bytes: 1 when
  // every gradient crosses once (one flat all-reduce per bucket).
  double allreduce_bytes_per_step = 0, parameter_bytes = 0;
};

struct TrainResult {
  std::vector<EpochResult> epochs;  // every epoch of the run, those before a resume included
  std::vector<RankStats> ranks;     // a distributed run's, by rank; empty otherwise
  std::string resumed_from;         // the checkpoint the run continued from; empty when it started afresh
  std::vector<std::string> checkpoints;  // the files written by this fit(), oldest first
};

// Called with a warning (a checkpoint skipped as unreadable, one not written at a cancel); should return
// quickly.
using WarningCallback = std::function<void(const std::string&)>;

// Loss and accuracy totals since the last reset. A sample holds values_per_sample targets (a sequence's
// steps; 1 otherwise), and the loss and accuracy are per target value.
struct StepTotals {
  double loss_sum = 0;
  double correct = 0;  // classes: correct predictions; regression: the sum of squared errors
  int64_t samples = 0;
  int64_t values_per_sample = 1;
  int64_t padded = 0;  // target values that were padding (Dataset::pad_target): in no loss, accuracy or count
  double values() const {
    return static_cast<double>(samples) * static_cast<double>(values_per_sample) - static_cast<double>(padded);
  }
  double loss() const { return samples ? loss_sum / values() : NAN; }
  double accuracy() const { return samples ? correct / values() : NAN; }
  double mse() const { return accuracy(); }  // regression: the mean of the squared errors
};

// What an evaluation measures (Trainer::evaluate_metrics); NaN where a measure does not apply.
struct EvalMetrics {
  int64_t samples = 0;
  double loss = NAN;        // mean per target value
  double accuracy = NAN;    // classes
  double perplexity = NAN;  // sequence targets: exp(loss)
  double mse = NAN, mae = NAN, r2 = NAN;  // regression
};

class Trainer {
 public:
  // The model is the master copy: replica 0 lives on devices[0] (the model itself when it is there), the
  // others are copies made now. Devices must be distinct and exist.
  Trainer(Model& model, std::vector<Device> devices, TrainOptions options = {});
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // Trains for options.epochs on `train`, evaluating on `test` (may be null) after each epoch, and leaves the
  // trained state in the model (gradients are released at the end, as zero_grad(set_to_none) does). Blocks;
  // call it from a thread of its own to keep a UI live. Throws CancelledError after cancel() or the engine's
  // cancel, once every op it enqueued has drained (its temporaries are freed then; the engine's cancel flag
  // is the caller's to reset; the optimizer state starts afresh then, since a dropped update may have left
  // it half-written). Its ops carry the calling thread's ScopedOpTag: a node that runs fit() on a thread of
  // its own sets its tag on that thread. The rate of each batch is the schedule's (optim.h), counted from the
  // start of this fit().
  //
  // With options.checkpoint.dir set it saves checkpoints (checkpoint.h) after epochs and when cancel() stops
  // it: cancel() then lets the steps in flight finish, saves, and throws CancelledError (the engine's cancel
  // drops those steps, so it stops without saving). With options.checkpoint.resume it first continues from
  // the newest checkpoint: the metric series before it are sent to on_metric again, so a plot shows the
  // whole run. A checkpoint is saved from replica 0 (the replicas are equal but for BatchNorm's running
  // statistics, where device 0's are the ones kept) and restored into every replica.
  TrainResult fit(const DatasetPtr& train, const DatasetPtr& test, const MetricCallback& on_metric = {},
                  const WarningCallback& on_warning = {});
  // What a checkpoint of this trainer must have been written with to resume from it, as (name, value)
  // pairs: the optimizer, the schedule, the batch size, the data order, the training split's size, ...
  // Names are the Train node's params where there is one.
  std::vector<std::pair<std::string, std::string>> training_settings(const Dataset& train) const;

  // One optimizer step on a host batch at the current lr(): split, forward and backward on each device,
  // all-reduce, clip, update. Enqueued; waits only when more than steps_in_flight steps are outstanding.
  void step(const HostBatchPtr& batch);
  // The rate the next step() takes: the optimizer's lr until set; fit() sets it per batch from the schedule.
  double lr() const { return lr_; }
  void set_lr(double lr);
  // Updates taken so far (Adam's t), over every fit() and step(); a step the loss scaler skipped is none.
  int64_t optimizer_steps() const { return optimizer_steps_; }
  // The loss scale the next step() multiplies the loss gradient by; 0 when loss scaling is off.
  double loss_scale() const;
  // Steps skipped because their gradients overflowed, over every fit() and step().
  int64_t skipped_steps() const;
  // How steps run: "replaying a CUDA graph of 412 nodes", "replaying 57 recorded ops", "step by step: <why>",
  // or "step by step" (not captured yet, or capture off); after fit(), which releases the captured step,
  // "replayed 57 recorded ops".
  std::string capture_status() const;
  // Steps that were replays of the captured step, over every fit() and step().
  int64_t replayed_steps() const;
  // The optimizer in use.
  const OptimizerOptions& optimizer() const { return options_.optimizer; }
  // Waits for every step enqueued so far; rethrows their errors.
  void synchronize();
  // Reads (a blocking read) the totals since the last reset, over all replicas.
  StepTotals totals();
  void reset_totals();

  // Copies replica 0's parameters and buffers to the other replicas (and from the model first, when the
  // model is not replica 0). fit() does this at its start.
  void broadcast();
  // The loss and the measures of the task (accuracy; perplexity for sequences; MSE, MAE and R^2 for
  // regression) on a dataset, with each batch split across the replicas (device 0's BatchNorm statistics).
  EvalMetrics evaluate_metrics(const DatasetPtr& data);
  // Accuracy on a dataset (evaluate_metrics().accuracy).
  double evaluate(const DatasetPtr& data);

  // Stops fit() at the next batch (the one in progress, or the next one to start); thread-safe.
  void cancel() { cancel_requested_ = true; }

  const std::vector<Device>& devices() const;
  Model& replica(size_t i);
  size_t replica_count() const;
  // How a batch of n is split: per-device sample counts that sum to n.
  std::vector<int64_t> split(int64_t n) const;
  const std::vector<double>& shares() const;
  // Sets the per-device fractions (normalised); fit() does this itself with options.balance.
  void set_shares(std::vector<double> shares);
  // "nccl", "host" or "none" (one device), with " + mpi (N ranks)" in a distributed run.
  std::string reducer_name() const { return reducer_name_; }
  // The world when launched by mpirun (World::mpi()), else null.
  dist::World* world() const { return world_; }

 private:
  // One fit() call's state and its steps (runtime/src/nn/train/fit.cpp).
  struct Fit;
  // A step without capture: replica r's forward and backward on its share, the all-reduce, the loss
  // scaler's check and every replica's update.
  void step_by_step(const HostBatchPtr& batch);
  // Replica r's forward and backward (the loss gradient scaled by `scale`), accumulating its loss and hits
  // into its totals and leaving its gradients in `grads`; returns the number of classes (the logits' width).
  int64_t forward_backward(size_t r, const Tensor& images, const Tensor& labels, float scale,
                           std::vector<Tensor>& grads);
  // Replica r's update with the step's scalars and clip factor (undefined: clip_grad_norm's, computed here).
  void update(size_t r, const std::vector<Tensor>& grads, const Tensor& scalars, Tensor clip);
  // Runs the step as a captured one when it can (a replay, or the capture itself, which trains on the
  // batch); false when it is to run step by step.
  bool try_captured_step(const HostBatchPtr& batch);
  // Drops what steps keep (in-flight markers, the captured step, activations and gradients).
  void release_step_state() noexcept;
  // After a cancel or an error: waits for every op enqueued so far, releases the step state and starts the
  // optimizer state afresh.
  void drain() noexcept;
  // Whether a collective (or an evaluation feeding one) should give up now: at a cancel, unless the ranks
  // are to agree on stopping first; always when the engine was cancelled.
  bool abandon_collectives() const;

  Runtime& rt_;
  Model& model_;
  TrainOptions options_;
  dist::World* world_ = nullptr;  // the MPI world of a distributed run; null for a process alone
  std::unique_ptr<trainer_parts::ReplicaSet> replicas_;
  std::unique_ptr<trainer_parts::GradientBuckets> buckets_;
  std::unique_ptr<GradientReducer> reducer_;  // null with one device in one process
  std::string reducer_name_;
  std::unique_ptr<trainer_parts::LossScaler> scaler_;
  std::unique_ptr<trainer_parts::StepCapturer> capture_;
  std::unique_ptr<trainer_parts::RankAgreement> ranks_;
  std::vector<std::vector<OptimizerState>> optim_state_;  // [replica][parameter], made at the first step
  int64_t optimizer_steps_ = 0;
  double lr_ = 0;
  // Targets per sample of the batches seen (a sequence's steps; 1 otherwise): what the totals divide by.
  int64_t values_per_sample_ = 1;
  bool carries_state_ = false;  // fit() on a sequential text: recurrent state carried across batches
  int64_t pad_target_ = -1;     // the current batch's padding label (HostBatch::pad_target); -1: none
  std::vector<std::vector<VarPtr>> in_flight_;  // per outstanding step: one marker per device
  // Written by every collective op, so that they run in the order they were enqueued, which is the same on
  // every rank: MPI and NCCL need every rank to call the same collectives in the same order.
  VarPtr collective_order_;
  std::atomic<bool> cancel_requested_{false};
  // fit()'s, in a distributed run with checkpoints: a cancel is acted on only where the ranks agree on it.
  bool agreed_stops_ = false;
  WarningCallback warn_;  // fit()'s, while it runs
};

// Accuracy of `model` on `data`, on the model's device, in Eval mode: the Evaluate node.
double evaluate(Model& model, const DatasetPtr& data, int64_t batch_size = 256, int64_t resize = 0);
// Trainer::evaluate_metrics for `model` on its device, with `loss` deciding the task.
EvalMetrics evaluate_metrics(Model& model, const DatasetPtr& data, LossKind loss, int64_t batch_size = 256);

}  // namespace gn::nn
