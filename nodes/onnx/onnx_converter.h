// The GPU node set's ONNX converter (core/format_converter.h): import reads a model into layer nodes, a
// Network, and a LoadParams of the weights written beside the graph; export writes a drawn network and its
// parameters as an opset-17 model (onnx_exporter.h).
#pragma once
#include "gpunodes/core/format_converter.h"

namespace gn::nodes::onnx {

class OnnxConverter final : public core::FormatConverter {
 public:
  QString name() const override { return QStringLiteral("ONNX"); }
  QStringList extensions() const override { return {QStringLiteral("onnx")}; }
  bool canImport() const override { return true; }
  bool canExport() const override { return true; }
  core::ConvertResult importFile(const QString& path, const QString& weightsPath, core::GraphDocument& doc,
                                 const core::ConvertProgress& progress) const override;
  core::ConvertResult exportModel(const core::GraphDocument& doc, const QString& networkNode,
                                  const QString& paramsFile, const QString& outPath,
                                  const core::ConvertProgress& progress = {},
                                  bool replaceForeign = false) const override;
};

}  // namespace gn::nodes::onnx
