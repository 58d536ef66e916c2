#!/usr/bin/env bash
# CUDA checks for the lent GPU machine (see /work/shared/GPU-CHECKS.md). That machine has CUDA 13, cmake,
# ninja and python3 with PyTorch (whose wheels hold cuDNN and NCCL), but no OpenBLAS, no Qt, no network.
#
# Prepare on the dev machine, once (.gpu-carry/ is git-ignored):
#   mkdir -p .gpu-carry/debs && (cd .gpu-carry/debs && apt-get download \
#       libopenblas0-openmp libopenblas-pthread-dev libgfortran5 libquadmath0 libgomp1 \
#       libdnnl2 libdnnl-dev ocl-icd-libopencl1 zlib1g zlib1g-dev)
#   # optional (31 MB of the 64 MiB carry): the real Fashion-MNIST for the training epoch's test accuracy
#   (cd .gpu-carry/debs && apt-get download dataset-fashion-mnist)
#   # fallback headers, in case the GPU machine's wheels ship cuDNN/NCCL without them (~0.4 MB):
#   mkdir -p .gpu-carry/include && cp /usr/local/cuda/include/{cudnn*.h,nccl.h} .gpu-carry/include/
# (libopenblas-pthread-dev is only for cblas.h, which is the same for the OpenMP build.) gn_runtime's training
# layer needs oneDNN (libdnnl2: libdnnl.so.2, which links libOpenCL.so.1 from ocl-icd-libopencl1, and libgomp1;
# libdnnl-dev: its headers) and zlib (zlib1g, zlib1g-dev: zlib.h) for the gzipped IDX files; apt-cache depends
# libdnnl2 lists libc6, libgcc-s1, libgomp1, libstdc++6 and ocl-icd-libopencl1.
#
# The layer suites (GN_TEST_DEVICE=cuda:0 test_nn) are Qt Test programs and cannot run here; training is
# checked with train_bench --gpu --no-cpu instead: one ResNet-18 epoch on cuda:0, seconds and test accuracy,
# beside PyTorch's on the same GPU in the same call.
#
# Run through the device tool, carrying .gpu-carry:
#   bash tests/gpu/device-check.sh                    configure + build into build-gpu here, then check
#   bash tests/gpu/device-check.sh --prebuilt DIR     use a build tree made elsewhere with
#                                                     -DCMAKE_CUDA_ARCHITECTURES=90 (e.g. .gpu-carry/build)
# Logs go to $OUT (the device tool's fetch folder); the summary table is printed last.
set -u -o pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${OUT:-/tmp/gn-device-check}
mkdir -p "$OUT"
PREBUILT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prebuilt) PREBUILT=$(cd "$2" && pwd); shift 2 ;;
    *) echo "usage: $0 [--prebuilt BUILD_DIR]" >&2; exit 2 ;;
  esac
done

declare -a SUMMARY=()
note() { SUMMARY+=("$(printf '%-22s %s' "$1" "$2")"); echo "== $1: $2"; }
T0=$(date +%s)

# --- the GPU ------------------------------------------------------------------------------------------------
nvidia-smi -L 2>&1 | tee "$OUT/nvidia-smi.txt"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv >>"$OUT/nvidia-smi.txt" 2>&1
note "gpu" "$(nvidia-smi -L 2>/dev/null | head -1 || echo 'nvidia-smi failed')"

# --- host libraries from the carried .debs, unpacked privately (never into /) ------------------------------
GNROOT=/tmp/gnroot
LIBDIR=$GNROOT/usr/lib/x86_64-linux-gnu
mkdir -p "$GNROOT/extra"
for f in "$ROOT"/.gpu-carry/debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" "$GNROOT"; done
# OpenBLAS (OpenMP build) always from the carry; its Fortran/OpenMP dependencies only where the system lacks
# them, since the system's own (newer) libgomp is the one gcc links here.
for lib in libgfortran.so.5 libquadmath.so.0 libgomp.so.1 libOpenCL.so.1; do
  if ! ldconfig -p | grep -q " $lib " && [ -e "$LIBDIR/$lib" ]; then ln -sf "$LIBDIR/$lib" "$GNROOT/extra/$lib"; fi
done
# oneDNN always from the carry (the machine has none); zlib only where the system lacks it. Linked one by one
# into extra/, so that the carried libgomp in $LIBDIR never shadows the system's.
[ -e "$LIBDIR/libdnnl.so.2" ] && ln -sf "$LIBDIR/libdnnl.so.2" "$GNROOT/extra/libdnnl.so.2"
CARRIED_LIBZ=$(ls "$GNROOT"/lib/x86_64-linux-gnu/libz.so.1.* "$LIBDIR"/libz.so.1.* 2>/dev/null | head -1)
if ! ldconfig -p | grep -q " libz.so.1 " && [ -n "$CARRIED_LIBZ" ]; then ln -sf "$CARRIED_LIBZ" "$GNROOT/extra/libz.so.1"; fi
LDPATH="$LIBDIR/openblas-openmp:$GNROOT/extra"
# Fashion-MNIST, when its package was carried; without it train_bench times random images.
FASHION_MNIST=$GNROOT/usr/share/datasets/fashion-mnist
[ -e "$FASHION_MNIST/train-images-idx3-ubyte.gz" ] || FASHION_MNIST=/usr/share/datasets/fashion-mnist

# --- CUDA libraries: the toolkit first, then PyTorch's nvidia wheels ------------------------------------------
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
[ -x "$CUDA_HOME/bin/nvcc" ] || CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
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
if { [ -z "$CUDNN_H" ] || [ -z "$NCCL_H" ]; } && [ -d "$ROOT/.gpu-carry/include" ]; then
  EXTRA_INC="$EXTRA_INC -I$ROOT/.gpu-carry/include"
