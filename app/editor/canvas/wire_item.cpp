#include "canvas/wire_item.h"

#include <QGraphicsSceneMouseEvent>
#include <QPainter>
#include <QStyleOptionGraphicsItem>
#include <cmath>
#include <limits>

#include "canvas/graph_scene.h"
#include "canvas/node_item.h"
#include "canvas/node_painter.h"
#include "style.h"

namespace gn::editor {

using core::GraphConnection;

namespace {

// A wire leaves an output and enters an input horizontally; a reroute point is passed the same way, as a
// port would be.
void appendBezier(QPainterPath& path, QPointF a, QPointF b) {
  const qreal dx = qMax<qreal>(40, std::abs(b.x() - a.x()) * 0.5);
  path.cubicTo(a + QPointF(dx, 0), b - QPointF(dx, 0), b);
}

qreal distanceToSegment(QPointF p, QPointF a, QPointF b) {
  const QPointF ab = b - a;
  const qreal len2 = QPointF::dotProduct(ab, ab);
  const qreal t = len2 > 0 ? qBound<qreal>(0, QPointF::dotProduct(p - a, ab) / len2, 1) : 0;
  return QLineF(p, a + t * ab).length();
}

}  // namespace

WireItem::WireItem(NodeItem* from, int fromPort, NodeItem* to, int toPort, const GraphConnection& c)
    : from_(from), to_(to), fromPort_(fromPort), toPort_(toPort), conn_(c) {
  setFlags(ItemIsSelectable);
  setZValue(-1);
  from_->wires() << this;
  to_->wires() << this;
  points_ = GraphEditor::reroutePoints(conn_);
  setPorts(fromPort, toPort);
}

void WireItem::setConnection(const GraphConnection& c) {
  conn_ = c;
  carrying_ = false;
  points_ = GraphEditor::reroutePoints(conn_);
  updatePath();
}

void WireItem::rebuildPointItems() {
  QList<RerouteItem*> items;
  for (QGraphicsItem* child : childItems())
    if (auto* dot = qgraphicsitem_cast<RerouteItem*>(child)) items << dot;
  // The same number of points: the dots stay (one may be handling the mouse release that moved it).
  if (items.size() != points_.size()) {
    qDeleteAll(items);
    items.clear();
    for (int i = 0; i < points_.size(); ++i) items << new RerouteItem(this, i, color_);
  }
  for (int i = 0; i < points_.size(); ++i) items[i]->setPos(points_[i]);
}

void WireItem::movePoint(int index, QPointF scenePos) {
  if (index < 0 || index >= points_.size()) return;
  points_[index] = scenePos;
  updatePath();
}

void WireItem::beginCarry() {
  carrying_ = true;
  carryBase_ = points_;
  carryAnchor_ = from_->pos();
}

void WireItem::endCarry() {
  carrying_ = false;
}

void WireItem::setPorts(int fromPort, int toPort) {
  fromPort_ = fromPort;
  toPort_ = toPort;
  color_ = fromPort >= 0 && fromPort < from_->outputs().size()
               ? style::portColor(from_->outputs()[fromPort].type)
               : QColor(Qt::gray);
  updatePath();
}

QPainterPath WireItem::bezier(QPointF a, QPointF b) {
  QPainterPath path(a);
  appendBezier(path, a, b);
  return path;
}

void WireItem::updatePath() {
  prepareGeometryChange();
  if (carrying_) {
    const QPointF moved = from_->pos() - carryAnchor_;
    for (int i = 0; i < points_.size() && i < carryBase_.size(); ++i) points_[i] = carryBase_[i] + moved;
  }
  QPointF at = from_->portScenePos(true, qMax(0, fromPort_));
  path_ = QPainterPath(at);
  for (const QPointF& p : std::as_const(points_)) {
    appendBezier(path_, at, p);
    at = p;
  }
  appendBezier(path_, at, to_->portScenePos(false, qMax(0, toPort_)));
  bounds_ = path_.boundingRect().adjusted(-4, -4, 4, 4);
  shape_ = QPainterPath();
  rebuildPointItems();
}

int WireItem::insertionIndex(QPointF scenePos) const {
  QList<QPointF> stops{from_->portScenePos(true, qMax(0, fromPort_))};
  stops << points_ << to_->portScenePos(false, qMax(0, toPort_));
  int best = 0;
  qreal bestDistance = std::numeric_limits<qreal>::max();
  for (int k = 0; k + 1 < stops.size(); ++k) {
    // The stretch between two stops, flattened as it is drawn.
    const QPolygonF line = bezier(stops[k], stops[k + 1]).toSubpathPolygons().value(0);
    for (int i = 0; i + 1 < line.size(); ++i) {
      const qreal d = distanceToSegment(scenePos, line[i], line[i + 1]);
      if (d < bestDistance) {
        bestDistance = d;
        best = k;
      }
    }
  }
  return best;
}

bool WireItem::crosses(const QLineF& line) const {
  for (const QPolygonF& poly : path_.toSubpathPolygons())
    for (int i = 0; i + 1 < poly.size(); ++i)
      if (QLineF(poly[i], poly[i + 1]).intersects(line) == QLineF::BoundedIntersection) return true;
  return false;
}

QPainterPath WireItem::shape() const {
  // Built only when hit-testing needs it (clicks, rubber band), not on every move.
  if (shape_.isEmpty()) {
    QPainterPathStroker s;
    s.setWidth(10);
    shape_ = s.createStroke(path_);
  }
  return shape_;
}

void WireItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const qreal lod = option->levelOfDetailFromTransform(p->worldTransform());
  p->setBrush(Qt::NoBrush);
  if (isSelected()) {
    p->setRenderHint(QPainter::Antialiasing, true);
    p->setPen(QPen(style::kSelection, 4.5));
    p->drawPath(path_);
  }
  // Wires are drawn with cosmetic (one device pixel) pens: the raster engine strokes those on a fast path,
  // while a wide antialiased pen costs most of a frame once hundreds of long wires cross the view. Two
  // strokes a pixel apart read as a 2 px wire, the same width at every zoom.
  const bool detail = lod >= kLodSimple;
  p->setRenderHint(QPainter::Antialiasing, detail);
  p->setPen(QPen(color_, 0));
  p->drawPath(path_);
  if (detail) {
    p->translate(0, 1 / lod);
    p->drawPath(path_);
    p->translate(0, -1 / lod);
  }
}

