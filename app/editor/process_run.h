// A run of the document on several processes: the graph is saved to a temporary file, `mpirun ... gpunodes
// run FILE --events - --report R.json` is started, and rank 0's event stream (one JSON event per line on
// stdout, docs/events.md) is read back into the same RunEvents a local run produces, so the run controller
// hands them to the same plots, timeline, canvas and log. Stderr (rank errors, mpirun's own messages) is
// passed on line by line. When mpirun ends, rank 0's report file becomes the run's report.
#pragma once
#include <QElapsedTimer>
#include <QJsonObject>
#include <QList>
#include <QMap>
#include <QObject>
#include <QProcess>
#include <QStringList>
#include <QTimer>
#include <memory>

#include "gpunodes/core/file_access.h"
#include "gpunodes/core/run_events.h"

class QTemporaryDir;

namespace gn::core {
class GraphDocument;
}

namespace gn::editor {

struct ProcessRunOptions {
  int processes = 2;
  QString hostFile;       // empty: every process on this machine
  QStringList extraArgs;  // the user's mpirun arguments, before the gpunodes binary
  QString mpirun;         // empty: `mpirun` from PATH
  QString program;        // empty: this binary (QCoreApplication::applicationFilePath())
  // Where the temporary folder with the graph and the report goes; empty: the system's temporary folder.
  // Across machines it must be a folder every host sees (the ranks read the graph from it).
  QString tempParent;
  // What the graph may write (file_consent.h): the ranks read a copy in a temporary folder, so they are
  // told the graph's own folder (--folder) and the places the user allowed (--allow-write, --force).
  core::FilePolicy files;

  // Where `mpirun` is on PATH; empty when it is not.
  static QString findMpirun();
  // What the dialog offers first: as root on one machine, the options Open MPI needs to start at all
  // (docs/distributed.md); otherwise `--bind-to none`, since gpunodes shares the cores out itself. Both with
  // the oob_tcp_keepalive settings under which mpirun notices a lost host before the ranks give up on it.
  static QString defaultExtraArgs();
  // mpirun's arguments for a graph file and a report path.
  QStringList arguments(const QString& graph, const QString& report) const;
  QString resolvedMpirun() const;
  QString resolvedProgram() const;
  // A command line as a shell would take it back (arguments with spaces or quotes quoted), for the log.
  static QString commandText(const QStringList& commandLine);
};

class ProcessRun : public QObject {
  Q_OBJECT
 public:
  enum class Level { Info, Warning, Error };
  Q_ENUM(Level)
  // After Cancel, mpirun gets SIGINT (it SIGTERMs every rank within about 1.5 s); this long after, whatever
  // is left of the job is killed.
  static constexpr int kKillAfterMs = 5000;

  explicit ProcessRun(QObject* parent = nullptr);
  ~ProcessRun() override;  // a job still going is stopped, as by Cancel, before this returns

  // Saves `doc`, starts mpirun. False (why says so) when the file cannot be written or mpirun is missing.
  bool start(const core::GraphDocument& doc, const ProcessRunOptions& options, QString* why);
  void cancel();
  bool isRunning() const { return started_ && !ended_; }
  bool hasEnded() const { return ended_; }
  bool cancelRequested() const { return cancelRequested_; }
  qint64 processId() const { return process_ ? process_->processId() : 0; }
  int worldSize() const { return options_.processes; }
  QStringList commandLine() const { return commandLine_; }

  // The events read since the last call, oldest first. Once the job has ended and no RunFinished came from
  // rank 0 (a rank was lost, mpirun failed to start), the last batch ends with one made here.
  QList<core::RunEvent> takeEvents();
  // Once ended: the outcome, from the RunFinished event, mpirun's exit code and its last stderr lines.
  bool ok() const { return ok_; }
  bool cancelled() const { return cancelled_; }
  QString message() const { return message_; }
  // Rank 0's report file once the job has ended and left one; until then (or without one) a report put
  // together from the events: the graph's name, each node's status, wall time and error, the metrics.
  QJsonObject report() const;

  // Bytes of rank 0's stdout, in any pieces: complete lines become events, a malformed one a warning.
  // Public so that the line format can be checked without a job.
  void feedStdout(const QByteArray& bytes);
  // One line of the stream as an event; false (why says so) for a line that is not one.
  static bool parseLine(const QByteArray& line, core::RunEvent* out, QString* why);

 signals:
  // A line for the log: stderr, a malformed stdout line, what happened to the job.
  void output(gn::editor::ProcessRun::Level level, const QString& text);
  void ended();

 private:
  void track(const core::RunEvent& e);
  void feedStderr(const QByteArray& bytes, bool flush);
  void stderrLine(const QString& line);
  void onFinished(int exitCode, QProcess::ExitStatus status);
  void onError(QProcess::ProcessError error);
  void finish(int exitCode, bool crashed, const QString& startError);
  void killJob();
  QJsonObject eventReport() const;

  ProcessRunOptions options_;
  std::unique_ptr<QTemporaryDir> dir_;
  QString reportPath_;
  QStringList commandLine_;
  QProcess* process_ = nullptr;
  QTimer killTimer_;
  QElapsedTimer clock_;
  bool started_ = false, ended_ = false, cancelRequested_ = false;
  QByteArray outBuffer_, errBuffer_;
  qint64 lineNumber_ = 0;
  QList<core::RunEvent> pending_;
  // The last stderr lines, and the last that are not Open MPI's boilerplate, for the failure message.
  QStringList lastErrors_, notable_;
  bool inBox_ = false;  // between the rules of dashes that frame an Open MPI message

  // What the events told so far, for the report when there is no file.
  QString graphName_;
  bool finishedSeen_ = false, finishedOk_ = false;
  double finishedWallMs_ = 0;
  QString finishedMessage_;
  core::NodeStatus finishedStatus_ = core::NodeStatus::Pending;  // rank 0's RunFinished: ok, failed, cancelled
  QMap<QString, QJsonObject> nodes_;
  QMap<QString, QList<QPair<double, double>>> metrics_;

  bool ok_ = false, cancelled_ = false;
  QString message_;
  QJsonObject fileReport_;
};

}  // namespace gn::editor
