// Training benchmarks on the CPU, each against a peer measured in the same run. Not pass/fail: it prints
// tables.
//   1. images/second training MLP and LeNet (batch 256), and ResNet-18 step time, vs PyTorch (Debian's
//      python3-torch for /usr/bin/python3) with the same model, batch and thread count.
//   2. Recurrent training (sequence_bench.h): a GRU language model's tokens/s and an LSTM on Fashion-MNIST rows,
//      vs torch's nn.GRU / nn.LSTM, and their steps' peak memory against the live set.
//   3. Attention (attention_bench.h): d2l 11.8's ViT at the quick settings (28x28, patch 4, width 64, 4
//      heads, 2 blocks, batch 128), images/s vs torch's nn.TransformerEncoderLayer, and its step's peak
//      memory against the live set.
//   3b. The memory section also times the ResNet-18 drawn layer by layer against the built-in one (images/s
//      and peak memory): the peer of a drawn network is the built-in network of the same structure.
//   4. The convolution choice: oneDNN (what the CPU kernels use) vs im2col + OpenBLAS sgemm, forward plus
//      backward, for the LeNet and ResNet-18 shapes.
//   5. bf16 on the CPU, where oneDNN's ISA has it (the rows name that ISA): MLP and LeNet images/s and the
//      ResNet-18 step under TrainOptions::precision bf16, vs torch.autocast("cpu", dtype=torch.bfloat16) with
//      channels_last (model and input), and the bf16 ResNet-18 step's peak memory against the fp32 step's.
//   6. With --gpu, where CUDA devices exist: one ResNet-18 epoch on Fashion-MNIST resized to 96 (the seed's
//      setting: batch 256, lr 0.1; and batch 512, lr 0.2 on two GPUs), seconds and test accuracy, next to
//      PyTorch on the same GPU when a CUDA build of torch is installed. The 1-GPU epoch runs once per
//      --precision, PyTorch with the matching setting (fp32: no TF32 anywhere; tf32: allow_tf32 for matmuls
//      and cuDNN; bf16 / fp16: autocast, and for fp16 GradScaler's dynamic loss scaling, as ours); the
//      2-GPU epoch in fp32 only.
//      The data comes from --data DIR (default: the dataset-fashion-mnist package); without it both sides
//      train on random images of the same shape, which times the same work but makes the accuracy
//      meaningless. --gpu-images N trains both sides on the first N training images only (a time-boxed
//      run); the test accuracy is always over the whole test set.
// Options: --threads N (default: all cores), --steps N (timed steps per model, default 40), --gpu, --no-cpu,
//          --data DIR, --precision LIST (comma separated fp32, tf32, bf16, fp16; default fp32),
//          --gpu-images N (default: all 60000), --only SECTION (one CPU section: cnn, memory, sequence,
//          attention, conv or bf16), --profile (the attention rows also print a ViT step's time by op, the
//          bf16 rows a ResNet-18 step's).
#include <cblas.h>
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "../runtime/drawn_networks.h"
#include "attention_bench.h"
#include "bench_util.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/trainer.h"
#include "gpunodes/precision.h"
#include "sequence_bench.h"

using namespace gn;
using namespace gn::nn;
using gn::bench::Clock;
using gn::bench::fmt;
using gn::bench::python_peer;
using gn::bench::row;
using gn::bench::seconds_since;

namespace {

void rule() {
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(42, '-').c_str(), std::string(14, '-').c_str(),
              std::string(14, '-').c_str(), std::string(9, '-').c_str(), std::string(9, '-').c_str());
}

