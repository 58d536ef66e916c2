// The recurrent layers (recurrent.h) on a CUDA device: cuDNN's RNN API, in cuda/cuda_recurrent_kernels.cu.
// recurrent.cpp checks every argument (shapes, devices, options, precision, a backward's forward) and
// branches here for a CUDA input; the CPU runs the recurrence of recurrent.cpp instead. Without the CUDA
// backend (no_cuda_recurrent.cpp) every call throws Error.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "gpunodes/engine.h"
#include "gpunodes/nn/recurrent.h"
#include "gpunodes/precision.h"
#include "gpunodes/tensor.h"

namespace gn::nn {

// What a CUDA training forward keeps for its backward: its cuDNN descriptors, the weight space it ran with,
// cuDNN's reserve space, the input, initial state and outputs of every cuDNN call. Opaque here.
struct CudnnRnnState;

struct CudnnRnnOutputs {
  Tensor y, h_n, c_n;                    // as RnnResult's
  std::shared_ptr<CudnnRnnState> saved;  // training only
};

// rnn_forward on x's CUDA device, its arguments checked: one engine op, described by `info`, that assembles
// cuDNN's weight space from `weights` and runs cudnnRNNForward (training or inference) in `precision`.
CudnnRnnOutputs cudnn_rnn_forward(const RnnOptions& o, const Tensor& x, const std::vector<Tensor>& weights,
                                  const Tensor& h0, const Tensor& c0, bool training, uint64_t seed,
                                  Precision precision, OpInfo info);

// The input of the forward that made `s`: the backward's tensors must share its device.
const Tensor& cudnn_forward_input(const CudnnRnnState& s);

// rnn_backward of the forward that made `s`, its arguments checked and that forward marked as taken (its
// reserve and weight spaces become this backward's scratch, so it has one backward): one engine op,
// described by `info`, running cudnnRNNBackwardData_v8 and cudnnRNNBackwardWeights_v8 and scattering the
// weight gradients into rnn_params order. The products use the weights the forward assembled.
RnnGrads cudnn_rnn_backward(const RnnOptions& o, std::shared_ptr<const CudnnRnnState> s, const Tensor& dy,
                            bool need_dx, Precision precision, OpInfo info);

}  // namespace gn::nn
