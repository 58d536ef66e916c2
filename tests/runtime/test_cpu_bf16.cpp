// bf16 on the CPU (issue 24): linear, conv2d and matmul under Precision::Bf16 run oneDNN's bf16 kernels with
// float32 accumulation where oneDNN's effective ISA has bf16 (avx512_core_bf16 or AMX), and are refused,
// naming that ISA, where it does not. The value checks skip, with the reason, on CPUs without it; CTest runs
// the suite again as test_cpu_bf16_no_isa with DNNL_MAX_CPU_ISA lowered, so that a machine with bf16 checks
// the refusal too.
//
// The tolerances follow from bf16's 8 significant bits. Rounding an operand to the nearest bf16 changes it by
// at most u = 2^-8 of itself, so a product of two rounded operands is within (2u + u^2) |a b| of the exact
// one, and a float32 sum of K terms adds at most K 2^-24 of the sum of their magnitudes. Each result is
// checked twice, against independent float64 loops on the host:
//   - against the fp32 result of the same layer: within (2u + u^2 + 2.1 K 2^-24) sum |a b|;
//   - against float64 on the operands rounded to bf16 here (round to nearest even): within 1.1 K 2^-24 sum
//     |a b| (1 + u)^2. That bound is far below u, so it also fails a kernel that did not round its
//     operands (fp32 math), or rounded them another way (truncation).
#include <QtTest>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpunodes/errors.h"
#include "gpunodes/nn/data.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/trainer.h"
#include "gpunodes/ops.h"
#include "gpunodes/precision.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

using Vec = std::vector<double>;

constexpr double kU = 1.0 / 256;  // bf16's unit roundoff: 8 significant bits, rounded to nearest
double gamma32(int64_t k) {
  return static_cast<double>(k) * std::ldexp(1.0, -24);
}

Vec rounded(const Vec& v) {
  Vec r(v.size());
  for (size_t i = 0; i < v.size(); ++i) r[i] = round_bf16(v[i]);
  return r;
}

Vec random_vec(size_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(-1, 1);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(d(g));  // representable in float: both sides see the same values
  return v;
}
std::vector<float> to_f(const Vec& v) {
  return {v.begin(), v.end()};
}
Vec host(const Tensor& t) {
  const std::vector<float> f = to_host(t);
  return {f.begin(), f.end()};
}
Tensor make(Runtime& rt, const Shape& s, const Vec& v, DType type = DType::Float32) {
  return from_values(rt, s, Device::cpu(), to_f(v), type);
}

// A product's exact value and the sum of its terms' magnitudes, in float64.
struct Exact {
  Vec value, magnitude;
  explicit Exact(size_t n = 0) : value(n, 0.0), magnitude(n, 0.0) {}
  void add(size_t i, double term) {
    value[i] += term;
    magnitude[i] += std::fabs(term);
  }
};

