// The graph a run sees: the document with bypass, mute and "run to here" applied. One function serves
// validation, the executor and the CLI, so that what is checked is exactly what runs.
//
// - A bypassed node does not run. Each wire out of its output O is rewired to the source of its first input
//   of O's type (through chains of bypassed nodes), so the value passes through untouched. A connected
//   output with no such input, or with that input open, cannot be bypassed: an error naming node and port.
// - A muted node does not run, nor does any node that needs it (through the rewired wires), transitively.
// - With targets ("run to here"), only the targets and their ancestors run; the other nodes are left out
//   of the run altogether. A target may be a path into subgraphs ("block1/conv2"); a Subgraph node as a
//   target stands for every node inside it.
#pragma once
#include <QList>
#include <QString>
#include <QStringList>
#include <memory>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/run_events.h"
#include "gpunodes/core/validation.h"

namespace gn::core {

class NodeTypeRegistry;

struct RunGraph {
  // A node that is part of the run but does not execute: status Bypassed, Muted or Skipped (a muted
  // node's dependent; message "skipped: input a (m1.out) is muted").
  struct NotRun {
    QString id, type;
    NodeStatus status = NodeStatus::Bypassed;
    QString message;
  };
  QList<NotRun> notRun;  // in document order
  QList<Issue> issues;   // nodes that cannot be bypassed, and subgraphs that cannot be flattened
  // The document held subgraphs, which run as their inner nodes: ids in graph() are paths ("block1/conv2",
  // subgraph.h).
  bool flattened = false;

  // What runs. Without a bypassed or muted node and without targets, the document itself.
  const GraphDocument& graph() const { return owned_ ? *owned_ : *source_; }

 private:
  friend RunGraph runGraph(const GraphDocument&, const NodeTypeRegistry&, const QStringList&, const QString&);
  const GraphDocument* source_ = nullptr;
  std::shared_ptr<GraphDocument> owned_;
};

// `doc` must outlive the result. Works on invalid graphs too (unknown types, dangling wires, duplicate ids
// are left for validation to report): a bypassed node of an unknown type is kept as it is.
// With a fileFolder, every file param of the result is resolved against it (file_access.h), so that what
// is checked and what runs name the same files.
RunGraph runGraph(const GraphDocument& doc, const NodeTypeRegistry& registry,
                  const QStringList& targets = {}, const QString& fileFolder = {});

}  // namespace gn::core
