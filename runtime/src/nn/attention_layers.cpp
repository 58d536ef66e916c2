// The attention ops: argument checks, output allocation and one engine op each. The kernels are in
// cpu_attention_kernels.cpp and cuda/cuda_attention_kernels.cu; linear_part uses the layer kernels' linear
// products on a slice of the fused weight.
#include "gpunodes/nn/attention_layers.h"

#include <string>

#include "attention_kernels.h"
#include "gpunodes/errors.h"
#include "gpunodes/precision.h"
#include "gpunodes/runtime.h"
#include "op_helpers.h"
#include "sequence_kernels.h"

namespace gn::nn {
namespace {

void need_defined(const char* op, const char* what, const Tensor& t) {
  if (!t.defined()) throw Error(std::string(op) + ": " + what + " is undefined");
}

void need_rank3(const char* op, const char* what, const Tensor& t) {
  need_defined(op, what, t);
  if (t.shape().size() != 3)
    throw ShapeError(std::string(op) + ": " + what + " must be [batch, rows, columns], got " + shape_str(t.shape()));
}

int64_t last_axis(const Tensor& t) {
  return t.shape().empty() ? 1 : t.shape().back();
}

// The precision of a product enqueued now, refused at once where the device cannot compute in it.
Precision product_precision_of(const char* op, Device device) {
  const Precision p = current_precision();
  check_precision(p, device, op);
  return p;
}

}  // namespace

// --- layer normalisation -------------------------------------------------------------------------------------

LayerNormResult layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps) {
  need_defined("layer_norm", "the input", x);
  if (x.shape().empty()) throw ShapeError("layer_norm: the input has no axis to normalise");
  const int64_t cols = last_axis(x), rows = x.numel() / cols;
  const bool affine = gamma.defined();
  if (affine != beta.defined()) throw Error("layer_norm: weight and bias must both be given or both be absent");
  if (affine) {
    check_same_device({&x, &gamma, &beta});
    need_shape("layer_norm", "weight", gamma, {cols});
    need_shape("layer_norm", "bias", beta, {cols});
  }
  if (!(eps > 0)) throw Error("layer_norm: eps must be positive, got " + std::to_string(eps));
  Runtime& rt = x.runtime();
  LayerNormResult r{Tensor(rt, x.shape(), x.device()), Tensor(rt, {rows}, x.device()), Tensor(rt, {rows}, x.device())};
  std::vector<VarPtr> reads{x.var()};
  if (affine) reads.push_back(gamma.var()), reads.push_back(beta.var());
  const Tensor y = r.y, mean = r.mean, rstd = r.rstd;
  push_like(x, attention_kernels, reads, {y.var(), mean.var(), rstd.var()}, {"layer norm", "", 2 * x.bytes(), 8 * dbl(x.numel())},
                 [=](AttentionKernels& k, KernelContext& kc) {
                   k.layer_norm_forward(rows, cols, eps, x.data(), affine ? gamma.data() : nullptr,
                                        affine ? beta.data() : nullptr, y.data(), mean.data(), rstd.data(), kc);
                 });
  return r;
}

LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                   const LayerNormResult& saved, bool need_dx) {
  need_defined("layer_norm backward", "the input", x);
  check_same_device({&x, &dy, &saved.mean, &saved.rstd});
  need_shape("layer_norm backward", "the output gradient", dy, x.shape());
  const int64_t cols = last_axis(x), rows = x.numel() / cols;
  need_shape("layer_norm backward", "the saved mean", saved.mean, {rows});
  need_shape("layer_norm backward", "the saved rstd", saved.rstd, {rows});
  const bool affine = gamma.defined();
  if (affine) need_shape("layer_norm backward", "weight", gamma, {cols});
  Runtime& rt = x.runtime();
  LayerNormGrads g;
  std::vector<VarPtr> reads{x.var(), dy.var(), saved.mean.var(), saved.rstd.var()}, writes;
  if (affine) {
    reads.push_back(gamma.var());
    g.dgamma = Tensor(rt, {cols}, x.device());
    g.dbeta = Tensor(rt, {cols}, x.device());
    writes.push_back(g.dgamma.var()), writes.push_back(g.dbeta.var());
  }
  if (need_dx) g.dx = Tensor(rt, x.shape(), x.device()), writes.push_back(g.dx.var());
  if (writes.empty()) return g;
  const Tensor mean = saved.mean, rstd = saved.rstd, dx = g.dx, dgamma = g.dgamma, dbeta = g.dbeta;
  push_like(x, attention_kernels, reads, writes, {"layer norm backward", "", 3 * x.bytes(), 12 * dbl(x.numel())},
                 [=](AttentionKernels& k, KernelContext& kc) {
                   k.layer_norm_backward(rows, cols, x.data(), dy.data(), affine ? gamma.data() : nullptr,
                                         mean.data(), rstd.data(), dx.defined() ? dx.data() : nullptr,
                                         affine ? dgamma.data() : nullptr, affine ? dbeta.data() : nullptr, kc);
                 });
  return g;
}

