// ONNX import against PyTorch, end to end through the real binary: for each network (the LeNet, MLP and
// ResNet-18 examples, and a graph with every layer type gpunodes has that ONNX can express: branches joined by
// Add and Concat, both batch norms, both pools and a padded AvgPool, GELU, LayerNorm with and without its scale
// and bias, a square Linear, Reshape, Transpose and Softmax), torch builds the network
// (tests/interop/torch_peer.py), draws and trains its weights for two batches (so that the running statistics
// are not their defaults), and torch.onnx.export writes it at opset 13 (where LayerNorm is written out as
// ReduceMean, Sub, Pow, ... and the importer finds the pattern) and at opset 17 (tests/onnx/onnx_peer.py);
// `gpunodes import-onnx` reads the file and `gpunodes run` runs Forward of the imported graph (its own Network
// and LoadParams) on a batch; its logits must be torch's to 1e-4 of their largest magnitude (interop::compare).
//
// What the comparison catches: every weight goes through LoadParams into the Network that the graph's layers
// make, which refuses a tensor of another shape, so a weight of the wrong layout is caught there unless its
// layout is square. The every-layer network therefore has a square 32x32 Linear (torch writes it as a Gemm with
// transB) and an unbiased Linear that torch writes as a MatMul by the transposed weight: a weight read the wrong
// way round loads without complaint and mixes the features, which moves the logits by their own magnitude, far
// beyond 1e-4. Likewise BatchNorm's statistics (trained, not 0 and 1), momentum, LayerNorm's trained scale and
// bias, the pad of the padded AvgPool (count_include_pad) and GELU's Erf form each change the logits when read
// wrongly.
//
// The sequence networks (the LSTM and GRU examples, a bidirectional 2-layer LSTM, a ReLU RNN, an Embedding into a
// GRU) go the same way: torch writes ONNX RNN / GRU / LSTM ops with the gates in ONNX's order, and the import
// puts them back in torch's, which a gate block read in the wrong place would show in the logits.
//
// nn.MultiheadAttention(batch_first=True) self-attention, with and without biases, goes the same way: torch
// writes its own decomposition (attentionGraph below), which the import reads back as one MultiheadAttention; so
// do gpunodes' valid lengths as torch_peer writes them (keyPaddingGraph: torch's key_padding_mask, read back as
// a ValidLength wired to the attention's valid_lens).
//
// And: an operator gpunodes has no layer for (LRN, Einsum: tests/data/hostile-onnx) is refused with one line
// that names the op type, the node, the opset and the list of what is supported; so is each recurrent feature
// gpunodes cannot express (peepholes, clip, other activations, sequence_lens, a non-zero initial state,
// layout 1, reverse, input_forget, activation_alpha, a read Y_h), naming the node and the attribute or input.
#include <QDir>
#include <QElapsedTimer>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <fstream>
#include <random>

#include "interop_util.h"
#include "onnx_networks.h"

