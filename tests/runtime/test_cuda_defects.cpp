// Checks for the CUDA defects of issue 26 (part 1) that a CPU can run, run on the CPU and again on cuda:0
// where there is a GPU: a captured step's memory outlives its queued replays, and an in-place add reads and
// writes one buffer. Nothing here QSKIPs (CTest would then count the whole suite as skipped, failures
// included); the CUDA-only checks are in test_nn_cuda.
#include <QtTest>
#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "gpunodes/backend.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/nn/trainer.h"
#include "gpunodes/ops.h"
#include "gpunodes/tensor.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

// A stand-in for a backend's captured work that holds nothing itself, as a CUDA graph holds only pointers.
class PointersOnly final : public CapturedWork {
 public:
  void replay(OpContext&) override {}
  std::string describe() const override { return "nothing"; }
};

// Occupies `device`'s compute worker until release(): ops queued there behind it wait.
class Blocker {
 public:
  Blocker(Runtime& rt, Device device) : var_(new_var()) {
    auto open = open_;
    rt.engine().push(
        [open](OpContext&) {
          while (!open->load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
        },
        {}, {var_}, device, StreamKind::Compute, {"blocker", "", 0, 0});
  }
  void release() { open_->store(true); }
  ~Blocker() { release(); }

 private:
  std::shared_ptr<std::atomic<bool>> open_ = std::make_shared<std::atomic<bool>>(false);
  VarPtr var_;
};

}  // namespace

class CudaDefectsTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;

  std::vector<Device> devices() const {
    std::vector<Device> out{Device::cpu()};
    if (rt_->cuda_device_count() > 0) out.push_back(Device::cuda(0));
    return out;
  }

 private slots:
  void initTestCase() { rt_ = std::make_unique<Runtime>(); }
  void cleanupTestCase() { rt_.reset(); }

  // backend.h's contract: what hold() was given lives as long as the work, whatever the work holds itself.
  void captured_work_holds_what_it_was_given() {
    std::weak_ptr<Storage> watched;
    {
      auto work = std::make_shared<PointersOnly>();
      {
        Tensor t(*rt_, {16}, Device::cpu());  // no op holds it: only t and the work
        watched = t.storage();
        work->hold({t.storage()});
      }
      QCOMPARE(work->held_count(), size_t(1));
      QVERIFY2(!watched.expired(), "the work let its tensor's storage go while it lived");
    }
    QVERIFY(watched.expired());
  }

  // A trainer destroyed while replays of its captured step are queued: the memory those replays read and
  // write (here: the gradients the captured step writes) stays allocated until they ran, and they run
  // without error. On a GPU the replay is a CUDA graph that holds raw pointers only.
  void trainer_gone_with_replays_queued_keeps_their_memory() {
    for (Device d : devices()) {
      auto model = Model::create(*rt_, modelOptions(Arch::Mlp, 4), d);
      std::vector<std::weak_ptr<Storage>> grads;
      const std::vector<float> before = to_host(model->parameters()[0]->value);
      {
        TrainOptions o;
        o.batch_size = 16;
        o.optimizer = {.kind = OptimizerKind::Sgd, .lr = 0.05, .momentum = 0.9};
        o.capture = StepCapture::On;
        o.steps_in_flight = 64;
        auto trainer = std::make_unique<Trainer>(*model, std::vector<Device>{d}, o);
        DataLoader loader(make_synthetic({.count = 16 * 6, .seed = 3}), {.batch_size = 16});
        loader.start_epoch(0);
        // Two warm-up steps and the capture (which waits for what came before), then replays held back.
        for (int i = 0; i < 3; ++i) trainer->step(loader.next());
        trainer->synchronize();
        QVERIFY2(trainer->replayed_steps() == 1, trainer->capture_status().c_str());
        for (Parameter* p : model->parameters()) grads.push_back(p->grad.storage());
        Blocker blocker(*rt_, d);
        while (auto batch = loader.next()) trainer->step(batch);
        QCOMPARE(trainer->replayed_steps(), int64_t(4));
        trainer.reset();  // destroyed with three replays queued behind the blocker
        for (const auto& g : grads)
          QVERIFY2(!g.expired(),
                   qPrintable("a gradient of the captured step was freed with replays queued on " +
                              QString::fromStdString(d.str())));
        blocker.release();
        rt_->engine().wait_all();
      }
      for (const auto& g : grads)
        QVERIFY2(g.expired(), "the captured step's memory outlived its last replay");
      QVERIFY(to_host(model->parameters()[0]->value) != before);
    }
  }

  // Item 10: add_into(t, t) reads and writes one buffer on every device.
  void add_into_itself_doubles() {
    for (Device d : devices()) {
      Tensor t = arange(*rt_, 1000, d);
      add_into(t, t);
      const std::vector<float> v = to_host(t);
      for (size_t i = 0; i < v.size(); ++i) QCOMPARE(v[i], 2.0f * static_cast<float>(i));
    }
  }
};

QTEST_GUILESS_MAIN(CudaDefectsTest)
#include "test_cuda_defects.moc"
