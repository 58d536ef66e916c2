// Dataset and Train: Fashion-MNIST, a folder of images (or a synthetic set) in batches, and data-parallel
// training across devices with live metric series.
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

// The synthetic set's sizes before `limit`: enough for a model to learn its patterns in an epoch or two.
constexpr int64_t kSyntheticTrain = 2048, kSyntheticTest = 512;

// `data` served with transform `t`. A set made for this node alone (`own`: an image folder's, which may fill
// most of memory) takes it in place; loaded sets are shared, so they are copied when `t` changes anything.
nn::DatasetPtr withTransform(const nn::DatasetPtr& data, const nn::Transform& t,
                             const std::shared_ptr<nn::Dataset>& own = nullptr) {
  if (own) {
    own->transform = t;
    return own;
  }
  if (!data || (!t.augments() && !t.normalizes())) return data;
  auto d = std::make_shared<nn::Dataset>(*data);
  d->transform = t;
  return d;
}

// The loader's milliseconds per batch over the first batches of epoch 0, as Train will read `data`: whether
// it can keep a device fed. A batch too large to probe cheaply is measured smaller and scaled (the cost is
// per sample).
double probeLoader(const nn::DatasetPtr& data, const DatasetSpec& spec, bool training) {
  constexpr int kBatches = 8;
  constexpr double kSeconds = 0.25, kMaxProbeBytes = 256.0 * (1 << 20);
  const int64_t side = spec.resize > 0 ? spec.resize : data->height;
  const double sampleBytes = static_cast<double>(data->channels * side * side + 1) * sizeof(float);
  const int64_t full = std::min(spec.batchSize, data->count);
  const int64_t probe =
      std::clamp<int64_t>(static_cast<int64_t>(kMaxProbeBytes / sampleBytes), int64_t(1), full);
  nn::LoaderOptions lo;
  lo.batch_size = probe;
  lo.shuffle = training;
  lo.seed = spec.shuffleSeed;
  lo.resize = spec.resize;
  nn::DataLoader loader(data, lo);
  loader.start_epoch(0);
  const auto start = std::chrono::steady_clock::now();
  for (int b = 0; b < kBatches; ++b) {
    if (!loader.next()) break;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() > kSeconds) break;
  }
  loader.stop();
  return loader.ms_per_batch() * static_cast<double>(full) / static_cast<double>(probe);
}

QJsonArray classCounts(const nn::Dataset& d) {
  std::vector<double> counts(static_cast<size_t>(d.classes), 0.0);
  for (uint8_t label : d.labels)
    if (label < counts.size()) counts[label] += 1;
  QJsonArray out;
  for (double c : counts) out.append(c);
  return out;
}

