// The training nodes through the host's executor with the real plugin: the four training examples at shrunk
// sizes, the live metric series, cancel in the middle of an epoch, parameter files (round trip, another
// device, wrong architecture, corrupt files), data parallel on two CPU devices, and the checks before a run.
// The examples read the real Fashion-MNIST files when the dataset-fashion-mnist package is installed; without
// them the same graphs run on the synthetic set, so nothing is skipped.
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QTemporaryDir>
#include <QtTest>
#include <chrono>
#include <cmath>

#include "nodes_test_util.h"

using namespace nodes_test;
using namespace std::chrono_literals;

namespace {

const QString kFashionMnist = "/usr/share/datasets/fashion-mnist";

bool haveFashionMnist() {
  for (const char* f : {"train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte",
                        "t10k-labels-idx1-ubyte"})
    if (!QFileInfo::exists(kFashionMnist + "/" + f + ".gz") && !QFileInfo::exists(kFashionMnist + "/" + f))
      return false;
  return true;
}

// Every Dataset node of the graph, shrunk; switched to the synthetic set where Fashion-MNIST is missing.
void shrinkData(GraphDocument& doc, int limit, int batch) {
  for (const GraphNode& n : doc.nodes()) {
    if (n.type != "Dataset") continue;
    doc.setParam(n.id, "limit", limit);
    doc.setParam(n.id, "batch_size", batch);
    if (!haveFashionMnist()) doc.setParam(n.id, "name", "synthetic");
  }
}

void shrinkTraining(GraphDocument& doc, int epochs, int logEvery) {
  for (const GraphNode& n : doc.nodes()) {
    if (n.type != "Train") continue;
    doc.setParam(n.id, "epochs", epochs);
    doc.setParam(n.id, "log_every", logEvery);
  }
}

QString tryGpu0(const GraphDocument& doc) {
  return plugin()->environment(settingsOf(doc))["try_gpu(0)"].toString();
}

// The Metric events of a run, by series.
QMap<QString, QList<QPair<double, double>>> metricEvents(const RunResult& r) {
  QMap<QString, QList<QPair<double, double>>> out;
  for (const RunEvent& e : r.events)
    if (e.kind == RunEvent::Kind::Metric) out[e.series].append({e.t, e.value});
  return out;
}

// Model (mlp) and Dataset (synthetic) into Train on `devices` devices of AllDevices, as a test graph.
void syntheticTrainingGraph(GraphDocument& doc, int cpuDevices, int epochs, int batch) {
  doc.setSettings(QJsonObject{{"cpu_devices", cpuDevices}});
  doc.addNode(makeNode("all", "AllDevices"));
  doc.addNode(makeNode("data", "Dataset", {{"name", "synthetic"}, {"batch_size", batch}}));
  doc.addNode(makeNode("net", "Model", {{"arch", "mlp"}}));
  doc.addNode(makeNode("train", "Train", {{"epochs", epochs}, {"lr", 0.1}, {"log_every", 8}}));
  wire(doc, "all.devices", "net.device");
  wire(doc, "net.model", "train.model");
  wire(doc, "data.data", "train.data");
  wire(doc, "all.devices", "train.devices");
}

QJsonArray devicesOf(const QJsonArray& inspect) {
  QJsonArray out;
  for (const QJsonValue& e : inspect) out.append(e.toObject()["device"]);
  return out;
}

QStringList errorsFor(const ValidationReport& report, const QString& node) {
  QStringList out;
  for (const Issue& i : report.forNode(node))
    if (i.severity == Issue::Severity::Error) out.append(i.field + ": " + i.message);
  return out;
}

}  // namespace

class TrainingTest : public QObject {
  Q_OBJECT

  QTemporaryDir tmp_;

 private slots:
  void initTestCase() {
    QVERIFY2(plugin(), "the GPU node set did not load from " GN_NODES_PLUGIN);
    QVERIFY(tmp_.isValid());
    if (!haveFashionMnist())
      qInfo("dataset-fashion-mnist is not installed: the examples run on the synthetic set instead");
  }

  void examples_load_validate_and_keep_the_seed_sizes() {
    for (const QString name :
         {"net-on-device", "mlp-fashion-mnist", "lenet-fashion-mnist", "resnet18-fashion-mnist"}) {
      GraphDocument doc;
      QVERIFY2(loadExample(name, doc), qPrintable(name));
      QVERIFY2(doc.description().size() > 200, qPrintable(name + " needs a description of what to compare"));
      QVERIFY(!doc.name().isEmpty());
      if (!haveFashionMnist()) shrinkData(doc, 0, 256);
      const ValidationReport report = validate(doc, registry(), settingsOf(doc));
      QStringList errors;
      for (const Issue& i : report.errors()) errors.append(i.text());
      QVERIFY2(report.ok(), qPrintable(name + ": " + errors.join("; ")));
    }
    GraphDocument doc;
    QVERIFY(loadExample("resnet18-fashion-mnist", doc));
    QVERIFY(doc.description().contains("GPU"));
    QCOMPARE(doc.node("net_1gpu")->params["arch"].toString(), QString("resnet18"));
    QCOMPARE(doc.node("data_256")->params["batch_size"].toInt(), 256);
    QCOMPARE(doc.node("data_512")->params["batch_size"].toInt(), 512);
    QCOMPARE(doc.node("train_1gpu")->params["lr"].toDouble(), 0.1);
    QCOMPARE(doc.node("train_2gpu")->params["lr"].toDouble(), 0.2);
    QCOMPARE(doc.node("train_1gpu")->params["epochs"].toInt(), 10);
    QCOMPARE(doc.node("train_2gpu")->params["epochs"].toInt(), 10);
    QCOMPARE(doc.node("gpus")->params["count"].toInt(), 2);
    QVERIFY(loadExample("mlp-fashion-mnist", doc));
    QCOMPARE(doc.node("data")->params["batch_size"].toInt(), 256);
    QCOMPARE(doc.node("train")->params["lr"].toDouble(), 0.1);
    QCOMPARE(doc.node("net")->params["init_std"].toDouble(), 0.01);
  }

