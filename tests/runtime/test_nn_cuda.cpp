// The training layer on CUDA (cuDNN, cuBLAS, NCCL) against the CPU. The whole suite skips where there is no
// GPU; the layer-by-layer checks are test_nn_layers_cuda.
#include <QtTest>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <thread>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
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

// Fails naming `what` when the GPU's values are not within `tol` of the CPU's (relative, floored at 1e-2).
void expect_matches_cpu(const Tensor& cpu, const Tensor& gpu, double tol, const char* what) {
  QVERIFY2(cpu.defined() && gpu.defined(), what);
  QCOMPARE(gpu.shape(), cpu.shape());
  const double diff = max_rel_diff(to_host(cpu), to_host(gpu));
  QVERIFY2(diff < tol, qPrintable(QString("%1: CUDA differs from the CPU by %2").arg(what).arg(diff)));
}

// Layouts, with plain index loops on the host: NCHW [n, c, h, w] values <-> NHWC [n, h, w, c] values.
std::vector<float> nchw_to_nhwc(const std::vector<float>& v, const Shape& s) {
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) out[(i * hw + p) * c + ch] = v[(i * c + ch) * hw + p];
  return out;
}
std::vector<float> nhwc_to_nchw(const std::vector<float>& v, const Shape& s) {
  const int64_t n = s[0], c = s[1], hw = s[2] * s[3];
  std::vector<float> out(v.size());
  for (int64_t i = 0; i < n; ++i)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t p = 0; p < hw; ++p) out[(i * c + ch) * hw + p] = v[(i * hw + p) * c + ch];
  return out;
}

// A CPU tensor's values on `device` in `layout` (Blocked: NHWC, the layout of a CUDA device); the shape
// stays [N, C, H, W].
Tensor in_layout(const Tensor& cpu, Device device, Layout layout) {
  const std::vector<float> v = to_host(cpu);
  return from_values(cpu.runtime(), cpu.shape(), device,
                     layout == Layout::Blocked ? nchw_to_nhwc(v, cpu.shape()) : v);
}