// A fixed batch of random images and labels, as the loader would hand it over.
HostBatchPtr random_batch(int64_t n, int64_t c, int64_t side, uint64_t seed) {
  auto b = std::make_shared<HostBatch>();
  const int64_t numel = n * c * side * side;
  auto* mem = new float[static_cast<size_t>(numel + n)];
  b->storage = std::shared_ptr<void>(mem, [](void* p) { delete[] static_cast<float*>(p); });
  std::mt19937 g(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> u(0, 1);
  for (int64_t i = 0; i < numel; ++i) mem[i] = u(g);
  for (int64_t i = 0; i < n; ++i) mem[numel + i] = static_cast<float>(g() % 10);
  b->size = n, b->channels = c, b->height = side, b->width = side;
  b->images = mem;
  b->labels = mem + numel;
  return b;
}

// A runtime whose cpu:0 has `threads` cores: the machine split into cores/threads CPU devices.
RuntimeOptions with_threads(int threads) {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return {.cpu_devices = std::max(1, cores / std::max(1, threads))};
}

// Seconds per training step of `arch` through the Trainer (forward, loss, backward, SGD): the best window of
// `windows` windows of `steps` steps. Short windows and the best of them see past the other processes that
// share a small machine; PyTorch is timed the same way. With capture on, the steps after the warm-up replay
// one captured step (its recorded ops as one engine op).
// `drawn`, when given, is the network of Arch::Network.
double our_step_seconds(Arch arch, int64_t batch, int windows, int steps, int threads,
                        StepCapture capture = StepCapture::Off, Precision precision = Precision::Fp32,
                        std::shared_ptr<const NetworkSpec> drawn = nullptr) {
  Runtime rt(with_threads(threads));
  ModelOptions o;
  o.arch = arch;
  o.network = std::move(drawn);
  auto model = Model::create(rt, o, Device::cpu());
  TrainOptions to;
  to.batch_size = batch;
  to.capture = capture;
  to.precision = precision;
  Trainer trainer(*model, {Device::cpu()}, to);
  HostBatchPtr b = random_batch(batch, 1, 28, 1);
  for (int i = 0; i < 5; ++i) trainer.step(b);
  trainer.synchronize();
  double best = 1e30;
  for (int rep = 0; rep < windows; ++rep) {
    auto t0 = Clock::now();
    for (int i = 0; i < steps; ++i) trainer.step(b);
    trainer.synchronize();
    best = std::min(best, seconds_since(t0) / steps);
  }
  return best;
}

// What ResNet-18 training steps on cpu:0 hold at most, against the live set a step needs: the parameters,
// their gradients, the optimizer's state and the activations a training forward keeps for backward. The
// live set is read as what stays allocated after a training forward, once a step has made the gradients:
// the model keeps exactly those activations until backward.
struct StepMemory {
  double live_mib = 0, peak_mib = 0;
  double scratch_mib = 0;  // the CPU kernels' scratch the steps left held (cpu_kernel_scratch_bytes())
};

StepMemory resnet_step_memory(int threads, int steps, Precision precision = Precision::Fp32,
                              std::shared_ptr<const NetworkSpec> drawn = nullptr) {
  const double scratch_before = static_cast<double>(cpu_kernel_scratch_bytes());
  Runtime rt(with_threads(threads));
  ModelOptions o;
  o.arch = drawn ? Arch::Network : Arch::ResNet18;
  o.network = std::move(drawn);
  auto model = Model::create(rt, o, Device::cpu());
  TrainOptions to;
  to.batch_size = 32;
  to.precision = precision;
  Trainer trainer(*model, {Device::cpu()}, to);
  HostBatchPtr b = random_batch(32, 1, 28, 1);
  trainer.step(b);
  trainer.synchronize();
  constexpr double kMiB = 1 << 20;
  StepMemory m;
  {
    ScopedPrecision scope(precision);
    DeviceBatch db = to_device(rt, b, 0, b->size, Device::cpu());
    Tensor logits = model->forward(db.images, Mode::Train);
    rt.engine().wait_all();
    m.live_mib = static_cast<double>(rt.memory_stats(Device::cpu()).allocated_bytes.current) / kMiB;
  }
  trainer.step(b);  // lets go of that forward's activations
  trainer.synchronize();
  rt.reset_peak_memory();
  for (int i = 0; i < steps; ++i) trainer.step(b);
  trainer.synchronize();
  m.peak_mib = static_cast<double>(rt.memory_stats(Device::cpu()).allocated_bytes.peak) / kMiB;
  m.scratch_mib = (static_cast<double>(cpu_kernel_scratch_bytes()) - scratch_before) / kMiB;
  return m;
}

// d2l's ResNet-18 for Fashion-MNIST in PyTorch (3x3 stem, no max-pool), the peer of ours: both scripts use
// it.
constexpr const char* kTorchResNet18 = R"PY(
class Residual(nn.Module):
    def __init__(self, i, o, use_1x1conv=False, strides=1):
        super().__init__()
        self.conv1 = nn.Conv2d(i, o, 3, padding=1, stride=strides)
        self.conv2 = nn.Conv2d(o, o, 3, padding=1)
        self.conv3 = nn.Conv2d(i, o, 1, stride=strides) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2d(o); self.bn2 = nn.BatchNorm2d(o)
    def forward(self, X):
        Y = F.relu(self.bn1(self.conv1(X))); Y = self.bn2(self.conv2(Y))
        if self.conv3: X = self.conv3(X)
        return F.relu(Y + X)
def stage(i, o, first):
    return nn.Sequential(Residual(i, o, not first, 1 if first else 2), Residual(o, o))
def resnet18():
    return nn.Sequential(nn.Conv2d(1, 64, 3, 1, 1), nn.BatchNorm2d(64), nn.ReLU(), stage(64, 64, True),
        stage(64, 128, False), stage(128, 256, False), stage(256, 512, False), nn.AdaptiveAvgPool2d((1, 1)),
        nn.Flatten(), nn.Linear(512, 10))
)PY";

// PyTorch's seconds per step for the same models (d2l definitions), or negative when torch is missing.
std::vector<double> torch_step_seconds(int threads, int windows, int steps, int resnet_steps) {
  std::string script = R"PY(
import sys, time
import torch
from torch import nn
from torch.nn import functional as F
torch.set_num_threads(int(sys.argv[1])); windows = int(sys.argv[2]); steps = int(sys.argv[3]); rsteps = int(sys.argv[4])
)PY" + std::string(kTorchResNet18) +
                       R"PY(resnet = resnet18()
mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
lenet = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Conv2d(6, 16, 5),
    nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(400, 120), nn.Sigmoid(), nn.Linear(120, 84),
    nn.Sigmoid(), nn.Linear(84, 10))
def bench(net, n, windows, steps):
    X = torch.rand(n, 1, 28, 28); y = torch.randint(0, 10, (n,))
    opt = torch.optim.SGD(net.parameters(), lr=0.1); loss = nn.CrossEntropyLoss()
    def step():
        opt.zero_grad(); l = loss(net(X), y); l.backward(); opt.step()
    for _ in range(5): step()
    best = 1e30
    for _ in range(windows):
        t = time.perf_counter()
        for _ in range(steps): step()
        best = min(best, (time.perf_counter() - t) / steps)
    return best
print(bench(mlp, 256, windows, steps), bench(lenet, 256, windows, steps), bench(resnet, 32, 3, rsteps))
)PY";
  return python_peer(
      "train_bench", script,
      {std::to_string(threads), std::to_string(windows), std::to_string(steps), std::to_string(resnet_steps)},
      3);
}

// The same steps under torch.autocast("cpu", dtype=torch.bfloat16), model and input channels_last: the bf16
// peer. Seconds per step of the MLP, LeNet and ResNet-18, or negative when torch is missing.
std::vector<double> torch_bf16_step_seconds(int threads, int windows, int steps, int resnet_steps) {
  std::string script = R"PY(
import sys, time
import torch
from torch import nn
from torch.nn import functional as F
torch.set_num_threads(int(sys.argv[1])); windows = int(sys.argv[2]); steps = int(sys.argv[3]); rsteps = int(sys.argv[4])
)PY" + std::string(kTorchResNet18) +
                       R"PY(resnet = resnet18()
mlp = nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 10))
lenet = nn.Sequential(nn.Conv2d(1, 6, 5, padding=2), nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Conv2d(6, 16, 5),
    nn.Sigmoid(), nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(400, 120), nn.Sigmoid(), nn.Linear(120, 84),
    nn.Sigmoid(), nn.Linear(84, 10))
def bench(net, n, windows, steps):
    net = net.to(memory_format=torch.channels_last)
    X = torch.rand(n, 1, 28, 28).to(memory_format=torch.channels_last); y = torch.randint(0, 10, (n,))
    opt = torch.optim.SGD(net.parameters(), lr=0.1); loss = nn.CrossEntropyLoss()
    def step():
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            l = loss(net(X), y)
        l.backward(); opt.step()
    for _ in range(5): step()
    best = 1e30
    for _ in range(windows):
        t = time.perf_counter()
        for _ in range(steps): step()
        best = min(best, (time.perf_counter() - t) / steps)
    return best
print(bench(mlp, 256, windows, steps), bench(lenet, 256, windows, steps), bench(resnet, 32, 3, rsteps))
)PY";
  return python_peer(
      "train_bench_bf16", script,
      {std::to_string(threads), std::to_string(windows), std::to_string(steps), std::to_string(resnet_steps)},
      3);
}

// --- the convolution choice --------------------------------------------------------------------------------

struct ConvCase {
  const char* name;
  int64_t n, c, hw, k, r, stride, pad;
  bool need_dx;  // the first layer of a model needs no input gradient
};

// im2col + sgemm over the whole batch: cols [C*R*R, N*OH*OW], one GEMM per pass, then the NCHW shuffle.
double im2col_seconds(const ConvCase& cc, int reps) {
  const int64_t oh = (cc.hw + 2 * cc.pad - cc.r) / cc.stride + 1, p = oh * oh, kk = cc.c * cc.r * cc.r;
  const int64_t np = cc.n * p;
  std::vector<float> x(cc.n * cc.c * cc.hw * cc.hw, 0.5f), w(cc.k * kk, 0.1f), y(cc.n * cc.k * p),
      dy(y.size(), 0.2f);
  std::vector<float> cols(kk * np), ymat(cc.k * np), dx(x.size()), dw(w.size());
  auto im2col = [&] {
#pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < cc.n; ++i)
      for (int64_t ci = 0; ci < cc.c; ++ci)
        for (int64_t ky = 0; ky < cc.r; ++ky)
          for (int64_t kx = 0; kx < cc.r; ++kx) {
            float* dst = cols.data() + ((ci * cc.r + ky) * cc.r + kx) * np + i * p;
            const float* src = x.data() + (i * cc.c + ci) * cc.hw * cc.hw;
            for (int64_t oy = 0; oy < oh; ++oy) {
              const int64_t iy = oy * cc.stride - cc.pad + ky;
              for (int64_t ox = 0; ox < oh; ++ox) {
                const int64_t ix = ox * cc.stride - cc.pad + kx;
                dst[oy * oh + ox] =
                    iy >= 0 && iy < cc.hw && ix >= 0 && ix < cc.hw ? src[iy * cc.hw + ix] : 0.0f;
              }
            }
          }
  };
  auto once = [&] {
    im2col();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, cc.k, np, kk, 1, w.data(), kk, cols.data(), np, 0,
                ymat.data(), np);
#pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < cc.n; ++i)
      for (int64_t o = 0; o < cc.k; ++o)
        std::memcpy(&y[(i * cc.k + o) * p], &ymat[o * np + i * p], p * sizeof(float));
        // backward: dy to [K, N*P], dW = dy cols^T, dcols = W^T dy, col2im
#pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < cc.n; ++i)
      for (int64_t o = 0; o < cc.k; ++o)
        std::memcpy(&ymat[o * np + i * p], &dy[(i * cc.k + o) * p], p * sizeof(float));
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, cc.k, kk, np, 1, ymat.data(), np, cols.data(), np, 0,
                dw.data(), kk);
    if (!cc.need_dx) return;
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, kk, np, cc.k, 1, w.data(), kk, ymat.data(), np, 0,
                cols.data(), np);
    std::fill(dx.begin(), dx.end(), 0.0f);
