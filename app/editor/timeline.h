// The timeline: a Gantt chart of the run's trace spans, one lane per device × stream, coloured by node.
// This is where automatic parallelism and copy/compute overlap become visible. Wheel zooms at the cursor,
// drag pans, double-click fits, hovering a span tells node, op, device, duration and bytes.
#pragma once
#include <QColor>
#include <QHash>
#include <QMap>
#include <QVector>
#include <QWidget>

#include "gpunodes/core/run_events.h"

namespace gn::editor {

class TimelineView : public QWidget {
  Q_OBJECT
 public:
  static constexpr int kRulerHeight = 22;
  explicit TimelineView(QWidget* parent = nullptr);
  void clear();
  void addSpans(const QList<core::TraceSpan>& spans);
  void fit();
  // Colours follow the graph's node order, so neighbouring nodes get clearly different colours.
  void setNodeOrder(const QStringList& ids);
  QColor colorOf(const QString& node) const;
  int spanCount() const { return int(spans_.size()); }  // kept: the newest kKeptRunItems
  qsizetype droppedSpans() const { return droppedSpans_; }
  QStringList laneNames() const;
  const QVector<core::TraceSpan>& spans() const { return spans_; }
  // The span under a widget position, or -1; its tooltip text.
  int spanAt(QPoint pos) const;
  QString describe(int span) const;
  QPoint spanCenter(int span) const;  // for tests: where to hover
  double viewStartUs() const { return t0_; }
  double viewEndUs() const { return t1_; }

 signals:
  void spanClicked(const QString& node);

 protected:
  void paintEvent(QPaintEvent*) override;
  void wheelEvent(QWheelEvent* e) override;
  void mousePressEvent(QMouseEvent* e) override;
  void mouseMoveEvent(QMouseEvent* e) override;
  void mouseReleaseEvent(QMouseEvent* e) override;
  void mouseDoubleClickEvent(QMouseEvent* e) override;
  QSize sizeHint() const override { return {600, 200}; }

 private:
  // Spans that overlap in one lane (a node's ops inside a host wait, a barrier spanning the run) stack in
  // sub-rows instead of hiding each other.
  struct Lane {
    QString name;
    QVector<int> spans;
    QVector<double> rowEnd;  // per sub-row, where its last span ends
  };
  double xOf(double us) const;
  double usOf(double x) const;
  int laneTop(int row) const { return laneTops_.value(row, kRulerHeight); }
  int laneHeight(int lane) const;
  void updateMinimumHeight();

  QVector<core::TraceSpan> spans_;
  qsizetype droppedSpans_ = 0;
  QMap<QString, int> laneIndex_;  // "device\tstream" -> index into lanes_, sorted for display
  QVector<Lane> lanes_;
  QVector<int> laneOrder_;  // display row -> lane
  QVector<int> laneTops_;   // display row -> y
  QVector<int> spanRow_;    // span -> sub-row in its lane
  QHash<QString, QColor> colors_;
  double t0_ = 0, t1_ = 1000, maxEnd_ = 0;
  bool follow_ = true;  // refit as spans arrive until the user zooms or pans
  bool dragging_ = false;
  bool moved_ = false;
  QPoint dragStart_;
  double dragT0_ = 0;
};

}  // namespace gn::editor
