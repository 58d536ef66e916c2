// The attention ops (attention_layers.h) against naive float64 loops (attention_test_util.h): bmm in every
// transpose with alpha and its gradients, the masked softmax (causal, valid lengths per sample with several
// heads) and its backward, layer norm with and without affine, the head split and merge against torch's
// x.view(N, T, h, d).transpose(1, 2), the broadcasts over the batch, the class token and the slices of a fused
// weight; their errors. test_attention_layers checks the layers built from them.
// GN_TEST_DEVICE=cuda:0 runs the device checks on CUDA instead (skipped without a GPU).
#include "attention_test_util.h"

using namespace gn::attention_test;

class AttentionKernelsTest : public AttentionSuite {
  Q_OBJECT

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>(RuntimeOptions{});
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("attention ops on %s", device_.str().c_str());
  }
  void cleanupTestCase() { rt_.reset(); }

  // --- ops ------------------------------------------------------------------------------------------------

  void bmm_in_every_transpose_with_alpha_and_its_gradients() {
    const int64_t batch = 3, m = 4, n = 5, k = 6;
    const float alpha = 0.7f;
    for (bool ta : {false, true})
      for (bool tb : {false, true}) {
        const BmmRef ref{batch, m, n, k, ta, tb, alpha};
        const Shape as = ta ? Shape{batch, k, m} : Shape{batch, m, k};
        const Shape bs = tb ? Shape{batch, n, k} : Shape{batch, k, n};
        const std::vector<float> a = values(batch * m * k, 1 + ta), b = values(batch * k * n, 3 + tb);
        const std::vector<float> dc = values(batch * m * n, 7, 0.5f);
        const Tensor at = dev(as, a), bt = dev(bs, b);
        const BmmOptions o{ta, tb, alpha};
        const QByteArray what = QByteArray("bmm trans_a=") + (ta ? "1" : "0") + " trans_b=" + (tb ? "1" : "0");
        const Tensor c = bmm(at, bt, o);
        QCOMPARE(c.shape(), (Shape{batch, m, n}));
        QVERIFY2(near(to_host(c), ref.c(a, b), 1e-5, what), what.constData());
        const BmmGrads g = bmm_backward(at, bt, dev({batch, m, n}, dc), o, true, true);
        QCOMPARE(g.da.shape(), as);
        QCOMPARE(g.db.shape(), bs);
        QVERIFY2(near(to_host(g.da), ref.da(b, dc), 1e-5, what + " da"), what.constData());
        QVERIFY2(near(to_host(g.db), ref.db(a, dc), 1e-5, what + " db"), what.constData());
        // Only what is asked for.
        const BmmGrads only_a = bmm_backward(at, bt, dev({batch, m, n}, dc), o, true, false);
        QVERIFY(only_a.da.defined() && !only_a.db.defined());
        const BmmGrads only_b = bmm_backward(at, bt, dev({batch, m, n}, dc), o, false, true);
        QVERIFY(!only_b.da.defined() && only_b.db.defined());
        QVERIFY2(near(to_host(only_b.db), ref.db(a, dc), 1e-5, what + " db alone"), what.constData());
      }
    // A batch large enough for the CPU's batch-parallel path.
    const int64_t big = 40;
    const BmmRef ref{big, 3, 2, 5, false, true, 0.5};
    const std::vector<float> a = values(big * 15, 11), b = values(big * 10, 12);
    QVERIFY(near(to_host(bmm(dev({big, 3, 5}, a), dev({big, 2, 5}, b), {false, true, 0.5f})), ref.c(a, b), 1e-5,
                 "bmm batch 40"));
  }

  void bmm_mismatches_name_both_sides() {
    expect_error([&] { bmm(zeros(*rt_, {2, 3, 4}, device_), zeros(*rt_, {2, 5, 6}, device_)); },
                 {"[2, 3, 4]", "[2, 5, 6]", "columns 4", "rows 5"});
    expect_error([&] { bmm(zeros(*rt_, {2, 3, 4}, device_), zeros(*rt_, {3, 4, 6}, device_)); },
                 {"[2, 3, 4]", "[3, 4, 6]", "batches differ"});
    expect_error([&] { bmm(zeros(*rt_, {2, 3, 4}, device_), zeros(*rt_, {2, 6, 5}, device_), {false, true, 1}); },
                 {"[2, 3, 4]", "[2, 6, 5] (transposed)", "columns 4", "rows 5"});
    expect_error([&] { bmm(zeros(*rt_, {2, 4, 3}, device_), zeros(*rt_, {2, 4, 6}, device_), {true, true, 1}); },
                 {"[2, 4, 3] (transposed)", "[2, 4, 6] (transposed)"});
    expect_error([&] { bmm(zeros(*rt_, {3, 4}, device_), zeros(*rt_, {2, 4, 6}, device_)); },
                 {"[batch, rows, columns]", "[3, 4]"});
  }

  void masked_softmax_causal_square_and_with_more_keys() {
    const int64_t shapes[][2] = {{5, 5}, {3, 6}, {1, 4}};
    for (const auto& shape : shapes) {
      const int64_t rows = shape[0], cols = shape[1], batch = 4;
      const std::vector<float> x = values(batch * rows * cols, rows * 10 + cols, 3.0f);
      const Doubles want = ref_masked_softmax(x, batch, 2, rows, cols, true, nullptr);
      const std::vector<float> got = to_host(masked_softmax(dev({batch, rows, cols}, x), {true, Tensor(), 2}));
      const QByteArray what = "causal " + QByteArray::number(rows) + "x" + QByteArray::number(cols);
      QVERIFY2(near(got, want, 2e-6, what), what.constData());
      // The future is exactly zero: key j > i + (cols - rows), keys aligned to the end.
      for (int64_t b = 0; b < batch; ++b)
        for (int64_t i = 0; i < rows; ++i)
          for (int64_t j = i + cols - rows + 1; j < cols; ++j)
            QCOMPARE(got[static_cast<size_t>((b * rows + i) * cols + j)], 0.0f);
    }
    // Without a mask: a plain softmax of every row, also of large scores.
    std::vector<float> x = values(2 * 3 * 7, 5, 40.0f);
    QVERIFY(near(to_host(masked_softmax(dev({2, 3, 7}, x))), ref_masked_softmax(x, 2, 1, 3, 7, false, nullptr), 1e-6,
                 "softmax"));
  }

  void masked_softmax_with_valid_lengths_per_sample_and_heads() {
    // Four samples of three heads: length 2 keeps columns 0 and 1, 0 none (an all-zero row), 2.5 columns 0..2
    // (j < 2.5), 9 (past the end) all; then negative and fractional below one.
    const int64_t heads = 3, rows = 3, cols = 5;
    for (const std::vector<float>& lens : {std::vector<float>{2, 0, 2.5f, 9}, std::vector<float>{-1, 0.25f, 5, 4.999f}}) {
      const int64_t samples = static_cast<int64_t>(lens.size()), batch = samples * heads;
      const std::vector<float> x = values(batch * rows * cols, 21, 2.0f);
      for (bool causal : {false, true}) {
        const std::vector<float> got =
            to_host(masked_softmax(dev({batch, rows, cols}, x), {causal, dev({samples}, lens), heads}));
        const Doubles want = ref_masked_softmax(x, batch, heads, rows, cols, causal, &lens);
        QVERIFY2(near(got, want, 2e-6, causal ? "valid lengths, causal" : "valid lengths"), "valid lengths");
        for (size_t i = 0; i < got.size(); ++i)
          if (want[i] == 0) QCOMPARE(got[i], 0.0f);
      }
    }
    // Length 0: every head of that sample is all zeros.
    const std::vector<float> got = to_host(
        masked_softmax(dev({2 * heads, rows, cols}, values(2 * heads * rows * cols, 4)), {false, dev({2}, {3, 0}), heads}));
    for (size_t i = heads * rows * cols; i < got.size(); ++i) QCOMPARE(got[i], 0.0f);
  }

  void softmax_backward_is_y_times_dy_minus_its_dot() {
    const int64_t batch = 4, rows = 3, cols = 6;
    const std::vector<float> x = values(batch * rows * cols, 31, 2.0f), dy = values(batch * rows * cols, 32);
    const std::vector<float> lens{3, 1.5f};
    for (bool masked : {false, true}) {
      const Tensor y = masked_softmax(dev({batch, rows, cols}, x),
                                      masked ? AttentionMask{true, dev({2}, lens), 2} : AttentionMask{});
      const std::vector<float> yv = to_host(y);
      Doubles want(yv.size());
      for (int64_t r = 0; r < batch * rows; ++r) {
        double dot = 0;
        for (int64_t j = 0; j < cols; ++j) dot += double(dy[r * cols + j]) * yv[r * cols + j];
        for (int64_t j = 0; j < cols; ++j) want[r * cols + j] = yv[r * cols + j] * (dy[r * cols + j] - dot);
      }
      const std::vector<float> got = to_host(softmax_backward(y, dev({batch, rows, cols}, dy)));
      QVERIFY(near(got, want, 1e-6, "softmax backward"));
      for (size_t i = 0; i < got.size(); ++i)
        if (yv[i] == 0) QCOMPARE(got[i], 0.0f);  // masked entries get no gradient
    }
    // And against a central difference of sum(w * softmax(x)), unmasked, in float64 on the reference.
    const std::vector<float> w = values(cols, 33);
    const std::vector<float> one = values(cols, 34);
    const Tensor y1 = masked_softmax(dev({1, 1, cols}, one));
    const std::vector<float> dx = to_host(softmax_backward(y1, dev({1, 1, cols}, w)));
    for (int64_t j = 0; j < cols; ++j) {
      std::vector<float> up = one, down = one;
      up[j] += 1e-2f, down[j] -= 1e-2f;
      const Doubles yu = ref_masked_softmax(up, 1, 1, 1, cols, false, nullptr);
      const Doubles yd = ref_masked_softmax(down, 1, 1, 1, cols, false, nullptr);
      double fu = 0, fd = 0;
      for (int64_t i = 0; i < cols; ++i) fu += w[i] * yu[i], fd += w[i] * yd[i];
      const double numeric = (fu - fd) / (double(up[j]) - double(down[j]));
      QVERIFY2(std::fabs(numeric - dx[j]) < 1e-4, qPrintable(QString("dx[%1] %2 vs %3").arg(j).arg(dx[j]).arg(numeric)));
    }
  }

  void masked_softmax_errors_name_both_sides() {
    expect_error([&] { masked_softmax(zeros(*rt_, {2, 4, 3}, device_), {true, Tensor(), 1}); },
                 {"causal", "4 queries", "3 keys"});
    expect_error([&] { masked_softmax(zeros(*rt_, {4, 2, 3}, device_), {false, zeros(*rt_, {4}, device_), 2}); },
                 {"valid lengths", "[2]", "[4]"});
    expect_error([&] { masked_softmax(zeros(*rt_, {4, 2, 3}, device_), {false, zeros(*rt_, {2, 1}, device_), 2}); },
                 {"valid lengths", "[2]", "[2, 1]"});
    expect_error([&] { masked_softmax(zeros(*rt_, {3, 2, 3}, device_), {false, Tensor(), 2}); },
                 {"3 score matrices", "2 heads"});
    expect_error([&] { softmax_backward(zeros(*rt_, {3, 2, 3}, device_), zeros(*rt_, {3, 3, 2}, device_)); },
                 {"[3, 2, 3]", "[3, 3, 2]"});
  }

  void layer_norm_forward_and_backward_with_and_without_affine() {
    const int64_t n = 2, t = 3, e = 7, rows = n * t;
    std::vector<float> x = values(rows * e, 41, 2.0f);
    for (size_t i = 0; i < x.size(); ++i) x[i] += 3.0f + float(i % e == 0) * 4.0f;  // an offset mean
    const std::vector<float> dy = values(rows * e, 42), gamma = values(e, 43, 1.5f), beta = values(e, 44);
    const float eps = 1e-3f;
    for (bool affine : {true, false}) {
      const LayerNormRef ref = ref_layer_norm(x, dy, affine ? &gamma : nullptr, affine ? &beta : nullptr, rows, e, eps);
      const Tensor xt = dev({n, t, e}, x);
      const Tensor gt = affine ? dev({e}, gamma) : Tensor(), bt = affine ? dev({e}, beta) : Tensor();
      const LayerNormResult r = layer_norm(xt, gt, bt, eps);
      QCOMPARE(r.y.shape(), (Shape{n, t, e}));
      QCOMPARE(r.mean.shape(), (Shape{rows}));
      QVERIFY(near(to_host(r.y), ref.y, 1e-5, "layer norm y"));
      QVERIFY(near(to_host(r.mean), ref.mean, 1e-6, "layer norm mean"));
      QVERIFY(near(to_host(r.rstd), ref.rstd, 1e-5, "layer norm rstd"));
      const LayerNormGrads g = layer_norm_backward(xt, dev({n, t, e}, dy), gt, r, true);
      QVERIFY(near(to_host(g.dx), ref.dx, 1e-4, "layer norm dx"));
      QCOMPARE(g.dgamma.defined(), affine);
      QCOMPARE(g.dbeta.defined(), affine);
      if (affine) {
        QVERIFY(near(to_host(g.dgamma), ref.dgamma, 1e-5, "layer norm dgamma"));
        QVERIFY(near(to_host(g.dbeta), ref.dbeta, 1e-6, "layer norm dbeta"));
      }
      const LayerNormGrads no_dx = layer_norm_backward(xt, dev({n, t, e}, dy), gt, r, false);
      QVERIFY(!no_dx.dx.defined());
      if (affine) QVERIFY(near(to_host(no_dx.dgamma), ref.dgamma, 1e-5, "layer norm dgamma without dx"));
    }
    // Many rows: the CPU's parallel path.
    const std::vector<float> wide = values(512 * 96, 45);
    const std::vector<float> g96 = values(96, 46), b96 = values(96, 47);
    const LayerNormRef ref96 = ref_layer_norm(wide, wide, &g96, &b96, 512, 96, 1e-5);
    const LayerNormResult r = layer_norm(dev({512, 96}, wide), dev({96}, g96), dev({96}, b96), 1e-5f);
    QVERIFY(near(to_host(r.y), ref96.y, 1e-5, "layer norm 512x96"));
    const LayerNormGrads g = layer_norm_backward(dev({512, 96}, wide), dev({512, 96}, wide), dev({96}, g96), r, true);
    QVERIFY(near(to_host(g.dx), ref96.dx, 1e-4, "layer norm 512x96 dx"));
    QVERIFY(near(to_host(g.dgamma), ref96.dgamma, 1e-5, "layer norm 512x96 dgamma"));

    expect_error([&] { layer_norm(zeros(*rt_, {2, 3}, device_), zeros(*rt_, {3}, device_), Tensor(), 1e-5f); },
                 {"weight and bias"});
    expect_error([&] { layer_norm(zeros(*rt_, {2, 3}, device_), zeros(*rt_, {4}, device_), zeros(*rt_, {4}, device_), 1e-5f); },
                 {"weight", "[3]", "[4]"});
    expect_error([&] { layer_norm(zeros(*rt_, {2, 3}, device_), Tensor(), Tensor(), 0.0f); }, {"eps"});
  }

  void heads_split_and_merge_as_torch_views_them() {
    const int64_t n = 2, t = 3, groups = 3, heads = 2, d = 4, e = heads * d;
    const std::vector<float> x = values(n * t * groups * e, 51);
    const std::vector<Tensor> parts = split_heads(dev({n, t, groups * e}, x), groups, heads);
    QCOMPARE(parts.size(), size_t(groups));
    for (int64_t g = 0; g < groups; ++g) {
      QCOMPARE(parts[g].shape(), (Shape{n * heads, t, d}));
      // torch: q, k, v = x.chunk(3, -1); part.view(N, T, h, d).transpose(1, 2).reshape(N * h, T, d).
      Doubles want(static_cast<size_t>(n * heads * t * d));
      for (int64_t s = 0; s < n; ++s)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t step = 0; step < t; ++step)
            for (int64_t c = 0; c < d; ++c)
              want[static_cast<size_t>(((s * heads + h) * t + step) * d + c)] =
                  x[static_cast<size_t>((s * t + step) * groups * e + g * e + h * d + c)];
      QCOMPARE(to_host(parts[g]), std::vector<float>(want.begin(), want.end()));
    }
    // The round trip gives x back exactly; one part merges to [N, T, h * d].
    QCOMPARE(to_host(merge_heads(parts, heads)), x);
    const Tensor one = merge_heads({parts[1]}, heads);
    QCOMPARE(one.shape(), (Shape{n, t, e}));
    const std::vector<float> got = to_host(one);
    for (int64_t r = 0; r < n * t; ++r)
      for (int64_t c = 0; c < e; ++c)
        QCOMPARE(got[static_cast<size_t>(r * e + c)], x[static_cast<size_t>(r * groups * e + e + c)]);
    expect_error([&] { split_heads(zeros(*rt_, {2, 3, 10}, device_), 3, 2); }, {"width 10", "3 parts", "2 equal heads"});
    expect_error([&] { merge_heads({zeros(*rt_, {3, 2, 2}, device_)}, 2); }, {"3 matrices", "2 heads"});
    expect_error([&] { merge_heads({zeros(*rt_, {4, 2, 2}, device_), zeros(*rt_, {4, 3, 2}, device_)}, 2); },
                 {"[4, 2, 2]", "[4, 3, 2]"});
  }

  void broadcasts_over_the_batch_and_their_gradients() {
    // add_per_sample with a table longer than a sample: its first values.
    const int64_t n = 3, t = 4, e = 5, tmax = 7;
    const std::vector<float> x = values(n * t * e, 61), table = values(tmax * e, 62);
    Doubles want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = double(x[i]) + table[i % (t * e)];
    QVERIFY(near(to_host(add_per_sample(dev({n, t, e}, x), dev({tmax, e}, table))), want, 1e-6, "add_per_sample"));
    expect_error([&] { add_per_sample(zeros(*rt_, {n, t, e}, device_), zeros(*rt_, {3, e}, device_)); },
                 {"[3, 5]", "20 values", "[3, 4, 5]"});

    // sum_over_batch writes the batch sum into the first values and zeros after them, even into memory that
    // held something (a block of the same size just freed).
    const Shape big{4096, e};
    {
      const Tensor dirty = full(*rt_, big, device_, 7.0f);
      to_host(dirty);
    }
    const std::vector<float> dy = values(n * t * e, 63);
    const std::vector<float> sums = to_host(sum_over_batch(dev({n, t, e}, dy), big));
    QCOMPARE(sums.size(), size_t(4096 * e));
    for (size_t i = 0; i < sums.size(); ++i) {
      double s = 0;
      if (i < size_t(t * e))
        for (int64_t b = 0; b < n; ++b) s += dy[b * t * e + i];
      if (!(std::fabs(sums[i] - s) <= 1e-6)) QFAIL(qPrintable(QString("sum_over_batch[%1]: %2, want %3").arg(i).arg(sums[i]).arg(s)));
    }
    expect_error([&] { sum_over_batch(zeros(*rt_, {n, t, e}, device_), {3, e}); }, {"[3, 4, 5]", "[3, 5]"});

    // prepend_token and its backward.
    const std::vector<float> token = values(e, 64);
    const Tensor y = prepend_token(dev({n, t, e}, x), dev({1, e}, token));
    QCOMPARE(y.shape(), (Shape{n, t + 1, e}));
    Doubles pre;
    for (int64_t s = 0; s < n; ++s) {
      pre.insert(pre.end(), token.begin(), token.end());
      pre.insert(pre.end(), x.begin() + s * t * e, x.begin() + (s + 1) * t * e);
    }
    QCOMPARE(to_host(y), std::vector<float>(pre.begin(), pre.end()));
    const std::vector<float> dyp = values(n * (t + 1) * e, 65);
    const PrependGrads g = prepend_token_backward(dev({n, t + 1, e}, dyp), {1, e}, true);
    QCOMPARE(g.dtoken.shape(), (Shape{1, e}));
    QCOMPARE(g.dx.shape(), (Shape{n, t, e}));
    Doubles dtoken(static_cast<size_t>(e), 0.0), dx;
    for (int64_t s = 0; s < n; ++s) {
      for (int64_t j = 0; j < e; ++j) dtoken[j] += dyp[s * (t + 1) * e + j];
      dx.insert(dx.end(), dyp.begin() + s * (t + 1) * e + e, dyp.begin() + (s + 1) * (t + 1) * e);
    }
    QVERIFY(near(to_host(g.dtoken), dtoken, 1e-6, "prepend dtoken"));
    QCOMPARE(to_host(g.dx), std::vector<float>(dx.begin(), dx.end()));
    const PrependGrads token_only = prepend_token_backward(dev({n, t + 1, e}, dyp), {e}, false);
    QVERIFY(!token_only.dx.defined());
    QCOMPARE(token_only.dtoken.shape(), (Shape{e}));
    QVERIFY(near(to_host(token_only.dtoken), dtoken, 1e-6, "prepend dtoken alone"));
    expect_error([&] { prepend_token(zeros(*rt_, {n, t, e}, device_), zeros(*rt_, {1, e + 1}, device_)); },
                 {"[1, 6]", "[3, 4, 5]"});
  }

  void linear_part_uses_and_writes_only_its_rows() {
    const int64_t n = 2, t = 3, in = 5, out = 4, parts = 3;
    const std::vector<float> x = values(n * t * in, 71), w = values(parts * out * in, 72), b = values(parts * out, 73);
    const std::vector<float> dy = values(n * t * out, 74);
    for (bool bias : {true, false})
      for (int64_t part = 0; part < parts; ++part) {
        const Tensor xt = dev({n, t, in}, x), wt = dev({parts * out, in}, w);
        const Tensor y = linear_part(xt, wt, bias ? dev({parts * out}, b) : Tensor(), part, parts);
        QCOMPARE(y.shape(), (Shape{n, t, out}));
        Doubles want(static_cast<size_t>(n * t * out));
        for (int64_t r = 0; r < n * t; ++r)
          for (int64_t o = 0; o < out; ++o) {
            double s = bias ? b[part * out + o] : 0;
            for (int64_t i = 0; i < in; ++i) s += double(x[r * in + i]) * w[(part * out + o) * in + i];
            want[r * out + o] = s;
          }
        QVERIFY(near(to_host(y), want, 1e-5, "linear_part"));

        // Backward into gradients that hold 9 everywhere: only the part's rows change.
        const Tensor dw = full(*rt_, {parts * out, in}, device_, 9.0f), db = full(*rt_, {parts * out}, device_, 9.0f);
        const Tensor dx = linear_part_backward(xt, wt, dev({n, t, out}, dy), part, parts, dw, bias ? db : Tensor(), true);
        Doubles want_dw(w.size(), 9.0), want_db(b.size(), 9.0), want_dx(x.size(), 0.0);
        for (int64_t o = 0; o < out; ++o) {
          double sb = 0;
          for (int64_t r = 0; r < n * t; ++r) sb += dy[r * out + o];
          if (bias) want_db[part * out + o] = sb;
          for (int64_t i = 0; i < in; ++i) {
            double s = 0;
            for (int64_t r = 0; r < n * t; ++r) s += double(dy[r * out + o]) * x[r * in + i];
            want_dw[(part * out + o) * in + i] = s;
          }
        }
        for (int64_t r = 0; r < n * t; ++r)
          for (int64_t i = 0; i < in; ++i)
            for (int64_t o = 0; o < out; ++o) want_dx[r * in + i] += double(dy[r * out + o]) * w[(part * out + o) * in + i];
        QCOMPARE(dx.shape(), (Shape{n, t, in}));
        QVERIFY(near(to_host(dx), want_dx, 1e-5, "linear_part dx"));
        QVERIFY(near(to_host(dw), want_dw, 1e-5, "linear_part dw"));
        QVERIFY(near(to_host(db), want_db, 1e-5, "linear_part db"));
        QVERIFY(!linear_part_backward(xt, wt, dev({n, t, out}, dy), part, parts, dw, Tensor(), false).defined());
      }
    expect_error([&] { linear_part(zeros(*rt_, {2, 5}, device_), zeros(*rt_, {12, 5}, device_), Tensor(), 3, 3); },
                 {"[12, 5]", "3 stacked", "part 3"});
    expect_error([&] { linear_part(zeros(*rt_, {2, 4}, device_), zeros(*rt_, {12, 5}, device_), Tensor(), 0, 3); },
                 {"[2, 4]", "[12, 5]", "expects 5"});
  }
};

QTEST_GUILESS_MAIN(AttentionKernelsTest)
#include "test_attention_kernels.moc"