  void net_on_device_shows_where_the_params_live() {
    GraphDocument doc;
    QVERIFY(loadExample("net-on-device", doc));
    const QString path = tmp_.filePath("net.params");
    doc.setParam("save", "path", path);
    doc.setParam("load_cpu", "path", path);
    const QString dev = tryGpu0(doc);
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    // The Model's report: every parameter, with the seed's net[0].weight.data.device.
    const QJsonArray params = r.node("net")["parameters"].toArray();
    QCOMPARE(params.size(), 2);
    QCOMPARE(params[0].toObject()["name"].toString(), QString("0.weight"));
    QCOMPARE(params[0].toObject()["shape"].toArray(), (QJsonArray{1, 3}));
    QCOMPARE(params[1].toObject()["name"].toString(), QString("0.bias"));
    for (const QJsonValue& p : params) QCOMPARE(p.toObject()["device"].toString(), dev);
    // Inspect on Parameters: the tensors themselves, on that device.
    const QJsonArray shown = r.node("show_params")["inspect"].toArray();
    QCOMPARE(devicesOf(shown), (QJsonArray{dev, dev}));
    const std::vector<double> w = r.inspected("show_params", 0), b = r.inspected("show_params", 1);
    QCOMPARE(w.size(), size_t(3));
    // net(X) with X = ones(2, 3): both rows are w0 + w1 + w2 + b, on the model's device.
    const QJsonObject y = r.node("show_y")["inspect"].toArray()[0].toObject();
    QCOMPARE(y["device"].toString(), dev);
    QCOMPARE(y["shape"].toArray(), (QJsonArray{2, 1}));
    const double want = w[0] + w[1] + w[2] + b[0];
    for (double v : r.inspected("show_y")) QVERIFY(std::fabs(v - want) < 1e-5);
    // Saved from the device, loaded onto the CPU: the same values, now on cpu.
    QCOMPARE(devicesOf(r.node("show_loaded")["inspect"].toArray()), (QJsonArray{"cpu", "cpu"}));
    QCOMPARE(r.inspected("show_loaded", 0), w);
    QCOMPARE(r.inspected("show_loaded", 1), b);
    QCOMPARE(r.node("load_cpu")["parameters"].toArray()[0].toObject()["device"].toString(), QString("cpu"));
  }

  void mlp_example_streams_the_metric_series() {
    GraphDocument doc;
    QVERIFY(loadExample("mlp-fashion-mnist", doc));
    shrinkData(doc, 512, 64);
    shrinkTraining(doc, 2, 2);
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const auto events = metricEvents(r);
    const QJsonObject metrics = r.report["metrics"].toObject();
    const QString dev = tryGpu0(doc);
    // 512 / 64 = 8 batches an epoch: the loss every 2 batches inside it (at 2, 4, 6) and once at its end.
    for (const QString series : {"train.loss", "train.train_acc", "train.images_per_second"})
      QVERIFY2(events[series].size() == 8,
               qPrintable(series + ": " + QString::number(events[series].size())));
    for (const QString& series :
         QStringList{"train.test_acc", "train.epoch_seconds", "train.memory_mb/" + dev})
      QVERIFY2(events[series].size() == 2, qPrintable(series));
    // Every event is in the report too, and the x axis is epochs (the untrained model's point is at 0).
    QCOMPARE(metrics.keys(), QStringList(events.keyBegin(), events.keyEnd()));
    for (auto it = events.begin(); it != events.end(); ++it) {
      QCOMPARE(metrics[it.key()].toArray().size(), qsizetype(it.value().size()));
      if (it.key().startsWith("untrained.")) continue;
      for (const auto& [t, v] : it.value()) {
        QVERIFY(t > 0 && t <= 2);
        QVERIFY2(std::isfinite(v), qPrintable(it.key()));
      }
    }
    QCOMPARE(events["train.loss"].first().first, 0.25);
    QCOMPARE(events["train.test_acc"].last().first, 2.0);
    for (const auto& [t, acc] : events["train.test_acc"]) QVERIFY(acc >= 0 && acc <= 1);
    for (const auto& [t, s] : events["train.epoch_seconds"]) QVERIFY(s > 0);
    // Metric events come from the Train node, and its progress reaches 1.
    double progress = 0;
    for (const RunEvent& e : r.events) {
      if (e.kind == RunEvent::Kind::Metric && e.series.startsWith("train."))
        QCOMPARE(e.node, QString("train"));
      if (e.kind == RunEvent::Kind::Progress && e.node == "train") progress = std::max(progress, e.value);
    }
    QCOMPARE(progress, 1.0);
    // The report: per epoch, and the last epoch's figures.
    const QJsonObject train = r.node("train");
    QCOMPARE(train["epochs"].toArray().size(), 2);
    QCOMPARE(train["devices"].toArray(), QJsonArray{dev});
    QCOMPARE(train["test_acc"].toDouble(), events["train.test_acc"].last().second);
    QVERIFY(train["seconds_per_epoch"].toDouble() > 0);
    // Evaluate on the trained model gives the accuracy Train measured; the untrained copy is left as it was.
    QCOMPARE(r.node("test")["accuracy"].toDouble(), train["test_acc"].toDouble());
    QCOMPARE(metrics["test.accuracy"].toArray()[0].toArray()[0].toDouble(), 2.0);
    QVERIFY(r.node("untrained")["accuracy"].toDouble() < 0.3);
    if (haveFashionMnist()) QVERIFY2(train["test_acc"].toDouble() > 0.3, "the MLP learned nothing");
  }

