// The CPU backend: oneDNN's sgemm for the matmul op (OpenBLAS's, on one thread, for small products;
// oneDNN's bf16 matmul under Precision::Bf16), OpenMP loops for the rest. Each CPU device's workers run with
// that device's share of the cores, so N devices busy at once do not oversubscribe the machine.
#include <cblas.h>
#include <omp.h>

#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "gpunodes/backend.h"
#include "gpunodes/dist/world.h"
#include "gpunodes/errors.h"
#include "gpunodes/profiler.h"
#include "gpunodes/random.h"
#include "cpu_bf16_gemm.h"

namespace gn {
namespace {

// Elementwise loops go parallel only when the work pays for waking the team.
constexpr int64_t kParallelThreshold = 1 << 15;

// body(i) for every i in [0, n): an OpenMP loop past kParallelThreshold, a plain one on this thread below
// it. Not `#pragma omp parallel for if (...)`: a region whose if is false still enters libgomp, which
// allocated and freed a team of one each time, about a quarter of a tiny op's 2.3 us here.
template <class F>
void for_each_index(int64_t n, F&& body) {
  if (n <= kParallelThreshold) {
    for (int64_t i = 0; i < n; ++i) body(i);
    return;
  }
#pragma omp parallel for
  for (int64_t i = 0; i < n; ++i) body(i);
}

// The sum of term(i) over [0, n) in double, split as for_each_index.
template <class F>
double sum_over(int64_t n, F&& term) {
  double acc = 0;
  if (n <= kParallelThreshold) {
    for (int64_t i = 0; i < n; ++i) acc += term(i);
    return acc;
  }
#pragma omp parallel for reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += term(i);
  return acc;
}

struct HostFacts {
  std::string model = "CPU";
  double mhz = 0;
  int fp32_flops_per_cycle = 16;  // SSE-only baseline: 2 x 4-wide FMA-less units
  std::string simd = "SSE";
  int64_t mem_total = 0, mem_available = 0;
};

HostFacts read_host_facts() {
  HostFacts f;
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  while (std::getline(cpuinfo, line)) {
    auto value = [&] { return line.substr(line.find(':') + 2); };
    if (line.rfind("model name", 0) == 0 && f.model == "CPU") f.model = value();
    if (line.rfind("cpu MHz", 0) == 0 && f.mhz == 0) f.mhz = std::stod(value());
    if (line.rfind("flags", 0) == 0) {
      std::string flags = " " + value() + " ";
      if (flags.find(" avx512f ") != std::string::npos) {
        f.fp32_flops_per_cycle = 64, f.simd = "AVX-512 FMA";
      } else if (flags.find(" avx2 ") != std::string::npos && flags.find(" fma ") != std::string::npos) {
        f.fp32_flops_per_cycle = 32, f.simd = "AVX2 FMA";
      }
    }
  }
  std::ifstream meminfo("/proc/meminfo");
  while (std::getline(meminfo, line)) {
    std::istringstream in(line);
    std::string key;
    int64_t kb = 0;
    in >> key >> kb;
    if (key == "MemTotal:") f.mem_total = kb * 1024;
    if (key == "MemAvailable:") f.mem_available = kb * 1024;
  }
  return f;
}

// The cores the CPU devices share: the machine's, or fewer when OMP_NUM_THREADS asks for fewer, as it would
// of any OpenMP program (the per-thread omp_set_num_threads below would otherwise override it). The
// ThreadSanitizer suites set it to 1: libgomp is not instrumented, so TSan cannot see its barriers.
//
// Under mpirun the ranks on one machine share it: each takes its share of the cores, so that N ranks do not
// run N times the machine's threads (mpirun's --bind-to none leaves them all visible to every rank).
int machine_cores() {
  int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (const dist::LaunchInfo l = dist::launch_info(); l.under_mpirun)
    cores = std::max(1, cores / l.local_size);
  if (const char* env = std::getenv("OMP_NUM_THREADS")) {
    const int asked = std::atoi(env);
    if (asked > 0) cores = std::min(cores, asked);
  }
  return cores;
}

// Cores for one of `n` CPU devices: an even share, at least one.
int core_share(int n) {
  return std::max(1, machine_cores() / std::max(1, n));
}

// Products below this many floating-point operations (2 * 128^3) run on one thread (gemm below).
constexpr double kSmallProductFlops = 2.0 * 128 * 128 * 128;

// Sets the calling thread's OpenMP thread count (which OpenBLAS's OpenMP build follows) to 1 while it lives.
class SmallProductThreads {
 public:
  SmallProductThreads() : saved_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~SmallProductThreads() { omp_set_num_threads(saved_); }
  SmallProductThreads(const SmallProductThreads&) = delete;
  SmallProductThreads& operator=(const SmallProductThreads&) = delete;

