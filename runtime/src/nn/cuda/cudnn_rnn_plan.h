// The host side of the cuDNN recurrent layers (cuda_recurrent_kernels.cu): descriptors, their sizes, and
// where each PyTorch-named parameter lies in a weight space. Included by that .cu file only; everything is
// in an anonymous namespace of it.
//
// Every cuDNN and CUDA status is checked by check() below, which throws BackendError naming the call, the
// layer (rnn_layer_name: kind, sizes, batch, steps, device) and cuDNN's or CUDA's message.
#pragma once
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "cuda_kernel_support.h"
#include "cudnn_rnn_layout.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/recurrent.h"
#include "gpunodes/precision.h"

namespace gn::nn {
namespace {

// "rnn LSTM (2 layers, bidirectional, input 16, hidden 32, bias, dropout 0.5; batch 8, 20 steps) on cuda:0"
inline std::string rnn_layer_name(const RnnOptions& o, int64_t n, int64_t t, Device device) {
  std::string s = std::string("rnn ") + rnn_kind_name(o.kind) + " (" + std::to_string(o.num_layers) +
                  (o.num_layers == 1 ? " layer" : " layers") + (o.bidirectional ? ", bidirectional" : "") +
                  ", input " + std::to_string(o.input_size) + ", hidden " + std::to_string(o.hidden_size) +
                  (o.bias ? ", bias" : ", no bias");
  if (o.dropout > 0) {
    char rate[32];
    std::snprintf(rate, sizeof rate, "%g", static_cast<double>(o.dropout));
    s += std::string(", dropout ") + rate;
  }
  return s + "; batch " + std::to_string(n) + ", " + std::to_string(t) + " steps) on " + device.str();
}

// "cudnnRNNForward(handle, ...)" -> "cudnnRNNForward".
inline std::string call_name(const char* call) {
  std::string name(call);
  if (auto paren = name.find('('); paren != std::string::npos) name.resize(paren);
  return name;
}
inline void check(cudnnStatus_t st, const char* call, const std::string& layer) {
  if (st != CUDNN_STATUS_SUCCESS)
    throw BackendError(call_name(call) + " failed for " + layer + ": " + cudnnGetErrorString(st));
}
inline void check(cudaError_t e, const char* call, const std::string& layer) {
  if (e != cudaSuccess)
    throw BackendError(call_name(call) + " failed for " + layer + ": " + cudaGetErrorString(e));
}
#define GN_RNN_CHECK(call, layer) check((call), #call, (layer))

// A cuDNN descriptor owned for a scope: created by the constructor, destroyed by the destructor (also while
// a later member's constructor unwinds).
template <class T, cudnnStatus_t (*Create)(T*), cudnnStatus_t (*Destroy)(T)>
class Owned {
 public:
  Owned(const char* create, const std::string& layer) { check(Create(&d_), create, layer); }
  ~Owned() {
    if (d_) (void)Destroy(d_);
  }
  Owned(const Owned&) = delete;
  Owned& operator=(const Owned&) = delete;
  T get() const { return d_; }

