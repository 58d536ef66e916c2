// The report's text, which the command line and the editor share (gpunodes/core/report_format.h): CSV
// quoting, numbers that read back as the same double, the metrics CSV byte for byte, byte sizes in binary
// units at the unit boundaries, durations and param values.
#include <QJsonArray>
#include <QtTest>
#include <cmath>
#include <limits>

#include "csv_test_util.h"
#include "gpunodes/core/report_format.h"

using namespace gn::core;

class ReportFormatTest : public QObject {
  Q_OBJECT

 private slots:
  void csvFieldsAreQuotedOnlyWhenTheyMustBe() {
    QCOMPARE(csvField("train.loss"), QString("train.loss"));
    QCOMPARE(csvField("train.memory_mb/cuda:0"), QString("train.memory_mb/cuda:0"));
    QCOMPARE(csvField("a,b"), QString("\"a,b\""));
    QCOMPARE(csvField("say \"hi\""), QString("\"say \"\"hi\"\"\""));
    QCOMPARE(csvField("two\nlines"), QString("\"two\nlines\""));
    QCOMPARE(csvField("cr\rhere"), QString("\"cr\rhere\""));
    QCOMPARE(csvField(""), QString(""));
    for (const QString& s : {QString("a,b"), QString("say \"hi\", twice"), QString("\"")})
      QCOMPARE(gn::test::csvCells(csvField(s)), QStringList{s});
  }

  void numbersReadBackAsTheSameDouble() {
    const double values[] = {0.1 + 0.2,
                             1.0 / 3,
                             M_PI,
                             2.449489742783178,
                             -1.5,
                             1e-300,
                             std::numeric_limits<double>::denorm_min(),
                             std::numeric_limits<double>::max(),
                             std::numeric_limits<double>::lowest(),
                             9007199254740994.0,  // 2^53 + 2: beyond the exact integers
                             123456789.123456789};
    for (double v : values) {
      const QString text = numberText(v);
      bool ok = false;
      QCOMPARE(text.toDouble(&ok), v);
      QVERIFY2(ok, qPrintable(text));
      QCOMPARE(std::strtod(text.toLatin1().constData(), nullptr), v);
    }
    // As the report's JSON writes them: integers without exponent, the rest as short as they can be.
    QCOMPARE(numberText(0), QString("0"));
    QCOMPARE(numberText(9), QString("9"));
    QCOMPARE(numberText(100000), QString("100000"));
    QCOMPARE(numberText(-3), QString("-3"));
    QCOMPARE(numberText(9007199254740992.0), QString("9007199254740992"));
    QCOMPARE(numberText(0.1), QString("0.1"));
    QCOMPARE(numberText(0.1 + 0.2), QString("0.30000000000000004"));
    QCOMPARE(numberText(2.1034), QString("2.1034"));
    QCOMPARE(numberText(1e20), QString("1e+20"));
    QCOMPARE(numberText(std::nan("")), QString("nan"));
    QCOMPARE(numberText(std::numeric_limits<double>::infinity()), QString("inf"));
    QCOMPARE(numberText(-std::numeric_limits<double>::infinity()), QString("-inf"));
  }

  void theMetricsCsvByteForByte() {
    QCOMPARE(metricsCsv({}), QByteArray("series,t,value\n"));
    const QJsonObject metrics{
        {"train.loss", QJsonArray{QJsonArray{0.25, 2.1034}, QJsonArray{0.5, 0.1 + 0.2}}},
        {"a,b", QJsonArray{QJsonArray{0, 125000}}},
        {"say \"hi\"", QJsonArray{QJsonArray{1, 1.0 / 3}}},
        {"empty", QJsonArray{}},
    };
    // Series in alphabetical order (the JSON object's), points in the order they came.
    QCOMPARE(metricsCsv(metrics), QByteArray("series,t,value\n"
                                             "\"a,b\",0,125000\n"
                                             "\"say \"\"hi\"\"\",1,0.3333333333333333\n"
                                             "train.loss,0.25,2.1034\n"
                                             "train.loss,0.5,0.30000000000000004\n"));
    // Read back, every point is the one written.
    const QList<QByteArray> lines = metricsCsv(metrics).split('\n');
    QList<QStringList> records;
    for (const QByteArray& line : lines.mid(1))
      if (!line.isEmpty()) records << gn::test::csvCells(QString::fromUtf8(line));
    QCOMPARE(records.size(), 4);
    QCOMPARE(records[1][0], QString("say \"hi\""));
    QCOMPARE(records[1][2].toDouble(), 1.0 / 3);
    QCOMPARE(records[3][2].toDouble(), 0.1 + 0.2);
  }

  void bytesInBinaryUnitsAtTheBoundaries() {
    QCOMPARE(formatBytes(0), QString("0 B"));
    QCOMPARE(formatBytes(1), QString("1 B"));
    QCOMPARE(formatBytes(1023), QString("1023 B"));
    QCOMPARE(formatBytes(1024), QString("1.0 KiB"));
    QCOMPARE(formatBytes(1536), QString("1.5 KiB"));
    QCOMPARE(formatBytes(32000), QString("31.3 KiB"));
    QCOMPARE(formatBytes(1024 * 1024 - 1), QString("1.0 MiB"));  // not "1024.0 KiB"
    QCOMPARE(formatBytes(1024 * 1024), QString("1.0 MiB"));
    QCOMPARE(formatBytes(1.5 * 1024 * 1024), QString("1.5 MiB"));
    QCOMPARE(formatBytes(1024.0 * 1024 * 1024), QString("1.0 GiB"));
    QCOMPARE(formatBytes(3.0 * (1LL << 40)), QString("3.0 TiB"));
    QCOMPARE(formatBytes(double(1LL << 60)), QString("1.0 EiB"));
    QCOMPARE(formatBytes(-2048), QString("-2.0 KiB"));
  }

  void durationsInTheUnitThatSuitsThem() {
    QCOMPARE(formatMs(0.85), QString("850 µs"));
    QCOMPARE(formatMs(4.25), QString("4.25 ms"));
    QCOMPARE(formatMs(12.34), QString("12.3 ms"));
    QCOMPARE(formatMs(1234), QString("1.23 s"));
  }

  void paramValuesAsTheyAreTyped() {
    QCOMPARE(paramValueText("last"), QString("last"));
    QCOMPARE(paramValueText(0.1), QString("0.1"));
    QCOMPARE(paramValueText(64), QString("64"));
    QCOMPARE(paramValueText(true), QString("true"));
    QCOMPARE(paramValueText(QJsonValue()), QString("null"));
    QCOMPARE(paramValueText(QJsonArray{64, 64}), QString("[64,64]"));
  }
};

QTEST_GUILESS_MAIN(ReportFormatTest)
#include "test_report_format.moc"
