// Drawn networks (Arch::Network): the layers of a NetworkSpec run as a graph.
#include <algorithm>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "gpunodes/errors.h"
#include "layer_modules.h"

namespace gn::nn {

namespace {

// How a drawn network runs where it has the built-in networks' structure, so that a drawn ResNet-18 runs as
// the built-in one does (model.cpp's ResidualM):
// - fusions: a BatchNorm2d read only by a ReLU computes the ReLU too; one read only by an Add whose only
//   reader is a ReLU computes relu(bn(x) + shortcut). The group's last layer (the ReLU) runs it; the batch
//   norm and the Add it absorbs make no tensor of their own, so neither their outputs nor the ReLU's input
//   are kept for backward.
// - layouts: on a device with a blocked layout, the outputs between convolutions and a global pooling stay
//   in it (the reorders happen only at those edges). An output is blocked when its layer can write it (a
//   convolution, a batch norm or fused group, an activation or an Add of blocked inputs) and every reader
//   can read it (a convolution, a global pooling, or one of the former that is blocked too); the network's
//   last output and everything else stay NCHW.
struct GraphPlan {
  std::vector<int> fused_bn;    // at a group's last layer: the batch norm that computes the group; else -1
  std::vector<int> shortcut;    // at a group's last layer: the Add's other input, or -1
  std::vector<int> absorbed_by; // at the batch norm and the Add of a group: its last layer; else -1
  std::vector<Layout> layout;   // each output's
};

// Whether a tensor of `channels` channels can take `device`'s blocked layout. The CPU's block is the same
// in every precision, or the channels themselves (bf16 NHWC on AMX), so fp32's answer holds for all. CUDA's
// NHWC takes any count, but only the built-in ResNet-18's widths (multiples of 64) have been through it, and
// cuDNN's fast NHWC paths want multiples of 8: other counts stay NCHW there, so that a drawn network adds no
// untried path to a first GPU run.
bool blockable(Device device, int64_t channels) {
  if (device.is_cuda() && channels % 8 != 0) return false;
  ScopedPrecision fp32(Precision::Fp32);
  try {
    layout_block(Layout::Blocked, device, channels);
    return true;
  } catch (const ShapeError&) {
    return false;
  }
}

GraphPlan plan_graph(const NetworkSpec& net, const std::vector<LayerInfo>& info, Device device,
                     bool has_blocked) {
  const int n = static_cast<int>(net.layers.size());
  auto L = [&](int i) -> const LayerSpec& { return net.layers[static_cast<size_t>(i)]; };
  std::vector<std::vector<int>> readers(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i)
    for (int j : L(i).inputs)
      if (j >= 0) readers[static_cast<size_t>(j)].push_back(i);
  auto only_reader = [&](int j) { return readers[static_cast<size_t>(j)].size() == 1; };
  GraphPlan p{std::vector<int>(static_cast<size_t>(n), -1), std::vector<int>(static_cast<size_t>(n), -1),
              std::vector<int>(static_cast<size_t>(n), -1), std::vector<Layout>(static_cast<size_t>(n), Layout::Nchw)};
  auto at = [](std::vector<int>& v, int i) -> int& { return v[static_cast<size_t>(i)]; };
  for (int i = 0; i < n; ++i) {
    const LayerSpec& relu = L(i);
    if (relu.kind != LayerKind::ReLU || relu.inputs.empty() || relu.inputs[0] < 0 || !only_reader(relu.inputs[0]))
      continue;
    const int in = relu.inputs[0];
    if (L(in).kind == LayerKind::BatchNorm2d && at(p.absorbed_by, in) < 0) {
      at(p.fused_bn, i) = in;
      at(p.absorbed_by, in) = i;
    } else if (L(in).kind == LayerKind::Add && L(in).inputs.size() == 2 && L(in).inputs[0] >= 0 && L(in).inputs[1] >= 0) {
      for (int k = 0; k < 2; ++k) {
        const int bn = L(in).inputs[static_cast<size_t>(k)], other = L(in).inputs[static_cast<size_t>(1 - k)];
        if (bn == other || L(bn).kind != LayerKind::BatchNorm2d || !only_reader(bn) || at(p.absorbed_by, bn) >= 0 ||
            info[static_cast<size_t>(bn)].out != info[static_cast<size_t>(other)].out)
          continue;
        at(p.fused_bn, i) = bn;
        at(p.shortcut, i) = other;
        at(p.absorbed_by, bn) = at(p.absorbed_by, in) = i;
        break;
      }
    }
  }
  if (!has_blocked) return p;
  // What a layer does with layouts: converts (reads any, writes either), reads any and writes NCHW, keeps its
  // inputs' layout, or takes NCHW only.
  enum class Role { Converts, Reads, Keeps, Nchw };
  auto role = [&](int i) {
    const LayerSpec& l = L(i);
    switch (l.kind) {
      case LayerKind::Conv2d:
        return l.groups == 1 ? Role::Converts : Role::Nchw;
      case LayerKind::GlobalAvgPool2d:
        return Role::Reads;
      case LayerKind::BatchNorm2d:
      case LayerKind::ReLU:
      case LayerKind::Sigmoid:
      case LayerKind::Tanh:
      case LayerKind::GELU:
      case LayerKind::Add:
        return Role::Keeps;
      default:
        return Role::Nchw;
    }
  };
  // The inputs a layer reads as tensors: a group's last layer reads its batch norm's input and the shortcut.
  auto inputs_of = [&](int i) {
    std::vector<int> r;
    if (at(p.fused_bn, i) >= 0) {
      r.push_back(L(at(p.fused_bn, i)).inputs[0]);
      if (at(p.shortcut, i) >= 0) r.push_back(at(p.shortcut, i));
    } else {
      for (int j : L(i).inputs)
        if (j >= 0) r.push_back(j);
    }
    return r;
  };
  std::vector<bool> blocked(static_cast<size_t>(n), false);
  for (int i = 0; i + 1 < n; ++i) {
    const Shape& s = info[static_cast<size_t>(i)].out;
    const Role r = role(i);
    blocked[static_cast<size_t>(i)] = at(p.absorbed_by, i) < 0 && (r == Role::Converts || r == Role::Keeps) &&
                                      s.size() == 3 && blockable(device, s[0]);
  }
  // Only ever unblocks, so it ends; what is left satisfies every reader and writer.
  for (bool changed = true; changed;) {
    changed = false;
    for (int i = 0; i < n; ++i) {
      if (!blocked[static_cast<size_t>(i)]) continue;
      bool ok = true;
      if (role(i) == Role::Keeps)
        for (int j : inputs_of(i)) ok = ok && blocked[static_cast<size_t>(j)];
      for (int r : readers[static_cast<size_t>(i)]) {
        const int reader = at(p.absorbed_by, r) >= 0 ? at(p.absorbed_by, r) : r;
        const Role rr = role(reader);
        ok = ok && (rr == Role::Converts || rr == Role::Reads || (rr == Role::Keeps && blocked[static_cast<size_t>(reader)]));
      }
      if (!ok) blocked[static_cast<size_t>(i)] = false, changed = true;
    }
  }
  for (int i = 0; i < n; ++i)
    if (blocked[static_cast<size_t>(i)]) p.layout[static_cast<size_t>(i)] = Layout::Blocked;
  return p;
}

// A drawn network: layers in construction order, each reading earlier layers' outputs. Forward hands each
// output to its readers and drops it after the last one; backward walks the layers in reverse and sums the
// gradients of outputs read more than once (a residual branch). The plan above fuses and lays out.
class GraphM final : public Module {
 public:
  GraphM(Builder& b, const NetworkSpec& net, uint64_t seed)
      : net_(net),
        info_(net.infer()),
        plan_(plan_graph(net_, info_, b.device(), b.activation_layout() == Layout::Blocked)) {
    const size_t n = net_.layers.size();
    modules_.resize(n);
    uses_.assign(n, 0);
    needs_grad_.assign(n, false);
    fused_.assign(n, nullptr);
    for (size_t i = 0; i < n; ++i) {
      const LayerSpec& l = net_.layers[i];
      const Shape in = l.inputs.empty() ? Shape{} : info_[static_cast<size_t>(l.inputs[0])].out;
      modules_[i] = make_module(b, l, in, static_cast<int>(i), splitmix64(seed ^ splitmix64(0x6e6574ull + i)));
      for (int j : l.inputs)
        if (j >= 0) ++uses_[static_cast<size_t>(j)];
      // A layer's output needs a gradient when it or anything before it has parameters; ValidLength's
      // lengths never do (whole numbers, no gradient reaches them).
      bool need = modules_[i] && modules_[i]->has_params();
      for (int j : l.inputs) need = need || (j >= 0 && needs_grad_[static_cast<size_t>(j)]);
      needs_grad_[i] = need && l.kind != LayerKind::ValidLength;
    }
    for (size_t i = 0; i < n; ++i)
      if (const int bn = plan_.fused_bn[i]; bn >= 0)
        fused_[i] = static_cast<BatchNorm2dM*>(modules_[static_cast<size_t>(bn)].get());
  }

