// Tensor (make tensors on a device) and Copy (the seed's copyto and as_in_ctx / .to()).
#include <QJsonArray>
#include <algorithm>
#include <cmath>

#include "gpunodes/errors.h"
#include "gpunodes/ops.h"
#include "node_util.h"
#include "tensor_ops.h"

namespace gn::nodes {
namespace {

using core::PortType;

class TensorNode final : public GpuNode {
 public:
  TensorNode()
      : GpuNode({
            .name = "Tensor",
            .category = "Tensors",
            .description = "Creates tensors on a device (float32). With a Devices input it makes one set per "
                           "device; with count > 1 its output is a batch that downstream nodes map over.",
            .inputs = {inPort("device", PortType::Devices,
                              "Where to create the tensors: a Device, or Devices for one set on each. Open: "
                              "the CPU, where tensors live by default.",
                              false)},
            .outputs = {outPort("out", PortType::Tensor, "The tensors: count per device, in device order.")},
            .params =
                {
                    shapeParam("shape", QJsonArray{2, 3}, "Dimensions, outermost first, e.g. [4000, 4000]."),
                    enumParam(
                        "init", {"zeros", "ones", "uniform", "normal", "arange", "values"}, "uniform",
                        "How to fill: zeros, ones, uniform(low, high), normal(mean, std), arange(start, "
                        "step) in row-major order, or the listed values."),
                    intParam(
                        "seed", 0, 0, 9007199254740991.0,
                        "Random seed for uniform and normal. The same seed gives the same values on every "
                        "device; element i of the batch uses seed + i."),
                    floatParam("low", 0.0, "uniform: the lower bound."),
                    floatParam("high", 1.0, "uniform: the upper bound (above low)."),
                    floatParam("mean", 0.0, "normal: the mean."),
                    floatParam("std", 1.0, "normal: the standard deviation (at least 0)."),
                    floatParam("start", 0.0, "arange: the first value."),
                    floatParam("step", 1.0, "arange: the difference between neighbours."),
                    stringParam("values", "",
                                "values: the numbers, row-major, separated by commas or spaces; as many as "
                                "the shape has elements (\"1, 2, 3, 4, 5, 6\" for [2, 3])."),
                    intParam("count", 1, 1, 100000,
                             "Tensors per device: the batch size. Each gets its own storage."),
                },
        }, Reuse::Pure) {}

  QStringList validateParams(const QJsonObject& params) const override {
    QStringList problems;
    auto shape = shapeOf(params["shape"]);
    int64_t numel = -1;
    if (!shape) {
      problems.append("shape: must be a list of whole numbers such as [2, 3]");
    } else {
      try {
        numel = checked_numel(*shape);
        const double total = static_cast<double>(numel) * sizeof(float) * params["count"].toDouble();
        if (total > 9.0e18) problems.append("shape x count: the batch's size overflows 64 bits");
      } catch (const ShapeError& e) {
        problems.append("shape: " + QString::fromUtf8(e.what()));
      }
    }
    for (const char* name : {"low", "high", "mean", "std", "start", "step"})
      if (!std::isfinite(params[name].toDouble(std::nan(""))))
        problems.append(QString(name) + ": must be a finite number");
    const QString init = params["init"].toString();
    if (init == "uniform" && params["low"].toDouble() > params["high"].toDouble())
      problems.append("low: must not be above high");
    if (init == "normal" && params["std"].toDouble() < 0) problems.append("std: must not be negative");
    if (init == "values") {
      QString error;
      auto values = parseValues(params["values"].toString(), &error);
      if (!values) {
        problems.append("values: " + error);
      } else if (numel >= 0 && static_cast<int64_t>(values->size()) != numel) {
        problems.append(QString("values: the shape %1 needs %2 values, not %3")
                            .arg(qs(shape_str(*shape)))
                            .arg(numel)
                            .arg(values->size()));
      }
    }
    return problems;
  }

  // One set of tensors per device wired in (the CPU when open), each set refused when it cannot fit.
  Outputs check(NodeCheck& check) const override {
    const QJsonObject& p = check.params();
    Known t;
    t.isTensors = true;
    const std::optional<Known> dev = check.input("device");
    std::vector<Device> devices = dev ? dev->devices : std::vector<Device>{Device::cpu()};
    t.shape = shapeOf(p["shape"]);
    const qint64 count = p["count"].toInteger();
    if (!devices.empty() && (!dev || dev->isDevices)) {
      t.devices = devices;
      if (dev && devices.size() == 1) t.deviceOutput = dev->deviceOutput;
      t.count = double(count) * double(devices.size());
      // A batch refused here is unknown downstream, so that its consumers do not say the same again.
      if (t.shape)
        for (const Device& d : devices)
          if (!check.checkFits("params.shape", d, double(count), *t.shape, "the batch of")) {
            t.shape.reset();
            t.count.reset();
            break;
          }
    }
    return {{"out", t}};
  }

