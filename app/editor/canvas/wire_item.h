// A wire between two node items, with the reroute points the document keeps for it, and the dots that let
// the user drag those points.
// Include: Qt Widgets, gpunodes/core; in the .cpp node_item.h, graph_scene.h (the dots reach the document
// through their scene's GraphEditor), node_painter.h (detail levels) and style.h. Must not include the view,
// the wire-drag controller or the actions.
#pragma once
#include <QGraphicsItem>
#include <QPainterPath>

#include "gpunodes/core/graph_document.h"

namespace gn::editor {

class NodeItem;

class WireItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 2 };
  // The wire of connection `c`, from output `fromPort` of `from` to input `toPort` of `to`; it adds itself to
  // both nodes' wires().
  WireItem(NodeItem* from, int fromPort, NodeItem* to, int toPort, const core::GraphConnection& c);
  int type() const override { return Type; }
  const core::GraphConnection& connection() const { return conn_; }
  // The same wire with other extra fields (its reroute points changed in the document).
  void setConnection(const core::GraphConnection& c);
  NodeItem* fromNode() const { return from_; }
  NodeItem* toNode() const { return to_; }
  // The port indices on its nodes changed (their ports were read again); -1 is a port the node lacks.
  void setPorts(int fromPort, int toPort);
  // Draws the path again from where its nodes and points are now.
  void updatePath();
  QRectF boundingRect() const override { return bounds_; }
  // A 10-unit-wide band around the path, so a thin wire can be clicked.
  QPainterPath shape() const override;
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;
  // The curve of a wire from `a` (an output) to `b` (an input): it leaves and enters horizontally.
  static QPainterPath bezier(QPointF a, QPointF b);

  // Reroute points as drawn, in scene coordinates: the document's, or where a drag has them now.
  const QList<QPointF>& points() const { return points_; }
  void movePoint(int index, QPointF scenePos);  // while a point is dragged
  // Where a point added at `scenePos` goes in points(): after the bend before the nearest stretch of wire.
  int insertionIndex(QPointF scenePos) const;
  // Whether the wire as drawn crosses the segment `line` (scene coordinates).
  bool crosses(const QLineF& line) const;
  // While a selection holding both its ends is dragged, the points follow the nodes.
  void beginCarry();
  void endCarry();

 private:
  void rebuildPointItems();
  NodeItem *from_, *to_;
  int fromPort_, toPort_;
  core::GraphConnection conn_;
  QColor color_;
  QPainterPath path_;
  mutable QPainterPath shape_;
  QRectF bounds_;
  QList<QPointF> points_;
  bool carrying_ = false;
  QList<QPointF> carryBase_;
  QPointF carryAnchor_;
};

// A reroute point: a dot on its wire. Drag it to bend the wire; double-click it to remove it (the scene
// handles the double-click).
class RerouteItem : public QGraphicsItem {
 public:
  enum { Type = UserType + 4 };
  // The dot of `wire`'s point `index`, a child of the wire, drawn in the wire's `color`.
  RerouteItem(WireItem* wire, int index, QColor color);
  int type() const override { return Type; }
  WireItem* wire() const { return wire_; }
  int index() const { return index_; }
  QRectF boundingRect() const override { return QRectF(-6, -6, 12, 12); }
  void paint(QPainter* p, const QStyleOptionGraphicsItem* option, QWidget* widget) override;

 protected:
  void mousePressEvent(QGraphicsSceneMouseEvent* e) override;
  void mouseMoveEvent(QGraphicsSceneMouseEvent* e) override;
  // Writes the moved point to the document, one undo step per drag.
  void mouseReleaseEvent(QGraphicsSceneMouseEvent* e) override;

 private:
  WireItem* wire_;
  int index_;
  QColor color_;
  QPointF grab_;  // the press position relative to the dot's centre
  bool dragged_ = false;
};

}  // namespace gn::editor
