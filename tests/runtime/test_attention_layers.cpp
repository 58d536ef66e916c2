// The drawn attention layers' shape inference, errors and canonical text; drawn transformers end to end
// through Model: a causal language model, cross-attention, a ViT-like network, each with every parameter
// gradient against finite differences, multi-head attention against a float64 forward, the attention weights
// it keeps, dropout's determinism, and attention weights that cannot fit the device; valid lengths from the
// data (ValidLength on padded token ids into MultiheadAttention's valid_lens, k and v open) against attention
// over each sample's first keys, a length of 0 giving out_proj's bias. The ops under them:
// test_attention_kernels. GN_TEST_DEVICE=cuda:0 runs the device checks on CUDA instead (skipped without a GPU).
#include "attention_test_util.h"

using namespace gn::attention_test;

class AttentionLayersTest : public AttentionSuite {
  Q_OBJECT

 private slots:
  void initTestCase() {
    rt_ = std::make_unique<Runtime>(RuntimeOptions{});
    GN_USE_TEST_DEVICE(*rt_, device_);
    qInfo("attention layers on %s", device_.str().c_str());
  }
  void cleanupTestCase() { rt_.reset(); }

  // --- layers: inference, errors, text ------------------------------------------------------------------------

  void attention_layers_infer_shapes_and_counts() {
    auto mha = [](int64_t heads, bool bias = true, bool causal = false) {
      return spec(LayerKind::MultiheadAttention, [=](LayerSpec& l) { l.heads = heads, l.bias = bias, l.causal = causal; });
    };
    const LayerInfo self = infer_layer(mha(2), {{5, 8}});
    QCOMPARE(self.out, (Shape{5, 8}));
    QCOMPARE(self.params, 4.0 * 8 * 8 + 4 * 8);  // in_proj [3E, E] + [3E], out_proj [E, E] + [E]
    QVERIFY(self.flops > 0);
    QCOMPARE(infer_layer(mha(2, false), {{5, 8}}).params, 4.0 * 8 * 8);
    QCOMPARE(infer_layer(mha(4), {{3, 8}, {7, 8}}).out, (Shape{3, 8}));
    QCOMPARE(infer_layer(mha(1, true, true), {{3, 8}, {7, 8}, {7, 8}}).out, (Shape{3, 8}));
    const LayerInfo ln = infer_layer(spec(LayerKind::LayerNorm), {{5, 8}});
    QCOMPARE(ln.out, (Shape{5, 8}));
    QCOMPARE(ln.params, 16.0);
    QCOMPARE(infer_layer(spec(LayerKind::LayerNorm, [](LayerSpec& l) { l.affine = false; }), {{5, 8}}).params, 0.0);
    // nn.LayerNorm(W) normalises the last axis of any rank.
    QCOMPARE(infer_layer(spec(LayerKind::LayerNorm), {{3, 4, 6}}).params, 12.0);
    QCOMPARE(infer_layer(spec(LayerKind::BatchMatMul), {{3, 4}, {4, 5}}).out, (Shape{3, 5}));
    QCOMPARE(infer_layer(spec(LayerKind::BatchMatMul, [](LayerSpec& l) { l.transpose_b = true; }), {{3, 4}, {6, 4}}).out,
             (Shape{3, 6}));
    QCOMPARE(infer_layer(spec(LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; }), {{3, 5}}).out, (Shape{3, 5}));
    QCOMPARE(infer_layer(spec(LayerKind::Softmax), {{7}}).out, (Shape{7}));
    QCOMPARE(infer_layer(spec(LayerKind::Mul), {{3, 5}, {3, 5}}).out, (Shape{3, 5}));
    QCOMPARE(infer_layer(spec(LayerKind::Scale, [](LayerSpec& l) { l.scale = 0.5; }), {{3, 5}}).out, (Shape{3, 5}));
    QCOMPARE(infer_layer(spec(LayerKind::PositionalEncoding), {{1000, 6}}).params, 0.0);
    const LayerInfo pos = infer_layer(spec(LayerKind::PositionEmbedding), {{5, 6}});
    QCOMPARE(pos.params, 30.0);
    const LayerInfo cls = infer_layer(spec(LayerKind::ClassToken), {{4, 6}});
    QCOMPARE(cls.out, (Shape{5, 6}));
    QCOMPARE(cls.params, 6.0);
    QCOMPARE(infer_layer(spec(LayerKind::FirstStep), {{5, 6}}).out, (Shape{6}));
    QCOMPARE(layer_ports(LayerKind::MultiheadAttention), (std::vector<std::string>{"q", "k", "v", "valid_lens"}));
    // valid_lens: [1] per sample, after q alone (k and v open: empty shapes) or after k; ValidLength counts ids.
    QCOMPARE(infer_layer(spec(LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2; }), {{5, 8}, {}, {}, {1}}).out,
             (Shape{5, 8}));
    QCOMPARE(infer_layer(spec(LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2; }), {{5, 8}, {3, 8}, {}, {1}}).out,
             (Shape{5, 8}));
    const LayerInfo vl = infer_layer(spec(LayerKind::ValidLength), {{7}});
    QCOMPARE(vl.out, (Shape{1}));
    QCOMPARE(vl.params, 0.0);
    QCOMPARE(LayerSpec().pad_id, int64_t(1));  // '<pad>' after '<unk>' = 0, as d2l's vocabulary
    QCOMPARE(layer_required_ports(LayerKind::MultiheadAttention), 1);
    QCOMPARE(layer_ports(LayerKind::BatchMatMul), (std::vector<std::string>{"a", "b"}));
    QCOMPARE(layer_required_ports(LayerKind::Mul), 2);
    for (const char* name : {"LayerNorm", "MultiheadAttention", "BatchMatMul", "Softmax", "Mul", "Scale",
                             "PositionalEncoding", "PositionEmbedding", "ClassToken", "FirstStep"}) {
      const auto kind = parse_layer_kind(name);
      QVERIFY2(kind.has_value(), name);
      QCOMPARE(QString(layer_kind_name(*kind)), QString(name));
    }
  }

  void attention_layer_mismatches_name_both_sides() {
    auto mha = [](const std::function<void(LayerSpec&)>& set = {}) {
      return spec(LayerKind::MultiheadAttention, [=](LayerSpec& l) {
        l.heads = 2;
        if (set) set(l);
      });
    };
    expect_layer_error([&] { infer_layer(mha([](LayerSpec& l) { l.heads = 3; }), {{5, 8}}); }, "",
                       {"num_heads=3", "8", "5x8"});
    expect_layer_error([&] { infer_layer(mha([](LayerSpec& l) { l.heads = 0; }), {{5, 8}}); }, "", {"num_heads"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {6, 4}}); }, "k", {"q is 5x8", "k is 6x4"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {6, 8}, {6, 4}}); }, "v", {"q is 5x8", "v is 6x4"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {6, 8}, {7, 8}}); }, "v", {"k is 6x8", "v is 7x8"});
    expect_layer_error([&] { infer_layer(mha([](LayerSpec& l) { l.causal = true; }), {{5, 8}, {4, 8}}); }, "k",
                       {"causal", "q is 5x8", "k is 4x8"});
    expect_layer_error([&] { infer_layer(mha(), {{40}}); }, "q", {"[T, E]", "q", "40"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {1, 6, 8}}); }, "k", {"[T, E]", "1x6x8"});
    expect_layer_error([&] { infer_layer(mha([](LayerSpec& l) { l.dropout = 1; }), {{5, 8}}); }, "", {"dropout"});
    expect_layer_error([&] { infer_layer(mha(), {}); }, "", {"1 to 4 inputs", "got 0"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {5, 8}, {5, 8}, {1}, {1}}); }, "", {"1 to 4 inputs", "got 5"});
    // valid_lens of another shape, names it and q; v without k; q open; a trailing open port.
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {}, {}, {5, 8}}); }, "valid_lens", {"[1]", "5x8", "q is 5x8"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {}, {}, {2}}); }, "valid_lens", {"[1]", "got 2", "q is 5x8"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {}, {5, 8}}); }, "v", {"k is not"});
    expect_layer_error([&] { infer_layer(mha(), {{}, {5, 8}}); }, "", {"required input"});
    expect_layer_error([&] { infer_layer(mha(), {{5, 8}, {}}); }, "", {"required input"});
    expect_layer_error([&] { infer_layer(spec(LayerKind::ValidLength), {{5, 8}}); }, "in", {"token ids", "5x8"});
    expect_layer_error([&] { infer_layer(spec(LayerKind::ValidLength, [](LayerSpec& l) { l.pad_id = -1; }), {{5}}); },
                       "", {"pad_id"});

    expect_layer_error([] { infer_layer(spec(LayerKind::LayerNorm, [](LayerSpec& l) { l.eps = 0; }), {{5, 8}}); }, "",
                       {"eps"});
    // LayerNorm(normalized_shape) must name the last axis of its input.
    expect_layer_error([] { infer_layer(spec(LayerKind::LayerNorm, [](LayerSpec& l) { l.features = 5; }), {{4, 8}}); },
                       "in", {"normalized_shape is 5", "4x8"});
    QCOMPARE(infer_layer(spec(LayerKind::LayerNorm, [](LayerSpec& l) { l.features = 8; }), {{4, 8}}).params, 16.0);
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding), {{40}}); }, "in",
                       {"PositionalEncoding", "[T, F]", "40"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding), {{1, 4, 6}}); }, "in",
                       {"PositionalEncoding", "[T, F]", "1x4x6"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding), {{4, 7}}); }, "in", {"even", "4x7"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding, [](LayerSpec& l) { l.max_len = 3; }),
                                        {{4, 6}}); },
                       "in", {"max_len=3", "4x6", "has 4"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionalEncoding, [](LayerSpec& l) { l.dropout = -0.1; }),
                                        {{4, 6}}); },
                       "", {"dropout"});
    expect_layer_error([] { infer_layer(spec(LayerKind::PositionEmbedding), {{24}}); }, "in", {"[T, F]", "24"});
    expect_layer_error([] { infer_layer(spec(LayerKind::ClassToken), {{2, 3, 4}}); }, "in", {"ClassToken", "2x3x4"});
    expect_layer_error([] { infer_layer(spec(LayerKind::FirstStep), {{6}}); }, "in", {"FirstStep", "[T, F]"});

    expect_layer_error([] { infer_layer(spec(LayerKind::BatchMatMul), {{3, 4}, {5, 6}}); }, "b",
                       {"a 3x4", "4 columns", "b 5x6", "5 rows"});
    expect_layer_error([] { infer_layer(spec(LayerKind::BatchMatMul, [](LayerSpec& l) { l.transpose_b = true; }),
                                        {{3, 4}, {4, 5}}); },
                       "b", {"a 3x4", "b 4x5 transposed", "5 rows"});
    expect_layer_error([] { infer_layer(spec(LayerKind::BatchMatMul), {{12}, {4, 5}}); }, "a", {"a is 12", "b is 4x5"});
    expect_layer_error([] { infer_layer(spec(LayerKind::BatchMatMul), {{3, 4}, {2, 4, 5}}); }, "b",
                       {"a is 3x4", "b is 2x4x5"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; }), {{5, 3}}); },
                       "in", {"causal", "5x3"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; }), {{2, 3, 4}}); },
                       "in", {"causal", "2x3x4"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Mul), {{3, 5}, {5, 3}}); }, "b", {"a is 3x5", "b is 5x3"});
    expect_layer_error([] { infer_layer(spec(LayerKind::Scale, [](LayerSpec& l) { l.scale = INFINITY; }), {{3}}); }, "",
                       {"scale"});
  }

  void the_text_of_an_attention_network_round_trips() {
    Net n;
    const int x = n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {4, 6}; });
    const int pe = n.add("pe", LayerKind::PositionalEncoding, [](LayerSpec& l) { l.dropout = 0.2, l.max_len = 64; });
    const int ln = n.add("ln", LayerKind::LayerNorm, [](LayerSpec& l) { l.features = 6, l.eps = 1e-6, l.affine = false; });
    const int kv = n.add("kv", LayerKind::Scale, [](LayerSpec& l) { l.scale = 0.375; }, {x});
    const int mha = n.add("mha", LayerKind::MultiheadAttention,
                          [](LayerSpec& l) { l.heads = 3, l.dropout = 0.125, l.bias = false, l.causal = true; },
                          {ln, kv, pe});
    const int scores = n.add("scores", LayerKind::BatchMatMul, [](LayerSpec& l) { l.transpose_b = true; }, {mha, ln});
    const int sm = n.add("sm", LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; });
    const int ctx = n.add("ctx", LayerKind::BatchMatMul, {}, {n.last(), kv});
    n.add("mul", LayerKind::Mul, {}, {ctx, pe});
    n.add("cls", LayerKind::ClassToken);
    n.add("pos", LayerKind::PositionEmbedding);
    n.add("first", LayerKind::FirstStep);
    (void)scores;
    const std::string text = n.spec.text();
    for (const char* want : {"normalized_shape=6", "eps=", "elementwise_affine=0", "num_heads=3", "dropout=0.125", "bias=0", "causal=1",
                             "transpose_b=1", "scale=0.375", "dropout=0.2", "max_len=64", "<-ln,kv,pe"})
      QVERIFY2(text.find(want) != std::string::npos, qPrintable(QString("%1 not in %2").arg(want).arg(text.c_str())));
    const NetworkSpec back = NetworkSpec::parse(text);
    QCOMPARE(back.text(), text);
    QCOMPARE(back.layers.size(), n.spec.layers.size());
    const LayerSpec& m = back.layers[static_cast<size_t>(mha)];
    QCOMPARE(m.heads, int64_t(3));
    QCOMPARE(m.dropout, 0.125);
    QVERIFY(!m.bias && m.causal);
    QCOMPARE(m.inputs, (std::vector<int>{ln, kv, pe}));
    QCOMPARE(back.layers[static_cast<size_t>(ln)].eps, 1e-6);
    QCOMPARE(back.layers[static_cast<size_t>(ln)].features, int64_t(6));
    QVERIFY(!back.layers[static_cast<size_t>(ln)].affine);
    QCOMPARE(back.layers[static_cast<size_t>(pe)].max_len, int64_t(64));
    QCOMPARE(back.layers[static_cast<size_t>(pe)].dropout, 0.2);
    QVERIFY(back.layers[static_cast<size_t>(scores)].transpose_b);
    QCOMPARE(back.layers[static_cast<size_t>(kv)].scale, 0.375);
    QVERIFY(back.layers[static_cast<size_t>(sm)].causal);
    const std::vector<LayerInfo> infos = back.infer();
    QCOMPARE(infos[static_cast<size_t>(scores)].out, (Shape{4, 4}));
    QCOMPARE(infos[static_cast<size_t>(n.last()) - 2].out, (Shape{5, 6}));
    QCOMPARE(infos.back().out, (Shape{6}));

    // Five inputs for the four ports of MultiheadAttention, or none, do not parse; nor do wrong shapes.
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=2)<-x,x,x,x,x"); },
                 {"m", "5 inputs"});
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=2)<-x,x,x,x"); },
                 {"m", "valid_lens", "[1]", "4x6"});
    // Open ports before a wired one are empty names; a required one or a trailing one cannot be open.
    {
      const std::string fixed = "network x:Input(shape=6); e:Embedding(num_embeddings=9,embedding_dim=4)<-x; "
                                "vl:ValidLength(pad_id=0)<-x; m:MultiheadAttention(num_heads=2,dropout=0,bias=1,causal=0)"
                                "<-e,,,vl";
      const NetworkSpec h = NetworkSpec::parse(fixed);
      QCOMPARE(h.text(), fixed);
      QCOMPARE(h.layers.back().inputs, (std::vector<int>{1, -1, -1, 2}));
      QCOMPARE(h.layers[2].pad_id, int64_t(0));
      QCOMPARE(h.infer().back().out, (Shape{6, 4}));
      // Through the layer nodes' path (ending_at): null pointers for the open ports, trailing ones dropped.
      auto layer = [](const char* id, LayerKind kind, std::vector<LayerNodePtr> in, Shape shape = {}) {
        LayerSpec l;
        l.id = id, l.kind = kind, l.shape = std::move(shape), l.features = 4, l.vocab = 9, l.heads = 2;
        return make_layer(l, std::move(in));
      };
      const LayerNodePtr ids = layer("x", LayerKind::Input, {}, {6});
      const LayerNodePtr emb = layer("e", LayerKind::Embedding, {ids});
      const LayerNodePtr lens = layer("vl", LayerKind::ValidLength, {ids});
      const LayerNodePtr att = layer("m", LayerKind::MultiheadAttention, {emb, nullptr, nullptr, lens});
      const NetworkSpec walked = NetworkSpec::ending_at(*att);
      QCOMPARE(walked.layers.back().inputs, (std::vector<int>{1, -1, -1, 2}));
      QCOMPARE(walked.layers.back().kind, LayerKind::MultiheadAttention);
      const LayerNodePtr open = layer("m", LayerKind::MultiheadAttention, {emb, nullptr, nullptr, nullptr});
      QCOMPARE(NetworkSpec::ending_at(*open).layers.back().inputs, (std::vector<int>{1}));
      QCOMPARE(NetworkSpec::ending_at(*open).text().find(",,"), std::string::npos);
      expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=2)<-,x"); },
                   {"m"});
      expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=2)<-x,"); },
                   {"m", "2 inputs"});
      expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=2)<-x,,x"); },
                   {"v", "k is not"});
    }
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=2)"); },
                 {"m", "0 inputs"});
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:MultiheadAttention(num_heads=4)<-x"); },
                 {"num_heads=4", "6"});
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:Mul()<-x"); }, {"m", "1 inputs"});
    expect_error([] { NetworkSpec::parse("network x:Input(shape=4x6); m:LayerNorm(elementwise_affine=1,heads=2)<-x"); },
                 {"heads"});
  }

  // --- drawn networks through Model ---------------------------------------------------------------------------

  void multihead_attention_equals_a_float64_forward() {
    // Self-attention (q only) and cross-attention with its own k and v, with Tq < Tk and causal keys aligned to
    // the end; with and without bias. The weights kept are the first sample's, per head.
    const int64_t n = 2, t = 4, e = 6;
    for (bool cross : {false, true})
      for (bool causal : {false, true})
        for (bool bias : {true, false}) {
          const int64_t heads = cross ? 2 : 3, tk = cross ? 2 * t : t;
          Net net;
          const int x = net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, e}; });
          std::vector<int> ports{x};
          if (cross) {
            const int s = net.add("s", LayerKind::Scale, [](LayerSpec& l) { l.scale = 0.5; });
            const int k = net.add("k", LayerKind::Concat, {}, {x, s});
            const int v = net.add("v", LayerKind::Scale, [](LayerSpec& l) { l.scale = -1.5; });
            ports = {x, k, v};
          }
          net.add("mha", LayerKind::MultiheadAttention,
                  [&](LayerSpec& l) { l.heads = heads, l.causal = causal, l.bias = bias; }, ports);
          auto m = Model::create(*rt_, networkOptions(net.spec, 9), device_);
          QVERIFY(m->attention_weights().empty());
          std::vector<std::string> names{"mha.in_proj_weight", "mha.in_proj_bias", "mha.out_proj.weight",
                                         "mha.out_proj.bias"};
          if (!bias) names = {"mha.in_proj_weight", "mha.out_proj.weight"};
          QCOMPARE(parameter_names(*m), names);
          QCOMPARE(parameter(*m, "mha.in_proj_weight")->value.shape(), (Shape{3 * e, e}));
          std::vector<float> in_b, out_b;
          if (bias) {  // nonzero biases, so that they are checked too
            write_values(parameter(*m, "mha.in_proj_bias")->value, values(3 * e, 81));
            write_values(parameter(*m, "mha.out_proj.bias")->value, values(e, 82));
            in_b = to_host(parameter(*m, "mha.in_proj_bias")->value);
            out_b = to_host(parameter(*m, "mha.out_proj.bias")->value);
          }
          const std::vector<float> xv = values(n * t * e, 83, 1.5f);
          std::vector<float> kv = xv, vv = xv;
          if (cross) {
            kv.clear();
            for (int64_t s = 0; s < n; ++s) {
              kv.insert(kv.end(), xv.begin() + s * t * e, xv.begin() + (s + 1) * t * e);
              for (int64_t i = 0; i < t * e; ++i) kv.push_back(0.5f * xv[s * t * e + i]);
            }
            vv.clear();
            for (float f : kv) vv.push_back(-1.5f * f);
          }
          const MhaRef ref = ref_mha(xv, kv, vv, n, t, tk, e, heads, causal,
                                     to_host(parameter(*m, "mha.in_proj_weight")->value), in_b,
                                     to_host(parameter(*m, "mha.out_proj.weight")->value), out_b);
          const QByteArray what = QByteArray(cross ? "cross" : "self") + (causal ? " causal" : "") + (bias ? "" : " no bias");
          const Tensor y = m->forward(dev({n, t, e}, xv), Mode::Eval);
          QCOMPARE(y.shape(), (Shape{n, t, e}));
          QVERIFY2(near(to_host(y), ref.y, 1e-5, what), what.constData());
          const auto weights = m->attention_weights();
          QCOMPARE(weights.size(), size_t(1));
          QCOMPARE(QString::fromStdString(weights[0].first), QString("mha"));
          QCOMPARE(weights[0].second.shape(), (Shape{heads, t, tk}));
          const Doubles first(ref.weights.begin(), ref.weights.begin() + heads * t * tk);
          QVERIFY2(near(to_host(weights[0].second), first, 1e-5, what + " weights"), what.constData());
        }
  }

  void a_tiny_causal_transformer_trains_end_to_end() {
    // Embedding -> PositionalEncoding -> causal self-attention -> Add -> LayerNorm -> feed-forward -> Add ->
    // LayerNorm -> Linear: scores per step.
    const int64_t t = 5, vocab = 7, e = 8;
    Net n;
    n.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t}; });
    n.add("emb", LayerKind::Embedding, [&](LayerSpec& l) { l.vocab = vocab, l.features = e; });
    const int pe = n.add("pe", LayerKind::PositionalEncoding);
    const int mha = n.add("mha", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2, l.causal = true; });
    n.add("add1", LayerKind::Add, {}, {pe, mha});
    const int ln1 = n.add("ln1", LayerKind::LayerNorm);
    n.add("ffn1", LayerKind::Linear, [](LayerSpec& l) { l.features = 12; });
    n.add("relu", LayerKind::ReLU);
    const int ffn2 = n.add("ffn2", LayerKind::Linear, [&](LayerSpec& l) { l.features = e; });
    n.add("add2", LayerKind::Add, {}, {ln1, ffn2});
    n.add("ln2", LayerKind::LayerNorm, [](LayerSpec& l) { l.eps = 1e-3; });
    n.add("out", LayerKind::Linear, [&](LayerSpec& l) { l.features = vocab; });
    QCOMPARE(n.spec.infer().back().out, (Shape{t, vocab}));
    auto m = Model::create(*rt_, networkOptions(n.spec, 4), device_);
    QCOMPARE(parameter_names(*m),
             (std::vector<std::string>{"emb.weight", "mha.in_proj_weight", "mha.in_proj_bias", "mha.out_proj.weight",
                                       "mha.out_proj.bias", "ln1.weight", "ln1.bias", "ffn1.weight", "ffn1.bias",
                                       "ffn2.weight", "ffn2.bias", "ln2.weight", "ln2.bias", "out.weight",
                                       "out.bias"}));
    const std::vector<float> ids{1, 2, 3, 4, 5, 6, 0, 2, 4, 6, 3, 3, 1, 1, 0};
    const Tensor x = dev({3, t}, ids);
    const std::vector<float> whole = to_host(m->forward(x, Mode::Eval));
    QCOMPARE(whole.size(), size_t(3 * t * vocab));
    // Causal: a later token changes no earlier step, and a prefix gives the same first steps.
    std::vector<float> changed = ids;
    changed[4] = 0, changed[9] = 1;  // the last step of samples 0 and 1
    const std::vector<float> other = to_host(m->forward(dev({3, t}, changed), Mode::Eval));
    for (int64_t s = 0; s < 3; ++s)
      for (int64_t i = 0; i < (t - 1) * vocab; ++i)
        QVERIFY(std::fabs(other[s * t * vocab + i] - whole[s * t * vocab + i]) < 1e-5);
    QVERIFY(std::fabs(other[(t - 1) * vocab] - whole[(t - 1) * vocab]) > 1e-6);
    const std::vector<float> prefix = to_host(m->forward(dev({1, 3}, {1, 2, 3}), Mode::Eval));
    QCOMPARE(prefix.size(), size_t(3 * vocab));
    for (size_t i = 0; i < prefix.size(); ++i) QVERIFY(std::fabs(prefix[i] - whole[i]) < 1e-5);

    // The weights after an Eval forward: [heads, T, T] of the first sample, rows summing to 1, no future.
    to_host(m->forward(x, Mode::Eval));
    const auto weights = m->attention_weights();
    QCOMPARE(weights.size(), size_t(1));
    QCOMPARE(QString::fromStdString(weights[0].first), QString("mha"));
    QCOMPARE(weights[0].second.shape(), (Shape{2, t, t}));
    const std::vector<float> w = to_host(weights[0].second);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < t; ++i) {
        double sum = 0;
        for (int64_t j = 0; j < t; ++j) {
          const float v = w[(h * t + i) * t + j];
          if (j > i) QCOMPARE(v, 0.0f);
          QVERIFY(v >= 0);
          sum += v;
        }
        QVERIFY(std::fabs(sum - 1) < 1e-5);
      }

    // Every parameter's gradient against finite differences of the mean cross-entropy over every step.
    const Tensor labels = dev({3, t}, {2, 3, 4, 5, 6, 0, 1, 3, 5, 0, 2, 6, 1, 4, 4});
    auto loss = [&] { return double(item(softmax_cross_entropy(m->forward(x, Mode::Eval), labels, false).loss)); };
    m->backward(softmax_cross_entropy(m->forward(x, Mode::Train), labels).dlogits);
    QCOMPARE(check_finite_differences(*m, loss), 3 * 15);
  }

  void cross_attention_gradients_reach_both_branches() {
    // q from one branch, k (and v) from another of another length: mha1 takes q and k (v = k), mha2 q, k and
    // v, causal with fewer queries than keys, without bias.
    Net n;
    const int x = n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {4, 6}; });
    const int q = n.add("q", LayerKind::Linear, [](LayerSpec& l) { l.features = 6; });
    n.add("t", LayerKind::Transpose, [](LayerSpec& l) { l.dim0 = 0, l.dim1 = 1; }, {x});
    const int k = n.add("k", LayerKind::Linear, [](LayerSpec& l) { l.features = 6; });
    const int v = n.add("v", LayerKind::Tanh);
    const int m1 = n.add("mha1", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 3; }, {q, k});
    n.add("mha2", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2, l.causal = true, l.bias = false; },
          {m1, k, v});
    n.add("last", LayerKind::LastStep);
    n.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    const std::vector<LayerInfo> infos = n.spec.infer();
    QCOMPARE(infos[static_cast<size_t>(k)].out, (Shape{6, 6}));
    QCOMPARE(infos[static_cast<size_t>(m1)].out, (Shape{4, 6}));
    auto m = Model::create(*rt_, networkOptions(n.spec, 5), device_);
    QCOMPARE(parameter_names(*m),
             (std::vector<std::string>{"q.weight", "q.bias", "k.weight", "k.bias", "mha1.in_proj_weight",
                                       "mha1.in_proj_bias", "mha1.out_proj.weight", "mha1.out_proj.bias",
                                       "mha2.in_proj_weight", "mha2.out_proj.weight", "fc.weight", "fc.bias"}));
    const Tensor xs = normal(*rt_, {3, 4, 6}, device_, 17);
    QCOMPARE(m->forward(xs, Mode::Eval).shape(), (Shape{3, 3}));
    const auto weights = m->attention_weights();
    QCOMPARE(weights.size(), size_t(2));
    QCOMPARE(QString::fromStdString(weights[0].first), QString("mha1"));
    QCOMPARE(weights[0].second.shape(), (Shape{3, 4, 6}));
    QCOMPARE(QString::fromStdString(weights[1].first), QString("mha2"));
    QCOMPARE(weights[1].second.shape(), (Shape{2, 4, 6}));
    const std::vector<float> w2 = to_host(weights[1].second);
    for (int64_t h = 0; h < 2; ++h)
      for (int64_t i = 0; i < 4; ++i)
        for (int64_t j = i + 3; j < 6; ++j) QCOMPARE(w2[(h * 4 + i) * 6 + j], 0.0f);  // j > i + (6 - 4)
    check_gradients(*m, xs, 3 * 12);
  }

  void a_vit_like_network_trains_end_to_end() {
    // d2l 11.8 in small: PatchEmbedding (Conv2d with stride = patch, Reshape, Transpose), the class token, a
    // learned position embedding, one pre-norm block, the class token's features, a head.
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {1, 8, 8}; });
    n.add("conv", LayerKind::Conv2d, [](LayerSpec& l) { l.features = 6, l.kernel = 4, l.stride = 4; });
    n.add("flat", LayerKind::Reshape, [](LayerSpec& l) { l.shape = {6, 4}; });
    n.add("patches", LayerKind::Transpose, [](LayerSpec& l) { l.dim0 = 0, l.dim1 = 1; });
    n.add("cls", LayerKind::ClassToken);
    const int pos = n.add("pos", LayerKind::PositionEmbedding);
    n.add("ln1", LayerKind::LayerNorm);
    const int mha = n.add("mha", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2; });
    const int add1 = n.add("add1", LayerKind::Add, {}, {pos, mha});
    n.add("ln2", LayerKind::LayerNorm);
    n.add("fc1", LayerKind::Linear, [](LayerSpec& l) { l.features = 12; });
    n.add("gelu", LayerKind::GELU);
    const int fc2 = n.add("fc2", LayerKind::Linear, [](LayerSpec& l) { l.features = 6; });
    n.add("add2", LayerKind::Add, {}, {add1, fc2});
    n.add("first", LayerKind::FirstStep);
    n.add("head", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    const std::vector<LayerInfo> infos = n.spec.infer();
    QCOMPARE(infos[3].out, (Shape{4, 6}));
    QCOMPARE(infos[4].out, (Shape{5, 6}));
    QCOMPARE(infos.back().out, (Shape{3}));
    auto m = Model::create(*rt_, networkOptions(n.spec, 6), device_);
    QCOMPARE(parameter_names(*m),
             (std::vector<std::string>{"conv.weight", "conv.bias", "cls.weight", "pos.weight", "ln1.weight",
                                       "ln1.bias", "mha.in_proj_weight", "mha.in_proj_bias", "mha.out_proj.weight",
                                       "mha.out_proj.bias", "ln2.weight", "ln2.bias", "fc1.weight", "fc1.bias",
                                       "fc2.weight", "fc2.bias", "head.weight", "head.bias"}));
    QCOMPARE(parameter(*m, "cls.weight")->value.shape(), (Shape{1, 6}));
    QCOMPARE(parameter(*m, "pos.weight")->value.shape(), (Shape{5, 6}));
    QCOMPARE(parameter(*m, "mha.in_proj_weight")->value.shape(), (Shape{18, 6}));
    QCOMPARE(parameter(*m, "mha.out_proj.weight")->value.shape(), (Shape{6, 6}));
    // The class token starts at zeros (d2l); give it values so that its gradient path is not trivial.
    write_values(parameter(*m, "cls.weight")->value, values(6, 91));
    const Tensor xs = normal(*rt_, {3, 1, 8, 8}, device_, 19);
    QCOMPARE(m->forward(xs, Mode::Eval).shape(), (Shape{3, 3}));
    const auto weights = m->attention_weights();
    QCOMPARE(weights.size(), size_t(1));
    QCOMPARE(weights[0].second.shape(), (Shape{2, 5, 5}));
    const std::vector<float> w = to_host(weights[0].second);
    for (int64_t r = 0; r < 2 * 5; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < 5; ++j) sum += w[r * 5 + j];
      QVERIFY(std::fabs(sum - 1) < 1e-5);
    }
    check_gradients(*m, xs, 3 * 18);
  }

  void attention_drawn_by_hand_equals_multihead_attention_with_one_head() {
    // d2l 11.3's primitives: q, k, v projections, BatchMatMul(q, k^T), Scale(1 / sqrt(d)), a causal Softmax,
    // BatchMatMul(weights, v). With the same projections stacked into in_proj and an identity out_proj it is
    // MultiheadAttention(num_heads=1, causal).
    const int64_t t = 4, e = 6;
    Net hand;
    const int x = hand.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, e}; });
    const int q = hand.add("q", LayerKind::Linear, [&](LayerSpec& l) { l.features = e; }, {x});
    const int k = hand.add("k", LayerKind::Linear, [&](LayerSpec& l) { l.features = e; }, {x});
    const int v = hand.add("v", LayerKind::Linear, [&](LayerSpec& l) { l.features = e; }, {x});
    hand.add("scores", LayerKind::BatchMatMul, [](LayerSpec& l) { l.transpose_b = true; }, {q, k});
    hand.add("scale", LayerKind::Scale, [&](LayerSpec& l) { l.scale = 1 / std::sqrt(double(e)); });
    hand.add("softmax", LayerKind::Softmax, [](LayerSpec& l) { l.causal = true; });
    const int ctx = hand.add("ctx", LayerKind::BatchMatMul, {}, {hand.last(), v});
    QCOMPARE(hand.spec.infer()[4].out, (Shape{t, t}));
    Net fused;
    fused.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, e}; });
    fused.add("mha", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 1, l.causal = true; });
    auto a = Model::create(*rt_, networkOptions(hand.spec, 2), device_);
    auto b = Model::create(*rt_, networkOptions(fused.spec, 2), device_);
    std::vector<float> in_w, in_b, eye(static_cast<size_t>(e * e), 0.0f);
    for (const char* p : {"q", "k", "v"}) {
      const std::vector<float> w = to_host(parameter(*a, std::string(p) + ".weight")->value);
      std::vector<float> bias = values(e, 100 + uint64_t(*p));
      write_values(parameter(*a, std::string(p) + ".bias")->value, bias);
      in_w.insert(in_w.end(), w.begin(), w.end());
      in_b.insert(in_b.end(), bias.begin(), bias.end());
    }
    for (int64_t i = 0; i < e; ++i) eye[static_cast<size_t>(i * e + i)] = 1;
    write_values(parameter(*b, "mha.in_proj_weight")->value, in_w);
    write_values(parameter(*b, "mha.in_proj_bias")->value, in_b);
    write_values(parameter(*b, "mha.out_proj.weight")->value, eye);
    const Tensor xs = normal(*rt_, {3, t, e}, device_, 29);
    QVERIFY(near(to_host(a->forward(xs, Mode::Eval)), widen(to_host(b->forward(xs, Mode::Eval))), 1e-5,
                 "hand-drawn attention"));

    // Its gradients, with a Mul of the context and the queries, the last step and a head.
    hand.add("gate", LayerKind::Mul, {}, {ctx, q});
    hand.add("last", LayerKind::LastStep);
    hand.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    auto c = Model::create(*rt_, networkOptions(hand.spec, 3), device_);
    check_gradients(*c, xs, 3 * 8);
    // A Softmax without causal over a flat vector is F.softmax(x, dim=-1).
    Net flat;
    flat.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {5}; });
    flat.add("sm", LayerKind::Softmax);
    auto f = Model::create(*rt_, networkOptions(flat.spec), device_);
    const std::vector<float> z = values(10, 107, 3.0f);
    QVERIFY(near(to_host(f->forward(dev({2, 5}, z), Mode::Eval)), ref_masked_softmax(z, 2, 1, 1, 5, false, nullptr),
                 1e-6, "flat softmax"));
  }

  void dropout_on_attention_weights_is_deterministic_for_a_seed() {
    Net n;
    n.add("x", LayerKind::Input, [](LayerSpec& l) { l.shape = {6, 8}; });
    n.add("pe", LayerKind::PositionalEncoding, [](LayerSpec& l) { l.dropout = 0.25; });
    n.add("mha", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2, l.dropout = 0.5; });
    const Tensor x = normal(*rt_, {4, 6, 8}, device_, 23);
    auto a = Model::create(*rt_, networkOptions(n.spec, 7), device_);
    auto b = Model::create(*rt_, networkOptions(n.spec, 7), device_);
    const std::vector<float> eval = to_host(a->forward(x, Mode::Eval));
    const std::vector<float> ta = to_host(a->forward(x, Mode::Train));
    a->clear_cache();
    const std::vector<float> tb = to_host(b->forward(x, Mode::Train));
    b->clear_cache();
    QCOMPARE(ta, tb);
    QVERIFY(ta != eval);  // dropout did drop
    // The next Train forward draws other masks, the same in both models again.
    const std::vector<float> ta2 = to_host(a->forward(x, Mode::Train));
    a->clear_cache();
    const std::vector<float> tb2 = to_host(b->forward(x, Mode::Train));
    b->clear_cache();
    QCOMPARE(ta2, tb2);
    QVERIFY(ta2 != ta);
    // Eval ignores dropout: the same as a model without it.
    Net plain = n;
    plain.spec.layers[1].dropout = 0, plain.spec.layers[2].dropout = 0;
    auto c = Model::create(*rt_, networkOptions(plain.spec, 7), device_);
    QCOMPARE(to_host(c->forward(x, Mode::Eval)), eval);
    // With dropout 0 a Train forward is the Eval one.
    const std::vector<float> train0 = to_host(c->forward(x, Mode::Train));
    c->clear_cache();
    QVERIFY(near(train0, widen(eval), 1e-6, "train without dropout"));
  }

  void positional_encoding_adds_d2ls_table() {
    const int64_t t = 9, e = 6;
    Net n;
    n.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, e}; });
    n.add("pe", LayerKind::PositionalEncoding, [](LayerSpec& l) { l.max_len = 9; });
    auto m = Model::create(*rt_, networkOptions(n.spec), device_);
    QVERIFY(m->parameters().empty());
    const std::vector<float> x = values(2 * t * e, 95);
    Doubles want(x.size());
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t pos = 0; pos < t; ++pos)
        for (int64_t j = 0; j < e; ++j) {
          const double angle = double(pos) / std::pow(10000.0, double(j - j % 2) / double(e));
          want[(s * t + pos) * e + j] = x[(s * t + pos) * e + j] + (j % 2 ? std::cos(angle) : std::sin(angle));
        }
    QVERIFY(near(to_host(m->forward(dev({2, t, e}, x), Mode::Eval)), want, 1e-5, "positional encoding"));
  }

  void attention_weights_that_cannot_fit_the_device_fail_before_allocating() {
    // Without a limit: 16 samples of 131072 steps need 16 x 131072^2 x 4 bytes = 1 TiB of weights.
    {
      const int64_t t = 131072, n = 16;
      Net net;
      net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, 2}; });
      net.add("attn", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 1; });
      auto m = Model::create(*rt_, networkOptions(net.spec), device_);
      const Tensor x = zeros(*rt_, {n, t, 2}, device_);
      to_host(sum(x));
      const int64_t bytes = n * t * t * 4;
      expect_error([&] { m->forward(x, Mode::Eval); },
                   {"attn", "attention weights", "131072 x 131072", "16 samples", QString::fromStdString(format_bytes(bytes)),
                    QString::fromStdString(device_.str())});
      rt_->engine().wait_all();
    }
    // Under a small limit: 4 samples x 2 heads x 2048^2 x 4 bytes = 128 MiB against 16 MiB more than is
    // allocated now, and nothing of it was allocated.
    const int64_t t = 2048, n = 4;
    Net net;
    net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, 4}; });
    net.add("attn", LayerKind::MultiheadAttention, [](LayerSpec& l) { l.heads = 2; });
    auto m = Model::create(*rt_, networkOptions(net.spec), device_);
    const Tensor x = normal(*rt_, {n, t, 4}, device_, 3);
    to_host(sum(x));
    rt_->engine().wait_all();
    Allocator& alloc = rt_->allocator(device_);
    const int64_t before = alloc.stats().allocated_bytes.current;
    alloc.reset_peak();
    alloc.set_limit(before + (16 << 20));
    const int64_t bytes = n * 2 * t * t * 4;
    QVERIFY2(bytes > before + (16 << 20), "too much is allocated before the check");
    expect_error([&] { m->forward(x, Mode::Eval); },
                 {"attn", "attention weights", "2048 x 2048", "2 heads", "4 samples", QString::fromStdString(format_bytes(bytes))});
    rt_->engine().wait_all();
    const int64_t peak = alloc.stats().allocated_bytes.peak;
    alloc.set_limit(0);
    QVERIFY2(peak == before, qPrintable(QString("peak %1 after the refusal, %2 before").arg(peak).arg(before)));
    // Within the limit it runs.
    alloc.set_limit(before + (256 << 20));
    const Tensor y = m->forward(narrow_batch(x, 1), Mode::Eval);
    QCOMPARE(y.shape(), (Shape{1, t, 4}));
    to_host(sum(y));
    alloc.set_limit(0);
  }

  // d2l 11.2's Nadaraya-Watson pooling against a float64 loop, in evaluation (every key) and in training (each
  // query's own row left out), and its gradients: w's, and through a Linear before it the rows'.
  void valid_lengths_from_the_data_mask_the_keys() {
    // Token ids [5] with '<pad>' = 1: ValidLength counts 5, 2 and 0 ids that are not pad, and
    // MultiheadAttention's valid_lens (k and v open before it) gives keys at or past each length no weight:
    // each sample equals attention over its first L keys only (float64, below), and a sample of length 0
    // gets all-zero weights, so its every step is out_proj's bias. Then every gradient by finite differences.
    const int64_t n = 3, t = 5, e = 6, heads = 2, vocab = 8;
    Net net;
    const int x = net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t}; });
    const int emb = net.add("emb", LayerKind::Embedding, [&](LayerSpec& l) { l.vocab = vocab, l.features = e; });
    const int vl = net.add("vl", LayerKind::ValidLength, {}, {x});
    net.add("mha", LayerKind::MultiheadAttention, [&](LayerSpec& l) { l.heads = heads; }, {emb, -1, -1, vl});
    QCOMPARE(net.spec.infer()[static_cast<size_t>(vl)].out, (Shape{1}));
    QCOMPARE(NetworkSpec::parse(net.spec.text()).text(), net.spec.text());
    auto m = Model::create(*rt_, networkOptions(net.spec, 12), device_);
    write_values(parameter(*m, "mha.in_proj_bias")->value, values(3 * e, 91));
    write_values(parameter(*m, "mha.out_proj.bias")->value, values(e, 92));
    const std::vector<float> ids{2, 3, 4, 5, 6, 3, 7, 1, 1, 1, 1, 1, 1, 1, 1};
    const std::vector<int64_t> lens{5, 2, 0};
    const std::vector<float> w = to_host(parameter(*m, "emb.weight")->value);
    const std::vector<float> in_w = to_host(parameter(*m, "mha.in_proj_weight")->value),
                             in_b = to_host(parameter(*m, "mha.in_proj_bias")->value),
                             out_w = to_host(parameter(*m, "mha.out_proj.weight")->value),
                             out_b = to_host(parameter(*m, "mha.out_proj.bias")->value);
    const Tensor y = m->forward(dev({n, t}, ids), Mode::Eval);
    QCOMPARE(y.shape(), (Shape{n, t, e}));
    const std::vector<float> got = to_host(y);
    for (int64_t s = 0; s < n; ++s) {
      std::vector<float> q;
      for (int64_t i = 0; i < t; ++i) {
        const auto row = w.begin() + static_cast<int64_t>(ids[static_cast<size_t>(s * t + i)]) * e;
        q.insert(q.end(), row, row + e);
      }
      const int64_t len = lens[static_cast<size_t>(s)];
      Doubles want;
      if (len > 0) {
        const std::vector<float> k(q.begin(), q.begin() + len * e);
        want = ref_mha(q, k, k, 1, t, len, e, heads, false, in_w, in_b, out_w, out_b).y;
      } else {
        for (int64_t i = 0; i < t; ++i) want.insert(want.end(), out_b.begin(), out_b.end());
      }
      const std::vector<float> mine(got.begin() + s * t * e, got.begin() + (s + 1) * t * e);
      const QByteArray what = "sample " + QByteArray::number(qlonglong(s)) + " of length " + QByteArray::number(qlonglong(len));
      QVERIFY2(near(mine, want, 1e-5, what), what.constData());
    }
    // The first sample's weights: every key of 5 kept, rows summing to 1.
    const std::vector<float> first = to_host(m->attention_weights().at(0).second);
    for (int64_t r = 0; r < heads * t; ++r) {
      double sum = 0;
      for (int64_t j = 0; j < t; ++j) sum += first[static_cast<size_t>(r * t + j)];
      QVERIFY(std::abs(sum - 1) < 1e-5);
    }
    net.add("last", LayerKind::LastStep);
    net.add("fc", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    auto g = Model::create(*rt_, networkOptions(net.spec, 13), device_);
    check_gradients(*g, dev({n, t}, ids), 3 * 7);
  }

  void nadaraya_watson_pools_as_d2l_with_its_gradients() {
    const int64_t n = 2, t = 5;
    Net net;
    net.add("x", LayerKind::Input, [&](LayerSpec& l) { l.shape = {t, 3}; });
    net.add("mix", LayerKind::Linear, [](LayerSpec& l) { l.features = 3; });
    net.add("nw", LayerKind::NadarayaWatson);
    QCOMPARE(net.spec.infer().back().out, (Shape{t}));
    expect_layer_error([] { infer_layer([] { LayerSpec l; l.id = "nw"; l.kind = LayerKind::NadarayaWatson; return l; }(),
                                        {{5, 2}}); },
                       "in", {"NadarayaWatson", "[T, 3]", "5x2"});
    auto m = Model::create(*rt_, networkOptions(net.spec, 3), device_);
    QCOMPARE(parameter_names(*m), (std::vector<std::string>{"mix.weight", "mix.bias", "nw.w"}));
    const float w0 = to_host(m->parameters()[2]->value)[0];
    QVERIFY2(w0 >= 0 && w0 <= 1, "w starts from U(0, 1)");
    // mix = identity, w = 1.3: the layer sees the rows themselves.
    write_values(m->parameters()[0]->value, {1, 0, 0, 0, 1, 0, 0, 0, 1});
    write_values(m->parameters()[1]->value, {0, 0, 0});
    write_values(m->parameters()[2]->value, {1.3f});
    std::vector<float> rows(static_cast<size_t>(n * t * 3));
    for (size_t i = 0; i < rows.size(); ++i) rows[i] = 0.37f * static_cast<float>((i * 5) % 11) - 1.1f;
    const Tensor xs = dev({n, t, 3}, rows);
    auto reference = [&](bool train) {
      std::vector<double> y(static_cast<size_t>(n * t));
      for (int64_t s = 0; s < n; ++s)
        for (int64_t i = 0; i < t; ++i) {
          const double q = rows[static_cast<size_t>((s * t + i) * 3)];
          double sum = 0, acc = 0;
          for (int64_t j = 0; j < t; ++j) {
            if (train && j == i) continue;
            const double k = rows[static_cast<size_t>((s * t + j) * 3 + 1)];
            const double v = rows[static_cast<size_t>((s * t + j) * 3 + 2)];
            const double e = std::exp(-0.5 * (q - k) * 1.3 * (q - k) * 1.3);
            sum += e, acc += e * v;
          }
          y[static_cast<size_t>(s * t + i)] = acc / sum;
        }
      return y;
    };
    QVERIFY(near(to_host(m->forward(xs, Mode::Eval)), reference(false), 1e-5, "evaluation"));
    QVERIFY(near(to_host(m->forward(xs, Mode::Train)), reference(true), 1e-5, "training, own key left out"));
    m->clear_cache();
    const auto weights = m->attention_weights();
    QCOMPARE(weights.size(), size_t(1));
    QCOMPARE(weights[0].second.shape(), (Shape{1, t, t}));
    // Gradients, in training, of an MSE against targets, with a mixing Linear that is not the identity.
    write_values(m->parameters()[0]->value, {0.9f, 0.2f, -0.1f, 0.1f, 1.1f, 0.3f, -0.2f, 0.1f, 0.8f});
    write_values(m->parameters()[1]->value, {0.05f, -0.1f, 0.2f});
    const Tensor target = normal(*rt_, {n, t}, device_, 4);
    auto loss = [&] {
      const double l = double(item(regression_loss(RegressionLoss::Mse, m->forward(xs, Mode::Train), target, false).loss));
      m->clear_cache();
      return l;
    };
    m->backward(regression_loss(RegressionLoss::Mse, m->forward(xs, Mode::Train), target).dpred);
    QCOMPARE(check_finite_differences(*m, loss), 3 * 3);
  }

  // d2l 11.2's data: sorted training inputs in [0, 5), test inputs 0, 0.1, ..., and rows (query, key, value).
  void attention_pooling_data_is_d2ls() {
    const AttentionPoolingData d = make_attention_pooling(50, 0);
    QCOMPARE(d.train->sample_shape, (Shape{50, 3}));
    QCOMPARE(d.test->target_shape, (Shape{50}));
    QVERIFY(d.train->regression && d.test->regression);
    for (int64_t i = 0; i < 50; ++i) {
      const float* tr = d.train->values.data() + 3 * i;
      const float* te = d.test->values.data() + 3 * i;
      QCOMPARE(tr[0], tr[1]);                                  // a training query is its own key
      QCOMPARE(te[1], tr[1]);                                  // the test split's keys are the training inputs
      QCOMPARE(te[2], tr[2]);                                  // and its values the training targets
      QVERIFY(std::fabs(te[0] - 0.1f * static_cast<float>(i)) < 1e-5f);
      QVERIFY(tr[1] >= 0 && tr[1] < 5 && (i == 0 || tr[1] >= tr[1 - 3]));
      QVERIFY(std::fabs(d.test->targets[static_cast<size_t>(i)] - (2 * std::sin(te[0]) + std::pow(te[0], 0.8f))) < 1e-5f);
    }
    expect_error([] { make_attention_pooling(1, 0); }, {"points", "1"});
  }

 private:
  // The first `count` samples of x.
  Tensor narrow_batch(const Tensor& x, int64_t count) {
    std::vector<float> v = to_host(x);
    Shape s = x.shape();
    v.resize(static_cast<size_t>(x.numel() / s[0] * count));
    s[0] = count;
    return dev(s, v);
  }

  // Backward against central differences at three entries of every parameter, for a cross-entropy over 3
  // classes of 3 samples.
  void check_gradients(Model& m, const Tensor& xs, int expected_checks) {
    const Tensor labels = dev({3}, {0, 2, 1});
    auto loss = [&] { return double(item(softmax_cross_entropy(m.forward(xs, Mode::Eval), labels, false).loss)); };
    m.backward(softmax_cross_entropy(m.forward(xs, Mode::Train), labels).dlogits);
    const int checked = check_finite_differences(m, loss);
    QCOMPARE(checked, expected_checks);
  }
};

QTEST_GUILESS_MAIN(AttentionLayersTest)
#include "test_attention_layers.moc"
