// Training: the MLP learns the real Fashion-MNIST on the CPU; data parallel over two CPU devices equals one
// device with the same total batch; cancel mid-epoch returns quickly and gives the memory back; metrics
// stream.
#include <QtTest>
#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <thread>

#include "gpunodes/errors.h"
#include "gpunodes/nn/trainer.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;
using Clock = std::chrono::steady_clock;

namespace {

// Largest |a - b| relative to max(1, |a|) over every parameter and buffer.
double max_rel_diff(const Model& a, const Model& b) {
  double worst = 0;
  auto sa = a.state(), sb = b.state();
  for (size_t i = 0; i < sa.size(); ++i) {
    auto va = to_host(sa[i]->value), vb = to_host(sb[i]->value);
    for (size_t j = 0; j < va.size(); ++j)
      worst = std::max(worst, std::abs(double(va[j]) - vb[j]) / std::max(1.0, std::abs(double(va[j]))));
  }
  return worst;
}

bool identical(const Model& a, const Model& b) {
  auto sa = a.state(), sb = b.state();
  for (size_t i = 0; i < sa.size(); ++i)
    if (to_host(sa[i]->value) != to_host(sb[i]->value)) return false;
  return true;
}

}  // namespace

class NnTrainTest : public QObject {
  Q_OBJECT

 private slots:
  void mlp_learns_fashion_mnist_on_the_cpu() {
    // The setting: 3 epochs, batch 256, lr 0.1, normal(0.01) weights. PyTorch reaches 0.80 here.
    Runtime rt;
    auto mlp = Model::create(rt, modelOptions(Arch::Mlp, 1), Device::cpu());
    TrainOptions o;
    o.epochs = 3;
    o.batch_size = 256;
    o.optimizer.lr = 0.1;
    o.log_every = 50;
    // Deterministic for a given thread count. Model and shuffle seeds 0..3 give 0.790-0.818 at epoch 3 here,
    // PyTorch 0.798-0.816 (torch seeds 0..2).
    o.shuffle_seed = 1;
    Trainer trainer(*mlp, {Device::cpu()}, o);
    std::map<std::string, std::vector<MetricSample>> series;
    TrainResult r = trainer.fit(load_fashion_mnist(Split::Train), load_fashion_mnist(Split::Test),
                                [&](const MetricSample& m) { series[m.series].push_back(m); });
    QCOMPARE(r.epochs.size(), size_t(3));
    for (const auto& e : r.epochs)
      qInfo("epoch %lld: loss %.4f, train acc %.4f, test acc %.4f, %.2f s, %.0f images/s", (long long)e.epoch,
            e.train_loss, e.train_acc, e.test_acc, e.seconds, e.images_per_second);
    QVERIFY2(r.epochs.back().test_acc >= 0.78, qPrintable(QString::number(r.epochs.back().test_acc)));
    QVERIFY(r.epochs.back().train_loss < r.epochs.front().train_loss);
    // The live series: loss every 50 batches (4 per epoch) plus the epoch's, one test accuracy per epoch.
    QCOMPARE(series["loss"].size(), size_t(3 * 5));
    QCOMPARE(series["test_acc"].size(), size_t(3));
    QCOMPARE(series["epoch_seconds"].size(), size_t(3));
    QCOMPARE(series["memory_mb/cpu"].size(), size_t(3));
    QVERIFY(series["peak_memory_mb/cpu"].back().value > 0);
    QVERIFY(series["images_per_second"].front().value > 0);
    QCOMPARE(series["loss"][0].step, int64_t(50));
    QVERIFY(std::abs(series["loss"][0].epoch - 50.0 / 235) < 1e-9);
    QVERIFY(series["loss"].back().value < series["loss"].front().value);
    QCOMPARE(series["test_acc"].back().value, r.epochs.back().test_acc);
    // The trained state is in the model; the free evaluate() agrees with the trainer's.
    QVERIFY(std::abs(evaluate(*mlp, load_fashion_mnist(Split::Test)) - r.epochs.back().test_acc) < 1e-9);
    QVERIFY(!mlp->parameters()[0]->grad.defined());  // gradients released, as zero_grad(set_to_none)
  }

