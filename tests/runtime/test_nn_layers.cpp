// Every layer against a naive float64 reference on the host: forward outputs, and gradients against central
// finite differences of that reference. Runs on the device named by GN_TEST_DEVICE (default cpu); CTest runs
// it again as test_nn_layers_cuda on cuda:0 (cuDNN with TF32 off), which skips where there is no GPU.
#include <QtTest>
#include <cmath>
#include <functional>
#include <random>
#include <set>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/optim.h"
#include "gpunodes/ops.h"
#include "gpunodes/random.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

using Vec = std::vector<double>;

Vec random_vec(size_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (auto& x : v)
    x = static_cast<float>(d(g));  // representable in float, so both sides see the same values
  return v;
}

std::vector<float> to_f(const Vec& v) {
  return {v.begin(), v.end()};
}
Vec to_d(const std::vector<float>& v) {
  return {v.begin(), v.end()};
}

Tensor make(Runtime& rt, Device d, const Shape& s, const Vec& v) {
  return from_values(rt, s, d, to_f(v));
}

double dot(const Vec& a, const Vec& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// |got - want| <= atol + rtol * |want|, elementwise, with a message naming the first miss.
void expect_close(const Vec& got, const Vec& want, double atol, double rtol, const char* what) {
  QCOMPARE(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i])))
      QFAIL(qPrintable(QString("%1: element %2 is %3, expected %4")
                           .arg(what)
                           .arg(i)
                           .arg(got[i], 0, 'g', 9)
                           .arg(want[i], 0, 'g', 9)));
}

// The gradient of L = <f(inputs), r> with respect to inputs[k], by central differences on the float64
// reference, at up to `max_points` positions (all when fewer); compares with `analytic`.
void check_grad(const std::function<Vec(const std::vector<Vec>&)>& f, std::vector<Vec> inputs, size_t k,
                const Vec& r, const Vec& analytic, const char* what, double atol = 2e-4, double rtol = 2e-3,
                size_t max_points = 160, double h = 1e-4) {
  QCOMPARE(analytic.size(), inputs[k].size());
  std::mt19937 g(7);
  std::vector<size_t> idx(inputs[k].size());
  for (size_t i = 0; i < idx.size(); ++i) idx[i] = i;
  if (idx.size() > max_points) {
    std::shuffle(idx.begin(), idx.end(), g);
    idx.resize(max_points);
  }
  for (size_t i : idx) {
    const double x0 = inputs[k][i];
    inputs[k][i] = x0 + h;
    const double lp = dot(f(inputs), r);
    inputs[k][i] = x0 - h;
    const double lm = dot(f(inputs), r);
    inputs[k][i] = x0;
    const double num = (lp - lm) / (2 * h);
    if (!(std::abs(analytic[i] - num) <= atol + rtol * std::abs(num)))
      QFAIL(qPrintable(QString("%1: d/d[%2] analytic %3, finite differences %4")
                           .arg(what)
                           .arg(i)
                           .arg(analytic[i], 0, 'g', 9)
                           .arg(num, 0, 'g', 9)));
  }
}

// --- float64 references ------------------------------------------------------------------------------------

Vec ref_linear(const Vec& x, const Vec& w, const Vec& b, int64_t n, int64_t in, int64_t out) {
  Vec y(n * out);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t o = 0; o < out; ++o) {
      double s = b[o];
      for (int64_t k = 0; k < in; ++k) s += x[i * in + k] * w[o * in + k];
      y[i * out + o] = s;
    }
  return y;
}

struct ConvDims {
  int64_t n, c, h, w, k, r, stride, pad, groups = 1;
  int64_t oh() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - r) / stride + 1; }
  int64_t group_c() const { return c / groups; }  // input channels each filter sees
};

// An empty b means no bias. Output channel o of group g = o / (K / groups) reads input channels
// [g * C/groups, (g + 1) * C/groups); its weights are w[o, 0 .. C/groups).
Vec ref_conv(const Vec& x, const Vec& w, const Vec& b, const ConvDims& d) {
  Vec y(d.n * d.k * d.oh() * d.ow());
  const int64_t gc = d.group_c(), per_group = d.k / d.groups;
  for (int64_t i = 0; i < d.n; ++i)
    for (int64_t o = 0; o < d.k; ++o)
      for (int64_t oy = 0; oy < d.oh(); ++oy)
        for (int64_t ox = 0; ox < d.ow(); ++ox) {
          double s = b.empty() ? 0.0 : b[o];
          const int64_t first = o / per_group * gc;
          for (int64_t c = 0; c < gc; ++c)
            for (int64_t ky = 0; ky < d.r; ++ky)
              for (int64_t kx = 0; kx < d.r; ++kx) {
                const int64_t iy = oy * d.stride - d.pad + ky, ix = ox * d.stride - d.pad + kx;
                if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) continue;
                s += x[((i * d.c + first + c) * d.h + iy) * d.w + ix] *
                     w[((o * gc + c) * d.r + ky) * d.r + kx];
              }
          y[((i * d.k + o) * d.oh() + oy) * d.ow() + ox] = s;
        }
  return y;
}

double ref_activation(Activation k, double x) {
  switch (k) {
    case Activation::Relu:
      return std::max(0.0, x);
    case Activation::Sigmoid:
      return 1.0 / (1.0 + std::exp(-x));
    case Activation::Tanh:
      return std::tanh(x);
    case Activation::Gelu:
      return 0.5 * x * (1.0 + std::erf(x / std::sqrt(2.0)));
  }
  return 0;
}

// dim-1 concat of [n, a_row] and [n, b_row] rows (each row a sample's channels and trailing values).
Vec ref_concat(const Vec& a, const Vec& b, int64_t n) {
  const size_t a_row = a.size() / n, b_row = b.size() / n;
  Vec y;
  for (int64_t i = 0; i < n; ++i) {
    y.insert(y.end(), a.begin() + i * a_row, a.begin() + (i + 1) * a_row);
    y.insert(y.end(), b.begin() + i * b_row, b.begin() + (i + 1) * b_row);
  }
  return y;
}

// Runs `f` and checks that it throws E whose message contains every one of `parts`.
template <class E, class F>
void expect_throw_naming(const char* what, std::initializer_list<const char*> parts, F f) {
  try {
    f();
  } catch (const E& e) {
    const QString msg = e.what();
    for (const char* part : parts)
      if (!msg.contains(part))
        QFAIL(qPrintable(QString("%1: message \"%2\" does not name \"%3\"").arg(what, msg, part)));
    return;
  }
  QFAIL(qPrintable(QString("%1: did not throw").arg(what)));
}

