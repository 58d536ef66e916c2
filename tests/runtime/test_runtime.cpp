// Runtime values against float64 references, copy semantics, errors and the CPU allocator's own cache (CPU
// devices). What every device must do alike (allocator statistics, lazy allocation, out-of-memory under a
// limit, refusals at creation) is one body per check in test_device.cpp, run on the CPU and on cuda:0.
#include <QtTest>
#include <cmath>
#include <random>

#include "gpunodes/errors.h"
#include "gpunodes/ops.h"
#include "gpunodes/random.h"

using namespace gn;

namespace {

// Fresh inputs each run, from a seed printed on failure.
std::vector<float> random_values(size_t n, std::mt19937& rng) {
  std::uniform_real_distribution<float> dist(-1, 1);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// op(A)[m,k] * op(B)[k,n] in double, row-major.
std::vector<double> reference_gemm(const std::vector<float>& a, const std::vector<float>& b, bool ta, bool tb,
                                   int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t p = 0; p < k; ++p) {
        double av = ta ? a[p * m + i] : a[i * k + p];
        double bv = tb ? b[j * k + p] : b[p * n + j];
        acc += av * bv;
      }
      c[i * n + j] = acc;
    }
  return c;
}

}  // namespace

class RuntimeTest : public QObject {
  Q_OBJECT
  std::mt19937 rng_{std::random_device{}()};

 private slots:
  void matmul_matches_float64_data() {
    QTest::addColumn<int>("m");
    QTest::addColumn<int>("n");
    QTest::addColumn<int>("k");
    QTest::addColumn<bool>("ta");
    QTest::addColumn<bool>("tb");
    QTest::newRow("square") << 64 << 64 << 64 << false << false;
    QTest::newRow("non-square") << 37 << 91 << 53 << false << false;
    QTest::newRow("A^T") << 40 << 30 << 20 << true << false;
    QTest::newRow("B^T") << 40 << 30 << 20 << false << true;
    QTest::newRow("A^T B^T") << 17 << 29 << 41 << true << true;
    QTest::newRow("tall, chunked") << 1300 << 8 << 700 << false << false;
    // The rows above but the last are small products (OpenBLAS's path); these take oneDNN's, past 2 * 128^3.
    QTest::newRow("large A^T") << 150 << 130 << 170 << true << false;
    QTest::newRow("large B^T") << 170 << 150 << 130 << false << true;
    QTest::newRow("large A^T B^T") << 160 << 150 << 140 << true << true;
  }
  void matmul_matches_float64() {
    QFETCH(int, m);
    QFETCH(int, n);
    QFETCH(int, k);
    QFETCH(bool, ta);
    QFETCH(bool, tb);
    Runtime rt;
    auto av = random_values(static_cast<size_t>(m) * k, rng_);
    auto bv = random_values(static_cast<size_t>(k) * n, rng_);
    Shape as = ta ? Shape{k, m} : Shape{m, k};
    Shape bs = tb ? Shape{n, k} : Shape{k, n};
    Tensor a = from_values(rt, as, Device::cpu(), av), b = from_values(rt, bs, Device::cpu(), bv);
    Tensor c = matmul(a, b, {ta, tb});
    QCOMPARE(c.shape(), (Shape{m, n}));
    auto got = to_host(c);
    auto want = reference_gemm(av, bv, ta, tb, m, n, k);
    for (size_t i = 0; i < want.size(); ++i)
      QVERIFY2(std::abs(got[i] - want[i]) <= 1e-4 * k,
               qPrintable(QString("element %1: %2 vs %3").arg(i).arg(got[i]).arg(want[i])));
  }

  void matmul_repeat_returns_a_batch() {
    Runtime rt;
    Tensor x = uniform(rt, {8, 8}, Device::cpu(), 3);
    auto ys = matmul_repeat(x, x, 5);
    QCOMPARE(ys.size(), size_t(5));
    QVERIFY(!ys[0].is_same(ys[1]));
    QCOMPARE(to_host(ys[0]), to_host(ys[4]));
  }

