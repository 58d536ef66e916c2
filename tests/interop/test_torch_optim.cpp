// The optimizers, schedules, gradient clipping and label smoothing against PyTorch itself: the same
// parameters and the same gradient sequence (written to files) stepped five times by torch.optim.SGD
// (momentum, dampening, Nesterov), Adam and AdamW, with clip_grad_norm_ in some cases and a rate that changes
// per step, must leave the same parameters; torch's StepLR, CosineAnnealingLR, OneCycleLR, and LinearLR
// warmups chained with SequentialLR must give gpunodes' rate for every batch; CrossEntropyLoss with
// label_smoothing must give the same loss and gradient. tests/interop/torch_optim_peer.py does the torch side
// in one process under /usr/bin/python3; the suite skips where that cannot import torch.
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/optim.h"
#include "gpunodes/ops.h"
#include "runtime/nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

constexpr int kSteps = 5;
// Parameters agree to 1e-6 of max(|p|, 1): float32 on both sides, the same formulas, and torch's kernels
// free to order (and fuse) their float operations otherwise.
constexpr double kParamTol = 1e-6;
// Rates are float64 on both sides; torch's schedulers multiply recursively, gpunodes uses closed forms.
constexpr double kRateTol = 1e-12;
const std::vector<Shape> kShapes{{7, 5}, {5}, {3, 2, 2}, {1}};
const std::vector<double> kRateScale{1.0, 0.8, 1.2, 0.5, 1.0};

struct OptimCase {
  const char* name;
  OptimizerOptions options;
  double clip = 0;
};

std::vector<OptimCase> optim_cases() {
  using K = OptimizerKind;
  return {
      {"sgd", {.kind = K::Sgd, .lr = 0.1}},
      {"sgd momentum weight decay", {.kind = K::Sgd, .lr = 0.1, .weight_decay = 1e-2, .momentum = 0.9}},
      {"sgd momentum dampening", {.kind = K::Sgd, .lr = 0.1, .momentum = 0.8, .dampening = 0.3}},
      {"sgd nesterov", {.kind = K::Sgd, .lr = 0.05, .weight_decay = 1e-3, .momentum = 0.9, .nesterov = true}},
      {"sgd nesterov clipped", {.kind = K::Sgd, .lr = 0.05, .momentum = 0.9, .nesterov = true}, 0.5},
      {"adam", {.kind = K::Adam, .lr = 1e-3}},
      {"adam weight decay clipped", {.kind = K::Adam, .lr = 2e-3, .weight_decay = 0.01}, 1.0},
      {"adam betas", {.kind = K::Adam, .lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .eps = 1e-6}},
      {"adamw", {.kind = K::AdamW, .lr = 1e-3, .weight_decay = 0.01}},
      {"adamw betas clipped",
       {.kind = K::AdamW, .lr = 1e-2, .weight_decay = 0.05, .beta1 = 0.85, .beta2 = 0.95, .eps = 1e-7},
       2.4},
  };
}

struct ScheduleCase {
  const char* name;
  ScheduleOptions options;
};

std::vector<ScheduleCase> schedule_cases() {
  using K = ScheduleKind;
  return {
      {"constant, warmup 2", {.kind = K::Constant, .warmup_epochs = 2}},
      {"step", {.kind = K::Step, .step_size = 2, .gamma = 0.5}},
      {"step, warmup 1", {.kind = K::Step, .warmup_epochs = 1, .step_size = 3, .gamma = 0.1}},
      {"cosine", {.kind = K::Cosine}},
      {"cosine, min_lr", {.kind = K::Cosine, .min_lr = 0.01}},
      {"cosine, warmup 2, min_lr", {.kind = K::Cosine, .warmup_epochs = 2, .min_lr = 0.005}},
      {"onecycle", {.kind = K::OneCycle}},
      {"onecycle, min_lr", {.kind = K::OneCycle, .min_lr = 1e-4}},
  };
}
constexpr double kScheduleLr = 0.1;
constexpr int64_t kEpochs = 8, kPerEpoch = 5;

constexpr int64_t kLossN = 9, kLossClasses = 7;
const std::vector<double> kSmoothing{0.0, 0.1, 0.4};

std::vector<float> random_floats(size_t n, uint32_t seed, float lo, float hi) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

