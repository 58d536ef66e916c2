// cpu_dnnl_prims.h: the oneDNN objects behind the CPU layer kernels.
#include "cpu_dnnl_prims.h"

#include <algorithm>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "gpunodes/errors.h"

namespace gn::nn::onednn {

ThreadDnnl& tdnnl() {
  thread_local ThreadDnnl t;
  return t;
}

dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return a;
}

[[noreturn]] void rethrow_dnnl(const char* what, const dnnl::error& e) {
  throw BackendError(std::string("oneDNN ") + what + " failed: " + e.what());
}

memory scratchpad(const memory::desc& d) {
  auto& t = tdnnl();
  return memory(d, t.engine, t.scratch.get(kScratchpad, std::max<size_t>(d.get_size(), 64)));
}

// --- convolution -------------------------------------------------------------------------------------------

namespace {

using ConvKey = std::tuple<int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                           int64_t, bool, int64_t, int64_t>;
ConvKey key_of(const ConvShape& s) {
  return {s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.stride, s.pad, s.groups, s.bias, s.in_block, s.out_block};
}
struct ConvKeyOf {
  ConvKey shape;
  bool bf16;
  DType in_type, out_type;
  auto operator<=>(const ConvKeyOf&) const = default;
};

// Our layout of an activation with channel block `block` (1: NCHW; all its channels: NHWC, cpu_layout.h),
// stored as `type`.
memory::desc activation_desc(const memory::dims& d, int64_t block, Dt type) {
  switch (block) {
    case 1:
      return memory::desc(d, type, Tag::nchw);
    case 8:
      return memory::desc(d, type, Tag::nChw8c);
    case 16:
      return memory::desc(d, type, Tag::nChw16c);
  }
  if (block == d[1]) return memory::desc(d, type, Tag::nhwc);
  throw Error("no oneDNN layout for a channel block of " + std::to_string(block) + " of " +
              std::to_string(d[1]) + " channels");
}

}  // namespace

Dt dt_of(DType t) {
  return t == DType::BFloat16 ? Dt::bf16 : Dt::f32;
}

ConvPrims::ConvPrims(const ConvShape& s, Dt operand_type)
    : operand(operand_type), y_type(dt_of(s.out_type)), dx_type(dt_of(s.in_type)) {
  src = {s.n, s.c, s.h, s.w};
  if (s.groups > 1) {
    wei = {s.groups, s.k / s.groups, s.c / s.groups, s.r, s.s};
    wei_tag = Tag::goihw;
  } else {
    wei = {s.k, s.c, s.r, s.s};
  }
  bias = {s.k};
  with_bias = s.bias;
  dst = {s.n, s.k, s.oh, s.ow};
  strides = {s.stride, s.stride};
  padding = {s.pad, s.pad};
  user_src = activation_desc(src, s.in_block, dt_of(s.in_type));
  user_dst = activation_desc(dst, s.out_block, dt_of(s.out_type));
  auto& e = tdnnl().engine;
  // 1x1 convolutions between NCHW tensors are GEMMs: oneDNN's GEMM path on that layout beats its blocked
  // direct kernel plus the reorders there. Everything else takes the layout oneDNN prefers, which is the
  // blocked layout callers pass (cpu_channel_block()), so that blocked tensors need no reorder.
  // That measurement was of fp32; bf16 always takes oneDNN's preferred (blocked) layouts.
  plain_layout = operand == Dt::f32 && s.r == 1 && s.s == 1 && s.in_block == 1 && s.out_block == 1;
  memory::desc any_src = desc(src, Tag::nchw, operand), any_wei = desc(wei, wei_tag, operand),
               any_dst = desc(dst, Tag::nchw, y_type);
  dnnl::convolution_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
                                    any_src, any_wei, bias_desc(), any_dst, strides, padding, padding);
  fwd_pd = dnnl::convolution_forward::primitive_desc(d, user_scratchpad(), e);  // the backwards' hint too
  if (ConvProduct::suits(s, operand, ConvProduct::Pass::Forward)) {
    forward_product.emplace(s, ConvProduct::Pass::Forward);
    return;
  }
  fwd = dnnl::convolution_forward(fwd_pd);
  f_src = Staged(user_src, fwd_pd.src_desc(), kSrc, true, false);
  f_wei = Staged(plain_w(wei), fwd_pd.weights_desc(), kWei, true, false);
  f_dst = Staged(user_dst, fwd_pd.dst_desc(), kDst, false, true);
}

