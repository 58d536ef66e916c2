#include "gpunodes/precision.h"

#include <cpuid.h>

#include <cstdint>
#include <oneapi/dnnl/dnnl.hpp>

#include "gpunodes/errors.h"

namespace gn {

const char* precision_name(Precision p) {
  switch (p) {
    case Precision::Fp32:
      return "fp32";
    case Precision::Tf32:
      return "tf32";
    case Precision::Bf16:
      return "bf16";
    case Precision::Fp16:
      return "fp16";
  }
  return "?";
}

std::optional<Precision> parse_precision(std::string_view text) {
  for (Precision p : {Precision::Fp32, Precision::Tf32, Precision::Bf16, Precision::Fp16})
    if (text == precision_name(p)) return p;
  return std::nullopt;
}

namespace {

// XCR0, the register state the operating system saves: AMX needs its tile state (bits 17 and 18) enabled.
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (uint64_t{hi} << 32) | lo;
}

}  // namespace

std::string cpu_bf16_features() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid_max(0, nullptr) < 7) return "";
  std::string found;
  // CPUID leaf 7: sub-leaf 1 EAX bit 5 is AVX512_BF16; sub-leaf 0 EDX bit 22 is AMX-BF16.
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  if (eax & (1u << 5)) found = "avx512_bf16";
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool osxsave = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    __cpuid(1, a, b, c, d);
    return (c & (1u << 27)) != 0;
  }();
  if ((edx & (1u << 22)) && osxsave && (xcr0() & (3u << 17)) == (3u << 17))
    found += found.empty() ? "amx_bf16" : ", amx_bf16";
  return found;
}

bool cpu_native_bf16() {
  // The ISA values are feature sets, each a superset of the bits below it: bf16 is there when all of
  // avx512_core_bf16's bits are.
  static const bool native = [] {
    const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
    const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
    return (isa & bf16) == bf16;
  }();
  return native;
}

std::string cpu_dnnl_isa() {
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::all:
      return "all";
    case dnnl::cpu_isa::sse41:
      return "sse41";
    case dnnl::cpu_isa::avx:
      return "avx";
    case dnnl::cpu_isa::avx2:
      return "avx2";
    case dnnl::cpu_isa::avx2_vnni:
      return "avx2_vnni";
    case dnnl::cpu_isa::avx512_mic:
      return "avx512_mic";
    case dnnl::cpu_isa::avx512_mic_4ops:
      return "avx512_mic_4ops";
    case dnnl::cpu_isa::avx512_core:
      return "avx512_core";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "avx512_core_vnni";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "avx512_core_bf16";
    case dnnl::cpu_isa::avx512_core_amx:
      return "avx512_core_amx";
  }
  return "unknown";
}

bool precision_supported(Precision p, Device device) {
  return p == Precision::Fp32 || device.is_cuda() || (p == Precision::Bf16 && cpu_native_bf16());
}

void check_precision(Precision p, Device device, const std::string& what) {
  if (precision_supported(p, device)) return;
  const std::string head = what + ": precision " + precision_name(p) + " on " + device.str() + ": ";
  if (p == Precision::Bf16) {
    const std::string has = cpu_bf16_features();
    const std::string isa = " (oneDNN's ISA here: " + cpu_dnnl_isa() + ")";
    if (has.empty())
      throw Error(head + "this CPU has neither avx512_bf16 nor AMX-BF16, which bf16 on a CPU needs" + isa +
                  "; use fp32 here, or a CUDA device");
    // The CPU has them but oneDNN was told not to use them (DNNL_MAX_CPU_ISA).
    throw Error(head + "this CPU has " + has + ", but oneDNN's effective ISA is " + cpu_dnnl_isa() +
                ", without bf16 (DNNL_MAX_CPU_ISA?); use fp32 here, or a CUDA device");
  }
  throw Error(head + "tensor-core math (" + precision_name(p) + ") needs a CUDA device; use fp32 here");
}

}  // namespace gn
