// Train: data-parallel training across devices with live metric series, for classes, language models and
// regression.
#include <QDir>
#include <QFileInfo>
#include <QJsonArray>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <set>

#include "gpunodes/dist/world.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/trainer.h"
#include "image_folder.h"
#include "model_values.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

using core::PortType;

// The Train node's device inputs, in order: the first holds replica 0.
const QStringList kDevicePorts{"devices", "devices_2", "devices_3", "devices_4"};

// A Float param with bounds that validation and the inspector's spin box both apply.
core::ParamSpec boundedFloat(const QString& name, double def, double min, double max, const QString& doc) {
  core::ParamSpec p = floatParam(name, def, doc);
  p.min = min;
  p.max = max;
  return p;
}

// The Train node's optimizer and schedule params as the runtime's options (params already filled with
// defaults, so graph files from before these params train exactly as they did: SGD at a constant rate).
nn::OptimizerOptions optimizerOf(const QJsonObject& p) {
  nn::OptimizerOptions o;
  o.kind = nn::parse_optimizer(p["optimizer"].toString().toStdString());
  o.lr = p["lr"].toDouble();
  o.momentum = p["momentum"].toDouble();
  o.nesterov = p["nesterov"].toBool();
  o.weight_decay = p["weight_decay"].toDouble();
  o.beta1 = p["beta1"].toDouble();
  o.beta2 = p["beta2"].toDouble();
  o.eps = p["eps"].toDouble();
  return o;
}

// The loss param; graph files from before it train with cross-entropy.
nn::LossKind lossOf(const QJsonObject& p) {
  return nn::parse_loss_kind(p["loss"].toString("cross_entropy").toStdString()).value_or(nn::LossKind::CrossEntropy);
}

nn::ScheduleOptions scheduleOf(const QJsonObject& p) {
  nn::ScheduleOptions s;
  s.kind = nn::parse_schedule(p["schedule"].toString().toStdString());
  s.warmup_epochs = p["warmup_epochs"].toInteger();
  s.step_size = p["step_size"].toInteger();
  s.gamma = p["gamma"].toDouble();
  s.min_lr = p["min_lr"].toDouble();
  return s;
}

