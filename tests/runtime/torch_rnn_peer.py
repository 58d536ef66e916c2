#!/usr/bin/python3
"""gpunodes' PyTorch peer for the recurrent layers (tests/runtime/test_nn_recurrent.cpp): runs torch's
nn.RNN, nn.GRU and nn.LSTM (batch_first=True) in float64 from float32 weights and inputs, and writes their
outputs and gradients for the C++ suite to compare with gpunodes' rnn_forward and rnn_backward.

  torch_rnn_peer.py JOBS.json

JOBS.json: a list of cases, each
  {"mode": "RNN_TANH"|"RNN_RELU"|"GRU"|"LSTM", "input_size", "hidden_size", "num_layers", "bidirectional",
   "bias", "n", "t", "x": "X.f32", "weights": "W.f32", "h0": "H0.f32" or null, "c0": "C0.f32" or null,
   "r": "R.f32", "out": "OUT.f64"}

W.f32 holds every parameter in the module's state_dict order, one after the other; h0 and c0 (null: zeros)
are [num_layers * directions, N, H]; R is [N, T, H * directions]. The loss is sum(y * R); the initial state
is a constant (no gradient). OUT.f64 gets y, h_n, c_n (LSTM only), each parameter's gradient in state_dict
order, then dx. .f32/.f64 are raw little-endian floats. Prints one JSON line: {"torch": VERSION, "cases":
[{"names": [...], "shapes": [[...], ...]}, ...]}, each case's state_dict keys and shapes.
Exit status 3: torch cannot be imported.
"""

import json
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # the C++ suite skips on this status
    print(f"torch_rnn_peer: cannot import torch: {e}", file=sys.stderr)
    sys.exit(3)


def load(path, shape):
    return torch.from_numpy(np.fromfile(path, "<f4").astype(np.float64).reshape(shape))


def run(case):
    mode, hidden, layers = case["mode"], case["hidden_size"], case["num_layers"]
    n, t, directions = case["n"], case["t"], 2 if case["bidirectional"] else 1
    common = dict(input_size=case["input_size"], hidden_size=hidden, num_layers=layers, bias=case["bias"],
                  batch_first=True, bidirectional=case["bidirectional"], dtype=torch.float64)
    if mode == "GRU":
        module = torch.nn.GRU(**common)
    elif mode == "LSTM":
        module = torch.nn.LSTM(**common)
    else:
        module = torch.nn.RNN(nonlinearity="tanh" if mode == "RNN_TANH" else "relu", **common)
    state = module.state_dict()
    flat = np.fromfile(case["weights"], "<f4").astype(np.float64)
    expected = sum(v.numel() for v in state.values())
    if flat.size != expected:
        raise SystemExit(f"torch_rnn_peer: {flat.size} weights for a module of {expected}")
    at, loaded = 0, {}
    for name, value in state.items():
        loaded[name] = torch.from_numpy(flat[at : at + value.numel()].copy()).reshape(value.shape)
        at += value.numel()
    module.load_state_dict(loaded, strict=True)

    x = load(case["x"], (n, t, case["input_size"])).requires_grad_(True)
    state_shape = (layers * directions, n, hidden)
    h0 = load(case["h0"], state_shape) if case["h0"] else torch.zeros(state_shape, dtype=torch.float64)
    if mode == "LSTM":
        c0 = load(case["c0"], state_shape) if case["c0"] else torch.zeros(state_shape, dtype=torch.float64)
        y, (h_n, c_n) = module(x, (h0, c0))
        finals = [h_n, c_n]
    else:
        y, h_n = module(x, h0)
        finals = [h_n]
    r = load(case["r"], (n, t, hidden * directions))
    (y * r).sum().backward()
    if [name for name, _ in module.named_parameters()] != list(state.keys()):
        raise SystemExit("torch_rnn_peer: the parameters are not in state_dict order")
    parts = [y] + finals + [p.grad for _, p in module.named_parameters()] + [x.grad]
    np.concatenate([p.detach().numpy().ravel() for p in parts]).astype("<f8").tofile(case["out"])
    return {"names": list(state.keys()), "shapes": [list(v.shape) for v in state.values()]}


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: torch_rnn_peer.py JOBS.json")
    torch.set_num_threads(1)
    with open(sys.argv[1]) as f:
        cases = json.load(f)
    print(json.dumps({"torch": torch.__version__, "cases": [run(c) for c in cases]}))


if __name__ == "__main__":
    main()
