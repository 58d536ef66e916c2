#!/usr/bin/env bash
# CUDA checks for a lent GPU machine (an NVIDIA H200 in this project). That machine has CUDA 13, cmake,
# ninja and python3 with PyTorch (whose nvidia wheels hold cuDNN and NCCL), but no Qt, no OpenBLAS, no oneDNN
# and no network; its glibc is newer than Debian 12's.
#
# Recommended (--carried): build here, carry the binaries, run everything there.
#   1. here:   bash tests/gpu/prepare-carry.sh          builds ./build's targets (CUDA arch 90), fills the
#                                                        git-ignored .gpu-carry/ (binaries, .debs, data); < 55 MiB
#   2. here:   OUT=/tmp/dc bash tests/gpu/device-check.sh   dry run: every binary must start, the script must
#                                                        say there is no GPU and skip (exit 0); --plan prints
#                                                        the steps and their budgets without running anything
#   3. device tool, one call:  command "bash tests/gpu/device-check.sh", carry [".gpu-carry"], timeout_s 540
#
# Time: about 15 minutes of device time are lent in all, the machine's start included, so the checks keep to
# GN_DEADLINE_S (default 480 s). Each step has a budget and keeps back what the steps after it need at least
# (`--plan` lists them); a step's items are clipped to what is left; an item not started in time is SKIPPED
# (time); the table is printed last. Most important first:
#   setup, ldd, `gpunodes devices`                 ~15 s
#   cuda_kernels_check (GPU-only checks)           <= 60 s
#   the CUDA suites (CUDA_SUITES below, each on cuda:0 with GN_TEST_DEVICE=cuda:0; test_device holds the
#     checks every device shares, run on the CPU in CI)          <= 200 s
#   compute-sanitizer, where the machine has it: memcheck on test_device (all but the long cancel) and on
#     cuda_kernels_check --quick, racecheck on the reduction kernels (sum/norm, batch norm)   <= 70 s
#   the headless examples, a short set             <= 50 s
#   cuda_bench                                     <= 40 s
#   train_bench: ResNet-18 on N Fashion-MNIST images, fp32 and bf16, each beside PyTorch; N fits the rest
#
# A skipped test on a machine whose nvidia-smi lists a GPU is a FAILURE (only "needs two GPUs" is allowed
# with one GPU); without a GPU (a dry run) everything CUDA is SKIPPED and the exit status is 0.
# One GPU cannot exercise NCCL across ranks, peer copies or the multi-GPU data-parallel paths: the table
# says so in its last rows (docs/gpu-checks.md).
#
# Modes:
#   --carried          (default when .gpu-carry/build/bin exists) no build; runs the binaries of .gpu-carry/build.
#   --prebuilt DIR     the same from another build tree laid out as bin/ and lib/ (e.g. a CMake build dir).
#   --build            the Qt-free path: configure and build gn_runtime, cuda_kernels_check, cuda_bench and
#                      train_bench into build-gpu there, then run those. Needs the -dev packages and headers
#                      prepare-carry.sh adds unless GN_CARRY_BUILD_DEPS=0 (libopenblas-pthread-dev, libdnnl-dev,
#                      zlib1g-dev, .gpu-carry/include).
#   --plan             prints the steps, their budgets and the suites, and exits.
#   --list-suites      prints the CUDA suites' binaries, one a line (prepare-carry.sh carries them).
#   --check-suites B.. exits 1 unless every binary B is on the list (CTest's device_check_runs_every_cuda_suite
#                      passes every suite that runs on cuda:0, so a new *_cuda variant cannot be forgotten here).
# The runtime libraries come from .gpu-carry/debs, unpacked privately under /tmp/gnroot (dpkg -x, or Python
# where there is no dpkg; never into /): Qt and oneDNN always from the carry, every other library only where the
# system lacks its soname (the machine's own, newer libgomp, libstdc++ and zlib win; the carried libstdc++ steps
# in if ldd reports a missing GLIBCXX).
# LD_LIBRARY_PATH: the carried libraries, then the CUDA toolkit, then the nvidia wheels' lib folders.
# Logs go to $OUT (the device tool's fetch folder): env.txt, ldd.txt, devices.txt, kernels.log, suite-*.log,
# sanitizer-*.log, example-*.log, report-*.json, bench.log, train.log, summary.txt. Exit status 1 when an item
# FAILED or hit its TIMEOUT, else 0.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CARRY=$ROOT/.gpu-carry
OUT=${OUT:-/tmp/gn-device-check}
# The CUDA suites, NAME:SECONDS. Every Qt Test binary that runs on cuda:0: the *_cuda variants' suites (they
# honour GN_TEST_DEVICE), the GPU-only suites, and test_nn_models (try_gpu). CTest checks that the list is
# complete (--check-suites); a suite that the other side adds (test_cuda_defects) runs where it is built.
# test_nn_recurrent and test_sequence_layers are where the recurrent layers' cuDNN RNN path
# (runtime/src/nn/cuda/cuda_recurrent_kernels.cu) runs; it was written without a GPU and has not run on one
# before (docs/gpu-checks.md lists what it assumes), so the table says so beside their rows.
CUDA_SUITES=(test_device:90 test_nn_cuda:150 test_cuda_defects:90 test_nn_layers:120 test_nn_network:120
             test_nn_optim:90 test_predict:90 test_nn_models:60 test_nn_recurrent:90 test_sequence_layers:90
             test_attention_layers:90 test_attention_kernels:60)
