// MatMul, Elementwise and Norm: compute that maps over the batch on the tensors' own device.
#include <QJsonArray>
#include <cmath>
#include <map>

#include "gpunodes/errors.h"
#include "gpunodes/ops.h"
#include "node_util.h"
#include "tensor_ops.h"

namespace gn::nodes {
namespace {

using core::PortType;

// Checking for cancel between pushes keeps a node that enqueues a million ops responsive.
constexpr int64_t kCancelCheckEvery = 256;

class MatMulNode final : public GpuNode {
 public:
  MatMulNode()
      : GpuNode({
            .name = "MatMul",
            .category = "Compute",
            .description = "Matrix products a x b on the tensors' device (cuBLAS on GPUs, BLAS on the CPU), "
                           "element by element over the batch; repeat is the seed's run(x), which returns a "
                           "list of products. a and b must be on the same device.",
            .inputs = {inPort("a", PortType::Tensor, "Left factors: 2-d tensors."),
                       inPort("b", PortType::Tensor,
                              "Right factors: one tensor for every element of a, or a single one for all.")},
            .outputs = {outPort("out", PortType::Tensor,
                                "The products: repeat per element of a (keep all) or one (keep last), "
                                "element-major.")},
            .params =
                {
                    intParam("repeat", 1, 1, 1000000,
                             "How many times to compute each product (the seed's run(x) does 50)."),
                    enumParam("keep", {"all", "last"}, "all",
                              "all: every product is a new tensor in the output (the seed's list). last: the "
                              "products reuse one result and only the last is output, to save memory."),
                    boolParam("trans_a", false, "Use a transposed."),
                    boolParam("trans_b", false, "Use b transposed."),
                    precisionParam("The products' math"),
                },
        }) {}

  // a and b on one device, shapes that multiply, batches that pair, and keep=all's products fitting.
  Outputs check(NodeCheck& check) const override {
    const QJsonObject& p = check.params();
    const Known a = check.inputOrUnknown("a"), b = check.inputOrUnknown("b");
    Known out;
    out.isTensors = true;
    out.placeLike(a);
    check.checkSameDevice("inputs.b", "a", a, "b", b);
    check.checkPrecision(a.devices, "a is");
    const bool ta = p["trans_a"].toBool(), tb = p["trans_b"].toBool();
    if (a.shape && b.shape) {
      const Shape &x = *a.shape, &y = *b.shape;
      if (x.size() != 2 || y.size() != 2) {
        check.error(x.size() != 2 ? "inputs.a" : "inputs.b",
                    "matmul needs 2-d tensors, got " + qs(shape_str(x)) + " and " + qs(shape_str(y)));
      } else {
        const int64_t k = ta ? x[0] : x[1], kb = tb ? y[1] : y[0];
        if (k != kb) {
          check.error("inputs.b", QString("shapes %1%2 and %3%4 cannot be multiplied (%5 != %6)")
                                      .arg(qs(shape_str(x)), ta ? "^T" : "", qs(shape_str(y)), tb ? "^T" : "")
                                      .arg(k)
                                      .arg(kb));
        } else {
          out.shape = Shape{ta ? x[1] : x[0], tb ? y[0] : y[1]};
        }
      }
    }
    const qint64 repeat = p["repeat"].toInteger();
    const bool keepAll = p["keep"].toString() != "last";
    if (auto n = check.pairCounts("inputs.b", a, b)) {
      out.count = *n * (keepAll ? double(repeat) : 1.0);
      if (out.shape && keepAll)
        if (auto d = a.single())
          check.checkFits("params.repeat", *d, double(*out.count), *out.shape, "keep=all holds");
    }
    return {{"out", out}};
  }

