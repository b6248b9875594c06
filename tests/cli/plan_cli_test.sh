#!/usr/bin/env bash
# End-to-end tests of `meshload plan`: exit codes, the JSON contract
# (docs/plan-json.md) and validation messages on stderr.
# usage: plan_cli_test.sh MESHLOAD_BINARY REPO_ROOT
set -u
BIN=$1
ROOT=$2
PY=${PYTHON:-python3}
source "$(dirname "$0")/../testing/shell_checks.sh"

JOB=$ROOT/examples/hybrid-fsdp.yaml

# 1. A valid job prints a table with the cost and exits 0.
out=$("$BIN" plan -f "$JOB" 2>"$TMP/err"); rc=$?
[ $rc -eq 0 ] && grep -q "cost per step" <<<"$out" && grep -q "device 7  shard 3" <<<"$out"
check "table output for a valid job" $?

# 2. JSON follows the contract.
"$BIN" plan -f "$JOB" --format json --steps 2:5 >"$TMP/plan.json"; rc=$?
[ $rc -eq 0 ] && "$PY" - "$TMP/plan.json" <<'PYEOF'
import json, sys
p = json.load(open(sys.argv[1]))
for k in ["processes", "devices", "shards", "globalBatch", "samples", "stepsPerEpoch", "steps", "cost"]:
    assert k in p, k
assert p["processes"] == 4 and p["devices"] == 8 and p["shards"] == 4 and p["globalBatch"] == 32
assert [s["step"] for s in p["steps"]] == [2, 3, 4]
for s in p["steps"]:
    assert set(s) >= {"step", "epoch", "devices", "reads", "transfers"}
    assert len(s["devices"]) == 8
    by_shard = {}
    for d in s["devices"]:
        assert set(d) >= {"device", "process", "shard", "samples"}
        assert all(0 <= x < p["samples"] for x in d["samples"])
        by_shard.setdefault(d["shard"], d["samples"])
        assert by_shard[d["shard"]] == d["samples"], "replicas differ"
    batch = sum((by_shard[k] for k in sorted(by_shard)), [])
    assert len(batch) == 32 and len(set(batch)) == 32
    for r in s["reads"]:
        assert set(r) >= {"process", "samples"}
    for t in s["transfers"]:
        assert set(t) >= {"from", "to", "samples"}
assert set(p["cost"]) >= {"bytesReadPerStep", "bytesTransferredPerStep"}
assert p["cost"]["bytesReadPerStep"] > 0
PYEOF
check "json output follows the contract" $?

# 3. --process restricts the output to one process.
"$BIN" plan -f "$JOB" --format json --process 2 >"$TMP/p2.json" &&
  "$PY" -c 'import json,sys; p=json.load(open(sys.argv[1])); assert {d["process"] for d in p["steps"][0]["devices"]} == {2}; assert {r["process"] for r in p["steps"][0]["reads"]} == {2}' "$TMP/p2.json"
check "--process restricts to one process" $?

# 4. --compare lists all four strategies and both fan-outs.
"$BIN" plan -f "$JOB" --compare --format json >"$TMP/cmp.json" &&
  "$PY" -c 'import json,sys; c=json.load(open(sys.argv[1]))["compare"]; assert len(c)==8; assert sum(r["selected"] for r in c)==1; assert {r["strategy"] for r in c}=={"GlobalLoad","PerDevice","PerProcess","LoadAndReshard"}' "$TMP/cmp.json"
check "--compare json has 8 rows" $?
"$BIN" plan -f "$JOB" --compare | grep -q "LoadAndReshard"
check "--compare table" $?

# 5. An invalid spec exits 2 with every problem on stderr.
sed -e 's/size: 2}/size: 0}/' -e 's/globalBatchSize: 32/globalBatchSize: 30/' -e 's/strategy: PerProcess/strategy: PerProces/' "$JOB" >"$TMP/bad.yaml"
"$BIN" plan -f "$TMP/bad.yaml" >"$TMP/out" 2>"$TMP/err"; rc=$?
[ $rc -eq 2 ] && grep -q "spec.mesh.axes\[0\].size: must be >= 1, got 0" "$TMP/err" &&
  grep -q "spec.strategy: unknown value 'PerProces' (did you mean PerProcess?)" "$TMP/err" && [ ! -s "$TMP/out" ]
check "invalid spec: exit 2 and messages on stderr" $?

sed -e 's/globalBatchSize: 32/globalBatchSize: 30/' "$JOB" >"$TMP/bad2.yaml"
"$BIN" plan -f "$TMP/bad2.yaml" 2>"$TMP/err2" >/dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "spec.batch.globalBatchSize: 30 is not divisible by the 4 data shards of batchAxes \[data, fsdp\]" "$TMP/err2"
check "B not divisible by S is named" $?

