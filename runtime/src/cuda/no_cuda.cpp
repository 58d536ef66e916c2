// Built when the CUDA toolkit is absent: the runtime then has only CPU devices.
#include "gpunodes/backend.h"

namespace gn {
std::unique_ptr<Backend> make_cuda_backend() { return nullptr; }
}  // namespace gn
