// cpu_layout.h: asks oneDNN once per precision which layout it picks for a typical ResNet convolution's
// output when left free to choose.
#include "cpu_layout.h"

#include <oneapi/dnnl/dnnl.hpp>
#include <cstdlib>
#include <cstring>

#include "kernels.h"

namespace gn::nn {
namespace {

using dnnl::memory;

// Whether oneDNN's bf16 convolutions take channels-last activations here. On AMX its kernels (brgconv and
// jit:avx512_core_amx_bf16, forward and both backwards) take acdb: with nChw16c activations, reorders to NHWC
// and back around every convolution took 13% of bf16 training's oneDNN time (ONEDNN_VERBOSE, 2 cores).
// GPUNODES_BF16_LAYOUT=nhwc or =blocked overrides the answer (where bf16 runs at all): the NHWC path is then
// checked on a CPU whose oneDNN would not pick it (test_cpu_bf16_nhwc), and a slow choice can be compared.
bool bf16_prefers_nhwc() {
  static const bool nhwc = [] {
    if (!cpu_native_bf16()) return false;
    const char* forced = std::getenv("GPUNODES_BF16_LAYOUT");
    if (forced && std::strcmp(forced, "nhwc") == 0) return true;
    if (forced && std::strcmp(forced, "blocked") == 0) return false;
    try {
      dnnl::engine e(dnnl::engine::kind::cpu, 0);
      const memory::desc src({1, 64, 8, 8}, memory::data_type::bf16, memory::format_tag::any),
          wei({64, 64, 3, 3}, memory::data_type::bf16, memory::format_tag::any),
          dst({1, 64, 8, 8}, memory::data_type::f32, memory::format_tag::any);
      const dnnl::convolution_forward::primitive_desc pd(
          dnnl::convolution_forward::desc(dnnl::prop_kind::forward_training,
                                          dnnl::algorithm::convolution_direct, src, wei, dst, {1, 1}, {1, 1},
                                          {1, 1}),
          e);
      return pd.src_desc() == memory::desc({1, 64, 8, 8}, memory::data_type::bf16, memory::format_tag::nhwc);
    } catch (const dnnl::error&) {
      return false;
    }
  }();
  return nhwc;
}

}  // namespace

int64_t cpu_layout_block(Precision precision, int64_t channels) {
  if (precision == Precision::Bf16 && bf16_prefers_nhwc()) return channels > 0 ? channels : 1;
  return cpu_channel_block();
}

}  // namespace gn::nn
