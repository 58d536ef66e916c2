// What the CUDA part of the nn layer offers the rest of it. Without the CUDA backend (no_cuda_nn.cpp) there
// are no CUDA kernels, no page-locked memory and no NCCL.
#pragma once
#include <cstddef>
#include <memory>
#include <vector>

#include "gpunodes/device.h"
#include "gpunodes/dist/world.h"
#include "gpunodes/runtime.h"
#include "gpunodes/tensor.h"

namespace gn::nn {

// Page-locked host memory, or null when CUDA is absent or refuses; free with pinned_free.
void* pinned_alloc(size_t bytes);
void pinned_free(void* ptr);

// Sums each gradient over the replicas (and, in a distributed run, over every rank's replicas) and leaves the
// sum in every replica: grads[r][i] is gradient i of local replica r. Enqueues its work on the engine and
// returns at once.
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual void allreduce(const std::vector<std::vector<Tensor>>& grads) = 0;
};

// NCCL across CUDA devices (one communicator per device, grouped calls); null when NCCL was not built. With
// a world (distributed), one communicator spans every rank's devices, bootstrapped through MPI: rank 0 makes
// the unique id (ncclGetUniqueId) and broadcasts it, each device joins with ncclCommInitRank. Every op
// writes `order`, which keeps the collectives in enqueue order.
std::unique_ptr<GradientReducer> make_nccl_reducer(Runtime& rt, const std::vector<Device>& devices,
                                                   dist::World* world, VarPtr order);

}  // namespace gn::nn
