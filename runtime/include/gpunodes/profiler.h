// One timeline for every op on every device and stream, plus memory samples.
#pragma once
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

class Profiler {
 public:
  Profiler();
  double now_us() const;
  // Converts a steady_clock time point to the timeline.
  double to_us(std::chrono::steady_clock::time_point t) const;

  void record(Span span);
  void record(MemorySample sample);

  // Readers keep a cursor and ask for what is new: the executor streams these as events.
  std::vector<Span> spans(size_t from = 0) const;
  std::vector<MemorySample> memory_samples(size_t from = 0) const;
  size_t span_count() const;
  void clear();

  // Chrome trace-event JSON (an object with "traceEvents"), which chrome://tracing and Perfetto open.
  // One process per device, one thread per stream.
  std::string chrome_trace_json() const;
  void write_chrome_trace(const std::string& path) const;  // throws Error on I/O failure

 private:
  std::chrono::steady_clock::time_point epoch_;
  mutable std::mutex mutex_;
  std::vector<Span> spans_;
  std::vector<MemorySample> memory_;
};

}  // namespace gn
