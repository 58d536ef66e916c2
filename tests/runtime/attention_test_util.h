// What the attention suites share (test_attention_kernels, test_attention_layers): deterministic values,
// comparisons against float64, and the naive float64 references they check the ops and layers against.
#pragma once
#include <QtTest>
#include <cmath>
#include <functional>
#include <limits>
#include <memory>

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

namespace gn::attention_test {

using Doubles = std::vector<double>;

// Deterministic values in [-scale, scale), exact in float.
inline std::vector<float> values(size_t n, uint64_t seed, float scale = 1.0f) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9E3779B97F4A7C15ull + 12345;
  for (float& x : v) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    x = scale * (static_cast<float>((s >> 40) & 0xFFFFFF) / float(1 << 23) - 1.0f);
  }
  return v;
}

// Every value within tol * (1 + |want|); says the first that is not.
inline bool near(const std::vector<float>& got, const Doubles& want, double tol, const QByteArray& what) {
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

inline Doubles widen(const std::vector<float>& v) {
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
inline Doubles ref_masked_softmax(const std::vector<float>& x, int64_t batch, int64_t heads, int64_t rows, int64_t cols,
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
inline LayerNormRef ref_layer_norm(const std::vector<float>& x, const std::vector<float>& dy, const std::vector<float>* gamma,
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
inline MhaRef ref_mha(const std::vector<float>& q, const std::vector<float>& k, const std::vector<float>& v, int64_t n,
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

inline std::vector<std::string> parameter_names(const Model& m) {
  std::vector<std::string> names;
  for (const ParameterInfo& p : m.describe()) names.push_back(p.name);
  return names;
}

inline Parameter* parameter(Model& m, const std::string& name) {
  for (Parameter* p : m.parameters())
    if (p->name == name) return p;
  return nullptr;
}

// What both attention suites hold: the runtime, the device their checks run on (GN_TEST_DEVICE, set by each
// suite's initTestCase) and a tensor of values on it.
class AttentionSuite : public QObject {
 protected:
  std::unique_ptr<Runtime> rt_;
  Device device_ = Device::cpu();

  Tensor dev(const Shape& s, const std::vector<float>& v) { return from_values(*rt_, s, device_, v); }
};

}  // namespace gn::attention_test
