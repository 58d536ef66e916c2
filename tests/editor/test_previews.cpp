// Previews on nodes. First from fabricated report entries, without the node set: a generated text wrapped
// over a few lines (each within the width, broken at its line breaks, the last elided), a regression's
// evaluation as "R² · MSE" and a language model's as "perplexity · accuracy", a classifier's still as an
// accuracy, and an entry that only names a task none. Then after a run, with the real GPU node set on the
// CPU: an Inspect of a 2-d tensor shows a heatmap of its sampled grid, an Inspect of a 1-d tensor its first
// values, Evaluate its accuracy and Train a sparkline of its loss. Values are checked against what the
// tensors hold (arange, so known in closed form) and against the run's own events.
#include <QFileInfo>
#include <QFontMetricsF>
#include <QImage>
#include <QJsonArray>
#include <QJsonObject>
#include <QPainter>
#include <cmath>

#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "main_window.h"
#include "node_preview.h"
#include "run_controller.h"

using namespace gn;
using editor::MainWindow;
using editor::NodePreview;

class TestPreviewFields : public QObject {
  Q_OBJECT

 private slots:
  void aGeneratedTextWrapsOverAFewLines() {
    const QString prefix = "the time traveller";
    QString generated = prefix;
    for (int i = 0; i < 30; ++i) generated += " for so it will be convenient to speak of him";
    const NodePreview p = NodePreview::fromReport(
        "gen", QJsonObject{{"prefix", prefix}, {"generated_text", generated}, {"tokens", 1350}}, {});
    QCOMPARE(p.kind, NodePreview::Kind::Text);
    QCOMPARE(p.caption, QString("1350 tokens generated"));
    QCOMPARE(p.prefixLength, int(prefix.size()));
    const qreal width = 160;
    const QStringList lines = p.textLines(width);
    QCOMPARE(lines.size(), NodePreview::kTextLines);
    const QFontMetricsF fm(NodePreview::font());
    for (const QString& line : lines) {
      QVERIFY(!line.isEmpty());
      QVERIFY2(fm.horizontalAdvance(line) <= width, qPrintable(line));
    }
    // The text read in order, broken at word boundaries; the last line says there is more.
    QVERIFY(lines.first().startsWith(prefix));
    QVERIFY(generated.startsWith(QStringList(lines.mid(0, lines.size() - 1)).join(' ')));
    QVERIFY2(lines.last().endsWith(QChar(0x2026)), qPrintable(lines.last()));
    QVERIFY(p.height() >= (1 + NodePreview::kTextLines) * fm.height());
    // Wider: fewer characters cut off, as many lines.
    QVERIFY(p.textLines(400).join("").size() > lines.join("").size());

    // A short text is one line, whole; line breaks in the text break lines.
    const NodePreview shortText = NodePreview::fromReport(
        "gen", QJsonObject{{"prefix", "ab"}, {"generated_text", "abc d"}, {"tokens", 3}}, {});
    QCOMPARE(shortText.textLines(width), QStringList{"abc d"});
    QCOMPARE(shortText.caption, QString("3 tokens generated"));
    const NodePreview broken = NodePreview::fromReport(
        "gen", QJsonObject{{"generated_text", "one\ntwo\r\nthree"}, {"tokens", 1}}, {});
    QCOMPARE(broken.textLines(width), (QStringList{"one", "two", "three"}));
    QCOMPARE(broken.caption, QString("1 token generated"));

    // Painted: the prefix dimmer than the continuation, both on the picture.
    QImage image(200, int(p.height()), QImage::Format_ARGB32);
    image.fill(Qt::black);
    QPainter painter(&image);
    p.paint(&painter, QRectF(0, 0, 200, p.height()));
    painter.end();
    int lit = 0;
    for (int y = int(fm.height()) + 2; y < image.height(); ++y)
      for (int x = 0; x < image.width(); ++x) lit += qGray(image.pixel(x, y)) > 60;
    QVERIFY2(lit > 200, qPrintable(QString("%1 lit pixels under the caption").arg(lit)));
  }

