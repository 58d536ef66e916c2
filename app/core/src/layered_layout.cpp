#include "gpunodes/core/layered_layout.h"

#include <QSet>
#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "gpunodes/core/graph_document.h"

namespace gn::core {

namespace {

struct Layering {
  QList<QList<int>> columns;        // node indices per rank, in their order within the column
  QList<QList<int>> preds, succs;   // wires kept (cycles broken), by node index
};

Layering layer(const QList<QString>& ids, const QList<QPair<QString, QString>>& wires) {
  QHash<QString, int> index;
  for (int i = 0; i < ids.size(); ++i) index.insert(ids[i], i);
  Layering l;
  l.preds.resize(ids.size());
  l.succs.resize(ids.size());
  QSet<QPair<int, int>> seen;
  for (const auto& [from, to] : wires) {
    const int a = index.value(from, -1), b = index.value(to, -1);
    if (a < 0 || b < 0 || a == b || seen.contains({a, b})) continue;
    seen.insert({a, b});
    l.succs[a].append(b);
    l.preds[b].append(a);
  }
  // Kahn's order; what a cycle leaves unordered is taken in document order with its wires into it from
  // unplaced nodes dropped, so every node gets a rank.
  QList<int> indegree(ids.size()), rank(ids.size(), 0);
  for (int i = 0; i < ids.size(); ++i) indegree[i] = l.preds[i].size();
  QList<bool> placed(ids.size(), false);
  QList<int> ready;
  for (int i = 0; i < ids.size(); ++i)
    if (indegree[i] == 0) ready.append(i);
  int done = 0, next = 0;
  while (done < ids.size()) {
    if (ready.isEmpty()) {
      while (placed[next]) ++next;
      ready.append(next);
      // The wires from nodes not yet placed close a cycle: drop them.
      QList<int> kept;
      for (int p : l.preds[next])
        if (placed[p]) kept.append(p);
        else l.succs[p].removeAll(next);
      l.preds[next] = kept;
    }
    const int v = ready.takeFirst();
    if (placed[v]) continue;
    placed[v] = true;
    ++done;
    for (int p : l.preds[v]) rank[v] = std::max(rank[v], rank[p] + 1);
    for (int s : l.succs[v])
      if (--indegree[s] == 0 && !placed[s]) ready.append(s);
  }
  const int columns = ids.isEmpty() ? 0 : *std::max_element(rank.begin(), rank.end()) + 1;
  l.columns.resize(columns);
  for (int i = 0; i < ids.size(); ++i) l.columns[rank[i]].append(i);
  return l;
}

// Orders each column by the mean position of its neighbours in the columns already ordered (the left ones
// on a sweep down, the right ones on a sweep up); a node without such neighbours keeps its place.
void sweep(Layering& l, QList<double>& pos, bool down) {
  const int n = l.columns.size();
  for (int k = 0; k < n; ++k) {
    QList<int>& col = l.columns[down ? k : n - 1 - k];
    QList<QPair<double, int>> keyed;
    for (int i = 0; i < col.size(); ++i) {
      const QList<int>& nb = down ? l.preds[col[i]] : l.succs[col[i]];
      double sum = 0;
      for (int m : nb) sum += pos[m];
      keyed.append({nb.isEmpty() ? pos[col[i]] : sum / nb.size(), col[i]});
    }
    std::stable_sort(keyed.begin(), keyed.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (int i = 0; i < col.size(); ++i) {
      col[i] = keyed[i].second;
      pos[col[i]] = i - (col.size() - 1) / 2.0;
    }
  }
}

int crossings(const Layering& l, const QList<double>& pos, const QList<int>& rankOf) {
  // Only wires between the same two columns can cross here: group them, so a long chain costs little.
  QHash<QPair<int, int>, QList<QPair<int, int>>> groups;
  for (int a = 0; a < l.succs.size(); ++a)
    for (int b : l.succs[a]) groups[{rankOf[a], rankOf[b]}].append({a, b});
  int count = 0;
  for (const QList<QPair<int, int>>& edges : groups)
    for (int i = 0; i < edges.size(); ++i)
      for (int j = i + 1; j < edges.size(); ++j)
        if ((pos[edges[i].first] - pos[edges[j].first]) * (pos[edges[i].second] - pos[edges[j].second]) < 0)
          ++count;
  return count;
}

}  // namespace

QHash<QString, QPointF> layeredLayout(const QList<QString>& ids, const QList<QPair<QString, QString>>& wires,
                                      const LayeredLayoutOptions& options) {
  Layering l = layer(ids, wires);
  QList<double> pos(ids.size(), 0);
  QList<int> rankOf(ids.size(), 0);
  for (int r = 0; r < l.columns.size(); ++r)
    for (int i = 0; i < l.columns[r].size(); ++i) {
      pos[l.columns[r][i]] = i - (l.columns[r].size() - 1) / 2.0;
      rankOf[l.columns[r][i]] = r;
    }
  // Keep the best ordering the sweeps reach: a later sweep may undo an earlier gain.
  QList<QList<int>> best = l.columns;
  QList<double> bestPos = pos;
  int fewest = crossings(l, pos, rankOf);
  for (int s = 0; s < options.sweeps && fewest > 0; ++s) {
    sweep(l, pos, true);
    sweep(l, pos, false);
    if (const int c = crossings(l, pos, rankOf); c < fewest) {
      fewest = c;
      best = l.columns;
      bestPos = pos;
    }
  }
  // Bands of `perBand` columns, one under the other, once one band would be more than twice as wide as
  // asked: the count whose drawing comes nearest the aspect asked for (compared as a ratio, so too wide and
  // too tall weigh alike). A drawing that fits the proportions roughly stays one line, easier to follow.
  double lowest = 0, highest = 0;
  for (double p : bestPos) lowest = std::min(lowest, p), highest = std::max(highest, p);
  const double bandHeight = (highest - lowest + 2) * options.rowHeight;
  const int ranks = std::max<int>(1, int(best.size()));
  int perBand = ranks;
  if (options.aspect > 0 && ranks * options.columnWidth / bandHeight > 2 * options.aspect) {
    double nearest = std::numeric_limits<double>::max();
    for (int k = 1; k <= ranks; ++k) {
      const int bands = (ranks + k - 1) / k;
      const double off = std::abs(std::log(k * options.columnWidth / (bands * bandHeight) / options.aspect));
      if (off < nearest - 1e-9) nearest = off, perBand = k;
    }
  }
  QHash<QString, QPointF> out;
  for (int r = 0; r < best.size(); ++r)
    for (int v : best[r])
      out.insert(ids[v], QPointF((r % perBand) * options.columnWidth,
                                 (r / perBand) * bandHeight + (bestPos[v] - lowest) * options.rowHeight));
  return out;
}

void applyLayeredLayout(GraphDocument& doc, const LayeredLayoutOptions& options) {
  QList<QString> ids;
  for (const GraphNode& n : doc.nodes()) ids.append(n.id);
  QList<QPair<QString, QString>> wires;
  for (const GraphConnection& c : doc.connections()) wires.append({c.from.node, c.to.node});
  const QHash<QString, QPointF> at = layeredLayout(ids, wires, options);
  for (auto it = at.begin(); it != at.end(); ++it) doc.setPosition(it.key(), it.value());
}

int layoutCrossings(const QHash<QString, QPointF>& positions, const QList<QPair<QString, QString>>& wires) {
  int count = 0;
  for (int i = 0; i < wires.size(); ++i)
    for (int j = i + 1; j < wires.size(); ++j) {
      const QPointF a1 = positions.value(wires[i].first), b1 = positions.value(wires[i].second);
      const QPointF a2 = positions.value(wires[j].first), b2 = positions.value(wires[j].second);
      if (a1.x() != a2.x() || b1.x() != b2.x()) continue;
      if ((a1.y() - a2.y()) * (b1.y() - b2.y()) < 0) ++count;
    }
  return count;
}

}  // namespace gn::core