  Tensor forward(const Tensor& x, Mode mode) override {
    const size_t n = net_.layers.size();
    std::vector<Tensor> out(n);
    std::vector<int> left = uses_;
    auto done_with = [&](int j) {
      if (j >= 0 && --left[static_cast<size_t>(j)] == 0) out[static_cast<size_t>(j)] = Tensor();
    };
    for (size_t i = 0; i < n; ++i) {
      const LayerSpec& l = net_.layers[i];
      if (plan_.absorbed_by[i] >= 0) continue;  // its group's last layer computes it
      if (BatchNorm2dM* bn = fused_[i]) {
        const int x_in = bn_input(i), s = plan_.shortcut[i];
        out[i] = bn->forward(out[static_cast<size_t>(x_in)], s >= 0 ? out[static_cast<size_t>(s)] : Tensor(), mode);
        done_with(x_in);
        done_with(s);
        continue;
      }
      static const Tensor open;  // an open port
      auto in = [&](size_t k) -> const Tensor& { return l.inputs[k] < 0 ? open : out[static_cast<size_t>(l.inputs[k])]; };
      switch (l.kind) {
        case LayerKind::Input:
          out[i] = x;
          break;
        case LayerKind::Add:
          out[i] = add_activations(in(0), in(1));
          break;
        case LayerKind::Concat:
          out[i] = concat_channels(in(0), in(1));
          break;
        default: {
          std::vector<Tensor> xs;
          for (size_t k = 0; k < l.inputs.size(); ++k) xs.push_back(in(k));
          out[i] = modules_[i]->forward_inputs(xs, mode);
        }
      }
      for (int j : l.inputs) done_with(j);
    }
    return out.back();
  }

