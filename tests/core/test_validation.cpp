// Validation before a run: every problem, per node, in one pass. One test per kind of problem, then all of
// them in one graph.
#include <QElapsedTimer>
#include <QJsonArray>
#include <QtTest>
#include <cmath>
#include <limits>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/validation.h"
#include "test_support.h"

using namespace gn::core;
using gn::test::makeNode;
using gn::test::testRegistry;
using gn::test::wire;

namespace {

// c1 (TestConst) -> a1 (TestAdd): valid.
void baseGraph(GraphDocument& doc) {
  doc.addNode(makeNode("c1", "TestConst"));
  doc.addNode(makeNode("a1", "TestAdd"));
  doc.addConnection(wire("c1.out", "a1.a"));
}

// The issue texts, for failure messages and containment checks.
QStringList texts(const ValidationReport& r) {
  QStringList out;
  for (const Issue& i : r.issues())
    out.append(QStringLiteral("%1%2").arg(i.severity == Issue::Severity::Warning ? "W " : "", i.text()));
  return out;
}

ValidationReport check(const GraphDocument& doc) {
  return validate(doc, testRegistry());
}

QString paramError(const QJsonObject& params) {
  GraphDocument doc;
  baseGraph(doc);
  doc.setParams("a1", params);
  const QList<Issue> errors = check(doc).errors();
  return errors.size() == 1 ? errors[0].text() : texts(check(doc)).join(" | ");
}

}  // namespace

class ValidationTest : public QObject {
  Q_OBJECT

 private slots:
  void aNodeThatCannotBeBypassedIsAnErrorNamingNodeAndPort() {
    GraphDocument doc;
    baseGraph(doc);
    doc.addNode(makeNode("a2", "TestAdd"));
    doc.addConnection(wire("a1.out", "a2.a"));
    // TestConst has no inputs: nothing to pass on to its out, which a1 needs.
    doc.setBypassed("c1", true);
    ValidationReport r = check(doc);
    QVERIFY(!r.ok());
    const QList<Issue> errors = r.forNode("c1");
    QVERIFY2(errors.size() == 1, qPrintable(texts(r).join("\n")));
    QCOMPARE(errors[0].field, QString("outputs.out"));
    QCOMPARE(errors[0].message,
             QString("cannot be bypassed: output out (Scalar) has no input of that type to "
                     "pass on"));
    // A bypassed TestAdd passes a on; with a open there is nothing to pass.
    doc.setBypassed("c1", false);
    doc.removeConnection(wire("c1.out", "a1.a"));
    doc.setBypassed("a1", true);
    r = check(doc);
    QVERIFY2(r.forNode("a1").size() == 1, qPrintable(texts(r).join("\n")));
    QCOMPARE(
        r.forNode("a1")[0].text(),
        QString("a1: outputs.out: cannot be bypassed: output out passes on input a, which is not connected"));
    // Wired, it validates: a2 takes c1's value.
    doc.addConnection(wire("c1.out", "a1.a"));
    r = check(doc);
    QVERIFY2(r.ok(), qPrintable(texts(r).join("\n")));
    // Muted nodes and their dependents are not validated: they do not run.
    doc.setParam("a2", "repeat", -5);
    QVERIFY(!check(doc).ok());
    doc.setMuted("a2", true);
    QVERIFY2(check(doc).ok(), qPrintable(texts(check(doc)).join("\n")));
  }

  void aValidGraphHasNoIssues() {
    GraphDocument doc;
    baseGraph(doc);
    const ValidationReport r = check(doc);
    QVERIFY2(r.issues().isEmpty(), qPrintable(texts(r).join("\n")));
    QVERIFY(r.ok());
  }

  void unknownTypeIsAnErrorAndTheRestStillValidates() {
    GraphDocument doc;
    baseGraph(doc);
    doc.addNode(makeNode("f1", "Foo"));
    doc.addConnection(wire("f1.out", "a1.b"));  // a missing node's ports are unknown: no port error
    doc.setParam("a1", "repeat", 0);
    const ValidationReport r = check(doc);
    QCOMPARE(texts(r), (QStringList{"f1: type: unknown node type \"Foo\" (no plugin provides it)",
                                    "a1: params.repeat: 0 is below the minimum 1"}));
  }