# 6. resume.step sets the default first step and reproduces the same samples.
sed -e 's/^  shuffle:/  resume: {step: 9}\n  shuffle:/' "$JOB" >"$TMP/resume.yaml"
a=$("$BIN" plan -f "$TMP/resume.yaml" --format json | "$PY" -c 'import json,sys; s=json.load(sys.stdin)["steps"][0]; print(s["step"], s["devices"][5]["samples"])')
b=$("$BIN" plan -f "$JOB" --format json --steps 9 | "$PY" -c 'import json,sys; s=json.load(sys.stdin)["steps"][0]; print(s["step"], s["devices"][5]["samples"])')
[ -n "$a" ] && [ "$a" = "$b" ] && [ "${a%% *}" = 9 ]
check "resume.step reproduces the uninterrupted step" $?

# 7. --samples plans a dataset that is not reachable; real files are indexed.
mkdir -p "$TMP/data"
head -c $((4098 * 100)) /dev/zero >"$TMP/data/a.bin"
# The data on this machine, not in the trainer pods' volume: the volume goes too.
NOVOL=(-e '/    volume:/,/mountPath:/d')
sed -e "s#uri: /datasets/tokens/\*.bin.*#uri: $TMP/data#" -e '/samples: 1000000/d' "${NOVOL[@]}" "$JOB" >"$TMP/local.yaml"
"$BIN" plan -f "$TMP/local.yaml" --format json | "$PY" -c 'import json,sys; p=json.load(sys.stdin); assert p["dataset"]["indexed"] and p["samples"] == (4098*100//2 - 1)//2048, p["samples"]'
check "local files are indexed" $?
"$BIN" plan -f "$TMP/local.yaml" --samples 500 --format json | "$PY" -c 'import json,sys; p=json.load(sys.stdin); assert not p["dataset"]["indexed"] and p["samples"] == 500'
check "--samples overrides the index" $?
sed -e "s#uri: /datasets/tokens/\*.bin.*#uri: $TMP/nowhere#" -e '/samples: 1000000/d' "${NOVOL[@]}" "$JOB" >"$TMP/nowhere.yaml"
"$BIN" plan -f "$TMP/nowhere.yaml" 2>"$TMP/err3" >/dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "spec.dataset.samples or --samples" "$TMP/err3"
check "unreachable data without a sample count is explained" $?

# 8. Usage errors exit 2.
"$BIN" plan -f "$JOB" --format yaml 2>/dev/null; [ $? -eq 2 ]
check "bad --format exits 2" $?
"$BIN" plan -f "$JOB" --bogus 2>/dev/null; [ $? -eq 2 ]
check "unknown flag exits 2" $?
"$BIN" plan -f "$JOB" --process 4 2>/dev/null; [ $? -eq 2 ]
check "out-of-range --process exits 2" $?
"$BIN" plan -f "$TMP/missing.yaml" 2>"$TMP/err4"; rc=$?
[ $rc -eq 1 ] && grep -q "missing.yaml" "$TMP/err4"
check "missing job file exits 1 naming the file" $?

"$BIN" plan -f "$TMP" 2>"$TMP/err5"; rc=$?
[ $rc -eq 1 ] && grep -q "is not a regular file" "$TMP/err5"
check "a directory as job file exits 1" $?
"$BIN" plan -f "$JOB" --compare --process 1 2>/dev/null; [ $? -eq 2 ]
check "--compare with --process is a usage error" $?
printf 'kind: DataLoadJob\nspec: [unclosed\n' >"$TMP/broken.yaml"
"$BIN" plan -f "$TMP/broken.yaml" 2>"$TMP/err6"; rc=$?
[ $rc -eq 2 ] && grep -q "broken.yaml:3:1: not valid YAML" "$TMP/err6"
check "invalid YAML names file:line:column" $?
sed -e 's/globalBatchSize: 32/globalBatchSize: "32"/' "$JOB" >"$TMP/quoted.yaml"
"$BIN" plan -f "$TMP/quoted.yaml" 2>"$TMP/err7" >/dev/null; rc=$?
[ $rc -eq 2 ] && grep -q "spec.batch.globalBatchSize: expected an integer" "$TMP/err7"
check "a quoted batch size is an error, not a crash" $?

# The contract lists every dataset format the plan can report (the
# declaration's enum of spec.dataset.format).
"$PY" - "$ROOT/planner/api/dataloadjob.yaml" "$ROOT/docs/plan-json.md" <<'PYEOF'
import re, sys, yaml
api = yaml.safe_load(open(sys.argv[1]))
def find(node):
    if isinstance(node, dict):
        if node.get("x-cpp-enum") == "DatasetFormat":
            return node["enum"]
        for v in node.values():
            r = find(v)
            if r:
                return r
    elif isinstance(node, list):
        for v in node:
            r = find(v)
            if r:
                return r
