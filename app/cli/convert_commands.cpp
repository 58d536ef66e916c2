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
      "       gpunodes import-onnx MODEL.onnx -o GRAPH.json [--weights FILE] [--progress] [--force]\n"
      "                                        the model as layer nodes, a Network and a LoadParams of its\n"
      "                                        weights (default GRAPH.safetensors, beside the graph)\n"
      "       gpunodes export-onnx GRAPH.json --network NODE [--params FILE] -o MODEL.onnx [--force]\n"
      "                    [--progress]        the network ending at NODE, with the parameters in FILE\n"
      "                                        (default: the weights its init and seed give)\n"
      "       gpunodes import-onnx --help, export-onnx --help: their options\n");
}

QString convertCommandUsage(const QString& command) {
  const QString format = command.mid(7).toUpper();
  if (command.startsWith("import-"))
    return QStringLiteral(
               "usage: gpunodes %1 MODEL -o GRAPH.json [--weights FILE] [--progress] [--force]\n"
               "  reads the %2 model MODEL into layer nodes, a Network, a CPU Device and a LoadParams\n"
               "  of its weights; writes the graph and the weights\n"
               "  -o, --output GRAPH.json   the graph file to write\n"
               "  --weights FILE            the weights file to write, as safetensors (default:\n"
               "                            GRAPH.safetensors beside the graph); LoadParams names it\n"
               "                            relative to the graph's folder when it lies inside it; it\n"
               "                            must differ from MODEL and GRAPH.json\n"
               "  --progress                progress lines on stderr\n"
               "  -h, --help                this text\n"
               "  --force                   replace GRAPH.json or the weights file even when it is not\n"
               "                            gpunodes' own (never a folder)\n"
               "  An existing graph or weights file of gpunodes' own is replaced; any other is refused.\n"
               "  Nothing is written when the model is refused.\n"
               "exit codes: 0 ok, 1 the import failed, 2 usage\n")
        .arg(command, format);
  return QStringLiteral(
             "usage: gpunodes %1 GRAPH.json --network NODE [--params FILE] -o MODEL [--force]\n"
             "                [--progress]\n"
             "  writes the network that ends at the Network node NODE of GRAPH.json as %2\n"
             "  --network NODE            the Network node (a path such as block1/net in a subgraph)\n"
             "  --params FILE             its parameters: a GNPARAMS or safetensors file SaveParams\n"
             "                            wrote from that network (relative to the working folder);\n"
             "                            default: the weights its init and seed give\n"
             "  -o, --output MODEL        the model file to write, through a temporary file beside it\n"
             "                            (nothing is left on failure); an existing file that is not\n"
             "                            gpunodes' own (a model another program wrote, or anything\n"
             "                            else) is not replaced\n"
             "  --force                   replace MODEL even when it is not gpunodes' own (never a\n"
             "                            folder)\n"
             "  --progress                progress lines on stderr\n"
             "  -h, --help                this text\n"
             "exit codes: 0 ok, 1 the export failed, 2 usage\n")
      .arg(command, format);
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
  const QCommandLineOption force("force", "replace a file that is not gpunodes' own");
  parser.addOptions({output, verbose, force});
  if (import)
    parser.addOption(weights);
  else
    parser.addOptions({network, params});
  const QString usageText = convertCommandUsage(command);
  const Parsed p = parse(parser, command, args, 1, usageText);
  if (!p.ok) return p.exitCode;
  if (!parser.isSet(output)) return usageError(command + ": give the file to write with -o FILE", usageText);
  NodeTypeRegistry registry;
  loadPlugins(registry);
  const FormatConverterPtr converter = findConverter(registry, format);
  if (!converter || !(import ? converter->canImport() : converter->canExport()))
    return usageError(QStringLiteral("%1: no plugin %2 the format \"%3\" (formats: %4)")
                          .arg(command, import ? "imports" : "exports", format, formatList(registry, import)),
                      usageText);
  const QString in = p.positional[0], outFile = parser.value(output);
  ConvertResult r;
  if (import) {
    GraphDocument doc;
    r = importToGraphFile(*converter, registry, in, outFile, parser.value(weights), doc,
                          progressLine(!parser.isSet(verbose)), parser.isSet(force));
  } else {
    if (!parser.isSet(network))
      return usageError(command + ": give the Network node with --network NODE", usageText);
    GraphDocument doc;
    QString error;
    if (!serializer::loadFile(in, doc, &error)) {
      err(QStringLiteral("error: %1\n").arg(error));
      return kFailed;
    }
    r = converter->exportModel(doc, parser.value(network), parser.value(params), outFile,
                               progressLine(!parser.isSet(verbose)), parser.isSet(force));
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
