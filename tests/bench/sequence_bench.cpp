// Recurrent training on the CPU against PyTorch, measured in the same run: see sequence_bench.h.
#include "sequence_bench.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "bench_util.h"
#include "gpunodes/nn/trainer.h"

namespace gn::bench {
namespace {

using namespace gn::nn;

constexpr int64_t kVocab = 28, kSteps = 35, kHidden = 256, kLmBatch = 32;
constexpr int64_t kRowsBatch = 256, kRowsHidden = 128;

LayerSpec layer(const std::string& id, LayerKind kind, std::vector<int> inputs) {
  LayerSpec l;
  l.id = id;
  l.kind = kind;
  l.inputs = std::move(inputs);
  return l;
}

// d2l 9.6 / 10.2's language model: one-hot tokens, a GRU, a Linear on every step.
std::shared_ptr<const NetworkSpec> gru_language_model() {
  NetworkSpec n;
  n.layers.push_back(layer("x", LayerKind::Input, {}));
  n.layers.back().shape = {kSteps};
  n.layers.push_back(layer("onehot", LayerKind::OneHot, {0}));
  n.layers.back().features = kVocab;
  n.layers.push_back(layer("gru", LayerKind::GRU, {1}));
  n.layers.back().features = kHidden;
  n.layers.push_back(layer("fc", LayerKind::Linear, {2}));
  n.layers.back().features = kVocab;
  return std::make_shared<const NetworkSpec>(n);
}

// Fashion-MNIST's rows as 28 steps: Reshape, an LSTM, the last step, a Linear.
std::shared_ptr<const NetworkSpec> lstm_rows() {
  NetworkSpec n;
  n.layers.push_back(layer("x", LayerKind::Input, {}));
  n.layers.back().shape = {1, 28, 28};
  n.layers.push_back(layer("rows", LayerKind::Reshape, {0}));
  n.layers.back().shape = {28, 28};
  n.layers.push_back(layer("lstm", LayerKind::LSTM, {1}));
  n.layers.back().features = kRowsHidden;
  n.layers.push_back(layer("last", LayerKind::LastStep, {2}));
  n.layers.push_back(layer("fc", LayerKind::Linear, {3}));
  n.layers.back().features = 10;
  return std::make_shared<const NetworkSpec>(n);
}

// A batch as the loader hands it over: token windows and their next tokens, or images and labels.
HostBatchPtr batch_of(int64_t n, const Shape& sample, const Shape& target, int64_t classes, bool tokens) {
  auto b = std::make_shared<HostBatch>();
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

struct Measured {
  double step_seconds = 0;
  double live_mib = 0, peak_mib = 0;
};

// The best window of training steps (d2l's SGD with clipping for the language model, Adam for the rows), and
// the memory a step peaks at against what its forward keeps for backward.
Measured our_steps(const std::shared_ptr<const NetworkSpec>& net, const HostBatchPtr& b, bool adam, int windows,
                   int steps, int threads) {
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

// torch's seconds per step for the same two models, or negative without torch.
std::pair<double, double> torch_steps(int threads, int windows, int steps) {
  const std::string script = R"PY(
import sys, time
import torch
from torch import nn
from torch.nn import functional as F
torch.set_num_threads(int(sys.argv[1])); windows = int(sys.argv[2]); steps = int(sys.argv[3])
class LM(nn.Module):
    def __init__(s):
        super().__init__(); s.gru = nn.GRU(28, 256, batch_first=True); s.fc = nn.Linear(256, 28)
    def forward(s, X):
        return s.fc(s.gru(F.one_hot(X, 28).float())[0])
class Rows(nn.Module):
    def __init__(s):
        super().__init__(); s.lstm = nn.LSTM(28, 128, batch_first=True); s.fc = nn.Linear(128, 10)
    def forward(s, X):
        return s.fc(s.lstm(X.reshape(-1, 28, 28))[0][:, -1])
def bench(net, X, y, opt, clip):
    loss = nn.CrossEntropyLoss()
    def step():
        opt.zero_grad(); out = net(X); l = loss(out.reshape(-1, out.shape[-1]), y.reshape(-1)); l.backward()
        if clip: nn.utils.clip_grad_norm_(net.parameters(), 1)
        opt.step()
    for _ in range(3): step()
    best = 1e30
    for _ in range(windows):
        t = time.perf_counter()
        for _ in range(steps): step()
        best = min(best, (time.perf_counter() - t) / steps)
    return best
lm = LM(); rows = Rows()
a = bench(lm, torch.randint(0, 28, (32, 35)), torch.randint(0, 28, (32, 35)), torch.optim.SGD(lm.parameters(), lr=1), True)
b = bench(rows, torch.rand(256, 1, 28, 28), torch.randint(0, 10, (256,)), torch.optim.Adam(rows.parameters(), lr=1e-3), False)
print(a, b)
)PY";
  const std::string path = "/tmp/gn_sequence_bench_" + std::to_string(getpid()) + ".py";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fputs(script.c_str(), f);
    std::fclose(f);
  } else {
    return {-1, -1};
  }
  const std::string cmd = "/usr/bin/python3 " + path + " " + std::to_string(threads) + " " + std::to_string(windows) +
                          " " + std::to_string(steps) + " 2>/dev/null";
  std::pair<double, double> out{-1, -1};
  {
    std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
    if (!p || std::fscanf(p.get(), "%lf %lf", &out.first, &out.second) != 2) out = {-1, -1};
  }
  std::remove(path.c_str());
  return out;
}

}  // namespace

void sequence_rows(int threads, int steps) {
  const int windows = 4, window_steps = std::max(2, steps / 8);
  const HostBatchPtr lm_batch = batch_of(kLmBatch, {kSteps}, {kSteps}, kVocab, true);
  const HostBatchPtr rows_batch = batch_of(kRowsBatch, {1, 28, 28}, {}, 10, false);
  // Two rounds, ours then torch's, keeping the best of each (see the CNN rows).
  Measured gru, lstm;
  gru.step_seconds = lstm.step_seconds = 1e30;
  std::pair<double, double> torch{-1, -1};
  for (int round = 0; round < 2; ++round) {
    const Measured g = our_steps(gru_language_model(), lm_batch, false, windows, window_steps, threads);
    if (g.step_seconds < gru.step_seconds) gru = g;
    const Measured l = our_steps(lstm_rows(), rows_batch, true, windows, window_steps, threads);
    if (l.step_seconds < lstm.step_seconds) lstm = l;
    const auto t = torch_steps(threads, windows, window_steps);
    if (t.first > 0) torch.first = torch.first > 0 ? std::min(torch.first, t.first) : t.first;
    if (t.second > 0) torch.second = torch.second > 0 ? std::min(torch.second, t.second) : t.second;
  }
  auto per_second = [](double s, double n) { return s > 0 ? n / s : -1.0; };
  auto cell = [](double v) { return v > 0 ? fmt("%.0f", v) : std::string("n/a"); };
  auto ratio = [](double a, double b) { return a > 0 && b > 0 ? fmt("%.2f", a / b) : std::string("-"); };
  const double tokens = static_cast<double>(kLmBatch * kSteps);
  row("GRU language model, training tokens/s", cell(per_second(gru.step_seconds, tokens)),
      cell(per_second(torch.first, tokens)), ratio(torch.first, gru.step_seconds), ">= 1.5");
  row("LSTM on Fashion-MNIST rows, images/s", cell(per_second(lstm.step_seconds, kRowsBatch)),
      cell(per_second(torch.second, kRowsBatch)), ratio(torch.second, lstm.step_seconds), ">= 1.5");
  row("GRU step: peak MiB / live MiB", fmt("%.1f", gru.peak_mib), fmt("%.1f", gru.live_mib),
      fmt("%.2f", gru.peak_mib / gru.live_mib), "<= 1.2");
  row("LSTM rows step: peak MiB / live MiB", fmt("%.1f", lstm.peak_mib), fmt("%.1f", lstm.live_mib),
      fmt("%.2f", lstm.peak_mib / lstm.live_mib), "<= 1.2");
}

}  // namespace gn::bench