 private:
  int saved_;
};

class CpuStreamWorker final : public StreamWorker {
 public:
  CpuStreamWorker(Device d, StreamKind s, int threads) : StreamWorker(d, s), threads_(threads) {}

 protected:
  // OpenMP's thread count is per calling thread, and OpenBLAS's OpenMP build follows it.
  void on_thread_start() override { omp_set_num_threads(threads_); }

 private:
  int threads_;
};

// A step's op bodies, kept after they ran once, with the tensors they hold: a replay runs them again in
// order, with no engine bookkeeping between them.
class RecordedOps final : public CapturedWork {
 public:
  void replay(OpContext& ctx) override {
    for (OpFn& op : ops_) {
      ctx.check_cancelled();
      op(ctx);
    }
  }
  std::string describe() const override { return std::to_string(ops_.size()) + " recorded ops"; }
  void add(OpFn op) { ops_.push_back(std::move(op)); }

 private:
  std::vector<OpFn> ops_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int devices) : devices_(std::max(1, devices)) {}

  DeviceKind kind() const override { return DeviceKind::Cpu; }

  std::vector<DeviceInfo> enumerate() override {
    HostFacts f = read_host_facts();
    std::vector<DeviceInfo> out;
    for (int i = 0; i < devices_; ++i) {
      DeviceInfo info;
      info.device = Device::cpu(i);
      info.name = f.model;
      info.cores = core_share(devices_);
      info.total_memory = f.mem_total;  // host memory is shared by all CPU devices
      info.free_memory = f.mem_available;
      info.peak_gflops = info.cores * f.mhz * 1e-3 * f.fp32_flops_per_cycle;
      std::ostringstream src;
      src << info.cores << " cores x " << f.mhz << " MHz (/proc/cpuinfo) x " << f.fp32_flops_per_cycle
          << " fp32 FLOP/cycle (" << f.simd << ")";
      info.peak_source = src.str();
      out.push_back(info);
    }
    return out;
  }

  std::unique_ptr<Allocator> make_allocator(Device d, Profiler* profiler) override {
    return std::make_unique<CpuAllocator>(d, profiler);
  }

  std::unique_ptr<StreamWorker> make_worker(Device d, StreamKind s) override {
    // The copy and collective streams are memcpy and MPI threads; they get one core's worth of threads.
    return std::make_unique<CpuStreamWorker>(d, s, s == StreamKind::Compute ? core_share(devices_) : 1);
  }

  void fill(float* y, int64_t n, float value, OpContext&) override {
    for_each_index(n, [&](int64_t i) { y[i] = value; });
  }

