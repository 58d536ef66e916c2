// Shared by the PyTorch interop suites: float32 files exchanged with the torch peer, the comparison of
// outputs, and graph files run through the real binary.
#pragma once
#include <QFile>
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QString>
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <vector>

namespace interop {

// Outputs agree to 1e-4 of the largest output magnitude: float32 sums in another order (oneDNN and OpenBLAS
// against torch's kernels) differ in the last bits, and nothing larger.
constexpr double kRelTol = 1e-4;

inline void write_floats(const QString& path, const std::vector<float>& v) {
  std::ofstream out(path.toStdString(), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
}

inline std::vector<float> read_floats(const QString& path) {
  std::ifstream in(path.toStdString(), std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(b.size() / sizeof(float));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(float));
  return v;
}

// Empty when `got` matches `want` within kRelTol of want's largest magnitude; otherwise what differs.
inline QString compare(const std::vector<float>& got, const std::vector<float>& want) {
  if (got.size() != want.size() || want.empty())
    return QStringLiteral("%1 outputs, expected %2").arg(got.size()).arg(want.size());
  double scale = 0, worst = 0;
  size_t at = 0;
  for (float w : want) scale = std::max(scale, std::abs(double(w)));
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - double(want[i]));
    if (!(d <= worst)) {  // NaN counts as the worst
      worst = d;
      at = i;
    }
  }
  qInfo("largest difference %.3g, largest output %.3g", worst, scale);
  if (scale > 0 && worst <= kRelTol * scale) return {};
  return QStringLiteral("output %1 is %2, expected %3 (largest difference %4, tolerance %5)")
      .arg(at)
      .arg(double(got[at]), 0, 'g', 9)
      .arg(double(want[at]), 0, 'g', 9)
      .arg(worst, 0, 'g', 3)
      .arg(kRelTol * scale, 0, 'g', 3);
}

// --- graph files and processes ----------------------------------------------------------------------------

inline QJsonObject readJson(const QString& path) {
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return {};
  return QJsonDocument::fromJson(f.readAll()).object();
}

inline bool writeJson(const QString& path, const QJsonObject& o) {
  QFile f(path);
  return f.open(QIODevice::WriteOnly) && f.write(QJsonDocument(o).toJson()) > 0;
}

inline QJsonObject node(const QString& id, const QString& type, const QJsonObject& params = {}) {
  return {{"id", id}, {"type", type}, {"position", QJsonArray{0, 0}}, {"params", params}};
}
inline QJsonObject wire(const QString& from, const QString& to) {
  return {{"from", from}, {"to", to}};
}
inline QJsonObject graphOf(const QJsonArray& nodes, const QJsonArray& wires) {
  return {{"format", "gpunodes-graph"}, {"version", 1}, {"nodes", nodes}, {"connections", wires}};
}

// The weights of a Forward graph's Network "net" (on Device "cpu"), into Forward "fwd": saved to `saveTo` as
// safetensors (gpunodes' own), or, with `loadFrom` set, loaded from that file through LoadParams.
inline void wireWeights(QJsonArray& nodes, QJsonArray& wires, const QString& saveTo, const QString& loadFrom) {
  if (loadFrom.isEmpty()) {
    nodes.append(node("save", "SaveParams", {{"path", saveTo}, {"format", "safetensors"}}));
    wires.append(wire("net.model", "save.model"));
    wires.append(wire("net.model", "fwd.model"));
  } else {
    nodes.append(node("load", "LoadParams", {{"path", loadFrom}}));
    wires.append(wire("cpu.device", "load.device"));
    wires.append(wire("net.model", "load.like"));
    wires.append(wire("load.model", "fwd.model"));
  }
}

struct Process {
  int exitCode = -1;
  QString out, err;
};

inline Process run(const QString& program, const QStringList& args) {
  QProcess p;
  p.start(program, args);
  Process r;
  if (!p.waitForStarted(30000) || !p.waitForFinished(600000)) {
    r.err = program + " did not finish: " + p.errorString();
    p.kill();
    return r;
  }
  r.exitCode = p.exitStatus() == QProcess::NormalExit ? p.exitCode() : -1;
  r.out = QString::fromUtf8(p.readAllStandardOutput());
  r.err = QString::fromUtf8(p.readAllStandardError());
  return r;
}

// Why `python` cannot serve as the torch peer (missing, or torch does not import); empty when it can. The
// suites skip on it: CI installs python3-torch, so there they run.
inline QString torchMissing(const QString& python) {
  if (!QFile::exists(python)) return python + " is missing: install python3-torch to run the interop suite";
  const Process probe = run(python, {"-c", "import torch"});
  if (probe.exitCode != 0) return "cannot import torch (apt-get install python3-torch): " + probe.err;
  return {};
}

// The values an Inspect node `node` reported in a run report (the first 1000 of its input).
inline std::vector<float> inspected(const QJsonObject& report, const QString& node) {
  std::vector<float> out;
  const QJsonArray inspect = report["nodes"].toObject()[node].toObject()["inspect"].toArray();
  for (const QJsonValue& v : inspect.at(0).toObject()["values"].toArray()) out.push_back(float(v.toDouble()));
  return out;
}

// The lines of `text` that are not blank: a refusal must be one of them.
inline QStringList nonEmptyLines(const QString& text) {
  QStringList lines;
  for (const QString& l : text.split('\n'))
    if (!l.trimmed().isEmpty()) lines.append(l);
  return lines;
}

// Why `python` cannot serve as the ONNX peer (torch, or the onnx package, missing); empty when it can.
inline QString onnxPeerMissing(const QString& python) {
  if (const QString why = torchMissing(python); !why.isEmpty()) return why;
  if (run(python, {"-c", "import onnx"}).exitCode != 0) return "cannot import onnx (apt-get install python3-onnx)";
  return {};
}

}  // namespace interop
