// A comment frame behind a group of nodes. Dragging it carries the nodes inside; the corner handle resizes
// it; double-click on its title renames it. Changes go to the document through the scene, one undo step each.
// Include: Qt Widgets, graph_editor.h (CommentFrame). Must not include the view, the wire-drag controller or
// the actions.
#pragma once
#include <QGraphicsItem>

#include "graph_editor.h"

namespace gn::editor {

class GraphScene;
class NodeItem;

class CommentItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 3 };
  // The item of `frame`, placed where the frame says; `scene` must outlive it.
  CommentItem(GraphScene* scene, const CommentFrame& frame);
  int type() const override { return Type; }
  const QString& id() const { return frame_.id; }
  CommentFrame frame() const;  // as it is on the canvas now
  QRectF boundingRect() const override { return QRectF(QPointF(), size_).adjusted(-2, -2, 2, 2); }
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
  // Remembers the unselected nodes inside, which then follow the frame while it is dragged.
  void capture();
  const QList<NodeItem*>& captured() const { return captured_; }

 protected:
  QVariant itemChange(GraphicsItemChange change, const QVariant& value) override;
  void mousePressEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseMoveEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseReleaseEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseDoubleClickEvent(QGraphicsSceneMouseEvent* e) override;
  void hoverMoveEvent(QGraphicsSceneHoverEvent* e) override;

 private:
  bool onHandle(QPointF p) const;
  GraphScene* scene_;
  CommentFrame frame_;
  QSizeF size_;
  QPointF lastPos_;
  QList<NodeItem*> captured_;
  bool resizing_ = false;
};

}  // namespace gn::editor
