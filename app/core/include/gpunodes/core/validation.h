// Validation before a run: every problem, per node, in one pass.
#pragma once
#include <QList>
#include <QString>

namespace gn::core {

class GraphDocument;
class NodeTypeRegistry;

struct Issue {
  enum class Severity { Error, Warning };
  Severity severity = Severity::Error;
  QString node;   // empty for graph-level problems
  QString field;  // "params.repeat", "inputs.a", "connections[3]"; may be empty
  QString message;
  QString text() const;  // "mm1: params.repeat: must be at most 1000000"
};

class ValidationReport {
 public:
  void error(const QString& node, const QString& field, const QString& message);
  void warning(const QString& node, const QString& field, const QString& message);
  bool ok() const;  // no errors (warnings allowed)
  const QList<Issue>& issues() const { return issues_; }
  QList<Issue> errors() const;
  QList<Issue> forNode(const QString& node) const;

 private:
  QList<Issue> issues_;
};

// Unknown types ("missing" nodes), duplicate ids, dangling connections, unknown ports, port type mismatch,
// a required input left open, two wires into one input, cycles (naming their nodes), params of the wrong
// type or out of range, and each plugin's own graph checks (device conflicts known before the run).
ValidationReport validate(const GraphDocument& doc, const NodeTypeRegistry& registry);

}  // namespace gn::core
