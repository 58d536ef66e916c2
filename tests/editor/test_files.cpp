// Files, dirty state, examples, dock layout and crash recovery.
#include <QDockWidget>
#include <QFile>
#include <QMenuBar>
#include <QUndoStack>

#include "editor_test_util.h"
#include "fake_nodes.h"
#include "gpunodes/core/registry.h"
#include "graph_editor.h"
#include "main_window.h"

using namespace gn;
using editor::MainWindow;

class TestFiles : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  testing::FakeNodeSet fake_;
  core::NodeTypeRegistry registry_;
  QStringList prompts_;
  QMessageBox::StandardButton answer_ = QMessageBox::Discard;

  std::unique_ptr<MainWindow> makeWindow() {
    return testing::promptRecordingWindow(&registry_, &prompts_, &answer_);
  }

  void buildGraph(MainWindow* w) {
    editor::GraphEditor* ed = w->editor();
    const QString d = ed->addNode("Device", {0, 0});
    const QString t = ed->addNode("Tensor", {250, 0});
    const QString m = ed->addNode("MatMul", {500, 0});
    ed->connect({d, "device"}, {t, "device"});
    ed->connect({t, "out"}, {m, "a"});
    ed->connect({t, "out"}, {m, "b"});
    ed->setParam(m, "repeat", 9);
    w->document()->setName("files test");
  }

 private slots:
  void initTestCase() { registry_.addPlugin(&fake_, "fake"); }
  void init() {
    prompts_.clear();
    answer_ = QMessageBox::Discard;
    QFile::remove(MainWindow::recoveryPath());
  }

  void saveReopenCompare() {
    QTemporaryDir dir;
    const QString path = dir.filePath("g.json");
    auto w = makeWindow();
    buildGraph(w.get());
    QVERIFY(w->isDirty());
    QVERIFY(w->windowTitle().contains("[*]"));
    QVERIFY(w->saveFile(path));
    QVERIFY(!w->isDirty());
    QCOMPARE(w->currentFile(), QFileInfo(path).absoluteFilePath());

    auto w2 = makeWindow();
    QVERIFY(w2->openFile(path));
    QCOMPARE(core::serializer::save(*w2->document()), core::serializer::save(*w->document()));
    QCOMPARE(w2->scene()->nodeCount(), 3);
    QCOMPARE(w2->scene()->wireCount(), 3);
    QVERIFY(!w2->isDirty());
    QVERIFY(w2->editor()->undoStack()->count() == 0);
    // The file is the serializer's bytes, atomically written.
    QFile f(path);
    QVERIFY(f.open(QIODevice::ReadOnly));
    core::GraphDocument check;
    QString error;
    QVERIFY2(core::serializer::load(f.readAll(), check, &error), qPrintable(error));
    QCOMPARE(testing::normalized(check), testing::normalized(*w->document()));
  }

  void badFileKeepsTheDocument() {
    QTemporaryDir dir;
    const QString bad = dir.filePath("bad.json");
    QFile f(bad);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write("{\"format\": \"gpunodes-graph\", \"version\": 1, \"nodes\": [ {\"id\": ");
    f.close();
    auto w = makeWindow();
    buildGraph(w.get());
    const QByteArray before = core::serializer::save(*w->document());
    QVERIFY(!w->loadFile(bad));
    QCOMPARE(core::serializer::save(*w->document()), before);
    QVERIFY(!prompts_.isEmpty());
    QVERIFY(prompts_.last().contains("bad.json"));
    QVERIFY(!w->loadFile(dir.filePath("does-not-exist.json")));
    QCOMPARE(core::serializer::save(*w->document()), before);
  }

  void promptBeforeLosingChanges() {
    auto w = makeWindow();
    buildGraph(w.get());
    answer_ = QMessageBox::Cancel;
    QVERIFY(!w->maybeSave());
    QVERIFY(!w->close());  // the close is refused
    QCOMPARE(prompts_.size(), 2);
    QCOMPARE(w->document()->nodes().size(), 3);
    answer_ = QMessageBox::Discard;
    QVERIFY(w->maybeSave());
  }

  void theSavePromptNamesWhatWillBeLost() {
    // An edited example is an unsaved copy of it, named as the title bar names it.
    QTemporaryDir examples;
    const QString example = examples.filePath("demo.json");
    {
      auto w = makeWindow();
      buildGraph(w.get());
      w->document()->setName("Demo graph");
      QVERIFY(w->saveFile(example));
    }
    qputenv("GPUNODES_EXAMPLES", examples.path().toUtf8());
    auto w = makeWindow();
    QVERIFY(w->openFile(example));
    QVERIFY(w->currentFile().isEmpty());  // a template: saving asks for a new place
    QString mm;
    for (const core::GraphNode& n : w->document()->nodes())
      if (n.type == "MatMul") mm = n.id;
    w->editor()->setParam(mm, "repeat", 3);
    QVERIFY(w->isDirty());
    prompts_.clear();
    QVERIFY(w->maybeSave());
    QCOMPARE(prompts_.size(), 1);
    QCOMPARE(prompts_.last(), QString("Save \u201cDemo graph\u201d, an unsaved copy of the example demo.json?"));
    qunsetenv("GPUNODES_EXAMPLES");

    // A graph of the user's own file names the file; a new graph with a name says it was never saved.
    QTemporaryDir dir;
    QVERIFY(w->saveFile(dir.filePath("mine.json")));
    w->editor()->setParam(mm, "repeat", 4);
    QVERIFY(w->maybeSave());
    QCOMPARE(prompts_.last(), QString("Save the changes to mine.json?"));
    auto fresh = makeWindow();
    buildGraph(fresh.get());
    QVERIFY(fresh->maybeSave());
    QCOMPARE(prompts_.last(), QString("Save \u201cfiles test\u201d, which has not been saved yet?"));
  }

  void missingNodeTypeStillLoads() {
    QTemporaryDir dir;
    const QString path = dir.filePath("m.json");
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(R"({"format": "gpunodes-graph", "version": 1, "nodes": [
      {"id": "d", "type": "Device", "position": [0, 0]},
      {"id": "z", "type": "Zorble", "position": [300, 0], "params": {"q": 1}}],
      "connections": [{"from": "d.device", "to": "z.dev"}]})");
    f.close();
    auto w = makeWindow();
    QVERIFY(w->loadFile(path));
    editor::NodeItem* z = w->scene()->nodeItem("z");
    QVERIFY(z);
    QCOMPARE(z->inputs().size(), 1);  // the port its wire names
    QCOMPARE(w->scene()->wireCount(), 1);
    w->validateNow();
    QVERIFY(!z->errors().isEmpty());
  }

  void examplesMenuListsTheExamples() {
    qputenv("GPUNODES_EXAMPLES", GN_EXAMPLES_DIR);
    QCOMPARE(QDir(MainWindow::examplesDir()).absolutePath(), QDir(GN_EXAMPLES_DIR).absolutePath());
    auto w = makeWindow();
    QMenu* examples = nullptr;
    for (QAction* a : w->menuBar()->actions())
      for (QAction* sub : a->menu() ? a->menu()->actions() : QList<QAction*>())
        if (sub->menu() && sub->text().contains("Examples")) examples = sub->menu();
    QVERIFY(examples);
    const int files = int(QDir(GN_EXAMPLES_DIR).entryList({"*.json"}, QDir::Files).size());
    if (files == 0) QSKIP("no examples in the source tree yet");
    QCOMPARE(examples->actions().size(), files);
    // Opening an example does not make it the save target: Save asks where.
    examples->actions().first()->trigger();
    QVERIFY(!w->document()->nodes().isEmpty());
    QVERIFY(w->currentFile().isEmpty());
    qunsetenv("GPUNODES_EXAMPLES");
  }

  void dockLayoutIsRestored() {
    {
      auto w = makeWindow();
      auto* tl = w->findChild<QDockWidget*>("timelineDock");
      QVERIFY(tl);
      QVERIFY(tl->isVisibleTo(w.get()));
      tl->hide();
      QVERIFY(w->close());
    }
    auto w = makeWindow();
    QVERIFY(!w->findChild<QDockWidget*>("timelineDock")->isVisibleTo(w.get()));
    w->findChild<QDockWidget*>("timelineDock")->show();
    QVERIFY(w->close());
  }

  void recoveryFileIsWrittenAndOffered() {
    const QString rec = MainWindow::recoveryPath();
    QVERIFY(rec.startsWith(env_.dir.path()));
    QByteArray crashed;
    {
      auto w = makeWindow();
      w->setAutosaveIntervalMs(50);
      QTest::qWait(120);
      QVERIFY(!QFile::exists(rec));  // nothing unsaved, nothing to recover
      buildGraph(w.get());
      QTRY_VERIFY(QFile::exists(rec));
      crashed = testing::normalized(*w->document());
      // A crash: the window goes away without closeEvent, so the file stays.
      w->setPromptHandler({});
      w->hide();
      w.release()->deleteLater();
    }
    QVERIFY(QFile::exists(rec));
    {
      answer_ = QMessageBox::Yes;
      auto w = makeWindow();
      QVERIFY(w->offerRecovery());
      QVERIFY(prompts_.last().contains("did not close cleanly"));
      QCOMPARE(testing::normalized(*w->document()), crashed);
      QVERIFY(w->isDirty());  // restored work is not saved anywhere
      answer_ = QMessageBox::Discard;
      QVERIFY(w->close());  // a clean exit removes the file
      QVERIFY(!QFile::exists(rec));
    }
    {
      // Declining the offer removes the file too.
      auto w = makeWindow();
      buildGraph(w.get());
      QVERIFY(w->writeRecovery());
      answer_ = QMessageBox::No;
      auto w2 = makeWindow();
      QVERIFY(!w2->offerRecovery());
      QVERIFY(!QFile::exists(rec));
      QVERIFY(w2->document()->nodes().isEmpty());
    }
  }
};

QTEST_MAIN(TestFiles)
#include "test_files.moc"
