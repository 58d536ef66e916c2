// The modules of the drawn sequence layers: Embedding, OneHot, the recurrent layers, Reshape, Transpose and
// LastStep. Shapes here include the batch axis: a sequence batch is [N, T, F], token ids [N, T].
#include <cmath>

#include "gpunodes/nn/recurrent.h"
#include "gpunodes/nn/sequence_layers.h"
#include "module.h"

namespace gn::nn {
namespace {

std::string dims_text(const Shape& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out;
}

// nn.Embedding: weight [num_embeddings, embedding_dim] from N(0, 1), PyTorch's default.
class EmbeddingM final : public Module {
 public:
  EmbeddingM(Builder& b, int64_t vocab, int64_t dim) : vocab_(vocab), dim_(dim) {
    w_.value = b.normal_weight({vocab, dim}, 1.0f);
  }
  Tensor forward(const Tensor& ids, Mode mode) override {
    if (mode == Mode::Train) ids_ = ids;
    return embedding(ids, w_.value);
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    (void)need_dx;  // token ids have no gradient
    w_.grad = embedding_backward(ids_, dy, vocab_);
    ids_ = Tensor();
    return Tensor();
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    push_param(out, prefix, w_, "weight");
  }
  bool has_params() const override { return true; }
  void clear() override { ids_ = Tensor(); }
  Shape out_shape(const Shape& in) const override {
    Shape s = in;
    s.push_back(dim_);
    return s;
  }
  std::string describe() const override {
    return "Embedding(" + std::to_string(vocab_) + ", " + std::to_string(dim_) + ")";
  }

 private:
  int64_t vocab_, dim_;
  Parameter w_;
  Tensor ids_;
};

class OneHotM final : public Module {
 public:
  explicit OneHotM(int64_t classes) : classes_(classes) {}
  Tensor forward(const Tensor& ids, Mode) override { return one_hot(ids, classes_); }
  Tensor backward(const Tensor&, bool) override { return Tensor(); }  // token ids have no gradient
  Shape out_shape(const Shape& in) const override {
    Shape s = in;
    s.push_back(classes_);
    return s;
  }
  std::string describe() const override { return "OneHot(" + std::to_string(classes_) + ")"; }

 private:
  int64_t classes_;
};

RnnKind rnn_kind_of(const LayerSpec& l) {
  switch (l.kind) {
    case LayerKind::GRU:
      return RnnKind::Gru;
    case LayerKind::LSTM:
      return RnnKind::Lstm;
    default:
      return l.relu ? RnnKind::RnnRelu : RnnKind::RnnTanh;
  }
}

// nn.RNN / nn.GRU / nn.LSTM with batch_first=True: every weight from U(-1/sqrt(H), 1/sqrt(H)), PyTorch's
// default, named and ordered as its state_dict. The initial state is zeros, or with carry_state the state
// the previous Train-mode batch ended in (detached: backward never reaches it), as d2l's train_epoch_ch8
// does with its sequential iterator.
class RecurrentM final : public Module {
 public:
  RecurrentM(Builder& b, const LayerSpec& l, int64_t input_size, uint64_t seed) : seed_(seed) {
    o_.kind = rnn_kind_of(l);
    o_.input_size = input_size;
    o_.hidden_size = l.features;
    o_.num_layers = l.num_layers;
    o_.bidirectional = l.bidirectional;
    o_.bias = l.bias;
    o_.dropout = static_cast<float>(l.dropout);
    const float bound = 1.0f / std::sqrt(static_cast<float>(l.features));
    for (const RnnParam& p : rnn_params(o_)) {
      params_.emplace_back();
      params_.back().value = b.uniform_weight(p.shape, bound);
      names_.push_back(p.name);
    }
    train_forwards_ = &b.train_forwards();
  }
  Tensor forward(const Tensor& x, Mode mode) override {
    const bool train = mode == Mode::Train;
    Tensor h0, c0;
    if (train && carry_ && state_h_.defined() && state_h_.shape()[1] == x.shape()[0]) h0 = state_h_, c0 = state_c_;
    const uint64_t seed = dropout_seed(seed_, *train_forwards_);
    RnnResult r = rnn_forward(o_, x, values(), h0, c0, train, seed);
    if (train) {
      x_ = x;
      result_ = r;
      if (carry_) state_h_ = r.h_n, state_c_ = r.c_n;
    }
    return r.y;
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    RnnGrads g = rnn_backward(o_, result_, x_, values(), dy, need_dx);
    for (size_t i = 0; i < params_.size(); ++i) params_[i].grad = g.dweights[i];
    clear();
    return g.dx;
  }
  void collect(const std::string& prefix, std::vector<Parameter*>& out) override {
    for (size_t i = 0; i < params_.size(); ++i) push_param(out, prefix, params_[i], names_[i].c_str());
  }
  bool has_params() const override { return true; }
  void clear() override {
    x_ = Tensor();
    result_ = RnnResult();
  }
  void carry_state(bool on) override {
    carry_ = on;
    if (!on) reset_state();
  }
  void reset_state() override { state_h_ = state_c_ = Tensor(); }
  Shape out_shape(const Shape& in) const override { return {in[0], in[1], o_.hidden_size * o_.directions()}; }
  std::string describe() const override {
    const char* kind = o_.kind == RnnKind::Gru ? "GRU" : o_.kind == RnnKind::Lstm ? "LSTM" : "RNN";
    std::string s = std::string(kind) + "(" + std::to_string(o_.input_size) + ", " + std::to_string(o_.hidden_size);
    if (o_.num_layers != 1) s += ", num_layers=" + std::to_string(o_.num_layers);
    if (o_.kind == RnnKind::RnnRelu) s += ", nonlinearity='relu'";
    if (!o_.bias) s += ", bias=False";
    if (o_.dropout > 0) s += ", dropout=" + std::to_string(o_.dropout).substr(0, 4);
    if (o_.bidirectional) s += ", bidirectional=True";
    return s + ")";
  }

