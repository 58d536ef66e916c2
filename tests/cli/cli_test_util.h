// The real `gpunodes` binary as a subprocess, shared by the command-line suites (run, sweep, mpirun jobs).
#pragma once
#include <QElapsedTimer>
#include <QFile>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>

#include "time_scale.h"

namespace gn::clitest {

struct Result {
  int exitCode = -1;  // -1 timed out, -2 crashed
  QString out, err;
  qint64 ms = 0;
};

inline QProcessEnvironment pluginEnvironment(const QString& pluginPath) {
  QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
  env.insert("GPUNODES_PLUGIN_PATH", pluginPath);
  return env;
}

inline Result runProgram(const QString& program, const QStringList& args, const QProcessEnvironment& env,
                         int timeoutMs, const QString& workDir = {}) {
  QProcess p;
  p.setProcessEnvironment(env);
  if (!workDir.isEmpty()) p.setWorkingDirectory(workDir);
  QElapsedTimer timer;
  timer.start();
  p.start(program, args);
  if (!p.waitForFinished(timeoutMs)) {
    p.kill();
    p.waitForFinished();
    return {-1, QString::fromUtf8(p.readAllStandardOutput()),
            "timed out: " + QString::fromUtf8(p.readAllStandardError()), timer.elapsed()};
  }
  return {p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -2,
          QString::fromUtf8(p.readAllStandardOutput()), QString::fromUtf8(p.readAllStandardError()),
          timer.elapsed()};
}

// mpirun's options as the README runs it as root in a container: loopback TCP only, no binding, more ranks
// than cores allowed.
inline QStringList mpirunLoopbackOptions() {
  QStringList options = {"--allow-run-as-root", "--oversubscribe", "--bind-to", "none", "--mca", "btl",
                         "self,tcp", "--mca", "btl_tcp_if_include", "lo"};
  // Under AddressSanitizer (CI's second pass) the ranks are checked for memory errors but not for leaks:
  // Open MPI 4.1 keeps what MPI_Init allocates in components that MPI_Finalize unloads, so LeakSanitizer
  // reports them from "<unknown module>", which no suppression can name (and 4.1 has no switch to keep
  // them loaded). The same code paths are leak-checked in the suites that run without mpirun.
  const QByteArray asan = qgetenv("ASAN_OPTIONS");
  if (!asan.isEmpty()) options << "-x" << "ASAN_OPTIONS=" + QString::fromLocal8Bit(asan) + ":detect_leaks=0";
  return options;
}

// The same for a job of `ranks` processes.
inline QStringList mpirunOptions(int ranks) {
  return mpirunLoopbackOptions() + QStringList{"-np", QString::number(ranks)};
}

inline QString describe(const Result& r) {
  return QStringLiteral("exit %1 after %2 ms\n--- stdout\n%3\n--- stderr\n%4")
      .arg(r.exitCode)
      .arg(r.ms)
      .arg(r.out.left(4000), r.err.left(4000));
}

inline QJsonObject readJson(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return {};
  return QJsonDocument::fromJson(f.readAll()).object();
}

inline QString write(const QTemporaryDir& dir, const QString& name, const QByteArray& bytes) {
  QFile f(dir.filePath(name));
  if (!f.open(QIODevice::WriteOnly)) qFatal("cannot write %s", qPrintable(f.fileName()));
  f.write(bytes);
  return f.fileName();
}

}  // namespace gn::clitest

#define EXPECT_EXIT(result, code) \
  QVERIFY2((result).exitCode == (code), qPrintable(gn::clitest::describe(result)))
