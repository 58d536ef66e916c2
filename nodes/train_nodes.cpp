// Dataset, Train and Evaluate: Fashion-MNIST (or a synthetic set) in batches, data-parallel training across
// devices with live metric series, and accuracy on a split.
#include <QJsonArray>
#include <cmath>
#include <set>

#include "gpunodes/errors.h"
#include "gpunodes/nn/trainer.h"
#include "model_values.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

using core::PortType;

// The synthetic set's sizes before `limit`: enough for a model to learn its patterns in an epoch or two.
constexpr int64_t kSyntheticTrain = 2048, kSyntheticTest = 512;

class DatasetNode final : public GpuNode {
 public:
  DatasetNode()
      : GpuNode({
            .name = "Dataset",
            .category = "Models",
            .description =
                "Fashion-MNIST from its gzipped IDX files (the Debian package dataset-fashion-mnist installs "
                "them under /usr/share/datasets/fashion-mnist), or a small synthetic set for quick checks: "
                "10 classes of fixed random 28x28 patterns plus noise. Train and Evaluate read it in batches "
                "of batch_size, shuffled per epoch from shuffle_seed, prepared on a background thread.",
            .inputs = {},
            .outputs = {outPort("data", PortType::Dataset,
                                "The splits and how to batch them: Train trains on the training split and "
                                "reports test accuracy on the test split.")},
            .params =
                {
                    enumParam("name", {"fashion-mnist", "synthetic"}, "fashion-mnist",
                              "fashion-mnist: 60,000 training and 10,000 test images, 28x28 grey. synthetic: "
                              "2,048 training and 512 test samples of the same shape, made in memory."),
                    stringParam("path", nn::default_fashion_mnist_dir(),
                                "fashion-mnist: the directory holding train-images-idx3-ubyte.gz, "
                                "train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz and "
                                "t10k-labels-idx1-ubyte.gz (or the same names without .gz)."),
                    enumParam("split", {"both", "train", "test"}, "both",
                              "Which splits to load: both (training and test), train or test only."),
                    intParam("batch_size", 256, 1, 1000000,
                             "Samples per step, the whole minibatch: Train splits it across its devices "
                             "(unevenly when it does not divide)."),
                    intParam("limit", 0, 0, 100000000,
                             "Use only the first `limit` samples of each split; 0 uses them all."),
                    intParam("shuffle_seed", 0, 0, 9007199254740991.0,
                             "The order of epoch e is a permutation drawn from (shuffle_seed, e): runs "
                             "repeat exactly."),
                    intParam("resize", 0, 0, 1024,
                             "0: images as stored (28x28). Otherwise bilinear resize to resize x resize, as "
                             "d2l's load_data_fashion_mnist(resize=96); the Model's image_size must match "
                             "for mlp and lenet."),
                },
        }) {}

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
    if (spec.name == "synthetic") {
      const int64_t nTrain = limit > 0 ? std::min(limit, kSyntheticTrain) : kSyntheticTrain;
      const int64_t nTest = limit > 0 ? std::min(limit, kSyntheticTest) : kSyntheticTest;
      // One set cut in two, so that both splits share the class patterns.
      nn::SyntheticOptions so;
      so.count = nTrain + nTest;
      const nn::DatasetPtr all = nn::make_synthetic(so);
      if (wantTrain) spec.train = sliceDataset(all, 0, nTrain, "synthetic/train");
      if (wantTest) spec.test = sliceDataset(all, nTrain, nTrain + nTest, "synthetic/test");
    } else if (spec.name == "fashion-mnist") {
      const std::string dir = p["path"].toString().toStdString();
      if (wantTrain) spec.train = nn::take(nn::load_fashion_mnist(nn::Split::Train, dir), limit);
      if (ctx.cancelled()) throw CancelledError();
      if (wantTest) spec.test = nn::take(nn::load_fashion_mnist(nn::Split::Test, dir), limit);
    } else {
      throw Error("name: unknown dataset " + spec.name.toStdString());
    }
    auto value = std::make_shared<DatasetValue>(std::move(spec));
    const DatasetSpec& s = value->spec();
    ctx.reportField("train_samples", s.train ? static_cast<double>(s.train->count) : 0.0);
    ctx.reportField("test_samples", s.test ? static_cast<double>(s.test->count) : 0.0);
    ctx.reportField("image",
                    QJsonArray{static_cast<double>(value->channels()), static_cast<double>(value->side()),
                               static_cast<double>(value->side())});
    ctx.reportField("summary", value->summary());
    ctx.setOutput("data", value);
  }
};

// The Train node's device inputs, in order: the first holds replica 0.
const QStringList kDevicePorts{"devices", "devices_2", "devices_3", "devices_4"};

