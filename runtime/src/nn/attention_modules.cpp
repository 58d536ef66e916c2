// The modules of the drawn attention layers (d2l chapter 11): LayerNorm, MultiheadAttention, the primitives
// of d2l 11.3 (BatchMatMul, Softmax, Mul, Scale), the positional layers, ClassToken and FirstStep. Shapes
// here include the batch axis: a sequence batch is [N, T, E].
#include <algorithm>
#include <cmath>
#include <map>

#include "gpunodes/nn/attention_layers.h"
#include "gpunodes/nn/sequence_layers.h"
#include "gpunodes/ops.h"
#include "module.h"

namespace gn::nn {
namespace {

// x [N, ..., F] as rows [N * ..., F], for the ops that act on the last axis.
Tensor rows_of(const Tensor& x) {
  const int64_t f = x.shape().back();
  return x.reshaped({x.numel() / f, f});
}

// nn.LayerNorm(E, eps, elementwise_affine): weight ones, bias zeros, PyTorch's defaults.
class LayerNormM final : public Module {
 public:
  LayerNormM(Builder& b, int64_t e, float eps, bool affine) : e_(e), eps_(eps) {
    if (affine) {
      w_.value = b.constant({e}, 1.0f);
      b_.value = b.constant({e}, 0.0f);
    }
  }
  Tensor forward(const Tensor& x, Mode mode) override {
    LayerNormResult r = layer_norm(x, w_.value, b_.value, eps_);
    if (mode == Mode::Train) x_ = x, saved_ = r, saved_.y = Tensor();
    return r.y;
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    LayerNormGrads g = layer_norm_backward(x_, dy, w_.value, saved_, need_dx);
    w_.grad = g.dgamma;
    b_.grad = g.dbeta;
    clear();
    return g.dx;
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    if (!w_.value.defined()) return;
    push_param(out, prefix, w_, "weight");
    push_param(out, prefix, b_, "bias");
  }
  bool has_params() const override { return w_.value.defined(); }
  void clear() override { x_ = Tensor(), saved_ = LayerNormResult(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override {
    return "LayerNorm((" + std::to_string(e_) + ",), eps=" + std::to_string(eps_).substr(0, 7) +
           (w_.value.defined() ? "" : ", elementwise_affine=False") + ")";
  }

 private:
  int64_t e_;
  float eps_;
  Parameter w_, b_;
  Tensor x_;
  LayerNormResult saved_;
};

// Refuses, before anything is allocated, attention weights that could never fit the device.
void check_weights_fit(const Tensor& like, const std::string& id, int64_t n, int64_t heads, int64_t tq,
                       int64_t tk) {
  const double bytes = static_cast<double>(n) * static_cast<double>(heads) * static_cast<double>(tq) *
                       static_cast<double>(tk) * sizeof(float);
  const std::string what = id + ": the attention weights alone need " + std::to_string(tq) + " x " +
                           std::to_string(tk) + " steps x " + std::to_string(heads) + " heads x " +
                           std::to_string(n) + " samples x 4 bytes = ";
  if (bytes > 9.0e18) throw Error(what + "more than 2^63 bytes");
  try {
    like.runtime().allocator(like.device()).refuse_impossible(static_cast<int64_t>(bytes));
  } catch (const OutOfMemoryError& e) {
    throw Error(what + format_bytes(static_cast<int64_t>(bytes)) + ", more than " + like.device().str() +
                " can hold: use a shorter sequence, fewer heads or a smaller batch (" + e.what() + ")");
  }
}

// nn.MultiheadAttention(E, num_heads, dropout, bias, batch_first=True), its parameters named and
// initialised as PyTorch's (in_proj_weight Xavier-uniform, out_proj.weight U(-1/sqrt(E), 1/sqrt(E)), biases
// zero). With only q wired it is self-attention and projects q once through the fused [3E, E] weight; with
// k (and v) wired each input goes through its own third. causal masks each query's later keys; valid_lens
// ([N, 1], whole numbers, the 4th input; k and v may be open before it) gives keys at or past a sample's
// length no weight (torch's key_padding_mask = arange(Tk) >= len), and a sample of length 0 all-zero weights
// (its output is out_proj's bias). No gradient reaches valid_lens.
class MultiheadAttentionM final : public Module {
 public:
  MultiheadAttentionM(Builder& b, const LayerSpec& l, int64_t e, uint64_t seed)
      : id_(l.id), e_(e), heads_(l.heads), p_(static_cast<float>(l.dropout)), causal_(l.causal), seed_(seed),
        train_forwards_(b.train_forwards()) {
    in_w_.value = b.uniform_weight({3 * e, e}, std::sqrt(6.0f / static_cast<float>(4 * e)));
    if (l.bias) in_b_.value = b.constant({3 * e}, 0.0f);
    out_w_.value = b.uniform_weight({e, e}, 1.0f / std::sqrt(static_cast<float>(e)));
    if (l.bias) out_b_.value = b.constant({e}, 0.0f);
  }

  Tensor forward(const Tensor& x, Mode mode) override { return forward_inputs({x}, mode); }
  Tensor backward(const Tensor& dy, bool need_dx) override { return backward_inputs(dy, {need_dx}).at(0); }

  Tensor forward_inputs(const std::vector<Tensor>& xs, Mode mode) override {
    const Tensor& q = xs.at(0);
    const bool k_own = xs.size() > 1 && xs[1].defined(), v_own = xs.size() > 2 && xs[2].defined();
    const Tensor& k = k_own ? xs[1] : q;
    const Tensor& v = v_own ? xs[2] : k;
    const int64_t n = q.shape()[0], tq = q.shape()[1], tk = k.shape()[1], d = e_ / heads_;
    Tensor lens;
    if (xs.size() > 3 && xs[3].defined()) {
      if (xs[3].numel() != n)
        throw ShapeError(id_ + ": valid_lens holds " + std::to_string(xs[3].numel()) + " values for " +
                         std::to_string(n) + " samples of q");
      lens = xs[3].reshaped({n});
    }
    check_weights_fit(q, id_, n, heads_, tq, tk);
    Saved s;
    s.inputs = {q, k_own ? k : Tensor(), v_own ? v : Tensor()};
    if (!k_own) {
      const Tensor p = linear(rows_of(q), in_w_.value, in_b_.value).reshaped({n, tq, 3 * e_});
      std::vector<Tensor> parts = split_heads(p, 3, heads_);
      s.q = parts[0], s.k = parts[1], s.v = parts[2];
    } else {
      s.q = split_heads(linear_part(q, in_w_.value, in_b_.value, 0, 3), 1, heads_)[0];
      s.k = split_heads(linear_part(k, in_w_.value, in_b_.value, 1, 3), 1, heads_)[0];
      s.v = split_heads(linear_part(v, in_w_.value, in_b_.value, 2, 3), 1, heads_)[0];
    }
    const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
    s.weights = masked_softmax(bmm(s.q, s.k, {false, true, alpha}), {causal_, lens, heads_});
    s.dropped = s.weights;
    if (mode == Mode::Train && p_ > 0) {
      DropoutResult r = dropout(s.weights, p_, dropout_seed(seed_, train_forwards_));
      s.dropped = r.y;
      s.mask = r.mask;
    }
    s.merged = rows_of(merge_heads({bmm(s.dropped, s.v)}, heads_));
    const Tensor y = linear(s.merged, out_w_.value, out_b_.value).reshaped({n, tq, e_});
    if (mode == Mode::Train) {
      saved_ = std::move(s);
    } else {
      // The first sample's heads: [N * heads, Tq, Tk] seen as [1, N, heads * Tq * Tk], step 0.
      first_weights_ = select_step(s.weights.reshaped({1, n, heads_ * tq * tk}), 0).reshaped({heads_, tq, tk});
    }
    return y;
  }

  std::vector<Tensor> backward_inputs(const Tensor& dy, const std::vector<bool>& need) override {
    Saved s = std::move(saved_);
    saved_ = Saved();
    const Tensor& q = s.inputs.at(0);
    const int64_t n = q.shape()[0], tq = q.shape()[1], d = e_ / heads_;
    const bool bias = in_b_.value.defined();
    LinearGrads out = linear_backward(s.merged, out_w_.value, rows_of(dy), true, bias);
    out_w_.grad = out.dw;
    out_b_.grad = out.db;
    const Tensor d_heads = split_heads(out.dx.reshaped({n, tq, e_}), 1, heads_)[0];
    BmmGrads value = bmm_backward(s.dropped, s.v, d_heads, {}, true, true);
    const Tensor d_weights = s.mask.defined() ? dropout_backward(value.da, s.mask) : value.da;
    const float alpha = 1.0f / std::sqrt(static_cast<float>(d));
    BmmGrads score = bmm_backward(s.q, s.k, softmax_backward(s.weights, d_weights), {false, true, alpha}, true, true);
    std::vector<Tensor> dx(need.size());  // none for valid_lens
    if (!s.inputs[1].defined()) {
      const Tensor dp = rows_of(merge_heads({score.da, score.db, value.db}, heads_));
      LinearGrads in = linear_backward(rows_of(q), in_w_.value, dp, need.at(0), bias);
      in_w_.grad = in.dw;
      in_b_.grad = in.db;
      if (need[0]) dx[0] = in.dx.reshaped(q.shape());
      return dx;
    }
    in_w_.grad = Tensor(q.runtime(), in_w_.value.shape(), q.device());
    if (bias) in_b_.grad = Tensor(q.runtime(), in_b_.value.shape(), q.device());
    const Tensor dq = linear_part_backward(q, in_w_.value, merge_heads({score.da}, heads_), 0, 3, in_w_.grad,
                                           in_b_.grad, need.at(0));
    const Tensor& k = s.inputs[1];
    // v = k when v is not wired: both of its gradients reach k.
    const bool v_own = s.inputs[2].defined();
    const Tensor& v = v_own ? s.inputs[2] : k;
    const Tensor dk = linear_part_backward(k, in_w_.value, merge_heads({score.db}, heads_), 1, 3, in_w_.grad,
                                           in_b_.grad, need.at(1));
    const Tensor dv = linear_part_backward(v, in_w_.value, merge_heads({value.db}, heads_), 2, 3, in_w_.grad,
                                           in_b_.grad, v_own ? need.at(2) : need.at(1));
    dx[0] = dq;
    if (need[1]) dx[1] = v_own ? dk : add(dk, dv);
    if (v_own && need.at(2)) dx[2] = dv;
    return dx;
  }

  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    push_param(out, prefix, in_w_, "in_proj_weight");
    if (in_b_.value.defined()) push_param(out, prefix, in_b_, "in_proj_bias");
    push_param(out, prefix, out_w_, "out_proj.weight");
    if (out_b_.value.defined()) push_param(out, prefix, out_b_, "out_proj.bias");
  }
  void collect_attention(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const override {
    if (first_weights_.defined()) out.emplace_back(prefix, first_weights_);
  }
  bool has_params() const override { return true; }
  void clear() override { saved_ = Saved(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override {
    std::string s = "MultiheadAttention(" + std::to_string(e_) + ", num_heads=" + std::to_string(heads_);
    if (p_ > 0) s += ", dropout=" + std::to_string(p_).substr(0, 4);
    if (!in_b_.value.defined()) s += ", bias=False";
    if (causal_) s += ", causal";
    return s + ")";
  }

 private:
  // What backward needs: q, k and v (k and v undefined where not wired), the heads of the projections [N * heads, T, d], the weights (before and
  // after dropout, with its mask) and the merged values as rows.
  struct Saved {
    std::vector<Tensor> inputs;
    Tensor q, k, v, weights, dropped, mask, merged;
  };

  std::string id_;
  int64_t e_, heads_;
  float p_;
  bool causal_;
  uint64_t seed_;
  const int64_t& train_forwards_;
  Parameter in_w_, in_b_, out_w_, out_b_;
  Saved saved_;
  Tensor first_weights_;
};

// torch.bmm(a, b) per sample, or torch.bmm(a, b.transpose(1, 2)) with transpose_b.
class BatchMatMulM final : public Module {
 public:
  explicit BatchMatMulM(bool transpose_b) : trans_b_(transpose_b) {}
  Tensor forward(const Tensor&, Mode) override { throw Error("BatchMatMul takes two inputs, a and b"); }
  Tensor backward(const Tensor&, bool) override { throw Error("BatchMatMul takes two inputs, a and b"); }
  Tensor forward_inputs(const std::vector<Tensor>& xs, Mode mode) override {
    if (mode == Mode::Train) a_ = xs.at(0), b_ = xs.at(1);
    return bmm(xs.at(0), xs.at(1), {false, trans_b_, 1});
  }
  std::vector<Tensor> backward_inputs(const Tensor& dy, const std::vector<bool>& need) override {
    BmmGrads g = bmm_backward(a_, b_, dy, {false, trans_b_, 1}, need.at(0), need.at(1));
    clear();
    return {g.da, g.db};
  }
  void clear() override { a_ = b_ = Tensor(); }
  Shape out_shape(const Shape& in) const override { return in; }  // GraphM takes shapes from the inference
  std::string describe() const override { return trans_b_ ? "BatchMatMul(transpose_b)" : "BatchMatMul()"; }

 private:
  bool trans_b_;
  Tensor a_, b_;
};

// Element-wise a * b of two activations of one shape.
class MulM final : public Module {
 public:
  Tensor forward(const Tensor&, Mode) override { throw Error("Mul takes two inputs, a and b"); }
  Tensor backward(const Tensor&, bool) override { throw Error("Mul takes two inputs, a and b"); }
  Tensor forward_inputs(const std::vector<Tensor>& xs, Mode mode) override {
    if (mode == Mode::Train) a_ = xs.at(0), b_ = xs.at(1);
    return mul(xs.at(0), xs.at(1));
  }
  std::vector<Tensor> backward_inputs(const Tensor& dy, const std::vector<bool>& need) override {
    std::vector<Tensor> d{need.at(0) ? mul(dy, b_) : Tensor(), need.at(1) ? mul(dy, a_) : Tensor()};
    clear();
    return d;
  }
  void clear() override { a_ = b_ = Tensor(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override { return "Mul()"; }

 private:
  Tensor a_, b_;
};

// Softmax over the last axis (d2l's masked_softmax with causal; F.softmax(x, dim=-1) without).
class SoftmaxM final : public Module {
 public:
  explicit SoftmaxM(bool causal) : causal_(causal) {}
  Tensor forward(const Tensor& x, Mode mode) override {
    const Tensor y = masked_softmax(as_scores(x), {causal_, Tensor(), 1}).reshaped(x.shape());
    if (mode == Mode::Train) y_ = y;
    return y;
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    Tensor dx = need_dx ? softmax_backward(y_, dy) : Tensor();
    clear();
    return dx;
  }
  void clear() override { y_ = Tensor(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override { return causal_ ? "Softmax(dim=-1, causal)" : "Softmax(dim=-1)"; }

 private:
  // [N, rows, cols]: a flat [N, F] is one row per sample.
  static Tensor as_scores(const Tensor& x) {
    const int64_t n = x.shape()[0], cols = x.shape().back();
    return x.reshaped({n, x.numel() / (n * cols), cols});
  }
  bool causal_;
  Tensor y_;
};

class ScaleM final : public Module {
 public:
  explicit ScaleM(float scale) : scale_(scale) {}
  Tensor forward(const Tensor& x, Mode) override { return scale_shift(x, scale_, 0); }
  Tensor backward(const Tensor& dy, bool need_dx) override { return need_dx ? scale_shift(dy, scale_, 0) : Tensor(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override { return "Scale(" + std::to_string(scale_) + ")"; }

 private:
  float scale_;
};

// d2l 11.6's PositionalEncoding: X + P[:T] with P[t, 2i] = sin(t / 10000^(2i / E)), P[t, 2i + 1] = cos(..),
// then dropout. The table of each length met is made once on the device.
class PositionalEncodingM final : public Module {
 public:
  PositionalEncodingM(Builder& b, float p, uint64_t seed) : dropout_(p, seed, b.train_forwards()) {}
  Tensor forward(const Tensor& x, Mode mode) override { return dropout_.forward(add_per_sample(x, table(x)), mode); }
  Tensor backward(const Tensor& dy, bool need_dx) override { return dropout_.backward(dy, need_dx); }
  void clear() override { dropout_.clear(); }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override { return "PositionalEncoding(dropout=" + dropout_.p_text() + ")"; }

 private:
  const Tensor& table(const Tensor& x) {
    const int64_t t = x.shape()[1], e = x.shape()[2];
    Tensor& cached = tables_[{t, e}];
    if (!cached.defined() || cached.device() != x.device()) {
      std::vector<float> v(static_cast<size_t>(t * e));
      for (int64_t pos = 0; pos < t; ++pos)
        for (int64_t i = 0; i < e / 2; ++i) {
          // d2l: X = pos / 10000^(2i / E), computed in float32 as torch does.
          const float angle = static_cast<float>(pos) /
                              std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(e));
          v[static_cast<size_t>(pos * e + 2 * i)] = std::sin(angle);
          v[static_cast<size_t>(pos * e + 2 * i + 1)] = std::cos(angle);
        }
      cached = from_values(x.runtime(), {t, e}, x.device(), std::move(v));
    }
    return cached;
  }

  DropoutM dropout_;
  std::map<std::pair<int64_t, int64_t>, Tensor> tables_;
};

// A learned position embedding (d2l 11.8's pos_embedding), weight [T, E] from N(0, 1); a shorter sequence
// adds its first rows.
class PositionEmbeddingM final : public Module {
 public:
  PositionEmbeddingM(Builder& b, const Shape& in) { w_.value = b.normal_weight(in, 1.0f); }
  Tensor forward(const Tensor& x, Mode) override { return add_per_sample(x, w_.value); }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    w_.grad = sum_over_batch(dy, w_.value.shape());
    return need_dx ? dy : Tensor();
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    push_param(out, prefix, w_, "weight");
  }
  bool has_params() const override { return true; }
  Shape out_shape(const Shape& in) const override { return in; }
  std::string describe() const override {
    return "PositionEmbedding(" + std::to_string(w_.value.shape()[0]) + ", " + std::to_string(w_.value.shape()[1]) +
           ")";
  }

 private:
  Parameter w_;
};

// d2l 11.8's cls_token: a learned [1, E] step (zeros at first) before the sequence.
class ClassTokenM final : public Module {
 public:
  ClassTokenM(Builder& b, int64_t e) { w_.value = b.constant({1, e}, 0.0f); }
  Tensor forward(const Tensor& x, Mode) override { return prepend_token(x, w_.value); }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    PrependGrads g = prepend_token_backward(dy, w_.value.shape(), need_dx);
    w_.grad = g.dtoken;
    return g.dx;
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    push_param(out, prefix, w_, "weight");
  }
  bool has_params() const override { return true; }
  Shape out_shape(const Shape& in) const override { return {in[0], in[1] + 1, in[2]}; }
  std::string describe() const override { return "ClassToken(" + std::to_string(w_.value.shape()[1]) + ")"; }

 private:
  Parameter w_;
};

// x[:, 0]: the first step's features (a ViT's class token).
class FirstStepM final : public Module {
 public:
  Tensor forward(const Tensor& x, Mode mode) override {
    if (mode == Mode::Train) steps_ = x.shape()[1];
    return select_step(x, 0);
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    return need_dx ? select_step_backward(dy, steps_, 0) : Tensor();
  }
  Shape out_shape(const Shape& in) const override { return {in[0], in[2]}; }
  std::string describe() const override { return "FirstStep()"; }

 private:
  int64_t steps_ = 0;
};

// d2l's valid_len = (X != pad).sum(1): token ids x [N, T] -> [N, 1], the count of ids that are not pad_id.
// Composed of element-wise ops and one product, so it runs wherever they do: for whole numbers d = x - pad,
// relu(1 - relu(d) - relu(-d)) is 1 exactly where d = 0, and T minus their sum is the count. No gradient.
class ValidLengthM final : public Module {
 public:
  explicit ValidLengthM(int64_t pad) : pad_(static_cast<float>(pad)) {}
  Tensor forward(const Tensor& x, Mode) override {
    const int64_t n = x.shape()[0], t = x.numel() / std::max<int64_t>(n, 1);
    const Tensor d = scale_shift(x.reshaped({n, t}), 1, -pad_);
    const Tensor off = add(relu(d), relu(scale_shift(d, -1, 0)));
    const Tensor is_pad = relu(scale_shift(off, -1, 1));
    const Tensor pads = matmul(is_pad, ones(x.runtime(), {t, 1}, x.device()));
    return scale_shift(pads, -1, static_cast<float>(t));
  }
  Tensor backward(const Tensor&, bool) override { return Tensor(); }
  Shape out_shape(const Shape& in) const override { return {in[0], 1}; }
  std::string describe() const override { return "ValidLength(pad_id=" + std::to_string(int64_t(pad_)) + ")"; }

 private:
  float pad_;
};

// d2l 11.2's NWKernelRegression: rows (query, key, value) of x [N, T, 3]; for each query i the pooling
// sum_j softmax_j(-((q_i - k_j) w)^2 / 2) v_j over every row's key and value, with w [1] from U(0, 1)
// (torch.rand). In training each query leaves out the key of its own row (its training point), as d2l
// leaves every training input out of its own estimate. Composed of the attention ops, so it runs wherever
// they do: the differences q_i - k_j are the product of rows (q_i, 1) and (1, -k_j).
class NadarayaWatsonM final : public Module {
 public:
  // U(0, 1) as U(-1/2, 1/2) moved up by 1/2.
  explicit NadarayaWatsonM(Builder& b) : w_{} { w_.value = scale_shift(b.uniform_weight({1}, 0.5f), 1, 0.5f); }
  Tensor forward(const Tensor& x, Mode mode) override {
    const int64_t n = x.shape()[0], t = x.shape()[1];
    const Tensor cols = transpose(x, 1, 2);  // [N, 3, T]
    const Tensor q = select_step(cols, 0).reshaped({n, 1, t}), k = select_step(cols, 1).reshaped({n, 1, t});
    const Tensor v = select_step(cols, 2).reshaped({n, t, 1});
    const Tensor ones = full(x.runtime(), {n, 1, t}, x.device(), 1.0f);
    Saved s;
    s.a = transpose(concat_channels(q, ones), 1, 2);                          // rows (q_i, 1)
    s.b = transpose(concat_channels(ones, scale_shift(k, -1, 0)), 1, 2);    // rows (1, -k_j)
    s.diff = bmm(s.a, s.b, {false, true, 1}).reshaped({n * t * t, 1});      // q_i - k_j
    s.scaled = linear(s.diff, w_.value.reshaped({1, 1}), Tensor());        // (q_i - k_j) w
    Tensor scores = scale_shift(mul(s.scaled, s.scaled), -0.5f, 0).reshaped({n, t, t});
    if (mode == Mode::Train) scores = add_per_sample(scores, own_key_mask(x, t));
    s.weights = masked_softmax(scores);
    s.v = v;
    const Tensor y = bmm(s.weights, v).reshaped({n, t});
    if (mode == Mode::Train) {
      saved_ = std::move(s);
    } else {
      first_weights_ = select_step(s.weights.reshaped({1, n, t * t}), 0).reshaped({1, t, t});
    }
    return y;
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    Saved s = std::move(saved_);
    saved_ = Saved();
    const int64_t n = dy.shape()[0], t = dy.shape()[1];
    const BmmGrads pooled = bmm_backward(s.weights, s.v, dy.reshaped({n, t, 1}), {}, true, need_dx);
    const Tensor dscores = softmax_backward(s.weights, pooled.da).reshaped({n * t * t, 1});
    // d(-e^2 / 2) / de = -e
    const Tensor dscaled = scale_shift(mul(s.scaled, dscores), -1, 0);
    LinearGrads lg = linear_backward(s.diff, w_.value.reshaped({1, 1}), dscaled, need_dx, false);
    w_.grad = lg.dw.reshaped({1});
    if (!need_dx) return Tensor();
    const BmmGrads diff = bmm_backward(s.a, s.b, lg.dx.reshaped({n, t, t}), {false, true, 1}, true, true);
    const Tensor dq = split_channels(transpose(diff.da, 1, 2), 1).first;                    // [N, 1, T]
    const Tensor dk = scale_shift(split_channels(transpose(diff.db, 1, 2), 1).second, -1, 0);
    const Tensor dv = pooled.db.reshaped({n, 1, t});
    return transpose(concat_channels(dq, concat_channels(dk, dv)), 1, 2);
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    push_param(out, prefix, w_, "w");
  }
  void collect_attention(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out) const override {
    if (first_weights_.defined()) out.emplace_back(prefix, first_weights_);
  }
  bool has_params() const override { return true; }
  void clear() override { saved_ = Saved(); }
  Shape out_shape(const Shape& in) const override { return {in[0], in[1]}; }
  std::string describe() const override { return "NadarayaWatson()"; }

 private:
  struct Saved {
    Tensor a, b, diff, scaled, weights, v;
  };
  // [T, T] with a large negative number on the diagonal: each query's own key gets no weight.
  const Tensor& own_key_mask(const Tensor& like, int64_t t) {
    if (!mask_.defined() || mask_.shape()[0] != t || mask_.device() != like.device()) {
      std::vector<float> m(static_cast<size_t>(t * t), 0.0f);
      for (int64_t i = 0; i < t; ++i) m[static_cast<size_t>(i * t + i)] = -1e30f;
      mask_ = from_values(like.runtime(), {t, t}, like.device(), std::move(m));
    }
    return mask_;
  }

  Parameter w_;
  Saved saved_;
  Tensor first_weights_, mask_;
};

}  // namespace

std::unique_ptr<Module> make_attention_module(Builder& b, const LayerSpec& l, const Shape& in, uint64_t seed) {
  switch (l.kind) {
    case LayerKind::LayerNorm:
      return std::make_unique<LayerNormM>(b, in.back(), static_cast<float>(l.eps), l.affine);
    case LayerKind::MultiheadAttention:
      return std::make_unique<MultiheadAttentionM>(b, l, in.at(1), seed);
    case LayerKind::BatchMatMul:
      return std::make_unique<BatchMatMulM>(l.transpose_b);
    case LayerKind::Softmax:
      return std::make_unique<SoftmaxM>(l.causal);
    case LayerKind::Mul:
      return std::make_unique<MulM>();
    case LayerKind::Scale:
      return std::make_unique<ScaleM>(static_cast<float>(l.scale));
    case LayerKind::PositionalEncoding:
      return std::make_unique<PositionalEncodingM>(b, static_cast<float>(l.dropout), seed);
    case LayerKind::PositionEmbedding:
      return std::make_unique<PositionEmbeddingM>(b, in);
    case LayerKind::ClassToken:
      return std::make_unique<ClassTokenM>(b, in.at(1));
    case LayerKind::FirstStep:
      return std::make_unique<FirstStepM>();
    case LayerKind::NadarayaWatson:
      return std::make_unique<NadarayaWatsonM>(b);
    case LayerKind::ValidLength:
      return std::make_unique<ValidLengthM>(l.pad_id);
    default:
      return nullptr;
  }
}

}  // namespace gn::nn
