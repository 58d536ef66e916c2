#include "cuda_allocator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <limits>
#include <vector>

#include "cuda_check.h"
#include "cuda_worker.h"

namespace gn::cuda {
namespace {

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

// 512 B granules, so that blocks freed by one tensor fit the next tensor of a similar size.
size_t block_size(size_t bytes) {
  return std::max(CudaCachingAllocator::kRound, round_up(bytes, CudaCachingAllocator::kRound));
}

// Small requests share 2 MiB segments; medium ones share 20 MiB segments; large ones get their own,
// rounded to 2 MiB. Fewer, larger cudaMalloc calls, as in PyTorch.
size_t segment_size(size_t size, bool small) {
  if (small) return CudaCachingAllocator::kSmallSegment;
  if (size < (10u << 20)) return CudaCachingAllocator::kMinLargeSegment;
  return round_up(size, CudaCachingAllocator::kLargeRound);
}

// The pool this thread allocates from while a PoolScope lives, and whose allocator that is.
thread_local const CudaCachingAllocator* t_pool_allocator = nullptr;
thread_local int t_pool_id = -1;

}  // namespace

CudaCachingAllocator::PoolScope::PoolScope(CudaCachingAllocator& allocator, int id)
    : allocator_(allocator), previous_allocator_(t_pool_allocator), previous_id_(t_pool_id) {
  t_pool_allocator = &allocator;
  t_pool_id = id;
  allocator_.captures_underway_.fetch_add(1);
}

CudaCachingAllocator::PoolScope::~PoolScope() {
  allocator_.captures_underway_.fetch_sub(1);
  t_pool_allocator = previous_allocator_;
  t_pool_id = previous_id_;
}

int64_t CudaCachingAllocator::capacity() const {
  int64_t known = capacity_.load();
  if (known >= 0) return known;
  cudaDeviceProp prop{};
  known = cudaGetDeviceProperties(&prop, device_.index) == cudaSuccess
              ? static_cast<int64_t>(prop.totalGlobalMem)
              : 0;
  (void)cudaGetLastError();  // leave no error behind for the next launch check
  capacity_.store(known);
  return known;
}

int CudaCachingAllocator::open_pool() {
  std::lock_guard lock(mutex_);
  return next_pool_++;
}

void CudaCachingAllocator::release_pool(int id) {
  std::lock_guard lock(mutex_);
  const int compute = static_cast<int>(StreamKind::Compute);
  for (Pool* pool : {&small_pool_, &large_pool_}) {
    std::vector<Block*> moved;
    for (auto it = pool->begin(); it != pool->end();)
      if ((*it)->stream == id) {
        moved.push_back(*it);
        it = pool->erase(it);
      } else {
        ++it;
      }
    for (Block* b : moved) {
      b->stream = compute;
      pool->insert(b);
    }
  }
  for (auto& [ptr, block] : live_)
    if (block->stream == id) block->stream = compute;
}

CudaCachingAllocator::~CudaCachingAllocator() {
  // Tensors should be gone by now; free every segment regardless, ignoring errors (the process may be
  // exiting and the CUDA runtime unloading).
  std::vector<Block*> blocks(small_pool_.begin(), small_pool_.end());
  blocks.insert(blocks.end(), large_pool_.begin(), large_pool_.end());
  for (auto& [ptr, block] : live_) blocks.push_back(block);
  if (cudaSetDevice(device_.index) == cudaSuccess) {
    for (Block* b : blocks)
      if (!b->prev) (void)cudaFree(b->ptr);
  }
  for (Block* b : blocks) delete b;
  (void)cudaGetLastError();
}

void* CudaCachingAllocator::allocate(size_t bytes, StreamKind stream) {
  if (bytes > std::numeric_limits<size_t>::max() / 2) throw_oom(static_cast<int64_t>(bytes), 0, 0);
  // Larger than the card (or the limit): no cache release or cudaMalloc could help.
  refuse_impossible(static_cast<int64_t>(bytes));
  const size_t size = block_size(bytes);
  const bool small = size <= kSmallSize;
  const int s = t_pool_allocator == this ? t_pool_id : static_cast<int>(stream);
  void* ptr = nullptr;
  size_t given = 0;
  int64_t reserved_delta = 0;
  {
    std::lock_guard lock(mutex_);
    Block* block = take_free_block(size, s, small);
    if (!block) {
      block = new_segment(size, s, small);
      // Give the cache back (segments of other streams too) and try once more, as PyTorch does; but not while
      // a graph is captured on this device: cudaFree synchronises the device, which fails (or invalidates)
      // the capture, so a capture that runs short fails with this out-of-memory error instead (PyTorch's
      // allocator skips the release under captures_underway too).
      if (!block && captures_underway_.load() == 0) {
        release_cached();
        block = new_segment(size, s, small);
      }
      if (!block)
        throw_oom(static_cast<int64_t>(bytes), device_free_bytes(),
                  static_cast<int64_t>(reserved_ - allocated_));
      reserved_delta = static_cast<int64_t>(block->size);
    }
    split(block, size);
    block->allocated = true;
    block->used = size;
    live_.emplace(block->ptr, block);
    allocated_ += size;
    ptr = block->ptr;
    given = size;
  }
  note_alloc(static_cast<int64_t>(given), reserved_delta);
  return ptr;
}

void CudaCachingAllocator::deallocate(void* ptr) {
  if (!ptr) return;
  size_t size = 0;
  {
    std::lock_guard lock(mutex_);
    auto it = live_.find(ptr);
    if (it == live_.end()) return;  // not ours: nothing safe to do, and a free must not throw
    Block* block = it->second;
    live_.erase(it);
    size = block->used;
    allocated_ -= size;
    block->allocated = false;
    Pool& pool = pool_of(block->small);
    // Merge with free neighbours so the segment can become whole again (and be released by empty_cache).
    if (Block* p = block->prev; p && !p->allocated) {
      pool.erase(p);
      p->size += block->size;
      p->next = block->next;
      if (p->next) p->next->prev = p;
      delete block;
      block = p;
    }
    if (Block* n = block->next; n && !n->allocated) {
      pool.erase(n);
      block->size += n->size;
      block->next = n->next;
      if (block->next) block->next->prev = block;
      delete n;
    }
    pool.insert(block);
  }
  // The engine frees storage only after every op using it completed on the GPU, so the block is reusable
  // at once without recording events.
  note_free(static_cast<int64_t>(size), 0);
}

void CudaCachingAllocator::empty_cache() {
  std::lock_guard lock(mutex_);
  if (captures_underway_.load() > 0) return;  // see allocate(): no cudaFree during a capture
  release_cached();
}

CudaCachingAllocator::Block* CudaCachingAllocator::take_free_block(size_t size, int stream, bool small) {
  Pool& pool = pool_of(small);
  Block key;
  key.stream = stream;
  key.size = size;
  auto it = pool.lower_bound(&key);
  if (it == pool.end() || (*it)->stream != stream) return nullptr;
  Block* block = *it;
  pool.erase(it);
  return block;
}

CudaCachingAllocator::Block* CudaCachingAllocator::new_segment(size_t size, int stream, bool small) {
  size_t seg = segment_size(size, small);
  const int64_t limit = limit_.load();
  auto over_limit = [&](size_t n) { return limit > 0 && static_cast<int64_t>(reserved_ + n) > limit; };
  // Under a limit smaller than a shared segment, take only what was asked rather than refuse.
  if (over_limit(seg)) seg = size;
  if (over_limit(seg)) return nullptr;

  DeviceGuard guard(device_.index);
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, seg);
  if (err == cudaErrorMemoryAllocation && seg > size) {
    (void)cudaGetLastError();  // not sticky, but clear it so later launch checks do not report it
    seg = size;
    err = cudaMalloc(&p, seg);
  }
  if (err == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError();
    return nullptr;
  }
  GN_CUDA_CHECK(err);
  Block* b = new Block;
  b->ptr = static_cast<char*>(p);
  b->size = seg;
  b->stream = stream;
  b->small = small;
  reserved_ += seg;
  return b;
}

