// Qt-free CUDA benchmark. Every number is printed next to a peer measured in the same run:
//   1. matmul GFLOP/s through the runtime vs raw cublasSgemm / cublasGemmEx(TF32) on the same operands,
//   2. host<->device copy bandwidth: raw pageable vs raw pinned, and the runtime's blocking (pageable) vs
//      non-blocking (pinned staging) copies,
//   3. the seed's copy/compute overlap (d2l "automatic parallelism"): 10 matmuls of 4000x4000, then copy the
//      results to the host, blocking vs non-blocking.
// Exit 77 when there is no GPU.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gpunodes/errors.h"
#include "gpunodes/ops.h"

using namespace gn;

namespace {

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string(what) + ": " + cudaGetErrorString(e));
}
void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) throw Error(std::string(what) + ": " + cublasGetStatusString(s));
}
#define CK(call) check_cuda((call), #call)
#define CB(call) check_cublas((call), #call)

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best of `reps` timings: the least disturbed run.
template <class F>
double best_seconds(int reps, F&& f) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    const double t0 = now_s();
    f();
    best = std::min(best, now_s() - t0);
  }
  return best;
}

struct MatmulRow {
  const char* precision;
  int n, reps;
  double runtime_gflops, cublas_gflops;
};

MatmulRow bench_matmul(Runtime& rt, int n, int reps, Precision precision) {
  const Device g = Device::cuda(0);
  Tensor a = uniform(rt, {n, n}, g, 1, -1, 1), b = uniform(rt, {n, n}, g, 2, -1, 1);
  const MatMulOptions opts{false, false, precision};
  const double flops = 2.0 * n * double(n) * n * reps;

  // Runtime: the first pass fills the allocator's cache, the second is measured.
  double runtime_s = 1e30;
  for (int pass = 0; pass < 2; ++pass) {
    const double t0 = now_s();
    auto outs = matmul_repeat(a, b, reps, opts);
    rt.engine().wait_all();
    runtime_s = now_s() - t0;
  }

  // Raw cuBLAS on the same operands, on its own stream, same count.
  rt.engine().wait_all();
  float* c = nullptr;
  CK(cudaSetDevice(0));
  CK(cudaMalloc(&c, size_t(n) * n * sizeof(float)));
  cublasHandle_t h;
  CB(cublasCreate(&h));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CB(cublasSetStream(h, s));
  const float one = 1, zero = 0;
  auto gemm = [&] {
    if (precision == Precision::Tf32)
      CB(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b.data(), CUDA_R_32F, n, a.data(),
                      CUDA_R_32F, n, &zero, c, CUDA_R_32F, n, CUBLAS_COMPUTE_32F_FAST_TF32,
                      CUBLAS_GEMM_DEFAULT));
    else
      CB(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &one, b.data(), n, a.data(), n, &zero, c, n));
  };
  for (int i = 0; i < 3; ++i) gemm();
  CK(cudaStreamSynchronize(s));
  const double t0 = now_s();
  for (int i = 0; i < reps; ++i) gemm();
  CK(cudaStreamSynchronize(s));
  const double cublas_s = now_s() - t0;
  CB(cublasDestroy(h));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(c));
  return {precision == Precision::Tf32 ? "tf32" : "fp32", n, reps, flops / runtime_s / 1e9,
          flops / cublas_s / 1e9};
}

struct CopyRow {
  const char* direction;
  double raw_pageable, raw_pinned, rt_blocking, rt_non_blocking;  // GB/s
};

