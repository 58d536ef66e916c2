// Shared by the training-layer suites.
#pragma once
#include <unistd.h>

#include <QFile>
#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "gpunodes/errors.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/ops.h"
#include "gpunodes/precision.h"

namespace gn::nn {

// The default options of `arch`, with its parameters drawn from `seed`.
inline ModelOptions modelOptions(Arch arch, uint64_t seed = 0) {
  ModelOptions o;
  o.arch = arch;
  o.seed = seed;
  return o;
}

// Files a test writes, in a temporary folder removed when the test ends.
class Files {
 public:
  QString write(const QString& name, const QByteArray& bytes) {
    const QString path = dir_.filePath(name);
    QFile f(path);
    if (!f.open(QIODevice::WriteOnly)) qFatal("cannot write %s", qPrintable(path));
    f.write(bytes);
    return path;
  }
  QString path(const QString& name) const { return dir_.filePath(name); }

 private:
  QTemporaryDir dir_;
};

// A fresh directory under the system's temporary directory, removed when the test ends.
struct TempDir {
  std::filesystem::path path;
  explicit TempDir(const std::string& prefix = "gn_nn_test_") {
    static int counter = 0;
    path = std::filesystem::temp_directory_path() /
           (prefix + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    std::filesystem::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
  std::string file(const std::string& name) const { return (path / name).string(); }
};

// fn must throw gn::Error whose message names every needle; returns the message (empty after a failure).
inline std::string expect_error(const std::function<void()>& fn, const QStringList& needles) {
  try {
    fn();
  } catch (const Error& e) {
    const QString what = e.what();
    for (const QString& n : needles)
      if (!what.contains(n)) {
        QTest::qFail(qPrintable("error '" + what + "' does not mention '" + n + "'"), __FILE__, __LINE__);
        return {};
      }
    return e.what();
  }
  QTest::qFail("no error was thrown", __FILE__, __LINE__);
  return {};
}


// Every trainable parameter's gradient (already set by a backward) against central differences of `loss` at
// three entries (first, middle, last), with a step of 1e-2: fails the test naming the parameter and entry.
// Returns how many entries it checked.
inline int check_finite_differences(Model& m, const std::function<double()>& loss) {
  int checked = 0;
  for (Parameter* p : m.parameters()) {
    const std::vector<float> grad = to_host(p->grad);
    std::vector<float> v = to_host(p->value);
    for (size_t i : {size_t(0), v.size() / 2, v.size() - 1}) {
      const float keep = v[i], h = 1e-2f;
      v[i] = keep + h;
      write_values(p->value, v);
      const double up = loss();
      v[i] = keep - h;
      write_values(p->value, v);
      const double down = loss();
      v[i] = keep;
      write_values(p->value, v);
      const double numeric = (up - down) / (2 * h);
      if (!(std::fabs(numeric - grad[i]) <= 2e-3 + 2e-2 * std::fabs(numeric))) {
        QTest::qFail(qPrintable(QString("%1[%2]: backward %3, finite differences %4")
                                    .arg(p->name.c_str())
                                    .arg(i)
                                    .arg(grad[i])
                                    .arg(numeric)),
                     __FILE__, __LINE__);
        return checked;
      }
      ++checked;
    }
  }
  return checked;
}

// fn must throw LayerError on `port` whose message names every needle.
inline void expect_layer_error(const std::function<void()>& fn, const std::string& port, const QStringList& needles) {
  try {
    fn();
  } catch (const LayerError& e) {
    const QString what = e.what();
    if (QString::fromStdString(e.port()) != QString::fromStdString(port)) {
      QTest::qFail(qPrintable("the error names port '" + QString::fromStdString(e.port()) + "', not '" +
                              QString::fromStdString(port) + "'"),
                   __FILE__, __LINE__);
      return;
    }
    for (const QString& n : needles)
      if (!what.contains(n)) {
        QTest::qFail(qPrintable("error '" + what + "' does not mention '" + n + "'"), __FILE__, __LINE__);
        return;
      }
    return;
  }
  QTest::qFail("no LayerError was thrown", __FILE__, __LINE__);
}

// One layer of `kind` with id "l", its params set by `set`: for the shape inference checks.
inline LayerSpec spec(LayerKind kind, const std::function<void(LayerSpec&)>& set = {}) {
  LayerSpec l;
  l.id = std::string(1, 'l');  // not = "l": GCC 12 warns falsely (-Wrestrict) on that assignment
  l.kind = kind;
  if (set) set(l);
  return l;
}

// Appends layers to a NetworkSpec, each reading the one before (or the ones named).
struct Net {
  NetworkSpec spec;
  int add(const std::string& id, LayerKind kind, const std::function<void(LayerSpec&)>& set = {},
          std::vector<int> inputs = {-2}) {
    LayerSpec l;
    l.id = id;
    l.kind = kind;
    if (kind != LayerKind::Input) l.inputs = inputs == std::vector<int>{-2} ? std::vector<int>{last()} : inputs;
    if (set) set(l);
    spec.layers.push_back(l);
    return last();
  }
  int last() const { return static_cast<int>(spec.layers.size()) - 1; }
};

// A drawn network's options: Xavier init, weights from `seed`.
inline ModelOptions networkOptions(const NetworkSpec& net, uint64_t seed = 1) {
  ModelOptions o;
  o.arch = Arch::Network;
  o.network = std::make_shared<const NetworkSpec>(net);
  o.init = Init::Xavier;
  o.seed = seed;
  return o;
}

// The largest |a[i] - b[i]| (infinite when the sizes differ), and the largest |a[i]|.
inline double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - double(b[i])));
  return m;
}
inline double max_abs(const std::vector<float>& a) {
  double m = 0;
  for (float v : a) m = std::max(m, std::fabs(double(v)));
  return m;
}

