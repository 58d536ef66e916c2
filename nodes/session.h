// One run of the GPU node set: the runtime (devices, allocators, engine, profiler) that the run's nodes
// share. The runtime may outlive the session and serve the next one (GpuNodesPlugin keeps it while the
// settings stay the same, so that values in the run cache stay usable): a session starts on a drained
// engine with its cancel reset, reads only the spans and memory samples recorded since it began, and puts
// them on its own timeline, which starts when it does.
#pragma once
#include <QJsonArray>
#include <QJsonObject>
#include <QList>
#include <QPair>
#include <QString>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>

#include "gpunodes/core/plugin.h"
#include "gpunodes/engine.h"
#include "gpunodes/runtime.h"

namespace gn::nodes {

// The runtime options a graph's settings ask for: schedule, cpu_devices, memory_limit {"cpu:1": bytes} and
// use_cuda. Problems are (field, message) pairs; the options then hold the usable part.
struct ParsedSettings {
  RuntimeOptions options;
  QList<QPair<QString, QString>> errors;
};
ParsedSettings parseSettings(const core::RunSettings& settings);
// The options, or a gn::Error naming the first problem.
RuntimeOptions usableOptions(const core::RunSettings& settings);

// The device, as the report's "devices" and `gpunodes devices --json` show it.
QJsonObject deviceJson(const DeviceInfo& info);
// {"devices": [...], "table": nvidia-smi-like text, "try_gpu(0)", "try_gpu(10)", "try_all_gpus()"}.
QJsonObject environmentOf(const Runtime& rt);

// Where a Device node's params lead: the device, or why not. try_gpu's fallback (gpu i -> cpu:(i mod N)) is a
// warning when allowed, an error when fallback is off.
struct DeviceChoice {
  std::optional<Device> device;
  bool fellBack = false;
  QString message;  // the error when there is no device, the warning when it fell back
};
DeviceChoice resolveDevice(const QString& kind, qint64 index, bool fallback, int cudaCount, int cpuCount);

class NodesSession final : public core::RunSession {
 public:
  explicit NodesSession(const core::RunSettings& settings);  // throws gn::Error for unusable settings
  // On a runtime that may have served earlier sessions. `scope` is valueScope(); `lease` is released when
  // the session ends (the plugin lends its kept runtime to one session at a time).
  NodesSession(std::shared_ptr<Runtime> runtime, Schedule schedule, QString scope,
               std::shared_ptr<void> lease = nullptr);
  ~NodesSession() override;

  void beginNode(const QString& nodeId) override;
  void endNode(const QString& nodeId, std::function<void(const QString& error)> onDone) override;
  void cancel() override;
  void finish() override;
  QList<core::TraceSpan> takeSpans() override;
  QList<core::MemorySampleEvent> takeMemory() override;
  QJsonArray devices() const override;
  QJsonObject memorySummary() const override;
  double peakGflops(const QString& device) const override;
  QString valueScope() const override { return scope_; }

  // Where this session's timeline starts on the profiler's clock: a profiler time minus this is a time on
  // the run's timeline.
  double timelineStartUs() const { return t0Us_; }

  Runtime& runtime() { return *runtime_; }
  const std::shared_ptr<Runtime>& runtimePtr() const { return runtime_; }

  // While the returned handle lives, cancel() also calls fn, on the cancelling thread: work that stops on a
  // flag of its own (a Trainer between batches) hears the run's cancel besides the engine's. fn runs under
  // a lock that dropping the handle also takes, so it never runs after the handle is gone. Registered after
  // a cancel, fn runs at once.
  //
  // Graceful: fn stops the work on its own, at a point where it can save what it did (a Trainer finishing
  // its steps in flight and writing a checkpoint), and cancelling the engine's queued ops would drop that.
  // cancel() then holds the engine's cancel back until every graceful handle is dropped, or kGrace has
  // passed, whichever comes first: the run still ends within a second.
  enum class CancelStyle { Immediate, Graceful };
  std::shared_ptr<void> onCancel(std::function<void()> fn, CancelStyle style = CancelStyle::Immediate);
  static constexpr std::chrono::milliseconds kGrace{800};

 private:
  void cancelEngineAfterGrace();

  std::shared_ptr<Runtime> runtime_;
  QString scope_;
  std::shared_ptr<void> lease_;
  double t0Us_ = 0;
  std::mutex hooksMutex_;
  std::condition_variable gracefulDone_;
  std::map<uint64_t, std::function<void()>> cancelHooks_;
  uint64_t nextHook_ = 0;
  int gracefulHooks_ = 0;
  bool cancelled_ = false;
  std::thread graceTimer_;
  // The executor thread's op tag while a node executes: every op the node pushes carries its id.
  std::optional<ScopedOpTag> tag_;
  std::mutex cursorMutex_;
  size_t spanCursor_ = 0, memoryCursor_ = 0;
};

}  // namespace gn::nodes
