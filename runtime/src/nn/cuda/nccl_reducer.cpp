// Gradient all-reduce across CUDA devices with NCCL, single-process and multi-device: one communicator per
// device from ncclCommInitAll, and one host thread (device 0's copy-stream worker) that issues every device's
// ncclAllReduce between ncclGroupStart and ncclGroupEnd, which NCCL requires when one thread drives several
// devices. Each device's call goes on a stream of the reducer's own, so the reduction overlaps the compute
// streams' remaining backward work; the op waits for those streams before it completes, so the engine's
// ordering (all-reduce after backward, SGD after all-reduce) holds.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <memory>

#include "../../cuda/cuda_check.h"
#include "../cuda_support.h"
#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

// Communicators and streams, shared by the reducer and every op it enqueued: the last one to finish frees
// them.
struct NcclComms {
  std::vector<int> devices;
  std::vector<ncclComm_t> comms;
  std::vector<cudaStream_t> streams;

  explicit NcclComms(const std::vector<Device>& devs) {
    for (Device d : devs) devices.push_back(d.index);
    comms.assign(devices.size(), nullptr);
    try {
      GN_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
      int previous = 0;
      GN_CUDA_CHECK(cudaGetDevice(&previous));
      for (int d : devices) {
        cudaStream_t s = nullptr;
        const cudaError_t st = cudaSetDevice(d) == cudaSuccess
                                   ? cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)
                                   : cudaGetLastError();
        if (st != cudaSuccess) {
          (void)cudaSetDevice(previous);
          GN_CUDA_CHECK(st);
        }
        streams.push_back(s);
      }
      GN_CUDA_CHECK(cudaSetDevice(previous));
    } catch (...) {
      release();
      throw;
    }
  }
  ~NcclComms() { release(); }
  NcclComms(const NcclComms&) = delete;
  NcclComms& operator=(const NcclComms&) = delete;

  void release() noexcept {
    // Never throws: destruction may happen on a worker thread at shutdown.
    for (size_t i = 0; i < streams.size(); ++i) {
      if (!streams[i]) continue;
      if (cudaSetDevice(devices[i]) == cudaSuccess) {
        (void)cudaStreamSynchronize(streams[i]);
        (void)cudaStreamDestroy(streams[i]);
      }
    }
    streams.clear();
    for (ncclComm_t c : comms)
      if (c) (void)ncclCommDestroy(c);
    comms.clear();
    (void)cudaGetLastError();
  }
};

class NcclReducer final : public GradientReducer {
 public:
  NcclReducer(Runtime& rt, const std::vector<Device>& devices)
      : rt_(rt), devices_(devices), comms_(std::make_shared<NcclComms>(devices)) {}

  void allreduce(const std::vector<std::vector<Tensor>>& grads) override {
    if (grads.size() != devices_.size()) throw Error("all-reduce: one gradient list per device expected");
    std::vector<VarPtr> vars;
    int64_t bytes = 0;
    for (size_t r = 0; r < grads.size(); ++r)
      for (const Tensor& g : grads[r]) {
        if (g.device() != devices_[r])
          throw Error("all-reduce: a gradient of replica " + std::to_string(r) + " is on " +
                      g.device().str() + ", not " + devices_[r].str());
        vars.push_back(g.var());
        bytes += 2 * g.bytes();
      }
    auto comms = comms_;
    rt_.engine().push(
        [comms, grads](OpContext& ctx) {
          ctx.check_cancelled();
          int previous = 0;
          GN_CUDA_CHECK(cudaGetDevice(&previous));
          GN_NCCL_CHECK(ncclGroupStart());
          ncclResult_t rc = ncclSuccess;
          for (size_t r = 0; r < grads.size() && rc == ncclSuccess; ++r)
            for (const Tensor& g : grads[r]) {
              rc = ncclAllReduce(g.data(), g.data(), static_cast<size_t>(g.numel()), ncclFloat, ncclSum,
                                 comms->comms[r], comms->streams[r]);
              if (rc != ncclSuccess) break;
            }
          // The group must be closed whatever happened inside it.
          const ncclResult_t end = ncclGroupEnd();
          GN_NCCL_CHECK(rc);
          GN_NCCL_CHECK(end);
          for (size_t r = 0; r < grads.size(); ++r) {
            GN_CUDA_CHECK(cudaSetDevice(comms->devices[r]));
            GN_CUDA_CHECK(cudaStreamSynchronize(comms->streams[r]));
          }
          GN_CUDA_CHECK(cudaSetDevice(previous));
        },
        vars, vars, devices_[0], StreamKind::Copy, {"all-reduce (nccl)", "", bytes, 0});
  }

 private:
  Runtime& rt_;
  std::vector<Device> devices_;
  std::shared_ptr<NcclComms> comms_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_nccl_reducer(Runtime& rt, const std::vector<Device>& devices) {
  for (Device d : devices)
    if (!d.is_cuda()) return nullptr;
  return std::make_unique<NcclReducer>(rt, devices);
}

void* pinned_alloc(size_t bytes) {
  void* p = nullptr;
  // Portable: any device's copy may read it. A refusal (no GPU, no driver) just means pageable memory.
  if (cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
    (void)cudaGetLastError();
    return nullptr;
  }
  return p;
}

void pinned_free(void* ptr) {
  if (ptr) (void)cudaFreeHost(ptr);
}

}  // namespace gn::nn
