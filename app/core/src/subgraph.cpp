#include "gpunodes/core/subgraph.h"

#include <algorithm>

#include <QCryptographicHash>
#include <QDir>
#include <QFileInfo>
#include <QHash>
#include <QSet>
#include <QStandardPaths>
#include <map>

#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/validation.h"

namespace gn::core {

const GraphNode* Subgraph::node(const QString& id) const {
  for (const GraphNode& n : nodes)
    if (n.id == id) return &n;
  return nullptr;
}

const SubgraphInput* Subgraph::input(const QString& name) const {
  for (const SubgraphInput& p : inputs)
    if (p.name == name) return &p;
  return nullptr;
}

const SubgraphOutput* Subgraph::output(const QString& name) const {
  for (const SubgraphOutput& p : outputs)
    if (p.name == name) return &p;
  return nullptr;
}

const PromotedParam* Subgraph::promotedParam(const QString& name) const {
  for (const PromotedParam& p : promoted)
    if (p.name == name) return &p;
  return nullptr;
}

namespace subgraph {

namespace {

// Names from a file go into messages cut short, as validation does.
QString clip(const QString& s) {
  return s.size() > 64 ? s.left(64) + QStringLiteral("...") : s;
}

QString join(const QString& prefix, const QString& id) {
  return prefix.isEmpty() ? id : prefix + kPathSeparator + id;
}

QString names(const QStringList& list) {
  return list.isEmpty() ? QStringLiteral("none") : list.join(QStringLiteral(", "));
}

template <typename Port>
QStringList portNames(const QList<Port>& ports) {
  QStringList out;
  for (const Port& p : ports) out.append(p.name);
  return out;
}

std::optional<NodeTypeSpec> specAt(const GraphNode& node, const NodeTypeRegistry& registry, int depth);

NodeTypeSpec subgraphSpec(const GraphNode& node, const NodeTypeRegistry& registry, int depth) {
  const Subgraph& sub = of(node);
  NodeTypeSpec spec;
  spec.name = kType;
  spec.category = kType;
  spec.description = sub.block.name.isEmpty()
                         ? QStringLiteral("A group of nodes; double-click to edit it")
                         : QStringLiteral("An instance of the library block %1").arg(sub.block.name);
  std::map<QString, std::optional<NodeTypeSpec>> inner;  // node id -> its spec, looked up once
  auto innerSpec = [&](const QString& id) -> const std::optional<NodeTypeSpec>& {
    auto it = inner.find(id);
    if (it != inner.end()) return it->second;
    const GraphNode* n = sub.node(id);
    std::optional<NodeTypeSpec> s =
        n && depth < kMaxDepth ? specAt(*n, registry, depth + 1) : std::optional<NodeTypeSpec>();
    return inner.emplace(id, std::move(s)).first->second;
  };
  for (const SubgraphInput& in : sub.inputs) {
    PortSpec p{.name = in.name};
    QStringList targets;
    for (const Endpoint& t : in.targets) targets.append(t.str());
    p.doc = QStringLiteral("feeds %1").arg(names(targets));
    if (!in.targets.isEmpty()) {
      const std::optional<NodeTypeSpec>& s = innerSpec(in.targets.first().node);
      if (const PortSpec* port = s ? s->input(in.targets.first().port) : nullptr) {
        p.type = port->type;
        p.required = port->required;
      }
    }
    spec.inputs.append(p);
  }
  for (const SubgraphOutput& out : sub.outputs) {
    PortSpec p{.name = out.name};
    p.doc = QStringLiteral("from %1").arg(out.source.str());
    const std::optional<NodeTypeSpec>& s = innerSpec(out.source.node);
    if (const PortSpec* port = s ? s->output(out.source.port) : nullptr) p.type = port->type;
    spec.outputs.append(p);
  }
  for (const PromotedParam& pp : sub.promoted) {
    const std::optional<NodeTypeSpec>& s = innerSpec(pp.node);
    const ParamSpec* param = s ? s->param(pp.param) : nullptr;
    if (!param) continue;  // validation reports it
    ParamSpec p = *param;
    p.name = pp.name;
    if (const GraphNode* n = sub.node(pp.node); n && n->params.contains(pp.param))
      p.defaultValue = n->params.value(pp.param);
    p.doc = QStringLiteral("%1.%2 (promoted)%3")
                .arg(pp.node, pp.param, param->doc.isEmpty() ? QString() : QStringLiteral(": ") + param->doc);
    spec.params.append(p);
  }
  return spec;
}

std::optional<NodeTypeSpec> specAt(const GraphNode& node, const NodeTypeRegistry& registry, int depth) {
  if (isSubgraph(node)) return subgraphSpec(node, registry, depth);
  const NodeTypePtr type = registry.find(node.type);
  if (!type) return std::nullopt;
  return type->spec();
}

QString uniqueName(const QString& base, QSet<QString>& taken) {
  QString name = base;
  for (int k = 2; taken.contains(name); ++k) name = base + QString::number(k);
  taken.insert(name);
  return name;
}

// The node's params with the subgraph's promoted values written in: what the inner node runs with.
QList<GraphNode> withPromotedValues(const GraphNode& subgraphNode) {
  const Subgraph& sub = of(subgraphNode);
  QList<GraphNode> nodes = sub.nodes;
  for (const PromotedParam& pp : sub.promoted) {
    if (!subgraphNode.params.contains(pp.name)) continue;
    for (GraphNode& n : nodes)
      if (n.id == pp.node) n.params.insert(pp.param, subgraphNode.params.value(pp.name));
  }
  return nodes;
}

class Flattener {
 public:
  Flattener(ValidationReport* problems, const NodeTypeRegistry* registry)
      : problems_(problems), registry_(registry) {}

