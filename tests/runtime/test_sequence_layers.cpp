// The sequence layers and the regression losses against naive float64 loops (Embedding, OneHot, Transpose,
// the last step, MSE / L1 / Huber, the cross-entropy of [N, T, V]); the drawn sequence layers' shape
// inference, counts, errors and canonical text; and drawn sequence networks end to end: shapes, other
// lengths, the carried state and gradients against finite differences. GN_TEST_DEVICE=cuda:0 runs the
// device checks on CUDA instead (skipped without a GPU). Recurrent layers against PyTorch: test_nn_recurrent.
#include <QtTest>
#include <cmath>
#include <functional>

#include "gpunodes/errors.h"
#include "gpunodes/nn/model.h"
#include "gpunodes/nn/network.h"
#include "gpunodes/nn/sequence_layers.h"
#include "gpunodes/ops.h"
#include "nn_test_util.h"

using namespace gn;
using namespace gn::nn;

namespace {

// Against a float64 reference (nn_test_util.h's max_abs_diff compares two float results).
double max_abs_diff(const std::vector<float>& a, const std::vector<double>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

// Softmax cross-entropy in float64, row by row of `classes` logits: the sum of the losses, the correct argmax
// predictions, the rows counted and each logit's gradient of the sum (zero in a row labelled `pad`, which
// counts for nothing).
struct CeReference {
  double sum = 0, correct = 0, counted = 0;
  std::vector<double> grad;
};
CeReference ce_reference(const std::vector<float>& z, const std::vector<float>& labels, int64_t classes,
                         int64_t pad = -1) {
  CeReference out;
  out.grad.assign(z.size(), 0.0);
  for (size_t r = 0; r < labels.size(); ++r) {
    if (labels[r] == static_cast<float>(pad)) continue;
    const float* row = z.data() + r * classes;
    double mx = row[0], se = 0;
    int64_t arg = 0;
    for (int64_t j = 1; j < classes; ++j)
      if (row[j] > mx) mx = row[j], arg = j;
    for (int64_t j = 0; j < classes; ++j) se += std::exp(row[j] - mx);
    const int64_t label = static_cast<int64_t>(labels[r]);
    out.sum += std::log(se) + mx - row[label];
    out.correct += arg == label;
    out.counted += 1;
    for (int64_t j = 0; j < classes; ++j)
      out.grad[r * classes + j] = std::exp(row[j] - mx) / se - (j == label ? 1.0 : 0.0);
  }
  return out;
}


std::vector<float> iota_values(size_t n, float scale = 0.1f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * static_cast<float>((i * 7) % 23) - 1.0f;
  return v;
}


}  // namespace

class SequenceLayersTest : public QObject {
  Q_OBJECT
  std::unique_ptr<Runtime> rt_;
  Device device_ = Device::cpu();

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>(RuntimeOptions{});
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("sequence layers on %s", device_.str().c_str());
  }
  void cleanupTestCase() { rt_.reset(); }

  void embedding_gathers_rows_and_sums_their_gradients() {
    const int64_t n = 2, t = 3, vocab = 5, dim = 4;
    const std::vector<float> ids{4, 0, 4, 2, 2, 1};
    const std::vector<float> w = iota_values(vocab * dim);
    const Tensor idt = from_values(*rt_, {n, t}, device_, ids), wt = from_values(*rt_, {vocab, dim}, device_, w);
    const Tensor y = embedding(idt, wt);
    QCOMPARE(y.shape(), (Shape{n, t, dim}));
    std::vector<double> want;
    for (float id : ids)
      for (int64_t j = 0; j < dim; ++j) want.push_back(w[static_cast<size_t>(id) * dim + j]);
    QCOMPARE(max_abs_diff(to_host(y), want), 0.0);

    const std::vector<float> dy = iota_values(n * t * dim, 0.3f);
    std::vector<double> dw(vocab * dim, 0.0);
    for (size_t i = 0; i < ids.size(); ++i)
      for (int64_t j = 0; j < dim; ++j) dw[static_cast<size_t>(ids[i]) * dim + j] += dy[i * dim + j];
    const Tensor got = embedding_backward(idt, from_values(*rt_, {n, t, dim}, device_, dy), vocab);
    QVERIFY(max_abs_diff(to_host(got), dw) < 1e-6);
  }

