// Builds without the CUDA toolkit: no cuDNN recurrent layers. recurrent.cpp branches here only for a CUDA
// tensor, which such a build never makes.
#include <memory>
#include <vector>

#include "cudnn_recurrent.h"
#include "gpunodes/errors.h"

namespace gn::nn {

namespace {
[[noreturn]] void not_built() {
  throw Error("the recurrent layers on CUDA need the CUDA backend, which this build does not have");
}
}  // namespace

CudnnRnnOutputs cudnn_rnn_forward(const RnnOptions&, const Tensor&, const std::vector<Tensor>&, const Tensor&,
                                  const Tensor&, bool, uint64_t, Precision, OpInfo) {
  not_built();
}

const Tensor& cudnn_forward_input(const CudnnRnnState&) {
  not_built();
}

RnnGrads cudnn_rnn_backward(const RnnOptions&, std::shared_ptr<const CudnnRnnState>, const Tensor&, bool,
                            Precision, OpInfo) {
  not_built();
}

}  // namespace gn::nn
