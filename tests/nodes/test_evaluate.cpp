// The Evaluate node's report with the real plugin: Dataset (synthetic) -> Model -> Train -> Evaluate, and an
// Evaluate of the untrained model beside it. The confusion matrix against the accuracy and the per-class
// accuracies, the mistakes (how many, their order, their top-5 and their PNG images), the accuracy against
// Train's own test accuracy, and class names from an image folder whose images say which class they are.
#include <QDir>
#include <QImage>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>

#include "nodes_test_util.h"

using namespace nodes_test;

namespace {

// Model (mlp, cpu) -> Train (one epoch) -> `eval`, and the untrained model -> `untrained`, on synthetic data.
// A low rate leaves the trained model a few mistakes (21 here, fewer than the 48 shown), the untrained one
// hundreds (more than it shows).
void syntheticGraph(GraphDocument& doc, const QJsonObject& evalParams, const QJsonObject& untrainedParams) {
  doc.setSettings(QJsonObject{{"cpu_devices", 1}});
  doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
  doc.addNode(makeNode("data", "Dataset", {{"name", "synthetic"}, {"batch_size", 100}}));
  doc.addNode(makeNode("net", "Model", {{"arch", "mlp"}}));
  doc.addNode(makeNode("train", "Train", {{"epochs", 1}, {"lr", 0.02}, {"log_every", 0}}));
  doc.addNode(makeNode("eval", "Evaluate", evalParams));
  doc.addNode(makeNode("untrained", "Evaluate", untrainedParams));
  wire(doc, "cpu.device", "net.device");
  wire(doc, "cpu.device", "train.devices");
  wire(doc, "net.model", "train.model");
  wire(doc, "data.data", "train.data");
  wire(doc, "train.model", "eval.model");
  wire(doc, "data.data", "eval.data");
  wire(doc, "net.model", "untrained.model");
  wire(doc, "data.data", "untrained.data");
}

QImage decodePng(const QJsonValue& v) {
  return QImage::fromData(QByteArray::fromBase64(v.toString().toLatin1()), "PNG");
}

// Every field of one Evaluate's report checked against the others; returns the number of mistakes shown.
int checkReport(const QJsonObject& n, int shown, int side, int classes) {
  const int samples = n["samples"].toInt();
  const QJsonArray confusion = n["confusion"].toArray(), perClass = n["per_class"].toArray();
  [&] {
    QCOMPARE(confusion.size(), classes);
    QCOMPARE(perClass.size(), classes);
    QCOMPARE(n["class_names"].toArray().size(), classes);
  }();
  if (QTest::currentTestFailed()) return -1;
  qint64 total = 0, diagonal = 0;
  for (int t = 0; t < classes; ++t) {
    const QJsonArray row = confusion[t].toArray();
    [&] { QCOMPARE(row.size(), classes); }();
    qint64 rowSum = 0;
    for (const QJsonValue& c : row) {
      [&] { QVERIFY(c.isDouble() && c.toDouble() >= 0 && c.toDouble() == std::floor(c.toDouble())); }();
      rowSum += c.toInteger();
    }
    total += rowSum;
    diagonal += row[t].toInteger();
    // Each class's accuracy is its row's diagonal over the row; a class without samples has none (null).
    if (rowSum == 0)
      [&] { QVERIFY(perClass[t].isNull()); }();
    else
      [&] { QCOMPARE(perClass[t].toDouble(), double(row[t].toInteger()) / double(rowSum)); }();
  }
  const qint64 wrong = total - diagonal;
  [&] {
    QCOMPARE(total, qint64(samples));
    QCOMPARE(n["accuracy"].toDouble(), double(diagonal) / double(samples));
    QCOMPARE(n["mistakes_total"].toInteger(), wrong);
  }();
  const QJsonArray mistakes = n["mistakes"].toArray();
  [&] { QCOMPARE(qint64(mistakes.size()), std::min<qint64>(shown, wrong)); }();
  QSet<qint64> seen;
  double previous = 2;
  for (const QJsonValue& v : mistakes) {
    const QJsonObject m = v.toObject();
    const int t = m["true"].toInt(), p = m["predicted"].toInt();
    const double conf = m["confidence"].toDouble();
    const QJsonArray top5 = m["top5"].toArray();
    [&] {
      QVERIFY(t != p);
      QVERIFY(t >= 0 && t < classes && p >= 0 && p < classes);
      QVERIFY2(confusion[t].toArray()[p].toInteger() > 0, "a mistake the confusion matrix does not count");
      QVERIFY(m["index"].toInteger() >= 0 && m["index"].toInteger() < samples);
      QVERIFY2(!seen.contains(m["index"].toInteger()), "a sample listed twice");
      QVERIFY2(conf <= previous, "mistakes are not sorted by confidence, highest first");
      QVERIFY(conf > 0 && conf <= 1);
      // The prediction is the most probable class: its probability is at least 1 / classes.
      QVERIFY(conf >= 1.0 / classes - 1e-6);
      QCOMPARE(top5.size(), std::min(5, classes));
      QCOMPARE(top5[0].toArray()[0].toInt(), p);
      QCOMPARE(top5[0].toArray()[1].toDouble(), conf);
      double sum = 0, last = 2;
      for (const QJsonValue& e : top5) {
        const double q = e.toArray()[1].toDouble();
        QVERIFY(q <= last);
        last = q;
        sum += q;
      }
      QVERIFY(sum <= 1 + 1e-5);
      const QImage img = decodePng(m["image"]);
      QVERIFY2(!img.isNull(), "the image is not a PNG");
      QCOMPARE(img.width(), side);
      QCOMPARE(img.height(), side);
    }();
    if (QTest::currentTestFailed()) return -1;
    seen.insert(m["index"].toInteger());
    previous = conf;
  }
  return int(mistakes.size());
}

}  // namespace

class EvaluateTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QVERIFY2(plugin(), "the GPU node set did not load from " GN_NODES_PLUGIN); }

  void mistakes_shown_defaults_to_48() {
    const ParamSpec* p = registry().find("Evaluate")->spec().param("mistakes_shown");
    QVERIFY(p);
    QCOMPARE(p->defaultValue.toDouble(), 48.0);
    QCOMPARE(checkParam(*p, 1000), QString());
    QVERIFY(!checkParam(*p, 1001).isEmpty());
    QVERIFY(!checkParam(*p, -1).isEmpty());
  }

  void the_report_holds_confusion_per_class_and_mistakes() {
    GraphDocument doc;
    syntheticGraph(doc, {}, {{"mistakes_shown", 30}});
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject trained = r.node("eval"), untrained = r.node("untrained");
    QCOMPARE(trained["samples"].toInt(), 512);
    QCOMPARE(trained["split"].toString(), QString("test"));
    // One pass gives the accuracy Train measured on the same split with the same weights.
    QCOMPARE(trained["accuracy"].toDouble(), r.node("train")["test_acc"].toDouble());
    const int shownTrained = checkReport(trained, 48, 28, 10);
    QVERIFY(shownTrained >= 0);
    const int shownUntrained = checkReport(untrained, 30, 28, 10);
    // The untrained MLP is near chance: it has far more than 30 mistakes.
    QCOMPARE(shownUntrained, 30);
    qInfo("trained: accuracy %.3f, %d mistakes shown of %lld; untrained: accuracy %.3f, %lld mistakes",
          trained["accuracy"].toDouble(), shownTrained, trained["mistakes_total"].toInteger(),
          untrained["accuracy"].toDouble(), untrained["mistakes_total"].toInteger());
    const QJsonArray names = trained["class_names"].toArray();
    QCOMPARE(names[0].toString(), QString("class 0"));
    QCOMPARE(names[9].toString(), QString("class 9"));
    // The synthetic set is grey.
    QCOMPARE(decodePng(untrained["mistakes"].toArray()[0].toObject()["image"]).isGrayscale(), true);
  }

  void no_mistakes_shown_when_asked_for_none() {
    GraphDocument doc;
    syntheticGraph(doc, {{"split", "train"}}, {{"mistakes_shown", 0}});
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QCOMPARE(r.node("eval")["samples"].toInt(), 2048);
    QVERIFY(checkReport(r.node("eval"), 48, 28, 10) >= 0);
    QCOMPARE(checkReport(r.node("untrained"), 0, 28, 10), 0);
    QVERIFY(r.node("untrained")["mistakes_total"].toInteger() > 0);
  }

  void an_image_folder_names_its_classes_and_its_images_match_them() {
    // Three classes of 8x8 RGB images, each image one colour that says its class: the image of a mistake must
    // be one of its true class's.
    QTemporaryDir dir;
    QVERIFY(dir.isValid());
    const QStringList classes{"cat", "dog", "emu"};
    QHash<QRgb, int> classOf;
    for (int c = 0; c < classes.size(); ++c) {
      QVERIFY(QDir(dir.path()).mkpath(classes[c]));
      for (int i = 0; i < 10; ++i) {
        const QColor colour(40 + 80 * c, 20 * i, 200 - 60 * c);
        QImage img(8, 8, QImage::Format_RGB888);
        img.fill(colour);
        QVERIFY(img.save(dir.filePath(QString("%1/%2.png").arg(classes[c]).arg(i)), "PNG"));
        classOf.insert(colour.rgb(), c);
      }
    }
    GraphDocument doc;
    doc.setSettings(QJsonObject{{"cpu_devices", 1}});
    doc.addNode(makeNode("data", "Dataset",
                         {{"name", "image_folder"},
                          {"path", dir.path()},
                          {"channels", 3},
                          {"test_fraction", 0.5},
                          {"batch_size", 4}}));
    doc.addNode(makeNode("net", "Model",
                         {{"arch", "mlp"},
                          {"classes", 3},
                          {"in_channels", 3},
                          {"image_size", 8},
                          {"init", "kaiming"},
                          {"seed", 7}}));
    doc.addNode(makeNode("eval", "Evaluate", {{"mistakes_shown", 1000}}));
    wire(doc, "net.model", "eval.model");
    wire(doc, "data.data", "eval.data");
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject n = r.node("eval");
    QCOMPARE(n["class_names"].toArray(), (QJsonArray{"cat", "dog", "emu"}));
    QCOMPARE(n["samples"].toInt(), 15);
    const int shown = checkReport(n, 1000, 8, 3);
    QVERIFY(shown >= 0);
    QCOMPARE(qint64(shown), n["mistakes_total"].toInteger());
    QVERIFY2(shown > 0, "a random model on three classes should get some wrong");
    for (const QJsonValue& v : n["mistakes"].toArray()) {
      const QImage img = decodePng(v.toObject()["image"]);
      QVERIFY(!img.isGrayscale());
      const QRgb px = img.pixel(3, 3);
      QVERIFY2(classOf.contains(px), "the image is none of the images written");
      QCOMPARE(classOf.value(px), v.toObject()["true"].toInt());
      QCOMPARE(img.pixel(0, 0), px);
    }
  }
};

QTEST_MAIN(EvaluateTest)
#include "test_evaluate.moc"
