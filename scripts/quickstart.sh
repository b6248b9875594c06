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
#
# It installs what `scripts/install-deps.sh --build-only` lists and configures
# the project's default configuration (the product alone: no tests), which is
# exactly what that list is for; tests/install/fresh_machine_test.py runs this
# script in a Debian 12 root file system made by debootstrap to prove it.
# A second run installs nothing and rebuilds nothing.
set -euo pipefail
cd "$(dirname "$0")/.."

step() { echo; echo "== $*"; }

step "install what the build needs: scripts/install-deps.sh --build-only"
bash scripts/install-deps.sh --build-only
step "configure: cmake -S . -B build (the default configuration: the product, no tests)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
step "build: meshload, meshload-sidecar"
cmake --build build --target meshload meshload-sidecar

DATA=$(mktemp -d /tmp/meshload-quickstart-XXXXXX)
trap 'rm -rf "$DATA"' EXIT
step "meshload plan -f examples/local-fixedrecord.yaml --compare --samples 8192"
./build/tools/meshload plan -f examples/local-fixedrecord.yaml --compare --samples 8192
step "meshload run --local -f examples/local-fixedrecord.yaml --generate-dataset $DATA --steps 2000"
./build/tools/meshload run --local -f examples/local-fixedrecord.yaml --generate-dataset "$DATA" --steps 2000
