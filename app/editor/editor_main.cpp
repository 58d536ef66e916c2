#include "editor_main.h"

#include <QApplication>
#include <QDockWidget>
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QPainter>
#include <QPainterPath>
#include <QPalette>
#include <QStyleFactory>
#include <QTimer>
#include <functional>
#include <memory>

#include "canvas/graph_view.h"
#include "gpunodes/core/registry.h"
#include "graph_editor.h"
#include "main_window.h"
#include "plots.h"
#include "process_dialog.h"
#include "results_views.h"
#include "run_controller.h"
#include "subgraph_navigator.h"

namespace {

QIcon appIcon() {
  // Drawn rather than loaded: Qt's SVG plugin is not a dependency.
  QPixmap pm(64, 64);
  pm.fill(Qt::transparent);
  QPainter p(&pm);
  p.setRenderHint(QPainter::Antialiasing);
  p.setPen(Qt::NoPen);
  p.setBrush(QColor(0x23, 0x26, 0x2b));
  p.drawRoundedRect(2, 2, 60, 60, 10, 10);
  QPainterPath wire(QPointF(20, 22));
  wire.cubicTo(34, 22, 30, 42, 44, 42);
  p.setPen(QPen(QColor(0x5f, 0xd3, 0x6a), 3));
  p.setBrush(Qt::NoBrush);
  p.drawPath(wire);
  p.setPen(Qt::NoPen);
  p.setBrush(QColor(0x4f, 0xa3, 0xff));
  p.drawRoundedRect(8, 14, 16, 16, 3, 3);
  p.setBrush(QColor(0xff, 0x8c, 0x42));
  p.drawRoundedRect(40, 34, 16, 16, 3, 3);
  return QIcon(pm);
}

void applyTheme(QApplication& app) {
  app.setStyle(QStyleFactory::create("Fusion"));
  QPalette pal;
  pal.setColor(QPalette::Window, QColor(0x2a, 0x2d, 0x32));
  pal.setColor(QPalette::WindowText, QColor(0xdf, 0xe2, 0xe7));
  pal.setColor(QPalette::Base, QColor(0x1e, 0x20, 0x24));
  pal.setColor(QPalette::AlternateBase, QColor(0x26, 0x29, 0x2e));
  pal.setColor(QPalette::Text, QColor(0xdf, 0xe2, 0xe7));
  pal.setColor(QPalette::Button, QColor(0x33, 0x37, 0x3d));
  pal.setColor(QPalette::ButtonText, QColor(0xdf, 0xe2, 0xe7));
  pal.setColor(QPalette::Highlight, QColor(0x3d, 0x5a, 0x80));
  pal.setColor(QPalette::HighlightedText, Qt::white);
  pal.setColor(QPalette::ToolTipBase, QColor(0x22, 0x25, 0x2a));
  pal.setColor(QPalette::ToolTipText, QColor(0xdf, 0xe2, 0xe7));
  pal.setColor(QPalette::PlaceholderText, QColor(0x80, 0x86, 0x8e));
  pal.setColor(QPalette::Disabled, QPalette::Text, QColor(0x70, 0x74, 0x7a));
  pal.setColor(QPalette::Disabled, QPalette::ButtonText, QColor(0x70, 0x74, 0x7a));
  app.setPalette(pal);
  QFile qss(":/gpunodes/editor.qss");
  if (qss.open(QIODevice::ReadOnly)) app.setStyleSheet(QString::fromUtf8(qss.readAll()));
}

// For screenshots of one plot tab: the Plots dock raised with that tab current and given most of the lower
// part of the window, so that a confusion matrix or the mistakes grid is large enough to read.
void showPlotTab(gn::editor::MainWindow& w) {
  const QString tab = qEnvironmentVariable("GPUNODES_EDITOR_PLOT");
  if (tab.isEmpty()) return;
  gn::editor::PlotsPanel* plots = w.plots();
  for (int i = 0; i < plots->count(); ++i)
    if (plots->tabText(i).compare(tab, Qt::CaseInsensitive) == 0) plots->setCurrentIndex(i);
  auto* dock = w.findChild<QDockWidget*>("plotsDock");
  auto* timeline = w.findChild<QDockWidget*>("timelineDock");
  if (dock) {
    dock->raise();
    w.resizeDocks({dock}, {w.height() / 2}, Qt::Vertical);
    // The Attention tab's heads side by side want the width more than the timeline does.
    const int timelineShare = tab.compare("Attention", Qt::CaseInsensitive) == 0 ? 8 : 5;
    if (timeline)
      w.resizeDocks({timeline, dock}, {w.width() / timelineShare, w.width() - w.width() / timelineShare},
                    Qt::Horizontal);
    // The canvas is smaller now: once the docks have their new sizes, centre it again on the selection (at
    // the zoom GPUNODES_EDITOR_VIEW asked for), or frame the whole graph.
    if (qEnvironmentVariable("GPUNODES_EDITOR_VIEW").split(',').size() != 3)
      QTimer::singleShot(100, &w, [&w] {
        const QStringList selected = w.scene()->selectedNodeIds();
        if (selected.isEmpty())
          w.view()->frame(false);
        else
          w.view()->centerOnNode(selected.first());
      });
  }
  bool ok = false;
  const int row = qEnvironmentVariable("GPUNODES_EDITOR_MISTAKE").toInt(&ok);
  if (ok) plots->mistakesView()->showMistake(row);
  if (qEnvironmentVariable("GPUNODES_EDITOR_OVERLAY") == "1")
    for (int run : plots->earlierRuns()) plots->setRunOverlaid(run, true);
}

// One entry of GPUNODES_EDITOR_RUN: a schedule ("sequential"), or params to set before the run
// ("train.lr=0.3;data.limit=3000"; a value that is not JSON is a string).
void applyRunEntry(gn::editor::MainWindow& w, const QString& entry) {
  if (entry.isEmpty()) return;
  if (!entry.contains('=')) {
    w.editor()->setSetting("schedule", entry);
    return;
  }
  for (const QString& assignment : entry.split(';', Qt::SkipEmptyParts)) {
    const QString target = assignment.section('=', 0, 0), text = assignment.section('=', 1);
    const QJsonArray parsed = QJsonDocument::fromJson(("[" + text + "]").toUtf8()).array();
    w.editor()->setParam(target.section('.', 0, 0), target.section('.', 1),
                         parsed.size() == 1 ? parsed.first() : QJsonValue(text));
  }
}

}  // namespace

