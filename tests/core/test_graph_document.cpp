// GraphDocument: readable ids, edits and their signals, and the node-type helpers.
#include <QElapsedTimer>
#include <QJsonArray>
#include <QSignalSpy>
#include <QtTest>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "test_support.h"

using namespace gn::core;
using gn::test::makeNode;
using gn::test::wire;

class GraphDocumentTest : public QObject {
  Q_OBJECT

 private slots:
  void idsAreInitialsPlusSmallestFreeNumber() {
    GraphDocument doc;
    QCOMPARE(doc.makeId("MatMul"), QStringLiteral("mm1"));
    QCOMPARE(doc.makeId("Tensor"), QStringLiteral("t1"));
    QCOMPARE(doc.makeId("AllDevices"), QStringLiteral("ad1"));
    QCOMPARE(doc.makeId("NCCLAllReduce"), QStringLiteral("nar1"));
    QCOMPARE(doc.makeId("2D"), QStringLiteral("d1"));
    QCOMPARE(doc.makeId(""), QStringLiteral("n1"));
    QCOMPARE(doc.addNode(makeNode({}, "MatMul")), QStringLiteral("mm1"));
    QCOMPARE(doc.addNode(makeNode({}, "MatMul")), QStringLiteral("mm2"));
    QCOMPARE(doc.addNode(makeNode({}, "MatMul")), QStringLiteral("mm3"));
    doc.removeNode("mm2");
    QCOMPARE(doc.makeId("MatMul"), QStringLiteral("mm2"));
  }

  void addNodeKeepsAFreeValidIdOnly() {
    GraphDocument doc;
    QCOMPARE(doc.addNode(makeNode("dev0", "Device")), QStringLiteral("dev0"));
    QCOMPARE(doc.addNode(makeNode("dev0", "Device")), QStringLiteral("d1"));  // taken
    QCOMPARE(doc.addNode(makeNode("a.b", "Tensor")), QStringLiteral("t1"));   // a dot breaks node.port
    QCOMPARE(doc.addNode(makeNode("x y", "Tensor")), QStringLiteral("t2"));
    QVERIFY(GraphDocument::isValidId("mm_1-b"));
    QVERIFY(!GraphDocument::isValidId(""));
    QVERIFY(!GraphDocument::isValidId(QString(65, u'a')));
    QVERIFY(!GraphDocument::isValidId(QStringLiteral("é")));
  }

  void editsEmitSignals() {
    GraphDocument doc;
    QSignalSpy added(&doc, &GraphDocument::nodeAdded), removed(&doc, &GraphDocument::nodeRemoved),
        moved(&doc, &GraphDocument::nodeMoved), params(&doc, &GraphDocument::paramsChanged),
        connAdded(&doc, &GraphDocument::connectionAdded),
        connRemoved(&doc, &GraphDocument::connectionRemoved), meta(&doc, &GraphDocument::metadataChanged),
        changed(&doc, &GraphDocument::changed);
    doc.addNode(makeNode("c1", "TestConst"));
    doc.addNode(makeNode("a1", "TestAdd"));
    QCOMPARE(added.count(), 2);
    QCOMPARE(added.at(1).at(0).toString(), QStringLiteral("a1"));

    QVERIFY(doc.setPosition("a1", {10, 20}));
    QCOMPARE(moved.count(), 1);
    QVERIFY(doc.setPosition("a1", {10, 20}));  // no change, no signal
    QCOMPARE(moved.count(), 1);
    QVERIFY(!doc.setPosition("zz", {1, 1}));

    QVERIFY(doc.setParam("a1", "value", 3));
    QCOMPARE(doc.node("a1")->params.value("value").toInt(), 3);
    QVERIFY(doc.setParam("a1", "value", 3));
    QCOMPARE(params.count(), 1);
    QVERIFY(doc.setParam("a1", "value", QJsonValue(QJsonValue::Undefined)));
    QVERIFY(!doc.node("a1")->params.contains("value"));
    QCOMPARE(params.count(), 2);
    QVERIFY(doc.setParams("a1", QJsonObject{{"repeat", 2}}));
    QCOMPARE(params.count(), 3);

    QVERIFY(doc.addConnection(wire("c1.out", "a1.a")));
    QVERIFY(!doc.addConnection(wire("c1.out", "a1.a")));  // an exact duplicate is refused
    QCOMPARE(connAdded.count(), 1);
    QCOMPARE(doc.connectionsTo("a1").size(), 1);
    QCOMPARE(doc.connectionsFrom("c1").size(), 1);
    QCOMPARE(doc.connectionsFrom("a1").size(), 0);

    doc.setName("g");
    doc.setDescription("d");
    doc.setSettings(QJsonObject{{"schedule", "sequential"}});
    QCOMPARE(meta.count(), 3);
    const int before = changed.count();
    doc.setView(QJsonObject{{"zoom", 2}});  // view state is not an edit
    QCOMPARE(changed.count(), before);
    QCOMPARE(doc.view().value("zoom").toInt(), 2);

    QVERIFY(doc.removeNode("c1"));  // takes its wires with it
    QCOMPARE(removed.count(), 1);
    QCOMPARE(connRemoved.count(), 1);
    QVERIFY(doc.connections().isEmpty());
    QVERIFY(!doc.removeNode("c1"));
    QVERIFY(!doc.removeConnection(wire("c1.out", "a1.a")));
    QVERIFY(changed.count() > before);
  }

