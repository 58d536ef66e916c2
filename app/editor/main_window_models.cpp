// MainWindow's model files (File > Import, File > Export > <format> model…, a model dropped on a canvas): the
// plugins' converters (core/format_converter.h) run through model_conversion.h. Kept apart from
// main_window.cpp, which holds the window's other jobs.
#include <QDir>
#include <QFileInfo>
#include <QInputDialog>
#include <QStatusBar>

#include "canvas/graph_scene.h"
#include "gpunodes/core/format_converter.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"
#include "main_window.h"
#include "model_conversion.h"
#include "subgraph_navigator.h"

namespace gn::editor {

void MainWindow::importModelAs(const QString& modelPath) {
  const QFileInfo model(modelPath);
  const QString graph = chooseFile("Save the imported graph as",
                                   model.absoluteDir().filePath(model.completeBaseName() + ".json"),
                                   "gpunodes graphs (*.json)", true);
  if (graph.isEmpty()) return;
  importModel(modelPath, graph.endsWith(".json") ? graph : graph + ".json");
}

bool MainWindow::importModel(const QString& modelPath, const QString& graphPath) {
  const core::FormatConverterPtr converter = core::importerForFile(*registry_, modelPath);
  if (!converter) {
    showError("Cannot import model", QString("%1: no plugin imports files of this kind").arg(modelPath));
    return false;
  }
  if (!maybeSave()) return false;
  const core::NodeTypeRegistry* registry = registry_;
  const core::ConvertResult r =
      runConversion(this, "Importing " + QFileInfo(modelPath).fileName(), [&](const core::ConvertProgress& p) {
        core::GraphDocument imported;
        return core::importToGraphFile(*converter, *registry, modelPath, graphPath, {}, imported, p);
      });
  for (const QString& w : r.warnings) logMessage(LogLevel::Warning, QFileInfo(modelPath).fileName() + ": " + w);
  if (!r.ok) {
    showError("Cannot import model", QString("%1: %2").arg(modelPath, r.error));
    return false;
  }
  if (!loadFile(graphPath)) return false;
  logMessage(LogLevel::Info, QString("Imported %1 as %2").arg(modelPath, r.written.join(", ")));
  return true;
}

void MainWindow::exportModelDialog(const core::FormatConverter& converter) {
  // The network: the selected node when it can be one, else the only candidate, else the user picks.
  const QStringList candidates = modelNodes(doc_, *registry_);
  const QStringList selected = navigator_->currentScene()->selectedNodeIds();
  QString network = selected.size() == 1 && candidates.contains(selected.first()) ? selected.first() : QString();
  if (network.isEmpty() && candidates.size() == 1) network = candidates.first();
  if (network.isEmpty() && candidates.size() > 1) {
    bool ok = false;
    network = QInputDialog::getItem(this, "Export " + converter.name(), "The network to export:", candidates, 0,
                                    false, &ok);
    if (!ok) return;
  }
  if (network.isEmpty()) {
    showError("Export " + converter.name(), "The graph has no network to export: draw layers into a Network");
    return;
  }
  const QString out = exportPath("Export " + converter.name() + " model", network + "." +
                                 converter.extensions().value(0), converterFilter(converter));
  if (out.isEmpty()) return;
  const auto weights = ask(QMessageBox::Question, "Export " + converter.name(),
                           QString("Export %1 with the parameters of a saved parameter file? No exports the "
                                   "weights its init and seed give.").arg(network),
                           QMessageBox::Yes | QMessageBox::No | QMessageBox::Cancel);
  if (weights == QMessageBox::Cancel) return;
  QString params;
  if (weights == QMessageBox::Yes) {
    params = chooseFile("Parameters to export", documentFolder(),
                        "Parameter files (*.params *.safetensors *.gnparams);;All files (*)", false);
    if (params.isEmpty()) return;
  }
  exportModel(converter.name(), network, params, out);
}

bool MainWindow::exportModel(const QString& format, const QString& networkNode, const QString& paramsFile,
                             const QString& outPath) {
  const core::FormatConverterPtr converter = core::findConverter(*registry_, format);
  if (!converter || !converter->canExport()) {
    showError("Cannot export model", QString("no plugin exports %1 models").arg(format));
    return false;
  }
  // The converter reads its own copy of the document on the worker thread.
  const QByteArray graph = core::serializer::save(doc_);
  const core::ConvertResult r =
      runConversion(this, "Exporting " + networkNode, [&](const core::ConvertProgress& p) {
        core::GraphDocument copy;
        QString error;
        if (!core::serializer::load(graph, copy, &error)) return core::ConvertResult{.error = error};
        return converter->exportModel(copy, networkNode, paramsFile, outPath, p);
      });
  for (const QString& w : r.warnings) logMessage(LogLevel::Warning, networkNode + ": " + w);
  if (!r.ok) {
    showError("Cannot export model", QString("%1: %2").arg(networkNode, r.error));
    return false;
  }
  logMessage(LogLevel::Info, QString("Exported %1 to %2").arg(networkNode, r.written.join(", ")));
  statusBar()->showMessage("Exported " + outPath, 4000);
  return true;
}

}  // namespace gn::editor
