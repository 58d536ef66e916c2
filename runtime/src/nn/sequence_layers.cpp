// The sequence ops and the regression losses: argument checks, output allocation and one engine op each. The
// kernels are in cpu_sequence_kernels.cpp and cuda/cuda_sequence_kernels.cu.
#include "gpunodes/nn/sequence_layers.h"

#include <algorithm>
#include <string>

#include "gpunodes/errors.h"
#include "gpunodes/runtime.h"
#include "op_helpers.h"
#include "sequence_kernels.h"

namespace gn::nn {
namespace {

// Token ids: [N, T] (also [N], one step).
void need_ids(const char* op, const Tensor& ids) {
  if (!ids.defined()) throw Error(std::string(op) + ": the ids are undefined");
  if (ids.shape().size() != 1 && ids.shape().size() != 2)
    throw ShapeError(std::string(op) + ": ids must be [N, T] token ids, got " + shape_str(ids.shape()));
}

int64_t steps_of(const Tensor& ids) {
  return ids.shape().size() == 2 ? ids.shape()[1] : 1;
}

Shape with_last(Shape s, int64_t last) {
  s.push_back(last);
  return s;
}

}  // namespace

// --- token ids -------------------------------------------------------------------------------------------

Tensor embedding(const Tensor& ids, const Tensor& w) {
  check_same_device({&ids, &w});
  need_ids("embedding", ids);
  if (w.shape().size() != 2 || w.shape()[0] < 1 || w.shape()[1] < 1)
    throw ShapeError("embedding: the weight must be [num_embeddings, embedding_dim], got " + shape_str(w.shape()));
  const int64_t n = ids.numel(), steps = steps_of(ids), vocab = w.shape()[0], dim = w.shape()[1];
  Tensor y(ids.runtime(), with_last(ids.shape(), dim), ids.device());
  push_like(ids, sequence_kernels, {ids.var(), w.var()}, {y.var()}, {"embedding", "", y.bytes() + ids.bytes(), 0},
                [=](SequenceKernels& k, KernelContext& kc) {
                  k.embedding_forward(n, steps, dim, vocab, ids.data(), w.data(), y.data(), kc);
                });
  return y;
}

Tensor embedding_backward(const Tensor& ids, const Tensor& dy, int64_t vocab) {
  check_same_device({&ids, &dy});
  need_ids("embedding_backward", ids);
  if (dy.shape().size() != ids.shape().size() + 1 ||
      !std::equal(ids.shape().begin(), ids.shape().end(), dy.shape().begin()))
    throw ShapeError("embedding_backward: dy " + shape_str(dy.shape()) + " does not fit the ids " +
                     shape_str(ids.shape()));
  const int64_t n = ids.numel(), dim = dy.shape().back();
  Tensor dw(ids.runtime(), {vocab, dim}, ids.device());
  push_like(ids, sequence_kernels, {ids.var(), dy.var()}, {dw.var()},
                {"embedding backward", "", dw.bytes() + dy.bytes(), dbl(dy.numel())},
                [=](SequenceKernels& k, KernelContext& kc) {
                  k.embedding_backward(n, dim, vocab, ids.data(), dy.data(), dw.data(), kc);
                });
  return dw;
}

Tensor one_hot(const Tensor& ids, int64_t classes) {
  need_ids("one_hot", ids);
  if (classes < 1) throw Error("one_hot: num_classes must be at least 1, got " + std::to_string(classes));
  const int64_t n = ids.numel(), steps = steps_of(ids);
  Tensor y(ids.runtime(), with_last(ids.shape(), classes), ids.device());
  push_like(ids, sequence_kernels, {ids.var()}, {y.var()}, {"one-hot", "", y.bytes(), 0},
                [=](SequenceKernels& k, KernelContext& kc) {
                  k.one_hot(n, steps, classes, ids.data(), y.data(), kc);
                });
  return y;
}

// --- axes ------------------------------------------------------------------------------------------------

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  if (!x.defined()) throw Error("transpose: the input is undefined");
  const Shape& s = x.shape();
  const auto rank = static_cast<int64_t>(s.size());
  if (dim0 < 0 || dim0 >= rank || dim1 < 0 || dim1 >= rank)
    throw ShapeError("transpose: axes " + std::to_string(dim0) + " and " + std::to_string(dim1) +
                     " are not both axes of " + shape_str(s));
  if (dim0 == dim1) return x;
  const int64_t lo = std::min(dim0, dim1), hi = std::max(dim0, dim1);
  auto product = [&](int64_t from, int64_t to) {
    int64_t p = 1;
    for (int64_t i = from; i < to; ++i) p *= s[static_cast<size_t>(i)];
    return p;
  };
  const int64_t outer = product(0, lo), a = s[static_cast<size_t>(lo)], mid = product(lo + 1, hi),
                b = s[static_cast<size_t>(hi)], inner = product(hi + 1, rank);
  Shape out = s;
  std::swap(out[static_cast<size_t>(lo)], out[static_cast<size_t>(hi)]);
  Tensor y(x.runtime(), out, x.device());
  push_like(x, sequence_kernels, {x.var()}, {y.var()}, {"transpose", "", 2 * x.bytes(), 0},
                [=](SequenceKernels& k, KernelContext& kc) {
                  k.swap_axes(outer, a, mid, b, inner, x.data(), y.data(), kc);
                });
  return y;
}