void ConvPrims::make_backward(const ConvShape& s) {
  if (have_bwd) return;
  auto& e = tdnnl().engine;
  // Backward data reads diff_dst and the weights (operand type) and writes diff_src (as dx is stored);
  // backward weights reads src and diff_dst (operand type) and writes diff_weights and diff_bias (f32).
  memory::desc op_src = desc(src, Tag::nchw, operand), dx_src = desc(src, Tag::nchw, dx_type),
               op_wei = desc(wei, wei_tag, operand), f32_wei = desc(wei, wei_tag, Dt::f32),
               op_dst = desc(dst, Tag::nchw, operand);
  have_bwd = true;
  if (ConvProduct::suits(s, operand, ConvProduct::Pass::DataGradient)) {
    data_product.emplace(s, ConvProduct::Pass::DataGradient);
  } else {
    dnnl::convolution_backward_data::desc dd(dnnl::algorithm::convolution_direct, dx_src, op_wei, op_dst,
                                             strides, padding, padding);
    bd_pd = dnnl::convolution_backward_data::primitive_desc(dd, user_scratchpad(), e, fwd_pd);
    bd = dnnl::convolution_backward_data(bd_pd);
    bd_diff_dst = Staged(user_dst, bd_pd.diff_dst_desc(), kDiffDst, true, false);
    bd_wei = Staged(plain_w(wei), bd_pd.weights_desc(), kWei, true, false);
    bd_diff_src = Staged(user_src, bd_pd.diff_src_desc(), kDiffSrc, false, true);
  }
  if (ConvProduct::suits(s, operand, ConvProduct::Pass::WeightGradient)) {
    weight_product.emplace(s, ConvProduct::Pass::WeightGradient);
    return;
  }
  dnnl::convolution_backward_weights::desc wd(dnnl::algorithm::convolution_direct, op_src, f32_wei,
                                              bias_desc(), op_dst, strides, padding, padding);
  bw_pd = dnnl::convolution_backward_weights::primitive_desc(wd, user_scratchpad(), e, fwd_pd);
  bw = dnnl::convolution_backward_weights(bw_pd);
  bw_src = Staged(user_src, bw_pd.src_desc(), kSrcW, true, false);
  bw_diff_dst = Staged(user_dst, bw_pd.diff_dst_desc(), kDiffDstW, true, false);
  bw_diff_wei = Staged(plain_w(wei), bw_pd.diff_weights_desc(), kDiffWei, false, true);
}

ConvPrims& conv_prims(const ConvShape& s, Precision precision) {
  thread_local std::map<ConvKeyOf, std::unique_ptr<ConvPrims>> cache;
  const bool bf16 = precision == Precision::Bf16;
  auto& slot = cache[ConvKeyOf{key_of(s), bf16, s.in_type, s.out_type}];
  if (!slot) slot = std::make_unique<ConvPrims>(s, bf16 ? Dt::bf16 : Dt::f32);
  return *slot;
}

// --- eltwise -----------------------------------------------------------------------------------------------

EltPrims::EltPrims(Activation kind, int64_t n, Dt type) {
  auto& e = tdnnl().engine;
  desc = memory::desc({n}, type, Tag::x);
  const auto fwd_alg = algorithm_for(kind);
  backward_from_src = kind == Activation::Gelu;
  fwd_pd = dnnl::eltwise_forward::primitive_desc(
      dnnl::eltwise_forward::desc(dnnl::prop_kind::forward_training, fwd_alg, desc), user_scratchpad(), e);
  fwd = dnnl::eltwise_forward(fwd_pd);
  bwd_pd = dnnl::eltwise_backward::primitive_desc(dnnl::eltwise_backward::desc(fwd_alg, desc, desc),
                                                  user_scratchpad(), e, fwd_pd);
  bwd = dnnl::eltwise_backward(bwd_pd);
}

dnnl::algorithm EltPrims::algorithm_for(Activation kind) {
  switch (kind) {
    case Activation::Relu:
      return dnnl::algorithm::eltwise_relu_use_dst_for_bwd;
    case Activation::Sigmoid:
      return dnnl::algorithm::eltwise_logistic_use_dst_for_bwd;
    case Activation::Tanh:
      return dnnl::algorithm::eltwise_tanh_use_dst_for_bwd;
    case Activation::Gelu:
      return dnnl::algorithm::eltwise_gelu_erf;  // exact erf form, PyTorch's default
  }
  throw Error("unknown activation " + std::to_string(static_cast<int>(kind)));
}

EltPrims& elt_prims(Activation kind, int64_t n, DType type) {
  thread_local std::map<std::tuple<int, int64_t, DType>, std::unique_ptr<EltPrims>> cache;
  auto& slot = cache[{static_cast<int>(kind), n, type}];
  if (!slot) slot = std::make_unique<EltPrims>(kind, n, dt_of(type));
  return *slot;
}

}  // namespace gn::nn::onednn