  void lenet_example_trains() {
    GraphDocument doc;
    QVERIFY(loadExample("lenet-fashion-mnist", doc));
    shrinkData(doc, 256, 64);
    shrinkTraining(doc, 1, 1);
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const auto events = metricEvents(r);
    QCOMPARE(events["train.loss"].size(), 4);  // after batches 1, 2, 3 and the epoch
    for (const auto& [t, loss] : events["train.loss"]) QVERIFY(std::isfinite(loss) && loss > 0);
    QCOMPARE(events["train.test_acc"].size(), 1);
    QVERIFY(r.node("test")["accuracy"].isDouble());
    const QJsonArray params = r.node("net")["parameters"].toArray();
    QCOMPARE(params[0].toObject()["shape"].toArray(), (QJsonArray{6, 1, 5, 5}));
  }

  void resnet18_example_runs_both_branches() {
    GraphDocument doc;
    QVERIFY(loadExample("resnet18-fashion-mnist", doc));
    shrinkData(doc, 48, 16);
    shrinkTraining(doc, 1, 1);
    doc.setParam("data_512", "batch_size", 32);
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonArray all = plugin()->environment(settingsOf(doc))["try_all_gpus()"].toArray();
    QJsonArray two;
    for (int i = 0; i < std::min<qsizetype>(2, all.size()); ++i) two.append(all[i]);
    QCOMPARE(r.node("train_1gpu")["devices"].toArray(), QJsonArray{tryGpu0(doc)});
    QCOMPARE(r.node("train_2gpu")["devices"].toArray(), two);
    const auto events = metricEvents(r);
    for (const QString node : {"train_1gpu", "train_2gpu"}) {
      QCOMPARE(events[node + ".test_acc"].size(), 1);
      QCOMPARE(events[node + ".epoch_seconds"].size(), 1);
      QVERIFY(!events[node + ".loss"].isEmpty());
    }
    // Each device of the two-device branch ran its share of the work.
    if (two.size() == 2) {
      QCOMPARE(r.node("train_2gpu")["batch_split"].toArray(), (QJsonArray{16, 16}));
      for (const QJsonValue& d : two) {
        bool ran = false;
        for (const TraceSpan& s : r.spansOf("train_2gpu")) ran = ran || s.device == d.toString();
        QVERIFY2(ran, qPrintable(d.toString()));
      }
    }
    QCOMPARE(r.node("net_1gpu")["parameters"].toArray().size(),
             r.node("net_2gpu")["parameters"].toArray().size());
  }

  void model_on_two_cpu_devices_via_all_devices_trains() {
    GraphDocument doc;
    syntheticTrainingGraph(doc, 2, 2, 63);  // 63 does not divide by 2: the batch is split 32 + 31
    doc.addNode(makeNode("test", "Evaluate"));
    wire(doc, "train.model", "test.model");
    wire(doc, "data.data", "test.data");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject train = r.node("train");
    QCOMPARE(train["devices"].toArray(), (QJsonArray{"cpu", "cpu:1"}));
    QCOMPARE(train["batch_split"].toArray(), (QJsonArray{32, 31}));
    QVERIFY(train["reducer"].toString().startsWith("host"));
    QVERIFY2(train["test_acc"].toDouble() > 0.9, qPrintable(QString::number(train["test_acc"].toDouble())));
    QCOMPARE(r.node("test")["accuracy"].toDouble(), train["test_acc"].toDouble());
    // Both devices ran forward and backward; the model came from AllDevices' first device.
    QSet<QString> devices;
    for (const TraceSpan& s : r.spansOf("train")) devices.insert(s.device);
    QVERIFY(devices.contains("cpu") && devices.contains("cpu:1"));
    QCOMPARE(r.node("net")["device_of_model"].toString(), QString("cpu"));
    const QJsonObject metrics = r.report["metrics"].toObject();
    QCOMPARE(metrics["train.memory_mb/cpu:1"].toArray().size(), 2);
    QCOMPARE(metrics["train.share/cpu:1"].toArray().size(), 2);
  }

  void captured_steps_are_reported() {
    GraphDocument doc;
    syntheticTrainingGraph(doc, 1, 1, 32);
    doc.setParam("train", "capture", "on");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject train = r.node("train");
    QVERIFY2(train["capture"].toString().startsWith("replayed ") &&
                 train["capture"].toString().endsWith(" recorded ops"),
             qPrintable(train["capture"].toString()));
    QVERIFY(train["replayed_steps"].toDouble() > 0);
    QVERIFY2(train["test_acc"].toDouble() > 0.5, qPrintable(QString::number(train["test_acc"].toDouble())));
  }

  void loss_scaling_reports_its_scale() {
    GraphDocument doc;
    syntheticTrainingGraph(doc, 1, 1, 64);
    doc.setParam("train", "loss_scale", "dynamic");
    doc.setParam("train", "loss_scale_interval", 2);
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject train = r.node("train");
    QCOMPARE(train["precision"].toString(), QString("fp32"));
    QCOMPARE(train["loss_scale"].toString(), QString("dynamic"));
    // Logged every 8 batches and at the epoch's end; 2^16 doubled every 2 good steps.
    const QJsonArray scales = r.report["metrics"].toObject()["train.loss_scale"].toArray();
    QVERIFY(scales.size() >= 2);
    QCOMPARE(scales.first().toArray()[1].toDouble(), 65536.0 * 16);  // after 8 steps
  }

