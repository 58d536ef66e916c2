// The networks the ONNX suites send both ways (test_onnx_import from torch's export, test_onnx_export through
// onnxruntime and back), written once so that both check the same layers.
#pragma once
#include <QJsonArray>
#include <QJsonObject>

#include "interop_util.h"

namespace onnx_networks {

using interop::graphOf;
using interop::node;
using interop::wire;

// Every layer type gpunodes has that an ONNX graph can express, with branches: a Conv read three times (a
// BatchNorm + GELU + grouped bias-free Conv + Tanh + MaxPool branch, an AvgPool + Sigmoid branch joined to it by
// Concat, a strided 1x1 projection added to that), a padded AvgPool (torch writes a Pad before it), the global
// pool, Flatten, Linear, BatchNorm1d, Dropout (the identity in evaluation), LayerNorm, a square Linear, Reshape,
// Transpose, Softmax, a LayerNorm without scale and bias (eps 1e-3; below opset 17 only: torch 1.13 writes it at
// opset 17 as a LayerNormalization without its Scale input, which its own checker refuses), Reshape with -1 and
// an unbiased Linear. Params off their defaults (a BatchNorm momentum, a LayerNorm eps) show that they cross
// the format too.
inline QJsonObject everyLayerGraph(int opset) {
  QJsonArray nodes{
      node("x", "Input", {{"shape", QJsonArray{3, 12, 12}}}),
      node("c1", "Conv2d", {{"out_channels", 8}, {"kernel_size", 3}, {"padding", 1}}),
      node("bn", "BatchNorm2d", {{"momentum", 0.3}}),
      node("gelu", "GELU"),
      node("dw", "Conv2d", {{"out_channels", 8}, {"kernel_size", 3}, {"padding", 1}, {"groups", 4}, {"bias", false}}),
      node("tanh", "Tanh"),
      node("mp", "MaxPool2d", {{"kernel_size", 3}, {"stride", 2}, {"padding", 1}}),
      node("ap", "AvgPool2d", {{"kernel_size", 2}, {"stride", 2}}),
      node("sig", "Sigmoid"),
      node("cat", "Concat"),
      node("proj", "Conv2d", {{"out_channels", 16}, {"kernel_size", 1}, {"stride", 2}}),
      node("sum", "Add"),
      node("relu", "ReLU"),
      node("ap2", "AvgPool2d", {{"kernel_size", 3}, {"stride", 1}, {"padding", 1}}),
      node("gap", "GlobalAvgPool2d"),
      node("flat", "Flatten"),
      node("fc1", "Linear", {{"out_features", 32}}),
      node("bn1", "BatchNorm1d", {{"eps", 1e-3}, {"momentum", 0.2}}),
      node("drop", "Dropout", {{"p", 0.3}}),
      node("ln", "LayerNorm", {{"normalized_shape", 32}, {"eps", 1e-4}}),
      node("sq", "Linear", {{"out_features", 32}}),
      node("rs", "Reshape", {{"shape", QJsonArray{4, 8}}}),
      node("tr", "Transpose", {{"dim0", 0}, {"dim1", 1}}),
      node("sm", "Softmax"),
      node("ln2", "LayerNorm", {{"normalized_shape", 4}, {"eps", 1e-3}, {"elementwise_affine", false}}),
      node("rs2", "Reshape", {{"shape", QJsonArray{-1}}}),
      node("fc2", "Linear", {{"out_features", 5}, {"bias", false}}),
      node("net", "Network", {{"init", "kaiming"}, {"seed", 3}}),
  };
  QJsonArray wires{wire("x.out", "c1.in"),     wire("c1.out", "bn.in"),    wire("bn.out", "gelu.in"),
                   wire("gelu.out", "dw.in"),  wire("dw.out", "tanh.in"),  wire("tanh.out", "mp.in"),
                   wire("c1.out", "ap.in"),    wire("ap.out", "sig.in"),   wire("mp.out", "cat.a"),
                   wire("sig.out", "cat.b"),   wire("c1.out", "proj.in"),  wire("cat.out", "sum.a"),
                   wire("proj.out", "sum.b"),  wire("sum.out", "relu.in"), wire("relu.out", "ap2.in"),
                   wire("ap2.out", "gap.in"),  wire("gap.out", "flat.in"), wire("flat.out", "fc1.in"),
                   wire("fc1.out", "bn1.in"),  wire("bn1.out", "drop.in"), wire("drop.out", "ln.in"),
                   wire("ln.out", "sq.in"),    wire("sq.out", "rs.in"),    wire("rs.out", "tr.in"),
                   wire("tr.out", "sm.in"),    wire("sm.out", "ln2.in"),   wire("ln2.out", "rs2.in"),   wire("rs2.out", "fc2.in"),
                   wire("fc2.out", "net.out")};
  if (opset >= 17) {  // sm -> rs2 directly
    for (qsizetype i = 0; i < nodes.size(); ++i)
      if (nodes[i].toObject()["id"].toString() == "ln2") nodes.removeAt(i--);
    for (qsizetype i = 0; i < wires.size(); ++i) {
      const QJsonObject w = wires[i].toObject();
      if (w["to"].toString() == "ln2.in") wires[i] = wire("sm.out", "rs2.in");
      else if (w["from"].toString() == "ln2.out") wires.removeAt(i--);
    }
  }
  return graphOf(nodes, wires);
}

}  // namespace onnx_networks
