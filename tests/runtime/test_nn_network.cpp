// Drawn networks: shape inference and its errors, the canonical text, the walk that orders the layers, a
// drawn LeNet and ResNet-18 against the built-in ones (same weights, logits, one SGD step), gradients through
// branches against finite differences, dropout, and parameter files that carry the whole network.
// GN_TEST_DEVICE=cuda:0 runs the model checks on cuDNN and cuBLAS instead (skipped without a GPU).
#include <QtTest>
#include <cmath>
#include <filesystem>
#include <functional>
#include <map>

#include "gpunodes/errors.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/nn/optim.h"
#include "gpunodes/nn/serialize.h"
#include "drawn_networks.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

ModelOptions networkOptions(const NetworkSpec& net, Init init, uint64_t seed) {
  ModelOptions o = networkOptions(net, seed);
  o.init = init;
  return o;
}

}  // namespace

class NnNetworkTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;
  Device device_ = Device::cpu();

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>(RuntimeOptions{});
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("networks on %s", device_.str().c_str());
  }

  void cleanupTestCase() { rt_.reset(); }

  void every_layer_infers_pytorch_shapes_and_sizes() {
    const std::vector<LayerInfo> info = lenet().infer();
    const std::vector<Shape> shapes = {{1, 28, 28},  {6, 28, 28}, {6, 28, 28}, {6, 14, 14}, {16, 10, 10},
                                       {16, 10, 10}, {16, 5, 5},  {400},       {120},       {120},
                                       {84},         {84},        {10}};
    QCOMPARE(info.size(), shapes.size());
    double params = 0;
    for (size_t i = 0; i < info.size(); ++i) {
      QCOMPARE(info[i].out, shapes[i]);
      params += info[i].params;
    }
    QCOMPARE(info[1].params, 156.0);   // 6 * 1 * 5 * 5 + 6
    QCOMPARE(info[4].params, 2416.0);  // 16 * 6 * 5 * 5 + 16
    QCOMPARE(params, 61706.0);         // d2l's LeNet
    QCOMPARE(info[1].flops, 2.0 * 25 * 6 * 28 * 28);
    double resnet = 0;
    for (const LayerInfo& i : resnet18(1).infer()) resnet += i.params;
    QCOMPARE(resnet, 11175818.0);  // counted with torch for the seed's resnet18(10), as the built-in one

    auto one = [](LayerSpec l, std::vector<Shape> in) { return infer_layer(l, in); };
    LayerInfo g = one(spec(LayerKind::Conv2d,
                           [](LayerSpec& l) {
                             l.features = 6, l.kernel = 3, l.stride = 2, l.padding = 1, l.groups = 2,
                             l.bias = false;
                           }),
                      {{4, 9, 9}});
    QCOMPARE(g.out, (Shape{6, 5, 5}));
    QCOMPARE(g.params, 6.0 * 2 * 9);  // weight [6, 4/2, 3, 3], no bias
    QCOMPARE(one(spec(LayerKind::MaxPool2d, [](LayerSpec& l) { l.kernel = 3, l.stride = 0, l.padding = 1; }),
                 {{3, 7, 7}})
                 .out,
             (Shape{3, 3, 3}));  // stride 0 is kernel_size: (7 + 2 - 3) / 3 + 1
    QCOMPARE(one(spec(LayerKind::Concat), {{3, 4, 4}, {5, 4, 4}}).out, (Shape{8, 4, 4}));
    QCOMPARE(one(spec(LayerKind::GlobalAvgPool2d), {{7, 3, 5}}).out, (Shape{7, 1, 1}));
    LayerInfo bn = one(spec(LayerKind::BatchNorm1d), {{20}});
    QCOMPARE(bn.params, 40.0);
    QCOMPARE(bn.buffers, 40.0);
    QCOMPARE(
        one(spec(LayerKind::Linear, [](LayerSpec& l) { l.features = 3, l.bias = false; }), {{20}}).params,
        60.0);
  }

  void mismatches_name_the_port_and_both_shapes() {
    auto one = [](LayerSpec l, std::vector<Shape> in) { infer_layer(l, in); };
    expect_layer_error([&] { one(spec(LayerKind::Conv2d, conv(6, 3)), {{784}}); }, "in", {"flat", "784"});
    expect_layer_error(
        [&] {
          one(spec(LayerKind::Linear, features(10)), {{16, 5, 5}});
        },
        "in", {"16x5x5", "400", "Flatten"});
    expect_layer_error([&] { one(spec(LayerKind::Add), {{3, 4, 4}, {3, 4, 5}}); }, "b", {"3x4x4", "3x4x5"});
    expect_layer_error(
        [&] {
          one(spec(LayerKind::Concat), {{3, 4, 4}, {3, 5, 4}});
        },
        "b", {"3x4x4", "3x5x4"});
    expect_layer_error(
        [&] {
          one(spec(LayerKind::MaxPool2d, pool(3)), {{1, 2, 2}});
        },
        "in", {"window 3", "larger", "1x2x2"});
    expect_layer_error(
        [&] {
          one(spec(LayerKind::Conv2d, conv(4, 5)), {{3, 4, 4}});
        },
        "in", {"larger", "3x4x4"});
    expect_layer_error(
        [&] {
          one(spec(LayerKind::Conv2d, [](LayerSpec& l) { l.features = 4, l.kernel = 1, l.groups = 3; }),
              {{4, 2, 2}});
        },
        "in", {"groups=3", "4"});
    expect_layer_error(
        [&] {
          one(spec(LayerKind::BatchNorm1d), {{3, 4, 4}});
        },
        "in", {"BatchNorm1d", "3x4x4"});
    expect_layer_error([&] { one(spec(LayerKind::Input, input({0, 28, 28})), {}); }, "", {"shape"});
    expect_layer_error([&] { one(spec(LayerKind::Input, input({1, 2, 28, 28})), {}); }, "", {"[C, H, W]", "[T, F]"});
    expect_layer_error([&] { one(spec(LayerKind::Conv2d, conv(0, 3)), {{1, 8, 8}}); }, "", {"out_channels"});
    expect_layer_error([&] { one(spec(LayerKind::Dropout, [](LayerSpec& l) { l.p = 1; }), {{4}}); }, "",
                       {"p"});
    expect_layer_error(
        [&] {
          one(spec(LayerKind::AvgPool2d, [](LayerSpec& l) { l.kernel = 2, l.padding = 2; }), {{1, 8, 8}});
        },
        "", {"padding"});
    // A whole network says which layer.
    NetworkSpec bad = lenet();
    bad.layers[7].kind = LayerKind::ReLU;  // no Flatten before fc1
    expect_layer_error([&] { bad.infer(); }, "in", {"fc1", "16x5x5"});
  }

  void the_walk_orders_layers_as_the_builtin_models_draw_weights() {
    // Add(a: the main path, b: a shortcut): the main path's layers first, whatever order they were made in.
    auto x = make_layer(spec(LayerKind::Input, input({2, 6, 6})), {});
    LayerSpec shortcut = spec(LayerKind::Conv2d, conv(4, 1));
    shortcut.id = "short";
    auto s = make_layer(shortcut, {x});
    LayerSpec main = spec(LayerKind::Conv2d, conv(4, 3, 1, 1));
    main.id = "main";
    auto m = make_layer(main, {x});
    LayerSpec add = spec(LayerKind::Add);
    add.id = "add";
    auto out = make_layer(add, {m, s});
    NetworkSpec net = NetworkSpec::ending_at(*out);
    QStringList order;
    for (const LayerSpec& l : net.layers) order.append(QString::fromStdString(l.id));
    QCOMPARE(order, (QStringList{"l", "main", "short", "add"}));
    QCOMPARE(net.layers[3].inputs, (std::vector<int>{1, 2}));

    // Two Inputs are refused, naming both.
    LayerSpec other = spec(LayerKind::Input, input({4, 6, 6}));
    other.id = "other";
    auto y = make_layer(other, {});
    auto two = make_layer(add, {m, y});
    try {
      NetworkSpec::ending_at(*two);
      QFAIL("two Inputs were accepted");
    } catch (const Error& e) {
      QVERIFY2(QString(e.what()).contains("2 Inputs") && QString(e.what()).contains("other"), e.what());
    }
    // A chain of 100,000 layers is walked without recursion.
    LayerNodePtr h = x;
    for (int i = 0; i < 100000; ++i) h = make_layer(spec(LayerKind::ReLU), {h});
    QCOMPARE(NetworkSpec::ending_at(*h).layers.size(), size_t(100001));
  }

  void the_text_round_trips_and_refuses_what_is_malformed() {
    for (const NetworkSpec& net : {lenet(), resnet18(3)}) {
      const std::string text = net.text();
      QCOMPARE(NetworkSpec::parse(text).text(), text);
    }
    WiredNet n;
    int h = n.add("x", LayerKind::Input, {}, input({8}));
    h = n.add("bn", LayerKind::BatchNorm1d, {h}, [](LayerSpec& l) { l.eps = 1e-3, l.momentum = 0.25; });
    n.add("drop", LayerKind::Dropout, {h}, [](LayerSpec& l) { l.p = 0.3; });
    const NetworkSpec back = NetworkSpec::parse(n.spec.text());
    QCOMPARE(back.layers[1].eps, 1e-3);
    QCOMPARE(back.layers[1].momentum, 0.25);
    QCOMPARE(back.layers[2].p, 0.3);

    const std::string good = lenet().text();
    for (const std::string& bad : {
             std::string("lenet classes=10"),
             std::string("network "),
             std::string("network x:Input(shape=1x28x28); r:Relu()<-x"),
             std::string("network r:ReLU()<-x; x:Input(shape=1x28x28)"),
             std::string("network x:Input(shape=1x28x28); a:Add()<-x"),
             std::string("network x:Input(shape=1x28x28); c:Conv2d(out_channels=six)<-x"),
             std::string("network x:Input(shape=1x28x28); f:Linear(out_features=10)<-x"),
             std::string("network x:Input(shape=1x28x28); y:Input(shape=1x28x28)"),
             std::string("network x:Input(shape=1x28x28); x:ReLU()<-x"),
             std::string("network x:Input(shape=1x28x28,color=red)"),
             good.substr(0, good.size() / 2),
         }) {
      try {
        NetworkSpec::parse(bad);
        QFAIL(qPrintable(QString::fromStdString("accepted: " + bad)));
      } catch (const Error& e) {
        QVERIFY2(QString(e.what()).startsWith("malformed network signature"), e.what());
      }
    }
  }

  void drawn_lenet_equals_the_builtin_one() {
    ModelOptions builtin = modelOptions(Arch::LeNet, 7);
    builtin.init = Init::Xavier;
    auto a = Model::create(*rt_, builtin, device_);
    auto b = Model::create(*rt_, networkOptions(lenet(), Init::Xavier, 7), device_);
    QCOMPARE(b->parameter_count(), a->parameter_count());
    QCOMPARE(b->state().size(), a->state().size());
    for (size_t i = 0; i < a->state().size(); ++i)
      QCOMPARE(to_host(b->state()[i]->value), to_host(a->state()[i]->value));
    QCOMPARE(b->state()[0]->name, std::string("conv1.weight"));

    const Tensor x = uniform(*rt_, {4, 1, 28, 28}, device_, 11);
    const Tensor labels = from_values(*rt_, {4}, device_, {3, 1, 4, 1});
    const std::vector<float> la = to_host(a->forward(x)), lb = to_host(b->forward(x));
    QVERIFY2(max_abs_diff(la, lb) <= 1e-5, "logits differ");
    QVERIFY(max_abs(la) > 1e-2);  // not trivially equal

    // One SGD step through each: the same parameters after it.
    for (Model* m : {a.get(), b.get()}) {
      Tensor logits = m->forward(x, Mode::Train);
      m->backward(softmax_cross_entropy(logits, labels).dlogits);
      std::vector<Tensor> params, grads;
      for (Parameter* p : m->parameters()) params.push_back(p->value), grads.push_back(p->grad);
      std::vector<OptimizerState> states(params.size());
      optimizer_step(params, grads, states, OptimizerOptions{.lr = 0.9}, 0.9, 1);
    }
    for (size_t i = 0; i < a->state().size(); ++i)
      QVERIFY2(max_abs_diff(to_host(b->state()[i]->value), to_host(a->state()[i]->value)) <= 1e-5,
               a->state()[i]->name.c_str());
  }

  // The built-in model runs in the device's blocked layout with its ReLUs and shortcut adds fused into the
  // batch norms, and so does the drawn one (graph_module.cpp's plan finds the same structure). Both must give
  // the same logits and, after one step, the same parameters and running statistics.
  void drawn_resnet18_equals_the_builtin_one_on_two_images() {
    ModelOptions builtin = modelOptions(Arch::ResNet18, 5);
    builtin.init = Init::Kaiming;  // logits far from zero, so that equal means something
    auto a = Model::create(*rt_, builtin, device_);
    auto b = Model::create(*rt_, networkOptions(resnet18(1), Init::Kaiming, 5), device_);
    QCOMPARE(b->parameter_count(), a->parameter_count());
    const Tensor x = normal(*rt_, {2, 1, 16, 16}, device_, 21);
    for (Mode mode : {Mode::Train, Mode::Eval}) {
      const std::vector<float> la = to_host(a->forward(x, mode)), lb = to_host(b->forward(x, mode));
      QVERIFY(max_abs(la) > 1e-2);
      QVERIFY2(max_abs_diff(la, lb) <= 1e-5 * std::max(1.0, max_abs(la)), "logits differ");
    }
    a->clear_cache();
    b->clear_cache();

    const Tensor labels = from_values(*rt_, {2}, device_, {3, 8});
    for (Model* m : {a.get(), b.get()}) {
      Tensor logits = m->forward(x, Mode::Train);
      m->backward(softmax_cross_entropy(logits, labels).dlogits);
      std::vector<Tensor> params, grads;
      for (Parameter* p : m->parameters()) params.push_back(p->value), grads.push_back(p->grad);
      std::vector<OptimizerState> states(params.size());
      optimizer_step(params, grads, states, OptimizerOptions{.lr = 0.5}, 0.5, 1);
    }
    std::map<std::string, Tensor> drawn;
    for (const Parameter* p : b->state()) drawn[p->name] = p->value;
    for (const Parameter* p : a->state()) {
      const auto it = drawn.find(drawn_resnet18_name(p->name));
      QVERIFY2(it != drawn.end(), p->name.c_str());
      const std::vector<float> va = to_host(p->value), vb = to_host(it->second);
      QVERIFY2(max_abs_diff(va, vb) <= 1e-5 * std::max(1.0, max_abs(va)), p->name.c_str());
    }
  }

  // A training step of the drawn ResNet-18 holds what the built-in one holds: the same activations for
  // backward and the same peak in the allocator, and no more kernel scratch. Before graph_module.cpp's plan
  // the scratch was the difference: every NCHW convolution staged its operands through reorders into and out
  // of oneDNN's blocked layout (a drawn ResNet-18's `gpunodes run` peaked at 1.19x the built-in's resident
  // memory). Each model runs on a runtime of its own, whose worker threads (and their scratch) are new.
  void drawn_resnet18_holds_what_the_builtin_one_holds() {
    struct Held {
      double kept = 0, peak = 0, scratch = 0;
    };
    auto held = [&](const ModelOptions& o) {
      const double scratch_before = double(cpu_kernel_scratch_bytes());
      Runtime rt(RuntimeOptions{.cpu_devices = 1});
      auto m = Model::create(rt, o, device_);
      const Tensor x = normal(rt, {16, 1, 28, 28}, device_, 3);
      const Tensor labels = from_values(rt, {16}, device_, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 0, 1, 2, 3, 4, 5});
      rt.engine().wait_all();
      const double before = double(rt.memory_stats(device_).allocated_bytes.current);
      rt.reset_peak_memory();
      Tensor logits = m->forward(x, Mode::Train);
      rt.engine().wait_all();
      Held h;
      h.kept = double(rt.memory_stats(device_).allocated_bytes.current) - before;
      m->backward(softmax_cross_entropy(logits, labels).dlogits);
      rt.engine().wait_all();
      h.peak = double(rt.memory_stats(device_).allocated_bytes.peak) - before;
      h.scratch = double(cpu_kernel_scratch_bytes()) - scratch_before;
      return h;
    };
    ModelOptions builtin = modelOptions(Arch::ResNet18, 5);
    const Held a = held(builtin), b = held(networkOptions(resnet18(1, 28), Init::Kaiming, 5));
    qInfo("built-in / drawn, MiB: a forward keeps %.1f / %.1f, the step peaks at %.1f / %.1f above the "
          "parameters, kernel scratch %.1f / %.1f",
          a.kept / 1048576, b.kept / 1048576, a.peak / 1048576, b.peak / 1048576, a.scratch / 1048576,
          b.scratch / 1048576);
    QVERIFY2(b.kept <= 1.02 * a.kept, qPrintable(QString("drawn keeps %1 bytes, the built-in %2").arg(b.kept).arg(a.kept)));
    QVERIFY2(b.peak <= 1.02 * a.peak, qPrintable(QString("drawn peaks at %1 bytes, the built-in at %2").arg(b.peak).arg(a.peak)));
    QVERIFY2(b.scratch <= 1.05 * a.scratch + 1048576,
             qPrintable(QString("drawn holds %1 bytes of scratch, the built-in %2").arg(b.scratch).arg(a.scratch)));
  }

  // The plan's awkward cases (drawn_networks.h's plan_cases) against the same network with a Scale(1) after
  // each batch norm, which the plan can neither fuse nor lay out: logits in training and evaluation and every
  // gradient must agree.
  void fused_and_blocked_layers_equal_the_plain_ones() {
    auto fused = Model::create(*rt_, networkOptions(plan_cases(false), Init::Xavier, 4), device_);
    auto plain = Model::create(*rt_, networkOptions(plan_cases(true), Init::Xavier, 4), device_);
    const Tensor xs = normal(*rt_, {4, 3, 6, 6}, device_, 9);
    const Tensor labels = from_values(*rt_, {4}, device_, {0, 2, 1, 2});
    auto near = [](const std::vector<float>& a, const std::vector<float>& b) {
      return max_abs_diff(a, b) <= 1e-5 * std::max(1.0, max_abs(a));
    };
    for (Model* m : {fused.get(), plain.get()})
      m->backward(softmax_cross_entropy(m->forward(xs, Mode::Train), labels).dlogits);
    const std::vector<Parameter*> pf = fused->parameters(), pp = plain->parameters();
    QCOMPARE(pf.size(), size_t(18));  // stem, c1, late, last, fc, bn0..bn3: weight and bias
    QCOMPARE(pp.size(), pf.size());
    for (size_t i = 0; i < pf.size(); ++i) {
      QVERIFY2(near(to_host(pp[i]->value), to_host(pf[i]->value)), pf[i]->name.c_str());
      // A bias before a batch norm has no gradient (the normalisation takes its mean out); weights all have.
      if (pf[i]->name.ends_with("weight")) QVERIFY2(max_abs(to_host(pp[i]->grad)) > 1e-4, pf[i]->name.c_str());
      QVERIFY2(near(to_host(pp[i]->grad), to_host(pf[i]->grad)), pf[i]->name.c_str());
    }
    for (Mode mode : {Mode::Train, Mode::Eval})
      QVERIFY(near(to_host(plain->forward(xs, mode)), to_host(fused->forward(xs, mode))));
    fused->clear_cache();
    plain->clear_cache();
  }

  void gradients_through_branches_match_finite_differences() {
    // A stem read by three branches (two of them concatenated, the sum of those and the third): the stem's
    // gradient is the sum of what comes back along each.
    WiredNet n;
    const int in = n.add("in", LayerKind::Input, {}, input({2, 5, 5}));
    const int x = n.add("stem", LayerKind::Conv2d, {in}, conv(2, 3, 1, 1));
    int a = n.add("a", LayerKind::Conv2d, {x}, conv(3, 3, 1, 1));
    a = n.add("a_act", LayerKind::Tanh, {a});
    const int b = n.add("b", LayerKind::Conv2d, {x},
                        [](LayerSpec& l) { l.features = 2, l.kernel = 1, l.bias = false; });
    int c = n.add("cat", LayerKind::Concat, {a, b});
    c = n.add("c", LayerKind::Conv2d, {c},
              [](LayerSpec& l) { l.features = 4, l.kernel = 3, l.padding = 1, l.groups = 1; });
    const int d = n.add("d", LayerKind::Conv2d, {x}, conv(4, 1));
    int h = n.add("sum", LayerKind::Add, {c, d});
    h = n.add("gelu", LayerKind::GELU, {h});
    h = n.add("bn", LayerKind::BatchNorm2d, {h});
    // Average pooling: a max pool's kinks could flip under the finite differences' step.
    h = n.add("pool", LayerKind::AvgPool2d, {h}, [](LayerSpec& l) { l.kernel = 2, l.stride = 1; });
    h = n.add("flat", LayerKind::Flatten, {h});
    n.add("fc", LayerKind::Linear, {h}, features(3));
    auto m = Model::create(*rt_, networkOptions(n.spec, Init::Xavier, 3), device_);
    const Tensor xs = normal(*rt_, {4, 2, 5, 5}, device_, 8);
    const Tensor labels = from_values(*rt_, {4}, device_, {0, 2, 1, 2});
    auto loss = [&] {
      return double(item(softmax_cross_entropy(m->forward(xs, Mode::Train), labels, false).loss));
    };

    m->backward(softmax_cross_entropy(m->forward(xs, Mode::Train), labels).dlogits);
    const int checked = check_finite_differences(*m, loss);
    QCOMPARE(checked, 3 * 13);  // stem, a, c, d, bn, fc: weight and bias; b: weight
    m->clear_cache();
  }

  void dropout_acts_only_in_training() {
    WiredNet n;
    int h = n.add("x", LayerKind::Input, {}, input({1000}));
    n.add("drop", LayerKind::Dropout, {h}, [](LayerSpec& l) { l.p = 0.25; });
    auto m = Model::create(*rt_, networkOptions(n.spec, Init::Normal, 0), device_);
    QCOMPARE(m->parameter_count(), int64_t(0));
    const Tensor x = full(*rt_, {2, 1000}, device_, 1.0f);
    QCOMPARE(to_host(m->forward(x)), to_host(x));
    const std::vector<float> y1 = to_host(m->forward(x, Mode::Train)),
                             y2 = to_host(m->forward(x, Mode::Train));
    int zeros = 0;
    for (float v : y1) {
      QVERIFY(v == 0.0f || std::fabs(v - 1.0f / 0.75f) < 1e-6);
      zeros += v == 0.0f;
    }
    QVERIFY2(zeros > 400 && zeros < 600, qPrintable(QString::number(zeros)));  // 2000 * 0.25 = 500
    QVERIFY(y1 != y2);                                                         // a fresh mask per forward
    m->clear_cache();
  }

  void parameter_files_carry_the_whole_network() {
    const auto dir = std::filesystem::temp_directory_path() / ("gn_net_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    const std::string path = (dir / "lenet.params").string();
    WiredNet extra;
    extra.spec = lenet();
    extra.spec.layers[8].bias = false;  // fc1 without bias: the file must say so
    auto m = Model::create(*rt_, networkOptions(extra.spec, Init::Kaiming, 4), device_);
    save_params(*m, path);
    auto back = load_model(*rt_, path, device_);
    QCOMPARE(back->signature(), m->signature());
    QCOMPARE(back->state().size(), m->state().size());
    const Tensor x = uniform(*rt_, {2, 1, 28, 28}, device_, 2);
    QCOMPARE(to_host(back->forward(x)), to_host(m->forward(x)));
    std::filesystem::remove_all(dir);
  }

  void a_network_refuses_inputs_of_another_shape_or_device() {
    auto m = Model::create(*rt_, networkOptions(lenet(), Init::Normal, 0), device_);
    try {
      m->forward(uniform(*rt_, {2, 1, 32, 32}, device_, 1));
      QFAIL("a 32x32 input was accepted");
    } catch (const ShapeError& e) {
      QVERIFY2(QString(e.what()).contains("[N, 1, 28, 28]"), e.what());
    }
  }
};

QTEST_GUILESS_MAIN(NnNetworkTest)
#include "test_nn_network.moc"
