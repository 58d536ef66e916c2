// Networks drawn from layer nodes, in the editor with the real node plugin: shapes and parameter counts on
// the nodes as they are edited, shape errors on the node and in the log, the Network's layer table in the
// inspector, and the Layers category in the palette, the Tab search and a Layer wire dropped on nothing.
#include <QLineEdit>
#include <QListWidget>
#include <QSpinBox>
#include <QTableWidget>
#include <QTreeWidget>
#include <QUndoStack>

#include "editor_test_util.h"
#include "gpunodes/core/registry.h"
#include "graph_editor.h"
#include "inspector.h"
#include "main_window.h"
#include "node_search.h"
#include "palette.h"
#include "style.h"

using namespace gn;
using editor::GraphView;
using editor::MainWindow;
using editor::NodeItem;

class TestLayersEditor : public QObject {
  Q_OBJECT
  testing::IsolatedEnv env_;
  core::NodeTypeRegistry registry_;
  std::unique_ptr<MainWindow> w_;

  GraphView* view() { return w_->view(); }
  QWidget* vp() { return w_->view()->viewport(); }
  editor::GraphEditor* ed() { return w_->editor(); }
  core::GraphDocument* doc() { return w_->document(); }
  NodeItem* item(const QString& id) { return w_->scene()->nodeItem(id); }
  QString facts(const QString& id) { return item(id) ? item(id)->factsText() : QString("(no such node)"); }

  void openLenet() {
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/lenet-layers.json"));
    // Close enough that the nodes take clicks and drags where the test aims them.
    view()->setZoom(1);
    view()->centerOnNode("pool2");
  }
  QPoint nodeTitle(const QString& id) {
    NodeItem* n = item(id);
    return testing::viewPoint(view(), n->mapToScene(QPointF(n->boundingRect().width() / 2, 12)));
  }
  void click(const QString& id) {
    view()->centerOnNode(id);
    QTest::mouseClick(vp(), Qt::LeftButton, {}, nodeTitle(id));
  }
  bool connected(const QString& from, const QString& to) {
    return doc()->connections().contains(
        core::GraphConnection{*core::Endpoint::parse(from), *core::Endpoint::parse(to), {}});
  }
  int logLinesWith(const QString& node, const QString& text) {
    int n = 0;
    for (int i = 0; i < w_->log()->count(); ++i) {
      const QListWidgetItem* it = w_->log()->item(i);
      n += it->data(Qt::UserRole).toString() == node && it->text().contains(text);
    }
    return n;
  }
  // Layer node types other than Network: the layers a drawn network is made of.
  int layerNodes() {
    int n = 0;
    for (const core::GraphNode& g : doc()->nodes()) {
      const core::NodeTypeSpec* s = ed()->specOf(g.id);
      n += s && s->category == "Layers" && s->name != "Network";
    }
    return n;
  }
  bool takesLayer(const QString& type) {
    const core::NodeTypePtr t = registry_.find(type);
    if (!t) return false;
    for (const core::PortSpec& p : t->spec().inputs)
      if (p.type == core::PortType::Layer) return true;
    return false;
  }

 private slots:
  void initTestCase() { GN_REQUIRE_NODES_PLUGIN(registry_); }

  void init() {
    w_ = testing::discardingWindow(&registry_);
    w_->activateWindow();
    QVERIFY(QTest::qWaitForWindowExposed(w_.get()));
  }
  void cleanup() { w_.reset(); }

  void shapesShowOnTheNodesWhenAFileOpens() {
    openLenet();
    QVERIFY2(facts("conv1").startsWith(QString::fromUtf8("6×28×28")), qPrintable(facts("conv1")));
    QVERIFY2(facts("conv1").contains("156 params"), qPrintable(facts("conv1")));
    QVERIFY2(facts("pool2").startsWith(QString::fromUtf8("16×5×5")), qPrintable(facts("pool2")));
    QCOMPARE(facts("flat"), QString("400"));
    QVERIFY2(facts("net").startsWith("61,706 params"), qPrintable(facts("net")));
    // Nodes that are not layers have nothing to show.
    QCOMPARE(facts("train"), QString());
    // Drawn whole: wrapped at its separators to the node's width, never cut short with an ellipsis.
    for (const QString id : {"conv1", "conv2", "fc1", "net"}) {
      const QStringList lines = item(id)->factsLines();
      QVERIFY2(!lines.isEmpty(), qPrintable(id));
      QCOMPARE(lines.join(QString::fromUtf8(" · ")), facts(id));
    }
    QVERIFY(item("net")->factsLines().size() > 1);
    // The line makes room for itself: the node is taller than the same node without facts.
    const qreal withFacts = item("conv1")->boundingRect().height();
    item("conv1")->setFacts({});
    QVERIFY(item("conv1")->boundingRect().height() < withFacts);
  }

