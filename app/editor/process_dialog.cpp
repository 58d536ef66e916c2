#include "process_dialog.h"

#include <QDialogButtonBox>
#include <QFileDialog>
#include <QFileInfo>
#include <QFormLayout>
#include <QHBoxLayout>
#include <QLabel>
#include <QLineEdit>
#include <QProcess>
#include <QPushButton>
#include <QSettings>
#include <QSpinBox>
#include <QVBoxLayout>

namespace gn::editor {

namespace {
constexpr int kMaxProcesses = 64;
const char* kProcessesKey = "processRun/processes";
const char* kHostFileKey = "processRun/hostFile";
const char* kExtraArgsKey = "processRun/extraArgs";
}  // namespace

ProcessRunOptions ProcessRunDialog::remembered() {
  QSettings s;
  ProcessRunOptions o;
  o.processes = qBound(1, s.value(kProcessesKey, 2).toInt(), kMaxProcesses);
  o.hostFile = s.value(kHostFileKey).toString();
  // Unset (never accepted) is not the same as cleared: an empty line the user chose stays empty.
  o.extraArgs =
      QProcess::splitCommand(s.value(kExtraArgsKey, ProcessRunOptions::defaultExtraArgs()).toString());
  return o;
}

ProcessRunDialog::ProcessRunDialog(QWidget* parent)
    : QDialog(parent), mpirun_(ProcessRunOptions::findMpirun()) {
  setObjectName("processRunDialog");
  setWindowTitle("Run on processes");
  const QSettings s;

  processes_ = new QSpinBox(this);
  processes_->setObjectName("processesSpin");
  processes_->setRange(1, kMaxProcesses);
  processes_->setValue(remembered().processes);
  processes_->setToolTip(
      "How many processes (ranks) mpirun starts. The Train node's devices become the ranks' devices "
      "together: each rank trains on its share of every batch.");

  hostFile_ = new QLineEdit(s.value(kHostFileKey).toString(), this);
  hostFile_->setObjectName("hostFileEdit");
  hostFile_->setPlaceholderText("none: every process on this machine");
  hostFile_->setClearButtonEnabled(true);
  hostFile_->setToolTip(
      "An Open MPI host file (one host per line, \"node1 slots=4\"). Every host must see the graph's data "
      "and the editor's graph file: save the graph in a shared folder first.");
  auto* browse = new QPushButton("Browse…", this);
  connect(browse, &QPushButton::clicked, this, [this] {
    const QString path = QFileDialog::getOpenFileName(this, "Host file", QFileInfo(hostFile_->text()).path());
    if (!path.isEmpty()) hostFile_->setText(path);
  });
  auto* hostRow = new QHBoxLayout;
  hostRow->addWidget(hostFile_, 1);
  hostRow->addWidget(browse);

  extraArgs_ = new QLineEdit(s.value(kExtraArgsKey, ProcessRunOptions::defaultExtraArgs()).toString(), this);
  extraArgs_->setObjectName("mpirunArgsEdit");
  extraArgs_->setMinimumWidth(520);
  extraArgs_->setToolTip(
      "Passed to mpirun before the gpunodes binary, split as a shell would (quote an argument with spaces). "
      "As root in a container: --allow-run-as-root; more ranks than cores: --oversubscribe; one machine "
      "without a network: --mca btl self,tcp --mca btl_tcp_if_include lo.");
  auto* defaults = new QPushButton("Defaults", this);
  defaults->setToolTip("Back to " + ProcessRunOptions::defaultExtraArgs());
  connect(defaults, &QPushButton::clicked, this,
          [this] { extraArgs_->setText(ProcessRunOptions::defaultExtraArgs()); });
  auto* argsRow = new QHBoxLayout;
  argsRow->addWidget(extraArgs_, 1);
  argsRow->addWidget(defaults);

  preview_ = new QLabel(this);
  preview_->setObjectName("commandPreview");
  preview_->setWordWrap(true);
  preview_->setTextInteractionFlags(Qt::TextSelectableByMouse);
  preview_->setStyleSheet("color: #a0a6ae; font-family: monospace;");

  missing_ = new QLabel(this);
  missing_->setObjectName("mpirunMissing");
  missing_->setWordWrap(true);
  missing_->setStyleSheet("color: #ff7b7b;");
  missing_->setText(
      "mpirun is not on PATH, so the graph cannot run on several processes. Install Open MPI "
      "(apt-get install openmpi-bin) or add its bin folder to PATH, then open this dialog again.");
  missing_->setVisible(mpirun_.isEmpty());

  auto* form = new QFormLayout;
  form->addRow("Processes", processes_);
  form->addRow("Host file", hostRow);
  form->addRow("mpirun arguments", argsRow);

  buttons_ = new QDialogButtonBox(QDialogButtonBox::Ok | QDialogButtonBox::Cancel, this);
  buttons_->button(QDialogButtonBox::Ok)->setText("Run");
  buttons_->button(QDialogButtonBox::Ok)->setEnabled(!mpirun_.isEmpty());
  connect(buttons_, &QDialogButtonBox::accepted, this, &QDialog::accept);
  connect(buttons_, &QDialogButtonBox::rejected, this, &QDialog::reject);

  auto* layout = new QVBoxLayout(this);
  layout->addLayout(form);
  layout->addWidget(new QLabel("The job runs:", this));
  layout->addWidget(preview_);
  layout->addWidget(missing_);
  layout->addWidget(buttons_);

  connect(processes_, &QSpinBox::valueChanged, this, &ProcessRunDialog::updatePreview);
  connect(hostFile_, &QLineEdit::textChanged, this, &ProcessRunDialog::updatePreview);
  connect(extraArgs_, &QLineEdit::textChanged, this, &ProcessRunDialog::updatePreview);
  updatePreview();
}

ProcessRunOptions ProcessRunDialog::options() const {
  ProcessRunOptions o;
  o.processes = processes_->value();
  o.hostFile = hostFile_->text().trimmed();
  o.extraArgs = QProcess::splitCommand(extraArgs_->text());
  o.mpirun = mpirun_;
  return o;
}

void ProcessRunDialog::updatePreview() {
  const ProcessRunOptions o = options();
  QStringList line{mpirun_.isEmpty() ? QString("mpirun") : mpirun_};
  line += o.arguments("GRAPH.json", "REPORT.json");
  preview_->setText(ProcessRunOptions::commandText(line));
}

void ProcessRunDialog::accept() {
  QSettings s;
  s.setValue(kProcessesKey, processes_->value());
  s.setValue(kHostFileKey, hostFile_->text().trimmed());
  s.setValue(kExtraArgsKey, extraArgs_->text());
  QDialog::accept();
}

}  // namespace gn::editor