namespace {

constexpr int kBatch = 3;

using interop::graphOf;
using interop::node;
using interop::nonEmptyLines;
using interop::Process;
using interop::readJson;
using interop::run;
using interop::wire;
using interop::writeJson;

// A chain of layers from x to a Network "net" (one input each).
QJsonObject chainGraph(const QJsonArray& layers) {
  QJsonArray nodes = layers, wires;
  nodes.append(node("net", "Network", {{"init", "kaiming"}, {"seed", 3}}));
  for (qsizetype i = 0; i + 1 < nodes.size(); ++i) {
    const QString to = nodes[i + 1].toObject()["id"].toString();
    wires.append(wire(nodes[i].toObject()["id"].toString() + ".out", to + (i + 2 == nodes.size() ? ".out" : ".in")));
  }
  return graphOf(nodes, wires);
}

// The recurrent layers torch writes as ONNX RNN / GRU / LSTM ops (time-major between Transposes, gates in
// ONNX's order, a stacked module as a chain of ops): a bidirectional 2-layer LSTM read at its last step, a ReLU
// RNN without biases on every step, and token ids through an Embedding into a bidirectional GRU.
QJsonObject biLstmGraph() {
  return chainGraph({node("x", "Input", {{"shape", QJsonArray{6, 5}}}),
                     node("lstm", "LSTM", {{"hidden_size", 8}, {"num_layers", 2}, {"bidirectional", true}}),
                     node("last", "LastStep"), node("fc", "Linear", {{"out_features", 4}})});
}
QJsonObject rnnReluGraph() {
  return chainGraph({node("x", "Input", {{"shape", QJsonArray{6, 5}}}),
                     node("rnn", "RNN", {{"hidden_size", 7}, {"nonlinearity", "relu"}, {"bias", false}}),
                     node("rnn2", "RNN", {{"hidden_size", 6}, {"num_layers", 2}}),
                     node("fc", "Linear", {{"out_features", 3}}), node("flat", "Reshape", {{"shape", QJsonArray{-1}}}),
                     node("out", "Linear", {{"out_features", 4}})});
}
QJsonObject embeddingGruGraph() {
  return chainGraph({node("x", "Input", {{"shape", QJsonArray{9}}}),
                     node("emb", "Embedding", {{"num_embeddings", 13}, {"embedding_dim", 6}}),
                     node("gru", "GRU", {{"hidden_size", 5}, {"bidirectional", true}, {"num_layers", 2}}),
                     node("fc", "Linear", {{"out_features", 13}})});
}

// nn.MultiheadAttention(batch_first=True) self-attention, which torch writes as its own decomposition (time-major
// Transposes, one in_proj MatMul Sliced into q, k and v, heads by Reshape to [T, N * heads, d], out_proj as a
// Gemm or MatMul, and Shape arithmetic of the batch for every Reshape), then a Linear on every step. With
// biases it reads an embedding Linear's output and has 2 heads of 4; without, it reads the input itself and has
// 4 heads of 2. in_proj_weight is [24, 8] and torch multiplies by its transpose: read the wrong way round it
// would be refused by its shape, and a head split or a q, k, v order read wrongly moves the logits. Causal, the
// attn_mask is computed in the graph (Trilu of ConstantOfShape, Where) from the input's Shape; torch 1.13 writes
// it from opset 14 on (Trilu), so only at opset 17.
QJsonObject attentionGraph(bool bias, bool causal = false) {
  QJsonArray nodes{node("x", "Input", {{"shape", QJsonArray{6, bias ? 5 : 8}}}),
                   node("attn", "MultiheadAttention", {{"num_heads", bias ? 2 : 4}, {"bias", bias}, {"causal", causal}}),
                   node("fc", "Linear", {{"out_features", 5}}),
                   node("net", "Network", {{"init", "kaiming"}, {"seed", 3}})};
  QJsonArray wires{wire("attn.out", "fc.in"), wire("fc.out", "net.out")};
  if (bias) {
    nodes.append(node("embed", "Linear", {{"out_features", 8}}));
    wires.append(wire("x.out", "embed.in"));
    wires.append(wire("embed.out", "attn.q"));
  } else {
    wires.append(wire("x.out", "attn.q"));
  }
  return graphOf(nodes, wires);
}

// Keys of another length than the 6 steps of `from` (keys != 6): a Linear across the steps, between Transposes
// ("t1", "steps", "t2"), whose output the key (and value) Linears read; with 6, `from` itself. Appends the nodes
// and wires; the port the key Linears read.
QString keySteps(const QString& from, int keys, QJsonArray& nodes, QJsonArray& wires) {
  if (keys == 6) return from;
  for (const QJsonObject& n : {node("t1", "Transpose"), node("steps", "Linear", {{"out_features", keys}}),
                               node("t2", "Transpose")})
    nodes.append(n);
  for (const QJsonObject& w : {wire(from, "t1.in"), wire("t1.out", "steps.in"), wire("steps.out", "t2.in")})
    wires.append(w);
  return "t2.out";
}

// Cross-attention, which torch writes with its projections apart: two Linears of one Input into q and k (v = k
// open: torch slices in_proj_weight's rows in the graph, [0, E) for q and [E, 3E) for k and v, and Slices the
// 2E projection into k and v), or three into q, k and v (its constant folding writes each projection's weight
// and bias as initializers of their own), then a Linear. With v = k it has biases and 2 heads of 4; with v
// wired it has none and 4 heads of 2. A q, k or v block of in_proj read in another's place moves the logits.
// Causal, torch computes the mask triu(1 + Tk - Tq) from the Shapes of q and k (from opset 14: Trilu); with more
// keys than the 6 queries (keySteps) it is aligned to the end, and a diagonal read off by one moves the logits.
QJsonObject crossAttentionGraph(bool ownV, bool causal = false, int keys = 6) {
  QJsonArray nodes{node("x", "Input", {{"shape", QJsonArray{6, 5}}}), node("qin", "Linear", {{"out_features", 8}}),
                   node("kin", "Linear", {{"out_features", 8}}),
                   node("attn", "MultiheadAttention",
                        {{"num_heads", ownV ? 4 : 2}, {"bias", !ownV}, {"causal", causal}}),
                   node("fc", "Linear", {{"out_features", 5}}),
                   node("net", "Network", {{"init", "kaiming"}, {"seed", 3}})};
  QJsonArray wires{wire("x.out", "qin.in"), wire("qin.out", "attn.q"), wire("kin.out", "attn.k"),
                   wire("attn.out", "fc.in"), wire("fc.out", "net.out")};
  const QString ks = keySteps("x.out", keys, nodes, wires);
  wires.append(wire(ks, "kin.in"));
  if (ownV) {
    nodes.append(node("vin", "Linear", {{"out_features", 8}}));
    wires.append(wire(ks, "vin.in"));
    wires.append(wire("vin.out", "attn.v"));
  }
  return graphOf(nodes, wires);
}

// gpunodes' valid lengths as torch_peer writes them in torch (tests/interop/torch_peer.py): token ids into an
// Embedding (9 ids, E = 8) and a ValidLength (pad_id 1) whose lengths are the valid_lens of a MultiheadAttention of
// 2 heads with biases, torch's key_padding_mask = arange(Tk) >= lens with the guard that gives a sample of length
// 0 out_proj's bias (a torch.where after the module), then a Linear to 5 on every step. Causal, torch joins the
// two masks by Or; as cross-attention (k from a Linear of the embedding, v = k) the keys' T comes from k; without
// biases the guard gives 0 (torch's zeros for out_proj's bias, folded to a constant); a cross-attention may have
// more keys than queries (keySteps: the lengths mask the keys past them, the causal mask is aligned to the end).
// The ids give lengths 3, 0 and 6: a mask read from the wrong end, a guard missing or a length read off by one
// moves the logits.
QJsonObject keyPaddingGraph(bool causal, bool cross, bool bias = true, int keys = 6) {
  QJsonArray nodes{node("x", "Input", {{"shape", QJsonArray{6}}}),
                   node("emb", "Embedding", {{"num_embeddings", 9}, {"embedding_dim", 8}}),
                   node("vl", "ValidLength", {{"pad_id", 1}}),
                   node("attn", "MultiheadAttention", {{"num_heads", 2}, {"causal", causal}, {"bias", bias}}),
                   node("fc", "Linear", {{"out_features", 5}}),
                   node("net", "Network", {{"init", "kaiming"}, {"seed", 3}})};
  QJsonArray wires{wire("x.out", "emb.in"), wire("x.out", "vl.in"), wire("emb.out", "attn.q"),
                   wire("vl.out", "attn.valid_lens"), wire("attn.out", "fc.in"), wire("fc.out", "net.out")};
  if (cross) {
    nodes.append(node("kin", "Linear", {{"out_features", 8}}));
    wires.append(wire(keySteps("emb.out", keys, nodes, wires), "kin.in"));
    wires.append(wire("kin.out", "attn.k"));
  }
  return graphOf(nodes, wires);
}

// torch_peer's Attention as a torch user writes valid lengths without its guard: key_padding_mask = arange(Tk) >=
// lens and nothing after the module, so that a sample of length 0 (every key masked) is NaN in torch. Runs
// onnx_peer.py (export) or torch_peer.py (logits) with that forward: python3 -c SCRIPT TORCH_PEER ONNX_PEER
// COMMAND ARGS...
const char* kUnguardedPeer = R"(
import os, sys
peer, onnx_peer_py = sys.argv[1:3]
sys.path[:0] = [os.path.dirname(peer), os.path.dirname(onnx_peer_py)]
import torch, torch_peer
def forward(self, q, k=None, v=None, valid_lens=None):
    k = q if k is None else k
    v = k if v is None else v
    lens = valid_lens.reshape(-1, 1)
    pad = torch.arange(k.shape[1], device=q.device, dtype=lens.dtype)[None, :] >= lens
    return torch.nn.MultiheadAttention.forward(self, q, k, v, need_weights=False, key_padding_mask=pad)[0]
torch_peer.Attention.forward = forward
import onnx_peer
sys.exit((onnx_peer if sys.argv[3] == "export" else torch_peer).main(sys.argv[3:]))
)";