  void execute(core::NodeContext& ctx) const override {
    NodesSession& session = sessionOf(ctx);
    Runtime& rt = session.runtime();
    const QJsonObject& p = ctx.params();
    auto shape = shapeOf(p["shape"]);
    if (!shape) throw Error("shape: must be a list of whole numbers");
    const int64_t numel = checked_numel(*shape);
    std::vector<Device> devices = deviceInput(ctx, "device");
    if (devices.empty()) devices.push_back(Device::cpu());
    const int64_t count = p["count"].toInteger();
    for (const Device& d : devices) {
      if (!rt.has(d)) throw Error("no such device: " + d.str());
      ensureFits(rt, d, count, numel * static_cast<int64_t>(sizeof(float)), "Tensor");
    }
    const QString init = p["init"].toString();
    std::vector<float> values;
    if (init == "values") {
      QString error;
      auto parsed = parseValues(p["values"].toString(), &error);
      if (!parsed) throw Error(("values: " + error).toStdString());
      values = std::move(*parsed);
    }
    const uint64_t seed = static_cast<uint64_t>(p["seed"].toInteger());
    const auto f = [&](const char* name) { return static_cast<float>(p[name].toDouble()); };
    std::vector<Tensor> out;
    for (const Device& d : devices) {
      for (int64_t i = 0; i < count; ++i) {
        if (ctx.cancelled()) throw CancelledError();
        if (init == "zeros")
          out.push_back(zeros(rt, *shape, d));
        else if (init == "ones")
          out.push_back(ones(rt, *shape, d));
        else if (init == "uniform")
          out.push_back(uniform(rt, *shape, d, seed + i, f("low"), f("high")));
        else if (init == "normal")
          out.push_back(normal(rt, *shape, d, seed + i, f("mean"), f("std")));
        else if (init == "arange")
          out.push_back(arangeShaped(rt, *shape, d, f("start"), f("step")));
        else if (init == "values")
          out.push_back(from_values(rt, *shape, d, values));
        else
          throw Error("init: unknown value " + init.toStdString());
      }
    }
    setTensors(ctx, "out", std::move(out));
  }
};

class CopyNode final : public GpuNode {
 public:
  CopyNode()
      : GpuNode({
            .name = "Copy",
            .category = "Tensors",
            .description =
                "Moves each tensor of the batch to a device. Nothing else ever copies: ops on "
                "tensors from two devices fail instead. mode copy is the seed's copyto (always new "
                "memory); mode to is as_in_ctx / .to() (the very same tensor when it is already "
                "there).",
            .inputs = {inPort("in", PortType::Tensor, "The tensors to move."),
                       inPort("device", PortType::Device, "The target device.")},
            .outputs = {outPort("out", PortType::Tensor,
                                "The tensors on the target device, in input order.")},
            .params =
                {
                    enumParam(
                        "mode", {"copy", "to"}, "copy",
                        "copy: always allocates and copies, even onto the same device (copyto). to: "
                        "returns the input itself when it is already on the device (as_in_ctx, .to())."),
                    boolParam("non_blocking", false,
                              "false: the copy runs after the source device's queued work and the host waits "
                              "for it, tensor by tensor. true: copies go on the copy stream, through pinned "
                              "memory for GPUs, and overlap compute; the host does not wait."),
                },
        }) {}

  // The batch on the target device; copying it needs room there.
  Outputs check(NodeCheck& check) const override {
    Known t = check.inputOrUnknown("in");
    t.isTensors = true;
    const std::optional<Known> target = check.input("device");
    const bool toMode = check.params()["mode"].toString() == "to";
    const std::optional<Device> from = t.single();
    t.devices.clear();
    t.deviceOutput.reset();
    if (target && target->isDevices && target->devices.size() == 1) {
      t.placeLike(*target);
      // mode to on the same device copies nothing; everything else needs room on the target.
      if (t.shape && t.count && !(toMode && from == t.devices.front()))
        check.checkFits("inputs.device", t.devices.front(), double(*t.count), *t.shape, "copying");
    }
    return {{"out", t}};
  }

  void execute(core::NodeContext& ctx) const override {
    auto in = tensorInput(ctx, "in");
    const std::vector<Device> target = deviceInput(ctx, "device");
    if (target.size() != 1) throw Error("input device must carry exactly one device");
    const bool toMode = ctx.params()["mode"].toString() == "to";
    const bool nonBlocking = ctx.params()["non_blocking"].toBool();
    int64_t count = 0, bytesEach = 0;
    for (const Tensor& t : in->tensors())
      if (!toMode || t.device() != target[0]) ++count, bytesEach = std::max(bytesEach, t.bytes());
    ensureFits(sessionOf(ctx).runtime(), target[0], count, bytesEach, "Copy");
    std::vector<Tensor> out;
    QJsonArray same;
    for (const Tensor& t : in->tensors()) {
      if (ctx.cancelled()) throw CancelledError();
      out.push_back(toMode ? to(t, target[0], nonBlocking) : copy(t, target[0], nonBlocking));
      same.append(out.back().is_same(t));
    }
    // Per element: whether the output is the input itself (to mode on the same device): the seed's
    // `Z.as_in_ctx(try_gpu(1)) is Z`.
    ctx.reportField("same_as_input", same);
    setTensors(ctx, "out", std::move(out));
  }
};

}  // namespace

core::IssueFix copyFix(const core::Endpoint& input, Device device, const core::Endpoint& deviceOutput) {
  return core::IssueFix{
      .label = QString("Insert Copy node: %1 to %2").arg(input.port, qs(device.str())),
      .nodeType = "Copy",
      .params = {},
      .input = input,
      .throughInput = "in",
      .throughOutput = "out",
      .alsoWired = {{.port = "device", .source = deviceOutput}},
  };
}

core::NodeTypePtr makeTensorNode() {
  return std::make_shared<TensorNode>();
}
core::NodeTypePtr makeCopyNode() {
  return std::make_shared<CopyNode>();
}

}  // namespace gn::nodes
