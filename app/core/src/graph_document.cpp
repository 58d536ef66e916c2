#include "gpunodes/core/graph_document.h"

#include <QSet>

namespace gn::core {

std::optional<Endpoint> Endpoint::parse(const QString& text) {
  // Ids and port names never contain a dot, so the first dot is the separator.
  const qsizetype dot = text.indexOf(u'.');
  if (dot <= 0 || dot == text.size() - 1) return std::nullopt;
  Endpoint e{text.left(dot), text.mid(dot + 1)};
  if (e.port.contains(u'.')) return std::nullopt;
  return e;
}

GraphDocument::GraphDocument(QObject* parent) : QObject(parent) {}

QString GraphDocument::wireKey(const GraphConnection& c) {
  // The lengths first: then no two different wires share a key, whatever their names hold.
  return QStringLiteral("%1:%2:%3:%4:%5.%6>%7.%8")
      .arg(c.from.node.size())
      .arg(c.from.port.size())
      .arg(c.to.node.size())
      .arg(c.to.port.size())
      .arg(c.from.node, c.from.port, c.to.node, c.to.port);
}

bool GraphDocument::isValidId(const QString& id) {
  if (id.isEmpty() || id.size() > 64) return false;
  for (QChar c : id)
    if (!(c.isLetterOrNumber() && c.unicode() < 128) && c != u'_' && c != u'-') return false;
  return true;
}

void GraphDocument::setName(const QString& n) {
  if (n == name_) return;
  name_ = n;
  emit metadataChanged();
  emit changed();
}

void GraphDocument::setDescription(const QString& d) {
  if (d == description_) return;
  description_ = d;
  emit metadataChanged();
  emit changed();
}

void GraphDocument::setSettings(const QJsonObject& s) {
  if (s == settings_) return;
  settings_ = s;
  emit metadataChanged();
  emit changed();
}

void GraphDocument::setView(const QJsonObject& v) {
  view_ = v;
}

int GraphDocument::indexOf(const QString& id) const {
  // A hash of id -> first position, rebuilt after a removal or a replacement: a scan per lookup made adding
  // or pasting n nodes cost n^2, which a pasted clipboard or a loaded file of 100,000 nodes turns into a
  // hang.
  if (!indexValid_) {
    index_.clear();
    index_.reserve(nodes_.size());
    for (int i = 0; i < nodes_.size(); ++i)
      if (!index_.contains(nodes_[i].id)) index_.insert(nodes_[i].id, i);  // a duplicate id finds its first
    indexValid_ = true;
  }
  return index_.value(id, -1);
}

const GraphNode* GraphDocument::node(const QString& id) const {
  const int i = indexOf(id);
  return i < 0 ? nullptr : &nodes_[i];
}

static QString idPrefix(const QString& type) {
  // Initials of the CamelCase words: "MatMul" -> "mm", "AllDevices" -> "ad", "Tensor" -> "t"; an acronym
  // counts as one word ("NCCLAllReduce" -> "nar"). Only ASCII letters, so ids stay valid.
  auto letter = [](QChar c) { return c.unicode() < 128 && c.isLetter(); };
  QString prefix;
  for (qsizetype i = 0; i < type.size(); ++i) {
    const QChar c = type[i];
    if (!letter(c)) continue;
    const QChar prev = i > 0 ? type[i - 1] : QChar();
    const QChar next = i + 1 < type.size() ? type[i + 1] : QChar();
    const bool start = !letter(prev) || (c.isUpper() && prev.isLower()) ||
                       (c.isUpper() && prev.isUpper() && next.isLower());  // "NCCLAll": the A
    if (start) prefix += c.toLower();
  }
  return prefix.isEmpty() ? QStringLiteral("n") : prefix;
}

QString GraphDocument::makeId(const QString& type) const {
  const QString prefix = idPrefix(type);
  // One pass over the ids, so adding many nodes stays linear per node.
  QSet<int> taken;
  for (const GraphNode& n : nodes_) {
    if (!n.id.startsWith(prefix)) continue;
    bool ok = false;
    const int number = QStringView(n.id).mid(prefix.size()).toInt(&ok);
    if (ok && number > 0) taken.insert(number);
  }
  int n = 1;
  while (taken.contains(n)) ++n;
  return prefix + QString::number(n);
}

QString GraphDocument::addNode(GraphNode node) {
  if (!isValidId(node.id) || indexOf(node.id) >= 0) node.id = makeId(node.type);
  nodes_.append(node);
  if (indexValid_ && !index_.contains(node.id)) index_.insert(node.id, int(nodes_.size()) - 1);
  emit nodeAdded(node.id);
  emit changed();
  return node.id;
}

bool GraphDocument::removeNode(const QString& id) {
  const int i = indexOf(id);
  if (i < 0) return false;
  nodes_.removeAt(i);
  indexValid_ = false;  // every later position moved
  // A loaded file may hold the id twice; the wires stay while a node of that id remains.
  if (indexOf(id) < 0) {
    for (int c = connections_.size() - 1; c >= 0; --c) {
      if (connections_[c].from.node != id && connections_[c].to.node != id) continue;
      const GraphConnection removed = connections_.takeAt(c);
      wiresValid_ = false;
      emit connectionRemoved(removed);
    }
  }
  emit nodeRemoved(id);
  emit changed();
  return true;
}

bool GraphDocument::setPosition(const QString& id, QPointF pos) {
  const int i = indexOf(id);
  if (i < 0) return false;
  if (nodes_[i].position == pos) return true;
  nodes_[i].position = pos;
  emit nodeMoved(id);
  emit changed();
  return true;
}

bool GraphDocument::setParam(const QString& id, const QString& param, const QJsonValue& value) {
  const int i = indexOf(id);
  if (i < 0) return false;
  QJsonObject params = nodes_[i].params;
  if (value.isUndefined())
    params.remove(param);
  else
    params.insert(param, value);
  return setParams(id, params);
}

bool GraphDocument::setParams(const QString& id, const QJsonObject& params) {
  const int i = indexOf(id);
  if (i < 0) return false;
  if (nodes_[i].params == params) return true;
  nodes_[i].params = params;
  emit paramsChanged(id);
  emit changed();
  return true;
}

bool GraphDocument::setBypassed(const QString& id, bool on) {
  const int i = indexOf(id);
  if (i < 0) return false;
  if (nodes_[i].bypassed == on) return true;
  nodes_[i].bypassed = on;
  emit runModeChanged(id);
  emit changed();
  return true;
}

bool GraphDocument::setMuted(const QString& id, bool on) {
  const int i = indexOf(id);
  if (i < 0) return false;
  if (nodes_[i].muted == on) return true;
  nodes_[i].muted = on;
  emit runModeChanged(id);
  emit changed();
  return true;
}

bool GraphDocument::setSubgraph(const QString& id, std::shared_ptr<const Subgraph> subgraph) {
  const int i = indexOf(id);
  if (i < 0) return false;
  if (nodes_[i].subgraph == subgraph) return true;
  nodes_[i].subgraph = std::move(subgraph);
  emit subgraphChanged(id);
  emit changed();
  return true;
}

bool GraphDocument::addConnection(const GraphConnection& c) {
  // The same cache idea as indexOf: a scan per added wire made pasting or building 100,000 wires quadratic.
  if (!wiresValid_) {
    wires_.clear();
    wires_.reserve(connections_.size());
    for (const GraphConnection& w : connections_) wires_.insert(wireKey(w));
    wiresValid_ = true;
  }
  const QString key = wireKey(c);
  if (wires_.contains(key)) return false;
  wires_.insert(key);
  connections_.append(c);
  emit connectionAdded(c);
  emit changed();
  return true;
}

bool GraphDocument::removeConnection(const GraphConnection& c) {
  const qsizetype i = connections_.indexOf(c);
  if (i < 0) return false;
  const GraphConnection removed = connections_.takeAt(i);
  wiresValid_ = false;
  emit connectionRemoved(removed);
  emit changed();
  return true;
}

bool GraphDocument::setConnectionExtra(const GraphConnection& c, const QJsonObject& extra) {
  const qsizetype i = connections_.indexOf(c);
  if (i < 0) return false;
  if (connections_[i].extra == extra) return true;
  connections_[i].extra = extra;
  const GraphConnection updated = connections_[i];  // a slot may edit the list
  emit connectionChanged(updated);
  emit changed();
  return true;
}

QList<GraphConnection> GraphDocument::connectionsTo(const QString& nodeId) const {
  QList<GraphConnection> out;
  for (const GraphConnection& c : connections_)
    if (c.to.node == nodeId) out.append(c);
  return out;
}

QList<GraphConnection> GraphDocument::connectionsFrom(const QString& nodeId) const {
  QList<GraphConnection> out;
  for (const GraphConnection& c : connections_)
    if (c.from.node == nodeId) out.append(c);
  return out;
}

void GraphDocument::replaceAll(const GraphDocument& other) {
  if (&other == this) return;
  name_ = other.name_;
  description_ = other.description_;
  settings_ = other.settings_;
  view_ = other.view_;
  extra_ = other.extra_;
  nodes_ = other.nodes_;
  connections_ = other.connections_;
  indexValid_ = wiresValid_ = false;
  emit reset();
  emit changed();
}

void GraphDocument::clear() {
  name_.clear();
  description_.clear();
  settings_ = {};
  view_ = {};
  extra_ = {};
  nodes_.clear();
  connections_.clear();
  indexValid_ = wiresValid_ = false;
  emit reset();
  emit changed();
}

void GraphDocument::setContents(QList<GraphNode> nodes, QList<GraphConnection> connections) {
  nodes_ = std::move(nodes);
  connections_ = std::move(connections);
  indexValid_ = wiresValid_ = false;
}

}  // namespace gn::core
