#include "tensor_ops.h"

#include <algorithm>
#include <memory>

#include "gpunodes/errors.h"

namespace gn::nodes {

Tensor arangeShaped(Runtime& rt, const Shape& shape, Device device, float start, float step) {
  Tensor t(rt, shape, device);
  Backend* be = &rt.backend(device);
  rt.engine().push([be, t, start, step](OpContext& c) { be->arange(t.data(), t.numel(), start, step, c); },
                   {}, {t.var()}, device, StreamKind::Compute, {"arange", "", t.bytes(), 0});
  return t;
}

void matmulInto(const Tensor& a, const Tensor& b, const Tensor& c, const MatMulOptions& o) {
  check_same_device({&a, &b, &c});
  const int64_t k = o.trans_a ? a.shape()[0] : a.shape()[1];
  GemmArgs args{o.trans_a, o.trans_b, c.shape()[0], c.shape()[1], k, nullptr, nullptr, nullptr, o.precision};
  const double flops =
      2.0 * static_cast<double>(args.m) * static_cast<double>(args.n) * static_cast<double>(k);
  Runtime& rt = a.runtime();
  Backend* be = &rt.backend(a.device());
  rt.engine().push(
      [be, a, b, c, args](OpContext& ctx) mutable {
        args.a = a.data();
        args.b = b.data();
        args.c = c.data();
        be->gemm(args, ctx);
      },
      {a.var(), b.var()}, {c.var()}, a.device(), StreamKind::Compute,
      {"matmul", "", a.bytes() + b.bytes() + c.bytes(), flops});
}

Tensor reduceLog(ReduceOp op, const std::vector<Tensor>& xs, const std::function<bool()>& cancelled) {
  if (xs.empty()) throw Error("reduceLog: no tensors");
  Runtime& rt = xs.front().runtime();
  const Device device = xs.front().device();
  for (const Tensor& x : xs) check_same_device({&xs.front(), &x});
  Tensor log(rt, {static_cast<int64_t>(xs.size())}, device);
  Backend* be = &rt.backend(device);
  const char* name = op == ReduceOp::Sum ? "sum" : "norm";
  // Entries write disjoint slots, so each gets its own variable: they need not wait for one another, as they
  // would if they all wrote the log's variable. A final join makes the log's variable depend on them all.
  std::vector<VarPtr> slots;
  slots.reserve(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) {
    if (i % 256 == 0 && cancelled()) throw CancelledError();
    const Tensor& x = xs[i];
    slots.push_back(new_var());
    rt.engine().push(
        [be, op, x, log, i](OpContext& c) { be->reduce(op, x.data(), x.numel(), log.data() + i, c); },
        {x.var()}, {slots.back()}, device, StreamKind::Compute,
        {name, "", x.bytes(), 2.0 * static_cast<double>(x.numel())});
  }
  rt.engine().push([log](OpContext&) {}, slots, {log.var()}, device, StreamKind::Compute,
                   {"join log", "", 0, 0});
  return log;
}

std::vector<float> readPrefix(const Tensor& t, int64_t n) {
  if (!t.defined()) throw Error("read: the tensor is undefined");
  n = std::clamp<int64_t>(n, 0, t.numel());
  auto out = std::make_shared<std::vector<float>>(static_cast<size_t>(n));
  Runtime& rt = t.runtime();
  Backend* be = &rt.backend(t.device());
  VarPtr done = new_var();
  const int64_t bytes = n * static_cast<int64_t>(sizeof(float));
  // The op holds the buffer too: after a cancel the wait below returns while the op may still be queued.
  rt.engine().push(
      [be, t, out, bytes](OpContext& c) {
        if (bytes > 0) be->copy({out->data(), Device::cpu()}, {t.data(), t.device()}, bytes, false, c);
      },
      {t.var()}, {done}, t.device(), StreamKind::Compute, {"read to host", "", bytes, 0, true});
  rt.engine().wait(done);
  return *out;
}

std::vector<float> readGrid(const Tensor& t, const std::vector<int64_t>& rows,
                            const std::vector<int64_t>& cols) {
  if (!t.defined()) throw Error("read: the tensor is undefined");
  if (t.shape().size() != 2) throw ShapeError("readGrid: the tensor is not 2-d");
  const int64_t width = t.shape()[1];
  for (int64_t r : rows)
    if (r < 0 || r >= t.shape()[0]) throw ShapeError("readGrid: row out of range");
  for (int64_t c : cols)
    if (c < 0 || c >= width) throw ShapeError("readGrid: column out of range");
  auto out = std::make_shared<std::vector<float>>(rows.size() * cols.size());
  Runtime& rt = t.runtime();
  Backend* be = &rt.backend(t.device());
  VarPtr done = new_var();
  const int64_t bytes = static_cast<int64_t>(out->size() * sizeof(float));
  // Every column of a row is one copy when the columns are all of them; otherwise one copy per element.
  const bool wholeRows = static_cast<int64_t>(cols.size()) == width;
  rt.engine().push(
      [be, t, out, rows, cols, width, wholeRows](OpContext& c) {
        float* dst = out->data();
        for (int64_t r : rows) {
          float* row = t.data() + r * width;
          if (wholeRows) {
            be->copy({dst, Device::cpu()}, {row, t.device()}, width * static_cast<int64_t>(sizeof(float)),
                     false, c);
            dst += width;
            continue;
          }
          for (int64_t col : cols)
            be->copy({dst++, Device::cpu()}, {row + col, t.device()}, sizeof(float), false, c);
        }
      },
      {t.var()}, {done}, t.device(), StreamKind::Compute, {"read to host", "", bytes, 0, true});
  rt.engine().wait(done);
  return *out;
}

}  // namespace gn::nodes
