// What the GPU node types share: spec builders, the base class, and access to inputs, params and the session.
#pragma once
#include <QJsonArray>
#include <QJsonObject>
#include <QString>
#include <QStringList>
#include <memory>
#include <optional>
#include <vector>

#include "gpunodes/core/node_type.h"
#include "gpunodes/precision.h"
#include "gpunodes/shape.h"
#include "graph_checks.h"
#include "session.h"
#include "values.h"

namespace gn::nodes {

// --- specs ---------------------------------------------------------------------------------------------
core::PortSpec inPort(const QString& name, core::PortType type, const QString& doc, bool required = true);
core::PortSpec outPort(const QString& name, core::PortType type, const QString& doc);
core::ParamSpec intParam(const QString& name, qint64 def, double min, double max, const QString& doc);
core::ParamSpec floatParam(const QString& name, double def, const QString& doc);
core::ParamSpec boolParam(const QString& name, bool def, const QString& doc);
core::ParamSpec enumParam(const QString& name, const QStringList& values, const QString& def,
                          const QString& doc);
core::ParamSpec stringParam(const QString& name, const QString& def, const QString& doc);
// A String param naming a file or folder that the node reads or writes (the host resolves and checks it:
// core/file_access.h).
core::ParamSpec pathParam(const QString& name, const QString& def, core::FileUse use, const QString& doc);
core::ParamSpec shapeParam(const QString& name, const QJsonArray& def, const QString& doc);
// "precision": fp32 (default), tf32, bf16 or fp16 (precision.h), documented after `what` ("The products'
// math").
core::ParamSpec precisionParam(const QString& what);

class GpuNode : public core::NodeType {
 public:
  // Whether a node's outputs follow from its params and inputs alone, so a run cache may reuse them (Pure),
  // or it must run every time (Always: a measurement such as MatMul or Copy, a sync, values read back, a
  // file written).
  enum class Reuse { Always, Pure };
  explicit GpuNode(core::NodeTypeSpec spec, Reuse reuse = Reuse::Always)
      : spec_(std::move(spec)), reuse_(reuse) {}
  const core::NodeTypeSpec& spec() const override { return spec_; }
  // What the constructor said; node types whose answer depends on their params (Norm, Train) override it.
  bool reusable(const QJsonObject& params) const override;
  // This node type's part of the checks before a run (GpuNodesPlugin::validateGraph, graph_checks.h):
  // what its outputs will be (devices, shapes, batch sizes, models, layers) from what `check` knows of its
  // inputs and its params, and the problems known in advance, reported through `check` on this node. The
  // walk calls it once per node of this type, after the nodes that feed it, and never for a node the host
  // already refused. It runs on the UI thread after every edit: no work on devices, no file reads beyond a
  // directory scan or one image header. A port left out of the result is unknown to the nodes downstream,
  // which then check nothing against it. Default: nothing known, nothing reported.
  virtual Outputs check(NodeCheck& check) const;

 private:
  core::NodeTypeSpec spec_;
  Reuse reuse_;
};

// --- params --------------------------------------------------------------------------------------------
// A Shape param as a runtime shape; nullopt when it is not an array of whole numbers.
std::optional<Shape> shapeOf(const QJsonValue& v);
// init=values: numbers separated by commas, spaces or both; nullopt (with *error) for anything else.
std::optional<std::vector<float>> parseValues(const QString& text, QString* error);
// The "precision" param (precisionParam's): fp32 when it is missing.
Precision precisionOf(const QJsonObject& params);

// --- running -------------------------------------------------------------------------------------------
NodesSession& sessionOf(const core::NodeContext& ctx);
// The batch on a Tensor input; throws gn::Error when the input is open or carries something else.
std::shared_ptr<const TensorBatch> tensorInput(const core::NodeContext& ctx, const QString& port);
// The devices on a Device or Devices input; empty when it is open.
std::vector<Device> deviceInput(const core::NodeContext& ctx, const QString& port);
void setTensors(core::NodeContext& ctx, const QString& port, std::vector<Tensor> tensors);

// Pairs the elements of two batches: equal sizes pair up, and a batch of one is used with every element of
// the other. Throws gn::Error naming both sizes otherwise.
size_t pairedSize(const char* what, size_t a, size_t b);
inline size_t pick(size_t size, size_t i) {
  return size == 1 ? 0 : i;
}

// Refuses, before anything is allocated, a batch of outputs that cannot fit in `device`'s free memory
// (or under its memory_limit): absurd sizes fail with a message instead of an allocator crash or a kill.
void ensureFits(Runtime& rt, Device device, int64_t count, int64_t bytesEach, const QString& what);

QString qs(const std::string& s);

// The fix the checks offer for operands on different devices (tensor_nodes.cpp, beside the Copy node): a
// Copy on the wire into `input`, onto `device`, its device input wired from `deviceOutput`.
core::IssueFix copyFix(const core::Endpoint& input, Device device, const core::Endpoint& deviceOutput);

// For a cache key (NodeType::cacheIdentity): the path, and the name, size and modification time of the
// file there or of every file under the directory there. Editing, adding or removing a file changes it.
QByteArray fileIdentity(const QString& path);

// The node types, one factory per file.
core::NodeTypePtr makeDeviceNode();
core::NodeTypePtr makeAllDevicesNode();
core::NodeTypePtr makeTensorNode();
core::NodeTypePtr makeCopyNode();
core::NodeTypePtr makeMatMulNode();
core::NodeTypePtr makeElementwiseNode();
core::NodeTypePtr makeNormNode();
core::NodeTypePtr makeSynchronizeNode();
core::NodeTypePtr makeInspectNode();
core::NodeTypePtr makeModelNode();
core::NodeTypePtr makeForwardNode();
core::NodeTypePtr makeParametersNode();
core::NodeTypePtr makeSaveParamsNode();
core::NodeTypePtr makeLoadParamsNode();
core::NodeTypePtr makeDatasetNode();
core::NodeTypePtr makeTrainNode();
core::NodeTypePtr makeEvaluateNode();
core::NodeTypePtr makeGenerateNode();
core::NodeTypePtr makeExportOnnxNode();  // onnx/onnx_export_node.cpp
// Input, Conv2d, ... Concat and Network: the "Layers" category (layer_nodes.cpp).
QList<core::NodeTypePtr> makeLayerNodes();

}  // namespace gn::nodes