  void execute(core::NodeContext& ctx) const override {
    auto a = tensorInput(ctx, "a");
    auto b = tensorInput(ctx, "b");
    const size_t n = pairedSize("MatMul", a->size(), b->size());
    const QJsonObject& p = ctx.params();
    const int64_t repeat = p["repeat"].toInteger();
    if (repeat < 1) throw Error("repeat must be at least 1");
    const bool keepAll = p["keep"].toString() != "last";
    MatMulOptions o{p["trans_a"].toBool(), p["trans_b"].toBool(), precisionOf(p)};
    Runtime& rt = sessionOf(ctx).runtime();

    // What keep=all holds at once, per device, refused before the first allocation when it cannot fit.
    std::map<Device, std::pair<int64_t, int64_t>> held;  // device -> (results, bytes each)
    for (size_t i = 0; i < n; ++i) {
      const Tensor& x = a->at(pick(a->size(), i));
      const Tensor& y = b->at(pick(b->size(), i));
      if (x.shape().size() != 2 || y.shape().size() != 2) continue;  // matmul's own error follows
      const int64_t m = o.trans_a ? x.shape()[1] : x.shape()[0];
      const int64_t cols = o.trans_b ? y.shape()[0] : y.shape()[1];
      auto& [results, bytes] = held[x.device()];
      results += keepAll ? repeat : 1;
      bytes = std::max(bytes, m * cols * static_cast<int64_t>(sizeof(float)));
    }
    for (const auto& [device, use] : held)
      ensureFits(rt, device, use.first, use.second,
                 keepAll ? "MatMul keep=all (use keep=last, a smaller repeat or a smaller shape)" : "MatMul");

    std::vector<Tensor> out;
    for (size_t i = 0; i < n; ++i) {
      const Tensor& x = a->at(pick(a->size(), i));
      const Tensor& y = b->at(pick(b->size(), i));
      if (keepAll) {
        for (int64_t r = 0; r < repeat; ++r) {
          if (r % kCancelCheckEvery == 0 && ctx.cancelled()) throw CancelledError();
          out.push_back(matmul(x, y, o));
        }
      } else {
        Tensor c = matmul(x, y, o);
        for (int64_t r = 1; r < repeat; ++r) {
          if (r % kCancelCheckEvery == 0 && ctx.cancelled()) throw CancelledError();
          matmulInto(x, y, c, o);
        }
        out.push_back(c);
      }
    }
    ctx.reportField("products", static_cast<double>(n) * static_cast<double>(repeat));
    setTensors(ctx, "out", std::move(out));
  }
};

class ElementwiseNode final : public GpuNode {
 public:
  ElementwiseNode()
      : GpuNode({
            .name = "Elementwise",
            .category = "Compute",
            .description = "An elementwise op, element by element over the batch, on the tensors' device. "
                           "Binary ops need a and b on the same device: nothing is copied silently, and "
                           "tensors from two devices fail with the framework's error.",
            .inputs = {inPort("a", PortType::Tensor, "The first operand."),
                       inPort("b", PortType::Tensor,
                              "The second operand of add, sub, mul and div: same shape and device as a; one "
                              "tensor, or one per element of a.",
                              false)},
            .outputs = {outPort("out", PortType::Tensor, "The results, on the operands' device.")},
            .params =
                {
                    enumParam("op", {"add", "sub", "mul", "div", "exp", "relu", "scale_shift"}, "add",
                              "add, sub, mul, div: a op b. exp, relu: of a. scale_shift: scale * a + shift."),
                    floatParam("scale", 1.0, "scale_shift: the factor."),
                    floatParam("shift", 0.0, "scale_shift: the offset."),
                },
        }, Reuse::Pure) {}

  static bool isBinary(const QString& op) { return op == "add" || op == "sub" || op == "mul" || op == "div"; }

  QStringList validateParams(const QJsonObject& params) const override {
    QStringList problems;
    for (const char* name : {"scale", "shift"})
      if (!std::isfinite(params[name].toDouble(std::nan(""))))
        problems.append(QString(name) + ": must be a finite number");
    return problems;
  }

  // A binary op needs b on a's device, with a's shape, in a batch that pairs; a unary one ignores b.
  Outputs check(NodeCheck& check) const override {
    const QString op = check.params()["op"].toString();
    const Known a = check.inputOrUnknown("a");
    const std::optional<Known> b = check.input("b");
    Known out;
    out.isTensors = true;
    out.placeLike(a);
    out.shape = a.shape;
    out.count = a.count;
    if (!isBinary(op)) {
      if (b) check.warning("inputs.b", "op " + op + " uses only input a; b is ignored");
      return {{"out", out}};
    }
    if (!b) {
      check.error("inputs.b", "op " + op + " needs input b");
      return {{"out", out}};
    }
    check.checkSameDevice("inputs.b", "a", a, "b", *b);
    if (a.shape && b->shape && *a.shape != *b->shape)
      check.error(
          "inputs.b",
          QString("%1: shapes %2 and %3 differ").arg(op, qs(shape_str(*a.shape)), qs(shape_str(*b->shape))));
    out.count = check.pairCounts("inputs.b", a, *b);
    return {{"out", out}};
  }

