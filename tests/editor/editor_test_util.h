// Helpers shared by the editor suites: mouse events with explicit button state (QTest's mouseMove carries no
// buttons on every Qt version), an order-independent form of a document for comparisons, and an isolated
// settings and recovery location per test run.
#pragma once
#include <QApplication>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QMouseEvent>
#include <QStandardPaths>
#include <QTemporaryDir>
#include <QTest>
#include <algorithm>
#include <memory>

#include "canvas/graph_view.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "main_window.h"

namespace gn::testing {

inline void sendMouse(QWidget* w, QEvent::Type type, QPoint pos, Qt::MouseButton button,
                      Qt::MouseButtons buttons, Qt::KeyboardModifiers mods = Qt::NoModifier) {
  QMouseEvent e(type, QPointF(pos), QPointF(w->mapToGlobal(pos)), button, buttons, mods);
  QApplication::sendEvent(w, &e);
}

// Press at `from`, move in steps with the button held, release at `to`.
inline void drag(QWidget* w, QPoint from, QPoint to, Qt::MouseButton button = Qt::LeftButton, int steps = 6) {
  sendMouse(w, QEvent::MouseButtonPress, from, button, button);
  for (int i = 1; i <= steps; ++i) {
    const QPoint p = from + (to - from) * i / steps;
    sendMouse(w, QEvent::MouseMove, p, Qt::NoButton, button);
  }
  sendMouse(w, QEvent::MouseButtonRelease, to, button, Qt::NoButton);
}

inline QPoint viewPoint(editor::GraphView* v, QPointF scenePos) {
  return v->mapFromScene(scenePos);
}

inline QPoint portPoint(editor::GraphView* v, const QString& node, bool output, const QString& port) {
  editor::NodeItem* n = v->graphScene()->nodeItem(node);
  return viewPoint(v, n->portScenePos(output, n->portIndex(output, port)));
}

// The document with nodes sorted by id and wires sorted, so two documents compare equal when they hold the
// same graph, whatever order edits and undo left them in.
inline QByteArray normalized(const core::GraphDocument& doc) {
  QJsonObject o = core::serializer::toJson(doc);
  QJsonArray nodes = o.value("nodes").toArray(), conns = o.value("connections").toArray();
  QList<QJsonValue> n(nodes.begin(), nodes.end()), c(conns.begin(), conns.end());
  std::sort(n.begin(), n.end(), [](const QJsonValue& a, const QJsonValue& b) {
    return a.toObject().value("id").toString() < b.toObject().value("id").toString();
  });
  auto key = [](const QJsonValue& v) {
    return v.toObject().value("from").toString() + ">" + v.toObject().value("to").toString();
  };
  std::sort(c.begin(), c.end(), [&](const QJsonValue& a, const QJsonValue& b) { return key(a) < key(b); });
  QJsonArray sn, sc;
  for (const QJsonValue& v : n) sn.append(v);
  for (const QJsonValue& v : c) sc.append(v);
  o.insert("nodes", sn);
  o.insert("connections", sc);
  o.remove("view");
  return QJsonDocument(o).toJson(QJsonDocument::Compact);
}

// Loads the plugin at `path` into `registry`: empty when it loaded, else why it did not.
inline QString loadPlugin(core::NodeTypeRegistry& registry, const QString& path) {
  if (registry.loadPluginFile(path)) return {};
  QString why = QStringLiteral("the node plugin did not load:");
  for (const auto& e : registry.loadErrors()) why += "\n" + e.path + ": " + e.reason;
  return why;
}

// initTestCase of the suites that run the GPU node set: loads it, or skips the suite where it is not built.
#ifdef GN_NODES_PLUGIN
#define GN_REQUIRE_NODES_PLUGIN(registry)                                        \
  do {                                                                           \
    const QString failed = ::gn::testing::loadPlugin(registry, GN_NODES_PLUGIN); \
    QVERIFY2(failed.isEmpty(), qPrintable(failed));                              \
  } while (0)
#else
#define GN_REQUIRE_NODES_PLUGIN(registry) QSKIP("built without the gpunodes_nodes plugin target")
#endif

// A shown main window that answers every question with Discard, as the suites that run graphs want it.
inline std::unique_ptr<editor::MainWindow> discardingWindow(const core::NodeTypeRegistry* registry) {
  auto w = std::make_unique<editor::MainWindow>(registry);
  w->setPromptHandler([](auto...) { return QMessageBox::Discard; });
  w->show();
  return w;
}

// A shown main window whose questions never open a dialog: each one's text is added to `prompts`, and it is
// answered with `*answer` (Discard when null), read at the time of the question.
inline std::unique_ptr<editor::MainWindow> promptRecordingWindow(
    const core::NodeTypeRegistry* registry, QStringList* prompts,
    const QMessageBox::StandardButton* answer = nullptr) {
  auto w = std::make_unique<editor::MainWindow>(registry);
  w->setPromptHandler([prompts, answer](QMessageBox::Icon, const QString&, const QString& text,
                                        QMessageBox::StandardButtons) {
    *prompts << text;
    return answer ? *answer : QMessageBox::Discard;
  });
  w->show();
  return w;
}

// Settings (dock layout, recent files) and recovery files go to a private folder, never the user's.
struct IsolatedEnv {
  QTemporaryDir dir;
  IsolatedEnv() {
    QStandardPaths::setTestModeEnabled(true);
    qputenv("XDG_CONFIG_HOME", (dir.path() + "/config").toUtf8());
    qputenv("GPUNODES_RECOVERY_DIR", (dir.path() + "/recovery").toUtf8());
  }
};

}  // namespace gn::testing
