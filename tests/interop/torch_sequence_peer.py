#!/usr/bin/python3
"""gpunodes' PyTorch peer for training drawn networks and for the losses, the torch side of
tests/interop/test_torch_sequences.cpp:

  torch_sequence_peer.py JOBS.json

JOBS.json: {"train": [TRAIN, ...], "losses": [LOSS, ...]}, every path absolute.

TRAIN trains the network a gpunodes graph draws (torch_peer.py builds it) on the batches gpunodes' Train node
read, the way the Train node does: for each batch the mean loss over every target value, its gradient,
torch.nn.utils.clip_grad_norm_ over all parameters, then torch.optim.SGD (no momentum). Fields:
  "model": "GRAPH.json#NETWORK", "weights": the initial state (safetensors, load_state_dict(strict=True)),
  "x", "y": .f32 files of the batches one after the other (inputs [rows, sample...], targets [rows, target...]),
  "batches", "rows", "sample": [...], "target": [...],
  "loss": "cross_entropy" | "mse" | "l1" | "huber", "huber_delta", "lr", "clip_grad_norm",
  "carry_state": recurrent layers start each batch from the state the batch before ended in, detached (d2l's
      train_epoch_ch8 with the sequential iterator); otherwise from zeros,
  "eval": [{"x", "y", "count"}]: sets measured with the trained network in evaluation mode, in batches of
      "rows": the mean loss per target value (d2l's accumulation: sum of l * numel over sum of numel), its
      exp (the perplexity), correct next tokens (cross-entropy) or the squared and absolute errors' sums and
      every prediction (regression),
  "pad_target": targets that are padding (the lines partition's <pad>): d2l's MaskedSoftmaxCELoss is
      differentiated (the mean over every target, a padded one as zero) and losses, accuracy and the eval are
      per counted target, as gpunodes' trainer does; -1 or absent: none,
  "text": optional, the file the batches were cut from, checked here independently of gpunodes:
      {"path", "num_steps", "vocabulary": gpunodes' tokens by id, "partition": "random" | "sequential" |
       "lines" (each line with characters, preprocessed by itself, is d2l 10.5's truncate_pad of <bos> line
       <eos>, the vocabulary reserving <pad>, <bos>, <eos>, the test split the last lines),
       "test_x", "test_y": the test windows and their targets (.f32), "test_count", "test_fraction"}; the text is tokenized per character
      with d2l's preprocessing, the vocabulary built as d2l's Vocab, and every row of every batch must be a
      window corpus[s : s + T] with its targets corpus[s + 1 : s + T + 1], the training windows s = offset +
      k T for k below the windows read, in the sequential partition row i of batch b being window i * nb + b,
      and the test windows consecutive from where the training tokens end.
  "gn_final": gpunodes' trained state (safetensors), "out_torch", "out_gn": .f32 files written here with the
      state torch trained and gpunodes' file's, both flattened in torch's state_dict order, for the C++ side
      to compare.
Per job one JSON line: {"losses": per batch (per counted target), "norms": the gradients' 2-norm before clipping, "correct": per
batch (correct tokens, or the squared errors' sum), "values": counted target values per batch, "eval": [...],
"keys": the state_dict keys, "text": what the check found}.

LOSS computes a loss and its gradient in float64 from float32 inputs:
  {"kind": "cross_entropy" | "mse" | "l1" | "huber", "pred", "target" (.f32), "shape": pred's shape,
   "classes" (cross_entropy: the logits' last axis; targets are the rest of pred's shape), "huber_delta",
   "label_smoothing", "ignore_index" (targets not counted; the mean is over the others), "out": .f64 file: the mean loss, the sum of the per-value losses, the second total
   (correct argmax predictions, or the squared errors' sum), then d(mean)/d pred}.

Exit status 3: torch cannot be imported; 1: a job failed (the reason on stderr).
"""

import json
import math
import os
import re
import sys
from collections import Counter

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_peer as tp  # exits 3 when torch cannot be imported  # noqa: E402

np, torch, F = tp.np, tp.torch, tp.F


def read_f32(path, shape):
    a = np.fromfile(path, dtype="<f4").astype(np.float32)
    if a.size != math.prod(shape):
        raise tp.PeerError(f"{path}: {a.size} values, expected {math.prod(shape)} for {shape}")
    return torch.from_numpy(a.reshape(shape))


# --- the text, as d2l 9.2-9.3 read it --------------------------------------------------------------------------