class TrainNode final : public GpuNode {
 public:
  TrainNode()
      : GpuNode({
            .name = "Train",
            .category = "Models",
            .description =
                "Minibatch SGD, Adam or AdamW (PyTorch's definitions) with softmax cross-entropy, at a "
                "constant, step, cosine or one-cycle learning rate with an optional linear warmup, "
                "data-parallel as the seed's nn.DataParallel: each batch is split across the devices, every "
                "device runs forward and backward on its share at the same time, the gradients are summed "
                "(NCCL on GPUs, on the host otherwise), optionally clipped by their total norm, and every "
                "replica takes the same step. BatchNorm keeps per-replica batch statistics, as DataParallel "
                "does (no synchronised BatchNorm); device 0's running statistics are the ones kept. Streams "
                "the metric series <node>.loss, <node>.train_acc and <node>.lr (every log_every batches and "
                "per epoch), <node>.test_acc, <node>.epoch_seconds and <node>.images_per_second per epoch, "
                "and <node>.memory_mb/<device> per device. Reports the optimizer and the schedule, and the "
                "loader's milliseconds per batch beside the step's. With a checkpoint_dir it saves "
                "checkpoints after epochs and at a cancel, and with resume continues from the newest. Trains "
                "a copy: the input model stays as it was.",
            .inputs = {inPort("model", PortType::Model, "The model to start from."),
                       inPort("data", PortType::Dataset,
                              "The data: its training split is trained on, its test split (if loaded) gives "
                              "test accuracy after each epoch."),
                       inPort("devices", PortType::Devices,
                              "The devices to train on: AllDevices (try_all_gpus), or a Device."),
                       inPort("devices_2", PortType::Devices,
                              "More devices, appended (a second Device node).", false),
                       inPort("devices_3", PortType::Devices, "More devices, appended.", false),
                       inPort("devices_4", PortType::Devices, "More devices, appended.", false)},
            .outputs = {outPort("model", PortType::Model, "The trained model, on the first device.")},
            .params =
                {
                    intParam("epochs", 10, 0, 100000, "Passes over the training split."),
                    enumParam(
                        "optimizer", {"sgd", "adam", "adamw"}, "sgd",
                        "sgd: torch.optim.SGD. adam: torch.optim.Adam (weight_decay is an L2 term added "
                        "to the gradient). adamw: torch.optim.AdamW (weight decay decoupled: each step "
                        "first multiplies the weights by 1 - lr * weight_decay)."),
                    boundedFloat(
                        "lr", 0.1, 0, 1e6,
                        "Learning rate (above 0), the base of the schedule; the seed uses 0.1 for SGD "
                        "at batch 256, 0.2 for 512. Adam usually wants about 1e-3."),
                    boundedFloat("momentum", 0.0, 0, 1,
                                 "sgd: momentum, 0 to below 1 (PyTorch's definition)."),
                    boolParam("nesterov", false, "sgd: Nesterov momentum (needs momentum above 0)."),
                    boundedFloat("beta1", 0.9, 0, 1,
                                 "adam, adamw: decay of the running mean of gradients, 0 to below 1."),
                    boundedFloat(
                        "beta2", 0.999, 0, 1,
                        "adam, adamw: decay of the running mean of squared gradients, 0 to below 1."),
                    boundedFloat("eps", 1e-8, 0, 1, "adam, adamw: added to the denominator (above 0)."),
                    boundedFloat(
                        "weight_decay", 0.0, 0, 1e6,
                        "Weight decay (0 or more): an L2 term added to each gradient for sgd and adam, "
                        "decoupled for adamw. (PyTorch's AdamW defaults to 0.01; here 0 for all.)"),
                    enumParam(
                        "schedule", {"constant", "step", "cosine", "onecycle"}, "constant",
                        "The learning rate per batch. constant: lr. step: lr * gamma^(epoch // "
                        "step_size) (StepLR, per epoch). cosine: from lr down to min_lr over the epochs "
                        "after the warmup (CosineAnnealingLR, per epoch). onecycle: OneCycleLR per batch "
                        "with max_lr = lr: up from lr/25 over the first 30% of steps, then down to min_lr "
                        "(or lr/25/1e4 when min_lr is 0); it takes no warmup."),
                    intParam("warmup_epochs", 0, 0, 100000,
                             "Epochs of linear warmup before the schedule: from lr/W to lr over W = "
                             "warmup_epochs * batches-per-epoch batches (LinearLR)."),
                    intParam("step_size", 1, 1, 100000, "step: epochs between decays."),
                    boundedFloat("gamma", 0.1, 0, 1e6, "step: the decay factor (above 0)."),
                    boundedFloat("min_lr", 0.0, 0, 1e6,
                                 "cosine: the final rate (eta_min). onecycle: the final rate when above 0. "
                                 "Below lr."),
                    boundedFloat("clip_grad_norm", 0.0, 0, 1e6,
                                 "Clip the gradients' total 2-norm to this (clip_grad_norm_, after the "
                                 "all-reduce); 0: off."),
                    enumParam("loss", {"cross_entropy", "mse", "l1", "huber"}, "cross_entropy",
                              "What is minimised, PyTorch's losses with mean reduction: cross_entropy for "
                              "classes (per step and averaged when the targets are a text's next tokens: the "
                              "reports add perplexity); mse, l1 or huber for regression (MSELoss, L1Loss, "
                              "HuberLoss; the reports give MSE, MAE and R^2)."),
                    boundedFloat("huber_delta", 1.0, 1e-6, 1e6,
                                 "huber: where the loss turns from quadratic to linear (HuberLoss's delta)."),
                    boundedFloat(
                        "label_smoothing", 0.0, 0, 1,
                        "Label smoothing of the training loss (CrossEntropyLoss(label_smoothing)), 0 "
                        "to 1. Accuracy is unaffected."),
                    precisionParam("The math of the linear layers' and convolutions' products, in training "
                                   "and in the evaluation after each epoch (torch.autocast's role)"),
                    enumParam("loss_scale", {"auto", "dynamic", "off"}, "auto",
                              "Dynamic loss scaling (torch.cuda.amp.GradScaler): the loss gradient is "
                              "multiplied by a scale so that small gradients survive fp16; a step whose "
                              "gradients overflow is skipped and halves the scale, every "
                              "loss_scale_interval good steps double it. auto: on for fp16 only. Each step "
                              "then reads the gradient norm back (a short host wait)."),
                    boundedFloat("loss_scale_init", 65536, 1, 1e30,
                                 "The starting scale (GradScaler's init_scale, 2^16); a power of two keeps "
                                 "the unscaled gradients exact."),
                    intParam("loss_scale_interval", 2000, 1, 1000000000,
                             "Good steps in a row after which the scale doubles (growth_interval)."),
                    enumParam("capture", {"auto", "on", "off"}, "auto",
                              "Capture one training step and replay it for the next ones (after two "
                              "ordinary steps; batches of another size run step by step): a CUDA graph on "
                              "a GPU, where small images make the step launch-bound; the recorded ops on a "
                              "CPU. Only one device, without dropout or loss scaling; otherwise steps run "
                              "one by one and a warning says why. auto: on CUDA devices. on: also on a CPU."),
                    intParam("seed", 0, 0, 9007199254740991.0,
                             "Added to the Dataset's shuffle_seed for this node's epoch order, so that two "
                             "Train nodes on one Dataset can see different orders (0: the Dataset's)."),
                    intParam("log_every", 50, 0, 1000000,
                             "Loss, train accuracy and images/s every this many batches (each costs a "
                             "short host read); 0: once per epoch."),
                    boolParam("balance", false,
                              "Split each batch in proportion to each device's measured speed instead of "
                              "evenly (re-measured as training goes): for a GPU beside the CPU, the seed's "
                              "exercise 2."),
                    pathParam(
                        "checkpoint_dir", "", core::FileUse::WriteFolder,
                        "Where to save checkpoints (created when missing; a relative path is relative "
                        "to the graph file's folder); empty: none. A checkpoint holds the parameters, "
                        "buffers, optimizer state, schedule position, data order and the metric series "
                        "so far, in a safetensors file written atomically. A directory that cannot be "
                        "written stops the node before training."),
                    intParam("checkpoint_every", 1, 0, 100000,
                             "A checkpoint after every this many epochs and after the last; 0: only when "
                             "the run is cancelled. Cancel lets the steps in flight finish and saves "
                             "where training stopped, mid-epoch."),
                    intParam("keep_checkpoints", 3, 1, 100000,
                             "How many of the newest checkpoints to keep; older ones are removed."),
                    enumParam("resume", {"off", "auto"}, "off",
                              "auto: continue from the newest checkpoint in checkpoint_dir that reads back "
                              "whole (damaged ones are skipped with a warning), and end with exactly the "
                              "parameters of a run never interrupted. The checkpoint must come from this "
                              "model and these settings (a difference is an error naming it); without one, "
                              "training starts afresh. `gpunodes run --resume` sets auto on every Train."),
                },
        }) {}

