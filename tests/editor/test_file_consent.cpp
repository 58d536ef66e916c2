// What a graph may touch, in the editor (file_consent.h), with the real GPU node set: a graph that writes
// outside its folder shows it on the node when opened, asks before its first run listing every path outside
// the folder (reads too), writes nothing when the user declines, runs when allowed, remembers the answer for
// that file and those paths, and asks again when a path changes. A foreign file is replaced only after the
// same question; a device file is refused whatever the answer.
#include <QDir>
#include <QFile>
#include <QTemporaryDir>

#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "main_window.h"
#include "run_controller.h"

using namespace gn;
using editor::MainWindow;

class TestFileConsent : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  QTemporaryDir dir_;
  QStringList prompts_;
  QMessageBox::StandardButton answer_ = QMessageBox::Cancel;
  QString shared_, victim_;

  std::unique_ptr<MainWindow> window() {
    auto w = std::make_unique<MainWindow>(&registry_);
    w->setPromptHandler([this](QMessageBox::Icon, const QString&, const QString& text,
                               QMessageBox::StandardButtons) {
      prompts_ << text;
      return answer_;
    });
    w->show();
    return w;
  }

  // A linear model saved to `path`, reading nothing; the graph file in the shared folder.
  QString graphSaving(const QString& name, const QString& path) {
    const QString file = shared_ + "/" + name;
    QFile f(file);
    if (!f.open(QIODevice::WriteOnly | QIODevice::Truncate)) return {};
    f.write(QString(R"({"format": "gpunodes-graph", "version": 1, "nodes": [
      {"id": "dev", "type": "Device", "params": {"kind": "cpu"}},
      {"id": "net", "type": "Model", "params": {"arch": "linear", "in_channels": 3, "classes": 1}},
      {"id": "save", "type": "SaveParams", "params": {"path": "%1"}}],
      "connections": [{"from": "dev.device", "to": "net.device"}, {"from": "net.model", "to": "save.model"}]})")
                .arg(path)
                .toUtf8());
    return file;
  }

  static bool runToEnd(MainWindow* w) {
    if (!w->runGraph()) return false;
    QElapsedTimer t;
    t.start();
    while (w->runner()->isRunning() && t.elapsed() < 60000) QTest::qWait(20);
    return !w->runner()->isRunning() && w->runner()->report().value("ok").toBool();
  }

 private slots:
  void initTestCase() {
    GN_REQUIRE_NODES_PLUGIN(registry_);
    QVERIFY(dir_.isValid());
    shared_ = dir_.filePath("shared");
    victim_ = QFileInfo(dir_.path()).canonicalFilePath() + "/victim";
    QVERIFY(QDir().mkpath(shared_) && QDir().mkpath(victim_));
  }
  void init() { prompts_.clear(); }

  void a_write_outside_is_shown_asked_and_remembered() {
    auto w = window();
    QVERIFY(w->loadFile(graphSaving("out.json", "../victim/new.params")));
    // On the node at once: what `gpunodes run` would refuse.
    const core::ValidationReport report = w->validateNow();
    QVERIFY(!report.ok());
    QCOMPARE(report.forNode("save").size(), 1);
    QVERIFY2(report.forNode("save")[0].message.contains("outside the graph's folder"),
             qPrintable(report.forNode("save")[0].message));
    // Declined: nothing runs, nothing is written.
    answer_ = QMessageBox::Cancel;
    QVERIFY(!w->runGraph());
    QCOMPARE(prompts_.size(), 1);
    QVERIFY2(prompts_[0].contains("save.path writes " + victim_ + "/new.params"), qPrintable(prompts_[0]));
    QVERIFY(w->lastMessage().contains("not allowed"));
    QVERIFY(!QFile::exists(victim_ + "/new.params"));
    // Allowed: it runs and writes; the node no longer shows a problem.
    answer_ = QMessageBox::Yes;
    QVERIFY2(runToEnd(w.get()), qPrintable(w->lastMessage()));
    QCOMPARE(prompts_.size(), 2);
    QVERIFY(QFile::exists(victim_ + "/new.params"));
    QVERIFY(w->validateNow().ok());
    // Remembered for this file and these paths, also in a new window.
    answer_ = QMessageBox::Cancel;
    QVERIFY2(runToEnd(w.get()), qPrintable(w->lastMessage()));
    auto again = window();
    QVERIFY(again->loadFile(shared_ + "/out.json"));
    QVERIFY2(runToEnd(again.get()), qPrintable(again->lastMessage()));
    QCOMPARE(prompts_.size(), 2);
    // Somewhere else: asked again.
    again->document()->setParam("save", "path", "../victim/other.params");
    QVERIFY(!again->runGraph());
    QCOMPARE(prompts_.size(), 3);
    QVERIFY(prompts_[2].contains(victim_ + "/other.params"));
    QVERIFY(!QFile::exists(victim_ + "/other.params"));
  }

  void inside_the_folder_nothing_is_asked() {
    auto w = window();
    QVERIFY(w->loadFile(graphSaving("inside.json", "model.params")));
    QVERIFY(w->validateNow().ok());
    QVERIFY2(runToEnd(w.get()), qPrintable(w->lastMessage()));
    QVERIFY(prompts_.isEmpty());
    QVERIFY(QFile::exists(shared_ + "/model.params"));  // the graph's folder, not the working directory
  }

  void a_foreign_file_is_replaced_only_when_allowed_and_a_device_never() {
    {
      QFile f(shared_ + "/notes.txt");
      QVERIFY(f.open(QIODevice::WriteOnly) && f.write("my notes") > 0);
    }
    auto w = window();
    QVERIFY(w->loadFile(graphSaving("foreign.json", "notes.txt")));
    QVERIFY(!w->validateNow().ok());
    answer_ = QMessageBox::Cancel;
    QVERIFY(!w->runGraph());
    QCOMPARE(prompts_.size(), 1);
    QVERIFY2(prompts_[0].contains("replaces a file that gpunodes did not write"), qPrintable(prompts_[0]));
    QFile notes(shared_ + "/notes.txt");
    QVERIFY(notes.open(QIODevice::ReadOnly));
    QCOMPARE(notes.readAll(), QByteArray("my notes"));
    notes.close();
    answer_ = QMessageBox::Yes;
    QVERIFY2(runToEnd(w.get()), qPrintable(w->lastMessage()));
    QVERIFY(notes.open(QIODevice::ReadOnly));
    QVERIFY(notes.readAll().startsWith("GNPARAMS"));
    // A device: asked about (it is outside), and still refused after a yes.
    w->document()->setParam("save", "path", "/dev/null");
    QVERIFY(!w->runGraph());
    QVERIFY2(w->lastMessage().contains("not a regular file"), qPrintable(w->lastMessage()));
  }
};

QTEST_MAIN(TestFileConsent)
#include "test_file_consent.moc"
