#!/usr/bin/env bash
# `meshload index` on local WebDataset shards (webdataset's TarWriter made
# them, tests/formats/data/webdataset): the .tar.idx files are byte for byte
# what Energon's prepare wrote; a second run resumes (shards with an index
# are left alone) and --force redoes them; a damaged shard is named with the
# byte at fault, gets no index (not even a partial one) and does not stop
# the others; --output writes elsewhere; bad arguments are usage errors.
# TFRecord files (TensorFlow's, tests/formats/data/tfrecord): their indexes
# are what DALI's tfrecord2idx wrote.
# (s3:// shards: tests/s3/s3_run_test.sh.)
# usage: index_cli_test.sh MESHLOAD_BINARY REPO_ROOT
set -u
ML=$1
ROOT=$2
source "$ROOT/tests/testing/shell_checks.sh"
DATA=$ROOT/tests/formats/data/webdataset

cp "$DATA"/shard-00000[012].tar "$TMP/"
"$ML" index "$TMP/shard-{000000..000002}.tar" >"$TMP/run1.out" 2>&1
ok=$?
for s in 0 1; do cmp -s "$TMP/shard-00000$s.tar.idx" "$DATA/shard-00000$s.tar.idx" || ok=1; done
[ "$(stat -c %s "$TMP/shard-000002.tar.idx")" -eq $(((5 + 1) * 8)) ] || ok=1
check "three shards indexed, two of them byte for byte as Energon's prepare wrote them" $ok
[ $ok -eq 0 ] || cat "$TMP/run1.out"
grep -q "\[3/3\]" "$TMP/run1.out" && grep -q "12 samples" "$TMP/run1.out"
check "progress: a line per shard with its samples" $?

