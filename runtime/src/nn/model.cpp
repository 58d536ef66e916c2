// The modules behind Model: a small tree (Sequential, Residual, layers) whose forward keeps what its backward
// needs. Names follow PyTorch's for the same nn.Sequential, so "0.weight" is the seed's net[0].weight.
#include "gpunodes/nn/model.h"

#include <algorithm>
#include <cmath>
#include <sstream>
#include <utility>

#include "gpunodes/errors.h"
#include "layer_modules.h"

namespace gn::nn {

// --- modules -----------------------------------------------------------------------------------------------

namespace {

class SequentialM final : public Module {
 public:
  void add(std::string name, std::unique_ptr<Module> m) {
    children_.emplace_back(std::move(name), std::move(m));
  }
  Tensor forward(const Tensor& x, Mode mode) override {
    Tensor h = x;
    for (auto& [name, m] : children_) h = m->forward(h, mode);
    return h;
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    // Child i needs its input gradient only if something before it has parameters (or the caller wants dx):
    // the MLP's first Linear, behind a Flatten, must not compute a gradient for the images.
    std::vector<bool> need(children_.size());
    bool before = need_dx;
    for (size_t i = 0; i < children_.size(); ++i) {
      need[i] = before;
      before = before || children_[i].second->has_params();
    }
    Tensor g = dy;
    for (size_t i = children_.size(); i-- > 0;) {
      if (!need[i] && !children_[i].second->has_params()) {
        children_[i].second->clear();  // nothing before or in it needs a gradient
        continue;
      }
      g = children_[i].second->backward(g, need[i]);
    }
    return g;
  }
  bool has_params() const override {
    for (auto& [name, m] : children_)
      if (m->has_params()) return true;
    return false;
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    for (auto& [name, m] : children_) m->collect(prefix + name + ".", out);
  }
  void clear() override {
    for (auto& [name, m] : children_) m->clear();
  }
  Shape out_shape(const Shape& in) const override {
    Shape s = in;
    for (auto& [name, m] : children_) s = m->out_shape(s);
    return s;
  }
  std::string describe() const override { return "Sequential"; }
  void summarize(const std::string& prefix, Shape& shape, std::ostringstream& out) const override {
    for (auto& [name, m] : children_) m->summarize(prefix.empty() ? name : prefix + "." + name, shape, out);
  }

 private:
  std::vector<std::pair<std::string, std::unique_ptr<Module>>> children_;
};

// d2l's Residual: Y = relu(bn1(conv1(X))); Y = bn2(conv2(Y)); out = relu(Y + (conv3(X) if use_1x1conv else
// X)). Each ReLU (and the shortcut's add) is fused into the batch norm before it, and the activations stay in
// `layout` throughout.
class ResidualM final : public Module {
 public:
  // What the constructor makes: conv1, conv2, the projection conv3 when there is one, bn1 and bn2.
  static double elements(double in, double out, bool projection) {
    return Conv2dM::elements(in, out, 3, 1) + Conv2dM::elements(out, out, 3, 1) +
           (projection ? Conv2dM::elements(in, out, 1, 1) : 0) + 2 * BatchNorm2dM::elements(out);
  }
  ResidualM(Builder& b, int64_t in, int64_t out, bool use_1x1conv, int64_t stride, Layout layout)
      : conv1_(b, in, out, 3, {stride, 1, 1, layout, layout}),
        conv2_(b, out, out, 3, {1, 1, 1, layout, layout}),
        bn1_(nullptr),
        bn2_(nullptr) {
    if (use_1x1conv)
      conv3_ = std::make_unique<Conv2dM>(b, in, out, 1, Conv2dOptions{stride, 0, 1, layout, layout});
    bn1_ = std::make_unique<BatchNorm2dM>(b, out, 1e-5f, 0.1f, false, layout, true);
    bn2_ = std::make_unique<BatchNorm2dM>(b, out, 1e-5f, 0.1f, false, layout, true);
  }
  Tensor forward(const Tensor& x, Mode mode) override {
    Tensor y = bn1_->forward(conv1_.forward(x, mode), mode);
    Tensor shortcut = conv3_ ? conv3_->forward(x, mode) : x;
    return bn2_->forward(conv2_.forward(y, mode), shortcut, mode);
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    // bn2's residual gradient is the shortcut's: dy past the final ReLU.
    BatchNormGrads g2 = bn2_->backward_with_residual(dy, conv3_ || need_dx);
    Tensor dmain = bn1_->backward(conv2_.backward(g2.dx, true), true);
    dmain = conv1_.backward(dmain, need_dx);
    Tensor dshort = conv3_ ? conv3_->backward(g2.dresidual, need_dx) : g2.dresidual;
    return need_dx ? add_activations(dmain, dshort) : Tensor();
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    // PyTorch's registration order in d2l's Residual: conv1, conv2, conv3, bn1, bn2.
    conv1_.collect(prefix + "conv1.", out);
    conv2_.collect(prefix + "conv2.", out);
    if (conv3_) conv3_->collect(prefix + "conv3.", out);
    bn1_->collect(prefix + "bn1.", out);
    bn2_->collect(prefix + "bn2.", out);
  }
  void clear() override {
    conv1_.clear(), conv2_.clear(), bn1_->clear(), bn2_->clear();
    if (conv3_) conv3_->clear();
  }
  bool has_params() const override { return true; }
  Shape out_shape(const Shape& in) const override { return conv2_.out_shape(conv1_.out_shape(in)); }
  std::string describe() const override {
    return std::string("Residual(") + conv1_.describe() + (conv3_ ? ", 1x1 projection" : "") + ")";
  }

