// Models: Linear(3,1), MLP, LeNet and the d2l ResNet-18, built from the layer ops. A model lives on one
// device: every parameter is created there and stays there. Forward in Train mode keeps what backward needs;
// backward fills every parameter's gradient. A model is not re-entrant: one forward/backward at a time.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/runtime.h"
#include "gpunodes/tensor.h"

namespace gn::nn {

enum class Arch {
  Linear,    // the seed's nn.Sequential(nn.Linear(3, 1)): in_features -> out_features, input [N, in]
  Mlp,       // d2l: Flatten, Linear(784, 256), ReLU, Linear(256, classes)
  LeNet,     // d2l: conv 6@5x5 pad 2, sigmoid, avgpool 2, conv 16@5x5, sigmoid, avgpool 2, 120, 84, classes
  ResNet18,  // seed 004: 3x3 stem (64, stride 1, BN, ReLU), 4 stages of 2 residual blocks, GAP, linear
  Network,   // drawn from layer nodes: ModelOptions::network says what it is
};
const char* arch_name(Arch arch);          // "linear", "mlp", "lenet", "resnet18", "network"
Arch parse_arch(const std::string& name);  // the built-in ones; throws Error listing the names it knows

// How weights start; biases start at zero and BatchNorm at weight 1, bias 0, running mean 0, variance 1.
enum class Init {
  Normal,   // N(0, init_std) weights, the seed's nn.init.normal_(std=0.01)
  Xavier,   // Glorot uniform: U(-a, a), a = sqrt(6 / (fan_in + fan_out))
  Kaiming,  // He normal: N(0, sqrt(2 / fan_in))
};
const char* init_name(Init init);
Init parse_init(const std::string& name);

struct ModelOptions {
  Arch arch = Arch::Mlp;
  int64_t classes = 10;     // outputs (Linear: out_features)
  int64_t in_channels = 1;  // image channels (Linear: in_features = in_channels)
  int64_t image_size = 28;  // square input side; the MLP's input width is in_channels * image_size^2
  Init init = Init::Normal;
  float init_std = 0.01f;  // for Init::Normal
  // Parameter k draws from Philox stream mix(seed, k): the same seed gives the same parameters on every
  // device.
  uint64_t seed = 0;
  // Arch::Network only: the layers. classes, in_channels and image_size are then read from it.
  std::shared_ptr<const NetworkSpec> network;
};

// How many float32 values the model's state (parameters and buffers) holds, from the options alone, without
// building it: graph checks compare it with the device's memory before a run. A double, so that absurd
// options give a huge number instead of overflowing.
double state_elements(const ModelOptions& options);

enum class Mode { Eval, Train };

// A named tensor of the model's state. Weights and biases are trainable; BatchNorm running statistics are
// buffers: saved, loaded and broadcast, never trained.
struct Parameter {
  std::string
      name;  // PyTorch's name in the equivalent nn.Sequential: "0.weight", "resnet_block2.0.conv3.bias"
  Tensor value;
  Tensor grad;  // set by backward(); undefined before
  bool trainable = true;
};

struct ParameterInfo {
  std::string name;
  Shape shape;
  Device device;
  bool trainable = true;
};

class Module;

class Model {
 public:
  // Builds and initialises the model on `device` (ops enqueued; returns at once).
  static std::unique_ptr<Model> create(Runtime& rt, const ModelOptions& options, Device device);
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelOptions& options() const { return options_; }
  Arch arch() const { return options_.arch; }
  // What must match for parameters to be exchanged: "resnet18 classes=10 in_channels=1", for example; a
  // drawn network's is its whole canonical text (NetworkSpec::text()).
  std::string signature() const;
  Device device() const { return device_; }
  Runtime& runtime() const { return rt_; }
  // The input shape for a batch of n: [n, in] for Linear, [n, C, S, S] for the other built-in ones, [n] and
  // the Input layer's shape for a drawn network.
  Shape input_shape(int64_t n) const;

  // Trainable parameters and buffers, in one fixed order (the order of PyTorch's state_dict).
  std::vector<Parameter*> state();
  std::vector<const Parameter*> state() const;
  std::vector<Parameter*> parameters();  // trainable only
  // Names, shapes and devices: the seed's check of net[0].weight.data.device.
  std::vector<ParameterInfo> describe() const;
  int64_t parameter_count() const;  // trainable scalars
  // Train-mode forwards so far: PyTorch's num_batches_tracked of every BatchNorm layer (each one sees every
  // training batch). Kept on the host; copied with the state; written to and read from safetensors files.
  int64_t batches_tracked() const { return batches_tracked_; }
  void set_batches_tracked(int64_t n) { batches_tracked_ = n; }
  // Human-readable layer list, one line per layer with its output shape for a batch of 1.
  std::string summary() const;

  // x must be on the model's device, in input_shape() (a drawn sequence network also takes other lengths T
  // where its layers can). Train mode uses batch statistics, updates BatchNorm running statistics
  // and keeps activations for backward(); Eval mode keeps nothing.
  Tensor forward(const Tensor& x, Mode mode = Mode::Eval);
  // Recurrent state across Train-mode batches (d2l's sequential partition): with carry on, each recurrent
  // layer starts a batch from the state the previous batch of the same size ended in, detached; reset_state()
  // starts the next batch from zeros (an epoch's start). Off by default.
  void carry_state(bool on);
  void reset_state();
  // dlogits: the loss gradient for the last Train-mode forward. Sets every trainable parameter's grad and
  // releases the kept activations.
  void backward(const Tensor& dlogits);
  // Drops kept activations without a backward (after a failed or abandoned step).
  void clear_cache();
  // The attention weights of each MultiheadAttention layer, [heads, Tq, Tk] of the first sample of the last
  // Eval-mode forward, under the layer's id (in construction order); empty before one.
  std::vector<std::pair<std::string, Tensor>> attention_weights() const;
  // After the engine's cancel (and reset_cancel()) or a failed step, the parameters carry the error of the
  // update that never ran, so every op reading them fails again. Their memory holds the last update that did
  // run: this accepts that state and makes the model usable again (one op, enqueued).
  void clear_errors();

  // Copies every parameter and buffer of `other` (same signature, any device) into this model, in place.
  void copy_state_from(const Model& other);
  // A new model of the same architecture on `device` holding a copy of this model's state.
  std::unique_ptr<Model> replicate(Device device) const;

 private:
  Model(Runtime& rt, ModelOptions options, Device device);
  Runtime& rt_;
  ModelOptions options_;
  Device device_;
  std::unique_ptr<Module> root_;
  std::vector<Parameter*> state_;  // owned by the modules
  // Whether x is a batch of another length that a drawn sequence network takes (its layers re-inferred with
  // that length); remembers the lengths it accepted.
  bool takes_steps(const Shape& x);

  bool has_cache_ = false;
  int64_t batches_tracked_ = 0;
  std::vector<int64_t> steps_taken_;
};

// The model applied to x in Eval mode: the Forward node.
Tensor forward(Model& model, const Tensor& x);

}  // namespace gn::nn
