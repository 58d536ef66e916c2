// The recurrent layers on CUDA (cudnn_recurrent.h) through cuDNN's RNN API, its v8 entry points:
// cudnnRNNForward, cudnnRNNBackwardData_v8 and cudnnRNNBackwardWeights_v8. The batch-first tensors are
// cuDNN's CUDNN_RNN_DATA_LAYOUT_BATCH_MAJOR_UNPACKED data with every sequence T steps long, so x, y, dy and
// dx are used where they lie; h0, c0, h_n and c_n are cuDNN's [layers * directions, N, H] state.
//
// How it fits together:
//  - The descriptors and the sizes of cuDNN's spaces (cudnn_rnn_plan.h) are made when the op is queued, on
//    the queuing thread with its own cuDNN handle: the weight and reserve spaces are tensors, whose sizes
//    must be known then so that a backward can be queued against them before its forward has run.
//  - The forward's op assembles the weight space from the PyTorch-named parameters (cudnn_rnn_layout.h
//    says where each gate's block goes; cudnnGetRNNWeightParams gives the address) and runs cudnnRNNForward.
//    A training forward keeps the weight space it ran with, cuDNN's reserve space, the outputs and the
//    dropped-out layer inputs in the CudnnRnnState.
//  - The backward's op runs BackwardData with that weight space, then zeroes it and lets BackwardWeights add
//    the weight gradients into it (cuDNN's weight gradients only add: CUDNN_WGRAD_MODE_ADD), and scatters
//    them into rnn_params order. BackwardData also writes the reserve space. Both spaces are thereby used
//    up, which is why recurrent.cpp refuses a second backward of one forward.
//  - Dropout between layers in training splits the stack into one cuDNN descriptor per layer
//    (cudnn_rnn_layout.h's segments), with recurrent.h's Philox masks between them, drawn here as on the
//    CPU; the backward draws each mask again from the seed instead of keeping it.
//  - Temporary workspace (cudnnGetRNNTempSpaceSizes) comes from the device's caching allocator once per op,
//    sized for the largest segment, together with the device copy of the sequence lengths.
// Everything is enqueued on the op's stream (the device worker's); every cuDNN and CUDA status is checked,
// a failure being a BackendError that names the call and the layer.
#include <cuda_runtime.h>
#include <cudnn.h>

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "../../cuda/cuda_check.h"
#include "../../cuda/cuda_worker.h"
#include "../cudnn_recurrent.h"
#include "cuda_kernel_support.h"
#include "cudnn_rnn_layout.h"
#include "cudnn_rnn_plan.h"
#include "gpunodes/errors.h"
#include "gpunodes/random.h"
#include "gpunodes/runtime.h"

