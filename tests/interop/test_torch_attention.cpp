// The attention layers of d2l chapter 11 against PyTorch, forward and every gradient, on the same safetensors
// weights:
// - Cases: LayerNorm with and without affine; MultiheadAttention as self-attention (with bias, and causal
//   without bias), as cross-attention with k and v from other layers (fewer keys than queries) and with k
//   only (v = k; causal with more keys than queries, so the mask aligns the keys to the end); d2l 11.6's
//   PositionalEncoding over 40 steps; a learned PositionEmbedding (also on a shorter sequence, which adds its
//   first rows); ClassToken read back by FirstStep after an attention, with a LayerNorm on the flat features;
//   d2l 11.3's attention drawn by hand (BatchMatMul with transpose_b, Scale, causal Softmax, BatchMatMul);
//   Mul; MultiheadAttention with valid lengths from a ValidLength layer on padded token ids (self-attention
//   with k and v open, causal, and cross-attention with k only; lengths of 0 among them); dropout in the attention and the encoding (compared in evaluation only, where it is the identity);
//   d2l 11.8's pre-norm ViT block drawn from layers (x + MHA(LN(x)), then x + MLP(LN(x)), Linear-GELU-Linear)
//   against torch's nn.TransformerEncoderLayer(norm_first=True, activation="gelu", dropout=0, batch_first),
//   and d2l 11.7's post-norm block (LN(x + MHA(x)), LN(y + FFN(y)), ReLU) against norm_first=False; and a
//   whole small ViT (Input [1, 28, 28], Conv2d k=4 s=4, Reshape [E, 49], Transpose, ClassToken,
//   PositionEmbedding, two pre-norm blocks, LayerNorm, FirstStep, Linear(10)).
// - Every case is drawn as a graph file and compared three ways. (1) gpunodes -> torch: the real binary
//   builds the Network, saves it as safetensors (SaveParams) and runs Forward on a batch; torch
//   (tests/interop/torch_peer.py) builds the same network from the graph file, loads the file with
//   load_state_dict(strict=True) (gpunodes writes torch's state_dict order) and must give the same outputs.
//   (2) torch -> gpunodes: torch's own seeded weights (LayerNorm weights and biases, attention biases and
//   class tokens drawn too, so that none is a plain 1 or 0), loaded by LoadParams, give torch's outputs. (3)
//   Every gradient: the network of the saved signature built in this process on the runtime (the code behind
//   the binary's Train node), torch's weights loaded, a Train-mode forward and a backward from a random
//   output gradient; torch runs the same in float64 and every parameter's gradient must match. The sequence
//   cases start from token ids that are a permutation of 0..N*T-1 into an Embedding of N*T rows: each row is
//   one sample's step, so the Embedding's weight is the tested layers' input and its gradient their input
//   gradient, exactly. The blocks and the ViT are compared with the drawn network in torch and also with
//   torch's own modules (nn.TransformerEncoderLayer; d2l's ViT written with them, cls_token [1, 1, E] and
//   pos_embedding [1, T, E]), loaded from the same file through a map of names written below, again with
//   strict=True.
// - Tolerances: outputs and gradients within 1e-5 of the tensor's largest magnitude, each gradient tensor on
//   its own scale, except a tensor whose values all lie below 1e-2 of the case's largest gradient (the key
//   projection's bias, whose gradient is zero in exact arithmetic: a softmax does not see a constant added
//   to a query's scores), which is measured against 1e-2 of that largest gradient instead. torch runs the
//   forward checks in float32 (its users' logits) and the gradient checks in float64, so that those measure
//   gpunodes' error alone; the whole ViT's logits within 1e-4 as issue 22 asks. The largest errors measured
//   are printed (when this suite was written: outputs 2.6e-7, gradients 7.1e-7, the ViT's logits 1.7e-7).
// - Not checked: dropout in training (its masks come from another generator than torch's), and a Train
//   node's step on these layers through the binary (test_torch_sequences checks the Train node's steps).
// The suite skips where /usr/bin/python3 cannot import torch (the scripts install it).
#include <QFileInfo>
#include <QRegularExpression>
#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <numeric>
#include <random>

#include "gpunodes/nn/model.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/nn/safetensors.h"
#include "gpunodes/ops.h"
#include "interop_util.h"
#include "runtime/nn_test_util.h"

using namespace gn;
using interop::graphOf;
using interop::node;
using interop::Process;
using interop::readJson;
using interop::wire;
using interop::writeJson;