Tensor select_step(const Tensor& x, int64_t step) {
  if (!x.defined() || x.shape().size() != 3)
    throw ShapeError("select_step: the input must be [N, T, F], got " +
                     (x.defined() ? shape_str(x.shape()) : std::string("nothing")));
  const int64_t n = x.shape()[0], steps = x.shape()[1], f = x.shape()[2];
  if (step < 0 || step >= steps)
    throw ShapeError("select_step: step " + std::to_string(step) + " of " + std::to_string(steps));
  Tensor y(x.runtime(), {n, f}, x.device());
  push_like(x, sequence_kernels, {x.var()}, {y.var()}, {"select step", "", 2 * y.bytes(), 0},
                [=](SequenceKernels& k, KernelContext& kc) {
                  k.copy_strided(n, f, x.data() + step * f, steps * f, y.data(), f, kc);
                });
  return y;
}

Tensor select_step_backward(const Tensor& dy, int64_t steps, int64_t step) {
  if (!dy.defined() || dy.shape().size() != 2)
    throw ShapeError("select_step_backward: dy must be [N, F]");
  if (step < 0 || step >= steps)
    throw ShapeError("select_step_backward: step " + std::to_string(step) + " of " + std::to_string(steps));
  const int64_t n = dy.shape()[0], f = dy.shape()[1];
  Tensor dx(dy.runtime(), {n, steps, f}, dy.device());
  push_like(dy, sequence_kernels, {dy.var()}, {dx.var()}, {"select step backward", "", dx.bytes() + dy.bytes(), 0},
                [=](SequenceKernels& k, KernelContext& kc) {
                  k.zero(dx.data(), dx.numel(), kc);
                  k.copy_strided(n, f, dy.data(), f, dx.data() + step * f, steps * f, kc);
                });
  return dx;
}

// --- regression losses -------------------------------------------------------------------------------------

RegressionLossResult regression_loss(RegressionLoss kind, const Tensor& pred, const Tensor& target,
                                     bool want_grad, float grad_scale, float huber_delta) {
  check_same_device({&pred, &target});
  if (pred.numel() != target.numel() || pred.numel() < 1)
    throw ShapeError("regression loss: the output " + shape_str(pred.shape()) + " holds " +
                     std::to_string(pred.numel()) + " values and the targets " + shape_str(target.shape()) +
                     " hold " + std::to_string(target.numel()) + ": a regression needs one output per target");
  if (!(huber_delta > 0)) throw Error("huber loss: delta must be above 0");
  Runtime& rt = pred.runtime();
  RegressionLossResult r;
  r.loss = Tensor(rt, {}, pred.device());
  r.stats = Tensor(rt, {2}, pred.device());
  std::vector<VarPtr> writes{r.loss.var(), r.stats.var()};
  if (want_grad) {
    r.dpred = Tensor(rt, pred.shape(), pred.device());
    writes.push_back(r.dpred.var());
  }
  const int64_t n = pred.numel();
  const float scale = grad_scale != 0 ? grad_scale : 1.0f / static_cast<float>(n);
  Tensor loss = r.loss, stats = r.stats, d = r.dpred;
  push_like(pred, sequence_kernels, {pred.var(), target.var()}, writes,
                {"regression loss", "", (want_grad ? 3 : 2) * pred.bytes(), 4.0 * dbl(n)},
                [=](SequenceKernels& k, KernelContext& kc) {
                  k.regression_loss(kind, n, pred.data(), target.data(), huber_delta, loss.data(), stats.data(),
                                    d.defined() ? d.data() : nullptr, scale, kc);
                });
  return r;
}

}  // namespace gn::nn