  void a_token_id_out_of_range_names_the_id_its_place_and_the_range() {
    const Tensor w = zeros(*rt_, {5, 2}, device_);
    for (const std::vector<float>& ids : {std::vector<float>{0, 1, 2, 7}, std::vector<float>{0, 1, 2, 1.5f}}) {
      const Tensor idt = from_values(*rt_, {2, 2}, device_, ids);
      expect_error([&] { to_host(embedding(idt, w)); }, {"Embedding", "sample 1, step 1", "[0, 5)"});
      expect_error([&] { to_host(one_hot(idt, 5)); }, {"OneHot", "sample 1, step 1", "[0, 5)"});
    }
    expect_error([&] { to_host(embedding(from_values(*rt_, {1, 1}, device_, {-1}), w)); }, {"-1", "[0, 5)"});
  }

  void one_hot_rows() {
    const Tensor y = one_hot(from_values(*rt_, {1, 3}, device_, {2, 0, 2}), 3);
    QCOMPARE(y.shape(), (Shape{1, 3, 3}));
    QCOMPARE(max_abs_diff(to_host(y), std::vector<double>{0, 0, 1, 1, 0, 0, 0, 0, 1}), 0.0);
  }

  void transpose_swaps_any_two_axes() {
    const Shape s{2, 3, 4, 5};
    const std::vector<float> x = iota_values(2 * 3 * 4 * 5);
    for (auto [a, b] : {std::pair{1, 3}, std::pair{1, 2}, std::pair{0, 3}, std::pair{2, 3}}) {
      Shape out = s;
      std::swap(out[a], out[b]);
      const Tensor y = transpose(from_values(*rt_, s, device_, x), a, b);
      QCOMPARE(y.shape(), out);
      std::vector<double> want(x.size());
      for (int64_t i0 = 0; i0 < s[0]; ++i0)
        for (int64_t i1 = 0; i1 < s[1]; ++i1)
          for (int64_t i2 = 0; i2 < s[2]; ++i2)
            for (int64_t i3 = 0; i3 < s[3]; ++i3) {
              int64_t idx[4] = {i0, i1, i2, i3};
              std::swap(idx[a], idx[b]);
              const int64_t to = ((idx[0] * out[1] + idx[1]) * out[2] + idx[2]) * out[3] + idx[3];
              want[static_cast<size_t>(to)] = x[static_cast<size_t>(((i0 * s[1] + i1) * s[2] + i2) * s[3] + i3)];
            }
      QCOMPARE(max_abs_diff(to_host(y), want), 0.0);
      // Its own inverse: the gradient goes back the same way.
      QCOMPARE(max_abs_diff(to_host(transpose(y, a, b)), std::vector<double>(x.begin(), x.end())), 0.0);
    }
  }

  void the_last_step_and_its_gradient() {
    const std::vector<float> x = iota_values(2 * 3 * 4);
    const Tensor y = select_step(from_values(*rt_, {2, 3, 4}, device_, x), 2);
    std::vector<double> want;
    for (int n = 0; n < 2; ++n)
      for (int j = 0; j < 4; ++j) want.push_back(x[(n * 3 + 2) * 4 + j]);
    QCOMPARE(max_abs_diff(to_host(y), want), 0.0);
    const std::vector<float> dy = iota_values(2 * 4, 0.5f);
    std::vector<double> dx(2 * 3 * 4, 0.0);
    for (int n = 0; n < 2; ++n)
      for (int j = 0; j < 4; ++j) dx[(n * 3 + 2) * 4 + j] = dy[n * 4 + j];
    QCOMPARE(max_abs_diff(to_host(select_step_backward(from_values(*rt_, {2, 4}, device_, dy), 3, 2)), dx), 0.0);
  }

  void regression_losses_equal_a_float64_loop() {
    const std::vector<float> pred{0.5f, -1.0f, 3.0f, 0.0f, 2.25f, -0.1f};
    const std::vector<float> target{0.0f, -1.0f, 0.5f, 0.2f, -2.0f, 0.0f};
    const float delta = 1.0f, scale = 0.25f;
    for (RegressionLoss kind : {RegressionLoss::Mse, RegressionLoss::L1, RegressionLoss::Huber}) {
      double sum = 0, squares = 0;
      std::vector<double> grad;
      for (size_t i = 0; i < pred.size(); ++i) {
        const double e = double(pred[i]) - target[i], a = std::fabs(e);
        double l = 0, g = 0;
        if (kind == RegressionLoss::Mse) l = e * e, g = 2 * e;
        if (kind == RegressionLoss::L1) l = a, g = (e > 0) - (e < 0);
        if (kind == RegressionLoss::Huber) {
          l = a < delta ? 0.5 * e * e : delta * (a - 0.5 * delta);
          g = a < delta ? e : delta * ((e > 0) - (e < 0));
        }
        sum += l, squares += e * e;
        grad.push_back(g * scale);
      }
      const RegressionLossResult r = regression_loss(kind, from_values(*rt_, {6, 1}, device_, pred),
                                                     from_values(*rt_, {6}, device_, target), true, scale, delta);
      QVERIFY(std::fabs(item(r.loss) - sum / 6) < 1e-6);
      QVERIFY(max_abs_diff(to_host(r.stats), std::vector<double>{sum, squares}) < 1e-5);
      QVERIFY(max_abs_diff(to_host(r.dpred), grad) < 1e-6);
    }
    expect_error([&] { regression_loss(RegressionLoss::Mse, zeros(*rt_, {4, 2}, device_), zeros(*rt_, {4}, device_)); },
                 {"[4, 2]", "8 values", "one output per target"});
  }

