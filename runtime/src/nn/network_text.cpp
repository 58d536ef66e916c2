// The canonical text of a drawn network (NetworkSpec::text) and its parser (NetworkSpec::parse): one line
// that names every layer, its kind, its params in a fixed order and its inputs, read back to the same spec.
#include <charconv>
#include <cmath>
#include <map>

#include "gpunodes/nn/network.h"
#include "network_internal.h"

namespace gn::nn {

namespace {

std::string num(double v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);  // shortest text that reads back as the same double
  return std::string(buf, r.ptr);
}

// The params each kind reads, as text, in a fixed order.
std::string params_text(const LayerSpec& l) {
  auto i = [](int64_t v) { return std::to_string(v); };
  switch (l.kind) {
    case LayerKind::Input:
      return "shape=" + dims_text(l.shape);
    case LayerKind::Conv2d:
      return "out_channels=" + i(l.features) + ",kernel_size=" + i(l.kernel) + ",stride=" + i(l.stride) +
             ",padding=" + i(l.padding) + ",groups=" + i(l.groups) + ",bias=" + i(l.bias);
    case LayerKind::BatchNorm2d:
    case LayerKind::BatchNorm1d:
      return "eps=" + num(l.eps) + ",momentum=" + num(l.momentum);
    case LayerKind::MaxPool2d:
    case LayerKind::AvgPool2d:
      return "kernel_size=" + i(l.kernel) + ",stride=" + i(l.stride) + ",padding=" + i(l.padding);
    case LayerKind::Linear:
      return "out_features=" + i(l.features) + ",bias=" + i(l.bias);
    case LayerKind::Dropout:
      return "p=" + num(l.p);
    case LayerKind::Embedding:
      return "num_embeddings=" + i(l.vocab) + ",embedding_dim=" + i(l.features);
    case LayerKind::OneHot:
      return "num_classes=" + i(l.features);
    case LayerKind::RNN:
    case LayerKind::GRU:
    case LayerKind::LSTM:
      return "hidden_size=" + i(l.features) + ",num_layers=" + i(l.num_layers) +
             ",bidirectional=" + i(l.bidirectional) + ",dropout=" + num(l.dropout) + ",bias=" + i(l.bias) +
             (l.kind == LayerKind::RNN ? ",nonlinearity=" + std::string(l.relu ? "relu" : "tanh") : "");
    case LayerKind::Reshape: {
      std::string out = "shape=";
      for (size_t k = 0; k < l.shape.size(); ++k) out += (k ? "x" : "") + i(l.shape[k]);
      return out;
    }
    case LayerKind::Transpose:
      return "dim0=" + i(l.dim0) + ",dim1=" + i(l.dim1);
    case LayerKind::LayerNorm:
      return "normalized_shape=" + i(l.features) + ",eps=" + num(l.eps) + ",elementwise_affine=" + i(l.affine);
    case LayerKind::MultiheadAttention:
      return "num_heads=" + i(l.heads) + ",dropout=" + num(l.dropout) + ",bias=" + i(l.bias) +
             ",causal=" + i(l.causal);
    case LayerKind::BatchMatMul:
      return "transpose_b=" + i(l.transpose_b);
    case LayerKind::Softmax:
      return "causal=" + i(l.causal);
    case LayerKind::Scale:
      return "scale=" + num(l.scale);
    case LayerKind::PositionalEncoding:
      return "dropout=" + num(l.dropout) + ",max_len=" + i(l.max_len);
    case LayerKind::ValidLength:
      return "pad_id=" + i(l.pad_id);
    default:
      return "";
  }
}

[[noreturn]] void bad(const std::string& text, const std::string& why) {
  const std::string head = text.size() > 120 ? text.substr(0, 120) + "..." : text;
  throw Error("malformed network signature '" + head + "': " + why);
}

std::vector<std::string> split(const std::string& s, const std::string& sep) {
  std::vector<std::string> out;
  size_t start = 0;
  while (true) {
    const size_t at = s.find(sep, start);
    out.push_back(s.substr(start, at == std::string::npos ? std::string::npos : at - start));
    if (at == std::string::npos) return out;
    start = at + sep.size();
  }
}

int64_t to_int(const std::string& text, const std::string& v) {
  int64_t out = 0;
  auto r = std::from_chars(v.data(), v.data() + v.size(), out);
  if (r.ec != std::errc() || r.ptr != v.data() + v.size()) bad(text, "'" + v + "' is not a whole number");
  return out;
}

double to_double(const std::string& text, const std::string& v) {
  double out = 0;
  auto r = std::from_chars(v.data(), v.data() + v.size(), out);
  if (r.ec != std::errc() || r.ptr != v.data() + v.size() || !std::isfinite(out))
    bad(text, "'" + v + "' is not a number");
  return out;
}

}  // namespace

std::string NetworkSpec::text() const {
  std::string out = "network ";
  for (size_t k = 0; k < layers.size(); ++k) {
    const LayerSpec& l = layers[k];
    out += (k ? "; " : "") + l.id + ":" + layer_kind_name(l.kind) + "(" + params_text(l) + ")";
    for (size_t j = 0; j < l.inputs.size(); ++j)
      out += (j ? "," : "<-") + (l.inputs[j] < 0 ? std::string() : layers[l.inputs[j]].id);
  }
  return out;
}

