// Every file of the hostile corpus, opened in the editor with the real node set, over a document with unsaved
// work. A file that cannot be read is refused: the error names the file and the problem, in a message box and
// the log, and the current document, its file and its unsaved state stay as they were. A file that reads but
// that a run would refuse opens, and says so at once: the problem in the log and on the status bar, and each
// node it concerns painted with it. Nothing takes more than 2 s, and the editor keeps working afterwards.
#include <QFile>
#include <QJsonArray>
#include <QListWidget>
#include <QStatusBar>
#include <QUndoStack>

#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "graph_editor.h"
#include "main_window.h"
#include "robustness_util.h"

using namespace gn;
using editor::MainWindow;

class HostileEditorTest : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  QStringList prompts_;
  QTemporaryDir dir_;

  std::unique_ptr<MainWindow> window() { return testing::promptRecordingWindow(&registry_, &prompts_); }

  // Unsaved work: a small graph that validates.
  static void edit(MainWindow* w) {
    editor::GraphEditor* ed = w->editor();
    const QString d = ed->addNode("Device", {0, 0});
    const QString t = ed->addNode("Tensor", {250, 0});
    const QString m = ed->addNode("MatMul", {500, 0});
    ed->setParam(d, "kind", "cpu");
    ed->setParam(t, "shape", QJsonArray{3, 3});
    ed->connect({d, "device"}, {t, "device"});
    ed->connect({t, "out"}, {m, "a"});
    ed->connect({t, "out"}, {m, "b"});
  }

  static QStringList logErrors(MainWindow* w) {
    QStringList out;
    for (int i = 0; i < w->log()->count(); ++i)
      if (w->log()->item(i)->data(Qt::UserRole + 2).toString() == "error") out << w->log()->item(i)->text();
    return out;
  }

  // Opens `path` over unsaved work and checks the contract; `word` is what the error must name.
  void open(const QString& path, const QString& word) {
    auto w = window();
    edit(w.get());
    const QByteArray before = core::serializer::save(*w->document());
    QVERIFY(w->isDirty());
    QVERIFY2(w->validateNow().ok(), qPrintable(w->validateNow().errors().value(0).text()));
    prompts_.clear();
    const int logBefore = w->log()->count();

    core::GraphDocument probe;
    QString readError;
    const bool readable = core::serializer::loadFile(path, probe, &readError);
    QElapsedTimer timer;
    timer.start();
    const bool opened = w->loadFile(path);
    const qint64 ms = timer.elapsed();
    QVERIFY2(ms < 2000 * kTimeScale, qPrintable(QStringLiteral("took %1 ms").arg(ms)));
    QCOMPARE(opened, readable);
    const QString name = QFileInfo(path).fileName();

    if (!opened) {
      // The error, in a message box and the log; the work in progress untouched.
      QCOMPARE(prompts_.size(), 1);
      QVERIFY2(prompts_[0].contains(name) && prompts_[0].contains(word), qPrintable(prompts_[0].left(500)));
      QVERIFY2(prompts_[0].size() < 1000, qPrintable(prompts_[0].left(1200)));
      const QStringList errors = logErrors(w.get());
      QVERIFY(!errors.isEmpty() && errors.last().contains(word));
      QCOMPARE(core::serializer::save(*w->document()), before);
      QVERIFY(w->isDirty());
      QVERIFY(w->currentFile().isEmpty());
      QCOMPARE(w->scene()->nodeCount(), 3);
    } else {
      // Opened, with what a run would refuse shown at once: in the log, on the status bar, on the nodes.
      QVERIFY2(prompts_.isEmpty(), qPrintable(prompts_.join('\n')));
      const core::ValidationReport report = w->validateNow();
      QVERIFY2(!report.ok(), "the file validates in the editor");
      QStringList logged;
      for (int i = logBefore; i < w->log()->count(); ++i)
        if (w->log()->item(i)->data(Qt::UserRole + 2).toString() == "error")
          logged << w->log()->item(i)->text();
      QVERIFY2(!logged.isEmpty(), "no error in the log");
      QVERIFY2(logged.first().contains(word), qPrintable(logged.first().left(500) + "\nexpected: " + word));
      QVERIFY2(w->statusBar()->currentMessage().contains(name) &&
                   w->statusBar()->currentMessage().contains("problem"),
               qPrintable(w->statusBar()->currentMessage()));
      for (const core::Issue& i : report.errors()) {
        if (i.node.isEmpty()) continue;
        editor::NodeItem* item = w->scene()->nodeItem(i.node);
        if (!item) continue;  // a duplicate id or an id the canvas cannot show: the log has it
        QVERIFY2(!item->errors().isEmpty(), qPrintable(i.node + " is not painted with: " + i.text()));
      }
      QVERIFY(!w->isDirty());
    }
    // Still usable: an edit, its undo, a validation.
    const int nodes = w->scene()->nodeCount();
    const QString added = w->editor()->addNode("Tensor", {900, 900});
    QVERIFY(!added.isEmpty());
    QCOMPARE(w->scene()->nodeCount(), nodes + 1);
    w->editor()->undoStack()->undo();
    QCOMPARE(w->scene()->nodeCount(), nodes);
    w->validateNow();
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    const QString failed = testing::loadPlugin(registry_, GN_NODES_PLUGIN);
    QVERIFY2(failed.isEmpty(), qPrintable(failed));
  }

  void everyHostileFile_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("word");
    const QList<robustness::HostileFile> files = robustness::readManifest(GN_HOSTILE_DIR);
    QVERIFY(files.size() >= 60);
    for (const robustness::HostileFile& f : files) QTest::newRow(qPrintable(f.file)) << f.file << f.word;
  }
  void everyHostileFile() {
    QFETCH(QString, file);
    QFETCH(QString, word);
    open(QStringLiteral(GN_HOSTILE_DIR "/") + file, word);
  }

  void aThreeHundredMegabyteFile() {
    const QString path = dir_.filePath("huge-300mb.json");
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(R"({"format": "gpunodes-graph", "version": 1, "nodes": [)");
    QVERIFY(f.resize(300LL * 1000 * 1000));  // sparse
    f.close();
    open(path, "32 MiB limit");
    f.remove();
  }

  void aTenMegabyteString() {
    const QString path = dir_.filePath("init-10mb.json");
    QFile f(path);
    QVERIFY(f.open(QIODevice::WriteOnly));
    f.write(
        R"({"format": "gpunodes-graph", "version": 1, "nodes": [{"id": "x1", "type": "Tensor", "params": {"init": ")" +
        QByteArray(10 * 1000 * 1000, 'x') + R"("}}]})");
    f.close();
    open(path, "init");
    f.remove();
  }
};

QTEST_MAIN(HostileEditorTest)
#include "test_hostile_editor.moc"
