// Recurrent training on the CPU against PyTorch, measured in the same run: see sequence_bench.h.
#include "sequence_bench.h"

#include <algorithm>
#include <string>
#include <utility>

#include "bench_util.h"

namespace gn::bench {
namespace {

using namespace gn::nn;

constexpr int64_t kVocab = 28, kSteps = 35, kHidden = 256, kLmBatch = 32;
constexpr int64_t kRowsBatch = 256, kRowsHidden = 128;

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
  const auto t = python_peer("sequence_bench", script,
                             {std::to_string(threads), std::to_string(windows), std::to_string(steps)}, 2);
  return {t[0], t[1]};
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
    torch.first = best_of(torch.first, t.first);
    torch.second = best_of(torch.second, t.second);
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
