// Training checkpoints: the file reads back what was written and refuses damage; a run cancelled mid-epoch
// or stopped after an epoch and resumed ends with exactly the parameters of the run never interrupted (Adam,
// a cosine schedule, dropout and BatchNorm, two devices); mismatched, corrupt and unwritable checkpoint
// directories each get their clear error or warning.
#include <QtTest>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "gpunodes/errors.h"
#include "gpunodes/nn/checkpoint.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/nn/trainer.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;
namespace fs = std::filesystem;

namespace {

// A small drawn network with every kind of state a checkpoint must carry: weights, BatchNorm's running
// statistics and counter, and dropout's mask numbering.
ModelOptions dropoutNet() {
  ModelOptions o;
  o.arch = Arch::Network;
  o.network = std::make_shared<const NetworkSpec>(NetworkSpec::parse(
      "network x:Input(shape=1x28x28); f:Flatten()<-x; fc1:Linear(out_features=32)<-f; "
      "bn:BatchNorm1d()<-fc1; r:ReLU()<-bn; d:Dropout(p=0.25)<-r; fc2:Linear(out_features=10)<-d"));
  o.init = Init::Kaiming;
  o.seed = 7;
  return o;
}

TrainOptions adamCosine(const std::string& dir, int64_t epochs = 3) {
  TrainOptions o;
  o.epochs = epochs;
  o.batch_size = 64;
  o.optimizer.kind = OptimizerKind::Adam;
  o.optimizer.lr = 3e-3;
  o.schedule.kind = ScheduleKind::Cosine;
  o.schedule.warmup_epochs = 1;
  o.shuffle_seed = 5;
  o.log_every = 4;
  o.checkpoint.dir = dir;
  return o;
}

std::vector<std::vector<float>> stateOf(const Model& m) {
  std::vector<std::vector<float>> out;
  for (const Parameter* p : m.state()) out.push_back(to_host(p->value));
  return out;
}

DatasetPtr trainSet() {
  SyntheticOptions s;
  s.count = 600;  // 10 batches of 64 (the last one short)
  return make_synthetic(s);
}

DatasetPtr testSet() {
  SyntheticOptions s;
  s.count = 128;
  s.seed = 1;
  return make_synthetic(s);
}

struct Trained {
  std::vector<std::vector<float>> state;
  int64_t tracked = 0;
  TrainResult result;
  std::vector<std::string> warnings;
  std::vector<MetricSample> metrics;
};

// Trains a fresh model of `options` on `devices`; `cancel_at` > 0 cancels the trainer at that metric sample.
Trained train(const TrainOptions& o, std::vector<Device> devices = {Device::cpu()}, int cancel_at = 0,
              bool* cancelled = nullptr) {
  Runtime rt(RuntimeOptions{.cpu_devices = 2});
  auto m = Model::create(rt, dropoutNet(), devices.front());
  Trainer t(*m, devices, o);
  Trained out;
  int samples = 0;
  try {
    out.result = t.fit(
        trainSet(), testSet(),
        [&](const MetricSample& s) {
          out.metrics.push_back(s);
          if (cancel_at > 0 && ++samples == cancel_at) t.cancel();
        },
        [&](const std::string& w) { out.warnings.push_back(w); });
  } catch (const CancelledError&) {
    if (!cancelled) throw;
    *cancelled = true;
  }
  out.state = stateOf(*m);
  out.tracked = m->batches_tracked();
  return out;
}

std::vector<char> readAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

void writeAll(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::vector<std::string> names(const std::string& dir) {
  std::vector<std::string> out;
  for (const CheckpointFile& f : list_checkpoints(dir)) out.push_back(fs::path(f.path).filename().string());
  return out;
}

}  // namespace

class CheckpointTest : public QObject {
  Q_OBJECT

