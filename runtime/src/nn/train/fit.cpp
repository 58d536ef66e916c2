// Trainer::fit(): the epoch loop over the trainer's parts. Each epoch trains on the loader's batches at the
// schedule's rates, reports progress, evaluates, and saves a checkpoint when one is due; a cancel stops it at
// a batch (saving where it stopped when it can), and a resumed run starts where a checkpoint left off.
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "gpunodes/errors.h"
#include "gpunodes/nn/trainer.h"
#include "loss_scaler.h"
#include "rank_agreement.h"
#include "replica_set.h"
#include "step_capture.h"
#include "training_checkpoints.h"

namespace gn::nn {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

}  // namespace

struct Trainer::Fit {
  Fit(Trainer& trainer, const trainer_parts::CheckpointStore& store, const DatasetPtr& train,
      const DatasetPtr& test, const MetricCallback& on_metric, const WarningCallback& on_warning);
  ~Fit();
  // Trains every epoch left and returns the run's result; rethrows what stopped it (CancelledError for a
  // cancel) once every op it enqueued has drained.
  TrainResult run();

 private:
  // Where training starts: the beginning, or a checkpoint's position.
  struct Position {
    int64_t epoch = 0, batch = 0, global_step = 0;
    double seconds = 0, epoch_seconds = 0;
  };
  // What train_epoch() measures against.
  struct EpochClock {
    Clock::time_point start;
    double seconds_before = 0;  // a resumed epoch's training time before the checkpoint
    int64_t samples_before = 0;
    double seconds() const { return seconds_before + seconds_since(start); }
  };

  // Makes sure every rank trains the same thing, continues from the newest checkpoint when asked, and
  // copies the starting state to every replica (and rank).
  void start();
  // Takes the checkpoint's state into the trainer; returns where it was taken.
  Position resume(const trainer_parts::CheckpointStore::Found& found);
  // Trains one epoch (from a resumed batch), reporting progress every log_every batches.
  EpochResult train_epoch(int64_t epoch);
  // The epoch's series, its evaluation and memory, and a checkpoint when one is due.
  void finish_epoch(int64_t epoch, EpochResult& er);
  // Training's end: the state into the model, the steps' state released, the ranks' speeds gathered.
  void finish();
  // The catch-all of run(): drains, warns when a cancel could not be saved, and rethrows.
  [[noreturn]] void abandon();

  // The series "loss", "train_acc", "images_per_second", at an epoch's end "epoch_seconds", "lr" and with
  // loss scaling "loss_scale", at x; then, with balance, the shares re-measured. Serves the progress inside
  // an epoch and its end alike.
  void report_progress(double x, double loss, double accuracy, double images_per_second,
                       std::optional<double> epoch_seconds);
  void emit(const std::string& series, double x, double value);
  double now() const { return from_.seconds + seconds_since(started_); }
  // Whether to stop now: at a cancel, or in a distributed run with checkpoints where any rank was asked to.
  bool stop_agreed();
  bool stop_requested() const { return t_.cancel_requested_.load() || t_.rt_.engine().cancelled(); }
  // Stops with CancelledError; at the trainer's own cancel with checkpoints, lets the steps in flight finish
  // and saves first, so that a resumed run loses nothing (the engine's cancel drops queued ops, after which
  // there is nothing whole to save).
  [[noreturn]] void stop(int64_t epoch, int64_t batch, double epoch_seconds, size_t history_size);
  void save(int64_t epoch, int64_t batch, double epoch_seconds, size_t history_size);

  Trainer& t_;
  const trainer_parts::CheckpointStore& store_;
  const DatasetPtr& train_;
  const DatasetPtr& test_;
  const MetricCallback& on_metric_;
  const WarningCallback& on_warning_;
  DataLoader loader_;
  const int64_t batches_;    // per epoch
  const size_t first_span_;  // the profiler's when fit() began
  const bool sequence_targets_;  // a target per step (a language model): perplexity is reported
  TrainResult result_;
  std::vector<MetricSample> history_;  // with checkpoints: every sample so far, saved with them
  Position from_;
  int64_t global_step_ = 0;
  Clock::time_point started_ = Clock::now();
  bool saved_at_cancel_ = false;
};

namespace {

LoaderOptions training_loader(const TrainOptions& o, bool pinned, dist::World* world) {
  LoaderOptions lo;
  lo.batch_size = o.batch_size;
  lo.shuffle = true;
  lo.seed = o.shuffle_seed;
  lo.resize = o.resize;
  lo.pinned = pinned;
  if (world) lo.shard = world->rank(), lo.shards = world->size();
  return lo;
}

}  // namespace

