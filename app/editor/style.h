// Colours and formatting shared by the canvas, the plots and the timeline, so a port type or a node has the
// same colour everywhere.
#pragma once
#include <QColor>
#include <QJsonValue>
#include <QString>

#include "gpunodes/core/node_type.h"
#include "gpunodes/core/report_format.h"

namespace gn::editor::style {

QColor portColor(core::PortType t);
QColor categoryColor(const QString& category);
// A stable colour per node id (timeline spans), spread over the hue circle.
QColor nodeColor(const QString& nodeId);
// A stable colour per series index (plots).
QColor seriesColor(int index);
QColor statusColor(const QString& status);

// The canvas's colours, named for what they paint. Port, category and status colours come from the
// functions above; these are the rest: the node's body and its text, the marks for selection and problems,
// the facts band, the grid.
extern const QColor kCanvasBackground, kGridMinor, kGridMajor;
extern const QColor kNodeBody, kNodeOutline, kNodeText, kNodeDimText, kNodeIdText;
// The header of a node whose type is not loaded or that is muted, and the collapse toggle drawn on a header.
extern const QColor kNodeHeaderInactive, kNodeToggle;
extern const QColor kBadgeText, kDimmedPortLabel, kProgressTrack;
extern const QColor kError, kWarning, kSelection;
extern const QColor kErrorStrip, kErrorStripText;
// Facts (shapes, parameter counts) in a light tint of the Layer wire colour, on a band darker than the body.
extern const QColor kFactText, kFactBand;
// Ports that cannot take the wire being dragged keep this much of their colour's alpha.
inline constexpr int kDimmedPortAlpha = 45;

// Durations and byte sizes as the command line writes them too (gpunodes/core/report_format.h).
using core::formatBytes;
using core::formatMs;
// A param value as the node summary shows it: shapes as 4000×4000, bools as on/off.
QString formatValue(const QJsonValue& v);
// A score as a title or a preview shows it (an MSE, a perplexity): three significant digits (0.0412, 3.21,
// 12.3), whole numbers from 100 on (1235, not 1.23e+03), "–" for a value that is not finite.
QString formatScore(double v);

}  // namespace gn::editor::style
