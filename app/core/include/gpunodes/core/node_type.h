// The node-type interface a plugin implements, and what a node sees while it runs. QtCore only: the host
// knows nothing about GPUs; values that flow on wires are opaque PortValues owned by the plugin.
#pragma once
#include <QByteArray>
#include <QJsonObject>
#include <QJsonValue>
#include <QList>
#include <QString>
#include <QStringList>
#include <memory>
#include <optional>

namespace gn::core {

// Layer: a symbolic activation of a network being drawn (its shape per sample), not data.
enum class PortType { Device, Devices, Tensor, Model, Dataset, Scalar, Layer };
QString portTypeName(PortType t);                          // "Device", "Tensor", ...
std::optional<PortType> portTypeFromName(const QString&);  // inverse
// Whether an output of type `from` may feed an input of type `to` (a Device feeds a Devices input).
bool portAccepts(PortType to, PortType from);

struct PortSpec {
  QString name;
  PortType type = PortType::Tensor;
  bool required = true;  // inputs only
  QString doc;
};

enum class ParamType { Int, Float, Bool, String, Enum, Shape };
QString paramTypeName(ParamType t);

// How a String param's value is used as a path (file_access.h resolves and checks such values).
enum class FileUse {
  None,         // not a path
  Read,         // a file or a folder that the node reads
  WriteFile,    // a file that the node creates or replaces
  WriteFolder,  // a folder (created when missing) in which the node writes, replaces and removes files of
                // its own naming only, and reads them back (training checkpoints)
};
struct ParamSpec {
  QString name;
  ParamType type = ParamType::Int;
  QJsonValue defaultValue;
  std::optional<double> min, max;  // Int and Float; for Shape, bounds on each dimension
  QStringList enumValues;          // Enum
  QString doc;                     // tooltip and `gpunodes nodes` text
  FileUse file = FileUse::None;    // String: whether and how the value names a file or folder
};

struct NodeTypeSpec {
  QString name;      // "MatMul": the `type` in graph files
  QString category;  // palette group
  QString description;
  QList<PortSpec> inputs, outputs;
  QList<ParamSpec> params;
  const PortSpec* input(const QString& port) const;
  const PortSpec* output(const QString& port) const;
  const ParamSpec* param(const QString& name) const;
};

// The params execute() sees: the spec's defaults, overridden by what the node sets.
QJsonObject withDefaults(const NodeTypeSpec& spec, const QJsonObject& params);

// A value on a wire: a device, a batch of tensors, a model... Only the plugin that made it knows what it is.
class PortValue {
 public:
  virtual ~PortValue() = default;
  virtual QString summary() const = 0;  // for logs and tooltips: "3 x Tensor[100, 100] on cpu:1"
  // The memory the value holds, device and host together: what keeping it in the run cache costs, counted
  // against the cache's bound. 0 for values too small to matter (a device, a few numbers).
  virtual qint64 bytes() const { return 0; }
};
using PortValuePtr = std::shared_ptr<const PortValue>;

class RunSession;

// What execute() sees: its params (validated, with defaults filled in), its inputs, and ways to report.
class NodeContext {
 public:
  virtual ~NodeContext() = default;
  virtual const QString& nodeId() const = 0;
  virtual const QJsonObject& params() const = 0;
  virtual PortValuePtr input(const QString& port) const = 0;  // null when not connected
  virtual void setOutput(const QString& port, PortValuePtr value) = 0;
  virtual RunSession* session() const = 0;  // the node's plugin session for this run
  virtual bool cancelled() const = 0;
  virtual void progress(double fraction) = 0;  // 0..1
  virtual void metric(const QString& series, double t, double value) = 0;
  virtual void warning(const QString& message) = 0;
  // Extra fields for this node's entry in the report (an Inspect node's "inspect" array, for example).
  virtual void reportField(const QString& key, const QJsonValue& value) = 0;
};

class NodeType {
 public:
  virtual ~NodeType() = default;
  virtual const NodeTypeSpec& spec() const = 0;
  // Checks that go beyond the spec's types and ranges (a shape with a zero dimension, say). Each string is
  // one problem. Called with defaults filled in.
  virtual QStringList validateParams(const QJsonObject& params) const {
    Q_UNUSED(params);
    return {};
  }
  // Enqueues work and returns; may block where the node means a sync (Synchronize, Inspect, a blocking
  // copy). Throws std::exception for a failure that belongs to this node.
  virtual void execute(NodeContext& ctx) const = 0;

  // Whether a run may reuse this node's outputs from an earlier run with the same cache key (its type, id,
  // params, inputs' keys, settings and cacheIdentity; run_cache.h) instead of executing it. Pure producers
  // say yes. Measurements, whose timing is the point, and side effects (a file written, values read back to
  // show) say no, which is the default: a node type that does not know about the cache always runs.
  virtual bool reusable(const QJsonObject& params) const {
    Q_UNUSED(params);
    return false;
  }
  // What decides the outputs besides params, inputs and settings, as bytes for the cache key: the device a
  // Device node resolves to (a GPU that vanished is a change), the size and time of a file a node reads.
  // Called on the executor thread with the params filled with defaults and the run's session (null when
  // the plugin has none); it must not throw.
  virtual QByteArray cacheIdentity(const QJsonObject& params, RunSession* session) const {
    Q_UNUSED(params);
    Q_UNUSED(session);
    return {};
  }
};
using NodeTypePtr = std::shared_ptr<const NodeType>;

}  // namespace gn::core