namespace {

constexpr int64_t kBatch = 3;
constexpr double kTol = 1e-5;           // outputs and gradients, relative to the tensor's largest magnitude
constexpr double kVitLogitsTol = 1e-4;  // the whole ViT's float32 logits (issue 22)
constexpr double kZeroFloor = 1e-9;     // the absolute floor: a tensor of zeros must be zeros
// A gradient tensor whose values are all below this fraction of the case's largest gradient is compared on
// that scale instead of its own (see the gradients' check).
constexpr double kGradFloor = 1e-2;

// A torch module to compare with: the drawn network itself (kind empty: torch_peer.py's GraphNet, which has
// gpunodes' names), or torch's own (encoder_layer, vit) with a map from its names to gpunodes'.
struct Reference {
  QString kind;
  QJsonObject options;
  QJsonObject names;
};

struct Case {
  QJsonObject graph;
  QJsonArray sample;  // the Input's shape per sample
  int64_t vocab = 0;  // > 0: token ids, a permutation of 0..vocab-1 = one Embedding row per sample and step
  std::vector<Reference> refs{Reference{}};
  bool grads = true;         // false: dropout in training; compared in evaluation only
  double forwardTol = kTol;  // the float32 forward checks
  int64_t shorter = 0;       // > 0: also this many steps (a shorter sequence) through the runtime
  std::vector<float> ids;    // non-empty: these token ids instead of the permutation (padded samples)
};

// --- graphs ------------------------------------------------------------------------------------------------

// Token ids [t] into an Embedding of kBatch * t rows of width e, the given layers, and the Network.
QJsonObject sequenceGraph(int64_t t, int64_t e, QJsonArray nodes, QJsonArray wires, const QString& out) {
  nodes.prepend(
      node("emb", "Embedding", {{"num_embeddings", double(kBatch * t)}, {"embedding_dim", double(e)}}));
  nodes.prepend(node("x", "Input", {{"shape", QJsonArray{double(t)}}}));
  nodes.append(node("net", "Network", {{"init", "xavier"}, {"seed", 11}}));
  wires.prepend(wire("x.out", "emb.in"));
  wires.append(wire(out, "net.out"));
  return graphOf(nodes, wires);
}

Case sequenceCase(int64_t t, int64_t e, QJsonArray nodes, QJsonArray wires, const QString& out) {
  Case c;
  c.graph = sequenceGraph(t, e, std::move(nodes), std::move(wires), out);
  c.sample = QJsonArray{double(t)};
  c.vocab = kBatch * t;
  return c;
}

// A transformer encoder block drawn from layers, reading `src`: pre-norm (d2l 11.8's ViTBlock: x +
// MHA(LN(x)), then x + MLP(LN(x))) or post-norm (d2l 11.7's TransformerEncoderBlock: y = LN(x + MHA(x)), then
// LN(y + FFN(y))). Returns its output; `names` gets nn.TransformerEncoderLayer's names (under `under`) mapped
// to the drawn layers'.
QString addBlock(QJsonArray& nodes, QJsonArray& wires, QJsonObject& names, const QString& p,
                 const QString& src, bool preNorm, int heads, int e, int ff, const QString& activation,
                 const QString& under) {
  nodes.append(node(p + "ln1", "LayerNorm"));
  nodes.append(node(p + "mha", "MultiheadAttention", {{"num_heads", heads}}));
  nodes.append(node(p + "add1", "Add"));
  nodes.append(node(p + "ln2", "LayerNorm"));
  nodes.append(node(p + "fc1", "Linear", {{"out_features", ff}}));
  nodes.append(node(p + "act", activation));
  nodes.append(node(p + "fc2", "Linear", {{"out_features", e}}));
  nodes.append(node(p + "add2", "Add"));
  QString out;
  if (preNorm) {
    for (const auto& [a, b] : std::vector<std::pair<QString, QString>>{{src, "ln1.in"},
                                                                       {p + "ln1.out", "mha.q"},
                                                                       {src, "add1.a"},
                                                                       {p + "mha.out", "add1.b"},
                                                                       {p + "add1.out", "ln2.in"},
                                                                       {p + "ln2.out", "fc1.in"},
                                                                       {p + "fc1.out", "act.in"},
                                                                       {p + "act.out", "fc2.in"},
                                                                       {p + "add1.out", "add2.a"},
                                                                       {p + "fc2.out", "add2.b"}})
      wires.append(wire(a, p + b));
    out = p + "add2.out";
  } else {
    for (const auto& [a, b] : std::vector<std::pair<QString, QString>>{{src, "mha.q"},
                                                                       {src, "add1.a"},
                                                                       {p + "mha.out", "add1.b"},
                                                                       {p + "add1.out", "ln1.in"},
                                                                       {p + "ln1.out", "fc1.in"},
                                                                       {p + "fc1.out", "act.in"},
                                                                       {p + "act.out", "fc2.in"},
                                                                       {p + "ln1.out", "add2.a"},
                                                                       {p + "fc2.out", "add2.b"},
                                                                       {p + "add2.out", "ln2.in"}})
      wires.append(wire(a, p + b));
    out = p + "ln2.out";
  }
  // torch's TransformerEncoderLayer: norm1 before the attention (pre-norm) or after its residual (post-norm),
  // norm2 likewise around the feed-forward linear1 -> activation -> linear2. The drawn layers are named so.
  const std::vector<std::pair<QString, QString>> map{{"self_attn.in_proj_weight", "mha.in_proj_weight"},
                                                     {"self_attn.in_proj_bias", "mha.in_proj_bias"},
                                                     {"self_attn.out_proj.weight", "mha.out_proj.weight"},
                                                     {"self_attn.out_proj.bias", "mha.out_proj.bias"},
                                                     {"linear1.weight", "fc1.weight"},
                                                     {"linear1.bias", "fc1.bias"},
                                                     {"linear2.weight", "fc2.weight"},
                                                     {"linear2.bias", "fc2.bias"},
                                                     {"norm1.weight", "ln1.weight"},
                                                     {"norm1.bias", "ln1.bias"},
                                                     {"norm2.weight", "ln2.weight"},
                                                     {"norm2.bias", "ln2.bias"}};
  for (const auto& [torchName, drawn] : map) names[under + torchName] = p + drawn;
  return out;
}

Case blockCase(bool preNorm) {
  constexpr int kT = 7, kE = 12, kHeads = 3, kFf = 20;
  QJsonArray nodes, wires;
  QJsonObject names{{"embedding.weight", "emb.weight"}};
  const QString out = addBlock(nodes, wires, names, "b", "emb.out", preNorm, kHeads, kE, kFf,
                               preNorm ? "GELU" : "ReLU", "layer.");
  Case c = sequenceCase(kT, kE, nodes, wires, out);
  c.refs.push_back({"encoder_layer",
                    {{"vocab", double(c.vocab)},
                     {"steps", kT},
                     {"d_model", kE},
                     {"nhead", kHeads},
                     {"dim_feedforward", kFf},
                     {"norm_first", preNorm},
                     {"activation", preNorm ? "gelu" : "relu"}},
                    names});
  return c;
}

// d2l 11.8's ViT on Fashion-MNIST's [1, 28, 28], patch 4 (49 patches and the class token: 50 steps).
Case vitCase() {
  constexpr int kE = 16, kHeads = 4, kFf = 32, kBlocks = 2, kClasses = 10;
  QJsonArray nodes{node("x", "Input", {{"shape", QJsonArray{1, 28, 28}}}),
                   node("patch", "Conv2d", {{"out_channels", kE}, {"kernel_size", 4}, {"stride", 4}}),
                   node("flat", "Reshape", {{"shape", QJsonArray{kE, 49}}}),
                   node("steps", "Transpose", {{"dim0", 0}, {"dim1", 1}}),
                   node("cls", "ClassToken"),
                   node("pos", "PositionEmbedding")};
  QJsonArray wires{wire("x.out", "patch.in"), wire("patch.out", "flat.in"), wire("flat.out", "steps.in"),
                   wire("steps.out", "cls.in"), wire("cls.out", "pos.in")};
  // d2l's names: patch_embedding, cls_token [1, 1, E], pos_embedding [1, 50, E], blks.i, head (LayerNorm,
  // Linear).
  QJsonObject names{{"patch_embedding.weight", "patch.weight"},
                    {"patch_embedding.bias", "patch.bias"},
                    {"cls_token", "cls.weight"},
                    {"pos_embedding", "pos.weight"},
                    {"head.0.weight", "norm.weight"},
                    {"head.0.bias", "norm.bias"},
                    {"head.1.weight", "head.weight"},
                    {"head.1.bias", "head.bias"}};
  QString src = "pos.out";
  for (int b = 0; b < kBlocks; ++b)
    src = addBlock(nodes, wires, names, QString("blk%1").arg(b), src, true, kHeads, kE, kFf, "GELU",
                   QString("blks.%1.").arg(b));
  nodes.append(node("norm", "LayerNorm"));
  nodes.append(node("first", "FirstStep"));
  nodes.append(node("head", "Linear", {{"out_features", kClasses}}));
  nodes.append(node("net", "Network", {{"init", "kaiming"}, {"seed", 12}}));
  for (const auto& [a, b] : std::vector<std::pair<QString, QString>>{
           {src, "norm.in"}, {"norm.out", "first.in"}, {"first.out", "head.in"}, {"head.out", "net.out"}})
    wires.append(wire(a, b));
  Case c;
  c.graph = graphOf(nodes, wires);
  c.sample = QJsonArray{1, 28, 28};
  c.forwardTol = kVitLogitsTol;
  c.refs.push_back({"vit",
                    {{"channels", 1},
                     {"image_size", 28},
                     {"patch", 4},
                     {"d_model", kE},
                     {"nhead", kHeads},
                     {"dim_feedforward", kFf},
                     {"blocks", kBlocks},
                     {"classes", kClasses}},
                    names});
  return c;
}

// The graph's layers and Network "net", a batch `x` as a Tensor, the model ("net.model", saved to `saveTo`,
// or torch's file through LoadParams), Forward and Inspect.
QJsonObject runGraph(const QJsonObject& graph, const QJsonArray& sample, const std::vector<float>& x,
                     const QString& saveTo, const QString& loadFrom) {
  QJsonArray nodes = graph["nodes"].toArray(), wires = graph["connections"].toArray();
  QStringList text;
  for (float v : x) text.append(QString::number(v, 'g', 9));
  QJsonArray shape{double(kBatch)};
  for (const QJsonValue& d : sample) shape.append(d);
  nodes.append(node("cpu", "Device", {{"kind", "cpu"}}));
  nodes.append(node("batch", "Tensor", {{"shape", shape}, {"init", "values"}, {"values", text.join(' ')}}));
  nodes.append(node("fwd", "Forward"));
  nodes.append(node("y", "Inspect", {{"max_values", 1000}}));
  wires.append(wire("cpu.device", "batch.device"));
  wires.append(wire("batch.out", "fwd.in"));
  wires.append(wire("fwd.out", "y.in"));
  interop::wireWeights(nodes, wires, saveTo, loadFrom);
  return graphOf(nodes, wires);
}

// --- comparisons -------------------------------------------------------------------------------------------

// Empty when got matches want within tol of want's largest magnitude (kZeroFloor when it is all zeros);
// otherwise what differs. `worst` gets the largest difference relative to that magnitude.
QString compare(const QString& what, const std::vector<double>& got, const std::vector<double>& want,
                double tol, double* worst, double floor = 0) {
  if (got.size() != want.size())
    return QString("%1: %2 values, expected %3").arg(what).arg(got.size()).arg(want.size());
  double scale = 0, diff = 0;
  size_t at = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(got[i] - want[i]);
    if (!(d <= diff)) diff = d, at = i;  // NaN counts as the worst
  }
  const double rel = diff / std::max(scale, floor);
  if (worst) *worst = std::max(*worst, std::isnan(rel) ? INFINITY : rel);
  if (diff <= tol * std::max(scale, floor) || diff <= kZeroFloor) return {};
  return QString(
             "%1: value %2 of %3 is %4, torch %5 (largest difference %6, %7 of the largest magnitude %8; "
             "tolerance %9)")
      .arg(what)
      .arg(at)
      .arg(got.size())
      .arg(got[at], 0, 'g', 9)
      .arg(want[at], 0, 'g', 9)
      .arg(diff, 0, 'g', 3)
      .arg(rel, 0, 'g', 3)
      .arg(scale, 0, 'g', 3)
      .arg(tol, 0, 'g', 3);
}

