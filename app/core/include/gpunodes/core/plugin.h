// The plugin interface: a node set (Qt plugin) provides node types, a run session per run, and graph-level
// checks. The host loads every node set it finds and reports the ones that fail, with path and reason.
#pragma once
#include <QJsonArray>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QtPlugin>
#include <functional>
#include <memory>

#include "gpunodes/core/format_converter.h"
#include "gpunodes/core/file_access.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/run_events.h"

namespace gn::core {

class GraphDocument;
class NodeTypeRegistry;
class ValidationReport;

// Graph settings after command-line overrides.
struct RunSettings {
  QString schedule = "parallel";  // or "sequential"
  int cpuDevices = 1;
  QJsonObject all;  // every setting as the file has it, for plugins that want more
  // Where relative paths resolve and what the run may write (file_access.h). Empty, as fromGraph leaves it:
  // paths as they are, unchecked. The command line and the editor set it from the graph file's folder.
  FilePolicy files;
  static RunSettings fromGraph(const QJsonObject& settings);
};

// A plugin's state for one run (the plugin's runtime, devices, allocators). Created on the executor thread.
class RunSession {
 public:
  virtual ~RunSession() = default;
  // Around each node's execute on the executor thread: the session tags the work it enqueues with the id.
  virtual void beginNode(const QString& nodeId) = 0;
  // After execute returns: onDone(error) is called, from any thread, once all the work the node enqueued
  // has finished; error is empty on success.
  virtual void endNode(const QString& nodeId, std::function<void(const QString& error)> onDone) = 0;
  virtual void cancel() = 0;  // any thread; running work stops within a second
  virtual void finish() = 0;  // executor thread: waits for everything queued
  // takeSpans, takeMemory and memorySummary are called from the executor's pump thread, concurrently with
  // beginNode/endNode on the executor thread: they must be thread-safe.
  virtual QList<TraceSpan> takeSpans() = 0;  // new since the last call
  virtual QList<MemorySampleEvent> takeMemory() = 0;
  virtual QJsonArray devices() const = 0;          // the report's "devices"
  virtual QJsonObject memorySummary() const = 0;   // {device: {peak_bytes, current_bytes}}
  virtual double peakGflops(const QString& device) const = 0;  // 0 when unknown
  // What the values this session makes depend on beyond themselves, for the run cache: values made under
  // one scope may be handed to nodes of a later session with the same scope. The GPU node set returns the
  // identity of the runtime its tensors live in, which it keeps while the settings stay the same; when the
  // scope changes, the cache drops this plugin's values. Empty: the values need nothing from the session.
  virtual QString valueScope() const { return {}; }
};

class NodeSetPlugin {
 public:
  virtual ~NodeSetPlugin() = default;
  virtual QString setName() const = 0;
  virtual QList<NodeTypePtr> nodeTypes() const = 0;
  // Null when this set's nodes need no run-wide state.
  virtual std::unique_ptr<RunSession> createSession(const RunSettings& settings) = 0;
  // Checks only the plugin can make before a run, such as device conflicts.
  virtual void validateGraph(const GraphDocument& doc, const NodeTypeRegistry& registry,
                             const RunSettings& settings, ValidationReport& report) const {
    Q_UNUSED(doc);
    Q_UNUSED(registry);
    Q_UNUSED(settings);
    Q_UNUSED(report);
  }
  // What `gpunodes devices` shows: {"devices": [...], "table": "text"}. Empty when the set has no devices.
  virtual QJsonObject environment(const RunSettings& settings) const {
    Q_UNUSED(settings);
    return {};
  }
  // The model file formats this set converts to and from graphs of its node types (see format_converter.h);
  // the CLI and the editor offer each one by its name. Empty when the set converts none.
  virtual QList<FormatConverterPtr> converters() const { return {}; }
};

}  // namespace gn::core

#define GN_NODESET_IID "org.gpunodes.NodeSet/1"
Q_DECLARE_INTERFACE(gn::core::NodeSetPlugin, GN_NODESET_IID)