  // One graph level: `owner` is the path of the subgraph node it belongs to (empty at the top), wires that
  // cannot be joined are reported on `owner` or on the node that lacks the port.
  void level(const QList<GraphNode>& nodes, const QList<GraphConnection>& wires, const QString& owner,
             const QString& wireField, int depth, const QStringList& blocks) {
    QHash<QString, const GraphNode*> byId;
    for (const GraphNode& n : nodes)
      if (!byId.contains(n.id)) byId.insert(n.id, &n);
    for (const GraphNode& n : nodes) {
      const QString path = join(owner, n.id);
      if (n.id.contains(kPathSeparator))
        error(owner.isEmpty() ? n.id : owner, QStringLiteral("id"),
              QStringLiteral("id \"%1\" holds '/', which joins the ids of a path (block1/conv2)")
                  .arg(clip(n.id)));
      if (!isSubgraph(n)) {
        GraphNode flat = n;
        flat.id = path;
        nodes_.append(std::move(flat));
        continue;
      }
      const Subgraph& sub = of(n);
      if (depth + 1 > kMaxDepth) {
        error(path, QStringLiteral("subgraph"),
              QStringLiteral("subgraphs nested more than %1 deep").arg(kMaxDepth));
        continue;
      }
      if (!sub.block.name.isEmpty() && blocks.contains(sub.block.name)) {
        error(
            path, QStringLiteral("subgraph.block"),
            QStringLiteral("block \"%1\" contains an instance of itself; a block cannot be defined by itself")
                .arg(clip(sub.block.name)));
        continue;
      }
      checkBoundary(n, path);
      QStringList inner = blocks;
      if (!sub.block.name.isEmpty()) inner.append(sub.block.name);
      QList<GraphNode> innerNodes = withPromotedValues(n);
      for (GraphNode& m : innerNodes) {  // bypassing or muting a subgraph does so to each node inside
        m.bypassed = m.bypassed || n.bypassed;
        m.muted = m.muted || n.muted;
      }
      level(innerNodes, sub.connections, path, QStringLiteral("subgraph.connections"), depth + 1, inner);
    }
    for (int i = 0; i < wires.size(); ++i) {
      const GraphConnection& c = wires[i];
      const QString field = QStringLiteral("%1[%2]").arg(wireField).arg(i);
      const GraphNode* from = byId.value(c.from.node);
      const GraphNode* to = byId.value(c.to.node);
      // A wire to a node that does not exist stays, under its path, for validation to report as dangling.
      QList<Endpoint> sources{{join(owner, c.from.node), c.from.port}};
      QList<Endpoint> targets{{join(owner, c.to.node), c.to.port}};
      if (from && isSubgraph(*from)) {
        const std::optional<Endpoint> e = outputEnd(*from, c.from.port, join(owner, from->id), depth);
        if (!e) {
          if (!of(*from).output(c.from.port))
            error(join(owner, from->id), field,
                  QStringLiteral("%1 -> %2: %3 (Subgraph) has no output \"%4\" (outputs: %5)")
                      .arg(clip(c.from.str()), clip(c.to.str()), clip(from->id), clip(c.from.port),
                           names(portNames(of(*from).outputs))));
          continue;
        }
        sources = {*e};
      }
      if (to && isSubgraph(*to)) {
        targets = inputEnds(*to, c.to.port, join(owner, to->id), depth);
        if (!of(*to).input(c.to.port))
          error(join(owner, to->id), field,
                QStringLiteral("%1 -> %2: %3 (Subgraph) has no input \"%4\" (inputs: %5)")
                    .arg(clip(c.from.str()), clip(c.to.str()), clip(to->id), clip(c.to.port),
                         names(portNames(of(*to).inputs))));
      }
      for (const Endpoint& s : sources)
        for (const Endpoint& t : targets) connections_.append({s, t, c.extra});
    }
  }

