// The attention layers as gpunodes' own export writes them (onnx_exporter.cpp): MultiheadAttention (with its
// key padding mask), ValidLength and NadarayaWatson as patterns found before the walk; PositionEmbedding, PositionalEncoding and a causal
// Softmax from an Add of a constant; ClassToken from Expand and Concat; BatchMatMul, Mul and Scale from
// MatMul and Mul. A pattern that does not match in every node is not taken: its nodes are read one by one,
// and the first one gpunodes has no layer for is refused as any other.
#include <algorithm>
#include <cmath>

#include "../layer_nodes.h"
#include "onnx_importer_internal.h"

namespace gn::nodes::onnx::import_detail {

namespace {

std::vector<int64_t> intsOf(const NodeProto& n, const char* name) {
  for (const AttributeProto& a : n.attribute())
    if (a.name() == name && a.type() == AttributeProto::INTS) return {a.ints().begin(), a.ints().end()};
  return {};
}
// An integer attribute, `def` when absent, nullopt when it is there but not an integer.
std::optional<int64_t> intOf(const NodeProto& n, const char* name, int64_t def) {
  for (const AttributeProto& a : n.attribute())
    if (a.name() == name) return a.type() == AttributeProto::INT ? std::optional<int64_t>(a.i()) : std::nullopt;
  return def;
}

// 0 where query q sees key k (k <= q + Tk - Tq, as gpunodes' causal mask), and at most -1e9 (-inf as gpunodes
// writes it) elsewhere: a weight of exactly 0 after the Softmax.
bool isCausalMask(const TensorValues& m, int64_t tq, int64_t tk) {
  if (m.integer || m.dims != std::vector<int64_t>{tq, tk}) return false;
  for (int64_t q = 0; q < tq; ++q)
    for (int64_t k = 0; k < tk; ++k) {
      const float v = m.f[size_t(q * tk + k)];
      if (k > q + (tk - tq) ? !(v <= -1e9f) : v != 0.0f) return false;
    }
  return true;
}

// d2l 11.6's table P[t, 2i] = sin(t / 10000^(2i / E)), P[t, 2i + 1] = cos(...), computed in float32 as
// gpunodes computes it; another producer's sin and cos may differ in the last bits, hence the 1e-5.
bool isSineTable(const TensorValues& p) {
  if (p.integer || p.dims.size() != 2 || p.dims[1] % 2) return false;
  const int64_t t = p.dims[0], e = p.dims[1];
  for (int64_t pos = 0; pos < t; ++pos)
    for (int64_t k = 0; k < e / 2; ++k) {
      const float angle =
          static_cast<float>(pos) / std::pow(10000.0f, static_cast<float>(2 * k) / static_cast<float>(e));
      if (!(std::abs(p.f[size_t(pos * e + 2 * k)] - std::sin(angle)) <= 1e-5f) ||
          !(std::abs(p.f[size_t(pos * e + 2 * k + 1)] - std::cos(angle)) <= 1e-5f))
        return false;
    }
  return true;
}

}  // namespace

bool Importer::isInitializer(const std::string& name) const {
  if (producer_.count(name)) return false;
  const auto it = values_.find(name);
  return it != values_.end() && it->second.kind == Value::Const;
}

bool Importer::isConstantNode(const std::string& name) const {
  const auto p = producer_.find(name);
  return p != producer_.end() && g_.node(p->second).op_type() == "Constant";
}

const TensorValues& Importer::constAt(const std::string& name, const char* what) {
  const auto it = values_.find(name);
  if (it == values_.end() || it->second.kind != Value::Const || it->second.expanded || it->second.zeros)
    fail(std::string(what) + " " + quoted(name) + " is not a constant");
  return it->second.c;
}

// MultiheadAttention as attention() writes it: the Split of <id>.in_proj_weight into q, k and v; each third
// Transposed and multiplied into its input (+ its third of <id>.in_proj_bias, also Split); Reshape to
// [N, T, heads, d] and Transpose into heads (k as [N, heads, d, Tk]); MatMul, Mul by 1/sqrt(d), Add of the
// causal mask when causal, Softmax, MatMul by the values; Transpose and Reshape back to [N, Tq, E]; MatMul by
// the Transposed <id>.out_proj.weight (+ Add of <id>.out_proj.bias); the Identity named by the layer's id.
void Importer::findAttention(int i) {
  const NodeProto& split = g_.node(i);
  if (split.input_size() < 1 || split.output_size() != 3 || !isInitializer(split.input(0)) ||
      intOf(split, "axis", 0) != 0 || attrOf(split, "split"))
    return;
  Pattern pat{LayerKind::MultiheadAttention, "", "", -1};
  std::vector<int> nodes{i};
  pat.consts["in_w"] = split.input(0);
  if (split.input_size() > 1 && !split.input(1).empty()) pat.consts["in_w_sizes"] = split.input(1);
  const NodeProto* biasSplit = nullptr;
  static const std::vector<int64_t> headPerm[3] = {{0, 2, 1, 3}, {0, 2, 3, 1}, {0, 2, 1, 3}};
  static const char* shapeRole[3] = {"q_shape", "k_shape", "v_shape"};
  std::string xs[3], heads[3];
  for (int k = 0; k < 3; ++k) {
    const NodeProto* t = soleConsumer(split.output(k));
    if (!isOp(t, "Transpose", 1) || intsOf(*t, "perm") != std::vector<int64_t>{1, 0}) return;
    const NodeProto* mm = soleConsumer(t->output(0));
    if (!isOp(mm, "MatMul", 2) || mm->input(1) != t->output(0)) return;
    xs[k] = mm->input(0);
    nodes.push_back(indexOfNode(t));
    nodes.push_back(indexOfNode(mm));
    std::string projected = mm->output(0);
    const NodeProto* next = soleConsumer(projected);
    if (isOp(next, "Add", 2)) {
      const std::string* b = other(*next, projected);
      const auto p = b ? producer_.find(*b) : producer_.end();
      if (p == producer_.end()) return;
      const NodeProto& bs = g_.node(p->second);
      if (bs.op_type() != "Split" || bs.input_size() < 1 || bs.output_size() != 3 || bs.output(k) != *b ||
          !isInitializer(bs.input(0)) || intOf(bs, "axis", 0) != 0 || attrOf(bs, "split"))
        return;
      if (k == 0) biasSplit = &bs;
      else if (biasSplit != &bs) return;
      nodes.push_back(indexOfNode(next));
      projected = next->output(0);
      next = soleConsumer(projected);
    } else if (biasSplit) {
      return;  // q has a bias and k or v none: not gpunodes' layer
    }
    if (!isOp(next, "Reshape", 2) || next->input(0) != projected) return;
    pat.consts[shapeRole[k]] = next->input(1);
    const NodeProto* ht = soleConsumer(next->output(0));
    if (!isOp(ht, "Transpose", 1) || intsOf(*ht, "perm") != headPerm[k]) return;
    nodes.push_back(indexOfNode(next));
    nodes.push_back(indexOfNode(ht));
    heads[k] = ht->output(0);
  }
  if (biasSplit) {
    nodes.push_back(indexOfNode(biasSplit));
    pat.consts["in_b"] = biasSplit->input(0);
    if (biasSplit->input_size() > 1 && !biasSplit->input(1).empty()) pat.consts["in_b_sizes"] = biasSplit->input(1);
  }
  const NodeProto* raw = soleConsumer(heads[0]);
  if (!isOp(raw, "MatMul", 2) || raw->input(0) != heads[0] || raw->input(1) != heads[1] || soleConsumer(heads[1]) != raw)
    return;
  const NodeProto* scale = soleConsumer(raw->output(0));
  const std::string* alphaName = isOp(scale, "Mul", 2) ? other(*scale, raw->output(0)) : nullptr;
  const std::optional<double> alpha = alphaName ? scalar(*alphaName) : std::nullopt;
  if (!alpha) return;
  pat.factor = *alpha;
  nodes.push_back(indexOfNode(raw));
  nodes.push_back(indexOfNode(scale));
  std::string scores = scale->output(0);
  const NodeProto* next = soleConsumer(scores);
  if (isOp(next, "Add", 2)) {
    const std::string* mask = other(*next, scores);
    if (!mask || !isConstantNode(*mask)) return;
    pat.consts["mask"] = *mask;
    nodes.push_back(indexOfNode(next));
    scores = next->output(0);
    next = soleConsumer(scores);
  }
  // The key padding mask of valid_lens: valid = Less(key indices, Reshape(lens, [0, 1, 1, 1])), the scores
  // Where(valid, scores, -1e9), and the Softmax's weights multiplied by Cast(valid).
  std::string keep;
  if (isOp(next, "Where", 3) && next->input(1) == scores) {
    const std::string& valid = next->input(0);
    const std::optional<double> masked = scalar(next->input(2));
    const auto lp = producer_.find(valid);
    if (!masked || !(*masked <= -1e9) || lp == producer_.end()) return;
    const NodeProto& less = g_.node(lp->second);
    if (!isOp(&less, "Less", 2) || !isConstantNode(less.input(0))) return;
    const auto rp = producer_.find(less.input(1));
    if (rp == producer_.end()) return;
    const NodeProto& lens = g_.node(rp->second);
    if (!isOp(&lens, "Reshape", 2) || soleConsumer(lens.output(0)) != &less) return;
    const std::vector<const NodeProto*> uses = consumersOf(valid, 2);
    if (uses.size() != 2 || (uses[0] != next && uses[1] != next)) return;
    const NodeProto* cast = uses[0] == next ? uses[1] : uses[0];
    if (!isOp(cast, "Cast", 1) || intOf(*cast, "to", 0) != ::onnx::TensorProto::FLOAT) return;
    pat.consts["key_index"] = less.input(0);
    pat.consts["lens_shape"] = lens.input(1);
    pat.lens = lens.input(0);
    keep = cast->output(0);
    for (const NodeProto* n : {next, &less, &lens, cast}) nodes.push_back(indexOfNode(n));
    scores = next->output(0);
    next = soleConsumer(scores);
  }
  if (!isOp(next, "Softmax", 1)) return;
  const std::optional<int64_t> axis = intOf(*next, "axis", -1);
  if (axis != -1 && axis != 3) return;
  nodes.push_back(indexOfNode(next));
  std::string weights = next->output(0);
  if (!keep.empty()) {
    const NodeProto* kept = soleConsumer(weights);
    if (!isOp(kept, "Mul", 2) || kept->input(0) != weights || kept->input(1) != keep || soleConsumer(keep) != kept)
      return;
    nodes.push_back(indexOfNode(kept));
    weights = kept->output(0);
  }
  const NodeProto* ctx = soleConsumer(weights);
  if (!isOp(ctx, "MatMul", 2) || ctx->input(0) != weights || ctx->input(1) != heads[2] || soleConsumer(heads[2]) != ctx)
    return;
  const NodeProto* ct = soleConsumer(ctx->output(0));
  if (!isOp(ct, "Transpose", 1) || intsOf(*ct, "perm") != std::vector<int64_t>{0, 2, 1, 3}) return;
  const NodeProto* merged = soleConsumer(ct->output(0));
  if (!isOp(merged, "Reshape", 2) || merged->input(0) != ct->output(0)) return;
  pat.consts["merged_shape"] = merged->input(1);
  const NodeProto* om = soleConsumer(merged->output(0));
  if (!isOp(om, "MatMul", 2) || om->input(0) != merged->output(0)) return;
  const auto owt = producer_.find(om->input(1));
  if (owt == producer_.end()) return;
  const NodeProto& wt = g_.node(owt->second);
  if (!isOp(&wt, "Transpose", 1) || intsOf(wt, "perm") != std::vector<int64_t>{1, 0} || !isInitializer(wt.input(0)) ||
      soleConsumer(wt.output(0)) != om)
    return;
  pat.consts["out_w"] = wt.input(0);
  for (const NodeProto* n : {ctx, ct, merged, om, &wt}) nodes.push_back(indexOfNode(n));
  std::string out = om->output(0);
  pat.first = indexOfNode(om);
  if (biasSplit) {  // gpunodes' bias param gives both projections their biases, or neither
    const NodeProto* ob = soleConsumer(out);
    const std::string* b = isOp(ob, "Add", 2) ? other(*ob, out) : nullptr;
    if (!b || !isInitializer(*b)) return;
    pat.consts["out_b"] = *b;
    nodes.push_back(indexOfNode(ob));
    pat.first = indexOfNode(ob);
    out = ob->output(0);
  }
  if (const NodeProto* named = soleConsumer(out); isOp(named, "Identity", 1)) {
    nodes.push_back(indexOfNode(named));
    pat.first = indexOfNode(named);
    out = named->output(0);
  }
  pat.input = xs[0];
  // k open reads q, v open reads k: only the inputs the layer had wired come back.
  if (xs[2] != xs[1]) pat.more = {xs[1], xs[2]};
  else if (xs[1] != xs[0]) pat.more = {xs[1]};
  pat.output = out;
  pat.biased = biasSplit != nullptr;
  addPattern(std::move(pat), nodes);
}

int Importer::activationOf(const std::string& name, const char* what) {
  const auto it = values_.find(name);
  if (it == values_.end() || it->second.kind != Value::Layer || it->second.form != Value::Batch || it->second.pad ||
      !it->second.maskNode.empty() || it->second.transposedB)
    fail("reads " + quoted(name) + " as its " + what + ", which is not a batch-first activation");
  checkDepth(it->second, name);
  return it->second.layer;
}

int Importer::emitAttention(const Pattern& p, int q) {
  std::vector<int> ins{q};
  for (const std::string& name : p.more) ins.push_back(activationOf(name, "keys or values"));
  const Shape& sq = shapeOf(q);
  const Shape& sk = shapeOf(ins.size() > 1 ? ins[1] : q);
  if (sq.size() != 2 || sk.size() != 2)
    fail("attends over " + shapeStr(sq) + " and " + shapeStr(sk) + ": gpunodes' MultiheadAttention reads [T, E]");
  const int64_t tq = sq[0], e = sq[1], tk = sk[0];
  auto shapeIs = [&](const char* role, int64_t t) -> std::vector<int64_t> {
    std::vector<int64_t> s = ints(constAt(p.consts.at(role), "the heads' shape"), "the heads' shape");
    if (s.size() != 4 || !(s[0] == 0 || s[0] == kBatch) || s[1] != t || s[2] < 1 || s[3] < 1 || s[2] * s[3] != e)
      fail("splits [" + str(t) + ", " + str(e) + "] into heads as " + shapeStr(s) +
           ": gpunodes' MultiheadAttention reshapes to [0, T, heads, E / heads]");
    return s;
  };
  const std::vector<int64_t> qs = shapeIs("q_shape", tq);
  const int64_t heads = qs[2], d = qs[3];
  if (shapeIs("k_shape", tk)[2] != heads || shapeIs("v_shape", tk)[2] != heads)
    fail("splits q, k and v into different numbers of heads");
  const std::vector<int64_t> ms = ints(constAt(p.consts.at("merged_shape"), "the merged shape"), "the merged shape");
  if (ms.size() != 3 || !(ms[0] == 0 || ms[0] == kBatch) || ms[1] != tq || ms[2] != e)
    fail("merges the heads as " + shapeStr(ms) + ", not [0, " + str(tq) + ", " + str(e) + "]");
  if (!near(p.factor, 1.0 / std::sqrt(double(d))))
    fail("scales the scores by " + std::to_string(p.factor) + ", not 1/sqrt(" + str(d) +
         "): gpunodes' MultiheadAttention scales by 1/sqrt(E / heads)");
  const bool causal = p.consts.count("mask") > 0;
  if (causal && !isCausalMask(constAt(p.consts.at("mask"), "the mask"), tq, tk))
    fail("adds a mask to the scores that is not the causal mask of " + str(tq) + " queries and " + str(tk) +
         " keys (0 where a query sees a key, -inf elsewhere)");
  for (const char* sizes : {"in_w_sizes", "in_b_sizes"})
    if (p.consts.count(sizes) && ints(constAt(p.consts.at(sizes), "split"), "split") != std::vector<int64_t>{e, e, e})
      fail("splits in_proj into parts other than q, k and v of " + str(e) + " rows each");
  const TensorValues& inW = constAt(p.consts.at("in_w"), "in_proj_weight");
  const TensorValues& outW = constAt(p.consts.at("out_w"), "out_proj.weight");
  needDims(inW, {3 * e, e}, "in_proj_weight");
  needDims(outW, {e, e}, "out_proj.weight");
  std::vector<std::pair<std::string, TensorValues>> weights{{"in_proj_weight", inW}};
  if (p.biased) {
    const TensorValues& inB = constAt(p.consts.at("in_b"), "in_proj_bias");
    needDims(inB, {3 * e}, "in_proj_bias");
    weights.emplace_back("in_proj_bias", inB);
  }
  weights.emplace_back("out_proj.weight", outW);
  if (p.biased) {
    const TensorValues& outB = constAt(p.consts.at("out_b"), "out_proj.bias");
    needDims(outB, {e}, "out_proj.bias");
    weights.emplace_back("out_proj.bias", outB);
  }
  if (!p.lens.empty()) {
    const int lens = activationOf(p.lens, "valid lengths");
    if (shapeOf(lens) != Shape{1})
      fail("masks the keys by " + quoted(p.lens) + " of shape " + shapeStr(shapeOf(lens)) +
           ": gpunodes' valid_lens is one length per sample, [1]");
    const TensorValues& index = constAt(p.consts.at("key_index"), "the key indices");
    bool counts = !index.integer && index.dims == std::vector<int64_t>{tk};
    for (int64_t k = 0; counts && k < tk; ++k) counts = index.f[size_t(k)] == float(k);
    if (!counts) fail("compares the valid lengths with other values than the key indices 0 to " + str(tk - 1));
    const std::vector<int64_t> ls = ints(constAt(p.consts.at("lens_shape"), "the lengths' shape"), "the lengths' shape");
    if (ls.size() != 4 || !(ls[0] == 0 || ls[0] == kBatch) || ls[1] != 1 || ls[2] != 1 || ls[3] != 1)
      fail("reshapes the valid lengths to " + shapeStr(ls) + ", not [0, 1, 1, 1]");
    while (ins.size() < 3) ins.push_back(-1);  // k and v open before valid_lens
    ins.push_back(lens);
  }
  return addLayer(LayerKind::MultiheadAttention,
                  {{"num_heads", qint64(heads)}, {"bias", p.biased}, {"causal", causal}}, ins, std::move(weights));
}

// ValidLength as gpunodes' export writes it: Equal of the ids to pad_id, Not, Cast to float, ReduceSum along
// axis 1 keeping it; or as torch writes torch_peer's (x != pad).sum(1, keepdim=True).to(x.dtype): the Cast to
// int64, the ReduceSum, and a Cast back to float.
void Importer::findValidLength(int i) {
  const NodeProto& eq = g_.node(i);
  if (!isOp(&eq, "Equal", 2)) return;
  const int x = scalar(eq.input(1)) ? 0 : scalar(eq.input(0)) ? 1 : -1;
  if (x < 0) return;
  const NodeProto* no = soleConsumer(eq.output(0));
  if (!isOp(no, "Not", 1)) return;
  const NodeProto* cast = soleConsumer(no->output(0));
  const std::optional<int64_t> to = isOp(cast, "Cast", 1) ? intOf(*cast, "to", 0) : std::nullopt;
  if (to != ::onnx::TensorProto::FLOAT && to != ::onnx::TensorProto::INT64) return;
  const NodeProto* sum = soleConsumer(cast->output(0));
  if (!sum || sum->op_type() != "ReduceSum" || sum->output_size() != 1 || sum->input_size() < 1 ||
      sum->input(0) != cast->output(0) || intOf(*sum, "keepdims", 1) != 1)
    return;
  std::vector<int> nodes{i, indexOfNode(no), indexOfNode(cast), indexOfNode(sum)};
  std::string out = sum->output(0);
  if (to == ::onnx::TensorProto::INT64) {
    const NodeProto* back = soleConsumer(out);
    if (!isOp(back, "Cast", 1) || intOf(*back, "to", 0) != ::onnx::TensorProto::FLOAT) return;
    nodes.push_back(indexOfNode(back));
    out = back->output(0);
  }
  Pattern pat{LayerKind::ValidLength, eq.input(x), out, i};
  if (sum->input_size() > 1 && !sum->input(1).empty()) pat.consts["axes"] = sum->input(1);
  else if (intsOf(*sum, "axes") != std::vector<int64_t>{1}) return;
  pat.factor = *scalar(eq.input(1 - x));
  addPattern(std::move(pat), nodes);
}

int Importer::emitValidLength(const Pattern& p, int in) {
  const Shape& s = shapeOf(in);
  if (s.size() != 1) fail("counts the ids of " + shapeStr(s) + ": gpunodes' ValidLength reads token ids [T]");
  if (p.consts.count("axes")) {
    const std::vector<int64_t> axes = ints(constAt(p.consts.at("axes"), "axes"), "axes");
    if (axes != std::vector<int64_t>{1} && axes != std::vector<int64_t>{-1})
      fail("sums along axes " + shapeStr(axes) + ": gpunodes' ValidLength counts along the ids (axis 1)");
  }
  if (!(p.factor >= 0 && p.factor <= double(1 << 24) && p.factor == std::floor(p.factor)))
    fail("compares the ids with " + std::to_string(p.factor) + ": pad_id is a whole number in [0, 2^24]");
  return addLayer(LayerKind::ValidLength, {{"pad_id", qint64(p.factor)}}, {in});
}

// NadarayaWatson as nadarayaWatson() writes it: the query, key and value columns (Gather along axis 2), the
// queries as rows and the keys as columns (Unsqueeze), Sub, Mul by <id>.w, Mul by itself, Mul by -1/2,
// Softmax, MatMul by the values as a column, Reshape to [N, T].
void Importer::findNadarayaWatson(int i) {
  const NodeProto& sub = g_.node(i);
  if (!isOp(&sub, "Sub", 2)) return;
  std::vector<int> nodes{i};
  std::string x;
  Pattern pat{LayerKind::NadarayaWatson, "", "", -1};
  // A column of x as Unsqueeze(Gather(x, index, axis 2), axes), that only `reader` reads.
  auto column = [&](const std::string& value, const NodeProto* reader, const char* role) {
    const auto u = producer_.find(value);
    if (u == producer_.end() || soleConsumer(value) != reader) return false;
    const NodeProto& un = g_.node(u->second);
    if (!isOp(&un, "Unsqueeze", 2)) return false;
    const auto gi = producer_.find(un.input(0));
    if (gi == producer_.end() || soleConsumer(un.input(0)) != &un) return false;
    const NodeProto& ga = g_.node(gi->second);
    if (!isOp(&ga, "Gather", 2) || intOf(ga, "axis", 0) != 2 || (!x.empty() && ga.input(0) != x)) return false;
    x = ga.input(0);
    pat.consts[std::string(role) + "_index"] = ga.input(1);
    pat.consts[std::string(role) + "_axes"] = un.input(1);
    nodes.push_back(u->second);
    nodes.push_back(gi->second);
    return true;
  };
  if (!column(sub.input(0), &sub, "q") || !column(sub.input(1), &sub, "k")) return;
  const NodeProto* scaled = soleConsumer(sub.output(0));
  const std::string* w = isOp(scaled, "Mul", 2) ? other(*scaled, sub.output(0)) : nullptr;
  if (!w || !isInitializer(*w)) return;
  pat.consts["w"] = *w;
  const std::vector<const NodeProto*> sq = consumersOf(scaled->output(0), 2);
  if (sq.size() != 2 || sq[0] != sq[1] || !isOp(sq[0], "Mul", 2) || sq[0]->input(0) != scaled->output(0) ||
      sq[0]->input(1) != scaled->output(0))
    return;
  const NodeProto* half = soleConsumer(sq[0]->output(0));
  const std::string* h = isOp(half, "Mul", 2) ? other(*half, sq[0]->output(0)) : nullptr;
  if (!h || !near(scalar(*h), -0.5)) return;
  const NodeProto* sm = soleConsumer(half->output(0));
  if (!isOp(sm, "Softmax", 1)) return;
  const std::optional<int64_t> axis = intOf(*sm, "axis", -1);
  if (axis != -1 && axis != 2) return;
  const NodeProto* pooled = soleConsumer(sm->output(0));
  if (!isOp(pooled, "MatMul", 2) || pooled->input(0) != sm->output(0) || !column(pooled->input(1), pooled, "v")) return;
  const NodeProto* out = soleConsumer(pooled->output(0));
  if (!isOp(out, "Reshape", 2) || out->input(0) != pooled->output(0)) return;
  pat.consts["out_shape"] = out->input(1);
  for (const NodeProto* n : {scaled, sq[0], half, sm, pooled, out}) nodes.push_back(indexOfNode(n));
  pat.input = x;
  pat.output = out->output(0);
  pat.first = indexOfNode(out);
  addPattern(std::move(pat), nodes);
}

int Importer::emitNadarayaWatson(const Pattern& p, int in) {
  const Shape& s = shapeOf(in);
  if (s.size() != 2 || s[1] != 3)
    fail("reads " + shapeStr(s) + ": gpunodes' NadarayaWatson reads rows (query, key, value) [T, 3]");
  const char* roles[] = {"q", "k", "v"};
  const int64_t axes[] = {2, 1, 2};
  for (int k = 0; k < 3; ++k) {
    const TensorValues& idx = constAt(p.consts.at(std::string(roles[k]) + "_index"), "the column's index");
    if (!idx.integer || idx.numel() != 1 || idx.dims.size() > 1 || idx.i[0] != k)
      fail(std::string("takes the ") + roles[k] + " column from another column than " + str(k));
    if (ints(constAt(p.consts.at(std::string(roles[k]) + "_axes"), "axes"), "axes") != std::vector<int64_t>{axes[k]})
      fail(std::string("unsqueezes the ") + roles[k] + " column along another axis than " + str(axes[k]));
  }
  const std::vector<int64_t> out = ints(constAt(p.consts.at("out_shape"), "the shape"), "the shape");
  if (out.size() != 2 || !(out[0] == 0 || out[0] == kBatch) || out[1] != s[0])
    fail("reshapes the pooled values to " + shapeStr(out) + ", not [0, " + str(s[0]) + "]");
  const TensorValues& w = constAt(p.consts.at("w"), "w");
  needDims(w, {1}, "w");
  return addLayer(LayerKind::NadarayaWatson, {}, {in}, {{"w", w}});
}

// An activation [T, E] plus a constant of the same shape: a PositionEmbedding when the constant is an
// initializer (a parameter), a PositionalEncoding when it is d2l's sine table, scores with the causal mask
// for the Softmax after them when it is that mask.
void Importer::addConstant(int k) {
  const int in = layerIn(k);
  const std::string& name = node_->input(1 - k);
  const Value& c = value(1 - k);
  const Shape& s = shapeOf(in);
  if (s.size() == 2 && !c.c.integer && !c.zeros && !c.expanded && c.c.dims == std::vector<int64_t>(s.begin(), s.end())) {
    if (isInitializer(name)) return setLayer(addLayer(LayerKind::PositionEmbedding, {}, {in}, {{"weight", c.c}}));
    if (isSineTable(c.c)) {
      QJsonObject params;
      if (s[0] > 1000) params["max_len"] = qint64(s[0]);  // the layer's default, 1000, when it fits
      return setLayer(addLayer(LayerKind::PositionalEncoding, params, {in}));
    }
    if (isCausalMask(c.c, s[0], s[1])) {
      Value v = layerValue(in);
      v.maskNode = node_->name().empty() ? node_->op_type() : node_->name();
      return setOutput(0, v);
    }
  }
  fail("adds a constant " + shapeStr(c.c.dims) + " to an activation " + shapeStr(s) +
       ": gpunodes' Add takes two activations (a bias belongs to the MatMul, Conv or Gemm before it); a constant "
       "of the activation's [T, E] is read as a PositionEmbedding's weight (an initializer), PositionalEncoding's "
       "sine table or a causal mask before a Softmax");
}

void Importer::mul() {
  const Value &a = value(0), &b = value(1);
  if (a.kind == Value::Layer && b.kind == Value::Layer)
    return setLayer(addLayer(LayerKind::Mul, {}, {layerIn(0), layerIn(1)}));
  if (a.kind == Value::Const && b.kind == Value::Const)
    fail("multiplies two constants, which gpunodes does not fold");
  const int k = a.kind == Value::Layer ? 0 : 1;
  const int in = layerIn(k);
  const Value& c = value(1 - k);
  if (c.c.integer || c.zeros || c.expanded || c.c.numel() != 1)
    fail("multiplies an activation by a constant " + shapeStr(c.c.dims) + ": gpunodes' Scale multiplies by one "
         "float, and its Mul takes two activations");
  setLayer(addLayer(LayerKind::Scale, {{"scale", shortest(c.c.f[0])}}, {in}));
}

void Importer::matMul() {
  if (value(1).kind == Value::Layer) {  // two activations: torch.bmm
    const Value& b = value(1);
    const int a = layerIn(0);
    if (b.transposedB) {
      checkDepth(b, node_->input(1));
      return setLayer(addLayer(LayerKind::BatchMatMul, {{"transpose_b", true}}, {a, b.layer}));
    }
    return setLayer(addLayer(LayerKind::BatchMatMul, {{"transpose_b", false}}, {a, layerIn(1)}));
  }
  const int in = layerIn(0);
  setLayer(linear(in, constIn(1, "the weight"), false, 1.0, nullptr, 1.0, "the weight"));
}

bool Importer::transposedForMatMul(const Value& v, const std::vector<int64_t>& perm) {
  if (perm != std::vector<int64_t>{0, 2, 1} || v.kind != Value::Layer || v.form != Value::Batch || v.pad ||
      !v.maskNode.empty() || v.transposedB || shapeOf(v.layer).size() != 2 || node_->output_size() != 1)
    return false;
  const NodeProto* mm = soleConsumer(node_->output(0));
  if (!isOp(mm, "MatMul", 2) || mm->input(1) != node_->output(0) || mm->input(0) == node_->output(0)) return false;
  Value w = v;
  w.transposedB = true;
  setOutput(0, w);
  return true;
}

// The token [1, E] expanded to [N, 1, E]: the shape is torch's and gpunodes' Shape, Slice and Concat of the
// batch, folded.
void Importer::expand() {
  const Value& x = value(0);
  const std::string& name = node_->input(0);
  if (x.kind != Value::Const || x.c.integer || x.zeros || x.expanded || !isInitializer(name))
    fail("expands " + quoted(name) + ": gpunodes reads Expand only of a parameter over the batch (a "
         "ClassToken's token)");
  const std::vector<int64_t> target = ints(constIn(1, "the shape"), "the shape");
  std::vector<int64_t> want{kBatch};
  want.insert(want.end(), x.c.dims.begin(), x.c.dims.end());
  if (target != want)
    fail("expands " + quoted(name) + " " + shapeStr(x.c.dims) + " to " + shapeStr(target) +
         ": gpunodes reads only a parameter expanded over the batch, to " + shapeStr(want));
  Value v = x;
  v.expanded = true;
  v.param = name;
  setOutput(0, std::move(v));
}

void Importer::classToken() {
  const Value& t = value(0);
  const int in = layerIn(1);
  const Shape& s = shapeOf(in);
  const int64_t axis = attrInt("axis", 0);
  if (s.size() != 2 || (axis != 1 && axis != -2))
    fail("puts " + quoted(t.param) + " before an activation " + shapeStr(s) + " along axis " + str(axis) +
         ": gpunodes' ClassToken puts a token [1, E] before the steps of a [T, E] sequence (axis 1)");
  if (t.c.dims != std::vector<int64_t>{1, s[1]})
    fail("puts " + quoted(t.param) + " " + shapeStr(t.c.dims) + " before the steps of " + shapeStr(s) +
         ": a ClassToken's token is [1, E]");
  setLayer(addLayer(LayerKind::ClassToken, {}, {in}, {{"weight", t.c}}));
}

}  // namespace gn::nodes::onnx::import_detail
