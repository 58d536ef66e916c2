// The attention ops (attention_layers.h) against naive float64 loops written here: bmm in every transpose
// with alpha and its gradients, the masked softmax (causal, valid lengths per sample with several heads) and
// its backward, layer norm with and without affine, the head split and merge against torch's
// x.view(N, T, h, d).transpose(1, 2), the broadcasts over the batch, the class token and the slices of a fused
// weight; their errors. The drawn attention layers' shape inference, errors and canonical text; drawn
// transformers end to end through Model: a causal language model, cross-attention, a ViT-like network, each
// with every parameter gradient against finite differences, multi-head attention against a float64 forward,
// the attention weights it keeps, dropout's determinism, and attention weights that cannot fit the device.
// GN_TEST_DEVICE=cuda:0 runs the device checks on CUDA instead (skipped without a GPU).
#include <QtTest>
#include <cmath>
#include <functional>
#include <limits>

#include "gpunodes/errors.h"
#include "gpunodes/nn/attention_layers.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/nn/sequence_data.h"
#include "gpunodes/nn/sequence_layers.h"
#include "gpunodes/ops.h"
#include "gpunodes/runtime.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

using Doubles = std::vector<double>;

// Deterministic values in [-scale, scale), exact in float.
std::vector<float> values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = scale * (static_cast<float>((s >> 40) & 0xFFFFFF) / float(1 << 23) - 1.0f);
  }
  return v;
}

// Every value within tol * (1 + |want|); says the first that is not.
bool near(const std::vector<float>& got, const Doubles& want, double tol, const QByteArray& what) {
  if (got.size() != want.size()) {
    qWarning("%s: %zu values, want %zu", what.constData(), got.size(), want.size());
    return false;
  }
  for (size_t i = 0; i < got.size(); ++i)
    if (!(std::fabs(double(got[i]) - want[i]) <= tol * (1 + std::fabs(want[i])))) {
      qWarning("%s[%zu]: got %.9g, want %.9g", what.constData(), i, double(got[i]), want[i]);
      return false;
    }
  return true;
}

Doubles widen(const std::vector<float>& v) {
  return Doubles(v.begin(), v.end());
}


// --- float64 references ----------------------------------------------------------------------------------

struct BmmRef {
  int64_t batch, m, n, k;
  bool ta, tb;
  double alpha;
  // op(a)[i, kk] and op(b)[kk, j] of matrix bi, from their stored layouts.
  double a_at(const std::vector<float>& a, int64_t bi, int64_t i, int64_t kk) const {
    return ta ? a[static_cast<size_t>((bi * k + kk) * m + i)] : a[static_cast<size_t>((bi * m + i) * k + kk)];
  }
  double b_at(const std::vector<float>& b, int64_t bi, int64_t kk, int64_t j) const {
    return tb ? b[static_cast<size_t>((bi * n + j) * k + kk)] : b[static_cast<size_t>((bi * k + kk) * n + j)];
  }
  Doubles c(const std::vector<float>& a, const std::vector<float>& b) const {
    Doubles out(static_cast<size_t>(batch * m * n));
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t kk = 0; kk < k; ++kk) s += a_at(a, bi, i, kk) * b_at(b, bi, kk, j);
          out[static_cast<size_t>((bi * m + i) * n + j)] = alpha * s;
        }
    return out;
  }
  // dL/da and dL/db in a's and b's stored layouts.
  Doubles da(const std::vector<float>& b, const std::vector<float>& dc) const {
    Doubles out(static_cast<size_t>(batch * m * k));
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t kk = 0; kk < k; ++kk) {
          double s = 0;
          for (int64_t j = 0; j < n; ++j) s += dc[static_cast<size_t>((bi * m + i) * n + j)] * b_at(b, bi, kk, j);
          out[static_cast<size_t>(ta ? (bi * k + kk) * m + i : (bi * m + i) * k + kk)] = alpha * s;
        }
    return out;
  }
  Doubles db(const std::vector<float>& a, const std::vector<float>& dc) const {
    Doubles out(static_cast<size_t>(batch * k * n));
    for (int64_t bi = 0; bi < batch; ++bi)
      for (int64_t kk = 0; kk < k; ++kk)
        for (int64_t j = 0; j < n; ++j) {
          double s = 0;
          for (int64_t i = 0; i < m; ++i) s += a_at(a, bi, i, kk) * dc[static_cast<size_t>((bi * m + i) * n + j)];
          out[static_cast<size_t>(tb ? (bi * n + j) * k + kk : (bi * k + kk) * n + j)] = alpha * s;
        }
    return out;
  }
};

// d2l's masked softmax over x [batch, rows, cols]: column j of row i takes part when (causal) j <= i + cols -
// rows and (lengths) j < the sample's length; a row with none is all zeros.
Doubles ref_masked_softmax(const std::vector<float>& x, int64_t batch, int64_t heads, int64_t rows, int64_t cols,
                           bool causal, const std::vector<float>* lens) {
  Doubles y(x.size(), 0.0);
  for (int64_t b = 0; b < batch; ++b)
    for (int64_t i = 0; i < rows; ++i) {
      const size_t row = static_cast<size_t>((b * rows + i) * cols);
      auto kept = [&](int64_t j) {
        return (!causal || j <= i + cols - rows) &&
               (!lens || double(j) < double((*lens)[static_cast<size_t>(b / heads)]));
      };
      double mx = -INFINITY, sum = 0;
      for (int64_t j = 0; j < cols; ++j)
        if (kept(j)) mx = std::max(mx, double(x[row + j]));
      for (int64_t j = 0; j < cols; ++j)
        if (kept(j)) sum += std::exp(double(x[row + j]) - mx);
      for (int64_t j = 0; j < cols; ++j)
        if (kept(j)) y[row + j] = std::exp(double(x[row + j]) - mx) / sum;
    }
  return y;
}

struct LayerNormRef {
  Doubles y, mean, rstd, dx, dgamma, dbeta;
};
LayerNormRef ref_layer_norm(const std::vector<float>& x, const std::vector<float>& dy, const std::vector<float>* gamma,
                            const std::vector<float>* beta, int64_t rows, int64_t cols, double eps) {
  LayerNormRef r;
  r.y.resize(x.size());
  r.dx.resize(x.size());
  r.dgamma.assign(static_cast<size_t>(cols), 0.0);
  r.dbeta.assign(static_cast<size_t>(cols), 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const size_t o = static_cast<size_t>(i * cols);
    double mu = 0, var = 0;
    for (int64_t j = 0; j < cols; ++j) mu += x[o + j];
    mu /= double(cols);
    for (int64_t j = 0; j < cols; ++j) var += (x[o + j] - mu) * (x[o + j] - mu);
    var /= double(cols);
    const double rs = 1 / std::sqrt(var + eps);
    r.mean.push_back(mu);
    r.rstd.push_back(rs);
    double mg = 0, mgx = 0;
    for (int64_t j = 0; j < cols; ++j) {
      const double xhat = (x[o + j] - mu) * rs, g = dy[o + j] * (gamma ? double((*gamma)[j]) : 1.0);
      r.y[o + j] = gamma ? xhat * (*gamma)[j] + (*beta)[j] : xhat;
      mg += g / double(cols), mgx += g * xhat / double(cols);
      r.dgamma[j] += dy[o + j] * xhat;
      r.dbeta[j] += dy[o + j];
    }
    for (int64_t j = 0; j < cols; ++j) {
      const double xhat = (x[o + j] - mu) * rs, g = dy[o + j] * (gamma ? double((*gamma)[j]) : 1.0);
      r.dx[o + j] = rs * (g - mg - xhat * mgx);
    }
  }
  return r;
}

// nn.MultiheadAttention's forward (batch_first) in float64: q [N, Tq, E], k and v [N, Tk, E]; weights [N, h, Tq,
// Tk] (per head, not averaged). in_b and out_b may be empty (bias=False).
struct MhaRef {
  Doubles y, weights;
};
MhaRef ref_mha(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int64_t n,
               int64_t tq, int64_t tk, int64_t e, int64_t heads, bool causal, const std::vector<float>& in_w,
               const std::vector<float>& in_b, const std::vector<float>& out_w, const std::vector<float>& out_b) {
  auto project = [&](const std::vector<float>& x, int64_t t, int64_t part) {
    Doubles p(static_cast<size_t>(n * t * e));
    for (int64_t r = 0; r < n * t; ++r)
      for (int64_t o = 0; o < e; ++o) {
        double s = in_b.empty() ? 0 : in_b[static_cast<size_t>(part * e + o)];
        for (int64_t i = 0; i < e; ++i)
          s += double(x[static_cast<size_t>(r * e + i)]) * in_w[static_cast<size_t>((part * e + o) * e + i)];
        p[static_cast<size_t>(r * e + o)] = s;
      }
    return p;
  };
  const Doubles pq = project(q, tq, 0), pk = project(k, tk, 1), pv = project(v, tk, 2);
  const int64_t d = e / heads;
  MhaRef r;
  r.weights.assign(static_cast<size_t>(n * heads * tq * tk), 0.0);
  Doubles merged(static_cast<size_t>(n * tq * e), 0.0);
  for (int64_t s = 0; s < n; ++s)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < tq; ++i) {
        Doubles score(static_cast<size_t>(tk));
        double mx = -INFINITY;
        for (int64_t j = 0; j < tk; ++j) {
          double dot = 0;
          for (int64_t c = 0; c < d; ++c)
            dot += pq[static_cast<size_t>((s * tq + i) * e + h * d + c)] * pk[static_cast<size_t>((s * tk + j) * e + h * d + c)];
          score[j] = dot / std::sqrt(double(d));
          if (!causal || j <= i + tk - tq) mx = std::max(mx, score[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < tk; ++j)
          if (!causal || j <= i + tk - tq) sum += std::exp(score[j] - mx);
        double* w = r.weights.data() + ((s * heads + h) * tq + i) * tk;
        for (int64_t j = 0; j < tk; ++j) w[j] = !causal || j <= i + tk - tq ? std::exp(score[j] - mx) / sum : 0.0;
        for (int64_t c = 0; c < d; ++c) {
          double acc = 0;
          for (int64_t j = 0; j < tk; ++j) acc += w[j] * pv[static_cast<size_t>((s * tk + j) * e + h * d + c)];
          merged[static_cast<size_t>((s * tq + i) * e + h * d + c)] = acc;
        }
      }
  r.y.resize(merged.size());
  for (int64_t row = 0; row < n * tq; ++row)
    for (int64_t o = 0; o < e; ++o) {
      double acc = out_b.empty() ? 0 : out_b[static_cast<size_t>(o)];
      for (int64_t i = 0; i < e; ++i)
        acc += merged[static_cast<size_t>(row * e + i)] * out_w[static_cast<size_t>(o * e + i)];
      r.y[static_cast<size_t>(row * e + o)] = acc;
    }
  return r;
}

std::vector<std::string> parameter_names(const Model& m) {
  std::vector<std::string> names;
  for (const ParameterInfo& p : m.describe()) names.push_back(p.name);
  return names;
}

Parameter* parameter(Model& m, const std::string& name) {
  for (Parameter* p : m.parameters())
    if (p->name == name) return p;
  return nullptr;
}

}  // namespace

class AttentionLayersTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;
  Device device_ = Device::cpu();

  Tensor dev(const Shape& s, const std::vector<float>& v) { return from_values(*rt_, s, device_, v); }

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>(RuntimeOptions{});
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("attention layers on %s", device_.str().c_str());
  }
  void cleanupTestCase() { rt_.reset(); }

  // --- ops ------------------------------------------------------------------------------------------------

  void bmm_in_every_transpose_with_alpha_and_its_gradients() {
    const int64_t batch = 3, m = 4, n = 5, k = 6;
    const float alpha = 0.7f;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const BmmRef ref{batch, m, n, k, ta, tb, alpha};
        const Shape as = ta ? Shape{batch, k, m} : Shape{batch, m, k};
        const Shape bs = tb ? Shape{batch, n, k} : Shape{batch, k, n};
        const std::vector<float> a = values(batch * m * k, 1 + ta), b = values(batch * k * n, 3 + tb);
        const std::vector<float> dc = values(batch * m * n, 7, 0.5f);
        const Tensor at = dev(as, a), bt = dev(bs, b);
        const BmmOptions o{ta, tb, alpha};
        const QByteArray what = QByteArray("bmm trans_a=") + (ta ? "1" : "0") + " trans_b=" + (tb ? "1" : "0");
        const Tensor c = bmm(at, bt, o);
        QCOMPARE(c.shape(), (Shape{batch, m, n}));
        QVERIFY2(near(to_host(c), ref.c(a, b), 1e-5, what), what.constData());
        const BmmGrads g = bmm_backward(at, bt, dev({batch, m, n}, dc), o, true, true);
        QCOMPARE(g.da.shape(), as);
        QCOMPARE(g.db.shape(), bs);
        QVERIFY2(near(to_host(g.da), ref.da(b, dc), 1e-5, what + " da"), what.constData());
        QVERIFY2(near(to_host(g.db), ref.db(a, dc), 1e-5, what + " db"), what.constData());
        // Only what is asked for.
        const BmmGrads only_a = bmm_backward(at, bt, dev({batch, m, n}, dc), o, true, false);
        QVERIFY(only_a.da.defined() && !only_a.db.defined());
        const BmmGrads only_b = bmm_backward(at, bt, dev({batch, m, n}, dc), o, false, true);
        QVERIFY(!only_b.da.defined() && only_b.db.defined());
        QVERIFY2(near(to_host(only_b.db), ref.db(a, dc), 1e-5, what + " db alone"), what.constData());
      }
    // A batch large enough for the CPU's batch-parallel path.
    const int64_t big = 40;
    const BmmRef ref{big, 3, 2, 5, false, true, 0.5};
    const std::vector<float> a = values(big * 15, 11), b = values(big * 10, 12);
    QVERIFY(near(to_host(bmm(dev({big, 3, 5}, a), dev({big, 2, 5}, b), {false, true, 0.5f})), ref.c(a, b), 1e-5,
                 "bmm batch 40"));
  }

  void bmm_mismatches_name_both_sides() {
    expect_error([&] { bmm(zeros(*rt_, {2, 3, 4}, device_), zeros(*rt_, {2, 5, 6}, device_)); },
                 {"[2, 3, 4]", "[2, 5, 6]", "columns 4", "rows 5"});
    expect_error([&] { bmm(zeros(*rt_, {2, 3, 4}, device_), zeros(*rt_, {3, 4, 6}, device_)); },
                 {"[2, 3, 4]", "[3, 4, 6]", "batches differ"});
    expect_error([&] { bmm(zeros(*rt_, {2, 3, 4}, device_), zeros(*rt_, {2, 6, 5}, device_), {false, true, 1}); },
                 {"[2, 3, 4]", "[2, 6, 5] (transposed)", "columns 4", "rows 5"});
    expect_error([&] { bmm(zeros(*rt_, {2, 4, 3}, device_), zeros(*rt_, {2, 4, 6}, device_), {true, true, 1}); },
                 {"[2, 4, 3] (transposed)", "[2, 4, 6] (transposed)"});
    expect_error([&] { bmm(zeros(*rt_, {3, 4}, device_), zeros(*rt_, {2, 4, 6}, device_)); },
                 {"[batch, rows, columns]", "[3, 4]"});
  }

  void masked_softmax_causal_square_and_with_more_keys() {
    const int64_t shapes[][2] = {{5, 5}, {3, 6}, {1, 4}};
    for (const auto& shape : shapes) {
      const int64_t rows = shape[0], cols = shape[1], batch = 4;
      const std::vector<float> x = values(batch * rows * cols, rows * 10 + cols, 3.0f);
      const Doubles want = ref_masked_softmax(x, batch, 2, rows, cols, true, nullptr);
      const std::vector<float> got = to_host(masked_softmax(dev({batch, rows, cols}, x), {true, Tensor(), 2}));
      const QByteArray what = "causal " + QByteArray::number(rows) + "x" + QByteArray::number(cols);
      QVERIFY2(near(got, want, 2e-6, what), what.constData());
      // The future is exactly zero: key j > i + (cols - rows), keys aligned to the end.
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = i + cols - rows + 1; j < cols; ++j)
            QCOMPARE(got[static_cast<size_t>((b * rows + i) * cols + j)], 0.0f);
    }
    // Without a mask: a plain softmax of every row, also of large scores.
    std::vector<float> x = values(2 * 3 * 7, 5, 40.0f);
    QVERIFY(near(to_host(masked_softmax(dev({2, 3, 7}, x))), ref_masked_softmax(x, 2, 1, 3, 7, false, nullptr), 1e-6,
                 "softmax"));
  }

  void masked_softmax_with_valid_lengths_per_sample_and_heads() {
    // Four samples of three heads: length 2 keeps columns 0 and 1, 0 none (an all-zero row), 2.5 columns 0..2
    // (j < 2.5), 9 (past the end) all; then negative and fractional below one.
    const int64_t heads = 3, rows = 3, cols = 5;
    for (const std::vector<float>& lens : {std::vector<float>{2, 0, 2.5f, 9}, std::vector<float>{-1, 0.25f, 5, 4.999f}}) {
      const int64_t samples = static_cast<int64_t>(lens.size()), batch = samples * heads;
      const std::vector<float> x = values(batch * rows * cols, 21, 2.0f);
      for (bool causal : {false, true}) {
        const std::vector<float> got =
            to_host(masked_softmax(dev({batch, rows, cols}, x), {causal, dev({samples}, lens), heads}));
        const Doubles want = ref_masked_softmax(x, batch, heads, rows, cols, causal, &lens);
        QVERIFY2(near(got, want, 2e-6, causal ? "valid lengths, causal" : "valid lengths"), "valid lengths");
        for (size_t i = 0; i < got.size(); ++i)
          if (want[i] == 0) QCOMPARE(got[i], 0.0f);
      }
    }
    // Length 0: every head of that sample is all zeros.
    const std::vector<float> got = to_host(
        masked_softmax(dev({2 * heads, rows, cols}, values(2 * heads * rows * cols, 4)), {false, dev({2}, {3, 0}), heads}));
    for (size_t i = heads * rows * cols; i < got.size(); ++i) QCOMPARE(got[i], 0.0f);
  }

  void softmax_backward_is_y_times_dy_minus_its_dot() {
    const int64_t batch = 4, rows = 3, cols = 6;
    const std::vector<float> x = values(batch * rows * cols, 31, 2.0f), dy = values(batch * rows * cols, 32);
    const std::vector<float> lens{3, 1.5f};
    for (bool masked : {false, true}) {
      const Tensor y = masked_softmax(dev({batch, rows, cols}, x),
                                      masked ? AttentionMask{true, dev({2}, lens), 2} : AttentionMask{});
      const std::vector<float> yv = to_host(y);
      Doubles want(yv.size());
      for (int64_t r = 0; r < batch * rows; ++r) {
        double dot = 0;
        for (int64_t j = 0; j < cols; ++j) dot += double(dy[r * cols + j]) * yv[r * cols + j];
        for (int64_t j = 0; j < cols; ++j) want[r * cols + j] = yv[r * cols + j] * (dy[r * cols + j] - dot);
      }
      const std::vector<float> got = to_host(softmax_backward(y, dev({batch, rows, cols}, dy)));
      QVERIFY(near(got, want, 1e-6, "softmax backward"));
      for (size_t i = 0; i < got.size(); ++i)
        if (yv[i] == 0) QCOMPARE(got[i], 0.0f);  // masked entries get no gradient
    }
    // And against a central difference of sum(w * softmax(x)), unmasked, in float64 on the reference.
    const std::vector<float> w = values(cols, 33);
    const std::vector<float> one = values(cols, 34);
    const Tensor y1 = masked_softmax(dev({1, 1, cols}, one));
    const std::vector<float> dx = to_host(softmax_backward(y1, dev({1, 1, cols}, w)));
    for (int64_t j = 0; j < cols; ++j) {
      std::vector<float> up = one, down = one;
      up[j] += 1e-2f, down[j] -= 1e-2f;
      const Doubles yu = ref_masked_softmax(up, 1, 1, 1, cols, false, nullptr);
      const Doubles yd = ref_masked_softmax(down, 1, 1, 1, cols, false, nullptr);
      double fu = 0, fd = 0;
      for (int64_t i = 0; i < cols; ++i) fu += w[i] * yu[i], fd += w[i] * yd[i];
      const double numeric = (fu - fd) / (double(up[j]) - double(down[j]));
      QVERIFY2(std::fabs(numeric - dx[j]) < 1e-4, qPrintable(QString("dx[%1] %2 vs %3").arg(j).arg(dx[j]).arg(numeric)));
    }
  }

  void masked_softmax_errors_name_both_sides() {
    expect_error([&] { masked_softmax(zeros(*rt_, {2, 4, 3}, device_), {true, Tensor(), 1}); },
                 {"causal", "4 queries", "3 keys"});
    expect_error([&] { masked_softmax(zeros(*rt_, {4, 2, 3}, device_), {false, zeros(*rt_, {4}, device_), 2}); },
                 {"valid lengths", "[2]", "[4]"});
    expect_error([&] { masked_softmax(zeros(*rt_, {4, 2, 3}, device_), {false, zeros(*rt_, {2, 1}, device_), 2}); },
                 {"valid lengths", "[2]", "[2, 1]"});
    expect_error([&] { masked_softmax(zeros(*rt_, {3, 2, 3}, device_), {false, Tensor(), 2}); },
                 {"3 score matrices", "2 heads"});
    expect_error([&] { softmax_backward(zeros(*rt_, {3, 2, 3}, device_), zeros(*rt_, {3, 3, 2}, device_)); },
                 {"[3, 2, 3]", "[3, 3, 2]"});
  }

  void layer_norm_forward_and_backward_with_and_without_affine() {
    const int64_t n = 2, t = 3, e = 7, rows = n * t;
    std::vector<float> x = values(rows * e, 41, 2.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] += 3.0f + float(i % e == 0) * 4.0f;  // an offset mean
    const std::vector<float> dy = values(rows * e, 42), gamma = values(e, 43, 1.5f), beta = values(e, 44);
    const float eps = 1e-3f;
    for (bool affine : {true, false}) {
      const LayerNormRef ref = ref_layer_norm(x, dy, affine ? &gamma : nullptr, affine ? &beta : nullptr, rows, e, eps);
      const Tensor xt = dev({n, t, e}, x);
      const Tensor gt = affine ? dev({e}, gamma) : Tensor(), bt = affine ? dev({e}, beta) : Tensor();
      const LayerNormResult r = layer_norm(xt, gt, bt, eps);
      QCOMPARE(r.y.shape(), (Shape{n, t, e}));
      QCOMPARE(r.mean.shape(), (Shape{rows}));
      QVERIFY(near(to_host(r.y), ref.y, 1e-5, "layer norm y"));
      QVERIFY(near(to_host(r.mean), ref.mean, 1e-6, "layer norm mean"));
      QVERIFY(near(to_host(r.rstd), ref.rstd, 1e-5, "layer norm rstd"));
      const LayerNormGrads g = layer_norm_backward(xt, dev({n, t, e}, dy), gt, r, true);
      QVERIFY(near(to_host(g.dx), ref.dx, 1e-4, "layer norm dx"));
      QCOMPARE(g.dgamma.defined(), affine);
      QCOMPARE(g.dbeta.defined(), affine);
      if (affine) {
        QVERIFY(near(to_host(g.dgamma), ref.dgamma, 1e-5, "layer norm dgamma"));
        QVERIFY(near(to_host(g.dbeta), ref.dbeta, 1e-6, "layer norm dbeta"));
      }
      const LayerNormGrads no_dx = layer_norm_backward(xt, dev({n, t, e}, dy), gt, r, false);
      QVERIFY(!no_dx.dx.defined());
      if (affine) QVERIFY(near(to_host(no_dx.dgamma), ref.dgamma, 1e-5, "layer norm dgamma without dx"));
    }
    // Many rows: the CPU's parallel path.
    const std::vector<float> wide = values(512 * 96, 45);
    const std::vector<float> g96 = values(96, 46), b96 = values(96, 47);
    const LayerNormRef ref96 = ref_layer_norm(wide, wide, &g96, &b96, 512, 96, 1e-5);
    const LayerNormResult r = layer_norm(dev({512, 96}, wide), dev({96}, g96), dev({96}, b96), 1e-5f);
    QVERIFY(near(to_host(r.y), ref96.y, 1e-5, "layer norm 512x96"));
    const LayerNormGrads g = layer_norm_backward(dev({512, 96}, wide), dev({512, 96}, wide), dev({96}, g96), r, true);
    QVERIFY(near(to_host(g.dx), ref96.dx, 1e-4, "layer norm 512x96 dx"));
    QVERIFY(near(to_host(g.dgamma), ref96.dgamma, 1e-5, "layer norm 512x96 dgamma"));

    expect_error([&] { layer_norm(zeros(*rt_, {2, 3}, device_), zeros(*rt_, {3}, device_), Tensor(), 1e-5f); },
                 {"weight and bias"});
    expect_error([&] { layer_norm(zeros(*rt_, {2, 3}, device_), zeros(*rt_, {4}, device_), zeros(*rt_, {4}, device_), 1e-5f); },
                 {"weight", "[3]", "[4]"});
    expect_error([&] { layer_norm(zeros(*rt_, {2, 3}, device_), Tensor(), Tensor(), 0.0f); }, {"eps"});
  }

  void heads_split_and_merge_as_torch_views_them() {
    const int64_t n = 2, t = 3, groups = 3, heads = 2, d = 4, e = heads * d;
    const std::vector<float> x = values(n * t * groups * e, 51);
    const std::vector<Tensor> parts = split_heads(dev({n, t, groups * e}, x), groups, heads);
    QCOMPARE(parts.size(), size_t(groups));
    for (int64_t g = 0; g < groups; ++g) {
      QCOMPARE(parts[g].shape(), (Shape{n * heads, t, d}));
      // torch: q, k, v = x.chunk(3, -1); part.view(N, T, h, d).transpose(1, 2).reshape(N * h, T, d).
      Doubles want(static_cast<size_t>(n * heads * t * d));
      for (int64_t s = 0; s < n; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t step = 0; step < t; ++step)
            for (int64_t c = 0; c < d; ++c)
              want[static_cast<size_t>(((s * heads + h) * t + step) * d + c)] =
                  x[static_cast<size_t>((s * t + step) * groups * e + g * e + h * d + c)];
      QCOMPARE(to_host(parts[g]), std::vector<float>(want.begin(), want.end()));
    }
    // The round trip gives x back exactly; one part merges to [N, T, h * d].
    QCOMPARE(to_host(merge_heads(parts, heads)), x);
    const Tensor one = merge_heads({parts[1]}, heads);
    QCOMPARE(one.shape(), (Shape{n, t, e}));
    const std::vector<float> got = to_host(one);
    for (int64_t r = 0; r < n * t; ++r)
      for (int64_t c = 0; c < e; ++c)
        QCOMPARE(got[static_cast<size_t>(r * e + c)], x[static_cast<size_t>(r * groups * e + e + c)]);
    expect_error([&] { split_heads(zeros(*rt_, {2, 3, 10}, device_), 3, 2); }, {"width 10", "3 parts", "2 equal heads"});
    expect_error([&] { merge_heads({zeros(*rt_, {3, 2, 2}, device_)}, 2); }, {"3 matrices", "2 heads"});
    expect_error([&] { merge_heads({zeros(*rt_, {4, 2, 2}, device_), zeros(*rt_, {4, 3, 2}, device_)}, 2); },
                 {"[4, 2, 2]", "[4, 3, 2]"});
  }

  void broadcasts_over_the_batch_and_their_gradients() {
    // add_per_sample with a table longer than a sample: its first values.
    const int64_t n = 3, t = 4, e = 5, tmax = 7;
    const std::vector<float> x = values(n * t * e, 61), table = values(tmax * e, 62);
    Doubles want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = double(x[i]) + table[i % (t * e)];
    QVERIFY(near(to_host(add_per_sample(dev({n, t, e}, x), dev({tmax, e}, table))), want, 1e-6, "add_per_sample"));
    expect_error([&] { add_per_sample(zeros(*rt_, {n, t, e}, device_), zeros(*rt_, {3, e}, device_)); },
                 {"[3, 5]", "20 values", "[3, 4, 5]"});

    // sum_over_batch writes the batch sum into the first values and zeros after them, even into memory that
    // held something (a block of the same size just freed).
    const Shape big{4096, e};
    {
      const Tensor dirty = full(*rt_, big, device_, 7.0f);
      to_host(dirty);
    }
    const std::vector<float> dy = values(n * t * e, 63);
    const std::vector<float> sums = to_host(sum_over_batch(dev({n, t, e}, dy), big));
    QCOMPARE(sums.size(), size_t(4096 * e));
    for (size_t i = 0; i < sums.size(); ++i) {
      double s = 0;
      if (i < size_t(t * e))
        for (int64_t b = 0; b < n; ++b) s += dy[b * t * e + i];
      if (!(std::fabs(sums[i] - s) <= 1e-6)) QFAIL(qPrintable(QString("sum_over_batch[%1]: %2, want %3").arg(i).arg(sums[i]).arg(s)));
    }
    expect_error([&] { sum_over_batch(zeros(*rt_, {n, t, e}, device_), {3, e}); }, {"[3, 4, 5]", "[3, 5]"});

    // prepend_token and its backward.
    const std::vector<float> token = values(e, 64);
    const Tensor y = prepend_token(dev({n, t, e}, x), dev({1, e}, token));
    QCOMPARE(y.shape(), (Shape{n, t + 1, e}));
    Doubles pre;
    for (int64_t s = 0; s < n; ++s) {
      pre.insert(pre.end(), token.begin(), token.end());
      pre.insert(pre.end(), x.begin() + s * t * e, x.begin() + (s + 1) * t * e);
    }
    QCOMPARE(to_host(y), std::vector<float>(pre.begin(), pre.end()));
    const std::vector<float> dyp = values(n * (t + 1) * e, 65);
    const PrependGrads g = prepend_token_backward(dev({n, t + 1, e}, dyp), {1, e}, true);
    QCOMPARE(g.dtoken.shape(), (Shape{1, e}));
    QCOMPARE(g.dx.shape(), (Shape{n, t, e}));
    Doubles dtoken(static_cast<size_t>(e), 0.0), dx;
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t j = 0; j < e; ++j) dtoken[j] += dyp[s * (t + 1) * e + j];
      dx.insert(dx.end(), dyp.begin() + s * (t + 1) * e + e, dyp.begin() + (s + 1) * (t + 1) * e);
    }
    QVERIFY(near(to_host(g.dtoken), dtoken, 1e-6, "prepend dtoken"));
    QCOMPARE(to_host(g.dx), std::vector<float>(dx.begin(), dx.end()));
    const PrependGrads token_only = prepend_token_backward(dev({n, t + 1, e}, dyp), {e}, false);
    QVERIFY(!token_only.dx.defined());
    QCOMPARE(token_only.dtoken.shape(), (Shape{e}));
    QVERIFY(near(to_host(token_only.dtoken), dtoken, 1e-6, "prepend dtoken alone"));
    expect_error([&] { prepend_token(zeros(*rt_, {n, t, e}, device_), zeros(*rt_, {1, e + 1}, device_)); },
                 {"[1, 6]", "[3, 4, 5]"});
  }

  void linear_part_uses_and_writes_only_its_rows() {
    const int64_t n = 2, t = 3, in = 5, out = 4, parts = 3;
    const std::vector<float> x = values(n * t * in, 71), w = values(parts * out * in, 72), b = values(parts * out, 73);
    const std::vector<float> dy = values(n * t * out, 74);
    for (bool bias : {true, false})
      for (int64_t part = 0; part < parts; ++part) {
        const Tensor xt = dev({n, t, in}, x), wt = dev({parts * out, in}, w);
        const Tensor y = linear_part(xt, wt, bias ? dev({parts * out}, b) : Tensor(), part, parts);
        QCOMPARE(y.shape(), (Shape{n, t, out}));
        Doubles want(static_cast<size_t>(n * t * out));
        for (int64_t r = 0; r < n * t; ++r)
          for (int64_t o = 0; o < out; ++o) {
            double s = bias ? b[part * out + o] : 0;
            for (int64_t i = 0; i < in; ++i) s += double(x[r * in + i]) * w[(part * out + o) * in + i];
            want[r * out + o] = s;
          }
        QVERIFY(near(to_host(y), want, 1e-5, "linear_part"));

        // Backward into gradients that hold 9 everywhere: only the part's rows change.
        const Tensor dw = full(*rt_, {parts * out, in}, device_, 9.0f), db = full(*rt_, {parts * out}, device_, 9.0f);
        const Tensor dx = linear_part_backward(xt, wt, dev({n, t, out}, dy), part, parts, dw, bias ? db : Tensor(), true);
        Doubles want_dw(w.size(), 9.0), want_db(b.size(), 9.0), want_dx(x.size(), 0.0);
        for (int64_t o = 0; o < out; ++o) {
          double sb = 0;
          for (int64_t r = 0; r < n * t; ++r) sb += dy[r * out + o];
          if (bias) want_db[part * out + o] = sb;
          for (int64_t i = 0; i < in; ++i) {
            double s = 0;
            for (int64_t r = 0; r < n * t; ++r) s += double(dy[r * out + o]) * x[r * in + i];
            want_dw[(part * out + o) * in + i] = s;
          }
        }
        for (int64_t r = 0; r < n * t; ++r)
          for (int64_t i = 0; i < in; ++i)
            for (int64_t o = 0; o < out; ++o) want_dx[r * in + i] += double(dy[r * out + o]) * w[(part * out + o) * in + i];
        QCOMPARE(dx.shape(), (Shape{n, t, in}));
        QVERIFY(near(to_host(dx), want_dx, 1e-5, "linear_part dx"));
        QVERIFY(near(to_host(dw), want_dw, 1e-5, "linear_part dw"));
        QVERIFY(near(to_host(db), want_db, 1e-5, "linear_part db"));
        QVERIFY(!linear_part_backward(xt, wt, dev({n, t, out}, dy), part, parts, dw, Tensor(), false).defined());
      }
    expect_error([&] { linear_part(zeros(*rt_, {2, 5}, device_), zeros(*rt_, {12, 5}, device_), Tensor(), 3, 3); },
                 {"[12, 5]", "3 stacked", "part 3"});
    expect_error([&] { linear_part(zeros(*rt_, {2, 4}, device_), zeros(*rt_, {12, 5}, device_), Tensor(), 0, 3); },
                 {"[2, 4]", "[12, 5]", "expects 5"});
  }

  // --- layers: inference, errors, text ------------------------------------------------------------------------

  void attention_layers_infer_shapes_and_counts() {
    auto mha = [](int64_t heads, bool bias = true, bool causal = false) {
      return spec(LayerKind::MultiheadAttention, [=](LayerSpec& l) { l.heads = heads, l.bias = bias, l.causal = causal; });
    };
    const LayerInfo self = infer_layer(mha(2), {{5, 8}});
    QCOMPARE(self.out, (Shape{5, 8}));
    QCOMPARE(self.params, 4.0 * 8 * 8 + 4 * 8);  // in_proj [3E, E] + [3E], out_proj [E, E] + [E]
    QVERIFY(self.flops > 0);
    QCOMPARE(infer_layer(mha(2, false), {{5, 8}}).params, 4.0 * 8 * 8);
    QCOMPARE(infer_layer(mha(4), {{3, 8}, {7, 8}}).out, (Shape{3, 8}));
    QCOMPARE(infer_layer(mha(1, true, true), {{3, 8}, {7, 8}, {7, 8}}).out, (Shape{3, 8}));
    const LayerInfo ln = infer_layer(spec(LayerKind::LayerNorm), {{5, 8}});
    QCOMPARE(ln.out, (Shape{5, 8}));
    QCOMPARE(ln.params, 16.0);
    QCOMPARE(infer_layer(spec(LayerKind::LayerNorm, [](LayerSpec& l) { l.affine = false; }), {{5, 8}}).params, 0.0);
    // nn.LayerNorm(W) normalises the last axis of any rank.
    QCOMPARE(infer_layer(spec(LayerKind::LayerNorm), {{3, 4, 6}}).params, 12.0);
    QCOMPARE(infer_layer(spec(LayerKind::BatchMatMul), {{3, 4}, {4, 5}}).out, (Shape{3, 5}));
    QCOMPARE(infer_layer(spec(LayerKind::BatchMatMul, [](LayerSpec& l) { l.transpose_b = true; }), {{3, 4}, {6, 4}}).out,
             (Shape{3, 6}));
    QCOMPARE(infer_layer(spec(LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; }), {{3, 5}}).out, (Shape{3, 5}));
    QCOMPARE(infer_layer(spec(LayerKind::Softmax), {{7}}).out, (Shape{7}));
    QCOMPARE(infer_layer(spec(LayerKind::Mul), {{3, 5}, {3, 5}}).out, (Shape{3, 5}));
    QCOMPARE(infer_layer(spec(LayerKind::Scale, [](LayerSpec& l) { l.scale = 0.5; }), {{3, 5}}).out, (Shape{3, 5}));
    QCOMPARE(infer_layer(spec(LayerKind::PositionalEncoding), {{1000, 6}}).params, 0.0);
    const LayerInfo pos = infer_layer(spec(LayerKind::PositionEmbedding), {{5, 6}});
    QCOMPARE(pos.params, 30.0);
    const LayerInfo cls = infer_layer(spec(LayerKind::ClassToken), {{4, 6}});
    QCOMPARE(cls.out, (Shape{5, 6}));
    QCOMPARE(cls.params, 6.0);
    QCOMPARE(infer_layer(spec(LayerKind::FirstStep), {{5, 6}}).out, (Shape{6}));
    QCOMPARE(layer_ports(LayerKind::MultiheadAttention), (std::vector<std::string>{"q", "k", "v"}));
    QCOMPARE(layer_required_ports(LayerKind::MultiheadAttention), 1);
    QCOMPARE(layer_ports(LayerKind::BatchMatMul), (std::vector<std::string>{"a", "b"}));
    QCOMPARE(layer_required_ports(LayerKind::Mul), 2);
    for (const char* name : {"LayerNorm", "MultiheadAttention", "BatchMatMul", "Softmax", "Mul", "Scale",
                             "PositionalEncoding", "PositionEmbedding", "ClassToken", "FirstStep"}) {
      const auto kind = parse_layer_kind(name);
      QVERIFY2(kind.has_value(), name);
      QCOMPARE(QString(layer_kind_name(*kind)), QString(name));
    }
  }

  void attention_layer_mismatches_name_both_sides() {
    auto mha = [](const std::function<void(LayerSpec&)>& set = {}) {
      return spec(LayerKind::MultiheadAttention, [=](LayerSpec& l) {
        l.heads = 2;
        if (set) set(l);
      });
    };
    expect_layer_error([&] { infer_layer(mha([](LayerSpec& l) { l.heads = 3; }), {{5, 8}}); }, "",
                       {"num_heads=3", "8", "5x8"});
    expect_layer_error([&] { infer_layer(mha([](LayerSpec& l) { l.heads = 0; }), {{5, 8}}); }, "", {"num_heads"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {6, 4}}); }, "k", {"q is 5x8", "k is 6x4"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {6, 8}, {6, 4}}); }, "v", {"q is 5x8", "v is 6x4"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {6, 8}, {7, 8}}); }, "v", {"k is 6x8", "v is 7x8"});
    expect_layer_error([&] { infer_layer(mha([](LayerSpec& l) { l.causal = true; }), {{5, 8}, {4, 8}}); }, "k",
                       {"causal", "q is 5x8", "k is 4x8"});
    expect_layer_error([&] { infer_layer(mha(), {{40}}); }, "q", {"[T, E]", "q", "40"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {1, 6, 8}}); }, "k", {"[T, E]", "1x6x8"});
    expect_layer_error([&] { infer_layer(mha([](LayerSpec& l) { l.dropout = 1; }), {{5, 8}}); }, "", {"dropout"});
    expect_layer_error([&] { infer_layer(mha(), {}); }, "", {"1 to 3 inputs", "got 0"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {5, 8}, {5, 8}, {5, 8}}); }, "", {"1 to 3 inputs", "got 4"});

    expect_layer_error([] { infer_layer(spec(LayerKind::LayerNorm, [](LayerSpec& l) { l.eps = 0; }), {{5, 8}}); }, "",
                       {"eps"});
    // LayerNorm(normalized_shape) must name the last axis of its input.
    expect_layer_error([] { infer_layer(spec(LayerKind::LayerNorm, [](LayerSpec& l) { l.features = 5; }), {{4, 8}}); },
                       "in", {"normalized_shape is 5", "4x8"});
    QCOMPARE(infer_layer(spec(LayerKind::LayerNorm, [](LayerSpec& l) { l.features = 8; }), {{4, 8}}).params, 16.0);
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding), {{40}}); }, "in",
                       {"PositionalEncoding", "[T, F]", "40"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding), {{1, 4, 6}}); }, "in",
                       {"PositionalEncoding", "[T, F]", "1x4x6"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding), {{4, 7}}); }, "in", {"even", "4x7"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding, [](LayerSpec& l) { l.max_len = 3; }),
                                        {{4, 6}}); },
                       "in", {"max_len=3", "4x6", "has 4"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding, [](LayerSpec& l) { l.dropout = -0.1; }),
                                        {{4, 6}}); },
                       "", {"dropout"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionEmbedding), {{24}}); }, "in", {"[T, F]", "24"});
    expect_layer_error([] { infer_layer(spec(LayerKind::ClassToken), {{2, 3, 4}}); }, "in", {"ClassToken", "2x3x4"});
    expect_layer_error([] { infer_layer(spec(LayerKind::FirstStep), {{6}}); }, "in", {"FirstStep", "[T, F]"});

    expect_layer_error([] { infer_layer(spec(LayerKind::BatchMatMul), {{3, 4}, {5, 6}}); }, "b",
                       {"a 3x4", "4 columns", "b 5x6", "5 rows"});
    expect_layer_error([] { infer_layer(spec(LayerKind::BatchMatMul, [](LayerSpec& l) { l.transpose_b = true; }),
                                        {{3, 4}, {4, 5}}); },
                       "b", {"a 3x4", "b 4x5 transposed", "5 rows"});
    expect_layer_error([] { infer_layer(spec(LayerKind::BatchMatMul), {{12}, {4, 5}}); }, "a", {"a is 12", "b is 4x5"});
    expect_layer_error([] { infer_layer(spec(LayerKind::BatchMatMul), {{3, 4}, {2, 4, 5}}); }, "b",
                       {"a is 3x4", "b is 2x4x5"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; }), {{5, 3}}); },
                       "in", {"causal", "5x3"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; }), {{2, 3, 4}}); },
                       "in", {"causal", "2x3x4"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Mul), {{3, 5}, {5, 3}}); }, "b", {"a is 3x5", "b is 5x3"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Scale, [](LayerSpec& l) { l.scale = INFINITY; }), {{3}}); }, "",
                       {"scale"});
  }

  void the_text_of_an_attention_network_round_trips() {
    Net n;
    const int x = n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {4, 6}; });
    const int pe = n.add("pe", LayerKind::PositionalEncoding, [](LayerSpec& l) { l.dropout = 0.2, l.max_len = 64; });
    const int ln = n.add("ln", LayerKind::LayerNorm, [](LayerSpec& l) { l.features = 6, l.eps = 1e-6, l.affine = false; });
    const int kv = n.add("kv", LayerKind::Scale, [](LayerSpec& l) { l.scale = 0.375; }, {x});
    const int mha = n.add("mha", LayerKind::MultiheadAttention,
                          [](LayerSpec& l) { l.heads = 3, l.dropout = 0.125, l.bias = false, l.causal = true; },
                          {ln, kv, pe});
    const int scores = n.add("scores", LayerKind::BatchMatMul, [](LayerSpec& l) { l.transpose_b = true; }, {mha, ln});
    const int sm = n.add("sm", LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; });
    const int ctx = n.add("ctx", LayerKind::BatchMatMul, {}, {n.last(), kv});
    n.add("mul", LayerKind::Mul, {}, {ctx, pe});
    n.add("cls", LayerKind::ClassToken);
    n.add("pos", LayerKind::PositionEmbedding);
    n.add("first", LayerKind::FirstStep);
    (void)scores;
    const std::string text = n.spec.text();
    for (const char* want : {"normalized_shape=6", "eps=", "elementwise_affine=0", "num_heads=3", "dropout=0.125", "bias=0", "causal=1",
                             "transpose_b=1", "scale=0.375", "dropout=0.2", "max_len=64", "<-ln,kv,pe"})
      QVERIFY2(text.find(want) != std::string::npos, qPrintable(QString("%1 not in %2").arg(want).arg(text.c_str())));
    const NetworkSpec back = NetworkSpec::parse(text);
    QCOMPARE(back.text(), text);
    QCOMPARE(back.layers.size(), n.spec.layers.size());
    const LayerSpec& m = back.layers[static_cast<size_t>(mha)];
    QCOMPARE(m.heads, int64_t(3));
    QCOMPARE(m.dropout, 0.125);
    QVERIFY(!m.bias && m.causal);
    QCOMPARE(m.inputs, (std::vector<int>{ln, kv, pe}));
    QCOMPARE(back.layers[static_cast<size_t>(ln)].eps, 1e-6);
    QCOMPARE(back.layers[static_cast<size_t>(ln)].features, int64_t(6));
    QVERIFY(!back.layers[static_cast<size_t>(ln)].affine);
    QCOMPARE(back.layers[static_cast<size_t>(pe)].max_len, int64_t(64));
    QCOMPARE(back.layers[static_cast<size_t>(pe)].dropout, 0.2);
    QVERIFY(back.layers[static_cast<size_t>(scores)].transpose_b);
    QCOMPARE(back.layers[static_cast<size_t>(kv)].scale, 0.375);
    QVERIFY(back.layers[static_cast<size_t>(sm)].causal);
    const std::vector<LayerInfo> infos = back.infer();
    QCOMPARE(infos[static_cast<size_t>(scores)].out, (Shape{4, 4}));
    QCOMPARE(infos[static_cast<size_t>(n.last()) - 2].out, (Shape{5, 6}));
    QCOMPARE(infos.back().out, (Shape{6}));

    // Four inputs for the three ports of MultiheadAttention, or none, do not parse; nor do wrong shapes.
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=2)<-x,x,x,x"); },
                 {"m", "4 inputs"});
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=2)"); },
                 {"m", "0 inputs"});
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=4)<-x"); },
                 {"num_heads=4", "6"});
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:Mul()<-x"); }, {"m", "1 inputs"});
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:LayerNorm(elementwise_affine=1,heads=2)<-x"); },
                 {"heads"});
  }

  // --- drawn networks through Model ---------------------------------------------------------------------------

  void multihead_attention_equals_a_float64_forward() {
    // Self-attention (q only) and cross-attention with its own k and v, with Tq < Tk and causal keys aligned to
    // the end; with and without bias. The weights kept are the first sample's, per head.
    const int64_t n = 2, t = 4, e = 6;
    for (bool cross : {false, true})
      for (bool causal : {false, true})
        for (bool bias : {true, false}) {
          const int64_t heads = cross ? 2 : 3, tk = cross ? 2 * t : t;
          Net net;
          const int x = net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, e}; });
          std::vector<int> ports{x};
          if (cross) {
            const int s = net.add("s", LayerKind::Scale, [](LayerSpec& l) { l.scale = 0.5; });
            const int k = net.add("k", LayerKind::Concat, {}, {x, s});
            const int v = net.add("v", LayerKind::Scale, [](LayerSpec& l) { l.scale = -1.5; });
            ports = {x, k, v};
          }
          net.add("mha", LayerKind::MultiheadAttention,
                  [&](LayerSpec& l) { l.heads = heads, l.causal = causal, l.bias = bias; }, ports);
          auto m = Model::create(*rt_, networkOptions(net.spec, 9), device_);
          QVERIFY(m->attention_weights().empty());
          std::vector<std::string> names{"mha.in_proj_weight", "mha.in_proj_bias", "mha.out_proj.weight",
                                         "mha.out_proj.bias"};
          if (!bias) names = {"mha.in_proj_weight", "mha.out_proj.weight"};
          QCOMPARE(parameter_names(*m), names);
          QCOMPARE(parameter(*m, "mha.in_proj_weight")->value.shape(), (Shape{3 * e, e}));
          std::vector<float> in_b, out_b;
          if (bias) {  // nonzero biases, so that they are checked too
            write_values(parameter(*m, "mha.in_proj_bias")->value, values(3 * e, 81));
            write_values(parameter(*m, "mha.out_proj.bias")->value, values(e, 82));
            in_b = to_host(parameter(*m, "mha.in_proj_bias")->value);
            out_b = to_host(parameter(*m, "mha.out_proj.bias")->value);
          }
          const std::vector<float> xv = values(n * t * e, 83, 1.5f);
          std::vector<float> kv = xv, vv = xv;
          if (cross) {
            kv.clear();
            for (int64_t s = 0; s < n; ++s) {
              kv.insert(kv.end(), xv.begin() + s * t * e, xv.begin() + (s + 1) * t * e);
              for (int64_t i = 0; i < t * e; ++i) kv.push_back(0.5f * xv[s * t * e + i]);
            }
            vv.clear();
            for (float f : kv) vv.push_back(-1.5f * f);
          }
          const MhaRef ref = ref_mha(xv, kv, vv, n, t, tk, e, heads, causal,
                                     to_host(parameter(*m, "mha.in_proj_weight")->value), in_b,
                                     to_host(parameter(*m, "mha.out_proj.weight")->value), out_b);
          const QByteArray what = QByteArray(cross ? "cross" : "self") + (causal ? " causal" : "") + (bias ? "" : " no bias");
          const Tensor y = m->forward(dev({n, t, e}, xv), Mode::Eval);
          QCOMPARE(y.shape(), (Shape{n, t, e}));
          QVERIFY2(near(to_host(y), ref.y, 1e-5, what), what.constData());
          const auto weights = m->attention_weights();
          QCOMPARE(weights.size(), size_t(1));
          QCOMPARE(QString::fromStdString(weights[0].first), QString("mha"));
          QCOMPARE(weights[0].second.shape(), (Shape{heads, t, tk}));
          const Doubles first(ref.weights.begin(), ref.weights.begin() + heads * t * tk);
          QVERIFY2(near(to_host(weights[0].second), first, 1e-5, what + " weights"), what.constData());
        }
  }

  void a_tiny_causal_transformer_trains_end_to_end() {
    // Embedding -> PositionalEncoding -> causal self-attention -> Add -> LayerNorm -> feed-forward -> Add ->
    // LayerNorm -> Linear: scores per step.
    const int64_t t = 5, vocab = 7, e = 8;
    Net n;
    n.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t}; });
    n.add("emb", LayerKind::Embedding, [&](LayerSpec& l) { l.vocab = vocab, l.features = e; });
    const int pe = n.add("pe", LayerKind::PositionalEncoding);
    const int mha = n.add("mha", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2, l.causal = true; });
    n.add("add1", LayerKind::Add, {}, {pe, mha});
    const int ln1 = n.add("ln1", LayerKind::LayerNorm);
    n.add("ffn1", LayerKind::Linear, [](LayerSpec& l) { l.features = 12; });
    n.add("relu", LayerKind::ReLU);
    const int ffn2 = n.add("ffn2", LayerKind::Linear, [&](LayerSpec& l) { l.features = e; });
    n.add("add2", LayerKind::Add, {}, {ln1, ffn2});
    n.add("ln2", LayerKind::LayerNorm, [](LayerSpec& l) { l.eps = 1e-3; });
    n.add("out", LayerKind::Linear, [&](LayerSpec& l) { l.features = vocab; });
    QCOMPARE(n.spec.infer().back().out, (Shape{t, vocab}));
    auto m = Model::create(*rt_, networkOptions(n.spec, 4), device_);
    QCOMPARE(parameter_names(*m),
             (std::vector<std::string>{"emb.weight", "mha.in_proj_weight", "mha.in_proj_bias", "mha.out_proj.weight",
                                       "mha.out_proj.bias", "ln1.weight", "ln1.bias", "ffn1.weight", "ffn1.bias",
                                       "ffn2.weight", "ffn2.bias", "ln2.weight", "ln2.bias", "out.weight",
                                       "out.bias"}));
    const std::vector<float> ids{1, 2, 3, 4, 5, 6, 0, 2, 4, 6, 3, 3, 1, 1, 0};
    const Tensor x = dev({3, t}, ids);
    const std::vector<float> whole = to_host(m->forward(x, Mode::Eval));
    QCOMPARE(whole.size(), size_t(3 * t * vocab));
    // Causal: a later token changes no earlier step, and a prefix gives the same first steps.
    std::vector<float> changed = ids;
    changed[4] = 0, changed[9] = 1;  // the last step of samples 0 and 1
    const std::vector<float> other = to_host(m->forward(dev({3, t}, changed), Mode::Eval));
    for (int64_t s = 0; s < 3; ++s)
      for (int64_t i = 0; i < (t - 1) * vocab; ++i)
        QVERIFY(std::fabs(other[s * t * vocab + i] - whole[s * t * vocab + i]) < 1e-5);
    QVERIFY(std::fabs(other[(t - 1) * vocab] - whole[(t - 1) * vocab]) > 1e-6);
    const std::vector<float> prefix = to_host(m->forward(dev({1, 3}, {1, 2, 3}), Mode::Eval));
    QCOMPARE(prefix.size(), size_t(3 * vocab));
    for (size_t i = 0; i < prefix.size(); ++i) QVERIFY(std::fabs(prefix[i] - whole[i]) < 1e-5);

    // The weights after an Eval forward: [heads, T, T] of the first sample, rows summing to 1, no future.
    to_host(m->forward(x, Mode::Eval));
    const auto weights = m->attention_weights();
    QCOMPARE(weights.size(), size_t(1));
    QCOMPARE(QString::fromStdString(weights[0].first), QString("mha"));
    QCOMPARE(weights[0].second.shape(), (Shape{2, t, t}));
    const std::vector<float> w = to_host(weights[0].second);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < t; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < t; ++j) {
          const float v = w[(h * t + i) * t + j];
          if (j > i) QCOMPARE(v, 0.0f);
          QVERIFY(v >= 0);
          sum += v;
        }
        QVERIFY(std::fabs(sum - 1) < 1e-5);
      }

    // Every parameter's gradient against finite differences of the mean cross-entropy over every step.
    const Tensor labels = dev({3, t}, {2, 3, 4, 5, 6, 0, 1, 3, 5, 0, 2, 6, 1, 4, 4});
    auto loss = [&] { return double(item(softmax_cross_entropy(m->forward(x, Mode::Eval), labels, false).loss)); };
    m->backward(softmax_cross_entropy(m->forward(x, Mode::Train), labels).dlogits);
    QCOMPARE(check_finite_differences(*m, loss), 3 * 15);
  }

  void cross_attention_gradients_reach_both_branches() {
    // q from one branch, k (and v) from another of another length: mha1 takes q and k (v = k), mha2 q, k and
    // v, causal with fewer queries than keys, without bias.
    Net n;
    const int x = n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {4, 6}; });
    const int q = n.add("q", LayerKind::Linear, [](LayerSpec& l) { l.features = 6; });
    n.add("t", LayerKind::Transpose, [](LayerSpec& l) { l.dim0 = 0, l.dim1 = 1; }, {x});
    const int k = n.add("k", LayerKind::Linear, [](LayerSpec& l) { l.features = 6; });
    const int v = n.add("v", LayerKind::Tanh);
    const int m1 = n.add("mha1", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 3; }, {q, k});
    n.add("mha2", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2, l.causal = true, l.bias = false; },
          {m1, k, v});
    n.add("last", LayerKind::LastStep);
    n.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    const std::vector<LayerInfo> infos = n.spec.infer();
    QCOMPARE(infos[static_cast<size_t>(k)].out, (Shape{6, 6}));
    QCOMPARE(infos[static_cast<size_t>(m1)].out, (Shape{4, 6}));
    auto m = Model::create(*rt_, networkOptions(n.spec, 5), device_);
    QCOMPARE(parameter_names(*m),
             (std::vector<std::string>{"q.weight", "q.bias", "k.weight", "k.bias", "mha1.in_proj_weight",
                                       "mha1.in_proj_bias", "mha1.out_proj.weight", "mha1.out_proj.bias",
                                       "mha2.in_proj_weight", "mha2.out_proj.weight", "fc.weight", "fc.bias"}));
    const Tensor xs = normal(*rt_, {3, 4, 6}, device_, 17);
    QCOMPARE(m->forward(xs, Mode::Eval).shape(), (Shape{3, 3}));
    const auto weights = m->attention_weights();
    QCOMPARE(weights.size(), size_t(2));
    QCOMPARE(QString::fromStdString(weights[0].first), QString("mha1"));
    QCOMPARE(weights[0].second.shape(), (Shape{3, 4, 6}));
    QCOMPARE(QString::fromStdString(weights[1].first), QString("mha2"));
    QCOMPARE(weights[1].second.shape(), (Shape{2, 4, 6}));
    const std::vector<float> w2 = to_host(weights[1].second);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = i + 3; j < 6; ++j) QCOMPARE(w2[(h * 4 + i) * 6 + j], 0.0f);  // j > i + (6 - 4)
    check_gradients(*m, xs, 3 * 12);
  }

  void a_vit_like_network_trains_end_to_end() {
    // d2l 11.8 in small: PatchEmbedding (Conv2d with stride = patch, Reshape, Transpose), the class token, a
    // learned position embedding, one pre-norm block, the class token's features, a head.
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {1, 8, 8}; });
    n.add("conv", LayerKind::Conv2d, [](LayerSpec& l) { l.features = 6, l.kernel = 4, l.stride = 4; });
    n.add("flat", LayerKind::Reshape, [](LayerSpec& l) { l.shape = {6, 4}; });
    n.add("patches", LayerKind::Transpose, [](LayerSpec& l) { l.dim0 = 0, l.dim1 = 1; });
    n.add("cls", LayerKind::ClassToken);
    const int pos = n.add("pos", LayerKind::PositionEmbedding);
    n.add("ln1", LayerKind::LayerNorm);
    const int mha = n.add("mha", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2; });
    const int add1 = n.add("add1", LayerKind::Add, {}, {pos, mha});
    n.add("ln2", LayerKind::LayerNorm);
    n.add("fc1", LayerKind::Linear, [](LayerSpec& l) { l.features = 12; });
    n.add("gelu", LayerKind::GELU);
    const int fc2 = n.add("fc2", LayerKind::Linear, [](LayerSpec& l) { l.features = 6; });
    n.add("add2", LayerKind::Add, {}, {add1, fc2});
    n.add("first", LayerKind::FirstStep);
    n.add("head", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    const std::vector<LayerInfo> infos = n.spec.infer();
    QCOMPARE(infos[3].out, (Shape{4, 6}));
    QCOMPARE(infos[4].out, (Shape{5, 6}));
    QCOMPARE(infos.back().out, (Shape{3}));
    auto m = Model::create(*rt_, networkOptions(n.spec, 6), device_);
    QCOMPARE(parameter_names(*m),
             (std::vector<std::string>{"conv.weight", "conv.bias", "cls.weight", "pos.weight", "ln1.weight",
                                       "ln1.bias", "mha.in_proj_weight", "mha.in_proj_bias", "mha.out_proj.weight",
                                       "mha.out_proj.bias", "ln2.weight", "ln2.bias", "fc1.weight", "fc1.bias",
                                       "fc2.weight", "fc2.bias", "head.weight", "head.bias"}));
    QCOMPARE(parameter(*m, "cls.weight")->value.shape(), (Shape{1, 6}));
    QCOMPARE(parameter(*m, "pos.weight")->value.shape(), (Shape{5, 6}));
    QCOMPARE(parameter(*m, "mha.in_proj_weight")->value.shape(), (Shape{18, 6}));
    QCOMPARE(parameter(*m, "mha.out_proj.weight")->value.shape(), (Shape{6, 6}));
    // The class token starts at zeros (d2l); give it values so that its gradient path is not trivial.
    write_values(parameter(*m, "cls.weight")->value, values(6, 91));
    const Tensor xs = normal(*rt_, {3, 1, 8, 8}, device_, 19);
    QCOMPARE(m->forward(xs, Mode::Eval).shape(), (Shape{3, 3}));
    const auto weights = m->attention_weights();
    QCOMPARE(weights.size(), size_t(1));
    QCOMPARE(weights[0].second.shape(), (Shape{2, 5, 5}));
    const std::vector<float> w = to_host(weights[0].second);
    for (int64_t r = 0; r < 2 * 5; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < 5; ++j) sum += w[r * 5 + j];
      QVERIFY(std::fabs(sum - 1) < 1e-5);
    }
    check_gradients(*m, xs, 3 * 18);
  }

  void attention_drawn_by_hand_equals_multihead_attention_with_one_head() {
    // d2l 11.3's primitives: q, k, v projections, BatchMatMul(q, k^T), Scale(1 / sqrt(d)), a causal Softmax,
    // BatchMatMul(weights, v). With the same projections stacked into in_proj and an identity out_proj it is
    // MultiheadAttention(num_heads=1, causal).
    const int64_t t = 4, e = 6;
    Net hand;
    const int x = hand.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, e}; });
    const int q = hand.add("q", LayerKind::Linear, [&](LayerSpec& l) { l.features = e; }, {x});
    const int k = hand.add("k", LayerKind::Linear, [&](LayerSpec& l) { l.features = e; }, {x});
    const int v = hand.add("v", LayerKind::Linear, [&](LayerSpec& l) { l.features = e; }, {x});
    hand.add("scores", LayerKind::BatchMatMul, [](LayerSpec& l) { l.transpose_b = true; }, {q, k});
    hand.add("scale", LayerKind::Scale, [&](LayerSpec& l) { l.scale = 1 / std::sqrt(double(e)); });
    hand.add("softmax", LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; });
    const int ctx = hand.add("ctx", LayerKind::BatchMatMul, {}, {hand.last(), v});
    QCOMPARE(hand.spec.infer()[4].out, (Shape{t, t}));
    Net fused;
    fused.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, e}; });
    fused.add("mha", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 1, l.causal = true; });
    auto a = Model::create(*rt_, networkOptions(hand.spec, 2), device_);
    auto b = Model::create(*rt_, networkOptions(fused.spec, 2), device_);
    std::vector<float> in_w, in_b, eye(static_cast<size_t>(e * e), 0.0f);
    for (const char* p : {"q", "k", "v"}) {
      const std::vector<float> w = to_host(parameter(*a, std::string(p) + ".weight")->value);
      std::vector<float> bias = values(e, 100 + uint64_t(*p));
      write_values(parameter(*a, std::string(p) + ".bias")->value, bias);
      in_w.insert(in_w.end(), w.begin(), w.end());
      in_b.insert(in_b.end(), bias.begin(), bias.end());
    }
    for (int64_t i = 0; i < e; ++i) eye[static_cast<size_t>(i * e + i)] = 1;
    write_values(parameter(*b, "mha.in_proj_weight")->value, in_w);
    write_values(parameter(*b, "mha.in_proj_bias")->value, in_b);
    write_values(parameter(*b, "mha.out_proj.weight")->value, eye);
    const Tensor xs = normal(*rt_, {3, t, e}, device_, 29);
    QVERIFY(near(to_host(a->forward(xs, Mode::Eval)), widen(to_host(b->forward(xs, Mode::Eval))), 1e-5,
                 "hand-drawn attention"));

    // Its gradients, with a Mul of the context and the queries, the last step and a head.
    hand.add("gate", LayerKind::Mul, {}, {ctx, q});
    hand.add("last", LayerKind::LastStep);
    hand.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    auto c = Model::create(*rt_, networkOptions(hand.spec, 3), device_);
    check_gradients(*c, xs, 3 * 8);
    // A Softmax without causal over a flat vector is F.softmax(x, dim=-1).
    Net flat;
    flat.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {5}; });
    flat.add("sm", LayerKind::Softmax);
    auto f = Model::create(*rt_, networkOptions(flat.spec), device_);
    const std::vector<float> z = values(10, 107, 3.0f);
    QVERIFY(near(to_host(f->forward(dev({2, 5}, z), Mode::Eval)), ref_masked_softmax(z, 2, 1, 1, 5, false, nullptr),
                 1e-6, "flat softmax"));
  }

  void dropout_on_attention_weights_is_deterministic_for_a_seed() {
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {6, 8}; });
    n.add("pe", LayerKind::PositionalEncoding, [](LayerSpec& l) { l.dropout = 0.25; });
    n.add("mha", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2, l.dropout = 0.5; });
    const Tensor x = normal(*rt_, {4, 6, 8}, device_, 23);
    auto a = Model::create(*rt_, networkOptions(n.spec, 7), device_);
    auto b = Model::create(*rt_, networkOptions(n.spec, 7), device_);
    const std::vector<float> eval = to_host(a->forward(x, Mode::Eval));
    const std::vector<float> ta = to_host(a->forward(x, Mode::Train));
    a->clear_cache();
    const std::vector<float> tb = to_host(b->forward(x, Mode::Train));
    b->clear_cache();
    QCOMPARE(ta, tb);
    QVERIFY(ta != eval);  // dropout did drop
    // The next Train forward draws other masks, the same in both models again.
    const std::vector<float> ta2 = to_host(a->forward(x, Mode::Train));
    a->clear_cache();
    const std::vector<float> tb2 = to_host(b->forward(x, Mode::Train));
    b->clear_cache();
    QCOMPARE(ta2, tb2);
    QVERIFY(ta2 != ta);
    // Eval ignores dropout: the same as a model without it.
    Net plain = n;
    plain.spec.layers[1].dropout = 0, plain.spec.layers[2].dropout = 0;
    auto c = Model::create(*rt_, networkOptions(plain.spec, 7), device_);
    QCOMPARE(to_host(c->forward(x, Mode::Eval)), eval);
    // With dropout 0 a Train forward is the Eval one.
    const std::vector<float> train0 = to_host(c->forward(x, Mode::Train));
    c->clear_cache();
    QVERIFY(near(train0, widen(eval), 1e-6, "train without dropout"));
  }

  void positional_encoding_adds_d2ls_table() {
    const int64_t t = 9, e = 6;
    Net n;
    n.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, e}; });
    n.add("pe", LayerKind::PositionalEncoding, [](LayerSpec& l) { l.max_len = 9; });
    auto m = Model::create(*rt_, networkOptions(n.spec), device_);
    QVERIFY(m->parameters().empty());
    const std::vector<float> x = values(2 * t * e, 95);
    Doubles want(x.size());
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t pos = 0; pos < t; ++pos)
        for (int64_t j = 0; j < e; ++j) {
          const double angle = double(pos) / std::pow(10000.0, double(j - j % 2) / double(e));
          want[(s * t + pos) * e + j] = x[(s * t + pos) * e + j] + (j % 2 ? std::cos(angle) : std::sin(angle));
        }
    QVERIFY(near(to_host(m->forward(dev({2, t, e}, x), Mode::Eval)), want, 1e-5, "positional encoding"));
  }

  void attention_weights_that_cannot_fit_the_device_fail_before_allocating() {
    // Without a limit: 16 samples of 131072 steps need 16 x 131072^2 x 4 bytes = 1 TiB of weights.
    {
      const int64_t t = 131072, n = 16;
      Net net;
      net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, 2}; });
      net.add("attn", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 1; });
      auto m = Model::create(*rt_, networkOptions(net.spec), device_);
      const Tensor x = zeros(*rt_, {n, t, 2}, device_);
      to_host(sum(x));
      const int64_t bytes = n * t * t * 4;
      expect_error([&] { m->forward(x, Mode::Eval); },
                   {"attn", "attention weights", "131072 x 131072", "16 samples", QString::fromStdString(format_bytes(bytes)),
                    QString::fromStdString(device_.str())});
      rt_->engine().wait_all();
    }
    // Under a small limit: 4 samples x 2 heads x 2048^2 x 4 bytes = 128 MiB against 16 MiB more than is
    // allocated now, and nothing of it was allocated.
    const int64_t t = 2048, n = 4;
    Net net;
    net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, 4}; });
    net.add("attn", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2; });
    auto m = Model::create(*rt_, networkOptions(net.spec), device_);
    const Tensor x = normal(*rt_, {n, t, 4}, device_, 3);
    to_host(sum(x));
    rt_->engine().wait_all();
    Allocator& alloc = rt_->allocator(device_);
    const int64_t before = alloc.stats().allocated_bytes.current;
    alloc.reset_peak();
    alloc.set_limit(before + (16 << 20));
    const int64_t bytes = n * 2 * t * t * 4;
    QVERIFY2(bytes > before + (16 << 20), "too much is allocated before the check");
    expect_error([&] { m->forward(x, Mode::Eval); },
                 {"attn", "attention weights", "2048 x 2048", "2 heads", "4 samples", QString::fromStdString(format_bytes(bytes))});
    rt_->engine().wait_all();
    const int64_t peak = alloc.stats().allocated_bytes.peak;
    alloc.set_limit(0);
    QVERIFY2(peak == before, qPrintable(QString("peak %1 after the refusal, %2 before").arg(peak).arg(before)));
    // Within the limit it runs.
    alloc.set_limit(before + (256 << 20));
    const Tensor y = m->forward(narrow_batch(x, 1), Mode::Eval);
    QCOMPARE(y.shape(), (Shape{1, t, 4}));
    to_host(sum(y));
    alloc.set_limit(0);
  }

  // d2l 11.2's Nadaraya-Watson pooling against a float64 loop, in evaluation (every key) and in training (each
  // query's own row left out), and its gradients: w's, and through a Linear before it the rows'.
  void nadaraya_watson_pools_as_d2l_with_its_gradients() {
    const int64_t n = 2, t = 5;
    Net net;
    net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, 3}; });
    net.add("mix", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    net.add("nw", LayerKind::NadarayaWatson);
    QCOMPARE(net.spec.infer().back().out, (Shape{t}));
    expect_layer_error([] { infer_layer([] { LayerSpec l; l.id = "nw"; l.kind = LayerKind::NadarayaWatson; return l; }(),
                                        {{5, 2}}); },
                       "in", {"NadarayaWatson", "[T, 3]", "5x2"});
    auto m = Model::create(*rt_, networkOptions(net.spec, 3), device_);
    QCOMPARE(parameter_names(*m), (std::vector<std::string>{"mix.weight", "mix.bias", "nw.w"}));
    const float w0 = to_host(m->parameters()[2]->value)[0];
    QVERIFY2(w0 >= 0 && w0 <= 1, "w starts from U(0, 1)");
    // mix = identity, w = 1.3: the layer sees the rows themselves.
    write_values(m->parameters()[0]->value, {1, 0, 0, 0, 1, 0, 0, 0, 1});
    write_values(m->parameters()[1]->value, {0, 0, 0});
    write_values(m->parameters()[2]->value, {1.3f});
    std::vector<float> rows(static_cast<size_t>(n * t * 3));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.37f * static_cast<float>((i * 5) % 11) - 1.1f;
    const Tensor xs = dev({n, t, 3}, rows);
    auto reference = [&](bool train) {
      std::vector<double> y(static_cast<size_t>(n * t));
      for (int64_t s = 0; s < n; ++s)
        for (int64_t i = 0; i < t; ++i) {
          const double q = rows[static_cast<size_t>((s * t + i) * 3)];
          double sum = 0, acc = 0;
          for (int64_t j = 0; j < t; ++j) {
            if (train && j == i) continue;
            const double k = rows[static_cast<size_t>((s * t + j) * 3 + 1)];
            const double v = rows[static_cast<size_t>((s * t + j) * 3 + 2)];
            const double e = std::exp(-0.5 * (q - k) * 1.3 * (q - k) * 1.3);
            sum += e, acc += e * v;
          }
          y[static_cast<size_t>(s * t + i)] = acc / sum;
        }
      return y;
    };
    QVERIFY(near(to_host(m->forward(xs, Mode::Eval)), reference(false), 1e-5, "evaluation"));
    QVERIFY(near(to_host(m->forward(xs, Mode::Train)), reference(true), 1e-5, "training, own key left out"));
    m->clear_cache();
    const auto weights = m->attention_weights();
    QCOMPARE(weights.size(), size_t(1));
    QCOMPARE(weights[0].second.shape(), (Shape{1, t, t}));
    // Gradients, in training, of an MSE against targets, with a mixing Linear that is not the identity.
    write_values(m->parameters()[0]->value, {0.9f, 0.2f, -0.1f, 0.1f, 1.1f, 0.3f, -0.2f, 0.1f, 0.8f});
    write_values(m->parameters()[1]->value, {0.05f, -0.1f, 0.2f});
    const Tensor target = normal(*rt_, {n, t}, device_, 4);
    auto loss = [&] {
      const double l = double(item(regression_loss(RegressionLoss::Mse, m->forward(xs, Mode::Train), target, false).loss));
      m->clear_cache();
      return l;
    };
    m->backward(regression_loss(RegressionLoss::Mse, m->forward(xs, Mode::Train), target).dpred);
    QCOMPARE(check_finite_differences(*m, loss), 3 * 3);
  }

  // d2l 11.2's data: sorted training inputs in [0, 5), test inputs 0, 0.1, ..., and rows (query, key, value).
  void attention_pooling_data_is_d2ls() {
    const AttentionPoolingData d = make_attention_pooling(50, 0);
    QCOMPARE(d.train->sample_shape, (Shape{50, 3}));
    QCOMPARE(d.test->target_shape, (Shape{50}));
    QVERIFY(d.train->regression && d.test->regression);
    for (int64_t i = 0; i < 50; ++i) {
      const float* tr = d.train->values.data() + 3 * i;
      const float* te = d.test->values.data() + 3 * i;
      QCOMPARE(tr[0], tr[1]);                                  // a training query is its own key
      QCOMPARE(te[1], tr[1]);                                  // the test split's keys are the training inputs
      QCOMPARE(te[2], tr[2]);                                  // and its values the training targets
      QVERIFY(std::fabs(te[0] - 0.1f * static_cast<float>(i)) < 1e-5f);
      QVERIFY(tr[1] >= 0 && tr[1] < 5 && (i == 0 || tr[1] >= tr[1 - 3]));
      QVERIFY(std::fabs(d.test->targets[static_cast<size_t>(i)] - (2 * std::sin(te[0]) + std::pow(te[0], 0.8f))) < 1e-5f);
    }
    expect_error([] { make_attention_pooling(1, 0); }, {"points", "1"});
  }

 private:
  // The first `count` samples of x.
  Tensor narrow_batch(const Tensor& x, int64_t count) {
    std::vector<float> v = to_host(x);
    Shape s = x.shape();
    v.resize(static_cast<size_t>(x.numel() / s[0] * count));
    s[0] = count;
    return dev(s, v);
  }

  // Backward against central differences at three entries of every parameter, for a cross-entropy over 3
  // classes of 3 samples.
  void check_gradients(Model& m, const Tensor& xs, int expected_checks) {
    const Tensor labels = dev({3}, {0, 2, 1});
    auto loss = [&] { return double(item(softmax_cross_entropy(m.forward(xs, Mode::Eval), labels, false).loss)); };
    m.backward(softmax_cross_entropy(m.forward(xs, Mode::Train), labels).dlogits);
    const int checked = check_finite_differences(m, loss);
    QCOMPARE(checked, expected_checks);
  }
};

QTEST_GUILESS_MAIN(AttentionLayersTest)
#include "test_attention_layers.moc"
