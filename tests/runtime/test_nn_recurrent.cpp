// The recurrent layers (recurrent.h) against PyTorch and against a float64 reference written out here.
//  - torch: nn.RNN (tanh, relu), nn.GRU and nn.LSTM loaded with the same weights, run in float64 by
//    tests/runtime/torch_rnn_peer.py under /usr/bin/python3 (one process for every case): y, h_n, c_n, every
//    weight's gradient and dx of the loss sum(y * R), to 1e-5 of each tensor's largest magnitude. Those rows
//    skip where that interpreter cannot import torch.
//  - without torch: the float64 loop reference below for forward, central differences of it for every
//    gradient; dropout's masks from the Philox formula recurrent.h states; shape, device and usage errors.
// Runs on the device GN_TEST_DEVICE names (default cpu); CTest runs it again as test_nn_recurrent_cuda on
// cuda:0, which skips where there is no GPU.
#include <QJsonArray>
#include <QJsonDocument>
#include <QJsonObject>
#include <QProcess>
#include <QTemporaryDir>
#include <QtTest>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <random>

#include "gpunodes/errors.h"
#include "gpunodes/nn/recurrent.h"
#include "gpunodes/ops.h"
#include "gpunodes/random.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

using Vec = std::vector<double>;

// Agreement to this fraction of the reference tensor's largest magnitude: float32 sums in another order
// than float64 torch's, and nothing larger.
constexpr double kRelTol = 1e-5;

Vec random_vec(size_t n, uint32_t seed, double bound) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(-bound, bound);
  Vec v(n);
  for (auto& x : v) x = static_cast<float>(d(g));  // representable in float: both sides see the same values
  return v;
}

std::vector<float> to_f(const Vec& v) {
  return {v.begin(), v.end()};
}

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// Empty when got matches want to kRelTol of want's largest magnitude; otherwise what differs.
QString compare(const std::vector<float>& got, const Vec& want) {
  if (got.size() != want.size()) return QString("%1 values, expected %2").arg(got.size()).arg(want.size());
  double scale = 0, worst = 0;
  size_t at = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::abs(double(got[i]) - want[i]);
    if (!(d <= worst)) {  // NaN counts as the worst
      worst = d;
      at = i;
    }
  }
  if (worst <= kRelTol * scale) return {};
  return QString("value %1 is %2, expected %3 (largest difference %4, tolerance %5)")
      .arg(at)
      .arg(double(got[at]), 0, 'g', 9)
      .arg(want[at], 0, 'g', 9)
      .arg(worst, 0, 'g', 3)
      .arg(kRelTol * scale, 0, 'g', 3);
}

#define EXPECT_MATCHES(got, want, what)                                      \
  do {                                                                       \
    const QString gn_why_ = compare(got, want);                              \
    QVERIFY2(gn_why_.isEmpty(), qPrintable(QString(what) + ": " + gn_why_)); \
  } while (false)

// --- one problem: options, sizes and every input -----------------------------------------------------------

struct Problem {
  RnnOptions o;
  int64_t n = 0, t = 0;
  Vec x, h0, c0, r;    // h0 / c0 empty: zeros
  std::vector<Vec> w;  // rnn_params order
  int64_t state_numel() const { return o.num_layers * o.directions() * n * o.hidden_size; }
  int64_t y_numel() const { return n * t * o.hidden_size * o.directions(); }
};

Problem make_problem(const RnnOptions& o, int64_t n, int64_t t, bool initial_state, uint32_t seed) {
  Problem p;
  p.o = o;
  p.n = n;
  p.t = t;
  p.x = random_vec(n * t * o.input_size, seed, 1.0);
  const double bound = std::min(0.6, 2.0 / std::sqrt(double(o.hidden_size)));
  uint32_t s = seed * 100;
  for (const RnnParam& param : rnn_params(o)) p.w.push_back(random_vec(numel(param.shape), ++s, bound));
  if (initial_state) {
    p.h0 = random_vec(p.state_numel(), seed + 1, 0.5);
    if (o.kind == RnnKind::Lstm) p.c0 = random_vec(p.state_numel(), seed + 2, 0.5);
  }
  p.r = random_vec(p.y_numel(), seed + 3, 1.0);
  return p;
}

RnnOptions options(RnnKind kind, int64_t in, int64_t hidden, int64_t layers, bool bidirectional,
                   bool bias = true, float dropout = 0) {
  RnnOptions o;
  o.kind = kind;
  o.input_size = in;
  o.hidden_size = hidden;
  o.num_layers = layers;
  o.bidirectional = bidirectional;
  o.bias = bias;
  o.dropout = dropout;
  return o;
}