class DatasetNode final : public GpuNode {
 public:
  DatasetNode()
      : GpuNode({
            .name = "Dataset",
            .category = "Models",
            .description =
                "Fashion-MNIST from its gzipped IDX files (the Debian package dataset-fashion-mnist installs "
                "them under /usr/share/datasets/fashion-mnist), a folder of your own PNG or JPEG images in "
                "torchvision's ImageFolder layout (image_folder), or a small synthetic set for quick checks: "
                "10 classes of fixed random 28x28 patterns plus noise. Train and Evaluate read it in batches "
                "of batch_size, shuffled per epoch from shuffle_seed, prepared on a background thread, which "
                "also augments training batches (random crop, flip) and normalises both splits when asked. "
                "Reports the classes, the samples per class, the loader's milliseconds per batch, and the "
                "normalisation's mean and std.",
            .inputs = {},
            .outputs = {outPort("data", PortType::Dataset,
                                "The splits and how to batch them: Train trains on the training split and "
                                "reports test accuracy on the test split.")},
            .params =
                {
                    enumParam("name", {"fashion-mnist", "synthetic", "image_folder"}, "fashion-mnist",
                              "fashion-mnist: 60,000 training and 10,000 test images, 28x28 grey. synthetic: "
                              "2,048 training and 512 test samples of the same shape, made in memory. "
                              "image_folder: the images under path, decoded into memory."),
                    stringParam(
                        "path", nn::default_fashion_mnist_dir(),
                        "fashion-mnist: the directory holding train-images-idx3-ubyte.gz, "
                        "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
                        "t10k-labels-idx1-ubyte.gz (or the same names without .gz). image_folder: a "
                        "directory with one sub-directory of images per class (path/<class>/<image>, "
                        "classes sorted by name, class i is label i, as torchvision's ImageFolder), "
                        "or with train/ and test/ sub-directories of that layout (the same classes in "
                        "both). Files that do not read as images are skipped and listed in a "
                        "warning."),
                    intParam("channels", 1, 1, 3,
                             "image_folder: 1 converts every image to grey, 3 to RGB (grey images give "
                             "R = G = B). The other sets are grey: 1."),
                    floatParam("test_fraction", 0.2,
                               "image_folder without train/ and test/ directories: the share of each class "
                               "held out as the test split (stratified, 0 to 0.9), drawn from shuffle_seed."),
                    enumParam("split", {"both", "train", "test"}, "both",
                              "Which splits to load: both (training and test), train or test only."),
                    intParam("batch_size", 256, 1, 1000000,
                             "Samples per step, the whole minibatch: Train splits it across its devices "
                             "(unevenly when it does not divide)."),
                    intParam(
                        "limit", 0, 0, 100000000,
                        "Use only the first `limit` samples of each split (image_folder: of each split's "
                        "order drawn from shuffle_seed, so every class is represented); 0 uses them "
                        "all."),
                    intParam("shuffle_seed", 0, 0, 9007199254740991.0,
                             "The order of epoch e is a permutation drawn from (shuffle_seed, e): runs "
                             "repeat exactly."),
                    intParam("resize", 0, 0, 1024,
                             "0: images as stored (28x28; image_folder: all must share one square size). "
                             "Otherwise bilinear resize to resize x resize, as d2l's "
                             "load_data_fashion_mnist(resize=96) (image_folder: scaled once, when decoded); "
                             "the Model's image_size must match for mlp and lenet."),
                    intParam("augment_crop_padding", 0, 0, 1024,
                             "Training batches only: a random crop of the image's size after zero padding "
                             "by this many pixels on each side, as torchvision's RandomCrop(size, padding). "
                             "0: off."),
                    boolParam("augment_flip", false,
                              "Training batches only: a random horizontal flip with probability 0.5. Crop "
                              "and flip are drawn per image from (the Train's shuffle seed, epoch, image), "
                              "so runs repeat."),
                    boolParam("normalize", false,
                              "Subtract each channel's mean and divide by its standard deviation, both "
                              "computed once over the training split as stored (reported as mean and std), "
                              "on training and test batches alike."),
                },
        }, Reuse::Pure) {}

  QStringList validateParams(const QJsonObject& p) const override {
    QStringList problems;
    const qint64 channels = p["channels"].toInteger();
    if (channels != 1 && channels != 3)
      problems.append("channels: must be 1 (grey) or 3 (RGB)");
    else if (channels == 3 && p["name"].toString() != "image_folder")
      problems.append("channels: " + p["name"].toString() + " is grey; 3 channels apply to image_folder");
    const double fraction = p["test_fraction"].toDouble();
    if (!(fraction >= 0 && fraction <= 0.9)) problems.append("test_fraction: must be between 0 and 0.9");
    return problems;
  }

  // The files read: changed or added images make another dataset. The synthetic set reads none.
  QByteArray cacheIdentity(const QJsonObject& p, core::RunSession* session) const override {
    Q_UNUSED(session);
    return p["name"].toString() == "synthetic" ? QByteArray() : fileIdentity(p["path"].toString());
  }

  // The images' channels and side, the splits and the batch size; the loader's own complaints about the
  // files (missing, unreadable folders) before the run.
  Outputs check(NodeCheck& check) const override {
    const QJsonObject& p = check.params();
    Known d;
    const QString split = p["split"].toString();
    d.hasTrain = split != "test";
    d.hasTest = split != "train";
    d.channels = 1;
    const qint64 resize = p["resize"].toInteger();
    d.side = resize > 0 ? resize : 28;
    d.batch = p["batch_size"].toInteger();
    if (p["name"].toString() == "image_folder") {
      d.channels = p["channels"].toInteger();
      // Without resize the side is the images' own, known from one header once the folder scans.
      if (resize <= 0) d.side.reset();
      // The loader's own scan (class folders only, not their files).
      try {
        const ImageFolderLayout layout = scanImageFolder(p["path"].toString());
        if (resize <= 0)
          if (const std::optional<QSize> size = firstImageSize(layout);
              size && size->width() == size->height())
            d.side = size->width();
      } catch (const std::exception& e) {
        check.error("params.path", QString::fromUtf8(e.what()));
      }
      return {{"data", d}};
    }
    if (p["name"].toString() == "fashion-mnist") checkFashionMnist(check, d);
    return {{"data", d}};
  }