suite_names() { local s; for s in "${CUDA_SUITES[@]}"; do echo "${s%%:*}"; done; }
# Step budgets (seconds) and what each keeps back for the steps after it.
declare -A BUDGET=([kernels]=60 [suites]=200 [sanitizer]=70 [examples]=50 [bench]=40)
declare -A RESERVE=([kernels]=260 [suites]=140 [sanitizer]=110 [examples]=80 [bench]=50)
MODE=""
PREBUILT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --carried) MODE=carried; shift ;;
    --build) MODE=build; shift ;;
    --prebuilt) [ $# -ge 2 ] || { echo "--prebuilt needs a directory" >&2; exit 2; }
                MODE=prebuilt; PREBUILT=$(cd "$2" && pwd) || exit 2; shift 2 ;;
    --list-suites) suite_names; exit 0 ;;
    --check-suites)
      shift
      missing=""
      for b in "$@"; do suite_names | grep -qxF "$b" || missing="$missing $b"; done
      if [ -n "$missing" ]; then
        echo "tests/gpu/device-check.sh does not run:$missing (add each to CUDA_SUITES)" >&2; exit 1
      fi
      echo "device-check.sh runs every CUDA suite CTest has: $*"; exit 0 ;;
    --plan)
      echo "deadline ${GN_DEADLINE_S:-480} s; steps (budget s / kept back for later steps s):"
      for k in kernels suites sanitizer examples bench; do printf '  %-10s %4s / %4s\n' "$k" "${BUDGET[$k]}" "${RESERVE[$k]}"; done
      echo "  train      the rest, less 10 s for the table"
      echo "suites (timeout s): ${CUDA_SUITES[*]}"
      exit 0 ;;
    -h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d'; exit 0 ;;
    *) echo "usage: $0 [--carried | --build | --prebuilt BUILD_DIR | --plan | --list-suites | --check-suites BIN...]" >&2
       exit 2 ;;
  esac
done
mkdir -p "$OUT"
if [ -z "$MODE" ]; then
  if [ -d "$CARRY/build/bin" ]; then MODE=carried; else MODE=build; fi
fi

T0=$(date +%s)
DEADLINE=$(( T0 + ${GN_DEADLINE_S:-480} ))
declare -a SUMMARY=()
BAD=0
# row NAME STATUS SECONDS DETAIL: one line of the summary table, echoed as it happens.
row() {
  SUMMARY+=("$(printf '%-30s %-8s %5s  %s' "$1" "$2" "$3" "$4")")
  case "$2" in FAILED|TIMEOUT) BAD=$((BAD + 1)) ;; esac
  echo "== $1: $2 ${3:+(${3} s)} $4"
}
note() { row "$1" info "" "$2"; }

# --- the GPU ------------------------------------------------------------------------------------------------
GPU_COUNT=0
GPU_NAME=""
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi -L >"$OUT/nvidia-smi.txt" 2>&1
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >>"$OUT/nvidia-smi.txt" 2>&1
  GPU_COUNT=$(grep -c '^GPU [0-9]' "$OUT/nvidia-smi.txt")
  GPU_NAME=$(sed -n 's/^GPU 0: \(.*\) (UUID.*/\1/p' "$OUT/nvidia-smi.txt" | head -1)
  cat "$OUT/nvidia-smi.txt"
  if [ "$GPU_COUNT" -gt 0 ]; then note "gpu" "$GPU_COUNT x ${GPU_NAME:-?}"
  else note "gpu" "none: nvidia-smi lists no GPU ($(head -1 "$OUT/nvidia-smi.txt"))"; fi
else
  echo "nvidia-smi: not found" >"$OUT/nvidia-smi.txt"
  note "gpu" "none: nvidia-smi not found (no driver): CUDA checks will skip"
fi
HAVE_GPU=$([ "$GPU_COUNT" -gt 0 ] && echo 1 || echo 0)
# The model, e.g. H200 of "NVIDIA H200": `gpunodes devices` must name it.
GPU_MODEL=$(echo "$GPU_NAME" | tr ' ' '\n' | grep '[0-9]' | head -1)

