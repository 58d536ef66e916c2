// A caching allocator for one CUDA device, after PyTorch's CUDACachingAllocator but small: cudaMalloc and
// cudaFree synchronize the device and cost far more than a kernel, so freed blocks are kept and reused.
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <set>
#include <tuple>
#include <unordered_map>

#include "gpunodes/memory.h"

namespace gn::cuda {

class CudaCachingAllocator final : public Allocator {
 public:
  using Allocator::Allocator;
  ~CudaCachingAllocator() override;

  void* allocate(size_t bytes, StreamKind stream) override;
  void deallocate(void* ptr) override;
  // Gives wholly free segments back; does nothing while a graph is being captured on this device, since
  // cudaFree synchronises the device, which a capturing stream forbids even in relaxed mode.
  void empty_cache() override;

  // A private pool for the memory of a CUDA graph being captured (backend.h's capture), as PyTorch's graph
  // pools: while a PoolScope lives, this thread's allocations come from pool `id` and its frees return there,
  // so that blocks the graph uses are never handed to work outside it. release_pool gives them back to the
  // compute stream's cache once the graph is gone (blocks still held by tensors follow when freed). A live
  // PoolScope also marks a capture as under way: no cudaFree runs on this device until it ends.
  int open_pool();
  void release_pool(int id);
  class PoolScope {
   public:
    PoolScope(CudaCachingAllocator& allocator, int id);
    ~PoolScope();
    PoolScope(const PoolScope&) = delete;
    PoolScope& operator=(const PoolScope&) = delete;

   private:
    CudaCachingAllocator& allocator_;
    const CudaCachingAllocator* previous_allocator_;
    int previous_id_;
  };

  static constexpr size_t kRound = 512;                 // every block is a multiple of this
  static constexpr size_t kSmallSize = 1 << 20;         // requests up to here use the small pool
  static constexpr size_t kSmallSegment = 2 << 20;      // small blocks are carved from segments this size
  static constexpr size_t kMinLargeSegment = 20 << 20;  // requests under 10 MiB share segments this size
  static constexpr size_t kLargeRound = 2 << 20;        // larger segments are rounded to this

 protected:
  // The device's whole memory (cudaGetDeviceProperties' totalGlobalMem), looked up once; 0 when CUDA cannot
  // say, which turns the check off rather than refusing everything.
  int64_t capacity() const override;

 private:
  // A block is a piece of a segment (one cudaMalloc). Neighbouring blocks of a segment are linked so that
  // freed neighbours merge back.
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t used =
        0;           // the rounded request while allocated (a block may be larger when splitting did not pay)
    int stream = 0;  // blocks are reused only by allocations on the stream that freed them (or a pool's id)
    bool small = false;
    bool allocated = false;
    Block* prev = nullptr;
    Block* next = nullptr;
  };
  // Free blocks ordered for best fit: the smallest block of this stream that is large enough.
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return std::tie(a->stream, a->size, a->ptr) < std::tie(b->stream, b->size, b->ptr);
    }
  };
  using Pool = std::set<Block*, BySize>;

  Pool& pool_of(bool small) { return small ? small_pool_ : large_pool_; }
  Block* take_free_block(size_t size, int stream, bool small);
  Block* new_segment(size_t size, int stream, bool small);  // nullptr when the device or the limit refuses
  void split(Block* block, size_t size);
  size_t release_cached();  // cudaFree of every wholly free segment; returns bytes given back
  int64_t device_free_bytes() const;

  std::mutex mutex_;
  Pool small_pool_, large_pool_;
  std::unordered_map<void*, Block*> live_;     // allocated blocks by pointer
  size_t reserved_ = 0;                        // bytes held from cudaMalloc
  size_t allocated_ = 0;                       // bytes in allocated blocks
  int next_pool_ = 16;                         // pool ids, past every StreamKind
  std::atomic<int> captures_underway_{0};      // live PoolScopes: no cudaFree while one lives
  mutable std::atomic<int64_t> capacity_{-1};  // capacity() once known; -1 before
};

}  // namespace gn::cuda
