// What a graph may touch (file_access.h) on the test node set's TestFile: relative paths resolve against
// the graph's folder, writes outside it are refused before the run naming node, param and path (through
// `..`, an absolute path, a link inside the folder that points out), a folder, device or foreign file is
// never written, what the user allowed goes through, and a refused run writes nothing.
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QTemporaryDir>
#include <QtTest>

#include "gpunodes/core/executor.h"
#include "gpunodes/core/file_access.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/run_graph.h"
#include "gpunodes/core/subgraph.h"
#include "gpunodes/core/validation.h"
#include "test_support.h"

using namespace gn::core;
using gn::test::makeNode;
using gn::test::testRegistry;

namespace {

bool writeFile(const QString& path, const QByteArray& bytes) {
  QFile f(path);
  return f.open(QIODevice::WriteOnly) && f.write(bytes) == bytes.size();
}

QByteArray readFile(const QString& path) {
  QFile f(path);
  return f.open(QIODevice::ReadOnly) ? f.readAll() : QByteArray();
}

// The touches of one TestFile node with these params, under a policy for `folder`.
QList<FileTouch> touches(const QJsonObject& params, const FilePolicy& policy) {
  GraphDocument doc;
  doc.addNode(makeNode("f", "TestFile", params));
  const RunGraph run = runGraph(doc, testRegistry(), {}, policy.folder);
  return filesTouched(run.graph(), testRegistry(), policy);
}

FileTouch touch(const QJsonObject& params, const FilePolicy& policy) {
  const QList<FileTouch> all = touches(params, policy);
  return all.size() == 1 ? all.first() : FileTouch{};
}

QStringList errorTexts(const ValidationReport& r) {
  QStringList out;
  for (const Issue& i : r.errors()) out << i.text();
  return out;
}

}  // namespace

class FileAccessTest : public QObject {
  Q_OBJECT

  QTemporaryDir root_;
  QString graph_, outside_;  // the graph's folder and a folder beside it

 private slots:
  void initTestCase() {
    QVERIFY(root_.isValid());
    const QString base = resolvePath(root_.path(), root_.path());  // /tmp may itself be a link
    graph_ = base + "/graph";
    outside_ = base + "/elsewhere";
    QVERIFY(QDir().mkpath(graph_ + "/sub"));
    QVERIFY(QDir().mkpath(outside_));
    QVERIFY(writeFile(outside_ + "/thesis.txt", "chapter one"));
    QVERIFY(QFile::link(outside_, graph_ + "/link-out"));
  }

  void relative_paths_resolve_against_the_graph_folder() {
    QCOMPARE(graphFolder(graph_ + "/g.json"), graph_);
    QCOMPARE(resolvePath(graph_, "sub/../model.params"), graph_ + "/model.params");
    QCOMPARE(resolvePath(graph_, "/abs/x"), QString("/abs/x"));
    QCOMPARE(resolvePath(graph_, ""), QString());
    // A link is followed as far as the path exists; what does not exist yet is appended.
    QCOMPARE(resolvePath(graph_, "link-out/new/file.params"), outside_ + "/new/file.params");
    // The nodes run with the resolved paths, and only file params change.
    GraphDocument doc;
    doc.addNode(makeNode("f", "TestFile", {{"in", "data.csv"}, {"out", "sub/m.params"}, {"note", "n.txt"}}));
    const RunGraph run = runGraph(doc, testRegistry(), {}, graph_);
    const QJsonObject p = run.graph().node("f")->params;
    QCOMPARE(p["in"].toString(), graph_ + "/data.csv");
    QCOMPARE(p["out"].toString(), graph_ + "/sub/m.params");
    QCOMPARE(p["note"].toString(), QString("n.txt"));
    QCOMPARE(doc.node("f")->params["in"].toString(), QString("data.csv"));  // the document is untouched
    // Without a folder nothing is resolved.
    QCOMPARE(runGraph(doc, testRegistry()).graph().node("f")->params["in"].toString(), QString("data.csv"));
  }

  void writes_inside_the_folder_are_allowed() {
    const FilePolicy policy{graph_, {}, false};
    const FileTouch t = touch({{"out", "sub/model.params"}}, policy);
    QCOMPARE(t.resolved, graph_ + "/sub/model.params");
    QVERIFY(!t.outside);
    QVERIFY2(t.problem.isEmpty(), qPrintable(t.problem));
    QVERIFY(touch({{"folder", "checkpoints"}}, policy).problem.isEmpty());
  }