  void execute(core::NodeContext& ctx) const override {
    const QJsonObject& p = ctx.params();
    const QString op = p["op"].toString();
    auto a = tensorInput(ctx, "a");
    // Outputs match a's elements in size and device.
    std::map<Device, std::pair<int64_t, int64_t>> outputs;  // device -> (results, bytes each)
    for (const Tensor& x : a->tensors()) {
      auto& [results, bytes] = outputs[x.device()];
      ++results;
      bytes = std::max(bytes, x.bytes());
    }
    for (const auto& [device, use] : outputs)
      ensureFits(sessionOf(ctx).runtime(), device, use.first, use.second, "Elementwise");
    std::vector<Tensor> out;
    if (isBinary(op)) {
      if (!ctx.input("b")) throw Error(("op " + op + " needs input b").toStdString());
      auto b = tensorInput(ctx, "b");
      const size_t n = pairedSize("Elementwise", a->size(), b->size());
      const BinaryOp bop = op == "add"   ? BinaryOp::Add
                           : op == "sub" ? BinaryOp::Sub
                           : op == "mul" ? BinaryOp::Mul
                                         : BinaryOp::Div;
      for (size_t i = 0; i < n; ++i)
        out.push_back(binary(bop, a->at(pick(a->size(), i)), b->at(pick(b->size(), i))));
    } else {
      const float scale = static_cast<float>(p["scale"].toDouble());
      const float shift = static_cast<float>(p["shift"].toDouble());
      for (const Tensor& x : a->tensors()) {
        if (op == "exp")
          out.push_back(exp(x));
        else if (op == "relu")
          out.push_back(relu(x));
        else if (op == "scale_shift")
          out.push_back(scale_shift(x, scale, shift));
        else
          throw Error("op: unknown value " + op.toStdString());
      }
    }
    setTensors(ctx, "out", std::move(out));
  }
};

class NormNode final : public GpuNode {
 public:
  NormNode()
      : GpuNode({
            .name = "Norm",
            .category = "Compute",
            .description = "The Frobenius norm (or the sum) of each tensor, computed on its device. log says "
                           "how the values reach the host: the seed's exercise 3 compares a blocking read "
                           "every step with a log kept on the device and read once at the end.",
            .inputs = {inPort("in", PortType::Tensor, "The tensors.")},
            .outputs = {outPort("out", PortType::Tensor,
                                "log none or each_step: one scalar tensor per element. log at_end: a single "
                                "tensor [N] holding the whole log, on the device."),
                        outPort("values", PortType::Scalar,
                                "The values read to the host (empty with log none).")},
            .params =
                {
                    enumParam("op", {"frobenius", "sum"}, "frobenius",
                              "frobenius: sqrt of the sum of squares. sum: the sum of the elements."),
                    enumParam("log", {"none", "each_step", "at_end"}, "none",
                              "none: values stay on the device. each_step: a blocking host read after every "
                              "element (each costs a sync; one host-blocking span per step in the trace). "
                              "at_end: the values are written into one log tensor on the device and read "
                              "once. The read values go to the metric series named after the node."),
                },
        }) {}

  // A norm read back to the host (log) is a measurement of when values are ready: it always runs.
  bool reusable(const QJsonObject& p) const override { return p["log"].toString() == "none"; }

  // One scalar per element, or with log at_end one log tensor, which must stay on one device.
  Outputs check(NodeCheck& check) const override {
    const Known in = check.inputOrUnknown("in");
    Known t;
    t.isTensors = true;
    t.placeLike(in);
    if (check.params()["log"].toString() == "at_end") {
      if (!in.devices.empty() && !in.single())
        check.error("params.log", "log at_end keeps one log on one device, but the batch spans several");
      if (in.count && *in.count < 1e15) t.shape = Shape{static_cast<int64_t>(*in.count)};
      t.count = 1;
      if (auto d = in.single()) t.devices = {*d};
    } else {
      t.shape = Shape{};
      t.count = in.count;
    }
    return {{"out", t}};
  }

  void execute(core::NodeContext& ctx) const override {
    auto in = tensorInput(ctx, "in");
    const QJsonObject& p = ctx.params();
    const ReduceOp rop = p["op"].toString() == "sum" ? ReduceOp::Sum : ReduceOp::FrobeniusNorm;
    const QString log = p["log"].toString();
    const QString series = ctx.nodeId();
    std::vector<Tensor> out;
    std::vector<double> values;
    auto reduce = [&](const Tensor& x) { return rop == ReduceOp::Sum ? sum(x) : frobenius_norm(x); };

    if (log == "at_end") {
      const Device device = in->at(0).device();
      for (const Tensor& x : in->tensors())
        if (x.device() != device)
          throw Error("log at_end keeps one log on one device, but the batch spans " + device.str() +
                      " and " + x.device().str());
      Tensor logTensor = reduceLog(rop, in->tensors(), [&] { return ctx.cancelled(); });
      for (float v : to_host(logTensor)) values.push_back(v);  // the one blocking read
      out.push_back(logTensor);
    } else {
      for (size_t i = 0; i < in->size(); ++i) {
        if (i % kCancelCheckEvery == 0 && ctx.cancelled()) throw CancelledError();
        Tensor y = reduce(in->at(i));
        if (log == "each_step") {
          values.push_back(item(y));  // blocks the host until step i is done
          ctx.progress(static_cast<double>(i + 1) / static_cast<double>(in->size()));
        }
        out.push_back(y);
      }
    }
    QJsonArray shown;
    for (size_t i = 0; i < values.size(); ++i) {
      ctx.metric(series, static_cast<double>(i), values[i]);
      if (i < 1000) shown.append(values[i]);
    }
    if (log != "none") ctx.reportField("values", shown);
    setTensors(ctx, "out", std::move(out));
    ctx.setOutput("values", std::make_shared<ScalarValue>(std::move(values)));
  }
};

}  // namespace

core::NodeTypePtr makeMatMulNode() {
  return std::make_shared<MatMulNode>();
}
core::NodeTypePtr makeElementwiseNode() {
  return std::make_shared<ElementwiseNode>();
}
core::NodeTypePtr makeNormNode() {
  return std::make_shared<NormNode>();
}

}  // namespace gn::nodes
