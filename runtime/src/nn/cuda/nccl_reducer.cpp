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
#include <mutex>
#include <string>
#include <thread>

#include "../../cuda/cuda_check.h"
#include "../../cuda/cuda_worker.h"
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

  // After an error inside a collective NCCL's state is unknown (a peer may wait in it forever), so every
  // communicator is aborted (ncclCommAbort frees it, as ncclCommDestroy would, and stops its kernels) and
  // the reducer stays unusable: each later call fails with the first error instead of handing NCCL a dead
  // communicator. Never throws.
  void abort(const std::string& why) noexcept {
    std::lock_guard lock(mutex);
    if (!aborted.empty()) return;
    try {
      aborted = why.empty() ? std::string("an unknown error") : why;
    } catch (...) {
    }
    for (ncclComm_t& c : comms) {
      if (c) (void)ncclCommAbort(c);
      c = nullptr;
    }
    (void)cudaGetLastError();
  }
  // Throws CommError when abort() ran.
  void check_usable() {
    std::lock_guard lock(mutex);
    if (!aborted.empty()) throw dist::CommError("NCCL communicator aborted after: " + aborted);
  }

  std::mutex mutex;
  std::string aborted;  // the first error, once abort() ran

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
          comms->check_usable();
          ctx.check_cancelled();
          try {
            run(*comms, grads, ctx);
          } catch (const CancelledError&) {
            comms->abort("a cancel during an all-reduce");
            throw;
          } catch (const std::exception& e) {
            comms->abort(e.what());
            throw;
          } catch (...) {
            comms->abort({});
            throw;
          }
        },
        vars, writes, devices_[0], StreamKind::Collective, {"all-reduce (nccl)", "", bytes, 0});
  }

 private:
  // One all-reduce of every device's gradients, waited for. Throws on any failure; the caller aborts.
  static void run(NcclComms& comms, const std::vector<std::vector<Tensor>>& grads, OpContext& ctx) {
    // The loop below moves this thread across the devices; the collective worker must get its own back on
    // every path, errors included.
    cuda::DeviceGuard restore(comms.devices.front());
    GN_NCCL_CHECK(ncclGroupStart());
    ncclResult_t rc = ncclSuccess;
    for (size_t r = 0; r < grads.size() && rc == ncclSuccess; ++r)
      for (const Tensor& g : grads[r]) {
        rc = ncclAllReduce(g.data(), g.data(), static_cast<size_t>(g.numel()), ncclFloat, ncclSum,
                           comms.comms[r], comms.streams[r]);
        if (rc != ncclSuccess) break;
      }
    // The group must be closed whatever happened inside it.
    const ncclResult_t end = ncclGroupEnd();
    GN_NCCL_CHECK(rc);
    GN_NCCL_CHECK(end);
    // Polled, not cudaStreamSynchronize: a peer rank that died leaves NCCL waiting forever, which only
    // ncclCommGetAsyncError sees; the communicators are then aborted and the step fails, never hangs.
    for (size_t r = 0; r < grads.size(); ++r) {
      GN_CUDA_CHECK(cudaSetDevice(comms.devices[r]));
      while (true) {
        const cudaError_t q = cudaStreamQuery(comms.streams[r]);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) GN_CUDA_CHECK(q);
        ncclResult_t async = ncclSuccess;
        GN_NCCL_CHECK(ncclCommGetAsyncError(comms.comms[r], &async));
        if (async != ncclSuccess)
          throw dist::CommError(std::string("all-reduce (nccl): ") + ncclGetErrorString(async) +
                                " (a rank was lost or failed)");
        ctx.check_cancelled();
        std::this_thread::yield();
      }
    }
  }

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
