// Training drawn networks and the losses, against PyTorch:
// - Training through the real binary (build/bin/gpunodes): the Train node takes five SGD steps, one epoch of a
//   Dataset limited to five batches, with log_every 1; torch (tests/interop/torch_sequence_peer.py) trains
//   the same network from the same initial weights on the same batches, with torch.nn.utils.clip_grad_norm_
//   over every parameter and torch.optim.SGD. The models: d2l 9.5's GRU language model (OneHot -> GRU(32) ->
//   Linear(vocab)) at d2l's train_ch8 settings (lr 1, clip 1) on a text written here, once from torch's
//   weights (LoadParams) with the random partition, once from gpunodes' own (SaveParams) with the
//   sequential one, whose recurrent state carries from batch to batch (d2l's train_epoch_ch8), and once on a
//   sentence per line with the lines partition, padded (torch differentiates d2l's MaskedSoftmaxCELoss and
//   counts only the real targets); and d2l 9.1's MLP on the sine series with the MSE, L1 and Huber losses.
//   The batches are what the runtime's loader gives for the Dataset node's options; the peer checks the
//   text's batches independently against d2l's tokenization, vocabulary and window order (or truncate_pad of
//   each line). Compared: the loss after every batch (the train.loss series is the mean over the epoch so
//   far, so each batch's own loss follows from two points), the perplexity and accuracy series, the trained
//   weights, and the Train and Evaluate nodes' test and training measures (perplexity as d2l computes it, exp
//   of the mean per-token cross-entropy; MSE, MAE and every prediction for the series).
// - The losses at the runtime level: gn::nn::regression_loss (MSELoss, L1Loss, HuberLoss(delta)) and
//   softmax_cross_entropy over [N, T, V] logits (with and without label smoothing and padding, torch's
//   ignore_index) against torch's in float64: the mean, the totals the trainer sums, the gradient, and the
//   perplexity from the totals.
// The suite skips where /usr/bin/python3 cannot import torch (the scripts install it).
#include <QElapsedTimer>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "gpunodes/nn/data.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/sequence_data.h"
#include "gpunodes/nn/sequence_layers.h"
#include "gpunodes/ops.h"
#include "interop_util.h"
#include "runtime/nn_test_util.h"

using namespace gn;
using interop::node;
using interop::Process;
using interop::readJson;
using interop::wire;
using interop::writeJson;

namespace {

constexpr int64_t kBatches = 5;
// A step's loss, and every measure derived from the trained network, agree to 1e-4 of their size: the two
// sides sum float32 in other orders, and five steps at lr 1 carry those last bits on.
constexpr double kLossTol = 1e-4;
// The losses computed directly: float32 against torch's float64, over a few hundred values.
constexpr double kDirectTol = 1e-5;
constexpr int kHidden = 32, kTau = 4;
constexpr double kTextTestFraction = 0.4, kSeriesTestFraction = 0.4;

// A text for the language model: sentences drawn from a fixed list of words (every letter occurs), with
// capitals, digits, punctuation, quotes and line breaks for d2l's preprocessing to fold into spaces. With
// lineEach, every sentence ends its line (the lines partition's samples: short ones padded, long ones cut).
QByteArray makeText(int chars, bool lineEach = false) {
  static const char* const kWords[] = {
      "the",        "time",      "traveller", "for",      "so",       "it",     "will",       "be",
      "convenient", "to",        "speak",     "of",       "him",      "was",    "expounding", "a",
      "recondite",  "matter",    "us",        "his",      "grey",     "eyes",   "shone",      "and",
      "twinkled",   "his",       "usually",   "pale",     "face",     "was",    "flushed",    "animated",
      "the",        "fire",      "burned",    "brightly", "quiet",    "jovial", "zephyr",     "box",
      "kept",       "exquisite", "lazy",      "with",     "we",       "sat",    "in",         "chairs",
      "that",       "embraced",  "rather",    "than",     "submitted"};
  constexpr int kCount = static_cast<int>(sizeof(kWords) / sizeof(kWords[0]));
  std::mt19937 g(11);
  std::uniform_int_distribution<int> word(0, kCount - 1), length(4, 14), coin(0, 9);
  QByteArray text;
  while (text.size() < chars) {
    const int n = length(g);
    for (int i = 0; i < n; ++i) {
      QByteArray w = kWords[word(g)];
      if (i == 0) w[0] = static_cast<char>(w[0] - 'a' + 'A');
      if (coin(g) == 0) w = "\"" + w + "\"";
      text += w;
      if (i + 1 < n) text += coin(g) == 1 ? ", " : coin(g) == 2 ? " -- " : coin(g) == 3 ? " 1895 " : " ";
    }
    text += lineEach ? (coin(g) < 5 ? ".\n" : "!\r\n") : coin(g) < 3 ? ".\n" : coin(g) < 5 ? "; " : ". ";
  }
  return text;
}

template <class T>
void writeRaw(const QString& path, const std::vector<T>& v) {
  QFile f(path);
  if (f.open(QIODevice::WriteOnly))
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<qint64>(v.size() * sizeof(T)));
}

