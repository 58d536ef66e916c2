#include "step_capture.h"

#include <cmath>

#include "gpunodes/backend.h"
#include "gpunodes/errors.h"

namespace gn::nn {

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

}  // namespace gn::nn

namespace gn::nn::trainer_parts {
namespace {

bool has_dropout(const Model& m) {
  if (m.arch() != Arch::Network) return false;
  for (const LayerSpec& l : m.options().network->layers)
    if ((l.kind == LayerKind::Dropout && l.p > 0) || (is_recurrent(l.kind) && l.dropout > 0 && l.num_layers > 1))
      return true;
  return false;
}

}  // namespace

std::string capture_obstacle(size_t devices, bool distributed, bool loss_scaling, bool regression,
                             bool carries_state, const Model& model, const HostBatch& batch) {
  if (devices > 1)
    return "a captured step runs on one device, and this run trains on " + std::to_string(devices);
  if (distributed)
    return "a distributed run's all-reduce joins other processes, which a captured step cannot";
  if (loss_scaling) return "loss scaling reads the gradients' norm on the host every step";
  if (has_dropout(model))
    return "dropout draws a new mask every step, and a replay would repeat the captured one";
  if (regression) return "a replay checks class labels on the host, and a regression has target values";
  if (carries_state)
    return "the recurrent state is carried from batch to batch, and a replay would start from the captured one";
  if (batch.global_size != 0 && batch.global_size != batch.size)
    return "the batch is a shard of a larger one";
  return {};
}

// What a captured step reads (its batch and scalars) and writes, and its work.
struct StepCapturer::Captured {
  int64_t batch = 0, classes = 0;
  DeviceBatch inputs;          // each replay's batch is copied in
  Tensor scalars;              // each replay's optimizer scalars are written in
  std::vector<VarPtr> writes;  // parameters, buffers, optimizer state, gradients, totals
  std::shared_ptr<CapturedWork> work;
};

StepCapturer::StepCapturer(Runtime& rt, StepCapture mode, Device device)
    : rt_(rt), mode_(mode), device_(device) {}

bool StepCapturer::wanted(const std::string& obstacle, const WarningCallback& warn) {
  if (!off_.empty()) return false;
  if (mode_ == StepCapture::Off || (mode_ == StepCapture::Auto && !device_.is_cuda())) return false;
  if (obstacle.empty()) return true;
  off_ = obstacle;
  if (warn) warn("training steps are not captured for replay: " + obstacle);
  return false;
}

bool StepCapturer::can_replay(int64_t batch_size) const {
  return captured_ && captured_->batch == batch_size;
}

bool StepCapturer::ready_to_capture() const {
  return !captured_ && uncaptured_steps_ >= kCaptureWarmup;
}

bool StepCapturer::capture(const HostBatchPtr& batch, Model& model, const Tensor& scalars,
                           const StepBody& body, const std::vector<OptimizerState>& optimizer_state,
                           const Tensor& totals, const std::function<void()>& wait_for_earlier_steps,
                           const WarningCallback& warn) {
  // Nothing of the earlier steps may still run: the capture op declares no writes, so that a capture that
  // fails leaves no error on the model's tensors.
  wait_for_earlier_steps();
  const Device d = device_;
  const int64_t n = batch->size;
  auto c = std::make_shared<Captured>();
  c->batch = n;
  Shape images = batch->sample_dims(), labels = batch->target_shape;
  images.insert(images.begin(), n);
  labels.insert(labels.begin(), n);
  c->inputs = {Tensor(rt_, images, d), Tensor(rt_, labels, d)};
  copy_batch_into(batch, 0, c->inputs);
  c->scalars = scalars;
  const int64_t tracked = model.batches_tracked();
  Backend* backend = &rt_.backend(d);
  Allocator* allocator = &rt_.allocator(d);
  std::vector<Tensor> grads;
  std::string refused;
  VarPtr done = new_var();
  // The step's code runs on the device's compute worker, inside this op, while this thread waits.
  rt_.engine().push(
      [&](OpContext& ctx) {
        try {
          c->work =
              backend->capture([&] { c->classes = body(c->inputs, c->scalars, grads); }, ctx, *allocator);
        } catch (const CaptureError& e) {
          refused = e.what();
        }
      },
      {c->inputs.images.var(), c->inputs.labels.var(), c->scalars.var()}, {done}, d, StreamKind::Compute,
      {"capture training step", "", 0, 0});
  try {
    rt_.engine().wait(done);
  } catch (...) {
    model.clear_cache();
    throw;
  }
  if (!refused.empty()) {
    model.clear_cache();
    model.set_batches_tracked(tracked);
    off_ = refused;
    if (warn) warn("training goes on step by step: " + refused);
    return false;
  }
  for (Parameter* p : model.state()) c->writes.push_back(p->value.var());
  for (const OptimizerState& st : optimizer_state)
    for (const Tensor* x : {&st.a, &st.b})
      if (x->defined()) c->writes.push_back(x->var());
  for (const Tensor& g : grads) c->writes.push_back(g.var());
  c->writes.push_back(totals.var());
  // Every replay op holds the work and, through it, all the memory the step reads and writes: a trainer that
  // goes away with replays queued must not return that memory while a replay (a CUDA graph's raw pointers)
  // may still use it. The CPU's recorded op bodies hold their tensors too; this is the same guarantee.
  std::vector<std::shared_ptr<Storage>> held{c->inputs.images.storage(), c->inputs.labels.storage(),
                                             c->scalars.storage(), totals.storage()};
  for (Parameter* p : model.state()) held.push_back(p->value.storage());
  for (const OptimizerState& st : optimizer_state)
    for (const Tensor* x : {&st.a, &st.b})
      if (x->defined()) held.push_back(x->storage());
  for (const Tensor& g : grads)
    if (g.defined()) held.push_back(g.storage());
  c->work->hold(std::move(held));
  captured_ = std::move(c);
  ++replayed_steps_;
  return true;
}

VarPtr StepCapturer::replay(const HostBatchPtr& batch, Model& model, const OptimizerOptions& optimizer,
                            double lr, int64_t step) {
  const Captured& c = *captured_;
  // What the captured loss cannot report (a GPU graph reads nothing back): a label that is no class.
  const int64_t labels = batch->size * batch->target_numel();
  for (int64_t i = 0; i < labels; ++i) {
    const float label = batch->labels[i];
    if (!(label >= 0 && label < static_cast<float>(c.classes)) || label != std::floor(label))
      throw Error("softmax_cross_entropy: the label at row " + std::to_string(i) +
                  " is not a class index in [0, " + std::to_string(c.classes) + ")");
  }
  copy_batch_into(batch, 0, c.inputs);
  write_optimizer_scalars(c.scalars, optimizer, lr, step);
  VarPtr done = new_var();
  std::vector<VarPtr> writes = c.writes;
  writes.push_back(done);
  std::shared_ptr<CapturedWork> work = c.work;
  rt_.engine().push([work](OpContext& ctx) { work->replay(ctx); },
                    {c.inputs.images.var(), c.inputs.labels.var(), c.scalars.var()}, std::move(writes),
                    device_, StreamKind::Compute, {"training step (replay)", "", 0, 0});
  model.set_batches_tracked(model.batches_tracked() + 1);  // what the captured forward counted on the host
  ++replayed_steps_;
  return done;
}

std::string StepCapturer::status() const {
  if (captured_) return "replaying " + captured_->work->describe();
  if (!off_.empty()) return "step by step: " + off_;
  if (!released_.empty()) return "replayed " + released_;
  return "step by step";
}

void StepCapturer::release() noexcept {
  if (captured_) released_ = captured_->work->describe();
  captured_.reset();
  uncaptured_steps_ = 0;
}

}  // namespace gn::nn::trainer_parts
