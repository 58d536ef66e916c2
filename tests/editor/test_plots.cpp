// The Plots dock fed with run events directly, offscreen: the Training tab's stacked panes (which series go
// where, their axis ranges, the shared epoch axis and its marks, several Train nodes apart; a language
// model's perplexity pane and a regression's pane only with their series), the overlay of
// an earlier run's series and what it is called, PNG and SVG exports that parse, and the memory plot's
// min/max band per pixel column against a brute-force computation over the samples; and the metrics CSV
// that File ▸ Export writes, byte for byte the one `gpunodes run --metrics` writes.
#include <qcustomplot.h>

#include <QFile>
#include <QMenu>
#include <QRandomGenerator>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QTest>
#include <QToolButton>
#include <QXmlStreamReader>
#include <cmath>

#include "editor_test_util.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/report_format.h"
#include "plots.h"
#include "results_views.h"
#include "run_controller.h"

using namespace gn;
using editor::MetricPane;
using editor::PlotsPanel;

namespace {

// One Train node's series over `epochs` epochs, a point every quarter epoch: what the node set emits.
struct FedSeries {
  QMap<QString, QList<QPointF>> points;
  void add(PlotsPanel& p, const QString& series, double t, double v) {
    p.addMetric(series, t, v);
    points[series] << QPointF(t, v);
  }
};

FedSeries feedTraining(PlotsPanel& p, const QString& node, int epochs, double lossScale, bool varyingLr) {
  FedSeries fed;
  for (int q = 1; q <= epochs * 4; ++q) {
    const double t = q / 4.0;
    fed.add(p, node + ".loss", t, lossScale * (0.4 + 2.0 / (1 + t)));
    fed.add(p, node + ".train_acc", t, 0.9 - 0.5 / (1 + t));
    fed.add(p, node + ".images_per_second", t, 125000 + 1000 * q);
    fed.add(p, node + ".lr", t, varyingLr ? 0.1 / q : 0.1);
    if (q % 4 == 0) {
      fed.add(p, node + ".test_acc", t, 0.85 - 0.4 / (1 + t));
      fed.add(p, node + ".epoch_seconds", t, 2.5 + 0.1 * t);
      fed.add(p, node + ".memory_mb/cpu", t, 40);
      fed.add(p, node + ".share/cpu", t, 1);
    }
  }
  return fed;
}

QList<QPointF> pointsOf(const QCPGraph* g) {
  QList<QPointF> out;
  for (auto it = g->data()->constBegin(); it != g->data()->constEnd(); ++it)
    out << QPointF(it->key, it->value);
  return out;
}

// What the band of one column must be, straight from the definition: the step function's values over
// [lo, hi) (over [lo, hi] for the last column): its value at lo, and every sample inside.
struct Column {
  bool defined = false;
  double min = 0, max = 0, last = 0;
};
Column bruteColumn(const QList<QPointF>& samples, double lo, double hi, bool lastColumn) {
  Column c;
  for (const QPointF& s : samples) {
    const bool atOrBeforeLo = s.x() <= lo;
    const bool inside = s.x() > lo && (s.x() < hi || (lastColumn && s.x() <= hi));
    if (atOrBeforeLo) {  // the latest of these is the value at lo
      c.defined = true;
      c.min = c.max = c.last = s.y();
    }
    if (inside) {
      c.min = c.defined ? std::min(c.min, s.y()) : s.y();
      c.max = c.defined ? std::max(c.max, s.y()) : s.y();
      c.last = s.y();
      c.defined = true;
    }
  }
  return c;
}

// A node that emits fixed metric series, names that need CSV quoting and values that need every digit
// among them; its node set needs no session.
class EmitSeries : public core::NodeType {
 public:
  EmitSeries() { spec_.name = "EmitSeries"; }
  const core::NodeTypeSpec& spec() const override { return spec_; }
  void execute(core::NodeContext& ctx) const override {
    ctx.metric("train.loss", 0.25, 2.1034);
    ctx.metric("train.loss", 0.5, 0.1 + 0.2);
    ctx.metric("a,b", 0, 125000);
    ctx.metric("say \"hi\"", 1, 1.0 / 3);
  }

