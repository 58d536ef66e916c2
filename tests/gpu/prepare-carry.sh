#!/usr/bin/env bash
# Fills .gpu-carry/ (git-ignored) on the dev machine, for `tests/gpu/device-check.sh --carried` on a lent GPU
# machine: that machine has CUDA 13, cuDNN and NCCL (in PyTorch's nvidia
# wheels) but no Qt, OpenBLAS or oneDNN and no network, so the binaries are built here and travel with the
# runtime libraries they need as Debian packages.
#
#   bash tests/gpu/prepare-carry.sh          then check `du -sh .gpu-carry` (the carry holds 64 MiB in all,
#                                            the working tree included; this aims under 55 MiB)
#
# What it does:
#   1. Builds the needed targets in the build tree ($GN_CARRY_BUILD, default ./build, which is configured with
#      -DCMAKE_CUDA_ARCHITECTURES=90): `cmake --build build --target ...`. ./build is shared: while another
#      ninja works in it, this waits, and a failed build is retried (GN_CARRY_WAIT_S, default 1800 s).
#      A missing tree is configured (release, CUDA on, arch 90, no editor).
#   2. Copies into .gpu-carry/build/ only what travels, debug info stripped (objcopy --strip-debug):
#      lib/libgn_runtime.so, lib/libgn_core.so; bin/test_nn_cuda, test_nn_layers, test_nn_network,
#      test_nn_models, test_runtime, test_engine (the Qt Test suites that touch the CUDA device);
#      bin/cuda_kernels_check, cuda_bench, train_bench; bin/gpunodes and bin/plugins/*.so (the node plugin).
#      When the tree builds the editor, bin/gpunodes is recompiled headless (app/main.cpp + app/cli/cli.cpp
#      against the tree's libgn_core.so, Qt Core only), so that Qt Gui/Widgets and X11 need not travel.
#   3. Downloads the .debs the binaries need that the GPU machine lacks into .gpu-carry/debs (apt-get
#      download): the fixed list below plus the package of every library `ldd` resolves outside glibc and CUDA.
#      With GN_CARRY_BUILD_DEPS=1 (the default) also what `device-check.sh --build` needs to build there:
#      libopenblas-pthread-dev (cblas.h), libdnnl-dev, zlib1g-dev (~6 MB) and cuDNN's and NCCL's headers
#      (.gpu-carry/include, ~0.4 MB); GN_CARRY_BUILD_DEPS=0 leaves them out.
#   4. Copies a subset of Fashion-MNIST (the first $GN_CARRY_TRAIN_IMAGES training images, default 10000, and
#      the whole test set; ~9 MB instead of 31) to .gpu-carry/data/fashion-mnist, for the training examples.
#   5. Adds /.gpu-carry/ to .git/info/exclude, writes .gpu-carry/build/MANIFEST.txt and prints the sizes.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
CARRY=$ROOT/.gpu-carry
BUILD=${GN_CARRY_BUILD:-$ROOT/build}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
JOBS=${GN_JOBS:-$(nproc)}
WAIT_S=${GN_CARRY_WAIT_S:-1800}
TRAIN_IMAGES=${GN_CARRY_TRAIN_IMAGES:-10000}
BUILD_DEPS=${GN_CARRY_BUILD_DEPS:-1}
LIMIT_MIB=55
T0=$(date +%s)

log() { echo "== prepare-carry: $*"; }
die() { echo "prepare-carry: error: $*" >&2; exit 1; }

# --- 1. the build tree ---------------------------------------------------------------------------------------
# Another engineer's ninja in this tree (started directly or by cmake --build): its pid, or nothing.
other_ninja() {
  local p
  for p in /proc/[0-9]*; do
    [ "$(cat "$p/comm" 2>/dev/null)" = ninja ] || continue
    [ "${p#/proc/}" = "$$" ] && continue
    if [ "$(readlink "$p/cwd" 2>/dev/null)" = "$BUILD" ] ||
       tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q -- "-C $BUILD\( \|$\)"; then
      echo "${p#/proc/}"; return
    fi
  done
}
wait_for_quiet() {
  local pid waited=0
  while pid=$(other_ninja) && [ -n "$pid" ]; do
    [ $waited -eq 0 ] && log "another ninja (pid $pid) is building in $BUILD; waiting (up to ${WAIT_S} s)"
    [ $waited -ge "$WAIT_S" ] && die "$BUILD stayed busy for ${WAIT_S} s"
    sleep 10; waited=$((waited + 10))
  done
  [ $waited -gt 0 ] && log "the tree is free after ${waited} s"
  return 0
}

if [ ! -f "$BUILD/CMakeCache.txt" ]; then
  log "configuring $BUILD (Release, CUDA on, arch 90, no editor)"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGPUNODES_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DGPUNODES_GUI=OFF
