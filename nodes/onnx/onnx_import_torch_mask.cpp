// The masks torch 1.13 adds to nn.MultiheadAttention's scores before the Softmax, as torch.onnx.export writes them:
// a causal attn_mask (computed in the graph from the input's Shape) and a key_padding_mask as torch_peer builds it
// from gpunodes' valid_lens (arange(Tk) >= lens; with the guard that gives a sample of length 0 out_proj's bias,
// or without it), each alone or both joined by Or. Read back as MultiheadAttention's `causal` and its valid_lens
// wired. Apart from onnx_import_torch_attention.cpp, which reads the rest of the layer, because the key padding
// mask is a chain of its own with its own checks.
#include <cstring>

#include "onnx_importer_internal.h"

namespace gn::nodes::onnx::import_detail {

namespace {

// ConstantOfShape's fill: one value of that type equal to `want` (no value attribute: a float 0).
bool fillIs(const NodeProto& n, int type, double want) {
  const AttributeProto* a = attrOf(n, "value");
  if (!a) return type == ::onnx::TensorProto::FLOAT && want == 0;
  if (!a->has_t() || a->t().data_type() != type) return false;
  const ::onnx::TensorProto& t = a->t();
  for (int64_t d : t.dims())
    if (d != 1) return false;
  if (type == ::onnx::TensorProto::BOOL) {
    if (t.int32_data_size() == 1) return t.int32_data(0) == want;
    return t.raw_data().size() == 1 && static_cast<unsigned char>(t.raw_data()[0]) == want;
  }
  if (t.float_data_size() == 1) return t.float_data(0) == want;
  float f = 0;
  if (t.raw_data().size() != 4) return false;
  std::memcpy(&f, t.raw_data().data(), 4);
  return f == want;
}

bool isCastTo(const NodeProto* n, int type) { return isOp(n, "Cast", 1) && intIs(*n, "to", 0, type); }

}  // namespace

// torch adds a mask as baddbmm does: Mul(scores, 1) + Mul(Where(Cast(m, bool), -inf, zeros of m's Shape), 1), m the
// causal mask, the key padding mask or their Or (each Cast to bool first). The masked scores; the scores themselves
// when no Mul reads them; empty when the nodes are not torch's.
std::string Importer::findTorchMask(Pattern& pat, const std::string& scores, std::vector<int>& nodes,
                                    std::vector<std::string>& roots, std::set<std::string>& shaped) {
  const NodeProto* mul = torchOnly(scores);
  if (!isOp(mul, "Mul", 2)) return scores;
  const std::string* one = other(*mul, scores);
  const NodeProto* add = torchOnly(mul->output(0));
  const std::string* masked = isOp(add, "Add", 2) ? other(*add, mul->output(0)) : nullptr;
  if (!one || !near(scalar(*one), 1.0) || !masked) return {};
  const NodeProto* alpha = madeBy(*masked, "Mul", 2);
  if (!alpha) return {};
  const NodeProto* where = nullptr;
  for (int k = 0; k < 2; ++k)
    if (const NodeProto* w = madeBy(alpha->input(k), "Where", 3); w && near(scalar(alpha->input(1 - k)), 1.0)) where = w;
  if (!where) return {};
  const std::optional<double> inf = scalar(where->input(1));
  const NodeProto* cast = madeBy(where->input(0), "Cast", 1);
  const NodeProto* zeros = madeBy(where->input(2), "ConstantOfShape", 1);
  if (!inf || !(*inf <= -1e9) || !isCastTo(cast, ::onnx::TensorProto::BOOL) || !zeros ||
      !fillIs(*zeros, ::onnx::TensorProto::FLOAT, 0))
    return {};
  const std::string& m = cast->input(0);
  const NodeProto* zshape = madeBy(zeros->input(0), "Shape", 1);
  if (!zshape || zshape->input(0) != m || attrOf(*zshape, "start") || attrOf(*zshape, "end")) return {};
  for (const NodeProto* n : {mul, add, alpha, where, cast, zeros, zshape}) nodes.push_back(indexOfNode(n));
  std::vector<std::string> parts{m};
  if (const NodeProto* any = madeBy(m, "Or", 2)) {
    nodes.push_back(indexOfNode(any));
    parts.clear();
    for (const std::string& in : any->input()) {
      const NodeProto* c = madeBy(in, "Cast", 1);
      if (!isCastTo(c, ::onnx::TensorProto::BOOL)) return {};
      nodes.push_back(indexOfNode(c));
      parts.push_back(c->input(0));
    }
  }
  for (const std::string& part : parts) {
    if (const NodeProto* u = madeBy(part, "Unsqueeze", 2); u && !pat.consts.count("mask_shape")) {
      if (!findTorchCausal(u, pat, nodes, roots)) return {};
      shaped.insert(pat.input);  // the mask's Tq from the Shape of the batch-first input (a cross-attention's Tk
                                 // from its keys': findTorchCrossAttention)
    } else if (const NodeProto* r = madeBy(part, "Reshape", 2); r && !pat.consts.count("kpm_flat")) {
      findTorchKeyPadding(r, pat, nodes, roots);
    } else {
      return {};
    }
  }
  return add->output(0);
}

// attn_mask causal (torch_peer's ones(Tq, Tk).triu(1 + Tk - Tq) of bools): Unsqueeze(Trilu(ConstantOfShape(true,
// [Tq, Tk]), 1 + Tk - Tq)), the shape, the diagonal and the axes checked by torchCausal.
bool Importer::findTorchCausal(const NodeProto* unsq, Pattern& pat, std::vector<int>& nodes,
                               std::vector<std::string>& roots) {
  const NodeProto* tri = madeBy(unsq->input(0), "Trilu", 2);
  if (!tri || !intIs(*tri, "upper", 1, 1)) return false;
  const NodeProto* ones = madeBy(tri->input(0), "ConstantOfShape", 1);
  if (!ones || !fillIs(*ones, ::onnx::TensorProto::BOOL, 1)) return false;
  pat.consts["mask_shape"] = ones->input(0);
  pat.consts["mask_ones"] = ones->output(0);
  pat.consts["mask_k"] = tri->input(1);
  pat.consts["mask_tri"] = tri->output(0);
  pat.consts["mask_axes"] = unsq->input(1);
  pat.consts["mask_unsqueezed"] = unsq->output(0);
  for (const std::string& r : {ones->input(0), tri->input(1), unsq->input(1)}) roots.push_back(r);
  for (const NodeProto* n : {unsq, tri, ones}) nodes.push_back(indexOfNode(n));
  return true;
}

// key_padding_mask as torch_peer builds it from valid_lens: lens = Reshape(valid_lens, [-1, 1]) (or valid_lens
// itself), pad = GreaterOrEqual(Unsqueeze(Range(0, Cast(Tk, float), 1), [0]) (or the Range itself), lens), with the
// guard And(pad, Not(empty)), empty = Unsqueeze(Reshape(LessOrEqual(lens, 0), [-1]), [1]); then torch's Reshape to
// [N, 1, 1, Tk], Expand over the heads and Reshape to [N * heads, 1, Tk] (`flat`). From `flat` on this is torch's
// key padding mask, so a node of another op (a Greater for the >=, an Or for the And) is refused naming it once the
// rest of the layer is found (pat.refusal); the constants are checked by torchKeyPadding.
void Importer::findTorchKeyPadding(const NodeProto* flat, Pattern& pat, std::vector<int>& nodes,
                                   std::vector<std::string>& roots) {
  // The first node at fault is the one named.
  auto refuse = [&](const NodeProto* n, std::string why) {
    if (pat.refused) return;
    pat.refused = n;
    pat.refusal = std::move(why);
  };
  // The node making input k of `reader`, when it is `op` (an Unsqueeze with its axes as an input from opset 13,
  // as an attribute before); otherwise the refusal names it (or the reader, when no node makes that input).
  auto step = [&](const NodeProto* reader, int k, const char* op, int inputs, const std::string& why) -> const NodeProto* {
    const NodeProto* n = madeBy(reader->input(k), op, inputs);
    if (!n && std::string(op) == "Unsqueeze") n = madeBy(reader->input(k), op, 1);
    if (n) {
      nodes.push_back(indexOfNode(n));
      return n;
    }
    const auto it = producer_.find(reader->input(k));
    refuse(it == producer_.end() ? reader : &g_.node(it->second),
           why + ": torch writes a " + op + " there (torch_peer's key_padding_mask = arange(Tk) >= lens)");
    return nullptr;
  };
  // A Reshape or Unsqueeze of the mask, its shape or axes (`role`) checked when the layer is made: an input, a root
  // of the shape arithmetic, or an Unsqueeze's attribute.
  auto shaping = [&](const NodeProto* n, const std::string& role) {
    pat.consts[role] = n->output(0);
    if (n->input_size() == 2) {
      pat.consts[role + "_to"] = n->input(1);
      roots.push_back(n->input(1));
    }
    if (n->op_type() == "Reshape" && !intIs(*n, "allowzero", 0, 0))
      refuse(n, "reshapes the key padding mask with allowzero: torch's Reshape copies a 0 from the input");
  };
  nodes.push_back(indexOfNode(flat));
  shaping(flat, "kpm_flat");
  const NodeProto* expand = step(flat, 0, "Expand", 2, "makes the key padding mask flattened over the heads");
  if (!expand) return;
  pat.consts["kpm_expanded"] = expand->output(0);
  pat.consts["kpm_expanded_to"] = expand->input(1);
  roots.push_back(expand->input(1));
  const NodeProto* mask = step(expand, 0, "Reshape", 2, "makes the key padding mask expanded over the heads");
  if (!mask) return;
  shaping(mask, "kpm_mask");
  const NodeProto* pad = madeBy(mask->input(0), "And", 2);
  if (pad) {  // the guard: pad & ~empty
    nodes.push_back(indexOfNode(pad));
    pat.consts["kpm_guarded"] = pad->output(0);
    const int k = madeBy(pad->input(0), "Not", 1) ? 0 : 1;
    const NodeProto* no = step(pad, k, "Not", 1, "makes what the key padding mask's guard leaves out");
    const NodeProto* ge = step(pad, 1 - k, "GreaterOrEqual", 2, "compares the key indices with the valid lengths");
    if (!no || !ge) return;
    const NodeProto* empty = step(no, 0, "Unsqueeze", 2, "makes the samples of length 0 a column");
    if (!empty) return;
    shaping(empty, "kpm_empty");
    const NodeProto* flatEmpty = step(empty, 0, "Reshape", 2, "makes the samples of length 0 one per sample");
    if (!flatEmpty) return;
    shaping(flatEmpty, "kpm_empty_flat");
    const NodeProto* le = step(flatEmpty, 0, "LessOrEqual", 2, "finds the samples of length 0");
    if (!le) return;
    pat.consts["kpm_le"] = le->output(0);
    if (le->input(0) != ge->input(1))
      return refuse(le, "finds the samples of length 0 in " + quoted(le->input(0)) + ", not in the lengths the keys "
                        "are compared with, " + quoted(ge->input(1)));
    pad = ge;
  } else {
    pad = step(mask, 0, "GreaterOrEqual", 2, "compares the key indices with the valid lengths");
    if (!pad) return;
  }
  pat.consts["kpm_ge"] = pad->output(0);
  // The lengths: valid_lens, or its Reshape to [-1, 1].
  pat.lens = pad->input(1);
  if (const NodeProto* lens = madeBy(pad->input(1), "Reshape", 2)) {
    nodes.push_back(indexOfNode(lens));
    shaping(lens, "kpm_lens");
    pat.lens = lens->input(0);
  }
  // The key indices: Range(0, Cast(Tk, float), 1), or its Unsqueeze to a row.
  const NodeProto* range = madeBy(pad->input(0), "Range", 3);
  if (!range) {
    const NodeProto* row = step(pad, 0, "Unsqueeze", 2, "makes the key indices a row");
    if (!row) return;
    shaping(row, "kpm_row");
    range = step(row, 0, "Range", 3, "counts the keys");
    if (!range) return;
  } else {
    nodes.push_back(indexOfNode(range));
  }
  pat.consts["kpm_range"] = range->output(0);
  const NodeProto* count = madeBy(range->input(1), "Cast", 1);
  if (!isCastTo(count, ::onnx::TensorProto::FLOAT))
    return refuse(range, "counts the keys up to " + quoted(range->input(1)) + ", not to the keys' count Cast to "
                         "the lengths' float type (torch_peer's arange(Tk, dtype=lens.dtype))");
  nodes.push_back(indexOfNode(count));
  pat.consts["kpm_tk"] = count->input(0);
  roots.push_back(count->input(0));
}

bool Importer::torchShapeOnly(const NodeProto* n) const {
  return isOp(n, "Transpose", 1) && permOf(*n) == std::vector<int64_t>{1, 0, 2} && torchReaders(n->output(0)).empty();
}

const NodeProto* Importer::torchKeyHeadsReader(const std::string& heads) const {
  const NodeProto* r = nullptr;
  for (const NodeProto* n : torchReaders(heads)) {
    if (torchShapeOnly(n)) continue;
    if (r) return nullptr;
    r = n;
  }
  return r && r->output_size() == 1 ? r : nullptr;
}

// With a key padding mask torch reads Tk from the keys' batch-first tensor (for the Range) and from k's heads
// transposed (for the mask's Reshapes): both belong to the pattern. With the guard, its Where(Unsqueeze(empty, [2]),
// Expand(out_proj.bias (0 without biases), Shape(tb)), tb) gives a sample of length 0 out_proj's bias, and its
// output is the layer's; a guarded mask without it, or a Where of other values, is refused naming the node.
void Importer::finishTorchKeyPadding(Pattern& pat, const NodeProto* tb, std::vector<int>& nodes,
                                     std::vector<std::string>& roots, std::set<std::string>& shaped) {
  shaped.insert(pat.more.empty() ? pat.input : pat.more[0]);
  for (const NodeProto* r : torchReaders(pat.consts.at("k_heads")))
    if (torchShapeOnly(r)) {
      nodes.push_back(indexOfNode(r));
      shaped.insert(r->output(0));
      pat.consts["kpm_k_t"] = r->output(0);
    }
  if (!pat.consts.count("kpm_guarded")) return;
  const NodeProto* guard = torchOnly(tb->output(0));
  if (!isOp(guard, "Where", 3) || guard->input(2) != tb->output(0)) {
    node_ = &g_.node(producer_.at(pat.consts.at("kpm_guarded")));
    fail("leaves the samples of length 0 out of the key padding mask, but no Where gives them out_proj's bias "
         "after the layer, as torch_peer's guard does");
  }
  node_ = guard;
  const NodeProto* u = madeBy(guard->input(0), "Unsqueeze", 2);
  if (!u) u = madeBy(guard->input(0), "Unsqueeze", 1);  // its axes an attribute below opset 13
  if (!u || u->input(0) != pat.consts.at("kpm_empty"))
    fail("replaces the attention's output where " + quoted(guard->input(0)) + " holds, not for the samples of "
         "length 0 of its key padding mask");
  const NodeProto* bias = madeBy(guard->input(1), "Expand", 2);
  const NodeProto* sh = bias ? madeBy(bias->input(1), "Shape", 1) : nullptr;
  if (!sh || sh->input(0) != tb->output(0) || attrOf(*sh, "start") || attrOf(*sh, "end"))
    fail("replaces the output of a sample of length 0 by " + quoted(guard->input(1)) + ", not by a value expanded "
         "to the output's Shape");
  const bool biased = pat.consts.count("out_b") > 0;
  if (biased ? bias->input(0) != pat.consts.at("out_b") : scalar(bias->input(0)) != 0.0) {
    node_ = bias;
    fail("gives a sample of length 0 " + quoted(bias->input(0)) + ", not out_proj's bias" +
         (biased ? "" : " (0 without biases)") + " as gpunodes' MultiheadAttention does");
  }
  pat.consts["kpm_guard"] = u->output(0);
  if (u->input_size() == 2) {
    pat.consts["kpm_guard_to"] = u->input(1);
    roots.push_back(u->input(1));
  }
  for (const NodeProto* n : {guard, u, bias, sh}) nodes.push_back(indexOfNode(n));
  pat.output = guard->output(0);
}

// The causal mask's values: [Tq, Tk] from diagonal 1 + Tk - Tq, before the batch and heads. torch_peer's
// triu(1 + Tk - Tq) aligns the keys to the end, as gpunodes' causal mask does: with as many keys as queries (self-
// attention) that is diagonal 1; with more keys query i also sees the Tk - Tq extra ones. Torch reads Tq from the
// Shape of q's batch-first tensor and Tk from k's; fewer keys than queries is refused (gpunodes' layer refuses it,
// and torch gives the rows with no key NaN).
bool Importer::torchCausal(const Pattern& p, TorchShapes& sh, int64_t t, int64_t tk, int64_t e) {
  if (!p.consts.count("mask_shape")) return false;
  sh.shapes[p.input] = {{1, 0}, {0, t}, {0, e}};
  if (!p.more.empty()) sh.shapes[p.more[0]] = {{1, 0}, {0, tk}, {0, e}};
  const std::vector<Lin> ms = torchValues(sh, p, "mask_shape", "the mask's shape", "mask_ones");
  if (ms != std::vector<Lin>{{0, t}, {0, tk}})
    fail("fills a mask of " + symStr(ms) + ", not [" + str(t) + ", " + str(tk) + "]: the causal mask of " +
         str(t) + " queries and " + str(tk) + " keys");
  if (tk < t)
    fail("fills a causal mask of " + str(t) + " queries and only " + str(tk) + " keys: gpunodes' causal "
         "MultiheadAttention needs at least as many keys as queries (keys aligned to the end)");
  const std::vector<Lin> k = torchValues(sh, p, "mask_k", "the mask's diagonal", "mask_tri");
  if (k != std::vector<Lin>{{0, 1 + tk - t}})
    fail("masks from diagonal " + symStr(k) + ", not " + str(1 + tk - t) + " (1 + Tk - Tq): gpunodes' causal mask "
         "hides from query i the keys past i + " + str(tk - t) + ", and only those");
  if (const std::vector<Lin> axes = torchValues(sh, p, "mask_axes", "the mask's axes", "mask_unsqueezed");
      axes != std::vector<Lin>{{0, 0}})
    fail("unsqueezes the mask along " + symStr(axes) + ", not 0 (before the batch and heads)");
  return true;
}

// The key padding mask's values, each refused naming its node: the lengths Reshaped to [-1, 1], the key indices
// 0, 1, ..., Tk - 1 as a row, the samples of length 0 those <= 0 as a column (and [N, 1, 1] for the guard), the mask
// Reshaped to [N, 1, 1, Tk], Expanded to [N, heads, 1, Tk] and Reshaped to [N * heads, 1, Tk]. The lengths' layer
// (one per sample, [1]), for valid_lens.
int Importer::torchKeyPadding(const Pattern& p, TorchShapes& sh, int64_t e, int64_t heads, int64_t d, int64_t tk) {
  sh.shapes[p.more.empty() ? p.input : p.more[0]] = {{1, 0}, {0, tk}, {0, e}};
  if (p.consts.count("kpm_k_t")) sh.shapes[p.consts.at("kpm_k_t")] = {{heads, 0}, {0, tk}, {0, d}};
  // A Reshape's shape or an Unsqueeze's axes (an input, or below opset 13 the attribute).
  auto expect = [&](const char* role, const std::vector<Lin>& want, const char* what) {
    if (!p.consts.count(role)) return;
    std::vector<Lin> v;
    if (p.consts.count(std::string(role) + "_to")) {
      v = torchValues(sh, p, std::string(role) + "_to", what, role);
    } else {
      blame(p, role);
      if (const AttributeProto* a = attrOf(*node_, "axes"); a && a->type() == AttributeProto::INTS)
        for (int64_t x : a->ints()) v.push_back({0, x});
    }
    if (v != want) fail(std::string(what) + " is " + symStr(v) + ", not " + symStr(want));
  };
  expect("kpm_lens", {{0, -1}, {0, 1}}, "the valid lengths' shape");
  expect("kpm_row", {{0, 0}}, "the key indices' unsqueezed axis");
  expect("kpm_empty_flat", {{0, -1}}, "the samples of length 0's shape");
  expect("kpm_empty", {{0, 1}}, "the samples of length 0's unsqueezed axis");
  expect("kpm_guard", {{0, 2}}, "the guard's unsqueezed axis");
  expect("kpm_mask", {{1, 0}, {0, 1}, {0, 1}, {0, tk}}, "the key padding mask's shape");
  expect("kpm_flat", {{heads, 0}, {0, 1}, {0, tk}}, "the key padding mask's shape over the heads");
  // One float constant equal to `want`, as the walk read it (its bytes are no longer in the file's message).
  auto is = [&](const std::string& name, float want) {
    const auto it = values_.find(name);
    return it != values_.end() && it->second.kind == Value::Const && !it->second.zeros && !it->second.expanded &&
           !it->second.c.integer && it->second.c.numel() == 1 && it->second.c.f[0] == want;
  };
  blame(p, "kpm_range");
  const NodeProto& range = *node_;
  if (!is(range.input(0), 0) || !is(range.input(2), 1))
    fail("counts the keys from " + quoted(range.input(0)) + " by " + quoted(range.input(2)) +
         ", not from 0 by 1: the key indices 0 to Tk - 1");
  if (const std::vector<Lin> n = torchValues(sh, p, "kpm_tk", "the keys' count", "kpm_range");
      n != std::vector<Lin>{{0, tk}})
    fail("counts the keys up to " + symStr(n) + ", not to their count " + str(tk));
  if (p.consts.count("kpm_le")) {
    blame(p, "kpm_le");
    if (!is(node_->input(1), 0))
      fail("guards the samples of length <= " + quoted(node_->input(1)) + ", not <= 0: a sample of length 0 has "
           "every key masked, and only such a sample");
  }
  // Expand's shape: what broadcasts [N, 1, 1, Tk] to [N, heads, 1, Tk].
  const std::vector<Lin> to = torchValues(sh, p, "kpm_expanded_to", "the expanded mask's shape", "kpm_expanded");
  if (to.size() != 4 || !(to[0] == Lin{0, 1} || to[0] == Lin{1, 0}) || to[1] != Lin{0, heads} || to[2] != Lin{0, 1} ||
      !(to[3] == Lin{0, 1} || to[3] == Lin{0, tk}))
    fail("expands the key padding mask [N, 1, 1, " + str(tk) + "] by " + symStr(to) + ", not over the " +
         str(heads) + " heads");
  blame(p, "kpm_ge");
  const int lens = activationOf(p.lens, "valid lengths");
  if (shapeOf(lens) != Shape{1})
    fail("masks the keys by " + quoted(p.lens) + " of shape " + shapeStr(shapeOf(lens)) +
         ": gpunodes' valid_lens is one length per sample, [1]");
  return lens;
}

}  // namespace gn::nodes::onnx::import_detail
