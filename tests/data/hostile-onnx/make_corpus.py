#!/usr/bin/python3
"""Writes the hostile ONNX corpus beside this script: small models that attack the importer (nodes/onnx/),
each listed in MANIFEST.tsv with what it attacks, a word its one error line must contain and the node, tensor
or file that line must name. tests/onnx/test_onnx_hostile.cpp runs `gpunodes import-onnx` on each and the
libFuzzer harness (tests/fuzz/fuzz_onnx.cpp) starts from them. Run it again after changing it (python3-onnx):

  /usr/bin/python3 tests/data/hostile-onnx/make_corpus.py
"""

import base64
import os

import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))
rows = []


def base_nodes():
    """x [1, 4] -> Gemm(W [3, 4], transB) -> Relu -> y: a model the importer takes."""
    return [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", transB=1),
            helper.make_node("Relu", ["h"], ["y"], name="act")]


def base_inits():
    return [helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [0.5] * 12),
            helper.make_tensor("b", TensorProto.FLOAT, [3], [0.1] * 3)]


def model(nodes=None, inits=None, opset=17, ir=8, out="y", domains=()):
    g = helper.make_graph(base_nodes() if nodes is None else nodes, "hostile",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
                          base_inits() if inits is None else inits)
    opsets = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    m = helper.make_model(g, opset_imports=opsets, producer_name="gpunodes-hostile")
    m.ir_version = ir
    return m


def save(name, m, attack, word, names):
    data = m if isinstance(m, bytes) else m.SerializeToString()
    with open(os.path.join(HERE, name), "wb") as f:
        f.write(data)
    rows.append((name, attack, word, names))


def unparsable(data):
    try:
        onnx.ModelProto().ParseFromString(data)
    except Exception:
        return True
    return False


