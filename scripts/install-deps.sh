#!/usr/bin/env bash
# Installs what meshload's build, tests and tools need: the Debian packages,
# a project-local Python environment (.venv) from the pinned
# requirements.txt, and the real control plane the tests run against (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, helm), built from the
# pinned Go module in tests/tools by scripts/build-test-tools.sh (the Go that
# go.mod names must be installed: checked first, and a machine without it is
# told what to install and left untouched; the binaries are cached under
# ~/.cache/meshload), the S3 server of the object-storage tests (versitygw,
# from tests/s3/tools by scripts/build-s3-test-tools.sh), the simulated
# cluster's kwok and dashboard check (tests/cluster/tools, by
# scripts/build-cluster-tools.sh), and the third-party
# CRDs the chart's objects need on that control plane (Prometheus Operator,
# cert-manager; scripts/fetch-test-crds.sh), and the wheelhouse the Python
# package's tests install from offline (tests/client/wheelhouse.txt, into
# ~/.cache/meshload/wheelhouse).
# Idempotent: what is present is skipped; a second run takes seconds.
# Runs as root on a fresh Debian 12 (uses sudo when not root).
#
#   scripts/install-deps.sh               everything
#   scripts/install-deps.sh --build-only  what building meshload's default
#                                         configuration needs and no more: the
#                                         compiler, the libraries' headers, and
#                                         cuda.h from NVIDIA's CUDA runtime
#                                         wheel (requirements-build.txt) in
#                                         .venv; no test tools, no control
#                                         plane (scripts/quickstart.sh and the
#                                         images' build stage use this)
#   scripts/install-deps.sh --print-packages [--build-only]
#                                         print the Debian packages it installs,
#                                         one a line, and do nothing else
set -euo pipefail
BUILD_ONLY=0 PRINT=0
for arg in "$@"; do
  case "$arg" in
    --build-only) BUILD_ONLY=1 ;;
    --print-packages) PRINT=1 ;;
    *) echo "usage: scripts/install-deps.sh [--build-only] [--print-packages]" >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)

# What the build needs: the product binaries and the Python module, in the
# project's default configuration (`cmake -S . -B build`: the product, no
# tests), which is what scripts/quickstart.sh and the images' build stage
# configure. The tests (MESHLOAD_BUILD_TESTS), the fuzzers and the
# sanitizer and analysis builds are options; their packages are below.
BUILD_PACKAGES=(
  build-essential cmake ninja-build pkg-config ca-certificates
  libyaml-cpp-dev nlohmann-json3-dev
  libcpp-httplib-dev libssl-dev libboost-dev prometheus-cpp-dev
  pybind11-dev python3-dev libdlpack-dev python3-venv libxxhash-dev
  libzstd-dev zlib1g-dev libbz2-dev libbrotli-dev libsnappy-dev
)
# What the tests, fuzzers, analyses and the image builds need on top.
TEST_PACKAGES=(
  git libgtest-dev libgmock-dev python3-numpy
  clang libclang-rt-14-dev clang-format-14 ccache
  prometheus curl util-linux openssl python3-yaml python3-jsonschema
  podman debootstrap
)
PACKAGES=("${BUILD_PACKAGES[@]}")
if [ "$BUILD_ONLY" = 0 ]; then PACKAGES+=("${TEST_PACKAGES[@]}"); fi
if [ "$PRINT" = 1 ]; then printf '%s\n' "${PACKAGES[@]}"; exit 0; fi

# The test tools are built from pinned Go modules and need the Go their
# go.mod files name: checked before anything is installed, so a machine
# without it is told what to install and left as it was. Go's own tarball
# puts it in /usr/local/go/bin, which sudo's PATH and minimal shells lack:
# it is used from there when it is not on PATH.
if [ "$BUILD_ONLY" = 0 ]; then
  GO_NEEDED=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$ROOT/tests/tools/go.mod" "$ROOT/tests/s3/tools/go.mod" | sort -V | tail -1)
  if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then export PATH=$PATH:/usr/local/go/bin; fi
  GO_HAVE=$(go env GOVERSION 2>/dev/null | sed -n 's/^go\([0-9.]*\).*/\1/p' || true)
  if [ -z "$GO_HAVE" ] || [ "$(printf '%s\n%s\n' "$GO_NEEDED" "$GO_HAVE" | sort -V | head -1)" != "$GO_NEEDED" ]; then
    if [ -z "$GO_HAVE" ]; then found="no go is on PATH"; else found="this machine has Go $GO_HAVE"; fi
    echo "install-deps: the test tools need Go $GO_NEEDED or newer and $found: install https://go.dev/dl/go$GO_NEEDED.linux-$(dpkg --print-architecture 2>/dev/null || echo amd64).tar.gz into /usr/local/go (tar -C /usr/local -xzf FILE) and run this again; nothing was installed" >&2
    exit 1
  fi
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The project-local Python environment, from the pinned requirements.txt
# (which includes requirements-build.txt), or requirements-build.txt alone
# for --build-only. Reinstalled only when those files changed since the last
# install; a full environment also serves --build-only.
VENV=$ROOT/.venv
STAMP=$VENV/.requirements.sha256
full=full-$(cat "$ROOT/requirements.txt" "$ROOT/requirements-build.txt" | sha256sum | cut -d' ' -f1)
build=build-$(sha256sum <"$ROOT/requirements-build.txt" | cut -d' ' -f1)
have=$(cat "$STAMP" 2>/dev/null || true)
if [ "$BUILD_ONLY" = 1 ]; then want=$build req=requirements-build.txt; else want=$full req=requirements.txt; fi
if [ -x "$VENV/bin/python" ] && { [ "$have" = "$want" ] || { [ "$BUILD_ONLY" = 1 ] && [ "$have" = "$full" ]; }; }; then
  echo "install-deps: .venv matches $req"
else
  echo "install-deps: making .venv from $req"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-cache-dir -r "$ROOT/$req"
  echo "$want" >"$STAMP"
fi

if [ "$BUILD_ONLY" = 0 ]; then
  # The wheels the Python package's tests install offline into fresh
  # environments (tests/client/wheelhouse.txt, every version pinned).
  WHEELHOUSE=${MESHLOAD_WHEELHOUSE:-$HOME/.cache/meshload/wheelhouse}
  want=$(sha256sum "$ROOT/tests/client/wheelhouse.txt" | cut -d' ' -f1)
  if [ "$(cat "$WHEELHOUSE/.wheelhouse.sha256" 2>/dev/null)" = "$want" ]; then
    echo "install-deps: wheelhouse matches tests/client/wheelhouse.txt"
  else
    echo "install-deps: downloading the wheelhouse (tests/client/wheelhouse.txt)"
    mkdir -p "$WHEELHOUSE"
    "$VENV/bin/python" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
      -d "$WHEELHOUSE" -r "$ROOT/tests/client/wheelhouse.txt"
    echo "$want" >"$WHEELHOUSE/.wheelhouse.sha256"
  fi
  bash "$ROOT/scripts/build-test-tools.sh" >/dev/null
  bash "$ROOT/scripts/build-s3-test-tools.sh" >/dev/null
  bash "$ROOT/scripts/build-cluster-tools.sh" >/dev/null
  bash "$ROOT/scripts/fetch-test-crds.sh" >/dev/null
fi
