// The sweep's plots (GUI builds only): QCustomPlot drawn into a pixmap, never shown.
#include <QBuffer>
#include <QMap>
#include <QPixmap>
#include <QSaveFile>
#include <algorithm>
#include <cmath>

#include "cli/sweep.h"
#include "gpunodes/core/report_format.h"
#include "qcustomplot.h"

namespace gn::cli {

namespace {

constexpr int kWidth = 800, kHeight = 500;

// matplotlib's tab10: distinct on white, and what readers of sweep plots are used to.
QColor lineColor(int i) {
  static const QRgb colors[] = {0x1f77b4, 0xff7f0e, 0x2ca02c, 0xd62728, 0x9467bd,
                                0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};
  return QColor::fromRgb(colors[i % 10]);
}

QCPRange padded(double lo, double hi, bool log) {
  if (log) return {lo / 1.5, hi * 1.5};
  const double pad = hi > lo ? (hi - lo) * 0.06 : std::max(std::abs(lo) * 0.1, 1.0);
  return {lo - pad, hi + pad};
}

}  // namespace

bool sweepCanPlot() {
  return true;
}

QString writeSweepPlot(const QString& path, const QString& metric, const QList<SweepAxis>& axes,
                       const QList<SweepPlotPoint>& points) {
  if (axes.isEmpty() || points.isEmpty()) return QStringLiteral("nothing to plot");
  const SweepAxis& x = axes.first();
  const bool numeric =
      std::all_of(x.values.begin(), x.values.end(), [](const QJsonValue& v) { return v.isDouble(); });
  double xMin = 0, xMax = 0;
  if (numeric) {
    const auto [lo, hi] = std::minmax_element(
        x.values.begin(), x.values.end(),
        [](const QJsonValue& a, const QJsonValue& b) { return a.toDouble() < b.toDouble(); });
    xMin = lo->toDouble();
    xMax = hi->toDouble();
  }
  // A learning rate swept over decades is read on a log axis; a linear one would crowd all but the last.
  const bool logX = numeric && xMin > 0 && xMax / xMin >= 100;
  auto xOf = [&](int index) { return numeric ? x.values[index].toDouble() : double(index + 1); };

  QCustomPlot plot;
  plot.resize(kWidth, kHeight);
  plot.setBackground(Qt::white);
  plot.plotLayout()->insertRow(0);
  plot.plotLayout()->addElement(
      0, 0,
      new QCPTextElement(&plot, QStringLiteral("%1 against %2").arg(metric, x.name), QFont("sans", 12)));
  plot.xAxis->setLabel(x.name);
  plot.yAxis->setLabel(metric);
  if (logX) {
    plot.xAxis->setScaleType(QCPAxis::stLogarithmic);
    plot.xAxis->setTicker(QSharedPointer<QCPAxisTickerLog>(new QCPAxisTickerLog));
  } else if (!numeric) {
    QSharedPointer<QCPAxisTickerText> ticker(new QCPAxisTickerText);
    for (int i = 0; i < x.values.size(); ++i) ticker->addTick(i + 1, core::paramValueText(x.values[i]));
    plot.xAxis->setTicker(ticker);
  }

  // One line per combination of the other axes, in grid order; its points in x order.
  QMap<QList<int>, QList<SweepPlotPoint>> lines;
  for (const SweepPlotPoint& p : points) lines[p.at.mid(1)].append(p);
  double yMin = points.first().value, yMax = yMin;
  int n = 0;
  for (auto it = lines.begin(); it != lines.end(); ++it, ++n) {
    QList<SweepPlotPoint> line = it.value();
    std::sort(line.begin(), line.end(),
              [&](const SweepPlotPoint& a, const SweepPlotPoint& b) { return xOf(a.at[0]) < xOf(b.at[0]); });
    QVector<double> xs, ys;
    for (const SweepPlotPoint& p : line) {
      xs.append(xOf(p.at[0]));
      ys.append(p.value);
      yMin = std::min(yMin, p.value);
      yMax = std::max(yMax, p.value);
    }
    QCPGraph* graph = plot.addGraph();
    graph->setData(xs, ys, true);
    graph->setPen(QPen(lineColor(n), 2));
    graph->setScatterStyle(QCPScatterStyle(QCPScatterStyle::ssCircle, lineColor(n), Qt::white, 7));
    QStringList name;
    for (qsizetype k = 1; k < axes.size(); ++k)
      name.append(axes[k].name + u'=' + core::paramValueText(axes[k].values[it.key()[k - 1]]));
    graph->setName(name.join(QStringLiteral(", ")));
  }
  if (axes.size() > 1) {
    // Below the axes, three entries a row: inside them it would hide points, whatever corner it took.
    plot.legend->setVisible(true);
    plot.plotLayout()->addElement(2, 0, plot.legend);
    plot.plotLayout()->setRowStretchFactor(2, 0.001);
    plot.legend->setFillOrder(QCPLayoutGrid::foColumnsFirst);
    plot.legend->setWrap(3);
    plot.legend->setBorderPen(Qt::NoPen);
    plot.legend->setMargins(QMargins(40, 0, 12, 10));
  }

  plot.xAxis->setRange(numeric ? padded(xMin, xMax, logX) : QCPRange(0.5, double(x.values.size()) + 0.5));
  plot.yAxis->setRange(padded(yMin, yMax, false));
  plot.replot();

  QByteArray png;
  QBuffer buffer(&png);
  buffer.open(QIODevice::WriteOnly);
  if (!plot.toPixmap(kWidth, kHeight).save(&buffer, "PNG")) return QStringLiteral("could not draw the plot");
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly) || file.write(png) != png.size() || !file.commit())
    return file.errorString();
  return {};
}

}  // namespace gn::cli
