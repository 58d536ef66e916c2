// The recurrent layers' ops: argument checks, the buffers, and on the CPU the recurrence itself, written
// against RecurrentKernels (recurrent_kernels.h, cpu_recurrent_kernels.cpp). A CUDA input, once checked, goes
// to cuDNN's RNN API instead (cudnn_recurrent.h, cuda/cuda_recurrent_kernels.cu).
//
// Each call is one engine op for the whole stack. Inside it the layers work time-major ([T, N, features]),
// so that every step's rows are one packed block and the products over all steps are single matrix
// products: the input projections of a layer and direction (x W_ih^T for every t), and in backward the
// weight gradients (dW_ih, dW_hh) and the input gradient. Only the recurrent product h W_hh^T (forward) and
// dgates W_hh (backward) go step by step, each followed by one fused pass over the gates. x and dy are
// turned time-major once on the way in, y and dx batch-first once on the way out.
#include "gpunodes/nn/recurrent.h"

#include <algorithm>
#include <string>
#include <utility>

#include "cudnn_recurrent.h"
#include "gpunodes/errors.h"
#include "gpunodes/nn/layers.h"
#include "gpunodes/ops.h"
#include "gpunodes/precision.h"
#include "gpunodes/runtime.h"
#include "op_helpers.h"
#include "recurrent_kernels.h"

