// The one JSON serializer: round trips to the same bytes, unknown fields kept, and a clear error, naming
// where, for every kind of bad input.
#include <sys/resource.h>

#include <QElapsedTimer>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QSignalSpy>
#include <QTemporaryDir>
#include <QtTest>
#include <csignal>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/serializer.h"
#include "test_support.h"

using namespace gn::core;
namespace ser = gn::core::serializer;

namespace {

const QByteArray kExample = R"({
  "format": "gpunodes-graph", "version": 1,
  "name": "Two devices in parallel", "description": "d2l: automatic parallelism",
  "settings": { "schedule": "parallel", "cpu_devices": 2 },
  "nodes": [
    { "id": "dev0", "type": "Device", "position": [0, 0],   "params": { "kind": "gpu", "index": 0, "fallback": true } },
    { "id": "x1",   "type": "Tensor", "position": [220, 0], "params": { "shape": [4000, 4000], "init": "uniform", "seed": 1 } },
    { "id": "mm1",  "type": "MatMul", "position": [440.5, -3.25], "params": { "repeat": 50, "scale": 0.1 } }
  ],
  "connections": [
    { "from": "dev0.device", "to": "x1.device" },
    { "from": "x1.out", "to": "mm1.a" },
    { "from": "x1.out", "to": "mm1.b" }
  ],
  "view": { "zoom": 1.0, "center": [220, 0] }
})";

QString loadError(const QByteArray& bytes) {
  GraphDocument doc;
  QString error;
  if (ser::load(bytes, doc, &error)) return QStringLiteral("(loaded)");
  return error;
}

QByteArray graph(const QByteArray& nodes, const QByteArray& connections = "[]") {
  return R"({"format": "gpunodes-graph", "version": 1, "nodes": )" + nodes + R"(, "connections": )" +
         connections + "}";
}

}  // namespace

class SerializerTest : public QObject {
  Q_OBJECT