template <class T>
std::vector<T> readRaw(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return {};
  const QByteArray b = f.readAll();
  std::vector<T> v(static_cast<size_t>(b.size()) / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

QJsonArray shapeJson(const Shape& s) {
  QJsonArray a;
  for (int64_t d : s) a.append(static_cast<double>(d));
  return a;
}

// |got - want| within tol of |want|, or a message that says by how much not.
QString within(const char* what, double got, double want, double tol, double* worst = nullptr) {
  const double d = std::abs(got - want), rel = d / std::max(std::abs(want), 1e-30);
  if (worst) *worst = std::max(*worst, rel);
  if (rel <= tol) return {};
  return QString("%1: gpunodes %2, torch %3 (relative difference %4, tolerance %5)")
      .arg(what)
      .arg(got, 0, 'g', 9)
      .arg(want, 0, 'g', 9)
      .arg(rel, 0, 'g', 3)
      .arg(tol, 0, 'g', 3);
}

struct TrainCase {
  QString dataset;  // "text" or "series"
  QString partition = "random";
  QString loss = "cross_entropy";
  double huberDelta = 1;
  double lr = 1, clip = 0;
  bool clips = false;  // the clip must bite in some step (a clip above every gradient norm checks nothing)
  bool torchInit = false;  // initial weights: torch's through LoadParams, or gpunodes' own through SaveParams
  int64_t batch = 32;
  int64_t shuffleSeed = 0, trainSeed = 0;
  int numSteps = 35;  // text: d2l's num_steps
};

}  // namespace

Q_DECLARE_METATYPE(TrainCase)

class TorchSequencesTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  Runtime rt_;
  Device device_ = Device::cpu();
  QString textPath_, linesPath_;

  QString path(const QString& name) const { return dir_.filePath(name); }

  // The values and targets of a value dataset, in its stored order.
  static void dump(const nn::Dataset& d, const QString& x, const QString& y) {
    writeRaw(x, d.values);
    writeRaw(y, d.targets);
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    GN_USE_TEST_DEVICE(rt_, device_);
    if (const QString why = interop::torchMissing(GN_PYTHON); !why.isEmpty()) QSKIP(qPrintable(why));
    textPath_ = path("text.txt");
    QFile f(textPath_);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(makeText(19000));
    linesPath_ = path("lines.txt");
    QFile lines(linesPath_);
    QVERIFY(lines.open(QIODevice::WriteOnly));
    lines.write(makeText(12000, true));
  }

  void training_matches_torch_data() {
    QTest::addColumn<TrainCase>("c");
    // d2l's train_ch8: lr 1, clip 1; the loss is a mean over every token, so the gradients' norm starts near
    // 0.25 and the clip at 1 does not bite in five steps. The sequential row clips at 0.27, which bites in
    // the first steps and not the later ones.
    TrainCase random{.dataset = "text",
                     .lr = 1,
                     .clip = 1,
                     .torchInit = true,
                     .batch = 32,
                     .shuffleSeed = 5,
                     .trainSeed = 2};
    QTest::newRow("gru language model, random partition, torch's weights, clip 1") << random;
    // Shorter windows, so that more of each window's steps depend on the state carried in from the batch
    // before.
    TrainCase sequential{.dataset = "text",
                         .partition = "sequential",
                         .lr = 1,
                         .clip = 0.27,
                         .clips = true,
                         .batch = 32,
                         .shuffleSeed = 9,
                         .numSteps = 10};
    QTest::newRow("gru language model, sequential partition, gpunodes' weights, clip 0.27") << sequential;
    // A sentence per line, padded to 48 steps (or cut there): the padded targets are in no loss, gradient,
    // accuracy or count.
    TrainCase lines{.dataset = "text",
                    .partition = "lines",
                    .lr = 1,
                    .clip = 1,
                    .torchInit = true,
                    .batch = 8,
                    .shuffleSeed = 4,
                    .trainSeed = 1,
                    .numSteps = 48};
    QTest::newRow("gru language model, lines partition, padded, torch's weights") << lines;
    TrainCase series{.dataset = "series", .loss = "mse", .lr = 0.2, .batch = 16, .shuffleSeed = 3};
    QTest::newRow("series mlp, mse") << series;
    series.loss = "l1";
    series.lr = 0.1;
    series.clip = 0.5;
    series.clips = true;
    series.torchInit = true;
    series.trainSeed = 1;
    QTest::newRow("series mlp, l1, clipped, torch's weights") << series;
    series.loss = "huber";
    series.huberDelta = 0.5;
    series.lr = 0.3;
    series.clip = 0;
    series.clips = false;
    series.torchInit = false;
    QTest::newRow("series mlp, huber 0.5") << series;
  }

  void training_matches_torch() {
    QFETCH(TrainCase, c);
    const QString tag = QString(QTest::currentDataTag()).replace(QRegularExpression("[^a-z0-9]+"), "_");
    const bool text = c.dataset == "text";
    const int64_t limit = kBatches * c.batch;
    const QString textPath = c.partition == "lines" ? linesPath_ : textPath_;

    // The datasets as the Dataset node loads them (nodes/dataset_node.cpp: the shuffle seed also draws the
    // text's window offset and the series' noise), limited to five batches per split.
    nn::DatasetPtr train, test;
    if (text) {
      nn::TextOptions o;
      o.path = textPath.toStdString();
      o.num_steps = c.numSteps;
      o.partition = c.partition == "sequential" ? nn::TextOptions::Partition::Sequential
                    : c.partition == "lines"    ? nn::TextOptions::Partition::Lines
                                                : nn::TextOptions::Partition::Random;
      o.test_fraction = kTextTestFraction;
      o.seed = static_cast<uint64_t>(c.shuffleSeed);
      nn::TextData d = nn::load_text(o);
      train = nn::take(d.train, limit), test = nn::take(d.test, limit);
    } else {
      nn::SeriesOptions o;
      o.tau = kTau;
      o.test_fraction = kSeriesTestFraction;
      o.seed = static_cast<uint64_t>(c.shuffleSeed);
      nn::SeriesData d = nn::load_series(o);
      train = nn::take(d.train, limit), test = nn::take(d.test, limit);
    }
    QVERIFY(train && test);
    QCOMPARE(train->count, limit);
    QCOMPARE(test->count, limit);
    const int64_t vocab = text ? static_cast<int64_t>(train->vocabulary.size()) : 0;

    // The batches the Train node reads: its loader's options (runtime/src/nn/train/fit.cpp), the seed the
    // Dataset's shuffle_seed plus the Train's seed.
    nn::LoaderOptions lo;
    lo.batch_size = c.batch;
    lo.shuffle = true;
    lo.seed = static_cast<uint64_t>(c.shuffleSeed + c.trainSeed);
    std::vector<float> xs, ys;
    {
      nn::DataLoader loader(train, lo);
      QCOMPARE(loader.batches_per_epoch(), kBatches);
      loader.start_epoch(0);
      while (nn::HostBatchPtr b = loader.next()) {
        QCOMPARE(b->size, c.batch);
        xs.insert(xs.end(), b->images, b->images + b->size * b->sample_numel());
        ys.insert(ys.end(), b->labels, b->labels + b->size * b->target_numel());
      }
    }
    writeRaw(path(tag + ".x.f32"), xs);
    writeRaw(path(tag + ".y.f32"), ys);
    dump(*test, path(tag + ".test_x.f32"), path(tag + ".test_y.f32"));
    dump(*train, path(tag + ".train_x.f32"), path(tag + ".train_y.f32"));

    // The network: d2l 9.5's RNNModel with a GRU, or d2l 9.1's MLP.
    QJsonArray layers, layerWires;
    if (text) {
      layers = {node("x", "Input", {{"shape", QJsonArray{c.numSteps}}}),
                node("oh", "OneHot", {{"num_classes", static_cast<double>(vocab)}}),
                node("gru", "GRU", {{"hidden_size", kHidden}}),
                node("fc", "Linear", {{"out_features", static_cast<double>(vocab)}}),
                node("net", "Network", {{"init", "xavier"}, {"seed", 3}})};
      layerWires = {wire("x.out", "oh.in"), wire("oh.out", "gru.in"), wire("gru.out", "fc.in"),
                    wire("fc.out", "net.out")};
    } else {
      layers = {node("x", "Input", {{"shape", QJsonArray{kTau}}}),
                node("fc1", "Linear", {{"out_features", 10}}), node("relu", "ReLU"),
                node("fc2", "Linear", {{"out_features", 1}}),
                node("net", "Network", {{"init", "xavier"}, {"seed", 4}})};
      layerWires = {wire("x.out", "fc1.in"), wire("fc1.out", "relu.in"), wire("relu.out", "fc2.in"),
                    wire("fc2.out", "net.out")};
    }
    const QString netFile = path(tag + ".net.json"), spec = netFile + "#net";
    QVERIFY(writeJson(netFile, interop::graphOf(layers, layerWires)));

    const QString initWeights = path(tag + ".init.safetensors"),
                  finalWeights = path(tag + ".final.safetensors");
    if (c.torchInit) {
      const Process p = interop::run(GN_PYTHON, {GN_TORCH_PEER, "save", spec, "8", initWeights});
      QVERIFY2(p.exitCode == 0, qPrintable("torch could not save its weights: " + p.err));
    }

    // gpunodes: the Train node, then its model saved and evaluated on both splits.
    QJsonObject dataParams{{"name", c.dataset},
                           {"batch_size", static_cast<double>(c.batch)},
                           {"limit", static_cast<double>(limit)},
                           {"shuffle_seed", static_cast<double>(c.shuffleSeed)}};
    if (text) {
      dataParams["path"] = textPath;
      dataParams["tokens"] = "char";
      dataParams["num_steps"] = c.numSteps;
      dataParams["partition"] = c.partition;
      dataParams["test_fraction"] = kTextTestFraction;
    } else {
      dataParams["path"] = "";
      dataParams["tau"] = kTau;
      dataParams["test_fraction"] = kSeriesTestFraction;
    }
    QJsonArray nodes = layers, wires = layerWires;
    nodes.append(node("cpu", "Device", {{"kind", "cpu"}}));
    nodes.append(node("data", "Dataset", dataParams));
    nodes.append(node("train", "Train",
                      {{"epochs", 1},
                       {"optimizer", "sgd"},
                       {"lr", c.lr},
                       {"clip_grad_norm", c.clip},
                       {"loss", c.loss},
                       {"huber_delta", c.huberDelta},
                       {"log_every", 1},
                       {"seed", static_cast<double>(c.trainSeed)}}));
    nodes.append(node("final", "SaveParams", {{"path", finalWeights}, {"format", "safetensors"}}));
    nodes.append(node("evtest", "Evaluate", {{"split", "test"}}));
    nodes.append(node("evtrain", "Evaluate", {{"split", "train"}}));
    if (c.torchInit) {
      nodes.append(node("init", "LoadParams", {{"path", initWeights}}));
      wires.append(wire("cpu.device", "init.device"));
      wires.append(wire("net.model", "init.like"));
    } else {
      nodes.append(node("init", "SaveParams", {{"path", initWeights}, {"format", "safetensors"}}));
      wires.append(wire("net.model", "init.model"));
    }
    wires.append(wire("init.model", "train.model"));
    wires.append(wire("data.data", "train.data"));
    wires.append(wire("cpu.device", "train.devices"));
    wires.append(wire("train.model", "final.model"));
    for (const QString e : {"evtest", "evtrain"}) {
      wires.append(wire("final.model", e + ".model"));
      wires.append(wire("data.data", e + ".data"));
    }
    const QString graphFile = path(tag + ".graph.json"), reportFile = path(tag + ".report.json");
    QVERIFY(writeJson(graphFile, interop::graphOf(nodes, wires)));
    QElapsedTimer timer;
    timer.start();
    Process p = interop::run(GN_GPUNODES, {"run", graphFile, "--quiet", "--report", reportFile});
    QVERIFY2(p.exitCode == 0, qPrintable(QString("gpunodes run: exit %1\n%2").arg(p.exitCode).arg(p.err)));
    const qint64 gnMs = timer.elapsed();
    const QJsonObject report = readJson(reportFile);
    const QJsonObject reported = report["nodes"].toObject();
    const QJsonObject metrics = report["metrics"].toObject();
    if (text) QCOMPARE(reported["data"].toObject()["vocab_size"].toDouble(), static_cast<double>(vocab));

    // torch: the same steps on the same batches.
    QJsonObject job{{"model", spec},
                    {"weights", initWeights},
                    {"x", path(tag + ".x.f32")},
                    {"y", path(tag + ".y.f32")},
                    {"batches", static_cast<double>(kBatches)},
                    {"rows", static_cast<double>(c.batch)},
                    {"sample", shapeJson(train->sample_dims())},
                    {"target", shapeJson(train->target_dims())},
                    {"loss", c.loss},
                    {"huber_delta", c.huberDelta},
                    {"lr", c.lr},
                    {"clip_grad_norm", c.clip},
                    {"carry_state", c.partition == "sequential"},
                    {"pad_target", static_cast<double>(train->pad_target)},
                    {"eval", QJsonArray{QJsonObject{{"x", path(tag + ".test_x.f32")},
                                                    {"y", path(tag + ".test_y.f32")},
                                                    {"count", static_cast<double>(limit)}},
                                        QJsonObject{{"x", path(tag + ".train_x.f32")},
                                                    {"y", path(tag + ".train_y.f32")},
                                                    {"count", static_cast<double>(limit)}}}},
                    {"gn_final", finalWeights},
                    {"out_torch", path(tag + ".torch_final.f32")},
                    {"out_gn", path(tag + ".gn_final.f32")}};
    if (text) {
      QJsonArray tokens;
      for (const std::string& t : train->vocabulary) tokens.append(QString::fromStdString(t));
      job["text"] = QJsonObject{{"path", textPath},
                                {"num_steps", c.numSteps},
                                {"vocabulary", tokens},
                                {"partition", c.partition},
                                {"test_x", path(tag + ".test_x.f32")},
                                {"test_y", path(tag + ".test_y.f32")},
                                {"test_count", static_cast<double>(limit)},
                                {"test_fraction", kTextTestFraction}};
    }
    const QString jobFile = path(tag + ".jobs.json");
    QVERIFY(writeJson(jobFile, QJsonObject{{"train", QJsonArray{job}}}));
    timer.restart();
    p = interop::run(GN_PYTHON, {GN_TORCH_SEQUENCE_PEER, jobFile});
    QVERIFY2(p.exitCode == 0, qPrintable("the torch peer failed: " + p.err));
    const qint64 torchMs = timer.elapsed();
    const QJsonObject t = QJsonDocument::fromJson(p.out.section('\n', 0, 0).toUtf8()).object();
    QVERIFY2(t["losses"].toArray().size() == kBatches, qPrintable("the peer said: " + p.out));
    if (text)
      qInfo("the text: %s", qPrintable(QJsonDocument(t["text"].toObject()).toJson(QJsonDocument::Compact)));
    qInfo("gpunodes ran in %lld ms, torch's peer in %lld ms", static_cast<long long>(gnMs),
          static_cast<long long>(torchMs));

    // Every batch's loss: the series holds the mean over the epoch so far after each batch (the last point is
    // the epoch's), so batch k's own loss is (n_k mean_k - n_(k-1) mean_(k-1)) / (n_k - n_(k-1)), n_k the
    // targets counted so far (all of them but the padding).
    std::vector<double> torchLoss, torchCum, torchSecondCum, values;
    double sum = 0, second = 0, count = 0;
    for (int64_t k = 0; k < kBatches; ++k) {
      const double v = t["values"].toArray()[k].toDouble();
      torchLoss.push_back(t["losses"].toArray()[k].toDouble());
      sum += torchLoss.back() * v, second += t["correct"].toArray()[k].toDouble(), count += v;
      torchCum.push_back(sum / count), torchSecondCum.push_back(second / count), values.push_back(count);
    }
    auto series = [&](const QString& name) {
      std::vector<double> out;
      for (const QJsonValue& point : metrics["train." + name].toArray())
        out.push_back(point.toArray()[1].toDouble());
      return out;
    };
    const std::vector<double> gnCum = series("loss");
    QCOMPARE(static_cast<int64_t>(gnCum.size()), kBatches);
    double worstCum = 0, worstStep = 0;
    for (int64_t k = 0; k < kBatches; ++k) {
      const double before = k > 0 ? values[k - 1] : 0;
      const double step = (values[k] * gnCum[k] - (k > 0 ? before * gnCum[k - 1] : 0)) / (values[k] - before);
      QString bad = within(qPrintable(QString("the mean loss after batch %1").arg(k + 1)), gnCum[k],
                           torchCum[k], kLossTol, &worstCum);
      if (bad.isEmpty())
        bad = within(qPrintable(QString("batch %1's loss").arg(k + 1)), step, torchLoss[k], kLossTol,
                     &worstStep);
      QVERIFY2(bad.isEmpty(), qPrintable(bad));
    }
    QString losses;
    for (double l : torchLoss) losses += QString::number(l, 'f', 5) + " ";
    qInfo(
        "torch's losses per batch %s; largest relative difference %.3g (means over the epoch so far), %.3g "
        "(per batch)",
        qPrintable(losses), worstCum, worstStep);
    QVERIFY2(torchLoss.back() < torchLoss.front(),
             "the five steps did not lower the loss: nothing was learned");
    for (double lr : series("lr")) QCOMPARE(lr, c.lr);

    QString norms;
    double largestNorm = 0;
    for (const QJsonValue& n : t["norms"].toArray()) {
      norms += QString::number(n.toDouble(), 'f', 4) + " ";
      largestNorm = std::max(largestNorm, n.toDouble());
    }
    qInfo("gradient norms before clipping: %s", qPrintable(norms));
    if (c.clips) QVERIFY2(largestNorm > c.clip, "no step was clipped: the clip is not exercised");

    // The second series: accuracy over the tokens so far (a correct prediction may turn on a float's last
    // bit, so two tokens may differ), or the mean squared error.
    const std::vector<double> gnSecond = series(text ? "train_acc" : "train_mse");
    QCOMPARE(static_cast<int64_t>(gnSecond.size()), kBatches);
    for (int64_t k = 0; k < kBatches; ++k) {
      if (text) {
        const double tokens = std::abs(gnSecond[k] - torchSecondCum[k]) * values[k];
        QVERIFY2(tokens <= 2.5, qPrintable(QString("accuracy after batch %1: gpunodes %2, torch %3")
                                               .arg(k + 1)
                                               .arg(gnSecond[k])
                                               .arg(torchSecondCum[k])));
      } else {
        const QString bad = within("train_mse", gnSecond[k], torchSecondCum[k], kLossTol);
        QVERIFY2(bad.isEmpty(), qPrintable(bad));
      }
    }
    if (text) {  // d2l's training perplexity, exp of the mean per-token loss so far
      const std::vector<double> ppl = series("perplexity");
      QCOMPARE(static_cast<int64_t>(ppl.size()), kBatches);
      for (int64_t k = 0; k < kBatches; ++k) {
        const QString bad = within("training perplexity", ppl[k], std::exp(torchCum[k]), kLossTol);
        QVERIFY2(bad.isEmpty(), qPrintable(bad));
      }
      const QString bad =
          within("the Train node's perplexity", reported["train"].toObject()["perplexity"].toDouble(),
                 std::exp(torchCum.back()), kLossTol);
      QVERIFY2(bad.isEmpty(), qPrintable(bad));
    }

    // The trained weights.
    const QString diff = interop::compare(interop::read_floats(path(tag + ".gn_final.f32")),
                                          interop::read_floats(path(tag + ".torch_final.f32")));
    QVERIFY2(diff.isEmpty(), qPrintable("the trained weights: " + diff));

    // The trained network measured: the Train node's evaluation after the epoch and the Evaluate nodes.
    const QJsonArray evals = t["eval"].toArray();
    const QJsonObject tTest = evals[0].toObject(), tTrain = evals[1].toObject();
    const QJsonObject trainNode = reported["train"].toObject();
    const QJsonObject evTest = reported["evtest"].toObject(), evTrain = reported["evtrain"].toObject();
    QStringList bad;
    if (text) {
      bad << within("the Train node's test perplexity", trainNode["test_perplexity"].toDouble(),
                    tTest["perplexity"].toDouble(), kLossTol)
          << within("Evaluate's test perplexity", evTest["perplexity"].toDouble(),
                    tTest["perplexity"].toDouble(), kLossTol)
          << within("Evaluate's test loss", evTest["loss"].toDouble(), tTest["loss"].toDouble(), kLossTol)
          << within("Evaluate's training perplexity", evTrain["perplexity"].toDouble(),
                    tTrain["perplexity"].toDouble(), kLossTol);
      for (const auto& [ev, te] : {std::pair{evTest, tTest}, std::pair{evTrain, tTrain}})
        if (std::abs(ev["accuracy"].toDouble() * te["values"].toDouble() - te["second"].toDouble()) > 2.5)
          bad << QString("Evaluate's accuracy %1, torch's %2")
                     .arg(ev["accuracy"].toDouble())
                     .arg(te["second"].toDouble() / te["values"].toDouble());
      qInfo("test perplexity %.6f (torch %.6f), training perplexity %.6f (torch %.6f)",
            evTest["perplexity"].toDouble(), tTest["perplexity"].toDouble(), evTrain["perplexity"].toDouble(),
            tTrain["perplexity"].toDouble());
    } else {
      const double n = tTest["values"].toDouble();
      bad << within("the Train node's test MSE", trainNode["test_mse"].toDouble(),
                    tTest["second"].toDouble() / n, kLossTol)
          << within("Evaluate's test MSE", evTest["mse"].toDouble(), tTest["second"].toDouble() / n, kLossTol)
          << within("Evaluate's test MAE", evTest["mae"].toDouble(), tTest["abs_sum"].toDouble() / n,
                    kLossTol)
          << within("Evaluate's training MSE", evTrain["mse"].toDouble(),
                    tTrain["second"].toDouble() / tTrain["values"].toDouble(), kLossTol);
      // Every prediction of the test split, in its order.
      std::vector<float> predicted;
      for (const QJsonValue& v : evTest["predictions"].toObject()["predicted"].toArray())
        predicted.push_back(static_cast<float>(v.toDouble()));
      std::vector<float> torchPredicted;
      for (const QJsonValue& v : tTest["predictions"].toArray())
        torchPredicted.push_back(float(v.toDouble()));
      const QString d = interop::compare(predicted, torchPredicted);
      if (!d.isEmpty()) bad << "Evaluate's test predictions: " + d;
      qInfo("test MSE %.6f (torch %.6f), MAE %.6f (torch %.6f)", evTest["mse"].toDouble(),
            tTest["second"].toDouble() / n, evTest["mae"].toDouble(), tTest["abs_sum"].toDouble() / n);
    }
    bad.removeAll(QString());
    QVERIFY2(bad.isEmpty(), qPrintable(bad.join('\n')));
  }

  // The losses themselves, on the runtime's ops, against torch's in float64.
  void losses_match_torch() {
    struct Case {
      QString name;
      QString kind;
      Shape pred;
      double delta = 1, smoothing = 0;
      int64_t ignore = -1;  // cross_entropy: the padding label (every third label is made padding)
    };
    const std::vector<Case> cases{
        {"cross_entropy [4, 7, 9]", "cross_entropy", {4, 7, 9}},
        {"cross_entropy [4, 7, 9] smoothed", "cross_entropy", {4, 7, 9}, 1, 0.15},
        {"cross_entropy [4, 7, 9] padded with 1", "cross_entropy", {4, 7, 9}, 1, 0, 1},
        {"cross_entropy [4, 7, 9] padded with 1, smoothed", "cross_entropy", {4, 7, 9}, 1, 0.1, 1},
        {"cross_entropy [6, 5]", "cross_entropy", {6, 5}},
        {"mse [12, 1]", "mse", {12, 1}},
        {"mse [4, 6]", "mse", {4, 6}},
        {"l1 [12, 1]", "l1", {12, 1}},
        {"l1 [3, 5, 2]", "l1", {3, 5, 2}},
        {"huber 0.5 [12, 1]", "huber", {12, 1}, 0.5},
        {"huber 1 [4, 6]", "huber", {4, 6}, 1.0},
        {"huber 2.5 [3, 5, 2]", "huber", {3, 5, 2}, 2.5},
    };
    std::mt19937 g(21);
    std::uniform_real_distribution<float> value(-3, 3);
    QJsonArray jobs;
    std::vector<std::vector<float>> preds, targets;
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      int64_t n = 1;
      for (int64_t d : c.pred) n *= d;
      std::vector<float> pred(static_cast<size_t>(n)), target;
      for (float& v : pred) v = value(g);
      if (c.kind == "cross_entropy") {
        std::uniform_int_distribution<int> label(0, static_cast<int>(c.pred.back()) - 1);
        target.resize(static_cast<size_t>(n / c.pred.back()));
        for (float& v : target) v = static_cast<float>(label(g));
        if (c.ignore >= 0)
          for (size_t j = 0; j < target.size(); j += 3) target[j] = static_cast<float>(c.ignore);
      } else {
        target.resize(pred.size());
        for (float& v : target) v = value(g);
      }
      const QString base = path(QString("loss%1").arg(i));
      writeRaw(base + ".pred.f32", pred);
      writeRaw(base + ".target.f32", target);
      jobs.append(QJsonObject{{"kind", c.kind},
                              {"pred", base + ".pred.f32"},
                              {"target", base + ".target.f32"},
                              {"shape", shapeJson(c.pred)},
                              {"classes", static_cast<double>(c.pred.back())},
                              {"huber_delta", c.delta},
                              {"label_smoothing", c.smoothing},
                              {"ignore_index", static_cast<double>(c.ignore)},
                              {"out", base + ".f64"}});
      preds.push_back(std::move(pred));
      targets.push_back(std::move(target));
    }
    const QString jobFile = path("losses.json");
    QVERIFY(writeJson(jobFile, QJsonObject{{"losses", jobs}}));
    const Process p = interop::run(GN_PYTHON, {GN_TORCH_SEQUENCE_PEER, jobFile});
    QVERIFY2(p.exitCode == 0, qPrintable("the torch peer failed: " + p.err));

    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      const Tensor pred = from_values(rt_, c.pred, device_, preds[i]);
      Tensor loss, stats, grad;
      int64_t values = static_cast<int64_t>(preds[i].size());
      if (c.kind == "cross_entropy") {
        Shape labels(c.pred.begin(), c.pred.end() - 1);
        values /= c.pred.back();
        if (c.ignore >= 0)
          values -= std::count(targets[i].begin(), targets[i].end(), static_cast<float>(c.ignore));
        const nn::CrossEntropy ce = nn::softmax_cross_entropy(pred, from_values(rt_, labels, device_, targets[i]),
                                                              true, 0, static_cast<float>(c.smoothing), c.ignore);
        loss = ce.loss, stats = ce.stats, grad = ce.dlogits;
      } else {
        const nn::RegressionLoss kind = c.kind == "mse"  ? nn::RegressionLoss::Mse
                                        : c.kind == "l1" ? nn::RegressionLoss::L1
                                                         : nn::RegressionLoss::Huber;
        Shape target = c.pred;
        if (target.size() == 2 && target[1] == 1) target = {target[0]};  // [N, 1] outputs against [N] targets
        const nn::RegressionLossResult r = nn::regression_loss(
            kind, pred, from_values(rt_, target, device_, targets[i]), true, 0, static_cast<float>(c.delta));
        loss = r.loss, stats = r.stats, grad = r.dpred;
      }
      const std::vector<double> want = readRaw<double>(path(QString("loss%1.f64").arg(i)));
      QCOMPARE(want.size(), 3 + preds[i].size());
      const double gotLoss = to_host(loss)[0];
      const std::vector<float> s = to_host(stats), d = to_host(grad);
      QCOMPARE(d.size(), preds[i].size());
      double worstGrad = 0, largestGrad = 0;
      for (size_t j = 0; j < d.size(); ++j) {
        worstGrad = std::max(worstGrad, std::abs(double(d[j]) - want[3 + j]));
        largestGrad = std::max(largestGrad, std::abs(want[3 + j]));
      }
      qInfo("%s: loss %.8f, torch %.8f; largest gradient difference %.3g of %.3g", qPrintable(c.name),
            gotLoss, want[0], worstGrad, largestGrad);
      QStringList bad{within("the mean", gotLoss, want[0], kDirectTol),
                      within("the sum of the losses", s[0], want[1], kDirectTol)};
      if (c.kind == "cross_entropy") {
        if (s[1] != want[2]) bad << QString("correct predictions: %1, torch %2").arg(s[1]).arg(want[2]);
        // d2l's perplexity: exp(sum of l * numel / sum of numel) over the batch, from the trainer's totals.
        bad << within("the perplexity", std::exp(double(s[0]) / double(values)), std::exp(want[0]),
                      kDirectTol);
      } else {
        bad << within("the squared errors' sum", s[1], want[2], kDirectTol);
      }
      if (!(worstGrad <= kDirectTol * largestGrad))
        bad << QString("the gradient differs by %1 (tolerance %2)")
                   .arg(worstGrad)
                   .arg(kDirectTol * largestGrad);
      bad.removeAll(QString());
      QVERIFY2(bad.isEmpty(), qPrintable(c.name + ": " + bad.join("; ")));
    }
  }
};

QTEST_GUILESS_MAIN(TorchSequencesTest)
#include "test_torch_sequences.moc"