namespace gn::nn {

// Everything a training forward wrote that its backward reads, all time-major. Layer l's input is x_tm for
// l = 0, else dropped[l - 1] when dropout is on, else outputs[l - 1].
struct RnnSaved {
  RnnOptions options;
  int64_t batch = 0, steps = 0;
  Tensor x_tm;                  // [T, N, input_size]
  std::vector<Tensor> outputs;  // per layer [T, N, H * D]: h_t of both directions, before dropout
  std::vector<Tensor> masks;    // per layer but the last, with dropout: 0 or 1 / (1 - p)
  std::vector<Tensor> dropped;  // per layer but the last, with dropout: outputs * masks
  // GRU and LSTM only (an RNN's backward needs nothing but h_t), per (layer, direction):
  std::vector<Tensor> gates;  // [T, N, G * H] the activations, GRU r z n, LSTM i f g o
  std::vector<Tensor> cells;  // [T, N, H] LSTM c_t, GRU W_hn h_prev + b_hn
  Tensor h0, c0;              // the initial state forward started from; undefined: zeros
  bool consumed = false;      // a backward has turned gates (and the GRU's cells) into gradients
  // A CUDA forward keeps cuDNN's state here instead, and nothing above but options, batch, steps, consumed.
  std::shared_ptr<CudnnRnnState> cudnn;
};

namespace {

RecurrentKernels& recurrent_kernels(Device device) {
  if (device.is_cpu()) return cpu_recurrent_kernels();
  throw Error("no recurrent kernels for " + device.str() + ": a CUDA device runs cuDNN (cudnn_recurrent.h)");
}

// The sizes of one call, and where its parameters lie in rnn_params order.
struct Dims {
  RnnKind kind;
  int64_t n, t, f, h, d, layers, g;
  bool bias;
  int64_t gh() const { return g * h; }  // gate rows
  int64_t hd() const { return h * d; }  // a layer's output features
  int64_t in(int64_t l) const { return l == 0 ? f : hd(); }
  int64_t slot(int64_t l, int64_t dir) const { return l * d + dir; }  // in h_n, gates, cells
  size_t param(int64_t l, int64_t dir, int which) const {             // which: 0 W_ih, 1 W_hh, 2 b_ih, 3 b_hh
    return static_cast<size_t>(slot(l, dir) * (bias ? 4 : 2) + which);
  }
  // Forward-order step s of direction dir is time t = step_time(dir, s); its predecessor is s - 1's time.
  int64_t step_time(int64_t dir, int64_t s) const { return dir == 0 ? s : t - 1 - s; }
};

Dims dims_of(const RnnOptions& o, int64_t n, int64_t t) {
  return {o.kind, n, t, o.input_size, o.hidden_size, o.directions(), o.num_layers, rnn_gate_count(o.kind),
          o.bias};
}

void check_options(const RnnOptions& o) {
  (void)rnn_gate_count(o.kind);  // throws for an unknown kind
  if (o.input_size < 1 || o.hidden_size < 1 || o.num_layers < 1)
    throw Error(
        std::string("recurrent layer: input_size, hidden_size and num_layers must be at least 1, got ") +
        std::to_string(o.input_size) + ", " + std::to_string(o.hidden_size) + " and " +
        std::to_string(o.num_layers));
  if (!(o.dropout >= 0.0f && o.dropout < 1.0f))
    throw Error("recurrent layer: dropout must satisfy 0 <= dropout < 1, got " + std::to_string(o.dropout));
}

// x [N, T, input_size] with T >= 1; returns {N, T}.
std::pair<int64_t, int64_t> check_input(const char* op, const RnnOptions& o, const Tensor& x) {
  if (!x.defined()) throw Error(std::string(op) + ": the input is undefined");
  const Shape& s = x.shape();
  if (s.size() != 3 || s[2] != o.input_size)
    throw ShapeError(std::string(op) + ": input must be [N, T, " + std::to_string(o.input_size) +
                     "] (batch-first), got " + shape_str(s));
  if (s[1] < 1)
    throw ShapeError(std::string(op) + ": input needs at least one time step, got " + shape_str(s));
  return {s[0], s[1]};
}

void check_weights(const char* op, const RnnOptions& o, const Tensor& x, const std::vector<Tensor>& weights) {
  const std::vector<RnnParam> params = rnn_params(o);
  if (weights.size() != params.size())
    throw Error(std::string(op) + ": expected " + std::to_string(params.size()) + " weights (" +
                params[0].name + " ... " + params.back().name + "), got " + std::to_string(weights.size()));
  for (size_t i = 0; i < params.size(); ++i) {
    if (!weights[i].defined()) throw Error(std::string(op) + ": " + params[i].name + " is undefined");
    check_same_device({&x, &weights[i]});
    need_shape(op, params[i].name.c_str(), weights[i], params[i].shape);
  }
}

// An initial state, h0 or c0: undefined, or [L * D, N, H] on x's device.
void check_state(const char* op, const char* what, const Tensor& state, const Tensor& x, const Dims& dm) {
  if (!state.defined()) return;
  check_same_device({&x, &state});
  need_shape(op, what, state, {dm.layers * dm.d, dm.n, dm.h});
}

// The buffers of a forward. In training they are the RnnSaved; in evaluation the same structure serves as
// scratch, its per-layer and per-(layer, direction) entries sharing storage where nothing reads them later.
// An RNN keeps no gates (its backward needs only h_t, which the outputs hold): its gate buffers are left
// empty here, for gate_buffers to fill with scratch.
std::shared_ptr<RnnSaved> forward_buffers(Runtime& rt, Device dev, const RnnOptions& o, const Dims& dm,
                                          bool training, const Tensor& h0, const Tensor& c0) {
  auto s = std::make_shared<RnnSaved>();
  s->options = o;
  s->batch = dm.n;
  s->steps = dm.t;
  s->h0 = h0;
  s->c0 = c0;
  s->x_tm = Tensor(rt, {dm.t, dm.n, dm.f}, dev);
  const auto slots = static_cast<size_t>(dm.layers * dm.d);
  const bool has_gates = dm.kind == RnnKind::Gru || dm.kind == RnnKind::Lstm;
  const Shape gates{dm.t, dm.n, dm.gh()}, cells{dm.t, dm.n, dm.h}, outputs{dm.t, dm.n, dm.hd()};
  if (training) {
    for (int64_t l = 0; l < dm.layers; ++l) s->outputs.emplace_back(rt, outputs, dev);
    if (o.dropout > 0)
      for (int64_t l = 0; l + 1 < dm.layers; ++l) {
        s->masks.emplace_back(rt, outputs, dev);
        s->dropped.emplace_back(rt, outputs, dev);
      }
    if (has_gates)
      for (size_t i = 0; i < slots; ++i) {
        s->gates.emplace_back(rt, gates, dev);
        s->cells.emplace_back(rt, cells, dev);
      }
    return s;
  }
  // Layer l reads outputs[l - 1] and writes outputs[l]: two buffers alternate.
  const Tensor a(rt, outputs, dev);
  const Tensor b = dm.layers > 1 ? Tensor(rt, outputs, dev) : Tensor();
  for (int64_t l = 0; l < dm.layers; ++l) s->outputs.push_back(l % 2 == 0 ? a : b);
  if (has_gates) s->gates.assign(slots, Tensor(rt, gates, dev));
  // The LSTM's cell state is part of its recurrence; the GRU's W_hn h + b_hn only backward reads.
  if (dm.kind == RnnKind::Lstm) s->cells.assign(slots, Tensor(rt, cells, dev));
  return s;
}

// The gate buffer of each (layer, direction): the saved ones, or for an RNN one scratch buffer for all.
std::vector<Tensor> gate_buffers(Runtime& rt, Device dev, const Dims& dm, const RnnSaved& s) {
  if (!s.gates.empty()) return s.gates;
  return std::vector<Tensor>(static_cast<size_t>(dm.layers * dm.d), Tensor(rt, {dm.t, dm.n, dm.gh()}, dev));
}

// Layer l's input, time-major [T, N, in_l].
const Tensor& layer_input(const RnnSaved& s, int64_t l) {
  if (l == 0) return s.x_tm;
  return s.dropped.empty() ? s.outputs[l - 1] : s.dropped[l - 1];
}

// The rows h_prev of forward-order step s of (l, dir): the step before's output, or the initial state
// (null: zeros).
struct StepRows {
  const float* p;
  int64_t ld;
};
StepRows previous_h(const Dims& dm, const RnnSaved& s, const float* out, int64_t l, int64_t dir,
                    int64_t step) {
  if (step == 0) {
    if (!s.h0.defined()) return {nullptr, dm.h};
    return {s.h0.data() + dm.slot(l, dir) * dm.n * dm.h, dm.h};
  }
  return {out + dm.step_time(dir, step - 1) * dm.n * dm.hd() + dir * dm.h, dm.hd()};
}
const float* previous_c(const Dims& dm, const RnnSaved& s, const float* cell, int64_t l, int64_t dir,
                        int64_t step) {
  if (step == 0) return s.c0.defined() ? s.c0.data() + dm.slot(l, dir) * dm.n * dm.h : nullptr;
  return cell + dm.step_time(dir, step - 1) * dm.n * dm.h;
}

// The forward of every layer and direction. gh is scratch [N, G * H].
void run_forward(RecurrentKernels& k, KernelContext& kc, const Dims& dm, const RnnSaved& s,
                 const std::vector<Tensor>& w, const Tensor& x, const std::vector<Tensor>& gate_bufs,
                 const Tensor& gh_buf, const Tensor& y, const Tensor& h_n, const Tensor& c_n, bool dropout,
                 float p, uint64_t seed) {
  if (dm.n == 0) return;  // every output is empty
  const int64_t n = dm.n, h = dm.h, gh = dm.gh(), hd = dm.hd(), tn = dm.t * dm.n;
  float* ghp = gh_buf.data();
  k.swap_leading_axes(n, dm.t, dm.f, x.data(), s.x_tm.data(), kc);
  for (int64_t l = 0; l < dm.layers; ++l) {
    const float* in = layer_input(s, l).data();
    const int64_t in_l = dm.in(l);
    float* out = s.outputs[l].data();
    for (int64_t dir = 0; dir < dm.d; ++dir) {
      const float* w_ih = w[dm.param(l, dir, 0)].data();
      const float* w_hh = w[dm.param(l, dir, 1)].data();
      const float* b_ih = dm.bias ? w[dm.param(l, dir, 2)].data() : nullptr;
      const float* b_hh = dm.bias ? w[dm.param(l, dir, 3)].data() : nullptr;
      const int64_t slot = dm.slot(l, dir);
      float* gates = gate_bufs[slot].data();
      float* cell = s.cells.empty() ? nullptr : s.cells[slot].data();
      // Every step's input projection at once.
      k.gemm(false, true, tn, gh, in_l, 1.0f, in, in_l, w_ih, in_l, 0.0f, gates, gh, kc);
      for (int64_t step = 0; step < dm.t; ++step) {
        kc.op.check_cancelled();
        const int64_t t = dm.step_time(dir, step);
        const StepRows prev = previous_h(dm, s, out, l, dir, step);
        const float* gh_step = nullptr;  // zero state: no recurrent product
        if (prev.p) {
          k.gemm(false, true, n, gh, h, 1.0f, prev.p, prev.ld, w_hh, h, 0.0f, ghp, gh, kc);
          gh_step = ghp;
        }
        float* g_t = gates + t * n * gh;
        float* h_t = out + t * n * hd + dir * h;
        switch (dm.kind) {
          case RnnKind::RnnTanh:
          case RnnKind::RnnRelu:
            k.rnn_step_forward(dm.kind == RnnKind::RnnRelu, n, h, g_t, gh_step, b_ih, b_hh, h_t, hd, kc);
            break;
          case RnnKind::Gru:
            k.gru_step_forward(n, h, g_t, gh_step, b_ih, b_hh, prev.p, prev.ld,
                               cell ? cell + t * n * h : nullptr, h_t, hd, kc);
            break;
          case RnnKind::Lstm:
            k.lstm_step_forward(n, h, g_t, gh_step, b_ih, b_hh, previous_c(dm, s, cell, l, dir, step),
                                cell + t * n * h, h_t, hd, kc);
            break;
        }
      }
      const int64_t last = dm.step_time(dir, dm.t - 1);
      k.copy_rows(n, h, out + last * n * hd + dir * h, hd, h_n.data() + slot * n * h, h, kc);
      if (dm.kind == RnnKind::Lstm)
        k.copy_rows(n, h, cell + last * n * h, h, c_n.data() + slot * n * h, h, kc);
    }
    if (dropout && l + 1 < dm.layers)
      k.dropout_time_major(dm.t, n, hd, out, s.dropped[l].data(), s.masks[l].data(), p, seed,
                           static_cast<uint64_t>(l * tn * hd), kc);
  }
  k.swap_leading_axes(dm.t, n, hd, s.outputs.back().data(), y.data(), kc);
}

// Scratch of one backward. The GRU's and LSTM's gate gradients need none: each step's overwrite that step's
// saved activations, which nothing reads after it (and the GRU's recurrent n-block gradient its saved
// W_hn h_prev + b_hn), so a step's backward holds little beyond what its forward kept.
struct BackwardBuffers {
  Tensor d_hidden[2];  // [T, N, H * D]: the output gradient of a layer below the top (alternating)
  Tensor dx_tm;        // [T, N, input_size], when dx is wanted
  Tensor dgates;       // [T * N, H]: an RNN's pre-activation gradients (it keeps no gates)
  Tensor dh, dc;       // [N, H]: the gradient carried back through the recurrence (dc: LSTM)
};

// Where the gradient arriving at a layer's output lies: step t's rows start at base + t * step and lie ld
// apart. The top layer's is dy itself, batch-first; the layers below read the time-major buffer the layer
// above wrote.
struct OutputGrad {
  const float* base;
  int64_t step, ld;
};

void run_backward(RecurrentKernels& k, KernelContext& kc, const Dims& dm, const RnnSaved& s,
                  const std::vector<Tensor>& w, const Tensor& dy, const BackwardBuffers& b,
                  const std::vector<Tensor>& dw, const Tensor& dx) {
  if (dm.n == 0) {  // an empty batch contributes nothing
    for (const Tensor& g : dw) k.fill_zero(g.data(), g.numel(), kc);
    return;
  }
  const int64_t n = dm.n, h = dm.h, gh = dm.gh(), hd = dm.hd(), tn = dm.t * dm.n;
  const bool gru = dm.kind == RnnKind::Gru;
  OutputGrad d_out{dy.data(), hd, dm.t * hd};
  float* dh = b.dh.data();
  float* dc = dm.kind == RnnKind::Lstm ? b.dc.data() : nullptr;
  for (int64_t l = dm.layers - 1; l >= 0; --l) {
    const float* in = layer_input(s, l).data();
    const int64_t in_l = dm.in(l);
    const float* out = s.outputs[l].data();
    float* d_in = l > 0 ? b.d_hidden[l % 2].data() : (dx.defined() ? b.dx_tm.data() : nullptr);
    for (int64_t dir = 0; dir < dm.d; ++dir) {
      const float* w_ih = w[dm.param(l, dir, 0)].data();
      const float* w_hh = w[dm.param(l, dir, 1)].data();
      const int64_t slot = dm.slot(l, dir);
      // The gate gradients of every step: in place of the GRU's and LSTM's gates, an RNN's in scratch.
      float* dg = s.gates.empty() ? b.dgates.data() : s.gates[slot].data();
      float* cell = s.cells.empty() ? nullptr : s.cells[slot].data();
      // The final state gets no gradient: the recurrence starts from zeros.
      k.fill_zero(dh, n * h, kc);
      if (dc) k.fill_zero(dc, n * h, kc);
      for (int64_t step = dm.t - 1; step >= 0; --step) {
        kc.op.check_cancelled();
        const int64_t t = dm.step_time(dir, step);
        const float* dy_t = d_out.base + t * d_out.step + dir * h;
        float* dg_t = dg + t * n * gh;
        switch (dm.kind) {
          case RnnKind::RnnTanh:
          case RnnKind::RnnRelu:
            k.rnn_step_backward(dm.kind == RnnKind::RnnRelu, n, h, dy_t, d_out.ld, dh,
                                out + t * n * hd + dir * h, hd, dg_t, kc);
            break;
          case RnnKind::Gru: {
            const StepRows prev = previous_h(dm, s, out, l, dir, step);
            k.gru_step_backward(n, h, dy_t, d_out.ld, dh, dg_t, cell + t * n * h, prev.p, prev.ld, kc);
            break;
          }
          case RnnKind::Lstm:
            k.lstm_step_backward(n, h, dy_t, d_out.ld, dh, dc, dg_t, cell + t * n * h,
                                 previous_c(dm, s, cell, l, dir, step), kc);
            break;
        }
        // h_prev's gradient through W_hh; none is wanted for the initial state. The GRU's kernel left the
        // share that bypasses W_hh in dh, and its n block's recurrent gradient in the cell buffer: r and z
        // through their rows of W_hh, n through its own.
        if (step == 0) continue;
        if (gru) {
          k.gemm(false, false, n, h, 2 * h, 1.0f, dg_t, gh, w_hh, h, 1.0f, dh, h, kc);
          k.gemm(false, false, n, h, h, 1.0f, cell + t * n * h, h, w_hh + 2 * h * h, h, 1.0f, dh, h, kc);
        } else {
          k.gemm(false, false, n, h, gh, 1.0f, dg_t, gh, w_hh, h, 0.0f, dh, h, kc);
        }
      }
      // dW_hh = sum over steps of dgates_hh_t^T h_prev_t: the steps after the first pair with the outputs one
      // step earlier in the direction's order (forward: rows t = 1.. with outputs t - 1; reverse: rows
      // t = 0..T-2 with outputs t + 1), one product over all of them; the first step pairs with h0. The
      // GRU's rows of n come from the cell buffer.
      float* dw_hh = dw[dm.param(l, dir, 1)].data();
      const int64_t paired = (dm.t - 1) * n, later = dir == 0 ? n : 0;
      const float* h_before = dir == 0 ? out : out + n * hd + dir * h;
      const int64_t shared_rows = gru ? 2 * h : gh;
      k.gemm(true, false, shared_rows, h, paired, 1.0f, dg + later * gh, gh, h_before, hd, 0.0f, dw_hh, h, kc);
      if (gru)
        k.gemm(true, false, h, h, paired, 1.0f, cell + later * h, h, h_before, hd, 0.0f, dw_hh + 2 * h * h, h,
               kc);
      if (s.h0.defined()) {
        const int64_t t0 = dm.step_time(dir, 0);
        const float* h0 = s.h0.data() + slot * n * h;
        k.gemm(true, false, shared_rows, h, n, 1.0f, dg + t0 * n * gh, gh, h0, h, 1.0f, dw_hh, h, kc);
        if (gru)
          k.gemm(true, false, h, h, n, 1.0f, cell + t0 * n * h, h, h0, h, 1.0f, dw_hh + 2 * h * h, h, kc);
      }
      k.gemm(true, false, gh, in_l, tn, 1.0f, dg, gh, in, in_l, 0.0f, dw[dm.param(l, dir, 0)].data(), in_l,
             kc);
      if (dm.bias) {
        float* db_ih = dw[dm.param(l, dir, 2)].data();
        float* db_hh = dw[dm.param(l, dir, 3)].data();
        k.column_sums(tn, gh, dg, db_ih, kc);
        // Both biases add to the same pre-activations, except in the GRU's n block.
        k.copy_rows(1, shared_rows, db_ih, gh, db_hh, gh, kc);
        if (gru) k.column_sums(tn, h, cell, db_hh + 2 * h, kc);
      }
      // The input's gradient, both directions summed.
      if (d_in)
        k.gemm(false, false, tn, in_l, gh, 1.0f, dg, gh, w_ih, in_l, dir == 0 ? 0.0f : 1.0f, d_in, in_l, kc);
    }
    if (l > 0) {
      if (!s.masks.empty()) k.multiply(tn * hd, d_in, s.masks[l - 1].data(), d_in, kc);
      d_out = {d_in, n * hd, hd};  // the layer below's output gradient, time-major
    }
  }
  if (dx.defined()) k.swap_leading_axes(dm.t, n, dm.f, b.dx_tm.data(), dx.data(), kc);
}

// Marks a training forward as taken by its backward (which turns what it saved into scratch), refusing a
// second.
void take_forward(RnnSaved& s, const char* op) {
  if (s.consumed)
    throw Error(std::string(op) +
                ": this training forward was already taken by a backward (its saved "
                "activations became that backward's gradients); run the forward again");
  s.consumed = true;
}

// Pushes `body` as one op on `device`'s compute stream with its recurrent kernels.
template <class Body>
void push_recurrent(Runtime& rt, Device device, std::vector<VarPtr> reads, std::vector<VarPtr> writes,
                    OpInfo info, Precision precision, Body body) {
  RecurrentKernels* kernels = &recurrent_kernels(device);
  Allocator* alloc = &rt.allocator(device);
  rt.engine().push(
      [kernels, alloc, precision, body = std::move(body)](OpContext& ctx) {
        KernelContext kc{ctx, *alloc, precision};
        body(*kernels, kc);
      },
      std::move(reads), std::move(writes), device, StreamKind::Compute, std::move(info));
}

// 2 * T * N * G*H * (in_l + H) per layer and direction: the input and the recurrent products.
double forward_flops(const Dims& dm) {
  double f = 0;
  for (int64_t l = 0; l < dm.layers; ++l) f += 2.0 * dbl(dm.t * dm.n) * dbl(dm.gh()) * dbl(dm.in(l) + dm.h);
  return f * dbl(dm.d);
}

std::vector<VarPtr> saved_vars(const RnnSaved& s) {
  std::vector<VarPtr> v{s.x_tm.var()};
  for (const auto* list : {&s.outputs, &s.masks, &s.dropped, &s.gates, &s.cells})
    for (const Tensor& t : *list) v.push_back(t.var());
  return v;
}

}  // namespace

int rnn_gate_count(RnnKind kind) {
  switch (kind) {
    case RnnKind::RnnTanh:
    case RnnKind::RnnRelu:
      return 1;
    case RnnKind::Gru:
      return 3;
    case RnnKind::Lstm:
      return 4;
  }
  throw Error("unknown recurrent layer kind " + std::to_string(static_cast<int>(kind)));
}

const char* rnn_kind_name(RnnKind kind) {
  switch (kind) {
    case RnnKind::RnnTanh:
      return "RNN_TANH";
    case RnnKind::RnnRelu:
      return "RNN_RELU";
    case RnnKind::Gru:
      return "GRU";
    case RnnKind::Lstm:
      return "LSTM";
  }
  throw Error("unknown recurrent layer kind " + std::to_string(static_cast<int>(kind)));
}

std::vector<RnnParam> rnn_params(const RnnOptions& o) {
  check_options(o);
  const int64_t rows = rnn_gate_count(o.kind) * o.hidden_size, h = o.hidden_size;
  std::vector<RnnParam> params;
  for (int64_t l = 0; l < o.num_layers; ++l) {
    const int64_t in = l == 0 ? o.input_size : h * o.directions();
    for (int64_t dir = 0; dir < o.directions(); ++dir) {
      const std::string sfx = "_l" + std::to_string(l) + (dir == 0 ? "" : "_reverse");
      params.push_back({"weight_ih" + sfx, {rows, in}, h});
      params.push_back({"weight_hh" + sfx, {rows, h}, h});
      if (o.bias) {
        params.push_back({"bias_ih" + sfx, {rows}, h});
        params.push_back({"bias_hh" + sfx, {rows}, h});
      }
    }
  }
  return params;
}

RnnResult rnn_forward(const RnnOptions& o, const Tensor& x, const std::vector<Tensor>& weights,
                      const Tensor& h0, const Tensor& c0, bool training, uint64_t seed) {
  const char* op = "rnn_forward";
  check_options(o);
  const auto [n, t] = check_input(op, o, x);
  check_weights(op, o, x, weights);
  const Dims dm = dims_of(o, n, t);
  check_state(op, "h0", h0, x, dm);
  if (c0.defined() && o.kind != RnnKind::Lstm)
    throw Error(std::string(op) + ": c0 is given but only an LSTM has a cell state");
  check_state(op, "c0", c0, x, dm);
  const Precision precision = current_precision();
  check_precision(precision, x.device(), op);
  const std::string name = std::string("rnn ") + rnn_kind_name(o.kind) + (training ? "" : " (eval)");
  const int64_t y_bytes = n * t * dm.hd() * static_cast<int64_t>(sizeof(float));
  OpInfo info{name, "", x.bytes() + 2 * y_bytes * dm.layers, forward_flops(dm)};
  if (x.device().is_cuda()) {
    CudnnRnnOutputs c = cudnn_rnn_forward(o, x, weights, h0, c0, training, seed, precision, std::move(info));
    RnnResult r{c.y, c.h_n, c.c_n, nullptr};
    if (training) {
      r.saved = std::make_shared<RnnSaved>();
      r.saved->options = o;
      r.saved->batch = n;
      r.saved->steps = t;
      r.saved->cudnn = std::move(c.saved);
    }
    return r;
  }

  Runtime& rt = x.runtime();
  const Device dev = x.device();
  RnnResult r;
  r.y = Tensor(rt, {n, t, dm.hd()}, dev);
  r.h_n = Tensor(rt, {dm.layers * dm.d, n, dm.h}, dev);
  if (o.kind == RnnKind::Lstm) r.c_n = Tensor(rt, {dm.layers * dm.d, n, dm.h}, dev);
  std::shared_ptr<RnnSaved> saved = forward_buffers(rt, dev, o, dm, training, h0, c0);
  const std::vector<Tensor> gates = gate_buffers(rt, dev, dm, *saved);
  const Tensor gh(rt, {n, dm.gh()}, dev);

  std::vector<VarPtr> reads{x.var()};
  for (const Tensor& w : weights) reads.push_back(w.var());
  if (h0.defined()) reads.push_back(h0.var());
  if (c0.defined()) reads.push_back(c0.var());
  std::vector<VarPtr> writes{r.y.var(), r.h_n.var()};
  if (r.c_n.defined()) writes.push_back(r.c_n.var());
  if (training) {
    const std::vector<VarPtr> kept = saved_vars(*saved);
    writes.insert(writes.end(), kept.begin(), kept.end());
    r.saved = saved;
  }
  const bool dropout = training && o.dropout > 0;
  const Tensor y = r.y, h_n = r.h_n, c_n = r.c_n;
  const float p = o.dropout;
  push_recurrent(rt, dev, std::move(reads), std::move(writes), std::move(info), precision,
                 [=](RecurrentKernels& k, KernelContext& kc) {
                   run_forward(k, kc, dm, *saved, weights, x, gates, gh, y, h_n, c_n, dropout, p, seed);
                 });
  return r;
}

RnnGrads rnn_backward(const RnnOptions& o, const RnnResult& forward, const Tensor& x,
                      const std::vector<Tensor>& weights, const Tensor& dy, bool need_dx) {
  const char* op = "rnn_backward";
  check_options(o);
  if (!forward.saved)
    throw Error(std::string(op) + ": the forward kept nothing for backward (it was not a training forward)");
  RnnSaved& s = *forward.saved;
  const RnnOptions& so = s.options;
  if (so.kind != o.kind || so.input_size != o.input_size || so.hidden_size != o.hidden_size ||
      so.num_layers != o.num_layers || so.bidirectional != o.bidirectional || so.bias != o.bias ||
      so.dropout != o.dropout)
    throw Error(std::string(op) + ": the options differ from the forward's");
  const auto [n, t] = check_input(op, o, x);
  check_weights(op, o, x, weights);
  if (s.batch != n || s.steps != t)
    throw ShapeError(std::string(op) + ": input " + shape_str(x.shape()) + " is not the forward's [" +
                     std::to_string(s.batch) + ", " + std::to_string(s.steps) + ", " +
                     std::to_string(o.input_size) + "]");
  const Dims dm = dims_of(o, n, t);
  if (!dy.defined()) throw Error(std::string(op) + ": the output gradient is undefined");
  check_same_device({&x, &dy, s.cudnn ? &cudnn_forward_input(*s.cudnn) : &s.x_tm});
  need_shape(op, "output gradient", dy, {n, t, dm.hd()});
  const Precision precision = current_precision();
  check_precision(precision, x.device(), op);
  // The recurrent product, dW_hh and dW_ih each cost about what forward's products did, dx once more.
  OpInfo info{std::string("rnn ") + rnn_kind_name(o.kind) + " backward", "", 2 * dy.bytes() * dm.layers,
              2.0 * forward_flops(dm)};
  if (s.cudnn) {
    take_forward(s, op);
    return cudnn_rnn_backward(o, s.cudnn, dy, need_dx, precision, std::move(info));
  }

  Runtime& rt = x.runtime();
  const Device dev = x.device();
  RnnGrads g;
  for (const RnnParam& p : rnn_params(o)) g.dweights.emplace_back(rt, p.shape, dev);
  if (need_dx) g.dx = Tensor(rt, x.shape(), dev);
  BackwardBuffers b;
  // Layer l > 0 writes its input's gradient into d_hidden[l % 2], which layer l - 1 reads.
  for (int64_t l = 1; l < std::min<int64_t>(dm.layers, 3); ++l) b.d_hidden[l % 2] = Tensor(rt, {t, n, dm.hd()}, dev);
  if (need_dx) b.dx_tm = Tensor(rt, {t, n, dm.f}, dev);
  if (s.gates.empty()) b.dgates = Tensor(rt, {t * n, dm.gh()}, dev);
  b.dh = Tensor(rt, {n, dm.h}, dev);
  if (o.kind == RnnKind::Lstm) b.dc = Tensor(rt, {n, dm.h}, dev);

  // The gates (and the GRU's cell buffers) become gradients: written, and this forward is used up.
  take_forward(s, op);
  std::vector<VarPtr> reads, writes;
  for (const VarPtr& v : saved_vars(s)) {
    const bool overwritten =
        std::any_of(s.gates.begin(), s.gates.end(), [&](const Tensor& g) { return g.var() == v; }) ||
        (o.kind == RnnKind::Gru &&
         std::any_of(s.cells.begin(), s.cells.end(), [&](const Tensor& c) { return c.var() == v; }));
    (overwritten ? writes : reads).push_back(v);
  }
  reads.push_back(dy.var());
  for (const Tensor& w : weights) reads.push_back(w.var());
  if (s.h0.defined()) reads.push_back(s.h0.var());
  if (s.c0.defined()) reads.push_back(s.c0.var());
  for (const Tensor& d : g.dweights) writes.push_back(d.var());
  if (need_dx) writes.push_back(g.dx.var());
  const std::shared_ptr<RnnSaved> saved = forward.saved;
  const std::vector<Tensor> dw = g.dweights;
  const Tensor dx = g.dx;
  push_recurrent(rt, dev, std::move(reads), std::move(writes), std::move(info), precision,
                 [=](RecurrentKernels& k, KernelContext& kc) {
                   run_backward(k, kc, dm, *saved, weights, dy, b, dw, dx);
                 });
  return g;
}

}  // namespace gn::nn
