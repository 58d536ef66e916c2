// Model files in the editor (model_conversion.h), with the real GPU node set and a real ONNX file written by
// the ONNX library's Python helper: File > Import makes a graph beside its weights (a relative path to them)
// and opens it, and the graph runs; a model file dropped on the canvas does the same; a file the importer
// refuses leaves the document and the folder as they were, with the error in the log.
#include <QDir>
#include <QFile>
#include <QListWidget>
#include <QMenuBar>
#include <QMimeData>
#include <QProcess>
#include <QTemporaryDir>
#include <QUrl>

#include "canvas/graph_view.h"
#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "main_window.h"
#include "run_controller.h"

using namespace gn;
using editor::MainWindow;

namespace {

// A 2-layer MLP over 1x4x4 images as torch.onnx.export writes one (Flatten, Gemm with transB, Relu, Gemm),
// with fixed weights, written by the onnx package's helper.
constexpr char kWriteMlp[] = R"(
import sys, numpy as np, onnx
from onnx import helper, TensorProto, numpy_helper
rng = np.random.default_rng(7)
w1 = numpy_helper.from_array(rng.standard_normal((8, 16)).astype(np.float32), "fc1.weight")
b1 = numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "fc1.bias")
w2 = numpy_helper.from_array(rng.standard_normal((3, 8)).astype(np.float32), "fc2.weight")
b2 = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "fc2.bias")
nodes = [helper.make_node("Flatten", ["x"], ["f"], name="flat", axis=1),
         helper.make_node("Gemm", ["f", "fc1.weight", "fc1.bias"], ["h"], name="fc1", transB=1),
         helper.make_node("Relu", ["h"], ["r"], name="act"),
         helper.make_node("Gemm", ["r", "fc2.weight", "fc2.bias"], ["logits"], name="fc2", transB=1)]
g = helper.make_graph(nodes, "tiny mlp",
                      [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 1, 4, 4])],
                      [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 3])],
                      [w1, b1, w2, b2])
m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], producer_name="pytorch")
m.ir_version = 8
onnx.checker.check_model(m)
onnx.save(m, sys.argv[1])
)";

}  // namespace