def main():
    # The frame: bytes that are no ModelProto, versions out of range.
    good = model().SerializeToString()
    save("valid.onnx", good, "control: a model the importer takes (an empty word: it must import)", "", "")
    cut = good[: len(good) - 9]
    assert unparsable(cut), "the truncated model still parses"
    save("truncated.onnx", cut, "a valid model with its last bytes cut off", "not an ONNX model", "truncated.onnx")
    junk = b"\xff" * 16 + b"GIF89a not a model at all\x00\x01"
    assert unparsable(junk)
    save("not-protobuf.onnx", junk, "bytes that are no protobuf", "not an ONNX model", "not-protobuf.onnx")
    save("empty.onnx", b"", "an empty file (parses as a ModelProto without IR version)", "IR version", "empty.onnx")
    save("ir-version-99.onnx", model(ir=99), "IR version 99", "IR version", "99")
    save("ir-version-1.onnx", model(ir=1), "IR version 1", "IR version", "ir-version-1.onnx")
    save("opset-7.onnx", model(opset=7), "an opset older than gpunodes reads", "opset", "7")
    save("opset-99.onnx", model(opset=99), "an opset newer than gpunodes reads", "opset", "99")

    # Sizes: dims that would allocate the machine away or make no sense.
    big = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [0.5] * 12)
    del big.dims[:]
    big.dims.extend([1 << 62, 4])
    save("dims-2pow62.onnx", model(inits=[big] + base_inits()[1:]), "an initializer of dims [2^62, 4]", "dims", "'W'")
    neg = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [0.5] * 12)
    del neg.dims[:]
    neg.dims.extend([-3, 4])
    save("dims-negative.onnx", model(inits=[neg] + base_inits()[1:]), "an initializer of dims [-3, 4]", "dims", "'W'")
    short = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [0.5] * 12)
    short.raw_data = b"\x00" * 16
    del short.float_data[:]
    save("initializer-short.onnx", model(inits=[short] + base_inits()[1:]),
         "an initializer of dims [3, 4] with 16 bytes of data", "holds", "'W'")
    longer = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [0.5] * 12)
    longer.float_data.append(0.5)
    save("initializer-long.onnx", model(inits=[longer] + base_inits()[1:]),
         "an initializer of dims [3, 4] with 13 values", "holds", "'W'")
    gb = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [0.5] * 12)
    del gb.dims[:]
    del gb.float_data[:]
    gb.dims.extend([1 << 16, 1 << 12])  # 2^28 floats, 1 GiB, and no bytes
    save("initializer-1gb-empty.onnx", model(inits=[gb] + base_inits()[1:]),
         "an initializer declaring 1 GiB of floats with no data", "holds", "'W'")
    gin = model()
    d = gin.graph.input[0].type.tensor_type.shape.dim[1]
    d.dim_value = 1 << 62
    save("input-dim-2pow62.onnx", gin, "the graph input of dims [1, 2^62]", "dim", "'x'")
    gneg = model()
    gneg.graph.input[0].type.tensor_type.shape.dim[1].dim_value = -4
    save("input-dim-negative.onnx", gneg, "the graph input of dims [1, -4]", "dim", "'x'")

    # The graph's structure.
    cyc = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", transB=1),
           helper.make_node("Add", ["h", "z"], ["s"], name="loop_add"),
           helper.make_node("Relu", ["s"], ["z"], name="loop_relu"),
           helper.make_node("Relu", ["z"], ["y"], name="act")]
    save("cycle.onnx", model(nodes=cyc), "two nodes reading each other's outputs", "cycle", "loop_")
    dang = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", transB=1),
            helper.make_node("Add", ["h", "ghost"], ["y"], name="reads_ghost")]
    save("dangling-input.onnx", model(nodes=dang), "a node reading a name nothing produces", "produces", "ghost")
    dup = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", transB=1),
           helper.make_node("Relu", ["x"], ["h"], name="second_writer"),
           helper.make_node("Relu", ["h"], ["y"], name="act")]
    save("duplicate-output.onnx", model(nodes=dup), "two nodes writing one name", "writes", "'h'")
    shadow = [helper.make_node("Relu", ["x"], ["W"], name="overwrites_W"),
              helper.make_node("Relu", ["W"], ["y"], name="act")]
    save("output-shadows-initializer.onnx", model(nodes=shadow), "a node writing an initializer's name", "writes", "'W'")
    dupinit = base_inits() + [helper.make_tensor("W", TensorProto.FLOAT, [1], [1.0])]
    save("duplicate-initializer.onnx", model(inits=dupinit), "two initializers of one name", "twice", "'W'")

    # Operators.
    lrn = base_nodes() + [helper.make_node("LRN", ["y"], ["z"], name="norm1", size=3)]
    save("unknown-op-lrn.onnx", model(nodes=lrn, out="z"), "LRN, which gpunodes has no layer for", "LRN", "norm1")
    ein = [helper.make_node("Einsum", ["x", "x"], ["y"], name="pairs", equation="bi,bi->bi")]
    save("unknown-op-einsum.onnx", model(nodes=ein, inits=[]), "Einsum", "Einsum", "pairs")
    evil = base_nodes()
    evil[1] = helper.make_node("Relu", ["h"], ["y"], name="act", domain="com.evil")
    save("unknown-domain.onnx", model(nodes=evil, domains=["com.evil"]), "a node of the domain com.evil",
         "domain", "act")
    then_g = helper.make_graph([helper.make_node("Relu", ["y0"], ["t"], name="then_relu")], "then", [],
                               [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Sigmoid", ["y0"], ["e"], name="else_sig")], "else", [],
                               [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    iff = [helper.make_node("Gemm", ["x", "W", "b"], ["y0"], name="fc", transB=1),
           helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)]
    save("subgraph-if.onnx", model(nodes=iff, inits=base_inits() + [cond]), "an If with two subgraphs",
         "subgraph", "branch")
    body = helper.make_graph([helper.make_node("Identity", ["c_in"], ["c_out"], name="body_id"),
                              helper.make_node("Relu", ["v_in"], ["v_out"], name="body_relu")], "body",
                             [helper.make_tensor_value_info("i", TensorProto.INT64, []),
                              helper.make_tensor_value_info("c_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_in", TensorProto.FLOAT, None)],
                             [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_out", TensorProto.FLOAT, None)])
    trip = helper.make_tensor("trip", TensorProto.INT64, [], [3])
    loop = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", transB=1),
            helper.make_node("Loop", ["trip", "cond", "h"], ["y"], name="repeat", body=body)]
    save("subgraph-loop.onnx", model(nodes=loop, inits=base_inits() + [trip, cond]), "a Loop with a body",
         "subgraph", "repeat")
    fn = model()
    f = fn.functions.add()
    f.name = "my_function"
    f.domain = "com.fn"
    save("function.onnx", fn, "a model defining a function", "function", "my_function")

    # External data: the bytes of a tensor in another file, which must stay inside the model's folder.
    def external(name, location, attack, word, length=48, dims=(3, 4)):
        t = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [0.5] * 12)
        del t.float_data[:]
        del t.dims[:]
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        for k, v in (("location", location), ("offset", "0"), ("length", str(length))):
            e = t.external_data.add()
            e.key, e.value = k, v
        save(name, model(inits=[t] + base_inits()[1:]), attack, word, "'W'")

    external("external-dotdot.onnx", "../../etc/passwd", "external data at ../../etc/passwd", "leaves")
    external("external-absolute.onnx", "/etc/passwd", "external data at the absolute path /etc/passwd", "absolute")
    link = os.path.join(HERE, "escape-link")
    if os.path.lexists(link):
        os.remove(link)
    os.symlink("/etc/passwd", link)
    external("external-symlink.onnx", "escape-link", "external data through a link in the folder to /etc/passwd",
             "outside")
    external("external-missing.onnx", "no-such-file.bin", "external data in a file that does not exist",
             "does not exist")
    with open(os.path.join(HERE, "small.bin"), "wb") as f:
        f.write(b"\x00" * 48)
    external("external-1gb.onnx", "small.bin", "external data declaring 1 GiB in a 48-byte file", "holds",
             length=1 << 30, dims=(1 << 16, 1 << 12))
    external("external-length-mismatch.onnx", "small.bin", "external data whose length differs from the dims",
             "length", length=40)

    # Names from the file in the one error line: control characters come out as \\xNN.
    nl = [helper.make_node("Gemm", ["x", "W", "b"], ["h"], name="fc", transB=1),
          helper.make_node("Add", ["h", "gh\nost"], ["y"], name="two\nlines")]
    save("newline-in-names.onnx", model(nodes=nl), "a node and the name it reads with newlines in them",
         "produces", "gh\\x0aost")
    # Size: 5,000 unnamed Relus in a chain must import in under 2 s (the ids' suffixes were found by counting up
    # from 2 for every node: 3 s here, 46 s for 20,000).
    n = 5000
    chain = [helper.make_node("Relu", ["x" if i == 0 else "%x" % (i - 1)], ["y" if i == n - 1 else "%x" % i])
             for i in range(n)]
    save("chain-5000-relus.onnx", model(nodes=chain, inits=[]), "5,000 unnamed nodes in a chain: must import in 2 s",
         "", "")
    # Regressions from the fuzzer (tests/fuzz/fuzz_onnx.cpp): the inputs it found, as it found them.
    fuzzed = {
        # a mutated name with newlines and other control bytes, read by no node: its message took three lines
        "fuzz-newline-name.onnx": ("CAgSEGdwdW5vZGVzLWhvc3RpbGU6iAEKJQoKJQoBeAoBYhIBaBoCZmMiBEdlbW0qDQoGdHJhbnNCGAGg"
                                   "AQIKEQoBaBIBeRoDYWN0IgRSZWx1Egdob3N0aWxlKgwIgIAECIAgEAFCAVcqFQgDEAEiDM3MzD3NzMw9"
                                   "zczMPUIBYloTCgF4Eg4KDAgBEggKAggBCgIIBGIJCgF5EgQKAggBQgQKABAR",
                                   "fuzz_onnx: a name with newlines in a message", "produces", "\\x0a\\x01x"),
    }
    for name, (b64, attack, word, names) in fuzzed.items():
        save(name, base64.b64decode(b64), attack, word, names)
    # Bigger ones are kept as the fuzzer wrote them (this script does not write them).
    kept = {
        # torch's every-layer export mutated: the Add after a MatMul by a constant has no output; the Linear
        # pattern read its output(0) (UBSan: a null RepeatedPtrField)
        "fuzz-node-without-output.onnx": ("fuzz_onnx: a pattern's node without outputs", "output", "'logits'"),
    }
    for name, (attack, word, names) in kept.items():
        assert os.path.isfile(os.path.join(HERE, name)), name
        rows.append((name, attack, word, names))
    # The same made small: MatMul by a constant, then an Add of a constant bias that writes nothing.
    noout = base_nodes() + [helper.make_node("MatMul", ["x", "M"], ["m"], name="mm"),
                            helper.make_node("Add", ["m", "b"], [], name="add_without_output")]
    save("node-without-output.onnx", model(nodes=noout, inits=base_inits() + [
        helper.make_tensor("M", TensorProto.FLOAT, [4, 3], [0.5] * 12)]), "a node without outputs after a MatMul",
        "constant", "add_without_output")

    with open(os.path.join(HERE, "MANIFEST.tsv"), "w", encoding="utf-8") as f:
        f.write("# file\twhat it attacks\ta word the error line contains (empty: the model must import)\t"
                "what the line names (the node, tensor or file)\n")
        for r in rows:
            f.write("\t".join(r) + "\n")


if __name__ == "__main__":
    main()
