// torch's shape arithmetic, evaluated: torch.onnx.export computes every Reshape's shape and Slice's bounds of its
// own layers (nn.MultiheadAttention and its masks) from Shape nodes of the tensors, so that the batch can be
// dynamic; a value here is a * N + b per entry, N the batch, once the sample's shapes are known.
#include <algorithm>
#include <cstring>

#include "onnx_importer_internal.h"

namespace gn::nodes::onnx::import_detail {

namespace {

// ConstantOfShape's fill when it is one integer (torch's ones of an Expand's rank), or nullopt.
std::optional<int64_t> intFill(const NodeProto& n) {
  const AttributeProto* a = attrOf(n, "value");
  if (!a || !a->has_t() || a->t().data_type() != ::onnx::TensorProto::INT64) return std::nullopt;
  const ::onnx::TensorProto& t = a->t();
  for (int64_t d : t.dims())
    if (d != 1) return std::nullopt;
  if (t.int64_data_size() == 1) return t.int64_data(0);
  if (t.raw_data().size() != 8) return std::nullopt;
  int64_t v = 0;
  std::memcpy(&v, t.raw_data().data(), 8);
  return v;
}

// Two operands' entries with a one-entry operand broadcast; an empty result when they do not broadcast.
template <class F>
std::vector<Lin> elementwise(const Sym& x, const Sym& y, F f) {
  if (x.v.empty() || y.v.empty() || (x.v.size() != y.v.size() && x.v.size() != 1 && y.v.size() != 1)) return {};
  std::vector<Lin> r;
  for (size_t k = 0; k < std::max(x.v.size(), y.v.size()); ++k) {
    const std::optional<Lin> e = f(x.v[x.v.size() == 1 ? 0 : k], y.v[y.v.size() == 1 ? 0 : k]);
    if (!e) return {};
    r.push_back(*e);
  }
  return r;
}

bool known(const Sym& s) {  // no entry depends on N
  return std::all_of(s.v.begin(), s.v.end(), [](const Lin& l) { return l.a == 0; });
}

}  // namespace

// An integer constant (a Constant node's or an initializer's, read by the walk) of at most 8 values.
std::optional<Sym> TorchShapes::constant(const std::string& name) const {
  const auto it = values_.find(name);
  if (it == values_.end() || it->second.kind != Value::Const || it->second.zeros || it->second.expanded ||
      !it->second.c.integer || it->second.c.dims.size() > 1 || it->second.c.i.size() > 8)
    return std::nullopt;
  Sym r;
  r.scalar = it->second.c.dims.empty();
  for (int64_t v : it->second.c.i) {
    if (v == kBatch) return std::nullopt;
    r.v.push_back({0, v});
  }
  return r;
}

// Follows `name` back through the arithmetic to constants and Shapes of known tensors (depth: at most 64 nodes
// deep, for a stranger's file).
std::optional<Sym> TorchShapes::eval(const std::string& name, int depth) const {
  if (depth > 64) return std::nullopt;
  const auto pr = producer_.find(name);
  if (pr == producer_.end() || g_.node(pr->second).op_type() == "Constant") return constant(name);
  const NodeProto& n = g_.node(pr->second);
  const std::string& op = n.op_type();
  if (op == "Shape") {
    const auto it = shapes.find(n.input(0));
    if (it == shapes.end() || attrOf(n, "start") || attrOf(n, "end")) return std::nullopt;
    return Sym{it->second, false};
  }
  std::vector<Sym> a;
  for (const std::string& x : n.input()) {
    std::optional<Sym> v = x.empty() ? std::nullopt : eval(x, depth + 1);
    if (!v) return std::nullopt;
    // Small shapes only: the arithmetic below cannot overflow. A Slice's bounds are only clamped, and torch
    // ends its Slice of a Shape at INT64_MAX.
    const bool bound = op == "Slice" && !a.empty();
    for (const Lin& l : v->v)
      if (std::abs(l.a) > (int64_t(1) << 31) || (!bound && std::abs(l.b) > (int64_t(1) << 31))) return std::nullopt;
    a.push_back(std::move(*v));
  }
  if (op == "Cast") {
    if (a.size() != 1 || !(intIs(n, "to", 0, ::onnx::TensorProto::INT64) || intIs(n, "to", 0, ::onnx::TensorProto::INT32)))
      return std::nullopt;
    return a[0];
  }
  if (op == "Gather") {
    if (a.size() != 2 || !intIs(n, "axis", 0, 0) || a[0].scalar) return std::nullopt;
    Sym r;
    r.scalar = a[1].scalar;
    for (const Lin& j : a[1].v) {
      const int64_t size = int64_t(a[0].v.size());
      const int64_t at = j.b < 0 ? j.b + size : j.b;
      if (j.a || at < 0 || at >= size) return std::nullopt;
      r.v.push_back(a[0].v[size_t(at)]);
    }
    return r;
  }
  if (op == "Unsqueeze") {  // a scalar into [1]: the axes an input from opset 13, an attribute before
    const AttributeProto* axes = attrOf(n, "axes");
    const bool zero = a.size() == 2 ? a[1].v == std::vector<Lin>{{0, 0}}
                                    : axes && axes->ints_size() == 1 && axes->ints(0) == 0;
    if (a.empty() || !a[0].scalar || !zero) return std::nullopt;
    return Sym{a[0].v, false};
  }
  // A part of a shape (torch reads E as Squeeze(Slice(Shape, [2], [3], [0])) to slice in_proj_weight by it).
  if (op == "Slice") {
    if (a.size() < 3 || a[0].scalar || a[1].v.size() != 1 || a[2].v.size() != 1 || a[1].v[0].a || a[2].v[0].a ||
        (a.size() > 3 && a[3].v != std::vector<Lin>{{0, 0}}) || (a.size() > 4 && a[4].v != std::vector<Lin>{{0, 1}}))
      return std::nullopt;
    const int64_t size = int64_t(a[0].v.size());
    auto clamp = [&](int64_t x) { return std::clamp(x < 0 ? x + size : x, int64_t(0), size); };
    const int64_t from = clamp(a[1].v[0].b), to = clamp(a[2].v[0].b);
    if (from >= to) return std::nullopt;
    return Sym{std::vector<Lin>(a[0].v.begin() + from, a[0].v.begin() + to), false};
  }
  if (op == "Squeeze") {  // [1] into a scalar: the axes an input from opset 13, an attribute before
    const AttributeProto* axes = attrOf(n, "axes");
    const bool zero = a.size() == 2 ? a[1].v == std::vector<Lin>{{0, 0}}
                                    : !axes || (axes->ints_size() == 1 && axes->ints(0) == 0);
    if (a.empty() || a.size() > 2 || a[0].scalar || a[0].v.size() != 1 || !zero) return std::nullopt;
    return Sym{a[0].v, true};
  }
  if (op == "Concat") {
    if (!intIs(n, "axis", INT64_MIN, 0)) return std::nullopt;
    Sym r;
    for (const Sym& x : a) {
      if (x.scalar) return std::nullopt;
      r.v.insert(r.v.end(), x.v.begin(), x.v.end());
    }
    return r;
  }
  // torch's Expand over the heads takes its shape from Where(Equal(shape, -1), ones, shape): ConstantOfShape of a
  // known rank, Equal and Where of known entries.
  if (op == "ConstantOfShape") {
    const std::optional<int64_t> fill = intFill(n);
    if (a.size() != 1 || a[0].v.size() != 1 || a[0].v[0].a || a[0].v[0].b < 0 || a[0].v[0].b > 8 || !fill)
      return std::nullopt;
    return Sym{std::vector<Lin>(size_t(a[0].v[0].b), Lin{0, *fill}), false};
  }
  if (op == "Where") {
    if (a.size() != 3 || !known(a[0])) return std::nullopt;
    std::vector<Lin> picked = elementwise(a[1], a[2], [](Lin x, Lin) { return std::optional<Lin>(x); });
    std::vector<Lin> others = elementwise(a[1], a[2], [](Lin, Lin y) { return std::optional<Lin>(y); });
    if (picked.empty() || (a[0].v.size() != picked.size() && a[0].v.size() != 1)) return std::nullopt;
    for (size_t k = 0; k < picked.size(); ++k)
      if (!a[0].v[a[0].v.size() == 1 ? 0 : k].b) picked[k] = others[k];
    return Sym{picked, a[0].scalar && a[1].scalar && a[2].scalar};
  }
  if (a.size() != 2) return std::nullopt;
  const Sym &x = a[0], &y = a[1];
  std::vector<Lin> r = elementwise(x, y, [&](Lin u, Lin w) -> std::optional<Lin> {
    if (op == "Add") return Lin{u.a + w.a, u.b + w.b};
    if (op == "Sub") return Lin{u.a - w.a, u.b - w.b};
    if (op == "Mul" && (!u.a || !w.a)) return Lin{u.a * w.b + w.a * u.b, u.b * w.b};
    // Integer division of values that are never negative here; N's coefficient must divide exactly.
    if (op == "Div" && !w.a && w.b > 0 && u.a >= 0 && u.b >= 0 && u.a % w.b == 0) return Lin{u.a / w.b, u.b / w.b};
    if (op == "Equal" && !u.a && !w.a) return Lin{0, u.b == w.b};
    return std::nullopt;
  });
  if (r.empty()) return std::nullopt;
  return Sym{std::move(r), x.scalar && y.scalar};
}

}  // namespace gn::nodes::onnx::import_detail
