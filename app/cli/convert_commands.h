// gpunodes import-<format> and export-<format>: the model file formats the loaded plugins convert
// (core/format_converter.h), the GPU node set's ONNX among them. See docs/cli.md.
#pragma once
#include <QString>
#include <QStringList>

namespace gn::cli {

// Whether `command` is one of these ("import-onnx"): any import-/export- word, checked against the
// plugins' formats when it runs.
bool isConvertCommand(const QString& command);
// Runs it; returns the exit code (0 ok, 1 the conversion failed, 2 usage).
int commandConvert(const QString& command, const QStringList& args);
// The usage lines in the global usage.
QString convertUsage();
// The command's own usage (`gpunodes import-onnx --help`): its options, and the rule for existing files.
QString convertCommandUsage(const QString& command);

}  // namespace gn::cli
