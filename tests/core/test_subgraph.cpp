// Subgraphs in the core: grouping and ungrouping, the file format's version 2 (round trips, v1 files, the
// version check), flattening for validation and runs (path ids in issues, the report and errors), promoted
// params, nesting, cycles through a subgraph, the structure checks, and the block library.
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QStandardPaths>
#include <QtTest>
#include <algorithm>

#include "gpunodes/core/executor.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/run_graph.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/subgraph.h"
#include "gpunodes/core/validation.h"
#include "test_support.h"

using namespace gn::core;
using gn::test::makeNode;
using gn::test::testRegistry;
using gn::test::wire;
namespace ser = gn::core::serializer;

namespace {

// c1 = 2, c2 = 4 -> a1 = c1 + c2 + 3 = 9 -> a2 = a1 * 10 = 90 -> a3 = a2 + 1 = 91
void chain(GraphDocument& doc) {
  doc.addNode(makeNode("c1", "TestConst", {{"value", 2}}, {0, 0}));
  doc.addNode(makeNode("c2", "TestConst", {{"value", 4}}, {0, 100}));
  doc.addNode(makeNode("a1", "TestAdd", {{"value", 3}}, {200, 50}));
  doc.addNode(makeNode("a2", "TestAdd", {{"value", 10}, {"mode", "mul"}}, {400, 50}));
  doc.addNode(makeNode("a3", "TestAdd", {{"value", 1}}, {600, 50}));
  doc.addConnection(wire("c1.out", "a1.a"));
  doc.addConnection(wire("c2.out", "a1.b"));
  doc.addConnection(wire("a1.out", "a2.a"));
  doc.addConnection(wire("a2.out", "a3.a"));
}

void apply(GraphDocument& doc, const subgraph::Change& change) {
  QVERIFY2(change.error.isEmpty(), qPrintable(change.error));
  for (const GraphConnection& c : change.removeConnections) doc.removeConnection(c);
  for (const GraphNode& n : change.removeNodes) doc.removeNode(n.id);
  for (const GraphNode& n : change.addNodes) doc.addNode(n);
  for (const GraphConnection& c : change.addConnections) doc.addConnection(c);
}

QSet<QString> wireSet(const GraphDocument& doc) {
  QSet<QString> out;
  for (const GraphConnection& c : doc.connections()) out.insert(c.from.str() + " -> " + c.to.str());
  return out;
}

QJsonObject run(const GraphDocument& doc, ValidationReport* validation = nullptr) {
  Executor ex(testRegistry());
  if (!ex.start(doc, RunSettings::fromGraph(doc.settings()), validation)) return ex.report();
  QElapsedTimer timer;
  timer.start();
  bool finished = false;
  while (!finished && timer.elapsed() < 10000)
    for (const RunEvent& e : ex.events().waitAndDrain(50))
      if (e.kind == RunEvent::Kind::RunFinished) finished = true;
  ex.wait();
  return ex.report();
}

double valueOf(const QJsonObject& report, const QString& node) {
  return report.value("nodes").toObject().value(node).toObject().value("value").toDouble(-1);
}

QStringList issueTexts(const ValidationReport& r) {
  QStringList out;
  for (const Issue& i : r.issues()) out.append(i.text());
  return out;
}

// A subgraph node holding `inner`, with the given ports.
GraphNode subgraphNode(const QString& id, QList<GraphNode> inner, QList<GraphConnection> wires,
                       QList<SubgraphInput> inputs, QList<SubgraphOutput> outputs) {
  auto sub = std::make_shared<Subgraph>();
  sub->nodes = std::move(inner);
  sub->connections = std::move(wires);
  sub->inputs = std::move(inputs);
  sub->outputs = std::move(outputs);
  GraphNode n = makeNode(id, subgraph::kType);
  n.subgraph = std::move(sub);
  return n;
}

// Subgraphs nested `depth` deep around one TestConst: outer "l1" holds "l2" ... holds "c".
GraphNode nested(int depth, int level = 1) {
  const QString id = QStringLiteral("l%1").arg(level);
  if (level == depth)
    return subgraphNode(id, {makeNode("c", "TestConst", {{"value", 7}})}, {}, {},
                        {{"out", {"c", "out"}, {}}});
  return subgraphNode(id, {nested(depth, level + 1)}, {}, {},
                      {{"out", {QStringLiteral("l%1").arg(level + 1), "out"}, {}}});
}

}  // namespace

