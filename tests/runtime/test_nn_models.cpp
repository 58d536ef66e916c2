// Models, data and parameter files: parameter names, shapes and devices; seeded initialisation; a ResNet-18
// step; save/load across devices and its failures; the Fashion-MNIST reader and the loader.
#include <QtTest>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "gpunodes/errors.h"
#include "gpunodes/nn/serialize.h"
#include "gpunodes/nn/trainer.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;
namespace fs = std::filesystem;

namespace {

double stddev(const std::vector<float>& v) {
  double m = 0, s = 0;
  for (float x : v) m += x;
  m /= static_cast<double>(v.size());
  for (float x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

}  // namespace

class NnModelsTest : public QObject {
  Q_OBJECT

 private slots:
  void linear_net_lives_on_its_device() {
    // The seed: net = nn.Sequential(nn.Linear(3, 1)); net.to(try_gpu()); net(X); net[0].weight.data.device.
    Runtime rt({.cpu_devices = 2});
    const Device d = rt.try_gpu();
    ModelOptions o = modelOptions(Arch::Linear);
    o.in_channels = 3;
    o.classes = 1;
    auto net = Model::create(rt, o, d);
    auto info = net->describe();
    QCOMPARE(info.size(), size_t(2));
    QCOMPARE(info[0].name, std::string("0.weight"));
    QCOMPARE(info[0].shape, (Shape{1, 3}));
    QCOMPARE(info[0].device, d);
    QCOMPARE(info[1].name, std::string("0.bias"));
    Tensor x = ones(rt, {2, 3}, d);
    Tensor y = forward(*net, x);
    QCOMPARE(y.shape(), (Shape{2, 1}));
    QCOMPARE(y.device(), d);
    auto w = to_host(net->state()[0]->value);
    const float want = w[0] + w[1] + w[2];  // bias starts at zero
    for (float v : to_host(y)) QVERIFY(std::abs(v - want) < 1e-6f);
    // Input on another device: the same-device rule.
    const Device other = d.is_cuda() ? Device::cpu() : Device::cpu(1);
    QVERIFY_THROWS_EXCEPTION(DeviceMismatchError, forward(*net, ones(rt, {2, 3}, other)));
  }

  void architectures_have_pytorch_names_and_sizes() {
    Runtime rt;
    auto mlp = Model::create(rt, modelOptions(Arch::Mlp), Device::cpu());
    auto mi = mlp->describe();
    QCOMPARE(mi.size(), size_t(4));
    QCOMPARE(mi[0].name, std::string("1.weight"));
    QCOMPARE(mi[0].shape, (Shape{256, 784}));
    QCOMPARE(mi[3].name, std::string("3.bias"));
    QCOMPARE(mlp->parameter_count(), int64_t(784 * 256 + 256 + 256 * 10 + 10));

    auto lenet = Model::create(rt, modelOptions(Arch::LeNet), Device::cpu());
    QCOMPARE(lenet->parameter_count(), int64_t(61706));  // d2l's LeNet
    QCOMPARE(lenet->describe()[0].shape, (Shape{6, 1, 5, 5}));
    QCOMPARE(lenet->describe()[4].name, std::string("7.weight"));
    QCOMPARE(lenet->describe()[4].shape, (Shape{120, 400}));

    auto resnet = Model::create(rt, modelOptions(Arch::ResNet18), Device::cpu());
    auto ri = resnet->describe();
    QCOMPARE(ri.size(), size_t(110));  // PyTorch's state_dict without num_batches_tracked
    QCOMPARE(resnet->parameters().size(), size_t(76));
    QCOMPARE(resnet->parameter_count(), int64_t(11175818));  // counted with torch for seed 004's resnet18(10)
    QCOMPARE(ri[0].name, std::string("0.weight"));
    QCOMPARE(ri[0].shape, (Shape{64, 1, 3, 3}));
    QCOMPARE(ri[4].name, std::string("1.running_mean"));
    QVERIFY(!ri[4].trainable);
    QCOMPARE(ri[6].name, std::string("resnet_block1.0.conv1.weight"));
    QCOMPARE(ri.back().name, std::string("fc.1.bias"));
    bool projection = false;
    for (const auto& p : ri)
      if (p.name == "resnet_block2.0.conv3.weight") projection = p.shape == Shape{128, 64, 1, 1};
    QVERIFY(projection);
    for (const auto& p : ri) QVERIFY(p.name.find("resnet_block1.0.conv3") == std::string::npos);
    QVERIFY(QString::fromStdString(resnet->summary()).contains("resnet_block4.1"));

    Tensor logits = forward(*resnet, uniform(rt, {2, 1, 28, 28}, Device::cpu(), 1));
    QCOMPARE(logits.shape(), (Shape{2, 10}));
    Tensor big = forward(*resnet, uniform(rt, {1, 1, 96, 96}, Device::cpu(), 1));  // the seed's resize
    QCOMPARE(big.shape(), (Shape{1, 10}));
    for (float v : to_host(big)) QVERIFY(std::isfinite(v));
    expect_error(
        [&] {
          forward(*mlp, zeros(rt, {2, 1, 32, 32}, Device::cpu()));
        },
        {"mlp expects input [N, 1, 28, 28]"});
    expect_error([] { parse_arch("vgg"); }, {"vgg", "resnet18"});
  }

  void state_size_is_known_before_building() {
    // The count graph checks use to refuse a model that cannot fit, against the models actually built.
    Runtime rt;
    for (ModelOptions o : {modelOptions(Arch::Linear), modelOptions(Arch::Mlp), modelOptions(Arch::LeNet),
                           modelOptions(Arch::ResNet18)}) {
      for (auto [classes, channels, side] :
           {std::tuple{10, 1, 28}, std::tuple{7, 3, 32}, std::tuple{100, 2, 12}}) {
        o.classes = classes, o.in_channels = channels, o.image_size = side;
        auto m = Model::create(rt, o, Device::cpu());
        double built = 0;
        for (const Parameter* p : m->state()) built += static_cast<double>(p->value.numel());
        QCOMPARE(state_elements(o), built);
      }
    }
    ModelOptions huge = modelOptions(Arch::Mlp);
    huge.in_channels = 100000, huge.image_size = 4096;
    QVERIFY(state_elements(huge) * 4 > 1e15);  // petabytes, counted without building anything
  }

  void same_seed_same_parameters_on_every_device() {
    Runtime rt({.cpu_devices = 2});
    for (Arch a : {Arch::Mlp, Arch::LeNet}) {
      auto m0 = Model::create(rt, modelOptions(a, 5), Device::cpu(0));
      auto m1 = Model::create(rt, modelOptions(a, 5), Device::cpu(1));
      auto m2 = Model::create(rt, modelOptions(a, 6), Device::cpu(0));
      auto s0 = m0->state(), s1 = m1->state(), s2 = m2->state();
      QCOMPARE(s1[0]->value.device(), Device::cpu(1));
      for (size_t i = 0; i < s0.size(); ++i) QCOMPARE(to_host(s0[i]->value), to_host(s1[i]->value));
      QVERIFY(to_host(s0[0]->value) != to_host(s2[0]->value));
      // Different layers draw from different streams.
      QVERIFY(to_host(s0[0]->value)[0] != to_host(s0[2]->value)[0]);
    }
  }

  void initialisers_have_their_spread() {
    Runtime rt;
    ModelOptions o = modelOptions(Arch::Mlp, 1);
    auto normal = Model::create(rt, o, Device::cpu());
    auto w = to_host(normal->state()[0]->value);
    QVERIFY(std::abs(stddev(w) - 0.01) < 0.0005);
    for (float b : to_host(normal->state()[1]->value)) QCOMPARE(b, 0.0f);
    o.init = Init::Xavier;
    auto xavier = Model::create(rt, o, Device::cpu());
    w = to_host(xavier->state()[0]->value);
    const double a = std::sqrt(6.0 / (784 + 256));
    for (float v : w) QVERIFY(std::abs(v) <= a + 1e-6);
    QVERIFY(std::abs(stddev(w) - a / std::sqrt(3.0)) < 0.02 * a);
    o.init = Init::Kaiming;
    auto kaiming = Model::create(rt, o, Device::cpu());
    QVERIFY(std::abs(stddev(to_host(kaiming->state()[0]->value)) - std::sqrt(2.0 / 784)) < 0.002);
    QCOMPARE(parse_init("xavier"), Init::Xavier);
  }

  void resnet18_loss_falls_on_a_tiny_subset() {
    Runtime rt;
    ModelOptions o = modelOptions(Arch::ResNet18, 3);
    auto net = Model::create(rt, o, Device::cpu());
    DatasetPtr tiny = take(load_fashion_mnist(Split::Train), 16);
    TrainOptions to;
    to.batch_size = 16;
    to.optimizer.lr = 0.05;
    Trainer trainer(*net, {Device::cpu()}, to);
    DataLoader loader(tiny, {.batch_size = 16, .shuffle = false});
    loader.start_epoch(0);
    HostBatchPtr batch = loader.next();
    QVERIFY(batch);
    std::vector<double> losses;
    for (int i = 0; i < 5; ++i) {
      trainer.reset_totals();
      trainer.step(batch);
      losses.push_back(trainer.totals().loss());
    }
    qInfo("ResNet-18 loss over 5 steps: %.4f %.4f %.4f %.4f %.4f", losses[0], losses[1], losses[2], losses[3],
          losses[4]);
    for (double l : losses) QVERIFY(std::isfinite(l));
    QVERIFY(losses.back() < losses.front() * 0.8);
    // Train mode moved the BatchNorm running statistics off their start.
    auto rm = to_host(net->state()[4]->value);
    QVERIFY(std::any_of(rm.begin(), rm.end(), [](float v) { return v != 0.0f; }));
  }

  void save_load_compare_across_devices() {
    Runtime rt({.cpu_devices = 2});
    TempDir dir;
    auto a = Model::create(rt, modelOptions(Arch::LeNet, 1), Device::cpu(0));
    // Train a little so the values are not just the seed's.
    TrainOptions to;
    to.batch_size = 32;
    Trainer t(*a, {Device::cpu(0)}, to);
    DataLoader loader(make_synthetic({.count = 64, .seed = 2}), {.batch_size = 32});
    loader.start_epoch(0);
    while (auto b = loader.next()) t.step(b);
    t.synchronize();
    const std::string path = dir.file("lenet.gnparams");
    save_params(*a, path);
    ParamsFileInfo info = read_params_info(path);
    QCOMPARE(info.version, 1u);
    QCOMPARE(info.signature, a->signature());
    QCOMPARE(info.entries.size(), a->state().size());
    QCOMPARE(info.entries[0].name, std::string("0.weight"));

    // Into a model of another seed on the other device: identical values, identical outputs.
    auto b = Model::create(rt, modelOptions(Arch::LeNet, 99), Device::cpu(1));
    load_params(*b, path);
    for (size_t i = 0; i < a->state().size(); ++i)
      QCOMPARE(to_host(a->state()[i]->value), to_host(b->state()[i]->value));
    QCOMPARE(b->state()[0]->value.device(), Device::cpu(1));
    Tensor x = uniform(rt, {4, 1, 28, 28}, Device::cpu(0), 5);
    QCOMPARE(to_host(forward(*a, x)), to_host(forward(*b, copy(x, Device::cpu(1)))));
    auto c = load_model(rt, path, Device::cpu(1));
    QCOMPARE(c->arch(), Arch::LeNet);
    QCOMPARE(to_host(c->state()[3]->value), to_host(a->state()[3]->value));

    // BatchNorm buffers travel too.
    auto r1 = Model::create(rt, modelOptions(Arch::ResNet18, 1), Device::cpu(0));
    write_values(r1->state()[5]->value, std::vector<float>(64, 3.5f));
    const std::string rpath = dir.file("resnet.gnparams");
    save_params(*r1, rpath);
    auto r2 = Model::create(rt, modelOptions(Arch::ResNet18, 2), Device::cpu(1));
    load_params(*r2, rpath);
    QCOMPARE(to_host(r2->state()[5]->value), std::vector<float>(64, 3.5f));
    QCOMPARE(to_host(r2->state().back()->value), to_host(r1->state().back()->value));
  }

  void loading_the_wrong_file_fails_clearly() {
    Runtime rt;
    TempDir dir;
    auto lenet = Model::create(rt, modelOptions(Arch::LeNet), Device::cpu());
    auto mlp = Model::create(rt, modelOptions(Arch::Mlp), Device::cpu());
    const std::string path = dir.file("lenet.gnparams");
    save_params(*lenet, path);
    const auto before = to_host(mlp->state()[0]->value);
    expect_error([&] { load_params(*mlp, path); }, {"lenet", "mlp", QString::fromStdString(path)});
    ModelOptions ten_out = modelOptions(Arch::LeNet);
    ten_out.classes = 5;
    auto lenet5 = Model::create(rt, ten_out, Device::cpu());
    expect_error([&] { load_params(*lenet5, path); }, {"classes=10", "classes=5"});
    QCOMPARE(to_host(mlp->state()[0]->value), before);  // a failed load leaves the model alone

    std::ifstream in(path, std::ios::binary);
    std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    auto write = [&](const std::string& name, const std::vector<char>& data) {
      std::ofstream out(dir.file(name), std::ios::binary);
      out.write(data.data(), static_cast<std::streamsize>(data.size()));
      return dir.file(name);
    };
    std::vector<char> flipped = bytes;
    flipped[flipped.size() / 2] ^= 0x40;
    expect_error([&] { load_params(*lenet, write("flipped", flipped)); }, {"corrupt", "checksum"});
    std::vector<char> cut(bytes.begin(), bytes.begin() + static_cast<long>(bytes.size() / 3));
    expect_error([&] { load_params(*lenet, write("cut", cut)); }, {"corrupt"});
    expect_error(
        [&] { load_params(*lenet, write("tiny", std::vector<char>(bytes.begin(), bytes.begin() + 10))); },
        {"corrupt"});
    expect_error([&] { load_params(*lenet, write("garbage", std::vector<char>(500, 'x'))); },
                 {"not a gpunodes parameter file"});
    expect_error([&] { load_params(*lenet, dir.file("missing")); }, {"cannot open", "missing"});
    expect_error([] { options_from_signature("mlp classes=ten"); }, {"malformed"});
  }

  void fashion_mnist_reads_the_installed_files() {
    DatasetPtr train = load_fashion_mnist(Split::Train);
    DatasetPtr test = load_fashion_mnist(Split::Test);
    QCOMPARE(train->count, int64_t(60000));
    QCOMPARE(test->count, int64_t(10000));
    QCOMPARE(train->sample_numel(), int64_t(784));
    QCOMPARE(int(train->labels[0]), 9);  // an ankle boot, the first image of both sets
    QCOMPARE(int(test->labels[1]), 2);
    int64_t sum = 0;
    for (int i = 0; i < 784; ++i) sum += train->images[i];
    QCOMPARE(sum, int64_t(76247));  // checked against the raw file with numpy
    QCOMPARE(train->class_names[9], std::string("ankle boot"));
    QVERIFY(load_fashion_mnist(Split::Train) == train);  // shared while held
    QCOMPARE(take(train, 100)->count, int64_t(100));
  }

  void fashion_mnist_errors_say_what_where_and_how() {
    expect_error([] { load_fashion_mnist(Split::Train, "/nonexistent/fmnist"); },
                 {"/nonexistent/fmnist", "apt-get install dataset-fashion-mnist"});
    TempDir dir;
    expect_error([&] { load_fashion_mnist(Split::Test, dir.path.string()); },
                 {"t10k-images-idx3-ubyte.gz", "missing", "apt-get install dataset-fashion-mnist"});
    // Garbage where the images should be.
    {
      std::ofstream f(dir.file("train-images-idx3-ubyte.gz"), std::ios::binary);
      f << "this is not an IDX file at all";
    }
    fs::copy_file(fs::path(default_fashion_mnist_dir()) / "train-labels-idx1-ubyte.gz",
                  dir.file("train-labels-idx1-ubyte.gz"));
    expect_error([&] { load_fashion_mnist(Split::Train, dir.path.string()); },
                 {"train-images-idx3-ubyte.gz", "corrupt", "magic", "apt-get install dataset-fashion-mnist"});
    // A truncated download: a valid gzip stream cut short.
    {
      std::ifstream in(fs::path(default_fashion_mnist_dir()) / "train-images-idx3-ubyte.gz",
                       std::ios::binary);
      std::vector<char> head(200000);
      in.read(head.data(), static_cast<std::streamsize>(head.size()));
      std::ofstream out(dir.file("train-images-idx3-ubyte.gz"), std::ios::binary | std::ios::trunc);
      out.write(head.data(), in.gcount());
    }
    expect_error([&] { load_fashion_mnist(Split::Train, dir.path.string()); },
                 {"train-images-idx3-ubyte.gz", "corrupt", "ends inside"});
  }

  void loader_batches_shuffles_and_resizes() {
    DatasetPtr train = load_fashion_mnist(Split::Train);
    DataLoader loader(train, {.batch_size = 256, .seed = 7});
    QCOMPARE(loader.batches_per_epoch(), int64_t(235));
    loader.start_epoch(0);
    int64_t batches = 0, samples = 0, last = 0;
    std::vector<float> first_labels;
    while (auto b = loader.next()) {
      if (batches == 0) first_labels.assign(b->labels, b->labels + 16);
      ++batches;
      samples += b->size;
      last = b->size;
      QCOMPARE(b->height, int64_t(28));
    }
    QCOMPARE(batches, int64_t(235));
    QCOMPARE(samples, int64_t(60000));
    QCOMPARE(last, int64_t(60000 - 234 * 256));
    // The same seed and epoch give the same order; the next epoch another.
    QCOMPARE(shuffled_indices(1000, 7, 0), shuffled_indices(1000, 7, 0));
    QVERIFY(shuffled_indices(1000, 7, 0) != shuffled_indices(1000, 7, 1));
    QVERIFY(shuffled_indices(1000, 7, 0) != shuffled_indices(1000, 8, 0));
    auto order = shuffled_indices(60000, 7, 0);
    for (int i = 0; i < 16; ++i) QCOMPARE(first_labels[i], float(train->labels[order[i]]));
    auto sorted = order;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < 60000; ++i) QCOMPARE(sorted[i], i);
    // Stopping mid-epoch and restarting is clean.
    loader.start_epoch(1);
    QVERIFY(loader.next());
    loader.start_epoch(2);
    QVERIFY(loader.next());
    loader.stop();
    QVERIFY(!loader.next());

    DataLoader big(take(train, 10), {.batch_size = 4, .shuffle = false, .resize = 96});
    big.start_epoch(0);
    auto b = big.next();
    QCOMPARE(b->height, int64_t(96));
    QCOMPARE(b->width, int64_t(96));
    float lo = 1, hi = 0, sum96 = 0, sum28 = 0;
    for (int64_t i = 0; i < 96 * 96; ++i) {
      lo = std::min(lo, b->images[i]);
      hi = std::max(hi, b->images[i]);
      sum96 += b->images[i];
    }
    for (int i = 0; i < 784; ++i) sum28 += train->images[i] / 255.0f;
    QVERIFY(lo >= 0 && hi <= 1 && hi > 0.5f);
    // Bilinear resizing keeps the mean brightness.
    QVERIFY(std::abs(sum96 / (96 * 96) - sum28 / 784) < 0.02);

    Runtime rt;
    DeviceBatch db = to_device(rt, b, 1, 3, Device::cpu());
    QCOMPARE(db.images.shape(), (Shape{2, 1, 96, 96}));
    QCOMPARE(to_host(db.labels), (std::vector<float>{float(train->labels[1]), float(train->labels[2])}));
  }

  void synthetic_set_is_seeded() {
    auto a = make_synthetic({.count = 100, .classes = 4, .seed = 1});
    auto b = make_synthetic({.count = 100, .classes = 4, .seed = 1});
    auto c = make_synthetic({.count = 100, .classes = 4, .seed = 2});
    QCOMPARE(a->images, b->images);
    QVERIFY(a->images != c->images);
    for (auto l : a->labels) QVERIFY(l < 4);
    expect_error([] { make_synthetic({.count = 0}); }, {"synthetic"});
  }
};

QTEST_GUILESS_MAIN(NnModelsTest)
#include "test_nn_models.moc"
