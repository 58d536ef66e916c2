#!/usr/bin/python3
"""gpunodes' PyTorch peer: builds in torch the networks gpunodes builds, under the same module names (so that
state_dict keys equal gpunodes' parameter names), and moves weights through safetensors files, read and
written here by hand (no safetensors package: the format is an 8-byte length, a JSON header, raw bytes).

A MODEL argument is either a gpunodes model signature ("resnet18 classes=10 in_channels=1", optionally with
image_size=S for the sample shape) or a gpunodes graph file whose layer nodes draw the network, "GRAPH.json"
or "GRAPH.json#NETWORK_ID" when the graph has several Network nodes. Drawn networks may be sequence models:
an Input of token ids [T] (integers stored as float32 in the .f32 files, refused otherwise) or of steps
[T, F], Embedding and OneHot, RNN, GRU and LSTM (batch_first, only their output), Reshape and Transpose of the
per-sample axes, LastStep (x[:, -1]), and Linear on the last axis. And the attention layers of d2l chapter
11: LayerNorm (nn.LayerNorm), MultiheadAttention (nn.MultiheadAttention(batch_first=True) on q and, when
wired, k and v, with a causal mask when asked: query i sees keys j <= i + Tk - Tq), BatchMatMul (torch.bmm,
b transposed on request), Softmax over the last axis (causal: masked entries exactly 0), Mul, Scale,
PositionalEncoding (d2l 11.6's sinusoidal table, in float32), PositionEmbedding (a learned [T, E] added; a
shorter sequence adds its first rows), ClassToken (a learned [1, E] step prepended) and FirstStep (x[:, 0]).

  torch_peer.py selftest
  torch_peer.py logits MODEL WEIGHTS.safetensors INPUT.f32 N OUT.f32
      loads the weights with load_state_dict(strict=True) and writes the eval-mode outputs of the N samples
  torch_peer.py save MODEL SEED OUT.safetensors
      seeded torch weights, BatchNorm affine parameters drawn and running statistics moved by two training
      batches (so num_batches_tracked is 2), written as safetensors; LayerNorm's weights and biases, the
      attention's biases and class tokens are drawn too, so that none is a plain 1 or 0
  torch_peer.py reference JOB.json
      runs a reference module on weights and inputs, optionally backward from a given output gradient, and
      writes the output and every parameter's gradient as float64 (see cmd_reference); the module is the
      drawn network, or torch's own nn.TransformerEncoderLayer or a d2l ViT built of them, loaded through
      a map from its state_dict names to gpunodes' with load_state_dict(strict=True)
  torch_peer.py jobs JOBS.json
      runs a JSON list of the argument lists above in one process (torch takes seconds to import)

.f32 files hold raw float32 little-endian values. Each command prints one JSON line on stdout: the model's
state_dict keys in order and its num_batches_tracked (the largest; null without BatchNorm); logits adds the
weight file's tensor names in its header's order (file_keys) and the output's shape. Exit status 3: torch cannot be imported.
"""

import json
import math
import os
import struct
import sys

try:
    import numpy as np
    import torch
    from torch import nn
    from torch.nn import functional as F
except ImportError as e:  # the C++ suite skips on this status
    print(f"torch_peer: cannot import torch: {e}", file=sys.stderr)
    sys.exit(3)


class PeerError(Exception):
    pass


# --- safetensors ---------------------------------------------------------------------------------------------

