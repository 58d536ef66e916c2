// Builds without the CUDA toolkit: no CUDA layer kernels, page-locked memory or NCCL.
#include "attention_kernels.h"
#include "cuda_support.h"
#include "kernels.h"
#include "sequence_kernels.h"

namespace gn::nn {

NnKernels* cuda_nn_kernels() {
  return nullptr;
}
SequenceKernels* cuda_sequence_kernels() {
  return nullptr;
}
AttentionKernels* cuda_attention_kernels() {
  return nullptr;
}
void* pinned_alloc(size_t) {
  return nullptr;
}
void pinned_free(void*) {}
std::unique_ptr<GradientReducer> make_nccl_reducer(Runtime&, const std::vector<Device>&, dist::World*,
                                                   VarPtr) {
  return nullptr;
}

}  // namespace gn::nn