// Checks `bf16` (a layer's result under Precision::Bf16) against `fp32` (the same layer in fp32), `exact` (float64
// of the original operands, for the magnitudes) and `of_rounded` (float64 of the operands rounded to bf16; empty
// to skip that check, for a result whose operands' rounding is not the layer's business), with reduction length
// k. `stored` is the result's own rounding when the layer stores it in bf16 (kU: an activation of the blocked
// layout), 0 for a float32 result. Returns the largest error against fp32 relative to the magnitudes, for the
// log.
double check(const char* what, const Vec& bf16, const Vec& fp32, const Exact& exact, const Vec& of_rounded,
             int64_t k, double stored = 0) {
  if (bf16.size() != exact.value.size() || fp32.size() != bf16.size()) {
    QTest::qFail(qPrintable(QString("%1: %2 values, expected %3").arg(what).arg(bf16.size()).arg(exact.value.size())),
                 __FILE__, __LINE__);
    return 0;
  }
  const double vs_fp32 = 2 * kU + kU * kU + 2.1 * gamma32(k) + stored;
  const double vs_rounded = 1.1 * gamma32(k) * (1 + kU) * (1 + kU) + stored;
  double worst = 0;
  for (size_t i = 0; i < bf16.size(); ++i) {
    const double mag = exact.magnitude[i] + 1e-30;
    const double e = std::fabs(bf16[i] - fp32[i]);
    worst = std::max(worst, e / mag);
    if (!(e <= vs_fp32 * mag)) {
      QTest::qFail(qPrintable(QString("%1[%2]: bf16 %3 vs fp32 %4 (exact %5): off by %6 of the magnitudes %7, "
                                      "more than the bound %8")
                                  .arg(what)
                                  .arg(i)
                                  .arg(bf16[i], 0, 'g', 9)
                                  .arg(fp32[i], 0, 'g', 9)
                                  .arg(exact.value[i], 0, 'g', 9)
                                  .arg(e / mag, 0, 'g', 3)
                                  .arg(mag, 0, 'g', 4)
                                  .arg(vs_fp32, 0, 'g', 3)),
                   __FILE__, __LINE__);
      return worst;
    }
    if (!of_rounded.empty()) {
      const double r = std::fabs(bf16[i] - of_rounded[i]);
      if (!(r <= vs_rounded * mag + 1e-30)) {
        QTest::qFail(qPrintable(QString("%1[%2]: bf16 %3 vs float64 of the bf16-rounded operands %4: off by %5 of "
                                        "the magnitudes, more than float32 accumulation's %6; the operands were "
                                        "not rounded to nearest bf16")
                                    .arg(what)
                                    .arg(i)
                                    .arg(bf16[i], 0, 'g', 9)
                                    .arg(of_rounded[i], 0, 'g', 9)
                                    .arg(r / mag, 0, 'g', 3)
                                    .arg(vs_rounded, 0, 'g', 3)),
                     __FILE__, __LINE__);
        return worst;
      }
    }
  }
  return worst;
}

// --- float64 references ----------------------------------------------------------------------------------

struct ConvCase {
  int64_t n, c, h, w, k, r, stride, pad, groups;
  bool bias;
  bool blocked;  // input and output in the CPU's blocked layout
  int64_t oh() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - r) / stride + 1; }
};

struct ConvRef {
  Exact y, dx, dw, db;
};

// y = conv(x, w) + b, dx = conv^T(dy, w), dw = sum over the batch and positions of dy x, db = sum of dy.
ConvRef conv_ref(const ConvCase& s, const Vec& x, const Vec& w, const Vec& b, const Vec& dy) {
  const int64_t oh = s.oh(), ow = s.ow(), cg = s.c / s.groups, kg = s.k / s.groups;
  ConvRef o{Exact(size_t(s.n * s.k * oh * ow)), Exact(x.size()), Exact(w.size()), Exact(size_t(s.k))};
  for (int64_t n = 0; n < s.n; ++n)
    for (int64_t k = 0; k < s.k; ++k)
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          const size_t yi = size_t(((n * s.k + k) * oh + i) * ow + j);
          if (s.bias) o.y.add(yi, b[size_t(k)]);
          o.db.add(size_t(k), dy[yi]);
          for (int64_t cc = 0; cc < cg; ++cc)
            for (int64_t r = 0; r < s.r; ++r)
              for (int64_t q = 0; q < s.r; ++q) {
                const int64_t ih = i * s.stride - s.pad + r, iw = j * s.stride - s.pad + q;
                if (ih < 0 || iw < 0 || ih >= s.h || iw >= s.w) continue;
                const int64_t c = k / kg * cg + cc;
                const size_t xi = size_t(((n * s.c + c) * s.h + ih) * s.w + iw);
                const size_t wi = size_t(((k * cg + cc) * s.r + r) * s.r + q);
                o.y.add(yi, x[xi] * w[wi]);
                o.dx.add(xi, dy[yi] * w[wi]);
                o.dw.add(wi, dy[yi] * x[xi]);
              }
        }
  return o;
}

// NCHW <-> [N, C / B, H, W, B] on the host.
Vec to_blocked(const Vec& v, int64_t n, int64_t c, int64_t hw, int64_t b) {
  Vec o(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p)
        o[size_t(((i * (c / b) + ch / b) * hw + p) * b + ch % b)] = v[size_t((i * c + ch) * hw + p)];
  return o;
}
Vec from_blocked(const Vec& v, int64_t n, int64_t c, int64_t hw, int64_t b) {
  Vec o(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p)
        o[size_t((i * c + ch) * hw + p)] = v[size_t(((i * (c / b) + ch / b) * hw + p) * b + ch % b)];
  return o;
}