// The imported graph with a batch of `x` as a Tensor on its Device, Forward of the model its LoadParams gives,
// and an Inspect "logits" of the result.
QJsonObject withForward(QJsonObject graph, const QJsonArray& sampleShape, const std::vector<float>& x,
                        QString* why) {
  QString device, load;
  QJsonArray nodes = graph["nodes"].toArray(), wires = graph["connections"].toArray();
  for (const QJsonValue& v : nodes) {
    const QJsonObject n = v.toObject();
    if (n["type"].toString() == "Device") device = n["id"].toString();
    if (n["type"].toString() == "LoadParams") load = n["id"].toString();
  }
  if (device.isEmpty() || load.isEmpty()) {
    *why = "the imported graph has no Device or no LoadParams";
    return {};
  }
  QStringList text;
  for (float v : x) text.append(QString::number(v, 'g', 9));
  QJsonArray shape{kBatch};
  for (const QJsonValue& d : sampleShape) shape.append(d);
  nodes.append(node("images", "Tensor", {{"shape", shape}, {"init", "values"}, {"values", text.join(' ')}}));
  nodes.append(node("fwd", "Forward"));
  nodes.append(node("logits", "Inspect"));
  wires.append(wire(device + ".device", "images.device"));
  wires.append(wire("images.out", "fwd.in"));
  wires.append(wire(load + ".model", "fwd.model"));
  wires.append(wire("fwd.out", "logits.in"));
  graph["nodes"] = nodes;
  graph["connections"] = wires;
  return graph;
}


}  // namespace

class OnnxImportTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    if (const QString why = interop::onnxPeerMissing(GN_PYTHON); !why.isEmpty()) QSKIP(qPrintable(why));
  }

  void torch_export_imports_and_runs_the_same_data() {
    QTest::addColumn<QString>("name");
    QTest::addColumn<QJsonObject>("graph");  // empty: `spec` is one of torch_peer's built-in signatures
    QTest::addColumn<QString>("spec");
    QTest::addColumn<QJsonArray>("sample");
    QTest::addColumn<int>("opset");
    QTest::addColumn<int>("vocab");  // > 0: the inputs are token ids in [0, vocab); 0: U(-1, 1)
    const QJsonObject lenet = readJson(GN_EXAMPLES_DIR "/lenet-layers.json");
    const QJsonObject resnet = readJson(GN_EXAMPLES_DIR "/resnet18-layers.json");
    const QJsonObject lstmRows = readJson(GN_EXAMPLES_DIR "/lstm-fashion-mnist-rows.json");
    const QJsonObject gruLm = readJson(GN_EXAMPLES_DIR "/rnn-language-model.json");
    for (int opset : {13, 17}) {
      const QString o = "-opset" + QString::number(opset);
      QTest::newRow(qPrintable("lenet" + o)) << "lenet" << lenet << "" << QJsonArray{1, 28, 28} << opset << 0;
      // The MLP example's Model node ("mlp": Flatten, Linear 784 -> 256, ReLU, Linear 256 -> 10).
      QTest::newRow(qPrintable("mlp" + o)) << "mlp" << QJsonObject() << "mlp" << QJsonArray{1, 28, 28} << opset << 0;
      QTest::newRow(qPrintable("resnet18" + o)) << "resnet18" << resnet << "" << QJsonArray{1, 28, 28} << opset << 0;
      QTest::newRow(qPrintable("every-layer" + o))
          << "every-layer" << onnx_networks::everyLayerGraph(opset) << "" << QJsonArray{3, 12, 12} << opset << 0;
      // The sequence examples: Reshape -> LSTM -> LastStep -> Linear on Fashion-MNIST rows, and d2l's GRU
      // language model (OneHot 28 -> GRU 256 -> Linear 28 on every step).
      QTest::newRow(qPrintable("lstm-rows" + o)) << "lstm-rows" << lstmRows << "" << QJsonArray{1, 28, 28} << opset << 0;
      QTest::newRow(qPrintable("gru-lm" + o)) << "gru-lm" << gruLm << "" << QJsonArray{35} << opset << 28;
      QTest::newRow(qPrintable("bilstm2" + o)) << "bilstm2" << biLstmGraph() << "" << QJsonArray{6, 5} << opset << 0;
      QTest::newRow(qPrintable("rnn-relu" + o)) << "rnn-relu" << rnnReluGraph() << "" << QJsonArray{6, 5} << opset << 0;
      QTest::newRow(qPrintable("embedding-gru" + o))
          << "embedding-gru" << embeddingGruGraph() << "" << QJsonArray{9} << opset << 13;
      QTest::newRow(qPrintable("torch-mha" + o)) << "torch-mha" << attentionGraph(true) << "" << QJsonArray{6, 5} << opset << 0;
      QTest::newRow(qPrintable("torch-mha-nobias" + o))
          << "torch-mha-nobias" << attentionGraph(false) << "" << QJsonArray{6, 8} << opset << 0;
      QTest::newRow(qPrintable("torch-mha-cross" + o))
          << "torch-mha-cross" << crossAttentionGraph(false) << "" << QJsonArray{6, 5} << opset << 0;
      QTest::newRow(qPrintable("torch-mha-cross-kv" + o))
          << "torch-mha-cross-kv" << crossAttentionGraph(true) << "" << QJsonArray{6, 5} << opset << 0;
      if (opset >= 14)
        QTest::newRow(qPrintable("torch-mha-causal" + o))
            << "torch-mha-causal" << attentionGraph(true, true) << "" << QJsonArray{6, 5} << opset << 0;
      // Causal cross-attention, as many keys as queries and 9 keys for 6 queries (the mask aligned to the end).
      if (opset >= 14) {
        QTest::newRow(qPrintable("torch-mha-cross-causal" + o))
            << "torch-mha-cross-causal" << crossAttentionGraph(false, true) << "" << QJsonArray{6, 5} << opset << 0;
        QTest::newRow(qPrintable("torch-mha-cross-causal-tk9" + o))
            << "torch-mha-cross-causal-tk9" << crossAttentionGraph(false, true, 9) << "" << QJsonArray{6, 5} << opset
            << 0;
        QTest::newRow(qPrintable("torch-mha-cross-kv-causal-tk9" + o))
            << "torch-mha-cross-kv-causal-tk9" << crossAttentionGraph(true, true, 9) << "" << QJsonArray{6, 5}
            << opset << 0;
      }
      // Valid lengths through torch's key_padding_mask (the ids: keyPaddingGraph), causal only where torch writes
      // the triu; unguarded, the sample of length 0 is left out of the comparison (torch's NaN).
      QTest::newRow(qPrintable("torch-mha-kpm" + o))
          << "torch-mha-kpm" << keyPaddingGraph(false, false) << "" << QJsonArray{6} << opset << 9;
      QTest::newRow(qPrintable("torch-mha-kpm-cross" + o))
          << "torch-mha-kpm-cross" << keyPaddingGraph(false, true) << "" << QJsonArray{6} << opset << 9;
      QTest::newRow(qPrintable("torch-mha-kpm-nobias" + o))
          << "torch-mha-kpm-nobias" << keyPaddingGraph(false, false, false) << "" << QJsonArray{6} << opset << 9;
      QTest::newRow(qPrintable("torch-mha-kpm-unguarded" + o))
          << "torch-mha-kpm-unguarded" << keyPaddingGraph(false, false) << "" << QJsonArray{6} << opset << 9;
      if (opset >= 14)
        QTest::newRow(qPrintable("torch-mha-kpm-causal" + o))
            << "torch-mha-kpm-causal" << keyPaddingGraph(true, false) << "" << QJsonArray{6} << opset << 9;
      if (opset >= 14)  // as many keys as queries: torch's triu(1 + Tk - Tq) is gpunodes' causal mask
        QTest::newRow(qPrintable("torch-mha-kpm-cross-causal" + o))
            << "torch-mha-kpm-cross-causal" << keyPaddingGraph(true, true) << "" << QJsonArray{6} << opset << 9;
      if (opset >= 14)  // 9 keys: the lengths mask the 3 past the tokens, the causal mask is aligned to the end
        QTest::newRow(qPrintable("torch-mha-kpm-cross-causal-tk9" + o))
            << "torch-mha-kpm-cross-causal-tk9" << keyPaddingGraph(true, true, true, 9) << "" << QJsonArray{6}
            << opset << 9;
    }
    // Below opset 13 torch writes each Unsqueeze's axes as an attribute.
    QTest::newRow("torch-mha-kpm-opset12") << "torch-mha-kpm" << keyPaddingGraph(false, false) << "" << QJsonArray{6}
                                           << 12 << 9;
  }
  void torch_export_imports_and_runs_the_same() {
    QFETCH(QString, name);
    QFETCH(QJsonObject, graph);
    QFETCH(QString, spec);
    QFETCH(QJsonArray, sample);
    QFETCH(int, opset);
    QFETCH(int, vocab);
    QElapsedTimer clock;
    clock.start();
    const QString tag = name + "-" + QString::number(opset);
    if (spec.isEmpty()) {
      QVERIFY2(!graph.isEmpty(), "the example did not load");
      const QString graphFile = dir_.filePath(name + ".graph.json");
      QVERIFY(writeJson(graphFile, graph));
      spec = graphFile + "#net";
    }
    // torch's weights (drawn with seed 5, running statistics moved by two training batches), its logits on x,
    // and its ONNX file with a dynamic batch.
    const QString weights = dir_.filePath(tag + ".torch.safetensors");
    Process p = run(GN_PYTHON, {GN_TORCH_PEER, "save", spec, "5", weights});
    QVERIFY2(p.exitCode == 0, qPrintable("torch could not save: " + p.err));
    std::mt19937 gen(11);
    std::uniform_real_distribution<float> dist(-1, 1);
    std::uniform_int_distribution<int> ids(0, std::max(vocab, 1) - 1);
    int64_t numel = kBatch;
    for (const QJsonValue& d : sample) numel *= d.toInteger();
    std::vector<float> x(static_cast<size_t>(numel));
    for (float& v : x) v = vocab > 0 ? float(ids(gen)) : dist(gen);
    const bool kpm = name.startsWith("torch-mha-kpm"), unguarded = name == "torch-mha-kpm-unguarded";
    if (kpm) x = {3, 4, 5, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 3, 4, 5, 6, 7};  // pad_id 1: lengths 3, 0 and 6
    const QString xFile = dir_.filePath(tag + ".x.f32"), torchOut = dir_.filePath(tag + ".torch.f32");
    interop::write_floats(xFile, x);
    if (name.endsWith("nobias")) {
      // torch 1.13's nn.MultiheadAttention takes its fused fast path in eval mode without gradients (as
      // torch_peer's logits runs), and that path fails without biases ("_native_multi_head_attention():
      // argument 'qkv_bias' must be Tensor, not NoneType"): the same module, with the same weights, runs here
      // with an input that requires its gradient, which keeps torch on its ordinary path.
      const char* script = R"(
import os, sys
spec, weights, xs, n, out, peer = sys.argv[1:]
sys.path.insert(0, os.path.dirname(peer))
import numpy as np
import torch_peer
model, sample = torch_peer.load_model_spec(spec)
model.load_state_dict(torch_peer.read_safetensors(weights)[0], strict=True)
model.eval()
x = torch_peer.torch.from_numpy(np.fromfile(xs, dtype="<f4").reshape([int(n)] + list(sample)))
model(x.requires_grad_()).detach().numpy().astype("<f4").tofile(out)
)";
      p = run(GN_PYTHON, {"-c", script, spec, weights, xFile, QString::number(kBatch), torchOut, GN_TORCH_PEER});
    } else {
      const QStringList logits{"logits", spec, weights, xFile, QString::number(kBatch), torchOut};
      p = unguarded ? run(GN_PYTHON, QStringList{"-c", kUnguardedPeer, GN_TORCH_PEER, GN_ONNX_PEER} + logits)
                    : run(GN_PYTHON, QStringList{GN_TORCH_PEER} + logits);
    }
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    const QString model = dir_.filePath(tag + ".onnx");
    const QStringList exportArgs{"export", spec, weights, QString::number(opset), model, "dynamic"};
    p = unguarded ? run(GN_PYTHON, QStringList{"-c", kUnguardedPeer, GN_TORCH_PEER, GN_ONNX_PEER} + exportArgs)
                  : run(GN_PYTHON, QStringList{GN_ONNX_PEER} + exportArgs);
    QVERIFY2(p.exitCode == 0, qPrintable("torch.onnx.export: " + p.err));
    qInfo("%s: torch wrote %s", qPrintable(tag), qPrintable(p.out.trimmed()));

    // The import, into a folder of its own: the graph names its weights relative to that folder.
    const QString folder = dir_.filePath(tag + "-imported");
    QVERIFY(QDir().mkpath(folder));
    const QString imported = folder + "/" + name + ".json";
    p = run(GN_GPUNODES, {"import-onnx", model, "-o", imported});
    QVERIFY2(p.exitCode == 0, qPrintable(QStringLiteral("import-onnx: exit %1\n%2").arg(p.exitCode).arg(p.err)));
    const QJsonObject graphOut = readJson(imported);
    QVERIFY2(!graphOut.isEmpty(), "the imported graph did not load");
    // Only the unguarded mask is imported with a warning: the sample of length 0 that torch makes NaN.
    QCOMPARE(p.err.contains("warning") && p.err.contains("no guard for a sample of length 0"), unguarded);
    if (name.startsWith("torch-mha")) {  // one layer under the module's name, with its params and its wires
      const bool bias = !name.endsWith("nobias") && !name.startsWith("torch-mha-cross-kv"),
                 causal = name.contains("causal");
      const int heads = bias || kpm ? 2 : 4;
      bool found = false;
      for (const QJsonValue& v : graphOut["nodes"].toArray())
        if (v["id"].toString() == "attn") {
          found = v["type"].toString() == "MultiheadAttention" && v["params"]["num_heads"].toInt() == heads &&
                  v["params"]["bias"].toBool() == bias && v["params"]["causal"].toBool() == causal;
        }
      QVERIFY2(found, "no MultiheadAttention 'attn' with the module's heads, bias and mask in the imported graph");
      QStringList into;  // what feeds the attention's ports
      for (const QJsonValue& w : graphOut["connections"].toArray())
        if (w["to"].toString().startsWith("attn.")) into << w["from"].toString() + ">" + w["to"].toString();
      into.sort();
      const bool kpmCross = name.startsWith("torch-mha-kpm-cross");
      const QStringList want =
          name.startsWith("torch-mha-cross-kv") ? QStringList{"kin.out>attn.k", "qin.out>attn.q", "vin.out>attn.v"}
          : name.startsWith("torch-mha-cross")  ? QStringList{"kin.out>attn.k", "qin.out>attn.q"}
          : kpmCross ? QStringList{"emb.out>attn.q", "kin.out>attn.k", "vl.out>attn.valid_lens"}
          : kpm      ? QStringList{"emb.out>attn.q", "vl.out>attn.valid_lens"}
                     : QStringList{};
      if (!want.isEmpty()) QVERIFY2(into == want, qPrintable("the attention's wires: " + into.join(", ")));
      if (kpm) {  // the lengths: torch's (x != pad).sum(1) read back as the ValidLength it came from
        bool lengths = false;
        for (const QJsonValue& v : graphOut["nodes"].toArray())
          lengths = lengths || (v["id"].toString() == "vl" && v["type"].toString() == "ValidLength" &&
                                v["params"]["pad_id"].toInt() == 1);
        QVERIFY2(lengths, "no ValidLength 'vl' with pad_id 1 in the imported graph");
      }
    }
    for (const QJsonValue& v : graphOut["nodes"].toArray())
      if (v.toObject()["type"].toString() == "LoadParams") {
        const QString path = v.toObject()["params"].toObject()["path"].toString();
        QVERIFY2(QDir::isRelativePath(path), qPrintable("LoadParams names its weights by the absolute " + path));
        QVERIFY2(QFileInfo::exists(folder + "/" + path), qPrintable(path + " is not beside the graph"));
      }

    // Forward in gpunodes, written beside the imported graph so that its relative path resolves.
    QString why;
    const QJsonObject runGraph = withForward(graphOut, sample, x, &why);
    QVERIFY2(!runGraph.isEmpty(), qPrintable(why));
    const QString runFile = folder + "/run.json", report = folder + "/report.json";
    QVERIFY(writeJson(runFile, runGraph));
    p = run(GN_GPUNODES, {"run", runFile, "--quiet", "--report", report});
    QVERIFY2(p.exitCode == 0, qPrintable(QStringLiteral("gpunodes run: exit %1\n%2").arg(p.exitCode).arg(p.err)));
    std::vector<float> got = interop::inspected(readJson(report), "logits");
    std::vector<float> want = interop::read_floats(torchOut);
    // Inspect reports the first 1000 values of a batch (the GRU language model's logits are 3 x 35 x 28).
    if (got.size() == 1000 && want.size() > 1000) want.resize(1000);
    for (float v : got) QVERIFY2(std::isfinite(v), qPrintable(tag + ": gpunodes gave a logit that is not finite"));
    if (unguarded) {  // the second sample, of length 0, is torch's NaN: the others are compared
      QCOMPARE(got.size(), want.size());
      const size_t per = got.size() / kBatch;
      QVERIFY2(std::isnan(want[per]), "torch's sample of length 0 was not NaN without the guard");
      got.erase(got.begin() + qsizetype(per), got.begin() + qsizetype(2 * per));
      want.erase(want.begin() + qsizetype(per), want.begin() + qsizetype(2 * per));
    }
    const QString diff = interop::compare(got, want);
    qInfo("%s: %lld ms", qPrintable(tag), qlonglong(clock.elapsed()));
    QVERIFY2(diff.isEmpty(), qPrintable(tag + ": gpunodes' import against torch: " + diff));
  }

  // What gpunodes' recurrent layers cannot express, in a small LSTM of onnx.helper's (x [N, 6, 5], Transpose,
  // LSTM 4, Squeeze, Transpose back): each refused with one line naming the node and the attribute or input;
  // the unmutated model imports.
  void recurrent_refusals_data() {
    QTest::addColumn<QString>("mutation");
    QTest::addColumn<QString>("word");  // empty: imports
    QTest::newRow("none") << "none" << "";
    QTest::newRow("clip") << "clip" << "attribute clip";
    QTest::newRow("layout") << "layout" << "attribute layout 1";
    QTest::newRow("activations") << "activations" << "attribute activations [Sigmoid, Tanh, Relu]";
    QTest::newRow("reverse") << "reverse" << "attribute direction 'reverse'";
    QTest::newRow("input_forget") << "input_forget" << "attribute input_forget 1";
    QTest::newRow("activation_alpha") << "activation_alpha" << "attribute 'activation_alpha'";
    QTest::newRow("peepholes") << "peepholes" << "input P (peepholes)";
    QTest::newRow("sequence_lens") << "sequence_lens" << "input sequence_lens";
    QTest::newRow("initial_h") << "initial_h" << "input initial_h 'h0' is not zeros";
    QTest::newRow("initial_c") << "initial_c" << "input initial_c 'c0' is not zeros";
    QTest::newRow("Y_h") << "Y_h" << "its output 1";
  }
  void recurrent_refusals() {
    QFETCH(QString, mutation);
    QFETCH(QString, word);
    const QString model = dir_.filePath("lstm-" + mutation + ".onnx");
    const char* script = R"(
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
mut, out = sys.argv[1], sys.argv[2]
rng = np.random.default_rng(1)
init = [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n)
        for n, s in (("W", [1, 16, 5]), ("R", [1, 16, 4]), ("B", [1, 32]))]
