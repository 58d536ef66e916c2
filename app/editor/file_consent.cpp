#include "file_consent.h"

#include <QCryptographicHash>
#include <QFileInfo>
#include <QSettings>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/run_graph.h"

namespace gn::editor {
namespace {

// What consent lifts: a write outside the folder, or replacing a file that is not gpunodes' own. Anything
// else wrong with a path stays an error.
bool needsConsent(const core::FileTouch& t) {
  return !t.problem.isEmpty() && (t.foreign || (t.outside && t.use != core::FileUse::Read));
}

QString line(const core::FileTouch& t) {
  QString text = QString("%1.%2 %3 %4").arg(t.node, t.param, core::fileUseName(t.use), t.resolved);
  if (t.foreign) text += "  (replaces a file that gpunodes did not write)";
  return text;
}

// What a run of the graph touches, the policy that consent to all of it gives, and whether any consent is
// needed. The key that remembers the consent covers the file and every path shown, so a changed path asks
// again.
struct Consent {
  core::FilePolicy policy;
  QList<core::FileTouch> shown;  // every touch outside the folder, and every foreign file replaced
  bool needed = false;
  QString key;
};

Consent consentFor(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry, const QString& file,
                   const QString& folder) {
  Consent c;
  c.policy.folder = file.isEmpty() ? core::resolvePath(folder, folder) : core::graphFolder(file);
  const core::RunGraph run = core::runGraph(doc, registry, {}, c.policy.folder);
  for (const core::FileTouch& t : core::filesTouched(run.graph(), registry, c.policy)) {
    if (t.outside || t.foreign) c.shown.append(t);
    if (!needsConsent(t)) continue;
    c.needed = true;
    if (t.outside && t.use != core::FileUse::Read) c.policy.allowWrite.append(t.resolved);
    if (t.foreign) c.policy.replaceForeign = true;
  }
  QCryptographicHash hash(QCryptographicHash::Sha256);
  hash.addData((file.isEmpty() ? QString("(no file)") : QFileInfo(file).absoluteFilePath()).toUtf8());
  for (const core::FileTouch& t : c.shown) hash.addData(('\n' + line(t)).toUtf8());
  c.key = "trust/" + QString::fromLatin1(hash.result().toHex());
  return c;
}

}  // namespace

core::FilePolicy FileConsent::remembered(const core::GraphDocument& doc, const core::NodeTypeRegistry& registry,
                                         const QString& file, const QString& folder) {
  const Consent c = consentFor(doc, registry, file, folder);
  if (c.needed && QSettings().value(c.key).toBool()) return c.policy;
  return core::FilePolicy{c.policy.folder, {}, false};
}

std::optional<core::FilePolicy> FileConsent::decide(const core::GraphDocument& doc,
                                                    const core::NodeTypeRegistry& registry,
                                                    const QString& file, const QString& folder,
                                                    const Ask& ask) {
  const Consent c = consentFor(doc, registry, file, folder);
  if (!c.needed) return c.policy;
  QSettings settings;
  if (settings.value(c.key).toBool()) return c.policy;
  QStringList lines;
  for (const core::FileTouch& t : c.shown) lines.append(line(t));
  constexpr int kListed = 12;
  const QString text =
      QString("%1 reaches outside its folder %2. A graph from someone else could replace any file you can "
              "write, so gpunodes asks before it runs one that writes elsewhere.\n\nIt will:\n%3%4\n\n"
              "Allow this and run? The answer is kept for this file until it reaches somewhere else.")
          .arg(file.isEmpty() ? QString("This graph") : QFileInfo(file).fileName(), c.policy.folder,
               lines.mid(0, kListed).join('\n'),
               lines.size() > kListed ? QString("\n… and %1 more").arg(lines.size() - kListed) : QString());
  if (!ask("Allow this graph to write outside its folder?", text)) return std::nullopt;
  settings.setValue(c.key, true);
  return c.policy;
}

}  // namespace gn::editor