  void duplicateIds() {
    GraphDocument doc;
    baseGraph(doc);
    QList<GraphNode> nodes = doc.nodes();
    nodes.append(makeNode("c1", "TestConst"));
    doc.setContents(nodes, doc.connections());
    QCOMPARE(texts(check(doc)), QStringList{"c1: id: duplicate id \"c1\" (nodes[0], nodes[2])"});
  }

  void invalidIds() {
    GraphDocument doc;
    // a.1 cannot be wired to at all, so its unwired required input is not a second error.
    doc.setContents({makeNode("a.b", "TestConst"), makeNode("", "TestConst"), makeNode("a.1", "TestAdd")},
                    {});
    const QStringList t = texts(check(doc));
    QCOMPARE(t.size(), 3);
    QVERIFY2(t[0].startsWith("a.b: nodes[0].id: invalid id \"a.b\""), qPrintable(t[0]));
    QVERIFY2(t[1].startsWith("nodes[1].id: invalid id \"\""), qPrintable(t[1]));
  }

  void danglingConnectionToAMissingNode() {
    GraphDocument doc;
    baseGraph(doc);
    doc.addConnection(wire("x9.out", "a1.b"));
    doc.addConnection(wire("c1.out", "zz.a"));
    doc.addConnection(wire("p.out", "q.a"));
    QCOMPARE(texts(check(doc)), (QStringList{"a1: connections[1]: x9.out -> a1.b: no node \"x9\"",
                                             "c1: connections[2]: c1.out -> zz.a: no node \"zz\"",
                                             "connections[3]: p.out -> q.a: no node \"p\"",
                                             "connections[3]: p.out -> q.a: no node \"q\""}));
  }

  void danglingConnectionToAMissingPort() {
    GraphDocument doc;
    baseGraph(doc);
    doc.addConnection(wire("c1.nope", "a1.b"));
    doc.addConnection(wire("c1.out", "a1.zz"));
    QCOMPARE(
        texts(check(doc)),
        (QStringList{
            "a1: connections[1]: c1.nope -> a1.b: c1 (TestConst) has no output \"nope\" (outputs: out, dev)",
            "a1: connections[2]: c1.out -> a1.zz: a1 (TestAdd) has no input \"zz\" (inputs: a, b, "
            "devices)"}));
  }

  void aDanglingWireIsOneErrorNotTwo() {
    GraphDocument doc;
    baseGraph(doc);
    doc.addConnection(wire("ghost.out", "a1.a"));  // a second wire into a, from nowhere
    doc.addConnection(wire("c1.nope", "a1.a"));    // and one from a port that does not exist
    QCOMPARE(texts(check(doc)), (QStringList{"a1: connections[1]: ghost.out -> a1.a: no node \"ghost\"",
                                             "a1: connections[2]: c1.nope -> a1.a: c1 (TestConst) has no "
                                             "output \"nope\" (outputs: out, dev)"}));
    GraphDocument only;
    only.addNode(makeNode("a1", "TestAdd"));
    only.addConnection(wire("ghost.out", "a1.a"));  // wired, if badly: not also "not connected"
    QCOMPARE(texts(check(only)), QStringList{"a1: connections[0]: ghost.out -> a1.a: no node \"ghost\""});
  }

  void portTypeMismatch() {
    GraphDocument doc;
    baseGraph(doc);
    doc.addConnection(wire("c1.dev", "a1.b"));
    doc.addConnection(wire("c1.dev", "a1.devices"));  // a Device feeds a Devices input: fine
    QCOMPARE(texts(check(doc)),
             QStringList{"a1: connections[1]: type mismatch: c1.dev gives Device, a1.b takes Scalar"});
  }

  void requiredInputUnconnected() {
    GraphDocument doc;
    doc.addNode(makeNode("a1", "TestAdd"));  // a required, b and devices optional
    QCOMPARE(texts(check(doc)), QStringList{"a1: inputs.a: required input is not connected (Scalar)"});
  }

  void twoWiresIntoOneInput() {
    GraphDocument doc;
    baseGraph(doc);
    doc.addNode(makeNode("c2", "TestConst"));
    doc.addConnection(wire("c2.out", "a1.a"));
    QCOMPARE(texts(check(doc)), QStringList{"a1: inputs.a: 2 wires into one input (from c1.out, c2.out)"});
  }

