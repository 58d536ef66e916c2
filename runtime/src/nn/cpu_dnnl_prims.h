// The oneDNN objects the CPU layer kernels (cpu_kernels.cpp) run: per-thread engine, stream and scratch, the
// staging of an argument between our layout and a primitive's, and the convolution and eltwise primitives
// cached per shape and per thread. Internal to the runtime.
#pragma once
#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>
#include <optional>

#include "../cpu/host_scratch.h"
#include "cpu_conv_product.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/precision.h"
#include "kernels.h"

namespace gn::nn::onednn {

using dnnl::memory;
using Tag = memory::format_tag;
using Dt = memory::data_type;

// --- per-thread oneDNN state -------------------------------------------------------------------------------

// The scratch slots of a thread's staged arguments (Staged::slot) and of the primitives' scratchpads.
enum Slot { kSrc, kWei, kDst, kDiffDst, kDiffSrc, kDiffWei, kSrcW, kDiffDstW, kPad, kScratchpad };

// One engine and stream per worker thread, and the scratch its reorders and scratchpads use.
struct ThreadDnnl {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  dnnl::stream stream{engine};
  cpu::HostScratch scratch;
};

// This thread's engine, stream and scratch.
ThreadDnnl& tdnnl();
// Primitive attributes with the scratchpad handed in by the caller (scratchpad() below).
dnnl::primitive_attr user_scratchpad();
[[noreturn]] void rethrow_dnnl(const char* what, const dnnl::error& e);

// One argument of a primitive: the tensor in our plain layout, and the primitive's layout when it differs,
// with the reorder between them through a scratch slot.
struct Staged {
  memory::desc user_desc, prim_desc;
  std::optional<dnnl::reorder> in, out;  // user -> prim, prim -> user
  int slot = 0;

  Staged() = default;
  Staged(const memory::desc& user, const memory::desc& prim, int scratch_slot, bool input, bool output)
      : user_desc(user), prim_desc(prim), slot(scratch_slot) {
    if (user == prim) return;
    auto& e = tdnnl().engine;
    if (input) in = dnnl::reorder(dnnl::reorder::primitive_desc(e, user, e, prim));
    if (output) out = dnnl::reorder(dnnl::reorder::primitive_desc(e, prim, e, user));
  }
  bool same() const { return !in && !out; }
  // The memory the primitive reads or writes; reorders `user_ptr` in first for inputs.
  memory bind(void* user_ptr) {
    auto& t = tdnnl();
    memory user(user_desc, t.engine, user_ptr);
    if (same()) return user;
    memory prim(prim_desc, t.engine, t.scratch.get(slot, prim_desc.get_size()));
    if (in) in->execute(t.stream, user, prim);
    return prim;
  }
  // For outputs: reorders the primitive's result back into `user_ptr`.
  void finish(memory prim, void* user_ptr) {
    if (same()) return;
    auto& t = tdnnl();
    memory user(user_desc, t.engine, user_ptr);
    out->execute(t.stream, prim, user);
  }
};

// A primitive's scratchpad memory, from this thread's scratch.
memory scratchpad(const memory::desc& d);

// --- convolution -------------------------------------------------------------------------------------------

Dt dt_of(DType t);

// A convolution's primitives and the staging of their arguments: forward made at once, backward on first need.
struct ConvPrims {
  memory::dims src, wei, bias, dst, strides, padding;
  memory::desc user_src, user_dst;  // x and dx, y and dy: as the caller keeps them
  bool plain_layout = false;
  // Grouped weights are 5-d for oneDNN, [g, K/g, C/g, R, S]: the same memory as our [K, C/g, R, S].
  Tag wei_tag = Tag::oihw;
  bool with_bias = true;
  // Each pass is oneDNN's convolution or, where ConvProduct::suits it, a product; then that pass's
  // primitive (fwd, bd or bw) and its staging are not made.
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  Staged f_src, f_wei, f_dst;
  std::optional<ConvProduct> forward_product;
  bool have_bwd = false;
  dnnl::convolution_backward_data::primitive_desc bd_pd;
  dnnl::convolution_backward_data bd;
  Staged bd_diff_dst, bd_wei, bd_diff_src;
  std::optional<ConvProduct> data_product;
  dnnl::convolution_backward_weights::primitive_desc bw_pd;
  dnnl::convolution_backward_weights bw;
  Staged bw_src, bw_diff_dst, bw_diff_wei;
  std::optional<ConvProduct> weight_product;

  // The operands' type (src, weights, diff_dst): f32, or bf16 under Precision::Bf16. The weight gradient
  // stays f32; y and dx are written as the caller stores them (ConvShape's out_type and in_type).
  Dt operand = Dt::f32;
  Dt y_type = Dt::f32, dx_type = Dt::f32;

  ConvPrims(const ConvShape& s, Dt operand_type);

  // The layout asked of oneDNN: ours for 1x1, otherwise whatever it prefers.
  memory::desc desc(const memory::dims& d, Tag ours, Dt type) const {
    return memory::desc(d, type, plain_layout ? ours : Tag::any);
  }
  memory::desc plain_w(const memory::dims& d) const { return memory::desc(d, Dt::f32, wei_tag); }
  // A zero descriptor tells oneDNN there is no bias (and no bias gradient).
  memory::desc bias_desc() const { return with_bias ? memory::desc(bias, Dt::f32, Tag::x) : memory::desc(); }

  // Makes the backward primitives for `s` (the shape this was made for), once.
  void make_backward(const ConvShape& s);
};

// The primitives of a convolution of shape `s` computed in `precision`, made on this thread's first call.
ConvPrims& conv_prims(const ConvShape& s, Precision precision);

// --- eltwise -----------------------------------------------------------------------------------------------

// An activation's forward and backward primitives over a flat array.
struct EltPrims {
  dnnl::eltwise_forward::primitive_desc fwd_pd;
  dnnl::eltwise_forward fwd;
  dnnl::eltwise_backward::primitive_desc bwd_pd;
  dnnl::eltwise_backward bwd;
  memory::desc desc;

  // GELU's derivative needs the input; the others' follow from the output, which saves keeping x.
  bool backward_from_src = false;

  EltPrims(Activation kind, int64_t n, Dt type);
  static dnnl::algorithm algorithm_for(Activation kind);
};

// The primitives of an activation over n values stored as `type`, made on this thread's first call.
EltPrims& elt_prims(Activation kind, int64_t n, DType type);

}  // namespace gn::nn::onednn
