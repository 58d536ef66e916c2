#include "node_preview.h"

#include <QApplication>
#include <QFontMetricsF>
#include <QImage>
#include <QJsonArray>
#include <QPainter>
#include <QPainterPath>
#include <QTextLayout>
#include <algorithm>
#include <cmath>
#include <limits>

#include "attention_view.h"
#include "style.h"

namespace gn::editor {

namespace {

constexpr qreal kLine = 14, kHeatmapSide = 64, kSparkline = 30, kBar = 6;
constexpr int kShownValues = 8;
constexpr int kHeatmapCells = 64;  // an attention map with more steps is averaged down to this many a side

double number(const QJsonValue& v) {
  // The report writes a value that is not a number (NaN, inf) as null.
  return v.isDouble() ? v.toDouble() : std::numeric_limits<double>::quiet_NaN();
}

QString formatNumber(double v) {
  return std::isnan(v) ? QString("nan") : QString::number(v, 'g', 4);
}

QString shapeText(const QJsonArray& shape) {
  QStringList dims;
  for (const QJsonValue& d : shape) dims << QString::number(qint64(d.toDouble()));
  return dims.isEmpty() ? QString("scalar") : dims.join(QChar(0x00D7));
}

// Diverging blue-black-orange around zero when the values have both signs, so the sign reads at a glance;
// otherwise a dark-to-bright ramp from the smallest to the largest.
QColor heatColor(double v, double lo, double hi) {
  if (std::isnan(v)) return QColor(0x80, 0x80, 0x80);
  auto mix = [](QColor a, QColor b, double t) {
    t = std::clamp(t, 0.0, 1.0);
    return QColor::fromRgbF(float(a.redF() + (b.redF() - a.redF()) * t),
                            float(a.greenF() + (b.greenF() - a.greenF()) * t),
                            float(a.blueF() + (b.blueF() - a.blueF()) * t));
  };
  const QColor neg(0x4a, 0x9e, 0xff), zero(0x1a, 0x1c, 0x20), pos(0xff, 0x9f, 0x43);
  if (lo < 0 && hi > 0) {
    const double m = std::max(-lo, hi);
    return v < 0 ? mix(zero, neg, -v / m) : mix(zero, pos, v / m);
  }
  const QColor dark(0x2b, 0x1d, 0x5c), mid(0x21, 0x91, 0x8c), bright(0xfd, 0xe7, 0x25);
  const double t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
  return t < 0.5 ? mix(dark, mid, t * 2) : mix(mid, bright, t * 2 - 1);
}

// A fraction or a coefficient (an accuracy, an R²) with two decimals; "–" when it is not a number.
QString twoDecimals(double v) {
  return std::isfinite(v) ? QString::number(v, 'f', 2) : QString("–");
}

// A line of a wrapped text: where it starts in the text, and what is drawn.
struct WrappedLine {
  int start = 0;
  QString text;
};

QList<WrappedLine> wrapText(const QString& text, qreal width, int maxLines) {
  QList<WrappedLine> lines;
  if (width <= 0 || text.isEmpty() || maxLines <= 0) return lines;
  const QFont font = NodePreview::font();
  // One character for one: a position in the laid-out text is the same position in `text`.
  QString laid = text;
  laid.replace('\n', QChar::LineSeparator).replace('\t', ' ');
  QTextLayout layout(laid, font);
  QTextOption option;
  option.setWrapMode(QTextOption::WrapAtWordBoundaryOrAnywhere);
  layout.setTextOption(option);
  layout.beginLayout();
  for (QTextLine line = layout.createLine(); line.isValid(); line = layout.createLine()) {
    line.setLineWidth(width);
    QString shown = laid.mid(line.textStart(), line.textLength());
    while (!shown.isEmpty() && (shown.back().isSpace() || shown.back() == QChar::LineSeparator))
      shown.chop(1);
    lines << WrappedLine{line.textStart(), shown};
  }
  layout.endLayout();
  if (lines.size() <= maxLines) return lines;
  // The last line shown holds the start of all that is left, elided; line breaks in it read as spaces.
  WrappedLine& last = lines[maxLines - 1];
  const QString rest = laid.mid(last.start).replace(QChar::LineSeparator, ' ');
  last.text = QFontMetricsF(font).elidedText(rest, Qt::ElideRight, width);
  lines.resize(maxLines);
  return lines;
}

}  // namespace

QFont NodePreview::font() {
  QFont f = QApplication::font();
  f.setPointSizeF(7.5);
  return f;
}

QStringList NodePreview::textLines(qreal width) const {
  QStringList out;
  for (const WrappedLine& line : wrapText(text, width, kTextLines)) out << line.text;
  return out;
}

NodePreview NodePreview::fromReport(const QString& nodeId, const QJsonObject& entry,
                                    const QJsonObject& metrics) {
  NodePreview p;
  if (entry.value("inspect").isArray()) {
    const QJsonArray batch = entry.value("inspect").toArray();
    if (batch.isEmpty()) return p;
    const QJsonObject t = batch.first().toObject();
    const QString more = batch.size() > 1 ? QString(" · 1 of %1").arg(batch.size()) : QString();
    const QJsonObject grid = t.value("heatmap").toObject();
    const QJsonArray rows = grid.value("rows").toArray(), cols = grid.value("cols").toArray(),
                     cells = grid.value("values").toArray();
    if (!rows.isEmpty() && !cols.isEmpty() && cells.size() == rows.size() * cols.size()) {
      p.kind = Kind::Heatmap;
      p.rows = int(rows.size());
      p.cols = int(cols.size());
      for (const QJsonValue& v : cells) p.values << number(v);
      const bool sampled = p.rows * p.cols < t.value("numel").toDouble();
      p.caption = shapeText(t.value("shape").toArray()) +
                  (sampled ? QString(", %1×%2 sampled").arg(p.rows).arg(p.cols) : QString()) + more;
      return p;
    }
    p.kind = Kind::Values;
    const QJsonArray values = t.value("values").toArray();
    for (qsizetype i = 0; i < values.size() && i < kShownValues; ++i) p.values << number(values[i]);
    p.caption = shapeText(t.value("shape").toArray()) + " " + t.value("device").toString() + more;
    return p;
  }
  if (entry.value("generated_text").isString()) {
    p.kind = Kind::Text;
    p.text = entry.value("generated_text").toString();
    p.text.replace("\r\n", "\n");
    const QString prefix = entry.value("prefix").toString();
    p.prefixLength = p.text.startsWith(prefix) ? int(prefix.size()) : 0;
    const qint64 tokens = qint64(entry.value("tokens").toDouble(-1));
    p.caption = tokens < 0 ? QString("generated text")
                           : QString("%1 token%2 generated").arg(tokens).arg(tokens == 1 ? "" : "s");
    return p;
  }
  const QString task = entry.value("task").toString();
  if ((task == "regression" || task == "language_model") && entry.contains("samples")) {
    p.kind = Kind::Scores;
    p.scores = task == "regression" ? QString("R² %1 · MSE %2")
                                          .arg(twoDecimals(number(entry.value("r2"))),
                                               style::formatScore(number(entry.value("mse"))))
                                    : QString("perplexity %1 · accuracy %2")
                                          .arg(style::formatScore(number(entry.value("perplexity"))),
                                               twoDecimals(number(entry.value("accuracy"))));
    p.caption = QString("%1 %2 samples")
                    .arg(qint64(entry.value("samples").toDouble()))
                    .arg(entry.value("split").toString());
    return p;
  }
  if (entry.contains("accuracy") && entry.contains("samples")) {
    p.kind = Kind::Accuracy;
    p.accuracy = number(entry.value("accuracy"));
    p.caption = QString("%1 %2 samples")
                    .arg(qint64(entry.value("samples").toDouble()))
                    .arg(entry.value("split").toString());
    return p;
  }
  if (entry.value("attention").toObject().value("layers").isArray()) {
    const std::optional<AttentionResults> a = AttentionResults::fromReport(nodeId, entry);
    if (!a) return p;
    const AttentionLayer& l = a->layers.first();
    const QVector<double> mean = l.meanOverHeads();
    // Wider than the preview has pixels: each cell the mean of a block of f x f weights.
    const int f = std::max((l.queries + kHeatmapCells - 1) / kHeatmapCells,
                           (l.keys + kHeatmapCells - 1) / kHeatmapCells);
    p.kind = Kind::Heatmap;
    p.rows = (l.queries + f - 1) / f;
    p.cols = (l.keys + f - 1) / f;
    for (int i = 0; i < p.rows; ++i)
      for (int j = 0; j < p.cols; ++j) {
        double sum = 0;
        int n = 0;
        for (int q = i * f; q < std::min(l.queries, (i + 1) * f); ++q)
          for (int k = j * f; k < std::min(l.keys, (j + 1) * f); ++k, ++n) sum += mean[q * l.keys + k];
        p.values << sum / n;
      }
    const QString name = l.layer.section(QChar('/'), -1);
    p.caption = QString("%1 %2×%3%4 · mean of %5 head%6%7")
                    .arg(name)
                    .arg(l.queries)
                    .arg(l.keys)
                    .arg(f > 1 ? QString(" (%1×%2)").arg(p.rows).arg(p.cols) : QString())
                    .arg(l.heads)
                    .arg(l.heads == 1 ? "" : "s")
                    .arg(a->layers.size() > 1 ? QString(" · 1 of %1").arg(a->layers.size()) : QString());
    return p;
  }
  // The live series has a point every few batches; the epochs only one per epoch.
  const QJsonArray series = metrics.value(nodeId + ".loss").toArray();
  for (const QJsonValue& point : series) p.values << number(point.toArray().at(1));
  if (p.values.size() < 2) {
    p.values.clear();
    for (const QJsonValue& e : entry.value("epochs").toArray())
      p.values << number(e.toObject().value("loss"));
  }
  if (p.values.size() < 2) return NodePreview{};
  p.kind = Kind::Sparkline;
  p.caption = QString("loss %1 → %2").arg(formatNumber(p.values.first()), formatNumber(p.values.last()));
  return p;
}

std::pair<double, double> NodePreview::range() const {
  double lo = std::numeric_limits<double>::infinity(), hi = -lo;
  for (double v : values)
    if (!std::isnan(v)) {
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
  if (lo > hi) return {0, 0};
  return {lo, hi};
}

qreal NodePreview::height() const {
  switch (kind) {
    case Kind::None:
      return 0;
    case Kind::Values:
      return 3 * kLine;
    case Kind::Heatmap:
      return kHeatmapSide + kLine;
    case Kind::Accuracy:
      return 2 * kLine + kBar + 2;
    case Kind::Scores:
      return 2 * kLine;
    case Kind::Text:
      return (1 + kTextLines) * kLine;
    case Kind::Sparkline:
      return kLine + kSparkline;
  }
  return 0;
}

void NodePreview::paint(QPainter* p, const QRectF& r) const {
  const QFont font = NodePreview::font();
  const QFontMetricsF fm(font);
  const QColor ink(0xe8, 0xea, 0xee), dim(0x9a, 0xa3, 0xad), accent(0x7f, 0xd1, 0x8b);
  p->setFont(font);
  p->setPen(dim);
  p->drawText(QRectF(r.left(), r.top(), r.width(), kLine), Qt::AlignLeft | Qt::AlignVCenter,
              fm.elidedText(caption, Qt::ElideRight, r.width()));
  const QRectF body(r.left(), r.top() + kLine, r.width(), r.height() - kLine);
  switch (kind) {
    case Kind::None:
      return;
    case Kind::Values: {
      // Two lines of values, as many as fit, a gap between them.
      QStringList shown;
      for (double v : values) shown << formatNumber(v);
      if (shown.isEmpty()) shown << "(no values read)";
      p->setPen(ink);
      QString line;
      qreal y = body.top();
      for (const QString& s : shown) {
        const QString joined = line.isEmpty() ? s : line + "  " + s;
        if (!line.isEmpty() && fm.horizontalAdvance(joined) > body.width()) {
          p->drawText(QRectF(body.left(), y, body.width(), kLine), Qt::AlignLeft | Qt::AlignVCenter, line);
          y += kLine;
          line = s;
          if (y >= body.bottom() - 1) return;
        } else {
          line = joined;
        }
      }
      p->drawText(QRectF(body.left(), y, body.width(), kLine), Qt::AlignLeft | Qt::AlignVCenter,
                  fm.elidedText(line, Qt::ElideRight, body.width()));
      return;
    }
    case Kind::Heatmap: {
      const auto [lo, hi] = range();
      // Whole pixels per cell where the grid is small; a grid of more cells than the side has pixels over two
      // (a 35-step attention map) fills the side, each cell a pixel or two.
      const qreal fit = std::min(kHeatmapSide / rows, kHeatmapSide / cols);
      const qreal cell = fit >= 2 ? std::floor(fit) : fit;
      const QRectF grid(body.left(), body.top(), std::round(cell * cols), std::round(cell * rows));
      QImage cells(cols, rows, QImage::Format_RGB32);
      for (int i = 0; i < rows; ++i)
        for (int j = 0; j < cols; ++j) cells.setPixel(j, i, heatColor(values[i * cols + j], lo, hi).rgb());
      p->save();
      p->setRenderHint(QPainter::SmoothPixmapTransform, false);
      p->drawImage(grid, cells);
      p->restore();
      p->setPen(QPen(QColor(0x15, 0x16, 0x18), 0));
      p->setBrush(Qt::NoBrush);
      p->drawRect(grid);
      // The scale beside it: what the brightest and darkest cells mean.
      const qreal x = grid.right() + 8, w = body.right() - x;
      p->setPen(ink);
      p->drawText(QRectF(x, body.top(), w, kLine), Qt::AlignLeft | Qt::AlignVCenter,
                  fm.elidedText("max " + formatNumber(hi), Qt::ElideRight, w));
      p->drawText(QRectF(x, body.top() + kLine, w, kLine), Qt::AlignLeft | Qt::AlignVCenter,
                  fm.elidedText("min " + formatNumber(lo), Qt::ElideRight, w));
      const QRectF ramp(x, body.top() + 2 * kLine + 4, qMin<qreal>(w, 60), 8);
      for (int i = 0; i < int(ramp.width()); ++i)
        p->fillRect(QRectF(ramp.left() + i, ramp.top(), 1, ramp.height()),
                    heatColor(lo + (hi - lo) * i / std::max(1.0, ramp.width() - 1), lo, hi));
      return;
    }
    case Kind::Scores: {
      QFont big = font;
      big.setPointSizeF(9);
      big.setBold(true);
      p->setFont(big);
      p->setPen(accent);
      p->drawText(QRectF(body.left(), body.top(), body.width(), kLine), Qt::AlignLeft | Qt::AlignVCenter,
                  QFontMetricsF(big).elidedText(scores, Qt::ElideRight, body.width()));
      return;
    }
    case Kind::Text: {
      // The prefix in the caption's grey, what the model wrote after it in the text's colour.
      qreal y = body.top();
      for (const WrappedLine& line : wrapText(text, body.width(), kTextLines)) {
        const int dimmed = int(std::clamp<qsizetype>(prefixLength - line.start, 0, line.text.size()));
        const QString given = line.text.left(dimmed), written = line.text.mid(dimmed);
        const QRectF row(body.left(), y, body.width(), kLine);
        p->setPen(dim);
        p->drawText(row, Qt::AlignLeft | Qt::AlignVCenter, given);
        p->setPen(ink);
        p->drawText(row.adjusted(fm.horizontalAdvance(given), 0, 0, 0), Qt::AlignLeft | Qt::AlignVCenter,
                    written);
        y += kLine;
      }
      return;
    }
    case Kind::Accuracy: {
      QFont big = font;
      big.setPointSizeF(10);
      big.setBold(true);
      p->setFont(big);
      p->setPen(accent);
      p->drawText(QRectF(body.left(), body.top(), body.width(), kLine), Qt::AlignLeft | Qt::AlignVCenter,
                  std::isnan(accuracy) ? QString("accuracy n/a")
                                       : QString("accuracy %1%").arg(accuracy * 100, 0, 'f', 1));
      const QRectF bar(body.left(), body.top() + kLine + 2, body.width(), kBar);
      p->setPen(Qt::NoPen);
      p->setBrush(QColor(0x44, 0x48, 0x4f));
      p->drawRoundedRect(bar, 3, 3);
      if (!std::isnan(accuracy)) {
        p->setBrush(accent);
        p->drawRoundedRect(QRectF(bar.topLeft(), QSizeF(bar.width() * std::clamp(accuracy, 0.0, 1.0), kBar)),
                           3, 3);
      }
      return;
    }
    case Kind::Sparkline: {
      const auto [lo, hi] = range();
      const QRectF plot = body.adjusted(1, 3, -1, -3);
      QPainterPath path;
      bool started = false;
      for (int i = 0; i < values.size(); ++i) {
        if (std::isnan(values[i])) continue;
        const QPointF pt(
            plot.left() + plot.width() * i / (values.size() - 1),
            hi > lo ? plot.bottom() - plot.height() * (values[i] - lo) / (hi - lo) : plot.center().y());
        if (started)
          path.lineTo(pt);
        else
          path.moveTo(pt);
        started = true;
      }
      p->setPen(QPen(QColor(0x3a, 0x3f, 0x46), 0));
      p->drawLine(plot.bottomLeft(), plot.bottomRight());
      p->setBrush(Qt::NoBrush);
      p->setPen(QPen(style::seriesColor(0), 1.5));
      p->drawPath(path);
      return;
    }
  }
}

}  // namespace gn::editor
