// The run cache and the run graph on the test node set: keys (what changes a key and what does not),
// reusable against always-run types, the device identity in a key, reuse across runs (counted by the
// NodeStarted events: a node reused never starts), Run all, Run to here, the LRU bound and scopes, and
// bypass and mute (values passed through, statuses, the run still ok).
#include <QElapsedTimer>
#include <QJsonArray>
#include <QtTest>

#include "gpunodes/core/executor.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/run_cache.h"
#include "gpunodes/core/run_graph.h"
#include "test_support.h"

using namespace gn::core;
using gn::test::makeNode;
using gn::test::testRegistry;
using gn::test::wire;
using Kind = RunEvent::Kind;

namespace {

struct Outcome {
  QJsonObject report;
  QSet<QString> started, cached;  // from the events
  bool startedOk = false;
};

Outcome runOnce(const GraphDocument& doc, RunOptions options = {}, RunSettings settings = {}) {
  if (settings.all.isEmpty()) settings = RunSettings::fromGraph(doc.settings());
  Executor ex(testRegistry());
  Outcome o;
  o.startedOk = ex.start(doc, settings, nullptr, options);
  QElapsedTimer timer;
  timer.start();
  bool finished = !o.startedOk;
  while (!finished && timer.elapsed() < 20000)
    for (const RunEvent& e : ex.events().waitAndDrain(50)) {
      if (e.kind == Kind::NodeStarted) o.started.insert(e.node);
      if (e.kind == Kind::NodeCached) o.cached.insert(e.node);
      finished = finished || e.kind == Kind::RunFinished;
    }
  ex.wait();
  o.report = ex.report();
  return o;
}

QJsonObject node(const Outcome& o, const QString& id) {
  return o.report["nodes"].toObject()[id].toObject();
}

// c1 = 2 -> a1 = c1 + 3 -> a2 = a1 + 10;  c2 = 5 -> a3 = c2 + 1
void chain(GraphDocument& doc) {
  doc.addNode(makeNode("c1", "TestConst", {{"value", 2}}));
  doc.addNode(makeNode("a1", "TestAdd", {{"value", 3}}));
  doc.addNode(makeNode("a2", "TestAdd", {{"value", 10}}));
  doc.addNode(makeNode("c2", "TestConst", {{"value", 5}}));
  doc.addNode(makeNode("a3", "TestAdd", {{"value", 1}}));
  doc.addConnection(wire("c1.out", "a1.a"));
  doc.addConnection(wire("a1.out", "a2.a"));
  doc.addConnection(wire("c2.out", "a3.a"));
}

CachedNode entryOf(qint64 bytes, const QString& plugin = QStringLiteral("p")) {
  CachedNode e;
  e.plugin = plugin;
  e.bytes = bytes;
  return e;
}

}  // namespace

class RunCacheTest : public QObject {
  Q_OBJECT

 private slots:
  void keysChangeWithWhatShapesTheOutputs() {
    const QByteArray settings = settingsCacheKey(RunSettings::fromGraph({{"cpu_devices", 2}}));
    const QJsonObject params{{"value", 1.0}, {"mode", "add"}};
    const QList<CacheKeyInput> in{{"a", "K1", "out"}, {"b", "K2", "out"}};
    const QByteArray base = cacheKey("TestAdd", "a1", params, {}, settings, in);
    QCOMPARE(base.size(), 32);  // SHA-256
    // Inputs are by port, in any order.
    QCOMPARE(cacheKey("TestAdd", "a1", params, {}, settings, {in[1], in[0]}), base);
    QVERIFY(cacheKey("TestAdd", "a1", {{"value", 2.0}, {"mode", "add"}}, {}, settings, in) != base);
    QVERIFY(cacheKey("TestAdd", "a2", params, {}, settings, in) != base);
    QVERIFY(cacheKey("TestMul", "a1", params, {}, settings, in) != base);
    QVERIFY(cacheKey("TestAdd", "a1", params, "cuda:0 H200", settings, in) != base);
    QVERIFY(cacheKey("TestAdd", "a1", params, {}, settings, {{"a", "K1", "out"}, {"b", "K3", "out"}}) !=
            base);
    QVERIFY(cacheKey("TestAdd", "a1", params, {}, settings, {{"a", "K2", "out"}, {"b", "K1", "out"}}) !=
            base);
    QVERIFY(cacheKey("TestAdd", "a1", params, {}, settings, {{"a", "K1", "dev"}, {"b", "K2", "out"}}) !=
            base);
    // The schedule changes when work runs, not what it makes; the device count does.
    QCOMPARE(settingsCacheKey(RunSettings::fromGraph({{"cpu_devices", 2}, {"schedule", "sequential"}})),
             settings);
    QVERIFY(settingsCacheKey(RunSettings::fromGraph({{"cpu_devices", 3}})) != settings);
    QVERIFY(settingsCacheKey(RunSettings::fromGraph({{"cpu_devices", 2}, {"use_cuda", false}})) != settings);
  }

