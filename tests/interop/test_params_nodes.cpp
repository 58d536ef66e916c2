// SaveParams' format param and LoadParams reading both formats, as a graph runs them through the real plugin:
// a safetensors file saved and loaded back whatever its name, and a file another program wrote (no gpunodes
// signature), which needs LoadParams' like input and says so.
#include <QFile>
#include <QTemporaryDir>
#include <cstring>

#include "nodes_test_util.h"

using namespace nodes_test;

namespace {

// A safetensors file as PyTorch writes it: no gpunodes metadata. Linear(3, 2): weight [2, 3], bias [2].
QByteArray foreignLinear(const std::vector<float>& weight, const std::vector<float>& bias) {
  QByteArray header =
      R"({"__metadata__":{"format":"pt"},"0.weight":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
      R"("0.bias":{"dtype":"F32","shape":[2],"data_offsets":[24,32]}})";
  while (header.size() % 8) header += ' ';
  const uint64_t n = static_cast<uint64_t>(header.size());
  QByteArray out(reinterpret_cast<const char*>(&n), 8);
  out += header;
  out += QByteArray(reinterpret_cast<const char*>(weight.data()), qsizetype(weight.size() * sizeof(float)));
  out += QByteArray(reinterpret_cast<const char*>(bias.data()), qsizetype(bias.size() * sizeof(float)));
  return out;
}

std::vector<double> doubles(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

}  // namespace

class ParamsNodesTest : public QObject {
  Q_OBJECT
  QTemporaryDir tmp_;

 private slots:
  void initTestCase() {
    QVERIFY(tmp_.isValid());
    QVERIFY(plugin());
  }

  void save_as_safetensors_and_load_back() {
    // The name says gpunodes' format; the content is safetensors, and that decides.
    const QString path = tmp_.filePath("lenet.params");
    GraphDocument doc;
    doc.addNode(makeNode("net", "Model", {{"arch", "lenet"}, {"init", "xavier"}, {"seed", 3}}));
    doc.addNode(makeNode("save", "SaveParams", {{"path", path}, {"format", "safetensors"}}));
    doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("load", "LoadParams", {{"path", path}}));
    doc.addNode(makeNode("saved_params", "Parameters"));
    doc.addNode(makeNode("loaded_params", "Parameters"));
    wire(doc, "net.model", "save.model");
    wire(doc, "save.model", "load.like");
    wire(doc, "cpu.device", "load.device");
    wire(doc, "net.model", "saved_params.model");
    wire(doc, "load.model", "loaded_params.model");
    addInspect(doc, "show_saved", "saved_params.out");
    addInspect(doc, "show_loaded", "loaded_params.out");
    RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QCOMPARE(r.node("save")["format"].toString(), QString("safetensors"));
    QCOMPARE(r.node("load")["format"].toString(), QString("safetensors"));

    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray bytes = f.readAll();
    QVERIFY(!bytes.startsWith("GNPARAMS"));
    uint64_t n = 0;
    std::memcpy(&n, bytes.constData(), 8);
    QCOMPARE(n % 8, uint64_t(0));
    QCOMPARE(bytes[8], '{');
    QVERIFY(bytes.mid(8, qsizetype(n))
                .contains(R"("gpunodes.signature":"lenet classes=10 in_channels=1 image_size=28")"));
    QCOMPARE(r.node("save")["file_bytes"].toDouble(), double(bytes.size()));
    for (int i = 0; i < 4; ++i) QCOMPARE(r.inspected("show_loaded", i), r.inspected("show_saved", i));

    // Without like: the signature in the file's metadata says what to build.
    GraphDocument again;
    again.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    again.addNode(makeNode("load", "LoadParams", {{"path", path}}));
    wire(again, "cpu.device", "load.device");
    RunResult r2 = runGraph(again);
    QVERIFY2(r2.failures().isEmpty(), qPrintable(r2.failures().join("\n")));
    QCOMPARE(r2.node("load")["signature"].toString(), r.node("save")["signature"].toString());

    // And the default format is still gpunodes' own.
    GraphDocument native;
    const QString nativePath = tmp_.filePath("lenet.safetensors");
    native.addNode(makeNode("net", "Model", {{"arch", "lenet"}}));
    native.addNode(makeNode("save", "SaveParams", {{"path", nativePath}}));
    wire(native, "net.model", "save.model");
    RunResult r3 = runGraph(native);
    QVERIFY2(r3.failures().isEmpty(), qPrintable(r3.failures().join("\n")));
    QCOMPARE(r3.node("save")["format"].toString(), QString("gpunodes"));
    QFile nf(nativePath);
    QVERIFY(nf.open(QIODevice::ReadOnly));
    QVERIFY(nf.readAll().startsWith("GNPARAMS"));
  }

  void a_file_from_torch_needs_like() {
    const std::vector<float> weight = {0.5f, -1, 2, 0.25f, 3, -4}, bias = {0.125f, -8};
    const QString path = tmp_.filePath("from-torch.safetensors");
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(foreignLinear(weight, bias));
    f.close();

    GraphDocument bare;
    bare.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    bare.addNode(makeNode("load", "LoadParams", {{"path", path}}));
    wire(bare, "cpu.device", "load.device");
    RunResult r = runGraph(bare);
    QVERIFY(r.started);
    QCOMPARE(r.node("load")["status"].toString(), QString("failed"));
    const QString error = r.node("load")["error"].toString();
    for (const QString& needle : {path, QString("gpunodes.signature"), QString("input like")})
      QVERIFY2(error.contains(needle), qPrintable(error));

    GraphDocument doc;
    doc.addNode(makeNode("cpu", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("net", "Model", {{"arch", "linear"}, {"in_channels", 3}, {"classes", 2}}));
    doc.addNode(makeNode("load", "LoadParams", {{"path", path}}));
    doc.addNode(makeNode("params", "Parameters"));
    wire(doc, "cpu.device", "load.device");
    wire(doc, "net.model", "load.like");
    wire(doc, "load.model", "params.model");
    addInspect(doc, "show", "params.out");
    RunResult ok = runGraph(doc);
    QVERIFY2(ok.failures().isEmpty(), qPrintable(ok.failures().join("\n")));
    QCOMPARE(ok.inspected("show", 0), doubles(weight));
    QCOMPARE(ok.inspected("show", 1), doubles(bias));

    // like of another shape: the tensor, both shapes and the file in one message.
    doc.setParam("net", "in_channels", 4);
    RunResult wrong = runGraph(doc);
    QCOMPARE(wrong.node("load")["status"].toString(), QString("failed"));
    const QString mismatch = wrong.node("load")["error"].toString();
    for (const QString& needle :
         {path, QString("'0.weight' has shape [2, 3] in the file but the model expects [2, 4]")})
      QVERIFY2(mismatch.contains(needle), qPrintable(mismatch));
  }

  void unknown_format_is_refused_before_the_run() {
    GraphDocument doc;
    doc.addNode(makeNode("net", "Model", {{"arch", "linear"}}));
    doc.addNode(makeNode("save", "SaveParams", {{"path", tmp_.filePath("x")}, {"format", "pickle"}}));
    wire(doc, "net.model", "save.model");
    RunResult r = runGraph(doc);
    QVERIFY(!r.started);
    QVERIFY2(r.failures().join("\n").contains("format"), qPrintable(r.failures().join("\n")));
  }
};

QTEST_GUILESS_MAIN(ParamsNodesTest)
#include "test_params_nodes.moc"