Trainer::Fit::Fit(Trainer& trainer, const trainer_parts::CheckpointStore& store, const DatasetPtr& train,
                  const DatasetPtr& test, const MetricCallback& on_metric, const WarningCallback& on_warning)
    : t_(trainer),
      store_(store),
      train_(train),
      test_(test),
      on_metric_(on_metric),
      on_warning_(on_warning),
      loader_(train, training_loader(trainer.options_, trainer.replicas_->any_cuda(), trainer.world_)),
      batches_(loader_.batches_per_epoch()),
      first_span_(trainer.rt_.profiler().span_count()),
      sequence_targets_(!is_regression(trainer.options_.loss) && train->target_numel() > 1) {
  // Ranks hear a cancel at different batches. With checkpoints they agree at each batch whether any of them
  // was asked to stop, so that all stop at the same batch and the checkpoint rank 0 saves is where every rank
  // is; between those points a rank's cancel waits (abandon_collectives).
  t_.agreed_stops_ = t_.world_ && store_.enabled();
  t_.warn_ = on_warning;
}

Trainer::Fit::~Fit() {
  t_.agreed_stops_ = false;  // evaluate() outside fit() hears a cancel at once
  t_.warn_ = nullptr;
}

TrainResult Trainer::Fit::run() {
  try {
    start();
    for (int64_t epoch = from_.epoch; epoch < t_.options_.epochs; ++epoch) {
      EpochResult er = train_epoch(epoch);
      finish_epoch(epoch, er);
    }
    finish();
  } catch (...) {
    abandon();
  }
  return std::move(result_);
}

void Trainer::Fit::start() {
  t_.values_per_sample_ = train_->target_numel();
  t_.carries_state_ = train_->sequential;
  if (train_->sequential)
    for (size_t r = 0; r < t_.replicas_->size(); ++r) (*t_.replicas_)[r].carry_state(true);
  if (t_.world_) {
    std::string mine =
        "model: " + t_.model_.signature() + "\nlocal devices: " + std::to_string(t_.replicas_->size());
    for (const auto& [name, value] : t_.training_settings(*train_)) mine += "\n" + name + ": " + value;
    t_.ranks_->check_same_run(mine);
  }
  if (store_.resume()) {
    if (auto found = store_.find_resumable(t_.model_, t_.training_settings(*train_), t_.options_.epochs,
                                           batches_, on_warning_))
      from_ = resume(*found);
    global_step_ = from_.global_step;
    started_ = Clock::now();
    t_.ranks_->check_same_checkpoint(std::filesystem::path(result_.resumed_from).filename().string());
  }
  t_.broadcast();
}

Trainer::Fit::Position Trainer::Fit::resume(const trainer_parts::CheckpointStore::Found& found) {
  const TrainingCheckpoint& c = found.checkpoint;
  // Into the model, from which start()'s broadcast() copies it to every replica; the optimizer state goes to
  // every replica directly, as each keeps its own.
  trainer_parts::restore_model_state(c, t_.model_);
  for (size_t r = 0; r < t_.replicas_->size(); ++r)
    t_.optim_state_[r] = trainer_parts::restore_optimizer_state(c, (*t_.replicas_)[r]);
  t_.optimizer_steps_ = c.optimizer_steps;
  t_.scaler_->restore({c.loss_scale, c.loss_scale_good_steps, c.skipped_steps});
  if (c.shares.size() == t_.replicas_->size()) t_.replicas_->set_shares(c.shares);
  t_.replicas_->reset_totals(c.batch > 0 ? c.totals : StepTotals{});
  result_.epochs = c.epochs;
  result_.resumed_from = found.path;
  for (const MetricSample& m : c.metrics)
    if (on_metric_) on_metric_(m);
  history_ = c.metrics;
  return {c.epoch, c.batch, c.global_step, c.seconds, c.epoch_seconds};
}

