// Subgraphs: a node of type "Subgraph" holds an inner graph, boundary ports that map onto inner ports, and
// params promoted from inner nodes. This header is what the editor, the CLI, validation and the executor
// share: grouping a selection into a subgraph and back, the node's ports and params as a NodeTypeSpec,
// flattening to a plain graph whose inner nodes have path ids ("block1/conv2"), addressing nodes by path,
// and the user's library of blocks. The file format is in docs/file-format.md ("Subgraphs").
#pragma once
#include <QJsonObject>
#include <QList>
#include <QPointF>
#include <QString>
#include <QStringList>
#include <memory>
#include <optional>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"

namespace gn::core {

class NodeTypeRegistry;
class ValidationReport;

// An input port of the subgraph node: what comes in feeds every inner input in `targets`.
struct SubgraphInput {
  QString name;
  QList<Endpoint> targets;
  QJsonObject extra;  // fields this version does not know
};

// An output port of the subgraph node: it hands on the inner output `source`.
struct SubgraphOutput {
  QString name;
  Endpoint source;
  QJsonObject extra;
};

// A param of the subgraph node that sets `param` of the inner node `node` (which may itself be a subgraph,
// whose promoted param it then is). Its value lives in the subgraph node's params; unset, the inner node's
// own value stands.
struct PromotedParam {
  QString name;
  QString node, param;
  QJsonObject extra;
};

// The library block an instance was made from: its name and the content hash it had then.
struct BlockRef {
  QString name, hash;
};

struct Subgraph {
  QList<GraphNode> nodes;
  QList<GraphConnection> connections;
  QList<SubgraphInput> inputs;
  QList<SubgraphOutput> outputs;
  QList<PromotedParam> promoted;
  BlockRef block;
  QJsonObject extra;  // fields this version does not know, and the editor's comment frames inside

  const GraphNode* node(const QString& id) const;
  const SubgraphInput* input(const QString& name) const;
  const SubgraphOutput* output(const QString& name) const;
  const PromotedParam* promotedParam(const QString& name) const;
};
using SubgraphPtr = std::shared_ptr<const Subgraph>;

namespace subgraph {

inline const QString kType = QStringLiteral("Subgraph");
// Subgraphs nested deeper than this are refused when a file is read: a bound on recursion everywhere.
constexpr int kMaxDepth = 16;
// Path ids join the ids of the subgraph nodes on the way with this: "block1/conv2".
inline constexpr QChar kPathSeparator = u'/';

bool isSubgraph(const GraphNode& node);
// A node's subgraph, or an empty one for a Subgraph node without one.
const Subgraph& of(const GraphNode& node);
bool hasSubgraphs(const GraphDocument& doc);

// The ports and params a subgraph node shows: each input typed as the first inner input it feeds, each output
// as its inner source, each promoted param with the inner param's type, range and doc, and its default the
// inner node's current value. A port whose inner end cannot be resolved is typed Tensor (validation reports
// it). Category "Subgraph", description naming the block.
NodeTypeSpec spec(const GraphNode& node, const NodeTypeRegistry& registry);
// The spec of any node: its type's, or spec() for a subgraph; nullopt for a type no plugin provides.
std::optional<NodeTypeSpec> specOf(const GraphNode& node, const NodeTypeRegistry& registry);

// ---- grouping ----------------------------------------------------------------------------------------

// What grouping or ungrouping changes in the document: remove these, then add those (one undo step).
struct Change {
  QList<GraphNode> removeNodes, addNodes;
  QList<GraphConnection> removeConnections, addConnections;
  QString error;  // when set, nothing is to change
};

// The selected nodes become one Subgraph node with id `newId` at the selection's top-left. Each outside
// output that feeds the selection becomes one input port (feeding every inner input it fed), each inner
// output that feeds the outside one output port; port names come from the inner ports, made unique.
Change group(const GraphDocument& doc, const QStringList& ids, const QString& newId);
// A free id for a new subgraph in doc: "block1", "block2"...
QString freeBlockId(const GraphDocument& doc);
// The subgraph node `id` replaced by its inner nodes (renamed where their ids are taken, moved to where the
// subgraph node sits), its promoted values written into them, and the wires through its ports joined.
Change ungroup(const GraphDocument& doc, const QString& id);

// ---- flattening and paths ----------------------------------------------------------------------------

// `into` gets doc with every subgraph replaced, recursively, by its inner nodes under path ids, promoted
// values applied, and wires through boundary ports joined end to end. Top-level nodes and wires keep their
// order. Problems of structure are added to `problems` (when given), on the subgraph node's path: a boundary
// port naming a missing inner node or port, a wire to a port the subgraph does not have, an id holding the
// path separator, a promoted param naming a missing node, a block that contains an instance of itself, a
// param set on a subgraph node that is not one of its promoted params (a warning). With a registry, also a
// promoted param that its inner node's type does not have.
void flatten(const GraphDocument& doc, GraphDocument& into, ValidationReport* problems = nullptr,
             const NodeTypeRegistry* registry = nullptr);

// The node at a path ("block1/conv2"), looking inside subgraphs; null when there is none.
const GraphNode* nodeAt(const GraphDocument& doc, const QString& path);
// Sets a param of the node at `path`, rebuilding the subgraphs on the way, so that the node runs with it: a
// subgraph on the way that promotes the param with a value set gets the value too. False when there is no
// such node.
bool setParamAt(GraphDocument& doc, const QString& path, const QString& param, const QJsonValue& value);
// The subgraph with its inner graph replaced by `inner`'s nodes, connections and unknown top-level fields.
SubgraphPtr withInner(const Subgraph& sub, const GraphDocument& inner);
// The inner graph as a document of its own, for the editor to edit in place.
void innerDocument(const Subgraph& sub, GraphDocument& into);

// ---- the block library -------------------------------------------------------------------------------

// A block file is a graph file holding exactly one Subgraph node; the block's name is the file's base name.
struct LibraryBlock {
  QString name, path, hash;
  GraphNode node;
  bool shipped = false;  // one of gpunodes' own blocks (path in shippedLibraryDir()), read-only
};

// <AppDataLocation>/blocks, created when missing.
QString libraryDir();
// The blocks that come with gpunodes (resources/blocks, built into the library as Qt resources).
QString shippedLibraryDir();
// A hash of what the subgraph does (inner graph, ports, promoted params), not of where it came from.
QString contentHash(const Subgraph& sub);
// Reads one block file. Refused with a message naming the file: not a graph file, not exactly one Subgraph
// node, or a block that contains an instance of itself (a block may not be defined by itself).
bool readBlock(const QString& path, LibraryBlock& out, QString* error);
// The shipped blocks, then every block in libraryDir(), each group by name; a user's block of a shipped
// block's name takes its place. Files that cannot be read are skipped and named in *errors.
QList<LibraryBlock> listLibrary(QStringList* errors = nullptr);
// Writes node's subgraph as block `name` (1-64 letters, digits, '_' or '-') into libraryDir(), replacing a
// block of that name (atomically). *saved gets the block as written; instantiate() makes the instance that
// refers to it.
bool saveBlock(const GraphNode& node, const QString& name, LibraryBlock* saved, QString* error);
// A new instance of a block, with id `id` at `pos`.
GraphNode instantiate(const LibraryBlock& block, const QString& id, QPointF pos);
// Whether an instance was made from an older version of its block (the block's file has changed since).
bool outOfDate(const GraphNode& node, const QList<LibraryBlock>& library);
// The instance with the block's current content; promoted values whose param still exists are kept.
GraphNode updated(const GraphNode& instance, const LibraryBlock& block);

}  // namespace subgraph
}  // namespace gn::core