formats = find(api)
row = next(l for l in open(sys.argv[2]) if l.startswith("| `format` |"))
documented = re.findall(r"`([A-Za-z]+)`", row.split("|")[3])
assert sorted(documented) == sorted(formats), (documented, formats)
PYEOF
check "plan-json.md lists every dataset format" $?

# --json is --format json; with another --format it is a usage error.
"$BIN" plan -f "$JOB" --json --steps 2:3 >"$TMP/plan-json-flag.json" 2>"$TMP/err-json"; rc=$?
[ $rc -eq 0 ] && "$BIN" plan -f "$JOB" --format json --steps 2:3 | cmp -s - "$TMP/plan-json-flag.json"
check "--json prints what --format json prints" $?
"$BIN" plan -f "$JOB" --json --format table >/dev/null 2>"$TMP/err-json2"; rc=$?
[ $rc -eq 2 ] && grep -q -- "--json contradicts --format table" "$TMP/err-json2"
check "--json with --format table is a usage error" $?

# Compressed MDS shards (MDSWriter's zstd) go through the block cache as one
# block each: --compare shows the cache each shuffle needs for them.
cat >"$TMP/mds-zstd.yaml" <<EOF
apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {name: mds-zstd}
spec:
  mesh: {axes: [{name: data, size: 2}], processes: 2, devicesPerProcess: 1}
  strategy: PerProcess
  dataset: {uri: "$ROOT/tests/formats/data/mds/zstd", format: MDS, fields: [{name: image}]}
  batch: {globalBatchSize: 8}
  shuffle: {mode: Global, seed: 3}
