// "The item of type T under this point", the question every gesture on the canvas starts with. Items are
// searched top first (the scene's stacking order), so a node above a wire or a comment frame wins.
// Include: Qt Widgets only. T is a canvas item class with an `enum { Type = ... }` and a matching type().
#pragma once
#include <QGraphicsItem>
#include <QGraphicsScene>
#include <QGraphicsView>
#include <QList>

namespace gn::editor {

// The topmost item of type T in `items`, or null.
template <typename T>
T* firstItemOfType(const QList<QGraphicsItem*>& items) {
  for (QGraphicsItem* item : items)
    if (auto* found = qgraphicsitem_cast<T*>(item)) return found;
  return nullptr;
}

// The topmost item of type T at `scenePos` in `scene`, or null.
template <typename T>
T* itemAt(const QGraphicsScene* scene, QPointF scenePos) {
  return firstItemOfType<T>(scene->items(scenePos));
}

// The topmost item of type T under the viewport pixel `viewportPos` of `view`, or null. The view's own
// lookup, which tests the pixel's whole area at the view's zoom, not one scene point.
template <typename T>
T* itemAt(const QGraphicsView* view, QPoint viewportPos) {
  return firstItemOfType<T>(view->items(viewportPos));
}

}  // namespace gn::editor
