// Reading back the CSV files gpunodes writes, as a spreadsheet reads them, for the suites that check them.
#pragma once
#include <QString>
#include <QStringList>

namespace gn::test {

// One CSV record: fields split at commas outside quotes, "" inside quotes read as one quote.
inline QStringList csvCells(const QString& line) {
  QStringList cells{QString()};
  bool quoted = false;
  for (qsizetype i = 0; i < line.size(); ++i) {
    const QChar c = line[i];
    if (quoted && c == u'"' && i + 1 < line.size() && line[i + 1] == u'"') {
      cells.last() += c;
      ++i;
    } else if (c == u'"') {
      quoted = !quoted;
    } else if (c == u',' && !quoted) {
      cells.append(QString());
    } else {
      cells.last() += c;
    }
  }
  return cells;
}

}  // namespace gn::test
