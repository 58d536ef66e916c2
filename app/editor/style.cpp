#include "style.h"

#include <QJsonArray>
#include <QStringList>
#include <cmath>

namespace gn::editor::style {

const QColor kCanvasBackground(0x1b, 0x1d, 0x21), kGridMinor(0x23, 0x26, 0x2b), kGridMajor(0x2d, 0x31, 0x37);
const QColor kNodeBody(0x2c, 0x2f, 0x35, 242), kNodeOutline(0x15, 0x16, 0x18), kNodeText(0xe8, 0xea, 0xee);
const QColor kNodeDimText(0x9a, 0xa3, 0xad), kNodeIdText(255, 255, 255, 150);
const QColor kNodeHeaderInactive(0x55, 0x55, 0x55), kNodeToggle(255, 255, 255, 170);
const QColor kBadgeText(0x10, 0x10, 0x10), kDimmedPortLabel(255, 255, 255, 60),
    kProgressTrack(0x44, 0x48, 0x4f);
const QColor kError(0xe5, 0x48, 0x48), kWarning(0xe6, 0xb4, 0x3c), kSelection(0xff, 0xd1, 0x66);
const QColor kErrorStrip(0x6b, 0x1f, 0x22), kErrorStripText(0xff, 0xc9, 0xc9);
const QColor kFactText(0xf4, 0xd2, 0xea), kFactBand(0x1f, 0x21, 0x26);

QColor portColor(core::PortType t) {
  switch (t) {
    case core::PortType::Device:
      return QColor(0x4f, 0xa3, 0xff);
    case core::PortType::Devices:
      return QColor(0x9a, 0x8c, 0xff);
    case core::PortType::Tensor:
      return QColor(0x5f, 0xd3, 0x6a);
    case core::PortType::Model:
      return QColor(0xff, 0x8c, 0x42);
    case core::PortType::Dataset:
      return QColor(0xe6, 0xc8, 0x4f);
    case core::PortType::Scalar:
      return QColor(0xb8, 0xbc, 0xc4);
    case core::PortType::Layer:
      return QColor(0xe8, 0x6a, 0xc0);
  }
  return Qt::gray;
}

QColor categoryColor(const QString& category) {
  const QString c = category.toLower();
  // Known categories get hand-picked colours; any other (a third-party plugin's) a stable hashed one.
  // Layers: a deep magenta, the hue the Layer wire carries, apart from Models' crimson and Sync's violet.
  if (c.contains("layer")) return QColor(0x9c, 0x3a, 0x86);
  if (c.contains("device")) return QColor(0x2f, 0x6d, 0xb5);
  if (c.contains("tensor") || c.contains("data")) return QColor(0x2f, 0x8f, 0x4e);
  if (c.contains("copy") || c.contains("transfer") || c.contains("memory")) return QColor(0x1f, 0x8a, 0x8a);
  if (c.contains("compute") || c.contains("math") || c.contains("op")) return QColor(0xb0, 0x62, 0x1e);
  if (c.contains("sync") || c.contains("util") || c.contains("debug") || c.contains("inspect"))
    return QColor(0x7a, 0x4f, 0xa8);
  if (c.contains("train") || c.contains("model")) return QColor(0xa8, 0x36, 0x4a);
  if (c == "missing") return QColor(0x55, 0x55, 0x55);
  const uint h = qHash(category) % 360;
  return QColor::fromHsv(int(h), 140, 170);
}

QColor nodeColor(const QString& nodeId) {
  // Golden-ratio hue steps from a hash keep neighbouring ids apart.
  const double h = std::fmod(double(qHash(nodeId) % 1000) * 0.618033988749895, 1.0);
  return QColor::fromHsvF(float(h), 0.55f, 0.92f);
}

QColor seriesColor(int index) {
  static const QColor colors[] = {
      QColor(0x4f, 0xa3, 0xff), QColor(0xff, 0x8c, 0x42), QColor(0x5f, 0xd3, 0x6a), QColor(0xe0, 0x5f, 0x8a),
      QColor(0xe6, 0xc8, 0x4f), QColor(0x9a, 0x8c, 0xff), QColor(0x4f, 0xd6, 0xd0), QColor(0xc8, 0x9b, 0x6d)};
  return colors[index % 8];
}

QColor statusColor(const QString& status) {
  if (status == "running") return QColor(0xff, 0xa5, 0x2e);
  if (status == "queued") return QColor(0x6c, 0x86, 0xa8);
  if (status == "done" || status == "ok") return QColor(0x3f, 0xb9, 0x50);
  if (status == "error" || status == "failed") return QColor(0xe5, 0x48, 0x48);
  if (status == "cancelled") return QColor(0x9a, 0x9a, 0x9a);
  return QColor(0x70, 0x74, 0x7a);
}

QString formatValue(const QJsonValue& v) {
  switch (v.type()) {
    case QJsonValue::Bool:
      return v.toBool() ? "on" : "off";
    case QJsonValue::Double: {
      const double d = v.toDouble();
      if (d == std::floor(d) && std::abs(d) < 1e15) return QString::number(qint64(d));
      return QString::number(d, 'g', 4);
    }
    case QJsonValue::String:
      return v.toString();
    case QJsonValue::Array: {
      QStringList parts;
      for (const QJsonValue& e : v.toArray()) parts << formatValue(e);
      return parts.join(QChar(0x00D7));
    }
    case QJsonValue::Object:
      return "{…}";
    default:
      return "–";
  }
}

QString formatScore(double v) {
  if (!std::isfinite(v)) return QString("–");
  return std::abs(v) >= 100 ? QString::number(v, 'f', 0) : QString::number(v, 'g', 3);
}

}  // namespace gn::editor::style
