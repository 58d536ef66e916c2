// The real `gpunodes` binary trains LeNet on real Fashion-MNIST with checkpoints, is killed with SIGKILL in
// the middle of epoch 3, and `gpunodes run --resume` then ends with exactly the parameter file of the same
// run never interrupted (bit for bit: same machine, same thread count).
#include <signal.h>

#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QThread>
#include <QtTest>

#include "robustness_util.h"

using namespace gn::robustness;

namespace {

// Device, Dataset (6,000 training images), LeNet, Train with checkpoints, SaveParams.
QByteArray graph(const QString& checkpointDir, const QString& paramsPath) {
  const QJsonObject doc{
      {"format", "gpunodes-graph"},
      {"version", 1},
      {"name", "resume after kill"},
      {"nodes",
       QJsonArray{
           QJsonObject{{"id", "dev"}, {"type", "Device"}, {"params", QJsonObject{{"kind", "cpu"}}}},
           QJsonObject{
               {"id", "data"},
               {"type", "Dataset"},
               {"params", QJsonObject{{"name", "fashion-mnist"}, {"limit", 6000}, {"batch_size", 128}}}},
           QJsonObject{{"id", "net"},
                       {"type", "Model"},
                       {"params", QJsonObject{{"arch", "lenet"}, {"init", "xavier"}}}},
           QJsonObject{{"id", "train"},
                       {"type", "Train"},
                       {"params", QJsonObject{{"epochs", 4},
                                              {"lr", 0.9},
                                              {"log_every", 20},
                                              {"checkpoint_dir", checkpointDir},
                                              {"keep_checkpoints", 10}}}},
           QJsonObject{{"id", "save"}, {"type", "SaveParams"}, {"params", QJsonObject{{"path", paramsPath}}}},
       }},
      {"connections", QJsonArray{
                          QJsonObject{{"from", "dev.device"}, {"to", "net.device"}},
                          QJsonObject{{"from", "net.model"}, {"to", "train.model"}},
                          QJsonObject{{"from", "data.data"}, {"to", "train.data"}},
                          QJsonObject{{"from", "dev.device"}, {"to", "train.devices"}},
                          QJsonObject{{"from", "train.model"}, {"to", "save.model"}},
                      }}};
  return QJsonDocument(doc).toJson();
}

QProcessEnvironment environment() {
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert("QT_QPA_PLATFORM", "offscreen");
  return env;
}

QByteArray readFile(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

QJsonObject trainReport(const QString& reportPath) {
  return QJsonDocument::fromJson(readFile(reportPath))["nodes"].toObject()["train"].toObject();
}

}  // namespace

class ResumeCliTest : public QObject {
  Q_OBJECT

 private slots:
  void killedMidEpochThreeAndResumedEndsBitExact() {
    QTemporaryDir tmp;
    QVERIFY(tmp.isValid());
    const QString file = tmp.filePath("train.json");
    {
      QFile f(file);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(graph(tmp.filePath("whole"), tmp.filePath("whole.params")));
    }

    // The uninterrupted run, which also says how long an epoch takes here.
    const Run whole = runProcess(
        GN_GPUNODES, {"run", file, "--quiet", "--report", tmp.filePath("whole.json")}, environment(), 600000);
    QVERIFY2(!whole.crashed && !whole.timedOut && whole.exitCode == 0, qPrintable(whole.describe()));
    const QByteArray reference = readFile(tmp.filePath("whole.params"));
    QVERIFY(reference.size() > 200000);  // LeNet's 61,706 floats
    const double epochSeconds = trainReport(tmp.filePath("whole.json"))["seconds_per_epoch"].toDouble();
    QVERIFY(epochSeconds > 0);
    qInfo("an epoch takes %.2f s here", epochSeconds);

    // Killed halfway through epoch 3: after the checkpoint of epoch 2, before the one of epoch 3. The kill
    // is timed from the epoch's length, which a shared machine changes from run to run: a run that ended
    // before the kill, or passed epoch 3, is tried again with an earlier kill.
    QString dir;
    bool killedInEpoch3 = false;
    double fraction = 0.5;
    for (int attempt = 0; attempt < 4 && !killedInEpoch3; ++attempt) {
      dir = tmp.filePath(QString("killed%1").arg(attempt));
      QProcess p;
      p.setProcessEnvironment(environment());
      p.start(GN_GPUNODES, {"run", file, "--quiet", "--set", "train.checkpoint_dir=" + dir, "--set",
                            "save.path=" + tmp.filePath("resumed.params")});
      QVERIFY(p.waitForStarted());
      QElapsedTimer waited;
      waited.start();
      while (!QFile::exists(dir + "/checkpoint-e0002.safetensors") && p.state() == QProcess::Running &&
             waited.elapsed() < 300000)
        QThread::msleep(5);
      QThread::msleep(static_cast<unsigned long>(fraction * 1000 * epochSeconds));
      ::kill(static_cast<pid_t>(p.processId()), SIGKILL);
      p.waitForFinished(30000);
      if (p.exitStatus() == QProcess::NormalExit) {
        qInfo("attempt %d: the run ended before the kill; trying an earlier one", attempt + 1);
        QVERIFY(QFile::remove(tmp.filePath("resumed.params")));
        fraction /= 2;
        continue;
      }
      killedInEpoch3 = QFile::exists(dir + "/checkpoint-e0002.safetensors") &&
                       !QFile::exists(dir + "/checkpoint-e0003.safetensors");
      if (QFile::exists(dir + "/checkpoint-e0003.safetensors")) fraction /= 2;
    }
    QVERIFY2(killedInEpoch3, "no kill landed inside epoch 3");
    QVERIFY(!QFile::exists(tmp.filePath("resumed.params")));

    const Run resumed =
        runProcess(GN_GPUNODES,
                   {"run", file, "--quiet", "--resume", "--set", "train.checkpoint_dir=" + dir, "--set",
                    "save.path=" + tmp.filePath("resumed.params"), "--report", tmp.filePath("resumed.json")},
                   environment(), 600000);
    QVERIFY2(!resumed.crashed && !resumed.timedOut && resumed.exitCode == 0, qPrintable(resumed.describe()));
    const QJsonObject train = trainReport(tmp.filePath("resumed.json"));
    QVERIFY2(train["resumed_from"].toString().endsWith("checkpoint-e0002.safetensors"),
             qPrintable(train["resumed_from"].toString()));
    QCOMPARE(train["epochs"].toArray().size(), 4);
    QVERIFY2(readFile(tmp.filePath("resumed.params")) == reference,
             "the resumed run's parameters differ from the uninterrupted run's");
  }

