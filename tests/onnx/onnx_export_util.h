// Shared by the ONNX export suites (test_onnx_export: onnxruntime and the checker; test_onnx_roundtrip: back
// through import): the networks they send, gpunodes' side of a check (weights drawn and moved, Forward's
// logits, the export written) and the safetensors files they compare.
#pragma once
#include <QDir>
#include <QFileInfo>
#include <QJsonArray>
#include <QJsonObject>
#include <QRegularExpression>
#include <QSet>
#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "interop_util.h"

namespace onnx_export {

constexpr int kBatch = 3;

using interop::graphOf;
using interop::node;
using interop::Process;
using interop::readJson;
using interop::run;
using interop::wire;
using interop::writeJson;

inline QJsonObject mlpGraph() {
  return graphOf({node("x", "Input", {{"shape", QJsonArray{1, 28, 28}}}), node("flat", "Flatten"),
                  node("fc1", "Linear", {{"out_features", 256}}), node("relu", "ReLU"),
                  node("fc2", "Linear", {{"out_features", 10}}), node("net", "Network")},
                 {wire("x.out", "flat.in"), wire("flat.out", "fc1.in"), wire("fc1.out", "relu.in"),
                  wire("relu.out", "fc2.in"), wire("fc2.out", "net.out")});
}

// A Linear on every step of a sequence (MatMul by the transposed weight), a LayerNorm without affine params
// (Constant ones and zeros), a Transpose counted from the end (import writes its axes from the start), a
// causal Softmax (a mask added before it).
inline QJsonObject sequenceGraph() {
  return graphOf(
      {node("x", "Input", {{"shape", QJsonArray{6, 6}}}), node("proj", "Linear", {{"out_features", 6}}),
       node("ln", "LayerNorm", {{"elementwise_affine", false}}),
       node("t", "Transpose", {{"dim0", -1}, {"dim1", -2}}), node("causal", "Softmax", {{"causal", true}}),
       node("tanh", "Tanh"), node("sum", "Add"),
       node("mix", "Linear", {{"out_features", 4}, {"bias", false}}),
       node("flat", "Reshape", {{"shape", QJsonArray{-1}}}), node("fc", "Linear", {{"out_features", 3}}),
       node("net", "Network", {{"init", "kaiming"}, {"seed", 9}})},
      {wire("x.out", "proj.in"), wire("proj.out", "ln.in"), wire("ln.out", "t.in"),
       wire("t.out", "causal.in"), wire("causal.out", "tanh.in"), wire("tanh.out", "sum.a"),
       wire("x.out", "sum.b"), wire("sum.out", "mix.in"), wire("mix.out", "flat.in"),
       wire("flat.out", "fc.in"), wire("fc.out", "net.out")});
}

// The recurrent layers as ONNX's RNN, GRU and LSTM (gates reordered): token ids through an Embedding into a
// stacked bidirectional LSTM, a bidirectional ReLU RNN, a two-layer GRU without biases, the last step, and
// beside it a OneHot of the same ids into a tanh RNN whose first step is added.
inline QJsonObject recurrentGraph() {
  return graphOf(
      {node("x", "Input", {{"shape", QJsonArray{7}}}),
       node("emb", "Embedding", {{"num_embeddings", 11}, {"embedding_dim", 5}}),
       node("lstm", "LSTM",
            {{"hidden_size", 4}, {"num_layers", 2}, {"bidirectional", true}, {"dropout", 0.2}}),
       node("rnn", "RNN", {{"hidden_size", 3}, {"bidirectional", true}, {"nonlinearity", "relu"}}),
       node("gru", "GRU", {{"hidden_size", 6}, {"num_layers", 2}, {"bias", false}}), node("last", "LastStep"),
       node("oh", "OneHot", {{"num_classes", 11}}), node("rnn2", "RNN", {{"hidden_size", 6}}),
       node("first", "FirstStep"), node("sum", "Add"), node("fc", "Linear", {{"out_features", 4}}),
       node("net", "Network", {{"init", "kaiming"}, {"seed", 4}})},
      {wire("x.out", "emb.in"), wire("emb.out", "lstm.in"), wire("lstm.out", "rnn.in"),
       wire("rnn.out", "gru.in"), wire("gru.out", "last.in"), wire("x.out", "oh.in"),
       wire("oh.out", "rnn2.in"), wire("rnn2.out", "first.in"), wire("last.out", "sum.a"),
       wire("first.out", "sum.b"), wire("sum.out", "fc.in"), wire("fc.out", "net.out")});
}

// The attention layers decomposed: a causal MultiheadAttention with its own k and v, a bias-free one on
// itself, BatchMatMul (plain and with transpose_b), Softmax, Mul, Scale, PositionalEncoding,
// PositionEmbedding, a ClassToken, and its first and last steps.
inline QJsonObject attentionGraph() {
  return graphOf({node("x", "Input", {{"shape", QJsonArray{6, 8}}}), node("pe", "PositionalEncoding"),
                  node("kproj", "Linear", {{"out_features", 8}}), node("vact", "Tanh"),
                  node("mha", "MultiheadAttention", {{"num_heads", 2}, {"causal", true}}),
                  node("self", "MultiheadAttention", {{"num_heads", 4}, {"bias", false}}),
                  node("scores", "BatchMatMul", {{"transpose_b", true}}), node("sm", "Softmax"),
                  node("mix", "BatchMatMul"), node("gate", "Mul"), node("half", "Scale", {{"scale", 0.5}}),
                  node("pos", "PositionEmbedding"), node("cls", "ClassToken"), node("first", "FirstStep"),
                  node("steps", "LastStep"), node("both", "Add"), node("fc", "Linear", {{"out_features", 3}}),
                  node("net", "Network", {{"init", "xavier"}, {"seed", 8}})},
                 {wire("x.out", "pe.in"),      wire("pe.out", "kproj.in"),   wire("pe.out", "vact.in"),
                  wire("pe.out", "mha.q"),     wire("kproj.out", "mha.k"),   wire("vact.out", "mha.v"),
                  wire("mha.out", "self.q"),   wire("self.out", "scores.a"), wire("pe.out", "scores.b"),
                  wire("scores.out", "sm.in"), wire("sm.out", "mix.a"),      wire("pe.out", "mix.b"),
                  wire("mix.out", "gate.a"),   wire("mha.out", "gate.b"),    wire("gate.out", "half.in"),
                  wire("half.out", "pos.in"),  wire("pos.out", "cls.in"),    wire("cls.out", "first.in"),
                  wire("cls.out", "steps.in"), wire("first.out", "both.a"),  wire("steps.out", "both.b"),
                  wire("both.out", "fc.in"),   wire("fc.out", "net.out")});
}

// Valid lengths: token ids (pad_id 1) through an Embedding into a causal self-attention whose k and v stay open
// before valid_lens, then a cross-attention over 4 keys (the steps' features mixed into 4 by a Linear), both
// masked by one ValidLength of the ids; the last step into a Linear.
inline QJsonObject validLengthGraph() {
  return graphOf(
      {node("x", "Input", {{"shape", QJsonArray{6}}}),
       node("emb", "Embedding", {{"num_embeddings", 9}, {"embedding_dim", 8}}), node("vl", "ValidLength"),
       node("self", "MultiheadAttention", {{"num_heads", 2}, {"causal", true}}),
       node("steps", "Transpose", {{"dim0", 0}, {"dim1", 1}}), node("short", "Linear", {{"out_features", 4}}),
       node("keys", "Transpose", {{"dim0", 0}, {"dim1", 1}}),
       node("cross", "MultiheadAttention", {{"num_heads", 4}}), node("last", "LastStep"),
       node("fc", "Linear", {{"out_features", 3}}), node("net", "Network", {{"seed", 1}})},
      {wire("x.out", "emb.in"), wire("x.out", "vl.in"), wire("emb.out", "self.q"),
       wire("vl.out", "self.valid_lens"), wire("emb.out", "steps.in"), wire("steps.out", "short.in"),
       wire("short.out", "keys.in"), wire("self.out", "cross.q"), wire("keys.out", "cross.k"),
       wire("vl.out", "cross.valid_lens"), wire("cross.out", "last.in"), wire("last.out", "fc.in"),
       wire("fc.out", "net.out")});
}

// `graph` with node `id`'s param `param` taken out (the node then has its default).
inline QJsonObject withoutParam(QJsonObject graph, const QString& id, const QString& param) {
  QJsonArray nodes = graph["nodes"].toArray();
  for (qsizetype i = 0; i < nodes.size(); ++i)
    if (QJsonObject n = nodes[i].toObject(); n["id"].toString() == id) {
      QJsonObject params = n["params"].toObject();
      params.remove(param);
      n["params"] = params;
      nodes[i] = n;
    }
  graph["nodes"] = nodes;
  return graph;
}

// The nodes of `graph` the Network "net" needs (its layers, found upstream of it) and the Network.
inline void networkOf(const QJsonObject& graph, QJsonArray& nodes, QJsonArray& wires) {
  QHash<QString, QStringList> from;  // node -> the nodes wired into it
  for (const QJsonValue& v : graph["connections"].toArray())
    from[v["to"].toString().section('.', 0, 0)].append(v["from"].toString().section('.', 0, 0));
  QSet<QString> keep{"net"};
  QStringList unvisited{"net"};
  while (!unvisited.isEmpty()) {
    const QString n = unvisited.takeLast();
    for (const QString& u : from.value(n))
      if (!keep.contains(u)) keep.insert(u), unvisited.append(u);
  }
  for (const QJsonValue& v : graph["nodes"].toArray())
    if (keep.contains(v["id"].toString()) && v["type"].toString() != "Device") nodes.append(v);
  for (const QJsonValue& v : graph["connections"].toArray())
    if (keep.contains(v["from"].toString().section('.', 0, 0)) &&
        keep.contains(v["to"].toString().section('.', 0, 0)) && !v["from"].toString().endsWith(".device"))
      wires.append(v);
}

inline QJsonArray shapeOf(const QJsonArray& sample, int batch) {
  QJsonArray shape{batch};
  for (const QJsonValue& d : sample) shape.append(d);
  return shape;
}

inline QString valuesText(const std::vector<float>& x) {
  QStringList text;
  for (float v : x) text.append(QString::number(v, 'g', 9));
  return text.join(' ');
}

// The network's layers, a Device "cpu", the batch x as a Tensor, the model (saved by SaveParams to `saveTo`,
// or loaded by LoadParams from `loadFrom`), Forward and an Inspect "logits".
inline QJsonObject forwardGraph(const QJsonObject& graph, const QJsonArray& sample, const std::vector<float>& x,
                         const QString& saveTo, const QString& loadFrom) {
  QJsonArray nodes, wires;
  networkOf(graph, nodes, wires);
  nodes.append(node("cpu", "Device", {{"kind", "cpu"}}));
  nodes.append(node("images", "Tensor",
                    {{"shape", shapeOf(sample, kBatch)}, {"init", "values"}, {"values", valuesText(x)}}));
  nodes.append(node("fwd", "Forward"));
  nodes.append(node("logits", "Inspect"));
  wires.append(wire("cpu.device", "images.device"));
  wires.append(wire("images.out", "fwd.in"));
  wires.append(wire("fwd.out", "logits.in"));
  interop::wireWeights(nodes, wires, saveTo, loadFrom);
  QJsonObject g = graphOf(nodes, wires);
  if (graph.contains("version")) g["version"] = graph["version"];  // subgraphs need version 2
  g["name"] = graph["name"];
  g["description"] = graph["description"];
  return g;
}

inline std::vector<float> logitsOf(const QJsonObject& report) { return interop::inspected(report, "logits"); }

// --- safetensors ----------------------------------------------------------------------------------------

struct Safetensors {
  QJsonObject header;
  QByteArray bytes;  // the whole file
  qint64 dataStart = 0;
  bool ok = false;
  // The tensors, without torch's num_batches_tracked (a training counter that gpunodes writes for
  // load_state_dict and that no evaluation reads; neither export nor import carries it).
  QStringList names() const {
    QStringList n;
    for (auto it = header.begin(); it != header.end(); ++it)
      if (it.key() != "__metadata__" && !it.key().endsWith(".num_batches_tracked")) n.append(it.key());
    n.sort();
    return n;
  }
  // The tensor's bytes.
  QByteArray data(const QString& name) const {
    const QJsonArray o = header[name].toObject()["data_offsets"].toArray();
    return bytes.mid(dataStart + o[0].toInteger(), o[1].toInteger() - o[0].toInteger());
  }
  float* values(const QString& name, qint64* n) {
    const QJsonArray o = header[name].toObject()["data_offsets"].toArray();
    *n = (o[1].toInteger() - o[0].toInteger()) / 4;
    return reinterpret_cast<float*>(bytes.data() + dataStart + o[0].toInteger());
  }
};

inline Safetensors readSafetensors(const QString& path) {
  Safetensors s;
  QFile f(path);
  if (!f.open(QIODevice::ReadOnly)) return s;
  s.bytes = f.readAll();
  if (s.bytes.size() < 8) return s;
  quint64 n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | quint8(s.bytes[i]);
  s.header = QJsonDocument::fromJson(s.bytes.mid(8, qsizetype(n))).object();
  s.dataStart = 8 + qint64(n);
  s.ok = !s.header.isEmpty();
  return s;
}

// Moves each BatchNorm's running statistics, scale and shift off their defaults (mean 0, var 1, weight 1,
// bias 0), and every tensor that starts at zero (biases, a class token), in place: a file gpunodes wrote,
// rewritten with the same header.
inline bool perturbBatchNorms(const QString& path, int* moved) {
  Safetensors s = readSafetensors(path);
  if (!s.ok) return false;
  std::mt19937 gen(23);
  std::uniform_real_distribution<float> u(-0.5f, 0.5f), pos(0.5f, 2.0f);
  *moved = 0;
  for (const QString& name : s.names()) {
    if (!name.endsWith(".running_mean")) continue;
    const QString owner = name.chopped(int(strlen(".running_mean")));
    qint64 n = 0;
    for (const char* leaf : {".running_mean", ".running_var", ".weight", ".bias"}) {
      float* v = s.values(owner + leaf, &n);
      for (qint64 k = 0; k < n; ++k)
        v[k] = QString(leaf) == ".running_var" || QString(leaf) == ".weight" ? pos(gen) : u(gen);
    }
    ++*moved;
  }
  for (const QString& name : s.names()) {
    qint64 n = 0;
    float* v = s.values(name, &n);
    if (std::all_of(v, v + n, [](float f) { return f == 0.0f; }))
      for (qint64 k = 0; k < n; ++k) v[k] = u(gen);
  }
  QFile f(path);
  return f.open(QIODevice::WriteOnly | QIODevice::Truncate) && f.write(s.bytes) == s.bytes.size();
}

// A model signature with each pool's stride written as the stride it is (stride 0 means kernel_size, and
// import writes the number), each LayerNorm's normalized_shape as 0 (0 means the last axis, whose size import
// writes; any other value must be that size) and each id as import makes it (a block's "block1/attn" is
// "block1_attn": an id holds no '/').
inline QString asImportWritesIt(QString signature) {
  static const QRegularExpression pool("(Pool2d\\(kernel_size=(\\d+),stride=)0"), norm("normalized_shape=\\d+");
  return signature.replace(pool, "\\1\\2").replace(norm, "normalized_shape=0").replace('/', '_');
}


// `gpunodes run` of `graph` written to `file`; the report, or an empty object with a warning.
inline QJsonObject runGraphFile(const QString& file, const QJsonObject& graph) {
  const QString report = file + ".report.json";
  if (!writeJson(file, graph)) return {};
  const Process p = run(GN_GPUNODES, {"run", file, "--quiet", "--report", report});
  if (p.exitCode != 0) {
    qWarning("gpunodes run %s: exit %d\n%s", qPrintable(file), p.exitCode, qPrintable(p.err));
    return {};
  }
  return readJson(report);
}

// gpunodes' side of a check, in `folder`: the batch x (token ids in [0, vocab) with the last id first, or
// U(-1, 1) for vocab 0), the weights its init and seed draw, every BatchNorm's statistics and every zero
// tensor moved off its start, Forward's logits and the model signature with them, and `gpunodes export-onnx
// --params` of the graph (named "export-<name>", with a description) into <name>.onnx.
struct Exported {
  QJsonObject graph;  // as exported, with its name and description
  std::vector<float> x, logits;
  QString xFile, weights, model, signature, error;  // error: empty when every step worked
  int moved = 0;     // the BatchNorms moved
};
inline Exported drawAndExport(const QString& folder, const QString& name, QJsonObject graph,
                              const QJsonArray& sample, int vocab) {
  Exported e;
  auto failed = [&e](const QString& why) {
    e.error = why;
    return e;
  };
  graph["name"] = "export-" + name;
  graph["description"] = "The " + name + " network, exported by test_onnx_export.";
  e.graph = graph;
  if (!QDir().mkpath(folder)) return failed("cannot make " + folder);
  std::mt19937 gen(11);
  std::uniform_real_distribution<float> dist(-1, 1);
  int64_t numel = kBatch;
  for (const QJsonValue& d : sample) numel *= d.toInteger();
  e.x.resize(static_cast<size_t>(numel));
  std::uniform_int_distribution<int> ids(0, std::max(vocab, 1) - 1);
  for (float& v : e.x) v = vocab > 0 ? float(ids(gen)) : dist(gen);
  if (vocab > 0) e.x[0] = float(vocab - 1);
  e.xFile = folder + "/x.f32";
  e.weights = folder + "/weights.safetensors";
  interop::write_floats(e.xFile, e.x);
  if (runGraphFile(folder + "/save.json", forwardGraph(graph, sample, e.x, e.weights, {})).isEmpty())
    return failed("gpunodes could not save the weights");
  if (!perturbBatchNorms(e.weights, &e.moved)) return failed("cannot rewrite " + e.weights);
  const QJsonObject report = runGraphFile(folder + "/forward.json", forwardGraph(graph, sample, e.x, {}, e.weights));
  e.logits = logitsOf(report);
  if (e.logits.empty()) return failed("gpunodes gave no logits");
  e.signature = report["nodes"].toObject()["load"].toObject()["signature"].toString();
  if (!e.signature.startsWith("network ")) return failed("no signature in the report: " + e.signature);
  const QString graphFile = folder + "/graph.json";
  e.model = folder + "/" + name + ".onnx";
  if (!writeJson(graphFile, graph)) return failed("cannot write " + graphFile);
  const Process p =
      run(GN_GPUNODES, {"export-onnx", graphFile, "--network", "net", "--params", e.weights, "-o", e.model});
  if (p.exitCode != 0) return failed(QStringLiteral("export-onnx: exit %1\n%2").arg(p.exitCode).arg(p.err));
  if (!p.out.contains("wrote " + QFileInfo(e.model).absoluteFilePath())) return failed("export-onnx said " + p.out);
  return e;
}

}  // namespace onnx_export
