// Shared by the robustness suites: the hostile corpus's manifest, and the real `gpunodes` binary as a
// subprocess with its exit, output, time and peak memory.
#pragma once
#include <sys/resource.h>

#include <QElapsedTimer>
#include <QFile>
#include <QProcess>
#include <QString>
#include <QStringList>

#include "time_scale.h"

namespace gn::robustness {

// One line of tests/data/hostile/MANIFEST.tsv.
struct HostileFile {
  QString file, attack, word;  // word: what the first error must name (may be empty)
  int lines = 1;               // error lines `validate` prints: one per distinct mistake
};

inline QList<HostileFile> readManifest(const QString& dir) {
  QList<HostileFile> out;
  QFile f(dir + "/MANIFEST.tsv");
  if (!f.open(QIODevice::ReadOnly)) return out;
  for (const QByteArray& raw : f.readAll().split('\n')) {
    if (raw.isEmpty() || raw.startsWith('#')) continue;
    const QStringList cols = QString::fromUtf8(raw).split(u'\t');
    if (cols.size() != 4) continue;
    out.append({cols[0], cols[1], cols[2], cols[3].toInt()});
  }
  return out;
}

struct Run {
  bool crashed = false, timedOut = false;
  int exitCode = -1;
  QString out, err;
  qint64 ms = 0;
  // The child's processor time, user and system, every thread's: what its work cost, whatever else the
  // machine was running (a wall-clock bound fails on a busy machine, this one on work that grew).
  qint64 cpuMs = 0;
  QString describe() const {
    return QStringLiteral("%1 %2 after %3 ms (%4 ms of processor time)\n--- stdout\n%5\n--- stderr\n%6")
        .arg(crashed    ? "crashed (signal)"
             : timedOut ? "timed out"
                        : "exit")
        .arg(exitCode)
        .arg(ms)
        .arg(cpuMs)
        .arg(out.left(2000), err.left(3000));
  }
};

// The processor time of every finished child so far, in ms (the kernel adds a child's when it is reaped).
inline qint64 childrenCpuMs() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  const auto ms = [](const timeval& t) { return qint64(t.tv_sec) * 1000 + t.tv_usec / 1000; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

inline Run runProcess(const QString& program, const QStringList& args, const QProcessEnvironment& env,
                      int timeoutMs = 60000) {
  const qint64 cpuBefore = childrenCpuMs();
  QProcess p;
  p.setProcessEnvironment(env);
  QElapsedTimer timer;
  timer.start();
  p.start(program, args);
  Run r;
  if (!p.waitForFinished(timeoutMs)) {
    p.kill();
    p.waitForFinished();
    r.timedOut = true;
  }
  r.ms = timer.elapsed();
  r.cpuMs = childrenCpuMs() - cpuBefore;
  r.crashed = !r.timedOut && p.exitStatus() == QProcess::CrashExit;
  r.exitCode = p.exitCode();
  r.out = QString::fromUtf8(p.readAllStandardOutput());
  r.err = QString::fromUtf8(p.readAllStandardError());
  return r;
}

// The largest resident set of any finished child so far, in MiB (the kernel keeps the maximum).
inline long childrenPeakRssMiB() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  return u.ru_maxrss / 1024;
}

}  // namespace gn::robustness
