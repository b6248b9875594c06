#!/usr/bin/env bash
# Lints the sidecar-shaped exposition with `promtool check metrics`, which both
# parses the text format strictly and applies Prometheus' naming rules
# (counter suffixes, help text, units). Any problem it prints is a failure.
# usage: promtool_check.sh METRICS_EXPOSITION_SAMPLE_BINARY
# PROMTOOL overrides the promtool binary (default: promtool on PATH).
set -u
BIN=$1
PROMTOOL=${PROMTOOL:-promtool}
source "$(dirname "$0")/../../testing/shell_checks.sh"

# promtool is a declared dependency (package `prometheus`), so its absence is a
# failure, not a skip: a skipped lint would let a broken exposition through.
if ! command -v "$PROMTOOL" >/dev/null 2>&1; then
  echo "promtool not found (looked for '$PROMTOOL'); install it with: bash scripts/install-deps.sh"
  check "promtool check metrics accepts the sidecar exposition" 1
  finish
fi

rc=0
"$BIN" >"$TMP/metrics.txt" || rc=$?
if [ $rc -ne 0 ] || [ ! -s "$TMP/metrics.txt" ]; then
  echo "$BIN exited with $rc or printed nothing"
  check "promtool check metrics accepts the sidecar exposition" 1
else
  out=$("$PROMTOOL" check metrics <"$TMP/metrics.txt" 2>&1); rc=$?
  if [ $rc -ne 0 ] || [ -n "$out" ]; then
    echo "promtool exited with $rc:"
    echo "$out"
    echo "--- exposition ---"
    cat "$TMP/metrics.txt"
    false
  fi
  check "promtool check metrics accepts the sidecar exposition" $?
fi

finish
