// Editor benchmark: opening a generated 1000-node, 1500-wire graph, and the frame time while panning and
// zooming it, offscreen. The same measurements on a 10-node graph run alongside as the peer, and the table
// prints the ratio. Budgets (open < 1 s, frame < 16 ms) are printed next to the figures; nothing fails here.
#include <QApplication>
#include <QElapsedTimer>
#include <QScrollBar>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "canvas/graph_view.h"
#include "fake_nodes.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "main_window.h"

using namespace gn;

namespace {

// Columns of nodes: the first quarter are Tensor sources, the rest MatMuls fed by two nodes of the previous
// columns, so wires stay mostly local as in a real graph. Exactly `nodes` nodes and 2 wires per MatMul.
void generate(core::GraphDocument& doc, int nodes, int rows) {
  std::mt19937 rng(1);
  const int sources = nodes / 4;
  QList<core::GraphNode> list;
  QList<core::GraphConnection> wires;
  for (int i = 0; i < nodes; ++i) {
    core::GraphNode n;
    n.id = QString("n%1").arg(i);
    n.type = i < sources ? "Tensor" : "MatMul";
    n.position = QPointF((i / rows) * 260.0, (i % rows) * 170.0);
    if (n.type == "MatMul") {
      n.params.insert("repeat", int(rng() % 50) + 1);
      const int col = i / rows;
      for (const char* port : {"a", "b"}) {
        int lo = qMax(0, (col - 3) * rows), hi = col * rows;  // the three columns before
        if (hi <= lo) lo = 0, hi = i;                         // first column: any earlier node
        const int src = lo + int(rng() % uint(hi - lo));
        wires << core::GraphConnection{{QString("n%1").arg(src), "out"}, {n.id, port}, {}};
      }
    }
    list << n;
  }
  for (const core::GraphNode& n : list) doc.addNode(n);
  for (const core::GraphConnection& c : wires) doc.addConnection(c);
}

struct Stats {
  double mean = 0, p95 = 0, max = 0;
};

Stats stats(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  Stats s;
  for (double x : v) s.mean += x;
  s.mean /= double(v.size());
  s.p95 = v[size_t(double(v.size() - 1) * 0.95)];
  s.max = v.back();
  return s;
}

struct Result {
  double openMs = 0;
  Stats fit, pan, zoom, panZoomedOut;
};

double ms(const QElapsedTimer& t) {
  return double(t.nsecsElapsed()) / 1e6;
}

Result measure(const core::NodeTypeRegistry& registry, const QString& file) {
  Result r;
  editor::MainWindow w(&registry);
  w.setPromptHandler([](auto...) { return QMessageBox::Discard; });
  w.resize(1600, 1000);
  w.show();
  QApplication::processEvents();
  QWidget* vp = w.view()->viewport();
  vp->grab();

  // Open: parse, build the document, build the scene, and paint the first frame.
  QElapsedTimer t;
  t.start();
  if (!w.loadFile(file)) qFatal("cannot load %s", qPrintable(file));
  vp->grab();
  r.openMs = ms(t);

  auto frames = [&](int n, auto step) {
    std::vector<double> v;
    for (int i = 0; i < n; ++i) {
      step(i);
      QElapsedTimer f;
      f.start();
      vp->grab();
      v.push_back(ms(f));
    }
    return stats(v);
  };
  w.view()->frame(false);
  r.fit = frames(30, [](int) {});
  r.panZoomedOut = frames(60, [&](int i) {
    QScrollBar* h = w.view()->horizontalScrollBar();
    h->setValue(h->value() + (i % 20 < 10 ? 15 : -15));
  });
  w.view()->setZoom(1.0);
  w.view()->centerOn(w.scene()->nodesRect(false).center());
  r.pan = frames(60, [&](int i) {
    QScrollBar* h = w.view()->horizontalScrollBar();
    QScrollBar* v = w.view()->verticalScrollBar();
    h->setValue(h->value() + (i % 20 < 10 ? 25 : -25));
    v->setValue(v->value() + (i % 10 < 5 ? 10 : -10));
  });
  const QPoint c = vp->rect().center();
  r.zoom = frames(60, [&](int i) { w.view()->zoomAt(i % 30 < 15 ? 0.85 : 1 / 0.85, c); });
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  if (qEnvironmentVariableIsEmpty("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  QTemporaryDir dir;
  QStandardPaths::setTestModeEnabled(true);
  qputenv("XDG_CONFIG_HOME", (dir.path() + "/config").toUtf8());
  qputenv("GPUNODES_RECOVERY_DIR", (dir.path() + "/recovery").toUtf8());
  QApplication app(argc, argv);
  testing::FakeNodeSet fake;
  core::NodeTypeRegistry registry;
  registry.addPlugin(&fake, "fake");

  core::GraphDocument big, small;
  generate(big, 1000, 25);
  generate(small, 10, 5);
  const QString bigFile = dir.filePath("big.json"), smallFile = dir.filePath("small.json");
  QString error;
  if (!core::serializer::saveFile(bigFile, big, &error) ||
      !core::serializer::saveFile(smallFile, small, &error))
    qFatal("%s", qPrintable(error));

  measure(registry, smallFile);  // warm up fonts, caches and the allocator
  const Result s = measure(registry, smallFile);
  const Result b = measure(registry, bigFile);

  std::printf("editor benchmark: %d nodes / %d wires vs %d nodes / %d wires, offscreen 1600x1000, ms\n",
              int(big.nodes().size()), int(big.connections().size()), int(small.nodes().size()),
              int(small.connections().size()));
  std::printf("%-34s %10s %10s %8s %8s\n", "measure", "10 nodes", "1000", "ratio", "budget");
  auto row = [](const char* name, double a, double bb, const char* budget) {
    std::printf("%-34s %10.2f %10.2f %8.2f %8s\n", name, a, bb, a > 0 ? bb / a : 0.0, budget);
  };
  row("open (load + scene + first frame)", s.openMs, b.openMs, "< 1000");
  row("frame, fit all: mean", s.fit.mean, b.fit.mean, "< 16");
  row("frame, fit all: p95", s.fit.p95, b.fit.p95, "< 16");
  row("frame, pan zoomed out: mean", s.panZoomedOut.mean, b.panZoomedOut.mean, "< 16");
  row("frame, pan zoomed out: p95", s.panZoomedOut.p95, b.panZoomedOut.p95, "< 16");
  row("frame, pan at 100%: mean", s.pan.mean, b.pan.mean, "< 16");
  row("frame, pan at 100%: p95", s.pan.p95, b.pan.p95, "< 16");
  row("frame, zoom at cursor: mean", s.zoom.mean, b.zoom.mean, "< 16");
  row("frame, zoom at cursor: p95", s.zoom.p95, b.zoom.p95, "< 16");
  row("frame, zoom at cursor: max", s.zoom.max, b.zoom.max, "< 16");
  return 0;
}
