// The CUDA backend: cuBLAS for GEMM, a handful of small kernels for the rest (fill, random, arange,
// elementwise, reductions), cudaMemcpy*Async for copies. Every call enqueues on the op's stream; the worker
// waits for the stream at the end of each op (see cuda_worker.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <climits>
#include <cstring>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <utility>

#include "cuda_allocator.h"
#include "cuda_check.h"
#include "cuda_math.h"
#include "cuda_worker.h"
#include "gpunodes/backend.h"
#include "gpunodes/errors.h"
#include "gpunodes/random.h"

namespace gn {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Grid-stride loops: enough blocks to fill any current GPU; each thread loops over the rest.
constexpr int64_t kMaxBlocks = 65536;
// Host<->device copies through page-locked memory go in chunks this size, two in flight.
constexpr size_t kStageChunk = 16u << 20;
// Large GEMMs go in row chunks of about this many FLOPs (~20 ms at fp32 on an H100-class GPU), so that a
// cancel is seen well within a second. The seed's 4000^3 products (1.3e11) stay in one call.
constexpr double kGemmChunkFlops = 1e12;

int grid_for(int64_t n) {
  return static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kMaxBlocks));
}

// The stream an op body enqueues on: its worker's. Outside a CUDA worker (a program calling the backend
// directly) the per-thread default stream on `device`, waited for before returning.
class OpStream {
 public:
  OpStream(const OpContext& ctx, int device) : guard_(device) {
    if (ctx.native_stream && ctx.device.is_cuda() && ctx.device.index == device) {
      stream_ = static_cast<cudaStream_t>(ctx.native_stream);
    } else {
      stream_ = cudaStreamPerThread;
      owned_ = true;
    }
  }
  ~OpStream() {
    if (owned_) (void)cudaStreamSynchronize(stream_);  // error path: enqueued work must not outlive the op
  }
  OpStream(const OpStream&) = delete;
  OpStream& operator=(const OpStream&) = delete;
  cudaStream_t get() const { return stream_; }
  void finish() {
    if (!owned_) return;
    owned_ = false;
    GN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }

 private:
  DeviceGuard guard_;
  cudaStream_t stream_ = nullptr;
  bool owned_ = false;
};

// --- kernels -----------------------------------------------------------------------------------------------

// y[i] = f(i) for every i: one kernel template serves fill, random, arange and the elementwise ops. y is not
// __restrict__: f may read the output itself (add_into passes y as BinaryFn's a), and a restrict pointer whose
// object is also accessed through another pointer is undefined behaviour.
template <class F>
__global__ void map_kernel(float* y, int64_t n, F f) {
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    y[i] = f(i);
}

struct FillFn {
  float value;
  __device__ float operator()(int64_t) const { return value; }
};

struct UniformFn {
  uint64_t seed;
  float lo, hi;
  __device__ float operator()(int64_t i) const {
    return philox::uniform_at(seed, static_cast<uint64_t>(i), lo, hi);
  }
};

struct NormalFn {
  uint64_t seed;
  float mean, std;
  __device__ float operator()(int64_t i) const {
    return philox::normal_at(seed, static_cast<uint64_t>(i), mean, std);
  }
};

// Explicit round-to-nearest multiply and add: nvcc would otherwise fuse them into an FMA and differ from
// the CPU's result in the last bit.
struct ArangeFn {
  float start, step;
  __device__ float operator()(int64_t i) const {
    return __fadd_rn(start, __fmul_rn(step, static_cast<float>(i)));
  }
};

struct BinaryFn {
  BinaryOp op;
  const float* a;  // may be the output (add_into): no __restrict__
  const float* b;  // may be too (add_into(t, t)), so neither is
  __device__ float operator()(int64_t i) const {
    const float x = a[i], y = b[i];
    switch (op) {
      case BinaryOp::Add:
        return x + y;
      case BinaryOp::Sub:
        return x - y;
      case BinaryOp::Mul:
        return x * y;
      case BinaryOp::Div:
        return x / y;  // IEEE division: nvcc's default -prec-div=true
    }
    return 0.0f;
  }
};

