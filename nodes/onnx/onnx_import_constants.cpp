#include "onnx_importer_internal.h"

#include <algorithm>
#include <cstring>

#include "../layer_nodes.h"

namespace gn::nodes::onnx::import_detail {

void Importer::constant() {
  Value v;
  if (node_->attribute_size() != 1)
    fail("has " + str(node_->attribute_size()) + " attributes; a Constant has one, its value");
  for (AttributeProto& a : *const_cast<NodeProto*>(node_)->mutable_attribute()) {
    if (a.name() == "value" && a.has_t()) v.c = takeTensor(m_, *a.mutable_t(), where() + " value");
    else if (a.name() == "value_float") v.c.f = {a.f()};
    else if (a.name() == "value_int") v.c.i = {a.i()}, v.c.integer = true;
    else if (a.name() == "value_ints") {
      v.c.i.assign(a.ints().begin(), a.ints().end());
      v.c.integer = true;
      v.c.dims = {int64_t(v.c.i.size())};
    } else if (a.name() == "value_floats") {
      v.c.f.assign(a.floats().begin(), a.floats().end());
      v.c.dims = {int64_t(v.c.f.size())};
    } else
      fail("attribute " + quoted(a.name()) + " is not supported");
  }
  setOutput(0, std::move(v));
}

void Importer::shape() {
  const int in = layerIn(0);
  Value v;
  v.c.integer = true;
  v.c.i.push_back(kBatch);
  for (int64_t d : shapeOf(in)) v.c.i.push_back(d);
  int64_t n = int64_t(v.c.i.size()), start = attrInt("start", 0), end = attrInt("end", n);
  if (start < 0) start += n;
  if (end < 0) end += n;
  start = std::clamp<int64_t>(start, 0, n);
  end = std::clamp<int64_t>(end, start, n);
  v.c.i = std::vector<int64_t>(v.c.i.begin() + start, v.c.i.begin() + end);
  v.c.dims = {int64_t(v.c.i.size())};
  setOutput(0, std::move(v));
}

void Importer::gather() {
  if (value(0).kind == Value::Layer) return gatherStep();
  if (value(1).kind == Value::Layer) return embedding();
  const TensorValues& data = constIn(0, "the data");
  const std::vector<int64_t> data1 = ints(data, "the data");
  const TensorValues& idx = constIn(1, "the indices");
  if (attrInt("axis", 0) != 0) fail("gathers along an axis other than 0 of a shape");
  const std::vector<int64_t> at = ints(idx, "the indices");
  Value v;
  v.c.integer = true;
  for (int64_t k : at) {
    if (k < 0) k += int64_t(data1.size());
    if (k < 0 || k >= int64_t(data1.size())) fail("index " + str(k) + " outside the " + str(data1.size()) + " values");
    v.c.i.push_back(data1[size_t(k)]);
  }
  v.c.dims = idx.dims;
  setOutput(0, std::move(v));
}

void Importer::squeeze(bool unsqueeze) {
  if (!unsqueeze && value(0).kind == Value::Layer) return squeezeLayer();
  if (unsqueeze && value(0).kind == Value::Const && !value(0).c.integer) return unsqueezeFloats();
  const TensorValues& t = constIn(0, "the data");
  const std::vector<int64_t> data = ints(t, "the data");
  Value v;
  v.c.integer = true;
  v.c.i = data;
  if (unsqueeze) {
    if (!t.dims.empty()) fail("unsqueezes a vector; gpunodes folds scalars to vectors only");
    v.c.dims = {int64_t(data.size())};
  } else {
    if (data.size() != 1) fail("squeezes a constant of " + str(data.size()) + " values");
    v.c.dims = {};
  }
  setOutput(0, std::move(v));
}

void Importer::slice() {
  if (value(0).kind == Value::Const && value(0).zeros) return setOutput(0, value(0));  // a zero state's part
  if (value(0).kind == Value::Layer) return sliceStep();
  const std::vector<int64_t> data = ints(constIn(0, "the data"), "the data");
  const std::vector<int64_t> starts = ints(constIn(1, "starts"), "starts"), ends = ints(constIn(2, "ends"), "ends");
  if (has(3)) {
    const std::vector<int64_t> axes = ints(constIn(3, "axes"), "axes");
    if (axes.size() != 1 || (axes[0] != 0 && axes[0] != -1)) fail("slices along an axis other than 0 of a shape");
  }
  int64_t step = 1;
  if (has(4)) {
    const std::vector<int64_t> steps = ints(constIn(4, "steps"), "steps");
    if (steps.size() != 1 || steps[0] != 1) fail("slices with a step other than 1");
  }
  if (starts.size() != 1 || ends.size() != 1) fail("slices more than one axis");
  const int64_t n = int64_t(data.size());
  int64_t b = starts[0], e = ends[0];
  if (b < 0) b += n;
  if (e < 0) e += n;
  b = std::clamp<int64_t>(b, 0, n);
  e = std::clamp<int64_t>(e, b, n);
  Value v;
  v.c.integer = true;
  for (int64_t k = b; k < e; k += step) v.c.i.push_back(data[size_t(k)]);
  v.c.dims = {int64_t(v.c.i.size())};
  setOutput(0, std::move(v));
}

std::vector<int64_t> Importer::axesOf(int input) {
  if (has(input)) return ints(constIn(input, "axes"), "axes");
  return attrInts("axes");
}

void Importer::transposeConst(const TensorValues& c) {
  std::vector<int64_t> perm = attrInts("perm");
  if (c.integer || c.dims.size() != 2 || !(perm.empty() || perm == std::vector<int64_t>{1, 0}))
    fail("transposes a constant other than a 2-D float matrix");
  Value v;
  v.c.dims = {c.dims[1], c.dims[0]};
  v.c.f.resize(c.f.size());
  for (int64_t r = 0; r < c.dims[0]; ++r)
    for (int64_t k = 0; k < c.dims[1]; ++k) v.c.f[size_t(k * c.dims[0] + r)] = c.f[size_t(r * c.dims[1] + k)];
  setOutput(0, std::move(v));
}

void Importer::concatConst(int64_t axis) {
  const TensorValues& first = value(0).c;
  const int64_t rank = int64_t(first.dims.size());
  if (rank == 0 || (axis != 0 && axis != -rank)) fail("joins constants along an axis other than 0");
  Value v;
  v.c.integer = first.integer;
  v.c.dims = first.dims;
  v.c.dims[0] = 0;
  for (int k = 0; k < node_->input_size(); ++k) {
    const Value& in = value(k);
    const TensorValues& t = in.c;
    if (in.zeros || t.integer != first.integer || t.dims.size() != first.dims.size() ||
        !std::equal(t.dims.begin() + 1, t.dims.end(), first.dims.begin() + 1))
      fail("joins constants of different types or trailing dims");
    v.c.dims[0] += t.dims[0];
    v.c.f.insert(v.c.f.end(), t.f.begin(), t.f.end());
    v.c.i.insert(v.c.i.end(), t.i.begin(), t.i.end());
  }
  setOutput(0, std::move(v));
}

void Importer::unsqueezeFloats() {
  const TensorValues& t = value(0).c;
  std::vector<int64_t> axes = axesOf(1);
  Value v;
  v.c = t;
  const int64_t rank = int64_t(t.dims.size() + axes.size());
  for (int64_t& a : axes) a = a < 0 ? a + rank : a;
  std::sort(axes.begin(), axes.end());
  for (int64_t a : axes) {
    if (a < 0 || a > int64_t(v.c.dims.size())) fail("unsqueezes axis " + str(a));
    v.c.dims.insert(v.c.dims.begin() + a, 1);
  }
  setOutput(0, std::move(v));
}

void Importer::split() {
  const TensorValues& t = constIn(0, "the data");
  if (attrInt("axis", 0) != 0 || t.dims.empty()) fail("splits a constant along an axis other than 0");
  std::vector<int64_t> sizes = has(1) ? ints(constIn(1, "split"), "split") : attrInts("split");
  const int outs = node_->output_size();
  if (sizes.empty()) {
    if (outs < 1 || t.dims[0] % outs) fail("splits " + str(t.dims[0]) + " rows into " + str(outs) + " equal parts");
    sizes.assign(size_t(outs), t.dims[0] / outs);
  }
  if (int(sizes.size()) != outs) fail("has " + str(sizes.size()) + " split sizes for " + str(outs) + " outputs");
  int64_t total = 0;
  for (int64_t n : sizes) {
    if (n < 0) fail("a negative split size");
    total += n;
  }
  if (total != t.dims[0]) fail("split sizes add up to " + str(total) + ", not the " + str(t.dims[0]) + " rows");
  const int64_t row = t.dims[0] ? t.numel() / t.dims[0] : 0;
  int64_t at = 0;
  for (int k = 0; k < outs; ++k) {
    Value v;
    v.c.integer = t.integer;
    v.c.dims = t.dims;
    v.c.dims[0] = sizes[size_t(k)];
    const size_t b = size_t(at * row), e = size_t((at + sizes[size_t(k)]) * row);
    if (t.integer) v.c.i.assign(t.i.begin() + b, t.i.begin() + e);
    else v.c.f.assign(t.f.begin() + b, t.f.begin() + e);
    at += sizes[size_t(k)];
    setOutput(k, std::move(v));
  }
}

void Importer::constantOfShape() {
  ints(constIn(0, "the shape"), "the shape");
  if (const AttributeProto* a = attr("value")) {
    if (!a->has_t()) fail("attribute value must be a tensor");
    TensorValues c = takeTensor(m_, *const_cast<AttributeProto*>(a)->mutable_t(), where() + " value");
    if (c.numel() != 1 || (c.integer ? c.i[0] != 0 : c.f[0] != 0.0f))
      fail("fills with a value other than 0: gpunodes folds only the zero state torch writes before a "
           "recurrent op");
  }
  Value v;
  v.zeros = true;
  setOutput(0, std::move(v));
}

}  // namespace gn::nodes::onnx::import_detail