 private slots:
  void a_checkpoint_reads_back_what_was_written() {
    TempDir dir;
    TrainingCheckpoint c;
    c.signature = "mlp classes=10 in_channels=1 image_size=28";
    c.settings = {{"optimizer", "adam"}, {"lr", "0.001"}};
    c.epoch = 2;
    c.batch = 3;
    c.global_step = 23;
    c.optimizer_steps = 23;
    c.batches_tracked = 23;
    c.seconds = 1.25;
    c.epoch_seconds = 0.1;
    c.totals = {12.5, 100, 192};
    c.totals.padded = 17;
    c.shares = {0.25, 0.75};
    c.epochs = {{1, 2.0, 0.5, 0.6, 1.0, 500, 0.2, 1.5, 0.01}, {2, 1.0, 0.7, NAN, 1.1, 450, 0.2, 1.6, 0.02}};
    // A language model's and a regression's epoch measures (the 15-column table).
    c.epochs[1].test_loss = 1.25, c.epochs[1].test_perplexity = 3.5, c.epochs[1].test_mse = 0.125;
    c.epochs[1].test_mae = 0.25, c.epochs[1].test_r2 = 0.875, c.epochs[1].train_mse = 0.0625;
    c.metrics = {{"loss", 0.5, 4, 0.2, 2.2}, {"lr", 0.5, 4, 0.2, 1e-3}, {"loss", 1.0, 8, 0.4, 1.9}};
    c.state = {{"0.weight", {2, 3}, {1, 2, 3, 4, 5, 6}}, {"0.bias", {2}, {-1, 1}}};
    c.optimizer = {{"0.weight/0", {2, 3}, {0.1f, 0.2f, 0.3f, 0.4f, 0.5f, 0.6f}}};
    c.loss_scale = 32768;
    c.loss_scale_good_steps = 3;
    c.skipped_steps = 2;
    const std::string path = dir.file(checkpoint_file_name(2, 3));
    write_checkpoint(path, c);
    const TrainingCheckpoint r = read_checkpoint(path);
    QCOMPARE(r.loss_scale, 32768.0);
    QCOMPARE(r.loss_scale_good_steps, int64_t(3));
    QCOMPARE(r.skipped_steps, int64_t(2));
    QCOMPARE(r.signature, c.signature);
    QVERIFY(r.settings == c.settings);
    QCOMPARE(r.epoch, 2);
    QCOMPARE(r.batch, 3);
    QCOMPARE(r.global_step, 23);
    QCOMPARE(r.batches_tracked, 23);
    QCOMPARE(r.seconds, 1.25);
    QCOMPARE(r.totals.loss_sum, 12.5);
    QCOMPARE(r.totals.padded, int64_t(17));
    QCOMPARE(r.totals.samples, int64_t(192));
    QVERIFY(r.shares == c.shares);
    QCOMPARE(r.epochs.size(), size_t(2));
    QCOMPARE(r.epochs[1].train_acc, 0.7);
    QCOMPARE(r.epochs[1].test_loss, 1.25);
    QCOMPARE(r.epochs[1].test_perplexity, 3.5);
    QCOMPARE(r.epochs[1].test_mse, 0.125);
    QCOMPARE(r.epochs[1].test_mae, 0.25);
    QCOMPARE(r.epochs[1].test_r2, 0.875);
    QCOMPARE(r.epochs[1].train_mse, 0.0625);
    QVERIFY(std::isnan(r.epochs[1].test_acc));
    QCOMPARE(r.epochs[0].loader_ms_per_batch, 0.2);
    QVERIFY(std::isnan(r.epochs[0].test_perplexity));
    QCOMPARE(r.metrics.size(), size_t(3));
    QCOMPARE(r.metrics[1].series, std::string("lr"));
    QCOMPARE(r.metrics[2].step, int64_t(8));
    QCOMPARE(r.metrics[2].value, 1.9);
    QCOMPARE(r.state.size(), size_t(2));
    QVERIFY(r.state[0].values == c.state[0].values);
    QVERIFY(r.state[0].shape == (Shape{2, 3}));
    QCOMPARE(r.optimizer[0].name, std::string("0.weight/0"));
    QVERIFY(r.optimizer[0].values == c.optimizer[0].values);

    // Every single changed byte of the data is noticed, and so is a cut.
    const std::vector<char> good = readAll(path);
    std::vector<char> flipped = good;
    flipped[flipped.size() - 5] ^= 0x10;
    writeAll(path, flipped);
    expect_error([&] { read_checkpoint(path); }, {"corrupt", "checksum", QString::fromStdString(path)});
    writeAll(path, std::vector<char>(good.begin(), good.end() - 7));
    expect_error([&] { read_checkpoint(path); }, {"corrupt"});
    writeAll(path, std::vector<char>(good.begin(), good.begin() + 5));
    expect_error([&] { read_checkpoint(path); }, {"corrupt"});
  }

  void checkpoints_are_listed_newest_first_and_nothing_else() {
    TempDir dir;
    for (const char* name : {"checkpoint-e0001.safetensors", "checkpoint-e0002-b000004.safetensors",
                             "checkpoint-e0002.safetensors", "checkpoint-e0010.safetensors", "notes.txt",
                             "checkpoint-e0003.safetensors.tmp", "checkpoint-e3.safetensors",
                             "checkpoint-e0004-b000000.safetensors"})
      writeAll(dir.file(name), {'x'});
    QVERIFY((names(dir.path.string()) ==
             std::vector<std::string>{"checkpoint-e0010.safetensors", "checkpoint-e0002-b000004.safetensors",
                                      "checkpoint-e0002.safetensors", "checkpoint-e0001.safetensors"}));
    QVERIFY(list_checkpoints(dir.file("missing")).empty());
  }

