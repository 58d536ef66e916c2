// The searchable node list that pops up on the canvas (right click, Tab, or a wire dropped on empty space).
#pragma once
#include <QFrame>
#include <QList>

class QLineEdit;
class QListWidget;

namespace gn::editor {

class NodeSearchPopup : public QFrame {
  Q_OBJECT
 public:
  struct Entry {
    QString type, category, description;
  };
  NodeSearchPopup(const QList<Entry>& entries, const QString& heading, QWidget* parent);
  void popup(QPoint globalPos);
  QLineEdit* searchField() const { return search_; }
  QListWidget* list() const { return list_; }
  // Picks the current row (what Enter does).
  void choose();

 signals:
  void chosen(const QString& type);

 protected:
  bool eventFilter(QObject* o, QEvent* e) override;

 private:
  void filter(const QString& text);
  QLineEdit* search_;
  QListWidget* list_;
  bool done_ = false;  // a click also activates: choose once
};

}  // namespace gn::editor