  void matmul_shape_mismatch_is_clear() {
    Runtime rt;
    Tensor a = zeros(rt, {2, 3}, Device::cpu()), b = zeros(rt, {4, 5}, Device::cpu());
    try {
      matmul(a, b);
      QFAIL("expected ShapeError");
    } catch (const ShapeError& e) {
      QVERIFY2(QString(e.what()).contains("[2, 3] and [4, 5]"), e.what());
    }
  }

  void elementwise_matches_float64() {
    Runtime rt;
    const int n = 100000;  // above the OpenMP threshold
    auto av = random_values(n, rng_), bv = random_values(n, rng_);
    for (auto& v : bv) v += v >= 0 ? 0.5f : -0.5f;  // keep division well away from zero
    Tensor a = from_values(rt, {n}, Device::cpu(), av), b = from_values(rt, {n}, Device::cpu(), bv);
    auto add_ = to_host(add(a, b)), sub_ = to_host(sub(a, b)), mul_ = to_host(mul(a, b)),
         div_ = to_host(div(a, b));
    auto exp_ = to_host(gn::exp(a)), relu_ = to_host(relu(a)), ss = to_host(scale_shift(a, 2.5f, -1.0f));
    for (int i = 0; i < n; ++i) {
      double x = av[i], y = bv[i];
      QCOMPARE_LE(std::abs(add_[i] - (x + y)), 1e-6);
      QCOMPARE_LE(std::abs(sub_[i] - (x - y)), 1e-6);
      QCOMPARE_LE(std::abs(mul_[i] - (x * y)), 1e-6);
      QCOMPARE_LE(std::abs(div_[i] - (x / y)), 1e-5);
      QCOMPARE_LE(std::abs(exp_[i] - std::exp(x)), 1e-5 * std::exp(x));
      QCOMPARE(relu_[i], x > 0 ? av[i] : 0.0f);
      QCOMPARE_LE(std::abs(ss[i] - (2.5 * x - 1.0)), 1e-5);
    }
  }

  void sum_and_norm_match_float64() {
    Runtime rt;
    const int n = 300001;
    auto v = random_values(n, rng_);
    double s = 0, sq = 0;
    for (float x : v) s += x, sq += double(x) * x;
    Tensor t = from_values(rt, {n}, Device::cpu(), v);
    QCOMPARE(sum(t).shape(), Shape{});
    QCOMPARE_LE(std::abs(item(sum(t)) - s), 1e-3);
    QCOMPARE_LE(std::abs(item(frobenius_norm(t)) - std::sqrt(sq)), 1e-3);
  }

  void factories() {
    Runtime rt;
    QCOMPARE(to_host(ones(rt, {3}, Device::cpu())), (std::vector<float>{1, 1, 1}));
    QCOMPARE(to_host(zeros(rt, {2}, Device::cpu())), (std::vector<float>{0, 0}));
    QCOMPARE(to_host(arange(rt, 4, Device::cpu(), 1, 0.5f)), (std::vector<float>{1, 1.5f, 2, 2.5f}));
    auto u = to_host(uniform(rt, {10000}, Device::cpu(), 42, -2, 3));
    double mean = 0;
    for (float x : u) {
      QVERIFY(x > -2 && x <= 3);
      mean += x / u.size();
    }
    QCOMPARE_LE(std::abs(mean - 0.5), 0.05);
    auto g = to_host(normal(rt, {20000}, Device::cpu(), 42, 1, 2));
    double gm = 0, gv = 0;
    for (float x : g) gm += x / g.size();
    for (float x : g) gv += (x - gm) * (x - gm) / g.size();
    QCOMPARE_LE(std::abs(gm - 1), 0.05);
    QCOMPARE_LE(std::abs(std::sqrt(gv) - 2), 0.05);
    QVERIFY_THROWS_EXCEPTION(ShapeError, from_values(rt, {2, 2}, Device::cpu(), {1, 2, 3}));
  }

