// Training through the editor's run path, offscreen, with the real GPU node set on the CPU: a shrunk
// mlp-fashion-mnist run streams its loss and accuracy series into the Plots dock's Training tab while it
// runs, each kind of series in its own pane.
#include <qcustomplot.h>

#include <QDockWidget>
#include <QFileInfo>
#include <QJsonObject>

#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "main_window.h"
#include "plots.h"
#include "run_controller.h"

using namespace gn;
using editor::MainWindow;
using editor::RunStatus;

class TestEditorTraining : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;

  // The graph a curve shows, by its series name; null when there is none.
  QCPGraph* curve(const QString& series) const { return w_->plots()->metricGraph(series); }

 private slots:
  void initTestCase() {
    GN_REQUIRE_NODES_PLUGIN(registry_);
  }

  void init() {
    w_ = testing::discardingWindow(&registry_);
  }
  void cleanup() {
    w_.reset();
  }

  void trainingSeriesReachTheTrainingTab() {
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/mlp-fashion-mnist.json"));
    core::GraphDocument* doc = w_->document();
    // One epoch in batches of 64, a loss every 20 batches: a few seconds at most on two cores, and long
    // enough for the samples to reach the UI over several of its ticks.
    doc->setParam("data", "batch_size", 64);
    if (!QFileInfo::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      doc->setParam("data", "name", "synthetic");
    doc->setParam("train", "epochs", 1);
    doc->setParam("train", "log_every", 20);

    // The UI batches that carried metric samples, and whether the training node had finished by then.
    int metricBatches = 0;
    double trainWallMs = -1;
    auto c =
        connect(w_->runner(), &editor::RunController::batch, this, [&](const QList<core::RunEvent>& events) {
          bool metrics = false;
          for (const core::RunEvent& e : events) {
            if (e.kind == core::RunEvent::Kind::Metric && e.node == "train") metrics = true;
            if (e.kind == core::RunEvent::Kind::NodeFinished && e.node == "train") trainWallMs = e.value;
          }
          metricBatches += metrics;
        });
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 300000);
    disconnect(c);
    QCOMPARE(w_->runStateText(), QString("Done"));
    QCOMPARE(w_->scene()->nodeItem("train")->runStatus(), RunStatus::Done);
    // Samples stream while the node trains: a training of many UI ticks (50 ms) hands them over in more than
    // one batch. (A very fast machine may train in fewer ticks; then this says nothing and is not asserted.)
    qInfo("train ran %.0f ms; its samples came in %d UI batches", trainWallMs, metricBatches);
    if (trainWallMs > 300) QVERIFY2(metricBatches >= 2, "metric samples only arrived all at once");

    // The Plots dock has a Training tab, and the training plot is its page.
    QVERIFY(w_->findChild<QDockWidget*>("plotsDock"));
    editor::PlotsPanel* plots = w_->plots();
    int trainingTab = -1;
    for (int i = 0; i < plots->count(); ++i)
      if (plots->tabText(i) == "Training") trainingTab = i;
    QVERIFY(trainingTab >= 0);
    QCOMPARE(plots->widget(trainingTab), static_cast<QWidget*>(plots->metricsPlot()));

    // A loss and a train accuracy every 20 batches inside the epoch and one at its end; test accuracy and
    // seconds once.
    const QJsonObject report = w_->runner()->report();
    const QJsonObject nodes = report["nodes"].toObject();
    const int samples = nodes["data"].toObject()["train_samples"].toInt();
    const int batches = (samples + 63) / 64;
    QVERIFY(batches >= 1);
    for (const QString series : {"train.loss", "train.train_acc"}) {
      QCPGraph* g = curve(series);
      QVERIFY2(g, qPrintable("no curve for " + series));
      QCOMPARE(g->dataCount(), (batches - 1) / 20 + 1);
      QCOMPARE(g->data()->at(g->dataCount() - 1)->key, 1.0);
    }
    for (const QString series : {"train.test_acc", "train.epoch_seconds", "train.images_per_second"}) {
      QCPGraph* g = curve(series);
      QVERIFY2(g, qPrintable("no curve for " + series));
      QCOMPARE(g->dataCount(), series.endsWith("images_per_second") ? (batches - 1) / 20 + 1 : 1);
    }
    QVERIFY(curve("test.accuracy") && curve("untrained.accuracy"));
    // One pane per kind: the loss, the accuracies (train and test on one 0-1 axis) and images/s, each on its
    // own scale, so thousands of images/s leave the loss readable. The rate is constant: no pane.
    QCOMPARE(plots->trainingPanes(), (QStringList{"loss", "accuracy", "images/s"}));
    QCPAxisRect* accuracy = plots->paneRect(editor::MetricPane::Accuracy);
    for (const QString series : {"train.train_acc", "train.test_acc", "test.accuracy", "untrained.accuracy"})
      QCOMPARE(curve(series)->valueAxis(), accuracy->axis(QCPAxis::atLeft));
    QCOMPARE(accuracy->axis(QCPAxis::atLeft)->range(), QCPRange(0, 1));
    QCPAxis* lossAxis = plots->paneRect(editor::MetricPane::Loss)->axis(QCPAxis::atLeft);
    QCOMPARE(curve("train.loss")->valueAxis(), lossAxis);
    bool found = false;
    const QCPRange losses = curve("train.loss")->data()->valueRange(found);
    QVERIFY(lossAxis->range().lower <= losses.lower && lossAxis->range().upper >= losses.upper);
    QVERIFY(lossAxis->range().upper < losses.upper * 1.5 + 1);
    QCOMPARE(curve("train.images_per_second")->valueAxis(),
             plots->paneRect(editor::MetricPane::Throughput)->axis(QCPAxis::atLeft));
    QVERIFY(!curve("train.lr"));
    // The plot holds what the run's report holds.
    const double acc = curve("train.test_acc")->data()->at(0)->value;
    QCOMPARE(nodes["train"].toObject()["test_acc"].toDouble(), acc);
    QCOMPARE(curve("train.loss")->data()->at(0)->value,
             report["metrics"].toObject()["train.loss"].toArray()[0].toArray()[1].toDouble());
  }
};

QTEST_MAIN(TestEditorTraining)
#include "test_editor_training.moc"
