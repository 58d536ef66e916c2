// The data-parallel trainer and the host gradient reduction.
#include "gpunodes/nn/trainer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>
#include <sstream>

#include "cuda_support.h"
#include "gpunodes/backend.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/checkpoint.h"

namespace gn::nn {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Sums each gradient over the replicas on the host, in replica order, so every replica gets the very same
// sum. CPU devices share host memory, so their gradients are summed in place by one op; GPU gradients (a GPU
// training beside the CPU) are first copied to the host and get the sum copied back. In a distributed run
// the same op then sums the bucket over the ranks with one MPI all-reduce of the bucket packed flat (as DDP
// flattens its buckets): one collective per bucket, not per tensor.
class HostReducer final : public GradientReducer {
 public:
  HostReducer(Runtime& rt, dist::World* world, VarPtr order)
      : rt_(rt), world_(world), order_(std::move(order)) {}

  void allreduce(const std::vector<std::vector<Tensor>>& grads) override {
    const size_t replicas = grads.size(), count = grads.front().size();
    if (count == 0) return;
    std::vector<std::vector<Tensor>> host(replicas);
    std::vector<Tensor> sums;  // host copies of the sums for replicas on GPUs
    std::vector<VarPtr> reads, writes;
    bool any_gpu = false;
    for (size_t r = 0; r < replicas; ++r) {
      for (size_t i = 0; i < count; ++i) {
        const Tensor& g = grads[r][i];
        if (g.device().is_cpu()) {
          host[r].push_back(g);
          writes.push_back(g.var());
        } else {
          host[r].push_back(copy(g, Device::cpu(), /*non_blocking=*/true));
          writes.push_back(host[r].back().var());  // only replica 0's is written, but nobody else uses them
          any_gpu = true;
        }
      }
    }
    if (any_gpu)
      for (size_t i = 0; i < count; ++i) {
        sums.push_back(Tensor(rt_, grads[0][i].shape(), Device::cpu()));
        writes.push_back(sums.back().var());
      }
    if (world_) writes.push_back(order_);
    int64_t bytes = 0;
    for (const auto& g : grads[0]) bytes += g.bytes() * static_cast<int64_t>(replicas + 1);
    std::vector<bool> on_cpu(replicas);
    for (size_t r = 0; r < replicas; ++r) on_cpu[r] = grads[r][0].device().is_cpu();
    dist::World* world = world_;
    rt_.engine().push(
        [host, sums, on_cpu, world](OpContext& ctx) {
          ctx.check_cancelled();
          // ((g0 + g1) + g2) ... accumulated into replica 0's buffer: the same sum everywhere.
          for (size_t i = 0; i < host[0].size(); ++i) {
            const size_t n = static_cast<size_t>(host[0][i].numel());
            float* acc = host[0][i].data();
            for (size_t r = 1; r < host.size(); ++r) {
              const float* src = host[r][i].data();
              for (size_t j = 0; j < n; ++j) acc[j] += src[j];
            }
          }
          if (world) {
            size_t total = 0;
            for (const Tensor& t : host[0]) total += static_cast<size_t>(t.numel());
            std::vector<float> flat(total);
            size_t at = 0;
            for (const Tensor& t : host[0]) {
              std::memcpy(flat.data() + at, t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
              at += static_cast<size_t>(t.numel());
            }
            world->allreduce_sum(flat.data(), flat.size(), "the gradient all-reduce",
                                 dist::World::Channel::Engine, [&ctx] { return ctx.cancelled(); });
            at = 0;
            for (const Tensor& t : host[0]) {
              std::memcpy(t.data(), flat.data() + at, static_cast<size_t>(t.numel()) * sizeof(float));
              at += static_cast<size_t>(t.numel());
            }
          }
          for (size_t i = 0; i < host[0].size(); ++i) {
            const size_t n = static_cast<size_t>(host[0][i].numel());
            const float* acc = host[0][i].data();
            for (size_t r = 1; r < host.size(); ++r)
              if (on_cpu[r]) std::memcpy(host[r][i].data(), acc, n * sizeof(float));
            if (!sums.empty()) std::memcpy(sums[i].data(), acc, n * sizeof(float));
          }
        },
        reads, writes, Device::cpu(), StreamKind::Collective,
        {world ? "all-reduce (host + mpi)" : "all-reduce (host)", "", bytes, 0});
    if (any_gpu)
      for (size_t r = 0; r < replicas; ++r)
        for (size_t i = 0; i < count; ++i)
          if (!grads[r][i].device().is_cpu()) copy_into(grads[r][i], sums[i]);
  }

 private:
  Runtime& rt_;
  dist::World* world_;
  VarPtr order_;
};

// TrainOptions::sgd is the older spelling of plain SGD: it wins when set, and must not meet a set optimizer.
OptimizerOptions resolve_optimizer(const TrainOptions& o) {
  const SgdOptions defaults;
  const bool legacy = o.sgd.lr != defaults.lr || o.sgd.momentum != defaults.momentum ||
                      o.sgd.weight_decay != defaults.weight_decay;
  if (!legacy) return o.optimizer;
  if (o.optimizer != OptimizerOptions{})
    throw Error("training: set the optimizer through TrainOptions::optimizer or ::sgd, not both");
  OptimizerOptions r;
  r.lr = o.sgd.lr;
  r.momentum = o.sgd.momentum;
  r.weight_decay = o.sgd.weight_decay;
  return r;
}

}  // namespace

// --- Trainer -----------------------------------------------------------------------------------------------

struct Trainer::CapturedStep {
  int64_t batch = 0, classes = 0;
  DeviceBatch inputs;  // the captured step's batch: each replay's is copied in
  Tensor scalars;      // its optimizer scalars: each replay's are written in
  std::vector<VarPtr> writes;  // everything the step writes (parameters, buffers, optimizer state, totals)
  std::shared_ptr<CapturedWork> work;
};

const char* step_capture_name(StepCapture mode) {
  switch (mode) {
    case StepCapture::Auto:
      return "auto";
    case StepCapture::On:
      return "on";
    case StepCapture::Off:
      return "off";
  }
  return "?";
}

std::optional<StepCapture> parse_step_capture(std::string_view text) {
  for (StepCapture m : {StepCapture::Auto, StepCapture::On, StepCapture::Off})
    if (text == step_capture_name(m)) return m;
  return std::nullopt;
}

const char* loss_scale_mode_name(LossScaleMode mode) {
  switch (mode) {
    case LossScaleMode::Auto:
      return "auto";
    case LossScaleMode::Dynamic:
      return "dynamic";
    case LossScaleMode::Off:
      return "off";
  }
  return "?";
}

std::optional<LossScaleMode> parse_loss_scale_mode(std::string_view text) {
  for (LossScaleMode m : {LossScaleMode::Auto, LossScaleMode::Dynamic, LossScaleMode::Off})
    if (text == loss_scale_mode_name(m)) return m;
  return std::nullopt;
}

Trainer::Trainer(Model& model, std::vector<Device> devices, TrainOptions options)
    : rt_(model.runtime()), model_(model), devices_(std::move(devices)), options_(options) {
  if (devices_.empty()) throw Error("training needs at least one device");
  std::set<Device> seen;
  for (Device d : devices_) {
    if (!rt_.has(d)) throw Error("cannot train on " + d.str() + ": no such device");
    if (!seen.insert(d).second) throw Error("device " + d.str() + " is listed twice for training");
  }
  if (options_.batch_size < 1) throw Error("training: batch size must be at least 1");
  if (options_.epochs < 0) throw Error("training: epochs must not be negative");
  options_.optimizer = resolve_optimizer(options_);
  std::vector<std::string> problems = optimizer_problems(options_.optimizer);
  for (std::string& p : schedule_problems(options_.schedule, options_.optimizer.lr))
    problems.push_back(std::move(p));
  if (!(options_.clip_grad_norm >= 0 && std::isfinite(options_.clip_grad_norm)))
    problems.push_back("clip_grad_norm: must be 0 (off) or more");
  if (!(options_.label_smoothing >= 0 && options_.label_smoothing <= 1))
    problems.push_back("label_smoothing: must be between 0 and 1");
  const LossScaleOptions& ls = options_.loss_scale;
  if (!(ls.init > 0 && std::isfinite(ls.init))) problems.push_back("loss_scale_init: must be above 0");
  if (!(ls.growth >= 1 && std::isfinite(ls.growth))) problems.push_back("loss scale growth: must be 1 or more");
  if (!(ls.backoff > 0 && ls.backoff < 1)) problems.push_back("loss scale backoff: must be between 0 and 1");
  if (ls.interval < 1) problems.push_back("loss_scale_interval: must be at least 1");
  if (!problems.empty()) {
    std::string all = "training: " + problems.front();
    for (size_t i = 1; i < problems.size(); ++i) all += "; " + problems[i];
    throw Error(all);
  }
  for (Device d : devices_) check_precision(options_.precision, d, "training");
  lr_ = options_.optimizer.lr;
  loss_scale_ = options_.loss_scale.enabled(options_.precision) ? options_.loss_scale.init : 0;
  if (options_.steps_in_flight < 0) options_.steps_in_flight = 0;
  if (options_.world && options_.world->mpi()) world_ = options_.world;
  collective_order_ = new_var();

  for (size_t r = 0; r < devices_.size(); ++r) {
    if (r == 0 && devices_[0] == model_.device()) {
      replicas_.push_back(&model_);
    } else {
      owned_.push_back(model_.replicate(devices_[r]));
      replicas_.push_back(owned_.back().get());
    }
  }
  for (Model* m : replicas_) {
    optim_state_.emplace_back(m->parameters().size());
    totals_.push_back(zeros(rt_, {2}, m->device()));
  }
  samples_.assign(devices_.size(), 0);
  shares_.assign(devices_.size(), 1.0 / static_cast<double>(devices_.size()));

  // Buckets in backward order, as PyTorch DDP's reducer makes them: the last layers' gradients are ready
  // first and are reduced while earlier layers still run backward. The first bucket is small (1 MiB) so the
  // first all-reduce starts early; the others are about 25 MiB, few enough collectives to keep their fixed
  // cost low.
  auto params = model_.parameters();
  std::vector<size_t> bucket;
  int64_t bucket_bytes = 0;
  for (size_t i = params.size(); i-- > 0;) {
    bucket.push_back(i);
    bucket_bytes += params[i]->value.bytes();
    if (bucket_bytes >= (buckets_.empty() ? (int64_t(1) << 20) : (int64_t(25) << 20))) {
      buckets_.push_back(std::move(bucket));
      bucket.clear();
      bucket_bytes = 0;
    }
  }
  if (!bucket.empty()) buckets_.push_back(std::move(bucket));

  if (devices_.size() > 1 || world_) {
    const bool all_cuda = std::all_of(devices_.begin(), devices_.end(), [](Device d) { return d.is_cuda(); });
    std::string nccl_failure;
    if (all_cuda) {
      try {
        reducer_ = make_nccl_reducer(rt_, devices_, world_, collective_order_);
      } catch (const BackendError& e) {
        // NCCL refusing (an odd topology, a driver problem) costs speed, not correctness: reduce on the host.
        // Across ranks every rank must take the same path; a refusal on one is a failure of the job there.
        if (world_) throw;
        nccl_failure = e.what();
      }
    }
    if (reducer_) {
      reducer_name_ = "nccl";
    } else {
      reducer_ = std::make_unique<HostReducer>(rt_, world_, collective_order_);
      reducer_name_ = nccl_failure.empty() ? "host" : "host (NCCL failed: " + nccl_failure + ")";
    }
    if (world_)
      reducer_name_ +=
          " + mpi (" + std::to_string(world_->size()) + (world_->size() == 1 ? " rank)" : " ranks)");
  } else {
    reducer_name_ = "none";
  }
}

// Queued ops hold their tensors themselves, so nothing here needs to wait for them.
Trainer::~Trainer() {
  release_step_state();
}

void Trainer::release_step_state() noexcept {
  in_flight_.clear();
  // The captured step holds its activations and gradients, and works on the optimizer state as it was.
  if (captured_) released_capture_ = captured_->work->describe();
  captured_.reset();
  uncaptured_steps_ = 0;
  for (Model* m : replicas_) {
    m->clear_cache();
    // PyTorch's zero_grad(set_to_none=True): gradients are temporaries of a step.
    for (Parameter* p : m->parameters()) p->grad = Tensor();
  }
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

void Trainer::set_lr(double lr) {
  // 0 is allowed: a long step schedule may decay that far, and a zero rate is a step that changes nothing.
  if (!(lr >= 0 && std::isfinite(lr))) throw Error("training: the learning rate must be 0 or more");
  lr_ = lr;
}

std::vector<int64_t> Trainer::split(int64_t n) const {
  // Largest remainders, so the counts sum to n and follow the shares as closely as whole samples allow.
  const size_t k = shares_.size();
  std::vector<int64_t> out(k);
  std::vector<std::pair<double, size_t>> rest;
  int64_t used = 0;
  for (size_t i = 0; i < k; ++i) {
    const double exact = shares_[i] * static_cast<double>(n);
    out[i] = static_cast<int64_t>(std::floor(exact));
    used += out[i];
    rest.emplace_back(exact - static_cast<double>(out[i]), i);
  }
  std::stable_sort(rest.begin(), rest.end(), [](auto& a, auto& b) { return a.first > b.first; });
  for (size_t j = 0; used < n; ++j, ++used) ++out[rest[j % k].second];
  return out;
}

void Trainer::set_shares(std::vector<double> shares) {
  if (shares.size() != devices_.size()) throw Error("set_shares: one share per device expected");
  double sum = 0;
  for (double s : shares) {
    if (!(s >= 0)) throw Error("set_shares: shares must be non-negative");
    sum += s;
  }
  if (!(sum > 0)) throw Error("set_shares: the shares sum to zero");
  for (double& s : shares) s /= sum;
  shares_ = std::move(shares);
}

void Trainer::broadcast() {
  if (replicas_[0] != &model_) replicas_[0]->copy_state_from(model_);
  if (world_) broadcast_from_root();
  for (size_t r = 1; r < replicas_.size(); ++r) replicas_[r]->copy_state_from(*replicas_[0]);
}

void Trainer::broadcast_from_root() {
  // Every rank starts from rank 0's parameters and buffers (and its count of training forwards), whatever
  // seed or file each one built its model from.
  Model& m = *replicas_[0];
  const auto state = m.state();
  std::vector<char> bytes;
  if (world_->is_root()) {
    const int64_t tracked = m.batches_tracked();
    bytes.insert(bytes.end(), reinterpret_cast<const char*>(&tracked),
                 reinterpret_cast<const char*>(&tracked) + 8);
    for (const Parameter* p : state) {
      const std::vector<float> v = to_host(p->value);
      bytes.insert(bytes.end(), reinterpret_cast<const char*>(v.data()),
                   reinterpret_cast<const char*>(v.data() + v.size()));
    }
  }
  world_->broadcast(bytes, 0, "broadcasting rank 0's parameters", [this] { return abandon_collectives(); });
  size_t expected = 8;
  for (const Parameter* p : state) expected += static_cast<size_t>(p->value.numel()) * sizeof(float);
  if (bytes.size() != expected)
    throw dist::CommError("rank 0's parameters arrived as " + std::to_string(bytes.size()) + " bytes, not " +
                          std::to_string(expected));
  if (world_->is_root()) return;
  int64_t tracked = 0;
  std::memcpy(&tracked, bytes.data(), 8);
  m.set_batches_tracked(tracked);
  size_t at = 8;
  for (Parameter* p : state) {
    std::vector<float> v(static_cast<size_t>(p->value.numel()));
    std::memcpy(v.data(), bytes.data() + at, v.size() * sizeof(float));
    at += v.size() * sizeof(float);
    write_values(p->value, std::move(v));
  }
}

void Trainer::check_same_run_on_every_rank(const Dataset& train) {
  // What every rank must agree on before the first collective: the model, the training settings and the
  // number of local devices (the collectives' shapes and the global batch depend on them).
  std::string mine = "model: " + model_.signature() + "\nlocal devices: " + std::to_string(devices_.size());
  for (const auto& [name, value] : training_settings(train)) mine += "\n" + name + ": " + value;
  const std::vector<std::string> all =
      world_->allgather(mine, "comparing the ranks' training", [this] { return abandon_collectives(); });
  for (size_t r = 1; r < all.size(); ++r) {
    if (all[r] == all[0]) continue;
    std::istringstream a(all[0]), b(all[r]);
    std::string la, lb;
    while (std::getline(a, la) && std::getline(b, lb) && la == lb) {
    }
    throw Error("rank " + std::to_string(r) + " does not train what rank 0 trains: rank 0 has '" + la +
                "', rank " + std::to_string(r) + " '" + lb + "'");
  }
}


void Trainer::step(const HostBatchPtr& batch) {
  // A rank's shard of a short last batch may be empty: it still takes part in the all-reduce and the step.
  // global_size 0 means the batch is not a shard: its size is the whole.
  if (!batch || (batch->size < 1 && !world_) || (batch->global_size != 0 && batch->global_size < batch->size))
    throw Error("training step: empty batch");
  bool done = false;
  if (capturable(*batch)) {
    if (captured_ && captured_->batch == batch->size) {
      replay(batch);
      done = true;
    } else if (!captured_ && uncaptured_steps_ >= kCaptureWarmup) {
      done = capture(batch);
    }
  }
  if (!done) {
    step_by_step(batch);
    ++uncaptured_steps_;
  }
  while (static_cast<int64_t>(in_flight_.size()) > options_.steps_in_flight) {
    auto markers = std::move(in_flight_.front());
    in_flight_.erase(in_flight_.begin());
    for (const VarPtr& v : markers) rt_.engine().wait(v);
  }
}

void Trainer::step_by_step(const HostBatchPtr& batch) {
  const int64_t whole = std::max(batch->global_size, batch->size);
  const std::vector<int64_t> sizes = split(batch->size);
  // Every replica's loss gradient is scaled by 1/(whole batch, over every rank), so the summed gradients are
  // the whole batch's; and by the loss scale when there is one (exactly, for a power of two).
  const float scale = static_cast<float>((loss_scale_ > 0 ? loss_scale_ : 1.0) / static_cast<double>(whole));
  const size_t replicas = replicas_.size();
  std::vector<std::vector<Tensor>> grads(replicas);
  int64_t offset = 0;
  try {
    for (size_t r = 0; r < replicas; ++r) {
      if (sizes[r] > 0) {
        DeviceBatch db = to_device(rt_, batch, offset, offset + sizes[r], devices_[r]);
        forward_backward(r, db.images, db.labels, scale, grads[r]);
        samples_[r] += sizes[r];
      } else {
        // A share of nothing: this replica contributes zero gradients and still takes the common step.
        for (Parameter* p : replicas_[r]->parameters()) {
          p->grad = zeros(rt_, p->value.shape(), devices_[r]);
          grads[r].push_back(p->grad);
        }
      }
      offset += sizes[r];
    }
    if (replicas > 1 || world_)
      for (const auto& bucket : buckets_) {
        std::vector<std::vector<Tensor>> part(replicas);
        for (size_t r = 0; r < replicas; ++r)
          for (size_t i : bucket) part[r].push_back(grads[r][i]);
        reducer_->allreduce(part);
        if (world_)
          for (const Tensor& g : part[0]) world_reduced_bytes_ += g.bytes();
      }
    if (world_) ++world_steps_;
    std::vector<Tensor> clip(replicas);
    const bool update_now = loss_scale_ > 0 ? unscale(grads, clip) : true;
    const int64_t t = update_now ? optimizer_steps_ + 1 : optimizer_steps_;
    std::vector<VarPtr> markers;
    for (size_t r = 0; r < replicas; ++r) {
      if (update_now)
        update(r, grads[r], optimizer_scalars(rt_, devices_[r], options_.optimizer, lr_, t), clip[r]);
      // Marks the end of this step on this device: the host waits on it to stay steps_in_flight ahead.
      std::vector<VarPtr> reads;
      for (Parameter* p : replicas_[r]->parameters()) reads.push_back(p->value.var());
      VarPtr done = new_var();
      rt_.engine().push([](OpContext&) {}, reads, {done}, devices_[r], StreamKind::Compute,
                        {"step done", "", 0, 0});
      markers.push_back(done);
    }
    optimizer_steps_ = t;
    in_flight_.push_back(std::move(markers));
  } catch (...) {
    for (Model* m : replicas_) m->clear_cache();
    throw;
  }
}

int64_t Trainer::forward_backward(size_t r, const Tensor& images, const Tensor& labels, float scale,
                                  std::vector<Tensor>& grads) {
  const ScopedPrecision precision(options_.precision);
  Model& m = *replicas_[r];
  Tensor logits = m.forward(images, Mode::Train);
  CrossEntropy ce =
      softmax_cross_entropy(logits, labels, true, scale, static_cast<float>(options_.label_smoothing));
  m.backward(ce.dlogits);
  add_into(totals_[r], ce.stats);
  for (Parameter* p : m.parameters()) grads.push_back(p->grad);
  return logits.shape()[1];
}

void Trainer::update(size_t r, const std::vector<Tensor>& grads, const Tensor& scalars, Tensor clip) {
  std::vector<Tensor> values;
  for (Parameter* p : replicas_[r]->parameters()) values.push_back(p->value);
  if (values.empty()) return;
  // Each replica measures the norm of its own copy of the summed gradients: equal copies, the same fixed
  // summation order on every device, so the same factor everywhere, with no host read.
  if (!clip.defined() && options_.clip_grad_norm > 0)
    clip = grad_clip_coefficient(grads, static_cast<float>(options_.clip_grad_norm));
  optimizer_step(values, grads, optim_state_[r], options_.optimizer, scalars, clip);
}

// --- captured steps ----------------------------------------------------------------------------------------


namespace {
bool has_dropout(const Model& m) {
  if (m.arch() != Arch::Network) return false;
  for (const LayerSpec& l : m.options().network->layers)
    if (l.kind == LayerKind::Dropout && l.p > 0) return true;
  return false;
}
}  // namespace

bool Trainer::capturable(const HostBatch& batch) {
  if (!capture_off_.empty()) return false;
  const StepCapture mode = options_.capture;
  if (mode == StepCapture::Off || (mode == StepCapture::Auto && !devices_[0].is_cuda())) return false;
  std::string why;
  if (replicas_.size() > 1)
    why = "a captured step runs on one device, and this run trains on " + std::to_string(replicas_.size());
  else if (world_)
    why = "a distributed run's all-reduce joins other processes, which a captured step cannot";
  else if (loss_scale_ > 0)
    why = "loss scaling reads the gradients' norm on the host every step";
  else if (has_dropout(*replicas_[0]))
    why = "dropout draws a new mask every step, and a replay would repeat the captured one";
  else if (batch.global_size != 0 && batch.global_size != batch.size)
    why = "the batch is a shard of a larger one";
  if (why.empty()) return true;
  capture_off_ = why;
  if (warn_) warn_("training steps are not captured for replay: " + why);
  return false;
}

bool Trainer::capture(const HostBatchPtr& batch) {
  // Nothing of the earlier steps may still run: the capture op declares no writes, so that a capture that
  // fails leaves no error on the model's tensors.
  synchronize();
  Model& m = *replicas_[0];
  const Device d = devices_[0];
  const int64_t n = batch->size;
  auto c = std::make_shared<CapturedStep>();
  c->batch = n;
  c->inputs = {Tensor(rt_, {n, batch->channels, batch->height, batch->width}, d), Tensor(rt_, {n}, d)};
  copy_batch_into(batch, 0, c->inputs);
  const int64_t t = optimizer_steps_ + 1;
  c->scalars = optimizer_scalars(rt_, d, options_.optimizer, lr_, t);
  const float scale = 1.0f / static_cast<float>(n);
  const int64_t tracked = m.batches_tracked();
  Backend* backend = &rt_.backend(d);
  Allocator* allocator = &rt_.allocator(d);
  std::vector<Tensor> grads;
  std::string refused;
  VarPtr done = new_var();
  // The step's code runs on the device's compute worker, inside this op, while this thread waits.
  rt_.engine().push(
      [&](OpContext& ctx) {
        try {
          c->work = backend->capture(
              [&] {
                c->classes = forward_backward(0, c->inputs.images, c->inputs.labels, scale, grads);
                update(0, grads, c->scalars, Tensor());
              },
              ctx, *allocator);
        } catch (const CaptureError& e) {
          refused = e.what();
        }
      },
      {c->inputs.images.var(), c->inputs.labels.var(), c->scalars.var()}, {done}, d, StreamKind::Compute,
      {"capture training step", "", 0, 0});
  try {
    rt_.engine().wait(done);
  } catch (...) {
    m.clear_cache();
    throw;
  }
  if (!refused.empty()) {
    m.clear_cache();
    m.set_batches_tracked(tracked);
    capture_off_ = refused;
    if (warn_) warn_("training goes on step by step: " + refused);
    return false;
  }
  for (Parameter* p : m.state()) c->writes.push_back(p->value.var());
  for (const OptimizerState& st : optim_state_[0])
    for (const Tensor* x : {&st.a, &st.b})
      if (x->defined()) c->writes.push_back(x->var());
  for (const Tensor& g : grads) c->writes.push_back(g.var());
  c->writes.push_back(totals_[0].var());
  captured_ = std::move(c);
  samples_[0] += n;
  optimizer_steps_ = t;
  ++replayed_steps_;
  return true;
}

void Trainer::replay(const HostBatchPtr& batch) {
  const CapturedStep& c = *captured_;
  Model& m = *replicas_[0];
  // What the captured loss cannot report (a GPU graph reads nothing back): a label that is no class.
  for (int64_t i = 0; i < batch->size; ++i) {
    const float label = batch->labels[i];
    if (!(label >= 0 && label < static_cast<float>(c.classes)) || label != std::floor(label))
      throw Error("softmax_cross_entropy: the label at row " + std::to_string(i) + " is not a class index in [0, " +
                  std::to_string(c.classes) + ")");
  }
  copy_batch_into(batch, 0, c.inputs);
  const int64_t t = optimizer_steps_ + 1;
  write_optimizer_scalars(c.scalars, options_.optimizer, lr_, t);
  VarPtr done = new_var();
  std::vector<VarPtr> writes = c.writes;
  writes.push_back(done);
  std::shared_ptr<CapturedWork> work = c.work;
  rt_.engine().push([work](OpContext& ctx) { work->replay(ctx); },
                    {c.inputs.images.var(), c.inputs.labels.var(), c.scalars.var()}, std::move(writes),
                    devices_[0], StreamKind::Compute, {"training step (replay)", "", 0, 0});
  samples_[0] += batch->size;
  optimizer_steps_ = t;
  m.set_batches_tracked(m.batches_tracked() + 1);  // what the captured forward counted on the host
  ++replayed_steps_;
  in_flight_.push_back({done});
}

std::string Trainer::capture_status() const {
  if (captured_) return "replaying " + captured_->work->describe();
  if (!capture_off_.empty()) return "step by step: " + capture_off_;
  if (!released_capture_.empty()) return "replayed " + released_capture_;
  return "step by step";
}

bool Trainer::unscale(const std::vector<std::vector<Tensor>>& grads, std::vector<Tensor>& clip) {
  // Every replica holds the same summed gradients (every rank's too, in a distributed run), so replica 0's
  // norm decides for all of them, identically on every rank. Its sum of squares runs in double: an overflow
  // of the float32 gradients shows as an inf or NaN norm.
  std::vector<Tensor> all;
  for (const Tensor& g : grads[0])
    if (g.defined()) all.push_back(g);
  const float scaled_norm = all.empty() ? 0.0f : to_host(grad_clip_coefficient(all, 1.0f))[0];
  const double scale = loss_scale_;
  const LossScaleOptions& o = options_.loss_scale;
  if (!std::isfinite(scaled_norm)) {
    loss_scale_ *= o.backoff;
    loss_scale_good_steps_ = 0;
    ++skipped_steps_;
    return false;
  }
  if (++loss_scale_good_steps_ >= o.interval) {
    loss_scale_ *= o.growth;
    loss_scale_good_steps_ = 0;
  }
  // PyTorch unscales (g / scale) and then clips with the unscaled norm, in float32; one factor does both, to
  // the same floats when the scale is a power of two.
  const float inv = static_cast<float>(1.0 / scale);
  const float norm = scaled_norm * inv;
  float factor = inv;
  if (options_.clip_grad_norm > 0) {
    const float q = static_cast<float>(options_.clip_grad_norm) / (norm + 1e-6f);
    if (q < 1.0f) factor = q * inv;
  }
  for (size_t r = 0; r < clip.size(); ++r) {
    clip[r] = Tensor(rt_, {2}, devices_[r]);
    write_values(clip[r], {norm, factor});
  }
  return true;
}

void Trainer::synchronize() {
  auto pending = std::move(in_flight_);
  in_flight_.clear();
  for (auto& markers : pending)
    for (const VarPtr& v : markers) rt_.engine().wait(v);
}

StepTotals Trainer::totals() {
  StepTotals t;
  for (size_t r = 0; r < replicas_.size(); ++r) {
    auto v = to_host(totals_[r]);
    t.loss_sum += v[0];
    t.correct += v[1];
    t.samples += samples_[r];
  }
  if (world_) {
    // Every rank calls this at the same batches, so the sums over the ranks are everyone's numbers.
    double sums[3] = {t.loss_sum, t.correct, static_cast<double>(t.samples)};
    world_->allreduce_sum(sums, 3, "summing the loss over the ranks", dist::World::Channel::Host,
                          [this] { return abandon_collectives(); });
    t = {sums[0], sums[1], static_cast<int64_t>(sums[2])};
  }
  return t;
}

void Trainer::reset_totals() {
  // In place: a captured step accumulates into these very tensors.
  for (const Tensor& t : totals_) write_values(t, {0.0f, 0.0f});
  std::fill(samples_.begin(), samples_.end(), 0);
}

double Trainer::evaluate(const DatasetPtr& data) {
  if (!data || data->count == 0) throw Error("evaluate: empty dataset");
  const ScopedPrecision precision(options_.precision);
  // DataParallel semantics: every replica evaluates with device 0's BatchNorm running statistics.
  {
    auto src = replicas_[0]->state();
    for (size_t r = 1; r < replicas_.size(); ++r) {
      auto dst = replicas_[r]->state();
      for (size_t i = 0; i < src.size(); ++i)
        if (!src[i]->trainable) copy_into(dst[i]->value, src[i]->value);
    }
  }
  LoaderOptions lo;
  lo.batch_size = options_.eval_batch_size > 0 ? options_.eval_batch_size : options_.batch_size;
  lo.shuffle = false;
  lo.resize = options_.resize;
  lo.pinned = std::any_of(devices_.begin(), devices_.end(), [](Device d) { return d.is_cuda(); });
  if (world_) lo.shard = world_->rank(), lo.shards = world_->size();
  DataLoader loader(data, lo);
  loader.start_epoch(0);
  std::vector<Tensor> correct;
  for (Device d : devices_) correct.push_back(zeros(rt_, {2}, d));
  std::vector<VarPtr> recent;  // one var per batch, to keep the host two batches ahead at most
  while (HostBatchPtr batch = loader.next()) {
    if (abandon_collectives()) throw CancelledError();
    const auto sizes = split(batch->size);
    int64_t offset = 0;
    for (size_t r = 0; r < replicas_.size(); ++r) {
      if (sizes[r] == 0) continue;
      DeviceBatch db = to_device(rt_, batch, offset, offset + sizes[r], devices_[r]);
      Tensor logits = replicas_[r]->forward(db.images, Mode::Eval);
      correct[r] = add(correct[r], softmax_cross_entropy(logits, db.labels, false).stats);
      recent.push_back(correct[r].var());
      offset += sizes[r];
    }
    while (recent.size() > 2 * replicas_.size()) {
      rt_.engine().wait(recent.front());
      recent.erase(recent.begin());
    }
  }
  double total = 0;
  for (const Tensor& c : correct) total += to_host(c)[1];
  if (world_)
    world_->allreduce_sum(&total, 1, "summing the accuracy over the ranks", dist::World::Channel::Host,
                          [this] { return abandon_collectives(); });
  return total / static_cast<double>(data->count);
}

void Trainer::rebalance(size_t span_cursor, const std::vector<int64_t>& samples) {
  // Each device's rate is the samples it processed over the time its compute stream was busy.
  std::vector<double> busy(devices_.size(), 0.0);
  for (const Span& s : rt_.profiler().spans(span_cursor)) {
    if (s.stream != StreamKind::Compute) continue;
    for (size_t r = 0; r < devices_.size(); ++r)
      if (s.device == devices_[r]) busy[r] += s.end_us - s.start_us;
  }
  std::vector<double> rate(devices_.size());
  for (size_t r = 0; r < devices_.size(); ++r) {
    if (samples[r] == 0 || busy[r] <= 0) return;  // nothing measured for a device: keep the split
    rate[r] = static_cast<double>(samples[r]) / busy[r];
  }
  set_shares(rate);
}

void Trainer::finish_to_model() {
  if (replicas_[0] != &model_) model_.copy_state_from(*replicas_[0]);
  // The other replicas get device 0's BatchNorm statistics too, so they all agree after training.
  auto src = replicas_[0]->state();
  for (size_t r = 1; r < replicas_.size(); ++r) {
    auto dst = replicas_[r]->state();
    for (size_t i = 0; i < src.size(); ++i)
      if (!src[i]->trainable) copy_into(dst[i]->value, src[i]->value);
  }
}

// --- checkpoints
// --------------------------------------------------------------------------------------------

namespace {

std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// Refuses, before any training, a checkpoint directory that cannot be made or written: finding out at the
// end of the first epoch would cost the epoch.
void prepare_checkpoint_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw Error("checkpoint_dir " + dir + ": cannot create it (" + ec.message() + ")");
  if (!fs::is_directory(dir, ec)) throw Error("checkpoint_dir " + dir + ": it is not a directory");
  const std::string probe = (fs::path(dir) / ".gpunodes-write-test").string();
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error("checkpoint_dir " + dir + ": cannot write there (" + std::strerror(errno) + ")");
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace

struct Trainer::Resumed {
  int64_t epoch = 0, batch = 0, global_step = 0;
  double seconds = 0, epoch_seconds = 0;
};

std::vector<std::pair<std::string, std::string>> Trainer::training_settings(const Dataset& train) const {
  const OptimizerOptions& o = options_.optimizer;
  const ScheduleOptions& s = options_.schedule;
  std::vector<std::pair<std::string, std::string>> out{
      {"optimizer", optimizer_name(o.kind)},
      {"lr", exact(o.lr)},
      {"weight_decay", exact(o.weight_decay)},
      {"momentum", exact(o.momentum)},
      {"dampening", exact(o.dampening)},
      {"nesterov", o.nesterov ? "true" : "false"},
      {"beta1", exact(o.beta1)},
      {"beta2", exact(o.beta2)},
      {"eps", exact(o.eps)},
      {"schedule", schedule_name(s.kind)},
      {"warmup_epochs", std::to_string(s.warmup_epochs)},
      {"step_size", std::to_string(s.step_size)},
      {"gamma", exact(s.gamma)},
      {"min_lr", exact(s.min_lr)},
      {"clip_grad_norm", exact(options_.clip_grad_norm)},
      {"label_smoothing", exact(options_.label_smoothing)},
      {"batch_size", std::to_string(options_.batch_size)},
      {"shuffle_seed", std::to_string(options_.shuffle_seed)},
      {"resize", std::to_string(options_.resize)},
      {"dataset", train.name},
      {"train_samples", std::to_string(train.count)},
      {"augment_crop_padding", std::to_string(train.transform.crop_padding)},
      {"augment_flip", train.transform.flip ? "true" : "false"},
  };
  // Recorded where they differ from the defaults, so that checkpoints from before they existed still resume.
  if (options_.precision != Precision::Fp32) out.emplace_back("precision", precision_name(options_.precision));
  if (const LossScaleOptions& ls = options_.loss_scale; ls.enabled(options_.precision)) {
    out.emplace_back("loss_scale", "dynamic");
    out.emplace_back("loss_scale_init", exact(ls.init));
    out.emplace_back("loss_scale_growth", exact(ls.growth));
    out.emplace_back("loss_scale_backoff", exact(ls.backoff));
    out.emplace_back("loss_scale_interval", std::to_string(ls.interval));
  }
  // Cosine and one-cycle rates depend on the run's length; the others do not, so a finished run with them
  // can be resumed with more epochs to train on.
  if (s.kind == ScheduleKind::Cosine || s.kind == ScheduleKind::OneCycle)
    out.emplace_back("epochs", std::to_string(options_.epochs));
  return out;
}

void Trainer::save_checkpoint(const Dataset& train, int64_t epoch, int64_t batch, double seconds,
                              double epoch_seconds, size_t history_size, TrainResult& result) {
  // The totals are summed over the ranks, so every rank takes part; then rank 0 alone writes, as every rank
  // holds the same state.
  const StepTotals totals_so_far = batch > 0 ? totals() : StepTotals{};
  if (world_ && !world_->is_root()) return;
  const CheckpointOptions& ck = options_.checkpoint;
  Model& m = *replicas_[0];
  TrainingCheckpoint c;
  c.signature = m.signature();
  c.settings = training_settings(train);
  c.epoch = epoch;
  c.batch = batch;
  c.global_step = epoch * batches_per_epoch_ + batch;
  c.optimizer_steps = optimizer_steps_;
  c.loss_scale = loss_scale_;
  c.loss_scale_good_steps = loss_scale_good_steps_;
  c.skipped_steps = skipped_steps_;
  c.batches_tracked = m.batches_tracked();
  c.seconds = seconds;
  c.epoch_seconds = epoch_seconds;
  c.totals = totals_so_far;
  c.shares = shares_;
  c.epochs = result.epochs;
  c.metrics.assign(history_.begin(), history_.begin() + static_cast<std::ptrdiff_t>(history_size));
  for (const Parameter* p : m.state()) c.state.push_back({p->name, p->value.shape(), to_host(p->value)});
  const auto params = m.parameters();
  for (size_t i = 0; i < params.size() && !optim_state_[0].empty(); ++i) {
    const OptimizerState& st = optim_state_[0][i];
    if (st.a.defined()) c.optimizer.push_back({params[i]->name + "/0", st.a.shape(), to_host(st.a)});
    if (st.b.defined()) c.optimizer.push_back({params[i]->name + "/1", st.b.shape(), to_host(st.b)});
  }
  const std::string path = (std::filesystem::path(ck.dir) / checkpoint_file_name(epoch, batch)).string();
  write_checkpoint(path, c);
  result.checkpoints.push_back(path);
  // Oldest beyond `keep` go, the one just written never.
  const std::vector<CheckpointFile> all = list_checkpoints(ck.dir);
  for (size_t k = static_cast<size_t>(std::max<int64_t>(ck.keep, 1)); k < all.size(); ++k) {
    std::error_code ec;
    if (all[k].path != path) std::filesystem::remove(all[k].path, ec);
  }
}

Trainer::Resumed Trainer::resume_from_checkpoint(const Dataset& train, const MetricCallback& on_metric,
                                                 const WarningCallback& on_warning, TrainResult& result) {
  const std::string& dir = options_.checkpoint.dir;
  for (const CheckpointFile& f : list_checkpoints(dir)) {
    TrainingCheckpoint c;
    std::vector<std::pair<Parameter*, const TrainingCheckpoint::Values*>> state;
    std::map<std::string, const TrainingCheckpoint::Values*> optimizer;
    try {
      c = read_checkpoint(f.path);
      if (c.epoch != f.epoch || c.batch != f.batch)
        throw Error("checkpoint " + f.path + " is corrupt: it holds epoch " + std::to_string(c.epoch) +
                    ", batch " + std::to_string(c.batch) + ", not what its name says");
      if (c.signature == model_.signature()) {
        // The same model must have the same state, name by name and shape by shape: anything else is damage.
        std::map<std::string, const TrainingCheckpoint::Values*> by_name;
        for (const auto& v : c.state) by_name.emplace(v.name, &v);
        for (Parameter* p : model_.state()) {
          const auto it = by_name.find(p->name);
          if (it == by_name.end() || it->second->shape != p->value.shape() ||
              static_cast<int64_t>(it->second->values.size()) != p->value.numel())
            throw Error("checkpoint " + f.path + " is corrupt: its '" + p->name + "' is missing or not " +
                        shape_str(p->value.shape()));
          state.emplace_back(p, it->second);
        }
        if (state.size() != c.state.size())
          throw Error("checkpoint " + f.path + " is corrupt: it holds state the model does not have");
        std::map<std::string, Shape> shapes;
        for (Parameter* p : model_.parameters()) shapes.emplace(p->name, p->value.shape());
        for (const auto& v : c.optimizer) {
          const size_t slash = v.name.rfind('/');
          const auto it = shapes.find(v.name.substr(0, slash == std::string::npos ? 0 : slash));
          if (it == shapes.end() || it->second != v.shape ||
              static_cast<int64_t>(v.values.size()) != checked_numel(v.shape))
            throw Error("checkpoint " + f.path + " is corrupt: optimizer state '" + v.name +
                        "' belongs to no parameter of that shape");
          optimizer.emplace(v.name, &v);
        }
      }
    } catch (const CancelledError&) {
      throw;
    } catch (const Error& e) {
      if (on_warning) on_warning(std::string(e.what()) + "; skipped it");
      continue;
    }
    if (std::string why = checkpoint_mismatch(c, model_.signature(), training_settings(train)); !why.empty())
      throw Error("resume: checkpoint " + f.path + " is of another run: " + why +
                  ". Set resume to off, or use another checkpoint_dir, to start afresh");
    if (c.epoch > options_.epochs || (c.epoch == options_.epochs && c.batch > 0) ||
        c.batch > batches_per_epoch_)
      throw Error("resume: checkpoint " + f.path + " is at epoch " + std::to_string(c.epoch) + ", batch " +
                  std::to_string(c.batch) + ", past this run's " + std::to_string(options_.epochs) +
                  " epochs of " + std::to_string(batches_per_epoch_) + " batches");

    // Into the model, from which fit()'s broadcast() copies it to every replica; the optimizer state goes
    // to every replica directly, as each keeps its own.
    for (auto& [p, v] : state) write_values(p->value, v->values);
    model_.set_batches_tracked(c.batches_tracked);
    for (size_t r = 0; r < replicas_.size(); ++r) {
      const auto params = replicas_[r]->parameters();
      optim_state_[r].assign(params.size(), OptimizerState());
      for (size_t i = 0; i < params.size(); ++i)
        for (int slot = 0; slot < 2; ++slot) {
          const auto it = optimizer.find(params[i]->name + "/" + std::to_string(slot));
          if (it == optimizer.end()) continue;
          Tensor t(rt_, it->second->shape, devices_[r]);
          write_values(t, it->second->values);
          (slot == 0 ? optim_state_[r][i].a : optim_state_[r][i].b) = t;
        }
    }
    optimizer_steps_ = c.optimizer_steps;
    // The settings matched, so the checkpoint has a scale exactly when this run scales.
    if (loss_scale_ > 0) {
      loss_scale_ = c.loss_scale;
      loss_scale_good_steps_ = c.loss_scale_good_steps;
      skipped_steps_ = c.skipped_steps;
    }
    if (c.shares.size() == devices_.size()) set_shares(c.shares);
    reset_totals();
    if (c.batch > 0) {
      write_values(totals_[0], {static_cast<float>(c.totals.loss_sum), static_cast<float>(c.totals.correct)});
      samples_[0] = c.totals.samples;
    }
    result.epochs = c.epochs;
    result.resumed_from = f.path;
    for (const MetricSample& m : c.metrics)
      if (on_metric) on_metric(m);
    history_ = std::move(c.metrics);
    return {c.epoch, c.batch, c.global_step, c.seconds, c.epoch_seconds};
  }
  return {};
}

TrainResult Trainer::fit(const DatasetPtr& train, const DatasetPtr& test, const MetricCallback& on_metric,
                         const WarningCallback& on_warning) {
  if (!train || train->count == 0) throw Error("training: empty training set");
  const CheckpointOptions& ck = options_.checkpoint;
  const bool checkpoints = !ck.dir.empty();
  if (checkpoints) prepare_checkpoint_dir(ck.dir);
  TrainResult result;
  history_.clear();
  LoaderOptions lo;
  lo.batch_size = options_.batch_size;
  lo.shuffle = true;
  lo.seed = options_.shuffle_seed;
  lo.resize = options_.resize;
  lo.pinned = std::any_of(devices_.begin(), devices_.end(), [](Device d) { return d.is_cuda(); });
  if (world_) lo.shard = world_->rank(), lo.shards = world_->size();
  DataLoader loader(train, lo);
  const int64_t batches = batches_per_epoch_ = loader.batches_per_epoch();
  const size_t fit_spans = rt_.profiler().span_count();

  Resumed from;
  int64_t global_step = 0;
  auto t_fit = Clock::now();
  auto now = [&] { return from.seconds + seconds_since(t_fit); };
  auto emit = [&](const std::string& series, double epoch, double value) {
    MetricSample s{series, epoch, global_step, now(), value};
    if (checkpoints) history_.push_back(s);
    if (on_metric) on_metric(s);
  };
  // The trainer's own cancel with checkpoints: the steps in flight finish and the state is saved, so that a
  // resumed run loses nothing. The engine's cancel drops queued ops, after which there is nothing whole to
  // save.
  bool saved_at_cancel = false;
  auto stop = [&](int64_t epoch, int64_t batch, double epoch_seconds, size_t history_size) {
    if (checkpoints && cancel_requested_ && !rt_.engine().cancelled()) {
      synchronize();
      save_checkpoint(*train, epoch, batch, now(), epoch_seconds, history_size, result);
      saved_at_cancel = true;
    }
    throw CancelledError();
  };
  auto stop_requested = [&] { return cancel_requested_.load() || rt_.engine().cancelled(); };
  // Ranks hear a cancel at different batches. With checkpoints they agree at each batch whether any of them
  // was asked to stop (one 8-byte all-reduce), so that all stop at the same batch and the checkpoint rank 0
  // saves is where every rank is; between those points a rank's cancel waits (abandon_collectives).
  agreed_stops_ = world_ && checkpoints;
  warn_ = on_warning;
  struct EndOfFit {
    bool& agreed;
    WarningCallback& warn;
    ~EndOfFit() {
      agreed = false;  // evaluate() outside fit() hears a cancel at once
      warn = nullptr;
    }
  } end_of_fit{agreed_stops_, warn_};
  auto stop_agreed = [&] {
    if (!agreed_stops_ || rt_.engine().cancelled()) return stop_requested();
    double asked = cancel_requested_ ? 1.0 : 0.0;
    world_->allreduce_sum(&asked, 1, "agreeing whether to stop", dist::World::Channel::Host,
                          [this] { return rt_.engine().cancelled(); });
    if (asked > 0) cancel_requested_ = true;
    return asked > 0;
  };
  try {
    if (world_) check_same_run_on_every_rank(*train);
    if (ck.resume && checkpoints) {
      from = resume_from_checkpoint(*train, on_metric, on_warning, result);
      global_step = from.global_step;
      t_fit = Clock::now();
      if (world_) {
        const std::string name = std::filesystem::path(result.resumed_from).filename().string();
        const auto all = world_->allgather(name, "comparing the checkpoints the ranks resume from");
        for (size_t r = 1; r < all.size(); ++r)
          if (all[r] != all[0])
            throw Error("resume: rank " + std::to_string(r) + " found checkpoint '" + all[r] +
                        "' but rank 0 '" + all[0] + "': every rank must see the same checkpoint_dir");
      }
    }
    broadcast();
    for (int64_t epoch = from.epoch; epoch < options_.epochs; ++epoch) {
      const bool resumed = epoch == from.epoch && from.batch > 0;
      if (!resumed) reset_totals();
      const int64_t first = resumed ? from.batch : 0;
      const double seconds_before = resumed ? from.epoch_seconds : 0.0;
      loader.start_epoch(epoch, first);
      const auto t_epoch = Clock::now();
      auto epoch_seconds = [&] { return seconds_before + seconds_since(t_epoch); };
      const int64_t samples_before = std::accumulate(samples_.begin(), samples_.end(), int64_t(0));
      const int64_t prepared_before = loader.batches_prepared();
      const double prepare_ms_before = loader.ms_per_batch() * static_cast<double>(prepared_before);
      size_t span_cursor = rt_.profiler().span_count();
      std::vector<int64_t> balance_base = samples_;
      int64_t b = first;
      double wait_ms = 0;
      while (true) {
        if (stop_agreed()) stop(epoch, b, epoch_seconds(), history_.size());
        const auto t_wait = Clock::now();
        HostBatchPtr batch = loader.next();
        wait_ms += 1e3 * seconds_since(t_wait);
        if (!batch) break;
        set_lr(scheduled_lr(options_.schedule, options_.optimizer.lr, global_step, batches, options_.epochs));
        step(batch);
        ++b, ++global_step;
        const double x = static_cast<double>(epoch) + static_cast<double>(b) / static_cast<double>(batches);
        if (options_.log_every > 0 && b % options_.log_every == 0 && b < batches) {
          StepTotals t = totals();
          emit("loss", x, t.loss());
          emit("train_acc", x, t.accuracy());
          const int64_t local = std::accumulate(samples_.begin(), samples_.end(), int64_t(0));
          emit("images_per_second", x,
               static_cast<double>((world_ ? local : t.samples) - samples_before) / seconds_since(t_epoch));
          emit("lr", x, lr_);
          if (loss_scale_ > 0) emit("loss_scale", x, loss_scale_);
          if (options_.balance && devices_.size() > 1) {
            std::vector<int64_t> done(samples_.size());
            for (size_t r = 0; r < done.size(); ++r) done[r] = samples_[r] - balance_base[r];
            rebalance(span_cursor, done);
            span_cursor = rt_.profiler().span_count();
            balance_base = samples_;
          }
        }
      }
      synchronize();
      EpochResult er;
      er.epoch = epoch + 1;
      er.seconds = epoch_seconds();
      StepTotals t = totals();
      er.train_loss = t.loss();
      er.train_acc = t.accuracy();
      // This process's share of the epoch: a resumed epoch's earlier batches ran at another time. (t counts
      // every rank's samples; samples_ this rank's.)
      const int64_t local_samples = std::accumulate(samples_.begin(), samples_.end(), int64_t(0));
      const double trained_here = static_cast<double>((world_ ? local_samples : t.samples) - samples_before);
      er.images_per_second = trained_here / seconds_since(t_epoch);
      const int64_t prepared = loader.batches_prepared() - prepared_before;
      if (prepared > 0)
        er.loader_ms_per_batch =
            (loader.ms_per_batch() * static_cast<double>(loader.batches_prepared()) - prepare_ms_before) /
            static_cast<double>(prepared);
      if (b > first) er.step_ms = 1e3 * seconds_since(t_epoch) / static_cast<double>(b - first);
      er.loader_wait_ms = wait_ms;
      const double x = static_cast<double>(epoch + 1);
      // A cancel during the evaluation saves the epoch as trained but not evaluated: the resumed run says
      // the epoch's numbers once, after evaluating.
      const size_t history_trained = history_.size();
      emit("loss", x, er.train_loss);
      emit("train_acc", x, er.train_acc);
      emit("images_per_second", x, er.images_per_second);
      emit("epoch_seconds", x, er.seconds);
      emit("lr", x, lr_);
      if (loss_scale_ > 0) emit("loss_scale", x, loss_scale_);
      if (options_.balance && devices_.size() > 1) {
        std::vector<int64_t> done(samples_.size());
        for (size_t r = 0; r < done.size(); ++r) done[r] = samples_[r] - balance_base[r];
        rebalance(span_cursor, done);
      }
      if (devices_.size() > 1)
        for (size_t r = 0; r < devices_.size(); ++r) emit("share/" + devices_[r].str(), x, shares_[r]);
      if (test && test->count > 0) {
        try {
          if (stop_agreed()) throw CancelledError();
          er.test_acc = evaluate(test);
        } catch (const CancelledError&) {
          stop(epoch, batches, er.seconds, history_trained);
        }
        emit("test_acc", x, er.test_acc);
      }
      for (Device d : devices_) {
        MemoryStats m = rt_.memory_stats(d);
        emit("memory_mb/" + d.str(), x, static_cast<double>(m.allocated_bytes.current) / (1 << 20));
        emit("peak_memory_mb/" + d.str(), x, static_cast<double>(m.allocated_bytes.peak) / (1 << 20));
      }
      result.epochs.push_back(er);
      if (checkpoints && ck.every > 0 && ((epoch + 1) % ck.every == 0 || epoch + 1 == options_.epochs))
        save_checkpoint(*train, epoch + 1, 0, now(), 0.0, history_.size(), result);
    }
    finish_to_model();
    synchronize();
    release_step_state();
    if (world_) {
      // Each rank's speed and its time in the all-reduce, for rank 0's report.
      double allreduce_us = 0;
      for (const Span& sp : rt_.profiler().spans(fit_spans))
        if (sp.name.compare(0, 10, "all-reduce") == 0) allreduce_us += sp.end_us - sp.start_us;
      const double ips = result.epochs.empty() ? 0.0 : result.epochs.back().images_per_second;
      double parameter_bytes = 0;
      for (const Parameter* p : model_.parameters()) parameter_bytes += static_cast<double>(p->value.bytes());
      const double per_step =
          world_steps_ ? static_cast<double>(world_reduced_bytes_) / static_cast<double>(world_steps_) : 0.0;
      char mine[128];
      std::snprintf(mine, sizeof mine, "%.17g %.17g %.17g %.17g", ips, allreduce_us / 1e3, per_step,
                    parameter_bytes);
      const auto all = world_->allgather(mine, "gathering the ranks' speeds");
      for (size_t r = 0; r < all.size(); ++r) {
        RankStats st;
        st.rank = static_cast<int>(r);
        std::istringstream(all[r]) >> st.images_per_second >> st.allreduce_ms >>
            st.allreduce_bytes_per_step >> st.parameter_bytes;
        result.ranks.push_back(st);
      }
    }
  } catch (...) {
    loader.stop();
    drain();
    history_.clear();
    if (checkpoints && cancel_requested_ && !saved_at_cancel && on_warning)
      on_warning(
          "no checkpoint was saved at the cancel: the steps in flight were dropped before they finished" +
          std::string(result.checkpoints.empty() && result.resumed_from.empty()
                          ? ""
                          : "; the newest checkpoint is " + (result.checkpoints.empty()
                                                                 ? result.resumed_from
                                                                 : result.checkpoints.back())));
    // The engine's cancel surfaces as errors of the dropped ops; report it as the cancel it is. The trainer's
    // own cancel is spent: a later fit() trains.
    if (stop_requested()) {
      cancel_requested_ = false;
      throw CancelledError();
    }
    throw;
  }
  history_.clear();
  return result;
}

double evaluate(Model& model, const DatasetPtr& data, int64_t batch_size, int64_t resize) {
  TrainOptions o;
  o.batch_size = batch_size;
  o.resize = resize;
  Trainer t(model, {model.device()}, o);
  return t.evaluate(data);
}

}  // namespace gn::nn
