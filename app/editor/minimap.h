// A minimap in the canvas corner: every node as a small box and the visible area as a frame. Click or drag
// in it to move the view. It paints from the scene's node rectangles, so it costs one rect per node.
#pragma once
#include <QTimer>
#include <QWidget>

namespace gn::editor {

class GraphView;

class Minimap : public QWidget {
  Q_OBJECT
 public:
  explicit Minimap(GraphView* view);
  void scheduleUpdate() { refresh_.start(); }

 protected:
  void paintEvent(QPaintEvent*) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;

 private:
  QRectF world() const;  // what the minimap shows, in scene coordinates
  QTransform toMap(const QRectF& world) const;
  void centerAt(QPoint p);
  GraphView* view_;
  QTimer refresh_;
  QRectF dragWorld_;  // fixed while dragging, so the map does not slide under the cursor
};

}  // namespace gn::editor
