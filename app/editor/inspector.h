// The inspector: editors generated from the selected node's ParamSpecs (spin boxes with the spec's range,
// combos for enums, a shape editor, check boxes), the param's doc string as tooltip, and a bad value shown
// inline under its editor. Every change goes through GraphEditor, so it is undoable. Under the params, what
// validation learned about the node (its NodeFacts): the badge line and, for a Network, its layer table.
// For a Subgraph node: its promoted params in the form, each with an unpromote action, a list of the inner
// params to promote, and, for an instance of a library block, whether the block's file has changed since,
// with "Update from library".
#pragma once
#include <QHash>
#include <QPointer>
#include <QScrollArea>
#include <QTimer>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/validation.h"

class QComboBox;
class QFormLayout;
class QPushButton;
class QLabel;
class QTableWidget;
class QToolButton;
class QVBoxLayout;

namespace gn::editor {

class GraphEditor;

class InspectorPanel : public QScrollArea {
  Q_OBJECT
 public:
  explicit InspectorPanel(GraphEditor* editor, QWidget* parent = nullptr);
  // The editor of the graph level being shown (the root graph, or a subgraph entered).
  void setEditor(GraphEditor* editor);
  void showNodes(const QStringList& ids);
  void refresh() { rebuild(); }  // after the library changed
  // A shown Subgraph node's widgets (null otherwise): the inner params to promote, the promote button,
  // the library state line, and "Update from library" (only when out of date).
  QComboBox* innerParams() const { return innerParams_; }
  QPushButton* promoteButton() const { return promoteButton_; }
  QLabel* libraryState() const { return library_; }
  QPushButton* updateButton() const { return updateButton_; }
  QString currentNode() const { return node_; }
  void setValidation(const core::ValidationReport& report);
  QWidget* editorFor(const QString& param) const;
  QString errorFor(const QString& param) const;
  // The current node's facts as shown: the badge line (empty when there is none) and the table (hidden
  // when the node has none; null when no single node of a loaded type is shown).
  QString factsText() const;
  QTableWidget* factsTable() const { return factsTable_; }

 signals:
  void enterRequested(const QString& nodeId);

 private:
  struct Row {
    QWidget* editor = nullptr;
    QLabel* error = nullptr;
    QLabel* info = nullptr;
    QToolButton* reset = nullptr;
  };
  void rebuild();
  void watchDocument();
  void addSubgraphSection(const core::GraphNode& node, QVBoxLayout* layout);
  void syncValues();
  void syncFacts();
  void commit(const QString& param, const QJsonValue& value);
  QWidget* makeEditor(const core::ParamSpec& ps);

  GraphEditor* editor_;
  QWidget* content_ = nullptr;
  QString node_;
  QStringList selection_;
  QHash<QString, Row> rows_;
  QHash<QString, QStringList> issues_;  // field -> messages, for the current node
  QLabel* nodeErrors_ = nullptr;
  QLabel* factsLabel_ = nullptr;
  QTableWidget* factsTable_ = nullptr;
  QComboBox* innerParams_ = nullptr;
  QPushButton *promoteButton_ = nullptr, *updateButton_ = nullptr;
  QLabel* library_ = nullptr;
  QPointer<core::GraphDocument> watched_;  // the document whose signals rebuild the panel
  core::NodeFacts shownFacts_;  // what the facts widgets hold, so an unchanged report keeps the scroll
  core::ValidationReport report_;
  QTimer graphInfo_;  // refreshes the graph summary shown when nothing is selected
};

}  // namespace gn::editor