  void connectionExtraIsReplacedInPlace() {
    GraphDocument doc;
    doc.addNode(makeNode("c1", "TestConst"));
    doc.addNode(makeNode("a1", "TestAdd"));
    doc.addNode(makeNode("a2", "TestAdd"));
    QVERIFY(doc.addConnection(wire("c1.out", "a1.a")));
    QVERIFY(doc.addConnection(wire("c1.out", "a2.a")));
    QSignalSpy changedWire(&doc, &GraphDocument::connectionChanged), changed(&doc, &GraphDocument::changed),
        added(&doc, &GraphDocument::connectionAdded), removed(&doc, &GraphDocument::connectionRemoved);
    const QJsonObject extra{{"points", QJsonArray{QJsonArray{10, 20}}}};
    QVERIFY(doc.setConnectionExtra(wire("c1.out", "a1.a"), extra));
    QCOMPARE(doc.connections().at(0).extra, extra);
    // The wire keeps its place in the list (the file's order), and it is a change, not a remove and an add.
    QCOMPARE(doc.connections().at(0).to.node, QString("a1"));
    QCOMPARE(changedWire.count(), 1);
    QCOMPARE(changedWire.at(0).at(0).value<GraphConnection>().extra, extra);
    QCOMPARE(changed.count(), 1);
    QCOMPARE(added.count() + removed.count(), 0);
    QVERIFY(doc.setConnectionExtra(wire("c1.out", "a1.a"), extra));  // the same: no signal
    QCOMPARE(changedWire.count(), 1);
    QVERIFY(!doc.setConnectionExtra(wire("a1.out", "a2.b"), extra));  // no such wire
    QVERIFY(doc.connections().at(1).extra.isEmpty());
  }

  void replaceAllAndClearEmitOneReset() {
    GraphDocument a, b;
    b.setName("other");
    b.addNode(makeNode("x1", "TestConst"));
    QSignalSpy reset(&a, &GraphDocument::reset), added(&a, &GraphDocument::nodeAdded);
    a.replaceAll(b);
    QCOMPARE(reset.count(), 1);
    QCOMPARE(added.count(), 0);
    QCOMPARE(a.name(), QStringLiteral("other"));
    QVERIFY(a.hasNode("x1"));
    a.clear();
    QCOMPARE(reset.count(), 2);
    QVERIFY(a.nodes().isEmpty());
    QVERIFY(a.name().isEmpty());
  }

  void setContentsKeepsDuplicateIds() {
    GraphDocument doc;
    doc.setContents({makeNode("x", "A"), makeNode("x", "B")}, {wire("x.out", "x.in")});
    QCOMPARE(doc.nodes().size(), 2);
    QCOMPARE(doc.node("x")->type, QStringLiteral("A"));
    QVERIFY(doc.removeNode("x"));  // the other x still holds the wire
    QCOMPARE(doc.connections().size(), 1);
    QVERIFY(doc.removeNode("x"));
    QCOMPARE(doc.connections().size(), 0);
  }

