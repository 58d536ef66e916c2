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

int usageError(const QString& message) {
  err(QStringLiteral("gpunodes: %1\n\n%2").arg(message, usage()));
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
Parsed parse(QCommandLineParser& parser, const QString& command, const QStringList& args, int positionals) {
  parser.setSingleDashWordOptionMode(QCommandLineParser::ParseAsLongOptions);
  const QCommandLineOption help(QStringList{"h", "help"});
  parser.addOption(help);
  Parsed p;
  if (!parser.parse(QStringList{"gpunodes " + command} + args)) {
    p.exitCode = usageError(QStringLiteral("%1: %2").arg(command, parser.errorText()));
    return p;
  }
  if (parser.isSet(help)) {
    out(usage());
    return p;
  }
  p.positional = parser.positionalArguments();
  if (p.positional.size() != positionals) {
    p.exitCode = usageError(
        positionals == 0 ? QStringLiteral("%1 takes no file (got \"%2\")").arg(command, p.positional.value(0))
        : p.positional.isEmpty()
            ? QStringLiteral("%1: missing FILE").arg(command)
            : QStringLiteral("%1 takes one FILE (got %2 arguments)").arg(command).arg(p.positional.size()));
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

QString shorten(const QString& s, int max = 60) {
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

// ---- run --------------------------------------------------------------------------------------------

class Progress {
 public:
  Progress(bool tty, bool quiet, int total) : tty_(tty), quiet_(quiet), total_(total) { clock_.start(); }

  // The node running and how far it got, as "train was 43% done"; empty before the first node starts.
  QString where() const {
    if (current_.isEmpty()) return {};
    return QStringLiteral("%1 was %2% done").arg(current_).arg(qRound(nodeProgress_ * 100));
  }

  void handle(const RunEvent& e) {
    if (e.kind == RunEvent::Kind::NodeStarted) current_ = e.node, nodeProgress_ = 0;
    if (e.kind == RunEvent::Kind::Progress && e.node == current_) nodeProgress_ = e.value;
    if (quiet_) return;
    switch (e.kind) {
      case RunEvent::Kind::NodeStarted:
        current_ = e.node;
        nodeProgress_ = 0;
        if (!tty_) line(QStringLiteral("[%1] started").arg(e.node));
        break;
      case RunEvent::Kind::NodeFinished:
        ++done_;
        if (!tty_) line(QStringLiteral("[%1] finished in %2 ms").arg(e.node).arg(e.value, 0, 'f', 1));
        break;
      case RunEvent::Kind::NodeCached:
        ++done_;
        if (!tty_) line(QStringLiteral("[%1] cached: not run, its outputs reused").arg(e.node));
        break;
      case RunEvent::Kind::NodeFailed:
        ++done_;
        // Only a failure is an error; the other outcomes say what became of the node in their message.
        if (e.status == NodeStatus::Failed)
          line(QStringLiteral("[%1] failed: %2").arg(e.node, e.message));
        else
          line(QStringLiteral("[%1] %2").arg(e.node, e.message));
        break;
      case RunEvent::Kind::NodeWarning:
        line(QStringLiteral("[%1] warning: %2")
                 .arg(e.node.isEmpty() ? QStringLiteral("graph") : e.node, e.message));
        break;
      case RunEvent::Kind::Progress:
        if (e.node == current_) nodeProgress_ = e.value;
        break;
      default:
        break;
    }
  }

  // The bar, redrawn at most 10 times a second.
  void tick(bool force = false) {
    if (quiet_ || !tty_) return;
    if (!force && lastDraw_.isValid() && lastDraw_.elapsed() < 100) return;
    lastDraw_.start();
    constexpr int kWidth = 24;
    const double fraction =
        total_ > 0 ? std::min(1.0, (done_ + nodeProgress_ * (done_ < total_)) / total_) : 1.0;
    const int filled = int(std::lround(fraction * kWidth));
    QString bar = QStringLiteral("\r[%1%2] %3/%4 nodes  %5  %6 s")
                      .arg(QString(filled, u'#'), QString(kWidth - filled, u'-'))
                      .arg(done_)
                      .arg(total_)
                      .arg(done_ < total_ ? shorten(current_, 20) : QString())
                      .arg(clock_.elapsed() / 1000.0, 0, 'f', 1);
    const int visible = int(bar.size());
    if (visible < drawn_) bar += QString(drawn_ - visible, u' ');
    drawn_ = visible;
    err(bar);
  }

  void clear() {
    if (quiet_ || !tty_ || drawn_ == 0) return;
    err(u'\r' + QString(drawn_, u' ') + u'\r');
    drawn_ = 0;
  }

 private:
  void line(const QString& text) {
    clear();
    err(text + u'\n');
    tick(true);
  }

  bool tty_, quiet_;
  int total_, done_ = 0, drawn_ = 0;
  double nodeProgress_ = 0;
  QString current_;
  QElapsedTimer clock_, lastDraw_;
};

QString cell(const QJsonValue& v, int precision) {
  if (v.isNull() || v.isUndefined()) return QStringLiteral("-");
  return QString::number(v.toDouble(), 'f', precision);
}

void printSummary(const GraphDocument& doc, const QJsonObject& report) {
  const QStringList header{"node",    "type",   "device", "calls", "time (ms)",
                           "GFLOP/s", "% peak", "bytes",  "status"};
  QList<QStringList> rows;
  const QJsonObject nodes = report.value("nodes").toObject();
  QSet<QString> seen;
  for (const GraphNode& n : doc.nodes()) {
    if (seen.contains(n.id)) continue;
    seen.insert(n.id);
    const QJsonObject o = nodes.value(n.id).toObject();
    const bool hasFlops = o.value("gflops").toDouble() > 0;
    rows.append(
        {n.id, n.type,
         o.value("device").toString().isEmpty() ? QStringLiteral("-") : o.value("device").toString(),
         QString::number(o.value("calls").toInteger()), cell(o.value("time_ms"), 2),
         hasFlops ? cell(o.value("gflops"), 1) : QStringLiteral("-"),
         hasFlops ? cell(o.value("pct_peak"), 1) : QStringLiteral("-"),
         o.value("bytes").toDouble() > 0 ? formatBytes(o.value("bytes").toDouble()) : QStringLiteral("-"),
         o.value("status").toString()});
  }
  QList<int> width;
  for (const QString& h : header) width.append(int(h.size()));
  for (const QStringList& r : rows)
    for (int c = 0; c < r.size(); ++c) width[c] = std::max(width[c], int(r[c].size()));
  auto format = [&](const QStringList& r) {
    QString line;
    for (int c = 0; c < r.size(); ++c) {
      const bool numeric = c >= 3 && c <= 7;
      line += numeric ? r[c].rightJustified(width[c]) : r[c].leftJustified(width[c]);
      if (c + 1 < r.size()) line += QStringLiteral("  ");
    }
    return line.trimmed() + u'\n';
  };
  QString table = u'\n' + format(header);
  for (const QStringList& r : rows) table += format(r);
  for (const GraphNode& n : doc.nodes()) {
    const QJsonObject o = nodes.value(n.id).toObject();
    const QString error = o.value("error").toString();
    if (!error.isEmpty() && o.value("status").toString() == "failed")
      table += QStringLiteral("%1: %2\n").arg(n.id, error);
  }
  // Text a node made (a Generate node's continuation), as its report field generated_text carries it.
  for (const GraphNode& n : doc.nodes()) {
    const QString text = nodes.value(n.id).toObject().value("generated_text").toString();
    if (!text.isEmpty()) table += QStringLiteral("\n%1 generated:\n%2\n").arg(n.id, text);
  }
  // The last value of each metric series (loss, test accuracy, ...): what a batch script usually wants to
  // see.
  const QJsonObject metrics = report.value("metrics").toObject();
  if (!metrics.isEmpty()) table += QStringLiteral("\nmetric (last value of n samples)\n");
  for (auto it = metrics.begin(); it != metrics.end(); ++it) {
    const QJsonArray samples = it.value().toArray();
    if (samples.isEmpty()) continue;
    const double last = samples.last().toArray().at(1).toDouble();
    table += QStringLiteral("%1 = %2  (n = %3)\n")
                 .arg(it.key(), QString::number(last, 'g', 6))
                 .arg(samples.size());
  }
  const double seconds = report.value("wall_ms").toDouble() / 1000.0;
  if (report.value("cancelled").toBool())
    table += QStringLiteral("cancelled after %1 s\n").arg(seconds, 0, 'f', 2);
  else if (report.value("ok").toBool())
    table += QStringLiteral("ok in %1 s\n").arg(seconds, 0, 'f', 2);
  else
    table += QStringLiteral("FAILED in %1 s\n").arg(seconds, 0, 'f', 2);
  out(table);
}

// Applies one --set NODE.PARAM=VALUE; returns an error message, empty on success.
QString applySet(GraphDocument& doc, const NodeTypeRegistry& registry, const QString& file,
                 const QString& text) {
  const qsizetype eq = text.indexOf(u'=');
  const std::optional<Endpoint> target = eq > 0 ? Endpoint::parse(text.left(eq)) : std::nullopt;
  if (!target) return QStringLiteral("--set %1: expected NODE.PARAM=VALUE").arg(text);
  // A path ("block1/conv2") reaches a node inside a subgraph; a subgraph node's params are its promoted ones.
  const GraphNode* node = subgraph::nodeAt(doc, target->node);
  if (!node) {
    QStringList ids;
    for (const GraphNode& n : doc.nodes()) ids.append(n.id);
    if (ids.size() > 20) ids = ids.mid(0, 20) << QStringLiteral("...");
    return QStringLiteral("--set %1: no node \"%2\" in %3 (nodes: %4)")
        .arg(text, target->node, file, ids.isEmpty() ? QStringLiteral("none") : ids.join(", "));
  }
  const std::optional<NodeTypeSpec> nodeSpec = subgraph::specOf(*node, registry);
  if (!nodeSpec)
    return QStringLiteral("--set %1: node \"%2\" has type \"%3\", which no plugin provides")
        .arg(text, target->node, node->type);
  const ParamSpec* spec = nodeSpec->param(target->port);
  if (!spec) {
    QStringList names;
    for (const ParamSpec& p : nodeSpec->params) names.append(p.name);
    return QStringLiteral("--set %1: %2 (%3) has no param \"%4\" (params: %5)")
        .arg(text, target->node, node->type, target->port,
             names.isEmpty() ? QStringLiteral("none") : names.join(", "));
  }
  QString problem;
  const QJsonValue value = parseParamValue(*spec, text.mid(eq + 1), &problem);
  if (value.isUndefined())
    return QStringLiteral("--set %1: %2 (%3)").arg(text, problem, paramTypeName(spec->type));
  subgraph::setParamAt(doc, target->node, spec->name, value);
  return {};
}

QJsonObject failedReport(const QString& file, const QString& error) {
  return QJsonObject{{"file", file},
                     {"graph", QString()},
                     {"ok", false},
                     {"cancelled", false},
                     {"error", error},
                     {"wall_ms", 0},
                     {"devices", QJsonArray()},
                     {"nodes", QJsonObject()},
                     {"metrics", QJsonObject()},
                     {"memory", QJsonObject()}};
}

// Empty when every rank's graph (the canonical bytes of the one serializer) equals rank 0's; otherwise the
// first rank that differs and where: a node's param, a node missing, a connection or a setting.
QString firstGraphDifference(const std::vector<std::string>& graphs) {
  const auto parse = [](const std::string& bytes) {
    return QJsonDocument::fromJson(QByteArray::fromStdString(bytes)).object();
  };
  const QJsonObject base = parse(graphs.front());
  auto nodesById = [](const QJsonObject& g) {
    QMap<QString, QJsonObject> out;
    for (const QJsonValue& n : g["nodes"].toArray()) out.insert(n["id"].toString(), n.toObject());
    return out;
  };
  const QMap<QString, QJsonObject> baseNodes = nodesById(base);
  for (size_t r = 1; r < graphs.size(); ++r) {
    if (graphs[r] == graphs.front()) continue;
    const QString who = QStringLiteral("rank %1 runs another graph than rank 0: ").arg(r);
    const QJsonObject other = parse(graphs[r]);
    const QMap<QString, QJsonObject> otherNodes = nodesById(other);
    for (auto it = baseNodes.begin(); it != baseNodes.end(); ++it) {
      if (!otherNodes.contains(it.key())) return who + QStringLiteral("it has no node %1").arg(it.key());
      const QJsonObject a = it.value(), b = otherNodes[it.key()];
      if (a["type"] != b["type"])
        return who + QStringLiteral("node %1 is a %2 there, a %3 on rank 0")
                         .arg(it.key(), b["type"].toString(), a["type"].toString());
      const QJsonObject pa = a["params"].toObject(), pb = b["params"].toObject();
      QStringList keys = pa.keys() + pb.keys();
      keys.removeDuplicates();
      for (const QString& k : keys)
        if (pa.value(k) != pb.value(k)) {
          auto text = [](const QJsonValue& v) {
            return v.isUndefined()
                       ? QStringLiteral("unset")
                       : QString::fromUtf8(QJsonDocument(QJsonArray{v}).toJson(QJsonDocument::Compact))
                             .mid(1)
                             .chopped(1);
          };
          return who + QStringLiteral("%1.%2 is %3 there, %4 on rank 0")
                           .arg(it.key(), k, text(pb.value(k)), text(pa.value(k)));
        }
    }
    for (auto it = otherNodes.begin(); it != otherNodes.end(); ++it)
      if (!baseNodes.contains(it.key()))
        return who + QStringLiteral("it has a node %1 that rank 0 has not").arg(it.key());
    if (base["connections"] != other["connections"]) return who + QStringLiteral("its connections differ");
    if (base["settings"] != other["settings"]) return who + QStringLiteral("its settings differ");
    return who + QStringLiteral("its graph file differs (name, description, comments or layout)");
  }
  return {};
}

int commandRun(const QStringList& args) {
  QCommandLineParser parser;
  const QCommandLineOption set("set", "", "NODE.PARAM=VALUE"), report("report", "", "OUT.json"),
      metrics("metrics", "", "OUT.csv"), trace("trace", "", "OUT.json"), schedule("schedule", "", "MODE"),
      cpuDevices("cpu-devices", "", "N"), quiet("quiet"), resume("resume"), events("events", "", "FILE");
  const FileAccessOptions files;
  parser.addOptions({set, report, metrics, trace, schedule, cpuDevices, quiet, resume, events});
  parser.addOptions(files.all());
  const Parsed p = parse(parser, "run", args, 1);
  if (!p.ok) return p.exitCode;
  const QString file = p.positional[0];
  bool joinFailed = false;
  dist::World* world = joinWorld(&joinFailed);
  if (joinFailed) return kFailed;
  const bool distributed = world && world->distributed();
  // Rank 0 speaks for the job; the others print only their errors. Events on stdout leave it to them.
  const bool eventsToStdout = parser.isSet(events) && parser.value(events) == "-";
  const bool beQuiet = parser.isSet(quiet) || (world && !world->is_root()) || eventsToStdout;
  // The live event stream as JSON lines, flushed as they come, for a program that follows the run (the
  // editor following rank 0 of an mpirun job).
  QFile eventFile;
  if (parser.isSet(events) && writesOnThisRank(parser.value(events), world)) {
    const bool opened = eventsToStdout ? eventFile.open(stdout, QIODevice::WriteOnly)
                                       : (eventFile.setFileName(perRankPath(parser.value(events), world)),
                                          eventFile.open(QIODevice::WriteOnly | QIODevice::Truncate));
    if (!opened)
      return usageError(
          QStringLiteral("--events: cannot write %1: %2").arg(parser.value(events), eventFile.errorString()));
  }

  std::optional<int> cpus;
  if (parser.isSet(cpuDevices)) {
    QString problem;
    cpus = parseCpuDevices(parser.value(cpuDevices), &problem);
    if (!cpus) return usageError(problem);
  }
  if (parser.isSet(schedule) && parser.value(schedule) != "parallel" &&
      parser.value(schedule) != "sequential")
    return usageError(QStringLiteral("--schedule: expected parallel or sequential, got \"%1\"")
                          .arg(parser.value(schedule)));

  NodeTypeRegistry registry;
  loadPlugins(registry);

  auto writeOutputs = [&](QJsonObject r, const QList<TraceSpan>& spans,
                          const QList<MemorySampleEvent>& memory) {
    bool ok = true;
    if (world) r.insert("rank", world->rank()), r.insert("world_size", world->size());
    auto wanted = [&](const QCommandLineOption& o) {
      return parser.isSet(o) && writesOnThisRank(parser.value(o), world);
    };
    if (wanted(report))
      ok &= saveBytes(perRankPath(parser.value(report), world),
                      QJsonDocument(r).toJson(QJsonDocument::Indented), "report");
    if (wanted(metrics))
      ok &= saveBytes(perRankPath(parser.value(metrics), world), metricsCsv(r.value("metrics").toObject()),
                      "metrics");
    if (wanted(trace))
      ok &= saveBytes(perRankPath(parser.value(trace), world), chromeTrace(spans, memory), "trace");
    return ok;
  };

  GraphDocument doc;
  QString loadError;
  if (!serializer::loadFile(file, doc, &loadError)) {
    err(QStringLiteral("error: %1\n").arg(loadError));
    writeOutputs(failedReport(file, loadError), {}, {});
    return kFailed;
  }
  for (const QString& s : parser.values(set)) {
    const QString problem = applySet(doc, registry, file, s);
    if (!problem.isEmpty()) return usageError(problem);
  }
  if (parser.isSet(resume)) {
    // After --set, so that a checkpoint_dir given there is the one resumed from. Every node whose type has
    // a "resume" param that can be "auto" (the GPU node set's Train), inside subgraphs too: the flattened
    // graph names each by its path.
    GraphDocument flat;
    subgraph::flatten(doc, flat);
    int resumable = 0;
    for (const GraphNode& n : flat.nodes()) {
      const NodeTypePtr type = registry.find(n.type);
      const ParamSpec* p = type ? type->spec().param(QStringLiteral("resume")) : nullptr;
      if (!p || !p->enumValues.contains(QStringLiteral("auto"))) continue;
      subgraph::setParamAt(doc, n.id, "resume", QStringLiteral("auto"));
      ++resumable;
    }
    if (resumable == 0)
      err(QStringLiteral("warning: --resume: %1 has nothing to resume (no node has a resume param)\n")
              .arg(file));
  }
  QJsonObject settingsJson = doc.settings();
  if (parser.isSet(schedule)) settingsJson.insert("schedule", parser.value(schedule));
  if (cpus) settingsJson.insert("cpu_devices", *cpus);
  doc.setSettings(settingsJson);
  RunSettings settings = RunSettings::fromGraph(settingsJson);
  settings.files = files.policy(parser, file);

  if (distributed) {
    // Every rank must run the same graph: compared before anything runs, so that no rank waits in a
    // collective the others never reach.
    QString difference;
    try {
      const std::vector<std::string> all =
          world->allgather(serializer::save(doc).toStdString(), "comparing the graphs");
      difference = firstGraphDifference(all);
    } catch (const std::exception& e) {
      difference = QString::fromUtf8(e.what());
    }
    if (!difference.isEmpty()) {
      if (world->is_root()) err(QStringLiteral("error: %1\n").arg(difference));
      writeOutputs(failedReport(file, difference), {}, {});
      return kFailed;
    }
  }

  Executor executor(registry);
  ValidationReport validation;
  auto withFile = [&](QJsonObject r) {
    r.insert("file", file);
    r.insert("schedule", settings.schedule);
    r.insert("cpu_devices", settings.cpuDevices);
    return r;
  };
  if (!executor.start(doc, settings, &validation)) {
    printIssues(file, validation.issues(), !beQuiet);
    writeOutputs(withFile(executor.report()), {}, {});
    return kFailed;
  }

  g_interrupted.store(0);
  installInterruptHandler();
  const bool tty = isatty(STDERR_FILENO) == 1;
  // Progress and the summary count what runs: a subgraph's inner nodes, by path (block1/conv2).
  GraphDocument flat;
  if (subgraph::hasSubgraphs(doc)) subgraph::flatten(doc, flat);
  const GraphDocument& runs = subgraph::hasSubgraphs(doc) ? flat : doc;
  Progress progress(tty, beQuiet, int(runs.nodes().size()));
  QList<TraceSpan> spans;
  QList<MemorySampleEvent> memory;
  const bool keepTrace = parser.isSet(trace);
  bool finished = false, cancelling = false;
  while (!finished) {
    for (const RunEvent& e : executor.events().waitAndDrain(50)) {
      if (e.kind == RunEvent::Kind::RunFinished) finished = true;
      if (keepTrace && e.kind == RunEvent::Kind::Span) spans.append(e.span);
      if (keepTrace && e.kind == RunEvent::Kind::Memory) memory.append(e.memory);
      if (eventFile.isOpen())
        eventFile.write(QJsonDocument(eventToJson(e)).toJson(QJsonDocument::Compact) + '\n');
      progress.handle(e);
    }
    if (eventFile.isOpen()) eventFile.flush();
    if (g_interrupted.load() && !cancelling) {
      cancelling = true;
      executor.cancel();
      progress.clear();
      if (g_interrupted.load() == 2)
        // err() prefixes the other ranks' lines; rank 0 names itself here, as every rank says this.
        err(QStringLiteral("%1stopping: mpirun is ending the job (a rank was lost, or it was cancelled)%2\n")
                .arg(world && world->is_root() ? QStringLiteral("[rank 0] ") : QString())
                .arg(progress.where().isEmpty() ? QString() : " while " + progress.where()));
      else
        err(QStringLiteral("gpunodes: cancelling (Ctrl-C again quits at once)\n"));
    }
    progress.tick();
  }
  executor.wait();
  signal(SIGINT, SIG_DFL);
  progress.clear();

  const QJsonObject result = withFile(executor.report());
  if (!beQuiet) printSummary(runs, result);
  const bool written = writeOutputs(result, spans, memory);
  if (executor.wasCancelled()) return g_interrupted.load() == 2 ? kFailed : kCancelled;
  const bool ok = result.value("ok").toBool();
  if (!ok && world && !world->is_root())
    err(QStringLiteral("error: %1\n").arg(result.value("error").toString()));
  // A rank that failed while the others may wait for it in a collective ends the whole job at once; mpirun
  // then names the rank that called MPI_Abort.
  if (!ok && distributed) world->abort(kFailed);
  return ok && written ? kOk : kFailed;
}

// ---- validate, devices, nodes ----------------------------------------------------------------------

// What the checks learned per node before any run (a layer's shape, a network's size), in file order; a
// node's table (a network's layers) under it with aligned columns.
void printFacts(const GraphDocument& doc, const ValidationReport& report) {
  if (report.facts().isEmpty()) return;
  for (const GraphNode& n : doc.nodes()) {
    auto it = report.facts().constFind(n.id);
    if (it == report.facts().constEnd()) continue;
    out(QStringLiteral("  %1 (%2): %3\n").arg(n.id, n.type, it->badge));
    if (it->columns.isEmpty()) continue;
    QList<qsizetype> width;
    for (const QString& c : it->columns) width.append(c.size());
    for (const QStringList& row : it->rows)
      for (qsizetype i = 0; i < row.size() && i < width.size(); ++i)
        width[i] = std::max(width[i], row[i].size());
    auto line = [&](const QStringList& cells) {  // names to the left, numbers to the right
      QString text;
      for (qsizetype i = 0; i < cells.size() && i < width.size(); ++i)
        text += (i < 2 ? cells[i].leftJustified(width[i]) : cells[i].rightJustified(width[i])) + "  ";
      out(QStringLiteral("    ") + text.trimmed() + u'\n');
    };
    line(it->columns);
    for (const QStringList& row : it->rows) line(row);
  }
}

int commandValidate(const QStringList& args) {
  QCommandLineParser parser;
  const FileAccessOptions files;
  parser.addOptions(files.all());
  const Parsed p = parse(parser, "validate", args, 1);
  if (!p.ok) return p.exitCode;
  const QString file = p.positional[0];
  NodeTypeRegistry registry;
  loadPlugins(registry);
  GraphDocument doc;
  QString error;
  if (!serializer::loadFile(file, doc, &error)) {
    err(QStringLiteral("error: %1\n").arg(error));
    return kFailed;
  }
  RunSettings settings = RunSettings::fromGraph(doc.settings());
  settings.files = files.policy(parser, file);
  const ValidationReport report = validate(doc, registry, settings);
  printIssues(file, report.issues(), true);
  if (!report.ok()) return kFailed;
  GraphDocument flat;  // facts are on the nodes that run: a subgraph's inner nodes, by path
  if (subgraph::hasSubgraphs(doc)) subgraph::flatten(doc, flat);
  printFacts(subgraph::hasSubgraphs(doc) ? flat : doc, report);
  out(QStringLiteral("%1: ok (%2 nodes, %3 connections)\n")
          .arg(file)
          .arg(doc.nodes().size())
          .arg(doc.connections().size()));
  return kOk;
}

int commandDevices(const QStringList& args) {
  QCommandLineParser parser;
  const QCommandLineOption json("json"), cpuDevices("cpu-devices", "", "N");
  parser.addOptions({json, cpuDevices});
  const Parsed p = parse(parser, "devices", args, 0);
  if (!p.ok) return p.exitCode;
  bool joinFailed = false;
  dist::World* world = joinWorld(&joinFailed);
  if (joinFailed) return kFailed;
  RunSettings settings;
  if (parser.isSet(cpuDevices)) {
    QString problem;
    const std::optional<int> cpus = parseCpuDevices(parser.value(cpuDevices), &problem);
    if (!cpus) return usageError(problem);
    settings.cpuDevices = *cpus;
    settings.all.insert("cpu_devices", *cpus);
  }
  NodeTypeRegistry registry;
  loadPlugins(registry);
  QJsonArray devices;
  QJsonObject sets;
  QString text;
  for (NodeSetPlugin* plugin : registry.plugins()) {
    QJsonObject env;
    try {
      env = plugin->environment(settings);
    } catch (const std::exception& e) {
      err(QStringLiteral("gpunodes: warning: %1: listing devices failed: %2\n")
              .arg(plugin->setName(), e.what()));
      continue;
    }
    if (env.isEmpty()) continue;
    sets.insert(plugin->setName(), env);
    for (const QJsonValue& d : env.value("devices").toArray()) devices.append(d);
    QString table = env.value("table").toString();
    if (table.isEmpty())  // a set that gives no table still gets its devices listed
      for (const QJsonValue& d : env.value("devices").toArray())
        table += QString::fromUtf8(QJsonDocument(d.toObject()).toJson(QJsonDocument::Compact)) + u'\n';
    if (!table.isEmpty()) {
      if (!text.isEmpty()) text += u'\n';
      text += table;
      if (!text.endsWith(u'\n')) text += u'\n';
    }
  }
  if (sets.isEmpty()) {
    err(QStringLiteral("gpunodes: no loaded node set reports devices\n"));
    return kFailed;
  }
  // What libgomp read at load: passive unless the user set OMP_WAIT_POLICY (main.cpp sets passive otherwise).
  const QString waits = qEnvironmentVariable("OMP_WAIT_POLICY", QStringLiteral("libgomp's default"));
  text += QStringLiteral("OpenMP waits: %1 (OMP_WAIT_POLICY)\n").arg(waits);
  QString shown =
      parser.isSet(json)
          ? QString::fromUtf8(QJsonDocument(QJsonObject{{"devices", devices}, {"node_sets", sets},
                                                        {"openmp_wait_policy", waits}})
                                  .toJson(QJsonDocument::Indented))
          : text;
  if (world && world->distributed()) {
    // Each rank sees its own machine and GPU: rank 0 prints every rank's view, in rank order.
    const QString host = QSysInfo::machineHostName();
    const QString mine =
        parser.isSet(json) ? QString::fromUtf8(QJsonDocument(QJsonObject{{"rank", world->rank()},
                                                                         {"host", host},
                                                                         {"local_rank", world->local_rank()},
                                                                         {"devices", devices},
                                                                         {"node_sets", sets}})
                                                   .toJson(QJsonDocument::Compact))
                           : QStringLiteral("== rank %1 (%2, local rank %3) ==\n%4")
                                 .arg(world->rank())
                                 .arg(host)
                                 .arg(world->local_rank())
                                 .arg(text);
    std::vector<std::string> all;
    try {
      all = world->allgather(mine.toStdString(), "gathering the ranks' devices");
    } catch (const std::exception& e) {
      err(QStringLiteral("error: %1\n").arg(e.what()));
      return kFailed;
    }
    if (!world->is_root()) return kOk;
    QJsonArray ranks;
    shown.clear();
    for (const std::string& r : all) {
      if (parser.isSet(json))
        ranks.append(QJsonDocument::fromJson(QByteArray::fromStdString(r)).object());
      else
        shown += QString::fromStdString(r) + (r.empty() || r.back() == '\n' ? "" : "\n");
    }
    if (parser.isSet(json))
      shown = QString::fromUtf8(QJsonDocument(QJsonObject{{"ranks", ranks}}).toJson(QJsonDocument::Indented));
  }
  out(shown);
  return kOk;
}

QJsonObject typeJson(const NodeTypeSpec& spec, const QString& plugin) {
  auto ports = [](const QList<PortSpec>& list, bool inputs) {
    QJsonArray a;
    for (const PortSpec& p : list) {
      QJsonObject o{{"name", p.name}, {"type", portTypeName(p.type)}, {"doc", p.doc}};
      if (inputs) o.insert("required", p.required);
      a.append(o);
    }
    return a;
  };
  QJsonArray params;
  for (const ParamSpec& p : spec.params) {
    QJsonObject o{
        {"name", p.name}, {"type", paramTypeName(p.type)}, {"default", p.defaultValue}, {"doc", p.doc}};
    if (p.min) o.insert("min", *p.min);
    if (p.max) o.insert("max", *p.max);
    if (!p.enumValues.isEmpty()) o.insert("values", QJsonArray::fromStringList(p.enumValues));
    if (p.file != FileUse::None) o.insert("file", fileUseName(p.file));  // "reads", "writes", "writes into"
    params.append(o);
  }
  return QJsonObject{
      {"name", spec.name}, {"category", spec.category},          {"description", spec.description},
      {"plugin", plugin},  {"inputs", ports(spec.inputs, true)}, {"outputs", ports(spec.outputs, false)},
      {"params", params}};
}

// A param's default or bound as `gpunodes nodes` lists it: as --set takes it, "(none)" without a default.
QString valueText(const QJsonValue& v) {
  return v.isUndefined() ? QStringLiteral("(none)") : paramValueText(v);
}

int commandNodes(const QStringList& args) {
  QCommandLineParser parser;
  const QCommandLineOption json("json");
  parser.addOption(json);
  const Parsed p = parse(parser, "nodes", args, 0);
  if (!p.ok) return p.exitCode;
  NodeTypeRegistry registry;
  loadPlugins(registry);
  if (parser.isSet(json)) {
    QJsonArray types, errors;
    for (const NodeTypePtr& t : registry.types())
      types.append(typeJson(t->spec(), registry.pluginOf(t->spec().name)->setName()));
    for (const NodeTypeRegistry::LoadError& e : registry.loadErrors())
      errors.append(QJsonObject{{"path", e.path}, {"reason", e.reason}});
    out(QString::fromUtf8(QJsonDocument(QJsonObject{{"node_types", types}, {"load_errors", errors}})
                              .toJson(QJsonDocument::Indented)));
    return kOk;
  }
  QString text, category;
  for (const NodeTypePtr& t : registry.types()) {
    const NodeTypeSpec& s = t->spec();
    if (s.category != category || text.isEmpty()) {
      category = s.category;
      text += QStringLiteral("\n%1\n").arg(category.isEmpty() ? QStringLiteral("(no category)") : category);
    }
    text += QStringLiteral("  %1  %2\n").arg(s.name, s.description);
    auto ports = [&](const char* label, const QList<PortSpec>& list, bool inputs) {
      if (list.isEmpty()) return;
      QStringList parts;
      for (const PortSpec& port : list)
        parts.append(QStringLiteral("%1: %2%3")
                         .arg(port.name, portTypeName(port.type),
                              inputs && !port.required ? QStringLiteral(" (optional)") : QString()));
      text += QStringLiteral("    %1 %2\n").arg(QString::fromLatin1(label), parts.join(", "));
    };
    ports("inputs: ", s.inputs, true);
    ports("outputs:", s.outputs, false);
    for (const ParamSpec& param : s.params) {
      QString kind = paramTypeName(param.type);
      if (param.min || param.max)
        kind += QStringLiteral(" %1..%2").arg(param.min ? valueText(*param.min) : QString(),
                                              param.max ? valueText(*param.max) : QString());
      if (!param.enumValues.isEmpty()) kind += QStringLiteral(" {%1}").arg(param.enumValues.join("|"));
      if (param.file != FileUse::None) kind += QStringLiteral(", a path it %1").arg(fileUseName(param.file));
      text += QStringLiteral("    %1 (%2) = %3  %4\n")
                  .arg(param.name, kind, valueText(param.defaultValue), param.doc);
    }
  }
  if (text.isEmpty()) {
    err(QStringLiteral("gpunodes: no node types: no plugin loaded\n"));
    return kFailed;
  }
  out(text.mid(1));
  return kOk;
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