EOF
out=$("$BIN" plan -f "$TMP/mds-zstd.yaml" --compare 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "dataset: MDS, 40 samples" <<<"$out" &&
  grep -q "compressed files: one epoch of process 0 under each shuffle" <<<"$out" &&
  grep -q "a compressed file one block of its decompressed bytes" <<<"$out" &&
  grep -qE "^\* Global +[0-9.]+ KiB +23.0 KiB +29.5 KiB" <<<"$out"
check "plan --compare on zstd MDS shards: each shard one block of its decompressed bytes (29.5 KiB in the cache), fetched as its 23.0 KiB stored" $?
[ $rc -eq 0 ] || echo "$out" | tail -5
"$BIN" plan -f "$TMP/mds-zstd.yaml" --compare --json |
  "$PY" -c 'import json,sys; r=json.load(sys.stdin)["remote"]; assert r["compressedFiles"] is True; assert r["shuffles"][1]["fetchedBytesPerEpoch"]==23528, r; assert r["shuffles"][1]["cacheNeededBytes"]<=30161, r'
check "plan --compare --json: compressedFiles, the shards' 23528 stored bytes fetched per epoch" $?
out=$("$BIN" run --local -f "$TMP/mds-zstd.yaml" --steps 12 --run-dir "$TMP/mds-zstd-run" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$out" &&
  grep -q "compressed files     through the block cache: 23.53 kB fetched" <<<"$out" && grep -q "^OK$" <<<"$out"
check "run --local on zstd MDS shards: each shard decompressed once into the run's block cache, every byte verified" $?
[ $rc -eq 0 ] || echo "$out" | tail -5

# Parquet files (pyarrow's: row groups of 7, 25 and 1000 rows): a row's read
# decodes its row group, so --compare shows, per shuffle, the row groups'
# column chunks fetched per epoch (each once, what pyarrow's footers say
# the two fields' chunks hold); the capacity holds them all, so nothing is
# fetched twice (a small capacity: tests/sidecar/record_formats_test.cc,
# Parquet.TheFetchEstimateIsWhatTheRowSourceDecodes).
cat >"$TMP/parquet.yaml" <<EOF
apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {name: parquet}
spec:
  mesh: {axes: [{name: data, size: 1}], processes: 1, devicesPerProcess: 1}
  strategy: PerProcess
  dataset: {uri: "$ROOT/tests/formats/data/parquet/rg*.parquet", format: Parquet, missingField: Skip, fields: [{name: input_ids, maxBytes: 160}, {name: label}]}
  batch: {globalBatchSize: 4}
  shuffle: {mode: Global, seed: 3}
EOF
out=$("$BIN" plan -f "$TMP/parquet.yaml" --compare 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "Parquet: one epoch of process 0 under each shuffle; a row's read decodes its whole row group (13 in all)" <<<"$out" &&
  grep -qE "^\* Global +13 " <<<"$out" && ! grep -q "through the block cache" <<<"$out"
check "plan --compare on Parquet files: the row groups each shuffle decodes, not the block cache" $?
[ $rc -eq 0 ] || echo "$out" | tail -8
VPY=$ROOT/.venv/bin/python
[ -x "$VPY" ] || VPY=$PY
want=$("$VPY" -c 'import glob,sys,pyarrow.parquet as pq
n=0
for f in sorted(glob.glob(sys.argv[1]+"/rg*.parquet")):
  md=pq.ParquetFile(f).metadata
  for g in range(md.num_row_groups):
    for c in range(md.num_columns):
      col=md.row_group(g).column(c)
      if col.path_in_schema in ("input_ids.list.element","label"): n+=col.total_compressed_size
print(n)' "$ROOT/tests/formats/data/parquet")
"$BIN" plan -f "$TMP/parquet.yaml" --compare --json |
  "$PY" -c 'import json,sys
p=json.load(sys.stdin)["parquet"]; s={r["shuffle"]: r for r in p["shuffles"]}; want=int(sys.argv[1])
assert p["rowGroups"]==13, p
for m in ("None","Global"): assert s[m]["rowGroupsRead"]==13 and s[m]["fetchedBytesPerEpoch"]==want, (want, s[m])
assert s["Global"]["selected"] and s["Global"]["fits"], s
assert all(r["refetch"]==1.0 and r["fetchedBytesPerEpochAtCapacity"]==want for r in s.values()), s
assert s["Block"]["blockSize"]==13, s' "$want"
check "plan --compare --json on Parquet: each shuffle fetches the 13 row groups' chunks once ($want bytes, as pyarrow's footers say)" $?

# A DatasetDict save_to_disk wrote (format Arrow, split train): its record
# batches stand for row groups, each batch's message fetched once, whatever
# the fields (the batches and file sizes as pyarrow and the files say).
cat >"$TMP/saved.yaml" <<EOF
apiVersion: meshload.io/v1alpha1
kind: DataLoadJob
metadata: {name: saved}
spec:
  mesh: {axes: [{name: data, size: 1}], processes: 1, devicesPerProcess: 1}
  strategy: PerProcess
  dataset: {uri: "$ROOT/tests/formats/data/saved/tokens", format: Arrow, split: train, fields: [{name: input_ids, maxBytes: 92}, {name: text, maxBytes: 64}, {name: label}]}
  batch: {globalBatchSize: 5}
  shuffle: {mode: Global, seed: 3}
EOF
out=$("$BIN" plan -f "$TMP/saved.yaml" --compare 2>&1); rc=$?
batches=$("$PY" -c 'import json,sys; e=json.load(open(sys.argv[1])); print(sum(len(v) for v in e["batches"]["tokens/train"].values()))' \
  "$ROOT/tests/formats/data/saved/expected.json")
[ $rc -eq 0 ] && grep -q "Arrow: one epoch of process 0 under each shuffle; a row's read decodes its whole row group ($batches in all)" <<<"$out"
check "plan --compare on a save_to_disk dataset: its $batches record batches, each decoded by the shuffles" $?
[ $rc -eq 0 ] || echo "$out" | tail -5
size=$(cat "$ROOT"/tests/formats/data/saved/tokens/train/*.arrow | wc -c)
"$BIN" plan -f "$TMP/saved.yaml" --compare --json |
  "$PY" -c 'import json,sys
p=json.load(sys.stdin)["parquet"]; s={r["shuffle"]: r for r in p["shuffles"]}; size=int(sys.argv[1]); n=int(sys.argv[2])
assert p["rowGroups"]==n, p
for m in ("None","Global"): assert s[m]["rowGroupsRead"]==n and size//2 < s[m]["fetchedBytesPerEpoch"] <= size, (size, s[m])' "$size" "$batches"
check "plan --compare --json on a save_to_disk dataset: each shuffle fetches the batches' messages once (at most the files' $size bytes)" $?

# docs/crd-reference.md's examples of dataset.format errors are what
# meshload prints (the formats listed are every format).
sed 's/    format: TokenStream/    format: npy/' "$JOB" >"$TMP/npy.yaml"
"$BIN" plan -f "$TMP/npy.yaml" >/dev/null 2>"$TMP/err-npy"
sed '/    format: TokenStream/d' "$JOB" >"$TMP/noformat.yaml"
"$BIN" plan -f "$TMP/noformat.yaml" >/dev/null 2>"$TMP/err-noformat"
unknown=$(grep -o "spec.dataset.format: unknown value 'npy' (did you mean Npy?); expected one of [A-Za-z, ]*[A-Za-z]" \
  "$TMP/err-npy")
missing=$(grep -o "spec.dataset.format: required field is missing; one of [A-Za-z, ]*" "$TMP/err-noformat")
[ -n "$unknown" ] && [ -n "$missing" ] && grep -qF "$unknown (line" "$ROOT/docs/crd-reference.md" &&
  grep -qxF "$missing" "$ROOT/docs/crd-reference.md"
check "crd-reference.md's dataset.format errors are meshload's" $?

finish