struct ConvOut {
  Vec y, dx, dw, db;
  DType y_type, dx_type;  // as the layer stored them
};

ConvOut run_conv(Runtime& rt, const ConvCase& s, const Vec& x, const Vec& w, const Vec& b, const Vec& dy,
                 Precision p) {
  // The blocked layout follows the precision (NHWC for bf16 where oneDNN's bf16 kernels want it).
  ScopedPrecision scope(p);
  const int64_t bi = s.blocked ? layout_block(Layout::Blocked, Device::cpu(), s.c) : 1;
  const int64_t bo = s.blocked ? layout_block(Layout::Blocked, Device::cpu(), s.k) : 1;
  const Layout layout = s.blocked ? Layout::Blocked : Layout::Nchw;
  const Conv2dOptions o{.stride = s.stride, .padding = s.pad, .groups = s.groups, .input_layout = layout,
                        .output_layout = layout};
  const int64_t ohw = s.oh() * s.ow();
  // A network hands a blocked bf16 layer its activations and their gradients in bf16, as it stores them.
  const DType act = s.blocked && p == Precision::Bf16 ? DType::BFloat16 : DType::Float32;
  const Tensor tx = make(rt, {s.n, s.c, s.h, s.w}, to_blocked(x, s.n, s.c, s.h * s.w, bi), act);
  const Tensor tw = make(rt, {s.k, s.c / s.groups, s.r, s.r}, w);
  const Tensor tb = s.bias ? make(rt, {s.k}, b) : Tensor();
  const Tensor tdy = make(rt, {s.n, s.k, s.oh(), s.ow()}, to_blocked(dy, s.n, s.k, ohw, bo), act);
  const Tensor y = conv2d(tx, tw, tb, o);
  const Conv2dGrads g = conv2d_backward(tx, tw, tdy, o, true, s.bias);
  ConvOut out{from_blocked(host(y), s.n, s.k, ohw, bo), from_blocked(host(g.dx), s.n, s.c, s.h * s.w, bi),
              host(g.dw), s.bias ? host(g.db) : Vec(), y.dtype(), g.dx.dtype()};
  return out;
}

}  // namespace

Q_DECLARE_METATYPE(ConvCase)

class CpuBf16Test : public QObject {
  Q_OBJECT

 private slots:
  void initTestCase() {
    qInfo("oneDNN's effective ISA: %s; the CPU's bf16 instructions: %s; native bf16: %s", cpu_dnnl_isa().c_str(),
          cpu_bf16_features().empty() ? "none" : cpu_bf16_features().c_str(), cpu_native_bf16() ? "yes" : "no");
  }

  // Where oneDNN's ISA has bf16 the CPU computes in bf16 (and only in bf16 besides fp32); elsewhere every
  // product op and the Trainer refuse it at once, naming the precision, the device and the ISA found.
  void bf16_is_allowed_exactly_where_the_isa_has_it() {
    const Device cpu = Device::cpu();
    QVERIFY(!precision_supported(Precision::Tf32, cpu));
    QVERIFY(!precision_supported(Precision::Fp16, cpu));
    QVERIFY(precision_supported(Precision::Fp32, cpu));
    const std::string isa = cpu_dnnl_isa();
    const bool isa_has_bf16 = isa == "avx512_core_bf16" || isa == "avx512_core_amx";
    QCOMPARE(cpu_native_bf16(), isa_has_bf16);
    QCOMPARE(precision_supported(Precision::Bf16, cpu), isa_has_bf16);
    // oneDNN can only be lowered below what the CPU has, never raised above it.
    if (isa_has_bf16) QVERIFY(!cpu_bf16_features().empty());
    Runtime rt;
    const Tensor a = ones(rt, {2, 3}, cpu), b = ones(rt, {3, 4}, cpu);
    if (isa_has_bf16) {
      check_precision(Precision::Bf16, cpu, "matmul");
      QCOMPARE(to_host(matmul(a, b, {.precision = Precision::Bf16})), std::vector<float>(8, 3.0f));
      return;
    }
    const QString has = QString::fromStdString(cpu_bf16_features());
    const QString why = has.isEmpty() ? "neither avx512_bf16 nor AMX-BF16" : "without bf16";
    expect_error([&] { matmul(a, b, {.precision = Precision::Bf16}); },
                 {"matmul", "precision bf16", "cpu", QString::fromStdString(isa), why});
    {
      ScopedPrecision scope(Precision::Bf16);
      expect_error([&] { linear(a, ones(rt, {5, 3}, cpu), Tensor()); }, {"linear", "bf16", QString::fromStdString(isa)});
      expect_error([&] { conv2d(ones(rt, {1, 1, 4, 4}, cpu), ones(rt, {1, 1, 3, 3}, cpu), Tensor()); },
                   {"conv2d", "bf16", QString::fromStdString(isa)});
    }
    auto m = Model::create(rt, modelOptions(Arch::Mlp), cpu);
    TrainOptions o;
    o.precision = Precision::Bf16;
    expect_error([&] { Trainer(*m, {cpu}, o); }, {"training", "bf16", "cpu", QString::fromStdString(isa)});
  }