  void editsRefreshTheShapes() {
    openLenet();
    // A param edit in the inspector: conv2's 16 filters become 8, and everything downstream follows.
    click("conv2");
    QCOMPARE(w_->inspector()->currentNode(), QString("conv2"));
    auto* spin = qobject_cast<QSpinBox*>(w_->inspector()->editorFor("out_channels"));
    QVERIFY(spin);
    QCOMPARE(spin->value(), 16);
    spin->setFocus();
    spin->selectAll();
    QTest::keyClicks(spin, "8");
    QTest::keyClick(spin, Qt::Key_Return);
    QCOMPARE(doc()->node("conv2")->params.value("out_channels").toInt(), 8);
    QTRY_VERIFY2(facts("pool2").startsWith(QString::fromUtf8("8×5×5")), qPrintable(facts("pool2")));
    QVERIFY2(facts("conv2").contains("1,208 params"), qPrintable(facts("conv2")));
    QCOMPARE(facts("flat"), QString("200"));
    // 156 + 1,208 + (200·120 + 120) + 10,164 + 850.
    QVERIFY2(facts("net").startsWith("36,498 params"), qPrintable(facts("net")));
    QCOMPARE(w_->inspector()->factsText(), facts("conv2"));

    ed()->undoStack()->undo();
    QTRY_VERIFY2(facts("pool2").startsWith(QString::fromUtf8("16×5×5")), qPrintable(facts("pool2")));

    // A removed wire: what lies downstream has no shape any more, and shows none.
    ed()->disconnect({{"pool2", "out"}, {"flat", "in"}, {}});
    QVERIFY(!connected("pool2.out", "flat.in"));
    QTRY_COMPARE(facts("flat"), QString());
    QCOMPARE(facts("fc1"), QString());
    QCOMPARE(facts("net"), QString());
    QVERIFY(item("flat")->factsLines().isEmpty());
    QVERIFY(!facts("pool2").isEmpty());  // upstream is unaffected

    // A new wire, drawn with the mouse, brings them back.
    view()->centerOnNode("pool2");
    testing::drag(vp(), testing::portPoint(view(), "pool2", true, "out"),
                  testing::portPoint(view(), "flat", false, "in"));
    QVERIFY(connected("pool2.out", "flat.in"));
    QTRY_COMPARE(facts("flat"), QString("400"));
    QVERIFY(facts("net").startsWith("61,706 params"));
  }

  void aConvAfterFlattenIsMarkedAndLogged() {
    openLenet();
    const QString conv = ed()->addNode("Conv2d", item("flat")->pos() + QPointF(0, 160));
    view()->centerOnNode("flat");
    QTest::qWait(20);
    testing::drag(vp(), testing::portPoint(view(), "flat", true, "out"),
                  testing::portPoint(view(), conv, false, "in"));
    QVERIFY(connected("flat.out", conv + ".in"));
    QTRY_VERIFY(!item(conv)->errors().isEmpty());
    const QString error = item(conv)->errors().join("\n");
    QVERIFY2(error.contains("inputs.in"), qPrintable(error));
    QVERIFY2(error.contains("flat input") && error.contains("400"), qPrintable(error));
    QCOMPARE(facts(conv), QString());  // no shape for a layer that cannot be built
    // The log says it once, with the node, however many edits follow while it stands.
    QTRY_COMPARE(logLinesWith(conv, "flat input"), 1);
    ed()->setParam(conv, "out_channels", 32);
    ed()->setParam("fc3", "out_features", 12);
    QTRY_VERIFY(facts("fc3").startsWith("12"));
    QCOMPARE(logLinesWith(conv, "flat input"), 1);
    // An open required input is how a new node starts: marked on it, not announced in the log.
    const QString relu = ed()->addNode("ReLU", {2000, 2000});
    QTRY_VERIFY(!item(relu)->errors().isEmpty());
    QCOMPARE(logLinesWith(relu, "not connected"), 0);
  }

