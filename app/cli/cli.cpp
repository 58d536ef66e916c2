#include "cli/cli.h"

#include <unistd.h>

#include <QCommandLineParser>
#include <QCoreApplication>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QMap>
#include <QRegularExpression>
#include <QSaveFile>
#include <QSet>
#include <QSysInfo>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <vector>

#include "cli/cli_support.h"
#include "cli/convert_commands.h"
#include "cli/inspect_commands.h"
#include "cli/run_command.h"
#include "cli/sweep.h"
#include "gpunodes/core/executor.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/report_format.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/subgraph.h"
#include "gpunodes/core/validation.h"
#include "gpunodes/dist/world.h"

namespace gn::cli {

using namespace gn::core;

void write(FILE* to, const QString& text) {
  const QByteArray bytes = text.toUtf8();
  std::fwrite(bytes.constData(), 1, size_t(bytes.size()), to);
  std::fflush(to);
}
void out(const QString& text) {
  write(stdout, text);
}
// "[rank k] " on the ranks other than 0 of a distributed run: every line they print says where it came from.
QString g_errPrefix;

void err(const QString& text) {
  if (g_errPrefix.isEmpty()) return write(stderr, text);
  QString prefixed;
  for (const QString& line : text.split(u'\n'))
    if (!line.isEmpty()) prefixed += g_errPrefix + line + u'\n';
  write(stderr, prefixed);
}

dist::World* joinWorld(bool* failed) {
  *failed = false;
  if (!dist::launch_info().under_mpirun) return nullptr;
  dist::select_local_gpu();
  try {
    dist::World& world = dist::World::get();
    g_errPrefix = world.is_root() ? QString() : QString::fromStdString(world.prefix());
    // mpirun ends the other ranks with SIGTERM when one is lost and when it gets Ctrl-C itself.
    installTerminateHandler();
    // Across hosts, Open MPI's daemons must notice a lost host before the ranks give up on it.
    if (const std::string w = world.launcher_warning(); !w.empty())
      err(QStringLiteral("warning: %1\n").arg(QString::fromStdString(w)));
    return &world;
  } catch (const std::exception& e) {
    err(QStringLiteral("error: cannot join the MPI job: %1\n").arg(e.what()));
    *failed = true;
    return nullptr;
  }
}

QString perRankPath(const QString& path, const dist::World* world) {
  QString p = path;
  return p.replace(QLatin1String("%r"), QString::number(world ? world->rank() : 0));
}

bool writesOnThisRank(const QString& path, const dist::World* world) {
  return !world || world->is_root() || path.contains(QLatin1String("%r"));
}

int usageError(const QString& message) { return usageError(message, usage()); }

int usageError(const QString& message, const QString& usageText) {
  err(QStringLiteral("gpunodes: %1\n\n%2").arg(message, usageText));
  return kUsage;
}

// The SIGINT handler only sets this flag (async-signal-safe); the main loop polls it and cancels.
std::atomic<int> g_interrupted{0};
static_assert(std::atomic<int>::is_always_lock_free);

extern "C" void onInterrupt(int) {
  g_interrupted.store(1);
}

extern "C" void onTerminate(int) {
  g_interrupted.store(2);
}

void installTerminateHandler() {
  struct sigaction action {};
  action.sa_handler = onTerminate;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESETHAND;
  sigaction(SIGTERM, &action, nullptr);
}

void installInterruptHandler() {
  struct sigaction action {};
  action.sa_handler = onInterrupt;
  sigemptyset(&action.sa_mask);
  // One-shot: a second Ctrl-C gets the default action and ends the process at once.
  action.sa_flags = SA_RESETHAND;
  sigaction(SIGINT, &action, nullptr);
}

// QCommandLineParser, but usage errors exit 2 and --help prints our text.
Parsed parse(QCommandLineParser& parser, const QString& command, const QStringList& args, int positionals,
             const QString& commandUsage) {
  parser.setSingleDashWordOptionMode(QCommandLineParser::ParseAsLongOptions);
  const QCommandLineOption help(QStringList{"h", "help"});
  parser.addOption(help);
  const QString usageText = commandUsage.isEmpty() ? usage() : commandUsage;
  Parsed p;
  if (!parser.parse(QStringList{"gpunodes " + command} + args)) {
    p.exitCode = usageError(QStringLiteral("%1: %2").arg(command, parser.errorText()), usageText);
    return p;
  }
  if (parser.isSet(help)) {
    out(usageText);
    return p;
  }
  p.positional = parser.positionalArguments();
  if (p.positional.size() != positionals) {
    p.exitCode = usageError(
        positionals == 0 ? QStringLiteral("%1 takes no file (got \"%2\")").arg(command, p.positional.value(0))
        : p.positional.isEmpty()
            ? QStringLiteral("%1: missing FILE").arg(command)
            : QStringLiteral("%1 takes one FILE (got %2 arguments)").arg(command).arg(p.positional.size()),
        usageText);
    return p;
  }
  p.ok = true;
  return p;
}

void loadPlugins(NodeTypeRegistry& registry) {
  registry.loadPlugins();
  for (const NodeTypeRegistry::LoadError& e : registry.loadErrors())
    err(QStringLiteral("gpunodes: warning: plugin %1: %2\n").arg(e.path, e.reason));
  if (registry.plugins().isEmpty())
    err(QStringLiteral("gpunodes: warning: no node plugins found (looked in: %1); set GPUNODES_PLUGIN_PATH\n")
            .arg(NodeTypeRegistry::defaultPluginDirs().join(", ")));
}

std::optional<int> parseCpuDevices(const QString& text, QString* error) {
  bool ok = false;
  const int n = text.toInt(&ok);
  if (!ok || n < 1 || n > 1024) {
    *error = QStringLiteral("--cpu-devices: expected a number from 1 to 1024, got \"%1\"").arg(text);
    return std::nullopt;
  }
  return n;
}

QString shorten(const QString& s, int max) {
  return s.size() > max ? s.left(max - 3) + "..." : s;
}

FilePolicy FileAccessOptions::policy(const QCommandLineParser& parser, const QString& graphFile) const {
  FilePolicy p;
  p.folder =
      parser.isSet(folder) ? resolvePath(QDir::currentPath(), parser.value(folder)) : graphFolder(graphFile);
  for (const QString& dir : parser.values(allowWrite)) p.allowWrite.append(resolvePath(QDir::currentPath(), dir));
  p.replaceForeign = parser.isSet(force);
  return p;
}

bool saveBytes(const QString& path, const QByteArray& bytes, const QString& what) {
  QSaveFile file(path);
  if (!file.open(QIODevice::WriteOnly) || file.write(bytes) != bytes.size() || !file.commit()) {
    err(QStringLiteral("error: %1: cannot write the %2: %3\n").arg(path, what, file.errorString()));
    return false;
  }
  return true;
}

// Issues as one line each, naming the file; a cycle is reported on each of its nodes but printed once.
void printIssues(const QString& file, const QList<Issue>& issues, bool warnings) {
  QSet<QString> printedCycles;
  for (const Issue& i : issues) {
    const bool error = i.severity == Issue::Severity::Error;
    if (!error && !warnings) continue;
    if (i.message.startsWith(QStringLiteral("cycle: "))) {
      if (printedCycles.contains(i.message)) continue;
      printedCycles.insert(i.message);
      err(QStringLiteral("%1: %2: %3\n").arg(error ? "error" : "warning", file, i.message));
      continue;
    }
    err(QStringLiteral("%1: %2: %3\n").arg(error ? "error" : "warning", file, i.text()));
  }
}

QString usage() {
  return QStringLiteral(
      "usage: gpunodes [FILE]                  open the editor (optionally a graph)\n"
      "       gpunodes run FILE [options]      run headless\n"
      "           --set NODE.PARAM=VALUE       override a param (repeatable); shapes as 100x100 or "
      "[100,100]\n"
      "           --resume                     every Train node continues from the newest checkpoint in\n"
      "                                        its checkpoint_dir (sets resume=auto)\n"
      "           --report OUT.json            the run report\n"
      "           --events FILE|-              the live run events as JSON lines (- for stdout)\n"
      "           --metrics OUT.csv            metric samples: series,t,value\n"
      "           --trace OUT.json             Chrome trace (open in Perfetto or chrome://tracing)\n"
      "           --schedule parallel|sequential\n"
      "           --cpu-devices N              split the CPU into N devices\n"
      "           --quiet                      no progress and no summary\n"
      "           --allow-write DIR            the graph may also write in DIR (repeatable); by default\n"
      "                                        a graph writes only inside its own file's folder\n"
      "           --force                      the graph may replace files that are not gpunodes' own\n"
      "           --folder DIR                 relative paths in the graph are relative to DIR (default:\n"
      "                                        the graph file's folder)\n"
      "       gpunodes sweep FILE --grid NODE.PARAM=V1,V2,... [--grid ...] [options]\n"
      "                                        run every point of the grid (over the ranks under mpirun)\n"
      "           --out DIR                    point-NNNN.json, summary.json, summary.csv, plot-*.png\n"
      "                                        (default: sweep-<FILE's base name>)\n"
      "           --set, --schedule, --cpu-devices, --quiet, --allow-write, --force, --folder\n"
      "                                        as for run\n"
      "       gpunodes validate FILE           check only; per-node errors (--allow-write, --force,\n"
      "                                        --folder as for run)\n"
      "       gpunodes devices [--json]        what try_all_gpus sees\n"
      "       gpunodes nodes [--json]          the node catalogue from loaded plugins\n") +
         convertUsage() +
         QStringLiteral(
      "exit codes: 0 ok, 1 graph invalid or a node failed, 2 usage, 130 cancelled (Ctrl-C)\n"
      "plugins: <binary dir>/plugins, the install prefix, and GPUNODES_PLUGIN_PATH (colon-separated)\n");
}

bool isCommand(const QString& arg) {
  return arg == "run" || arg == "sweep" || arg == "validate" || arg == "devices" || arg == "nodes" ||
         arg == "help" || arg == "-h" || arg == "--help" || isConvertCommand(arg);
}

QJsonValue parseParamValue(const ParamSpec& spec, const QString& raw, QString* error) {
  const QString text = raw.trimmed();
  auto fail = [&](const QString& why) {
    if (error) *error = why;
    return QJsonValue(QJsonValue::Undefined);
  };
  auto integer = [](const QString& s) -> std::optional<QJsonValue> {
    bool ok = false;
    const qlonglong i = s.trimmed().toLongLong(&ok);
    if (ok) return QJsonValue(qint64(i));
    const double d = s.trimmed().toDouble(&ok);  // "1e6" is an integer too
    if (ok && std::isfinite(d) && d == std::floor(d)) return QJsonValue(d);
    return std::nullopt;
  };
  QJsonValue value;
  switch (spec.type) {
    case ParamType::Int: {
      const std::optional<QJsonValue> v = integer(text);
      if (!v) return fail(QStringLiteral("expected an integer, got \"%1\"").arg(shorten(text)));
      value = *v;
      break;
    }
    case ParamType::Float: {
      bool ok = false;
      const double d = text.toDouble(&ok);
      if (!ok) return fail(QStringLiteral("expected a number, got \"%1\"").arg(shorten(text)));
      value = d;
      break;
    }
    case ParamType::Bool: {
      const QString t = text.toLower();
      if (t == "true" || t == "1" || t == "yes" || t == "on")
        value = true;
      else if (t == "false" || t == "0" || t == "no" || t == "off")
        value = false;
      else
        return fail(QStringLiteral("expected true or false, got \"%1\"").arg(shorten(text)));
      break;
    }
    case ParamType::String:
    case ParamType::Enum:
      value = raw;
      break;
    case ParamType::Shape: {
      QString t = text;
      if (t.startsWith(u'[') && t.endsWith(u']')) t = t.mid(1, t.size() - 2);
      QJsonArray dims;
      if (!t.trimmed().isEmpty()) {
        static const QRegularExpression separators(QStringLiteral("[xX,*]"));
        for (const QString& part : t.split(separators)) {
          const std::optional<QJsonValue> v = integer(part);
          if (!v)
            return fail(
                QStringLiteral("expected a shape like 100x100 or [100,100], got \"%1\"").arg(shorten(text)));
          dims.append(*v);
        }
      }
      value = dims;
      break;
    }
  }
  const QString problem = checkParam(spec, value);
  if (!problem.isEmpty()) return fail(problem);
  return value;
}

int runCommand(int argc, char** argv) {
  // sweep makes its own application object: a QApplication for its plots in a GUI build.
  if (argc >= 2 && QString::fromLocal8Bit(argv[1]) == "sweep") return commandSweep(argc, argv);
  QCoreApplication app(argc, argv);  // applicationDirPath() finds <bin>/plugins
  QCoreApplication::setApplicationName(QStringLiteral("gpunodes"));
  const QStringList all = QCoreApplication::arguments();
  const QString command = all.value(1);
  const QStringList args = all.mid(2);
  if (command == "help" || command == "-h" || command == "--help") {
    out(usage());
    return kOk;
  }
  if (command == "run") return commandRun(args);
  if (command == "validate") return commandValidate(args);
  if (command == "devices") return commandDevices(args);
  if (command == "nodes") return commandNodes(args);
  if (isConvertCommand(command)) return commandConvert(command, args);
  return usageError(QStringLiteral("unknown command \"%1\"").arg(command));
}

}  // namespace gn::cli