  void matmul_in_bf16_data() {
    QTest::addColumn<int>("m");
    QTest::addColumn<int>("n");
    QTest::addColumn<int>("k");
    QTest::addColumn<bool>("ta");
    QTest::addColumn<bool>("tb");
    QTest::newRow("100^3") << 100 << 100 << 100 << false << false;
    QTest::newRow("a^T, long k") << 17 << 33 << 1000 << true << false;
    QTest::newRow("b^T") << 64 << 10 << 300 << false << true;
    QTest::newRow("both^T") << 9 << 70 << 5 << true << true;
    QTest::newRow("1x1x1") << 1 << 1 << 1 << false << false;
  }
  void matmul_in_bf16() {
    SKIP_WITHOUT_BF16();
    QFETCH(int, m);
    QFETCH(int, n);
    QFETCH(int, k);
    QFETCH(bool, ta);
    QFETCH(bool, tb);
    Runtime rt;
    const Vec a = random_vec(size_t(m * k), 1), b = random_vec(size_t(k * n), 2);
    const Tensor ta_ = make(rt, ta ? Shape{k, m} : Shape{m, k}, a), tb_ = make(rt, tb ? Shape{n, k} : Shape{k, n}, b);
    const Vec got = host(matmul(ta_, tb_, {.trans_a = ta, .trans_b = tb, .precision = Precision::Bf16}));
    const Vec fp32 = host(matmul(ta_, tb_, {.trans_a = ta, .trans_b = tb}));
    auto product = [&](const Vec& av, const Vec& bv) {
      Exact e(size_t(m * n));
      for (int i = 0; i < m; ++i)
        for (int j = 0; j < n; ++j)
          for (int p = 0; p < k; ++p)
            e.add(size_t(i * n + j), av[size_t(ta ? p * m + i : i * k + p)] * bv[size_t(tb ? j * k + p : p * n + j)]);
      return e;
    };
    const double worst = check("c", got, fp32, product(a, b), product(rounded(a), rounded(b)).value, k);
    qInfo("largest bf16 - fp32 difference: %.2e of the magnitudes (bound %.2e)", worst, 2 * kU + kU * kU + 2.1 * gamma32(k));
  }