  void writes_outside_are_refused_naming_the_resolved_path() {
    const FilePolicy policy{graph_, {}, false};
    for (const QString& path : {QString("../elsewhere/thesis.params"), outside_ + "/a.params",
                                QString("link-out/a.params"), QString("sub/../../elsewhere/b.params")}) {
      const FileTouch t = touch({{"out", path}}, policy);
      QVERIFY2(t.outside, qPrintable(path));
      QVERIFY2(t.problem.contains("outside the graph's folder " + graph_), qPrintable(t.problem));
      QVERIFY2(t.problem.contains(outside_ + "/"), qPrintable(t.problem));
    }
    const FileTouch folder = touch({{"folder", "/"}}, policy);
    QVERIFY2(folder.problem.contains("writes /,"), qPrintable(folder.problem));
    // Reads outside are allowed, and said to be outside.
    const FileTouch read = touch({{"in", outside_ + "/thesis.txt"}}, policy);
    QVERIFY(read.outside);
    QVERIFY(read.problem.isEmpty());
  }

  void allowed_places_and_force_let_writes_through() {
    FilePolicy policy{graph_, {outside_}, false};
    QVERIFY(touch({{"out", "../elsewhere/new.params"}}, policy).problem.isEmpty());
    // A file that is not gpunodes' own is never replaced without force, even where writes are allowed.
    const FileTouch thesis = touch({{"out", "../elsewhere/thesis.txt"}}, policy);
    QVERIFY(thesis.foreign);
    QVERIFY2(thesis.problem.contains("is not a gpunodes file"), qPrintable(thesis.problem));
    QVERIFY2(thesis.problem.contains("--force"), qPrintable(thesis.problem));
    policy.replaceForeign = true;
    QVERIFY(touch({{"out", "../elsewhere/thesis.txt"}}, policy).problem.isEmpty());
    // Outside and foreign: one message says both.
    const FileTouch both = touch({{"out", outside_ + "/thesis.txt"}}, FilePolicy{graph_, {}, false});
    QVERIFY(both.foreign);
    QVERIFY2(both.problem.contains("outside") && both.problem.contains("not a gpunodes file"),
             qPrintable(both.problem));
  }

  void gpunodes_files_are_recognised_by_content() {
    QVERIFY(writeFile(graph_ + "/p.params", QByteArray("GNPARAMS") + QByteArray(16, '\0')));
    QVERIFY(isGpunodesFile(graph_ + "/p.params"));
    QByteArray st(8, '\0');
    const QByteArray header = R"({"__metadata__":{}})";
    st[0] = char(header.size());
    QVERIFY(writeFile(graph_ + "/w.safetensors", st + header));
    QVERIFY(isGpunodesFile(graph_ + "/w.safetensors"));
    QByteArray lying = st + header;
    lying[0] = char(200);  // a header longer than the file
    QVERIFY(writeFile(graph_ + "/lying.safetensors", lying));
    QVERIFY(!isGpunodesFile(graph_ + "/lying.safetensors"));
    // ONNX: ir_version (field 1), then producer_name (field 2) "gpunodes".
    QVERIFY(writeFile(graph_ + "/m.onnx", QByteArray::fromHex("0808") + QByteArray::fromHex("1208") + "gpunodes"));
    QVERIFY(isGpunodesFile(graph_ + "/m.onnx"));
    QVERIFY(writeFile(graph_ + "/torch.onnx", QByteArray::fromHex("0808") + QByteArray::fromHex("1207") + "pytorch"));
    QVERIFY(!isGpunodesFile(graph_ + "/torch.onnx"));
    QVERIFY(!isGpunodesFile(outside_ + "/thesis.txt"));
    QVERIFY(!isGpunodesFile(graph_ + "/missing"));
    const FilePolicy policy{graph_, {}, false};
    QVERIFY(touch({{"out", "p.params"}}, policy).problem.isEmpty());
    QVERIFY(touch({{"out", "w.safetensors"}}, policy).problem.isEmpty());
    QVERIFY(!touch({{"out", "torch.onnx"}}, policy).problem.isEmpty());
  }