  Tensor backward(const Tensor& dy, bool need_dx) override {
    const size_t n = net_.layers.size();
    std::vector<Tensor> grad(n);
    grad.back() = dy;
    auto give = [&](int j, Tensor g) {
      Tensor& slot = grad[static_cast<size_t>(j)];
      slot = slot.defined() ? add_activations(slot, g) : std::move(g);
    };
    auto wanted = [&](int j) { return j >= 0 && needs_grad_[static_cast<size_t>(j)]; };
    Tensor dx;
    for (size_t i = n; i-- > 0;) {
      const LayerSpec& l = net_.layers[i];
      if (plan_.absorbed_by[i] >= 0) continue;  // its group's last layer differentiates it
      Tensor g = std::move(grad[i]);
      if (BatchNorm2dM* bn = fused_[i]) {
        const int x_in = bn_input(i), s = plan_.shortcut[i];
        if (!g.defined()) {
          bn->clear();
          continue;
        }
        BatchNormGrads d = bn->backward_with_residual(g, wanted(s));
        if (wanted(x_in)) give(x_in, std::move(d.dx));
        if (wanted(s)) give(s, std::move(d.dresidual));
        continue;
      }
      if (!g.defined()) {  // nothing after it needed a gradient
        if (modules_[i]) modules_[i]->clear();
        continue;
      }
      auto wants = [&](size_t k) { return wanted(l.inputs[k]); };
      switch (l.kind) {
        case LayerKind::Input:
          dx = g;
          break;
        case LayerKind::Add:
          if (wants(0)) give(l.inputs[0], g);
          if (wants(1)) give(l.inputs[1], g);
          break;
        case LayerKind::Concat: {
          auto [ga, gb] = split_channels(g, info_[static_cast<size_t>(l.inputs[0])].out[0]);
          if (wants(0)) give(l.inputs[0], ga);
          if (wants(1)) give(l.inputs[1], gb);
          break;
        }
        default: {
          std::vector<bool> need(l.inputs.size());
          bool any = false;
          for (size_t k = 0; k < need.size(); ++k) any = (need[k] = wants(k)) || any;
          if (!any && !modules_[i]->has_params()) {
            modules_[i]->clear();
            break;
          }
          std::vector<Tensor> d = modules_[i]->backward_inputs(g, need);
          for (size_t k = 0; k < need.size(); ++k)
            if (need[k]) give(l.inputs[k], std::move(d.at(k)));
        }
      }
    }
    return need_dx ? dx : Tensor();
  }

  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    for (size_t i = 0; i < modules_.size(); ++i)
      if (modules_[i]) modules_[i]->collect(prefix + net_.layers[i].id + ".", out);
  }
  void collect_attention(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const override {
    for (size_t i = 0; i < modules_.size(); ++i)
      if (modules_[i]) modules_[i]->collect_attention(prefix + net_.layers[i].id, out);
  }
  bool has_params() const override {
    for (const auto& m : modules_)
      if (m && m->has_params()) return true;
    return false;
  }
  void clear() override {
    for (const auto& m : modules_)
      if (m) m->clear();
  }
  void carry_state(bool on) override {
    for (const auto& m : modules_)
      if (m) m->carry_state(on);
  }
  void reset_state() override {
    for (const auto& m : modules_)
      if (m) m->reset_state();
  }
  Shape out_shape(const Shape& in) const override {
    Shape s = info_.back().out;
    s.insert(s.begin(), in.empty() ? 1 : in[0]);
    return s;
  }
  std::string describe() const override { return "Network"; }
  void summarize(const std::string& prefix, Shape& shape, std::ostringstream& out) const override {
    (void)prefix;
    for (size_t i = 0; i < modules_.size(); ++i) {
      const LayerSpec& l = net_.layers[i];
      Shape s = info_[i].out;
      s.insert(s.begin(), 1);
      out << l.id << " " << (modules_[i] ? modules_[i]->describe() : std::string(layer_kind_name(l.kind)))
          << " -> " << shape_str(s) << "\n";
    }
    shape = out_shape(shape);
  }

 private:
  // The batch norm's input of the group that layer i ends.
  int bn_input(size_t i) const { return net_.layers[static_cast<size_t>(plan_.fused_bn[i])].inputs[0]; }
  Layout layout_of(int layer) const { return layer < 0 ? Layout::Nchw : plan_.layout[static_cast<size_t>(layer)]; }

  // The module behind layer i; null for Input, Add and Concat, which forward and backward do themselves. A
  // convolution, batch norm or global pooling takes the layouts of the plan; a batch norm a group absorbs
  // fuses the group's ReLU and writes in the group's layout.
  std::unique_ptr<Module> make_module(Builder& b, const LayerSpec& l, const Shape& in, int i, uint64_t seed) const {
    const int in0 = l.inputs.empty() ? -1 : l.inputs[0];
    switch (l.kind) {
      case LayerKind::Input:
      case LayerKind::Add:
      case LayerKind::Concat:
        return nullptr;
      case LayerKind::Conv2d:
        return std::make_unique<Conv2dM>(
            b, in[0], l.features, l.kernel, Conv2dOptions{l.stride, l.padding, l.groups, layout_of(in0), layout_of(i)},
            l.bias);
      case LayerKind::BatchNorm2d:
      case LayerKind::BatchNorm1d: {
        const int group = plan_.absorbed_by[static_cast<size_t>(i)];
        return std::make_unique<BatchNorm2dM>(b, in[0], static_cast<float>(l.eps), static_cast<float>(l.momentum),
                                              l.kind == LayerKind::BatchNorm1d, layout_of(group >= 0 ? group : i),
                                              group >= 0);
      }
      case LayerKind::ReLU:
        return std::make_unique<ActivationM>(Activation::Relu);
      case LayerKind::Sigmoid:
        return std::make_unique<ActivationM>(Activation::Sigmoid);
      case LayerKind::Tanh:
        return std::make_unique<ActivationM>(Activation::Tanh);
      case LayerKind::GELU:
        return std::make_unique<ActivationM>(Activation::Gelu);
      case LayerKind::MaxPool2d:
      case LayerKind::AvgPool2d:
        return std::make_unique<PoolM>(
            Pool2dOptions{l.kind == LayerKind::MaxPool2d ? PoolKind::Max : PoolKind::Avg, l.kernel,
                          l.pool_stride(), l.padding});
      case LayerKind::GlobalAvgPool2d:
        return std::make_unique<GlobalAvgPoolM>(layout_of(in0));
      case LayerKind::Flatten:
        return std::make_unique<FlattenM>();
      case LayerKind::Linear:
        return std::make_unique<LinearM>(b, in.back(), l.features, l.bias);
      case LayerKind::Dropout:
        return std::make_unique<DropoutM>(static_cast<float>(l.p), seed, b.train_forwards());
      case LayerKind::Embedding:
      case LayerKind::OneHot:
      case LayerKind::RNN:
      case LayerKind::GRU:
      case LayerKind::LSTM:
      case LayerKind::Reshape:
      case LayerKind::Transpose:
      case LayerKind::LastStep:
        return make_sequence_module(b, l, in, seed);
      case LayerKind::LayerNorm:
      case LayerKind::MultiheadAttention:
      case LayerKind::BatchMatMul:
      case LayerKind::Softmax:
      case LayerKind::Mul:
      case LayerKind::Scale:
      case LayerKind::PositionalEncoding:
      case LayerKind::PositionEmbedding:
      case LayerKind::ClassToken:
      case LayerKind::FirstStep:
      case LayerKind::NadarayaWatson:
      case LayerKind::ValidLength:
        return make_attention_module(b, l, in, seed);
    }
    throw Error("unknown layer type");
  }

  NetworkSpec net_;
  std::vector<LayerInfo> info_;
  GraphPlan plan_;
  std::vector<std::unique_ptr<Module>> modules_;
  std::vector<BatchNorm2dM*> fused_;  // at a group's last layer: modules_[plan_.fused_bn]
  std::vector<int> uses_;  // how many inputs read each layer's output
  std::vector<bool> needs_grad_;
};

}  // namespace

std::unique_ptr<Module> make_graph_module(Builder& b, const NetworkSpec& net, uint64_t seed) {
  return std::make_unique<GraphM>(b, net, seed);
}

}  // namespace gn::nn
