#!/usr/bin/env bash
# The chart and the CRD on the real control plane (scripts/control-plane:
# etcd, kube-apiserver with RBAC and admission, kube-controller-manager),
# with the real helm and kubectl:
#   - `helm template` for a matrix of values (defaults: two replicas and the
#     webhook with the chart's certificate; monitoring; one namespace; one
#     replica; the webhook with cert-manager; no webhook), every rendered object accepted
#     by the server (`kubectl apply --dry-run=server`: schema, admission,
#     the Prometheus Operator's own CRDs for the monitoring objects);
#   - `helm install`, `helm upgrade` with changed values, an upgrade and an
#     install the values schema refuses (naming the value, changing nothing),
#     `helm uninstall` leaving nothing behind but the CRD;
#   - the sidecar-injection webhook end to end: meshload-controller (as the
#     chart's ServiceAccount) serving it, the chart's webhook configuration
#     pointed at it on loopback by url (there is no cluster network here;
#     everything else as the chart renders it), examples/hybrid-fsdp.yaml
#     and examples/trainer-job.yaml applied, the Job controller's pods stored
#     with the sidecar injected and given their indices; with the webhook
#     down, labelled pods are refused and unlabelled ones created;
#   - the CRD as the server enforces it (tests/crd/crd_server_check.py: every
#     CEL rule and schema bound, batchAxes' order, kubectl explain).
# usage: helm_cluster_test.sh REPO_ROOT MESHLOAD_CONTROLLER_BINARY
set -u
ROOT=$1
CONTROLLER=$2
CHART=$ROOT/charts/meshload
source "$(dirname "$0")/../testing/shell_checks.sh"
source "$(dirname "$0")/../testing/control_plane.sh"

start_control_plane "$ROOT"
helm() { "$TMP/cp/bin/helm" "$@"; }
# helm keeps its cache and configuration here, not in $HOME.
export HELM_CACHE_HOME=$TMP/helm/cache HELM_CONFIG_HOME=$TMP/helm/config HELM_DATA_HOME=$TMP/helm/data

CRDS=$("$ROOT/scripts/fetch-test-crds.sh" --dir)
check "the Prometheus Operator's and cert-manager's CRDs are fetched" $?
# Server-side: the CRDs are larger than kubectl's last-applied annotation allows.
k apply --server-side -f "$CRDS" >"$TMP/out" 2>&1 &&
  k wait --for condition=Established --timeout=60s -f "$CRDS" >>"$TMP/out" 2>&1
rc=$?
check "they are Established on the server (ServiceMonitor, PodMonitor, PrometheusRule, Certificate, Issuer)" $rc
[ $rc -eq 0 ] || cat "$TMP/out"
for ns in meshload-system training grafana ops; do k create namespace "$ns" >/dev/null; done
# `helm template` checks the chart's kubeVersion against the server it renders for.
KUBE_VERSION=$(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')

# ---- helm template: a matrix of values, every object accepted by the server ----
values() { # name: writes $TMP/values-NAME.yaml
  case $1 in
    defaults) echo '{}' ;;
    monitoring)
      cat <<'EOF'
