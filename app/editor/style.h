// Colours and formatting shared by the canvas, the plots and the timeline, so a port type or a node has the
// same colour everywhere.
#pragma once
#include <QColor>
#include <QJsonValue>
#include <QString>

#include "gpunodes/core/node_type.h"

namespace gn::editor::style {

QColor portColor(core::PortType t);
QColor categoryColor(const QString& category);
// A stable colour per node id (timeline spans), spread over the hue circle.
QColor nodeColor(const QString& nodeId);
// A stable colour per series index (plots).
QColor seriesColor(int index);
QColor statusColor(const QString& status);

QString formatMs(double ms);
QString formatBytes(double bytes);
// A param value as the node summary shows it: shapes as 4000×4000, bools as on/off.
QString formatValue(const QJsonValue& v);

}  // namespace gn::editor::style