struct UnaryFn {
  UnaryOp op;
  const float* __restrict__ x;
  float alpha, beta;
  __device__ float operator()(int64_t i) const {
    const float v = x[i];
    switch (op) {
      case UnaryOp::Exp:
        return expf(v);
      case UnaryOp::Relu:
        return v > 0.0f ? v : 0.0f;
      case UnaryOp::ScaleShift:
        return __fadd_rn(__fmul_rn(alpha, v), beta);
    }
    return 0.0f;
  }
};

template <class F>
void launch_map(float* y, int64_t n, F f, cudaStream_t stream) {
  if (n <= 0) return;
  map_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, n, f);
  GN_CUDA_CHECK_LAUNCH();
}

// Reductions in two passes with a fixed grid: each block sums its share in double into partial[block], then
// one block sums the partials. No atomics, so the result is the same on every run.
template <bool kSquare>
__global__ void reduce_partial_kernel(const float* __restrict__ x, int64_t n, double* __restrict__ partial) {
  __shared__ double shared[kThreads];
  double acc = 0;
  const int64_t stride = static_cast<int64_t>(blockDim.x) * gridDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const double v = x[i];
    acc += kSquare ? v * v : v;
  }
  shared[threadIdx.x] = acc;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) partial[blockIdx.x] = shared[0];
}

template <bool kSqrt>
__global__ void reduce_final_kernel(const double* __restrict__ partial, int count, float* __restrict__ y) {
  __shared__ double shared[kReduceBlocks];
  shared[threadIdx.x] = static_cast<int>(threadIdx.x) < count ? partial[threadIdx.x] : 0.0;
  __syncthreads();
  for (unsigned s = blockDim.x / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) shared[threadIdx.x] += shared[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) *y = static_cast<float>(kSqrt ? sqrt(shared[0]) : shared[0]);
}

// --- enumeration helpers -----------------------------------------------------------------------------------

// 13000 -> "13.0", 12080 -> "12.8"
std::string cuda_version_string(int v) {
  if (v <= 0) return "";
  return std::to_string(v / 1000) + "." + std::to_string((v % 1000) / 10);
}

std::string cublas_version_string() {
  int major = 0, minor = 0, patch = 0;
  if (cublasGetProperty(MAJOR_VERSION, &major) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(MINOR_VERSION, &minor) != CUBLAS_STATUS_SUCCESS ||
      cublasGetProperty(PATCH_LEVEL, &patch) != CUBLAS_STATUS_SUCCESS)
    return "";
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

// cuDNN 9 encodes major*10000 + minor*100 + patch.
std::string cudnn_version_string() {
  const size_t v = cudnnGetVersion();
  if (v == 0) return "";
  return std::to_string(v / 10000) + "." + std::to_string((v % 10000) / 100) + "." + std::to_string(v % 100);
}

// FP32 lanes per SM by architecture: GA100 (8.0), Volta/Turing (7.x) and GP100 (6.0) have 64; GA10x (8.6),
// Ada (8.9), Hopper (9.0) and Blackwell have 128.
int fp32_lanes_per_sm(int major, int minor) {
  if (major == 7 || (major == 8 && minor == 0) || (major == 6 && minor == 0)) return 64;
  return 128;
}

// Fills what the device reports. Throws BackendError when the device cannot be used at all.
void describe_device(int index, DeviceInfo& info) {
  DeviceGuard guard(index);
  cudaDeviceProp prop{};
  GN_CUDA_CHECK(cudaGetDeviceProperties(&prop, index));
  info.name = prop.name;
  info.compute_capability = std::to_string(prop.major) + "." + std::to_string(prop.minor);
  info.sm_count = prop.multiProcessorCount;
  // cudaMemGetInfo needs the device's context: this is also where an unusable device shows.
  size_t free = 0, total = 0;
  GN_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  info.free_memory = static_cast<int64_t>(free);
  info.total_memory = static_cast<int64_t>(total);
  // CUDA 13 dropped cudaDeviceProp::clockRate; the attribute remains (kHz).
  int clock_khz = 0;
  GN_CUDA_CHECK(cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, index));
  const int lanes = fp32_lanes_per_sm(prop.major, prop.minor);
  info.peak_gflops = static_cast<double>(info.sm_count) * clock_khz * lanes * 2.0 / 1e6;
  std::ostringstream src;
  src << info.sm_count << " SMs x " << clock_khz / 1000 << " MHz boost clock (cudaDevAttrClockRate) x "
      << lanes << " fp32 lanes/SM (cc " << info.compute_capability
      << ") x 2 (FMA); fp32 without tensor cores";
  info.peak_source = src.str();
}

