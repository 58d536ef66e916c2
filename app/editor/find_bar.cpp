#include "find_bar.h"

#include <QHBoxLayout>
#include <QJsonArray>
#include <QJsonDocument>
#include <QKeyEvent>
#include <QLabel>
#include <QLineEdit>
#include <QToolButton>

#include "canvas/graph_view.h"
#include "style.h"

namespace gn::editor {

namespace {

bool valueMatches(const QJsonValue& v, const QString& text) {
  if (style::formatValue(v).contains(text, Qt::CaseInsensitive)) return true;
  // A shape shows as 4×4; typed as the file writes it, [4,4] or 4,4, it matches too.
  if (v.isArray()) {
    const QString json = QString::fromUtf8(QJsonDocument(v.toArray()).toJson(QJsonDocument::Compact));
    return json.contains(text, Qt::CaseInsensitive);
  }
  return false;
}

}  // namespace

QStringList findNodes(const GraphEditor* editor, const QString& rawText) {
  const QString text = rawText.trimmed();
  QStringList out;
  if (text.isEmpty()) return out;
  for (const core::GraphNode& n : editor->document()->nodes()) {
    bool hit = n.id.contains(text, Qt::CaseInsensitive) || n.type.contains(text, Qt::CaseInsensitive);
    for (auto it = n.params.begin(); !hit && it != n.params.end(); ++it) hit = valueMatches(it.value(), text);
    if (const core::NodeTypeSpec* spec = editor->specOf(n.id))
      for (const core::ParamSpec& p : spec->params)
        if (!hit && !n.params.contains(p.name)) hit = valueMatches(p.defaultValue, text);
    if (hit) out << n.id;
  }
  return out;
}

FindBar::FindBar(GraphView* view) : QFrame(view), view_(view) {
  setObjectName("findBar");
  setFrameShape(QFrame::StyledPanel);
  setAutoFillBackground(true);
  auto* row = new QHBoxLayout(this);
  row->setContentsMargins(6, 4, 4, 4);
  row->setSpacing(4);
  field_ = new QLineEdit(this);
  field_->setObjectName("findField");
  field_->setPlaceholderText("Find node: id, type or value");
  field_->setClearButtonEnabled(true);
  field_->setMinimumWidth(220);
  field_->setToolTip("Enter: next match · Shift+Enter: previous · Esc: close");
  field_->installEventFilter(this);
  count_ = new QLabel(this);
  count_->setObjectName("findCount");
  count_->setMinimumWidth(70);
  auto button = [this](const QString& text, const QString& tip) {
    auto* b = new QToolButton(this);
    b->setText(text);
    b->setToolTip(tip);
    b->setAutoRaise(true);
    return b;
  };
  prev_ = button("▲", "Previous match (Shift+Enter)");
  next_ = button("▼", "Next match (Enter)");
  close_ = button("✕", "Close (Esc)");
  row->addWidget(field_);
  row->addWidget(count_);
  row->addWidget(prev_);
  row->addWidget(next_);
  row->addWidget(close_);
  connect(field_, &QLineEdit::textChanged, this, &FindBar::search);
  connect(prev_, &QToolButton::clicked, this, [this] { step(-1); });
  connect(next_, &QToolButton::clicked, this, [this] { step(1); });
  connect(close_, &QToolButton::clicked, this, &FindBar::dismiss);
  connect(view_->graphScene()->document(), &core::GraphDocument::changed, this, [this] {
    if (isVisible()) refreshMatches();
  });
  hide();
}

QString FindBar::countText() const {
  if (field_->text().trimmed().isEmpty()) return {};
  if (matches_.isEmpty()) return "no matches";
  return QString("%1 of %2").arg(current_ + 1).arg(matches_.size());
}

void FindBar::open() {
  show();
  raise();
  place();
  field_->setFocus(Qt::ShortcutFocusReason);
  field_->selectAll();
  refreshMatches();
}

void FindBar::dismiss() {
  hide();
  view_->setFocus();
}

void FindBar::place() {
  adjustSize();
  move(view_->width() - width() - 10, 10);
}

void FindBar::search() {
  matches_ = findNodes(view_->graphScene()->editor(), field_->text());
  current_ = matches_.isEmpty() ? -1 : 0;
  showCurrent();
  updateLabel();
}

void FindBar::refreshMatches() {
  const QString shown = current_ >= 0 && current_ < matches_.size() ? matches_[current_] : QString();
  matches_ = findNodes(view_->graphScene()->editor(), field_->text());
  current_ = matches_.isEmpty() ? -1 : qMax<qsizetype>(0, matches_.indexOf(shown));
  updateLabel();
}

void FindBar::step(int direction) {
  if (matches_.isEmpty()) return;
  const int n = int(matches_.size());
  current_ = ((current_ + direction) % n + n) % n;
  showCurrent();
  updateLabel();
}

void FindBar::showCurrent() {
  if (current_ < 0) return;
  const QString id = matches_[current_];
  view_->graphScene()->selectNodes({id});
  view_->centerOnNode(id);
}

void FindBar::updateLabel() {
  count_->setText(countText());
  // Red text when the typed text matches nothing, as browsers do.
  count_->setStyleSheet(matches_.isEmpty() && !field_->text().trimmed().isEmpty() ? "color: #ff7b7b;" : "");
  prev_->setEnabled(matches_.size() > 1);
  next_->setEnabled(matches_.size() > 1);
}

bool FindBar::eventFilter(QObject* watched, QEvent* e) {
  if (watched == field_ && e->type() == QEvent::KeyPress) {
    auto* k = static_cast<QKeyEvent*>(e);
    if (k->key() == Qt::Key_Return || k->key() == Qt::Key_Enter) {
      step(k->modifiers() & Qt::ShiftModifier ? -1 : 1);
      return true;
    }
    if (k->key() == Qt::Key_Escape) {
      dismiss();
      return true;
    }
  }
  return QFrame::eventFilter(watched, e);
}

}  // namespace gn::editor