class TestModelFiles : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  QTemporaryDir dir_;
  QString model_;
  QStringList prompts_, chosen_;
  QString answerFile_;  // what the file chooser answers

  std::unique_ptr<MainWindow> window() {
    auto w = std::make_unique<MainWindow>(&registry_);
    w->setPromptHandler([this](QMessageBox::Icon, const QString&, const QString& text,
                               QMessageBox::StandardButtons) {
      prompts_ << text;
      return QMessageBox::Discard;  // "unsaved changes?": the tests never keep them
    });
    w->setFileChooser([this](const QString& title, const QString& suggested, const QString&, bool) {
      chosen_ << title + " | " + suggested;
      return answerFile_;
    });
    w->show();
    return w;
  }

  static QString typeOf(const core::GraphDocument* doc, const QString& type) {
    for (const core::GraphNode& n : doc->nodes())
      if (n.type == type) return n.id;
    return {};
  }

 private slots:
  void initTestCase() {
    GN_REQUIRE_NODES_PLUGIN(registry_);
    QVERIFY(dir_.isValid());
    model_ = dir_.filePath("models/tiny.onnx");
    QVERIFY(QDir().mkpath(dir_.filePath("models")) && QDir().mkpath(dir_.filePath("graphs")));
    QProcess py;
    py.start("/usr/bin/python3", {"-c", kWriteMlp, model_});
    QVERIFY(py.waitForFinished(60000));
    QVERIFY2(py.exitCode() == 0, py.readAllStandardError().constData());
  }
  void init() { prompts_.clear(), chosen_.clear(); }

  void theImportMenuListsThePluginsFormats() {
    auto w = window();
    QMenu* import = nullptr;
    for (QAction* a : w->menuBar()->actions())
      if (a->text() == "&File")
        for (QAction* b : a->menu()->actions())
          if (b->text() == "&Import") import = b->menu();
    QVERIFY(import);
    QStringList entries;
    for (QAction* a : import->actions()) entries << a->text();
    QCOMPARE(entries, QStringList{"ONNX model…"});
    QMenu* exp = nullptr;
    for (QAction* a : w->menuBar()->actions())
      if (a->text() == "&File")
        for (QAction* b : a->menu()->actions())
          if (b->text() == "E&xport") exp = b->menu();
    QVERIFY(exp);
    QVERIFY(exp->actions().first()->text() == "ONNX model…");
  }

  void anImportedModelOpensBesideItsWeightsAndRuns() {
    auto w = window();
    const QString graph = dir_.filePath("graphs/tiny.json");
    QVERIFY2(w->importModel(model_, graph), qPrintable(w->lastMessage()));
    QCOMPARE(w->currentFile(), QFileInfo(graph).absoluteFilePath());
    QVERIFY(QFile::exists(dir_.filePath("graphs/tiny.safetensors")));
    for (const QString& type : {"Network", "LoadParams", "Linear", "ReLU"})
      QVERIFY2(!typeOf(w->document(), type).isEmpty(), qPrintable(type));
    // The weights are named relative to the graph's folder, so the two move together.
    const QString load = typeOf(w->document(), "LoadParams");
    QCOMPARE(w->document()->node(load)->params.value("path").toString(), QStringLiteral("tiny.safetensors"));
    QVERIFY(w->validateNow().ok());
    QVERIFY(w->runGraph());
    QElapsedTimer t;
    t.start();
    while (w->runner()->isRunning() && t.elapsed() < 60000) QTest::qWait(20);
    QVERIFY2(w->runner()->report().value("ok").toBool(), qPrintable(w->lastMessage()));
    QVERIFY(prompts_.isEmpty());  // reading weights inside the folder asks nothing
  }

  // The imported graph exported again: a file the ONNX checker takes, whose initializers are the weights.
  void anImportedModelExportsBack() {
    auto w = window();
    QVERIFY(w->loadFile(dir_.filePath("graphs/tiny.json")));
    const QString net = typeOf(w->document(), "Network"), out = dir_.filePath("graphs/tiny-again.onnx");
    QVERIFY2(w->exportModel("ONNX", net, dir_.filePath("graphs/tiny.safetensors"), out), qPrintable(w->lastMessage()));
    QProcess py;
    py.start("/usr/bin/python3", {"-c", "import onnx, sys\nm = onnx.load(sys.argv[1])\nonnx.checker.check_model(m, "
                                        "full_check=True)\nprint(m.producer_name, sorted(i.name for i in m.graph.initializer))",
                                  out});
    QVERIFY(py.waitForFinished(60000));
    QVERIFY2(py.exitCode() == 0, py.readAllStandardError().constData());
    const QString printed = QString::fromUtf8(py.readAllStandardOutput()).trimmed();
    QVERIFY2(printed.startsWith("gpunodes ["), qPrintable(printed));
    QVERIFY2(printed.contains("fc1.weight") && printed.contains("fc2.bias"), qPrintable(printed));
    // A network the converter cannot write is refused with its reason, and nothing is written.
    const QString bad = dir_.filePath("graphs/not-a-network.onnx");
    QVERIFY(!w->exportModel("ONNX", typeOf(w->document(), "Device"), {}, bad));
    QVERIFY(!QFile::exists(bad));
    QVERIFY(!w->lastMessage().isEmpty());
  }

  void aRefusedModelLeavesTheDocumentAndTheFolderAlone() {
    auto w = window();
    const QString graph = dir_.filePath("graphs/tiny.json");
    QVERIFY(w->loadFile(graph));
    const qsizetype nodes = w->document()->nodes().size();
    const QString bad = dir_.filePath("models/not-a-model.onnx");
    QFile f(bad);
    QVERIFY(f.open(QIODevice::WriteOnly) && f.write("this is not protobuf\n") > 0);
    f.close();
    const QString target = dir_.filePath("graphs/refused.json");
    QVERIFY(!w->importModel(bad, target));
    QCOMPARE(w->document()->nodes().size(), nodes);
    QCOMPARE(w->currentFile(), QFileInfo(graph).absoluteFilePath());
    QVERIFY(!QFile::exists(target));
    QVERIFY(!QFile::exists(dir_.filePath("graphs/refused.safetensors")));
    QVERIFY2(w->lastMessage().contains("not-a-model.onnx"), qPrintable(w->lastMessage()));
    bool logged = false;
    for (int i = 0; i < w->log()->count(); ++i) logged |= w->log()->item(i)->text().contains("not-a-model.onnx");
    QVERIFY(logged);
  }

  void aModelDroppedOnTheCanvasIsImported() {
    auto w = window();
    w->newGraph();
    answerFile_ = dir_.filePath("graphs/dropped.json");
    QMimeData mime;
    mime.setUrls({QUrl::fromLocalFile(model_)});
    const QPoint at = w->view()->viewport()->rect().center();
    QDragEnterEvent enter(at, Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(w->view()->viewport(), &enter);
    QVERIFY(enter.isAccepted());
    QDropEvent drop(at, Qt::CopyAction, &mime, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(w->view()->viewport(), &drop);
    QVERIFY(drop.isAccepted());
    QTRY_COMPARE(w->currentFile(), QFileInfo(answerFile_).absoluteFilePath());
    QCOMPARE(chosen_.size(), 1);
    QVERIFY2(chosen_[0].endsWith(dir_.filePath("models/tiny.json")), qPrintable(chosen_[0]));  // beside the model
    QVERIFY(QFile::exists(dir_.filePath("graphs/dropped.safetensors")));
    QVERIFY(!typeOf(w->document(), "Network").isEmpty());
    // A file of no format a plugin reads is not taken.
    QMimeData text;
    text.setUrls({QUrl::fromLocalFile(dir_.filePath("notes.txt"))});
    QDragMoveEvent over(at, Qt::CopyAction, &text, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(w->view()->viewport(), &over);
    QVERIFY(!over.isAccepted());
    QDropEvent other(at, Qt::CopyAction, &text, Qt::LeftButton, Qt::NoModifier);
    QApplication::sendEvent(w->view()->viewport(), &other);
    QTest::qWait(50);
    QCOMPARE(chosen_.size(), 1);
    QCOMPARE(w->currentFile(), QFileInfo(answerFile_).absoluteFilePath());
  }
};

QTEST_MAIN(TestModelFiles)
#include "test_model_files.moc"
