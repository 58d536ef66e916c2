// Weights between gpunodes and PyTorch through safetensors files. For every built-in architecture, torch
// builds the same network from its d2l definition under the same module names (tests/interop/torch_peer.py):
// it loads gpunodes' file with load_state_dict(strict=True) and must give gpunodes' outputs on the same
// batch; and gpunodes loads torch's file and must give torch's outputs. One python process does all the torch
// work (importing torch takes seconds); the suite skips where /usr/bin/python3 cannot import torch.
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <random>

#include "gpunodes/errors.h"
#include "gpunodes/nn/serialize.h"
#include "interop_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

constexpr int64_t kBatch = 3;

struct Case {
  const char* name;
  ModelOptions options;
};

std::vector<Case> cases() {
  auto make = [](Arch arch, int64_t classes, int64_t channels, int64_t size) {
    ModelOptions o;
    o.arch = arch;
    o.classes = classes;
    o.in_channels = channels;
    o.image_size = size;
    o.init = Init::Kaiming;  // outputs of a useful size: normal(0.01) makes the deeper nets' logits tiny
    o.seed = 11;
    return o;
  };
  return {{"linear", make(Arch::Linear, 3, 5, 1)},
          {"mlp", make(Arch::Mlp, 10, 1, 28)},
          {"lenet", make(Arch::LeNet, 10, 1, 28)},
          {"resnet18", make(Arch::ResNet18, 7, 3, 16)}};
}

// The signature torch_peer.py reads: ResNet-18's leaves out the image size, which torch needs for its
// training batches.
std::string peer_signature(const Model& m) {
  std::string s = m.signature();
  if (s.find("image_size=") == std::string::npos && m.arch() != Arch::Linear)
    s += " image_size=" + std::to_string(m.options().image_size);
  return s;
}

// Biases and BatchNorm parameters and statistics of their own, so that every entry matters to the outputs.
void perturb(Model& m, uint32_t seed) {
  std::mt19937 gen(seed);
  for (Parameter* p : m.state()) {
    const std::string& n = p->name;
    float lo, hi;
    if (n.ends_with("running_var") || (n.ends_with("weight") && p->value.shape().size() == 1)) {
      lo = 0.5f;  // variances and BatchNorm scales
      hi = 1.5f;
    } else if (n.ends_with("bias") || n.ends_with("running_mean")) {
      lo = -0.2f;
      hi = 0.2f;
    } else {
      continue;  // conv and linear weights keep their Kaiming draw
    }
    std::uniform_real_distribution<float> dist(lo, hi);
    std::vector<float> v(static_cast<size_t>(p->value.numel()));
    for (float& x : v) x = dist(gen);
    write_values(p->value, std::move(v));
  }
}

QStringList to_list(const QJsonValue& v) {
  QStringList out;
  for (const QJsonValue& s : v.toArray()) out << s.toString();
  return out;
}

}  // namespace

class TorchInteropTest : public QObject {
  Q_OBJECT
  QTemporaryDir dir_;
  Runtime rt_;
  QString peerError_;
  // Per case, from gpunodes' side and from the peer's answers.
  struct Side {
    std::unique_ptr<Model> model;  // the gpunodes model whose file torch loads
    std::vector<float> gn_logits;  // its outputs
    QJsonObject torch_loaded;      // the peer's answer for the logits of gpunodes' weights
    QJsonObject torch_saved;       // the peer's answer for saving its own weights
  };
  std::map<std::string, Side> sides_;

  QString file(const std::string& name, const char* what) const {
    return dir_.filePath(QString::fromStdString(name) + what);
  }

  // The state names torch's state_dict must list: gpunodes' own, each BatchNorm's counter after its
  // running_var.
  static QStringList expected_keys(const Model& m) {
    QStringList keys;
    for (const Parameter* p : m.state()) {
      const QString n = QString::fromStdString(p->name);
      keys << n;
      if (n.endsWith("running_var"))
        keys << n.chopped(int(std::strlen("running_var"))) + "num_batches_tracked";
    }
    return keys;
  }

