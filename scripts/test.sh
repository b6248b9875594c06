#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a passing test suite:
# installs the Debian packages, checks the C++ files' format, then builds and
# runs these configurations:
#   1. release build, warnings as errors: every test (ctest)
#   2. AddressSanitizer + UndefinedBehaviorSanitizer build: every test
#   3. clang libFuzzer build: each fuzz target for MESHLOAD_FUZZ_SECONDS (default 60)
#   3b. clang thread-safety analysis of every product target (-Wthread-safety
#      -Werror=thread-safety; unoptimised, nothing runs)
#   4. ThreadSanitizer build of the concurrent parts: the sidecar, sources, metrics,
#      GPU staging (against the stand-in driver)
#   (the release configuration also builds the container images with podman
#   and checks them from the inside: tests/docker/images_test.py)
# Exits non-zero on the first failing configuration. `.ci/run` runs exactly this.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${JOBS:-$(nproc)}
FUZZ_SECONDS=${MESHLOAD_FUZZ_SECONDS:-60}

bash scripts/install-deps.sh

step() { echo; echo "== $*"; }

# Every configuration compiles through ccache (installed above; its cache in
# ~/.cache/ccache): a second run, in this checkout or another clone, only
# recompiles what changed. BASEDIR and NOHASHDIR let clones in other folders
# share the cache (paths inside the checkout are hashed relative to it).
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CMAKE_C_COMPILER_LAUNCHER=ccache
  export CCACHE_BASEDIR=$PWD CCACHE_NOHASHDIR=1
  ccache --zero-stats >/dev/null
fi

# What the checkout holds that git does not track, before any test: after
# them all, anything new is a test that wrote into the source tree.
TREE_BEFORE=$(mktemp)
trap 'rm -f "$TREE_BEFORE"' EXIT
python3 tests/repo/source_tree_check.py snapshot . "$TREE_BEFORE" >/dev/null

step "format (clang-format 14, .clang-format)"
bash scripts/check-format

step "release build (-Werror)"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DMESHLOAD_WERROR=ON -DMESHLOAD_BUILD_TESTS=ON
cmake --build build -j "$JOBS"
(cd build && ctest --output-on-failure -j "$JOBS")

step "ASan + UBSan build"
cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug -DMESHLOAD_SANITIZE=ON \
  -DMESHLOAD_BUILD_TESTS=ON -DMESHLOAD_BUILD_BENCHMARKS=OFF
cmake --build build-asan -j "$JOBS"
# The control-plane harness's own check and the chart's on the control plane
# (scripts, helm and kubectl only, no C++ of ours) run in the release
# configuration alone, as do the pip package's test (it builds its own,
# uninstrumented) and the JAX tests, python.jax and python.lm (JAX's runtime
# in an interpreter without the sanitizer runtimes; python.client covers the
# instrumented module).
(cd build-asan && ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --output-on-failure -j "$JOBS" -E '^(controlplane\.check|charts\.cluster|cluster\.e2e|python\.package|python\.jax|python\.lm)$')

step "libFuzzer build (clang, ${FUZZ_SECONDS}s per target)"
CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHLOAD_FUZZ=ON \
  -DMESHLOAD_BUILD_TESTS=OFF -DMESHLOAD_BUILD_BENCHMARKS=OFF -DMESHLOAD_FUZZ_SECONDS="$FUZZ_SECONDS"
cmake --build build-fuzz -j "$JOBS" --target npy_header_fuzz protocol_fuzz admission_review_fuzz megatron_index_fuzz \
  webdataset_shard_fuzz mds_fuzz record_fields_fuzz http_response_fuzz compression_fuzz tfrecord_fuzz parquet_footer_fuzz hub_card_fuzz arrow_ipc_fuzz
(cd build-fuzz && ctest --output-on-failure -j "$JOBS" -R '^fuzz\.')

step "clang thread-safety analysis (-Wthread-safety -Werror=thread-safety)"
# Every program and library of the product, compiled by clang without
# optimisation (the analysis is all this build is for; nothing runs).
CXX=clang++ cmake -S . -B build-tsa -G Ninja -DCMAKE_BUILD_TYPE=ThreadSafety -DMESHLOAD_THREAD_SAFETY=ON \
  -DMESHLOAD_BUILD_TESTS=OFF -DMESHLOAD_BUILD_BENCHMARKS=OFF
cmake --build build-tsa -j "$JOBS"

step "ThreadSanitizer build (sidecar, sources, metrics, GPU staging, controller)"
cmake -S . -B build-tsan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMESHLOAD_TSAN=ON \
  -DMESHLOAD_BUILD_TESTS=ON -DMESHLOAD_BUILD_BENCHMARKS=OFF
cmake --build build-tsan -j "$JOBS" --target protocol_test sidecar_test source_test metrics_test meshload-sidecar \
  gpu_staging_tests controller_test workqueue_test parquet_source_test
# The controller's tests run too (informers, watches, leader election, the
# work queue, the event recorder), against the real control plane.
# Left out: a test that counts the process's threads (TSan adds one) and one
# whose 150 ms timeout is too tight under TSan's slowdown.
(cd build-tsan && TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$PWD/../tests/tsan.supp" \
  ctest --output-on-failure -j "$JOBS" \
    -R '^(ParquetRowSource|Sidecar|SidecarProcess|PeerExchange|StepLoader|WebDatasetFixture|Mds|SlotPool|HostSlotMemory|Protocol|Client|FileSource|HttpSource|PlainHttp|SourceRegistry|Metrics|HealthServer|DeviceStaging|WorkQueue|BlockCache|CachedSource|FetchAhead|controller_test$)' \
    -E 'StopJoinsEveryThreadTheServerStarted|SlowResponseIsRetriedAsTimeout')

step "the source tree as the tests found it"
python3 tests/repo/source_tree_check.py compare . "$TREE_BEFORE"

if command -v ccache >/dev/null; then ccache --show-stats | grep -iE "hits|misses" || true; fi
step "all configurations passed"
