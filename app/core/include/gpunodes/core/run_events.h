// Events a run streams to the editor and the CLI, through a thread-safe channel that the UI drains in
// batches (a timer at 10-30 Hz), so the UI thread never blocks and never sees one call per op.
#pragma once
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QtGlobal>
#include <condition_variable>
#include <mutex>

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

struct RunEvent {
  enum class Kind {
    RunStarted,
    RunFinished,  // ok tells the outcome; message has the first error
    NodeQueued,
    NodeStarted,
    NodeFinished,  // value: wall milliseconds from the node's start to the end of its work
    NodeFailed,    // message (also for a skipped or cancelled node)
    NodeCached,    // the node's outputs came from the run cache: it did not run (run_cache.h)
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
