// torch 1.13's own decomposition of nn.MultiheadAttention(E, heads, batch_first=True), as torch.onnx.export
// writes it: self-attention (one in_proj MatMul Sliced into q, k and v, with or without biases, causal or not)
// and cross-attention (q from one tensor, k and v from another, or from two; causal or not, with Tk >= Tq), each
// read back as one MultiheadAttention layer. Apart from onnx_import_patterns.cpp because torch's shape arithmetic,
// which every Reshape and Slice of these reads, needs an evaluator of its own (onnx_import_torch_shapes.cpp); the
// masks torch adds to the scores are read in onnx_import_torch_mask.cpp.
#include "onnx_importer_internal.h"

#include "../layer_nodes.h"

namespace gn::nodes::onnx::import_detail {

namespace {

// A float attribute that is absent (Gemm's alpha and beta, 1 by default) or equal to want.
bool floatIs(const NodeProto& n, const char* name, float want) {
  const AttributeProto* a = attrOf(n, name);
  return a ? a->type() == AttributeProto::FLOAT && a->f() == want : want == 1.0f;
}

}  // namespace

// The readers of a value other than its Shape nodes (those are checked with the shape arithmetic), and the one
// such reader when there is exactly one.
std::vector<const NodeProto*> Importer::torchReaders(const std::string& value) const {
  std::vector<const NodeProto*> r;
  if (const auto it = consumers_.find(value); it != consumers_.end())
    for (int k : it->second)
      if (g_.node(k).op_type() != "Shape") r.push_back(&g_.node(k));
  return r;
}
const NodeProto* Importer::torchOnly(const std::string& value) const {
  const std::vector<const NodeProto*> r = torchReaders(value);
  return r.size() == 1 && r[0]->output_size() == 1 ? r[0] : nullptr;
}

// nn.MultiheadAttention(E, heads, bias, batch_first=True)(x, x, x, need_weights=False) as torch 1.13 writes
// it: Transpose to time-major [T, N, E]; MatMul by in_proj_weight's transpose [E, 3E] (+ Add of in_proj_bias);
// three Slices of the last axis into q, k and v, each Reshaped to [T, N * heads, d] and Transposed to
// [N * heads, T, d] (k to [N * heads, d, T]); q Div by sqrt(d); MatMul, Softmax, MatMul by v; Transpose and
// Reshape to [T * N, E]; out_proj as a Gemm with transB (with its bias) or a MatMul by the transposed weight
// (without); Reshape to [T, N, E] and Transpose back; a causal attn_mask or a key_padding_mask added to the scores
// before the Softmax (findTorchMask). The Slices' bounds and the Reshapes' shapes are
// computed from Shape nodes of these tensors (Gather, Div, Mul, Unsqueeze, Concat...): those nodes belong to
// the pattern, and every value the pattern makes is read only inside it, or the nodes are read one by one.
void Importer::findTorchAttention(int i) {
  const NodeProto& t0 = g_.node(i);
  if (!isOp(&t0, "Transpose", 1) || permOf(t0) != std::vector<int64_t>{1, 0, 2}) return;
  auto readers = [&](const std::string& v) { return torchReaders(v); };
  auto only = [&](const std::string& v) { return torchOnly(v); };
  Pattern pat{LayerKind::MultiheadAttention, t0.input(0), "", i};
  pat.torch = true;
  const std::string& xt = t0.output(0);
  std::vector<int> nodes{i};
  std::vector<std::string> roots;  // the shape values the pattern reads
  std::set<std::string> shaped{xt};  // the values whose Shape the arithmetic may read
  const NodeProto* mm = only(xt);
  if (!isOp(mm, "MatMul", 2) || mm->input(0) != xt || !isInitializer(mm->input(1))) return;
  pat.consts["in_w"] = mm->input(1);
  pat.consts["xt"] = xt;
  pat.consts["proj_mm"] = mm->output(0);
  nodes.push_back(indexOfNode(mm));
  std::string proj = mm->output(0);
  shaped.insert(proj);
  std::vector<const NodeProto*> rd = readers(proj);
  if (rd.size() == 1 && isOp(rd[0], "Add", 2)) {
    const std::string* b = other(*rd[0], proj);
    if (!b || !isInitializer(*b)) return;
    pat.consts["in_b"] = *b;
    nodes.push_back(indexOfNode(rd[0]));
    proj = rd[0]->output(0);
    shaped.insert(proj);
    rd = readers(proj);
  }
  pat.consts["proj"] = proj;
  // q, k and v: three Slices of the projection, each starting where the one before it ends.
  if (rd.size() != 3) return;
  for (const NodeProto* s : rd)
    if (!isOp(s, "Slice", 4) || s->input(0) != proj) return;
  const NodeProto* sl[3] = {nullptr, nullptr, nullptr};
  for (const NodeProto* s : rd) {
    bool follows = false;
    for (const NodeProto* t : rd) follows = follows || (t != s && t->input(2) == s->input(1));
    if (!follows) {
      if (sl[0]) return;
      sl[0] = s;
    }
  }
  for (int k = 1; k < 3 && sl[k - 1]; ++k)
    for (const NodeProto* s : rd)
      if (s != sl[k - 1] && s != sl[0] && s->input(1) == sl[k - 1]->input(2)) sl[k] = s;
  if (!sl[0] || !sl[1] || !sl[2] || sl[1] == sl[2]) return;
  static const char* role[3] = {"q", "k", "v"};
  static const std::vector<int64_t> headPerm[3] = {{1, 0, 2}, {1, 2, 0}, {1, 0, 2}};
  std::string heads[3];
  for (int k = 0; k < 3; ++k) {
    const std::string r = role[k];
    pat.consts[r + "_start"] = sl[k]->input(1);
    pat.consts[r + "_end"] = sl[k]->input(2);
    pat.consts[r + "_axes"] = sl[k]->input(3);
    pat.consts[r] = sl[k]->output(0);
    shaped.insert(sl[k]->output(0));
    for (int in = 1; in <= 3; ++in) roots.push_back(sl[k]->input(in));
    const NodeProto* re = only(sl[k]->output(0));
    if (!isOp(re, "Reshape", 2) || re->input(0) != sl[k]->output(0) || !intIs(*re, "allowzero", 0, 0)) return;
    pat.consts[r + "_shape"] = re->input(1);
    pat.consts[r + "_heads"] = re->output(0);
    roots.push_back(re->input(1));
    const NodeProto* t = k == 1 ? torchKeyHeadsReader(re->output(0)) : only(re->output(0));
    if (!isOp(t, "Transpose", 1) || permOf(*t) != headPerm[k]) return;
    for (const NodeProto* n : {sl[k], re, t}) nodes.push_back(indexOfNode(n));
    heads[k] = t->output(0);
  }
  const NodeProto* div = only(heads[0]);
  if (!isOp(div, "Div", 2) || div->input(0) != heads[0]) return;
  const std::optional<double> root = scalar(div->input(1));
  if (!root) return;
  pat.factor = *root;
  pat.consts["scaled"] = div->output(0);
  const NodeProto* raw = only(div->output(0));
  if (!isOp(raw, "MatMul", 2) || raw->input(0) != div->output(0) || raw->input(1) != heads[1] ||
      only(heads[1]) != raw)
    return;
  const std::string scores = findTorchMask(pat, raw->output(0), nodes, roots, shaped);
  if (scores.empty()) return;
  const NodeProto* sm = only(scores);
  for (const NodeProto* n : {div, raw}) nodes.push_back(indexOfNode(n));
  finishTorchAttention(std::move(pat), sm, heads[2], std::move(nodes), std::move(roots), std::move(shaped));
}

// nn.MultiheadAttention(E, heads, bias, batch_first=True)(q, k, v, need_weights=False) with k not q, as torch
// 1.13 writes it: each of q and k (and v when it is another tensor) Transposed to time-major and projected apart.
// With v = k, torch slices in_proj_weight (and in_proj_bias) in the graph, rows [0, E) for q and [E, 3E) for k and
// v together, Transposes the slices and MatMuls by them, and Slices the [Tk, N, 2E] projection into k and v as
// self-attention does; with v another tensor, its constant folding leaves each projection's transposed weight
// and its bias as initializers of their own. From the heads on it is self-attention's form, with the keys' T; a
// causal mask reads Tq and Tk from the Shapes of the batch-first q and k (torchCausal checks it is gpunodes').
void Importer::findTorchCrossAttention(int i) {
  const NodeProto& t0 = g_.node(i);
  if (!isOp(&t0, "Transpose", 1) || permOf(t0) != std::vector<int64_t>{1, 0, 2}) return;
  auto only = [&](const std::string& v) { return torchOnly(v); };
  Pattern pat{LayerKind::MultiheadAttention, t0.input(0), "", i};
  pat.torch = true;
  std::vector<int> nodes;
  std::vector<std::string> roots;
  std::set<std::string> shaped;
  // q's heads, forward from the Transpose: MatMul, Add of the bias (or none), Reshape, Transpose.
  const NodeProto* mm = only(t0.output(0));
  if (!isOp(mm, "MatMul", 2) || mm->input(0) != t0.output(0)) return;
  std::string qProj = mm->output(0);
  if (const NodeProto* add = only(qProj); isOp(add, "Add", 2)) qProj = add->output(0);
  const NodeProto* qRe = only(qProj);
  const NodeProto* qT = qRe ? only(qRe->output(0)) : nullptr;
  if (!isOp(qT, "Transpose", 1)) return;
  // A weight: an initializer (torch's folding, already [in, out]), or the Transpose of a Slice of one (rows of
  // in_proj_weight); a bias: an initializer or a Slice of one. The Slices' bounds are shape arithmetic.
  auto weight = [&](const std::string& role, std::string v, bool matrix) {
    if (isInitializer(v)) {
      pat.consts[role] = v;
      return true;
    }
    if (matrix) {
      const NodeProto* tr = madeBy(v, "Transpose", 1);
      if (!tr || permOf(*tr) != std::vector<int64_t>{1, 0}) return false;
      nodes.push_back(indexOfNode(tr));
      v = tr->input(0);
    }
    const NodeProto* sl = madeBy(v, "Slice", 4);
    if (!sl || !isInitializer(sl->input(0))) return false;
    pat.consts[role] = sl->input(0);
    pat.consts[role + "_start"] = sl->input(1);
    pat.consts[role + "_end"] = sl->input(2);
    pat.consts[role + "_axes"] = sl->input(3);
    for (int in = 1; in <= 3; ++in) roots.push_back(sl->input(in));
    nodes.push_back(indexOfNode(sl));
    return true;
  };
  // A projection back from its output: [Add of the bias to] MatMul of the time-major Transpose of `source`.
  auto projection = [&](const std::string& r, const std::string& pv, std::string* source) {
    const NodeProto* add = madeBy(pv, "Add", 2);
    const NodeProto* pm = madeBy(pv, "MatMul", 2);
    std::string bias;
    for (int k = 0; add && k < 2; ++k)
      if (const NodeProto* m = madeBy(add->input(k), "MatMul", 2)) {
        pm = m;
        bias = add->input(1 - k);
      }
    if (!pm || (add && bias.empty())) return false;
    const NodeProto* tx = madeBy(pm->input(0), "Transpose", 1);
    if (!tx || permOf(*tx) != std::vector<int64_t>{1, 0, 2}) return false;
    if (!weight(r + "_w", pm->input(1), true) || (add && !weight(r + "_b", bias, false))) return false;
    pat.consts[r + "_x"] = pm->input(0);
    pat.consts[r + "_mm"] = pm->output(0);
    pat.consts[r + "_proj"] = pv;
    for (const std::string& v : {pm->input(0), pm->output(0), pv}) shaped.insert(v);
    for (const NodeProto* n : {tx, pm, add})
      if (n) nodes.push_back(indexOfNode(n));
    *source = tx->input(0);
    return true;
  };
  // A role's heads back from the Transpose into [N * heads, T, d] (k's into [N * heads, d, T]) and its Reshape.
  auto headsOf = [&](const std::string& r, const std::string& h, const std::vector<int64_t>& perm) -> std::string {
    const NodeProto* t = madeBy(h, "Transpose", 1);
    const NodeProto* re = t && permOf(*t) == perm ? madeBy(t->input(0), "Reshape", 2) : nullptr;
    if (!re || !intIs(*re, "allowzero", 0, 0)) return {};
    pat.consts[r + "_shape"] = re->input(1);
    pat.consts[r + "_heads"] = re->output(0);
    roots.push_back(re->input(1));
    for (const NodeProto* n : {t, re}) nodes.push_back(indexOfNode(n));
    return re->input(0);
  };
  std::string q;
  if (headsOf("q", qT->output(0), {1, 0, 2}) != qProj || !projection("q", qProj, &q) ||
      pat.consts.at("q_x") != t0.output(0))
    return;
  const NodeProto* div = only(qT->output(0));
  if (!isOp(div, "Div", 2) || div->input(0) != qT->output(0)) return;
  const std::optional<double> root = scalar(div->input(1));
  if (!root) return;
  pat.factor = *root;
  pat.consts["scaled"] = div->output(0);
  const NodeProto* raw = only(div->output(0));
  if (!isOp(raw, "MatMul", 2) || raw->input(0) != div->output(0)) return;
  const std::string scores = findTorchMask(pat, raw->output(0), nodes, roots, shaped);
  const NodeProto* sm = scores.empty() ? nullptr : only(scores);
  const NodeProto* ctx = sm ? only(sm->output(0)) : nullptr;
  if (!isOp(ctx, "MatMul", 2)) return;
  const std::string ks = headsOf("k", raw->input(1), {1, 2, 0}), vs = headsOf("v", ctx->input(1), {1, 0, 2});
  if (ks.empty() || vs.empty()) return;
  std::string k, v;
  const NodeProto* kSl = madeBy(ks, "Slice", 4);
  const NodeProto* vSl = madeBy(vs, "Slice", 4);
  if (kSl && vSl && kSl->input(0) == vSl->input(0)) {  // v = k: one projection of 2E, sliced
    for (const auto& [r, sl] : {std::pair{std::string("k"), kSl}, std::pair{std::string("v"), vSl}}) {
      pat.consts[r + "_start"] = sl->input(1);
      pat.consts[r + "_end"] = sl->input(2);
      pat.consts[r + "_axes"] = sl->input(3);
      pat.consts[r] = sl->output(0);
      shaped.insert(sl->output(0));
      for (int in = 1; in <= 3; ++in) roots.push_back(sl->input(in));
      nodes.push_back(indexOfNode(sl));
    }
    if (!projection("kv", kSl->input(0), &k)) return;
    v = k;
  } else if (ks == vs || !projection("k", ks, &k) || !projection("v", vs, &v)) {
    return;
  }
  if (k == q) return;  // self-attention with its projections apart is not what torch writes
  // torch's bias gives every projection its bias, or none.
  const bool biased = pat.consts.count("q_b") > 0;
  for (const std::string r : {"kv", "k", "v"})
    if (pat.consts.count(r + "_w") && (pat.consts.count(r + "_b") > 0) != biased) return;
  if (biased) pat.consts["in_b"] = pat.consts.at("q_b");
  pat.more = v == k ? std::vector<std::string>{k} : std::vector<std::string>{k, v};
  if (pat.consts.count("mask_shape")) shaped.insert(k);  // a causal mask's Tk from the Shape of the batch-first keys
  for (const NodeProto* n : {div, raw}) nodes.push_back(indexOfNode(n));
  finishTorchAttention(std::move(pat), sm, ctx->input(1), std::move(nodes), std::move(roots), std::move(shaped));
}

// From the Softmax on (the same in self- and cross-attention): MatMul by v's heads, Transpose and Reshape to
// [Tq * N, E], out_proj, Reshape and Transpose back; then the shape arithmetic behind `roots`, and the check that
// nothing outside reads what the pattern makes.
void Importer::finishTorchAttention(Pattern pat, const NodeProto* sm, const std::string& vHeads, std::vector<int> nodes,
                                    std::vector<std::string> roots, std::set<std::string> shaped) {
  auto only = [&](const std::string& v) { return torchOnly(v); };
  if (!isOp(sm, "Softmax", 1) || !(intIs(*sm, "axis", -1, -1) || intIs(*sm, "axis", -1, 2))) return;
  nodes.push_back(indexOfNode(sm));
  const NodeProto* ctx = only(sm->output(0));
  if (!isOp(ctx, "MatMul", 2) || ctx->input(0) != sm->output(0) || ctx->input(1) != vHeads || only(vHeads) != ctx)
    return;
  const NodeProto* ct = only(ctx->output(0));
  if (!isOp(ct, "Transpose", 1) || permOf(*ct) != std::vector<int64_t>{1, 0, 2}) return;
  const NodeProto* merged = only(ct->output(0));
  if (!isOp(merged, "Reshape", 2) || merged->input(0) != ct->output(0) || !intIs(*merged, "allowzero", 0, 0)) return;
  pat.consts["merged_shape"] = merged->input(1);
  pat.consts["merged"] = merged->output(0);
  roots.push_back(merged->input(1));
  const NodeProto* op = only(merged->output(0));
  if (!op || op->output_size() != 1 || op->input_size() < 2 || op->input(0) != merged->output(0) ||
      !isInitializer(op->input(1)))
    return;
  if (op->op_type() == "Gemm" && op->input_size() <= 3 && intIs(*op, "transA", 0, 0) && intIs(*op, "transB", 0, 1) &&
      floatIs(*op, "alpha", 1.0f) && floatIs(*op, "beta", 1.0f)) {
    pat.gemm = true;
    if (op->input_size() == 3 && !op->input(2).empty()) {
      if (!isInitializer(op->input(2))) return;
      pat.consts["out_b"] = op->input(2);
    }
  } else if (!isOp(op, "MatMul", 2)) {
    return;
  }
  // torch's bias gives both projections their biases, or neither, as gpunodes' bias param does.
  if (pat.consts.count("in_b") != pat.consts.count("out_b")) return;
  pat.consts["out_w"] = op->input(1);
  pat.consts["outp"] = op->output(0);
  shaped.insert(op->output(0));
  const NodeProto* back = only(op->output(0));
  if (!isOp(back, "Reshape", 2) || back->input(0) != op->output(0) || !intIs(*back, "allowzero", 0, 0)) return;
  pat.consts["out_shape"] = back->input(1);
  pat.consts["out"] = back->output(0);
  roots.push_back(back->input(1));
  const NodeProto* tb = only(back->output(0));
  if (!isOp(tb, "Transpose", 1) || permOf(*tb) != std::vector<int64_t>{1, 0, 2}) return;
  for (const NodeProto* n : {ctx, ct, merged, op, back, tb}) nodes.push_back(indexOfNode(n));
  pat.output = tb->output(0);
  // Every node is torch's but one of its key padding mask: that node is at fault.
  if (pat.refused) {
    node_ = pat.refused;
    fail(pat.refusal);
  }
  if (pat.consts.count("kpm_flat")) finishTorchKeyPadding(pat, tb, nodes, roots, shaped);
  // The shape arithmetic behind the roots, back to the Constants (left to the walk, which reads them) and the
  // Shapes of the pattern's own tensors.
  static const std::set<std::string> arithmetic{"Shape", "Gather", "Unsqueeze", "Concat", "Add", "Sub", "Mul", "Div",
                                                "Cast", "Slice", "Squeeze", "ConstantOfShape", "Equal", "Where"};
  std::set<int> all(nodes.begin(), nodes.end());
  std::set<std::string> seen;
  while (!roots.empty()) {
    const std::string v = roots.back();
    roots.pop_back();
    if (v.empty() || !seen.insert(v).second) continue;
    if (seen.size() > 512) return;  // torch writes some 60 such values for one layer
    const auto pr = producer_.find(v);
    if (pr == producer_.end()) {
      if (!isInitializer(v)) return;
      continue;
    }
    const NodeProto& n = g_.node(pr->second);
    if (n.op_type() == "Constant") continue;
    if (!arithmetic.count(n.op_type()) || n.output_size() != 1 || all.count(pr->second)) return;
    all.insert(pr->second);
    if (n.op_type() == "Shape") {
      if (n.input_size() != 1 || !shaped.count(n.input(0))) return;
      continue;
    }
    for (const std::string& in : n.input()) roots.push_back(in);
  }
  // Nothing outside reads what the pattern makes, but for its output.
  for (int k : all)
    for (const std::string& o : g_.node(k).output()) {
      if (o == pat.output) continue;
      for (const auto& go : g_.output())
        if (go.name() == o) return;
      if (const auto it = consumers_.find(o); it != consumers_.end())
        for (int c : it->second)
          if (!all.count(c)) return;
    }
  addPattern(std::move(pat), std::vector<int>(all.begin(), all.end()));
}

int Importer::emitTorchAttention(const Pattern& p, int in) {
  // Cross-attention reads its keys (and values) from p.more, activations as the layer's q is.
  const bool cross = !p.more.empty();
  std::vector<int> ins{in};
  for (const std::string& name : p.more) ins.push_back(activationOf(name, "keys or values"));
  const Shape& s = shapeOf(in);
  const Shape& sk = shapeOf(ins.back());
  if (s.size() != 2 || sk.size() != 2 || sk[1] != s[1] || (ins.size() == 3 && shapeOf(ins[1]) != sk))
    fail("attends over " + shapeStr(s) + " and " + shapeStr(sk) + ": gpunodes' MultiheadAttention reads [T, E] "
         "queries and [Tk, E] keys and values");
  const int64_t t = s[0], e = s[1], tk = sk[0];
  // The tensors whose Shape torch reads, as a * N + b per axis.
  TorchShapes sh(g_, producer_, values_);
  const std::vector<Lin> timeMajor{{0, t}, {1, 0}, {0, e}}, rows{{t, 0}, {0, e}}, keysMajor{{0, tk}, {1, 0}, {0, e}};
  if (!cross) {
    sh.shapes[p.consts.at("xt")] = timeMajor;
    sh.shapes[p.consts.at("proj_mm")] = sh.shapes[p.consts.at("proj")] = {{0, t}, {1, 0}, {0, 3 * e}};
  } else {
    for (const std::string r : {"q", "k", "v", "kv"})
      if (p.consts.count(r + "_x")) {
        const std::vector<Lin> tm = r == "q" ? timeMajor : keysMajor;
        sh.shapes[p.consts.at(r + "_x")] = tm;
        sh.shapes[p.consts.at(r + "_mm")] = sh.shapes[p.consts.at(r + "_proj")] = {tm[0], tm[1], {0, r == "kv" ? 2 * e : e}};
      }
    if (p.consts.count("kv_x")) sh.shapes[p.consts.at("k")] = sh.shapes[p.consts.at("v")] = keysMajor;
  }
  // Self-attention slices q, k and v from one projection of 3E; cross-attention with v = k slices k and v from
  // one of 2E.
  const int64_t first = cross ? 1 : 0;
  for (int k = first; k < (cross && !p.consts.count("kv_x") ? 0 : 3); ++k) {
    const std::string r = k == 0 ? "q" : k == 1 ? "k" : "v";
    const int64_t from = (k - first) * e, to = from + e, width = (3 - first) * e;
    const std::vector<Lin> start = torchValues(sh, p, r + "_start", "a slice's start", r),
                           end = torchValues(sh, p, r + "_end", "a slice's end", r),
                           axes = torchValues(sh, p, r + "_axes", "a slice's axes", r);
    if (start != std::vector<Lin>{{0, from}} || end != std::vector<Lin>{{0, to}} ||
        !(axes == std::vector<Lin>{{0, -1}} || axes == std::vector<Lin>{{0, 2}}))
      fail("slices " + r + " from the in_proj projection [T, N, " + str(width) + "] as " + symStr(start) + " to " +
           symStr(end) + " along " + symStr(axes) + ", not " + str(from) + " to " + str(to) + " of the last axis");
    if (!cross) sh.shapes[p.consts.at(r)] = timeMajor;
  }
  const std::vector<Lin> qs = torchValues(sh, p, "q_shape", "the heads' shape", "q_heads");
  const std::vector<Lin> ks{{0, tk}, qs.size() > 1 ? qs[1] : Lin{}, qs.size() > 2 ? qs[2] : Lin{}};
  if (qs.size() != 3 || qs[0] != Lin{0, t} || qs[1].b || qs[1].a < 1 || qs[2].a || qs[2].b < 1 ||
      qs[1].a * qs[2].b != e)
    fail("reshapes q [" + str(t) + ", N, " + str(e) + "] into heads as " + symStr(qs) +
         ": nn.MultiheadAttention reshapes to [T, N * heads, E / heads]");
  const int64_t heads = qs[1].a, d = qs[2].b;
  if (torchValues(sh, p, "k_shape", "the heads' shape", "k_heads") != ks ||
      torchValues(sh, p, "v_shape", "the heads' shape", "v_heads") != ks)
    fail("reshapes k or v into heads otherwise than q (" + symStr(ks) + ", the keys' T and q's heads)");
  if (const std::vector<Lin> ms = torchValues(sh, p, "merged_shape", "the merged heads' shape", "merged"); ms != rows)
    fail("merges the heads as " + symStr(ms) + ", not [" + str(t) + "N, " + str(e) + "]");
  sh.shapes[p.consts.at("outp")] = rows;
  if (const std::vector<Lin> os = torchValues(sh, p, "out_shape", "the output's shape", "out"); os != timeMajor)
    fail("reshapes out_proj's rows to " + symStr(os) + ", not [" + str(t) + ", N, " + str(e) + "]");
  // The key padding mask first: it knows the keys' Shape, which a causal mask of cross-attention reads too.
  const int lens = p.consts.count("kpm_flat") ? torchKeyPadding(p, sh, e, heads, d, tk) : -1;
  const bool causal = torchCausal(p, sh, t, tk, e);
  blame(p, "scaled");
  if (!near(p.factor, std::sqrt(double(d))))
    fail("divides q by " + std::to_string(p.factor) + ", not sqrt(" + str(d) +
         "): nn.MultiheadAttention scales by 1/sqrt(E / heads)");
  auto transposed = [](const TensorValues& w) {
    TensorValues r;
    r.dims = {w.dims[1], w.dims[0]};
    r.f.resize(w.f.size());
    for (int64_t i = 0; i < w.dims[0]; ++i)
      for (int64_t j = 0; j < w.dims[1]; ++j) r.f[size_t(j * w.dims[0] + i)] = w.f[size_t(i * w.dims[1] + j)];
    return r;
  };
  const bool biased = p.consts.count("in_b") > 0;
  TensorValues inW, inB;
  if (!cross) {
    blame(p, "proj_mm");
    const TensorValues& inWt = constAt(p.consts.at("in_w"), "in_proj_weight");
    needDims(inWt, {e, 3 * e}, "the in_proj MatMul's weight (in_proj_weight transposed)");
    inW = transposed(inWt);
    if (biased) {
      inB = constAt(p.consts.at("in_b"), "in_proj_bias");
      needDims(inB, {3 * e}, "in_proj_bias");
    }
  } else {
    // A projection's rows of in_proj_weight (or its part of in_proj_bias), named by its MatMul: the initializer
    // torch's folding left ([E, rows], transposed), or the rows torch's Slice takes from in_proj_weight.
    auto part = [&](const std::string& role, const std::string& reader, int64_t n, bool matrix) {
      blame(p, reader);
      const char* what = matrix ? "a projection's weight" : "a projection's bias";
      const TensorValues& w = constAt(p.consts.at(role), what);
      if (!p.consts.count(role + "_start")) {
        needDims(w, matrix ? std::vector<int64_t>{e, n} : std::vector<int64_t>{n}, what);
        return matrix ? transposed(w) : w;
      }
      if (w.integer || w.dims.size() != (matrix ? 2u : 1u) || (matrix && w.dims[1] != e))
        fail("slices " + std::string(what) + " from " + shapeStr(w.dims) + ", not from in_proj's [3E" +
             (matrix ? ", " + str(e) : std::string()) + "]");
      const std::vector<Lin> from = torchValues(sh, p, role + "_start", "a slice's start", reader),
                             to = torchValues(sh, p, role + "_end", "a slice's end", reader),
                             axes = torchValues(sh, p, role + "_axes", "a slice's axes", reader);
      if (from.size() != 1 || to.size() != 1 || from[0].a || to[0].a || axes != std::vector<Lin>{{0, 0}} ||
          from[0].b < 0 || to[0].b - from[0].b != n || to[0].b > w.dims[0])
        fail("slices " + std::string(what) + " as rows " + symStr(from) + " to " + symStr(to) + " along " +
             symStr(axes) + " of " + shapeStr(w.dims) + ", not " + str(n) + " rows of the first axis");
      const int64_t cols = matrix ? e : 1;
      TensorValues r;
      r.dims = matrix ? std::vector<int64_t>{n, e} : std::vector<int64_t>{n};
      r.f.assign(w.f.begin() + from[0].b * cols, w.f.begin() + (from[0].b + n) * cols);
      return r;
    };
    const bool kv = p.consts.count("kv_x") > 0;
    std::vector<std::pair<std::string, int64_t>> parts{{"q", e}};
    if (kv) parts.emplace_back("kv", 2 * e);
    else parts.insert(parts.end(), {{"k", e}, {"v", e}});
    inW.dims = {3 * e, e};
    inB.dims = {3 * e};
    for (const auto& [r, n] : parts) {
      const TensorValues w = part(r + "_w", r + "_mm", n, true);
      inW.f.insert(inW.f.end(), w.f.begin(), w.f.end());
      if (biased) {
        const TensorValues b = part(r + "_b", r + "_mm", n, false);
        inB.f.insert(inB.f.end(), b.f.begin(), b.f.end());
      }
    }
  }
  std::vector<std::pair<std::string, TensorValues>> weights{{"in_proj_weight", std::move(inW)}};
  if (biased) weights.emplace_back("in_proj_bias", std::move(inB));
  blame(p, "outp");
  const TensorValues& outW = constAt(p.consts.at("out_w"), "out_proj.weight");
  needDims(outW, {e, e}, "out_proj.weight");
  weights.emplace_back("out_proj.weight", p.gemm ? outW : transposed(outW));
  if (biased) {
    const TensorValues& outB = constAt(p.consts.at("out_b"), "out_proj.bias");
    needDims(outB, {e}, "out_proj.bias");
    weights.emplace_back("out_proj.bias", outB);
  }
  if (lens >= 0) {
    while (ins.size() < 3) ins.push_back(-1);  // k and v open before valid_lens
    ins.push_back(lens);
  }
  node_ = &g_.node(p.first);  // the layer is named by its first node, the Transpose to time-major
  const int layer = addLayer(LayerKind::MultiheadAttention,
                             {{"num_heads", qint64(heads)}, {"bias", biased}, {"causal", causal}}, ins, std::move(weights));
  if (lens >= 0 && !p.consts.count("kpm_guard"))
    net_.warnings.append(net_.layers[layer].id + ": torch's key_padding_mask has no guard for a sample of length 0, "
                         "whose every key it masks: torch gives that sample NaN, gpunodes all-zero weights (each step "
                         "out_proj's bias); every other sample is the same");
  return layer;
}

// The values of `role` as torch's shape arithmetic computes them; a refusal names the producer of `reader`'s value.
std::vector<Lin> Importer::torchValues(const TorchShapes& sh, const Pattern& p, const std::string& role, const char* what,
                                       const std::string& reader) {
  blame(p, reader);
  const std::optional<Sym> v = sh.eval(p.consts.at(role));
  if (!v) fail("computes " + std::string(what) + " by other operations than torch's shape arithmetic of its "
               "own tensors (Shape, Gather, Slice, Squeeze, Unsqueeze, Concat, Add, Sub, Mul, Div, Cast, "
               "ConstantOfShape, Equal and Where of integers)");
  return v->v;
}

}  // namespace gn::nodes::onnx::import_detail