Vec ref_bn_train(const Vec& x, const Vec& g, const Vec& b, int64_t n, int64_t c, int64_t hw, double eps,
                 Vec* mean_out = nullptr, Vec* var_out = nullptr) {
  Vec y(x.size());
  for (int64_t ch = 0; ch < c; ++ch) {
    double m = 0, v = 0;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) m += x[(i * c + ch) * hw + j];
    m /= static_cast<double>(n * hw);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) v += std::pow(x[(i * c + ch) * hw + j] - m, 2);
    v /= static_cast<double>(n * hw);
    if (mean_out) (*mean_out)[ch] = m;
    if (var_out) (*var_out)[ch] = v;
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < hw; ++j) {
        const size_t at = (i * c + ch) * hw + j;
        y[at] = g[ch] * (x[at] - m) / std::sqrt(v + eps) + b[ch];
      }
  }
  return y;
}

Vec ref_pool(const Vec& x, int64_t planes, int64_t h, int64_t w, const Pool2dOptions& o) {
  const int64_t oh = (h + 2 * o.padding - o.kernel) / o.stride + 1,
                ow = (w + 2 * o.padding - o.kernel) / o.stride + 1;
  Vec y(planes * oh * ow);
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t oy = 0; oy < oh; ++oy)
      for (int64_t ox = 0; ox < ow; ++ox) {
        double acc = o.kind == PoolKind::Max ? -1e300 : 0;
        for (int64_t ky = 0; ky < o.kernel; ++ky)
          for (int64_t kx = 0; kx < o.kernel; ++kx) {
            const int64_t iy = oy * o.stride - o.padding + ky, ix = ox * o.stride - o.padding + kx;
            if (iy < 0 || iy >= h || ix < 0 || ix >= w) continue;
            const double v = x[(p * h + iy) * w + ix];
            acc = o.kind == PoolKind::Max ? std::max(acc, v) : acc + v;
          }
        y[(p * oh + oy) * ow + ox] =
            o.kind == PoolKind::Max ? acc : acc / static_cast<double>(o.kernel * o.kernel);
      }
  return y;
}

double ref_ce(const Vec& z, const std::vector<int>& labels, int64_t classes, Vec* grad = nullptr,
              int* correct = nullptr) {
  const int64_t n = static_cast<int64_t>(labels.size());
  double loss = 0;
  if (correct) *correct = 0;
  for (int64_t i = 0; i < n; ++i) {
    double mx = z[i * classes];
    int64_t arg = 0;
    for (int64_t j = 1; j < classes; ++j)
      if (z[i * classes + j] > mx) mx = z[i * classes + j], arg = j;
    double se = 0;
    for (int64_t j = 0; j < classes; ++j) se += std::exp(z[i * classes + j] - mx);
    const double lse = mx + std::log(se);
    loss += lse - z[i * classes + labels[i]];
    if (correct && arg == labels[i]) ++*correct;
    if (grad)
      for (int64_t j = 0; j < classes; ++j)
        (*grad)[i * classes + j] =
            (std::exp(z[i * classes + j] - lse) - (j == labels[i])) / static_cast<double>(n);
  }
  return loss / static_cast<double>(n);
}

}  // namespace

class NnLayersTest : public QObject {
  Q_OBJECT

  std::unique_ptr<Runtime> rt_;

