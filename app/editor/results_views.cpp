#include "results_views.h"

#include <qcustomplot.h>

#include <QHBoxLayout>
#include <QHeaderView>
#include <QJsonArray>
#include <QLabel>
#include <QListWidget>
#include <QPainter>
#include <QStyledItemDelegate>
#include <QTableWidget>
#include <QVBoxLayout>
#include <cmath>

#include "plots.h"
#include "style.h"

namespace gn::editor {

namespace {

constexpr int kThumb = 84;  // the longer side of a grid image, in pixels
constexpr int kCellWidth = 150, kCaptionLines = 2;
constexpr int kDetail = 140;  // 28 x 5

QString percent(double v) {
  return std::isfinite(v) ? QString::number(100 * v, 'f', 1) + "%" : QString("–");
}

// Nearest-neighbour for small images so that their pixels stay sharp; large ones are scaled down smoothly.
QPixmap scaledCrisp(const QImage& img, int side) {
  if (img.isNull()) return {};
  const int longer = qMax(img.width(), img.height());
  if (longer >= side)
    return QPixmap::fromImage(img.scaled(side, side, Qt::KeepAspectRatio, Qt::SmoothTransformation));
  const int f = side / longer;
  return QPixmap::fromImage(
      img.scaled(img.width() * f, img.height() * f, Qt::IgnoreAspectRatio, Qt::FastTransformation));
}

// Two decimals, as a caption wants, but never "1.00" for a probability below 1: a mistake at 0.997 must not
// read as certain.
QString probabilityText(double p) {
  int decimals = 2;
  while (decimals < 6 && p < 1 && QString::number(p, 'f', decimals).startsWith("1")) ++decimals;
  return QString::number(p, 'f', decimals);
}

QLabel* headerLabel(QWidget* parent) {
  auto* l = new QLabel(parent);
  l->setObjectName("resultsHeader");
  l->setWordWrap(true);
  l->setTextFormat(Qt::PlainText);
  l->setContentsMargins(6, 4, 6, 2);
  return l;
}

// The probability column draws its value as a bar behind the text.
class BarDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;
  void paint(QPainter* p, const QStyleOptionViewItem& option, const QModelIndex& index) const override {
    const double v = index.data(Qt::UserRole).toDouble();
    if (std::isfinite(v) && v > 0) {
      QRectF bar = QRectF(option.rect).adjusted(2, 3, -2, -3);
      bar.setWidth(bar.width() * qBound(0.0, v, 1.0));
      p->fillRect(bar, QColor(0x3d, 0x8f, 0xd1, 150));
    }
    QStyledItemDelegate::paint(p, option, index);
  }
};

// A grid cell: the image at the top, the caption wrapped under it (QListView's icon mode elides it to one
// line instead, which cuts the predicted class off).
class MistakeDelegate : public QStyledItemDelegate {
 public:
  using QStyledItemDelegate::QStyledItemDelegate;
  QSize sizeHint(const QStyleOptionViewItem& option, const QModelIndex&) const override {
    return QSize(kCellWidth, kThumb + 10 + kCaptionLines * option.fontMetrics.lineSpacing());
  }
  void paint(QPainter* p, const QStyleOptionViewItem& option, const QModelIndex& index) const override {
    p->save();
    const QRect r = option.rect.adjusted(2, 2, -2, -2);
    if (option.state & QStyle::State_Selected) {
      p->setRenderHint(QPainter::Antialiasing);
      p->setPen(Qt::NoPen);
      p->setBrush(option.palette.highlight());
      p->drawRoundedRect(r, 4, 4);
    }
    const QPixmap pm = index.data(Qt::DecorationRole).value<QIcon>().pixmap(QSize(kThumb, kThumb));
    p->drawPixmap(r.left() + (r.width() - pm.width()) / 2, r.top() + 3, pm);
    QRect text = r.adjusted(3, kThumb + 6, -3, 0);
    p->setPen(option.state & QStyle::State_Selected ? option.palette.highlightedText().color()
                                                    : option.palette.text().color());
    QString caption = index.data(Qt::DisplayRole).toString();
    // Too wide for one line: the probability goes on a second; a class name is never split, only elided.
    const QFontMetrics& fm = option.fontMetrics;
    if (fm.horizontalAdvance(caption) > text.width()) caption.replace("  p=", "\np=");
    QStringList lines = caption.split("\n");
    for (QString& line : lines) line = fm.elidedText(line, Qt::ElideRight, text.width());
    p->drawText(text, Qt::AlignHCenter | Qt::AlignTop, lines.join('\n'));
    p->restore();
  }
};

}  // namespace