serviceMonitor: {enabled: true, labels: {release: prom}}
sidecarMonitor: {enabled: true, labels: {release: prom}}
prometheusRule: {enabled: true, labels: {release: prom}}
grafanaDashboard: {enabled: true, namespace: grafana}
EOF
      ;;
    one-namespace) echo '{watchNamespace: training}' ;;
    one-replica) echo '{replicaCount: 1, leaderElection: {enabled: false}}' ;;
    cert-manager) echo '{webhook: {certManager: {enabled: true}}}' ;;
    no-webhook) echo '{webhook: {enabled: false}}' ;;
    template-injection) echo '{webhook: {templateInjection: {enabled: true}}}' ;;
  esac >"$TMP/values-$1.yaml"
}
# defaults: two replicas, leader election, the webhook with the chart's own
# certificate; cert-manager: its Issuers and Certificates (cert-manager's CRDs).
for case in defaults monitoring one-namespace one-replica cert-manager no-webhook template-injection; do
  values $case
  ns=meshload-system release=meshload
  [ $case = one-replica ] && ns=ops release=ml
  helm template $release "$CHART" -n $ns --kube-version "$KUBE_VERSION" -f "$TMP/values-$case.yaml" >"$TMP/$case.yaml" 2>"$TMP/$case.err"
  rc=$?
  objects=$(grep -c '^kind: ' "$TMP/$case.yaml")
  k apply --dry-run=server -f "$TMP/$case.yaml" >"$TMP/$case.applied" 2>&1
  applied=$(grep -c '(server dry run)$' "$TMP/$case.applied")
  [ $rc -eq 0 ] && [ "$objects" -gt 0 ] && [ "$applied" -eq "$objects" ]
  rc=$?
  check "helm template ($case): the server accepts all $objects objects" $rc
  [ $rc -eq 0 ] || cat "$TMP/$case.err" "$TMP/$case.applied"
done
grep -q '^kind: PrometheusRule' "$TMP/monitoring.yaml" && grep -q '^kind: PodMonitor' "$TMP/monitoring.yaml" &&
  grep -q '^kind: ServiceMonitor' "$TMP/monitoring.yaml"
check "the monitoring values render a ServiceMonitor, a PodMonitor and a PrometheusRule" $?
# The check above can fail: an object the server refuses.
sed 's/^kind: ServiceMonitor/kind: ServiceMonitr/' "$TMP/monitoring.yaml" | k apply --dry-run=server -f - >/dev/null 2>&1
[ $? -ne 0 ]
check "an object of a kind the server does not know is refused (the matrix check can fail)" $?

# ---- what the cluster holds, for the uninstall check (but the namespaces
# the test fills and deletes itself: training, crd-test) ----
snapshot() {
  local kinds
  kinds=$(k api-resources --verbs=list -o name | grep -v -E '^(events|events\.events\.k8s\.io)$' | paste -sd, -)
  k get "$kinds" -A -o jsonpath='{range .items[*]}{.kind}/{.metadata.namespace}/{.metadata.name}{"\n"}{end}' 2>/dev/null |
    grep -v -E '^Lease/kube-(system|node-lease)/' |
    grep -v -E '^[A-Za-z]+/(training|crd-test)/|^Namespace//(training|crd-test)$' | LC_ALL=C sort
}
snapshot >"$TMP/before"

# ---- helm install ----
helm install meshload "$CHART" -n meshload-system >"$TMP/install" 2>&1
rc=$?
check "helm install meshload -n meshload-system" $rc
[ $rc -eq 0 ] || cat "$TMP/install"
grep -q "NOTES:" "$TMP/install" && grep -q "meshload-system" "$TMP/install" && grep -q "kubectl" "$TMP/install"
check "its NOTES name the release's namespace and say what to do next" $?
k wait --for condition=Established --timeout=30s crd/dataloadjobs.meshload.io >/dev/null 2>&1
check "the chart's CRD is installed and Established" $?
missing=
for obj in deployment/meshload serviceaccount/meshload service/meshload-metrics poddisruptionbudget/meshload \
  role/meshload-leader-election rolebinding/meshload-leader-election; do
  k -n meshload-system get $obj >/dev/null 2>&1 || missing="$missing $obj"
done
for obj in clusterrole/meshload clusterrolebinding/meshload; do
  k get $obj >/dev/null 2>&1 || missing="$missing $obj"
done
[ -z "$missing" ] || echo "     missing:$missing"
[ -z "$missing" ]
check "the Deployment, ServiceAccount, Service, PodDisruptionBudget and RBAC exist" $?
# kube-controller-manager's Deployment and ReplicaSet controllers make the pods
# (nothing schedules them here): the Deployment is one the real controllers run.
pods=0
for _ in $(seq 150); do
  pods=$(k -n meshload-system get pods -l app.kubernetes.io/instance=meshload -o name 2>/dev/null | wc -l)
  [ "$pods" -eq 2 ] && break
  sleep 0.2
