#include "gpunodes/core/validation.h"

#include <QHash>
#include <QJsonArray>
#include <QSet>
#include <algorithm>
#include <cmath>
#include <exception>
#include <limits>

#include "gpunodes/core/file_access.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/run_graph.h"
#include "gpunodes/core/subgraph.h"

namespace gn::core {

namespace {
// Names from a file go into messages cut short: a hostile 10 MB id must not become a 10 MB message.
QString clip(const QString& s, int max = 64) {
  return s.size() > max ? s.left(max) + QStringLiteral("...") : s;
}
}  // namespace

QString Issue::text() const {
  QString out;
  if (!node.isEmpty()) out += clip(node) + QStringLiteral(": ");
  if (!field.isEmpty()) out += field + QStringLiteral(": ");
  return out + message;
}

void ValidationReport::error(const QString& node, const QString& field, const QString& message) {
  issues_.append(Issue{Issue::Severity::Error, node, field, message});
}

void ValidationReport::error(const QString& node, const QString& field, const QString& message,
                             IssueFix fix) {
  issues_.append(Issue{Issue::Severity::Error, node, field, message, std::move(fix)});
}

void ValidationReport::warning(const QString& node, const QString& field, const QString& message) {
  issues_.append(Issue{Issue::Severity::Warning, node, field, message});
}

void ValidationReport::setFacts(const QString& node, NodeFacts facts) {
  facts_.insert(node, std::move(facts));
}

bool ValidationReport::ok() const {
  for (const Issue& i : issues_)
    if (i.severity == Issue::Severity::Error) return false;
  return true;
}

QList<Issue> ValidationReport::errors() const {
  QList<Issue> out;
  for (const Issue& i : issues_)
    if (i.severity == Issue::Severity::Error) out.append(i);
  return out;
}

QList<Issue> ValidationReport::forNode(const QString& node) const {
  QList<Issue> out;
  for (const Issue& i : issues_)
    if (i.node == node) out.append(i);
  return out;
}

namespace {

QString num(double d) {
  if (std::isfinite(d) && d == std::floor(d) && std::abs(d) < 1e18) return QString::number(qint64(d));
  return QString::number(d, 'g', 15);
}

QString shown(const QJsonValue& v) {
  if (v.isString()) {
    QString s = v.toString();
    if (s.size() > 40) s = s.left(40) + QStringLiteral("...");
    return u'"' + s + u'"';
  }
  if (v.isDouble()) return num(v.toDouble());
  if (v.isBool()) return v.toBool() ? QStringLiteral("true") : QStringLiteral("false");
  if (v.isNull()) return QStringLiteral("null");
  if (v.isArray()) return QStringLiteral("an array");
  if (v.isObject()) return QStringLiteral("an object");
  return QStringLiteral("nothing");
}

QString checkRange(const ParamSpec& spec, double d) {
  if (spec.min && d < *spec.min)
    return QStringLiteral("%1 is below the minimum %2").arg(num(d), num(*spec.min));
  if (spec.max && d > *spec.max)
    return QStringLiteral("%1 is above the maximum %2").arg(num(d), num(*spec.max));
  return {};
}

QString names(const QStringList& list) {
  return list.isEmpty() ? QStringLiteral("none") : list.join(", ");
}

}  // namespace

QString checkParam(const ParamSpec& spec, const QJsonValue& value) {
  switch (spec.type) {
    case ParamType::Int: {
      if (!value.isDouble()) return QStringLiteral("expected an integer, got %1").arg(shown(value));
      const double d = value.toDouble();
      if (!std::isfinite(d)) return QStringLiteral("must be a finite number, got %1").arg(num(d));
      if (d != std::floor(d)) return QStringLiteral("expected an integer, got %1").arg(num(d));
      return checkRange(spec, d);
    }
    case ParamType::Float: {
      if (!value.isDouble()) return QStringLiteral("expected a number, got %1").arg(shown(value));
      const double d = value.toDouble();
      if (!std::isfinite(d)) return QStringLiteral("must be a finite number, got %1").arg(num(d));
      return checkRange(spec, d);
    }
    case ParamType::Bool:
      if (!value.isBool()) return QStringLiteral("expected true or false, got %1").arg(shown(value));
      return {};
    case ParamType::String:
      if (!value.isString()) return QStringLiteral("expected a string, got %1").arg(shown(value));
      return {};
    case ParamType::Enum:
      if (!value.isString() || !spec.enumValues.contains(value.toString()))
        return QStringLiteral("%1 is not one of: %2").arg(shown(value), names(spec.enumValues));
      return {};
    case ParamType::Shape: {
      if (!value.isArray())
        return QStringLiteral("expected a shape, an array of integers like [100, 100], got %1")
            .arg(shown(value));
      const QJsonArray dims = value.toArray();
      // The element count as a double: exact for what fits, and overflow shows as > 2^63 instead of wrapping.
      double elements = 1;
      for (qsizetype i = 0; i < dims.size(); ++i) {
        const QJsonValue dv = dims[i];
        const double d = dv.toDouble();
        if (!dv.isDouble() || !std::isfinite(d) || d != std::floor(d))
          return QStringLiteral("dimension %1: expected an integer, got %2").arg(i).arg(shown(dv));
        // A spec whose minimum is below 0 allows it (Reshape's -1, a dimension left for the others to set).
        const bool allowed = spec.min && d >= *spec.min;
        if (d < 0 && !allowed) return QStringLiteral("dimension %1: %2 is negative").arg(i).arg(num(d));
        const QString range = checkRange(spec, d);
        if (!range.isEmpty()) return QStringLiteral("dimension %1: %2").arg(i).arg(range);
        elements *= std::fabs(d);
      }
      if (elements >= 9223372036854775808.0)
        return QStringLiteral("%1 dimensions multiply to more than 2^63 elements").arg(dims.size());
      return {};
    }
  }
  return {};
}

namespace {

constexpr int kMaxCpuDevices = 1024;

void checkSettings(const QJsonObject& settings, ValidationReport& report) {
  const QJsonValue schedule = settings.value("schedule");
  if (!schedule.isUndefined() && schedule.toString() != "parallel" && schedule.toString() != "sequential")
    report.error({}, QStringLiteral("settings.schedule"),
                 QStringLiteral("%1 is not one of: parallel, sequential").arg(shown(schedule)));
  const QJsonValue cpus = settings.value("cpu_devices");
  if (!cpus.isUndefined()) {
    ParamSpec spec{.name = "cpu_devices", .type = ParamType::Int, .min = 1, .max = kMaxCpuDevices};
    const QString problem = checkParam(spec, cpus);
    if (!problem.isEmpty()) report.error({}, QStringLiteral("settings.cpu_devices"), problem);
  }
}

// Every strongly connected component with more than one node, or with a self-loop, holds a cycle. Tarjan,
// iterative: a hostile file may chain 100,000 nodes, too deep for recursion.
QList<QList<int>> cyclicComponents(const QList<QList<int>>& adj) {
  const int n = int(adj.size());
  QList<int> index(n, -1), low(n, 0);
  QList<bool> onStack(n, false);
  QList<int> stack;
  QList<QList<int>> out;
  int counter = 0;
  struct Frame {
    int v, edge;
  };
  for (int root = 0; root < n; ++root) {
    if (index[root] >= 0) continue;
    QList<Frame> frames{{root, 0}};
    index[root] = low[root] = counter++;
    stack.append(root);
    onStack[root] = true;
    while (!frames.isEmpty()) {
      Frame& f = frames.last();
      if (f.edge < adj[f.v].size()) {
        const int w = adj[f.v][f.edge++];
        if (index[w] < 0) {
          index[w] = low[w] = counter++;
          stack.append(w);
          onStack[w] = true;
          frames.append({w, 0});
        } else if (onStack[w]) {
          low[f.v] = std::min(low[f.v], index[w]);
        }
        continue;
      }
      const int v = f.v;
      frames.removeLast();
      if (!frames.isEmpty()) low[frames.last().v] = std::min(low[frames.last().v], low[v]);
      if (low[v] != index[v]) continue;
      QList<int> component;
      int w;
      do {
        w = stack.takeLast();
        onStack[w] = false;
        component.append(w);
      } while (w != v);
      const bool selfLoop = component.size() == 1 && adj[v].contains(v);
      if (component.size() > 1 || selfLoop) out.append(component);
    }
  }
  return out;
}

// The shortest cycle through `start` inside its component (BFS), as node indices start ... last.
QList<int> shortestCycle(int start, const QList<QList<int>>& adj, const QSet<int>& component) {
  QHash<int, int> parent;
  QList<int> queue{start};
  parent.insert(start, -1);
  for (qsizetype head = 0; head < queue.size(); ++head) {
    const int u = queue[head];
    for (int w : adj[u]) {
      if (w == start) {
        QList<int> path;
        for (int x = u; x != -1; x = parent.value(x)) path.prepend(x);
        return path;
      }
      if (!component.contains(w) || parent.contains(w)) continue;
      parent.insert(w, u);
      queue.append(w);
    }
  }
  return {start};
}

QString cycleText(const QList<int>& path, const QStringList& ids) {
  QStringList shownIds;
  constexpr int kShown = 12;  // a cycle of 100,000 nodes must not make a message per node of that length
  if (path.size() <= kShown) {
    for (int i : path) shownIds.append(clip(ids[i]));
    shownIds.append(clip(ids[path.first()]));
    return QStringLiteral("cycle: ") + shownIds.join(" -> ");
  }
  for (int k = 0; k < kShown - 2; ++k) shownIds.append(clip(ids[path[k]]));
  shownIds.append(QStringLiteral("..."));
  shownIds.append(clip(ids[path.last()]));
  shownIds.append(clip(ids[path.first()]));
  return QStringLiteral("cycle: %1 (%2 nodes)").arg(shownIds.join(" -> ")).arg(path.size());
}

void checkCycles(const GraphDocument& doc, ValidationReport& report) {
  QHash<QString, int> index;
  QStringList ids;
  for (const GraphNode& n : doc.nodes()) {
    if (index.contains(n.id)) continue;
    index.insert(n.id, int(ids.size()));
    ids.append(n.id);
  }
  QList<QList<int>> adj(ids.size());
  for (const GraphConnection& c : doc.connections()) {
    const auto from = index.constFind(c.from.node), to = index.constFind(c.to.node);
    if (from == index.constEnd() || to == index.constEnd()) continue;
    adj[*from].append(*to);
  }
  // Duplicates out after the fact: a contains() per wire made one output feeding 100,000 inputs quadratic.
  for (QList<int>& next : adj) {
    std::sort(next.begin(), next.end());
    next.erase(std::unique(next.begin(), next.end()), next.end());
  }
  for (QList<int> component : cyclicComponents(adj)) {
    std::sort(component.begin(), component.end());  // document order, so messages are stable
    const QSet<int> members(component.begin(), component.end());
    QSet<int> reported;
    QString firstText;
    int searches = 0;
    for (int v : component) {
      if (reported.contains(v)) continue;
      // Bounded work on a huge, densely cyclic component: past a few searches, the rest get the first cycle.
      if (searches++ >= 16) {
        report.error(ids[v], {}, firstText);
        continue;
      }
      const QList<int> path = shortestCycle(v, adj, members);
      const QString text = cycleText(path, ids);
      if (firstText.isEmpty()) firstText = text;
      for (int p : path) {
        if (reported.contains(p)) continue;
        reported.insert(p);
        report.error(ids[p], {}, text);
      }
    }
  }
}

QString portList(const QList<PortSpec>& ports) {
  QStringList out;
  for (const PortSpec& p : ports) out.append(p.name);
  return names(out);
}

}  // namespace

ValidationReport validate(const GraphDocument& doc, const NodeTypeRegistry& registry) {
  return validate(doc, registry, RunSettings::fromGraph(doc.settings()));
}

ValidationReport validate(const GraphDocument& doc, const NodeTypeRegistry& registry,
                          const RunSettings& settings) {
  return validate(runGraph(doc, registry, {}, settings.files.folder), registry, settings);
}

ValidationReport validate(const RunGraph& run, const NodeTypeRegistry& registry,
                          const RunSettings& settings) {
  const GraphDocument& doc = run.graph();
  ValidationReport report;
  for (const Issue& issue : run.issues) {
    if (issue.severity == Issue::Severity::Warning)
      report.warning(issue.node, issue.field, issue.message);
    else
      report.error(issue.node, issue.field, issue.message);
  }
  // In a flattened graph the inner nodes' ids are paths, each step a valid id; a '/' inside an id of the
  // document itself was reported while flattening.
  const auto validId = [&](const QString& id) {
    if (!run.flattened) return GraphDocument::isValidId(id);
    for (const QString& step : id.split(subgraph::kPathSeparator))
      if (!GraphDocument::isValidId(step)) return false;
    return true;
  };
  checkSettings(settings.all, report);
  checkFileAccess(doc, registry, settings.files, report);

  // Ids: valid and unique. A duplicate is reported once, naming where both sit in the file.
  QHash<QString, QList<int>> positions;
  for (int i = 0; i < doc.nodes().size(); ++i) positions[doc.nodes()[i].id].append(i);
  QSet<QString> reportedIds;
  for (int i = 0; i < doc.nodes().size(); ++i) {
    const QString& id = doc.nodes()[i].id;
    if (!validId(id))
      report.error(
          id, QStringLiteral("nodes[%1].id").arg(i),
          QStringLiteral("invalid id \"%1\": use 1-64 letters, digits, '_' or '-'").arg(clip(id, 40)));
    const QList<int>& at = positions[id];
    if (at.size() > 1 && !reportedIds.contains(id)) {
      reportedIds.insert(id);
      QStringList where;
      for (int k : at) where.append(QStringLiteral("nodes[%1]").arg(k));
      if (where.size() > 10) where = where.mid(0, 10) << QStringLiteral("...");
      report.error(id, QStringLiteral("id"),
                   QStringLiteral("duplicate id \"%1\" (%2)").arg(clip(id), where.join(", ")));
    }
  }

  // Types. A node whose type no plugin provides stays in the document as "missing".
  QHash<QString, NodeTypePtr> typeOf;  // first node of each id
  for (const GraphNode& n : doc.nodes()) {
    NodeTypePtr type = registry.find(n.type);
    if (!type)
      report.error(n.id, QStringLiteral("type"),
                   QStringLiteral("unknown node type \"%1\" (no plugin provides it)").arg(clip(n.type)));
    if (!typeOf.contains(n.id)) typeOf.insert(n.id, type);
  }

  // Connections: both ends exist, ports exist on the right side, types fit.
  QHash<QPair<QString, QString>, QStringList> wiresInto;  // (node, input) -> sources
  for (int i = 0; i < doc.connections().size(); ++i) {
    const GraphConnection& c = doc.connections()[i];
    const auto field = [i] { return QStringLiteral("connections[%1]").arg(i); };
    const auto from = [&] { return clip(c.from.str(), 100); };
    const auto to = [&] { return clip(c.to.str(), 100); };
    const bool fromExists = positions.contains(c.from.node), toExists = positions.contains(c.to.node);
    // Painted on the node that exists, the input side first; graph-level when neither does.
    const QString owner = toExists ? c.to.node : fromExists ? c.from.node : QString();
    bool ok = true;
    if (!fromExists) {
      report.error(owner, field(),
                   QStringLiteral("%1 -> %2: no node \"%3\"").arg(from(), to(), clip(c.from.node)));
      ok = false;
    }
    if (!toExists) {
      report.error(owner, field(),
                   QStringLiteral("%1 -> %2: no node \"%3\"").arg(from(), to(), clip(c.to.node)));
      ok = false;
    }
    const NodeTypePtr fromType = typeOf.value(c.from.node), toType = typeOf.value(c.to.node);
    const PortSpec* out = fromType ? fromType->spec().output(c.from.port) : nullptr;
    const PortSpec* in = toType ? toType->spec().input(c.to.port) : nullptr;
    // The ports of a missing node are unknown: nothing to check there.
    if (fromExists && fromType && !out) {
      report.error(owner, field(),
                   QStringLiteral("%1 -> %2: %3 (%4) has no output \"%5\" (outputs: %6)")
                       .arg(from(), to(), clip(c.from.node), fromType->spec().name, clip(c.from.port),
                            portList(fromType->spec().outputs)));
      ok = false;
    }
    if (toExists && toType && !in) {
      report.error(owner, field(),
                   QStringLiteral("%1 -> %2: %3 (%4) has no input \"%5\" (inputs: %6)")
                       .arg(from(), to(), clip(c.to.node), toType->spec().name, clip(c.to.port),
                            portList(toType->spec().inputs)));
      ok = false;
    }
    // Every wire counts for "connected"; only wires from a real output count as a second wire, so one
    // dangling wire is one error, not two.
    if (toExists) {
      QStringList& into = wiresInto[{c.to.node, c.to.port}];
      if (fromExists && (out || !fromType))
        into.append(from());
      else
        into.append(QString());
    }
    if (ok && out && in && !portAccepts(in->type, out->type))
      report.error(owner, field(),
                   QStringLiteral("type mismatch: %1 gives %2, %3 takes %4")
                       .arg(from(), portTypeName(out->type), to(), portTypeName(in->type)));
  }

  // Inputs: required ones wired, none wired twice. Params: types, ranges, then the node type's own checks.
  QSet<QString> checkedIds;
  for (const GraphNode& n : doc.nodes()) {
    const NodeTypePtr type = registry.find(n.type);
    if (!type || checkedIds.contains(n.id)) continue;
    checkedIds.insert(n.id);
    const NodeTypeSpec& spec = type->spec();
    for (const PortSpec& in : spec.inputs) {
      const QStringList all = wiresInto.value({n.id, in.name});
      QStringList sources;
      for (const QString& source : all)
        if (!source.isEmpty()) sources.append(source);
      if (sources.size() > 1)
        report.error(n.id, QStringLiteral("inputs.%1").arg(in.name),
                     QStringLiteral("%1 wires into one input (from %2)")
                         .arg(sources.size())
                         .arg(sources.size() > 5 ? sources.mid(0, 5).join(", ") + QStringLiteral(", ...")
                                                 : sources.join(", ")));
      // A node with an invalid id cannot be wired to ("mm.1.a" is no endpoint): its id is the problem.
      else if (all.isEmpty() && in.required && validId(n.id))
        report.error(n.id, QStringLiteral("inputs.%1").arg(in.name),
                     QStringLiteral("required input is not connected (%1)").arg(portTypeName(in.type)));
    }
    QJsonObject checked;  // params as validateParams sees them: bad values replaced by defaults
    for (auto it = n.params.begin(); it != n.params.end(); ++it) {
      const auto field = [&] { return QStringLiteral("params.%1").arg(clip(it.key())); };
      const ParamSpec* p = spec.param(it.key());
      if (!p) {
        QStringList known;
        for (const ParamSpec& s : spec.params) known.append(s.name);
        report.warning(n.id, field(),
                       QStringLiteral("unknown param, ignored (%1 has: %2)").arg(spec.name, names(known)));
        continue;
      }
      const QString problem = checkParam(*p, it.value());
      if (!problem.isEmpty())
        report.error(n.id, field(), problem);
      else
        checked.insert(it.key(), it.value());
    }
    try {
      for (const QString& problem : type->validateParams(withDefaults(spec, checked)))
        report.error(n.id, QStringLiteral("params"), problem);
    } catch (const std::exception& e) {
      report.error(n.id, QStringLiteral("params"),
                   QStringLiteral("checking params failed: %1").arg(e.what()));
    } catch (...) {
      // Plugin code may throw anything; validation must still end with a report, never terminate().
      report.error(n.id, QStringLiteral("params"),
                   QStringLiteral("checking params failed: an exception that is not a std::exception"));
    }
  }

  checkCycles(doc, report);

  for (NodeSetPlugin* plugin : registry.plugins()) {
    try {
      plugin->validateGraph(doc, registry, settings, report);
    } catch (const std::exception& e) {
      report.error({}, {}, QStringLiteral("%1: graph check failed: %2").arg(plugin->setName(), e.what()));
    } catch (...) {
      report.error({}, {},
                   QStringLiteral("%1: graph check failed: an exception that is not a std::exception")
                       .arg(plugin->setName()));
    }
  }
  return report;
}

}  // namespace gn::core