EpochResult Trainer::Fit::train_epoch(int64_t epoch) {
  trainer_parts::ReplicaSet& replicas = *t_.replicas_;
  const bool resumed = epoch == from_.epoch && from_.batch > 0;
  if (!resumed) t_.reset_totals();
  // d2l's sequential partition: each epoch's recurrent state starts from zeros and is carried on.
  if (train_->sequential)
    for (size_t r = 0; r < replicas.size(); ++r) replicas[r].reset_state();
  const int64_t first = resumed ? from_.batch : 0;
  loader_.start_epoch(epoch, first);
  EpochClock clock{Clock::now(), resumed ? from_.epoch_seconds : 0.0, replicas.samples()};
  // This process's samples of the epoch over its time here: a resumed epoch's earlier batches ran at another
  // time, and in a distributed run the totals count every rank's samples.
  auto images_per_second = [&] {
    return static_cast<double>(replicas.samples() - clock.samples_before) / seconds_since(clock.start);
  };
  const int64_t prepared_before = loader_.batches_prepared();
  const double prepare_ms_before = loader_.ms_per_batch() * static_cast<double>(prepared_before);
  replicas.mark_balance(t_.rt_.profiler());
  int64_t b = first;
  double wait_ms = 0;
  while (true) {
    if (stop_agreed()) stop(epoch, b, clock.seconds(), history_.size());
    const auto t_wait = Clock::now();
    HostBatchPtr batch = loader_.next();
    wait_ms += 1e3 * seconds_since(t_wait);
    if (!batch) break;
    t_.set_lr(scheduled_lr(t_.options_.schedule, t_.options_.optimizer.lr, global_step_, batches_,
                           t_.options_.epochs));
    t_.step(batch);
    ++b, ++global_step_;
    const double x = static_cast<double>(epoch) + static_cast<double>(b) / static_cast<double>(batches_);
    if (t_.options_.log_every > 0 && b % t_.options_.log_every == 0 && b < batches_) {
      const StepTotals totals = t_.totals();
      report_progress(x, totals.loss(), totals.accuracy(), images_per_second(), std::nullopt);
    }
  }
  t_.synchronize();
  EpochResult er;
  er.epoch = epoch + 1;
  er.seconds = clock.seconds();
  const StepTotals totals = t_.totals();
  er.train_loss = totals.loss();
  // The second total is the hits for classes and the squared errors for a regression.
  (is_regression(t_.options_.loss) ? er.train_mse : er.train_acc) = totals.accuracy();
  er.images_per_second = images_per_second();
  const int64_t prepared = loader_.batches_prepared() - prepared_before;
  if (prepared > 0)
    er.loader_ms_per_batch =
        (loader_.ms_per_batch() * static_cast<double>(loader_.batches_prepared()) - prepare_ms_before) /
        static_cast<double>(prepared);
  if (b > first) er.step_ms = 1e3 * seconds_since(clock.start) / static_cast<double>(b - first);
  er.loader_wait_ms = wait_ms;
  return er;
}

void Trainer::Fit::finish_epoch(int64_t epoch, EpochResult& er) {
  const std::vector<Device>& devices = t_.replicas_->devices();
  const double x = static_cast<double>(epoch + 1);
  // A cancel during the evaluation saves the epoch as trained but not evaluated: the resumed run says the
  // epoch's numbers once, after evaluating.
  const size_t history_trained = history_.size();
  report_progress(x, er.train_loss, is_regression(t_.options_.loss) ? er.train_mse : er.train_acc,
                  er.images_per_second, er.seconds);
  if (devices.size() > 1)
    for (size_t r = 0; r < devices.size(); ++r)
      emit("share/" + devices[r].str(), x, t_.replicas_->shares()[r]);
  if (test_ && test_->count > 0) {
    EvalMetrics m;
    try {
      if (stop_agreed()) throw CancelledError();
      m = t_.evaluate_metrics(test_);
    } catch (const CancelledError&) {
      stop(epoch, batches_, er.seconds, history_trained);
    }
    er.test_acc = m.accuracy;
    er.test_loss = m.loss;
    er.test_perplexity = m.perplexity;
    er.test_mse = m.mse;
    er.test_mae = m.mae;
    er.test_r2 = m.r2;
    emit("test_loss", x, m.loss);
    if (is_regression(t_.options_.loss)) {
      emit("test_mse", x, m.mse);
      emit("test_mae", x, m.mae);
      emit("test_r2", x, m.r2);
    } else {
      emit("test_acc", x, m.accuracy);
      if (sequence_targets_) emit("test_perplexity", x, m.perplexity);
    }
  }
  for (Device d : devices) {
    MemoryStats m = t_.rt_.memory_stats(d);
    emit("memory_mb/" + d.str(), x, static_cast<double>(m.allocated_bytes.current) / (1 << 20));
    emit("peak_memory_mb/" + d.str(), x, static_cast<double>(m.allocated_bytes.peak) / (1 << 20));
  }
  result_.epochs.push_back(er);
  if (store_.due_after_epoch(epoch + 1, t_.options_.epochs)) save(epoch + 1, 0, 0.0, history_.size());
}

void Trainer::Fit::finish() {
  t_.carries_state_ = false;
  for (size_t r = 0; r < t_.replicas_->size(); ++r) (*t_.replicas_)[r].carry_state(false);
  t_.replicas_->push_to_model();
  t_.synchronize();
  t_.release_step_state();
  if (!t_.world_) return;
  // Each rank's speed and its time in the all-reduce, for rank 0's report.
  double allreduce_us = 0;
  for (const Span& sp : t_.rt_.profiler().spans(first_span_))
    if (sp.name.compare(0, 10, "all-reduce") == 0) allreduce_us += sp.end_us - sp.start_us;
  const double ips = result_.epochs.empty() ? 0.0 : result_.epochs.back().images_per_second;
  double parameter_bytes = 0;
  for (const Parameter* p : t_.model_.parameters()) parameter_bytes += static_cast<double>(p->value.bytes());
  result_.ranks = t_.ranks_->gather_stats(ips, allreduce_us / 1e3, parameter_bytes);
}