def d2l_tokens(path):
    """The text cut into characters after d2l's preprocessing: every run of anything but the letters A-Z and
    a-z becomes one space, and letters become lower case."""
    with open(path, encoding="utf-8") as f:
        return list(re.sub("[^A-Za-z]+", " ", f.read()).lower())


def d2l_vocab(tokens, reserved=()):
    """d2l's Vocab: "<unk>" first, then the reserved tokens, then the tokens by frequency, ties in order of
    first appearance (Counter keeps insertion order and sorted is stable)."""
    counts = sorted(Counter(tokens).items(), key=lambda kv: kv[1], reverse=True)
    return ["<unk>"] + list(reserved) + [t for t, _ in counts if t != "<unk>" and t not in reserved]


def check_lines(job, xs, ys):
    """The lines partition: each line of the text with characters, preprocessed by itself, is one sample,
    d2l 10.5's truncate_pad of <bos> line <eos> (inputs) and of the same shifted by one (targets)."""
    t = job["text"]
    steps = int(t["num_steps"])
    with open(t["path"], encoding="utf-8") as f:
        lines = [re.sub("[^A-Za-z]+", " ", line).lower().strip() for line in f.read().split("\n")]
    lines = [list(line) for line in lines if line]
    n_test = round(float(t["test_fraction"]) * len(lines))
    train_lines = lines[: len(lines) - n_test]
    reserved = ("<pad>", "<bos>", "<eos>")
    vocab = d2l_vocab([c for line in train_lines for c in line], reserved)
    if vocab != t["vocabulary"]:
        raise tp.PeerError(f"gpunodes' vocabulary {t['vocabulary']} is not d2l's {vocab}")
    index = {tok: i for i, tok in enumerate(vocab)}
    pad, bos, eos = (index[r] for r in reserved)

    def sample(line):
        full = [bos] + [index.get(c, 0) for c in line] + [eos]
        fit = lambda ids: (ids + [pad] * steps)[:steps]  # noqa: E731
        return tuple(fit(full[:-1])), tuple(fit(full[1:]))

    nb, per = xs.shape[0], xs.shape[1]
    rows = sorted((tuple(xs[b][i].long().tolist()), tuple(ys[b][i].long().tolist())) for b in range(nb)
                  for i in range(per))
    if rows != sorted(sample(line) for line in train_lines[: len(rows)]):
        raise tp.PeerError("the training rows are not the first lines of the text, padded as d2l's truncate_pad")
    count = int(t["test_count"])
    test = list(zip((tuple(r) for r in read_f32(t["test_x"], [count, steps]).long().tolist()),
                    (tuple(r) for r in read_f32(t["test_y"], [count, steps]).long().tolist())))
    if test != [sample(line) for line in lines[len(lines) - n_test:][:count]]:
        raise tp.PeerError("the test rows are not the last lines of the text in order, padded")
    padded = sum(row[1].count(pad) for row in rows)
    return {"lines": len(lines), "train_lines": len(train_lines), "vocab": len(vocab),
            "padded_targets": padded, "targets": len(rows) * steps}


