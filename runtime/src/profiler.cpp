#include "gpunodes/profiler.h"

#include <cstdio>
#include <fstream>
#include <map>
#include <set>

#include "gpunodes/errors.h"

namespace gn {

Profiler::Profiler(size_t kept_spans, size_t kept_memory_samples)
    : epoch_(std::chrono::steady_clock::now()), spans_(kept_spans), memory_(kept_memory_samples) {}

double Profiler::to_us(std::chrono::steady_clock::time_point t) const {
  return std::chrono::duration<double, std::micro>(t - epoch_).count();
}

double Profiler::now_us() const {
  return to_us(std::chrono::steady_clock::now());
}

void Profiler::record(Span span) {
  std::lock_guard lock(mutex_);
  spans_.push(std::move(span));
}

void Profiler::record(MemorySample sample) {
  std::lock_guard lock(mutex_);
  memory_.push(sample);
}

std::vector<Span> Profiler::spans(size_t from, size_t* next) const {
  std::lock_guard lock(mutex_);
  return spans_.since(from, next);
}

std::vector<MemorySample> Profiler::memory_samples(size_t from, size_t* next) const {
  std::lock_guard lock(mutex_);
  return memory_.since(from, next);
}

size_t Profiler::span_count() const {
  std::lock_guard lock(mutex_);
  return spans_.end();
}

size_t Profiler::dropped_spans() const {
  std::lock_guard lock(mutex_);
  return spans_.dropped();
}

static std::string json_escape(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

// Chrome's trace-event format wants integer pids; give each device one, in a stable order.
static int device_pid(Device d) {
  return (d.is_cuda() ? 1000 : 0) + d.index + 1;
}

std::string Profiler::chrome_trace_json() const {
  std::vector<Span> all = spans();
  std::vector<MemorySample> mem = memory_samples();
  // Every device gets its compute and copy lanes named; the collective lane only where an all-reduce ran.
  std::map<Device, std::set<StreamKind>> devices;
  for (const Span& s : all) devices[s.device].insert(s.stream);
  for (const MemorySample& m : mem) devices[m.device];

  std::string out = "{\"displayTimeUnit\":\"ms\",\"traceEvents\":[";
  bool first = true;
  auto add = [&](const std::string& event) {
    out += first ? "\n" : ",\n";
    out += event;
    first = false;
  };
  char buf[512];
  for (auto& [d, used] : devices) {
    int pid = device_pid(d);
    add("{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"args\":{\"name\":\"" +
        d.str() + "\"}}");
    used.insert({StreamKind::Compute, StreamKind::Copy});
    for (StreamKind s : used)
      add("{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" +
          std::to_string(static_cast<int>(s)) + ",\"args\":{\"name\":\"" + stream_name(s) + "\"}}");
  }
  for (const Span& s : all) {
    std::snprintf(buf, sizeof buf,
                  "\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f,\"args\":{\"bytes\":%lld,"
                  "\"flops\":%.0f,\"host_blocking\":%s",
                  device_pid(s.device), static_cast<int>(s.stream), s.start_us, s.end_us - s.start_us,
                  static_cast<long long>(s.bytes), s.flops, s.host_blocking ? "true" : "false");
    add("{\"name\":\"" + json_escape(s.name) + "\",\"cat\":\"" + json_escape(s.tag.empty() ? "op" : s.tag) +
        "\"," + buf + ",\"node\":\"" + json_escape(s.tag) + "\"}}");
  }
  for (const MemorySample& m : mem) {
    std::snprintf(buf, sizeof buf,
                  "{\"name\":\"memory\",\"ph\":\"C\",\"pid\":%d,\"ts\":%.3f,\"args\":{\"allocated\":%lld,"
                  "\"reserved\":%lld}}",
                  device_pid(m.device), m.t_us, static_cast<long long>(m.allocated),
                  static_cast<long long>(m.reserved));
    add(buf);
  }
  out += "\n]";
  // A trace of the newest spans only says so, where trace viewers show a file's metadata.
  if (const size_t dropped = dropped_spans())
    out += ",\"otherData\":{\"dropped_spans\":\"" + std::to_string(dropped) + " older spans were not kept\"}";
  out += "}\n";
  return out;
}

void Profiler::write_chrome_trace(const std::string& path) const {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error("cannot write trace to " + path);
  f << chrome_trace_json();
  if (!f.flush()) throw Error("failed writing trace to " + path);
}

}  // namespace gn
