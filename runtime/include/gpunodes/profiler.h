// One timeline for every op on every device and stream, plus memory samples.
#pragma once
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "gpunodes/device.h"

namespace gn {

struct Span {
  std::string name;  // op name: "matmul", "copy", ...
  std::string tag;   // who asked for it; the graph executor puts the node id here
  Device device;
  StreamKind stream = StreamKind::Compute;
  double start_us = 0, end_us = 0;  // microseconds since the profiler's epoch
  int64_t bytes = 0;
  double flops = 0;
  bool host_blocking = false;  // the host waited for this op (a blocking read or copy)
};

struct MemorySample {
  double t_us = 0;
  Device device;
  int64_t allocated = 0, reserved = 0;
};

// The newest items of a stream without end, by absolute position: a reader that keeps its place and
// reads often loses nothing, and one that falls further behind than the capacity loses only the oldest.
template <class T>
class RecentWindow {
 public:
  explicit RecentWindow(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {}
  void push(T item) {
    if (items_.size() < capacity_) {
      items_.push_back(std::move(item));
      return;
    }
    // Full: a ring, so that the steady state allocates nothing. A deque allocated a block every few spans,
    // and a million tiny matmuls took 4.1-4.9 s with it against 4.0-4.1 s with the ring.
    items_[dropped_ % capacity_] = std::move(item);
    ++dropped_;
  }
  // What is kept from position `from` on; *next (when given) becomes the position after the last one.
  std::vector<T> since(size_t from, size_t* next = nullptr) const {
    if (next) *next = end();
    const size_t first = std::max(from, dropped_);
    std::vector<T> out;
    out.reserve(end() > first ? end() - first : 0);
    for (size_t i = first; i < end(); ++i) out.push_back(items_[i % capacity_]);
    return out;
  }
  size_t end() const { return dropped_ + items_.size(); }  // how many were ever pushed
  size_t dropped() const { return dropped_; }

 private:
  size_t capacity_;
  size_t dropped_ = 0;  // also where the oldest kept item sits, modulo the capacity, once full
  std::vector<T> items_;
};

class Profiler {
 public:
  // What one profiler keeps at most: about 30 MB of spans and 8 MB of memory samples. Every op makes a
  // span and every allocation a sample, so keeping all of them grew by 120 MB per million tiny ops.
  static constexpr size_t kKeptSpans = size_t(1) << 18;
  static constexpr size_t kKeptMemorySamples = size_t(1) << 18;

  explicit Profiler(size_t kept_spans = kKeptSpans, size_t kept_memory_samples = kKeptMemorySamples);
  double now_us() const;
  // Converts a steady_clock time point to the timeline.
  double to_us(std::chrono::steady_clock::time_point t) const;

  void record(Span span);
  void record(MemorySample sample);

  // Readers keep a position and ask for what is new (the executor streams these as events); *next gets
  // the position to ask from next time, past anything that was dropped before it was read.
  std::vector<Span> spans(size_t from = 0, size_t* next = nullptr) const;
  std::vector<MemorySample> memory_samples(size_t from = 0, size_t* next = nullptr) const;
  size_t span_count() const;     // every span ever recorded, kept or not
  size_t dropped_spans() const;  // the oldest, no longer kept

  // Chrome trace-event JSON (an object with "traceEvents"), which chrome://tracing and Perfetto open.
  // One process per device, one thread per stream; the spans and samples still kept.
  std::string chrome_trace_json() const;
  void write_chrome_trace(const std::string& path) const;  // throws Error on I/O failure

 private:
  std::chrono::steady_clock::time_point epoch_;
  mutable std::mutex mutex_;
  RecentWindow<Span> spans_;
  RecentWindow<MemorySample> memory_;
};

}  // namespace gn