// float -> bf16 -> float, rounded to nearest even, on the host: the bf16 suites' reference for the rounding
// oneDNN's reorders, vcvtne2ps2bf16 and the runtime's own kernels do.
inline float round_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof bits);
  bits = (bits + 0x7fffu + ((bits >> 16) & 1u)) & 0xffff0000u;
  float r;
  std::memcpy(&r, &bits, sizeof r);
  return r;
}

// Why the bf16 checks skip on this CPU; empty where bf16 runs (test_cpu_bf16, test_cpu_bf16_networks).
inline QString no_bf16_reason() {
  if (cpu_native_bf16()) return {};
  const std::string has = cpu_bf16_features();
  return QString("no native bf16 here: oneDNN's effective ISA is %1 (the CPU has %2)")
      .arg(QString::fromStdString(cpu_dnnl_isa()), has.empty() ? QString("neither avx512_bf16 nor AMX-BF16")
                                                              : QString::fromStdString(has));
}

}  // namespace gn::nn

// In a bf16 test slot: skips it, saying why, on a CPU without native bf16.
#define SKIP_WITHOUT_BF16()                                           \
  do {                                                                \
    if (const QString why = gn::nn::no_bf16_reason(); !why.isEmpty()) QSKIP(qPrintable(why)); \
  } while (0)

// In a test slot: sets `device` to the device GN_TEST_DEVICE names (the suites' CUDA variants set it to
// cuda:0) and leaves it as it is when the variable is unset. A name that is not a device fails the slot; a
// GPU this machine lacks skips it. A macro because QVERIFY2 and QSKIP return from the slot.
#define GN_USE_TEST_DEVICE(runtime, device)                                          \
  do {                                                                               \
    const QByteArray gn_name_ = qgetenv("GN_TEST_DEVICE");                           \
    if (gn_name_.isEmpty()) break;                                                   \
    const auto gn_device_ = gn::Device::parse(gn_name_.toStdString());               \
    QVERIFY2(gn_device_.has_value(), "GN_TEST_DEVICE is not a device name");         \
    if (gn_device_->is_cuda() && (runtime).cuda_device_count() <= gn_device_->index) \
      QSKIP("no CUDA device here");                                                  \
    (device) = *gn_device_;                                                          \
  } while (false)
