#include "session.h"

#include <QJsonValue>
#include <QStringList>
#include <algorithm>
#include <cmath>
#include <limits>

#include "gpunodes/errors.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

QString errorText(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return QString::fromUtf8(x.what());
  } catch (...) {
    return QStringLiteral("unknown error");
  }
}

QString gib(int64_t bytes) {
  return QString::number(static_cast<double>(bytes) / (1024.0 * 1024 * 1024), 'f', 1);
}

// A plain-text table with +---+ rules, like nvidia-smi's.
QString textTable(const QStringList& header, const QList<QStringList>& rows) {
  QList<int> width;
  for (const QString& h : header) width.append(int(h.size()));
  for (const QStringList& r : rows)
    for (int i = 0; i < r.size() && i < width.size(); ++i) width[i] = std::max(width[i], int(r[i].size()));
  auto rule = [&] {
    QString s = "+";
    for (int w : width) s += QString(w + 2, '-') + "+";
    return s + "\n";
  };
  auto line = [&](const QStringList& cells) {
    QString s = "|";
    for (int i = 0; i < width.size(); ++i) s += " " + cells.value(i).leftJustified(width[i]) + " |";
    return s + "\n";
  };
  QString out = rule() + line(header) + rule();
  for (const QStringList& r : rows) out += line(r);
  return out + rule();
}

}  // namespace

ParsedSettings parseSettings(const core::RunSettings& settings) {
  ParsedSettings p;
  if (settings.schedule == "sequential") {
    p.options.schedule = Schedule::Sequential;
  } else if (settings.schedule != "parallel") {
    p.errors.append(
        {"settings.schedule", "must be parallel or sequential, not \"" + settings.schedule + "\""});
  }
  // The host's own limit for the setting (each device gets at least one core's worth of threads).
  constexpr int kMaxCpuDevices = 1024;
  if (settings.cpuDevices < 1 || settings.cpuDevices > kMaxCpuDevices) {
    p.errors.append(
        {"settings.cpu_devices",
         QString("must be between 1 and %1, not %2").arg(kMaxCpuDevices).arg(settings.cpuDevices)});
  } else {
    p.options.cpu_devices = settings.cpuDevices;
  }
  const QJsonValue useCuda = settings.all.value("use_cuda");
  if (useCuda.isBool()) {
    p.options.use_cuda = useCuda.toBool();
  } else if (!useCuda.isUndefined()) {
    p.errors.append({QStringLiteral("settings.use_cuda"), QStringLiteral("must be true or false")});
  }
  const QJsonValue limits = settings.all.value("memory_limit");
  if (limits.isObject()) {
    const QJsonObject o = limits.toObject();
    for (auto it = o.begin(); it != o.end(); ++it) {
      const QString field = "settings.memory_limit." + it.key();
      auto device = Device::parse(it.key().toStdString());
      const double bytes = it.value().toDouble();
      if (!device) {
        p.errors.append({field, "\"" + it.key() + "\" is not a device (cpu, cpu:N, cuda:N)"});
      } else if (!it.value().isDouble() || !std::isfinite(bytes) || bytes < 1 || bytes > 9.0e18 ||
                 bytes != std::floor(bytes)) {
        p.errors.append({field, "must be a whole number of bytes"});
      } else {
        p.options.memory_limits[*device] = static_cast<int64_t>(bytes);
      }
    }
  } else if (!limits.isUndefined()) {
    p.errors.append({QStringLiteral("settings.memory_limit"),
                     QStringLiteral("must be an object such as {\"cpu:1\": 67108864}")});
  }
  return p;
}

DeviceChoice resolveDevice(const QString& kind, qint64 index, bool fallback, int cudaCount, int cpuCount) {
  DeviceChoice c;
  if (index < 0) {
    c.message = QString("index must not be negative (%1)").arg(index);
    return c;
  }
  const int i = static_cast<int>(std::min<qint64>(index, 1 << 30));
  if (kind == "cpu") {
    if (i < cpuCount) {
      c.device = Device::cpu(i);
    } else {
      c.message = QString("%1 does not exist: the run has %2 CPU device%3 (settings.cpu_devices)")
                      .arg(qs(Device::cpu(i).str()))
                      .arg(cpuCount)
                      .arg(cpuCount == 1 ? "" : "s");
    }
    return c;
  }
  if (i < cudaCount) {
    c.device = Device::cuda(i);
    return c;
  }
  const QString gpus =
      cudaCount == 0 ? "no GPU" : QString("%1 GPU%2").arg(cudaCount).arg(cudaCount == 1 ? "" : "s");
  if (!fallback) {
    c.message = QString("cuda:%1 is not present (this machine has %2) and fallback is off").arg(i).arg(gpus);
    return c;
  }
  // try_gpu's mapping, so that a graph written for two GPUs still shows two devices on a CPU-only machine.
  c.device = Device::cpu(i % std::max(1, cpuCount));
  c.fellBack = true;
  c.message = QString("cuda:%1 is not present (this machine has %2): try_gpu(%1) falls back to %3")
                  .arg(i)
                  .arg(gpus)
                  .arg(qs(c.device->str()));
  return c;
}