#pragma omp parallel for collapse(2)
    for (int64_t i = 0; i < cc.n; ++i)
      for (int64_t ci = 0; ci < cc.c; ++ci)
        for (int64_t ky = 0; ky < cc.r; ++ky)
          for (int64_t kx = 0; kx < cc.r; ++kx) {
            const float* src = cols.data() + ((ci * cc.r + ky) * cc.r + kx) * np + i * p;
            float* dst = dx.data() + (i * cc.c + ci) * cc.hw * cc.hw;
            for (int64_t oy = 0; oy < oh; ++oy) {
              const int64_t iy = oy * cc.stride - cc.pad + ky;
              if (iy < 0 || iy >= cc.hw) continue;
              for (int64_t ox = 0; ox < oh; ++ox) {
                const int64_t ix = ox * cc.stride - cc.pad + kx;
                if (ix >= 0 && ix < cc.hw) dst[iy * cc.hw + ix] += src[oy * oh + ox];
              }
            }
          }
  };
  once();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    once();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

double onednn_seconds(Runtime& rt, const ConvCase& cc, int reps) {
  Device d = Device::cpu();
  Tensor x = uniform(rt, {cc.n, cc.c, cc.hw, cc.hw}, d, 1), w = uniform(rt, {cc.k, cc.c, cc.r, cc.r}, d, 2);
  Tensor b = zeros(rt, {cc.k}, d);
  Conv2dOptions o{cc.stride, cc.pad};
  auto once = [&] {
    Tensor y = conv2d(x, w, b, o);
    Conv2dGrads g = conv2d_backward(x, w, y, o, cc.need_dx);
    rt.engine().wait(g.dw.var());
  };
  once();
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    auto t0 = Clock::now();
    once();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

// PyTorch's seconds for one ResNet-18 epoch over the first `images` training images and its test accuracy on
// cuda:0 in `precision`, or {-1, -1} without torch+CUDA. The images are resized on the GPU (F.interpolate,
// bilinear), cuDNN autotuning on, as our Find.
std::pair<double, double> torch_gpu_epoch(int64_t batch, double lr, const std::string& data_dir,
                                          Precision precision, int64_t images) {
  const std::string script = R"PY(
import sys, time, gzip, contextlib
import numpy as np, torch
from torch import nn
from torch.nn import functional as F
if not torch.cuda.is_available(): sys.exit(1)
batch, lr, data, prec, n = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
torch.backends.cudnn.benchmark = True
# Our precisions: fp32 allows no TF32 (cuDNN's default would), tf32 allows it in cuBLAS and cuDNN; bf16 and
# fp16 run the convolutions and matmuls in half under autocast, and fp16 scales the loss (GradScaler's
# defaults, as ours). torch.amp.GradScaler is torch.cuda.amp.GradScaler's newer name (2.3 on).
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = prec == 'tf32'
half = {'bf16': torch.bfloat16, 'fp16': torch.float16}.get(prec)
amp = (lambda: torch.autocast('cuda', dtype=half)) if half else contextlib.nullcontext
scaler = (torch.amp.GradScaler('cuda', enabled=prec == 'fp16') if hasattr(torch.amp, 'GradScaler')
          else torch.cuda.amp.GradScaler(enabled=prec == 'fp16'))
dev = torch.device('cuda:0')
def load(p):
    if data == '-':  # no dataset here: random images and labels of the same shape
        n = 60000 if p == 'train' else 10000
        return torch.rand(n, 1, 28, 28, device=dev), torch.randint(0, 10, (n,), device=dev)
    d = data + '/'
    l = np.frombuffer(gzip.open(d + p + '-labels-idx1-ubyte.gz').read()[8:], dtype=np.uint8)
    x = np.frombuffer(gzip.open(d + p + '-images-idx3-ubyte.gz').read()[16:], dtype=np.uint8)
    return (torch.tensor(x.reshape(-1, 1, 28, 28).copy(), device=dev).float() / 255,
            torch.tensor(l.astype(np.int64), device=dev))
Xtr, ytr = load('train'); Xte, yte = load('t10k')
Xtr, ytr = Xtr[:n], ytr[:n]; n = len(ytr)
)PY" + std::string(kTorchResNet18) +
                             R"PY(net = resnet18().to(dev)
for m in net.modules():
    if type(m) in [nn.Linear, nn.Conv2d]: nn.init.normal_(m.weight, std=0.01)
opt = torch.optim.SGD(net.parameters(), lr=lr); loss = nn.CrossEntropyLoss()
big = lambda x: F.interpolate(x, size=96, mode='bilinear', align_corners=False)
net.train(); torch.cuda.synchronize(); t = time.perf_counter()
perm = torch.randperm(n, device=dev)
for i in range(0, n, batch):
    idx = perm[i:i + batch]; x = big(Xtr[idx])
    opt.zero_grad()
    with amp(): l = loss(net(x), ytr[idx])
    scaler.scale(l).backward(); scaler.step(opt); scaler.update()
torch.cuda.synchronize(); secs = time.perf_counter() - t
net.eval(); hit = 0
with torch.no_grad(), amp():
    for i in range(0, 10000, batch): hit += (net(big(Xte[i:i + batch])).argmax(1) == yte[i:i + batch]).sum().item()
print(secs, hit / 10000)
)PY";
  const std::string path = "/tmp/gn_train_bench_gpu_" + std::to_string(getpid()) + ".py";
  if (FILE* f = std::fopen(path.c_str(), "w")) {
    std::fputs(script.c_str(), f);
    std::fclose(f);
  } else {
    return {-1, -1};
  }
  std::pair<double, double> out{-1, -1};
  // A CUDA build of torch may live in the python3 on PATH rather than Debian's.
  for (const char* py : {"python3", "/usr/bin/python3"}) {
    const std::string cmd = std::string(py) + " " + path + " " + std::to_string(batch) + " " + fmt("%g", lr) +
                            " " + (data_dir.empty() ? "-" : data_dir) + " " + precision_name(precision) +
                            " " + std::to_string(images) + " 2>/dev/null";
    std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
    if (p && std::fscanf(p.get(), "%lf %lf", &out.first, &out.second) == 2) break;
    out = {-1, -1};
  }
  std::remove(path.c_str());
  return out;
}