  Device device_ = Device::cpu();

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>(RuntimeOptions{.cpu_devices = 2});
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("layers on %s", device_.str().c_str());
  }
  void cleanupTestCase() { rt_.reset(); }

  void linear_forward_and_gradients() {
    const Device d = device_;
    const int64_t n = 5, in = 7, out = 4;
    Vec x = random_vec(n * in, 1), w = random_vec(out * in, 2), b = random_vec(out, 3),
        r = random_vec(n * out, 4);
    Tensor tx = make(*rt_, d, {n, in}, x), tw = make(*rt_, d, {out, in}, w), tb = make(*rt_, d, {out}, b);
    Tensor y = linear(tx, tw, tb);
    QCOMPARE(y.shape(), (Shape{n, out}));
    QCOMPARE(y.device(), d);
    expect_close(to_d(to_host(y)), ref_linear(x, w, b, n, in, out), 1e-5, 1e-5, "linear forward");
    LinearGrads g = linear_backward(tx, tw, make(*rt_, d, {n, out}, r));
    auto f = [&](const std::vector<Vec>& v) { return ref_linear(v[0], v[1], v[2], n, in, out); };
    check_grad(f, {x, w, b}, 0, r, to_d(to_host(g.dx)), "linear dx");
    check_grad(f, {x, w, b}, 1, r, to_d(to_host(g.dw)), "linear dw");
    check_grad(f, {x, w, b}, 2, r, to_d(to_host(g.db)), "linear db");
    QVERIFY(!linear_backward(tx, tw, make(*rt_, d, {n, out}, r), false).dx.defined());
  }

  void linear_without_bias() {
    const Device d = device_;
    const int64_t n = 6, in = 5, out = 3;
    Vec x = random_vec(n * in, 5), w = random_vec(out * in, 6), r = random_vec(n * out, 7);
    const Vec zero_bias(out, 0.0);
    Tensor tx = make(*rt_, d, {n, in}, x), tw = make(*rt_, d, {out, in}, w);
    Tensor y = linear(tx, tw, Tensor());
    QCOMPARE(y.shape(), (Shape{n, out}));
    expect_close(to_d(to_host(y)), ref_linear(x, w, zero_bias, n, in, out), 1e-5, 1e-5,
                 "linear forward, no bias");
    LinearGrads g = linear_backward(tx, tw, make(*rt_, d, {n, out}, r), true, false);
    QVERIFY(!g.db.defined());
    auto f = [&](const std::vector<Vec>& v) { return ref_linear(v[0], v[1], zero_bias, n, in, out); };
    check_grad(f, {x, w}, 0, r, to_d(to_host(g.dx)), "linear dx, no bias");
    check_grad(f, {x, w}, 1, r, to_d(to_host(g.dw)), "linear dw, no bias");
  }

  void conv2d_forward_and_gradients_data() {
    QTest::addColumn<int>("c");
    QTest::addColumn<int>("k");
    QTest::addColumn<int>("r");
    QTest::addColumn<int>("stride");
    QTest::addColumn<int>("pad");
    QTest::addColumn<int>("hw");
    QTest::addColumn<int>("groups");
    QTest::addColumn<bool>("bias");
    QTest::newRow("3x3 pad 1") << 3 << 4 << 3 << 1 << 1 << 6 << 1 << true;
    QTest::newRow("3x3 stride 2 pad 1") << 4 << 5 << 3 << 2 << 1 << 7 << 1 << true;
    QTest::newRow("1x1 stride 2 (projection)") << 4 << 6 << 1 << 2 << 0 << 6 << 1 << true;
    QTest::newRow("5x5 pad 2 one channel (lenet 1)") << 1 << 6 << 5 << 1 << 2 << 8 << 1 << true;
    QTest::newRow("5x5 no pad (lenet 2)") << 6 << 3 << 5 << 1 << 0 << 9 << 1 << true;
    QTest::newRow("16 channels (blocked layouts)") << 16 << 16 << 3 << 1 << 1 << 5 << 1 << true;
    QTest::newRow("3x3 stride 2 pad 1 groups 2") << 4 << 6 << 3 << 2 << 1 << 7 << 2 << true;
    QTest::newRow("3x3 groups 2 no bias") << 4 << 6 << 3 << 1 << 1 << 6 << 2 << false;
    QTest::newRow("1x1 groups 2 (plain layout)") << 6 << 4 << 1 << 1 << 0 << 5 << 2 << true;
    QTest::newRow("depthwise 3x3 pad 1") << 5 << 5 << 3 << 1 << 1 << 6 << 5 << true;
    QTest::newRow("depthwise x2 stride 2 pad 1 no bias") << 4 << 8 << 3 << 2 << 1 << 7 << 4 << false;
    QTest::newRow("depthwise 16 channels (blocked layouts)") << 16 << 16 << 3 << 1 << 1 << 5 << 16 << true;
    QTest::newRow("3x3 pad 1 no bias") << 3 << 4 << 3 << 1 << 1 << 6 << 1 << false;
  }
  void conv2d_forward_and_gradients() {
    const Device d = device_;
    QFETCH(int, c);
    QFETCH(int, k);
    QFETCH(int, r);
    QFETCH(int, stride);
    QFETCH(int, pad);
    QFETCH(int, hw);
    QFETCH(int, groups);
    QFETCH(bool, bias);
    ConvDims cd{2, c, hw, hw, k, r, stride, pad, groups};
    Vec x = random_vec(cd.n * c * hw * hw, 11), w = random_vec(k * cd.group_c() * r * r, 12, -0.5, 0.5),
        b = bias ? random_vec(k, 13) : Vec();
    Vec rr = random_vec(cd.n * k * cd.oh() * cd.ow(), 14);
    Tensor tx = make(*rt_, d, {cd.n, c, hw, hw}, x), tw = make(*rt_, d, {k, cd.group_c(), r, r}, w),
           tb = bias ? make(*rt_, d, {k}, b) : Tensor();
    Conv2dOptions o{stride, pad, groups};
    Tensor y = conv2d(tx, tw, tb, o);
    QCOMPARE(y.shape(), (Shape{cd.n, k, cd.oh(), cd.ow()}));
    expect_close(to_d(to_host(y)), ref_conv(x, w, b, cd), 1e-4, 1e-4, "conv2d forward");
    Conv2dGrads g = conv2d_backward(tx, tw, make(*rt_, d, y.shape(), rr), o, true, bias);
    auto f = [&](const std::vector<Vec>& v) { return ref_conv(v[0], v[1], bias ? v[2] : Vec(), cd); };
    check_grad(f, {x, w, b}, 0, rr, to_d(to_host(g.dx)), "conv2d dx");
    check_grad(f, {x, w, b}, 1, rr, to_d(to_host(g.dw)), "conv2d dw");
    if (bias) {
      check_grad(f, {x, w, b}, 2, rr, to_d(to_host(g.db)), "conv2d db");
    } else {
      QVERIFY(!g.db.defined());
    }
    // Without dx, the weight gradient is the same.
    Conv2dGrads g2 = conv2d_backward(tx, tw, make(*rt_, d, y.shape(), rr), o, false, bias);
    QVERIFY(!g2.dx.defined());
    expect_close(to_d(to_host(g2.dw)), to_d(to_host(g.dw)), 1e-6, 1e-5, "conv2d dw without dx");
  }

  void conv2d_rejects_bad_groups() {
    const Device d = device_;
    Tensor x = zeros(*rt_, {1, 6, 5, 5}, d);
    Tensor w6 = zeros(*rt_, {6, 2, 3, 3}, d), w4 = zeros(*rt_, {4, 2, 3, 3}, d);
    expect_throw_naming<ShapeError>("input channels not a multiple of groups", {"6", "4"}, [&] {
      conv2d(x, w6, Tensor(), {1, 1, 4});
    });
    expect_throw_naming<ShapeError>("output channels not a multiple of groups", {"4", "3"}, [&] {
      conv2d(x, w4, Tensor(), {1, 1, 3});
    });
    expect_throw_naming<ShapeError>("weight of the wrong group width", {"[6, 2, 3, 3]", "[1, 6, 5, 5]"}, [&] {
      conv2d(x, w6, Tensor(), {1, 1, 2});
    });
    QVERIFY_THROWS_EXCEPTION(Error, conv2d(x, zeros(*rt_, {6, 6, 3, 3}, d), Tensor(), {1, 1, 0}));
    QVERIFY_THROWS_EXCEPTION(ShapeError,
                             conv2d(x, zeros(*rt_, {6, 3, 3, 3}, d), zeros(*rt_, {5}, d), {1, 1, 2}));
    QVERIFY_THROWS_EXCEPTION(ShapeError, conv2d_backward(x, zeros(*rt_, {6, 2, 3, 3}, d),
                                                         zeros(*rt_, {1, 6, 3, 3}, d), {1, 0, 4}));
  }

  void batchnorm2d_training_gradients_and_running_stats_data() {
    QTest::addColumn<bool>("one_d");
    QTest::newRow("[N, C, H, W]") << false;
    QTest::newRow("[N, C] (BatchNorm1d)") << true;
  }
  void batchnorm2d_training_gradients_and_running_stats() {
    const Device d = device_;
    QFETCH(bool, one_d);
    // BatchNorm1d normalises each feature over the batch alone: a bigger batch, planes of one value.
    const int64_t n = one_d ? 9 : 3, c = 4, h = one_d ? 1 : 3, w = one_d ? 1 : 5, hw = h * w;
    const Shape shape = one_d ? Shape{n, c} : Shape{n, c, h, w};
    Vec x = random_vec(n * c * hw, 21, -2, 3), g = random_vec(c, 22, 0.5, 1.5), b = random_vec(c, 23);
    Vec r = random_vec(n * c * hw, 24);
    Tensor rm = zeros(*rt_, {c}, d), rv = ones(*rt_, {c}, d);
    BatchNormOptions o;  // training, momentum 0.1, eps 1e-5
    Tensor tx = make(*rt_, d, shape, x), tg = make(*rt_, d, {c}, g);
    BatchNormResult res = batchnorm2d(tx, tg, make(*rt_, d, {c}, b), rm, rv, o);
    QCOMPARE(res.y.shape(), shape);
    Vec mean(c), var(c);
    expect_close(to_d(to_host(res.y)), ref_bn_train(x, g, b, n, c, hw, o.eps, &mean, &var), 1e-5, 1e-4,
                 "bn forward");
    // PyTorch's update: the unbiased batch variance goes into running_var.
    Vec want_rm(c), want_rv(c);
    for (int64_t i = 0; i < c; ++i) {
      want_rm[i] = 0.1 * mean[i];
      want_rv[i] = 0.9 + 0.1 * var[i] * (n * hw) / (n * hw - 1.0);
    }
    expect_close(to_d(to_host(rm)), want_rm, 1e-6, 1e-5, "running_mean");
    expect_close(to_d(to_host(rv)), want_rv, 1e-6, 1e-5, "running_var");
    BatchNormGrads gr = batchnorm2d_backward(tx, make(*rt_, d, shape, r), tg, res.save_mean, res.save_invstd);
    QCOMPARE(gr.dx.shape(), shape);
    auto f = [&](const std::vector<Vec>& v) { return ref_bn_train(v[0], v[1], v[2], n, c, hw, o.eps); };
    check_grad(f, {x, g, b}, 0, r, to_d(to_host(gr.dx)), "bn dx");
    check_grad(f, {x, g, b}, 1, r, to_d(to_host(gr.dgamma)), "bn dgamma");
    check_grad(f, {x, g, b}, 2, r, to_d(to_host(gr.dbeta)), "bn dbeta");
  }

  void batchnorm2d_eval_uses_running_stats_data() {
    QTest::addColumn<bool>("one_d");
    QTest::newRow("[N, C, H, W]") << false;
    QTest::newRow("[N, C] (BatchNorm1d)") << true;
  }
  void batchnorm2d_eval_uses_running_stats() {
    const Device d = device_;
    QFETCH(bool, one_d);
    const int64_t n = 2, c = 3, hw = one_d ? 1 : 4;
    const Shape shape = one_d ? Shape{n, c} : Shape{n, c, 2, 2};
    Vec x = random_vec(n * c * hw, 31), g = {1.0, 2.0, 0.5}, b = {0.0, 1.0, -1.0}, m = {0.5, -0.25, 1.0},
        v = {1.0, 4.0, 0.25};
    Tensor rm = make(*rt_, d, {c}, m), rv = make(*rt_, d, {c}, v);
    BatchNormResult res = batchnorm2d(make(*rt_, d, shape, x), make(*rt_, d, {c}, g), make(*rt_, d, {c}, b),
                                      rm, rv, {.training = false});
    QVERIFY(!res.save_mean.defined());
    Vec want(x.size());
    for (int64_t i = 0; i < n; ++i)
      for (int64_t ch = 0; ch < c; ++ch)
        for (int64_t j = 0; j < hw; ++j) {
          const size_t at = (i * c + ch) * hw + j;
          want[at] = g[ch] * (x[at] - m[ch]) / std::sqrt(v[ch] + 1e-5) + b[ch];
        }
    expect_close(to_d(to_host(res.y)), want, 1e-5, 1e-5, "bn eval");
    expect_close(to_d(to_host(rm)), m, 0, 0, "running_mean untouched in eval");
    expect_close(to_d(to_host(rv)), v, 0, 0, "running_var untouched in eval");
  }

  void batchnorm_rejects_other_ranks_and_single_values() {
    const Device d = device_;
    Tensor p = ones(*rt_, {3}, d);
    QVERIFY_THROWS_EXCEPTION(ShapeError, batchnorm2d(zeros(*rt_, {2, 3, 4}, d), p, p, p, p));
    QVERIFY_THROWS_EXCEPTION(ShapeError, batchnorm2d(zeros(*rt_, {2, 4}, d), p, p, p, p));
    // One sample of [N, C] has no batch variance to normalise with, as in PyTorch; eval mode is fine.
    QVERIFY_THROWS_EXCEPTION(ShapeError, batchnorm2d(zeros(*rt_, {1, 3}, d), p, p, p, p));
    BatchNormResult eval =
        batchnorm2d(zeros(*rt_, {1, 3}, d), p, p, zeros(*rt_, {3}, d), p, {.training = false});
    QCOMPARE(eval.y.shape(), (Shape{1, 3}));
    QVERIFY_THROWS_EXCEPTION(
        ShapeError, batchnorm2d_backward(zeros(*rt_, {2, 3, 4}, d), zeros(*rt_, {2, 3, 4}, d), p, p, p));
  }

  void activations_data() {
    QTest::addColumn<int>("kind");
    QTest::newRow("relu") << static_cast<int>(Activation::Relu);
    QTest::newRow("sigmoid") << static_cast<int>(Activation::Sigmoid);
    QTest::newRow("tanh") << static_cast<int>(Activation::Tanh);
    QTest::newRow("gelu") << static_cast<int>(Activation::Gelu);
  }
  void activations() {
    const Device d = device_;
    QFETCH(int, kind);
    const auto k = static_cast<Activation>(kind);
    // Away from relu's kink, where the finite difference is meaningless.
    Vec x = random_vec(300, 41, -4, 4);
    for (auto& v : x)
      if (std::abs(v) < 1e-2) v = 0.5;
    Vec r = random_vec(300, 42);
    auto f = [&](const std::vector<Vec>& in) {
      Vec y(in[0].size());
      for (size_t i = 0; i < y.size(); ++i) y[i] = ref_activation(k, in[0][i]);
      return y;
    };
    Tensor tx = make(*rt_, d, {3, 100}, x), tr = make(*rt_, d, {3, 100}, r);
    Tensor y = activation(k, tx);
    QCOMPARE(y.shape(), tx.shape());
    expect_close(to_d(to_host(y)), f({x}), 1e-6, 1e-5, "activation forward");
    // Only the tensor the derivative needs: x for GELU, y for the others.
    const bool gelu = k == Activation::Gelu;
    Tensor dx = activation_backward(k, gelu ? tx : Tensor(), gelu ? Tensor() : y, tr);
    check_grad(f, {x}, 0, r, to_d(to_host(dx)), "activation dx", 1e-5, 1e-3, 300);
    // Passing both changes nothing.
    QCOMPARE(to_host(activation_backward(k, tx, y, tr)), to_host(dx));
    // The one it needs missing is an error, not a wild read.
    QVERIFY_THROWS_EXCEPTION(Error, activation_backward(k, gelu ? Tensor() : tx, gelu ? y : Tensor(), tr));
    QVERIFY_THROWS_EXCEPTION(ShapeError, activation_backward(k, tx, y, make(*rt_, d, {300}, r)));
  }

  void activation_names() {
    QCOMPARE(QString(activation_name(Activation::Relu)), QString("ReLU"));
    QCOMPARE(QString(activation_name(Activation::Sigmoid)), QString("Sigmoid"));
    QCOMPARE(QString(activation_name(Activation::Tanh)), QString("Tanh"));
    QCOMPARE(QString(activation_name(Activation::Gelu)), QString("GELU"));
  }

  void pooling_data() {
    QTest::addColumn<int>("kind");
    QTest::addColumn<int>("kernel");
    QTest::addColumn<int>("stride");
    QTest::addColumn<int>("pad");
    QTest::newRow("avg 2/2 (lenet)") << static_cast<int>(PoolKind::Avg) << 2 << 2 << 0;
    QTest::newRow("max 2/2") << static_cast<int>(PoolKind::Max) << 2 << 2 << 0;
    QTest::newRow("max 3/2 pad 1 (overlapping)") << static_cast<int>(PoolKind::Max) << 3 << 2 << 1;
    QTest::newRow("avg 3/1 pad 1") << static_cast<int>(PoolKind::Avg) << 3 << 1 << 1;
    QTest::newRow("avg 3/2 pad 1 (counts padding)") << static_cast<int>(PoolKind::Avg) << 3 << 2 << 1;
    QTest::newRow("max 2/1 pad 1") << static_cast<int>(PoolKind::Max) << 2 << 1 << 1;
    QTest::newRow("avg 2/2 pad 1") << static_cast<int>(PoolKind::Avg) << 2 << 2 << 1;
  }
  void pooling() {
    const Device d = device_;
    QFETCH(int, kind);
    QFETCH(int, kernel);
    QFETCH(int, stride);
    QFETCH(int, pad);
    Pool2dOptions o{static_cast<PoolKind>(kind), kernel, stride, pad};
    const int64_t n = 2, c = 3, h = 7, w = 6;
    // Distinct values, so that max pooling has no ties for finite differences to straddle.
    Vec x(n * c * h * w);
    std::mt19937 g(51);
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(static_cast<double>(i) * 0.01);
    std::shuffle(x.begin(), x.end(), g);
    Tensor tx = make(*rt_, d, {n, c, h, w}, x);
    Tensor y = pool2d(tx, o);
    auto f = [&](const std::vector<Vec>& v) { return ref_pool(v[0], n * c, h, w, o); };
    Vec want = f({x});
    QCOMPARE(y.numel(), static_cast<int64_t>(want.size()));
    expect_close(to_d(to_host(y)), want, 1e-6, 1e-5, "pool forward");
    Vec r = random_vec(want.size(), 52);
    Tensor dx = pool2d_backward(tx, y, make(*rt_, d, y.shape(), r), o);
    check_grad(f, {x}, 0, r, to_d(to_host(dx)), "pool dx", 1e-5, 1e-3, 300, 1e-3);
  }

  void global_avg_pool_and_flatten() {
    const Device d = device_;
    const int64_t n = 2, c = 5, h = 3, w = 4;
    Vec x = random_vec(n * c * h * w, 61), r = random_vec(n * c, 62);
    Tensor tx = make(*rt_, d, {n, c, h, w}, x);
    Tensor y = global_avg_pool(tx);
    QCOMPARE(y.shape(), (Shape{n, c, 1, 1}));
    auto f = [&](const std::vector<Vec>& v) {
      Vec out(n * c, 0.0);
      for (int64_t p = 0; p < n * c; ++p) {
        for (int64_t j = 0; j < h * w; ++j) out[p] += v[0][p * h * w + j];
        out[p] /= h * w;
      }
      return out;
    };
    expect_close(to_d(to_host(y)), f({x}), 1e-6, 1e-5, "gap forward");
    Tensor dx = global_avg_pool_backward(make(*rt_, d, {n, c, 1, 1}, r), tx.shape());
    check_grad(f, {x}, 0, r, to_d(to_host(dx)), "gap dx");
    Tensor flat = flatten(y);
    QCOMPARE(flat.shape(), (Shape{n, c}));
    expect_close(to_d(to_host(flat)), to_d(to_host(y)), 0, 0, "flatten keeps the values");
    QVERIFY_THROWS_EXCEPTION(ShapeError, reshape(y, {3, 3}));
  }

  void flatten_keeps_row_major_order_and_reshape_inverts_it() {
    const Device d = device_;
    const int64_t n = 2, c = 3, h = 4, w = 5;
    Vec x = random_vec(n * c * h * w, 65);
    Tensor tx = make(*rt_, d, {n, c, h, w}, x);
    Tensor flat = flatten(tx);
    QCOMPARE(flat.shape(), (Shape{n, c * h * w}));
    expect_close(to_d(to_host(flat)), x, 0, 0, "flatten forward");
    // Backward is the reshape back: the gradient keeps its values and regains x's shape.
    Vec r = random_vec(n * c * h * w, 66);
    Tensor dx = reshape(make(*rt_, d, flat.shape(), r), tx.shape());
    QCOMPARE(dx.shape(), tx.shape());
    expect_close(to_d(to_host(dx)), r, 0, 0, "flatten backward");
    QVERIFY_THROWS_EXCEPTION(ShapeError, flatten(Tensor()));
  }

  void dropout_mask_statistics_and_backward() {
    const Device d = device_;
    const int64_t n = 200000;
    const float p = 0.3f;
    const uint64_t seed = 1234;
    Vec x = random_vec(n, 67, 0.5, 2.0);  // no zeros, so a dropped value is told from a kept one
    Tensor tx = make(*rt_, d, {400, 500}, x);
    DropoutResult r = dropout(tx, p, seed);
    QCOMPARE(r.y.shape(), tx.shape());
    QCOMPARE(r.mask.shape(), tx.shape());
    const std::vector<float> y = to_host(r.y), mask = to_host(r.mask);
    const float scale = 1.0f / (1.0f - p);
    int64_t kept = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (mask[i] != 0.0f && mask[i] != scale)
        QFAIL(qPrintable(QString("mask[%1] is %2, neither 0 nor 1/(1-p)").arg(i).arg(mask[i], 0, 'g', 9)));
      // The documented draw, so every device keeps exactly these elements.
      const bool want_kept = philox::uniform_at(seed, static_cast<uint64_t>(i), 0, 1) <= 1.0f - p;
      if ((mask[i] != 0.0f) != want_kept) QFAIL(qPrintable(QString("mask[%1] disagrees with Philox").arg(i)));
      if (y[i] != static_cast<float>(x[i]) * mask[i]) QFAIL(qPrintable(QString("y[%1] != x * mask").arg(i)));
      kept += mask[i] != 0.0f;
    }
    // The kept fraction is Binomial(n, 0.7) / n: its standard deviation is 0.001, so 0.005 is five of them.
    const double fraction = static_cast<double>(kept) / n;
    QVERIFY2(std::abs(fraction - (1.0 - p)) < 0.005, qPrintable(QString("kept %1").arg(fraction)));
    // Same seed, same mask; another seed, another mask.
    QCOMPARE(to_host(dropout(tx, p, seed).mask), mask);
    QVERIFY(to_host(dropout(tx, p, seed + 1).mask) != mask);
    // Backward multiplies by the mask: dx = dy * mask exactly.
    Vec dy = random_vec(n, 68);
    const std::vector<float> dx = to_host(dropout_backward(make(*rt_, d, tx.shape(), dy), r.mask));
    for (int64_t i = 0; i < n; ++i)
      if (dx[i] != static_cast<float>(dy[i]) * mask[i])
        QFAIL(qPrintable(QString("dx[%1] != dy * mask").arg(i)));
  }

  void dropout_gradient_and_limits() {
    const Device d = device_;
    // For a fixed mask dropout is linear: the finite differences of x -> x * mask give the backward.
    Vec x = random_vec(60, 69), r = random_vec(60, 70);
    Tensor tx = make(*rt_, d, {6, 10}, x);
    DropoutResult res = dropout(tx, 0.5f, 9);
    const Vec mask = to_d(to_host(res.mask));
    auto f = [&](const std::vector<Vec>& v) {
      Vec out(v[0].size());
      for (size_t i = 0; i < out.size(); ++i) out[i] = v[0][i] * mask[i];
      return out;
    };
    expect_close(to_d(to_host(res.y)), f({x}), 0, 1e-7, "dropout forward");
    check_grad(f, {x}, 0, r, to_d(to_host(dropout_backward(make(*rt_, d, {6, 10}, r), res.mask))),
               "dropout dx");
    // p = 0 keeps everything unscaled.
    DropoutResult none = dropout(tx, 0.0f, 9);
    QCOMPARE(to_host(none.y), to_f(x));
    QCOMPARE(to_host(none.mask), std::vector<float>(60, 1.0f));
    for (float bad : {-0.1f, 1.0f, 1.5f, std::nanf("")}) QVERIFY_THROWS_EXCEPTION(Error, dropout(tx, bad, 9));
    QVERIFY_THROWS_EXCEPTION(ShapeError, dropout_backward(tx, zeros(*rt_, {60}, d)));
  }

  void concat_and_split_channels_data() {
    QTest::addColumn<bool>("image");
    QTest::newRow("[N, C, H, W]") << true;
    QTest::newRow("[N, C]") << false;
  }
  void concat_and_split_channels() {
    const Device d = device_;
    QFETCH(bool, image);
    const int64_t n = 3, ca = 2, cb = 5, hw = image ? 6 : 1;
    const Shape sa = image ? Shape{n, ca, 2, 3} : Shape{n, ca},
                sb = image ? Shape{n, cb, 2, 3} : Shape{n, cb};
    Vec a = random_vec(n * ca * hw, 71), b = random_vec(n * cb * hw, 72);
    Tensor ta = make(*rt_, d, sa, a), tb = make(*rt_, d, sb, b);
    Tensor y = concat_channels(ta, tb);
    Shape sy = sa;
    sy[1] = ca + cb;
    QCOMPARE(y.shape(), sy);
    QCOMPARE(y.device(), d);
    expect_close(to_d(to_host(y)), ref_concat(a, b, n), 0, 0, "concat forward");
    // split inverts concat, exactly.
    auto [back_a, back_b] = split_channels(y, ca);
    QCOMPARE(back_a.shape(), sa);
    QCOMPARE(back_b.shape(), sb);
    QCOMPARE(to_host(back_a), to_f(a));
    QCOMPARE(to_host(back_b), to_f(b));
    // split is concat's backward: check it against finite differences of the reference.
    Vec r = random_vec(n * (ca + cb) * hw, 73);
    auto [da, db] = split_channels(make(*rt_, d, sy, r), ca);
    auto f = [&](const std::vector<Vec>& v) { return ref_concat(v[0], v[1], n); };
    check_grad(f, {a, b}, 0, r, to_d(to_host(da)), "concat da");
    check_grad(f, {a, b}, 1, r, to_d(to_host(db)), "concat db");
  }

  void concat_and_split_with_an_empty_side() {
    const Device d = device_;
    Vec b = random_vec(2 * 3 * 4, 74);
    Tensor tb = make(*rt_, d, {2, 3, 4}, b);
    Tensor y = concat_channels(zeros(*rt_, {2, 0, 4}, d), tb);
    QCOMPARE(y.shape(), (Shape{2, 3, 4}));
    QCOMPARE(to_host(y), to_f(b));
    auto [none, all] = split_channels(tb, 0);
    QCOMPARE(none.shape(), (Shape{2, 0, 4}));
    QCOMPARE(to_host(all), to_f(b));
    auto [all2, none2] = split_channels(tb, 3);
    QCOMPARE(none2.numel(), int64_t{0});
    QCOMPARE(to_host(all2), to_f(b));
  }

  void concat_and_split_reject_mismatched_shapes() {
    const Device d = device_;
    expect_throw_naming<ShapeError>("concat of different batches", {"[2, 3, 4, 4]", "[3, 3, 4, 4]"}, [&] {
      concat_channels(zeros(*rt_, {2, 3, 4, 4}, d), zeros(*rt_, {3, 3, 4, 4}, d));
    });
    expect_throw_naming<ShapeError>("concat of different planes", {"[2, 3, 4, 4]", "[2, 3, 4, 5]"}, [&] {
      concat_channels(zeros(*rt_, {2, 3, 4, 4}, d), zeros(*rt_, {2, 3, 4, 5}, d));
    });
    expect_throw_naming<ShapeError>("concat of different ranks", {"[2, 3]", "[2, 3, 1]"}, [&] {
      concat_channels(zeros(*rt_, {2, 3}, d), zeros(*rt_, {2, 3, 1}, d));
    });
    expect_throw_naming<ShapeError>("concat without a channel axis", {"[6]"},
                                    [&] { concat_channels(zeros(*rt_, {6}, d), zeros(*rt_, {6}, d)); });
    QVERIFY_THROWS_EXCEPTION(ShapeError, split_channels(zeros(*rt_, {2, 3, 4}, d), 4));
    QVERIFY_THROWS_EXCEPTION(ShapeError, split_channels(zeros(*rt_, {2, 3, 4}, d), -1));
    QVERIFY_THROWS_EXCEPTION(ShapeError, split_channels(zeros(*rt_, {6}, d), 1));
  }

  void residual_add_gradient_reaches_both_branches() {
    const Device d = device_;
    // out = relu(a + b): the gradient of the add is dy on both inputs.
    Vec a = random_vec(40, 71), b = random_vec(40, 72), r = random_vec(40, 73);
    for (size_t i = 0; i < a.size(); ++i)
      if (std::abs(a[i] + b[i]) < 1e-2) a[i] += 0.1;
    Tensor sum = add(make(*rt_, d, {4, 10}, a), make(*rt_, d, {4, 10}, b));
    Vec want_sum(a.size());
    for (size_t i = 0; i < a.size(); ++i) want_sum[i] = a[i] + b[i];
    expect_close(to_d(to_host(sum)), want_sum, 1e-7, 1e-7, "add forward");
    Tensor y = activation(Activation::Relu, sum);
    Tensor g = activation_backward(Activation::Relu, Tensor(), y, make(*rt_, d, {4, 10}, r));
    auto f = [&](const std::vector<Vec>& v) {
      Vec out(v[0].size());
      for (size_t i = 0; i < out.size(); ++i) out[i] = std::max(0.0, v[0][i] + v[1][i]);
      return out;
    };
    const Vec gv = to_d(to_host(g));
    check_grad(f, {a, b}, 0, r, gv, "residual da");
    check_grad(f, {a, b}, 1, r, gv, "residual db");
  }

  void softmax_cross_entropy_matches_and_is_stable() {
    const Device d = device_;
    const int64_t n = 6, classes = 5;
    Vec z = random_vec(n * classes, 81, -3, 3);
    std::vector<int> labels = {0, 4, 2, 2, 1, 3};
    Vec lab(labels.begin(), labels.end());
    Tensor tz = make(*rt_, d, {n, classes}, z), tl = make(*rt_, d, {n}, lab);
    CrossEntropy ce = softmax_cross_entropy(tz, tl);
    Vec grad(n * classes);
    int correct = 0;
    const double want = ref_ce(z, labels, classes, &grad, &correct);
    QVERIFY(std::abs(item(ce.loss) - want) < 1e-5);
    auto stats = to_host(ce.stats);
    QVERIFY(std::abs(stats[0] - want * n) < 1e-4);
    QCOMPARE(static_cast<int>(stats[1]), correct);
    expect_close(to_d(to_host(ce.dlogits)), grad, 1e-6, 1e-4, "dlogits");
    auto f = [&](const std::vector<Vec>& v) { return Vec{ref_ce(v[0], labels, classes)}; };
    check_grad(f, {z}, 0, {1.0}, to_d(to_host(ce.dlogits)), "ce dlogits (finite differences)");
    // Logits of 1000 would overflow a naive exp; the shifted form stays finite and exact.
    Vec big = z;
    for (auto& v : big) v += 1000;
    CrossEntropy ce2 = softmax_cross_entropy(make(*rt_, d, {n, classes}, big), tl, false);
    QVERIFY(std::isfinite(item(ce2.loss)));
    QVERIFY(std::abs(item(ce2.loss) - want) < 1e-3);
    QVERIFY(!ce2.dlogits.defined());
    // A gradient scale other than 1/N (data-parallel replicas use 1/total batch).
    CrossEntropy ce3 = softmax_cross_entropy(tz, tl, true, 0.5f);
    Vec g3 = to_d(to_host(ce3.dlogits));
    for (size_t i = 0; i < grad.size(); ++i) QVERIFY(std::abs(g3[i] - grad[i] * n * 0.5) < 1e-5);
    // A label outside the classes is an error, not a wild read.
    CrossEntropy bad = softmax_cross_entropy(tz, make(*rt_, d, {n}, Vec{0, 1, 2, 3, 4, 7}));
    QVERIFY_THROWS_EXCEPTION(Error, to_host(bad.loss));
  }

  void sgd_momentum_and_weight_decay() {
    const Device d = device_;
    Vec p = random_vec(50, 91), g = random_vec(50, 92);
    Tensor tp = make(*rt_, d, {50}, p), tg = make(*rt_, d, {50}, g);
    OptimizerOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.weight_decay = 0.01;
    std::vector<OptimizerState> buf(1);
    optimizer_step({tp}, {tg}, buf, o, o.lr, 1);
    optimizer_step({tp}, {tg}, buf, o, o.lr, 2);
    // PyTorch: d = g + wd p; buf = m buf + d (buf = d at first); p -= lr buf.
    Vec want = p, b(50, 0.0);
    for (int step = 0; step < 2; ++step)
      for (size_t i = 0; i < p.size(); ++i) {
        const double dd = g[i] + 0.01 * want[i];
        b[i] = step == 0 ? dd : 0.9 * b[i] + dd;
        want[i] -= 0.1 * b[i];
      }
    expect_close(to_d(to_host(tp)), want, 1e-6, 1e-5, "sgd with momentum");
    Tensor tp2 = make(*rt_, d, {50}, p);
    std::vector<OptimizerState> none(1);
    optimizer_step({tp2}, {tg}, none, OptimizerOptions{.lr = 0.5}, 0.5, 1);
    Vec want2(50);
    for (size_t i = 0; i < p.size(); ++i) want2[i] = p[i] - 0.5 * g[i];
    expect_close(to_d(to_host(tp2)), want2, 1e-6, 1e-5, "plain sgd");
    // The whole-model form, one op for every tensor, steps exactly as the one-tensor form.
    const Vec q = random_vec(10, 93), gq = random_vec(10, 94);
    std::vector<Tensor> ps{make(*rt_, d, {50}, p), make(*rt_, d, {10}, q)};
    std::vector<Tensor> gs{tg, make(*rt_, d, {10}, gq)};
    std::vector<OptimizerState> bufs(2);
    std::vector<Tensor> ps1{make(*rt_, d, {50}, p), make(*rt_, d, {10}, q)};
    std::vector<std::vector<OptimizerState>> bufs1(2, std::vector<OptimizerState>(1));
    for (int step = 1; step <= 2; ++step) {
      optimizer_step(ps, gs, bufs, o, o.lr, step);
      for (size_t i = 0; i < 2; ++i) optimizer_step({ps1[i]}, {gs[i]}, bufs1[i], o, o.lr, step);
    }
    for (size_t i = 0; i < 2; ++i) {
      QCOMPARE(to_host(ps[i]), to_host(ps1[i]));
      QCOMPARE(to_host(bufs[i].a), to_host(bufs1[i][0].a));
    }
  }

  void mixing_devices_fails_like_pytorch() {
    const Device d = device_;
    Device other = d.is_cuda() ? Device::cpu() : Device::cpu(1);
    Tensor x = zeros(*rt_, {2, 3, 5, 5}, d), w = zeros(*rt_, {4, 3, 3, 3}, other), b = zeros(*rt_, {4}, d);
    try {
      conv2d(x, w, b);
      QFAIL("conv2d across devices did not throw");
    } catch (const DeviceMismatchError& e) {
      QVERIFY(QString(e.what()).startsWith("Expected all tensors to be on the same device"));
    }
    QVERIFY_THROWS_EXCEPTION(DeviceMismatchError,
                             linear(zeros(*rt_, {2, 3}, d), zeros(*rt_, {4, 3}, other), zeros(*rt_, {4}, d)));
    QVERIFY_THROWS_EXCEPTION(ShapeError,
                             linear(zeros(*rt_, {2, 3}, d), zeros(*rt_, {4, 5}, d), zeros(*rt_, {4}, d)));
    QVERIFY_THROWS_EXCEPTION(
        ShapeError, conv2d(zeros(*rt_, {2, 3, 2, 2}, d), zeros(*rt_, {4, 3, 5, 5}, d), zeros(*rt_, {4}, d)));
    // The new ops follow the same rule, and copy nothing across devices.
    const char* same_device = "Expected all tensors to be on the same device";
    expect_throw_naming<DeviceMismatchError>("concat across devices", {same_device}, [&] {
      concat_channels(zeros(*rt_, {2, 3, 4, 4}, d), zeros(*rt_, {2, 1, 4, 4}, other));
    });
    expect_throw_naming<DeviceMismatchError>("grouped conv2d with the bias elsewhere", {same_device}, [&] {
      conv2d(x, zeros(*rt_, {3, 1, 3, 3}, d), zeros(*rt_, {3}, other), {1, 0, 3});
    });
    expect_throw_naming<DeviceMismatchError>("linear without bias across devices", {same_device}, [&] {
      linear(zeros(*rt_, {2, 3}, d), zeros(*rt_, {4, 3}, other), Tensor());
    });
    expect_throw_naming<DeviceMismatchError>("dropout backward across devices", {same_device}, [&] {
      dropout_backward(zeros(*rt_, {2, 3}, d), ones(*rt_, {2, 3}, other));
    });
    expect_throw_naming<DeviceMismatchError>("gelu backward across devices", {same_device}, [&] {
      activation_backward(Activation::Gelu, zeros(*rt_, {2, 3}, other), Tensor(), zeros(*rt_, {2, 3}, d));
    });
    expect_throw_naming<DeviceMismatchError>("batchnorm1d across devices", {same_device}, [&] {
      Tensor p = ones(*rt_, {3}, d);
      batchnorm2d(zeros(*rt_, {4, 3}, d), p, p, zeros(*rt_, {3}, other), p);
    });
  }

  void layer_ops_show_in_the_profiler_with_flops() {
    const Device d = device_;
    const size_t from = rt_->profiler().span_count();
    {
      ScopedOpTag tag("layer-test");
      Tensor y =
          conv2d(zeros(*rt_, {2, 3, 8, 8}, d), zeros(*rt_, {4, 3, 3, 3}, d), zeros(*rt_, {4}, d), {1, 1});
      to_host(y);
    }
    bool found = false;
    for (const Span& s : rt_->profiler().spans(from))
      if (s.name == "conv2d" && s.tag == "layer-test" && s.device == d) {
        found = true;
        QCOMPARE(s.flops, 2.0 * 2 * 4 * 64 * 27);
        QVERIFY(s.bytes > 0);
      }
    QVERIFY(found);

    // A grouped convolution does 1/groups of the dense one's work; the new ops show under their names.
    const size_t from2 = rt_->profiler().span_count();
    {
      ScopedOpTag tag("layer-test-2");
      Tensor x = zeros(*rt_, {2, 4, 8, 8}, d);
      to_host(conv2d(x, zeros(*rt_, {6, 2, 3, 3}, d), Tensor(), {1, 1, 2}));
      to_host(activation(Activation::Gelu, x));
      to_host(dropout(x, 0.5f, 1).y);
      to_host(concat_channels(x, x));
    }
    std::set<std::string> names;
    for (const Span& s : rt_->profiler().spans(from2)) {
      if (s.tag != "layer-test-2" || s.device != d) continue;
      names.insert(s.name);
      if (s.name == "conv2d") QCOMPARE(s.flops, 2.0 * 2 * 6 * 64 * (2 * 9));
    }
    for (const char* name : {"conv2d", "gelu", "dropout", "concat channels"})
      QVERIFY2(names.count(name), name);
  }
};

QTEST_GUILESS_MAIN(NnLayersTest)
#include "test_nn_layers.moc"