  QStringList validateParams(const QJsonObject& params) const override {
    QStringList problems;
    if (params["resume"].toString() == "auto" && params["checkpoint_dir"].toString().trimmed().isEmpty())
      problems.append("resume: auto needs a checkpoint_dir to resume from");
    const nn::OptimizerOptions o = optimizerOf(params);
    // The runtime's checks, named after these params: one rule for the node and for the Trainer.
    for (const std::string& p : nn::optimizer_problems(o)) problems.append(qs(p));
    for (const std::string& p : nn::schedule_problems(scheduleOf(params), o.lr)) problems.append(qs(p));
    return problems;
  }

  // resume=auto continues from whatever checkpoint is newest on disk, which the key cannot know.
  bool reusable(const QJsonObject& p) const override { return p["resume"].toString() == "off"; }

  // Devices wired in once each, a dataset with a training split whose images the model takes, a precision
  // the devices can compute in, and enough samples per step for every device. The trained model is on the
  // first device.
  Outputs check(NodeCheck& check) const override {
    Known model = check.inputOrUnknown("model");
    const Known data = check.inputOrUnknown("data");
    std::vector<Device> devices;
    bool allKnown = true;
    for (const QString port : {"devices", "devices_2", "devices_3", "devices_4"}) {
      const std::optional<Known> dev = check.input(port);
      if (!dev) continue;
      if (!dev->isDevices) {
        allKnown = false;
        continue;
      }
      for (const Device& d : dev->devices) {
        if (std::find(devices.begin(), devices.end(), d) != devices.end())
          check.error("inputs." + port, qs(d.str()) + " is wired in twice: each device holds one replica");
        devices.push_back(d);
      }
    }
    if (!data.hasTrain)
      check.error("inputs.data", "the dataset has no training split (set its split to both or train)");
    check.checkData(model, data, lossOf(check.params()));
    if (allKnown) check.checkPrecision(devices, "it trains");
    if (allKnown && !devices.empty() && data.batch && *data.batch < static_cast<int64_t>(devices.size()))
      check.warning("inputs.devices",
                    QString("a batch of %1 over %2 devices leaves some devices without samples in a step")
                        .arg(*data.batch)
                        .arg(devices.size()));
    model.devices.clear();
    model.deviceOutput.reset();
    if (allKnown && !devices.empty()) model.devices = {devices.front()};
    return {{"model", model}};
  }

