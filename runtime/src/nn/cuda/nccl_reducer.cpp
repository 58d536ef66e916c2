// Gradient all-reduce across CUDA devices with NCCL: one communicator per local device, from ncclCommInitAll
// in one process, or, in a distributed run, from ncclCommInitRank over every rank's devices with a unique id
// that rank 0 makes and broadcasts through MPI (NCCL's own MPI example). One host thread (device 0's
// copy-stream worker) issues every local device's ncclAllReduce between ncclGroupStart and ncclGroupEnd,
// which NCCL requires when one thread drives several devices. Each device's call goes on a stream of the
// reducer's own, so the reduction overlaps the compute streams' remaining backward work; the op waits for
// those streams before it completes, so the engine's ordering (all-reduce after backward, SGD after
// all-reduce) holds.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>

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

  NcclComms(const std::vector<Device>& devs, dist::World* world) {
    for (Device d : devs) devices.push_back(d.index);
    comms.assign(devices.size(), nullptr);
    try {
      int previous = 0;
      GN_CUDA_CHECK(cudaGetDevice(&previous));
      if (!world) {
        GN_NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(devices.size()), devices.data()));
      } else {
        ncclUniqueId id{};
        if (world->is_root()) GN_NCCL_CHECK(ncclGetUniqueId(&id));
        std::vector<char> bytes(reinterpret_cast<const char*>(&id),
                                reinterpret_cast<const char*>(&id) + sizeof id);
        world->broadcast(bytes, 0, "sharing NCCL's unique id");
        if (bytes.size() != sizeof id) throw dist::CommError("NCCL's unique id arrived with the wrong size");
        std::memcpy(&id, bytes.data(), sizeof id);
        const int local = static_cast<int>(devices.size());
        const int nranks = world->size() * local;
        // Several devices of one process join in one group, or the first init would wait for the others.
        GN_NCCL_CHECK(ncclGroupStart());
        ncclResult_t rc = ncclSuccess;
        for (int i = 0; i < local && rc == ncclSuccess; ++i) {
          if (cudaSetDevice(devices[static_cast<size_t>(i)]) != cudaSuccess) {
            rc = ncclUnhandledCudaError;
            break;
          }
          rc = ncclCommInitRank(&comms[static_cast<size_t>(i)], nranks, id, world->rank() * local + i);
        }
        const ncclResult_t end = ncclGroupEnd();
        (void)cudaSetDevice(previous);
        GN_NCCL_CHECK(rc);
        GN_NCCL_CHECK(end);
      }
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
  NcclReducer(Runtime& rt, const std::vector<Device>& devices, dist::World* world, VarPtr order)
      : rt_(rt),
        devices_(devices),
        comms_(std::make_shared<NcclComms>(devices, world)),
        order_(std::move(order)) {}

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
    std::vector<VarPtr> writes = vars;
    if (order_) writes.push_back(order_);
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
          // Polled, not cudaStreamSynchronize: a peer rank that died leaves NCCL waiting forever, which only
          // ncclCommGetAsyncError sees; the communicators are then aborted and the step fails, never hangs.
          for (size_t r = 0; r < grads.size(); ++r) {
            GN_CUDA_CHECK(cudaSetDevice(comms->devices[r]));
            while (true) {
              const cudaError_t q = cudaStreamQuery(comms->streams[r]);
              if (q == cudaSuccess) break;
              if (q != cudaErrorNotReady) GN_CUDA_CHECK(q);
              ncclResult_t async = ncclSuccess;
              GN_NCCL_CHECK(ncclCommGetAsyncError(comms->comms[r], &async));
              if (async != ncclSuccess || ctx.cancelled()) {
                for (ncclComm_t c : comms->comms) (void)ncclCommAbort(c);
                comms->comms.assign(comms->comms.size(), nullptr);
                if (async == ncclSuccess) ctx.check_cancelled();
                throw dist::CommError(std::string("all-reduce (nccl): ") + ncclGetErrorString(async) +
                                      " (a rank was lost or failed)");
              }
              std::this_thread::yield();
            }
          }
          GN_CUDA_CHECK(cudaSetDevice(previous));
        },
        vars, writes, devices_[0], StreamKind::Collective, {"all-reduce (nccl)", "", bytes, 0});
  }

 private:
  Runtime& rt_;
  std::vector<Device> devices_;
  std::shared_ptr<NcclComms> comms_;
  VarPtr order_;
};

}  // namespace

std::unique_ptr<GradientReducer> make_nccl_reducer(Runtime& rt, const std::vector<Device>& devices,
                                                   dist::World* world, VarPtr order) {
  for (Device d : devices)
    if (!d.is_cuda()) return nullptr;
  return std::make_unique<NcclReducer>(rt, devices, world, std::move(order));
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