  void lookupsStayRightThroughEdits() {
    // The id and wire caches behind node() and addConnection(), through every kind of change.
    GraphDocument doc;
    for (const char* id : {"a", "b", "c"}) doc.addNode(makeNode(id, "TestConst"));
    QVERIFY(doc.addConnection(wire("a.out", "b.a")));
    QVERIFY(!doc.addConnection(wire("a.out", "b.a")));
    QVERIFY(doc.removeNode("a"));
    QVERIFY(!doc.hasNode("a"));
    QCOMPARE(doc.node("c")->id, QStringLiteral("c"));  // positions moved
    QVERIFY(doc.connections().isEmpty());
    QVERIFY(doc.addConnection(wire("b.out", "c.a")));
    QVERIFY(doc.removeConnection(wire("b.out", "c.a")));
    QVERIFY(doc.addConnection(wire("b.out", "c.a")));  // removed, so it may come back
    // "b" is taken: a fresh id.
    QCOMPARE(doc.addNode(makeNode("b", "TestConst")), QStringLiteral("tc1"));
    GraphDocument other;
    other.addNode(makeNode("z", "TestConst"));
    doc.replaceAll(other);
    QVERIFY(!doc.hasNode("b") && doc.hasNode("z"));
    QVERIFY(doc.addConnection(wire("b.out", "c.a")));  // the old wire went with the old contents
    doc.setContents({makeNode("q", "A")}, {});
    QVERIFY(doc.hasNode("q") && !doc.hasNode("z"));
    doc.clear();
    QVERIFY(!doc.hasNode("q"));
    // Wires whose names would run together still differ.
    QVERIFY(doc.addConnection(wire("ab.c", "d.e")));
    QVERIFY(doc.addConnection(wire("a.bc", "d.e")));
  }

  void aHundredThousandNodesAndWiresAddInLinearTime() {
    // A file or a pasted clipboard of 100,000 nodes: each add used to scan every node and wire before it.
    QElapsedTimer timer;
    timer.start();
    GraphDocument doc;
    constexpr int n = 100000;
    for (int i = 0; i < n; ++i) doc.addNode(makeNode(QStringLiteral("n%1").arg(i), "TestConst"));
    for (int i = 0; i + 1 < n; ++i)
      QVERIFY(doc.addConnection(wire(QStringLiteral("n%1.out").arg(i), QStringLiteral("n%1.a").arg(i + 1))));
    for (int i = 0; i < 1000; ++i) QVERIFY(doc.hasNode(QStringLiteral("n%1").arg(i * 97)));
    QCOMPARE(doc.addNode(makeNode("n5", "TestConst")), QStringLiteral("tc1"));
    QVERIFY2(timer.elapsed() < 3000 * kTimeScale, qPrintable(QString::number(timer.elapsed())));
  }

  void endpointsParse() {
    QCOMPARE(Endpoint::parse("mm1.out")->node, QStringLiteral("mm1"));
    QCOMPARE(Endpoint::parse("mm1.out")->port, QStringLiteral("out"));
    QCOMPARE(Endpoint::parse("mm1.out")->str(), QStringLiteral("mm1.out"));
    for (const char* bad : {"mm1", ".out", "mm1.", "a.b.c", ""}) QVERIFY2(!Endpoint::parse(bad), bad);
  }

  void portAndParamTypes() {
    for (PortType t : {PortType::Device, PortType::Devices, PortType::Tensor, PortType::Model,
                       PortType::Dataset, PortType::Scalar, PortType::Layer}) {
      QCOMPARE(portTypeFromName(portTypeName(t)), std::optional<PortType>(t));
      QVERIFY(portAccepts(t, t));
    }
    QVERIFY(!portTypeFromName("Banana"));
    QVERIFY(portAccepts(PortType::Devices, PortType::Device));
    QVERIFY(!portAccepts(PortType::Device, PortType::Devices));
    QVERIFY(!portAccepts(PortType::Tensor, PortType::Scalar));
    QCOMPARE(paramTypeName(ParamType::Shape), QStringLiteral("shape"));

    NodeTypeSpec spec;
    spec.inputs = {{.name = "a"}};
    spec.outputs = {{.name = "out"}};
    spec.params = {{.name = "n", .type = ParamType::Int, .defaultValue = 5},
                   {.name = "s", .type = ParamType::String}};
    QVERIFY(spec.input("a") && !spec.input("out"));
    QVERIFY(spec.output("out") && !spec.output("a"));
    QVERIFY(spec.param("n") && !spec.param("zz"));
    const QJsonObject filled = withDefaults(spec, QJsonObject{{"x", 1}});
    QCOMPARE(filled.value("n").toInt(), 5);
    QCOMPARE(filled.value("x").toInt(), 1);
    QVERIFY(!filled.contains("s"));  // no default, nothing made up
    QCOMPARE(withDefaults(spec, QJsonObject{{"n", 7}}).value("n").toInt(), 7);
  }
};

QTEST_GUILESS_MAIN(GraphDocumentTest)
#include "test_graph_document.moc"