 private:
  core::NodeTypeSpec spec_;
};

class EmitSeriesSet : public core::NodeSetPlugin {
 public:
  QString setName() const override { return "emit"; }
  QList<core::NodeTypePtr> nodeTypes() const override { return {std::make_shared<EmitSeries>()}; }
  std::unique_ptr<core::RunSession> createSession(const core::RunSettings&) override { return nullptr; }
};

}  // namespace

class TestPlots : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  std::unique_ptr<PlotsPanel> p_;

 private slots:
  void init() {
    p_ = std::make_unique<PlotsPanel>();
    p_->resize(1000, 700);
    p_->show();
    QVERIFY(QTest::qWaitForWindowExposed(p_.get()));
  }
  void cleanup() { p_.reset(); }

  void trainingPanesSplitTheSeries() {
    p_->beginRun("#1 parallel, 1 cpu", {});
    const FedSeries a = feedTraining(*p_, "train", 2, 1.0, false);
    const FedSeries b = feedTraining(*p_, "train2", 2, 1.5, false);
    p_->refresh();

    // A constant rate has no pane; the per-device series are hidden until asked for.
    QCOMPARE(p_->trainingPanes(), (QStringList{"loss", "accuracy", "images/s"}));
    QVERIFY(!p_->learningRateAxis());
    QVERIFY(p_->paneHidden(MetricPane::Devices));

    // Every series holds what was fed, in the pane of its kind.
    for (const FedSeries* fed : {&a, &b})
      for (auto it = fed->points.begin(); it != fed->points.end(); ++it) {
        const MetricPane pane = editor::paneOf(it.key());
        QCPGraph* g = p_->metricGraph(it.key());
        if (pane == MetricPane::LearningRate || pane == MetricPane::Devices) {
          QVERIFY2(!g, qPrintable(it.key()));
          continue;
        }
        QVERIFY2(g, qPrintable("no curve for " + it.key()));
        QCOMPARE(pointsOf(g), it.value());
        QCOMPARE(g->keyAxis()->axisRect(), p_->paneRect(pane));
      }
    QCOMPARE(editor::paneOf("train.test_acc"), MetricPane::Accuracy);
    QCOMPARE(editor::paneOf("test.accuracy"), MetricPane::Accuracy);
    QCOMPARE(editor::paneOf("norm1"), MetricPane::Other);

    // The loss reads on its own scale: not flattened by 125,000 images/s.
    double lossMin = 1e9, lossMax = -1e9;
    for (const QString& s : {QString("train.loss"), QString("train2.loss")})
      for (const QPointF& pt : (s.startsWith("train2") ? b : a).points[s]) {
        lossMin = std::min(lossMin, pt.y());
        lossMax = std::max(lossMax, pt.y());
      }
    const QCPRange loss = p_->paneRect(MetricPane::Loss)->axis(QCPAxis::atLeft)->range();
    QVERIFY2(loss.lower <= lossMin && loss.upper >= lossMax,
             qPrintable(QString("%1..%2").arg(loss.lower).arg(loss.upper)));
    QVERIFY(loss.size() <= 1.3 * (lossMax - lossMin));  // 5% margins, and room for the epoch labels on top
    QVERIFY(loss.upper >= lossMax + 0.1 * (lossMax - lossMin));
    // Accuracies: train and test of both nodes on one fixed 0-1 axis.
    QCPAxisRect* accuracy = p_->paneRect(MetricPane::Accuracy);
    QCOMPARE(accuracy->axis(QCPAxis::atLeft)->range(), QCPRange(0, 1));
    QCOMPARE(accuracy->graphs().size(), 4);
    // images/s from zero; seconds per epoch on the pane's right axis.
    QCPAxisRect* speed = p_->paneRect(MetricPane::Throughput);
    const QCPRange ips = speed->axis(QCPAxis::atLeft)->range();
    QCOMPARE(ips.lower, 0.0);
    QVERIFY(ips.upper >= 133000 && ips.upper <= 133000 * 1.1 + 1);
    QCOMPARE(p_->metricGraph("train.epoch_seconds")->valueAxis(), speed->axis(QCPAxis::atRight));
    QVERIFY(speed->axis(QCPAxis::atRight)->visible());

    // Several Train nodes stay apart: every curve of a pane has its own colour.
    for (MetricPane pane : {MetricPane::Loss, MetricPane::Accuracy, MetricPane::Throughput}) {
      QSet<QRgb> colours;
      for (QCPGraph* g : p_->paneRect(pane)->graphs()) colours.insert(g->pen().color().rgb());
      QCOMPARE(colours.size(), p_->paneRect(pane)->graphs().size());
    }

    // One epoch axis: the same range in every pane, the whole run; numbers under the bottom pane only.
    for (const QString& name : p_->trainingPanes()) {
      QCPAxisRect* r = nullptr;
      for (MetricPane pane : {MetricPane::Loss, MetricPane::Accuracy, MetricPane::Throughput})
        if (editor::paneName(pane) == name) r = p_->paneRect(pane);
      QVERIFY(r);
      QCOMPARE(r->axis(QCPAxis::atBottom)->range(), QCPRange(0.25, 2.0));
      QCOMPARE(r->axis(QCPAxis::atBottom)->tickLabels(), name == "images/s");
    }
    // Dragging one pane moves them all.
    p_->paneRect(MetricPane::Loss)->axis(QCPAxis::atBottom)->setRange(1, 1.5);
    QCOMPARE(p_->paneRect(MetricPane::Throughput)->axis(QCPAxis::atBottom)->range(), QCPRange(1, 1.5));

    // Epoch marks: a line through each pane per epoch and one label per epoch.
    QCOMPARE(p_->epochMarks(), (QList<double>{1.0, 2.0}));
    QCOMPARE(p_->metricsPlot()->itemCount(), 2 * 3 + 2);

    // A rate that starts to vary brings its pane, below images/s, from zero.
    p_->addMetric("train.lr", 2.25, 0.05);
    p_->refresh();
    QCOMPARE(p_->trainingPanes(), (QStringList{"loss", "accuracy", "images/s", "learning rate"}));
    QVERIFY(p_->learningRateAxis());
    QCOMPARE(p_->learningRateAxis()->range().lower, 0.0);
    QVERIFY(p_->learningRateAxis()->range().upper >= 0.1);
    QCOMPARE(p_->metricGraph("train.lr")->valueAxis(), p_->learningRateAxis());

    // The per-device pane on request (and remembered): MiB on the left, the batch share on the right.
    p_->setPaneHidden(MetricPane::Devices, false);
    QVERIFY(p_->trainingPanes().contains("devices"));
    QCPAxisRect* devices = p_->paneRect(MetricPane::Devices);
    QCOMPARE(p_->metricGraph("train.memory_mb/cpu")->valueAxis(), devices->axis(QCPAxis::atLeft));
    QCOMPARE(p_->metricGraph("train.share/cpu")->valueAxis(), devices->axis(QCPAxis::atRight));
    PlotsPanel again;
    QVERIFY(!again.paneHidden(MetricPane::Devices));
    p_->setPaneHidden(MetricPane::Loss, true);
    QVERIFY(!p_->trainingPanes().contains("loss"));
    QVERIFY(!p_->metricGraph("train.loss"));
    p_->setPaneHidden(MetricPane::Loss, false);
    p_->setPaneHidden(MetricPane::Devices, true);
  }

  void aLanguageModelsPerplexityHasAPaneOfItsOwn() {
    // A classifier's run has neither a perplexity nor a regression pane.
    p_->beginRun("#1", {});
    feedTraining(*p_, "train", 2, 1.0, false);
    p_->refresh();
    QVERIFY(!p_->paneRect(MetricPane::Perplexity));
    QVERIFY(!p_->paneRect(MetricPane::Regression));

    // A language model's: its train and test perplexity under the loss, on a log axis; the test loss with
    // the loss.
    p_->beginRun("#2", {});
    FedSeries fed;
    for (int q = 1; q <= 8; ++q) {
      const double t = q / 4.0, loss = 0.5 + 3.0 / (1 + t);
      fed.add(*p_, "lm.loss", t, loss);
      fed.add(*p_, "lm.perplexity", t, std::exp(loss));
      fed.add(*p_, "lm.train_acc", t, 0.6 - 0.3 / (1 + t));
      fed.add(*p_, "lm.images_per_second", t, 9000);
      if (q % 4 == 0) {
        fed.add(*p_, "lm.test_loss", t, loss + 0.2);
        fed.add(*p_, "lm.test_perplexity", t, std::exp(loss + 0.2));
        fed.add(*p_, "lm.epoch_seconds", t, 1.5);
      }
    }
    p_->refresh();
    QCOMPARE(p_->trainingPanes(), (QStringList{"loss", "perplexity", "accuracy", "images/s"}));
    QCPAxisRect* pane = p_->paneRect(MetricPane::Perplexity);
    QVERIFY(pane);
    QCOMPARE(pane->graphs().size(), 2);
    double lowest = 1e9, highest = 0;
    for (const QString& s : {QString("lm.perplexity"), QString("lm.test_perplexity")}) {
      QCPGraph* g = p_->metricGraph(s);
      QVERIFY2(g, qPrintable("no curve for " + s));
      QCOMPARE(g->keyAxis()->axisRect(), pane);
      QCOMPARE(pointsOf(g), fed.points[s]);
      for (const QPointF& pt : fed.points[s]) {
        lowest = std::min(lowest, pt.y());
        highest = std::max(highest, pt.y());
      }
    }
    QCOMPARE(p_->metricGraph("lm.test_loss")->keyAxis()->axisRect(), p_->paneRect(MetricPane::Loss));
    QCPAxis* y = pane->axis(QCPAxis::atLeft);
    QCOMPARE(y->scaleType(), QCPAxis::stLogarithmic);
    QVERIFY2(y->range().lower > 0 && y->range().lower <= lowest && y->range().upper >= highest,
             qPrintable(QString("%1..%2 for %3..%4")
                            .arg(y->range().lower)
                            .arg(y->range().upper)
                            .arg(lowest)
                            .arg(highest)));

    // The epoch marks run through it from top to bottom as through the other panes (a log axis has no 0).
    QCOMPARE(p_->metricsPlot()->itemCount(), 2 * 4 + 2);
    p_->metricsPlot()->replot();
    int linesInPane = 0;
    for (int i = 0; i < p_->metricsPlot()->itemCount(); ++i) {
      auto* line = qobject_cast<QCPItemStraightLine*>(p_->metricsPlot()->item(i));
      if (!line || line->clipAxisRect() != pane) continue;
      ++linesInPane;
      const QPointF top = line->point1->pixelPosition(), bottom = line->point2->pixelPosition();
      QCOMPARE(top.x(), bottom.x());
      QCOMPARE(top.y(), double(pane->top()));
      QCOMPARE(bottom.y(), double(pane->top() + pane->height()));
    }
    QCOMPARE(linesInPane, 2);

    // Hidden like any pane.
    p_->setPaneHidden(MetricPane::Perplexity, true);
    QVERIFY(!p_->trainingPanes().contains("perplexity"));
    QVERIFY(!p_->metricGraph("lm.perplexity"));
    p_->setPaneHidden(MetricPane::Perplexity, false);
  }

  void aRegressionsErrorsAndR2ShareAPane() {
    p_->beginRun("#1", {});
    FedSeries fed;
    const QList<double> r2{-0.4, 0.55, 0.9};
    for (int q = 1; q <= 12; ++q) {
      const double t = q / 4.0;
      fed.add(*p_, "reg.loss", t, 0.05 + 1.0 / (1 + t));
      fed.add(*p_, "reg.train_mse", t, 0.05 + 1.0 / (1 + t));
      fed.add(*p_, "reg.images_per_second", t, 50000);
      if (q % 4 == 0) {
        fed.add(*p_, "reg.test_mse", t, 0.08 + 1.0 / (1 + t));
        fed.add(*p_, "reg.test_mae", t, 0.2 + 0.5 / (1 + t));
        fed.add(*p_, "reg.test_r2", t, r2[q / 4 - 1]);
        fed.add(*p_, "reg.epoch_seconds", t, 0.5);
      }
    }
    p_->refresh();
    // No accuracy without train_acc and test_acc; no perplexity.
    QCOMPARE(p_->trainingPanes(), (QStringList{"loss", "regression", "images/s"}));
    QCPAxisRect* pane = p_->paneRect(MetricPane::Regression);
    QCOMPARE(pane->graphs().size(), 4);
    QCPAxis *left = pane->axis(QCPAxis::atLeft), *right = pane->axis(QCPAxis::atRight);
    for (const QString& s : {QString("reg.train_mse"), QString("reg.test_mse"), QString("reg.test_mae")}) {
      QCPGraph* g = p_->metricGraph(s);
      QVERIFY2(g, qPrintable("no curve for " + s));
      QCOMPARE(g->valueAxis(), left);
      QCOMPARE(pointsOf(g), fed.points[s]);
    }
    // R² on the right, from below its worst (here below zero) to its best, 1.
    QCPGraph* r2Curve = p_->metricGraph("reg.test_r2");
    QVERIFY(r2Curve);
    QCOMPARE(r2Curve->valueAxis(), right);
    QCOMPARE(pointsOf(r2Curve), fed.points["reg.test_r2"]);
    QVERIFY(right->visible());
    QCOMPARE(right->label(), QString("R²"));
    QVERIFY(right->range().lower <= -0.4 && right->range().upper >= 1.0 && right->range().upper < 1.1);
    // The errors from zero, their best.
    QCOMPARE(left->range().lower, 0.0);
    QVERIFY(left->range().upper >= 0.08 + 1.0 / 1.25);

    QCOMPARE(editor::paneOf("reg.test_r2"), MetricPane::Regression);
    QCOMPARE(editor::paneOf("reg.mse"), MetricPane::Regression);
    QCOMPARE(editor::paneOf("lm.test_perplexity"), MetricPane::Perplexity);
    QCOMPARE(editor::paneOf("lm.test_loss"), MetricPane::Loss);
    QCOMPARE(editor::paneOf("net.layer2"), MetricPane::Other);  // no R² for ending in "r2"
  }

  void earlierRunsOverlayTheirSeries() {
    p_->beginRun("#1 parallel, 1 cpu", {}, {{"train.lr", "0.1"}, {"data.batch_size", "256"}});
    const FedSeries first = feedTraining(*p_, "train", 2, 1.0, false);
    p_->refresh();
    QVERIFY(p_->earlierRuns().isEmpty());
    auto* compare = p_->findChild<QToolButton*>("compareRunsButton");
    QVERIFY(compare);
    QVERIFY(!compare->isEnabled());

    p_->beginRun("#2 parallel, 1 cpu", {}, {{"train.lr", "0.3"}, {"data.batch_size", "256"}});
    feedTraining(*p_, "train", 3, 0.7, false);
    p_->refresh();
    const QList<int> earlier = p_->earlierRuns();
    QCOMPARE(earlier.size(), 1);
    const int seq = earlier.first();
    QVERIFY(compare->isEnabled());
    // Named by its label and what it set differently: batch_size was the same.
    QCOMPARE(p_->runDescription(seq), QString("#1 parallel, 1 cpu (train.lr=0.1)"));
    const int graphs = p_->metricsPlot()->graphCount();
    QVERIFY(!p_->metricGraph("train.loss", seq));

    // Overlaid: each of its series shown in a pane comes back, with the earlier values, fainter and dashed,
    // in the colour of the same series now.
    p_->setRunOverlaid(seq, true);
    int overlaid = 0;
    for (auto it = first.points.begin(); it != first.points.end(); ++it) {
      const MetricPane pane = editor::paneOf(it.key());
      QCPGraph* g = p_->metricGraph(it.key(), seq);
      if (pane == MetricPane::LearningRate || pane == MetricPane::Devices) {
        QVERIFY(!g);
        continue;
      }
      QVERIFY2(g, qPrintable("no overlay for " + it.key()));
      ++overlaid;
      QCOMPARE(pointsOf(g), it.value());
      QVERIFY(g->pen().style() != Qt::SolidLine);
      QVERIFY(g->pen().color().alpha() < 255);
      QCOMPARE(g->pen().color().rgb(), p_->metricGraph(it.key())->pen().color().rgb());
      QCOMPARE(g->name(), it.key() + " #1 (train.lr=0.1)");
      QCOMPARE(g->keyAxis()->axisRect(), p_->paneRect(pane));
    }
    // One key in the top pane's legend says which dash is which run.
    QCOMPARE(p_->metricsPlot()->graphCount(), graphs + overlaid + 1);
    QCPLegend* topLegend = nullptr;
    for (int i = 0; i < p_->metricsPlot()->graphCount(); ++i) {
      QCPGraph* g = p_->metricsPlot()->graph(i);
      if (g->name() != "#1 (train.lr=0.1)") continue;
      QCOMPARE(g->dataCount(), 0);
      QVERIFY(g->pen().style() != Qt::SolidLine);
      QCOMPARE(g->keyAxis()->axisRect(), p_->paneRect(MetricPane::Loss));
      for (int l = 0; l < p_->metricsPlot()->plotLayout()->elementCount(); ++l)
        if (auto* box = qobject_cast<QCPLayoutGrid*>(p_->metricsPlot()->plotLayout()->elementAt(l)))
          if (auto* legend = qobject_cast<QCPLegend*>(box->element(0, 0));
              legend && legend->hasItemWithPlottable(g))
            topLegend = legend;
    }
    QVERIFY2(topLegend, "no legend key for the overlaid run");
    // Its x range joins the shared axis: the current run has 3 epochs, the earlier 2.
    QCOMPARE(p_->paneRect(MetricPane::Loss)->axis(QCPAxis::atBottom)->range(), QCPRange(0.25, 3.0));

    p_->setRunOverlaid(seq, false);
    QCOMPARE(p_->metricsPlot()->graphCount(), graphs);
    QVERIFY(!p_->metricGraph("train.loss", seq));

    // The same toggle from the plot's context menu.
    std::unique_ptr<QMenu> menu(p_->contextMenuFor(p_->metricsPlot()));
    QAction* toggle = nullptr;
    for (QAction* a : menu->actions())
      if (a->menu() && a->text() == "Compare with earlier runs")
        for (QAction* r : a->menu()->actions())
          if (r->text() == p_->runDescription(seq)) toggle = r;
    QVERIFY(toggle);
    toggle->trigger();
    QVERIFY(p_->runOverlaid(seq));
    QVERIFY(p_->metricGraph("train.loss", seq));

    // A run that drops out of the history takes its overlay with it.
    for (int i = 3; i <= 8; ++i) p_->beginRun(QString("#%1").arg(i), {});
    p_->refresh();
    QVERIFY(!p_->earlierRuns().contains(seq));
    QVERIFY(!p_->runOverlaid(seq));
    QVERIFY(!p_->metricGraph("train.loss", seq));
  }

  void plotsExportAsPngAndSvg() {
    p_->beginRun("#1 parallel, 1 cpu", {"a"});
    feedTraining(*p_, "train", 2, 1.0, false);
    p_->setNodeTime("a", 12);
    p_->addMemory({{"cpu", 0, 1 << 20, 2 << 20}, {"cpu", 1000, 3 << 20, 4 << 20}});
    p_->refresh();
    QTemporaryDir dir;
    QSignalSpy requested(p_.get(), &PlotsPanel::exportRequested);
    for (QWidget* page : {static_cast<QWidget*>(p_->metricsPlot()), static_cast<QWidget*>(p_->memoryPlot()),
                          static_cast<QWidget*>(p_->timingPlot())}) {
      // The context menu's export shows the page and asks for a file.
      p_->setCurrentIndex(p_->indexOf(page) == 0 ? 1 : 0);
      std::unique_ptr<QMenu> menu(p_->contextMenuFor(page));
      for (QAction* a : menu->actions())
        if (a->text() == "Export as SVG…") a->trigger();
      QCOMPARE(requested.size(), 1);
      QCOMPARE(requested.takeFirst().first().toString(), QString("svg"));
      QCOMPARE(p_->currentWidget(), page);

      auto* plot = static_cast<QCustomPlot*>(page);
      const QString png = dir.filePath(page->objectName() + ".png");
      QString error;
      QVERIFY2(p_->exportVisible(png, &error), qPrintable(error));
      QCOMPARE(QImage(png).size(), QSize(qMax(plot->width(), 800), qMax(plot->height(), 500)));

      const QString svg = dir.filePath(page->objectName() + ".svg");
      QVERIFY2(p_->exportVisible(svg, &error), qPrintable(error));
      QFile f(svg);
      QVERIFY(f.open(QIODevice::ReadOnly));
      QXmlStreamReader xml(&f);
      int paths = 0;
      QString text;
      while (!xml.atEnd()) {
        xml.readNext();
        if (xml.isStartElement() && (xml.name() == u"path" || xml.name() == u"polyline")) ++paths;
        if (xml.isCharacters()) text += xml.text();
      }
      QVERIFY2(!xml.hasError(), qPrintable(xml.errorString()));
      // The curves are paths, the legend is text.
      int curves = 0;
      for (int i = 0; i < plot->plottableCount(); ++i) curves += plot->plottable(i)->visible();
      QVERIFY2(paths >= curves, qPrintable(QString("%1 paths for %2 curves").arg(paths).arg(curves)));
      const QString expected = page == p_->metricsPlot()  ? "train.loss"
                               : page == p_->memoryPlot() ? "cpu allocated"
                                                          : "#1 parallel";
      QVERIFY2(text.contains(expected), qPrintable(text.left(300)));
    }
    // A page that is not a plot (the Confusion tab) exports as a picture of the widget in both formats.
    p_->setCurrentWidget(p_->confusionView());
    QString error;
    QVERIFY(p_->exportVisible(dir.filePath("confusion.svg"), &error));
    QVERIFY(p_->exportVisible(dir.filePath("confusion.png"), &error));
    QVERIFY(!QImage(dir.filePath("confusion.png")).isNull());
    // Somewhere that cannot be written: false, and the message names the file.
    const QString bad = dir.filePath("missing/dir/plot.svg");
    QVERIFY(!p_->exportVisible(bad, &error));
    QVERIFY2(error.contains(bad), qPrintable(error));
  }

  void stepEnvelopeByHand() {
    QCPGraphDataContainer s;
    for (const auto& [k, v] : QList<QPair<double, double>>{{0, 1}, {1, 5}, {2, 3}, {3, 4}})
      s.add(QCPGraphData(k, v));
    editor::ColumnEnvelope e = editor::stepEnvelope(s, 0, 4, 2);
    QCOMPARE(e.keys, (QVector<double>{0, 2}));
    QCOMPARE(e.min, (QVector<double>{1, 3}));
    QCOMPARE(e.max, (QVector<double>{5, 4}));
    QCOMPARE(e.last, (QVector<double>{5, 4}));
    // Before the first sample there is nothing to draw; a column without samples carries the value in.
    e = editor::stepEnvelope(s, -2, 6, 4);
    QCOMPARE(e.keys, (QVector<double>{0, 2, 4}));
    QCOMPARE(e.min, (QVector<double>{1, 3, 4}));
    QCOMPARE(e.max, (QVector<double>{5, 4, 4}));
    QVERIFY(editor::stepEnvelope(s, 1, 1, 4).keys.isEmpty());
    QVERIFY(editor::stepEnvelope(s, 0, 4, 0).keys.isEmpty());
  }

  void memoryPlotDrawsAnEnvelopeWhenDense() {
    p_->beginRun("#1", {});
    p_->setCurrentWidget(p_->memoryPlot());
    // 20,000 allocations over 2 s: noise around 100 MiB, and single-sample spikes to 1 GiB that a curve
    // through one point per pixel would miss.
    QList<core::MemorySampleEvent> events;
    QList<QPointF> samples;  // (ms, MiB) as plotted
    QRandomGenerator rng(7);
    const qint64 mib = 1 << 20;
    for (int i = 0; i < 20000; ++i) {
      const double tUs = i * 100.0 + rng.bounded(50.0);
      const qint64 allocated = (i % 4999 == 17 ? 1024 : 90 + qint64(rng.bounded(20))) * mib;
      events << core::MemorySampleEvent{"cpu", tUs, allocated, 2048 * mib};
      samples << QPointF(tUs / 1000.0, double(allocated) / mib);
    }
    p_->addMemory(events);
    p_->refresh();
    QCustomPlot* plot = p_->memoryPlot();
    plot->replot();
    QCOMPARE(p_->memoryPoints(), 20000);
    QVERIFY(p_->memoryEnvelopeShown());

    const auto checkBand = [&] {
      const QCPRange view = plot->xAxis->range();
      const int columns = plot->axisRect()->width();
      const double width = (view.upper - view.lower) / columns;
      QCPGraph *low = p_->memoryBand("cpu", false), *high = p_->memoryBand("cpu", true);
      QCPGraph* curve = p_->memoryCurve("cpu");
      QVERIFY(low && high && curve);
      int row = 0;
      for (int c = 0; c < columns; ++c) {
        const double lo = view.lower + c * width,
                     hi = c + 1 == columns ? view.upper : view.lower + (c + 1) * width;
        const Column want = bruteColumn(samples, lo, hi, c + 1 == columns);
        if (!want.defined) continue;
        QVERIFY2(row < low->dataCount(), qPrintable(QString("column %1 missing").arg(c)));
        QCOMPARE(low->data()->at(row)->key, lo);
        QCOMPARE(low->data()->at(row)->value, want.min);
        QCOMPARE(high->data()->at(row)->value, want.max);
        QCOMPARE(curve->data()->at(row)->value, want.last);
        ++row;
      }
      QCOMPARE(low->dataCount(), row);
      QCOMPARE(high->dataCount(), row);
    };
    checkBand();
    if (QTest::currentTestFailed()) return;
    // The spikes survive: the band reaches 1 GiB.
    bool found = false;
    QCOMPARE(p_->memoryBand("cpu", true)->data()->valueRange(found).upper, 1024.0);

    // Resized: the columns follow the pixels.
    const int before = p_->memoryBand("cpu", true)->dataCount();
    p_->resize(700, 700);
    QTRY_VERIFY(plot->axisRect()->width() < before);
    plot->replot();
    checkBand();
    if (QTest::currentTestFailed()) return;
    QVERIFY(p_->memoryBand("cpu", true)->dataCount() < before);

    // Zoomed in to fewer samples than pixels: the samples themselves, no band.
    plot->xAxis->setRange(500, 520);
    plot->replot();
    QVERIFY(!p_->memoryEnvelopeShown());
    QCOMPARE(p_->memoryBand("cpu", true)->dataCount(), 0);
    QCOMPARE(p_->memoryCurve("cpu")->dataCount(), 20000);
    // Zoomed out again: the band is back.
    plot->xAxis->setRange(0, 2000);
    plot->replot();
    QVERIFY(p_->memoryEnvelopeShown());
    checkBand();
  }

  void theMetricsCsvExportIsTheCommandLinesFile() {
    EmitSeriesSet set;
    core::NodeTypeRegistry registry;
    registry.addPlugin(&set, "emit");
    auto w = testing::discardingWindow(&registry);
    QTemporaryDir dir;
    QFile graph(dir.filePath("emit.json"));
    QVERIFY(graph.open(QIODevice::WriteOnly));
    graph.write(R"({"format": "gpunodes-graph", "version": 1, "name": "emit",
                    "nodes": [{"id": "e1", "type": "EmitSeries"}], "connections": []})");
    graph.close();
    QVERIFY(w->loadFile(graph.fileName()));
    QVERIFY(w->runGraph());
    QTRY_VERIFY_WITH_TIMEOUT(!w->runner()->isRunning(), 20000);
    QVERIFY(w->exportMetricsCsv(dir.filePath("m.csv")));
    QFile csv(dir.filePath("m.csv"));
    QVERIFY(csv.open(QIODevice::ReadOnly));
    const QByteArray exported = csv.readAll();
    // What the CLI writes for the same report (cli.cpp hands the report's metrics to the same function),
    // and the bytes tests/core/test_report_format.cpp expects for these series.
    QCOMPARE(exported, core::metricsCsv(w->runner()->report().value("metrics").toObject()));
    QCOMPARE(exported, QByteArray("series,t,value\n"
                                  "\"a,b\",0,125000\n"
                                  "\"say \"\"hi\"\"\",1,0.3333333333333333\n"
                                  "train.loss,0.25,2.1034\n"
                                  "train.loss,0.5,0.30000000000000004\n"));
  }
};

QTEST_MAIN(TestPlots)
#include "test_plots.moc"