 private:
  Conv2dM conv1_, conv2_;
  std::unique_ptr<Conv2dM> conv3_;
  std::unique_ptr<BatchNorm2dM> bn1_, bn2_;
};

// --- the built-in architectures ---------------------------------------------------------------------------

// Each built-in architecture, described once: `net` is told every layer in construction order (which is
// PyTorch's state_dict order) with its name and sizes, and opens a nested Sequential with begin(name) and
// closes it with end(). build() hands it a ModuleMaker, which makes the modules; state_elements() an
// ElementCounter, which counts their parameters and buffers. The sizes are doubles, so that counting absurd
// options gives a huge number instead of overflowing; create() bounds the options so that building sees
// exact integers. `act` is the layout of the activations between the ResNet's stem and its pooling.
template <class Net>
void describe_builtin(const ModelOptions& o, Layout act, Net& net) {
  const double c = static_cast<double>(o.in_channels), s = static_cast<double>(o.image_size);
  const double classes = static_cast<double>(o.classes);
  switch (o.arch) {
    case Arch::Linear:
      net.linear("0", c, classes);
      return;
    case Arch::Mlp:
      net.flatten("0");
      net.linear("1", c * s * s, 256);
      net.activation("2", Activation::Relu);
      net.linear("3", 256, classes);
      return;
    case Arch::LeNet: {
      const double side =
          static_cast<double>(((o.image_size + 4 - 4) / 2 - 4) / 2);  // 28 -> 28 -> 14 -> 10 -> 5
      const Pool2dOptions pool{PoolKind::Avg, 2, 2, 0};
      net.conv("0", c, 6, 5, Conv2dOptions{1, 2});
      net.activation("1", Activation::Sigmoid);
      net.pool("2", pool);
      net.conv("3", 6, 16, 5, Conv2dOptions{1, 0});
      net.activation("4", Activation::Sigmoid);
      net.pool("5", pool);
      net.flatten("6");
      net.linear("7", 16 * side * side, 120);
      net.activation("8", Activation::Sigmoid);
      net.linear("9", 120, 84);
      net.activation("10", Activation::Sigmoid);
      net.linear("11", 84, classes);
      return;
    }
    case Arch::ResNet18: {
      // NCHW images in, blocked activations from the stem's output to the pooling (see Layout).
      net.conv("0", c, 64, 3, Conv2dOptions{1, 1, 1, Layout::Nchw, act});
      net.batchnorm("1", 64, act);
      net.activation("2", Activation::Relu);
      const double widths[4] = {64, 128, 256, 512};
      double in = 64;
      for (int stage = 0; stage < 4; ++stage) {
        const double out = widths[stage];
        net.begin("resnet_block" + std::to_string(stage + 1));
        // The first stage keeps 64 channels at stride 1; the others open with a strided 1x1 projection.
        net.residual("0", in, out, stage > 0, stage > 0 ? 2 : 1, act);
        net.residual("1", out, out, false, 1, act);
        net.end();
        in = out;
      }
      net.global_avg_pool("global_avg_pool", act);
      net.begin("fc");
      net.flatten("0");
      net.linear("1", 512, classes);
      net.end();
      return;
    }
    case Arch::Network:  // not built in: its layers are data (graph_module.cpp)
      return;
  }
}

// describe_builtin()'s net that makes the modules, in a tree of Sequentials.
class ModuleMaker {
 public:
  explicit ModuleMaker(Builder& b) : b_(b), root_(std::make_unique<SequentialM>()), open_{root_.get()} {}
  std::unique_ptr<Module> take() { return std::move(root_); }

