// Helpers shared by the host SDK suites: the test node set loaded from its file, and small graph builders.
#pragma once
#include <QJsonObject>
#include <QtTest>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"
#include "time_scale.h"

namespace gn::test {

// The test-only node set (TestConst, TestAdd), loaded the way the host loads every plugin.
inline const core::NodeTypeRegistry& testRegistry() {
  static core::NodeTypeRegistry registry = [] {
    core::NodeTypeRegistry r;
    if (!r.loadPluginFile(QStringLiteral(GN_TEST_PLUGIN)))
      qFatal("cannot load the test plugin %s: %s", GN_TEST_PLUGIN,
             qPrintable(r.loadErrors().value(0).reason));
    return r;
  }();
  return registry;
}

inline core::GraphNode makeNode(const QString& id, const QString& type, const QJsonObject& params = {},
                                QPointF position = {}) {
  core::GraphNode n;
  n.id = id;
  n.type = type;
  n.params = params;
  n.position = position;
  return n;
}

inline core::GraphConnection wire(const QString& from, const QString& to) {
  core::GraphConnection c;
  c.from = *core::Endpoint::parse(from);
  c.to = *core::Endpoint::parse(to);
  return c;
}

}  // namespace gn::test
