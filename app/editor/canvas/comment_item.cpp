#include "canvas/comment_item.h"

#include <QGraphicsSceneHoverEvent>
#include <QGraphicsSceneMouseEvent>
#include <QInputDialog>
#include <QLineEdit>
#include <QPainter>
#include <QStyleOptionGraphicsItem>

#include "canvas/graph_scene.h"
#include "canvas/node_geometry.h"
#include "canvas/node_item.h"
#include "canvas/node_painter.h"
#include "style.h"

namespace gn::editor {

namespace {
constexpr qreal kCommentHeader = 28, kHandle = 14;
}

CommentItem::CommentItem(GraphScene* scene, const CommentFrame& frame)
    : scene_(scene), frame_(frame), size_(frame.rect.size()) {
  setFlags(ItemIsMovable | ItemIsSelectable | ItemSendsGeometryChanges);
  setAcceptHoverEvents(true);
  setZValue(-2);
  setPos(frame.rect.topLeft());
  lastPos_ = pos();
  setToolTip(
      QString("%1\nDrag to move the frame and its nodes; drag the corner to resize; double-click to rename")
          .arg(frame.text));
}

CommentFrame CommentItem::frame() const {
  CommentFrame f = frame_;
  f.rect = QRectF(pos(), size_);
  return f;
}

void CommentItem::paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget*) {
  const qreal lod = option->levelOfDetailFromTransform(p->worldTransform());
  const QRectF r(QPointF(), size_);
  QColor fill = frame_.color, border = frame_.color, head = frame_.color;
  fill.setAlpha(34);
  border.setAlpha(isSelected() ? 255 : 140);
  head.setAlpha(80);
  p->setRenderHint(QPainter::Antialiasing, lod >= kLodSimple);
  p->setPen(QPen(isSelected() ? style::kSelection : border, 0));
  p->setBrush(fill);
  p->drawRoundedRect(r, 8, 8);
  p->setPen(Qt::NoPen);
  p->setBrush(head);
  p->drawRoundedRect(QRectF(0, 0, r.width(), kCommentHeader), 8, 8);
  if (lod >= 0.25) {
    QFont f = canvasFonts().title;
    f.setPointSizeF(11);
    p->setFont(f);
    p->setPen(style::kNodeText);
    p->drawText(QRectF(10, 0, r.width() - 20, kCommentHeader), Qt::AlignVCenter | Qt::AlignLeft, frame_.text);
  }
  // The resize grip.
  p->setPen(QPen(border, 0));
  for (int i = 1; i <= 3; ++i)
    p->drawLine(QPointF(r.right() - 4 * i, r.bottom() - 2), QPointF(r.right() - 2, r.bottom() - 4 * i));
}

bool CommentItem::onHandle(QPointF p) const {
  return p.x() > size_.width() - kHandle && p.y() > size_.height() - kHandle;
}

void CommentItem::capture() {
  captured_.clear();
  const QRectF area = sceneBoundingRect();
  for (QGraphicsItem* i : scene_->items(area, Qt::ContainsItemBoundingRect))
    if (auto* node = qgraphicsitem_cast<NodeItem*>(i); node && !node->isSelected()) captured_ << node;
  lastPos_ = pos();
}

QVariant CommentItem::itemChange(GraphicsItemChange change, const QVariant& value) {
  if (change == ItemPositionHasChanged) {
    const QPointF delta = pos() - lastPos_;
    lastPos_ = pos();
    for (NodeItem* n : captured_) n->moveBy(delta.x(), delta.y());
  }
  return QGraphicsItem::itemChange(change, value);
}

void CommentItem::mousePressEvent(QGraphicsSceneMouseEvent* e) {
  if (e->button() == Qt::LeftButton && onHandle(e->pos())) {
    resizing_ = true;
    e->accept();
    return;
  }
  QGraphicsItem::mousePressEvent(e);
}

void CommentItem::mouseMoveEvent(QGraphicsSceneMouseEvent* e) {
  if (resizing_) {
    prepareGeometryChange();
    size_ = QSizeF(qMax<qreal>(120, e->pos().x()), qMax<qreal>(70, e->pos().y()));
    update();
    return;
  }
  QGraphicsItem::mouseMoveEvent(e);
}

void CommentItem::mouseReleaseEvent(QGraphicsSceneMouseEvent* e) {
  if (resizing_) {
    resizing_ = false;
    scene_->commitComments("Resize comment frame");
    return;
  }
  QGraphicsItem::mouseReleaseEvent(e);
}

void CommentItem::mouseDoubleClickEvent(QGraphicsSceneMouseEvent* e) {
  if (e->pos().y() > kCommentHeader) {
    QGraphicsItem::mouseDoubleClickEvent(e);
    return;
  }
  bool ok = false;
  const QString text =
      QInputDialog::getText(nullptr, "Comment frame", "Text:", QLineEdit::Normal, frame_.text, &ok);
  if (!ok) return;
  frame_.text = text;
  scene_->commitComments("Rename comment frame");
}

void CommentItem::hoverMoveEvent(QGraphicsSceneHoverEvent* e) {
  setCursor(onHandle(e->pos()) ? Qt::SizeFDiagCursor : Qt::ArrowCursor);
  QGraphicsItem::hoverMoveEvent(e);
}

}  // namespace gn::editor