QJsonObject deviceJson(const DeviceInfo& info) {
  QJsonObject o{
      {"device", qs(info.device.str())},
      {"kind", info.device.is_cuda() ? "cuda" : "cpu"},
      {"name", qs(info.name)},
      {"memory_total", double(info.total_memory)},
      {"memory_free", double(info.free_memory)},
      {"peak_gflops", info.peak_gflops},
      {"peak_source", qs(info.peak_source)},
  };
  if (info.device.is_cuda()) {
    o["compute_capability"] = qs(info.compute_capability);
    o["sm_count"] = info.sm_count;
    o["driver_version"] = qs(info.driver_version);
    o["runtime_version"] = qs(info.runtime_version);
    o["cublas_version"] = qs(info.cublas_version);
    o["cudnn_version"] = qs(info.cudnn_version);
  } else {
    o["cores"] = info.cores;
  }
  return o;
}

QJsonObject environmentOf(const Runtime& rt) {
  QJsonArray devices;
  QList<QStringList> rows;
  QStringList sources;
  const DeviceInfo* firstCuda = nullptr;
  for (const DeviceInfo& info : rt.devices()) {
    devices.append(deviceJson(info));
    if (info.device.is_cuda() && !firstCuda) firstCuda = &info;
    const QString compute = info.device.is_cuda()
                                ? QString("cc %1, %2 SMs").arg(qs(info.compute_capability)).arg(info.sm_count)
                                : QString("%1 core%2").arg(info.cores).arg(info.cores == 1 ? "" : "s");
    QString name = qs(info.name);
    if (name.size() > 40) name = name.left(39) + "~";
    rows.append({qs(info.device.str()), name,
                 QString("%1 / %2 GiB").arg(gib(info.free_memory), gib(info.total_memory)), compute,
                 QString::number(info.peak_gflops, 'f', 0)});
    sources.append(qs(info.device.str()) + ": " + qs(info.peak_source));
  }
  QString versions;
  if (firstCuda) {
    versions = QString("CUDA driver %1, runtime %2, cuBLAS %3, cuDNN %4")
                   .arg(qs(firstCuda->driver_version), qs(firstCuda->runtime_version),
                        qs(firstCuda->cublas_version), qs(firstCuda->cudnn_version));
  } else {
#ifdef GPUNODES_HAVE_CUDA
    versions = "CUDA backend built; no usable GPU or driver found: CPU devices only";
#else
    versions = "built without the CUDA backend: CPU devices only";
#endif
  }
  auto fallbackNote = [&](int i) {
    return qs(rt.try_gpu(i).str()) + (rt.is_fallback(i) ? " (fallback)" : "");
  };
  QStringList all;
  QJsonArray allJson;
  for (const Device& d : rt.try_all_gpus()) {
    all.append(qs(d.str()));
    allJson.append(qs(d.str()));
  }
  QString table = "gpunodes devices: " + versions + "\n";
  table += textTable({"device", "name", "memory free / total", "compute", "peak GFLOP/s"}, rows);
  table += "try_gpu(0) = " + fallbackNote(0) + "   try_gpu(10) = " + fallbackNote(10) +
           "   try_all_gpus() = [" + all.join(", ") + "]\n";
  table += "peak GFLOP/s from: " + sources.join("; ") + "\n";
  return QJsonObject{{"devices", devices},
                     {"table", table},
                     {"versions", versions},
                     {"try_gpu(0)", qs(rt.try_gpu(0).str())},
                     {"try_gpu(10)", qs(rt.try_gpu(10).str())},
                     {"try_all_gpus()", allJson}};
}

// --- NodesSession --------------------------------------------------------------------------------------

RuntimeOptions usableOptions(const core::RunSettings& settings) {
  ParsedSettings parsed = parseSettings(settings);
  if (!parsed.errors.isEmpty()) {
    const auto& [field, message] = parsed.errors.first();
    throw Error((field + ": " + message).toStdString());
  }
  return parsed.options;
}

NodesSession::NodesSession(const core::RunSettings& settings) {
  const RuntimeOptions options = usableOptions(settings);
  runtime_ = std::make_shared<Runtime>(options);
  // A runtime of its own: its values go with no other session's.
  scope_ = QString("session-%1").arg(reinterpret_cast<quintptr>(this), 0, 16);
  t0Us_ = runtime_->profiler().now_us();
}

NodesSession::NodesSession(std::shared_ptr<Runtime> runtime, Schedule schedule, QString scope,
                           std::shared_ptr<void> lease)
    : runtime_(std::move(runtime)), scope_(std::move(scope)), lease_(std::move(lease)) {
  Engine& engine = runtime_->engine();
  // The previous session waited for its work; what is left to drain is nothing, and its errors were
  // reported then. Its cancel must not stop this run.
  try {
    engine.wait_all();
  } catch (...) {
  }
  engine.reset_cancel();
  engine.set_schedule(schedule);
  // The report's peak is this run's: what the cached values hold counts, earlier runs' peaks do not.
  runtime_->reset_peak_memory();
  Profiler& profiler = runtime_->profiler();
  spanCursor_ = profiler.span_count();
  profiler.memory_samples(std::numeric_limits<size_t>::max(), &memoryCursor_);
  t0Us_ = profiler.now_us();
}