// --- batched products ------------------------------------------------------------------------------------------

Tensor bmm(const Tensor& a, const Tensor& b, const BmmOptions& o) {
  need_rank3("bmm", "a", a);
  need_rank3("bmm", "b", b);
  check_same_device({&a, &b});
  const Shape& as = a.shape();
  const Shape& bs = b.shape();
  const int64_t batch = as[0], m = o.trans_a ? as[2] : as[1], k = o.trans_a ? as[1] : as[2];
  const int64_t kb = o.trans_b ? bs[2] : bs[1], n = o.trans_b ? bs[1] : bs[2];
  if (bs[0] != batch || kb != k)
    throw ShapeError("bmm: a " + shape_str(as) + (o.trans_a ? " (transposed)" : "") + " and b " + shape_str(bs) +
                     (o.trans_b ? " (transposed)" : "") + " do not fit: " +
                     (bs[0] != batch ? "the batches differ"
                                     : "a's columns " + std::to_string(k) + " against b's rows " + std::to_string(kb)));
  const Precision precision = product_precision_of("bmm", a.device());
  Tensor c(a.runtime(), {batch, m, n}, a.device());
  push_like(a, attention_kernels, {a.var(), b.var()}, {c.var()},
                 {"bmm", "", a.bytes() + b.bytes() + c.bytes(), 2.0 * dbl(batch) * dbl(m) * dbl(n) * dbl(k)},
                 [=](AttentionKernels& kern, KernelContext& kc) {
                   kc.precision = precision;
                   kern.bmm(batch, m, n, k, o.trans_a, o.trans_b, o.alpha, a.data(), b.data(), c.data(), kc);
                 });
  return c;
}

BmmGrads bmm_backward(const Tensor& a, const Tensor& b, const Tensor& dc, const BmmOptions& o, bool need_da,
                      bool need_db) {
  need_rank3("bmm backward", "dc", dc);
  // c = alpha op(a) op(b), so d op(a) = alpha dc op(b)^T and d op(b) = alpha op(a)^T dc; each is written
  // back in its operand's stored orientation by choosing the product's order and transposes.
  BmmGrads g;
  if (need_da) {
    g.da = o.trans_a ? bmm(b, dc, {o.trans_b, true, o.alpha})     // a stored as op(a)^T: op(b) dc^T
                     : bmm(dc, b, {false, !o.trans_b, o.alpha});  // da = dc op(b)^T
  }
  if (need_db) {
    g.db = o.trans_b ? bmm(dc, a, {true, o.trans_a, o.alpha})     // b stored as op(b)^T: dc^T op(a)
                     : bmm(a, dc, {!o.trans_a, false, o.alpha});  // db = op(a)^T dc
  }
  return g;
}

// --- softmax with masks ------------------------------------------------------------------------------------------

