// Builds without the CUDA toolkit: there is no CUDA backend, and the runtime runs on CPU devices only.
#include "gpunodes/backend.h"

namespace gn {

std::unique_ptr<Backend> make_cuda_backend() {
  return nullptr;
}

}  // namespace gn
