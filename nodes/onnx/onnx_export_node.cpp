// ExportONNX: a model drawn from layer nodes (a Network, trained or not) written as an ONNX file, so that a
// graph can train a network and hand it to onnxruntime or any other ONNX runtime in the same run.
//
// Contract: input model is a drawn network (Arch::Network) on any device; the check before the run refuses a
// built-in Model architecture. The node writes `path` (FileUse::WriteFile: the host resolves it against the
// graph's folder and refuses a place outside it, or an existing file that is not gpunodes' own, unless the
// user allowed it) atomically, with what onnx_exporter.h writes: opset 17, the batch axis dynamic, the
// parameters as initializers under their safetensors names. A layer ONNX cannot express fails the node,
// naming the layer, and nothing is written. In a distributed run only rank 0 writes. Output model is the same
// model, once the file is written. It runs every time (a file is written), never from the run cache.
#include <QFileInfo>

#include "../model_values.h"
#include "../node_util.h"
#include "gpunodes/dist/world.h"
#include "gpunodes/errors.h"
#include "onnx_exporter.h"
#include "onnx_reader.h"

namespace gn::nodes {
namespace {

using core::PortType;

class ExportOnnxNode final : public GpuNode {
 public:
  ExportOnnxNode()
      : GpuNode({
            .name = "ExportONNX",
            .category = "Models",
            .description =
                "Writes a network drawn from layer nodes, with its current parameters, as an ONNX model "
                "(opset 17, the batch axis dynamic, parameters named as in SaveParams' safetensors files), "
                "which onnxruntime and the other ONNX tools run. BatchNorm is written in its evaluation form "
                "(running statistics) and Dropout as the identity it is in evaluation. A layer ONNX cannot "
                "express fails the node, naming it, and no file is written. docs/onnx.md lists the "
                "operations "
                "each layer becomes.",
            .inputs = {inPort("model", PortType::Model,
                              "The model to export: a Network of layer nodes, trained or not (a Model node's "
                              "built-in architectures are not exported; draw them from layers).")},
            .outputs = {outPort("model", PortType::Model, "The same model, once the file is written.")},
            .params = {pathParam(
                           "path", "model.onnx", core::FileUse::WriteFile,
                           "The ONNX file to write (replaced atomically); a relative path is relative to "
                           "the graph file's folder. A graph writes only inside its own folder unless the "
                           "user allows another place, and replaces only files gpunodes wrote."),
                       stringParam(
                           "name", "",
                           "The model's name in the file (graph name and metadata); empty: this node's "
                           "id.")},
        }) {}

  QStringList validateParams(const QJsonObject& params) const override {
    if (params["path"].toString().trimmed().isEmpty()) return {"path: give the file to write"};
    return {};
  }

  // The model passes through; a built-in architecture is refused before the run.
  Outputs check(NodeCheck& check) const override {
    const Known m = check.inputOrUnknown("model");
    if (m.model && m.model->arch != nn::Arch::Network)
      check.error("inputs.model",
                  QString("the model is the built-in %1 architecture of a Model node: ExportONNX "
                          "writes networks drawn from layer nodes into a Network")
                      .arg(nn::arch_name(m.model->arch)));
    return {{"model", m}};
  }

  void execute(core::NodeContext& ctx) const override {
    auto model = modelInput(ctx, "model");
    const QString path = ctx.params()["path"].toString();
    const QString name = ctx.params()["name"].toString().trimmed();
    const bool writes =
        !dist::launch_info().under_mpirun || !dist::World::get().joint_runs() || dist::World::get().is_root();
    if (!writes) {
      ctx.reportField("written_by", "rank 0");
      ctx.setOutput("model", model);
      return;
    }
    onnx::ExportInfo info{.name = name.isEmpty() ? ctx.nodeId() : name,
                          .description = "Exported by gpunodes' ExportONNX node " + ctx.nodeId() + ".",
                          .network = QString()};
    try {
      for (const QString& w : onnx::exportNetwork(model->model(), info, path)) ctx.warning(w);
    } catch (const CancelledError&) {
      throw;
    } catch (const std::exception& e) {
      throw Error(std::string("could not export: ") + e.what());
    }
    ctx.reportField("path", QFileInfo(path).absoluteFilePath());
    ctx.reportField("opset", 17);
    ctx.reportField("file_bytes", static_cast<double>(QFileInfo(path).size()));
    reportModel(ctx, model->model());
    ctx.setOutput("model", model);
  }
};

}  // namespace

core::NodeTypePtr makeExportOnnxNode() {
  return std::make_shared<ExportOnnxNode>();
}

}  // namespace gn::nodes