fi
cache() { sed -n "s/^$1:[A-Z]*=//p" "$BUILD/CMakeCache.txt" | head -1; }
ARCHS=$(cache CMAKE_CUDA_ARCHITECTURES)
BUILD_TYPE=$(cache CMAKE_BUILD_TYPE)
BUILD_TYPE=${BUILD_TYPE:-RelWithDebInfo, the project default}
GUI=$(cache GPUNODES_GUI)
grep -q 'cuda_backend\.cu\.o' "$BUILD/build.ninja" || die "$BUILD builds no CUDA backend (GPUNODES_CUDA off, or no toolkit)"
case " $ARCHS " in *" 90 "*|*"90;"*|*";90"*|*" 90-real "*) ;;
  *) die "$BUILD builds CUDA archs '$ARCHS', not 90 (the H200); reconfigure with -DCMAKE_CUDA_ARCHITECTURES=90" ;;
esac
log "build tree $BUILD: type '$BUILD_TYPE', CUDA archs '$ARCHS', editor ${GUI:-ON}"

wait_for_quiet
ALL_TARGETS=$(ninja -C "$BUILD" -t targets all 2>/dev/null | sed -n 's/: phony$//p')
have_target() { echo "$ALL_TARGETS" | grep -qx "$1"; }
# The suites device-check.sh runs, from its own list (one list: CTest checks it against the CUDA tests).
mapfile -t SUITES < <(bash "$ROOT/tests/gpu/device-check.sh" --list-suites)
PROGRAMS=(cuda_kernels_check cuda_bench train_bench)
TARGETS=(gn_runtime gn_core gpunodes_nodes)
[ "$GUI" = OFF ] && TARGETS+=(gpunodes)
for t in "${SUITES[@]}" "${PROGRAMS[@]}"; do
  if have_target "$t"; then TARGETS+=("$t"); else log "warning: $BUILD has no target $t"; fi
done
BUILD_LOG=$(mktemp /tmp/gn-prepare-carry-build.XXXXXX)
for try in 1 2 3 4; do
  wait_for_quiet
  log "cmake --build $BUILD --target ${TARGETS[*]} -j$JOBS (try $try)"
  if cmake --build "$BUILD" --target "${TARGETS[@]}" -j"$JOBS" >"$BUILD_LOG" 2>&1; then
    tail -1 "$BUILD_LOG"; break
  fi
  tail -15 "$BUILD_LOG"
  [ $try -eq 4 ] && die "the build failed 4 times (log: $BUILD_LOG)"
  log "build failed (another build mid-way, or a source mid-edit?); retrying in 30 s"
  sleep 30
done

# --- 2. the binaries ------------------------------------------------------------------------------------------
rm -rf "$CARRY/build"
mkdir -p "$CARRY/build/bin/plugins" "$CARRY/build/lib"
carry_file() {  # SRC DEST-RELATIVE
  [ -f "$1" ] || die "missing $1"
  objcopy --strip-debug "$1" "$CARRY/build/$2"
  chmod +x "$CARRY/build/$2"
}
carry_file "$BUILD/lib/libgn_runtime.so" lib/libgn_runtime.so
carry_file "$BUILD/lib/libgn_core.so" lib/libgn_core.so
# gn_dist without MPI: the GPU machine has no Open MPI (no mpirun to launch ranks), and a world of one needs
# none of its libraries. Same soname and symbols as the tree's, so the carried runtime loads it.
c++ -std=gnu++20 -O2 -DNDEBUG -fPIC -shared -I"$ROOT/dist/include" "$ROOT/dist/src/world.cpp" \
  -Wl,-soname,libgn_dist.so -o "$CARRY/build/lib/libgn_dist.so"
for t in "${SUITES[@]}" "${PROGRAMS[@]}"; do
  if [ -f "$BUILD/bin/$t" ]; then carry_file "$BUILD/bin/$t" "bin/$t"; else log "warning: no $BUILD/bin/$t"; fi