// One 1-GPU epoch per precision (the peer's matching setting beside it), then the 2-GPU epoch in fp32.
// `images` > 0 trains on the first `images` training images only. False when a run of ours threw.
bool gpu_section(const std::string& data_arg, const std::vector<Precision>& precisions, int64_t images) {
  Runtime rt;
  const int gpus = rt.cuda_device_count();
  if (gpus == 0) {
    std::printf("\n(no CUDA device: the GPU section is skipped)\n");
    return true;
  }
  DatasetPtr train, test;
  std::string data_dir = data_arg.empty() ? default_fashion_mnist_dir() : data_arg;
  try {
    train = load_fashion_mnist(Split::Train, data_dir);
    test = load_fashion_mnist(Split::Test, data_dir);
  } catch (const Error& e) {
    std::printf("\n(%s\n -> random images instead: the times hold, the accuracies mean nothing)\n", e.what());
    train = make_synthetic({.count = 60000, .noise = 255});
    test = make_synthetic({.count = 10000, .seed = 1, .noise = 255});
    data_dir.clear();
  }
  train = take(train, images);
  std::printf("\nResNet-18, one epoch of Fashion-MNIST at 96x96 (%lld training images) on %s (%s)\n\n",
              static_cast<long long>(train->count), "cuda:0", rt.info(Device::cuda(0)).name.c_str());
  row("measure", "gpunodes", "PyTorch", "ratio", "");
  rule();
  const auto n_images = static_cast<double>(train->count);
  bool ok = true;
  auto epoch = [&](int n, Precision precision) {
    const std::string label =
        std::to_string(n) + " GPU" + (n > 1 ? "s" : "") + " " + precision_name(precision);
    try {
      ModelOptions mo;
      mo.arch = Arch::ResNet18;
      auto model = Model::create(rt, mo, Device::cuda(0));
      TrainOptions o;
      o.epochs = 1;
      o.batch_size = 256 * n;
      o.optimizer.lr = 0.1 * static_cast<double>(n);
      o.resize = 96;
      o.log_every = 0;
      o.precision = precision;
      std::vector<Device> devs;
      for (int i = 0; i < n; ++i) devs.push_back(Device::cuda(i));
      Trainer t(*model, devs, o);
      TrainResult r = t.fit(train, test);
      const EpochResult& e = r.epochs.back();
      std::pair<double, double> peer = n == 1 ? torch_gpu_epoch(256, 0.1, data_dir, precision, train->count)
                                              : std::pair<double, double>{-1, -1};
      const std::string l = label + (n > 1 ? " (" + t.reducer_name() + ")" : "");
      row("epoch seconds, " + l, fmt("%.2f", e.seconds), peer.first > 0 ? fmt("%.2f", peer.first) : "n/a",
          peer.first > 0 ? fmt("%.2f", peer.first / e.seconds) : "-", "");
      row("test accuracy after 1 epoch, " + l, fmt("%.4f", e.test_acc),
          peer.second > 0 ? fmt("%.4f", peer.second) : "n/a", "-", "");
      row("images/s, " + l, fmt("%.0f", e.images_per_second),
          peer.first > 0 ? fmt("%.0f", n_images / peer.first) : "n/a",
          peer.first > 0 ? fmt("%.2f", e.images_per_second / (n_images / peer.first)) : "-", "");
    } catch (const Error& e) {
      std::printf("(gpunodes failed at %s: %s)\n", label.c_str(), e.what());
      ok = false;
    }
    // A time-boxed caller may kill this run: what is printed so far must reach its log.
    std::fflush(stdout);
  };
  for (Precision p : precisions) epoch(1, p);
  if (gpus >= 2) epoch(2, Precision::Fp32);
  return ok;
}

}  // namespace