  void linear_in_bf16_data() {
    QTest::addColumn<int>("rows");
    QTest::addColumn<int>("in");
    QTest::addColumn<int>("out");
    QTest::addColumn<bool>("bias");
    QTest::newRow("MLP's first layer") << 64 << 784 << 256 << true;
    QTest::newRow("LeNet's last") << 32 << 84 << 10 << true;
    QTest::newRow("no bias, one row") << 1 << 50 << 7 << false;
  }
  void linear_in_bf16() {
    SKIP_WITHOUT_BF16();
    QFETCH(int, rows);
    QFETCH(int, in);
    QFETCH(int, out);
    QFETCH(bool, bias);
    Runtime rt;
    const Vec x = random_vec(size_t(rows * in), 3), w = random_vec(size_t(out * in), 4),
              b = random_vec(size_t(out), 5), dy = random_vec(size_t(rows * out), 6);
    const Tensor tx = make(rt, {rows, in}, x), tw = make(rt, {out, in}, w), tb = bias ? make(rt, {out}, b) : Tensor(),
                 tdy = make(rt, {rows, out}, dy);
    struct Out {
      Vec y, dx, dw, db;
    };
    auto run = [&](Precision p) {
      ScopedPrecision scope(p);
      const Tensor y = linear(tx, tw, tb);
      const LinearGrads g = linear_backward(tx, tw, tdy, true, bias);
      return Out{host(y), host(g.dx), host(g.dw), bias ? host(g.db) : Vec()};
    };
    const Out got = run(Precision::Bf16), fp32 = run(Precision::Fp32);
    // y = x W^T + b, dx = dy W, dW = dy^T x, db = column sums of dy.
    auto refs = [&](const Vec& xv, const Vec& wv, const Vec& dyv) {
      Exact y{size_t(rows * out)}, dx{x.size()}, dw{w.size()}, db{size_t(out)};
      for (int i = 0; i < rows; ++i)
        for (int o = 0; o < out; ++o) {
          if (bias) y.add(size_t(i * out + o), b[size_t(o)]);
          db.add(size_t(o), dy[size_t(i * out + o)]);
          for (int p = 0; p < in; ++p) {
            y.add(size_t(i * out + o), xv[size_t(i * in + p)] * wv[size_t(o * in + p)]);
            dx.add(size_t(i * in + p), dyv[size_t(i * out + o)] * wv[size_t(o * in + p)]);
            dw.add(size_t(o * in + p), dyv[size_t(i * out + o)] * xv[size_t(i * in + p)]);
          }
        }
      return std::vector<Exact>{y, dx, dw, db};
    };
    const auto exact = refs(x, w, dy), of_rounded = refs(rounded(x), rounded(w), rounded(dy));
    check("y", got.y, fp32.y, exact[0], of_rounded[0].value, in + 1);
    check("dx", got.dx, fp32.dx, exact[1], of_rounded[1].value, out);
    check("dw", got.dw, fp32.dw, exact[2], of_rounded[2].value, rows);
    // The bias gradient sums dy in float32, as in fp32: it is no product.
    if (bias) check("db", got.db, fp32.db, exact[3], exact[3].value, rows);
  }

  void conv2d_in_bf16_data() {
    QTest::addColumn<ConvCase>("shape");
    QTest::newRow("LeNet conv1: 1 channel, 5x5, pad 2") << ConvCase{4, 1, 12, 12, 6, 5, 1, 2, 1, true, false};
    QTest::newRow("LeNet conv2: 6 -> 16, 5x5") << ConvCase{4, 6, 10, 10, 16, 5, 1, 0, 1, true, false};
    QTest::newRow("3x3 pad 1, 16 -> 32, no bias") << ConvCase{2, 16, 8, 8, 32, 3, 1, 1, 1, false, false};
    // Channels of the blocked cases: multiples of 16, the block on AVX-512 (8 on AVX2).
    QTest::newRow("3x3 stride 2, blocked") << ConvCase{2, 32, 9, 9, 32, 3, 2, 1, 1, false, true};
    QTest::newRow("1x1 projection, blocked") << ConvCase{2, 32, 7, 7, 64, 1, 2, 0, 1, true, true};
    // On AMX some passes of a blocked convolution are matmuls over im2col columns (cpu_conv_product.h): the
    // weight gradient with a stride or few positions (the rows above, and the next two); the forward and the
    // data gradient at 16 positions or fewer (the 1x1 projection and the 4x4 row) or with a stride from 128
    // channels (the 7x7 row). The last row has 100 positions and takes oneDNN's kernels in every pass.
    QTest::newRow("3x3 pad 1 at 4x4, blocked") << ConvCase{3, 48, 4, 4, 64, 3, 1, 1, 1, true, true};
    QTest::newRow("3x3 stride 2 from 128 channels, blocked") << ConvCase{2, 128, 7, 7, 32, 3, 2, 1, 1, true, true};
    QTest::newRow("3x3 pad 1 at 10x10, blocked") << ConvCase{2, 32, 10, 10, 48, 3, 1, 1, 1, true, true};
    QTest::newRow("1x1 plain") << ConvCase{3, 8, 5, 5, 12, 1, 1, 0, 1, true, false};
    QTest::newRow("depthwise 3x3") << ConvCase{2, 16, 6, 6, 16, 3, 1, 1, 16, true, false};
    QTest::newRow("grouped, 4 groups") << ConvCase{2, 16, 6, 6, 32, 3, 1, 1, 4, false, false};
  }
  void conv2d_in_bf16() {
    SKIP_WITHOUT_BF16();
    QFETCH(ConvCase, shape);
    const ConvCase& s = shape;
    Runtime rt;
    const int64_t ohw = s.oh() * s.ow();
    const Vec x = random_vec(size_t(s.n * s.c * s.h * s.w), 7), w = random_vec(size_t(s.k * s.c / s.groups * s.r * s.r), 8),
              b = random_vec(size_t(s.k), 9), dy = random_vec(size_t(s.n * s.k * ohw), 10);
    const ConvOut got = run_conv(rt, s, x, w, b, dy, Precision::Bf16), fp32 = run_conv(rt, s, x, w, b, dy, Precision::Fp32);
    const ConvRef exact = conv_ref(s, x, w, b, dy), of_rounded = conv_ref(s, rounded(x), rounded(w), b, rounded(dy));
    const int64_t cg = s.c / s.groups, kg = s.k / s.groups;
    // In the blocked layout y and dx are activations, stored in bf16 (half the memory); NCHW keeps float32.
    const DType act = s.blocked ? DType::BFloat16 : DType::Float32;
    QCOMPARE(int(got.y_type), int(act));
    QCOMPARE(int(got.dx_type), int(act));
    QCOMPARE(int(fp32.y_type), int(DType::Float32));
    const double stored = s.blocked ? kU : 0;
    const double wy = check("y", got.y, fp32.y, exact.y, of_rounded.y.value, cg * s.r * s.r + 1, stored);
    const double wdx = check("dx", got.dx, fp32.dx, exact.dx, of_rounded.dx.value, kg * s.r * s.r, stored);
    const double wdw = check("dw", got.dw, fp32.dw, exact.dw, of_rounded.dw.value, s.n * ohw);
    // oneDNN may sum the bias gradient from dy as rounded for the product or as given: only the bound
    // against fp32 holds for both.
    if (s.bias) check("db", got.db, fp32.db, exact.db, {}, s.n * ohw);
    qInfo("largest bf16 - fp32 differences, of the magnitudes: y %.2e, dx %.2e, dw %.2e", wy, wdx, wdw);
  }

