#include "gpunodes/core/file_access.h"

#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QJsonObject>
#include <cstring>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/validation.h"

namespace gn::core {
namespace {

bool inside(const QString& path, const QString& folder) {
  if (folder.isEmpty()) return false;
  if (path == folder) return true;
  return path.startsWith(folder.endsWith(u'/') ? folder : folder + u'/');
}

// What is on the disk at an existing path, in the words of a message.
enum class Kind { Missing, File, Folder, Other };
Kind kindOf(const QString& resolved) {
  const QFileInfo info(resolved);
  if (!info.exists()) return Kind::Missing;
  if (info.isDir()) return Kind::Folder;
  return info.isFile() ? Kind::File : Kind::Other;  // a device, pipe or socket
}

// Why `t` may not go ahead (empty: it may). Sets *foreign when it is a write that would replace an existing
// file that is not gpunodes' own, whether or not the policy allows that.
QString problemOf(const FileTouch& t, const FilePolicy& policy, bool* foreign) {
  const Kind kind = kindOf(t.resolved);
  *foreign = t.use == FileUse::WriteFile && kind == Kind::File && !isGpunodesFile(t.resolved);
  if (t.use == FileUse::Read)
    return kind == Kind::Other ? QStringLiteral("%1 is not a file or a folder (a device, pipe or socket)")
                                     .arg(t.resolved)
                               : QString();
  const QString replaces =
      QStringLiteral("%1 exists and is not a gpunodes file (GNPARAMS, safetensors, or ONNX written by gpunodes)")
          .arg(t.resolved);
  bool allowed = inside(t.resolved, policy.folder);
  for (const QString& a : policy.allowWrite) allowed = allowed || inside(t.resolved, a);
  if (!allowed)
    return QStringLiteral(
               "writes %1, outside the graph's folder %2; a graph writes only inside its own folder unless "
               "the user allows the place (gpunodes run --allow-write DIR, or the editor's confirmation)%3")
        .arg(t.resolved, policy.folder,
             *foreign ? QStringLiteral("; besides, ") + replaces + QStringLiteral(" (--force)") : QString());
  if (kind == Kind::Other)
    return QStringLiteral("%1 is not a regular file (a device, pipe or socket); refusing to write to it")
        .arg(t.resolved);
  if (t.use == FileUse::WriteFolder)
    return kind == Kind::File ? QStringLiteral("%1 is a file, not a folder").arg(t.resolved) : QString();
  if (kind == Kind::Folder) return QStringLiteral("%1 is a folder, not a file").arg(t.resolved);
  if (*foreign && !policy.replaceForeign)
    return replaces + QStringLiteral(
                          "; refusing to replace it (gpunodes run --force, or the editor's confirmation, "
                          "allows it)");
  return {};
}

template <typename Visit>
void forEachFileParam(const GraphDocument& doc, const NodeTypeRegistry& registry, Visit visit) {
  for (const GraphNode& n : doc.nodes()) {
    const NodeTypePtr type = registry.find(n.type);
    if (!type) continue;
    const QJsonObject params = withDefaults(type->spec(), n.params);
    for (const ParamSpec& p : type->spec().params) {
      if (p.file == FileUse::None) continue;
      const QString value = params.value(p.name).toString().trimmed();
      if (!value.isEmpty()) visit(n, p, value);
    }
  }
}

}  // namespace

QString fileUseName(FileUse use) {
  switch (use) {
    case FileUse::None: return QStringLiteral("none");
    case FileUse::Read: return QStringLiteral("reads");
    case FileUse::WriteFile: return QStringLiteral("writes");
    case FileUse::WriteFolder: return QStringLiteral("writes into");
  }
  return {};
}

QString graphFolder(const QString& graphFile) {
  const QString folder =
      graphFile.isEmpty() ? QDir::currentPath() : QFileInfo(graphFile).absoluteDir().absolutePath();
  return resolvePath(folder, folder);
}

QString resolvePath(const QString& folder, const QString& path) {
  if (path.isEmpty()) return {};
  QString absolute = QDir::cleanPath(QDir::isAbsolutePath(path) ? path : folder + u'/' + path);
  // Follow links in the longest part that exists; what does not exist yet cannot be a link. cleanPath
  // has removed "..", so the rest only descends from the part that was resolved.
  QString existing = absolute, rest;
  while (!QFileInfo::exists(existing) && existing != QStringLiteral("/") && !existing.isEmpty()) {
    const int slash = existing.lastIndexOf(u'/');
    rest = existing.mid(slash) + rest;
    existing = slash <= 0 ? QStringLiteral("/") : existing.left(slash);
  }
  const QString canonical = QFileInfo(existing).canonicalFilePath();
  if (canonical.isEmpty()) return absolute;
  return QDir::cleanPath(canonical + rest);
}

bool isGpunodesFile(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return false;
  const QByteArray head = f.read(64);
  const qint64 size = f.size();
  if (head.startsWith("GNPARAMS")) return true;
  // safetensors: an 8-byte little-endian header length, then that many bytes of JSON.
  if (head.size() >= 9 && head[8] == '{') {
    quint64 n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | quint8(head[i]);
    if (n >= 2 && n <= quint64(size) - 8) return true;
  }
  // ONNX: a ModelProto's fields are written in number order, so ir_version (1, a varint) comes first and
  // producer_name (2, a string) next; gpunodes writes "gpunodes" there.
  if (head.size() > 2 && quint8(head[0]) == 0x08) {
    int i = 1;
    while (i < head.size() && (quint8(head[i]) & 0x80)) ++i;
    ++i;
    const QByteArray producer("gpunodes");
    return i + 2 + producer.size() <= head.size() && quint8(head[i]) == 0x12 &&
           quint8(head[i + 1]) == producer.size() && head.mid(i + 2, producer.size()) == producer;
  }
  return false;
}

QList<FileTouch> filesTouched(const GraphDocument& doc, const NodeTypeRegistry& registry,
                              const FilePolicy& policy) {
  QList<FileTouch> out;
  const QString folder = policy.enabled() ? resolvePath(policy.folder, policy.folder) : QDir::currentPath();
  FilePolicy resolved = policy;
  resolved.folder = folder;
  forEachFileParam(doc, registry, [&](const GraphNode& n, const ParamSpec& p, const QString& value) {
    FileTouch t;
    t.node = n.id;
    t.param = p.name;
    t.use = p.file;
    t.resolved = resolvePath(folder, value);
    t.outside = !inside(t.resolved, folder);
    if (policy.enabled()) t.problem = problemOf(t, resolved, &t.foreign);
    out.append(t);
  });
  return out;
}

void resolveFileParams(GraphDocument& doc, const NodeTypeRegistry& registry, const QString& folder) {
  if (folder.isEmpty()) return;
  QList<QPair<QString, QJsonObject>> changed;
  forEachFileParam(doc, registry, [&](const GraphNode& n, const ParamSpec& p, const QString& value) {
    const QString resolved = resolvePath(folder, value);
    if (resolved == value) return;
    if (changed.isEmpty() || changed.last().first != n.id) changed.append({n.id, n.params});
    changed.last().second.insert(p.name, resolved);
  });
  for (const auto& [id, params] : changed) doc.setParams(id, params);
}

void checkFileAccess(const GraphDocument& doc, const NodeTypeRegistry& registry, const FilePolicy& policy,
                     ValidationReport& report) {
  if (!policy.enabled()) return;
  for (const FileTouch& t : filesTouched(doc, registry, policy))
    if (!t.problem.isEmpty()) report.error(t.node, QStringLiteral("params.") + t.param, t.problem);
}

}  // namespace gn::core
