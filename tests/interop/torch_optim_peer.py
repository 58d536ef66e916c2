#!/usr/bin/python3
"""gpunodes' PyTorch peer for the optimizers: steps torch.optim's SGD, Adam and AdamW through a given
gradient sequence, runs torch's learning-rate schedulers, and computes CrossEntropyLoss with label smoothing,
writing the results for tests/interop/test_torch_optim.cpp to compare with gpunodes' own.

  torch_optim_peer.py JOBS.json

JOBS.json:
  {"shapes": [[...], ...], "params": "P.f32", "grads": "G.f32", "steps": T,
   "optimizers": [{"kind": "sgd"|"adam"|"adamw", "lrs": [T rates], "momentum", "dampening", "nesterov",
                   "weight_decay", "beta1", "beta2", "eps", "clip_grad_norm", "out": "OUT.f32"}, ...],
   "schedules": [{"kind": "constant"|"step"|"cosine"|"onecycle", "lr", "epochs", "steps_per_epoch",
                  "warmup_epochs", "step_size", "gamma", "min_lr", "out": "OUT.f64"}, ...],
   "losses": [{"logits": "Z.f32", "labels": "Y.f32", "n", "classes", "label_smoothing",
               "out": "OUT.f64"}, ...]}

P.f32 holds the parameters' initial values one after the other; G.f32 the gradients of step 1 (every
parameter in order), then step 2, ... An optimizer's OUT.f32 gets the parameters after the T steps; a
schedule's OUT.f64 the rate of every batch; a loss's OUT.f64 the mean loss, then the gradient of the mean
with respect to the logits. .f32/.f64 are raw little-endian floats. Prints one JSON line: {"torch": VERSION}.
Exit status 3: torch cannot be imported.
"""

import json
import sys

try:
    import numpy as np
    import torch
    from torch.optim import lr_scheduler as sched
except ImportError as e:  # the C++ suite skips on this status
    print(f"torch_optim_peer: cannot import torch: {e}", file=sys.stderr)
    sys.exit(3)


def numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def split(flat, shapes):
    out, at = [], 0
    for s in shapes:
        n = numel(s)
        out.append(torch.from_numpy(flat[at : at + n].copy()).reshape(s))
        at += n
    return out


def run_optimizer(job, case):
    shapes, steps = job["shapes"], job["steps"]
    params = [torch.nn.Parameter(t) for t in split(np.fromfile(job["params"], "<f4"), shapes)]
    grads = np.fromfile(job["grads"], "<f4").reshape(steps, -1)
    kind, lr0 = case["kind"], case["lrs"][0]
    if kind == "sgd":
        opt = torch.optim.SGD(params, lr=lr0, momentum=case["momentum"], dampening=case["dampening"],
                              nesterov=case["nesterov"], weight_decay=case["weight_decay"])
    else:
        make = torch.optim.Adam if kind == "adam" else torch.optim.AdamW
        opt = make(params, lr=lr0, betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                   weight_decay=case["weight_decay"])
    for t in range(steps):
        for p, g in zip(params, split(grads[t], shapes)):
            p.grad = g
        if case["clip_grad_norm"] > 0:
            torch.nn.utils.clip_grad_norm_(params, case["clip_grad_norm"])
        for group in opt.param_groups:  # a schedule's rate for this step
            group["lr"] = case["lrs"][t]
        opt.step()
    np.concatenate([p.detach().numpy().ravel() for p in params]).astype("<f4").tofile(case["out"])


def run_schedule(case):
    epochs, per_epoch, lr = case["epochs"], case["steps_per_epoch"], case["lr"]
    warmup = case["warmup_epochs"] * per_epoch
    total = epochs * per_epoch
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    kind = case["kind"]
    if kind == "onecycle":
        extra = {}
        if case["min_lr"] > 0:  # the final rate is min_lr: initial_lr / final_div_factor
            extra["final_div_factor"] = (lr / 25.0) / case["min_lr"]
        s = sched.OneCycleLR(opt, max_lr=lr, total_steps=total, pct_start=0.3, anneal_strategy="cos",
                             div_factor=25.0, three_phase=False, cycle_momentum=False, **extra)
    else:
        if kind == "constant":
            main = sched.LambdaLR(opt, lambda epoch: 1.0)
        elif kind == "step":
            main = sched.StepLR(opt, step_size=case["step_size"], gamma=case["gamma"])
        else:
            main = sched.CosineAnnealingLR(opt, T_max=epochs - case["warmup_epochs"], eta_min=case["min_lr"])
        s = main
        if warmup > 0:
            warm = sched.LinearLR(opt, start_factor=1.0 / warmup, end_factor=1.0, total_iters=warmup)
            s = sched.SequentialLR(opt, [warm, main], milestones=[warmup])
    rates = []
    for k in range(total):
        rates.append(opt.param_groups[0]["lr"])
        opt.step()
        done = k + 1
        if done == total:
            break
        # onecycle per batch; the warmup per batch up to its milestone; the other schedules per epoch.
        if kind == "onecycle" or done <= warmup or done % per_epoch == 0:
            s.step()
    np.asarray(rates, "<f8").tofile(case["out"])


def run_loss(case):
    n, k = case["n"], case["classes"]
    z = torch.from_numpy(np.fromfile(case["logits"], "<f4").astype(np.float64).reshape(n, k))
    z.requires_grad_(True)
    y = torch.from_numpy(np.fromfile(case["labels"], "<f4").astype(np.int64))
    loss = torch.nn.CrossEntropyLoss(label_smoothing=case["label_smoothing"])(z, y)
    loss.backward()
    np.concatenate([[loss.item()], z.grad.numpy().ravel()]).astype("<f8").tofile(case["out"])


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        job = json.load(f)
    torch.set_num_threads(1)  # small tensors; and one thread sums in one order
    for case in job.get("optimizers", []):
        run_optimizer(job, case)
    for case in job.get("schedules", []):
        run_schedule(case)
    for case in job.get("losses", []):
        run_loss(case)
    print(json.dumps({"torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
