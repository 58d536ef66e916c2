// Synchronize (the seed's synchronize / waitall) and Inspect (print a tensor, which costs a sync).
#include <QJsonArray>
#include <algorithm>
#include <map>

#include "gpunodes/errors.h"
#include "gpunodes/ops.h"
#include "node_util.h"
#include "tensor_ops.h"

namespace gn::nodes {
namespace {

using core::PortType;

class SynchronizeNode final : public GpuNode {
 public:
  SynchronizeNode()
      : GpuNode({
            .name = "Synchronize",
            .category = "Sync",
            .description =
                "A barrier: the host waits until its inputs are computed, like the seed's "
                "torch.cuda.synchronize() or npx.waitall(). Nodes after it are enqueued only then. "
                "The wait shows in the trace as a host-blocking span per device.",
            .inputs = {inPort("in", PortType::Tensor, "The tensors to wait for; passed on unchanged."),
                       inPort("also", PortType::Tensor,
                              "More tensors to wait for, not passed on: makes the nodes after this one start "
                              "only once another branch is done.",
                              false)},
            .outputs = {outPort("out", PortType::Tensor, "The input tensors, now computed.")},
            .params = {},
        }) {}

  // The batch passes through unchanged.
  Outputs check(NodeCheck& check) const override {
    Known t = check.inputOrUnknown("in");
    t.isTensors = true;
    return {{"out", t}};
  }

  void execute(core::NodeContext& ctx) const override {
    auto in = tensorInput(ctx, "in");
    std::vector<Tensor> all = in->tensors();
    if (ctx.input("also")) {
      auto also = tensorInput(ctx, "also");
      all.insert(all.end(), also->tensors().begin(), also->tensors().end());
    }
    std::map<Device, std::vector<VarPtr>> byDevice;
    for (const Tensor& t : all) byDevice[t.device()].push_back(t.var());
    Runtime& rt = sessionOf(ctx).runtime();
    Profiler& profiler = rt.profiler();
    const double start = profiler.now_us();
    for (const auto& [device, vars] : byDevice) {
      try {
        for (const VarPtr& v : vars) rt.engine().wait(v);
      } catch (const CancelledError&) {
        throw;
      } catch (const std::exception& e) {
        throw Error(std::string("an input failed: ") + e.what());
      }
      // The host waited from `start` until this device's inputs were ready.
      profiler.record(Span{"synchronize", ctx.nodeId().toStdString(), device, StreamKind::Compute, start,
                           profiler.now_us(), 0, 0, true});
    }
    const double end = profiler.now_us();
    ctx.reportField("waited_ms", (end - start) / 1000.0);
    // When the barrier let the host go, in ms on the run's timeline: phases of a graph are told apart by it.
    ctx.reportField("at_ms", (end - sessionOf(ctx).timelineStartUs()) / 1000.0);
    ctx.setOutput("out", in);
  }
};

// Reading waits for the tensor's work: an error there is its input's, and the message says so.
template <class Read>
std::vector<float> hostRead(Read read) {
  try {
    return read();
  } catch (const CancelledError&) {
    throw;
  } catch (const std::exception& e) {
    throw Error(std::string("an input failed: ") + e.what());
  }
}

// At most kHeatmapSide evenly spaced indices of 0..n-1, the first included: all of them when n is small.
std::vector<int64_t> sampledIndices(int64_t n) {
  constexpr int64_t kHeatmapSide = 16;
  const int64_t k = std::min(n, kHeatmapSide);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < k; ++i) out.push_back(i * n / k);
  return out;
}

// A 2-d tensor sampled on a grid of at most 16 x 16, which the editor draws as a heatmap on the node: the
// first values of a large matrix say little about it.
QJsonObject heatmap(const Tensor& t) {
  const std::vector<int64_t> rows = sampledIndices(t.shape()[0]), cols = sampledIndices(t.shape()[1]);
  const std::vector<float> read = hostRead([&] { return readGrid(t, rows, cols); });
  QJsonArray r, c, v;
  for (int64_t i : rows) r.append(static_cast<double>(i));
  for (int64_t i : cols) c.append(static_cast<double>(i));
  for (float x : read) v.append(static_cast<double>(x));
  return QJsonObject{{"rows", r}, {"cols", c}, {"values", v}};
}

class InspectNode final : public GpuNode {
 public:
  InspectNode()
      : GpuNode({
            .name = "Inspect",
            .category = "Sync",
            .description =
                "Shows each tensor's shape, dtype, device and first values (in the report's "
                "\"inspect\" field), and of a 2-d tensor a 16 x 16 sample that the editor draws "
                "as a heatmap on the node. Reading values copies them to the host: a blocking read "
                "that waits for the tensor, the sync the seed warns about.",
            .inputs = {inPort("in", PortType::Tensor, "The tensors to show.")},
            .outputs = {outPort("out", PortType::Tensor, "The same tensors, passed on.")},
            .params = {intParam(
                "max_values", 1000, 0, 1000,
                "How many values of each tensor to read and show, row-major; 0 reads none (and "
                "no heatmap).")},
        }) {}

  // The batch passes through unchanged.
  Outputs check(NodeCheck& check) const override {
    Known t = check.inputOrUnknown("in");
    t.isTensors = true;
    return {{"out", t}};
  }

  void execute(core::NodeContext& ctx) const override {
    auto in = tensorInput(ctx, "in");
    const int64_t maxValues = ctx.params()["max_values"].toInteger();
    QJsonArray entries;
    for (size_t i = 0; i < in->size(); ++i) {
      if (ctx.cancelled()) throw CancelledError();
      const Tensor& t = in->at(i);
      QJsonArray shape, values;
      for (int64_t d : t.shape()) shape.append(static_cast<double>(d));
      const std::vector<float> read = hostRead([&] { return readPrefix(t, maxValues); });
      for (float v : read) values.append(static_cast<double>(v));
      QJsonObject entry{{"shape", shape},
                        {"dtype", dtype_name(t.dtype())},
                        {"device", qs(t.device().str())},
                        {"numel", static_cast<double>(t.numel())},
                        {"values", values}};
      if (maxValues > 0 && t.shape().size() == 2 && t.numel() > 0) entry.insert("heatmap", heatmap(t));
      entries.append(entry);
      ctx.progress(static_cast<double>(i + 1) / static_cast<double>(in->size()));
    }
    ctx.reportField("inspect", entries);
    ctx.setOutput("out", in);
  }
};

}  // namespace

core::NodeTypePtr makeSynchronizeNode() {
  return std::make_shared<SynchronizeNode>();
}
core::NodeTypePtr makeInspectNode() {
  return std::make_shared<InspectNode>();
}

}  // namespace gn::nodes
