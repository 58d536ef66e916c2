// What the training benchmarks share (train_bench.cpp, sequence_bench.cpp, attention_bench.cpp): timing, the
// table's rows, drawn networks trained through the Trainer with their steps' memory, and the PyTorch peer.
#pragma once
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "gpunodes/nn/trainer.h"

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

// One layer of a drawn network: its id, kind and inputs (indices of earlier layers, in port order).
inline nn::LayerSpec layer(const std::string& id, nn::LayerKind kind, std::vector<int> inputs) {
  nn::LayerSpec l;
  l.id = id;
  l.kind = kind;
  l.inputs = std::move(inputs);
  return l;
}

// A batch as the loader hands it over: token windows and their next tokens (tokens), or values in [0, 1) and
// class labels.
inline nn::HostBatchPtr batch_of(int64_t n, const Shape& sample, const Shape& target, int64_t classes,
                                 bool tokens) {
  auto b = std::make_shared<nn::HostBatch>();
  int64_t per_sample = 1, per_target = 1;
  for (int64_t d : sample) per_sample *= d;
  for (int64_t d : target) per_target *= d;
  auto* mem = new float[static_cast<size_t>(n * (per_sample + per_target))];
  b->storage = std::shared_ptr<void>(mem, [](void* p) { delete[] static_cast<float*>(p); });
  std::mt19937 g(7);
  for (int64_t i = 0; i < n * per_sample; ++i)
    mem[i] = tokens ? static_cast<float>(g() % classes) : std::uniform_real_distribution<float>(0, 1)(g);
  for (int64_t i = 0; i < n * per_target; ++i) mem[n * per_sample + i] = static_cast<float>(g() % classes);
  b->size = n;
  b->sample_shape = sample;
  b->target_shape = target;
  b->images = mem;
  b->labels = mem + n * per_sample;
  return b;
}

// What our_steps measured: seconds per step, and the memory a step peaks at against its live set.
struct Measured {
  double step_seconds = 0;
  double live_mib = 0, peak_mib = 0;
};

// The best window of training steps of a drawn network on a cpu:0 of `threads` cores (Adam lr 1e-3, or SGD
// lr 1 with clipping at 1 as d2l trains its language models), and the memory a step peaks at against what its
// forward keeps for backward: the live set is what stays allocated after a training forward (parameters,
// gradients, optimizer state and the saved activations), the peak is over 3 steps after it.
inline Measured our_steps(const std::shared_ptr<const nn::NetworkSpec>& net, const nn::HostBatchPtr& b,
                          bool adam, int windows, int steps, int threads) {
  using namespace gn::nn;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Runtime rt(RuntimeOptions{.cpu_devices = std::max(1, cores / std::max(1, threads))});
  ModelOptions o;
  o.arch = Arch::Network;
  o.network = net;
  auto model = Model::create(rt, o, Device::cpu());
  TrainOptions to;
  to.batch_size = b->size;
  if (adam) {
    to.optimizer.kind = OptimizerKind::Adam;
    to.optimizer.lr = 1e-3;
  } else {
    to.optimizer.lr = 1;
    to.clip_grad_norm = 1;
  }
  Trainer trainer(*model, {Device::cpu()}, to);
  for (int i = 0; i < 3; ++i) trainer.step(b);
  trainer.synchronize();
  Measured m;
  m.step_seconds = 1e30;
  for (int w = 0; w < windows; ++w) {
    const auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) trainer.step(b);
    trainer.synchronize();
    m.step_seconds = std::min(m.step_seconds, seconds_since(t0) / steps);
  }
  constexpr double kMiB = 1 << 20;
  {
    DeviceBatch db = to_device(rt, b, 0, b->size, Device::cpu());
    Tensor out = model->forward(db.images, Mode::Train);
    rt.engine().wait_all();
    m.live_mib = static_cast<double>(rt.memory_stats(Device::cpu()).allocated_bytes.current) / kMiB;
    model->clear_cache();
  }
  rt.engine().wait_all();
  rt.reset_peak_memory();
  for (int i = 0; i < 3; ++i) trainer.step(b);
  trainer.synchronize();
  m.peak_mib = static_cast<double>(rt.memory_stats(Device::cpu()).allocated_bytes.peak) / kMiB;
  return m;
}

// The PyTorch peer: runs `script` with Debian's /usr/bin/python3 (python3-torch) and `args`, and reads the
// `count` numbers it prints; all -1 when torch or the script fails.
inline std::vector<double> python_peer(const std::string& name, const std::string& script,
                                       const std::vector<std::string>& args, int count) {
  std::vector<double> out(static_cast<size_t>(count), -1);
  const std::string path = "/tmp/gn_" + name + "_" + std::to_string(getpid()) + ".py";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fputs(script.c_str(), f);
    std::fclose(f);
  } else {
    return out;
  }
  std::string cmd = "/usr/bin/python3 " + path;
  for (const std::string& a : args) cmd += " " + a;
  cmd += " 2>/dev/null";
  {
    std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
    for (int i = 0; p && i < count; ++i)
      if (std::fscanf(p.get(), "%lf", &out[static_cast<size_t>(i)]) != 1) {
        out.assign(static_cast<size_t>(count), -1);
        break;
      }
  }
  std::remove(path.c_str());
  return out;
}

// The smaller of two measured seconds where each may be missing (negative).
inline double best_of(double a, double b) {
  return a > 0 && b > 0 ? std::min(a, b) : std::max(a, b);
}

// Where a training step's time goes on our side: the engine's op spans on cpu:0 (of `threads` cores) over
// `steps` steps of model `o` under `to`, summed by op name, printed as a table, largest first, with the
// step's wall time and the time in ops (the difference is where the worker waited for the host).
inline void print_step_profile(const std::string& what, const nn::ModelOptions& o, const nn::TrainOptions& to,
                               const nn::HostBatchPtr& b, int threads, int steps) {
  using namespace gn::nn;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  Runtime rt(RuntimeOptions{.cpu_devices = std::max(1, cores / std::max(1, threads))});
  auto model = Model::create(rt, o, Device::cpu());
  Trainer trainer(*model, {Device::cpu()}, to);
  for (int i = 0; i < 3; ++i) trainer.step(b);
  trainer.synchronize();
  const size_t from = rt.profiler().span_count();
  const auto t0 = Clock::now();
  for (int i = 0; i < steps; ++i) trainer.step(b);
  trainer.synchronize();
  const double wall_ms = seconds_since(t0) * 1e3 / steps;
  struct Total {
    double ms = 0;
    int64_t count = 0;
  };
  std::map<std::string, Total> by_op;
  double busy_ms = 0;
  for (const Span& s : rt.profiler().spans(from)) {
    if (!s.device.is_cpu()) continue;
    Total& t = by_op[s.name];
    t.ms += (s.end_us - s.start_us) * 1e-3 / steps;
    t.count += 1;
    busy_ms += (s.end_us - s.start_us) * 1e-3 / steps;
  }
  std::vector<std::pair<std::string, Total>> sorted(by_op.begin(), by_op.end());
  std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.second.ms > y.second.ms; });
  std::printf("\n%s on cpu:0, op spans per step (%.2f ms wall, %.2f ms in ops)\n\n", what.c_str(), wall_ms,
              busy_ms);
  row("op", "ms / step", "ops / step", "share", "");
  for (const auto& [name, t] : sorted)
    row(name, fmt("%.3f", t.ms), fmt("%.0f", static_cast<double>(t.count) / steps), fmt("%.2f", t.ms / busy_ms),
        "");
}

}  // namespace gn::bench
