#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a passing test suite:
# installs the Debian packages, then builds and runs three configurations:
#   1. release build, warnings as errors: every test (ctest)
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build: every test
#   3. clang libFuzzer build: each fuzz target for MESHLOAD_FUZZ_SECONDS (default 60)
# Exits non-zero on the first failing configuration. `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${MESHLOAD_FUZZ_SECONDS:-60}

bash scripts/install-deps.sh

step() { echo; echo "== $*"; }

step "release build (-Werror)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHLOAD_WERROR=ON
cmake --build build -j "$JOBS"
(cd build && ctest --output-on-failure -j "$JOBS")

step "ASan + UBSan build"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMESHLOAD_SANITIZE=ON \
  -DMESHLOAD_BUILD_BENCHMARKS=OFF
cmake --build build-asan -j "$JOBS"
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j "$JOBS")

step "libFuzzer build (clang, ${FUZZ_SECONDS}s per target)"
CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHLOAD_FUZZ=ON \
  -DMESHLOAD_BUILD_TESTS=OFF -DMESHLOAD_BUILD_BENCHMARKS=OFF -DMESHLOAD_FUZZ_SECONDS="$FUZZ_SECONDS"
cmake --build build-fuzz -j "$JOBS" --target npy_header_fuzz protocol_fuzz
(cd build-fuzz && ctest --output-on-failure -R '^fuzz\.')

step "all configurations passed"
