// Model file formats a node set can turn into graphs and back (the GPU node set's ONNX). The host names no
// format: the CLI's import-<name>/export-<name> commands and the editor's File > Import and Export menus list
// whatever converters the loaded plugins offer (NodeSetPlugin::converters), and only the plugin knows what a
// format's operations mean in its node types.
#pragma once
#include <QList>
#include <QString>
#include <QStringList>
#include <functional>
#include <memory>

namespace gn::core {

class GraphDocument;
class NodeTypeRegistry;

// What a conversion did: ok, or the one error that stopped it (naming the node or tensor at fault), and the
// warnings worth showing (an attribute ignored, a pattern read in a looser form).
struct ConvertResult {
  bool ok = false;
  QString error;
  QStringList warnings;
  QStringList written;  // the files written, absolute paths: nothing when !ok
};

// Progress of a long conversion, 0 to 1, with what it is doing; called on the converting thread.
using ConvertProgress = std::function<void(double fraction, const QString& what)>;

class FormatConverter {
 public:
  virtual ~FormatConverter() = default;
  // The format's name as menus and commands show it ("ONNX"); the CLI's commands use it in lower case.
  virtual QString name() const = 0;
  // The file name extensions of the format, without the dot ("onnx"): file dialogs filter on them and the
  // editor's canvas takes a dropped file with one of them.
  virtual QStringList extensions() const = 0;
  virtual bool canImport() const { return false; }
  virtual bool canExport() const { return false; }
  // Reads the model at `path` into `doc` (replacing its contents, name and description) and writes the
  // weights it needs to `weightsPath`, which the graph loads from; refuses a file it cannot take whole with
  // one error. On failure nothing is written and `doc` is left as it was.
  virtual ConvertResult importFile(const QString& path, const QString& weightsPath, GraphDocument& doc,
                                   const ConvertProgress& progress = {}) const;
  // Writes the network that ends at node `networkNode` of `doc` (a path id for one inside a subgraph) to
  // `outPath`, with the parameters in `paramsFile` (a parameter file saved from that network), or, when it
  // is empty, the weights the network starts from (its init and seed). On failure nothing is written.
  // An existing `outPath` that is not gpunodes' own file (file_access.h's isGpunodesFile: a model another
  // program wrote, or anything else) is refused with an error naming it and left as it was, unless
  // `replaceForeign` (the CLI's export-<fmt> --force), when it is replaced like gpunodes' own. A folder is
  // never replaced. The default (false) is the one callers through a FormatConverter get; an override
  // must keep the same default and the same rule.
  virtual ConvertResult exportModel(const GraphDocument& doc, const QString& networkNode,
                                    const QString& paramsFile, const QString& outPath,
                                    const ConvertProgress& progress = {}, bool replaceForeign = false) const;
};
using FormatConverterPtr = std::shared_ptr<const FormatConverter>;

// The weights file an import writes when none is named: GRAPH.safetensors beside the graph file.
QString defaultWeightsPath(const QString& graphPath);

// The whole import, as the CLI's import-<fmt> and the editor's File > Import do it: reads `modelPath` with
// `converter` into `doc`, writes the weights to `weightsPath` (empty: defaultWeightsPath) and the graph to
// `graphPath`. File params that name a file inside the graph's folder are written relative to it, so that
// the graph and its weights can move together. The weights file must differ from the model and the graph.
// An existing graph or weights file is replaced only when it is one of gpunodes' own (isGpunodesFile), or
// with `replaceForeign` (the CLI's --force); a folder never. On failure nothing is left written (the
// weights go again when the graph cannot be saved), `doc` is unchanged, and the error names what failed.
ConvertResult importToGraphFile(const FormatConverter& converter, const NodeTypeRegistry& registry,
                                const QString& modelPath, const QString& graphPath, QString weightsPath,
                                GraphDocument& doc, const ConvertProgress& progress = {},
                                bool replaceForeign = false);

// Every converter the registry's plugins offer, in plugin order; the first of a name wins.
QList<FormatConverterPtr> formatConverters(const NodeTypeRegistry& registry);
// The converter called `name` (case-insensitive), or null.
FormatConverterPtr findConverter(const NodeTypeRegistry& registry, const QString& name);
// The converter that imports files with the extension of `path` (case-insensitive), or null.
FormatConverterPtr importerForFile(const NodeTypeRegistry& registry, const QString& path);

}  // namespace gn::core
