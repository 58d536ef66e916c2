// The layered layout of graphs that arrive without positions (core/layered_layout.h): every wire points
// right within a band, no two nodes share a place, a branch's two paths get their own rows without
// crossing, and a long chain (an imported ResNet-18's 50 columns) wraps into bands that keep about the
// aspect asked for instead of one line too thin to read when framed.
#include <QSet>
#include <QTest>

#include "gpunodes/core/layered_layout.h"

using namespace gn::core;

namespace {

QList<QString> chain(int n, QList<QPair<QString, QString>>& wires) {
  QList<QString> ids;
  for (int i = 0; i < n; ++i) {
    ids.append(QStringLiteral("n%1").arg(i));
    if (i > 0) wires.append({ids[i - 1], ids[i]});
  }
  return ids;
}

QRectF bounds(const QHash<QString, QPointF>& at) {
  QRectF r;
  for (const QPointF& p : at) r = r.united(QRectF(p, QSizeF(1, 1)));
  return r;
}

}  // namespace

class TestLayeredLayout : public QObject {
  Q_OBJECT
 private slots:
  void aShortChainIsOneRowPointingRight() {
    QList<QPair<QString, QString>> wires;
    const QList<QString> ids = chain(4, wires);
    const auto at = layeredLayout(ids, wires);
    for (const auto& [from, to] : wires) {
      QCOMPARE(at[to].y(), at[from].y());
      QCOMPARE(at[to].x() - at[from].x(), LayeredLayoutOptions().columnWidth);
    }
  }

  void aLongChainWrapsIntoBandsOfTheAspectAskedFor() {
    QList<QPair<QString, QString>> wires;
    const QList<QString> ids = chain(50, wires);
    const LayeredLayoutOptions o;
    const auto at = layeredLayout(ids, wires, o);
    const QRectF box = bounds(at);
    const double aspect = (box.width() + o.columnWidth) / (box.height() + 2 * o.rowHeight);
    QVERIFY2(aspect > o.aspect / 2 && aspect < o.aspect * 2, qPrintable(QString::number(aspect)));
    QSet<QPair<double, double>> places;
    int wraps = 0;
    for (const QPointF& p : at) places.insert({p.x(), p.y()});
    QCOMPARE(places.size(), ids.size());
    for (const auto& [from, to] : wires) {
      if (at[to].y() == at[from].y()) {
        QCOMPARE(at[to].x() - at[from].x(), o.columnWidth);  // within a band: the next column
      } else {
        ++wraps;  // to the next band: its first column, below
        QCOMPARE(at[to].x(), 0.0);
        QVERIFY(at[to].y() > at[from].y());
      }
    }
    QVERIFY(wraps >= 2);
    // Asked for no bands: one line, as long as the chain.
    const auto line = layeredLayout(ids, wires, {.aspect = 0});
    QCOMPARE(bounds(line).height(), 1.0);
  }

  void aBranchTakesTwoRowsWithoutCrossing() {
    // in -> a -> b -> add, in -> c -> add, and a second diamond after it.
    const QList<QString> ids{"in", "a", "b", "c", "add", "d", "e", "out"};
    const QList<QPair<QString, QString>> wires{{"in", "a"}, {"a", "b"},  {"b", "add"}, {"in", "c"},
                                               {"c", "add"}, {"add", "d"}, {"add", "e"}, {"d", "out"},
                                               {"e", "out"}};
    const auto at = layeredLayout(ids, wires);
    QCOMPARE(layoutCrossings(at, wires), 0);
    QVERIFY(at["a"].y() != at["c"].y());
    QVERIFY(at["d"].y() != at["e"].y());
    for (const auto& [from, to] : wires) QVERIFY(at[to].x() > at[from].x());
  }
};

QTEST_GUILESS_MAIN(TestLayeredLayout)
#include "test_layered_layout.moc"
