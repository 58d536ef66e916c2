// The real editor binary, edited and then killed with SIGKILL, headless. Qt's VNC platform plugin stands in
// for a display: the test connects as a VNC client and types, as a user would (Tab opens the node search,
// Return adds the node, Ctrl+S saves), so the binary runs unmodified and its own timers do the autosaving.
//   - While the graph is being edited, the recovery file is rewritten at most 30 s apart, so what a kill
//     loses is at most the last 30 s of work.
//   - After the kill, the next start offers the recovery file; accepting restores exactly what it held, and
//     saving writes it to the graph's own file. A clean exit then removes the recovery file.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <QDateTime>
#include <QDir>
#include <QElapsedTimer>
#include <QFile>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QLibraryInfo>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include <cstring>
#include <thread>

#include "time_scale.h"

namespace {

constexpr qint64 kAutosaveMs = 30000;  // the promise: unsaved work is at most this old in the recovery file

// X11 keysyms, which RFB uses.
constexpr uint32_t kTab = 0xff09, kReturn = 0xff0d, kControl = 0xffe3, kAlt = 0xffe9;

int freePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    close(fd);
    return 0;
  }
  close(fd);
  return ntohs(a.sin_port);
}

// The smallest RFB 3.3 client that sends keys (RFC 6143; Qt's server speaks 3.3 with no authentication).
class VncKeyboard {
 public:
  ~VncKeyboard() {
    if (fd_ >= 0) close(fd_);
  }
  bool connect(int port, int timeoutMs) {
    QElapsedTimer t;
    t.start();
    while (t.elapsed() < timeoutMs) {
      fd_ = socket(AF_INET, SOCK_STREAM, 0);
      sockaddr_in a{};
      a.sin_family = AF_INET;
      a.sin_port = htons(uint16_t(port));
      a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) return handshake();
      close(fd_);
      fd_ = -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return false;
  }
  void tap(uint32_t keysym, uint32_t modifier = 0) {
    if (modifier) key(modifier, true);
    key(keysym, true);
    key(keysym, false);
    if (modifier) key(modifier, false);
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
  }
  void type(const QString& text) {
    for (QChar c : text) tap(c.unicode());
  }

 private:
  bool readAll(char* p, size_t n) {
    while (n > 0) {
      const ssize_t got = read(fd_, p, n);
      if (got <= 0) return false;
      p += got;
      n -= size_t(got);
    }
    return true;
  }
  bool handshake() {
    char version[12], security[4], init[24];
    if (!readAll(version, 12) || write(fd_, "RFB 003.003\n", 12) != 12) return false;
    if (!readAll(security, 4) || security[3] != 1) return false;  // 1: no authentication
    const char shared = 1;
    if (write(fd_, &shared, 1) != 1 || !readAll(init, 24)) return false;
    const uint32_t nameLength = ntohl(*reinterpret_cast<uint32_t*>(init + 20));
    QByteArray name(int(nameLength), '\0');
    return readAll(name.data(), nameLength);
  }
  void key(uint32_t keysym, bool down) {
    unsigned char m[8] = {4, down, 0, 0};
    const uint32_t k = htonl(keysym);
    std::memcpy(m + 4, &k, 4);
    if (write(fd_, m, 8) != 8) qWarning("vnc: a key event was not sent");
  }
  int fd_ = -1;
};

QStringList nodeIds(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return {};
  QStringList ids;
  for (const QJsonValue& n : QJsonDocument::fromJson(f.readAll()).object()["nodes"].toArray())
    ids << n.toObject()["id"].toString();
  ids.sort();
  return ids;
}

}  // namespace

class KilledEditorTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  QString graph_, recovery_;

  // The editor on a VNC screen of its own, with settings and recovery files in the test's folder.
  void start(QProcess& p, VncKeyboard& vnc) {
    const int port = freePort();
    QVERIFY(port > 0);
    QProcessEnvironment env = QProcessEnvironment::systemEnvironment();
    env.insert("QT_QPA_PLATFORM", QStringLiteral("vnc:size=1280x800:port=%1").arg(port));
    env.insert("GPUNODES_RECOVERY_DIR", dir_.filePath("recovery"));
    env.insert("XDG_CONFIG_HOME", dir_.filePath("config"));
    env.insert("XDG_DATA_HOME", dir_.filePath("data"));
    env.insert("XDG_RUNTIME_DIR", dir_.filePath("runtime"));
    env.remove("GPUNODES_PLUGIN_PATH");
    p.setProcessEnvironment(env);
    p.setProcessChannelMode(QProcess::ForwardedErrorChannel);
    p.start(GN_GPUNODES, {graph_});
    QVERIFY(p.waitForStarted());
    QVERIFY2(vnc.connect(port, 30000 * kTimeScale), "no VNC connection to the editor");
  }

  // One edit: a node added through the node search, as a user does it from the keyboard.
  static void addNode(VncKeyboard& vnc) {
    vnc.tap(kTab);
    QTest::qWait(300);
    vnc.type("Inspect");
    QTest::qWait(200);
    vnc.tap(kReturn);
  }

 private slots:
  void initTestCase() {
    if (!QFile::exists(QLibraryInfo::path(QLibraryInfo::PluginsPath) + "/platforms/libqvnc.so"))
      QSKIP("Qt's VNC platform plugin (libqvnc.so) is not installed");
    QVERIFY(dir_.isValid());
    QDir(dir_.path()).mkpath("runtime");
    QFile::setPermissions(dir_.filePath("runtime"), QFile::ReadOwner | QFile::WriteOwner | QFile::ExeOwner);
    graph_ = dir_.filePath("work.json");
    recovery_ = dir_.filePath("recovery/recovery.json");
    QFile g(graph_);
    QVERIFY(g.open(QIODevice::WriteOnly));
    g.write(R"({"format": "gpunodes-graph", "version": 1, "nodes": [
      {"id": "dev0", "type": "Device", "position": [0, 0], "params": {"kind": "cpu"}},
      {"id": "x1", "type": "Tensor", "position": [250, 0]}],
      "connections": [{"from": "dev0.device", "to": "x1.device"}]})");
  }

  void killedWhileEditingLosesAtMostThirtySeconds() {
    QProcess editor;
    VncKeyboard vnc;
    start(editor, vnc);
    // Ready once it has looked for a recovery file (the folder exists) and opened the graph.
    QTRY_VERIFY_WITH_TIMEOUT(QDir(dir_.filePath("recovery")).exists(), 30000 * kTimeScale);
    QTest::qWait(1500 * kTimeScale);

    // Edit steadily, one node every ~1.5 s, noting when each was sent; watch the recovery file's writes.
    QList<QDateTime> sent;
    QList<QDateTime> autosaves;
    QElapsedTimer t;
    t.start();
    while (autosaves.size() < 2 && t.elapsed() < 3 * kAutosaveMs + 20000) {
      addNode(vnc);
      sent << QDateTime::currentDateTime();
      for (int i = 0; i < 10; ++i) {
        QTest::qWait(100);
        const QFileInfo info(recovery_);
        if (info.exists() && (autosaves.isEmpty() || info.lastModified() > autosaves.last()))
          autosaves << info.lastModified();
      }
      QVERIFY2(editor.state() == QProcess::Running, "the editor died while being edited");
    }
    QVERIFY2(autosaves.size() == 2, "the recovery file was not written twice while editing");
    // The promise: consecutive autosaves of unsaved work are at most 30 s apart (the timer is precise).
    const qint64 gap = autosaves[0].msecsTo(autosaves[1]);
    QVERIFY2(gap <= kAutosaveMs + 500, qPrintable(QStringLiteral("autosaves %1 ms apart").arg(gap)));
    QTest::qWait(2000);
    const QStringList recovered = nodeIds(recovery_);

    editor.kill();  // SIGKILL: no closeEvent, no cleanup
    QVERIFY(editor.waitForFinished(10000));
    QCOMPARE(editor.exitStatus(), QProcess::CrashExit);
    const QDateTime killedAt = QDateTime::currentDateTime();

    // What the recovery file holds is at most 30 s old, and it is the work as of its last write.
    QVERIFY(QFile::exists(recovery_));
    const qint64 age = QFileInfo(recovery_).lastModified().msecsTo(killedAt);
    QVERIFY2(age <= kAutosaveMs, qPrintable(QStringLiteral("the last autosave is %1 ms old").arg(age)));
    QCOMPARE(nodeIds(recovery_), recovered);
    qsizetype before = 0;
    for (const QDateTime& s : sent) before += s < QFileInfo(recovery_).lastModified();
    // Each edit sent before the last write is in it (the last one may have been in flight).
    QVERIFY2(recovered.size() - 2 >= before - 1 && recovered.size() - 2 <= sent.size(),
             qPrintable(QStringLiteral("%1 nodes recovered, %2 edits sent before the autosave, %3 in all")
                            .arg(recovered.size())
                            .arg(before)
                            .arg(sent.size())));
    QVERIFY(recovered.size() > 2);
    QFile meta(dir_.filePath("recovery/recovery.meta.json"));
    QVERIFY(meta.open(QIODevice::ReadOnly));
    QCOMPARE(QJsonDocument::fromJson(meta.readAll()).object()["file"].toString(),
             QFileInfo(graph_).absoluteFilePath());
    QCOMPARE(nodeIds(graph_).size(), 2);  // the graph's own file was never saved
  }

  void theNextStartOffersTheRecoveryFile() {
    QVERIFY2(QFile::exists(recovery_), "no recovery file from the killed editor");
    const QStringList recovered = nodeIds(recovery_);
    QProcess editor;
    VncKeyboard vnc;
    start(editor, vnc);
    // The offer is a question with Yes as its default: Return accepts it. Ctrl+S then saves the restored
    // graph to its own file. Until the question is up, Return reaches nothing and Ctrl+S is not possible.
    QElapsedTimer t;
    t.start();
    while (nodeIds(graph_) != recovered && t.elapsed() < 60000 * kTimeScale &&
           editor.state() == QProcess::Running) {
      vnc.tap(kReturn);
      QTest::qWait(700);
      if (nodeIds(graph_) == recovered) break;
      vnc.tap('s', kControl);
      QTest::qWait(700);
    }
    QCOMPARE(nodeIds(graph_), recovered);
    // Saved and clean: File > Quit (Alt+F, Q: the VNC platform binds no Ctrl+Q) quits without a question, and
    // a clean exit leaves nothing to recover.
    vnc.tap('f', kAlt);
    QTest::qWait(800);
    vnc.tap('q');
    QVERIFY2(editor.waitForFinished(30000 * kTimeScale), "the editor did not quit");
    QCOMPARE(editor.exitStatus(), QProcess::NormalExit);
    QCOMPARE(editor.exitCode(), 0);
    QVERIFY(!QFile::exists(recovery_));
  }
};

QTEST_GUILESS_MAIN(KilledEditorTest)
#include "test_killed_editor.moc"
