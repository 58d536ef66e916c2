// ONNX export, end to end through the real binary: for each network (LeNet and ResNet-18 from the examples,
// the MLP drawn from layers, a network with every layer type import also knows, with branches, networks of
// the sequence, recurrent and attention layers, and the examples that have them), gpunodes draws the weights,
// the test moves every BatchNorm's statistics, scale and shift away from their defaults (so that a statistic
// read as another fails), gpunodes runs Forward on a batch with those weights (LoadParams), and `gpunodes
// export-onnx --params` writes the model (onnx_export_util.h). Then:
//   - the ONNX checker (onnx_peer.py check, Debian's python3-onnx under /usr/bin/python3, full_check) passes,
//     and the file says opset 17, IR version 8, producer gpunodes, a dynamic batch axis on the input and the
//     output, the graph's name and description, and has one initializer per parameter under its safetensors
//     name;
//   - onnxruntime (from PyPI, installed into the build tree's onnx-venv by the onnx_venv fixture: see
//     CMakeLists.txt) gives gpunodes' logits to 1e-4 of their largest magnitude (interop::compare);
// test_onnx_roundtrip reads such files back through `gpunodes import-onnx`. Valid lengths are written as the
// key padding mask and checked on padded ids.
// And: an ExportONNX node in a graph run with `gpunodes run` writes a valid file; neither the command nor the
// node replaces a file that is not gpunodes' own; a built-in Model architecture and a missing node are
// refused with one error line, and nothing is written on failure. A missing onnxruntime is a failure here,
// not a skip: the fixture installs it.
#include <QDir>
#include <QElapsedTimer>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>

#include "interop_util.h"
#include "onnx_export_util.h"
#include "onnx_networks.h"

namespace {

using interop::graphOf;
using interop::node;
using interop::nonEmptyLines;
using interop::Process;
using interop::readJson;
using interop::run;
using interop::wire;
using interop::writeJson;
using onnx_export::attentionGraph;
using onnx_export::forwardGraph;
using onnx_export::kBatch;
using onnx_export::logitsOf;
using onnx_export::mlpGraph;
using onnx_export::networkOf;
using onnx_export::perturbBatchNorms;
using onnx_export::readSafetensors;
using onnx_export::recurrentGraph;
using onnx_export::runGraphFile;
using onnx_export::Safetensors;
using onnx_export::sequenceGraph;
using onnx_export::valuesText;

}  // namespace

class OnnxExportTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;

  // onnxruntime's outputs on the batch in xFile; empty with a warning when it fails.
  std::vector<float> ortLogits(const QString& model, const QString& xFile, int batch) {
    const QString out = model + ".ort.f32";
    const Process p = run(GN_ORT_PYTHON, {GN_ONNX_PEER, "ort", model, xFile, QString::number(batch), out});
    if (p.exitCode != 0) {
      qWarning("onnxruntime on %s: exit %d\n%s", qPrintable(model), p.exitCode, qPrintable(p.err));
      return {};
    }
    return interop::read_floats(out);
  }

  QJsonObject check(const QString& model, QString* err) {
    const Process p = run(GN_PYTHON, {GN_ONNX_PEER, "check", model});
    if (p.exitCode != 0) {
      *err =
          QStringLiteral("the ONNX checker refused %1 (exit %2): %3").arg(model).arg(p.exitCode).arg(p.err);
      return {};
    }
    return QJsonDocument::fromJson(p.out.trimmed().toUtf8()).object();
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    const Process onnx = run(GN_PYTHON, {"-c", "import onnx"});
    QVERIFY2(onnx.exitCode == 0, qPrintable("/usr/bin/python3 cannot import onnx (scripts/deps.sh installs "
                                            "python3-onnx): " +
                                            onnx.err));
    const Process ort = run(GN_ORT_PYTHON, {"-c", "import onnxruntime, numpy"});
    QVERIFY2(ort.exitCode == 0,
             qPrintable(QStringLiteral("%1 cannot import onnxruntime: the onnx_venv fixture "
                                       "installs it from PyPI (ctest runs it first): %2")
                            .arg(GN_ORT_PYTHON, ort.err)));
  }

  void export_runs_in_onnxruntime_data() {
    QTest::addColumn<QString>("name");
    QTest::addColumn<QJsonObject>("graph");
    QTest::addColumn<QJsonArray>("sample");
    QTest::addColumn<int>("vocab");  // > 0: the inputs are token ids in [0, vocab); 0: U(-1, 1)
    QTest::newRow("lenet") << "lenet" << readJson(GN_EXAMPLES_DIR "/lenet-layers.json")
                           << QJsonArray{1, 28, 28} << 0;
    QTest::newRow("mlp") << "mlp" << mlpGraph() << QJsonArray{1, 28, 28} << 0;
    QTest::newRow("resnet18") << "resnet18" << readJson(GN_EXAMPLES_DIR "/resnet18-layers.json")
                              << QJsonArray{1, 28, 28} << 0;
    QTest::newRow("every-layer") << "every-layer" << onnx_networks::everyLayerGraph(17) << QJsonArray{3, 12, 12} << 0;
    QTest::newRow("sequence") << "sequence" << sequenceGraph() << QJsonArray{6, 6} << 0;
    QTest::newRow("recurrent") << "recurrent" << recurrentGraph() << QJsonArray{7} << 11;
    QTest::newRow("attention") << "attention" << attentionGraph() << QJsonArray{6, 8} << 0;
    // The examples with sequence and attention layers (transformer blocks inside subgraphs).
    auto example = [](const char* name) {
      return readJson(QStringLiteral(GN_EXAMPLES_DIR "/%1.json").arg(name));
    };
    QTest::newRow("lstm-rows") << "lstm-rows" << example("lstm-fashion-mnist-rows") << QJsonArray{1, 28, 28}
                               << 0;
    QTest::newRow("gru-lm") << "gru-lm" << example("rnn-language-model") << QJsonArray{35} << 28;
    QTest::newRow("transformer-lm") << "transformer-lm" << example("transformer-language-model")
                                    << QJsonArray{35} << 28;
    QTest::newRow("vit") << "vit" << example("vit-fashion-mnist") << QJsonArray{1, 28, 28} << 0;
    QTest::newRow("attention-pooling")
        << "attention-pooling" << example("attention-pooling") << QJsonArray{50, 3} << 0;
  }
  void export_runs_in_onnxruntime() {
    QFETCH(QString, name);
    QFETCH(QJsonObject, graph);
    QFETCH(QJsonArray, sample);
    QFETCH(int, vocab);
    QVERIFY2(!graph.isEmpty(), "the example did not load");
    QElapsedTimer clock;
    clock.start();
    const onnx_export::Exported e = onnx_export::drawAndExport(dir_.filePath(name), name, graph, sample, vocab);
    QVERIFY2(e.error.isEmpty(), qPrintable(e.error));
    graph = e.graph;
    const QString &model = e.model, &signature = e.signature, &weights = e.weights;
    const std::vector<float>& logits = e.logits;
    const int moved = e.moved;

    // The checker, and what the file says.
    QString err;
    const QJsonObject facts = check(model, &err);
    QVERIFY2(!facts.isEmpty(), qPrintable(err));
    QCOMPARE(facts["ir_version"].toInt(), 8);
    QCOMPARE(facts["opset"].toObject()[""].toInt(), 17);
    QCOMPARE(facts["producer"].toString(), QString("gpunodes"));
    QCOMPARE(facts["graph_name"].toString(), graph["name"].toString());
    QCOMPARE(facts["doc"].toString(), graph["description"].toString());
    QCOMPARE(facts["metadata"].toObject()["name"].toString(), graph["name"].toString());
    QCOMPARE(facts["metadata"].toObject()["description"].toString(), graph["description"].toString());
    QCOMPARE(facts["metadata"].toObject()["gpunodes.signature"].toString(), signature);
    const QJsonObject inputs = facts["inputs"].toObject(), outputs = facts["outputs"].toObject();
    QCOMPARE(inputs.size(), 1);
    QCOMPARE(outputs.size(), 1);
    QJsonArray wantIn{"batch"};
    for (const QJsonValue& d : sample) wantIn.append(d);
    QCOMPARE(inputs.begin().value().toArray(), wantIn);
    QCOMPARE(outputs.begin().value().toArray().at(0).toString(), QString("batch"));
    const Safetensors st = readSafetensors(weights);
    QVERIFY(st.ok);
    QStringList inits;
    for (const QJsonValue& v : facts["initializers"].toArray()) inits.append(v.toString());
    inits.sort();
    QCOMPARE(inits, st.names());
    qInfo("%s: %d ops, %lld initializers, %d BatchNorms moved", qPrintable(name),
          int(facts["ops"].toArray().size()), qlonglong(inits.size()), moved);

    // onnxruntime, at the batch gpunodes ran and at another (the batch axis is dynamic).
    std::vector<float> ort = ortLogits(model, e.xFile, kBatch);
    QVERIFY2(!ort.empty(), "onnxruntime gave no outputs");
    const size_t perSample = ort.size() / kBatch;
    // Inspect reports the first 1000 values of a batch.
    if (logits.size() == 1000 && ort.size() > 1000) ort.resize(1000);
    double worst = 0;
    for (size_t i = 0; i < std::min(ort.size(), logits.size()); ++i)
      worst = std::max(worst, std::abs(double(ort[i]) - double(logits[i])));
    qInfo("%s: onnxruntime against gpunodes: max abs difference %.3g", qPrintable(name), worst);
    QString diff = interop::compare(ort, logits);
    QVERIFY2(diff.isEmpty(), qPrintable(name + ": onnxruntime against gpunodes: " + diff));
    const QString x1 = dir_.filePath(name) + "/x1.f32";
    interop::write_floats(x1, std::vector<float>(e.x.begin(), e.x.begin() + qsizetype(e.x.size() / kBatch)));
    const std::vector<float> one = ortLogits(model, x1, 1);
    QCOMPARE(one.size(), perSample);
    const size_t firstValues = std::min(perSample, logits.size());
    diff = interop::compare(std::vector<float>(one.begin(), one.begin() + qsizetype(firstValues)),
                            std::vector<float>(logits.begin(), logits.begin() + qsizetype(firstValues)));
    QVERIFY2(diff.isEmpty(), qPrintable(name + ": onnxruntime on a batch of one: " + diff));

    qInfo("%s: %lld ms", qPrintable(name), qlonglong(clock.elapsed()));
  }

  // A graph that trains nothing but builds a network and exports it with the ExportONNX node: the file is
  // valid, runs, and a second run replaces it (gpunodes' own file).
  void export_node_writes_a_valid_file() {
    const QString folder = dir_.filePath("node");
    QVERIFY(QDir().mkpath(folder));
    QJsonArray nodes, wires;
    networkOf(mlpGraph(), nodes, wires);
    nodes.append(node("export", "ExportONNX", {{"path", "out/mlp.onnx"}, {"name", "mlp-from-node"}}));
    wires.append(wire("net.model", "export.model"));
    QVERIFY(QDir().mkpath(folder + "/out"));
    for (int pass = 0; pass < 2; ++pass) {
      const QJsonObject report = runGraphFile(folder + "/export.json", graphOf(nodes, wires));
      QVERIFY2(!report.isEmpty(), "the graph did not run");
      const QJsonObject fields = report["nodes"].toObject()["export"].toObject();
      QCOMPARE(fields["path"].toString(), QFileInfo(folder + "/out/mlp.onnx").absoluteFilePath());
      QCOMPARE(fields["opset"].toInt(), 17);
    }
    QString err;
    const QJsonObject facts = check(folder + "/out/mlp.onnx", &err);
    QVERIFY2(!facts.isEmpty(), qPrintable(err));
    QCOMPARE(facts["graph_name"].toString(), QString("mlp-from-node"));
    QCOMPARE(facts["initializers"].toArray().size(), 4);
    std::vector<float> x(2 * 784, 0.25f);
    interop::write_floats(folder + "/x.f32", x);
    QCOMPARE(ortLogits(folder + "/out/mlp.onnx", folder + "/x.f32", 2).size(), size_t(20));
  }

  // Train and export in one graph: the LeNet example trained for one epoch on 512 images, its trained model
  // into ExportONNX and into Forward; onnxruntime on the file gives the trained Forward's logits. A Model
  // node's built-in architecture on ExportONNX is refused before the run.
  void graph_trains_and_exports() {
    const QString folder = dir_.filePath("train");
    QVERIFY(QDir().mkpath(folder));
    QJsonObject graph = readJson(GN_EXAMPLES_DIR "/lenet-layers.json");
    QVERIFY(!graph.isEmpty());
    QJsonArray nodes, wires;
    for (const QJsonValue& v : graph["nodes"].toArray())
      if (v["type"].toString() != "Evaluate") nodes.append(v);
    for (const QJsonValue& v : graph["connections"].toArray())
      if (!v["to"].toString().startsWith("test.")) wires.append(v);
    std::vector<float> x(kBatch * 784);
    for (size_t k = 0; k < x.size(); ++k) x[k] = float((k * 7) % 23) / 23.0f;
    interop::write_floats(folder + "/x.f32", x);
    nodes.append(node("export", "ExportONNX", {{"path", "lenet-trained.onnx"}}));
    nodes.append(
        node("images", "Tensor",
             {{"shape", QJsonArray{kBatch, 1, 28, 28}}, {"init", "values"}, {"values", valuesText(x)}}));
    nodes.append(node("fwd", "Forward"));
    nodes.append(node("logits", "Inspect"));
    wires.append(wire("train.model", "export.model"));
    wires.append(wire("dev.device", "images.device"));
    wires.append(wire("images.out", "fwd.in"));
    wires.append(wire("export.model", "fwd.model"));
    wires.append(wire("fwd.out", "logits.in"));
    graph["nodes"] = nodes;
    graph["connections"] = wires;
    const QString file = folder + "/train.json", report = folder + "/report.json";
    QVERIFY(writeJson(file, graph));
    Process p = run(GN_GPUNODES, {"run", file, "--quiet", "--report", report, "--set", "data.limit=512",
                                  "--set", "train.epochs=1"});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    const std::vector<float> logits = logitsOf(readJson(report));
    QVERIFY(!logits.empty());
    const QString model = folder + "/lenet-trained.onnx";
    QString err;
    QVERIFY2(!check(model, &err).isEmpty(), qPrintable(err));
    const QString diff = interop::compare(ortLogits(model, folder + "/x.f32", kBatch), logits);
    QVERIFY2(diff.isEmpty(), qPrintable("onnxruntime against the trained model: " + diff));

    const QJsonObject builtin = graphOf({node("m", "Model", {{"arch", "mlp"}}), node("export", "ExportONNX")},
                                        {wire("m.model", "export.model")});
    QVERIFY(writeJson(folder + "/builtin.json", builtin));
    p = run(GN_GPUNODES, {"run", folder + "/builtin.json", "--quiet"});
    QVERIFY2(p.exitCode != 0 && p.err.contains("built-in mlp"), qPrintable(p.err));
    QVERIFY(!QFileInfo::exists(folder + "/model.onnx"));
  }

  // A file that is not gpunodes' own (an ONNX model from torch, or any file) is never replaced: not by
  // export-onnx, not by an ExportONNX node (the host's file-access rule).
  void foreign_files_are_not_replaced() {
    const QString folder = dir_.filePath("foreign");
    QVERIFY(QDir().mkpath(folder));
    const QString torchModel = folder + "/torch.onnx";
    const QByteArray foreign = QByteArray::fromHex("0808") + QByteArray::fromHex("1207") + "pytorch" + "rest";
    {
      QFile f(torchModel);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(foreign);
    }
    const QString graphFile = folder + "/graph.json";
    QVERIFY(writeJson(graphFile, mlpGraph()));
    Process p = run(GN_GPUNODES, {"export-onnx", graphFile, "--network", "net", "-o", torchModel});
    QVERIFY2(p.exitCode != 0, qPrintable(p.out));
    QCOMPARE(nonEmptyLines(p.err).size(), 1);
    QVERIFY2(p.err.contains("not a gpunodes file"), qPrintable(p.err));
    QFile f(torchModel);
    QVERIFY(f.open(QIODevice::ReadOnly));
    QCOMPARE(f.readAll(), foreign);
    f.close();

    QJsonArray nodes, wires;
    networkOf(mlpGraph(), nodes, wires);
    nodes.append(node("export", "ExportONNX", {{"path", "torch.onnx"}}));
    wires.append(wire("net.model", "export.model"));
    QVERIFY(writeJson(folder + "/node.json", graphOf(nodes, wires)));
    p = run(GN_GPUNODES, {"run", folder + "/node.json", "--quiet"});
    QVERIFY2(p.exitCode != 0, "the run replaced a foreign file");
    QVERIFY2(p.err.contains("torch.onnx"), qPrintable(p.err));
    QVERIFY(f.open(QIODevice::ReadOnly));
    QCOMPARE(f.readAll(), foreign);
    f.close();

    // export-onnx --force replaces it with a valid model, and then (gpunodes' own) without --force too;
    // a folder is refused even with --force.
    p = run(GN_GPUNODES, {"export-onnx", graphFile, "--network", "net", "-o", torchModel, "--force"});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    QString err;
    const QJsonObject facts = check(torchModel, &err);
    QVERIFY2(!facts.isEmpty(), qPrintable(err));
    QCOMPARE(facts["producer"].toString(), QString("gpunodes"));
    p = run(GN_GPUNODES, {"export-onnx", graphFile, "--network", "net", "-o", torchModel});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    QVERIFY(QDir().mkpath(folder + "/folder.onnx"));
    p = run(GN_GPUNODES,
            {"export-onnx", graphFile, "--network", "net", "-o", folder + "/folder.onnx", "--force"});
    QVERIFY2(p.exitCode != 0 && p.err.contains("is a folder"), qPrintable(p.err));
    QVERIFY(QFileInfo(folder + "/folder.onnx").isDir());

    // Import keeps the same rule for the graph and the weights it writes: a foreign file stays, --force
    // replaces it, and a graph gpunodes wrote is replaced without asking.
    const QString notes = folder + "/notes.json", notesWeights = folder + "/notes.safetensors";
    {
      QFile n(notes);
      QVERIFY(n.open(QIODevice::WriteOnly) && n.write("{\"my\": \"notes\"}") > 0);
    }
    p = run(GN_GPUNODES, {"import-onnx", torchModel, "-o", notes});
    QVERIFY2(p.exitCode == 1 && p.err.contains("not a gpunodes file") && p.err.contains("notes.json"),
             qPrintable(p.err));
    QVERIFY(!QFile::exists(notesWeights));
    {
      QFile n(notes);
      QVERIFY(n.open(QIODevice::ReadOnly));
      QCOMPARE(n.readAll(), QByteArray("{\"my\": \"notes\"}"));
    }
    p = run(GN_GPUNODES, {"import-onnx", torchModel, "-o", notes, "--force"});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    p = run(GN_GPUNODES, {"import-onnx", torchModel, "-o", notes});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
  }

  // A bypassed layer is left out, as a run leaves it out: the file has no Relu, and onnxruntime gives the
  // logits gpunodes' Forward gives with the layer bypassed.
  void bypassed_layers_are_left_out() {
    const QString folder = dir_.filePath("bypass");
    QVERIFY(QDir().mkpath(folder));
    QJsonObject graph = mlpGraph();
    QJsonArray nodes = graph["nodes"].toArray();
    for (qsizetype k = 0; k < nodes.size(); ++k)
      if (nodes[k].toObject()["id"].toString() == "relu") {
        QJsonObject n = nodes[k].toObject();
        n["bypass"] = true;
        nodes[k] = n;
      }
    graph["nodes"] = nodes;
    std::vector<float> x(kBatch * 784);
    for (size_t k = 0; k < x.size(); ++k) x[k] = float(k % 17) / 8.0f - 1.0f;
    interop::write_floats(folder + "/x.f32", x);
    const QJsonObject report =
        runGraphFile(folder + "/forward.json",
                     forwardGraph(graph, QJsonArray{1, 28, 28}, x, folder + "/w.safetensors", {}));
    const std::vector<float> logits = logitsOf(report);
    QVERIFY2(!logits.empty(), "gpunodes gave no logits");
    QVERIFY(writeJson(folder + "/graph.json", graph));
    const QString model = folder + "/mlp.onnx";
    const Process p = run(GN_GPUNODES, {"export-onnx", folder + "/graph.json", "--network", "net", "--params",
                                        folder + "/w.safetensors", "-o", model});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    QString err;
    const QJsonObject facts = check(model, &err);
    QVERIFY2(!facts.isEmpty(), qPrintable(err));
    QVERIFY2(!facts["ops"].toArray().contains(QJsonValue("Relu")), "the bypassed ReLU was written");
    const QString diff = interop::compare(ortLogits(model, folder + "/x.f32", kBatch), logits);
    QVERIFY2(diff.isEmpty(), qPrintable(diff));
  }

  // Valid lengths as the key padding mask (onnx_export::validLengthGraph): the lengths are 3, 0 (all padding:
  // all-zero weights, each step out_proj's bias, no NaN) and 6, more than the cross-attention's 4 keys
  // (nothing masked). onnxruntime gives gpunodes' logits (test_onnx_roundtrip reads the file back).
  void valid_lengths_export_as_a_key_padding_mask() {
    const QString folder = dir_.filePath("valid-lens");
    QVERIFY(QDir().mkpath(folder));
    const QJsonObject g = onnx_export::validLengthGraph();
    const std::vector<float> x{3, 4, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 3, 4, 5, 6, 7};
    const QString xFile = folder + "/x.f32", weights = folder + "/weights.safetensors";
    interop::write_floats(xFile, x);
    QVERIFY(!runGraphFile(folder + "/save.json", forwardGraph(g, QJsonArray{6}, x, weights, {})).isEmpty());
    int moved = 0;
    QVERIFY(perturbBatchNorms(weights, &moved));  // the biases off zero: the empty sample's output is theirs
    const std::vector<float> logits =
        logitsOf(runGraphFile(folder + "/forward.json", forwardGraph(g, QJsonArray{6}, x, {}, weights)));
    QCOMPARE(logits.size(), size_t(9));
    for (float v : logits) QVERIFY2(std::isfinite(v), "gpunodes gave a logit that is not finite");
    qInfo("valid lengths: gpunodes' logits %s", qPrintable(valuesText(logits)));
    // The lengths tell the samples apart (their ids alone would not reach the masked keys the same way).
    QVERIFY(!std::equal(logits.begin(), logits.begin() + 3, logits.begin() + 3));
    QVERIFY(!std::equal(logits.begin() + 3, logits.begin() + 6, logits.begin() + 6));
    QVERIFY(writeJson(folder + "/graph.json", g));
    const QString model = folder + "/m.onnx";
    const Process p = run(
        GN_GPUNODES, {"export-onnx", folder + "/graph.json", "--network", "net", "--params", weights, "-o", model});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    QString err;
    const QJsonObject facts = check(model, &err);
    QVERIFY2(!facts.isEmpty(), qPrintable(err));
    for (const char* op : {"Equal", "Not", "ReduceSum", "Less", "Where"})
      QVERIFY2(facts["ops"].toArray().contains(QJsonValue(op)), op);
    const std::vector<float> ort = ortLogits(model, xFile, kBatch);
    double worst = 0;
    for (size_t i = 0; i < std::min(ort.size(), logits.size()); ++i)
      worst = std::max(worst, std::abs(double(ort[i]) - double(logits[i])));
    qInfo("valid lengths: onnxruntime's logits %s; max abs difference %.3g", qPrintable(valuesText(ort)), worst);
    const QString diff = interop::compare(ort, logits);
    QVERIFY2(diff.isEmpty(), qPrintable("onnxruntime against gpunodes: " + diff));
  }

  // The command's help and its errors: one line each, exit status non-zero, nothing written.
  void command_help_and_errors() {
    // Each command's --help (and -h) is its own usage, on stdout with status 0, not the global one.
    Process p = run(GN_GPUNODES, {"export-onnx", "--help"});
    QCOMPARE(p.exitCode, 0);
    QVERIFY2(p.out.startsWith("usage: gpunodes export-onnx GRAPH.json"), qPrintable(p.out));
    for (const char* want : {"--network NODE", "--params FILE", "-o, --output MODEL", "--force", "--progress",
                             "not gpunodes' own", "is not replaced"})
      QVERIFY2(p.out.contains(want), qPrintable(QStringLiteral("no %1 in:\n%2").arg(want, p.out)));
    QVERIFY2(!p.out.contains("gpunodes run") && !p.out.contains("import-onnx"), qPrintable(p.out));
    p = run(GN_GPUNODES, {"import-onnx", "-h"});
    QCOMPARE(p.exitCode, 0);
    QVERIFY2(p.out.startsWith("usage: gpunodes import-onnx MODEL -o GRAPH.json"), qPrintable(p.out));
    for (const char* want : {"-o, --output GRAPH.json", "--weights FILE", "--progress", "--force", "is replaced"})
      QVERIFY2(p.out.contains(want), qPrintable(QStringLiteral("no %1 in:\n%2").arg(want, p.out)));
    QVERIFY2(!p.out.contains("gpunodes run") && !p.out.contains("--network"), qPrintable(p.out));
    // A usage error prints that usage after its line; import has no --network.
    p = run(GN_GPUNODES, {"import-onnx", "model.onnx", "-o", "g.json", "--network", "net"});
    QCOMPARE(p.exitCode, 2);
    QVERIFY2(p.err.contains("Unknown option 'network'") && p.err.contains("usage: gpunodes import-onnx MODEL"),
             qPrintable(p.err));

    const QString folder = dir_.filePath("errors");
    QVERIFY(QDir().mkpath(folder));
    const QString graphFile = folder + "/graph.json", out = folder + "/out.onnx";
    QJsonObject g = mlpGraph();
    QJsonArray nodes = g["nodes"].toArray();
    nodes.append(node("builtin", "Model", {{"arch", "lenet"}}));
    g["nodes"] = nodes;
    QVERIFY(writeJson(graphFile, g));
    struct Case {
      QStringList args;
      QString says;
    };
    const QList<Case> cases{
        {{"export-onnx", graphFile, "-o", out}, "--network"},
        {{"export-onnx", graphFile, "--network", "net"}, "-o"},
        {{"export-onnx", graphFile, "--network", "nothing", "-o", out}, "nothing"},
        {{"export-onnx", graphFile, "--network", "fc1", "-o", out}, "not a Network"},
        {{"export-onnx", graphFile, "--network", "builtin", "-o", out}, "not a Network"},
        {{"export-onnx", graphFile, "--network", "net", "--params", folder + "/missing.safetensors", "-o",
          out},
         "missing.safetensors"},
        {{"export-onnx", folder + "/no-graph.json", "--network", "net", "-o", out}, "no-graph.json"},
        {{"export-onnx", graphFile, "--network", "net", "-o", folder + "/missing-folder/out.onnx"},
         "cannot write"},
    };
    for (const Case& c : cases) {
      p = run(GN_GPUNODES, c.args);
      QVERIFY2(p.exitCode != 0, qPrintable(c.args.join(' ')));
      // One line says what is wrong (a usage error then prints the usage).
      QVERIFY2(nonEmptyLines(p.err).value(0).contains(c.says), qPrintable(c.args.join(' ') + ": " + p.err));
      QVERIFY2(!QFileInfo::exists(out), qPrintable(c.args.join(' ') + " wrote a file"));
    }
    // Parameters of another network do not load.
    const QString weights = folder + "/lenet.safetensors";
    QVERIFY(!runGraphFile(folder + "/save.json",
                          forwardGraph(readJson(GN_EXAMPLES_DIR "/lenet-layers.json"), QJsonArray{1, 28, 28},
                                       std::vector<float>(3 * 784, 0.0f), weights, {}))
                 .isEmpty());
    p = run(GN_GPUNODES, {"export-onnx", graphFile, "--network", "net", "--params", weights, "-o", out});
    QVERIFY2(p.exitCode != 0 && p.err.contains("does not fit"), qPrintable(p.err));
    QVERIFY(!QFileInfo::exists(out));
  }
};

QTEST_GUILESS_MAIN(OnnxExportTest)
#include "test_onnx_export.moc"