  void aSecondRunReusesEveryUnchangedNode() {
    GraphDocument doc;
    chain(doc);
    RunCache cache;
    const Outcome first = runOnce(doc, {.cache = &cache});
    QVERIFY(first.report["ok"].toBool());
    QCOMPARE(first.started, (QSet<QString>{"c1", "a1", "a2", "c2", "a3"}));
    QVERIFY(first.cached.isEmpty());
    QCOMPARE(cache.size(), 5);

    const Outcome second = runOnce(doc, {.cache = &cache});
    QVERIFY(second.report["ok"].toBool());
    QVERIFY2(second.started.isEmpty(), qPrintable(QStringList(second.started.values()).join(", ")));
    QCOMPARE(second.cached, (QSet<QString>{"c1", "a1", "a2", "c2", "a3"}));
    // What the nodes reported comes back with them: the values, the metric points, and no trace spans.
    QCOMPARE(node(second, "a2")["value"].toDouble(), 2.0 + 3 + 10);
    QCOMPARE(node(second, "a2")["cached"].toBool(), true);
    QCOMPARE(node(second, "a2")["status"].toString(), QString("ok"));
    QCOMPARE(node(second, "a2")["calls"].toInt(), 0);
    QCOMPARE(node(first, "a2")["cached"].toBool(), false);
    QCOMPARE(second.report["metrics"].toObject()["test.value"].toArray().size(), 3);
  }

  void aParamChangeRerunsTheNodeAndItsDescendantsOnly() {
    GraphDocument doc;
    chain(doc);
    RunCache cache;
    QVERIFY(runOnce(doc, {.cache = &cache}).report["ok"].toBool());
    doc.setParam("a1", "value", 30);
    const Outcome o = runOnce(doc, {.cache = &cache});
    QCOMPARE(o.started, (QSet<QString>{"a1", "a2"}));
    QCOMPARE(o.cached, (QSet<QString>{"c1", "c2", "a3"}));
    // The re-run descendant saw the new upstream value, not a cached one.
    QCOMPARE(node(o, "a2")["value"].toDouble(), 2.0 + 30 + 10);
    // A param set to its default is the same key as leaving it out.
    doc.setParam("a3", "mode", "add");
    QCOMPARE(runOnce(doc, {.cache = &cache}).started, QSet<QString>());
    // A rewired input changes the key.
    doc.removeConnection(wire("c2.out", "a3.a"));
    doc.addConnection(wire("c1.out", "a3.a"));
    const Outcome rewired = runOnce(doc, {.cache = &cache});
    QCOMPARE(rewired.started, (QSet<QString>{"a3"}));
    QCOMPARE(node(rewired, "a3")["value"].toDouble(), 2.0 + 1);
  }

  void alwaysRunTypesRunAndSoDoesWhatTheyFeed() {
    GraphDocument doc;
    doc.addNode(makeNode("c1", "TestConst", {{"value", 4}}));
    doc.addNode(makeNode("m1", "TestMeasure"));
    doc.addNode(makeNode("a1", "TestAdd", {{"value", 1}}));
    doc.addConnection(wire("c1.out", "m1.a"));
    doc.addConnection(wire("m1.out", "a1.a"));
    RunCache cache;
    QVERIFY(runOnce(doc, {.cache = &cache}).report["ok"].toBool());
    const Outcome o = runOnce(doc, {.cache = &cache});
    QCOMPARE(o.started, (QSet<QString>{"m1", "a1"}));
    QCOMPARE(o.cached, (QSet<QString>{"c1"}));
    QCOMPARE(node(o, "a1")["value"].toDouble(), 5.0);
    QCOMPARE(cache.size(), 1);  // neither m1 nor what it feeds has a key
  }

  void aDeviceThatChangedRerunsWhatUsesIt() {
    GraphDocument doc;
    doc.addNode(makeNode("d1", "TestDevice"));
    doc.addNode(makeNode("c1", "TestConst", {{"value", 1}}));
    doc.addNode(makeNode("a1", "TestAdd"));
    doc.addConnection(wire("d1.device", "a1.devices"));
    doc.addConnection(wire("c1.out", "a1.a"));
    RunCache cache;
    qputenv("GN_TEST_DEVICE_NAME", "gpu0: a big card");
    QVERIFY(runOnce(doc, {.cache = &cache}).report["ok"].toBool());
    QCOMPARE(runOnce(doc, {.cache = &cache}).started, QSet<QString>());
    // The GPU is gone: the same graph and params now resolve to something else.
    qputenv("GN_TEST_DEVICE_NAME", "cpu:0 (fallback)");
    const Outcome o = runOnce(doc, {.cache = &cache});
    qunsetenv("GN_TEST_DEVICE_NAME");
    QCOMPARE(o.started, (QSet<QString>{"d1", "a1"}));
    QCOMPARE(o.cached, (QSet<QString>{"c1"}));
  }