  void data_parallel_equals_one_device_data() {
    QTest::addColumn<int>("arch");
    QTest::addColumn<double>("share0");
    QTest::newRow("mlp, even split") << static_cast<int>(Arch::Mlp) << 0.5;
    QTest::newRow("lenet, even split") << static_cast<int>(Arch::LeNet) << 0.5;
    QTest::newRow("mlp, 3:1 split") << static_cast<int>(Arch::Mlp) << 0.75;
  }
  void data_parallel_equals_one_device() {
    QFETCH(int, arch);
    QFETCH(double, share0);
    Runtime rt({.cpu_devices = 2});
    const ModelOptions o = modelOptions(static_cast<Arch>(arch), 3);
    auto single = Model::create(rt, o, Device::cpu(0));
    auto parallel = Model::create(rt, o, Device::cpu(0));
    TrainOptions to;
    to.batch_size = 128;
    to.optimizer.lr = 0.1;
    to.optimizer.momentum = 0.9;  // momentum and weight decay too
    to.optimizer.weight_decay = 1e-4;
    Trainer one(*single, {Device::cpu(0)}, to);
    Trainer two(*parallel, {Device::cpu(0), Device::cpu(1)}, to);
    two.set_shares({share0, 1 - share0});
    QCOMPARE(two.reducer_name(), std::string("host"));
    QCOMPARE(two.replica(1).device(), Device::cpu(1));
    DataLoader loader(take(load_fashion_mnist(Split::Train), 128 * 6), {.batch_size = 128, .seed = 4});
    loader.start_epoch(0);
    int steps = 0;
    while (auto b = loader.next()) {
      one.step(b);
      two.step(b);
      ++steps;
    }
    one.synchronize();
    two.synchronize();
    QCOMPARE(steps, 6);
    // Every replica took the same step from the same sums: they are bit-identical.
    QVERIFY(identical(two.replica(0), two.replica(1)));
    const double diff = max_rel_diff(*single, *parallel);
    qInfo("largest relative difference after %d steps: %.3g", steps, diff);
    QVERIFY2(diff < 2e-5, qPrintable(QString::number(diff)));
    const StepTotals t1 = one.totals(), t2 = two.totals();
    QCOMPARE(t1.samples, t2.samples);
    QVERIFY(std::abs(t1.loss() - t2.loss()) < 1e-4);
    QCOMPARE(t1.correct, t2.correct);
  }

  void splits_follow_the_shares() {
    Runtime rt({.cpu_devices = 2});
    auto m = Model::create(rt, modelOptions(Arch::Mlp), Device::cpu(0));
    Trainer t(*m, {Device::cpu(0), Device::cpu(1)});
    QCOMPARE(t.split(256), (std::vector<int64_t>{128, 128}));
    QCOMPARE(t.split(97), (std::vector<int64_t>{49, 48}));
    t.set_shares({3, 1});
    QCOMPARE(t.split(256), (std::vector<int64_t>{192, 64}));
    QCOMPARE(t.split(1), (std::vector<int64_t>{1, 0}));
    QVERIFY_THROWS_EXCEPTION(Error, t.set_shares({0, 0}));
    QVERIFY_THROWS_EXCEPTION(Error, Trainer(*m, {Device::cpu(0), Device::cpu(0)}));
    QVERIFY_THROWS_EXCEPTION(Error, Trainer(*m, {Device::cpu(5)}));
    QVERIFY_THROWS_EXCEPTION(Error, t.fit(nullptr, nullptr));
  }

  void balancing_measures_each_device() {
    // Two CPU devices of equal speed: measured shares stay near even, sum to one, and are reported.
    Runtime rt({.cpu_devices = 2});
    auto m = Model::create(rt, modelOptions(Arch::Mlp), Device::cpu(0));
    TrainOptions o;
    o.epochs = 1;
    o.batch_size = 64;
    o.log_every = 5;
    o.balance = true;
    Trainer t(*m, {Device::cpu(0), Device::cpu(1)}, o);
    std::vector<double> shares;
    t.fit(take(load_fashion_mnist(Split::Train), 64 * 20), nullptr, [&](const MetricSample& s) {
      if (s.series == "share/cpu:1") shares.push_back(s.value);
    });
    QCOMPARE(shares.size(), size_t(1));
    QVERIFY(std::abs(t.shares()[0] + t.shares()[1] - 1) < 1e-9);
    QVERIFY2(shares[0] > 0.1 && shares[0] < 0.9, qPrintable(QString::number(shares[0])));
  }