// --- the backend -------------------------------------------------------------------------------------------

// A captured step: an executable CUDA graph, and the private memory pool its kernels use.
class CudaGraphWork final : public CapturedWork {
 public:
  CudaGraphWork(cudaGraph_t graph, cudaGraphExec_t exec, CudaCachingAllocator& allocator, int pool)
      : graph_(graph), exec_(exec), allocator_(allocator), pool_(pool) {}
  ~CudaGraphWork() override {
    // Never throws: it may run as the process exits.
    (void)cudaGraphExecDestroy(exec_);
    (void)cudaGraphDestroy(graph_);
    (void)cudaGetLastError();
    allocator_.release_pool(pool_);
  }
  void replay(OpContext& ctx) override {
    GN_CUDA_CHECK(cudaGraphLaunch(exec_, static_cast<cudaStream_t>(ctx.native_stream)));
  }
  std::string describe() const override {
    size_t nodes = 0;
    if (cudaGraphGetNodes(graph_, nullptr, &nodes) != cudaSuccess) (void)cudaGetLastError();
    return "a CUDA graph of " + std::to_string(nodes) + " nodes";
  }

 private:
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  CudaCachingAllocator& allocator_;
  int pool_;
};

// Ends a capture that failed and says why; the stream leaves capture mode, nothing of it ran.
[[noreturn]] void abandon_capture(cudaStream_t stream, CudaCachingAllocator& allocator, int pool,
                                  const std::string& why) {
  cudaGraph_t partial = nullptr;
  (void)cudaStreamEndCapture(stream, &partial);
  if (partial) (void)cudaGraphDestroy(partial);
  (void)cudaGetLastError();
  allocator.release_pool(pool);
  throw CaptureError("the step could not be captured as a CUDA graph: " + why);
}

class CudaBackend final : public Backend {
 public:
  DeviceKind kind() const override { return DeviceKind::Cuda; }

