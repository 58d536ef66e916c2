#include "onnx_converter.h"

#include <QFileInfo>

#include "gpunodes/core/file_access.h"
#include "gpunodes/core/graph_document.h"
#include "onnx_exporter.h"
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
      net.description =
          "Imported from " + QFileInfo(path).fileName() + " (ONNX opset " + QString::number(net.opset) + ").";
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
                                               const core::ConvertProgress& progress,
                                               bool replaceForeign) const {
  core::ConvertResult r;
  const QString target = QFileInfo(outPath).absoluteFilePath();
  try {
    // The file-access rule of a run (core/file_access.h): gpunodes replaces only its own files, so an ONNX
    // model from another program, or anything else, is not overwritten by an export unless the caller says
    // so (export-onnx --force).
    if (QFileInfo(outPath).isDir()) throw OnnxError(target.toStdString() + " is a folder");
    if (!replaceForeign && QFileInfo::exists(outPath) && !core::isGpunodesFile(outPath))
      throw OnnxError(
          target.toStdString() +
          " exists and is not a gpunodes file (not an ONNX model gpunodes wrote): it is not replaced; "
          "remove it or write elsewhere");
    if (!paramsFile.isEmpty() && QFileInfo(paramsFile).absoluteFilePath() == target)
      throw OnnxError("the model file must differ from the parameter file " + target.toStdString());
    if (progress) progress(0, "building network " + networkNode);
    Runtime rt(RuntimeOptions{.cpu_devices = 1, .use_cuda = false});
    std::unique_ptr<nn::Model> model = networkModelOf(rt, doc, networkNode, paramsFile);
    ExportInfo info{.name = doc.name(), .description = doc.description(), .network = networkNode};
    r.warnings = exportNetwork(*model, info, outPath, progress);
    r.ok = true;
    r.written = {target};
    if (progress) progress(1, "exported");
  } catch (const std::bad_alloc&) {
    r.error = outPath + ": out of memory while exporting";
  } catch (const std::exception& e) {
    r.error = QString::fromStdString(e.what());
  }
  return r;
}

}  // namespace gn::nodes::onnx
