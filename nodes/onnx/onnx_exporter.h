// A drawn network and its parameters as an ONNX model, the inverse of onnx_importer.h: opset 17, IR version
// 8, producer "gpunodes" (so that core's isGpunodesFile lets a later export replace it), the batch axis of
// the input and the output dynamic (dim_param "batch"), one initializer per parameter and buffer under its
// safetensors name ("conv1.weight"), node names from the layer ids, and the graph's name and description as
// the graph's name, doc strings and metadata. Each layer becomes the ONNX operations listed in docs/onnx.md
// ("Export"); a layer that ONNX cannot express is refused, naming it. The file is written to a temporary file
// beside the target and renamed, so nothing is left on failure.
#pragma once
#include <QString>
#include <QStringList>
#include <functional>
#include <memory>

#include "gpunodes/nn/model.h"
#include "gpunodes/runtime.h"

namespace gn::core {
class GraphDocument;
}

namespace gn::nodes::onnx {

struct ExportInfo {
  QString name;         // the graph's name: GraphProto.name and metadata "name"
  QString description;  // the graph's description: the doc strings and metadata "description"
  QString network;      // the Network node's id: metadata "gpunodes.network"
};

// Writes `model` (a drawn network, Arch::Network, on any device) to `path`. Throws OnnxError naming the layer
// that cannot be written, or the file that cannot; nothing is written then. Returns the warnings.
QStringList exportNetwork(const nn::Model& model, const ExportInfo& info, const QString& path,
                          const std::function<void(double, const QString&)>& progress = {});

// The model that the Network node `networkNode` of `doc` (a path id inside subgraphs) builds, on the CPU of
// `rt`, with the parameters of `paramsFile` loaded (a GNPARAMS or safetensors file saved from that network),
// or the ones its init and seed give when it is empty. Layer params the document leaves out take the node
// types' defaults. Throws OnnxError (or gn::Error from the runtime) naming the node at fault.
std::unique_ptr<nn::Model> networkModelOf(Runtime& rt, const core::GraphDocument& doc,
                                          const QString& networkNode, const QString& paramsFile);

}  // namespace gn::nodes::onnx