  // Under bf16 the CPU's blocked layout is the one oneDNN's bf16 convolutions take (NHWC, block == channels,
  // on AMX; the fp32 block elsewhere), and it stores the activations in bf16. Batch norm (with its fused
  // shortcut add and ReLU) and the global average pool read them as floats, compute in float (double for
  // the sums) and round what they store once: given the same values, each result is the float32 NCHW one
  // rounded to bf16, to the bit (each channel's values are summed in the same order in every layout: image by
  // image, the images' partial sums then added in order, though NHWC sums an image per thread and the others a
  // channel group per thread), and the statistics and parameter gradients are the same bits.
  void batchnorm_and_pooling_in_the_bf16_layout_data() {
    QTest::addColumn<int>("channels");
    QTest::newRow("64 channels") << 64;
    QTest::newRow("48 channels") << 48;
    QTest::newRow("24 channels") << 24;
    QTest::newRow("12 channels") << 12;
  }
  void batchnorm_and_pooling_in_the_bf16_layout() {
    SKIP_WITHOUT_BF16();
    QFETCH(int, channels);
    Runtime rt;
    ScopedPrecision scope(Precision::Bf16);
    const int64_t n = 3, c = channels, hw = 5 * 5;
    int64_t b = 1;
    try {
      b = layout_block(Layout::Blocked, Device::cpu(), c);
    } catch (const ShapeError& e) {
      // The bf16 layout here is blocked, not NHWC: a channel count off its block is refused, as in fp32.
      QVERIFY2(std::string(e.what()).find("needs a multiple of") != std::string::npos, e.what());
      return;
    }
    qInfo("the bf16 blocked layout of %lld channels: block %lld%s", (long long)c, (long long)b,
          b == c ? " (NHWC)" : "");
    const Shape shape{n, c, 5, 5};
    const Vec x = random_vec(size_t(n * c * hw), 31), res = random_vec(size_t(n * c * hw), 32),
              dy = random_vec(size_t(n * c * hw), 33), gamma = random_vec(size_t(c), 34),
              beta = random_vec(size_t(c), 35);
    const Vec rx = rounded(x), rres = rounded(res), rdy = rounded(dy);  // the values a bf16 network holds
    const Tensor dpooled = make(rt, {n, c, 1, 1}, Vec(size_t(n * c), 1.0 / 3));
    std::vector<std::pair<DType, DType>> types;  // (stored, wanted) of y, dx and dresidual in each run
    auto run = [&](Layout layout, int64_t blk) {
      const DType act = layout == Layout::Blocked ? DType::BFloat16 : DType::Float32;
      const Tensor rm = zeros(rt, {c}, Device::cpu()), rv = ones(rt, {c}, Device::cpu());
      BatchNormOptions o;
      o.layout = layout;
      o.relu = true;
      const Tensor tg = make(rt, {c}, gamma);
      const Tensor tx = make(rt, shape, to_blocked(rx, n, c, hw, blk), act);
      const BatchNormResult r = batchnorm2d(tx, tg, make(rt, {c}, beta), rm, rv, o,
                                            make(rt, shape, to_blocked(rres, n, c, hw, blk), act));
      const BatchNormGrads g = batchnorm2d_backward(tx, make(rt, shape, to_blocked(rdy, n, c, hw, blk), act), tg,
                                                    r.save_mean, r.save_invstd, o, r.y, true);
      for (const Tensor* t : {&r.y, &g.dx, &g.dresidual}) types.emplace_back(t->dtype(), act);
      // The pooling reads the stored y: for NCHW, y rounded as the blocked layer stored it.
      const Vec y = from_blocked(host(r.y), n, c, hw, blk);
      const Tensor pooled = global_avg_pool(layout == Layout::Blocked ? r.y : make(rt, shape, rounded(y)), layout);
      const Tensor dpool = global_avg_pool_backward(dpooled, shape, layout);
      return std::vector<Vec>{y, from_blocked(host(g.dx), n, c, hw, blk),
                              from_blocked(host(g.dresidual), n, c, hw, blk), host(g.dgamma), host(g.dbeta),
                              host(rm), host(rv), host(pooled), from_blocked(host(dpool), n, c, hw, blk)};
    };
    const std::vector<Vec> blocked = run(Layout::Blocked, b), nchw = run(Layout::Nchw, 1);
    const char* names[] = {"y", "dx", "dresidual", "dgamma", "dbeta", "running mean", "running var",
                           "pooled", "pool dx"};
    for (const auto& [stored, wanted] : types) QCOMPARE(int(stored), int(wanted));
    const bool stored_in_bf16[] = {true, true, true, false, false, false, false, false, true};
    for (size_t i = 0; i < nchw.size(); ++i)
      QVERIFY2(blocked[i] == (stored_in_bf16[i] ? rounded(nchw[i]) : nchw[i]), names[i]);
    QVERIFY2(blocked[0] != nchw[0], "y was not rounded: the check above could not fail");
  }

