#!/usr/bin/env python3
"""Writes the hostile graph-file corpus and its MANIFEST.tsv: file, what it attacks, a word the first error
must contain, and how many error lines `gpunodes validate` prints for it (one per distinct mistake in the file:
a mistake reported twice, or again on the nodes downstream of it, is a bug). Files too big to commit (a 10 MB
string, a 300 MB file, 100,000-node graphs) are made by the tests at run time.
Run from this folder: python3 make_corpus.py"""
import copy
import json
import os

BASE = {
    "format": "gpunodes-graph", "version": 1, "name": "hostile base", "description": "a valid graph",
    "settings": {"schedule": "parallel", "cpu_devices": 1},
    "nodes": [
        {"id": "dev0", "type": "Device", "position": [0, 0], "params": {"kind": "cpu", "index": 0}},
        {"id": "x1", "type": "Tensor", "position": [220, 0], "params": {"shape": [4, 4], "init": "uniform", "seed": 1}},
        {"id": "mm1", "type": "MatMul", "position": [440, 0], "params": {"repeat": 2}},
    ],
    "connections": [
        {"from": "dev0.device", "to": "x1.device"},
        {"from": "x1.out", "to": "mm1.a"},
        {"from": "x1.out", "to": "mm1.b"},
    ],
}

manifest = []


