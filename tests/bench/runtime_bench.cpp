// Runtime benchmarks: each row against a peer measured in the same run. Not pass/fail: it prints a table.
//   matmul through the runtime vs cblas_sgemm called directly
//   a 2048^2 bf16 matmul vs torch's bf16 matmul (bfloat16 tensors), where oneDNN's ISA has bf16; the row names
//   that ISA, and says why it is missing elsewhere
//   engine overhead per tiny op vs PyTorch eager on the CPU (python3-torch), when installed
//   a 1000x1000 uniform fill vs torch.rand, when installed
//   two independent matmul chains on cpu_devices=2: parallel vs sequential wall time
//   1000 x (100^2 matmul + norm): a blocking host read each step vs one read at the end
#include <cblas.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "gpunodes/ops.h"
#include "gpunodes/precision.h"

using namespace gn;
using Clock = std::chrono::steady_clock;

namespace {

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

// Best of `reps` timings of fn(), in seconds.
template <class F>
double best_of(int reps, F&& fn) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) {
    auto t0 = Clock::now();
    fn();
    best = std::min(best, seconds_since(t0));
  }
  return best;
}

void row(const char* measure, const std::string& ours, const std::string& peer, const std::string& ratio,
         const char* goal) {
  std::printf("| %-44s | %14s | %14s | %7s | %-8s |\n", measure, ours.c_str(), peer.c_str(), ratio.c_str(),
              goal);
}

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

// PyTorch eager's cost per tiny op on this machine, in microseconds; negative when torch is absent.
// Debian's python3-torch is installed for the system interpreter, not for a pyenv python3 on PATH.
double torch_tiny_op_us() {
  const char* script =
      "/usr/bin/python3 -c \"import torch,time\n"
      "torch.set_num_threads(1)\nx=torch.ones(1)\n"
      "for _ in range(2000): x=x*1.0001+0.0\n"
      "t=time.perf_counter()\nfor _ in range(20000): x=x*1.0001\n"
      "print((time.perf_counter()-t)/20000*1e6)\" 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(script, "r"), pclose);
  double us = -1;
  if (p && std::fscanf(p.get(), "%lf", &us) != 1) us = -1;
  return us;
}

// torch.rand(1000, 1000) on the CPU, best of 20, in milliseconds, with as many threads as ours use;
// negative when torch is absent.
double torch_rand_ms(int threads) {
  const std::string script =
      "/usr/bin/python3 -c \"import torch,time\n"
      "torch.set_num_threads(" +
      std::to_string(threads) +
      ")\n"
      "b=1e9\nfor _ in range(25):\n t=time.perf_counter(); x=torch.rand(1000,1000); "
      "b=min(b,time.perf_counter()-t)\n"
      "print(b*1e3)\" 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(script.c_str(), "r"), pclose);
  double ms = -1;
  if (p && std::fscanf(p.get(), "%lf", &ms) != 1) ms = -1;
  return ms;
}

// torch.matmul of two bfloat16 n x n matrices on the CPU, best of 5, in milliseconds, with `threads`
// threads; negative when torch is absent.
double torch_bf16_matmul_ms(int n, int threads) {
  const std::string script =
      "/usr/bin/python3 -c \"import torch,time\n"
      "torch.set_num_threads(" +
      std::to_string(threads) + ")\nn=" + std::to_string(n) +
      "\na=torch.rand(n,n).bfloat16(); b=torch.rand(n,n).bfloat16(); c=a@b\n"
      "best=1e9\nfor _ in range(5):\n t=time.perf_counter(); c=a@b; best=min(best,time.perf_counter()-t)\n"
      "print(best*1e3)\" 2>/dev/null";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(script.c_str(), "r"), pclose);
  double ms = -1;
  if (p && std::fscanf(p.get(), "%lf", &ms) != 1) ms = -1;
  return ms;
}

}  // namespace

