// Vision Transformer training on the CPU against PyTorch, measured in the same run: see attention_bench.h.
#include "attention_bench.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "bench_util.h"

namespace gn::bench {
namespace {

using namespace gn::nn;

constexpr int64_t kBatch = 128, kWidth = 64, kPatch = 4, kHeads = 4, kMlp = 128, kBlocks = 2;

// resources/examples/vit-fashion-mnist.json without its dropouts: the patches (Conv2d with stride = kernel =
// patch, Reshape [E, 49], Transpose to [49, E]), the class token, the learned positions, two pre-norm blocks
// (x + MHA(LN(x)), then x + MLP(LN(x)) with GELU), LayerNorm, the class token's features, Linear 10.
std::shared_ptr<const NetworkSpec> vit() {
  NetworkSpec n;
  auto add = [&](const std::string& id, LayerKind kind, std::vector<int> inputs) -> LayerSpec& {
    n.layers.push_back(layer(id, kind, std::move(inputs)));
    return n.layers.back();
  };
  auto last = [&] { return static_cast<int>(n.layers.size()) - 1; };
  add("x", LayerKind::Input, {}).shape = {1, 28, 28};
  LayerSpec& patches = add("patches", LayerKind::Conv2d, {last()});
  patches.features = kWidth, patches.kernel = kPatch, patches.stride = kPatch;
  const int64_t grid = (28 / kPatch) * (28 / kPatch);
  add("grid", LayerKind::Reshape, {last()}).shape = {kWidth, grid};
  LayerSpec& steps = add("steps", LayerKind::Transpose, {last()});
  steps.dim0 = 0, steps.dim1 = 1;
  add("cls", LayerKind::ClassToken, {last()});
  add("pos", LayerKind::PositionEmbedding, {last()});
  for (int b = 1; b <= kBlocks; ++b) {
    const std::string p = "block" + std::to_string(b) + "_";
    const int in = last();
    add(p + "ln1", LayerKind::LayerNorm, {in});
    add(p + "attn", LayerKind::MultiheadAttention, {last()}).heads = kHeads;
    add(p + "add1", LayerKind::Add, {in, last()});
    const int mid = last();
    add(p + "ln2", LayerKind::LayerNorm, {mid});
    add(p + "fc1", LayerKind::Linear, {last()}).features = kMlp;
    add(p + "act", LayerKind::GELU, {last()});
    add(p + "fc2", LayerKind::Linear, {last()}).features = kWidth;
    add(p + "add2", LayerKind::Add, {mid, last()});
  }
  add("ln", LayerKind::LayerNorm, {last()});
  add("first", LayerKind::FirstStep, {last()});
  add("head", LayerKind::Linear, {last()}).features = 10;
  return std::make_shared<const NetworkSpec>(n);
}

// torch's seconds per step for the same ViT, or negative without torch.
double torch_steps(int threads, int windows, int steps) {
  const std::string script = R"PY(
import sys, time
import torch
from torch import nn
torch.set_num_threads(int(sys.argv[1])); windows = int(sys.argv[2]); steps = int(sys.argv[3])
class ViT(nn.Module):
    def __init__(s, patch=4, width=64, heads=4, mlp=128, blocks=2):
        super().__init__()
        s.patches = nn.Conv2d(1, width, patch, stride=patch)
        s.cls = nn.Parameter(torch.zeros(1, 1, width))
        s.pos = nn.Parameter(torch.randn(1, (28 // patch) ** 2 + 1, width))
        s.blocks = nn.Sequential(*[nn.TransformerEncoderLayer(width, heads, mlp, dropout=0, activation="gelu",
                                   batch_first=True, norm_first=True) for _ in range(blocks)])
        s.ln = nn.LayerNorm(width); s.head = nn.Linear(width, 10)
    def forward(s, X):
        X = s.patches(X).flatten(2).transpose(1, 2)
        X = torch.cat((s.cls.expand(X.shape[0], -1, -1), X), 1) + s.pos
        return s.head(s.ln(s.blocks(X))[:, 0])
net = ViT(); X = torch.rand(128, 1, 28, 28); y = torch.randint(0, 10, (128,))
opt = torch.optim.Adam(net.parameters(), lr=1e-3); loss = nn.CrossEntropyLoss()
def step():
    opt.zero_grad(); l = loss(net(X), y); l.backward(); opt.step()
for _ in range(3): step()
best = 1e30
for _ in range(windows):
    t = time.perf_counter()
    for _ in range(steps): step()
    best = min(best, (time.perf_counter() - t) / steps)
print(best)
)PY";
  return python_peer("attention_bench", script,
                     {std::to_string(threads), std::to_string(windows), std::to_string(steps)}, 1)[0];
}

// Where a ViT step's time goes on our side: the engine's op spans of `steps` steps summed by op name.
void profile_steps(const HostBatchPtr& b, int threads, int steps) {
  ModelOptions o;
  o.arch = Arch::Network;
  o.network = vit();
  TrainOptions to;
  to.batch_size = b->size;
  to.optimizer.kind = OptimizerKind::Adam;
  to.optimizer.lr = 1e-3;
  print_step_profile("ViT step", o, to, b, threads, steps);
}

}  // namespace

void attention_rows(int threads, int steps, bool profile) {
  const int windows = 4, window_steps = std::max(2, steps / 8);
  const HostBatchPtr batch = batch_of(kBatch, {1, 28, 28}, {}, 10, false);
  // Two rounds, ours then torch's, keeping the best of each (see the CNN rows).
  Measured ours;
  ours.step_seconds = 1e30;
  double torch = -1;
  for (int round = 0; round < 2; ++round) {
    const Measured m = our_steps(vit(), batch, true, windows, window_steps, threads);
    if (m.step_seconds < ours.step_seconds) ours = m;
    torch = best_of(torch, torch_steps(threads, windows, window_steps));
  }
  const double n = static_cast<double>(kBatch);
  row("ViT (patch 4, E 64, 2 blocks), images/s", fmt("%.0f", n / ours.step_seconds),
      torch > 0 ? fmt("%.0f", n / torch) : std::string("n/a"),
      torch > 0 ? fmt("%.2f", torch / ours.step_seconds) : std::string("-"), ">= 1.5");
  row("ViT step: peak MiB / live MiB", fmt("%.1f", ours.peak_mib), fmt("%.1f", ours.live_mib),
      fmt("%.2f", ours.peak_mib / ours.live_mib), "<= 1.2");
  if (profile) profile_steps(batch, threads, window_steps);
}

}  // namespace gn::bench