int runEditor(int argc, char** argv, const QString& file) {
  QApplication app(argc, argv);
  QApplication::setApplicationName("gpunodes");
  QApplication::setOrganizationName("gpunodes");
  QApplication::setApplicationDisplayName("gpunodes");
  QApplication::setWindowIcon(appIcon());
  applyTheme(app);

  gn::core::NodeTypeRegistry registry;
  registry.loadPlugins();
  gn::editor::MainWindow window(&registry);
  window.show();

  const QString shot = qEnvironmentVariable("GPUNODES_EDITOR_SCREENSHOT");
  // A screenshot run must not stop at a question no one will answer.
  const bool restored = shot.isEmpty() && window.offerRecovery();
  if (!file.isEmpty() && !restored) window.loadFile(file);
  // For screenshots: a node to select (the inspector shows it), and a view "zoom[,x,y]" centred on a scene
  // point or else on the selection, so the grab can show text that framing the whole graph makes too small.
  // A subgraph to open, by path ("block1/inner"), as double-clicking each would; the selection is then made
  // inside it.
  for (const QString& step : qEnvironmentVariable("GPUNODES_EDITOR_ENTER").split('/', Qt::SkipEmptyParts))
    window.navigator()->enter(step);
  if (const QString select = qEnvironmentVariable("GPUNODES_EDITOR_SELECT"); !select.isEmpty())
    window.navigator()->currentScene()->selectNodes({select});
  if (const QStringList view = qEnvironmentVariable("GPUNODES_EDITOR_VIEW").split(',', Qt::SkipEmptyParts);
      !view.isEmpty()) {
    window.view()->setZoom(view[0].toDouble());
    const QStringList selected = window.scene()->selectedNodeIds();
    if (view.size() == 3)
      window.view()->centerOn(view[1].toDouble(), view[2].toDouble());
    else if (!selected.isEmpty())
      window.view()->centerOnNode(selected.first());
  }

  if (!shot.isEmpty()) {
    auto grab = [&window, &app, shot] {
      showPlotTab(window);
      QTimer::singleShot(600, &app, [&window, &app, shot] {
        window.grab().save(shot);
        window.setPromptHandler([](auto...) { return QMessageBox::Discard; });
        app.quit();
      });
    };
    // "1" runs once; a list such as "sequential,parallel" runs under each schedule in turn, so the timing
    // plot compares them and the timeline shows the last. GPUNODES_EDITOR_PROCESSES, a list of process
    // counts ("0,2": in this process, then on 2 processes under mpirun with the Run on processes dialog's
    // remembered arguments), says where each run goes, and without GPUNODES_EDITOR_RUN makes the list itself.
    QStringList runs = qEnvironmentVariable("GPUNODES_EDITOR_RUN").split(',', Qt::SkipEmptyParts);
    const QStringList processes =
        qEnvironmentVariable("GPUNODES_EDITOR_PROCESSES").split(',', Qt::SkipEmptyParts);
    if (runs == QStringList{"1"}) runs = QStringList{QString()};
    if (runs.isEmpty() && !processes.isEmpty()) runs = QStringList(processes.size(), QString());
    if (runs.isEmpty() || runs == QStringList{"0"}) {
      grab();
    } else {
      auto next = std::make_shared<std::function<void()>>();
      *next = [&window, runs, processes, grab, next, i = 0]() mutable {
        if (i == runs.size()) {
          grab();
          return;
        }
        applyRunEntry(window, runs[i]);
        gn::editor::ProcessRunOptions options = gn::editor::ProcessRunDialog::remembered();
        options.processes = processes.value(i).toInt();
        ++i;
        if (!(options.processes > 0 ? window.runOnProcesses(options) : window.runGraph())) grab();
      };
      QObject::connect(window.runner(), &gn::editor::RunController::finished, &app,
                       [next] { QTimer::singleShot(100, [next] { (*next)(); }); });
      QTimer::singleShot(400, &app, [next] { (*next)(); });
    }
  }
  return app.exec();
}
