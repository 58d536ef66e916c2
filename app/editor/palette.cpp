#include "palette.h"

#include <QHeaderView>
#include <QLineEdit>
#include <QMimeData>
#include <QVBoxLayout>

#include "canvas/drop_formats.h"
#include "gpunodes/core/registry.h"
#include "style.h"

namespace gn::editor {

namespace {
constexpr int kTypeRole = Qt::UserRole;
constexpr int kSearchRole = Qt::UserRole + 1;
constexpr int kBlockRole = Qt::UserRole + 2;      // a "Blocks" entry: the block's index in blocks_
constexpr int kBlockPathRole = Qt::UserRole + 3;  // and its file, which a drop reads
const QString kBlocksCategory = QStringLiteral("Blocks");
}  // namespace

QStringList PaletteTree::mimeTypes() const {
  return {kNodeTypeMime, kBlockMime};
}

QMimeData* PaletteTree::mimeData(const QList<QTreeWidgetItem*>& items) const {
  if (items.isEmpty()) return nullptr;
  const QString type = items.first()->data(0, kTypeRole).toString();
  const QString block = items.first()->data(0, kBlockPathRole).toString();
  if (type.isEmpty() && block.isEmpty()) return nullptr;
  auto* mime = new QMimeData;
  if (!type.isEmpty()) mime->setData(kNodeTypeMime, type.toUtf8());
  if (!block.isEmpty()) mime->setData(kBlockMime, block.toUtf8());
  return mime;
}

PalettePanel::PalettePanel(const core::NodeTypeRegistry* registry, QWidget* parent)
    : QWidget(parent), registry_(registry) {
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(4, 4, 4, 4);
  search_ = new QLineEdit(this);
  search_->setObjectName("paletteSearch");
  search_->setPlaceholderText("Search nodes…");
  search_->setClearButtonEnabled(true);
  tree_ = new PaletteTree(this);
  tree_->setObjectName("paletteTree");
  tree_->setHeaderHidden(true);
  tree_->setDragEnabled(true);
  tree_->setDragDropMode(QAbstractItemView::DragOnly);
  tree_->setRootIsDecorated(true);
  layout->addWidget(search_);
  layout->addWidget(tree_);
  connect(search_, &QLineEdit::textChanged, this, &PalettePanel::filter);
  connect(tree_, &QTreeWidget::itemDoubleClicked, this, [this](QTreeWidgetItem* item) {
    const QString type = item->data(0, kTypeRole).toString();
    if (!type.isEmpty()) emit addRequested(type);
    const QVariant block = item->data(0, kBlockRole);
    if (block.isValid() && block.toInt() < blocks_.size()) emit blockRequested(blocks_[block.toInt()]);
  });
  // The library folder: a block saved, changed or removed, here or by another gpunodes.
  watcher_.addPath(core::subgraph::libraryDir());
  connect(&watcher_, &QFileSystemWatcher::directoryChanged, this, [this] { reloadBlocks(); });
  connect(&watcher_, &QFileSystemWatcher::fileChanged, this, [this] { reloadBlocks(); });
  reload();
}

void PalettePanel::reloadBlocks() {
  QStringList errors;
  blocks_ = core::subgraph::listLibrary(&errors);
  delete blocksItem_;
  blocksItem_ = new QTreeWidgetItem(tree_, {kBlocksCategory});
  blocksItem_->setFlags(Qt::ItemIsEnabled);
  blocksItem_->setForeground(0, style::categoryColor(core::subgraph::kType).lighter(170));
  QFont f = blocksItem_->font(0);
  f.setBold(true);
  blocksItem_->setFont(0, f);
  blocksItem_->setToolTip(0, QStringLiteral("The blocks that ship with gpunodes, and subgraphs saved with Edit ▸ "
                                           "Save Subgraph to Library, in %1")
                                 .arg(core::subgraph::libraryDir().toHtmlEscaped()));
  for (int i = 0; i < blocks_.size(); ++i) {
    const core::subgraph::LibraryBlock& b = blocks_[i];
    const core::Subgraph& sub = core::subgraph::of(b.node);
    auto* item = new QTreeWidgetItem(blocksItem_, {b.name});
    item->setData(0, kBlockRole, i);
    item->setData(0, kBlockPathRole, b.path);
    item->setData(0, kSearchRole, (b.name + " " + kBlocksCategory + " subgraph block").toLower());
    item->setToolTip(
        0, QStringLiteral("<b>%1</b><br>%2 nodes, %3 inputs, %4 outputs<br>%5<br><i>Drag onto the canvas or "
                          "double-click to add</i>")
               .arg(b.name.toHtmlEscaped())
               .arg(sub.nodes.size())
               .arg(sub.inputs.size())
               .arg(sub.outputs.size())
               .arg(b.shipped ? QStringLiteral("Ships with gpunodes") : b.path.toHtmlEscaped()));
    item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable | Qt::ItemIsDragEnabled);
  }
  // Unreadable files are listed too, so a broken block is not silently missing.
  for (const QString& e : errors) {
    auto* item = new QTreeWidgetItem(blocksItem_, {QStringLiteral("⚠ ") + e.section(u'/', -1)});
    item->setToolTip(0, e.toHtmlEscaped());
    item->setData(0, kSearchRole, kBlocksCategory.toLower());
    item->setFlags(Qt::ItemIsEnabled);
  }
  for (const core::subgraph::LibraryBlock& b : blocks_)
    if (!watcher_.files().contains(b.path)) watcher_.addPath(b.path);
  blocksItem_->setExpanded(true);
  filter(search_->text());
  emit libraryChanged();
}

