#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to meshload's main job:
# installs the Debian packages meshload needs, builds it, writes a synthetic
# dataset and runs the whole data path on this machine:
#
#   meshload run --local -f examples/local-fixedrecord.yaml \
#       --generate-dataset <tmp> --steps 2000
#
# One meshload-sidecar per job process stages batches in shared memory; one
# demo trainer per sidecar receives them through the client and checks every
# byte against its own plan. The run prints a progress line each second and
# a report; it exits non-zero on any mismatch or error.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh --build-only
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --target meshload meshload-sidecar

DATA=$(mktemp -d /tmp/meshload-quickstart-XXXXXX)
trap 'rm -rf "$DATA"' EXIT
echo
echo "== meshload plan -f examples/local-fixedrecord.yaml --compare --samples 8192"
./build/tools/meshload plan -f examples/local-fixedrecord.yaml --compare --samples 8192
echo
echo "== meshload run --local -f examples/local-fixedrecord.yaml --generate-dataset $DATA --steps 2000"
./build/tools/meshload run --local -f examples/local-fixedrecord.yaml --generate-dataset "$DATA" --steps 2000
