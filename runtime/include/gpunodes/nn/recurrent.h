// Recurrent layers (PyTorch's nn.RNN, nn.GRU and nn.LSTM with batch_first=True), forward and backward as
// tensor ops. Like every op (layers.h), each call checks its inputs, enqueues one engine op on their device
// and returns at once; the results live on that device. One call runs every layer and direction of the
// stack, all time steps included.
//
// The math is PyTorch's, with W_ih, W_hh, b_ih, b_hh the gate rows stacked in PyTorch's order:
//   RNN:  h' = act(W_ih x + b_ih + W_hh h + b_hh), act tanh or ReLU
//   GRU:  rows r, z, n:  r = sigmoid(W_ir x + b_ir + W_hr h + b_hr), z likewise,
//         n = tanh(W_in x + b_in + r * (W_hn h + b_hn)), h' = (1 - z) * n + z * h
//   LSTM: rows i, f, g, o: i, f, o = sigmoid(..), g = tanh(..), c' = f * c + i * g, h' = o * tanh(c')
// A bidirectional layer runs a second set of weights over t = T-1 .. 0; its outputs are the second half of
// the feature axis. Layer l > 0 reads layer l-1's output, through dropout in training.
//
// The products run in the thread's ScopedPrecision (layers.h), as linear's do; the gate math is float32.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "gpunodes/tensor.h"

namespace gn::nn {

enum class RnnKind { RnnTanh, RnnRelu, Gru, Lstm };
// The gate blocks of W_ih's and W_hh's rows: 1 for RNN, 3 for GRU (r, z, n), 4 for LSTM (i, f, g, o).
int rnn_gate_count(RnnKind kind);
// "RNN_TANH", "RNN_RELU", "GRU", "LSTM" (torch's mode names).
const char* rnn_kind_name(RnnKind kind);

struct RnnOptions {
  RnnKind kind = RnnKind::Lstm;
  int64_t input_size = 0, hidden_size = 0;
  int64_t num_layers = 1;
  bool bidirectional = false;
  bool bias = true;
  // Dropout on every layer's output but the last, in training only (PyTorch's): kept with probability
  // 1 - dropout and scaled by 1 / (1 - dropout). 0 <= dropout < 1.
  float dropout = 0;
  int64_t directions() const { return bidirectional ? 2 : 1; }
};

// One parameter as PyTorch's state_dict names and shapes it. fan_in is the hidden size H for every one of
// them: PyTorch draws all of a recurrent layer's parameters from U(-1/sqrt(H), 1/sqrt(H)).
struct RnnParam {
  std::string name;
  Shape shape;
  int64_t fan_in;
};
// The parameters in nn.RNN/GRU/LSTM's state_dict order: for each layer l, for each direction (suffix "" then
// "_reverse"): weight_ih_l{l}{sfx} [G*H, in_l], weight_hh_l{l}{sfx} [G*H, H], and with bias
// bias_ih_l{l}{sfx} [G*H], bias_hh_l{l}{sfx} [G*H]; in_0 = input_size, in_l = H * directions. Throws Error
// for options that describe no network (sizes below 1, dropout outside [0, 1)).
std::vector<RnnParam> rnn_params(const RnnOptions& o);

// What a training forward keeps for its backward: tensors (so the allocator accounts for them) written by
// the forward's op. Opaque to callers.
struct RnnSaved;

struct RnnResult {
  Tensor y;    // [N, T, H * directions], batch-first
  Tensor h_n;  // [num_layers * directions, N, H], PyTorch's order (layer-major, forward direction first)
  Tensor c_n;  // LSTM only, h_n's shape; undefined otherwise
  std::shared_ptr<RnnSaved> saved;  // training only: what rnn_backward needs
};

// x [N, T, input_size] with T >= 1; weights in rnn_params order, on x's device. h0 and c0 (c0 for LSTM only)
// undefined mean zeros, else [num_layers * directions, N, H]. training keeps `saved` and applies dropout
// with masks from Philox stream `seed`: the output of layer l < num_layers - 1 at batch-first position
// (n, t, j) of [N, T, H * directions] is kept when philox::uniform_at(seed, l * N*T*H*directions +
// (n * T + t) * H*directions + j, 0, 1) <= 1 - dropout, so every device draws the same masks.
// Throws ShapeError naming the argument (or the parameter) whose shape does not fit, DeviceMismatchError for
// tensors on different devices.
RnnResult rnn_forward(const RnnOptions& o, const Tensor& x, const std::vector<Tensor>& weights,
                      const Tensor& h0, const Tensor& c0, bool training, uint64_t seed);

struct RnnGrads {
  Tensor dx;                     // x's shape; undefined unless asked for
  std::vector<Tensor> dweights;  // in rnn_params order, each its parameter's shape
};
// The gradients for an output gradient dy [N, T, H * directions] of `forward`, a training forward of the
// same options, x and weights. The initial state is a constant (no gradient to h0 or c0; d2l detaches it)
// and the final state gets no incoming gradient. need_dx false leaves dx undefined (a first layer's input
// needs none). It takes the forward's saved activations for its scratch (the gate gradients overwrite the
// gates), so each training forward has one backward: a second is refused with an Error.
RnnGrads rnn_backward(const RnnOptions& o, const RnnResult& forward, const Tensor& x,
                      const std::vector<Tensor>& weights, const Tensor& dy, bool need_dx);

}  // namespace gn::nn
