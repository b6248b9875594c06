#!/usr/bin/env bash
# Installs every Debian package that meshload's build, tests and tools need.
# Idempotent: packages already present are skipped; safe to run repeatedly.
# Runs as root on a fresh Debian 12 (uses sudo when not root).
set -euo pipefail

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev nlohmann-json3-dev
  libcpp-httplib-dev libssl-dev libboost-dev
  pybind11-dev python3-dev python3-numpy libdlpack-dev
  clang libclang-rt-14-dev
  prometheus curl util-linux python3-yaml python3-jsonschema
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
