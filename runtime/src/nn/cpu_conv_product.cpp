// cpu_conv_product.h: bf16 convolution passes as oneDNN matmuls over im2col columns.
//
// The columns: row p (an output position: image, row, column) holds, for each tap (i, j) of the filter in
// order, the c channels of the input pixel under it (NHWC: one contiguous run), zeros where the tap falls in
// the padding. With the weights as [k, (i, j, c)]: y = cols w^T, dcols = dy w, dw = dy^T cols.
#include "cpu_conv_product.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../cpu/bf16.h"
#include "cpu_dnnl_prims.h"
#include "cpu_parallel.h"

namespace gn::nn::onednn {
namespace {

int64_t positions_of(const ConvShape& s) {
  return s.n * s.oh * s.ow;
}
int64_t taps_of(const ConvShape& s) {
  return s.c * s.r * s.s;
}

// The columns of NHWC bf16 x (above) into `cols`.
void im2col(const ConvShape& s, const uint16_t* x, uint16_t* cols) {
  const int64_t positions = positions_of(s), taps = taps_of(s);
  const size_t run = static_cast<size_t>(s.c) * sizeof(uint16_t);
#pragma omp parallel for if (positions * taps > kCpuParallelMin)
  for (int64_t p = 0; p < positions; ++p) {
    const int64_t img = p / (s.oh * s.ow), oy = p / s.ow % s.oh, ox = p % s.ow;
    uint16_t* out = cols + p * taps;
    for (int64_t i = 0; i < s.r; ++i)
      for (int64_t j = 0; j < s.s; ++j, out += s.c) {
        const int64_t iy = oy * s.stride - s.pad + i, ix = ox * s.stride - s.pad + j;
        if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w)
          std::memset(out, 0, run);
        else
          std::memcpy(out, x + ((img * s.h + iy) * s.w + ix) * s.c, run);
      }
  }
}

// dx (NHWC bf16) from the columns' gradient dcols (float): each input pixel sums, in float and in tap
// order, what every column that read it got, and is rounded once. A gather, so each pixel is one thread's.
void col2im(const ConvShape& s, const float* dcols, uint16_t* dx) {
  const int64_t pixels = s.n * s.h * s.w, taps = taps_of(s);
  constexpr int64_t kChunk = 64;  // channels summed side by side
#pragma omp parallel for if (pixels * taps > kCpuParallelMin)
  for (int64_t q = 0; q < pixels; ++q) {
    const int64_t img = q / (s.h * s.w), iy = q / s.w % s.h, ix = q % s.w;
    for (int64_t c0 = 0; c0 < s.c; c0 += kChunk) {
      const int64_t lanes = std::min(kChunk, s.c - c0);
      float sum[kChunk] = {};
      for (int64_t i = 0; i < s.r; ++i) {
        const int64_t ry = iy + s.pad - i;
        if (ry < 0 || ry % s.stride != 0 || ry / s.stride >= s.oh) continue;
        for (int64_t j = 0; j < s.s; ++j) {
          const int64_t rx = ix + s.pad - j;
          if (rx < 0 || rx % s.stride != 0 || rx / s.stride >= s.ow) continue;
          const int64_t p = (img * s.oh + ry / s.stride) * s.ow + rx / s.stride;
          const float* g = dcols + p * taps + (i * s.s + j) * s.c + c0;
#pragma omp simd
          for (int64_t l = 0; l < lanes; ++l) sum[l] += g[l];
        }
      }
      uint16_t* out = dx + q * s.c + c0;
#pragma omp simd
      for (int64_t l = 0; l < lanes; ++l) out[l] = cpu::float_to_bf16(sum[l]);
    }
  }
}

}  // namespace

bool ConvProduct::suits(const ConvShape& s, Dt operand, Pass pass) {
  static const bool amx = dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
  if (!amx || operand != Dt::bf16 || s.groups != 1 || s.in_type != DType::BFloat16 ||
      s.out_type != DType::BFloat16 || s.in_block != s.c || s.out_block != s.k)
    return false;
  const int64_t per_image = s.oh * s.ow;
  if (pass == Pass::WeightGradient) return s.stride > 1 || per_image <= 49;
  return per_image <= 16 || (s.stride > 1 && s.c >= 128);
}

