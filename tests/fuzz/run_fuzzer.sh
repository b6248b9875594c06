#!/usr/bin/env bash
# Runs a libFuzzer binary for a bounded time on a scratch copy of its seed
# corpus (libFuzzer writes new inputs into the first directory it is given,
# and the committed seeds must stay as they are). A crash leaves its input in
# the scratch directory's crash-* file, printed below, and fails the test.
# usage: run_fuzzer.sh FUZZER SEED_DIR SECONDS
set -u
FUZZER=$1
SEEDS=$2
SECONDS_LIMIT=$3
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/corpus"
cd "$WORK" || exit 2
"$FUZZER" -max_total_time="$SECONDS_LIMIT" -print_final_stats=1 -artifact_prefix="$WORK/" \
  "$WORK/corpus" "$SEEDS" 2>&1 | tail -n 25
rc=${PIPESTATUS[0]}
if [ "$rc" -ne 0 ]; then
  for f in "$WORK"/crash-* "$WORK"/leak-* "$WORK"/timeout-*; do
    [ -e "$f" ] && { echo "finding: $f"; od -c "$f" | head -20; }
  done
  echo "0 passed, 1 failed"
  exit 1
fi
echo "1 passed, 0 failed"
