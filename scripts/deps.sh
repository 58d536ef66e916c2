# Sourced by run.sh and test.sh: installs the Debian packages gpunodes needs, only when one is missing,
# with one apt-get update. Needs root (or sudo) on a fresh machine; does nothing when all are present.
GPUNODES_PACKAGES=(cmake ninja-build g++ pkg-config
  qt6-base-dev libqcustomplot-dev
  qt6-svg-dev  # the plots' SVG export (QSvgGenerator)
  qt6-qpa-plugins  # Qt's VNC platform: the display the killed-editor suite types into
  libopenblas-dev libopenblas0-openmp libdnnl-dev
  dataset-fashion-mnist
  libonnx-dev libprotobuf-dev python3-onnx  # ONNX import and export (nodes/onnx/) and the ONNX checker
  python3-venv  # test_onnx_export's onnx_venv fixture: onnxruntime from PyPI into build/onnx-venv
  python3-torch python3-numpy  # the PyTorch peer: interop tests and benchmark ratios (CPU build, /usr/bin/python3)
  openmpi-bin libopenmpi-dev  # data-parallel training across processes; the 2-rank suites run under mpirun
  iproute2  # ip netns and veth pairs: the two test hosts of tests/dist/two_hosts.sh (faults across hosts)
  xvfb xauth)

gpunodes_install_deps() {
  local missing=() p
  for p in "${GPUNODES_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  echo "gpunodes: installing ${missing[*]}" >&2
  local sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq &&
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

# Configures (once) and builds into $1 with any extra CMake arguments after it.
gpunodes_build() {
  local dir=$1
  shift
  local cuda_args=()
  # Building every CUDA architecture costs minutes on 2 cores; without a GPU one is enough to prove the CUDA
  # path compiles. With a GPU that answers, CMake builds for it (native); GPUNODES_CUDA_ARCHS overrides both.
  if [ -n "${GPUNODES_CUDA_ARCHS:-}" ]; then
    cuda_args=(-DCMAKE_CUDA_ARCHITECTURES="$GPUNODES_CUDA_ARCHS")
  elif [ -x /usr/local/cuda/bin/nvcc ] && ! nvidia-smi --query-gpu=compute_cap --format=csv,noheader >/dev/null 2>&1; then
    cuda_args=(-DCMAKE_CUDA_ARCHITECTURES=90)
  fi
  if [ ! -f "$dir/build.ninja" ]; then
    cmake -S . -B "$dir" -G Ninja "${cuda_args[@]}" "$@" || return 1
  fi
  cmake --build "$dir" --parallel "$(nproc)"
}