 private:
  std::vector<Tensor> values() const {
    std::vector<Tensor> v;
    for (const Parameter& p : params_) v.push_back(p.value);
    return v;
  }

  RnnOptions o_;
  uint64_t seed_;
  const int64_t* train_forwards_ = nullptr;  // numbers the dropout masks, as DropoutM's
  std::vector<Parameter> params_;
  std::vector<std::string> names_;
  Tensor x_;
  RnnResult result_;
  bool carry_ = false;
  Tensor state_h_, state_c_;
};

// A view: the same values under the per-sample shape asked for (its -1 resolved from the input each time).
class ReshapeM final : public Module {
 public:
  explicit ReshapeM(LayerSpec spec) : spec_(std::move(spec)) {}
  Tensor forward(const Tensor& x, Mode mode) override {
    if (mode == Mode::Train) in_ = x.shape();
    return x.reshaped(out_shape(x.shape()));
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    Tensor dx = need_dx ? dy.reshaped(in_) : Tensor();
    in_.clear();
    return dx;
  }
  Shape out_shape(const Shape& in) const override {
    const Shape per_sample(in.begin() + 1, in.end());
    Shape s = spec_.reshape_target(per_sample);
    s.insert(s.begin(), in[0]);
    return s;
  }
  std::string describe() const override { return "Reshape(" + dims_text(spec_.shape) + ")"; }

 private:
  LayerSpec spec_;
  Shape in_;
};

// Per-sample axes dim0 and dim1 swapped (negative ones count from the end, as PyTorch's).
class TransposeM final : public Module {
 public:
  TransposeM(int64_t dim0, int64_t dim1) : dim0_(dim0), dim1_(dim1) {}
  Tensor forward(const Tensor& x, Mode) override {
    const auto [a, b] = axes(x.shape());
    return transpose(x, a, b);
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    if (!need_dx) return Tensor();
    const auto [a, b] = axes(dy.shape());
    return transpose(dy, a, b);
  }
  Shape out_shape(const Shape& in) const override {
    Shape s = in;
    const auto [a, b] = axes(in);
    std::swap(s[static_cast<size_t>(a)], s[static_cast<size_t>(b)]);
    return s;
  }
  std::string describe() const override {
    return "Transpose(" + std::to_string(dim0_) + ", " + std::to_string(dim1_) + ")";
  }

 private:
  // The axes of the whole tensor (batch included).
  std::pair<int64_t, int64_t> axes(const Shape& s) const {
    const auto per_sample = static_cast<int64_t>(s.size()) - 1;
    auto whole = [&](int64_t d) { return (d < 0 ? d + per_sample : d) + 1; };
    return {whole(dim0_), whole(dim1_)};
  }
  int64_t dim0_, dim1_;
};

// x[:, -1]: the last step's features.
class LastStepM final : public Module {
 public:
  Tensor forward(const Tensor& x, Mode mode) override {
    if (mode == Mode::Train) steps_ = x.shape()[1];
    return select_step(x, x.shape()[1] - 1);
  }
  Tensor backward(const Tensor& dy, bool need_dx) override {
    return need_dx ? select_step_backward(dy, steps_, steps_ - 1) : Tensor();
  }
  Shape out_shape(const Shape& in) const override { return {in[0], in[2]}; }
  std::string describe() const override { return "LastStep()"; }

 private:
  int64_t steps_ = 0;
};

}  // namespace

std::unique_ptr<Module> make_sequence_module(Builder& b, const LayerSpec& l, const Shape& in, uint64_t seed) {
  switch (l.kind) {
    case LayerKind::Embedding:
      return std::make_unique<EmbeddingM>(b, l.vocab, l.features);
    case LayerKind::OneHot:
      return std::make_unique<OneHotM>(l.features);
    case LayerKind::RNN:
    case LayerKind::GRU:
    case LayerKind::LSTM:
      return std::make_unique<RecurrentM>(b, l, in.at(1), seed);
    case LayerKind::Reshape:
      return std::make_unique<ReshapeM>(l);
    case LayerKind::Transpose:
      return std::make_unique<TransposeM>(l.dim0, l.dim1);
    case LayerKind::LastStep:
      return std::make_unique<LastStepM>();
    default:
      return nullptr;
  }
}

}  // namespace gn::nn
