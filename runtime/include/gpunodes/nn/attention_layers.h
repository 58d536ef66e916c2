// What attention and transformers are made of, as tensor ops (see layers.h for what every op does: it checks
// its inputs, enqueues one engine op on their device and returns): layer normalisation, batched matrix
// products, the masked softmax of d2l 11.3, the head split of multi-head attention, and the broadcasts that
// positional encodings and the class token need. A sequence batch is [N, T, E] (batch-first).
#pragma once
#include <cstdint>
#include <vector>

#include "gpunodes/nn/layers.h"

namespace gn::nn {

// --- layer normalisation -----------------------------------------------------------------------------------
// PyTorch's LayerNorm over the last axis of x [..., E]: gamma and beta [E], both undefined without affine.
struct LayerNormResult {
  Tensor y;
  Tensor mean, rstd;  // [rows]: what backward needs besides x
};
LayerNormResult layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps);
struct LayerNormGrads {
  Tensor dx;              // undefined unless asked for
  Tensor dgamma, dbeta;   // undefined without affine
};
LayerNormGrads layer_norm_backward(const Tensor& x, const Tensor& dy, const Tensor& gamma,
                                   const LayerNormResult& saved, bool need_dx);

// --- batched products ----------------------------------------------------------------------------------------
// torch.bmm with optional transposes: c [B, M, N] = alpha * op(a) op(b), op(a) [B, M, K] (a stored [B, K, M]
// with trans_a), op(b) [B, K, N] (b stored [B, N, K] with trans_b). In the current precision (ScopedPrecision),
// which the CPU takes only as fp32.
struct BmmOptions {
  bool trans_a = false, trans_b = false;
  float alpha = 1;
};
Tensor bmm(const Tensor& a, const Tensor& b, const BmmOptions& options = {});
struct BmmGrads {
  Tensor da, db;  // each undefined unless asked for
};
BmmGrads bmm_backward(const Tensor& a, const Tensor& b, const Tensor& dc, const BmmOptions& options, bool need_da,
                      bool need_db);

// --- softmax with masks ----------------------------------------------------------------------------------------
// Which scores get no weight: with causal, a query's future keys (key j > query i when there are as many of
// each); with valid_lens ([samples] of whole numbers, on the scores' device), keys at or past the sample's
// length, d2l's masked_softmax. `heads` scores matrices belong to each sample.
struct AttentionMask {
  bool causal = false;
  Tensor valid_lens;
  int64_t heads = 1;
};
// Softmax over the last axis of x [B, Tq, Tk] (B = samples * heads): masked entries are exactly 0, and a row
// with none left is all zeros (d2l's -1e6 fill makes it uniform instead; PyTorch makes it NaN).
Tensor masked_softmax(const Tensor& x, const AttentionMask& mask = {});
// The gradient through a softmax whose output was y: y * (dy - sum(dy * y)) along the last axis.
Tensor softmax_backward(const Tensor& y, const Tensor& dy);

// --- heads -------------------------------------------------------------------------------------------------
// x [N, T, groups * E] (a fused projection of `groups` parts) -> one [N * heads, T, E / heads] per part: each
// part's heads, laid out as torch's x.view(N, T, heads, d).transpose(1, 2).
std::vector<Tensor> split_heads(const Tensor& x, int64_t groups, int64_t heads);
// The inverse: parts [N * heads, T, d] -> [N, T, parts * heads * d].
Tensor merge_heads(const std::vector<Tensor>& parts, int64_t heads);

// --- broadcasts over the batch -------------------------------------------------------------------------------
// x [N, ...] + table: table holds at least x's per-sample values; its first ones are added to every sample
// (a learned [T_max, E] position embedding covers every shorter sequence).
Tensor add_per_sample(const Tensor& x, const Tensor& table);
// The gradient of add_per_sample for the table: dy [N, ...] summed over the batch, written into the first
// values of a tensor of `table_shape` (the rest zeros).
Tensor sum_over_batch(const Tensor& dy, const Shape& table_shape);
// [N, T, E] with `token` [E] (any shape of E values) before the first step: [N, T + 1, E].
Tensor prepend_token(const Tensor& x, const Tensor& token);
struct PrependGrads {
  Tensor dx;      // [N, T, E]; undefined unless asked for
  Tensor dtoken;  // the token's shape
};
PrependGrads prepend_token_backward(const Tensor& dy, const Shape& token_shape, bool need_dx);

// --- slices of a fused weight --------------------------------------------------------------------------------
// y = x w_part^T + b_part, where w [parts * out, in] and b [parts * out] (may be undefined) hold `parts`
// stacked projections: nn.MultiheadAttention's in_proj_weight used for a query, key or value of its own.
Tensor linear_part(const Tensor& x, const Tensor& w, const Tensor& b, int64_t part, int64_t parts);
// Its gradients: dx returned (when asked for); the part's rows of dw and db (undefined: no bias) overwritten.
Tensor linear_part_backward(const Tensor& x, const Tensor& w, const Tensor& dy, int64_t part, int64_t parts,
                            const Tensor& dw, const Tensor& db, bool need_dx);

}  // namespace gn::nn
