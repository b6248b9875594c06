#!/usr/bin/env bash
# The monitoring that ships in the chart, checked with the real tools:
#   - the alerting rules (rendered from charts/meshload/templates/
#     prometheusrule.yaml) pass `promtool check rules` and the unit tests in
#     alerts_test.yaml (`promtool test rules`), and a broken threshold fails
#     those tests;
#   - the Grafana dashboard's queries, against a real Prometheus scraping the
#     two live sidecars of `meshload run --local` (LoadAndReshard, so the
#     peer panels have data): valid PromQL, data wherever the metrics exist;
#   - the same Prometheus evaluates every alerting rule without an error.
# usage: observability_test.sh MESHLOAD REPO_ROOT
set -u
ML=$1
ROOT=$2
source "$(dirname "$0")/../testing/shell_checks.sh"

# promtool and prometheus come with the Debian package `prometheus`, a
# declared dependency: missing, they are a failure, not a skip.
for tool in promtool prometheus; do
  if ! command -v $tool >/dev/null; then
    check "$tool is installed (scripts/install-deps.sh installs it)" 1
    finish
  fi
done

# 1. The rules as the chart renders them (default thresholds).
/usr/bin/python3 "$ROOT/tests/charts/chart_check.py" "$ROOT" --write-monitoring "$TMP" >"$TMP/chart.out" 2>&1
[ -s "$TMP/rules.yaml" ]
check "the chart renders its PrometheusRule (prometheusRule.enabled)" $?
[ -s "$TMP/rules.yaml" ] || { tail -5 "$TMP/chart.out"; finish; }
out=$(promtool check rules "$TMP/rules.yaml" 2>&1); rc=$?
[ $rc -eq 0 ] && grep -q "SUCCESS: 8 rules found" <<<"$out"
check "promtool check rules accepts the 8 alerting rules" $?
[ $rc -eq 0 ] || echo "$out"

cp "$ROOT/tests/observability/alerts_test.yaml" "$TMP/"
out=$(cd "$TMP" && promtool test rules alerts_test.yaml 2>&1); rc=$?
check "promtool test rules: every alert fires where it should and nowhere else (alerts_test.yaml)" $rc
[ $rc -eq 0 ] || echo "$out" | head -40
# A negative control: the same tests against a starvation threshold of 5 s.
mkdir -p "$TMP/broken"
sed 's/> 0.05$/> 5/' "$TMP/rules.yaml" >"$TMP/broken/rules.yaml"
cp "$TMP/alerts_test.yaml" "$TMP/broken/"
if cmp -s "$TMP/rules.yaml" "$TMP/broken/rules.yaml"; then
  check "the alert tests catch a wrong threshold (the control could not be made)" 1
else
  out=$(cd "$TMP/broken" && promtool test rules alerts_test.yaml 2>&1); rc=$?
  [ $rc -ne 0 ] && grep -q "MeshloadTrainerStarved" <<<"$out"
  check "the alert tests catch a wrong threshold (MeshloadTrainerStarved at 5 s)" $?
fi

# 2. Static checks of the dashboard.
/usr/bin/python3 "$ROOT/tests/observability/dashboard_check.py" "$ROOT" >"$TMP/dash-static.out" 2>&1
check "the dashboard's shape and metric names (dashboard_check.py)" $?
grep -v "^ok\|passed, .* failed$" "$TMP/dash-static.out"

# 3. Two live sidecars (a LoadAndReshard job: peer traffic too), a real
#    Prometheus scraping them with the labels a PodMonitor gives (namespace,
#    pod), the rules loaded.
"$ML" run --local -f "$ROOT/examples/local-reshard.yaml" --generate-dataset "$TMP/data" --samples 2048 \
  --steps 6000 --delay-ms 3 --run-dir "$TMP/run" >"$TMP/run.out" 2>&1 &
RUN=$!
PIDS+=($RUN)
ports=()
for _ in $(seq 200); do
  ports=()
  for i in 0 1; do
    p=$(grep -o '"metrics_port":[0-9]*' "$TMP/run/sidecar-$i.log" 2>/dev/null | head -1 | cut -d: -f2)
    [ -n "$p" ] && ports+=("$p")
  done
  [ ${#ports[@]} -eq 2 ] && break
  sleep 0.1
done
[ ${#ports[@]} -eq 2 ]
check "meshload run --local started two sidecars with metrics ports" $?
if [ ${#ports[@]} -ne 2 ]; then tail -5 "$TMP/run.out"; finish; fi
PROM_PORT=$(listen_port)
cat >"$TMP/prom.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
rule_files: ["$TMP/rules.yaml"]
scrape_configs:
  - job_name: meshload-sidecars
    static_configs:
      - targets: ["127.0.0.1:${ports[0]}"]
        labels: {namespace: training, pod: trainer-0}
      - targets: ["127.0.0.1:${ports[1]}"]
        labels: {namespace: training, pod: trainer-1}
YAML
start_prometheus "$TMP/prom.yml" "$PROM_PORT"
URL="http://127.0.0.1:$PROM_PORT"
# Enough scrapes of both for 10 s rate windows.
prometheus_until "$PROM_PORT" "count(count_over_time(meshload_job_info%5B30s%5D)%20%3E%3D%208)" \
  '"value":\[[0-9.]*,"2"\]' 60
ok=$?
check "Prometheus scraped both sidecars at least 8 times" $ok
if [ $ok -ne 0 ]; then tail -3 "$TMP/prom.log"; tail -3 "$TMP/run.out"; finish; fi
kill -0 $RUN 2>/dev/null
check "the run is still streaming while the dashboard is queried" $?

/usr/bin/python3 "$ROOT/tests/observability/dashboard_check.py" "$ROOT" --prometheus "$URL" >"$TMP/dash.out" 2>&1
rc=$?
check "the dashboard's queries against the live sidecars (dashboard_check.py --prometheus)" $rc
grep -v "passed, .* failed$" "$TMP/dash.out" | sed 's/^/     /'

# Every rule evaluated against the live series without an error (real
# time: the Prometheus server evaluates its rules on its own interval).
sleep 2
rules=$(curl -sf "$URL/api/v1/rules" 2>/dev/null)
n_ok=$(grep -o '"health":"ok"' <<<"$rules" | wc -l)
n_all=$(grep -o '"health":"[a-z]*"' <<<"$rules" | wc -l)
[ "$n_all" -eq 8 ] && [ "$n_ok" -eq 8 ]
check "Prometheus evaluates all 8 alerting rules without an error ($n_ok of $n_all healthy)" $?
# Healthy sidecars streaming as they should: nothing fires.
firing=$(curl -sf "$URL/api/v1/alerts" 2>/dev/null | grep -o '"alertname":"[A-Za-z]*","[^}]*"state":"firing"' | head -3)
[ -z "$firing" ]
check "no alert fires while the job streams normally" $?
[ -n "$firing" ] && echo "$firing"

kill $RUN 2>/dev/null
finish
