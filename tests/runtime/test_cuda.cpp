// CUDA ops through the public API against float64 references. Skipped when there is no GPU.
#include <QtTest>

#include <cmath>

#include "gpunodes/errors.h"
#include "gpunodes/ops.h"

using namespace gn;

class CudaTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>();
    if (rt_->cuda_device_count() == 0) QSKIP("no CUDA device (or no driver): CUDA tests skipped");
  }

  void matmul_against_cpu_float64() {
    Device g = Device::cuda(0);
    for (auto [m, n, k, ta, tb] : {std::tuple{64, 64, 64, false, false}, {37, 91, 53, true, false},
                                   {129, 65, 33, false, true}, {17, 29, 41, true, true}}) {
      Shape as = ta ? Shape{k, m} : Shape{m, k}, bs = tb ? Shape{n, k} : Shape{k, n};
      Tensor a = uniform(*rt_, as, g, 1, -1, 1), b = uniform(*rt_, bs, g, 2, -1, 1);
      auto av = to_host(a), bv = to_host(b), got = to_host(matmul(a, b, {ta, tb}));
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j) {
          double acc = 0;
          for (int p = 0; p < k; ++p) acc += double(ta ? av[p * m + i] : av[i * k + p]) * (tb ? bv[j * k + p] : bv[p * n + j]);
          QVERIFY(std::abs(got[i * n + j] - acc) < 1e-4 * k);
        }
    }
  }

  void random_matches_cpu() {
    QCOMPARE(to_host(uniform(*rt_, {4099}, Device::cuda(0), 9)), to_host(uniform(*rt_, {4099}, Device::cpu(), 9)));
    auto gn_ = to_host(normal(*rt_, {4099}, Device::cuda(0), 9)), cn = to_host(normal(*rt_, {4099}, Device::cpu(), 9));
    for (size_t i = 0; i < gn_.size(); ++i) QVERIFY(std::abs(gn_[i] - cn[i]) <= 1e-6f * (1 + std::abs(cn[i])));
  }

  void elementwise_and_reductions() {
    Device g = Device::cuda(0);
    const int n = 1 << 20;
    Tensor a = uniform(*rt_, {n}, g, 3, -1, 1), b = uniform(*rt_, {n}, g, 4, 0.5, 1);
    auto av = to_host(a), bv = to_host(b);
    auto s = to_host(add(a, b)), d = to_host(div(a, b)), e = to_host(gn::exp(a)), r = to_host(relu(a));
    auto ss = to_host(scale_shift(a, 3, 1));
    double sum_ = 0, sq = 0;
    for (int i = 0; i < n; ++i) {
      QVERIFY(std::abs(s[i] - (double(av[i]) + bv[i])) < 1e-6);
      QVERIFY(std::abs(d[i] - (double(av[i]) / bv[i])) < 1e-5);
      QVERIFY(std::abs(e[i] - std::exp(double(av[i]))) < 1e-5);
      QCOMPARE(r[i], av[i] > 0 ? av[i] : 0.0f);
      QVERIFY(std::abs(ss[i] - (3.0 * av[i] + 1)) < 1e-5);
      sum_ += av[i];
      sq += double(av[i]) * av[i];
    }
    QVERIFY(std::abs(item(sum(a)) - sum_) < 1e-2);
    QVERIFY(std::abs(item(frobenius_norm(a)) - std::sqrt(sq)) < 1e-2);
  }

  void copies_every_direction() {
    Tensor h = arange(*rt_, 1000, Device::cpu());
    for (bool nb : {false, true}) {
      Tensor d = copy(h, Device::cuda(0), nb);
      QCOMPARE(d.device(), Device::cuda(0));
      Tensor d2 = copy(d, Device::cuda(0), nb);
      QVERIFY(!d2.is_same(d));
      QCOMPARE(to_host(copy(d2, Device::cpu(), nb)), to_host(h));
      if (rt_->cuda_device_count() > 1) QCOMPARE(to_host(copy(d, Device::cuda(1), nb)), to_host(h));
    }
    Tensor d = to(h, Device::cuda(0));
    QVERIFY(to(d, Device::cuda(0)).is_same(d));
  }

  void mismatch_cpu_and_cuda() {
    Tensor a = ones(*rt_, {2}, Device::cuda(0)), b = ones(*rt_, {2}, Device::cpu());
    try {
      add(a, b);
      QFAIL("expected DeviceMismatchError");
    } catch (const DeviceMismatchError& e) {
      QCOMPARE(QString(e.what()),
               QString("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!"));
    }
  }

  void caching_allocator_stats_and_oom() {
    Runtime small({.memory_limits = {{Device::cuda(0), 64 << 20}}});
    auto base = small.memory_stats(Device::cuda(0));
    {
      Tensor a = zeros(small, {4 << 20}, Device::cuda(0));  // 16 MiB
      small.engine().wait_all();
      QCOMPARE(small.memory_stats(Device::cuda(0)).allocated_bytes.current - base.allocated_bytes.current,
               int64_t(16 << 20));
      QVERIFY_THROWS_EXCEPTION(OutOfMemoryError, zeros(small, {16 << 20}, Device::cuda(0)));  // 64 MiB more
    }
    small.engine().wait_all();
    auto s = small.memory_stats(Device::cuda(0));
    QCOMPARE(s.allocated_bytes.current, base.allocated_bytes.current);
    QVERIFY(s.allocated_bytes.peak >= int64_t(16 << 20));
    QVERIFY(s.reserved_bytes.current >= int64_t(16 << 20) || s.reserved_bytes.freed > 0);  // cached or released
    QCOMPARE(s.num_ooms, int64_t(1));
  }

  void tf32_matmul_is_close() {
    Tensor a = uniform(*rt_, {256, 256}, Device::cuda(0), 5, -1, 1);
    auto exact = to_host(matmul(a, a)), fast = to_host(matmul(a, a, {false, false, Precision::Tf32}));
    for (size_t i = 0; i < exact.size(); ++i) QVERIFY(std::abs(exact[i] - fast[i]) < 0.05f);
  }
};

QTEST_GUILESS_MAIN(CudaTest)
#include "test_cuda.moc"
