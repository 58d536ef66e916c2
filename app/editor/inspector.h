// The inspector: editors generated from the selected node's ParamSpecs (spin boxes with the spec's range,
// combos for enums, a shape editor, check boxes), the param's doc string as tooltip, and a bad value shown
// inline under its editor. Every change goes through GraphEditor, so it is undoable. Under the params, what
// validation learned about the node (its NodeFacts): the badge line and, for a Network, its layer table.
#pragma once
#include <QHash>
#include <QScrollArea>
#include <QTimer>

#include "gpunodes/core/node_type.h"
#include "gpunodes/core/validation.h"

class QFormLayout;
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
  void showNodes(const QStringList& ids);
  QString currentNode() const { return node_; }
  void setValidation(const core::ValidationReport& report);
  QWidget* editorFor(const QString& param) const;
  QString errorFor(const QString& param) const;
  // The current node's facts as shown: the badge line (empty when there is none) and the table (hidden
  // when the node has none; null when no single node of a loaded type is shown).
  QString factsText() const;
  QTableWidget* factsTable() const { return factsTable_; }

 private:
  struct Row {
    QWidget* editor = nullptr;
    QLabel* error = nullptr;
    QLabel* info = nullptr;
    QToolButton* reset = nullptr;
  };
  void rebuild();
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
  core::NodeFacts shownFacts_;  // what the facts widgets hold, so an unchanged report keeps the scroll
  core::ValidationReport report_;
  QTimer graphInfo_;  // refreshes the graph summary shown when nothing is selected
};

}  // namespace gn::editor