// --- gpunodes' side -------------------------------------------------------------------------------------

struct Outputs {
  std::vector<float> y, h_n, c_n, dx;
  std::vector<std::vector<float>> dw;
};

Tensor make(Runtime& rt, Device d, const Shape& s, const Vec& v) {
  return from_values(rt, s, d, to_f(v));
}

std::vector<Tensor> weight_tensors(Runtime& rt, Device d, const Problem& p) {
  std::vector<Tensor> w;
  const std::vector<RnnParam> params = rnn_params(p.o);
  for (size_t i = 0; i < params.size(); ++i) w.push_back(make(rt, d, params[i].shape, p.w[i]));
  return w;
}

// Forward (training with `seed`, or eval) and, in training, backward of sum(y * R).
Outputs run_gpunodes(Runtime& rt, Device d, const Problem& p, bool training = true, uint64_t seed = 0) {
  const int64_t layers_dirs = p.o.num_layers * p.o.directions();
  const Shape state{layers_dirs, p.n, p.o.hidden_size};
  const Tensor x = make(rt, d, {p.n, p.t, p.o.input_size}, p.x);
  const std::vector<Tensor> w = weight_tensors(rt, d, p);
  const Tensor h0 = p.h0.empty() ? Tensor() : make(rt, d, state, p.h0);
  const Tensor c0 = p.c0.empty() ? Tensor() : make(rt, d, state, p.c0);
  const RnnResult f = rnn_forward(p.o, x, w, h0, c0, training, seed);
  Outputs out;
  out.y = to_host(f.y);
  out.h_n = to_host(f.h_n);
  if (f.c_n.defined()) out.c_n = to_host(f.c_n);
  if (!training) return out;
  const RnnGrads g = rnn_backward(p.o, f, x, w, make(rt, d, f.y.shape(), p.r), true);
  out.dx = to_host(g.dx);
  for (const Tensor& dw : g.dweights) out.dw.push_back(to_host(dw));
  return out;
}

// --- the float64 reference ------------------------------------------------------------------------------

double sigmoid(double v) {
  return 1.0 / (1.0 + std::exp(-v));
}

struct Reference {
  Vec y, h_n, c_n;
};

// PyTorch's recurrences, loop by loop. masks: per layer but the last, [N, T, H * D] (empty: no dropout).
Reference reference(const RnnOptions& o, int64_t n, int64_t steps, const Vec& x, const std::vector<Vec>& w,
                    const Vec& h0, const Vec& c0, const std::vector<Vec>& masks = {}) {
  const int64_t hs = o.hidden_size, d = o.directions(), g = rnn_gate_count(o.kind), gh = g * hs, hd = hs * d;
  const size_t per = o.bias ? 4 : 2;
  Reference ref;
  ref.h_n.assign(static_cast<size_t>(o.num_layers * d * n * hs), 0.0);
  ref.c_n = ref.h_n;
  Vec in = x;
  int64_t in_size = o.input_size;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    Vec out(static_cast<size_t>(n * steps * hd));
    for (int64_t dir = 0; dir < d; ++dir) {
      const size_t slot = static_cast<size_t>(l * d + dir);
      const Vec &w_ih = w[slot * per], &w_hh = w[slot * per + 1];
      const Vec zeros(static_cast<size_t>(gh), 0.0);
      const Vec& b_ih = o.bias ? w[slot * per + 2] : zeros;
      const Vec& b_hh = o.bias ? w[slot * per + 3] : zeros;
      for (int64_t i = 0; i < n; ++i) {
        Vec h(static_cast<size_t>(hs), 0.0), c = h;
        for (int64_t j = 0; j < hs; ++j) {
          const size_t at = (slot * n + i) * hs + j;
          if (!h0.empty()) h[j] = h0[at];
          if (!c0.empty()) c[j] = c0[at];
        }
        for (int64_t s = 0; s < steps; ++s) {
          const int64_t t = dir == 0 ? s : steps - 1 - s;
          Vec a(static_cast<size_t>(gh)), b(static_cast<size_t>(gh));  // W_ih x + b_ih, W_hh h + b_hh
          for (int64_t k = 0; k < gh; ++k) {
            double sa = b_ih[k], sb = b_hh[k];
            for (int64_t f = 0; f < in_size; ++f)
              sa += w_ih[k * in_size + f] * in[(i * steps + t) * in_size + f];
            for (int64_t j = 0; j < hs; ++j) sb += w_hh[k * hs + j] * h[j];
            a[k] = sa;
            b[k] = sb;
          }
          Vec next(static_cast<size_t>(hs));
          for (int64_t j = 0; j < hs; ++j) {
            switch (o.kind) {
              case RnnKind::RnnTanh:
                next[j] = std::tanh(a[j] + b[j]);
                break;
              case RnnKind::RnnRelu:
                next[j] = std::max(0.0, a[j] + b[j]);
                break;
              case RnnKind::Gru: {
                const double r = sigmoid(a[j] + b[j]), z = sigmoid(a[hs + j] + b[hs + j]);
                const double nn = std::tanh(a[2 * hs + j] + r * b[2 * hs + j]);
                next[j] = (1 - z) * nn + z * h[j];
                break;
              }
              case RnnKind::Lstm: {
                const double ig = sigmoid(a[j] + b[j]), fg = sigmoid(a[hs + j] + b[hs + j]),
                             cg = std::tanh(a[2 * hs + j] + b[2 * hs + j]),
                             og = sigmoid(a[3 * hs + j] + b[3 * hs + j]);
                c[j] = fg * c[j] + ig * cg;
                next[j] = og * std::tanh(c[j]);
                break;
              }
            }
          }
          h = next;
          for (int64_t j = 0; j < hs; ++j) out[(i * steps + t) * hd + dir * hs + j] = h[j];
        }
        for (int64_t j = 0; j < hs; ++j) {
          ref.h_n[(slot * n + i) * hs + j] = h[j];
          ref.c_n[(slot * n + i) * hs + j] = c[j];
        }
      }
    }
    if (l + 1 < o.num_layers && !masks.empty())
      for (size_t k = 0; k < out.size(); ++k) out[k] *= masks[l][k];
    if (l + 1 == o.num_layers) ref.y = out;
    in = out;
    in_size = hd;
  }
  if (o.kind != RnnKind::Lstm) ref.c_n.clear();
  return ref;
}

