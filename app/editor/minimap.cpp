#include "minimap.h"

#include <QMouseEvent>
#include <QPainter>
#include <QScrollBar>

#include "canvas/graph_view.h"
#include "style.h"

namespace gn::editor {

Minimap::Minimap(GraphView* view) : QWidget(view->viewport()), view_(view) {
  setObjectName("minimap");
  resize(170, 105);
  setCursor(Qt::PointingHandCursor);
  setToolTip("Minimap: click or drag to move the view");
  // Coalesce bursts (a paste of hundreds of nodes, a run's status changes) into one repaint.
  refresh_.setSingleShot(true);
  refresh_.setInterval(60);
  connect(&refresh_, &QTimer::timeout, this, qOverload<>(&QWidget::update));
  // Not QGraphicsScene::changed: listening to it makes the scene collect dirty regions on every frame.
  connect(view_->graphScene()->document(), &core::GraphDocument::changed, this, [this] { scheduleUpdate(); });
  connect(view_->graphScene(), &QGraphicsScene::selectionChanged, this, [this] { scheduleUpdate(); });
  connect(view_->horizontalScrollBar(), &QScrollBar::valueChanged, this, [this] { scheduleUpdate(); });
  connect(view_->verticalScrollBar(), &QScrollBar::valueChanged, this, [this] { scheduleUpdate(); });
}

QRectF Minimap::world() const {
  QRectF r = view_->graphScene()->nodesRect(false);
  const QRectF visible = view_->mapToScene(view_->viewport()->rect()).boundingRect();
  r = r.isNull() ? visible : r.united(visible);
  return r.adjusted(-40, -40, 40, 40);
}

QTransform Minimap::toMap(const QRectF& w) const {
  const double s = qMin((width() - 8) / w.width(), (height() - 8) / w.height());
  QTransform t;
  t.translate(4 + (width() - 8 - w.width() * s) / 2, 4 + (height() - 8 - w.height() * s) / 2);
  t.scale(s, s);
  t.translate(-w.left(), -w.top());
  return t;
}

void Minimap::paintEvent(QPaintEvent*) {
  // Keep to the bottom-right corner of the canvas as it resizes.
  const QPoint corner(parentWidget()->width() - width() - 10, parentWidget()->height() - height() - 10);
  if (pos() != corner) move(corner);
  QPainter p(this);
  p.fillRect(rect(), QColor(0x16, 0x18, 0x1b, 170));
  p.setPen(QColor(0x3a, 0x3f, 0x46));
  p.drawRect(rect().adjusted(0, 0, -1, -1));
  const QRectF w = world();
  const QTransform t = toMap(w);
  for (const core::GraphNode& n : view_->graphScene()->document()->nodes()) {
    NodeItem* item = view_->graphScene()->nodeItem(n.id);
    if (!item) continue;
    const QRectF r = t.mapRect(item->sceneBoundingRect());
    QColor c = item->isSelected() ? QColor(0xff, 0xd1, 0x66) : QColor(0x6c, 0x86, 0xa8);
    if (!item->errors().isEmpty())
      c = QColor(0xe5, 0x48, 0x48);
    else if (item->runStatus() != RunStatus::Idle)
      c = style::statusColor(runStatusName(item->runStatus()));
    p.fillRect(r, c);
  }
  const QRectF visible = t.mapRect(view_->mapToScene(view_->viewport()->rect()).boundingRect());
  p.setPen(QPen(QColor(255, 255, 255, 180), 1));
  p.setBrush(QColor(255, 255, 255, 25));
  p.drawRect(visible);
}

void Minimap::centerAt(QPoint pos) {
  const QTransform t = toMap(dragWorld_);
  view_->centerOn(t.inverted().map(QPointF(pos)));
}

void Minimap::mousePressEvent(QMouseEvent* e) {
  dragWorld_ = world();
  centerAt(e->position().toPoint());
}

void Minimap::mouseMoveEvent(QMouseEvent* e) {
  if (e->buttons() & Qt::LeftButton) centerAt(e->position().toPoint());
}

}  // namespace gn::editor
