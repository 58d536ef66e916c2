// Before the editor runs a graph: what it will touch outside its own folder, and the user's consent to the
// writes that `gpunodes run` would refuse without --allow-write or --force (gpunodes/core/file_access.h).
// Graph files are shared like documents, so the first run of one that writes elsewhere asks, listing every
// path outside the folder that it reads or writes, as Blender asks before it runs a file's scripts. The
// answer is remembered per file and per set of such paths: the graph asks again only when someone changes
// where it reaches.
#pragma once
#include <QList>
#include <QString>
#include <functional>
#include <optional>

#include "gpunodes/core/file_access.h"

namespace gn::core {
class GraphDocument;
class NodeTypeRegistry;
}  // namespace gn::core

namespace gn::editor {

class FileConsent {
 public:
  // Asks the user the question (title, text) and returns whether the run may go ahead. The main window asks
  // through its prompt handler, so tests answer without a modal dialog.
  using Ask = std::function<bool(const QString& title, const QString& text)>;

  // The policy for a graph: its folder (`file`'s, or `folder` for a graph without a file of its own, such
  // as an opened example), with the consent the user gave before to exactly what it touches now, if any.
  // The editor validates with it, so a graph shows on its nodes what a run would refuse or ask about.
  static core::FilePolicy remembered(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
                                     const QString& file, const QString& folder);

  // The policy a run of `doc` goes ahead with: as remembered(), and when the graph writes outside its
  // folder or replaces a file that is not gpunodes' own without consent remembered for that, the user's
  // answer through `ask`, listing every path outside the folder that it reads or writes; a yes is
  // remembered. nullopt when the user declined. Problems that no consent lifts (a device file, a folder
  // where a file is meant) are left for validation to report.
  static std::optional<core::FilePolicy> decide(const core::GraphDocument& doc,
                                                const core::NodeTypeRegistry& registry, const QString& file,
                                                const QString& folder, const Ask& ask);
};

}  // namespace gn::editor