std::vector<double> doubles(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

std::vector<double> readDoubles(const QString& path) {
  std::ifstream in(path.toStdString(), std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<double> v(b.size() / sizeof(double));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(double));
  return v;
}

std::vector<char> readBytes(const QString& path) {
  std::ifstream in(path.toStdString(), std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// What the peer's reference command wrote: the output, then each gradient under gpunodes' name.
struct TorchResult {
  std::vector<double> y;
  std::vector<std::pair<QString, std::vector<double>>> grads;
  QJsonObject line;
};

}  // namespace

Q_DECLARE_METATYPE(Case)

class TorchAttentionTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  Runtime rt_;
  Device device_ = Device::cpu();
  // The largest errors measured, relative to each tensor's largest magnitude, over every case.
  double worstForward_ = 0, worstTrainForward_ = 0, worstGrad_ = 0, worstVit_ = 0;

  QString path(const QString& name) const { return dir_.filePath(name); }

  // gpunodes' Forward of the graph on x: the values Inspect read (all of them: at most 1,000).
  std::vector<float> gpunodesForward(const QString& name, const Case& c, const std::vector<float>& x,
                                     const QString& saveTo, const QString& loadFrom) {
    const QString file = path(name + ".json"), report = path(name + ".report.json");
    if (!writeJson(file, runGraph(c.graph, c.sample, x, saveTo, loadFrom))) return {};
    const Process p = interop::run(GN_GPUNODES, {"run", file, "--quiet", "--report", report});
    if (p.exitCode != 0) {
      qWarning("gpunodes run %s: exit %d\n%s", qPrintable(name), p.exitCode, qPrintable(p.err));
      return {};
    }
    const QJsonObject entry =
        readJson(report)["nodes"].toObject()["y"].toObject()["inspect"].toArray().at(0).toObject();
    std::vector<float> out;
    for (const QJsonValue& v : entry["values"].toArray()) out.push_back(float(v.toDouble()));
    if (double(out.size()) != entry["numel"].toDouble()) {
      qWarning("%s: Inspect read %zu of %g values", qPrintable(name), out.size(), entry["numel"].toDouble());
      return {};
    }
    return out;
  }

  // A reference job for torch_peer.py: the reference module on `weights`, in float64 or float32, training or
  // evaluation mode, backward from dy when given.
  QJsonObject job(const QString& tag, const Reference& r, const QString& weights, const QString& x,
                  const QString& dtype, const QString& mode, const QString& dy,
                  const QJsonArray& sample = {}) const {
    QJsonObject j{
        {"model", path(tag + ".graph.json") + "#net"},
        {"weights", weights},
        {"x", x},
        {"n", double(kBatch)},
        {"dtype", dtype},
        {"mode", mode},
        {"out", path(QString("%1.%2.%3.%4.%5.%6.f64")
                         .arg(tag, r.kind.isEmpty() ? "drawn" : r.kind, QFileInfo(weights).fileName(), dtype,
                              mode, sample.isEmpty() ? "all" : "short"))}};
    if (!dy.isEmpty()) j["dy"] = dy;
    if (!r.kind.isEmpty()) {
      QJsonObject o = r.options;
      o["kind"] = r.kind;
      j["reference"] = o;
      j["names"] = r.names;
    }
    if (!sample.isEmpty()) j["sample"] = sample;
    return j;
  }

  // Reads what one reference job wrote, given the JSON line it printed.
  static bool readResult(const QJsonObject& j, const QJsonObject& line, TorchResult& r) {
    const std::vector<double> all = readDoubles(j["out"].toString());
    size_t n = 1;
    for (const QJsonValue& d : line["out_shape"].toArray()) n *= size_t(d.toInteger());
    if (line["out_shape"].toArray().isEmpty() || all.size() < n) return false;
    r.y.assign(all.begin(), all.begin() + qsizetype(n));
    r.line = line;
    size_t at = n;
    for (const QJsonValue& g : line["grads"].toArray()) {
      size_t k = 1;
      for (const QJsonValue& d : g.toArray()[1].toArray()) k *= size_t(d.toInteger());
      if (at + k > all.size()) return false;
      r.grads.emplace_back(g.toArray()[0].toString(),
                           std::vector<double>(all.begin() + qsizetype(at), all.begin() + qsizetype(at + k)));
      at += k;
    }
    return at == all.size();
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    GN_USE_TEST_DEVICE(rt_, device_);
    if (const QString why = interop::torchMissing(GN_PYTHON); !why.isEmpty()) QSKIP(qPrintable(why));
    const Process self = interop::run(GN_PYTHON, {GN_TORCH_PEER, "selftest"});
    QVERIFY2(self.exitCode == 0, qPrintable("torch_peer.py selftest failed:\n" + self.err));
  }

  void attention_matches_torch_data() {
    QTest::addColumn<Case>("c");
    constexpr int kT = 6, kE = 8;
    QTest::newRow("layernorm") << sequenceCase(kT, kE, {node("ln", "LayerNorm", {{"eps", 1e-5}})},
                                               {wire("emb.out", "ln.in")}, "ln.out");
    QTest::newRow("layernorm without affine, eps 1e-3") << sequenceCase(
        kT, kE,
        {node("ln", "LayerNorm", {{"elementwise_affine", false}, {"eps", 1e-3}, {"normalized_shape", kE}})},
        {wire("emb.out", "ln.in")}, "ln.out");
    QTest::newRow("self-attention") << sequenceCase(kT, kE,
                                                    {node("mha", "MultiheadAttention", {{"num_heads", 2}})},
                                                    {wire("emb.out", "mha.q")}, "mha.out");
    QTest::newRow("self-attention, causal, no bias") << sequenceCase(
        kT, kE, {node("mha", "MultiheadAttention", {{"num_heads", 4}, {"causal", true}, {"bias", false}})},
        {wire("emb.out", "mha.q")}, "mha.out");
    // Keys and values of another length: a Linear across the steps (Transpose, Linear, Transpose).
    auto otherLength = [](int steps) {
      return std::pair{
          QJsonArray{node("t1", "Transpose"), node("len", "Linear", {{"out_features", steps}}),
                     node("t2", "Transpose")},
          QJsonArray{wire("emb.out", "t1.in"), wire("t1.out", "len.in"), wire("len.out", "t2.in")}};
    };
    {
      auto [nodes, wires] = otherLength(4);
      for (const QJsonValue n :
           {node("lq", "Linear", {{"out_features", kE}}), node("lk", "Linear", {{"out_features", kE}}),
            node("lv", "Tanh"), node("mha", "MultiheadAttention", {{"num_heads", 2}})})
        nodes.append(n);
      for (const QJsonValue w : {wire("emb.out", "lq.in"), wire("t2.out", "lk.in"), wire("t2.out", "lv.in"),
                                 wire("lq.out", "mha.q"), wire("lk.out", "mha.k"), wire("lv.out", "mha.v")})
        wires.append(w);
      QTest::newRow("cross-attention, k and v from other layers, 4 keys for 6 queries")
          << sequenceCase(kT, kE, nodes, wires, "mha.out");
    }
    {
      auto [nodes, wires] = otherLength(9);
      nodes.append(node("mha", "MultiheadAttention", {{"num_heads", 2}, {"causal", true}}));
      wires.append(wire("emb.out", "mha.q"));
      wires.append(wire("t2.out", "mha.k"));
      QTest::newRow("cross-attention, k only, causal, 9 keys for 6 queries")
          << sequenceCase(kT, kE, nodes, wires, "mha.out");
    }
    // Valid lengths from the data (d2l's masked softmax): ValidLength counts the ids that are not <pad> (1)
    // and MultiheadAttention's valid_lens takes them, k and v left open before it. Samples of length 6 (no
    // pad), 3 and 0 (all pad: all-zero weights, the output is out_proj's bias; torch would give NaN, so the
    // peer replaces that sample's output by the bias, see Attention in torch_peer.py).
    {
      const std::vector<float> padded{2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 1, 1, 1, 1, 1, 1, 1, 1};
      Case c = sequenceCase(kT, kE,
                            {node("vl", "ValidLength", {{"pad_id", 1}}),
                             node("mha", "MultiheadAttention", {{"num_heads", 2}})},
                            {wire("x.out", "vl.in"), wire("emb.out", "mha.q"), wire("vl.out", "mha.valid_lens")},
                            "mha.out");
      c.ids = padded;
      QTest::newRow("self-attention, valid lengths 6, 3, 0 (k and v open)") << c;
      Case causal = sequenceCase(
          kT, kE,
          {node("vl", "ValidLength", {{"pad_id", 1}}),
           node("mha", "MultiheadAttention", {{"num_heads", 4}, {"causal", true}})},
          {wire("x.out", "vl.in"), wire("emb.out", "mha.q"), wire("vl.out", "mha.valid_lens")}, "mha.out");
      causal.ids = {2, 3, 4, 5, 6, 1, 7, 8, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};  // lengths 5, 2, 0
      QTest::newRow("self-attention, causal, valid lengths 5, 2, 0") << causal;
      // 4 keys: the length 6 is past them all, which masks nothing.
      auto [nodes, wires] = otherLength(4);
      nodes.append(node("vl", "ValidLength"));  // pad_id's default, 1
      nodes.append(node("mha", "MultiheadAttention", {{"num_heads", 2}, {"bias", false}}));
      wires.append(wire("x.out", "vl.in"));
      wires.append(wire("emb.out", "mha.q"));
      wires.append(wire("t2.out", "mha.k"));
      wires.append(wire("vl.out", "mha.valid_lens"));
      Case cross = sequenceCase(kT, kE, nodes, wires, "mha.out");
      cross.ids = {2, 3, 4, 1, 1, 1, 5, 6, 7, 8, 9, 10, 11, 1, 1, 1, 1, 1};  // lengths 3, 6, 1 of 4 keys
      QTest::newRow("cross-attention, k only, no bias, valid lengths 3, 6 (past the 4 keys), 1") << cross;
    }
    // 40 steps, so that the table's fast frequencies turn several times; a Linear keeps the output small
    // enough for Inspect.
    QTest::newRow("positional encoding, 40 steps") << sequenceCase(
        40, 16,
        {node("pe", "PositionalEncoding", {{"max_len", 40}}), node("fc", "Linear", {{"out_features", 3}})},
        {wire("emb.out", "pe.in"), wire("pe.out", "fc.in")}, "fc.out");
    {
      Case c = sequenceCase(kT, kE, {node("pos", "PositionEmbedding"), node("act", "Tanh")},
                            {wire("emb.out", "pos.in"), wire("pos.out", "act.in")}, "act.out");
      c.shorter = 4;
      QTest::newRow("position embedding, and a shorter sequence") << c;
    }
    QTest::newRow("class token, attention, first step, layernorm of the features") << sequenceCase(
        kT, kE,
        {node("cls", "ClassToken"), node("mha", "MultiheadAttention", {{"num_heads", 2}}),
         node("first", "FirstStep"), node("ln", "LayerNorm"), node("fc", "Linear", {{"out_features", 5}})},
        {wire("emb.out", "cls.in"), wire("cls.out", "mha.q"), wire("mha.out", "first.in"),
         wire("first.out", "ln.in"), wire("ln.out", "fc.in")},
        "fc.out");
    QTest::newRow("attention drawn by hand: bmm(q, k^T), scale, causal softmax, bmm by v") << sequenceCase(
        kT, kE,
        {node("lq", "Linear", {{"out_features", kE}}), node("lk", "Linear", {{"out_features", kE}}),
         node("lv", "Linear", {{"out_features", kE}}), node("scores", "BatchMatMul", {{"transpose_b", true}}),
         node("scale", "Scale", {{"scale", 1 / std::sqrt(double(kE))}}),
         node("sm", "Softmax", {{"causal", true}}), node("att", "BatchMatMul")},
        {wire("emb.out", "lq.in"), wire("emb.out", "lk.in"), wire("emb.out", "lv.in"),
         wire("lq.out", "scores.a"), wire("lk.out", "scores.b"), wire("scores.out", "scale.in"),
         wire("scale.out", "sm.in"), wire("sm.out", "att.a"), wire("lv.out", "att.b")},
        "att.out");
    QTest::newRow("mul, a gate") << sequenceCase(
        kT, kE,
        {node("la", "Linear", {{"out_features", kE}}), node("lb", "Linear", {{"out_features", kE}}),
         node("gate", "Sigmoid"), node("mul", "Mul")},
        {wire("emb.out", "la.in"), wire("emb.out", "lb.in"), wire("lb.out", "gate.in"),
         wire("la.out", "mul.a"), wire("gate.out", "mul.b")},
        "mul.out");
    {
      Case c = sequenceCase(kT, kE,
                            {node("pe", "PositionalEncoding", {{"dropout", 0.3}}),
                             node("mha", "MultiheadAttention", {{"num_heads", 2}, {"dropout", 0.4}})},
                            {wire("emb.out", "pe.in"), wire("pe.out", "mha.q")}, "mha.out");
      c.grads = false;
      QTest::newRow("dropout in attention and encoding, evaluation") << c;
    }
    QTest::newRow("pre-norm ViT block against nn.TransformerEncoderLayer(norm_first=True, gelu)")
        << blockCase(true);
    QTest::newRow("post-norm block against nn.TransformerEncoderLayer(norm_first=False, relu)")
        << blockCase(false);
    QTest::newRow("ViT, 28x28, patch 4, 2 blocks") << vitCase();
  }

  void attention_matches_torch() {
    QFETCH(Case, c);
    const QString tag = QString(QTest::currentDataTag()).replace(QRegularExpression("[^A-Za-z0-9]+"), "_");
    const QString graphFile = path(tag + ".graph.json");
    QVERIFY(writeJson(graphFile, c.graph));

    // The batch: token ids, each row of the Embedding once (shuffled), or U(-1, 1) images.
    std::mt19937 gen(5);
    int64_t numel = kBatch;
    for (const QJsonValue& d : c.sample) numel *= d.toInteger();
    std::vector<float> x(static_cast<size_t>(numel));
    if (!c.ids.empty()) {
      QCOMPARE(int64_t(c.ids.size()), numel);
      x = c.ids;
    } else if (c.vocab > 0) {
      QCOMPARE(numel, c.vocab);
      std::iota(x.begin(), x.end(), 0.0f);
      std::shuffle(x.begin(), x.end(), gen);
    } else {
      std::uniform_real_distribution<float> u(-1, 1);
      for (float& v : x) v = u(gen);
    }
    const QString xFile = path(tag + ".x.f32");
    interop::write_floats(xFile, x);

    // gpunodes' own weights and its Forward on them.
    const QString gnWeights = path(tag + ".gn.safetensors"), torchWeights = path(tag + ".torch.safetensors");
    const std::vector<float> gnOwn = gpunodesForward(tag + ".save", c, x, gnWeights, {});
    QVERIFY2(!gnOwn.empty(), "gpunodes gave no output");

    // The output's gradient for the backward checks.
    std::normal_distribution<float> normal(0, 1);
    std::vector<float> dy(gnOwn.size());
    for (float& v : dy) v = normal(gen);
    const QString dyFile = path(tag + ".dy.f32");
    interop::write_floats(dyFile, dy);
    // A shorter sequence: its first steps' ids, and an output gradient of that size.
    const int64_t steps = c.vocab > 0 ? c.sample[0].toInteger() : 0;
    std::vector<float> xShort;
    if (c.shorter > 0)
      for (int64_t n = 0; n < kBatch; ++n)
        xShort.insert(xShort.end(), x.begin() + n * steps, x.begin() + n * steps + c.shorter);
    std::vector<float> dyShort(c.shorter > 0 ? dy.size() / size_t(steps) * size_t(c.shorter) : 0);
    for (float& v : dyShort) v = normal(gen);
    const QString xShortFile = path(tag + ".xshort.f32"), dyShortFile = path(tag + ".dyshort.f32");
    interop::write_floats(xShortFile, xShort);
    interop::write_floats(dyShortFile, dyShort);

    // torch: each reference on gpunodes' weights (float32, evaluation), then torch's own weights saved, and
    // each reference on them in evaluation and, with the output's gradient, in training (float64).
    struct Job {
      QString what;
      QJsonObject j;
    };
    std::vector<Job> jobs;
    QJsonArray argv;
    auto add = [&](const QString& what, const QJsonObject& j) {
      const QString file = path(QString("%1.job%2.json").arg(tag).arg(jobs.size()));
      writeJson(file, j);
      argv.append(QJsonArray{"reference", file});
      jobs.push_back({what, j});
    };
    for (const Reference& r : c.refs) add("gn", job(tag, r, gnWeights, xFile, "float32", "eval", {}));
    argv.append(QJsonArray{"save", graphFile + "#net", "5", torchWeights});
    jobs.push_back({"save", {}});
    for (const Reference& r : c.refs) {
      add("torch", job(tag, r, torchWeights, xFile, "float32", "eval", {}));
      if (c.grads) add("grads", job(tag, r, torchWeights, xFile, "float64", "train", dyFile));
      if (c.grads && c.shorter > 0 && r.kind.isEmpty())
        add("short", job(tag, r, torchWeights, xShortFile, "float64", "train", dyShortFile,
                         QJsonArray{double(c.shorter)}));
    }
    const QString jobsFile = path(tag + ".jobs.json");
    {
      QFile f(jobsFile);
      QVERIFY(f.open(QIODevice::WriteOnly));
      f.write(QJsonDocument(argv).toJson());
    }
    const Process p = interop::run(GN_PYTHON, {GN_TORCH_PEER, "jobs", jobsFile});
    QVERIFY2(p.exitCode == 0, qPrintable("the torch peer failed: " + p.err));
    const QStringList lines = p.out.trimmed().split('\n');
    QCOMPARE(lines.size(), qsizetype(jobs.size()));

    // gpunodes on torch's weights.
    const std::vector<float> gnOfTorch = gpunodesForward(tag + ".load", c, x, {}, torchWeights);
    QVERIFY2(!gnOfTorch.empty(), "gpunodes gave no output on torch's weights");

    // The same network in this process, from the signature gpunodes saved, on torch's weights.
    const nn::SafetensorsHeader header = nn::read_safetensors_header(gnWeights.toStdString());
    const std::string* signature = header.find_metadata("gpunodes.signature");
    QVERIFY2(signature, "gpunodes' file has no signature");
    nn::ModelOptions o;
    o.arch = nn::Arch::Network;
    o.network = std::make_shared<const nn::NetworkSpec>(nn::NetworkSpec::parse(*signature));
    std::unique_ptr<nn::Model> model = nn::Model::create(rt_, o, device_);
    nn::load_safetensors(*model, readBytes(torchWeights), torchWeights.toStdString());
    // Forward in training mode and backward from dy: the output and every parameter's gradient.
    auto trainStep = [&](const std::vector<float>& batch, int64_t len, const std::vector<float>& grad,
                         std::vector<double>& y, std::map<QString, std::vector<double>>& grads) {
      Shape shape = model->input_shape(kBatch);
      if (len > 0) shape[1] = len;
      const Tensor out = model->forward(from_values(rt_, shape, device_, batch), nn::Mode::Train);
      y = doubles(to_host(out));
      model->backward(from_values(rt_, out.shape(), device_, grad));
      for (nn::Parameter* prm : model->parameters())
        grads[QString::fromStdString(prm->name)] = doubles(to_host(prm->grad));
    };
    std::vector<double> yTrain, yShort;
    std::map<QString, std::vector<double>> gnGrads, gnShortGrads;
    if (c.grads) {
      trainStep(x, 0, dy, yTrain, gnGrads);
      QCOMPARE(yTrain.size(), dy.size());
      if (c.shorter > 0) trainStep(xShort, c.shorter, dyShort, yShort, gnShortGrads);
    }

    QStringList bad;
    size_t line = 0;
    for (const Job& jb : jobs) {
      const QJsonObject printed = QJsonDocument::fromJson(lines[qsizetype(line++)].toUtf8()).object();
      if (jb.what == "save") continue;
      TorchResult t;
      QVERIFY2(readResult(jb.j, printed, t),
               qPrintable("the peer's output does not parse: " + lines[qsizetype(line - 1)]));
      const bool drawn = !jb.j.contains("reference");
      const QString who = drawn ? QString("the drawn network in torch")
                                : "torch's " + jb.j["reference"].toObject()["kind"].toString();
      // Every tensor of the file is loaded (strict=True), and gpunodes writes torch's order.
      if (jb.what == "gn" && drawn && printed["keys"].toArray() != printed["file_keys"].toArray())
        bad << "gpunodes' file does not list the state in torch's state_dict order: " +
                   QJsonDocument(printed["file_keys"].toArray()).toJson(QJsonDocument::Compact);
      if (!printed["reshaped"].toArray().isEmpty())
        qInfo("%s took %s reshaped (same values, d2l's shape)", qPrintable(who),
              qPrintable(QJsonDocument(printed["reshaped"].toArray()).toJson(QJsonDocument::Compact)));
      double* worst = c.forwardTol > kTol ? &worstVit_ : &worstForward_;
      if (jb.what == "gn") {
        bad << compare(who + " on gpunodes' weights, evaluation", doubles(gnOwn), t.y, c.forwardTol, worst);
      } else if (jb.what == "torch") {
        bad << compare("gpunodes on " + who + "'s weights, evaluation", doubles(gnOfTorch), t.y, c.forwardTol,
                       worst);
      } else {
        const bool isShort = jb.what == "short";
        const std::vector<double>& y = isShort ? yShort : yTrain;
        const std::map<QString, std::vector<double>>& grads = isShort ? gnShortGrads : gnGrads;
        const QString mode = isShort ? QString(" (%1 steps)").arg(c.shorter) : QString();
        bad << compare("training forward against " + who + mode, y, t.y, kTol, &worstTrainForward_);
        // A gradient that is zero in exact arithmetic (a key projection's bias: the softmax does not see a
        // constant added to a query's scores) is float32 rounding on gpunodes' side: those tensors are held
        // to kGradFloor of the case's largest gradient.
        double largestGrad = 0;
        for (const auto& [name, want] : t.grads)
          for (double g : want) largestGrad = std::max(largestGrad, std::abs(g));
        QSet<QString> seen;
        for (const auto& [name, want] : t.grads) {
          seen.insert(name);
          const auto it = grads.find(name);
          if (it == grads.end()) {
            bad << "gpunodes has no gradient for " + name;
            continue;
          }
          double scale = 0;
          for (double g : want) scale = std::max(scale, std::abs(g));
          const bool tiny = scale < kGradFloor * largestGrad;
          bad << compare("the gradient of " + name + " against " + who + mode, it->second, want, kTol,
                         tiny ? nullptr : &worstGrad_, kGradFloor * largestGrad);
          if (tiny) {
            double d = 0;
            for (size_t i = 0; i < want.size() && i < it->second.size(); ++i)
              d = std::max(d, std::abs(it->second[i] - want[i]));
            qInfo(
                "%s: torch's largest %.3g, %.3g of the case's largest gradient %.3g; gpunodes differs by "
                "%.3g",
                qPrintable(name), scale, scale / largestGrad, largestGrad, d);
          }
        }
        for (const auto& [name, g] : grads)
          if (!seen.contains(name)) bad << "torch has no gradient for gpunodes' " + name;
        // A gradient check that sees only zeros checks nothing: the input's gradient must reach the
        // Embedding.
        if (c.vocab > 0) {
          const auto it = grads.find("emb.weight");
          double largest = 0;
          if (it != grads.end())
            for (double g : it->second) largest = std::max(largest, std::abs(g));
          if (!(largest > 0)) bad << "the input gradient (emb.weight) is all zeros" + mode;
        }
      }
    }
    bad.removeAll(QString());
    QVERIFY2(bad.isEmpty(), qPrintable(bad.join('\n')));
    qInfo(
        "largest relative errors so far: evaluation %.3g, training forward %.3g, gradients %.3g, ViT logits "
        "%.3g",
        worstForward_, worstTrainForward_, worstGrad_, worstVit_);
  }

  void cleanupTestCase() {
    qInfo(
        "largest relative errors: evaluation outputs %.3g, training outputs %.3g (float64 torch), gradients "
        "%.3g (float64 torch), the ViT's logits %.3g",
        worstForward_, worstTrainForward_, worstGrad_, worstVit_);
  }
};

QTEST_GUILESS_MAIN(TorchAttentionTest)
#include "test_torch_attention.moc"
