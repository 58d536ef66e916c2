#!/usr/bin/python3
"""gpunodes' ONNX peers: torch.onnx.export of the networks tests/interop/torch_peer.py builds from a graph
file (module names = node ids), the ONNX checker, and onnxruntime on a model gpunodes wrote.

  onnx_peer.py export MODEL WEIGHTS.safetensors OPSET OUT.onnx [dynamic]
      builds MODEL (GRAPH.json[#NETWORK]) in torch, loads the weights (strict=True), and writes
      torch.onnx.export's file at that opset in eval mode (constant folding on, as by default: BatchNorm
      after a Conv is folded into it); "dynamic" makes the batch axis dynamic
  onnx_peer.py check MODEL.onnx
      onnx.checker.check_model(full_check=True); prints the opset, the inputs' and outputs' shapes, the
      initializer names and the metadata
  onnx_peer.py ort MODEL.onnx INPUT.f32 N OUT.f32
      runs the model in onnxruntime (CPU) on N samples; needs the onnxruntime wheel (the test's venv)

Each command prints one JSON line. Exit status 3: torch, onnx or onnxruntime cannot be imported.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def cmd_export(spec, weights, opset, out, dynamic=""):
    sys.path.insert(0, os.path.join(HERE, "..", "interop"))
    import torch
    import torch_peer

    model, sample = torch_peer.load_model_spec(spec)
    tensors, _ = torch_peer.read_safetensors(weights)
    model.load_state_dict(tensors, strict=True)
    model.eval()
    vocab = getattr(model, "token_vocab", None)  # token ids (Embedding, OneHot): integers in [0, vocab)
    x = torch.randint(0, vocab, [2] + list(sample)).float() if vocab else torch.randn([2] + list(sample))
    axes = {"x": {0: "batch"}, "logits": {0: "batch"}} if dynamic == "dynamic" else None
    torch.onnx.export(model, (x,), out, opset_version=int(opset), input_names=["x"], output_names=["logits"],
                      dynamic_axes=axes)
    import onnx

    m = onnx.load(out)
    return {"ops": sorted({n.op_type for n in m.graph.node}), "nodes": len(m.graph.node)}


def cmd_check(path):
    import onnx

    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)

    def shape(v):
        return [d.dim_param if d.HasField("dim_param") else d.dim_value for d in v.type.tensor_type.shape.dim]

    return {"ir_version": m.ir_version, "opset": {o.domain: o.version for o in m.opset_import},
            "inputs": {v.name: shape(v) for v in m.graph.input},
            "outputs": {v.name: shape(v) for v in m.graph.output},
            "initializers": [t.name for t in m.graph.initializer], "graph_name": m.graph.name,
            "doc": m.graph.doc_string, "metadata": {p.key: p.value for p in m.metadata_props},
            "ops": [n.op_type for n in m.graph.node], "producer": m.producer_name}


def cmd_ort(path, inputs, n, out):
    import numpy as np
    import onnxruntime as ort

    s = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    inp = s.get_inputs()[0]
    x = np.fromfile(inputs, dtype="<f4").astype(np.float32)
    dims = [int(n)] + [int(d) for d in inp.shape[1:]]
    y = s.run(None, {inp.name: x.reshape(dims)})[0]
    y.astype("<f4").tofile(out)
    return {"out_shape": list(y.shape), "input": inp.name}


def main(argv):
    commands = {"export": cmd_export, "check": cmd_check, "ort": cmd_ort}
    if not argv or argv[0] not in commands:
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print(json.dumps(commands[argv[0]](*argv[1:])), flush=True)
    except ImportError as e:
        print(f"onnx_peer: {e}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
