# The real control plane for the end-to-end shell tests; source it after
# shell_checks.sh:
#   source "$(dirname "$0")/../testing/control_plane.sh"
# It gives:
#   start_control_plane ROOT
#           starts ROOT/scripts/control-plane in $TMP/cp (stopped when the
#           test exits, or dies), waits until it is ready and exports
#           KUBECONFIG (the admin); a control plane that does not start fails
#           the test there
#   k ARGS  its kubectl
#   service_account_kubeconfig NS NAME FILE
#           writes FILE: a kubeconfig for service account NS/NAME (the
#           server, its CA, a token from the TokenRequest API)
#   loopback_certificate DIR
#           writes DIR/ca.crt, ca.key: a CA of the test's, and DIR/tls.crt,
#           tls.key: a serving certificate for 127.0.0.1 it signed (a
#           webhook the API server reaches by url on loopback)
#   wait_sidecars_per_pod NS JOB WANT
#           waits (30 s at most) until the pods of Job NS/JOB (or of the
#           label selector JOB, when it has an =) have WANT
#           containers named meshload-sidecar each ("1 1": two pods, once
#           each); SIDECARS is what it saw last
start_control_plane() {
  setpriv --pdeathsig TERM "$1/scripts/control-plane" run "$TMP/cp" 2>"$TMP/cp.err" &
  PIDS+=($!)
  if ! "$1/scripts/control-plane" wait "$TMP/cp"; then
    echo "FAIL the control plane did not start"
    echo "0 passed, 1 failed"
    exit 1
  fi
  export KUBECONFIG=$TMP/cp/kubeconfig
}
k() { "$TMP/cp/bin/kubectl" --request-timeout=30s "$@"; }
service_account_kubeconfig() {
  local token server ca
  token=$(k -n "$1" create token "$2" --duration=1h) || return 1
  server=$(k config view --minify -o jsonpath='{.clusters[0].cluster.server}')
  ca=$(k config view --raw --flatten --minify -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
  cat >"$3" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", certificate-authority-data: "$ca"}}]
users: [{name: u, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: u, namespace: $1}}]
current-context: c
KUBECONFIG
}
loopback_certificate() {
  mkdir -p "$1"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=test-ca \
    -keyout "$1/ca.key" -out "$1/ca.crt" 2>/dev/null &&
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=127.0.0.1 \
      -keyout "$1/tls.key" -out "$1/tls.csr" 2>/dev/null &&
    openssl x509 -req -in "$1/tls.csr" -CA "$1/ca.crt" -CAkey "$1/ca.key" -CAcreateserial -days 1 \
      -extfile <(printf 'subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth') -out "$1/tls.crt" 2>/dev/null
}
wait_sidecars_per_pod() {
  SIDECARS=
  local selector="job-name=$2"
  [[ "$2" == *=* ]] && selector=$2
  for _ in $(seq 150); do
    SIDECARS=$(k -n "$1" get pods -l "$selector" -o json 2>/dev/null | /usr/bin/python3 -c '
import json, sys
pods = json.load(sys.stdin)["items"]
print(" ".join(sorted(str(sum(c["name"] == "meshload-sidecar" for c in (p["spec"].get("initContainers") or []) + p["spec"]["containers"])) for p in pods)))' 2>/dev/null)
    [ "$SIDECARS" = "$3" ] && return 0
    sleep 0.2
  done
  return 1
}