  void fills_are_philox_element_by_element() {
    // Philox4x32-10's published known answer (Random123's kat_vectors: counter 0, key 0), so that the
    // generator itself is checked, not only against itself.
    const philox::U32x4 kat = philox::philox4x32_10(0, 0);
    QCOMPARE(kat.v[0], 0x6627e8d5u);
    QCOMPARE(kat.v[1], 0xe169c58du);
    QCOMPARE(kat.v[2], 0xbc57ac4cu);
    QCOMPARE(kat.v[3], 0x9b00dbd8u);
    // The CPU fills whole blocks at once: every element, the partial last block included (sizes that are
    // not multiples of 4 or 2, above and below the parallel threshold), is the element-wise definition that
    // the CUDA kernels compute, and element 0 of seed 0 is the known answer's first lane.
    Runtime rt;
    const float first = static_cast<float>((0x6627e8d5u >> 8) + 1) / 16777216.0f;
    QVERIFY(to_host(uniform(rt, {1}, Device::cpu(), 0))[0] == first);
    for (int64_t n : {1, 2, 3, 5, 1001, 4099, 262147}) {
      const auto u = to_host(uniform(rt, {n}, Device::cpu(), 9, -2, 3));
      const auto g = to_host(normal(rt, {n}, Device::cpu(), 9, 1, 2));
      int64_t differ = 0;  // bit for bit, not QCOMPARE's fuzzy float compare
      for (int64_t i = 0; i < n; ++i)
        differ += u[i] != philox::uniform_at(9, static_cast<uint64_t>(i), -2, 3) ||
                  g[i] != philox::normal_at(9, static_cast<uint64_t>(i), 1, 2);
      QCOMPARE(differ, int64_t(0));
    }
  }

  void same_seed_same_values_on_every_device() {
    Runtime rt({.cpu_devices = 2});
    QCOMPARE(to_host(uniform(rt, {1001}, Device::cpu(0), 7)),
             to_host(uniform(rt, {1001}, Device::cpu(1), 7)));
    QCOMPARE(to_host(normal(rt, {1001}, Device::cpu(0), 7)), to_host(normal(rt, {1001}, Device::cpu(1), 7)));
    QVERIFY(to_host(uniform(rt, {16}, Device::cpu(0), 7)) != to_host(uniform(rt, {16}, Device::cpu(0), 8)));
  }

  void copy_allocates_and_to_returns_same() {
    Runtime rt({.cpu_devices = 2});
    Tensor x = arange(rt, 6, Device::cpu(0));
    for (bool non_blocking : {false, true}) {
      Tensor z = copy(x, Device::cpu(1), non_blocking);
      QCOMPARE(z.device(), Device::cpu(1));
      QVERIFY(!z.is_same(x));
      QCOMPARE(to_host(z), to_host(x));
      Tensor same_device = copy(x, Device::cpu(0), non_blocking);  // copyto always allocates
      QVERIFY(!same_device.is_same(x));
    }
    QVERIFY(to(x, Device::cpu(0)).is_same(x));
    Tensor moved = to(x, Device::cpu(1));
    QVERIFY(!moved.is_same(x));
    QVERIFY(to(moved, Device::cpu(1)).is_same(moved));
  }

  void device_mismatch_message_is_exact() {
    Runtime rt({.cpu_devices = 2});
    Tensor a = ones(rt, {2}, Device::cpu(1)), b = ones(rt, {2}, Device::cpu(0));
    try {
      add(a, b);
      QFAIL("expected DeviceMismatchError");
    } catch (const DeviceMismatchError& e) {
      QCOMPARE(QString(e.what()),
               QString("Expected all tensors to be on the same device, but found at least two "
                       "devices, cpu:1 and cpu!"));
    }
    QVERIFY_THROWS_EXCEPTION(DeviceMismatchError,
                             matmul(ones(rt, {2, 2}, Device::cpu(0)), ones(rt, {2, 2}, Device::cpu(1))));
  }

