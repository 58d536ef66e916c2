// Events a run streams to the editor and the CLI, through a thread-safe channel that the UI drains in
// batches (a timer at 10-30 Hz), so the UI thread never blocks and never sees one call per op.
#pragma once
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QtGlobal>
#include <condition_variable>
#include <mutex>
#include <optional>

namespace gn::core {

struct TraceSpan {
  QString node, op, device, stream;
  double startUs = 0, endUs = 0;  // on the run's timeline
  qint64 bytes = 0;
  double flops = 0;
  bool hostBlocking = false;
};

struct MemorySampleEvent {
  QString device;
  double tUs = 0;
  qint64 allocated = 0, reserved = 0;
};

// What became of a node, decided in one place (the executor) and carried on the node's last event, so that no
// consumer (the editor, the CLI, the process runner, the report) derives it from a message. The first four
// are states on the way; Invalid and Missing are a refused run's (validation failed before anything ran).
enum class NodeStatus {
  Pending,    // queued, not started
  Running,    // its execute() ran and its work is not over
  Ok,         // its work finished
  Cached,     // its outputs came from the run cache: it did not run (run_cache.h)
  Failed,     // it, or its work, failed with the event's message
  Skipped,    // not run because an input's node failed, was skipped or cancelled, or is muted
  Cancelled,  // the run was cancelled before or while it ran
  Bypassed,   // not run, as asked: its outputs are its pass-through inputs (run_graph.h)
  Muted,      // not run, as asked, and neither are the nodes that need it
  Invalid,    // the run was refused; this node's first validation error is its message
  Missing,    // the run was refused; no plugin provides the node's type
};

// "ok", "cached", "failed", ...: the names of the report and the event stream (docs/events.md).
QString nodeStatusName(NodeStatus status);
// The status a name stands for; nullopt for a name that is none of them.
std::optional<NodeStatus> nodeStatusFromName(const QString& name);
// Whether a node with this status is over: everything but Pending and Running.
bool isFinal(NodeStatus status);

struct RunEvent {
  enum class Kind {
    RunStarted,
    RunFinished,  // ok tells the outcome, status Ok, Failed or Cancelled which; message has the first error
    NodeQueued,
    NodeStarted,
    NodeFinished,  // status Ok; value: wall milliseconds from the node's start to the end of its work
    NodeFailed,    // status Failed, Skipped, Cancelled, Bypassed or Muted; message says why
    NodeCached,    // status Cached: the node's outputs came from the run cache, it did not run
    NodeWarning,   // message
    Progress,      // node, value in 0..1; an empty node is the whole run (nodes done / nodes)
    Metric,        // series, t, value
    Span,          // span
    Memory,        // memory
  };
  Kind kind;
  QString node;
  QString message;
  QString series;
  double t = 0, value = 0;
  bool ok = true;
  NodeStatus status = NodeStatus::Ok;  // the node's outcome (NodeFinished, NodeFailed, NodeCached), the run's
                                       // (RunFinished)
  TraceSpan span;
  MemorySampleEvent memory;
};

// One event as JSON, the line format of `gpunodes run --events` (docs/events.md): {"kind": "Metric",
// "node": ..., ...} with only the fields that kind uses. eventFromJson reads it back; it returns false for a
// line that is not an event (an unknown kind, a field of the wrong type), saying why in *error.
QJsonObject eventToJson(const RunEvent& e);
bool eventFromJson(const QJsonObject& json, RunEvent* out, QString* error);

class EventChannel {
 public:
  void push(RunEvent e);
  void push(QList<RunEvent> events);
  // Everything queued so far, oldest first; never blocks.
  QList<RunEvent> drain();
  // Blocks up to timeoutMs for at least one event, then drains.
  QList<RunEvent> waitAndDrain(int timeoutMs);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  QList<RunEvent> queue_;
};

}  // namespace gn::core
