#include "gpunodes/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <limits>

#include "gpunodes/errors.h"
#include "gpunodes/profiler.h"

namespace gn {

void MemoryCounter::add(int64_t bytes) {
  current += bytes;
  allocated += bytes;
  if (current > peak) peak = current;
}

void MemoryCounter::sub(int64_t bytes) {
  current -= bytes;
  freed += bytes;
}

MemoryStats Allocator::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

void Allocator::reset_peak() {
  std::lock_guard lock(stats_mutex_);
  stats_.allocated_bytes.peak = stats_.allocated_bytes.current;
  stats_.reserved_bytes.peak = stats_.reserved_bytes.current;
}

void Allocator::note_alloc(int64_t bytes, int64_t reserved_delta) {
  MemorySample sample;
  {
    std::lock_guard lock(stats_mutex_);
    stats_.allocated_bytes.add(bytes);
    if (reserved_delta) stats_.reserved_bytes.add(reserved_delta);
    ++stats_.num_allocs;
    sample = {0, device_, stats_.allocated_bytes.current, stats_.reserved_bytes.current};
  }
  if (profiler_) {
    sample.t_us = profiler_->now_us();
    profiler_->record(sample);
  }
}

void Allocator::note_free(int64_t bytes, int64_t reserved_delta) {
  MemorySample sample;
  {
    std::lock_guard lock(stats_mutex_);
    stats_.allocated_bytes.sub(bytes);
    if (reserved_delta) stats_.reserved_bytes.sub(reserved_delta);
    sample = {0, device_, stats_.allocated_bytes.current, stats_.reserved_bytes.current};
  }
  if (profiler_) {
    sample.t_us = profiler_->now_us();
    profiler_->record(sample);
  }
}

void Allocator::note_oom() {
  std::lock_guard lock(stats_mutex_);
  ++stats_.num_ooms;
}

void Allocator::throw_oom(int64_t requested, int64_t free, int64_t cached) {
  note_oom();
  throw OutOfMemoryError(device_, requested, free, cached, limit_.load());
}

namespace {
// The host's physical memory. A request beyond it cannot be met: with overcommit, malloc may still say yes
// and the process is killed when the pages are touched; under ASan it aborts. Refusing it is the clear error.
int64_t physical_memory() {
  static const int64_t bytes = [] {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? static_cast<int64_t>(pages) * page : std::numeric_limits<int64_t>::max();
  }();
  return bytes;
}
}  // namespace

void* CpuAllocator::allocate(size_t bytes, StreamKind) {
  if (bytes == 0) bytes = 1;
  // Sizes past int64 come from an overflowed computation; they would wrap in the rounding below.
  if (bytes > static_cast<size_t>(std::numeric_limits<int64_t>::max() - 64))
    throw_oom(std::numeric_limits<int64_t>::max(), 0, 0);
  size_t rounded = (bytes + 63) / 64 * 64;
  int64_t limit = limit_.load();
  int64_t in_use = stats().allocated_bytes.current;
  if (limit > 0) {
    if (in_use + static_cast<int64_t>(rounded) > limit) throw_oom(static_cast<int64_t>(bytes), limit - in_use, 0);
  }
  if (static_cast<int64_t>(rounded) > physical_memory())
    throw_oom(static_cast<int64_t>(bytes), std::max<int64_t>(physical_memory() - in_use, 0), 0);
  void* p = std::aligned_alloc(64, rounded);
  if (!p) throw_oom(static_cast<int64_t>(bytes), 0, 0);
  {
    std::lock_guard lock(sizes_mutex_);
    sizes_[p] = rounded;
  }
  note_alloc(static_cast<int64_t>(rounded), static_cast<int64_t>(rounded));
  return p;
}

void CpuAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  size_t size;
  {
    std::lock_guard lock(sizes_mutex_);
    auto it = sizes_.find(ptr);
    if (it == sizes_.end()) return;
    size = it->second;
    sizes_.erase(it);
  }
  std::free(ptr);
  note_free(static_cast<int64_t>(size), static_cast<int64_t>(size));
}

}  // namespace gn
