// Validation before a run: every problem, per node, in one pass.
#pragma once
#include <QHash>
#include <QJsonValue>
#include <QList>
#include <QString>
#include <QStringList>
#include <optional>

#include "gpunodes/core/graph_document.h"

namespace gn::core {

class NodeTypeRegistry;
struct ParamSpec;
struct RunGraph;
struct RunSettings;

// A change a plugin offers with an issue, that makes the problem go away: a node put on one wire. The host
// applies it without knowing what it means (the editor's GraphEditor::applyFix, as one undo step): it adds a
// node of `nodeType` with `params`, moves the wire that feeds `input` so that it feeds the new node's
// `throughInput`, wires the new node's `throughOutput` into `input`, and wires each of `alsoWired`. The GPU
// node set offers a Copy to the first operand's device where operands sit on different devices.
struct IssueFix {
  // The source of one more wire into the new node.
  struct Wire {
    QString port;     // the new node's input
    Endpoint source;  // an output of a node already in the graph
  };
  QString label;          // what the user picks, as a menu entry: "Insert Copy node: b to cuda:0"
  QString nodeType;       // the type of the node to insert: one that a loaded plugin provides
  QJsonObject params;     // the new node's params; the ones left out take their defaults
  Endpoint input;         // the input (node.port) whose wire the new node goes on; it must be wired
  QString throughInput;   // the new node's input that takes that wire's source
  QString throughOutput;  // the new node's output that then feeds `input`
  QList<Wire> alsoWired;  // further inputs of the new node, each wired from an existing output
};

struct Issue {
  enum class Severity { Error, Warning };
  Severity severity = Severity::Error;
  QString node;   // empty for graph-level problems
  QString field;  // "params.repeat", "inputs.a", "connections[3]"; may be empty
  QString message;
  std::optional<IssueFix> fix = std::nullopt;  // what the plugin that reported it offers to do about it
  QString text() const;                         // "mm1: params.repeat: must be at most 1000000"
};

// What the checks learned about a node that its user should see before any run: a short line drawn on the
// node ("16×5×5 · 2,416 params") and, where there is more to say, a table for the inspector (a Network's
// layer summary, like torchinfo's). Plugins fill them in validateGraph.
struct NodeFacts {
  QString badge;
  QString detail;           // what the badge means, for the node's tooltip ("35 steps x 256 features")
  QStringList columns;      // the table's header; empty for no table
  QList<QStringList> rows;  // each as long as columns
};

class ValidationReport {
 public:
  void setFacts(const QString& node, NodeFacts facts);
  const QHash<QString, NodeFacts>& facts() const { return facts_; }
  void error(const QString& node, const QString& field, const QString& message);
  void warning(const QString& node, const QString& field, const QString& message);
  // An error with the change that fixes it, for the editor to offer (see IssueFix).
  void error(const QString& node, const QString& field, const QString& message, IssueFix fix);
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
