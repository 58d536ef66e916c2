// The node catalogue: every type the loaded plugins provide, grouped by category, with a search field.
// Drag an entry onto the canvas or double-click it to add the node.
#pragma once
#include <QTreeWidget>
#include <QWidget>

class QLineEdit;

namespace gn::core {
class NodeTypeRegistry;
}

namespace gn::editor {

class PaletteTree : public QTreeWidget {
  Q_OBJECT
 public:
  using QTreeWidget::QTreeWidget;
  // Public so the drag payload can be checked without a platform drag.
  QMimeData* mimeData(const QList<QTreeWidgetItem*>& items) const override;
  QStringList mimeTypes() const override;
};

class PalettePanel : public QWidget {
  Q_OBJECT
 public:
  explicit PalettePanel(const core::NodeTypeRegistry* registry, QWidget* parent = nullptr);
  void reload();
  QLineEdit* searchField() const { return search_; }
  QTreeWidget* tree() const { return tree_; }
  QTreeWidgetItem* itemForType(const QString& type) const;

 signals:
  void addRequested(const QString& type);

 private:
  void filter(const QString& text);
  const core::NodeTypeRegistry* registry_;
  QLineEdit* search_;
  PaletteTree* tree_;
};

}  // namespace gn::editor
