// A layered drawing of a graph, left to right, for graphs that arrive without positions (an imported model):
// each node in the column of its longest path from a source (so every wire points right), and within a
// column an order that reduces crossings (barycentre sweeps, after Sugiyama et al.). A pure function of the
// nodes and wires, shared by the CLI and the editor. A long chain (a ResNet-18 is 50 columns and 3 rows) is
// wrapped into bands read like lines of text, so that the whole drawing keeps a screen's proportions and
// stays readable when framed.
#pragma once
#include <QHash>
#include <QList>
#include <QPair>
#include <QPointF>
#include <QString>

namespace gn::core {

class GraphDocument;

struct LayeredLayoutOptions {
  double columnWidth = 220;  // from one column's left edge to the next
  double rowHeight = 140;    // from one node's top to the next in a column
  int sweeps = 8;            // barycentre passes (each one down and one up)
  double aspect = 1.6;       // the width : height the bands aim at; 0 keeps every column in one band
};

// The top-left of every node in `ids`, given the wires (from, to) between them; a wire to or from an id not
// listed is ignored, and so is a wire closing a cycle (its target keeps the rank it had).
QHash<QString, QPointF> layeredLayout(const QList<QString>& ids, const QList<QPair<QString, QString>>& wires,
                                      const LayeredLayoutOptions& options = {});
// The same for a document's nodes and connections; sets every node's position.
void applyLayeredLayout(GraphDocument& doc, const LayeredLayoutOptions& options = {});
// Crossings between neighbouring columns of one band of a layout as layeredLayout makes it (for tests and for
// choosing).
int layoutCrossings(const QHash<QString, QPointF>& positions, const QList<QPair<QString, QString>>& wires);

}  // namespace gn::core
