// Layer nodes and the Network node through the real plugin: the catalogue, shapes and sizes known before a
// run, mismatches refused on the node and port with both shapes, a drawn LeNet that trains exactly as the
// built-in one, and a Network feeding every node that takes a Model.
#include <QFileInfo>
#include <QTemporaryDir>

#include "nodes_test_util.h"

using namespace nodes_test;

namespace {

const QString kFashionMnist = "/usr/share/datasets/fashion-mnist";

using Layers = QList<std::tuple<QString, QString, QJsonObject>>;

// Input "x" [shape] -> the chain of (id, type, params) -> Network "net".
void chain(GraphDocument& doc, const QJsonArray& shape, const Layers& layers) {
  doc.addNode(makeNode("x", "Input", {{"shape", shape}}));
  QString prev = "x";
  for (const auto& [id, type, params] : layers) {
    doc.addNode(makeNode(id, type, params));
    wire(doc, prev + ".out", id + ".in");
    prev = id;
  }
  doc.addNode(makeNode("net", "Network"));
  wire(doc, prev + ".out", "net.out");
}

// The one error of a graph with one mistake: on `node`, at `field`, naming every needle.
void expectOneError(const GraphDocument& doc, const QString& node, const QString& field,
                    const QStringList& needles) {
  const ValidationReport r = validate(doc, registry());
  const QList<Issue> errors = r.errors();
  QStringList texts;
  for (const Issue& i : errors) texts.append(i.text());
  QVERIFY2(errors.size() == 1, qPrintable("expected one error, got: " + texts.join(" | ")));
  QCOMPARE(errors[0].node, node);
  QCOMPARE(errors[0].field, field);
  for (const QString& n : needles)
    QVERIFY2(errors[0].message.contains(n), qPrintable(errors[0].text() + " does not mention " + n));
}

}  // namespace

class LayersTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() { QVERIFY2(plugin(), "the GPU node set did not load from " GN_NODES_PLUGIN); }

  void every_layer_type_is_in_the_catalogue_with_pytorch_names() {
    const QMap<QString, QStringList> params = {
        {"Input", {"shape"}},
        {"Conv2d", {"out_channels", "kernel_size", "stride", "padding", "groups", "bias"}},
        {"BatchNorm2d", {"eps", "momentum"}},
        {"BatchNorm1d", {"eps", "momentum"}},
        {"ReLU", {}},
        {"Sigmoid", {}},
        {"Tanh", {}},
        {"GELU", {}},
        {"MaxPool2d", {"kernel_size", "stride", "padding"}},
        {"AvgPool2d", {"kernel_size", "stride", "padding"}},
        {"GlobalAvgPool2d", {}},
        {"Flatten", {}},
        {"Linear", {"out_features", "bias"}},
        {"Dropout", {"p"}},
        {"Add", {}},
        {"Concat", {}},
        {"Network", {"init", "init_std", "seed"}},
    };
    for (auto it = params.begin(); it != params.end(); ++it) {
      NodeTypePtr t = registry().find(it.key());
      QVERIFY2(t, qPrintable(it.key() + " is missing"));
      QCOMPARE(t->spec().category, QString("Layers"));
      QStringList names;
      for (const ParamSpec& p : t->spec().params) names.append(p.name);
      QCOMPARE(names, it.value());
      if (it.key() == "Network") continue;
      QCOMPARE(t->spec().outputs.size(), 1);
      QCOMPARE(t->spec().outputs[0].type, PortType::Layer);
      QStringList inputs;
      for (const PortSpec& p : t->spec().inputs) {
        QCOMPARE(p.type, PortType::Layer);
        inputs.append(p.name);
      }
      const QStringList want = it.key() == "Input"                         ? QStringList{}
                               : it.key() == "Add" || it.key() == "Concat" ? QStringList{"a", "b"}
                                                                           : QStringList{"in"};
      QCOMPARE(inputs, want);
    }
    NodeTypePtr net = registry().find("Network");
    QCOMPARE(net->spec().input("out")->type, PortType::Layer);
    QCOMPARE(net->spec().input("device")->required, false);
    QCOMPARE(net->spec().output("model")->type, PortType::Model);
  }

  void shapes_and_sizes_are_known_before_a_run() {
    GraphDocument doc;
    QVERIFY(loadExample("lenet-layers", doc));
    const ValidationReport r = validate(doc, registry());
    QVERIFY2(r.ok(), qPrintable(r.errors().isEmpty() ? "" : r.errors()[0].text()));
    const auto& facts = r.facts();
    QCOMPARE(facts["x"].badge, QString("1×28×28"));
    QCOMPARE(facts["conv1"].badge, QString("6×28×28 · 156 params"));
    QCOMPARE(facts["pool2"].badge, QString("16×5×5"));
    QCOMPARE(facts["flat"].badge, QString("400"));
    QCOMPARE(facts["fc1"].badge, QString("120 · 48,120 params"));
    QVERIFY2(facts["net"].badge.startsWith("61,706 params · "), qPrintable(facts["net"].badge));
    QVERIFY2(facts["net"].badge.endsWith(" KB") || facts["net"].badge.contains("KiB"),
             qPrintable(facts["net"].badge));
    QCOMPARE(facts["net"].columns, (QStringList{"Layer", "Type", "Output shape", "Params", "FLOPs"}));
    QCOMPARE(facts["net"].rows.size(), 14);  // 13 layers and the total
    QCOMPARE(facts["net"].rows[1], (QStringList{"conv1", "Conv2d", "6×28×28", "156", "235.2 kFLOPs"}));
    QCOMPARE(facts["net"].rows.last()[3], QString("61,706"));

    // An edit changes what follows it, with no run.
    doc.setParam("conv2", "out_channels", 8);
    const ValidationReport edited = validate(doc, registry());
    QCOMPARE(edited.facts()["pool2"].badge, QString("8×5×5"));
    QCOMPARE(edited.facts()["fc1"].badge, QString("120 · 24,120 params"));  // 200 * 120 + 120
  }

  void mismatches_are_refused_on_the_node_and_port_with_both_shapes() {
    auto oneError = [](const QJsonArray& shape, const Layers& layers, const QString& node,
                       const QString& field, const QStringList& needles) {
      GraphDocument doc;
      chain(doc, shape, layers);
      expectOneError(doc, node, field, needles);
    };
    oneError({1, 28, 28}, {{"flat", "Flatten", {}}, {"conv", "Conv2d", {}}}, "conv", "inputs.in",
             {"flat", "784"});
    oneError({1, 28, 28}, {{"fc", "Linear", {}}}, "fc", "inputs.in", {"1x28x28", "784", "Flatten"});
    oneError({1, 28, 28}, {{"pool", "MaxPool2d", {{"kernel_size", 64}}}}, "pool", "inputs.in",
             {"window 64", "larger", "1x28x28"});
    oneError({3, 8, 8}, {{"conv", "Conv2d", {{"out_channels", 4}, {"groups", 2}}}}, "conv", "inputs.in",
             {"groups=2", "3 channels"});
    oneError({1, 28, 28}, {{"bn", "BatchNorm1d", {}}}, "bn", "inputs.in", {"BatchNorm1d", "1x28x28"});
    // Parameters that cannot fit: a 2^20 x 2^20 Linear is 4 TiB of float32.
    oneError({1048576}, {{"fc", "Linear", {{"out_features", 1048576}}}}, "net", "inputs.out", {"cannot fit"});
    // A mistake upstream is said once: the layers after it and the Network stay quiet.
    oneError({1, 28, 28}, {{"fc", "Linear", {}}, {"relu", "ReLU", {}}, {"fc2", "Linear", {}}}, "fc",
             "inputs.in", {"Flatten"});

    GraphDocument add;
    chain(add, {1, 28, 28}, {{"conv", "Conv2d", {{"out_channels", 6}, {"padding", 1}}}});
    add.addNode(makeNode("sum", "Add"));
    wire(add, "conv.out", "sum.a");
    wire(add, "x.out", "sum.b");
    expectOneError(add, "sum", "inputs.b", {"6x28x28", "1x28x28"});

    // Two Inputs: the Network says which.
    GraphDocument two;
    chain(two, {1, 28, 28}, {{"relu", "ReLU", {}}});
    two.removeNode("net");
    two.addNode(makeNode("y", "Input", {{"shape", QJsonArray{1, 28, 28}}}));
    two.addNode(makeNode("sum", "Add"));
    two.addNode(makeNode("net", "Network"));
    wire(two, "relu.out", "sum.a");
    wire(two, "y.out", "sum.b");
    wire(two, "sum.out", "net.out");
    expectOneError(two, "net", "inputs.out", {"2 Inputs", "x", "y"});
  }

  void a_drawn_lenet_trains_exactly_as_the_builtin_one() {
    QVERIFY2(QFileInfo::exists(kFashionMnist),
             "dataset-fashion-mnist is not installed (the scripts install it)");
    GraphDocument doc;
    QVERIFY(loadExample("lenet-layers", doc));
    doc.setParam("data", "limit", 2000);
    doc.setParam("train", "epochs", 1);
    doc.setParam("train", "log_every", 5);
    // The built-in lenet beside it, same init and seed, same data.
    doc.addNode(makeNode("builtin", "Model", {{"arch", "lenet"}, {"init", "xavier"}, {"seed", 0}}));
    doc.addNode(makeNode("train_builtin", "Train", {{"epochs", 1}, {"lr", 0.9}, {"log_every", 5}}));
    doc.addNode(makeNode("test_builtin", "Evaluate", {{"split", "test"}}));
    wire(doc, "dev.device", "builtin.device");
    wire(doc, "builtin.model", "train_builtin.model");
    wire(doc, "data.data", "train_builtin.data");
    wire(doc, "dev.device", "train_builtin.devices");
    wire(doc, "train_builtin.model", "test_builtin.model");
    wire(doc, "data.data", "test_builtin.data");
    // Logits of both untrained models on the same batch.
    doc.addNode(makeNode("images", "Tensor",
                         {{"shape", QJsonArray{2, 1, 28, 28}}, {"init", "uniform"}, {"seed", 4}}));
    wire(doc, "dev.device", "images.device");
    for (const QString& m : QStringList{"net", "builtin"}) {
      doc.addNode(makeNode("fwd_" + m, "Forward"));
      wire(doc, m + ".model", "fwd_" + m + ".model");
      wire(doc, "images.out", "fwd_" + m + ".in");
      addInspect(doc, "logits_" + m, "fwd_" + m + ".out");
    }
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    const std::vector<double> drawn = r.inspected("logits_net"), builtin = r.inspected("logits_builtin");
    QCOMPARE(drawn.size(), size_t(20));
    QVERIFY(near(drawn, builtin, 1e-5));
    const double acc = r.node("test")["accuracy"].toDouble();
    QCOMPARE(acc, r.node("test_builtin")["accuracy"].toDouble());
    // Sigmoid LeNet barely moves in its first epoch (d2l's plot too); the point here is that both moved
    // alike.
    QVERIFY2(std::fabs(r.node("train")["loss"].toDouble() - std::log(10.0)) > 0.01,
             "training changed nothing");
    QCOMPARE(r.node("train")["loss"].toDouble(), r.node("train_builtin")["loss"].toDouble());
  }

  void a_drawn_network_trains_data_parallel_like_the_builtin_one() {
    // Two CPU devices: each batch split across them, gradients summed, the same step on both replicas.
    GraphDocument doc;
    QVERIFY(loadExample("lenet-layers", doc));
    doc.setSettings(QJsonObject{{"cpu_devices", 2}});
    doc.setParam("data", "limit", 1000);
    doc.setParam("train", "epochs", 1);
    doc.addNode(makeNode("all", "AllDevices"));
    for (const GraphConnection& c : doc.connections())
      if (c.from.node == "dev") doc.removeConnection(c);
    doc.removeNode("dev");
    wire(doc, "all.devices", "net.device");
    wire(doc, "all.devices", "train.devices");
    doc.addNode(makeNode("builtin", "Model", {{"arch", "lenet"}, {"init", "xavier"}, {"seed", 0}}));
    doc.addNode(makeNode("train_builtin", "Train", {{"epochs", 1}, {"lr", 0.9}, {"log_every", 50}}));
    wire(doc, "all.devices", "builtin.device");
    wire(doc, "builtin.model", "train_builtin.model");
    wire(doc, "data.data", "train_builtin.data");
    wire(doc, "all.devices", "train_builtin.devices");
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QCOMPARE(r.node("train")["devices"].toArray().size(), 2);
    QCOMPARE(r.node("train")["loss"].toDouble(), r.node("train_builtin")["loss"].toDouble());
    QCOMPARE(r.node("test")["accuracy"].toDouble(), r.node("train_builtin")["test_acc"].toDouble());
  }

  void a_network_goes_wherever_a_model_goes() {
    QTemporaryDir tmp;
    const QString path = tmp.filePath("net.params");
    GraphDocument doc;
    chain(doc, {3, 8, 8},
          {{"conv", "Conv2d", {{"out_channels", 4}, {"padding", 1}, {"bias", false}}},
           {"bn", "BatchNorm2d", {}},
           {"act", "GELU", {}},
           {"gap", "GlobalAvgPool2d", {}},
           {"flat", "Flatten", {}},
           {"fc", "Linear", {{"out_features", 5}}}});
    doc.setParam("net", "init", "kaiming");
    doc.addNode(makeNode("params", "Parameters"));
    wire(doc, "net.model", "params.model");
    doc.addNode(makeNode("save", "SaveParams", {{"path", path}}));
    wire(doc, "net.model", "save.model");
    doc.addNode(makeNode("dev", "Device", {{"kind", "cpu"}}));
    doc.addNode(makeNode("load", "LoadParams", {{"path", path}}));
    wire(doc, "dev.device", "load.device");
    doc.addNode(
        makeNode("images", "Tensor", {{"shape", QJsonArray{2, 3, 8, 8}}, {"init", "normal"}, {"seed", 1}}));
    wire(doc, "dev.device", "images.device");
    for (const QString& m : QStringList{"net", "load"}) {
      doc.addNode(makeNode("fwd_" + m, "Forward"));
      wire(doc, m + ".model", "fwd_" + m + ".model");
      wire(doc, "images.out", "fwd_" + m + ".in");
      addInspect(doc, "logits_" + m, "fwd_" + m + ".out");
    }
    // LoadParams reads the file only after SaveParams wrote it.
    wire(doc, "save.model", "load.like");
    const RunResult r = runGraph(doc);
    QVERIFY2(r.failures().isEmpty(), qPrintable(r.failures().join("\n")));
    QStringList names;
    for (const QJsonValue& v : r.node("params")["names"].toArray()) names.append(v.toString());
    QCOMPARE(names, (QStringList{"conv.weight", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
                                 "fc.weight", "fc.bias"}));
    QCOMPARE(r.node("net")["parameter_count"].toDouble(), 4 * 3 * 9 + 8 + 4 * 5 + 5.0);
    QCOMPARE(r.inspected("logits_load"), r.inspected("logits_net"));
    QCOMPARE(r.inspected("logits_net").size(), size_t(10));
    QVERIFY(r.node("load")["signature"].toString().startsWith("network x:Input(shape=3x8x8)"));
  }
};

QTEST_GUILESS_MAIN(LayersTest)
#include "test_layers.moc"