  void execute(core::NodeContext& ctx) const override {
    NodesSession& session = sessionOf(ctx);
    auto input = modelInput(ctx, "model");
    auto data = datasetInput(ctx, "data");
    const DatasetSpec& ds = data->spec();
    std::vector<Device> devices;
    for (const QString& port : kDevicePorts)
      for (const Device& d : deviceInput(ctx, port)) devices.push_back(d);
    if (devices.empty()) throw Error("no devices to train on: wire AllDevices or a Device into devices");
    std::set<Device> seen;
    for (const Device& d : devices)
      if (!seen.insert(d).second) throw Error("device " + d.str() + " is wired in twice");
    if (!ds.train) throw Error("the dataset has no training split (set its split to both or train)");
    const QJsonObject& p = ctx.params();
    const nn::LossKind loss = lossOf(p);
    for (const QString& mismatch : {dataMismatch(input->model().options(), data->shape()),
                                    targetMismatch(input->model().options(), data->shape(), loss)})
      if (!mismatch.isEmpty()) throw Error(mismatch.toStdString());

    nn::TrainOptions o;
    o.loss = loss;
    o.huber_delta = p["huber_delta"].toDouble(1.0);
    o.epochs = p["epochs"].toInteger();
    o.batch_size = ds.batchSize;
    o.optimizer = optimizerOf(p);
    o.schedule = scheduleOf(p);
    o.clip_grad_norm = p["clip_grad_norm"].toDouble();
    o.label_smoothing = p["label_smoothing"].toDouble();
    o.precision = precisionOf(p);
    o.capture = nn::parse_step_capture(p["capture"].toString("auto").toStdString()).value_or(nn::StepCapture::Auto);
    o.loss_scale.mode =
        nn::parse_loss_scale_mode(p["loss_scale"].toString("auto").toStdString()).value_or(nn::LossScaleMode::Auto);
    o.loss_scale.init = p["loss_scale_init"].toDouble(65536);
    o.loss_scale.interval = p["loss_scale_interval"].toInteger(2000);
    o.shuffle_seed = ds.shuffleSeed + static_cast<uint64_t>(p["seed"].toInteger());
    o.resize = ds.resize;
    o.log_every = p["log_every"].toInteger();
    o.balance = p["balance"].toBool();
    o.checkpoint.dir = p["checkpoint_dir"].toString().trimmed().toStdString();
    o.checkpoint.every = p["checkpoint_every"].toInteger();
    o.checkpoint.keep = p["keep_checkpoints"].toInteger();
    o.checkpoint.resume = p["resume"].toString() == "auto";
    // Launched by mpirun for one run of the whole job: training with every rank's devices.
    if (dist::launch_info().under_mpirun && dist::World::get().joint_runs()) o.world = &dist::World::get();

    // A copy on the first device: the input value is shared with whatever else reads it.
    std::shared_ptr<nn::Model> model = input->model().replicate(devices.front());
    nn::Trainer trainer(*model, devices, o);
    // Declared after the trainer, so it is unregistered before the trainer goes. With checkpoints the
    // trainer saves at a cancel, which needs its steps in flight to finish.
    const std::shared_ptr<void> hook = session.onCancel(
        [&trainer] { trainer.cancel(); }, o.checkpoint.dir.empty() ? NodesSession::CancelStyle::Immediate
                                                                   : NodesSession::CancelStyle::Graceful);

    QJsonArray names, split;
    // A rank's share of the global batch (its shard; the last batch of an epoch may be shorter).
    const int64_t worldSize = trainer.world() ? trainer.world()->size() : 1;
    const std::vector<int64_t> shares = trainer.split((ds.batchSize + worldSize - 1) / worldSize);
    for (size_t i = 0; i < devices.size(); ++i) {
      names.append(qs(devices[i].str()));
      split.append(static_cast<double>(shares[i]));
    }
    ctx.reportField("devices", names);
    ctx.reportField("batch_split", split);
    ctx.reportField("reducer", qs(trainer.reducer_name()));
    if (trainer.world()) ctx.reportField("world_size", trainer.world()->size());
    ctx.reportField("optimizer", qs(nn::describe(trainer.optimizer())));
    ctx.reportField("schedule", qs(nn::describe(o.schedule)));
    ctx.reportField("precision", precision_name(o.precision));
    ctx.reportField("loss_scale", o.loss_scale.enabled(o.precision) ? "dynamic" : "off");

    const QString prefix = ctx.nodeId() + ".";
    const double epochs = static_cast<double>(std::max<int64_t>(o.epochs, 1));
    nn::TrainResult result = trainer.fit(
        ds.train, ds.test,
        [&](const nn::MetricSample& s) {
          ctx.metric(prefix + qs(s.series), s.epoch, s.value);
          ctx.progress(s.epoch / epochs);
        },
        [&](const std::string& warning) { ctx.warning(qs(warning)); });
    // How the last steps ran: replaying the captured step, or step by step (and why).
    ctx.reportField("capture", qs(trainer.capture_status()));
    ctx.reportField("replayed_steps", static_cast<double>(trainer.replayed_steps()));
    if (!result.resumed_from.empty()) ctx.reportField("resumed_from", qs(result.resumed_from));
    if (!result.ranks.empty()) {
      QJsonArray ranks;
      for (const nn::RankStats& r : result.ranks)
        ranks.append(QJsonObject{{"rank", r.rank},
                                 {"images_per_second", r.images_per_second},
                                 {"allreduce_ms", r.allreduce_ms},
                                 {"allreduce_bytes_per_step", r.allreduce_bytes_per_step},
                                 {"parameter_bytes", r.parameter_bytes}});
      ctx.reportField("ranks", ranks);
    }
    if (!o.checkpoint.dir.empty()) {
      QJsonArray written;
      for (const std::string& path : result.checkpoints) written.append(qs(path));
      ctx.reportField("checkpoints", written);
    }

    QJsonArray perEpoch;
    double seconds = 0;
    for (const nn::EpochResult& e : result.epochs) {
      QJsonObject row{{"epoch", static_cast<double>(e.epoch)},
                      {"loss", e.train_loss},
                      {"train_acc", e.train_acc},
                      {"seconds", e.seconds},
                      {"images_per_second", e.images_per_second},
                      {"loader_ms_per_batch", e.loader_ms_per_batch},
                      {"step_ms", e.step_ms},
                      {"loader_wait_ms", e.loader_wait_ms}};
      if (nn::is_regression(loss)) {
        row.remove("train_acc");
        row["train_mse"] = e.train_mse;
      }
      for (const auto& [field, v] : {std::pair{"test_acc", e.test_acc}, std::pair{"test_loss", e.test_loss},
                                     std::pair{"test_perplexity", e.test_perplexity}, std::pair{"test_mse", e.test_mse},
                                     std::pair{"test_mae", e.test_mae}, std::pair{"test_r2", e.test_r2}})
        if (std::isfinite(v)) row[field] = v;
      perEpoch.append(row);
      seconds += e.seconds;
    }
    ctx.reportField("epochs", perEpoch);
    if (!result.epochs.empty()) {
      const nn::EpochResult& last = result.epochs.back();
      ctx.reportField("loss", last.train_loss);
      if (nn::is_regression(loss)) {
        ctx.reportField("train_mse", last.train_mse);
      } else {
        ctx.reportField("train_acc", last.train_acc);
        if (ds.train->target_numel() > 1) ctx.reportField("perplexity", std::exp(last.train_loss));
      }
      for (const auto& [field, v] : {std::pair{"test_acc", last.test_acc}, std::pair{"test_loss", last.test_loss},
                                     std::pair{"test_perplexity", last.test_perplexity},
                                     std::pair{"test_mse", last.test_mse}, std::pair{"test_mae", last.test_mae},
                                     std::pair{"test_r2", last.test_r2}})
        if (std::isfinite(v)) ctx.reportField(field, v);
      ctx.reportField("seconds_per_epoch", seconds / static_cast<double>(result.epochs.size()));
      ctx.reportField("images_per_second", last.images_per_second);
      // Whether the loader keeps the devices fed: it prepares the next batches while a step runs.
      ctx.reportField("loader_ms_per_batch", last.loader_ms_per_batch);
      ctx.reportField("step_ms", last.step_ms);
      ctx.reportField("loader_wait_ms", last.loader_wait_ms);
      if (last.step_ms > 0 && last.loader_ms_per_batch > last.step_ms)
        ctx.warning(QString("the data loader is the bottleneck: it takes %1 ms to prepare a batch, the step "
                            "%2 ms (augmentation and resizing run on one background thread)")
                        .arg(last.loader_ms_per_batch, 0, 'f', 1)
                        .arg(last.step_ms, 0, 'f', 1));
    }
    ctx.progress(1.0);
    ctx.setOutput("model",
                  std::make_shared<ModelValue>(session.runtimePtr(), std::move(model),
                                               input->epochsTrained() + static_cast<double>(o.epochs)));
  }
};

}  // namespace

core::NodeTypePtr makeTrainNode() {
  return std::make_shared<TrainNode>();
}

}  // namespace gn::nodes