ConvProduct::ConvProduct(const ConvShape& s, Pass pass) {
  const int64_t positions = positions_of(s), taps = taps_of(s);
  auto& e = tdnnl().engine;
  const memory::dims filters{s.k, s.c, s.r, s.s};
  const memory::desc plain(filters, Dt::f32, Tag::oihw);
  switch (pass) {
    case Pass::Forward:  // y [positions, k] = cols [positions, taps] w^T; w [k, taps] read as its transpose
      a_ = memory::desc({positions, taps}, Dt::bf16, Tag::ab);
      b_ = memory::desc({taps, s.k}, Dt::bf16, memory::dims{1, taps});
      c_ = memory::desc({positions, s.k}, Dt::bf16, Tag::ab);
      if (s.bias) bias_ = memory::desc({1, s.k}, Dt::f32, Tag::ab);
      weights_from_ = plain, weights_to_ = memory::desc(filters, Dt::bf16, Tag::ohwi);
      break;
    case Pass::DataGradient:  // dcols [positions, taps] = dy [positions, k] w [k, taps]
      a_ = memory::desc({positions, s.k}, Dt::bf16, Tag::ab);
      b_ = memory::desc({s.k, taps}, Dt::bf16, Tag::ab);
      c_ = memory::desc({positions, taps}, Dt::f32, Tag::ab);
      weights_from_ = plain, weights_to_ = memory::desc(filters, Dt::bf16, Tag::ohwi);
      break;
    case Pass::WeightGradient:  // dw [k, taps] = dy^T cols; dy [positions, k] read as its transpose
      a_ = memory::desc({s.k, positions}, Dt::bf16, memory::dims{1, s.k});
      b_ = memory::desc({positions, taps}, Dt::bf16, Tag::ab);
      c_ = memory::desc({s.k, taps}, Dt::f32, Tag::ab);
      weights_from_ = memory::desc(filters, Dt::f32, Tag::ohwi), weights_to_ = plain;
      break;
  }
  pd_ = dnnl::matmul::primitive_desc(dnnl::matmul::desc(a_, b_, bias_, c_), user_scratchpad(), e);
  product_ = dnnl::matmul(pd_);
  weights_ = dnnl::reorder(dnnl::reorder::primitive_desc(e, weights_from_, e, weights_to_));
}

memory ConvProduct::weights_in_bf16(const float* w) const {
  auto& t = tdnnl();
  memory w_in(weights_from_, t.engine, const_cast<float*>(w)),
      w16(weights_to_, t.engine, t.scratch.get(kWei, weights_to_.get_size()));
  weights_.execute(t.stream, w_in, w16);
  return w16;
}

void ConvProduct::forward(const ConvShape& s, const void* x, const float* w, const float* b, void* y) const {
  auto& t = tdnnl();
  auto* cols = static_cast<uint16_t*>(t.scratch.get(kSrc, a_.get_size()));
  im2col(s, static_cast<const uint16_t*>(x), cols);
  const memory w16 = weights_in_bf16(w);
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, memory(a_, t.engine, cols)},
                                       {DNNL_ARG_WEIGHTS, memory(b_, t.engine, w16.get_data_handle())},
                                       {DNNL_ARG_DST, memory(c_, t.engine, y)},
                                       {DNNL_ARG_SCRATCHPAD, scratchpad(pd_.scratchpad_desc())}};
  if (b) args.emplace(DNNL_ARG_BIAS, memory(bias_, t.engine, const_cast<float*>(b)));
  product_.execute(t.stream, args);
  t.stream.wait();
}

void ConvProduct::data_gradient(const ConvShape& s, const void* dy, const float* w, void* dx) const {
  auto& t = tdnnl();
  const memory w16 = weights_in_bf16(w);
  auto* dcols = static_cast<float*>(t.scratch.get(kDiffSrc, c_.get_size()));
  product_.execute(t.stream, {{DNNL_ARG_SRC, memory(a_, t.engine, const_cast<void*>(dy))},
                              {DNNL_ARG_WEIGHTS, memory(b_, t.engine, w16.get_data_handle())},
                              {DNNL_ARG_DST, memory(c_, t.engine, dcols)},
                              {DNNL_ARG_SCRATCHPAD, scratchpad(pd_.scratchpad_desc())}});
  t.stream.wait();
  col2im(s, dcols, static_cast<uint16_t*>(dx));
}

void ConvProduct::weight_gradient(const ConvShape& s, const void* x, const void* dy, float* dw,
                                  float* db) const {
  auto& t = tdnnl();
  auto* cols = static_cast<uint16_t*>(t.scratch.get(kSrcW, b_.get_size()));
  im2col(s, static_cast<const uint16_t*>(x), cols);
  void* dw_rsc = t.scratch.get(kDiffWei, c_.get_size());
  product_.execute(t.stream, {{DNNL_ARG_SRC, memory(a_, t.engine, const_cast<void*>(dy))},
                              {DNNL_ARG_WEIGHTS, memory(b_, t.engine, cols)},
                              {DNNL_ARG_DST, memory(c_, t.engine, dw_rsc)},
                              {DNNL_ARG_SCRATCHPAD, scratchpad(pd_.scratchpad_desc())}});
  memory from(weights_from_, t.engine, dw_rsc), to(weights_to_, t.engine, dw);
  weights_.execute(t.stream, from, to);
  t.stream.wait();
  if (!db) return;
  // db per channel, summed in float over the positions in order; channel blocks of 16 side by side.
  const auto* g = static_cast<const uint16_t*>(dy);
  const int64_t positions = positions_of(s), blocks = (s.k + 15) / 16;
#pragma omp parallel for if (positions * s.k > kCpuParallelMin)
  for (int64_t blk = 0; blk < blocks; ++blk) {
    const int64_t c0 = blk * 16, lanes = std::min<int64_t>(16, s.k - c0);
    float sum[16] = {};
    for (int64_t p = 0; p < positions; ++p)
      for (int64_t l = 0; l < lanes; ++l) sum[l] += cpu::bf16_to_float(g[p * s.k + c0 + l]);
    std::copy(sum, sum + lanes, db + c0);
  }
}

}  // namespace gn::nn::onednn
