// Checks of a whole graph that only the GPU node set can make before a run: it follows shapes, batch sizes
// and devices from node to node, so that conflicts known in advance are reported on the node, all at once.
// This file holds what every node type's check shares: the walk over the graph in dependency order, the
// catalogue of the devices a run would have, the values known on wires, and the helpers that report the
// common problems. Each node type's own check is GpuNode::check, in the node type's file.
#pragma once
#include <QJsonObject>
#include <QSet>
#include <QString>
#include <map>
#include <optional>
#include <vector>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/validation.h"
#include "gpunodes/device.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/shape.h"
#include "model_values.h"

namespace gn::nodes {

// What the checks know of the machine: every device the run would have.
struct DeviceCatalog {
  std::vector<DeviceInfo> devices;
  int cudaCount() const;
  int cpuCount() const;
  const DeviceInfo* find(Device d) const;
};

// What is known before the run about the value on one output port. Unknown parts stay empty.
struct Known {
  bool isDevices = false, isTensors = false;
  // Devices: the list. Tensors: the devices the batch lives on, when known. Model: the model's device.
  std::vector<Device> devices;
  // The Device output (a Device node's) that put the value on its one device, when known: a fix that copies
  // onto that device wires its Copy from there.
  std::optional<core::Endpoint> deviceOutput;
  std::optional<Shape> shape;   // Tensors: every element's shape
  std::optional<double> count;  // Tensors: the batch size (a double: unchecked params may be absurd)
  std::optional<nn::ModelOptions> model;  // Model: the architecture
  nn::LayerNodePtr layer;                 // Layer: the activation and what it is built from
  // Dataset: image channels and side (after resize), which splits it has, the batch size, and what it serves
  // (samples and targets, as far as known before the run).
  std::optional<int64_t> channels, side, batch;
  std::optional<DataShape> data;
  bool hasTrain = true, hasTest = true;

  static Known deviceList(std::vector<Device> d) {
    Known k;
    k.isDevices = true;
    k.devices = std::move(d);
    return k;
  }
  std::optional<Device> single() const {
    if (devices.empty()) return std::nullopt;
    for (const Device& d : devices)
      if (d != devices.front()) return std::nullopt;
    return devices.front();
  }
  // Where this value is now, from another value: its devices and the Device output that gave them.
  void placeLike(const Known& other) {
    devices = other.devices;
    deviceOutput = other.single() ? other.deviceOutput : std::nullopt;
  }
};

using Outputs = std::map<QString, Known>;  // output port -> value

class GraphWalk;

// What one node's check (GpuNode::check) works with: the node, its params, what is known on its inputs, the
// machine, and the report, with the helpers for problems several node types share. Every report goes on
// this node. Made by the walk for one call of check and not kept.
class NodeCheck {
 public:
  NodeCheck(const GraphWalk& walk, const core::GraphNode& node, QJsonObject params,
            core::ValidationReport& report)
      : walk_(walk), node_(node), params_(std::move(params)), report_(report) {}

  const QString& id() const { return node_.id; }
  // The node's params, defaults filled in; the host has checked their types and ranges.
  const QJsonObject& params() const { return params_; }
  // The value wired into `port`: nullopt when the port is open, empty when nothing is known about it.
  std::optional<Known> input(const QString& port) const;
  // The same with an open port as unknown.
  Known inputOrUnknown(const QString& port) const { return input(port).value_or(Known{}); }
  const DeviceCatalog& catalog() const;
  // Whether a node of this graph writes the file at `path` during the run (a param that names a file it
  // writes: core::FileUse::WriteFile).
  bool writtenByGraph(const QString& path) const;

  void error(const QString& field, const QString& message) { report_.error(id(), field, message); }
  void warning(const QString& field, const QString& message) { report_.warning(id(), field, message); }
  void setFacts(core::NodeFacts facts) { report_.setFacts(id(), std::move(facts)); }

  // Something of `bytes` that cannot fit on device `d` even when the device is otherwise empty: false, and
  // the error on `field`, when it does not.
  bool checkFits(const QString& field, Device d, double bytes, const QString& what);
  // The same for `count` tensors of `shape` ("<what> 4 x Tensor[100, 100]").
  bool checkFits(const QString& field, Device d, double count, const Shape& shape, const QString& what);
  // Operands on two known, different devices: the runtime's message (a's device first) on `field`, with the
  // fix that copies one operand onto the other's device: b onto a's when b is a tensor and a's Device
  // output is known, else a onto b's likewise; without either, no fix.
  void checkSameDevice(const QString& field, const QString& portA, const Known& a, const QString& portB,
                       const Known& b);
  // The batch size of an op that pairs a's and b's elements; an error on `field` when they cannot pair.
  std::optional<double> pairCounts(const QString& field, const Known& a, const Known& b);
  // The devices must compute in the node's precision (precision_supported, check_precision's rule: CUDA,
  // or bf16 on a CPU with native bf16); `where` names what runs on them.
  void checkPrecision(const std::vector<Device>& devices, const QString& where);
  // A model that cannot take the dataset's images, reported on the data input.
  // That the model takes the dataset's samples and, under `loss` (when the node trains), gives what its
  // targets need: errors on inputs.data.
  void checkData(const Known& model, const Known& data, std::optional<nn::LossKind> loss = std::nullopt);
  // Errors on inputs.data where a MultiheadAttention layer's weights for one batch cannot fit the model's
  // device (part of checkData).
  void checkAttentionFits(const Known& model, const Known& data);
  // Where a model built by this node lives: the one device wired into `port` (the first of a list), the CPU
  // when the port is open, unknown otherwise; with the Device output that put it there, for fixes.
  Known modelDevice(const QString& port) const;

 private:
  const GraphWalk& walk_;
  const core::GraphNode& node_;
  QJsonObject params_;
  core::ValidationReport& report_;
};

// Reports, per node: settings the runtime would refuse, and each of this set's nodes' own check (see
// GpuNode::check: Device nodes that cannot resolve, operands on different devices with a Copy offered,
// shapes that cannot multiply, sizes that cannot fit, ...). Nodes of other plugins are passed over.
void checkGraph(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
                const core::NodeSetPlugin* self, const core::RunSettings& settings,
                const DeviceCatalog& catalog, core::ValidationReport& report);

}  // namespace gn::nodes