class SubgraphTest : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() {
    QStandardPaths::setTestModeEnabled(true);
    QDir(subgraph::libraryDir()).removeRecursively();
  }
  void cleanupTestCase() { QDir(subgraph::libraryDir()).removeRecursively(); }

  void groupMakesPortsFromTheWiresThatCrossTheBorder() {
    GraphDocument doc;
    chain(doc);
    const subgraph::Change change = subgraph::group(doc, {"a1", "a2"}, "block1");
    apply(doc, change);
    QCOMPARE(doc.nodes().size(), 4);
    const GraphNode* block = doc.node("block1");
    QVERIFY(block && subgraph::isSubgraph(*block));
    QCOMPARE(block->position, QPointF(200, 50));  // the selection's top-left
    const Subgraph& sub = subgraph::of(*block);
    QCOMPARE(sub.nodes.size(), 2);
    QCOMPARE(sub.node("a2")->position, QPointF(200, 0));  // inner positions start at the origin
    QCOMPARE(sub.connections.size(), 1);
    // c1 and c2 feed a1.a and a1.b: two inputs named after the inner ports; a2.out feeds a3: one output.
    QCOMPARE(sub.inputs.size(), 2);
    QCOMPARE(sub.inputs[0].name, QStringLiteral("a"));
    QCOMPARE(sub.inputs[0].targets, (QList<Endpoint>{{"a1", "a"}}));
    QCOMPARE(sub.inputs[1].name, QStringLiteral("b"));
    QCOMPARE(sub.outputs.size(), 1);
    QCOMPARE(sub.outputs[0].source, (Endpoint{"a2", "out"}));
    QCOMPARE(wireSet(doc), (QSet<QString>{"c1.out -> block1.a", "c2.out -> block1.b", "block1.out -> a3.a"}));

    // The node's spec: ports typed by the inner ports, a required input stays required.
    const NodeTypeSpec spec = subgraph::spec(*block, testRegistry());
    QCOMPARE(spec.inputs.size(), 2);
    QCOMPARE(spec.inputs[0].type, PortType::Scalar);
    QVERIFY(spec.inputs[0].required);
    QVERIFY(!spec.inputs[1].required);  // TestAdd.b is optional
    QCOMPARE(spec.outputs[0].type, PortType::Scalar);

    QVERIFY(!subgraph::group(doc, {}, "block2").error.isEmpty());
    QVERIFY(subgraph::group(doc, {"nope"}, "block2").error.contains("nope"));
    QVERIFY(subgraph::group(doc, {"c1"}, "a3").error.contains("taken"));
    QCOMPARE(subgraph::freeBlockId(doc), QStringLiteral("block2"));
  }

  void oneSourceFeedingTwoInnerInputsIsOnePort() {
    GraphDocument doc;
    doc.addNode(makeNode("c1", "TestConst", {{"value", 5}}));
    doc.addNode(makeNode("a1", "TestAdd", {{"value", 0}}));
    doc.addConnection(wire("c1.out", "a1.a"));
    doc.addConnection(wire("c1.out", "a1.b"));
    apply(doc, subgraph::group(doc, {"a1"}, "block1"));
    const Subgraph& sub = subgraph::of(*doc.node("block1"));
    QCOMPARE(sub.inputs.size(), 1);
    QCOMPARE(sub.inputs[0].targets, (QList<Endpoint>{{"a1", "a"}, {"a1", "b"}}));
    QCOMPARE(valueOf(run(doc), "block1/a1"), 10.0);  // 5 + 5 + 0
  }

  void ungroupRestoresTheGraph() {
    GraphDocument doc;
    chain(doc);
    const QSet<QString> before = wireSet(doc);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    apply(doc, subgraph::ungroup(doc, "block1"));
    QCOMPARE(wireSet(doc), before);
    QCOMPARE(doc.nodes().size(), 5);
    QCOMPARE(doc.node("a2")->position, QPointF(400, 50));
    QCOMPARE(doc.node("a2")->params.value("mode").toString(), QStringLiteral("mul"));
    QVERIFY(!subgraph::ungroup(doc, "a1").error.isEmpty());  // not a subgraph
  }

  void ungroupRenamesTakenIdsAndWritesPromotedValues() {
    GraphDocument doc;
    chain(doc);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    auto sub = std::make_shared<Subgraph>(subgraph::of(*doc.node("block1")));
    sub->promoted.append({"gain", "a2", "value", {}});
    doc.setSubgraph("block1", sub);
    doc.setParam("block1", "gain", 100);
    doc.addNode(makeNode("a1", "TestConst"));  // a1 is taken outside now
    apply(doc, subgraph::ungroup(doc, "block1"));
    const GraphNode* renamed = doc.node("a4");  // "a" and the smallest free number
    QVERIFY(renamed);
    QCOMPARE(renamed->type, QStringLiteral("TestAdd"));
    QVERIFY(wireSet(doc).contains("c1.out -> a4.a"));
    QVERIFY(wireSet(doc).contains("a4.out -> a2.a"));
    QCOMPARE(doc.node("a2")->params.value("value").toInt(), 100);
  }

  void aGroupedGraphRunsAsTheOriginalAndNamesInnerNodesByPath() {
    GraphDocument plain;
    chain(plain);
    const QJsonObject expected = run(plain);
    QCOMPARE(valueOf(expected, "a3"), 91.0);

    GraphDocument doc;
    chain(doc);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    const QJsonObject report = run(doc);
    QVERIFY2(report.value("ok").toBool(), QJsonDocument(report).toJson().constData());
    const QJsonObject nodes = report.value("nodes").toObject();
    const QStringList ids = nodes.keys();
    QCOMPARE(QSet<QString>(ids.begin(), ids.end()),
             (QSet<QString>{"c1", "c2", "block1/a1", "block1/a2", "a3"}));
    QCOMPARE(valueOf(report, "block1/a1"), 9.0);
    QCOMPARE(valueOf(report, "block1/a2"), 90.0);
    QCOMPARE(valueOf(report, "a3"), valueOf(expected, "a3"));
    // Stats come from spans tagged with the path.
    QVERIFY(nodes.value("block1/a1").toObject().value("calls").toInt() >= 1);
  }

  void errorsAndIssuesNameTheInnerNodeByPath() {
    GraphDocument doc;
    chain(doc);
    doc.setParam("a2", "throw", true);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    const QJsonObject report = run(doc);
    QVERIFY(!report.value("ok").toBool());
    QCOMPARE(report.value("error").toString(), QStringLiteral("block1/a2: TestAdd threw as asked"));
    QCOMPARE(report.value("nodes").toObject().value("a3").toObject().value("status").toString(),
             QStringLiteral("skipped"));

    // Validation: a param out of range inside, an inner input left open.
    GraphDocument bad;
    chain(bad);
    bad.setParam("a1", "repeat", 0);
    apply(bad, subgraph::group(bad, {"a1", "a2"}, "block1"));
    bad.removeConnection(wire("c1.out", "block1.a"));
    const ValidationReport r = validate(bad, testRegistry());
    QVERIFY2(issueTexts(r).contains("block1/a1: params.repeat: 0 is below the minimum 1"),
             qPrintable(issueTexts(r).join("\n")));
    QVERIFY2(issueTexts(r).contains("block1/a1: inputs.a: required input is not connected (Scalar)"),
             qPrintable(issueTexts(r).join("\n")));
    QCOMPARE(r.errors().size(), 2);
  }

  void promotedParamsSetTheInnerParamAndHaveItsSpec() {
    GraphDocument doc;
    chain(doc);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    auto sub = std::make_shared<Subgraph>(subgraph::of(*doc.node("block1")));
    sub->promoted.append({"gain", "a2", "value", {}});
    sub->promoted.append({"jobs", "a1", "repeat", {}});
    doc.setSubgraph("block1", sub);
    const NodeTypeSpec spec = subgraph::spec(*doc.node("block1"), testRegistry());
    QCOMPARE(spec.params.size(), 2);
    QCOMPARE(spec.params[0].name, QStringLiteral("gain"));
    QCOMPARE(spec.params[0].type, ParamType::Float);
    QCOMPARE(spec.params[0].defaultValue.toDouble(), 10.0);  // the inner node's value
    QCOMPARE(spec.params[1].max.value_or(0), 1000.0);        // TestAdd.repeat's range

    doc.setParam("block1", "gain", 5);
    const QJsonObject report = run(doc);
    QCOMPARE(valueOf(report, "block1/a2"), 45.0);  // 9 * 5
    QCOMPARE(valueOf(report, "a3"), 46.0);

    // An out-of-range promoted value is reported on the inner node it lands on; a param that is not
    // promoted is a warning; a promoted param naming no inner node or no param is an error.
    doc.setParam("block1", "jobs", 0);
    doc.setParam("block1", "bogus", 1);
    auto broken = std::make_shared<Subgraph>(*sub);
    broken->promoted.append({"ghost", "nobody", "value", {}});
    broken->promoted.append({"nothing", "a1", "nope", {}});
    doc.setSubgraph("block1", broken);
    const QStringList texts = issueTexts(validate(doc, testRegistry()));
    QVERIFY2(texts.contains("block1/a1: params.repeat: 0 is below the minimum 1"),
             qPrintable(texts.join("\n")));
    QVERIFY(texts.contains(
        "block1: params.bogus: unknown param, ignored (promoted: gain, jobs, ghost, nothing)"));
    QVERIFY(
        texts.contains("block1: subgraph.promoted[2]: promoted param \"ghost\" sets nobody.value: no inner "
                       "node \"nobody\""));
    QVERIFY(
        texts.contains("block1: subgraph.promoted[3]: promoted param \"nothing\" sets a1.nope: a1 (TestAdd) "
                       "has no param \"nope\""));
  }

  void setParamAtReachesInsideSubgraphs() {
    GraphDocument doc;
    doc.addNode(nested(3));
    QCOMPARE(subgraph::nodeAt(doc, "l1/l2/l3/c")->params.value("value").toInt(), 7);
    QVERIFY(!subgraph::nodeAt(doc, "l1/l2/nope"));
    QVERIFY(!subgraph::nodeAt(doc, "l1/l2/l3/c/deeper"));
    const SubgraphPtr before = doc.node("l1")->subgraph;
    QVERIFY(subgraph::setParamAt(doc, "l1/l2/l3/c", "value", 8));
    QCOMPARE(subgraph::nodeAt(doc, "l1/l2/l3/c")->params.value("value").toInt(), 8);
    // The old subgraph is untouched: copies of a document stay independent.
    QCOMPARE(before->nodes[0].subgraph->nodes[0].subgraph->nodes[0].params.value("value").toInt(), 7);
    QVERIFY(!subgraph::setParamAt(doc, "l1/zz", "value", 1));
  }

  void runToHereTakesPathsAndSubgraphNodes() {
    GraphDocument doc;
    chain(doc);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    const auto ids = [&](const QStringList& targets) {
      QStringList out;
      const RunGraph run = runGraph(doc, testRegistry(), targets);  // owns the graph the loop reads
      for (const GraphNode& n : run.graph().nodes()) out.append(n.id);
      out.sort();
      return out;
    };
    QCOMPARE(ids({"block1"}), (QStringList{"block1/a1", "block1/a2", "c1", "c2"}));
    QCOMPARE(ids({"block1/a1"}), (QStringList{"block1/a1", "c1", "c2"}));
    QCOMPARE(ids({"a3"}), (QStringList{"a3", "block1/a1", "block1/a2", "c1", "c2"}));
    QCOMPARE(ids({"nothing"}), QStringList());  // a target that is not there runs nothing, not everything
  }

  void setParamAtWritesThroughPromotedValues() {
    // l1 promotes l2's promoted "v" as "outer" with a value set; l2 promotes c.value as "v" with none set; l3
    // is not involved. Setting c's value must reach the run, so l1's value changes too and l2's stays unset.
    GraphDocument doc;
    GraphNode l1 = nested(2);
    auto l2 = l1.subgraph->nodes[0];
    auto inner = std::make_shared<Subgraph>(*l2.subgraph);
    inner->promoted = {{"v", "c", "value", {}}};
    l2.subgraph = inner;
    auto outer = std::make_shared<Subgraph>(*l1.subgraph);
    outer->nodes = {l2};
    outer->promoted = {{"outer", "l2", "v", {}}};
    l1.subgraph = outer;
    l1.params.insert("outer", 11);
    doc.addNode(l1);
    doc.addNode(makeNode("other", "TestConst", {{"value", 1}}));
    GraphDocument flat;
    subgraph::flatten(doc, flat);
    QCOMPARE(flat.node("l1/l2/c")->params.value("value").toInt(), 11);  // the promoted value runs

    QVERIFY(subgraph::setParamAt(doc, "l1/l2/c", "value", 5));
    subgraph::flatten(doc, flat);
    QCOMPARE(flat.node("l1/l2/c")->params.value("value").toInt(), 5);
    QCOMPARE(doc.node("l1")->params.value("outer").toInt(), 5);
    QVERIFY(!subgraph::nodeAt(doc, "l1/l2")->params.contains("v"));  // unset stays unset
    QCOMPARE(subgraph::nodeAt(doc, "l1/l2/c")->params.value("value").toInt(), 5);
    // Another param of the same node is not promoted: nothing above changes.
    QVERIFY(subgraph::setParamAt(doc, "l1/l2/c", "seed", 3));
    QCOMPARE(doc.node("l1")->params.value("outer").toInt(), 5);
    QCOMPARE(doc.node("l1")->params.size(), 1);
  }

  void nestedSubgraphsThreeDeepFlattenAndRun() {
    GraphDocument doc;
    doc.addNode(nested(3));
    doc.addNode(makeNode("a1", "TestAdd", {{"value", 1}}));
    doc.addConnection(wire("l1.out", "a1.a"));
    GraphDocument flat;
    subgraph::flatten(doc, flat);
    QCOMPARE(flat.nodes().size(), 2);
    QCOMPARE(flat.nodes()[0].id, QStringLiteral("l1/l2/l3/c"));
    QCOMPARE(wireSet(flat), (QSet<QString>{"l1/l2/l3/c.out -> a1.a"}));
    // And with no inputs at all, the subgraph still runs: 7 + 1.
    const QJsonObject report = run(doc);
    QVERIFY(report.value("ok").toBool());
    QCOMPARE(valueOf(report, "a1"), 8.0);
    QCOMPARE(valueOf(report, "l1/l2/l3/c"), 7.0);
  }

  void aCycleThroughASubgraphIsReportedOnPaths() {
    GraphDocument doc;
    chain(doc);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    doc.removeConnection(wire("c2.out", "block1.b"));
    doc.addConnection(wire("a3.out", "block1.b"));  // a3 feeds back into the subgraph
    const ValidationReport r = validate(doc, testRegistry());
    const QStringList texts = issueTexts(r);
    // Reported on each node of the cycle, by path, the same message each time.
    const QString cycle = QStringLiteral("cycle: a3 -> block1/a1 -> block1/a2 -> a3");
    for (const QString& node : QStringList{"a3", "block1/a1", "block1/a2"})
      QVERIFY2(texts.contains(node + ": " + cycle), qPrintable(texts.join("\n")));
    QVERIFY(!r.ok());
    QVERIFY(!run(doc).value("ok").toBool());
  }

  void boundaryPortsNamingMissingInnerNodesAreErrors() {
    GraphDocument doc;
    doc.addNode(makeNode("c1", "TestConst"));
    doc.addNode(subgraphNode("block1", {makeNode("a1", "TestAdd")}, {}, {{"x", {{"ghost", "a"}}, {}}},
                             {{"y", {"phantom", "out"}, {}}}));
    doc.addNode(makeNode("a2", "TestAdd"));
    doc.addConnection(wire("c1.out", "block1.x"));
    doc.addConnection(wire("block1.y", "a2.a"));
    doc.addConnection(wire("c1.out", "block1.nope"));
    const QStringList texts = issueTexts(validate(doc, testRegistry()));
    QVERIFY2(texts.contains("block1: subgraph.inputs[0]: input \"x\" feeds ghost.a: no inner node \"ghost\""),
             qPrintable(texts.join("\n")));
    QVERIFY(
        texts.contains("block1: subgraph.outputs[0]: output \"y\" comes from phantom.out: no inner node "
                       "\"phantom\""));
    QVERIFY(
        texts.contains("block1: connections[2]: c1.out -> block1.nope: block1 (Subgraph) has no input "
                       "\"nope\" (inputs: x)"));
  }

  void idsWithTheSeparatorAndBlocksContainingThemselvesAreRefused() {
    GraphDocument doc;
    GraphNode inner = nested(2);
    auto sub = std::make_shared<Subgraph>(subgraph::of(inner));
    sub->block = {"Loop", "h1"};
    auto innerSub = std::make_shared<Subgraph>(subgraph::of(sub->nodes[0]));
    innerSub->block = {"Loop", "h1"};  // an instance of Loop inside Loop
    sub->nodes[0].subgraph = innerSub;
    inner.subgraph = sub;
    doc.addNode(inner);
    doc.addNode(subgraphNode("block2", {makeNode("a/b", "TestConst")}, {}, {}, {}));
    const QStringList texts = issueTexts(validate(doc, testRegistry()));
    QVERIFY2(texts.contains("l1/l2: subgraph.block: block \"Loop\" contains an instance of itself; a block "
                            "cannot be defined by itself"),
             qPrintable(texts.join("\n")));
    QVERIFY(texts.contains("block2: id: id \"a/b\" holds '/', which joins the ids of a path (block1/conv2)"));
  }

  void formatVersion2RoundTripsAndV1StaysV1() {
    GraphDocument doc;
    chain(doc);
    doc.setName("chain");
    const QByteArray v1 = ser::save(doc);
    QVERIFY(v1.contains("\"version\": 1,"));  // no subgraph: still readable by a version-1 build
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    auto sub = std::make_shared<Subgraph>(subgraph::of(*doc.node("block1")));
    sub->promoted.append({"gain", "a2", "value", {{"note", "kept"}}});
    sub->block = {"Gain", "0123456789abcdef"};
    sub->extra.insert("comments", QJsonArray{QJsonObject{{"id", "c1"}}});
    doc.setSubgraph("block1", sub);
    const QByteArray v2 = ser::save(doc);
    QVERIFY(v2.contains("\"version\": 2,"));
    // The inner graph is written one node per line, indented under its node.
    QVERIFY2(v2.contains("\"subgraph\": {\n      \"inputs\": [{\"name\": \"a\", \"to\": [\"a1.a\"]}"),
             v2.constData());
    QVERIFY(v2.contains("\n        {\"id\": \"a1\", \"type\": \"TestAdd\""));
    GraphDocument back;
    QString error;
    QVERIFY2(ser::load(v2, back, &error), qPrintable(error));
    QCOMPARE(ser::save(back), v2);
    const Subgraph& read = subgraph::of(*back.node("block1"));
    QCOMPARE(read.promoted[0].extra.value("note").toString(), QStringLiteral("kept"));
    QCOMPARE(read.block.name, QStringLiteral("Gain"));
    QCOMPARE(read.nodes.size(), 2);
    QCOMPARE(read.outputs[0].source, (Endpoint{"a2", "out"}));

    // Nested three deep round trips too.
    GraphDocument deep;
    deep.addNode(nested(3));
    const QByteArray deepBytes = ser::save(deep);
    GraphDocument deepBack;
    QVERIFY(ser::load(deepBytes, deepBack, &error));
    QCOMPARE(ser::save(deepBack), deepBytes);
    QVERIFY(subgraph::nodeAt(deepBack, "l1/l2/l3/c"));
  }

  void v1FilesLoadUnchangedAndAV2FileIsRefusedByAV1Reader() {
    const QByteArray v1 = R"({"format": "gpunodes-graph", "version": 1, "nodes": [
      {"id": "c1", "type": "TestConst", "position": [0, 0], "params": {"value": 2}}], "connections": []})";
    GraphDocument doc;
    QString error;
    QVERIFY2(ser::load(v1, doc, &error), qPrintable(error));
    QCOMPARE(doc.nodes().size(), 1);
    QVERIFY(ser::save(doc).contains("\"version\": 1,"));

    // The check a version-1 build makes, and this build's for a version 3 file: the same message.
    QCOMPARE(ser::versionProblem(2, 1),
             QStringLiteral("version 2 is newer than this build (1); update gpunodes to "
                            "open it"));
    QCOMPARE(ser::versionProblem(1, 1), QString());
    QCOMPARE(ser::versionProblem(2), QString());
    GraphDocument three;
    QVERIFY(!ser::load(R"({"format": "gpunodes-graph", "version": 3})", three, &error));
    QCOMPARE(error, QStringLiteral("version 3 is newer than this build (2); update gpunodes to open it"));

    // Subgraphs in a file that says version 1, a subgraph field on another node, a Subgraph without one.
    const auto refused = [](const QByteArray& nodes, int version = 2) {
      GraphDocument d;
      QString e;
      const QByteArray bytes = R"({"format": "gpunodes-graph", "version": )" + QByteArray::number(version) +
                               R"(, "nodes": )" + nodes + "}";
      return ser::load(bytes, d, &e) ? QString() : e;
    };
    QCOMPARE(refused(R"([{"id": "b", "type": "Subgraph", "subgraph": {}}])", 1),
             QStringLiteral("nodes[0].subgraph: subgraphs need format version 2, the file says 1"));
    QCOMPARE(
        refused(R"([{"id": "c", "type": "TestConst", "subgraph": {}}])"),
        QStringLiteral("nodes[0].subgraph: only a node of type Subgraph has one (node c is a TestConst)"));
    QCOMPARE(refused(R"([{"id": "b", "type": "Subgraph"}])"),
             QStringLiteral("nodes[0].subgraph: missing (node b is a Subgraph)"));
    QCOMPARE(refused(R"([{"id": "b", "type": "Subgraph", "subgraph": {"nodes": [{"id": 1}]}}])"),
             QStringLiteral("nodes[0].subgraph.nodes[0].id: expected a string, got 1"));
    QCOMPARE(
        refused(R"([{"id": "b", "type": "Subgraph", "subgraph": {"inputs": [{"name": "x", "to": "a"}]}}])"),
        QStringLiteral("nodes[0].subgraph.inputs[0].to: expected a list of \"node.port\", got \"a\""));
    QCOMPARE(refused(R"([{"id": "b", "type": "Subgraph", "subgraph": {"outputs": [{"name": 3}]}}])"),
             QStringLiteral("nodes[0].subgraph.outputs[0].name: expected a string, got 3"));
  }

  void nestingPastTheLimitIsRefusedWhenRead() {
    const auto bomb = [](int depth) {
      QByteArray node = R"({"id": "c", "type": "TestConst"})";
      for (int i = 0; i < depth; ++i)
        node = R"({"id": "s", "type": "Subgraph", "subgraph": {"nodes": [)" + node + "]}}";
      return R"({"format": "gpunodes-graph", "version": 2, "nodes": [)" + node + "]}";
    };
    GraphDocument doc;
    QString error;
    QVERIFY2(ser::load(bomb(subgraph::kMaxDepth), doc, &error), qPrintable(error));
    QVERIFY(!ser::load(bomb(subgraph::kMaxDepth + 1), doc, &error));
    QVERIFY2(error.endsWith(
                 QStringLiteral("subgraphs nested more than %1 deep (node s)").arg(subgraph::kMaxDepth)),
             qPrintable(error));
    // As deep as JSON allows: refused at once, by the same limit.
    QVERIFY(!ser::load(bomb(200), doc, &error));
    QVERIFY(error.contains("nested more than"));
  }

  void theLibrarySavesListsAndUpdatesBlocks() {
    GraphDocument doc;
    chain(doc);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    subgraph::LibraryBlock saved;
    QString error;
    QVERIFY2(subgraph::saveBlock(*doc.node("block1"), "Gain", &saved, &error), qPrintable(error));
    QCOMPARE(saved.path, QDir(subgraph::libraryDir()).filePath("Gain.json"));
    QVERIFY(saved.path.contains(QStandardPaths::writableLocation(QStandardPaths::AppDataLocation)));
    QVERIFY(!subgraph::saveBlock(*doc.node("block1"), "not valid", &saved, &error));
    QVERIFY(error.contains("block name"));

    QList<subgraph::LibraryBlock> library = subgraph::listLibrary();
    // The shipped blocks come first; the user's follow.
    library.erase(std::remove_if(library.begin(), library.end(), [](const auto& b) { return b.shipped; }),
                  library.end());
    QCOMPARE(library.size(), 1);
    QCOMPARE(library[0].name, QStringLiteral("Gain"));
    QCOMPARE(library[0].hash, saved.hash);
    QCOMPARE(library[0].hash, subgraph::contentHash(subgraph::of(*doc.node("block1"))));

    GraphNode instance = subgraph::instantiate(library[0], "gain1", {10, 20});
    QCOMPARE(subgraph::of(instance).block.name, QStringLiteral("Gain"));
    QVERIFY(!subgraph::outOfDate(instance, library));

    // The block file changes (a2 multiplies by 20 now): the instance is out of date, and updating keeps the
    // promoted values that still exist.
    GraphDocument blockDoc;
    QVERIFY(ser::loadFile(saved.path, blockDoc, &error));
    auto changed = std::make_shared<Subgraph>(subgraph::of(blockDoc.nodes()[0]));
    changed->nodes[1].params.insert("value", 20);
    changed->promoted.append({"gain", "a2", "value", {}});
    blockDoc.setSubgraph(blockDoc.nodes()[0].id, changed);
    QVERIFY(ser::saveFile(saved.path, blockDoc, &error));
    QList<subgraph::LibraryBlock> after = subgraph::listLibrary();
    after.erase(std::remove_if(after.begin(), after.end(), [](const auto& b) { return b.shipped; }), after.end());
    QVERIFY(after[0].hash != saved.hash);
    instance.params = {{"gain", 3}, {"gone", 1}};
    QVERIFY(subgraph::outOfDate(instance, after));
    const GraphNode fresh = subgraph::updated(instance, after[0]);
    QCOMPARE(fresh.id, QStringLiteral("gain1"));
    QCOMPARE(fresh.position, QPointF(10, 20));
    QCOMPARE(fresh.params, (QJsonObject{{"gain", 3}}));
    QCOMPARE(subgraph::of(fresh).node("a2")->params.value("value").toInt(), 20);
    QVERIFY(!subgraph::outOfDate(fresh, after));
  }

  // d2l's two transformer blocks ship with gpunodes: listed, readable, each a Subgraph with promoted heads,
  // widths and dropout; a user's block of the same name takes the shipped one's place.
  void theShippedTransformerBlocksAreInTheLibrary() {
    QStringList errors;
    const QList<subgraph::LibraryBlock> library = subgraph::listLibrary(&errors);
    QVERIFY2(errors.isEmpty(), qPrintable(errors.join("; ")));
    for (const QString name : {"ViTBlock", "TransformerEncoderBlock"}) {
      auto it = std::find_if(library.begin(), library.end(), [&](const auto& b) { return b.name == name; });
      QVERIFY2(it != library.end(), qPrintable(name));
      QVERIFY(it->shipped);
      QVERIFY(it->path.startsWith(subgraph::shippedLibraryDir()));
      QStringList promoted;
      for (const auto& p : subgraph::of(it->node).promoted) promoted.append(p.name);
      for (const QString want : {"num_heads", "width", "mlp_hiddens", "dropout", "causal"})
        QVERIFY2(promoted.contains(want), qPrintable(name + " lacks " + want));
    }
    GraphDocument doc;
    chain(doc);
    apply(doc, subgraph::group(doc, {"a1", "a2"}, "block1"));
    subgraph::LibraryBlock saved;
    QString error;
    QVERIFY2(subgraph::saveBlock(*doc.node("block1"), "ViTBlock", &saved, &error), qPrintable(error));
    const QList<subgraph::LibraryBlock> mine = subgraph::listLibrary();
    QCOMPARE(std::count_if(mine.begin(), mine.end(), [](const auto& b) { return b.name == "ViTBlock"; }), 1);
    auto it = std::find_if(mine.begin(), mine.end(), [](const auto& b) { return b.name == "ViTBlock"; });
    QVERIFY(!it->shipped);
    QCOMPARE(it->hash, saved.hash);
    QVERIFY(QFile::remove(saved.path));
  }

  void aBlockThatContainsItselfIsRefused() {
    GraphDocument doc;
    chain(doc);
    apply(doc, subgraph::group(doc, {"a1"}, "inner"));
    auto innerSub = std::make_shared<Subgraph>(subgraph::of(*doc.node("inner")));
    innerSub->block = {"Selfish", "x"};
    doc.setSubgraph("inner", innerSub);
    apply(doc, subgraph::group(doc, {"inner", "a2"}, "outer"));
    subgraph::LibraryBlock saved;
    QString error;
    QVERIFY(!subgraph::saveBlock(*doc.node("outer"), "Selfish", &saved, &error));
    QCOMPARE(error,
             QStringLiteral("block \"Selfish\" would contain an instance of itself (outer/inner); a block "
                            "cannot be defined by itself"));
    // Written by hand into the library, it is refused when read, and the rest of the library still lists.
    QVERIFY(subgraph::saveBlock(*doc.node("outer"), "Other", &saved, &error));
    QFile::copy(saved.path, QDir(subgraph::libraryDir()).filePath("Selfish.json"));
    subgraph::LibraryBlock read;
    QVERIFY(!subgraph::readBlock(QDir(subgraph::libraryDir()).filePath("Selfish.json"), read, &error));
    QVERIFY2(
        error.endsWith("block \"Selfish\" contains an instance of itself (Other/inner); a block cannot be "
                       "defined by itself"),
        qPrintable(error));
    QStringList errors;
    const QList<subgraph::LibraryBlock> library = subgraph::listLibrary(&errors);
    QCOMPARE(errors.size(), 1);
    QVERIFY(!library.isEmpty());
    // A graph file is not a block file unless it holds exactly one Subgraph node.
    const QString two = QDir(subgraph::libraryDir()).filePath("Two.json");
    QVERIFY(ser::saveFile(two, doc, &error));
    QVERIFY(!subgraph::readBlock(two, read, &error));
    QVERIFY(error.contains("exactly one Subgraph node, this one has 4 node(s)"));
  }
};

QTEST_GUILESS_MAIN(SubgraphTest)
#include "test_subgraph.moc"