  // A Philox block per four uniform elements (its four lanes) or per normal pair (one Box-Muller draw gives
  // both the cos and the sin element), not one block per element: the values of uniform_at and normal_at,
  // which the CUDA kernels compute per element, at a quarter (half) of the work. The whole blocks run as one
  // SIMD loop over counters; the last partial block takes the per-element path.
  void random(float* y, int64_t n, RandomKind kind, uint64_t seed, float a, float b, OpContext&) override {
    const bool parallel = n > kParallelThreshold / 16;
    if (kind == RandomKind::Uniform) {
      const int64_t blocks = n / 4;
      const float range = b - a;
#pragma omp parallel for simd if (parallel)
      for (int64_t c = 0; c < blocks; ++c) {
        const philox::U32x4 r = philox::philox4x32_10(static_cast<uint64_t>(c), seed);
        for (int k = 0; k < 4; ++k) y[4 * c + k] = fmaf(range, philox::to_unit_float(r.v[k]), a);
      }
      for (int64_t i = 4 * blocks; i < n; ++i)
        y[i] = philox::uniform_at(seed, static_cast<uint64_t>(i), a, b);
    } else {
      const int64_t pairs = n / 2;
#pragma omp parallel for if (parallel)
      for (int64_t p = 0; p < pairs; ++p) {
        const philox::NormalPair z = philox::normal_pair(seed, static_cast<uint64_t>(p), a, b);
        y[2 * p] = z.even;
        y[2 * p + 1] = z.odd;
      }
      if (n % 2) y[n - 1] = philox::normal_at(seed, static_cast<uint64_t>(n - 1), a, b);
    }
  }

  void arange(float* y, int64_t n, float start, float step, OpContext&) override {
    for_each_index(n, [&](int64_t i) { y[i] = start + step * static_cast<float>(i); });
  }

