#include "gpunodes/memory.h"

#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <limits>

#include "gpunodes/errors.h"
#include "gpunodes/profiler.h"
#include "cpu/host_scratch.h"

namespace gn {

int64_t cpu_kernel_scratch_bytes() { return cpu::HostScratch::held(); }

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

void Allocator::refuse_impossible(int64_t bytes) {
  const int64_t limit = limit_.load(), all = capacity();
  if (limit > 0 && bytes > limit) throw_oom(bytes, limit - stats().allocated_bytes.current, 0);
  if (all > 0 && bytes > all)
    throw_oom(bytes, std::max<int64_t>(all - stats().allocated_bytes.current, 0), 0);
}

int64_t CpuAllocator::capacity() const {
  return physical_memory();
}

namespace {
// What sits in front of each CPU block: where malloc's block starts, and the size counted for it.
struct BlockHeader {
  void* raw;
  size_t size;
};
constexpr size_t kAlign = 64;

BlockHeader& header_of(void* block) {
  return static_cast<BlockHeader*>(block)[-1];
}
}  // namespace

CpuAllocator::~CpuAllocator() {
  std::lock_guard lock(cache_mutex_);
  release_cache();
}

void* CpuAllocator::take_cached(size_t size) {
  if (size < kCachedFrom) return nullptr;
  std::lock_guard lock(cache_mutex_);
  auto it = cached_.find(size);
  if (it == cached_.end() || it->second.empty()) return nullptr;
  void* p = it->second.back();
  it->second.pop_back();
  cached_bytes_ -= size;
  return p;
}

size_t CpuAllocator::release_cache() {
  const size_t bytes = cached_bytes_;
  for (auto& [size, blocks] : cached_)
    for (void* p : blocks) std::free(header_of(p).raw);
  cached_.clear();
  cached_bytes_ = 0;
  return bytes;
}

void CpuAllocator::empty_cache() {
  size_t released;
  {
    std::lock_guard lock(cache_mutex_);
    released = release_cache();
  }
  if (released) note_free(0, static_cast<int64_t>(released));
}

void* CpuAllocator::allocate(size_t bytes, StreamKind) {
  if (bytes == 0) bytes = 1;
  // Sizes past int64 come from an overflowed computation; they would wrap in the rounding below.
  if (bytes > static_cast<size_t>(std::numeric_limits<int64_t>::max() / 2))
    throw_oom(std::numeric_limits<int64_t>::max(), 0, 0);
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  refuse_impossible(static_cast<int64_t>(rounded));
  const int64_t limit = limit_.load();
  if (limit > 0) {
    const int64_t in_use = stats().allocated_bytes.current;
    if (in_use + static_cast<int64_t>(rounded) > limit)
      throw_oom(static_cast<int64_t>(bytes), limit - in_use, 0);
  }
  if (void* p = take_cached(rounded)) {
    note_alloc(static_cast<int64_t>(rounded), 0);
    return p;
  }
  // Under a limit, what is kept must not push what is held past it.
  if (limit > 0 && stats().reserved_bytes.current + static_cast<int64_t>(rounded) > limit) empty_cache();
  // Plain malloc, aligned by hand: its per-thread caches serve the many small tensors of a training step
  // much faster than aligned_alloc's separate path.
  const size_t total = rounded + kAlign + sizeof(BlockHeader);
  void* raw = std::malloc(total);
  if (!raw) {
    empty_cache();  // what is kept may be what the system lacks
    raw = std::malloc(total);
    if (!raw) throw_oom(static_cast<int64_t>(bytes), 0, 0);
  }
  const auto start = reinterpret_cast<uintptr_t>(raw) + sizeof(BlockHeader);
  auto* p = reinterpret_cast<char*>((start + kAlign - 1) / kAlign * kAlign);
  header_of(p) = {raw, rounded};
  note_alloc(static_cast<int64_t>(rounded), static_cast<int64_t>(rounded));
  return p;
}

void CpuAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  const BlockHeader header = header_of(ptr);
  const auto size = static_cast<int64_t>(header.size);
  if (keep(ptr, header.size)) {
    note_free(size, 0);
    return;
  }
  std::free(header.raw);
  note_free(size, size);
}

// allocate() keeps allocated plus kept within a limit: it empties the cache before it would go past.
bool CpuAllocator::keep(void* block, size_t size) {
  if (size < kCachedFrom) return false;
  std::lock_guard lock(cache_mutex_);
  if (cached_bytes_ + size > kMaxCached) return false;
  cached_[size].push_back(block);
  cached_bytes_ += size;
  return true;
}

}  // namespace gn