  QList<GraphNode> nodes_;
  QList<GraphConnection> connections_;

 private:
  void error(const QString& node, const QString& field, const QString& message) {
    if (problems_) problems_->error(node, field, message);
  }

  // The flat inner inputs a subgraph's input port feeds, following nested subgraphs.
  QList<Endpoint> inputEnds(const GraphNode& node, const QString& port, const QString& path, int depth) {
    if (!isSubgraph(node)) return {{path, port}};
    const SubgraphInput* in = of(node).input(port);
    if (!in || depth + 1 > kMaxDepth) return {};
    QList<Endpoint> out;
    for (const Endpoint& t : in->targets)
      if (const GraphNode* inner = of(node).node(t.node))
        out += inputEnds(*inner, t.port, join(path, t.node), depth + 1);
    return out;
  }

  std::optional<Endpoint> outputEnd(const GraphNode& node, const QString& port, const QString& path,
                                    int depth) {
    if (!isSubgraph(node)) return Endpoint{path, port};
    const SubgraphOutput* out = of(node).output(port);
    if (!out || depth + 1 > kMaxDepth) return std::nullopt;
    const GraphNode* inner = of(node).node(out->source.node);
    if (!inner) return std::nullopt;
    return outputEnd(*inner, out->source.port, join(path, out->source.node), depth + 1);
  }

  // Ports and promoted params that name what is not there; reported on the subgraph node's path.
  void checkBoundary(const GraphNode& node, const QString& path) {
    const Subgraph& sub = of(node);
    QSet<QString> seen;
    for (int i = 0; i < sub.inputs.size(); ++i) {
      const SubgraphInput& in = sub.inputs[i];
      const QString field = QStringLiteral("subgraph.inputs[%1]").arg(i);
      checkName(path, field, QStringLiteral("input"), in.name, seen);
      if (in.targets.isEmpty())
        error(path, field, QStringLiteral("input \"%1\" feeds no inner node").arg(clip(in.name)));
      for (const Endpoint& t : in.targets)
        if (!sub.node(t.node))
          error(path, field,
                QStringLiteral("input \"%1\" feeds %2: no inner node \"%3\"")
                    .arg(clip(in.name), clip(t.str()), clip(t.node)));
    }
    seen.clear();
    for (int i = 0; i < sub.outputs.size(); ++i) {
      const SubgraphOutput& out = sub.outputs[i];
      const QString field = QStringLiteral("subgraph.outputs[%1]").arg(i);
      checkName(path, field, QStringLiteral("output"), out.name, seen);
      if (!sub.node(out.source.node))
        error(path, field,
              QStringLiteral("output \"%1\" comes from %2: no inner node \"%3\"")
                  .arg(clip(out.name), clip(out.source.str()), clip(out.source.node)));
    }
    seen.clear();
    std::optional<NodeTypeSpec> spec;
    if (registry_) spec = subgraphSpec(node, *registry_, 0);
    for (int i = 0; i < sub.promoted.size(); ++i) {
      const PromotedParam& pp = sub.promoted[i];
      const QString field = QStringLiteral("subgraph.promoted[%1]").arg(i);
      checkName(path, field, QStringLiteral("promoted param"), pp.name, seen);
      const GraphNode* inner = sub.node(pp.node);
      if (!inner)
        error(path, field,
              QStringLiteral("promoted param \"%1\" sets %2.%3: no inner node \"%2\"")
                  .arg(clip(pp.name), clip(pp.node), clip(pp.param)));
      else if (spec && !spec->param(pp.name) && registry_->find(inner->type))
        error(path, field,
              QStringLiteral("promoted param \"%1\" sets %2.%3: %2 (%4) has no param \"%3\"")
                  .arg(clip(pp.name), clip(pp.node), clip(pp.param), clip(inner->type)));
    }
    for (auto it = node.params.begin(); it != node.params.end(); ++it)
      if (!sub.promotedParam(it.key()) && problems_)
        problems_->warning(
            path, QStringLiteral("params.%1").arg(clip(it.key())),
            QStringLiteral("unknown param, ignored (promoted: %1)").arg(names(portNames(sub.promoted))));
  }