_NP_DTYPES = {"F32": "<f4", "F64": "<f8", "F16": "<f2", "I64": "<i8", "I32": "<i4", "U8": "u1", "I8": "i1"}
_TORCH_TO_ST = {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16", torch.int64: "I64"}


def read_safetensors(path):
    """Returns ({name: tensor} in header order, metadata)."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise PeerError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", data[:8])
    if n > len(data) - 8:
        raise PeerError(f"{path}: header length {n} is past the end of the file")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", {})
    base = 8 + n
    tensors = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        raw = data[base + begin : base + end]
        dtype, shape = info["dtype"], info["shape"]
        if dtype == "BF16":
            arr = (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32)
        elif dtype in _NP_DTYPES:
            arr = np.frombuffer(raw, _NP_DTYPES[dtype])
        else:
            raise PeerError(f"{path}: tensor {name} has dtype {dtype}, which this peer does not read")
        tensors[name] = torch.from_numpy(arr.astype(arr.dtype.newbyteorder("="), copy=True).reshape(shape))
    return tensors, metadata


def safetensors_bytes(state, metadata):
    """The file's bytes: header entries and data in the state's order, the header padded with spaces to a
    multiple of 8 bytes (the reference writer's alignment)."""
    header = {"__metadata__": dict(metadata)} if metadata else {}
    chunks, offset = [], 0
    for name, t in state.items():
        t = t.detach().cpu().contiguous()
        if t.dtype not in _TORCH_TO_ST:
            raise PeerError(f"tensor {name} has dtype {t.dtype}, which this peer does not write")
        a = t.numpy()
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": _TORCH_TO_ST[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def write_safetensors(path, state, metadata):
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(safetensors_bytes(state, metadata))
    os.replace(tmp, path)


# --- the built-in architectures (runtime/src/nn/model.cpp's build(), d2l's definitions) -----------------------


class Residual(nn.Module):
    """d2l's Residual. Registration order conv1, conv2, conv3, bn1, bn2 is the state_dict order gpunodes
    follows."""

    def __init__(self, in_channels, out_channels, use_1x1conv=False, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1, stride=stride)
        self.conv2 = nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=stride) if use_1x1conv else None
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.bn2 = nn.BatchNorm2d(out_channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return F.relu(y + x)


def resnet18(classes, in_channels):
    def block(cin, cout, first):
        return nn.Sequential(Residual(cin, cout, use_1x1conv=not first, stride=1 if first else 2), Residual(cout, cout))

    net = nn.Sequential(nn.Conv2d(in_channels, 64, kernel_size=3, stride=1, padding=1), nn.BatchNorm2d(64), nn.ReLU())
    net.add_module("resnet_block1", block(64, 64, True))
    net.add_module("resnet_block2", block(64, 128, False))
    net.add_module("resnet_block3", block(128, 256, False))
    net.add_module("resnet_block4", block(256, 512, False))
    net.add_module("global_avg_pool", nn.AdaptiveAvgPool2d((1, 1)))
    net.add_module("fc", nn.Sequential(nn.Flatten(), nn.Linear(512, classes)))
    return net


def parse_signature(text):
    words = text.split()
    if not words:
        raise PeerError("empty model signature")
    opts = {"arch": words[0], "classes": 10, "in_channels": 1, "image_size": None}
    for w in words[1:]:
        key, eq, value = w.partition("=")
        if not eq or key not in opts:
            raise PeerError(f"malformed model signature '{text}'")
        opts[key] = int(value)
    return opts


def builtin_model(sig):
    """(module, sample shape or None when only the input size tells it)."""
    o = parse_signature(sig)
    c, k, s = o["in_channels"], o["classes"], o["image_size"]
    arch = o["arch"]
    if arch == "linear":
        return nn.Sequential(nn.Linear(c, k)), [c]
    if s is None and arch != "resnet18":
        s = 28
    if arch == "mlp":
        return nn.Sequential(nn.Flatten(), nn.Linear(c * s * s, 256), nn.ReLU(), nn.Linear(256, k)), [c, s, s]
    if arch == "lenet":
        side = ((s + 4 - 4) // 2 - 4) // 2
        net = nn.Sequential(
            nn.Conv2d(c, 6, kernel_size=5, padding=2), nn.Sigmoid(), nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Conv2d(6, 16, kernel_size=5), nn.Sigmoid(), nn.AvgPool2d(kernel_size=2, stride=2),
            nn.Flatten(), nn.Linear(16 * side * side, 120), nn.Sigmoid(), nn.Linear(120, 84), nn.Sigmoid(),
            nn.Linear(84, k))
        return net, [c, s, s]
    if arch == "resnet18":
        return resnet18(k, c), ([c, s, s] if s else None)
    raise PeerError(f"unknown architecture '{arch}' in signature '{sig}'")


# --- networks drawn from layer nodes -------------------------------------------------------------------------

# The layer node types' defaults (nodes/layer_nodes.cpp), for params a graph file leaves out.
LAYER_DEFAULTS = {
    "Input": {"shape": [1, 28, 28]},
    "Conv2d": {"out_channels": 16, "kernel_size": 3, "stride": 1, "padding": 0, "groups": 1, "bias": True},
    "BatchNorm2d": {"eps": 1e-5, "momentum": 0.1},
    "BatchNorm1d": {"eps": 1e-5, "momentum": 0.1},
    "ReLU": {}, "Sigmoid": {}, "Tanh": {}, "GELU": {},
    "MaxPool2d": {"kernel_size": 2, "stride": 0, "padding": 0},
    "AvgPool2d": {"kernel_size": 2, "stride": 0, "padding": 0},
    "GlobalAvgPool2d": {}, "Flatten": {},
    "Linear": {"out_features": 10, "bias": True},
    "Dropout": {"p": 0.5},
    "Add": {}, "Concat": {},
    # Sequences: a sample is [T] token ids or [T, F] steps x features (batch-first in torch).
    "Embedding": {"num_embeddings": 28, "embedding_dim": 32},
    "OneHot": {"num_classes": 28},
    "RNN": {"hidden_size": 256, "num_layers": 1, "bidirectional": False, "dropout": 0.0, "bias": True,
            "nonlinearity": "tanh"},
    "GRU": {"hidden_size": 256, "num_layers": 1, "bidirectional": False, "dropout": 0.0, "bias": True},
    "LSTM": {"hidden_size": 256, "num_layers": 1, "bidirectional": False, "dropout": 0.0, "bias": True},
    "Reshape": {"shape": [28, 28]},
    "Transpose": {"dim0": 0, "dim1": 1},
    "LastStep": {},
    # Attention and transformers (d2l chapter 11); normalized_shape 0 takes the input's last axis.
    "LayerNorm": {"normalized_shape": 0, "eps": 1e-5, "elementwise_affine": True},
    "MultiheadAttention": {"num_heads": 4, "dropout": 0.0, "bias": True, "causal": False},
    "BatchMatMul": {"transpose_b": False},
    "Softmax": {"causal": False},
    "Mul": {},
    "Scale": {"scale": 1.0},
    "PositionalEncoding": {"dropout": 0.0, "max_len": 1000},
    "PositionEmbedding": {}, "ClassToken": {}, "FirstStep": {},
    "ValidLength": {"pad_id": 1},
}


def layer_ports(kind):
    if kind == "Input":
        return []
    if kind in ("Add", "Concat", "BatchMatMul", "Mul"):
        return ["a", "b"]
    if kind == "MultiheadAttention":
        return ["q", "k", "v", "valid_lens"]
    return ["in"]


def required_ports(kind):
    """How many of the ports must be wired: all but MultiheadAttention's k, v and valid_lens (self-attention
    without k and v, v = k with only k; k and v may be open with valid_lens wired)."""
    return 1 if kind == "MultiheadAttention" else len(layer_ports(kind))


def _split_endpoint(text):
    node, dot, port = text.rpartition(".")
    if not dot:
        raise PeerError(f"connection endpoint '{text}' is not node.port")
    return node, port


def _window(size, kernel, stride, padding):
    return (size + 2 * padding - kernel) // stride + 1


def token_ids(x, vocab, what):
    """x (token ids stored as floats, as gpunodes' Tensor values are) as int64, refused unless every value is an
    integer in [0, vocab): a rounded id would hide a wrong input."""
    ids = x.long()
    if not torch.equal(ids.to(x.dtype), x):
        raise PeerError(f"{what}: the input holds values that are not integers (token ids)")
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        raise PeerError(f"{what}: token ids run from {int(ids.min())} to {int(ids.max())}, outside [0, {vocab})")
    return ids


class TokenEmbedding(nn.Embedding):
    """nn.Embedding on float-stored ids; its state_dict is nn.Embedding's ("<id>.weight")."""

    def forward(self, x):
        return super().forward(token_ids(x, self.num_embeddings, "Embedding"))


class OneHot(nn.Module):
    """F.one_hot(ids, num_classes).float(), d2l's RNN language model's input."""

    def __init__(self, classes):
        super().__init__()
        self.classes = classes

    def forward(self, x):
        return F.one_hot(token_ids(x, self.classes, "OneHot"), self.classes).float()


def _output_only(base):
    """nn.RNN, nn.GRU or nn.LSTM (batch_first=True) returning only the output y [N, T, H * directions], as the
    gpunodes layer hands on; a subclass, so that the state_dict keys are torch's own (weight_ih_l0, ...)."""

    class OutputOnly(base):
        # carry: in training, start each batch from the state the batch before ended in (when its batch size
        # is the same), detached, as gpunodes does for a sequential text and d2l's train_epoch_ch8 with its
        # sequential iterator; otherwise from zeros.
        carry, carried = False, None

        def forward(self, x):
            h0 = None
            if self.training and self.carry and self.carried is not None:
                h = self.carried[0] if isinstance(self.carried, tuple) else self.carried
                if h.shape[1] == x.shape[0]:
                    h0 = self.carried
            y, state = super().forward(x, h0)
            if self.training and self.carry:
                self.carried = tuple(s.detach() for s in state) if isinstance(state, tuple) else state.detach()
            return y

    OutputOnly.__name__ = base.__name__
    return OutputOnly


RNN, GRU, LSTM = _output_only(nn.RNN), _output_only(nn.GRU), _output_only(nn.LSTM)


class Reshape(nn.Module):
    """The same values per sample in another shape: x.reshape(N, *shape)."""

    def __init__(self, shape):
        super().__init__()
        self.shape = list(shape)

    def forward(self, x):
        return x.reshape([x.shape[0]] + self.shape)


class Transpose(nn.Module):
    """Swaps two per-sample axes (already made non-negative): x.transpose(1 + dim0, 1 + dim1)."""

    def __init__(self, dim0, dim1):
        super().__init__()
        self.dim0, self.dim1 = dim0, dim1

    def forward(self, x):
        return x.transpose(1 + self.dim0, 1 + self.dim1)


class LastStep(nn.Module):
    """x[:, -1]: [N, T, F] -> [N, F]."""

    def forward(self, x):
        return x[:, -1]


# --- the attention layers (d2l chapter 11) --------------------------------------------------------------------


def causal_mask(tq, tk, device=None):
    """True where query i may not see key j: j > i + tk - tq. With as many keys as queries that is every later
    key; with more keys they are aligned to the end (the extra ones come first, and every query sees them)."""
    return torch.ones(tq, tk, dtype=torch.bool, device=device).triu(1 + tk - tq)


class Attention(nn.MultiheadAttention):
    """nn.MultiheadAttention(E, num_heads, dropout, bias, batch_first=True) as the gpunodes layer calls it:
    mha(q, k, v, need_weights=False, attn_mask=the causal mask when asked), k = q and v = k where they are not
    wired. A subclass, so that the state_dict keys are torch's own (in_proj_weight, in_proj_bias,
    out_proj.weight, out_proj.bias)."""

    def __init__(self, e, heads, dropout, bias, causal):
        super().__init__(e, heads, dropout=dropout, bias=bias, batch_first=True)
        self.causal = causal

    def forward(self, q, k=None, v=None, valid_lens=None):
        k = q if k is None else k
        v = k if v is None else v
        mask = causal_mask(q.shape[1], k.shape[1], q.device) if self.causal else None
        if valid_lens is None:
            return super().forward(q, k, v, need_weights=False, attn_mask=mask)[0]
        # d2l's masked softmax as torch says it: key_padding_mask = arange(Tk) >= len. A sample of length 0
        # would be all masked, which torch makes NaN; gpunodes gives it all-zero weights, so its output is
        # out_proj's bias: that sample attends unmasked here and its output is replaced (no gradient reaches
        # the inputs or in_proj through it, as in gpunodes).
        lens = valid_lens.reshape(-1, 1)
        pad = torch.arange(k.shape[1], device=q.device, dtype=lens.dtype)[None, :] >= lens
        empty = (lens <= 0).reshape(-1)
        pad = pad & ~empty[:, None]
        y = super().forward(q, k, v, need_weights=False, attn_mask=mask, key_padding_mask=pad)[0]
        bias = self.out_proj.bias if self.out_proj.bias is not None else torch.zeros_like(y[0, 0])
        return torch.where(empty[:, None, None], bias.expand_as(y), y)


class ValidLength(nn.Module):
    """d2l's valid_len = (X != pad).sum(1): token ids [N, T] -> [N, 1], as the inputs' dtype."""

    def __init__(self, pad_id):
        super().__init__()
        self.pad_id = pad_id

    def forward(self, x):
        return (x != self.pad_id).sum(1, keepdim=True).to(x.dtype)


class BatchMatMul(nn.Module):
    """torch.bmm(a, b), or torch.bmm(a, b.transpose(1, 2)) with transpose_b (d2l 11.3's queries by keys)."""

    def __init__(self, transpose_b):
        super().__init__()
        self.transpose_b = transpose_b

    def forward(self, a, b):
        return torch.bmm(a, b.transpose(1, 2) if self.transpose_b else b)


class Mul(nn.Module):
    def forward(self, a, b):
        return a * b


class Scale(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


class Softmax(nn.Module):
    """Softmax over the last axis; causal masks each row's later columns (causal_mask) with -inf, so that they
    get exactly 0 (d2l's masked_softmax fills -1e6, which gives 0 in float32 too)."""

    def __init__(self, causal):
        super().__init__()
        self.causal = causal

    def forward(self, x):
        if self.causal:
            x = x.masked_fill(causal_mask(x.shape[-2], x.shape[-1], x.device), float("-inf"))
        return x.softmax(-1)


def sinusoid_table(max_len, e):
    """d2l 11.6's P [max_len, E], in float32 as d2l computes it: X = t / 10000^(2i / E), P[t, 2i] = sin(X),
    P[t, 2i + 1] = cos(X)."""
    x = torch.arange(max_len, dtype=torch.float32).reshape(-1, 1) / torch.pow(
        10000, torch.arange(0, e, 2, dtype=torch.float32) / e)
    p = torch.zeros(max_len, e)
    p[:, 0::2] = torch.sin(x)
    p[:, 1::2] = torch.cos(x)
    return p


class PositionalEncoding(nn.Module):
    """d2l 11.6's PositionalEncoding: X + P[:T], then dropout. P is no parameter (a buffer left out of the
    state_dict)."""

    def __init__(self, e, dropout, max_len):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("P", sinusoid_table(max_len, e), persistent=False)

    def forward(self, x):
        return self.dropout(x + self.P[: x.shape[1]].to(x.dtype))


class PositionEmbedding(nn.Module):
    """A learned position embedding, weight [T, E] from N(0, 1) (d2l 11.8's pos_embedding without its batch
    axis); a shorter sequence adds its first rows."""

    def __init__(self, t, e):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(t, e))

    def forward(self, x):
        return x + self.weight[: x.shape[1]]


class ClassToken(nn.Module):
    """d2l 11.8's cls_token, weight [1, E] (zeros at first), before the first step: [N, T, E] -> [N, T + 1, E]."""

    def __init__(self, e):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(1, e))

    def forward(self, x):
        return torch.cat([self.weight.unsqueeze(0).expand(x.shape[0], -1, -1), x], dim=1)


class FirstStep(nn.Module):
    """x[:, 0]: [N, T, F] -> [N, F], what a ViT's head reads (its class token)."""

    def forward(self, x):
        return x[:, 0]



class GraphNet(nn.Module):
    """The network a Network node draws: the layer nodes reachable upstream from its `out` input, each layer's
    module registered under its node id (state_dict keys "<id>.weight", ...) in a depth-first order that
    takes inputs in port order."""

    def __init__(self, graph, network_id=None):
        super().__init__()
        nodes = {n["id"]: n for n in graph.get("nodes", [])}
        wires = {}
        for c in graph.get("connections", []):
            src, _ = _split_endpoint(c["from"])
            dst, port = _split_endpoint(c["to"])
            wires[(dst, port)] = src
        networks = [i for i, n in nodes.items() if n["type"] == "Network"]
        if network_id is None:
            if len(networks) != 1:
                raise PeerError(f"the graph has {len(networks)} Network nodes; name one as GRAPH.json#ID")
            network_id = networks[0]
        if network_id not in networks:
            raise PeerError(f"the graph has no Network node '{network_id}'")
        if (network_id, "out") not in wires:
            raise PeerError(f"Network '{network_id}' has nothing wired into its out input")

        order, state, wired = [], {}, {}

        def visit(nid):
            if state.get(nid) == "done":
                return
            if state.get(nid) == "open":
                raise PeerError(f"the layers form a cycle through '{nid}'")
            if nid not in nodes:
                raise PeerError(f"a connection names the missing node '{nid}'")
            kind = nodes[nid]["type"]
            if kind not in LAYER_DEFAULTS:
                raise PeerError(f"node '{nid}' of type {kind} is not a layer")
            state[nid] = "open"
            ports = layer_ports(kind)
            wired[nid] = []
            for i, port in enumerate(ports):
                if (nid, port) not in wires:
                    if i < required_ports(kind):
                        raise PeerError(f"layer '{nid}' has nothing wired into its {port} input")
                    wired[nid].append(None)  # an open optional port (a hole when a later one is wired)
                    continue
                wired[nid].append(port)
                visit(wires[(nid, port)])
            while wired[nid] and wired[nid][-1] is None:
                wired[nid].pop()
            if kind == "MultiheadAttention" and len(wired[nid]) > 2 and wired[nid][2] and not wired[nid][1]:
                raise PeerError(f"layer '{nid}' has v wired but not k")
            state[nid] = "done"
            order.append(nid)

        visit(wires[(network_id, "out")])
        inputs = [i for i in order if nodes[i]["type"] == "Input"]
        if len(inputs) != 1:
            raise PeerError(f"the network needs exactly one Input layer, it has {len(inputs)}: {inputs}")

        self.order = order
        self.kinds = {i: nodes[i]["type"] for i in order}
        self.sources = {i: [wires[(i, p)] if p else None for p in wired[i]] for i in order}
        self.output_id = order[-1]
        shapes = {}
        for nid in order:
            kind = self.kinds[nid]
            p = dict(LAYER_DEFAULTS[kind])
            p.update(nodes[nid].get("params", {}))
            ins = [shapes[s] if s else None for s in self.sources[nid]]
            module, shapes[nid] = self._layer(nid, kind, p, ins)
            if module is not None:
                if "." in nid or not nid:
                    raise PeerError(f"node id '{nid}' cannot name a torch module")
                self.add_module(nid, module)
        self.sample_shape = list(shapes[inputs[0]])
        self.out_shape = shapes[self.output_id]
        # The vocabulary that token-id inputs must fit (the smallest Embedding or OneHot reading them), for
        # drawing inputs; None when the network reads no token ids.
        vocabs = [m.num_embeddings if isinstance(m, TokenEmbedding) else m.classes for m in self.children()
                  if isinstance(m, (TokenEmbedding, OneHot))]
        self.token_vocab = min(vocabs) if vocabs else None

    @staticmethod
    def _layer(nid, kind, p, ins):
        """(torch module or None, output shape per sample); checks the shapes as gpunodes does."""

        def need(rank):
            if len(ins[0]) != rank:
                raise PeerError(f"layer '{nid}' ({kind}) needs a rank-{rank} sample, got {ins[0]}")
            return ins[0]

        if kind == "Input":
            shape = [int(d) for d in p["shape"]]
            if len(shape) not in (1, 2, 3) or min(shape) < 1:
                raise PeerError(f"Input '{nid}' has shape {shape}; expected [C, H, W], [T, F] or [features] "
                                "(token ids [T])")
            return None, shape
        if kind == "Conv2d":
            c, h, w = need(3)
            k, s, pad, g = (int(p[x]) for x in ("kernel_size", "stride", "padding", "groups"))
            out = int(p["out_channels"])
            m = nn.Conv2d(c, out, kernel_size=k, stride=s, padding=pad, groups=g, bias=bool(p["bias"]))
            return m, [out, _window(h, k, s, pad), _window(w, k, s, pad)]
        if kind == "BatchNorm2d":
            return nn.BatchNorm2d(need(3)[0], eps=float(p["eps"]), momentum=float(p["momentum"])), ins[0]
        if kind == "BatchNorm1d":
            return nn.BatchNorm1d(need(1)[0], eps=float(p["eps"]), momentum=float(p["momentum"])), ins[0]
        if kind in ("ReLU", "Sigmoid", "Tanh", "GELU"):
            return getattr(nn, kind)(), ins[0]
        if kind in ("MaxPool2d", "AvgPool2d"):
            c, h, w = need(3)
            k, pad = int(p["kernel_size"]), int(p["padding"])
            s = int(p["stride"]) or k
            m = getattr(nn, kind)(kernel_size=k, stride=s, padding=pad)
            return m, [c, _window(h, k, s, pad), _window(w, k, s, pad)]
        if kind == "GlobalAvgPool2d":
            return nn.AdaptiveAvgPool2d((1, 1)), [need(3)[0], 1, 1]
        if kind == "Flatten":
            return nn.Flatten(), [math.prod(ins[0])]
        if kind == "Linear":  # on the last axis: [F] or each step of [T, F]
            out = int(p["out_features"])
            if len(ins[0]) not in (1, 2):
                raise PeerError(f"layer '{nid}' (Linear) needs a [features] or [T, F] sample, got {ins[0]}")
            return nn.Linear(ins[0][-1], out, bias=bool(p["bias"])), ins[0][:-1] + [out]
        if kind == "Embedding":
            (t,) = need(1)
            vocab, dim = int(p["num_embeddings"]), int(p["embedding_dim"])
            return TokenEmbedding(vocab, dim), [t, dim]
        if kind == "OneHot":
            (t,) = need(1)
            return OneHot(int(p["num_classes"])), [t, int(p["num_classes"])]
        if kind in ("RNN", "GRU", "LSTM"):
            t, f = need(2)
            h, layers, bi = int(p["hidden_size"]), int(p["num_layers"]), bool(p["bidirectional"])
            extra = {"nonlinearity": p["nonlinearity"]} if kind == "RNN" else {}
            if extra and extra["nonlinearity"] not in ("tanh", "relu"):
                raise PeerError(f"RNN '{nid}' has nonlinearity '{extra['nonlinearity']}'")
            m = {"RNN": RNN, "GRU": GRU, "LSTM": LSTM}[kind](
                f, h, num_layers=layers, bias=bool(p["bias"]), batch_first=True, dropout=float(p["dropout"]),
                bidirectional=bi, **extra)
            return m, [t, h * (2 if bi else 1)]
        if kind == "Reshape":
            shape, values = [int(d) for d in p["shape"]], math.prod(ins[0])
            known = math.prod(d for d in shape if d != -1)
            if shape.count(-1) > 1 or any(d < 1 and d != -1 for d in shape) or not 1 <= len(shape) <= 4:
                raise PeerError(f"Reshape '{nid}' has shape {shape}")
            if -1 in shape:
                if values % known:
                    raise PeerError(f"Reshape '{nid}': {shape} cannot hold the {values} values of {ins[0]}")
                shape[shape.index(-1)] = values // known
            if math.prod(shape) != values:
                raise PeerError(f"Reshape '{nid}': {shape} cannot hold the {values} values of {ins[0]}")
            return Reshape(shape), shape
        if kind == "Transpose":
            rank = len(ins[0])
            dims = []
            for key in ("dim0", "dim1"):
                d = int(p[key])
                if not -rank <= d < rank:
                    raise PeerError(f"Transpose '{nid}': {key}={d} is not an axis of {ins[0]}")
                dims.append(d % rank)
            out = list(ins[0])
            out[dims[0]], out[dims[1]] = out[dims[1]], out[dims[0]]
            return Transpose(*dims), out
        if kind == "LastStep":
            return LastStep(), [need(2)[1]]
        if kind == "Dropout":
            return nn.Dropout(float(p["p"])), ins[0]
        if kind == "Add":
            if ins[0] != ins[1]:
                raise PeerError(f"Add '{nid}' takes a {ins[0]} and b {ins[1]}: they must be equal")
            return None, ins[0]
        if kind == "Concat":
            if ins[0][1:] != ins[1][1:]:
                raise PeerError(f"Concat '{nid}' takes a {ins[0]} and b {ins[1]}: all but the first must match")
            return None, [ins[0][0] + ins[1][0]] + ins[0][1:]
        if kind == "LayerNorm":
            ns = int(p["normalized_shape"])
            if ns not in (0, ins[0][-1]):
                raise PeerError(f"LayerNorm '{nid}' normalizes the last axis of {ins[0]}, not {ns} values")
            affine = bool(p["elementwise_affine"])
            return nn.LayerNorm(ins[0][-1], eps=float(p["eps"]), elementwise_affine=affine), ins[0]
        if kind == "MultiheadAttention":
            q = ins[0]
            k = ins[1] if len(ins) > 1 and ins[1] else q
            v = ins[2] if len(ins) > 2 and ins[2] else k
            if len(ins) > 3 and ins[3] != [1]:
                raise PeerError(f"MultiheadAttention '{nid}': valid_lens must be [1] per sample, got {ins[3]}")
            if any(len(s) != 2 for s in (q, k, v)):
                raise PeerError(f"MultiheadAttention '{nid}' needs [T, E] sequences, got q {q}, k {k}, v {v}")
            e, heads = q[1], int(p["num_heads"])
            if heads < 1 or e % heads:
                raise PeerError(f"MultiheadAttention '{nid}': num_heads={heads} must divide E={e}")
            if k[1] != e or v[1] != e or v[0] != k[0]:
                raise PeerError(f"MultiheadAttention '{nid}': q {q}, k {k} and v {v} do not fit")
            if bool(p["causal"]) and q[0] > k[0]:
                raise PeerError(f"MultiheadAttention '{nid}': a causal one needs as many keys as queries")
            return Attention(e, heads, float(p["dropout"]), bool(p["bias"]), bool(p["causal"])), q
        if kind == "BatchMatMul":
            a, b = ins
            tb = bool(p["transpose_b"])
            if len(a) != 2 or len(b) != 2 or a[1] != (b[1] if tb else b[0]):
                raise PeerError(f"BatchMatMul '{nid}' cannot multiply a {a} by b {b}{' transposed' if tb else ''}")
            return BatchMatMul(tb), [a[0], b[0] if tb else b[1]]
        if kind == "Softmax":
            causal = bool(p["causal"])
            if causal and (len(ins[0]) != 2 or ins[0][0] > ins[0][1]):
                raise PeerError(f"Softmax '{nid}': a causal one needs [queries, keys] scores, got {ins[0]}")
            return Softmax(causal), ins[0]
        if kind == "Mul":
            if ins[0] != ins[1]:
                raise PeerError(f"Mul '{nid}' takes a {ins[0]} and b {ins[1]}: they must be equal")
            return Mul(), ins[0]
        if kind == "Scale":
            return Scale(float(p["scale"])), ins[0]
        if kind == "PositionalEncoding":
            t, e = need(2)
            if t > int(p["max_len"]) or e % 2:
                raise PeerError(f"PositionalEncoding '{nid}' takes {ins[0]}: at most max_len steps, E even")
            return PositionalEncoding(e, float(p["dropout"]), int(p["max_len"])), ins[0]
        if kind == "PositionEmbedding":
            t, e = need(2)
            return PositionEmbedding(t, e), ins[0]
        if kind == "ClassToken":
            t, e = need(2)
            return ClassToken(e), [t + 1, e]
        if kind == "FirstStep":
            return FirstStep(), [need(2)[1]]
        if kind == "ValidLength":
            need(1)
            return ValidLength(int(p["pad_id"])), [1]
        raise PeerError(f"layer '{nid}' has the unknown type {kind}")

    def forward(self, x):
        values = {}
        for nid in self.order:
            kind, src = self.kinds[nid], self.sources[nid]
            if kind == "Input":
                values[nid] = x
            elif kind == "Add":
                values[nid] = values[src[0]] + values[src[1]]
            elif kind == "Concat":
                values[nid] = torch.cat([values[src[0]], values[src[1]]], dim=1)
            else:  # the layers of several inputs (BatchMatMul, Mul, MultiheadAttention) take them in port order
                values[nid] = getattr(self, nid)(*[values[s] if s else None for s in src])
        return values[self.output_id]


def graph_model(graph, network_id=None):
    net = GraphNet(graph, network_id)
    return net, net.sample_shape


def load_model_spec(spec):
    """(module, sample shape or None) from a signature or GRAPH.json[#NETWORK_ID]."""
    path, _, network_id = spec.partition("#")
    if os.path.isfile(path):
        with open(path, encoding="utf-8") as f:
            return graph_model(json.load(f), network_id or None)
    return builtin_model(spec)


# --- commands ------------------------------------------------------------------------------------------------


def read_inputs(path, n, sample_shape, in_channels_hint=None):
    x = np.fromfile(path, dtype="<f4").astype(np.float32)
    if n < 1 or x.size % n:
        raise PeerError(f"{path}: {x.size} values do not split into {n} samples")
    if sample_shape is None:  # resnet18 without image_size: square images of the size the values give
        per = x.size // n
        c = in_channels_hint or 1
        side = int(round(math.sqrt(per // c)))
        sample_shape = [c, side, side]
    if math.prod(sample_shape) * n != x.size:
        raise PeerError(f"{path}: {x.size} values are not {n} samples of {sample_shape}")
    return torch.from_numpy(x.reshape([n] + list(sample_shape)))


def cmd_logits(spec, weights, inputs, n, out):
    model, sample = load_model_spec(spec)
    tensors, _ = read_safetensors(weights)
    model.load_state_dict(tensors, strict=True)
    model.eval()
    hint = parse_signature(spec)["in_channels"] if sample is None else None
    with torch.no_grad():
        y = model(read_inputs(inputs, int(n), sample, hint))
    y.numpy().astype("<f4").tofile(out)
    state = model.state_dict()
    tracked = [int(v) for k, v in state.items() if k.endswith("num_batches_tracked")]
    return {"keys": list(state.keys()), "file_keys": list(tensors.keys()), "out_shape": list(y.shape),
            "num_batches_tracked": max(tracked) if tracked else None}


def cmd_save(spec, seed, out):
    torch.manual_seed(int(seed))
    model, sample = load_model_spec(spec)
    if sample is None:
        sample = [parse_signature(spec)["in_channels"], 16, 16]
    with torch.no_grad():
        for m in model.modules():
            norm = isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d))
            if norm or (isinstance(m, nn.LayerNorm) and m.weight is not None):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
            if isinstance(m, nn.MultiheadAttention) and m.in_proj_bias is not None:  # torch starts them at 0
                m.in_proj_bias.uniform_(-0.2, 0.2)
                m.out_proj.bias.uniform_(-0.2, 0.2)
            if isinstance(m, ClassToken):
                m.weight.normal_()
        # Two training batches move the running statistics off their start and count num_batches_tracked.
        model.train()
        vocab = getattr(model, "token_vocab", None)
        for _ in range(2):
            shape = [4] + list(sample)
            model(torch.randint(0, vocab, shape).float() if vocab else torch.randn(shape))
    model.eval()
    state = model.state_dict()
    write_safetensors(out, state, {"format": "pt"})
    tracked = [int(v) for k, v in state.items() if k.endswith("num_batches_tracked")]
    return {"keys": list(state.keys()), "num_batches_tracked": max(tracked) if tracked else None}


# --- reference modules: torch's own transformer layers, loaded from gpunodes' names ------------------------------


class EncoderLayerRef(nn.Module):
    """Token ids through an embedding (the drawn graph's first layer: with one id per sample and step its
    gradient is the block's input gradient) into torch's nn.TransformerEncoderLayer (dropout 0, batch_first):
    norm_first=True is d2l 11.8's ViTBlock, norm_first=False with ReLU d2l 11.7's post-norm
    TransformerEncoderBlock."""

    def __init__(self, o):
        super().__init__()
        e = int(o["d_model"])
        self.embedding = TokenEmbedding(int(o["vocab"]), e)
        self.layer = nn.TransformerEncoderLayer(
            e, int(o["nhead"]), int(o["dim_feedforward"]), dropout=0.0, activation=o["activation"],
            layer_norm_eps=float(o.get("eps", 1e-5)), batch_first=True, norm_first=bool(o["norm_first"]))

    def forward(self, x):
        return self.layer(self.embedding(x))


class ViTRef(nn.Module):
    """d2l 11.8's ViT written out in torch: the patch embedding (Conv2d with stride = patch, flatten(2),
    transpose(1, 2)), cls_token [1, 1, E] before the patches, pos_embedding [1, patches + 1, E] added, blocks of
    nn.TransformerEncoderLayer(norm_first=True, activation="gelu", dropout 0, batch_first), and the head:
    LayerNorm and Linear on the class token's step."""

    def __init__(self, o):
        super().__init__()
        c, size, patch, e = int(o["channels"]), int(o["image_size"]), int(o["patch"]), int(o["d_model"])
        eps = float(o.get("eps", 1e-5))
        self.patch_embedding = nn.Conv2d(c, e, kernel_size=patch, stride=patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, e))
        self.pos_embedding = nn.Parameter(torch.randn(1, (size // patch) ** 2 + 1, e))
        self.blks = nn.ModuleList(
            nn.TransformerEncoderLayer(e, int(o["nhead"]), int(o["dim_feedforward"]), dropout=0.0,
                                       activation="gelu", layer_norm_eps=eps, batch_first=True, norm_first=True)
            for _ in range(int(o["blocks"])))
        self.head = nn.Sequential(nn.LayerNorm(e, eps=eps), nn.Linear(e, int(o["classes"])))
        self.sample_shape = [c, size, size]

    def forward(self, x):
        x = self.patch_embedding(x).flatten(2).transpose(1, 2)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embedding
        for blk in self.blks:
            x = blk(x)
        return self.head(x[:, 0])


REFERENCES = {"encoder_layer": EncoderLayerRef, "vit": ViTRef}


def load_mapped(module, tensors, names):
    """Loads the file's tensors into `module` with load_state_dict(strict=True), `names` mapping each of the
    module's state_dict names to the file's (gpunodes') name: every file tensor must be used once (BatchNorm's
    num_batches_tracked aside). A tensor of another shape but the same values (d2l's [1, 1, E] cls_token
    against gpunodes' [1, E]) is reshaped; returns those names."""
    want = module.state_dict()
    state, reshaped, used = {}, [], {}
    for ref, gn in names.items():
        if gn not in tensors:
            raise PeerError(f"the weights have no tensor {gn} (mapped to {ref})")
        if gn in used:
            raise PeerError(f"{gn} is mapped to both {used[gn]} and {ref}")
        used[gn] = ref
        t = tensors[gn]
        if ref in want and tuple(want[ref].shape) != tuple(t.shape):
            if want[ref].numel() != t.numel():
                raise PeerError(f"{gn} {list(t.shape)} cannot be {ref} {list(want[ref].shape)}")
            t = t.reshape(want[ref].shape)
            reshaped.append(ref)
        state[ref] = t
    unused = [k for k in tensors if k not in used and not k.endswith("num_batches_tracked")]
    if unused:
        raise PeerError(f"the weights hold {unused}, which the name map leaves out")
    module.load_state_dict(state, strict=True)
    return reshaped


def cmd_reference(job_path):
    """JOB.json: {"model": MODEL (the drawn network, unless "reference" says otherwise), "reference": {"kind":
    "encoder_layer" | "vit", ...its sizes} with "names": {its state_dict name: gpunodes' name}, "weights":
    WEIGHTS.safetensors, "x": INPUT.f32, "n": N, "sample": its shape per sample (optional: the model's by
    default), "dtype": "float64" | "float32", "mode": "train" | "eval", "dy": DY.f32 (optional: the output's
    gradient, for a backward pass), "out": OUT.f64}. Writes the output,
    then (with dy) the gradient of every parameter in the module's order, as float64; prints their gpunodes
    names and shapes ("grads"), the output's shape, the module's state_dict keys and the file's."""
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    tensors, _ = read_safetensors(job["weights"])
    ref = job.get("reference")
    if ref:
        if ref.get("kind") not in REFERENCES:
            raise PeerError(f"unknown reference module {ref.get('kind')}; known: {sorted(REFERENCES)}")
        model = REFERENCES[ref["kind"]](ref)
        names = dict(job["names"])
        reshaped = load_mapped(model, tensors, names)
        sample = getattr(model, "sample_shape", None)
        if sample is None:
            sample = [int(ref["steps"])]
    else:
        model, sample = load_model_spec(job["model"])
        model.load_state_dict(tensors, strict=True)
        names, reshaped = {k: k for k in model.state_dict()}, []
    if job.get("sample"):  # another length than the drawn Input's (a shorter sequence)
        sample = [int(d) for d in job["sample"]]
    dtype = {"float64": torch.float64, "float32": torch.float32}[job.get("dtype", "float64")]
    model.to(dtype)
    model.train(job.get("mode", "train") == "train")
    n = int(job["n"])
    x = read_inputs(job["x"], n, sample).to(dtype)
    backward = bool(job.get("dy"))
    with torch.set_grad_enabled(backward):
        y = model(x)
    chunks, grads = [y.detach().double().reshape(-1)], []
    if backward:
        dy = torch.from_numpy(np.fromfile(job["dy"], dtype="<f4").astype(np.float32))
        if dy.numel() != y.numel():
            raise PeerError(f"{job['dy']}: {dy.numel()} values for an output of {list(y.shape)}")
        y.backward(dy.reshape(y.shape).to(dtype))
        for name, prm in model.named_parameters():
            g = prm.grad if prm.grad is not None else torch.zeros_like(prm)
            grads.append([names[name], list(tensors[names[name]].shape)])
            chunks.append(g.detach().double().reshape(-1))
    torch.cat(chunks).numpy().astype("<f8").tofile(job["out"])
    return {"out_shape": list(y.shape), "grads": grads, "keys": list(model.state_dict().keys()),
            "file_keys": list(tensors.keys()), "reshaped": reshaped}


def run(argv):
    if not argv:
        raise PeerError("usage: torch_peer.py selftest | logits ... | save ... | reference JOB.json | jobs JOBS.json")
    cmd, args = argv[0], argv[1:]
    if cmd == "logits" and len(args) == 5:
        return cmd_logits(*args)
    if cmd == "save" and len(args) == 3:
        return cmd_save(*args)
    if cmd == "reference" and len(args) == 1:
        return cmd_reference(*args)
    if cmd == "selftest" and not args:
        return selftest()
    raise PeerError(f"bad command line: {' '.join(argv)}")


# --- self-test -----------------------------------------------------------------------------------------------

TINY_GRAPH = {
    "format": "gpunodes-graph",
    "version": 1,
    "nodes": [
        {"id": "x", "type": "Input", "params": {"shape": [3, 8, 8]}},
        {"id": "conv1", "type": "Conv2d", "params": {"out_channels": 4, "kernel_size": 3, "padding": 1}},
        {"id": "bn1", "type": "BatchNorm2d", "params": {}},
        {"id": "relu1", "type": "ReLU"},
        {"id": "pool", "type": "MaxPool2d", "params": {"kernel_size": 2}},
        {"id": "dw", "type": "Conv2d", "params": {"out_channels": 4, "kernel_size": 1, "groups": 2, "bias": False}},
        {"id": "sum", "type": "Add"},
        {"id": "cat", "type": "Concat"},
        {"id": "avg", "type": "AvgPool2d", "params": {"kernel_size": 2, "stride": 0, "padding": 1}},
        {"id": "gap", "type": "GlobalAvgPool2d"},
        {"id": "flat", "type": "Flatten"},
        {"id": "drop", "type": "Dropout", "params": {"p": 0.25}},
        {"id": "fc1", "type": "Linear", "params": {"out_features": 6}},
        {"id": "bn2", "type": "BatchNorm1d", "params": {"eps": 1e-3}},
        {"id": "act", "type": "GELU"},
        {"id": "tanh", "type": "Tanh"},
        {"id": "sig", "type": "Sigmoid"},
        {"id": "fc2", "type": "Linear", "params": {"out_features": 3, "bias": False}},
        {"id": "stray", "type": "Linear", "params": {"out_features": 2}},
        {"id": "net", "type": "Network", "params": {"seed": 0}},
        {"id": "data", "type": "Dataset", "params": {}},
    ],
    "connections": [
        {"from": "x.out", "to": "conv1.in"},
        {"from": "conv1.out", "to": "bn1.in"},
        {"from": "bn1.out", "to": "relu1.in"},
        {"from": "relu1.out", "to": "pool.in"},
        {"from": "pool.out", "to": "dw.in"},
        {"from": "pool.out", "to": "sum.a"},
        {"from": "dw.out", "to": "sum.b"},
        {"from": "sum.out", "to": "cat.a"},
        {"from": "pool.out", "to": "cat.b"},
        {"from": "cat.out", "to": "avg.in"},
        {"from": "avg.out", "to": "gap.in"},
        {"from": "gap.out", "to": "flat.in"},
        {"from": "flat.out", "to": "drop.in"},
        {"from": "drop.out", "to": "fc1.in"},
        {"from": "fc1.out", "to": "bn2.in"},
        {"from": "bn2.out", "to": "act.in"},
        {"from": "act.out", "to": "tanh.in"},
        {"from": "tanh.out", "to": "sig.in"},
        {"from": "sig.out", "to": "fc2.in"},
        {"from": "fc2.out", "to": "net.out"},
        {"from": "x.out", "to": "stray.in"},
    ],
}


# Every sequence layer: token ids embedded and one-hot, a stacked bidirectional LSTM added to a bias-free GRU,
# reshaped and transposed (axes counted from the end too), an RNN with ReLU, Linear on each step, the last step.
SEQ_GRAPH = {
    "nodes": [
        {"id": "x", "type": "Input", "params": {"shape": [6]}},
        {"id": "emb", "type": "Embedding", "params": {"num_embeddings": 10, "embedding_dim": 4}},
        {"id": "oh", "type": "OneHot", "params": {"num_classes": 11}},
        {"id": "lstm", "type": "LSTM", "params": {"hidden_size": 3, "num_layers": 2, "bidirectional": True,
                                                  "dropout": 0.5}},
        {"id": "gru", "type": "GRU", "params": {"hidden_size": 6, "bias": False}},
        {"id": "sum", "type": "Add"},
        {"id": "rs", "type": "Reshape", "params": {"shape": [3, -1]}},
        {"id": "tr", "type": "Transpose", "params": {"dim0": -1, "dim1": 0}},
        {"id": "rnn", "type": "RNN", "params": {"hidden_size": 5, "nonlinearity": "relu"}},
        {"id": "fcs", "type": "Linear", "params": {"out_features": 4}},
        {"id": "last", "type": "LastStep"},
        {"id": "fc", "type": "Linear", "params": {"out_features": 2, "bias": False}},
        {"id": "net", "type": "Network"},
    ],
    "connections": [
        {"from": "x.out", "to": "emb.in"}, {"from": "x.out", "to": "oh.in"}, {"from": "emb.out", "to": "lstm.in"},
        {"from": "oh.out", "to": "gru.in"}, {"from": "lstm.out", "to": "sum.a"}, {"from": "gru.out", "to": "sum.b"},
        {"from": "sum.out", "to": "rs.in"}, {"from": "rs.out", "to": "tr.in"}, {"from": "tr.out", "to": "rnn.in"},
        {"from": "rnn.out", "to": "fcs.in"}, {"from": "fcs.out", "to": "last.in"}, {"from": "last.out", "to": "fc.in"},
        {"from": "fc.out", "to": "net.out"},
    ],
}


def _sequence_selftest():
    torch.manual_seed(2)
    net = GraphNet(SEQ_GRAPH)
    assert net.order == ["x", "emb", "lstm", "oh", "gru", "sum", "rs", "tr", "rnn", "fcs", "last", "fc"], net.order
    rnn_keys = lambda m, layers, sfxs, bias=True: [f"{m}.{w}_l{l}{s}" for l in range(layers) for s in sfxs
                                                   for w in (("weight_ih", "weight_hh", "bias_ih", "bias_hh")
                                                             if bias else ("weight_ih", "weight_hh"))]
    keys = list(net.state_dict().keys())
    want = (["emb.weight"] + rnn_keys("lstm", 2, ("", "_reverse")) + rnn_keys("gru", 1, ("",), bias=False) +
            rnn_keys("rnn", 1, ("",)) + ["fcs.weight", "fcs.bias", "fc.weight"])
    assert keys == want, keys
    assert net.sample_shape == [6] and net.out_shape == [2] and net.token_vocab == 10
    assert tuple(net.lstm.weight_ih_l1.shape) == (12, 6) and tuple(net.lstm.weight_hh_l0_reverse.shape) == (12, 3)
    assert net.lstm.num_layers == 2 and net.lstm.dropout == 0.5 and net.gru.bias is False
    assert net.lstm.batch_first and net.gru.batch_first and net.rnn.batch_first and net.rnn.nonlinearity == "relu"
    assert tuple(net.gru.weight_ih_l0.shape) == (18, 11) and tuple(net.rnn.weight_ih_l0.shape) == (5, 3)
    assert net.rs.shape == [3, 12] and (net.tr.dim0, net.tr.dim1) == (1, 0)
    net.eval()
    x = torch.randint(0, 10, (4, 6)).float()
    with torch.no_grad():
        y = net(x)
        # The same network from torch's own modules and ops, with the builder's weights.
        s = net.state_dict()
        sub = lambda m: {k.split(".", 1)[1]: v for k, v in s.items() if k.startswith(m + ".")}
        lstm = nn.LSTM(4, 3, num_layers=2, bidirectional=True, batch_first=True)
        lstm.load_state_dict(sub("lstm"))
        gru = nn.GRU(11, 6, bias=False, batch_first=True)
        gru.load_state_dict(sub("gru"))
        rnn = nn.RNN(3, 5, nonlinearity="relu", batch_first=True)
        rnn.load_state_dict(sub("rnn"))
        ids = x.long()
        h = lstm(F.embedding(ids, s["emb.weight"]))[0] + gru(F.one_hot(ids, 11).float())[0]
        h = h.reshape(4, 3, 12).transpose(2, 1)
        h = F.linear(rnn(h)[0], s["fcs.weight"], s["fcs.bias"])
        want = F.linear(h[:, -1, :], s["fc.weight"])
    assert y.shape == (4, 2) and torch.allclose(y, want, rtol=1e-5, atol=1e-6), (y, want)
    _expect_error(lambda: net(x + 0.5), "not integers")
    _expect_error(lambda: net(x + 5), "outside [0, 10)")
    # Shapes the builder refuses, as gpunodes does.
    import copy

    bad = copy.deepcopy(SEQ_GRAPH)
    bad["nodes"][6]["params"]["shape"] = [5, -1]
    _expect_error(lambda: GraphNet(bad), "cannot hold the 36 values")
    bad = copy.deepcopy(SEQ_GRAPH)
    bad["nodes"][7]["params"]["dim0"] = 2
    _expect_error(lambda: GraphNet(bad), "dim0=2 is not an axis")
    bad = copy.deepcopy(SEQ_GRAPH)
    bad["connections"] = [c if c["to"] != "rnn.in" else {"from": "x.out", "to": "rnn.in"} for c in bad["connections"]]
    _expect_error(lambda: GraphNet(bad), "needs a rank-2 sample")


def _block_graph(prefix, src, pre_norm, heads, ff, activation):
    """The nodes and connections of a transformer encoder block drawn from layers, reading `src`: pre-norm
    (x + MHA(LN(x)), then x + MLP(LN(x))) or post-norm (LN(x + MHA(x)), then LN(y + FFN(y))); and the map from
    nn.TransformerEncoderLayer's names (under `layer`) to the drawn ones. Returns (nodes, wires, map, output)."""
    i = lambda name: f"{prefix}{name}"
    nodes = [{"id": i("ln1"), "type": "LayerNorm"}, {"id": i("mha"), "type": "MultiheadAttention",
                                                     "params": {"num_heads": heads}},
             {"id": i("add1"), "type": "Add"}, {"id": i("ln2"), "type": "LayerNorm"},
             {"id": i("fc1"), "type": "Linear", "params": {"out_features": ff}}, {"id": i("act"), "type": activation},
             {"id": i("fc2"), "type": "Linear", "params": {"out_features": 0}}, {"id": i("add2"), "type": "Add"}]
    w = lambda a, b: {"from": a, "to": b}
    if pre_norm:
        wires = [w(src, i("ln1.in")), w(i("ln1.out"), i("mha.q")), w(src, i("add1.a")), w(i("mha.out"), i("add1.b")),
                 w(i("add1.out"), i("ln2.in")), w(i("ln2.out"), i("fc1.in")), w(i("fc1.out"), i("act.in")),
                 w(i("act.out"), i("fc2.in")), w(i("add1.out"), i("add2.a")), w(i("fc2.out"), i("add2.b"))]
        out = i("add2.out")
    else:
        wires = [w(src, i("mha.q")), w(src, i("add1.a")), w(i("mha.out"), i("add1.b")), w(i("add1.out"), i("ln1.in")),
                 w(i("ln1.out"), i("fc1.in")), w(i("fc1.out"), i("act.in")), w(i("act.out"), i("fc2.in")),
                 w(i("ln1.out"), i("add2.a")), w(i("fc2.out"), i("add2.b")), w(i("add2.out"), i("ln2.in"))]
        out = i("ln2.out")
    names = {"self_attn.in_proj_weight": "mha.in_proj_weight", "self_attn.in_proj_bias": "mha.in_proj_bias",
             "self_attn.out_proj.weight": "mha.out_proj.weight", "self_attn.out_proj.bias": "mha.out_proj.bias",
             "linear1.weight": "fc1.weight", "linear1.bias": "fc1.bias", "linear2.weight": "fc2.weight",
             "linear2.bias": "fc2.bias", "norm1.weight": "ln1.weight", "norm1.bias": "ln1.bias",
             "norm2.weight": "ln2.weight", "norm2.bias": "ln2.bias"}
    return nodes, wires, {k: prefix + v for k, v in names.items()}, out


def _attention_selftest():
    import copy
    import tempfile

    torch.manual_seed(3)
    e = 8
    # Every attention layer: a sinusoidal encoding and a LayerNorm before causal self-attention; keys of
    # another length (a Linear across the steps) for a causal cross-attention with k only (v = k), and for a
    # hand-drawn attention (BatchMatMul transposed, Scale, causal Softmax, BatchMatMul); Mul; the class token,
    # a learned position embedding, a LayerNorm without affine, the first step and a Linear.
    graph = {"nodes": [
        {"id": "x", "type": "Input", "params": {"shape": [6]}},
        {"id": "emb", "type": "Embedding", "params": {"num_embeddings": 20, "embedding_dim": e}},
        {"id": "pe", "type": "PositionalEncoding", "params": {"max_len": 10}},
        {"id": "ln", "type": "LayerNorm", "params": {"eps": 1e-4}},
        {"id": "mha", "type": "MultiheadAttention", "params": {"num_heads": 2, "causal": True}},
        {"id": "t1", "type": "Transpose"}, {"id": "steps", "type": "Linear", "params": {"out_features": 9}},
        {"id": "t2", "type": "Transpose"},
        {"id": "cross", "type": "MultiheadAttention", "params": {"num_heads": 4, "causal": True, "bias": False}},
        {"id": "qa", "type": "Linear", "params": {"out_features": e}},
        {"id": "ka", "type": "Linear", "params": {"out_features": e}},
        {"id": "scores", "type": "BatchMatMul", "params": {"transpose_b": True}},
        {"id": "scale", "type": "Scale", "params": {"scale": 1 / math.sqrt(e)}},
        {"id": "sm", "type": "Softmax", "params": {"causal": True}},
        {"id": "att", "type": "BatchMatMul"},
        {"id": "gate", "type": "Sigmoid"}, {"id": "mul", "type": "Mul"},
        {"id": "cls", "type": "ClassToken"}, {"id": "pos", "type": "PositionEmbedding"},
        {"id": "ln2", "type": "LayerNorm", "params": {"elementwise_affine": False}},
        {"id": "first", "type": "FirstStep"}, {"id": "fc", "type": "Linear", "params": {"out_features": 3}},
        {"id": "net", "type": "Network"}],
        "connections": [{"from": a, "to": b} for a, b in [
            ("x.out", "emb.in"), ("emb.out", "pe.in"), ("pe.out", "ln.in"), ("ln.out", "mha.q"),
            ("emb.out", "t1.in"), ("t1.out", "steps.in"), ("steps.out", "t2.in"), ("mha.out", "cross.q"),
            ("t2.out", "cross.k"), ("cross.out", "qa.in"), ("t2.out", "ka.in"), ("qa.out", "scores.a"),
            ("ka.out", "scores.b"), ("scores.out", "scale.in"), ("scale.out", "sm.in"), ("sm.out", "att.a"),
            ("t2.out", "att.b"), ("ln.out", "gate.in"), ("att.out", "mul.a"), ("gate.out", "mul.b"),
            ("mul.out", "cls.in"), ("cls.out", "pos.in"), ("pos.out", "ln2.in"), ("ln2.out", "first.in"),
            ("first.out", "fc.in"), ("fc.out", "net.out")]]}
    net = GraphNet(graph)
    assert net.order == ["x", "emb", "pe", "ln", "mha", "t1", "steps", "t2", "cross", "qa", "ka", "scores", "scale",
                         "sm", "att", "gate", "mul", "cls", "pos", "ln2", "first", "fc"], net.order
    keys = list(net.state_dict().keys())
    assert keys == ["emb.weight", "ln.weight", "ln.bias", "mha.in_proj_weight", "mha.in_proj_bias",
                    "mha.out_proj.weight", "mha.out_proj.bias", "steps.weight", "steps.bias",
                    "cross.in_proj_weight", "cross.out_proj.weight", "qa.weight", "qa.bias", "ka.weight", "ka.bias",
                    "cls.weight",
                    "pos.weight", "fc.weight", "fc.bias"], keys
    assert tuple(net.mha.in_proj_weight.shape) == (3 * e, e) and net.mha.batch_first and net.mha.num_heads == 2
    assert tuple(net.pos.weight.shape) == (7, e) and tuple(net.cls.weight.shape) == (1, e)
    assert net.ln.eps == 1e-4 and net.ln2.weight is None and net.out_shape == [3]
    assert net.sources["cross"] == ["mha", "t2"] and net.sources["mha"] == ["ln"]
    net.eval()
    ids = torch.randint(0, 20, (4, 6)).float()
    with torch.no_grad():
        for m in (net.ln, net.cls):
            m.weight.normal_()
        net.mha.in_proj_bias.normal_()
        y = net(ids)
    assert y.shape == (4, 3) and torch.isfinite(y).all()

    # The causal cross-attention with more keys (9) than queries (6), written out: query i sees keys
    # j <= i + 3; k only, so v = k.
    q, kv = torch.randn(4, 6, e), torch.randn(4, 9, e)
    with torch.no_grad():
        got = net.cross(q, kv)
        w_in, w_out, heads, d = net.cross.in_proj_weight, net.cross.out_proj.weight, 4, e // 4
        split = lambda t: t.reshape(t.shape[0], t.shape[1], heads, d).transpose(1, 2)
        qh, kh, vh = split(q @ w_in[:e].T), split(kv @ w_in[e : 2 * e].T), split(kv @ w_in[2 * e :].T)
        scores = qh @ kh.transpose(-1, -2) / math.sqrt(d)
        allowed = torch.tensor([[j <= i + 3 for j in range(9)] for i in range(6)])
        a = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
        want = (a @ vh).transpose(1, 2).reshape(4, 6, e) @ w_out.T
    assert torch.allclose(got, want, rtol=1e-5, atol=1e-6), (got - want).abs().max()
    # The causal Softmax: masked entries exactly 0, the rest summing to 1.
    sm = Softmax(True)(torch.randn(2, 4, 7))
    assert bool((sm[:, 0, 4:] == 0).all()) and bool((sm[:, 3, :] > 0).all()) and bool((sm[:, 1, 5:] == 0).all())
    assert torch.allclose(sm.sum(-1), torch.ones(2, 4))
    # The hand-drawn attention is single-head attention: bmm(q Wq, (k Wk)^T) / sqrt(E), softmax, bmm by v.
    wq, wk, wv = torch.randn(e, e), torch.randn(e, e), torch.randn(e, e)
    one = Attention(e, 1, 0.0, False, True)
    with torch.no_grad():
        one.in_proj_weight.copy_(torch.cat([wq, wk, wv]))
        one.out_proj.weight.copy_(torch.eye(e))
        s_ = Scale(1 / math.sqrt(e))(BatchMatMul(True)(q @ wq.T, kv @ wk.T))
        hand = BatchMatMul(False)(Softmax(True)(s_), kv @ wv.T)
        assert torch.allclose(hand, one(q, kv, kv), rtol=1e-5, atol=1e-6)
    # d2l's table against the formula in float64.
    table = sinusoid_table(50, 6).double()
    t, i2 = torch.arange(50.0, dtype=torch.float64).reshape(-1, 1), torch.arange(0, 6, 2, dtype=torch.float64)
    assert torch.allclose(table[:, 0::2], torch.sin(t / 10000 ** (i2 / 6)), atol=2e-5)
    assert torch.allclose(table[:, 1::2], torch.cos(t / 10000 ** (i2 / 6)), atol=2e-5)
    assert table[0, 0] == 0 and table[0, 1] == 1
    # A shorter sequence adds the first rows of the position embedding; the class token comes first.
    short = torch.randn(2, 4, e)
    assert torch.equal(net.pos(short), short + net.pos.weight[:4])
    assert torch.equal(net.cls(short)[:, 0], net.cls.weight.expand(2, e))
    assert torch.equal(net.cls(short)[:, 1:], short)

    # The drawn pre-norm and post-norm blocks are torch's nn.TransformerEncoderLayer under the name map; a
    # drawn ViT is ViTRef.
    for pre, act in ((True, "GELU"), (False, "ReLU")):
        nodes, wires, names, out = _block_graph("b", "emb.out", pre, 2, 12, act)
        nodes[6]["params"]["out_features"] = e
        g = {"nodes": [{"id": "x", "type": "Input", "params": {"shape": [5]}},
                       {"id": "emb", "type": "Embedding", "params": {"num_embeddings": 15, "embedding_dim": e}}]
             + nodes + [{"id": "net", "type": "Network"}],
             "connections": [{"from": "x.out", "to": "emb.in"}] + wires + [{"from": out, "to": "net.out"}]}
        drawn = GraphNet(g)
        with torch.no_grad():
            for prm in drawn.parameters():
                prm.normal_(0, 0.5)
        ref = EncoderLayerRef({"vocab": 15, "d_model": e, "nhead": 2, "dim_feedforward": 12, "norm_first": pre,
                               "activation": act.lower()})
        state = drawn.state_dict()
        assert load_mapped(ref, state, {"embedding.weight": "emb.weight",
                                        **{"layer." + k: v for k, v in names.items()}}) == []
        x5 = torch.randint(0, 15, (3, 5)).float()
        for m in (drawn, ref):
            m.train()
        a, b = drawn(x5), ref(x5)
        assert torch.allclose(a, b, rtol=1e-5, atol=1e-5), (pre, (a - b).abs().max())
        _expect_error(lambda: load_mapped(ref, state, {"embedding.weight": "emb.weight"}), "leaves out")
    vit, vit_names = _vit_graph(e=8, heads=2, ff=16, blocks=2)
    drawn = GraphNet(vit)
    with torch.no_grad():
        for prm in drawn.parameters():
            prm.normal_(0, 0.3)
    ref = ViTRef({"channels": 1, "image_size": 28, "patch": 4, "d_model": 8, "nhead": 2, "dim_feedforward": 16,
                  "blocks": 2, "classes": 10})
    assert sorted(load_mapped(ref, drawn.state_dict(), vit_names)) == ["cls_token", "pos_embedding"]
    img = torch.randn(2, 1, 28, 28)
    drawn.eval(), ref.eval()
    with torch.no_grad():
        a, b = drawn(img), ref(img)
    assert a.shape == (2, 10) and torch.allclose(a, b, rtol=1e-5, atol=1e-5), (a - b).abs().max()

    # The reference command through files: its output and gradients are autograd's.
    with tempfile.TemporaryDirectory() as tmp:
        gpath, wpath = os.path.join(tmp, "g.json"), os.path.join(tmp, "w.safetensors")
        with open(gpath, "w", encoding="utf-8") as f:
            json.dump(graph, f)
        write_safetensors(wpath, net.state_dict(), {"format": "pt"})
        ids.numpy().astype("<f4").tofile(os.path.join(tmp, "x.f32"))
        dy = torch.randn(4, 3)
        dy.numpy().astype("<f4").tofile(os.path.join(tmp, "dy.f32"))
        job = {"model": gpath, "weights": wpath, "x": os.path.join(tmp, "x.f32"), "n": 4,
               "dy": os.path.join(tmp, "dy.f32"), "out": os.path.join(tmp, "out.f64")}
        with open(os.path.join(tmp, "job.json"), "w", encoding="utf-8") as f:
            json.dump(job, f)
        got = cmd_reference(os.path.join(tmp, "job.json"))
        assert got["out_shape"] == [4, 3] and [g[0] for g in got["grads"]] == keys and got["file_keys"] == keys
        values = np.fromfile(job["out"], dtype="<f8")
        double = copy.deepcopy(net).double().train()
        yd = double(ids.double())
        yd.backward(dy.double())
        want = torch.cat([yd.detach().reshape(-1)] + [p.grad.reshape(-1) for p in double.parameters()])
        assert values.shape == tuple(want.shape) and np.allclose(values, want.numpy(), rtol=1e-12, atol=1e-12)
        assert np.abs(want.numpy()[12:]).max() > 0

    # Graphs the builder refuses, as gpunodes does.
    def rewired(changes):
        g = copy.deepcopy(graph)
        g["connections"] = [{"from": changes[c["to"]][0], "to": changes[c["to"]][1]} if c["to"] in changes else c
                            for c in g["connections"]]
        return g

    bad = rewired({"cross.k": ("t2.out", "cross.v")})
    _expect_error(lambda: GraphNet(bad), "has v wired but not k")
    bad = rewired({"cross.q": ("t2.out", "cross.q"), "cross.k": ("mha.out", "cross.k")})
    _expect_error(lambda: GraphNet(bad), "needs as many keys as queries")
    bad = copy.deepcopy(graph)
    bad["nodes"][4]["params"]["num_heads"] = 3
    _expect_error(lambda: GraphNet(bad), "must divide E=8")
    bad = copy.deepcopy(graph)
    bad["nodes"][11]["params"]["transpose_b"] = False
    _expect_error(lambda: GraphNet(bad), "cannot multiply")


def _vit_graph(e, heads, ff, blocks, patch=4, classes=10):
    """d2l 11.8's ViT drawn from layers on a [1, 28, 28] image, and the map from ViTRef's names to the drawn
    ones."""
    nodes = [{"id": "x", "type": "Input", "params": {"shape": [1, 28, 28]}},
             {"id": "patch", "type": "Conv2d", "params": {"out_channels": e, "kernel_size": patch, "stride": patch}},
             {"id": "flat", "type": "Reshape", "params": {"shape": [e, -1]}},
             {"id": "rows", "type": "Transpose", "params": {"dim0": 0, "dim1": 1}},
             {"id": "cls", "type": "ClassToken"}, {"id": "pos", "type": "PositionEmbedding"}]
    wires = [{"from": a, "to": b} for a, b in [("x.out", "patch.in"), ("patch.out", "flat.in"), ("flat.out", "rows.in"),
                                                ("rows.out", "cls.in"), ("cls.out", "pos.in")]]
    names = {"patch_embedding.weight": "patch.weight", "patch_embedding.bias": "patch.bias",
             "cls_token": "cls.weight", "pos_embedding": "pos.weight", "head.0.weight": "norm.weight",
             "head.0.bias": "norm.bias", "head.1.weight": "head.weight", "head.1.bias": "head.bias"}
    src = "pos.out"
    for b in range(blocks):
        n, w, m, src = _block_graph(f"blk{b}", src, True, heads, ff, "GELU")
        n[6]["params"]["out_features"] = e
        nodes += n
        wires += w
        names.update({f"blks.{b}.{k}": v for k, v in m.items()})
    nodes += [{"id": "norm", "type": "LayerNorm"}, {"id": "first", "type": "FirstStep"},
              {"id": "head", "type": "Linear", "params": {"out_features": classes}}, {"id": "net", "type": "Network"}]
    wires += [{"from": a, "to": b} for a, b in [(src, "norm.in"), ("norm.out", "first.in"), ("first.out", "head.in"),
                                                 ("head.out", "net.out")]]
    return {"nodes": nodes, "connections": wires}, names


def _expect_error(fn, needle):
    try:
        fn()
    except PeerError as e:
        if needle not in str(e):
            raise AssertionError(f"error '{e}' does not mention '{needle}'")
        return
    raise AssertionError(f"no error mentioning '{needle}'")


def selftest():
    import copy
    import tempfile

    torch.manual_seed(1)
    net = GraphNet(TINY_GRAPH)
    # Upstream layers only (not 'stray'), in a depth-first order taking inputs in port order.
    assert net.order == ["x", "conv1", "bn1", "relu1", "pool", "dw", "sum", "cat", "avg", "gap", "flat", "drop",
                         "fc1", "bn2", "act", "tanh", "sig", "fc2"], net.order
    keys = list(net.state_dict().keys())
    assert keys == ["conv1.weight", "conv1.bias", "bn1.weight", "bn1.bias", "bn1.running_mean", "bn1.running_var",
                    "bn1.num_batches_tracked", "dw.weight", "fc1.weight", "fc1.bias", "bn2.weight", "bn2.bias",
                    "bn2.running_mean", "bn2.running_var", "bn2.num_batches_tracked", "fc2.weight"], keys
    # Params and defaults: groups and bias, the pool's stride 0 = kernel, eps, p.
    assert tuple(net.dw.weight.shape) == (4, 2, 1, 1) and net.dw.bias is None
    assert net.conv1.stride == (1, 1) and net.avg.stride == 2 and net.avg.padding == 1
    assert net.bn2.eps == 1e-3 and net.bn1.eps == 1e-5 and net.bn1.momentum == 0.1 and net.drop.p == 0.25
    # Shapes: 8x8 -> pool 4x4 -> concat 8 channels -> avg (4 + 2 - 2) / 2 + 1 = 3 -> gap 1x1 -> 6 -> 3.
    assert net.sample_shape == [3, 8, 8] and net.out_shape == [3], (net.sample_shape, net.out_shape)
    assert tuple(net.fc1.weight.shape) == (6, 8)

    with torch.no_grad():
        for m in (net.bn1, net.bn2):
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 1.5)
            m.weight.uniform_(0.5, 1.5)
            m.bias.uniform_(-0.5, 0.5)
    net.eval()
    x = torch.randn(5, 3, 8, 8)
    with torch.no_grad():
        y = net(x)
        # The same network written out with functional ops, independently of the builder's forward.
        s = dict(net.state_dict())
        h = F.conv2d(x, s["conv1.weight"], s["conv1.bias"], padding=1)
        h = F.batch_norm(h, s["bn1.running_mean"], s["bn1.running_var"], s["bn1.weight"], s["bn1.bias"], eps=1e-5)
        p = F.max_pool2d(F.relu(h), 2)
        h = torch.cat([p + F.conv2d(p, s["dw.weight"], groups=2), p], dim=1)
        h = F.avg_pool2d(h, 2, stride=2, padding=1, count_include_pad=True).mean(dim=(2, 3))
        h = F.linear(h, s["fc1.weight"], s["fc1.bias"])
        h = F.batch_norm(h, s["bn2.running_mean"], s["bn2.running_var"], s["bn2.weight"], s["bn2.bias"], eps=1e-3)
        want = F.linear(torch.sigmoid(torch.tanh(F.gelu(h))), s["fc2.weight"])
    assert y.shape == (5, 3) and torch.allclose(y, want, rtol=1e-5, atol=1e-6), (y, want)

    # Defaults for params a node leaves out.
    g = {"nodes": [{"id": "i", "type": "Input", "params": {"shape": [2, 12, 12]}}, {"id": "c", "type": "Conv2d"},
                   {"id": "m", "type": "MaxPool2d"}, {"id": "f", "type": "Flatten"}, {"id": "l", "type": "Linear"},
                   {"id": "n", "type": "Network"}],
         "connections": [{"from": "i.out", "to": "c.in"}, {"from": "c.out", "to": "m.in"},
                         {"from": "m.out", "to": "f.in"}, {"from": "f.out", "to": "l.in"},
                         {"from": "l.out", "to": "n.out"}]}
    d = GraphNet(g)
    assert tuple(d.c.weight.shape) == (16, 2, 3, 3) and d.c.bias is not None and d.c.padding == (0, 0)
    assert d.m.kernel_size == 2 and d.m.stride == 2 and tuple(d.l.weight.shape) == (10, 16 * 5 * 5)

    # Graphs the builder refuses, each saying why.
    bad = copy.deepcopy(g)
    bad["connections"] = [c for c in bad["connections"] if c["to"] != "m.in"]
    _expect_error(lambda: GraphNet(bad), "nothing wired into its in input")
    bad = copy.deepcopy(g)
    bad["nodes"][0]["params"]["shape"] = [12]
    _expect_error(lambda: GraphNet(bad), "needs a rank-3 sample")
    bad = copy.deepcopy(g)
    bad["nodes"].append({"id": "n2", "type": "Network"})
    _expect_error(lambda: GraphNet(bad), "2 Network nodes")
    bad = copy.deepcopy(g)
    bad["connections"].append({"from": "m.out", "to": "c.in"})
    bad["connections"] = [c for c in bad["connections"] if c != {"from": "i.out", "to": "c.in"}]
    _expect_error(lambda: GraphNet(bad), "cycle")
    bad = copy.deepcopy(TINY_GRAPH)
    bad["connections"] = [c if c["to"] != "cat.b" else {"from": "x.out", "to": "cat.b"} for c in bad["connections"]]
    _expect_error(lambda: GraphNet(bad), "all but the first must match")

    # The safetensors writer and reader: the reference layout, a round trip of every dtype used.
    state = {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": torch.tensor(7, dtype=torch.int64),
             "h": torch.tensor([1.5, -2.0], dtype=torch.float16)}
    blob = safetensors_bytes(state, {"format": "pt"})
    (n,) = struct.unpack("<Q", blob[:8])
    assert n % 8 == 0 and blob[8:9] == b"{" and blob[8 + n - 1 : 8 + n] in (b"}", b" ")
    header = json.loads(blob[8 : 8 + n])
    assert header["w"] == {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}, header
    assert header["n"] == {"dtype": "I64", "shape": [], "data_offsets": [24, 32]}
    assert header["__metadata__"] == {"format": "pt"}
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "s.safetensors")
        write_safetensors(path, state, {"format": "pt"})
        back, meta = read_safetensors(path)
        assert list(back) == ["w", "n", "h"] and meta == {"format": "pt"}
        for k in state:
            assert back[k].dtype == state[k].dtype and torch.equal(back[k], state[k]), k
        # The graph network through a file and the command-line modes.
        gpath = os.path.join(tmp, "g.json")
        with open(gpath, "w", encoding="utf-8") as f:
            json.dump(TINY_GRAPH, f)
        wpath = os.path.join(tmp, "w.safetensors")
        saved = cmd_save(gpath, 3, wpath)
        assert saved["num_batches_tracked"] == 2 and saved["keys"] == keys
        x.numpy().astype("<f4").tofile(os.path.join(tmp, "x.f32"))
        got = cmd_logits(gpath + "#net", wpath, os.path.join(tmp, "x.f32"), 5, os.path.join(tmp, "y.f32"))
        assert got["out_shape"] == [5, 3]
        again, _ = graph_model(TINY_GRAPH)
        again.load_state_dict(read_safetensors(wpath)[0], strict=True)
        again.eval()
        with torch.no_grad():
            want = again(x).numpy()
        assert np.array_equal(np.fromfile(os.path.join(tmp, "y.f32"), dtype="<f4").reshape(5, 3), want)
    # The built-in networks' names are gpunodes' (runtime/src/nn/model.cpp).
    r, _ = builtin_model("resnet18 classes=10 in_channels=1")
    rk = list(r.state_dict().keys())
    assert rk[:7] == ["0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                      "1.num_batches_tracked"], rk[:7]
    assert "resnet_block2.0.conv3.bias" in rk and rk[-2:] == ["fc.1.weight", "fc.1.bias"]
    lk = list(builtin_model("lenet classes=10 in_channels=1 image_size=28")[0].state_dict().keys())
    assert lk == [f"{i}.{w}" for i in (0, 3, 7, 9, 11) for w in ("weight", "bias")], lk
    _sequence_selftest()
    _attention_selftest()
    return {"selftest": "ok"}


def main(argv):
    try:
        if argv[:1] == ["jobs"] and len(argv) == 2:
            with open(argv[1], encoding="utf-8") as f:
                jobs = json.load(f)
            for job in jobs:
                print(json.dumps(run([str(a) for a in job])), flush=True)
        else:
            print(json.dumps(run(argv)), flush=True)
    except (PeerError, OSError, ValueError, KeyError, RuntimeError) as e:
        # RuntimeError: torch's own, e.g. load_state_dict's list of missing and unexpected keys.
        print(f"torch_peer: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