  void linear(const std::string& name, double in, double out) {
    add(name, std::make_unique<LinearM>(b_, dim(in), dim(out)));
  }
  void conv(const std::string& name, double in, double out, int64_t kernel, const Conv2dOptions& o) {
    add(name, std::make_unique<Conv2dM>(b_, dim(in), dim(out), kernel, o));
  }
  void batchnorm(const std::string& name, double channels, Layout layout) {
    add(name, std::make_unique<BatchNorm2dM>(b_, dim(channels), 1e-5f, 0.1f, false, layout));
  }
  void residual(const std::string& name, double in, double out, bool projection, int64_t stride,
                Layout layout) {
    add(name, std::make_unique<ResidualM>(b_, dim(in), dim(out), projection, stride, layout));
  }
  void activation(const std::string& name, Activation kind) {
    add(name, std::make_unique<ActivationM>(kind));
  }
  void pool(const std::string& name, const Pool2dOptions& o) { add(name, std::make_unique<PoolM>(o)); }
  void global_avg_pool(const std::string& name, Layout layout) {
    add(name, std::make_unique<GlobalAvgPoolM>(layout));
  }
  void flatten(const std::string& name) { add(name, std::make_unique<FlattenM>()); }
  void begin(const std::string& name) {
    auto child = std::make_unique<SequentialM>();
    SequentialM* opened = child.get();
    add(name, std::move(child));
    open_.push_back(opened);
  }
  void end() { open_.pop_back(); }

 private:
  static int64_t dim(double v) { return static_cast<int64_t>(v); }
  void add(const std::string& name, std::unique_ptr<Module> m) { open_.back()->add(name, std::move(m)); }
  Builder& b_;
  std::unique_ptr<SequentialM> root_;
  std::vector<SequentialM*> open_;  // the Sequentials being filled, innermost last
};

// describe_builtin()'s net that counts the float32 values of the state, as the modules hold them.
class ElementCounter {
 public:
  double count() const { return n_; }
  void linear(const std::string&, double in, double out) { n_ += LinearM::elements(in, out); }
  void conv(const std::string&, double in, double out, int64_t kernel, const Conv2dOptions& o) {
    n_ += Conv2dM::elements(in, out, kernel, o.groups);
  }
  void batchnorm(const std::string&, double channels, Layout) { n_ += BatchNorm2dM::elements(channels); }
  void residual(const std::string&, double in, double out, bool projection, int64_t, Layout) {
    n_ += ResidualM::elements(in, out, projection);
  }
  void activation(const std::string&, Activation) {}
  void pool(const std::string&, const Pool2dOptions&) {}
  void global_avg_pool(const std::string&, Layout) {}
  void flatten(const std::string&) {}
  void begin(const std::string&) {}
  void end() {}