// A tensor in `layout` (Blocked: NHWC) as an NCHW tensor on the CPU.
Tensor as_nchw(const Tensor& t, Layout layout) {
  const std::vector<float> v = to_host(t);
  return from_values(t.runtime(), t.shape(), Device::cpu(),
                     layout == Layout::Blocked ? nhwc_to_nchw(v, t.shape()) : v);
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
    // Outside a ScopedPrecision the products are full fp32, so the CPU comparison is tight.
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
  // ResNet-18 keeps its activations in each device's blocked layout: nChw8c / nChw16c on the CPU, NHWC on
  // CUDA (cuDNN's channels-last tensor-core path), so this compares the two layouts end to end.
  void forward_and_backward_match_the_cpu() {
    QFETCH(int, arch);
    QVERIFY(has_blocked_layout(gpu_));
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
    o.optimizer.lr = 0.1;
    o.optimizer.momentum = 0.9;
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

  // tf32, bf16 and fp16 products stay within their formats' rounding of the fp32 ones (the CPU's). bf16 and
  // fp16 must also differ from them by more than float32 sums in another order would (about 1e-6): a
  // precision silently ignored would not. tf32 only permits tensor cores, so it has no such floor.
  void reduced_precision_products_round_their_inputs_data() {
    QTest::addColumn<int>("precision");
    QTest::addColumn<double>("tol");
    QTest::addColumn<double>("floor");
    // Relative to the largest value, for sums of 64 to 288 products of values in [-1, 1]: the inputs' unit
    // roundoff (2^-11 tf32 and fp16, 2^-8 bf16) times a few, and bf16 / fp16 results rounded once more.
    QTest::newRow("tf32") << static_cast<int>(Precision::Tf32) << 4e-3 << 0.0;
    QTest::newRow("bf16") << static_cast<int>(Precision::Bf16) << 3e-2 << 2e-4;
    QTest::newRow("fp16") << static_cast<int>(Precision::Fp16) << 4e-3 << 2e-5;
  }
  void reduced_precision_products_round_their_inputs() {
    QFETCH(int, precision);
    QFETCH(double, tol);
    QFETCH(double, floor);
    const Precision p = static_cast<Precision>(precision);
    const Device cpu = Device::cpu();
    auto on = [&](const Tensor& t) { return copy(t, gpu_); };
    const Tensor x = uniform(*rt_, {64, 96}, cpu, 1, -1, 1), w = uniform(*rt_, {48, 96}, cpu, 2, -1, 1);
    const Tensor b = uniform(*rt_, {48}, cpu, 3, -1, 1), dy = uniform(*rt_, {64, 48}, cpu, 4, -1, 1);
    const Tensor img = uniform(*rt_, {4, 8, 12, 12}, cpu, 5, -1, 1), k = uniform(*rt_, {16, 8, 3, 3}, cpu, 6, -1, 1);
    const Tensor dimg = uniform(*rt_, {4, 16, 12, 12}, cpu, 7, -1, 1);
    const Conv2dOptions co{.padding = 1};
    // The fp32 references, on the CPU.
    const Tensor y32 = linear(x, w, b);
    const LinearGrads lg32 = linear_backward(x, w, dy);
    const Tensor c32 = conv2d(img, k, Tensor(), co);
    const Conv2dGrads cg32 = conv2d_backward(img, k, dimg, co, true, false);
    // The same convolution with NHWC activations on the GPU: the filters are reordered to KRSC around the
    // rounding to bf16 / fp16, and dw back.
    const Layout nhwc = Layout::Blocked;
    const Conv2dOptions cn{.padding = 1, .input_layout = nhwc, .output_layout = nhwc};
    const Tensor img_n = in_layout(img, gpu_, nhwc), dimg_n = in_layout(dimg, gpu_, nhwc);
    ScopedPrecision scope(p);
    std::vector<std::pair<const char*, std::pair<Tensor, Tensor>>> pairs{
        {"linear y", {y32, linear(on(x), on(w), on(b))}},
        {"linear dx", {lg32.dx, linear_backward(on(x), on(w), on(dy)).dx}},
        {"linear dw", {lg32.dw, linear_backward(on(x), on(w), on(dy)).dw}},
        {"conv2d y", {c32, conv2d(on(img), on(k), Tensor(), co)}},
        {"conv2d dx", {cg32.dx, conv2d_backward(on(img), on(k), on(dimg), co, true, false).dx}},
        {"conv2d dw", {cg32.dw, conv2d_backward(on(img), on(k), on(dimg), co, true, false).dw}},
    };
    // cuDNN may have no kernel for a configuration (NHWC in one of these precisions): then the sub-case says
    // which and what cuDNN answered, and is left out, rather than failing on the library's coverage.
    try {
      const Conv2dGrads cgn = conv2d_backward(img_n, on(k), dimg_n, cn, true, false);
      const Tensor yn = as_nchw(conv2d(img_n, on(k), Tensor(), cn), nhwc), dxn = as_nchw(cgn.dx, nhwc);
      const Tensor dwn = copy(cgn.dw, cpu);
      pairs.push_back({"conv2d y (NHWC)", {c32, yn}});
      pairs.push_back({"conv2d dx (NHWC)", {cg32.dx, dxn}});
      pairs.push_back({"conv2d dw (NHWC)", {cg32.dw, dwn}});
    } catch (const Error& e) {
      if (!QString(e.what()).contains("cuDNN")) throw;
      qWarning("%s NHWC convolution skipped, cuDNN has no kernel for it: %s", precision_name(p), e.what());
    }
    for (const auto& [what, pair] : pairs) {
      const auto want = to_host(pair.first), got = to_host(pair.second);
      double scale = 0, worst = 0;
      for (float v : want) scale = std::max(scale, double(std::abs(v)));
      for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::abs(double(got[i]) - want[i]));
      qInfo("%s %s: largest difference %.3g of %.3g", precision_name(p), what, worst, scale);
      QVERIFY2(worst <= tol * scale, what);
      if (worst >= floor * scale) continue;
      // cuBLAS's FAST_16BF / FAST_16F compute types allow it to round the inputs, they do not require it
      // (and cuDNN's default math allows TF32 without requiring it): a result as exact as fp32 is what the
      // library chose, said here. The bf16 / fp16 convolutions round their operands in gpunodes' own kernel,
      // so there a result as exact as fp32 means the precision was not used.
      const bool library_choice = QString(what).startsWith("linear") || p == Precision::Tf32;
      if (library_choice) {
        qWarning("%s kept fp32 precision for %s in %s (difference %.3g, below the floor %.3g)",
                 QString(what).startsWith("linear") ? "cuBLAS" : "cuDNN",
                 p == Precision::Bf16   ? "COMPUTE_32F_FAST_16BF"
                 : p == Precision::Fp16 ? "COMPUTE_32F_FAST_16F"
                                        : "TF32",
                 what, worst, floor * scale);
        continue;
      }
      QFAIL(qPrintable(QString("%1 in %2 is as exact as fp32: was the precision used?").arg(what, precision_name(p))));
    }
  }

  // Issue 26, item 3: a tensor larger than the whole card is refused when it is made, naming the device.
  void cuda_allocator_refuses_more_than_the_card() {
    const Device gpu = gpu_;
    int64_t total = 0;
    for (const DeviceInfo& i : rt_->devices())
      if (i.device == gpu) total = i.total_memory;
    QVERIFY(total > 0);
    const int64_t floats = total / 4 + (64 << 20);
    try {
      Tensor t(*rt_, {floats}, gpu);
      QFAIL("a tensor larger than the card was accepted");
    } catch (const OutOfMemoryError& e) {
      QVERIFY2(QString(e.what()).contains("cuda:0"), e.what());
    }
  }

  // Issue 26, item 6: cuDNN's batch-norm backward gets the layer's epsilon, so a large one gives the CPU's gradient.
  void cuda_batchnorm_backward_uses_the_layers_eps() {
    const Device cpu = Device::cpu(), gpu = gpu_;
    const Tensor x = uniform(*rt_, {4, 3, 5, 5}, cpu, 1, -1, 1), dy = uniform(*rt_, {4, 3, 5, 5}, cpu, 2, -1, 1);
    const Tensor gamma = uniform(*rt_, {3}, cpu, 3, 0.5, 1.5), beta = zeros(*rt_, {3}, cpu);
    const BatchNormOptions o{.eps = 0.5f};
    std::vector<std::vector<float>> dx;
    for (Device d : {cpu, gpu}) {
      auto on = [&](const Tensor& t) { return copy(t, d); };
      const BatchNormResult f = batchnorm2d(on(x), on(gamma), on(beta), zeros(*rt_, {3}, d), ones(*rt_, {3}, d), o);
      dx.push_back(to_host(batchnorm2d_backward(on(x), on(dy), on(gamma), f.save_mean, f.save_invstd, o).dx));
    }
    double worst = 0;
    for (size_t i = 0; i < dx[0].size(); ++i) worst = std::max(worst, double(std::abs(dx[0][i] - dx[1][i])));
    qInfo("batch norm backward, eps 0.5: largest difference from the CPU %.3g", worst);
    QVERIFY(worst < 1e-4);
  }

  // ResNet-18 with its steps captured as a CUDA graph (the default on a GPU) against the same steps one op at
  // a time: the graph replays the same kernels, so the parameters agree to rounding (cuDNN may pick other
  // algorithms for other workspaces), and the status names the graph.
  void captured_resnet_steps_match_step_by_step() {
    auto a = Model::create(*rt_, modelOptions(Arch::ResNet18, 3), gpu_);
    auto b = Model::create(*rt_, modelOptions(Arch::ResNet18, 3), gpu_);
    TrainOptions o;
    o.batch_size = 32;
    o.optimizer = {.kind = OptimizerKind::Sgd, .lr = 0.05, .momentum = 0.9};
    o.capture = StepCapture::Off;
    Trainer stepwise(*a, {gpu_}, o);
    o.capture = StepCapture::Auto;
    Trainer captured(*b, {gpu_}, o);
    DataLoader loader(synthetic(32 * 6), {.batch_size = 32, .pinned = true});
    loader.start_epoch(0);
    while (auto batch = loader.next()) {
      stepwise.step(batch);
      captured.step(batch);
    }
    stepwise.synchronize();
    captured.synchronize();
    qInfo("%s, %lld replayed steps", captured.capture_status().c_str(),
          static_cast<long long>(captured.replayed_steps()));
    QVERIFY2(captured.capture_status().rfind("replaying a CUDA graph", 0) == 0, captured.capture_status().c_str());
    QCOMPARE(captured.replayed_steps(), int64_t(4));
    const double diff = max_rel_diff(*a, *b);
    qInfo("largest relative parameter difference %.3g", diff);
    QVERIFY(diff < 1e-3);
  }

  // On a GPU: each reduced precision trains LeNet as fp32 does, within rounding, and fp16 with its scaler.
  void reduced_precision_training_follows_fp32() {
    const DatasetPtr data = make_synthetic({.count = 64 * 8});
    TrainOptions o;
    o.epochs = 2;
    o.batch_size = 64;
    o.log_every = 0;
    auto reference = Model::create(*rt_, modelOptions(Arch::LeNet, 5), gpu_);
    const double fp32_loss = Trainer(*reference, {gpu_}, o).fit(data, nullptr).epochs.back().train_loss;
    for (Precision p : {Precision::Tf32, Precision::Bf16, Precision::Fp16}) {
      o.precision = p;
      auto m = Model::create(*rt_, modelOptions(Arch::LeNet, 5), gpu_);
      Trainer t(*m, {gpu_}, o);
      QCOMPARE(t.loss_scale() > 0, p == Precision::Fp16);
      const double loss = t.fit(data, nullptr).epochs.back().train_loss;
      qInfo("%s: loss %.5f (fp32 %.5f), %lld steps skipped", precision_name(p), loss, fp32_loss,
            static_cast<long long>(t.skipped_steps()));
      QVERIFY2(std::abs(loss - fp32_loss) < 0.05 * fp32_loss, precision_name(p));
      QVERIFY(t.optimizer_steps() + t.skipped_steps() == 16);
    }
  }

  // --- the layer ops one by one, on the GPU against the CPU ------------------------------------------------

  void grouped_conv2d_matches_the_cpu_data() {
    QTest::addColumn<int>("c");
    QTest::addColumn<int>("k");
    QTest::addColumn<int>("r");
    QTest::addColumn<int>("stride");
    QTest::addColumn<int>("pad");
    QTest::addColumn<int>("groups");
    QTest::addColumn<bool>("bias");
    QTest::newRow("3x3 stride 2 pad 1 groups 2") << 8 << 12 << 3 << 2 << 1 << 2 << true;
    QTest::newRow("depthwise 3x3 pad 1 no bias") << 16 << 16 << 3 << 1 << 1 << 16 << false;
    QTest::newRow("depthwise x2 stride 2") << 8 << 16 << 3 << 2 << 1 << 8 << true;
    QTest::newRow("1x1 groups 4 no bias") << 8 << 8 << 1 << 1 << 0 << 4 << false;
    QTest::newRow("dense 3x3 no bias") << 4 << 6 << 3 << 1 << 1 << 1 << false;
  }
  void grouped_conv2d_matches_the_cpu() {
    QFETCH(int, c);
    QFETCH(int, k);
    QFETCH(int, r);
    QFETCH(int, stride);
    QFETCH(int, pad);
    QFETCH(int, groups);
    QFETCH(bool, bias);
    const Device cpu = Device::cpu();
    Tensor x = uniform(*rt_, {4, c, 11, 11}, cpu, 1, -1, 1);
    Tensor w = uniform(*rt_, {k, c / groups, r, r}, cpu, 2, -0.5, 0.5);
    Tensor b = bias ? uniform(*rt_, {k}, cpu, 3, -1, 1) : Tensor();
    const Conv2dOptions o{stride, pad, groups};
    Tensor yc = conv2d(x, w, b, o);
    Tensor yg = conv2d(copy(x, gpu_), copy(w, gpu_), bias ? copy(b, gpu_) : Tensor(), o);
    QCOMPARE(yg.device(), gpu_);
    expect_matches_cpu(yc, yg, 1e-4, "conv2d forward");
    Tensor dy = uniform(*rt_, yc.shape(), cpu, 4, -1, 1);
    Conv2dGrads gc = conv2d_backward(x, w, dy, o, true, bias);
    Conv2dGrads gg = conv2d_backward(copy(x, gpu_), copy(w, gpu_), copy(dy, gpu_), o, true, bias);
    expect_matches_cpu(gc.dx, gg.dx, 1e-3, "conv2d dx");
    expect_matches_cpu(gc.dw, gg.dw, 1e-3, "conv2d dw");
    QCOMPARE(gg.db.defined(), bias);
    if (bias) expect_matches_cpu(gc.db, gg.db, 1e-3, "conv2d db");
  }

  // --- channels-last (NHWC): Layout::Blocked on CUDA, against the CPU in NCHW --------------------------------

  void blocked_layout_on_cuda_is_nhwc() {
    QVERIFY(has_blocked_layout(gpu_));
    for (int64_t c : {1, 3, 64, 100}) QCOMPARE(layout_block(Layout::Blocked, gpu_, c), c);
    QCOMPARE(layout_block(Layout::Nchw, gpu_, 64), int64_t{1});
  }

  void conv2d_nhwc_matches_the_cpu_data() {
    QTest::addColumn<int>("c");
    QTest::addColumn<int>("k");
    QTest::addColumn<int>("r");
    QTest::addColumn<int>("stride");
    QTest::addColumn<int>("pad");
    QTest::addColumn<int>("groups");
    QTest::addColumn<bool>("bias");
    QTest::addColumn<bool>("in_nhwc");
    QTest::addColumn<bool>("out_nhwc");
    QTest::newRow("3x3 pad 1") << 16 << 32 << 3 << 1 << 1 << 1 << true << true << true;
    QTest::newRow("3x3 stride 2 pad 1") << 8 << 12 << 3 << 2 << 1 << 1 << true << true << true;
    QTest::newRow("1x1 stride 2 (projection)") << 16 << 32 << 1 << 2 << 0 << 1 << true << true << true;
    QTest::newRow("5x5 pad 2, 3 channels, no bias") << 3 << 5 << 5 << 1 << 2 << 1 << false << true << true;
    QTest::newRow("stem: 1 channel NCHW in") << 1 << 16 << 3 << 1 << 1 << 1 << true << false << true;
    QTest::newRow("NCHW in, NHWC out") << 4 << 8 << 3 << 1 << 1 << 1 << true << false << true;
    QTest::newRow("NHWC in, NCHW out, stride 2") << 8 << 4 << 3 << 2 << 1 << 1 << true << true << false;
    QTest::newRow("groups 2 (runs NCHW inside)") << 8 << 8 << 3 << 1 << 1 << 2 << true << true << true;
  }
  void conv2d_nhwc_matches_the_cpu() {
    QFETCH(int, c);
    QFETCH(int, k);
    QFETCH(int, r);
    QFETCH(int, stride);
    QFETCH(int, pad);
    QFETCH(int, groups);
    QFETCH(bool, bias);
    QFETCH(bool, in_nhwc);
    QFETCH(bool, out_nhwc);
    const Device cpu = Device::cpu();
    const Layout in = in_nhwc ? Layout::Blocked : Layout::Nchw, out = out_nhwc ? Layout::Blocked : Layout::Nchw;
    Tensor x = uniform(*rt_, {4, c, 11, 11}, cpu, 1, -1, 1);
    Tensor w = uniform(*rt_, {k, c / groups, r, r}, cpu, 2, -0.5, 0.5);
    Tensor b = bias ? uniform(*rt_, {k}, cpu, 3, -1, 1) : Tensor();
    const Conv2dOptions oc{stride, pad, groups};
    const Conv2dOptions og{stride, pad, groups, in, out};
    Tensor yc = conv2d(x, w, b, oc);
    Tensor xg = in_layout(x, gpu_, in), wg = copy(w, gpu_);
    Tensor yg = conv2d(xg, wg, bias ? copy(b, gpu_) : Tensor(), og);
    QCOMPARE(yg.device(), gpu_);
    QCOMPARE(yg.shape(), yc.shape());
    expect_matches_cpu(yc, as_nchw(yg, out), 1e-4, "NHWC conv2d forward");
    Tensor dy = uniform(*rt_, yc.shape(), cpu, 4, -1, 1);
    Conv2dGrads gc = conv2d_backward(x, w, dy, oc, true, bias);
    Conv2dGrads gg = conv2d_backward(xg, wg, in_layout(dy, gpu_, out), og, true, bias);
    expect_matches_cpu(gc.dx, as_nchw(gg.dx, in), 1e-3, "NHWC conv2d dx");
    expect_matches_cpu(gc.dw, gg.dw, 1e-3, "NHWC conv2d dw (KCRS)");
    QCOMPARE(gg.db.defined(), bias);
    if (bias) expect_matches_cpu(gc.db, gg.db, 1e-3, "NHWC conv2d db");
    // Without dx, the weight gradient is the same.
    Conv2dGrads g2 = conv2d_backward(xg, wg, in_layout(dy, gpu_, out), og, false, bias);
    QVERIFY(!g2.dx.defined());
    expect_matches_cpu(gc.dw, g2.dw, 1e-3, "NHWC conv2d dw without dx");
  }

  void batchnorm_nhwc_matches_the_cpu_data() {
    QTest::addColumn<bool>("relu");
    QTest::addColumn<bool>("residual");
    QTest::newRow("plain") << false << false;
    QTest::newRow("relu") << true << false;
    QTest::newRow("residual and relu (a residual block's bn2)") << true << true;
  }
  void batchnorm_nhwc_matches_the_cpu() {
    QFETCH(bool, relu);
    QFETCH(bool, residual);
    const Device cpu = Device::cpu();
    const Layout nhwc = Layout::Blocked;
    const int64_t c = 24;
    const Shape shape{4, c, 5, 6};
    Tensor x = uniform(*rt_, shape, cpu, 10, -2, 3), dy = uniform(*rt_, shape, cpu, 11, -1, 1);
    Tensor res = residual ? uniform(*rt_, shape, cpu, 14, -1, 1) : Tensor();
    Tensor gamma = uniform(*rt_, {c}, cpu, 12, 0.5, 1.5), beta = uniform(*rt_, {c}, cpu, 13, -1, 1);
    Tensor rmc = zeros(*rt_, {c}, cpu), rvc = ones(*rt_, {c}, cpu);
    Tensor rmg = zeros(*rt_, {c}, gpu_), rvg = ones(*rt_, {c}, gpu_);
    Tensor xg = in_layout(x, gpu_, nhwc), gg = copy(gamma, gpu_), bg = copy(beta, gpu_);
    Tensor resg = residual ? in_layout(res, gpu_, nhwc) : Tensor();
    const BatchNormOptions oc{.relu = relu};
    const BatchNormOptions og{.layout = nhwc, .relu = relu};
    BatchNormResult rc = batchnorm2d(x, gamma, beta, rmc, rvc, oc, res);
    BatchNormResult rg = batchnorm2d(xg, gg, bg, rmg, rvg, og, resg);
    expect_matches_cpu(rc.y, as_nchw(rg.y, nhwc), 1e-4, "NHWC batchnorm forward");
    expect_matches_cpu(rmc, rmg, 1e-5, "NHWC running_mean");
    expect_matches_cpu(rvc, rvg, 1e-5, "NHWC running_var (unbiased)");
    expect_matches_cpu(rc.save_mean, rg.save_mean, 1e-5, "NHWC saved mean");
    expect_matches_cpu(rc.save_invstd, rg.save_invstd, 1e-4, "NHWC saved inverse deviation");
    BatchNormGrads gc = batchnorm2d_backward(x, dy, gamma, rc.save_mean, rc.save_invstd, oc, rc.y, residual);
    BatchNormGrads gpu = batchnorm2d_backward(xg, in_layout(dy, gpu_, nhwc), gg, rg.save_mean, rg.save_invstd,
                                              og, rg.y, residual);
    expect_matches_cpu(gc.dx, as_nchw(gpu.dx, nhwc), 1e-3, "NHWC batchnorm dx");
    expect_matches_cpu(gc.dgamma, gpu.dgamma, 1e-3, "NHWC batchnorm dgamma");
    expect_matches_cpu(gc.dbeta, gpu.dbeta, 1e-4, "NHWC batchnorm dbeta");
    QCOMPARE(gpu.dresidual.defined(), residual);
    if (residual) expect_matches_cpu(gc.dresidual, as_nchw(gpu.dresidual, nhwc), 1e-5, "NHWC dresidual");
    BatchNormOptions ec = oc, eg = og;
    ec.training = eg.training = false;
    expect_matches_cpu(batchnorm2d(x, gamma, beta, rmc, rvc, ec, res).y,
                       as_nchw(batchnorm2d(xg, gg, bg, rmg, rvg, eg, resg).y, nhwc), 1e-4,
                       "NHWC batchnorm eval");
  }

  void global_avg_pool_nhwc_matches_the_cpu_data() {
    QTest::addColumn<int>("n");
    QTest::addColumn<int>("c");
    QTest::addColumn<int>("h");
    QTest::addColumn<int>("w");
    QTest::newRow("ResNet-18's last stage") << 8 << 512 << 4 << 4;
    QTest::newRow("odd sizes") << 3 << 37 << 5 << 7;
    QTest::newRow("one pixel") << 2 << 9 << 1 << 1;
    QTest::newRow("one channel") << 5 << 1 << 6 << 6;
  }
  void global_avg_pool_nhwc_matches_the_cpu() {
    QFETCH(int, n);
    QFETCH(int, c);
    QFETCH(int, h);
    QFETCH(int, w);
    const Device cpu = Device::cpu();
    const Layout nhwc = Layout::Blocked;
    Tensor x = uniform(*rt_, {n, c, h, w}, cpu, 20, -1, 2);
    Tensor yc = global_avg_pool(x), yg = global_avg_pool(in_layout(x, gpu_, nhwc), nhwc);
    QCOMPARE(yg.shape(), (Shape{n, c, 1, 1}));
    expect_matches_cpu(yc, yg, 1e-5, "NHWC global average pool (the output is NCHW)");
    Tensor dy = uniform(*rt_, yc.shape(), cpu, 21, -1, 1);
    Tensor dxc = global_avg_pool_backward(dy, x.shape());
    Tensor dxg = global_avg_pool_backward(copy(dy, gpu_), x.shape(), nhwc);
    QCOMPARE(dxg.shape(), x.shape());
    expect_matches_cpu(dxc, as_nchw(dxg, nhwc), 1e-6, "NHWC global average pool backward");
  }

  void linear_without_bias_matches_the_cpu() {
    const Device cpu = Device::cpu();
    Tensor x = uniform(*rt_, {16, 20}, cpu, 5, -1, 1), w = uniform(*rt_, {7, 20}, cpu, 6, -1, 1);
    Tensor yc = linear(x, w, Tensor()), yg = linear(copy(x, gpu_), copy(w, gpu_), Tensor());
    expect_matches_cpu(yc, yg, 1e-4, "linear forward, no bias");
    Tensor dy = uniform(*rt_, {16, 7}, cpu, 7, -1, 1);
    LinearGrads gc = linear_backward(x, w, dy, true, false);
    LinearGrads gg = linear_backward(copy(x, gpu_), copy(w, gpu_), copy(dy, gpu_), true, false);
    QVERIFY(!gg.db.defined());
    expect_matches_cpu(gc.dx, gg.dx, 1e-4, "linear dx, no bias");
    expect_matches_cpu(gc.dw, gg.dw, 1e-4, "linear dw, no bias");
  }

  void activations_match_the_cpu_data() {
    QTest::addColumn<int>("kind");
    QTest::newRow("relu") << static_cast<int>(Activation::Relu);
    QTest::newRow("sigmoid") << static_cast<int>(Activation::Sigmoid);
    QTest::newRow("tanh") << static_cast<int>(Activation::Tanh);
    QTest::newRow("gelu (own kernels)") << static_cast<int>(Activation::Gelu);
  }
  void activations_match_the_cpu() {
    QFETCH(int, kind);
    const auto a = static_cast<Activation>(kind);
    const Device cpu = Device::cpu();
    // Large enough for the kernels' grid-stride loops to take several turns.
    Tensor x = uniform(*rt_, {1000, 1100}, cpu, 8, -5, 5), dy = uniform(*rt_, x.shape(), cpu, 9, -1, 1);
    Tensor xg = copy(x, gpu_), dyg = copy(dy, gpu_);
    Tensor yc = activation(a, x), yg = activation(a, xg);
    // oneDNN's erf and exp approximations stay within 3e-5 of float64 here (relative, floored at 1e-2).
    expect_matches_cpu(yc, yg, 1e-4, "activation forward");
    expect_matches_cpu(activation_backward(a, x, yc, dy), activation_backward(a, xg, yg, dyg), 1e-4,
                       "activation backward");
    if (a == Activation::Gelu)
      QVERIFY_THROWS_EXCEPTION(Error, activation_backward(a, Tensor(), yg, dyg));
    else
      QVERIFY_THROWS_EXCEPTION(Error, activation_backward(a, xg, Tensor(), dyg));
  }

  void batchnorm_matches_the_cpu_data() {
    QTest::addColumn<bool>("one_d");
    QTest::newRow("[N, C, H, W]") << false;
    QTest::newRow("[N, C] (BatchNorm1d)") << true;
  }
  void batchnorm_matches_the_cpu() {
    QFETCH(bool, one_d);
    const Device cpu = Device::cpu();
    const int64_t c = 6;
    const Shape shape = one_d ? Shape{32, c} : Shape{4, c, 5, 5};
    Tensor x = uniform(*rt_, shape, cpu, 10, -2, 3), dy = uniform(*rt_, shape, cpu, 11, -1, 1);
    Tensor gamma = uniform(*rt_, {c}, cpu, 12, 0.5, 1.5), beta = uniform(*rt_, {c}, cpu, 13, -1, 1);
    Tensor rmc = zeros(*rt_, {c}, cpu), rvc = ones(*rt_, {c}, cpu);
    Tensor rmg = zeros(*rt_, {c}, gpu_), rvg = ones(*rt_, {c}, gpu_);
    Tensor xg = copy(x, gpu_), gg = copy(gamma, gpu_), bg = copy(beta, gpu_);
    BatchNormResult rc = batchnorm2d(x, gamma, beta, rmc, rvc);
    BatchNormResult rg = batchnorm2d(xg, gg, bg, rmg, rvg);
    expect_matches_cpu(rc.y, rg.y, 1e-4, "batchnorm forward");
    expect_matches_cpu(rmc, rmg, 1e-5, "running_mean");
    expect_matches_cpu(rvc, rvg, 1e-5, "running_var (unbiased)");
    expect_matches_cpu(rc.save_mean, rg.save_mean, 1e-5, "saved mean");
    expect_matches_cpu(rc.save_invstd, rg.save_invstd, 1e-4, "saved inverse deviation");
    BatchNormGrads gc = batchnorm2d_backward(x, dy, gamma, rc.save_mean, rc.save_invstd);
    BatchNormGrads gpu = batchnorm2d_backward(xg, copy(dy, gpu_), gg, rg.save_mean, rg.save_invstd);
    expect_matches_cpu(gc.dx, gpu.dx, 1e-3, "batchnorm dx");
    expect_matches_cpu(gc.dgamma, gpu.dgamma, 1e-3, "batchnorm dgamma");
    expect_matches_cpu(gc.dbeta, gpu.dbeta, 1e-4, "batchnorm dbeta");
    const BatchNormOptions eval{.training = false};
    expect_matches_cpu(batchnorm2d(x, gamma, beta, rmc, rvc, eval).y,
                       batchnorm2d(xg, gg, bg, rmg, rvg, eval).y, 1e-4, "batchnorm eval");
  }

  void dropout_mask_is_the_cpus() {
    const Device cpu = Device::cpu();
    // More elements than one grid-stride pass covers.
    Tensor x = uniform(*rt_, {3000, 7000}, cpu, 14, -1, 1);
    Tensor xg = copy(x, gpu_);
    for (float p : {0.0f, 0.1f, 0.5f, 0.9f}) {
      DropoutResult rc = dropout(x, p, 77), rg = dropout(xg, p, 77);
      QCOMPARE(rg.mask.device(), gpu_);
      QVERIFY2(to_host(rc.mask) == to_host(rg.mask), qPrintable(QString("p %1: masks differ").arg(p)));
      QVERIFY2(to_host(rc.y) == to_host(rg.y), qPrintable(QString("p %1: outputs differ").arg(p)));
      Tensor dy = uniform(*rt_, x.shape(), cpu, 15, -1, 1);
      QVERIFY(to_host(dropout_backward(dy, rc.mask)) == to_host(dropout_backward(copy(dy, gpu_), rg.mask)));
    }
    QVERIFY_THROWS_EXCEPTION(DeviceMismatchError, dropout_backward(x, dropout(xg, 0.5f, 1).mask));
  }

  void concat_and_split_match_the_cpu() {
    const Device cpu = Device::cpu();
    // Rows of odd widths: the 2-d copies' pitches are not multiples of anything convenient.
    for (const auto& [sa, sb] : std::vector<std::pair<Shape, Shape>>{
             {{4, 3, 5, 6}, {4, 7, 5, 6}}, {{9, 2}, {9, 5}}, {{5, 1, 3}, {5, 3, 3}}}) {
      Tensor a = uniform(*rt_, sa, cpu, 16, -1, 1), b = uniform(*rt_, sb, cpu, 17, -1, 1);
      Tensor yc = concat_channels(a, b), yg = concat_channels(copy(a, gpu_), copy(b, gpu_));
      QCOMPARE(yg.device(), gpu_);
      QCOMPARE(yg.shape(), yc.shape());
      QCOMPARE(to_host(yg), to_host(yc));
      auto [da, db] = split_channels(yg, sa[1]);
      QCOMPARE(da.device(), gpu_);
      QCOMPARE(to_host(da), to_host(a));
      QCOMPARE(to_host(db), to_host(b));
    }
    // Nothing crosses devices on its own.
    QVERIFY_THROWS_EXCEPTION(DeviceMismatchError,
                             concat_channels(zeros(*rt_, {2, 3}, cpu), zeros(*rt_, {2, 3}, gpu_)));
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
