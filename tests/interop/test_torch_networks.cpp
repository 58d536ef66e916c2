// Networks drawn from layer nodes, between gpunodes and PyTorch, end to end through the real binary: for each
// graph (the LeNet and ResNet-18 examples, a graph that uses every image layer type and branch, and sequence
// models with every sequence layer: Embedding and OneHot of token ids, RNN, GRU and LSTM, Reshape, Transpose,
// LastStep, Linear on each step), gpunodes builds the Network, saves it as safetensors (in torch's
// state_dict order) and runs Forward on a batch (token ids for the language models); torch builds the same
// network from the graph file (tests/interop/torch_peer.py), loads the file with load_state_dict(strict=True)
// and must give the same outputs. And back: torch's own weights load into the graph's Network through
// LoadParams and give torch's outputs. The suite skips where /usr/bin/python3 cannot import torch (the
// scripts install it).
#include <QTemporaryDir>
#include <QtTest>
#include <cstring>
#include <fstream>
#include <random>

#include "interop_util.h"

namespace {

constexpr int kBatch = 3;

using interop::graphOf;
using interop::node;
using interop::Process;
using interop::readJson;
using interop::run;
using interop::wire;
using interop::writeJson;

// A graph that uses every layer type: two branches concatenated, a strided projection added back, grouped
// and bias-free convolutions, both batch norms, every activation, both pools, and dropout (the identity in
// evaluation, as Forward runs).
QJsonObject everyLayerGraph() {
  QJsonArray nodes{
      node("x", "Input", {{"shape", QJsonArray{3, 12, 12}}}),
      node("c1", "Conv2d", {{"out_channels", 8}, {"kernel_size", 3}, {"padding", 1}}),
      node("bn", "BatchNorm2d"),
      node("gelu", "GELU"),
      node("dw", "Conv2d",
           {{"out_channels", 8}, {"kernel_size", 3}, {"padding", 1}, {"groups", 4}, {"bias", false}}),
      node("tanh", "Tanh"),
      node("mp", "MaxPool2d", {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}),
      node("ap", "AvgPool2d", {{"kernel_size", 2}}),
      node("sig", "Sigmoid"),
      node("cat", "Concat"),
      node("proj", "Conv2d", {{"out_channels", 16}, {"kernel_size", 1}, {"stride", 2}}),
      node("sum", "Add"),
      node("relu", "ReLU"),
      node("gap", "GlobalAvgPool2d"),
      node("flat", "Flatten"),
      node("fc1", "Linear", {{"out_features", 32}}),
      node("bn1", "BatchNorm1d", {{"eps", 1e-3}, {"momentum", 0.2}}),
      node("drop", "Dropout", {{"p", 0.3}}),
      node("fc2", "Linear", {{"out_features", 5}, {"bias", false}}),
      node("net", "Network", {{"init", "kaiming"}, {"seed", 3}}),
  };
  QJsonArray wires{wire("x.out", "c1.in"),     wire("c1.out", "bn.in"),    wire("bn.out", "gelu.in"),
                   wire("gelu.out", "dw.in"),  wire("dw.out", "tanh.in"),  wire("tanh.out", "mp.in"),
                   wire("c1.out", "ap.in"),    wire("ap.out", "sig.in"),   wire("mp.out", "cat.a"),
                   wire("sig.out", "cat.b"),   wire("c1.out", "proj.in"),  wire("cat.out", "sum.a"),
                   wire("proj.out", "sum.b"),  wire("sum.out", "relu.in"), wire("relu.out", "gap.in"),
                   wire("gap.out", "flat.in"), wire("flat.out", "fc1.in"), wire("fc1.out", "bn1.in"),
                   wire("bn1.out", "drop.in"), wire("drop.out", "fc2.in"), wire("fc2.out", "net.out")};
  return graphOf(nodes, wires);
}

// A language model's shape, [T] token ids -> [T, vocab]: an Embedding read by a stacked bidirectional LSTM
// (dropout between its layers, the identity in evaluation) and a Linear on every step.
QJsonObject embeddingLstmGraph() {
  return graphOf({node("x", "Input", {{"shape", QJsonArray{12}}}),
                  node("emb", "Embedding", {{"num_embeddings", 20}, {"embedding_dim", 8}}),
                  node("lstm", "LSTM",
                       {{"hidden_size", 6}, {"num_layers", 2}, {"bidirectional", true}, {"dropout", 0.2}}),
                  node("fc", "Linear", {{"out_features", 20}}), node("net", "Network", {{"seed", 4}})},
                 {wire("x.out", "emb.in"), wire("emb.out", "lstm.in"), wire("lstm.out", "fc.in"),
                  wire("fc.out", "net.out")});
}

// d2l's RNN language model input (one-hot rows) into a GRU without biases, classified from its last step.
QJsonObject oneHotGruGraph() {
  return graphOf(
      {node("x", "Input", {{"shape", QJsonArray{12}}}), node("oh", "OneHot", {{"num_classes", 15}}),
       node("gru", "GRU", {{"hidden_size", 7}, {"bias", false}}), node("last", "LastStep"),
       node("fc", "Linear", {{"out_features", 4}}), node("net", "Network", {{"seed", 5}})},
      {wire("x.out", "oh.in"), wire("oh.out", "gru.in"), wire("gru.out", "last.in"),
       wire("last.out", "fc.in"), wire("fc.out", "net.out")});
}

// d2l's "rows as steps": a 28x28 image read as 28 steps of 28 features by a two-layer ReLU RNN.
QJsonObject rowsAsStepsGraph() {
  return graphOf({node("x", "Input", {{"shape", QJsonArray{1, 28, 28}}}),
                  node("rows", "Reshape", {{"shape", QJsonArray{28, 28}}}),
                  node("rnn", "RNN", {{"hidden_size", 16}, {"num_layers", 2}, {"nonlinearity", "relu"}}),
                  node("last", "LastStep"), node("fc", "Linear", {{"out_features", 10}}),
                  node("net", "Network", {{"seed", 6}})},
                 {wire("x.out", "rows.in"), wire("rows.out", "rnn.in"), wire("rnn.out", "last.in"),
                  wire("last.out", "fc.in"), wire("fc.out", "net.out")});
}

// Transposes in a branch: [6, 4] steps transposed to [4, 6], a Linear that mixes the steps, transposed back
// (axes counted from the end) and added to the input; a bidirectional tanh RNN beside a GRU, the two joined
// along the steps (Concat: [12, 6]), flattened by a Reshape with -1, and classified.
QJsonObject transposeBranchGraph() {
  return graphOf(
      {node("x", "Input", {{"shape", QJsonArray{6, 4}}}), node("t1", "Transpose", {{"dim0", 0}, {"dim1", 1}}),
       node("mix", "Linear", {{"out_features", 6}}), node("tanh", "Tanh"),
       node("t2", "Transpose", {{"dim0", -1}, {"dim1", -2}}), node("sum", "Add"),
       node("rnn", "RNN", {{"hidden_size", 3}, {"bidirectional", true}}),
       node("gru", "GRU", {{"hidden_size", 6}, {"num_layers", 2}}), node("cat", "Concat"),
       node("flat", "Reshape", {{"shape", QJsonArray{-1}}}), node("drop", "Dropout", {{"p", 0.25}}),
       node("fc", "Linear", {{"out_features", 5}, {"bias", false}}), node("net", "Network", {{"seed", 7}})},
      {wire("x.out", "t1.in"), wire("t1.out", "mix.in"), wire("mix.out", "tanh.in"),
       wire("tanh.out", "t2.in"), wire("t2.out", "sum.a"), wire("x.out", "sum.b"), wire("sum.out", "rnn.in"),
       wire("x.out", "gru.in"), wire("rnn.out", "cat.a"), wire("gru.out", "cat.b"),
       wire("cat.out", "flat.in"), wire("flat.out", "drop.in"), wire("drop.out", "fc.in"),
       wire("fc.out", "net.out")});
}

// The graph's layer nodes and its Network "net" (everything else dropped), plus a batch of `values` as a
// Tensor, the model from `modelFrom` ("net.model", or a LoadParams of torch's file), Forward and Inspect.
QJsonObject runGraph(const QJsonObject& graph, const QJsonArray& sampleShape, const std::vector<float>& x,
                     const QString& saveTo, const QString& loadFrom) {
  static const QStringList kept{
      "Input",  "Conv2d",    "BatchNorm2d",     "BatchNorm1d", "ReLU",   "Sigmoid", "Tanh",
      "GELU",   "MaxPool2d", "AvgPool2d",       "Flatten",     "Linear", "Dropout", "Add",
      "Concat", "Network",   "GlobalAvgPool2d", "Embedding",   "OneHot", "RNN",     "GRU",
      "LSTM",   "Reshape",   "Transpose",       "LastStep"};
  QJsonArray nodes, wires;
  QSet<QString> ids;
  for (const QJsonValue& v : graph["nodes"].toArray()) {
    const QJsonObject n = v.toObject();
    if (kept.contains(n["type"].toString())) nodes.append(n), ids.insert(n["id"].toString());
  }
  for (const QJsonValue& v : graph["connections"].toArray()) {
    const QJsonObject c = v.toObject();
    if (ids.contains(c["from"].toString().section('.', 0, 0)) &&
        ids.contains(c["to"].toString().section('.', 0, 0)))
      wires.append(c);
  }
  QStringList text;
  for (float v : x) text.append(QString::number(v, 'g', 9));
  QJsonArray shape{kBatch};
  for (const QJsonValue& d : sampleShape) shape.append(d);
  nodes.append(node("cpu", "Device", {{"kind", "cpu"}}));
  nodes.append(node("images", "Tensor", {{"shape", shape}, {"init", "values"}, {"values", text.join(' ')}}));
  nodes.append(node("fwd", "Forward"));
  nodes.append(node("logits", "Inspect"));
  wires.append(wire("cpu.device", "images.device"));
  wires.append(wire("images.out", "fwd.in"));
  wires.append(wire("fwd.out", "logits.in"));
  interop::wireWeights(nodes, wires, saveTo, loadFrom);
  return graphOf(nodes, wires);
}

}  // namespace

class TorchNetworksTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;

  // gpunodes' run of `graph` on x: the logits Inspect read.
  std::vector<float> gpunodesLogits(const QString& name, const QJsonObject& graph, const QJsonArray& sample,
                                    const std::vector<float>& x, const QString& saveTo,
                                    const QString& loadFrom) {
    const QString file = dir_.filePath(name), report = dir_.filePath(name + ".report.json");
    if (!writeJson(file, runGraph(graph, sample, x, saveTo, loadFrom))) return {};
    const Process p = run(GN_GPUNODES, {"run", file, "--quiet", "--report", report});
    if (p.exitCode != 0)
      qWarning("gpunodes run %s: exit %d\n%s", qPrintable(name), p.exitCode, qPrintable(p.err));
    return interop::inspected(readJson(report), "logits");
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    if (const QString why = interop::torchMissing(GN_PYTHON); !why.isEmpty()) QSKIP(qPrintable(why));
  }

  void drawn_networks_round_trip_through_torch_data() {
    QTest::addColumn<QString>("name");
    QTest::addColumn<QJsonObject>("graph");
    QTest::addColumn<QJsonArray>("sample");
    QTest::addColumn<int>("vocab");  // > 0: the inputs are token ids, integers in [0, vocab); 0: U(-1, 1)
    QJsonObject lenet = readJson(GN_EXAMPLES_DIR "/lenet-layers.json");
    QJsonObject resnet = readJson(GN_EXAMPLES_DIR "/resnet18-layers.json");
    QTest::newRow("lenet-layers") << "lenet-layers" << lenet << QJsonArray{1, 28, 28} << 0;
    QTest::newRow("resnet18-layers") << "resnet18-layers" << resnet << QJsonArray{1, 28, 28} << 0;
    QTest::newRow("every-layer") << "every-layer" << everyLayerGraph() << QJsonArray{3, 12, 12} << 0;
    QTest::newRow("embedding-lstm") << "embedding-lstm" << embeddingLstmGraph() << QJsonArray{12} << 20;
    QTest::newRow("onehot-gru") << "onehot-gru" << oneHotGruGraph() << QJsonArray{12} << 15;
    QTest::newRow("rows-as-steps") << "rows-as-steps" << rowsAsStepsGraph() << QJsonArray{1, 28, 28} << 0;
    QTest::newRow("transpose-branch")
        << "transpose-branch" << transposeBranchGraph() << QJsonArray{6, 4} << 0;
  }
  void drawn_networks_round_trip_through_torch() {
    QFETCH(QString, name);
    QFETCH(QJsonObject, graph);
    QFETCH(QJsonArray, sample);
    QFETCH(int, vocab);
    QVERIFY2(!graph.isEmpty(), "the example did not load");
    // The graph file torch builds from: the test's copy, with the Network's init made Kaiming so that the
    // outputs are far from zero.
    QJsonArray nodes = graph["nodes"].toArray();
    for (qsizetype i = 0; i < nodes.size(); ++i)
      if (nodes[i].toObject()["type"].toString() == "Network") {
        QJsonObject n = nodes[i].toObject(), p = n["params"].toObject();
        p["init"] = "kaiming";
        n["params"] = p;
        nodes[i] = n;
      }
    graph["nodes"] = nodes;
    const QString graphFile = dir_.filePath(name + ".graph.json");
    QVERIFY(writeJson(graphFile, graph));

    std::mt19937 gen(7);
    std::uniform_real_distribution<float> dist(-1, 1);
    std::uniform_int_distribution<int> ids(0, std::max(vocab, 1) - 1);
    int64_t numel = kBatch;
    for (const QJsonValue& d : sample) numel *= d.toInteger();
    std::vector<float> x(static_cast<size_t>(numel));
    for (float& v : x) v = vocab > 0 ? static_cast<float>(ids(gen)) : dist(gen);
    if (vocab > 0) {  // every id, the largest included, and a repeated one (the embedding's rows are shared)
      x[0] = static_cast<float>(vocab - 1);
      x[1] = x[2] = 0;
    }
    const QString xFile = dir_.filePath(name + ".x.f32");
    {
      std::ofstream out(xFile.toStdString(), std::ios::binary);
      out.write(reinterpret_cast<const char*>(x.data()), std::streamsize(x.size() * sizeof(float)));
    }

    // gpunodes -> torch
    const QString gnWeights = dir_.filePath(name + ".gn.safetensors");
    const std::vector<float> gn = gpunodesLogits(name + ".save.json", graph, sample, x, gnWeights, {});
    QVERIFY2(!gn.empty(), "gpunodes gave no logits");
    const QString spec = graphFile + "#net", torchOfGn = dir_.filePath(name + ".torch-of-gn.f32");
    Process p =
        run(GN_PYTHON, {GN_TORCH_PEER, "logits", spec, gnWeights, xFile, QString::number(kBatch), torchOfGn});
    QVERIFY2(p.exitCode == 0, qPrintable("torch could not load gpunodes' weights: " + p.err));
    // gpunodes writes its state in torch's state_dict order (the header's order, which json keeps).
    const QJsonObject loadedBy = QJsonDocument::fromJson(p.out.trimmed().toUtf8()).object();
    QVERIFY2(!loadedBy["keys"].toArray().isEmpty(), qPrintable("the peer said: " + p.out));
    QCOMPARE(loadedBy["file_keys"].toArray(), loadedBy["keys"].toArray());
    QString diff = interop::compare(interop::read_floats(torchOfGn), gn);
    QVERIFY2(diff.isEmpty(), qPrintable("torch on gpunodes' weights: " + diff));

    // torch -> gpunodes
    const QString torchWeights = dir_.filePath(name + ".torch.safetensors");
    const QString torchOfTorch = dir_.filePath(name + ".torch-of-torch.f32");
    p = run(GN_PYTHON, {GN_TORCH_PEER, "save", spec, "5", torchWeights});
    QVERIFY2(p.exitCode == 0, qPrintable("torch could not save: " + p.err));
    p = run(GN_PYTHON,
            {GN_TORCH_PEER, "logits", spec, torchWeights, xFile, QString::number(kBatch), torchOfTorch});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    const std::vector<float> loaded = gpunodesLogits(name + ".load.json", graph, sample, x, {}, torchWeights);
    diff = interop::compare(loaded, interop::read_floats(torchOfTorch));
    QVERIFY2(diff.isEmpty(), qPrintable("gpunodes on torch's weights: " + diff));
  }
};

QTEST_GUILESS_MAIN(TorchNetworksTest)
#include "test_torch_networks.moc"