  void folders_devices_and_files_in_the_wrong_place() {
    const FilePolicy policy{graph_, {"/dev"}, false};
    QVERIFY2(touch({{"out", "sub"}}, policy).problem.contains("is a folder, not a file"),
             qPrintable(touch({{"out", "sub"}}, policy).problem));
    QVERIFY(writeFile(graph_ + "/plain", "x"));
    QVERIFY(touch({{"folder", "plain"}}, policy).problem.contains("is a file, not a folder"));
    QVERIFY(touch({{"out", "/dev/null"}}, policy).problem.contains("not a regular file"));
    QVERIFY(touch({{"in", "/dev/zero"}}, policy).problem.contains("not a file or a folder"));
    // Without a policy nothing is judged (a program's own documents).
    QVERIFY(touch({{"out", "/dev/null"}}, FilePolicy{}).problem.isEmpty());
  }

  void validation_reports_each_on_its_node_and_param() {
    GraphDocument doc;
    doc.addNode(makeNode("ok", "TestFile", {{"out", "fine.params"}}));
    doc.addNode(makeNode("bad", "TestFile", {{"out", "../elsewhere/x.params"}, {"folder", "/"}}));
    RunSettings settings;
    settings.files = FilePolicy{graph_, {}, false};
    const ValidationReport r = validate(doc, testRegistry(), settings);
    QVERIFY(!r.ok());
    QCOMPARE(r.forNode("ok").size(), 0);
    const QStringList errors = errorTexts(r);
    QCOMPARE(errors.size(), 2);
    QVERIFY2(errors[0].startsWith("bad: params.out: writes " + outside_ + "/x.params"), qPrintable(errors[0]));
    QVERIFY2(errors[1].startsWith("bad: params.folder: writes /,"), qPrintable(errors[1]));
    QVERIFY(validate(doc, testRegistry()).ok());  // no policy, no check
  }

  void inner_nodes_of_a_subgraph_are_checked_by_path() {
    GraphDocument doc;
    doc.addNode(makeNode("save", "TestFile", {{"out", "../elsewhere/inner.params"}}));
    const subgraph::Change change = subgraph::group(doc, {"save"}, "block1");
    QVERIFY2(change.error.isEmpty(), qPrintable(change.error));
    GraphDocument grouped;
    for (const GraphNode& n : change.addNodes) grouped.addNode(n);
    RunSettings settings;
    settings.files = FilePolicy{graph_, {}, false};
    const QStringList errors = errorTexts(validate(grouped, testRegistry(), settings));
    QCOMPARE(errors.size(), 1);
    QVERIFY2(errors[0].startsWith("block1/save: params.out: writes " + outside_), qPrintable(errors[0]));
  }

  void a_refused_run_writes_nothing_and_an_allowed_one_sees_resolved_paths() {
    const QString target = outside_ + "/thesis.txt";
    GraphDocument doc;
    doc.addNode(makeNode("f", "TestFile", {{"out", "../elsewhere/thesis.txt"}, {"in", "data.csv"}}));
    RunSettings settings;
    settings.files = FilePolicy{graph_, {}, false};
    {
      Executor ex(testRegistry());
      ValidationReport v;
      QVERIFY(!ex.start(doc, settings, &v));
      QVERIFY2(errorTexts(v).join("\n").contains("outside the graph's folder"), qPrintable(errorTexts(v).join("\n")));
      QCOMPARE(ex.report()["nodes"].toObject()["f"].toObject()["status"].toString(), QString("invalid"));
    }
    QCOMPARE(readFile(target), QByteArray("chapter one"));
    // Allowed, but the thesis is not gpunodes' own: still refused without force.
    settings.files.allowWrite = {outside_};
    {
      Executor ex(testRegistry());
      QVERIFY(!ex.start(doc, settings));
    }
    QCOMPARE(readFile(target), QByteArray("chapter one"));
    // A new file inside the folder: the node sees the resolved paths.
    doc.setParam("f", "out", "sub/new.params");
    Executor ex(testRegistry());
    ValidationReport v;
    QVERIFY2(ex.start(doc, settings, &v), qPrintable(errorTexts(v).join("\n")));
    QElapsedTimer t;
    t.start();
    while (ex.isRunning() && t.elapsed() < 10000) ex.events().waitAndDrain(20);
    ex.wait();
    const QJsonObject node = ex.report()["nodes"].toObject()["f"].toObject();
    QCOMPARE(node["status"].toString(), QString("ok"));
    QCOMPARE(node["out"].toString(), graph_ + "/sub/new.params");
    QCOMPARE(node["in"].toString(), graph_ + "/data.csv");
    QCOMPARE(readFile(graph_ + "/sub/new.params"), QByteArray("written by TestFile"));
  }
};

QTEST_GUILESS_MAIN(FileAccessTest)
#include "test_file_access.moc"
