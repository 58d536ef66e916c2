// Every layer against a naive float64 reference on the host: forward outputs, and gradients against central
// finite differences of that reference. Runs on the device named by GN_TEST_DEVICE (default cpu); CTest runs
// it again as test_nn_layers_cuda on cuda:0 (cuDNN with TF32 off), which skips where there is no GPU.
#include <QtTest>
#include <cmath>
#include <functional>
#include <random>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/ops.h"

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
  int64_t n, c, h, w, k, r, stride, pad;
  int64_t oh() const { return (h + 2 * pad - r) / stride + 1; }
  int64_t ow() const { return (w + 2 * pad - r) / stride + 1; }
};

Vec ref_conv(const Vec& x, const Vec& w, const Vec& b, const ConvDims& d) {
  Vec y(d.n * d.k * d.oh() * d.ow());
  for (int64_t i = 0; i < d.n; ++i)
    for (int64_t o = 0; o < d.k; ++o)
      for (int64_t oy = 0; oy < d.oh(); ++oy)
        for (int64_t ox = 0; ox < d.ow(); ++ox) {
          double s = b[o];
          for (int64_t c = 0; c < d.c; ++c)
            for (int64_t ky = 0; ky < d.r; ++ky)
              for (int64_t kx = 0; kx < d.r; ++kx) {
                const int64_t iy = oy * d.stride - d.pad + ky, ix = ox * d.stride - d.pad + kx;
                if (iy < 0 || iy >= d.h || ix < 0 || ix >= d.w) continue;
                s += x[((i * d.c + c) * d.h + iy) * d.w + ix] * w[((o * d.c + c) * d.r + ky) * d.r + kx];
              }
          y[((i * d.k + o) * d.oh() + oy) * d.ow() + ox] = s;
        }
  return y;
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
    set_cudnn_allow_tf32(false);
    const QByteArray name = qgetenv("GN_TEST_DEVICE");
    if (!name.isEmpty()) {
      auto d = Device::parse(name.toStdString());
      QVERIFY2(d.has_value(), "GN_TEST_DEVICE is not a device name");
      if (d->is_cuda() && rt_->cuda_device_count() <= d->index) QSKIP("no CUDA device here");
      device_ = *d;
    }
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

  void conv2d_forward_and_gradients_data() {
    QTest::addColumn<int>("c");
    QTest::addColumn<int>("k");
    QTest::addColumn<int>("r");
    QTest::addColumn<int>("stride");
    QTest::addColumn<int>("pad");
    QTest::addColumn<int>("hw");
    QTest::newRow("3x3 pad 1") << 3 << 4 << 3 << 1 << 1 << 6;
    QTest::newRow("3x3 stride 2 pad 1") << 4 << 5 << 3 << 2 << 1 << 7;
    QTest::newRow("1x1 stride 2 (projection)") << 4 << 6 << 1 << 2 << 0 << 6;
    QTest::newRow("5x5 pad 2 one channel (lenet 1)") << 1 << 6 << 5 << 1 << 2 << 8;
    QTest::newRow("5x5 no pad (lenet 2)") << 6 << 3 << 5 << 1 << 0 << 9;
    QTest::newRow("16 channels (blocked layouts)") << 16 << 16 << 3 << 1 << 1 << 5;
  }
  void conv2d_forward_and_gradients() {
    const Device d = device_;
    QFETCH(int, c);
    QFETCH(int, k);
    QFETCH(int, r);
    QFETCH(int, stride);
    QFETCH(int, pad);
    QFETCH(int, hw);
    ConvDims cd{2, c, hw, hw, k, r, stride, pad};
    Vec x = random_vec(cd.n * c * hw * hw, 11), w = random_vec(k * c * r * r, 12, -0.5, 0.5),
        b = random_vec(k, 13);
    Vec rr = random_vec(cd.n * k * cd.oh() * cd.ow(), 14);
    Tensor tx = make(*rt_, d, {cd.n, c, hw, hw}, x), tw = make(*rt_, d, {k, c, r, r}, w),
           tb = make(*rt_, d, {k}, b);
    Conv2dOptions o{stride, pad};
    Tensor y = conv2d(tx, tw, tb, o);
    QCOMPARE(y.shape(), (Shape{cd.n, k, cd.oh(), cd.ow()}));
    expect_close(to_d(to_host(y)), ref_conv(x, w, b, cd), 1e-4, 1e-4, "conv2d forward");
    Conv2dGrads g = conv2d_backward(tx, tw, make(*rt_, d, y.shape(), rr), o);
    auto f = [&](const std::vector<Vec>& v) { return ref_conv(v[0], v[1], v[2], cd); };
    check_grad(f, {x, w, b}, 0, rr, to_d(to_host(g.dx)), "conv2d dx");
    check_grad(f, {x, w, b}, 1, rr, to_d(to_host(g.dw)), "conv2d dw");
    check_grad(f, {x, w, b}, 2, rr, to_d(to_host(g.db)), "conv2d db");
  }

  void batchnorm2d_training_gradients_and_running_stats() {
    const Device d = device_;
    const int64_t n = 3, c = 4, h = 3, w = 5, hw = h * w;
    Vec x = random_vec(n * c * hw, 21, -2, 3), g = random_vec(c, 22, 0.5, 1.5), b = random_vec(c, 23);
    Vec r = random_vec(n * c * hw, 24);
    Tensor rm = zeros(*rt_, {c}, d), rv = ones(*rt_, {c}, d);
    BatchNormOptions o;  // training, momentum 0.1, eps 1e-5
    Tensor tx = make(*rt_, d, {n, c, h, w}, x), tg = make(*rt_, d, {c}, g);
    BatchNormResult res = batchnorm2d(tx, tg, make(*rt_, d, {c}, b), rm, rv, o);
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
    BatchNormGrads gr =
        batchnorm2d_backward(tx, make(*rt_, d, {n, c, h, w}, r), tg, res.save_mean, res.save_invstd);
    auto f = [&](const std::vector<Vec>& v) { return ref_bn_train(v[0], v[1], v[2], n, c, hw, o.eps); };
    check_grad(f, {x, g, b}, 0, r, to_d(to_host(gr.dx)), "bn dx");
    check_grad(f, {x, g, b}, 1, r, to_d(to_host(gr.dgamma)), "bn dgamma");
    check_grad(f, {x, g, b}, 2, r, to_d(to_host(gr.dbeta)), "bn dbeta");
  }

  void batchnorm2d_eval_uses_running_stats() {
    const Device d = device_;
    const int64_t n = 2, c = 3, hw = 4;
    Vec x = random_vec(n * c * hw, 31), g = {1.0, 2.0, 0.5}, b = {0.0, 1.0, -1.0}, m = {0.5, -0.25, 1.0},
        v = {1.0, 4.0, 0.25};
    Tensor rm = make(*rt_, d, {c}, m), rv = make(*rt_, d, {c}, v);
    BatchNormResult res = batchnorm2d(make(*rt_, d, {n, c, 2, 2}, x), make(*rt_, d, {c}, g),
                                      make(*rt_, d, {c}, b), rm, rv, {.training = false});
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
  }

  void activations_data() {
    QTest::addColumn<int>("kind");
    QTest::newRow("relu") << static_cast<int>(Activation::Relu);
    QTest::newRow("sigmoid") << static_cast<int>(Activation::Sigmoid);
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
      for (size_t i = 0; i < y.size(); ++i)
        y[i] = k == Activation::Relu ? std::max(0.0, in[0][i]) : 1.0 / (1.0 + std::exp(-in[0][i]));
      return y;
    };
    Tensor y = activation(k, make(*rt_, d, {3, 100}, x));
    expect_close(to_d(to_host(y)), f({x}), 1e-6, 1e-5, "activation forward");
    Tensor dx = activation_backward(k, y, make(*rt_, d, {3, 100}, r));
    check_grad(f, {x}, 0, r, to_d(to_host(dx)), "activation dx", 1e-5, 1e-3, 300);
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

  void residual_add_gradient_reaches_both_branches() {
    const Device d = device_;
    // out = relu(a + b): the gradient of the add is dy on both inputs.
    Vec a = random_vec(40, 71), b = random_vec(40, 72), r = random_vec(40, 73);
    for (size_t i = 0; i < a.size(); ++i)
      if (std::abs(a[i] + b[i]) < 1e-2) a[i] += 0.1;
    Tensor y = activation(Activation::Relu, add(make(*rt_, d, {4, 10}, a), make(*rt_, d, {4, 10}, b)));
    Tensor g = activation_backward(Activation::Relu, y, make(*rt_, d, {4, 10}, r));
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
    Tensor tp = make(*rt_, d, {50}, p), tg = make(*rt_, d, {50}, g), buf = zeros(*rt_, {50}, d);
    SgdOptions o{0.1f, 0.9f, 0.01f};
    sgd_step(tp, tg, buf, o);
    sgd_step(tp, tg, buf, o);
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
    sgd_step(tp2, tg, Tensor(), {0.5f, 0, 0});
    Vec want2(50);
    for (size_t i = 0; i < p.size(); ++i) want2[i] = p[i] - 0.5 * g[i];
    expect_close(to_d(to_host(tp2)), want2, 1e-6, 1e-5, "plain sgd");
    // The whole-model form, one op for every tensor, steps exactly as the one-tensor form.
    const Vec q = random_vec(10, 93), gq = random_vec(10, 94);
    std::vector<Tensor> ps{make(*rt_, d, {50}, p), make(*rt_, d, {10}, q)};
    std::vector<Tensor> gs{tg, make(*rt_, d, {10}, gq)};
    std::vector<Tensor> bufs{zeros(*rt_, {50}, d), zeros(*rt_, {10}, d)};
    std::vector<Tensor> ps1{make(*rt_, d, {50}, p), make(*rt_, d, {10}, q)};
    std::vector<Tensor> bufs1{zeros(*rt_, {50}, d), zeros(*rt_, {10}, d)};
    for (int step = 0; step < 2; ++step) {
      sgd_step(ps, gs, bufs, o);
      for (size_t i = 0; i < 2; ++i) sgd_step(ps1[i], gs[i], bufs1[i], o);
    }
    for (size_t i = 0; i < 2; ++i) {
      QCOMPARE(to_host(ps[i]), to_host(ps1[i]));
      QCOMPARE(to_host(bufs[i]), to_host(bufs1[i]));
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
  }
};

QTEST_GUILESS_MAIN(NnLayersTest)
#include "test_nn_layers.moc"