namespace gn::nn {

// One forward's descriptors and buffers. A training forward returns it as its CudnnRnnOutputs::saved; an
// evaluation forward holds it only while its op is queued.
struct CudnnRnnState {
  RnnOptions options;
  int64_t n = 0, t = 0;
  uint64_t seed = 0;
  std::string layer;  // rnn_layer_name, for messages
  bool per_layer = false;
  std::vector<std::unique_ptr<SegmentPlan>> plans;  // one per segment; none for an empty batch
  Tensor x, h0, c0;  // the forward's input and initial state (undefined: zeros)
  // Per segment: its output [N, T, H * D] (the last is the forward's y), its weight space and, in training,
  // cuDNN's reserve space (float tensors of at least the bytes cuDNN asks for; undefined when it asks none).
  std::vector<Tensor> outputs, weight_spaces, reserves;
  // Per segment but the last, per-layer only: outputs * the Philox mask, the next segment's input.
  std::vector<Tensor> dropped;
};

namespace {

namespace cl = cudnn_layout;

#define GN_FOR_EACH(i, count)                                                                \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (count); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__global__ void fill_lengths_kernel(int32_t* lengths, int64_t n, int32_t steps) {
  GN_FOR_EACH(i, n) lengths[i] = steps;
}

// out[i] = in[i] * mask(first_index + i), mask = scale where philox::uniform_at(seed, .., 0, 1) <= keep,
// else 0: recurrent.h's dropout of a batch-first [N, T, H * D] layer output, with the CPU's float
// comparison and product (cpu_recurrent_kernels.cpp). out may be in (the backward scales in place).
__global__ void dropout_mask_kernel(int64_t count, const float* in, float* out, float keep, float scale,
                                    uint64_t seed, uint64_t first_index) {
  GN_FOR_EACH(i, count) {
    const float m =
        philox::uniform_at(seed, first_index + static_cast<uint64_t>(i), 0.0f, 1.0f) <= keep ? scale : 0.0f;
    out[i] = __fmul_rn(in[i], m);
  }
}

// ---- helpers over a state ---------------------------------------------------------------------------------

int64_t state_floats(const CudnnRnnState& st) {  // one layer's slice of h0 / h_n: D * N * H
  return st.options.directions() * st.n * st.options.hidden_size;
}
int64_t output_floats(const CudnnRnnState& st) {  // one layer's output: N * T * H * D
  return st.n * st.t * st.options.hidden_size * st.options.directions();
}
const float* slice_or_null(const Tensor& state, const CudnnRnnState& st, const SegmentPlan& sp) {
  return state.defined() ? state.data() + sp.seg.first_layer * state_floats(st) : nullptr;
}
float* slice(const Tensor& state, const CudnnRnnState& st, const SegmentPlan& sp) {
  return state.data() + sp.seg.first_layer * state_floats(st);
}
const Tensor& segment_input(const CudnnRnnState& st, size_t s) {
  return s == 0 ? st.x : st.dropped[s - 1];
}
void* data_or_null(const Tensor& t) {
  return t.defined() ? static_cast<void*>(t.data()) : nullptr;
}

// The op's temporary memory: cuDNN's workspace for the largest segment, then the N sequence lengths that
// cuDNN reads on the device (all T).
class OpScratch {
 public:
  OpScratch(KernelContext& kc, Stream& s, const CudnnRnnState& st)
      : work_bytes_(max_work(st)),
        space_(kc.allocator, s, work_bytes_ + static_cast<size_t>(st.n) * sizeof(int32_t)) {
    lengths_ = reinterpret_cast<int32_t*>(static_cast<char*>(space_.get()) + work_bytes_);
    fill_lengths_kernel<<<blocks_for(st.n), kThreads, 0, s.get()>>>(lengths_, st.n,
                                                                    static_cast<int32_t>(st.t));
    GN_RNN_CHECK(cudaGetLastError(), st.layer);
  }
  void* work() const { return work_bytes_ ? space_.get() : nullptr; }
  const int32_t* lengths() const { return lengths_; }

