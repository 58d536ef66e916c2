// Hostile ONNX models (tests/data/hostile-onnx, written by its make_corpus.py) through `gpunodes import-onnx`,
// the real binary and plugin: each must be refused with a non-zero exit and ONE error line that contains the
// MANIFEST's word and names the node, tensor or file, in under 2 s of processor time (the child's, so that a
// busy machine does not fail it; ten times that under a sanitizer, time_scale.h), leaving nothing written
// (neither the graph given with -o nor the weights file beside it). Rows without a word must import, in the
// same time: the corpus's valid.onnx (the control) and a chain of 5,000 unnamed nodes.
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QTemporaryDir>
#include <QtTest>

#include <sys/resource.h>

#include "interop_util.h"
#include "time_scale.h"

namespace {

using interop::nonEmptyLines;

// The processor time of every reaped child so far, user and system, in ms.
qint64 childrenCpuMs() {
  rusage u{};
  getrusage(RUSAGE_CHILDREN, &u);
  const auto ms = [](const timeval& t) { return qint64(t.tv_sec) * 1000 + t.tv_usec / 1000; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}
constexpr qint64 kBudgetMs = 2000 * kTimeScale;
// Wall time only catches a hang (a process waiting uses no processor time), with room for a busy machine.
constexpr qint64 kHangMs = 20000 * kTimeScale;

struct Case {
  QString file, attack, word, names;
};

QList<Case> manifest() {
  QList<Case> cases;
  QFile f(GN_HOSTILE_ONNX_DIR "/MANIFEST.tsv");
  if (!f.open(QIODevice::ReadOnly | QIODevice::Text)) return cases;
  for (const QString& line : QString::fromUtf8(f.readAll()).split('\n')) {
    if (line.isEmpty() || line.startsWith('#')) continue;
    const QStringList cols = line.split('\t');
    if (cols.size() < 4) continue;
    cases.append({cols[0], cols[1], cols[2], cols[3]});
  }
  return cases;
}


}  // namespace

class OnnxHostileTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;

 private slots:
  void initTestCase() { QVERIFY(dir_.isValid()); }

  void corpus_is_complete() {
    const QList<Case> cases = manifest();
    QVERIFY2(cases.size() >= 30, "MANIFEST.tsv lists fewer cases than make_corpus.py writes");
    for (const Case& c : cases)
      QVERIFY2(QFileInfo::exists(GN_HOSTILE_ONNX_DIR "/" + c.file), qPrintable(c.file + " is missing"));
    // The link case needs its link: git keeps it as one.
    QVERIFY(QFileInfo(GN_HOSTILE_ONNX_DIR "/escape-link").isSymLink());
  }

  void refused_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("word");
    QTest::addColumn<QString>("names");
    for (const Case& c : manifest())
      QTest::newRow(qPrintable(c.file)) << c.file << c.word << c.names;
  }
  void refused() {
    QFETCH(QString, file);
    QFETCH(QString, word);
    QFETCH(QString, names);
    const QString out = dir_.filePath(QFileInfo(file).completeBaseName() + ".json");
    const QString weights = dir_.filePath(QFileInfo(file).completeBaseName() + ".safetensors");
    const qint64 cpuBefore = childrenCpuMs();
    QElapsedTimer clock;
    clock.start();
    const interop::Process p = interop::run(GN_GPUNODES, {"import-onnx", GN_HOSTILE_ONNX_DIR "/" + file, "-o", out});
    const qint64 ms = childrenCpuMs() - cpuBefore;
    QVERIFY2(clock.elapsed() < kHangMs, qPrintable(QStringLiteral("took %1 ms of wall time").arg(clock.elapsed())));
    if (word.isEmpty()) {  // a model that must import, in the same time: valid.onnx, the 5,000-node chain
      const bool written = QFileInfo::exists(out) && QFileInfo::exists(weights);
      QFile::remove(out);  // first, so that a failure here leaves nothing for the next rows to find
      QFile::remove(weights);
      QVERIFY2(p.exitCode == 0, qPrintable(p.err));
      QVERIFY2(ms < kBudgetMs, qPrintable(QStringLiteral("took %1 ms of processor time").arg(ms)));
      QVERIFY(written);
      return;
    }
    QVERIFY2(p.exitCode > 0, qPrintable(QStringLiteral("exit %1 (a crash is -1): %2").arg(p.exitCode).arg(p.err)));
    const QStringList lines = nonEmptyLines(p.err);
    QVERIFY2(lines.size() == 1, qPrintable(QStringLiteral("%1 lines on stderr:\n%2").arg(lines.size()).arg(p.err)));
    const QString& line = lines[0];
    QVERIFY2(line.startsWith("error: "), qPrintable(line));
    QVERIFY2(line.contains(word, Qt::CaseInsensitive), qPrintable("no '" + word + "' in: " + line));
    QVERIFY2(line.contains(names), qPrintable("does not name " + names + ": " + line));
    QVERIFY2(line.size() < 4096, "an unbounded message");
    QVERIFY2(ms < kBudgetMs, qPrintable(QStringLiteral("took %1 ms of processor time").arg(ms)));
    QVERIFY2(!QFileInfo::exists(out), "the graph was written");
    QVERIFY2(!QFileInfo::exists(weights), "the weights were written");
    QVERIFY2(QDir(dir_.path()).entryList(QDir::Files | QDir::Hidden).isEmpty(),
             qPrintable("left behind: " + QDir(dir_.path()).entryList(QDir::Files | QDir::Hidden).join(", ")));
  }
};

QTEST_GUILESS_MAIN(OnnxHostileTest)
#include "test_onnx_hostile.moc"