  void checkName(const QString& path, const QString& field, const QString& what, const QString& name,
                 QSet<QString>& seen) {
    if (!GraphDocument::isValidId(name))
      error(path, field,
            QStringLiteral("%1 name \"%2\" is not valid: use 1-64 letters, digits, '_' or '-'")
                .arg(what, clip(name)));
    else if (seen.contains(name))
      error(path, field, QStringLiteral("two of its %1s are named \"%2\"").arg(what, clip(name)));
    seen.insert(name);
  }

  ValidationReport* problems_;
  const NodeTypeRegistry* registry_;
};

// The path of a nested instance of block `name` inside `sub`, or empty.
QString selfInstance(const Subgraph& sub, const QString& name, const QString& prefix, int depth) {
  if (depth > kMaxDepth) return {};
  for (const GraphNode& n : sub.nodes) {
    if (!isSubgraph(n)) continue;
    const QString path = join(prefix, n.id);
    if (of(n).block.name == name) return path;
    const QString deeper = selfInstance(of(n), name, path, depth + 1);
    if (!deeper.isEmpty()) return deeper;
  }
  return {};
}

SubgraphPtr withParamAt(const Subgraph& sub, const QStringList& path, const QString& param,
                        const QJsonValue& value) {
  auto copy = std::make_shared<Subgraph>(sub);
  for (GraphNode& n : copy->nodes) {
    if (n.id != path.first()) continue;
    if (path.size() == 1) {
      if (value.isUndefined())
        n.params.remove(param);
      else
        n.params.insert(param, value);
      return copy;
    }
    if (!isSubgraph(n)) return nullptr;
    SubgraphPtr inner = withParamAt(of(n), path.mid(1), param, value);
    if (!inner) return nullptr;
    n.subgraph = std::move(inner);
    return copy;
  }
  return nullptr;
}

bool setError(QString* error, const QString& message) {
  if (error) *error = message;
  return false;
}

}  // namespace

bool isSubgraph(const GraphNode& node) {
  return node.type == kType;
}

const Subgraph& of(const GraphNode& node) {
  static const Subgraph empty;
  return node.subgraph ? *node.subgraph : empty;
}

bool hasSubgraphs(const GraphDocument& doc) {
  for (const GraphNode& n : doc.nodes())
    if (isSubgraph(n)) return true;
  return false;
}

NodeTypeSpec spec(const GraphNode& node, const NodeTypeRegistry& registry) {
  return subgraphSpec(node, registry, 0);
}

std::optional<NodeTypeSpec> specOf(const GraphNode& node, const NodeTypeRegistry& registry) {
  return specAt(node, registry, 0);
}

QString freeBlockId(const GraphDocument& doc) {
  for (int k = 1;; ++k) {
    const QString id = QStringLiteral("block%1").arg(k);
    if (!doc.hasNode(id)) return id;
  }
}

Change group(const GraphDocument& doc, const QStringList& ids, const QString& newId) {
  Change change;
  const QSet<QString> selected(ids.begin(), ids.end());
  if (selected.isEmpty()) {
    change.error = QStringLiteral("select the nodes to group first");
    return change;
  }
  for (const QString& id : selected)
    if (!doc.hasNode(id)) {
      change.error = QStringLiteral("no node \"%1\" to group").arg(clip(id));
      return change;
    }
  if (!GraphDocument::isValidId(newId) || (doc.hasNode(newId) && !selected.contains(newId))) {
    change.error =
        QStringLiteral("\"%1\" cannot be the subgraph's id: it is taken or not valid").arg(clip(newId));
    return change;
  }
  auto sub = std::make_shared<Subgraph>();
  std::optional<QPointF> topLeft;
  for (const GraphNode& n : doc.nodes()) {
    if (!selected.contains(n.id)) continue;
    topLeft = topLeft
                  ? QPointF(std::min(topLeft->x(), n.position.x()), std::min(topLeft->y(), n.position.y()))
                  : n.position;
    change.removeNodes.append(n);
  }
  for (GraphNode n : change.removeNodes) {
    n.position -= *topLeft;  // the inner graph starts at the origin
    sub->nodes.append(std::move(n));
  }
  QSet<QString> inputNames, outputNames;
  QHash<QString, int> inputOf, outputOf;  // the port made for an outside source / an inner source
  for (const GraphConnection& c : doc.connections()) {
    const bool fromInside = selected.contains(c.from.node), toInside = selected.contains(c.to.node);
    if (!fromInside && !toInside) continue;
    change.removeConnections.append(c);
    if (fromInside && toInside) {
      sub->connections.append(c);
      continue;
    }
    const QString key = c.from.str();
    // Wires that cross the border lose their reroute points and other view fields: their route changes.
    if (toInside) {
      int k = inputOf.value(key, -1);
      if (k < 0) {
        k = int(sub->inputs.size());
        inputOf.insert(key, k);
        sub->inputs.append({uniqueName(c.to.port, inputNames), {}, {}});
        change.addConnections.append({c.from, {newId, sub->inputs[k].name}, {}});
      }
      sub->inputs[k].targets.append(c.to);
    } else {
      int k = outputOf.value(key, -1);
      if (k < 0) {
        k = int(sub->outputs.size());
        outputOf.insert(key, k);
        sub->outputs.append({uniqueName(c.from.port, outputNames), c.from, {}});
      }
      change.addConnections.append({{newId, sub->outputs[k].name}, c.to, {}});
    }
  }
  GraphNode node;
  node.id = newId;
  node.type = kType;
  node.position = *topLeft;
  node.subgraph = std::move(sub);
  change.addNodes.append(std::move(node));
  return change;
}

Change ungroup(const GraphDocument& doc, const QString& id) {
  Change change;
  const GraphNode* node = doc.node(id);
  if (!node || !isSubgraph(*node)) {
    change.error = QStringLiteral("\"%1\" is not a subgraph").arg(clip(id));
    return change;
  }
  const Subgraph& sub = of(*node);
  QSet<QString> outside, taken;
  for (const GraphNode& n : doc.nodes())
    if (n.id != id) outside.insert(n.id);
  taken = outside;
  // Inner ids free outside keep their names; only the others are renamed, around all of them.
  for (const GraphNode& n : sub.nodes)
    if (!outside.contains(n.id) && GraphDocument::isValidId(n.id)) taken.insert(n.id);
  QHash<QString, QString> renamed;
  QSet<QString> used;  // ids given so far: a duplicate inner id (an invalid subgraph) gets a fresh one
  for (GraphNode n : withPromotedValues(*node)) {
    QString newId = n.id;
    if (outside.contains(newId) || !GraphDocument::isValidId(newId) || used.contains(newId)) {
      // The id's letters and the smallest free number, as new nodes get: "conv2" taken gives "conv3".
      QString base = n.id;
      while (!base.isEmpty() && base.back().isDigit()) base.chop(1);
      if (base.isEmpty() || !GraphDocument::isValidId(base)) base = QStringLiteral("n");
      for (int k = 1; taken.contains(newId = base + QString::number(k)); ++k) {
      }
    }
    taken.insert(newId);
    used.insert(newId);
    if (!renamed.contains(n.id)) renamed.insert(n.id, newId);
    n.id = newId;
    n.position += node->position;
    change.addNodes.append(std::move(n));
  }
  auto inner = [&](const Endpoint& e) { return Endpoint{renamed.value(e.node, e.node), e.port}; };
  for (const GraphConnection& c : sub.connections)
    change.addConnections.append({inner(c.from), inner(c.to), c.extra});
  for (const GraphConnection& c : doc.connections()) {
    if (c.from.node != id && c.to.node != id) continue;
    change.removeConnections.append(c);
    QList<Endpoint> sources{c.from}, targets{c.to};
    if (c.from.node == id) {
      const SubgraphOutput* out = sub.output(c.from.port);
      sources =
          out && renamed.contains(out->source.node) ? QList<Endpoint>{inner(out->source)} : QList<Endpoint>{};
    }
    if (c.to.node == id) {
      targets.clear();
      if (const SubgraphInput* in = sub.input(c.to.port))
        for (const Endpoint& t : in->targets)
          if (renamed.contains(t.node)) targets.append(inner(t));
    }
    for (const Endpoint& s : sources)
      for (const Endpoint& t : targets) change.addConnections.append({s, t, {}});
  }
  change.removeNodes.append(*node);
  return change;
}

void flatten(const GraphDocument& doc, GraphDocument& into, ValidationReport* problems,
             const NodeTypeRegistry* registry) {
  Flattener f(problems, registry);
  f.level(doc.nodes(), doc.connections(), QString(), QStringLiteral("connections"), 0, {});
  into.setName(doc.name());
  into.setDescription(doc.description());
  into.setSettings(doc.settings());
  into.setView(doc.view());
  into.setExtra(doc.extra());
  into.setContents(std::move(f.nodes_), std::move(f.connections_));
}

const GraphNode* nodeAt(const GraphDocument& doc, const QString& path) {
  const QStringList parts = path.split(kPathSeparator);
  const GraphNode* n = doc.node(parts.first());
  for (qsizetype i = 1; n && i < parts.size(); ++i) n = isSubgraph(*n) ? of(*n).node(parts[i]) : nullptr;
  return n;
}

bool setParamAt(GraphDocument& doc, const QString& path, const QString& param, const QJsonValue& value) {
  const QStringList parts = path.split(kPathSeparator);
  if (parts.size() == 1) return doc.setParam(path, param, value);
  const GraphNode* top = doc.node(parts.first());
  if (!top || !isSubgraph(*top)) return false;
  SubgraphPtr sub = withParamAt(of(*top), parts.mid(1), param, value);
  if (!sub || !doc.setSubgraph(top->id, std::move(sub))) return false;
  // A subgraph on the way that promotes the param, and has a value set for it, would run the node with that
  // value instead: it gets the new one too, up through promotions of promoted params.
  QString name = param;
  for (qsizetype k = parts.size() - 2; k >= 0; --k) {
    const QStringList owner = parts.mid(0, k + 1);
    const GraphNode* n = nodeAt(doc, owner.join(kPathSeparator));
    const PromotedParam* promoted = nullptr;
    for (const PromotedParam& p : of(*n).promoted)
      if (p.node == parts[k + 1] && p.param == name) promoted = &p;
    if (!promoted) break;
    name = promoted->name;
    if (!n->params.contains(name)) continue;
    if (k == 0) {
      doc.setParam(owner.first(), name, value);
      continue;
    }
    const GraphNode* outer = doc.node(owner.first());
    doc.setSubgraph(outer->id, withParamAt(of(*outer), owner.mid(1), name, value));
  }
  return true;
}

SubgraphPtr withInner(const Subgraph& sub, const GraphDocument& inner) {
  auto copy = std::make_shared<Subgraph>(sub);
  copy->nodes = inner.nodes();
  copy->connections = inner.connections();
  copy->extra = inner.extra();
  return copy;
}

void innerDocument(const Subgraph& sub, GraphDocument& into) {
  into.setExtra(sub.extra);
  into.setContents(sub.nodes, sub.connections);
}

// ---- library -----------------------------------------------------------------------------------------

QString libraryDir() {
  const QString dir =
      QStandardPaths::writableLocation(QStandardPaths::AppDataLocation) + QStringLiteral("/blocks");
  QDir().mkpath(dir);
  return dir;
}

QString shippedLibraryDir() {
  return QStringLiteral(":/gpunodes/blocks");
}

QString contentHash(const Subgraph& sub) {
  auto content = std::make_shared<Subgraph>(sub);
  content->block = {};
  GraphNode n;
  n.id = QStringLiteral("block");
  n.type = kType;
  n.subgraph = std::move(content);
  GraphDocument doc;
  doc.setContents({n}, {});
  // The canonical bytes of the one serializer: the same content always gives the same hash.
  return QString::fromLatin1(
      QCryptographicHash::hash(serializer::save(doc), QCryptographicHash::Sha256).toHex().left(16));
}

bool readBlock(const QString& path, LibraryBlock& out, QString* error) {
  GraphDocument doc;
  QString e;
  if (!serializer::loadFile(path, doc, &e)) return setError(error, e);
  if (doc.nodes().size() != 1 || !isSubgraph(doc.nodes().first()))
    return setError(
        error, QStringLiteral("%1: a block file holds exactly one Subgraph node, this one has %2 "
                              "node(s)%3")
                   .arg(path)
                   .arg(doc.nodes().size())
                   .arg(doc.nodes().size() == 1 ? QStringLiteral(" of type ") + clip(doc.nodes().first().type)
                                                : QString()));
  const QString name = QFileInfo(path).completeBaseName();
  const GraphNode& node = doc.nodes().first();
  const QString self = selfInstance(of(node), name, node.id, 1);
  if (!self.isEmpty())
    return setError(error,
                    QStringLiteral("%1: block \"%2\" contains an instance of itself (%3); a block cannot "
                                   "be defined by itself")
                        .arg(path, clip(name), clip(self)));
  out.name = name;
  out.path = path;
  out.hash = contentHash(of(node));
  out.node = node;
  return true;
}

QList<LibraryBlock> listLibrary(QStringList* errors) {
  QList<LibraryBlock> blocks;
  auto readDir = [&](const QString& path, bool shipped) {
    const QDir dir(path);
    for (const QString& file : dir.entryList({QStringLiteral("*.json")}, QDir::Files, QDir::Name)) {
      LibraryBlock block;
      QString error;
      if (!readBlock(dir.filePath(file), block, &error)) {
        if (errors) errors->append(error);
        continue;
      }
      block.shipped = shipped;
      // A user's block replaces the shipped one of its name, where it was listed.
      auto same = std::find_if(blocks.begin(), blocks.end(), [&](const LibraryBlock& b) { return b.name == block.name; });
      if (same != blocks.end())
        *same = std::move(block);
      else
        blocks.append(std::move(block));
    }
  };
  readDir(shippedLibraryDir(), true);
  readDir(libraryDir(), false);
  return blocks;
}

bool saveBlock(const GraphNode& node, const QString& name, LibraryBlock* saved, QString* error) {
  if (!isSubgraph(node)) return setError(error, QStringLiteral("%1 is not a subgraph").arg(clip(node.id)));
  if (!GraphDocument::isValidId(name))
    return setError(error,
                    QStringLiteral("block name \"%1\" is not valid: use 1-64 letters, digits, '_' or '-'")
                        .arg(clip(name)));
  const QString self = selfInstance(of(node), name, node.id, 1);
  if (!self.isEmpty())
    return setError(error,
                    QStringLiteral("block \"%1\" would contain an instance of itself (%2); a block cannot "
                                   "be defined by itself")
                        .arg(name, self));
  auto sub = std::make_shared<Subgraph>(of(node));
  sub->block = {name, {}};
  GraphNode block = node;
  block.id = name;
  block.position = {};
  block.subgraph = sub;
  GraphDocument doc;
  doc.setName(name);
  doc.setContents({block}, {});
  const QString path = QDir(libraryDir()).filePath(name + QStringLiteral(".json"));
  if (!serializer::saveFile(path, doc, error)) return false;
  if (saved) *saved = {name, path, contentHash(*sub), block};
  return true;
}

GraphNode instantiate(const LibraryBlock& block, const QString& id, QPointF pos) {
  GraphNode n = block.node;
  n.id = id;
  n.position = pos;
  auto sub = std::make_shared<Subgraph>(of(block.node));
  sub->block = {block.name, block.hash};
  n.subgraph = std::move(sub);
  return n;
}

bool outOfDate(const GraphNode& node, const QList<LibraryBlock>& library) {
  if (!isSubgraph(node) || of(node).block.name.isEmpty()) return false;
  for (const LibraryBlock& b : library)
    if (b.name == of(node).block.name) return b.hash != of(node).block.hash;
  return false;  // a block no longer in the library has nothing to update from
}

GraphNode updated(const GraphNode& instance, const LibraryBlock& block) {
  GraphNode n = instantiate(block, instance.id, instance.position);
  for (auto it = instance.params.begin(); it != instance.params.end(); ++it)
    if (of(n).promotedParam(it.key())) n.params.insert(it.key(), it.value());
  n.bypassed = instance.bypassed;
  n.muted = instance.muted;
  n.extra = instance.extra;
  return n;
}

}  // namespace subgraph
}  // namespace gn::core