double loss(const Reference& ref, const Vec& r) {
  double s = 0;
  for (size_t i = 0; i < r.size(); ++i) s += ref.y[i] * r[i];
  return s;
}

// d loss / d v[i] for every i, by central differences of the reference (float64: h = 1e-6 leaves errors
// near 1e-9, far inside the tolerance).
Vec numeric_gradient(Vec& v, const std::function<double()>& f) {
  constexpr double h = 1e-6;
  Vec grad(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const double v0 = v[i];
    v[i] = v0 + h;
    const double plus = f();
    v[i] = v0 - h;
    const double minus = f();
    v[i] = v0;
    grad[i] = (plus - minus) / (2 * h);
  }
  return grad;
}

// The masks recurrent.h promises: layer l's output at batch-first (n, t, j) is kept when
// uniform_at(seed, l * N*T*H*D + (n * T + t) * H*D + j) <= 1 - p, in float as the kernels compare.
std::vector<Vec> philox_masks(const RnnOptions& o, int64_t n, int64_t t, uint64_t seed) {
  const int64_t per_layer = n * t * o.hidden_size * o.directions();
  const float keep = 1.0f - o.dropout, scale = 1.0f / keep;
  std::vector<Vec> masks;
  for (int64_t l = 0; l + 1 < o.num_layers; ++l) {
    Vec m(static_cast<size_t>(per_layer));
    for (int64_t i = 0; i < per_layer; ++i)
      m[i] = philox::uniform_at(seed, static_cast<uint64_t>(l * per_layer + i), 0.0f, 1.0f) <= keep ? scale
                                                                                                    : 0.0f;
    masks.push_back(m);
  }
  return masks;
}

// Every output and gradient of gpunodes against the reference (gradients by central differences).
void check_against_reference(Runtime& rt, Device d, Problem p, const char* what, uint64_t seed = 0) {
  const std::vector<Vec> masks = p.o.dropout > 0 ? philox_masks(p.o, p.n, p.t, seed) : std::vector<Vec>{};
  const Outputs got = run_gpunodes(rt, d, p, true, seed);
  const Reference ref = reference(p.o, p.n, p.t, p.x, p.w, p.h0, p.c0, masks);
  EXPECT_MATCHES(got.y, ref.y, QString(what) + " y");
  EXPECT_MATCHES(got.h_n, ref.h_n, QString(what) + " h_n");
  if (p.o.kind == RnnKind::Lstm) EXPECT_MATCHES(got.c_n, ref.c_n, QString(what) + " c_n");
  auto f = [&] { return loss(reference(p.o, p.n, p.t, p.x, p.w, p.h0, p.c0, masks), p.r); };
  const std::vector<RnnParam> params = rnn_params(p.o);
  for (size_t i = 0; i < params.size(); ++i)
    EXPECT_MATCHES(got.dw[i], numeric_gradient(p.w[i], f), QString(what) + " d" + params[i].name.c_str());
  EXPECT_MATCHES(got.dx, numeric_gradient(p.x, f), QString(what) + " dx");
}

