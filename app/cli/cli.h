// The headless front of the `gpunodes` binary: run, validate, devices and nodes (see docs/cli.md). Exit
// codes: 0 ok, 1 graph invalid or a node failed, 2 usage, 130 cancelled by Ctrl-C.
#pragma once
#include <QJsonValue>
#include <QString>

namespace gn::core {
struct ParamSpec;
}

namespace gn::cli {

enum ExitCode { kOk = 0, kFailed = 1, kUsage = 2, kCancelled = 130 };

// Whether argv[1] is a subcommand or a help flag (otherwise it is a graph file for the editor).
bool isCommand(const QString& arg);
// Runs the subcommand in argv[1]; returns the exit code.
int runCommand(int argc, char** argv);
// The usage text, for --help and usage errors.
QString usage();
// A --set value as the param's JSON value: "5", "0.5", "true", "last", "100x100" or "[100, 100]" for a
// shape. Type- and range-checked against the spec; on failure returns Undefined and says why in *error.
QJsonValue parseParamValue(const gn::core::ParamSpec& spec, const QString& text, QString* error);

}  // namespace gn::cli
