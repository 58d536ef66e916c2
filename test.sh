#!/usr/bin/env bash
# Builds gpunodes and runs every test suite (CTest, offscreen).
#   ./test.sh           the default build in build/
#   ./test.sh --asan    ASan + UBSan build in build-asan/
#   ./test.sh --tsan    ThreadSanitizer build in build-tsan/
set -euo pipefail
cd "$(dirname "$0")"
source scripts/deps.sh
gpunodes_install_deps

dir=build
args=()
case "${1:-}" in
  --asan) dir=build-asan; args=(-DGPUNODES_SANITIZE=address -DCMAKE_BUILD_TYPE=Debug) ;;
  --tsan) dir=build-tsan; args=(-DGPUNODES_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug) ;;
  "") ;;
  *) echo "usage: ./test.sh [--asan|--tsan]" >&2; exit 2 ;;
esac
gpunodes_build "$dir" "${args[@]}"
export QT_QPA_PLATFORM=offscreen
# ctest runs suites side by side on every core, so OpenMP teams (OpenBLAS, oneDNN) share cores with other
# processes. libgomp's default spinning barriers then wait out whole time slices: the training suites took
# 38 s side by side here, and 22 s with sleeping waits, which cost nothing measurable on a quiet machine.
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
cd "$dir"
ctest --output-on-failure --timeout 600 -j "$(nproc)"
