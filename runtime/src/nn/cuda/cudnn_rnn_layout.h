// Where the recurrent layers' PyTorch-named parameters (recurrent.h's rnn_params) lie in cuDNN's RNN weight
// space, and which layers one cuDNN call runs: pure host arithmetic, checked at compile time at the end of
// this file, so that a build here proves the mapping without a GPU. cuda_recurrent_kernels.cu asks
// cudnnGetRNNWeightParams for the address of every (pseudo-layer, linLayerID) that this file names and
// checks each block's size against it.
//
// The invariants relied on, from cuDNN's documentation of cudnnGetRNNWeightParams and of the cell formulas:
//  - A pseudo-layer is one layer and direction of the RNN descriptor: pseudo = layer * directions + direction
//    (0 forward, 1 reverse), counted from the descriptor's own first layer. PyTorch's state_dict groups the
//    parameters by that same (layer, direction), forward first, so rnn_params' slot is the pseudo-layer of
//    a descriptor that starts at layer 0.
//  - Inside a pseudo-layer, linLayerID 0 .. G-1 are the input side's gates (matrix W, bias b_W) and
//    G .. 2G-1 the recurrent side's (R, b_R), G = rnn_gate_count: 1 for RNN_RELU / RNN_TANH, 4 for
//    CUDNN_LSTM in the order i, f, c', o, 3 for CUDNN_GRU in the order r, z (cuDNN's u), h' (PyTorch's n).
//    Those are PyTorch's row blocks of weight_ih / weight_hh (LSTM i f g o, GRU r z n): gate k of a
//    parameter is linLayerID k (input side) or G + k (recurrent side).
//  - Each matrix is [H, in] row-major, in = the layer's input size on the input side (input_size for layer
//    0, H * directions above) and H on the recurrent side: gate k's matrix is rows [k H, (k + 1) H) of the
//    PyTorch matrix [G H, in], a contiguous block of H * in floats at offset k H in. A bias is H floats,
//    elements [k H, (k + 1) H) of bias_ih / bias_hh.
//  - CUDNN_RNN_DOUBLE_BIAS keeps b_W and b_R apart, which are PyTorch's bias_ih and bias_hh; CUDNN_GRU adds
//    b_Rh' inside the reset product, h' = tanh(W_h x + b_Wh + r * (R_h h + b_Rh)), which is PyTorch's GRU
//    (linear before reset). CUDNN_RNN_NO_BIAS has no bias blocks and rnn_params no bias parameters.
#pragma once
#include <cstdint>

