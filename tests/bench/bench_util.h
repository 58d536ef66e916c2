// What the training benchmarks share (train_bench.cpp, sequence_bench.cpp): timing and the table's rows.
#pragma once
#include <chrono>
#include <cstdio>
#include <string>

namespace gn::bench {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// printf of one number.
inline std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// One row of the printed table: measure, ours, the peer's, their ratio, the goal.
inline void row(const std::string& measure, const std::string& ours, const std::string& peer,
                const std::string& ratio, const char* goal) {
  std::printf("| %-40s | %12s | %12s | %7s | %-7s |\n", measure.c_str(), ours.c_str(), peer.c_str(),
              ratio.c_str(), goal);
}

}  // namespace gn::bench
