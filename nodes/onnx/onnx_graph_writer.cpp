#include "onnx_graph_writer.h"

#include <QFileInfo>
#include <QJsonArray>
#include <QJsonDocument>
#include <QSaveFile>
#include <QSet>

#include "gpunodes/core/layered_layout.h"

namespace gn::nodes::onnx {

namespace {

QString freeId(const QSet<QString>& taken, const QString& base) {
  QString id = base;
  for (int k = 2; taken.contains(id); ++k) id = base + QString::number(k);
  return id;
}

core::GraphConnection wire(core::Endpoint from, core::Endpoint to) {
  core::GraphConnection c;
  c.from = std::move(from);
  c.to = std::move(to);
  return c;
}

}  // namespace

void buildGraph(const ImportedNetwork& net, const QString& weightsPath, core::GraphDocument& doc) {
  QList<core::GraphNode> nodes;
  QList<core::GraphConnection> wires;
  QSet<QString> taken;
  for (const ImportedLayer& l : net.layers) {
    nodes.append({.id = l.id, .type = nn::layer_kind_name(l.kind), .params = l.params});
    taken.insert(l.id);
    const std::vector<std::string> ports = nn::layer_ports(l.kind);
    for (int k = 0; k < l.inputs.size(); ++k)
      if (!l.inputs[k].isEmpty())  // an open port before a wired one stays open
        wires.append(wire({l.inputs[k], "out"}, {l.id, QString::fromStdString(ports[size_t(k)])}));
  }
  const QString netId = freeId(taken, "net");
  taken.insert(netId);
  const QString cpuId = freeId(taken, "cpu");
  taken.insert(cpuId);
  const QString loadId = freeId(taken, "weights");
  nodes.append({.id = netId, .type = "Network", .params = {{"init", "normal"}, {"init_std", 0.01}, {"seed", 0}}});
  nodes.append({.id = cpuId, .type = "Device", .params = {{"kind", "cpu"}, {"index", 0}}});
  nodes.append({.id = loadId, .type = "LoadParams",
                .params = {{"path", QFileInfo(weightsPath).absoluteFilePath()}}});
  wires.append(wire({net.layers.back().id, "out"}, {netId, "out"}));
  wires.append(wire({netId, "model"}, {loadId, "like"}));
  wires.append(wire({cpuId, "device"}, {loadId, "device"}));
  doc.setContents(nodes, wires);
  core::applyLayeredLayout(doc);
  doc.setName(net.name);
  doc.setDescription(net.description);
  doc.setSettings({{"schedule", "parallel"}, {"cpu_devices", 1}});
}

void writeWeights(const ImportedNetwork& net, const QString& path, const QString& source) {
  // The header first (names, shapes, offsets in the order written), then each tensor's bytes.
  QJsonObject header{{"__metadata__", QJsonObject{{"format", "pt"}, {"gpunodes.source", source}}}};
  qint64 offset = 0;
  for (const ImportedLayer& l : net.layers)
    for (const auto& [suffix, t] : l.weights) {
      QJsonArray shape;
      for (int64_t d : t.dims) shape.append(qint64(d));
      const qint64 bytes = qint64(t.f.size() * sizeof(float));
      header[l.id + "." + QString::fromStdString(suffix)] =
          QJsonObject{{"dtype", "F32"}, {"shape", shape}, {"data_offsets", QJsonArray{offset, offset + bytes}}};
      offset += bytes;
    }
  QByteArray text = QJsonDocument(header).toJson(QJsonDocument::Compact);
  while (text.size() % 8) text.append(' ');
  QSaveFile f(path);
  if (!f.open(QIODevice::WriteOnly)) throw OnnxError(path.toStdString() + ": cannot write: " + f.errorString().toStdString());
  const quint64 n = quint64(text.size());
  char len[8];
  for (int k = 0; k < 8; ++k) len[k] = char((n >> (8 * k)) & 0xff);  // little-endian
  f.write(len, 8);
  f.write(text);
  // QJsonObject orders the header by name; the data follows the offsets given above, in layer order.
  for (const ImportedLayer& l : net.layers)
    for (const auto& [suffix, t] : l.weights) {
      static_assert(sizeof(float) == 4);
      f.write(reinterpret_cast<const char*>(t.f.data()), qint64(t.f.size() * sizeof(float)));
    }
  if (!f.commit()) throw OnnxError(path.toStdString() + ": cannot write: " + f.errorString().toStdString());
}

}  // namespace gn::nodes::onnx
