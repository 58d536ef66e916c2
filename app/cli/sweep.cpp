// gpunodes sweep: the grid, the runs, the gathering over ranks and the summary files (sweep.h).
#include "cli/sweep.h"

#include <QCommandLineParser>
#include <QDir>
#include <QElapsedTimer>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QMap>
#include <QSet>
#include <QThread>
#include <algorithm>
#include <csignal>
#include <cstdio>
#include <exception>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#ifdef GPUNODES_WITH_GUI
#include <QApplication>
#else
#include <QCoreApplication>
#endif

#include "cli/cli.h"
#include "cli/cli_support.h"
#include "gpunodes/core/executor.h"
#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/node_type.h"
#include "gpunodes/core/plugin.h"
#include "gpunodes/core/registry.h"
#include "gpunodes/core/report_format.h"
#include "gpunodes/core/run_cache.h"
#include "gpunodes/core/serializer.h"
#include "gpunodes/core/validation.h"
#include "gpunodes/dist/world.h"

namespace gn::cli {

using namespace gn::core;

#ifndef GPUNODES_WITH_GUI
bool sweepCanPlot() {
  return false;
}
QString writeSweepPlot(const QString&, const QString&, const QList<SweepAxis>&,
                       const QList<SweepPlotPoint>&) {
  return QStringLiteral("plots need the GUI build");
}
#endif

namespace {

// A grid larger than this is almost certainly a mistake (a forgotten comma-separated list); each point is a
// whole run.
constexpr qint64 kMaxPoints = 10000;
// Under mpirun the ranks exchange finished points this often. Every rank takes part in each exchange, also
// while one of its points runs, so no rank ever waits in a collective longer than about this, however long
// the others' points take (a collective that waits longer than World::timeout() is taken for a lost rank).
constexpr qint64 kExchangeMs = 500;

// What the executor puts on every node; a node's other numbers are results it reported itself.
const QSet<QString> kExecutorFields{"type",  "status", "device",  "calls", "time_ms",  "gflops",
                                    "flops", "bytes",  "wall_ms", "error", "warnings", "pct_peak"};

struct Axis {
  QString spec;  // the --grid as given, for messages
  QString node, param;
  QList<QJsonValue> values;
  QString name() const { return node + u'.' + param; }
};

// V1,V2,... split at the commas outside brackets, so that a shape [100,100] stays one value.
QStringList splitValues(const QString& text) {
  QStringList values;
  QString current;
  int depth = 0;
  for (const QChar c : text) {
    if (c == u'[') ++depth;
    if (c == u']' && depth > 0) --depth;
    if (c == u',' && depth == 0) {
      values.append(current);
      current.clear();
      continue;
    }
    current += c;
  }
  values.append(current);
  return values;
}

// The last value of each metric series, named by the series, then each node's own numeric report fields as
// "node.field"; a node field wins over a series of the same name (Train's train.loss: the epoch's mean
// rather than the last logged batch). Only numbers: a NaN is null in the report and is left out.
QJsonObject finalMetrics(const QJsonObject& report, QStringList* seriesNames) {
  QJsonObject metrics;
  const QJsonObject series = report.value("metrics").toObject();
  for (auto it = series.begin(); it != series.end(); ++it) {
    const QJsonArray samples = it.value().toArray();
    if (samples.isEmpty()) continue;
    const QJsonValue last = samples.last().toArray().at(1);
    if (!last.isDouble()) continue;
    metrics.insert(it.key(), last);
    if (seriesNames) seriesNames->append(it.key());
  }
  const QJsonObject nodes = report.value("nodes").toObject();
  for (auto n = nodes.begin(); n != nodes.end(); ++n) {
    const QJsonObject fields = n.value().toObject();
    for (auto f = fields.begin(); f != fields.end(); ++f)
      if (f.value().isDouble() && !kExecutorFields.contains(f.key()))
        metrics.insert(n.key() + u'.' + f.key(), f.value());
  }
  return metrics;
}

// plot-<metric>.png with every character outside [A-Za-z0-9._-] replaced: series such as
// "train.memory_mb/cpu:1" name files too.
QString plotFileName(const QString& metric) {
  QString safe;
  for (const QChar c : metric)
    safe += (c.isLetterOrNumber() && c.unicode() < 128) || c == u'.' || c == u'_' || c == u'-' ? c : u'_';
  return QStringLiteral("plot-%1.png").arg(safe);
}

QString table(const QStringList& header, const QList<QStringList>& rows, int firstNumeric) {
  QList<qsizetype> width;
  for (const QString& h : header) width.append(h.size());
  for (const QStringList& r : rows)
    for (qsizetype c = 0; c < r.size() && c < width.size(); ++c) width[c] = std::max(width[c], r[c].size());
  auto line = [&](const QStringList& cells) {
    QString text;
    for (qsizetype c = 0; c < cells.size() && c < width.size(); ++c)
      text += (c >= firstNumeric ? cells[c].rightJustified(width[c]) : cells[c].leftJustified(width[c])) +
              QStringLiteral("  ");
    return text.trimmed() + u'\n';
  };
  QString text = line(header);
  for (const QStringList& r : rows) text += line(r);
  return text;
}

class Sweep {
 public:
  int run(const QStringList& args);

