#!/usr/bin/env bash
# `meshload run --local` on every DataLoadJob manifest in examples/, as a
# user tries them first: each with a generated dataset in place of its own
# (the one line saying so, every byte verified), then with that dataset given
# by --dataset; a manifest that reads s3:// also as written, with no dataset
# option, from a real S3 server (versitygw) through the usual AWS variables.
# A new example is covered without editing this test. A YAML file in
# examples/ without a DataLoadJob (a trainer Job) keeps its clear error.
# Also: problems are counted in plain English ("1 problem", "2 problems").
# usage: run_examples_test.sh MESHLOAD_BINARY REPO_ROOT
set -u
ML=$1
ROOT=$2
source "$(dirname "$0")/../testing/shell_checks.sh"

verified() {  # verified OUTPUT RC: the run passed and every byte was checked
  [ "$2" -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$1" && grep -q "^OK$" <<<"$1"
}

manifests=0 s3=()
for f in "$ROOT"/examples/*.yaml "$ROOT"/examples/*.yml; do
  [ -f "$f" ] || continue
  name=$(basename "$f")
  if ! grep -q "^kind: DataLoadJob" "$f"; then
    out=$("$ML" run --local -f "$f" --generate-dataset "$TMP/none" --steps 1 2>&1); rc=$?
    [ $rc -eq 2 ] && grep -q "no document with kind: DataLoadJob" <<<"$out"
    check "$name (no DataLoadJob): exit 2, the error says so" $?
    continue
  fi
  manifests=$((manifests + 1))
  data=$TMP/data-${name%.*}
  out=$("$ML" run --local -f "$f" --generate-dataset "$data" --steps 20 2>&1); rc=$?
  verified "$out" $rc && [ "$(grep -c "^dataset: the generated $data replaces spec.dataset.uri '" <<<"$out")" = 1 ]
  check "$name with --generate-dataset: the dataset replaced (one line), every byte verified" $?
  [ $rc -eq 0 ] || tail -12 <<<"$out"
  out=$("$ML" run --local -f "$f" --dataset "$data" --steps 20 2>&1); rc=$?
  verified "$out" $rc && grep -q "^dataset: the given $data replaces spec.dataset.uri '" <<<"$out"
  check "$name with --dataset: every byte verified" $?
  [ $rc -eq 0 ] || tail -12 <<<"$out"
  grep -q "^ *uri: *[\"']*s3://" "$f" && s3+=("$f")
done
[ "$manifests" -ge 4 ]
check "examples/ has DataLoadJob manifests ($manifests)" $?

# The s3:// manifests as written: their bucket and prefix on versitygw, the
# data generated into the bucket's directory, no dataset option.
if [ ${#s3[@]} -gt 0 ]; then
  BIN=$(bash "$ROOT/scripts/build-s3-test-tools.sh" --dir) || {
    echo "FAIL versitygw is not built: run scripts/install-deps.sh (scripts/build-s3-test-tools.sh)"; exit 1; }
  ACCESS=MESHLOADEXAMPLES
  SECRET=examples-secret-$RANDOM$RANDOM
  PORT=$(listen_port)
  mkdir -p "$TMP/gw"
  "$BIN/versitygw" --access "$ACCESS" --secret "$SECRET" --port "127.0.0.1:$PORT" --quiet posix "$TMP/gw" \
    >"$TMP/gw.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 200); do curl -s -o /dev/null "http://127.0.0.1:$PORT/" && break; sleep 0.05; done
  for f in "${s3[@]}"; do
    name=$(basename "$f")
    uri=$(sed -n "s/^ *uri: *[\"']*\(s3:\/\/[^\"' #]*\).*/\1/p" "$f" | head -1)
    path=${uri#s3://}
    "$ML" run --local -f "$f" --generate-dataset "$TMP/gw/${path%/}" --steps 1 >/dev/null 2>&1
    out=$(AWS_ACCESS_KEY_ID=$ACCESS AWS_SECRET_ACCESS_KEY=$SECRET AWS_ENDPOINT_URL_S3=http://127.0.0.1:$PORT \
          AWS_REGION=us-east-1 "$ML" run --local -f "$f" --steps 20 2>&1); rc=$?
    verified "$out" $rc && ! grep -q "^dataset:" <<<"$out"
    check "$name as written: read from $uri on S3 (AWS variables), every byte verified" $?
    [ $rc -eq 0 ] || tail -12 <<<"$out"
    out=$(env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY AWS_ENDPOINT_URL_S3=http://127.0.0.1:$PORT \
          "$ML" run --local -f "$f" --steps 5 2>&1); rc=$?
    [ $rc -ne 0 ] && grep -q "$uri" <<<"$out" && ! grep -q "$SECRET" <<<"$out"
    check "$name without credentials: an error naming $uri" $?
    [ $rc -ne 0 ] || tail -5 <<<"$out"
  done
fi

# Both dataset options at once is a usage error.
"$ML" run --local -f "$ROOT/examples/local-fixedrecord.yaml" --dataset "$TMP/a" --generate-dataset "$TMP/b" \
  >/dev/null 2>"$TMP/both.err"
[ $? -eq 2 ] && grep -q -- "--generate-dataset and --dataset" "$TMP/both.err"
check "--dataset with --generate-dataset: a usage error" $?

# Problems counted in plain English, by run and plan alike.
sed 's/globalBatchSize: 64/globalBatchSize: 0/' "$ROOT/examples/local-fixedrecord.yaml" >"$TMP/one.yaml"
sed -e 's/globalBatchSize: 64/globalBatchSize: 0/' -e 's/prefetch: 4/prefetch: 0/' \
  "$ROOT/examples/local-fixedrecord.yaml" >"$TMP/two.yaml"
counted() {  # counted NAME ARGS...: the one- and two-problem manifests through ARGS -f FILE
  local name=$1 rc1 rc2
  shift
  "$ML" "$@" -f "$TMP/one.yaml" >/dev/null 2>"$TMP/one.err"; rc1=$?
  "$ML" "$@" -f "$TMP/two.yaml" >/dev/null 2>"$TMP/two.err"; rc2=$?
  [ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] && grep -q "invalid DataLoadJob (1 problem):" "$TMP/one.err" &&
    grep -q "invalid DataLoadJob (2 problems):" "$TMP/two.err"
  check "meshload $name: '1 problem', '2 problems'" $?
  [ $rc1 -eq 2 ] && [ $rc2 -eq 2 ] || cat "$TMP/one.err" "$TMP/two.err"
}
counted "run --local --generate-dataset" run --local --generate-dataset "$TMP/gen"
counted "run --local" run --local
counted plan plan
finish
