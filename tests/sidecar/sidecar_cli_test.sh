#!/usr/bin/env bash
# End-to-end checks of the real binaries: `meshload run --local` on every
# format, mismatch detection, a trainer with another uid refused, the
# sidecar's /metrics checked by promtool and scraped by a real Prometheus.
# usage: sidecar_cli_test.sh MESHLOAD MESHLOAD_SIDECAR REPO_ROOT [FAKE_LIBCUDA]
set -u
ML=$1
SIDECAR=$2
ROOT=$3
FAKE_CUDA=${4:-}
source "$(dirname "$0")/../testing/shell_checks.sh"

job() {  # job NAME FORMAT-FIELDS STRATEGY
  two_process_job "$TMP/$1.yaml" "$1" data "  strategy: $3
  dataset:
    uri: $TMP/none
$2
  batch: {globalBatchSize: 8, prefetch: 3}
  shuffle: {mode: Global, seed: 9}"
}

# 1. The main job on every format (each with a different strategy).
job fixed "    format: FixedRecord
    recordBytes: 1000" PerProcess
job tokens "    format: TokenStream
    dtype: uint32
    sequenceLength: 31" PerDevice
job npy "    format: Npy
    dtype: int16
    recordBytes: 96" GlobalLoad
for name in fixed tokens npy; do
  out=$("$ML" run --local -f "$TMP/$name.yaml" --generate-dataset "$TMP/data-$name" --samples 400 --files 3 \
        --steps 120 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q "verified             bytes, 0 mismatches" <<<"$out" && grep -q "^OK$" <<<"$out"
  check "run --local $name: every byte verified" $?
  [ $rc -eq 0 ] || echo "$out" | tail -20
done

# 1b. Plans that move samples between processes: the sidecars exchange them
# over TCP, and the trainers verify every byte. `model` spans the processes,
# so replicas live in different processes.
moving() {  # moving NAME STRATEGY FANOUT
  two_process_job "$TMP/$1.yaml" "$1" model "  replication: {mode: Partial, fanout: $3}
  strategy: $2
  dataset: {uri: $TMP/none, format: TokenStream, dtype: uint16, sequenceLength: 63}
  batch: {globalBatchSize: 8, prefetch: 3}
  shuffle: {mode: Global, seed: 9}"
}
moving reshard LoadAndReshard Load
moving bcast PerProcess Broadcast
moving gbcast GlobalLoad Broadcast
for name in reshard bcast gbcast; do
  out=$("$ML" run --local -f "$TMP/$name.yaml" --generate-dataset "$TMP/data-$name" --samples 400 --files 2 \
        --steps 150 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q "exchange them over TCP" <<<"$out" && grep -q "verified             bytes, 0 mismatches" <<<"$out" \
    && grep -q "^OK$" <<<"$out"
  check "run --local $name: samples moved between sidecars, every byte verified" $?
  [ $rc -eq 0 ] || echo "$out" | tail -20
done

# run's own flags: a bad one is a usage error naming it (exit 2).
out=$("$ML" run --local -f "$TMP/reshard.yaml" --reader-threads -1 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--reader-threads: expected 1 to 256 (or 0: the sidecar's default), got -1" <<<"$out"
check "run --local --reader-threads -1 is a usage error naming the flag" $?

# 1c. GPU staging with the stand-in driver (tests/testing/fake_cuda.cc): the
# sidecars stage on "GPUs", each process on its own, local replicas by
# device copy; the trainers import the slots and copy every tensor back to
# check it. Legacy IPC handles too, with samples moving between sidecars.
# With fewer GPUs than a process has devices, the sidecars stage on the host.
if [ -n "$FAKE_CUDA" ]; then
  gpus=GPU-aaaaaaaa-0000-4000-8000-000000000001,GPU-aaaaaaaa-0000-4000-8000-000000000002
  gpus=$gpus,GPU-aaaaaaaa-0000-4000-8000-000000000003,GPU-aaaaaaaa-0000-4000-8000-000000000004
  out=$(MESHLOAD_CUDA_LIBRARY=$FAKE_CUDA MESHLOAD_FAKE_CUDA_DEVICES=$gpus "$ML" run --local -f "$TMP/fixed.yaml" \
        --generate-dataset "$TMP/data-gpu" --samples 400 --steps 100 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q "each process stages on its own" <<<"$out" \
    && grep -qE "staging +cuda \(400 GPU tensors copied back and checked\)" <<<"$out" && grep -q "^OK$" <<<"$out"
  check "run --local on (stand-in) GPUs: VMM slots imported by the trainers, every byte verified" $?
  [ $rc -eq 0 ] || echo "$out" | tail -20
  out=$(MESHLOAD_STAGING=cuda-ipc MESHLOAD_CUDA_LIBRARY=$FAKE_CUDA MESHLOAD_FAKE_CUDA_DEVICES=$gpus "$ML" run --local \
        -f "$TMP/bcast.yaml" --generate-dataset "$TMP/data-gpu-ipc" --samples 400 --steps 100 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -qE "staging +cuda-ipc \(" <<<"$out" && grep -q "exchange them over TCP" <<<"$out" \
    && grep -q "^OK$" <<<"$out"
  check "run --local with legacy CUDA IPC handles and Broadcast between sidecars: every byte verified" $?
  [ $rc -eq 0 ] || echo "$out" | tail -20
  out=$(MESHLOAD_CUDA_LIBRARY=$FAKE_CUDA MESHLOAD_FAKE_CUDA_DEVICES=GPU-aaaaaaaa-0000-4000-8000-000000000001 \
        "$ML" run --local -f "$TMP/fixed.yaml" --generate-dataset "$TMP/data-gpu1" --samples 400 --steps 20 \
        --run-dir "$TMP/gpu1-logs" 2>&1); rc=$?
  [ $rc -eq 0 ] && grep -q "so the sidecars stage on the host" <<<"$out" && grep -qE "staging +host" <<<"$out" \
    && grep -q "CUDA device 1 is not among the 1 this process sees" "$TMP"/gpu1-logs/sidecar-0.log
  check "run --local with one GPU for two devices per process: host staging, and the sidecar log says why" $?
  [ $rc -eq 0 ] || echo "$out" | tail -20
else
  skipped "run --local on GPUs" "no CUDA headers at build time, so no stand-in driver"
fi

# 1b. A progress line about once a second while it runs (2.5 s here).
out=$("$ML" run --local -f "$TMP/fixed.yaml" --generate-dataset "$TMP/data-slow" --samples 400 --steps 250 \
      --delay-ms 10 2>&1); rc=$?
lines=$(grep -cE '^step +[0-9]+ .* samples/s .*/s +trainer wait p99' <<<"$out")
[ $rc -eq 0 ] && [ "$lines" -ge 2 ] && [ "$lines" -le 4 ]
check "run --local prints a progress line about once a second ($lines in ~2.5 s)" $?

# 2. A corrupted byte is caught and fails the run.
"$ML" run --local -f "$TMP/fixed.yaml" --generate-dataset "$TMP/data-bad" --samples 400 --files 1 --steps 1 >/dev/null 2>&1
printf '\xff' | dd of="$TMP/data-bad/part-00000.bin" bs=1 seek=123456 conv=notrunc status=none
sed -e "s#uri: $TMP/none#uri: $TMP/data-bad#" "$TMP/fixed.yaml" >"$TMP/bad.yaml"
out=$("$ML" run --local -f "$TMP/bad.yaml" --steps 60 2>&1); rc=$?
[ $rc -eq 1 ] && grep -q "FAILED" <<<"$out" && ! grep -q "0 mismatches" <<<"$out"
check "a corrupted byte fails run --local" $?

# 3. A trainer running as another uid is refused (needs root to switch uid).
SOCK=$TMP/uid.sock
sed -i "s#uri: $TMP/none#uri: $TMP/data-fixed#" "$TMP/fixed.yaml"
"$SIDECAR" --job "$TMP/fixed.yaml" --process 0 --socket "$SOCK" --metrics-port 0 --metrics-address 127.0.0.1 \
  --log-level info 2>"$TMP/sidecar.log" &
PIDS+=($!)
for _ in $(seq 600); do [ -S "$SOCK" ] && break; sleep 0.05; done
if [ "$(id -u)" -eq 0 ] && command -v setpriv >/dev/null; then
  chmod 0755 "$TMP"; chmod 0666 "$SOCK"  # let uid 65534 reach the socket: the uid check must refuse it
  out=$(setpriv --reuid 65534 --regid 65534 --clear-groups "$ML" demo-trainer --job "$TMP/fixed.yaml" \
        --process 0 --socket "$SOCK" --steps 1 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "uid 65534 is not allowed" <<<"$out"
  check "a trainer with another uid is refused" $?
else
  skipped "a trainer with another uid is refused" "needs root and setpriv to run a process as another uid"
fi

# 4. promtool checks the live /metrics, and a real Prometheus scrapes it.
"$ML" demo-trainer --job "$TMP/fixed.yaml" --process 0 --socket "$SOCK" --steps 30 >"$TMP/trainer.out" 2>&1
PORT=$(grep -o '"metrics_port":[0-9]*' "$TMP/sidecar.log" | head -1 | cut -d: -f2)
for _ in $(seq 50); do  # the last RELEASE may still be on its way
  curl -sf "http://127.0.0.1:$PORT/metrics" >"$TMP/metrics.txt"
  grep -q '^meshload_batches_consumed_total 30' "$TMP/metrics.txt" && break
  sleep 0.1
done
promtool check metrics <"$TMP/metrics.txt" >"$TMP/promtool.out" 2>&1; rc=$?
[ $rc -eq 0 ] && [ ! -s "$TMP/promtool.out" ] && grep -q '^meshload_batches_consumed_total 30' "$TMP/metrics.txt"
check "promtool check metrics is clean on the sidecar's /metrics" $?
[ -s "$TMP/promtool.out" ] && cat "$TMP/promtool.out"
grep -q "^meshload_batches_consumed_total 30" "$TMP/metrics.txt" || { grep "consumed|delivered|connections" "$TMP/metrics.txt"; tail -3 "$TMP/trainer.out"; tail -5 "$TMP/sidecar.log"; }

# GET /progress: the trainer finished steps 0..29, so a restarted job resumes at 30.
curl -sf "http://127.0.0.1:$PORT/progress" >"$TMP/progress.json"
python3 - "$TMP/progress.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
ok = (p["job"] == "fixed" and p["process"] == 0 and p["consumedStep"] == 29 and p["resumeStep"] == 30
      and p["deliveredStep"] >= 29 and p["trainerConnected"] is False and p["windowSeconds"] > 0
      and p["stepsPerSecond"] > 0 and 0 <= p["trainerWaitFraction"] <= 1 and p["bytesPerSecond"] > 0
      and p["errors"] == 0 and p["stagedAhead"] >= 1
      and p["stagingSecondsPerStep"] > 0 and p["peerWaitFraction"] is None)
sys.exit(0 if ok else 1)
PY
rc=$?
check "GET /progress: consumed step 29, resume at 30, rates over the window" $rc
[ $rc -eq 0 ] || cat "$TMP/progress.json"

if command -v prometheus >/dev/null; then
  PROM_PORT=$(listen_port)
  cat >"$TMP/prom.yml" <<YAML
global: {scrape_interval: 1s}
scrape_configs:
  - job_name: meshload-sidecar
    static_configs: [{targets: ["127.0.0.1:$PORT"]}]
YAML
  start_prometheus "$TMP/prom.yml" "$PROM_PORT"
  prometheus_until "$PROM_PORT" meshload_batches_consumed_total '"value":\[[0-9.]*,"30"\]'
  ok=$?
  up=$(curl -sf "http://127.0.0.1:$PROM_PORT/api/v1/query?query=up" 2>/dev/null)
  [ $ok -eq 0 ] && grep -q '"value":\[[0-9.]*,"1"\]' <<<"$up"
  check "a real Prometheus scrapes the sidecar (up = 1, batches consumed = 30)" $?
else
  skipped "a real Prometheus scrapes the sidecar" "prometheus is not installed (scripts/install-deps.sh installs it)"
fi

# 5. --process-file: the index comes from the controller's ConfigMap key
#    (process.<pod name>), which appears after the pod starts; the sidecar
#    waits for it, then serves that process.
SOCK2=$TMP/pf.sock
PF=$TMP/cm/process.trainer-1
mkdir -p "$TMP/cm"
MESHLOAD_PROCESS_FILE=$PF "$SIDECAR" --job "$TMP/fixed.yaml" --socket "$SOCK2" --log-level info \
  2>"$TMP/pf.log" &
PF_PID=$!
PIDS+=($PF_PID)
wait_for "$TMP/pf.log" "waiting for the controller"
waiting=1
[ ! -S "$SOCK2" ] && kill -0 $PF_PID 2>/dev/null && grep -q "waiting for the controller" "$TMP/pf.log" && waiting=0
printf '1\n' >"$PF.tmp" && mv "$PF.tmp" "$PF"
for _ in $(seq 600); do [ -S "$SOCK2" ] && break; sleep 0.05; done
out=$("$ML" demo-trainer --job "$TMP/fixed.yaml" --process 1 --socket "$SOCK2" --steps 5 2>&1); rc=$?
[ $waiting -eq 0 ] && [ $rc -eq 0 ] && grep -q '"process":1' "$TMP/pf.log"
check "--process-file waits for the index, then serves that process (the trainer verifies process 1's bytes)" $?
[ $rc -eq 0 ] || { echo "$out" | tail -5; tail -5 "$TMP/pf.log"; }
ver=$("$SIDECAR" --version); rc=$?
gpu=$(sed -n 's/^gpu-staging: //p' <<<"$ver")
[ $rc -eq 0 ] && [[ "$(head -1 <<<"$ver")" =~ ^meshload-sidecar\ [0-9]+\.[0-9]+\.[0-9]+$ ]] && [ -n "$gpu" ] &&
  grep '"msg":"meshload-sidecar"' "$TMP/pf.log" | grep -qF "\"gpu_staging\":\"$gpu\"" &&
  [ "$("$ML" version)" = "$(sed 's/^meshload-sidecar /meshload /' <<<"$ver")" ]
check "--version says whether GPU staging is built in ($gpu), the start-up log and 'meshload version' say the same" $?
echo "garbage" >"$TMP/cm/process.bad"
out=$("$SIDECAR" --job "$TMP/fixed.yaml" --socket "$TMP/bad.sock" --process-file "$TMP/cm/process.bad" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "process.bad" <<<"$out" && grep -q "got 'garbage'" <<<"$out"
check "a process file that is not an index is a clear error naming the file" $?
MESHLOAD_PROCESS_FILE=$TMP/cm/never "$SIDECAR" --job "$TMP/fixed.yaml" --socket "$TMP/never.sock" --log-level info \
  2>"$TMP/never.log" &
NEVER=$!
wait_for "$TMP/never.log" "waiting for the controller"; waiting=$?
kill -TERM $NEVER; wait $NEVER; rc=$?
[ $waiting -eq 0 ] && [ $rc -eq 0 ]
check "SIGTERM while waiting for the process file exits cleanly" $?

# 6. Peers: a bad --peers names the item; --assignments waits for the
#    controller's pod IPs, then the exchange listens on --peer-port.
sed -i "s#uri: $TMP/none#uri: $TMP/data-reshard#" "$TMP/reshard.yaml"
out=$("$SIDECAR" --job "$TMP/reshard.yaml" --process 0 --socket "$TMP/p.sock" --peers "127.0.0.1:7441,nohost" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "peer 1 ('nohost')" <<<"$out"
check "a bad --peers entry is a usage error naming it" $?
out=$(MESHLOAD_STAGING_SCHED=fifo "$SIDECAR" --job "$TMP/reshard.yaml" --process 0 --socket "$TMP/p.sock" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--staging-sched (from \$MESHLOAD_STAGING_SCHED): expected batch or normal, got 'fifo'" <<<"$out"
check "a bad MESHLOAD_STAGING_SCHED is a usage error naming the flag and the value" $?
printf 'hunter2-short\n' >"$TMP/short-secret"
out=$("$SIDECAR" --job "$TMP/reshard.yaml" --process 0 --socket "$TMP/p.sock" --peers "127.0.0.1:7441,127.0.0.1:7442" \
      --peer-secret-file "$TMP/short-secret" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "short-secret: the secret must be at least 16 bytes, this one has 13" <<<"$out" \
  && ! grep -q "hunter2" <<<"$out"
check "a peer secret shorter than 16 bytes is a usage error naming the file, never the secret" $?
out=$("$SIDECAR" --job "$TMP/reshard.yaml" --process 0 --socket "$TMP/p.sock" --peers "127.0.0.1:7441,127.0.0.1:7442" \
      --peer-secret-file "$TMP/no-such-secret" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "no-such-secret: cannot read it" <<<"$out"
check "a missing peer secret file is a usage error naming it" $?
echo '{"processes": 2, "pods": {"a": {"index": "zero"}}}' >"$TMP/cm/assign-bad.json"
out=$("$SIDECAR" --job "$TMP/reshard.yaml" --process 0 --socket "$TMP/p.sock" --assignments "$TMP/cm/assign-bad.json" 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q "assign-bad.json" <<<"$out" && grep -q "pods.a.index" <<<"$out"
check "assignments that are not the controller's are a clear error naming the file and field" $?
PORT=$(listen_port)
echo '{"processes": 2, "pods": {"t-0": {"index": 0, "ip": "127.0.0.1"}, "t-1": {"index": 1, "ip": ""}}}' >"$TMP/cm/assign.json"
"$SIDECAR" --job "$TMP/reshard.yaml" --process 0 --socket "$TMP/as.sock" --assignments "$TMP/cm/assign.json" \
  --peer-port $PORT --log-level info 2>"$TMP/as.log" &
AS=$!
wait_for "$TMP/as.log" "waiting for the controller to publish|peer exchange listening"
grep -q "waiting for the controller to publish every process's address" "$TMP/as.log" && ! grep -q "peer exchange listening" "$TMP/as.log"
waited=$?
echo '{"processes": 2, "pods": {"t-0": {"index": 0, "ip": "127.0.0.1"}, "t-1": {"index": 1, "ip": "127.0.0.1"}}}' >"$TMP/cm/assign.json.new"
mv "$TMP/cm/assign.json.new" "$TMP/cm/assign.json"
wait_for "$TMP/as.log" "peer exchange listening"
[ $waited -eq 0 ] && grep -q "\"port\":$PORT" "$TMP/as.log"
check "--assignments waits for every process's IP, then listens for peers on --peer-port" $?
[ $waited -eq 0 ] || tail -5 "$TMP/as.log"
kill -TERM $AS; wait $AS
# A job that moves nothing between processes does not wait for the IPs.
timeout 60 "$SIDECAR" --job "$TMP/fixed.yaml" --process 0 --socket "$TMP/np.sock" --assignments "$TMP/cm/none.json" \
  --staging host --log-level info 2>"$TMP/np.log" &
NP=$!
wait_for "$TMP/np.log" "sidecar started|waiting for the controller|sidecar cannot start"
kill -TERM $NP; wait $NP
out=$(cat "$TMP/np.log")
grep -q "no samples move between this job's processes" <<<"$out" && grep -q "sidecar started" <<<"$out" \
  && ! grep -q "waiting for the controller" <<<"$out"
check "--assignments with a job that moves nothing between processes starts at once, without peers" $?
# The tuning flags reach the sidecar (its start-up line says what it runs with).
MESHLOAD_STAGING_SCHED=normal timeout 60 "$SIDECAR" --job "$TMP/fixed.yaml" --process 0 --socket "$TMP/tn.sock" \
  --mmap-resident-limit-mib 64 --staging host --log-level info 2>"$TMP/tn.log" &
TN=$!
wait_for "$TMP/tn.log" "sidecar started|sidecar cannot start"
kill -TERM $TN; wait $TN
out=$(cat "$TMP/tn.log")
grep "sidecar started" <<<"$out" | grep -q '"thread_sched":"normal"' \
  && grep "sidecar started" <<<"$out" | grep -q '"mmap_resident_limit_mib":64'
check "--staging-sched and --mmap-resident-limit-mib reach the sidecar" $?
out=$("$SIDECAR" --job "$TMP/fixed.yaml" --process 0 --socket "$TMP/tn.sock" --mmap-resident-limit-mib 4k 2>&1); rc=$?
[ $rc -eq 2 ] && grep -q -- "--mmap-resident-limit-mib: expected an integer from 16 to 1048576, got '4k'" <<<"$out"
check "a bad --mmap-resident-limit-mib is a usage error naming the flag and the value" $?

# 7. A pod replaced at another IP: process 1's sidecar is killed and comes
#    back on 127.0.0.4 instead of 127.0.0.3; the controller publishes the new
#    IP, process 0's sidecar reads it before dialling again, and both demo
#    trainers verify every byte through it. Authenticated, as a job should be.
sed -i "s#uri: $TMP/none#uri: $TMP/data-bcast#" "$TMP/bcast.yaml"
PORT=$(listen_port)
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$TMP/peer-secret"
assign() {  # assign IP_OF_PROCESS_1
  echo "{\"processes\": 2, \"pods\": {\"t-0\": {\"index\": 0, \"ip\": \"127.0.0.2\"}, \"t-1\": {\"index\": 1, \"ip\": \"$1\"}}}" \
    >"$TMP/cm/moved.json.new"
  mv "$TMP/cm/moved.json.new" "$TMP/cm/moved.json"
}
moved_sidecar() {  # moved_sidecar PROCESS IP
  "$SIDECAR" --job "$TMP/bcast.yaml" --process "$1" --socket "$TMP/mv$1.sock" --assignments "$TMP/cm/moved.json" \
    --peer-port $PORT --peer-listen-address "$2" --peer-secret-file "$TMP/peer-secret" --peer-reconnect-timeout 30 \
    --staging host --log-level info 2>>"$TMP/mv$1.log" &
}
assign 127.0.0.3
moved_sidecar 0 127.0.0.2; MV0=$!; PIDS+=($MV0)
moved_sidecar 1 127.0.0.3; MV1=$!; PIDS+=($MV1)
"$ML" demo-trainer --job "$TMP/bcast.yaml" --process 0 --socket "$TMP/mv0.sock" --steps 300 --delay-ms 5 \
  >"$TMP/mvt0.log" 2>&1 & T0=$!
"$ML" demo-trainer --job "$TMP/bcast.yaml" --process 1 --socket "$TMP/mv1.sock" --steps 300 --delay-ms 5 \
  >"$TMP/mvt1.log" 2>&1 & T1=$!
sleep 0.5  # real time: the two trainer processes stream a while before the kill
kill -KILL $MV1; wait $MV1 2>/dev/null
assign 127.0.0.4
moved_sidecar 1 127.0.0.4; MV1=$!; PIDS+=($MV1)
wait $T0; r0=$?
wait $T1; r1=$?
[ $r0 -eq 0 ] && [ $r1 -eq 0 ] && grep -q "a lost peer has a new address" "$TMP/mv0.log" \
  && grep -q '"address":"127.0.0.4:'"$PORT"'"' "$TMP/mv0.log" && grep -q "peer reconnected" "$TMP/mv0.log" \
  && ! grep -q "peer connection failed" "$TMP/mv0.log" && ! grep -q "not authenticated" "$TMP/mv0.log"
check "a sidecar replaced at a new IP is found there through the controller's assignments; every byte verified" $?
[ $r0 -eq 0 ] && [ $r1 -eq 0 ] || { tail -5 "$TMP/mvt0.log" "$TMP/mvt1.log"; grep -v '"level":"debug"' "$TMP/mv0.log" | tail -8; }
kill -TERM $MV0 $MV1 2>/dev/null; wait $MV0 $MV1 2>/dev/null

finish