std::vector<CopyRow> bench_copies(Runtime& rt, size_t bytes) {
  const Device g = Device::cuda(0);
  const int reps = 5;
  const double gb = double(bytes) / 1e9;
  CK(cudaSetDevice(0));
  void* dev = nullptr;
  void* pinned = nullptr;
  CK(cudaMalloc(&dev, bytes));
  CK(cudaHostAlloc(&pinned, bytes, cudaHostAllocDefault));
  std::vector<char> pageable(bytes, 1);  // touched, so page faults are not measured
  std::memset(pinned, 1, bytes);

  auto raw = [&](void* dst, const void* src, cudaMemcpyKind kind) {
    return gb / best_seconds(reps, [&] { CK(cudaMemcpy(dst, src, bytes, kind)); });
  };
  CopyRow h2d{"host -> cuda:0", raw(dev, pageable.data(), cudaMemcpyHostToDevice),
              raw(dev, pinned, cudaMemcpyHostToDevice), 0, 0};
  CopyRow d2h{"cuda:0 -> host", raw(pageable.data(), dev, cudaMemcpyDeviceToHost),
              raw(pinned, dev, cudaMemcpyDeviceToHost), 0, 0};
  CK(cudaFree(dev));
  CK(cudaFreeHost(pinned));

  // Through the runtime: a CPU tensor (pageable host memory, as every CPU tensor is) to cuda:0 and back.
  const int64_t n = int64_t(bytes / sizeof(float));
  Tensor h = full(rt, {n}, Device::cpu(), 1.0f);
  Tensor d = full(rt, {n}, g, 1.0f);
  rt.engine().wait_all();
  auto through_runtime = [&](const Tensor& src, Device to_dev, bool non_blocking) {
    return gb / best_seconds(reps, [&] {
             Tensor out = copy(src, to_dev, non_blocking);
             rt.engine().wait(out.var());
           });
  };
  h2d.rt_blocking = through_runtime(h, g, false);
  h2d.rt_non_blocking = through_runtime(h, g, true);
  d2h.rt_blocking = through_runtime(d, Device::cpu(), false);
  d2h.rt_non_blocking = through_runtime(d, Device::cpu(), true);
  return {h2d, d2h};
}

struct OverlapResult {
  double run_s, copy_s, blocking_s, non_blocking_s;
};

// The seed: y = run(x) (10 products), then copy every y to the host. Blocking copies wait for all compute and
// then for each other; non-blocking copies go on the copy stream and start as soon as each y is ready.
OverlapResult bench_overlap(Runtime& rt, int n, int count) {
  const Device g = Device::cuda(0), cpu = Device::cpu();
  Tensor x = uniform(rt, {n, n}, g, 7, -1, 1);
  auto copy_all = [&](const std::vector<Tensor>& ys, bool non_blocking) {
    std::vector<Tensor> out;
    for (const Tensor& y : ys) out.push_back(copy(y, cpu, non_blocking));
    return out;
  };
  {  // warm-up: caches, cuBLAS handles, staging buffers, both streams
    auto ys = matmul_repeat(x, x, count);
    auto a = copy_all(ys, false), b = copy_all(ys, true);
    rt.engine().wait_all();
  }
  OverlapResult r{};
  std::vector<Tensor> ys;
  r.run_s = best_seconds(1, [&] {
    ys = matmul_repeat(x, x, count);
    rt.engine().wait_all();
  });
  r.copy_s = best_seconds(1, [&] {
    auto out = copy_all(ys, false);
    rt.engine().wait_all();
  });
  ys.clear();
  r.blocking_s = best_seconds(1, [&] {
    auto y = matmul_repeat(x, x, count);
    auto out = copy_all(y, false);
    rt.engine().wait_all();
  });
  r.non_blocking_s = best_seconds(1, [&] {
    auto y = matmul_repeat(x, x, count);
    auto out = copy_all(y, true);
    rt.engine().wait_all();
  });
  return r;
}

}  // namespace