  void cancel_mid_epoch_returns_within_a_second_and_frees_the_memory() {
    auto graph = [](GraphDocument& doc, bool withTrain) {
      doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
      doc.addNode(makeNode("data", "Dataset", {{"name", "synthetic"}, {"batch_size", 64}}));
      doc.addNode(makeNode("net", "Model", {{"arch", "lenet"}, {"init", "xavier"}}));
      wire(doc, "cpu.device", "net.device");
      if (!withTrain) return;
      doc.addNode(makeNode("train", "Train", {{"epochs", 100000}, {"lr", 0.9}, {"log_every", 1}}));
      wire(doc, "net.model", "train.model");
      wire(doc, "data.data", "train.data");
      wire(doc, "cpu.device", "train.devices");
    };
    GraphDocument base;
    graph(base, false);
    RunResult baseline = runGraph(base);
    QVERIFY2(baseline.failures().isEmpty(), qPrintable(baseline.failures().join("\n")));
    const double baseBytes =
        baseline.report["memory"].toObject()["cpu"].toObject()["current_bytes"].toDouble();
    QVERIFY(baseBytes > 0);  // the model's parameters

    GraphDocument doc;
    graph(doc, true);
    Executor ex(registry());
    QVERIFY(ex.start(doc, settingsOf(doc)));
    // Wait for a loss inside the first epoch (32 batches, one loss per batch), then cancel.
    QList<RunEvent> events;
    bool midEpoch = false;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!midEpoch && ex.isRunning() && std::chrono::steady_clock::now() < deadline) {
      for (const RunEvent& e : ex.events().waitAndDrain(50)) {
        events.append(e);
        midEpoch = midEpoch || (e.kind == RunEvent::Kind::Metric && e.series == "train.loss" && e.t < 1);
      }
    }
    QVERIFY2(midEpoch, "no loss came from inside the first epoch");
    const auto t0 = std::chrono::steady_clock::now();
    ex.cancel();
    ex.wait();
    const auto took = std::chrono::steady_clock::now() - t0;
    qInfo("cancel took %.0f ms", std::chrono::duration<double, std::milli>(took).count());
    QVERIFY2(took < 1s, "cancel in the middle of an epoch took longer than a second");
    const QJsonObject report = ex.report();
    QCOMPARE(report["cancelled"].toBool(), true);
    QCOMPARE(report["nodes"].toObject()["train"].toObject()["status"].toString(), QString("cancelled"));
    // Replicas, gradients, activations and batches are gone: what is left is what was there before.
    QCOMPARE(report["memory"].toObject()["cpu"].toObject()["current_bytes"].toDouble(), baseBytes);
  }

  void cancel_with_checkpoints_saves_where_it_stopped_and_resume_goes_on() {
    // With a checkpoint_dir the Train node's cancel is graceful: the steps in flight finish and the state is
    // saved mid-epoch, still within the second a cancel may take.
    QTemporaryDir tmp;
    const QString dir = tmp.filePath("ckpt");
    auto graph = [&](GraphDocument& doc, int epochs, const QString& resume) {
      doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
      doc.addNode(makeNode("data", "Dataset", {{"name", "synthetic"}, {"batch_size", 64}}));
      doc.addNode(makeNode("net", "Model", {{"arch", "lenet"}, {"init", "xavier"}}));
      doc.addNode(makeNode("train", "Train",
                           {{"epochs", epochs},
                            {"lr", 0.9},
                            {"log_every", 1},
                            {"checkpoint_dir", dir},
                            {"resume", resume}}));
      wire(doc, "cpu.device", "net.device");
      wire(doc, "net.model", "train.model");
      wire(doc, "data.data", "train.data");
      wire(doc, "cpu.device", "train.devices");
    };
    GraphDocument doc;
    graph(doc, 100000, "off");
    Executor ex(registry());
    QVERIFY(ex.start(doc, settingsOf(doc)));
    bool midEpoch = false;
    const auto deadline = std::chrono::steady_clock::now() + 60s;
    while (!midEpoch && ex.isRunning() && std::chrono::steady_clock::now() < deadline)
      for (const RunEvent& e : ex.events().waitAndDrain(50))
        midEpoch = midEpoch || (e.kind == RunEvent::Kind::Metric && e.series == "train.loss" && e.t > 0.2 &&
                                e.t < 0.8);
    QVERIFY2(midEpoch, "no loss came from the middle of the first epoch");
    const auto t0 = std::chrono::steady_clock::now();
    ex.cancel();
    ex.wait();
    const auto took = std::chrono::steady_clock::now() - t0;
    qInfo("cancel with a checkpoint took %.0f ms", std::chrono::duration<double, std::milli>(took).count());
    QVERIFY2(took < 1s, "cancel took longer than a second");
    const QJsonObject report = ex.report();
    QCOMPARE(report["nodes"].toObject()["train"].toObject()["status"].toString(), QString("cancelled"));
    const QStringList saved = QDir(dir).entryList({"checkpoint-*.safetensors"});
    QCOMPARE(saved.size(), 1);
    QVERIFY2(QRegularExpression(R"(checkpoint-e0000-b\d{6}\.safetensors)").match(saved[0]).hasMatch(),
             qPrintable(saved[0]));

    // Resumed with one epoch: it finishes the epoch that was cut short, and nothing more.
    GraphDocument again;
    graph(again, 1, "auto");
    RunResult r = runGraph(again);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject train = r.report["nodes"].toObject()["train"].toObject();
    QCOMPARE(train["resumed_from"].toString(), dir + "/" + saved[0]);
    QCOMPARE(train["epochs"].toArray().size(), 1);
    QVERIFY(QFile::exists(dir + "/checkpoint-e0001.safetensors"));
    QVERIFY(train["loader_ms_per_batch"].toDouble() > 0);
    QVERIFY(train["step_ms"].toDouble() > 0);
  }

  void cancel_reaches_the_trainer_through_the_session() {
    // The session's cancel alone (no executor): the Train node's execute returns with "cancelled".
    Harness h(RunSettings{});
    auto data = h.execute("data", "Dataset", {{"name", "synthetic"}, {"batch_size", 32}}, {});
    auto cpu = h.execute("cpu", "Device", {{"kind", "cpu"}}, {});
    auto net = h.execute("net", "Model", {{"arch", "mlp"}}, {{"device", cpu->outputs["device"]}});
    QString thrown;
    std::chrono::steady_clock::time_point cancelledAt;
    std::thread canceller([&] {
      std::this_thread::sleep_for(300ms);
      cancelledAt = std::chrono::steady_clock::now();
      h.session().cancel();
    });
    auto train = h.execute("train", "Train", {{"epochs", 100000}},
                           {{"model", net->outputs["model"]},
                            {"data", data->outputs["data"]},
                            {"devices", cpu->outputs["device"]}},
                           &thrown);
    const auto returned = std::chrono::steady_clock::now();
    canceller.join();
    QCOMPARE(thrown, QString("cancelled"));
    QVERIFY(returned - cancelledAt < 1s);
    QVERIFY(!train->outputs.contains("model"));
    h.waitDone("train");
  }

  void save_and_load_round_trip_onto_another_device() {
    const QString path = tmp_.filePath("mlp.params");
    GraphDocument doc;
    syntheticTrainingGraph(doc, 2, 1, 64);
    doc.setParam("all", "count", 1);  // train on cpu; load onto cpu:1
    doc.addNode(makeNode("save", "SaveParams", {{"path", path}}));
    doc.addNode(makeNode("cpu1", "Device", {{"kind", "cpu"}, {"index", 1}}));
    doc.addNode(makeNode("load", "LoadParams", {{"path", path}}));
    doc.addNode(makeNode("trained_params", "Parameters"));
    doc.addNode(makeNode("loaded_params", "Parameters"));
    doc.addNode(makeNode("acc_trained", "Evaluate"));
    doc.addNode(makeNode("acc_loaded", "Evaluate"));
    wire(doc, "train.model", "save.model");
    wire(doc, "save.model", "load.like");
    wire(doc, "cpu1.device", "load.device");
    wire(doc, "train.model", "trained_params.model");
    wire(doc, "load.model", "loaded_params.model");
    addInspect(doc, "show_trained", "trained_params.out");
    addInspect(doc, "show_loaded", "loaded_params.out");
    wire(doc, "train.model", "acc_trained.model");
    wire(doc, "data.data", "acc_trained.data");
    wire(doc, "load.model", "acc_loaded.model");
    wire(doc, "data.data", "acc_loaded.data");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    // The documented format: the magic first, and the model signature in the header.
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray bytes = f.readAll();
    QVERIFY(bytes.startsWith("GNPARAMS"));
    QVERIFY(bytes.contains("mlp classes=10 in_channels=1 image_size=28"));
    QCOMPARE(r.node("save")["file_bytes"].toDouble(), double(bytes.size()));
    // Same names, shapes and values; the loaded ones on cpu:1.
    const QJsonArray trained = r.node("show_trained")["inspect"].toArray(),
                     loaded = r.node("show_loaded")["inspect"].toArray();
    QCOMPARE(trained.size(), 4);
    QCOMPARE(loaded.size(), trained.size());
    for (int i = 0; i < trained.size(); ++i) {
      QCOMPARE(trained[i].toObject()["device"].toString(), QString("cpu"));
      QCOMPARE(loaded[i].toObject()["device"].toString(), QString("cpu:1"));
      QCOMPARE(loaded[i].toObject()["shape"], trained[i].toObject()["shape"]);
      QCOMPARE(r.inspected("show_loaded", i), r.inspected("show_trained", i));
    }
    QCOMPARE(r.node("load")["signature"].toString(), r.node("save")["signature"].toString());
    for (const QJsonValue& p : r.node("load")["parameters"].toArray())
      QCOMPARE(p.toObject()["device"].toString(), QString("cpu:1"));
    QCOMPARE(r.node("acc_loaded")["accuracy"].toDouble(), r.node("acc_trained")["accuracy"].toDouble());

    // Without `like`, the file says what to build.
    GraphDocument again;
    again.setSettings(QJsonObject{{"cpu_devices", 2}});
    again.addNode(makeNode("cpu1", "Device", {{"kind", "cpu"}, {"index", 1}}));
    again.addNode(makeNode("load", "LoadParams", {{"path", path}}));
    wire(again, "cpu1.device", "load.device");
    RunResult r2 = runGraph(again);
    QVERIFY2(r2.failures().isEmpty(), qPrintable(r2.failures().join("\n")));
    QCOMPARE(r2.node("load")["signature"].toString(), r.node("save")["signature"].toString());
  }

  void wrong_architecture_or_corrupt_file_fails_clearly() {
    const QString path = tmp_.filePath("for-lenet.params");
    {
      GraphDocument doc;
      doc.addNode(makeNode("net", "Model", {{"arch", "mlp"}}));
      doc.addNode(makeNode("save", "SaveParams", {{"path", path}}));
      wire(doc, "net.model", "save.model");
      RunResult r = runGraph(doc);
      QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    }
    auto loadInto = [&](const QString& file, const QString& arch) {
      GraphDocument doc;
      doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
      doc.addNode(makeNode("lenet", "Model", {{"arch", arch}}));
      doc.addNode(makeNode("load", "LoadParams", {{"path", file}}));
      wire(doc, "cpu.device", "load.device");
      wire(doc, "lenet.model", "load.like");
      return runGraph(doc);
    };
    RunResult wrong = loadInto(path, "lenet");
    QVERIFY(wrong.started);
    QCOMPARE(wrong.node("load")["status"].toString(), QString("failed"));
    const QString error = wrong.node("load")["error"].toString();
    QVERIFY2(error.contains("holds a 'mlp classes=10") && error.contains("'lenet classes=10") &&
                 error.contains("wrong architecture") && error.contains(path),
             qPrintable(error));
    QCOMPARE(loadInto(path, "mlp").node("load")["status"].toString(), QString("ok"));

    // Not a parameter file at all, and a truncated one.
    const QString garbage = tmp_.filePath("garbage.params"), truncated = tmp_.filePath("truncated.params");
    {
      QFile g(garbage);
      QVERIFY(g.open(QIODevice::WriteOnly));
      g.write("this is not a parameter file, only some text long enough to be read");
      QFile src(path), t(truncated);
      QVERIFY(src.open(QIODevice::ReadOnly) && t.open(QIODevice::WriteOnly));
      t.write(src.readAll().left(1000));
    }
    const QString notParams = loadInto(garbage, "mlp").node("load")["error"].toString();
    QVERIFY2(notParams.contains("not a gpunodes parameter file") && notParams.contains(garbage),
             qPrintable(notParams));
    const QString cut = loadInto(truncated, "mlp").node("load")["error"].toString();
    QVERIFY2(cut.contains("corrupt") || cut.contains("truncated"), qPrintable(cut));
  }

  void missing_or_corrupt_dataset_says_what_where_and_how_to_install() {
    // Missing: an error before the run, on the path.
    GraphDocument doc;
    doc.addNode(makeNode("data", "Dataset", {{"path", tmp_.filePath("no-such-dir")}}));
    ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QStringList errors = errorsFor(report, "data");
    QCOMPARE(errors.size(), 1);
    QVERIFY2(errors[0].startsWith("params.path: ") && errors[0].contains(tmp_.filePath("no-such-dir")) &&
                 errors[0].contains("apt-get install dataset-fashion-mnist"),
             qPrintable(errors[0]));
    // One file missing: named.
    QDir(tmp_.path()).mkpath("partial");
    const QString partial = tmp_.filePath("partial");
    for (const char* f :
         {"train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz", "t10k-images-idx3-ubyte.gz"}) {
      QFile out(partial + "/" + f);
      QVERIFY(out.open(QIODevice::WriteOnly));
      out.write("not gzip, not IDX");
    }
    doc.setParam("data", "path", partial);
    errors = errorsFor(validate(doc, registry(), settingsOf(doc)), "data");
    QCOMPARE(errors.size(), 1);
    QVERIFY2(errors[0].contains(partial + "/t10k-labels-idx1-ubyte.gz is missing"), qPrintable(errors[0]));
    // Only the training split needs only the training files; they exist but are corrupt: the run says so.
    doc.setParam("data", "split", "train");
    RunResult r = runGraph(doc);
    QVERIFY2(r.started, qPrintable(r.failures().join("\n")));
    const QString error = r.node("data")["error"].toString();
    QVERIFY2(error.contains("corrupt") && error.contains(partial + "/train-") &&
                 error.contains("dataset-fashion-mnist"),
             qPrintable(error));
  }

  void problems_are_known_before_the_run() {
    GraphDocument doc;
    doc.setSettings(QJsonObject{{"cpu_devices", 2}});
    doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("cpu1", "Device", {{"kind", "cpu"}, {"index", 1}}));
    doc.addNode(makeNode("data", "Dataset", {{"name", "synthetic"}, {"resize", 32}}));
    doc.addNode(makeNode("net", "Model", {{"arch", "mlp"}}));
    // No devices.
    doc.addNode(makeNode("data28", "Dataset", {{"name", "synthetic"}}));
    doc.addNode(makeNode("nodev", "Train"));
    wire(doc, "net.model", "nodev.model");
    wire(doc, "data28.data", "nodev.data");
    // The same device twice, and images of 32x32 for an MLP built for 28x28.
    doc.addNode(makeNode("twice", "Train"));
    wire(doc, "net.model", "twice.model");
    wire(doc, "data.data", "twice.data");
    wire(doc, "cpu.device", "twice.devices");
    wire(doc, "cpu.device", "twice.devices_2");
    // A tensor on cpu:1 into a model on cpu, and one of the wrong shape.
    doc.addNode(makeNode("x1", "Tensor", {{"shape", QJsonArray{2, 1, 28, 28}}}));
    wire(doc, "cpu1.device", "x1.device");
    doc.addNode(makeNode("fwd", "Forward"));
    wire(doc, "net.model", "fwd.model");
    wire(doc, "x1.out", "fwd.in");
    doc.addNode(makeNode("x2", "Tensor", {{"shape", QJsonArray{2, 3}}}));
    doc.addNode(makeNode("fwd2", "Forward"));
    wire(doc, "net.model", "fwd2.model");
    wire(doc, "x2.out", "fwd2.in");
    // A parameter file nobody writes, next to one a SaveParams of the graph writes.
    doc.addNode(makeNode("load", "LoadParams", {{"path", tmp_.filePath("nobody-writes-this.params")}}));
    wire(doc, "cpu.device", "load.device");
    doc.addNode(makeNode("save", "SaveParams", {{"path", tmp_.filePath("written-later.params")}}));
    wire(doc, "net.model", "save.model");
    doc.addNode(makeNode("load_later", "LoadParams", {{"path", tmp_.filePath("written-later.params")}}));
    wire(doc, "cpu.device", "load_later.device");
    wire(doc, "save.model", "load_later.like");
    // A test-only dataset cannot be trained on.
    doc.addNode(makeNode("testonly", "Dataset", {{"name", "synthetic"}, {"split", "test"}}));
    doc.addNode(makeNode("notrain", "Train"));
    wire(doc, "net.model", "notrain.model");
    wire(doc, "testonly.data", "notrain.data");
    wire(doc, "cpu.device", "notrain.devices");

    const ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QVERIFY(!report.ok());
    QCOMPARE(errorsFor(report, "nodev"),
             QStringList{"inputs.devices: required input is not connected (Devices)"});
    const QStringList twice = errorsFor(report, "twice");
    QCOMPARE(twice.size(), 2);
    QVERIFY2(twice.join("\n").contains("inputs.devices_2: cpu is wired in twice"),
             qPrintable(twice.join("\n")));
    QVERIFY2(
        twice.join("\n").contains("inputs.data: the mlp model is built for 28x28 images, but the dataset "
                                  "gives 32x32"),
        qPrintable(twice.join("\n")));
    QCOMPARE(errorsFor(report, "fwd"),
             QStringList{"inputs.in: Expected all tensors to be on the same device, but found at least two "
                         "devices, cpu:1 and cpu!"});
    QCOMPARE(errorsFor(report, "fwd2"),
             QStringList{"inputs.in: the mlp model takes [N, 1, 28, 28] images, got [2, 3]"});
    const QStringList load = errorsFor(report, "load");
    QCOMPARE(load.size(), 1);
    QVERIFY2(load[0].contains("nobody-writes-this.params does not exist"), qPrintable(load[0]));
    QCOMPARE(errorsFor(report, "load_later"), QStringList{});
    QCOMPARE(errorsFor(report, "notrain"),
             QStringList{"inputs.data: the dataset has no training split (set its split to both or train)"});
  }

  void adam_with_a_schedule_learns_fashion_mnist_on_one_and_two_devices() {
    if (!haveFashionMnist()) QSKIP("needs the real Fashion-MNIST: apt-get install dataset-fashion-mnist");
    // The MLP with Adam (lr 1e-3) for 3 epochs, the rate halved after 2 (step schedule) and label smoothing
    // 0.1, on the CPU and on two CPU devices with the batch split between them. Deterministic for a given
    // thread count; model and shuffle seeds 0..2 give test accuracy 0.854-0.857 here (plain Adam at a
    // constant rate 0.847-0.856 for seeds 0..3, PyTorch's Adam 0.853-0.855 for torch seeds 0..2).
    GraphDocument doc;
    doc.setSettings(QJsonObject{{"cpu_devices", 2}});
    doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("all", "AllDevices"));
    doc.addNode(
        makeNode("data", "Dataset", {{"path", kFashionMnist}, {"batch_size", 256}, {"shuffle_seed", 2}}));
    doc.addNode(makeNode("net", "Model", {{"arch", "mlp"}, {"seed", 2}}));
    wire(doc, "cpu.device", "net.device");
    const QJsonObject adam{
        {"epochs", 3},  {"optimizer", "adam"},    {"lr", 1e-3},     {"schedule", "step"}, {"step_size", 2},
        {"gamma", 0.5}, {"label_smoothing", 0.1}, {"log_every", 50}};
    for (const QString id : {"one", "two"}) {
      doc.addNode(makeNode(id, "Train", adam));
      wire(doc, "net.model", id + ".model");
      wire(doc, "data.data", id + ".data");
    }
    wire(doc, "cpu.device", "one.devices");
    wire(doc, "all.devices", "two.devices");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject one = r.node("one"), two = r.node("two");
    QCOMPARE(two["devices"].toArray(), (QJsonArray{"cpu", "cpu:1"}));
    QCOMPARE(one["optimizer"].toString(),
             QString("adam (lr 0.001, beta1 0.9, beta2 0.999, eps 1e-08, weight_decay 0)"));
    QCOMPARE(one["schedule"].toString(), QString("step (step_size 2, gamma 0.5)"));
    const QJsonArray e1 = one["epochs"].toArray(), e2 = two["epochs"].toArray();
    QCOMPARE(e1.size(), 3);
    for (int i = 0; i < 3; ++i) {
      const QJsonObject a = e1[i].toObject(), b = e2[i].toObject();
      qInfo("epoch %d: one device loss %.6f test acc %.4f; two devices loss %.6f test acc %.4f", i + 1,
            a["loss"].toDouble(), a["test_acc"].toDouble(), b["loss"].toDouble(), b["test_acc"].toDouble());
      // The same steps up to float sums in another order (the two halves' gradients are added on the host).
      QVERIFY2(std::abs(a["loss"].toDouble() - b["loss"].toDouble()) < 1e-3,
               qPrintable(QString("epoch %1").arg(i + 1)));
    }
    QVERIFY2(one["test_acc"].toDouble() >= 0.85, qPrintable(QString::number(one["test_acc"].toDouble())));
    QVERIFY2(two["test_acc"].toDouble() >= 0.85, qPrintable(QString::number(two["test_acc"].toDouble())));
    // The rate series: 4 points inside each epoch (235 batches, every 50) and one at its end: 1e-3 for two
    // epochs, then halved.
    const auto events = metricEvents(r);
    const auto& lr = events["one.lr"];
    QCOMPARE(lr.size(), 15);
    const double want[3] = {1e-3, 1e-3, 5e-4};
    for (int i = 0; i < lr.size(); ++i)
      QVERIFY2(std::abs(lr[i].second - want[i / 5]) < 1e-15, qPrintable(QString::number(lr[i].second)));
    QCOMPARE(lr.last().first, 3.0);
    QCOMPARE(events["two.lr"], lr);
  }

  void optimizer_params_are_checked_before_the_run() {
    GraphDocument doc;
    doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("data", "Dataset", {{"name", "synthetic"}}));
    doc.addNode(makeNode("net", "Model", {{"arch", "mlp"}}));
    const QList<QPair<QString, QJsonObject>> bad{
        {"nesterov", {{"nesterov", true}}},
        {"beta1", {{"optimizer", "adam"}, {"beta1", 1.0}}},
        {"eps", {{"optimizer", "adamw"}, {"eps", 0.0}}},
        {"onecycle", {{"schedule", "onecycle"}, {"warmup_epochs", 1}}},
        {"min_lr", {{"schedule", "cosine"}, {"lr", 0.01}, {"min_lr", 0.1}}},
        {"beta2", {{"beta2", 1.5}}},
        {"bf16", {{"precision", "bf16"}}},
        {"good", {{"optimizer", "sgd"}, {"momentum", 0.9}, {"nesterov", true}, {"schedule", "step"}}},
        {"scaled", {{"loss_scale", "dynamic"}, {"loss_scale_init", 1024}}}};
    for (const auto& [id, params] : bad) {
      doc.addNode(makeNode(id, "Train", params));
      wire(doc, "net.model", id + ".model");
      wire(doc, "data.data", id + ".data");
      wire(doc, "cpu.device", id + ".devices");
    }
    const ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QCOMPARE(errorsFor(report, "nesterov"), QStringList{"params: nesterov: needs momentum above 0"});
    QCOMPARE(errorsFor(report, "beta1"), QStringList{"params: beta1: must be at least 0 and below 1"});
    QCOMPARE(errorsFor(report, "eps"), QStringList{"params: eps: must be above 0"});
    const QStringList onecycle = errorsFor(report, "onecycle");
    QCOMPARE(onecycle.size(), 1);
    QVERIFY2(onecycle[0].startsWith("params: warmup_epochs: "), qPrintable(onecycle[0]));
    QCOMPARE(errorsFor(report, "min_lr"), QStringList{"params: min_lr: must be below lr"});
    QCOMPARE(errorsFor(report, "beta2"), QStringList{"params.beta2: 1.5 is above the maximum 1"});
    QCOMPARE(errorsFor(report, "good"), QStringList{});
    // bf16 trains on a CPU whose oneDNN ISA has it (tests/runtime/test_cpu_bf16 checks which), and elsewhere
    // is refused, naming that ISA.
    const QStringList bf16Errors = errorsFor(report, "bf16");
    QVERIFY2(bf16Errors.isEmpty() ||
                 (bf16Errors.size() == 1 &&
                  QRegularExpression("^params\\.precision: bf16 needs a CUDA device or a CPU with native bf16 "
                                     "\\(oneDNN's ISA here: [a-z0-9_]+\\), but it trains on cpu \\(use fp32 "
                                     "there\\)$")
                      .match(bf16Errors[0])
                      .hasMatch()),
             qPrintable(bf16Errors.join("; ")));
    QCOMPARE(errorsFor(report, "scaled"), QStringList{});
  }

  void forward_maps_the_batch_element_by_element() {
    GraphDocument doc;
    doc.addNode(makeNode("net", "Model", {{"arch", "linear"}, {"in_channels", 3}, {"classes", 2}}));
    doc.addNode(makeNode("x", "Tensor", {{"shape", QJsonArray{4, 3}}, {"count", 3}, {"init", "normal"}}));
    doc.addNode(makeNode("fwd", "Forward"));
    wire(doc, "net.model", "fwd.model");
    wire(doc, "x.out", "fwd.in");
    addInspect(doc, "show", "fwd.out");
    addInspect(doc, "show_x", "x.out");
    doc.addNode(makeNode("params", "Parameters"));
    wire(doc, "net.model", "params.model");
    addInspect(doc, "show_w", "params.out");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QCOMPARE(r.node("show")["inspect"].toArray().size(), 3);
    QCOMPARE(r.node("params")["names"].toArray(), (QJsonArray{"0.weight", "0.bias"}));
    const std::vector<double> w = r.inspected("show_w", 0), b = r.inspected("show_w", 1);
    for (int i = 0; i < 3; ++i) {
      QCOMPARE(r.node("show")["inspect"].toArray()[i].toObject()["shape"].toArray(), (QJsonArray{4, 2}));
      const std::vector<double> x = r.inspected("show_x", i), y = r.inspected("show", i);
      for (int n = 0; n < 4; ++n)
        for (int o = 0; o < 2; ++o) {
          double want = b[o];
          for (int k = 0; k < 3; ++k) want += x[n * 3 + k] * w[o * 3 + k];
          QVERIFY(std::fabs(y[n * 2 + o] - want) < 1e-5);
        }
    }
  }
};

QTEST_MAIN(TrainingTest)
#include "test_training.moc"
