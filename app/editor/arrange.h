// Align and distribute for the canvas's selection: pure functions from node rectangles to new positions, so
// the view, the menus and the tests share one computation.
#pragma once
#include <QHash>
#include <QList>
#include <QPointF>
#include <QRectF>
#include <QString>

namespace gn::editor {

enum class Arrangement {
  AlignLeft,     // every left edge on the leftmost one
  AlignTop,      // every top edge on the topmost one
  AlignHCenter,  // every centre on the vertical line through the selection's centre
  AlignVCenter,  // every centre on the horizontal line through the selection's centre
  DistributeH,   // the nodes starting first and last stay; equal gaps between neighbours, left to right
  DistributeV,   // the nodes starting first and last stay; equal gaps between neighbours, top to bottom
};

inline constexpr Arrangement kArrangements[] = {Arrangement::AlignLeft,    Arrangement::AlignTop,
                                                Arrangement::AlignHCenter, Arrangement::AlignVCenter,
                                                Arrangement::DistributeH,  Arrangement::DistributeV};

// The menu text, which is also the undo step's text.
QString arrangementName(Arrangement a);
// How many nodes it needs: 2 to align, 3 to distribute (two nodes are already evenly spaced).
int arrangementMinimum(Arrangement a);

struct NodeRect {
  QString id;
  QRectF rect;  // the node's body in scene coordinates; its position is the rectangle's top-left
};

// The new top-left of every node, in the order given (ties in a distribution keep that order). Fewer nodes
// than arrangementMinimum() leave them where they are.
QHash<QString, QPointF> arrange(const QList<NodeRect>& nodes, Arrangement a);

}  // namespace gn::editor