  // The loader's message, before the run: what is missing, where, and how to install it.
  static void checkFashionMnist(NodeCheck& check, const Known& d) {
    const QString dir = check.params()["path"].toString();
    const QString hint =
        "Install the Debian package dataset-fashion-mnist (apt-get install dataset-fashion-mnist), or set "
        "path "
        "to the directory that holds train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, "
        "t10k-images-idx3-ubyte.gz and t10k-labels-idx1-ubyte.gz";
    if (!QFileInfo(dir).isDir()) {
      check.error("params.path", "Fashion-MNIST: the directory " + dir + " does not exist. " + hint);
      return;
    }
    QStringList missing;
    QStringList files;
    // normalize reads the training split for its statistics, even when only the test split goes on.
    if (d.hasTrain || check.params()["normalize"].toBool())
      files << "train-images-idx3-ubyte"
            << "train-labels-idx1-ubyte";
    if (d.hasTest)
      files << "t10k-images-idx3-ubyte"
            << "t10k-labels-idx1-ubyte";
    for (const QString& f : files) {
      const QString gz = QDir(dir).filePath(f + ".gz");
      if (!QFileInfo::exists(gz) && !QFileInfo::exists(QDir(dir).filePath(f))) missing << gz;
    }
    if (!missing.isEmpty())
      check.error("params.path", "Fashion-MNIST: " + missing.join(", ") +
                                     (missing.size() == 1 ? " is" : " are") + " missing. " + hint);
  }

