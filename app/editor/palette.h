// The node catalogue: every type the loaded plugins provide, grouped by category, with a search field.
// Drag an entry onto the canvas or double-click it to add the node. Under "Blocks", the blocks that ship
// with gpunodes and the subgraphs saved to the user's library (core/subgraph.h), added the same two ways; the
// list follows the library folder as files come and go.
#pragma once
#include <QFileSystemWatcher>
#include <QTreeWidget>
#include <QWidget>

#include "gpunodes/core/subgraph.h"

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
  // The library as last read, and its "Blocks" entry for a block (null when there is none).
  const QList<core::subgraph::LibraryBlock>& blocks() const { return blocks_; }
  QTreeWidgetItem* itemForBlock(const QString& name) const;
  // Reads the library again (also done when its folder or one of its files changes).
  void reloadBlocks();

 signals:
  void addRequested(const QString& type);
  void blockRequested(const core::subgraph::LibraryBlock& block);
  void libraryChanged();

 private:
  void filter(const QString& text);
  void addTypes();
  const core::NodeTypeRegistry* registry_;
  QLineEdit* search_;
  PaletteTree* tree_;
  QTreeWidgetItem* blocksItem_ = nullptr;
  QList<core::subgraph::LibraryBlock> blocks_;
  QFileSystemWatcher watcher_;
};

}  // namespace gn::editor
