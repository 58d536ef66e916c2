// The data-parallel trainer: its construction from the parts (runtime/src/nn/train/), one training step, and
// evaluation. fit()'s epoch loop is in train/fit.cpp.
#include "gpunodes/nn/trainer.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "cuda_support.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/sequence_layers.h"
#include "train/host_reducer.h"
#include "train/loss_scaler.h"
#include "train/rank_agreement.h"
#include "train/replica_set.h"
#include "train/step_capture.h"
#include "train/training_checkpoints.h"

namespace gn::nn {

namespace {

struct LossName {
  LossKind kind;
  const char* name;
};
constexpr LossName kLossNames[] = {
    {LossKind::CrossEntropy, "cross_entropy"}, {LossKind::Mse, "mse"}, {LossKind::L1, "l1"}, {LossKind::Huber, "huber"}};

RegressionLoss regression_kind(LossKind kind) {
  return kind == LossKind::Mse ? RegressionLoss::Mse : kind == LossKind::L1 ? RegressionLoss::L1 : RegressionLoss::Huber;
}

// What one loss call gives the trainer: the stats it adds to the totals and the output's gradient.
struct LossStep {
  Tensor stats, doutput;
};

// The loss of `output` against `labels` (targets), its gradient scaled by `scale` per target value; labels
// equal to pad_target (>= 0) are padding, which the cross-entropy leaves out.
LossStep training_loss(const TrainOptions& o, const Tensor& output, const Tensor& labels, bool want_grad, float scale,
                       int64_t pad_target) {
  if (o.loss == LossKind::CrossEntropy) {
    CrossEntropy ce =
        softmax_cross_entropy(output, labels, want_grad, scale, static_cast<float>(o.label_smoothing), pad_target);
    return {ce.stats, ce.dlogits};
  }
  RegressionLossResult r =
      regression_loss(regression_kind(o.loss), output, labels, want_grad, scale, static_cast<float>(o.huber_delta));
  return {r.stats, r.dpred};
}

}  // namespace

const char* loss_kind_name(LossKind kind) {
  for (const LossName& l : kLossNames)
    if (l.kind == kind) return l.name;
  return "?";
}

std::optional<LossKind> parse_loss_kind(std::string_view text) {
  for (const LossName& l : kLossNames)
    if (text == l.name) return l.kind;
  return std::nullopt;
}

Trainer::Trainer(Model& model, std::vector<Device> devices, TrainOptions options)
    : rt_(model.runtime()), model_(model), options_(std::move(options)) {
  if (devices.empty()) throw Error("training needs at least one device");
  std::set<Device> seen;
  for (Device d : devices) {
    if (!rt_.has(d)) throw Error("cannot train on " + d.str() + ": no such device");
    if (!seen.insert(d).second) throw Error("device " + d.str() + " is listed twice for training");
  }
  if (options_.batch_size < 1) throw Error("training: batch size must be at least 1");
  if (options_.epochs < 0) throw Error("training: epochs must not be negative");
  std::vector<std::string> problems = optimizer_problems(options_.optimizer);
  for (std::string& p : schedule_problems(options_.schedule, options_.optimizer.lr))
    problems.push_back(std::move(p));
  if (!(options_.clip_grad_norm >= 0 && std::isfinite(options_.clip_grad_norm)))
    problems.push_back("clip_grad_norm: must be 0 (off) or more");
  if (!(options_.label_smoothing >= 0 && options_.label_smoothing <= 1))
    problems.push_back("label_smoothing: must be between 0 and 1");
  if (options_.label_smoothing > 0 && options_.loss != LossKind::CrossEntropy)
    problems.push_back("label_smoothing: only the cross_entropy loss smooths labels, the loss is " +
                       std::string(loss_kind_name(options_.loss)));
  if (!(options_.huber_delta > 0 && std::isfinite(options_.huber_delta)))
    problems.push_back("huber_delta: must be above 0");
  for (std::string& p : trainer_parts::LossScaler::problems(options_.loss_scale))
    problems.push_back(std::move(p));
  if (!problems.empty()) {
    std::string all = "training: " + problems.front();
    for (size_t i = 1; i < problems.size(); ++i) all += "; " + problems[i];
    throw Error(all);
  }
  for (Device d : devices) check_precision(options_.precision, d, "training");
  lr_ = options_.optimizer.lr;
  if (options_.steps_in_flight < 0) options_.steps_in_flight = 0;
  if (options_.world && options_.world->mpi()) world_ = options_.world;
  collective_order_ = new_var();

  const Device first = devices.front();
  replicas_ = std::make_unique<trainer_parts::ReplicaSet>(model_, std::move(devices));
  for (size_t r = 0; r < replicas_->size(); ++r)
    optim_state_.emplace_back((*replicas_)[r].parameters().size());
  buckets_ = std::make_unique<trainer_parts::GradientBuckets>(model_);
  trainer_parts::ChosenReducer chosen =
      trainer_parts::choose_reducer(rt_, replicas_->devices(), world_, collective_order_);
  reducer_ = std::move(chosen.reducer);
  reducer_name_ = std::move(chosen.name);
  scaler_ = std::make_unique<trainer_parts::LossScaler>(rt_, options_.loss_scale, options_.precision);
  capture_ = std::make_unique<trainer_parts::StepCapturer>(rt_, options_.capture, first);
  ranks_ = std::make_unique<trainer_parts::RankAgreement>(world_, [this] { return abandon_collectives(); });
}

// Queued ops hold their tensors themselves (a replay holds its captured work, which holds every storage the
// step uses: CapturedWork::hold), so nothing here needs to wait for them.
Trainer::~Trainer() {
  release_step_state();
}

// --- what the parts answer ---------------------------------------------------------------------------------

double Trainer::loss_scale() const {
  return scaler_->scale();
}
int64_t Trainer::skipped_steps() const {
  return scaler_->skipped_steps();
}
std::string Trainer::capture_status() const {
  return capture_->status();
}
int64_t Trainer::replayed_steps() const {
  return capture_->replayed_steps();
}
const std::vector<Device>& Trainer::devices() const {
  return replicas_->devices();
}
Model& Trainer::replica(size_t i) {
  return (*replicas_)[i];
}
size_t Trainer::replica_count() const {
  return replicas_->size();
}
std::vector<int64_t> Trainer::split(int64_t n) const {
  return replicas_->split(n);
}
const std::vector<double>& Trainer::shares() const {
  return replicas_->shares();
}
void Trainer::set_shares(std::vector<double> shares) {
  replicas_->set_shares(std::move(shares));
}
std::vector<std::pair<std::string, std::string>> Trainer::training_settings(const Dataset& train) const {
  return trainer_parts::training_settings(options_, train);
}

bool Trainer::abandon_collectives() const {
  return rt_.engine().cancelled() || (cancel_requested_ && !agreed_stops_);
}

void Trainer::set_lr(double lr) {
  // 0 is allowed: a long step schedule may decay that far, and a zero rate is a step that changes nothing.
  if (!(lr >= 0 && std::isfinite(lr))) throw Error("training: the learning rate must be 0 or more");
  lr_ = lr;
}

void Trainer::broadcast() {
  replicas_->pull_from_model();
  ranks_->broadcast_root_state((*replicas_)[0]);
  replicas_->copy_first_to_others();
}

// --- steps
// ---------------------------------------------------------------------------------------------------

void Trainer::step(const HostBatchPtr& batch) {
  // A rank's shard of a short last batch may be empty: it still takes part in the all-reduce and the step.
  // global_size 0 means the batch is not a shard: its size is the whole.
  if (!batch || (batch->size < 1 && !world_) || (batch->global_size != 0 && batch->global_size < batch->size))
    throw Error("training step: empty batch");
  pad_target_ = batch->pad_target;
  if (!try_captured_step(batch)) {
    step_by_step(batch);
    capture_->count_uncaptured_step();
  }
  replicas_->add_padded(batch->padded_targets());
  while (static_cast<int64_t>(in_flight_.size()) > options_.steps_in_flight) {
    auto markers = std::move(in_flight_.front());
    in_flight_.erase(in_flight_.begin());
    for (const VarPtr& v : markers) rt_.engine().wait(v);
  }
}

bool Trainer::try_captured_step(const HostBatchPtr& batch) {
  const std::string obstacle = trainer_parts::capture_obstacle(
      replicas_->size(), world_ != nullptr, scaler_->enabled(), is_regression(options_.loss), carries_state_,
      (*replicas_)[0], *batch);
  if (!capture_->wanted(obstacle, warn_)) return false;
  Model& m = (*replicas_)[0];
  const int64_t t = optimizer_steps_ + 1;
  if (capture_->can_replay(batch->size)) {
    in_flight_.push_back({capture_->replay(batch, m, options_.optimizer, lr_, t)});
  } else if (capture_->ready_to_capture()) {
    const float scale = 1.0f / static_cast<float>(batch->size);  // forward_backward divides it per value
    auto body = [&](const DeviceBatch& inputs, const Tensor& scalars, std::vector<Tensor>& grads) {
      const int64_t classes = forward_backward(0, inputs.images, inputs.labels, scale, grads);
      update(0, grads, scalars, Tensor());
      return classes;
    };
    const Tensor scalars = optimizer_scalars(rt_, replicas_->devices()[0], options_.optimizer, lr_, t);
    if (!capture_->capture(
            batch, m, scalars, body, optim_state_[0], replicas_->totals(0), [this] { synchronize(); }, warn_))
      return false;
  } else {
    return false;
  }
  replicas_->add_samples(0, batch->size);
  optimizer_steps_ = t;
  return true;
}

void Trainer::step_by_step(const HostBatchPtr& batch) {
  const int64_t whole = std::max(batch->global_size, batch->size);
  const std::vector<int64_t> sizes = replicas_->split(batch->size);
  const std::vector<Device>& devices = replicas_->devices();
  // Every replica's loss gradient is scaled by 1/(whole batch, over every rank), so the summed gradients are
  // the whole batch's; and by the loss scale when there is one (exactly, for a power of two).
  const float scale = static_cast<float>(scaler_->gradient_factor() / static_cast<double>(whole));
  const size_t replicas = replicas_->size();
  std::vector<std::vector<Tensor>> grads(replicas);
  int64_t offset = 0;
  try {
    for (size_t r = 0; r < replicas; ++r) {
      if (sizes[r] > 0) {
        DeviceBatch db = to_device(rt_, batch, offset, offset + sizes[r], devices[r]);
        forward_backward(r, db.images, db.labels, scale, grads[r]);
        replicas_->add_samples(r, sizes[r]);
      } else {
        // A share of nothing: this replica contributes zero gradients and still takes the common step.
        for (Parameter* p : (*replicas_)[r].parameters()) {
          p->grad = zeros(rt_, p->value.shape(), devices[r]);
          grads[r].push_back(p->grad);
        }
      }
      offset += sizes[r];
    }
    if (reducer_) {
      const int64_t reduced = buckets_->allreduce(grads, *reducer_);
      if (world_) ranks_->count_step(reduced);
    }
    std::vector<Tensor> clip(replicas);
    const bool update_now =
        scaler_->enabled() ? scaler_->unscale(grads[0], options_.clip_grad_norm, devices, clip) : true;
    const int64_t t = update_now ? optimizer_steps_ + 1 : optimizer_steps_;
    std::vector<VarPtr> markers;
    for (size_t r = 0; r < replicas; ++r) {
      if (update_now)
        update(r, grads[r], optimizer_scalars(rt_, devices[r], options_.optimizer, lr_, t), clip[r]);
      // Marks the end of this step on this device: the host waits on it to stay steps_in_flight ahead.
      std::vector<VarPtr> reads;
      for (Parameter* p : (*replicas_)[r].parameters()) reads.push_back(p->value.var());
      VarPtr done = new_var();
      rt_.engine().push([](OpContext&) {}, reads, {done}, devices[r], StreamKind::Compute,
                        {"step done", "", 0, 0});
      markers.push_back(done);
    }
    optimizer_steps_ = t;
    in_flight_.push_back(std::move(markers));
  } catch (...) {
    for (size_t r = 0; r < replicas; ++r) (*replicas_)[r].clear_cache();
    throw;
  }
}

int64_t Trainer::forward_backward(size_t r, const Tensor& images, const Tensor& labels, float scale,
                                  std::vector<Tensor>& grads) {
  const ScopedPrecision precision(options_.precision);
  Model& m = (*replicas_)[r];
  Tensor output = m.forward(images, Mode::Train);
  // A sample of sequence targets holds one per step; the loss is their mean, as d2l's per-token loss.
  const int64_t n = labels.shape().empty() ? 1 : labels.shape()[0];
  values_per_sample_ = n > 0 ? std::max<int64_t>(1, labels.numel() / n) : 1;
  LossStep loss =
      training_loss(options_, output, labels, true, scale / static_cast<float>(values_per_sample_), pad_target_);
  m.backward(loss.doutput);
  add_into(replicas_->totals(r), loss.stats);
  for (Parameter* p : m.parameters()) grads.push_back(p->grad);
  return output.shape().back();
}

void Trainer::update(size_t r, const std::vector<Tensor>& grads, const Tensor& scalars, Tensor clip) {
  std::vector<Tensor> values;
  for (Parameter* p : (*replicas_)[r].parameters()) values.push_back(p->value);
  if (values.empty()) return;
  // Each replica measures the norm of its own copy of the summed gradients: equal copies, the same fixed
  // summation order on every device, so the same factor everywhere, with no host read.
  if (!clip.defined() && options_.clip_grad_norm > 0)
    clip = grad_clip_coefficient(grads, static_cast<float>(options_.clip_grad_norm));
  optimizer_step(values, grads, optim_state_[r], options_.optimizer, scalars, clip);
}

void Trainer::synchronize() {
  auto pending = std::move(in_flight_);
  in_flight_.clear();
  for (auto& markers : pending)
    for (const VarPtr& v : markers) rt_.engine().wait(v);
}

void Trainer::release_step_state() noexcept {
  in_flight_.clear();
  // The captured step holds its activations and gradients, and works on the optimizer state as it was.
  capture_->release();
  // PyTorch's zero_grad(set_to_none=True): gradients are temporaries of a step.
  replicas_->release_step_state();
}

void Trainer::drain() noexcept {
  // After a cancel or an error: wait until every op enqueued so far has run, so that their temporaries are
  // freed when fit() returns. The errors they carry were the reason for stopping; they are not news.
  try {
    rt_.engine().wait_all();
  } catch (...) {
  }
  release_step_state();
  // A dropped update may have left the optimizer state half-written (or, made at its first step, never
  // written): start it afresh, as a new optimizer would.
  for (auto& states : optim_state_)
    for (OptimizerState& st : states) st = OptimizerState();
  optimizer_steps_ = 0;
}

StepTotals Trainer::totals() {
  StepTotals t = ranks_->sum(replicas_->local_totals());
  t.values_per_sample = values_per_sample_;
  return t;
}

void Trainer::reset_totals() {
  replicas_->reset_totals();
}

// --- evaluation
// ----------------------------------------------------------------------------------------------

EvalMetrics Trainer::evaluate_metrics(const DatasetPtr& data) {
  if (!data || data->count == 0) throw Error("evaluate: empty dataset");
  const ScopedPrecision precision(options_.precision);
  // DataParallel semantics: every replica evaluates with device 0's BatchNorm running statistics.
  replicas_->share_first_buffers();
  const std::vector<Device>& devices = replicas_->devices();
  LoaderOptions lo;
  lo.batch_size = options_.eval_batch_size > 0 ? options_.eval_batch_size : options_.batch_size;
  lo.shuffle = false;
  lo.resize = options_.resize;
  lo.pinned = replicas_->any_cuda();
  if (world_) lo.shard = world_->rank(), lo.shards = world_->size();
  DataLoader loader(data, lo);
  loader.start_epoch(0);
  const bool regression = is_regression(options_.loss);
  std::vector<Tensor> sums;  // per replica {loss sum, correct or squared errors}
  for (Device d : devices) sums.push_back(zeros(rt_, {2}, d));
  double abs_errors = 0;  // regression: read back per batch, the outputs being one value per target
  int64_t values = 0;
  std::vector<VarPtr> recent;  // one var per batch, to keep the host two batches ahead at most
  while (HostBatchPtr batch = loader.next()) {
    if (abandon_collectives()) throw CancelledError();
    const auto sizes = replicas_->split(batch->size);
    int64_t offset = 0;
    for (size_t r = 0; r < replicas_->size(); ++r) {
      if (sizes[r] == 0) continue;
      DeviceBatch db = to_device(rt_, batch, offset, offset + sizes[r], devices[r]);
      Tensor output = (*replicas_)[r].forward(db.images, Mode::Eval);
      sums[r] = add(sums[r], training_loss(options_, output, db.labels, false, 0, batch->pad_target).stats);
      values += db.labels.numel();
      if (regression) {
        const std::vector<float> pred = to_host(output), want = to_host(db.labels);
        for (size_t i = 0; i < pred.size() && i < want.size(); ++i)
          abs_errors += std::abs(static_cast<double>(pred[i]) - static_cast<double>(want[i]));
      }
      recent.push_back(sums[r].var());
      offset += sizes[r];
    }
    values -= batch->padded_targets();  // padding is in no measure
    while (recent.size() > 2 * replicas_->size()) {
      rt_.engine().wait(recent.front());
      recent.erase(recent.begin());
    }
  }
  double loss_sum = 0, second = 0;
  for (const Tensor& c : sums) {
    const std::vector<float> v = to_host(c);
    loss_sum += v[0];
    second += v[1];
  }
  // Every rank's sums: the ranks share the evaluation as they share the batches.
  const std::vector<double> all = ranks_->sum_values({loss_sum, second, abs_errors, static_cast<double>(values)});
  EvalMetrics m;
  m.samples = data->count;
  const double n = all[3];
  m.loss = all[0] / n;
  if (regression) {
    m.mse = all[1] / n;
    m.mae = all[2] / n;
    // SST about the targets' mean, from the dataset itself (every rank holds all of it).
    const std::vector<float>& y = data->targets;
    double mean = 0, sst = 0;
    for (float v : y) mean += v;
    mean /= static_cast<double>(std::max<size_t>(1, y.size()));
    for (float v : y) sst += (v - mean) * (v - mean);
    m.r2 = sst > 0 ? 1 - all[1] / sst : NAN;
  } else {
    m.accuracy = all[1] / n;
    if (data->target_numel() > 1) m.perplexity = std::exp(m.loss);
  }
  return m;
}

double Trainer::evaluate(const DatasetPtr& data) {
  return evaluate_metrics(data).accuracy;
}

double evaluate(Model& model, const DatasetPtr& data, int64_t batch_size, int64_t resize) {
  TrainOptions o;
  o.batch_size = batch_size;
  o.resize = resize;
  Trainer t(model, {model.device()}, o);
  return t.evaluate(data);
}

EvalMetrics evaluate_metrics(Model& model, const DatasetPtr& data, LossKind loss, int64_t batch_size) {
  TrainOptions o;
  o.batch_size = batch_size;
  o.loss = loss;
  Trainer t(model, {model.device()}, o);
  return t.evaluate_metrics(data);
}

}  // namespace gn::nn