 private slots:
  void initTestCase() {
    QVERIFY(dir_.isValid());
    if (!QFile::exists(GN_PYTHON))
      QSKIP(GN_PYTHON " is missing: install python3-torch to run the interop suite");

    QJsonArray jobs;
    for (const Case& c : cases()) {
      Side s;
      s.model = Model::create(rt_, c.options, Device::cpu());
      perturb(*s.model, 5);
      s.model->set_batches_tracked(6);
      save_params(*s.model, file(c.name, ".gn.safetensors").toStdString(), ParamsFormat::Safetensors);
      // One batch for both directions.
      std::mt19937 gen(3);
      std::uniform_real_distribution<float> dist(-1, 1);
      const Shape in = s.model->input_shape(kBatch);
      int64_t numel = 1;
      for (int64_t d : in) numel *= d;
      std::vector<float> x(static_cast<size_t>(numel));
      for (float& v : x) v = dist(gen);
      interop::write_floats(file(c.name, ".x.f32"), x);
      s.gn_logits = to_host(forward(*s.model, from_values(rt_, in, Device::cpu(), x)));

      const QString sig = QString::fromStdString(peer_signature(*s.model));
      const QString n = QString::number(kBatch);
      jobs.append(QJsonArray{"logits", sig, file(c.name, ".gn.safetensors"), file(c.name, ".x.f32"), n,
                             file(c.name, ".torch-of-gn.f32")});
      jobs.append(QJsonArray{"save", sig, "17", file(c.name, ".torch.safetensors")});
      jobs.append(QJsonArray{"logits", sig, file(c.name, ".torch.safetensors"), file(c.name, ".x.f32"), n,
                             file(c.name, ".torch-of-torch.f32")});
      sides_[c.name] = std::move(s);
    }
    QFile jf(dir_.filePath("jobs.json"));
    QVERIFY(jf.open(QIODevice::WriteOnly));
    jf.write(QJsonDocument(jobs).toJson());
    jf.close();

    QProcess py;
    py.start(GN_PYTHON, {GN_TORCH_PEER, "jobs", jf.fileName()});
    QVERIFY2(py.waitForStarted(30000), qPrintable(py.errorString()));
    QVERIFY2(py.waitForFinished(600000), "the torch peer did not finish in 10 minutes");
    const QString err = QString::fromUtf8(py.readAllStandardError());
    if (py.exitStatus() == QProcess::NormalExit && py.exitCode() == 3)
      QSKIP(qPrintable(GN_PYTHON " cannot import torch (apt-get install python3-torch): " + err.trimmed()));
    QVERIFY2(py.exitStatus() == QProcess::NormalExit && py.exitCode() == 0,
             qPrintable("the torch peer failed: " + err));
    const QList<QByteArray> lines = py.readAllStandardOutput().trimmed().split('\n');
    QCOMPARE(lines.size(), qsizetype(jobs.size()));
    int k = 0;
    for (const Case& c : cases()) {
      Side& s = sides_[c.name];
      s.torch_loaded = QJsonDocument::fromJson(lines[k]).object();
      s.torch_saved = QJsonDocument::fromJson(lines[k + 1]).object();
      k += 3;
    }
  }

  void python_self_test() {
    // The graph builder (networks drawn from layer nodes) and the safetensors code of the peer itself.
    QProcess py;
    py.start(GN_PYTHON, {GN_TORCH_PEER, "selftest"});
    QVERIFY(py.waitForFinished(300000));
    QVERIFY2(py.exitStatus() == QProcess::NormalExit && py.exitCode() == 0,
             qPrintable(QString::fromUtf8(py.readAllStandardError())));
    QCOMPARE(py.readAllStandardOutput().trimmed(), QByteArray(R"({"selftest": "ok"})"));
  }

  void gpunodes_weights_in_torch_data() {
    QTest::addColumn<QString>("arch");
    for (const Case& c : cases()) QTest::newRow(c.name) << QString(c.name);
  }
  void gpunodes_weights_in_torch() {
    QFETCH(QString, arch);
    const Side& s = sides_.at(arch.toStdString());
    // strict=True took the file: every key torch has, nothing more; and the names are gpunodes' in order.
    QCOMPARE(to_list(s.torch_loaded["keys"]), expected_keys(*s.model));
    // BatchNorm's counters arrive as torch's num_batches_tracked.
    const QJsonValue tracked = s.torch_loaded["num_batches_tracked"];
    QCOMPARE(tracked.isNull() ? int64_t(-1) : int64_t(tracked.toInteger()),
             s.model->arch() == Arch::ResNet18 ? int64_t(6) : int64_t(-1));
    const QString diff =
        interop::compare(interop::read_floats(file(arch.toStdString(), ".torch-of-gn.f32")), s.gn_logits);
    QVERIFY2(diff.isEmpty(), qPrintable(diff));
  }

  void torch_weights_in_gpunodes_data() { gpunodes_weights_in_torch_data(); }
  void torch_weights_in_gpunodes() {
    QFETCH(QString, arch);
    const std::string name = arch.toStdString();
    const Side& s = sides_.at(name);
    const std::string path = file(name, ".torch.safetensors").toStdString();
    // torch's file says nothing about the model: it loads into one built for it, not by itself.
    const ParamsFileInfo info = read_params_info(path);
    QCOMPARE(info.format, ParamsFormat::Safetensors);
    QVERIFY(info.signature.empty());
    try {
      load_model(rt_, path, Device::cpu());
      QFAIL("load_model built a model from a file without a signature");
    } catch (const Error& e) {
      QVERIFY2(QString(e.what()).contains("gpunodes.signature"), e.what());
    }
    ModelOptions o = s.model->options();
    o.seed = 99;
    auto m = Model::create(rt_, o, Device::cpu());
    load_params(*m, path);
    const QJsonValue tracked = s.torch_saved["num_batches_tracked"];
    QCOMPARE(m->batches_tracked(), tracked.isNull() ? int64_t(0) : int64_t(tracked.toInteger()));
    const std::vector<float> x = interop::read_floats(file(name, ".x.f32"));
    const std::vector<float> y =
        to_host(forward(*m, from_values(rt_, m->input_shape(kBatch), Device::cpu(), x)));
    const QString diff = interop::compare(y, interop::read_floats(file(name, ".torch-of-torch.f32")));
    QVERIFY2(diff.isEmpty(), qPrintable(diff));
    QCOMPARE(to_list(s.torch_saved["keys"]), expected_keys(*m));
  }
};

QTEST_GUILESS_MAIN(TorchInteropTest)
#include "test_torch_interop.moc"