int main() {
  try {
    Runtime rt;
    if (rt.cuda_device_count() == 0) {
      std::printf("SKIP: no CUDA device (or no driver): nothing to benchmark\n");
      return 77;
    }
    const DeviceInfo& info = rt.info(Device::cuda(0));
    std::printf("cuda:0  %s  %s  cc %s  %d SMs  driver %s  runtime %s  cuBLAS %s\n", info.name.c_str(),
                format_bytes(info.total_memory).c_str(), info.compute_capability.c_str(), info.sm_count,
                info.driver_version.c_str(), info.runtime_version.c_str(), info.cublas_version.c_str());
    std::printf("peak fp32 %.0f GFLOP/s: %s\n\n", info.peak_gflops, info.peak_source.c_str());

    std::printf("matmul (square, n x n x n)\n");
    std::printf("  %-5s %5s %5s %14s %14s %8s %9s\n", "prec", "n", "reps", "runtime GF/s", "cuBLAS GF/s",
                "ratio", "% peak");
    std::vector<MatmulRow> rows;
    for (Precision p : {Precision::Fp32, Precision::Tf32})
      for (auto [n, reps] : {std::pair{1024, 200}, {2048, 50}, {4096, 20}}) {
        MatmulRow r = bench_matmul(rt, n, reps, p);
        rows.push_back(r);
        std::printf("  %-5s %5d %5d %14.0f %14.0f %8.2f %8.0f%%\n", r.precision, r.n, r.reps,
                    r.runtime_gflops, r.cublas_gflops, r.runtime_gflops / r.cublas_gflops,
                    100 * r.runtime_gflops / info.peak_gflops);
        std::fflush(stdout);
      }

    const size_t copy_bytes = size_t(256) << 20;
    std::printf("\ncopy bandwidth, %s, best of 5 (GB/s)\n", format_bytes(int64_t(copy_bytes)).c_str());
    std::printf("  %-16s %12s %12s %14s %16s\n", "direction", "raw pageable", "raw pinned", "rt blocking",
                "rt non-blocking");
    auto copies = bench_copies(rt, copy_bytes);
    for (const CopyRow& c : copies)
      std::printf("  %-16s %12.1f %12.1f %14.1f %16.1f\n", c.direction, c.raw_pageable, c.raw_pinned,
                  c.rt_blocking, c.rt_non_blocking);
    std::printf(
        "  (rt blocking: cudaMemcpyAsync from/to pageable memory on the compute stream;\n"
        "   rt non-blocking: copy stream, through two page-locked staging chunks)\n");
    std::fflush(stdout);

    const int n = 4000, count = 10;
    OverlapResult o = bench_overlap(rt, n, count);
    std::printf("\ncompute/copy overlap: %d x matmul %dx%d on cuda:0, then copy each result to the host\n",
                count, n, n);
    std::printf("  run alone                 %8.1f ms\n", o.run_s * 1e3);
    std::printf("  copy alone                %8.1f ms\n", o.copy_s * 1e3);
    std::printf("  run + copy, blocking      %8.1f ms\n", o.blocking_s * 1e3);
    std::printf("  run + copy, non-blocking  %8.1f ms\n", o.non_blocking_s * 1e3);
    std::printf("  blocking / non-blocking   %8.2f x   (seed, d2l: 2.84 s / 1.65 s = 1.72 x)\n",
                o.blocking_s / o.non_blocking_s);

    // One line per result, for scripts.
    std::printf("\nSUMMARY\n");
    for (const MatmulRow& r : rows)
      std::printf("  matmul_%s_%d  runtime %.0f GF/s  cublas %.0f GF/s  ratio %.2f\n", r.precision, r.n,
                  r.runtime_gflops, r.cublas_gflops, r.runtime_gflops / r.cublas_gflops);
    for (const CopyRow& c : copies)
      std::printf("  copy %-15s pageable %.1f  pinned %.1f  rt_blocking %.1f  rt_non_blocking %.1f GB/s\n",
                  c.direction, c.raw_pageable, c.raw_pinned, c.rt_blocking, c.rt_non_blocking);
    std::printf("  overlap  blocking %.1f ms  non_blocking %.1f ms  ratio %.2f\n", o.blocking_s * 1e3,
                o.non_blocking_s * 1e3, o.blocking_s / o.non_blocking_s);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cuda_bench: %s\n", e.what());
    return 1;
  }
}
