#include "node_search.h"

#include <QKeyEvent>
#include <QLabel>
#include <QLineEdit>
#include <QListWidget>
#include <QScreen>
#include <QVBoxLayout>

#include "style.h"

namespace gn::editor {

NodeSearchPopup::NodeSearchPopup(const QList<Entry>& entries, const QString& heading, QWidget* parent)
    : QFrame(parent, Qt::Popup) {
  setObjectName("nodeSearch");
  setAttribute(Qt::WA_DeleteOnClose);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(6, 6, 6, 6);
  layout->setSpacing(4);
  if (!heading.isEmpty()) {
    auto* label = new QLabel(heading, this);
    label->setObjectName("inspectorDoc");
    layout->addWidget(label);
  }
  search_ = new QLineEdit(this);
  search_->setObjectName("nodeSearchField");
  search_->setPlaceholderText("Search nodes…");
  search_->setClearButtonEnabled(true);
  list_ = new QListWidget(this);
  list_->setObjectName("nodeSearchList");
  list_->setMinimumSize(260, 220);
  layout->addWidget(search_);
  layout->addWidget(list_);
  for (const Entry& e : entries) {
    auto* item = new QListWidgetItem(QString("%1    %2").arg(e.type, e.category), list_);
    item->setData(Qt::UserRole, e.type);
    item->setData(Qt::UserRole + 1, (e.type + " " + e.category + " " + e.description).toLower());
    item->setToolTip(e.description);
    item->setForeground(style::categoryColor(e.category).lighter(160));
  }
  if (entries.isEmpty()) {
    auto* item = new QListWidgetItem("No compatible node types", list_);
    item->setFlags(Qt::NoItemFlags);
  }
  list_->setCurrentRow(0);
  connect(search_, &QLineEdit::textChanged, this, &NodeSearchPopup::filter);
  connect(search_, &QLineEdit::returnPressed, this, &NodeSearchPopup::choose);
  connect(list_, &QListWidget::itemActivated, this, [this] { choose(); });
  connect(list_, &QListWidget::itemClicked, this, [this] { choose(); });
  search_->installEventFilter(this);
}

void NodeSearchPopup::popup(QPoint globalPos) {
  adjustSize();
  move(globalPos);
  show();
  search_->setFocus();
}

void NodeSearchPopup::filter(const QString& text) {
  const QStringList words = text.toLower().split(' ', Qt::SkipEmptyParts);
  int first = -1;
  for (int i = 0; i < list_->count(); ++i) {
    QListWidgetItem* item = list_->item(i);
    const QString hay = item->data(Qt::UserRole + 1).toString();
    bool match = true;
    for (const QString& w : words) match = match && hay.contains(w);
    item->setHidden(!match);
    if (match && first < 0) first = i;
  }
  if (first >= 0) list_->setCurrentRow(first);
}

void NodeSearchPopup::choose() {
  QListWidgetItem* item = list_->currentItem();
  if (done_ || !item || item->isHidden() || !(item->flags() & Qt::ItemIsEnabled)) return;
  done_ = true;
  const QString type = item->data(Qt::UserRole).toString();
  close();
  emit chosen(type);
}

bool NodeSearchPopup::eventFilter(QObject* o, QEvent* e) {
  // Up and Down in the search field move through the list, as in a command palette.
  if (o == search_ && e->type() == QEvent::KeyPress) {
    auto* k = static_cast<QKeyEvent*>(e);
    if (k->key() == Qt::Key_Down || k->key() == Qt::Key_Up) {
      int row = list_->currentRow();
      const int step = k->key() == Qt::Key_Down ? 1 : -1;
      for (int r = row + step; r >= 0 && r < list_->count(); r += step)
        if (!list_->item(r)->isHidden()) {
          list_->setCurrentRow(r);
          break;
        }
      return true;
    }
  }
  return QFrame::eventFilter(o, e);
}

}  // namespace gn::editor