// -------------------------------------------------------------------------------------------------- results

std::optional<EvaluationTask> evaluationTask(const QJsonObject& entry) {
  const QString task = entry.value("task").toString();
  if (task == "regression" && entry.contains("mse")) return EvaluationTask::Regression;
  if (task == "language_model" && entry.contains("perplexity")) return EvaluationTask::LanguageModel;
  if (!entry.value("confusion").toArray().isEmpty()) return EvaluationTask::Classification;
  return std::nullopt;
}

std::optional<EvaluationResults> EvaluationResults::fromReport(const QString& node,
                                                               const QJsonObject& entry) {
  const std::optional<EvaluationTask> task = evaluationTask(entry);
  if (!task || task == EvaluationTask::Regression) return std::nullopt;
  EvaluationResults r;
  r.node = node;
  r.task = *task;
  r.split = entry.value("split").toString();
  r.accuracy = entry.value("accuracy").toDouble(NAN);
  r.samples = entry.value("samples").toInteger();
  if (r.languageModel()) {
    r.loss = entry.value("loss").toDouble(NAN);
    r.perplexity = entry.value("perplexity").toDouble(NAN);
    return r;
  }
  const QJsonArray confusion = entry.value("confusion").toArray();
  r.mistakesTotal = entry.value("mistakes_total").toInteger();
  const int n = int(confusion.size());
  for (const QJsonValue& row : confusion) {
    const QJsonArray a = row.toArray();
    if (a.size() != n) return std::nullopt;
    QVector<qint64> counts;
    for (const QJsonValue& c : a) counts << c.toInteger();
    r.confusion << counts;
  }
  const QJsonArray perClass = entry.value("per_class").toArray();
  for (int i = 0; i < n; ++i) r.perClass << (i < perClass.size() ? perClass[i].toDouble(NAN) : NAN);
  for (const QJsonValue& v : entry.value("class_names").toArray()) r.classNames << v.toString();
  for (const QJsonValue& v : entry.value("mistakes").toArray()) {
    const QJsonObject o = v.toObject();
    Mistake m;
    m.index = o.value("index").toInteger();
    m.trueClass = o.value("true").toInt();
    m.predicted = o.value("predicted").toInt();
    m.confidence = o.value("confidence").toDouble(NAN);
    for (const QJsonValue& e : o.value("top5").toArray())
      m.top5 << qMakePair(e.toArray().at(0).toInt(), e.toArray().at(1).toDouble(NAN));
    m.image = QImage::fromData(QByteArray::fromBase64(o.value("image").toString().toLatin1()), "PNG");
    r.mistakes << m;
  }
  return r;
}

QString EvaluationResults::className(int cls) const {
  return cls >= 0 && cls < classNames.size() ? classNames[cls] : QString("class %1").arg(cls);
}

QString EvaluationResults::title() const {
  const QString perplexityText =
      languageModel() ? " · perplexity " + style::formatScore(perplexity) : QString();
  return QString("Evaluate node %1%2: accuracy %3%4 on %L5 samples%6")
      .arg(node, split.isEmpty() ? QString() : " (" + split + " split)", percent(accuracy), perplexityText)
      .arg(samples)
      .arg(note.isEmpty() ? QString() : " (" + note + ")");
}

// ------------------------------------------------------------------------------------------------ confusion