  void settingsThatShapeValuesInvalidateTheScheduleDoesNot() {
    GraphDocument doc;
    chain(doc);
    RunCache cache;
    QVERIFY(runOnce(doc, {.cache = &cache}).report["ok"].toBool());
    doc.setSettings({{"schedule", "sequential"}});
    QCOMPARE(runOnce(doc, {.cache = &cache}).started, QSet<QString>());
    doc.setSettings({{"schedule", "sequential"}, {"cpu_devices", 2}});
    QCOMPARE(runOnce(doc, {.cache = &cache}).started.size(), 5);
  }

  void runAllIgnoresTheCacheAndRefillsIt() {
    GraphDocument doc;
    chain(doc);
    RunCache cache;
    QVERIFY(runOnce(doc, {.cache = &cache}).report["ok"].toBool());
    const Outcome all = runOnce(doc, {.cache = &cache, .reuse = false});
    QCOMPARE(all.started.size(), 5);
    QVERIFY(all.cached.isEmpty());
    QCOMPARE(runOnce(doc, {.cache = &cache}).cached.size(), 5);
  }

  void runToHereRunsTheTargetsAndTheirAncestors() {
    GraphDocument doc;
    chain(doc);
    RunCache cache;
    const Outcome o = runOnce(doc, {.cache = &cache, .targets = {"a1"}});
    QVERIFY(o.report["ok"].toBool());
    QCOMPARE(o.started, (QSet<QString>{"c1", "a1"}));
    const QStringList inReport = o.report["nodes"].toObject().keys();
    QCOMPARE(inReport, (QStringList{"a1", "c1"}));
    // The rest of the graph then reuses what ran.
    const Outcome rest = runOnce(doc, {.cache = &cache});
    QCOMPARE(rest.started, (QSet<QString>{"a2", "c2", "a3"}));
  }

  void withoutACacheEveryRunRunsEverything() {
    GraphDocument doc;
    chain(doc);
    QCOMPARE(runOnce(doc).started.size(), 5);
    QCOMPARE(runOnce(doc).started.size(), 5);
  }

  void theBoundEvictsLeastRecentlyUsedFirst() {
    RunCache cache(250);
    cache.insert("k1", entryOf(100));
    cache.insert("k2", entryOf(100));
    QCOMPARE(cache.bytes(), 200);
    QVERIFY(cache.find("k1"));  // k1 is now the most recently used
    cache.insert("k3", entryOf(100));
    QVERIFY(cache.find("k1") && cache.find("k3"));
    QVERIFY(!cache.find("k2"));
    QCOMPARE(cache.bytes(), 200);
    cache.insert("huge", entryOf(251));  // larger than the whole bound: not kept, nothing evicted for it
    QVERIFY(!cache.find("huge"));
    QCOMPARE(cache.size(), 2);
    cache.insert("k3", entryOf(50));  // replacing an entry counts only the new one
    QCOMPARE(cache.bytes(), 150);
    cache.setMaxBytes(60);
    QCOMPARE(cache.size(), 1);
    QVERIFY(cache.find("k3"));
    cache.clear();
    QCOMPARE(cache.bytes(), 0);
    QCOMPARE(cache.size(), 0);
  }

  void anotherScopeDropsThatPluginsValues() {
    RunCache cache;
    cache.useScope("gpu", "runtime-1");
    cache.insert("g", entryOf(10, "gpu"));
    cache.insert("t", entryOf(10, "test"));
    cache.useScope("gpu", "runtime-1");
    QVERIFY(cache.find("g"));
    cache.useScope("gpu", "runtime-2");
    QVERIFY(!cache.find("g"));
    QVERIFY(cache.find("t"));
    QCOMPARE(cache.bytes(), 10);
  }

  // Dropping a plugin's values walks the hash while it erases: a QHash erase moves other entries, so the walk
  // must go on from the iterator erase returns (it once went on from one taken before, and under one hash
  // seed in ~40 read a moved slot: an assertion in qhash.h). Many entries of two plugins interleaved meet
  // such moves under every seed.
  void anotherScopeDropsEveryValueOfThatPluginAmongMany() {
    RunCache cache;
    cache.useScope("gpu", "runtime-1");
    for (int i = 0; i < 400; ++i) cache.insert(QByteArray::number(i), entryOf(1, i % 3 ? "gpu" : "test"));
    cache.useScope("gpu", "runtime-2");
    for (int i = 0; i < 400; ++i) QCOMPARE(bool(cache.find(QByteArray::number(i))), i % 3 == 0);
    QCOMPARE(cache.bytes(), 134);
  }

