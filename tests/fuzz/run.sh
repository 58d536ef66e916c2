#!/usr/bin/env bash
# Builds a libFuzzer harness with clang (ASan + UBSan, coverage from every library it reaches) and fuzzes for
# SECONDS (default 60): "graph" (default) fuzzes graph files, seeded with tests/data/hostile and the example
# graphs; "onnx" fuzzes ONNX models through the importer (fuzz_onnx.cpp), seeded with tests/data/hostile-onnx.
#   tests/fuzz/run.sh [SECONDS] [graph|onnx]
# The growing corpus stays in build-fuzz/corpus (corpus-onnx) between runs. A crasher is written to
# tests/fuzz/crashers/ (onnx-*: the ONNX harness's); once fixed, it joins tests/data/hostile (hostile-onnx)
# with a MANIFEST.tsv line as a regression test.
# GPUNODES_FUZZ_JOBS sets the build's parallelism (default: the number of cores).
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
harness=${2:-graph}
case $harness in
  graph) corpus=corpus prefix="" ;;
  onnx) corpus=corpus-onnx prefix=onnx- ;;
  *) echo "run.sh: unknown harness '$harness' (graph or onnx)" >&2; exit 2 ;;
esac
source scripts/deps.sh
gpunodes_install_deps clang libclang-rt-14-dev libomp-dev
dir=build-fuzz
if [ ! -f $dir/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B $dir -G Ninja -DGPUNODES_CUDA=OFF -DGPUNODES_GUI=OFF -DGPUNODES_FUZZ=ON \
    -DGPUNODES_SANITIZE=address -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build $dir --target fuzz_$harness gpunodes_nodes --parallel "${GPUNODES_FUZZ_JOBS:-$(nproc)}"
mkdir -p $dir/$corpus tests/fuzz/crashers
if [ "$harness" = onnx ]; then
  cp -n tests/data/hostile-onnx/*.onnx $dir/$corpus/ 2>/dev/null || true
else
  cp -n tests/data/hostile/*.json resources/examples/*.json $dir/$corpus/ 2>/dev/null || true
fi
export QT_QPA_PLATFORM=offscreen
# UBSan findings stop the run like ASan's, so libFuzzer keeps the input. Leaks are checked per input.
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS=detect_leaks=1
export LSAN_OPTIONS=suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0
before=$(find tests/fuzz/crashers -type f | wc -l)
status=0
# -timeout: a graph that takes 30 s to load, check, save, paste and dry-run under ASan is a hang (the budget is
# 2 s per file without sanitizers; ASan and the harness's extra passes cost up to ten times that).
# -malloc_limit_mb: one allocation over 2 GiB is a size that was not checked before it was asked for.
# Absolute paths: the harness works in a scratch folder, so that graphs writing files cannot touch the checkout.
# -max_len: inputs up to 64 KiB (longer seeds are cut): structure, not size, is what mutations explore; the
# 100,000-node and 10 MB cases are the hostile suites' (test_hostile_cli), where they run in a fixed time.
$dir/bin/fuzz_$harness "$PWD/$dir/$corpus" -max_total_time="$seconds" -max_len=65536 -timeout=30 \
  -rss_limit_mb=4096 -malloc_limit_mb=2048 -artifact_prefix="$PWD/tests/fuzz/crashers/$prefix" -print_final_stats=1 ||
  status=$?
after=$(find tests/fuzz/crashers -type f | wc -l)
echo "fuzz $harness: $seconds s, corpus $(find $dir/$corpus -type f | wc -l) files, new crashers: $((after - before))" >&2
exit $status