Tensor masked_softmax(const Tensor& x, const AttentionMask& mask) {
  need_rank3("masked_softmax", "the scores", x);
  const int64_t batch = x.shape()[0], rows = x.shape()[1], cols = x.shape()[2];
  if (mask.heads < 1 || batch % mask.heads != 0)
    throw ShapeError("masked_softmax: " + std::to_string(batch) + " score matrices are not a whole number of " +
                     std::to_string(mask.heads) + " heads per sample");
  if (mask.causal && rows > cols)
    throw ShapeError("masked_softmax: a causal mask needs at least as many keys as queries, got " +
                     std::to_string(rows) + " queries and " + std::to_string(cols) + " keys");
  const bool lens = mask.valid_lens.defined();
  std::vector<VarPtr> reads{x.var()};
  if (lens) {
    check_same_device({&x, &mask.valid_lens});
    need_shape("masked_softmax", "the valid lengths", mask.valid_lens, {batch / mask.heads});
    reads.push_back(mask.valid_lens.var());
  }
  Tensor y(x.runtime(), x.shape(), x.device());
  const Tensor valid = mask.valid_lens;
  const bool causal = mask.causal;
  const int64_t heads = mask.heads;
  push_like(x, attention_kernels, reads, {y.var()}, {"softmax", "", 2 * x.bytes(), 4 * dbl(x.numel())},
                 [=](AttentionKernels& k, KernelContext& kc) {
                   k.masked_softmax(batch, heads, rows, cols, causal, lens ? valid.data() : nullptr, x.data(),
                                    y.data(), kc);
                 });
  return y;
}

Tensor softmax_backward(const Tensor& y, const Tensor& dy) {
  need_defined("softmax backward", "the output", y);
  check_same_device({&y, &dy});
  need_shape("softmax backward", "the output gradient", dy, y.shape());
  const int64_t cols = last_axis(y), rows = y.numel() / cols;
  Tensor dx(y.runtime(), y.shape(), y.device());
  push_like(y, attention_kernels, {y.var(), dy.var()}, {dx.var()}, {"softmax backward", "", 3 * y.bytes(), 4 * dbl(y.numel())},
                 [=](AttentionKernels& k, KernelContext& kc) {
                   k.softmax_backward(rows, cols, y.data(), dy.data(), dx.data(), kc);
                 });
  return dx;
}

// --- heads ---------------------------------------------------------------------------------------------------------

std::vector<Tensor> split_heads(const Tensor& x, int64_t groups, int64_t heads) {
  need_rank3("split_heads", "the projections", x);
  const int64_t n = x.shape()[0], t = x.shape()[1], width = x.shape()[2];
  if (groups < 1 || heads < 1 || width % (groups * heads) != 0)
    throw ShapeError("split_heads: width " + std::to_string(width) + " is not " + std::to_string(groups) +
                     " parts of " + std::to_string(heads) + " equal heads");
  const int64_t d = width / (groups * heads);
  std::vector<Tensor> parts;
  for (int64_t g = 0; g < groups; ++g) {
    Tensor out(x.runtime(), {n * heads, t, d}, x.device());
    push_like(x, attention_kernels, {x.var()}, {out.var()}, {"split heads", "", 2 * out.bytes(), 0},
                   [=](AttentionKernels& k, KernelContext& kc) {
                     k.split_heads(n, t, groups, g, heads, d, x.data(), out.data(), kc);
                   });
    parts.push_back(out);
  }
  return parts;
}

Tensor merge_heads(const std::vector<Tensor>& parts, int64_t heads) {
  if (parts.empty()) throw Error("merge_heads: no parts");
  need_rank3("merge_heads", "a part", parts[0]);
  const Shape s = parts[0].shape();
  if (heads < 1 || s[0] % heads != 0)
    throw ShapeError("merge_heads: " + std::to_string(s[0]) + " matrices are not whole samples of " +
                     std::to_string(heads) + " heads");
  for (const Tensor& p : parts) {
    check_same_device({&parts[0], &p});
    need_shape("merge_heads", "every part", p, s);
  }
  const auto groups = static_cast<int64_t>(parts.size());
  const int64_t n = s[0] / heads, t = s[1], d = s[2];
  Tensor y(parts[0].runtime(), {n, t, groups * heads * d}, parts[0].device());
  for (int64_t g = 0; g < groups; ++g) {
    const Tensor in = parts[static_cast<size_t>(g)];
    push_like(in, attention_kernels, {in.var()}, {y.var()}, {"merge heads", "", 2 * in.bytes(), 0},
                   [=](AttentionKernels& k, KernelContext& kc) {
                     k.merge_heads(n, t, groups, g, heads, d, in.data(), y.data(), kc);
                   });
  }
  return y;
}

// --- broadcasts over the batch ---------------------------------------------------------------------------------

