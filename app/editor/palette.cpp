#include "palette.h"

#include <QHeaderView>
#include <QLineEdit>
#include <QMimeData>
#include <QVBoxLayout>

#include "gpunodes/core/registry.h"
#include "style.h"

namespace gn::editor {

namespace {
constexpr int kTypeRole = Qt::UserRole;
constexpr int kSearchRole = Qt::UserRole + 1;
}  // namespace

QStringList PaletteTree::mimeTypes() const {
  return {"application/x-gpunodes-node-type"};
}

QMimeData* PaletteTree::mimeData(const QList<QTreeWidgetItem*>& items) const {
  if (items.isEmpty() || items.first()->data(0, kTypeRole).toString().isEmpty()) return nullptr;
  auto* mime = new QMimeData;
  mime->setData("application/x-gpunodes-node-type", items.first()->data(0, kTypeRole).toString().toUtf8());
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
  });
  reload();
}

void PalettePanel::reload() {
  tree_->clear();
  if (!registry_) return;
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
  filter(search_->text());
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
