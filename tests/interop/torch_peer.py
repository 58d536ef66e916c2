#!/usr/bin/python3
"""gpunodes' PyTorch peer: builds in torch the networks gpunodes builds, under the same module names (so that
state_dict keys equal gpunodes' parameter names), and moves weights through safetensors files, read and
written here by hand (no safetensors package: the format is an 8-byte length, a JSON header, raw bytes).

A MODEL argument is either a gpunodes model signature ("resnet18 classes=10 in_channels=1", optionally with
image_size=S for the sample shape) or a gpunodes graph file whose layer nodes draw the network, "GRAPH.json"
or "GRAPH.json#NETWORK_ID" when the graph has several Network nodes. Drawn networks may be sequence models:
an Input of token ids [T] (integers stored as float32 in the .f32 files, refused otherwise) or of steps
[T, F], Embedding and OneHot, RNN, GRU and LSTM (batch_first, only their output), Reshape and Transpose of the
per-sample axes, LastStep (x[:, -1]), and Linear on the last axis.

  torch_peer.py selftest
  torch_peer.py logits MODEL WEIGHTS.safetensors INPUT.f32 N OUT.f32
      loads the weights with load_state_dict(strict=True) and writes the eval-mode outputs of the N samples
  torch_peer.py save MODEL SEED OUT.safetensors
      seeded torch weights, BatchNorm affine parameters drawn and running statistics moved by two training
      batches (so num_batches_tracked is 2), written as safetensors
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
}


def layer_ports(kind):
    if kind == "Input":
        return []
    if kind in ("Add", "Concat"):
        return ["a", "b"]
    return ["in"]


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

        order, state = [], {}

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
            for port in layer_ports(kind):
                if (nid, port) not in wires:
                    raise PeerError(f"layer '{nid}' has nothing wired into its {port} input")
                visit(wires[(nid, port)])
            state[nid] = "done"
            order.append(nid)

        visit(wires[(network_id, "out")])
        inputs = [i for i in order if nodes[i]["type"] == "Input"]
        if len(inputs) != 1:
            raise PeerError(f"the network needs exactly one Input layer, it has {len(inputs)}: {inputs}")

        self.order = order
        self.kinds = {i: nodes[i]["type"] for i in order}
        self.sources = {i: [wires[(i, p)] for p in layer_ports(self.kinds[i])] for i in order}
        self.output_id = order[-1]
        shapes = {}
        for nid in order:
            kind = self.kinds[nid]
            p = dict(LAYER_DEFAULTS[kind])
            p.update(nodes[nid].get("params", {}))
            ins = [shapes[s] for s in self.sources[nid]]
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
            else:
                values[nid] = getattr(self, nid)(values[src[0]])
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
            if isinstance(m, (nn.BatchNorm1d, nn.BatchNorm2d)):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
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


def run(argv):
    if not argv:
        raise PeerError("usage: torch_peer.py selftest | logits ... | save ... | jobs JOBS.json")
    cmd, args = argv[0], argv[1:]
    if cmd == "logits" and len(args) == 5:
        return cmd_logits(*args)
    if cmd == "save" and len(args) == 3:
        return cmd_save(*args)
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