  void cyclesNameTheirNodes() {
    GraphDocument doc;
    for (const char* id : {"a1", "a2", "a3", "a4"}) doc.addNode(makeNode(id, "TestAdd"));
    doc.addConnection(wire("a1.out", "a2.a"));
    doc.addConnection(wire("a2.out", "a3.a"));
    doc.addConnection(wire("a3.out", "a1.a"));
    doc.addConnection(wire("a4.out", "a4.a"));  // a self-loop
    QCOMPARE(texts(check(doc)),
             (QStringList{"a1: cycle: a1 -> a2 -> a3 -> a1", "a2: cycle: a1 -> a2 -> a3 -> a1",
                          "a3: cycle: a1 -> a2 -> a3 -> a1", "a4: cycle: a4 -> a4"}));
  }

  void twoCyclesThroughOneNodeAreBothNamed() {
    GraphDocument doc;
    for (const char* id : {"a1", "a2", "a3"}) doc.addNode(makeNode(id, "TestAdd"));
    doc.addConnection(wire("a1.out", "a2.a"));
    doc.addConnection(wire("a2.out", "a1.a"));
    doc.addConnection(wire("a1.out", "a3.a"));
    doc.addConnection(wire("a3.out", "a1.b"));
    QCOMPARE(texts(check(doc)), (QStringList{"a1: cycle: a1 -> a2 -> a1", "a2: cycle: a1 -> a2 -> a1",
                                             "a3: cycle: a3 -> a1 -> a3"}));
  }

  void aLongCycleIsFoundQuicklyAndNamedShort() {
    GraphDocument doc;
    constexpr int kNodes = 100000;
    QList<GraphNode> nodes;
    QList<GraphConnection> conns;
    for (int i = 0; i < kNodes; ++i) {
      nodes.append(makeNode(QStringLiteral("n%1").arg(i), "TestAdd"));
      conns.append(wire(QStringLiteral("n%1.out").arg(i), QStringLiteral("n%1.a").arg((i + 1) % kNodes)));
    }
    doc.setContents(nodes, conns);
    QElapsedTimer timer;
    timer.start();
    const ValidationReport r = check(doc);
    // A hang detector, not a benchmark: a quadratic walk over 10^5 nodes takes minutes, a linear one well
    // under a second on a quiet machine. The bound leaves room for a loaded CI machine.
    QVERIFY2(timer.elapsed() < 10000 * kTimeScale, qPrintable(QString::number(timer.elapsed())));
    QCOMPARE(r.errors().size(), kNodes);
    const QString text = r.errors()[0].message;
    QCOMPARE(text, QStringLiteral("cycle: n0 -> n1 -> n2 -> n3 -> n4 -> n5 -> n6 -> n7 -> n8 -> n9 -> ... -> "
                                  "n99999 -> n0 (100000 nodes)"));
  }

  void hugeNamesAreCutShortInMessages() {
    const QString huge(10 * 1000 * 1000, u'x');
    GraphDocument doc;
    doc.setContents({makeNode(huge, huge, {{huge, 1}}), makeNode("a1", "TestAdd", {{huge, 1}})},
                    {wire(huge + ".out", "a1.a"), wire("a1.out", "a1." + huge)});
    const ValidationReport r = check(doc);
    QVERIFY(r.issues().size() >= 4);
    for (const Issue& i : r.issues()) QVERIFY2(i.text().size() < 400, qPrintable(i.text().left(400)));
  }

  void unknownParamIsAWarning() {
    GraphDocument doc;
    baseGraph(doc);
    doc.setParam("a1", "colour", "red");
    const ValidationReport r = check(doc);
    QVERIFY(r.ok());
    QCOMPARE(texts(r), QStringList{"W a1: params.colour: unknown param, ignored (TestAdd has: value, repeat, "
                                   "delay_ms, throw, fail, label, mode, shape)"});
  }

  void paramOfTheWrongJsonType() {
    QCOMPARE(paramError({{"repeat", "5"}}),
             QStringLiteral("a1: params.repeat: expected an integer, got \"5\""));
    QCOMPARE(paramError({{"repeat", 2.5}}),
             QStringLiteral("a1: params.repeat: expected an integer, got 2.5"));
    QCOMPARE(paramError({{"value", true}}), QStringLiteral("a1: params.value: expected a number, got true"));
    QCOMPARE(paramError({{"throw", 1}}), QStringLiteral("a1: params.throw: expected true or false, got 1"));
    QCOMPARE(paramError({{"label", QJsonArray{}}}),
             QStringLiteral("a1: params.label: expected a string, got an array"));
    QCOMPARE(paramError({{"mode", QJsonValue()}}),
             QStringLiteral("a1: params.mode: null is not one of: add, mul"));
  }

