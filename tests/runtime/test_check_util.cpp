// The GPU checks' own helpers (tests/gpu/check_util.h), on the CPU: each reference against values worked
// out by hand, and each measure shown to fail on a wrong result, so that a check that cannot fail is caught
// in CI rather than trusted on a GPU run.
#include <QtTest>
#include <cmath>
#include <cstdio>

#include "gpu/check_util.h"
#include "gpunodes/ops.h"

using namespace gn;

class CheckUtilTest : public QObject {
  Q_OBJECT

 private slots:
  void bits_differ_counts_bits_not_values() {
    QCOMPARE(check::bits_differ({1.0f, 2.0f}, {1.0f, 2.0f}), int64_t(0));
    QCOMPARE(check::bits_differ({0.0f, 1.0f}, {-0.0f, 1.0f}), int64_t(1));  // equal values, other bits
    QCOMPARE(check::bits_differ({1.0f}, {1.0f, 1.0f}), int64_t(2));         // sizes differ: all of them
    QCOMPARE(check::bits_differ({1.0f}, {std::nextafter(1.0f, 2.0f)}), int64_t(1));
  }

  void max_rel_err_is_floored_and_refuses_non_finite() {
    QCOMPARE(check::max_rel_err(std::vector<float>{2.0f, 4.0f}, {2.0f, 4.0f}), 0.0);
    QCOMPARE(check::max_rel_err(std::vector<float>{2.0f}, {2.5f}), 0.25);                 // 0.5 / 2
    QCOMPARE(check::max_rel_err(std::vector<double>{0.0}, {0.001f}, 0.01), 0.001 / 0.01 * (double(0.001f) / 0.001));
    QVERIFY(std::isinf(check::max_rel_err(std::vector<float>{1.0f}, {NAN})));
    QVERIFY(std::isinf(check::max_rel_err(std::vector<float>{1.0f}, {1.0f, 1.0f})));
  }

  void gemm_ref_multiplies_with_transposes() {
    // A = [[1, 2], [3, 4]], B = [[5, 6], [7, 8]]: AB = [[19, 22], [43, 50]], A^T B = [[26, 30], [38, 44]],
    // A B^T = [[17, 23], [39, 53]].
    const std::vector<float> a{1, 2, 3, 4}, b{5, 6, 7, 8};
    QCOMPARE(check::gemm_ref(a, b, 2, 2, 2, false, false, 1, 0), 43.0);
    QCOMPARE(check::gemm_ref(a, b, 2, 2, 2, false, false, 0, 1), 22.0);
    QCOMPARE(check::gemm_ref(a, b, 2, 2, 2, true, false, 1, 1), 44.0);
    QCOMPARE(check::gemm_ref(a, b, 2, 2, 2, false, true, 0, 1), 23.0);
    // A non-square one: [1 x 3] [3 x 2].
    QCOMPARE(check::gemm_ref({1, 2, 3}, {1, 0, 0, 1, 1, 1}, 1, 2, 3, false, false, 0, 1), 5.0);
  }

  void matmul_error_passes_the_product_and_fails_a_wrong_one() {
    Runtime rt;
    const Device cpu = Device::cpu();
    Tensor a = uniform(rt, {40, 30}, cpu, 1, -1, 1), b = uniform(rt, {30, 20}, cpu, 2, -1, 1);
    Tensor c = matmul(a, b);
    QVERIFY(check::matmul_error(a, b, c, false, false).worst <= check::matmul_tolerance(Precision::Fp32, 30));
    // One element off by 0.01: found, at its place, over the tolerance; in the sampled form as well (row 7).
    auto cv = to_host(c);
    cv[7 * 20 + 19] += 0.01f;
    Tensor wrong = from_values(rt, {40, 20}, cpu, cv);
    const check::MatmulError e = check::matmul_error(a, b, wrong, false, false);
    QCOMPARE(e.i, int64_t(7));
    QCOMPARE(e.j, int64_t(19));
    QVERIFY(e.worst > check::matmul_tolerance(Precision::Fp32, 30));
    QVERIFY(check::matmul_error(a, b, wrong, false, false, {0, 7}).worst > 0.009);
    QVERIFY(check::matmul_error(a, b, wrong, false, false, {0, 8}).worst < 1e-4);
    // Transposed operands and a wrong shape.
    Tensor at = uniform(rt, {30, 40}, cpu, 3, -1, 1), bt = uniform(rt, {20, 30}, cpu, 4, -1, 1);
    QVERIFY(check::matmul_error(at, bt, matmul(at, bt, {true, true}), true, true).worst < 1e-4);
    QVERIFY(std::isinf(check::matmul_error(a, b, zeros(rt, {20, 40}, cpu), false, false).worst));
    // A NaN is the worst error there is.
    cv[0] = NAN;
    QVERIFY(!(check::matmul_error(a, b, from_values(rt, {40, 20}, cpu, cv), false, false).worst <= 1.0));
  }

