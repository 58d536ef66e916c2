// Builds without the CUDA toolkit: no CUDA recurrent kernels.
#include "recurrent_kernels.h"

namespace gn::nn {

RecurrentKernels* cuda_recurrent_kernels() {
  return nullptr;
}

}  // namespace gn::nn
