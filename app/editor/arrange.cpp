#include "arrange.h"

#include <algorithm>

namespace gn::editor {

QString arrangementName(Arrangement a) {
  switch (a) {
    case Arrangement::AlignLeft:
      return "Align left edges";
    case Arrangement::AlignTop:
      return "Align top edges";
    case Arrangement::AlignHCenter:
      return "Align horizontal centres";
    case Arrangement::AlignVCenter:
      return "Align vertical centres";
    case Arrangement::DistributeH:
      return "Distribute horizontally";
    case Arrangement::DistributeV:
      return "Distribute vertically";
  }
  return {};
}

int arrangementMinimum(Arrangement a) {
  return a == Arrangement::DistributeH || a == Arrangement::DistributeV ? 3 : 2;
}

namespace {

QHash<QString, QPointF> distribute(QList<NodeRect> nodes, bool horizontal) {
  auto start = [horizontal](const QRectF& r) { return horizontal ? r.left() : r.top(); };
  auto extent = [horizontal](const QRectF& r) { return horizontal ? r.width() : r.height(); };
  std::stable_sort(nodes.begin(), nodes.end(),
                   [&](const NodeRect& a, const NodeRect& b) { return start(a.rect) < start(b.rect); });
  // The first and the last (by start) stay; the span between the first's start and the last's end, less the
  // nodes' own sizes, is shared out as equal gaps (negative when they cannot all fit: they overlap evenly).
  qreal sizes = 0;
  for (const NodeRect& n : nodes) sizes += extent(n.rect);
  const QRectF &first = nodes.first().rect, &last = nodes.last().rect;
  const qreal gap = (start(last) + extent(last) - start(first) - sizes) / (nodes.size() - 1);
  QHash<QString, QPointF> out;
  qreal at = start(first);
  for (const NodeRect& n : nodes) {
    out.insert(n.id, horizontal ? QPointF(at, n.rect.top()) : QPointF(n.rect.left(), at));
    at += extent(n.rect) + gap;
  }
  return out;
}

}  // namespace

QHash<QString, QPointF> arrange(const QList<NodeRect>& nodes, Arrangement a) {
  QHash<QString, QPointF> out;
  if (nodes.size() < arrangementMinimum(a)) {
    for (const NodeRect& n : nodes) out.insert(n.id, n.rect.topLeft());
    return out;
  }
  if (a == Arrangement::DistributeH || a == Arrangement::DistributeV)
    return distribute(nodes, a == Arrangement::DistributeH);
  QRectF bounds;
  for (const NodeRect& n : nodes) bounds = bounds.isNull() ? n.rect : bounds.united(n.rect);
  for (const NodeRect& n : nodes) {
    QPointF p = n.rect.topLeft();
    switch (a) {
      case Arrangement::AlignLeft:
        p.setX(bounds.left());
        break;
      case Arrangement::AlignTop:
        p.setY(bounds.top());
        break;
      case Arrangement::AlignHCenter:
        p.setX(bounds.center().x() - n.rect.width() / 2);
        break;
      case Arrangement::AlignVCenter:
        p.setY(bounds.center().y() - n.rect.height() / 2);
        break;
      default:
        break;
    }
    out.insert(n.id, p);
  }
  return out;
}

}  // namespace gn::editor