  void execute(core::NodeContext& ctx) const override {
    const QJsonObject& p = ctx.params();
    DatasetSpec spec;
    spec.name = p["name"].toString();
    spec.batchSize = p["batch_size"].toInteger();
    spec.resize = p["resize"].toInteger();
    spec.shuffleSeed = static_cast<uint64_t>(p["shuffle_seed"].toInteger());
    const int64_t limit = p["limit"].toInteger();
    const QString split = p["split"].toString();
    const bool wantTrain = split != "test", wantTest = split != "train";
    const bool normalize = p["normalize"].toBool();
    // Normalisation's statistics come from the training split, loaded for them even when not handed on.
    const bool loadTrain = wantTrain || normalize;
    nn::DatasetPtr train, test;
    std::shared_ptr<nn::Dataset> ownTrain, ownTest;
    if (spec.name == "synthetic") {
      const int64_t nTrain = limit > 0 ? std::min(limit, kSyntheticTrain) : kSyntheticTrain;
      const int64_t nTest = limit > 0 ? std::min(limit, kSyntheticTest) : kSyntheticTest;
      // One set cut in two, so that both splits share the class patterns.
      nn::SyntheticOptions so;
      so.count = nTrain + nTest;
      const nn::DatasetPtr all = nn::make_synthetic(so);
      if (loadTrain) train = sliceDataset(all, 0, nTrain, "synthetic/train");
      if (wantTest) test = sliceDataset(all, nTrain, nTrain + nTest, "synthetic/test");
    } else if (spec.name == "fashion-mnist") {
      const std::string dir = p["path"].toString().toStdString();
      if (loadTrain) train = nn::take(nn::load_fashion_mnist(nn::Split::Train, dir), limit);
      if (ctx.cancelled()) throw CancelledError();
      if (wantTest) test = nn::take(nn::load_fashion_mnist(nn::Split::Test, dir), limit);
    } else if (spec.name == "image_folder") {
      ImageFolderOptions fo;
      fo.channels = static_cast<int>(p["channels"].toInteger());
      fo.resize = spec.resize;
      fo.testFraction = p["test_fraction"].toDouble();
      fo.seed = spec.shuffleSeed;
      fo.limit = limit;
      fo.wantTrain = loadTrain;
      fo.wantTest = wantTest;
      fo.cancelled = [&ctx] { return ctx.cancelled(); };
      fo.progress = [&ctx](double f) { ctx.progress(f); };
      ImageFolderData folder = loadImageFolder(p["path"].toString(), fo);
      train = ownTrain = folder.train;
      test = ownTest = folder.test;
      // Scaled once when decoded: the loader hands the images out as they are.
      spec.resize = 0;
      const QJsonArray names = [&] {
        QJsonArray a;
        for (const QString& c : folder.layout.classes) a.append(c);
        return a;
      }();
      ctx.reportField("classes", names);
      ctx.reportField("split_by", folder.layout.trainTestDirs
                                      ? QString("the train and test folders")
                                      : QString("test_fraction %1 of each class").arg(fo.testFraction));
      ctx.reportField("unreadable_files", static_cast<double>(folder.unreadable.size()));
      if (!folder.unreadable.isEmpty()) {
        constexpr int kShown = 5;
        QStringList shown = folder.unreadable.mid(0, kShown);
        if (folder.unreadable.size() > kShown)
          shown.append(QString("and %1 more").arg(folder.unreadable.size() - kShown));
        const bool one = folder.unreadable.size() == 1;
        ctx.warning(QString("%1 file%2 under %3 did not read as images and %4 skipped: %5")
                        .arg(folder.unreadable.size())
                        .arg(one ? QString() : QString("s"), p["path"].toString(),
                             one ? QString("was") : QString("were"), shown.join(", ")));
      }
    } else {
      throw Error("name: unknown dataset " + spec.name.toStdString());
    }

    nn::Transform both;
    if (normalize) {
      const nn::ChannelStats stats = nn::channel_stats(*train);
      QJsonArray mean, std;
      for (size_t c = 0; c < stats.mean.size(); ++c) {
        mean.append(stats.mean[c]);
        std.append(stats.std[c]);
        both.mean.push_back(static_cast<float>(stats.mean[c]));
        // A constant channel has nothing to scale: it is only centred.
        const bool constant = !(stats.std[c] > 1e-12);
        both.std.push_back(constant ? 1.0f : static_cast<float>(stats.std[c]));
        if (constant)
          ctx.warning(
              QString("normalize: channel %1 is the same value everywhere in the training split: it is "
                      "centred but not scaled")
                  .arg(c));
      }
      ctx.reportField("mean", mean);
      ctx.reportField("std", std);
    }
    nn::Transform augmented = both;
    augmented.crop_padding = p["augment_crop_padding"].toInteger();
    augmented.flip = p["augment_flip"].toBool();
    if (wantTrain) spec.train = withTransform(train, augmented, ownTrain);
    spec.test = withTransform(test, both, ownTest);

    auto value = std::make_shared<DatasetValue>(std::move(spec));
    const DatasetSpec& s = value->spec();
    ctx.reportField("train_samples", s.train ? static_cast<double>(s.train->count) : 0.0);
    ctx.reportField("test_samples", s.test ? static_cast<double>(s.test->count) : 0.0);
    if (s.train) ctx.reportField("train_class_counts", classCounts(*s.train));
    if (s.test) ctx.reportField("test_class_counts", classCounts(*s.test));
    ctx.reportField("image",
                    QJsonArray{static_cast<double>(value->channels()), static_cast<double>(value->side()),
                               static_cast<double>(value->side())});
    if (const nn::DatasetPtr& probed = s.train ? s.train : s.test; probed && probed->count > 0)
      ctx.reportField("loader_ms_per_batch", probeLoader(probed, s, probed == s.train));
    ctx.reportField("summary", value->summary());
    ctx.progress(1.0);
    ctx.setOutput("data", value);
  }
};

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
                    stringParam(
                        "checkpoint_dir", "",
                        "Where to save checkpoints (created when missing; relative paths are relative "
                        "to the working directory); empty: none. A checkpoint holds the parameters, "
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
    check.checkImages(model, data);
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
    const QString mismatch = imageMismatch(input->model().options(), data->channels(), data->side());
    if (!mismatch.isEmpty()) throw Error(mismatch.toStdString());

    const QJsonObject& p = ctx.params();
    nn::TrainOptions o;
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
      if (std::isfinite(e.test_acc)) row["test_acc"] = e.test_acc;
      perEpoch.append(row);
      seconds += e.seconds;
    }
    ctx.reportField("epochs", perEpoch);
    if (!result.epochs.empty()) {
      const nn::EpochResult& last = result.epochs.back();
      ctx.reportField("loss", last.train_loss);
      ctx.reportField("train_acc", last.train_acc);
      if (std::isfinite(last.test_acc)) ctx.reportField("test_acc", last.test_acc);
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

core::NodeTypePtr makeDatasetNode() {
  return std::make_shared<DatasetNode>();
}
core::NodeTypePtr makeTrainNode() {
  return std::make_shared<TrainNode>();
}

}  // namespace gn::nodes