done
[ "$pods" -eq 2 ]
check "kube-controller-manager makes the Deployment's 2 pods" $?
k -n meshload-system get pods -l app.kubernetes.io/instance=meshload \
  -o jsonpath='{range .items[*]}{.spec.securityContext.runAsNonRoot}{.spec.containers[0].securityContext.readOnlyRootFilesystem}{"\n"}{end}' |
  sort -u | grep -qx truetrue
check "the pods run as non-root on a read-only root filesystem" $?

# ---- helm upgrade with changed values ----
helm upgrade meshload "$CHART" -n meshload-system --set workers=8 --set logLevel=debug \
  --set prometheusRule.enabled=true --set sidecarMonitor.enabled=true >"$TMP/upgrade" 2>&1
rc=$?
check "helm upgrade with changed values (workers, log level, monitoring on)" $rc
[ $rc -eq 0 ] || cat "$TMP/upgrade"
k -n meshload-system get deployment meshload -o jsonpath='{.spec.template.spec.containers[0].args}' |
  grep -q -- '--workers=8' &&
  k -n meshload-system get prometheusrule meshload >/dev/null 2>&1 && k -n meshload-system get podmonitor meshload-sidecars >/dev/null 2>&1
check "the upgrade changed the Deployment's flags and added the PrometheusRule and the PodMonitor" $?
helm upgrade meshload "$CHART" -n meshload-system --set workers=eight >"$TMP/bad-upgrade" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "/workers" "$TMP/bad-upgrade" && grep -q "want integer" "$TMP/bad-upgrade" &&
  [ "$(helm status meshload -n meshload-system -o json | python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["version"], d["info"]["status"])')" = "2 deployed" ]
check "an upgrade with workers=eight is refused naming /workers; the release stays at revision 2" $?
helm install other "$CHART" -n training --set metrics.port=70000 >"$TMP/bad-install" 2>&1
rc=$?
[ $rc -ne 0 ] && grep -q "/metrics/port" "$TMP/bad-install" && ! helm list -A -q | grep -qx other &&
  [ -z "$(k get all,sa,roles,rolebindings -n training -l app.kubernetes.io/instance=other -o name 2>/dev/null)" ]
check "an install with metrics.port=70000 is refused naming /metrics/port, and makes nothing" $?
helm install typo "$CHART" -n training --set wokers=8 >"$TMP/typo" 2>&1
[ $? -ne 0 ] && grep -q "'wokers' not allowed" "$TMP/typo"
check "an install with an unknown value (wokers) is refused naming it" $?

# ---- the sidecar-injection webhook, end to end ----
# A serving certificate for 127.0.0.1 (the url below), from a CA of the test's.
loopback_certificate "$TMP/wh"
check "a loopback serving certificate for the webhook" $?
# The controller as the chart's ServiceAccount (a token from the TokenRequest API).
service_account_kubeconfig meshload-system meshload "$TMP/sa.kubeconfig"
WHPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
setpriv --pdeathsig KILL "$CONTROLLER" --kubeconfig "$TMP/sa.kubeconfig" --metrics-port 0 --metrics-address 127.0.0.1 \
  --leader-election-namespace meshload-system --leader-election-id meshload --log-format kv \
  --webhook-cert-dir "$TMP/wh" --webhook-address 127.0.0.1 --webhook-port "$WHPORT" \
  --sidecar-image meshload/sidecar:test >"$TMP/controller.log" 2>&1 &