 private:
  static size_t max_work(const CudnnRnnState& st) {
    size_t most = 0;
    for (const auto& p : st.plans) most = std::max(most, p->work_bytes);
    return (most + 255) / 256 * 256;  // keeps the lengths aligned
  }
  size_t work_bytes_;
  Workspace space_;
  int32_t* lengths_ = nullptr;
};

void copy_floats(float* dst, const float* src, int64_t floats, Stream& s, const std::string& layer) {
  if (floats == 0) return;
  GN_RNN_CHECK(cudaMemcpyAsync(dst, src, static_cast<size_t>(floats) * sizeof(float),
                               cudaMemcpyDeviceToDevice, s.get()),
               layer);
}

void apply_dropout(const CudnnRnnState& st, int64_t layer_below, const float* in, float* out, Stream& s) {
  const int64_t count = output_floats(st);
  const float keep = 1.0f - st.options.dropout, scale = 1.0f / keep;  // rounded on the host, as the CPU's
  dropout_mask_kernel<<<blocks_for(count), kThreads, 0, s.get()>>>(
      count, in, out, keep, scale, st.seed, static_cast<uint64_t>(layer_below * count));
  GN_RNN_CHECK(cudaGetLastError(), st.layer);
}

// ---- the ops ----------------------------------------------------------------------------------------------

void run_forward(KernelContext& kc, const CudnnRnnState& st, const std::vector<Tensor>& weights,
                 bool training, const Tensor& h_n, const Tensor& c_n) {
  if (st.n == 0) return;  // every output is empty
  Stream s(kc);
  OpScratch scratch(kc, s, st);
  const bool lstm = st.options.kind == RnnKind::Lstm;
  for (size_t i = 0; i < st.plans.size(); ++i) {
    kc.op.check_cancelled();
    const SegmentPlan& sp = *st.plans[i];
    float* space = st.weight_spaces[i].data();
    // Gaps between cuDNN's blocks, if any, hold zeros rather than whatever the allocator left there.
    GN_RNN_CHECK(cudaMemsetAsync(space, 0, sp.weight_bytes, s.get()), st.layer);
    for (const WeightBlock& b : weight_blocks(s.cudnn(), sp, st.options, space, st.layer))
      copy_floats(space + b.space_offset, weights[b.param].data() + b.param_offset, b.floats, s, st.layer);
    const bool keep = training && st.reserves[i].defined();
    GN_RNN_CHECK(
        cudnnRNNForward(s.cudnn(), sp.rnn.get(),
                        training ? CUDNN_FWD_MODE_TRAINING : CUDNN_FWD_MODE_INFERENCE, scratch.lengths(),
                        sp.x.get(), segment_input(st, i).data(), sp.y.get(), st.outputs[i].data(), sp.h.get(),
                        slice_or_null(st.h0, st, sp), slice(h_n, st, sp), sp.h.get(),
                        lstm ? slice_or_null(st.c0, st, sp) : nullptr, lstm ? slice(c_n, st, sp) : nullptr,
                        sp.weight_bytes, space, sp.work_bytes, scratch.work(), keep ? sp.reserve_bytes : 0,
                        keep ? data_or_null(st.reserves[i]) : nullptr),
        st.layer);
    if (i + 1 < st.plans.size())
      apply_dropout(st, sp.seg.first_layer, st.outputs[i].data(), st.dropped[i].data(), s);
  }
}

// Scratch of one backward: the gradient between two segments (alternating, per-layer only) and, when the
// caller wants no dx, a place for the first segment's (cuDNN always writes it).
struct BackwardScratch {
  Tensor d_hidden[2];  // [N, T, H * D]
  Tensor dx_unwanted;  // [N, T, input_size]
};

void run_backward(KernelContext& kc, const CudnnRnnState& st, const Tensor& dy, const std::vector<Tensor>& dw,
                  const Tensor& dx, const BackwardScratch& b) {
  if (st.n == 0) {  // an empty batch contributes nothing
    Stream s(kc);
    for (const Tensor& g : dw)
      if (g.numel())
        GN_RNN_CHECK(cudaMemsetAsync(g.data(), 0, static_cast<size_t>(g.bytes()), s.get()), st.layer);
    return;
  }
  Stream s(kc);
  OpScratch scratch(kc, s, st);
  const bool lstm = st.options.kind == RnnKind::Lstm;
  const float* d_out = dy.data();  // the gradient arriving at the current segment's output
  for (size_t i = st.plans.size(); i-- > 0;) {
    kc.op.check_cancelled();
    const SegmentPlan& sp = *st.plans[i];
    float* space = st.weight_spaces[i].data();
    void* reserve = data_or_null(st.reserves[i]);
    const size_t reserve_bytes = reserve ? sp.reserve_bytes : 0;
    float* d_in = i > 0 ? b.d_hidden[i % 2].data() : (dx.defined() ? dx.data() : b.dx_unwanted.data());
    const float* hx = slice_or_null(st.h0, st, sp);
    const float* cx = lstm ? slice_or_null(st.c0, st, sp) : nullptr;
    const float* y = st.outputs[i].data();
    // The final state gets no gradient (dhy, dcy null: zeros), the initial state wants none (dhx, dcx null).
    GN_RNN_CHECK(cudnnRNNBackwardData_v8(s.cudnn(), sp.rnn.get(), scratch.lengths(), sp.y.get(), y, d_out,
                                         sp.x.get(), d_in, sp.h.get(), hx, nullptr, nullptr, sp.h.get(), cx,
                                         nullptr, nullptr, sp.weight_bytes, space, sp.work_bytes,
                                         scratch.work(), reserve_bytes, reserve),
                 st.layer);
    // BackwardData was the weight space's last reader: it now collects the weight gradients.
    GN_RNN_CHECK(cudaMemsetAsync(space, 0, sp.weight_bytes, s.get()), st.layer);
    GN_RNN_CHECK(cudnnRNNBackwardWeights_v8(s.cudnn(), sp.rnn.get(), CUDNN_WGRAD_MODE_ADD, scratch.lengths(),
                                            sp.x.get(), segment_input(st, i).data(), sp.h.get(), hx,
                                            sp.y.get(), y, sp.weight_bytes, space, sp.work_bytes,
                                            scratch.work(), reserve_bytes, reserve),
                 st.layer);
    for (const WeightBlock& w : weight_blocks(s.cudnn(), sp, st.options, space, st.layer))
      copy_floats(dw[w.param].data() + w.param_offset, space + w.space_offset, w.floats, s, st.layer);
    if (i > 0) {
      // The gradient at the layer below's output: through its dropout mask, in place.
      apply_dropout(st, sp.seg.first_layer - 1, d_in, d_in, s);
      d_out = d_in;
    }
  }
}

// Pushes `body(kc)` as one op on `device`'s compute stream.
template <class Body>
void push_op(Runtime& rt, Device device, std::vector<VarPtr> reads, std::vector<VarPtr> writes, OpInfo info,
             Precision precision, Body body) {
  Allocator* alloc = &rt.allocator(device);
  rt.engine().push(
      [alloc, precision, body = std::move(body)](OpContext& ctx) {
        KernelContext kc{ctx, *alloc, precision};
        body(kc);
      },
      std::move(reads), std::move(writes), device, StreamKind::Compute, std::move(info));
}

// A float tensor of at least `bytes`, or undefined for none.
Tensor bytes_tensor(Runtime& rt, Device device, size_t bytes) {
  if (bytes == 0) return {};
  return Tensor(rt, {static_cast<int64_t>((bytes + sizeof(float) - 1) / sizeof(float))}, device);
}

}  // namespace

