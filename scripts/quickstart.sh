#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to meshload's main job:
# installs the Debian packages meshload needs, builds it, and runs it.
#
# Today the main job is the planner: `meshload plan` on the example job,
# then the cost of every strategy side by side (`--compare`). The host data
# path (`meshload run --local` on a generated dataset) replaces it when the
# sidecar lands (issue "Sidecar host data path ...").
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build --target meshload

echo
echo "== meshload plan -f examples/hybrid-fsdp.yaml --steps 0:2"
./build/tools/meshload plan -f examples/hybrid-fsdp.yaml --steps 0:2
echo
echo "== meshload plan -f examples/hybrid-fsdp.yaml --compare"
./build/tools/meshload plan -f examples/hybrid-fsdp.yaml --compare
