// Device and AllDevices: the seed's try_gpu(i) and try_all_gpus() as nodes.
#include <QJsonArray>

#include "gpunodes/errors.h"
#include "node_util.h"

namespace gn::nodes {
namespace {

using core::PortType;

// The devices as the cache key sees them: each one's name, kind, memory and cores.
QByteArray deviceIdentity(Runtime& rt, const std::vector<Device>& devices) {
  QByteArray out;
  for (const Device& d : devices) {
    const DeviceInfo& info = rt.info(d);
    out += QString("%1|%2|%3|%4|%5;")
               .arg(qs(d.str()), qs(info.name), qs(info.compute_capability))
               .arg(info.total_memory)
               .arg(info.cores)
               .toUtf8();
  }
  return out;
}

class DeviceNode final : public GpuNode {
 public:
  DeviceNode()
      : GpuNode({
            .name = "Device",
            .category = "Devices",
            .description =
                "One device, as d2l's try_gpu(i) picks it: cuda:i when that GPU exists; otherwise, with "
                "fallback on, the CPU device i mod cpu_devices (a warning on the node).",
            .inputs = {},
            .outputs = {outPort("device", PortType::Device, "The device: cuda:N, cpu or cpu:N.")},
            .params =
                {
                    enumParam(
                        "kind", {"gpu", "cpu"}, "gpu",
                        "gpu: the CUDA device `index` (try_gpu). cpu: the CPU device `index`; the CPU is "
                        "split into settings.cpu_devices devices."),
                    intParam("index", 0, 0, 1023, "Which device of that kind, from 0."),
                    boolParam("fallback", true,
                              "When the GPU does not exist: true uses try_gpu's CPU fallback with a warning; "
                              "false makes it an error."),
                },
        }, Reuse::Pure) {}

  // What the device is, not only its name: a GPU that vanished (the node now falls back to a CPU device)
  // or a different card under the same index is a change for everything downstream.
  QByteArray cacheIdentity(const QJsonObject& p, core::RunSession* session) const override {
    auto* nodes = dynamic_cast<NodesSession*>(session);
    if (!nodes) return {};
    Runtime& rt = nodes->runtime();
    const DeviceChoice c = resolveDevice(p["kind"].toString(), p["index"].toInteger(), p["fallback"].toBool(),
                                         rt.cuda_device_count(), rt.cpu_device_count());
    return c.device ? deviceIdentity(rt, {*c.device}) : c.message.toUtf8();
  }

  // A device that does not exist is an error; try_gpu's fallback a warning.
  Outputs check(NodeCheck& check) const override {
    const QJsonObject& p = check.params();
    const DeviceChoice c = resolveDevice(p["kind"].toString(), p["index"].toInteger(), p["fallback"].toBool(),
                                         check.catalog().cudaCount(), check.catalog().cpuCount());
    if (!c.device) {
      check.error(p["kind"].toString() == "cpu" ? "params.index" : "params.fallback", c.message);
      return {};
    }
    if (c.fellBack) check.warning("params.index", c.message);
    Known device = Known::deviceList({*c.device});
    device.deviceOutput = core::Endpoint{check.id(), "device"};
    return {{"device", device}};
  }

  void execute(core::NodeContext& ctx) const override {
    Runtime& rt = sessionOf(ctx).runtime();
    const QJsonObject& p = ctx.params();
    DeviceChoice c = resolveDevice(p["kind"].toString(), p["index"].toInteger(), p["fallback"].toBool(),
                                   rt.cuda_device_count(), rt.cpu_device_count());
    if (!c.device) throw Error(c.message.toStdString());
    // The fallback warning comes from the checks before the run (validateGraph), which the host puts on the
    // node; saying it again here would only repeat it.
    ctx.reportField("resolved", qs(c.device->str()));
    ctx.reportField("fallback", c.fellBack);
    ctx.setOutput("device", std::make_shared<DeviceValue>(std::vector<Device>{*c.device}));
  }
};

class AllDevicesNode final : public GpuNode {
 public:
  AllDevicesNode()
      : GpuNode({
            .name = "AllDevices",
            .category = "Devices",
            .description = "Every GPU, or every CPU device when there is none (a warning on the node): d2l's "
                           "try_all_gpus().",
            .inputs = {},
            .outputs = {outPort("devices", PortType::Devices, "The devices, GPUs first.")},
            .params = {intParam("count", 0, 0, 1024,
                                "Use only the first `count` devices; 0 takes them all.")},
        }, Reuse::Pure) {}

  QByteArray cacheIdentity(const QJsonObject& p, core::RunSession* session) const override {
    Q_UNUSED(p);
    auto* nodes = dynamic_cast<NodesSession*>(session);
    return nodes ? deviceIdentity(nodes->runtime(), nodes->runtime().try_all_gpus()) : QByteArray();
  }

  // The devices try_all_gpus() would give, with a warning when that is the CPU fallback.
  Outputs check(NodeCheck& check) const override {
    std::vector<Device> all;
    for (const DeviceInfo& i : check.catalog().devices)
      if (i.device.is_cuda()) all.push_back(i.device);
    if (all.empty()) {
      for (int i = 0; i < check.catalog().cpuCount(); ++i) all.push_back(Device::cpu(i));
      check.warning(QString(), QString("no GPU: try_all_gpus() falls back to the %1 CPU device%2")
                                   .arg(all.size())
                                   .arg(all.size() == 1 ? "" : "s"));
    }
    const qint64 count = check.params()["count"].toInteger();
    if (count > 0 && static_cast<size_t>(count) < all.size()) all.resize(static_cast<size_t>(count));
    return {{"devices", Known::deviceList(all)}};
  }

  void execute(core::NodeContext& ctx) const override {
    Runtime& rt = sessionOf(ctx).runtime();
    std::vector<Device> devices = rt.try_all_gpus();
    const qint64 count = ctx.params()["count"].toInteger();
    if (count > 0 && static_cast<size_t>(count) < devices.size()) devices.resize(static_cast<size_t>(count));
    QJsonArray names;
    for (const Device& d : devices) names.append(qs(d.str()));
    ctx.reportField("resolved", names);
    ctx.setOutput("devices", std::make_shared<DeviceValue>(std::move(devices)));
  }
};

}  // namespace

core::NodeTypePtr makeDeviceNode() {
  return std::make_shared<DeviceNode>();
}
core::NodeTypePtr makeAllDevicesNode() {
  return std::make_shared<AllDevicesNode>();
}

}  // namespace gn::nodes