  void gemm(const GemmArgs& g, OpContext& ctx) override {
    // bf16 (only where check_precision let it through: oneDNN's ISA has bf16) in one call: a bf16 product
    // of the seed's 4000^2 takes well under a second, so cancel is still seen soon.
    if (g.precision == Precision::Bf16) {
      ctx.check_cancelled();
      cpu::bf16_gemm(g.trans_a, g.trans_b, g.m, g.n, g.k, g.a, g.b, nullptr, g.c);
      return;
    }
    if (g.m == 0 || g.n == 0) return;
    if (g.k == 0) {  // an empty sum; oneDNN refuses a leading dimension of 0
      fill(g.c, g.m * g.n, 0.0f, ctx);
      return;
    }
    const double flops = 2.0 * static_cast<double>(g.m) * static_cast<double>(g.n) * static_cast<double>(g.k);
    const int lda = static_cast<int>(g.trans_a ? g.m : g.k);
    const int ldb = static_cast<int>(g.trans_b ? g.k : g.n);
    if (flops < kSmallProductFlops) {
      // A small product: OpenBLAS's small-matrix kernels on this worker's thread alone. The host thread
      // that pushes the ops (or waits for this one) needs a core too, so a second OpenMP thread would share
      // one with it: at n = 100 on 2 cores oneDNN's sgemm on 2 threads took 23-27 us when the host waited
      // for each product, on one thread 16 us, OpenBLAS on one 15 us (runtime_bench: 0.49 of a direct
      // cblas_sgemm before, 0.82 after; what remains is the engine's round trip of about 2 us).
      SmallProductThreads one_thread;
      cblas_sgemm(CblasRowMajor, g.trans_a ? CblasTrans : CblasNoTrans, g.trans_b ? CblasTrans : CblasNoTrans,
                  static_cast<int>(g.m), static_cast<int>(g.n), static_cast<int>(g.k), 1.0f, g.a, lda, g.b, ldb,
                  0.0f, g.c, static_cast<int>(g.n));
      return;
    }
    // Rows of C in even chunks of at most ~16 GFLOP, so that cancel is seen within a fraction of a second
    // even for the seed's 4000x4000 products, while each chunk stays large enough for BLAS to run at speed.
    const int64_t chunks = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(flops / 16e9)));
    const int64_t chunk = (g.m + chunks - 1) / chunks;
    for (int64_t r0 = 0; r0 < g.m; r0 += chunk) {
      ctx.check_cancelled();
      const int64_t rows = std::min(chunk, g.m - r0);
      // Row r of op(A) starts at a + r*lda (no transpose) or at column r (transpose).
      const float* a = g.trans_a ? g.a + r0 : g.a + r0 * lda;
      // oneDNN's sgemm (row-major, as CBLAS): at n = 512-2048 as fast as OpenBLAS's or faster
      // (runtime_bench's matmul rows compare with cblas_sgemm in the same run).
      const dnnl_status_t st =
          dnnl_sgemm(g.trans_a ? 'T' : 'N', g.trans_b ? 'T' : 'N', rows, g.n, g.k, 1.0f, a, lda, g.b, ldb, 0.0f,
                     g.c + r0 * g.n, g.n);
      if (st != dnnl_success)
        throw BackendError("oneDNN sgemm failed (status " + std::to_string(static_cast<int>(st)) + ") for " +
                           std::to_string(rows) + "x" + std::to_string(g.n) + "x" + std::to_string(g.k));
    }
  }

  void binary(BinaryOp op, const float* a, const float* b, float* y, int64_t n, OpContext&) override {
    switch (op) {
      case BinaryOp::Add:
        for_each_index(n, [&](int64_t i) { y[i] = a[i] + b[i]; });
        break;
      case BinaryOp::Sub:
        for_each_index(n, [&](int64_t i) { y[i] = a[i] - b[i]; });
        break;
      case BinaryOp::Mul:
        for_each_index(n, [&](int64_t i) { y[i] = a[i] * b[i]; });
        break;
      case BinaryOp::Div:
        for_each_index(n, [&](int64_t i) { y[i] = a[i] / b[i]; });
        break;
    }
  }

  void unary(UnaryOp op, const float* x, float* y, int64_t n, float alpha, float beta, OpContext&) override {
    switch (op) {
      case UnaryOp::Exp:
        for_each_index(n, [&](int64_t i) { y[i] = std::exp(x[i]); });
        break;
      case UnaryOp::Relu:
        for_each_index(n, [&](int64_t i) { y[i] = x[i] > 0 ? x[i] : 0.0f; });
        break;
      case UnaryOp::ScaleShift:
        for_each_index(n, [&](int64_t i) { y[i] = alpha * x[i] + beta; });
        break;
    }
  }

  void reduce(ReduceOp op, const float* x, int64_t n, float* y, OpContext&) override {
    // Accumulate in double: sums of millions of floats otherwise lose digits.
    if (op == ReduceOp::Sum) {
      *y = static_cast<float>(sum_over(n, [&](int64_t i) { return static_cast<double>(x[i]); }));
    } else {
      const double squares = sum_over(n, [&](int64_t i) { return static_cast<double>(x[i]) * x[i]; });
      *y = static_cast<float>(std::sqrt(squares));
    }
  }

  std::unique_ptr<CapturedWork> capture(const std::function<void()>& step, OpContext& ctx, Allocator&) override {
    auto recorded = std::make_unique<RecordedOps>();
    InlineOps ops(ctx, [&](OpFn op) { recorded->add(std::move(op)); });
    step();
    return recorded;
  }

  void copy(CopyEnd dst, CopyEnd src, int64_t bytes, bool, OpContext& ctx) override {
    if (!dst.device.is_cpu() || !src.device.is_cpu())
      throw Error("CPU backend asked to copy " + src.device.str() + " -> " + dst.device.str());
    // Large copies in slices so cancel is honoured promptly.
    constexpr int64_t slice = 64 << 20;
    auto* d = static_cast<char*>(dst.ptr);
    auto* s = static_cast<const char*>(src.ptr);
    for (int64_t off = 0; off < bytes; off += slice) {
      ctx.check_cancelled();
      std::memcpy(d + off, s + off, static_cast<size_t>(std::min(slice, bytes - off)));
    }
  }

 private:
  int devices_;
};

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int cpu_devices) {
  return std::make_unique<CpuBackend>(cpu_devices);
}

}  // namespace gn