 private:
  T d_ = nullptr;
};
using DropoutDescriptor =
    Owned<cudnnDropoutDescriptor_t, cudnnCreateDropoutDescriptor, cudnnDestroyDropoutDescriptor>;
using RnnDescriptor = Owned<cudnnRNNDescriptor_t, cudnnCreateRNNDescriptor, cudnnDestroyRNNDescriptor>;
using DataDescriptor =
    Owned<cudnnRNNDataDescriptor_t, cudnnCreateRNNDataDescriptor, cudnnDestroyRNNDataDescriptor>;
using TensorDescriptor =
    Owned<cudnnTensorDescriptor_t, cudnnCreateTensorDescriptor, cudnnDestroyTensorDescriptor>;

inline cudnnRNNMode_t cell_mode(RnnKind kind) {
  switch (kind) {
    case RnnKind::RnnTanh:
      return CUDNN_RNN_TANH;
    case RnnKind::RnnRelu:
      return CUDNN_RNN_RELU;
    case RnnKind::Gru:
      return CUDNN_GRU;  // linear before reset, as PyTorch's (cudnn_rnn_layout.h)
    case RnnKind::Lstm:
      return CUDNN_LSTM;
  }
  throw Error("unknown recurrent layer kind " + std::to_string(static_cast<int>(kind)));
}

// The products' math in each Precision, on float32 data with float32 accumulation: fp32 keeps every product
// in float32 (FMA math: no TF32), tf32 lets cuDNN use TF32 tensor cores (its default math on float32 data,
// as the convolutions), bf16 and fp16 allow tensor-op math with conversion, cuDNN's one way to run float32
// RNN data on reduced-precision tensor cores (cuDNN converts to fp16; it offers no bf16 conversion).
inline cudnnMathType_t rnn_math(Precision p) {
  switch (p) {
    case Precision::Fp32:
      return CUDNN_FMA_MATH;
    case Precision::Tf32:
      return CUDNN_DEFAULT_MATH;
    case Precision::Bf16:
    case Precision::Fp16:
      return CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  }
  return CUDNN_FMA_MATH;
}

// One cuDNN RNN descriptor over a segment of the stack (cudnn_rnn_layout.h) for a batch of n sequences of t
// steps, with its data descriptors and the sizes of its spaces. Made on the thread that queues the op (its
// own cuDNN handle, with the device current), read-only afterwards, so the op's worker may use it.
struct SegmentPlan {
  SegmentPlan(cudnnHandle_t handle, const RnnOptions& o, cudnn_layout::Segment segment, int64_t n, int64_t t,
              Precision precision, bool training, const std::string& layer)
      : seg(segment),
        input_size(segment.first_layer == 0 ? o.input_size : o.hidden_size * o.directions()),
        dropout("cudnnCreateDropoutDescriptor", layer),
        rnn("cudnnCreateRNNDescriptor", layer),
        x("cudnnCreateRNNDataDescriptor", layer),
        y("cudnnCreateRNNDataDescriptor", layer),
        h("cudnnCreateTensorDescriptor", layer) {
    const int hidden = to_int(o.hidden_size, "a recurrent layer's hidden size");
    const int batch = to_int(n, "a recurrent layer's batch"), steps = to_int(t, "a recurrent layer's steps");
    const int in = to_int(input_size, "a recurrent layer's input size");
    const int out = to_int(o.hidden_size * o.directions(), "a recurrent layer's output size");
    // No dropout inside cuDNN (cudnn_rnn_layout.h's segments say why): a rate of 0 needs no state.
    GN_RNN_CHECK(cudnnSetDropoutDescriptor(dropout.get(), handle, 0.0f, nullptr, 0, 0), layer);
    // projSize = hiddenSize: no projection. PADDED_IO_ENABLED is what allows the unpacked layouts.
    GN_RNN_CHECK(
        cudnnSetRNNDescriptor_v8(rnn.get(), CUDNN_RNN_ALGO_STANDARD, cell_mode(o.kind),
                                 o.bias ? CUDNN_RNN_DOUBLE_BIAS : CUDNN_RNN_NO_BIAS,
                                 o.bidirectional ? CUDNN_BIDIRECTIONAL : CUDNN_UNIDIRECTIONAL,
                                 CUDNN_LINEAR_INPUT, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, rnn_math(precision),
                                 in, hidden, hidden, to_int(segment.layers, "a recurrent layer's layers"),
                                 dropout.get(), CUDNN_RNN_PADDED_IO_ENABLED),
        layer);
    // Batch-first [N, T, features], every sequence t steps long: x, y, dy and dx are read where they lie.
    const std::vector<int> lengths(static_cast<size_t>(n), steps);
    GN_RNN_CHECK(
        cudnnSetRNNDataDescriptor(x.get(), CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED,
                                  steps, batch, in, lengths.data(), nullptr),
        layer);
    GN_RNN_CHECK(
        cudnnSetRNNDataDescriptor(y.get(), CUDNN_DATA_FLOAT, CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED,
                                  steps, batch, out, lengths.data(), nullptr),
        layer);
    // The state [layers * directions, N, H], recurrent.h's h0 / h_n layout: the segment's layers are one
    // contiguous slice of it.
    const int dims[3] = {to_int(segment.layers * o.directions(), "a recurrent layer's layers"), batch,
                         hidden};
    const int strides[3] = {batch * hidden, hidden, 1};
    GN_RNN_CHECK(cudnnSetTensorNdDescriptor(h.get(), CUDNN_DATA_FLOAT, 3, dims, strides), layer);
    GN_RNN_CHECK(cudnnGetRNNWeightSpaceSize(handle, rnn.get(), &weight_bytes), layer);
    GN_RNN_CHECK(cudnnGetRNNTempSpaceSizes(handle, rnn.get(),
                                           training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE,
                                           x.get(), &work_bytes, training ? &reserve_bytes : nullptr),
                 layer);
  }

