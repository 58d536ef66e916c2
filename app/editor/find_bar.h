// Find on the canvas (Ctrl+F): a small bar over the canvas's top-right corner. It matches node ids, types
// and param values; Enter and Shift+Enter step through the matches, selecting and centring each.
#pragma once
#include <QFrame>
#include <QStringList>

class QLabel;
class QLineEdit;
class QToolButton;

namespace gn::editor {

class GraphEditor;
class GraphView;

// The nodes whose id, type or a param value (set in the file or the type's default, as the node shows it)
// contains `text`, case-insensitively, in document order. Blank text matches nothing.
QStringList findNodes(const GraphEditor* editor, const QString& text);

class FindBar : public QFrame {
  Q_OBJECT
 public:
  explicit FindBar(GraphView* view);
  QLineEdit* field() const { return field_; }
  const QStringList& matches() const { return matches_; }
  int current() const { return current_; }  // index into matches(), -1 when none is shown
  QString countText() const;                // "2 of 5", "no matches", or empty for an empty field
  // Shows the bar with the field focused and its text selected, ready to type over.
  void open();
  void dismiss();  // hides the bar and gives the canvas its focus back
  // Moves to the next (+1) or previous (-1) match, wrapping, and frames it.
  void step(int direction);
  // Keeps the bar in the canvas's top-right corner.
  void place();

 protected:
  bool eventFilter(QObject* watched, QEvent* e) override;

 private:
  void search();          // the text changed: the first match is shown
  void refreshMatches();  // the graph changed: same text, the shown node kept when it still matches
  void showCurrent();
  void updateLabel();
  GraphView* view_;
  QLineEdit* field_;
  QLabel* count_;
  QToolButton *prev_, *next_, *close_;
  QStringList matches_;
  int current_ = -1;
};

}  // namespace gn::editor
