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
  virtual ConvertResult exportModel(const GraphDocument& doc, const QString& networkNode,
                                    const QString& paramsFile, const QString& outPath,
                                    const ConvertProgress& progress = {}) const;
};
using FormatConverterPtr = std::shared_ptr<const FormatConverter>;

// Every converter the registry's plugins offer, in plugin order; the first of a name wins.
QList<FormatConverterPtr> formatConverters(const NodeTypeRegistry& registry);
// The converter called `name` (case-insensitive), or null.
FormatConverterPtr findConverter(const NodeTypeRegistry& registry, const QString& name);
// The converter that imports files with the extension of `path` (case-insensitive), or null.
FormatConverterPtr importerForFile(const NodeTypeRegistry& registry, const QString& path);

}  // namespace gn::core
