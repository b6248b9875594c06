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
