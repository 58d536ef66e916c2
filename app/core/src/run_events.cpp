#include "gpunodes/core/run_events.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace gn::core {

void EventChannel::push(RunEvent e) {
  {
    std::lock_guard lock(mutex_);
    queue_.append(std::move(e));
  }
  cv_.notify_all();
}

void EventChannel::push(QList<RunEvent> events) {
  if (events.isEmpty()) return;
  {
    std::lock_guard lock(mutex_);
    queue_.append(std::move(events));
  }
  cv_.notify_all();
}

QList<RunEvent> EventChannel::drain() {
  std::lock_guard lock(mutex_);
  return std::exchange(queue_, {});
}

QList<RunEvent> EventChannel::waitAndDrain(int timeoutMs) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, std::chrono::milliseconds(std::max(0, timeoutMs)), [this] { return !queue_.isEmpty(); });
  return std::exchange(queue_, {});
}

namespace {

constexpr std::pair<NodeStatus, const char*> kStatuses[] = {
    {NodeStatus::Pending, "pending"},
    {NodeStatus::Running, "running"},
    {NodeStatus::Ok, "ok"},
    {NodeStatus::Cached, "cached"},
    {NodeStatus::Failed, "failed"},
    {NodeStatus::Skipped, "skipped"},
    {NodeStatus::Cancelled, "cancelled"},
    {NodeStatus::Bypassed, "bypassed"},
    {NodeStatus::Muted, "muted"},
    {NodeStatus::Invalid, "invalid"},
    {NodeStatus::Missing, "missing"},
};

bool carriesStatus(RunEvent::Kind kind) {
  return kind == RunEvent::Kind::NodeFinished || kind == RunEvent::Kind::NodeFailed ||
         kind == RunEvent::Kind::NodeCached || kind == RunEvent::Kind::RunFinished;
}

constexpr std::pair<RunEvent::Kind, const char*> kKinds[] = {
    {RunEvent::Kind::RunStarted, "RunStarted"},
    {RunEvent::Kind::RunFinished, "RunFinished"},
    {RunEvent::Kind::NodeQueued, "NodeQueued"},
    {RunEvent::Kind::NodeStarted, "NodeStarted"},
    {RunEvent::Kind::NodeFinished, "NodeFinished"},
    {RunEvent::Kind::NodeFailed, "NodeFailed"},
    {RunEvent::Kind::NodeCached, "NodeCached"},
    {RunEvent::Kind::NodeWarning, "NodeWarning"},
    {RunEvent::Kind::Progress, "Progress"},
    {RunEvent::Kind::Metric, "Metric"},
    {RunEvent::Kind::Span, "Span"},
    {RunEvent::Kind::Memory, "Memory"},
};

}  // namespace

QString nodeStatusName(NodeStatus status) {
  for (const auto& [s, name] : kStatuses)
    if (s == status) return QString::fromLatin1(name);
  return {};
}

std::optional<NodeStatus> nodeStatusFromName(const QString& name) {
  for (const auto& [s, n] : kStatuses)
    if (name == QLatin1String(n)) return s;
  return std::nullopt;
}

bool isFinal(NodeStatus status) {
  return status != NodeStatus::Pending && status != NodeStatus::Running;
}

QJsonObject eventToJson(const RunEvent& e) {
  QJsonObject o;
  for (const auto& [kind, name] : kKinds)
    if (kind == e.kind) o.insert("kind", name);
  using K = RunEvent::Kind;
  if (!e.node.isEmpty()) o.insert("node", e.node);
  if (carriesStatus(e.kind)) o.insert("status", nodeStatusName(e.status));
  switch (e.kind) {
    case K::RunStarted:
    case K::NodeFailed:
    case K::NodeWarning:
      o.insert("message", e.message);
      break;
    case K::RunFinished:
      o.insert("ok", e.ok);
      o.insert("value", e.value);
      o.insert("message", e.message);
      break;
    case K::NodeFinished:
    case K::Progress:
      o.insert("value", e.value);
      break;
    case K::Metric:
      o.insert("series", e.series);
      o.insert("t", e.t);
      o.insert("value", e.value);
      break;
    case K::Span:
      o.insert("span", QJsonObject{{"node", e.span.node},
                                   {"op", e.span.op},
                                   {"device", e.span.device},
                                   {"stream", e.span.stream},
                                   {"startUs", e.span.startUs},
                                   {"endUs", e.span.endUs},
                                   {"bytes", static_cast<double>(e.span.bytes)},
                                   {"flops", e.span.flops},
                                   {"hostBlocking", e.span.hostBlocking}});
      break;
    case K::Memory:
      o.insert("memory", QJsonObject{{"device", e.memory.device},
                                     {"tUs", e.memory.tUs},
                                     {"allocated", static_cast<double>(e.memory.allocated)},
                                     {"reserved", static_cast<double>(e.memory.reserved)}});
      break;
    case K::NodeQueued:
    case K::NodeStarted:
    case K::NodeCached:
      break;
  }
  return o;
}

bool eventFromJson(const QJsonObject& o, RunEvent* out, QString* error) {
  const QString kind = o.value("kind").toString();
  bool known = false;
  RunEvent e{};
  for (const auto& [k, name] : kKinds)
    if (kind == QLatin1String(name)) e.kind = k, known = true;
  if (!known) {
    *error = QStringLiteral("unknown event kind \"%1\"").arg(kind);
    return false;
  }
  for (const char* key : {"node", "message", "series", "status"})
    if (o.contains(key) && !o.value(key).isString()) {
      *error = QStringLiteral("%1: \"%2\" is not a string").arg(kind, key);
      return false;
    }
  for (const char* key : {"t", "value"})
    if (o.contains(key) && !o.value(key).isDouble()) {
      *error = QStringLiteral("%1: \"%2\" is not a number").arg(kind, key);
      return false;
    }
  e.node = o.value("node").toString();
  e.message = o.value("message").toString();
  e.series = o.value("series").toString();
  e.t = o.value("t").toDouble();
  e.value = o.value("value").toDouble();
  e.ok = o.value("ok").toBool(true);
  if (carriesStatus(e.kind)) {
    // A stream without statuses (a gpunodes before they existed) says only what its kinds say.
    const NodeStatus byKind = e.kind == RunEvent::Kind::NodeFinished          ? NodeStatus::Ok
                              : e.kind == RunEvent::Kind::NodeCached          ? NodeStatus::Cached
                              : e.kind == RunEvent::Kind::RunFinished && e.ok ? NodeStatus::Ok
                                                                              : NodeStatus::Failed;
    const std::optional<NodeStatus> status =
        o.contains("status") ? nodeStatusFromName(o.value("status").toString()) : byKind;
    if (!status || !isFinal(*status)) {
      *error = QStringLiteral("%1: \"%2\" is not a node outcome").arg(kind, o.value("status").toString());
      return false;
    }
    e.status = *status;
  }
  const QJsonObject s = o.value("span").toObject();
  e.span = {s.value("node").toString(),
            s.value("op").toString(),
            s.value("device").toString(),
            s.value("stream").toString(),
            s.value("startUs").toDouble(),
            s.value("endUs").toDouble(),
            static_cast<qint64>(s.value("bytes").toDouble()),
            s.value("flops").toDouble(),
            s.value("hostBlocking").toBool()};
  const QJsonObject m = o.value("memory").toObject();
  e.memory = {m.value("device").toString(), m.value("tUs").toDouble(),
              static_cast<qint64>(m.value("allocated").toDouble()),
              static_cast<qint64>(m.value("reserved").toDouble())};
  *out = e;
  return true;
}

}  // namespace gn::core