 private slots:
  void bypassAndMuteAreSavedOnlyWhenSet() {
    GraphDocument doc;
    QString error;
    QVERIFY2(
        ser::load(graph(R"([{"id": "a", "type": "T", "bypass": true}, {"id": "b", "type": "T", "mute": true},
                                  {"id": "c", "type": "T", "mute": false}])"),
                  doc, &error),
        qPrintable(error));
    QVERIFY(doc.node("a")->bypassed && !doc.node("a")->muted);
    QVERIFY(doc.node("b")->muted && !doc.node("b")->bypassed);
    QVERIFY(!doc.node("c")->muted && doc.node("c")->extra.isEmpty());
    const QJsonArray nodes = QJsonDocument::fromJson(ser::save(doc)).object()["nodes"].toArray();
    QCOMPARE(nodes[0].toObject()["bypass"], QJsonValue(true));
    QVERIFY(!nodes[0].toObject().contains("mute"));
    QCOMPARE(nodes[1].toObject()["mute"], QJsonValue(true));
    QVERIFY(!nodes[2].toObject().contains("mute") && !nodes[2].toObject().contains("bypass"));
    QCOMPARE(loadError(graph(R"([{"id": "a", "type": "T", "mute": "yes"}])")),
             QString("nodes[0].mute: expected true or false, got \"yes\" (node a)"));
  }

  void loadsTheDesignExample() {
    GraphDocument doc;
    QString error;
    QVERIFY2(ser::load(kExample, doc, &error), qPrintable(error));
    QCOMPARE(doc.name(), QStringLiteral("Two devices in parallel"));
    QCOMPARE(doc.settings().value("cpu_devices").toInt(), 2);
    QCOMPARE(doc.nodes().size(), 3);
    QCOMPARE(doc.node("mm1")->position, QPointF(440.5, -3.25));
    QCOMPARE(doc.node("x1")->params.value("shape").toArray().size(), 2);
    QCOMPARE(doc.connections().size(), 3);
    QCOMPARE(doc.connections()[1].to.str(), QStringLiteral("mm1.a"));
    QCOMPARE(doc.view().value("zoom").toDouble(), 1.0);
  }

  void roundTripGivesTheSameBytes() {
    GraphDocument doc;
    QVERIFY(ser::load(kExample, doc, nullptr));
    const QByteArray first = ser::save(doc);
    GraphDocument again;
    QString error;
    QVERIFY2(ser::load(first, again, &error), qPrintable(error));
    QCOMPARE(ser::save(again), first);
    QCOMPARE(ser::toJson(again), ser::toJson(doc));
    // Readable and canonical: format first, one node per line, integers stay integers.
    QVERIFY(first.startsWith("{\n  \"format\": \"gpunodes-graph\",\n  \"version\": 1,\n"));
    QVERIFY(first.contains(
        R"({"id": "mm1", "type": "MatMul", "position": [440.5, -3.25], "params": {"repeat": 50, "scale": 0.1}})"));
    QVERIFY(first.contains(R"("shape": [4000, 4000])"));
    QVERIFY(QJsonDocument::fromJson(first).isObject());
  }

  void byteOrderMarksInsideStringsRoundTrip() {
    // Found by fuzzing: Qt drops a raw U+FEFF at the start of a string it reads and files a key that starts
    // with one out of order, so a second save wrote the keys in another order. Raw, escaped, in keys and in
    // values: save, load, save gives the same bytes.
    // Escaped strings, not raw ones: moc misreads these raw strings.
    const QByteArray raw = "\xEF\xBB\xBF";
    const QByteArray file =
        "{\"format\": \"gpunodes-graph\", \"version\": 1, \"settings\": {\"" + raw +
        "late\": 1, \"schedule\": \"" + raw +
        "parallel\", \"\\ufeffk\": \"\\ufeffv\"}, \"nodes\": [{\"id\": \"a\", \"type\": \"T\", "
        "\"params\": {\"" +
        raw + "x\": 1, \"y\": 2}}]}";
    GraphDocument doc;
    QString error;
    QVERIFY2(ser::load(file, doc, &error), qPrintable(error));
    const QByteArray first = ser::save(doc);
    GraphDocument again;
    QVERIFY2(ser::load(first, again, &error), qPrintable(error));
    QCOMPARE(ser::save(again), first);
    QVERIFY2(first.contains("\"\\ufeffk\": \"\\ufeffv\""), first.constData());  // escaped, so it survives
  }

  void canonicalOutputDoesNotDependOnKeyOrderOrSpacing() {
    QByteArray shuffled =
        R"({"nodes": [{"params": {"b": 2, "a": 1}, "type": "T", "id": "t1", "position": [1, 2]}],
        "version": 1, "connections": [], "format": "gpunodes-graph"})";
    QByteArray tidy =
        R"({"format":"gpunodes-graph","version":1,"nodes":[{"id":"t1","type":"T","position":[1,2],"params":{"a":1,"b":2}}],"connections":[]})";
    GraphDocument a, b;
    QVERIFY(ser::load(shuffled, a, nullptr));
    QVERIFY(ser::load(tidy, b, nullptr));
    QCOMPARE(ser::save(a), ser::save(b));
  }

  void unknownFieldsSurviveLoadAndSave() {
    const QByteArray withExtras = R"({"format": "gpunodes-graph", "version": 1, "author": "ada",
      "future": {"deep": [1, {"x": true}]},
      "settings": {"schedule": "parallel", "memory_limit": {"cpu:1": 1024}},
      "nodes": [{"id": "t1", "type": "Tensor", "color": "#ff0000", "notes": ["a", "b"], "params": {"shape": [2]}}],
      "connections": [{"from": "t1.out", "to": "t2.in", "label": "main", "weight": 2.5}]})";
    GraphDocument doc;
    QString error;
    QVERIFY2(ser::load(withExtras, doc, &error), qPrintable(error));
    QCOMPARE(doc.extra().value("author").toString(), QStringLiteral("ada"));
    QCOMPARE(doc.node("t1")->extra.value("color").toString(), QStringLiteral("#ff0000"));
    QCOMPARE(doc.connections()[0].extra.value("label").toString(), QStringLiteral("main"));
    const QJsonObject saved = QJsonDocument::fromJson(ser::save(doc)).object();
    QCOMPARE(saved.value("author").toString(), QStringLiteral("ada"));
    QCOMPARE(saved.value("future").toObject().value("deep").toArray().at(1).toObject().value("x").toBool(),
             true);
    QCOMPARE(saved.value("settings").toObject().value("memory_limit").toObject().value("cpu:1").toInt(),
             1024);
    const QJsonObject node = saved.value("nodes").toArray().at(0).toObject();
    QCOMPARE(node.value("color").toString(), QStringLiteral("#ff0000"));
    QCOMPARE(node.value("notes").toArray().size(), 2);
    const QJsonObject conn = saved.value("connections").toArray().at(0).toObject();
    QCOMPARE(conn.value("label").toString(), QStringLiteral("main"));
    QCOMPARE(conn.value("weight").toDouble(), 2.5);
  }

  void missingTypesAndDuplicateIdsLoadAsWritten() {
    // Validation reports these; the loader must not rename or drop anything.
    GraphDocument doc;
    QString error;
    QVERIFY2(
        ser::load(graph(R"([{"id": "a", "type": "NoSuchType"}, {"id": "a", "type": "Other"}])"), doc, &error),
        qPrintable(error));
    QCOMPARE(doc.nodes().size(), 2);
    QCOMPARE(doc.nodes()[0].id, doc.nodes()[1].id);
    QCOMPARE(doc.nodes()[0].type, QStringLiteral("NoSuchType"));
    QVERIFY(ser::save(doc).contains("NoSuchType"));
  }

  void loadEmitsOneResetAndFailureLeavesTheDocumentAlone() {
    GraphDocument doc;
    QVERIFY(ser::load(kExample, doc, nullptr));
    QSignalSpy reset(&doc, &GraphDocument::reset);
    QString error;
    QVERIFY(!ser::load(graph(R"([{"id": 5, "type": "T"}])"), doc, &error));
    QCOMPARE(reset.count(), 0);
    QCOMPARE(doc.nodes().size(), 3);
    QVERIFY(ser::load(graph("[]"), doc, &error));
    QCOMPARE(reset.count(), 1);
    QVERIFY(doc.nodes().isEmpty());
  }

  void jsonSyntaxErrorsSayLineAndColumn() {
    const QString e = loadError("{\n  \"format\": \"gpunodes-graph\",\n  \"version\" 1\n}");
    QVERIFY2(e.startsWith("line 3, column 14: missing name separator"),
             qPrintable(e));  // Qt points past the token
    QVERIFY2(loadError("{\"format\": \"gpunodes-graph\", \"version\": 1, \"nodes\": [")
                 .startsWith("line 1, column"),
             qPrintable(loadError("{")));
    QCOMPARE(loadError(""), QStringLiteral("the file is empty"));
    QCOMPARE(loadError("  \n"), QStringLiteral("the file is empty"));
    QCOMPARE(loadError("[1, 2]"), QStringLiteral("expected a JSON object at the top level"));
    // The text quoted is cut at the line end.
    QCOMPARE(loadError("x\n{}\n"),
             QStringLiteral("line 1, column 1: expected a JSON object at the top level (near x)"));
    QCOMPARE(loadError("\n  null"),
             QStringLiteral("line 2, column 3: expected a JSON object at the top level (near null)"));
    QCOMPARE(loadError("42"),
             QStringLiteral("line 1, column 1: expected a JSON object at the top level (near 42)"));
    QVERIFY(loadError("{\"a\": NaN}").startsWith("line 1, column"));
    // A one-line file still says which field: the text before the error comes with the message.
    const QString inf = loadError(
        R"({"format": "gpunodes-graph", "version": 1, "nodes": [{"id": "mm1", "type": "MatMul", "params": {"repeat": 1e400}}]})");
    QVERIFY2(inf.contains("illegal number (near ") && inf.contains(R"("repeat": 1e400)"), qPrintable(inf));
  }

  void formatAndVersionAreChecked() {
    QCOMPARE(loadError(R"({"version": 1})"),
             QStringLiteral("format: missing; not a gpunodes graph (expected \"gpunodes-graph\")"));
    QCOMPARE(loadError(R"({"format": "other", "version": 1})"),
             QStringLiteral("format: \"other\" is not a gpunodes graph (expected \"gpunodes-graph\")"));
    QCOMPARE(loadError(R"({"format": "gpunodes-graph"})"), QStringLiteral("version: missing"));
    QCOMPARE(loadError(R"({"format": "gpunodes-graph", "version": 7})"),
             QStringLiteral("version 7 is newer than this build (2); update gpunodes to open it"));
    QCOMPARE(loadError(R"({"format": "gpunodes-graph", "version": "1"})"),
             QStringLiteral("version: expected an integer, got \"1\""));
    QCOMPARE(loadError(R"({"format": "gpunodes-graph", "version": 1.5})"),
             QStringLiteral("version: expected an integer, got 1.5"));
    QVERIFY(loadError(R"({"format": "gpunodes-graph", "version": 0})").startsWith("version 0 is not"));
  }

  void wrongTypesNameTheField() {
    const QByteArray head = R"({"format": "gpunodes-graph", "version": 1, )";
    QCOMPARE(loadError(head + R"("name": 3})"), QStringLiteral("name: expected a string, got 3"));
    QCOMPARE(loadError(head + R"("settings": []})"),
             QStringLiteral("settings: expected an object, got an array"));
    QCOMPARE(loadError(head + R"("view": "x"})"), QStringLiteral("view: expected an object, got \"x\""));
    QCOMPARE(loadError(head + R"("nodes": {}})"), QStringLiteral("nodes: expected an array, got an object"));
    QCOMPARE(loadError(graph("[1]")), QStringLiteral("nodes[0]: expected an object, got 1"));
    QCOMPARE(loadError(graph(R"([{"type": "T"}])")), QStringLiteral("nodes[0].id: missing"));
    QCOMPARE(loadError(graph(R"([{"id": "a", "type": "T"}, {"id": null, "type": "T"}])")),
             QStringLiteral("nodes[1].id: expected a string, got null"));
    QCOMPARE(loadError(graph(R"([{"id": "a"}])")), QStringLiteral("nodes[0].type: missing"));
    QCOMPARE(
        loadError(graph(
            R"([{"id": "a", "type": "T"}, {"id": "b", "type": "T"}, {"id": "c", "type": "T", "position": [1]}])")),
        QStringLiteral("nodes[2].position: expected [x, y] (node c)"));
    QCOMPARE(loadError(graph(R"([{"id": "a", "type": "T", "position": ["1", 2]}])")),
             QStringLiteral("nodes[0].position: expected [x, y] (node a)"));
    QCOMPARE(loadError(graph(R"([{"id": "a", "type": "T", "params": [1]}])")),
             QStringLiteral("nodes[0].params: expected an object, got an array (node a)"));
    QCOMPARE(loadError(head + R"("connections": 5})"),
             QStringLiteral("connections: expected an array, got 5"));
    QCOMPARE(loadError(graph("[]", R"([{"from": "a.out"}])")), QStringLiteral("connections[0].to: missing"));
    QCOMPARE(loadError(graph("[]", R"([{"from": "a", "to": "b.in"}])")),
             QStringLiteral("connections[0].from: expected \"node.port\", got \"a\""));
    QCOMPARE(loadError(graph("[]", R"([{"from": "a.out", "to": 3}])")),
             QStringLiteral("connections[0].to: expected \"node.port\", got 3"));
    // A 10 MB string is quoted short, not copied into the message.
    const QByteArray huge(10 * 1000 * 1000, 'x');
    const QString e = loadError(graph("[]", R"([{"from": ")" + huge + R"(", "to": "b.in"}])"));
    QVERIFY2(e.size() < 200, qPrintable(e.left(200)));
  }

  void bomAndEncodings() {
    GraphDocument doc;
    QString error;
    QVERIFY2(ser::load("\xEF\xBB\xBF" + graph("[]"), doc, &error), qPrintable(error));  // a UTF-8 BOM is fine
    QVERIFY(loadError("\xFF\xFE{\0}\0").contains("UTF-16"));
    const QString bad =
        loadError("{\n  \"format\": \"gpunodes-graph\", \"version\": 1, \"name\": \"caf\xE9\"}");
    QCOMPARE(bad, QStringLiteral("line 2, column 57: invalid UTF-8 (byte 0xe9); graph files are UTF-8"));
    QVERIFY(loadError("\xC0\xAF").contains("invalid UTF-8"));          // overlong
    QVERIFY(loadError("\xED\xA0\x80").contains("invalid UTF-8"));      // a surrogate
    QVERIFY(loadError("\xF4\x90\x80\x80").contains("invalid UTF-8"));  // past U+10FFFF
    QVERIFY2(ser::load(graph(R"([{"id": "a", "type": "Ünïcödé 🙂"}])"), doc, &error),
             qPrintable(error));
    QCOMPARE(doc.nodes()[0].type, QStringLiteral("Ünïcödé 🙂"));
  }

  void deepNestingIsAnErrorNotACrash() {
    QElapsedTimer timer;
    timer.start();
    const QByteArray deep = QByteArray(100000, '[') + QByteArray(100000, ']');
    const QString e = loadError(R"({"format": "gpunodes-graph", "version": 1, "x": )" + deep + "}");
    QVERIFY2(e.contains("nested too deeply"), qPrintable(e));
    QVERIFY(e.startsWith("line 1, column"));
    const QString e2 = loadError(QByteArray(100000, '{'));
    QVERIFY2(!e2.isEmpty() && e2 != "(loaded)", qPrintable(e2));
    QVERIFY(timer.elapsed() < 2000 * kTimeScale);
  }

  void filesOverTheLimitAreRefusedBeforeReading() {
    QTemporaryDir dir;
    const QString path = dir.filePath("huge.json");
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    QVERIFY(f.resize(ser::kMaxFileBytes + 1));  // sparse: no time spent writing it
    f.close();
    GraphDocument doc;
    QString error;
    QVERIFY(!ser::loadFile(path, doc, &error));
    QVERIFY2(error.startsWith(path + ": "), qPrintable(error));
    QVERIFY2(error.contains("32 MiB limit") && error.contains(QString::number(ser::kMaxFileBytes)),
             qPrintable(error));
  }

  void fileErrorsNameTheFile() {
    QTemporaryDir dir;
    GraphDocument doc;
    QString error;
    QVERIFY(!ser::loadFile(dir.filePath("nope.json"), doc, &error));
    QCOMPARE(error, dir.filePath("nope.json") + ": no such file");
    QVERIFY(!ser::loadFile(dir.path(), doc, &error));
    QVERIFY(error.contains("is a directory"));
    const QString bad = dir.filePath("bad.json");
    QFile f(bad);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(graph(R"([{"id": "a", "type": "T", "position": 3}])"));
    f.close();
    QVERIFY(!ser::loadFile(bad, doc, &error));
    QCOMPARE(error, bad + ": nodes[0].position: expected [x, y] (node a)");
  }

  void saveFileWritesAndReloads() {
    QTemporaryDir dir;
    GraphDocument doc;
    QVERIFY(ser::load(kExample, doc, nullptr));
    const QString path = dir.filePath("g.json");
    QString error;
    QVERIFY2(ser::saveFile(path, doc, &error), qPrintable(error));
    GraphDocument back;
    QVERIFY2(ser::loadFile(path, back, &error), qPrintable(error));
    QCOMPARE(ser::save(back), ser::save(doc));
    QVERIFY(!ser::saveFile(dir.filePath("no/such/dir/g.json"), doc, &error));
    QVERIFY(error.contains("no/such/dir/g.json"));
  }

  void aFailedSaveLeavesTheOldFileIntact() {
    QTemporaryDir dir;
    const QString path = dir.filePath("keep.json");
    GraphDocument small;
    QVERIFY(ser::saveFile(path, small, nullptr));
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray before = f.readAll();
    f.close();

    GraphDocument big;
    for (int i = 0; i < 100; ++i)
      big.addNode(gn::test::makeNode({}, "Tensor", QJsonObject{{"note", QString(1000, u'x')}}));
    // A file-size limit makes the write fail midway, like a full disk, even for root.
    std::signal(SIGXFSZ, SIG_IGN);
    rlimit old{};
    getrlimit(RLIMIT_FSIZE, &old);
    rlimit limit = old;
    limit.rlim_cur = 16 * 1024;
    QCOMPARE(setrlimit(RLIMIT_FSIZE, &limit), 0);
    QString error;
    const bool saved = ser::saveFile(path, big, &error);
    setrlimit(RLIMIT_FSIZE, &old);
    QVERIFY(!saved);
    QVERIFY2(error.startsWith(path + ": cannot save, the file on disk is unchanged"), qPrintable(error));
    QVERIFY(f.open(QIODevice::ReadOnly));
    QCOMPARE(f.readAll(), before);
    QCOMPARE(QDir(dir.path()).entryList(QDir::Files), QStringList{"keep.json"});  // no temp file left behind
  }

  void copyAndPasteUseTheSameFormat() {
    GraphDocument doc;
    QVERIFY(ser::load(kExample, doc, nullptr));
    const QByteArray clip = ser::copyNodes(doc, {"x1", "mm1"});
    GraphDocument asFile;
    QVERIFY(ser::load(clip, asFile, nullptr));  // a clipboard is a graph file
    QCOMPARE(asFile.nodes().size(), 2);
    QCOMPARE(asFile.connections().size(), 2);  // x1 -> mm1 twice; dev0's wire stays behind

    QString error;
    const QStringList ids = ser::pasteNodes(doc, clip, {10, 20}, &error);
    QCOMPARE(ids, (QStringList{"t1", "mm2"}));
    QCOMPARE(doc.nodes().size(), 5);
    QCOMPARE(doc.node("mm2")->position, QPointF(450.5, 16.75));
    QCOMPARE(doc.node("mm2")->params.value("repeat").toInt(), 50);
    QCOMPARE(doc.connectionsTo("mm2").size(), 2);
    QCOMPARE(doc.connectionsTo("mm2")[0].from.str(), QStringLiteral("t1.out"));

    GraphDocument empty;
    QCOMPARE(ser::pasteNodes(empty, clip, {}, &error), (QStringList{"x1", "mm1"}));  // free ids are kept

    QVERIFY(ser::pasteNodes(doc, "not json", {}, &error).isEmpty());
    QVERIFY2(error.startsWith("line 1, column"), qPrintable(error));
    QCOMPARE(doc.nodes().size(), 5);
    QVERIFY(ser::pasteNodes(doc, ser::copyNodes(doc, {}), {}, &error).isEmpty());
    QCOMPARE(error, QStringLiteral("the clipboard holds no nodes"));
  }
};

QTEST_GUILESS_MAIN(SerializerTest)
#include "test_serializer.moc"