  void cross_entropy_of_sequences_is_the_mean_over_every_step() {
    const int64_t n = 2, t = 3, v = 4;
    const std::vector<float> z = iota_values(n * t * v, 0.4f);
    const std::vector<float> labels{3, 0, 1, 2, 2, 0};
    const CeReference want = ce_reference(z, labels, v);
    const double sum = want.sum, correct = want.correct;
    const CrossEntropy ce = softmax_cross_entropy(from_values(*rt_, {n, t, v}, device_, z),
                                                  from_values(*rt_, {n, t}, device_, labels));
    QCOMPARE(ce.dlogits.shape(), (Shape{n, t, v}));
    QVERIFY(std::fabs(item(ce.loss) - sum / (n * t)) < 1e-5);
    QVERIFY(max_abs_diff(to_host(ce.stats), std::vector<double>{sum, correct}) < 1e-4);
    expect_error([&] { softmax_cross_entropy(zeros(*rt_, {2, 3, 4}, device_), zeros(*rt_, {2}, device_)); },
                 {"labels", "[2, 3]"});
  }

  // Padding (ignore_index): a padded row has no loss, no gradient and no count; the mean and, with grad_scale
  // 0, the gradient are over the counted rows (torch's CrossEntropyLoss(ignore_index)), and an explicit
  // grad_scale keeps every row in the mean (the trainer's, d2l's MaskedSoftmaxCELoss). Against float64 here.
  void cross_entropy_leaves_padded_steps_out() {
    const int64_t n = 2, t = 3, v = 5, pad = 1;
    const std::vector<float> z = iota_values(n * t * v, 0.3f);
    const std::vector<float> labels{3, 0, 1, 4, 1, 1};  // rows 2, 4 and 5 are padding
    const CeReference want = ce_reference(z, labels, v, pad);
    const double sum = want.sum, correct = want.correct, counted = want.counted;
    const std::vector<double>& grad = want.grad;
    const Tensor tz = from_values(*rt_, {n, t, v}, device_, z), tl = from_values(*rt_, {n, t}, device_, labels);
    const CrossEntropy ce = softmax_cross_entropy(tz, tl, true, 0, 0, pad);
    QVERIFY(std::fabs(item(ce.loss) - sum / counted) < 1e-5);
    QVERIFY(max_abs_diff(to_host(ce.stats), std::vector<double>{sum, correct}) < 1e-4);
    std::vector<double> mean_grad(grad.size()), all_rows(grad.size());
    for (size_t i = 0; i < grad.size(); ++i) mean_grad[i] = grad[i] / counted, all_rows[i] = grad[i] / (n * t);
    QVERIFY(max_abs_diff(to_host(ce.dlogits), mean_grad) < 1e-6);
    const CrossEntropy scaled = softmax_cross_entropy(tz, tl, true, 1.0f / float(n * t), 0, pad);
    QVERIFY(max_abs_diff(to_host(scaled.dlogits), all_rows) < 1e-6);
    // Only padding: nothing to average (torch's NaN), no gradient.
    const CrossEntropy none = softmax_cross_entropy(tz, from_values(*rt_, {n, t}, device_, std::vector<float>(6, 1.0f)),
                                                    true, 0, 0, pad);
    QVERIFY(std::isnan(item(none.loss)));
    QVERIFY(max_abs_diff(to_host(none.stats), std::vector<double>{0, 0}) == 0);
    QVERIFY(max_abs_diff(to_host(none.dlogits), std::vector<double>(size_t(n * t * v), 0.0)) == 0);
    // Without ignore_index a label of -1 is still an error, and ignore_index must be a class.
    expect_error([&] { item(softmax_cross_entropy(tz, from_values(*rt_, {n, t}, device_, {3, 0, -1, 4, 1, 1})).loss); },
                 {"not a class index"});
    expect_error([&] { softmax_cross_entropy(tz, tl, true, 0, 0, v); }, {"ignore_index 5", "[0, 5)"});
  }

