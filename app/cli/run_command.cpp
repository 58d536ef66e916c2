// gpunodes run: one graph file, headless, alone or as a rank of an mpirun job (docs/cli.md), with what it
// shares with sweep (--set, the report of a run that failed).
#include "cli/run_command.h"

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

namespace {

// "; it was waiting for rank 1 on nodeb in: the gradient all-reduce (11.2 s)": what did not complete when
// mpirun ends the job under this rank (a lost host: the exchange and whom it missed); empty otherwise.
QString waitingFor(const dist::World* world) {
  const std::string waiting = world ? world->waiting() : std::string();
  if (waiting.empty()) return {};
  return QStringLiteral("; it was waiting for %1 in: %2")
      .arg(QString::fromStdString(world->others()), QString::fromStdString(waiting));
}

}  // namespace

class Progress {
 public:
  // Quiet prints no progress, but still one line per failed node: a batch script must learn what failed.
  Progress(bool tty, bool quiet, int total) : tty_(tty), quiet_(quiet), total_(total) { clock_.start(); }

  // How many "[node] failed: ..." lines were printed.
  int failuresPrinted() const { return failuresPrinted_; }

  // The node running and how far it got, as "train was 43% done"; empty before the first node starts.
  QString where() const {
    if (current_.isEmpty()) return {};
    return QStringLiteral("%1 was %2% done").arg(current_).arg(qRound(nodeProgress_ * 100));
  }

  void handle(const RunEvent& e) {
    if (e.kind == RunEvent::Kind::NodeStarted) current_ = e.node, nodeProgress_ = 0;
    if (e.kind == RunEvent::Kind::Progress && e.node == current_) nodeProgress_ = e.value;
    if (e.kind == RunEvent::Kind::NodeFailed && e.status == NodeStatus::Failed) ++failuresPrinted_;
    if (quiet_) {
      if (e.kind == RunEvent::Kind::NodeFailed && e.status == NodeStatus::Failed)
        err(QStringLiteral("[%1] failed: %2\n").arg(e.node, e.message));
      return;
    }
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
  int total_, done_ = 0, drawn_ = 0, failuresPrinted_ = 0;
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
        err(QStringLiteral("%1stopping: mpirun is ending the job (a rank was lost, or it was cancelled)%2%3\n")
                .arg(world && world->is_root() ? QStringLiteral("[rank 0] ") : QString())
                .arg(progress.where().isEmpty() ? QString() : " while " + progress.where())
                .arg(waitingFor(world)));
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
  // Quiet runs (and ranks other than 0) still say why they failed: the failed nodes' lines, or the run's
  // own error when no node failed (a lost rank, an output that could not start).
  if (!ok && beQuiet && progress.failuresPrinted() == 0)
    err(QStringLiteral("error: %1\n").arg(result.value("error").toString()));
  // A rank that failed while the others may wait for it in a collective ends the whole job at once; mpirun
  // then names the rank that called MPI_Abort.
  if (!ok && distributed) world->abort(kFailed);
  return ok && written ? kOk : kFailed;
}

}  // namespace gn::cli
