// Where everything on a node goes: its size, its title bar, its ports and the lines of text under them. The
// node item feeds it what the node shows (NodeContent) and asks it for rectangles; the painter draws what it
// laid out. Text is shaped here, once per change, never while painting.
// Include: Qt Gui, gpunodes/core and graph_editor.h (NodePorts). Must not include the scene, the view or any
// other canvas item: the geometry knows nothing about the document or the mouse.
#pragma once
#include <QFont>
#include <QFontMetricsF>
#include <QList>
#include <QPainterPath>
#include <QRectF>
#include <QStaticText>
#include <QStringList>
#include <optional>

#include "graph_editor.h"

namespace gn::editor {

// Node metrics in scene units: the title bar, the first port row's top, one port row, one param line, one
// facts line, the error strip at the bottom, a port dot's radius and the collapse toggle's side.
inline constexpr qreal kNodeHeader = 26, kNodePortTop = 32, kNodePortRow = 20, kNodeSummaryRow = 15,
                       kNodeFactRow = 15, kNodeErrorStrip = 18, kPortRadius = 5, kNodeToggle = 14;

// The fonts of the canvas's text and their metrics: the title bar's, port labels' and facts', and the small
// one of ids, params, badges and error lines. Made once, from the application's font.
struct CanvasFonts {
  QFont title, body, small;
  QFontMetricsF titleMetrics, bodyMetrics, smallMetrics;
  CanvasFonts(const QFont& t, const QFont& b, const QFont& s);
};
const CanvasFonts& canvasFonts();

// `text` cut to `max` characters with an ellipsis: a hostile file's 10 MB param or type name would otherwise
// be shaped whole on every layout, which takes seconds.
QString clippedText(const QString& text, qsizetype max = 160);
// Plain text cached for drawing, laid out in the painter's font when first drawn; measure it with the
// font's metrics, not size().
QStaticText staticText(const QString& text);

// What a node shows, as the layout needs it.
struct NodeContent {
  QString typeName;          // already clipped
  QString id;                // already clipped
  NodePorts ports;           // in the order they are drawn
  QStringList summaryLines;  // "name  value" per param (three at most), or why there are none
  QString facts;             // what validation learned, " · "-separated; empty for none
  QString firstError;        // the error shown in the strip at the bottom; empty for none
  qreal previewHeight = 0;   // the run preview's height; 0 for none
  bool collapsed = false;    // only the title bar
};

class NodeGeometry {
 public:
  struct PortHit {
    bool output;
    int index;
  };

  // Lays out the whole node for `content`, the title bar for `badge` (see layoutHeader).
  void layout(const NodeContent& content, const QString& badge);
  // Lays out the title bar again for a status badge (empty: none). Beside a badge the type gives way before
  // the id does: runs, the timeline and the log name nodes by id. Shapes text only when the room changes.
  void layoutHeader(const QString& badge);

  QRectF body() const { return body_; }      // the node's outline, item coordinates
  QRectF bounds() const { return bounds_; }  // body plus the port dots that stick out
  const QPainterPath& bodyPath() const { return bodyPath_; }
  const QPainterPath& headerPath() const { return headerPath_; }
  bool collapsed() const { return collapsed_; }

  // A port's centre, item coordinates. A collapsed node's ports all sit at its bar's ends.
  QPointF portPos(bool output, int index) const;
  // The port within `slack` of `itemPos`; none on a collapsed node, where a drag would pick one by chance.
  std::optional<PortHit> portAt(QPointF itemPos, qreal slack) const;
  QRectF collapseToggleRect() const;  // the title bar's ▾/▸ button
  QRectF previewRect() const;         // where the run preview goes; null when none is shown
  QRectF errorStripRect() const;      // the strip at the bottom; null when there is no error
  qreal summaryTop() const;           // the top of the facts band, or of the params when there are no facts

  // The title bar as laid out by layoutHeader: the type (perhaps shortened), the id beside it and the badge.
  const QStaticText& title() const { return shortened_ ? shortTitle_ : fullTitle_; }
  const QStaticText& idText() const { return idText_; }
  QRectF titleRect() const { return titleRect_; }  // empty when the type gave way entirely
  QRectF idRect() const { return idRect_; }
  QRectF badgeRect() const { return badgeRect_; }  // null without a badge
  const QString& badge() const { return badge_; }
  // The width the header's text may use: a badge wider than the whole header still leaves the text under it
  // cut at its edge. Null when nothing needs cutting.
  QRectF headerTextClip() const { return headerTextClip_; }

  const QList<QStaticText>& inputLabels() const { return inLabels_; }
  const QList<QStaticText>& outputLabels() const { return outLabels_; }
  const QList<QStaticText>& summary() const { return summary_; }
  const QList<QStaticText>& factLines() const { return factLines_; }
  const QStaticText& errorLine() const { return errorLine_; }
  bool hasError() const { return hasError_; }

 private:
  int portRows() const;
  QString typeName_;
  QStaticText fullTitle_, shortTitle_, idText_, errorLine_;
  bool shortened_ = false;                                        // the title shows shortTitle_
  qreal shortTitleRoom_ = -1;                                     // the width shortTitle_ was made for
  qreal fullTitleWidth_ = 0, shortTitleWidth_ = 0, idWidth_ = 0;  // as drawn, from the fonts' metrics
  QList<QStaticText> inLabels_, outLabels_, summary_, factLines_;
  int inputs_ = 0, outputs_ = 0;
  bool collapsed_ = false, hasError_ = false;
  QRectF body_, bounds_, titleRect_, idRect_, badgeRect_, headerTextClip_;
  QPainterPath bodyPath_, headerPath_;
  qreal previewTop_ = 0, previewHeight_ = 0;
  QString badge_;
};

}  // namespace gn::editor