# --- host libraries from the carried .debs, unpacked privately (never into /) ------------------------------
GNROOT=/tmp/gnroot
LIBDIR=$GNROOT/usr/lib/x86_64-linux-gnu
rm -rf "$GNROOT"
mkdir -p "$GNROOT/extra"
# deb_extract DEB DIR: dpkg -x, or where there is no dpkg, the .deb's data.tar.* member read by Python.
deb_extract() {
  if command -v dpkg >/dev/null 2>&1; then dpkg -x "$1" "$2"; return; fi
  python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not an ar archive"
pos = 8
while pos + 60 <= len(data):
    name, size = data[pos:pos + 16].decode().strip().rstrip("/"), int(data[pos + 48:pos + 58])
    if name.startswith("data.tar"):
        with tarfile.open(fileobj=io.BytesIO(data[pos + 60:pos + 60 + size])) as t:
            t.extractall(sys.argv[2])
        break
    pos += 60 + size + (size & 1)
else:
    sys.exit("no data.tar member")
PY
}
DEBS=0
for f in "$CARRY"/debs/*.deb; do [ -e "$f" ] && deb_extract "$f" "$GNROOT" && DEBS=$((DEBS + 1)); done
SYSTEM_SONAMES=$(ldconfig -p 2>/dev/null | awk 'NR > 1 {print $1}' | sort -u)
system_has() { echo "$SYSTEM_SONAMES" | grep -qxF "$1"; }
link_lib() { ln -sf "$1" "$GNROOT/extra/$(basename "$1")"; }
# Qt (its modules must come from one release: never a system Qt beside the carried QtTest) and oneDNN (the
# machine has none) always from the carry; OpenBLAS's OpenMP build through its own folder on the path.
for f in "$LIBDIR"/libQt6*.so.? "$LIBDIR"/libdnnl.so.?; do [ -e "$f" ] && link_lib "$f"; done
# Everything else (ICU 72, double-conversion, libb2, PCRE2, GLib, gfortran, quadmath, OpenCL, libgomp, zlib,
# zstd, libstdc++ ...) only where the system lacks that soname: linked one by one into extra/, so that a
# carried library never shadows the system's own.
# Sonames only (libfoo.so.N): the versioned file names behind them (libfoo.so.N.M...) are never looked up.
for f in "$LIBDIR"/lib*.so.* "$GNROOT"/lib/x86_64-linux-gnu/lib*.so.*; do
  [ -e "$f" ] || continue
  n=$(basename "$f")
  case "$n" in libQt6*|libdnnl*|*.so.*.*) continue ;; esac
  system_has "$n" || link_lib "$f"
done
LDPATH="$LIBDIR/openblas-openmp:$GNROOT/extra"
# Fashion-MNIST for train_bench: the whole set (its PyTorch side needs all 60000 images), from the carried
# dataset-fashion-mnist package or the system, else none (random images). For the examples: the subset that
# prepare-carry.sh copies (they use at most 10000 images), else the whole set, else the synthetic set.
FASHION_MNIST=$GNROOT/usr/share/datasets/fashion-mnist
[ -e "$FASHION_MNIST/train-images-idx3-ubyte.gz" ] || FASHION_MNIST=/usr/share/datasets/fashion-mnist
[ -e "$FASHION_MNIST/train-images-idx3-ubyte.gz" ] || FASHION_MNIST=""
EXAMPLE_DATA=$CARRY/data/fashion-mnist
[ -e "$EXAMPLE_DATA/train-images-idx3-ubyte.gz" ] || EXAMPLE_DATA=$FASHION_MNIST

# --- CUDA libraries: the toolkit first, then PyTorch's nvidia wheels ------------------------------------------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
if [ ! -x "$CUDA_HOME/bin/nvcc" ] && command -v nvcc >/dev/null 2>&1; then
  CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
fi
export PATH="$CUDA_HOME/bin:$PATH"
# `nvidia` is a namespace package: it may span several site-packages folders (no spaces in these paths).
NVIDIA_WHEELS=$(python3 -c 'import nvidia; print(" ".join(nvidia.__path__))' 2>/dev/null || true)
# find_one NAME: the first file called NAME (or NAME.*) in the toolkit, the system, or the wheels.
find_one() {
  for d in "$CUDA_HOME/lib64" "$CUDA_HOME/include" "$CUDA_HOME/targets/x86_64-linux/lib" \
           /usr/lib/x86_64-linux-gnu /usr/include; do
    local hit
    hit=$(ls "$d/$1" "$d/$1".* 2>/dev/null | head -1)
    [ -n "$hit" ] && { echo "$hit"; return; }
  done
  # shellcheck disable=SC2086
  [ -n "$NVIDIA_WHEELS" ] && find $NVIDIA_WHEELS \( -name "$1" -o -name "$1.*" \) 2>/dev/null | sort | head -1
}
CUDNN_LIB=$(find_one libcudnn.so)
NCCL_LIB=$(find_one libnccl.so)
CUBLAS_LIB=$(find_one libcublas.so)
CUDNN_H=$(find_one cudnn.h)
NCCL_H=$(find_one nccl.h)
EXTRA_INC=""
for h in "$CUDNN_H" "$NCCL_H"; do [ -n "$h" ] && EXTRA_INC="$EXTRA_INC -I$(dirname "$h")"; done
if { [ -z "$CUDNN_H" ] || [ -z "$NCCL_H" ]; } && [ -d "$CARRY/include" ]; then
  EXTRA_INC="$EXTRA_INC -I$CARRY/include"
fi
add_ldpath() { case ":$LDPATH:" in *":$1:"*) ;; *) [ -d "$1" ] && LDPATH="$LDPATH:$1" ;; esac; }
for d in "$CUDA_HOME/lib64" "$CUDA_HOME/targets/x86_64-linux/lib"; do add_ldpath "$d"; done
for l in "$CUDNN_LIB" "$NCCL_LIB" "$CUBLAS_LIB"; do [ -n "$l" ] && add_ldpath "$(dirname "$l")"; done
# cuDNN 9 loads its engine sub-libraries from its own folder; all of a wheel's lib folders are on the path.
for w in $NVIDIA_WHEELS; do
  for d in "$w"/*/lib; do add_ldpath "$d"; done
