// Host buffers, one per slot, that grow to the largest request and stay: reorders, bf16 operand copies and
// oneDNN's scratchpad would otherwise allocate (and page-fault) fresh megabytes on every call of a training
// step. One per thread (each kernel file keeps a thread_local one); not thread-safe.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "gpunodes/errors.h"

namespace gn::cpu {

class HostScratch {
 public:
  HostScratch() = default;
  HostScratch(const HostScratch&) = delete;
  HostScratch& operator=(const HostScratch&) = delete;
  ~HostScratch() {
    for (const Buf& b : bufs_) held_ -= static_cast<int64_t>(b.size);
  }
  // What every HostScratch of the process holds (cpu_kernel_scratch_bytes()).
  static int64_t held() { return held_.load(); }

  // At least `bytes` of 64-byte aligned memory for `slot`, valid until the next get() of that slot asks
  // for more. Throws Error when the host has no memory left.
  void* get(int slot, size_t bytes) {
    if (slot >= static_cast<int>(bufs_.size())) bufs_.resize(slot + 1);
    Buf& b = bufs_[slot];
    if (b.size < bytes) {
      const size_t grown = (bytes + 4095) / 4096 * 4096;
      void* p = std::aligned_alloc(64, grown);
      if (!p) throw Error("out of host memory for " + std::to_string(grown) + " bytes of kernel scratch");
      held_ += static_cast<int64_t>(grown) - static_cast<int64_t>(b.size);
      b.ptr.reset(p);
      b.size = grown;
    }
    return b.ptr.get();
  }

 private:
  struct Free {
    void operator()(void* p) const { std::free(p); }
  };
  struct Buf {
    std::unique_ptr<void, Free> ptr;
    size_t size = 0;
  };
  std::vector<Buf> bufs_;
  static inline std::atomic<int64_t> held_{0};
};

}  // namespace gn::cpu
