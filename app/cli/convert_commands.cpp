#include "cli/convert_commands.h"

#include <QCommandLineParser>
#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>

#include "cli/cli_support.h"
#include "gpunodes/core/format_converter.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/serializer.h"

namespace gn::cli {

using namespace gn::core;

bool isConvertCommand(const QString& command) {
  return (command.startsWith("import-") || command.startsWith("export-")) && command.size() > 7;
}

QString convertUsage() {
  return QStringLiteral(
      "       gpunodes import-onnx MODEL.onnx -o GRAPH.json [--weights FILE]\n"
      "                                        the model as layer nodes, a Network and a LoadParams of its\n"
      "                                        weights (default GRAPH.safetensors, beside the graph)\n"
      "       gpunodes export-onnx GRAPH.json --network NODE [--params FILE] -o MODEL.onnx\n"
      "                                        the network ending at NODE, with the parameters in FILE\n"
      "                                        (default: the weights its init and seed give)\n");
}

namespace {

QString formatList(const NodeTypeRegistry& registry, bool import) {
  QStringList names;
  for (const FormatConverterPtr& c : formatConverters(registry))
    if (import ? c->canImport() : c->canExport()) names.append(c->name().toLower());
  return names.isEmpty() ? QStringLiteral("none (no plugin converts a format)") : names.join(", ");
}

// Progress on stderr, for a big model: a line when a tenth more is done.
ConvertProgress progressLine(bool quiet) {
  if (quiet) return {};
  auto last = std::make_shared<double>(-1);
  return [last](double fraction, const QString& what) {
    if (fraction < *last + 0.1 && fraction < 1) return;
    *last = fraction;
    err(QStringLiteral("  %1% %2\n").arg(int(fraction * 100), 3).arg(what));
  };
}

}  // namespace

int commandConvert(const QString& command, const QStringList& args) {
  const bool import = command.startsWith("import-");
  const QString format = command.mid(7);
  QCommandLineParser parser;
  const QCommandLineOption output({"o", "output"}, "the file to write", "FILE");
  const QCommandLineOption weights("weights", "the weights file an import writes", "FILE");
  const QCommandLineOption network("network", "the Network node to export", "NODE");
  const QCommandLineOption params("params", "the parameter file to export", "FILE");
  const QCommandLineOption verbose("progress", "progress lines on stderr");
  parser.addOption(output);
  parser.addOption(verbose);
  if (import) parser.addOption(weights);
  else parser.addOptions({network, params});
  const Parsed p = parse(parser, command, args, 1);
  if (!p.ok) return p.exitCode;
  if (!parser.isSet(output)) return usageError(command + ": give the file to write with -o FILE");
  NodeTypeRegistry registry;
  loadPlugins(registry);
  const FormatConverterPtr converter = findConverter(registry, format);
  if (!converter || !(import ? converter->canImport() : converter->canExport()))
    return usageError(QStringLiteral("%1: no plugin %2 the format \"%3\" (formats: %4)")
                          .arg(command, import ? "imports" : "exports", format, formatList(registry, import)));
  const QString in = p.positional[0], outFile = parser.value(output);
  ConvertResult r;
  if (import) {
    QString weightsFile = parser.value(weights);
    if (weightsFile.isEmpty()) {
      const QFileInfo graph(outFile);
      weightsFile = graph.dir().filePath(graph.completeBaseName() + ".safetensors");
    }
    if (QFileInfo(weightsFile).absoluteFilePath() == QFileInfo(outFile).absoluteFilePath() ||
        QFileInfo(weightsFile).absoluteFilePath() == QFileInfo(in).absoluteFilePath())
      return usageError(command + ": the weights file must differ from the model and the graph");
    GraphDocument doc;
    r = converter->importFile(in, weightsFile, doc, progressLine(!parser.isSet(verbose)));
    if (r.ok) {
      QString error;
      if (!serializer::saveFile(outFile, doc, &error)) {
        QFile::remove(weightsFile);  // nothing half-written stays behind
        err(QStringLiteral("error: %1\n").arg(error));
        return kFailed;
      }
      r.written.prepend(QFileInfo(outFile).absoluteFilePath());
    }
  } else {
    if (!parser.isSet(network)) return usageError(command + ": give the Network node with --network NODE");
    GraphDocument doc;
    QString error;
    if (!serializer::loadFile(in, doc, &error)) {
      err(QStringLiteral("error: %1\n").arg(error));
      return kFailed;
    }
    r = converter->exportModel(doc, parser.value(network), parser.value(params), outFile,
                               progressLine(!parser.isSet(verbose)));
  }
  for (const QString& w : r.warnings) err(QStringLiteral("warning: %1: %2\n").arg(in, w));
  if (!r.ok) {
    err(QStringLiteral("error: %1: %2\n").arg(in, r.error));
    return kFailed;
  }
  for (const QString& f : r.written) out(QStringLiteral("wrote %1\n").arg(f));
  return kOk;
}

}  // namespace gn::cli