done
for p in "$BUILD"/bin/plugins/*.so; do carry_file "$p" "bin/plugins/$(basename "$p")"; done
if [ "$GUI" = OFF ]; then
  carry_file "$BUILD/bin/gpunodes" bin/gpunodes
else
  # The editor build's gpunodes links Qt Widgets, Gui, QCustomPlot and X11: build the same CLI without them.
  CACHE_DIR=/tmp/gn-carry-cache
  HEADLESS=$CACHE_DIR/gpunodes-headless
  mkdir -p "$CACHE_DIR"
  if [ ! -x "$HEADLESS" ] || [ -n "$(find "$ROOT/app/main.cpp" "$ROOT/app/cli" "$ROOT/app/core/include" \
                                         "$ROOT/dist" "$BUILD/lib/libgn_core.so" -newer "$HEADLESS" 2>/dev/null |
                                    head -1)" ]; then
    log "compiling a headless gpunodes (app/main.cpp, app/cli/cli.cpp and sweep.cpp; Qt Core only)"
    # shellcheck disable=SC2046,SC2016  # pkg-config's words; $ORIGIN is for the linker
    c++ -std=gnu++20 -O2 -DNDEBUG -DQT_NO_DEBUG -fPIC -Wall -Wextra -Wno-missing-field-initializers \
      $(pkg-config --cflags Qt6Core) -I"$ROOT/app" -I"$ROOT/app/core/include" -I"$ROOT/dist/include" \
      "$ROOT/app/main.cpp" "$ROOT/app/cli/cli.cpp" "$ROOT/app/cli/sweep.cpp" -o "$HEADLESS.tmp" \
      -L"$BUILD/lib" -lgn_core -L"$CARRY/build/lib" -lgn_dist $(pkg-config --libs Qt6Core) \
      -Wl,-rpath,'$ORIGIN/../lib'
    mv "$HEADLESS.tmp" "$HEADLESS"
  fi
  carry_file "$HEADLESS" bin/gpunodes
fi
BINARIES=$(find "$CARRY/build/bin" "$CARRY/build/lib" -type f -perm -u+x | sort)

# --- 3. the runtime packages ----------------------------------------------------------------------------------
PACKAGES=(libqt6core6 libqt6test6 libicu72 libdouble-conversion3 libb2-1 libpcre2-16-0 libglib2.0-0
          libopenblas0-openmp libgfortran5 libquadmath0 libgomp1 libdnnl2 ocl-icd-libopencl1 zlib1g libzstd1)
# Every library ldd resolves for the carried binaries, outside glibc, CUDA and the carried lib/: its package.
declare -A SEEN=()
for p in "${PACKAGES[@]}"; do SEEN[$p]=1; done
for f in $BINARIES; do
  LD_LIBRARY_PATH=$CARRY/build/lib ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  case "$soname" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|libresolv.so.*|libutil.so.*|ld-linux*) continue ;;
    libcuda.so*|libcudart.so*|libcublas*|libcudnn*|libnccl*|libnvrtc*|libnvJitLink*|libcufft*|libcurand*) continue ;;
  esac
  case "$path" in "$CARRY"/*) continue ;; esac
  real=$(readlink -f "$path")
  pkg=$( (dpkg -S "$path" 2>/dev/null || dpkg -S "$real" 2>/dev/null || dpkg -S "/usr$path" 2>/dev/null) |
        head -1 || true)
  pkg=${pkg%%:*}
  if [ -z "$pkg" ]; then echo "nopkg $soname $path"; else echo "pkg $pkg $soname"; fi
done >"$CARRY/.ldd-packages.txt"
while read -r kind a b; do
  if [ "$kind" = nopkg ]; then log "warning: $a ($b) belongs to no Debian package; it will not travel"; continue; fi
  [ "$a" = libc6 ] && continue
  if [ -z "${SEEN[$a]:-}" ]; then SEEN[$a]=1; PACKAGES+=("$a"); log "ldd adds $a (for $b)"; fi
done <"$CARRY/.ldd-packages.txt"
rm -f "$CARRY/.ldd-packages.txt"
rm -rf "$CARRY/include"
if [ "$BUILD_DEPS" = 1 ]; then
  PACKAGES+=(libopenblas-pthread-dev libdnnl-dev zlib1g-dev)
  mkdir -p "$CARRY/include"
  CUDA_INC=${CUDA_HOME:-/usr/local/cuda}/include
  cp "$CUDA_INC"/cudnn*.h "$CUDA_INC"/nccl.h "$CARRY/include/" 2>/dev/null ||
    log "warning: no cuDNN/NCCL headers in $CUDA_INC for the --build fallback"
fi

mkdir -p "$CARRY/debs"
DEB_TMP=$(mktemp -d /tmp/gn-carry-debs.XXXXXX)
if (cd "$DEB_TMP" && apt-get download "${PACKAGES[@]}" >"$DEB_TMP/apt.log" 2>&1); then
  rm -f "$CARRY"/debs/*.deb
  mv "$DEB_TMP"/*.deb "$CARRY/debs/"
  log "downloaded ${#PACKAGES[@]} packages"
else
  tail -5 "$DEB_TMP/apt.log"
  if ls "$CARRY"/debs/*.deb >/dev/null 2>&1; then log "warning: apt-get download failed; keeping the .debs already there"
  else die "apt-get download failed"; fi
fi
rm -rf "$DEB_TMP"

# --- 4. a Fashion-MNIST subset --------------------------------------------------------------------------------
FMNIST=${GN_FASHION_MNIST:-/usr/share/datasets/fashion-mnist}
rm -rf "$CARRY/data"
if [ -f "$FMNIST/train-images-idx3-ubyte.gz" ] && [ "$TRAIN_IMAGES" -gt 0 ]; then
  mkdir -p "$CARRY/data/fashion-mnist"
  # The first N training images and labels as valid IDX files (the header's count says N); the test set whole.
  python3 - "$FMNIST" "$CARRY/data/fashion-mnist" "$TRAIN_IMAGES" <<'PY'
import gzip, struct, sys
src, dst, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
for name, dims in (("train-images-idx3-ubyte", 3), ("train-labels-idx1-ubyte", 1)):
    raw = gzip.open(f"{src}/{name}.gz").read()
    head = 4 + 4 * dims
    shape = list(struct.unpack(">" + "I" * dims, raw[4:head]))
    per = 1
    for d in shape[1:]:
        per *= d
    keep = min(n, shape[0])
    out = raw[:4] + struct.pack(">" + "I" * dims, keep, *shape[1:]) + raw[head:head + keep * per]
    with open(f"{dst}/{name}.gz", "wb") as f:
        f.write(gzip.compress(out, 9, mtime=0))
PY
  cp "$FMNIST"/t10k-images-idx3-ubyte.gz "$FMNIST"/t10k-labels-idx1-ubyte.gz "$CARRY/data/fashion-mnist/"
  echo "Fashion-MNIST subset: the first $TRAIN_IMAGES training images of $FMNIST, the test set whole." \
    >"$CARRY/data/fashion-mnist/README"
else
  log "no Fashion-MNIST at $FMNIST: the training examples will use the synthetic set"
fi

# --- 5. exclude, manifest, sizes ------------------------------------------------------------------------------
EXCLUDE=$(git -C "$ROOT" rev-parse --git-path info/exclude 2>/dev/null || echo "$ROOT/.git/info/exclude")
case "$EXCLUDE" in /*) ;; *) EXCLUDE=$ROOT/$EXCLUDE ;; esac
mkdir -p "$(dirname "$EXCLUDE")"
grep -qxF "/.gpu-carry/" "$EXCLUDE" 2>/dev/null || echo "/.gpu-carry/" >>"$EXCLUDE"

{
  echo "prepared $(date -u '+%Y-%m-%d %H:%M:%S UTC') on $(hostname) by tests/gpu/prepare-carry.sh"
  echo "source: $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')" \
       "+ $(git -C "$ROOT" status --porcelain 2>/dev/null | wc -l) changed/untracked paths"
  echo "build tree: $BUILD (CMAKE_BUILD_TYPE '$BUILD_TYPE', CUDA archs '$ARCHS', editor ${GUI:-ON})"
  [ "$GUI" = OFF ] || echo "bin/gpunodes: headless, compiled from app/main.cpp + app/cli/cli.cpp"
  echo "packages: ${PACKAGES[*]}"
  echo "files (stripped of debug info):"
  for f in $BINARIES; do
    rel=${f#"$CARRY"/build/}
    built=$(date -u -r "$BUILD/$rel" '+%F %T')
    [ "$rel" = bin/gpunodes ] && [ "$GUI" != OFF ] && built="$(date -u -r "$HEADLESS" '+%F %T') (headless)"
    printf '  %-34s %9d bytes  built %s\n' "$rel" "$(stat -c %s "$f")" "$built"
  done
} >"$CARRY/build/MANIFEST.txt"
cat "$CARRY/build/MANIFEST.txt"

echo
du -sh "$CARRY/build" "$CARRY/debs" "$CARRY/data" "$CARRY/include" 2>/dev/null || true
TOTAL_KIB=$(du -sk "$CARRY" | cut -f1)
TREE_KIB=$(( $(git -C "$ROOT" ls-files -co --exclude-standard -z | xargs -0 du -ck 2>/dev/null | tail -1 | cut -f1) ))
echo "total .gpu-carry: $((TOTAL_KIB / 1024)) MiB ($TOTAL_KIB KiB); working tree: $((TREE_KIB / 1024)) MiB;" \
     "carry limit 64 MiB in all"
if [ "$TOTAL_KIB" -gt $((LIMIT_MIB * 1024)) ]; then
  echo "WARNING: .gpu-carry is over ${LIMIT_MIB} MiB: drop .gpu-carry/data (GN_CARRY_TRAIN_IMAGES=0) or packages" >&2
fi
log "done in $(( $(date +%s) - T0 )) s. Next: OUT=/tmp/dc bash tests/gpu/device-check.sh --carried (dry run here)"