ConfusionView::ConfusionView(QWidget* parent) : QWidget(parent) {
  setObjectName("confusionView");
  header_ = headerLabel(this);
  plot_ = new QCustomPlot(this);
  plot_->setObjectName("confusionPlot");
  plot_->setMinimumHeight(160);
  applyPlotTheme(plot_);
  plot_->setInteractions({});
  plot_->legend->setVisible(false);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(0);
  layout->addWidget(header_);
  layout->addWidget(plot_, 1);

  map_ = new QCPColorMap(plot_->xAxis, plot_->yAxis);
  map_->setInterpolate(false);
  map_->setTightBoundary(false);
  // Dark for no share of the row, bright for all of it: a model's diagonal lights up, its confusions glow.
  QCPColorGradient g;
  g.clearColorStops();
  g.setColorStopAt(0.0, QColor(0x26, 0x29, 0x30));
  g.setColorStopAt(0.15, QColor(0x3b, 0x2a, 0x5c));
  g.setColorStopAt(0.45, QColor(0x21, 0x80, 0x8d));
  g.setColorStopAt(0.75, QColor(0x5e, 0xc9, 0x62));
  g.setColorStopAt(1.0, QColor(0xfd, 0xe7, 0x25));
  map_->setGradient(g);
  map_->setDataRange(QCPRange(0, 1));
  auto* scale = new QCPColorScale(plot_);
  scale->setType(QCPAxis::atRight);
  scale->setGradient(g);
  scale->setDataRange(QCPRange(0, 1));
  scale->setBarWidth(10);
  scale->axis()->setLabel("share of the true class");
  QCPAxis* a = scale->axis();
  a->setBasePen(plot_->xAxis->basePen());
  a->setTickPen(plot_->xAxis->tickPen());
  a->setSubTickPen(plot_->xAxis->subTickPen());
  a->setTickLabelColor(plot_->xAxis->tickLabelColor());
  a->setLabelColor(plot_->xAxis->labelColor());
  plot_->plotLayout()->addElement(0, 1, scale);
  auto* margins = new QCPMarginGroup(plot_);
  plot_->axisRect()->setMarginGroup(QCP::msBottom | QCP::msTop, margins);
  scale->setMarginGroup(QCP::msBottom | QCP::msTop, margins);

  plot_->xAxis->setLabel("predicted class");
  plot_->yAxis->setLabel("true class");
  plot_->yAxis2->setLabel("accuracy of the class");
  plot_->yAxis->setRangeReversed(true);
  plot_->yAxis2->setRangeReversed(true);
  for (QCPAxis* a : {plot_->xAxis, plot_->yAxis, plot_->yAxis2}) {
    a->grid()->setVisible(false);
    a->setSubTicks(false);
    a->setTickLength(0, 3);
  }
  plot_->yAxis2->setVisible(true);
  clear("Run a graph with an Evaluate node: its confusion matrix shows here.");
}

QString ConfusionView::headerText() const {
  return header_->text();
}

void ConfusionView::clear(const QString& message) {
  header_->setText(message);
  for (QCPItemText* t : cells_) plot_->removeItem(t);
  cells_.clear();
  classes_ = 0;
  map_->data()->clear();
  map_->setVisible(false);
  for (QCPAxis* a : {plot_->xAxis, plot_->yAxis, plot_->yAxis2})
    a->setTicker(QSharedPointer<QCPAxisTickerText>(new QCPAxisTickerText));
  plot_->replot();
}

void ConfusionView::setResults(const EvaluationResults& r) {
  if (r.languageModel()) {
    // Its classes are the vocabulary's tokens: a matrix of them would be as large as it is unreadable.
    clear(r.title() +
          QString(". A language model predicts the next token: its accuracy is the share of tokens predicted "
                  "right, its perplexity the exponential of the mean cross-entropy (%1); it has no confusion "
                  "matrix.")
              .arg(std::isfinite(r.loss) ? QString::number(r.loss, 'f', 3) : QString("–")));
    return;
  }
  clear(r.title() +
        ". Rows are the true class, columns the prediction; a cell's colour is its share of the row, so the "
        "diagonal reads as each class's accuracy (also on the right).");
  const int n = int(r.confusion.size());
  classes_ = n;
  // One class still needs a map of two cells per side: QCustomPlot spaces cells by range / (size - 1).
  const int side = qMax(2, n);
  map_->data()->setSize(side, side);
  if (n == 1)
    map_->data()->setRange(QCPRange(-0.25, 0.25), QCPRange(-0.25, 0.25));
  else
    map_->data()->setRange(QCPRange(0, n - 1), QCPRange(0, n - 1));
  QSharedPointer<QCPAxisTickerText> names(new QCPAxisTickerText), rowNames(new QCPAxisTickerText),
      accuracy(new QCPAxisTickerText);
  int longest = 0;
  for (int t = 0; t < n; ++t) {
    names->addTick(t, r.className(t));
    rowNames->addTick(t, r.className(t));
    accuracy->addTick(t, percent(r.perClass.value(t, NAN)));
    longest = qMax(longest, int(r.className(t).size()));
    qint64 rowSum = 0;
    for (qint64 c : r.confusion[t]) rowSum += c;
    for (int p = 0; p < n; ++p) {
      const qint64 count = r.confusion[t][p];
      const double share = rowSum ? double(count) / double(rowSum) : 0.0;
      if (n == 1) {
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) map_->data()->setCell(i, j, share);
      } else {
        map_->data()->setCell(p, t, share);
      }
      auto* text = new QCPItemText(plot_);
      text->setClipToAxisRect(true);
      text->position->setType(QCPItemPosition::ptPlotCoords);
      text->position->setCoords(p, t);
      text->setPositionAlignment(Qt::AlignCenter);
      text->setText(QString::number(count));
      // Dark text on the bright end of the gradient, light text elsewhere; zeros fade.
      text->setColor(count == 0    ? QColor(0x80, 0x86, 0x8e)
                     : share > 0.6 ? QColor(0x10, 0x12, 0x14)
                                   : QColor(0xf0, 0xf2, 0xf5));
      cells_ << text;
    }
  }
  plot_->xAxis->setTicker(names);
  plot_->yAxis->setTicker(rowNames);
  plot_->yAxis2->setTicker(accuracy);
  plot_->xAxis->setTickLabelRotation(n > 4 && longest > 5 ? 30 : 0);
  for (QCPAxis* a : {plot_->xAxis, plot_->yAxis, plot_->yAxis2}) a->setRange(-0.5, n - 0.5);
  map_->setVisible(true);
  fitCellText();
  plot_->replot();
}