def check_text(job, xs, ys):
    """Checks gpunodes' batches and test windows against the text as d2l cuts it; returns what it found."""
    t = job["text"]
    steps = int(t["num_steps"])
    tokens = d2l_tokens(t["path"])
    gn_vocab = t["vocabulary"]
    if len(gn_vocab) > 256:
        raise tp.PeerError("the check compares ids as bytes: more than 256 tokens")
    index = {tok: i for i, tok in enumerate(gn_vocab)}
    corpus = bytes(index.get(tok, 0) for tok in tokens)  # gpunodes' ids; a token it does not know is 0

    def window(s):  # (inputs, targets) of the window starting at token s
        return corpus[s : s + steps], corpus[s + 1 : s + steps + 1]

    # The test windows: consecutive, from where the training tokens end (their offset is 0).
    count = int(t["test_count"])
    test = list(zip((bytes(r) for r in read_f32(t["test_x"], [count, steps]).long().tolist()),
                    (bytes(r) for r in read_f32(t["test_y"], [count, steps]).long().tolist())))
    first, s = None, corpus.find(test[0][0])
    while s >= 0 and first is None:
        if all(window(s + k * steps) == w for k, w in enumerate(test)):
            first = s
        s = corpus.find(test[0][0], s + 1)
    if first is None:
        raise tp.PeerError("the test windows are not consecutive windows of the text with the next tokens as "
                           "their targets")
    n_train = first
    fraction = float(t["test_fraction"])
    if abs((len(tokens) - n_train) - fraction * len(tokens)) > 1:
        raise tp.PeerError(f"the test split starts at token {n_train} of {len(tokens)}: that is not the last "
                           f"{fraction} of them")
    vocab = d2l_vocab(tokens[:n_train])
    if vocab != gn_vocab:
        raise tp.PeerError(f"gpunodes' vocabulary {gn_vocab} is not d2l's {vocab}")

    # The training rows: the first windows s = offset + k T of the training tokens (the Dataset's limit keeps
    # the first), each with the next tokens as its targets, in some order; one offset below T for all.
    nb, per = xs.shape[0], xs.shape[1]
    rows = [(bytes(xs[b][i].long().tolist()), bytes(ys[b][i].long().tolist())) for b in range(nb)
            for i in range(per)]
    windows = len(rows)
    for offset in range(steps):
        if offset + windows * steps + 1 > n_train:
            raise tp.PeerError(f"the training tokens ({n_train}) hold no {windows} windows after offset {offset}")
        stored = [window(offset + k * steps) for k in range(windows)]
        if sorted(stored) == sorted(rows):
            break
    else:
        raise tp.PeerError("the training rows are not the first windows offset + k T of one offset, with the next "
                           "tokens as their targets")
    if t["partition"] == "sequential":  # d2l's seq_data_iter_sequential: row i of batch b is window i * nb + b
        order = [stored[i * nb + b] for b in range(nb) for i in range(per)]
        wrong = [r for r in range(windows) if rows[r] != order[r]]
        if wrong:
            raise tp.PeerError(f"sequential order: batch {wrong[0] // per} row {wrong[0] % per} is not window "
                               f"{(wrong[0] % per) * nb + wrong[0] // per}")
    elif rows == stored:
        raise tp.PeerError("random partition: the windows came in their stored order, unshuffled")
    return {"tokens": len(tokens), "train_tokens": n_train, "offset": offset, "vocab": len(vocab)}


# --- training -------------------------------------------------------------------------------------------------


def loss_of(kind, out, y, delta, pad=-1):
    """(the loss to differentiate, the mean loss per counted target, the second total: correct argmax
    predictions or the squared errors' sum, the counted targets). Targets equal to pad (>= 0) are padding:
    d2l's MaskedSoftmaxCELoss, every position in the mean with a padded one as zero, is what is
    differentiated, and the reported mean is over the other targets, as torch's ignore_index gives it."""
    if kind == "cross_entropy":
        logits = out.reshape(-1, out.shape[-1])
        labels = y.reshape(-1).long()
        if pad < 0:
            loss = F.cross_entropy(logits, labels)
            return loss, loss.item(), float((logits.argmax(dim=1) == labels).sum()), labels.numel()
        real = labels != pad
        total = F.cross_entropy(logits, labels, ignore_index=pad, reduction="sum")
        counted = int(real.sum())
        hits = float(((logits.argmax(dim=1) == labels) & real).sum())
        return total / labels.numel(), total.item() / counted, hits, counted
    pred = out.reshape(-1)
    target = y.reshape(-1)
    if pred.shape != target.shape:
        raise tp.PeerError(f"{pred.numel()} outputs against {target.numel()} targets")
    if kind == "mse":
        loss = F.mse_loss(pred, target)
    elif kind == "l1":
        loss = F.l1_loss(pred, target)
    elif kind == "huber":
        loss = F.huber_loss(pred, target, delta=delta)
    else:
        raise tp.PeerError(f"unknown loss {kind}")
    return loss, loss.item(), float(((pred.detach() - target) ** 2).sum()), target.numel()


def set_carry(model, on):
    for m in model.modules():
        if isinstance(m, (tp.RNN, tp.GRU, tp.LSTM)):
            m.carry, m.carried = on, None


def flat_state(state, keys):
    return np.concatenate([state[k].detach().float().numpy().ravel() for k in keys]).astype("<f4")


