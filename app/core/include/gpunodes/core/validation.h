// Validation before a run: every problem, per node, in one pass.
#pragma once
#include <QHash>
#include <QJsonValue>
#include <QList>
#include <QString>
#include <QStringList>

namespace gn::core {

class GraphDocument;
class NodeTypeRegistry;
struct ParamSpec;
struct RunGraph;
struct RunSettings;

struct Issue {
  enum class Severity { Error, Warning };
  Severity severity = Severity::Error;
  QString node;   // empty for graph-level problems
  QString field;  // "params.repeat", "inputs.a", "connections[3]"; may be empty
  QString message;
  QString text() const;  // "mm1: params.repeat: must be at most 1000000"
};

// What the checks learned about a node that its user should see before any run: a short line drawn on the
// node ("16×5×5 · 2,416 params") and, where there is more to say, a table for the inspector (a Network's
// layer summary, like torchinfo's). Plugins fill them in validateGraph.
struct NodeFacts {
  QString badge;
  QStringList columns;      // the table's header; empty for no table
  QList<QStringList> rows;  // each as long as columns
};

class ValidationReport {
 public:
  void setFacts(const QString& node, NodeFacts facts);
  const QHash<QString, NodeFacts>& facts() const { return facts_; }
  void error(const QString& node, const QString& field, const QString& message);
  void warning(const QString& node, const QString& field, const QString& message);
  bool ok() const;  // no errors (warnings allowed)
  const QList<Issue>& issues() const { return issues_; }
  QList<Issue> errors() const;
  QList<Issue> forNode(const QString& node) const;

 private:
  QList<Issue> issues_;
  QHash<QString, NodeFacts> facts_;
};

// Unknown types ("missing" nodes), duplicate ids, dangling connections, unknown ports, port type mismatch,
// a required input left open, two wires into one input, cycles (naming their nodes), params of the wrong
// type or out of range, and each plugin's own graph checks (device conflicts known before the run).
// Graph-level checks of doc.settings() too (schedule, cpu_devices). Cycles are reported on every node that
// lies on one, with the same message, so the editor can paint each of them.
ValidationReport validate(const GraphDocument& doc, const NodeTypeRegistry& registry);
// The same, with run settings that override the file's (command-line --schedule, --cpu-devices); plugins'
// validateGraph sees these.
ValidationReport validate(const GraphDocument& doc, const NodeTypeRegistry& registry,
                          const RunSettings& settings);
// The same on the graph a run sees (run_graph.h: bypass, mute, run to here), which the two above build
// from the document first; its bypass errors come first.
ValidationReport validate(const RunGraph& run, const NodeTypeRegistry& registry, const RunSettings& settings);

// One param value against its spec: JSON type, finite, range, enum values, shape dimensions (each an
// integer >= 0 within the spec's range, and a product that fits in 64 bits). Empty when the value is fine;
// otherwise the problem, without the param's name ("must be at most 100000"). The CLI's --set and the
// editor's inspector use it too.
QString checkParam(const ParamSpec& spec, const QJsonValue& value);

}  // namespace gn::core