done
export LD_LIBRARY_PATH="$LDPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export QT_QPA_PLATFORM=offscreen
{
  echo "mode=$MODE  deadline=${GN_DEADLINE_S:-480} s  host=$(hostname)  cores=$(nproc)  $(ldd --version | head -1)"
  echo "CUDA_HOME=$CUDA_HOME"; nvcc --version 2>/dev/null | tail -2; cmake --version 2>/dev/null | head -1
  echo "cudnn lib=$CUDNN_LIB h=$CUDNN_H"; echo "nccl lib=$NCCL_LIB h=$NCCL_H"; echo "cublas lib=$CUBLAS_LIB"
  echo "nvidia wheels: ${NVIDIA_WHEELS:-none}"
  echo "carried .debs unpacked: $DEBS; linked into $GNROOT/extra: $(ls "$GNROOT/extra" | tr '\n' ' ')"
  echo "Fashion-MNIST: ${FASHION_MNIST:-none}; for the examples: ${EXAMPLE_DATA:-synthetic}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} | tee "$OUT/env.txt"
[ "$DEBS" -gt 0 ] || note "debs" "none carried in $CARRY/debs: run tests/gpu/prepare-carry.sh here first"

# --- build (--build only) ----------------------------------------------------------------------------------------
case "$MODE" in
  carried) BUILD=$CARRY/build
           [ -f "$BUILD/MANIFEST.txt" ] && note "carry" "$(head -2 "$BUILD/MANIFEST.txt" | tr '\n' ' ')" ;;
  prebuilt) BUILD=$PREBUILT; note "build" "prebuilt $BUILD" ;;
  build)
    BUILD=${GN_BUILD_DIR:-$ROOT/build-gpu}
    JOBS=${GN_JOBS:+-j$GN_JOBS}  # GN_JOBS=1 on a small dev machine; ninja's default on the GPU machine
    # oneDNN's and (where the system has none) zlib's headers from the carry, searched after the system's own:
    # host C++ only (nvcc knows no -idirafter, and no .cu file includes them).
    HOST_INC="$EXTRA_INC -idirafter $GNROOT/usr/include"
    CARRIED_LIBZ=$(ls "$GNROOT"/lib/x86_64-linux-gnu/libz.so.1.* "$LIBDIR"/libz.so.1.* 2>/dev/null | head -1)
    CMAKE_ARGS=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUNODES_QT=OFF -DGPUNODES_GUI=OFF
                -DGPUNODES_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
                "-DOPENBLAS_OMP_LIB=$LIBDIR/openblas-openmp/libopenblas.so.0"
                "-DCBLAS_INCLUDE_DIR=$GNROOT/usr/include/x86_64-linux-gnu/openblas-pthread"
                "-DDNNL_LIB=$LIBDIR/libdnnl.so.2"
                "-DCMAKE_CXX_FLAGS=$HOST_INC" "-DCMAKE_CUDA_FLAGS=$EXTRA_INC")
    [ -n "$CUDNN_LIB" ] && CMAKE_ARGS+=("-DCUDNN_LIB=$CUDNN_LIB")
    [ -n "$NCCL_LIB" ] && CMAKE_ARGS+=("-DNCCL_LIB=$NCCL_LIB")
    if ! echo '#include <zlib.h>' | c++ -E -x c++ - >/dev/null 2>&1 || ! system_has libz.so; then
      [ -n "$CARRIED_LIBZ" ] && CMAKE_ARGS+=("-DZLIB_INCLUDE_DIR=$GNROOT/usr/include" "-DZLIB_LIBRARY=$CARRIED_LIBZ")
    fi
    if cmake "${CMAKE_ARGS[@]}" >"$OUT/configure.log" 2>&1 && ninja -C "$BUILD" $JOBS gn_runtime >"$OUT/build.log" 2>&1; then
      # The programs: CMake targets when the tree defines them, else compiled directly against the runtime.
      TARGETS=$(ninja -C "$BUILD" -t targets all 2>/dev/null | cut -d: -f1)
      for t in cuda_kernels_check cuda_bench train_bench; do
        if echo "$TARGETS" | grep -qx "$t"; then ninja -C "$BUILD" $JOBS "$t" >>"$OUT/build.log" 2>&1; fi
      done
      mkdir -p "$BUILD/direct"
      SO_DIR=$(dirname "$(find "$BUILD" -name 'libgn_runtime.so*' -type f | head -1)")
      # shellcheck disable=SC2054  # the commas belong to -Wl,-rpath,DIR
      DIRECT_FLAGS=(-std=c++20 -O2 -Wall -Wextra -I"$ROOT/runtime/include" -isystem "$CUDA_HOME/include"
                    -L"$SO_DIR" -Wl,-rpath,"$SO_DIR")
      if ! find "$BUILD" -name cuda_kernels_check -type f -perm -u+x | grep -q .; then
        c++ "${DIRECT_FLAGS[@]}" "$ROOT/tests/gpu/cuda_kernels_check.cpp" -o "$BUILD/direct/cuda_kernels_check" \
          -lgn_runtime >>"$OUT/build.log" 2>&1
      fi
      if ! find "$BUILD" -name cuda_bench -type f -perm -u+x | grep -q .; then
        c++ "${DIRECT_FLAGS[@]}" "$ROOT/tests/bench/cuda_bench.cpp" -o "$BUILD/direct/cuda_bench" -lgn_runtime \
          -L"$(dirname "${CUBLAS_LIB:-$CUDA_HOME/lib64/x}")" -L"$CUDA_HOME/lib64" -lcublas -lcudart >>"$OUT/build.log" 2>&1
      fi
      if ! find "$BUILD" -name train_bench -type f -perm -u+x | grep -q .; then
        c++ "${DIRECT_FLAGS[@]}" -fopenmp -I"$GNROOT/usr/include/x86_64-linux-gnu/openblas-pthread" \
          "$ROOT/tests/bench/train_bench.cpp" -o "$BUILD/direct/train_bench" -lgn_runtime \
          "$LIBDIR/openblas-openmp/libopenblas.so.0" >>"$OUT/build.log" 2>&1
      fi
      row "build" ok "$(( $(date +%s) - T0 ))" "$BUILD ($(nproc) cores)"
    else
      row "build" FAILED "$(( $(date +%s) - T0 ))" "see configure.log / build.log"
      tail -40 "$OUT/configure.log" "$OUT/build.log" 2>/dev/null
    fi
    ;;
esac
for d in "$BUILD/lib" "$(dirname "$(find "$BUILD" -name 'libgn_runtime.so*' -type f 2>/dev/null | head -1)")"; do
  [ -d "$d" ] && LD_LIBRARY_PATH="$d:$LD_LIBRARY_PATH"
done
export LD_LIBRARY_PATH

# find_bin NAME: the program in the build tree (bin/, then anywhere under it), or nothing.
find_bin() {
  if [ -x "$BUILD/bin/$1" ] && [ -f "$BUILD/bin/$1" ]; then echo "$BUILD/bin/$1"; return; fi
  find "$BUILD" -name "$1" -type f -perm -u+x 2>/dev/null | head -1
}

