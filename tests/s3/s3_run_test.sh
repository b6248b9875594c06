#!/usr/bin/env bash
# meshload on an s3:// dataset against a real S3 server (versitygw with its
# POSIX backend, scripts/build-s3-test-tools.sh): `meshload run --local` for
# every format and every strategy, every byte verified by the trainers;
# `meshload plan` without --samples (the objects listed, the .npy headers
# read through S3); a sidecar killed mid-epoch and restarted under its
# trainer (identical bytes); throttling injected by faultproxy
# (tests/tools/faultproxy, plain HTTP with S3 errors; built with the control
# plane's tools, scripts/build-test-tools.sh); and the secret access key
# nowhere in what the user sees.
# usage: s3_run_test.sh MESHLOAD_BINARY SIDECAR_BINARY REPO_ROOT
set -u
ML=$1
SIDECAR=$2
ROOT=$3
source "$(dirname "$0")/../testing/shell_checks.sh"

BIN=$(bash "$ROOT/scripts/build-s3-test-tools.sh" --dir) || {
  echo "FAIL versitygw is not built: run scripts/install-deps.sh (scripts/build-s3-test-tools.sh)"; exit 1; }
PROXY_BIN=$(bash "$ROOT/scripts/build-test-tools.sh" --dir) || {
  echo "FAIL faultproxy is not built: run scripts/install-deps.sh (scripts/build-test-tools.sh)"; exit 1; }
ACCESS=MESHLOADS3TEST
SECRET=s3-test-secret-$RANDOM$RANDOM-never-shown
GW=$TMP/gw
mkdir -p "$GW/corpus"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
PORT=$(free_port)
"$BIN/versitygw" --access "$ACCESS" --secret "$SECRET" --port "127.0.0.1:$PORT" --keep-alive --quiet posix "$GW" >"$TMP/gw.log" 2>&1 &
PIDS+=($!)
"$PROXY_BIN/faultproxy" --upstream "http://127.0.0.1:$PORT" --errors s3 --ready-file "$TMP/proxy.ready" \
  >"$TMP/proxy.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 200); do
  curl -s -o /dev/null "http://127.0.0.1:$PORT/" && [ -s "$TMP/proxy.ready" ] && break
  sleep 0.05
done
read -r PROXY ADMIN <"$TMP/proxy.ready"
export AWS_ACCESS_KEY_ID=$ACCESS AWS_SECRET_ACCESS_KEY=$SECRET AWS_ENDPOINT_URL_S3=http://127.0.0.1:$PORT AWS_REGION=us-east-1
unset AWS_SESSION_TOKEN AWS_PROFILE MESHLOAD_S3_CREDENTIALS_DIR

# job NAME FORMAT STRATEGY FANOUT URI: a 2-process job whose `model` axis
# spans the processes, so that every strategy moves samples somewhere.
job() {
  local fmt
  case $2 in
    FixedRecord) fmt="format: FixedRecord, recordBytes: 1024" ;;
    TokenStream) fmt="format: TokenStream, dtype: uint16, sequenceLength: 127" ;;
    Npy) fmt="format: Npy" ;;
    MegatronIndexed) fmt="format: MegatronIndexed" ;;
    WebDataset) fmt="format: WebDataset, fields: [{name: jpg}, {name: cls, dtype: int64}]" ;;
    MDS) fmt="format: MDS, fields: [{name: image}, {name: label, dtype: int64}, {name: score, dtype: float32}]" ;;
    TFRecord) fmt="format: TFRecord, fields: [{name: image}, {name: label, dtype: int64}, {name: box, dtype: float32}]" ;;
  esac
  two_process_job "$TMP/$1.yaml" "$1" model "  replication: {mode: Partial, fanout: $4}
  strategy: $3
  dataset: {uri: \"$5\", $fmt}
  batch: {globalBatchSize: 8, prefetch: 3}
  shuffle: {mode: Global, seed: 11}"
}

# The datasets, written into the bucket's directory (what the POSIX backend
# serves) by the CLI's generator.
for fmt in FixedRecord TokenStream Npy MegatronIndexed WebDataset MDS TFRecord; do
  job gen-$fmt $fmt PerProcess Load "$GW/corpus/$fmt"
  "$ML" run --local -f "$TMP/gen-$fmt.yaml" --generate-dataset "$GW/corpus/$fmt" --samples 600 --files 3 --steps 1 \
    >"$TMP/gen-$fmt.out" 2>&1 || { echo "cannot generate the $fmt dataset:"; tail -5 "$TMP/gen-$fmt.out"; }