class TrainNode final : public GpuNode {
 public:
  TrainNode()
      : GpuNode({
            .name = "Train",
            .category = "Models",
            .description =
                "Minibatch SGD with softmax cross-entropy, data-parallel as the seed's nn.DataParallel: each "
                "batch is split across the devices, every device runs forward and backward on its share at "
                "the same time, the gradients are summed (NCCL on GPUs, on the host otherwise) and every "
                "replica takes the same step. BatchNorm keeps per-replica batch statistics, as DataParallel "
                "does (no synchronised BatchNorm); device 0's running statistics are the ones kept. Streams "
                "the metric series <node>.loss and <node>.train_acc (every log_every batches and per epoch), "
                "<node>.test_acc, <node>.epoch_seconds and <node>.images_per_second per epoch, and "
                "<node>.memory_mb/<device> per device. Trains a copy: the input model stays as it was.",
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
                    floatParam("lr", 0.1,
                               "Learning rate (above 0); the seed uses 0.1 for batch 256, 0.2 for 512."),
                    floatParam("momentum", 0.0, "SGD momentum, 0 to below 1 (PyTorch's definition)."),
                    floatParam("weight_decay", 0.0, "L2 penalty added to each gradient (0 or more)."),
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
                },
        }) {}

  QStringList validateParams(const QJsonObject& params) const override {
    QStringList problems;
    const double lr = params["lr"].toDouble(), momentum = params["momentum"].toDouble(),
                 wd = params["weight_decay"].toDouble();
    if (!(lr > 0 && lr < 1e6)) problems.append("lr: must be above 0");
    if (!(momentum >= 0 && momentum < 1)) problems.append("momentum: must be at least 0 and below 1");
    if (!(wd >= 0 && wd < 1e6)) problems.append("weight_decay: must be 0 or more");
    return problems;
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
    o.sgd.lr = static_cast<float>(p["lr"].toDouble());
    o.sgd.momentum = static_cast<float>(p["momentum"].toDouble());
    o.sgd.weight_decay = static_cast<float>(p["weight_decay"].toDouble());
    o.shuffle_seed = ds.shuffleSeed + static_cast<uint64_t>(p["seed"].toInteger());
    o.resize = ds.resize;
    o.log_every = p["log_every"].toInteger();
    o.balance = p["balance"].toBool();

    // A copy on the first device: the input value is shared with whatever else reads it.
    std::shared_ptr<nn::Model> model = input->model().replicate(devices.front());
    nn::Trainer trainer(*model, devices, o);
    // Declared after the trainer, so it is unregistered before the trainer goes.
    const std::shared_ptr<void> hook = session.onCancel([&trainer] { trainer.cancel(); });

    QJsonArray names, split;
    const std::vector<int64_t> shares = trainer.split(ds.batchSize);
    for (size_t i = 0; i < devices.size(); ++i) {
      names.append(qs(devices[i].str()));
      split.append(static_cast<double>(shares[i]));
    }
    ctx.reportField("devices", names);
    ctx.reportField("batch_split", split);
    ctx.reportField("reducer", qs(trainer.reducer_name()));

    const QString prefix = ctx.nodeId() + ".";
    const double epochs = static_cast<double>(std::max<int64_t>(o.epochs, 1));
    nn::TrainResult result = trainer.fit(ds.train, ds.test, [&](const nn::MetricSample& s) {
      ctx.metric(prefix + qs(s.series), s.epoch, s.value);
      ctx.progress(s.epoch / epochs);
    });

    QJsonArray perEpoch;
    double seconds = 0;
    for (const nn::EpochResult& e : result.epochs) {
      QJsonObject row{{"epoch", static_cast<double>(e.epoch)},
                      {"loss", e.train_loss},
                      {"train_acc", e.train_acc},
                      {"seconds", e.seconds},
                      {"images_per_second", e.images_per_second}};
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
    }
    ctx.progress(1.0);
    ctx.setOutput("model",
                  std::make_shared<ModelValue>(session.runtimePtr(), std::move(model),
                                               input->epochsTrained() + static_cast<double>(o.epochs)));
  }
};

class EvaluateNode final : public GpuNode {
 public:
  EvaluateNode()
      : GpuNode({
            .name = "Evaluate",
            .category = "Models",
            .description = "The model's accuracy on a split of the dataset, in evaluation mode (BatchNorm "
                           "uses its running statistics), on the model's device: d2l's "
                           "evaluate_accuracy_gpu. Also a point on the series <node>.accuracy.",
            .inputs = {inPort("model", PortType::Model, "The model."),
                       inPort("data", PortType::Dataset, "The data, read in its batch size.")},
            .outputs = {outPort("accuracy", PortType::Scalar, "The fraction classified correctly.")},
            .params = {enumParam("split", {"test", "train"}, "test", "Which split to measure.")},
        }) {}

  void execute(core::NodeContext& ctx) const override {
    auto model = modelInput(ctx, "model");
    auto data = datasetInput(ctx, "data");
    const DatasetSpec& ds = data->spec();
    const QString split = ctx.params()["split"].toString();
    const nn::DatasetPtr& set = split == "train" ? ds.train : ds.test;
    if (!set || set->count == 0)
      throw Error(
          ("the dataset has no " + split + " split (set its split to both or " + split + ")").toStdString());
    const QString mismatch = imageMismatch(model->model().options(), data->channels(), data->side());
    if (!mismatch.isEmpty()) throw Error(mismatch.toStdString());
    const double accuracy = nn::evaluate(model->model(), set, ds.batchSize, ds.resize);
    ctx.metric(ctx.nodeId() + ".accuracy", model->epochsTrained(), accuracy);
    ctx.reportField("accuracy", accuracy);
    ctx.reportField("samples", static_cast<double>(set->count));
    ctx.setOutput("accuracy", std::make_shared<ScalarValue>(std::vector<double>{accuracy}));
  }
};

}  // namespace

core::NodeTypePtr makeDatasetNode() {
  return std::make_shared<DatasetNode>();
}
core::NodeTypePtr makeTrainNode() {
  return std::make_shared<TrainNode>();
}
core::NodeTypePtr makeEvaluateNode() {
  return std::make_shared<EvaluateNode>();
}

}  // namespace gn::nodes
