// The gradient all-reduce of a run: which reducer it takes, and the host reduction that serves every run
// NCCL cannot.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "../cuda_support.h"
#include "gpunodes/dist/world.h"
#include "gpunodes/runtime.h"

namespace gn::nn::trainer_parts {

// Sums each gradient over the replicas on the host, in replica order, so every replica gets the very same
// sum. CPU devices share host memory, so their gradients are summed in place by one op; GPU gradients (a GPU
// training beside the CPU) are first copied to the host and get the sum copied back. In a distributed run
// the same op then sums the bucket over the ranks with one MPI all-reduce of the bucket packed flat (as DDP
// flattens its buckets): one collective per bucket, not per tensor.
class HostReducer final : public GradientReducer {
 public:
  // world: null, or the MPI world whose ranks take part. Every op writes `order` in a distributed run, which
  // keeps the collectives in the order they were enqueued, the same on every rank.
  HostReducer(Runtime& rt, dist::World* world, VarPtr order);
  void allreduce(const std::vector<std::vector<Tensor>>& grads) override;

 private:
  Runtime& rt_;
  dist::World* world_;
  VarPtr order_;
};

struct ChosenReducer {
  std::unique_ptr<GradientReducer> reducer;  // null when there is nothing to reduce (one device, one process)
  // "nccl", "host", "host (NCCL failed: <why>)" or "none", with " + mpi (N ranks)" in a distributed run:
  // Trainer::reducer_name().
  std::string name;
};
// The reducer of a run on `devices` (this process's) and `world` (null: this process alone): none for one
// device alone; NCCL when every device is a CUDA GPU and NCCL takes them; the host reducer otherwise. A
// process alone falls back to the host when NCCL refuses; in a distributed run the refusal is thrown, since
// every rank must take the same path.
ChosenReducer choose_reducer(Runtime& rt, const std::vector<Device>& devices, dist::World* world,
                             VarPtr order);

}  // namespace gn::nn::trainer_parts