  // The whole built-in ResNet-18 in bf16, its activations in the bf16 layout from stem to pooling, against fp32
  // on the same weights: the logits and every weight's gradient of one training forward and backward. This is
  // a check of the layouts, not of the rounding (each layer's is checked above): a mislaid layout or a missed
  // reorder scrambles a result by about its whole norm. Rounding alone moves the logits by well under 1% of
  // their norm, but the gradients by 10-25% here: every batch norm's backward subtracts the channel's mean
  // gradient and its projection on the normalised input, which cancels most of dy, and its rounding noise
  // stays. The bounds sit between the two: 2% for the logits, 50% for the gradients. A convolution's bias
  // in front of a batch norm is left out: its exact gradient is zero, so bf16 and fp32 both give noise.
  void resnet18_in_bf16_tracks_fp32() {
    SKIP_WITHOUT_BF16();
    Runtime rt;
    ModelOptions mo = modelOptions(Arch::ResNet18, 3);
    mo.init = Init::Kaiming;
    auto m = Model::create(rt, mo, Device::cpu());
    const Tensor x = normal(rt, {8, 1, 16, 16}, Device::cpu(), 5);
    const Tensor labels = from_values(rt, {8}, Device::cpu(), {1, 4, 7, 9, 0, 2, 5, 3});
    std::vector<std::string> names{"logits"};
    for (const Parameter* q : m->parameters()) names.push_back(q->name);
    auto run = [&](Precision p) {
      ScopedPrecision scope(p);
      const Tensor logits = m->forward(x, Mode::Train);
      m->backward(softmax_cross_entropy(logits, labels).dlogits);
      std::vector<Vec> out{host(logits)};
      for (const Parameter* q : m->parameters()) out.push_back(host(q->grad));
      return out;
    };
    const std::vector<Vec> fp32 = run(Precision::Fp32), bf16 = run(Precision::Bf16);
    QCOMPARE(bf16.size(), names.size());
    double worst = 0;
    for (size_t i = 0; i < fp32.size(); ++i) {
      const std::string& name = names[i];
      const bool conv_bias = name.find("conv") != std::string::npos && name.ends_with(".bias") &&
                             name.find("conv3") == std::string::npos;  // conv3: the shortcut, no batch norm
      if (conv_bias || name == "0.bias") continue;
      double scale = 0, diff = 0;
      for (size_t j = 0; j < fp32[i].size(); ++j) {
        scale += fp32[i][j] * fp32[i][j];
        diff += (bf16[i][j] - fp32[i][j]) * (bf16[i][j] - fp32[i][j]);
      }
      const double rel = std::sqrt(diff / std::max(scale, 1e-30)), bound = i == 0 ? 0.02 : 0.5;
      if (i > 0) worst = std::max(worst, rel);
      QVERIFY2(rel <= bound, qPrintable(QString("%1: bf16 differs from fp32 by %2 of its norm, more than %3")
                                            .arg(QString::fromStdString(name))
                                            .arg(rel)
                                            .arg(bound)));
    }
    qInfo("largest difference of a gradient, bf16 vs fp32, relative to its norm: %.3f", worst);
  }

