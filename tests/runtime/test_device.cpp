// What every device must do alike, as one test body per check, run on the device GN_TEST_DEVICE names: the
// CPU by default (CI), cuda:0 in test_device_cuda and in tests/gpu/device-check.sh. The ops' values against
// float64 and against the CPU device, copies, the same-device rule, the allocator's statistics and cache,
// lazy allocation, out-of-memory and limits, the profiler, cancel, and the layer ops. A change of the
// runtime's semantics fails here on the CPU first, instead of on the first GPU run (these checks used to
// live in the Qt-free tests/gpu/cuda_kernels_check.cpp, which nothing ran, and fell behind lazy
// allocation). Only what a CUDA device alone has stays there.
#include <QtTest>
#include <atomic>
#include <chrono>
#include <cmath>
#include <thread>

#include "gpu/check_util.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/ops.h"
#include "runtime/nn_test_util.h"

using namespace gn;
using namespace std::chrono_literals;
using check::bits_differ;
using check::max_rel_err;
using check::same_bits;

namespace {

// A result on the device under test against the CPU device's on the same inputs: same shape, devices as
// expected, values within `tol` (relative, floored at `floor`). Empty when it matches, else why not.
QString differs_from_cpu(const QString& what, const Tensor& cpu, const Tensor& dev, Device device, double tol,
                         double floor = 1e-2) {
  if (!cpu.defined() || !dev.defined()) return what + ": undefined result";
  if (dev.shape() != cpu.shape())
    return what + ": shape " + QString::fromStdString(shape_str(dev.shape())) + ", cpu " +
           QString::fromStdString(shape_str(cpu.shape()));
  if (dev.device() != device || cpu.device() != Device::cpu())
    return what + ": devices " + QString::fromStdString(dev.device().str() + ", " + cpu.device().str());
  const double err = max_rel_err(to_host(cpu), to_host(dev), floor);
  if (!(err <= tol)) return what + QString(": differs from the CPU by %1 (relative) > %2").arg(err).arg(tol);
  return {};
}

#define EXPECT_MATCHES_CPU(...)                            \
  do {                                                     \
    const QString gn_why_ = differs_from_cpu(__VA_ARGS__); \
    QVERIFY2(gn_why_.isEmpty(), qPrintable(gn_why_));      \
  } while (false)

}  // namespace

class DeviceTest : public QObject {
  Q_OBJECT
  Device d_ = Device::cpu();
  const Device cpu_ = Device::cpu();

 private slots:
  void initTestCase() {
    Runtime probe;
    GN_USE_TEST_DEVICE(probe, d_);  // a GPU this machine lacks skips every test
    qInfo("device under test: %s", d_.str().c_str());
  }

  // --- the ops' values ------------------------------------------------------------------------------------

  void matmul_fp32_matches_float64() {
    Runtime rt;
    struct Size {
      int64_t m, n, k;
    };
    std::vector<std::tuple<Size, bool, bool>> cases;
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (Size s : {Size{64, 64, 64}, Size{37, 91, 53}, Size{129, 17, 300}}) cases.emplace_back(s, ta, tb);
    cases.emplace_back(Size{1, 1, 1}, false, false);
    cases.emplace_back(Size{512, 384, 640}, false, false);
    cases.emplace_back(Size{1300, 8, 700}, false, false);  // tall: the CPU's row blocks
    for (const auto& [s, ta, tb] : cases) {
      Tensor a = uniform(rt, ta ? Shape{s.k, s.m} : Shape{s.m, s.k}, d_, 11, -1, 1);
      Tensor b = uniform(rt, tb ? Shape{s.n, s.k} : Shape{s.k, s.n}, d_, 12, -1, 1);
      Tensor c = matmul(a, b, {ta, tb});
      QCOMPARE(c.device(), d_);
      const check::MatmulError e = check::matmul_error(a, b, c, ta, tb);
      const double tol = check::matmul_tolerance(Precision::Fp32, s.k);
      QVERIFY2(e.worst <= tol, qPrintable(QString("%1x%2x%3 ta=%4 tb=%5: |err| %6 at (%7, %8) > %9")
                                              .arg(s.m)
                                              .arg(s.n)
                                              .arg(s.k)
                                              .arg(ta)
                                              .arg(tb)
                                              .arg(e.worst)
                                              .arg(e.i)
                                              .arg(e.j)
                                              .arg(tol)));
    }
  }