  void nanAndInfParams() {
    QCOMPARE(paramError({{"value", std::numeric_limits<double>::quiet_NaN()}}),
             QStringLiteral("a1: params.value: must be a finite number, got nan"));
    QCOMPARE(paramError({{"repeat", std::numeric_limits<double>::infinity()}}),
             QStringLiteral("a1: params.repeat: must be a finite number, got inf"));
  }

  void paramOutOfRange() {
    QCOMPARE(paramError({{"repeat", 0}}), QStringLiteral("a1: params.repeat: 0 is below the minimum 1"));
    QCOMPARE(paramError({{"repeat", qint64(1000000000000)}}),
             QStringLiteral("a1: params.repeat: 1000000000000 is above the maximum 1000"));
    QCOMPARE(paramError({{"value", -2e6}}),
             QStringLiteral("a1: params.value: -2000000 is below the minimum -1000000"));
  }

  void enumValueNotAllowed() {
    QCOMPARE(paramError({{"mode", "div"}}),
             QStringLiteral("a1: params.mode: \"div\" is not one of: add, mul"));
  }

  void badShapes() {
    QCOMPARE(
        paramError({{"shape", "100x100"}}),
        QStringLiteral(
            "a1: params.shape: expected a shape, an array of integers like [100, 100], got \"100x100\""));
    QCOMPARE(paramError({{"shape", QJsonArray{2, -1}}}),
             QStringLiteral("a1: params.shape: dimension 1: -1 is negative"));
    QCOMPARE(paramError({{"shape", QJsonArray{0}}}),
             QStringLiteral("a1: params.shape: dimension 0: 0 is below the minimum 1"));
    QCOMPARE(paramError({{"shape", QJsonArray{1.5}}}),
             QStringLiteral("a1: params.shape: dimension 0: expected an integer, got 1.5"));
    QCOMPARE(paramError({{"shape", QJsonArray{1e9, 1e9, 1e9}}}),
             QStringLiteral("a1: params.shape: 3 dimensions multiply to more than 2^63 elements"));
    QCOMPARE(paramError({{"shape", QJsonArray{2e9}}}),
             QStringLiteral("a1: params.shape: dimension 0: 2000000000 is above the maximum 1000000000"));
  }

  void theNodeTypesOwnChecksRun() {
    QCOMPARE(paramError({{"shape", QJsonArray{1, 1, 1, 1, 1}}}),
             QStringLiteral("a1: params: shape: at most 4 dimensions"));
  }

  void pluginGraphChecksRun() {
    QCOMPARE(paramError({{"label", "forbidden"}}),
             QStringLiteral("a1: params.label: refused by the test plugin's graph check"));
  }

  void aPluginOffersAFixWithItsIssue() {
    GraphDocument doc;
    baseGraph(doc);
    doc.setParams("a1", {{"label", "needs-offset"}});
    const ValidationReport report = check(doc);
    QVERIFY(!report.ok());
    QCOMPARE(texts(report), QStringList{"a1: inputs.a: a needs an offset first"});
    const Issue& issue = report.issues().first();
    QVERIFY(issue.fix.has_value());
    QCOMPARE(issue.fix->label, QStringLiteral("Insert an offset"));
    QCOMPARE(issue.fix->nodeType, QStringLiteral("TestAdd"));
    QCOMPARE(issue.fix->params, (QJsonObject{{"value", 10}}));
    QCOMPARE(issue.fix->input, (Endpoint{"a1", "a"}));
    QCOMPARE(issue.fix->throughInput, QStringLiteral("a"));
    QCOMPARE(issue.fix->throughOutput, QStringLiteral("out"));
    QVERIFY(issue.fix->alsoWired.isEmpty());
    // The host's own issues carry none.
    doc.addNode(makeNode("a2", "TestAdd"));
    for (const Issue& i : check(doc).forNode("a2")) QVERIFY(!i.fix);
  }

  void settingsAreChecked() {
    GraphDocument doc;
    baseGraph(doc);
    doc.setSettings(QJsonObject{{"schedule", "fast"}, {"cpu_devices", 0}});
    QCOMPARE(texts(check(doc)),
             (QStringList{"settings.schedule: \"fast\" is not one of: parallel, sequential",
                          "settings.cpu_devices: 0 is below the minimum 1"}));
    // Run settings (command-line overrides) are what counts when given.
    RunSettings fine = RunSettings::fromGraph(QJsonObject{{"schedule", "sequential"}, {"cpu_devices", 2}});
    QVERIFY(validate(doc, testRegistry(), fine).ok());
    QCOMPARE(fine.cpuDevices, 2);
    QCOMPARE(fine.schedule, QStringLiteral("sequential"));
  }