  void sequence_layers_infer_shapes_counts_and_flops() {
    // PyTorch's parameter counts: GRU(28, 16, num_layers=2, bidirectional): 3*16*(28+16)+6*16 per direction of
    // layer 0, 3*16*(32+16)+6*16 per direction of layer 1.
    const LayerInfo gru = infer_layer(spec(LayerKind::GRU, [](LayerSpec& l) {
                                        l.features = 16, l.num_layers = 2, l.bidirectional = true;
                                      }),
                                      {{35, 28}});
    QCOMPARE(gru.out, (Shape{35, 32}));
    QCOMPARE(gru.params, 2.0 * (3 * 16 * 44 + 96) + 2.0 * (3 * 16 * 48 + 96));
    QVERIFY(gru.flops > 0);
    const LayerInfo lstm = infer_layer(spec(LayerKind::LSTM, [](LayerSpec& l) { l.features = 8, l.bias = false; }),
                                       {{5, 3}});
    QCOMPARE(lstm.params, 4.0 * 8 * (3 + 8));
    QCOMPARE(infer_layer(spec(LayerKind::RNN, [](LayerSpec& l) { l.features = 8; }), {{5, 3}}).params,
             8.0 * 11 + 16);
    QCOMPARE(infer_layer(spec(LayerKind::Embedding, [](LayerSpec& l) { l.vocab = 28, l.features = 32; }), {{35}}).out,
             (Shape{35, 32}));
    QCOMPARE(infer_layer(spec(LayerKind::OneHot, [](LayerSpec& l) { l.features = 28; }), {{35}}).out, (Shape{35, 28}));
    const LayerInfo linear = infer_layer(spec(LayerKind::Linear, [](LayerSpec& l) { l.features = 10; }), {{35, 64}});
    QCOMPARE(linear.out, (Shape{35, 10}));
    QCOMPARE(linear.flops, 2.0 * 64 * 10 * 35);
    QCOMPARE(infer_layer(spec(LayerKind::Reshape, [](LayerSpec& l) { l.shape = {28, -1}; }), {{1, 28, 28}}).out,
             (Shape{28, 28}));
    QCOMPARE(infer_layer(spec(LayerKind::Transpose, [](LayerSpec& l) { l.dim0 = 0, l.dim1 = -1; }), {{3, 5}}).out,
             (Shape{5, 3}));
    QCOMPARE(infer_layer(spec(LayerKind::LastStep), {{35, 64}}).out, (Shape{64}));
    QCOMPARE(infer_layer(spec(LayerKind::GELU), {{35, 64}}).out, (Shape{35, 64}));
  }

