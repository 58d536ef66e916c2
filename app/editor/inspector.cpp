#include "inspector.h"

#include <QCheckBox>
#include <QComboBox>
#include <QDoubleSpinBox>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QLabel>
#include <QLineEdit>
#include <QPushButton>
#include <QRegularExpression>
#include <QSignalBlocker>
#include <QSpinBox>
#include <QTableWidget>
#include <QToolButton>
#include <QVBoxLayout>
#include <climits>
#include <cmath>

#include "gpunodes/core/registry.h"
#include "gpunodes/core/subgraph.h"
#include "graph_editor.h"
#include "style.h"

namespace gn::editor {

using core::ParamSpec;
using core::ParamType;

namespace {

// Shows 0.5 as "0.5", not "0.500000", while still accepting six decimals.
class CompactDoubleSpinBox : public QDoubleSpinBox {
 public:
  QString textFromValue(double v) const override { return locale().toString(v, 'g', 12); }
};

// "4000, 4000", "4000x4000" and "[4000, 4000]" all mean the same shape.
std::optional<QJsonArray> parseShape(const QString& text, QString* error) {
  QString t = text.trimmed();
  if (t.startsWith('[') && t.endsWith(']')) t = t.mid(1, t.size() - 2);
  const QStringList parts = t.split(QRegularExpression("[,x×\\s]+"), Qt::SkipEmptyParts);
  QJsonArray dims;
  for (const QString& p : parts) {
    bool ok = false;
    const qlonglong v = p.toLongLong(&ok);
    if (!ok) {
      *error = QString("'%1' is not a whole number; write dimensions as 4000, 4000").arg(p);
      return std::nullopt;
    }
    dims.append(double(v));
  }
  return dims;
}

QString shapeText(const QJsonValue& v) {
  QStringList parts;
  for (const QJsonValue& d : v.toArray()) parts << QString::number(qint64(d.toDouble()));
  return parts.join(", ");
}

QString shapeInfo(const QJsonValue& v) {
  double n = 1;
  for (const QJsonValue& d : v.toArray()) n *= d.toDouble();
  if (v.toArray().isEmpty()) return "scalar";
  return QString("%1 elements · %2 as float32").arg(QLocale().toString(n, 'f', 0), style::formatBytes(n * 4));
}

}  // namespace

InspectorPanel::InspectorPanel(GraphEditor* editor, QWidget* parent) : QScrollArea(parent), editor_(editor) {
  setObjectName("inspector");
  setWidgetResizable(true);
  // The graph summary (counts, settings) follows edits, coalesced: a paste of hundreds of nodes rebuilds
  // once.
  graphInfo_.setSingleShot(true);
  graphInfo_.setInterval(100);
  connect(&graphInfo_, &QTimer::timeout, this, [this] {
    if (selection_.isEmpty()) rebuild();
  });
  watchDocument();
  rebuild();
}

void InspectorPanel::setEditor(GraphEditor* editor) {
  if (editor == editor_) return;
  // The document of a subgraph level that has closed is gone already (and with it its connections).
  if (watched_) watched_->disconnect(this);
  editor_ = editor;
  watchDocument();
  showNodes({});
}

void InspectorPanel::watchDocument() {
  core::GraphDocument* doc = editor_->document();
  watched_ = doc;
  connect(doc, &core::GraphDocument::subgraphChanged, this, [this](const QString& id) {
    if (id == node_) rebuild();
  });
  connect(doc, &core::GraphDocument::paramsChanged, this, [this](const QString& id) {
    if (id == node_) syncValues();
  });
  connect(doc, &core::GraphDocument::nodeRemoved, this, [this](const QString& id) {
    if (selection_.contains(id)) {
      selection_.removeAll(id);
      showNodes(selection_);
    }
  });
  connect(doc, &core::GraphDocument::reset, this, [this] { showNodes({}); });
  connect(doc, &core::GraphDocument::changed, this, [this] {
    if (selection_.isEmpty()) graphInfo_.start();
  });
}

void InspectorPanel::showNodes(const QStringList& ids) {
  selection_ = ids;
  node_ = ids.size() == 1 ? ids.first() : QString();
  rebuild();
}

QWidget* InspectorPanel::editorFor(const QString& param) const {
  return rows_.value(param).editor;
}

QString InspectorPanel::errorFor(const QString& param) const {
  const Row r = rows_.value(param);
  return r.error && !r.error->isHidden() ? r.error->text() : QString();
}

QString InspectorPanel::factsText() const {
  return factsLabel_ && !factsLabel_->isHidden() ? factsLabel_->text() : QString();
}

void InspectorPanel::setValidation(const core::ValidationReport& report) {
  report_ = report;
  syncValues();
}

void InspectorPanel::commit(const QString& param, const QJsonValue& value) {
  if (!node_.isEmpty()) editor_->setParam(node_, param, value);
}

QWidget* InspectorPanel::makeEditor(const ParamSpec& ps) {
  const QString name = ps.name;
  QWidget* w = nullptr;
  switch (ps.type) {
    case ParamType::Int: {
      const double lo = ps.min.value_or(INT_MIN), hi = ps.max.value_or(INT_MAX);
      if (lo >= INT_MIN && hi <= INT_MAX) {
        auto* s = new QSpinBox;
        s->setRange(int(lo), int(hi));
        s->setKeyboardTracking(false);
        connect(s, &QSpinBox::valueChanged, this, [this, name](int v) { commit(name, v); });
        w = s;
      } else {
        // Past int's range (byte counts, 64-bit seeds): a double spin box with no decimals holds 2^53
        // exactly.
        auto* s = new QDoubleSpinBox;
        s->setDecimals(0);
        s->setRange(lo, hi);
        s->setKeyboardTracking(false);
        connect(s, &QDoubleSpinBox::valueChanged, this, [this, name](double v) { commit(name, v); });
        w = s;
      }
      break;
    }
    case ParamType::Float: {
      auto* s = new CompactDoubleSpinBox;
      s->setDecimals(6);
      s->setRange(ps.min.value_or(-1e15), ps.max.value_or(1e15));
      s->setSingleStep(ps.max && ps.min && *ps.max - *ps.min <= 1 ? 0.01 : 0.1);
      s->setKeyboardTracking(false);
      connect(s, &QDoubleSpinBox::valueChanged, this, [this, name](double v) { commit(name, v); });
      w = s;
      break;
    }
    case ParamType::Bool: {
      auto* c = new QCheckBox;
      connect(c, &QCheckBox::toggled, this, [this, name](bool v) { commit(name, v); });
      w = c;
      break;
    }
    case ParamType::Enum: {
      auto* c = new QComboBox;
      c->addItems(ps.enumValues);
      connect(c, &QComboBox::activated, this, [this, name, c](int) { commit(name, c->currentText()); });
      w = c;
      break;
    }
    case ParamType::String: {
      auto* e = new QLineEdit;
      connect(e, &QLineEdit::editingFinished, this, [this, name, e] { commit(name, e->text()); });
      w = e;
      break;
    }
    case ParamType::Shape: {
      auto* e = new QLineEdit;
      e->setPlaceholderText("e.g. 4000, 4000");
      connect(e, &QLineEdit::editingFinished, this, [this, name, e] {
        QString error;
        const auto dims = parseShape(e->text(), &error);
        Row& r = rows_[name];
        if (!dims) {
          // The document keeps its last good value; the bad text stays in the field, marked.
          r.error->setText(error);
          r.error->show();
          return;
        }
        commit(name, *dims);
      });
      w = e;
      break;
    }
  }
  w->setObjectName("param_" + name);
  w->setToolTip(ps.doc);
  return w;
}

void InspectorPanel::rebuild() {
  rows_.clear();
  innerParams_ = nullptr;
  promoteButton_ = nullptr;
  updateButton_ = nullptr;
  library_ = nullptr;
  nodeErrors_ = nullptr;
  factsLabel_ = nullptr;
  factsTable_ = nullptr;
  shownFacts_ = {};
  content_ = new QWidget;
  auto* v = new QVBoxLayout(content_);
  v->setContentsMargins(8, 8, 8, 8);
  auto* title = new QLabel;
  title->setObjectName("inspectorTitle");
  title->setWordWrap(true);
  auto* doc = new QLabel;
  doc->setObjectName("inspectorDoc");
  doc->setWordWrap(true);
  doc->setTextInteractionFlags(Qt::TextSelectableByMouse);
  v->addWidget(title);
  v->addWidget(doc);

  const core::GraphDocument* gd = editor_->document();
  const core::GraphNode* n = node_.isEmpty() ? nullptr : gd->node(node_);
  if (!n) {
    if (selection_.size() > 1) {
      title->setText(QString("%1 nodes selected").arg(selection_.size()));
      doc->setText("Select one node to edit its params.");
    } else {
      title->setText(gd->name().isEmpty() ? QString("Untitled graph") : gd->name());
      QString text = gd->description().toHtmlEscaped();
      const QJsonObject s = gd->settings();
      text += QString("<br><br>%1 nodes, %2 wires · schedule <b>%3</b> · CPU devices <b>%4</b>")
                  .arg(gd->nodes().size())
                  .arg(gd->connections().size())
                  .arg(s.value("schedule").toString("parallel"))
                  .arg(s.value("cpu_devices").toInt(1));
      text +=
          "<br><br><i>Select a node to edit it. Drag from a port to wire; drop a wire on empty space to "
          "add a node there.</i>";
      doc->setText(text);
    }
    v->addStretch();
    setWidget(content_);
    return;
  }
  const core::NodeTypeSpec* spec = editor_->specOf(node_);
  title->setText(QString("%1 <span style='color:#a0a6ae;font-weight:normal'>%2</span>").arg(node_, n->type));
  doc->setText(spec ? spec->description
                    : QString("No loaded plugin provides the type '%1'. The node is kept "
                              "as it is in the file; the run reports it.")
                          .arg(n->type));
  nodeErrors_ = new QLabel;
  nodeErrors_->setObjectName("nodeErrors");
  nodeErrors_->setWordWrap(true);
  nodeErrors_->hide();
  v->addWidget(nodeErrors_);
  if (spec) {
    auto* form = new QFormLayout;
    form->setLabelAlignment(Qt::AlignRight);
    form->setFieldGrowthPolicy(QFormLayout::AllNonFixedFieldsGrow);
    for (const ParamSpec& ps : spec->params) {
      Row row;
      row.editor = makeEditor(ps);
      row.reset = new QToolButton;
      row.reset->setText("↺");
      row.reset->setToolTip(QString("Reset to the default (%1)").arg(style::formatValue(ps.defaultValue)));
      row.reset->setAutoRaise(true);
      const QString name = ps.name;
      connect(row.reset, &QToolButton::clicked, this,
              [this, name] { commit(name, QJsonValue(QJsonValue::Undefined)); });
      row.error = new QLabel;
      row.error->setObjectName("paramError");
      row.error->setWordWrap(true);
      row.error->hide();
      auto* field = new QWidget;
      auto* fl = new QVBoxLayout(field);
      fl->setContentsMargins(0, 0, 0, 0);
      fl->setSpacing(1);
      auto* line = new QHBoxLayout;
      line->setSpacing(2);
      line->addWidget(row.editor, 1);
      line->addWidget(row.reset);
      fl->addLayout(line);
      if (ps.type == ParamType::Shape) {
        row.info = new QLabel;
        row.info->setObjectName("inspectorDoc");
        fl->addWidget(row.info);
      }
      fl->addWidget(row.error);
      auto* label = new QLabel(ps.name);
      label->setToolTip(ps.doc);
      form->addRow(label, field);
      rows_.insert(ps.name, row);
    }
    v->addLayout(form);
    // What validation learned (shapes, parameter counts), filled by syncFacts as reports arrive: a fix
    // upstream can bring facts to a node that had none when it was selected.
    factsLabel_ = new QLabel;
    factsLabel_->setObjectName("nodeFacts");
    factsLabel_->setWordWrap(true);
    factsLabel_->setTextInteractionFlags(Qt::TextSelectableByMouse);
    factsLabel_->setStyleSheet("color: #f0c8e4; font-weight: bold; padding: 4px 0;");
    factsLabel_->hide();
    v->addWidget(factsLabel_);
    factsTable_ = new QTableWidget;
    factsTable_->setObjectName("factsTable");
    factsTable_->setEditTriggers(QAbstractItemView::NoEditTriggers);
    factsTable_->setSelectionBehavior(QAbstractItemView::SelectRows);
    factsTable_->setWordWrap(false);
    factsTable_->setShowGrid(false);
    factsTable_->setAlternatingRowColors(true);
    // A notch smaller than the panel's text: five columns share the dock's width.
    QFont tableFont = factsTable_->font();
    tableFont.setPointSizeF(tableFont.pointSizeF() - 0.5);
    factsTable_->setFont(tableFont);
    factsTable_->verticalHeader()->hide();
    factsTable_->verticalHeader()->setDefaultSectionSize(QFontMetrics(tableFont).height() + 5);
    factsTable_->horizontalHeader()->setSectionResizeMode(QHeaderView::ResizeToContents);
    factsTable_->horizontalHeader()->setHighlightSections(false);
    factsTable_->horizontalHeader()->setStretchLastSection(true);
    factsTable_->setStyleSheet(
        "QTableWidget { background: #1e2024; alternate-background-color: #24272c;"
        " border: 1px solid #3a3f46; }"
        "QTableWidget::item { padding: 0 3px; }"
        "QHeaderView::section { padding: 2px 3px; }");
    factsTable_->hide();
    v->addWidget(factsTable_, 1);
    // Ports, for reference: what the node takes and gives.
    QStringList ports;
    for (const core::PortSpec& p : spec->inputs)
      ports << QString("in <b>%1</b>: %2%3")
                   .arg(p.name, core::portTypeName(p.type), p.required ? "" : " (optional)");
    for (const core::PortSpec& p : spec->outputs)
      ports << QString("out <b>%1</b>: %2").arg(p.name, core::portTypeName(p.type));
    auto* portLabel = new QLabel(ports.join("<br>"));
    portLabel->setObjectName("inspectorDoc");
    v->addSpacing(6);
    v->addWidget(portLabel);
    if (core::subgraph::isSubgraph(*n)) addSubgraphSection(*n, v);
  }
  v->addStretch();
  setWidget(content_);
  syncValues();
}

void InspectorPanel::addSubgraphSection(const core::GraphNode& n, QVBoxLayout* v) {
  const core::Subgraph& sub = core::subgraph::of(n);
  const QString id = n.id;
  v->addSpacing(6);
  auto* enter = new QPushButton("Edit inside");
  enter->setObjectName("enterSubgraph");
  enter->setToolTip("Open the subgraph's inner graph on the canvas (or double-click the node)");
  connect(enter, &QPushButton::clicked, this, [this, id] { emit enterRequested(id); });
  v->addWidget(enter);

  // The library block this instance came from, and whether the block's file has changed since.
  if (!sub.block.name.isEmpty()) {
    library_ = new QLabel;
    library_->setObjectName("libraryState");
    library_->setWordWrap(true);
    v->addWidget(library_);
    const QList<core::subgraph::LibraryBlock> library = core::subgraph::listLibrary();
    const core::subgraph::LibraryBlock* block = nullptr;
    for (const core::subgraph::LibraryBlock& b : library)
      if (b.name == sub.block.name) block = &b;
    if (!block) {
      library_->setText(
          QString("Block <b>%1</b>: no longer in the library").arg(sub.block.name.toHtmlEscaped()));
    } else if (!core::subgraph::outOfDate(n, library)) {
      library_->setText(
          QString("Block <b>%1</b>: up to date with the library").arg(sub.block.name.toHtmlEscaped()));
    } else {
      library_->setText(
          QString("Block <b>%1</b>: <span style='color:#e0b040'>out of date</span>, the library's "
                  "file has changed since this instance was made")
              .arg(sub.block.name.toHtmlEscaped()));
      updateButton_ = new QPushButton("Update from library");
      updateButton_->setObjectName("updateFromLibrary");
      const core::subgraph::LibraryBlock copy = *block;
      connect(updateButton_, &QPushButton::clicked, this,
              [this, id, copy] { editor_->updateFromLibrary(id, copy); });
      v->addWidget(updateButton_);
    }
  }

  // Promoted params: shown in the form above; each can be taken back off.
  for (const core::PromotedParam& p : sub.promoted) {
    auto* line = new QHBoxLayout;
    auto* label = new QLabel(QString("<b>%1</b> \u2190 %2.%3").arg(p.name, p.node, p.param));
    label->setObjectName("inspectorDoc");
    auto* remove = new QToolButton;
    remove->setText("\u00d7");
    remove->setAutoRaise(true);
    remove->setToolTip(QString("Unpromote %1").arg(p.name));
    const QString name = p.name;
    connect(remove, &QToolButton::clicked, this, [this, id, name] { editor_->unpromote(id, name); });
    line->addWidget(label, 1);
    line->addWidget(remove);
    v->addLayout(line);
  }

  // Every param of the inner nodes, to promote onto the subgraph node.
  innerParams_ = new QComboBox;
  innerParams_->setObjectName("innerParams");
  const core::NodeTypeRegistry* registry = editor_->registry();
  for (const core::GraphNode& inner : sub.nodes) {
    const std::optional<core::NodeTypeSpec> spec =
        registry ? core::subgraph::specOf(inner, *registry) : std::nullopt;
    if (!spec) continue;
    for (const ParamSpec& ps : spec->params) {
      bool promoted = false;
      for (const core::PromotedParam& p : sub.promoted)
        promoted = promoted || (p.node == inner.id && p.param == ps.name);
      if (!promoted) innerParams_->addItem(inner.id + "." + ps.name, QStringList{inner.id, ps.name});
    }
  }
  promoteButton_ = new QPushButton("Promote");
  promoteButton_->setObjectName("promoteParam");
  promoteButton_->setToolTip("Make the inner param a param of this subgraph node");
  promoteButton_->setEnabled(innerParams_->count() > 0);
  connect(promoteButton_, &QPushButton::clicked, this, [this, id] {
    const QStringList target = innerParams_->currentData().toStringList();
    if (target.size() == 2) editor_->promote(id, target[0], target[1]);
  });
  auto* promoteLine = new QHBoxLayout;
  promoteLine->addWidget(innerParams_, 1);
  promoteLine->addWidget(promoteButton_);
  auto* innerLabel = new QLabel("Inner params");
  innerLabel->setObjectName("inspectorDoc");
  v->addWidget(innerLabel);
  v->addLayout(promoteLine);
}

void InspectorPanel::syncFacts() {
  if (!factsLabel_ || !factsTable_) return;
  const core::NodeFacts f = report_.facts().value(node_);
  if (f.badge == shownFacts_.badge && f.columns == shownFacts_.columns && f.rows == shownFacts_.rows) return;
  shownFacts_ = f;
  factsLabel_->setText(f.badge);
  factsLabel_->setVisible(!f.badge.isEmpty());
  const bool table = !f.columns.isEmpty();
  factsTable_->setVisible(table);
  // The table takes the panel's spare height when shown; otherwise the trailing stretch does.
  if (auto* v = qobject_cast<QVBoxLayout*>(content_->layout())) v->setStretch(v->count() - 1, table ? 0 : 1);
  if (!table) {
    factsTable_->clear();
    return;
  }
  const int cols = int(f.columns.size());
  factsTable_->clear();
  factsTable_->setColumnCount(cols);
  factsTable_->setRowCount(int(f.rows.size()));
  factsTable_->setHorizontalHeaderLabels(f.columns);
  // A column of numbers (counts, shapes, FLOPs) is right-aligned so magnitudes line up, as in torchinfo.
  // A row whose first cell is "Total" (the plugin's summary row, as torchinfo's) is set apart, and left
  // out of that test since it may say "21 layers" under "Type".
  auto isTotal = [](const QStringList& r) { return !r.isEmpty() && r.first() == "Total"; };
  QList<bool> numeric(cols, true);
  for (const QStringList& r : f.rows) {
    if (isTotal(r)) continue;
    for (int c = 0; c < cols; ++c)
      if (c < r.size() && !r[c].isEmpty() && !r[c].front().isDigit()) numeric[c] = false;
  }
  QFont bold = factsTable_->font();
  bold.setBold(true);
  for (int i = 0; i < f.rows.size(); ++i) {
    const QStringList& r = f.rows[i];
    const bool total = isTotal(r);
    for (int c = 0; c < cols; ++c) {
      auto* item = new QTableWidgetItem(c < r.size() ? r[c] : QString());
      item->setTextAlignment(Qt::AlignVCenter | (numeric[c] ? Qt::AlignRight : Qt::AlignLeft));
      if (total) {
        item->setFont(bold);
        item->setBackground(QColor(0x3a, 0x3f, 0x46));
        item->setForeground(QColor(0xf0, 0xc8, 0xe4));
      }
      factsTable_->setItem(i, c, item);
    }
  }
  // Short tables show whole; long ones (a ResNet) scroll inside a table at least this tall.
  const int rowsHeight = factsTable_->horizontalHeader()->sizeHint().height() +
                         factsTable_->verticalHeader()->defaultSectionSize() * int(f.rows.size()) + 4;
  factsTable_->setMinimumHeight(qMin(rowsHeight, 260));
  factsTable_->setMaximumHeight(rowsHeight);
}

void InspectorPanel::syncValues() {
  const core::GraphNode* n = node_.isEmpty() ? nullptr : editor_->document()->node(node_);
  const core::NodeTypeSpec* spec = n ? editor_->specOf(node_) : nullptr;
  if (!n || !spec) return;
  syncFacts();
  QHash<QString, QStringList> byField;
  QStringList nodeLevel;
  for (const core::Issue& i : report_.forNode(node_)) {
    const QString prefix = i.severity == core::Issue::Severity::Warning ? "⚠ " : "";
    if (i.field.startsWith("params."))
      byField[i.field.mid(7)] << prefix + i.message;
    else
      nodeLevel << prefix + (i.field.isEmpty() ? i.message : i.field + ": " + i.message);
  }
  if (nodeErrors_) {
    nodeErrors_->setText(nodeLevel.join("\n"));
    nodeErrors_->setVisible(!nodeLevel.isEmpty());
  }
  for (const ParamSpec& ps : spec->params) {
    auto it = rows_.find(ps.name);
    if (it == rows_.end()) continue;
    Row& r = *it;
    const bool set = n->params.contains(ps.name);
    const QJsonValue v = set ? n->params.value(ps.name) : ps.defaultValue;
    QSignalBlocker block(r.editor);
    switch (ps.type) {
      case ParamType::Int:
        if (auto* s = qobject_cast<QSpinBox*>(r.editor)) s->setValue(int(v.toDouble()));
        if (auto* s = qobject_cast<QDoubleSpinBox*>(r.editor)) s->setValue(v.toDouble());
        break;
      case ParamType::Float:
        static_cast<QDoubleSpinBox*>(r.editor)->setValue(v.toDouble());
        break;
      case ParamType::Bool:
        static_cast<QCheckBox*>(r.editor)->setChecked(v.toBool());
        break;
      case ParamType::Enum: {
        auto* c = static_cast<QComboBox*>(r.editor);
        const int idx = c->findText(v.toString());
        if (idx >= 0) c->setCurrentIndex(idx);
        break;
      }
      case ParamType::String:
        static_cast<QLineEdit*>(r.editor)->setText(v.toString());
        break;
      case ParamType::Shape:
        static_cast<QLineEdit*>(r.editor)->setText(shapeText(v));
        if (r.info) r.info->setText(shapeInfo(v));
        break;
    }
    // The editor may not be able to show a bad value (a spin box clamps): say what the document holds.
    QStringList problems;
    const QString own = core::checkParam(ps, v);
    if (!own.isEmpty()) problems << QString("%1 %2").arg(style::formatValue(v), own);
    for (const QString& m : byField.value(ps.name))
      if (!m.contains(own) || own.isEmpty()) problems << m;
    problems.removeDuplicates();
    r.error->setText(problems.join("\n"));
    r.error->setVisible(!problems.isEmpty());
    r.editor->setProperty("bad", !problems.isEmpty());
    r.editor->setStyleSheet(problems.isEmpty() ? QString() : QString("border: 1px solid #e54848;"));
    r.reset->setVisible(set);
  }
}

}  // namespace gn::editor