QTreeWidgetItem* PalettePanel::itemForBlock(const QString& name) const {
  for (int i = 0; blocksItem_ && i < blocksItem_->childCount(); ++i)
    if (blocksItem_->child(i)->data(0, kBlockRole).isValid() && blocksItem_->child(i)->text(0) == name)
      return blocksItem_->child(i);
  return nullptr;
}

void PalettePanel::reload() {
  tree_->clear();
  blocksItem_ = nullptr;
  if (registry_) addTypes();
  reloadBlocks();
}

void PalettePanel::addTypes() {
  QMap<QString, QTreeWidgetItem*> categories;
  for (const core::NodeTypePtr& t : registry_->types()) {
    const core::NodeTypeSpec& s = t->spec();
    QTreeWidgetItem*& cat = categories[s.category];
    if (!cat) {
      cat = new QTreeWidgetItem(tree_, {s.category.isEmpty() ? QString("Other") : s.category});
      cat->setFlags(Qt::ItemIsEnabled);
      cat->setForeground(0, style::categoryColor(s.category).lighter(170));
      QFont f = cat->font(0);
      f.setBold(true);
      cat->setFont(0, f);
    }
    auto* item = new QTreeWidgetItem(cat, {s.name});
    item->setData(0, kTypeRole, s.name);
    item->setData(0, kSearchRole, (s.name + " " + s.category + " " + s.description).toLower());
    QString tip = "<b>" + s.name.toHtmlEscaped() + "</b>";
    if (!s.description.isEmpty()) tip += "<br>" + s.description.toHtmlEscaped();
    tip += "<br><i>Drag onto the canvas or double-click to add</i>";
    item->setToolTip(0, tip);
    item->setFlags(Qt::ItemIsEnabled | Qt::ItemIsSelectable | Qt::ItemIsDragEnabled);
  }
  tree_->expandAll();
}

QTreeWidgetItem* PalettePanel::itemForType(const QString& type) const {
  for (int c = 0; c < tree_->topLevelItemCount(); ++c) {
    QTreeWidgetItem* cat = tree_->topLevelItem(c);
    for (int i = 0; i < cat->childCount(); ++i)
      if (cat->child(i)->data(0, kTypeRole).toString() == type) return cat->child(i);
  }
  return nullptr;
}

void PalettePanel::filter(const QString& text) {
  const QStringList words = text.toLower().split(' ', Qt::SkipEmptyParts);
  for (int c = 0; c < tree_->topLevelItemCount(); ++c) {
    QTreeWidgetItem* cat = tree_->topLevelItem(c);
    bool any = false;
    for (int i = 0; i < cat->childCount(); ++i) {
      QTreeWidgetItem* item = cat->child(i);
      bool match = true;
      for (const QString& w : words) match = match && item->data(0, kSearchRole).toString().contains(w);
      item->setHidden(!match);
      any = any || match;
    }
    cat->setHidden(!any);
  }
}

}  // namespace gn::editor