QString ConfusionView::cellText(int trueClass, int predicted) const {
  if (trueClass < 0 || predicted < 0 || trueClass >= classes_ || predicted >= classes_) return {};
  return cells_[trueClass * classes_ + predicted]->text();
}

void ConfusionView::resizeEvent(QResizeEvent* e) {
  QWidget::resizeEvent(e);
  fitCellText();
}

// The counts take a font that fits their cells, and are hidden where even a small one would not.
void ConfusionView::fitCellText() {
  if (classes_ == 0) return;
  plot_->replot(QCustomPlot::rpImmediateRefresh);  // lays the axis rect out at the current size
  const QRect rect = plot_->axisRect()->rect();
  const double cell = qMin(rect.width(), rect.height()) / double(classes_);
  int digits = 1;
  for (QCPItemText* t : cells_) digits = qMax(digits, int(t->text().size()));
  const double px = qMin(cell * 0.4, cell * 1.4 / (0.62 * digits));
  QFont f = plot_->font();
  f.setPixelSize(qBound(7, int(px), 15));
  const bool visible = px >= 7;
  for (QCPItemText* t : cells_) {
    t->setFont(f);
    t->setVisible(visible);
  }
  plot_->replot(QCustomPlot::rpQueuedReplot);
}

// ------------------------------------------------------------------------------------------------- mistakes

MistakesView::MistakesView(QWidget* parent) : QWidget(parent) {
  setObjectName("mistakesView");
  header_ = headerLabel(this);
  grid_ = new QListWidget(this);
  grid_->setObjectName("mistakesGrid");
  grid_->setViewMode(QListView::IconMode);
  grid_->setMovement(QListView::Static);
  grid_->setResizeMode(QListView::Adjust);
  grid_->setWrapping(true);
  grid_->setUniformItemSizes(true);
  grid_->setSelectionMode(QAbstractItemView::SingleSelection);
  grid_->setIconSize(QSize(kThumb, kThumb));
  grid_->setItemDelegate(new MistakeDelegate(grid_));
  grid_->setSpacing(4);

  auto* side = new QWidget(this);
  side->setObjectName("mistakeDetail");
  side->setFixedWidth(260);
  picture_ = new QLabel(side);
  picture_->setAlignment(Qt::AlignCenter);
  picture_->setMinimumHeight(kDetail);
  detail_ = new QLabel(side);
  detail_->setWordWrap(true);
  detail_->setTextFormat(Qt::PlainText);
  top5_ = new QTableWidget(0, 2, side);
  top5_->setObjectName("top5Table");
  top5_->setHorizontalHeaderLabels({"class", "probability"});
  top5_->verticalHeader()->setVisible(false);
  top5_->horizontalHeader()->setStretchLastSection(true);
  top5_->horizontalHeader()->setSectionResizeMode(0, QHeaderView::ResizeToContents);
  top5_->setEditTriggers(QAbstractItemView::NoEditTriggers);
  top5_->setSelectionMode(QAbstractItemView::NoSelection);
  top5_->setFocusPolicy(Qt::NoFocus);
  top5_->setItemDelegateForColumn(1, new BarDelegate(top5_));
  // Five rows without a scroll bar.
  const int rowHeight = top5_->fontMetrics().height() + 6;
  top5_->verticalHeader()->setDefaultSectionSize(rowHeight);
  top5_->setMinimumHeight(top5_->horizontalHeader()->sizeHint().height() + 5 * rowHeight + 4);
  auto* sideLayout = new QVBoxLayout(side);
  sideLayout->setContentsMargins(4, 4, 4, 4);
  sideLayout->addWidget(picture_);
  sideLayout->addWidget(detail_);
  sideLayout->addWidget(top5_, 1);

  auto* body = new QHBoxLayout;
  body->setContentsMargins(0, 0, 0, 0);
  body->addWidget(grid_, 1);
  body->addWidget(side);
  auto* layout = new QVBoxLayout(this);
  layout->setContentsMargins(0, 0, 0, 0);
  layout->setSpacing(0);
  layout->addWidget(header_);
  layout->addLayout(body, 1);

  connect(grid_, &QListWidget::currentRowChanged, this, &MistakesView::showMistake);
  clear("Run a graph with an Evaluate node: the images it got wrong show here.");
}

