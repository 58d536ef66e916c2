#include "training_checkpoints.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"

namespace gn::nn::trainer_parts {
namespace {

std::string exact(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.17g", v);
  return buf;
}

// The newest checkpoint's name says which it is: what it holds must agree, and its tensors must be the
// model's (by name and shape) and its optimizer state must belong to the model's parameters.
void check_holds(const TrainingCheckpoint& c, const CheckpointFile& f, const Model& model) {
  if (c.epoch != f.epoch || c.batch != f.batch)
    throw Error("checkpoint " + f.path + " is corrupt: it holds epoch " + std::to_string(c.epoch) +
                ", batch " + std::to_string(c.batch) + ", not what its name says");
  if (c.signature != model.signature()) return;  // another run: find_resumable() says so
  // The same model must have the same state, name by name and shape by shape: anything else is damage.
  std::map<std::string, const TrainingCheckpoint::Values*> by_name;
  for (const auto& v : c.state) by_name.emplace(v.name, &v);
  size_t matched = 0;
  for (const Parameter* p : model.state()) {
    const auto it = by_name.find(p->name);
    if (it == by_name.end() || it->second->shape != p->value.shape() ||
        static_cast<int64_t>(it->second->values.size()) != p->value.numel())
      throw Error("checkpoint " + f.path + " is corrupt: its '" + p->name + "' is missing or not " +
                  shape_str(p->value.shape()));
    ++matched;
  }
  if (matched != c.state.size())
    throw Error("checkpoint " + f.path + " is corrupt: it holds state the model does not have");
  std::map<std::string, Shape> shapes;
  for (const Parameter* p : model.state())
    if (p->trainable) shapes.emplace(p->name, p->value.shape());
  for (const auto& v : c.optimizer) {
    const size_t slash = v.name.rfind('/');
    const auto it = shapes.find(v.name.substr(0, slash == std::string::npos ? 0 : slash));
    if (it == shapes.end() || it->second != v.shape ||
        static_cast<int64_t>(v.values.size()) != checked_numel(v.shape))
      throw Error("checkpoint " + f.path + " is corrupt: optimizer state '" + v.name +
                  "' belongs to no parameter of that shape");
  }
}

}  // namespace

std::vector<std::pair<std::string, std::string>> training_settings(const TrainOptions& options,
                                                                   const Dataset& train) {
  const OptimizerOptions& o = options.optimizer;
  const ScheduleOptions& s = options.schedule;
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
      {"clip_grad_norm", exact(options.clip_grad_norm)},
      {"label_smoothing", exact(options.label_smoothing)},
      {"batch_size", std::to_string(options.batch_size)},
      {"shuffle_seed", std::to_string(options.shuffle_seed)},
      {"resize", std::to_string(options.resize)},
      {"dataset", train.name},
      {"train_samples", std::to_string(train.count)},
      {"augment_crop_padding", std::to_string(train.transform.crop_padding)},
      {"augment_flip", train.transform.flip ? "true" : "false"},
  };
  // Recorded where they differ from the defaults, so that checkpoints from before they existed still resume.
  if (options.precision != Precision::Fp32) out.emplace_back("precision", precision_name(options.precision));
  if (const LossScaleOptions& ls = options.loss_scale; ls.enabled(options.precision)) {
    out.emplace_back("loss_scale", "dynamic");
    out.emplace_back("loss_scale_init", exact(ls.init));
    out.emplace_back("loss_scale_growth", exact(ls.growth));
    out.emplace_back("loss_scale_backoff", exact(ls.backoff));
    out.emplace_back("loss_scale_interval", std::to_string(ls.interval));
  }
  // Cosine and one-cycle rates depend on the run's length; the others do not, so a finished run with them
  // can be resumed with more epochs to train on.
  if (s.kind == ScheduleKind::Cosine || s.kind == ScheduleKind::OneCycle)
    out.emplace_back("epochs", std::to_string(options.epochs));
  return out;
}

CheckpointStore::CheckpointStore(CheckpointOptions options) : options_(std::move(options)) {}

