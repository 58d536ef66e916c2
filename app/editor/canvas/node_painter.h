// Draws a node from its item's state and geometry, at three levels of detail, in the colours of style.h.
// Include (in the .cpp): node_item.h, graph_scene.h (which ports a wire drag dims), wire_item.h (the bypass
// curve), style.h, Qt Gui. Must not include the view, the wire-drag controller or the actions, and must not
// lay out or shape text (NodeGeometry did) nor change the item.
#pragma once
#include <QtGlobal>

class QPainter;
class QStyleOptionGraphicsItem;

namespace gn::editor {

class NodeItem;

// Zoom levels where the canvas drops detail. Below kLodSimple a node is a coloured box: text would be
// unreadable and costs most of the frame. Below kLodNoDetail it keeps its port dots but loses text and
// antialiasing. Wires and comment frames follow the same levels.
inline constexpr qreal kLodSimple = 0.4, kLodNoDetail = 0.65;

class NodePainter {
 public:
  // Paints `node` with `p` (item coordinates), at the detail `option`'s transform allows.
  static void paint(QPainter* p, const QStyleOptionGraphicsItem* option, const NodeItem& node);

 private:
  // The zoomed-out node: its outline and title bar, without antialiasing.
  static void paintBox(QPainter* p, const NodeItem& node);
  // Zoomed out, where the header's text is too small to read: the node's id across its body, in a font
  // that stays about 11 px on screen, so that a framed big graph (an imported ResNet) still names its nodes.
  static void paintOverviewLabel(QPainter* p, const NodeItem& node, qreal lod);
  static void paintHeader(QPainter* p, const NodeItem& node);
  static void paintPorts(QPainter* p, const NodeItem& node);
  static void paintSummary(QPainter* p, const NodeItem& node);
  static void paintRunMarks(QPainter* p, const NodeItem& node, bool hasErrors);
};

}  // namespace gn::editor