QString MistakesView::headerText() const {
  return header_->text();
}

QString MistakesView::detailText() const {
  return detail_->text();
}

void MistakesView::clear(const QString& message) {
  results_ = {};
  header_->setText(message);
  grid_->blockSignals(true);
  grid_->clear();
  grid_->blockSignals(false);
  showMistake(-1);
}

void MistakesView::setResults(const EvaluationResults& r) {
  clear({});
  results_ = r;
  QString head = r.title() + ". ";
  if (r.languageModel())
    head += "The evaluation of a language model lists no mistakes.";
  else if (r.mistakesTotal == 0)
    head += "No mistakes: every sample was classified correctly.";
  else if (r.mistakes.isEmpty())
    head += QString("%L1 mistakes; the report carries none of them (the node's mistakes_shown is 0).")
                .arg(r.mistakesTotal);
  else
    head += QString("The %L1 most confident of %L2 mistakes, most confident first; click one for its top 5.")
                .arg(r.mistakes.size())
                .arg(r.mistakesTotal);
  header_->setText(head);
  grid_->blockSignals(true);
  for (const EvaluationResults::Mistake& m : r.mistakes) {
    auto* item = new QListWidgetItem(QIcon(scaledCrisp(m.image, kThumb)),
                                     QString("%1 → %2  p=%3")
                                         .arg(r.className(m.trueClass), r.className(m.predicted))
                                         .arg(probabilityText(m.confidence)));
    item->setToolTip(QString("sample %1: true %2, predicted %3 (p = %4)")
                         .arg(m.index)
                         .arg(r.className(m.trueClass), r.className(m.predicted))
                         .arg(m.confidence, 0, 'f', 3));
    item->setTextAlignment(Qt::AlignHCenter | Qt::AlignTop);
    grid_->addItem(item);
  }
  grid_->setCurrentRow(-1);
  grid_->blockSignals(false);
  showMistake(-1);
}

void MistakesView::showMistake(int row) {
  top5_->setRowCount(0);
  if (row < 0 || row >= results_.mistakes.size()) {
    picture_->clear();
    detail_->setText(results_.mistakes.isEmpty() ? QString()
                                                 : "Click an image to see its top-5 probabilities.");
    return;
  }
  if (grid_->currentRow() != row) {
    const QSignalBlocker block(grid_);
    grid_->setCurrentRow(row);
  }
  const EvaluationResults::Mistake& m = results_.mistakes[row];
  picture_->setPixmap(scaledCrisp(m.image, kDetail));
  bool trueListed = false;
  for (const auto& [cls, p] : m.top5) trueListed |= cls == m.trueClass;
  detail_->setText(QString("Sample %1\ntrue: %2\npredicted: %3 (p = %4)%5")
                       .arg(m.index)
                       .arg(results_.className(m.trueClass), results_.className(m.predicted))
                       .arg(m.confidence, 0, 'f', 3)
                       .arg(trueListed ? QString() : "\nThe true class is not among the top 5."));
  top5_->setRowCount(int(m.top5.size()));
  for (int i = 0; i < m.top5.size(); ++i) {
    const auto& [cls, p] = m.top5[i];
    auto* name = new QTableWidgetItem(results_.className(cls) + (cls == m.trueClass   ? "  (true)"
                                                                 : cls == m.predicted ? "  (predicted)"
                                                                                      : ""));
    auto* value = new QTableWidgetItem(QString::number(p, 'f', 3));
    value->setData(Qt::UserRole, p);
    if (cls == m.trueClass) name->setForeground(QColor(0x5f, 0xd3, 0x6a));
    if (cls == m.predicted) name->setForeground(QColor(0xff, 0x8c, 0x6b));
    top5_->setItem(i, 0, name);
    top5_->setItem(i, 1, value);
  }
}

}  // namespace gn::editor