# --- every binary must load: ldd per binary; a missing GLIBCXX brings in the carried libstdc++ ------------------
declare -A LDD_MISSING=()
check_ldd() {
  local f missing
  : >"$OUT/ldd.txt"
  for f in $(find "$BUILD" -type f \( -name '*.so' -o -perm -u+x \) 2>/dev/null | grep -v -e '/CMakeFiles/' | sort); do
    [ "$(head -c 4 "$f" 2>/dev/null | tail -c 3)" = ELF ] || continue
    missing=$(ldd "$f" 2>&1 | grep -E "not found" | sed -E 's/^\s+//; s/ => not found//; s/.*version `([^'"'"']+)'"'"' not found.*/\1/' |
              sort -u | tr '\n' ' ')
    LDD_MISSING[$(basename "$f")]=$missing
    echo "${f#"$BUILD"/}: ${missing:-ok}" >>"$OUT/ldd.txt"
  done
}
check_ldd
if grep -qE "GLIBCXX|CXXABI|GCC_" "$OUT/ldd.txt"; then
  for f in "$LIBDIR"/libstdc++.so.6 "$GNROOT"/lib/x86_64-linux-gnu/libgcc_s.so.1 "$LIBDIR"/libgcc_s.so.1; do
    [ -e "$f" ] && link_lib "$f"
  done
  echo "the system's libstdc++/libgcc_s are too old: using the carried ones" | tee -a "$OUT/env.txt"
  check_ldd
fi
LDD_BAD=$(grep -vc ': ok$' "$OUT/ldd.txt")
LDD_ALL=$(wc -l <"$OUT/ldd.txt")
if [ "$LDD_BAD" -eq 0 ]; then row "ldd" ok "" "all $LDD_ALL binaries resolve every library"
else row "ldd" FAILED "" "$LDD_BAD of $LDD_ALL binaries miss libraries (ldd.txt): $(grep -v ': ok$' "$OUT/ldd.txt" | head -3 | tr '\n' ';')"; fi

# --- running, within the deadline ----------------------------------------------------------------------------------
# phase STEP: the step's items end by PHASE_END, its budget from now, yet early enough to keep back what the
# steps after it need (RESERVE), and never past the deadline.
PHASE_END=$DEADLINE
PHASE=setup
phase() {
  PHASE=$1
  local now
  now=$(date +%s)
  PHASE_END=$(( now + ${BUDGET[$1]:-$(( DEADLINE - now ))} ))
  # Budgets and reserves are for the default 480 s; a shorter GN_DEADLINE_S (a dry run) shrinks them alike.
  local scale=${GN_DEADLINE_S:-480}
  PHASE_END=$(( now + ${BUDGET[$1]:-$(( DEADLINE - now ))} * scale / 480 ))
  local latest=$(( DEADLINE - ${RESERVE[$1]:-10} * scale / 480 ))
  [ "$PHASE_END" -gt "$latest" ] && PHASE_END=$latest
  [ "$PHASE_END" -gt "$DEADLINE" ] && PHASE_END=$DEADLINE
  echo "-- step $1: until +$(( PHASE_END - T0 )) s of ${GN_DEADLINE_S:-480} s"
}
# run_timed LOG WANT_S CMD...: runs CMD (output to $OUT/LOG) under a timeout clipped to the step's time left.
# Sets RC (-1: not started, no time left), SECS and LIMIT.
run_timed() {
  local log=$1 want=$2
  shift 2
  local left=$(( PHASE_END - $(date +%s) ))
  LIMIT=$(( want < left ? want : left ))
  SECS=0
  if [ "$LIMIT" -lt 5 ]; then RC=-1; echo "not started: no time left in step $PHASE" >"$OUT/$log"; return; fi
  local t
  t=$(date +%s)
  timeout -k 10 "$LIMIT" "$@" >"$OUT/$log" 2>&1
  RC=$?
  SECS=$(( $(date +%s) - t ))
}
# The common part of a status: not started, timed out, or missing libraries.
status_prefix() {  # BINARY... -> sets ST (empty when the caller decides) and DET
  ST=""; DET=""
  local b miss=""
  for b in "$@"; do miss="$miss${LDD_MISSING[$b]:-}"; done
  [ -n "$miss" ] && DET="ldd: missing $miss; "
  if [ "$RC" -eq -1 ]; then ST=SKIPPED; DET="${DET}(time) no time left in step $PHASE"
  elif [ "$RC" -eq 124 ] || [ "$RC" -eq 137 ]; then ST=TIMEOUT; DET="${DET}after $LIMIT s"; fi
}

# gpunodes devices: the GPU must be listed, and try_gpu(0) must be cuda:0.
GPUNODES=$(find_bin gpunodes)
if [ "$MODE" = build ]; then
  row "gpunodes devices" SKIPPED "" "--build is Qt-free: no gpunodes, suites or examples (use --carried)"
elif [ -z "$GPUNODES" ]; then
  row "gpunodes devices" FAILED "" "no bin/gpunodes in $BUILD"