  void matmul_tolerance_grows_with_k() {
    QCOMPARE(check::matmul_tolerance(Precision::Fp32, 1000), 2e-3);
    QCOMPARE(check::matmul_tolerance(Precision::Tf32, 100), 0.1);
  }

  void conv2d_ref_sums_windows_and_keeps_groups_apart() {
    // One 3x3 channel of 1..9, a 2x2 kernel of ones, no padding: the window sums 12, 16, 24, 28.
    const std::vector<float> x{1, 2, 3, 4, 5, 6, 7, 8, 9};
    QCOMPARE(check::conv2d_ref(x, {1, 1, 1, 1}, 1, 1, 3, 3, 1, 2, 2, 1, 0, 1, 2, 2),
             (std::vector<double>{12, 16, 24, 28}));
    // Padding 1, stride 2, a 1x1 kernel of 2: the corners of the padded input's even positions.
    QCOMPARE(check::conv2d_ref(x, {2}, 1, 1, 3, 3, 1, 1, 1, 2, 1, 1, 2, 2), (std::vector<double>{0, 0, 0, 10}));
    // Two groups, one channel each: output 0 sees channel 0 only, output 1 channel 1 only.
    const std::vector<float> two{1, 1, 1, 1, 10, 10, 10, 10};  // [1, 2, 2, 2]
    QCOMPARE(check::conv2d_ref(two, {1, 1}, 1, 2, 2, 2, 2, 1, 1, 1, 0, 2, 2, 2),
             (std::vector<double>{1, 1, 1, 1, 10, 10, 10, 10}));
    // One group: each output sums both channels.
    QCOMPARE(check::conv2d_ref(two, {1, 1, 1, 1}, 1, 2, 2, 2, 2, 1, 1, 1, 0, 1, 2, 2),
             (std::vector<double>(8, 11)));
  }

  void checks_count_failures_and_exceptions() {
    char buffer[4096] = {};
    std::FILE* out = fmemopen(buffer, sizeof buffer - 1, "w");
    QVERIFY(out);
    check::Checks c(out);
    QVERIFY(c.run("passes", [&] { c.expect(true, 1, "true", "never printed"); }));
    QVERIFY(!c.run("fails", [&] { c.expect(1 + 1 == 3, 42, "1 + 1 == 3", "got %d", 2); }));
    QVERIFY(!c.run("throws", [] { throw std::runtime_error("boom"); }));
    std::fclose(out);
    QCOMPARE(c.checks(), 2);
    QCOMPARE(c.failures(), 2);
    const QString text = buffer;
    QVERIFY2(text.contains("FAIL line 42: 1 + 1 == 3: got 2"), buffer);
    QVERIFY2(text.contains("FAIL: threw boom"), buffer);
    QVERIFY2(text.contains(QRegularExpression("^ok +passes", QRegularExpression::MultilineOption)), buffer);
    QVERIFY2(!text.contains("never printed"), buffer);
  }
};

QTEST_GUILESS_MAIN(CheckUtilTest)
#include "test_check_util.moc"
