// The Confusion and Mistakes tabs after a run of a shrunk mlp-fashion-mnist (two Evaluate nodes: the trained
// model and the untrained one), offscreen, with the real GPU node set on the CPU: the heatmap's cells, counts
// and axis names against the report, which evaluation shows (the last to finish, or the selected one), the
// grid of mistakes in the report's order, a click that shows the top 5; and the Training panes' epoch marks
// and learning-rate pane (a cosine schedule).
#include <qcustomplot.h>

#include <QDockWidget>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonObject>
#include <QListWidget>
#include <QTableWidget>
#include <cmath>

#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "main_window.h"
#include "plots.h"
#include "results_views.h"
#include "run_controller.h"

using namespace gn;
using editor::MainWindow;

namespace {

QStringList tickLabels(QCPAxis* axis) {
  auto ticker = axis->ticker().dynamicCast<QCPAxisTickerText>();
  return ticker ? QStringList(ticker->ticks().values()) : QStringList();
}

// A caption's probability: two decimals, more where two would round a probability below 1 up to 1.00.
QString captionProbability(double p) {
  QString s = QString::number(p, 'f', 2);
  for (int d = 3; p < 1 && s.startsWith("1.") && d <= 6; ++d) s = QString::number(p, 'f', d);
  return s;
}

int tabOf(QTabWidget* tabs, const QString& name) {
  for (int i = 0; i < tabs->count(); ++i)
    if (tabs->tabText(i) == name) return i;
  return -1;
}

}  // namespace

