#include "onnx_converter.h"

#include <QFileInfo>

#include "gpunodes/core/graph_document.h"
#include "onnx_graph_writer.h"
#include "onnx_importer.h"
#include "onnx_reader.h"

namespace gn::nodes::onnx {

core::ConvertResult OnnxConverter::importFile(const QString& path, const QString& weightsPath,
                                              core::GraphDocument& doc,
                                              const core::ConvertProgress& progress) const {
  core::ConvertResult r;
  try {
    if (progress) progress(0, "reading " + path);
    std::unique_ptr<OnnxModel> model = readModel(path.toStdString());
    ImportedNetwork net = importNetwork(*model, progress);
    model.reset();  // the weights live in `net` now
    if (net.name.isEmpty()) net.name = QFileInfo(path).completeBaseName();
    if (net.description.isEmpty())
      net.description = "Imported from " + QFileInfo(path).fileName() + " (ONNX opset " + QString::number(net.opset) + ").";
    core::GraphDocument fresh;
    buildGraph(net, weightsPath, fresh);
    if (progress) progress(0.9, "writing " + weightsPath);
    writeWeights(net, weightsPath, QFileInfo(path).fileName());
    doc.replaceAll(fresh);
    r.ok = true;
    r.warnings = net.warnings;
    r.written = {QFileInfo(weightsPath).absoluteFilePath()};
    if (progress) progress(1, "imported");
  } catch (const std::bad_alloc&) {
    r.error = path + ": out of memory while importing";
  } catch (const std::exception& e) {
    r.error = QString::fromStdString(e.what());
  }
  return r;
}

core::ConvertResult OnnxConverter::exportModel(const core::GraphDocument& doc, const QString& networkNode,
                                               const QString& paramsFile, const QString& outPath,
                                               const core::ConvertProgress& progress) const {
  return core::FormatConverter::exportModel(doc, networkNode, paramsFile, outPath, progress);
}

}  // namespace gn::nodes::onnx