done

# 1. run --local: every format, every strategy, on s3:// (WebDataset: its
#    shards by a brace range; MDS: the folder of index.json; TFRecord: the
#    folder, its .idx objects the indexes).
uri_of() {
  case $1 in
    WebDataset) echo "s3://corpus/$1/part-{00000..00002}.tar" ;;
    *) echo "s3://corpus/$1/" ;;
  esac
}
for fmt in FixedRecord TokenStream Npy MegatronIndexed WebDataset MDS TFRecord; do
  for sf in PerProcess:Load PerProcess:Broadcast GlobalLoad:Broadcast LoadAndReshard:Load; do
    strategy=${sf%%:*} fanout=${sf##*:}
    name=$(echo "$fmt-$strategy-$fanout" | tr 'A-Z' 'a-z')
    job "$name" $fmt $strategy $fanout "$(uri_of $fmt)"
    out=$("$ML" run --local -f "$TMP/$name.yaml" --steps 40 2>&1); rc=$?
    echo "$out" >"$TMP/$name.out"
    [ $rc -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$out" && grep -q "^OK$" <<<"$out"
    verified=$?  # before the message's command substitution, which sets $? too
    check "run --local $fmt $strategy/$fanout on $(uri_of $fmt): every byte verified" $verified
    [ $rc -eq 0 ] || tail -8 <<<"$out"
  done
done

# 1b. Compressed MDS (Streaming's MDSWriter, zstd and bzip2 shards): each
#    shard fetched once and decompressed into the block cache; the trainers
#    verify every byte (they decompress the shards themselves).
for codec in zstd bz2; do
  mkdir -p "$GW/corpus/MDS-$codec"
  cp "$ROOT/tests/formats/data/mds/$codec"/index.json "$ROOT/tests/formats/data/mds/$codec"/*.mds.* "$GW/corpus/MDS-$codec/"
  for sf in PerProcess:Load LoadAndReshard:Load; do
    strategy=${sf%%:*} fanout=${sf##*:}
    name=$(echo "mds-$codec-$strategy" | tr 'A-Z' 'a-z')
    job "$name" MDS $strategy $fanout "s3://corpus/MDS-$codec/"
    out=$("$ML" run --local -f "$TMP/$name.yaml" --steps 12 2>&1); rc=$?
    echo "$out" >"$TMP/$name.out"
    [ $rc -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$out" && grep -q "^OK$" <<<"$out"
    check "run --local on $codec-compressed MDS shards on S3 ($strategy): decompressed into the block cache, every byte verified over two epochs" $?
    [ $rc -eq 0 ] || tail -8 <<<"$out"
  done
done

# 1d. TFRecord files TensorFlow wrote, uncompressed and with GZIP and ZLIB,
#    with the indexes tfrecord2idx wrote (of the decompressed bytes), on S3:
#    every feature verified by the trainers (a compressed file is fetched
#    whole and decompressed into the block cache; the trainers decompress
#    the files themselves).
for kind in None GZIP ZLIB; do
  k=$(echo $kind | tr 'A-Z' 'a-z')
  src=$ROOT/tests/formats/data/tfrecord
  [ $kind = None ] || src=$src/$k
  mkdir -p "$GW/corpus/tf-$k"
  cp "$src"/part-* "$GW/corpus/tf-$k/"
  two_process_job "$TMP/tf-$k.yaml" tf-$k model "  replication: {mode: Partial, fanout: Load}
  strategy: LoadAndReshard
  dataset: {uri: \"s3://corpus/tf-$k/\", format: TFRecord, compression: $kind, fields: [{name: image}, {name: label, dtype: int64, shape: []}, {name: input_ids, dtype: int64}, {name: box, dtype: float32}]}
  batch: {globalBatchSize: 8, prefetch: 3}
  shuffle: {mode: Global, seed: 11}"
  out=$("$ML" run --local -f "$TMP/tf-$k.yaml" --steps 12 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$out" && grep -q "^OK$" <<<"$out"
  check "run --local on TensorFlow-written TFRecord files (compression $kind) on S3 (LoadAndReshard): every feature verified over three epochs" $?
  [ $rc -eq 0 ] || tail -8 <<<"$out"
done

# 1e. Parquet files pyarrow wrote (three row-group sizes; snappy, zstd and
#    gzip pages), on S3: every column verified by the trainers (rows decoded
#    from their row groups' column chunks, fetched by ranged GETs; rows with
#    a null are left out under missingField Skip).
mkdir -p "$GW/corpus/parquet"
cp "$ROOT"/tests/formats/data/parquet/rg*.parquet "$GW/corpus/parquet/"
for strategy in PerProcess LoadAndReshard; do
  name=parquet-$(echo $strategy | tr 'A-Z' 'a-z')
  two_process_job "$TMP/$name.yaml" $name model "  replication: {mode: Partial, fanout: Load}
  strategy: $strategy
  dataset: {uri: \"s3://corpus/parquet/\", format: Parquet, missingField: Skip, fields: [{name: input_ids, maxBytes: 160}, {name: text, maxBytes: 64}, {name: label}, {name: emb}, {name: grid}, {name: image.bytes, maxBytes: 300}]}
  batch: {globalBatchSize: 8, prefetch: 3}
  shuffle: {mode: Global, seed: 11}"
  out=$("$ML" run --local -f "$TMP/$name.yaml" --steps 50 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$out" && grep -q "^OK$" <<<"$out" &&
    grep -qE "^  Parquet row groups   [1-9][0-9]* decoded, [0-9.]+ kB of their column chunks fetched" <<<"$out"
  check "run --local on pyarrow-written Parquet files on S3 ($strategy): every column verified over two epochs, the row groups decoded counted" $?
  [ $rc -eq 0 ] || tail -8 <<<"$out"
done

# 1f. A Hugging Face Hub repository of two configs, laid out as
#    push_to_hub lays it out, synced to a bucket: split train of the
#    config its card marks default (en, two shards under en/) found from
#    README.md over S3, every column verified by the trainers.
mkdir -p "$GW/corpus/hub"
cp -r "$ROOT"/tests/formats/data/hub/configs "$GW/corpus/hub/"
two_process_job "$TMP/hub.yaml" hub model "  replication: {mode: Partial, fanout: Load}
  strategy: PerProcess
  dataset: {uri: \"s3://corpus/hub/configs\", format: Parquet, split: train, fields: [{name: input_ids, maxBytes: 92}, {name: text, maxBytes: 64}, {name: label}]}
  batch: {globalBatchSize: 8, prefetch: 3}
  shuffle: {mode: Global, seed: 11}"
out=$("$ML" run --local -f "$TMP/hub.yaml" --steps 6 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$out" && grep -q "^OK$" <<<"$out"
check "run --local on a Hugging Face Hub repository's split on S3 (files from its README.md's default config): every column verified" $?
[ $rc -eq 0 ] || tail -8 <<<"$out"

# 1g. A DatasetDict that datasets' save_to_disk wrote, synced to a bucket:
#    split train's Arrow files found from dataset_dict.json and
#    train/state.json over S3, its rows decoded from their record batches
#    (fetched by ranged GETs), every column verified by the trainers.
mkdir -p "$GW/corpus/saved"
cp -r "$ROOT"/tests/formats/data/saved/tokens "$GW/corpus/saved/"
two_process_job "$TMP/saved.yaml" saved model "  replication: {mode: Partial, fanout: Load}
  strategy: LoadAndReshard
  dataset: {uri: \"s3://corpus/saved/tokens\", format: Arrow, split: train, fields: [{name: input_ids, maxBytes: 92}, {name: text, maxBytes: 64}, {name: label}]}
  batch: {globalBatchSize: 8, prefetch: 3}
  shuffle: {mode: Global, seed: 11}"
out=$("$ML" run --local -f "$TMP/saved.yaml" --steps 12 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$out" && grep -q "^OK$" <<<"$out" &&
  grep -qE "^  Arrow record batches [1-9][0-9]* decoded, [0-9.]+ kB of their messages fetched" <<<"$out"
check "run --local on a save_to_disk DatasetDict's split on S3 (files from its state.json): every column verified over two epochs, the record batches decoded counted" $?
[ $rc -eq 0 ] || tail -8 <<<"$out"

# 1c. Indexing many objects costs a listing and one read per object's
#    index, several at once: an MDS dataset of 48 shards behind 25 ms of
#    added latency is indexed with 51 requests or fewer (not a HEAD and a
#    GET per shard) in less than half the time one request after the other
#    would take (96 round trips).
job gen-mds48 MDS PerProcess Load "$GW/corpus/mds48"
"$ML" run --local -f "$TMP/gen-mds48.yaml" --generate-dataset "$GW/corpus/mds48" --samples 960 --files 48 --steps 1 \
  >"$TMP/gen-mds48.out" 2>&1 || tail -5 "$TMP/gen-mds48.out"
job mds48 MDS PerProcess Load "s3://corpus/mds48/"
curl -s -X POST "http://$ADMIN/reset" >/dev/null
curl -s -X POST "http://$ADMIN/latency?ms=25" >/dev/null
before=$(curl -s "http://$ADMIN/requests")
t0=$(date +%s%N)
out=$(AWS_ENDPOINT_URL_S3=http://$PROXY "$ML" plan -f "$TMP/mds48.yaml" --steps 0:1 2>&1); rc=$?
ms=$(( ($(date +%s%N) - t0) / 1000000 ))
requests=$(( $(curl -s "http://$ADMIN/requests") - before ))
curl -s -X POST "http://$ADMIN/reset" >/dev/null
echo "indexing 48 MDS shards at 25 ms a request: $requests requests, $ms ms"
[ $rc -eq 0 ] && grep -q "dataset: MDS, 960 samples" <<<"$out" && [ "$requests" -le 51 ] && [ "$ms" -lt 1200 ]
check "meshload plan indexes 48 MDS shards on S3 with one listing and their heads read 16 at a time ($requests requests, $ms ms at 25 ms each)" $?
[ $rc -eq 0 ] || echo "$out" | tail -3

# 2. meshload plan lists the objects itself: no --samples needed.
job plan-npy Npy PerProcess Load "s3://corpus/Npy/*.npy"
out=$("$ML" plan -f "$TMP/plan-npy.yaml" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "dataset: Npy, 600 samples" <<<"$out" && grep -q "in 3 files" <<<"$out"
check "meshload plan on s3:// without --samples: 600 samples in 3 objects, .npy headers read over S3" $?
[ $rc -eq 0 ] || echo "$out" | head -5
out=$(AWS_SECRET_ACCESS_KEY=wrong-secret "$ML" plan -f "$TMP/plan-npy.yaml" 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "s3://corpus/Npy/" <<<"$out" && grep -q "S3 SignatureDoesNotMatch" <<<"$out" &&
  grep -q "the dataset cannot be read" <<<"$out" && ! grep -q "invalid DataLoadJob" <<<"$out"
check "wrong credentials: plan says the dataset cannot be read (exit 1, not an invalid job), naming the bucket, the prefix and the S3 error code" $?
[ $rc -eq 1 ] || echo "$out" | head -3
out=$(AWS_SECRET_ACCESS_KEY=wrong-secret "$ML" run --local -f "$TMP/plan-npy.yaml" --steps 1 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "the dataset cannot be read" <<<"$out" && grep -q "S3 SignatureDoesNotMatch" <<<"$out" &&
  ! grep -q "invalid DataLoadJob" <<<"$out"
check "wrong credentials: run --local says the dataset cannot be read (exit 1), not that the job is invalid" $?
[ $rc -eq 1 ] || echo "$out" | head -3
job plan-missing FixedRecord PerProcess Load "s3://nosuchbucket/data/"
out=$("$ML" plan -f "$TMP/plan-missing.yaml" 2>&1); rc=$?
[ $rc -ne 0 ] && grep -q "s3://nosuchbucket/data/: HTTP 404 Not Found: S3 NoSuchBucket" <<<"$out"
check "a missing bucket is an error naming it and NoSuchBucket" $?
sed 's|dataset: {uri: "s3://nosuchbucket/data/",|dataset: {uri: "s3://nosuchbucket/data/", samples: 640,|' \
  "$TMP/plan-missing.yaml" >"$TMP/plan-declared.yaml"
out=$(env -u AWS_ACCESS_KEY_ID -u AWS_SECRET_ACCESS_KEY "$ML" plan -f "$TMP/plan-declared.yaml" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "640 samples" <<<"$out"
check "unreachable data with spec.dataset.samples: plan uses the declared size" $?

# 3. A sidecar killed mid-epoch and started again: its trainer reconnects,
#    asks for the step it has not had, and every byte is still the planned one.
job restart FixedRecord PerProcess Load "s3://corpus/FixedRecord/"
"$SIDECAR" --job "$TMP/restart.yaml" --process 0 --socket "$TMP/r.sock" --staging host --log-level info \
  2>"$TMP/restart-1.log" &
SC=$!
PIDS+=($SC)
wait_for "$TMP/restart-1.log" "sidecar started"
"$ML" demo-trainer --job "$TMP/restart.yaml" --process 0 --socket "$TMP/r.sock" --delay-ms 10 \
  >"$TMP/trainer.out" 2>"$TMP/trainer.log" &
TR=$!
PIDS+=($TR)
sleep 1  # real time: the trainer process streams a while before its sidecar is killed
kill -9 $SC; wait $SC 2>/dev/null
"$SIDECAR" --job "$TMP/restart.yaml" --process 0 --socket "$TMP/r.sock" --staging host --log-level info \
  2>"$TMP/restart-2.log" &
SC=$!
PIDS+=($SC)
wait_for "$TMP/restart-2.log" "sidecar started"
sleep 1.5  # real time: the trainer process reconnects and streams on
kill $TR; wait $TR; trc=$?
kill $SC
last=$(tail -1 "$TMP/trainer.out")
python3 - "$last" <<'PY'
import json, sys
r = json.loads(sys.argv[1])
ok = r["mismatches"] == 0 and r["reconnects"] == 1 and r["steps"] > 40
sys.exit(0 if ok else 1)
PY
rc=$?
[ $trc -eq 0 ] && [ $rc -eq 0 ]
check "a sidecar killed mid-epoch on s3:// comes back; its trainer goes on with identical bytes" $?
[ $rc -eq 0 ] || { echo "$last"; tail -3 "$TMP/trainer.log"; }

# 4. Throttling: 503 SlowDown on the way, retried with backoff; the job goes on.
job throttled TokenStream PerProcess Load "s3://corpus/TokenStream/"
# Four in a row at most for any one request (it makes five attempts): four on
# the objects' reads, two on the listing.
curl -s -X POST "http://$ADMIN/inject?status=503&code=SlowDown&count=4&prefix=/corpus/TokenStream/" >/dev/null
curl -s -X POST "http://$ADMIN/inject?status=503&code=SlowDown&count=2&prefix=/corpus" >/dev/null
out=$(AWS_ENDPOINT_URL_S3=http://$PROXY "$ML" run --local -f "$TMP/throttled.yaml" --steps 20 2>&1); rc=$?
answered=$(curl -s "http://$ADMIN/answered")
[ $rc -eq 0 ] && grep -q "0 mismatches" <<<"$out" && [ "$answered" = 6 ]
check "6 SlowDown answers through faultproxy are retried; every byte verified" $?
[ $rc -eq 0 ] || tail -5 <<<"$out"

# ... and counted: the sidecar's meshload_storage_retries_total{reason="throttled"}.
"$SIDECAR" --job "$TMP/throttled.yaml" --process 1 --socket "$TMP/m.sock" --staging host --log-level info \
  --metrics-port 0 --metrics-address 127.0.0.1 --start-step 0 2>"$TMP/metrics-sidecar.log" &
MS=$!
PIDS+=($MS)
wait_for "$TMP/metrics-sidecar.log" "sidecar started"
MPORT=$(grep -o '"metrics_port":[0-9]*' "$TMP/metrics-sidecar.log" | head -1 | cut -d: -f2)
kill $MS; wait $MS 2>/dev/null
curl -s -X POST "http://$ADMIN/inject?status=503&code=SlowDown&count=3&prefix=/corpus/TokenStream/" >/dev/null
AWS_ENDPOINT_URL_S3=http://$PROXY "$SIDECAR" --job "$TMP/throttled.yaml" --process 1 --socket "$TMP/m.sock" \
  --staging host --log-level info --metrics-port "$MPORT" --metrics-address 127.0.0.1 2>"$TMP/metrics-sidecar-2.log" &
MS=$!
PIDS+=($MS)
wait_for "$TMP/metrics-sidecar-2.log" "sidecar started"
"$ML" demo-trainer --job "$TMP/throttled.yaml" --process 1 --socket "$TMP/m.sock" --steps 10 >"$TMP/m-trainer.out" 2>&1
curl -s "http://127.0.0.1:$MPORT/metrics" >"$TMP/metrics.txt"
kill $MS
grep -q '^meshload_storage_retries_total{reason="throttled",source="s3"} 3$' "$TMP/metrics.txt" &&
  grep -q '"mismatches":0' "$TMP/m-trainer.out"
check "the sidecar counts the retries: meshload_storage_retries_total{reason=\"throttled\",source=\"s3\"} 3" $?
grep -q 'reason="throttled"' "$TMP/metrics.txt" || grep "retries\|errors_total" "$TMP/metrics.txt" | head -5

# 6. The documented example, as docs/operations.md runs it.
mkdir -p "$GW/meshload-example"
sed 's|uri: s3://meshload-example/tokens/|uri: '"$GW"'/meshload-example/tokens|; /^    s3:/,/addressing/d' \
  "$ROOT/examples/s3-tokens.yaml" >"$TMP/example-local.yaml"
"$ML" run --local -f "$TMP/example-local.yaml" --generate-dataset "$GW/meshload-example/tokens" --files 4 --steps 1 \
  >"$TMP/example-gen.out" 2>&1
out=$("$ML" plan -f "$ROOT/examples/s3-tokens.yaml" 2>&1) && grep -q "2048 samples" <<<"$out" &&
  out=$("$ML" run --local -f "$ROOT/examples/s3-tokens.yaml" --steps 30 2>&1) && grep -q "0 mismatches" <<<"$out"
check "examples/s3-tokens.yaml: plan and run --local against the S3 endpoint, every byte verified" $?
echo "$out" >"$TMP/example.out"

# 7. meshload index on s3:// WebDataset shards (webdataset's TarWriter made
# them, tests/formats/data/webdataset): the tar headers read by ranged GETs,
# the indexes written locally, byte for byte what Energon's prepare wrote.
mkdir -p "$GW/corpus/wds" "$TMP/wdsidx"
cp "$ROOT"/tests/formats/data/webdataset/shard-00000[01].tar "$GW/corpus/wds/"
"$ML" index --output "$TMP/wdsidx" 's3://corpus/wds/shard-{000000..000001}.tar' >"$TMP/index.out" 2>&1
ok=$?
for s in 0 1; do
  cmp -s "$TMP/wdsidx/shard-00000$s.tar.idx" "$ROOT/tests/formats/data/webdataset/shard-00000$s.tar.idx" || ok=1
done
check "meshload index on s3:// shards: Energon's .tar.idx byte for byte, in --output" $ok
[ $ok -eq 0 ] || cat "$TMP/index.out"
"$ML" index 's3://corpus/wds/*.tar' >"$TMP/index-no-output.out" 2>&1
[ $? -eq 2 ] && grep -q -- "--output DIR" "$TMP/index-no-output.out"
check "meshload index: remote shards without --output are refused, saying what to do" $?

# 9. The block cache: the sidecars of one machine share it (run --local's
#    --cache-dir, as a node's hostPath cache); each block is fetched once
#    however many sidecars read it, a second run fetches nothing, a corrupt
#    block is fetched again (never served), S3 errors during a fill are
#    retried, and every byte is verified throughout.
job cached FixedRecord GlobalLoad Load "s3://corpus/FixedRecord/"
stopping_sum() {  # the sidecars' last log line: the sum of one cache figure
  cat "$1"/sidecar-*.log | grep '"sidecar stopping"' | grep -o "\"$2\":[0-9]*" | cut -d: -f2 | awk '{s += $1} END {print s + 0}'
}
cached_run() {  # cached_run NAME [ENV...]: run --local into $TMP/NAME, its output in $TMP/NAME.out
  local name=$1
  shift
  rm -rf "$TMP/$name"
  env "$@" "$ML" run --local -f "$TMP/cached.yaml" --steps 40 --cache-dir "$TMP/blocks" --run-dir "$TMP/$name" \
    >"$TMP/$name.out" 2>&1
}
cached_run cache-1
[ $? -eq 0 ] && grep -q "0 mismatches" "$TMP/cache-1.out" && grep -q "remote storage       through the block cache" "$TMP/cache-1.out" &&
  [ "$(stopping_sum "$TMP/cache-1" cache_fetched_bytes)" = 614400 ]
check "two sidecars sharing a block cache fetch each of the 3 objects once (614400 bytes between them); every byte verified" $?
grep "remote storage\|mismatches" "$TMP/cache-1.out"
cached_run cache-2
[ $? -eq 0 ] && grep -q "0 mismatches" "$TMP/cache-2.out" && [ "$(stopping_sum "$TMP/cache-2" cache_fetched_bytes)" = 0 ] &&
  [ "$(stopping_sum "$TMP/cache-2" cache_misses)" = 0 ] && [ "$(stopping_sum "$TMP/cache-2" cache_found_blocks)" -ge 3 ] &&
  grep -q "blocks found in the cache directory" "$TMP/cache-2.out"
check "restarted sidecars find the cache on disk: nothing fetched, no miss, the blocks counted as found" $?
grep "remote storage" "$TMP/cache-2.out"
block=$(find "$TMP/blocks/meshload-blocks-v1" -type f ! -name '*.fill' | head -1)
printf '\xff\xfe' | dd of="$block" bs=1 seek=100 conv=notrunc status=none
cached_run cache-3
[ $? -eq 0 ] && grep -q "0 mismatches" "$TMP/cache-3.out" && [ "$(stopping_sum "$TMP/cache-3" cache_corrupt_blocks)" -ge 1 ] &&
  [ "$(stopping_sum "$TMP/cache-3" cache_fetched_bytes)" -gt 0 ] && grep -q "corrupt blocks fetched again" "$TMP/cache-3.out"
check "a block corrupted on disk is found by its checksum, fetched again, never served: every byte verified" $?
grep "remote storage" "$TMP/cache-3.out"
rm -rf "$TMP/blocks"
curl -s -X POST "http://$ADMIN/reset" >/dev/null 2>&1
curl -s -X POST "http://$ADMIN/inject?status=503&code=SlowDown&count=4&prefix=/corpus/FixedRecord/" >/dev/null
before=$(curl -s "http://$ADMIN/answered")
cached_run cache-4 AWS_ENDPOINT_URL_S3=http://$PROXY
[ $? -eq 0 ] && grep -q "0 mismatches" "$TMP/cache-4.out" && [ "$(( $(curl -s "http://$ADMIN/answered") - before ))" = 4 ]
check "S3 SlowDown while the cache fills is retried: every byte verified" $?
sed 's|dataset: {uri: "s3://corpus/FixedRecord/",|dataset: {uri: "s3://corpus/FixedRecord/", cache: {mode: Direct},|' \
  "$TMP/cached.yaml" >"$TMP/direct.yaml"
out=$("$ML" run --local -f "$TMP/direct.yaml" --steps 20 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "0 mismatches" <<<"$out" && grep -q "read directly: spec.dataset.cache.mode is Direct" <<<"$out"
check "cache.mode Direct reads each range from S3, every byte verified" $?
[ $rc -eq 0 ] || tail -5 <<<"$out"
sed 's|dataset: {uri: "s3://corpus/FixedRecord/",|dataset: {uri: "s3://corpus/FixedRecord/", cache: {warmSteps: 8},|' \
  "$TMP/cached.yaml" >"$TMP/warm.yaml"
out=$("$ML" run --local -f "$TMP/warm.yaml" --steps 20 --run-dir "$TMP/warm" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "0 mismatches" <<<"$out" && grep -q "the block cache holds the first steps' blocks" "$TMP/warm/sidecar-0.log"
check "warmSteps: the sidecar fills the first steps' blocks before it is ready; every byte verified" $?
out=$("$ML" plan -f "$TMP/cached.yaml" --compare 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "remote dataset: one epoch of process 0 under each shuffle" <<<"$out" &&
  grep -q "^\* Global" <<<"$out" && grep -q "Window (" <<<"$out"
check "plan --compare on s3:// shows each shuffle's bytes fetched per epoch and the cache it needs" $?
[ $rc -eq 0 ] && grep -A6 "remote dataset" <<<"$out"

# 8. The secret access key is nowhere: outputs, sidecar logs.
if grep -rl -- "$SECRET" "$TMP"/*.out "$TMP"/*.log 2>/dev/null | grep -v "gw.log"; then
  check "the secret access key appears in no output or log" 1
else
  check "the secret access key appears in no output or log" 0
fi
finish
