#!/usr/bin/python3
"""Writes the Prometheus configuration of scripts/cluster: what the
Prometheus Operator would generate from the cluster's PodMonitors,
ServiceMonitors and PrometheusRules, for Debian's Prometheus.

  - a PodMonitor becomes a kubernetes_sd_configs job of role pod, a
    ServiceMonitor one of role endpoints, against the API server with a
    service account's token, keeping the targets the Operator keeps: the
    selector's labels (matchLabels), the namespaces (namespaceSelector), the
    named port, pods not Succeeded or Failed; with the labels the Operator
    sets (namespace, pod, container, endpoint, service, job
    "NAMESPACE/NAME") and the monitor's interval and path;
  - PrometheusRules' groups are written to rules.yaml (rule_files);
  - the pod runner's /metrics/cadvisor (the kubelet's cAdvisor endpoint)
    is a static job named kubelet.

Not generated: matchExpressions in selectors (none in the chart), TLS or
authorization of the targets, relabelings and metricRelabelings of the
monitors (none in the chart), sample limits.

usage: prometheus_config.py KUBECTL SERVER CA TOKEN_FILE CADVISOR_ADDR OUT_DIR
"""
import json
import subprocess
import sys

import yaml

KUBECTL, SERVER, CA, TOKEN, CADVISOR, OUT = sys.argv[1:7]


def get(kind):
    out = subprocess.run([KUBECTL, "get", kind, "-A", "-o", "json"], check=True, capture_output=True, text=True)
    return json.loads(out.stdout)["items"]


def sd(role, namespaces):
    c = {"role": role, "api_server": SERVER,
         "authorization": {"credentials_file": TOKEN},
         "tls_config": {"ca_file": CA}}
    if namespaces:
        c["namespaces"] = {"names": namespaces}
    return [c]


def keep_labels(prefix, match):
    return [{"action": "keep", "source_labels": ["__meta_kubernetes_%s_label_%s" % (prefix, sanitize(k)),
                                                 "__meta_kubernetes_%s_labelpresent_%s" % (prefix, sanitize(k))],
             "regex": "(%s);true" % v} for k, v in sorted(match.items())]


def sanitize(name):
    return "".join(c if c.isalnum() else "_" for c in name)


def namespaces_of(mon):
    sel = mon["spec"].get("namespaceSelector") or {}
    if sel.get("any"):
        return []
    return sel.get("matchNames") or [mon["metadata"]["namespace"]]


def job(name, role, mon, ep, relabel):
    """One scrape job of a monitor's endpoint, with the labels the Operator sets."""
    j = {"job_name": name, "honor_labels": bool(ep.get("honorLabels", False)),
         "kubernetes_sd_configs": sd(role, namespaces_of(mon)), "metrics_path": ep.get("path", "/metrics"),
         "relabel_configs": relabel + [
             {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
             {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
             {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
             {"target_label": "endpoint", "replacement": ep["port"]}]}
    if ep.get("interval"):
        j["scrape_interval"] = ep["interval"]
    return j


jobs = []
for pm in get("podmonitors.monitoring.coreos.com"):
    ns, name = pm["metadata"]["namespace"], pm["metadata"]["name"]
    for i, ep in enumerate(pm["spec"].get("podMetricsEndpoints", [])):
        jobs.append(job("podMonitor/%s/%s/%d" % (ns, name, i), "pod", pm, ep,
                        keep_labels("pod", (pm["spec"].get("selector") or {}).get("matchLabels", {})) + [
                            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                             "regex": "(Failed|Succeeded)"},
                            {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"],
                             "regex": ep["port"]},
                            {"target_label": "job", "replacement": "%s/%s" % (ns, name)}]))
for sm in get("servicemonitors.monitoring.coreos.com"):
    ns, name = sm["metadata"]["namespace"], sm["metadata"]["name"]
    for i, ep in enumerate(sm["spec"].get("endpoints", [])):
        jobs.append(job("serviceMonitor/%s/%s/%d" % (ns, name, i), "endpoints", sm, ep,
                        keep_labels("service", (sm["spec"].get("selector") or {}).get("matchLabels", {})) + [
                            {"action": "keep", "source_labels": ["__meta_kubernetes_endpoint_port_name"],
                             "regex": ep["port"]},
                            {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"],
                             "regex": "(Failed|Succeeded)"},
                            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
                            {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job"}]))
jobs.append({"job_name": "kubelet", "metrics_path": "/metrics/cadvisor", "honor_labels": True,
             "static_configs": [{"targets": [CADVISOR]}]})

groups = []
for pr in get("prometheusrules.monitoring.coreos.com"):
    groups += pr["spec"].get("groups", [])
with open(OUT + "/rules.yaml", "w") as f:
    yaml.safe_dump({"groups": groups}, f, sort_keys=False)
config = {"global": {"scrape_interval": "2s", "evaluation_interval": "2s"},
          "rule_files": [OUT + "/rules.yaml"], "scrape_configs": jobs}
with open(OUT + "/prometheus.yml", "w") as f:
    yaml.safe_dump(config, f, sort_keys=False)
print("%d scrape jobs, %d rule groups" % (len(jobs), len(groups)))