  void theNetworkShowsItsLayerTable() {
    openLenet();
    click("net");
    QCOMPARE(w_->inspector()->currentNode(), QString("net"));
    QTableWidget* table = w_->inspector()->factsTable();
    QVERIFY(table);
    QVERIFY(table->isVisible());
    QCOMPARE(table->columnCount(), 5);
    QCOMPARE(table->horizontalHeaderItem(0)->text(), QString("Layer"));
    // One row per layer drawn, then the Total.
    QCOMPARE(table->rowCount(), layerNodes() + 1);
    QCOMPARE(table->item(1, 0)->text(), QString("conv1"));
    QCOMPARE(table->item(1, 2)->text(), QString::fromUtf8("6×28×28"));
    const int last = table->rowCount() - 1;
    QCOMPARE(table->item(last, 0)->text(), QString("Total"));
    QCOMPARE(table->item(last, 3)->text(), QString("61,706"));
    QVERIFY(table->item(last, 0)->font().bold());
    QVERIFY(!table->item(1, 0)->font().bold());
    // Numbers line up on the right, names on the left.
    QVERIFY(table->item(1, 3)->textAlignment() & Qt::AlignRight);
    QVERIFY(table->item(1, 0)->textAlignment() & Qt::AlignLeft);
    QVERIFY(!(table->item(1, 1)->textAlignment() & Qt::AlignRight));
    QVERIFY(table->editTriggers() == QAbstractItemView::NoEditTriggers);
    QCOMPARE(w_->inspector()->factsText(), facts("net"));
    // It follows edits while the Network stays selected.
    ed()->setParam("fc3", "out_features", 20);
    QTRY_COMPARE(table->item(last, 2)->text(), QString("20"));
    QCOMPARE(w_->inspector()->currentNode(), QString("net"));
    // A node without a table shows none.
    click("train");
    QVERIFY(!w_->inspector()->factsTable() || !w_->inspector()->factsTable()->isVisible());
    QCOMPARE(w_->inspector()->factsText(), QString());
  }

  void theLayersCategoryIsInThePaletteAndSearch() {
    QTreeWidget* tree = w_->palette()->tree();
    QTreeWidgetItem* layers = nullptr;
    QStringList others;
    for (int i = 0; i < tree->topLevelItemCount(); ++i) {
      if (tree->topLevelItem(i)->text(0) == "Layers")
        layers = tree->topLevelItem(i);
      else
        others << tree->topLevelItem(i)->text(0);
    }
    QVERIFY(layers);
    QStringList types;
    for (int i = 0; i < layers->childCount(); ++i) types << layers->child(i)->text(0);
    for (const char* t : {"Input", "Conv2d", "BatchNorm2d", "Flatten", "Linear", "Add", "Concat", "Network"})
      QVERIFY2(types.contains(t), t);
    // Its own colour, in the hue of the Layer wires, and told apart from every other category's.
    const QColor mine = editor::style::categoryColor("Layers");
    const int hueGap = std::abs(mine.hue() - editor::style::portColor(core::PortType::Layer).hue());
    QVERIFY2(qMin(hueGap, 360 - hueGap) < 20, qPrintable(mine.name()));
    for (const QString& c : others) QVERIFY2(editor::style::categoryColor(c) != mine, qPrintable(c));

    // Tab on the canvas opens the search, which finds layer types by name.
    view()->setFocus();
    QTest::mouseMove(vp(), vp()->rect().center());
    QTest::keyClick(vp(), Qt::Key_Tab);
    auto* popup = qobject_cast<editor::NodeSearchPopup*>(QApplication::activePopupWidget());
    QVERIFY(popup);
    auto shown = [popup] {
      QStringList types;
      for (int i = 0; i < popup->list()->count(); ++i)
        if (!popup->list()->item(i)->isHidden())
          types << popup->list()->item(i)->data(Qt::UserRole).toString();
      return types;
    };
    QVERIFY(shown().contains("Conv2d"));
    QTest::keyClicks(popup->searchField(), "batchnorm");
    QVERIFY2(shown().contains("BatchNorm2d") && shown().contains("BatchNorm1d"),
             qPrintable(shown().join(",")));
    QVERIFY(!shown().contains("Conv2d"));
    QTest::keyClicks(popup->searchField(), "2d");
    QCOMPARE(shown().first(), QString("BatchNorm2d"));
    QTest::keyClick(popup->searchField(), Qt::Key_Return);
    QTRY_COMPARE(doc()->nodes().size(), 1);
    QCOMPARE(doc()->nodes().first().type, QString("BatchNorm2d"));
  }

