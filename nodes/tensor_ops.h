// Ops the node set needs beyond ops.h. They are built on the public Backend interface and pushed with the
// same op info (name, bytes, flops) as their ops.h cousins, so spans and reports treat them alike.
#pragma once
#include <cstdint>
#include <functional>
#include <vector>

#include "gpunodes/ops.h"

namespace gn::nodes {

// arange laid out over any shape, row-major (ops.h's arange is 1-d).
Tensor arangeShaped(Runtime& rt, const Shape& shape, Device device, float start, float step);
// c = op(a) op(b) again, into the result of an earlier matmul(a, b, o): MatMul keep=last repeats the product
// without holding every result.
void matmulInto(const Tensor& a, const Tensor& b, const Tensor& c, const MatMulOptions& o);
// log[i] = reduce(xs[i]), on the device they share: the log kept on the device of the seed's exercise 3.
// Each entry is computed as soon as its xs[i] is ready; the returned tensor is ready once every entry is.
// cancelled() is polled between pushes.
Tensor reduceLog(ReduceOp op, const std::vector<Tensor>& xs, const std::function<bool()>& cancelled);
// The first n values of t, read to the host. Blocking, like to_host, but it copies only what is shown.
std::vector<float> readPrefix(const Tensor& t, int64_t n);
// A 2-d tensor's values at rows x cols (sorted indices), row-major, read to the host in one blocking op that
// copies only those elements: a heatmap of a large matrix costs a few hundred reads, not the matrix.
std::vector<float> readGrid(const Tensor& t, const std::vector<int64_t>& rows, const std::vector<int64_t>& cols);

}  // namespace gn::nodes
