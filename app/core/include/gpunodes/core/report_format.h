// Text made from a run's report, in one place for the command line and the editor: the metrics CSV
// (`gpunodes run --metrics` and the editor's File ▸ Export ▸ Metrics CSV write the same bytes), CSV fields,
// numbers, byte sizes, durations and param values. QtCore only.
#pragma once
#include <QByteArray>
#include <QJsonObject>
#include <QJsonValue>
#include <QString>

namespace gn::core {

// One CSV field: `text` as it is, or, when it holds a comma, a double quote, a carriage return or a newline,
// in double quotes with each quote doubled (RFC 4180): `a,b` -> `"a,b"`, `say "hi"` -> `"say ""hi"""`.
QString csvField(const QString& text);

// The shortest text that reads back (QString::toDouble, strtod, Python's float) as exactly `value`, written
// as the report's JSON writes it: integral values below 2^53 without exponent or point ("100000", "-3"),
// others in %g style with as many digits as needed ("0.1", "2.449489742783178", "1e-05", "1e+20");
// "nan", "inf" and "-inf" for the non-finite values a diverging training run reports.
QString numberText(double value);

// The report's `metrics` object (`{"series": [[t, value], ...]}`) as CSV: the header `series,t,value`, then
// one line per point, series in the object's (alphabetical) order and the points of one series in the
// order they came; the name through csvField, t and value through numberText; every line ends in '\n'.
// With no metrics, only the header. UTF-8.
QByteArray metricsCsv(const QJsonObject& metrics);

// A byte count in binary units, as the runtime's out-of-memory messages use them: "1023 B", "1.0 KiB",
// "1.5 MiB", "2.0 GiB", up to EiB; one decimal above bytes. The unit is the largest whose one-decimal value
// stays below 1024 ("1.0 MiB" for 1048575 bytes, never "1024.0 KiB"). Negative counts keep their sign.
QString formatBytes(double bytes);

// A duration given in milliseconds, in the unit that suits it: "850 µs" below 1 ms, "4.25 ms" below 10 ms,
// "12.3 ms" below 1 s, "1.23 s" from 1 s on.
QString formatMs(double ms);

// A param value as a user types it (--set, --grid, a run's settings): a string as it is, anything else
// as compact JSON, numbers as numberText writes them ("0.1", "64", "true", "[64,64]").
QString paramValueText(const QJsonValue& value);

}  // namespace gn::core
