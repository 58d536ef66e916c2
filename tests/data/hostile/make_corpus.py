#!/usr/bin/env python3
"""Writes the hostile graph-file corpus and its MANIFEST.tsv (file, what it attacks, a word the error must
contain). Files too big to commit (a 10 MB string, a 300 MB file) are made by the tests at run time.
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


def emit(name, attack, expect, data):
    """data: bytes, str, or a JSON-able object."""
    if isinstance(data, (dict, list)):
        data = json.dumps(data)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(name, "wb") as f:
        f.write(data)
    manifest.append((name, attack, expect))


def variant(name, attack, expect, mutate):
    g = copy.deepcopy(BASE)
    mutate(g)
    emit(name, attack, expect, g)


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
variant("id-empty.json", "a node id is empty", "id", lambda g: g["nodes"][0].update(id=""))
variant("id-with-dot.json", "a node id contains a dot (ambiguous in node.port)", "id",
        lambda g: g["nodes"][2].update(id="mm.1"))
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
variant("two-wires-one-input.json", "two wires into one input", "mm1.a",
        lambda g: g["connections"].append({"from": "dev0.device", "to": "mm1.a"}))
variant("missing-input.json", "a required input left unconnected", "mm1", lambda g: g["connections"].pop(2))
# --- unknown node types mixed with valid ones
variant("unknown-type.json", "one node type no plugin provides", "FluxCapacitor",
        lambda g: g["nodes"].append({"id": "fc1", "type": "FluxCapacitor", "position": [0, 200], "params": {}}))
variant("unknown-types-many.json", "several unknown types among valid nodes", "Warp",
        lambda g: g["nodes"].extend({"id": f"w{i}", "type": f"Warp{i}", "position": [i, 300], "params": {}}
                                    for i in range(5)))
# --- shapes
for name, shape, word in [("shape-negative", [4, -4], "shape"), ("shape-zero", [0, 4], "shape"),
                          ("shape-overflow", [2**40, 2**40], "shape"), ("shape-int64-max", [9223372036854775807], "shape"),
                          ("shape-float", [4.5, 4], "shape"), ("shape-string", "4x4", "shape"),
                          ("shape-empty-dims", [[], []], "shape"), ("shape-rank-9", [2] * 9, "shape"),
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
                                    for i in range(2, 5002)))

with open("MANIFEST.tsv", "w") as f:
    f.write("# file\twhat it attacks\ta word the error names (empty: any clear error)\n")
    for name, attack, expect in manifest:
        f.write(f"{name}\t{attack}\t{expect}\n")
print(len(manifest), "files")