// Reads a comma-separated list of precisions into `out`; false, naming the culprit, at an unknown name.
bool parse_precisions(std::string_view list, std::vector<Precision>& out) {
  out.clear();
  while (true) {
    const std::string_view name = list.substr(0, list.find(','));
    const auto p = parse_precision(name);
    if (!p) {
      std::fprintf(stderr, "train_bench: unknown precision '%.*s' (fp32, tf32, bf16, fp16)\n",
                   static_cast<int>(name.size()), name.data());
      return false;
    }
    out.push_back(*p);
    if (name.size() == list.size()) return true;
    list.remove_prefix(name.size() + 1);
  }
}

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int steps = 40;
  bool gpu = false, cpu = true;
  std::string data_dir;
  std::vector<Precision> precisions{Precision::Fp32};
  int64_t gpu_images = 0;  // all
  std::string only;        // every CPU section
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    bool usage = false;
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--steps") && i + 1 < argc)
      steps = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--gpu"))
      gpu = true;
    else if (!std::strcmp(argv[i], "--no-cpu"))
      cpu = false;
    else if (!std::strcmp(argv[i], "--data") && i + 1 < argc)
      data_dir = argv[++i];
    else if (!std::strcmp(argv[i], "--precision") && i + 1 < argc)
      usage = !parse_precisions(argv[++i], precisions);
    else if (!std::strcmp(argv[i], "--gpu-images") && i + 1 < argc)
      gpu_images = std::atoll(argv[++i]), usage = gpu_images <= 0;
    else if (!std::strcmp(argv[i], "--only") && i + 1 < argc)
      only = argv[++i], usage = only != "cnn" && only != "memory" && only != "sequence" &&
                                only != "attention" && only != "conv" && only != "bf16";
    else if (!std::strcmp(argv[i], "--profile"))
      profile = true;
    else
      usage = true;
    if (usage) {
      std::fprintf(stderr,
                   "usage: train_bench [--threads N] [--steps N] [--gpu] [--no-cpu] [--data DIR]\n"
                   "                   [--precision fp32,tf32,bf16,fp16] [--gpu-images N]\n"
                   "                   [--only cnn|memory|sequence|attention|conv|bf16] [--profile]\n");
      return 2;
    }
  }
  if (!cpu) return gpu && !gpu_section(data_dir, precisions, gpu_images) ? 1 : 0;
  // Our cpu:0 gets `threads` cores (its worker's OpenMP count), PyTorch set_num_threads(threads), and the
  // im2col peer runs on this thread with omp_set_num_threads(threads).
  const int resnet_steps = std::max(2, steps / 16);
  std::printf("gpunodes training benchmark (CPU, %d threads, batch 256; ResNet-18 batch 32 at 28x28)\n",
              threads);
  auto section = [&](const char* name) { return only.empty() || only == name; };
  if (section("cnn")) {
    std::printf("\n");
    row("measure", "gpunodes", "PyTorch", "ratio", "goal");
    rule();
    // Two rounds, ours then PyTorch's, keeping the best of each: the other processes of a shared machine come
    // and go, and neither side should get only the busy moments.
    const int windows = 8, window_steps = std::max(2, steps / 4);
    double mlp = 1e30, lenet = 1e30, resnet = 1e30, mlp_captured = 1e30, lenet_captured = 1e30;
    std::vector<double> torch(3, -1);
    for (int round = 0; round < 2; ++round) {
      mlp = std::min(mlp, our_step_seconds(Arch::Mlp, 256, windows, window_steps, threads));
      mlp_captured = std::min(
          mlp_captured, our_step_seconds(Arch::Mlp, 256, windows, window_steps, threads, StepCapture::On));
      lenet = std::min(lenet, our_step_seconds(Arch::LeNet, 256, windows, window_steps, threads));
      lenet_captured = std::min(lenet_captured, our_step_seconds(Arch::LeNet, 256, windows, window_steps,
                                                                 threads, StepCapture::On));
      resnet = std::min(resnet, our_step_seconds(Arch::ResNet18, 32, 3, resnet_steps, threads));
      const auto t = torch_step_seconds(threads, windows, window_steps, resnet_steps);
      for (int i = 0; i < 3; ++i) torch[i] = gn::bench::best_of(torch[i], t[i]);
    }
    auto ips = [](double s, int64_t n) { return s > 0 ? static_cast<double>(n) / s : -1.0; };
    auto cell = [](double v, const char* f) { return v > 0 ? fmt(f, v) : std::string("n/a"); };
    auto ratio = [](double ours, double peer) {
      return ours > 0 && peer > 0 ? fmt("%.2f", ours / peer) : std::string("-");
    };
    row("MLP training, images/s", cell(ips(mlp, 256), "%.0f"), cell(ips(torch[0], 256), "%.0f"),
        ratio(ips(mlp, 256), ips(torch[0], 256)), ">= 2.0");
    row("LeNet training, images/s", cell(ips(lenet, 256), "%.0f"), cell(ips(torch[1], 256), "%.0f"),
        ratio(ips(lenet, 256), ips(torch[1], 256)), ">= 2.0");
    // The same steps replaying a captured one (capture on): what the engine's per-op work costs them.
    row("MLP, captured steps, images/s", cell(ips(mlp_captured, 256), "%.0f"),
        cell(ips(torch[0], 256), "%.0f"), ratio(ips(mlp_captured, 256), ips(torch[0], 256)), "-");
    row("LeNet, captured steps, images/s", cell(ips(lenet_captured, 256), "%.0f"),
        cell(ips(torch[1], 256), "%.0f"), ratio(ips(lenet_captured, 256), ips(torch[1], 256)), "-");
    // For step time lower is better: the ratio is PyTorch's time over ours, so >= 1 means at least as fast.
    row("ResNet-18 step (batch 32), ms", cell(resnet * 1e3, "%.1f"), cell(torch[2] * 1e3, "%.1f"),
        ratio(torch[2], resnet), ">= 1.5");
    if (torch[0] < 0)
      std::printf("\n(PyTorch not found for /usr/bin/python3: apt-get install python3-torch)\n");
  }
  if (section("memory")) {
    std::printf(
        "\nResNet-18 training steps (batch 32) on cpu:0: peak memory against the live set they need\n\n");
    row("measure", "peak MiB", "live MiB", "ratio", "goal");
    rule();
    const StepMemory mem = resnet_step_memory(threads, 3);
    row("allocated bytes, peak over 3 steps", fmt("%.1f", mem.peak_mib), fmt("%.1f", mem.live_mib),
        fmt("%.2f", mem.peak_mib / mem.live_mib), "<= 1.2");
    // The same ResNet-18 drawn layer by layer (as resources/examples/resnet18-layers.json draws it), against
    // the built-in one in the same run: a drawn network with the built-in structure runs with its layouts
    // and fusions (graph_module.cpp).
    const auto drawn = std::make_shared<const NetworkSpec>(resnet18(1, 28));
    const StepMemory drawn_mem = resnet_step_memory(threads, 3, Precision::Fp32, drawn);
    double built_in = 1e30, drawn_step = 1e30;
    for (int round = 0; round < 2; ++round) {
      built_in = std::min(built_in, our_step_seconds(Arch::ResNet18, 32, 3, resnet_steps, threads));
      drawn_step = std::min(drawn_step, our_step_seconds(Arch::Network, 32, 3, resnet_steps, threads,
                                                         StepCapture::Off, Precision::Fp32, drawn));
    }
    std::printf("\nThe drawn ResNet-18 (the resnet18-layers example's layers) against the built-in one\n\n");
    row("measure", "drawn", "built-in", "ratio", "goal");
    rule();
    row("training images/s (batch 32)", fmt("%.1f", 32 / drawn_step), fmt("%.1f", 32 / built_in),
        fmt("%.2f", built_in / drawn_step), ">= 1.0");
    row("peak MiB over 3 steps", fmt("%.1f", drawn_mem.peak_mib), fmt("%.1f", mem.peak_mib),
        fmt("%.2f", drawn_mem.peak_mib / mem.peak_mib), "<= 1.0");
    row("kernel scratch MiB (outside the allocator)", fmt("%.1f", drawn_mem.scratch_mib), fmt("%.1f", mem.scratch_mib),
        fmt("%.2f", drawn_mem.scratch_mib / mem.scratch_mib), "<= 1.0");
  }
  if (section("sequence")) {
    std::printf("\nRecurrent training on cpu:0 vs PyTorch (same models, batches and threads)\n\n");
    row("measure", "gpunodes", "PyTorch", "ratio", "goal");
    rule();
    gn::bench::sequence_rows(threads, steps);
  }
  if (section("attention")) {
    std::printf("\nAttention: a ViT's training on cpu:0 vs PyTorch (same model, batch and threads)\n\n");
    row("measure", "gpunodes", "PyTorch", "ratio", "goal");
    rule();
    gn::bench::attention_rows(threads, steps, profile);
  }
  if (section("bf16")) {
    std::printf("\nbf16 training on cpu:0 (oneDNN's ISA: %s) vs torch.autocast(\"cpu\", bfloat16), channels_last\n\n",
                cpu_dnnl_isa().c_str());
    if (!cpu_native_bf16()) {
      std::printf("(not measured: oneDNN's ISA here has no bf16, so bf16 is refused on this CPU)\n");
    } else {
      row("measure", "gpunodes", "PyTorch", "ratio", "goal");
      rule();
      const int windows = 8, window_steps = std::max(2, steps / 4);
      double mlp = 1e30, lenet = 1e30, resnet = 1e30;
      std::vector<double> torch(3, -1);
      for (int round = 0; round < 2; ++round) {
        mlp = std::min(mlp, our_step_seconds(Arch::Mlp, 256, windows, window_steps, threads, StepCapture::Off,
                                             Precision::Bf16));
        lenet = std::min(lenet, our_step_seconds(Arch::LeNet, 256, windows, window_steps, threads,
                                                 StepCapture::Off, Precision::Bf16));
        resnet = std::min(resnet, our_step_seconds(Arch::ResNet18, 32, 3, resnet_steps, threads, StepCapture::Off,
                                                   Precision::Bf16));
        const auto t = torch_bf16_step_seconds(threads, windows, window_steps, resnet_steps);
        for (int i = 0; i < 3; ++i) torch[i] = gn::bench::best_of(torch[i], t[i]);
      }
      auto ips = [](double s, int64_t n) { return s > 0 ? static_cast<double>(n) / s : -1.0; };
      auto cell = [](double v, const char* f) { return v > 0 ? fmt(f, v) : std::string("n/a"); };
      auto ratio = [](double ours, double peer) {
        return ours > 0 && peer > 0 ? fmt("%.2f", ours / peer) : std::string("-");
      };
      row("MLP bf16 training, images/s", cell(ips(mlp, 256), "%.0f"), cell(ips(torch[0], 256), "%.0f"),
          ratio(ips(mlp, 256), ips(torch[0], 256)), ">= 1.5");
      row("LeNet bf16 training, images/s", cell(ips(lenet, 256), "%.0f"), cell(ips(torch[1], 256), "%.0f"),
          ratio(ips(lenet, 256), ips(torch[1], 256)), ">= 1.5");
      row("ResNet-18 bf16 step (batch 32), ms", cell(resnet * 1e3, "%.1f"), cell(torch[2] * 1e3, "%.1f"),
          ratio(torch[2], resnet), ">= 1.5");
      const StepMemory fp32 = resnet_step_memory(threads, 3), bf16 = resnet_step_memory(threads, 3, Precision::Bf16);
      row("ResNet-18 step peak MiB: bf16 vs fp32", fmt("%.1f", bf16.peak_mib), fmt("%.1f", fp32.peak_mib),
          fmt("%.2f", bf16.peak_mib / fp32.peak_mib), "<= 0.6");
      if (torch[0] < 0) std::printf("\n(PyTorch not found for /usr/bin/python3: apt-get install python3-torch)\n");
      if (profile) {
        auto profile_of = [&](Arch arch, int64_t batch, const char* title, int steps_to_profile) {
          ModelOptions o;
          o.arch = arch;
          TrainOptions to;
          to.batch_size = batch;
          to.precision = Precision::Bf16;
          gn::bench::print_step_profile(title, o, to, random_batch(batch, 1, 28, 1), threads, steps_to_profile);
        };
        profile_of(Arch::Mlp, 256, "MLP bf16 step (batch 256)", 200);
        profile_of(Arch::ResNet18, 32, "ResNet-18 bf16 step (batch 32)", resnet_steps);
      }
    }
  }
  if (section("conv")) {
    std::printf("\nConvolution, forward + backward (ms): oneDNN (used) vs im2col + OpenBLAS sgemm\n\n");
    row("shape", "oneDNN", "im2col+gemm", "speedup", "");
    rule();
    omp_set_num_threads(threads);
    Runtime rt(with_threads(threads));
    const ConvCase cases[] = {
        {"LeNet conv1 1->6 5x5 p2 28^2 (no dx)", 256, 1, 28, 6, 5, 1, 2, false},
        {"LeNet conv2 6->16 5x5 14^2", 256, 6, 14, 16, 5, 1, 0, true},
        {"ResNet stem 1->64 3x3 28^2 (no dx)", 32, 1, 28, 64, 3, 1, 1, false},
        {"ResNet 64->64 3x3 28^2", 32, 64, 28, 64, 3, 1, 1, true},
        {"ResNet 64->128 3x3 s2 28^2", 32, 64, 28, 128, 3, 2, 1, true},
        {"ResNet 256->256 3x3 7^2", 32, 256, 7, 256, 3, 1, 1, true},
        {"ResNet 64->128 1x1 s2 (projection)", 32, 64, 28, 128, 1, 2, 0, true},
    };
    for (const ConvCase& cc : cases) {
      const double a = onednn_seconds(rt, cc, 5), b = im2col_seconds(cc, 5);
      row(cc.name, fmt("%.2f", a * 1e3), fmt("%.2f", b * 1e3), fmt("%.2f", b / a), "");
    }
  }
  return gpu && !gpu_section(data_dir, precisions, gpu_images) ? 1 : 0;
}