// Batches that outlive the session keep the runtime alive (and its destructor waits for queued work).
NodesSession::~NodesSession() {
  if (graceTimer_.joinable()) graceTimer_.join();
}

void NodesSession::beginNode(const QString& nodeId) {
  tag_.reset();
  tag_.emplace(nodeId.toStdString());
}

void NodesSession::endNode(const QString& nodeId, std::function<void(const QString& error)> onDone) {
  tag_.reset();
  runtime_->engine().when_done(nodeId.toStdString(), [onDone = std::move(onDone)](const TagOutcome& o) {
    if (!o.error) return onDone(QString());
    // An op skipped because an input failed carries that input's error; say so, so the first failure stays
    // the one to read.
    onDone(o.from_input ? "an input failed: " + errorText(o.error) : errorText(o.error));
  });
}

void NodesSession::cancel() {
  std::lock_guard lock(hooksMutex_);
  if (cancelled_) return;
  cancelled_ = true;
  for (auto& [id, fn] : cancelHooks_) fn();
  if (gracefulHooks_ == 0)
    runtime_->engine().cancel();
  else
    graceTimer_ = std::thread([this] { cancelEngineAfterGrace(); });
}

void NodesSession::cancelEngineAfterGrace() {
  {
    std::unique_lock lock(hooksMutex_);
    gracefulDone_.wait_for(lock, kGrace, [this] { return gracefulHooks_ == 0; });
  }
  runtime_->engine().cancel();
}

std::shared_ptr<void> NodesSession::onCancel(std::function<void()> fn, CancelStyle style) {
  std::lock_guard lock(hooksMutex_);
  if (cancelled_) fn();
  const uint64_t id = nextHook_++;
  cancelHooks_.emplace(id, std::move(fn));
  const bool graceful = style == CancelStyle::Graceful;
  if (graceful) ++gracefulHooks_;
  // The handle lives no longer than the node that holds it, and nodes end before their session does.
  return std::shared_ptr<void>(nullptr, [this, id, graceful](void*) {
    std::lock_guard lock(hooksMutex_);
    cancelHooks_.erase(id);
    if (graceful && --gracefulHooks_ == 0) gracefulDone_.notify_all();
  });
}

void NodesSession::finish() {
  // Errors were reported per node through endNode; wait_all only drains.
  try {
    runtime_->engine().wait_all();
  } catch (...) {
  }
}

QList<core::TraceSpan> NodesSession::takeSpans() {
  std::lock_guard lock(cursorMutex_);
  std::vector<Span> spans = runtime_->profiler().spans(spanCursor_, &spanCursor_);
  QList<core::TraceSpan> out;
  out.reserve(qsizetype(spans.size()));
  for (const Span& s : spans)
    out.append({qs(s.tag), qs(s.name), qs(s.device.str()), stream_name(s.stream), s.start_us - t0Us_,
                s.end_us - t0Us_, s.bytes, s.flops, s.host_blocking});
  return out;
}

QList<core::MemorySampleEvent> NodesSession::takeMemory() {
  std::lock_guard lock(cursorMutex_);
  std::vector<MemorySample> samples = runtime_->profiler().memory_samples(memoryCursor_, &memoryCursor_);
  QList<core::MemorySampleEvent> out;
  out.reserve(qsizetype(samples.size()));
  for (const MemorySample& m : samples)
    out.append({qs(m.device.str()), m.t_us - t0Us_, m.allocated, m.reserved});
  return out;
}

QJsonArray NodesSession::devices() const {
  QJsonArray out;
  for (const DeviceInfo& info : runtime_->devices()) out.append(deviceJson(info));
  return out;
}

QJsonObject NodesSession::memorySummary() const {
  QJsonObject out;
  for (const DeviceInfo& info : runtime_->devices()) {
    const MemoryStats s = runtime_->memory_stats(info.device);
    out[qs(info.device.str())] = QJsonObject{
        {"peak_bytes", double(s.allocated_bytes.peak)},
        {"current_bytes", double(s.allocated_bytes.current)},
        {"reserved_peak_bytes", double(s.reserved_bytes.peak)},
        {"reserved_current_bytes", double(s.reserved_bytes.current)},
        {"allocations", double(s.num_allocs)},
        {"ooms", double(s.num_ooms)},
    };
  }
  return out;
}

double NodesSession::peakGflops(const QString& device) const {
  auto d = Device::parse(device.toStdString());
  if (!d || !runtime_->has(*d)) return 0;
  return runtime_->info(*d).peak_gflops;
}

}  // namespace gn::nodes