  void matmul_with_k_zero_gives_zeros() {
    Runtime rt;
    const auto c = to_host(matmul(ones(rt, {3, 0}, d_), ones(rt, {0, 5}, d_)));
    QCOMPARE(c, std::vector<float>(15, 0.0f));
  }

  void binary_and_unary_ops_match_float64() {
    Runtime rt;
    const int64_t n = (1 << 20) + 3;
    Tensor a = uniform(rt, {n}, d_, 3, -2, 2), b = uniform(rt, {n}, d_, 4, 0.5f, 1.5f);
    const auto av = to_host(a), bv = to_host(b);
    const auto s = to_host(add(a, b)), df = to_host(sub(a, b)), p = to_host(mul(a, b)), q = to_host(div(a, b));
    const auto e = to_host(gn::exp(a)), r = to_host(relu(a)), ss = to_host(scale_shift(a, 3.5f, -1.25f));
    int64_t bad_exact = 0, bad_close = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double x = av[i], y = bv[i];
      // Sums, differences and products of two floats are exact in double: one rounding, so bit-equal.
      bad_exact += !same_bits(s[i], float(x + y)) + !same_bits(df[i], float(x - y)) +
                   !same_bits(p[i], float(x * y)) + !same_bits(r[i], av[i] > 0 ? av[i] : 0.0f);
      bad_close += !(std::abs(q[i] - x / y) <= 2.5e-7 * std::abs(x / y) + 1e-30) + !std::isfinite(e[i]) +
                   !(std::abs(e[i] - std::exp(x)) <= 4e-7 * std::exp(x)) +
                   !(std::abs(ss[i] - (3.5 * x - 1.25)) <= 1e-6 * (1 + std::abs(3.5 * x - 1.25)));
    }
    QVERIFY2(bad_exact == 0, qPrintable(QString("%1 add/sub/mul/relu results not correctly rounded").arg(bad_exact)));
    QVERIFY2(bad_close == 0, qPrintable(QString("%1 div/exp/scale_shift results off").arg(bad_close)));
  }

  void elementwise_results_are_bit_equal_to_the_cpus() {
    Runtime rt;
    const int64_t n = 100003;
    auto on = [&](Device dev) {
      Tensor a = uniform(rt, {n}, dev, 21, -3, 3), b = uniform(rt, {n}, dev, 22, 1, 2);
      std::vector<std::vector<float>> out;
      for (const Tensor& t : {add(a, b), sub(a, b), mul(a, b), div(a, b), relu(a), scale_shift(a, 0.3f, 0.7f),
                              arange(rt, n, dev, -5.0f, 0.001f), full(rt, {n}, dev, 2.5f)})
        out.push_back(to_host(t));
      return out;
    };
    const auto got = on(d_), cpu = on(cpu_);
    const char* names[] = {"add", "sub", "mul", "div", "relu", "scale_shift", "arange", "fill"};
    for (size_t op = 0; op < got.size(); ++op)
      QVERIFY2(bits_differ(got[op], cpu[op]) == 0,
               qPrintable(QString("%1: %2 of %3 elements differ from the CPU's")
                              .arg(names[op])
                              .arg(bits_differ(got[op], cpu[op]))
                              .arg(n)));
  }

  // Sizes around a reduction block (256) and one far over it: accumulated in double on every device, so
  // within a rounding of the float result.
  void sum_and_norm_match_float64() {
    Runtime rt;
    for (int64_t n : {int64_t(0), int64_t(1), int64_t(255), int64_t(257), int64_t((1 << 22) + 5)}) {
      Tensor x = uniform(rt, {n}, d_, 5, -1, 1);
      const auto xv = to_host(x);
      double s = 0, sq = 0;
      for (float v : xv) s += v, sq += double(v) * v;
      const float got_s = item(sum(x)), got_n = item(frobenius_norm(x));
      QVERIFY2(std::abs(got_s - s) <= 1e-6 * std::max(1.0, std::abs(s)),
               qPrintable(QString("n=%1: sum %2, float64 %3").arg(n).arg(got_s, 0, 'g', 9).arg(s, 0, 'g', 9)));
      QVERIFY2(std::abs(got_n - std::sqrt(sq)) <= 1e-6 * std::max(1.0, std::sqrt(sq)),
               qPrintable(QString("n=%1: norm %2, float64 %3").arg(n).arg(got_n, 0, 'g', 9).arg(std::sqrt(sq))));
      QVERIFY(sum(x).shape().empty());
      QCOMPARE(sum(x).device(), d_);
    }
  }

  void random_values_are_the_cpus_for_the_same_seed() {
    Runtime rt;
    for (int64_t n : {int64_t(4099), int64_t(1 << 20)}) {
      QCOMPARE(bits_differ(to_host(uniform(rt, {n}, d_, 9, -1, 3)), to_host(uniform(rt, {n}, cpu_, 9, -1, 3))),
               int64_t(0));
      const auto got = to_host(normal(rt, {n}, d_, 9, 1, 2)), cpu = to_host(normal(rt, {n}, cpu_, 9, 1, 2));
      // Device double sin/cos/log may differ from libm's in the last double bit, rarely visible as one float
      // ulp.
      int64_t far = 0;
      for (int64_t i = 0; i < n; ++i) far += !(std::abs(got[i] - cpu[i]) <= 1e-6f * (1 + std::abs(cpu[i])));
      QVERIFY2(far == 0, qPrintable(QString("normal n=%1: %2 elements differ by more than 1e-6").arg(n).arg(far)));
    }
    QVERIFY(to_host(uniform(rt, {8}, d_, 1)) != to_host(uniform(rt, {8}, d_, 2)));
  }

  // --- copies and the same-device rule ------------------------------------------------------------------

  void copies_round_trip_blocking_and_not() {
    Runtime rt;
    // 40 MiB + 3 floats: several staging chunks and a ragged end.
    for (int64_t n : {int64_t(1), int64_t(1000), int64_t((10 << 20) + 3)}) {
      Tensor h = arange(rt, n, cpu_, 0.5f, 1.0f);
      const auto want = to_host(h);
      for (bool nb : {false, true}) {
        Tensor dev = copy(h, d_, nb);
        QCOMPARE(dev.device(), d_);
        Tensor again = copy(dev, d_, nb);
        QVERIFY2(!again.is_same(dev), "a copy on the same device is new storage");
        Tensor back = copy(again, cpu_, nb);
        QCOMPARE(back.device(), cpu_);
        QVERIFY2(to_host(back) == want, qPrintable(QString("n=%1 non_blocking=%2: round trip differs").arg(n).arg(nb)));
        QVERIFY2(to_host(again) == want, qPrintable(QString("n=%1 non_blocking=%2: same-device copy differs").arg(n).arg(nb)));
      }
    }
    QCOMPARE(to_host(from_values(rt, {3}, d_, {1.0f, -2.0f, 3.5f})), (std::vector<float>{1.0f, -2.0f, 3.5f}));
    Tensor x = to(full(rt, {4}, cpu_, 1.0f), d_);
    QVERIFY(to(x, d_).is_same(x));
  }

  void copies_from_another_cpu_device() {
    Runtime rt({.cpu_devices = 2});
    Tensor h = arange(rt, 1 << 16, Device::cpu(1));
    QCOMPARE(to_host(copy(copy(h, d_, true), Device::cpu(1), true)), to_host(h));
  }

  void ops_on_two_devices_fail_with_pytorchs_message() {
    Runtime rt({.cpu_devices = 2});
    const Device other = d_.is_cuda() ? Device::cpu() : Device::cpu(1);
    try {
      add(ones(rt, {2}, d_), ones(rt, {2}, other));
      QFAIL("expected DeviceMismatchError");
    } catch (const DeviceMismatchError& e) {
      QCOMPARE(QString(e.what()), QString::fromStdString("Expected all tensors to be on the same device, but "
                                                         "found at least two devices, " +
                                                         d_.str() + " and " + other.str() + "!"));
    }
  }

  // --- memory: statistics, cache, lazy allocation, limits -------------------------------------------------

  // Counted when an op writes the tensors (zeros, then wait), not when they are made; a freed block of the
  // same size is served from the cache; empty_cache() gives the cache back.
  void allocator_statistics_and_cache() {
    Runtime rt;
    Allocator& al = rt.allocator(d_);
    const MemoryStats s0 = al.stats();
    const int64_t mib4 = 4 << 20;
    MemoryStats s1, s2;
    {
      Tensor a = zeros(rt, {1 << 20}, d_), b = zeros(rt, {1 << 20}, d_);  // 4 MiB each
      rt.engine().wait_all();
      s1 = al.stats();
    }
    {
      Tensor c = zeros(rt, {1 << 20}, d_);  // from the cache
      rt.engine().wait_all();
      s2 = al.stats();
    }
    const MemoryStats s3 = al.stats();
    QCOMPARE(s1.allocated_bytes.current - s0.allocated_bytes.current, 2 * mib4);
    QVERIFY(s1.reserved_bytes.current >= s1.allocated_bytes.current);
    QCOMPARE(s2.reserved_bytes.current, s1.reserved_bytes.current);  // no new memory from the system
    QCOMPARE(s3.allocated_bytes.current, s0.allocated_bytes.current);  // nothing leaked
    QCOMPARE(s3.allocated_bytes.peak - s0.allocated_bytes.current, 2 * mib4);
    QCOMPARE(s3.allocated_bytes.allocated - s0.allocated_bytes.allocated, 3 * mib4);
    QCOMPARE(s3.allocated_bytes.freed - s0.allocated_bytes.freed, 3 * mib4);
    QCOMPARE(s3.num_allocs - s0.num_allocs, int64_t(3));
    al.empty_cache();
    QCOMPARE(al.stats().reserved_bytes.current, s0.reserved_bytes.current);
    // Small blocks cost little reserve: a pool of shared segments on CUDA, malloc on the CPU.
    {
      std::vector<Tensor> small;
      for (int i = 0; i < 100; ++i) small.push_back(zeros(rt, {100}, d_));
      rt.engine().wait_all();
      QCOMPARE(al.stats().allocated_bytes.current - s0.allocated_bytes.current >= 100 * 400, true);
      QVERIFY2(al.stats().reserved_bytes.current <= (2 << 20),
               qPrintable(QString("100 small tensors reserved %1 bytes").arg(al.stats().reserved_bytes.current)));
    }
    QVERIFY(!rt.profiler().memory_samples().empty());
  }

  void a_tensor_holds_no_memory_until_an_op_writes_it() {
    Runtime rt;
    const MemoryStats s0 = rt.memory_stats(d_);
    {
      Tensor made(rt, {1 << 20}, d_);
      rt.engine().wait_all();
      QCOMPARE(rt.memory_stats(d_).allocated_bytes.current, s0.allocated_bytes.current);
      QCOMPARE(rt.memory_stats(d_).num_allocs, s0.num_allocs);
    }
    QCOMPARE(rt.memory_stats(d_).allocated_bytes.allocated, s0.allocated_bytes.allocated);
  }

  // Ops queued behind a slow one hold no memory: it is taken when an op runs.
  void memory_is_taken_when_the_op_runs_not_when_it_is_queued() {
    Runtime rt;
    std::atomic<bool> release{false};
    Tensor gate = zeros(rt, {1}, d_);
    rt.engine().wait_all();
    const int64_t before = rt.memory_stats(d_).allocated_bytes.current;
    // Holds the device's compute stream until released.
    rt.engine().push(
        [&](OpContext&) {
          while (!release.load()) std::this_thread::sleep_for(1ms);
        },
        {}, {gate.var()}, d_, StreamKind::Compute, {"hold", "", 0, 0});
    Tensor queued = ones(rt, {1 << 20}, d_);  // 4 MiB, behind the held op
    std::this_thread::sleep_for(20ms);
    QCOMPARE(rt.memory_stats(d_).allocated_bytes.current, before);
    release = true;
    QCOMPARE(to_host(queued)[12345], 1.0f);
    QCOMPARE(rt.memory_stats(d_).allocated_bytes.current - before, int64_t(4 << 20));
  }

  // A request that fits the limit alone is queued; it fails when it runs with too much held, as that op's
  // error, rethrown where the tensor is read and by wait_all(). The cache is given back before a later
  // request fails.
  void out_of_memory_under_a_limit_then_the_cache_is_released() {
    const int64_t limit = 64 << 20;
    Runtime rt({.memory_limits = {{d_, limit}}});
    {
      Tensor held = zeros(rt, {4 << 20}, d_);     // 16 MiB
      Tensor more = zeros(rt, {16 << 20}, d_);    // 64 MiB: the whole limit, so not refused when made
      try {
        (void)to_host(more);
        QFAIL("no OutOfMemoryError under a 64 MiB limit");
      } catch (const OutOfMemoryError& e) {
        const QString msg = e.what();
        QVERIFY2(msg.contains(QString::fromStdString(d_.str())) && msg.contains("64.00 MiB") &&
                     msg.contains("free") && msg.contains("cached") && msg.contains("memory_limit"),
                 e.what());
        QCOMPARE(e.requested, limit);
        QCOMPARE(e.limit, limit);
        QCOMPARE(e.device, d_);
      }
      QVERIFY_THROWS_EXCEPTION(OutOfMemoryError, rt.engine().wait_all());
      QCOMPARE(rt.memory_stats(d_).num_ooms, int64_t(1));
      QCOMPARE(to_host(held).size(), size_t(4 << 20));  // the runtime is still usable
    }
    rt.engine().wait_all();
    // The 16 MiB block is cached now; 56 MiB more needs it given back first.
    Tensor c = zeros(rt, {14 << 20}, d_);
    QCOMPARE(item(sum(c)), 0.0f);
    QCOMPARE(rt.memory_stats(d_).num_ooms, int64_t(1));
  }

  // A size that could never fit is refused where the tensor is made, before anything is queued.
  void a_tensor_larger_than_the_limit_is_refused_at_once() {
    Runtime rt({.memory_limits = {{d_, 1 << 20}}});
    const size_t queued = rt.engine().pending();
    QVERIFY_THROWS_EXCEPTION(OutOfMemoryError, zeros(rt, {(1 << 18) + 1}, d_));
    QCOMPARE(rt.engine().pending(), queued);
    QCOMPARE(rt.memory_stats(d_).num_allocs, int64_t(0));
  }

  // More than the device has (the card's memory, the machine's for a CPU): a clean error where the tensor is
  // made, never an abort, and the device works after it.
  void more_than_the_device_has_is_refused_at_once() {
    Runtime rt;
    const int64_t too_many = rt.info(d_).total_memory / 4 * 2;
    try {
      Tensor huge(rt, {too_many}, d_);
      QFAIL(qPrintable("no OutOfMemoryError for " + QString::fromStdString(format_bytes(too_many * 4))));
    } catch (const OutOfMemoryError& e) {
      QCOMPARE(e.requested, too_many * 4);
      QVERIFY2(QString(e.what()).contains(QString::fromStdString(d_.str())), e.what());
    }
    QCOMPARE(rt.memory_stats(d_).num_allocs, int64_t(0));
    QCOMPARE(item(sum(ones(rt, {10}, d_))), 10.0f);
  }

  // --- the engine and the profiler ------------------------------------------------------------------------

  void the_profiler_times_ops_on_the_device() {
    Runtime rt;
    const size_t from = rt.profiler().span_count();
    Tensor a = uniform(rt, {1024, 1024}, d_, 1);
    Tensor c = matmul(a, a);
    rt.engine().wait_all();
    bool found = false;
    for (const Span& s : rt.profiler().spans(from))
      if (s.name == "matmul" && s.device == d_) {
        found = true;
        QVERIFY2(s.end_us > s.start_us && s.start_us > 0,
                 qPrintable(QString("span %1..%2").arg(s.start_us).arg(s.end_us)));
        QVERIFY2(s.end_us <= rt.profiler().now_us() + 1000, "a span ends in the future");
      }
    QVERIFY2(found, "no matmul span on the device");
  }

  // Cancel drops what is queued: seconds of products end within a second, and nothing leaks.
  void cancel_drops_a_long_queue_quickly() {
    Runtime rt;
    // Each product short against the second allowed (what runs finishes), the queue many seconds long: 1.1
    // TFLOP each on a GPU, 6.75 GFLOP on a CPU.
    const int64_t size = d_.is_cuda() ? 8192 : 1500, repeat = d_.is_cuda() ? 40 : 200;
    Tensor x = uniform(rt, {size, size}, d_, 1);
    rt.engine().wait_all();
    auto ys = matmul_repeat(x, x, repeat);
    std::this_thread::sleep_for(200ms);
    const auto t0 = std::chrono::steady_clock::now();
    rt.engine().cancel();
    QVERIFY_THROWS_EXCEPTION(CancelledError, rt.engine().wait_all());
    const auto waited = std::chrono::steady_clock::now() - t0;
    QVERIFY2(waited < 1s, qPrintable(QString("cancel took %1 s").arg(std::chrono::duration<double>(waited).count())));
    QVERIFY_THROWS_EXCEPTION(CancelledError, to_host(ys.back()));
    ys.clear();
    x = Tensor();
    rt.engine().reset_cancel();
    rt.engine().wait_all();
    QCOMPARE(rt.memory_stats(d_).allocated_bytes.current, int64_t(0));  // nothing leaked
    QCOMPARE(item(sum(ones(rt, {4}, d_))), 4.0f);                       // usable again
  }

  // --- the layer ops: the device against the CPU on the same inputs, and against float64 -----------------

  void grouped_conv2d_without_bias_forward_and_backward() {
    Runtime rt;
    struct Case {
      int64_t n, c, h, w, k, r, stride, pad, groups;
    };
    // groups 2; depthwise (groups == C) with a channel multiplier of 2 and stride 2; groups 3 with a 1x1.
    for (const Case& cs : {Case{2, 6, 9, 9, 4, 3, 1, 1, 2}, Case{3, 8, 11, 10, 16, 3, 2, 1, 8},
                           Case{2, 9, 7, 7, 6, 1, 1, 0, 3}}) {
      const nn::Conv2dOptions o{.stride = cs.stride, .padding = cs.pad, .groups = cs.groups};
      Tensor xc = uniform(rt, {cs.n, cs.c, cs.h, cs.w}, cpu_, 31, -1, 1);
      Tensor wc = uniform(rt, {cs.k, cs.c / cs.groups, cs.r, cs.r}, cpu_, 32, -1, 1);
      Tensor xd = to(xc, d_), wd = to(wc, d_);
      Tensor yc = nn::conv2d(xc, wc, Tensor(), o), yd = nn::conv2d(xd, wd, Tensor(), o);
      const QString what = QString("conv2d groups=%1 k=%2 stride=%3").arg(cs.groups).arg(cs.r).arg(cs.stride);
      EXPECT_MATCHES_CPU(what, yc, yd, d_, 1e-4);
      // Against float64 too, which pins the grouping (output channel k sees its group's inputs).
      const int64_t oh = (cs.h + 2 * cs.pad - cs.r) / cs.stride + 1,
                    ow = (cs.w + 2 * cs.pad - cs.r) / cs.stride + 1;
      QCOMPARE(yd.shape(), (Shape{cs.n, cs.k, oh, ow}));
      const auto ref = check::conv2d_ref(to_host(xc), to_host(wc), cs.n, cs.c, cs.h, cs.w, cs.k, cs.r, cs.r,
                                         cs.stride, cs.pad, cs.groups, oh, ow);
      const double err = max_rel_err(ref, to_host(yd));
      QVERIFY2(err <= 1e-4, qPrintable(what + QString(": differs from float64 by %1").arg(err)));
      // Backward without a bias gradient: db stays undefined on both devices.
      Tensor dyc = uniform(rt, yc.shape(), cpu_, 33, -1, 1), dyd = to(dyc, d_);
      const nn::Conv2dGrads gc = nn::conv2d_backward(xc, wc, dyc, o, true, false);
      const nn::Conv2dGrads gd = nn::conv2d_backward(xd, wd, dyd, o, true, false);
      QVERIFY(!gd.db.defined() && !gc.db.defined());
      EXPECT_MATCHES_CPU(what + " dx", gc.dx, gd.dx, d_, 1e-4);
      EXPECT_MATCHES_CPU(what + " dw", gc.dw, gd.dw, d_, 1e-4);
    }
  }

  void tanh_and_gelu_forward_and_backward() {
    Runtime rt;
    const int64_t n = 100003;
    Tensor xc = uniform(rt, {n}, cpu_, 41, -5, 5), dyc = uniform(rt, {n}, cpu_, 42, -1, 1);
    Tensor xd = to(xc, d_), dyd = to(dyc, d_);
    const auto xv = to_host(xc);
    for (nn::Activation kind : {nn::Activation::Tanh, nn::Activation::Gelu}) {
      const QString name = nn::activation_name(kind);
      Tensor yc = nn::activation(kind, xc), yd = nn::activation(kind, xd);
      // Floored at 0.1: GELU's 1 + erf(x / sqrt 2) cancels for x << 0 (in PyTorch's kernel too), which leaves
      // absolute errors near 1e-7 on values near 0.
      EXPECT_MATCHES_CPU(name, yc, yd, d_, 1e-5, 0.1);
      // float64: tanh, and GELU's exact form x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2.
      std::vector<double> ref(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) {
        const double x = xv[i];
        ref[i] = kind == nn::Activation::Tanh ? std::tanh(x) : 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
      }
      const double err = max_rel_err(ref, to_host(yd), 0.1);
      QVERIFY2(err <= 1e-5, qPrintable(name + QString(": differs from float64 by %1").arg(err)));
      // tanh' follows from y, GELU's from x: pass what each needs.
      EXPECT_MATCHES_CPU(name + " backward", nn::activation_backward(kind, xc, yc, dyc),
                         nn::activation_backward(kind, xd, yd, dyd), d_, 1e-5, 0.1);
    }
  }

  void dropout_mask_and_values_are_the_cpus() {
    Runtime rt;
    const int64_t n = (1 << 20) + 7;
    Tensor xc = uniform(rt, {n}, cpu_, 51, -2, 2), xd = to(xc, d_);
    for (float p : {0.1f, 0.5f, 0.9f}) {
      const nn::DropoutResult rc = nn::dropout(xc, p, 1234), rd = nn::dropout(xd, p, 1234);
      const auto mc = to_host(rc.mask), md = to_host(rd.mask);
      QCOMPARE(bits_differ(mc, md), int64_t(0));
      QCOMPARE(bits_differ(to_host(rc.y), to_host(rd.y)), int64_t(0));
      int64_t kept = 0, bad_value = 0;
      const float scale = 1.0f / (1.0f - p);
      for (float m : md) {
        kept += m != 0.0f;
        bad_value += !(m == 0.0f || same_bits(m, scale));
      }
      const double frac = double(kept) / double(n);
      QVERIFY2(std::abs(frac - (1.0 - p)) < 0.005, qPrintable(QString("p=%1: kept %2").arg(p).arg(frac)));
      QCOMPARE(bad_value, int64_t(0));  // each mask value is 0 or 1/(1-p)
      Tensor dyc = uniform(rt, {n}, cpu_, 52, -1, 1);
      QCOMPARE(bits_differ(to_host(nn::dropout_backward(dyc, rc.mask)),
                           to_host(nn::dropout_backward(to(dyc, d_), rd.mask))),
               int64_t(0));
    }
    QVERIFY(to_host(nn::dropout(xd, 0.5f, 1).mask) != to_host(nn::dropout(xd, 0.5f, 2).mask));
  }

  void concat_and_split_channels() {
    Runtime rt;
    for (const auto& [sa, sb] :
         {std::pair<Shape, Shape>{{3, 2, 5, 7}, {3, 4, 5, 7}}, std::pair<Shape, Shape>{{17, 3}, {17, 29}},
          std::pair<Shape, Shape>{{2, 0, 4, 4}, {2, 5, 4, 4}}}) {
      Tensor ac = uniform(rt, sa, cpu_, 61, -1, 1), bc = uniform(rt, sb, cpu_, 62, -1, 1);
      Tensor y = nn::concat_channels(to(ac, d_), to(bc, d_));
      QCOMPARE(y.device(), d_);
      // Per sample: a's channels, then b's.
      const auto av = to_host(ac), bv = to_host(bc);
      std::vector<float> want;
      const int64_t n = sa[0], ar = n ? int64_t(av.size()) / n : 0, br = n ? int64_t(bv.size()) / n : 0;
      for (int64_t i = 0; i < n; ++i) {
        want.insert(want.end(), av.begin() + i * ar, av.begin() + (i + 1) * ar);
        want.insert(want.end(), bv.begin() + i * br, bv.begin() + (i + 1) * br);
      }
      QCOMPARE(bits_differ(to_host(y), want), int64_t(0));
      auto [da, db] = nn::split_channels(y, sa[1]);
      QCOMPARE(da.shape(), sa);
      QCOMPARE(db.shape(), sb);
      QCOMPARE(da.device(), d_);
      QCOMPARE(bits_differ(to_host(da), av), int64_t(0));
      QCOMPARE(bits_differ(to_host(db), bv), int64_t(0));
    }
  }

  void batchnorm_on_features_train_eval_and_backward() {
    Runtime rt;
    const int64_t n = 64, c = 10;
    // Features with different means and spreads.
    std::vector<float> xv(size_t(n * c));
    const auto u = to_host(uniform(rt, {n * c}, cpu_, 71, -1, 1));
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < c; ++j) xv[i * c + j] = float(j - 4) + float(j + 1) * 0.5f * u[i * c + j];
    Tensor xc = from_values(rt, {n, c}, cpu_, xv), xd = to(xc, d_);
    Tensor gamma = uniform(rt, {c}, cpu_, 72, 0.5f, 1.5f), beta = uniform(rt, {c}, cpu_, 73, -1, 1);
    Tensor gd = to(gamma, d_), bd = to(beta, d_);
    // Running statistics of their own on each device (to() on the CPU would share them).
    Tensor rmc = zeros(rt, {c}, cpu_), rvc = ones(rt, {c}, cpu_), rmd = zeros(rt, {c}, d_), rvd = ones(rt, {c}, d_);
    const nn::BatchNormOptions train{.training = true, .momentum = 0.1f, .eps = 1e-5f};
    const nn::BatchNormResult tc = nn::batchnorm2d(xc, gamma, beta, rmc, rvc, train);
    const nn::BatchNormResult td = nn::batchnorm2d(xd, gd, bd, rmd, rvd, train);
    EXPECT_MATCHES_CPU("y (train)", tc.y, td.y, d_, 1e-4);
    EXPECT_MATCHES_CPU("save_mean", tc.save_mean, td.save_mean, d_, 1e-5);
    EXPECT_MATCHES_CPU("save_invstd", tc.save_invstd, td.save_invstd, d_, 1e-4);
    EXPECT_MATCHES_CPU("running_mean", rmc, rmd, d_, 1e-5);
    EXPECT_MATCHES_CPU("running_var", rvc, rvd, d_, 1e-4);
    // float64: batch mean and biased variance per feature; running = 0.9 * running + 0.1 * batch (unbiased).
    const auto gv = to_host(gamma), bv = to_host(beta), yv = to_host(td.y), rm = to_host(rmd), rv = to_host(rvd);
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
    QVERIFY2(worst_y <= 1e-4, qPrintable(QString("y differs from float64 by %1").arg(worst_y)));
    QVERIFY2(worst_r <= 1e-4, qPrintable(QString("running statistics differ from float64 by %1").arg(worst_r)));
    // The training-mode gradient.
    Tensor dyc = uniform(rt, {n, c}, cpu_, 74, -1, 1);
    const nn::BatchNormGrads bc = nn::batchnorm2d_backward(xc, dyc, gamma, tc.save_mean, tc.save_invstd);
    const nn::BatchNormGrads bdg = nn::batchnorm2d_backward(xd, to(dyc, d_), gd, td.save_mean, td.save_invstd);
    EXPECT_MATCHES_CPU("dx", bc.dx, bdg.dx, d_, 1e-3);
    EXPECT_MATCHES_CPU("dgamma", bc.dgamma, bdg.dgamma, d_, 1e-4);
    EXPECT_MATCHES_CPU("dbeta", bc.dbeta, bdg.dbeta, d_, 1e-4);
    // Eval: the running statistics, unchanged by the call.
    const nn::BatchNormOptions eval{.training = false};
    const nn::BatchNormResult ec = nn::batchnorm2d(xc, gamma, beta, rmc, rvc, eval);
    const nn::BatchNormResult ed = nn::batchnorm2d(xd, gd, bd, rmd, rvd, eval);
    EXPECT_MATCHES_CPU("y (eval)", ec.y, ed.y, d_, 1e-5);
    QVERIFY(to_host(rmd) == rm && to_host(rvd) == rv);
    QVERIFY(!ed.save_mean.defined());
  }
};

QTEST_GUILESS_MAIN(DeviceTest)
#include "test_device.moc"
