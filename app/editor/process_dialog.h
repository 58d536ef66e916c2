// Run ▸ Run on processes…: how many processes, an optional host file and mpirun's own arguments, remembered
// between sessions. OK stays disabled, with the reason shown, when mpirun is not on PATH.
#pragma once
#include <QDialog>

#include "process_run.h"

class QDialogButtonBox;
class QLabel;
class QLineEdit;
class QSpinBox;

namespace gn::editor {

class ProcessRunDialog : public QDialog {
  Q_OBJECT
 public:
  explicit ProcessRunDialog(QWidget* parent = nullptr);

  // What the dialog shows; mpirun is the one found on PATH.
  ProcessRunOptions options() const;
  bool mpirunFound() const { return !mpirun_.isEmpty(); }
  // The choices the dialog last accepted (QSettings), or its defaults.
  static ProcessRunOptions remembered();

  void accept() override;  // remembers the choices

 private:
  void updatePreview();

  QString mpirun_;
  QSpinBox* processes_;
  QLineEdit *hostFile_, *extraArgs_;
  QLabel *preview_, *missing_;
  QDialogButtonBox* buttons_;
};

}  // namespace gn::editor
