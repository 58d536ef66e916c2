#include "gpunodes/core/format_converter.h"

#include <QFileInfo>

#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"

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
                                           const ConvertProgress& progress) const {
  Q_UNUSED(doc);
  Q_UNUSED(networkNode);
  Q_UNUSED(paramsFile);
  Q_UNUSED(outPath);
  Q_UNUSED(progress);
  return {.error = "networks cannot be exported as " + name()};
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
