// An imported network as a gpunodes graph: the layers as layer nodes laid out left to right
// (core/layered_layout.h), a Network, a CPU Device and a LoadParams of the weights, and the weights as a
// safetensors file under the Network's names ("<id>.weight"), written as it goes from the values the import
// holds, so that a big model is never in memory twice.
#pragma once
#include <QString>

#include "gpunodes/core/graph_document.h"
#include "onnx_importer.h"

namespace gn::nodes::onnx {

// Fills `doc` (fresh) with the graph; `weightsPath` is the path LoadParams reads, made absolute.
void buildGraph(const ImportedNetwork& net, const QString& weightsPath, core::GraphDocument& doc);
// Writes the weights atomically; throws OnnxError when the file cannot be written.
void writeWeights(const ImportedNetwork& net, const QString& path, const QString& source);

}  // namespace gn::nodes::onnx
