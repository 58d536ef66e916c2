// cpu_conv_product.h: a bf16 convolution's weight gradient as one oneDNN matmul.
#include "cpu_conv_product.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "../cpu/bf16.h"
#include "cpu_dnnl_prims.h"
#include "cpu_parallel.h"

namespace gn::nn::onednn {

bool ConvWeightGradProduct::suits(const ConvShape& s, Dt operand) {
  static const bool amx = dnnl::get_effective_cpu_isa() == dnnl::cpu_isa::avx512_core_amx;
  return amx && operand == Dt::bf16 && s.groups == 1 && s.in_type == DType::BFloat16 &&
         s.out_type == DType::BFloat16 && s.in_block == s.c && s.out_block == s.k &&
         (s.stride > 1 || s.oh * s.ow <= 49);
}

ConvWeightGradProduct::ConvWeightGradProduct(const ConvShape& s) {
  const int64_t positions = s.n * s.oh * s.ow, taps = s.c * s.r * s.s;
  auto& e = tdnnl().engine;
  // dy is NHWC, [positions, k]: the product reads it as its transpose.
  dy_t_ = memory::desc({s.k, positions}, Dt::bf16, memory::dims{1, s.k});
  cols_ = memory::desc({positions, taps}, Dt::bf16, Tag::ab);
  dw_rsc_ = memory::desc({s.k, taps}, Dt::f32, Tag::ab);
  pd_ = dnnl::matmul::primitive_desc(dnnl::matmul::desc(dy_t_, cols_, dw_rsc_), user_scratchpad(), e);
  product_ = dnnl::matmul(pd_);
  dw_plain_ = memory::desc({s.k, s.c, s.r, s.s}, Dt::f32, Tag::oihw);
  dw_ohwi_ = memory::desc({s.k, s.c, s.r, s.s}, Dt::f32, Tag::ohwi);  // the same memory as dw_rsc_
  to_plain_ = dnnl::reorder(dnnl::reorder::primitive_desc(e, dw_ohwi_, e, dw_plain_));
}

void ConvWeightGradProduct::run(const ConvShape& s, const void* x, const void* dy, float* dw, float* db) const {
  auto& t = tdnnl();
  const int64_t positions = s.n * s.oh * s.ow, taps = s.c * s.r * s.s, row_bytes = s.c * 2;
  auto* cols = static_cast<uint16_t*>(t.scratch.get(kSrcW, cols_.get_size()));
  const auto* in = static_cast<const uint16_t*>(x);
  // Row p of cols: for each tap (i, j) of the filter, the c channels of the input pixel under it (NHWC: one
  // contiguous run), or zeros where the tap falls in the padding.
#pragma omp parallel for if (positions * taps > kCpuParallelMin)
  for (int64_t p = 0; p < positions; ++p) {
    const int64_t img = p / (s.oh * s.ow), oy = p / s.ow % s.oh, ox = p % s.ow;
    uint16_t* out = cols + p * taps;
    for (int64_t i = 0; i < s.r; ++i)
      for (int64_t j = 0; j < s.s; ++j, out += s.c) {
        const int64_t iy = oy * s.stride - s.pad + i, ix = ox * s.stride - s.pad + j;
        if (iy < 0 || iy >= s.h || ix < 0 || ix >= s.w)
          std::memset(out, 0, row_bytes);
        else
          std::memcpy(out, in + ((img * s.h + iy) * s.w + ix) * s.c, row_bytes);
      }
  }
  void* dw_rsc = t.scratch.get(kDiffWei, dw_rsc_.get_size());
  memory dw_rsc_mem(dw_rsc_, t.engine, dw_rsc);
  product_.execute(t.stream, {{DNNL_ARG_SRC, memory(dy_t_, t.engine, const_cast<void*>(dy))},
                              {DNNL_ARG_WEIGHTS, memory(cols_, t.engine, cols)},
                              {DNNL_ARG_DST, dw_rsc_mem},
                              {DNNL_ARG_SCRATCHPAD, scratchpad(pd_.scratchpad_desc())}});
  memory from(dw_ohwi_, t.engine, dw_rsc), to(dw_plain_, t.engine, dw);
  to_plain_.execute(t.stream, from, to);
  t.stream.wait();
  if (!db) return;
  // db per channel, summed in float over the positions in order; channel blocks of 16 side by side.
  const auto* g = static_cast<const uint16_t*>(dy);
  const int64_t blocks = (s.k + 15) / 16;
#pragma omp parallel for if (positions * s.k > kCpuParallelMin)
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t c0 = b * 16, lanes = std::min<int64_t>(16, s.k - c0);
    float sum[16] = {};
    for (int64_t p = 0; p < positions; ++p)
      for (int64_t l = 0; l < lanes; ++l) sum[l] += cpu::bf16_to_float(g[p * s.k + c0 + l]);
    std::copy(sum, sum + lanes, db + c0);
  }
}

}  // namespace gn::nn::onednn
