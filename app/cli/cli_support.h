// What the headless subcommands share (cli.cpp defines them): output, argument parsing, plugins, --set,
// and writing report, metrics and trace files.
#pragma once
#include <QByteArray>
#include <QCommandLineParser>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QStringList>
#include <atomic>

#include "cli/cli.h"

namespace gn::core {
class GraphDocument;
class NodeTypeRegistry;
struct Issue;
}  // namespace gn::core

namespace gn::cli {

void out(const QString& text);  // stdout, flushed
void err(const QString& text);  // stderr, flushed
// Prints the message and the usage text; returns kUsage.
int usageError(const QString& message);

// Set by the SIGINT handler; the main loops poll it and cancel.
extern std::atomic<int> g_interrupted;
// One-shot: a second Ctrl-C ends the process at once.
void installInterruptHandler();

struct Parsed {
  bool ok = false;
  int exitCode = kOk;
  QStringList positional;
};
// QCommandLineParser, but usage errors exit 2 and --help prints our text.
Parsed parse(QCommandLineParser& parser, const QString& command, const QStringList& args, int positionals);

void loadPlugins(core::NodeTypeRegistry& registry);
// Writes atomically; on failure prints "error: cannot write <what> ..." and returns false.
bool saveBytes(const QString& path, const QByteArray& bytes, const QString& what);
QString csvField(const QString& s);
// The report's metrics as CSV: series,t,value.
QByteArray metricsCsv(const QJsonObject& metrics);
// "file: node.field: message" per issue on stderr (warnings only when asked).
void printIssues(const QString& file, const QList<core::Issue>& issues, bool warnings);
// Applies one --set NODE.PARAM=VALUE; returns an error message, empty on success.
QString applySet(core::GraphDocument& doc, const core::NodeTypeRegistry& registry, const QString& file,
                 const QString& text);
// The report of a run that never started.
QJsonObject failedReport(const QString& file, const QString& error);

}  // namespace gn::cli