void Trainer::Fit::abandon() {
  loader_.stop();
  t_.carries_state_ = false;
  for (size_t r = 0; r < t_.replicas_->size(); ++r) (*t_.replicas_)[r].carry_state(false);
  t_.drain();
  history_.clear();
  if (store_.enabled() && t_.cancel_requested_ && !saved_at_cancel_ && on_warning_)
    on_warning_(
        "no checkpoint was saved at the cancel: the steps in flight were dropped before they finished" +
        std::string(result_.checkpoints.empty() && result_.resumed_from.empty()
                        ? ""
                        : "; the newest checkpoint is " + (result_.checkpoints.empty()
                                                               ? result_.resumed_from
                                                               : result_.checkpoints.back())));
  // The engine's cancel surfaces as errors of the dropped ops; report it as the cancel it is. The trainer's
  // own cancel is spent: a later fit() trains.
  if (stop_requested()) {
    t_.cancel_requested_ = false;
    throw CancelledError();
  }
  throw;
}

void Trainer::Fit::report_progress(double x, double loss, double accuracy, double images_per_second,
                                   std::optional<double> epoch_seconds) {
  emit("loss", x, loss);
  // What the second total means depends on the task: hits for classes, squared errors for regression.
  if (is_regression(t_.options_.loss)) {
    emit("train_mse", x, accuracy);
  } else {
    emit("train_acc", x, accuracy);
    if (sequence_targets_) emit("perplexity", x, std::exp(loss));
  }
  emit("images_per_second", x, images_per_second);
  if (epoch_seconds) emit("epoch_seconds", x, *epoch_seconds);
  emit("lr", x, t_.lr_);
  if (t_.scaler_->enabled()) emit("loss_scale", x, t_.scaler_->scale());
  if (t_.options_.balance && t_.replicas_->size() > 1) t_.replicas_->rebalance(t_.rt_.profiler());
}

void Trainer::Fit::emit(const std::string& series, double x, double value) {
  MetricSample s{series, x, global_step_, now(), value};
  if (store_.enabled()) history_.push_back(s);
  if (on_metric_) on_metric_(s);
}

bool Trainer::Fit::stop_agreed() {
  if (!t_.agreed_stops_ || t_.rt_.engine().cancelled()) return stop_requested();
  const bool stop =
      t_.ranks_->agree_to_stop(t_.cancel_requested_, [this] { return t_.rt_.engine().cancelled(); });
  if (stop) t_.cancel_requested_ = true;
  return stop;
}

void Trainer::Fit::stop(int64_t epoch, int64_t batch, double epoch_seconds, size_t history_size) {
  if (store_.enabled() && t_.cancel_requested_ && !t_.rt_.engine().cancelled()) {
    t_.synchronize();
    save(epoch, batch, epoch_seconds, history_size);
    saved_at_cancel_ = true;
  }
  throw CancelledError();
}

void Trainer::Fit::save(int64_t epoch, int64_t batch, double epoch_seconds, size_t history_size) {
  // The totals are summed over the ranks, so every rank takes part; then rank 0 alone writes, as every rank
  // holds the same state.
  const double seconds = now();
  const StepTotals totals_so_far = batch > 0 ? t_.totals() : StepTotals{};
  if (t_.world_ && !t_.world_->is_root()) return;
  Model& m = (*t_.replicas_)[0];
  TrainingCheckpoint c;
  c.signature = m.signature();
  c.settings = t_.training_settings(*train_);
  c.epoch = epoch;
  c.batch = batch;
  c.global_step = epoch * batches_ + batch;
  c.optimizer_steps = t_.optimizer_steps_;
  const trainer_parts::LossScaler::State scaler = t_.scaler_->state();
  c.loss_scale = scaler.scale;
  c.loss_scale_good_steps = scaler.good_steps;
  c.skipped_steps = scaler.skipped_steps;
  c.seconds = seconds;
  c.epoch_seconds = epoch_seconds;
  c.totals = totals_so_far;
  c.shares = t_.replicas_->shares();
  c.epochs = result_.epochs;
  c.metrics.assign(history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(history_size));
  trainer_parts::save_model_state(m, t_.optim_state_[0], c);
  result_.checkpoints.push_back(store_.write(c));
}

TrainResult Trainer::fit(const DatasetPtr& train, const DatasetPtr& test, const MetricCallback& on_metric,
                         const WarningCallback& on_warning) {
  if (!train || train->count == 0) throw Error("training: empty training set");
  const trainer_parts::CheckpointStore store(options_.checkpoint);
  if (store.enabled()) store.prepare();
  Fit fit(*this, store, train, test, on_metric, on_warning);
  return fit.run();
}

}  // namespace gn::nn
