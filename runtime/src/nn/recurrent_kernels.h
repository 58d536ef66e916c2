// What the CPU implements for the recurrent layers (recurrent.h): a strided matrix product and the small
// passes around it. The recurrence itself (the loop over layers, directions and steps, which product goes
// where) is written in recurrent.cpp against this interface; every member runs inside that op's body on the
// device's worker. A CUDA device runs cuDNN's RNN API instead (cudnn_recurrent.h).
//
// Shapes are in rows: a "[rows, cols]" operand is `rows` rows of `cols` floats; a pointer with an `ld` has
// its rows `ld` floats apart (a slice of a wider buffer), one without is packed. n is the batch, h the hidden
// size; a gate buffer [n, G*h] holds the gate blocks of one step in PyTorch's row order (GRU r z n, LSTM
// i f g o). A bias pointer is null for a network without biases.
#pragma once
#include <cstdint>

#include "kernels.h"

namespace gn::nn {

class RecurrentKernels {
 public:
  virtual ~RecurrentKernels() = default;

  // Row-major C[m, n] = alpha * op(A) op(B) + beta * C, op(X) = X^T when trans_x; A is [m, k] (or [k, m]
  // when trans_a) with rows lda apart, B [k, n] (or [n, k]) ldb, C ldc. beta 0 overwrites C (whatever it
  // held). k may be 0 (C = beta * C). Products in kc.precision.
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc,
                    KernelContext& kc) = 0;

  // dst [b, a, row] = src [a, b, row] with the two leading axes swapped (batch-first <-> time-major).
  virtual void swap_leading_axes(int64_t a, int64_t b, int64_t row, const float* src, float* dst,
                                 KernelContext& kc) = 0;
  // dst [rows, cols] (ld_dst) = src [rows, cols] (ld_src).
  virtual void copy_rows(int64_t rows, int64_t cols, const float* src, int64_t ld_src, float* dst,
                         int64_t ld_dst, KernelContext& kc) = 0;
  // dst[0, count) = 0.
  virtual void fill_zero(float* dst, int64_t count, KernelContext& kc) = 0;
  // out[j] = sum over i of x[i * cols + j], accumulated in double: a bias gradient from a packed gate buffer.
  virtual void column_sums(int64_t rows, int64_t cols, const float* x, float* out, KernelContext& kc) = 0;
  // out[i] = a[i] * b[i] for i < count; out may be a.
  virtual void multiply(int64_t count, const float* a, const float* b, float* out, KernelContext& kc) = 0;
  // Dropout of a time-major [steps, n, width] buffer: element (t, i, j) is kept when
  // philox::uniform_at(seed, first_index + (i * steps + t) * width + j, 0, 1) <= 1 - p (its batch-first
  // position, so the mask does not depend on the layout): mask = 1 / (1 - p) or 0, y = x * mask.
  virtual void dropout_time_major(int64_t steps, int64_t n, int64_t width, const float* x, float* y,
                                  float* mask, float p, uint64_t seed, uint64_t first_index,
                                  KernelContext& kc) = 0;

  // --- one step of one direction -------------------------------------------------------------------------
  // Forward: `gates` [n, G*h] holds x_t W_ih^T on entry (without bias) and the gate activations on return,
  // which backward reads. gh [n, G*h] is h_prev W_hh^T (without bias), null where h_prev is zero (the first
  // step from a zero state); h_prev [n, h] (ld_prev) is null there too. h_out [n, h] (ld_out) gets h_t.
  //
  // Backward: dy [n, h] (ld_dy) is the gradient arriving at h_t from the layer's output, dh [n, h] the one
  // arriving from step t + 1 through the recurrence (zeros at the last step); the gradient of the gates'
  // pre-activations, which is both W_ih's and W_hh's (GRU: see gru_step_backward), goes to dgates [n, G*h]
  // for an RNN, and in place of the gate activations for the GRU and LSTM (nothing reads a step's gates after
  // its backward, and a training step's peak memory stays near what its forward kept).

  // h_t = act(gates + b_ih + gh + b_hh), act = relu ? ReLU : tanh. gates is left as it was: an RNN's
  // backward reads h_t from the output instead.
  virtual void rnn_step_forward(bool relu, int64_t n, int64_t h, float* gates, const float* gh,
                                const float* b_ih, const float* b_hh, float* h_out, int64_t ld_out,
                                KernelContext& kc) = 0;
  // dgates = (dy + dh) * act'(h_t), act' from the output h_t [n, h] (ld_h). dh is only read.
  virtual void rnn_step_backward(bool relu, int64_t n, int64_t h, const float* dy, int64_t ld_dy,
                                 const float* dh, const float* h_t, int64_t ld_h, float* dgates,
                                 KernelContext& kc) = 0;

  // gates -> r, z, n; hn [n, h] gets W_hn h_prev + b_hn (n's recurrent part, which backward needs; null:
  // not kept).
  virtual void gru_step_forward(int64_t n, int64_t h, float* gates, const float* gh, const float* b_ih,
                                const float* b_hh, const float* h_prev, int64_t ld_prev, float* hn,
                                float* h_out, int64_t ld_out, KernelContext& kc) = 0;
  // In place: `gates` [n, 3h] holds the step's activations r, z, n on entry and the gradient of their
  // pre-activations on return, the input side (d(W_i x + b_i); n's block is dn_pre). `hn` [n, h] holds
  // W_hn h_prev + b_hn on entry and n's recurrent gradient on return (d(W_hn h_prev + b_hn) = dn_pre * r);
  // the recurrent side's r and z blocks equal the input side's. dh is read and then overwritten with
  // z * (dy + dh), the share of h_prev's gradient that bypasses W_hh (the caller adds the rest through W_hh).
  virtual void gru_step_backward(int64_t n, int64_t h, const float* dy, int64_t ld_dy, float* dh, float* gates,
                                 float* hn, const float* h_prev, int64_t ld_prev, KernelContext& kc) = 0;

  // gates -> i, f, g, o; c_t = f * c_prev + i * g into c_out [n, h], h_t = o * tanh(c_t). c_prev [n, h] null:
  // zeros.
  virtual void lstm_step_forward(int64_t n, int64_t h, float* gates, const float* gh, const float* b_ih,
                                 const float* b_hh, const float* c_prev, float* c_out, float* h_out,
                                 int64_t ld_out, KernelContext& kc) = 0;
  // In place: `gates` [n, 4h] holds the step's activations i, f, g, o on entry and the gradient of their
  // pre-activations on return. c_t [n, h] as forward wrote it, c_prev as forward read it (null: zeros). dc
  // [n, h] is read as the gradient arriving at c_t from step t + 1 and overwritten with the one leaving for
  // c_prev. dh is only read.
  virtual void lstm_step_backward(int64_t n, int64_t h, const float* dy, int64_t ld_dy, const float* dh,
                                  float* dc, float* gates, const float* c_t, const float* c_prev,
                                  KernelContext& kc) = 0;
};

RecurrentKernels& cpu_recurrent_kernels();

}  // namespace gn::nn
