// The editor's side of model file formats (core/format_converter.h): File > Import and Export, and a model
// file dropped on the canvas, run the plugin's converter here, off the window's thread.
#pragma once
#include <QStringList>
#include <functional>

#include "gpunodes/core/format_converter.h"

class QWidget;

namespace gn::core {
class GraphDocument;
class NodeTypeRegistry;
}  // namespace gn::core

namespace gn::editor {

// Runs `work` on a worker thread while a modal progress dialog, shown once the work has taken 400 ms, says
// how far it got (the fraction and text passed to the progress callback). Returns what `work` returned; an
// exception it threw becomes the result's error. The window is painted but takes no input meanwhile, so
// the document cannot change under a conversion that reads it.
core::ConvertResult runConversion(QWidget* parent, const QString& title,
                                  const std::function<core::ConvertResult(const core::ConvertProgress&)>& work);

// The nodes of `doc` a converter may be asked to export: those with an output of port type Model, in file
// order (the converter refuses a Model that is not a network it can write, naming it).
QStringList modelNodes(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry);

// The file dialog filter for a converter's extensions: "ONNX models (*.onnx)".
QString converterFilter(const core::FormatConverter& converter);

}  // namespace gn::editor