RerouteItem::RerouteItem(WireItem* wire, int index, QColor color)
    : QGraphicsItem(wire), wire_(wire), index_(index), color_(color) {
  setCursor(Qt::SizeAllCursor);
  setToolTip("Reroute point: drag to move it, double-click to remove it");
}

void RerouteItem::paint(QPainter* p, const QStyleOptionGraphicsItem*, QWidget*) {
  p->setRenderHint(QPainter::Antialiasing, true);
  p->setPen(QPen(style::kNodeOutline, 1.5));
  p->setBrush(wire_->isSelected() ? style::kSelection : color_);
  p->drawEllipse(QPointF(), 4.5, 4.5);
}

void RerouteItem::mousePressEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() != Qt::LeftButton) {
    e->ignore();
    return;
  }
  grab_ = e->pos();
  dragged_ = false;
  e->accept();
}

void RerouteItem::mouseMoveEvent(QGraphicsSceneMouseEvent* e) {
  dragged_ = true;
  wire_->movePoint(index_, e->scenePos() - grab_);
}

void RerouteItem::mouseReleaseEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() != Qt::LeftButton || !dragged_) return;
  dragged_ = false;
  auto* scene = static_cast<GraphScene*>(this->scene());
  scene->editor()->setReroutePoints(wire_->connection(), wire_->points(), "Move reroute point");
}

}  // namespace gn::editor