void CudaCachingAllocator::split(Block* block, size_t size) {
  const size_t rest = block->size - size;
  // Small blocks split down to one granule; large ones only when the rest is worth a block of its own.
  if (block->small ? rest < kRound : rest <= kSmallSize) return;
  Block* r = new Block;
  r->ptr = block->ptr + size;
  r->size = rest;
  r->stream = block->stream;
  r->small = block->small;
  r->prev = block;
  r->next = block->next;
  if (r->next) r->next->prev = r;
  block->next = r;
  block->size = size;
  pool_of(r->small).insert(r);
}

size_t CudaCachingAllocator::release_cached() {
  size_t released = 0;
  cudaError_t failure = cudaSuccess;
  {
    DeviceGuard guard(device_.index);
    for (Pool* pool : {&small_pool_, &large_pool_}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (b->prev || b->next) {  // part of a segment still in use
          ++it;
          continue;
        }
        if (cudaError_t err = cudaFree(b->ptr); err != cudaSuccess) {
          failure = err;
          break;
        }
        released += b->size;
        reserved_ -= b->size;
        it = pool->erase(it);
        delete b;
      }
      if (failure != cudaSuccess) break;
    }
  }
  if (released) note_free(0, static_cast<int64_t>(released));
  GN_CUDA_CHECK(failure);
  return released;
}

int64_t CudaCachingAllocator::device_free_bytes() const {
  size_t free = 0, total = 0;
  {
    DeviceGuard guard(device_.index);
    if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
      (void)cudaGetLastError();
      free = 0;  // only feeds the OOM message
    }
  }
  int64_t result = static_cast<int64_t>(free);
  if (int64_t limit = limit_.load(); limit > 0)
    result = std::min(result, std::max<int64_t>(0, limit - static_cast<int64_t>(reserved_)));
  return result;
}

}  // namespace gn::cuda