  void evaluationsOfARegressionAndALanguageModel() {
    const NodePreview regression = NodePreview::fromReport("eval",
                                                           QJsonObject{{"task", "regression"},
                                                                       {"split", "test"},
                                                                       {"samples", 1000},
                                                                       {"mse", 0.041},
                                                                       {"mae", 0.15},
                                                                       {"r2", 0.9312},
                                                                       {"loss", 0.041}},
                                                           {});
    QCOMPARE(regression.kind, NodePreview::Kind::Scores);
    QCOMPARE(regression.scores, QString("R² 0.93 · MSE 0.041"));
    QCOMPARE(regression.caption, QString("1000 test samples"));
    const NodePreview lm = NodePreview::fromReport("eval",
                                                   QJsonObject{{"task", "language_model"},
                                                               {"split", "test"},
                                                               {"samples", 5000},
                                                               {"accuracy", 0.4812},
                                                               {"loss", 1.166},
                                                               {"perplexity", 3.2088}},
                                                   {});
    QCOMPARE(lm.kind, NodePreview::Kind::Scores);
    QCOMPARE(lm.scores, QString("perplexity 3.21 · accuracy 0.48"));
    // A score that is not a number (null in the report) reads as a dash.
    const NodePreview diverged = NodePreview::fromReport(
        "eval",
        QJsonObject{{"task", "regression"}, {"samples", 10}, {"mse", QJsonValue()}, {"r2", QJsonValue()}},
        {});
    QCOMPARE(diverged.scores, QString("R² – · MSE –"));
    // A classifier's is its accuracy still; an entry that names a task without samples (a dataset's) none.
    const NodePreview classifier =
        NodePreview::fromReport("eval", QJsonObject{{"accuracy", 0.84}, {"samples", 100}}, {});
    QCOMPARE(classifier.kind, NodePreview::Kind::Accuracy);
    QVERIFY(NodePreview::fromReport("data", QJsonObject{{"task", "regression"}, {"train_samples", 600}}, {})
                .empty());
  }
};