void CheckpointStore::prepare() const {
  namespace fs = std::filesystem;
  const std::string& dir = options_.dir;
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

bool CheckpointStore::due_after_epoch(int64_t done, int64_t epochs) const {
  return enabled() && options_.every > 0 && (done % options_.every == 0 || done == epochs);
}

std::string CheckpointStore::write(const TrainingCheckpoint& c) const {
  const std::string path =
      (std::filesystem::path(options_.dir) / checkpoint_file_name(c.epoch, c.batch)).string();
  write_checkpoint(path, c);
  const std::vector<CheckpointFile> all = list_checkpoints(options_.dir);
  for (size_t k = static_cast<size_t>(std::max<int64_t>(options_.keep, 1)); k < all.size(); ++k) {
    std::error_code ec;
    if (all[k].path != path) std::filesystem::remove(all[k].path, ec);
  }
  return path;
}

std::optional<CheckpointStore::Found> CheckpointStore::find_resumable(
    const Model& model, const std::vector<std::pair<std::string, std::string>>& settings, int64_t epochs,
    int64_t batches_per_epoch, const WarningCallback& on_warning) const {
  for (const CheckpointFile& f : list_checkpoints(options_.dir)) {
    TrainingCheckpoint c;
    try {
      c = read_checkpoint(f.path);
      check_holds(c, f, model);
    } catch (const CancelledError&) {
      throw;
    } catch (const Error& e) {
      if (on_warning) on_warning(std::string(e.what()) + "; skipped it");
      continue;
    }
    if (std::string why = checkpoint_mismatch(c, model.signature(), settings); !why.empty())
      throw Error("resume: checkpoint " + f.path + " is of another run: " + why +
                  ". Set resume to off, or use another checkpoint_dir, to start afresh");
    if (c.epoch > epochs || (c.epoch == epochs && c.batch > 0) || c.batch > batches_per_epoch)
      throw Error("resume: checkpoint " + f.path + " is at epoch " + std::to_string(c.epoch) + ", batch " +
                  std::to_string(c.batch) + ", past this run's " + std::to_string(epochs) + " epochs of " +
                  std::to_string(batches_per_epoch) + " batches");
    return Found{std::move(c), f.path};
  }
  return std::nullopt;
}

void save_model_state(Model& model, const std::vector<OptimizerState>& optimizer_state,
                      TrainingCheckpoint& c) {
  c.batches_tracked = model.batches_tracked();
  for (const Parameter* p : model.state()) c.state.push_back({p->name, p->value.shape(), to_host(p->value)});
  const auto params = model.parameters();
  for (size_t i = 0; i < params.size() && i < optimizer_state.size(); ++i) {
    const OptimizerState& st = optimizer_state[i];
    if (st.a.defined()) c.optimizer.push_back({params[i]->name + "/0", st.a.shape(), to_host(st.a)});
    if (st.b.defined()) c.optimizer.push_back({params[i]->name + "/1", st.b.shape(), to_host(st.b)});
  }
}

void restore_model_state(const TrainingCheckpoint& c, Model& model) {
  std::map<std::string, const TrainingCheckpoint::Values*> by_name;
  for (const auto& v : c.state) by_name.emplace(v.name, &v);
  for (Parameter* p : model.state()) write_values(p->value, by_name.at(p->name)->values);
  model.set_batches_tracked(c.batches_tracked);
}

std::vector<OptimizerState> restore_optimizer_state(const TrainingCheckpoint& c, Model& replica) {
  std::map<std::string, const TrainingCheckpoint::Values*> by_name;
  for (const auto& v : c.optimizer) by_name.emplace(v.name, &v);
  const auto params = replica.parameters();
  std::vector<OptimizerState> out(params.size());
  for (size_t i = 0; i < params.size(); ++i)
    for (int slot = 0; slot < 2; ++slot) {
      const auto it = by_name.find(params[i]->name + "/" + std::to_string(slot));
      if (it == by_name.end()) continue;
      Tensor t(replica.runtime(), it->second->shape, replica.device());
      write_values(t, it->second->values);
      (slot == 0 ? out[i].a : out[i].b) = t;
    }
  return out;
}

}  // namespace gn::nn::trainer_parts