 private:
  struct Running {
    int index = 0;
    std::unique_ptr<Executor> executor;
    QElapsedTimer clock;
    bool cancelAsked = false;
  };

  int usage(const QString& message);
  // err() itself starts the lines of ranks other than 0 with "[rank N] " (joinWorld).
  void problem(const QString& text) { err(text); }
  bool root() const { return !world_ || world_->is_root(); }

  QList<int> coordinates(int index) const;
  QJsonObject paramsOf(int index) const;
  QString label(int index) const;
  QString pointTag(int index) const { return QStringLiteral("[point %1/%2]").arg(index + 1).arg(total_); }
  QString reportName(int index) const {
    return QStringLiteral("point-%1.json").arg(index + 1, width_, 10, QChar(u'0'));
  }

  void startPoint(int index);
  void finishPoint(const ValidationReport* refused);
  void exchange();
  void prepareOutputDir();
  QJsonObject notRun(int index) const;
  QJsonObject summary(const QStringList& metrics, const QStringList& plots) const;
  QByteArray csv(const QStringList& metrics) const;
  bool varies(const QString& metric) const;
  QStringList writePlots(const QStringList& metrics);
  void writeSummary(const QStringList& metrics, const QStringList& plots);
  void keepAlive();
  int rootsExitCode(int code);
  void printTable() const;

  dist::World* world_ = nullptr;
  NodeTypeRegistry registry_;
  GraphDocument doc_;
  RunSettings settings_;
  QString file_, outDir_;
  QStringList sets_;
  QList<Axis> axes_;
  int total_ = 0, width_ = 4;
  bool quiet_ = false;

