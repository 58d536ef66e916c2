// The graph document: nodes with stable readable ids, connections node.port -> node.port, params, graph
// settings and view state. It emits signals on every change and knows nothing about graphics, so the
// editor, the headless runner and the tests share it.
#pragma once
#include <QHash>
#include <QJsonObject>
#include <QList>
#include <QObject>
#include <QPointF>
#include <QSet>
#include <QString>
#include <memory>
#include <optional>

namespace gn::core {

struct Subgraph;  // subgraph.h

struct GraphNode {
  QString id;    // "mm1": unique in the document, addressable from scripts (--set mm1.repeat=5)
  QString type;  // "MatMul"
  QPointF position;
  QJsonObject params;  // only the params the file sets; defaults come from the node type
  // Bypassed: the node does not run and each output passes on its first input of the same type. Muted: the
  // node does not run, nor does anything that needs it. Both are applied by runGraph() (run_graph.h).
  bool bypassed = false, muted = false;
  QJsonObject extra;   // fields this version does not know, kept for the next save
  // The inner graph of a node of type "Subgraph" (subgraph.h), null for every other node. Shared and never
  // changed in place: an edit makes a new one (setSubgraph), so copies of a document stay independent.
  std::shared_ptr<const Subgraph> subgraph;
};

struct Endpoint {
  QString node, port;
  QString str() const { return node + "." + port; }
  static std::optional<Endpoint> parse(const QString& text);  // "node.port"
  bool operator==(const Endpoint&) const = default;
};

struct GraphConnection {
  Endpoint from, to;  // an output port, an input port
  QJsonObject extra;
  bool operator==(const GraphConnection& o) const { return from == o.from && to == o.to; }
};

class GraphDocument : public QObject {
  Q_OBJECT
 public:
  explicit GraphDocument(QObject* parent = nullptr);

  QString name() const { return name_; }
  QString description() const { return description_; }
  QJsonObject settings() const { return settings_; }
  QJsonObject view() const { return view_; }
  QJsonObject extra() const { return extra_; }  // unknown top-level fields
  void setName(const QString& n);
  void setDescription(const QString& d);
  void setSettings(const QJsonObject& s);
  void setView(const QJsonObject& v);  // no signal: view state is not an edit
  void setExtra(const QJsonObject& e) { extra_ = e; }

  const QList<GraphNode>& nodes() const { return nodes_; }
  const QList<GraphConnection>& connections() const { return connections_; }
  const GraphNode* node(const QString& id) const;
  bool hasNode(const QString& id) const { return node(id) != nullptr; }
  // A fresh id for a node of `type`: the lower-case initials of its CamelCase words plus the smallest free
  // number ("MatMul" -> "mm1", "AllDevices" -> "ad1", "Tensor" -> "t1", then "t2"...).
  QString makeId(const QString& type) const;
  // Ids are 1-64 ASCII letters, digits, '_' or '-': no dot, so "node.port" stays unambiguous.
  static bool isValidId(const QString& id);

  // Edits. addNode keeps node.id when it is free, otherwise assigns makeId(type); returns the id used.
  QString addNode(GraphNode node);
  bool removeNode(const QString& id);  // also removes its connections
  bool setPosition(const QString& id, QPointF pos);
  bool setParam(const QString& id, const QString& param, const QJsonValue& value);  // Undefined removes
  bool setParams(const QString& id, const QJsonObject& params);
  bool setBypassed(const QString& id, bool on);
  bool setMuted(const QString& id, bool on);
  bool setSubgraph(const QString& id, std::shared_ptr<const Subgraph> subgraph);
  bool addConnection(const GraphConnection& c);  // refuses exact duplicates; no type checks here
  bool removeConnection(const GraphConnection& c);
  // Replaces the extra fields of the wire equal to `c` (same ends), such as the editor's reroute points;
  // false when there is no such wire.
  bool setConnectionExtra(const GraphConnection& c, const QJsonObject& extra);
  QList<GraphConnection> connectionsTo(const QString& nodeId) const;
  QList<GraphConnection> connectionsFrom(const QString& nodeId) const;
  // Replaces everything (load, undo snapshots) with one reset() signal.
  void replaceAll(const GraphDocument& other);
  void clear();
  // Sets nodes and connections exactly as given, duplicate ids included, with no signal: for loaders that
  // fill a fresh document (validation must see a file's duplicates, not silently renamed ones).
  void setContents(QList<GraphNode> nodes, QList<GraphConnection> connections);

 signals:
  void nodeAdded(const QString& id);
  void nodeRemoved(const QString& id);
  void nodeMoved(const QString& id);
  void paramsChanged(const QString& id);
  void runModeChanged(const QString& id);  // bypassed or muted
  void subgraphChanged(const QString& id);  // its inner graph, boundary ports or promoted params
  void connectionAdded(const gn::core::GraphConnection& c);
  void connectionRemoved(const gn::core::GraphConnection& c);
  void connectionChanged(const gn::core::GraphConnection& c);  // its extra fields
  void metadataChanged();  // name, description, settings
  void reset();
  void changed();  // after any of the above

 private:
  int indexOf(const QString& id) const;
  QString name_, description_;
  QJsonObject settings_, view_, extra_;
  QList<GraphNode> nodes_;
  QList<GraphConnection> connections_;
  // id -> position of its first node, a cache that const lookups fill: like every QObject, a document is
  // used from one thread at a time (the executor runs on a copy).
  mutable QHash<QString, int> index_;
  mutable bool indexValid_ = false;
  // Every connection, as wireKey(), for addConnection's duplicate check; rebuilt after a removal.
  QSet<QString> wires_;
  bool wiresValid_ = false;
  static QString wireKey(const GraphConnection& c);
};

}  // namespace gn::core
