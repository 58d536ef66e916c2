// The training layer on CUDA (cuDNN, cuBLAS, NCCL) against the CPU. The whole suite skips where there is no
// GPU; the layer-by-layer checks are test_nn_layers_cuda.
#include <QtTest>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "gpunodes/errors.h"
#include "gpunodes/nn/serialize.h"
#include "gpunodes/nn/trainer.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

double max_rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::abs(double(a[i]) - b[i]) / std::max(1e-2, std::abs(double(a[i]))));
  return worst;
}

double max_rel_diff(const Model& a, const Model& b) {
  double worst = 0;
  auto sa = a.state(), sb = b.state();
  for (size_t i = 0; i < sa.size(); ++i)
    worst = std::max(worst, max_rel_diff(to_host(sa[i]->value), to_host(sb[i]->value)));
  return worst;
}

DatasetPtr synthetic(int64_t count) {
  return make_synthetic({.count = count, .seed = 11});
}

}  // namespace

class NnCudaTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;
  const Device gpu_ = Device::cuda(0);

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>();
    if (rt_->cuda_device_count() == 0) QSKIP("no CUDA device here");
    set_cudnn_allow_tf32(false);  // full fp32, so the CPU comparison is tight
  }
  void cleanupTestCase() { rt_.reset(); }

  void same_seed_same_parameters_as_the_cpu() {
    for (Arch a : {Arch::Mlp, Arch::LeNet, Arch::ResNet18}) {
      auto c = Model::create(*rt_, modelOptions(a, 5), Device::cpu());
      auto g = Model::create(*rt_, modelOptions(a, 5), gpu_);
      QCOMPARE(g->describe()[0].device, gpu_);
      for (size_t i = 0; i < c->state().size(); ++i)
        QCOMPARE(to_host(g->state()[i]->value), to_host(c->state()[i]->value));
    }
  }

  void forward_and_backward_match_the_cpu_data() {
    QTest::addColumn<int>("arch");
    QTest::newRow("mlp") << static_cast<int>(Arch::Mlp);
    QTest::newRow("lenet") << static_cast<int>(Arch::LeNet);
    QTest::newRow("resnet18") << static_cast<int>(Arch::ResNet18);
  }
  void forward_and_backward_match_the_cpu() {
    QFETCH(int, arch);
    auto c = Model::create(*rt_, modelOptions(static_cast<Arch>(arch), 7), Device::cpu());
    auto g = Model::create(*rt_, modelOptions(static_cast<Arch>(arch), 7), gpu_);
    Tensor xc = uniform(*rt_, {8, 1, 28, 28}, Device::cpu(), 3);
    Tensor yc = from_values(*rt_, {8}, Device::cpu(), {0, 1, 2, 3, 4, 5, 6, 7});
    Tensor xg = copy(xc, gpu_), yg = copy(yc, gpu_);
    QVERIFY(max_rel_diff(to_host(forward(*c, xc)), to_host(forward(*g, xg))) < 1e-3);
    CrossEntropy cc = softmax_cross_entropy(c->forward(xc, Mode::Train), yc);
    CrossEntropy cg = softmax_cross_entropy(g->forward(xg, Mode::Train), yg);
    QVERIFY(std::abs(item(cc.loss) - item(cg.loss)) < 1e-4);
    c->backward(cc.dlogits);
    g->backward(cg.dlogits);
    auto pc = c->parameters(), pg = g->parameters();
    for (size_t i = 0; i < pc.size(); ++i) {
      const auto a = to_host(pc[i]->grad), b = to_host(pg[i]->grad);
      double scale = 0;
      for (float v : a) scale = std::max(scale, double(std::abs(v)));
      for (size_t j = 0; j < a.size(); ++j)
        if (std::abs(a[j] - b[j]) > 1e-3 * scale + 1e-7)
          QFAIL(
              qPrintable(QString::fromStdString(pc[i]->name) + " gradient differs at " + QString::number(j)));
    }
  }

  void training_on_the_gpu_follows_the_cpu() {
    auto c = Model::create(*rt_, modelOptions(Arch::LeNet, 1), Device::cpu());
    auto g = Model::create(*rt_, modelOptions(Arch::LeNet, 1), gpu_);
    TrainOptions o;
    o.batch_size = 128;
    o.sgd = {0.1f, 0.9f, 0};
    Trainer tc(*c, {Device::cpu()}, o), tg(*g, {gpu_}, o);
    DataLoader loader(synthetic(128 * 5), {.batch_size = 128, .pinned = true});
    loader.start_epoch(0);
    while (auto b = loader.next()) {
      QVERIFY(b->pinned);
      tc.step(b);
      tg.step(b);
    }
    tc.synchronize();
    tg.synchronize();
    const double diff = max_rel_diff(*c, *g);
    qInfo("LeNet after 5 steps, CUDA vs CPU: largest relative difference %.3g", diff);
    QVERIFY(diff < 1e-2);
  }

  void save_on_the_gpu_load_on_the_cpu() {
    auto g = Model::create(*rt_, modelOptions(Arch::ResNet18, 3), gpu_);
    const std::string path = (std::filesystem::temp_directory_path() / "gn_nn_cuda_test.gnparams").string();
    save_params(*g, path);
    auto c = load_model(*rt_, path, Device::cpu());
    for (size_t i = 0; i < c->state().size(); ++i)
      QCOMPARE(to_host(c->state()[i]->value), to_host(g->state()[i]->value));
    auto back = Model::create(*rt_, modelOptions(Arch::ResNet18, 4), gpu_);
    load_params(*back, path);
    QCOMPARE(to_host(back->state().back()->value), to_host(c->state().back()->value));
    std::filesystem::remove(path);
  }

  void gpu_and_cpu_together_equal_one_device() {
    // The seed's exercise 2: a GPU and the CPU share each batch; gradients meet on the host.
    auto one = Model::create(*rt_, modelOptions(Arch::Mlp, 2), gpu_);
    auto two = Model::create(*rt_, modelOptions(Arch::Mlp, 2), gpu_);
    TrainOptions o;
    o.batch_size = 128;
    Trainer t1(*one, {gpu_}, o), t2(*two, {gpu_, Device::cpu()}, o);
    t2.set_shares({0.75, 0.25});
    QCOMPARE(t2.reducer_name(), std::string("host"));
    DataLoader loader(synthetic(128 * 4), {.batch_size = 128});
    loader.start_epoch(0);
    while (auto b = loader.next()) {
      t1.step(b);
      t2.step(b);
    }
    t1.synchronize();
    t2.synchronize();
    QVERIFY(max_rel_diff(*one, *two) < 1e-3);
    QVERIFY(max_rel_diff(t2.replica(0), t2.replica(1)) < 1e-5);
  }

  void nccl_data_parallel_equals_one_gpu() {
    if (rt_->cuda_device_count() < 2) QSKIP("needs two GPUs");
    auto one = Model::create(*rt_, modelOptions(Arch::LeNet, 2), gpu_);
    auto two = Model::create(*rt_, modelOptions(Arch::LeNet, 2), gpu_);
    TrainOptions o;
    o.batch_size = 256;
    Trainer t1(*one, {gpu_}, o), t2(*two, {gpu_, Device::cuda(1)}, o);
    QCOMPARE(t2.reducer_name(), std::string("nccl"));
    DataLoader loader(synthetic(256 * 4), {.batch_size = 256, .pinned = true});
    loader.start_epoch(0);
    while (auto b = loader.next()) {
      t1.step(b);
      t2.step(b);
    }
    t1.synchronize();
    t2.synchronize();
    QVERIFY(max_rel_diff(*one, *two) < 1e-4);
    QCOMPARE(max_rel_diff(t2.replica(0), t2.replica(1)), 0.0);
  }

  void cancel_on_the_gpu_frees_memory() {
    auto m = Model::create(*rt_, modelOptions(Arch::LeNet), gpu_);
    rt_->engine().wait_all();
    const int64_t baseline = rt_->memory_stats(gpu_).allocated_bytes.current;
    {
      TrainOptions o;
      o.epochs = 5;
      o.log_every = 1;
      Trainer t(*m, {gpu_}, o);
      std::atomic<int> logs{0};
      std::chrono::steady_clock::time_point t0, done;
      std::thread worker([&] {
        try {
          t.fit(synthetic(60000), nullptr, [&](const MetricSample& s) {
            if (s.series == "loss") ++logs;
          });
        } catch (const CancelledError&) {
        }
        done = std::chrono::steady_clock::now();
      });
      while (logs < 10) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      t0 = std::chrono::steady_clock::now();
      rt_->engine().cancel();
      worker.join();
      QVERIFY(std::chrono::duration<double>(done - t0).count() < 1.0);
    }
    rt_->engine().reset_cancel();
    QCOMPARE(rt_->memory_stats(gpu_).allocated_bytes.current, baseline);
  }
};

QTEST_GUILESS_MAIN(NnCudaTest)
#include "test_nn_cuda.moc"