  cudnn_layout::Segment seg;
  int64_t input_size;  // the segment's first layer's input features
  // Declared before the RNN descriptor, which refers to it, so that it is destroyed after it.
  DropoutDescriptor dropout;
  RnnDescriptor rnn;
  DataDescriptor x, y;
  TensorDescriptor h;  // hx, hy, cx, cy alike
  size_t weight_bytes = 0, work_bytes = 0, reserve_bytes = 0;
};

// A run of floats that lies contiguously both in rnn_params' parameter `param` (from param_offset) and in
// a segment's weight space (from space_offset).
struct WeightBlock {
  size_t param;
  int64_t param_offset, space_offset, floats;
};

// The blocks of every parameter of the segment's layers in the weight space at `space` (a device pointer,
// which cudnnGetRNNWeightParams only offsets): one per gate, from cudnn_rnn_layout.h's mapping, each
// checked against the size cuDNN reports; neighbours contiguous on both sides merge (cuDNN lays a
// parameter's gates one after another, so a parameter is usually one block).
inline std::vector<WeightBlock> weight_blocks(cudnnHandle_t handle, const SegmentPlan& sp,
                                              const RnnOptions& o, const float* space,
                                              const std::string& layer) {
  namespace cl = cudnn_layout;
  const int gates = rnn_gate_count(o.kind);
  const int64_t d = o.directions(), h = o.hidden_size,
                space_floats = static_cast<int64_t>(sp.weight_bytes / 4);
  TensorDescriptor desc("cudnnCreateTensorDescriptor", layer);
  std::vector<WeightBlock> blocks;
  for (int64_t l = sp.seg.first_layer; l < sp.seg.first_layer + sp.seg.layers; ++l)
    for (int64_t dir = 0; dir < d; ++dir)
      for (int64_t w = 0; w < cl::params_per_slot(o.bias); ++w) {
        const cl::ParamPlace p{l, dir, static_cast<cl::Which>(w)};
        const auto index = static_cast<size_t>(cl::param_index(l, dir, p.which, d, o.bias));
        const int64_t cols = cl::param_cols(p, o.input_size, h, d), floats = cl::gate_floats(h, cols);
        for (int gate = 0; gate < gates; ++gate) {
          void* addr = nullptr;
          const int pseudo = cl::pseudo_layer(p, sp.seg.first_layer, d),
                    id = cl::lin_layer_id(p, gates, gate);
          if (p.is_bias())
            GN_RNN_CHECK(cudnnGetRNNWeightParams(handle, sp.rnn.get(), pseudo, sp.weight_bytes, space, id,
                                                 nullptr, nullptr, desc.get(), &addr),
                         layer);
          else
            GN_RNN_CHECK(cudnnGetRNNWeightParams(handle, sp.rnn.get(), pseudo, sp.weight_bytes, space, id,
                                                 desc.get(), &addr, nullptr, nullptr),
                         layer);
          cudnnDataType_t type{};
          int rank = 0, dims[8] = {}, strides[8] = {};
          GN_RNN_CHECK(cudnnGetTensorNdDescriptor(desc.get(), 8, &type, &rank, dims, strides), layer);
          int64_t reported = rank > 0 ? 1 : 0;
          for (int i = 0; i < rank && i < 8; ++i) reported *= dims[i];
          const std::ptrdiff_t bytes = static_cast<const char*>(addr) - reinterpret_cast<const char*>(space);
          const std::string what = std::to_string(index) + " (pseudo-layer " + std::to_string(pseudo) +
                                   ", linLayerID " + std::to_string(id) + ")";
          if (!addr || reported != floats || type != CUDNN_DATA_FLOAT)
            throw BackendError("cudnnGetRNNWeightParams for " + layer + ": parameter " + what + " has " +
                               std::to_string(reported) + " elements in cuDNN's weight space, expected " +
                               std::to_string(floats));
          const int64_t at = bytes / 4;
          if (bytes % 4 != 0 || at < 0 || at + floats > space_floats)
            throw BackendError("cudnnGetRNNWeightParams for " + layer + ": parameter " + what +
                               " lies outside the weight space of " + std::to_string(sp.weight_bytes) +
                               " bytes");
          const int64_t from = cl::gate_offset(h, cols, gate);
          WeightBlock* last = blocks.empty() ? nullptr : &blocks.back();
          if (last && last->param == index && last->param_offset + last->floats == from &&
              last->space_offset + last->floats == at)
            last->floats += floats;
          else
            blocks.push_back({index, from, at, floats});
        }
      }
  return blocks;
}

}  // namespace
}  // namespace gn::nn