fi
for l in "$CUDNN_LIB" "$NCCL_LIB" "$CUBLAS_LIB"; do [ -n "$l" ] && LDPATH="$LDPATH:$(dirname "$l")"; done
# cuDNN 9 loads its engine sub-libraries from its own folder; all of a wheel's lib folders are on the path.
for w in $NVIDIA_WHEELS; do
  for d in "$w"/*/lib; do [ -d "$d" ] && LDPATH="$LDPATH:$d"; done
done
export LD_LIBRARY_PATH="$LDPATH${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
{
  echo "CUDA_HOME=$CUDA_HOME"; nvcc --version | tail -2; cmake --version | head -1
  echo "cudnn lib=$CUDNN_LIB h=$CUDNN_H"; echo "nccl lib=$NCCL_LIB h=$NCCL_H"; echo "cublas lib=$CUBLAS_LIB"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
} | tee "$OUT/env.txt"

# --- build -----------------------------------------------------------------------------------------------------
if [ -n "$PREBUILT" ]; then
  BUILD=$PREBUILT
  note "build" "prebuilt $BUILD"
else
  BUILD=${GN_BUILD_DIR:-$ROOT/build-gpu}
  JOBS=${GN_JOBS:+-j$GN_JOBS}  # GN_JOBS=1 on a small dev machine; ninja's default on the GPU machine
  # oneDNN's and (where the system has none) zlib's headers from the carry, searched after the system's own:
  # host C++ only (nvcc knows no -idirafter, and no .cu file includes them).
  HOST_INC="$EXTRA_INC -idirafter $GNROOT/usr/include"
  CMAKE_ARGS=(-S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUNODES_QT=OFF -DGPUNODES_GUI=OFF
              -DGPUNODES_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90
              "-DOPENBLAS_OMP_LIB=$LIBDIR/openblas-openmp/libopenblas.so.0"
              "-DCBLAS_INCLUDE_DIR=$GNROOT/usr/include/x86_64-linux-gnu/openblas-pthread"
              "-DDNNL_LIB=$LIBDIR/libdnnl.so.2"
              "-DCMAKE_CXX_FLAGS=$HOST_INC" "-DCMAKE_CUDA_FLAGS=$EXTRA_INC")
  [ -n "$CUDNN_LIB" ] && CMAKE_ARGS+=("-DCUDNN_LIB=$CUDNN_LIB")
  [ -n "$NCCL_LIB" ] && CMAKE_ARGS+=("-DNCCL_LIB=$NCCL_LIB")
  if ! echo '#include <zlib.h>' | c++ -E -x c++ - >/dev/null 2>&1 || ! ldconfig -p | grep -q " libz.so "; then
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
    note "build" "ok in $(( $(date +%s) - T0 )) s ($(nproc) cores)"
  else
    note "build" "FAILED (see configure.log / build.log)"
    tail -40 "$OUT/configure.log" "$OUT/build.log" 2>/dev/null
  fi
fi
RUNTIME_SO=$(find "$BUILD" -name 'libgn_runtime.so*' -type f 2>/dev/null | head -1)
if [ -n "$RUNTIME_SO" ]; then LD_LIBRARY_PATH="$(dirname "$RUNTIME_SO"):$LD_LIBRARY_PATH"; export LD_LIBRARY_PATH; fi

# --- run ---------------------------------------------------------------------------------------------------------
run_program() {  # NAME LOG TIMEOUT [ARGS...]
  local bin
  bin=$(find "$BUILD" -name "$1" -type f -perm -u+x 2>/dev/null | head -1)
  if [ -z "$bin" ]; then note "$1" "NOT BUILT"; return; fi
  ldd "$bin" | grep "not found" | tee "$OUT/ldd-$1.txt"
  local t
  t=$(date +%s)
  timeout "$3" "$bin" "${@:4}" >"$OUT/$2" 2>&1
  local rc=$?
  local secs=$(( $(date +%s) - t ))
  case $rc in
    0) note "$1" "ok (${secs} s)" ;;
    77) note "$1" "SKIPPED: $(head -1 "$OUT/$2")" ;;
    124) note "$1" "TIMEOUT after $3 s" ;;
    *) note "$1" "FAILED rc=$rc (${secs} s)" ;;
  esac
}
run_program cuda_kernels_check kernels.log 240
cat "$OUT/kernels.log"
run_program cuda_bench bench.log 240
cat "$OUT/bench.log"
# One ResNet-18 epoch (batch 256, lr 0.1, 96x96) on cuda:0 and the same in PyTorch on the same GPU.
run_program train_bench train.log 300 --gpu --no-cpu --data "$FASHION_MNIST"
cat "$OUT/train.log"

# --- summary (last, so that the tool's output tail shows it) --------------------------------------------------------
echo
echo "================ device-check summary ($(( $(date +%s) - T0 )) s) ================"
for line in "${SUMMARY[@]}"; do echo "$line"; done
grep -E "^(FAIL|ok) |PASSED|FAILED" "$OUT/kernels.log" 2>/dev/null | grep -vE "^ok " | sed 's/^/  kernels: /'
sed -n '/^SUMMARY/,$p' "$OUT/bench.log" 2>/dev/null | sed 's/^/  bench: /'
grep -E "^\| (epoch seconds|test accuracy|images/s)|random images" "$OUT/train.log" 2>/dev/null | sed 's/^/  train: /'
