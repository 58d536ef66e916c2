#!/usr/bin/env bash
# Builds gpunodes if needed and runs it: the editor when a display exists, otherwise the quick default
# example headless (its summary table is printed). Extra arguments go to gpunodes.
set -euo pipefail
cd "$(dirname "$0")"
source scripts/deps.sh
gpunodes_install_deps
gpunodes_build build
bin=build/bin/gpunodes
example=resources/examples/quickstart.json
if [ $# -gt 0 ]; then
  exec "$bin" "$@"
fi
"$bin" devices
if [ -n "${DISPLAY:-}${WAYLAND_DISPLAY:-}" ]; then
  exec "$bin" "$example"
fi
echo
echo "No display: running $example headless (open it in the editor with ./run.sh $example on a desktop)."
exec "$bin" run "$example"