  void runsKeepValuesWithinTheBound() {
    GraphDocument doc;
    doc.addNode(makeNode("c1", "TestConst"));
    doc.addNode(makeNode("big", "TestAdd", {{"shape", QJsonArray{1000}}}));  // 8,000 bytes
    doc.addNode(makeNode("small", "TestAdd", {{"shape", QJsonArray{10}}}));
    doc.addConnection(wire("c1.out", "big.a"));
    doc.addConnection(wire("c1.out", "small.a"));
    RunCache cache(1000);
    QVERIFY(runOnce(doc, {.cache = &cache}).report["ok"].toBool());
    QCOMPARE(cache.bytes(), 80);  // c1 claims nothing; big did not fit
    QCOMPARE(runOnce(doc, {.cache = &cache}).started, (QSet<QString>{"big"}));
  }

  void bypassPassesTheFirstInputOfTheSameTypeThrough() {
    GraphDocument doc;
    doc.addNode(makeNode("c1", "TestConst", {{"value", 2}}));
    doc.addNode(makeNode("c2", "TestConst", {{"value", 7}}));
    doc.addNode(makeNode("a1", "TestAdd", {{"value", 100}}));
    doc.addNode(makeNode("a2", "TestAdd", {{"value", 1000}}));
    doc.addNode(makeNode("a3", "TestAdd", {{"value", 1}}));
    doc.addConnection(wire("c1.out", "a1.a"));
    doc.addConnection(wire("c2.out", "a1.b"));
    doc.addConnection(wire("a1.out", "a2.a"));
    doc.addConnection(wire("a2.out", "a3.a"));
    doc.setBypassed("a1", true);
    doc.setBypassed("a2", true);  // a chain: a3 gets what a1 gets on a, its first Scalar input
    const Outcome o = runOnce(doc);
    QVERIFY2(o.report["ok"].toBool(), qPrintable(o.report["error"].toString()));
    QCOMPARE(node(o, "a3")["value"].toDouble(), 2.0 + 1);
    QCOMPARE(node(o, "a1")["status"].toString(), QString("bypassed"));
    QCOMPARE(node(o, "a2")["status"].toString(), QString("bypassed"));
    QCOMPARE(o.started, (QSet<QString>{"c1", "c2", "a3"}));
    // Taking the bypass off changes a3's input key: it runs again, the others are reused.
    RunCache cache;
    QVERIFY(runOnce(doc, {.cache = &cache}).report["ok"].toBool());
    doc.setBypassed("a2", false);
    const Outcome after = runOnce(doc, {.cache = &cache});
    QCOMPARE(after.started, (QSet<QString>{"a2", "a3"}));
    QCOMPARE(node(after, "a3")["value"].toDouble(), 2.0 + 1000 + 1);
  }

  void muteSkipsTheNodeAndWhatNeedsIt() {
    GraphDocument doc;
    chain(doc);
    doc.addNode(makeNode("a4", "TestAdd", {{"value", 1}}));
    doc.addConnection(wire("a2.out", "a4.a"));
    doc.setMuted("a1", true);
    const Outcome o = runOnce(doc);
    QVERIFY2(o.report["ok"].toBool(), "a muted node is not a failure");
    QCOMPARE(node(o, "a1")["status"].toString(), QString("muted"));
    QCOMPARE(node(o, "a2")["status"].toString(), QString("skipped"));
    QCOMPARE(node(o, "a2")["error"].toString(), QString("skipped: input a (a1.out) is muted"));
    QCOMPARE(node(o, "a4")["error"].toString(),
             QString("skipped: input a (a2.out) is skipped (a1 is muted)"));
    QCOMPARE(o.started, (QSet<QString>{"c1", "c2", "a3"}));
    QCOMPARE(node(o, "a3")["value"].toDouble(), 6.0);
  }

  void runGraphLeavesAGraphWithoutFlagsAlone() {
    GraphDocument doc;
    chain(doc);
    const RunGraph g = runGraph(doc, testRegistry());
    QCOMPARE(&g.graph(), &doc);
    QVERIFY(g.notRun.isEmpty() && g.issues.isEmpty());
    // Muted wins over bypassed; the wires of what does not run are gone.
    doc.setBypassed("a1", true);
    doc.setMuted("a1", true);
    const RunGraph m = runGraph(doc, testRegistry());
    QCOMPARE(m.graph().nodes().size(), 3);
    QCOMPARE(m.graph().connections().size(), 1);
    QCOMPARE(m.notRun.size(), 2);
    QCOMPARE(nodeStatusName(m.notRun[0].status), QString("muted"));
  }
};

QTEST_GUILESS_MAIN(RunCacheTest)
#include "test_run_cache.moc"
