// The one JSON serializer: files, undo snapshots and the clipboard all go through it.
// Format "gpunodes-graph", versions 1 and 2 (see docs/file-format.md). Unknown fields survive a load and save; the same
// document always saves to the same bytes.
#pragma once
#include <QByteArray>
#include <QJsonObject>
#include <QJsonValue>
#include <QPointF>
#include <QString>
#include <QStringList>

namespace gn::core {

class GraphDocument;

namespace serializer {

// The newest format version this build reads. Version 2 added subgraphs; a file is written as version 2 only
// when it holds one, so graphs without subgraphs stay readable by version-1 builds.
constexpr int kFormatVersion = 2;
constexpr int kFirstFormatVersion = 1;
constexpr int kSubgraphFormatVersion = 2;
// Graph files beyond this size are refused before they are read or parsed.
constexpr qint64 kMaxFileBytes = 32LL * 1024 * 1024;

// Why a file's "version" cannot be read by a build whose newest version is `newest`; empty when it can
// ("version 3 is newer than this build (2); update gpunodes to open it").
QString versionProblem(const QJsonValue& version, int newest = kFormatVersion);

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