CTRL=$!
PIDS+=($CTRL)
wait_for "$TMP/controller.log" "serving the sidecar-injection webhook" 30
rc=$?
check "meshload-controller serves the webhook as the chart's ServiceAccount" $rc
[ $rc -eq 0 ] || tail -20 "$TMP/controller.log"
# The chart's configuration, pointed at it by url, with the test's CA (the
# chart's clientConfig kept, for the upgrade below).
k get mutatingwebhookconfiguration meshload-sidecar-injector -o jsonpath='{.webhooks[0].clientConfig}' >"$TMP/cc0.json"
k patch mutatingwebhookconfiguration meshload-sidecar-injector --type=json -p "[
  {\"op\": \"replace\", \"path\": \"/webhooks/0/clientConfig\",
   \"value\": {\"url\": \"https://127.0.0.1:$WHPORT/mutate-pods\", \"caBundle\": \"$(base64 -w0 "$TMP/wh/ca.crt")\"}}]" >/dev/null
check "the chart's webhook configuration points at it (a url on loopback)" $?

k apply -f "$ROOT/examples/hybrid-fsdp.yaml" -f "$ROOT/examples/trainer-job.yaml" >"$TMP/apply" 2>&1
rc=$?
check "kubectl apply examples/hybrid-fsdp.yaml and examples/trainer-job.yaml" $rc
[ $rc -eq 0 ] || cat "$TMP/apply"
pods=0
for _ in $(seq 150); do
  pods=$(k -n training get pods -l job-name=llama-trainer -o name 2>/dev/null | wc -l)
  [ "$pods" -eq 4 ] && break
  sleep 0.2
done
[ "$pods" -eq 4 ]
rc=$?
check "the Job controller's 4 pods are admitted" $rc
[ $rc -eq 0 ] || { k -n training get events 2>&1 | tail -5; tail -5 "$TMP/controller.log"; }
k -n training get pods -l job-name=llama-trainer -o json >"$TMP/pods.json"
/usr/bin/python3 "$ROOT/tests/charts/injected_pods_check.py" "$TMP/pods.json" >"$TMP/pods.check" 2>&1
rc=$?
check "the stored pods carry the sidecar as docs/webhook.md says (sidecar, ConfigMap, socket, dataset, GPUs)" $rc
[ $rc -eq 0 ] || cat "$TMP/pods.check"
indices=
for _ in $(seq 150); do
  indices=$(k -n training get configmap hybrid-fsdp-meshload -o json 2>/dev/null |
    python3 -c 'import json,sys; d=json.load(sys.stdin)["data"]; print(" ".join(sorted(v for k, v in d.items() if k.startswith("process."))))' 2>/dev/null)
  [ "$indices" = "0 1 2 3" ] && break
  sleep 0.2
done
[ "$indices" = "0 1 2 3" ]
check "the controller gives the 4 pods the process indices 0..3 (their completion indices)" $?
pod() { # name labels
  printf 'apiVersion: v1\nkind: Pod\nmetadata: {name: %s, namespace: training, labels: %s}\nspec: {containers: [{name: trainer, image: trainer:1}]}\n' "$1" "$2"
}
pod nojob '{meshload.io/job: nope}' | k apply -f - >"$TMP/nojob.out" 2>&1
[ $? -ne 0 ] && grep -q 'meshload: DataLoadJob training/nope (label meshload.io/job) does not exist' "$TMP/nojob.out"
check "a pod labelled for a job that does not exist is refused, naming it" $?
metrics_port=$(sed -n 's/.*serving \/metrics.*port=\([0-9]*\).*/\1/p' "$TMP/controller.log" | head -1)
curl -s "http://127.0.0.1:$metrics_port/metrics" >"$TMP/metrics"
grep -q 'meshload_controller_webhook_requests_total{outcome="injected"} 4' "$TMP/metrics" &&
  grep -q 'meshload_controller_webhook_requests_total{outcome="refused"} 1' "$TMP/metrics"
rc=$?
check "the webhook's metrics count 4 injections and 1 refusal" $rc
[ $rc -eq 0 ] || grep webhook_requests "$TMP/metrics"
# Jobs' templates too (webhook.templateInjection.enabled): the second entry
# (the chart's clientConfig back first: Helm merges into the live object).
k patch mutatingwebhookconfiguration meshload-sidecar-injector --type=json \
  -p "[{\"op\": \"replace\", \"path\": \"/webhooks/0/clientConfig\", \"value\": $(cat "$TMP/cc0.json")}]" >/dev/null &&
  helm upgrade meshload "$CHART" -n meshload-system --reuse-values --set webhook.templateInjection.enabled=true \
  >"$TMP/upgrade-template" 2>&1 &&
  [ "$(k get mutatingwebhookconfiguration meshload-sidecar-injector -o jsonpath='{.webhooks[*].name}')" = \
    "sidecar.meshload.io template.meshload.io" ]
rc=$?
check "helm upgrade with webhook.templateInjection.enabled registers the Job template webhook" $rc
[ $rc -eq 0 ] || cat "$TMP/upgrade-template"
k patch mutatingwebhookconfiguration meshload-sidecar-injector --type=json -p "[
  {\"op\": \"replace\", \"path\": \"/webhooks/0/clientConfig\",
   \"value\": {\"url\": \"https://127.0.0.1:$WHPORT/mutate-pods\", \"caBundle\": \"$(base64 -w0 "$TMP/wh/ca.crt")\"}},
  {\"op\": \"replace\", \"path\": \"/webhooks/1/clientConfig\",
   \"value\": {\"url\": \"https://127.0.0.1:$WHPORT/mutate-jobs\", \"caBundle\": \"$(base64 -w0 "$TMP/wh/ca.crt")\"}}]" >/dev/null
check "both webhooks point at it" $?
# A Job labelled for its DataLoadJob (on the Job and its template): the
# sidecar goes into the stored template, and the Job controller's pods are
# made with it (the pod injection leaves them alone).
webhook_count() { # outcome: the controller's webhook_requests_total for it
  curl -s "http://127.0.0.1:$metrics_port/metrics" |
    sed -n "s/^meshload_controller_webhook_requests_total{outcome=\"$1\"} //p"
}
injected0=$(webhook_count injected) unchanged0=$(webhook_count unchanged)
sed -e 's/^  name: hybrid-fsdp$/  name: tmpl-fsdp/' -e 's/^      app: llama-trainer$/      app: tmpl-trainer/' \
  "$ROOT/examples/hybrid-fsdp.yaml" >"$TMP/tmpl-fsdp.yaml"
sed -e 's/^  name: llama-trainer$/  name: tmpl-trainer\n  labels: {meshload.io\/job: tmpl-fsdp}/' \
  -e 's/^        app: llama-trainer .*/        app: tmpl-trainer/' -e 's/meshload.io\/job: hybrid-fsdp .*/meshload.io\/job: tmpl-fsdp/' \
  "$ROOT/examples/trainer-job.yaml" >"$TMP/tmpl-trainer.yaml"
k apply -f "$TMP/tmpl-fsdp.yaml" -f "$TMP/tmpl-trainer.yaml" >"$TMP/apply-tmpl" 2>&1
rc=$?
check "kubectl apply a DataLoadJob and its trainer Job labelled meshload.io/job on the Job" $rc
[ $rc -eq 0 ] || cat "$TMP/apply-tmpl"
k -n training get job tmpl-trainer -o json >"$TMP/tmpl-job.json" 2>&1
/usr/bin/python3 - "$TMP/tmpl-job.json" <<'PYCHECK'
import json, sys
t = json.load(open(sys.argv[1]))["spec"]["template"]
init = t["spec"].get("initContainers") or []
env = {e["name"]: e for e in init[0].get("env", [])} if init else {}
ok = (len(init) == 1 and init[0]["name"] == "meshload-sidecar" and init[0].get("restartPolicy") == "Always"
      and t["metadata"]["annotations"].get("meshload.io/sidecar-injected") == "tmpl-fsdp"
      and env.get("MESHLOAD_PROCESS", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
      == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
      and init[0].get("resources", {}).get("requests", {}).get("cpu") == "1"
      and any(v["name"] == "meshload-job" and v["configMap"]["name"] == "tmpl-fsdp-meshload" for v in t["spec"]["volumes"]))
sys.exit(0 if ok else 1)
PYCHECK
rc=$?
check "the stored Job's pod template holds the sidecar, its requests and the injected annotation" $rc
[ $rc -eq 0 ] || head -c 3000 "$TMP/tmpl-job.json"
wait_sidecars_per_pod training tmpl-trainer "1 1 1 1"
rc=$?
check "the Job controller's 4 pods each have the sidecar once (made from the template, not injected again)" $rc
[ $rc -eq 0 ] || echo "sidecars per pod: $SIDECARS"
injected=$(($(webhook_count injected) - injected0)) unchanged=$(($(webhook_count unchanged) - unchanged0))
[ "$injected" = 1 ] && [ "$unchanged" -ge 4 ]
rc=$?
check "the webhook's metrics: the Job's template injected, its 4 pods left unchanged" $rc
[ $rc -eq 0 ] || echo "injected $injected, unchanged $unchanged more than before"
sed -e 's/^  name: tmpl-trainer$/  name: tmpl-mislabelled/' -e 's/^        meshload.io\/job: tmpl-fsdp$/        meshload.io\/job: hybrid-fsdp/' \
  "$TMP/tmpl-trainer.yaml" | k apply -f - >"$TMP/mislabelled.out" 2>&1
[ $? -ne 0 ] && grep -q 'meshload: Job training/tmpl-mislabelled is labelled meshload.io/job=tmpl-fsdp but its pod template meshload.io/job=hybrid-fsdp' "$TMP/mislabelled.out"
rc=$?
check "a Job labelled for one DataLoadJob whose template names another is refused, naming both" $rc
[ $rc -eq 0 ] || cat "$TMP/mislabelled.out"
# The webhook down: opted-in pods are refused (failurePolicy Fail), others are not touched.
kill $CTRL
wait $CTRL 2>/dev/null
pod labelled '{meshload.io/job: hybrid-fsdp, app: llama-trainer}' | k apply -f - >"$TMP/down.out" 2>&1
[ $? -ne 0 ] && grep -q 'failed calling webhook "sidecar.meshload.io"' "$TMP/down.out"
rc=$?
check "with the webhook down, a labelled pod is refused" $rc
[ $rc -eq 0 ] || cat "$TMP/down.out"
pod plain '{app: other}' | k apply -f - >/dev/null 2>&1
check "with the webhook down, an unlabelled pod is created" $?
k delete namespace training --wait=false >/dev/null

# ---- the CRD as the server enforces it ----
k create namespace crd-test >/dev/null
/usr/bin/python3 "$ROOT/tests/crd/crd_server_check.py" "$TMP/cp/bin/kubectl" "$CHART/crds/dataloadjobs.meshload.io.yaml" \
  crd-test >"$TMP/crd.out" 2>&1
rc=$?
check "the CRD on the server: $(tail -1 "$TMP/crd.out")" $rc
[ $rc -eq 0 ] || grep -v '^ok' "$TMP/crd.out"
k delete namespace crd-test --wait=false >/dev/null

# ---- helm uninstall: nothing left but the CRD ----
helm uninstall meshload -n meshload-system >"$TMP/uninstall" 2>&1
check "helm uninstall meshload" $?
# The CRD's API group is served through an APIService the aggregator makes
# for it (and removes with it).
want_left="APIService//v1alpha1.meshload.io
CustomResourceDefinition//dataloadjobs.meshload.io"
# The garbage collector removes the ReplicaSet and pods after the Deployment
# (and the namespace controller crd-test): wait for them.
left=
for _ in $(seq 90); do
  snapshot >"$TMP/after"
  left=$(comm -13 "$TMP/before" "$TMP/after")
  gone=$(comm -23 "$TMP/before" "$TMP/after")
  [ "$left" = "$want_left" ] && [ -z "$gone" ] && break
  sleep 1
done
[ "$left" = "$want_left" ] && [ -z "$gone" ]
rc=$?
check "uninstall leaves nothing behind but the CRD (Helm keeps CRDs), and removes nothing else" $rc
[ $rc -eq 0 ] && echo "     left: $left" || { echo "     left behind:"; echo "$left"; echo "     gone:"; echo "$gone"; }
finish