template <class T>
void write_raw(const QString& path, const std::vector<T>& v) {
  std::ofstream out(path.toStdString(), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

template <class T>
std::vector<T> read_raw(const QString& path) {
  std::ifstream in(path.toStdString(), std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<T> v(b.size() / sizeof(T));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(T));
  return v;
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

QString slug(const char* name) {
  return QString(name).replace(' ', '_').replace(',', "");
}

}  // namespace

class TorchOptimTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  Runtime rt_;
  Device device_ = Device::cpu();
  std::vector<float> params_;              // every parameter's initial values, in order
  std::vector<std::vector<float>> grads_;  // per step, every parameter's gradient in order
  std::vector<float> logits_, labels_;

  QString path(const QString& name) const { return dir_.filePath(name); }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    GN_USE_TEST_DEVICE(rt_, device_);
    if (!QFile::exists(GN_PYTHON)) QSKIP(GN_PYTHON " is missing: install python3-torch to run this suite");

    int64_t total = 0;
    QJsonArray shapes;
    for (const Shape& s : kShapes) {
      total += numel(s);
      QJsonArray dims;
      for (int64_t d : s) dims.append(static_cast<double>(d));
      shapes.append(dims);
    }
    params_ = random_floats(static_cast<size_t>(total), 1, -1, 1);
    std::vector<float> all_grads;
    for (int t = 0; t < kSteps; ++t) {
      // Gradient norms of 2.2 to 2.6: the clipped cases clip every step, or (max 2.4) only some of them.
      grads_.push_back(random_floats(static_cast<size_t>(total), 10 + t, -0.6f + 0.1f * t, 0.6f));
      all_grads.insert(all_grads.end(), grads_.back().begin(), grads_.back().end());
    }
    write_raw(path("params.f32"), params_);
    write_raw(path("grads.f32"), all_grads);

    QJsonObject job{
        {"shapes", shapes}, {"params", path("params.f32")}, {"grads", path("grads.f32")}, {"steps", kSteps}};
    QJsonArray optimizers;
    for (const OptimCase& c : optim_cases()) {
      const OptimizerOptions& o = c.options;
      QJsonArray lrs;
      for (double s : kRateScale) lrs.append(o.lr * s);
      optimizers.append(QJsonObject{{"kind", optimizer_name(o.kind)},
                                    {"lrs", lrs},
                                    {"momentum", o.momentum},
                                    {"dampening", o.dampening},
                                    {"nesterov", o.nesterov},
                                    {"weight_decay", o.weight_decay},
                                    {"beta1", o.beta1},
                                    {"beta2", o.beta2},
                                    {"eps", o.eps},
                                    {"clip_grad_norm", c.clip},
                                    {"out", path("optim_" + slug(c.name) + ".f32")}});
    }
    job["optimizers"] = optimizers;
    QJsonArray schedules;
    for (const ScheduleCase& c : schedule_cases()) {
      const ScheduleOptions& s = c.options;
      schedules.append(QJsonObject{{"kind", schedule_name(s.kind)},
                                   {"lr", kScheduleLr},
                                   {"epochs", static_cast<double>(kEpochs)},
                                   {"steps_per_epoch", static_cast<double>(kPerEpoch)},
                                   {"warmup_epochs", static_cast<double>(s.warmup_epochs)},
                                   {"step_size", static_cast<double>(s.step_size)},
                                   {"gamma", s.gamma},
                                   {"min_lr", s.min_lr},
                                   {"out", path("schedule_" + slug(c.name) + ".f64")}});
    }
    job["schedules"] = schedules;
    logits_ = random_floats(kLossN * kLossClasses, 50, -3, 3);
    for (int64_t i = 0; i < kLossN; ++i) labels_.push_back(static_cast<float>((i * 3) % kLossClasses));
    write_raw(path("logits.f32"), logits_);
    write_raw(path("labels.f32"), labels_);
    QJsonArray losses;
    for (double e : kSmoothing)
      losses.append(QJsonObject{{"logits", path("logits.f32")},
                                {"labels", path("labels.f32")},
                                {"n", static_cast<double>(kLossN)},
                                {"classes", static_cast<double>(kLossClasses)},
                                {"label_smoothing", e},
                                {"out", path(QString("loss_%1.f64").arg(e))}});
    job["losses"] = losses;
    QFile jf(path("jobs.json"));
    QVERIFY(jf.open(QIODevice::WriteOnly));
    jf.write(QJsonDocument(job).toJson());
    jf.close();

    QProcess py;
    py.start(GN_PYTHON, {GN_TORCH_OPTIM_PEER, jf.fileName()});
    QVERIFY2(py.waitForStarted(30000), qPrintable(py.errorString()));
    QVERIFY2(py.waitForFinished(300000), "the torch peer did not finish in 5 minutes");
    const QString err = QString::fromUtf8(py.readAllStandardError());
    if (py.exitStatus() == QProcess::NormalExit && py.exitCode() == 3)
      QSKIP(qPrintable(GN_PYTHON " cannot import torch (apt-get install python3-torch): " + err.trimmed()));
    QVERIFY2(py.exitStatus() == QProcess::NormalExit && py.exitCode() == 0,
             qPrintable("the torch peer failed: " + err));
    const QJsonObject answer = QJsonDocument::fromJson(py.readAllStandardOutput().trimmed()).object();
    qInfo("torch %s", qPrintable(answer["torch"].toString()));
  }

  void optimizers_match_torch_data() {
    QTest::addColumn<int>("index");
    const auto cases = optim_cases();
    for (size_t i = 0; i < cases.size(); ++i) QTest::newRow(cases[i].name) << static_cast<int>(i);
  }
  void optimizers_match_torch() {
    QFETCH(int, index);
    const OptimCase c = optim_cases()[static_cast<size_t>(index)];
    std::vector<Tensor> params;
    size_t at = 0;
    for (const Shape& s : kShapes) {
      const auto n = static_cast<size_t>(numel(s));
      params.push_back(from_values(rt_, s, device_, {params_.begin() + at, params_.begin() + at + n}));
      at += n;
    }
    std::vector<OptimizerState> states(params.size());
    for (int t = 0; t < kSteps; ++t) {
      std::vector<Tensor> grads;
      at = 0;
      for (const Shape& s : kShapes) {
        const auto n = static_cast<size_t>(numel(s));
        grads.push_back(from_values(rt_, s, device_, {grads_[t].begin() + at, grads_[t].begin() + at + n}));
        at += n;
      }
      const Tensor clip = c.clip > 0 ? grad_clip_coefficient(grads, static_cast<float>(c.clip)) : Tensor();
      if (clip.defined())
        qInfo("step %d: gradient norm %.6f, clip factor %.6f", t + 1, double(to_host(clip)[0]),
              double(to_host(clip)[1]));
      optimizer_step(params, grads, states, c.options, c.options.lr * kRateScale[t], t + 1, clip);
    }
    std::vector<float> got;
    for (const Tensor& p : params) {
      const auto v = to_host(p);
      got.insert(got.end(), v.begin(), v.end());
    }
    const auto want = read_raw<float>(path("optim_" + slug(c.name) + ".f32"));
    QCOMPARE(got.size(), want.size());
    double worst = 0, moved = 0;
    size_t where = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      const double d = std::abs(double(got[i]) - want[i]) / std::max(1.0, std::abs(double(want[i])));
      if (!(d <= worst)) worst = d, where = i;
      moved = std::max(moved, std::abs(double(want[i]) - params_[i]));
    }
    qInfo(
        "%s: largest difference from torch %.3g (relative to max(|p|, 1)); torch moved the parameters by "
        "up to %.3g",
        c.name, worst, moved);
    QVERIFY(moved > 1e-3);  // the steps did something to compare
    QVERIFY2(worst <= kParamTol, qPrintable(QString("parameter %1 is %2, torch has %3")
                                                .arg(where)
                                                .arg(double(got[where]), 0, 'g', 9)
                                                .arg(double(want[where]), 0, 'g', 9)));
  }

  void schedules_match_torch_data() {
    QTest::addColumn<int>("index");
    const auto cases = schedule_cases();
    for (size_t i = 0; i < cases.size(); ++i) QTest::newRow(cases[i].name) << static_cast<int>(i);
  }
  void schedules_match_torch() {
    QFETCH(int, index);
    const ScheduleCase c = schedule_cases()[static_cast<size_t>(index)];
    const auto want = read_raw<double>(path("schedule_" + slug(c.name) + ".f64"));
    QCOMPARE(want.size(), size_t(kEpochs * kPerEpoch));
    double worst = 0;
    for (int64_t k = 0; k < kEpochs * kPerEpoch; ++k) {
      const double got = scheduled_lr(c.options, kScheduleLr, k, kPerEpoch, kEpochs);
      const double d = std::abs(got - want[k]) / want[k];
      worst = std::max(worst, d);
      if (!(d <= kRateTol))
        QFAIL(qPrintable(
            QString("batch %1: rate %2, torch %3").arg(k).arg(got, 0, 'g', 17).arg(want[k], 0, 'g', 17)));
    }
    qInfo("%s: largest relative difference from torch %.3g; rates %.6g .. %.6g", c.name, worst,
          *std::min_element(want.begin(), want.end()), *std::max_element(want.begin(), want.end()));
  }

  void label_smoothing_matches_torch() {
    const Tensor z = from_values(rt_, {kLossN, kLossClasses}, device_, logits_);
    const Tensor y = from_values(rt_, {kLossN}, device_, labels_);
    for (double e : kSmoothing) {
      const CrossEntropy ce = softmax_cross_entropy(z, y, true, 0, static_cast<float>(e));
      const auto want = read_raw<double>(path(QString("loss_%1.f64").arg(e)));
      QCOMPARE(want.size(), size_t(1 + kLossN * kLossClasses));
      const double loss = to_host(ce.loss)[0];
      const auto grad = to_host(ce.dlogits);
      double worst = 0;
      for (size_t i = 0; i < grad.size(); ++i) worst = std::max(worst, std::abs(grad[i] - want[1 + i]));
      qInfo("label_smoothing %.1f: loss %.8f, torch %.8f; largest gradient difference %.3g", e, loss, want[0],
            worst);
      QVERIFY(std::abs(loss - want[0]) <= 1e-6 * want[0]);
      QVERIFY(worst <= 1e-7);
    }
  }
};

QTEST_GUILESS_MAIN(TorchOptimTest)
#include "test_torch_optim.moc"