  // torch.autocast's claim for training: bf16 products with float32 master weights, batch norm and loss train
  // as well as fp32. LeNet, 3 epochs on Fashion-MNIST, the same seeds: the test accuracies within 0.01.
  // A subset of the training images (the first 20,000 of 60,000), so that the two runs fit a 2-core CI
  // machine's time; the full test set.
  void lenet_trains_in_bf16_as_in_fp32() {
    SKIP_WITHOUT_BF16();
    if (!std::filesystem::exists(default_fashion_mnist_dir())) QSKIP("Fashion-MNIST is not installed");
    const DatasetPtr train = take(load_fashion_mnist(Split::Train), 20000), test = load_fashion_mnist(Split::Test);
    auto run = [&](Precision p) {
      Runtime rt;
      // Xavier, as the LeNet example: from N(0, 0.01) the sigmoid LeNet sits on its plateau for epochs.
      ModelOptions mo = modelOptions(Arch::LeNet, 1);
      mo.init = Init::Xavier;
      auto m = Model::create(rt, mo, Device::cpu());
      TrainOptions o;
      o.epochs = 3;
      o.batch_size = 128;
      // Adam, so that the sigmoid LeNet is past its first plateau within the first epoch: two runs caught in
      // it could leave it at different steps and differ by more than their precision.
      o.optimizer.kind = OptimizerKind::Adam;
      o.optimizer.lr = 2e-3;
      o.shuffle_seed = 1;
      o.log_every = 0;
      o.precision = p;
      Trainer t(*m, {Device::cpu()}, o);
      const TrainResult r = t.fit(train, test);
      for (const auto& e : r.epochs)
        qInfo("%s epoch %lld: loss %.4f, train acc %.4f, test acc %.4f, %.1f s", precision_name(p),
              (long long)e.epoch, e.train_loss, e.train_acc, e.test_acc, e.seconds);
      std::vector<float> params;
      for (const Parameter* q : m->state())
        for (float v : to_host(q->value)) params.push_back(v);
      return std::pair{r.epochs.back().test_acc, params};
    };
    const auto [fp32_acc, fp32_params] = run(Precision::Fp32);
    const auto [bf16_acc, bf16_params] = run(Precision::Bf16);
    QVERIFY2(fp32_acc > 0.7, qPrintable(QString::number(fp32_acc)));  // it learned at all
    QVERIFY2(std::fabs(bf16_acc - fp32_acc) <= 0.01,
             qPrintable(QString("bf16 %1 vs fp32 %2").arg(bf16_acc).arg(fp32_acc)));
    QVERIFY(bf16_params != fp32_params);  // the bf16 run did round: it took other steps
  }
};

QTEST_GUILESS_MAIN(CpuBf16Test)
#include "test_cpu_bf16.moc"