  std::vector<DeviceInfo> enumerate() override {
    std::vector<DeviceInfo> out;
    int count = 0;
    // No driver, no device, a driver older than the runtime: all mean "no GPU here", never an error.
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
      (void)cudaGetLastError();
      return out;
    }
    int driver = 0, runtime = 0;
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0;
    if (cudaRuntimeGetVersion(&runtime) != cudaSuccess) runtime = 0;
    const std::string cublas = cublas_version_string(), cudnn = cudnn_version_string();
    for (int i = 0; i < count; ++i) {
      DeviceInfo info;
      info.device = Device::cuda(i);
      info.driver_version = cuda_version_string(driver);
      info.runtime_version = cuda_version_string(runtime);
      info.cublas_version = cublas;
      info.cudnn_version = cudnn;
      try {
        describe_device(i, info);
      } catch (const std::exception&) {
        // cuda:i must stay CUDA ordinal i, so a device that cannot be used ends the list: work on the
        // devices before it still runs, and try_gpu falls back for the rest.
        (void)cudaGetLastError();
        break;
      }
      out.push_back(std::move(info));
    }
    (void)cudaGetLastError();
    return out;
  }

  std::unique_ptr<Allocator> make_allocator(Device device, Profiler* profiler) override {
    return std::make_unique<CudaCachingAllocator>(device, profiler);
  }

  // Relaxed capture mode: the step's own code may still allocate (cudaMalloc into the graph's pool) while
  // the stream captures. Every stream-ordered call of the step lands in the graph; a call that cannot be
  // captured (a synchronisation, a cuDNN algorithm search) fails the capture with its message.
  std::unique_ptr<CapturedWork> capture(const std::function<void()>& step, OpContext& ctx,
                                        Allocator& allocator) override {
    auto* cache = dynamic_cast<CudaCachingAllocator*>(&allocator);
    if (!cache || !ctx.device.is_cuda() || !ctx.native_stream)
      throw CaptureError("a CUDA graph is captured on a CUDA device's compute stream, inside its op");
    auto stream = static_cast<cudaStream_t>(ctx.native_stream);
    const int pool = cache->open_pool();
    {
      CudaCachingAllocator::PoolScope scope(*cache, pool);
      if (cudaError_t err = cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed); err != cudaSuccess) {
        (void)cudaGetLastError();
        cache->release_pool(pool);
        throw CaptureError(std::string("cudaStreamBeginCapture failed: ") + cudaGetErrorString(err));
      }
      try {
        InlineOps ops(ctx);
        step();
      } catch (const CancelledError&) {
        cudaGraph_t partial = nullptr;
        (void)cudaStreamEndCapture(stream, &partial);
        if (partial) (void)cudaGraphDestroy(partial);
        (void)cudaGetLastError();
        cache->release_pool(pool);
        throw;
      } catch (const std::exception& e) {
        abandon_capture(stream, *cache, pool, e.what());
      }
    }
    cudaGraph_t graph = nullptr;
    if (cudaError_t err = cudaStreamEndCapture(stream, &graph); err != cudaSuccess || !graph)
      abandon_capture(stream, *cache, pool, std::string("cudaStreamEndCapture: ") + cudaGetErrorString(err));
    cudaGraphExec_t exec = nullptr;
    if (cudaError_t err = cudaGraphInstantiate(&exec, graph, 0); err != cudaSuccess) {
      (void)cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      cache->release_pool(pool);
      throw CaptureError(std::string("cudaGraphInstantiate failed: ") + cudaGetErrorString(err));
    }
    auto work = std::make_unique<CudaGraphWork>(graph, exec, *cache, pool);
    work->replay(ctx);  // the captured step itself: capturing ran none of it
    return work;
  }

  std::unique_ptr<StreamWorker> make_worker(Device device, StreamKind stream) override {
    return std::make_unique<CudaStreamWorker>(device, stream);
  }

  void fill(float* y, int64_t n, float value, OpContext& ctx) override {
    OpStream s(ctx, ctx.device.index);
    launch_map(y, n, FillFn{value}, s.get());
    s.finish();
  }

  void random(float* y, int64_t n, RandomKind kind, uint64_t seed, float a, float b,
              OpContext& ctx) override {
    OpStream s(ctx, ctx.device.index);
    if (kind == RandomKind::Uniform)
      launch_map(y, n, UniformFn{seed, a, b}, s.get());
    else
      launch_map(y, n, NormalFn{seed, a, b}, s.get());
    s.finish();
  }

  void arange(float* y, int64_t n, float start, float step, OpContext& ctx) override {
    OpStream s(ctx, ctx.device.index);
    launch_map(y, n, ArangeFn{start, step}, s.get());
    s.finish();
  }

  void binary(BinaryOp op, const float* a, const float* b, float* y, int64_t n, OpContext& ctx) override {
    OpStream s(ctx, ctx.device.index);
    launch_map(y, n, BinaryFn{op, a, b}, s.get());
    s.finish();
  }

  void unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha, float beta,
             OpContext& ctx) override {
    OpStream s(ctx, ctx.device.index);
    launch_map(y, n, UnaryFn{op, x, alpha, beta}, s.get());
    s.finish();
  }

  void reduce(ReduceOp op, const float* x, int64_t n, float* y, OpContext& ctx) override {
    OpStream s(ctx, ctx.device.index);
    PerDeviceResources& r = thread_resources().device(ctx.device.index);
    const int blocks = static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kReduceBlocks));
    // The scratch buffer belongs to this thread and is used in stream order, so reuse across ops is safe.
    if (op == ReduceOp::Sum) {
      reduce_partial_kernel<false><<<blocks, kThreads, 0, s.get()>>>(x, std::max<int64_t>(n, 0), r.scratch);
      GN_CUDA_CHECK_LAUNCH();
      reduce_final_kernel<false><<<1, kReduceBlocks, 0, s.get()>>>(r.scratch, blocks, y);
    } else {
      reduce_partial_kernel<true><<<blocks, kThreads, 0, s.get()>>>(x, std::max<int64_t>(n, 0), r.scratch);
      GN_CUDA_CHECK_LAUNCH();
      reduce_final_kernel<true><<<1, kReduceBlocks, 0, s.get()>>>(r.scratch, blocks, y);
    }
    GN_CUDA_CHECK_LAUNCH();
    s.finish();
  }

  void gemm(const GemmArgs& g, OpContext& ctx) override {
    if (g.m <= 0 || g.n <= 0) return;
    OpStream s(ctx, ctx.device.index);
    if (g.k <= 0) {  // an empty sum: C = 0 (cuBLAS would reject lda = 0)
      launch_map(g.c, g.m * g.n, FillFn{0.0f}, s.get());
      s.finish();
      return;
    }
    if (g.m > INT_MAX || g.n > INT_MAX || g.k > INT_MAX)
      throw ShapeError("matmul: dimensions exceed 2^31-1, which cuBLAS takes");
    PerDeviceResources& r = thread_resources().device(ctx.device.index);
    GN_CUBLAS_CHECK(cublasSetStream(r.cublas, s.get()));

    // cuBLAS is column-major, and a row-major matrix read column-major is its transpose. So the row-major
    // C = op(A) op(B) is computed as the column-major C^T = op(B)^T op(A)^T: swap the operands, keep the ops.
    const int n = static_cast<int>(g.n), k = static_cast<int>(g.k);
    const int lda = static_cast<int>(g.trans_a ? g.m : g.k);
    const int ldb = static_cast<int>(g.trans_b ? g.k : g.n);
    const cublasOperation_t op_a = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_b = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;

    const double row_flops = 2.0 * static_cast<double>(g.n) * static_cast<double>(g.k);
    int64_t chunk = g.m;
    if (row_flops * static_cast<double>(g.m) > 1.5 * kGemmChunkFlops)
      chunk = std::max<int64_t>(128, static_cast<int64_t>(kGemmChunkFlops / row_flops) / 128 * 128);
    // Not while the stream is captured (a CUDA graph): cudaEventSynchronize on an event recorded in the
    // capture is refused even in relaxed mode (cudaErrorCapturedEvent), and capturing runs nothing to cancel.
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    GN_CUDA_CHECK(cudaStreamIsCapturing(s.get(), &capture));
    const bool chunked = chunk < g.m && capture == cudaStreamCaptureStatusNone;
    if (!chunked) chunk = g.m;

    int64_t i = 0;
    for (int64_t r0 = 0; r0 < g.m; r0 += chunk, ++i) {
      const int rows = static_cast<int>(std::min(chunk, g.m - r0));
      // Rows r0.. of op(A): row r0 of A, or column r0 of A when it is transposed.
      const float* a = g.trans_a ? g.a + r0 : g.a + r0 * lda;
      float* c = g.c + r0 * g.n;
      gemm_f32(r.cublas, op_b, op_a, n, rows, k, 1.0f, g.b, ldb, a, lda, 0.0f, c, n, g.precision);
      if (chunked) {
        // Keep two chunks in flight: wait for the previous one, then look at the cancel flag.
        GN_CUDA_CHECK(cudaEventRecord(r.done[i & 1], s.get()));
        if (i > 0) GN_CUDA_CHECK(cudaEventSynchronize(r.done[(i - 1) & 1]));
        ctx.check_cancelled();
      }
    }
    s.finish();
  }

  void copy(CopyEnd dst, CopyEnd src, int64_t bytes, bool pinned_staging, OpContext& ctx) override {
    if (bytes <= 0) return;
    if (dst.device.is_cpu() && src.device.is_cpu()) {  // any CPU device's memory is plain host memory
      std::memcpy(dst.ptr, src.ptr, static_cast<size_t>(bytes));
      return;
    }
    const int device = ctx.device.is_cuda()   ? ctx.device.index
                       : src.device.is_cuda() ? src.device.index
                                              : dst.device.index;
    OpStream s(ctx, device);
    const size_t n = static_cast<size_t>(bytes);
    if (dst.device.is_cuda() && src.device.is_cuda()) {
      if (dst.device.index == src.device.index) {
        GN_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, n, cudaMemcpyDeviceToDevice, s.get()));
      } else {
        // Direct over NVLink/PCIe when the pair allows it; cudaMemcpyPeerAsync stages through the host
        // otherwise.
        enable_peer_access(src.device.index, dst.device.index);
        enable_peer_access(dst.device.index, src.device.index);
        GN_CUDA_CHECK(cudaMemcpyPeerAsync(dst.ptr, dst.device.index, src.ptr, src.device.index, n, s.get()));
      }
    } else if (dst.device.is_cuda()) {
      if (pinned_staging)
        staged_to_device(static_cast<char*>(dst.ptr), static_cast<const char*>(src.ptr), n, s.get(), ctx);
      else  // from pageable memory the driver stages itself, and the call returns once the source was read
        GN_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, n, cudaMemcpyHostToDevice, s.get()));
    } else {
      if (pinned_staging)
        staged_to_host(static_cast<char*>(dst.ptr), static_cast<const char*>(src.ptr), n, s.get(), ctx);
      else  // into pageable memory the call returns when the data is there
        GN_CUDA_CHECK(cudaMemcpyAsync(dst.ptr, src.ptr, n, cudaMemcpyDeviceToHost, s.get()));
    }
    s.finish();
  }

 private:
  // Host -> device through two page-locked chunks: while the GPU reads one, the host fills the other. The
  // DMA engines then run asynchronously to every other stream, which is what lets copies overlap compute.
  void staged_to_device(char* dst, const char* src, size_t bytes, cudaStream_t stream, OpContext& ctx) {
    int device = 0;
    GN_CUDA_CHECK(cudaGetDevice(&device));
    PerDeviceResources& r = thread_resources().device(device);
    auto [b0, b1] = thread_resources().staging(std::min(bytes, kStageChunk));
    char* buf[2] = {static_cast<char*>(b0), static_cast<char*>(b1)};
    bool in_flight[2] = {false, false};
    for (size_t off = 0, i = 0; off < bytes; ++i) {
      const size_t len = std::min(kStageChunk, bytes - off);
      const int h = static_cast<int>(i & 1);
      if (in_flight[h]) GN_CUDA_CHECK(cudaEventSynchronize(r.done[h]));  // the GPU has read this half
      ctx.check_cancelled();
      std::memcpy(buf[h], src + off, len);
      GN_CUDA_CHECK(cudaMemcpyAsync(dst + off, buf[h], len, cudaMemcpyHostToDevice, stream));
      GN_CUDA_CHECK(cudaEventRecord(r.done[h], stream));
      in_flight[h] = true;
      off += len;
    }
    // The last chunks may still be in flight: the worker waits for the stream before the next op.
  }

  // Device -> host through two page-locked chunks: the host drains one while the GPU fills the other.
  void staged_to_host(char* dst, const char* src, size_t bytes, cudaStream_t stream, OpContext& ctx) {
    int device = 0;
    GN_CUDA_CHECK(cudaGetDevice(&device));
    PerDeviceResources& r = thread_resources().device(device);
    auto [b0, b1] = thread_resources().staging(std::min(bytes, kStageChunk));
    char* buf[2] = {static_cast<char*>(b0), static_cast<char*>(b1)};
    size_t prev_off = 0, prev_len = 0;
    int prev_h = -1;
    auto drain = [&] {
      GN_CUDA_CHECK(cudaEventSynchronize(r.done[prev_h]));
      std::memcpy(dst + prev_off, buf[prev_h], prev_len);
    };
    for (size_t off = 0, i = 0; off < bytes; ++i) {
      const size_t len = std::min(kStageChunk, bytes - off);
      const int h = static_cast<int>(i & 1);
      // buf[h] was drained in the previous round (it held chunk i-2).
      GN_CUDA_CHECK(cudaMemcpyAsync(buf[h], src + off, len, cudaMemcpyDeviceToHost, stream));
      GN_CUDA_CHECK(cudaEventRecord(r.done[h], stream));
      if (prev_h >= 0) drain();
      ctx.check_cancelled();
      prev_off = off, prev_len = len, prev_h = h;
      off += len;
    }
    if (prev_h >= 0) drain();
  }

  // Lets `device` read and write `peer`'s memory directly, once per ordered pair. Best effort: without it
  // cudaMemcpyPeerAsync still copies (through the host), so a refusal is not an error. "Already enabled"
  // means another part of the process did it first.
  void enable_peer_access(int device, int peer) {
    std::lock_guard lock(peer_mutex_);
    if (!peer_done_.insert({device, peer}).second) return;
    int can = 0;
    if (cudaDeviceCanAccessPeer(&can, device, peer) == cudaSuccess && can) {
      DeviceGuard guard(device);
      (void)cudaDeviceEnablePeerAccess(peer, 0);  // success, already enabled, or refused: all fine here
    }
    (void)cudaGetLastError();  // leave no error behind for the next launch check
  }

  std::mutex peer_mutex_;
  std::set<std::pair<int, int>> peer_done_;
};

}  // namespace
}  // namespace cuda

std::unique_ptr<Backend> make_cuda_backend() {
  return std::make_unique<cuda::CudaBackend>();
}

}  // namespace gn