else
  run_timed devices.txt 60 "$GPUNODES" devices
  cat "$OUT/devices.txt"
  status_prefix gpunodes libgpunodes_nodes.so libgn_core.so libgn_runtime.so
  TRY0=$(grep -o 'try_gpu(0) = [^ ]*' "$OUT/devices.txt" | head -1)
  CUDA_ROW=$(grep -E '^\| cuda:0 ' "$OUT/devices.txt" | tr -s ' ' | head -1)
  if [ -z "$ST" ]; then
    if [ "$RC" -ne 0 ]; then ST=FAILED; DET="${DET}rc=$RC: $(tail -1 "$OUT/devices.txt")"
    elif [ "$HAVE_GPU" = 0 ]; then ST=SKIPPED; DET="${DET}runs; no GPU here: $TRY0"
    elif [ "$TRY0" = "try_gpu(0) = cuda:0" ] && [ -n "$CUDA_ROW" ] &&
         { [ -z "$GPU_MODEL" ] || grep -q "$GPU_MODEL" "$OUT/devices.txt"; }; then
      ST=ok; DET="${DET}$TRY0; $CUDA_ROW"
    else ST=FAILED; DET="${DET}nvidia-smi lists ${GPU_NAME:-a GPU} but: ${TRY0:-no try_gpu line}; ${CUDA_ROW:-no cuda:0 row}; $(head -1 "$OUT/devices.txt")"; fi
  fi
  row "gpunodes devices" "$ST" "$SECS" "$DET"
fi

# Qt-free programs: exit 0 ok, 77 skipped (no GPU).
run_program() {  # NAME LOG TIMEOUT [ARGS...]
  local bin
  bin=$(find_bin "$1")
  if [ -z "$bin" ]; then row "$1" FAILED "" "not built / not carried"; return; fi
  run_timed "$2" "$3" "$bin" "${@:4}"
  status_prefix "$1" libgn_runtime.so
  if [ -z "$ST" ]; then
    case $RC in
      0) ST=ok; DET="${DET}$(grep -E '^(PASSED|FAILED):' "$OUT/$2" | tail -1)"
         if grep -q "no CUDA device" "$OUT/$2"; then ST=SKIPPED; DET="${DET}$(grep -m1 "no CUDA device" "$OUT/$2")"; fi ;;
      77) ST=SKIPPED; DET="${DET}$(head -1 "$OUT/$2")" ;;
      *) ST=FAILED; DET="${DET}rc=$RC $(grep -E '^(FAILED|FAIL )' "$OUT/$2" | head -3 | tr -s ' ' | tr '\n' ';')" ;;
    esac
    # Where nvidia-smi lists a GPU, a program that finds none has failed.
    [ "$ST" = SKIPPED ] && [ "$HAVE_GPU" = 1 ] && { ST=FAILED; DET="nvidia-smi lists a GPU, yet: $DET"; }
  fi
  row "$1" "$ST" "$SECS" "$DET"
}

# Qt Test suites on cuda:0. A skipped test is a failure where there is a GPU, except the two-GPU tests on a
# machine with one.
run_suite() {  # NAME TIMEOUT
  local bin
  bin=$(find_bin "$1")
  if [ -z "$bin" ]; then
    # A suite on the list whose source is not in this tree (yet) is no failure; one that is, but was not
    # built or carried, is.
    if [ -f "$ROOT/tests/runtime/$1.cpp" ]; then row "$1" FAILED "" "not built / not carried"
    else row "$1" n/a "" "not in this tree"; fi
    return
  fi
  run_timed "suite-$1.log" "$2" env GN_TEST_DEVICE=cuda:0 QT_QPA_PLATFORM=offscreen "$bin"
  status_prefix "$1" libgn_runtime.so
  local log=$OUT/suite-$1.log totals skipped allowed fails
  totals=$(grep -E '^Totals:' "$log" | tail -1 | sed -E 's/^Totals: //; s/, 0 blacklisted//')
  skipped=$(grep -cE '^SKIP   :' "$log")
  allowed=0
  [ "$GPU_COUNT" -lt 2 ] && allowed=$(grep -E '^SKIP   :' "$log" | grep -c "needs two GPUs")
  fails=$(grep -E '^FAIL!  :' "$log" | sed -E 's/^FAIL!  : [A-Za-z0-9_]+::([A-Za-z0-9_]+)\(.*/\1/' | head -4 | tr '\n' ' ')
  if [ -z "$ST" ]; then
    if [ -z "$totals" ]; then ST=FAILED; DET="${DET}rc=$RC, no Totals line: $(tail -1 "$log")"
    elif [ "$RC" -ne 0 ]; then ST=FAILED; DET="${DET}${fails:+failed: $fails}"
    elif [ "$skipped" -gt 0 ] && [ "$HAVE_GPU" = 0 ]; then ST=SKIPPED; DET="${DET}no GPU: "
    elif [ "$skipped" -gt "$allowed" ]; then
      ST=FAILED; DET="${DET}$((skipped - allowed)) skipped on the GPU: $(grep -E '^SKIP   :' "$log" | grep -v "needs two GPUs" |
        sed -E 's/^SKIP   : [A-Za-z0-9_]+::([A-Za-z0-9_]+)\(.*/\1/' | head -3 | tr '\n' ' ')"
    else ST=ok; [ "$allowed" -gt 0 ] && DET="${DET}($allowed skip: needs two GPUs, $GPU_COUNT here) "; fi
  fi
  row "$1" "$ST" "$SECS" "${DET}${totals:+[$totals]}"
}

