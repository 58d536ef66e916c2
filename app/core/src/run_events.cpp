#include "gpunodes/core/run_events.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace gn::core {

void EventChannel::push(RunEvent e) {
  {
    std::lock_guard lock(mutex_);
    queue_.append(std::move(e));
  }
  cv_.notify_all();
}

void EventChannel::push(QList<RunEvent> events) {
  if (events.isEmpty()) return;
  {
    std::lock_guard lock(mutex_);
    queue_.append(std::move(events));
  }
  cv_.notify_all();
}

QList<RunEvent> EventChannel::drain() {
  std::lock_guard lock(mutex_);
  return std::exchange(queue_, {});
}

QList<RunEvent> EventChannel::waitAndDrain(int timeoutMs) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, std::chrono::milliseconds(std::max(0, timeoutMs)), [this] { return !queue_.isEmpty(); });
  return std::exchange(queue_, {});
}

}  // namespace gn::core