int main() {
  std::printf("gpunodes runtime benchmark (CPU)\n\n");
  row("measure", "gpunodes", "peer", "ratio", "goal");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(46, '-').c_str(), std::string(16, '-').c_str(),
              std::string(16, '-').c_str(), std::string(9, '-').c_str(), std::string(10, '-').c_str());

  {
    Runtime rt;
    for (int n : {100, 512, 1024, 2048}) {
      // About a tenth of a second of products on each side (500 turns at n = 100, 5 at 2048): on a shared
      // machine a best of 20 turns of a 15 us product rarely met a quiet moment.
      const int reps = std::max(5, static_cast<int>(2e10 / (2.0 * n * n * n)));
      const double flops = 2.0 * n * n * n;
      Tensor a = uniform(rt, {n, n}, Device::cpu(), 1), b = uniform(rt, {n, n}, Device::cpu(), 2);
      std::vector<float> ha = to_host(a), hb = to_host(b), hc(static_cast<size_t>(n) * n);
      // Ours and the peer take turns, so that both meet the same moments of a shared machine.
      double ours = 1e30, peer = 1e30;
      for (int r = 0; r < reps; ++r) {
        ours = std::min(ours, best_of(1, [&] {
                          Tensor c = matmul(a, b);
                          rt.engine().wait(c.var());
                        }));
        peer = std::min(peer, best_of(1, [&] {
                          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, ha.data(), n,
                                      hb.data(), n, 0.0f, hc.data(), n);
                        }));
      }
      row(("matmul n=" + std::to_string(n) + " GFLOP/s vs cblas_sgemm").c_str(),
          fmt("%.1f", flops / ours / 1e9), fmt("%.1f", flops / peer / 1e9), fmt("%.2f", peer / ours),
          ">= 0.95");
    }
  }

  {
    // Our operands are float32 tensors, so our time includes rounding them to bf16; torch's are bfloat16
    // already.
    const int n = 2048;
    const std::string what = "matmul 2048^2 bf16 (ms) vs torch bf16 [" + cpu_dnnl_isa() + "]";
    if (!cpu_native_bf16()) {
      row(what.c_str(), "refused", "-", "-", ">= 0.95");
      std::printf("(bf16 row not measured: oneDNN's ISA here, %s, has no bf16)\n", cpu_dnnl_isa().c_str());
    } else {
      Runtime rt;
      Tensor a = uniform(rt, {n, n}, Device::cpu(), 1), b = uniform(rt, {n, n}, Device::cpu(), 2);
      const MatMulOptions bf16{.precision = Precision::Bf16};
      rt.engine().wait(matmul(a, b, bf16).var());  // builds oneDNN's kernel once
      const double ours = best_of(5, [&] {
        Tensor c = matmul(a, b, bf16);
        rt.engine().wait(c.var());
      });
      const double torch_ms = torch_bf16_matmul_ms(n, rt.info(Device::cpu()).cores);
      // Speed ratio: torch's time over ours, so >= 1 means at least as fast.
      row(what.c_str(), fmt("%.1f", ours * 1e3), torch_ms > 0 ? fmt("%.1f", torch_ms) : "n/a",
          torch_ms > 0 ? fmt("%.2f", torch_ms / (ours * 1e3)) : "-", ">= 0.95");
    }
  }

  {
    Runtime rt;
    const int ops = 20000;
    Tensor x = ones(rt, {1}, Device::cpu());
    for (int i = 0; i < 1000; ++i) x = scale_shift(x, 1.0001f, 0);  // warm up workers and allocator
    rt.engine().wait_all();
    auto t0 = Clock::now();
    for (int i = 0; i < ops; ++i) x = scale_shift(x, 1.0001f, 0);
    rt.engine().wait_all();
    double us = seconds_since(t0) / ops * 1e6;
    double torch_us = torch_tiny_op_us();
    row("engine overhead per tiny op (us) vs PyTorch", fmt("%.2f", us),
        torch_us > 0 ? fmt("%.2f", torch_us) : "n/a", torch_us > 0 ? fmt("%.2f", us / torch_us) : "-",
        "<= 2 us, < 1");
  }

  {
    // A fresh tensor each time, as torch.rand allocates one: the allocation is part of both.
    Runtime rt;
    (void)to_host(uniform(rt, {1000, 1000}, Device::cpu(), 1));  // warm up the workers
    const double ours = best_of(25, [&] {
      Tensor x = uniform(rt, {1000, 1000}, Device::cpu(), 2);
      rt.engine().wait(x.var());
    });
    const double torch_ms = torch_rand_ms(rt.info(Device::cpu()).cores);
    row("uniform fill 1000x1000 (ms) vs torch.rand", fmt("%.2f", ours * 1e3),
        torch_ms > 0 ? fmt("%.2f", torch_ms) : "n/a", torch_ms > 0 ? fmt("%.2f", ours * 1e3 / torch_ms) : "-",
        "<= 1.5");
  }

  {
    auto two_chains = [](Schedule s) {
      Runtime rt({.cpu_devices = 2, .schedule = s});
      std::vector<Tensor> x;
      for (int d = 0; d < 2; ++d) x.push_back(uniform(rt, {768, 768}, Device::cpu(d), d));
      rt.engine().wait_all();
      auto t0 = Clock::now();
      for (int d = 0; d < 2; ++d)
        for (int i = 0; i < 10; ++i) x[d] = scale_shift(matmul(x[d], x[d]), 1e-3f, 0);
      rt.engine().wait_all();
      return seconds_since(t0);
    };
    double par = two_chains(Schedule::Parallel), seq = two_chains(Schedule::Sequential);
    row("two chains on 2 CPU devices: parallel/sequential (s)", fmt("%.3f", par), fmt("%.3f", seq),
        fmt("%.2f", par / seq), "<= 0.55");
  }

  {
    auto log_per_step = [](bool read_each_step) {
      Runtime rt;
      Tensor x = uniform(rt, {100, 100}, Device::cpu(), 3);
      rt.engine().wait_all();
      auto t0 = Clock::now();
      Tensor total = zeros(rt, {}, Device::cpu());  // the at-end variant keeps its log on the device
      for (int i = 0; i < 1000; ++i) {
        Tensor n = frobenius_norm(matmul(x, x));
        if (read_each_step)
          (void)item(n);
        else
          total = add(total, n);
      }
      (void)item(total);
      return seconds_since(t0);
    };
    double each = log_per_step(true), end = log_per_step(false);
    row("1000 x (100^2 matmul + norm): read each step/at end (s)", fmt("%.3f", each), fmt("%.3f", end),
        fmt("%.2f", each / end), "-");
  }
  return 0;
}