  void sequence_mismatches_name_both_shapes() {
    expect_layer_error([] { infer_layer(spec(LayerKind::GRU, [](LayerSpec& l) { l.features = 4; }), {{35}}); }, "in",
                       {"GRU", "[T, F]", "35", "Embedding or a OneHot"});
    expect_layer_error([] { infer_layer(spec(LayerKind::LSTM, [](LayerSpec& l) { l.features = 4; }), {{1, 28, 28}}); },
                       "in", {"1x28x28", "Reshape"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Embedding, [](LayerSpec& l) { l.vocab = 3, l.features = 4; }),
                                        {{5, 2}}); },
                       "in", {"token ids [T]", "5x2"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Reshape, [](LayerSpec& l) { l.shape = {27, 28}; }),
                                        {{1, 28, 28}}); },
                       "in", {"27x28", "756", "1x28x28", "784"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Reshape, [](LayerSpec& l) { l.shape = {5, -1}; }), {{12}}); },
                       "in", {"12", "not a multiple of 5"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Reshape, [](LayerSpec& l) { l.shape = {-1, -1}; }), {{12}}); },
                       "", {"more than one -1"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Transpose, [](LayerSpec& l) { l.dim1 = 2; }), {{3, 5}}); }, "",
                       {"dim1=2", "3x5"});
    expect_layer_error([] { infer_layer(spec(LayerKind::LastStep), {{64}}); }, "in", {"LastStep", "[T, F]"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Linear, [](LayerSpec& l) { l.features = 2; }), {{2, 3, 4}}); },
                       "in", {"2x3x4", "Flatten"});
    expect_layer_error([] { infer_layer(spec(LayerKind::RNN, [](LayerSpec& l) { l.features = 2, l.dropout = 1; }),
                                        {{3, 4}}); },
                       "", {"dropout"});
  }

  void the_text_of_a_sequence_network_round_trips() {
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {12}; });
    n.add("emb", LayerKind::Embedding, [](LayerSpec& l) { l.vocab = 9, l.features = 6; });
    n.add("rnn", LayerKind::RNN, [](LayerSpec& l) {
      l.features = 5, l.num_layers = 2, l.relu = true, l.dropout = 0.25, l.bidirectional = true, l.bias = false;
    });
    n.add("t", LayerKind::Transpose, [](LayerSpec& l) { l.dim0 = 0, l.dim1 = 1; });
    n.add("r", LayerKind::Reshape, [](LayerSpec& l) { l.shape = {-1, 12}; });
    n.add("last", LayerKind::LastStep);
    n.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    const std::string text = n.spec.text();
    QVERIFY2(text.find("nonlinearity=relu") != std::string::npos, text.c_str());
    const NetworkSpec back = NetworkSpec::parse(text);
    QCOMPARE(back.text(), text);
    QCOMPARE(back.layers[2].dropout, 0.25);
    QCOMPARE(back.layers[4].shape, (Shape{-1, 12}));
    QCOMPARE(back.infer().back().out, (Shape{3}));
    expect_error([&] { NetworkSpec::parse("network x:Input(shape=4x3); r:RNN(hidden_size=2,nonlinearity=sin)<-x"); },
                 {"nonlinearity 'sin'"});
  }

  void a_drawn_language_model_gives_scores_per_step_and_takes_other_lengths() {
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {7}; });
    n.add("emb", LayerKind::Embedding, [](LayerSpec& l) { l.vocab = 11, l.features = 6; });
    n.add("gru", LayerKind::GRU, [](LayerSpec& l) { l.features = 8; });
    n.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 11; });
    auto m = Model::create(*rt_, networkOptions(n.spec), device_);
    std::vector<std::string> names;
    for (const ParameterInfo& p : m->describe()) names.push_back(p.name);
    QCOMPARE(names, (std::vector<std::string>{"emb.weight", "gru.weight_ih_l0", "gru.weight_hh_l0", "gru.bias_ih_l0",
                                              "gru.bias_hh_l0", "fc.weight", "fc.bias"}));
    const Tensor ids = from_values(*rt_, {2, 7}, device_, {1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 5, 10});
    QCOMPARE(m->forward(ids, Mode::Eval).shape(), (Shape{2, 7, 11}));
    // Generate feeds a growing text: the first three steps of a length-3 input are the same computation.
    const std::vector<float> whole = to_host(m->forward(ids, Mode::Eval));
    const std::vector<float> first = to_host(m->forward(from_values(*rt_, {1, 3}, device_, {1, 2, 3}), Mode::Eval));
    QCOMPARE(first.size(), size_t(33));
    for (size_t i = 0; i < first.size(); ++i) QVERIFY(std::fabs(first[i] - whole[i]) < 1e-5);
    // A network whose Reshape fixes the length takes no other.
    Net fixed;
    fixed.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {4, 2}; });
    fixed.add("r", LayerKind::Reshape, [](LayerSpec& l) { l.shape = {8}; });
    auto f = Model::create(*rt_, networkOptions(fixed.spec), device_);
    expect_error([&] { f->forward(zeros(*rt_, {1, 5, 2}, device_), Mode::Eval); }, {"expects input [N, 4, 2]"});
  }

  void linear_on_a_sequence_is_linear_on_each_step() {
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {3, 4}; });
    n.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 2; });
    auto m = Model::create(*rt_, networkOptions(n.spec), device_);
    const std::vector<float> x = iota_values(2 * 3 * 4);
    const std::vector<float> w = to_host(m->state()[0]->value), b = to_host(m->state()[1]->value);
    std::vector<double> want;
    for (int r = 0; r < 6; ++r)
      for (int o = 0; o < 2; ++o) {
        double s = b[o];
        for (int k = 0; k < 4; ++k) s += double(x[r * 4 + k]) * w[o * 4 + k];
        want.push_back(s);
      }
    const Tensor y = m->forward(from_values(*rt_, {2, 3, 4}, device_, x), Mode::Eval);
    QCOMPARE(y.shape(), (Shape{2, 3, 2}));
    QVERIFY(max_abs_diff(to_host(y), want) < 1e-5);
  }

  void gradients_through_sequence_layers_match_finite_differences() {
    // Rows of an "image" as steps: Reshape, a Linear on every step, a Transpose and back, an LSTM, the last
    // step, then a classifier; plus Embedding in a second network below.
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {1, 4, 3}; });
    n.add("rows", LayerKind::Reshape, [](LayerSpec& l) { l.shape = {4, 3}; });
    n.add("proj", LayerKind::Linear, [](LayerSpec& l) { l.features = 5; });
    n.add("tanh", LayerKind::Tanh);
    n.add("t1", LayerKind::Transpose, [](LayerSpec& l) { l.dim0 = 0, l.dim1 = 1; });
    n.add("t2", LayerKind::Transpose, [](LayerSpec& l) { l.dim0 = -1, l.dim1 = 0; });
    n.add("lstm", LayerKind::LSTM, [](LayerSpec& l) { l.features = 4; });
    n.add("last", LayerKind::LastStep);
    n.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    check_gradients(n.spec, normal(*rt_, {3, 1, 4, 3}, device_, 5), 3 * 8);

    Net e;
    e.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {4}; });
    e.add("emb", LayerKind::Embedding, [](LayerSpec& l) { l.vocab = 6, l.features = 3; });
    e.add("gru", LayerKind::GRU, [](LayerSpec& l) { l.features = 4; });
    e.add("last", LayerKind::LastStep);
    e.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    check_gradients(e.spec, from_values(*rt_, {3, 4}, device_, {0, 1, 2, 3, 4, 5, 5, 4, 3, 2, 1, 0}), 3 * 7);
  }

  void a_carried_state_continues_where_the_last_batch_ended() {
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {3, 2}; });
    n.add("rnn", LayerKind::RNN, [](LayerSpec& l) { l.features = 4; });
    auto m = Model::create(*rt_, networkOptions(n.spec), device_);
    const std::vector<float> a = iota_values(2 * 3 * 2), b = iota_values(2 * 3 * 2, 0.2f);
    // Reference: the two batches as one sequence of 6 steps.
    std::vector<float> joined;
    for (int s = 0; s < 2; ++s) {
      joined.insert(joined.end(), a.begin() + s * 6, a.begin() + s * 6 + 6);
      joined.insert(joined.end(), b.begin() + s * 6, b.begin() + s * 6 + 6);
    }
    const std::vector<float> whole = to_host(m->forward(from_values(*rt_, {2, 6, 2}, device_, joined), Mode::Eval));
    m->carry_state(true);
    to_host(m->forward(from_values(*rt_, {2, 3, 2}, device_, a), Mode::Train));
    m->clear_cache();
    const std::vector<float> second = to_host(m->forward(from_values(*rt_, {2, 3, 2}, device_, b), Mode::Train));
    m->clear_cache();
    for (int s = 0; s < 2; ++s)
      for (int k = 0; k < 12; ++k) QVERIFY(std::fabs(second[s * 12 + k] - whole[s * 24 + 12 + k]) < 1e-5);
    // After a reset the next batch starts from zeros again.
    m->reset_state();
    const std::vector<float> fresh = to_host(m->forward(from_values(*rt_, {2, 3, 2}, device_, b), Mode::Train));
    m->clear_cache();
    const std::vector<float> eval = to_host(m->forward(from_values(*rt_, {2, 3, 2}, device_, b), Mode::Eval));
    for (size_t i = 0; i < fresh.size(); ++i) QVERIFY(std::fabs(fresh[i] - eval[i]) < 1e-6);
    m->carry_state(false);
  }

 private:
  // Backward against central differences at three entries of every parameter, for a cross-entropy over 3
  // classes of 3 samples.
  void check_gradients(const NetworkSpec& net, const Tensor& xs, int expected_checks) {
    auto m = Model::create(*rt_, networkOptions(net, 3), device_);
    const Tensor labels = from_values(*rt_, {3}, device_, {0, 2, 1});
    auto loss = [&] { return double(item(softmax_cross_entropy(m->forward(xs, Mode::Eval), labels, false).loss)); };
    m->backward(softmax_cross_entropy(m->forward(xs, Mode::Train), labels).dlogits);
    const int checked = check_finite_differences(*m, loss);
    QCOMPARE(checked, expected_checks);
  }
};

QTEST_GUILESS_MAIN(SequenceLayersTest)
#include "test_sequence_layers.moc"
