#!/bin/bash
# Data parallel across processes against data parallel across devices, measured in the same run: MLP and
# LeNet on real Fashion-MNIST, 2 ranks x 1 CPU device (mpirun on loopback) against 1 rank x 2 CPU devices,
# images/s of the last epoch and the ratio (goal: at least 0.9), and the gradient bytes all-reduced per step
# against the parameter bytes. Usage: tests/bench/dist_bench.sh [BUILD_DIR] (default build).
set -euo pipefail
build=${1:-build}
bin=$(realpath "$build/bin/gpunodes")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mpi=(mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl self,tcp --mca btl_tcp_if_include lo -np 2)

graph() {  # ARCH
  cat <<JSON
{"format": "gpunodes-graph", "version": 1, "name": "dist bench $1",
 "nodes": [{"id": "dev", "type": "Device", "params": {"kind": "cpu"}},
           {"id": "all", "type": "AllDevices", "params": {}},
           {"id": "data", "type": "Dataset", "params": {"name": "fashion-mnist", "limit": 30000, "batch_size": 256}},
           {"id": "net", "type": "Model", "params": {"arch": "$1", "init": "xavier"}},
           {"id": "train", "type": "Train", "params": {"epochs": 2, "lr": 0.1, "log_every": 0}}],
 "connections": [{"from": "dev.device", "to": "net.device"}, {"from": "net.model", "to": "train.model"},
                 {"from": "data.data", "to": "train.data"}, {"from": "all.devices", "to": "train.devices"}]}
JSON
}

field() {  # REPORT EXPR
  /usr/bin/python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['nodes']['train']; print($2)" "$1"
}

printf '%-6s %22s %22s %7s %26s\n' model "1 rank x 2 devices" "2 ranks x 1 device" ratio "all-reduced/param bytes"
for arch in mlp lenet; do
  graph "$arch" > "$tmp/$arch.json"
  "$bin" run "$tmp/$arch.json" --quiet --cpu-devices 2 --report "$tmp/one.json"
  "${mpi[@]}" "$bin" run "$tmp/$arch.json" --quiet --cpu-devices 1 --report "$tmp/two.json"
  one=$(field "$tmp/one.json" "t['epochs'][-1]['images_per_second']")
  two=$(field "$tmp/two.json" "sum(r['images_per_second'] for r in t['ranks'])")
  bytes=$(field "$tmp/two.json" "t['ranks'][0]['allreduce_bytes_per_step'] / t['ranks'][0]['parameter_bytes']")
  printf '%-6s %17.0f img/s %17.0f img/s %7.2f %26.2f\n' "$arch" "$one" "$two" \
    "$(/usr/bin/python3 -c "print($two / $one)")" "$bytes"
done