  void resumeNeedsACheckpointDir() {
    QTemporaryDir tmp;
    const QString file = tmp.filePath("train.json");
    {
      QFile f(file);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(graph(QString(), tmp.filePath("x.params")));
    }
    const Run r = runProcess(GN_GPUNODES, {"run", file, "--resume"}, environment());
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(r.err.contains("train") && r.err.contains("resume") && r.err.contains("checkpoint_dir"),
             qPrintable(r.describe()));
  }

  void resumeReachesTrainNodesInsideSubgraphs() {
    // The Train node sits two subgraphs deep, and the outer one promotes its resume param with "off" set:
    // --resume still turns it on, so the run is refused for the missing checkpoint_dir, on the inner path.
    QTemporaryDir tmp;
    QJsonObject doc = QJsonDocument::fromJson(graph(QString(), tmp.filePath("x.params"))).object();
    QJsonArray top, innerNodes;
    for (const QJsonValue& n : doc["nodes"].toArray()) (n["id"] == "train" ? innerNodes : top).append(n);
    const QJsonObject inner{
        {"id", "inner"},
        {"type", "Subgraph"},
        {"subgraph",
         QJsonObject{
             {"nodes", innerNodes},
             {"inputs", QJsonArray{QJsonObject{{"name", "model"}, {"to", QJsonArray{"train.model"}}},
                                   QJsonObject{{"name", "data"}, {"to", QJsonArray{"train.data"}}},
                                   QJsonObject{{"name", "devices"}, {"to", QJsonArray{"train.devices"}}}}},
             {"outputs", QJsonArray{QJsonObject{{"name", "model"}, {"from", "train.model"}}}},
             {"promoted", QJsonArray{QJsonObject{{"name", "resume"}, {"param", "train.resume"}}}}}}};
    top.append(QJsonObject{
        {"id", "block1"},
        {"type", "Subgraph"},
        {"params", QJsonObject{{"resume", "off"}}},
        {"subgraph",
         QJsonObject{
             {"nodes", QJsonArray{inner}},
             {"inputs", QJsonArray{QJsonObject{{"name", "model"}, {"to", QJsonArray{"inner.model"}}},
                                   QJsonObject{{"name", "data"}, {"to", QJsonArray{"inner.data"}}},
                                   QJsonObject{{"name", "devices"}, {"to", QJsonArray{"inner.devices"}}}}},
             {"outputs", QJsonArray{QJsonObject{{"name", "model"}, {"from", "inner.model"}}}},
             {"promoted", QJsonArray{QJsonObject{{"name", "resume"}, {"param", "inner.resume"}}}}}}});
    doc["nodes"] = top;
    doc["version"] = 2;
    doc["connections"] = QJsonArray{QJsonObject{{"from", "dev.device"}, {"to", "net.device"}},
                                    QJsonObject{{"from", "net.model"}, {"to", "block1.model"}},
                                    QJsonObject{{"from", "data.data"}, {"to", "block1.data"}},
                                    QJsonObject{{"from", "dev.device"}, {"to", "block1.devices"}},
                                    QJsonObject{{"from", "block1.model"}, {"to", "save.model"}}};
    const QString file = tmp.filePath("nested.json");
    {
      QFile f(file);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(QJsonDocument(doc).toJson());
    }
    // Without --resume the graph is valid (checked, not run: that would train).
    const Run valid = runProcess(GN_GPUNODES, {"validate", file}, environment());
    QVERIFY2(valid.exitCode == 0, qPrintable(valid.describe()));
    const Run r = runProcess(GN_GPUNODES, {"run", file, "--resume"}, environment());
    QCOMPARE(r.exitCode, 1);
    QVERIFY2(
        r.err.contains("block1/inner/train") && r.err.contains("resume") && r.err.contains("checkpoint_dir"),
        qPrintable(r.describe()));
    QVERIFY2(!r.err.contains("no Train node"), qPrintable(r.describe()));
  }
};

QTEST_GUILESS_MAIN(ResumeCliTest)
#include "test_resume_cli.moc"