Tensor add_per_sample(const Tensor& x, const Tensor& table) {
  need_defined("add_per_sample", "the input", x);
  need_defined("add_per_sample", "the table", table);
  check_same_device({&x, &table});
  if (x.shape().empty()) throw ShapeError("add_per_sample: the input has no batch axis");
  const int64_t n = x.shape()[0], len = n ? x.numel() / n : 0;
  if (table.numel() < len)
    throw ShapeError("add_per_sample: the table " + shape_str(table.shape()) + " holds fewer than the " +
                     std::to_string(len) + " values of a sample of " + shape_str(x.shape()));
  Tensor y(x.runtime(), x.shape(), x.device());
  push_like(x, attention_kernels, {x.var(), table.var()}, {y.var()}, {"add per sample", "", 2 * x.bytes(), dbl(x.numel())},
                 [=](AttentionKernels& k, KernelContext& kc) {
                   k.add_broadcast(n, len, x.data(), table.data(), y.data(), kc);
                 });
  return y;
}

Tensor sum_over_batch(const Tensor& dy, const Shape& table_shape) {
  need_defined("sum_over_batch", "the gradient", dy);
  if (dy.shape().empty()) throw ShapeError("sum_over_batch: the gradient has no batch axis");
  const int64_t n = dy.shape()[0], len = n ? dy.numel() / n : 0;
  Tensor out(dy.runtime(), table_shape, dy.device());
  if (out.numel() < len)
    throw ShapeError("sum_over_batch: a sample of " + shape_str(dy.shape()) + " does not fit the table " +
                     shape_str(table_shape));
  const int64_t total = out.numel();
  push_like(dy, attention_kernels, {dy.var()}, {out.var()}, {"sum over batch", "", dy.bytes() + out.bytes(), dbl(dy.numel())},
                 [=](AttentionKernels& k, KernelContext& kc) {
                   if (total > len) sequence_kernels(kc.op.device).zero(out.data() + len, total - len, kc);
                   k.sum_rows(n, len, len, dy.data(), out.data(), kc);
                 });
  return out;
}

Tensor prepend_token(const Tensor& x, const Tensor& token) {
  need_rank3("prepend_token", "the input", x);
  check_same_device({&x, &token});
  const int64_t n = x.shape()[0], t = x.shape()[1], e = x.shape()[2];
  if (token.numel() != e)
    throw ShapeError("prepend_token: the token " + shape_str(token.shape()) + " is not one step of " +
                     shape_str(x.shape()));
  Tensor y(x.runtime(), {n, t + 1, e}, x.device());
  push_like(x, attention_kernels, {x.var(), token.var()}, {y.var()}, {"prepend token", "", 2 * y.bytes(), 0},
                 [=](AttentionKernels&, KernelContext& kc) {
                   sequence_kernels(kc.op.device).copy_strided(n, e, token.data(), 0, y.data(), (t + 1) * e, kc);
                   sequence_kernels(kc.op.device).copy_strided(n, t * e, x.data(), t * e, y.data() + e, (t + 1) * e, kc);
                 });
  return y;
}

PrependGrads prepend_token_backward(const Tensor& dy, const Shape& token_shape, bool need_dx) {
  need_rank3("prepend_token backward", "the gradient", dy);
  const int64_t n = dy.shape()[0], t = dy.shape()[1] - 1, e = dy.shape()[2];
  if (t < 0) throw ShapeError("prepend_token backward: the gradient " + shape_str(dy.shape()) + " has no steps");
  PrependGrads g;
  g.dtoken = Tensor(dy.runtime(), token_shape, dy.device());
  if (g.dtoken.numel() != e)
    throw ShapeError("prepend_token backward: the token " + shape_str(token_shape) + " is not one step of " +
                     shape_str(dy.shape()));
  std::vector<VarPtr> writes{g.dtoken.var()};
  if (need_dx) g.dx = Tensor(dy.runtime(), {n, t, e}, dy.device()), writes.push_back(g.dx.var());
  const Tensor dtoken = g.dtoken, dx = g.dx;
  push_like(dy, attention_kernels, {dy.var()}, writes, {"prepend token backward", "", 2 * dy.bytes(), dbl(n * e)},
                 [=](AttentionKernels& k, KernelContext& kc) {
                   k.sum_rows(n, e, (t + 1) * e, dy.data(), dtoken.data(), kc);
                   if (dx.defined())
                     sequence_kernels(kc.op.device).copy_strided(n, t * e, dy.data() + e, (t + 1) * e, dx.data(), t * e, kc);
                 });
  return g;
}

