// What a device kind implements: an allocator, its stream workers, and the kernels the ops call.
// Kernel calls run inside an op body on that device's worker; `ctx.native_stream` is where they enqueue.
// A CUDA worker waits for its stream after each op, so when a kernel call returns the op may still be in
// flight on the GPU but will be complete before any dependent op starts.
#pragma once
#include <cstdint>
#include <functional>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "gpunodes/device.h"
#include "gpunodes/engine.h"
#include "gpunodes/memory.h"
#include "gpunodes/precision.h"

namespace gn {

struct Storage;  // tensor.h

enum class BinaryOp { Add, Sub, Mul, Div };
enum class UnaryOp { Exp, Relu, ScaleShift };  // ScaleShift: y = a*x + b
enum class ReduceOp { Sum, FrobeniusNorm };
enum class RandomKind { Uniform, Normal };  // Uniform(a, b) or Normal(mean a, std b)

struct GemmArgs {
  bool trans_a = false, trans_b = false;
  int64_t m = 0, n = 0, k = 0;  // C[m,n] = op(A)[m,k] * op(B)[k,n], all row-major
  const float* a = nullptr;
  const float* b = nullptr;
  float* c = nullptr;
  Precision precision = Precision::Fp32;
};

// Where a copy reads or writes: a pointer and the device whose memory it is.
struct CopyEnd {
  void* ptr;
  Device device;
};

// Work recorded once and replayed: a training step as a CUDA graph on a GPU (one launch instead of one per
// kernel), or as its recorded op bodies on a CPU (one engine op instead of one per layer). A replay works on
// the memory the captured step used, and a new step is fed by writing its inputs into the same tensors. A
// CUDA graph holds only raw pointers, so the caller hands the work the storage of every tensor the step
// reads and writes (hold()); an op that replays holds the work, and with it that memory, until it ran.
class CapturedWork {
 public:
  virtual ~CapturedWork() = default;
  // Inside an op on the captured device's compute stream.
  virtual void replay(OpContext& ctx) = 0;
  virtual std::string describe() const = 0;  // "a CUDA graph of 412 nodes", "57 recorded ops"
  // Keeps `storages` alive as long as this work: they are let go after a derived destructor has run, so a
  // graph is destroyed before its memory goes back to the allocator. May be called more than once.
  void hold(std::vector<std::shared_ptr<Storage>> storages) {
    held_.insert(held_.end(), std::make_move_iterator(storages.begin()),
                 std::make_move_iterator(storages.end()));
  }
  // How many storages hold() was given.
  size_t held_count() const { return held_.size(); }

 private:
  std::vector<std::shared_ptr<Storage>> held_;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceKind kind() const = 0;
  virtual std::vector<DeviceInfo> enumerate() = 0;
  virtual std::unique_ptr<Allocator> make_allocator(Device device, Profiler* profiler) = 0;
  virtual std::unique_ptr<StreamWorker> make_worker(Device device, StreamKind stream) = 0;

  virtual void fill(float* y, int64_t n, float value, OpContext& ctx) = 0;
  // Philox4x32-10 stream `seed`, element i from counter i: identical values on every device.
  virtual void random(float* y, int64_t n, RandomKind kind, uint64_t seed, float a, float b,
                      OpContext& ctx) = 0;
  virtual void arange(float* y, int64_t n, float start, float step, OpContext& ctx) = 0;
  virtual void gemm(const GemmArgs& args, OpContext& ctx) = 0;
  // y may be a (in place).
  virtual void binary(BinaryOp op, const float* a, const float* b, float* y, int64_t n, OpContext& ctx) = 0;
  virtual void unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha, float beta,
                     OpContext& ctx) = 0;
  // Writes one float to y, which lives on this device.
  virtual void reduce(ReduceOp op, const float* x, int64_t n, float* y, OpContext& ctx) = 0;
  // Runs `step` inside the op whose context is ctx (its device's compute stream), capturing the work it
  // pushes (engine.h's InlineOps), and returns it for replay. The step's work is done for this once when the
  // call returns. Throws CaptureError when the step cannot be captured; on a GPU none of it ran then.
  virtual std::unique_ptr<CapturedWork> capture(const std::function<void()>& step, OpContext& ctx,
                                                Allocator& allocator) = 0;
  // Copies bytes where at least one end is on this backend's kind. `pinned_staging` asks host<->device
  // copies to go through page-locked memory so they run asynchronously to the host.
  virtual void copy(CopyEnd dst, CopyEnd src, int64_t bytes, bool pinned_staging, OpContext& ctx) = 0;
};

std::unique_ptr<Backend> make_cpu_backend(int cpu_devices);
// Null when the CUDA backend was not built. The backend enumerates zero devices without a driver or GPU.
std::unique_ptr<Backend> make_cuda_backend();

}  // namespace gn
