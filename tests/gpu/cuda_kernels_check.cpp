// Qt-free check of every CUDA op through the public API, against float64 references computed on the host.
// The layer ops (gpunodes/nn: grouped convolution, activations, dropout, concat/split, batch norm) are
// checked against the CPU device on the same inputs, with cuDNN's TF32 off, and where cheap against float64.
// Built where the toolkit is; run on a machine with a GPU. Exit 0: all passed, 1: a check failed,
// 77: no CUDA device (CTest's skip code).
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/ops.h"

using namespace gn;

namespace {

int g_failures = 0;
int g_checks = 0;

// One failed expectation: printed at once, counted, and the check goes on.
#define EXPECT(cond, ...)                                     \
  do {                                                        \
    ++g_checks;                                               \
    if (!(cond)) {                                            \
      ++g_failures;                                           \
      std::printf("    FAIL line %d: %s: ", __LINE__, #cond); \
      std::printf(__VA_ARGS__);                               \
      std::printf("\n");                                      \
    }                                                         \
  } while (0)

// Runs one named check; an exception counts as a failure and does not stop the others.
void run_check(const char* name, const std::function<void()>& body) {
  const int before = g_failures;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    body();
  } catch (const std::exception& e) {
    ++g_failures;
    std::printf("    FAIL: threw %s\n", e.what());
  }
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%-4s %-44s %9.1f ms\n", g_failures == before ? "ok" : "FAIL", name, ms);
  std::fflush(stdout);
}

// Row-major op(A)[m,k] op(B)[k,n] in float64 at (i, j).
double gemm_ref(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n, int64_t k,
                bool ta, bool tb, int64_t i, int64_t j) {
  double acc = 0;
  for (int64_t p = 0; p < k; ++p) {
    const double x = ta ? a[p * m + i] : a[i * k + p];
    const double y = tb ? b[j * k + p] : b[p * n + j];
    acc += x * y;
  }
  return acc;
}

// Checks every element of a small product, or sampled rows/columns of a large one, against float64.
// The bound: each product of values in [-1, 1] carries relative error ~2^-24 (fp32) or ~2^-11 (tf32).
void check_matmul(Runtime& rt, int64_t m, int64_t n, int64_t k, bool ta, bool tb, Precision precision,
                  const std::vector<int64_t>& rows = {}) {
  const Device g = Device::cuda(0);
  Tensor a = uniform(rt, ta ? Shape{k, m} : Shape{m, k}, g, 11, -1, 1);
  Tensor b = uniform(rt, tb ? Shape{n, k} : Shape{k, n}, g, 12, -1, 1);
  Tensor c = matmul(a, b, {ta, tb, precision});
  EXPECT(c.shape() == (Shape{m, n}), "shape %s", shape_str(c.shape()).c_str());
  EXPECT(c.device() == g, "device %s", c.device().str().c_str());
  const auto av = to_host(a), bv = to_host(b), cv = to_host(c);
  const double tol = precision == Precision::Tf32 ? 1e-2 * std::sqrt(double(k)) : 2e-6 * double(k);
  std::vector<int64_t> rs = rows, cs;
  if (rs.empty())
    for (int64_t i = 0; i < m; ++i) rs.push_back(i);
  if (rows.empty()) {
    for (int64_t j = 0; j < n; ++j) cs.push_back(j);
  } else {
    for (int64_t j = 0; j < n; j += std::max<int64_t>(1, n / 61)) cs.push_back(j);
    cs.push_back(n - 1);
  }
  double worst = 0;
  int64_t wi = 0, wj = 0;
  for (int64_t i : rs)
    for (int64_t j : cs) {
      const double err = std::abs(cv[i * n + j] - gemm_ref(av, bv, m, n, k, ta, tb, i, j));
      if (err > worst) worst = err, wi = i, wj = j;
    }
  EXPECT(worst <= tol, "%lldx%lldx%lld ta=%d tb=%d: |err| %.3g at (%lld,%lld) > %.3g", (long long)m,
         (long long)n, (long long)k, ta, tb, worst, (long long)wi, (long long)wj, tol);
}

bool same_bits(float x, float y) {
  return std::memcmp(&x, &y, sizeof x) == 0;
}

// The largest |got - want| / max(floor, |want|) over all elements; infinity when the sizes differ or a value
// is not finite.
double max_rel_err(const std::vector<float>& want, const std::vector<float>& got, double floor = 1e-2) {
  if (want.size() != got.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
    worst = std::max(worst, std::abs(double(got[i]) - want[i]) / std::max(floor, std::abs(double(want[i]))));
  }
  return worst;
}

// A CUDA result against the CPU device's on the same inputs: same shape, devices as expected, values within
// `tol` (relative, floored at `floor`).
void expect_matches_cpu(const char* what, const Tensor& cpu, const Tensor& gpu, double tol,
                        double floor = 1e-2) {
  EXPECT(cpu.defined() && gpu.defined(), "%s: undefined result", what);
  if (!cpu.defined() || !gpu.defined()) return;
  EXPECT(gpu.shape() == cpu.shape(), "%s: shape %s, cpu %s", what, shape_str(gpu.shape()).c_str(),
         shape_str(cpu.shape()).c_str());
  EXPECT(gpu.device() == Device::cuda(0) && cpu.device() == Device::cpu(), "%s: devices %s, %s", what,
         gpu.device().str().c_str(), cpu.device().str().c_str());
  const double err = max_rel_err(to_host(cpu), to_host(gpu), floor);
  EXPECT(err <= tol, "%s: CUDA differs from the CPU by %.3g (relative) > %.3g", what, err, tol);
}

// Counts the elements whose bits differ (all of them when the sizes differ).
int64_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return int64_t(std::max(a.size(), b.size()));
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += !same_bits(a[i], b[i]);
  return n;
}

