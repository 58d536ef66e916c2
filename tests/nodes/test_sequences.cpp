// Sequences and regression through the node set, as a user draws them: a GRU language model on a text
// (perplexity from Train and Evaluate, text from Generate), a series regression with d2l's one-step and
// k-step predictions, tables with classes and with values, and every mismatch between the data, the network
// and the loss named before the run. Values are checked against independent computations where the report
// gives them (perplexity = exp of the loss, R^2 from the predictions, MSE from the points).
#include <QDir>
#include <QSet>
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>

#include "nodes_test_util.h"

using namespace nodes_test;

namespace {

// A graph of layer nodes in a chain after an Input, into a Network, trained by Train on `data`, then
// Evaluate (and Generate for a text).
struct Drawn {
  GraphDocument doc;
  QString last = "x";
  Drawn(const QJsonArray& inputShape, const QJsonObject& dataParams, const QJsonObject& trainParams) {
    doc.addNode(makeNode("x", "Input", {{"shape", inputShape}}));
    doc.addNode(makeNode("data", "Dataset", dataParams));
    doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("train", "Train", trainParams));
    doc.addNode(makeNode("eval", "Evaluate"));
  }
  Drawn& layer(const QString& id, const QString& type, const QJsonObject& params = {}) {
    doc.addNode(makeNode(id, type, params));
    wire(doc, last + ".out", id + ".in");
    last = id;
    return *this;
  }
  GraphDocument& done() {
    doc.addNode(makeNode("net", "Network", {{"init", "xavier"}}));
    wire(doc, last + ".out", "net.out");
    wire(doc, "net.model", "train.model");
    wire(doc, "data.data", "train.data");
    wire(doc, "cpu.device", "train.devices");
    wire(doc, "train.model", "eval.model");
    wire(doc, "data.data", "eval.data");
    return doc;
  }
};

QString writeFile(const QTemporaryDir& dir, const QString& name, const QByteArray& bytes) {
  QFile f(dir.filePath(name));
  if (!f.open(QIODevice::WriteOnly) || f.write(bytes) != bytes.size()) qFatal("cannot write %s", qPrintable(name));
  return f.fileName();
}

// y = 2 a - b + 0.5 + noise from a fixed sequence, and a class column: what the table tests learn.
QByteArray tableCsv(int rows) {
  QByteArray csv = "a,b,kind,y\n";
  for (int i = 0; i < rows; ++i) {
    const double a = std::sin(0.37 * i), b = std::cos(0.11 * i) * 2, noise = 0.01 * std::sin(7.7 * i);
    csv += QByteArray::number(a, 'g', 6) + "," + QByteArray::number(b, 'g', 6) + "," +
           (a > 0 ? "up" : "down") + "," + QByteArray::number(2 * a - b + 0.5 + noise, 'g', 6) + "\n";
  }
  return csv;
}

QStringList errorsOn(const ValidationReport& report, const QString& node) {
  QStringList out;
  for (const Issue& i : report.errors())
    if (i.node == node) out.append(i.text());
  return out;
}

}  // namespace

class SequencesTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;

 private slots:
  void initTestCase() { QVERIFY(plugin()); }

  void a_gru_language_model_trains_reports_perplexity_and_generates() {
    const QByteArray passage("the time machine by h g wells the time traveller for so it will be "
                             "convenient to speak of him was expounding a recondite matter to us ");
    const QString text = writeFile(dir_, "text.txt", passage.repeated(12));
    QSet<char> distinct(passage.begin(), passage.end());
    Drawn d({35}, {{"name", "text"}, {"path", text}, {"num_steps", 35}, {"batch_size", 8}, {"test_fraction", 0.2},
                   {"partition", "sequential"}},
            {{"epochs", 4}, {"lr", 1.0}, {"clip_grad_norm", 1.0}, {"log_every", 0}});
    d.layer("onehot", "OneHot", {{"num_classes", 28}}).layer("gru", "GRU", {{"hidden_size", 32}});
    d.layer("fc", "Linear", {{"out_features", 28}});
    GraphDocument& doc = d.done();
    doc.addNode(makeNode("gen", "Generate", {{"prefix", "the time "}, {"num_tokens", 20}}));
    wire(doc, "train.model", "gen.model");
    wire(doc, "data.data", "gen.data");
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject data = r.node("data");
    // Its letters and the space, plus <unk>: nothing else survives d2l's preprocessing.
    QCOMPARE(data["vocab_size"].toDouble(), double(distinct.size() + 1));
    QCOMPARE(data["top_tokens"].toArray().first().toArray().first().toString(), QString(" "));
    const QJsonObject train = r.node("train");
    QVERIFY2(std::fabs(train["perplexity"].toDouble() - std::exp(train["loss"].toDouble())) < 1e-9,
             "perplexity is exp of the mean per-token loss");
    QVERIFY(std::fabs(train["test_perplexity"].toDouble() - std::exp(train["test_loss"].toDouble())) < 1e-9);
    // The series: perplexity every epoch, falling from the vocabulary's size (a uniform guess) as it learns.
    const QJsonArray ppl = r.report["metrics"].toObject()["train.perplexity"].toArray();
    QCOMPARE(ppl.size(), 4);
    QVERIFY(ppl.first().toArray()[1].toDouble() < 28.5);
    QVERIFY2(ppl.last().toArray()[1].toDouble() < ppl.first().toArray()[1].toDouble(), "the loss did not fall");
    const QJsonObject eval = r.node("eval");
    QCOMPARE(eval["task"].toString(), QString("language_model"));
    QVERIFY(std::fabs(eval["perplexity"].toDouble() - train["test_perplexity"].toDouble()) < 1e-9);
    const QString generated = r.node("gen")["generated_text"].toString();
    QVERIFY2(generated.startsWith("the time "), qPrintable(generated));
    QCOMPARE(generated.size(), QString("the time ").size() + 20);
    for (QChar c : generated) QVERIFY2(c == ' ' || (c >= 'a' && c <= 'z'), qPrintable(generated));
  }

  void a_series_regression_reports_errors_and_both_predictions() {
    Drawn d({4}, {{"name", "series"}, {"path", ""}, {"tau", 4}, {"test_fraction", 0.4}, {"batch_size", 16}},
            {{"epochs", 5}, {"loss", "mse"}, {"optimizer", "adam"}, {"lr", 0.01}, {"log_every", 0}});
    d.layer("fc1", "Linear", {{"out_features", 10}}).layer("relu", "ReLU").layer("fc2", "Linear", {{"out_features", 1}});
    const RunResult r = runGraph(d.done());
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const QJsonObject train = r.node("train"), eval = r.node("eval");
    QCOMPARE(eval["task"].toString(), QString("regression"));
    QVERIFY(!train.contains("train_acc"));
    QVERIFY(train["train_mse"].toDouble() > 0);
    // MSE, MAE and R^2 again from the points the report carries (all of the test split's 396).
    const QJsonArray truth = eval["predictions"].toObject()["true"].toArray(),
                     pred = eval["predictions"].toObject()["predicted"].toArray();
    QCOMPARE(truth.size(), 396);
    double mean = 0, sse = 0, sae = 0, sst = 0;
    for (const QJsonValue& t : truth) mean += t.toDouble();
    mean /= truth.size();
    for (qsizetype i = 0; i < truth.size(); ++i) {
      const double e = pred[i].toDouble() - truth[i].toDouble();
      sse += e * e, sae += std::fabs(e), sst += std::pow(truth[i].toDouble() - mean, 2);
    }
    QVERIFY(std::fabs(eval["mse"].toDouble() - sse / truth.size()) < 1e-6);
    QVERIFY(std::fabs(eval["mae"].toDouble() - sae / truth.size()) < 1e-6);
    QVERIFY(std::fabs(eval["r2"].toDouble() - (1 - sse / sst)) < 1e-6);
    // The trainer sums on the device in float32, Evaluate on the host in float64.
    QVERIFY(std::fabs(train["test_mse"].toDouble() - eval["mse"].toDouble()) < 1e-6 * eval["mse"].toDouble());
    // The noise is N(0, 0.2): a one-step predictor cannot beat its variance by much, and a working one gets
    // near it, far below the series' own variance (about 0.5).
    QVERIFY2(eval["mse"].toDouble() < 0.1, qPrintable(QString::number(eval["mse"].toDouble())));
    const QJsonObject series = eval["series"].toObject();
    QCOMPARE(series["values"].toArray().size(), 1000);
    QCOMPARE(series["train_end"].toDouble(), 604.0);
    QVERIFY(series["one_step"].toArray()[3].isNull());
    QVERIFY(series["one_step"].toArray()[4].isDouble());
    QVERIFY(series["k_step"].toArray()[603].isNull());
    QVERIFY(series["k_step"].toArray()[604].isDouble());
  }

  void tables_train_classes_and_values() {
    const QString csv = writeFile(dir_, "table.csv", tableCsv(400));
    {
      Drawn d({2}, {{"name", "table"}, {"path", csv}, {"target", "y"}, {"features", "a, b"}, {"batch_size", 32}},
              {{"epochs", 30}, {"loss", "mse"}, {"optimizer", "adam"}, {"lr", 0.05}, {"log_every", 0}});
      d.layer("fc", "Linear", {{"out_features", 1}});
      const RunResult r = runGraph(d.done());
      QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
      QCOMPARE(r.node("data")["task"].toString(), QString("regression"));
      // A linear target with 1% noise: a Linear layer explains nearly all of it.
      QVERIFY2(r.node("eval")["r2"].toDouble() > 0.98, qPrintable(QString::number(r.node("eval")["r2"].toDouble())));
    }
    {
      Drawn d({3}, {{"name", "table"}, {"path", csv}, {"target", "kind"}, {"batch_size", 32}},
              {{"epochs", 20}, {"optimizer", "adam"}, {"lr", 0.05}, {"log_every", 0}});
      d.layer("fc", "Linear", {{"out_features", 2}});
      const RunResult r = runGraph(d.done());
      QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
      QCOMPARE(r.node("data")["classes"].toArray(), (QJsonArray{"down", "up"}));
      QCOMPARE(r.node("eval")["task"].toString(), QString("classification"));
      // kind is the sign of a, which is a feature: a linear classifier separates it.
      QVERIFY2(r.node("eval")["accuracy"].toDouble() > 0.9,
               qPrintable(QString::number(r.node("eval")["accuracy"].toDouble())));
      QCOMPARE(r.node("eval")["confusion"].toArray().size(), 2);
    }
  }

  void mismatches_between_data_network_and_loss_are_named_before_the_run() {
    const QString csv = writeFile(dir_, "t.csv", tableCsv(20));
    struct Case {
      QString name;
      QJsonArray input;
      QJsonObject data, train;
      int outputs;
      QString node, needle;  // node empty: only the run can tell (the error names `needle` on Train)
    };
    const QList<Case> cases{
        // A table's classes are in its rows, read at the run.
        {"network with fewer classes than the table", {3}, {{"name", "table"}, {"path", csv}, {"target", "kind"},
                                                            {"task", "classification"}},
         {}, 1, "", "out_features"},
        {"a table's target that is not a column", {3}, {{"name", "table"}, {"path", csv}, {"target", "price"}}, {}, 1,
         "data", "a, b, kind, y"},
        {"a table feature that is not a column", {1}, {{"name", "table"}, {"path", csv}, {"target", "y"},
                                                       {"features", "a, c"}}, {}, 1, "data", "'c'"},
        {"an Input that is not the table's row", {2}, {{"name", "table"}, {"path", csv}, {"target", "y"},
                                                       {"task", "regression"}}, {{"loss", "mse"}}, 1, "train", "[3]"},
        {"cross-entropy on a regression table", {3}, {{"name", "table"}, {"path", csv}, {"target", "y"},
                                                      {"task", "regression"}}, {}, 1, "train", "mse, l1 or huber"},
        {"huber on classes", {3}, {{"name", "table"}, {"path", csv}, {"target", "kind"},
                                   {"task", "classification"}}, {{"loss", "huber"}}, 2, "train", "cross_entropy"},
        {"label smoothing with mse", {4}, {{"name", "series"}, {"path", ""}}, {{"loss", "mse"},
                                                                               {"label_smoothing", 0.1}}, 1, "",
         "label_smoothing"},
    };
    for (const Case& c : cases) {
      Drawn d(c.input, c.data, c.train);
      d.layer("fc", "Linear", {{"out_features", c.outputs}});
      GraphDocument& doc = d.done();
      const ValidationReport report = validate(doc, registry(), settingsOf(doc));
      if (c.node.isEmpty()) {
        QVERIFY2(errorsOn(report, "train").isEmpty(), qPrintable(c.name));
        const RunResult r = runGraph(doc);
        const QString error = r.node("train")["error"].toString();
        QVERIFY2(error.contains(c.needle), qPrintable(c.name + ": " + error));
        continue;
      }
      const QStringList errors = errorsOn(report, c.node);
      QVERIFY2(errors.size() == 1, qPrintable(c.name + ": " + errors.join(" | ")));
      QVERIFY2(errors.first().contains(c.needle), qPrintable(c.name + ": " + errors.first()));
    }
  }

  void the_rows_of_an_image_as_steps() {
    Drawn d({1, 28, 28}, {{"name", "synthetic"}, {"batch_size", 64}, {"limit", 256}},
            {{"epochs", 2}, {"optimizer", "adam"}, {"lr", 0.01}, {"log_every", 0}});
    d.layer("rows", "Reshape", {{"shape", QJsonArray{28, 28}}}).layer("lstm", "LSTM", {{"hidden_size", 32}});
    d.layer("last", "LastStep").layer("fc", "Linear", {{"out_features", 10}});
    GraphDocument& doc = d.done();
    const ValidationReport report = validate(doc, registry(), settingsOf(doc));
    QCOMPARE(report.facts().value("rows").badge, QString("28×28"));
    QCOMPARE(report.facts().value("rows").detail, QString("28 steps × 28 features per sample"));
    QVERIFY(report.facts().value("lstm").badge.startsWith("28×32"));
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    // Ten fixed patterns plus noise: an LSTM reading the rows tells them apart.
    QVERIFY2(r.node("eval")["accuracy"].toDouble() > 0.5, qPrintable(QString::number(r.node("eval")["accuracy"].toDouble())));
  }
};

QTEST_GUILESS_MAIN(SequencesTest)
#include "test_sequences.moc"
