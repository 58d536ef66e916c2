// Qt-free helpers for the device checks: float64 references, error measures and a tiny expectation counter.
// Header-only so that cuda_kernels_check (built on a GPU machine without Qt) and the Qt Test suites that run
// one body per device share them; tests/runtime/test_check_util.cpp checks them on the CPU, so that a wrong
// reference or a measure that cannot fail shows in CI and not on the first GPU run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <vector>

#include "gpunodes/ops.h"

namespace gn::check {

inline bool same_bits(float x, float y) {
  return std::memcmp(&x, &y, sizeof x) == 0;
}

// Counts the elements whose bits differ (all of them when the sizes differ): -0 and +0 differ, NaNs with
// the same bits do not.
inline int64_t bits_differ(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return int64_t(std::max(a.size(), b.size()));
  int64_t n = 0;
  for (size_t i = 0; i < a.size(); ++i) n += !same_bits(a[i], b[i]);
  return n;
}

// The largest |got - want| / max(floor, |want|) over all elements; infinity when the sizes differ or a value
// is not finite.
template <class Want>
double max_rel_err(const std::vector<Want>& want, const std::vector<float>& got, double floor = 1e-2) {
  if (want.size() != got.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double w = double(want[i]);
    if (!std::isfinite(got[i]) || !std::isfinite(w)) return INFINITY;
    worst = std::max(worst, std::abs(double(got[i]) - w) / std::max(floor, std::abs(w)));
  }
  return worst;
}

// Row-major op(A)[m,k] op(B)[k,n] in float64 at (i, j).
inline double gemm_ref(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n, int64_t k,
                       bool ta, bool tb, int64_t i, int64_t j) {
  double acc = 0;
  for (int64_t p = 0; p < k; ++p) {
    const double x = ta ? a[p * m + i] : a[i * k + p];
    const double y = tb ? b[j * k + p] : b[p * n + j];
    acc += x * y;
  }
  return acc;
}

// What a product of values in [-1, 1] may be off by: each term carries relative error ~2^-24 (fp32) or
// ~2^-11 (tf32), and k of them add up.
inline double matmul_tolerance(Precision precision, int64_t k) {
  return precision == Precision::Tf32 ? 1e-2 * std::sqrt(double(k)) : 2e-6 * double(k);
}

struct MatmulError {
  double worst = 0;  // the largest |c - float64| over the elements looked at
  int64_t i = 0, j = 0;
};

// c = op(a) op(b) against float64 at every element, or, given `rows`, at those rows and about 60 columns
// spread over n (the last included): a large product's sampled check.
inline MatmulError matmul_error(const Tensor& a, const Tensor& b, const Tensor& c, bool ta, bool tb,
                                const std::vector<int64_t>& rows = {}) {
  const int64_t m = ta ? a.shape()[1] : a.shape()[0], k = ta ? a.shape()[0] : a.shape()[1];
  const int64_t n = tb ? b.shape()[0] : b.shape()[1];
  MatmulError e;
  if (c.shape() != Shape{m, n}) return {INFINITY, -1, -1};
  const auto av = to_host(a), bv = to_host(b), cv = to_host(c);
  std::vector<int64_t> rs = rows, cs;
  if (rs.empty())
    for (int64_t i = 0; i < m; ++i) rs.push_back(i);
  if (rows.empty()) {
    for (int64_t j = 0; j < n; ++j) cs.push_back(j);
  } else {
    for (int64_t j = 0; j < n; j += std::max<int64_t>(1, n / 61)) cs.push_back(j);
    cs.push_back(n - 1);
  }
  for (int64_t i : rs)
    for (int64_t j : cs) {
      const double err = std::abs(cv[i * n + j] - gemm_ref(av, bv, m, n, k, ta, tb, i, j));
      // A NaN is the worst there is, and stays the worst (no comparison with it holds).
      if (!std::isnan(e.worst) && !(err <= e.worst)) e = {err, i, j};
    }
  return e;
}

// Grouped 2-D convolution in float64, NCHW, no bias: y[n, k, oh, ow].
inline std::vector<double> conv2d_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t n,
                                      int64_t c, int64_t h, int64_t wd, int64_t k, int64_t r, int64_t s,
                                      int64_t stride, int64_t pad, int64_t groups, int64_t oh, int64_t ow) {
  const int64_t cg = c / groups, kg = k / groups;
  std::vector<double> y(size_t(n * k * oh * ow), 0.0);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < k; ++o) {
      const int64_t c0 = o / kg * cg;
      for (int64_t i = 0; i < oh; ++i)
        for (int64_t j = 0; j < ow; ++j) {
          double acc = 0;
          for (int64_t ci = 0; ci < cg; ++ci)
            for (int64_t u = 0; u < r; ++u)
              for (int64_t v = 0; v < s; ++v) {
                const int64_t yy = i * stride - pad + u, xx = j * stride - pad + v;
                if (yy < 0 || yy >= h || xx < 0 || xx >= wd) continue;
                acc += double(x[((b * c + c0 + ci) * h + yy) * wd + xx]) * w[((o * cg + ci) * r + u) * s + v];
              }
          y[((b * k + o) * oh + i) * ow + j] = acc;
        }
    }
  return y;
}

// Counts expectations and failures for a Qt-free check program: a failure is printed at once and the check
// goes on; run() times a named check and counts an exception as a failure without stopping the others.
class Checks {
 public:
  explicit Checks(std::FILE* out = stdout) : out_(out) {}

  // printf-style detail, printed only on failure.
  bool expect(bool ok, int line, const char* cond, const char* fmt, ...) __attribute__((format(printf, 5, 6))) {
    ++checks_;
    if (ok) return true;
    ++failures_;
    std::fprintf(out_, "    FAIL line %d: %s: ", line, cond);
    va_list args;
    va_start(args, fmt);
    std::vfprintf(out_, fmt, args);
    va_end(args);
    std::fprintf(out_, "\n");
    return false;
  }

  // Returns whether the check passed.
  bool run(const char* name, const std::function<void()>& body) {
    const int before = failures_;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      body();
    } catch (const std::exception& e) {
      ++failures_;
      std::fprintf(out_, "    FAIL: threw %s\n", e.what());
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(out_, "%-4s %-44s %9.1f ms\n", failures_ == before ? "ok" : "FAIL", name, ms);
    std::fflush(out_);
    return failures_ == before;
  }

  int failures() const { return failures_; }
  int checks() const { return checks_; }

 private:
  std::FILE* out_;
  int failures_ = 0;
  int checks_ = 0;
};

}  // namespace gn::check