  void resuming_after_an_epoch_ends_exactly_where_the_whole_run_does() {
    TempDir whole, part;
    const Trained reference = train(adamCosine(whole.path.string()));
    QCOMPARE(reference.result.epochs.size(), size_t(3));
    QVERIFY(reference.result.resumed_from.empty());
    // keep 3: after epochs 1, 2 and 3.
    QVERIFY((names(whole.path.string()) == std::vector<std::string>{"checkpoint-e0003.safetensors",
                                                                    "checkpoint-e0002.safetensors",
                                                                    "checkpoint-e0001.safetensors"}));

    // The same run, from the checkpoint after epoch 1.
    fs::copy_file(whole.file("checkpoint-e0001.safetensors"), part.file("checkpoint-e0001.safetensors"));
    TrainOptions o = adamCosine(part.path.string());
    o.checkpoint.resume = true;
    const Trained resumed = train(o);
    QCOMPARE(QString::fromStdString(resumed.result.resumed_from),
             QString::fromStdString(part.file("checkpoint-e0001.safetensors")));
    QVERIFY(resumed.warnings.empty());
    QVERIFY2(resumed.state == reference.state, "the resumed parameters differ from the uninterrupted run's");
    QCOMPARE(resumed.tracked, reference.tracked);
    // The report has every epoch, the first one from the checkpoint, and the plot every point.
    QCOMPARE(resumed.result.epochs.size(), size_t(3));
    QCOMPARE(resumed.result.epochs[0].train_loss, reference.result.epochs[0].train_loss);
    QCOMPARE(resumed.result.epochs[2].test_acc, reference.result.epochs[2].test_acc);
    QCOMPARE(resumed.metrics.size(), reference.metrics.size());
    for (size_t i = 0; i < resumed.metrics.size(); ++i) {
      QCOMPARE(resumed.metrics[i].series, reference.metrics[i].series);
      QCOMPARE(resumed.metrics[i].epoch, reference.metrics[i].epoch);
      QCOMPARE(resumed.metrics[i].step, reference.metrics[i].step);
    }

    // A finished run resumed trains nothing and hands back its model.
    const Trained again = train(o);
    QVERIFY(again.state == reference.state);
    QCOMPARE(again.result.epochs.size(), size_t(3));
    QVERIFY(again.result.checkpoints.empty());
  }

  void a_cancel_mid_epoch_saves_and_the_resumed_run_ends_bit_exact() {
    // Two devices: the batch is split, gradients summed on the host, each replica keeps optimizer state.
    const std::vector<Device> two{Device::cpu(0), Device::cpu(1)};
    TempDir whole, part;
    TrainOptions o = adamCosine(whole.path.string());
    o.checkpoint.every = 0;  // only at a cancel (and none here)
    const Trained reference = train(o, two);
    QVERIFY(list_checkpoints(whole.path.string()).empty());

    o.checkpoint.dir = part.path.string();
    bool cancelled = false;
    // Epoch 1 sends 4 samples after batches 4 and 8 and 12 at its end: sample 22 comes after batch 4 of
    // epoch 2.
    const Trained stopped = train(o, two, 22, &cancelled);
    QVERIFY(cancelled);
    const std::vector<CheckpointFile> files = list_checkpoints(part.path.string());
    QCOMPARE(files.size(), size_t(1));
    QCOMPARE(files[0].epoch, int64_t(1));
    QCOMPARE(files[0].batch, int64_t(4));
    QVERIFY(stopped.state != reference.state);

    o.checkpoint.resume = true;
    const Trained resumed = train(o, two);
    QVERIFY2(resumed.state == reference.state, "the resumed parameters differ from the uninterrupted run's");
    QCOMPARE(resumed.result.epochs.size(), size_t(3));
    QCOMPARE(resumed.result.epochs[2].test_acc, reference.result.epochs[2].test_acc);
  }

