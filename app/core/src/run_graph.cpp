#include "gpunodes/core/run_graph.h"

#include <QHash>
#include <QSet>
#include <optional>

#include "gpunodes/core/file_access.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/subgraph.h"

namespace gn::core {

namespace {

// Where a bypassed node's output gets its value: the endpoint wired into its first input of the output's
// type, followed through bypassed nodes. nullopt, with *why, when there is none.
class PassThrough {
 public:
  PassThrough(const GraphDocument& doc, const QHash<QString, int>& index, const QList<NodeTypePtr>& types)
      : doc_(doc), index_(index), types_(types) {
    for (const GraphConnection& c : doc.connections()) {
      const auto key = qMakePair(c.to.node, c.to.port);
      if (!into_.contains(key)) into_.insert(key, c.from);
    }
  }

  std::optional<Endpoint> resolve(const Endpoint& out, QString* why) {
    QSet<QString> seen;
    Endpoint at = out;
    while (true) {
      const int i = index_.value(at.node, -1);
      if (i < 0 || !doc_.nodes()[i].bypassed || !types_[i]) return at;
      // A cycle through bypassed nodes (an invalid graph, which validation reports) has no source.
      if (seen.contains(at.str())) {
        *why = QStringLiteral("the bypass passes around a cycle");
        return std::nullopt;
      }
      seen.insert(at.str());
      const NodeTypeSpec& spec = types_[i]->spec();
      const PortSpec* o = spec.output(at.port);
      if (!o) return at;  // an unknown port: validation names it
      const PortSpec* in = nullptr;
      for (const PortSpec& p : spec.inputs)
        if (p.type == o->type) {
          in = &p;
          break;
        }
      const QString node = doc_.nodes()[i].id;
      if (!in) {
        *why = QStringLiteral("cannot be bypassed: output %1 (%2) has no input of that type to pass on")
                   .arg(o->name, portTypeName(o->type));
        failedNode_ = node, failedPort_ = o->name;
        return std::nullopt;
      }
      const auto source = into_.constFind(qMakePair(node, in->name));
      if (source == into_.constEnd()) {
        *why = QStringLiteral("cannot be bypassed: output %1 passes on input %2, which is not connected")
                   .arg(o->name, in->name);
        failedNode_ = node, failedPort_ = o->name;
        return std::nullopt;
      }
      at = *source;
    }
  }
  // The bypassed node and output the last failed resolve stopped at (an upstream one in a chain).
  QString failedNode_, failedPort_;