CudnnRnnOutputs cudnn_rnn_forward(const RnnOptions& o, const Tensor& x, const std::vector<Tensor>& weights,
                                  const Tensor& h0, const Tensor& c0, bool training, uint64_t seed,
                                  Precision precision, OpInfo info) {
  Runtime& rt = x.runtime();
  const Device dev = x.device();
  auto st = std::make_shared<CudnnRnnState>();
  st->options = o;
  st->n = x.shape()[0];
  st->t = x.shape()[1];
  st->seed = seed;
  st->layer = rnn_layer_name(o, st->n, st->t, dev);
  st->per_layer = cl::per_layer_segments(training, o.dropout, o.num_layers);
  st->x = x;
  st->h0 = h0;
  st->c0 = c0;
  const int64_t hd = o.hidden_size * o.directions();
  CudnnRnnOutputs r;
  r.y = Tensor(rt, {st->n, st->t, hd}, dev);
  r.h_n = Tensor(rt, {o.num_layers * o.directions(), st->n, o.hidden_size}, dev);
  if (o.kind == RnnKind::Lstm) r.c_n = Tensor(rt, r.h_n.shape(), dev);
  if (st->n > 0) {  // cuDNN takes no empty batch; an empty one has nothing to compute
    const cuda::DeviceGuard guard(dev.index);
    cudnnHandle_t handle = cuda::thread_resources().cudnn(dev.index);
    const int64_t segments = cl::segment_count(o.num_layers, st->per_layer);
    for (int64_t s = 0; s < segments; ++s) {
      st->plans.push_back(std::make_unique<SegmentPlan>(handle, o,
                                                        cl::segment(s, o.num_layers, st->per_layer), st->n,
                                                        st->t, precision, training, st->layer));
      const SegmentPlan& sp = *st->plans.back();
      const bool last = s + 1 == segments;
      st->outputs.push_back(last ? r.y : Tensor(rt, {st->n, st->t, hd}, dev));
      if (!last) st->dropped.emplace_back(rt, Shape{st->n, st->t, hd}, dev);
      st->weight_spaces.push_back(bytes_tensor(rt, dev, sp.weight_bytes));
      st->reserves.push_back(training ? bytes_tensor(rt, dev, sp.reserve_bytes) : Tensor());
    }
  }

  std::vector<VarPtr> reads{x.var()};
  for (const Tensor& w : weights) reads.push_back(w.var());
  if (h0.defined()) reads.push_back(h0.var());
  if (c0.defined()) reads.push_back(c0.var());
  std::vector<VarPtr> writes{r.y.var(), r.h_n.var()};
  if (r.c_n.defined()) writes.push_back(r.c_n.var());
  if (training) {
    for (const auto* list : {&st->outputs, &st->dropped, &st->weight_spaces, &st->reserves})
      for (const Tensor& t : *list)
        if (t.defined() && !t.is_same(r.y)) writes.push_back(t.var());
    r.saved = st;
  }
  const Tensor h_n = r.h_n, c_n = r.c_n;
  push_op(rt, dev, std::move(reads), std::move(writes), std::move(info), precision,
          [st, weights, training, h_n, c_n](KernelContext& kc) {
            run_forward(kc, *st, weights, training, h_n, c_n);
          });
  return r;
}

