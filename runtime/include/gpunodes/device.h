// Devices: where tensors live and ops run. Printed like PyTorch: cpu, cpu:1, cuda:0.
#pragma once
#include <compare>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace gn {

enum class DeviceKind { Cpu, Cuda };

struct Device {
  DeviceKind kind = DeviceKind::Cpu;
  int index = 0;

  static Device cpu(int i = 0) { return {DeviceKind::Cpu, i}; }
  static Device cuda(int i = 0) { return {DeviceKind::Cuda, i}; }
  bool is_cpu() const { return kind == DeviceKind::Cpu; }
  bool is_cuda() const { return kind == DeviceKind::Cuda; }
  // "cpu" for cpu:0 (the seed's name), "cpu:1", "cuda:0".
  std::string str() const;
  // Accepts "cpu", "cpu:N", "cuda", "cuda:N", "gpu:N"; nullopt otherwise.
  static std::optional<Device> parse(std::string_view text);
  auto operator<=>(const Device&) const = default;
};

// Each device has one compute stream, one copy stream and one collective stream (worker threads on the
// CPU). Gradient all-reduces get a stream of their own, as DDP gives NCCL one: a collective waiting on
// another rank then holds up neither the next layer's copies nor its compute, and the timeline shows the
// all-reduce spans on a lane of their own.
enum class StreamKind { Compute = 0, Copy = 1, Collective = 2 };
const char* stream_name(StreamKind s);

// What DeviceManager knows about a device. Fields that do not apply stay empty or zero.
struct DeviceInfo {
  Device device;
  std::string name;
  int64_t total_memory = 0;
  int64_t free_memory = 0;
  // CUDA only
  std::string compute_capability;
  int sm_count = 0;
  std::string driver_version, runtime_version, cublas_version, cudnn_version;
  // CPU only: the cores this device's workers may use (its 1/N share of the machine).
  int cores = 0;
  // Peak fp32 throughput and how it was derived, for "% of peak" in reports.
  double peak_gflops = 0;
  std::string peak_source;
};

}  // namespace gn
