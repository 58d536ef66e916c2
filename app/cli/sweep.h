// `gpunodes sweep`: every point of a parameter grid, one run each, spread over the ranks under mpirun, with a
// report per point, a summary (JSON and CSV) and a plot per final metric (docs/cli.md#gpunodes-sweep).
#pragma once
#include <QJsonValue>
#include <QList>
#include <QString>

namespace gn::cli {

// Runs `gpunodes sweep ...` from the process's own argv: the sweep makes its own application object (a
// QApplication in a GUI build, for the plots), so runCommand hands it over before making one.
int commandSweep(int argc, char** argv);

// One --grid: a param and its values, in the order given.
struct SweepAxis {
  QString name;  // "train.lr"
  QList<QJsonValue> values;
};
// One point that has the metric: the index of its value on each axis, and the metric's value there.
struct SweepPlotPoint {
  QList<int> at;
  double value = 0;
};

// Whether this build can draw plots (QCustomPlot comes with the GUI build).
bool sweepCanPlot();
// The metric against the first axis, one line per combination of the other axes; writes a PNG to path.
// Returns the problem, empty on success.
QString writeSweepPlot(const QString& path, const QString& metric, const QList<SweepAxis>& axes,
                       const QList<SweepPlotPoint>& points);

}  // namespace gn::cli
