#!/usr/bin/env bash
# Installs what meshload's build, tests and tools need: the Debian packages,
# a project-local Python environment (.venv) from the pinned
# requirements.txt, and the real control plane the tests run against (etcd,
# kube-apiserver, kube-controller-manager, kubectl, helm), built from the
# pinned Go module in tests/tools by scripts/build-test-tools.sh (Go 1.26 or
# newer must be installed; the binaries are cached under ~/.cache/meshload),
# and the third-party CRDs the chart's objects need on that control plane
# (Prometheus Operator, cert-manager; scripts/fetch-test-crds.sh), and the
# wheelhouse the Python package's tests install from offline
# (tests/client/wheelhouse.txt, into ~/.cache/meshload/wheelhouse).
# Idempotent: what is present is skipped; a second run takes seconds.
# Runs as root on a fresh Debian 12 (uses sudo when not root).
#
#   scripts/install-deps.sh               everything
#   scripts/install-deps.sh --build-only  what building meshload needs (no test tools)
set -euo pipefail
BUILD_ONLY=0
case "${1:-}" in
  "") ;;
  --build-only) BUILD_ONLY=1 ;;
  *) echo "usage: scripts/install-deps.sh [--build-only]" >&2; exit 2 ;;
esac

PACKAGES=(
  build-essential cmake ninja-build pkg-config git ca-certificates
  libgtest-dev libgmock-dev libbenchmark-dev
  libyaml-cpp-dev nlohmann-json3-dev
  libcpp-httplib-dev libssl-dev libboost-dev
  pybind11-dev python3-dev python3-numpy libdlpack-dev
  clang libclang-rt-14-dev
  prometheus curl util-linux openssl python3-yaml python3-jsonschema python3-venv
)

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

# The project-local Python environment, from the pinned requirements.txt.
# Reinstalled only when requirements.txt changed since the last install.
ROOT=$(cd "$(dirname "$0")/.." && pwd)
VENV=$ROOT/.venv
STAMP=$VENV/.requirements.sha256
want=$(sha256sum "$ROOT/requirements.txt" | cut -d' ' -f1)
if [ -x "$VENV/bin/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
  echo "install-deps: .venv matches requirements.txt"
else
  echo "install-deps: making .venv from requirements.txt"
  python3 -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$ROOT/requirements.txt"
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
  bash "$ROOT/scripts/fetch-test-crds.sh" >/dev/null
fi
