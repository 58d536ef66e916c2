#include "timeline.h"

#include <QMouseEvent>
#include <QPainter>
#include <QToolTip>
#include <QWheelEvent>
#include <algorithm>
#include <cmath>

#include "recent.h"
#include "style.h"

namespace gn::editor {

namespace {
constexpr int kLabelW = 130, kRulerH = TimelineView::kRulerHeight, kSubRowH = 18, kLanePad = 4;

// A 1, 2 or 5 times a power of ten that cuts `range` into at most about `ticks` steps.
double niceStep(double range, int ticks) {
  const double raw = range / ticks;
  const double p = std::pow(10.0, std::floor(std::log10(raw)));
  for (double m : {1.0, 2.0, 5.0, 10.0})
    if (raw <= m * p) return m * p;
  return 10 * p;
}
}  // namespace

TimelineView::TimelineView(QWidget* parent) : QWidget(parent) {
  setObjectName("timeline");
  setMouseTracking(true);
  setAutoFillBackground(false);
  updateMinimumHeight();
}

void TimelineView::clear() {
  spans_.clear();
  droppedSpans_ = 0;
  spanRow_.clear();
  lanes_.clear();
  laneTops_.clear();
  laneIndex_.clear();
  laneOrder_.clear();
  t0_ = 0;
  t1_ = 1000;
  maxEnd_ = 0;
  follow_ = true;
  updateMinimumHeight();
  update();
}

void TimelineView::addSpans(const QList<core::TraceSpan>& spans) {
  if (spans.isEmpty()) return;
  bool relayout = false;
  QList<core::TraceSpan> added;
  for (const core::TraceSpan& s : spans) {
    const QString key = s.device + '\t' + s.stream;
    auto it = laneIndex_.find(key);
    if (it == laneIndex_.end()) {
      it = laneIndex_.insert(key, int(lanes_.size()));
      lanes_.append(Lane{s.device + " · " + (s.stream.isEmpty() ? QString("compute") : s.stream), {}, {}});
      relayout = true;
    }
    Lane& lane = lanes_[*it];
    // The first sub-row free at the span's start (a few ns of slack for back-to-back spans).
    int row = 0;
    while (row < lane.rowEnd.size() && lane.rowEnd[row] > s.startUs + 0.01) ++row;
    if (row == lane.rowEnd.size()) {
      lane.rowEnd.append(s.endUs);
      relayout = true;
    } else {
      lane.rowEnd[row] = s.endUs;
    }
    lane.spans.append(int(spans_.size() + added.size()));
    spanRow_.append(row);
    added.append(s);
    maxEnd_ = qMax(maxEnd_, s.endUs);
  }
  if (const qsizetype dropped = appendKeepingNewest(spans_, added)) {
    // Indices into spans_ shift down; each lane's are in ascending order, so its dropped ones lead.
    spanRow_.remove(0, dropped);
    for (Lane& lane : lanes_) {
      lane.spans.erase(lane.spans.begin(), std::lower_bound(lane.spans.begin(), lane.spans.end(), dropped));
      for (int& i : lane.spans) i -= int(dropped);
    }
    droppedSpans_ += dropped;
  }
  if (relayout) {
    // Rows in device, then stream order (the map is sorted by its key).
    laneOrder_.clear();
    laneTops_.clear();
    int y = kRulerH;
    for (int idx : laneIndex_) {
      laneOrder_.append(idx);
      laneTops_.append(y);
      y += laneHeight(idx);
    }
    updateMinimumHeight();
  }
  if (follow_) fit();
  update();
}

QStringList TimelineView::laneNames() const {
  QStringList names;
  for (int idx : laneOrder_) names << lanes_[idx].name;
  return names;
}

void TimelineView::setNodeOrder(const QStringList& ids) {
  colors_.clear();
  for (int i = 0; i < ids.size(); ++i) {
    // Golden-ratio hue steps: any two nearby indices land far apart on the hue circle.
    const double h = std::fmod(0.08 + i * 0.618033988749895, 1.0);
    colors_.insert(ids[i], QColor::fromHsvF(float(h), 0.5f, 0.95f));
  }
  update();
}

QColor TimelineView::colorOf(const QString& node) const {
  auto it = colors_.find(node);
  return it != colors_.end() ? *it : style::nodeColor(node);
}

int TimelineView::laneHeight(int lane) const {
  return int(qMax<qsizetype>(1, lanes_[lane].rowEnd.size())) * kSubRowH + 2 * kLanePad;
}

void TimelineView::updateMinimumHeight() {
  int h = kRulerH + 4;
  for (int i = 0; i < lanes_.size(); ++i) h += laneHeight(i);
  setMinimumHeight(qMax(h, kRulerH + 2 * (kSubRowH + 2 * kLanePad) + 4));
}

void TimelineView::fit() {
  t0_ = 0;
  t1_ = qMax(maxEnd_ * 1.02, 10.0);
}

double TimelineView::xOf(double us) const {
  const double w = qMax(1, width() - kLabelW - 8);
  return kLabelW + (us - t0_) / (t1_ - t0_) * w;
}

double TimelineView::usOf(double x) const {
  const double w = qMax(1, width() - kLabelW - 8);
  return t0_ + (x - kLabelW) / w * (t1_ - t0_);
}

void TimelineView::paintEvent(QPaintEvent*) {
  QPainter p(this);
  p.fillRect(rect(), QColor(0x1e, 0x20, 0x24));
  const QColor fg(0xc8, 0xcc, 0xd2), grid(0x33, 0x37, 0x3d);
  QFont small = font();
  small.setPointSizeF(8);
  p.setFont(small);
  const QFontMetrics fm(small);

  // Ruler and grid.
  // As many ticks as labels fit: a narrow dock gets fewer, so that "1.2 s" and "1.4 s" never run together.
  const double step = niceStep(t1_ - t0_, qBound(2, (width() - kLabelW) / 80, 8));
  p.setPen(fg);
  for (double t = std::ceil(t0_ / step) * step; t <= t1_; t += step) {
    const int x = int(xOf(t));
    p.setPen(grid);
    p.drawLine(x, kRulerH, x, height());
    p.setPen(fg);
    p.drawText(x + 3, kRulerH - 6, style::formatMs(t / 1000.0));
  }
  if (spans_.isEmpty()) {
    p.setPen(QColor(0x80, 0x86, 0x8e));
    p.drawText(rect().adjusted(kLabelW, kRulerH, 0, 0), Qt::AlignCenter,
               "Run the graph to see its spans: one lane per device and stream");
  }
  p.setClipRect(QRect(kLabelW, kRulerH, width() - kLabelW, height() - kRulerH));
  for (int row = 0; row < laneOrder_.size(); ++row) {
    const Lane& lane = lanes_[laneOrder_[row]];
    const int top = laneTop(row);
    if (row % 2)
      p.fillRect(QRect(kLabelW, top, width() - kLabelW, laneHeight(laneOrder_[row])),
                 QColor(0x23, 0x26, 0x2b));
    for (int si : lane.spans) {
      const core::TraceSpan& s = spans_[si];
      if (s.endUs < t0_ || s.startUs > t1_) continue;
      const double x0 = xOf(s.startUs), x1 = xOf(s.endUs);
      const QRectF r(x0, top + kLanePad + spanRow_[si] * kSubRowH, qMax(1.0, x1 - x0), kSubRowH - 2);
      const QColor c = colorOf(s.node);
      p.fillRect(r, c);
      // A darker left edge separates back-to-back spans of one node (50 matmuls in a row).
      if (r.width() > 4) p.fillRect(QRectF(r.left(), r.top(), 1, r.height()), c.darker(170));
      if (s.hostBlocking) p.fillRect(QRectF(r.left(), r.top(), r.width(), 3), QColor(0xe5, 0x48, 0x48));
      if (r.width() > 28) {
        p.setPen(QColor(0x10, 0x10, 0x10));
        p.drawText(r.adjusted(3, 0, -2, 0), Qt::AlignVCenter | Qt::AlignLeft,
                   fm.elidedText(s.node + " " + s.op, Qt::ElideRight, int(r.width()) - 5));
      }
    }
  }
  p.setClipping(false);
  // Lane labels over a solid column, so spans scrolled left do not show through.
  p.fillRect(QRect(0, 0, kLabelW, height()), QColor(0x22, 0x25, 0x2a));
  p.setPen(fg);
  for (int row = 0; row < laneOrder_.size(); ++row)
    p.drawText(QRect(6, laneTop(row), kLabelW - 10, laneHeight(laneOrder_[row])),
               Qt::AlignVCenter | Qt::AlignLeft,
               fm.elidedText(lanes_[laneOrder_[row]].name, Qt::ElideRight, kLabelW - 10));
  p.setPen(grid);
  p.drawLine(kLabelW, 0, kLabelW, height());
  p.drawLine(0, kRulerH, width(), kRulerH);
  if (droppedSpans_ > 0) {
    // At the ruler's right end, on the background, so that tick labels do not run through it.
    const QString note =
        QString("newest %L1 spans; %L2 older not kept").arg(spans_.size()).arg(droppedSpans_);
    const int w = fm.horizontalAdvance(note) + 12;
    const QRect box(width() - w - 4, 1, w, kRulerH - 3);
    p.fillRect(box, QColor(0x1e, 0x20, 0x24));
    p.setPen(QColor(0x80, 0x86, 0x8e));
    p.drawText(box, Qt::AlignCenter, note);
  }
}

int TimelineView::spanAt(QPoint pos) const {
  if (pos.x() < kLabelW || pos.y() < kRulerH) return -1;
  int row = -1;
  for (int r = 0; r < laneOrder_.size(); ++r)
    if (pos.y() >= laneTop(r) && pos.y() < laneTop(r) + laneHeight(laneOrder_[r])) row = r;
  if (row < 0) return -1;
  const int sub = (pos.y() - laneTop(row) - kLanePad) / kSubRowH;
  const double us = usOf(pos.x());
  const double slack = (t1_ - t0_) / qMax(1, width() - kLabelW) * 2;  // two pixels, for hairline spans
  int best = -1;
  for (int si : lanes_[laneOrder_[row]].spans) {
    const core::TraceSpan& s = spans_[si];
    if (spanRow_[si] == sub && us >= s.startUs - slack && us <= s.endUs + slack) best = si;
  }
  return best;
}

QPoint TimelineView::spanCenter(int span) const {
  const core::TraceSpan& s = spans_[span];
  const int lane = laneIndex_.value(s.device + '\t' + s.stream);
  const int row = int(laneOrder_.indexOf(lane));
  return QPoint(int((xOf(s.startUs) + xOf(s.endUs)) / 2),
                laneTop(row) + kLanePad + spanRow_[span] * kSubRowH + kSubRowH / 2);
}

QString TimelineView::describe(int span) const {
  if (span < 0 || span >= spans_.size()) return {};
  const core::TraceSpan& s = spans_[span];
  const double ms = (s.endUs - s.startUs) / 1000.0;
  QString text = QString("<b>%1</b> · %2<br>%3 / %4<br>%5 (at %6)")
                     .arg(s.node.toHtmlEscaped(), s.op.toHtmlEscaped(), s.device,
                          s.stream.isEmpty() ? "compute" : s.stream, style::formatMs(ms),
                          style::formatMs(s.startUs / 1000.0));
  if (s.bytes > 0) text += "<br>" + style::formatBytes(double(s.bytes));
  if (s.flops > 0 && ms > 0) text += QString("<br>%1 GFLOP/s").arg(s.flops / (ms * 1e6), 0, 'f', 1);
  if (s.hostBlocking) text += "<br><font color='#ff7b7b'>the host waited for this</font>";
  return text;
}

void TimelineView::wheelEvent(QWheelEvent* e) {
  const double factor = std::pow(1.0015, -e->angleDelta().y());
  const double at = usOf(e->position().x());
  double span = qBound(1.0, (t1_ - t0_) * factor, 1e12);
  const double frac = (at - t0_) / (t1_ - t0_);
  t0_ = at - frac * span;
  t1_ = t0_ + span;
  follow_ = false;
  update();
  e->accept();
}

void TimelineView::mousePressEvent(QMouseEvent* e) {
  if (e->button() == Qt::LeftButton || e->button() == Qt::MiddleButton) {
    dragging_ = true;
    moved_ = false;
    dragStart_ = e->position().toPoint();
    dragT0_ = t0_;
    setCursor(Qt::ClosedHandCursor);
  }
}

void TimelineView::mouseMoveEvent(QMouseEvent* e) {
  if (dragging_) {
    const double w = qMax(1, width() - kLabelW - 8);
    const double span = t1_ - t0_;
    const int dx = e->position().toPoint().x() - dragStart_.x();
    if (std::abs(dx) > 2) moved_ = true;
    t0_ = dragT0_ - dx / w * span;
    t1_ = t0_ + span;
    follow_ = false;
    update();
    return;
  }
  const int s = spanAt(e->position().toPoint());
  if (s >= 0)
    QToolTip::showText(e->globalPosition().toPoint(), describe(s), this);
  else
    QToolTip::hideText();
}

void TimelineView::mouseReleaseEvent(QMouseEvent* e) {
  if (dragging_) {
    dragging_ = false;
    unsetCursor();
    if (!moved_) {
      const int s = spanAt(e->position().toPoint());
      if (s >= 0) emit spanClicked(spans_[s].node);
    }
  }
}

void TimelineView::mouseDoubleClickEvent(QMouseEvent*) {
  follow_ = true;
  fit();
  update();
}

}  // namespace gn::editor