// --- the torch cases ------------------------------------------------------------------------------------

struct TorchCase {
  QString name;
  Problem problem;
};

std::vector<TorchCase> torch_cases() {
  std::vector<TorchCase> cases;
  uint32_t seed = 1;
  const std::pair<RnnKind, const char*> kinds[] = {{RnnKind::RnnTanh, "rnn_tanh"},
                                                   {RnnKind::RnnRelu, "rnn_relu"},
                                                   {RnnKind::Gru, "gru"},
                                                   {RnnKind::Lstm, "lstm"}};
  for (const auto& [kind, name] : kinds) {
    const QString k(name);
    for (int64_t layers : {1, 2})
      for (bool bidirectional : {false, true})
        cases.push_back({QString("%1 %2 layer%3%4")
                             .arg(k)
                             .arg(layers)
                             .arg(layers > 1 ? "s" : "")
                             .arg(bidirectional ? " bidirectional" : ""),
                         make_problem(options(kind, 4, 6, layers, bidirectional), 3, 5, false, seed++)});
    cases.push_back(
        {k + " without bias", make_problem(options(kind, 4, 6, 2, true, false), 3, 5, false, seed++)});
    cases.push_back(
        {k + " from a given state", make_problem(options(kind, 4, 6, 2, true), 3, 5, true, seed++)});
  }
  cases.push_back({"gru one step", make_problem(options(RnnKind::Gru, 5, 7, 2, true), 2, 1, true, seed++)});
  cases.push_back(
      {"lstm one step", make_problem(options(RnnKind::Lstm, 5, 7, 1, false), 2, 1, true, seed++)});
  // Wide enough for the CPU's parallel gate loops (N * H >= 2048).
  cases.push_back({"gru wide", make_problem(options(RnnKind::Gru, 12, 128, 2, true), 16, 6, true, seed++)});
  cases.push_back(
      {"lstm wide", make_problem(options(RnnKind::Lstm, 12, 128, 1, false), 16, 5, false, seed++)});
  return cases;
}

void write_floats(const QString& path, const Vec& v) {
  const std::vector<float> f = to_f(v);
  std::ofstream out(path.toStdString(), std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(f.data()), static_cast<std::streamsize>(f.size() * sizeof(float)));
}

