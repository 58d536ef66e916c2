// cpu_batchnorm.h: batch norm's OpenMP loops, with the lanes of a channel group as compile-time SIMD loops.
#include "cpu_batchnorm.h"

#include <cmath>
#include <string>
#include <type_traits>

#include "cpu_parallel.h"
#include "gpunodes/errors.h"

namespace gn::nn {
namespace {

constexpr int64_t kParallelMin = kCpuParallelMin;

// Where the values of a BnShape lie (cpu_batchnorm.h says how).
struct BnStrides {
  int64_t image, group, step;
};

bool bn_is_nhwc(const BnShape& s) {
  return s.block != 1 && s.block != 8 && s.block != 16;
}

// Calls f(lanes, strides) with lanes a compile-time constant (see above).
template <class F>
void with_block(const BnShape& s, F f) {
  if (bn_is_nhwc(s)) {
    if (s.block != s.c)
      throw Error("batch norm: no kernel for a channel block of " + std::to_string(s.block) + " of " +
                  std::to_string(s.c) + " channels");
    auto nhwc = [&](auto lanes) { return f(lanes, BnStrides{s.hw * s.c, decltype(lanes)::value, s.c}); };
    if (s.c % 16 == 0) return nhwc(std::integral_constant<int, 16>());
    if (s.c % 8 == 0) return nhwc(std::integral_constant<int, 8>());
    return nhwc(std::integral_constant<int, 1>());
  }
  auto blocked = [&](auto lanes) {
    constexpr int64_t kB = decltype(lanes)::value;
    return f(lanes, BnStrides{s.c * s.hw, s.hw * kB, kB});
  };
  switch (s.block) {
    case 1:
      return blocked(std::integral_constant<int, 1>());
    case 8:
      return blocked(std::integral_constant<int, 8>());
    default:
      return blocked(std::integral_constant<int, 16>());
  }
}

// Calls f(e, l) for every value of channel group cb: e its index in the array, l its lane. Image by image and
// position by position, with the group's B lanes as one SIMD loop: every pass of the batch norm kernels. The
// order of the values per channel is the same in every layout, so are the sums.
template <int B, class F>
inline void for_each_in_block(const BnShape& s, const BnStrides& st, int64_t cb, F&& f) {
  for (int64_t i = 0; i < s.n; ++i) {
    const int64_t at = i * st.image + cb * st.group;
    for (int64_t j = 0; j < s.hw; ++j)
#pragma omp simd
      for (int l = 0; l < B; ++l) f(at + j * st.step + l, l);
  }
}

// Relu and Residual (one is added) are template parameters so that the lane loops stay branch-free.
template <int B, bool Relu, bool Residual>
void bn_forward(const BnShape& s, const BnStrides& at, const BnForward& a) {
  const BnForward& st = a;
  const int64_t blocks = s.c / B, m = s.n * s.hw;
#pragma omp parallel for if (s.n * s.c * s.hw > kParallelMin)
  for (int64_t cb = 0; cb < blocks; ++cb) {
    double mean[B], invstd[B];
    if (st.training) {
      // One pass in double, around each channel's first value: shifted that way, sum(d^2) - sum(d)^2 / m
      // does not cancel the way the raw E[x^2] - E[x]^2 does for large means, and x is read once, not twice.
      double k[B], s1[B] = {}, s2[B] = {};
      for (int l = 0; l < B; ++l) k[l] = a.x[cb * at.group + l];
      for_each_in_block<B>(s, at, cb, [&](int64_t e, int l) {
        const double d = a.x[e] - k[l];
        s1[l] += d;
        s2[l] += d * d;
      });
      for (int l = 0; l < B; ++l) {
        const int64_t c = cb * B + l;
        const double sq = std::max(0.0, s2[l] - s1[l] * s1[l] / static_cast<double>(m));
        const double var = sq / static_cast<double>(m);
        mean[l] = k[l] + s1[l] / static_cast<double>(m);
        invstd[l] = 1.0 / std::sqrt(var + st.eps);
        a.save_mean[c] = static_cast<float>(mean[l]);
        a.save_invstd[c] = static_cast<float>(invstd[l]);
        const double unbiased = m > 1 ? sq / static_cast<double>(m - 1) : var;
        st.running_mean[c] =
            static_cast<float>((1.0 - st.momentum) * st.running_mean[c] + st.momentum * mean[l]);
        st.running_var[c] =
            static_cast<float>((1.0 - st.momentum) * st.running_var[c] + st.momentum * unbiased);
      }
    } else {
      for (int l = 0; l < B; ++l) {
        mean[l] = st.running_mean[cb * B + l];
        invstd[l] = 1.0 / std::sqrt(static_cast<double>(st.running_var[cb * B + l]) + st.eps);
      }
    }
    float scale[B], shift[B];
    for (int l = 0; l < B; ++l) {
      const int64_t c = cb * B + l;
      scale[l] = static_cast<float>(a.gamma[c] * invstd[l]);
      shift[l] = static_cast<float>(st.beta[c] - mean[l] * a.gamma[c] * invstd[l]);
    }
    for_each_in_block<B>(s, at, cb, [&](int64_t e, int l) {
      float v = a.x[e] * scale[l] + shift[l];
      if constexpr (Residual) v += a.residual[e];
      if constexpr (Relu) v = v < 0.0f ? 0.0f : v;  // PyTorch's relu: NaN stays NaN
      a.y[e] = v;
    });
  }
}

// Relu and Residual (dresidual is written) are template parameters so that the lane loops stay branch-free.
template <int B, bool Relu, bool Residual>
void bn_backward(const BnShape& s, const BnStrides& at, const BnBackward& g) {
  const int64_t blocks = s.c / B;
  const double m = static_cast<double>(s.n * s.hw);
  const float *x = g.x, *y = g.y, *dy = g.dy;
  float *dx = g.dx, *dresidual = g.dresidual;
  // The gradient past the fused ReLU: dy where the output is positive (both read, then selected).
  auto grad = [=](int64_t e) {
    const float d = dy[e];
    if constexpr (Relu) return y[e] > 0.0f ? d : 0.0f;
    return d;
  };
#pragma omp parallel for if (s.n * s.c * s.hw > kParallelMin)
  for (int64_t cb = 0; cb < blocks; ++cb) {
    float mean[B];
    double mean_d[B], sum_dy[B] = {}, sum_dy_xc[B] = {};  // sums of dy and of dy * (x - mean), in double
    for (int l = 0; l < B; ++l) mean[l] = g.save_mean[cb * B + l], mean_d[l] = mean[l];
    for_each_in_block<B>(s, at, cb, [&](int64_t e, int l) {
      const double gv = grad(e);
      sum_dy[l] += gv;
      sum_dy_xc[l] += gv * (static_cast<double>(x[e]) - mean_d[l]);
    });
    // dx = gamma * invstd * (dy - mean(dy) - xhat * mean(dy * xhat)), as dy * k + (x - mean) * kx + k0 with
    // the per-channel factors rounded once to float: a float pass over the values, like PyTorch's.
    float k[B], kx[B], k0[B];
    for (int l = 0; l < B; ++l) {
      const int64_t c = cb * B + l;
      const double invstd = g.save_invstd[c], sum_dy_xhat = sum_dy_xc[l] * invstd;
      g.dbeta[c] = static_cast<float>(sum_dy[l]);
      g.dgamma[c] = static_cast<float>(sum_dy_xhat);
      const double scale = g.gamma[c] * invstd;
      k[l] = static_cast<float>(scale);
      kx[l] = static_cast<float>(-scale * invstd * sum_dy_xhat / m);
      k0[l] = static_cast<float>(-scale * sum_dy[l] / m);
    }
    for_each_in_block<B>(s, at, cb, [&](int64_t e, int l) {
      const float gv = grad(e);
      if constexpr (Residual) dresidual[e] = gv;
      dx[e] = gv * k[l] + ((x[e] - mean[l]) * kx[l] + k0[l]);
    });
  }
}

}  // namespace

void cpu_batchnorm_forward(const BnShape& s, const BnForward& a) {
  with_block(s, [&](auto block, const BnStrides& at) {
    constexpr int kBlock = decltype(block)::value;
    if (s.relu)
      a.residual ? bn_forward<kBlock, true, true>(s, at, a) : bn_forward<kBlock, true, false>(s, at, a);
    else
      a.residual ? bn_forward<kBlock, false, true>(s, at, a) : bn_forward<kBlock, false, false>(s, at, a);
  });
}

void cpu_batchnorm_backward(const BnShape& s, const BnBackward& g) {
  with_block(s, [&](auto block, const BnStrides& at) {
    constexpr int kBlock = decltype(block)::value;
    if (s.relu)
      g.dresidual ? bn_backward<kBlock, true, true>(s, at, g) : bn_backward<kBlock, true, false>(s, at, g);
    else
      g.dresidual ? bn_backward<kBlock, false, true>(s, at, g) : bn_backward<kBlock, false, false>(s, at, g);
  });
}

}  // namespace gn::nn
