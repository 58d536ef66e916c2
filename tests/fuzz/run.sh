#!/usr/bin/env bash
# Builds the libFuzzer harness with clang (ASan + UBSan) and fuzzes graph loading for SECONDS (default 60),
# seeded with tests/data/hostile and the example graphs. New crashers land in tests/fuzz/crashers/.
set -euo pipefail
cd "$(dirname "$0")/../.."
seconds=${1:-60}
source scripts/deps.sh
gpunodes_install_deps clang libclang-rt-14-dev
dir=build-fuzz
if [ ! -f $dir/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B $dir -G Ninja -DGPUNODES_CUDA=OFF -DGPUNODES_GUI=OFF -DGPUNODES_FUZZ=ON \
    -DGPUNODES_SANITIZE=address -DCMAKE_BUILD_TYPE=RelWithDebInfo
fi
cmake --build $dir --target fuzz_graph gpunodes_nodes
mkdir -p $dir/corpus tests/fuzz/crashers
cp -n tests/data/hostile/*.json resources/examples/*.json $dir/corpus/ 2>/dev/null || true
export QT_QPA_PLATFORM=offscreen
# Leaks in Qt's plugin loader at exit are not ours; the harness keeps its registry for the whole run.
ASAN_OPTIONS=detect_leaks=0 $dir/bin/fuzz_graph $dir/corpus -max_total_time="$seconds" -max_len=1048576 \
  -timeout=10 -rss_limit_mb=4096 -artifact_prefix=tests/fuzz/crashers/ -print_final_stats=1