Vec read_doubles(const QString& path) {
  std::ifstream in(path.toStdString(), std::ios::binary);
  std::vector<char> b((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  Vec v(b.size() / sizeof(double));
  std::memcpy(v.data(), b.data(), v.size() * sizeof(double));
  return v;
}

}  // namespace

class NnRecurrentTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;
  Device device_ = Device::cpu();
  QTemporaryDir dir_;
  std::vector<TorchCase> cases_;
  QString torch_skip_;       // why the torch rows skip; empty when the peer ran
  QString torch_error_;      // why the peer failed, which fails those rows
  QJsonArray torch_params_;  // per case: the module's state_dict names and shapes

  QString path(const QString& name) const { return dir_.filePath(name); }

  // Runs the peer once for every case (importing torch takes seconds).
  void run_torch_peer() {
    if (!QFile::exists(GN_PYTHON)) {
      torch_skip_ = GN_PYTHON " is missing: install python3-torch to compare with PyTorch";
      return;
    }
    QJsonArray jobs;
    for (size_t c = 0; c < cases_.size(); ++c) {
      const Problem& p = cases_[c].problem;
      const QString tag = QString::number(c);
      Vec flat;
      for (const Vec& w : p.w) flat.insert(flat.end(), w.begin(), w.end());
      write_floats(path(tag + "_x.f32"), p.x);
      write_floats(path(tag + "_w.f32"), flat);
      write_floats(path(tag + "_r.f32"), p.r);
      if (!p.h0.empty()) write_floats(path(tag + "_h0.f32"), p.h0);
      if (!p.c0.empty()) write_floats(path(tag + "_c0.f32"), p.c0);
      jobs.append(QJsonObject{{"mode", rnn_kind_name(p.o.kind)},
                              {"input_size", double(p.o.input_size)},
                              {"hidden_size", double(p.o.hidden_size)},
                              {"num_layers", double(p.o.num_layers)},
                              {"bidirectional", p.o.bidirectional},
                              {"bias", p.o.bias},
                              {"n", double(p.n)},
                              {"t", double(p.t)},
                              {"x", path(tag + "_x.f32")},
                              {"weights", path(tag + "_w.f32")},
                              {"h0", p.h0.empty() ? QJsonValue() : QJsonValue(path(tag + "_h0.f32"))},
                              {"c0", p.c0.empty() ? QJsonValue() : QJsonValue(path(tag + "_c0.f32"))},
                              {"r", path(tag + "_r.f32")},
                              {"out", path(tag + "_out.f64")}});
    }
    QFile jf(path("jobs.json"));
    if (!jf.open(QIODevice::WriteOnly)) {
      torch_error_ = "cannot write " + jf.fileName();
      return;
    }
    jf.write(QJsonDocument(jobs).toJson());
    jf.close();
    QProcess py;
    py.start(GN_PYTHON, {GN_TORCH_RNN_PEER, jf.fileName()});
    if (!py.waitForStarted(30000) || !py.waitForFinished(300000)) {
      torch_error_ = "the torch peer did not run: " + py.errorString();
      return;
    }
    const QString err = QString::fromUtf8(py.readAllStandardError()).trimmed();
    if (py.exitStatus() == QProcess::NormalExit && py.exitCode() == 3) {
      torch_skip_ = GN_PYTHON " cannot import torch (apt-get install python3-torch): " + err;
      return;
    }
    if (py.exitStatus() != QProcess::NormalExit || py.exitCode() != 0) {
      torch_error_ = "the torch peer failed: " + err;
      return;
    }
    const QJsonObject answer = QJsonDocument::fromJson(py.readAllStandardOutput().trimmed()).object();
    qInfo("torch %s", qPrintable(answer["torch"].toString()));
    torch_params_ = answer["cases"].toArray();
  }

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>(RuntimeOptions{.cpu_devices = 2});
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("recurrent layers on %s", device_.str().c_str());
    QVERIFY(dir_.isValid());
    cases_ = torch_cases();
    run_torch_peer();
  }
  void cleanupTestCase() { rt_.reset(); }

  void matches_torch_data() {
    QTest::addColumn<int>("index");
    for (size_t c = 0; c < cases_.size(); ++c)
      QTest::newRow(qPrintable(cases_[c].name)) << static_cast<int>(c);
  }
  void matches_torch() {
    QFETCH(int, index);
    if (!torch_skip_.isEmpty()) QSKIP(qPrintable(torch_skip_));
    QVERIFY2(torch_error_.isEmpty(), qPrintable(torch_error_));
    const Problem& p = cases_[static_cast<size_t>(index)].problem;
    // gpunodes' parameter names and shapes are the module's state_dict.
    const QJsonObject torch_case = torch_params_[index].toObject();
    const std::vector<RnnParam> params = rnn_params(p.o);
    QCOMPARE(torch_case["names"].toArray().size(), static_cast<qsizetype>(params.size()));
    for (size_t i = 0; i < params.size(); ++i) {
      QCOMPARE(torch_case["names"].toArray()[i].toString(), QString::fromStdString(params[i].name));
      QJsonArray shape;
      for (int64_t dim : params[i].shape) shape.append(double(dim));
      QCOMPARE(torch_case["shapes"].toArray()[i].toArray(), shape);
    }

    const Outputs got = run_gpunodes(*rt_, device_, p);
    const Vec want = read_doubles(path(QString::number(index) + "_out.f64"));
    size_t at = 0;
    auto next = [&](size_t count) {
      const Vec part(want.begin() + at, want.begin() + std::min(want.size(), at + count));
      at += count;
      return part;
    };
    EXPECT_MATCHES(got.y, next(got.y.size()), "y");
    EXPECT_MATCHES(got.h_n, next(got.h_n.size()), "h_n");
    if (p.o.kind == RnnKind::Lstm) EXPECT_MATCHES(got.c_n, next(got.c_n.size()), "c_n");
    for (size_t i = 0; i < params.size(); ++i)
      EXPECT_MATCHES(got.dw[i], next(got.dw[i].size()),
                     qPrintable("d" + QString::fromStdString(params[i].name)));
    EXPECT_MATCHES(got.dx, next(got.dx.size()), "dx");
    QCOMPARE(at, want.size());
  }

  // --- without torch --------------------------------------------------------------------------------------

  void parameters_follow_pytorch_state_dict() {
    const std::vector<RnnParam> params = rnn_params(options(RnnKind::Lstm, 3, 5, 2, true));
    const char* names[] = {
        "weight_ih_l0",         "weight_hh_l0",         "bias_ih_l0",         "bias_hh_l0",
        "weight_ih_l0_reverse", "weight_hh_l0_reverse", "bias_ih_l0_reverse", "bias_hh_l0_reverse",
        "weight_ih_l1",         "weight_hh_l1",         "bias_ih_l1",         "bias_hh_l1",
        "weight_ih_l1_reverse", "weight_hh_l1_reverse", "bias_ih_l1_reverse", "bias_hh_l1_reverse"};
    QCOMPARE(params.size(), std::size(names));
    for (size_t i = 0; i < params.size(); ++i) {
      QCOMPARE(QString::fromStdString(params[i].name), QString(names[i]));
      QCOMPARE(params[i].fan_in, int64_t{5});
    }
    QCOMPARE(params[0].shape, (Shape{20, 3}));
    QCOMPARE(params[1].shape, (Shape{20, 5}));
    QCOMPARE(params[2].shape, (Shape{20}));
    QCOMPARE(params[8].shape, (Shape{20, 10}));  // layer 1 reads both directions
    QCOMPARE(rnn_params(options(RnnKind::Gru, 3, 5, 1, false, false)).size(), size_t{2});
    QCOMPARE(rnn_gate_count(RnnKind::RnnTanh), 1);
    QCOMPARE(rnn_gate_count(RnnKind::RnnRelu), 1);
    QCOMPARE(rnn_gate_count(RnnKind::Gru), 3);
    QCOMPARE(rnn_gate_count(RnnKind::Lstm), 4);
  }

  void matches_float64_reference_data() {
    QTest::addColumn<int>("kind");
    QTest::addColumn<int>("layers");
    QTest::addColumn<bool>("bidirectional");
    QTest::addColumn<bool>("bias");
    QTest::addColumn<bool>("initial_state");
    QTest::newRow("gru 2 layers bidirectional from a state")
        << int(RnnKind::Gru) << 2 << true << true << true;
    QTest::newRow("gru 1 layer, no bias") << int(RnnKind::Gru) << 1 << false << false << false;
    QTest::newRow("lstm 2 layers bidirectional from a state")
        << int(RnnKind::Lstm) << 2 << true << true << true;
    QTest::newRow("lstm 1 layer, no bias") << int(RnnKind::Lstm) << 1 << false << false << false;
    QTest::newRow("rnn tanh 2 layers bidirectional") << int(RnnKind::RnnTanh) << 2 << true << true << true;
  }
  void matches_float64_reference() {
    QFETCH(int, kind);
    QFETCH(int, layers);
    QFETCH(bool, bidirectional);
    QFETCH(bool, bias);
    QFETCH(bool, initial_state);
    const RnnOptions o = options(static_cast<RnnKind>(kind), 3, 4, layers, bidirectional, bias);
    check_against_reference(*rt_, device_, make_problem(o, 2, 4, initial_state, 11), QTest::currentDataTag());
  }

  void dropout_masks_follow_philox() {
    // Three layers: two dropout masks, each from its own stretch of the Philox stream.
    const RnnOptions o = options(RnnKind::Gru, 3, 4, 3, true, true, 0.4f);
    check_against_reference(*rt_, device_, make_problem(o, 2, 4, true, 12), "gru with dropout", 77);
  }

  void dropout_repeats_for_a_seed_and_only_in_training() {
    const RnnOptions o = options(RnnKind::Lstm, 5, 8, 2, false, true, 0.5f);
    const Problem p = make_problem(o, 4, 6, false, 13);
    const Outputs a = run_gpunodes(*rt_, device_, p, true, 5), b = run_gpunodes(*rt_, device_, p, true, 5);
    QVERIFY(a.y == b.y);
    QVERIFY(a.dw == b.dw);
    QVERIFY(run_gpunodes(*rt_, device_, p, true, 6).y != a.y);
    const Outputs eval = run_gpunodes(*rt_, device_, p, false);
    QVERIFY(eval.y != a.y);
    // Without dropout, training and evaluation compute the same outputs.
    Problem plain = p;
    plain.o.dropout = 0;
    QVERIFY(run_gpunodes(*rt_, device_, plain, true, 5).y == run_gpunodes(*rt_, device_, plain, false).y);
    // A single layer has no output that dropout applies to.
    Problem single = make_problem(options(RnnKind::Gru, 5, 8, 1, false, true, 0.5f), 4, 6, false, 14);
    QVERIFY(run_gpunodes(*rt_, device_, single, true, 5).y == run_gpunodes(*rt_, device_, single, false).y);
  }

  void final_state_is_the_last_step() {
    const RnnOptions o = options(RnnKind::Gru, 3, 4, 1, true);
    const Problem p = make_problem(o, 2, 5, false, 15);
    const Outputs got = run_gpunodes(*rt_, device_, p, false);
    const int64_t h = 4, hd = 8;
    for (int64_t i = 0; i < p.n; ++i)
      for (int64_t j = 0; j < h; ++j) {
        // The forward direction ends at t = T-1, the reverse one at t = 0.
        QCOMPARE(got.h_n[i * h + j], got.y[(i * p.t + p.t - 1) * hd + j]);
        QCOMPARE(got.h_n[(p.n + i) * h + j], got.y[(i * p.t + 0) * hd + h + j]);
      }
  }

  void backward_without_dx() {
    const RnnOptions o = options(RnnKind::Lstm, 3, 4, 2, false);
    const Problem p = make_problem(o, 2, 3, false, 16);
    const Tensor x = make(*rt_, device_, {2, 3, 3}, p.x);
    const std::vector<Tensor> w = weight_tensors(*rt_, device_, p);
    const RnnResult f = rnn_forward(o, x, w, Tensor(), Tensor(), true, 0);
    const RnnGrads g = rnn_backward(o, f, x, w, make(*rt_, device_, f.y.shape(), p.r), false);
    QVERIFY(!g.dx.defined());
    const Outputs full = run_gpunodes(*rt_, device_, p);
    for (size_t i = 0; i < g.dweights.size(); ++i) QVERIFY(to_host(g.dweights[i]) == full.dw[i]);
  }

  // A backward holds little beyond what its forward kept: the gate gradients overwrite the saved gates and
  // the top layer reads dy where it lies, so the peak above the forward's live set is the gradients it
  // returns, dx's time-major copy, one hidden layer's output gradient and the carried state. Before, the
  // gate gradients (and the GRU's recurrent ones, and a time-major dy) came on top: 1.6-1.9x the live set.
  void backward_memory_stays_near_the_forward() {
    for (RnnKind kind : {RnnKind::Gru, RnnKind::Lstm}) {
      const RnnOptions o = options(kind, 16, 32, 2, true);
      const int64_t n = 8, t = 20;
      const Problem p = make_problem(o, n, t, false, 23);
      const Tensor x = make(*rt_, device_, {n, t, 16}, p.x);
      const std::vector<Tensor> w = weight_tensors(*rt_, device_, p);
      const RnnResult f = rnn_forward(o, x, w, Tensor(), Tensor(), true, 0);
      const Tensor dy = make(*rt_, device_, f.y.shape(), p.r);
      rt_->engine().wait_all();
      const int64_t live = rt_->memory_stats(device_).allocated_bytes.current;
      rt_->reset_peak_memory();
      {
        const RnnGrads g = rnn_backward(o, f, x, w, dy, true);
        rt_->engine().wait_all();
      }
      int64_t returned = 0;
      for (const Tensor& wt : w) returned += wt.bytes();  // the weight gradients
      const int64_t hd = 2 * 32, floats = 2 * n * t * 16 + t * n * hd + 2 * n * 32;  // dx twice, d_hidden, dh dc
      const int64_t bound = returned + 4 * floats + 32 * 1024;  // and the allocator's rounding
      const int64_t extra = rt_->memory_stats(device_).allocated_bytes.peak - live;
      QVERIFY2(extra <= bound, qPrintable(QString("%1: %2 bytes above the live set, bound %3")
                                              .arg(rnn_kind_name(kind)).arg(extra).arg(bound)));
    }
  }

  void empty_batch() {
    const RnnOptions o = options(RnnKind::Gru, 3, 4, 2, true);
    const Problem p = make_problem(o, 0, 3, false, 17);
    const Outputs got = run_gpunodes(*rt_, device_, p);
    QVERIFY(got.y.empty());
    QVERIFY(got.dx.empty());
    for (const std::vector<float>& dw : got.dw)
      QVERIFY(std::all_of(dw.begin(), dw.end(), [](float v) { return v == 0.0f; }));
  }

  void shape_errors() {
    const RnnOptions o = options(RnnKind::Gru, 3, 4, 2, true);
    const Problem p = make_problem(o, 2, 3, false, 18);
    const Tensor x = make(*rt_, device_, {2, 3, 3}, p.x);
    const std::vector<Tensor> w = weight_tensors(*rt_, device_, p);
    auto forward = [&](const Tensor& input, const std::vector<Tensor>& weights, const Tensor& h0 = Tensor(),
                       const Tensor& c0 = Tensor()) { rnn_forward(o, input, weights, h0, c0, false, 0); };
    QVERIFY_THROWS_EXCEPTION(ShapeError, forward(zeros(*rt_, {6, 3}, device_), w));
    expect_error([&] { forward(zeros(*rt_, {6, 3}, device_), w); }, {"input", "[N, T, 3]", "[6, 3]"});
    expect_error([&] { forward(zeros(*rt_, {2, 3, 5}, device_), w); }, {"input", "[2, 3, 5]"});
    expect_error([&] { forward(zeros(*rt_, {2, 0, 3}, device_), w); }, {"time step"});
    std::vector<Tensor> wrong = w;
    wrong[5] = zeros(*rt_, {12, 5}, device_);  // weight_hh_l0_reverse is [12, 4]
    QVERIFY_THROWS_EXCEPTION(ShapeError, forward(x, wrong));
    expect_error([&] { forward(x, wrong); }, {"weight_hh_l0_reverse", "[12, 4]", "[12, 5]"});
    expect_error([&] { forward(x, {w.begin(), w.end() - 1}); }, {"expected 16 weights", "got 15"});
    expect_error([&] { forward(x, w, zeros(*rt_, {2, 2, 4}, device_)); }, {"h0", "[4, 2, 4]"});
    expect_error([&] { forward(x, w, Tensor(), zeros(*rt_, {4, 2, 4}, device_)); }, {"c0", "LSTM"});
    expect_error([&] { rnn_params(options(RnnKind::Gru, 3, 0, 1, false)); }, {"hidden_size"});
    expect_error([&] { rnn_params(options(RnnKind::Gru, 3, 4, 1, false, true, 1.0f)); }, {"dropout"});

    const RnnResult eval = rnn_forward(o, x, w, Tensor(), Tensor(), false, 0);
    const Tensor dy = zeros(*rt_, {2, 3, 8}, device_);
    expect_error([&] { rnn_backward(o, eval, x, w, dy, true); }, {"not a training forward"});
    const RnnResult train = rnn_forward(o, x, w, Tensor(), Tensor(), true, 0);
    expect_error(
        [&] {
          rnn_backward(o, train, x, w, zeros(*rt_, {2, 3, 4}, device_), true);
        },
        {"output gradient", "[2, 3, 8]"});
    RnnOptions other = o;
    other.bidirectional = false;
    expect_error([&] { rnn_backward(other, train, x, {w.begin(), w.begin() + 8}, dy, true); }, {"options"});
    // A backward turns the forward's saved gates into its gradients: a second one is refused, not wrong.
    (void)rnn_backward(o, train, x, w, dy, true);
    expect_error([&] { rnn_backward(o, train, x, w, dy, true); }, {"already taken by a backward"});
  }

  void device_mismatch() {
    const RnnOptions o = options(RnnKind::Lstm, 3, 4, 1, false);
    const Problem p = make_problem(o, 2, 3, false, 19);
    const Device other = device_.is_cuda() ? Device::cpu() : Device::cpu(1);
    const Tensor x = make(*rt_, device_, {2, 3, 3}, p.x);
    std::vector<Tensor> w = weight_tensors(*rt_, device_, p);
    w[1] = to(w[1], other);
    try {
      rnn_forward(o, x, w, Tensor(), Tensor(), false, 0);
      QFAIL("expected DeviceMismatchError");
    } catch (const DeviceMismatchError& e) {
      QVERIFY2(QString(e.what()).contains("Expected all tensors to be on the same device"), e.what());
    }
    const std::vector<Tensor> same = weight_tensors(*rt_, device_, p);
    QVERIFY_THROWS_EXCEPTION(DeviceMismatchError,
                             rnn_forward(o, x, same, zeros(*rt_, {1, 2, 4}, other), Tensor(), false, 0));
    const RnnResult f = rnn_forward(o, x, same, Tensor(), Tensor(), true, 0);
    QVERIFY_THROWS_EXCEPTION(DeviceMismatchError,
                             rnn_backward(o, f, x, same, zeros(*rt_, {2, 3, 4}, other), true));
  }
};

QTEST_GUILESS_MAIN(NnRecurrentTest)
#include "test_nn_recurrent.moc"