before=$(stat -c %i.%Y "$TMP"/*.idx)
"$ML" index "$TMP" >"$TMP/run2.out" 2>&1 && grep -q "0 indexed, 3 had an index, 0 failed" "$TMP/run2.out" &&
  [ "$(stat -c %i.%Y "$TMP"/*.idx)" = "$before" ]
check "a second run (the directory) leaves the shards that have an index alone" $?
rm "$TMP/shard-000001.tar.idx"
"$ML" index --jobs 1 "$TMP/*.tar" >"$TMP/run3.out" 2>&1 && grep -q "1 indexed, 2 had an index" "$TMP/run3.out" &&
  cmp -s "$TMP/shard-000001.tar.idx" "$DATA/shard-000001.tar.idx"
check "an interrupted run is resumed: only the shard without an index is read (a glob)" $?
"$ML" index --force "$TMP/shard-000000.tar" >"$TMP/run4.out" 2>&1 && grep -q "1 indexed, 0 had" "$TMP/run4.out"
check "--force indexes a shard again" $?

# A shard whose second header block has a flipped byte.
mkdir -p "$TMP/bad"
cp "$DATA/shard-000001.tar" "$TMP/bad/shard-bad.tar"
cp "$DATA/shard-000002.tar" "$TMP/bad/shard-good.tar"
printf '\x7f' | dd of="$TMP/bad/shard-bad.tar" bs=1 seek=$((1024 + 10)) conv=notrunc status=none
"$ML" index "$TMP/bad" >"$TMP/bad.out" 2>&1
rc=$?
[ $rc -eq 1 ] && grep -q "shard-bad.tar@1024: bad header checksum" "$TMP/bad.out" &&
  [ ! -e "$TMP/bad/shard-bad.tar.idx" ] && [ -z "$(ls "$TMP/bad" | grep tmp)" ] && [ -s "$TMP/bad/shard-good.tar.idx" ] &&
  grep -q "1 indexed, 0 had an index, 1 failed" "$TMP/bad.out"
check "a damaged shard is named with its byte, gets no index, and the others are indexed (exit 1)" $?
[ $rc -eq 1 ] || cat "$TMP/bad.out"
# --force over a shard that had an index and is damaged now: the old index,
# which describes other bytes, is removed, not left to be read.
mkdir -p "$TMP/stale"
cp "$DATA/shard-000001.tar" "$TMP/stale/shard.tar"
"$ML" index "$TMP/stale" >/dev/null 2>&1
[ -s "$TMP/stale/shard.tar.idx" ]
check "a shard indexed before it is damaged" $?
printf '\x7f' | dd of="$TMP/stale/shard.tar" bs=1 seek=$((1024 + 10)) conv=notrunc status=none
"$ML" index --force "$TMP/stale" >"$TMP/stale.out" 2>&1
rc=$?
[ $rc -eq 1 ] && [ ! -e "$TMP/stale/shard.tar.idx" ] && grep -q "its old index removed" "$TMP/stale.out"
check "--force on a damaged shard removes its old index (exit 1)" $?
[ $rc -eq 1 ] || cat "$TMP/stale.out"

mkdir -p "$TMP/out"
"$ML" index --output "$TMP/out" "$DATA/shard-000000.tar" >"$TMP/out.out" 2>&1 &&
  cmp -s "$TMP/out/shard-000000.tar.idx" "$DATA/shard-000000.tar.idx"
check "--output DIR: the index is written there, by the shard's name" $?

"$ML" index >"$TMP/u1.out" 2>&1
[ $? -eq 2 ] && grep -q "no shards given" "$TMP/u1.out"
check "no shards given: a usage error" $?
"$ML" index --jobs 0 "$TMP" >"$TMP/u2.out" 2>&1
[ $? -eq 2 ] && grep -q -- "--jobs: expected 1 to 256" "$TMP/u2.out"
check "--jobs 0: a usage error" $?
"$ML" index "$TMP/out" >"$TMP/u3.out" 2>&1
[ $? -eq 2 ] && grep -q "no .tar shards or .tfrecord files found" "$TMP/u3.out"
check "a folder without shards: a usage error naming it" $?
"$ML" index --output "$TMP/nowhere" "$TMP" >"$TMP/u4.out" 2>&1
[ $? -eq 2 ] && grep -q "no such directory" "$TMP/u4.out"
check "--output to a folder that does not exist: a usage error" $?
"$ML" index --format tar "$TMP" >"$TMP/u5.out" 2>&1
[ $? -eq 2 ] && grep -q -- "--format: expected WebDataset or TFRecord, got 'tar'" "$TMP/u5.out"
check "--format of another format: a usage error" $?

# TFRecord files TensorFlow wrote: their index is byte for byte what DALI's
# tfrecord2idx (the tfrecord package's) wrote; a file named without
# .tfrecord is indexed with --format TFRecord; a file cut short is named with
# the byte of the record it cuts, and gets no index.
TF=$ROOT/tests/formats/data/tfrecord
mkdir -p "$TMP/tf"
cp "$TF"/part-0000[01].tfrecord "$TMP/tf/"
cp "$TF/part-00002.tfrecord" "$TMP/tf/train-00002-of-00003"
"$ML" index "$TMP/tf" >"$TMP/tf1.out" 2>&1 && grep -q "2 indexed, 0 had an index, 0 failed" "$TMP/tf1.out" &&
  cmp -s "$TMP/tf/part-00000.tfrecord.idx" "$TF/part-00000.tfrecord.idx" &&
  cmp -s "$TMP/tf/part-00001.tfrecord.idx" "$TF/part-00001.tfrecord.idx" && grep -q "12 records" "$TMP/tf1.out"
check "TFRecord files indexed byte for byte as tfrecord2idx indexed them (.tfrecord names)" $?
[ $? -eq 0 ] || cat "$TMP/tf1.out"
"$ML" index --format TFRecord "$TMP/tf/train-00002-of-00003" >"$TMP/tf2.out" 2>&1 &&
  cmp -s "$TMP/tf/train-00002-of-00003.idx" "$TF/part-00002.tfrecord.idx"
check "--format TFRecord indexes a file named without .tfrecord" $?
head -c 2000 "$TF/part-00001.tfrecord" >"$TMP/tf/cut.tfrecord"
"$ML" index "$TMP/tf/cut.tfrecord" >"$TMP/tf3.out" 2>&1
[ $? -eq 1 ] && grep -q "cut.tfrecord@1430: a record of 790 bytes runs past the end of the file" "$TMP/tf3.out" && [ ! -e "$TMP/tf/cut.tfrecord.idx" ]
check "a TFRecord file cut short: named with the byte of the record it cuts, no index written" $?
[ $? -eq 0 ] || cat "$TMP/tf3.out"

# Compressed TFRecord files TensorFlow wrote (GZIP and ZLIB): indexed in
# their decompressed bytes, which are the uncompressed files', so the
# indexes are tfrecord2idx's of those; without --compression the error
# says which option the file looks like; a file cut short is named.
mkdir -p "$TMP/tfz"
cp "$TF"/gzip/part-0000[01].tfrecord.gz "$TF"/zlib/part-00002.tfrecord.zlib "$TMP/tfz/"
"$ML" index --compression GZIP "$TMP/tfz/"'*.gz' >"$TMP/tfz1.out" 2>&1 &&
  "$ML" index --compression ZLIB "$TMP/tfz/part-00002.tfrecord.zlib" >>"$TMP/tfz1.out" 2>&1 &&
  cmp -s "$TMP/tfz/part-00000.tfrecord.gz.idx" "$TF/part-00000.tfrecord.idx" &&
  cmp -s "$TMP/tfz/part-00001.tfrecord.gz.idx" "$TF/part-00001.tfrecord.idx" &&
  cmp -s "$TMP/tfz/part-00002.tfrecord.zlib.idx" "$TF/part-00002.tfrecord.idx" && grep -q "7 records" "$TMP/tfz1.out"
check "GZIP and ZLIB TFRecord files indexed in their decompressed bytes, as tfrecord2idx indexed those" $?
[ $? -eq 0 ] || cat "$TMP/tfz1.out"
rm "$TMP/tfz/part-00000.tfrecord.gz.idx"
"$ML" index "$TMP/tfz/part-00000.tfrecord.gz" >"$TMP/tfz2.out" 2>&1
[ $? -eq 1 ] && grep -q "starts like a GZIP stream: if TensorFlow wrote it compressed, index it with --compression GZIP" \
  "$TMP/tfz2.out" && [ ! -e "$TMP/tfz/part-00000.tfrecord.gz.idx" ]
check "a GZIP file indexed as uncompressed: the error names the option it needs" $?
head -c 300 "$TF/gzip/part-00001.tfrecord.gz" >"$TMP/tfz/cut.tfrecord.gz"
"$ML" index --compression GZIP "$TMP/tfz/cut.tfrecord.gz" >"$TMP/tfz3.out" 2>&1
[ $? -eq 1 ] && grep -q "cut.tfrecord.gz" "$TMP/tfz3.out" && [ ! -e "$TMP/tfz/cut.tfrecord.gz.idx" ]
check "a GZIP file cut short: named, no index written" $?
[ $? -eq 0 ] || cat "$TMP/tfz3.out"
"$ML" index --compression zstd "$TMP/tfz/cut.tfrecord.gz" >"$TMP/tfz4.out" 2>&1
[ $? -eq 2 ] && grep -q -- "--compression: expected GZIP or ZLIB" "$TMP/tfz4.out"
check "--compression takes GZIP or ZLIB" $?
finish