  // One cache for every point this process runs (run_cache.h): points that leave a node and its inputs as
  // they were reuse its outputs, so a Dataset the grid does not touch is loaded once. Before running_, which
  // fills it until its executor is gone.
  RunCache cache_;
  std::unique_ptr<Running> running_;
  QJsonArray pending_;  // this rank's finished points, not yet exchanged
  bool localDone_ = false, allDone_ = false, stop_ = false, interruptedHere_ = false;
  bool cancelled_ = false, terminated_ = false, commFailed_ = false, writeFailed_ = false;
  QMap<int, QJsonObject> results_;  // every rank's finished points, by index
  QSet<QString> seriesMetrics_;     // final metrics that came from a metric series (the table's columns)
  QElapsedTimer clock_, sinceExchange_;
};

int Sweep::usage(const QString& message) {
  // Every rank parses the same arguments; one usage text is enough.
  if (root()) return usageError(message);
  problem(QStringLiteral("gpunodes: %1\n").arg(message));
  return kUsage;
}

QList<int> Sweep::coordinates(int index) const {
  QList<int> at(axes_.size());
  // The first --grid varies slowest: the last axis is the fastest digit.
  for (qsizetype k = axes_.size() - 1; k >= 0; --k) {
    at[k] = index % int(axes_[k].values.size());
    index /= int(axes_[k].values.size());
  }
  return at;
}

QJsonObject Sweep::paramsOf(int index) const {
  const QList<int> at = coordinates(index);
  QJsonObject params;
  for (qsizetype k = 0; k < axes_.size(); ++k) params.insert(axes_[k].name(), axes_[k].values[at[k]]);
  return params;
}

QString Sweep::label(int index) const {
  const QList<int> at = coordinates(index);
  QStringList parts;
  for (qsizetype k = 0; k < axes_.size(); ++k)
    parts.append(axes_[k].name() + u'=' + paramValueText(axes_[k].values[at[k]]));
  return parts.join(QStringLiteral(", "));
}

int Sweep::run(const QStringList& args) {
  QCommandLineParser parser;
  const QCommandLineOption grid("grid", "", "NODE.PARAM=V1,V2,..."), set("set", "", "NODE.PARAM=VALUE"),
      out("out", "", "DIR"), schedule("schedule", "", "MODE"), cpuDevices("cpu-devices", "", "N"),
      quiet("quiet");
  const FileAccessOptions files;
  parser.addOptions({grid, set, out, schedule, cpuDevices, quiet});
  parser.addOptions(files.all());
  const Parsed p = parse(parser, "sweep", args, 1);
  if (!p.ok) return p.exitCode;
  file_ = p.positional[0];
  bool joinFailed = false;
  world_ = joinWorld(&joinFailed);
  if (joinFailed) return kFailed;
  if (!world_) world_ = &dist::World::get();  // launched alone: a world of one, which never calls MPI
  // Each rank runs points of its own: nothing in them trains across the ranks.
  world_->set_local_runs(true);
  quiet_ = parser.isSet(quiet);
  sets_ = parser.values(set);

  std::optional<int> cpus;
  if (parser.isSet(cpuDevices)) {
    QString why;
    cpus = parseCpuDevices(parser.value(cpuDevices), &why);
    if (!cpus) return usage(why);
  }
  if (parser.isSet(schedule) && parser.value(schedule) != "parallel" &&
      parser.value(schedule) != "sequential")
    return usage(QStringLiteral("--schedule: expected parallel or sequential, got \"%1\"")
                     .arg(parser.value(schedule)));
  if (!parser.isSet(grid))
    return usage(QStringLiteral("sweep: give at least one --grid NODE.PARAM=V1,V2,..."));
  for (const QString& spec : parser.values(grid)) {
    const qsizetype eq = spec.indexOf(u'=');
    const std::optional<Endpoint> target = eq > 0 ? Endpoint::parse(spec.left(eq)) : std::nullopt;
    if (!target) return usage(QStringLiteral("--grid %1: expected NODE.PARAM=V1,V2,...").arg(spec));
    Axis axis{spec, target->node, target->port, {}};
    for (const Axis& a : axes_)
      if (a.name() == axis.name())
        return usage(
            QStringLiteral("--grid %1: %2 is already swept by --grid %3").arg(spec, axis.name(), a.spec));
    axes_.append(axis);
  }

  loadPlugins(registry_);
  QString loadError;
  if (!serializer::loadFile(file_, doc_, &loadError)) {
    problem(QStringLiteral("error: %1\n").arg(loadError));
    return kFailed;
  }
  for (const QString& s : sets_) {
    const QString why = applySet(doc_, registry_, file_, s);
    if (!why.isEmpty()) return usage(why);
  }
  // Each value goes through --set's own checks (node, param, type, range), before anything runs.
  qint64 points = 1;
  for (Axis& axis : axes_) {
    const QString text = axis.spec.mid(axis.spec.indexOf(u'=') + 1);
    for (const QString& value : splitValues(text)) {
      const QString why = applySet(doc_, registry_, file_, axis.name() + u'=' + value);
      if (!why.isEmpty()) {
        // applySet names the assignment as "--set NODE.PARAM=VALUE: ..."; here it is one value of a --grid.
        const QString setPrefix = QStringLiteral("--set ");
        return usage(QStringLiteral("--grid %1: %2")
                         .arg(axis.spec, why.startsWith(setPrefix) ? why.mid(setPrefix.size()) : why));
      }
      const QJsonValue parsed = doc_.node(axis.node)->params.value(axis.param);
      if (axis.values.contains(parsed))
        return usage(
            QStringLiteral("--grid %1: the value %2 is given twice").arg(axis.spec, paramValueText(parsed)));
      axis.values.append(parsed);
    }
    points *= axis.values.size();
    if (points > kMaxPoints)
      return usage(QStringLiteral("--grid: more than %1 points; sweep a smaller grid").arg(kMaxPoints));
  }
  total_ = int(points);
  width_ = std::max(4, int(QString::number(total_).size()));

  QJsonObject settingsJson = doc_.settings();
  if (parser.isSet(schedule)) settingsJson.insert("schedule", parser.value(schedule));
  if (cpus) settingsJson.insert("cpu_devices", *cpus);
  doc_.setSettings(settingsJson);
  settings_ = RunSettings::fromGraph(settingsJson);
  settings_.files = files.policy(parser, file_);

  outDir_ = parser.isSet(out) ? parser.value(out)
                              : QStringLiteral("sweep-%1").arg(QFileInfo(file_).completeBaseName());
  if (!QDir().mkpath(outDir_)) {
    problem(QStringLiteral("error: %1: cannot create the output directory\n").arg(outDir_));
    return kFailed;
  }
  try {
    prepareOutputDir();
  } catch (const std::exception& e) {
    problem(QStringLiteral("error: %1\n").arg(QString::fromUtf8(e.what())));
    return kFailed;
  }

  QList<int> mine;
  for (int i = world_->rank(); i < total_; i += world_->size()) mine.append(i);
  if (root() && !quiet_)
    err(QStringLiteral("gpunodes: sweeping %1 points of %2%3 into %4\n")
            .arg(total_)
            .arg(file_, world_->size() > 1 ? QStringLiteral(" over %1 ranks").arg(world_->size()) : QString(),
                 outDir_));

  g_interrupted.store(0);
  installInterruptHandler();
  clock_.start();
  sinceExchange_.start();
  const qint64 exchangeMs = world_->distributed() ? kExchangeMs : 0;
  qsizetype next = 0;
  while (true) {
    if (!running_ && !stop_ && next < mine.size()) startPoint(mine[next++]);
    if (running_) {
      bool finished = false;
      for (const RunEvent& e : running_->executor->events().waitAndDrain(50))
        if (e.kind == RunEvent::Kind::RunFinished) finished = true;
      if (finished) finishPoint(nullptr);
    } else if (!localDone_ && (stop_ || next >= mine.size())) {
      localDone_ = true;
    } else if (localDone_) {
      QThread::msleep(20);  // the other ranks are still running points
    }
    if (g_interrupted.load() && !interruptedHere_) {
      interruptedHere_ = stop_ = cancelled_ = true;
      terminated_ = g_interrupted.load() == 2;
      if (terminated_)
        // Every rank says this; rank 0's line would otherwise be the one without a prefix.
        problem(QStringLiteral("%1stopping the sweep: mpirun is ending the job (a rank was lost, or it was "
                               "cancelled)\n")
                    .arg(root() ? QStringLiteral("[rank 0] ") : QString()));
      else
        problem(QStringLiteral("gpunodes: cancelling the sweep (Ctrl-C again quits at once)\n"));
    }
    if (stop_ && running_ && !running_->cancelAsked) {
      running_->cancelAsked = true;
      running_->executor->cancel();
    }
    if (sinceExchange_.elapsed() >= exchangeMs) {
      sinceExchange_.restart();
      exchange();
      if (allDone_ || commFailed_) break;
    }
  }
  if (running_) {  // a lost rank ended the exchange: stop what runs here too
    running_->executor->cancel();
    running_->executor->wait();
    running_.reset();
  }
  signal(SIGINT, SIG_DFL);

  bool allOk = results_.size() == total_;
  for (const QJsonObject& r : std::as_const(results_)) {
    allOk &= r.value("ok").toBool();
    // A rank that could not write a point's report says so in the result.
    if (r.value("report").toString().isEmpty()) writeFailed_ = true;
  }
  if (root()) {
    QStringList metrics;
    {
      QSet<QString> names;
      for (const QJsonObject& r : std::as_const(results_))
        for (const QString& m : r.value("metrics").toObject().keys()) names.insert(m);
      metrics = names.values();
      metrics.sort();
    }
    QStringList plots;
    if (commFailed_) {
      // A rank was lost: the summary of what rank 0 has, the rest `not run`, before the job ends.
    } else if (sweepCanPlot()) {
      plots = writePlots(metrics);
    } else if (!quiet_) {
      err(QStringLiteral(
              "gpunodes: plots need the GUI build (this one was configured with GPUNODES_GUI=OFF); "
              "%1 has summary.json and summary.csv\n")
              .arg(outDir_));
    }
    writeSummary(metrics, plots);
    if (!quiet_) printTable();
  }
  // Ended by mpirun (SIGTERM: a lost rank, or its own Ctrl-C) is a failure, as for `run`.
  int code = terminated_                             ? kFailed
             : cancelled_                            ? kCancelled
             : !allOk || commFailed_ || writeFailed_ ? kFailed
                                                     : kOk;
  if (!commFailed_) code = rootsExitCode(code);
  // After a lost rank the others may be gone or waiting in a collective that never finishes, and
  // MPI_Finalize would wait for them too.
  if (commFailed_ && world_->distributed()) world_->abort(code);
  return code;
}

void Sweep::writeSummary(const QStringList& metrics, const QStringList& plots) {
  const QDir dir(outDir_);
  writeFailed_ |=
      !saveBytes(dir.filePath("summary.json"),
                 QJsonDocument(summary(metrics, plots)).toJson(QJsonDocument::Indented), "sweep summary");
  keepAlive();
  writeFailed_ |= !saveBytes(dir.filePath("summary.csv"), csv(metrics), "sweep summary");
  keepAlive();
}

// While rank 0 writes the summary and the plots the other ranks wait for its exit code: exiting first with
// an error would make mpirun end the job, rank 0 included, before the files are written. Rank 0 answers
// them every kExchangeMs meanwhile, so that however many plots it draws the wait never looks like a lost
// rank.
void Sweep::keepAlive() {
  if (!world_->distributed() || commFailed_ || sinceExchange_.elapsed() < kExchangeMs) return;
  sinceExchange_.restart();
  try {
    world_->allgather("{}", "sweep: waiting for rank 0 to write the summary");
  } catch (const std::exception& e) {
    problem(QStringLiteral("error: %1\n").arg(QString::fromUtf8(e.what())));
    commFailed_ = true;
  }
}

// Every rank leaves with rank 0's exit code, which also counts the files only rank 0 writes.
int Sweep::rootsExitCode(int code) {
  if (!world_->distributed()) return code;
  const std::string mine = root() ? QJsonDocument(QJsonObject{{"code", code}}).toJson().toStdString() : "{}";
  try {
    while (true) {
      const std::vector<std::string> all =
          world_->allgather(mine, "sweep: waiting for rank 0 to write the summary");
      const QJsonObject o = QJsonDocument::fromJson(QByteArray::fromStdString(all.at(0))).object();
      if (o.contains("code")) return o.value("code").toInt();
    }
  } catch (const std::exception& e) {
    problem(QStringLiteral("error: %1\n").arg(QString::fromUtf8(e.what())));
    commFailed_ = true;
    return kFailed;
  }
}

void Sweep::prepareOutputDir() {
  // What an earlier sweep left in the directory would read as part of this one (a plot of a metric this
  // graph no longer has, point-0009.json of a bigger grid). Only root deletes, before any rank writes.
  if (root()) {
    QDir dir(outDir_);
    for (const QString& name :
         dir.entryList({"point-*.json", "plot-*.png", "summary.json", "summary.csv"}, QDir::Files))
      dir.remove(name);
  }
  world_->barrier("sweep: preparing the output directory");
}

void Sweep::startPoint(int index) {
  const QList<int> at = coordinates(index);
  for (qsizetype k = 0; k < axes_.size(); ++k)
    doc_.setParam(axes_[k].node, axes_[k].param, axes_[k].values[at[k]]);
  running_ = std::make_unique<Running>();
  running_->index = index;
  running_->executor = std::make_unique<Executor>(registry_);
  running_->clock.start();
  if (root() && !quiet_) err(QStringLiteral("%1 %2: started\n").arg(pointTag(index), label(index)));
  ValidationReport validation;
  if (!running_->executor->start(doc_, settings_, &validation, {.cache = &cache_})) finishPoint(&validation);
}

void Sweep::finishPoint(const ValidationReport* refused) {
  Executor& executor = *running_->executor;
  executor.wait();
  const int index = running_->index;
  const double wallMs = double(running_->clock.nsecsElapsed()) / 1e6;

  QJsonObject report = executor.report();
  report.insert("file", file_);
  report.insert("schedule", settings_.schedule);
  report.insert("cpu_devices", settings_.cpuDevices);
  report.insert("point", index + 1);
  report.insert("params", paramsOf(index));
  QString status = QStringLiteral("ok"), error = report.value("error").toString();
  if (executor.wasCancelled()) {
    status = QStringLiteral("cancelled");
    if (error.isEmpty()) error = QStringLiteral("cancelled");
  } else if (refused || !report.value("ok").toBool()) {
    status = QStringLiteral("failed");
    if (error.isEmpty() && refused && !refused->errors().isEmpty()) error = refused->errors().first().text();
    if (error.isEmpty()) error = QStringLiteral("failed");
  }
  const QString name = reportName(index);
  const bool written = saveBytes(QDir(outDir_).filePath(name),
                                 QJsonDocument(report).toJson(QJsonDocument::Indented), "point report");
  QStringList series;
  const QJsonObject metrics = finalMetrics(report, &series);
  const QJsonObject result{{"point", index + 1},
                           {"params", paramsOf(index)},
                           {"ok", status == "ok"},
                           {"status", status},
                           {"error", status == "ok" ? QString() : error},
                           {"wall_ms", wallMs},
                           {"rank", world_->rank()},
                           {"report", written ? name : QString()},
                           {"metrics", metrics}};
  pending_.append(QJsonObject{{"result", result}, {"series", QJsonArray::fromStringList(series)}});
  running_.reset();

  if (quiet_) return;
  if (status == "ok") {
    if (root())
      err(QStringLiteral("%1 %2: ok in %3 s\n")
              .arg(pointTag(index), label(index))
              .arg(wallMs / 1000, 0, 'f', 2));
  } else if (status == "failed") {
    problem(QStringLiteral("%1 %2: failed in %3 s: %4\n")
                .arg(pointTag(index), label(index))
                .arg(wallMs / 1000, 0, 'f', 2)
                .arg(error));
  } else if (root()) {
    err(QStringLiteral("%1 %2: cancelled\n").arg(pointTag(index), label(index)));
  }
}

// Every rank sends what finished since the last exchange, whether it is done, and whether it was
// interrupted; every rank gets the same answer, so they all stop (cancel, or all done) at the same exchange.
void Sweep::exchange() {
  const QJsonObject mine{{"done", localDone_}, {"cancel", interruptedHere_}, {"results", pending_}};
  pending_ = QJsonArray();
  std::vector<std::string> all;
  try {
    all = world_->allgather(QJsonDocument(mine).toJson(QJsonDocument::Compact).toStdString(),
                            "sweep: exchanging finished points");
  } catch (const std::exception& e) {
    problem(QStringLiteral("error: %1\n").arg(QString::fromUtf8(e.what())));
    commFailed_ = stop_ = true;
    return;
  }
  allDone_ = true;
  for (const std::string& text : all) {
    const QJsonObject o = QJsonDocument::fromJson(QByteArray::fromStdString(text)).object();
    allDone_ &= o.value("done").toBool();
    if (o.value("cancel").toBool()) stop_ = cancelled_ = true;
    for (const QJsonValue& v : o.value("results").toArray()) {
      const QJsonObject r = v.toObject().value("result").toObject();
      results_.insert(r.value("point").toInt() - 1, r);
      for (const QJsonValue& s : v.toObject().value("series").toArray()) seriesMetrics_.insert(s.toString());
    }
  }
}

QJsonObject Sweep::notRun(int index) const {
  return QJsonObject{
      {"point", index + 1},
      {"params", paramsOf(index)},
      {"ok", false},
      {"status", "not run"},
      {"error", commFailed_ ? QStringLiteral("not run: rank %1 did not report it").arg(index % world_->size())
                            : QStringLiteral("not run: the sweep was cancelled")},
      {"wall_ms", 0},
      {"rank", index % world_->size()},
      {"report", QString()},
      {"metrics", QJsonObject()}};
}

QJsonObject Sweep::summary(const QStringList& metrics, const QStringList& plots) const {
  QJsonArray grid, points;
  for (const Axis& a : axes_) {
    QJsonArray values;
    for (const QJsonValue& v : a.values) values.append(v);
    grid.append(QJsonObject{{"param", a.name()}, {"values", values}});
  }
  int ok = 0;
  for (int i = 0; i < total_; ++i) {
    const QJsonObject r = results_.value(i, notRun(i));
    ok += r.value("ok").toBool();
    points.append(r);
  }
  return QJsonObject{{"file", file_},
                     {"graph", doc_.name()},
                     {"grid", grid},
                     {"set", QJsonArray::fromStringList(sets_)},
                     {"schedule", settings_.schedule},
                     {"cpu_devices", settings_.cpuDevices},
                     {"ranks", world_->size()},
                     {"ok", ok == total_},
                     {"cancelled", cancelled_},
                     {"points_ok", ok},
                     {"points_failed", total_ - ok},
                     {"wall_ms", double(clock_.nsecsElapsed()) / 1e6},
                     {"metrics", QJsonArray::fromStringList(metrics)},
                     {"plots", QJsonArray::fromStringList(plots)},
                     {"points", points}};
}

QByteArray Sweep::csv(const QStringList& metrics) const {
  QStringList header{"point"};
  for (const Axis& a : axes_) header.append(a.name());
  header << "ok"
         << "error"
         << "wall_ms" << metrics;
  QStringList lines;
  for (const QString& h : header) lines.append(csvField(h));
  QByteArray text = lines.join(u',').toUtf8() + '\n';
  for (int i = 0; i < total_; ++i) {
    const QJsonObject r = results_.value(i, notRun(i));
    const QJsonObject params = r.value("params").toObject(), values = r.value("metrics").toObject();
    QStringList row{QString::number(i + 1)};
    for (const Axis& a : axes_) row.append(csvField(paramValueText(params.value(a.name()))));
    row << (r.value("ok").toBool() ? QStringLiteral("true") : QStringLiteral("false"))
        << csvField(r.value("error").toString()) << QString::number(r.value("wall_ms").toDouble(), 'f', 1);
    for (const QString& m : metrics)
      // The shortest text that reads back as the same double: the CSV and summary.json agree exactly.
      row.append(values.contains(m) ? numberText(values.value(m).toDouble()) : QString());
    text += row.join(u',').toUtf8() + '\n';
  }
  return text;
}

// Whether the metric differs between the points that ran ok. One that is the same everywhere (a dataset's
// size, a parameter count) did not depend on the grid: it gets no plot and no column in the table.
bool Sweep::varies(const QString& metric) const {
  std::optional<double> first;
  for (const QJsonObject& r : results_) {
    const QJsonValue v = r.value("metrics").toObject().value(metric);
    if (!r.value("ok").toBool() || !v.isDouble()) continue;
    if (first && *first != v.toDouble()) return true;
    first = v.toDouble();
  }
  return false;
}

// A plot per final metric that varies.
QStringList Sweep::writePlots(const QStringList& metrics) {
  QList<SweepAxis> axes;
  for (const Axis& a : axes_) axes.append({a.name(), a.values});
  QStringList written;
  QSet<QString> usedNames;
  for (const QString& metric : metrics) {
    if (!varies(metric)) continue;
    QList<SweepPlotPoint> points;
    for (auto it = results_.begin(); it != results_.end(); ++it) {
      const QJsonValue v = it->value("metrics").toObject().value(metric);
      if (it->value("ok").toBool() && v.isDouble()) points.append({coordinates(it.key()), v.toDouble()});
    }
    QString name = plotFileName(metric);
    for (int n = 2; usedNames.contains(name); ++n)
      name = plotFileName(metric).chopped(4) + QStringLiteral("-%1.png").arg(n);
    usedNames.insert(name);
    const QString path = QDir(outDir_).filePath(name);
    const QString why = writeSweepPlot(path, metric, axes, points);
    keepAlive();
    if (!why.isEmpty()) {
      err(QStringLiteral("error: %1: cannot write the plot: %2\n").arg(path, why));
      writeFailed_ = true;
      continue;
    }
    written.append(name);
  }
  return written;
}

// One row per point: its params, how it ended and the final value of each metric series that varies (what
// the nodes plot live: loss, accuracy, ...); every final metric would not fit a terminal, summary.csv has
// them all.
void Sweep::printTable() const {
  QStringList columns;
  for (const QString& m : seriesMetrics_)
    if (varies(m)) columns.append(m);
  columns.sort();
  QStringList header{"point"};
  for (const Axis& a : axes_) header.append(a.name());
  header << "status"
         << "time (s)" << columns;
  QList<QStringList> rows;
  QString errors;
  int ok = 0;
  for (int i = 0; i < total_; ++i) {
    const QJsonObject r = results_.value(i, notRun(i));
    const QJsonObject params = r.value("params").toObject(), values = r.value("metrics").toObject();
    QStringList row{QString::number(i + 1)};
    for (const Axis& a : axes_) row.append(paramValueText(params.value(a.name())));
    row << r.value("status").toString() << QString::number(r.value("wall_ms").toDouble() / 1000, 'f', 2);
    for (const QString& m : columns)
      row.append(values.contains(m) ? QString::number(values.value(m).toDouble(), 'g', 4)
                                    : QStringLiteral("-"));
    rows.append(row);
    if (r.value("ok").toBool())
      ++ok;
    else if (r.value("status").toString() == "failed")
      errors += QStringLiteral("point %1: %2\n").arg(i + 1).arg(r.value("error").toString());
  }
  QString text = u'\n' + table(header, rows, int(1 + axes_.size() + 1)) + errors;
  const double seconds = double(clock_.elapsed()) / 1000;
  if (cancelled_)
    text += QStringLiteral("cancelled after %1 s: %2 of %3 points ok\n")
                .arg(seconds, 0, 'f', 2)
                .arg(ok)
                .arg(total_);
  else
    text += QStringLiteral("%1 of %2 points ok in %3 s; results in %4\n")
                .arg(ok)
                .arg(total_)
                .arg(seconds, 0, 'f', 2)
                .arg(outDir_);
  out(text);
}

#ifdef GPUNODES_WITH_GUI
// A GUI application outside a desktop session has no XDG_RUNTIME_DIR, and Qt says so on stderr although the
// offscreen plots never need one; --quiet must stay quiet. Every other message goes through.
QtMessageHandler g_previousHandler = nullptr;
void dropNoRuntimeDirWarning(QtMsgType type, const QMessageLogContext& context, const QString& message) {
  if (type == QtWarningMsg && message.startsWith(QLatin1String("QStandardPaths: XDG_RUNTIME_DIR not set")))
    return;
  if (g_previousHandler)
    g_previousHandler(type, context, message);
  else
    std::fprintf(stderr, "%s\n", qPrintable(qFormatLogMessage(type, context, message)));
}
#endif

}  // namespace

int commandSweep(int argc, char** argv) {
#ifdef GPUNODES_WITH_GUI
  // QCustomPlot draws through widgets, which need a QApplication; the sweep never shows a window, so it
  // needs no display either.
  if (!qEnvironmentVariableIsSet("QT_QPA_PLATFORM")) qputenv("QT_QPA_PLATFORM", "offscreen");
  g_previousHandler = qInstallMessageHandler(dropNoRuntimeDirWarning);
  QApplication app(argc, argv);
#else
  QCoreApplication app(argc, argv);  // applicationDirPath() finds <bin>/plugins
#endif
  QCoreApplication::setApplicationName(QStringLiteral("gpunodes"));
  Sweep sweep;
  return sweep.run(QCoreApplication::arguments().mid(2));
}

}  // namespace gn::cli