  void training_a_model_on_another_device_leaves_the_result_in_the_model() {
    Runtime rt({.cpu_devices = 2});
    auto m = Model::create(rt, modelOptions(Arch::Mlp, 2), Device::cpu(1));
    const auto before = to_host(m->state()[0]->value);
    TrainOptions o;
    o.epochs = 1;
    o.batch_size = 64;
    Trainer t(*m, {Device::cpu(0)}, o);  // replica 0 is a copy on cpu:0
    t.fit(take(load_fashion_mnist(Split::Train), 256), nullptr);
    QVERIFY(to_host(m->state()[0]->value) != before);
    QVERIFY(identical(*m, t.replica(0)));
  }

  void engine_cancel_mid_epoch_returns_fast_and_frees_memory() {
    Runtime rt;
    auto m = Model::create(rt, modelOptions(Arch::Mlp), Device::cpu());
    rt.engine().wait_all();
    const int64_t baseline = rt.memory_stats(Device::cpu()).allocated_bytes.current;
    DatasetPtr train = load_fashion_mnist(Split::Train);
    std::atomic<int> batches{0};
    std::atomic<bool> cancelled{false};
    Clock::time_point returned;
    {
      TrainOptions o;
      o.epochs = 5;
      o.log_every = 1;
      Trainer t(*m, {Device::cpu()}, o);
      std::thread worker([&] {
        try {
          t.fit(train, nullptr, [&](const MetricSample& s) {
            if (s.series == "loss") ++batches;
          });
        } catch (const CancelledError&) {
          cancelled = true;
        }
        returned = Clock::now();
      });
      while (batches < 20) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      const auto t0 = Clock::now();
      rt.engine().cancel();
      worker.join();
      const double secs = std::chrono::duration<double>(returned - t0).count();
      qInfo("fit returned %.3f s after the engine's cancel", secs);
      QVERIFY(cancelled);
      QVERIFY2(secs < 1.0, qPrintable(QString::number(secs)));
      QCOMPARE(rt.engine().pending(), size_t(0));
    }
    rt.engine().reset_cancel();
    QCOMPARE(rt.memory_stats(Device::cpu()).allocated_bytes.current, baseline);
    // Updates dropped by the cancel (almost always one) left their error on the parameters; clear_errors()
    // accepts the state they hold.
    Tensor x = zeros(rt, {1, 1, 28, 28}, Device::cpu());
    m->clear_errors();
    QCOMPARE(to_host(forward(*m, x)).size(), size_t(10));
  }

  void trainer_cancel_stops_at_the_next_batch() {
    Runtime rt({.cpu_devices = 2});
    auto m = Model::create(rt, modelOptions(Arch::LeNet), Device::cpu(0));
    rt.engine().wait_all();
    const int64_t base0 = rt.memory_stats(Device::cpu(0)).allocated_bytes.current;
    const int64_t base1 = rt.memory_stats(Device::cpu(1)).allocated_bytes.current;
    {
      TrainOptions o;
      o.epochs = 3;
      o.log_every = 2;
      Trainer t(*m, {Device::cpu(0), Device::cpu(1)}, o);
      std::atomic<int> logs{0};
      bool cancelled = false;
      Clock::time_point t0;
      std::thread canceller([&] {
        while (logs < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        t0 = Clock::now();
        t.cancel();
      });
      try {
        t.fit(load_fashion_mnist(Split::Train), load_fashion_mnist(Split::Test), [&](const MetricSample& s) {
          if (s.series == "loss") ++logs;
        });
      } catch (const CancelledError&) {
        cancelled = true;
      }
      const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
      canceller.join();
      QVERIFY(cancelled);
      QVERIFY2(secs < 1.0, qPrintable(QString::number(secs)));
      QVERIFY(!rt.engine().cancelled());  // the trainer's own cancel leaves the engine alone
    }
    QCOMPARE(rt.memory_stats(Device::cpu(0)).allocated_bytes.current, base0);
    QCOMPARE(rt.memory_stats(Device::cpu(1)).allocated_bytes.current, base1);
    // The model still works afterwards.
    QCOMPARE(forward(*m, zeros(rt, {1, 1, 28, 28}, Device::cpu(0))).shape(), (Shape{1, 10}));
  }
};

QTEST_GUILESS_MAIN(NnTrainTest)
#include "test_nn_train.moc"