# Headless examples: `gpunodes run FILE --quiet --report`, in a scratch folder (some write files).
EX_WORK=/tmp/gn-examples
rm -rf "$EX_WORK"
mkdir -p "$EX_WORK"
run_example() {  # NAME TIMEOUT [--set ...]
  local name=$1 want=$2
  shift 2
  local file=$ROOT/resources/examples/$name.json
  if [ -z "$GPUNODES" ]; then row "example $name" FAILED "" "no gpunodes"; return; fi
  if [ ! -f "$file" ]; then row "example $name" SKIPPED "" "no $file"; return; fi
  local report=$OUT/report-$name.json
  rm -f "$report"
  echo "$GPUNODES run $file --quiet --report $report $*" >"$OUT/example-$name.cmd"
  # shellcheck disable=SC2016  # $1 and $@ belong to the inner shell
  run_timed "example-$name.log" "$want" bash -c 'cd "$1" && shift && exec "$@"' _ "$EX_WORK" \
    "$GPUNODES" run "$file" --quiet --report "$report" "$@"
  status_prefix gpunodes libgpunodes_nodes.so libgn_core.so libgn_runtime.so
  # From the report: whether it ran on cuda:0, failed nodes, the last test accuracy and epoch seconds.
  local info
  info=$(python3 - "$report" "$HAVE_GPU" <<'PY' 2>/dev/null
import json, sys
try:
    r = json.load(open(sys.argv[1]))
except Exception as e:
    print("noreport|no report (%s)" % type(e).__name__); sys.exit()
devs = sorted({d.get("device", "?") for d in r.get("devices", [])})
bits = ["devices " + ",".join(devs), "wall %.1f s" % (r.get("wall_ms", 0) / 1000)]
for k, v in sorted(r.get("metrics", {}).items()):
    if (k.endswith(".test_acc") or k.endswith(".epoch_seconds")) and v:
        bits.append("%s %.3g" % (k, v[-1][1]))
bad = [n + ": " + str(x.get("error", ""))[:80] for n, x in r.get("nodes", {}).items()
       if x.get("status") not in ("ok", None)]
if bad: bits.append("failed nodes: " + "; ".join(bad[:2]))
flag = "ok" if r.get("ok") else "notok"
if sys.argv[2] == "1" and not any(d.startswith("cuda") for d in devs): flag = "nocuda"
print(flag + "|" + ", ".join(bits))
PY
)
  local flag=${info%%|*}
  if [ -z "$ST" ]; then
    if [ "$RC" -ne 0 ] || [ "$flag" != ok ]; then
      ST=FAILED; DET="${DET}rc=$RC ${info#*|} $(grep -m1 -iE 'error' "$OUT/example-$name.log" | cut -c1-120)"
      [ "$flag" = nocuda ] && DET="${DET} (did not run on cuda:0)"
    else ST=ok; DET="${DET}${info#*|}"; fi
  fi
  row "example $name" "$ST" "$SECS" "$DET"
}
# --set for every Dataset node: the carried Fashion-MNIST (subset), or the synthetic set.
data_sets() {
  local id
  for id in "$@"; do
    if [ -n "$EXAMPLE_DATA" ]; then echo "--set $id.path=$EXAMPLE_DATA"; else echo "--set $id.name=synthetic"; fi
  done
}

# --- the checks, most important first ----------------------------------------------------------------------------
phase kernels
run_program cuda_kernels_check kernels.log 60
cat "$OUT/kernels.log"
if [ "$MODE" != build ]; then
  phase suites
  for s in "${CUDA_SUITES[@]}"; do run_suite "${s%%:*}" "${s##*:}"; done
  note "cuDNN RNN" "test_nn_recurrent, test_sequence_layers ran the recurrent layers through cuDNN's RNN API, never run on a GPU before (docs/gpu-checks.md)"
fi

# compute-sanitizer (it ships with the full toolkit): memcheck on the kernels the shared checks reach, racecheck
# on the reduction kernels (shared-memory trees). Only where a GPU is, and within its step.
phase sanitizer
SANITIZER=$(command -v compute-sanitizer 2>/dev/null || true)
for c in "$CUDA_HOME/bin/compute-sanitizer" "$CUDA_HOME/compute-sanitizer/compute-sanitizer"; do
  [ -z "$SANITIZER" ] && [ -x "$c" ] && SANITIZER=$c
done
# run_sanitized NAME TOOL TIMEOUT BINARY [ARGS...]: ok when the tool reports no error and the program passes.
run_sanitized() {
  local name=$1 tool=$2 want=$3 bin
  shift 3
  bin=$(find_bin "$1")
  if [ -z "$bin" ]; then row "$name" FAILED "" "no $1"; return; fi
  run_timed "sanitizer-$name.log" "$want" env GN_TEST_DEVICE=cuda:0 "$SANITIZER" --tool "$tool" \
    --error-exitcode 99 "$bin" "${@:2}"
  status_prefix "$1" libgn_runtime.so
  local log=$OUT/sanitizer-$name.log summary
  summary=$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -1 | sed 's/^=* *//')
  if [ -z "$ST" ]; then
    case $RC in
      0) ST=ok; DET="${DET}${summary}" ;;
      99) ST=FAILED; DET="${DET}${summary}: $(grep -m1 -E '^=+ +(Invalid|Race|Error|Uninitialized)' "$log" | sed 's/^=* *//' | cut -c1-100)" ;;
      *) ST=FAILED; DET="${DET}rc=$RC (the program failed under $tool) ${summary}" ;;
    esac
  fi
  row "$name" "$ST" "$SECS" "$DET"
}
if [ "$HAVE_GPU" = 0 ]; then
  row "compute-sanitizer" SKIPPED "" "no GPU here"
elif [ -z "$SANITIZER" ]; then
  row "compute-sanitizer" n/a "" "not on this machine (no full toolkit): memcheck/racecheck not run"
elif [ "$MODE" = build ]; then
  run_sanitized "memcheck kernels" memcheck 40 cuda_kernels_check --quick
