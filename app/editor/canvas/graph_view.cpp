#include "canvas/graph_view.h"

#include <QCursor>
#include <QFileInfo>
#include <QGraphicsLineItem>
#include <QKeyEvent>
#include <QMimeData>
#include <QScrollBar>
#include <QUrl>
#include <QVarLengthArray>
#include <cmath>

#include "canvas/item_at.h"
#include "canvas/wire_drag.h"
#include "find_bar.h"
#include "gpunodes/core/registry.h"
#include "minimap.h"
#include "node_search.h"
#include "style.h"

namespace gn::editor {

using core::Endpoint;

namespace {

// A node dropped or placed at a point has its title bar under it, a little right of its left edge.
const QPointF kGrabOffset(20, 13);
// The room kept between a new node and the nodes around it.
constexpr qreal kNewNodeGap = 30;

}  // namespace

GraphView::GraphView(GraphScene* scene, QWidget* parent) : QGraphicsView(scene, parent), scene_(scene) {
  setObjectName("canvas");
  setRenderHints(QPainter::Antialiasing | QPainter::TextAntialiasing);
  setViewportUpdateMode(SmartViewportUpdate);
  // Items set their own pen, brush, font and hints each paint, so the view need not save and restore them.
  setOptimizationFlags(DontSavePainterState | DontAdjustForAntialiasing);
  setDragMode(RubberBandDrag);
  setRubberBandSelectionMode(Qt::IntersectsItemShape);
  setTransformationAnchor(NoAnchor);
  setResizeAnchor(AnchorViewCenter);
  setHorizontalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setVerticalScrollBarPolicy(Qt::ScrollBarAlwaysOff);
  setFrameShape(QFrame::NoFrame);
  setAcceptDrops(true);
  setFocusPolicy(Qt::StrongFocus);
  setMouseTracking(true);

  wireDrag_ = new WireDragController(scene_, this);
  connect(wireDrag_, &WireDragController::message, this, &GraphView::message);
  findBar_ = new FindBar(this);
  minimap_ = new Minimap(this);
  actions_ = new CanvasActions(this);
  connect(actions_, &CanvasActions::message, this, &GraphView::message);
  connect(actions_, &CanvasActions::runToHereRequested, this, &GraphView::runToHereRequested);
}

void GraphView::resizeEvent(QResizeEvent* e) {
  QGraphicsView::resizeEvent(e);
  if (findBar_->isVisible()) findBar_->place();
}

void GraphView::setZoom(double z) {
  QTransform t;
  t.scale(z, z);
  setTransform(t);
}

void GraphView::zoomAt(double factor, QPoint vp) {
  const double target = qBound(0.05, zoom() * factor, 4.0);
  factor = target / zoom();
  if (std::abs(factor - 1) < 1e-9) return;
  // Keep the scene point under the cursor where it is.
  const QPointF before = mapToScene(vp);
  scale(factor, factor);
  const QPointF delta = mapFromScene(before) - QPointF(vp);
  horizontalScrollBar()->setValue(horizontalScrollBar()->value() + qRound(delta.x()));
  verticalScrollBar()->setValue(verticalScrollBar()->value() + qRound(delta.y()));
}

void GraphView::frame(bool selectionOnly, double maxZoom) {
  QRectF r = selectionOnly ? scene_->nodesRect(true) : QRectF();
  if (r.isNull()) r = scene_->nodesRect(false);
  if (r.isNull()) {
    setZoom(1);
    centerOn(0, 0);
    return;
  }
  r.adjust(-40, -40, 40, 40);
  fitInView(r, Qt::KeepAspectRatio);
  if (zoom() > maxZoom) setZoom(maxZoom);
  if (zoom() < 0.05) setZoom(0.05);
  centerOn(r.center());
}

void GraphView::centerOnNode(const QString& id) {
  if (NodeItem* n = scene_->nodeItem(id)) centerOn(n->sceneBoundingRect().center());
}

void GraphView::ensureNodeVisible(const QString& id) {
  if (NodeItem* n = scene_->nodeItem(id)) ensureVisible(n->sceneBoundingRect(), 20, 20);
}

QSizeF GraphView::newNodeSize(const QString& type) const {
  const core::NodeTypePtr t =
      scene_->editor()->registry() ? scene_->editor()->registry()->find(type) : nullptr;
  if (!t) return QSizeF(200, 110);
  const core::NodeTypeSpec& spec = t->spec();
  NodeContent content;
  content.typeName = clippedText(spec.name, 60);
  content.id = clippedText(scene_->document()->makeId(type), 60);
  content.ports = NodePorts{spec.inputs, spec.outputs, false};
  for (const core::ParamSpec& p : spec.params.mid(0, 3))
    content.summaryLines << QString("%1  %2").arg(p.name, style::formatValue(p.defaultValue));
  // A new node's required inputs are open: validation gives it an error strip.
  content.firstError = QStringLiteral("?");
  NodeGeometry geometry;
  geometry.layout(content, {});
  return geometry.bounds().size();
}

QPointF GraphView::newNodePosition(QSizeF size) const {
  const QPoint cursor = viewport()->mapFromGlobal(QCursor::pos());
  const QRectF visible = mapToScene(viewport()->rect()).boundingRect();
  QPointF at;
  if (viewport()->rect().contains(cursor) && viewport()->isVisible()) {
    at = mapToScene(cursor) - kGrabOffset;
  } else if (const NodeItem* last = scene_->lastAddedNode();
             last && visible.intersects(last->sceneBoundingRect())) {
    // Level with it: its position is its body's corner, which the port dots stick out of.
    at = last->pos() + QPointF(last->sceneBodyRect().width() + kNewNodeGap + 2 * kPortRadius, 0);
  } else {
    at = visible.center() - QPointF(size.width() / 2, size.height() / 2);
  }
  // Down the column from there, then the next column to the right, until the node covers no other one.
  auto free = [&](QPointF topLeft) {
    // The node's bounds start left of and above its position, where the port dots stick out.
    const QRectF bounds(topLeft - QPointF(kPortRadius + 2, 2), size);
    const QRectF wanted =
        bounds.adjusted(-kNewNodeGap / 2, -kNewNodeGap / 2, kNewNodeGap / 2, kNewNodeGap / 2);
    for (QGraphicsItem* i : scene_->items(wanted))
      if (i->type() == NodeItem::Type) return false;
    return true;
  };
  constexpr int kRowsPerColumn = 40, kColumns = 40;
  const qreal rowStep = 20, columnStep = size.width() + kNewNodeGap;
  for (int column = 0; column < kColumns; ++column)
    for (int row = 0; row < kRowsPerColumn; ++row) {
      const QPointF candidate = at + QPointF(column * columnStep, row * rowStep);
      if (free(candidate)) return candidate;
    }
  return at;  // a canvas packed that tightly: on top, rather than nowhere
}

void GraphView::endCut(bool apply) {
  if (!cutLine_) return;
  const QLineF line = cutLine_->line();
  scene_->removeItem(cutLine_);
  delete cutLine_;
  cutLine_ = nullptr;
  if (!apply) return;
  const QList<core::GraphConnection> crossed = scene_->wiresCrossing(line);
  if (!crossed.isEmpty()) scene_->editor()->cutWires(crossed);
}

void GraphView::mousePressEvent(QMouseEvent* e) {
  const QPoint vp = e->position().toPoint();
  // Ctrl+right-drag cuts: every wire the line crosses goes on release (Blender's gesture).
  if (e->button() == Qt::RightButton && (e->modifiers() & Qt::ControlModifier) && !wireDrag_->active()) {
    const QPointF sp = mapToScene(vp);
    cutLine_ = new QGraphicsLineItem(QLineF(sp, sp));
    cutLine_->setPen(QPen(style::kError, 0, Qt::DashLine));
    cutLine_->setZValue(6);
    scene_->addItem(cutLine_);
    viewport()->setCursor(Qt::CrossCursor);
    e->accept();
    return;
  }
  if (e->button() == Qt::MiddleButton || (e->button() == Qt::LeftButton && spaceHeld_)) {
    panning_ = true;
    lastPan_ = vp;
    viewport()->setCursor(Qt::ClosedHandCursor);
    e->accept();
    return;
  }
  if (e->button() == Qt::LeftButton &&
      wireDrag_->pressAt(editor::itemAt<NodeItem>(this, vp), mapToScene(vp))) {
    e->accept();
    return;
  }
  QGraphicsView::mousePressEvent(e);
}

void GraphView::mouseMoveEvent(QMouseEvent* e) {
  if (cutLine_) {
    cutLine_->setLine(QLineF(cutLine_->line().p1(), mapToScene(e->position().toPoint())));
    e->accept();
    return;
  }
  if (panning_) {
    const QPoint d = e->position().toPoint() - lastPan_;
    lastPan_ = e->position().toPoint();
    horizontalScrollBar()->setValue(horizontalScrollBar()->value() - d.x());
    verticalScrollBar()->setValue(verticalScrollBar()->value() - d.y());
    e->accept();
    return;
  }
  if (wireDrag_->active()) {
    wireDrag_->moveTo(mapToScene(e->position().toPoint()), e->globalPosition().toPoint());
    e->accept();
    return;
  }
  QGraphicsView::mouseMoveEvent(e);
}

void GraphView::mouseReleaseEvent(QMouseEvent* e) {
  if (cutLine_ && e->button() == Qt::RightButton) {
    cutLine_->setLine(QLineF(cutLine_->line().p1(), mapToScene(e->position().toPoint())));
    viewport()->unsetCursor();
    endCut(true);
    e->accept();
    return;
  }
  if (panning_ && (e->button() == Qt::MiddleButton || e->button() == Qt::LeftButton)) {
    panning_ = false;
    if (spaceHeld_)
      viewport()->setCursor(Qt::OpenHandCursor);
    else
      viewport()->unsetCursor();
    e->accept();
    return;
  }
  if (wireDrag_->active() && e->button() == Qt::LeftButton) {
    const QPoint vp = e->position().toPoint();
    // A new wire dropped on nothing: the node search, to add a node wired to it.
    if (const auto loose = wireDrag_->releaseAt(mapToScene(vp)))
      openNodeSearch(vp, loose->origin, loose->fromOutput);
    e->accept();
    return;
  }
  QGraphicsView::mouseReleaseEvent(e);
}

void GraphView::wheelEvent(QWheelEvent* e) {
  const int dy = e->angleDelta().y() != 0 ? e->angleDelta().y() : e->angleDelta().x();
  zoomAt(std::pow(1.0015, dy), e->position().toPoint());
  e->accept();
}

void GraphView::keyPressEvent(QKeyEvent* e) {
  if (e->key() == Qt::Key_Space && !e->isAutoRepeat()) {
    spaceHeld_ = true;
    viewport()->setCursor(Qt::OpenHandCursor);
    e->accept();
    return;
  }
  if (e->key() == Qt::Key_Escape && wireDrag_->active()) {
    wireDrag_->cancel();
    e->accept();
    return;
  }
  if (e->key() == Qt::Key_Escape && cutLine_) {
    viewport()->unsetCursor();
    endCut(false);
    e->accept();
    return;
  }
  QGraphicsView::keyPressEvent(e);
}

void GraphView::keyReleaseEvent(QKeyEvent* e) {
  if (e->key() == Qt::Key_Space && !e->isAutoRepeat()) {
    spaceHeld_ = false;
    if (!panning_) viewport()->unsetCursor();
    e->accept();
    return;
  }
  QGraphicsView::keyReleaseEvent(e);
}

void GraphView::focusOutEvent(QFocusEvent* e) {
  spaceHeld_ = false;
  QGraphicsView::focusOutEvent(e);
}

void GraphView::drawBackground(QPainter* p, const QRectF& rect) {
  p->fillRect(rect, style::kCanvasBackground);
  p->setRenderHint(QPainter::Antialiasing, false);
  const double z = zoom();
  // Grid lines closer than 10 px on screen are noise (and cost): skip that level.
  for (const auto& [step, color] :
       {std::pair{20.0, style::kGridMinor}, std::pair{100.0, style::kGridMajor}}) {
    if (step * z < 10) continue;
    QVarLengthArray<QLineF, 512> lines;
    const double left = std::floor(rect.left() / step) * step, top = std::floor(rect.top() / step) * step;
    for (double x = left; x < rect.right(); x += step) lines.append(QLineF(x, rect.top(), x, rect.bottom()));
    for (double y = top; y < rect.bottom(); y += step) lines.append(QLineF(rect.left(), y, rect.right(), y));
    p->setPen(QPen(color, 0));
    p->drawLines(lines.data(), int(lines.size()));
  }
}

QString GraphView::droppedFile(const QMimeData* mime) const {
  for (const QUrl& url : mime->urls())
    if (url.isLocalFile() &&
        droppableSuffixes_.contains(QFileInfo(url.toLocalFile()).suffix(), Qt::CaseInsensitive))
      return url.toLocalFile();
  return {};
}

bool GraphView::droppable(const QMimeData* mime) const {
  return mime->hasFormat(kNodeTypeMime) || mime->hasFormat(kBlockMime) || !droppedFile(mime).isEmpty();
}

void GraphView::dragEnterEvent(QDragEnterEvent* e) {
  if (droppable(e->mimeData()))
    e->acceptProposedAction();
  else
    QGraphicsView::dragEnterEvent(e);
}

void GraphView::dragMoveEvent(QDragMoveEvent* e) {
  if (droppable(e->mimeData()))
    e->acceptProposedAction();
  else
    QGraphicsView::dragMoveEvent(e);
}

void GraphView::dropEvent(QDropEvent* e) {
  if (!droppable(e->mimeData())) {
    QGraphicsView::dropEvent(e);
    return;
  }
  const QPointF sp = mapToScene(e->position().toPoint()) - kGrabOffset;
  if (const QString file = droppedFile(e->mimeData()); !file.isEmpty()) {
    e->acceptProposedAction();
    // After the drop returns: the import asks questions, and a file manager waits for the drop to end.
    QMetaObject::invokeMethod(this, [this, file] { emit fileDropped(file); }, Qt::QueuedConnection);
    return;
  }
  if (e->mimeData()->hasFormat(kBlockMime)) {
    emit blockDropped(QString::fromUtf8(e->mimeData()->data(kBlockMime)), sp);
  } else {
    const QString id = scene_->editor()->addNode(QString::fromUtf8(e->mimeData()->data(kNodeTypeMime)), sp);
    scene_->selectNodes({id});
  }
  e->acceptProposedAction();
  setFocus();
}

QWidget* GraphView::openNodeSearch(QPoint vp, std::optional<Endpoint> dragged, bool draggedIsOutput) {
  GraphEditor* ed = scene_->editor();
  QList<NodeSearchPopup::Entry> entries;
  std::optional<core::PortType> draggedType;
  if (dragged) {
    const NodePorts ports = ed->portsOf(dragged->node);
    for (const core::PortSpec& p : draggedIsOutput ? ports.outputs : ports.inputs)
      if (p.name == dragged->port) draggedType = p.type;
  }
  if (ed->registry())
    for (const core::NodeTypePtr& t : ed->registry()->types()) {
      const core::NodeTypeSpec& s = t->spec();
      if (dragged) {
        bool ok = false;
        if (draggedType)
          for (const core::PortSpec& p : draggedIsOutput ? s.inputs : s.outputs)
            ok = ok || (draggedIsOutput ? core::portAccepts(p.type, *draggedType)
                                        : core::portAccepts(*draggedType, p.type));
        if (!ok) continue;
      }
      entries << NodeSearchPopup::Entry{s.name, s.category, s.description};
    }
  const QString heading = dragged && draggedType
                              ? QString("Nodes that %1 a %2")
                                    .arg(draggedIsOutput ? "take" : "give", core::portTypeName(*draggedType))
                              : QString();
  auto* popup = new NodeSearchPopup(entries, heading, this);
  const QPointF sp = mapToScene(vp);
  connect(popup, &NodeSearchPopup::chosen, this, [this, sp, dragged, draggedIsOutput](const QString& type) {
    GraphEditor* ed = scene_->editor();
    QString id;
    if (dragged)
      id = ed->addNodeWired(type, draggedIsOutput ? sp - QPointF(0, 20) : sp - QPointF(190, 20), *dragged,
                            draggedIsOutput);
    else
      id = ed->addNode(type, sp - kGrabOffset);
    if (!id.isEmpty()) scene_->selectNodes({id});
    setFocus();
  });
  popup->popup(viewport()->mapToGlobal(vp));
  return popup;
}

void GraphView::contextMenuEvent(QContextMenuEvent* e) {
  // A Ctrl+right press starts a cut, not a menu.
  if (e->reason() == QContextMenuEvent::Mouse && ((e->modifiers() & Qt::ControlModifier) || cutLine_)) {
    e->accept();
    return;
  }
  actions_->execContextMenu(e);
}

}  // namespace gn::editor