  void everyProblemIsReportedAtOnce() {
    GraphDocument doc;
    QList<GraphNode> nodes{
        makeNode("c1", "TestConst"),
        makeNode("c1", "TestConst"),                                // duplicate id
        makeNode("f1", "Foo"),                                      // unknown type
        makeNode("a1", "TestAdd", {{"repeat", 0}, {"colour", 1}}),  // range + unknown param
        makeNode("a2", "TestAdd", {{"mode", "div"}}),               // enum; a unconnected
        makeNode("a3", "TestAdd", {{"value", "x"}}),                // type
        makeNode("a4", "TestAdd"),
        makeNode("a5", "TestAdd"),  // a cycle
        makeNode("a6", "TestAdd", {{"shape", QJsonArray{-1}}})};
    QList<GraphConnection> conns{wire("c1.out", "a1.a"),  wire("c1.dev", "a3.a"),  // mismatch
                                 wire("x9.out", "a1.b"),                           // dangling node
                                 wire("c1.nope", "a6.a"),                          // dangling port
                                 wire("a4.out", "a5.a"),  wire("a5.out", "a4.a"),
                                 wire("c1.out", "a6.b"),  wire("c1.out", "a6.b")};  // two wires into b
    doc.setContents(nodes, conns);
    doc.setSettings(QJsonObject{{"schedule", "fast"}});
    const ValidationReport r = check(doc);
    const QString all = texts(r).join("\n");
    for (const char* expected :
         {"settings.schedule: \"fast\" is not one of", "c1: id: duplicate id \"c1\"",
          "f1: type: unknown node type \"Foo\"", "a1: params.repeat: 0 is below the minimum 1",
          "W a1: params.colour: unknown param", "a2: inputs.a: required input is not connected",
          "a2: params.mode: \"div\" is not one of", "a3: params.value: expected a number",
          "a3: connections[1]: type mismatch", "a1: connections[2]: x9.out -> a1.b: no node \"x9\"",
          "a6: connections[3]: c1.nope -> a6.a: c1 (TestConst) has no output \"nope\"",
          "a4: cycle: a4 -> a5 -> a4", "a5: cycle: a4 -> a5 -> a4",
          "a6: params.shape: dimension 0: -1 is negative", "a6: inputs.b: 2 wires into one input"})
      QVERIFY2(all.contains(QString::fromUtf8(expected)),
               qPrintable(QStringLiteral("missing: %1\nin:\n%2").arg(expected, all)));
    QCOMPARE(r.errors().size(), r.issues().size() - 1);  // one warning
    QCOMPARE(r.forNode("a6").size(), 3);
  }

  void checkParamDirectly() {
    ParamSpec count{.name = "n", .type = ParamType::Int, .min = 1, .max = 10};
    QCOMPARE(checkParam(count, 5), QString());
    QCOMPARE(checkParam(count, 11), QStringLiteral("11 is above the maximum 10"));
    ParamSpec free{.name = "x", .type = ParamType::Float};
    QCOMPARE(checkParam(free, 1e300), QString());
    ParamSpec shape{.name = "s", .type = ParamType::Shape};
    QCOMPARE(checkParam(shape, QJsonArray{}), QString());      // a scalar's shape
    QCOMPARE(checkParam(shape, QJsonArray{0, 5}), QString());  // zero is the node type's call, not the host's
    QCOMPARE(checkParam(shape, QJsonArray{"2"}),
             QStringLiteral("dimension 0: expected an integer, got \"2\""));
  }

  void issueText() {
    QCOMPARE((Issue{Issue::Severity::Error, "mm1", "params.repeat", "too big"}.text()),
             QStringLiteral("mm1: params.repeat: too big"));
    QCOMPARE((Issue{Issue::Severity::Error, "", "", "graph problem"}.text()),
             QStringLiteral("graph problem"));
    ValidationReport r;
    r.warning("a", "", "w");
    QVERIFY(r.ok());
    r.error("b", "f", "e");
    QVERIFY(!r.ok());
    QCOMPARE(r.errors().size(), 1);
    QCOMPARE(r.forNode("a").size(), 1);
  }
};

QTEST_GUILESS_MAIN(ValidationTest)
#include "test_validation.moc"