class TestResultsViews : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;
  QJsonObject report_;
  QStringList finished_;  // nodes in the order the UI saw them finish

  QJsonObject node(const QString& id) const { return report_["nodes"].toObject()[id].toObject(); }

 private slots:
  void initTestCase() {
    GN_REQUIRE_NODES_PLUGIN(registry_);
    w_ = std::make_unique<MainWindow>(&registry_);
    w_->setPromptHandler([](auto...) { return QMessageBox::Discard; });
    w_->resize(1400, 900);
    w_->show();
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/mlp-fashion-mnist.json"));
    core::GraphDocument* doc = w_->document();
    // Two short epochs on 1,500 images: seconds on two cores; the trained model still makes mistakes.
    doc->setParam("data", "limit", 1500);
    doc->setParam("data", "batch_size", 100);
    if (!QFileInfo::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      doc->setParam("data", "name", "synthetic");
    doc->setParam("train", "epochs", 2);
    doc->setParam("train", "log_every", 5);
    doc->setParam("train", "schedule", "cosine");
    doc->setParam("untrained", "mistakes_shown", 20);
    auto c =
        connect(w_->runner(), &editor::RunController::batch, this, [this](const QList<core::RunEvent>& ev) {
          for (const core::RunEvent& e : ev)
            if (e.kind == core::RunEvent::Kind::NodeFinished) finished_ << e.node;
        });
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 300000);
    disconnect(c);
    QCOMPARE(w_->runStateText(), QString("Done"));
    report_ = w_->runner()->report();
  }

  void cleanupTestCase() {
    w_.reset();
  }

  void the_last_evaluation_to_finish_shows() {
    editor::PlotsPanel* plots = w_->plots();
    QVERIFY(tabOf(plots, "Confusion") >= 0 && tabOf(plots, "Mistakes") >= 0);
    QCOMPARE(plots->widget(tabOf(plots, "Confusion")), static_cast<QWidget*>(plots->confusionView()));
    QCOMPARE(plots->widget(tabOf(plots, "Mistakes")), static_cast<QWidget*>(plots->mistakesView()));
    QStringList evals;
    for (const QString& n : finished_)
      if (n == "test" || n == "untrained") evals << n;
    QCOMPARE(evals.size(), 2);
    QCOMPARE(plots->evaluations(), evals);
    QCOMPARE(plots->shownEvaluation(), evals.last());
    QVERIFY(plots->confusionView()->headerText().contains("Evaluate node " + evals.last()));
    QVERIFY(plots->mistakesView()->headerText().contains("Evaluate node " + evals.last()));
  }

  void the_heatmap_holds_the_confusion_matrix() {
    editor::PlotsPanel* plots = w_->plots();
    w_->scene()->selectNodes({"test"});
    QCOMPARE(plots->shownEvaluation(), QString("test"));
    editor::ConfusionView* view = plots->confusionView();
    QVERIFY(view->headerText().contains("Evaluate node test (test split)"));
    QVERIFY(view->headerText().contains(QString("%L1 samples").arg(1500)));
    const QJsonObject n = node("test");
    const QJsonArray confusion = n["confusion"].toArray(), perClass = n["per_class"].toArray();
    QCOMPARE(confusion.size(), 10);
    QCPColorMapData* data = view->colorMap()->data();
    QCOMPARE(data->keySize(), 10);
    QCOMPARE(data->valueSize(), 10);
    for (int t = 0; t < 10; ++t) {
      const QJsonArray row = confusion[t].toArray();
      double rowSum = 0;
      for (const QJsonValue& c : row) rowSum += c.toDouble();
      for (int p = 0; p < 10; ++p) {
        QCOMPARE(view->cellText(t, p), QString::number(row[p].toInteger()));
        // Colour by the share of the true class: the row sums to 1.
        QCOMPARE(data->cell(p, t), rowSum > 0 ? row[p].toDouble() / rowSum : 0.0);
      }
    }
    QStringList names;
    for (const QJsonValue& v : n["class_names"].toArray()) names << v.toString();
    QCOMPARE(tickLabels(view->plot()->xAxis), names);
    QCOMPARE(tickLabels(view->plot()->yAxis), names);
    if (n["class_names"].toArray()[9].toString() != "class 9") QCOMPARE(names[9], QString("ankle boot"));
    const QStringList acc = tickLabels(view->plot()->yAxis2);
    QCOMPARE(acc.size(), 10);
    for (int t = 0; t < 10; ++t)
      QCOMPARE(acc[t], perClass[t].isNull() ? QString("–")
                                            : QString::number(100 * perClass[t].toDouble(), 'f', 1) + "%");
    // True class 0 is at the top, as a matrix is read.
    QVERIFY(view->plot()->yAxis->rangeReversed());

    // Another Evaluate selected: its matrix; a node that is no Evaluate changes nothing.
    w_->scene()->selectNodes({"untrained"});
    QCOMPARE(plots->shownEvaluation(), QString("untrained"));
    QVERIFY(view->headerText().contains("Evaluate node untrained"));
    const QJsonArray other = node("untrained")["confusion"].toArray();
    QCOMPARE(view->cellText(3, 4), QString::number(other[3].toArray()[4].toInteger()));
    w_->scene()->selectNodes({"data"});
    QCOMPARE(plots->shownEvaluation(), QString("untrained"));
    w_->scene()->selectNodes({"test"});
  }

  void the_mistakes_grid_and_a_click_on_one() {
    editor::PlotsPanel* plots = w_->plots();
    QCOMPARE(plots->shownEvaluation(), QString("test"));
    editor::MistakesView* view = plots->mistakesView();
    w_->findChild<QDockWidget*>("plotsDock")->raise();
    plots->setCurrentWidget(view);
    QTest::qWait(50);
    const QJsonObject n = node("test");
    const QJsonArray mistakes = n["mistakes"].toArray();
    const QJsonArray names = n["class_names"].toArray();
    QCOMPARE(qint64(mistakes.size()), std::min<qint64>(48, n["mistakes_total"].toInteger()));
    QVERIFY2(mistakes.size() >= 3, "the trained model should still make a few mistakes on 1,500 images");
    QListWidget* grid = view->grid();
    QCOMPARE(grid->count(), mistakes.size());
    for (int i = 0; i < grid->count(); ++i) {
      const QJsonObject m = mistakes[i].toObject();
      const QString want =
          QString("%1 → %2  p=%3")
              .arg(names[m["true"].toInt()].toString(), names[m["predicted"].toInt()].toString())
              .arg(captionProbability(m["confidence"].toDouble()));
      QCOMPARE(grid->item(i)->text(), want);
      // 28x28 scaled by a whole factor (3) to stay crisp.
      QCOMPARE(grid->item(i)->icon().availableSizes().value(0), QSize(84, 84));
    }
    QVERIFY(view->headerText().contains(QString("of %L1 mistakes").arg(n["mistakes_total"].toInteger())));
    QCOMPARE(view->top5Table()->rowCount(), 0);
    QVERIFY(view->detailText().startsWith("Click an image"));

    // A click on the third image shows its top 5 beside the grid.
    const int row = 2;
    grid->scrollToItem(grid->item(row));
    const QRect r = grid->visualItemRect(grid->item(row));
    QVERIFY(grid->viewport()->rect().contains(r.center()));
    QTest::mouseClick(grid->viewport(), Qt::LeftButton, {}, r.center());
    const QJsonObject m = mistakes[row].toObject();
    const QJsonArray top5 = m["top5"].toArray();
    QTableWidget* table = view->top5Table();
    QTRY_COMPARE(table->rowCount(), top5.size());
    QCOMPARE(top5.size(), 5);
    for (int i = 0; i < top5.size(); ++i) {
      const int cls = top5[i].toArray()[0].toInt();
      QVERIFY2(table->item(i, 0)->text().startsWith(names[cls].toString()),
               qPrintable(table->item(i, 0)->text()));
      QCOMPARE(table->item(i, 1)->text(), QString::number(top5[i].toArray()[1].toDouble(), 'f', 3));
    }
    QVERIFY(table->item(0, 0)->text().endsWith("(predicted)"));
    QVERIFY(view->detailText().contains("true: " + names[m["true"].toInt()].toString()));
    QVERIFY(view->detailText().contains("predicted: " + names[m["predicted"].toInt()].toString()));
    QVERIFY(view->detailText().contains(QString("Sample %1").arg(m["index"].toInteger())));

    // Exporting the visible tab writes the view as a picture.
    QTemporaryDir dir;
    const QString png = dir.filePath("mistakes.png");
    QVERIFY(w_->exportPlot(png));
    QCOMPARE(QImage(png).size(), view->size());
  }

  void the_training_plot_marks_epochs_and_the_learning_rate() {
    editor::PlotsPanel* plots = w_->plots();
    QCOMPARE(plots->epochMarks(), (QList<double>{1.0, 2.0}));
    QCustomPlot* p = plots->metricsPlot();
    // The cosine schedule varies the rate: it gets a pane of its own, from zero to above its start (0.1).
    QCOMPARE(plots->trainingPanes(), (QStringList{"loss", "accuracy", "images/s", "learning rate"}));
    QCPGraph* lr = plots->metricGraph("train.lr");
    QVERIFY2(lr, "no curve for train.lr");
    QCOMPARE(lr->valueAxis(), plots->learningRateAxis());
    QCOMPARE(plots->learningRateAxis()->axisRect(), plots->paneRect(editor::MetricPane::LearningRate));
    QVERIFY(plots->learningRateAxis()->visible());
    QCOMPARE(plots->learningRateAxis()->range().lower, 0.0);
    QVERIFY(plots->learningRateAxis()->range().upper >= 0.1);
    bool found = false;
    QVERIFY(lr->data()->valueRange(found).lower < 0.1);  // it did fall
    // One faint line per epoch in each of the four panes, and one label per epoch.
    QCOMPARE(p->itemCount(), 2 * 4 + 2);
  }
};

QTEST_MAIN(TestResultsViews)
#include "test_results_views.moc"