init.append(numpy_helper.from_array(np.array([1], np.int64), "axes"))
ins, attrs = ["xt", "W", "R", "B"], {"hidden_size": 4}
def extra(name, value, at):
    init.append(numpy_helper.from_array(value, name))
    while len(ins) < at:
        ins.append("")
    ins.append(name)
if mut == "clip": attrs["clip"] = 3.0
if mut == "layout": attrs["layout"] = 1
if mut == "activations": attrs["activations"] = ["Sigmoid", "Tanh", "Relu"]
if mut == "reverse": attrs["direction"] = "reverse"
if mut == "input_forget": attrs["input_forget"] = 1
if mut == "activation_alpha": attrs["activation_alpha"] = [1.0]
if mut == "peepholes": extra("P", np.zeros([1, 12], np.float32), 7)
if mut == "sequence_lens": extra("lens", np.full([2], 6, np.int32), 4)
if mut == "initial_h": extra("h0", np.ones([1, 2, 4], np.float32), 5)
if mut == "initial_c": extra("c0", np.ones([1, 2, 4], np.float32), 6)
outs = ["y4", "yh", "yc"]
nodes = [helper.make_node("Transpose", ["x"], ["xt"], "/lstm/Transpose", perm=[1, 0, 2]),
         helper.make_node("LSTM", ins, outs, "/lstm/LSTM", **attrs),
         helper.make_node("Squeeze", ["y4", "axes"], ["y3"], "/lstm/Squeeze"),
         helper.make_node("Transpose", ["y3"], ["y"], "/lstm/Transpose_1", perm=[1, 0, 2])]
outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 6, 4])]
if mut == "Y_h":
    nodes.append(helper.make_node("Identity", ["yh"], ["h"], "/h"))
    outputs.append(helper.make_tensor_value_info("h", TensorProto.FLOAT, None))
g = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 6, 5])],
                      outputs, init)
onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), out)
)";
    Process p = run(GN_PYTHON, {"-c", script, mutation, model});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    const QString out = dir_.filePath("lstm-" + mutation + ".json");
    p = run(GN_GPUNODES, {"import-onnx", model, "-o", out});
    if (word.isEmpty()) {
      QVERIFY2(p.exitCode == 0, qPrintable(p.err));
      bool lstm = false;
      for (const QJsonValue& v : readJson(out)["nodes"].toArray())
        lstm = lstm || (v["id"].toString() == "lstm" && v["type"].toString() == "LSTM");
      QVERIFY2(lstm, "no LSTM layer 'lstm' in the imported graph");
      return;
    }
    QVERIFY2(p.exitCode > 0, qPrintable(p.err));
    const QStringList lines = nonEmptyLines(p.err);
    QCOMPARE(lines.size(), 1);
    QVERIFY2(lines[0].contains("node '/lstm/LSTM' (LSTM)") && lines[0].contains(word), qPrintable(lines[0]));
    QVERIFY(!QFileInfo::exists(out));
  }

  // torch's nn.MultiheadAttention (attentionGraph(true) at opset 17) broken in one place each, with the Python
  // onnx package: q divided by 3, not sqrt(4), and the batch times 4 heads in the heads' shape (E / heads
  // left at 4) are refused naming the Div and the Reshape; a Softmax over another axis, and q read outside
  // the layer (a second graph output), are no pattern: the nodes are read one by one and the first one
  // gpunodes has no layer for, the Shape of the time-major sequence, is refused. The causal one (attentionGraph(true,
  // true)) with its mask from diagonal 0 (the Add in its 1 + Tk - Tq adding 0) hides each query's own key:
  // refused naming the Trilu. Cross-attention with v = k (crossAttentionGraph(false)) with q's rows of
  // in_proj_weight sliced from row 1, and with v wired (crossAttentionGraph(true)) with q divided by 3, not
  // sqrt(2): refused naming q's MatMul and the Div. The causal cross-attention of 9 keys for 6 queries
  // (crossAttentionGraph(false, true, 9)) with its mask from diagonal 3 (torch's 1 + Tk - Tq adding 0), the
  // self-attention's diagonal: refused naming the Trilu. One line, nothing written.
  void torch_attention_refusals_data() {
    QTest::addColumn<QString>("mutation");
    QTest::addColumn<QStringList>("words");
    QTest::newRow("scale") << "scale" << QStringList{"(Div)", "divides q by 3.000000, not sqrt(4)"};
    QTest::newRow("heads") << "heads" << QStringList{"(Reshape)", "into heads as [6, 4N, 4]"};
    QTest::newRow("softmax-axis") << "softmax-axis" << QStringList{"'/attn/Shape' (Shape)", "time-major"};
    QTest::newRow("q-read") << "q-read" << QStringList{"'/attn/Shape' (Shape)", "time-major"};
    QTest::newRow("diagonal") << "diagonal" << QStringList{"(Trilu)", "masks from diagonal [0], not 1"};
    QTest::newRow("cross-slice") << "cross-slice"
                                 << QStringList{"'/attn/MatMul' (MatMul)", "as rows [1] to [8] along [0] of [24, 8]"};
    QTest::newRow("cross-kv-scale") << "cross-kv-scale" << QStringList{"(Div)", "divides q by 3.000000, not sqrt(2)"};
    QTest::newRow("cross-causal-diagonal") << "cross-causal-diagonal"
                                           << QStringList{"'/attn/Trilu' (Trilu)", "masks from diagonal [3], not 4"};
    // The key padding mask (keyPaddingGraph(false, false)): arange(Tk) > lens, a guard of the lengths <= 1, the
    // key indices unsqueezed along 1 (a column, not a row), and the guard's Where left out.
    QTest::newRow("kpm-greater") << "kpm-greater"
                                 << QStringList{"'/attn/GreaterOrEqual' (Greater)", "compares the key indices with "
                                                "the valid lengths: torch writes a GreaterOrEqual there"};
    QTest::newRow("kpm-threshold") << "kpm-threshold" << QStringList{"(LessOrEqual)", "not <= 0"};
    QTest::newRow("kpm-row-axis") << "kpm-row-axis"
                                  << QStringList{"(Unsqueeze)", "the key indices' unsqueezed axis is [1], not [0]"};
    QTest::newRow("kpm-no-guard") << "kpm-no-guard"
                                  << QStringList{"'/attn/And' (And)", "no Where gives them out_proj's bias"};
  }
  void torch_attention_refusals() {
    QFETCH(QString, mutation);
    QFETCH(QStringList, words);
    const bool causal = mutation == "diagonal", cross = mutation.startsWith("cross-"), ownV = mutation == "cross-kv-scale",
               kpm = mutation.startsWith("kpm-"), crossCausal = mutation == "cross-causal-diagonal";
    const QString kind = causal        ? "torch-attention-causal"
                         : crossCausal ? "torch-attention-cross-causal-tk9"
                         : cross       ? (ownV ? "torch-attention-cross-kv" : "torch-attention-cross")
                         : kpm   ? "torch-attention-kpm"
                                 : "torch-attention";
    const QString model = dir_.filePath(kind + ".onnx");
    if (!QFileInfo::exists(model)) {
      const QString graphFile = dir_.filePath(kind + ".graph.json");
      QVERIFY(writeJson(graphFile, cross ? crossAttentionGraph(ownV, crossCausal, crossCausal ? 9 : 6)
                                   : kpm ? keyPaddingGraph(false, false)
                                         : attentionGraph(true, causal)));
      const QString weights = dir_.filePath(kind + ".safetensors");
      Process p = run(GN_PYTHON, {GN_TORCH_PEER, "save", graphFile + "#net", "5", weights});
      QVERIFY2(p.exitCode == 0, qPrintable(p.err));
      p = run(GN_PYTHON, {GN_ONNX_PEER, "export", graphFile + "#net", weights, "17", model, "dynamic"});
      QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    }
    const char* script = R"(
import sys
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper
src, mut, out = sys.argv[1:]
m = onnx.load(src)
g = m.graph
made = {o: n for n in g.node for o in n.output}
def const(name):
    n = made.get(name)
    return numpy_helper.to_array(n.attribute[0].t) if n is not None and n.op_type == "Constant" else None
def set_const(name, value):
    t = made[name].attribute[0].t
    t.CopyFrom(numpy_helper.from_array(np.array(value, dtype=numpy_helper.to_array(t).dtype)))
def is_batch(v):  # Gather of axis 1 of a time-major Shape: the batch
    n = made.get(v)
    return n is not None and n.op_type == "Gather" and const(n.input[1]) is not None and const(n.input[1]).tolist() == 1
if mut in ("scale", "cross-kv-scale"):
    div = next(n for n in g.node if n.op_type == "Div" and const(n.input[1]) is not None
               and const(n.input[1]).dtype == np.float32)
    set_const(div.input[1], 3.0)
if mut == "heads":
    mul = next(n for n in g.node if n.op_type == "Mul" and is_batch(n.input[0]) and const(n.input[1]) is not None)
    set_const(mul.input[1], 4)
if mut == "softmax-axis":
    next(n for n in g.node if n.op_type == "Softmax").attribute[0].i = 1
if mut == "q-read":
    q = next(n for n in g.node if n.op_type == "Slice")
    g.node.append(helper.make_node("Identity", [q.output[0]], ["q_out"], "/q_out"))
    g.output.append(helper.make_tensor_value_info("q_out", TensorProto.FLOAT, None))
if mut in ("diagonal", "cross-causal-diagonal"):
    tri = next(n for n in g.node if n.op_type == "Trilu")
    add = made[made[tri.input[1]].input[0]]
    set_const(next(i for i in add.input if const(i) is not None), 0)
if mut == "cross-slice":  # the first Slice of in_proj_weight (q's rows) from row 1
    sl = next(n for n in g.node if n.op_type == "Slice" and n.input[0].endswith("in_proj_weight"))
    set_const(sl.input[1], [1])
if mut == "kpm-greater":
    next(n for n in g.node if n.op_type == "GreaterOrEqual").op_type = "Greater"
if mut == "kpm-threshold":
    set_const(next(n for n in g.node if n.op_type == "LessOrEqual").input[1], 1.0)
if mut == "kpm-row-axis":  # the Unsqueeze of the Range of key indices
    rng = next(n for n in g.node if n.op_type == "Range")
    set_const(next(n for n in g.node if n.op_type == "Unsqueeze" and n.input[0] == rng.output[0]).input[1], [1])
if mut == "kpm-no-guard":  # the Linear after the layer reads the attention's output past the guard's Where
    where = made[made["logits"].input[1] if made["logits"].input[0] == "fc.bias" else made["logits"].input[0]].input[0]
    for n in g.node:
        n.input[:] = [made[where].input[2] if i == where else i for i in n.input]
onnx.save(m, out)
)";
    const QString broken = dir_.filePath("torch-attention-" + mutation + ".onnx");
    Process p = run(GN_PYTHON, {"-c", script, model, mutation, broken});
    QVERIFY2(p.exitCode == 0, qPrintable(p.err));
    const QString out = dir_.filePath("torch-attention-" + mutation + ".json");
    p = run(GN_GPUNODES, {"import-onnx", broken, "-o", out});
    QCOMPARE(p.exitCode, 1);
    const QStringList lines = nonEmptyLines(p.err);
    QCOMPARE(lines.size(), 1);
    for (const QString& w : words) QVERIFY2(lines[0].contains(w), qPrintable(w + " not in: " + lines[0]));
    QVERIFY(!QFileInfo::exists(out));
    QVERIFY(!QFileInfo::exists(dir_.filePath("torch-attention-" + mutation + ".safetensors")));
  }

  // An operator gpunodes has no layer for: one error line naming the op type, the node, the opset and the
  // supported operators, and nothing written.
  void unknown_operator_is_refused_data() {
    QTest::addColumn<QString>("file");
    QTest::addColumn<QString>("op");
    QTest::addColumn<QString>("nodeName");
    QTest::newRow("LRN") << "unknown-op-lrn.onnx" << "LRN" << "norm1";
    QTest::newRow("Einsum") << "unknown-op-einsum.onnx" << "Einsum" << "pairs";
  }
  void unknown_operator_is_refused() {
    QFETCH(QString, file);
    QFETCH(QString, op);
    QFETCH(QString, nodeName);
    const QString out = dir_.filePath("unknown-" + op + ".json");
    const Process p = run(GN_GPUNODES, {"import-onnx", GN_HOSTILE_ONNX_DIR "/" + file, "-o", out});
    QVERIFY2(p.exitCode > 0, qPrintable(p.err));
    const QStringList lines = nonEmptyLines(p.err);
    QCOMPARE(lines.size(), 1);
    const QString& line = lines[0];
    QVERIFY2(line.contains("operator " + op + " (opset 17) is not supported"), qPrintable(line));
    QVERIFY2(line.contains("'" + nodeName + "'"), qPrintable(line));
    for (const char* known : {"Conv", "BatchNormalization", "Gemm", "MaxPool", "LayerNormalization", "Softmax"})
      QVERIFY2(line.contains(known), qPrintable(QStringLiteral("the list lacks %1: %2").arg(known, line)));
    QVERIFY(!QFileInfo::exists(out));
    QVERIFY(!QFileInfo::exists(dir_.filePath("unknown-" + op + ".safetensors")));
  }
};

QTEST_GUILESS_MAIN(OnnxImportTest)
#include "test_onnx_import.moc"