namespace gn::nn::cudnn_layout {

// rnn_params' parameters of one (layer, direction), in order; the bias pair only with bias.
enum class Which { WeightIh = 0, WeightHh = 1, BiasIh = 2, BiasHh = 3 };

constexpr int64_t params_per_slot(bool bias) {
  return bias ? 4 : 2;
}

// Parameter `index` in rnn_params order.
struct ParamPlace {
  int64_t layer = 0, direction = 0;
  Which which = Which::WeightIh;
  constexpr bool recurrent() const { return which == Which::WeightHh || which == Which::BiasHh; }
  constexpr bool is_bias() const { return which == Which::BiasIh || which == Which::BiasHh; }
};
constexpr ParamPlace param_place(int64_t index, int64_t directions, bool bias) {
  const int64_t slot = index / params_per_slot(bias);
  return {slot / directions, slot % directions, static_cast<Which>(index % params_per_slot(bias))};
}
// The inverse: where (layer, direction, which) lies in rnn_params.
constexpr int64_t param_index(int64_t layer, int64_t direction, Which which, int64_t directions, bool bias) {
  return (layer * directions + direction) * params_per_slot(bias) + static_cast<int64_t>(which);
}

// The pseudo-layer of `p` in a descriptor whose first layer is first_layer.
constexpr int pseudo_layer(const ParamPlace& p, int64_t first_layer, int64_t directions) {
  return static_cast<int>((p.layer - first_layer) * directions + p.direction);
}
// The linLayerID of gate `gate` (0 .. gates-1) of `p`.
constexpr int lin_layer_id(const ParamPlace& p, int gates, int gate) {
  return (p.recurrent() ? gates : 0) + gate;
}
// Where gate `gate`'s block starts inside its PyTorch parameter, in floats, and how many floats it holds:
// rows of `cols` floats for a matrix (cols = the layer's input size or H), H floats for a bias.
constexpr int64_t gate_offset(int64_t hidden, int64_t cols, int gate) {
  return gate * hidden * cols;
}
constexpr int64_t gate_floats(int64_t hidden, int64_t cols) {
  return hidden * cols;
}
// The columns of `p`'s matrix (1 for a bias): the layer's input on the input side, H on the recurrent one.
constexpr int64_t param_cols(const ParamPlace& p, int64_t input_size, int64_t hidden, int64_t directions) {
  if (p.is_bias()) return 1;
  if (p.recurrent()) return hidden;
  return p.layer == 0 ? input_size : hidden * directions;
}

// The layers one cuDNN RNN descriptor runs. Without dropout between layers (or in evaluation) one
// descriptor runs the whole stack, which lets cuDNN overlap the layers. With dropout in training every
// layer is its own descriptor and the dropout between them is recurrent.h's Philox mask, drawn by
// cuda_recurrent_kernels.cu as on the CPU: cuDNN's own dropout (cudnnDropoutDescriptor) draws from its own
// generator state, whose masks no other device can reproduce, so the descriptors carry a dropout of 0.
struct Segment {
  int64_t first_layer = 0, layers = 0;
};
constexpr bool per_layer_segments(bool training, float dropout, int64_t layers) {
  return training && dropout > 0 && layers > 1;
}
constexpr int64_t segment_count(int64_t layers, bool per_layer) {
  return per_layer ? layers : 1;
}
constexpr Segment segment(int64_t s, int64_t layers, bool per_layer) {
  return per_layer ? Segment{s, 1} : Segment{0, layers};
}

// --- compile-time checks ----------------------------------------------------------------------------------

// param_place and param_index are inverse over a whole stack.
constexpr bool places_round_trip(int64_t layers, int64_t directions, bool bias) {
  for (int64_t i = 0; i < layers * directions * params_per_slot(bias); ++i) {
    const ParamPlace p = param_place(i, directions, bias);
    if (param_index(p.layer, p.direction, p.which, directions, bias) != i) return false;
    if (p.layer >= layers || p.direction >= directions) return false;
  }
  return true;
}
static_assert(places_round_trip(3, 2, true) && places_round_trip(3, 2, false));
static_assert(places_round_trip(2, 1, true) && places_round_trip(1, 1, false));

// A 2-layer bidirectional LSTM with bias (16 parameters): weight_hh_l0_reverse is index 5, pseudo-layer 1,
// its g block (gate 2) is linLayerID 4 + 2 and starts at row 2 H.
constexpr ParamPlace kLstmWhhL0Reverse = param_place(5, 2, true);
static_assert(kLstmWhhL0Reverse.layer == 0 && kLstmWhhL0Reverse.direction == 1);
static_assert(kLstmWhhL0Reverse.which == Which::WeightHh && kLstmWhhL0Reverse.recurrent());
static_assert(pseudo_layer(kLstmWhhL0Reverse, 0, 2) == 1 && lin_layer_id(kLstmWhhL0Reverse, 4, 2) == 6);
static_assert(gate_offset(6, param_cols(kLstmWhhL0Reverse, 4, 6, 2), 2) == 2 * 6 * 6);
// bias_ih_l1 of that LSTM (index 10): the input side's biases, linLayerIDs 0 .. 3 of pseudo-layer 2.
constexpr ParamPlace kLstmBihL1 = param_place(10, 2, true);
static_assert(kLstmBihL1.layer == 1 && kLstmBihL1.direction == 0 && kLstmBihL1.which == Which::BiasIh);
static_assert(kLstmBihL1.is_bias() && !kLstmBihL1.recurrent() && lin_layer_id(kLstmBihL1, 4, 3) == 3);
static_assert(pseudo_layer(kLstmBihL1, 0, 2) == 2 && param_cols(kLstmBihL1, 4, 6, 2) == 1);
// A layer above the first reads both directions: weight_ih_l1 of that LSTM is [4 H, 2 H].
static_assert(param_cols(param_place(8, 2, true), 4, 6, 2) == 12);
// A GRU without bias, 2 layers, bidirectional (8 parameters): weight_hh_l1_reverse is index 7; in the
// descriptor of layer 1 alone (dropout in training) it is pseudo-layer 1, its n block linLayerID 3 + 2.
constexpr ParamPlace kGruWhhL1Reverse = param_place(7, 2, false);
static_assert(kGruWhhL1Reverse.layer == 1 && kGruWhhL1Reverse.direction == 1 && kGruWhhL1Reverse.recurrent());
static_assert(pseudo_layer(kGruWhhL1Reverse, 1, 2) == 1 && lin_layer_id(kGruWhhL1Reverse, 3, 2) == 5);
// An RNN's single gate: weight_ih is linLayerID 0, weight_hh 1.
static_assert(lin_layer_id(param_place(0, 1, true), 1, 0) == 0 &&
              lin_layer_id(param_place(1, 1, true), 1, 0) == 1);
static_assert(lin_layer_id(param_place(3, 1, true), 1, 0) == 1);  // bias_hh: b_R
// Segments: the whole stack, or one layer each with dropout in training.
static_assert(!per_layer_segments(false, 0.5f, 3) && !per_layer_segments(true, 0.0f, 3));
static_assert(!per_layer_segments(true, 0.5f, 1) && per_layer_segments(true, 0.5f, 2));
static_assert(segment_count(3, false) == 1 && segment(0, 3, false).layers == 3);
static_assert(segment_count(3, true) == 3 && segment(2, 3, true).first_layer == 2 &&
              segment(2, 3, true).layers == 1);

}  // namespace gn::nn::cudnn_layout
