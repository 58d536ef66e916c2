#include "gpunodes/core/format_converter.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QRegularExpression>

#include "gpunodes/core/file_access.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"

namespace gn::core {

ConvertResult FormatConverter::importFile(const QString& path, const QString& weightsPath, GraphDocument& doc,
                                          const ConvertProgress& progress) const {
  Q_UNUSED(path);
  Q_UNUSED(weightsPath);
  Q_UNUSED(doc);
  Q_UNUSED(progress);
  return {.error = name() + " files cannot be imported"};
}

ConvertResult FormatConverter::exportModel(const GraphDocument& doc, const QString& networkNode,
                                           const QString& paramsFile, const QString& outPath,
                                           const ConvertProgress& progress, bool replaceForeign) const {
  Q_UNUSED(doc);
  Q_UNUSED(networkNode);
  Q_UNUSED(paramsFile);
  Q_UNUSED(outPath);
  Q_UNUSED(progress);
  Q_UNUSED(replaceForeign);
  return {.error = "networks cannot be exported as " + name()};
}

QString defaultWeightsPath(const QString& graphPath) {
  const QFileInfo graph(graphPath);
  return graph.dir().filePath(graph.completeBaseName() + ".safetensors");
}

namespace {

// A gpunodes graph file: JSON whose first member is "format": "gpunodes-graph", as the serializer writes it.
// Only an import may replace one: isGpunodesFile leaves graphs out, so that no graph's run overwrites one.
bool isGraphFile(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return false;
  static const QRegularExpression graph(QStringLiteral(R"(^\s*\{\s*"format"\s*:\s*"gpunodes-graph")"));
  return QString::fromLatin1(f.read(256)).contains(graph);
}

// File params naming a file inside `folder` (or one of its sub-folders) become relative to it.
void relativizeFileParams(GraphDocument& doc, const NodeTypeRegistry& registry, const QDir& folder) {
  const QString root = folder.absolutePath() + u'/';
  for (const GraphNode& n : doc.nodes()) {
    const NodeTypePtr type = registry.find(n.type);
    if (!type) continue;
    for (auto it = n.params.begin(); it != n.params.end(); ++it) {
      const ParamSpec* spec = type->spec().param(it.key());
      if (!spec || spec->file == FileUse::None || !it.value().isString()) continue;
      const QString path = QFileInfo(it.value().toString()).absoluteFilePath();
      if (QFileInfo(it.value().toString()).isAbsolute() && path.startsWith(root))
        doc.setParam(n.id, it.key(), folder.relativeFilePath(path));
    }
  }
}

}  // namespace

ConvertResult importToGraphFile(const FormatConverter& converter, const NodeTypeRegistry& registry,
                                const QString& modelPath, const QString& graphPath, QString weightsPath,
                                GraphDocument& doc, const ConvertProgress& progress, bool replaceForeign) {
  if (weightsPath.isEmpty()) weightsPath = defaultWeightsPath(graphPath);
  const QString weights = QFileInfo(weightsPath).absoluteFilePath();
  if (weights == QFileInfo(graphPath).absoluteFilePath() || weights == QFileInfo(modelPath).absoluteFilePath())
    return {.error = QStringLiteral("the weights file %1 must differ from the model and the graph").arg(weights)};
  const QString graph = QFileInfo(graphPath).absoluteFilePath();
  for (const QString& target : {graph, weights}) {
    const QFileInfo f(target);
    if (f.isDir()) return {.error = QStringLiteral("%1 is a folder, not a file").arg(target)};
    const bool own = target == graph ? isGraphFile(target) : isGpunodesFile(target);
    if (f.exists() && !replaceForeign && !own)
      return {.error = QStringLiteral("%1 exists and is not a gpunodes file (a graph, GNPARAMS, safetensors, or "
                                      "ONNX written by gpunodes); refusing to replace it (--force allows it)")
                           .arg(target)};
  }
  GraphDocument imported;
  ConvertResult r = converter.importFile(modelPath, weightsPath, imported, progress);
  if (!r.ok) return r;
  relativizeFileParams(imported, registry, QFileInfo(graphPath).absoluteDir());
  QString error;
  if (!serializer::saveFile(graphPath, imported, &error)) {
    for (const QString& f : std::as_const(r.written)) QFile::remove(f);  // nothing half-written stays behind
    return {.error = error};
  }
  r.written.prepend(QFileInfo(graphPath).absoluteFilePath());
  doc.replaceAll(imported);
  return r;
}

QList<FormatConverterPtr> formatConverters(const NodeTypeRegistry& registry) {
  QList<FormatConverterPtr> all;
  QStringList names;
  for (NodeSetPlugin* plugin : registry.plugins())
    for (const FormatConverterPtr& c : plugin->converters())
      if (c && !names.contains(c->name(), Qt::CaseInsensitive)) {
        names.append(c->name());
        all.append(c);
      }
  return all;
}

FormatConverterPtr findConverter(const NodeTypeRegistry& registry, const QString& name) {
  for (const FormatConverterPtr& c : formatConverters(registry))
    if (c->name().compare(name, Qt::CaseInsensitive) == 0) return c;
  return nullptr;
}

FormatConverterPtr importerForFile(const NodeTypeRegistry& registry, const QString& path) {
  const QString suffix = QFileInfo(path).suffix();
  if (suffix.isEmpty()) return nullptr;
  for (const FormatConverterPtr& c : formatConverters(registry))
    if (c->canImport() && c->extensions().contains(suffix, Qt::CaseInsensitive)) return c;
  return nullptr;
}

}  // namespace gn::core