def run_train(job):
    model, _ = tp.load_model_spec(job["model"])
    model.load_state_dict(tp.read_safetensors(job["weights"])[0], strict=True)
    nb, rows = int(job["batches"]), int(job["rows"])
    xs = read_f32(job["x"], [nb, rows] + job["sample"])
    ys = read_f32(job["y"], [nb, rows] + job["target"])
    text = job.get("text")
    lines = bool(text) and text["partition"] == "lines"
    found = (check_lines if lines else check_text)(job, xs, ys) if text else None
    kind, delta = job["loss"], float(job.get("huber_delta", 1.0))
    pad = int(job.get("pad_target", -1))
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=float(job["lr"]))
    clip = float(job.get("clip_grad_norm", 0))
    set_carry(model, bool(job.get("carry_state")))
    model.train()
    losses, norms, correct, values = [], [], [], []
    for b in range(nb):
        opt.zero_grad()
        loss, mean, second, counted = loss_of(kind, model(xs[b]), ys[b], delta, pad)
        loss.backward()
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        if clip > 0:
            torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        losses.append(mean)
        norms.append(norm.item())
        correct.append(second)
        values.append(counted)
    set_carry(model, False)
    model.eval()
    evals = []
    with torch.no_grad():
        for e in job.get("eval", []):
            n = int(e["count"])
            x = read_f32(e["x"], [n] + job["sample"])
            y = read_f32(e["y"], [n] + job["target"])
            total, count, second, abs_sum, predictions = 0.0, 0, 0.0, 0.0, []
            for begin in range(0, n, rows):
                out, target = model(x[begin : begin + rows]), y[begin : begin + rows]
                _, mean, s, counted = loss_of(kind, out, target, delta, pad)
                total += mean * counted
                count += counted
                second += s
                if kind != "cross_entropy":
                    abs_sum += float((out.reshape(-1) - target.reshape(-1)).abs().sum())
                    predictions += out.reshape(-1).tolist()
            evals.append({"loss": total / count, "perplexity": math.exp(total / count), "second": second,
                          "abs_sum": abs_sum, "values": count, "predictions": predictions})
    state = model.state_dict()
    keys = list(state.keys())
    flat_state(state, keys).tofile(job["out_torch"])
    gn = tp.read_safetensors(job["gn_final"])[0]
    if set(gn) != set(keys):
        raise tp.PeerError(f"gpunodes' trained state has {sorted(gn)}, torch's {keys}")
    flat_state(gn, keys).tofile(job["out_gn"])
    return {"losses": losses, "norms": norms, "correct": correct, "values": values, "eval": evals, "keys": keys,
            "text": found}


# --- losses ---------------------------------------------------------------------------------------------------


def run_loss(case):
    shape = case["shape"]
    pred = read_f32(case["pred"], shape).double().requires_grad_(True)
    kind = case["kind"]
    if kind == "cross_entropy":
        classes = int(case["classes"])
        target = read_f32(case["target"], shape[:-1]).long()
        logits = pred.reshape(-1, classes)
        labels = target.reshape(-1)
        ignore = int(case.get("ignore_index", -1))
        per = F.cross_entropy(logits, labels, reduction="none", ignore_index=ignore if ignore >= 0 else -100,
                              label_smoothing=float(case.get("label_smoothing", 0)))
        real = labels != ignore
        second = float(((logits.argmax(dim=1) == labels) & real).sum())
        if ignore >= 0:  # torch's mean over the targets that count
            mean = per.sum() / real.sum()
            mean.backward()
            out = [mean.item(), per.sum().item(), second] + pred.grad.reshape(-1).tolist()
            np.asarray(out, "<f8").tofile(case["out"])
            return
    else:
        target = read_f32(case["target"], [math.prod(shape)]).double()
        p = pred.reshape(-1)
        if kind == "mse":
            per = F.mse_loss(p, target, reduction="none")
        elif kind == "l1":
            per = F.l1_loss(p, target, reduction="none")
        elif kind == "huber":
            per = F.huber_loss(p, target, reduction="none", delta=float(case["huber_delta"]))
        else:
            raise tp.PeerError(f"unknown loss {kind}")
        second = float(((p - target) ** 2).sum())
    mean = per.mean()
    mean.backward()
    out = [mean.item(), per.sum().item(), second] + pred.grad.reshape(-1).tolist()
    np.asarray(out, "<f8").tofile(case["out"])


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], encoding="utf-8") as f:
        jobs = json.load(f)
    torch.set_num_threads(1)  # small tensors; one thread sums in one order
    try:
        for job in jobs.get("train", []):
            print(json.dumps(run_train(job)), flush=True)
        for case in jobs.get("losses", []):
            run_loss(case)
    except (tp.PeerError, OSError, ValueError, KeyError, RuntimeError) as e:
        print(f"torch_sequence_peer: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    print(json.dumps({"torch": torch.__version__}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
