// An ONNX graph as gpunodes layers: each supported operation (or known pattern: the Erf form of GELU, MatMul
// followed by Add, a Pad before an AveragePool, the shape arithmetic torch writes for a Reshape) becomes one
// layer node with PyTorch's params, and each initializer the weight of its layer under the name the Network
// gives it ("<id>.weight"). Anything else is refused with the op type, the node's name, the opset and the
// list of what is supported (docs/onnx.md).
#pragma once
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QStringList>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "gpunodes/nn/network.h"
#include "onnx_reader.h"

namespace gn::nodes::onnx {

struct ImportedLayer {
  QString id;                // a valid, unique node id made from the ONNX node's name
  nn::LayerKind kind = nn::LayerKind::Input;
  QJsonObject params;        // the layer node's params, every one the kind reads
  QStringList inputs;        // the ids of the layers on its ports, in port order
  std::vector<std::pair<std::string, TensorValues>> weights;  // "weight", "bias", "running_mean", ...
  Shape out;                 // its shape per sample
  std::string source;        // the ONNX node (or nodes) it came from, for messages
};

struct ImportedNetwork {
  QString name, description;  // the graph's name and doc string (or the file's base name)
  QList<ImportedLayer> layers;  // the Input first, every layer after its inputs; the last is the output
  QStringList warnings;
  int64_t opset = 0;
};

// The supported operations, as the refusal lists them.
QString supportedOps();

// Reads the checked model into layers. Throws OnnxError naming the node or tensor.
ImportedNetwork importNetwork(OnnxModel& model, const std::function<void(double, const QString&)>& progress);

}  // namespace gn::nodes::onnx
