// Layer nodes and the Network node: a network drawn on the canvas. A Layer wire carries a symbolic
// activation (nn::LayerNode: the layer, its inputs and its shape per sample), never data; the Network node
// turns the layers upstream of its `out` input into a model. The same functions serve the checks before a
// run (graph_checks.cpp) and the run itself, so the two cannot disagree.
#pragma once
#include <QJsonObject>
#include <QString>

#include "gpunodes/core/node_type.h"
#include "gpunodes/core/validation.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/network.h"

namespace gn::nodes {

class LayerValue final : public core::PortValue {
 public:
  explicit LayerValue(nn::LayerNodePtr layer) : layer_(std::move(layer)) {}
  const nn::LayerNodePtr& layer() const { return layer_; }
  QString summary() const override;  // "Layer conv1 (Conv2d): 6×28×28 per sample"

 private:
  nn::LayerNodePtr layer_;
};

// A layer node's params (defaults filled in) as the runtime's layer description.
nn::LayerSpec layerSpecOf(nn::LayerKind kind, const QString& id, const QJsonObject& params);
// The Network node's model: the layers upstream of `out`, with the node's init params. Throws gn::Error when
// the layers do not make one network (no Input, or two).
nn::ModelOptions networkOptionsOf(const nn::LayerNode& out, const QJsonObject& params);

// "16×5×5"
QString shapeText(const Shape& shape);
// What the editor draws on a layer node before a run: its shape per sample and parameter count.
core::NodeFacts layerFacts(const nn::LayerNode& layer);
// The Network node's totals (parameters, forward FLOPs per sample, parameter memory) and its layer table.
core::NodeFacts networkFacts(const nn::NetworkSpec& net);

}  // namespace gn::nodes