class TestPreviews : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;

  const NodePreview& preview(const QString& id) { return w_->scene()->nodeItem(id)->preview(); }

 private slots:
  void initTestCase() { GN_REQUIRE_NODES_PLUGIN(registry_); }

  void init() { w_ = testing::discardingWindow(&registry_); }
  void cleanup() { w_.reset(); }

  void previewsAfterARun() {
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/mlp-fashion-mnist.json"));
    core::GraphDocument* doc = w_->document();
    editor::GraphEditor* ed = w_->editor();
    // Two epochs of the synthetic set, a loss every 4 batches: a curve of a few dozen points in seconds.
    if (!QFileInfo::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz"))
      doc->setParam("data", "name", "synthetic");
    doc->setParam("data", "limit", 1024);
    doc->setParam("data", "batch_size", 64);
    doc->setParam("train", "epochs", 2);
    doc->setParam("train", "log_every", 4);
    // A 40 x 24 matrix holding 0, 1, 2, ... row-major, and a 1-d tensor 1, 1.5, 2, ... of which 4 are read.
    const QString grid = ed->addNode("Tensor", {0, 600}), line = ed->addNode("Tensor", {0, 800});
    const QString showGrid = ed->addNode("Inspect", {300, 600}),
                  showLine = ed->addNode("Inspect", {300, 800});
    doc->setParams(grid, QJsonObject{{"shape", QJsonArray{40, 24}}, {"init", "arange"}});
    doc->setParams(line,
                   QJsonObject{{"shape", QJsonArray{9}}, {"init", "arange"}, {"start", 1}, {"step", 0.5}});
    doc->setParam(showLine, "max_values", 4);
    QVERIFY(ed->connect({grid, "out"}, {showGrid, "in"}));
    QVERIFY(ed->connect({line, "out"}, {showLine, "in"}));
    for (const QString& id : {QString("train"), QString("test"), showGrid, showLine})
      QVERIFY(preview(id).empty());

    // The loss as the run's events carried it, to compare the sparkline with.
    QList<double> losses;
    auto c =
        connect(w_->runner(), &editor::RunController::batch, this, [&](const QList<core::RunEvent>& events) {
          for (const core::RunEvent& e : events)
            if (e.kind == core::RunEvent::Kind::Metric && e.series == "train.loss") losses << e.value;
        });
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 300000);
    disconnect(c);
    QCOMPARE(w_->runStateText(), QString("Done"));

    // The heatmap: a 16 x 16 grid at rows floor(i * 40 / 16) and columns floor(j * 24 / 16), each cell
    // row * 24 + column.
    const NodePreview& heat = preview(showGrid);
    QCOMPARE(heat.kind, NodePreview::Kind::Heatmap);
    QCOMPARE(heat.rows, 16);
    QCOMPARE(heat.cols, 16);
    QCOMPARE(heat.values.size(), 256);
    for (int i = 0; i < 16; ++i)
      for (int j = 0; j < 16; ++j)
        QCOMPARE(heat.values[i * 16 + j], double((i * 40 / 16) * 24 + j * 24 / 16));
    QCOMPARE(heat.range(), std::make_pair(0.0, double((15 * 40 / 16) * 24 + 15 * 24 / 16)));
    QCOMPARE(heat.caption, QString("40×24, 16×16 sampled"));
    // The first values of the 1-d tensor, as many as max_values.
    const NodePreview& values = preview(showLine);
    QCOMPARE(values.kind, NodePreview::Kind::Values);
    QCOMPARE(values.values, (QList<double>{1, 1.5, 2, 2.5}));
    QVERIFY(values.caption.startsWith("9 cpu"));

    // Evaluate: the accuracy the report gives, between chance and 1 after training; its share of correct
    // answers is the confusion matrix's diagonal over its total, an independent reading of the same pass.
    const QJsonObject test = w_->runner()->report().value("nodes").toObject().value("test").toObject();
    const NodePreview& acc = preview("test");
    QCOMPARE(acc.kind, NodePreview::Kind::Accuracy);
    double diagonal = 0, total = 0;
    const QJsonArray confusion = test.value("confusion").toArray();
    for (int t = 0; t < confusion.size(); ++t)
      for (int p = 0; p < confusion[t].toArray().size(); ++p) {
        total += confusion[t].toArray()[p].toDouble();
        if (p == t) diagonal += confusion[t].toArray()[p].toDouble();
      }
    QVERIFY(total > 0);
    QVERIFY(std::abs(acc.accuracy - diagonal / total) < 1e-9);
    QVERIFY(acc.accuracy > 0.1);  // better than chance among 10 classes
    QVERIFY(acc.caption.contains(QString::number(qint64(total))));
    // Train: the loss series, point for point as the events brought it, falling.
    const NodePreview& spark = preview("train");
    QCOMPARE(spark.kind, NodePreview::Kind::Sparkline);
    QVERIFY(losses.size() >= 8);
    QCOMPARE(spark.values.size(), losses.size());
    for (int i = 0; i < losses.size(); ++i)
      QVERIFY(std::abs(spark.values[i] - losses[i]) < 1e-6 * (1 + losses[i]));
    QVERIFY(spark.values.last() < spark.values.first());
    // Drawn in the node body, which grows to hold it.
    editor::NodeItem* item = w_->scene()->nodeItem(showGrid);
    QVERIFY(!item->previewRect().isNull());
    QVERIFY(item->boundingRect().contains(item->previewRect()));

    // A new run clears the previews when it starts; a Train of no epochs has no loss to draw.
    doc->setParam("train", "epochs", 0);
    QVERIFY2(w_->runGraph(), qPrintable(w_->lastMessage()));
    QVERIFY(preview(showGrid).empty());
    QVERIFY(item->previewRect().isNull());
    QTRY_VERIFY_WITH_TIMEOUT(!w_->runner()->isRunning(), 300000);
    QCOMPARE(preview(showGrid).kind, NodePreview::Kind::Heatmap);
    QVERIFY(preview("train").empty());
  }
};

// Two suites in one binary: the fabricated entries need no node set, so they run where the run cannot.
int main(int argc, char** argv) {
  QApplication app(argc, argv);
  app.setAttribute(Qt::AA_Use96Dpi, true);
  QTEST_SET_MAIN_SOURCE_PATH
  TestPreviewFields fabricated;
  const int fabricatedFailures = QTest::qExec(&fabricated, argc, argv);
  TestPreviews run;
  return fabricatedFailures + QTest::qExec(&run, argc, argv);
}
#include "test_previews.moc"
