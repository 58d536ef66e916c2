#include "process_run.h"

#include <signal.h>
#include <unistd.h>

#include <QCoreApplication>
#include <QDir>
#include <QFile>
#include <QFileInfo>
#include <QHash>
#include <QJsonArray>
#include <QJsonDocument>
#include <QRegularExpression>
#include <QRegularExpression>
#include <QStandardPaths>
#include <QTemporaryDir>

#include "gpunodes/core/graph_document.h"
#include "gpunodes/core/serializer.h"

namespace gn::editor {

namespace {

// A line longer than this without a newline is not rank 0's stream (its longest lines are a few hundred
// bytes): it is dropped with a warning rather than held in memory.
constexpr qsizetype kMaxLineBytes = 16 * 1024 * 1024;
// Reports carry base64 images of the mistakes; anything far beyond that is not one.
constexpr qint64 kMaxReportBytes = 512LL * 1024 * 1024;
// How many of the last stderr lines the failure message quotes (the log has them all).
constexpr int kQuotedErrorLines = 3;

// Every process below `root`, by parent pid from /proc. Open MPI starts each local rank in a process group of
// its own, so a kill of mpirun's group would miss them: the tree is the only handle on a job mpirun left
// behind.
QList<pid_t> descendants(pid_t root) {
  QMultiHash<pid_t, pid_t> children;
  for (const QString& entry : QDir("/proc").entryList(QDir::Dirs | QDir::NoDotAndDotDot)) {
    bool isPid = false;
    const pid_t pid = pid_t(entry.toInt(&isPid));
    if (!isPid) continue;
    QFile stat("/proc/" + entry + "/stat");
    if (!stat.open(QIODevice::ReadOnly)) continue;
    // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so read after the last ')'.
    const QByteArray line = stat.readAll();
    const qsizetype close = line.lastIndexOf(')');
    if (close < 0) continue;
    const QList<QByteArray> fields = line.mid(close + 2).split(' ');
    if (fields.size() < 2) continue;
    children.insert(pid_t(fields[1].toInt()), pid);
  }
  QList<pid_t> out, queue{root};
  while (!queue.isEmpty()) {
    const pid_t p = queue.takeFirst();
    for (pid_t c : children.values(p))
      if (!out.contains(c)) out << c, queue << c;
  }
  return out;
}

QString quoted(const QString& arg) {
  if (!arg.isEmpty() && !arg.contains(QRegularExpression(R"([\s"'\\$`])"))) return arg;
  return "'" + QString(arg).replace("'", R"('\'')") + "'";
}

// Open MPI frames its messages in rules of dashes; those lines say nothing in a log.
bool isRule(const QString& line) {
  for (QChar c : line)
    if (c != '-' && c != '=' && !c.isSpace()) return false;
  return true;
}

}  // namespace

// ---------------------------------------------------------------------------------------------- options

QString ProcessRunOptions::findMpirun() {
  return QStandardPaths::findExecutable("mpirun");
}

QString ProcessRunOptions::defaultExtraArgs() {
  // Open MPI's daemons notice a lost host after oob_tcp_keepalive_time + probes x intvl of silence: 5 + 3 x 2
  // = 11 s here, against 300 + 9 x 20 s by default. That must come before the ranks give up on it (30 s,
  // GPUNODES_COMM_TIMEOUT), or mpirun and the far daemon outlive the ranks (docs/distributed.md, "Across
  // hosts"). Harmless on one machine.
  const QString keepalive =
      "--mca oob_tcp_keepalive_time 5 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3";
  if (::geteuid() == 0)
    return "--allow-run-as-root --oversubscribe --bind-to none --mca btl self,tcp --mca btl_tcp_if_include "
           "lo " +
           keepalive;
  return "--bind-to none " + keepalive;
}

QString ProcessRunOptions::resolvedMpirun() const {
  return mpirun.isEmpty() ? findMpirun() : mpirun;
}

QString ProcessRunOptions::resolvedProgram() const {
  return program.isEmpty() ? QCoreApplication::applicationFilePath() : program;
}

QStringList ProcessRunOptions::arguments(const QString& graph, const QString& report) const {
  QStringList args = extraArgs;
  if (!hostFile.isEmpty()) args << "--hostfile" << hostFile;
  args << "-np" << QString::number(processes);
  args << resolvedProgram() << "run" << graph << "--events"
       << "-"
       << "--report" << report;
  if (files.enabled()) args << "--folder" << files.folder;
  for (const QString& place : files.allowWrite) args << "--allow-write" << place;
  if (files.replaceForeign) args << "--force";
  return args;
}

// ---------------------------------------------------------------------------------------------- the job

ProcessRun::ProcessRun(QObject* parent) : QObject(parent) {
  killTimer_.setSingleShot(true);
  connect(&killTimer_, &QTimer::timeout, this, [this] {
    if (!isRunning()) return;
    emit output(Level::Warning,
                QString("mpirun still ran %1 s after the cancel: killing the job").arg(kKillAfterMs / 1000));
    killJob();
  });
}

ProcessRun::~ProcessRun() {
  if (!process_) return;
  process_->disconnect(this);
  if (process_->state() == QProcess::NotRunning) return;
  // The editor is closing (or a test ends) mid-job: stop it as Cancel does, but wait here, since no event
  // loop will deliver the rest; ranks must not outlive the editor.
  if (process_->processId() > 0) ::kill(pid_t(process_->processId()), SIGINT);
  if (!process_->waitForFinished(kKillAfterMs)) {
    killJob();
    process_->waitForFinished(2000);
  }
}

bool ProcessRun::start(const core::GraphDocument& doc, const ProcessRunOptions& options, QString* why) {
  auto fail = [why](const QString& text) {
    if (why) *why = text;
    return false;
  };
  if (started_) return fail("This job object has already run; make a new one.");
  options_ = options;
  options_.processes = qMax(1, options_.processes);
  const QString mpirun = options_.resolvedMpirun();
  if (mpirun.isEmpty())
    return fail("mpirun is not on PATH: install Open MPI (openmpi-bin) to run on several processes.");
  if (!options_.hostFile.isEmpty() && !QFileInfo(options_.hostFile).isReadable())
    return fail("The host file " + options_.hostFile + " cannot be read.");

  const QString parent = options_.tempParent.isEmpty() ? QDir::tempPath() : options_.tempParent;
  dir_ = std::make_unique<QTemporaryDir>(parent + "/gpunodes-mpi-XXXXXX");
  if (!dir_->isValid())
    return fail(QString("Cannot make a temporary folder in %1: %2").arg(parent, dir_->errorString()));
  // Every rank reads the graph from this file (the one serializer, so every rank and the editor agree on
  // it byte for byte); rank 0 leaves its report beside it.
  const QString graph = dir_->filePath("graph.json");
  reportPath_ = dir_->filePath("report.json");
  QString error;
  if (!core::serializer::saveFile(graph, doc, &error))
    return fail("Cannot save the graph for mpirun: " + error);

  process_ = new QProcess(this);
  process_->setProgram(mpirun);
  process_->setArguments(options_.arguments(graph, reportPath_));
  // mpirun forwards its stdin to rank 0; the job reads nothing, and must not wait on the editor's terminal.
  process_->setStandardInputFile(QProcess::nullDevice());
  commandLine_ = QStringList{mpirun} + process_->arguments();
  connect(process_, &QProcess::readyReadStandardOutput, this,
          [this] { feedStdout(process_->readAllStandardOutput()); });
  connect(process_, &QProcess::readyReadStandardError, this,
          [this] { feedStderr(process_->readAllStandardError(), false); });
  connect(process_, &QProcess::finished, this, &ProcessRun::onFinished);
  connect(process_, &QProcess::errorOccurred, this, &ProcessRun::onError);
  started_ = true;
  clock_.start();
  process_->start();
  return true;
}

QString ProcessRunOptions::commandText(const QStringList& commandLine) {
  QStringList parts;
  for (const QString& a : commandLine) parts << quoted(a);
  return parts.join(' ');
}

void ProcessRun::cancel() {
  if (!isRunning() || cancelRequested_) return;
  cancelRequested_ = true;
  const qint64 pid = process_->processId();
  if (pid <= 0) {  // not started yet: nothing has run
    killJob();
    return;
  }
  // As Ctrl-C in a terminal: mpirun passes it on to every rank as SIGTERM, each rank cancels its run and
  // rank 0 still writes its report. Whatever is left after kKillAfterMs is killed.
  ::kill(pid_t(pid), SIGINT);
  killTimer_.start(kKillAfterMs);
}

void ProcessRun::killJob() {
  if (!process_ || process_->state() == QProcess::NotRunning) return;
  const pid_t root = pid_t(process_->processId());
  if (root > 0)
    for (pid_t p : descendants(root)) ::kill(p, SIGKILL);
  process_->kill();
}

// ---------------------------------------------------------------------------------------------- streams

bool ProcessRun::parseLine(const QByteArray& line, core::RunEvent* out, QString* why) {
  QJsonParseError parseError;
  const QJsonDocument doc = QJsonDocument::fromJson(line, &parseError);
  if (parseError.error != QJsonParseError::NoError) {
    if (why) *why = "not JSON: " + parseError.errorString();
    return false;
  }
  if (!doc.isObject()) {
    if (why) *why = "not a JSON object";
    return false;
  }
  return core::eventFromJson(doc.object(), out, why);
}

void ProcessRun::feedStdout(const QByteArray& bytes) {
  outBuffer_ += bytes;
  qsizetype from = 0;
  for (qsizetype nl; (nl = outBuffer_.indexOf('\n', from)) >= 0; from = nl + 1) {
    const QByteArray line = outBuffer_.mid(from, nl - from).trimmed();
    ++lineNumber_;
    if (line.isEmpty()) continue;
    core::RunEvent e;
    QString why;
    if (parseLine(line, &e, &why)) {
      track(e);
      pending_.append(std::move(e));
    } else {
      const QString text = QString::fromUtf8(line);
      emit output(Level::Warning, QString("rank 0's event stream, line %1, is not an event (%2): %3")
                                      .arg(lineNumber_)
                                      .arg(why, text.size() > 200 ? text.left(200) + "…" : text));
    }
  }
  outBuffer_.remove(0, from);
  if (outBuffer_.size() > kMaxLineBytes) {
    emit output(Level::Warning,
                QString("rank 0's event stream sent %1 bytes without a line break: dropped them")
                    .arg(outBuffer_.size()));
    outBuffer_.clear();
  }
}

void ProcessRun::feedStderr(const QByteArray& bytes, bool flush) {
  errBuffer_ += bytes;
  qsizetype from = 0;
  for (qsizetype nl; (nl = errBuffer_.indexOf('\n', from)) >= 0; from = nl + 1)
    stderrLine(QString::fromUtf8(errBuffer_.mid(from, nl - from)));
  errBuffer_.remove(0, from);
  if (flush || errBuffer_.size() > kMaxLineBytes) {
    stderrLine(QString::fromUtf8(errBuffer_));
    errBuffer_.clear();
  }
}

void ProcessRun::stderrLine(const QString& raw) {
  const QString line = raw.trimmed();
  if (line.isEmpty()) return;
  if (isRule(line)) {
    inBox_ = !inBox_;
    return;
  }
  // "error" as a word: MPI_Abort's box line "with errorcode 1." is boilerplate, not a second error.
  static const QRegularExpression word(QStringLiteral("\\berror\\b"), QRegularExpression::CaseInsensitiveOption);
  const bool error = line.contains(word) || line.contains("exited on signal") || line.contains("noticed that process");
  // Open MPI's boxed messages are mostly boilerplate ("Primary job terminated normally, but..."); what the
  // failure message quotes is the ranks' own lines, and the box line that names a lost rank.
  if (!inBox_ || error) {
    notable_ << line;
    while (notable_.size() > kQuotedErrorLines) notable_.removeFirst();
  }
  lastErrors_ << line;
  while (lastErrors_.size() > kQuotedErrorLines) lastErrors_.removeFirst();
  emit output(error ? Level::Error : Level::Warning, line);
}

void ProcessRun::track(const core::RunEvent& e) {
  using K = core::RunEvent::Kind;
  switch (e.kind) {
    case K::RunStarted:
      graphName_ = e.message;
      break;
    case K::NodeQueued:
      nodes_[e.node] = QJsonObject{{"status", core::nodeStatusName(core::NodeStatus::Pending)}, {"error", ""}};
      break;
    case K::NodeStarted:
      nodes_[e.node].insert("status", core::nodeStatusName(core::NodeStatus::Running));
      break;
    case K::NodeFinished:
      nodes_[e.node].insert("status", core::nodeStatusName(core::NodeStatus::Ok));
      nodes_[e.node].insert("wall_ms", e.value);
      break;
    case K::NodeCached:
      // As the executor's report writes it: an ok node with the cache flag.
      nodes_[e.node].insert("status", core::nodeStatusName(core::NodeStatus::Ok));
      nodes_[e.node].insert("cached", true);
      break;
    case K::NodeFailed: {
      nodes_[e.node].insert("status", core::nodeStatusName(e.status));
      nodes_[e.node].insert("error", e.message);
      break;
    }
    case K::NodeWarning:
      if (!e.node.isEmpty()) {
        QJsonArray w = nodes_[e.node].value("warnings").toArray();
        w.append(e.message);
        nodes_[e.node].insert("warnings", w);
      }
      break;
    case K::Metric:
      metrics_[e.series].append({e.t, e.value});
      break;
    case K::RunFinished:
      finishedSeen_ = true;
      finishedOk_ = e.ok;
      finishedMessage_ = e.message;
      finishedStatus_ = e.status;
      finishedWallMs_ = e.value;
      break;
    case K::Progress:
    case K::Span:
    case K::Memory:
      break;
  }
}

QList<core::RunEvent> ProcessRun::takeEvents() {
  QList<core::RunEvent> out;
  out.swap(pending_);
  return out;
}

// ---------------------------------------------------------------------------------------------- the end

void ProcessRun::onFinished(int exitCode, QProcess::ExitStatus status) {
  // Whatever mpirun wrote last may still sit in the pipes.
  feedStdout(process_->readAllStandardOutput());
  if (!outBuffer_.isEmpty()) feedStdout("\n");
  feedStderr(process_->readAllStandardError(), true);
  finish(exitCode, status == QProcess::CrashExit, {});
}

void ProcessRun::onError(QProcess::ProcessError error) {
  // A crash or a kill also ends in finished(), which reports it; only a failed start never gets there.
  if (error == QProcess::FailedToStart)
    finish(-1, false, QString("Could not start %1: %2").arg(process_->program(), process_->errorString()));
}

void ProcessRun::finish(int exitCode, bool crashed, const QString& startError) {
  if (ended_) return;
  killTimer_.stop();

  QFile file(reportPath_);
  if (!reportPath_.isEmpty() && file.exists()) {
    QJsonParseError parseError{};
    QJsonDocument doc;
    if (file.size() <= kMaxReportBytes && file.open(QIODevice::ReadOnly))
      doc = QJsonDocument::fromJson(file.readAll(), &parseError);
    if (doc.isObject())
      fileReport_ = doc.object();
    else
      emit output(Level::Warning,
                  "Rank 0's report could not be read (" +
                      (parseError.error != QJsonParseError::NoError
                           ? parseError.errorString()
                           : QString("over %1 MiB or unreadable").arg(kMaxReportBytes >> 20)) +
                      "); the plots keep what the event stream told.");
  }

  // Only the user cancels. Rank 0 also reports "cancelled" when mpirun ended the job under it (a rank was
  // lost): that is a failure, and mpirun's exit code and last words say so.
  cancelled_ = cancelRequested_;
  auto quotedErrors = [this] {
    const QStringList& last = notable_.isEmpty() ? lastErrors_ : notable_;
    return last.isEmpty() ? QString() : ": " + last.join(" · ");
  };
  if (!startError.isEmpty()) {
    ok_ = false;
    message_ = startError;
  } else if (cancelled_) {
    ok_ = false;
    message_ = "cancelled";
  } else if (exitCode == 0 && !crashed && finishedSeen_ && finishedOk_) {
    ok_ = true;
  } else {
    ok_ = false;
    // A node's error, from rank 0's own RunFinished, is what a local run would say; otherwise the job ended
    // under the run (a rank lost, a failed start of a rank), and mpirun's last words say how.
    if (finishedSeen_ && !finishedOk_ && !finishedMessage_.isEmpty() &&
        finishedStatus_ != core::NodeStatus::Cancelled)
      message_ = finishedMessage_;
    else if (crashed)
      message_ = "mpirun crashed" + quotedErrors();
    else if (exitCode != 0)
      message_ = QString("mpirun exited with code %1").arg(exitCode) + quotedErrors();
    else
      message_ = "mpirun ended before rank 0 finished the run" + quotedErrors();
  }
  if (!finishedSeen_) {
    // The consumers see every run end with a RunFinished, as after a local run.
    core::RunEvent e{core::RunEvent::Kind::RunFinished};
    e.ok = false;
    e.status = cancelled_ ? core::NodeStatus::Cancelled : core::NodeStatus::Failed;
    e.message = message_;
    e.value = double(clock_.nsecsElapsed()) / 1e6;
    pending_.append(e);
  }
  ended_ = true;
  emit ended();
}

QJsonObject ProcessRun::report() const {
  if (!fileReport_.isEmpty()) return fileReport_;
  return started_ ? eventReport() : QJsonObject();
}

QJsonObject ProcessRun::eventReport() const {
  QJsonObject nodes, metrics;
  for (auto it = nodes_.begin(); it != nodes_.end(); ++it) nodes.insert(it.key(), it.value());
  for (auto it = metrics_.begin(); it != metrics_.end(); ++it) {
    QJsonArray points;
    for (const auto& [t, v] : it.value()) points.append(QJsonArray{t, v});
    metrics.insert(it.key(), points);
  }
  QJsonObject r{{"graph", graphName_},
                {"ok", ended_ && ok_},
                {"cancelled", ended_ && cancelled_},
                {"running", !ended_},
                {"wall_ms", finishedSeen_ ? finishedWallMs_ : double(clock_.nsecsElapsed()) / 1e6},
                {"world_size", options_.processes},
                {"devices", QJsonArray()},
                {"nodes", nodes},
                {"metrics", metrics},
                {"memory", QJsonObject()}};
  if (ended_ && !ok_ && !message_.isEmpty()) r.insert("error", message_);
  return r;
}

}  // namespace gn::editor
