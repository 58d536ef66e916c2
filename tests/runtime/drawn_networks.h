// Drawn networks for the runtime's tests and train_bench: a NetworkSpec builder with named wires, and d2l's
// LeNet and the seed's ResNet-18 as the examples draw them (resources/examples/lenet-layers.json,
// resnet18-layers.json). Qt-free, so that the benchmarks can use it.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpunodes/nn/network.h"

namespace gn::nn {

// Appends layers to a NetworkSpec, each with the inputs named (nn_test_util.h's Net wires the one before by
// default); returns each layer's index for the layers that read it.
struct WiredNet {
  NetworkSpec spec;
  int add(const std::string& id, LayerKind kind, std::vector<int> inputs = {},
          const std::function<void(LayerSpec&)>& set = {}) {
    LayerSpec l;
    l.id = id;
    l.kind = kind;
    l.inputs = std::move(inputs);
    if (set) set(l);
    spec.layers.push_back(l);
    return static_cast<int>(spec.layers.size()) - 1;
  }
  std::shared_ptr<const NetworkSpec> ptr() const { return std::make_shared<const NetworkSpec>(spec); }
};

inline auto conv(int64_t out, int64_t k, int64_t stride = 1, int64_t pad = 0) {
  return [=](LayerSpec& l) { l.features = out, l.kernel = k, l.stride = stride, l.padding = pad; };
}
inline auto features(int64_t out) {
  return [=](LayerSpec& l) { l.features = out; };
}
inline auto pool(int64_t k) {
  return [=](LayerSpec& l) { l.kernel = k, l.stride = 0; };
}
inline auto input(Shape s) {
  return [=](LayerSpec& l) { l.shape = s; };
}

// d2l's LeNet, as resources/examples/lenet-layers.json draws it.
inline NetworkSpec lenet() {
  WiredNet n;
  int h = n.add("x", LayerKind::Input, {}, input({1, 28, 28}));
  h = n.add("conv1", LayerKind::Conv2d, {h}, conv(6, 5, 1, 2));
  h = n.add("sig1", LayerKind::Sigmoid, {h});
  h = n.add("pool1", LayerKind::AvgPool2d, {h}, pool(2));
  h = n.add("conv2", LayerKind::Conv2d, {h}, conv(16, 5));
  h = n.add("sig2", LayerKind::Sigmoid, {h});
  h = n.add("pool2", LayerKind::AvgPool2d, {h}, pool(2));
  h = n.add("flat", LayerKind::Flatten, {h});
  h = n.add("fc1", LayerKind::Linear, {h}, features(120));
  h = n.add("sig3", LayerKind::Sigmoid, {h});
  h = n.add("fc2", LayerKind::Linear, {h}, features(84));
  h = n.add("sig4", LayerKind::Sigmoid, {h});
  n.add("fc3", LayerKind::Linear, {h}, features(10));
  return n.spec;
}

// The seed's ResNet-18, drawn as resources/examples/resnet18-layers.json draws it: the layers of each block
// in the order a walk from the output reaches them (main path, then the shortcut).
// The name resnet18() gives a parameter of the built-in ResNet-18: "0.weight" is "conv0.weight",
// "resnet_block2.0.conv3.bias" is "s2b0_conv3.bias".
inline std::string drawn_resnet18_name(const std::string& builtin) {
  const std::string block = "resnet_block";
  if (builtin.rfind(block, 0) == 0)  // resnet_block<S>.<B>.<layer>.<what>
    return "s" + builtin.substr(block.size(), 1) + "b" + builtin.substr(block.size() + 2, 1) + "_" +
           builtin.substr(block.size() + 4);
  if (builtin.rfind("fc.1.", 0) == 0) return "fc." + builtin.substr(5);
  return (builtin[0] == '0' ? "conv0" : "bn0") + builtin.substr(1);
}

inline NetworkSpec resnet18(int64_t channels, int64_t side = 16) {
  WiredNet n;
  int h = n.add("x", LayerKind::Input, {}, input({channels, side, side}));
  h = n.add("conv0", LayerKind::Conv2d, {h}, conv(64, 3, 1, 1));
  h = n.add("bn0", LayerKind::BatchNorm2d, {h});
  h = n.add("relu0", LayerKind::ReLU, {h});
  const int64_t widths[] = {64, 128, 256, 512};
  for (int s = 0; s < 4; ++s)
    for (int b = 0; b < 2; ++b) {
      const std::string p = "s" + std::to_string(s + 1) + "b" + std::to_string(b) + "_";
      const bool project = s > 0 && b == 0;
      int m = n.add(p + "conv1", LayerKind::Conv2d, {h}, conv(widths[s], 3, project ? 2 : 1, 1));
      m = n.add(p + "bn1", LayerKind::BatchNorm2d, {m});
      m = n.add(p + "relu1", LayerKind::ReLU, {m});
      m = n.add(p + "conv2", LayerKind::Conv2d, {m}, conv(widths[s], 3, 1, 1));
      m = n.add(p + "bn2", LayerKind::BatchNorm2d, {m});
      const int shortcut = project ? n.add(p + "conv3", LayerKind::Conv2d, {h}, conv(widths[s], 1, 2)) : h;
      m = n.add(p + "add", LayerKind::Add, {m, shortcut});
      h = n.add(p + "relu2", LayerKind::ReLU, {m});
    }
  h = n.add("gap", LayerKind::GlobalAvgPool2d, {h});
  h = n.add("flat", LayerKind::Flatten, {h});
  n.add("fc", LayerKind::Linear, {h}, features(10));
  return n.spec;
}

// The graph plan's awkward cases (graph_module.cpp), on a [3, 6, 6] input with 3 classes: a batch norm whose
// ReLU's output is read twice (fused, the ReLU's output a branch point), a shortcut computed after the batch
// norm it is added to, a shortcut that is the batch norm's own input, a batch norm read twice (not fused), an
// Add with no ReLU after it (not fused), and a blocked region ending at a Flatten instead of a pooling; 16
// channels take the blocked layout of every CPU. With `plain`, a Scale(1) after each batch norm, which the
// plan can neither fuse nor lay out (everything runs unfused in NCHW) and which changes no value; it draws the
// same weights (Scale has none).
inline NetworkSpec plan_cases(bool plain) {
  WiredNet n;
  auto bn = [&](const std::string& id, int from) {
    const int h = n.add(id, LayerKind::BatchNorm2d, {from});
    return plain ? n.add(id + "_plain", LayerKind::Scale, {h}, [](LayerSpec& l) { l.scale = 1; }) : h;
  };
  const int in = n.add("in", LayerKind::Input, {}, input({3, 6, 6}));
  const int stem = n.add("stem", LayerKind::Conv2d, {in}, conv(16, 3, 1, 1));
  const int r0 = n.add("relu0", LayerKind::ReLU, {bn("bn0", stem)});
  const int c1 = n.add("c1", LayerKind::Conv2d, {r0}, conv(16, 3, 1, 1));
  const int bn1 = bn("bn1", c1);
  const int late = n.add("late", LayerKind::Conv2d, {r0}, conv(16, 1));  // after bn1, added to it
  const int r1 = n.add("relu1", LayerKind::ReLU, {n.add("add1", LayerKind::Add, {bn1, late})});
  const int r2 = n.add("relu2", LayerKind::ReLU, {n.add("add2", LayerKind::Add, {bn("bn2", r1), r1})});
  const int bn3 = bn("bn3", r2);
  const int twice = n.add("twice", LayerKind::Add, {bn3, bn3});
  int h = n.add("tanh", LayerKind::Tanh, {n.add("plain_add", LayerKind::Add, {twice, r0})});
  h = n.add("flat", LayerKind::Flatten, {n.add("last", LayerKind::Conv2d, {h}, conv(4, 3))});
  n.add("fc", LayerKind::Linear, {h}, features(3));
  return n.spec;
}

}  // namespace gn::nn
