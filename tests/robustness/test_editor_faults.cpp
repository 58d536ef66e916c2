// Faults seen from the editor: a run that runs out of memory, a node that throws, and a save that fails
// midway. Each is reported where the user looks (the node, the log, a message), and the editor keeps its
// document and keeps working.
#include <sys/resource.h>

#include <QFile>
#include <QJsonArray>
#include <QListWidget>
#include <QUndoStack>
#include <csignal>

#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "graph_editor.h"
#include "main_window.h"
#include "robustness_util.h"
#include "run_controller.h"

using namespace gn;
using editor::MainWindow;
using editor::RunStatus;

class EditorFaultsTest : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  QStringList prompts_;

  std::unique_ptr<MainWindow> window() { return testing::promptRecordingWindow(&registry_, &prompts_); }

  static bool logHas(MainWindow* w, const QString& text) {
    for (int i = 0; i < w->log()->count(); ++i)
      if (w->log()->item(i)->text().contains(text)) return true;
    return false;
  }

  static bool runToEnd(MainWindow* w) {
    if (!w->runGraph()) return false;
    QElapsedTimer t;
    t.start();
    while (w->runner()->isRunning() && t.elapsed() < 60000 * kTimeScale) QTest::qWait(20);
    return !w->runner()->isRunning();
  }

 private slots:
  void initTestCase() {
    // The GPU node set, and the test-only node set whose TestAdd throws when asked.
    for (const char* plugin : {GN_NODES_PLUGIN, GN_TEST_PLUGIN}) {
      const QString failed = testing::loadPlugin(registry_, plugin);
      QVERIFY2(failed.isEmpty(), qPrintable(failed));
    }
  }
  void init() { prompts_.clear(); }

  void outOfMemoryMidRunLeavesTheEditorUsable() {
    auto w = window();
    editor::GraphEditor* ed = w->editor();
    ed->setSetting("cpu_devices", 2);
    w->document()->setSettings([&] {
      QJsonObject s = w->document()->settings();
      s.insert("memory_limit", QJsonObject{{"cpu:1", 1 << 20}});
      return s;
    }());
    const QString small = ed->addNode("Device", {0, 0});
    ed->setParam(small, "kind", "cpu");
    ed->setParam(small, "index", 1);
    const QString a = ed->addNode("Tensor", {200, 0}), mm = ed->addNode("MatMul", {400, 0});
    ed->setParam(a, "shape", QJsonArray{400, 400});  // 640 KiB: a fits in 1 MiB, a and a x a do not
    ed->connect({small, "device"}, {a, "device"});
    ed->connect({a, "out"}, {mm, "a"});
    ed->connect({a, "out"}, {mm, "b"});
    const QString c = ed->addNode("Tensor", {200, 200}), mm2 = ed->addNode("MatMul", {400, 200});
    ed->setParam(c, "shape", QJsonArray{50, 50});
    ed->connect({c, "out"}, {mm2, "a"});
    ed->connect({c, "out"}, {mm2, "b"});
    QVERIFY2(w->validateNow().ok(), qPrintable(w->validateNow().errors().value(0).text()));

    QVERIFY(runToEnd(w.get()));
    QCOMPARE(w->runStateText(), QString("Failed"));
    QCOMPARE(w->scene()->nodeItem(mm)->runStatus(), RunStatus::Failed);
    QVERIFY(w->scene()->nodeItem(mm)->errors().join('\n').contains("Out of memory on cpu:1"));
    QCOMPARE(w->scene()->nodeItem(mm2)->runStatus(), RunStatus::Done);  // the other branch completed
    QVERIFY(logHas(w.get(), "Out of memory on cpu:1"));
    const QJsonObject report = w->runner()->report();
    QVERIFY(report["memory"].toObject()["cpu:1"].toObject()["ooms"].toDouble() >= 1);

    // Usable: fix the graph (a smaller tensor fits), run again, and it succeeds.
    ed->setParam(a, "shape", QJsonArray{100, 100});
    QVERIFY(runToEnd(w.get()));
    QCOMPARE(w->runStateText(), QString("Done"));
    QCOMPARE(w->scene()->nodeItem(mm)->runStatus(), RunStatus::Done);
    QVERIFY(w->editor()->undoStack()->canUndo());
  }

  void aThrowingNodeFailsAloneAndTheEditorRunsOn() {
    auto w = window();
    editor::GraphEditor* ed = w->editor();
    const QString c = ed->addNode("TestConst", {0, 0}), boom = ed->addNode("TestAdd", {200, 0});
    const QString fine = ed->addNode("TestAdd", {200, 200});
    ed->setParam(boom, "throw", true);
    ed->connect({c, "out"}, {boom, "a"});
    ed->connect({c, "out"}, {fine, "a"});
    QVERIFY(runToEnd(w.get()));
    QCOMPARE(w->scene()->nodeItem(boom)->runStatus(), RunStatus::Failed);
    QVERIFY(w->scene()->nodeItem(boom)->errors().join('\n').contains("TestAdd threw as asked"));
    QCOMPARE(w->scene()->nodeItem(fine)->runStatus(), RunStatus::Done);
    QVERIFY(logHas(w.get(), "TestAdd threw as asked"));
    ed->setParam(boom, "throw", false);
    QVERIFY(runToEnd(w.get()));
    QCOMPARE(w->runStateText(), QString("Done"));
  }

  void aSaveThatFailsMidwayKeepsTheOldFileAndSaysSo() {
    QTemporaryDir dir;
    const QString path = dir.filePath("work.json");
    auto w = window();
    w->editor()->addNode("Tensor", {0, 0});
    QVERIFY(w->saveFile(path));
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    const QByteArray before = f.readAll();
    f.close();

    // Much more work, too big for the file-size limit set below: the write fails midway, as on a full disk.
    for (int i = 0; i < 200; ++i) {
      const QString id = w->editor()->addNode("Tensor", {double(i * 10), 300});
      w->editor()->setParam(id, "values", QString(200, u'7'));
    }
    QVERIFY(w->isDirty());
    const QByteArray unsaved = testing::normalized(*w->document());
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead of killing us
    rlimit old{};
    getrlimit(RLIMIT_FSIZE, &old);
    rlimit limit = old;
    limit.rlim_cur = before.size() + 4096;
    QCOMPARE(setrlimit(RLIMIT_FSIZE, &limit), 0);
    const bool saved = w->saveFile(path);
    setrlimit(RLIMIT_FSIZE, &old);
    QVERIFY(!saved);
    // Said so, naming the file and that it is unchanged.
    QCOMPARE(prompts_.size(), 1);
    QVERIFY2(prompts_[0].contains(path) && prompts_[0].contains("the file on disk is unchanged"),
             qPrintable(prompts_[0]));
    QVERIFY(logHas(w.get(), "the file on disk is unchanged"));
    // The old file intact, no temporary left beside it, and the work still there and still unsaved.
    QVERIFY(f.open(QIODevice::ReadOnly));
    QCOMPARE(f.readAll(), before);
    f.close();
    QCOMPARE(QDir(dir.path()).entryList(QDir::Files), QStringList{"work.json"});
    QVERIFY(w->isDirty());
    QCOMPARE(testing::normalized(*w->document()), unsaved);
    // With room again, the same save works.
    QVERIFY(w->saveFile(path));
    QVERIFY(!w->isDirty());
  }
};

QTEST_MAIN(EditorFaultsTest)
#include "test_editor_faults.moc"
