// Shared by the ONNX suites: torch's export of a drawn network (onnx_peer.py), gpunodes' import of it through
// the real binary, and Forward of an imported graph on a batch, read back from the report.
#pragma once
#include <QDir>
#include <QJsonArray>
#include <QJsonObject>
#include <QString>
#include <random>
#include <vector>

#include "interop_util.h"

namespace onnxtest {

using interop::node;
using interop::Process;
using interop::readJson;
using interop::run;
using interop::wire;
using interop::writeJson;

// The id of the first node of `type` in a graph file's JSON.
inline QString idOf(const QJsonObject& graph, const QString& type) {
  for (const QJsonValue& v : graph["nodes"].toArray())
    if (v.toObject()["type"].toString() == type) return v.toObject()["id"].toString();
  return {};
}

// `graph` (an imported one: its LoadParams holds the model) plus a batch `x` of shape `shape` as a Tensor on
// its Device, Forward and an Inspect "logits_out" of the result.
inline QJsonObject withForward(QJsonObject graph, const QJsonArray& shape, const std::vector<float>& x,
                               const QString& modelFrom) {
  QJsonArray nodes = graph["nodes"].toArray(), wires = graph["connections"].toArray();
  QStringList text;
  for (float v : x) text.append(QString::number(v, 'g', 9));
  nodes.append(node("images_in", "Tensor", {{"shape", shape}, {"init", "values"}, {"values", text.join(' ')}}));
  nodes.append(node("fwd_out", "Forward"));
  nodes.append(node("logits_out", "Inspect"));
  wires.append(wire(idOf(graph, "Device") + ".device", "images_in.device"));
  wires.append(wire("images_in.out", "fwd_out.in"));
  wires.append(wire(modelFrom, "fwd_out.model"));
  wires.append(wire("fwd_out.out", "logits_out.in"));
  graph["nodes"] = nodes;
  graph["connections"] = wires;
  return graph;
}

// Runs `file` through `gpunodes run` and returns what Inspect "logits_out" read (empty on failure, with the
// reason in *why).
inline std::vector<float> forwardLogits(const QString& gpunodes, const QString& file, QString* why) {
  const QString report = file + ".report.json";
  const Process p = run(gpunodes, {"run", file, "--quiet", "--report", report});
  if (p.exitCode != 0) {
    *why = QString("gpunodes run %1: exit %2\n%3").arg(file).arg(p.exitCode).arg(p.err);
    return {};
  }
  std::vector<float> out;
  const QJsonArray inspect = readJson(report)["nodes"].toObject()["logits_out"].toObject()["inspect"].toArray();
  for (const QJsonValue& v : inspect.at(0).toObject()["values"].toArray()) out.push_back(float(v.toDouble()));
  if (out.empty()) *why = "the report has no logits";
  return out;
}

inline std::vector<float> uniformBatch(int64_t numel, unsigned seed) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> x(static_cast<size_t>(numel));
  for (float& v : x) v = dist(gen);
  return x;
}

}  // namespace onnxtest
