// What the headless subcommands share (cli.cpp defines them): output, argument parsing, plugins, --set,
// and writing report, metrics and trace files. The text of those files (CSV, numbers, bytes) comes from
// gpunodes/core/report_format.h, which the editor's exports use too.
#pragma once
#include <QByteArray>
#include <QCommandLineParser>
#include <QJsonObject>
#include <QList>
#include <QString>
#include <QStringList>
#include <atomic>
#include <optional>

#include "cli/cli.h"
#include "gpunodes/core/file_access.h"

namespace gn::core {
class GraphDocument;
class NodeTypeRegistry;
struct Issue;
}  // namespace gn::core

namespace gn::dist {
class World;
}

namespace gn::cli {

void out(const QString& text);  // stdout, flushed
void err(const QString& text);  // stderr, flushed
// `s` cut to `max` characters, ending in "..." when cut: a user's value quoted in a message.
QString shorten(const QString& s, int max = 60);
// --allow-write DIR (repeatable) and --force, for the commands that run or check a graph file: what the
// graph may write besides its own folder, and whether it may replace files that are not gpunodes' own.
struct FileAccessOptions {
  QCommandLineOption allowWrite{QStringLiteral("allow-write"), QString(), QStringLiteral("DIR")};
  QCommandLineOption force{QStringLiteral("force")};
  // --folder DIR: the folder the graph's relative paths are relative to, instead of its file's (the
  // editor runs a copy of the graph under mpirun and names the original's folder).
  QCommandLineOption folder{QStringLiteral("folder"), QString(), QStringLiteral("DIR")};
  QList<QCommandLineOption> all() const { return {allowWrite, force, folder}; }
  // The policy for `graphFile` (its folder; each --allow-write absolute against the working directory).
  core::FilePolicy policy(const QCommandLineParser& parser, const QString& graphFile) const;
};

// Prints the message and the usage text (the global one, or `usageText`: a command's own); returns kUsage.
int usageError(const QString& message);
int usageError(const QString& message, const QString& usageText);

// Set by the SIGINT handler (1) and, in a distributed run, the SIGTERM handler (2: mpirun is ending the job);
// the main loops poll it and cancel.
extern std::atomic<int> g_interrupted;
// One-shot: a second Ctrl-C ends the process at once.
void installInterruptHandler();
void installTerminateHandler();

// Under mpirun: joins the job (MPI initialised, this rank's GPU chosen, err() lines prefixed "[rank k] " on
// ranks other than 0, SIGTERM heard); null when launched alone. When joining fails it says why and sets
// *failed.
dist::World* joinWorld(bool* failed);
// A report, metrics or trace path for this rank: "%r" becomes the rank (0 alone).
QString perRankPath(const QString& path, const dist::World* world);
// Whether this rank writes `path`: rank 0 always; the others only per-rank paths (with "%r").
bool writesOnThisRank(const QString& path, const dist::World* world);

struct Parsed {
  bool ok = false;
  int exitCode = kOk;
  QStringList positional;
};
// QCommandLineParser, but usage errors exit 2 and --help prints our text: `commandUsage` when given (a
// command's own usage, also printed after its usage errors), otherwise the global usage.
Parsed parse(QCommandLineParser& parser, const QString& command, const QStringList& args, int positionals,
             const QString& commandUsage = {});

void loadPlugins(core::NodeTypeRegistry& registry);
// Writes atomically; on failure prints "error: cannot write <what> ..." and returns false.
bool saveBytes(const QString& path, const QByteArray& bytes, const QString& what);
// "file: node.field: message" per issue on stderr (warnings only when asked).
void printIssues(const QString& file, const QList<core::Issue>& issues, bool warnings);
// --cpu-devices N: 1 to 1024; otherwise nullopt and the usage message in *error.
std::optional<int> parseCpuDevices(const QString& text, QString* error);
// Applies one --set NODE.PARAM=VALUE; returns an error message, empty on success.
QString applySet(core::GraphDocument& doc, const core::NodeTypeRegistry& registry, const QString& file,
                 const QString& text);
// The report of a run that never started.
QJsonObject failedReport(const QString& file, const QString& error);

}  // namespace gn::cli