// Grouped 2-D convolution in float64, NCHW, no bias: y[n, k, oh, ow].
std::vector<double> conv2d_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t n, int64_t c,
                               int64_t h, int64_t wd, int64_t k, int64_t r, int64_t s, int64_t stride,
                               int64_t pad, int64_t groups, int64_t oh, int64_t ow) {
  const int64_t cg = c / groups, kg = k / groups;
  std::vector<double> y(size_t(n * k * oh * ow), 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < k; ++o) {
      const int64_t c0 = o / kg * cg;
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = 0;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t u = 0; u < r; ++u)
              for (int64_t v = 0; v < s; ++v) {
                const int64_t yy = i * stride - pad + u, xx = j * stride - pad + v;
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                acc += double(x[((b * c + c0 + ci) * h + yy) * wd + xx]) * w[((o * cg + ci) * r + u) * s + v];
              }
          y[((b * k + o) * oh + i) * ow + j] = acc;
        }
    }
  return y;
}

}  // namespace

int main() {
  Runtime rt;
  if (rt.cuda_device_count() == 0) {
    std::printf("SKIP: no CUDA device\n");
    return 77;
  }
  const Device g = Device::cuda(0);

  run_check("devices: cuda:0 described", [&] {
    for (const DeviceInfo& d : rt.devices()) {
      if (!d.device.is_cuda()) continue;
      std::printf(
          "    %s: %s, %s total, %s free, cc %s, %d SMs, driver %s, runtime %s, cuBLAS %s, cuDNN %s, "
          "peak %.0f GFLOP/s (%s)\n",
          d.device.str().c_str(), d.name.c_str(), format_bytes(d.total_memory).c_str(),
          format_bytes(d.free_memory).c_str(), d.compute_capability.c_str(), d.sm_count,
          d.driver_version.c_str(), d.runtime_version.c_str(), d.cublas_version.c_str(),
          d.cudnn_version.c_str(), d.peak_gflops, d.peak_source.c_str());
    }
    const DeviceInfo& d = rt.info(g);
    EXPECT(!d.name.empty(), "no name");
    EXPECT(d.total_memory > 0 && d.free_memory > 0 && d.free_memory <= d.total_memory, "memory %lld/%lld",
           (long long)d.free_memory, (long long)d.total_memory);
    EXPECT(d.compute_capability.find('.') != std::string::npos, "cc '%s'", d.compute_capability.c_str());
    EXPECT(d.sm_count > 0, "sm_count %d", d.sm_count);
    EXPECT(!d.driver_version.empty() && !d.runtime_version.empty(), "versions '%s' '%s'",
           d.driver_version.c_str(), d.runtime_version.c_str());
    EXPECT(!d.cublas_version.empty() && !d.cudnn_version.empty(), "library versions missing");
    EXPECT(d.peak_gflops > 1000 && !d.peak_source.empty(), "peak %.0f", d.peak_gflops);
    EXPECT(rt.try_gpu(0) == g, "try_gpu(0) = %s", rt.try_gpu(0).str().c_str());
  });

  run_check("matmul fp32: square, non-square, transposes", [&] {
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        check_matmul(rt, 64, 64, 64, ta, tb, Precision::Fp32);
        check_matmul(rt, 37, 91, 53, ta, tb, Precision::Fp32);
        check_matmul(rt, 129, 17, 300, ta, tb, Precision::Fp32);
      }
    check_matmul(rt, 1, 1, 1, false, false, Precision::Fp32);
    check_matmul(rt, 512, 384, 640, false, false, Precision::Fp32);
  });

  run_check("matmul k = 0 gives zeros", [&] {
    Tensor a = ones(rt, {3, 0}, g), b = ones(rt, {0, 5}, g);
    auto c = to_host(matmul(a, b));
    bool all_zero = c.size() == 15;
    for (float v : c) all_zero = all_zero && v == 0.0f;
    EXPECT(all_zero, "size %zu", c.size());
  });

  run_check("matmul tf32 close to float64", [&] {
    check_matmul(rt, 256, 256, 256, false, false, Precision::Tf32);
    check_matmul(rt, 100, 70, 130, true, true, Precision::Tf32);
  });

  run_check("matmul in row chunks (10000^3, sampled)", [&] {
    // 2e12 FLOPs: split into row chunks, so check rows on both sides of every chunk boundary.
    const std::vector<int64_t> rows = {0, 1, 4991, 4992, 4993, 9983, 9984, 9999};
    check_matmul(rt, 10000, 10000, 10000, false, false, Precision::Fp32, rows);
    check_matmul(rt, 10000, 10000, 10000, true, true, Precision::Fp32, rows);
  });

  run_check("binary and unary ops vs float64", [&] {
    const int64_t n = (1 << 20) + 3;
    Tensor a = uniform(rt, {n}, g, 3, -2, 2), b = uniform(rt, {n}, g, 4, 0.5f, 1.5f);
    const auto av = to_host(a), bv = to_host(b);
    const auto s = to_host(add(a, b)), d = to_host(sub(a, b)), p = to_host(mul(a, b)), q = to_host(div(a, b));
    const auto e = to_host(gn::exp(a)), r = to_host(relu(a)), ss = to_host(scale_shift(a, 3.5f, -1.25f));
    int64_t bad_exact = 0, bad_close = 0;
    auto close = [](double got, double want) {
      return std::abs(got - want) <= 2.5e-7 * std::abs(want) + 1e-30;
    };
    for (int64_t i = 0; i < n; ++i) {
      const double x = av[i], y = bv[i];
      // Sums, differences and products of two floats are exact in double: one rounding, so bit-equal.
      bad_exact += !same_bits(s[i], float(x + y)) + !same_bits(d[i], float(x - y)) +
                   !same_bits(p[i], float(x * y)) + !same_bits(r[i], av[i] > 0 ? av[i] : 0.0f);
      bad_close += !close(q[i], x / y) + !std::isfinite(e[i]) +
                   !(std::abs(e[i] - std::exp(x)) <= 4e-7 * std::exp(x)) +
                   !(std::abs(ss[i] - (3.5 * x - 1.25)) <= 1e-6 * (1 + std::abs(3.5 * x - 1.25)));
    }
    EXPECT(bad_exact == 0, "%lld add/sub/mul/relu results not correctly rounded", (long long)bad_exact);
    EXPECT(bad_close == 0, "%lld div/exp/scale_shift results off", (long long)bad_close);
  });

  run_check("elementwise results bit-equal to the CPU device", [&] {
    const int64_t n = 100003;
    auto on = [&](Device dev) {
      Tensor a = uniform(rt, {n}, dev, 21, -3, 3), b = uniform(rt, {n}, dev, 22, 1, 2);
      std::vector<std::vector<float>> out;
      for (const Tensor& t : {add(a, b), sub(a, b), mul(a, b), div(a, b), relu(a), scale_shift(a, 0.3f, 0.7f),
                              arange(rt, n, dev, -5.0f, 0.001f), full(rt, {n}, dev, 2.5f)})
        out.push_back(to_host(t));
      return out;
    };
    const auto gpu = on(g), cpu = on(Device::cpu());
    const char* names[] = {"add", "sub", "mul", "div", "relu", "scale_shift", "arange", "fill"};
    for (size_t op = 0; op < gpu.size(); ++op) {
      int64_t diff = 0;
      for (int64_t i = 0; i < n; ++i) diff += !same_bits(gpu[op][i], cpu[op][i]);
      EXPECT(diff == 0, "%s: %lld of %lld elements differ from cpu", names[op], (long long)diff,
             (long long)n);
    }
  });

  run_check("sum and frobenius_norm vs float64", [&] {
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(255), int64_t(257), int64_t((1 << 22) + 5)}) {
      Tensor x = uniform(rt, {n}, g, 5, -1, 1);
      const auto xv = to_host(x);
      double s = 0, sq = 0;
      for (float v : xv) s += v, sq += double(v) * v;
      const float got_s = item(sum(x)), got_n = item(frobenius_norm(x));
      // Accumulated in double on the GPU too: within a rounding of the float result.
      EXPECT(std::abs(got_s - s) <= 1e-6 * std::max(1.0, std::abs(s)), "n=%lld sum %.9g want %.9g",
             (long long)n, got_s, s);
      EXPECT(std::abs(got_n - std::sqrt(sq)) <= 1e-6 * std::max(1.0, std::sqrt(sq)),
             "n=%lld norm %.9g want %.9g", (long long)n, got_n, std::sqrt(sq));
      EXPECT(sum(x).shape().empty() && sum(x).device() == g, "result shape/device");
    }
  });

  run_check("random: same seed, same values as cpu", [&] {
    for (int64_t n : {int64_t(4099), int64_t(1 << 20)}) {
      const auto gu = to_host(uniform(rt, {n}, g, 9, -1, 3)),
                 cu = to_host(uniform(rt, {n}, Device::cpu(), 9, -1, 3));
      int64_t diff = 0;
      for (int64_t i = 0; i < n; ++i) diff += !same_bits(gu[i], cu[i]);
      EXPECT(diff == 0, "uniform n=%lld: %lld elements differ", (long long)n, (long long)diff);
      const auto gn_ = to_host(normal(rt, {n}, g, 9, 1, 2)),
                 cn = to_host(normal(rt, {n}, Device::cpu(), 9, 1, 2));
      int64_t not_equal = 0, far = 0;
      for (int64_t i = 0; i < n; ++i) {
        not_equal += !same_bits(gn_[i], cn[i]);
        // Device double sin/cos/log may differ from libm's in the last double bit, rarely visible as one
        // float ulp.
        far += !(std::abs(gn_[i] - cn[i]) <= 1e-6f * (1 + std::abs(cn[i])));
      }
      std::printf("    normal n=%lld: %lld of %lld not bit-equal (allowed: within 1e-6)\n", (long long)n,
                  (long long)not_equal, (long long)n);
      EXPECT(far == 0, "normal n=%lld: %lld elements differ by more than 1e-6", (long long)n, (long long)far);
    }
    // Different seeds differ.
    EXPECT(to_host(uniform(rt, {8}, g, 1)) != to_host(uniform(rt, {8}, g, 2)),
           "seeds 1 and 2 gave the same values");
  });

  run_check("copies h2d, d2h, d2d, blocking and not", [&] {
    // 40 MiB + 3 floats: several staging chunks and a ragged end.
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t((10 << 20) + 3)}) {
      Tensor h = arange(rt, n, Device::cpu(), 0.5f, 1.0f);
      const auto want = to_host(h);
      for (bool nb : {false, true}) {
        Tensor d = copy(h, g, nb);
        EXPECT(d.device() == g, "h2d device");
        Tensor d2 = copy(d, g, nb);
        EXPECT(!d2.is_same(d), "copy on the same device must be new storage");
        Tensor back = copy(d2, Device::cpu(), nb);
        EXPECT(back.device() == Device::cpu(), "d2h device");
        EXPECT(to_host(back) == want, "n=%lld non_blocking=%d: round trip differs", (long long)n, nb);
        EXPECT(to_host(d2) == want, "n=%lld non_blocking=%d: to_host of d2d copy differs", (long long)n, nb);
        if (rt.cuda_device_count() > 1) {
          Tensor peer = copy(d, Device::cuda(1), nb);
          EXPECT(peer.device() == Device::cuda(1) && to_host(peer) == want, "cuda:0 -> cuda:1 copy differs");
          EXPECT(to_host(copy(peer, g, nb)) == want, "cuda:1 -> cuda:0 copy differs");
        }
      }
      EXPECT(to_host(from_values(rt, {3}, g, {1.0f, -2.0f, 3.5f})) == (std::vector<float>{1.0f, -2.0f, 3.5f}),
             "from_values");
    }
    Tensor d = to(full(rt, {4}, Device::cpu(), 1.0f), g);
    EXPECT(to(d, g).is_same(d), "to() on the same device returns the same tensor");
  });

  run_check("copy from another CPU device (cpu:1)", [&] {
    RuntimeOptions options;
    options.cpu_devices = 2;
    Runtime two(options);
    Tensor h = arange(two, 1 << 16, Device::cpu(1));
    EXPECT(to_host(copy(copy(h, g, true), Device::cpu(1), true)) == to_host(h), "cpu:1 -> cuda:0 -> cpu:1");
  });

  run_check("same-device rule", [&] {
    Tensor a = ones(rt, {2}, g), b = ones(rt, {2}, Device::cpu());
    try {
      add(a, b);
      EXPECT(false, "no DeviceMismatchError");
    } catch (const DeviceMismatchError& e) {
      EXPECT(std::string(e.what()) ==
                 "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and "
                 "cpu!",
             "message: %s", e.what());
    }
  });

  run_check("allocator stats: allocated, reserved, peak, reuse", [&] {
    Runtime fresh;
    Allocator& al = fresh.allocator(g);
    const MemoryStats s0 = al.stats();
    MemoryStats s1, s2;
    {
      Tensor a(fresh, {1 << 20}, g), b(fresh, {1 << 20}, g);  // 4 MiB each
      s1 = al.stats();
    }
    {
      Tensor c(fresh, {1 << 20}, g);  // served from the cache
      s2 = al.stats();
    }
    const MemoryStats s3 = al.stats();
    EXPECT(s1.allocated_bytes.current - s0.allocated_bytes.current == (8 << 20), "allocated %lld",
           (long long)(s1.allocated_bytes.current - s0.allocated_bytes.current));
    EXPECT(s1.reserved_bytes.current >= s1.allocated_bytes.current, "reserved < allocated");
    EXPECT(s2.reserved_bytes.current == s1.reserved_bytes.current, "cache miss: reserved grew %lld -> %lld",
           (long long)s1.reserved_bytes.current, (long long)s2.reserved_bytes.current);
    EXPECT(s3.allocated_bytes.current == s0.allocated_bytes.current, "leak: %lld",
           (long long)(s3.allocated_bytes.current - s0.allocated_bytes.current));
    EXPECT(s3.allocated_bytes.peak - s0.allocated_bytes.current >= (8 << 20), "peak %lld",
           (long long)s3.allocated_bytes.peak);
    EXPECT(s3.num_allocs - s0.num_allocs == 3, "num_allocs %lld", (long long)(s3.num_allocs - s0.num_allocs));
    al.empty_cache();
    EXPECT(al.stats().reserved_bytes.current == 0, "empty_cache left %lld reserved",
           (long long)al.stats().reserved_bytes.current);
    // Small blocks share segments: many small tensors cost one or a few cudaMallocs.
    {
      std::vector<Tensor> small;
      for (int i = 0; i < 100; ++i) small.emplace_back(fresh, Shape{100}, g);
      EXPECT(al.stats().reserved_bytes.current <= (2 << 20), "100 small tensors reserved %lld",
             (long long)al.stats().reserved_bytes.current);
    }
  });

  run_check("out of memory: memory_limits and the real card", [&] {
    RuntimeOptions options;
    options.memory_limits[g] = 64 << 20;
    Runtime small(options);
    {
      Tensor a = zeros(small, {4 << 20}, g);  // 16 MiB
      try {
        Tensor b = zeros(small, {16 << 20}, g);  // 64 MiB more
        EXPECT(false, "no OutOfMemoryError under a 64 MiB limit");
      } catch (const OutOfMemoryError& e) {
        std::printf("    %s\n", e.what());
        EXPECT(std::string(e.what()).find("cuda:0") != std::string::npos, "message names no device");
        EXPECT(e.requested == (64 << 20) && e.limit == (64 << 20), "requested %lld limit %lld",
               (long long)e.requested, (long long)e.limit);
      }
      small.engine().wait_all();
    }
    // The 16 MiB block is cached now; a 56 MiB request frees the cache and retries.
    Tensor c = zeros(small, {14 << 20}, g);
    EXPECT(item(sum(c)) == 0.0f, "allocation after freeing the cache");
    EXPECT(small.memory_stats(g).num_ooms == 1, "num_ooms %lld", (long long)small.memory_stats(g).num_ooms);
    // More than the card has: a clean error, never an abort.
    const int64_t too_many = rt.info(g).total_memory / 4 * 2;
    try {
      Tensor huge(rt, {too_many}, g);
      EXPECT(false, "no OutOfMemoryError for %s", format_bytes(too_many * 4).c_str());
    } catch (const OutOfMemoryError& e) {
      std::printf("    %s\n", e.what());
    }
    EXPECT(item(sum(ones(rt, {10}, g))) == 10.0f, "the device works after an OOM");
  });

  run_check("profiler spans from CUDA events", [&] {
    const size_t from = rt.profiler().span_count();
    Tensor a = uniform(rt, {1024, 1024}, g, 1);
    Tensor c = matmul(a, a);
    rt.engine().wait_all();
    bool found = false;
    for (const Span& s : rt.profiler().spans(from))
      if (s.name == "matmul" && s.device == g) {
        found = true;
        EXPECT(s.end_us > s.start_us && s.start_us > 0, "span %.1f..%.1f", s.start_us, s.end_us);
        EXPECT(s.end_us <= rt.profiler().now_us() + 1000, "span ends in the future: %.1f > %.1f", s.end_us,
               rt.profiler().now_us());
      }
    EXPECT(found, "no matmul span on cuda:0");
  });

  run_check("cancel stops a long GPU queue within 1 s", [&] {
    Runtime crt;
    Tensor a = uniform(crt, {8192, 8192}, g, 1);
    crt.engine().wait_all();
    // 40 products of 1.1 TFLOP each: seconds of work, cut short.
    auto outs = matmul_repeat(a, a, 40);
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto t0 = std::chrono::steady_clock::now();
    crt.engine().cancel();
    bool cancelled = false;
    try {
      crt.engine().wait_all();
    } catch (const CancelledError&) {
      cancelled = true;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT(cancelled, "wait_all did not rethrow CancelledError");
    EXPECT(s < 1.0, "cancel took %.2f s", s);
    crt.engine().reset_cancel();
    outs.clear();
    EXPECT(item(sum(ones(crt, {4}, g))) == 4.0f, "usable after reset_cancel");
  });

  // --- the layer ops (gpunodes/nn): CUDA against the CPU device on the same inputs, TF32 off -------------
  // (No ScopedPrecision: the products are full fp32, no TF32.)
  const Device cpu = Device::cpu();

  run_check("nn: grouped conv2d, bias off, fwd + bwd", [&] {
    struct Case {
      int64_t n, c, h, w, k, r, stride, pad, groups;
    };
    // groups 2; depthwise (groups == C) with a channel multiplier of 2 and stride 2; groups 3 with a 1x1.
    for (const Case& cs : {Case{2, 6, 9, 9, 4, 3, 1, 1, 2}, Case{3, 8, 11, 10, 16, 3, 2, 1, 8},
                           Case{2, 9, 7, 7, 6, 1, 1, 0, 3}}) {
      const nn::Conv2dOptions o{.stride = cs.stride, .padding = cs.pad, .groups = cs.groups};
      Tensor xc = uniform(rt, {cs.n, cs.c, cs.h, cs.w}, cpu, 31, -1, 1);
      Tensor wc = uniform(rt, {cs.k, cs.c / cs.groups, cs.r, cs.r}, cpu, 32, -1, 1);
      Tensor xg = to(xc, g), wg = to(wc, g);
      Tensor yc = nn::conv2d(xc, wc, Tensor(), o), yg = nn::conv2d(xg, wg, Tensor(), o);
      char what[96];
      std::snprintf(what, sizeof what, "conv2d groups=%lld k=%lld stride=%lld", (long long)cs.groups,
                    (long long)cs.r, (long long)cs.stride);
      expect_matches_cpu(what, yc, yg, 1e-4);
      // Both against float64, which also pins the grouping (output channel k sees its group's inputs).
      const int64_t oh = (cs.h + 2 * cs.pad - cs.r) / cs.stride + 1,
                    ow = (cs.w + 2 * cs.pad - cs.r) / cs.stride + 1;
      EXPECT(yg.shape() == (Shape{cs.n, cs.k, oh, ow}), "%s: shape %s", what, shape_str(yg.shape()).c_str());
      const auto ref = conv2d_ref(to_host(xc), to_host(wc), cs.n, cs.c, cs.h, cs.w, cs.k, cs.r, cs.r,
                                  cs.stride, cs.pad, cs.groups, oh, ow);
      const auto ygv = to_host(yg);
      double worst = ygv.size() == ref.size() ? 0 : INFINITY;
      for (size_t i = 0; i < ref.size() && i < ygv.size(); ++i)
        worst = std::max(worst, std::abs(ygv[i] - ref[i]) / std::max(1e-2, std::abs(ref[i])));
      EXPECT(worst <= 1e-4, "%s: cuda:0 differs from float64 by %.3g", what, worst);
      // Backward without a bias gradient: db stays undefined on both devices.
      Tensor dyc = uniform(rt, yc.shape(), cpu, 33, -1, 1), dyg = to(dyc, g);
      const nn::Conv2dGrads gc = nn::conv2d_backward(xc, wc, dyc, o, true, false);
      const nn::Conv2dGrads gg = nn::conv2d_backward(xg, wg, dyg, o, true, false);
      EXPECT(!gg.db.defined() && !gc.db.defined(), "%s: db defined with need_db = false", what);
      std::string w2 = std::string(what) + " dx";
      expect_matches_cpu(w2.c_str(), gc.dx, gg.dx, 1e-4);
      w2 = std::string(what) + " dw";
      expect_matches_cpu(w2.c_str(), gc.dw, gg.dw, 1e-4);
    }
  });

  run_check("nn: tanh and gelu, fwd + bwd", [&] {
    const int64_t n = 100003;
    Tensor xc = uniform(rt, {n}, cpu, 41, -5, 5), dyc = uniform(rt, {n}, cpu, 42, -1, 1);
    Tensor xg = to(xc, g), dyg = to(dyc, g);
    const auto xv = to_host(xc);
    for (nn::Activation kind : {nn::Activation::Tanh, nn::Activation::Gelu}) {
      const char* name = nn::activation_name(kind);
      Tensor yc = nn::activation(kind, xc), yg = nn::activation(kind, xg);
      // Floored at 0.1: GELU's 1 + erf(x / sqrt 2) cancels for x << 0 (in PyTorch's kernel too), which leaves
      // absolute errors near 1e-7 on values near 0.
      expect_matches_cpu(name, yc, yg, 1e-5, 0.1);
      // float64: tanh, and GELU's exact form x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
      std::vector<float> ref(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const double x = xv[i];
        ref[i] =
            float(kind == nn::Activation::Tanh ? std::tanh(x) : 0.5 * x * (1 + std::erf(x / std::sqrt(2.0))));
      }
      const double err = max_rel_err(ref, to_host(yg), 0.1);
      EXPECT(err <= 1e-5, "%s: cuda:0 differs from float64 by %.3g", name, err);
      // tanh' follows from y, GELU's from x: pass what each needs.
      Tensor dxc = nn::activation_backward(kind, xc, yc, dyc),
             dxg = nn::activation_backward(kind, xg, yg, dyg);
      const std::string what = std::string(name) + " backward";
      expect_matches_cpu(what.c_str(), dxc, dxg, 1e-5, 0.1);
    }
  });

  run_check("nn: dropout mask and values equal the CPU's", [&] {
    const int64_t n = (1 << 20) + 7;
    Tensor xc = uniform(rt, {n}, cpu, 51, -2, 2), xg = to(xc, g);
    for (float p : {0.1f, 0.5f, 0.9f}) {
      const nn::DropoutResult rc = nn::dropout(xc, p, 1234), rg = nn::dropout(xg, p, 1234);
      const auto mc = to_host(rc.mask), mg = to_host(rg.mask);
      EXPECT(bits_differ(mc, mg) == 0, "p=%g: %lld mask elements differ from the CPU's", p,
             (long long)bits_differ(mc, mg));
      EXPECT(bits_differ(to_host(rc.y), to_host(rg.y)) == 0, "p=%g: y differs from the CPU's", p);
      int64_t kept = 0, bad_value = 0;
      const float scale = 1.0f / (1.0f - p);
      for (float m : mg) {
        kept += m != 0.0f;
        bad_value += !(m == 0.0f || same_bits(m, scale));
      }
      const double frac = double(kept) / double(n);
      EXPECT(std::abs(frac - (1.0 - p)) < 0.005, "p=%g: kept %.4f of the values", p, frac);
      EXPECT(bad_value == 0, "p=%g: %lld mask values are neither 0 nor 1/(1-p)", p, (long long)bad_value);
      Tensor dyc = uniform(rt, {n}, cpu, 52, -1, 1);
      EXPECT(bits_differ(to_host(nn::dropout_backward(dyc, rc.mask)),
                         to_host(nn::dropout_backward(to(dyc, g), rg.mask))) == 0,
             "p=%g: dropout backward differs from the CPU's", p);
    }
    // Another seed, another mask.
    EXPECT(to_host(nn::dropout(xg, 0.5f, 1).mask) != to_host(nn::dropout(xg, 0.5f, 2).mask),
           "seeds 1 and 2 gave the same mask");
  });

  run_check("nn: concat_channels and split_channels", [&] {
    for (const auto& [sa, sb] :
         {std::pair<Shape, Shape>{{3, 2, 5, 7}, {3, 4, 5, 7}}, std::pair<Shape, Shape>{{17, 3}, {17, 29}},
          std::pair<Shape, Shape>{{2, 0, 4, 4}, {2, 5, 4, 4}}}) {
      Tensor ac = uniform(rt, sa, cpu, 61, -1, 1), bc = uniform(rt, sb, cpu, 62, -1, 1);
      Tensor yc = nn::concat_channels(ac, bc), yg = nn::concat_channels(to(ac, g), to(bc, g));
      const std::string what = shape_str(sa) + " + " + shape_str(sb);
      EXPECT(yg.shape() == yc.shape() && yg.device() == g, "%s: shape %s", what.c_str(),
             shape_str(yg.shape()).c_str());
      // Per sample: a's channels, then b's.
      const auto av = to_host(ac), bv = to_host(bc);
      std::vector<float> want;
      const int64_t n = sa[0], ar = n ? int64_t(av.size()) / n : 0, br = n ? int64_t(bv.size()) / n : 0;
      for (int64_t i = 0; i < n; ++i) {
        want.insert(want.end(), av.begin() + i * ar, av.begin() + (i + 1) * ar);
        want.insert(want.end(), bv.begin() + i * br, bv.begin() + (i + 1) * br);
      }
      EXPECT(bits_differ(to_host(yg), want) == 0 && bits_differ(to_host(yc), want) == 0,
             "%s: concat is not a's channels then b's", what.c_str());
      auto [da, db] = nn::split_channels(yg, sa[1]);
      EXPECT(da.shape() == sa && db.shape() == sb && da.device() == g, "%s: split shapes %s %s", what.c_str(),
             shape_str(da.shape()).c_str(), shape_str(db.shape()).c_str());
      EXPECT(bits_differ(to_host(da), av) == 0 && bits_differ(to_host(db), bv) == 0,
             "%s: split does not give a and b back", what.c_str());
    }
  });

  run_check("nn: batchnorm on [N, C], train + eval + bwd", [&] {
    const int64_t n = 64, c = 10;
    // Features with different means and spreads.
    std::vector<float> xv(size_t(n * c));
    const auto u = to_host(uniform(rt, {n * c}, cpu, 71, -1, 1));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) xv[i * c + j] = float(j - 4) + float(j + 1) * 0.5f * u[i * c + j];
    Tensor xc = from_values(rt, {n, c}, cpu, xv), xg = to(xc, g);
    Tensor gamma = uniform(rt, {c}, cpu, 72, 0.5f, 1.5f), beta = uniform(rt, {c}, cpu, 73, -1, 1);
    Tensor gg = to(gamma, g), bg = to(beta, g);
    Tensor rmc = zeros(rt, {c}, cpu), rvc = ones(rt, {c}, cpu), rmg = zeros(rt, {c}, g),
           rvg = ones(rt, {c}, g);
    const nn::BatchNormOptions train{.training = true, .momentum = 0.1f, .eps = 1e-5f};
    const nn::BatchNormResult tc = nn::batchnorm2d(xc, gamma, beta, rmc, rvc, train);
    const nn::BatchNormResult tg = nn::batchnorm2d(xg, gg, bg, rmg, rvg, train);
    expect_matches_cpu("bn1d y (train)", tc.y, tg.y, 1e-4);
    expect_matches_cpu("bn1d save_mean", tc.save_mean, tg.save_mean, 1e-5);
    expect_matches_cpu("bn1d save_invstd", tc.save_invstd, tg.save_invstd, 1e-4);
    expect_matches_cpu("bn1d running_mean", rmc, rmg, 1e-5);
    expect_matches_cpu("bn1d running_var", rvc, rvg, 1e-4);
    // float64: batch mean and biased variance per feature; running = 0.9 * running + 0.1 * batch (unbiased).
    const auto gv = to_host(gamma), bv = to_host(beta), yv = to_host(tg.y), rm = to_host(rmg),
               rv = to_host(rvg);
    double worst_y = 0, worst_r = 0;
    for (int64_t j = 0; j < c; ++j) {
      double mean = 0, var = 0;
      for (int64_t i = 0; i < n; ++i) mean += xv[i * c + j];
      mean /= double(n);
      for (int64_t i = 0; i < n; ++i) var += (xv[i * c + j] - mean) * (xv[i * c + j] - mean);
      const double invstd = 1 / std::sqrt(var / double(n) + 1e-5);
      for (int64_t i = 0; i < n; ++i) {
        const double want = gv[j] * (xv[i * c + j] - mean) * invstd + bv[j];
        worst_y = std::max(worst_y, std::abs(yv[i * c + j] - want) / std::max(1e-2, std::abs(want)));
      }
      worst_r = std::max(worst_r, std::abs(rm[j] - 0.1 * mean) / std::max(1e-2, std::abs(0.1 * mean)));
      const double want_rv = 0.9 + 0.1 * var / double(n - 1);
      worst_r = std::max(worst_r, std::abs(rv[j] - want_rv) / want_rv);
    }
    EXPECT(worst_y <= 1e-4, "bn1d y: cuda:0 differs from float64 by %.3g", worst_y);
    EXPECT(worst_r <= 1e-4, "bn1d running statistics: cuda:0 differ from float64 by %.3g", worst_r);
    // The training-mode gradient.
    Tensor dyc = uniform(rt, {n, c}, cpu, 74, -1, 1);
    const nn::BatchNormGrads bc = nn::batchnorm2d_backward(xc, dyc, gamma, tc.save_mean, tc.save_invstd);
    const nn::BatchNormGrads bgr = nn::batchnorm2d_backward(xg, to(dyc, g), gg, tg.save_mean, tg.save_invstd);
    expect_matches_cpu("bn1d dx", bc.dx, bgr.dx, 1e-3);
    expect_matches_cpu("bn1d dgamma", bc.dgamma, bgr.dgamma, 1e-4);
    expect_matches_cpu("bn1d dbeta", bc.dbeta, bgr.dbeta, 1e-4);
    // Eval: the running statistics, unchanged by the call.
    const nn::BatchNormOptions eval{.training = false};
    const nn::BatchNormResult ec = nn::batchnorm2d(xc, gamma, beta, rmc, rvc, eval);
    const nn::BatchNormResult eg = nn::batchnorm2d(xg, gg, bg, rmg, rvg, eval);
    expect_matches_cpu("bn1d y (eval)", ec.y, eg.y, 1e-5);
    EXPECT(to_host(rmg) == rm && to_host(rvg) == rv, "eval changed the running statistics");
    EXPECT(!eg.save_mean.defined(), "eval returned save_mean");
  });

  std::printf("%s: %d failed of %d expectations\n", g_failures ? "FAILED" : "PASSED", g_failures, g_checks);
  return g_failures ? 1 : 0;
}