def emit(name, attack, expect, data, lines=1):
    """data: bytes, str, or a JSON-able object; lines: the error lines it is worth."""
    if isinstance(data, (dict, list)):
        data = json.dumps(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(name, "wb") as f:
        f.write(data)
    manifest.append((name, attack, expect, lines))


def variant(name, attack, expect, mutate, lines=1):
    g = copy.deepcopy(BASE)
    mutate(g)
    emit(name, attack, expect, g, lines)


text = json.dumps(BASE)
# --- malformed and truncated JSON
emit("empty.json", "an empty file", "", b"")
emit("truncated-half.json", "JSON cut in the middle", "line", text[: len(text) // 2])
emit("truncated-last-brace.json", "JSON missing its last brace", "line", text[:-1])
emit("trailing-garbage.json", "valid JSON followed by garbage", "line", text + " }}} garbage")
emit("not-json.json", "plain text, not JSON", "line", "this is not a graph\n")
emit("single-quotes.json", "JSON with single-quoted strings", "line", text.replace('"', "'"))
emit("trailing-comma.json", "a trailing comma in an array", "line", text.replace("]}", ",]}", 1))
emit("top-level-array.json", "the top level is an array", "object", "[1, 2, 3]")
emit("top-level-string.json", "the top level is a string", "", '"gpunodes-graph"')
emit("nested-100000.json", "JSON nested 100,000 levels deep", "deep", "[" * 100000 + "]" * 100000)
emit("nested-objects-5000.json", "objects nested 5,000 levels deep inside params", "deep",
     text.replace('"seed": 1', '"seed": ' + '{"a":' * 5000 + "1" + "}" * 5000))
emit("unterminated-string.json", "a string that never ends", "line", '{"format": "gpunodes-graph')
emit("nul-bytes.json", "NUL bytes inside the JSON", "", text[:40] + "\x00\x00" + text[40:])
# --- encodings
emit("non-utf8.json", "Latin-1 bytes that are not UTF-8 in a name", "UTF-8",
     text.encode("utf-8").replace(b"hostile base", b"hostile \xe9\xff base"))
emit("utf16.json", "the file encoded as UTF-16", "", text.encode("utf-16"))
emit("bom-only.json", "a UTF-8 BOM and nothing else", "", b"\xef\xbb\xbf")
emit("overlong-utf8.json", "an overlong UTF-8 encoding of '/'", "UTF-8",
     text.encode().replace(b"hostile base", b"hostile \xc0\xaf base"))
# --- format and version
variant("wrong-format.json", "format is not gpunodes-graph", "format", lambda g: g.update(format="other-graph"))
variant("missing-format.json", "no format field", "format", lambda g: g.pop("format"))
variant("future-version.json", "a version newer than the build", "version", lambda g: g.update(version=99))
variant("version-zero.json", "version 0", "version", lambda g: g.update(version=0))
variant("version-string.json", "version as a string", "version", lambda g: g.update(version="1"))
variant("version-float.json", "version 1.5", "version", lambda g: g.update(version=1.5))
# --- wrong types in every field
variant("nodes-not-array.json", "nodes is an object", "nodes", lambda g: g.update(nodes={"a": 1}))
variant("connections-not-array.json", "connections is a string", "connections", lambda g: g.update(connections="x"))
variant("node-not-object.json", "a node is a number", "nodes[1]", lambda g: g["nodes"].__setitem__(1, 42))
variant("id-number.json", "a node id is a number", "nodes[0]", lambda g: g["nodes"][0].update(id=7))
# The connection to dev0 now names a node that does not exist: a second mistake.
variant("id-empty.json", "a node id is empty", "id", lambda g: g["nodes"][0].update(id=""), lines=2)
variant("id-with-dot.json", "a node id contains a dot (ambiguous in node.port)", "id",
        lambda g: g["nodes"][2].update(id="mm.1"), lines=3)  # and two connections to a missing mm1
variant("type-missing.json", "a node has no type", "type", lambda g: g["nodes"][1].pop("type"))
variant("type-array.json", "a node type is an array", "type", lambda g: g["nodes"][1].update(type=["Tensor"]))
variant("position-string.json", "position is a string", "position", lambda g: g["nodes"][0].update(position="0,0"))
variant("position-short.json", "position has one number", "position", lambda g: g["nodes"][0].update(position=[1]))
variant("position-nan-string.json", "position holds strings", "position",
        lambda g: g["nodes"][0].update(position=["a", "b"]))
variant("params-array.json", "params is an array", "params", lambda g: g["nodes"][2].update(params=[1, 2]))
variant("settings-string.json", "settings is a string", "settings", lambda g: g.update(settings="fast"))
variant("schedule-unknown.json", "schedule is not parallel or sequential", "schedule",
        lambda g: g["settings"].update(schedule="turbo"))
variant("cpu-devices-negative.json", "cpu_devices is negative", "cpu_devices",
        lambda g: g["settings"].update(cpu_devices=-3))
variant("cpu-devices-huge.json", "cpu_devices is 10^9", "cpu_devices",
        lambda g: g["settings"].update(cpu_devices=1000000000))
variant("connection-not-object.json", "a connection is a string", "connections[0]",
        lambda g: g["connections"].__setitem__(0, "dev0.device->x1.device"))
variant("connection-no-dot.json", "an endpoint without a port", "connections[1]",
        lambda g: g["connections"][1].update(**{"from": "x1"}))
variant("connection-number.json", "an endpoint that is a number", "connections[2]",
        lambda g: g["connections"][2].update(to=5))
# --- duplicate ids, dangling and odd connections, cycles
variant("duplicate-ids.json", "two nodes share an id", "duplicate",
        lambda g: g["nodes"].append(dict(copy.deepcopy(g["nodes"][2]), position=[600, 0])))
variant("dangling-node.json", "a connection to a node that does not exist", "ghost",
        lambda g: g["connections"].append({"from": "ghost.out", "to": "mm1.a"}))
variant("dangling-port.json", "a connection to a port that does not exist", "nope",
        lambda g: g["connections"].append({"from": "x1.out", "to": "mm1.nope"}))
variant("input-as-output.json", "a connection from an input port", "x1.device",
        lambda g: g["connections"].append({"from": "x1.device", "to": "mm1.a"}))
variant("self-loop.json", "a node wired to itself", "cycle",
        lambda g: g["connections"].append({"from": "mm1.out", "to": "mm1.b"}) or g["connections"].pop(2))


def long_cycle(g, n=200):
    g["nodes"] = g["nodes"][:2]
    g["connections"] = g["connections"][:1]
    for i in range(n):
        g["nodes"].append({"id": f"c{i}", "type": "Elementwise", "position": [i * 10, 100], "params": {"op": "relu"}})
    for i in range(n):
        g["connections"].append({"from": f"c{i}.out", "to": f"c{(i + 1) % n}.a"})


variant("long-cycle.json", "a 200-node cycle", "cycle", long_cycle)
variant("type-mismatch.json", "a Device output wired into a Tensor input", "mm1",
        lambda g: g["connections"].__setitem__(1, {"from": "dev0.device", "to": "mm1.a"}))
variant("two-wires-one-input.json", "two wires into one input", "mm1",
        lambda g: g["connections"].append({"from": "dev0.device", "to": "mm1.a"}), lines=2)  # and of the wrong type
variant("missing-input.json", "a required input left unconnected", "mm1", lambda g: g["connections"].pop(2))
# --- unknown node types mixed with valid ones
variant("unknown-type.json", "one node type no plugin provides", "FluxCapacitor",
        lambda g: g["nodes"].append({"id": "fc1", "type": "FluxCapacitor", "position": [0, 200], "params": {}}))
variant("unknown-types-many.json", "several unknown types among valid nodes", "Warp",
        lambda g: g["nodes"].extend({"id": f"w{i}", "type": f"Warp{i}", "position": [i, 300], "params": {}}
                                    for i in range(5)), lines=5)
# --- shapes
for name, shape, word in [("shape-negative", [4, -4], "shape"), ("shape-zero", [0, 4], "shape"),
                          ("shape-overflow", [2**40, 2**40], "shape"), ("shape-int64-max", [9223372036854775807], "shape"),
                          ("shape-float", [4.5, 4], "shape"), ("shape-string", "4x4", "shape"),
                          ("shape-empty-dims", [[], []], "shape"), ("shape-rank-9", [2] * 9, "2-d"),
                          ("shape-huge-but-fits", [200000, 200000], "shape")]:
    variant(f"{name}.json", f"Tensor shape {json.dumps(shape)}", word,
            lambda g, s=shape: g["nodes"][1]["params"].update(shape=s))
# --- NaN, Inf, absurd numbers
emit("param-nan.json", "a NaN param (bare NaN token)", "line", text.replace('"seed": 1', '"seed": NaN'))
emit("param-inf.json", "an Infinity param", "line", text.replace('"repeat": 2', '"repeat": Infinity'))
variant("param-1e400.json", "a number that overflows double", "repeat",
        lambda g: g["nodes"][2]["params"].update(repeat=1e400))
emit("param-1e400-raw.json", "1e400 written in the file", "repeat", text.replace('"repeat": 2', '"repeat": 1e400'))
variant("repeat-1e12.json", "repeat of 10^12", "repeat", lambda g: g["nodes"][2]["params"].update(repeat=10**12))
variant("repeat-negative.json", "repeat of -1", "repeat", lambda g: g["nodes"][2]["params"].update(repeat=-1))
variant("repeat-string.json", "repeat as a string", "repeat", lambda g: g["nodes"][2]["params"].update(repeat="50"))
variant("repeat-float.json", "repeat of 2.5", "repeat", lambda g: g["nodes"][2]["params"].update(repeat=2.5))
variant("seed-negative.json", "a negative seed", "seed", lambda g: g["nodes"][1]["params"].update(seed=-5))
variant("enum-unknown.json", "an init that is not in the enum", "init",
        lambda g: g["nodes"][1]["params"].update(init="lava"))
variant("bool-as-string.json", "a bool param given as a string", "fallback",
        lambda g: g["nodes"][0]["params"].update(fallback="yes"))
variant("device-index-huge.json", "a device index of 10^9 without fallback", "dev0",
        lambda g: g["nodes"][0]["params"].update(kind="gpu", index=1000000000, fallback=False))
# --- big strings (1 MB committed; 10 MB and 300 MB made by the tests)
variant("string-1mb-type.json", "a 1 MB string as a node type", "type",
        lambda g: g["nodes"][1].update(type="T" * (1 << 20)))
variant("many-nodes-unconnected.json", "5,000 nodes with missing inputs", "mm",
        lambda g: g["nodes"].extend({"id": f"mm{i}", "type": "MatMul", "position": [i, 500], "params": {}}
                                    for i in range(2, 5002)), lines=10000)  # inputs a and b of each

# --- more wrong types: every top-level field, settings and the node set's own settings
variant("format-number.json", "format is a number", "format", lambda g: g.update(format=5))
variant("version-negative.json", "version -1", "version", lambda g: g.update(version=-1))
emit("version-1e300.json", "version 1e300", "version", text.replace('"version": 1', '"version": 1e300'))
variant("name-number.json", "name is a number", "name", lambda g: g.update(name=42))
variant("description-array.json", "description is an array", "description", lambda g: g.update(description=["a"]))
variant("view-string.json", "view is a string", "view", lambda g: g.update(view="zoomed"))
variant("nodes-null.json", "nodes is null", "nodes", lambda g: g.update(nodes=None))
variant("connections-null.json", "connections is null", "connections", lambda g: g.update(connections=None))
emit("top-level-null.json", "the top level is null", "object", "null")
emit("top-level-number.json", "the top level is a number", "object", "42")
variant("params-null.json", "params is null", "params", lambda g: g["nodes"][1].update(params=None))
variant("connection-missing-to.json", "a connection without its to", "connections[1].to",
        lambda g: g["connections"][1].pop("to"))
variant("connection-empty-port.json", "an endpoint with an empty port name", "connections[1]",
        lambda g: g["connections"][1].update(to="mm1."))
variant("duplicate-connection.json", "the same connection twice", "inputs.a",
        lambda g: g["connections"].append(dict(g["connections"][1])))
variant("schedule-number.json", "schedule is a number", "schedule", lambda g: g["settings"].update(schedule=3))
variant("cpu-devices-string.json", "cpu_devices is a string", "cpu_devices",
        lambda g: g["settings"].update(cpu_devices="2"))
variant("cpu-devices-float.json", "cpu_devices is 1.5", "cpu_devices", lambda g: g["settings"].update(cpu_devices=1.5))
variant("memory-limit-string.json", "memory_limit is a string", "memory_limit",
        lambda g: g["settings"].update(memory_limit="lots"))
variant("memory-limit-negative.json", "a negative memory_limit", "memory_limit",
        lambda g: g["settings"].update(memory_limit={"cpu": -3}))
variant("memory-limit-unknown-device.json", "a memory_limit for a device the run does not have", "cpu:7",
        lambda g: g["settings"].update(memory_limit={"cpu:7": 1024}))
variant("memory-limit-not-a-device.json", "a memory_limit for something that is no device", "tpu:0",
        lambda g: g["settings"].update(memory_limit={"tpu:0": 1024}))
variant("use-cuda-string.json", "use_cuda is a string", "use_cuda", lambda g: g["settings"].update(use_cuda="yes"))
emit("position-inf.json", "a position of 1e400 (infinite once read)", "position",
     text.replace('"position": [0, 0]', '"position": [1e400, 0]', 1))
# --- ids that are not ids
variant("id-65-chars.json", "a node id one character over the limit", "id",
        lambda g: g["nodes"][2].update(id="m" * 65), lines=3)  # and the two connections to mm1
variant("id-unicode.json", "a node id with a non-ASCII character", "id",
        lambda g: g["nodes"][2].update(id="mm\u2460"), lines=3)
emit("id-lone-surrogate.json", "a node id that is a lone UTF-16 surrogate escape", "id",
     text.replace('"id": "mm1"', '"id": "\\ud800"'), lines=3)
# --- absurd numbers where the node set reads them
emit("seed-2e64.json", "a seed of 2^64", "seed", text.replace('"seed": 1', '"seed": 18446744073709551616'))
variant("index-1e308.json", "a device index of 1e308", "index",
        lambda g: g["nodes"][0]["params"].update(index=1e308))
variant("enum-number.json", "an enum param given as a number", "init",
        lambda g: g["nodes"][1]["params"].update(init=5))
variant("values-garbage.json", "Tensor values that are not numbers", "values",
        lambda g: g["nodes"][1]["params"].update(init="values", values="1, 2, x, 4"))
variant("values-too-few.json", "Tensor values fewer than the shape holds", "values",
        lambda g: g["nodes"][1]["params"].update(init="values", values="1 2 3"))
variant("uniform-high-below-low.json", "uniform with high below low", "high",
        lambda g: g["nodes"][1]["params"].update(low=5, high=1))
variant("model-huge.json", "an mlp for 100,000-channel 4096x4096 images (terabytes of weights)", "net",
        lambda g: g["nodes"].append({"id": "net", "type": "Model", "position": [0, 200],
                                     "params": {"arch": "mlp", "in_channels": 100000, "image_size": 4096}}))
variant("loadparams-missing-file.json", "a parameter file that does not exist", "path",
        lambda g: g["nodes"].append({"id": "load", "type": "LoadParams", "position": [0, 200],
                                     "params": {"path": "/nonexistent/model.params"}})
        or g["connections"].append({"from": "dev0.device", "to": "load.device"}))
# --- networks drawn from layer nodes: each mistake is named on its node and port, once
LAYERS = {
    "format": "gpunodes-graph", "version": 1, "name": "hostile layers", "description": "a valid drawn network",
    "settings": {"schedule": "parallel", "cpu_devices": 1},
    "nodes": [
        {"id": "x", "type": "Input", "position": [0, 0], "params": {"shape": [1, 28, 28]}},
        {"id": "conv", "type": "Conv2d", "position": [200, 0], "params": {"out_channels": 6, "kernel_size": 5, "padding": 2}},
        {"id": "flat", "type": "Flatten", "position": [400, 0], "params": {}},
        {"id": "fc", "type": "Linear", "position": [600, 0], "params": {"out_features": 10}},
        {"id": "net", "type": "Network", "position": [800, 0], "params": {}},
    ],
    "connections": [
        {"from": "x.out", "to": "conv.in"},
        {"from": "conv.out", "to": "flat.in"},
        {"from": "flat.out", "to": "fc.in"},
        {"from": "fc.out", "to": "net.out"},
    ],
}


def layers_variant(name, attack, expect, mutate, lines=1):
    g = copy.deepcopy(LAYERS)
    mutate(g)
    emit(name, attack, expect, g, lines)


def rewire(g, old_to, new_from):
    for c in g["connections"]:
        if c["to"] == old_to:
            c["from"] = new_from


def add_node(g, id, type, params=None):
    g["nodes"].append({"id": id, "type": type, "position": [0, 300], "params": params or {}})


layers_variant("layers-conv-on-flat.json", "a Conv2d fed a flat activation", "flat",
               lambda g: (rewire(g, "conv.in", "flat.out"), rewire(g, "flat.in", "x.out"),
                          rewire(g, "fc.in", "conv.out")))
layers_variant("layers-linear-unflattened.json", "a Linear fed a [C, H, W] activation", "Flatten",
               lambda g: rewire(g, "fc.in", "conv.out"))
layers_variant("layers-add-mismatch.json", "an Add of 6x28x28 and 1x28x28", "6x28x28",
               lambda g: (add_node(g, "sum", "Add"), g["connections"].extend(
                   [{"from": "conv.out", "to": "sum.a"}, {"from": "x.out", "to": "sum.b"}]),
                   rewire(g, "flat.in", "sum.out")))
layers_variant("layers-pool-too-large.json", "a 64x64 pool window on a 28x28 input", "larger",
               lambda g: (add_node(g, "pool", "MaxPool2d", {"kernel_size": 64}),
                          g["connections"].append({"from": "conv.out", "to": "pool.in"}),
                          rewire(g, "flat.in", "pool.out")))
layers_variant("layers-two-inputs.json", "a network with two Input layers", "Inputs",
               lambda g: (add_node(g, "y", "Input", {"shape": [6, 28, 28]}), add_node(g, "sum", "Add"),
                          g["connections"].extend([{"from": "conv.out", "to": "sum.a"}, {"from": "y.out", "to": "sum.b"}]),
                          rewire(g, "flat.in", "sum.out")))
layers_variant("layers-network-open.json", "a Network whose out input is not wired", "out",
               lambda g: g["connections"].pop())
layers_variant("layers-zero-channels.json", "an Input of shape [0, 28, 28]", "shape",
               lambda g: g["nodes"][0]["params"].update(shape=[0, 28, 28]))
layers_variant("layers-negative-padding.json", "a Conv2d with padding -3", "padding",
               lambda g: g["nodes"][1]["params"].update(padding=-3))
layers_variant("layers-groups-mismatch.json", "groups that do not divide the channels", "groups",
               lambda g: g["nodes"][1]["params"].update(groups=4))
def terabyte_linear(g):
    g["nodes"] = [n for n in g["nodes"] if n["id"] not in ("conv", "flat")]
    g["connections"] = [c for c in g["connections"] if c["to"] in ("fc.in", "net.out")]
    g["nodes"][0]["params"].update(shape=[1048576])
    g["nodes"][1]["params"].update(out_features=1048576)
    rewire(g, "fc.in", "x.out")


layers_variant("layers-terabyte-linear.json", "a Linear of 2^20 x 2^20 weights (4 TiB)", "fit", terabyte_linear)
layers_variant("layers-cycle.json", "two layers that read each other", "cycle",
               lambda g: (add_node(g, "r1", "ReLU"), add_node(g, "r2", "ReLU"),
                          g["connections"].extend([{"from": "r1.out", "to": "r2.in"}, {"from": "r2.out", "to": "r1.in"}])))
layers_variant("layers-tensor-into-layer.json", "a Tensor wired into a layer's input", "type",
               lambda g: (add_node(g, "t", "Tensor", {"shape": [2, 2]}), rewire(g, "flat.in", "t.out")))

# --- sequences: recurrent layers, token ids, reshapes, and the datasets and losses they train with
SEQ = {
    "format": "gpunodes-graph", "version": 1, "name": "hostile sequences", "description": "a valid GRU language model",
    "settings": {"schedule": "parallel", "cpu_devices": 1},
    "nodes": [
        {"id": "x", "type": "Input", "position": [0, 0], "params": {"shape": [35]}},
        {"id": "emb", "type": "Embedding", "position": [200, 0], "params": {"num_embeddings": 28, "embedding_dim": 16}},
        {"id": "gru", "type": "GRU", "position": [400, 0], "params": {"hidden_size": 32}},
        {"id": "fc", "type": "Linear", "position": [600, 0], "params": {"out_features": 28}},
        {"id": "net", "type": "Network", "position": [800, 0], "params": {}},
    ],
    "connections": [
        {"from": "x.out", "to": "emb.in"},
        {"from": "emb.out", "to": "gru.in"},
        {"from": "gru.out", "to": "fc.in"},
        {"from": "fc.out", "to": "net.out"},
    ],
}


def seq_variant(name, attack, expect, mutate, lines=1):
    g = copy.deepcopy(SEQ)
    mutate(g)
    emit(name, attack, expect, g, lines)


def seq_node(g, id):
    return next(n for n in g["nodes"] if n["id"] == id)


def with_training(g, data_params, train_params=None):
    g["nodes"] += [
        {"id": "data", "type": "Dataset", "position": [0, 300], "params": data_params},
        {"id": "cpu", "type": "Device", "position": [600, 300], "params": {"kind": "cpu"}},
        {"id": "train", "type": "Train", "position": [1000, 0], "params": dict({"epochs": 1}, **(train_params or {}))},
    ]
    g["connections"] += [{"from": "net.model", "to": "train.model"}, {"from": "data.data", "to": "train.data"},
                         {"from": "cpu.device", "to": "train.devices"}]


TEXT = "/usr/share/common-licenses/GPL-3"
seq_variant("seq-gru-on-token-ids.json", "a GRU fed token ids [T] without an Embedding", "Embedding",
            lambda g: (rewire(g, "gru.in", "x.out"), g["nodes"].remove(seq_node(g, "emb")),
                       g["connections"].remove({"from": "x.out", "to": "emb.in"})))
seq_variant("seq-lstm-on-image.json", "an LSTM fed a [1, 28, 28] image", "Reshape",
            lambda g: (seq_node(g, "x")["params"].update(shape=[1, 28, 28]), seq_node(g, "gru").update(type="LSTM"),
                       rewire(g, "gru.in", "x.out"), g["nodes"].remove(seq_node(g, "emb")),
                       g["connections"].remove({"from": "x.out", "to": "emb.in"})))
seq_variant("seq-reshape-mismatch.json", "a Reshape to [27, 28] of 784 values", "784",
            lambda g: (seq_node(g, "x")["params"].update(shape=[1, 28, 28]),
                       seq_node(g, "emb").update(type="Reshape", params={"shape": [27, 28]})))
seq_variant("seq-reshape-two-free.json", "a Reshape with two -1", "-1",
            lambda g: (seq_node(g, "x")["params"].update(shape=[1, 28, 28]),
                       seq_node(g, "emb").update(type="Reshape", params={"shape": [-1, -1]})))
seq_variant("seq-transpose-axis.json", "a Transpose of an axis the sequence does not have", "dim1",
            lambda g: (add_node(g, "t", "Transpose", {"dim0": 0, "dim1": 3}), rewire(g, "gru.in", "t.out"),
                       g["connections"].append({"from": "emb.out", "to": "t.in"})))
seq_variant("seq-laststep-flat.json", "a LastStep after a LastStep", "[T, F]",
            lambda g: (add_node(g, "l1", "LastStep"), add_node(g, "l2", "LastStep"),
                       g["connections"].extend([{"from": "gru.out", "to": "l1.in"}, {"from": "l1.out", "to": "l2.in"}]),
                       rewire(g, "fc.in", "l2.out")))
seq_variant("seq-rnn-nonlinearity.json", "an RNN whose nonlinearity is not tanh or relu", "nonlinearity",
            lambda g: seq_node(g, "gru").update(type="RNN", params={"hidden_size": 8, "nonlinearity": "sine"}))
seq_variant("seq-gru-dropout-one.json", "a GRU dropout of 1", "dropout",
            lambda g: seq_node(g, "gru")["params"].update(dropout=1.0))
seq_variant("seq-embedding-zero-vocab.json", "an Embedding of 0 tokens", "num_embeddings",
            lambda g: seq_node(g, "emb")["params"].update(num_embeddings=0))
seq_variant("seq-text-missing-file.json", "a text dataset whose file does not exist", "does not exist",
            lambda g: with_training(g, {"name": "text", "path": "/nonexistent/corpus.txt", "num_steps": 35}))
seq_variant("seq-text-directory.json", "a text dataset whose path is a directory", "directory",
            lambda g: with_training(g, {"name": "text", "path": "/usr/share", "num_steps": 35}))
seq_variant("seq-text-wrong-steps.json", "a language model of 35 steps on windows of 20 tokens", "[35]",
            lambda g: with_training(g, {"name": "text", "path": TEXT, "num_steps": 20}))
seq_variant("seq-text-regression-loss.json", "a text's next tokens trained with the mse loss", "cross_entropy",
            lambda g: with_training(g, {"name": "text", "path": TEXT, "num_steps": 35}, {"loss": "mse"}))
seq_variant("seq-text-unknown-loss.json", "a loss that is no loss", "loss",
            lambda g: with_training(g, {"name": "text", "path": TEXT, "num_steps": 35}, {"loss": "hinge"}))
seq_variant("seq-series-classifier.json", "a series (regression) trained with cross-entropy", "mse",
            lambda g: (seq_node(g, "x")["params"].update(shape=[4]), seq_node(g, "emb").update(type="Linear",
                       params={"out_features": 1}), g["nodes"].remove(seq_node(g, "gru")), g["nodes"].remove(seq_node(g, "fc")),
                       g["connections"].__init__([{"from": "x.out", "to": "emb.in"}, {"from": "emb.out", "to": "net.out"}]),
                       with_training(g, {"name": "series", "path": "", "tau": 4})))
seq_variant("seq-series-two-outputs.json", "a regression network that predicts 2 values per sample", "1 value",
            lambda g: (seq_node(g, "x")["params"].update(shape=[4]), seq_node(g, "emb").update(type="Linear",
                       params={"out_features": 2}), g["nodes"].remove(seq_node(g, "gru")), g["nodes"].remove(seq_node(g, "fc")),
                       g["connections"].__init__([{"from": "x.out", "to": "emb.in"}, {"from": "emb.out", "to": "net.out"}]),
                       with_training(g, {"name": "series", "path": "", "tau": 4}, {"loss": "mse"})))
seq_variant("seq-generate-no-text.json", "a Generate fed a Fashion-MNIST dataset", "text",
            lambda g: (g["nodes"].extend([{"id": "imgs", "type": "Dataset", "position": [0, 500], "params": {"name": "synthetic"}},
                                          {"id": "gen", "type": "Generate", "position": [1000, 300], "params": {}}]),
                       g["connections"].extend([{"from": "net.model", "to": "gen.model"}, {"from": "imgs.data", "to": "gen.data"}])))

# --- subgraphs (format version 2): nesting, no inputs, cycles through one, a block that contains itself,
# nesting bombs, ports that name what is not there; each names the inner node by its path
def sub_node(id, nodes, connections, inputs=(), outputs=(), block=None, x=220):
    inner = {"nodes": nodes, "connections": connections,
             "inputs": [{"name": n, "to": list(t)} for n, t in inputs],
             "outputs": [{"name": n, "from": f} for n, f in outputs]}
    if block:
        inner["block"] = {"name": block, "hash": "0123456789abcdef"}
    return {"id": id, "type": "Subgraph", "position": [x, 0], "params": {}, "subgraph": inner}


def sub_graph(nodes, connections):
    g = copy.deepcopy(BASE)
    g["version"] = 2
    g["nodes"], g["connections"] = nodes, connections
    return g


DEV = {"id": "dev0", "type": "Device", "position": [0, 0], "params": {"kind": "cpu", "index": 0}}


def tensor(id, shape=(4, 4)):
    return {"id": id, "type": "Tensor", "position": [0, 0], "params": {"shape": list(shape), "init": "uniform", "seed": 1}}


def matmul(id):
    return {"id": id, "type": "MatMul", "position": [200, 0], "params": {"repeat": 1}}


# Three deep: block1 > inner > core, whose MatMul has input b left open.
core = sub_node("core", [matmul("mm1")], [], [("a", ["mm1.a"])], [("out", "mm1.out")])
inner = sub_node("inner", [core], [], [("a", ["core.a"])], [("out", "core.out")])
outer = sub_node("block1", [inner], [], [("a", ["inner.a"])], [("out", "inner.out")])
emit("subgraph-nested-3-deep.json", "subgraphs nested 3 deep with an input left open at the bottom",
     "block1/inner/core/mm1", sub_graph([DEV, tensor("x1"), outer],
                                        [{"from": "dev0.device", "to": "x1.device"}, {"from": "x1.out", "to": "block1.a"}]))
emit("subgraph-no-inputs.json", "a subgraph with no inputs, holding a tensor of a negative size", "block1/x1",
     sub_graph([DEV, sub_node("block1", [tensor("x1", (4, -4))], [], [], [("out", "x1.out")]), matmul("mm1")],
               [{"from": "block1.out", "to": "mm1.a"}, {"from": "block1.out", "to": "mm1.b"}]))
emit("subgraph-cycle.json", "a cycle through a subgraph: its output feeds what feeds it", "cycle",
     sub_graph([DEV, tensor("x1"), matmul("mm1"),
                sub_node("block1", [matmul("mm2")], [], [("a", ["mm2.a"]), ("b", ["mm2.b"])], [("out", "mm2.out")],
                         x=440)],
               [{"from": "dev0.device", "to": "x1.device"}, {"from": "x1.out", "to": "mm1.b"},
                {"from": "mm1.out", "to": "block1.a"}, {"from": "x1.out", "to": "block1.b"},
                {"from": "block1.out", "to": "mm1.a"}]))
selfish = sub_node("block1", [sub_node("again", [tensor("x1")], [], [], [("out", "x1.out")], block="Conv")], [],
                   [], [("out", "again.out")], block="Conv")
emit("subgraph-self-block.json", "a library block that contains an instance of itself", "itself",
     sub_graph([DEV, selfish], []))
bomb = {"id": "x1", "type": "Tensor", "position": [0, 0], "params": {"shape": [2, 2]}}
for level in range(40):
    bomb = sub_node("s%d" % level, [bomb], [], [], [])
emit("subgraph-nesting-bomb.json", "subgraphs nested 40 deep", "nested", sub_graph([DEV, bomb], []))
emit("subgraph-missing-inner-node.json", "a boundary port naming an inner node that does not exist", "ghost",
     sub_graph([DEV, sub_node("block1", [tensor("x2"), matmul("mm1")],
                              [{"from": "x2.out", "to": "mm1.a"}, {"from": "x2.out", "to": "mm1.b"}],
                              [("device", ["x2.device", "ghost.device"])], [("out", "mm1.out")])],
               [{"from": "dev0.device", "to": "block1.device"}]))
emit("subgraph-in-version-1.json", "a subgraph in a file that says version 1", "version 2",
     dict(sub_graph([DEV, sub_node("block1", [tensor("x1")], [], [], [])], []), version=1))

# --- attention: heads, widths and lengths that do not fit, masks for other lengths, weights too large
ATT = {
    "format": "gpunodes-graph", "version": 1, "name": "hostile attention", "description": "a valid attention model",
    "settings": {"schedule": "parallel", "cpu_devices": 1},
    "nodes": [
        {"id": "x", "type": "Input", "position": [0, 0], "params": {"shape": [35]}},
        {"id": "emb", "type": "Embedding", "position": [200, 0], "params": {"num_embeddings": 28, "embedding_dim": 16}},
        {"id": "attn", "type": "MultiheadAttention", "position": [400, 0], "params": {"num_heads": 4}},
        {"id": "fc", "type": "Linear", "position": [600, 0], "params": {"out_features": 28}},
        {"id": "net", "type": "Network", "position": [800, 0], "params": {}},
    ],
    "connections": [
        {"from": "x.out", "to": "emb.in"},
        {"from": "emb.out", "to": "attn.q"},
        {"from": "attn.out", "to": "fc.in"},
        {"from": "fc.out", "to": "net.out"},
    ],
}


def att_variant(name, attack, expect, mutate, lines=1):
    g = copy.deepcopy(ATT)
    mutate(g)
    emit(name, attack, expect, g, lines)


def short_keys(g, to):
    """A [7, 16] sequence from the [35, 16] embedding (Reshape [7, 80], Linear 16), wired into `to`."""
    add_node(g, "fold", "Reshape", {"shape": [7, 80]})
    add_node(g, "keys", "Linear", {"out_features": 16})
    g["connections"] += [{"from": "emb.out", "to": "fold.in"}, {"from": "fold.out", "to": "keys.in"},
                         {"from": "keys.out", "to": to}]


att_variant("att-heads-not-dividing.json", "num_heads 3 for an embedding of 16", "num_heads",
            lambda g: seq_node(g, "attn")["params"].update(num_heads=3))
att_variant("att-key-width.json", "keys 8 wide for queries 16 wide", "width",
            lambda g: (add_node(g, "narrow", "Linear", {"out_features": 8}),
                       g["connections"].extend([{"from": "emb.out", "to": "narrow.in"},
                                                {"from": "narrow.out", "to": "attn.k"}])))
att_variant("att-causal-fewer-keys.json", "a causal mask over 7 keys for 35 queries", "keys",
            lambda g: (seq_node(g, "attn")["params"].update(causal=True), short_keys(g, "attn.k")))
att_variant("att-values-per-key.json", "35 keys but 7 values", "value per key",
            lambda g: (g["connections"].append({"from": "emb.out", "to": "attn.k"}), short_keys(g, "attn.v")))
att_variant("att-values-without-keys.json", "v wired while k is open", "wire k",
            lambda g: g["connections"].append({"from": "emb.out", "to": "attn.v"}))
att_variant("att-layernorm-axis.json", "LayerNorm normalized_shape 32 over a last axis of 16", "normalized_shape",
            lambda g: (add_node(g, "ln", "LayerNorm", {"normalized_shape": 32}), rewire(g, "fc.in", "ln.out"),
                       g["connections"].append({"from": "attn.out", "to": "ln.in"})))
att_variant("att-positional-odd-width.json", "a sinusoidal encoding of an odd width (15)", "even",
            lambda g: (seq_node(g, "emb")["params"].update(embedding_dim=15),
                       seq_node(g, "attn")["params"].update(num_heads=5),
                       add_node(g, "pos", "PositionalEncoding"), rewire(g, "attn.q", "pos.out"),
                       g["connections"].append({"from": "emb.out", "to": "pos.in"})))
att_variant("att-positional-max-len.json", "a positional encoding of max_len 10 for 35 steps", "max_len",
            lambda g: (add_node(g, "pos", "PositionalEncoding", {"max_len": 10}), rewire(g, "attn.q", "pos.out"),
                       g["connections"].append({"from": "emb.out", "to": "pos.in"})))
att_variant("att-bmm-shapes.json", "BatchMatMul of [35, 16] by [35, 16] without transpose_b", "rows",
            lambda g: (add_node(g, "bmm", "BatchMatMul"), rewire(g, "fc.in", "bmm.out"),
                       g["connections"].extend([{"from": "attn.out", "to": "bmm.a"},
                                                {"from": "emb.out", "to": "bmm.b"}])))
att_variant("att-softmax-causal-flat.json", "a causal Softmax over a flat [16]", "causal",
            lambda g: (add_node(g, "last", "LastStep"), add_node(g, "sm", "Softmax", {"causal": True}),
                       rewire(g, "fc.in", "sm.out"),
                       g["connections"].extend([{"from": "attn.out", "to": "last.in"},
                                                {"from": "last.out", "to": "sm.in"}])))
att_variant("att-nadaraya-watson-rows.json", "a NadarayaWatson fed [35, 16] instead of rows (query, key, value)",
            "[T, 3]",
            lambda g: (add_node(g, "nw", "NadarayaWatson"), rewire(g, "fc.in", "nw.out"),
                       g["connections"].append({"from": "emb.out", "to": "nw.in"})))
att_variant("att-valid-lens-shape.json", "valid_lens fed the [35, 16] embeddings instead of lengths [1]",
            "valid_lens",
            lambda g: g["connections"].append({"from": "emb.out", "to": "attn.valid_lens"}))
att_variant("att-valid-length-of-features.json", "a ValidLength over [35, 16] features instead of token ids",
            "token ids",
            lambda g: (add_node(g, "vl", "ValidLength"),
                       g["connections"].extend([{"from": "emb.out", "to": "vl.in"},
                                                {"from": "vl.out", "to": "attn.valid_lens"}])))
att_variant("att-weights-too-large.json",
            "self-attention over 30,000 steps with 64 heads: 230 GB of attention weights for one sample",
            "attention weights",
            lambda g: (seq_node(g, "x")["params"].update(shape=[30000]),
                       seq_node(g, "emb")["params"].update(embedding_dim=64),
                       seq_node(g, "attn")["params"].update(num_heads=64),
                       with_training(g, {"name": "text", "path": TEXT, "num_steps": 30000, "test_fraction": 0,
                                         "batch_size": 1})))

# --- encodings, again
emit("bom-wrong-format.json", "a BOM, then a file of the wrong format", "format",
     b"\xef\xbb\xbf" + text.replace("gpunodes-graph", "other-graph").encode())
emit("utf16-no-bom.json", "UTF-16 without a byte order mark", "", text.encode("utf-16-le"))
emit("utf8-surrogate-bytes.json", "UTF-8 bytes of a surrogate (ED A0 80) in a name", "UTF-8",
     text.encode().replace(b"hostile base", b"hostile \xed\xa0\x80 base"))
emit("control-chars-type.json", "raw control characters inside a node type", "type",
     text.replace('"type": "MatMul"', '"type": "Mat\x01Mul\x7f"'))

# --- paths a graph may touch: writes stay inside the graph's folder (this one), and only gpunodes' own files
# are replaced. A link inside the folder that points out is made by test_hostile_cli at run time.
PARAMS = {
    "format": "gpunodes-graph", "version": 1, "name": "hostile paths", "description": "a model saved to a file",
    "settings": {"schedule": "parallel", "cpu_devices": 1},
    "nodes": [
        {"id": "dev", "type": "Device", "position": [0, 0], "params": {"kind": "cpu"}},
        {"id": "net", "type": "Model", "position": [220, 0], "params": {"arch": "linear", "in_channels": 3, "classes": 1}},
        {"id": "save", "type": "SaveParams", "position": [440, 0], "params": {"path": "saved.params"}},
    ],
    "connections": [{"from": "dev.device", "to": "net.device"}, {"from": "net.model", "to": "save.model"}],
}


def save_to(name, attack, expect, path):
    g = copy.deepcopy(PARAMS)
    g["nodes"][2]["params"]["path"] = path
    emit(name, attack, expect, g)


save_to("trust-write-absolute.json", "SaveParams writes an absolute path outside the graph's folder", "outside",
        "/tmp/gpunodes-hostile-victim.params")
save_to("trust-write-dotdot.json", "SaveParams climbs out of the graph's folder with ../ to ~/.bashrc", "outside",
        "../" * 24 + "root/.bashrc")
save_to("trust-write-device.json", "SaveParams writes to a device file", "outside", "/dev/null")
save_to("trust-write-folder.json", "SaveParams writes to the graph's folder itself", "folder, not a file", ".")
save_to("trust-write-foreign.json", "SaveParams would replace a file that is not gpunodes' (this MANIFEST.tsv)",
        "not a gpunodes file", "MANIFEST.tsv")
seq_variant("trust-checkpoint-dir-is-a-file.json", "a checkpoint_dir that is an existing file", "a file, not a folder",
            lambda g: with_training(g, {"name": "text", "path": TEXT, "num_steps": 35},
                                    {"checkpoint_dir": "MANIFEST.tsv"}))
seq_variant("trust-checkpoint-dir-outside.json", "checkpoints written outside the graph's folder", "outside",
            lambda g: with_training(g, {"name": "text", "path": TEXT, "num_steps": 35},
                                    {"checkpoint_dir": "/tmp/gpunodes-hostile-checkpoints"}))
seq_variant("trust-read-device.json", "a text dataset read from /dev/zero, which never ends", "not a file or a folder",
            lambda g: with_training(g, {"name": "text", "path": "/dev/zero", "num_steps": 35}))

# --- fuzz findings, kept as the fuzzer wrote them (tests/fuzz/run.sh); this script does not regenerate them
FUZZ_FINDINGS = [
    # Two mangled ids, two unknown types, and 4,996 MatMuls with inputs a and b open.
    ("fuzz-paste-5000-nodes.json", "fuzz: 5,000 nodes whose save, copy and paste took over 10 s (quadratic id and "
     "wire lookups)", "invalid id", 9996),
    # A mutated unknown-types-many.json: a bad schedule, five unknown types, an init that is a number.
    ("fuzz-bom-in-key.json", "fuzz: a settings key starting with a raw U+FEFF, which saved in another order the "
     "second time", "schedule", 7),
]
for name, attack, expect, lines in FUZZ_FINDINGS:
    if not os.path.exists(name):
        raise SystemExit(f"{name} is missing: fuzz findings are committed, not generated")
    manifest.append((name, attack, expect, lines))

with open("MANIFEST.tsv", "w") as f:
    f.write("# file\twhat it attacks\ta word the first error names (empty: any clear error)\terror lines\n")
    for name, attack, expect, lines in manifest:
        f.write(f"{name}\t{attack}\t{expect}\t{lines}\n")
print(len(manifest), "files")