  void aLayerWireDroppedOnNothingOffersLayerTypes() {
    const QString in = ed()->addNode("Input", {0, 0});
    const QString conv = ed()->addNode("Conv2d", {240, 0});
    QVERIFY(ed()->connect({in, "out"}, {conv, "in"}));
    view()->setZoom(1);
    view()->centerOn(300, 100);
    QTest::qWait(20);
    const QPoint from = testing::portPoint(view(), conv, true, "out");
    testing::drag(vp(), from, from + QPoint(220, 140));
    auto* popup = qobject_cast<editor::NodeSearchPopup*>(QApplication::activePopupWidget());
    QVERIFY(popup);
    QStringList offered;
    for (int i = 0; i < popup->list()->count(); ++i)
      offered << popup->list()->item(i)->data(Qt::UserRole).toString();
    for (const QString& t : offered) QVERIFY2(takesLayer(t), qPrintable(t + " takes no Layer"));
    for (const char* t : {"Conv2d", "ReLU", "Flatten", "Add", "Concat", "Network"})
      QVERIFY2(offered.contains(t), t);
    QVERIFY(!offered.contains("Input"));  // it takes nothing
    QVERIFY(!offered.contains("Train"));
    // Every type that takes a Layer is offered.
    int layerTakers = 0;
    for (const core::NodeTypePtr& t : registry_.types()) layerTakers += takesLayer(t->spec().name);
    QCOMPARE(offered.size(), layerTakers);
    QTest::keyClicks(popup->searchField(), "relu");
    QTest::keyClick(popup->searchField(), Qt::Key_Return);
    QTRY_COMPARE(doc()->nodes().size(), 3);
    const QString relu = doc()->nodes().last().id;
    QCOMPARE(doc()->nodes().last().type, QString("ReLU"));
    QVERIFY(connected(conv + ".out", relu + ".in"));
    QTRY_VERIFY2(facts(relu).startsWith(QString::fromUtf8("16×26×26")), qPrintable(facts(relu)));
  }

  // Each problem once on the node: a Linear node with nothing wired has one open required input, and its
  // error list (the tooltip, the strip) names it once.
  void anOpenInputIsListedOnceOnTheNode() {
    const QString lin = ed()->addNode("Linear", {0, 0});
    w_->validateNow();
    const QStringList errors = item(lin)->errors();
    int open = 0;
    for (const QString& e : errors) open += e.contains("required input is not connected");
    QVERIFY2(open == 1, qPrintable(errors.join(" | ")));
    QStringList unique = errors;
    QCOMPARE(unique.removeDuplicates(), qsizetype(0));
  }

  // The title bar is laid out in the fonts it is drawn in from the first paint after a file opens: the
  // id starts after the type's full drawn width ("Model" and "net" ran together until a run laid the titles
  // out again).
  void titlesAndIdsDoNotOverlapWhenAFileOpens() {
    QVERIFY(w_->loadFile(QString(GN_EXAMPLES_DIR) + "/mlp-fashion-mnist.json"));
    QVERIFY(doc()->nodes().size() > 3);
    const QFontMetricsF titleMetrics(editor::canvasFonts().title);
    for (const core::GraphNode& n : doc()->nodes()) {
      const editor::NodeGeometry& g = item(n.id)->geometry();
      QVERIFY2(!g.titleRect().isNull(), qPrintable(n.id));
      const qreal drawn = titleMetrics.horizontalAdvance(g.title().text());
      QVERIFY2(g.titleRect().width() >= drawn - 0.5,
               qPrintable(QString("%1: title laid out %2 wide, drawn %3")
                              .arg(n.id)
                              .arg(g.titleRect().width())
                              .arg(drawn)));
      QVERIFY2(!g.titleRect().intersects(g.idRect()), qPrintable(n.id));
      QVERIFY2(g.idRect().right() <= g.body().right(), qPrintable(n.id));
    }
  }
};

QTEST_MAIN(TestLayersEditor)
#include "test_layers_editor.moc"