 private:
  const GraphDocument& doc_;
  const QHash<QString, int>& index_;
  const QList<NodeTypePtr>& types_;
  QHash<QPair<QString, QString>, Endpoint> into_;
};

}  // namespace

RunGraph runGraph(const GraphDocument& doc, const NodeTypeRegistry& registry, const QStringList& targets,
                  const QString& fileFolder) {
  // Subgraphs first: what runs is the flattened graph, whose inner nodes bypass and mute apply to as to any.
  if (subgraph::hasSubgraphs(doc)) {
    auto flat = std::make_shared<GraphDocument>();
    ValidationReport problems;
    subgraph::flatten(doc, *flat, &problems, &registry);
    // A subgraph node as a target ("run to here" on block1) stands for every node inside it.
    QStringList flatTargets;
    for (const QString& t : targets) {
      if (flat->hasNode(t)) {
        flatTargets.append(t);
        continue;
      }
      const QString inside = t + subgraph::kPathSeparator;
      for (const GraphNode& n : flat->nodes())
        if (n.id.startsWith(inside)) flatTargets.append(n.id);
    }
    if (flatTargets.isEmpty()) flatTargets = targets;  // none found: still targets, so nothing runs
    RunGraph g = runGraph(*flat, registry, flatTargets, fileFolder);
    g.issues = problems.issues() + g.issues;
    g.flattened = true;
    if (!g.owned_) g.owned_ = std::move(flat);  // graph() is the flat document itself
    return g;
  }
  RunGraph g;
  g.source_ = &doc;
  bool flagged = false;
  for (const GraphNode& n : doc.nodes()) flagged = flagged || n.bypassed || n.muted;
  if (!flagged && targets.isEmpty() && fileFolder.isEmpty()) return g;

  const QList<GraphNode>& nodes = doc.nodes();
  QHash<QString, int> index;  // first node of each id; duplicates are validation's to report
  QList<NodeTypePtr> types;
  types.reserve(nodes.size());
  for (int i = 0; i < nodes.size(); ++i) {
    if (!index.contains(nodes[i].id)) index.insert(nodes[i].id, i);
    types.append(registry.find(nodes[i].type));
  }
  // A node of an unknown type cannot say what passes through it: it stays in the graph, for validation to
  // report as missing. Muted wins over bypassed.
  auto bypassed = [&](int i) { return nodes[i].bypassed && !nodes[i].muted && types[i]; };

  // The wires as they run: out of a bypassed node, from its pass-through source instead.
  PassThrough pass(doc, index, types);
  QList<GraphConnection> wires;
  QSet<QString> reported;  // "node.port" of each bypass error, once
  for (const GraphConnection& c : doc.connections()) {
    const int to = index.value(c.to.node, -1);
    if (to >= 0 && bypassed(to)) continue;
    const int from = index.value(c.from.node, -1);
    if (from < 0 || !bypassed(from)) {
      wires.append(c);
      continue;
    }
    QString why;
    const std::optional<Endpoint> source = pass.resolve(c.from, &why);
    if (!source) {
      const QString at = pass.failedNode_ + QLatin1Char('.') + pass.failedPort_;
      if (!reported.contains(at)) {
        reported.insert(at);
        g.issues.append({Issue::Severity::Error, pass.failedNode_,
                         QStringLiteral("outputs.%1").arg(pass.failedPort_), why});
      }
      continue;
    }
    GraphConnection rewired = c;
    rewired.from = *source;
    wires.append(rewired);
  }

  // What needs what, on the rewired wires.
  QList<QList<int>> wiresFrom(nodes.size()), wiresInto(nodes.size());
  for (int w = 0; w < wires.size(); ++w) {
    const int from = index.value(wires[w].from.node, -1), to = index.value(wires[w].to.node, -1);
    if (from < 0 || to < 0) continue;
    wiresFrom[from].append(w);
    wiresInto[to].append(w);
  }

  // Run to here: the targets and everything upstream of them.
  QList<bool> needed(nodes.size(), targets.isEmpty());
  QList<int> stack;
  for (const QString& t : targets)
    if (const int i = index.value(t, -1); i >= 0 && !needed[i]) needed[i] = true, stack.append(i);
  while (!stack.isEmpty()) {
    const int i = stack.takeLast();
    for (int w : wiresInto[i])
      if (const int from = index.value(wires[w].from.node); !needed[from])
        needed[from] = true, stack.append(from);
  }

  // Mute: breadth first from the muted nodes, so each dependent names the nearest cause.
  QHash<int, QString> skipped;  // node -> message
  QList<int> queue;
  QHash<int, QString> rootOf;  // skipped node -> the muted node behind it
  for (int i = 0; i < nodes.size(); ++i)
    if (nodes[i].muted && index.value(nodes[i].id) == i) queue.append(i), rootOf.insert(i, nodes[i].id);
  for (int q = 0; q < queue.size(); ++q) {
    const int i = queue[q];
    for (int w : wiresFrom[i]) {
      const GraphConnection& c = wires[w];
      const int to = index.value(c.to.node);
      if (nodes[to].muted || skipped.contains(to)) continue;
      const QString input = QStringLiteral("input %1 (%2)").arg(c.to.port, c.from.str());
      skipped.insert(
          to, nodes[i].muted
                  ? QStringLiteral("skipped: %1 is muted").arg(input)
                  : QStringLiteral("skipped: %1 is skipped (%2 is muted)").arg(input, rootOf.value(i)));
      rootOf.insert(to, rootOf.value(i));
      queue.append(to);
    }
  }

  QList<GraphNode> kept;
  QSet<QString> removed;
  for (int i = 0; i < nodes.size(); ++i) {
    const GraphNode& n = nodes[i];
    const bool first = index.value(n.id) == i;
    std::optional<NodeStatus> status;
    QString message;
    if (first && n.muted)
      status = NodeStatus::Muted;
    else if (first && bypassed(i))
      status = NodeStatus::Bypassed;
    else if (first && skipped.contains(i))
      status = NodeStatus::Skipped, message = skipped.value(i);
    if (!needed[i]) {
      if (first) removed.insert(n.id);
      continue;
    }
    if (!status) {
      kept.append(n);
      continue;
    }
    removed.insert(n.id);
    g.notRun.append({n.id, n.type, *status, message});
  }
  QList<GraphConnection> keptWires;
  for (const GraphConnection& c : wires)
    if (!removed.contains(c.from.node) && !removed.contains(c.to.node)) keptWires.append(c);

  g.owned_ = std::make_shared<GraphDocument>();
  g.owned_->setName(doc.name());
  g.owned_->setDescription(doc.description());
  g.owned_->setSettings(doc.settings());
  g.owned_->setExtra(doc.extra());
  g.owned_->setContents(std::move(kept), std::move(keptWires));
  resolveFileParams(*g.owned_, registry, fileFolder);
  return g;
}

}  // namespace gn::core
