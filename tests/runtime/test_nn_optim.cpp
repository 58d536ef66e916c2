// The optimizers, schedules, gradient clipping and label smoothing against independent float64 references
// of optim.h's formulas: SGD (plain, momentum, dampening, Nesterov, weight decay), Adam and AdamW over five
// steps of fixed gradients at varying rates, every schedule's rate sequence against its closed form, the clip
// factor against a float64 norm, and the smoothed loss and gradient; then the Trainer with all of them on one
// and on two devices. Runs on the device named by GN_TEST_DEVICE (default cpu; cuda:0 skips without a GPU).
#include <QtTest>
#include <cmath>
#include <map>
#include <numbers>
#include <random>

#include "gpunodes/errors.h"
#include "gpunodes/nn/data.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/nn/optim.h"
#include "gpunodes/nn/trainer.h"
#include "gpunodes/ops.h"
#include "gpunodes/precision.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

using Vec = std::vector<double>;

// Values representable in float, so the float64 reference starts from exactly what the kernels see.
Vec random_vec(size_t n, uint32_t seed, double lo = -1, double hi = 1) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(d(g));
  return v;
}

Tensor make(Runtime& rt, Device d, const Vec& v) {
  return from_values(rt, {static_cast<int64_t>(v.size())}, d, std::vector<float>(v.begin(), v.end()));
}

Vec host(const Tensor& t) {
  auto v = to_host(t);
  return {v.begin(), v.end()};
}

// |got - want| <= atol + rtol * |want| elementwise; the first miss is named.
void expect_close(const Vec& got, const Vec& want, double atol, double rtol, const QString& what) {
  QCOMPARE(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::abs(got[i] - want[i]) <= atol + rtol * std::abs(want[i])))
      QFAIL(qPrintable(QString("%1: element %2 is %3, expected %4")
                           .arg(what)
                           .arg(i)
                           .arg(got[i], 0, 'g', 10)
                           .arg(want[i], 0, 'g', 10)));
}

// One parameter's float64 update, written from the PyTorch pseudo-code of each optimizer (torch.optim docs).
struct RefState {
  Vec buf, m, v;
  bool started = false;
};
void ref_update(const OptimizerOptions& o, double lr, int t, Vec& p, const Vec& grad, RefState& st,
                double coef = 1) {
  const size_t n = p.size();
  if (!st.started) {
    st.buf.assign(n, 0);
    st.m.assign(n, 0);
    st.v.assign(n, 0);
  }
  for (size_t i = 0; i < n; ++i) {
    double g = grad[i] * coef;
    if (o.kind == OptimizerKind::Sgd) {
      g += o.weight_decay * p[i];
      if (o.momentum != 0) {
        st.buf[i] = st.started ? o.momentum * st.buf[i] + (1 - o.dampening) * g : g;
        g = o.nesterov ? g + o.momentum * st.buf[i] : st.buf[i];
      }
      p[i] -= lr * g;
      continue;
    }
    if (o.kind == OptimizerKind::AdamW)
      p[i] -= lr * o.weight_decay * p[i];
    else
      g += o.weight_decay * p[i];
    st.m[i] = o.beta1 * st.m[i] + (1 - o.beta1) * g;
    st.v[i] = o.beta2 * st.v[i] + (1 - o.beta2) * g * g;
    const double m_hat = st.m[i] / (1 - std::pow(o.beta1, t));
    const double v_hat = st.v[i] / (1 - std::pow(o.beta2, t));
    p[i] -= lr * m_hat / (std::sqrt(v_hat) + o.eps);
  }
  st.started = true;
}

// The parameter sizes: one above the CPU kernels' parallel threshold, so the OpenMP path runs too.
const std::vector<size_t> kSizes{37, 5, 150000};
const std::vector<double> kRateScale{1.0, 0.8, 1.2, 0.5, 1.0};  // a schedule's varying rates, per step

}  // namespace

class NnOptimTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;
  Device device_ = Device::cpu();

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>();
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("optimizers on %s", device_.str().c_str());
  }
  void cleanupTestCase() { rt_.reset(); }

  void optimizers_match_float64_data() {
    QTest::addColumn<int>("kind");
    QTest::addColumn<double>("lr");
    QTest::addColumn<double>("momentum");
    QTest::addColumn<double>("dampening");
    QTest::addColumn<bool>("nesterov");
    QTest::addColumn<double>("weight_decay");
    using K = OptimizerKind;
    QTest::newRow("sgd") << int(K::Sgd) << 0.1 << 0.0 << 0.0 << false << 0.0;
    QTest::newRow("sgd momentum") << int(K::Sgd) << 0.1 << 0.9 << 0.0 << false << 0.0;
    QTest::newRow("sgd momentum dampening") << int(K::Sgd) << 0.1 << 0.9 << 0.3 << false << 0.0;
    QTest::newRow("sgd nesterov") << int(K::Sgd) << 0.05 << 0.9 << 0.0 << true << 0.0;
    QTest::newRow("sgd weight decay") << int(K::Sgd) << 0.1 << 0.0 << 0.0 << false << 0.01;
    QTest::newRow("sgd nesterov weight decay") << int(K::Sgd) << 0.1 << 0.8 << 0.0 << true << 0.05;
    QTest::newRow("adam") << int(K::Adam) << 1e-3 << 0.0 << 0.0 << false << 0.0;
    QTest::newRow("adam weight decay") << int(K::Adam) << 2e-3 << 0.0 << 0.0 << false << 0.1;
    QTest::newRow("adamw") << int(K::AdamW) << 1e-2 << 0.0 << 0.0 << false << 0.1;
  }
  void optimizers_match_float64() {
    QFETCH(int, kind);
    QFETCH(double, lr);
    QFETCH(double, momentum);
    QFETCH(double, dampening);
    QFETCH(bool, nesterov);
    QFETCH(double, weight_decay);
    OptimizerOptions o;
    o.kind = static_cast<OptimizerKind>(kind);
    o.lr = lr;
    o.momentum = momentum;
    o.dampening = dampening;
    o.nesterov = nesterov;
    o.weight_decay = weight_decay;
    if (o.kind != OptimizerKind::Sgd) o.beta1 = 0.8, o.beta2 = 0.99, o.eps = 1e-6;  // not the defaults

    std::vector<Vec> ref;
    std::vector<Tensor> params;
    for (size_t i = 0; i < kSizes.size(); ++i) {
      ref.push_back(random_vec(kSizes[i], 10 + i));
      params.push_back(make(*rt_, device_, ref.back()));
    }
    std::vector<OptimizerState> states(params.size());
    std::vector<RefState> ref_states(params.size());
    for (int t = 1; t <= 5; ++t) {
      std::vector<Tensor> grads;
      const double rate = lr * kRateScale[t - 1];
      for (size_t i = 0; i < kSizes.size(); ++i) {
        const Vec g = random_vec(kSizes[i], 100 * t + i);
        grads.push_back(make(*rt_, device_, g));
        ref_update(o, rate, t, ref[i], g, ref_states[i]);
      }
      optimizer_step(params, grads, states, o, rate, t);
    }
    for (size_t i = 0; i < params.size(); ++i) {
      expect_close(host(params[i]), ref[i], 1e-6, 1e-5, QString("parameter %1").arg(i));
      const bool adam = o.kind != OptimizerKind::Sgd;
      QCOMPARE(states[i].a.defined(), adam || momentum != 0);
      QCOMPARE(states[i].b.defined(), adam);
      if (states[i].a.defined()) QCOMPARE(states[i].a.device(), device_);
      if (adam) {
        expect_close(host(states[i].a), ref_states[i].m, 1e-7, 1e-5, QString("exp_avg %1").arg(i));
        expect_close(host(states[i].b), ref_states[i].v, 1e-9, 1e-5, QString("exp_avg_sq %1").arg(i));
      } else if (momentum != 0) {
        expect_close(host(states[i].a), ref_states[i].buf, 1e-6, 1e-5, QString("momentum buffer %1").arg(i));
      }
    }
  }

  void scalars_on_the_device_step_as_the_host_rates() {
    // optimizer_step reading its scalars from a tensor (what a captured step replays with) and optimizer_step
    // given the rate and step take bit-equal steps.
    const Vec p0 = random_vec(300, 1), p1 = random_vec(7, 2);
    std::vector<Tensor> a{make(*rt_, device_, p0), make(*rt_, device_, p1)};
    std::vector<Tensor> b{make(*rt_, device_, p0), make(*rt_, device_, p1)};
    std::vector<OptimizerState> bufs(2), states(2);
    OptimizerOptions o;
    o.lr = 0.1;
    o.momentum = 0.9;
    o.weight_decay = 1e-3;
    for (int t = 1; t <= 3; ++t) {
      std::vector<Tensor> g{make(*rt_, device_, random_vec(300, 10 + t)),
                            make(*rt_, device_, random_vec(7, 20 + t))};
      optimizer_step(a, g, bufs, o, optimizer_scalars(*rt_, device_, o, o.lr, t));
      optimizer_step(b, g, states, o, o.lr, t);
    }
    for (size_t i = 0; i < 2; ++i) {
      QCOMPARE(to_host(a[i]), to_host(b[i]));
      QCOMPARE(to_host(bufs[i].a), to_host(states[i].a));
    }
  }

  void bad_arguments_fail_clearly() {
    std::vector<Tensor> p{zeros(*rt_, {3}, device_)}, g{zeros(*rt_, {4}, device_)};
    std::vector<OptimizerState> st(1);
    OptimizerOptions o;
    QVERIFY_THROWS_EXCEPTION(ShapeError, optimizer_step(p, g, st, o, 0.1, 1));
    g = {zeros(*rt_, {3}, device_)};
    QVERIFY_THROWS_EXCEPTION(Error, optimizer_step(p, g, st, o, 0.1, 0));   // steps count from 1
    QVERIFY_THROWS_EXCEPTION(Error, optimizer_step(p, g, st, o, -1.0, 1));  // a negative rate
    o.nesterov = true;
    try {
      optimizer_step(p, g, st, o, 0.1, 1);
      QFAIL("nesterov without momentum was taken");
    } catch (const Error& e) {
      QVERIFY2(QString(e.what()).contains("nesterov: needs momentum above 0"), e.what());
    }
    OptimizerOptions adam;
    adam.kind = OptimizerKind::Adam;
    adam.beta2 = 1.0;
    QCOMPARE(optimizer_problems(adam), std::vector<std::string>{"beta2: must be at least 0 and below 1"});
    adam.beta2 = 0.999;
    adam.eps = 0;
    QCOMPARE(optimizer_problems(adam), std::vector<std::string>{"eps: must be above 0"});
    QCOMPARE(parse_optimizer("adamw"), OptimizerKind::AdamW);
    QVERIFY_THROWS_EXCEPTION(Error, parse_optimizer("rmsprop"));
    QCOMPARE(describe(OptimizerOptions{.kind = OptimizerKind::Adam, .lr = 1e-3}),
             std::string("adam (lr 0.001, beta1 0.9, beta2 0.999, eps 1e-08, weight_decay 0)"));
  }

  void schedules_follow_their_closed_forms_data() {
    QTest::addColumn<int>("kind");
    QTest::addColumn<int>("warmup");
    QTest::addColumn<double>("min_lr");
    using K = ScheduleKind;
    QTest::newRow("constant") << int(K::Constant) << 0 << 0.0;
    QTest::newRow("constant, warmup 2") << int(K::Constant) << 2 << 0.0;
    QTest::newRow("step") << int(K::Step) << 0 << 0.0;
    QTest::newRow("step, warmup 1") << int(K::Step) << 1 << 0.0;
    QTest::newRow("cosine") << int(K::Cosine) << 0 << 0.0;
    QTest::newRow("cosine, min_lr, warmup 2") << int(K::Cosine) << 2 << 0.004;
    QTest::newRow("onecycle") << int(K::OneCycle) << 0 << 0.0;
    QTest::newRow("onecycle, min_lr") << int(K::OneCycle) << 0 << 1e-4;
  }
  void schedules_follow_their_closed_forms() {
    QFETCH(int, kind);
    QFETCH(int, warmup);
    QFETCH(double, min_lr);
    const double base = 0.1;
    const int64_t epochs = 9, per_epoch = 7, total = epochs * per_epoch, w = warmup * per_epoch;
    ScheduleOptions s{.kind = static_cast<ScheduleKind>(kind),
                      .warmup_epochs = warmup,
                      .step_size = 3,
                      .gamma = 0.5,
                      .min_lr = min_lr};
    QVERIFY(schedule_problems(s, base).empty());
    std::vector<double> got;
    for (int64_t k = 0; k < total; ++k) got.push_back(scheduled_lr(s, base, k, per_epoch, epochs));
    for (int64_t k = 0; k < total; ++k) {
      double want;
      const double e = static_cast<double>((k - w) / per_epoch);
      if (k < w) {
        // LinearLR's straight line, from base / w at k = 0 to base at k = w.
        want =
            base * (static_cast<double>(w) + static_cast<double>((w - 1) * k)) / static_cast<double>(w * w);
      } else if (s.kind == ScheduleKind::Constant) {
        want = base;
      } else if (s.kind == ScheduleKind::Step) {
        want = base * std::pow(0.5, std::floor(e / 3));
      } else if (s.kind == ScheduleKind::Cosine) {
        const double t_max = static_cast<double>(epochs - warmup);
        want = min_lr + 0.5 * (base - min_lr) * (1 + std::cos(std::numbers::pi * e / t_max));
      } else {
        // One cycle: a half cosine up from base/25 to base until step 0.3 * total - 1, then one down.
        const double up_end = 0.3 * static_cast<double>(total) - 1, last = static_cast<double>(total - 1);
        const double low = base / 25, final_lr = min_lr > 0 ? min_lr : low / 1e4, x = static_cast<double>(k);
        if (x <= up_end)
          want = low + (base - low) * (1 - std::cos(std::numbers::pi * x / up_end)) / 2;
        else
          want = final_lr +
                 (base - final_lr) * (1 + std::cos(std::numbers::pi * (x - up_end) / (last - up_end))) / 2;
      }
      if (!(std::abs(got[k] - want) <= 1e-12 * base))
        QFAIL(qPrintable(
            QString("step %1: %2, expected %3").arg(k).arg(got[k], 0, 'g', 17).arg(want, 0, 'g', 17)));
    }
    // Landmarks, spelled out.
    if (warmup > 0) {
      QCOMPARE(got[0], base / static_cast<double>(w));
      QVERIFY(std::abs(got[w] - base) < 1e-15);
    }
    if (s.kind == ScheduleKind::Step && warmup == 0) {
      QCOMPARE(got[3 * per_epoch - 1], base);
      QCOMPARE(got[3 * per_epoch], base * 0.5);
      QCOMPARE(got[6 * per_epoch], base * 0.25);
    }
    if (s.kind == ScheduleKind::Cosine) {
      QVERIFY(std::abs(got[w] - base) < 1e-15);
      // Constant inside an epoch (stepped per epoch), falling from one epoch to the next.
      QCOMPARE(got[w + 1], got[w]);
      QVERIFY(got.back() < got[w + per_epoch] && got.back() > min_lr);
    }
    if (s.kind == ScheduleKind::OneCycle) {
      QVERIFY(std::abs(got[0] - base / 25) < 1e-15);
      QVERIFY(std::abs(got.back() - (min_lr > 0 ? min_lr : base / 25 / 1e4)) < 1e-15);
      // The peak is at the end of the climb, step 0.3 * total - 1 (between two whole steps here).
      const int64_t peak = std::max_element(got.begin(), got.end()) - got.begin();
      QCOMPARE(peak, static_cast<int64_t>(std::ceil(0.3 * static_cast<double>(total) - 1)));
      QVERIFY(*std::max_element(got.begin(), got.end()) <= base);
    }
    QVERIFY_THROWS_EXCEPTION(Error, scheduled_lr(s, base, total, per_epoch, epochs));
    QVERIFY_THROWS_EXCEPTION(Error, scheduled_lr(s, base, -1, per_epoch, epochs));
  }

  void schedule_problems_name_the_param() {
    ScheduleOptions s{.kind = ScheduleKind::OneCycle, .warmup_epochs = 1};
    const auto p = schedule_problems(s, 0.1);
    QCOMPARE(p.size(), size_t(1));
    QVERIFY(p[0].starts_with("warmup_epochs: "));
    s = {.kind = ScheduleKind::Cosine, .min_lr = 0.2};
    QCOMPARE(schedule_problems(s, 0.1), std::vector<std::string>{"min_lr: must be below lr"});
    s = {.kind = ScheduleKind::Step, .step_size = 0, .gamma = 0};
    QCOMPARE(schedule_problems(s, 0.1),
             (std::vector<std::string>{"step_size: must be at least 1", "gamma: must be above 0"}));
    QCOMPARE(describe(ScheduleOptions{.kind = ScheduleKind::Cosine, .warmup_epochs = 1}),
             std::string("cosine (warmup 1 epoch, min_lr 0)"));
    QCOMPARE(parse_schedule("onecycle"), ScheduleKind::OneCycle);
  }

  void clip_grad_norm_matches_float64() {
    // Sizes across the chunking: within one chunk, exactly one, several with a partial last one.
    const std::vector<size_t> sizes{3, 8192, 50001, 1};
    std::vector<Vec> g;
    std::vector<Tensor> grads;
    double sumsq = 0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      g.push_back(random_vec(sizes[i], 40 + i, -0.1, 0.1));
      grads.push_back(make(*rt_, device_, g.back()));
      for (double v : g.back()) sumsq += v * v;
    }
    const double norm = std::sqrt(sumsq);
    for (double max_norm : {norm / 3, norm * 2}) {
      Tensor c = grad_clip_coefficient(grads, static_cast<float>(max_norm));
      QCOMPARE(c.shape(), (Shape{2}));
      QCOMPARE(c.device(), device_);
      const Vec got = host(c);
      const double coef = std::min(1.0, max_norm / (norm + 1e-6));
      qInfo("norm %.9g (float64 %.9g), factor %.9g (float64 %.9g)", got[0], norm, got[1], coef);
      QVERIFY(std::abs(got[0] - norm) <= 1e-6 * norm);
      QVERIFY(std::abs(got[1] - coef) <= 1e-6 * coef);
      // The step reads the factor: p - lr * coef * g, and the gradients stay unscaled.
      std::vector<Tensor> params;
      std::vector<Vec> want;
      for (size_t i = 0; i < sizes.size(); ++i) {
        want.push_back(random_vec(sizes[i], 60 + i));
        params.push_back(make(*rt_, device_, want.back()));
        for (size_t j = 0; j < sizes[i]; ++j) want[i][j] -= 0.5 * coef * g[i][j];
      }
      std::vector<OptimizerState> st(params.size());
      optimizer_step(params, grads, st, OptimizerOptions{}, 0.5, 1, c);
      for (size_t i = 0; i < sizes.size(); ++i) {
        expect_close(host(params[i]), want[i], 1e-7, 1e-6, QString("clipped step %1").arg(i));
        QCOMPARE(host(grads[i]), g[i]);
      }
    }
    // Large gradients give the same bits every time (a fixed order, no atomics).
    QCOMPARE(to_host(grad_clip_coefficient(grads, 1.0f)), to_host(grad_clip_coefficient(grads, 1.0f)));
    QVERIFY_THROWS_EXCEPTION(Error, grad_clip_coefficient(grads, 0.0f));
  }

  void label_smoothing_loss_and_gradient_match_float64() {
    const int64_t n = 6, k = 5;
    const Vec z = random_vec(n * k, 70, -4, 4);
    const Vec labels{0, 4, 2, 2, 1, 3};
    Tensor tz = from_values(*rt_, {n, k}, device_, std::vector<float>(z.begin(), z.end()));
    Tensor tl = from_values(*rt_, {n}, device_, std::vector<float>(labels.begin(), labels.end()));
    const Vec plain_stats = host(softmax_cross_entropy(tz, tl, false).stats);
    for (double e : {0.0, 0.1, 0.35, 1.0}) {
      CrossEntropy ce = softmax_cross_entropy(tz, tl, true, 0, static_cast<float>(e));
      double loss = 0;
      Vec grad(n * k);
      for (int64_t i = 0; i < n; ++i) {
        double mx = -1e300, se = 0;
        for (int64_t j = 0; j < k; ++j) mx = std::max(mx, z[i * k + j]);
        for (int64_t j = 0; j < k; ++j) se += std::exp(z[i * k + j] - mx);
        const int64_t y = static_cast<int64_t>(labels[i]);
        // CrossEntropyLoss(label_smoothing=e): against the target (1 - e) onehot + e / K.
        for (int64_t j = 0; j < k; ++j) {
          const double logp = z[i * k + j] - mx - std::log(se);
          const double target = (j == y ? 1 - e : 0) + e / k;
          loss -= target * logp / n;
          grad[i * k + j] = (std::exp(logp) - target) / n;
        }
      }
      qInfo("label smoothing %.2f: loss %.9g, float64 %.9g", e, double(to_host(ce.loss)[0]), loss);
      QVERIFY(std::abs(to_host(ce.loss)[0] - loss) <= 1e-6 * loss);
      expect_close(host(ce.dlogits), grad, 1e-7, 1e-5, QString("gradient at smoothing %1").arg(e));
      const Vec stats = host(ce.stats);
      QVERIFY(std::abs(stats[0] - loss * n) <= 1e-5 * loss * n);
      QCOMPARE(stats[1], plain_stats[1]);  // accuracy does not see the smoothing
    }
    QVERIFY_THROWS_EXCEPTION(Error, softmax_cross_entropy(tz, tl, true, 0, 1.5f));
  }

  void trainer_takes_the_schedule_and_keeps_replicas_identical() {
    if (!device_.is_cpu()) QSKIP("two CPU devices: the CPU run covers it");
    Runtime rt({.cpu_devices = 2});
    const DatasetPtr data = make_synthetic({.count = 64 * 5});
    TrainOptions o;
    o.epochs = 2;
    o.batch_size = 64;
    o.log_every = 2;
    o.optimizer = {.kind = OptimizerKind::AdamW, .lr = 3e-3, .weight_decay = 0.05};
    o.schedule = {.kind = ScheduleKind::Cosine, .warmup_epochs = 1, .min_lr = 1e-4};
    o.clip_grad_norm = 0.5;
    o.label_smoothing = 0.1;
    auto one = Model::create(rt, modelOptions(Arch::Mlp, 2), Device::cpu(0));
    auto two = Model::create(rt, modelOptions(Arch::Mlp, 2), Device::cpu(0));
    Trainer t1(*one, {Device::cpu(0)}, o);
    Trainer t2(*two, {Device::cpu(0), Device::cpu(1)}, o);
    std::map<std::string, std::vector<MetricSample>> s1, s2;
    const TrainResult r1 = t1.fit(data, nullptr, [&](const MetricSample& m) { s1[m.series].push_back(m); });
    const TrainResult r2 = t2.fit(data, nullptr, [&](const MetricSample& m) { s2[m.series].push_back(m); });
    QCOMPARE(t1.optimizer_steps(), int64_t(10));
    QCOMPARE(t2.optimizer_steps(), int64_t(10));
    // The rate series: after batches 2 and 4 and at each epoch's end, the rate of the latest batch.
    QCOMPARE(s1["lr"].size(), size_t(6));
    for (const MetricSample& m : s1["lr"])
      QCOMPARE(m.value, scheduled_lr(o.schedule, o.optimizer.lr, m.step - 1, 5, 2));
    QCOMPARE(s1["lr"][0].value, 3e-3 * (1.0 / 5 + 0.8 * 1 / 5));  // warmup, batch 1 of 5
    for (size_t i = 0; i < s1["lr"].size(); ++i) QCOMPARE(s2["lr"][i].value, s1["lr"][i].value);
    // Data parallel: the replicas take bit-equal steps; the result matches one device within float sums.
    const auto a = t2.replica(0).state(), b = t2.replica(1).state(), c = one->state();
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      QCOMPARE(to_host(a[i]->value), to_host(b[i]->value));
      const auto va = to_host(a[i]->value), vc = to_host(c[i]->value);
      for (size_t j = 0; j < va.size(); ++j) worst = std::max(worst, std::abs(double(va[j]) - vc[j]));
    }
    qInfo("one device: loss %.6f; two devices: loss %.6f; largest parameter difference %.3g",
          r1.epochs.back().train_loss, r2.epochs.back().train_loss, worst);
    QVERIFY2(worst < 1e-4, qPrintable(QString::number(worst)));
    QVERIFY(std::abs(r1.epochs.back().train_loss - r2.epochs.back().train_loss) < 1e-4);
    QVERIFY(r1.epochs.back().train_loss < r1.epochs.front().train_loss);
  }

  // Loss scaling by a power of two changes no bit of training: the loss gradient, every gradient computed
  // from it and the unscaling are exact multiplications by powers of two, and the combined unscale-and-clip
  // factor rounds as PyTorch's two steps do. The scale doubles after every `interval` good steps.
  void loss_scaling_is_exact_and_grows() {
    const DatasetPtr data = make_synthetic({.count = 32 * 6});
    TrainOptions o;
    o.epochs = 1;
    o.batch_size = 32;
    o.log_every = 0;
    o.optimizer = {.kind = OptimizerKind::Adam, .lr = 1e-3};
    o.clip_grad_norm = 0.05;  // small enough to clip every step
    auto plain = Model::create(*rt_, modelOptions(Arch::LeNet, 3), device_);
    auto scaled = Model::create(*rt_, modelOptions(Arch::LeNet, 3), device_);
    Trainer tp(*plain, {device_}, o);
    o.loss_scale = {.mode = LossScaleMode::Dynamic, .init = 1024, .interval = 4};
    Trainer ts(*scaled, {device_}, o);
    QCOMPARE(ts.loss_scale(), 1024.0);
    QCOMPARE(tp.loss_scale(), 0.0);  // auto with fp32: off
    std::vector<double> series;
    tp.fit(data, nullptr);
    ts.fit(data, nullptr, [&](const MetricSample& m) {
      if (m.series == "loss_scale") series.push_back(m.value);
    });
    QCOMPARE(ts.optimizer_steps(), int64_t(6));
    QCOMPARE(ts.skipped_steps(), int64_t(0));
    QCOMPARE(ts.loss_scale(), 2048.0);  // grew once, after step 4
    QVERIFY(series == std::vector<double>{2048.0});
    const auto a = plain->state(), b = scaled->state();
    for (size_t i = 0; i < a.size(); ++i)
      QVERIFY2(to_host(a[i]->value) == to_host(b[i]->value), a[i]->name.c_str());
  }

  // Gradients that overflow skip the whole step (no update, Adam's step count unchanged) and halve the
  // scale; once it fits, training goes on.
  void overflowing_steps_are_skipped_and_the_scale_backs_off() {
    const DatasetPtr data = make_synthetic({.count = 32 * 24});
    TrainOptions o;
    o.epochs = 1;
    o.batch_size = 32;
    o.log_every = 0;
    o.optimizer = {.kind = OptimizerKind::Adam, .lr = 1e-3};
    o.loss_scale = {.mode = LossScaleMode::Dynamic, .init = std::ldexp(1.0, 200)};
    auto m = Model::create(*rt_, modelOptions(Arch::Mlp, 4), device_);
    std::vector<std::vector<float>> before;
    for (const Parameter* p : m->state()) before.push_back(to_host(p->value));
    {
      Trainer t(*m, {device_}, o);
      t.fit(make_synthetic({.count = 32 * 3}), nullptr);  // 2^200 / 32 is no float: every step overflows
      QCOMPARE(t.skipped_steps(), int64_t(3));
      QCOMPARE(t.optimizer_steps(), int64_t(0));
      QCOMPARE(t.loss_scale(), std::ldexp(1.0, 197));
      const auto state = m->state();
      for (size_t i = 0; i < state.size(); ++i) QVERIFY(to_host(state[i]->value) == before[i]);
    }
    o.loss_scale.init = std::ldexp(1.0, 136);
    Trainer t(*m, {device_}, o);
    const TrainResult r = t.fit(data, nullptr);
    qInfo("from 2^136: %lld of 24 steps skipped, scale now 2^%g, loss %.4f", static_cast<long long>(t.skipped_steps()),
          std::log2(t.loss_scale()), r.epochs.back().train_loss);
    QVERIFY(t.skipped_steps() >= 4);  // 2^(136-k) / 32 is a float only from k = 4 on
    QVERIFY(t.skipped_steps() < 24);
    QCOMPARE(t.optimizer_steps() + t.skipped_steps(), int64_t(24));
    QCOMPARE(t.loss_scale(), std::ldexp(1.0, 136 - static_cast<int>(t.skipped_steps())));
    for (const Parameter* p : m->state())
      for (float v : to_host(p->value)) QVERIFY(std::isfinite(v));
  }

  // Every precision but fp32 is refused on a CPU, at once and naming the op, the precision and the device;
  // bf16 only where the CPU lacks native bf16 (oneDNN's ISA), and then naming what it has.
  void reduced_precision_is_refused_on_a_cpu() {
    for (Precision p : {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16})
      QCOMPARE(parse_precision(precision_name(p)), std::optional<Precision>(p));
    QVERIFY(!parse_precision("fp64"));
    QCOMPARE(parse_loss_scale_mode("dynamic"), std::optional<LossScaleMode>(LossScaleMode::Dynamic));
    QVERIFY(!parse_loss_scale_mode("on"));
    Runtime rt;
    const Device cpu = Device::cpu();
    const Tensor x = ones(rt, {2, 3}, cpu), w = ones(rt, {4, 3}, cpu), b = zeros(rt, {4}, cpu);
    const Tensor img = ones(rt, {1, 1, 5, 5}, cpu), k = ones(rt, {2, 1, 3, 3}, cpu);
    {
      ScopedPrecision bf16(Precision::Bf16);
      QCOMPARE(current_precision(), Precision::Bf16);
      const std::string has = cpu_bf16_features();
      if (cpu_native_bf16())
        linear(x, w, b);  // tests/runtime/test_cpu_bf16.cpp checks its values
      else
        expect_error([&] { linear(x, w, b); },
                     {"linear", "precision bf16", "cpu", QString::fromStdString(cpu_dnnl_isa()),
                      has.empty() ? "neither avx512_bf16 nor AMX-BF16" : "without bf16"});
      {
        ScopedPrecision fp16(Precision::Fp16);
        expect_error([&] { conv2d(img, k, Tensor()); }, {"conv2d", "fp16", "cpu", "needs a CUDA device"});
      }
      QCOMPARE(current_precision(), Precision::Bf16);  // scopes nest
    }
    QCOMPARE(current_precision(), Precision::Fp32);
    linear(x, w, b);  // fp32 outside any scope
    expect_error([&] { matmul(x, w, {.trans_b = true, .precision = Precision::Tf32}); }, {"matmul", "tf32", "cpu"});
    auto m = Model::create(rt, modelOptions(Arch::Mlp), cpu);
    TrainOptions o;
    o.precision = Precision::Bf16;
    if (!cpu_native_bf16()) expect_error([&] { Trainer(*m, {cpu}, o); }, {"training", "bf16", "cpu"});
    o.precision = Precision::Fp16;
    expect_error([&] { Trainer(*m, {cpu}, o); }, {"training", "fp16", "cpu"});
    o = {};
    for (auto bad : {LossScaleOptions{.init = 0}, LossScaleOptions{.backoff = 1}, LossScaleOptions{.interval = 0}}) {
      o.loss_scale = bad;
      expect_error([&] { Trainer(*m, {cpu}, o); }, {"loss"});
    }
  }

  // A captured step replays exactly what the step-by-step run does: same parameters, running statistics,
  // losses and counters, bit for bit, with a schedule (the rate differs every step), Adam and clipping; the
  // short last batch of each epoch, which the captured step does not fit, runs step by step.
  void captured_steps_replay_bit_exact() {
    ModelOptions net;
    net.arch = Arch::Network;
    net.network = std::make_shared<const NetworkSpec>(NetworkSpec::parse(
        "network x:Input(shape=1x28x28); c:Conv2d(out_channels=4,kernel_size=3,padding=1)<-x; "
        "bn:BatchNorm2d()<-c; r:ReLU()<-bn; p:MaxPool2d(kernel_size=2)<-r; f:Flatten()<-p; "
        "fc:Linear(out_features=10)<-f"));
    net.seed = 9;
    const DatasetPtr data = make_synthetic({.count = 600});  // 9 batches of 64 and one of 24 per epoch
    TrainOptions o;
    o.epochs = 2;
    o.batch_size = 64;
    o.log_every = 3;
    o.optimizer = {.kind = OptimizerKind::Adam, .lr = 3e-3};
    o.schedule = {.kind = ScheduleKind::Cosine, .warmup_epochs = 1};
    o.clip_grad_norm = 1.0;
    auto stepwise = Model::create(*rt_, net, device_), captured = Model::create(*rt_, net, device_);
    o.capture = StepCapture::Off;
    Trainer ts(*stepwise, {device_}, o);
    o.capture = StepCapture::On;
    Trainer tc(*captured, {device_}, o);
    std::vector<std::string> warnings;
    const TrainResult rs = ts.fit(data, make_synthetic({.count = 128, .seed = 1}));
    std::string status;
    const TrainResult rc = tc.fit(data, make_synthetic({.count = 128, .seed = 1}), [&](const MetricSample& m) {
      if (m.series == "loss" && status.empty()) status = tc.capture_status();
    }, [&](const std::string& w) { warnings.push_back(w); });
    qInfo("%s; %lld of 20 steps from the capture", status.c_str(), static_cast<long long>(tc.replayed_steps()));
    QVERIFY(warnings.empty());
    QVERIFY2(QString::fromStdString(status).startsWith(device_.is_cuda() ? "replaying a CUDA graph" : "replaying"),
             status.c_str());
    QCOMPARE(tc.replayed_steps(), int64_t(16));  // 7 of epoch 1 (after 2 ordinary ones), 9 of epoch 2
    QCOMPARE(ts.replayed_steps(), int64_t(0));
    QCOMPARE(tc.optimizer_steps(), ts.optimizer_steps());
    QCOMPARE(captured->batches_tracked(), stepwise->batches_tracked());
    // fit() released it at its end: "replaying 16 recorded ops" became "replayed 16 recorded ops".
    QCOMPARE(tc.capture_status(), "replayed " + status.substr(std::string("replaying ").size()));
    for (size_t e = 0; e < rs.epochs.size(); ++e) {
      QCOMPARE(rc.epochs[e].train_loss, rs.epochs[e].train_loss);
      QCOMPARE(rc.epochs[e].test_acc, rs.epochs[e].test_acc);
    }
    const auto a = stepwise->state(), b = captured->state();
    for (size_t i = 0; i < a.size(); ++i)
      QVERIFY2(to_host(a[i]->value) == to_host(b[i]->value), a[i]->name.c_str());
  }

  // Where a step cannot be captured, training goes on step by step and says why, once.
  void capture_refusals_say_why() {
    Runtime rt({.cpu_devices = 2});
    const DatasetPtr data = make_synthetic({.count = 64 * 4});
    TrainOptions o;
    o.epochs = 1;
    o.batch_size = 64;
    o.log_every = 0;
    o.capture = StepCapture::On;
    auto check = [&](const ModelOptions& mo, std::vector<Device> devices, const TrainOptions& opts, const char* why) {
      auto m = Model::create(rt, mo, devices.front());
      Trainer t(*m, devices, opts);
      std::vector<std::string> warnings;
      t.fit(data, nullptr, {}, [&](const std::string& w) { warnings.push_back(w); });
      QCOMPARE(warnings.size(), size_t(1));
      QVERIFY2(QString::fromStdString(warnings[0]).contains(why), warnings[0].c_str());
      QVERIFY2(QString::fromStdString(t.capture_status()).contains(why), t.capture_status().c_str());
      QCOMPARE(t.replayed_steps(), int64_t(0));
      QCOMPARE(t.optimizer_steps(), int64_t(4));
    };
    check(modelOptions(Arch::Mlp), {Device::cpu(0), Device::cpu(1)}, o, "this run trains on 2");
    ModelOptions dropout;
    dropout.arch = Arch::Network;
    dropout.network = std::make_shared<const NetworkSpec>(NetworkSpec::parse(
        "network x:Input(shape=1x28x28); f:Flatten()<-x; d:Dropout(p=0.5)<-f; fc:Linear(out_features=10)<-d"));
    check(dropout, {Device::cpu()}, o, "dropout draws a new mask");
    TrainOptions scaled = o;
    scaled.loss_scale.mode = LossScaleMode::Dynamic;
    check(modelOptions(Arch::Mlp), {Device::cpu()}, scaled, "loss scaling");
    // Auto captures on CUDA devices only; off never: neither says anything.
    TrainOptions automatic = o;
    automatic.capture = StepCapture::Auto;
    auto m = Model::create(rt, modelOptions(Arch::Mlp), Device::cpu());
    Trainer t(*m, {Device::cpu()}, automatic);
    std::vector<std::string> warnings;
    t.fit(data, nullptr, {}, [&](const std::string& w) { warnings.push_back(w); });
    QVERIFY(warnings.empty());
    QCOMPARE(t.replayed_steps(), int64_t(0));
  }

  // A replay checks its labels on the host (a GPU graph's loss cannot report them).
  void a_replayed_step_refuses_a_bad_label() {
    auto m = Model::create(*rt_, modelOptions(Arch::Mlp, 2), device_);
    TrainOptions o;
    o.batch_size = 8;
    o.capture = StepCapture::On;
    Trainer t(*m, {device_}, o);
    std::vector<float> images(8 * 28 * 28, 0.5f), labels{0, 1, 2, 3, 4, 5, 6, 7};
    auto batch = [&] {
      auto b = std::make_shared<HostBatch>();
      b->size = 8, b->channels = 1, b->height = 28, b->width = 28;
      b->images = images.data();
      b->labels = labels.data();
      return HostBatchPtr(b);
    };
    for (int i = 0; i < 4; ++i) t.step(batch());  // two ordinary steps, the capture, a replay
    t.synchronize();
    QCOMPARE(t.replayed_steps(), int64_t(2));
    labels[5] = 10;
    expect_error([&] { t.step(batch()); }, {"label at row 5", "[0, 10)"});
    labels[5] = 2.5f;
    expect_error([&] { t.step(batch()); }, {"label at row 5"});
  }

  void trainer_refuses_bad_options() {
    Runtime rt;
    auto m = Model::create(rt, modelOptions(Arch::Mlp), Device::cpu());
    TrainOptions o;
    o.optimizer.nesterov = true;
    try {
      Trainer t(*m, {Device::cpu()}, o);
      QFAIL("nesterov without momentum was taken");
    } catch (const Error& e) {
      QVERIFY2(QString(e.what()).contains("nesterov: needs momentum above 0"), e.what());
    }
    o = {};
    o.optimizer.lr = 0.05;  // plain SGD at its own rate ...
    Trainer sgd(*m, {Device::cpu()}, o);
    QCOMPARE(sgd.optimizer().lr, 0.05);
    QCOMPARE(sgd.lr(), 0.05);
    o.optimizer.lr = -1;  // ... but not at a negative one
    QVERIFY_THROWS_EXCEPTION(Error, Trainer(*m, {Device::cpu()}, o));
    o = {};
    o.clip_grad_norm = -1;
    QVERIFY_THROWS_EXCEPTION(Error, Trainer(*m, {Device::cpu()}, o));
    o = {};
    o.label_smoothing = 2;
    QVERIFY_THROWS_EXCEPTION(Error, Trainer(*m, {Device::cpu()}, o));
  }
};

QTEST_GUILESS_MAIN(NnOptimTest)
#include "test_nn_optim.moc"