else
  # All of test_device but the long cancel (seconds of 8192^3 products, slowed 10-100x).
  DEVICE_SLOTS=$(grep -oE '^  void [a-z0-9_]+\(\) \{' "$ROOT/tests/runtime/test_device.cpp" | sed -E 's/^  void ([a-z0-9_]+).*/\1/' |
                 grep -vxE 'initTestCase|cancel_drops_a_long_queue_quickly' | tr '\n' ' ')
  # shellcheck disable=SC2086  # one word per slot
  run_sanitized "memcheck test_device" memcheck 45 test_device $DEVICE_SLOTS
  run_sanitized "racecheck reductions" racecheck 15 test_device sum_and_norm_match_float64 \
    batchnorm_on_features_train_eval_and_backward
  run_sanitized "memcheck kernels" memcheck 15 cuda_kernels_check --quick
fi

if [ "$MODE" != build ]; then
  phase examples
  # Examples: on the GPU as shipped (training shrunk as their descriptions suggest); without a GPU (a dry run)
  # shrunk for the CPU, to prove the plumbing only. The short set: each starts a process and a CUDA context.
  if [ "$HAVE_GPU" = 1 ]; then
    BIG=()
    MLP=(--set data.limit=10000 --set train.epochs=1)
  else
    BIG=(--set "big_gpu.shape=[400,400]" --set "big_cpu.shape=[400,400]")
    MLP=(--set data.limit=1000 --set train.epochs=1)
  fi
  # shellcheck disable=SC2046  # data_sets prints --set words
  {
    run_example devices 20
    run_example tensors-and-copies 20
    run_example net-on-device 20
    run_example lenet-fashion-mnist 40 "${MLP[@]}" $(data_sets data)
    run_example matmul-cpu-vs-gpu 30 "${BIG[@]}"
    if [ "$HAVE_GPU" = 1 ]; then run_example compute-copy-overlap 30
    else run_example compute-copy-overlap 30 --set "x.shape=[300,300]"; fi
  }
fi
phase bench
run_program cuda_bench bench.log 40
cat "$OUT/bench.log"
# One ResNet-18 epoch (batch 256, lr 0.1, 96x96) on cuda:0 in fp32 and in bf16, each next to PyTorch on the
# same GPU at the same setting (fp32 without TF32, bf16 under autocast). Without the whole Fashion-MNIST (the
# carried subset is too small for its PyTorch side) both train on random images.
# The budget: at >= 1000 images/s for ours and >= 3000 for PyTorch (fp32, 96x96, H200), N images in two
# precisions train in at most N * 2 * (1/1000 + 1/3000) s, plus about 60 s of start-up (CUDA contexts, torch's
# import, cuDNN's autotuning) and evaluation. So N follows the time the steps before left: at most 30000, at
# least ten batches, and 10 s kept for the table.
phase train
PHASE_END=$(( DEADLINE - 10 ))
TRAIN_IMAGES=$(( ( PHASE_END - $(date +%s) - 60 ) * 3000 / 8 ))
[ "$TRAIN_IMAGES" -gt 30000 ] && TRAIN_IMAGES=30000
[ "$TRAIN_IMAGES" -lt 2560 ] && TRAIN_IMAGES=2560  # ten batches: still a measure
run_program train_bench train.log 300 --gpu --no-cpu --precision fp32,bf16 --gpu-images "$TRAIN_IMAGES" \
  --data "${FASHION_MNIST:-/nonexistent}"
cat "$OUT/train.log"

# What one GPU cannot exercise: rows of the table, so that the reply (its tail) says it.
if [ "$GPU_COUNT" -lt 2 ]; then
  row "not run: NCCL across ranks" n/a "" "one GPU cannot host two NCCL ranks; kept right by construction (return codes checked, abort-and-destroy on error) and review"
  row "not run: peer copies" n/a "" "cuda:0 <-> cuda:1 needs two GPUs (cuda_kernels_check says so)"
  row "not run: multi-GPU data parallel" n/a "" "gradient all-reduce over devices; the restored current device is kept by construction (docs/gpu-checks.md)"
fi

# --- the table (last, so that the tool's output tail shows it) ------------------------------------------------------
# One table: every item, then the bench and training rows (result "bench").
table_rows() {
  local line
  for line in "${SUMMARY[@]}"; do echo "$line"; done
  grep -E "^FAIL" "$OUT/kernels.log" 2>/dev/null | head -5 |
    while read -r line; do printf '%-30s %-8s %5s  %s\n' "  kernels" FAIL "" "$line"; done
  sed -n '/^SUMMARY/,$p' "$OUT/bench.log" 2>/dev/null | sed '1d' | grep -v '^ *$' |
    while read -r line; do printf '%-30s %-8s %5s  %s\n' "cuda_bench" bench "" "$line"; done
  # The heading names the images trained on; the rows carry their precision ("images/s, 1 GPU bf16").
  grep -E "^ResNet-18, one epoch|^\| (epoch seconds|test accuracy|images/s)|random images|failed at" "$OUT/train.log" \
    2>/dev/null | while read -r line; do printf '%-30s %-8s %5s  %s\n' "train_bench" bench "" "$line"; done
}
{
  COUNTS=$(printf '%s\n' "${SUMMARY[@]}" | awk '{for (i = 1; i <= NF; ++i) if ($i ~ /^(ok|FAILED|SKIPPED|TIMEOUT|n\/a)$/) {print $i; break}}' |
           sort | uniq -c | awk '{printf "%s %s, ", $2, $1}')
  echo
  echo "==== device-check: $MODE, ${GPU_NAME:-no GPU}, $(( $(date +%s) - T0 )) s of ${GN_DEADLINE_S:-480}; ${COUNTS%, }; logs $OUT ===="
  printf '%-30s %-8s %5s  %s\n' "suite / item" "result" "secs" "detail"
  table_rows
} | tee "$OUT/summary.txt"
# Exit 1 when anything failed or timed out (skips alone, as on a machine without a GPU, exit 0).
[ "$BAD" -eq 0 ]
