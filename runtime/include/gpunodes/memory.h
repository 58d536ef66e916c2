// Per-device allocators and their statistics.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "gpunodes/device.h"

namespace gn {

class Profiler;

// PyTorch's four counters, kept for allocated bytes (handed to tensors) and reserved bytes
// (held from the system, including a caching allocator's cache).
struct MemoryCounter {
  int64_t current = 0, peak = 0, allocated = 0, freed = 0;
  void add(int64_t bytes);
  void sub(int64_t bytes);
};

// The host memory the CPU kernels hold as scratch outside any allocator (staged reorders between layouts,
// bf16 operand copies, oneDNN's scratchpads): each worker thread keeps its largest request of each kind until
// it ends. Part of a process's resident memory that memory_stats() does not count.
int64_t cpu_kernel_scratch_bytes();

struct MemoryStats {
  MemoryCounter allocated_bytes;
  MemoryCounter reserved_bytes;
  int64_t num_allocs = 0;
  int64_t num_ooms = 0;
};

class Allocator {
 public:
  Allocator(Device device, Profiler* profiler) : device_(device), profiler_(profiler) {}
  virtual ~Allocator() = default;
  Allocator(const Allocator&) = delete;
  Allocator& operator=(const Allocator&) = delete;

  // Throws OutOfMemoryError; never returns null for bytes > 0.
  virtual void* allocate(size_t bytes, StreamKind stream) = 0;
  virtual void deallocate(void* ptr) = 0;
  // Gives cached blocks back to the system (no-op where nothing is cached).
  virtual void empty_cache() {}
  // Throws OutOfMemoryError for a request that can never be met here: larger than the limit or than the
  // device's memory. Tensors check this when they are made; allocate() checks the rest when they are used.
  void refuse_impossible(int64_t bytes);

  MemoryStats stats() const;
  // Starts the peaks again from what is allocated now (torch.cuda.reset_peak_memory_stats): a runtime that
  // serves several runs reports each run's own peak.
  void reset_peak();
  // A cap below the physical size: simulates a small card and makes OOM testable anywhere. 0 = none.
  void set_limit(int64_t bytes) { limit_ = bytes; }
  int64_t limit() const { return limit_; }
  Device device() const { return device_; }

 protected:
  // Book-keeping shared by all allocators: counters plus a timestamped memory sample.
  void note_alloc(int64_t bytes, int64_t reserved_delta);
  void note_free(int64_t bytes, int64_t reserved_delta);
  void note_oom();
  [[noreturn]] void throw_oom(int64_t requested, int64_t free, int64_t cached);
  // All the memory there is, or 0 where that is not known.
  virtual int64_t capacity() const { return 0; }

  Device device_;
  Profiler* profiler_;
  std::atomic<int64_t> limit_{0};
  mutable std::mutex stats_mutex_;
  MemoryStats stats_;
};

// Host memory for CPU devices: 64-byte aligned blocks from malloc, each carrying its size in front of it.
// Blocks of 64 KiB and more are kept when freed and handed out again for the same size, as the CUDA
// allocator does: a training step frees and asks again for the same activation sizes every step, and
// malloc returns such blocks to the system (a worker thread's arena trims eagerly), so each step would
// fault its pages in again. The cache holds at most kMaxCached bytes, and under a limit only what keeps
// allocated plus cached within it; empty_cache() gives it back. reserved_bytes counts it.
class CpuAllocator final : public Allocator {
 public:
  using Allocator::Allocator;
  ~CpuAllocator() override;
  void* allocate(size_t bytes, StreamKind stream) override;
  void deallocate(void* ptr) override;
  void empty_cache() override;

  static constexpr size_t kCachedFrom = 64 << 10;
  static constexpr size_t kMaxCached = size_t(1) << 30;

 protected:
  int64_t capacity() const override;

 private:
  void* take_cached(size_t size);       // nullptr when no block of that size is kept
  bool keep(void* block, size_t size);  // false when the block is not to be kept
  size_t release_cache();               // frees every kept block; returns their bytes; cache_mutex_ held

  std::mutex cache_mutex_;
  std::unordered_map<size_t, std::vector<void*>> cached_;  // kept blocks (their aligned pointers) by size
  size_t cached_bytes_ = 0;
};

}  // namespace gn