// --- slices of a fused weight ------------------------------------------------------------------------------------

namespace {

struct PartShape {
  int64_t rows, in, out;
};

PartShape part_shape(const char* op, const Tensor& x, const Tensor& w, int64_t part, int64_t parts) {
  need_defined(op, "the input", x);
  need_defined(op, "the weight", w);
  check_same_device({&x, &w});
  if (w.shape().size() != 2 || parts < 1 || w.shape()[0] % parts != 0 || part < 0 || part >= parts)
    throw ShapeError(std::string(op) + ": weight " + shape_str(w.shape()) + " is not " + std::to_string(parts) +
                     " stacked projections with a part " + std::to_string(part));
  const int64_t in = w.shape()[1], out = w.shape()[0] / parts;
  if (last_axis(x) != in)
    throw ShapeError(std::string(op) + ": input " + shape_str(x.shape()) + " has " + std::to_string(last_axis(x)) +
                     " features but the weight " + shape_str(w.shape()) + " expects " + std::to_string(in));
  return {x.numel() / in, in, out};
}

}  // namespace

Tensor linear_part(const Tensor& x, const Tensor& w, const Tensor& b, int64_t part, int64_t parts) {
  const PartShape s = part_shape("linear_part", x, w, part, parts);
  const bool bias = b.defined();
  std::vector<VarPtr> reads{x.var(), w.var()};
  if (bias) {
    check_same_device({&x, &b});
    need_shape("linear_part", "bias", b, {w.shape()[0]});
    reads.push_back(b.var());
  }
  const Precision precision = product_precision_of("linear_part", x.device());
  Shape ys = x.shape();
  ys.back() = s.out;
  Tensor y(x.runtime(), ys, x.device());
  push_kernel(x.runtime(), x.device(), reads, {y.var()},
              {"linear part", "", x.bytes() + w.bytes() / parts + y.bytes(), 2.0 * dbl(s.rows) * dbl(s.in) * dbl(s.out)},
              [=](NnKernels& k, KernelContext& kc) {
                kc.precision = precision;
                k.linear_forward(s.rows, s.in, s.out, x.data(), w.data() + part * s.out * s.in,
                                 bias ? b.data() + part * s.out : nullptr, y.data(), kc);
              });
  return y;
}

Tensor linear_part_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t part, int64_t parts,
                            const Tensor& dw, const Tensor& db, bool need_dx) {
  const PartShape s = part_shape("linear_part backward", x, w, part, parts);
  check_same_device({&x, &dy, &dw});
  Shape ys = x.shape();
  ys.back() = s.out;
  need_shape("linear_part backward", "the output gradient", dy, ys);
  need_shape("linear_part backward", "the weight gradient", dw, w.shape());
  const bool bias = db.defined();
  std::vector<VarPtr> writes{dw.var()};
  if (bias) need_shape("linear_part backward", "the bias gradient", db, {w.shape()[0]}), writes.push_back(db.var());
  Tensor dx;
  if (need_dx) dx = Tensor(x.runtime(), x.shape(), x.device()), writes.push_back(dx.var());
  const Precision precision = product_precision_of("linear_part backward", x.device());
  push_kernel(x.runtime(), x.device(), {x.var(), w.var(), dy.var()}, writes,
              {"linear part backward", "", 2 * x.bytes() + 2 * dy.bytes(),
               (need_dx ? 4.0 : 2.0) * dbl(s.rows) * dbl(s.in) * dbl(s.out)},
              [=](NnKernels& k, KernelContext& kc) {
                kc.precision = precision;
                k.linear_backward(s.rows, s.in, s.out, x.data(), w.data() + part * s.out * s.in, dy.data(),
                                  dx.defined() ? dx.data() : nullptr, dw.data() + part * s.out * s.in,
                                  bias ? db.data() + part * s.out : nullptr, kc);
              });
  return dx;
}

}  // namespace gn::nn