NetworkSpec NetworkSpec::parse(const std::string& text) {
  const std::string prefix = "network ";
  if (text.compare(0, prefix.size(), prefix) != 0) bad(text, "it does not start with 'network '");
  NetworkSpec net;
  std::map<std::string, int> ids;
  for (const std::string& item : split(text.substr(prefix.size()), "; ")) {
    const size_t colon = item.find(':'), open = item.find('('), close = item.find(')');
    if (colon == std::string::npos || open == std::string::npos || close == std::string::npos ||
        !(colon < open && open < close))
      bad(text, "layer '" + item + "' is not id:Kind(params)");
    LayerSpec l;
    l.id = item.substr(0, colon);
    if (l.id.empty() || ids.count(l.id)) bad(text, "layer id '" + l.id + "' is empty or repeated");
    const auto kind = parse_layer_kind(item.substr(colon + 1, open - colon - 1));
    if (!kind) bad(text, "unknown layer type in '" + item + "'");
    l.kind = *kind;
    const std::string params = item.substr(open + 1, close - open - 1);
    if (!params.empty())
      for (const std::string& kv : split(params, ",")) {
        const size_t eq = kv.find('=');
        if (eq == std::string::npos) bad(text, "param '" + kv + "' has no value");
        const std::string key = kv.substr(0, eq), v = kv.substr(eq + 1);
        if (key == "shape") {
          l.shape.clear();
          for (const std::string& d : split(v, "x")) l.shape.push_back(to_int(text, d));
        } else if (key == "out_channels" || key == "out_features" || key == "hidden_size" ||
                   key == "embedding_dim" || key == "num_classes" || key == "normalized_shape") {
          l.features = to_int(text, v);
        } else if (key == "kernel_size") {
          l.kernel = to_int(text, v);
        } else if (key == "stride") {
          l.stride = to_int(text, v);
        } else if (key == "padding") {
          l.padding = to_int(text, v);
        } else if (key == "groups") {
          l.groups = to_int(text, v);
        } else if (key == "bias") {
          l.bias = to_int(text, v) != 0;
        } else if (key == "eps") {
          l.eps = to_double(text, v);
        } else if (key == "momentum") {
          l.momentum = to_double(text, v);
        } else if (key == "p") {
          l.p = to_double(text, v);
        } else if (key == "num_embeddings") {
          l.vocab = to_int(text, v);
        } else if (key == "num_layers") {
          l.num_layers = to_int(text, v);
        } else if (key == "bidirectional") {
          l.bidirectional = to_int(text, v) != 0;
        } else if (key == "dropout") {
          l.dropout = to_double(text, v);
        } else if (key == "nonlinearity") {
          if (v != "tanh" && v != "relu") bad(text, "nonlinearity '" + v + "' is not tanh or relu");
          l.relu = v == "relu";
        } else if (key == "dim0") {
          l.dim0 = to_int(text, v);
        } else if (key == "dim1") {
          l.dim1 = to_int(text, v);
        } else if (key == "elementwise_affine") {
          l.affine = to_int(text, v) != 0;
        } else if (key == "num_heads") {
          l.heads = to_int(text, v);
        } else if (key == "causal") {
          l.causal = to_int(text, v) != 0;
        } else if (key == "transpose_b") {
          l.transpose_b = to_int(text, v) != 0;
        } else if (key == "scale") {
          l.scale = to_double(text, v);
        } else if (key == "max_len") {
          l.max_len = to_int(text, v);
        } else if (key == "pad_id") {
          l.pad_id = to_int(text, v);
        } else {
          bad(text, "unknown param '" + key + "'");
        }
      }
    const std::string rest = item.substr(close + 1);
    if (!rest.empty()) {
      if (rest.compare(0, 2, "<-") != 0) bad(text, "unexpected '" + rest + "' after layer " + l.id);
      for (const std::string& in : split(rest.substr(2), ",")) {
        if (in.empty() && static_cast<int>(l.inputs.size()) >= layer_required_ports(l.kind)) {
          l.inputs.push_back(-1);  // an open optional port before a wired one
          continue;
        }
        auto it = ids.find(in);
        if (it == ids.end())
          bad(text, "layer " + l.id + " reads '" + in + "', which comes later or not at all");
        l.inputs.push_back(it->second);
      }
    }
    if (static_cast<int>(l.inputs.size()) < layer_required_ports(l.kind) ||
        l.inputs.size() > layer_ports(l.kind).size() || (!l.inputs.empty() && l.inputs.back() < 0))
      bad(text, "layer " + l.id + " has " + std::to_string(l.inputs.size()) + " inputs");
    ids[l.id] = static_cast<int>(net.layers.size());
    net.layers.push_back(std::move(l));
  }
  int inputs = 0;
  for (const LayerSpec& l : net.layers) inputs += l.kind == LayerKind::Input;
  if (inputs != 1) bad(text, "it has " + std::to_string(inputs) + " Input layers");
  try {
    net.infer();
  } catch (const Error& e) {
    bad(text, e.what());
  }
  return net;
}

}  // namespace gn::nn
