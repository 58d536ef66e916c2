// What a graph may touch: the files and folders that its params name.
//
// A param spec says when its value is a path and how the node uses it (ParamSpec::file). Before a run the
// host resolves every such value against the graph file's folder, so that a relative path means the same
// file wherever gpunodes was started, and checks it: by default a graph writes only inside its own folder
// and that folder's sub-folders. Graph files are shared like documents; opening a stranger's one and
// pressing Run must not be able to replace ~/.bashrc or a thesis. Because the spec carries the facts,
// neither the command line nor the editor needs to know a node type to decide or to ask the user.
#pragma once
#include <QList>
#include <QString>
#include <QStringList>

#include "gpunodes/core/node_type.h"

namespace gn::core {

class GraphDocument;
class NodeTypeRegistry;
class ValidationReport;

QString fileUseName(FileUse use);  // "reads", "writes", "writes into"

// Where a run may write. With no folder, paths are used as they are and nothing is checked: a program that
// runs documents it made itself through the API. The command line and the editor always give one.
struct FilePolicy {
  QString folder;               // the graph file's folder (absolute): relative paths resolve here, and
                                // writes are allowed here and below
  QStringList allowWrite;       // further files or folders (everything below them too) a run may write,
                                // each absolute and resolved (resolvePath)
  bool replaceForeign = false;  // writes may replace existing files that are not gpunodes' own formats
  bool enabled() const { return !folder.isEmpty(); }
};

// One file param of one node, as the run would use it.
struct FileTouch {
  QString node;          // the node's id; in a flattened graph a path into subgraphs ("block1/save")
  QString param;         // the param's name
  FileUse use = FileUse::None;
  QString resolved;      // absolute and clean, with links followed as far as the path exists
  bool outside = false;  // not inside the policy's folder (reads there are allowed, and listed)
  bool foreign = false;  // a write that would replace an existing file that is not gpunodes' own
  QString problem;       // why the run is refused because of this touch; empty when it is allowed
};

// The folder a graph's relative paths resolve against: its file's folder, or the working directory for a
// graph that has not been saved. Absolute, links followed.
QString graphFolder(const QString& graphFile);

// `path` made absolute against `folder` and cleaned, following links in the part that exists (so a link
// inside the folder that points out resolves to where it points). Empty for an empty path.
QString resolvePath(const QString& folder, const QString& path);

// Whether the file at `path` is one of gpunodes' own formats, which a run may replace: a GNPARAMS
// parameter file, a safetensors file (parameters and checkpoints) or an ONNX model whose producer is
// gpunodes. Reads only the file's first bytes.
bool isGpunodesFile(const QString& path);

// Every file param with a non-empty value of every node of `doc` (the graph a run sees: run_graph.h),
// resolved and judged under `policy`, in document order. Params of node types no plugin provides are not
// known, so not listed (such a graph cannot run).
QList<FileTouch> filesTouched(const GraphDocument& doc, const NodeTypeRegistry& registry,
                              const FilePolicy& policy);

// Rewrites every file param of `doc` to its resolved path against `folder`, so that the nodes use exactly
// the path that was checked. Nothing happens for an empty folder.
void resolveFileParams(GraphDocument& doc, const NodeTypeRegistry& registry, const QString& folder);

// Adds an error to `report` for every touch with a problem, on the node and its param ("params.path"),
// naming the resolved path and what would allow it.
void checkFileAccess(const GraphDocument& doc, const NodeTypeRegistry& registry, const FilePolicy& policy,
                     ValidationReport& report);

}  // namespace gn::core