  // Blocks of 64 KiB and more are kept when freed and handed out again for the same size; reserved_bytes
  // counts what is kept, and empty_cache() gives it back.
  void the_cpu_allocator_keeps_large_blocks_for_reuse() {
    Runtime rt;
    Allocator& a = rt.allocator(Device::cpu());
    const int64_t allocated = a.stats().allocated_bytes.current, reserved = a.stats().reserved_bytes.current;
    void* big = a.allocate(1 << 20, StreamKind::Compute);
    a.deallocate(big);
    QCOMPARE(a.stats().allocated_bytes.current, allocated);
    QCOMPARE(a.stats().reserved_bytes.current - reserved, int64_t(1 << 20));
    void* again = a.allocate(1 << 20, StreamKind::Compute);
    QCOMPARE(again, big);
    QCOMPARE(reinterpret_cast<uintptr_t>(again) % 64, uintptr_t(0));
    QCOMPARE(a.stats().reserved_bytes.current - reserved, int64_t(1 << 20));  // nothing new from the system
    a.deallocate(again);
    void* small = a.allocate(1024, StreamKind::Compute);  // small blocks go straight back to malloc
    a.deallocate(small);
    QCOMPARE(a.stats().reserved_bytes.current - reserved, int64_t(1 << 20));
    a.empty_cache();
    QCOMPARE(a.stats().reserved_bytes.current, reserved);
    QCOMPARE(a.stats().allocated_bytes.current, allocated);
  }

  // Under a limit, what is kept never pushes what is held past it: a request that needs fresh memory
  // first gives the kept blocks back.
  void kept_blocks_make_room_under_a_limit() {
    const int64_t limit = 3 << 20;
    Runtime rt({.memory_limits = {{Device::cpu(), limit}}});
    Allocator& a = rt.allocator(Device::cpu());
    void* p = a.allocate(2 << 20, StreamKind::Compute);
    a.deallocate(p);
    QCOMPARE(a.stats().reserved_bytes.current, int64_t(2 << 20));
    void* q = a.allocate((2 << 20) + 4096, StreamKind::Compute);  // another size: the kept block cannot serve
    QVERIFY(a.stats().reserved_bytes.current <= limit);
    QCOMPARE(a.stats().reserved_bytes.current, int64_t((2 << 20) + 4096));
    a.deallocate(q);
  }

  void overflowing_shape_is_refused_before_allocation() {
    Runtime rt;
    auto before = rt.memory_stats(Device::cpu()).num_allocs;
    QVERIFY_THROWS_EXCEPTION(ShapeError, zeros(rt, {int64_t(1) << 40, int64_t(1) << 40}, Device::cpu()));
    QVERIFY_THROWS_EXCEPTION(ShapeError, zeros(rt, {3, -1}, Device::cpu()));
    QCOMPARE(rt.memory_stats(Device::cpu()).num_allocs, before);
  }

  void devices_and_try_gpu() {
    Runtime rt({.cpu_devices = 2, .use_cuda = false});
    QCOMPARE(rt.cuda_device_count(), 0);
    QCOMPARE(rt.try_gpu(0), Device::cpu(0));
    QCOMPARE(rt.try_gpu(1), Device::cpu(1));
    QCOMPARE(rt.try_gpu(10), Device::cpu(0));  // gpu i -> cpu (i mod N)
    QVERIFY(rt.is_fallback(10));
    QCOMPARE(rt.try_all_gpus(), (std::vector<Device>{Device::cpu(0), Device::cpu(1)}));
    const DeviceInfo& info = rt.info(Device::cpu(1));
    QVERIFY(info.cores >= 1);
    QVERIFY(info.total_memory > 0);
    QVERIFY(info.peak_gflops > 0);
    QVERIFY(!info.peak_source.empty());
    QCOMPARE(Device::parse("cuda:3"), std::optional<Device>(Device::cuda(3)));
    QCOMPARE(Device::parse("cpu"), std::optional<Device>(Device::cpu(0)));
    QCOMPARE(Device::parse("cpu:x"), std::nullopt);
    QCOMPARE(Device::cpu(0).str(), std::string("cpu"));
    QCOMPARE(Device::cpu(1).str(), std::string("cpu:1"));
    // A real machine: the runtime with CUDA enabled must not fail just because there is no GPU.
    Runtime with_cuda;
    QVERIFY(with_cuda.devices().size() >= 1);
  }
};

QTEST_GUILESS_MAIN(RuntimeTest)
#include "test_runtime.moc"