  void a_loss_scaled_run_resumes_bit_exact() {
    // A scale of 2^140 overflows float32 at once: the first steps are skipped while it backs off, and near
    // float32's limit it keeps growing (every 2 good steps) and backing off. A resumed run that lost the
    // scale or its streak would skip other steps.
    TempDir whole, part;
    TrainOptions o = adamCosine(whole.path.string());
    o.loss_scale = {.mode = LossScaleMode::Dynamic, .init = std::ldexp(1.0, 140), .interval = 2};
    const Trained reference = train(o);
    std::vector<double> scales;
    for (const MetricSample& m : reference.metrics)
      if (m.series == "loss_scale") scales.push_back(std::log2(m.value));
    QString seen;
    for (double e : scales) seen += QString(" 2^%1").arg(e);
    qInfo("loss scales logged:%s", qPrintable(seen));
    QVERIFY(scales.front() < 140);  // it backed off ...
    QVERIFY(std::adjacent_find(scales.begin(), scales.end(), std::less<double>()) != scales.end());  // ... and grew
    fs::copy_file(whole.file("checkpoint-e0001.safetensors"), part.file("checkpoint-e0001.safetensors"));
    o.checkpoint.dir = part.path.string();
    o.checkpoint.resume = true;
    const Trained resumed = train(o);
    QVERIFY(!resumed.result.resumed_from.empty());
    QVERIFY2(resumed.state == reference.state, "the resumed parameters differ from the uninterrupted run's");
    // A run without loss scaling cannot continue it.
    o.loss_scale.mode = LossScaleMode::Off;
    expect_error([&] { train(o); }, {"resume", "loss_scale", "this run does not set it"});
  }

  void a_checkpoint_of_another_run_is_refused_naming_the_difference() {
    TempDir dir;
    train(adamCosine(dir.path.string(), 1));
    TrainOptions o = adamCosine(dir.path.string(), 1);
    o.checkpoint.resume = true;
    o.optimizer.lr = 1e-3;
    expect_error([&] { train(o); }, {"resume", "lr", "0.003", "0.001", "checkpoint-e0001"});
    o = adamCosine(dir.path.string(), 2);  // cosine's rates depend on the epochs
    o.checkpoint.resume = true;
    expect_error([&] { train(o); }, {"epochs", "1", "2"});
    // Another model.
    o = adamCosine(dir.path.string(), 1);
    o.checkpoint.resume = true;
    Runtime rt;
    auto mlp = Model::create(rt, modelOptions(Arch::Mlp), Device::cpu());
    Trainer t(*mlp, {Device::cpu()}, o);
    expect_error([&] { t.fit(trainSet(), testSet()); }, {"model", "another model", "mlp"});
  }

  void a_corrupt_newest_checkpoint_is_skipped_with_a_warning() {
    TempDir whole, dir;
    const Trained reference = train(adamCosine(whole.path.string()));
    fs::copy_file(whole.file("checkpoint-e0001.safetensors"), dir.file("checkpoint-e0001.safetensors"));
    std::vector<char> bytes = readAll(whole.file("checkpoint-e0002.safetensors"));
    bytes[bytes.size() / 2] ^= 1;
    writeAll(dir.file("checkpoint-e0002.safetensors"), bytes);
    TrainOptions o = adamCosine(dir.path.string());
    o.checkpoint.resume = true;
    const Trained resumed = train(o);
    QCOMPARE(resumed.warnings.size(), size_t(1));
    QVERIFY2(QString::fromStdString(resumed.warnings[0]).contains("checkpoint-e0002") &&
                 QString::fromStdString(resumed.warnings[0]).contains("checksum") &&
                 QString::fromStdString(resumed.warnings[0]).contains("skipped"),
             resumed.warnings[0].c_str());
    QVERIFY(resumed.result.resumed_from.find("checkpoint-e0001") != std::string::npos);
    QVERIFY(resumed.state == reference.state);
  }

  void an_unwritable_checkpoint_dir_fails_before_training() {
    TempDir dir;
    writeAll(dir.file("a-file"), {'x'});
    const std::string under_a_file = dir.file("a-file") + "/checkpoints";
    std::atomic<int> samples{0};
    Runtime rt;
    auto m = Model::create(rt, dropoutNet(), Device::cpu());
    Trainer t(*m, {Device::cpu()}, adamCosine(under_a_file));
    expect_error([&] { t.fit(trainSet(), testSet(), [&](const MetricSample&) { ++samples; }); },
                 {"checkpoint_dir", QString::fromStdString(under_a_file)});
    QCOMPARE(samples.load(), 0);
  }

  void keep_removes_the_oldest() {
    TempDir dir;
    TrainOptions o = adamCosine(dir.path.string(), 4);
    o.schedule.kind = ScheduleKind::Constant;
    o.checkpoint.keep = 2;
    const Trained r = train(o);
    QCOMPARE(r.result.checkpoints.size(), size_t(4));
    QVERIFY((names(dir.path.string()) ==
             std::vector<std::string>{"checkpoint-e0004.safetensors", "checkpoint-e0003.safetensors"}));
    // A constant rate does not depend on the length: the finished run continues for two more epochs.
    o.epochs = 6;
    o.checkpoint.resume = true;
    const Trained longer = train(o);
    QCOMPARE(longer.result.epochs.size(), size_t(6));
    QVERIFY(longer.result.resumed_from.find("checkpoint-e0004") != std::string::npos);
  }
};

QTEST_APPLESS_MAIN(CheckpointTest)
#include "test_checkpoint.moc"
