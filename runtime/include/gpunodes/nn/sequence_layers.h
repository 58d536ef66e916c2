// Layers over sequences and the regression losses, as tensor ops (see layers.h for what every op does: it
// checks its inputs, enqueues one engine op on their device and returns). A sequence batch is [N, T, F]
// (batch-first, as PyTorch's batch_first=True), token ids are [N, T] of exact integers stored as floats.
// The recurrent layers themselves are in recurrent.h.
#pragma once
#include <cstdint>

#include "gpunodes/nn/layers.h"

namespace gn::nn {

// --- token ids -------------------------------------------------------------------------------------------
// PyTorch's nn.Embedding: ids [N, T], w [vocab, E] -> [N, T, E]. An id that is not an integer in [0, vocab)
// fails the op, naming the id, its sample and step, and the range.
Tensor embedding(const Tensor& ids, const Tensor& w);
// The weight's gradient [vocab, E]: each position's dy row summed into the row of its id.
Tensor embedding_backward(const Tensor& ids, const Tensor& dy, int64_t vocab);
// F.one_hot(ids, classes) as floats: [N, T] -> [N, T, classes]; ids checked as embedding's.
Tensor one_hot(const Tensor& ids, int64_t classes);

// --- axes ------------------------------------------------------------------------------------------------
// x with axes dim0 and dim1 (of the whole tensor, 0 being the batch) swapped, into new memory: torch's
// x.transpose(dim0, dim1).contiguous(). Its own inverse, so backward is the same call on dy.
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
// x[:, step] of x [N, T, F]: [N, F]. 0 <= step < T.
Tensor select_step(const Tensor& x, int64_t step);
// The gradient of select_step: dy [N, F] at `step` of [N, steps, F], zeros elsewhere.
Tensor select_step_backward(const Tensor& dy, int64_t steps, int64_t step);

// --- regression losses -------------------------------------------------------------------------------------
// PyTorch's MSELoss, L1Loss and HuberLoss(delta), mean reduction, of predictions against targets with the
// same number of values (a [N, 1] output against [N] targets is the usual pair).
enum class RegressionLoss { Mse, L1, Huber };
struct RegressionLossResult {
  Tensor loss;   // [] the mean over every value
  Tensor stats;  // [2] {sum of the per-value losses, sum of squared errors}: the trainer's totals
  Tensor dpred;  // pred's shape: d(per-value loss)/d pred * grad_scale; undefined unless asked for
};
// grad_scale 0 means 1 / values, the gradient of the mean. huber_delta > 0.
RegressionLossResult regression_loss(RegressionLoss kind, const Tensor& pred, const Tensor& target,
                                     bool want_grad = true, float grad_scale = 0, float huber_delta = 1);

}  // namespace gn::nn