const Tensor& cudnn_forward_input(const CudnnRnnState& s) {
  return s.x;
}

RnnGrads cudnn_rnn_backward(const RnnOptions& o, std::shared_ptr<const CudnnRnnState> saved, const Tensor& dy,
                            bool need_dx, Precision precision, OpInfo info) {
  const CudnnRnnState& s = *saved;
  Runtime& rt = s.x.runtime();
  const Device dev = s.x.device();
  RnnGrads g;
  for (const RnnParam& p : rnn_params(o)) g.dweights.emplace_back(rt, p.shape, dev);
  if (need_dx) g.dx = Tensor(rt, s.x.shape(), dev);
  BackwardScratch b;
  if (s.n > 0) {
    const Shape hidden{s.n, s.t, o.hidden_size * o.directions()};
    // Segment i > 0 writes its input's gradient into d_hidden[i % 2], which segment i - 1 reads.
    for (size_t i = 1; i < std::min<size_t>(s.plans.size(), 3); ++i)
      b.d_hidden[i % 2] = Tensor(rt, hidden, dev);
    if (!need_dx) b.dx_unwanted = Tensor(rt, s.x.shape(), dev);
  }

  std::vector<VarPtr> reads{dy.var(), s.x.var()};
  if (s.h0.defined()) reads.push_back(s.h0.var());
  if (s.c0.defined()) reads.push_back(s.c0.var());
  for (const auto* list : {&s.outputs, &s.dropped})
    for (const Tensor& t : *list) reads.push_back(t.var());
  // The forward's weight and reserve spaces become this backward's scratch (cudnn_recurrent.h).
  std::vector<VarPtr> writes;
  for (const auto* list : {&s.weight_spaces, &s.reserves})
    for (const Tensor& t : *list)
      if (t.defined()) writes.push_back(t.var());
  for (const Tensor& d : g.dweights) writes.push_back(d.var());
  if (need_dx) writes.push_back(g.dx.var());
  const std::vector<Tensor> dw = g.dweights;
  const Tensor dx = g.dx;
  push_op(rt, dev, std::move(reads), std::move(writes), std::move(info), precision,
          [saved = std::move(saved), dy, dw, dx, b](KernelContext& kc) {
            run_backward(kc, *saved, dy, dw, dx, b);
          });
  return g;
}

}  // namespace gn::nn
