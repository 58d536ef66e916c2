// Predictions: an MLP's probabilities over a synthetic set against a plain float64 forward pass, the
// confusion matrix, per-class accuracy and the mistakes against loops written here, argmax ties against the
// loss kernel's accuracy count, and the accuracy read from predictions against evaluate().
// GN_TEST_DEVICE=cuda:0 runs the model on a GPU instead (skipped without one).
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <map>

#include "gpunodes/errors.h"
#include "gpunodes/nn/predict.h"
#include "gpunodes/nn/trainer.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

constexpr int64_t kClasses = 4, kSide = 6;

// The MLP's logits for every sample, in float64 from its parameters: Flatten, Linear, ReLU, Linear.
std::vector<std::vector<double>> naiveLogits(const Model& m, const Dataset& d) {
  std::map<std::string, std::vector<float>> p;
  for (const Parameter* s : m.state()) p[s->name] = to_host(s->value);
  const auto &w1 = p.at("1.weight"), &b1 = p.at("1.bias"), &w2 = p.at("3.weight"), &b2 = p.at("3.bias");
  const int64_t in = d.sample_numel(), hidden = static_cast<int64_t>(b1.size()),
                out = static_cast<int64_t>(b2.size());
  std::vector<std::vector<double>> z(static_cast<size_t>(d.count));
  for (int64_t i = 0; i < d.count; ++i) {
    std::vector<double> h(static_cast<size_t>(hidden));
    for (int64_t j = 0; j < hidden; ++j) {
      double s = b1[j];
      for (int64_t k = 0; k < in; ++k) s += double(w1[j * in + k]) * (d.images[i * in + k] / 255.0);
      h[j] = std::max(0.0, s);
    }
    z[i].resize(static_cast<size_t>(out));
    for (int64_t c = 0; c < out; ++c) {
      double s = b2[c];
      for (int64_t j = 0; j < hidden; ++j) s += double(w2[c * hidden + j]) * h[j];
      z[i][c] = s;
    }
  }
  return z;
}

std::vector<double> naiveSoftmax(const std::vector<double>& z) {
  const double mx = *std::max_element(z.begin(), z.end());
  double sum = 0;
  for (double v : z) sum += std::exp(v - mx);
  std::vector<double> p;
  for (double v : z) p.push_back(std::exp(v - mx) / sum);
  return p;
}

// The gap between the largest and second-largest values: below float32's resolution the two computations may
// rank the pair differently, and such a sample says nothing about the order.
double topGap(const std::vector<double>& v) {
  std::vector<double> s = v;
  std::sort(s.rbegin(), s.rend());
  return s.size() > 1 ? s[0] - s[1] : 1.0;
}

}  // namespace

class PredictTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;
  Device device_ = Device::cpu();
  std::unique_ptr<Model> model_;
  DatasetPtr test_;

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>(RuntimeOptions{});
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("predictions on %s", device_.str().c_str());
    // Noisy classes and three short epochs: a model that is right often but not always, so that the matrix
    // has both a diagonal and mistakes.
    SyntheticOptions so;
    so.classes = kClasses;
    so.height = so.width = kSide;
    so.noise = 230;
    so.count = 256;
    so.seed = 3;
    DatasetPtr train = make_synthetic(so);
    // The class patterns come from the seed: the same seed, so the model has seen them. 203 is not a
    // multiple of the batch sizes used: the last batch is short.
    so.count = 203;
    test_ = make_synthetic(so);
    ModelOptions mo = modelOptions(Arch::Mlp, 5);
    mo.classes = kClasses;
    mo.image_size = kSide;
    mo.init = Init::Kaiming;
    model_ = Model::create(*rt_, mo, device_);
    TrainOptions to;
    to.epochs = 3;
    to.batch_size = 32;
    to.log_every = 0;
    Trainer(*model_, {device_}, to).fit(train, nullptr);
  }

  void cleanupTestCase() {
    model_.reset();
    rt_.reset();
  }

  void probabilities_match_a_float64_forward() {
    const Predictions p = predict(*model_, test_, 32);
    QCOMPARE(p.count, test_->count);
    QCOMPARE(p.classes, kClasses);
    QCOMPARE(p.probabilities.size(), size_t(test_->count * kClasses));
    const auto z = naiveLogits(*model_, *test_);
    int ranked = 0;
    for (int64_t i = 0; i < p.count; ++i) {
      QCOMPARE(p.labels[i], int64_t(test_->labels[i]));
      const std::vector<double> want = naiveSoftmax(z[i]);
      double sum = 0;
      for (int64_t c = 0; c < kClasses; ++c) {
        sum += p.row(i)[c];
        QVERIFY2(std::abs(p.row(i)[c] - want[c]) < 2e-5,
                 qPrintable(
                     QString("sample %1 class %2: %3, want %4").arg(i).arg(c).arg(p.row(i)[c]).arg(want[c])));
      }
      QVERIFY(std::abs(sum - 1.0) < 1e-5);
      if (topGap(z[i]) < 1e-4) continue;
      ++ranked;
      QCOMPARE(p.predicted[i], int64_t(std::max_element(z[i].begin(), z[i].end()) - z[i].begin()));
    }
    QVERIFY(ranked > p.count * 9 / 10);
    const int64_t wrong = p.count - p.correct();
    qInfo("accuracy %.3f, %lld mistakes", p.accuracy(), (long long)wrong);
    QVERIFY2(wrong > 10 && wrong < p.count - 10,
             "the test wants a model that is neither right nor wrong throughout");
  }

  void accuracy_equals_evaluate() {
    for (int64_t batch : {1, 32, 64, 256}) {
      const Predictions p = predict(*model_, test_, batch);
      const double want = evaluate(*model_, test_, batch);
      QCOMPARE(p.accuracy(), want);
      QCOMPARE(double(p.correct()), want * double(test_->count));
    }
  }

  void confusion_and_per_class_match_plain_loops() {
    const Predictions p = predict(*model_, test_, 50);
    const ConfusionMatrix m = confusion_matrix(p);
    QCOMPARE(m.size(), size_t(kClasses));
    int64_t total = 0, diagonal = 0;
    for (int64_t t = 0; t < kClasses; ++t) {
      QCOMPARE(m[t].size(), size_t(kClasses));
      for (int64_t c = 0; c < kClasses; ++c) {
        int64_t n = 0;
        for (int64_t i = 0; i < p.count; ++i) n += test_->labels[i] == t && p.predicted[i] == c;
        QCOMPARE(m[t][c], n);
        total += n;
      }
      diagonal += m[t][t];
    }
    QCOMPARE(total, test_->count);
    QCOMPARE(diagonal, p.correct());
    const std::vector<double> acc = per_class_accuracy(m);
    QCOMPARE(acc.size(), size_t(kClasses));
    for (int64_t t = 0; t < kClasses; ++t) {
      int64_t right = 0, seen = 0;
      for (int64_t i = 0; i < p.count; ++i)
        if (test_->labels[i] == t) ++seen, right += p.predicted[i] == t;
      QVERIFY(seen > 0);
      QCOMPARE(acc[t], double(right) / double(seen));
    }
    // A class without samples has no accuracy.
    const std::vector<double> empty = per_class_accuracy({{3, 1, 0}, {0, 0, 0}, {2, 0, 5}});
    QCOMPARE(empty[0], 0.75);
    QVERIFY(std::isnan(empty[1]));
    QCOMPARE(empty[2], 5.0 / 7.0);
  }

  void mistakes_are_the_wrong_ones_most_confident_first() {
    const Predictions p = predict(*model_, test_, 64);
    const auto z = naiveLogits(*model_, *test_);
    const std::vector<Mistake> all = mistakes(p);
    QCOMPARE(int64_t(all.size()), p.count - p.correct());
    std::vector<bool> listed(size_t(p.count), false);
    for (size_t k = 0; k < all.size(); ++k) {
      const Mistake& m = all[k];
      QVERIFY(!listed[m.index]);
      listed[m.index] = true;
      QCOMPARE(m.label, int64_t(test_->labels[m.index]));
      QVERIFY(m.predicted != m.label);
      QCOMPARE(m.predicted, p.predicted[m.index]);
      const std::vector<double> want = naiveSoftmax(z[m.index]);
      QVERIFY(std::abs(m.confidence - want[m.predicted]) < 2e-5);
      QVERIFY(std::abs(m.confidence - *std::max_element(want.begin(), want.end())) < 2e-5);
      if (k > 0) {
        QVERIFY2(all[k - 1].confidence >= m.confidence, "mistakes are not sorted by confidence");
        if (all[k - 1].confidence == m.confidence) QVERIFY(all[k - 1].index < m.index);
      }
      // The top 5 of 4 classes: every class once, starting with the prediction, in the float64 order
      // wherever two probabilities are apart.
      QCOMPARE(m.top5.size(), size_t(kClasses));
      QCOMPARE(m.top5[0].cls, m.predicted);
      std::vector<int64_t> order(kClasses);
      for (int64_t c = 0; c < kClasses; ++c) order[c] = c;
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return want[a] > want[b]; });
      for (size_t r = 0; r < m.top5.size(); ++r) {
        QCOMPARE(m.top5[r].p, p.row(m.index)[m.top5[r].cls]);
        if (r > 0) QVERIFY(m.top5[r - 1].p >= m.top5[r].p);
        const bool apart = (r == 0 || want[order[r - 1]] - want[order[r]] > 1e-5) &&
                           (r + 1 == order.size() || want[order[r]] - want[order[r + 1]] > 1e-5);
        if (apart) QCOMPARE(m.top5[r].cls, order[r]);
      }
    }
    for (int64_t i = 0; i < p.count; ++i) QCOMPARE(listed[i], p.predicted[i] != p.labels[i]);
    // A limit keeps the head of the same order.
    const std::vector<Mistake> head = mistakes(p, 7);
    QCOMPARE(head.size(), size_t(7));
    for (size_t k = 0; k < head.size(); ++k) QCOMPARE(head[k].index, all[k].index);
    QVERIFY(mistakes(p, 0).empty());
    QCOMPARE(mistakes(p, 100000).size(), all.size());
  }

  void argmax_ties_follow_the_loss_kernels_count() {
    // Logits of few distinct values tie often; the loss's accuracy count and argmax must agree on each row.
    const int64_t n = 300, c = 5;
    std::vector<float> z(static_cast<size_t>(n * c)), labels(static_cast<size_t>(n));
    uint64_t s = 12345;
    auto next = [&] { return (s = s * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
    for (float& v : z) v = float(next() % 3);
    for (float& l : labels) l = float(next() % c);
    Tensor zt = from_values(*rt_, {n, c}, device_, z), lt = from_values(*rt_, {n}, device_, labels);
    const float kernel = to_host(softmax_cross_entropy(zt, lt, false).stats)[1];
    int64_t mine = 0, ties = 0;
    for (int64_t i = 0; i < n; ++i) {
      mine += argmax(&z[i * c], c) == int64_t(labels[i]);
      ties += std::count(&z[i * c], &z[i * c] + c, *std::max_element(&z[i * c], &z[i * c] + c)) > 1;
    }
    QVERIFY(ties > n / 2);
    QCOMPARE(double(mine), double(kernel));
    // Labels at each row's first maximum: every row counts, so no later maximum is taken instead.
    for (int64_t i = 0; i < n; ++i) labels[i] = float(argmax(&z[i * c], c));
    lt = from_values(*rt_, {n}, device_, labels);
    QCOMPARE(to_host(softmax_cross_entropy(zt, lt, false).stats)[1], float(n));

    const float a[] = {1, 3, 3, 2}, b[] = {NAN, 1, 2}, d[] = {1, NAN, 2}, e[] = {-1};
    QCOMPARE(argmax(a, 4), int64_t(1));
    QCOMPARE(argmax(b, 3), int64_t(0));
    QCOMPARE(argmax(d, 3), int64_t(2));
    QCOMPARE(argmax(e, 1), int64_t(0));
  }

  void softmax_and_top_k() {
    const float z[] = {1000, 999, -5, 1000};
    float p[4];
    softmax(z, 4, p);
    const double e1 = std::exp(-1.0), e = 2 + e1 + std::exp(-1005.0);
    QVERIFY(std::abs(p[0] - 1 / e) < 1e-7 && std::abs(p[1] - e1 / e) < 1e-7 && p[2] < 1e-30);
    QCOMPARE(p[0], p[3]);
    const auto top = top_k(p, 4, 5);
    QCOMPARE(top.size(), size_t(4));
    QCOMPARE(top[0].cls, int64_t(0));  // the tie goes to the lower class, as argmax does
    QCOMPARE(top[1].cls, int64_t(3));
    QCOMPARE(top[2].cls, int64_t(1));
    QCOMPARE(top[3].cls, int64_t(2));
    QCOMPARE(top_k(p, 4, 2).size(), size_t(2));
    const float q[] = {0.1f, 0.5f, 0.5f, NAN, 0.2f};
    const auto forced = top_k(q, 5, 5, 2);
    QCOMPARE(forced[0].cls, int64_t(2));
    QCOMPARE(forced[1].cls, int64_t(1));
    QCOMPARE(forced[2].cls, int64_t(4));
    QCOMPARE(forced[3].cls, int64_t(0));
    QCOMPARE(forced[4].cls, int64_t(3));
  }

  void class_names_come_from_the_dataset() {
    Dataset d;
    d.name = "fashion-mnist/test[:100]";
    const auto fashion = class_names(d, 10);
    QCOMPARE(fashion.size(), size_t(10));
    QCOMPARE(fashion[0], std::string("t-shirt"));
    QCOMPARE(fashion[6], std::string("shirt"));
    QCOMPARE(fashion[9], std::string("ankle boot"));
    d.name = "image_folder/test";
    d.class_names = {"cat", "dog"};
    QCOMPARE(class_names(d, 3), (std::vector<std::string>{"cat", "dog", "class 2"}));
    d.name = "synthetic";
    d.class_names.clear();
    QCOMPARE(class_names(d, 2), (std::vector<std::string>{"class 0", "class 1"}));
  }

  void refuses_labels_the_model_cannot_predict() {
    SyntheticOptions so;
    so.classes = kClasses + 2;
    so.height = so.width = kSide;
    so.count = 64;
    expect_error([&] { predict(*model_, make_synthetic(so), 16); }, {"label", "4 classes"});
    expect_error([&] { predict(*model_, nullptr); }, {"empty"});
  }
};

QTEST_MAIN(PredictTest)
#include "test_predict.moc"
