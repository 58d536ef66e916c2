// The one JSON serializer: files, undo snapshots and the clipboard all go through it.
// Format "gpunodes-graph", version 1 (see docs/file-format.md). Unknown fields survive a load and save; the same
// document always saves to the same bytes.
#pragma once
#include <QByteArray>
#include <QJsonObject>
#include <QPointF>
#include <QString>
#include <QStringList>

namespace gn::core {

class GraphDocument;

namespace serializer {

constexpr int kFormatVersion = 1;
// Graph files beyond this size are refused before they are read or parsed.
constexpr qint64 kMaxFileBytes = 32LL * 1024 * 1024;

QJsonObject toJson(const GraphDocument& doc);
QByteArray save(const GraphDocument& doc);
// On failure `into` is left untouched and *error says what was wrong and where
// ("line 3, column 14: ...", "nodes[2].params: must be an object", "version 7 is newer than this build (1)").
bool fromJson(const QJsonObject& json, GraphDocument& into, QString* error);
bool load(const QByteArray& bytes, GraphDocument& into, QString* error);
// Error messages start with the file name.
bool loadFile(const QString& path, GraphDocument& into, QString* error);
// Atomic (QSaveFile): a failed save leaves the old file as it was.
bool saveFile(const QString& path, const GraphDocument& doc, QString* error);

// The clipboard: the given nodes and the connections among them, as a graph document's JSON.
QByteArray copyNodes(const GraphDocument& doc, const QStringList& ids);
// Adds the clipboard's nodes under fresh ids, offset by `offset`; returns the new ids (empty on error).
QStringList pasteNodes(GraphDocument& doc, const QByteArray& clipboard, QPointF offset, QString* error);

}  // namespace serializer
}  // namespace gn::core