 private:
  double n_ = 0;
};

std::unique_ptr<Module> build(Builder& b, const ModelOptions& o) {
  if (o.arch == Arch::Network) return make_graph_module(b, *o.network, o.seed);
  ModuleMaker maker(b);
  describe_builtin(o, b.activation_layout(), maker);
  return maker.take();
}

}  // namespace

// --- names -------------------------------------------------------------------------------------------------

const char* arch_name(Arch a) {
  switch (a) {
    case Arch::Linear:
      return "linear";
    case Arch::Mlp:
      return "mlp";
    case Arch::LeNet:
      return "lenet";
    case Arch::ResNet18:
      return "resnet18";
    case Arch::Network:
      return "network";
  }
  return "unknown";
}

Arch parse_arch(const std::string& name) {
  for (Arch a : {Arch::Linear, Arch::Mlp, Arch::LeNet, Arch::ResNet18})
    if (name == arch_name(a)) return a;
  throw Error("unknown model architecture '" + name + "': expected linear, mlp, lenet or resnet18");
}

const char* init_name(Init i) {
  switch (i) {
    case Init::Normal:
      return "normal";
    case Init::Xavier:
      return "xavier";
    case Init::Kaiming:
      return "kaiming";
  }
  return "unknown";
}

Init parse_init(const std::string& name) {
  for (Init i : {Init::Normal, Init::Xavier, Init::Kaiming})
    if (name == init_name(i)) return i;
  throw Error("unknown initialiser '" + name + "': expected normal, xavier or kaiming");
}

double state_elements(const ModelOptions& o) {
  if (o.arch == Arch::Network) {
    double n = 0;
    for (const LayerInfo& i : o.network->infer()) n += i.params + i.buffers;
    return n;
  }
  ElementCounter counter;
  describe_builtin(o, Layout::Nchw, counter);
  return counter.count();
}

// --- Model -------------------------------------------------------------------------------------------------

Model::Model(Runtime& rt, ModelOptions options, Device device)
    : rt_(rt), options_(options), device_(device) {}
Model::~Model() = default;

std::unique_ptr<Model> Model::create(Runtime& rt, const ModelOptions& o, Device device) {
  if (!rt.has(device)) throw Error("cannot create a model on " + device.str() + ": no such device");
  if (o.arch == Arch::Network && !o.network) throw Error("model options: a network needs its layers");
  if (o.classes < 1 || o.in_channels < 1 || o.image_size < 1)
    throw Error("model options: classes, in_channels and image_size must be positive");
  // Bounds far past any real model that keep in_channels * image_size^2 and the layer sizes built from them
  // inside int64: options can come from a parameter file, which may be corrupt or hostile.
  constexpr int64_t kMaxWidth = int64_t(1) << 20, kMaxSide = int64_t(1) << 16;
  if (o.classes > kMaxWidth || o.in_channels > kMaxWidth || o.image_size > kMaxSide)
    throw Error("model options: classes and in_channels must be at most " + std::to_string(kMaxWidth) +
                " and image_size at most " + std::to_string(kMaxSide) + " (got classes=" +
                std::to_string(o.classes) + " in_channels=" + std::to_string(o.in_channels) +
                " image_size=" + std::to_string(o.image_size) + ")");
  if (o.arch == Arch::LeNet && o.image_size < 12)
    throw Error("lenet needs images of at least 12x12, got " + std::to_string(o.image_size));
  if (o.init == Init::Normal && !(o.init_std > 0)) throw Error("model options: init_std must be positive");
  std::unique_ptr<Model> m(new Model(rt, o, device));
  Builder b(rt, device, o, m->batches_tracked_);
  m->root_ = build(b, o);
  m->root_->collect("", m->state_);
  return m;
}

std::string Model::signature() const {
  if (options_.arch == Arch::Network) return options_.network->text();
  std::string s = std::string(arch_name(options_.arch)) + " classes=" + std::to_string(options_.classes) +
                  " in_channels=" + std::to_string(options_.in_channels);
  // The MLP's and LeNet's first linear layer depends on the image size.
  if (options_.arch == Arch::Mlp || options_.arch == Arch::LeNet)
    s += " image_size=" + std::to_string(options_.image_size);
  return s;
}

Shape Model::input_shape(int64_t n) const {
  if (options_.arch == Arch::Network) {
    Shape s = options_.network->input().shape;
    s.insert(s.begin(), n);
    return s;
  }
  if (options_.arch == Arch::Linear) return {n, options_.in_channels};
  return {n, options_.in_channels, options_.image_size, options_.image_size};
}

std::vector<Parameter*> Model::state() {
  return state_;
}
std::vector<const Parameter*> Model::state() const {
  return {state_.begin(), state_.end()};
}

std::vector<Parameter*> Model::parameters() {
  std::vector<Parameter*> out;
  for (Parameter* p : state_)
    if (p->trainable) out.push_back(p);
  return out;
}

std::vector<ParameterInfo> Model::describe() const {
  std::vector<ParameterInfo> out;
  for (const Parameter* p : state_)
    out.push_back({p->name, p->value.shape(), p->value.device(), p->trainable});
  return out;
}

int64_t Model::parameter_count() const {
  int64_t n = 0;
  for (const Parameter* p : state_)
    if (p->trainable) n += p->value.numel();
  return n;
}

std::string Model::summary() const {
  std::ostringstream out;
  Shape shape = input_shape(1);
  out << arch_name(options_.arch) << " on " << device_.str() << ", input " << shape_str(shape) << ", "
      << parameter_count() << " parameters\n";
  root_->summarize("", shape, out);
  return out.str();
}

Tensor Model::forward(const Tensor& x, Mode mode) {
  if (!x.defined()) throw Error(std::string(arch_name(options_.arch)) + ": the input is undefined");
  // A drawn network may hold no parameters at all (Input, Flatten): its device still decides.
  if (x.device() != device_) throw DeviceMismatchError(device_, x.device());
  const Shape want = input_shape(x.shape().empty() ? 0 : x.shape()[0]);
  const bool resnet = options_.arch == Arch::ResNet18;
  // ResNet-18 ends in a global average pool and takes any image size (the seed resizes to 96); a drawn
  // sequence network takes any length its layers can (a Generate node feeds a growing text).
  const bool ok = resnet ? x.shape().size() == 4 && x.shape()[1] == want[1]
                         : x.shape() == want || takes_steps(x.shape());
  if (!ok || x.shape()[0] < 1) {
    std::string expect = "[N";
    for (size_t i = 1; i < want.size(); ++i)
      expect += ", " + (resnet && i >= 2 ? std::string(i == 2 ? "H" : "W") : std::to_string(want[i]));
    throw ShapeError(std::string(arch_name(options_.arch)) + " expects input " + expect + "], got " +
                     shape_str(x.shape()));
  }
  if (mode == Mode::Train) {
    if (has_cache_) root_->clear();
    has_cache_ = true;
    ++batches_tracked_;
  }
  return root_->forward(x, mode);
}

bool Model::takes_steps(const Shape& x) {
  if (options_.arch != Arch::Network || x.size() < 2) return false;
  const Shape& per_sample = options_.network->input().shape;
  if (x.size() != per_sample.size() + 1 || !std::equal(per_sample.begin() + 1, per_sample.end(), x.begin() + 2))
    return false;
  const int64_t steps = x[1];
  if (std::find(steps_taken_.begin(), steps_taken_.end(), steps) != steps_taken_.end()) return true;
  bool sequence = false;
  for (const LayerSpec& l : options_.network->layers)
    sequence = sequence || is_recurrent(l.kind) || l.kind == LayerKind::Embedding || l.kind == LayerKind::OneHot ||
               l.kind == LayerKind::LastStep;
  if (!sequence) return false;
  NetworkSpec other = *options_.network;
  for (LayerSpec& l : other.layers)
    if (l.kind == LayerKind::Input) l.shape[0] = steps;
  try {
    other.infer();
  } catch (const LayerError&) {
    return false;  // a Reshape or a Linear after a Flatten depends on the length
  }
  steps_taken_.push_back(steps);
  return true;
}

void Model::carry_state(bool on) {
  root_->carry_state(on);
}

void Model::reset_state() {
  root_->reset_state();
}

std::vector<std::pair<std::string, Tensor>> Model::attention_weights() const {
  std::vector<std::pair<std::string, Tensor>> out;
  root_->collect_attention("", out);
  return out;
}

void Model::backward(const Tensor& dlogits) {
  if (!has_cache_) throw Error("backward() needs a forward() in Train mode first");
  has_cache_ = false;
  try {
    root_->backward(dlogits, false);
  } catch (...) {
    root_->clear();
    throw;
  }
}

void Model::clear_cache() {
  root_->clear();
  has_cache_ = false;
}

void Model::clear_errors() {
  // An op that writes every state variable and reads none: it inherits no error, and its success replaces
  // the errors stuck to them.
  std::vector<VarPtr> vars;
  for (Parameter* p : state_) vars.push_back(p->value.var());
  rt_.engine().push([](OpContext&) {}, {}, vars, device_, StreamKind::Compute, {"clear errors", "", 0, 0});
  clear_cache();
}

void Model::copy_state_from(const Model& other) {
  if (&other == this) return;
  if (other.signature() != signature())
    throw Error("cannot copy parameters of a " + other.signature() + " model into a " + signature() +
                " model");
  auto src = other.state();
  for (size_t i = 0; i < state_.size(); ++i) copy_into(state_[i]->value, src[i]->value);
  batches_tracked_ = other.batches_tracked_;
}

std::unique_ptr<Model> Model::replicate(Device device) const {
  auto m = create(rt_, options_, device);
  m->copy_state_from(*this);
  return m;
}

Tensor forward(Model& model, const Tensor& x) {
  return model.forward(x, Mode::Eval);
}

}  // namespace gn::nn
