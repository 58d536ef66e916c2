#include "host_reducer.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"

namespace gn::nn::trainer_parts {

HostReducer::HostReducer(Runtime& rt, dist::World* world, VarPtr order)
    : rt_(rt), world_(world), order_(std::move(order)) {}

void HostReducer::allreduce(const std::vector<std::vector<Tensor>>& grads) {
  const size_t replicas = grads.size(), count = grads.front().size();
  if (count == 0) return;
  std::vector<std::vector<Tensor>> host(replicas);
  std::vector<Tensor> sums;  // host copies of the sums for replicas on GPUs
  std::vector<VarPtr> reads, writes;
  bool any_gpu = false;
  for (size_t r = 0; r < replicas; ++r) {
    for (size_t i = 0; i < count; ++i) {
      const Tensor& g = grads[r][i];
      if (g.device().is_cpu()) {
        host[r].push_back(g);
        writes.push_back(g.var());
      } else {
        host[r].push_back(copy(g, Device::cpu(), /*non_blocking=*/true));
        writes.push_back(host[r].back().var());  // only replica 0's is written, but nobody else uses them
        any_gpu = true;
      }
    }
  }
  if (any_gpu)
    for (size_t i = 0; i < count; ++i) {
      sums.push_back(Tensor(rt_, grads[0][i].shape(), Device::cpu()));
      writes.push_back(sums.back().var());
    }
  if (world_) writes.push_back(order_);
  int64_t bytes = 0;
  for (const auto& g : grads[0]) bytes += g.bytes() * static_cast<int64_t>(replicas + 1);
  std::vector<bool> on_cpu(replicas);
  for (size_t r = 0; r < replicas; ++r) on_cpu[r] = grads[r][0].device().is_cpu();
  dist::World* world = world_;
  rt_.engine().push(
      [host, sums, on_cpu, world](OpContext& ctx) {
        ctx.check_cancelled();
        // ((g0 + g1) + g2) ... accumulated into replica 0's buffer: the same sum everywhere.
        for (size_t i = 0; i < host[0].size(); ++i) {
          const size_t n = static_cast<size_t>(host[0][i].numel());
          float* acc = host[0][i].data();
          for (size_t r = 1; r < host.size(); ++r) {
            const float* src = host[r][i].data();
            for (size_t j = 0; j < n; ++j) acc[j] += src[j];
          }
        }
        if (world) {
          size_t total = 0;
          for (const Tensor& t : host[0]) total += static_cast<size_t>(t.numel());
          std::vector<float> flat(total);
          size_t at = 0;
          for (const Tensor& t : host[0]) {
            std::memcpy(flat.data() + at, t.data(), static_cast<size_t>(t.numel()) * sizeof(float));
            at += static_cast<size_t>(t.numel());
          }
          world->allreduce_sum(flat.data(), flat.size(), "the gradient all-reduce",
                               dist::World::Channel::Engine, [&ctx] { return ctx.cancelled(); });
          at = 0;
          for (const Tensor& t : host[0]) {
            std::memcpy(t.data(), flat.data() + at, static_cast<size_t>(t.numel()) * sizeof(float));
            at += static_cast<size_t>(t.numel());
          }
        }
        for (size_t i = 0; i < host[0].size(); ++i) {
          const size_t n = static_cast<size_t>(host[0][i].numel());
          const float* acc = host[0][i].data();
          for (size_t r = 1; r < host.size(); ++r)
            if (on_cpu[r]) std::memcpy(host[r][i].data(), acc, n * sizeof(float));
          if (!sums.empty()) std::memcpy(sums[i].data(), acc, n * sizeof(float));
        }
      },
      reads, writes, Device::cpu(), StreamKind::Collective,
      {world ? "all-reduce (host + mpi)" : "all-reduce (host)", "", bytes, 0});
  if (any_gpu)
    for (size_t r = 0; r < replicas; ++r)
      for (size_t i = 0; i < count; ++i)
        if (!grads[r][i].device().is_cpu()) copy_into(grads[r][i], sums[i]);
}

ChosenReducer choose_reducer(Runtime& rt, const std::vector<Device>& devices, dist::World* world,
                             VarPtr order) {
  ChosenReducer chosen;
  if (devices.size() < 2 && !world) {
    chosen.name = "none";
    return chosen;
  }
  const bool all_cuda = std::all_of(devices.begin(), devices.end(), [](Device d) { return d.is_cuda(); });
  std::string nccl_failure;
  if (all_cuda) {
    try {
      chosen.reducer = make_nccl_reducer(rt, devices, world, order);
    } catch (const BackendError& e) {
      // NCCL refusing (an odd topology, a driver problem) costs speed, not correctness: reduce on the host.
      // Across ranks every rank must take the same path; a refusal on one is a failure of the job there.
      if (world) throw;
      nccl_failure = e.what();
    }
  }
  if (chosen.reducer) {
    chosen.name = "nccl";
  } else {
    chosen.reducer = std::make_unique<HostReducer>(rt, world, std::move(order));
    chosen.name = nccl_failure.empty() ? "host" : "host (NCCL failed: " + nccl_failure + ")";
  }
  if (world)
    chosen.name += " + mpi (" + std::to_string(world->size()) + (world->size() == 1 ? " rank)" : " ranks)");
  return chosen;
}

}  // namespace gn::nn::trainer_parts
