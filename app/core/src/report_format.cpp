#include "gpunodes/core/report_format.h"

#include <QJsonArray>
#include <QJsonDocument>
#include <QLocale>
#include <cmath>
#include <iterator>

namespace gn::core {

QString csvField(const QString& text) {
  if (!text.contains(u',') && !text.contains(u'"') && !text.contains(u'\r') && !text.contains(u'\n'))
    return text;
  QString quoted = text;
  quoted.replace(u'"', QStringLiteral("\"\""));
  return u'"' + quoted + u'"';
}

QString numberText(double value) {
  if (!std::isfinite(value)) return QString::number(value);  // "nan", "inf", "-inf"
  // Integers as integers, as QJsonDocument writes them (up to 2^53, where doubles stop being exact
  // integers): "100000", not the shortest "1e+05".
  constexpr double kExactIntegers = 9007199254740992.0;  // 2^53
  if (value == std::trunc(value) && std::abs(value) <= kExactIntegers) return QString::number(qint64(value));
  return QString::number(value, 'g', QLocale::FloatingPointShortest);
}

QByteArray metricsCsv(const QJsonObject& metrics) {
  QByteArray csv = "series,t,value\n";
  for (auto it = metrics.begin(); it != metrics.end(); ++it) {
    const QByteArray series = csvField(it.key()).toUtf8();
    for (const QJsonValue& sample : it.value().toArray()) {
      const QJsonArray tv = sample.toArray();
      csv += series + ',' + numberText(tv.at(0).toDouble()).toLatin1() + ',' +
             numberText(tv.at(1).toDouble()).toLatin1() + '\n';
    }
  }
  return csv;
}

QString formatBytes(double bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  constexpr int kLargest = int(std::size(kUnits)) - 1;
  int unit = 0;
  // Move up while the value would print as 1024 or more (bytes have no decimal, the other units one):
  // 1048575 bytes is 1023.999 KiB, which would read "1024.0 KiB".
  while (unit < kLargest && std::abs(bytes) >= (unit == 0 ? 1023.5 : 1023.95)) {
    bytes /= 1024;
    ++unit;
  }
  return QString::number(bytes, 'f', unit == 0 ? 0 : 1) + u' ' + QLatin1String(kUnits[unit]);
}

QString formatMs(double ms) {
  if (ms < 1) return QString::number(ms * 1000.0, 'f', 0) + QStringLiteral(" µs");
  if (ms < 1000) return QString::number(ms, 'f', ms < 10 ? 2 : 1) + QStringLiteral(" ms");
  return QString::number(ms / 1000.0, 'f', 2) + QStringLiteral(" s");
}

QString paramValueText(const QJsonValue& value) {
  if (value.isString()) return value.toString();
  if (value.isDouble()) return numberText(value.toDouble());
  // Booleans, null, shapes and lists: wrapped in an array because QJsonDocument writes only arrays and
  // objects, then unwrapped.
  return QString::fromUtf8(QJsonDocument(QJsonArray{value}).toJson(QJsonDocument::Compact)).mid(1).chopped(1);
}

}  // namespace gn::core
